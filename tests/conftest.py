import json
import os
import stat
import sys

import pytest

# TensorFlow's C++ start-up notices are noise in test logs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

STAND_IN = """#!{python}
# Stand-in for {name}: records its argv, answers the prerequisite queries, fails on request.
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(["{name}", *argv]) + "\\n")
line = " ".join(["{name}", *argv])
if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in line:
    print("ERROR: (gcloud) quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0", file=sys.stderr)
    sys.exit(1)
if argv[:2] == ["auth", "list"]:
    print(os.environ.get("FAKE_ACCOUNT", ""))
elif argv[:2] == ["projects", "describe"]:
    print(os.environ.get("FAKE_PROJECT_STATE", "ACTIVE"))
elif any(a.startswith("--output=jsonpath") for a in argv):
    print("distrl-head-x7k2p")
else:
    print("done:", line)
"""


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """gcloud, kubectl and gke-gcloud-auth-plugin stand-ins first on PATH; returns the log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    bin_dir.mkdir()
    for name in ("gcloud", "kubectl", "gke-gcloud-auth-plugin"):
        path = bin_dir / name
        path.write_text(STAND_IN.format(python=sys.executable, name=name))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_ACCOUNT", "reader@example.com")

    def recorded() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return recorded


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

