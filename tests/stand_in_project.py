"""The project behind the gcloud and kubectl stand-ins (conftest.STAND_IN): it remembers what
the commands made, with the label each carried, and what they deleted, as the real project
would. A describe finds what a create made and no delete removed, and prints the label its
--format asks for; what was there before a test is named by FAKE_EXISTS (made by this plan
earlier: its label is FAKE_PREFIX, default "rl") or FAKE_FOREIGN (same name, no label of ours).
A cluster's maintenance exclusion is remembered too: a describe whose --format names it prints
its start, or nothing, as gcloud does for a field that is not set. The state is a JSON file
beside the stand-ins' log."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

GROUPS = (("artifacts", "repositories"), ("iam", "service-accounts"), ("storage", "buckets"),
          ("container", "clusters"), ("container", "node-pools"))
VERBS = {"create": "create", "create-auto": "create", "delete": "delete", "describe": "describe",
         "update": "label"}
# Things whose name is unique only within their location: keyed name@location.
LOCATED = {("container", "clusters"), ("container", "node-pools"), ("artifacts", "repositories")}
# The lists the teardown's inventory runs that this project answers (the compute ones are
# answered empty by HEALTHY_PROJECT_ANSWERS).
LISTED = {("container", "clusters"), ("storage", "buckets"), ("artifacts", "repositories")}
PROJECT = "demo-project-1"  # what a repository's full name says; the tests' project

# The describes that ask who made a thing: the plan's label, or an account's description.
OWNER_FORMAT = re.compile(r"distrl-prefix\)|value\(description\)|io/instance\}")


def resource(tool: str, argv: list[str]) -> tuple[str, str] | None:
    """(verb, key) of a command that makes, labels, deletes or describes a thing the plan
    makes; None for any other command."""
    words = [a for a in argv if not a.startswith("-")]
    flags = dict(a.partition("=")[::2] for a in argv if a.startswith("--"))
    if tool == "kubectl":
        if words[:1] == ["apply"] and flags.get("--filename", "").endswith("00-namespace.yaml"):
            return "create", "namespace"
        if words[:2] in (["delete", "namespace"], ["get", "namespace"]):
            return ("delete" if words[0] == "delete" else "describe"), "namespace"
        return None
    if words[:2] == ["builds", "submit"] and "--tag" in flags:
        return "create", f"image {flags['--tag']}"
    if words[:4] == ["artifacts", "docker", "images", "describe"]:
        return "describe", f"image {words[4]}"
    if words[:3] == ["container", "clusters", "update"] and \
            "--add-maintenance-exclusion-name" in flags:
        return "create", f"exclusion {flags['--add-maintenance-exclusion-name']}"
    exclusion = re.search(r"maintenanceExclusions\.([\w-]+)\.", flags.get("--format", ""))
    if words[:3] == ["container", "clusters", "describe"] and exclusion:
        return "field", f"exclusion {exclusion.group(1)}"
    if words[:2] == ["storage", "rm"]:
        return "delete", f"storage buckets {words[2]}"
    for group in GROUPS:
        if tuple(words[:2]) == group and len(words) > 3 and words[2] in VERBS:
            key = f"{' '.join(group)} {words[3].split('@')[0]}"
            if group in LOCATED:  # a cluster in one zone is not the one in another
                where = flags.get("--zone") or flags.get("--region") or flags.get("--location")
                key += f"@{where}"
            return VERBS[words[2]], key
    return None


def pool_shape(argv: list[str]) -> dict:
    """A node pool as `node-pools describe --format=json` shows what its create asked for
    (the GKE API's NodePool: config, autoscaling, status; a describe's FAKE_POOL_STATUS sets
    the status)."""
    flags = dict(a.partition("=")[::2] for a in argv if a.startswith("--"))
    accelerator = dict(kv.split("=", 1) for kv in flags.get("--accelerator", "").split(",") if kv)
    effects = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE",
               "NoExecute": "NO_EXECUTE"}
    taints = []
    for taint in filter(None, flags.get("--node-taints", "").split(",")):
        key_value, effect = taint.rsplit(":", 1)
        key, value = key_value.split("=", 1)
        taints.append({"key": key, "value": value, "effect": effects[effect]})
    config = {"machineType": flags["--machine-type"], "spot": "--spot" in flags,
              "taints": taints,
              "accelerators": [{"acceleratorType": accelerator["type"],
                                "acceleratorCount": accelerator.get("count", "1")}]
              if accelerator else []}
    shape = {"config": config, "status": "RUNNING"}
    if "--enable-autoscaling" in flags:
        shape["autoscaling"] = {"enabled": True, "minNodeCount": int(flags["--min-nodes"]),
                                "maxNodeCount": int(flags["--max-nodes"])}
    return shape


def listing(argv: list[str]) -> str | None:
    """What a list of clusters, buckets or repositories prints: each the plan made and no
    delete removed, carrying a prefix label, as `value(name,location,prefix)` (None: not such a
    list)."""
    words = [a for a in argv if not a.startswith("-")]
    if words[2:3] != ["list"] or tuple(words[:2]) not in LISTED:
        return None
    path = Path(os.environ["FAKE_LOG"] + ".state")
    state = json.loads(path.read_text()) if path.exists() else {}
    lines = []
    for key, label in state.items():
        group, _, thing = key.partition(f"{' '.join(words[:2])} ")
        if group or not thing or not label:
            continue
        name, _, where = thing.partition("@")
        if words[:2] == ["storage", "buckets"]:
            name = name.removeprefix("gs://")
        elif words[:2] == ["artifacts", "repositories"]:
            name = f"projects/{PROJECT}/locations/{where}/repositories/{name}"
        lines.append(f"{name}\t{where}\t{label}")
    return "\n".join(lines)


def label_of(tool: str, argv: list[str]) -> str:
    """The prefix label a create or label command gives what it makes ('' for none)."""
    line = " ".join(argv)
    if tool == "kubectl":  # the namespace's manifest, as kubectl apply reads it
        path = Path(next(a.partition("=")[2] for a in argv if a.startswith("--filename=")))
        text = path.read_text() if path.exists() else ""  # a test that rendered no manifests
        found = re.search(r"app\.kubernetes\.io/instance: (\S+)", text)
        return found.group(1) if found else ""
    found = re.search(r"distrl-prefix=([^,\s]+)|GKE plan, prefix (\S+)", line)
    return (found.group(1) or found.group(2)) if found else ""


def answer(tool: str, argv: list[str]) -> tuple[int, str] | None:
    """(exit code, output) for a command about a thing the plan makes; None for others. A
    missing thing answers gcloud's and kubectl's NOT_FOUND on stderr (the code is 1)."""
    listed_here = listing(argv) if tool == "gcloud" else None
    if listed_here is not None:
        return 0, listed_here
    what = resource(tool, argv)
    if what is None:
        return None
    verb, key = what
    path = Path(os.environ["FAKE_LOG"] + ".state")
    state = json.loads(path.read_text()) if path.exists() else {}
    line = " ".join([tool, *argv])
    listed = lambda name: any(e and e in line for e in os.environ.get(name, "").split("|"))  # noqa: E731
    if key not in state and listed("FAKE_EXISTS"):
        state[key] = os.environ.get("FAKE_PREFIX", "rl")
    elif key not in state and listed("FAKE_FOREIGN"):
        state[key] = ""
    if verb == "field":  # a field of a cluster: gcloud prints nothing when it is not set
        return 0, "2026-12-01T00:00:00Z" if key in state else ""
    if verb == "create" or verb == "label" and key in state:
        state[key] = label_of(tool, argv)
        if verb == "create" and key.startswith("container node-pools "):
            state[f"shape {key}"] = pool_shape(argv)
    elif verb in ("delete", "label", "describe") and key not in state:
        return 1, "ERROR: NOT_FOUND"
    elif verb == "delete":
        del state[key]
        state.pop(f"shape {key}", None)
        if key.startswith("container clusters "):  # its maintenance exclusions go with it
            state = {k: v for k, v in state.items() if not k.startswith("exclusion ")}
    path.write_text(json.dumps(state))
    if verb == "describe":
        if "--format=value(email)" in argv:  # an account read back: its address
            return 0, [w for w in argv if not w.startswith("-")][3]
        if "--format=json" in argv and f"shape {key}" in state:
            shape = state[f"shape {key}"]
            status = os.environ.get("FAKE_POOL_STATUS")  # what a failed create left
            return 0, json.dumps({**shape, **({"status": status, "statusMessage": "Insufficient "
                                  "regional quota"} if status else {})})
        if not OWNER_FORMAT.search(line):
            return 0, "found"
        label = state[key]
        return 0, f"made by distrl's GKE plan, prefix {label}" if (
            "description" in line and label) else label
    return 0, f"done: {line}"
