"""Telemetry adapters of the Ape-X processes: one ProcessTelemetry per Ray process, the
driver's per-iteration traces, and the actors' batched traffic counters.

Every method is a cheap no-op when telemetry is off, so the workers call them unconditionally.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

import numpy as np

from distrl.otel import conventions as otel
from distrl.rl.config import ApexConfig


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


def carrier_of(current_span) -> dict | None:
    if current_span is None:
        return None
    from opentelemetry import trace

    return otel.inject_context(trace.set_span_in_context(current_span))


# Each SDK call costs ~10 us; counters and gauges are summed over this many actor blocks
# (~40 ms) and recorded once, which halves the actor's telemetry cost. Latency histograms
# still get one observation per block.
TRAFFIC_FLUSH_BLOCKS = 8
# rl.step.duration: every env step is timed, and a uniform sample of them per block is
# recorded. Recording all (512 a block at defaults) cost more than the steps themselves
# (benchmarks/telemetry_overhead.py: 11 ms of recording per 9.5-ms block); a uniform sample
# keeps the distribution, so its p95/p99 still show the slow steps a block average hid.
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
        """End the last iteration's span, open the next one; returns its context carrier."""
        if not self.tel.enabled:
            return None
        self.end()
        self.iteration += 1
        self.started = time.perf_counter()
        self.root = self.tel.tracer.start_span(
            otel.SPAN_LOOP, attributes={**self.tel.attrs, otel.RL_LOOP_ITERATION: self.iteration})
        return carrier_of(self.root)

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


