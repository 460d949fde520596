"""The local multi-node cluster with real `ray start` processes: training as a Ray job through the
Jobs API, a node lost without a replacement, and nothing left behind, also when the process that
started it dies. The fault scenarios run with every core kept busy (the busy_cpus fixture).
Nodes that arrive on demand and a lost node that is replaced (the autoscaled Spot pool) are the
scenario of notebook 04, which tests/test_notebooks.py runs: one end-to-end run per scenario."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from conftest import is_ray_process

from distrl.cluster import jobs
from distrl.cluster.local import (
    WORKER_NICE,
    LocalCluster,
    _node_ports,
    free_ports,
    main,
    pick_head_ports,
    read_state,
    recorded,
    state_file,
    stop_groups,
    write_state,
)
from distrl.ray_runtime import ClusterError, init_local_ray, ray_gave_up, ray_temp_dir, running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SMALL_RUN = ["--env", "CartPole-v1", "--envs-per-actor", "8", "--hidden-sizes", "32", "32",
             "--batch-size", "128", "--min-replay-size", "500", "--target-return", "none",
             "--eval-interval-s", "3", "--checkpoint-interval-s", "10",
             "--jit-compile", "false"]  # node faults under test, not the learner's speed


@pytest.fixture
def own_tmpdir(monkeypatch):
    """A temp folder of the test's own, the TMPDIR of every process it starts: their Ray
    sessions and multiprocessing folders land in it, and their Ray processes are told apart by
    it from any other Ray on the machine (the other test lane, a reader's notebook). Short, for
    the socket paths Ray makes in its sessions (at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="distrl-test-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def ray_processes(tmpdir: Path) -> set[int]:
    """The Ray processes started under `tmpdir` (own_tmpdir): they inherit it as TMPDIR."""
    pids = set()
    for p in psutil.process_iter(["cmdline"]):
        if is_ray_process(p.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                if p.environ().get("TMPDIR") == str(tmpdir):
                    pids.add(p.pid)
    return pids


def ray_left(tmpdir: Path) -> dict[int, str]:
    """Ray processes started under `tmpdir` that still run, with their command lines (what a
    timeout names)."""
    left = {}
    for pid in ray_processes(tmpdir):
        with contextlib.suppress(psutil.Error):
            left[pid] = " ".join(psutil.Process(pid).cmdline())[:160]
    return left


def assert_gone(pids: list[int]) -> None:
    alive = running(pids)
    assert not alive, f"left running: {alive}"


def multiprocessing_dirs(tmpdir: Path) -> set[Path]:
    """multiprocessing's temp folders under `tmpdir` (Ray's dashboard makes one per head)."""
    return set(tmpdir.glob("pymp-*"))


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def wait_for_ray_to_end(tmpdir: Path, timeout_s: float, what: str) -> None:
    """Every Ray process started under `tmpdir` ends within timeout_s; a failure names the ones
    left, with their command lines."""
    try:
        wait_for(lambda: not ray_left(tmpdir), timeout_s, what)
    except AssertionError as e:
        raise AssertionError(f"{e}; left: {ray_left(tmpdir)}") from None


def test_ray_temp_dir_is_where_ray_puts_its_sessions(monkeypatch, tmp_path):
    """As Ray resolves it, RAY_TMPDIR first (tempfile.gettempdir() knows no RAY_TMPDIR), and
    forget_cluster removes the record there, only for its own port."""
    from ray._common.utils import get_default_ray_temp_dir

    from distrl.cluster.local import forget_cluster

    for env in ({}, {"TMPDIR": str(tmp_path / "t")},
                {"TMPDIR": str(tmp_path / "t"), "RAY_TMPDIR": str(tmp_path / "r")}):
        for name in ("TMPDIR", "RAY_TMPDIR"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert ray_temp_dir() == Path(get_default_ray_temp_dir()), env
    assert ray_temp_dir() == tmp_path / "r" / "ray"
    ray_temp_dir().mkdir(parents=True)
    (ray_temp_dir() / "ray_current_cluster").write_text("127.0.0.1:6380\n")
    forget_cluster(6379)
    assert recorded(6380)
    forget_cluster(6380)
    assert not recorded(6380) and not (ray_temp_dir() / "ray_current_cluster").exists()


def autogroup_nice(session_leader: int) -> int:
    """The nice value of a session's CPU share (Linux autogroups: "/autogroup-12 nice 5")."""
    return int(Path(f"/proc/{session_leader}/autogroup").read_text().split()[-1])


def said(lines: list[str], text: str, after: int = 0) -> int:
    return sum(text in line for line in lines[after:])


def test_a_node_lost_during_start_up_without_replacement_ends_on_budget(tmp_path, busy_cpus):
    """A fixed cluster of a head (the learner's CPU and one for an actor) and a worker node
    (one actor); the worker node dies while the job is still starting and nothing replaces it.
    The lost actor waits for a CPU that never comes, is reported, and the job still ends by
    max_seconds with results.json."""
    out, lines = tmp_path / "job", []
    with LocalCluster(num_workers=1, cpus_per_worker=1, head_cpus=2,
                      log_dir=tmp_path / "logs") as cluster:
        # A worker node's session gets a third of the head's CPU weight (cluster.WORKER_NICE).
        assert [autogroup_nice(n.process.pid) for n in cluster.nodes] == [0, WORKER_NICE]
        # The worker node runs on a core of its own, as a pod's CPU limit confines it: its
        # `ray start` and every process under it (its raylet) inherit it; the head runs anywhere.
        head, worker = cluster.nodes
        assert head.cores == frozenset() and len(worker.cores) == 1
        tree = [worker.process.pid, *(p.pid for p in psutil.Process(worker.process.pid)
                                      .children(recursive=True))]
        assert len(tree) > 1 and {frozenset(os.sched_getaffinity(pid)) for pid in tree} == {
            worker.cores}
        client = cluster.job_client()
        budget = 20.0
        job_id = jobs.submit_training(client, [*SMALL_RUN, "--num-actors", "2", "--actor-cpus",
                                               "1", "--max-seconds", str(budget)],
                                      output_dir=str(out))
        status = jobs.follow(client, job_id, timeout_s=240, out=lines.append,
                             until=lambda: said(lines, "actors, learner and"))
        assert status == "RUNNING", "\n".join(lines[-40:])
        cluster.kill_node("worker-1")  # actors are created, none has reported yet
        status = jobs.follow(client, job_id, timeout_s=budget + 60, out=lines.append)
        pids = cluster.pids()
    assert_gone(pids)
    assert status == "SUCCEEDED", "\n".join(lines[-40:])
    result = json.loads((out / "results.json").read_text())
    assert result["stop_reason"] == "max_seconds"
    assert result["wall_time_s"] < budget + 25  # the stop sequence fits a Spot notice
    # The last line names the actor that never got its CPU back.
    assert re.search(r"; actor [01] waiting for a CPU since \d+ s", result["stop_detail"]), \
        result["stop_detail"]
    assert any("waiting for a CPU" in line for line in lines), lines[-40:]
    assert any("waited" in state for state in result["actor_states"]), result["actor_states"]
    assert "running" in result["actor_states"] and result["env_steps"] > 0  # the other trained on
    # Whether the learner's TensorFlow start-up ends inside the budget depends on the load (a
    # CI run: not in 45 s), so updates and a checkpoint are not asserted here (test_faults has
    # both: a learner that trained and was stopped, one that never got a CPU). Until it runs,
    # every 10-s report names it.
    events = result["events"]
    learner_at = min([e["time_s"] for e in events if e["kind"] == "learner_running"],
                     default=float("inf"))
    assert all("; learner " in e["detail"] for e in events
               if e["kind"] == "waiting" and e["time_s"] < learner_at), events


def test_a_failed_head_start_leaves_nothing_running(tmp_path, own_tmpdir):
    """The head fails half-way: `ray start` has started the GCS when it finds the dashboard's
    port taken, and exits; what it started goes too."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cluster = LocalCluster(num_workers=1, dashboard_port=taken.getsockname()[1],
                               start_timeout_s=60, log_dir=tmp_path)
        with pytest.raises(ClusterError, match="node head exited with code"):
            cluster.start()
    assert cluster.nodes == []
    wait_for_ray_to_end(own_tmpdir, 30, "the head's processes to end")


def test_an_unreachable_head_is_a_clear_error_and_leaves_nothing(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = LocalCluster(num_workers=0, port=port, start_timeout_s=3, log_dir=tmp_path)
    cluster.add_worker(name="lonely")
    with pytest.raises(ClusterError, match="no Ray head answered at 127.0.0.1"):
        cluster.wait_for_nodes(1, timeout_s=30)
    pids = cluster.pids()
    cluster.stop()
    assert_gone(pids)


OWNER = """
import sys, time
from distrl.cluster.local import LocalCluster
cluster = LocalCluster(num_workers=0, log_dir=sys.argv[1]).start()
print(cluster.port, *cluster.pids(), flush=True)
time.sleep(600)
"""


@pytest.mark.waits
def test_a_cluster_whose_owner_is_killed_is_stopped_by_its_reaper(tmp_path):
    """The process that started the cluster dies without running any cleanup (SIGKILL, as a
    kernel gets when it does not shut down in time): its nodes go too, and so does Ray's
    record of the cluster, so a later ray.init() starts a fresh local Ray."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        port, *pids = map(int, owner.stdout.readline().split())
        assert pids
        # `ray start --head` records the cluster as its last step, which can come seconds
        # after the head already serves (start() returns then).
        wait_for(lambda: recorded(port), 60,
                 "ray start to record the cluster in ray_current_cluster")
    finally:
        owner.kill()
        owner.wait(30)
    wait_for(lambda: not running(pids), 60, "the reaper to stop the nodes")
    assert not recorded(port)
    fresh = subprocess.run([sys.executable, "-c",
                            "import ray; ray.init(num_cpus=1, include_dashboard=False); "
                            "print(ray.get_runtime_context().gcs_address); ray.shutdown()"],
                           capture_output=True, text=True, timeout=180)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert not fresh.stdout.strip().endswith(f":{port}")


def test_a_notebook_failing_mid_way_leaves_no_cluster_behind(tmp_path):
    """papermill runs a notebook that starts a cluster and then fails: the kernel's exit stops
    the cluster and forgets its record."""
    import nbformat
    from papermill.exceptions import PapermillExecutionError

    from distrl.tutorial import run_notebook

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "distrl", "language": "python",
                                                            "display_name": "distrl"},
                                             "language_info": {"name": "python"}})
    params = nbformat.v4.new_code_cell("LOG_DIR = ''")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "from distrl.cluster.local import LocalCluster\n"
        "cluster = LocalCluster(num_workers=0, log_dir=LOG_DIR).start()\n"
        "print('PORT', cluster.port, *cluster.pids())"),
        nbformat.v4.new_code_cell("raise RuntimeError('a cell fails mid-way')")]
    path = tmp_path / "fails.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(PapermillExecutionError, match="a cell fails mid-way"):
        run_notebook(path, tmp_path / "out", {"LOG_DIR": str(tmp_path / "logs")},
                     cell_timeout_s=300)
    executed = nbformat.read(tmp_path / "out" / "fails.ipynb", as_version=4)
    line = next(o["text"] for c in executed.cells for o in c.get("outputs", [])
                if "PORT" in o.get("text", ""))
    port, *pids = map(int, line.split()[1:])
    wait_for(lambda: not running(pids), 60, "the notebook's cluster to stop")
    assert not recorded(port)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": -1}, "num_workers=-1"),
    ({"num_workers": 1.5}, "num_workers=1.5"),
    ({"cpus_per_worker": -2}, "cpus_per_worker=-2"),
    ({"port": 70000}, "port=70000"),
    ({"start_timeout_s": 0}, "start_timeout_s=0"),
    ({"log_dir": __file__}, "log_dir=.*test_cluster.py': exists and is not a directory"),
    ({"autoscale": {"max": 2}}, "autoscale=.*NodeGroup"),
    ({"pin_workers": 1}, "pin_workers=1: expected True or False"),
])
def test_bad_cluster_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocalCluster(**kwargs)


# A driver that starts Ray with init_local_ray, runs a task on it and lists its processes.
DRIVER = """
import json, psutil, ray
from distrl.ray_runtime import init_local_ray
init_local_ray(num_cpus=1, include_dashboard=False, logging_level="error")
up = ray.get(ray.remote(lambda: "task ran").remote(), timeout=60)
def described(c):
    try:
        return c.pid, c.name(), " ".join(c.cmdline())
    except psutil.Error:  # ended, or a zombie, while looked at
        return None
children = [d for c in psutil.Process().children(recursive=True) if (d := described(c))]
raylets = [pid for pid, name, _ in children if name == "raylet"]
cmdlines = [cmdline for _, _, cmdline in children]
ray.shutdown()
print(json.dumps({"raylets": raylets, "up": up, "cmdlines": cmdlines}))
"""


SHUTDOWN = """
import json, ray
from ray._private import node, worker
from distrl.ray_runtime import init_local_ray, running, shutdown_ray
start_api_server, start_ray_processes = node.Node.start_api_server, node.Node.start_ray_processes
init_local_ray(num_cpus=1, include_dashboard=False)
started = {kind: [i.process.pid for i in infos]
           for kind, infos in worker._global_node.all_processes.items()}
up = ray.get(ray.remote(lambda: "task ran").remote(), timeout=60)
import psutil
def listening(process):
    try:
        return [c.laddr.ip for c in process.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN]
    except psutil.Error:  # ended while looked at
        return []
addresses = sorted({ip for p in [psutil.Process(), *psutil.Process().children(recursive=True)]
                    for ip in listening(p)})
restored = (node.Node.start_api_server is start_api_server
            and node.Node.start_ray_processes is start_ray_processes)
shutdown_ray()
left = running([pid for pids in started.values() for pid in pids])  # before Ray's atexit
print(json.dumps({"started": started, "up": up, "restored": restored, "left": left,
                  "addresses": addresses}))
"""


def test_a_local_ray_starts_no_dashboard_and_shutdown_ray_ends_every_process_it_started(
        tmp_path):
    """init_local_ray(include_dashboard=False) listens on loopback only and starts no
    dashboard process, which ray.init
    starts anyway (and waits for before the raylet), and leaves Ray's code as it was. Then
    shutdown_ray kills the autoscaler monitor before ray.shutdown() (which would wait 1 s on
    it): every process that ray.init started is gone afterwards, and the monitor reported no
    failure on its way out. With RAY_AUTH_TOKEN_PATH set, the token is made there and Ray
    reads it there: nothing lands in the home folder's .ray (the README says so)."""
    home, token = tmp_path / "home", tmp_path / "elsewhere" / "auth_token"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(token)}
    run = subprocess.run([sys.executable, "-c", SHUTDOWN], capture_output=True, text=True,
                         timeout=180, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert token.is_file() and (token.stat().st_mode & 0o777) == 0o600
    assert not (home / ".ray").exists(), sorted(str(p) for p in home.rglob("*"))
    out = json.loads(run.stdout.splitlines()[-1])
    started = out["started"]
    assert started["monitor"] and started["raylet"] and started["gcs_server"], started
    assert "dashboard" not in started, started
    assert out["up"] == "task ran" and out["restored"], out
    assert out["left"] == [], out
    assert "autoscaler failed" not in run.stdout + run.stderr, run.stderr[-3000:]
    # Token authentication is on (the token file exists), without Ray's WARNING that says so.
    assert "Token authentication is enabled" not in run.stdout + run.stderr, run.stderr[-3000:]
    # Every Ray process listens on loopback only (Ray's default is every interface).
    assert out["addresses"] and set(out["addresses"]) <= {"127.0.0.1", "::ffff:127.0.0.1"}, out


# Stands in for valgrind where Ray launches a raylet under it (RAY_RAYLET_VALGRIND_PROFILER=1,
# ray/_private/services.py start_ray_process): the first launch for each $RAYLET_LOST file is
# SIGKILLed the moment it starts, its pid kept in that file; every later launch runs the raylet.
LOSE_FIRST_RAYLET = """#!/bin/sh
if [ ! -s "$RAYLET_LOST" ]; then echo $$ > "$RAYLET_LOST"; kill -9 $$; fi
shift  # --tool=callgrind
exec "$@"
"""


@pytest.mark.waits
def test_a_raylet_that_dies_at_launch_gets_a_second_start(tmp_path, capsys, monkeypatch,
                                                          own_tmpdir):
    """Ray waits a fixed 30 s for a new node's GCS and for its raylet, then gives up. Both ways
    the series starts a node try once more: a driver's init_local_ray (ray.init) and a
    LocalCluster head (`ray start`), each losing its first raylet the moment it starts (through
    Ray's own launch hook, so that no race with the raylet's registration decides it). They run
    side by side. Neither waits out Ray's 30 s: init_local_ray sees the raylet's process end,
    and LocalCluster sees a child of `ray start` end, and each starts the node again. So does
    a worker node that joins then, losing its first raylet too (`ray start` behind
    wait-for-head.sh)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "valgrind").write_text(LOSE_FIRST_RAYLET)
    (hook / "valgrind").chmod(0o755)
    lost = {side: tmp_path / f"{side}.lost-raylet" for side in ("driver", "head", "worker-1")}
    launch = {"RAY_RAYLET_VALGRIND_PROFILER": "1", "PATH": f"{hook}{os.pathsep}{os.environ['PATH']}"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=os.environ | launch | {"RAYLET_LOST": str(lost["driver"])})
    for name, value in (launch | {"RAYLET_LOST": str(lost["head"])}).items():
        monkeypatch.setenv(name, value)  # the head's `ray start` inherits them
    try:
        with LocalCluster(num_workers=0, log_dir=tmp_path) as cluster:
            monkeypatch.setenv("RAYLET_LOST", str(lost["worker-1"]))
            cluster.join(lambda: cluster.add_worker(name="worker-1"))  # as start() adds one
            table = cluster.node_table()
            assert [n["state"] for n in table] == ["ALIVE", "ALIVE"], table
            assert [n.name for n in cluster.nodes] == ["head", "worker-1"]
            pids = cluster.pids()
            made = multiprocessing_dirs(own_tmpdir)  # both starts' dashboards
            # What the checks below scope to: this test's Ray, sessions and all, in own_tmpdir.
            assert ray_processes(own_tmpdir) and list((own_tmpdir / "ray").glob("session_*"))
        out, driver_err = driver.communicate(timeout=240)
    finally:
        driver.kill()
    killed = {side: int(path.read_text()) for side, path in lost.items() if path.exists()}
    assert set(killed) == {"driver", "head", "worker-1"}, killed
    # The cluster: each node started again, the failed start's log kept beside the new one.
    err = capsys.readouterr().err
    for node in ("head", "worker-1"):
        assert killed[node] not in pids
        why = (f"its valgrind (pid {killed[node]}) ended while the node started, before it "
               "joined the cluster")
        assert f"node {node} did not start ({why}); its log: " in err, err[-3000:]
        failed_log = (tmp_path / f"{node}.failed-start.log").read_text()
        assert failed_log.endswith(f"distrl: node {node} did not start: {why}\n"), \
            failed_log[-3000:]
        assert not ray_gave_up(failed_log), failed_log[-3000:]  # stopped before Ray's 30 s
    assert err.count("starting it again") == 2, err[-3000:]
    assert_gone(pids)
    # The dashboard's temp folder: neither start's is left (the driver's Ray runs no dashboard).
    assert made and not multiprocessing_dirs(own_tmpdir), multiprocessing_dirs(own_tmpdir)
    # The driver: a new raylet ran its task, it said which session's logs to read, and that
    # session's processes (its GCS, dashboard, monitors) were stopped before the second start.
    assert driver.returncode == 0, driver_err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["up"] == "task ran"
    assert result["raylets"] and killed["driver"] not in result["raylets"]
    assert "starting Ray again (2 of 2)" in driver_err, driver_err[-3000:]
    # Not after Ray's 30 s: init_local_ray saw the raylet's process end before it registered.
    assert (f"its raylet (pid {killed['driver']}) ended with exit code -9 before it registered "
            "with the GCS") in driver_err, driver_err[-3000:]
    # Killed before it became the raylet, so it never opened its log.
    failed = re.search(r"logs in (\S+)/logs: no raylet\.out, the raylet ended", driver_err)
    assert failed, driver_err[-3000:]
    assert failed.group(1).endswith(f"_{driver.pid}"), failed.group(1)  # its own, not the head's
    assert not [c for c in result["cmdlines"] if failed.group(1) in c], result["cmdlines"]
    wait_for_ray_to_end(own_tmpdir, 30, "every session's processes to end")


def test_a_failed_start_is_traced_to_its_own_session_not_the_newest(tmp_path):
    """Ray's session_latest link names whichever Ray started last on the machine (a `ray start`
    head beside the driver); the driver's failed start is the session named after its pid."""
    from distrl.ray_runtime import _new_session

    began = time.time()
    mine = tmp_path / f"session_2026-12-02_10-00-00_000001_{os.getpid()}"
    other = tmp_path / "session_2026-12-02_10-00-01_000002_999999"
    old = tmp_path / f"session_2026-12-01_10-00-00_000003_{os.getpid()}"
    for path in (old, mine, other):
        path.mkdir()
    os.utime(old, (began - 3600, began - 3600))  # an earlier run's, with a reused pid
    (tmp_path / "session_latest").symlink_to(other)
    assert _new_session(tmp_path, began) == mine
    mine.rmdir()
    assert _new_session(tmp_path, began) is None


def test_what_counts_as_ray_giving_up_on_a_node():
    """Ray's four messages (the raylet's and `ray start`'s two in ray/_private/node.py; the GCS
    port file's wait in _raylet.so), and look-alikes that must pass through."""
    assert ray_gave_up("The current node timed out during startup. This could happen because")
    # `ray start --head --port` (a fixed GCS port) whose GCS died, two ways (one seen in CI):
    assert ray_gave_up('  File "ray/_private/node.py", line 1025, in _init_gcs_client\n'
                       "    raise RuntimeError(\nRuntimeError: Failed to start GCS.")
    assert ray_gave_up('  File "ray/_private/node.py", line 1017, in _init_gcs_client\n'
                       "FileNotFoundError: [Errno 2] No such file or directory: "
                       "'/tmp/ray/session_x/logs/gcs_server.err'")
    assert ray_gave_up("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_ab12")
    assert not ray_gave_up("Timed out waiting for file /tmp/ray/session_x/results.json")
    assert not ray_gave_up("Can't find a `node_ip_address.json` file")


def test_init_local_ray_refuses_bad_values_and_passes_other_errors_on_at_once(capsys):
    for attempts in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"attempts={attempts!r}"):
            init_local_ray(attempts=attempts)
    with pytest.raises(ValueError, match="address='auto'.*ray.init"):
        init_local_ray(address="auto")
    with pytest.raises(RuntimeError, match="no_such_option") as raised:
        init_local_ray(no_such_option=1)  # Ray refuses it before starting anything
    assert not isinstance(raised.value, ClusterError)
    assert "starting Ray again" not in capsys.readouterr().err  # not taken for a slow start


STOPPED_WHILE_STARTING = """
import psutil, ray
from distrl.ray_runtime import init_local_ray, StartInterrupted

def gcs_up():  # stop() turns True once Ray's GCS runs: the start is then waiting on its raylet
    return any(c.name() == "gcs_server" for c in psutil.Process().children())

try:
    init_local_ray(num_cpus=1, include_dashboard=False, stop=gcs_up)
except StartInterrupted as e:
    print("interrupted:", e)
print("initialized:", ray.is_initialized())
"""


def test_init_local_ray_asked_to_stop_while_starting_stops_what_it_started(own_tmpdir):
    """A SIGTERM caught while Ray's node starts: init_local_ray gives up at its next wait,
    stops the processes it had started, and does not start again."""
    run = subprocess.run([sys.executable, "-c", STOPPED_WHILE_STARTING], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "interrupted: asked to stop while Ray's raylet started" in run.stdout, run.stdout
    assert "initialized: False" in run.stdout and "starting Ray again" not in run.stderr
    wait_for(lambda: not ray_processes(own_tmpdir), 30, "the started processes to end")


def test_running_counts_ended_zombie_and_vanished_processes_as_ended():
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, not yet reaped
    reaped = subprocess.Popen([sys.executable, "-c", "pass"])
    reaped.wait(30)
    try:
        wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 30,
                 "the child to end")
        assert running([live.pid, zombie.pid, reaped.pid]) == [live.pid]
    finally:
        live.kill()
        live.wait(30)
        zombie.wait(30)
    assert running([live.pid]) == []
    with pytest.raises(ValueError, match="-1"):
        running([-1])


def test_a_nodes_ports_are_distinct_and_avoid_the_heads_ports():
    """CI once gave a raylet and its dashboard the same port (picked one at a time, the OS
    may hand one out twice), and Ray refused to start the head. Picked together, they differ."""
    taken = {free_ports(1)[0], free_ports(1)[0]}
    for _ in range(200):
        argv = _node_ports(0, head_ports=tuple(taken))
        ports = [int(a.split("=")[1]) for a in argv if "-worker-port" not in a]
        assert len(ports) == 7  # six daemons and the Ray Client server
        assert len(set(ports)) == len(ports) and not taken & set(ports), argv
    assert len(_node_ports(1)) == 8 and "--min-worker-port=11002" in _node_ports(1)
    assert pick_head_ports(6380, 0)[0] == 6380 and pick_head_ports(6380, 0)[1] not in (0, 6380)


def test_command_line_up_status_down(capsys, tmp_path, own_tmpdir, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # this test's own record
    record = state_file()
    assert record == tmp_path / "state" / "distrl" / "cluster.json"
    assert not record.exists()
    (tmp_path / "a-file").write_text("")
    assert main(["up", "--log-dir", str(tmp_path / "a-file")]) == 1
    assert f"log_dir='{tmp_path / 'a-file'}': exists and is not a directory" in \
        capsys.readouterr().err
    assert main(["up", "--workers", "1", "--log-dir", str(tmp_path / "logs")]) == 0
    try:
        assert "Ray cluster up: 2 nodes" in capsys.readouterr().out
        made = multiprocessing_dirs(own_tmpdir)
        assert made  # the head's dashboard runs a forkserver
        state = json.loads(record.read_text())
        assert main(["up"]) == 1 and "already up" in capsys.readouterr().err
        assert main(["status"]) == 0
        assert state["dashboard_url"] in capsys.readouterr().out
        groups = [p.pid for g in state["groups"] for p in [psutil.Process(g)]]
        tree = groups + [c.pid for g in groups for c in psutil.Process(g).children(recursive=True)]
        # Every process of both nodes listens on loopback only (Ray's default: every interface).
        addresses = set()
        for pid in tree:
            with contextlib.suppress(psutil.Error):
                addresses |= {c.laddr.ip for c in psutil.Process(pid).net_connections("inet")
                              if c.status == psutil.CONN_LISTEN}
        assert addresses and addresses <= {"127.0.0.1", "::ffff:127.0.0.1"}, addresses
    finally:
        assert main(["down"]) == 0
    assert f"Ray cluster down; its logs stay in {tmp_path / 'logs'}" in capsys.readouterr().out
    # Each node drained and shut down by itself on SIGTERM: the worker first, as it drains through
    # the head's GCS (stopped together, it could wait for a GCS already gone until SIGKILL).
    for node in ("head", "worker-1"):
        log = (tmp_path / "logs" / f"{node}.log").read_text()
        assert "Local node finished draining; shutting down." in log, log[-2000:]
    wait_for(lambda: not running(tree), 30, "the cluster's processes to end")
    assert not record.exists()
    assert not multiprocessing_dirs(own_tmpdir), "a stopped cluster left its temp folders"


def test_cluster_down_trusts_only_its_own_state_file_and_processes(tmp_path):
    """`distrl cluster down` kills the process groups its state file names: the file lives in
    the user's own directory, and a link, a file others may write, or a group whose leader
    is not the recorded process (a reused pid, another user's) is refused."""
    assert state_file().is_relative_to(Path(os.environ.get("XDG_STATE_HOME") or Path.home()))
    state = tmp_path / "state" / "cluster.json"
    write_state(state, {})
    state.unlink()
    (tmp_path / "elsewhere").write_text("{}")
    state.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="cannot be trusted"):
        read_state(state)
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        write_state(state, {"port": 1, "groups": [victim.pid], "created": [0.0]})
        assert (tmp_path / "elsewhere").read_text() == "{}"  # the link was replaced
        assert state.stat().st_mode & 0o077 == 0 and state.parent.stat().st_mode & 0o077 == 0
        planted = read_state(state)  # a pid with another start time: a reused pid
        stop_groups(planted["groups"], planted["port"], grace_s=0.5, created=planted["created"])
        assert victim.poll() is None
        state.chmod(0o666)
        with pytest.raises(ValueError, match="another user or others may write"):
            read_state(state)
        write_state(state, {"port": 1, "groups": ["1; rm"], "created": [0.0]})
        with pytest.raises(ValueError, match="not a cluster state"):
            read_state(state)
        started = psutil.Process(victim.pid).create_time()
        stop_groups([victim.pid], 1, grace_s=1.0, created=[started])  # the recorded one
        assert victim.wait(timeout=10) is not None
    finally:
        victim.kill()
        victim.wait()
    assert read_state(tmp_path / "missing.json") is None
    (tmp_path / "shared").mkdir(mode=0o777)
    (tmp_path / "shared").chmod(0o777)
    with pytest.raises(ValueError, match="others may write it"):
        write_state(tmp_path / "shared" / "cluster.json", {})


def test_a_record_the_head_writes_while_it_stops_is_forgotten_too(tmp_path, monkeypatch):
    """`ray start --head` writes Ray's record of the cluster as its last step, which on a busy
    machine comes seconds after the head serves: a cluster stopped right away may see it
    written after stop_groups' first forget. A stand-in head that writes the record when its
    SIGTERM comes (after the first forget, by construction) and then ignores it: the record is
    gone once stop_groups returns."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # its record: tmp_path/ray/...
    ray_temp_dir().mkdir()
    record = ray_temp_dir() / "ray_current_cluster"
    # `sleep & wait`: sh runs a trap only between commands, and `wait` is one it interrupts.
    head = subprocess.Popen(["sh", "-c", f"trap 'echo 127.0.0.1:6390 > {record}' TERM; "
                             "echo trapped; while :; do sleep 60 & wait; done"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert head.stdout.readline() == "trapped\n"  # its trap is set before any signal
        stop_groups([head.pid], 6390, grace_s=1.5)
        assert head.wait(timeout=10) == -9  # it wrote on SIGTERM, went on, and was killed
        assert not record.exists()
    finally:
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()


def test_killed_node_names_are_checked(tmp_path):
    cluster = LocalCluster(num_workers=0, log_dir=tmp_path)
    with pytest.raises(ValueError, match=r"name='head': expected one of the worker nodes"):
        cluster.kill_node("head")


def test_worker_nodes_take_the_cores_fewest_live_nodes_run_on():
    """The cores a new worker node is pinned to: ceil(its CPUs), least shared with live worker
    nodes first (a replacement takes the lost node's core), lowest first on a tie."""
    from types import SimpleNamespace

    cores = sorted(os.sched_getaffinity(0))
    cluster = LocalCluster(num_workers=0)

    def node(pinned, alive=True):
        return SimpleNamespace(cores=frozenset(pinned), alive=lambda: alive)

    cluster.nodes = [node([])]  # the head
    assert cluster._free_cores(1) == {cores[0]} and cluster._free_cores(1.5) == set(cores[:2])
    cluster.nodes.append(node([cores[0]]))
    assert cluster._free_cores(1) == {cores[1 % len(cores)]}
    cluster.nodes.append(node([cores[1 % len(cores)]], alive=False))  # a lost node's core: free
    assert cluster._free_cores(1) == {cores[1 % len(cores)]}
    assert cluster._free_cores(0) == frozenset()


def test_the_effects_of_a_lost_node_count_the_lost_actors_own_steps():
    """A node's loss seen in the run's record: the lost actor's own env steps stop while it is
    gone and go on after its new life's first report, whatever the total does (here the learner
    starts meanwhile and the total rises: the confound the total alone would have shown)."""
    from distrl.cluster.autoscale import preemption_effects

    rows = []
    for k in range(41):  # one row every 0.5 s, from 0 to 20 s; the kill at 5 s, back at 12 s
        t = 0.5 * k
        lost = 1000 * min(t, 5.0) + 1000 * max(0.0, t - 12.0)
        other = 1000 * t if t < 8 else 8000 + 3000 * (t - 8)  # the other actor speeds up
        rows.append({"time_s": t, "env_steps": lost + other, "actors_running": 2 if t < 5 or
                     t >= 12 else 1, "actor_env_steps": [lost, other]})
    rows[24]["actor_env_steps"][0] += 400  # the new life's steps before its first report
    rows[24]["env_steps"] += 400
    result = {"started_at": 100.0, "throughput": rows, "actor_restarts": [1, 0], "events": [
        {"time_s": 1.0, "kind": "actor_running", "detail": "actor 0 running on node abcdef12"},
        {"time_s": 12.0, "kind": "actor_back", "detail": "actor 0 is back on node 99999999"}]}
    effects = preemption_effects(result, killed_at=105.0, node_id="abcdef123456")
    assert effects["lost"] == [0] and effects["back"] == {0: 12.0}
    assert effects["before"]["lost_env_steps_per_s"] == pytest.approx(1000)
    assert effects["during"]["lost_env_steps_per_s"] == 0  # its first report's row left out
    # after: from its first report on (5,000 steps to 17 s, less the 400 that report counted)
    assert effects["after"]["lost_env_steps_per_s"] == pytest.approx(920)
    # and the other actor's own, in the same stretches: 1,000 a second, then 3,000 from 8 s
    assert effects["before"]["peer_env_steps_per_s"] == pytest.approx(1000)
    assert effects["after"]["peer_env_steps_per_s"] == pytest.approx(3000)
    assert effects["during"]["env_steps_per_s"] > effects["before"]["env_steps_per_s"]
    # A machine that stalled every process for the last 2 s before the kill: the pace before
    # is the lost actor's up to its last step, not the stall's 0.
    stalled = [{**r, "actor_env_steps": [min(r["actor_env_steps"][0], 3000),
                                         r["actor_env_steps"][1]]} for r in rows]
    assert preemption_effects({**result, "throughput": stalled}, killed_at=105.0,
                              node_id="abcdef12")["before"]["lost_env_steps_per_s"] == \
        pytest.approx(1000)
    # The learner starting at 14 s (--learn-after-recovery) ends the stretch after: from then
    # on its start shares the cores and its rate limiter paces the actors (0 steps here).
    for r in rows[29:]:
        r["actor_env_steps"][0] = rows[28]["actor_env_steps"][0]
    result["events"].append({"time_s": 14.0, "kind": "learning_starts", "detail": "..."})
    learning = preemption_effects(result, killed_at=105.0, node_id="abcdef123456")
    assert learning["after"]["lost_env_steps_per_s"] == pytest.approx(800)  # 12-14 s, less 400
    # Actor 1, on another node, went quiet under load and reported again after the learner's
    # start: it kept its process, so it is not "back" (notebook 04 took it for the lost actor's
    # return and said learning had not waited for it: seen beside two busy loops).
    result["events"] += [{"time_s": 15.0, "kind": "actor_silent", "detail": "actor 1 stopped"},
                         {"time_s": 16.0, "kind": "actor_back", "detail": "actor 1 is back on "
                          "node 77777777: 2 of 2 actors running"}]
    assert preemption_effects(result, 105.0, "abcdef12")["back"] == {0: 12.0}
    del rows[10]["actor_env_steps"], rows[0]["actor_env_steps"]  # a record from before
    assert preemption_effects(result, 105.0, "abcdef12")["before"]["lost_env_steps_per_s"] is None


def test_a_moment_is_placed_on_the_run_clock_by_the_monotonic_clock_of_one_boot():
    """A wall clock stepped 17 s forward within a run (seen on a test machine) placed notebook
    04's kill 17 s early on the run's clock, before the steady line it had waited for. A
    moment of this boot is placed by the monotonic clock; one of another boot, or a bare wall
    time, by the wall clock."""
    from distrl.run_clock import BOOT_ID, moment, run_seconds

    now = moment()
    result = {"started_at": now["wall"] - 20.0, "started_monotonic": now["monotonic"] - 3.0,
              "boot_id": BOOT_ID}  # the wall clock jumped 17 s since train() began
    assert run_seconds(result, now) == pytest.approx(3.0 if BOOT_ID else 20.0)
    assert run_seconds({**result, "boot_id": "another boot"}, now) == pytest.approx(20.0)
    assert run_seconds({**result, "started_monotonic": None}, now) == pytest.approx(20.0)
    assert run_seconds(result, now["wall"]) == pytest.approx(20.0)
    assert BOOT_ID is not None  # Linux: where these tests run, and the local cluster runs
