"""End to end with real Ray processes: replay, learner, actors and evaluator."""

import json

import numpy as np
import pytest
import ray

from distrl.actor import slot_epsilons
from distrl.apex import ApeX, TrainingResult
from distrl.config import ApexConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


def test_cartpole_reaches_a_modest_return(local_ray, tmp_path):
    config = ApexConfig(env_id="CartPole-v1", target_return=150.0, max_seconds=120,
                        output_dir=str(tmp_path), progress=False, checkpoint_interval_s=5)
    result = ApeX(config).train()
    assert result.reached_target, result.evals[-5:]
    assert result.stop_reason == "target_return"
    assert result.best_eval_return >= 150 and result.time_to_target_s < 120
    assert result.env_steps > 10_000 and result.learner_updates > 100
    # The rate limiter held the replay ratio near its target.
    assert 0.5 * config.samples_per_insert < result.samples_per_insert < 1.5 * config.samples_per_insert
    # The epsilons span all actors' slots, as the paper has it.
    expected = [slot_epsilons(config, i).tolist() for i in range(config.num_actors)]
    np.testing.assert_allclose(result.actor_epsilons, expected)
    # Actors pulled fresh weights from the learner while they ran.
    assert all(0 < v <= result.learner_updates for v in result.actor_weights_versions)
    # Evaluations are greedy episodes, in time order.
    times = [e["time_s"] for e in result.evals]
    assert times == sorted(times) and all(len(e["returns"]) == 10 for e in result.evals)
    # What was written: results.json, a checkpoint, TensorBoard events.
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["learner_updates"] == result.learner_updates
    assert TrainingResult.load(tmp_path / "results.json").reached_target
    assert saved["config"]["env_id"] == "CartPole-v1"
    assert list((tmp_path / "checkpoints").glob("checkpoint-*.npz"))
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(result.weights) == 2 * (len(config.hidden_sizes) + 2)


def test_acrobot_short_run_improves_on_random(local_ray, tmp_path):
    # A random policy scores -500 (the time limit) on Acrobot-v1.
    config = ApexConfig(env_id="Acrobot-v1", target_return=-250.0, max_seconds=90,
                        output_dir=str(tmp_path), progress=False, eval_episodes=5)
    result = ApeX(config).train()
    assert result.reached_target, [e["mean_return"] for e in result.evals]
    assert result.best_eval_return >= -250


def test_command_line_run_stops_at_its_budget(local_ray, tmp_path, capsys):
    from distrl.train import main

    code = main(["--env", "CartPole-v1", "--target-return", "none", "--max-env-steps", "20000",
                 "--output-dir", str(tmp_path), "--progress", "false", "--num-actors", "1"])
    assert code == 0
    assert "stopped (max_env_steps)" in capsys.readouterr().out
    result = TrainingResult.load(tmp_path / "results.json")
    assert result.stop_reason == "max_env_steps" and not result.reached_target
    assert result.env_steps >= 20_000 and result.config["num_actors"] == 1


@pytest.mark.timeout(60)  # must not wait forever for a GPU that is not there
def test_missing_gpu_fails_fast_with_a_clear_message(local_ray, tmp_path):
    config = ApexConfig(num_gpus=1, resource_timeout_s=1, output_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"num_gpus=1 for the learner but the cluster has 0 GPU"):
        ApeX(config).train()


@pytest.mark.timeout(60)
def test_too_many_cpus_fail_fast(local_ray, tmp_path):
    config = ApexConfig(num_actors=3, actor_cpus=1.0, resource_timeout_s=1,
                        output_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match=r"4 CPUs .* cluster has 2; lower num_actors"):
        ApeX(config).train()
