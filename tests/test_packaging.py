"""What a reader who installs the package into their own environment gets: every module's
imports come from a declared dependency (or, for the notebook runner, the `notebooks` extra)."""

import ast
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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


# Modules that come with a declared package rather than as their own distribution.
BUNDLED = {"keras": "tensorflow", "google": "google-cloud-monitoring", "re2": "google-re2", "PIL": "pillow",
           "yaml": "pyyaml"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _unmet(available_core: set[str], available_extras: dict[str, set[str]]) -> list[str]:
    """The package's imports that none of the available distributions provides."""
    providers = importlib.metadata.packages_distributions()
    missing = []
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 30, paths  # every subpackage's modules, not only the top level's
    for path in paths:
        module = path.relative_to(PACKAGE).as_posix()
        available = (available_extras[EXTRA_MODULES[module]] if module in EXTRA_MODULES
                     else available_core)
        for name in sorted(_imports(path)):
            candidates = {_normal(d) for d in providers.get(name, [])}
            if name in BUNDLED:
                candidates.add(BUNDLED[name])
            if not candidates & available:
                missing.append(f"{module} imports {name} (from {sorted(candidates) or '?'})")
    return missing


def test_every_import_of_the_package_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    extras = {name: _requirement_names(reqs) | core
              for name, reqs in project["optional-dependencies"].items()}
    missing = _unmet(core, extras)
    assert missing == [], "declare these in pyproject.toml:\n" + "\n".join(missing)
    # What the issue found missing: training writes TensorBoard summaries, explore plots.
    assert {"tensorboard", "pandas", "matplotlib"} <= core


def _resolve(tmp_path: Path, *extras: str) -> set[str]:
    """The distributions a plain install of the project (with these extras) brings, resolved
    against the package index as if nothing were installed."""
    resolved = tmp_path / f"resolved{'-'.join(('', *extras))}.txt"
    subprocess.run([str(Path(sys.executable).with_name("uv")), "pip", "compile", "--quiet",
                    "--no-cache", "--python", sys.executable, str(ROOT / "pyproject.toml"),
                    *(f"--extra={extra}" for extra in extras), "--output-file", str(resolved)],
                   check=True, timeout=240, capture_output=True)
    return {_normal(line.split("==")[0]) for line in resolved.read_text().splitlines()
            if line[:1].isalnum()}  # "name==version"; the rest are "#" comments


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_plain_install_brings_every_import(tmp_path):
    """`pip install .` and `pip install .[notebooks]` (no lock file): the distributions each
    would install provide every module the package imports. Resolved by uv (what `make
    install` installs with) from pyproject.toml: for the plain install the same 122
    distributions as pip's `install --dry-run --ignore-installed --report .`, in 1.3 s of wall
    time against pip's 21.7 s (18.8 s of CPU, on the slow tests' critical path)."""
    plain = _resolve(tmp_path)
    assert "tensorboard" in plain  # training's tf.summary needs it (the crash)
    missing = _unmet(plain, {"notebooks": _resolve(tmp_path, "notebooks")})
    assert missing == [], "a plain install lacks:\n" + "\n".join(missing)


def test_ray_imports_no_grammar_builder_into_every_process():
    """Every Ray process (each worker, each agent) imports Ray, and Ray imports jsonschema's
    format checkers: from jsonschema 4.25 these load rfc3987-syntax, which builds a Lark
    grammar on import (2.5 s of CPU a process here). pyproject.toml caps jsonschema for that."""
    code = "import json, sys, ray, jsonschema._format; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True, timeout=120).stdout)
    assert "ray" in loaded
    assert not {"rfc3987_syntax", "lark"} & set(loaded)


def test_children_started_beside_a_live_grpc_channel_all_run():
    """Ray starts its GCS and raylet with a preexec_fn beside the driver's gRPC channels (the
    collector's, Cloud Monitoring's): with gRPC's fork support on, about 1 such child in 100
    aborts before exec (grpc/grpc#43055; benchmarks/popen_beside_grpc.py). Importing distrl
    first turns it off; importing grpc first is a warning that says what to do."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "popen_beside_grpc", ROOT / "benchmarks" / "popen_beside_grpc.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    codes = probe.exit_codes(import_distrl=True, children=600)
    assert len(codes) == 600 and set(codes) == {0}, sorted(set(codes))
    late = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c",
                           "import grpc, distrl"], env=probe.clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert late.returncode != 0 and "import distrl first" in late.stderr, late.stderr[-2000:]
    chosen = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c",
                             "import grpc, distrl, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"],
                            env={**probe.clean_env(), "GRPC_ENABLE_FORK_SUPPORT": "1"},
                            capture_output=True, text=True, timeout=120)
    assert chosen.stdout.strip() == "1", chosen.stderr[-2000:]  # the reader's own choice stands


def _supported_pythons() -> list[str]:
    """The minor versions pyproject.toml's requires-python admits."""
    from packaging.specifiers import SpecifierSet

    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                            ["requires-python"])
    return [f"3.{minor}" for minor in range(8, 20) if requires.contains(f"3.{minor}.99")]


def _pins(text: str) -> set[str]:
    """name==version of every pin, names normalised, markers left out."""
    return {_normal(line.split("==")[0]) + "==" + line.split("==")[1].split(" ;")[0].strip()
            for line in text.splitlines() if line[:1].isalnum()}


def test_make_test_versions_runs_the_unit_layer_on_every_other_supported_python():
    """`make test` runs on 3.11 (CI's Python); `make test-versions` runs `make test-fast` on the
    others that requires-python admits, each in a venv of its own."""
    makefile = (ROOT / "Makefile").read_text()
    others = re.search(r"^OTHER_PYTHONS := (.*)$", makefile, re.M).group(1).split()
    assert ["3.11", *others] == _supported_pythons() == ["3.11", "3.12", "3.13"]
    target = makefile.split("\ntest-versions:", 1)[1].split("\n\n", 1)[0]
    assert "test-fast PYTHON=python$$v VENV=.venv-$$v" in target


class LockResolutions:
    """uv's resolutions of requirements.lock for each supported Python on Linux and macOS, in
    a thread that waits on the package index (a second of CPU in a minute). conftest starts
    them as the lane starts (pytest_collection_finish) and runs the test that reads them last,
    so the minute of waiting passes beside the other tests rather than holding a lane."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="lock-resolutions-"))
        self.problems: list[str] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="lock-resolutions")
        self.thread.start()

    def _resolve(self, version: str, platform: str) -> str:
        out = self.folder / f"{version}-{platform}.txt"
        proc = subprocess.run([str(Path(sys.executable).with_name("uv")), "pip", "compile",
                               "--quiet", "--cache-dir", str(self.folder / "uv-cache"),
                               "--python-version", version, "--python-platform", platform,
                               str(ROOT / "requirements.lock"), "-o", str(out)],
                              capture_output=True, text=True, timeout=240)
        if proc.returncode != 0:
            return f"Python {version} on {platform}:\n{proc.stderr[-2000:]}"
        unpinned = _pins(out.read_text()) - _pins((ROOT / "requirements.lock").read_text())
        return f"Python {version} on {platform} installs, unpinned: {unpinned}" if unpinned else ""

    def _run(self) -> None:
        try:
            floor = re.search(r">=\s*([\d.]+)", tomllib.loads(
                (ROOT / "pyproject.toml").read_text())["project"]["requires-python"]).group(1)
            targets = [(floor if floor.startswith(python + ".") else python, platform)
                       for python in _supported_pythons()
                       for platform in ("x86_64-manylinux_2_28", "aarch64-apple-darwin")]
            first = self._resolve(*targets[0])  # fetches the metadata; the rest reuse it
            with ThreadPoolExecutor(len(targets) - 1) as pool:  # each waits on the index
                self.problems = [p for p in [first, *pool.map(lambda t: self._resolve(*t),
                                                               targets[1:])] if p]
        except BaseException as err:  # noqa: BLE001 (the test reports it)
            self.error = err

    def result(self, timeout_s: float) -> list[str]:
        self.thread.join(timeout_s)
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.thread.is_alive():
            raise TimeoutError(f"uv's resolutions took over {timeout_s:g} s")
        if self.error is not None:
            raise self.error
        return self.problems


BACKGROUND: dict[str, LockResolutions] = {}  # conftest's early start, if it made one


@pytest.mark.slow
@pytest.mark.waits  # on the package index: a second of CPU in a minute
@pytest.mark.timeout(600)
def test_the_lock_pins_everything_each_supported_python_installs():
    """Resolved for each supported Python on Linux and macOS, requirements.lock brings no
    package and no version it does not pin: one lock for every version, nothing left to the
    day of the install."""
    resolutions = BACKGROUND.pop("lock", None) or LockResolutions()
    problems = resolutions.result(timeout_s=500)
    assert not problems, "\n".join(problems)
