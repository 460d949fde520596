import atexit
import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

# make test's lanes (tests/lanes.py): its hooks, registered as this conftest's own
from lanes import (  # noqa: F401
    RUN_LAST,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_runtest_logreport,
    pytest_runtestloop,
    pytest_sessionfinish,
)

# The suite never reads or writes the user's own state: HOME and the XDG folders are a folder of
# this run's, for the tests and every process they start (Ray's ~/.ray/auth_token, `distrl
# cluster`'s state file, Keras', Jupyter's and matplotlib's files). A reader who keeps a
# `distrl cluster up` running, or has a Ray token of their own, sees the same results.
_HOME = tempfile.mkdtemp(prefix="distrl-test-home-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
for _var, _sub in (("HOME", ""), ("XDG_STATE_HOME", ".local/state"), ("XDG_CACHE_HOME", ".cache"),
                   ("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share")):
    os.environ[_var] = os.path.join(_HOME, _sub)
os.environ.pop("RAY_AUTH_TOKEN", None)
os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
# Nor on the shell's settings a fresh machine lacks: with PYTHONUNBUFFERED set, a training's
# output read through a pipe came line by line even where the product forgot to flush (the
# driver's log lines once did), and the tests that wait for a line passed on the developer's
# machine only. Without it, a line that is not flushed is not seen.
os.environ.pop("PYTHONUNBUFFERED", None)


def _register_kernel() -> None:
    """The Jupyter kernel "distrl" of the interpreter that runs the tests, ahead of any other
    of that name (JUPYTER_PATH comes first): the notebook tests need no `make install`, and a
    reader's own "distrl" kernel of another environment is not the one tested."""
    spec = Path(_HOME) / "jupyter" / "kernels" / "distrl"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (distrl, tests)", "language": "python"}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        p for p in (str(spec.parents[1]), os.environ.get("JUPYTER_PATH")) if p)


_register_kernel()

# Before any test module imports grpc: distrl turns gRPC's fork support off, without which about
# one child in 100 started beside a live channel aborts (grpc/grpc#43055). A module run alone
# (test_collector.py imports grpc first) would otherwise keep it on, and warn.
import distrl  # noqa: F401

# TensorFlow's C++ start-up notices are noise in test logs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Learners keep XLA's compiled steps in this test run's own folder, not the user's
# ~/.cache/distrl/xla (what the tests start inherits it: Ray's workers, the notebooks' kernels).
_XLA_CACHE = tempfile.mkdtemp(prefix="distrl-test-xla-")
os.environ.setdefault("DISTRL_XLA_CACHE_DIR", _XLA_CACHE)
atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)


def pytest_collection_finish(session):
    """The lock's resolutions (test_packaging.LockResolutions) start now, as the lane starts,
    and the test that reads them runs last: its minute on the package index passes beside the
    other tests."""
    mine = [item for item in session.items if item.name in RUN_LAST]
    if mine and not session.config.option.collectonly:
        session.items[:] = [i for i in session.items if i not in mine] + mine
        mine[0].module.BACKGROUND["lock"] = mine[0].module.LockResolutions()


def is_ray_process(cmdline: list[str]) -> bool:
    """Ray's binaries (GCS, raylet), a `ray start`, or a Ray worker titled `ray::...`."""
    cmd = " ".join(cmdline)
    return "ray/core/src/ray" in cmd or "ray start" in cmd or cmd.startswith("ray::")


@pytest.fixture(autouse=True)
def unit_tests_start_no_ray(request):
    """What lets `make test` run the unit tests beside the slow ones: a test not marked slow
    that leaves Ray up, or a Ray process of its own, fails here and must be marked slow."""
    yield
    if request.node.get_closest_marker("slow") is not None:
        return
    import psutil

    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized(), "a unit test started Ray: mark it slow"
    started = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # ended while looked at
            if is_ray_process(child.cmdline()):
                started.append(child.pid)
    assert not started, f"a unit test left Ray processes {started}: mark it slow"


STAND_IN = """#!{python}
# Stand-in for {name}: records its argv, refuses what the real tool refuses (a subcommand, flag,
# value or positional its reference does not accept: tests/cli_reference.py, exit 2), and
# answers the rest with hand-written answers shaped like a healthy project's, not recorded from
# one (HEALTHY_PROJECT_ANSWERS in tests/conftest.py; STAND_IN_ANSWERS overrides them);
# `kubectl exec ... -- tar` runs tar here (a rehearsed pod's files are on this machine). What
# the plan makes lives in a project that remembers it (tests/stand_in_project.py); any other
# describe or `get secret` finds nothing (exit 1) unless FAKE_EXISTS lists it; FAKE_FAIL makes
# a matching command fail with a quota error.
import json, os, sys
sys.path.insert(0, {tests!r})
from cli_reference import refusal
from stand_in_project import answer as remembered
argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(["{name}", *argv]) + "\\n")
why = refusal("{name}", argv)
if why:
    print(why, file=sys.stderr)
    sys.exit(2)
line = " ".join(["{name}", *argv])
if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in line:
    print("ERROR: (gcloud) quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0", file=sys.stderr)
    sys.exit(1)
answers = json.loads(os.environ["STAND_IN_ANSWERS"])
for key, answer in answers.items():
    if key in line:  # a failing command says why on stderr, as gcloud and kubectl do
        print(answer["out"], file=sys.stderr if answer.get("code", 0) else sys.stdout)
        sys.exit(answer.get("code", 0))
found = remembered("{name}", argv)  # a thing the plan makes: the stand-in project knows it
if found is not None:
    print(found[1], file=sys.stderr if found[0] else sys.stdout)
    sys.exit(found[0])
if " describe " in line or " get secret " in line:
    if any(e and e in line for e in os.environ.get("FAKE_EXISTS", "").split("|")):
        print("found")
        sys.exit(0)
    print("ERROR: NOT_FOUND", file=sys.stderr)
    sys.exit(1)
if "{name}" == "kubectl" and "exec" in argv and "--" in argv \
        and argv.index("exec") < argv.index("--") and argv[argv.index("--") + 1:][:1] == ["tar"]:
    # `kubectl exec POD -- tar cf - -C DIR .` in a pod rehearsed on this machine: its files
    # are here, so the real tar runs.
    os.execvp("tar", argv[argv.index("--") + 1:])
print("done:", line)
"""

QUOTAS = {"quotas": [{"metric": "CPUS", "limit": 72.0, "usage": 0.0},
                     {"metric": "N2_CPUS", "limit": 24.0, "usage": 0.0},
                     {"metric": "PREEMPTIBLE_CPUS", "limit": 0.0, "usage": 0.0},
                     {"metric": "SSD_TOTAL_GB", "limit": 500.0, "usage": 0.0},
                     {"metric": "NVIDIA_L4_GPUS", "limit": 1.0, "usage": 0.0},
                     {"metric": "NVIDIA_T4_GPUS", "limit": 1.0, "usage": 0.0},
                     {"metric": "IN_USE_ADDRESSES", "limit": 8.0, "usage": 0.0}]}
DESCRIBE_NODE = """Name:               gke-node-1
Allocatable:
  cpu:                7910m
  ephemeral-storage:  47060071478
  memory:             29310788Ki
  nvidia.com/gpu:     1
  pods:               110
System Info:
  Kernel Version:     6.6
Allocated resources:
  (Total limits may be over 100 percent, i.e., overcommitted.)
  Resource           Requests     Limits
  --------           --------     ------
  cpu                663m (8%)    1143m (14%)
  memory             1156Mi (4%)  3450Mi (13%)
Events:              <none>"""
# What a healthy project and cluster would answer, by a piece of the command line (first match
# wins): written by hand from the output formats the commands ask for, not recorded.
HEALTHY_PROJECT_ANSWERS = {
    "gcloud version --format=json": {"out": json.dumps(
        {"Google Cloud SDK": "578.0.0", "core": "2026.10.20", "kubectl": "1.34.1",
         "gke-gcloud-auth-plugin": "0.5.10"})},
    "auth list": {"out": "reader@example.com"},
    "auth print-access-token": {"out": "ya29.stand-in-token"},
    "org-policies describe": {"out": json.dumps({
        "name": "projects/demo-project-1/policies/compute.vmExternalIpAccess", "spec": {}})},
    "billing projects describe": {"out": "True"},
    "projects describe": {"out": "ACTIVE"},
    "services list": {"out": "\n".join(f"{api}.googleapis.com" for api in (
        "container", "compute", "iam", "iamcredentials", "monitoring", "cloudtrace",
        "telemetry", "logging", "artifactregistry", "cloudbuild", "storage",
        "containerfilesystem"))},
    "compute regions describe": {"out": json.dumps(QUOTAS)},
    "compute project-info describe": {"out": json.dumps(
        {"quotas": [{"metric": "GPUS_ALL_REGIONS", "limit": 1.0, "usage": 0.0},
                    {"metric": "CPUS_ALL_REGIONS", "limit": 72.0, "usage": 0.0}]})},
    "currentMasterVersion": {"out": "1.35.1-gke.1396000"},
    "get service opentelemetry-collector": {"out": "4317 4318|4317 4318"},
    "get crd rayclusters.ray.io": {"out": "string"},
    "get deployments --all-namespaces": {"out": json.dumps({"items": []})},
    "describe nodes": {"out": DESCRIBE_NODE},
    "RAY_AUTH_MODE": {"out": "token"},
    "compute disks list": {"out": ""},
    "compute instances list": {"out": ""},
    "compute addresses list": {"out": ""},
    "compute networks list": {"out": "default"},
    "monitoring dashboards list": {"out": ""},
    "monitoring policies list": {"out": ""},
    "list_physical_devices": {"out": "ld_library_path /usr/local/nvidia/lib64\nlibcuda ok\n"
                                     "gpus 1\nxla ok /job:localhost/replica:0/task:0/device:GPU:0"},
    "--output=jsonpath={.items[0].metadata.name}": {"out": "distrl-head-x7k2p"},
}


# What the stand-in Resource Manager heard: (path, Authorization header, permissions asked).
IAM_ASKED: list[tuple[str, str, list[str]]] = []


@pytest.fixture(scope="session")
def resource_manager():
    """A local stand-in for Resource Manager's projects.testIamPermissions (its wire format:
    POST /v1/projects/ID:testIamPermissions {"permissions": [...]} answers the granted subset):
    it grants every permission asked but those in FAKE_IAM_DENIED (comma-separated), read at
    each request. Its URL goes to DISTRL_RESOURCE_MANAGER_URL (the stand_ins fixture)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            IAM_ASKED.append((self.path, self.headers.get("Authorization", ""),
                              asked["permissions"]))
            denied = set(filter(None, os.environ.get("FAKE_IAM_DENIED", "").split(",")))
            body = json.dumps({"permissions": [p for p in asked["permissions"]
                                               if p not in denied]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def stand_ins(tmp_path, monkeypatch, resource_manager):
    """gcloud, kubectl and gke-gcloud-auth-plugin stand-ins first on PATH, and the stand-in
    Resource Manager (resource_manager); returns the log. Tests change an answer with
    respond(monkeypatch, key, out, code)."""
    monkeypatch.setenv("DISTRL_RESOURCE_MANAGER_URL", resource_manager)
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    bin_dir.mkdir()
    for name in ("gcloud", "kubectl", "gke-gcloud-auth-plugin"):
        path = bin_dir / name
        path.write_text(STAND_IN.format(python=sys.executable, name=name,
                                        tests=str(Path(__file__).parent)))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("STAND_IN_ANSWERS", json.dumps(HEALTHY_PROJECT_ANSWERS))

    def recorded() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return recorded


@pytest.fixture(scope="session")
def kernel():
    """The Jupyter kernel of the interpreter that runs the tests (_register_kernel)."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("distrl")
    assert spec.argv[0] == sys.executable, spec.argv
    return "distrl"


@pytest.fixture(scope="session")
def instrumented_run(tmp_path_factory):
    """One short instrumented CartPole run, every process exporting to a local collector that
    stays up for the session: the telemetry and dashboard tests each check their part of what it
    exported (one end-to-end run, several views of it). Uses the Ray session that is up, else
    starts and stops its own."""
    from types import SimpleNamespace

    from distrl.apex.driver import ApeX
    from distrl.otel.collector import LocalCollector
    from distrl.rl.config import ApexConfig

    tmp = tmp_path_factory.mktemp("instrumented")
    with LocalCollector(tmp / "otel.db", port=0) as collector:
        config = ApexConfig(target_return=None, max_env_steps=60_000, max_seconds=120,
                            output_dir=str(tmp / "run"), progress=False, telemetry=True,
                            otlp_endpoint=collector.endpoint, metric_export_interval_s=1.0,
                            otlp_token_file=str(collector.token_file), run_id="test-run")
        result = ApeX(config).train()
        yield SimpleNamespace(result=result, collector=collector, db=tmp / "otel.db",
                              run_id=config.run_id)


@pytest.fixture
def busy_cpus():
    """Every core kept busy by a background CPU burner for the whole test: faults show up on
    busy machines (a raylet that starts slowly, an actor that waits for a CPU). The burners run
    at the niceness Ray gives its worker processes (RAY_worker_niceness, 15): they take every
    idle cycle and compete with the training on equal terms, and Ray's own daemons keep the
    priority over both that Ray gives them over its workers."""
    import subprocess

    burners = [subprocess.Popen([sys.executable, "-c", "import os; os.nice(15)\nwhile True: pass"])
               for _ in range(os.cpu_count() or 2)]
    yield len(burners)
    for p in burners:
        p.kill()
        p.wait(10)



def respond(monkeypatch, key: str, out: str, code: int = 0) -> None:
    """Make the stand-ins answer commands containing `key` with `out` (and exit `code`)."""
    old = json.loads(os.environ["STAND_IN_ANSWERS"])
    answers = {key: {"out": out, "code": code}} | {k: v for k, v in old.items() if k != key}
    monkeypatch.setenv("STAND_IN_ANSWERS", json.dumps(answers))
