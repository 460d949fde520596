"""The local multi-node cluster: real `ray start` processes, training as a Ray job through the
Jobs API, a worker node lost mid-run (a Spot preemption), and nothing left behind."""

import json
import socket
import time

import psutil
import pytest

from distrl import jobs
from distrl.cluster import STATE_FILE, ClusterError, LocalCluster, main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def ray_processes() -> set[int]:
    out = set()
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "ray/core/src/ray" in cmd or "ray start" in cmd or cmd.startswith("ray::"):
            out.add(p.pid)
    return out


def assert_gone(pids: list[int]) -> None:
    alive = [p for p in pids if psutil.pid_exists(p) and
             psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {alive}"


def test_training_job_survives_a_lost_worker_node(tmp_path):
    out = tmp_path / "job"
    with LocalCluster(num_workers=2, cpus_per_worker=1, head_cpus=1,
                      log_dir=tmp_path / "logs") as cluster:
        nodes = cluster.node_table()
        assert sorted(n["is_head"] for n in nodes) == [False, False, True]
        assert cluster.dashboard_url.startswith("http://127.0.0.1:")
        client = cluster.job_client()
        job_id = jobs.submit_training(
            client, ["--env", "CartPole-v1", "--num-actors", "2", "--actor-cpus", "1",
                     "--envs-per-actor", "16", "--target-return", "none", "--max-seconds", "100",
                     "--eval-interval-s", "3"], output_dir=str(out))
        lines: list[str] = []
        status = jobs.follow(client, job_id, out=lines.append, timeout_s=40)
        assert status == "RUNNING", lines
        cluster.kill_node("worker-2")         # preempted: no notice, its actor dies with it
        time.sleep(25)
        cluster.add_worker(name="worker-3")   # the node pool brings a replacement
        status = jobs.follow(client, job_id, out=lines.append, timeout_s=300)
        pids = cluster.pids()
    assert_gone(pids)
    assert status == "SUCCEEDED", "\n".join(lines[-40:])
    assert any("CartPole-v1: stopped (max_seconds)" in line for line in lines)  # streamed logs
    fetched = jobs.fetch(str(out), tmp_path / "fetched")
    result = json.loads((fetched / "results.json").read_text())
    assert (fetched / "checkpoints").is_dir() and any((fetched / "checkpoints").iterdir())
    kinds = [e["kind"] for e in result["events"]]
    assert "actor_lost" in kinds or "actor_silent" in kinds, result["events"]
    assert "actor_back" in kinds, result["events"]
    assert sum(result["actor_restarts"]) >= 1
    head = next(n["node_id"] for n in nodes if n["is_head"])
    assert head not in result["actor_nodes"] and len(set(result["actor_nodes"])) == 2
    assert len(result["actor_epsilons"]) == 2 and len(result["actor_epsilons"][0]) == 16
    steps = [p["env_steps"] for p in result["throughput"]]
    assert steps == sorted(steps) and result["replay_check"]["ok"]
    running = [p["actors_running"] for p in result["throughput"]]
    assert min(running) == 1 and running[-1] == 2  # the dip, and the recovery


def test_a_failed_head_start_leaves_nothing_running(tmp_path):
    before = ray_processes()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cluster = LocalCluster(num_workers=1, port=taken.getsockname()[1], start_timeout_s=60,
                               log_dir=tmp_path)
        with pytest.raises(ClusterError, match="node head exited with code"):
            cluster.start()
    assert cluster.nodes == []
    time.sleep(1)
    assert ray_processes() - before == set()


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


@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": -1}, "num_workers=-1"),
    ({"num_workers": 1.5}, "num_workers=1.5"),
    ({"cpus_per_worker": -2}, "cpus_per_worker=-2"),
    ({"port": 70000}, "port=70000"),
    ({"start_timeout_s": 0}, "start_timeout_s=0"),
])
def test_bad_cluster_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocalCluster(**kwargs)


def test_command_line_up_status_down(capsys):
    assert not STATE_FILE.exists()
    assert main(["up", "--workers", "1"]) == 0
    try:
        assert "Ray cluster up: 2 nodes" in capsys.readouterr().out
        state = json.loads(STATE_FILE.read_text())
        assert main(["up"]) == 1 and "already up" in capsys.readouterr().err
        assert main(["status"]) == 0
        assert state["dashboard_url"] in capsys.readouterr().out
        groups = [p.pid for g in state["groups"] for p in [psutil.Process(g)]]
        tree = groups + [c.pid for g in groups for c in psutil.Process(g).children(recursive=True)]
    finally:
        assert main(["down"]) == 0
    assert "Ray cluster down" in capsys.readouterr().out
    time.sleep(2)
    assert_gone(tree)
    assert not STATE_FILE.exists()
