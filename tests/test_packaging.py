"""What a reader who installs the package into their own environment gets: every module's
imports come from a declared dependency (or, for the notebook runner, the `notebooks` extra)."""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "helpers" / "distrl"
EXTRA_MODULES = {"tutorial.py": "notebooks"}  # modules that need an extra, by design


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower().replace("_", "-")
            for r in requirements}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"distrl", "__future__"}


def test_every_import_of_the_package_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    extras = {name: _requirement_names(reqs) | core
              for name, reqs in project["optional-dependencies"].items()}
    providers = importlib.metadata.packages_distributions()
    # Modules that come with a declared package rather than as their own distribution.
    bundled = {"keras": "tensorflow", "google": "google-cloud-monitoring",
               "re2": "google-re2", "yaml": "pyyaml"}
    missing = []
    for path in sorted(PACKAGE.glob("*.py")):
        declared = extras[EXTRA_MODULES[path.name]] if path.name in EXTRA_MODULES else core
        for name in sorted(_imports(path)):
            candidates = {d.lower().replace("_", "-") for d in providers.get(name, [])}
            if name in bundled:
                candidates.add(bundled[name])
            if not candidates & declared:
                missing.append(f"{path.name} imports {name} (from {sorted(candidates) or '?'})")
    assert missing == [], "declare these in pyproject.toml:\n" + "\n".join(missing)
    # What the issue found missing: training writes TensorBoard summaries, explore plots.
    assert {"tensorboard", "pandas", "matplotlib"} <= core
