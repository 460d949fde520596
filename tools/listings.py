"""Write the generated listings: every command of the GKE plan into docs/gke.md, and the pods'
`OTEL_*` variables into notebook 03's markdown (GitHub shows the stored notebook without
outputs), as the dry run prints them with the notebook's default parameters. The plan's
commands live in the docs, not the notebook: an executed notebook 03 prints each command once.

    python tools/listings.py          # rewrite the listings
    python tools/listings.py --check  # exit 1 if they differ from the code (a test runs it)

A listing is the first fenced block after a `<!-- generated:<name> ... -->` line in a markdown
file, or in a notebook markdown cell tagged `generated:<name>`; only that block is rewritten.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import sys
import tempfile
from pathlib import Path

import yaml

from distrl.gke import create as gke
from distrl.gke import manifests as k8s
from distrl.gke.inventory import inventory_commands
from distrl.gke.runner import dry_run
from distrl.gke.settings import GkeSettings

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "03-create-gke-cluster.ipynb"
DOC = ROOT / "docs" / "gke.md"
# Paths as a reader at the repository root would type them (the notebook runs in notebooks/).
MANIFESTS = "notebooks/runs/03-create-gke-cluster/manifests"
# The token file as a shell expands it when the line is pasted: a quoted ~ would not expand.
TOKEN = "$HOME/.ray/auth_token"


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
    lines += ["", "# Then the inventory: what is labelled app=distrl in any location (the teardown "
              "exits 1 naming anything left)"]
    lines += [shlex.join(argv) for _, argv in inventory_commands(settings.project_id)]
    # shlex quotes the $ away; double quotes keep the line pasteable.
    return "\n".join(lines).replace(f"'--from-file=auth_token={TOKEN}'",
                                    f'--from-file=auth_token="{TOKEN}"')


def otel_env_listing() -> str:
    settings = default_settings()
    with tempfile.TemporaryDirectory() as tmp:
        k8s.write_manifests(settings, tmp)
        cluster = next(doc for _, doc in k8s.load_dir(Path(tmp) / "cluster")
                       if doc["kind"] == "RayCluster")
    env = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    shown = [e for e in env if e["name"].startswith("OTEL_") or e["name"] == "POD_NAME"]
    return yaml.safe_dump(shown, sort_keys=False).rstrip()


NOTEBOOK_LISTINGS = {"generated:otel-env": ("yaml", otel_env_listing)}
DOC_LISTINGS = {"generated:plan": ("bash", plan_listing)}
FENCE = re.compile(r"```(\w+)\n.*?\n```", re.S)


def _fill(text: str, tag: str, language: str, make, where: str) -> str:
    """text with the first fenced block from its start replaced by make()'s listing."""
    fence = FENCE.search(text)
    if fence is None:
        raise ValueError(f"{where}: the {tag} listing has no fenced block to fill")
    return f"{text[:fence.start()]}```{language}\n{make()}\n```{text[fence.end():]}"


def synced_notebook(notebook: Path = NOTEBOOK) -> tuple[dict, list[str]]:
    """The notebook with every listing cell rewritten, and the tags of those that changed."""
    nb = json.loads(notebook.read_text())
    changed = []
    for cell in nb["cells"]:
        tags = [t for t in cell["metadata"].get("tags", []) if t in NOTEBOOK_LISTINGS]
        if cell["cell_type"] != "markdown" or not tags:
            continue
        source = "".join(cell["source"])
        new = _fill(source, tags[0], *NOTEBOOK_LISTINGS[tags[0]], notebook.name)
        if new != source:
            changed.append(tags[0])
            cell["source"] = new.splitlines(keepends=True)
    found = {t for c in nb["cells"] for t in c["metadata"].get("tags", [])} & set(NOTEBOOK_LISTINGS)
    if found != set(NOTEBOOK_LISTINGS):
        raise ValueError(f"{notebook.name} lacks the cells tagged "
                         f"{sorted(set(NOTEBOOK_LISTINGS) - found)}")
    return nb, changed


def synced_doc(doc: Path = DOC) -> tuple[str, list[str]]:
    """The markdown file with every listing after its marker rewritten, and the changed tags."""
    text = doc.read_text()
    changed = []
    for tag, (language, make) in DOC_LISTINGS.items():
        marker = text.find(f"<!-- {tag} ")
        if marker < 0:
            raise ValueError(f"{doc.name} lacks the marker <!-- {tag} ... -->")
        new = text[:marker] + _fill(text[marker:], tag, language, make, doc.name)
        if new != text:
            changed.append(tag)
            text = new
    return text, changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if stale")
    args = parser.parse_args()
    nb, nb_changed = synced_notebook()
    doc, doc_changed = synced_doc()
    if args.check:
        for path, changed in ((NOTEBOOK, nb_changed), (DOC, doc_changed)):
            if changed:
                print(f"stale in {path.name}: {', '.join(changed)} "
                      "(run `python tools/listings.py`)", file=sys.stderr)
        return 1 if nb_changed or doc_changed else 0
    NOTEBOOK.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    DOC.write_text(doc)
    print(f"{NOTEBOOK.name}: rewrote {', '.join(nb_changed) or 'nothing (in sync)'}; "
          f"{DOC.name}: rewrote {', '.join(doc_changed) or 'nothing (in sync)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
