"""Bad configuration is refused before anything starts, with the field, value and what is accepted."""

import dataclasses
import re
import subprocess
import sys

import pytest

from distrl.apex.driver import ApeX
from distrl.apex.train import build_parser, config_from_args, main
from distrl.field_docs import field_help
from distrl.rl.config import ApexConfig


@pytest.mark.parametrize("field, value, accepted", [
    ("num_actors", -1, "an integer >= 1"),
    ("num_actors", 0, "an integer >= 1"),
    ("num_actors", 2.5, "an integer >= 1"),
    ("n_step", 0, "an integer >= 1"),
    ("priority_alpha", 1.5, r"\[0, 1\]"),
    ("priority_alpha", -0.1, r"\[0, 1\]"),
    ("priority_beta", 2.0, r"\[0, 1\]"),
    ("gamma", 1.0, r"\[0, 1\)"),
    ("learning_rate", 0.0, "> 0"),
    ("learning_rate", float("nan"), "> 0"),
    ("batch_size", 0, "an integer >= 1"),
    ("batch_size", 10**9, "at most replay_capacity"),
    ("min_replay_size", 0, r"\[1, replay_capacity"),
    ("envs_per_actor", 0, "an integer >= 1"),
    ("fetches_in_flight", 0, "an integer >= 1"),
    ("epsilon_base", 1.5, r"\[0, 1\]"),
    ("num_gpus", -1, ">= 0"),
    ("actor_cpus", 0, "None or a number > 0"),
    ("hidden_sizes", (), "one or more integers"),
    ("hidden_sizes", (64, 0), "one or more integers"),
    ("max_seconds", -5, "None or a number > 0"),
    ("max_env_steps", 0, "None or an integer >= 1"),
    ("hold_learner_within", (300, 100), "None or two numbers .low, high. with low < high"),
    ("hold_learner_within", (100,), "None or two numbers"),
    ("hold_learner_within", (100, float("inf")), "None or two numbers"),
    ("samples_per_insert", -1, ">= 0"),
    ("dueling", "yes", "True or False"),
    ("xla_cache", 1, "True or False"),
    ("env_id", "", "non-empty"),
    ("learner_wait_s", 0, "a number of seconds > 0"),
    ("best_eval_episodes", -1, r"an integer >= 0 \(0: keep no best policy\)"),
    ("best_eval_episodes", 2.5, "an integer >= 0"),
])
def test_bad_values_name_the_field_value_and_range(field, value, accepted):
    with pytest.raises(ValueError, match=rf"ApexConfig\.{field}=.*invalid: expected .*{accepted}"):
        ApexConfig(**{field: value})


def test_replace_validates_again_and_round_trips():
    config = ApexConfig()
    with pytest.raises(ValueError, match="n_step=0"):
        config.replace(n_step=0)
    assert ApexConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"unknown ApexConfig field\(s\) \['bogus'\]"):
        ApexConfig.from_dict({"bogus": 1})


def test_every_field_is_documented():
    docs = field_help(ApexConfig)
    missing = [f.name for f in dataclasses.fields(ApexConfig) if not docs.get(f.name)]
    assert missing == []


@pytest.mark.parametrize("env_id, message", [
    ("NoSuchEnv-v0", "is not a registered gymnasium environment"),
    ("MountainCarContinuous-v0", "Discrete action space"),
])
def test_apex_refuses_bad_environments_before_starting_ray(env_id, message):
    import ray

    with pytest.raises(ValueError, match=message):
        ApeX(ApexConfig(env_id=env_id))
    assert not ray.is_initialized()


def test_cli_help_documents_every_option():
    text = build_parser().format_help()
    for f in dataclasses.fields(ApexConfig):
        assert f"--{f.name.replace('_', '-')}" in text
    assert "--env " in text and "Ape-X exploration" in text


def test_cli_parses_types():
    config = config_from_args(
        ["--env", "Acrobot-v1", "--num-actors", "4", "--hidden-sizes", "64", "32",
         "--target-return", "none", "--dueling", "false", "--actor-cpus", "0.5"])
    assert (config.env_id, config.num_actors, config.hidden_sizes) == ("Acrobot-v1", 4, (64, 32))
    assert config.target_return is None and config.dueling is False and config.actor_cpus == 0.5
    assert config.hold_learner_within is None
    for given, held in [(["100", "400.5"], (100.0, 400.5)), (["none"], None)]:
        assert config_from_args(["--hold-learner-within", *given]).hold_learner_within == held
    assert ApexConfig(hold_learner_within=[1, 2]).hold_learner_within == (1, 2)  # from JSON


def test_cli_refuses_bad_values_with_a_clear_message(capsys):
    assert main(["--num-actors", "-2"]) == 2
    assert "ApexConfig.num_actors=-2 is invalid" in capsys.readouterr().err
    assert main(["--env", "Pendulum-v1"]) == 2
    assert "Discrete action space" in capsys.readouterr().err


def test_cli_help_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "distrl.apex.train", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--samples-per-insert" in out and "usage: python -m distrl.apex.train" in out


@pytest.mark.parametrize("changes, message", [
    ({"replay_shards": 0}, "replay_shards=0"),
    ({"replay_shards": 3, "num_actors": 2}, "an integer from 1 to num_actors=2"),
    ({"replay_shards": 2, "replay_capacity": 600, "batch_size": 512, "min_replay_size": 600},
     "a shard must hold a batch"),
])
def test_replay_shards_are_checked(changes, message):
    with pytest.raises(ValueError, match=message):
        ApexConfig(**changes)


def test_a_preset_gives_its_settings_and_options_beside_it_override_them(tmp_path, capsys):
    """--preset pong: the Pong settings GKE's Pong workload runs (its RayJob passes the same
    preset), valid as they are; an option given beside it wins; a resume keeps its
    checkpoint's settings, so a preset with --resume is refused, as is an unknown name."""
    from distrl.gke.settings import WORKLOADS
    from distrl.rl.config import PRESETS

    pong = config_from_args(["--preset", "pong"])
    assert pong == ApexConfig(**PRESETS["pong"])
    assert (pong.env_id, pong.batch_size, pong.replay_capacity) == ("ALE/Pong-v5", 512, None)
    assert WORKLOADS["pong"].env_id == pong.env_id
    assert WORKLOADS["pong"].train_args == ("--preset", "pong")
    smaller = config_from_args(["--batch-size", "64", "--preset", "pong"])
    assert smaller.batch_size == 64 and smaller.hidden_sizes == (512,)
    with pytest.raises(ValueError, match="--preset pong with --resume"):
        config_from_args(["--preset", "pong", "--resume", "auto", "--output-dir", str(tmp_path)])
    with pytest.raises(SystemExit):
        config_from_args(["--preset", "breakout"])
    assert re.search(r"invalid choice: 'breakout' \(choose from '?pong'?\)", capsys.readouterr().err)
