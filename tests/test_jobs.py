"""distrl.jobs pieces that need no cluster: the entrypoint, fetching, kubectl cp from the head."""

import json

import pytest

from distrl import jobs


def test_entrypoint_is_the_training_command_quoted():
    cmd = jobs.training_entrypoint(["--env", "CartPole-v1", "--run-id", "a b"], "/runs/x y")
    assert cmd == ("python -m distrl.train --env CartPole-v1 --run-id 'a b' --progress false "
                   "--output-dir '/runs/x y'")
    with pytest.raises(ValueError, match="must not contain --output-dir"):
        jobs.training_entrypoint(["--output-dir", "elsewhere"], "/runs/x")


def test_fetch_copies_results_and_checkpoints_from_a_uri(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"env_steps": 5}))
    (run / "checkpoints" / "checkpoint-000000007.npz").write_bytes(b"npz")
    (run / "checkpoints" / "checkpoint-000000007.json").write_text("{}")
    local = jobs.fetch(f"file://{run}", tmp_path / "local")
    assert json.loads((local / "results.json").read_text()) == {"env_steps": 5}
    assert sorted(p.name for p in (local / "checkpoints").iterdir()) == [
        "checkpoint-000000007.json", "checkpoint-000000007.npz"]
    with pytest.raises(FileNotFoundError, match="has the job ended"):
        jobs.fetch(str(tmp_path / "nothing"), tmp_path / "local2")


def test_copy_from_head_finds_the_head_pod_and_runs_kubectl_cp(stand_ins, tmp_path):
    jobs.copy_from_head("/home/ray/runs/04/job", tmp_path / "job", namespace="rl")
    assert stand_ins() == [
        ["kubectl", "get", "pods", "--namespace=rl", "--selector=ray.io/node-type=head",
         "--output=jsonpath={.items[0].metadata.name}"],
        ["kubectl", "cp", "--container=ray-head", "rl/distrl-head-x7k2p:/home/ray/runs/04/job",
         str(tmp_path / "job")]]


def test_copy_from_head_reports_a_failing_kubectl(stand_ins, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "kubectl cp")
    with pytest.raises(RuntimeError, match="kubectl cp .* failed: ERROR"):
        jobs.copy_from_head("/x", tmp_path / "job")
