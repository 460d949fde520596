"""Write the generated listings into notebook 03's markdown, so that what GitHub shows of the
stored notebook (it has no outputs) is the lesson: every command of the plan, and the pods'
`OTEL_*` variables, as the dry run prints them with the notebook's default parameters.

    python tools/notebook_listings.py          # rewrite the listing cells
    python tools/notebook_listings.py --check  # exit 1 if they differ from the code (a test runs it)

A listing cell is a markdown cell tagged `generated:<name>`; only its fenced block is rewritten.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import tempfile
from pathlib import Path

import yaml

from distrl.gke import create as gke
from distrl.gke import manifests as k8s
from distrl.gke.runner import dry_run
from distrl.gke.settings import GkeSettings

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "03-create-gke-cluster.ipynb"
# Paths as a reader at the repository root would type them (the notebook runs in notebooks/).
MANIFESTS = "notebooks/runs/03-create-gke-cluster/manifests"
TOKEN = "~/.ray/auth_token"


def notebook_defaults(notebook: Path = NOTEBOOK) -> dict:
    """The literal values of the notebook's `parameters` cell."""
    nb = json.loads(notebook.read_text())
    [cell] = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    tree = ast.parse("".join(cell["source"]))
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign)}


def default_settings() -> GkeSettings:
    """The settings notebook 03 makes from its parameters' defaults (as its settings cell does)."""
    p = notebook_defaults()
    pool = {"max_actor_nodes": p["MAX_ACTOR_NODES"], "actor_machine_type": p["ACTOR_MACHINE_TYPE"]}
    return GkeSettings.for_workload(
        p["WORKLOAD"], project_id=p["PROJECT_ID"], region=p["REGION"], zone=p["ZONE"],
        prefix=p["PREFIX"], gpu_type=p["GPU_TYPE"], mode=p["MODE"],
        otlp_protocol=p["OTLP_PROTOCOL"], operator_namespace=p["OPERATOR_NAMESPACE"],
        **{name: value for name, value in pool.items() if value is not None})


def plan_listing() -> str:
    settings = default_settings()
    plan = gke.create_plan(settings, MANIFESTS, TOKEN, source_dir=".")
    lines: list[str] = []
    dry_run(plan, out=lines.append)
    lines += ["", "# Clean up (TEARDOWN = True, or `distrl gke teardown`): every undo, newest first"]
    dry_run(gke.teardown_plan(plan), out=lines.append, explain=False)
    return "\n".join(lines)


def otel_env_listing() -> str:
    settings = default_settings()
    with tempfile.TemporaryDirectory() as tmp:
        k8s.write_manifests(settings, tmp)
        cluster = next(doc for _, doc in k8s.load_dir(Path(tmp) / "cluster")
                       if doc["kind"] == "RayCluster")
    env = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    shown = [e for e in env if e["name"].startswith("OTEL_") or e["name"] == "POD_NAME"]
    return yaml.safe_dump(shown, sort_keys=False).rstrip()


LISTINGS = {"generated:plan": ("bash", plan_listing), "generated:otel-env": ("yaml", otel_env_listing)}
FENCE = re.compile(r"```(\w+)\n.*?\n```", re.S)


def synced(notebook: Path = NOTEBOOK) -> tuple[dict, list[str]]:
    """The notebook with every listing cell rewritten, and the tags of those that changed."""
    nb = json.loads(notebook.read_text())
    changed = []
    for cell in nb["cells"]:
        tags = [t for t in cell["metadata"].get("tags", []) if t in LISTINGS]
        if cell["cell_type"] != "markdown" or not tags:
            continue
        language, make = LISTINGS[tags[0]]
        source = "".join(cell["source"])
        if FENCE.search(source) is None:
            raise ValueError(f"{notebook.name}: the {tags[0]} cell has no fenced block to fill")
        fence = FENCE.search(source)
        new = f"{source[:fence.start()]}```{language}\n{make()}\n```{source[fence.end():]}"
        if new != source:
            changed.append(tags[0])
            cell["source"] = new.splitlines(keepends=True)
    found = {t for c in nb["cells"] for t in c["metadata"].get("tags", [])} & set(LISTINGS)
    if found != set(LISTINGS):
        raise ValueError(f"{notebook.name} lacks the cells tagged {sorted(set(LISTINGS) - found)}")
    return nb, changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if stale")
    args = parser.parse_args()
    nb, changed = synced()
    if args.check:
        if changed:
            print(f"stale in {NOTEBOOK.name}: {', '.join(changed)} "
                  "(run `python tools/notebook_listings.py`)", file=sys.stderr)
            return 1
        return 0
    NOTEBOOK.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    print(f"{NOTEBOOK.name}: rewrote {', '.join(changed) or 'nothing (in sync)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
