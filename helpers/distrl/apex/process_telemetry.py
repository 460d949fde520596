"""Telemetry of the Ape-X processes: one ProcessTelemetry per Ray process, the trace context
that travels between them, the driver's per-iteration traces, the learner's metrics writer and
the actors' batched traffic counters.

With telemetry off, ProcessTelemetry holds OpenTelemetry's own no-op meter and tracer: the
workers record and trace unconditionally, and every call does nothing.

Traces: the driver opens one `rl.loop` span per iteration and sends its context with the next
stats() call; each worker then traces its next unit of work (one block, one learner step) under
it, so one trace shows the iteration across processes. Between processes the context travels
in one place: call() adds it to a remote call as the keyword `trace_context`, and a method
marked @traced runs under it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import socket
import threading
import time

import numpy as np
from opentelemetry import metrics, trace

from distrl.otel import conventions as otel
from distrl.rl.config import ApexConfig
from distrl.rl.network import NetworkSpec

TRACE_KWARG = "trace_context"


def current_carrier() -> dict | None:
    """The current span's context as a W3C carrier, or None when no unit is being traced."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    return otel.inject_context()


def call(method, *args, **kwargs):
    """method.remote(*args, **kwargs) for a @traced method of another process, carrying the
    current trace context (None when nothing is traced)."""
    return method.remote(*args, **kwargs, **{TRACE_KWARG: current_carrier()})


def traced(method):
    """Marks a Ray actor method that call() invokes: it runs under the caller's trace context,
    which arrives as the keyword `trace_context` and is not one of its own parameters. The
    signature Ray checks calls against gains that keyword."""
    signature = inspect.signature(method)
    extra = inspect.Parameter(TRACE_KWARG, inspect.Parameter.KEYWORD_ONLY, default=None)

    @functools.wraps(method)
    def run_under_callers_context(self, *args, trace_context: dict | None = None, **kwargs):
        with otel.in_context(trace_context):
            return method(self, *args, **kwargs)

    # Ray reads an actor method's signature from inspect.unwrap(method): without __wrapped__
    # it finds this one (ray/util/tracing/tracing_helper.py does the same for _ray_trace_ctx).
    del run_under_callers_context.__wrapped__
    run_under_callers_context.__signature__ = signature.replace(
        parameters=[*signature.parameters.values(), extra])
    return run_under_callers_context


class ProcessTelemetry:
    """The telemetry of one Ape-X process: its RL instruments (`rl`), its tracer, and the
    driver's context for its next traced unit of work."""

    def __init__(self, config: ApexConfig, role: str, spec: NetworkSpec,
                 index: int | None = None):
        self.role = role if index is None else f"{role}-{index}"
        self._next_unit: dict | None = None
        if config.telemetry:
            interval = (None if config.metric_export_interval_s is None
                        else int(config.metric_export_interval_s * 1000))
            self.telemetry = otel.setup_telemetry(
                instance_id=f"{self.role}-{os.getpid()}@{socket.gethostname()}",
                endpoint=config.otlp_endpoint, export_interval_ms=interval,
                resource_attributes={"service.component": role},
                token_file=config.otlp_token_file)
            meter, self.tracer = self.telemetry.meter, self.telemetry.tracer
        else:
            self.telemetry = None
            meter, self.tracer = metrics.NoOpMeter("distrl"), trace.NoOpTracer()
        self.rl = otel.RLInstruments(meter, otel.common_attributes(
            run_id=config.run_id or "unset", algorithm="apex-dqn", environment=config.env_id,
            model=spec.name))
        self.attrs = self.rl.attrs({otel.RL_LOOP: role})

    def keep_for_next_unit(self) -> None:
        """Called under the driver's iteration context (a @traced stats()): the next unit of
        work is traced under it."""
        if (carrier := current_carrier()) is not None:
            self._next_unit = carrier

    def unit(self):
        """Around one unit of work: the driver's iteration context, taken once, so only one
        unit per iteration is traced."""
        carrier, self._next_unit = self._next_unit, None
        return otel.in_context(carrier)

    def span(self, name: str, attributes: dict | None = None, start_time_ns: int | None = None):
        """A span, current while inside, when a unit is being traced; else a no-op span."""
        if not trace.get_current_span().get_span_context().is_valid:
            return contextlib.nullcontext(trace.INVALID_SPAN)
        return self.tracer.start_as_current_span(
            name, attributes={**self.attrs, **(attributes or {})}, start_time=start_time_ns)

    def step_durations(self) -> list[float] | None:
        """The list an actor appends every env step's time to; None (no timing) when off."""
        return [] if self.telemetry is not None else None

    def shutdown(self) -> None:
        if self.telemetry is not None:
            self.telemetry.shutdown(timeout_s=3.0)

    def export_outcomes(self) -> list[dict]:
        """What this process's exports came to (otel.export_outcomes); none with telemetry off."""
        return [] if self.telemetry is None else self.telemetry.export_outcomes()


# Every SDK call has a fixed cost, so counters and gauges are summed over this many actor
# blocks and recorded once. Latency histograms still get one observation per block.
# `python benchmarks/telemetry_overhead.py` measures the actor's telemetry cost.
TRAFFIC_FLUSH_BLOCKS = 8
# rl.step.duration: every env step is timed, and a uniform sample of them per block is
# recorded. Recording all (512 a block at defaults) would cost more than the steps themselves
# (`python benchmarks/telemetry_overhead.py` measures both); a uniform sample keeps the
# distribution, so its p95/p99 still show the slow steps a block average hid.
STEP_SAMPLES_PER_BLOCK = 4


def step_sample(durations_ms: list[float]) -> list[float]:
    """A uniform sample of a block's env-step times, to record."""
    import random

    if len(durations_ms) <= STEP_SAMPLES_PER_BLOCK:
        return durations_ms
    return random.sample(durations_ms, STEP_SAMPLES_PER_BLOCK)


class TrafficTally:
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

    @staticmethod
    def start(rl, attrs: dict) -> None:
        """The traffic counters' series exist from the process's first export on, at 0: a
        rate is then 0 while nothing flows (an actor blocked behind the rate limiter before its
        first flush), not an absent series, which no threshold condition sees."""
        for name in ("rl.sample.samples", "rl.sample.episodes"):
            rl.add(name, 0, attrs)

    def flush(self, rl, attrs: dict) -> None:
        if self.samples:
            rl.add("rl.sample.samples", self.samples, attrs)
        if self.returns:
            rl.add("rl.sample.episodes", len(self.returns), attrs)
            rl.set("rl.environment.reward.mean", float(np.mean(self.returns)), attrs)
            rl.set("rl.environment.episode.length.mean", float(np.mean(self.lengths)), attrs)
        self.reset()


class IterationTraces:
    """The driver's side of tracing: one root `rl.loop` span per driver iteration."""

    def __init__(self, tel: ProcessTelemetry, config: ApexConfig):
        self.tel, self.config = tel, config
        self.iteration = 0
        self.root = None
        self.started = 0.0

    def next_iteration(self) -> dict | None:
        """End the last iteration's span, open the next one; returns its context carrier (None
        when telemetry is off: the no-op tracer's span has no context to carry)."""
        self.end()
        self.iteration += 1
        self.started = time.perf_counter()
        self.root = self.tel.tracer.start_span(
            otel.SPAN_LOOP, attributes={**self.tel.attrs, otel.RL_LOOP_ITERATION: self.iteration})
        if not self.root.get_span_context().is_valid:
            return None
        return otel.inject_context(trace.set_span_in_context(self.root))

    def record_rates(self, env_steps_per_s: float) -> None:
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


TENSORBOARD_EVERY = 100  # learner updates between two TensorBoard points


class LearnerMetrics:
    """The one writer the learner's steps leave through, as Acme's learners write to a logger:
    each step's measurements go to the driver's stats, the RL instruments and (every
    TENSORBOARD_EVERY updates) TensorBoard, from the same dict."""

    def __init__(self, tel: ProcessTelemetry, tensorboard, flops_per_update: float,
                 peak_flops: float):
        self.tel, self.tensorboard = tel, tensorboard
        self.flops_per_update, self.peak_flops = flops_per_update, peak_flops
        self._lock = threading.Lock()
        # ready_time and first_update_time: time.time(), for the driver's timeline (the driver
        # is another process, maybe on another node).
        self._stats = {"updates": 0, "loss": float("nan"), "mean_q": float("nan"),
                       "wait_s": 0.0, "train_s": 0.0, "ready_time": None,
                       "first_update_time": None}

    def ready(self) -> None:
        self._stats["ready_time"] = time.time()

    def waited(self, seconds: float) -> None:
        """Time the learner waited for replay without training (warm-up, the rate limiter)."""
        with self._lock:
            self._stats["wait_s"] += seconds

    def write(self, m: dict) -> None:
        """One learner step: updates (the count after it), steps (updates it made), loss,
        mean_q, grad_norm, beta, wait_s, update_s (in the graph) and train_s (the whole step)."""
        with self._lock:
            s = self._stats
            s.update(updates=m["updates"], loss=m["loss"], mean_q=m["mean_q"])
            s["wait_s"] += m["wait_s"]
            s["train_s"] += m["train_s"]
            if s["first_update_time"] is None:
                s["first_update_time"] = time.time()
        rl, attrs, steps = self.tel.rl, self.tel.attrs, m["steps"]
        per_update_ms = m["update_s"] * 1e3 / steps  # the convention: one update's duration
        for _ in range(steps):
            rl.duration("rl.train.duration", per_update_ms, attrs)
        loop_s = m["wait_s"] + m["train_s"]
        rl.duration("rl.loop.duration", loop_s * 1e3, attrs)
        rl.add("rl.train.steps", steps, attrs)
        rl.set("rl.train.loss", m["loss"], attrs)
        rl.set("rl.train.mfu", otel.mfu(self.flops_per_update, steps / max(loop_s, 1e-9),
                                        self.peak_flops), attrs)
        if m["updates"] // TENSORBOARD_EVERY > (m["updates"] - steps) // TENSORBOARD_EVERY:
            import tensorflow as tf

            with self.tensorboard.as_default(step=m["updates"]):
                for name in ("loss", "mean_q", "grad_norm", "beta"):
                    tf.summary.scalar(f"learner/{name}", m[name])

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._stats)
