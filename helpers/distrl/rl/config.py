"""Every Ape-X hyperparameter in one validated dataclass.

Each field carries a one-line docstring; `distrl.field_docs.field_help` reads them, so the
command line's `--help` and this file never disagree.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ApexConfig:
    """Ape-X DQN settings. Defaults are tuned for CartPole-v1 on a 2-core laptop."""

    # --- environment and seeding ---
    env_id: str = "CartPole-v1"
    """gymnasium environment id: Box observations and a Discrete action space"""
    seed: int = 0
    """seed for environments, exploration, network initialisation and replay sampling"""

    # --- actors ---
    num_actors: int = 2
    """actor processes collecting experience"""
    envs_per_actor: int = 32
    """vectorised environments stepped together by each actor (one numpy forward pass per step)"""
    epsilon_base: float = 0.4
    """Ape-X exploration: slot i of N explores with epsilon_base ** (1 + epsilon_alpha * i / (N - 1))"""
    epsilon_alpha: float = 7.0
    """Ape-X exploration exponent spread (the paper uses 7)"""
    per_slot_epsilon: bool = True
    """give every environment slot its own epsilon (N = actors x envs); False: one epsilon per actor"""
    actor_block_steps: int = 16
    """vectorised steps an actor collects before it sends one block of transitions to replay"""
    weight_sync_period: int = 400
    """environment steps (per slot) between an actor's pulls of fresh learner weights"""
    actor_cpus: float | None = None
    """CPUs Ray reserves per actor process; None shares what the learner leaves on the cluster"""

    # --- n-step returns ---
    n_step: int = 3
    """n of the n-step return folded on the actors"""
    gamma: float = 0.99
    """discount factor"""

    # --- prioritized replay ---
    replay_capacity: int | None = 100_000
    """transitions kept in the replay ring buffer (split evenly over the replay shards); None:
    as many as fit in half the replay node's available memory, at most 2 million (Ape-X's size)"""
    replay_shards: int = 1
    """replay processes; actors fill them round-robin, the learner samples by priority mass"""
    priority_alpha: float = 0.6
    """priority exponent: P(i) is proportional to (|delta_i| + priority_eps) ** priority_alpha"""
    priority_beta: float = 0.4
    """importance-sampling exponent at the start of training"""
    priority_beta_final: float = 0.4
    """importance-sampling exponent reached at beta_anneal_updates (equal to priority_beta: no annealing)"""
    beta_anneal_updates: int = 10_000
    """learner updates over which beta moves linearly from priority_beta to priority_beta_final"""
    priority_eps: float = 1e-3
    """added to |delta| so that no transition gets zero priority"""
    min_replay_size: int = 2_000
    """transitions in replay before the learner samples its first batch"""
    samples_per_insert: float = 8.0
    """rate limiter target: transitions sampled by the learner per transition inserted (0 disables it)"""
    samples_per_insert_tolerance: float = 0.5
    """how far (as a fraction of samples_per_insert) the live ratio may drift before one side waits"""

    # --- learner ---
    # The four learner settings below were chosen with `python benchmarks/sweep.py`, one setting
    # changed at a time around the defaults; no single change solved CartPole-v1 sooner. Each
    # round is in benchmarks/results/sweep_cartpole.json, and benchmarks/results/config_tuning.md
    # has the figures behind each default below.
    # 128: at the same samples per insert a smaller batch lets the actors insert less per update:
    # fresher, less redundant data, and cheaper updates.
    batch_size: int = 128
    """transitions per learner update"""
    # 4e-3: fewer updates to solve than 1e-3 and 2e-3; 8e-3 did no better beyond the seed-to-seed
    # spread.
    learning_rate: float = 4e-3
    """Adam learning rate"""
    adam_epsilon: float = 1e-7
    """Adam epsilon"""
    max_grad_norm: float = 40.0
    """gradients are clipped to this global norm"""
    target_update_period: int = 50
    """learner updates between copies of the online network into the target network"""
    # (64, 64): the wider networks did not solve sooner (a wider one may need fewer env steps, but
    # each update costs more), and this one is the cheapest.
    hidden_sizes: tuple[int, ...] = (64, 64)
    """units of the fully connected hidden layers of the Q-network"""
    dueling: bool = True
    """dueling head: Q = V + A - mean(A)"""
    torso: str = "auto"
    """image observations: convolutions before the hidden layers, "small" (one 3x3, for grids
    such as MinAtar's 10x10), "nature" (the Nature DQN's three, for 84x84 frames) or "auto"
    (small below 36 pixels a side, else nature)"""
    huber_delta: float = 1.0
    """Huber loss threshold"""
    weight_publish_period: int = 25
    """learner updates between publications of a new weights version for the actors"""
    # 8: one replay round trip and one XLA call per 8 updates; 4 and 16 solved no sooner.
    batches_per_fetch: int = 8
    """batches the learner fetches from replay per request, and priority updates per reply"""
    fetches_in_flight: int = 1
    """requests the learner keeps out to each replay shard: they sample while it trains"""
    num_gpus: float = 0.0
    """GPUs for the learner (0: CPU)"""
    learner_cpus: float = 1.0
    """CPUs Ray reserves for the learner"""
    # XLA fuses the dense network's many small ops, at the cost of compiling before the first
    # update (xla_cache keeps it for later starts). On a CPU it makes convolutions far slower.
    # `python benchmarks/learner_throughput.py [--env ALE/Pong-v5]` measures both
    # (benchmarks/results/learner_throughput*.txt).
    jit_compile: bool | None = None
    """compile the train steps with XLA (None: yes, except for convolutions on a CPU)"""
    xla_cache: bool = True
    """keep XLA's compiled train steps on disk for the next start (in ~/.cache/distrl/xla)"""

    # --- evaluation and stopping ---
    target_return: float | None = 475.0
    """stop when the greedy evaluation's mean return reaches this (None: never)"""
    eval_episodes: int = 10
    """greedy episodes per evaluation (Atari: epsilon 0.05, actor.eval_epsilon), run as vectorised
    environments"""
    eval_interval_s: float = 1.0
    """seconds between evaluations"""
    # 30: three times eval_episodes, so the kept policy's score has 1/sqrt(3) of the standard
    # error of the evaluation that made it a candidate (a maximum over many noisy ones).
    best_eval_episodes: int = 30
    """new greedy episodes on which the weights of an evaluation that beats the kept best policy
    are played again; they are kept (checkpoint_dir/best.npz) if that mean beats the kept one's
    (0: keep no best policy)"""
    max_env_steps: int | None = None
    """stop after this many environment steps (None: no limit)"""
    max_learner_updates: int | None = None
    """stop after this many learner updates (None: no limit)"""
    hold_learner_within: tuple[float, float] | None = None
    """(low, high): from its start, the learner pauses every 50 updates while its
    weights are evaluated on the first evaluation's episodes, and holds them until the run
    stops once they score within [low, high); weights scoring above it first end the search
    (None: never; apex/hold.py). A run to be stopped mid-learning, as notebook 04's drain is,
    on evidence rather than at a count of updates"""
    learn_after_recovery: bool = False
    """learning starts once every actor runs steadily again after a lost one's restart, or at
    min_replay_size if that comes first: a run whose story is a node loss (notebook 04) shows
    the actors' own dip and recovery before the learner shares their cores"""
    max_seconds: float | None = 600.0
    """stop after this many seconds of training (None: no limit)"""

    # --- telemetry ---
    telemetry: bool = False
    """export OpenTelemetry metrics and traces (OTLP: gRPC, or HTTP with
    OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf) from every process of the run"""
    otlp_endpoint: str | None = None
    """OTLP endpoint (None: OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4317)"""
    otlp_token_file: str | None = None
    """a file holding the bearer token the endpoint asks for (the local collector's
    token_file); None: none, or OTEL_EXPORTER_OTLP_HEADERS"""
    metric_export_interval_s: float | None = None
    """seconds between metric exports (None: OTEL_METRIC_EXPORT_INTERVAL, else 10 s)"""
    run_id: str | None = None
    """rl.run.id on every metric point and span (None: a new id per run)"""
    peak_flops: float | None = None
    """the learner device's peak FLOP/s for rl.train.mfu (None: the table in distrl.otel.conventions)"""

    # --- outputs ---
    output_dir: str | None = None
    """where results.json, TensorBoard logs and checkpoints go (None: runs/<env>-<time>)"""
    checkpoint_interval_s: float = 30.0
    """seconds between learner checkpoints (one is always written at the end, and one on SIGTERM)"""
    checkpoint_dir: str | None = None
    """checkpoint directory or URI, e.g. gs://bucket/run/checkpoints (None: output_dir/checkpoints)"""
    checkpoint_replay_mb: float = 64.0
    """MB of replay each checkpoint keeps (an even sample of all shards; 0: none): a resume
    trains on it beside new play"""
    resume: str | None = None
    """continue from a checkpoint: 'auto' (newest in checkpoint_dir), a directory, or one .npz;
    the run's first evaluation is of the checkpoint's own weights"""
    max_actor_restarts: int = -1
    """times Ray restarts a lost actor process, e.g. on a preempted node (-1: always; 0: never)"""
    resource_timeout_s: float = 10.0
    """seconds to wait for a node offering what none has yet (a GPU; fixed cluster: CPUs)"""
    autoscaling: bool | None = None
    """nodes join on demand (an autoscaler): actors wait for CPUs, not refused (None: ask Ray's record)"""
    actor_wait_s: float = 300.0
    """seconds with no actor running (all waiting for a node) before the run ends as 'no_actors'"""
    learner_wait_s: float = 300.0
    """seconds the learner may take to run (a node for it, then its TensorFlow start-up) before
    the run ends as 'no_learner'"""
    progress: bool = True
    """show a progress bar"""

    def __post_init__(self) -> None:
        # Coerce list → tuple so configs from JSON / argparse compare equal and stay hashable.
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        if isinstance(self.hold_learner_within, list):
            object.__setattr__(self, "hold_learner_within", tuple(self.hold_learner_within))
        _validate(self)

    @property
    def num_slots(self) -> int:
        """Exploration slots: one per environment with per_slot_epsilon, else one per actor."""
        return self.num_actors * (self.envs_per_actor if self.per_slot_epsilon else 1)

    def replace(self, **changes) -> ApexConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> ApexConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ApexConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**values)


def _check(ok: bool, name: str, value, accepted: str) -> None:
    if not ok:
        raise ValueError(f"ApexConfig.{name}={value!r} is invalid: expected {accepted}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _rule(ok, accepted: str) -> tuple:
    return ok, accepted


_POSITIVE_INT = _rule(lambda v: _is_int(v) and v >= 1, "an integer >= 1")
_POSITIVE_NUM = _rule(lambda v: _is_num(v) and v > 0, "a number > 0")
_UNIT = _rule(lambda v: _is_num(v) and 0.0 <= v <= 1.0, "a number in [0, 1]")
_BOOL = _rule(lambda v: isinstance(v, bool), "True or False")
_OPTIONAL_INT = _rule(lambda v: v is None or (_is_int(v) and v >= 1), "None or an integer >= 1")
_OPTIONAL_PATH = _rule(lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
                       "None or a non-empty path or URI")

# What each field accepts, one rule a field: a table reads better than a function here.
FIELD_RULES: dict[str, tuple] = {
    "env_id": _rule(lambda v: isinstance(v, str) and v.strip() != "",
                    "a non-empty gymnasium environment id such as 'CartPole-v1'"),
    "seed": _rule(lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "best_eval_episodes": _rule(lambda v: _is_int(v) and v >= 0,
                                "an integer >= 0 (0: keep no best policy)"),
    **dict.fromkeys(["num_actors", "envs_per_actor", "actor_block_steps", "weight_sync_period",
                     "n_step", "batch_size", "target_update_period", "weight_publish_period",
                     "batches_per_fetch", "fetches_in_flight", "eval_episodes",
                     "beta_anneal_updates"],
                    _POSITIVE_INT),
    "replay_capacity": _rule(lambda v: v is None or _is_int(v) and v >= 1,
                             "an integer >= 1, or None (as many as fit in the replay node's "
                             "memory)"),
    **dict.fromkeys(["priority_alpha", "priority_beta", "priority_beta_final", "epsilon_base"],
                    _UNIT),
    "gamma": _rule(lambda v: _is_num(v) and 0.0 <= v < 1.0, "a number in [0, 1)"),
    "epsilon_alpha": _rule(lambda v: _is_num(v) and v >= 0, "a number >= 0"),
    **dict.fromkeys(["priority_eps", "learning_rate", "adam_epsilon", "max_grad_norm",
                     "huber_delta", "eval_interval_s", "checkpoint_interval_s",
                     "samples_per_insert_tolerance", "learner_cpus"], _POSITIVE_NUM),
    "checkpoint_replay_mb": _rule(lambda v: _is_num(v) and v >= 0,
                                  "a number of MB >= 0 (0: checkpoints keep no replay)"),
    "samples_per_insert": _rule(lambda v: _is_num(v) and v >= 0,
                                "a number >= 0 (0 disables the rate limiter)"),
    "num_gpus": _rule(lambda v: _is_num(v) and v >= 0, "a number >= 0"),
    "actor_cpus": _rule(lambda v: v is None or (_is_num(v) and v > 0), "None or a number > 0"),
    "resource_timeout_s": _rule(lambda v: _is_num(v) and v >= 0, "a number >= 0"),
    **dict.fromkeys(["actor_wait_s", "learner_wait_s"],
                    _rule(lambda v: _is_num(v) and v > 0, "a number of seconds > 0")),
    "autoscaling": _rule(lambda v: v is None or isinstance(v, bool),
                         "None (detect), True or False"),
    "hidden_sizes": _rule(lambda v: len(v) >= 1 and all(_is_int(h) and h >= 1 for h in v),
                          "one or more integers >= 1, e.g. (128, 128)"),
    "torso": _rule(lambda v: v in ("auto", "small", "nature"), "auto, small or nature"),
    "target_return": _rule(lambda v: v is None or _is_num(v), "None or a finite number"),
    **dict.fromkeys(["max_env_steps", "max_learner_updates"], _OPTIONAL_INT),
    "hold_learner_within": _rule(lambda v: v is None or (
        isinstance(v, tuple) and len(v) == 2 and all(_is_num(x) for x in v) and v[0] < v[1]),
        "None or two numbers (low, high) with low < high, e.g. (100, 400)"),
    "max_seconds": _rule(lambda v: v is None or (_is_num(v) and v > 0), "None or a number > 0"),
    "output_dir": _rule(lambda v: v is None or (isinstance(v, str) and v != ""),
                        "None or a non-empty path"),
    **dict.fromkeys(["checkpoint_dir", "resume", "otlp_token_file"], _OPTIONAL_PATH),
    "max_actor_restarts": _rule(lambda v: _is_int(v) and v >= -1,
                                "an integer >= -1 (-1: always restart)"),
    "otlp_endpoint": _rule(lambda v: v is None or (isinstance(v, str)
                                                   and v.startswith(("http://", "https://"))),
                           "None or http://host:port (https:// for TLS)"),
    "metric_export_interval_s": _rule(lambda v: v is None or (_is_num(v) and v > 0),
                                      "None or a number > 0"),
    "run_id": _rule(lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
                    "None or a non-empty string"),
    "peak_flops": _rule(lambda v: v is None or (_is_num(v) and v > 0), "None or a number > 0"),
    **dict.fromkeys(["dueling", "per_slot_epsilon", "xla_cache", "progress", "telemetry",
                     "learn_after_recovery"],
                    _BOOL),
    "jit_compile": _rule(lambda v: v is None or isinstance(v, bool),
                         "True, False or None (XLA except for convolutions on a CPU)"),
}


def _validate(c: ApexConfig) -> None:
    for name, (ok, accepted) in FIELD_RULES.items():
        value = getattr(c, name)
        try:
            valid = ok(value)
        except TypeError:  # e.g. len() of a number given as hidden_sizes
            valid = False
        _check(valid, name, value, accepted)
    _check_replay_sizes(c)


def _check_replay_sizes(c: ApexConfig) -> None:
    """The rules between fields: what the replay (and each of its shards) must hold."""
    # None is sized on the replay's node; the replay checks the sizes below against it there.
    capacity = c.replay_capacity or 2**62
    _check(_is_int(c.min_replay_size) and 1 <= c.min_replay_size <= capacity,
           "min_replay_size", c.min_replay_size,
           f"an integer in [1, replay_capacity={c.replay_capacity}]")
    _check(c.batch_size <= capacity, "batch_size", c.batch_size,
           f"at most replay_capacity={c.replay_capacity}")
    _check(_is_int(c.replay_shards) and 1 <= c.replay_shards <= c.num_actors, "replay_shards",
           c.replay_shards, f"an integer from 1 to num_actors={c.num_actors} (each shard needs "
           "an actor filling it)")
    _check(capacity // c.replay_shards >= c.batch_size, "replay_shards", c.replay_shards,
           f"at most replay_capacity // batch_size = {capacity // c.batch_size} (a shard must "
           "hold a batch)")


# Settings that suit one environment, by name: `python -m distrl.apex.train --preset pong`
# (options given beside it override them) and GKE's Pong workload (gke.settings.WORKLOADS,
# whose comments say where each figure comes from).
PRESETS: dict[str, dict] = {
    "pong": {
        "env_id": "ALE/Pong-v5",
        "target_return": 20.0,            # Pong's scores run from -21 to 21
        "hidden_sizes": (512,),           # the Nature DQN's dense layer after its convolutions
        "batch_size": 512, "batches_per_fetch": 1,
        "learning_rate": 1e-4,            # Adam (JORLDY's Ape-X: centred RMSProp, 0.00025 / 4)
        "target_update_period": 2500,
        "samples_per_insert": 0.0,        # no rate limiter: the learner takes what it can
        "min_replay_size": 50_000,
        "replay_capacity": None,          # as many as the replay's memory holds, at most 2 M
        "replay_shards": 2,               # 150 updates/s on the head (learner_feed.py)
        "fetches_in_flight": 2,           # a shard samples while a batch travels
        "envs_per_actor": 16,             # 8 or 16: the same rate (actor_throughput.py)
        "actor_block_steps": 200,         # 3.5% of planes sent twice (benchmarks/replay_memory.py)
        "eval_episodes": 4, "eval_interval_s": 60.0,
        "best_eval_episodes": 8,          # minutes of play on the head's CPU, not seconds
        "checkpoint_interval_s": 300.0,
    },
}


__all__ = ["PRESETS", "ApexConfig"]
