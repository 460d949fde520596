"""Ape-X on Ray: replay, learner, actors and a greedy evaluator as Ray actors.

    result = ApeX(ApexConfig(env_id="CartPole-v1", num_actors=2)).train()

The data flows (none of them through the driver):

    actors --blocks of n-step transitions + priorities--> replay
    replay --prioritized batches (prefetched)-----------> learner
    learner --new priorities----------------------------> replay
    learner --versioned weights (pulled)----------------> actors, evaluator

The driver only starts everything, polls small stats dicts, asks for greedy evaluations,
decides when to stop, and writes results.json.

Faults: a lost actor (its process or its node) is restarted by Ray and its loop re-issued; the
run goes on with fewer actors meanwhile. SIGTERM anywhere makes the learner checkpoint at once.
A lost learner or replay ends the run; `resume="auto"` continues from the newest checkpoint.
With replay_shards > 1 several replay processes share the work (see ReplayShards).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from distrl import telemetry as otel
from distrl.actor import Actor, env_spec, evaluate_greedy, slot_epsilons
from distrl.config import ApexConfig
from distrl.network import NetworkSpec, init_weights
from distrl.replay import ReplayService, SampledBatch

POLL_INTERVAL_S = 0.25


@dataclass
class TrainingResult:
    """What a run achieved; saved as results.json in the run's output directory."""

    env_id: str
    reached_target: bool
    target_return: float | None
    time_to_target_s: float | None
    wall_time_s: float
    startup_s: float
    env_steps: int
    learner_updates: int
    transitions_inserted: int
    transitions_sampled: int
    env_steps_per_s: float
    learner_updates_per_s: float
    samples_per_insert: float
    final_eval_return: float | None
    best_eval_return: float | None
    stop_reason: str
    evals: list[dict] = field(default_factory=list)
    actor_epsilons: list[list[float]] = field(default_factory=list)
    actor_weights_versions: list[int | None] = field(default_factory=list)
    actor_restarts: list[int] = field(default_factory=list)
    actor_nodes: list[str | None] = field(default_factory=list)
    cpu_seconds: dict = field(default_factory=dict)
    throughput: list[dict] = field(default_factory=list)
    output_dir: str = ""
    checkpoint: str | None = None
    events: list[dict] = field(default_factory=list)
    resumed_from: str | None = None
    replay_check: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    weights: list[np.ndarray] | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("weights")
        return out

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> TrainingResult:
        return cls(**json.loads(Path(path).read_text()))


# --------------------------------------------------------------------------- Ray actors


class ProcessTelemetry:
    """The telemetry of one Ape-X process; every method is a cheap no-op when it is off.

    Traces: the driver opens one `rl.loop` span per iteration and hands its context to every
    worker with the next stats() call; each worker then traces its next unit of work (one
    block, one learner fetch) under it, so one trace shows the iteration across processes.
    """

    def __init__(self, config: ApexConfig, role: str, index: int | None = None):
        self.enabled = config.telemetry
        self.role = role if index is None else f"{role}-{index}"
        self._carrier: dict | None = None
        if not self.enabled:
            return
        interval = (None if config.metric_export_interval_s is None
                    else int(config.metric_export_interval_s * 1000))
        self.telemetry = otel.setup_telemetry(
            instance_id=f"{self.role}-{os.getpid()}@{socket.gethostname()}",
            endpoint=config.otlp_endpoint, export_interval_ms=interval,
            resource_attributes={"service.component": role})
        self.tracer = self.telemetry.tracer
        self.rl = otel.RLInstruments(self.telemetry.meter, otel.common_attributes(
            run_id=config.run_id or "unset", algorithm="apex-dqn", environment=config.env_id,
            model=model_name(config)))
        self.attrs = self.rl.attrs({otel.RL_LOOP: role})

    def set_carrier(self, carrier: dict | None) -> None:
        if carrier:
            self._carrier = carrier

    def take_carrier(self) -> dict | None:
        """The driver's current iteration context, once: only one unit per iteration is traced."""
        carrier, self._carrier = self._carrier, None
        return carrier

    def span(self, name: str, carrier: dict | None, attributes: dict | None = None,
             start_time_ns: int | None = None):
        """A span under `carrier` when one is given (a traced unit), else nothing."""
        if not self.enabled or carrier is None:
            return contextlib.nullcontext(None)
        return otel.span(self.tracer, name, carrier, {**self.attrs, **(attributes or {})},
                         start_time_ns)

    def shutdown(self) -> None:
        if self.enabled:
            self.telemetry.shutdown(timeout_s=3.0)


def model_name(config: ApexConfig) -> str:
    head = "dueling-" if config.dueling else ""
    return f"{head}mlp-{'x'.join(map(str, config.hidden_sizes))}"


def _on_sigterm(action) -> None:
    """Run action() on SIGTERM (a Spot notice, a pod deletion), then end the process as SIGTERM
    would. Ray's own handler cannot be chained to here: raised from a signal handler while the
    worker's main thread waits in Ray's C++ loop, its SystemExit never ends the process.
    Call from the process's main thread (a Ray actor's __init__ runs there)."""
    import signal

    def handler(signum, frame):
        try:
            action()
        finally:
            os._exit(128 + signal.SIGTERM)

    with contextlib.suppress(ValueError):  # not the main thread: no handler, nothing breaks
        signal.signal(signal.SIGTERM, handler)


def _ask_learner_to_checkpoint(get_learner, role: str):
    def action():
        learner = get_learner()
        if learner is not None:
            import ray

            ray.get(learner.checkpoint_now.remote(f"SIGTERM to the {role}"), timeout=20)
    return action


def _carrier_of(current_span) -> dict | None:
    if current_span is None:
        return None
    from opentelemetry import trace

    return otel.inject_context(trace.set_span_in_context(current_span))


class ReplayWorker(ReplayService):
    """The replay process: ReplayService plus telemetry of what it serves."""

    def __init__(self, config: ApexConfig, obs_shape, error_buffer: float):
        super().__init__(config.replay_capacity, obs_shape, alpha=config.priority_alpha,
                         eps=config.priority_eps, samples_per_insert=config.samples_per_insert,
                         min_size=config.min_replay_size, error_buffer=error_buffer,
                         seed=config.seed)
        self.tel = ProcessTelemetry(config, "replay")
        self.learner = None
        _on_sigterm(_ask_learner_to_checkpoint(lambda: self.learner, "replay"))
        if self.tel.enabled:
            rl = self.tel.rl
            self._sample_attrs = rl.attrs({otel.RL_LOOP: "replay", otel.RL_SAMPLE: "replay"})
            self._sync_attrs = rl.attrs({otel.RL_LOOP: "replay", otel.RL_SYNC_SOURCE: "learner",
                                         otel.RL_SYNC_DESTINATION: "replay"})

    def add(self, block, timeout: float | None = 1.0, trace_carrier: dict | None = None) -> bool:
        with self.tel.span("replay.insert", trace_carrier, {otel.RL_SAMPLE_BATCH_SIZE: len(block)}):
            return super().add(block, timeout)

    def sample(self, batch_size: int, beta: float, timeout: float | None = 1.0,
               num_batches: int = 1, trace_carrier: dict | None = None):
        start = time.perf_counter()
        with self.tel.span("replay.sample", trace_carrier,
                           {otel.RL_SAMPLE_BATCH_SIZE: batch_size * num_batches}):
            batches = super().sample(batch_size, beta, timeout, num_batches)
        if self.tel.enabled and batches is not None:
            self.tel.rl.duration("rl.sample.duration", (time.perf_counter() - start) * 1e3,
                                 self._sample_attrs)
        return batches

    def update_priorities(self, keys, td_abs, trace_carrier: dict | None = None) -> int:
        start = time.perf_counter()
        size = int(np.asarray(keys).nbytes + np.asarray(td_abs).nbytes)
        with self.tel.span(otel.SPAN_SYNC, trace_carrier, {
                otel.RL_SYNC_BYTES: size, otel.RL_SYNC_SOURCE: "learner",
                otel.RL_SYNC_DESTINATION: "replay"}):
            live = super().update_priorities(keys, td_abs)
        if self.tel.enabled:
            self.tel.rl.duration("rl.sync.duration", (time.perf_counter() - start) * 1e3,
                                 self._sync_attrs)
        return live

    def set_learner(self, learner) -> None:
        """The learner to ask for a checkpoint when this process gets SIGTERM."""
        self.learner = learner

    def sample_with_total(self, batch_size: int, beta: float, timeout: float | None = 1.0,
                          num_batches: int = 1, trace_carrier: dict | None = None):
        """sample() plus this shard's priority mass, which decides the learner's next draws."""
        batches = self.sample(batch_size, beta, timeout, num_batches, trace_carrier)
        with self._lock:
            return batches, self.replay.tree.total

    def stats(self) -> dict:
        return {**super().stats(), "cpu_s": time.process_time()}

    def close(self) -> None:
        super().close()
        self.tel.shutdown()


class ReplayShards:
    """The learner's view of one or more replay processes.

    Each batch comes whole from one shard, drawn with probability proportional to the shard's
    priority mass, then proportionally within it: every transition is sampled with probability
    p_i / (sum over all shards), as from one replay. Importance weights, normalised by the
    batch's largest (Ape-X), need no global counts: (N p_i / T) ** -beta / max_j (...) depends
    on the p's of the batch only. Keys carry their shard (key * shards + shard), so priorities
    go back where their transitions live.
    """

    def __init__(self, shards: list, seed: int = 0):
        self.shards = list(shards)
        self.totals = np.ones(len(self.shards))
        self.rng = np.random.default_rng(seed)

    def request(self, batch_size: int, beta: float, num_batches: int,
                trace_carrier: dict | None = None) -> list[tuple[int, object]]:
        n = len(self.shards)
        mass = self.totals.sum()
        p = self.totals / mass if mass > 0 else np.full(n, 1.0 / n)
        counts = self.rng.multinomial(num_batches, p) if n > 1 else [num_batches]
        return [(s, self.shards[s].sample_with_total.remote(
                    batch_size, beta, num_batches=int(k), trace_carrier=trace_carrier))
                for s, k in enumerate(counts) if k]

    def collect(self, pending: list[tuple[int, object]]) -> list | None:
        """The batches that arrived (a shard held back by its rate limiter sends none)."""
        n, batches = len(self.shards), []
        for s, ref in pending:
            got, total = _get(ref)
            self.totals[s] = total
            for b in got or []:
                batches.append(b if n == 1 else SampledBatch(
                    b.transitions, b.keys * n + s, b.weights, b.probabilities))
        return batches or None

    def update_priorities(self, keys: np.ndarray, td_abs: np.ndarray,
                          trace_carrier: dict | None = None) -> list:
        n = len(self.shards)
        if n == 1:
            return [self.shards[0].update_priorities.remote(keys, td_abs,
                                                            trace_carrier=trace_carrier)]
        shard, local = keys % n, keys // n
        return [self.shards[s].update_priorities.remote(local[mine], td_abs[mine],
                                                        trace_carrier=trace_carrier)
                for s in range(n) if (mine := shard == s).any()]


class LearnerWorker:
    """The learner's process: pulls batches from replay itself and trains in a loop thread."""

    def __init__(self, config: ApexConfig, spec: NetworkSpec, weights, replays: list,
                 output_dir: str, checkpoint_dir: str, resume_path: str | None = None):
        from distrl.learner import Learner, configure_tensorflow

        self.gpus = configure_tensorflow(num_threads=max(1, int(config.learner_cpus)))
        if config.num_gpus > 0 and not self.gpus:
            raise RuntimeError(
                f"num_gpus={config.num_gpus}: Ray gave the learner a GPU "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}) but TensorFlow "
                "sees none; install a CUDA build of TensorFlow on that node or use num_gpus=0")
        import tensorflow as tf

        self.config = config
        self.replay = ReplayShards(replays, config.seed)
        self.learner = Learner(config, spec, weights)
        if resume_path is not None:  # weights, target network, optimizer, update counter
            self.learner.restore_checkpoint(resume_path)
            weights = self.learner.get_weights()
        self.output_dir = Path(output_dir)
        self.checkpoint_dir = checkpoint_dir
        self.progress: dict = {}  # the driver's counters, saved with each checkpoint
        self.events: list[dict] = []
        self._update_lock = threading.Lock()  # a checkpoint never sees half an update
        self.writer = tf.summary.create_file_writer(str(self.output_dir / "tensorboard"))
        self._lock = threading.Lock()
        self._published = (self.learner.updates, weights)
        self._stop = threading.Event()
        self._stats = {"updates": 0, "loss": float("nan"), "mean_q": float("nan"),
                       "wait_s": 0.0, "train_s": 0.0}
        self.checkpoint: str | None = None
        _on_sigterm(lambda: self.checkpoint_now("SIGTERM to the learner"))
        self.tel = ProcessTelemetry(config, "learner")
        if self.tel.enabled:
            self._publish_attrs = self.tel.rl.attrs({
                otel.RL_LOOP: "learner", otel.RL_SYNC_SOURCE: "learner", otel.RL_SYNC_DESTINATION: "actors"})
            # One update: three forward passes (online and target on s', online on s) and a
            # backward pass (about two forward passes) over the batch.
            self.flops_per_update = 5 * spec.forward_flops(config.batch_size)
            self.peak_flops = config.peak_flops or otel.peak_flops_for(self._gpu_names(),
                                                                  config.learner_cpus)

    def _gpu_names(self) -> list[str]:
        import tensorflow as tf

        names = []
        for gpu in tf.config.list_physical_devices("GPU"):
            details = tf.config.experimental.get_device_details(gpu)
            names.append(details.get("device_name", gpu.name))
        return names

    def run(self) -> dict:
        """Train until stop() or max_learner_updates; returns the final stats."""
        import tensorflow as tf

        c, tel = self.config, self.tel
        learner = self.learner
        fetch = c.batches_per_fetch
        next_batches = self.replay.request(c.batch_size, learner.beta(), fetch)
        priority_refs: deque = deque()
        last_checkpoint = time.monotonic()
        while not self._stop.is_set():
            t0 = time.monotonic()
            batches = self.replay.collect(next_batches)
            carrier = tel.take_carrier() if batches is not None else None
            t1 = time.monotonic()
            if batches is None:  # rate limiter or replay warm-up: ask again
                next_batches = self.replay.request(c.batch_size, learner.beta(), fetch)
                with self._lock:
                    self._stats["wait_s"] += t1 - t0
                continue
            with tel.span(otel.SPAN_TRAIN, carrier, {otel.RL_TRAIN_STEPS: len(batches),
                                                otel.RL_TRAIN_BATCH_SIZE: c.batch_size}) as train_span:
                child = _carrier_of(train_span)
                # Prefetch: replay prepares the next batches while these train.
                next_batches = self.replay.request(c.batch_size, learner.beta(), fetch,
                                                   trace_carrier=child)
                keys, priorities = [], []
                for batch in batches:
                    u0 = time.perf_counter()
                    with self._update_lock:
                        loss, td_abs, diag = learner.update(batch)
                    if tel.enabled:
                        tel.rl.duration("rl.train.duration", (time.perf_counter() - u0) * 1e3,
                                        tel.attrs)
                    keys.append(batch.keys)
                    priorities.append(td_abs)
                    if learner.updates % c.weight_publish_period == 0:
                        self._publish()
                    if learner.updates % 100 == 0:
                        with self.writer.as_default(step=learner.updates):
                            tf.summary.scalar("learner/loss", loss)
                            tf.summary.scalar("learner/mean_q", diag["mean_q"])
                            tf.summary.scalar("learner/grad_norm", diag["grad_norm"])
                            tf.summary.scalar("learner/beta", learner.beta())
                priority_refs.extend(self.replay.update_priorities(
                    np.concatenate(keys), np.concatenate(priorities), trace_carrier=child))
            while len(priority_refs) > 2 * len(self.replay.shards):  # bound those in flight
                _get(priority_refs.popleft())
            t2 = time.monotonic()
            with self._lock:
                s = self._stats
                s.update(updates=learner.updates, loss=loss, mean_q=diag["mean_q"])
                s["wait_s"] += t1 - t0
                s["train_s"] += t2 - t1
            if tel.enabled:
                tel.rl.duration("rl.loop.duration", (t2 - t0) * 1e3, tel.attrs)
                tel.rl.add("rl.train.steps", len(batches), tel.attrs)
                tel.rl.set("rl.train.loss", loss, tel.attrs)
                tel.rl.set("rl.train.mfu", otel.mfu(self.flops_per_update, len(batches)
                                               / max(t2 - t0, 1e-9), self.peak_flops), tel.attrs)
            if time.monotonic() - last_checkpoint >= c.checkpoint_interval_s:
                self.save_checkpoint()
                last_checkpoint = time.monotonic()
            if c.max_learner_updates and learner.updates >= c.max_learner_updates:
                break
        for ref in priority_refs:
            _get(ref)
        self._publish()
        return self.stats()

    def _publish(self) -> None:
        """Make the current weights the version actors and the evaluator pull."""
        start = time.perf_counter()
        weights = self.learner.get_weights()
        with self._lock:
            self._published = (self.learner.updates, weights)
        if self.tel.enabled:
            self.tel.rl.duration("rl.sync.duration", (time.perf_counter() - start) * 1e3,
                                 self._publish_attrs)

    def save_checkpoint(self) -> str:
        from distrl.learner import write_checkpoint

        with self._update_lock:  # copy a whole state; write it while training goes on
            snapshot = self.learner.snapshot({"progress": dict(self.progress),
                                              "saved_at": time.time()})
        self.checkpoint = write_checkpoint(self.checkpoint_dir, snapshot)
        return self.checkpoint

    def checkpoint_now(self, reason: str) -> str:
        """A checkpoint at once (SIGTERM anywhere in the run: the Spot notice)."""
        path = self.save_checkpoint()
        self.events.append({"time": time.time(), "kind": "checkpoint", "detail": reason,
                            "checkpoint": path})
        return path

    def note_progress(self, progress: dict) -> None:
        """The driver's counters (env steps, ...) to store with the next checkpoint."""
        self.progress = progress

    def get_weights(self, have_version: int = -1):
        """(version, weights), or None when the caller already has the newest version."""
        with self._lock:
            version, weights = self._published
        return None if version == have_version else (version, weights)

    def stats(self, trace_carrier: dict | None = None) -> dict:
        self.tel.set_carrier(trace_carrier)
        with self._lock:
            return dict(self._stats, checkpoint=self.checkpoint, cpu_s=time.process_time(),
                        pid=os.getpid(), events=list(self.events))

    def log_scalars(self, scalars: dict, step: int) -> None:
        import tensorflow as tf

        with self.writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        self.writer.flush()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> str:
        """Write the final checkpoint, flush TensorBoard and telemetry."""
        path = self.save_checkpoint()
        self.writer.flush()
        self.tel.shutdown()
        return path


class ActorWorker:
    """One actor process: collects blocks, ships them to replay, pulls fresh weights."""

    def __init__(self, config: ApexConfig, index: int, replay, learner):
        self.config, self.replay, self.learner = config, replay, learner
        # The learner's newest weights: a restarted actor (a lost node, a killed process) picks
        # up where training is, and nothing large sits in the object store for restarts.
        version, weights = _get(learner.get_weights.remote(-1))
        self.actor = Actor(config, index, weights)
        self.actor.set_weights(weights, version)
        self.node_id = _node_id()  # where this life of the actor runs (a restart may move it)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self.blocks_sent = 0
        self.transitions_sent = 0
        self.tel = ProcessTelemetry(config, "actor", index)
        _on_sigterm(_ask_learner_to_checkpoint(lambda: self.learner, f"actor {index}"))
        if self.tel.enabled:
            rl = self.tel.rl
            self._sample_attrs = rl.attrs({otel.RL_LOOP: "actor", otel.RL_SAMPLE: "environment"})
            self._sync_attrs = rl.attrs({otel.RL_LOOP: "actor", otel.RL_SYNC_SOURCE: "learner",
                                         otel.RL_SYNC_DESTINATION: "actor"})

    def epsilons(self) -> list[float]:
        return self.actor.epsilons.tolist()

    def run(self) -> dict:
        c, actor, tel = self.config, self.actor, self.tel
        steps = c.actor_block_steps
        in_flight = None          # (block ref, add ref): one block travels while the next is made
        weights_request = None    # (ref, start time, trace carrier)
        steps_since_sync = 0
        sync_attrs = {otel.RL_SYNC_SOURCE: "learner", otel.RL_SYNC_DESTINATION: tel.role}
        traffic = _TrafficTally()
        while not self._stop.is_set():
            carrier = tel.take_carrier()
            t0 = time.perf_counter()
            with tel.span(otel.SPAN_SAMPLE, carrier, {otel.RL_SAMPLE_STEPS: steps,
                                                 otel.RL_SAMPLE_BATCH_SIZE: c.envs_per_actor}) as sample_span:
                actor.step(steps)
                if sample_span is not None:
                    sample_span.set_attribute(otel.RL_SAMPLE_EPISODES, len(actor.finished_returns))
            t1 = time.perf_counter()
            with tel.span(otel.SPAN_REWARD, carrier) as reward_span:
                block = actor.fold()
                if reward_span is not None:
                    reward_span.set_attribute(otel.RL_REWARD_BATCH_SIZE, len(block))
            t2 = time.perf_counter()
            steps_since_sync += steps
            if in_flight is not None:
                self._deliver(*in_flight)
            block_ref = _put(block)
            in_flight = (block_ref, self.replay.add.remote(
                block_ref, trace_carrier=_carrier_of(reward_span)), len(block))
            if weights_request is None and steps_since_sync >= c.weight_sync_period:
                weights_request = (self.learner.get_weights.remote(actor.weights_version),
                                   time.perf_counter(), carrier, time.time_ns())
                steps_since_sync = 0
            if weights_request is not None and _ready(weights_request[0]):
                ref, started, sync_carrier, started_ns = weights_request
                weights_request = None
                update = _get(ref)
                if update is not None:
                    actor.set_weights(update[1], update[0])
                if tel.enabled:
                    size = sum(w.nbytes for w in update[1]) if update is not None else 0
                    elapsed_ms = (time.perf_counter() - started) * 1e3
                    # From the request to the new weights in use (the pull is asynchronous).
                    with tel.span(otel.SPAN_SYNC, sync_carrier,
                                  {**sync_attrs, otel.RL_SYNC_BYTES: size}, started_ns):
                        pass
                    tel.rl.duration("rl.sync.duration", elapsed_ms, self._sync_attrs)
            returns, lengths = actor.pop_episode_stats()
            with self._lock:
                self._returns += returns
                self._lengths += lengths
            if tel.enabled:
                rl, attrs = tel.rl, self._sample_attrs
                rl.duration("rl.sample.duration", (t1 - t0) * 1e3, attrs)
                rl.duration("rl.step.duration", (t1 - t0) * 1e3 / steps, attrs)
                rl.duration("rl.reward.duration", (t2 - t1) * 1e3, attrs)
                rl.duration("rl.loop.duration", (time.perf_counter() - t0) * 1e3, attrs)
                traffic.add(steps * c.envs_per_actor, returns, lengths)
                if traffic.blocks >= TRAFFIC_FLUSH_BLOCKS:
                    traffic.flush(rl, attrs)
        if in_flight is not None:
            self._deliver(*in_flight)
        if tel.enabled:
            traffic.flush(tel.rl, self._sample_attrs)
        tel.shutdown()
        return self.stats()

    def _deliver(self, block_ref, add_ref, size: int) -> None:
        """Wait until replay accepted the block, resending it if the rate limiter timed out."""
        while not _get(add_ref):
            if self._stop.is_set():
                return  # replay is closing: the run is over
            add_ref = self.replay.add.remote(block_ref)
        self.blocks_sent += 1
        self.transitions_sent += size

    def stats(self, trace_carrier: dict | None = None) -> dict:
        self.tel.set_carrier(trace_carrier)
        with self._lock:
            returns, lengths = self._returns, self._lengths
            self._returns, self._lengths = [], []
        return {"env_steps": self.actor.env_steps, "weights_version": self.actor.weights_version,
                "transitions_sent": self.transitions_sent, "episode_returns": returns,
                "episode_lengths": lengths, "cpu_s": time.process_time(), "pid": os.getpid(),
                "node_id": self.node_id}

    def stop(self) -> None:
        self._stop.set()


# Each SDK call costs ~10 us; counters and gauges are summed over this many actor blocks
# (~40 ms) and recorded once, which halves the actor's telemetry cost. Latency histograms
# still get one observation per block.
TRAFFIC_FLUSH_BLOCKS = 8


class _TrafficTally:
    """An actor's env steps and finished episodes since its last flush to the instruments."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.blocks, self.samples = 0, 0
        self.returns: list[float] = []
        self.lengths: list[int] = []

    def add(self, samples: int, returns: list[float], lengths: list[int]) -> None:
        self.blocks += 1
        self.samples += samples
        self.returns += returns
        self.lengths += lengths

    def flush(self, rl, attrs: dict) -> None:
        if self.samples:
            rl.add("rl.sample.samples", self.samples, attrs)
        if self.returns:
            rl.add("rl.sample.episodes", len(self.returns), attrs)
            rl.set("rl.environment.reward.mean", float(np.mean(self.returns)), attrs)
            rl.set("rl.environment.episode.length.mean", float(np.mean(self.lengths)), attrs)
        self.reset()


class EvaluatorWorker:
    """Greedy (epsilon = 0) evaluation; its returns, not the actors', are the score."""

    def __init__(self, config: ApexConfig):
        self.config = config
        self.count = 0
        self.learner = None
        _on_sigterm(_ask_learner_to_checkpoint(lambda: self.learner, "evaluator"))
        self.tel = ProcessTelemetry(config, "evaluator")

    def set_learner(self, learner) -> None:
        """The learner to ask for a checkpoint when this process gets SIGTERM."""
        self.learner = learner

    def evaluate(self, versioned_weights) -> dict:
        version, weights = versioned_weights
        seed = self.config.seed + 10_000 * (self.count + 1)
        self.count += 1
        returns, lengths = evaluate_greedy(self.config.env_id, weights,
                                           self.config.eval_episodes, seed, self.config.dueling)
        if self.tel.enabled:
            self.tel.rl.set("rl.environment.reward.mean", float(returns.mean()), self.tel.attrs)
            self.tel.rl.set("rl.environment.episode.length.mean", float(lengths.mean()),
                            self.tel.attrs)
        return {"weights_version": version, "returns": returns.tolist(),
                "lengths": lengths.tolist(), "mean_return": float(returns.mean())}

    def close(self) -> float:
        """Flush telemetry; returns the CPU seconds this process used."""
        self.tel.shutdown()
        return time.process_time()


def _get(ref):
    import ray

    return ray.get(ref)


def _put(value):
    import ray

    return ray.put(value)


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _ready(ref) -> bool:
    import ray

    done, _ = ray.wait([ref], timeout=0)
    return bool(done)


# --------------------------------------------------------------------------- the driver


class ApeX:
    """Runs one Ape-X training on the current Ray cluster (a local one is started if needed)."""

    def __init__(self, config: ApexConfig | None = None, **overrides):
        if config is None:
            config = ApexConfig(**overrides)
        elif overrides:
            config = config.replace(**overrides)
        if not isinstance(config, ApexConfig):
            raise TypeError(f"config must be an ApexConfig, got {type(config).__name__}")
        self.config = config
        # Refuse an unusable environment before any process starts.
        self.obs_shape, self.num_actions = env_spec(config.env_id)
        self.spec = NetworkSpec(int(np.prod(self.obs_shape)), self.num_actions,
                                config.hidden_sizes, config.dueling)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.output_dir = Path(config.output_dir or f"runs/{config.env_id}-{stamp}")
        if config.run_id is None:  # every process labels its telemetry with the same id
            self.config = config = config.replace(
                run_id=f"{config.env_id}-{stamp}-{uuid.uuid4().hex[:6]}")

    # The resource plan: what each Ray actor asks for.
    def resource_plan(self, cluster_cpus: float) -> dict:
        c = self.config
        actor_cpus = c.actor_cpus
        if actor_cpus is None:
            actor_cpus = max(cluster_cpus - c.learner_cpus, 0.01 * c.num_actors) / c.num_actors
            actor_cpus = max(0.01, round(actor_cpus - 0.005, 2))  # round down: it must fit
        return {"learner": {"num_cpus": c.learner_cpus, "num_gpus": c.num_gpus},
                "actor": {"num_cpus": actor_cpus}, "replay": {"num_cpus": 0},
                "evaluator": {"num_cpus": 0}}

    def _check_resources(self, ray) -> dict:
        c = self.config
        deadline = time.monotonic() + c.resource_timeout_s
        while True:
            total = ray.cluster_resources()
            plan = self.resource_plan(total.get("CPU", 0.0))
            need_cpu = c.learner_cpus + c.num_actors * plan["actor"]["num_cpus"]
            have_cpu, have_gpu = total.get("CPU", 0.0), total.get("GPU", 0.0)
            if need_cpu <= have_cpu + 1e-9 and c.num_gpus <= have_gpu + 1e-9:
                return plan
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        problems = []
        if c.num_gpus > have_gpu:
            problems.append(f"num_gpus={c.num_gpus} for the learner but the cluster has "
                            f"{have_gpu:g} GPU(s); use num_gpus=0 to train on the CPU or "
                            "connect to a cluster with a GPU node")
        if need_cpu > have_cpu:
            problems.append(f"{need_cpu:g} CPUs (learner_cpus={c.learner_cpus:g} + num_actors="
                            f"{c.num_actors} x actor_cpus={plan['actor']['num_cpus']:g}) but the "
                            f"cluster has {have_cpu:g}; lower num_actors or actor_cpus")
        raise RuntimeError(f"the Ray cluster cannot host this run after waiting "
                           f"{c.resource_timeout_s:g}s: it asks for " + "; and ".join(problems))

    def train(self) -> TrainingResult:
        import ray

        t_start = time.monotonic()
        # Quiet TensorFlow in every worker this driver starts (workers inherit the environment).
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(ignore_reinit_error=True, include_dashboard=False,
                     logging_level="warning", log_to_driver=True)
        self._sigterm = threading.Event()
        previous = _catch_sigterm(self._sigterm)
        try:
            plan = self._check_resources(ray)
            return self._train(ray, plan, t_start)
        finally:
            _restore_sigterm(previous)
            if started_ray:
                ray.shutdown()

    def _train(self, ray, plan: dict, t_start: float) -> TrainingResult:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        c = self.config
        self.output_dir.mkdir(parents=True, exist_ok=True)
        checkpoint_dir = c.checkpoint_dir or str(self.output_dir / "checkpoints")
        weights = init_weights(self.spec, c.seed)
        resume_path, resumed = None, None
        if c.resume is not None:
            from distrl.learner import read_checkpoint, resolve_resume

            resume_path = resolve_resume(c.resume, checkpoint_dir)
            resumed, arrays = read_checkpoint(resume_path)
            weights = [arrays[f"online_{i}"] for i in range(len(weights))]
        shards = c.replay_shards
        # Each shard holds its share of the capacity and warm-up; its limiter's slack must
        # still fit one actor block and one learner fetch.
        shard_config = c.replace(replay_capacity=c.replay_capacity // shards,
                                 min_replay_size=-(-c.min_replay_size // shards))
        error_buffer = max(shard_config.min_replay_size * c.samples_per_insert
                           * c.samples_per_insert_tolerance,
                           c.samples_per_insert * c.envs_per_actor * c.actor_block_steps
                           + c.batch_size * c.batches_per_fetch)
        # Replay, learner and evaluator live beside the driver (on GKE: the head, never Spot);
        # actors spread over the cluster's nodes, and Ray restarts one whose process is lost.
        # Replay and evaluator need no CPU reservation, so they always fit here; the learner
        # goes elsewhere only if this node cannot give it its CPUs or GPU.
        node = ray.get_runtime_context().get_node_id()
        here = NodeAffinitySchedulingStrategy(node, soft=False)
        near = NodeAffinitySchedulingStrategy(node, soft=True)
        replays = [ray.remote(ReplayWorker).options(
            max_concurrency=c.num_actors + 8, scheduling_strategy=here, **plan["replay"]).remote(
            shard_config.replace(seed=c.seed + 1000 * s), self.obs_shape, error_buffer)
            for s in range(shards)]
        learner = ray.remote(LearnerWorker).options(
            max_concurrency=c.num_actors + 8, scheduling_strategy=near, **plan["learner"]).remote(
            c, self.spec, weights, replays, str(self.output_dir), checkpoint_dir, resume_path)
        actors = [ray.remote(ActorWorker).options(
            max_concurrency=4, max_restarts=c.max_actor_restarts, scheduling_strategy="SPREAD",
            **plan["actor"]).remote(c, i, replays[i % shards], learner)
            for i in range(c.num_actors)]
        evaluator = ray.remote(EvaluatorWorker).options(
            scheduling_strategy=here, **plan["evaluator"]).remote(c)
        for r in replays:
            r.set_learner.remote(learner)
        evaluator.set_learner.remote(learner)
        workers = [*replays, learner, evaluator, *actors]
        try:
            return self._drive(ray, replays, learner, actors, evaluator, t_start,
                               resumed, resume_path)
        finally:
            for w in workers:
                ray.kill(w, no_restart=True)

    def _drive(self, ray, replays, learner, actors, evaluator, t_start, resumed: dict | None,
               resume_path: str | None) -> TrainingResult:
        from ray.exceptions import ActorDiedError, RayActorError
        from tqdm.auto import tqdm

        c = self.config
        driver_cpu_start = time.process_time()
        run_refs = {learner.run.remote(): "learner"}
        run_refs |= {a.run.remote(): i for i, a in enumerate(actors)}
        epsilons = ray.get([a.epsilons.remote() for a in actors])
        t_train = time.monotonic()
        evals: list[dict] = []
        throughput: list[dict] = []
        events: list[dict] = []
        eval_ref, last_eval = None, t_train
        time_to_target, stop_reason = None, ""
        env_steps = updates = 0
        startup_s = None
        fleet = _ActorFleet(len(actors))
        before = (resumed or {}).get("progress", {})  # what the resumed run had done
        steps_before, seconds_before = before.get("env_steps", 0), before.get("train_s", 0.0)
        if resume_path is not None:
            events.append({"time_s": 0.0, "kind": "resumed", "detail": resume_path})
        tel = ProcessTelemetry(c, "driver")
        tracer_root = _IterationTraces(tel, c)
        bar = tqdm(total=c.max_env_steps, unit="step", disable=not c.progress,
                   desc=f"Ape-X {c.env_id}", dynamic_ncols=True)

        def say(kind: str, detail: str, now: float) -> None:
            events.append({"time_s": now - t_start, "kind": kind, "detail": detail})
            bar.write(f"[distrl] {detail}")

        try:
            while True:
                time.sleep(POLL_INTERVAL_S)
                now = time.monotonic()
                crashed, _ = ray.wait(list(run_refs), timeout=0)
                for ref in crashed:  # a run() that ends on its own is a crash or a budget
                    who = run_refs.pop(ref)
                    if who == "learner":
                        try:
                            ray.get(ref)
                        except RayActorError as e:
                            raise self._lost("learner") from e
                        stop_reason = stop_reason or "max_learner_updates"
                        continue
                    try:
                        ray.get(ref)
                        continue  # returned: stop() was called
                    except ActorDiedError as e:  # for good: Ray has no restarts left for it
                        fleet.retire(who)
                        say("actor_lost", f"actor {who} lost for good ({_cause(e)}): going on "
                            f"with {fleet.expected} of {len(actors)} actors", now)
                    except RayActorError as e:  # its process is gone; Ray is restarting it
                        if fleet.lose(who):
                            say("actor_lost", f"actor {who} lost ({_cause(e)}); Ray restarts "
                                "it", now)
                        fleet.retry_at[who] = now + 1.0
                for i, at in list(fleet.retry_at.items()):  # run() again once it is back
                    if now >= at:
                        del fleet.retry_at[i]
                        run_refs[actors[i].run.remote()] = i
                if self._sigterm.is_set() and not stop_reason:
                    stop_reason = "sigterm"
                    say("sigterm", "SIGTERM: stopping after a final checkpoint", now)
                if stop_reason:
                    break
                carrier = tracer_root.next_iteration()
                for i, a in enumerate(actors):
                    fleet.ask(i, a, carrier)
                for i, change in fleet.collect(ray, now):
                    say("actor_back" if change == "is back" else "actor_silent",
                        f"actor {i} {change}: {fleet.running(now)} of {fleet.expected} actors "
                        "running", now)
                try:
                    l_stats = ray.get(learner.stats.remote(carrier))
                except RayActorError as e:
                    raise self._lost("learner") from e
                try:
                    r_stats = _replay_stats(ray, replays)
                except RayActorError as e:
                    raise self._lost("replay") from e
                env_steps = steps_before + fleet.env_steps()
                updates = l_stats["updates"]
                learner.note_progress.remote({"env_steps": env_steps,
                                              "train_s": seconds_before + now - t_train})
                if startup_s is None and r_stats["inserted"] > 0:
                    startup_s = now - t_start
                throughput.append({"time_s": now - t_start, "env_steps": env_steps,
                                   "learner_updates": updates,
                                   "inserted": r_stats["inserted"],
                                   "replay_size": r_stats["size"],
                                   "actors_running": fleet.running(now)})
                bar.update(env_steps - bar.n)
                rates = _rates(throughput)
                tracer_root.record_rates(rates[0])
                postfix = {"env/s": f"{rates[0]:,.0f}", "upd/s": f"{rates[1]:,.0f}"}
                if evals:
                    postfix["eval"] = f"{evals[-1]['mean_return']:.1f}"
                bar.set_postfix(postfix, refresh=False)

                if eval_ref is not None and _ready(eval_ref):
                    ev = ray.get(eval_ref)
                    eval_ref = None
                    ev |= {"time_s": now - t_start, "env_steps": env_steps,
                           "learner_updates": updates}
                    evals.append(ev)
                    learner.log_scalars.remote({"eval/mean_return": ev["mean_return"],
                                                "throughput/env_steps": env_steps}, updates)
                    if c.target_return is not None and ev["mean_return"] >= c.target_return:
                        time_to_target, stop_reason = ev["time_s"], "target_return"
                        break
                if eval_ref is None and updates > 0 and now - last_eval >= c.eval_interval_s:
                    eval_ref = evaluator.evaluate.remote(learner.get_weights.remote(-1))
                    last_eval = now
                if c.max_env_steps and env_steps >= c.max_env_steps:
                    stop_reason = "max_env_steps"
                    break
                if c.max_seconds and now - t_start >= c.max_seconds:
                    stop_reason = "max_seconds"
                    break
        except KeyboardInterrupt:
            stop_reason = "interrupted"
        finally:
            bar.close()
            tracer_root.end()

        # Stop producers first, then the learner, then release anything still waiting.
        for a in actors:
            a.stop.remote()
        learner.stop.remote()
        for r in replays:
            r.close.remote()
        learner_final = ray.get(next(r for r, who in run_refs.items() if who == "learner"))
        actor_finals = fleet.finish(ray, {r: who for r, who in run_refs.items() if who != "learner"})
        checkpoint = ray.get(learner.close.remote())
        final_weights = ray.get(learner.get_weights.remote(-1))[1]
        r_stats = _replay_stats(ray, replays)
        checks = ray.get([r.check.remote() for r in replays])
        replay_check = {"ok": all(x["ok"] for x in checks),
                        "problems": [p for x in checks for p in x["problems"]],
                        "size": sum(x["size"] for x in checks),
                        "inserted": sum(x["inserted"] for x in checks), "shards": len(checks)}
        evaluator_cpu_s = ray.get(evaluator.close.remote())
        tel.shutdown()
        for event in learner_final.get("events", []):
            events.append({"time_s": event["time"] - (time.time() - (time.monotonic() - t_start)),
                           "kind": event["kind"], "detail": event["detail"]})
        events.sort(key=lambda e: e["time_s"])
        # CPU seconds per process (all threads): what the run cost, telemetry included.
        cpu_seconds = {"driver": time.process_time() - driver_cpu_start,
                       "learner": learner_final["cpu_s"], "replay": r_stats["cpu_s"],
                       "evaluator": evaluator_cpu_s,
                       "actors": sum(f["cpu_s"] for f in actor_finals.values())}
        wall = time.monotonic() - t_start
        env_steps = steps_before + fleet.env_steps()
        updates = learner_final["updates"]
        train_s = max(time.monotonic() - t_train, 1e-9)
        updates_this_run = updates - (resumed or {}).get("updates", 0)
        result = TrainingResult(
            env_id=c.env_id, reached_target=time_to_target is not None,
            target_return=c.target_return, time_to_target_s=time_to_target, wall_time_s=wall,
            startup_s=startup_s or wall, env_steps=env_steps, learner_updates=updates,
            transitions_inserted=r_stats["inserted"], transitions_sampled=r_stats["sampled"],
            env_steps_per_s=(env_steps - steps_before) / train_s,
            learner_updates_per_s=updates_this_run / train_s,
            samples_per_insert=r_stats["sampled"] / max(r_stats["inserted"], 1),
            final_eval_return=evals[-1]["mean_return"] if evals else None,
            best_eval_return=max((e["mean_return"] for e in evals), default=None),
            stop_reason=stop_reason, evals=evals, actor_epsilons=epsilons,
            actor_weights_versions=[actor_finals[i]["weights_version"] if i in actor_finals
                                    else None for i in range(len(actors))],
            actor_restarts=list(fleet.restarts), actor_nodes=list(fleet.nodes),
            throughput=throughput, output_dir=str(self.output_dir), checkpoint=checkpoint,
            cpu_seconds=cpu_seconds, replay_check=replay_check, events=events,
            resumed_from=resume_path, config=c.to_dict(), weights=final_weights)
        result.save(self.output_dir / "results.json")
        return result


    def _lost(self, role: str) -> RuntimeError:
        where = self.config.checkpoint_dir or self.output_dir / "checkpoints"
        return RuntimeError(f"the {role} process was lost, and the run with it; the last "
                            f"checkpoint is in {where}: resubmit with --resume auto to continue")


class _ActorFleet:
    """The driver's view of its actors: counters that survive restarts, who is running."""

    def __init__(self, n: int):
        self.restarts = [0] * n      # new processes seen per actor (a pid that changed)
        self.pids: list[int | None] = [None] * n
        self.lost: set[int] = set()
        self.retry_at: dict[int, float] = {}
        self.retired: set[int] = set()
        self.last = [{"env_steps": 0, "transitions_sent": 0} for _ in range(n)]
        self.base = [0] * n          # env steps of earlier lives of each actor
        self.seen = [0.0] * n
        self.nodes: list[str | None] = [None] * n
        self.pending: dict = {}      # actor index -> its stats() ref not yet answered
        self.was_running = [True] * n

    @property
    def expected(self) -> int:
        return len(self.restarts) - len(self.retired)

    def lose(self, i: int) -> bool:
        """Actor i's process is gone; True the first time (until it is back)."""
        new = i not in self.lost
        self.lost.add(i)
        return new

    def retire(self, i: int) -> None:
        self.retired.add(i)
        self.retry_at.pop(i, None)

    def ask(self, i: int, actor, carrier) -> None:
        if i not in self.pending and i not in self.retired:
            self.pending[i] = actor.stats.remote(carrier)

    def collect(self, ray, now: float, wait_s: float = 0.2) -> list[tuple[int, str]]:
        """Take the stats that arrived; returns (actor, 'stopped'/'back') changes."""
        from ray.exceptions import RayActorError

        refs = list(self.pending.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        ready = set(ready)
        for i, ref in list(self.pending.items()):
            if ref not in ready:
                continue
            del self.pending[i]
            try:
                s = ray.get(ref)
            except RayActorError:
                continue
            self._take(i, s)
            self.lost.discard(i)
            self.seen[i] = now
            self.nodes[i] = s.get("node_id")
        changes = []
        for i in range(len(self.restarts)):
            running = i not in self.retired and now - self.seen[i] < 5.0
            if running != self.was_running[i] and self.seen[i] > 0:
                changes.append((i, "is back" if running else "stopped reporting"))
            if self.seen[i] > 0:
                self.was_running[i] = running
        return changes

    def _take(self, i: int, s: dict) -> None:
        if self.pids[i] is not None and s["pid"] != self.pids[i]:  # a new life of actor i
            self.restarts[i] += 1
            self.base[i] += self.last[i]["env_steps"]
        elif s["env_steps"] < self.last[i]["env_steps"]:
            self.base[i] += self.last[i]["env_steps"]
        self.pids[i] = s["pid"]
        self.last[i] = s

    def running(self, now: float) -> int:
        return sum(1 for i in range(len(self.restarts))
                   if i not in self.retired and now - self.seen[i] < 5.0)

    def env_steps(self) -> int:
        return sum(b + s["env_steps"] for b, s in zip(self.base, self.last))

    def finish(self, ray, run_refs: dict, timeout_s: float = 30.0) -> dict[int, dict]:
        """The final stats of every actor that returns from run() within the timeout."""
        from ray.exceptions import RayActorError

        refs = list(run_refs)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        finals = {}
        for ref in ready:
            i = run_refs[ref]
            try:
                s = ray.get(ref)
            except RayActorError:
                continue
            self._take(i, s)
            finals[i] = s
        return finals


def _replay_stats(ray, replays: list) -> dict:
    """The shards' stats summed (one shard: its own)."""
    shards = ray.get([r.stats.remote() for r in replays])
    total = {k: sum(s[k] for s in shards) for k in ("size", "inserted", "sampled", "cpu_s")}
    return total | {"shards": shards}


def _cause(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:160]


def _catch_sigterm(flag: threading.Event):
    """SIGTERM to the driver (a Spot notice on its node) ends the run with a final checkpoint."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())
    return previous


def _restore_sigterm(previous) -> None:
    import signal

    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


class _IterationTraces:
    """The driver's side of tracing: one root `rl.loop` span per driver iteration."""

    def __init__(self, tel: ProcessTelemetry, config: ApexConfig):
        self.tel, self.config = tel, config
        self.iteration = 0
        self.root = None
        self.started = 0.0

    def next_iteration(self) -> dict | None:
        """End the last iteration's span, open the next one; returns its context carrier."""
        if not self.tel.enabled:
            return None
        self.end()
        self.iteration += 1
        self.started = time.perf_counter()
        self.root = self.tel.tracer.start_span(
            otel.SPAN_LOOP, attributes={**self.tel.attrs, otel.RL_LOOP_ITERATION: self.iteration})
        return _carrier_of(self.root)

    def record_rates(self, env_steps_per_s: float) -> None:
        if not self.tel.enabled:
            return
        rl, attrs = self.tel.rl, self.tel.attrs
        rl.set("rl.samples.rate", env_steps_per_s, attrs)
        if self.config.num_gpus > 0:
            rl.set("rl.samples.rate_per_gpu", env_steps_per_s / self.config.num_gpus, attrs)

    def end(self) -> None:
        if self.root is not None:
            self.root.end()
            self.tel.rl.duration("rl.loop.duration", (time.perf_counter() - self.started) * 1e3,
                                 self.tel.attrs)
            self.root = None


def _rates(throughput: list[dict], window_s: float = 3.0) -> tuple[float, float]:
    """Env steps/s and learner updates/s over the last few seconds."""
    if len(throughput) < 2:
        return 0.0, 0.0
    last = throughput[-1]
    first = next((p for p in throughput if last["time_s"] - p["time_s"] <= window_s),
                 throughput[-2])
    if first is last:
        first = throughput[-2]
    dt = max(last["time_s"] - first["time_s"], 1e-9)
    return ((last["env_steps"] - first["env_steps"]) / dt,
            (last["learner_updates"] - first["learner_updates"]) / dt)


def actor_epsilon_table(config: ApexConfig) -> list[list[float]]:
    """The epsilons every actor's env slots will use (no Ray needed)."""
    return [slot_epsilons(config, i).tolist() for i in range(config.num_actors)]
