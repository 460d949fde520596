"""The Ape-X processes as Ray actors: replay, learner, actors and the greedy evaluator.

Plain classes (ReplayService, Learner, Actor) do the work; these wrappers add what a process
needs: pulling from and pushing to the others, telemetry, a checkpoint on SIGTERM, and a
deadline on every wait (a lost peer raises PeerTimeout instead of hanging the process).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np

from distrl.apex.faults import ask_learner_to_checkpoint, cause, on_sigterm
from distrl.apex.process_telemetry import (
    TRACE_KWARG,
    TRAFFIC_FLUSH_BLOCKS,
    LearnerMetrics,
    ProcessTelemetry,
    TrafficTally,
    call,
    current_carrier,
    step_sample,
    traced,
)
from distrl.apex.replay_memory import MEMORY_SHARE, sized_capacity
from distrl.otel import conventions as otel
from distrl.rl.actor import Actor
from distrl.rl.checkpoints import kept_policy, replay_arrays, write_checkpoint, write_policy
from distrl.rl.config import ApexConfig
from distrl.rl.envs import EVAL_MAX_STEPS, eval_epsilon, evaluate_greedy, network_for
from distrl.rl.frames import replay_sizing
from distrl.rl.learner import Learner
from distrl.rl.network import NetworkSpec, init_weights
from distrl.rl.replay import ReplayService, SampledBatch
from distrl.rl.tf_runtime import configure_tensorflow

# How long a worker waits for a peer's answer before it gives up on it (a lost node).
PEER_TIMEOUT_S = 60.0
# How long a checkpoint waits for the replay shards' samples before it is written without them.
REPLAY_CONTENTS_S = 10.0


class PeerTimeout(RuntimeError):
    """A peer process did not answer within PEER_TIMEOUT_S (its node is probably gone)."""


class _ReportsExports:
    """A worker whose telemetry the driver asks, after its last flush, what its exports came
    to (otel.export_outcomes): the replay, the learner and the evaluator, which outlive their
    run. An actor's run() returns its count with its final stats."""

    tel: ProcessTelemetry

    def export_outcomes(self) -> list[dict]:
        return self.tel.export_outcomes()


class ReplayWorker(ReplayService, _ReportsExports):
    """The replay process: ReplayService plus telemetry of what it serves."""

    def __init__(self, config: ApexConfig, spec: NetworkSpec, error_buffer: float):
        if spec.is_image:  # batches of MBs (a Pong batch: 28 MB); vectors' are KBs
            keep_freed_batches()
        # Sized on this node: it holds the memory (a refusal says how much would fit).
        capacity, frame_capacity = sized_capacity(
            config.replay_capacity, spec.obs_shape, obs_dtype=spec.input_dtype,
            share=MEMORY_SHARE / config.replay_shards, **replay_sizing(config, spec.obs_shape))
        super().__init__(capacity, spec.obs_shape, alpha=config.priority_alpha,
                         eps=config.priority_eps, samples_per_insert=config.samples_per_insert,
                         min_size=config.min_replay_size, error_buffer=error_buffer,
                         seed=config.seed, obs_dtype=spec.input_dtype,
                         frame_capacity=frame_capacity)
        self.tel = ProcessTelemetry(config, "replay", spec)
        self.learner = None
        on_sigterm(ask_learner_to_checkpoint(lambda: self.learner, "replay"))
        rl = self.tel.rl
        self._sample_attrs = rl.attrs({otel.RL_LOOP: "replay", otel.RL_SAMPLE: "replay"})
        self._sync_attrs = rl.attrs({otel.RL_LOOP: "replay", otel.RL_SYNC_SOURCE: "learner",
                                     otel.RL_SYNC_DESTINATION: "replay"})

    @traced
    def add(self, block, timeout: float | None = 1.0) -> bool:
        with self.tel.span("replay.insert", {otel.RL_SAMPLE_BATCH_SIZE: len(block)}):
            return super().add(block, timeout)

    @traced
    def sample(self, batch_size: int, beta: float, timeout: float | None = 1.0,
               num_batches: int = 1):
        start = time.perf_counter()
        with self.tel.span("replay.sample", {otel.RL_SAMPLE_BATCH_SIZE: batch_size * num_batches}):
            stack = super().sample(batch_size, beta, timeout, num_batches)
        if stack is not None:
            self.tel.rl.duration("rl.sample.duration", (time.perf_counter() - start) * 1e3,
                                 self._sample_attrs)
        return stack

    @traced
    def update_priorities(self, keys, td_abs) -> int:
        start = time.perf_counter()
        size = int(np.asarray(keys).nbytes + np.asarray(td_abs).nbytes)
        with self.tel.span(otel.SPAN_SYNC, {otel.RL_SYNC_BYTES: size, otel.RL_SYNC_SOURCE: "learner",
                                            otel.RL_SYNC_DESTINATION: "replay"}):
            live = super().update_priorities(keys, td_abs)
        self.tel.rl.duration("rl.sync.duration", (time.perf_counter() - start) * 1e3,
                             self._sync_attrs)
        return live

    def set_learner(self, learner) -> None:
        """The learner to ask for a checkpoint when this process gets SIGTERM."""
        self.learner = learner

    @traced
    def sample_with_total(self, batch_size: int, beta: float, timeout: float | None = 1.0,
                          num_batches: int = 1):
        """sample() plus this shard's priority mass, which decides the learner's next draws."""
        stack = self.sample(batch_size, beta, timeout, num_batches)
        with self._lock:
            return stack, self.replay.tree.total

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

    Every shard keeps `in_flight` requests from the learner: when the learner takes a shard's
    oldest reply, it asks that shard again before it trains, so all shards sample while the
    learner trains, and S shards can deliver about S times one shard's rate
    (benchmarks/learner_feed.py). Which shard's reply comes next is still drawn by mass, so
    sampling stays as from one replay; a reply waits for its turn, a few batches stale.
    """

    def __init__(self, shards: list, seed: int = 0, in_flight: int = 1):
        if not isinstance(in_flight, int) or in_flight < 1:
            raise ValueError(f"in_flight={in_flight!r} is invalid: expected an integer >= 1")
        self.shards = list(shards)
        self.in_flight = in_flight
        self.totals = np.ones(len(self.shards))
        self.rng = np.random.default_rng(seed)
        self.pending: list[deque] = [deque() for _ in self.shards]
        self._updates: deque = deque()  # priority updates sent, not yet known applied

    def ask(self, batch_size: int, beta: float, num_batches: int) -> None:
        """Top every shard up to `in_flight` requests for stacks of num_batches batches."""
        for shard, queue in zip(self.shards, self.pending):
            while len(queue) < self.in_flight:
                queue.append(call(shard.sample_with_total, batch_size, beta,
                                  num_batches=num_batches))

    def next(self, batch_size: int, beta: float, num_batches: int) -> SampledBatch | None:
        """The next stack of num_batches batches, from a shard drawn by priority mass (None
        when that shard's rate limiter held it back). Call ask() while it trains, so that
        shard samples again meanwhile."""
        self.ask(batch_size, beta, num_batches)  # the first call, or after a stack of None
        n, mass = len(self.shards), self.totals.sum()
        s = 0 if n == 1 else int(self.rng.choice(n, p=self.totals / mass if mass > 0 else None))
        got, self.totals[s] = _get(self.pending[s].popleft())
        if got is None or n == 1:
            return got
        return SampledBatch(got.transitions, got.keys * n + s, got.weights, got.probabilities)

    def update_priorities(self, keys: np.ndarray, td_abs: np.ndarray) -> None:
        """Send new priorities to the shards that hold the keys, without waiting for them,
        but with at most two updates a shard in flight (a slow shard holds the learner back
        rather than piling up updates)."""
        n = len(self.shards)
        if n == 1:
            self._updates.append(call(self.shards[0].update_priorities, keys, td_abs))
        else:
            shard, local = keys % n, keys // n
            self._updates.extend(call(self.shards[s].update_priorities, local[mine], td_abs[mine])
                                 for s in range(n) if (mine := shard == s).any())
        while len(self._updates) > 2 * n:
            _get(self._updates.popleft())

    def drain(self) -> None:
        """Wait until every priority update sent has been applied."""
        while self._updates:
            _get(self._updates.popleft())


class LearnerWorker(_ReportsExports):
    """The learner's process: pulls batches from replay itself and trains in a loop thread."""

    def __init__(self, config: ApexConfig, spec: NetworkSpec, weights, replays: list,
                 output_dir: str, checkpoint_dir: str, resume_path: str | None = None):
        if spec.is_image:
            keep_freed_batches()
        self.gpus = configure_tensorflow(num_threads=max(1, int(config.learner_cpus)), lean=True,
                                         xla_cache=config.xla_cache and config.jit_compile is not False)
        if config.num_gpus > 0 and not self.gpus:
            raise RuntimeError(
                f"num_gpus={config.num_gpus}: Ray gave the learner a GPU "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}) but TensorFlow "
                "sees none; install a CUDA build of TensorFlow on that node or use num_gpus=0")
        import tensorflow as tf

        self.config = config
        self.replay = ReplayShards(replays, config.seed, config.fetches_in_flight)
        self.learner = Learner(config, spec, weights)
        if resume_path is not None:  # weights, target network, optimizer, update counter
            self.learner.restore_checkpoint(resume_path)
            weights = self.learner.get_weights()
        self.output_dir = Path(output_dir)
        self.checkpoint_dir = checkpoint_dir
        self.progress: dict = {}  # the driver's counters, saved with each checkpoint
        self.events: list[dict] = []
        self._update_lock = threading.Lock()  # a checkpoint never sees half an update
        self.tensorboard = tf.summary.create_file_writer(str(self.output_dir / "tensorboard"))
        self._lock = threading.Lock()
        self._published = (self.learner.updates, weights)
        self._stop = threading.Event()
        self.checkpoint: str | None = None
        self.holding = False  # the driver asked for a hold (hold_learner_within) and it holds
        self._hold_asked = threading.Event()
        self._hold_after: int | None = None  # hold again at this many updates (release(after))
        on_sigterm(lambda: self.checkpoint_now("SIGTERM to the learner"))
        self.tel = ProcessTelemetry(config, "learner", spec)
        self._publish_attrs = self.tel.rl.attrs({
            otel.RL_LOOP: "learner", otel.RL_SYNC_SOURCE: "learner", otel.RL_SYNC_DESTINATION: "actors"})
        # One update: three forward passes (online and target on s', online on s) and a backward
        # pass (about two forward passes) over the batch.
        self.metrics = LearnerMetrics(
            self.tel, self.tensorboard, flops_per_update=5 * spec.forward_flops(config.batch_size),
            peak_flops=config.peak_flops or otel.peak_flops_for(self._gpu_names(),
                                                                config.learner_cpus))
        self.metrics.ready()

    def _gpu_names(self) -> list[str]:
        import tensorflow as tf

        names = []
        for gpu in tf.config.list_physical_devices("GPU"):
            details = tf.config.experimental.get_device_details(gpu)
            names.append(details.get("device_name", gpu.name))
        return names

    def run(self) -> dict:
        """Train until stop() or max_learner_updates; returns the final stats."""
        c = self.config
        last_checkpoint = time.monotonic()
        while not self._stop.is_set():
            if self._hold_after is not None and self.learner.updates >= self._hold_after:
                self._hold_after = None
                self._hold_asked.set()
            if self._hold_asked.is_set():
                self._hold()
                continue
            metrics = self.step()
            if metrics is not None:
                self.metrics.write(metrics)
            if time.monotonic() - last_checkpoint >= c.checkpoint_interval_s:
                self.save_checkpoint()
                last_checkpoint = time.monotonic()
            if c.max_learner_updates and self.learner.updates >= c.max_learner_updates:
                break
        self.replay.drain()
        self._publish()
        return self.stats()

    def step(self) -> dict | None:
        """One learner step: the batches replay sent train the network (one update each, in one
        call into the graph), their new priorities go back, and the next batches are asked for
        while these train. None when replay sent nothing (warm-up, the rate limiter): the wait
        is counted and the batches asked for again."""
        c, learner = self.config, self.learner
        t0 = time.monotonic()
        stack = self.replay.next(c.batch_size, learner.beta(), c.batches_per_fetch)
        t1 = time.monotonic()
        if stack is None:
            self.metrics.waited(t1 - t0)
            return None
        with self.tel.unit(), self.tel.span(otel.SPAN_TRAIN, {
                otel.RL_TRAIN_STEPS: len(stack.transitions), otel.RL_TRAIN_BATCH_SIZE: c.batch_size}):
            self.replay.ask(c.batch_size, learner.beta(), c.batches_per_fetch)
            before, u0 = learner.updates, time.perf_counter()
            with self._update_lock:
                losses, td_abs, diag = learner.update_many(stack)
            update_s = time.perf_counter() - u0
            if learner.updates // c.weight_publish_period > before // c.weight_publish_period:
                self._publish()
            self.replay.update_priorities(stack.keys.ravel(), td_abs.ravel())
        return {"updates": learner.updates, "steps": learner.updates - before,
                "loss": float(losses[-1]), "mean_q": float(diag["mean_q"][-1]),
                "grad_norm": float(diag["grad_norm"][-1]), "beta": learner.beta(),
                "wait_s": t1 - t0, "update_s": update_s, "train_s": time.monotonic() - t1}

    def hold(self) -> None:
        """Train no more from the next step on, until release() or the run's stop: the held
        weights are the published ones (hold_learner_within)."""
        self._hold_asked.set()

    def release(self, after: int = 0) -> None:
        """Train on; with `after`, hold again once that many more updates are done."""
        self._hold_after = self.learner.updates + after if after else None
        self._hold_asked.clear()

    def _hold(self) -> None:
        self._publish()
        self.holding = True
        while self._hold_asked.is_set() and not self._stop.wait(0.05):
            pass
        self.holding = False

    def _publish(self) -> None:
        """Make the current weights the version actors and the evaluator pull."""
        start = time.perf_counter()
        weights = self.learner.get_weights()
        with self._lock:
            self._published = (self.learner.updates, weights)
        self.tel.rl.duration("rl.sync.duration", (time.perf_counter() - start) * 1e3,
                             self._publish_attrs)

    def save_checkpoint(self) -> str:
        blocks = self._replay_contents()
        with self._update_lock:  # copy a whole state; write it while training goes on
            meta, arrays = self.learner.snapshot({
                "progress": dict(self.progress), "saved_at": time.time(),
                "replay_transitions": sum(len(b) for b in blocks)})
        self.checkpoint = write_checkpoint(self.checkpoint_dir, (meta, arrays | replay_arrays(blocks)))
        return self.checkpoint

    def _replay_contents(self) -> list:
        """A sample of each replay shard, checkpoint_replay_mb in all; none (and an event that
        says why) when a shard does not answer within REPLAY_CONTENTS_S: the checkpoint is
        written without, rather than late (a Spot notice gives ~30 s)."""
        shards = self.replay.shards
        if not self.config.checkpoint_replay_mb:
            return []
        budget = self.config.checkpoint_replay_mb * 1e6 / len(shards)
        try:
            return [_get(ref, REPLAY_CONTENTS_S) for ref in
                    [shard.contents.remote(budget) for shard in shards]]
        except Exception as e:  # noqa: BLE001 - a lost shard or its timeout: write without it
            self.events.append({"time": time.time(), "kind": "checkpoint",
                                "detail": f"checkpoint without replay: {cause(e)}"})
            return []

    def checkpoint_now(self, reason: str) -> str:
        """A checkpoint at once (SIGTERM anywhere in the run: a Spot notice, a drain)."""
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

    @traced
    def stats(self) -> dict:
        self.tel.keep_for_next_unit()
        with self._lock:
            held_at = self._published[0] if self.holding else None  # the held weights' version
        return dict(self.metrics.snapshot(), checkpoint=self.checkpoint, held_at=held_at,
                    cpu_s=time.process_time(), pid=os.getpid(), events=list(self.events))

    def log_scalars(self, scalars: dict, step: int) -> None:
        import tensorflow as tf

        with self.tensorboard.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        self.tensorboard.flush()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> str:
        """Write the final checkpoint, flush TensorBoard and telemetry."""
        path = self.save_checkpoint()
        self.tensorboard.flush()
        self.tel.shutdown()
        return path


class ActorWorker:
    """One actor process: collects blocks, ships them to replay, pulls fresh weights."""

    def __init__(self, config: ApexConfig, index: int, spec: NetworkSpec, replay_name: str,
                 learner_name: str):
        # The peers come by name, not as handles: Ray keeps handles passed to the constructor
        # of a restartable actor in the object store and logs an error line about it (a
        # restart would fail if they went out of scope, ray-project/ray#53727).
        self.replay, self.learner = _peer(replay_name), _peer(learner_name)
        self.config = config
        if config.resume is None and not _restarted():
            # A first life starts from the run's initial weights, which it computes itself
            # (init_weights is seeded, the learner starts from the same): it steps at once
            # instead of waiting for the learner to import TensorFlow.
            version, weights = 0, init_weights(spec, config.seed)
        else:
            # The learner's newest weights: a restarted actor (a lost node, a killed process)
            # picks up where training is, and nothing large sits in the object store for
            # restarts. The learner may still be starting (TensorFlow on a busy node, a GPU
            # node from zero): wait as long as the driver waits for it.
            version, weights = _get(self.learner.get_weights.remote(-1),
                                    max(PEER_TIMEOUT_S, config.learner_wait_s))
        self.actor = Actor(config, index, weights)
        self.actor.set_weights(weights, version)
        self.node_id = _node_id()  # where this life of the actor runs (a restart may move it)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self.blocks_sent = 0
        self.transitions_sent = 0
        self.tel = ProcessTelemetry(config, "actor", spec, index)
        on_sigterm(ask_learner_to_checkpoint(lambda: self.learner, f"actor {index}"))
        rl = self.tel.rl
        self._sample_attrs = rl.attrs({otel.RL_LOOP: "actor", otel.RL_SAMPLE: "environment"})
        self._sync_attrs = rl.attrs({otel.RL_LOOP: "actor", otel.RL_SYNC_SOURCE: "learner",
                                     otel.RL_SYNC_DESTINATION: "actor"})

    def run(self) -> dict:
        """Collect, ship and sync until stop(): one block travels to replay while the next is
        made, and fresh weights are pulled every weight_sync_period steps without waiting."""
        c, actor, tel = self.config, self.actor, self.tel
        in_flight = None          # (block ref, add ref, size, trace context)
        weights_request = None    # (ref, start time, trace context, start time in ns)
        steps_since_sync = 0
        traffic = TrafficTally()
        traffic.start(tel.rl, self._sample_attrs)
        while not self._stop.is_set():
            with tel.unit():
                t0 = time.perf_counter()
                steps_before = actor.env_steps
                block, insert_context, step_ms, t1 = self._collect_block()
                t2 = time.perf_counter()
                steps_since_sync += c.actor_block_steps
                if in_flight is not None:
                    self._deliver(*in_flight)
                block_ref = _put(block)
                with otel.in_context(insert_context):
                    in_flight = (block_ref, call(self.replay.add, block_ref), len(block),
                                 insert_context)
                if weights_request is None and steps_since_sync >= c.weight_sync_period:
                    weights_request = (self.learner.get_weights.remote(actor.weights_version),
                                       time.perf_counter(), current_carrier(), time.time_ns())
                    steps_since_sync = 0
            if weights_request is not None and _ready(weights_request[0]):
                self._take_weights(*weights_request)
                weights_request = None
            self._record(traffic, actor.env_steps - steps_before, step_ms, t0, t1, t2)
        if in_flight is not None:
            self._deliver(*in_flight)
        traffic.flush(tel.rl, self._sample_attrs)
        tel.shutdown()
        return {**self.stats(), "exports": tel.export_outcomes()}  # counted after the last flush

    def _collect_block(self):
        """actor_block_steps steps of every env, folded: (block, the trace context its insert
        runs under, every env.step's time or None, the time the stepping ended)."""
        actor, tel, steps = self.actor, self.tel, self.config.actor_block_steps
        step_ms = tel.step_durations()  # every env.step's own time (None: not timed)
        with tel.span(otel.SPAN_SAMPLE, {otel.RL_SAMPLE_STEPS: steps,
                                         otel.RL_SAMPLE_BATCH_SIZE: self.config.envs_per_actor}) as span:
            actor.step(steps, step_ms)
            span.set_attribute(otel.RL_SAMPLE_EPISODES, len(actor.finished_returns))
        stepped = time.perf_counter()
        with tel.span(otel.SPAN_REWARD) as span:
            block = actor.fold()
            span.set_attribute(otel.RL_REWARD_BATCH_SIZE, len(block))
            insert_context = current_carrier()  # replay.insert is the fold's child
        return block, insert_context, step_ms, stepped

    def _take_weights(self, ref, started: float, sync_context, started_ns: int) -> None:
        """The learner's answer to a weights request: in use from now on, and the sync's span
        and duration from the request to here (the pull is asynchronous)."""
        update = _get(ref)
        if update is not None:
            self.actor.set_weights(update[1], update[0])
        size = sum(w.nbytes for w in update[1]) if update is not None else 0
        with otel.in_context(sync_context), self.tel.span(otel.SPAN_SYNC, {
                otel.RL_SYNC_SOURCE: "learner", otel.RL_SYNC_DESTINATION: self.tel.role,
                otel.RL_SYNC_BYTES: size}, started_ns):
            pass
        self.tel.rl.duration("rl.sync.duration", (time.perf_counter() - started) * 1e3,
                             self._sync_attrs)

    def _record(self, traffic: TrafficTally, env_steps: int, step_ms, t0: float, t1: float,
                t2: float) -> None:
        """One loop's episodes for stats(), and its durations and traffic for telemetry."""
        rl, attrs = self.tel.rl, self._sample_attrs
        returns, lengths = self.actor.pop_episode_stats()
        with self._lock:
            self._returns += returns
            self._lengths += lengths
        rl.duration("rl.sample.duration", (t1 - t0) * 1e3, attrs)
        for ms in step_sample(step_ms or []):
            rl.duration("rl.step.duration", ms, attrs)
        rl.duration("rl.reward.duration", (t2 - t1) * 1e3, attrs)
        rl.duration("rl.loop.duration", (time.perf_counter() - t0) * 1e3, attrs)
        # The env steps made: a vectorised env's reset steps are none (EnvBatch).
        traffic.add(env_steps, returns, lengths)
        if traffic.blocks >= TRAFFIC_FLUSH_BLOCKS:
            traffic.flush(rl, attrs)

    def _deliver(self, block_ref, add_ref, size: int, context: dict | None) -> None:
        """Wait until replay accepted the block, resending it if the rate limiter timed out;
        a resend carries the first send's trace context exactly (its insert is the fold's
        child too), none where the block was made outside a trace, whatever runs now."""
        while not _get(add_ref):
            if self._stop.is_set():
                return  # replay is closing: the run is over
            add_ref = self.replay.add.remote(block_ref, **{TRACE_KWARG: context})
        self.blocks_sent += 1
        self.transitions_sent += size

    @traced
    def stats(self) -> dict:
        self.tel.keep_for_next_unit()
        with self._lock:
            returns, lengths = self._returns, self._lengths
            self._returns, self._lengths = [], []
        return {"env_steps": self.actor.env_steps, "weights_version": self.actor.weights_version,
                "transitions_sent": self.transitions_sent, "episode_returns": returns,
                "episode_lengths": lengths, "cpu_s": time.process_time(), "pid": os.getpid(),
                "node_id": self.node_id, "first_step_time": self.actor.first_step_time,
                "epsilons": self.actor.epsilons.tolist()}  # what its env slots explore with

    def stop(self) -> None:
        self._stop.set()


class EvaluatorWorker(_ReportsExports):
    """Greedy evaluation (Atari: epsilon-greedy, eval_epsilon); its returns, not the actors',
    are the score. It keeps the best policy it has seen (confirm): the weights of an
    evaluation that beat it, played again on new episodes."""

    # Each evaluation k plays the episodes seeded seed + 10,000 k + i; the confirmations' come
    # from a range of their own.
    CONFIRM_SEEDS = 10**9

    def __init__(self, config: ApexConfig, policy_dir: str | None = None,
                 resumed_from: str | None = None):
        self.config = config
        self.spec = network_for(config)
        self.count = 0
        self.learner = None
        self.policy_dir = policy_dir  # where the kept best policy goes (best.npz)
        self.last: tuple | None = None  # (version, weights, its evaluation's mean)
        self.confirmed = 0
        # the kept best policy's record (not its weights): a resumed run's starts as the one
        # kept beside the checkpoint it resumed from, and is replaced only by a better one
        self.kept = kept_policy(resumed_from.rsplit("/", 1)[0]) if resumed_from else None
        on_sigterm(ask_learner_to_checkpoint(lambda: self.learner, "evaluator"))
        self.tel = ProcessTelemetry(config, "evaluator", self.spec)

    def set_learner(self, learner) -> None:
        """The learner to ask for a checkpoint when this process gets SIGTERM."""
        self.learner = learner

    def evaluate(self, versioned_weights, first_episodes: bool = False) -> dict:
        """Play eval_episodes with these weights; each evaluation plays new episodes, or with
        first_episodes those of the first (a resumed run's baseline plays them too)."""
        version, weights = versioned_weights
        seed = self.config.seed + 10_000 * (1 if first_episodes else self.count + 1)
        self.count += 0 if first_episodes else 1
        returns, lengths, epsilon = self._play(weights, self.config.eval_episodes, seed)
        self.tel.rl.set("rl.environment.reward.mean", float(returns.mean()), self.tel.attrs)
        self.tel.rl.set("rl.environment.episode.length.mean", float(lengths.mean()),
                        self.tel.attrs)
        self.last = (version, weights, float(returns.mean()))
        return {"weights_version": version, "returns": returns.tolist(),
                "lengths": lengths.tolist(), "mean_return": float(returns.mean()),
                "epsilon": epsilon,  # episodes cut at the cap count with the return they had
                "capped": int((lengths >= EVAL_MAX_STEPS).sum())}

    def confirm(self, version: int) -> dict | None:
        """Play the weights of the last evaluation (of weights `version`) again on
        best_eval_episodes new episodes; keep them as the best policy if that mean beats the
        kept one's, written to policy_dir/best.npz. Returns what it found (None: no such
        evaluation, or no best is kept)."""
        if self.last is None or self.last[0] != version or not self.config.best_eval_episodes:
            return None
        _, weights, first = self.last
        self.confirmed += 1
        seed = self.config.seed + self.CONFIRM_SEEDS + 10_000 * self.confirmed
        returns, _, _ = self._play(weights, self.config.best_eval_episodes, seed)
        mean = float(returns.mean())
        found = {"weights_version": version, "evaluated_return": first, "mean_return": mean,
                 "std": float(returns.std()), "episodes": len(returns), "seed": seed,
                 "previous": None if self.kept is None else self.kept["mean_return"]}
        kept = self.kept is None or mean > self.kept["mean_return"]
        if kept:
            path = None
            if self.policy_dir is not None:
                path = write_policy(self.policy_dir, {**found, "env_id": self.config.env_id,
                                                      "config": self.config.to_dict()}, weights)
            self.kept = {**found, "path": path, "this_run": True}
        return {**found, "kept": kept, "best": self.kept}

    def _play(self, weights, episodes: int, seed: int):
        epsilon = eval_epsilon(self.config.env_id)
        returns, lengths = evaluate_greedy(self.config.env_id, weights, episodes, seed,
                                           self.spec, epsilon=epsilon)
        return returns, lengths, epsilon

    def close(self) -> float:
        """Flush telemetry; returns the CPU seconds this process used."""
        self.tel.shutdown()
        return time.process_time()


# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8


def keep_freed_batches() -> bool:
    """Make this process keep the memory of freed batches for the next ones. glibc serves a
    block above its mmap threshold with a fresh mapping and unmaps it when freed; freeing one
    raises the threshold to its size, but a block of the same size still counts as above it.
    So a loop that makes batches of one size (a replay shard's gather, a learner's copies)
    faults every page of every 28 MB Pong batch in again: gathering one took 6.6-8.5 ms in a
    Ray actor, 3.5 with this (tests/test_apex.py counts the faults; benchmarks/learner_feed.py
    shows the rate). Blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap,
    and up to 128 MiB of free memory stays at its top. One arena for the threads made from now
    on, so that is 128 MiB a process, not 128 in each arena of a shard's thread per actor
    (benchmarks/head_memory.py measures the shards). False where the C library is not glibc
    (the defaults stay)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(param, value) for param, value in (
            (M_ARENA_MAX, 1), (M_TRIM_THRESHOLD, 128 << 20), (M_MMAP_THRESHOLD, 32 << 20)))
    except (OSError, AttributeError):
        return False


def _get(ref, timeout_s: float = PEER_TIMEOUT_S):
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError as e:
        raise PeerTimeout(f"no answer from a peer process within {timeout_s:g}s") from e


def _restarted() -> bool:
    """Whether this actor process is a restart (Ray re-ran its constructor)."""
    import warnings

    import ray

    # Ray 2.60's own property reads its deprecated `actor_id` inside (runtime_context.py) and
    # so prints a deprecation warning in every actor's output that we cannot act on.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def _peer(name: str):
    import ray

    return ray.get_actor(name)


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
