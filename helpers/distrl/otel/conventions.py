"""OpenTelemetry for RL: semantic-convention names, set-up, golden-signal instruments, spans.

    telemetry = setup_telemetry(service_name="rl-training-service")   # OTLP, one place
    rl = RLInstruments(telemetry.meter, common_attributes(run_id="r1", algorithm="apex-dqn",
                                                          environment="CartPole-v1",
                                                          model="dueling-mlp-64x64"))
    rl.duration("rl.sample.duration", 3.2, rl.attrs({RL_LOOP: "actor"}))
    with telemetry.tracer.start_as_current_span(SPAN_LOOP, attributes={RL_LOOP_ITERATION: 7}):
        carrier = inject_context()        # pass to a Ray remote call; the callee extracts it
    telemetry.shutdown()                  # flushes, bounded in time

The OTEL_* environment variables are honoured: OTEL_EXPORTER_OTLP_ENDPOINT (and the
_METRICS_/_TRACES_ variants), OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
OTEL_METRIC_EXPORT_INTERVAL and OTEL_SDK_DISABLED.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

from distrl import __version__
from distrl.otel.export_outcomes import CountedExporter
from distrl.otel.token import bearer_header

# --- RL semantic conventions: attribute keys -----------------------------------------------
RL_SYSTEM = "rl.system"
RL_SYSTEM_VERSION = "rl.system.version"
RL_RUN_ID = "rl.run.id"
RL_ALGORITHM = "rl.algorithm"
RL_ENVIRONMENT_NAME = "rl.environment.name"
RL_MODEL_NAME = "rl.model.name"
RL_LOOP = "rl.loop"
RL_LOOP_ITERATION = "rl.loop.iteration"
RL_SAMPLE = "rl.sample"
RL_SAMPLE_EPISODES = "rl.sample.episodes"
RL_SAMPLE_STEPS = "rl.sample.steps"
RL_SAMPLE_BATCH_SIZE = "rl.sample.batch_size"
RL_REWARD = "rl.reward"
RL_REWARD_BATCH_SIZE = "rl.reward.batch_size"
RL_REWARD_SANDBOX = "rl.reward.sandbox"
RL_TRAIN = "rl.train"
RL_TRAIN_STEPS = "rl.train.steps"
RL_TRAIN_BATCH_SIZE = "rl.train.batch_size"
RL_TRAIN_TOKENS = "rl.train.tokens"
RL_SYNC = "rl.sync"
RL_SYNC_BYTES = "rl.sync.bytes"
RL_SYNC_SOURCE = "rl.sync.source"
RL_SYNC_DESTINATION = "rl.sync.destination"

ATTRIBUTES = (RL_SYSTEM, RL_SYSTEM_VERSION, RL_RUN_ID, RL_ALGORITHM, RL_ENVIRONMENT_NAME,
              RL_MODEL_NAME, RL_LOOP, RL_LOOP_ITERATION, RL_SAMPLE, RL_SAMPLE_EPISODES,
              RL_SAMPLE_STEPS, RL_SAMPLE_BATCH_SIZE, RL_REWARD, RL_REWARD_BATCH_SIZE,
              RL_REWARD_SANDBOX, RL_TRAIN, RL_TRAIN_STEPS, RL_TRAIN_BATCH_SIZE, RL_TRAIN_TOKENS,
              RL_SYNC, RL_SYNC_BYTES, RL_SYNC_SOURCE, RL_SYNC_DESTINATION)
# The attributes on every metric point. rl.loop.iteration is on spans only: one new time
# series per iteration would be a cardinality problem in any metrics backend.
COMMON_ATTRIBUTES = (RL_SYSTEM, RL_SYSTEM_VERSION, RL_RUN_ID, RL_ALGORITHM, RL_ENVIRONMENT_NAME,
                     RL_MODEL_NAME)

# --- span names: one trace per loop iteration --------------------------------------------
SPAN_LOOP = "rl.loop"
SPAN_SAMPLE = "rl.sample"
SPAN_REWARD = "rl.reward"
SPAN_TRAIN = "rl.train"
SPAN_SYNC = "rl.sync"

# --- instruments: (name, unit, description) ---------------------------------------------
LATENCY_HISTOGRAMS = {
    "rl.loop.duration": "Duration of one iteration of a training loop",
    "rl.sample.duration": "Duration of collecting one block of environment steps",
    "rl.reward.duration": "Duration of computing returns (n-step folding) and priorities",
    "rl.train.duration": "Duration of one learner update",
    "rl.sync.duration": "Duration of one weight or priority synchronisation",
    "rl.step.duration": "Duration of one environment step",
}
COUNTERS = {
    "rl.sample.samples": ("{sample}", "Environment steps collected"),
    "rl.sample.episodes": ("{episode}", "Episodes finished"),
    "rl.train.steps": ("{step}", "Learner updates"),
    "rl.train.tokens": ("{token}", "Tokens trained on (token-based workloads)"),
}
GAUGES = {
    "rl.environment.reward.mean": ("1", "Mean episode return"),
    "rl.environment.episode.length.mean": ("{step}", "Mean episode length"),
    "rl.train.loss": ("1", "Learner loss"),
    "rl.train.mfu": ("1", "Model FLOPs utilisation: achieved FLOP/s over the device's peak"),
    "rl.samples.rate": ("{sample}/s", "Environment steps per second"),
    "rl.samples.rate_per_gpu": ("{sample}/s", "Environment steps per second per learner GPU"),
    "rl.tokens.rate": ("{token}/s", "Tokens per second (token-based workloads)"),
    "rl.tokens.rate_per_gpu": ("{token}/s", "Tokens per second per GPU (token-based workloads)"),
}
# Millisecond buckets from a vectorised env step's few microseconds a slot to multi-second loops.
# To a minute: a hang of a few seconds (notebook 05's fault: 12 s) stays inside a bucket, so its
# p99 is not cut at the last bound.
LATENCY_BUCKETS_MS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                      10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
                      25000.0, 60000.0)

DEFAULT_SERVICE_NAME = "rl-training-service"
DEFAULT_SERVICE_NAMESPACE = "distrl"
DEFAULT_EXPORT_INTERVAL_MS = 10_000
EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.grpc.exporter",
                    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
                    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                    "opentelemetry.sdk.metrics._internal.export",
                    "opentelemetry.sdk.trace.export")


class RateLimitFilter(logging.Filter):
    """Let at most `per_minute` records through per minute; count the rest and say so.

    With no collector listening, every exporter in every process logs a warning per retry;
    this keeps the log readable while still saying that exports are failing.
    """

    def __init__(self, per_minute: int = 2):
        super().__init__()
        self.per_minute = per_minute
        self.window_start = 0.0
        self.passed = 0
        self.suppressed = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self.window_start >= 60.0:
                if self.suppressed:
                    record.msg = f"{record.msg} ({self.suppressed} similar messages suppressed)"
                self.window_start, self.passed, self.suppressed = now, 0, 0
            if self.passed < self.per_minute:
                self.passed += 1
                return True
            self.suppressed += 1
            return False


_FILTER = RateLimitFilter()


def quiet_exporter_logs(per_minute: int = 2) -> RateLimitFilter:
    """Rate-limit the OTLP exporter's retry warnings in this process (idempotent)."""
    _FILTER.per_minute = per_minute
    for name in EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    return _FILTER


@dataclass
class Telemetry:
    """The providers of one process, and how to flush and stop them."""

    meter_provider: object
    tracer_provider: object
    resource: object | None
    enabled: bool
    exporters: tuple = ()  # the OTLP exporters setup_telemetry made (none for custom readers)
    endpoints: tuple[str, ...] = ()  # where they send (metrics and traces; one if the same)

    def export_outcomes(self) -> list[dict]:
        """What each OTLP exporter's exports came to: exported, failed, the first error."""
        return [exporter.outcome() for exporter in self.exporters]

    @property
    def meter(self):
        return self.meter_provider.get_meter("distrl", __version__)

    @property
    def tracer(self):
        return self.tracer_provider.get_tracer("distrl", __version__)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush what is pending and stop exporting, in at most about timeout_s seconds.

        Metrics and spans flush side by side. Where every endpoint is on this machine and
        refuses connections, nothing listens: the flush gets one attempt, not the exporter's
        retries (1 s, 2 s, ... within export_timeout_s), which would hold every process's stop
        for the whole timeout_s.
        Whatever is still exporting when the time is up is stopped, so no thread retries on
        in a process that lives on (a notebook's kernel)."""
        if not self.enabled:
            return
        if self.endpoints and all(map(nothing_listens_at, self.endpoints)):
            timeout_s = min(timeout_s, REFUSED_FLUSH_S)
        deadline = time.monotonic() + timeout_s

        def flush(shutdown):
            try:
                shutdown()
            except Exception as error:  # one failed flush must not stop the other or the caller
                logging.getLogger(__name__).warning("telemetry: %s", error)

        # The SDK's shutdowns can wait on exporter retries; never let them hold a process.
        flushes = [threading.Thread(target=flush, args=(shutdown,), daemon=True,
                                    name="otel-shutdown")
                   for shutdown in (self.tracer_provider.shutdown, lambda: self.meter_provider
                                    .shutdown(timeout_millis=timeout_s * 1000))]
        for flush in flushes:
            flush.start()
        for flush in flushes:
            flush.join(max(0.0, deadline - time.monotonic()))
        if any(flush.is_alive() for flush in flushes):
            for exporter in self.exporters:  # ends their retry waits and in-flight calls
                exporter.shutdown()


# The final flush's time where nothing listens: one export attempt each, no retries.
REFUSED_FLUSH_S = 0.5


def nothing_listens_at(endpoint: str) -> bool:
    """Whether `endpoint` (an OTLP URL) is on this machine and refuses a TCP connection now.

    Only a local endpoint is probed: a name is not resolved (that could wait on DNS), and a
    remote collector that refuses may be a pod restarting, for which the retries are meant.
    """
    import ipaddress
    from urllib.parse import urlsplit

    url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    host = url.hostname or ""
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
        port = url.port
    except ValueError:  # a name other than localhost, or a port out of range
        return False
    if not local or port is None:
        return False
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:  # a timeout, or no route: not known to be down
        return False


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def setup_telemetry(service_name: str | None = None, *, service_namespace: str | None = None,
                    instance_id: str | None = None, endpoint: str | None = None,
                    protocol: str | None = None, export_interval_ms: int | None = None,
                    export_timeout_s: float = 5.0,
                    resource_attributes: dict | None = None, metric_readers: list | None = None,
                    span_processors: list | None = None, token_file=None) -> Telemetry:
    """Metrics and traces over OTLP (gRPC or HTTP) for this process, wired in one place.

    service_name: argument, else OTEL_SERVICE_NAME, else "rl-training-service".
    endpoint: argument, else OTEL_EXPORTER_OTLP_{METRICS,TRACES}_ENDPOINT, else
    OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4317 (plain gRPC for http://).
    protocol: argument, else OTEL_EXPORTER_OTLP_PROTOCOL, else "grpc"; "http/protobuf" sends
    OTLP/HTTP to endpoint + /v1/metrics and /v1/traces (GKE's managed collector: port 4318).
    A gRPC endpoint without a scheme (`collector:4317`, as in many env blocks) means TLS in
    the OTel spec unless OTEL_EXPORTER_OTLP_INSECURE says otherwise; setup_telemetry refuses it
    rather than letting the exporter fail against a plaintext collector every minute.
    service_namespace: argument, else service.namespace in OTEL_RESOURCE_ATTRIBUTES, else
    "distrl" (Cloud Monitoring's `namespace` label comes from it).
    export_interval_ms: argument, else OTEL_METRIC_EXPORT_INTERVAL, else 10 s.
    token_file: a file with the bearer token the collector asks for (LocalCollector's
    token_file), sent as the authorization header; None: OTEL_EXPORTER_OTLP_HEADERS, if set.
    metric_readers / span_processors replace the OTLP ones (tests read values in memory).
    OTEL_SDK_DISABLED=true returns no-op providers: instruments exist and record nothing.
    The first providers set up in a process also become OpenTelemetry's global ones, so
    `trace.get_tracer(...)`, `metrics.get_meter(...)` and instrumentation libraries export
    through them (the API lets a process set its globals once).
    """
    from opentelemetry import metrics, trace

    if _env_flag("OTEL_SDK_DISABLED"):
        return Telemetry(metrics.NoOpMeterProvider(), trace.NoOpTracerProvider(), None, False)
    protocol = _checked_protocol(protocol, endpoint, export_interval_ms, export_timeout_s)
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    quiet_exporter_logs()
    resource = _resource(service_name, service_namespace, instance_id, resource_attributes)
    exporters, endpoints = [], []
    metric_exporter, span_exporter = _exporters(protocol, endpoint, export_timeout_s,
                                                bearer_header(token_file) or None)
    if metric_readers is None:
        exporters.append(CountedExporter(metric_exporter(), "metrics"))
        endpoints.append(_endpoint_of("METRICS", protocol, endpoint))
        metric_readers = [_periodic_reader(exporters[-1], export_interval_ms, export_timeout_s)]
    if span_processors is None:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporters.append(CountedExporter(span_exporter(), "spans"))
        endpoints.append(_endpoint_of("TRACES", protocol, endpoint))
        span_processors = [BatchSpanProcessor(
            exporters[-1], export_timeout_millis=int(export_timeout_s * 1000))]
    meter_provider = MeterProvider(resource=resource, metric_readers=metric_readers)
    tracer_provider = TracerProvider(resource=resource)
    for processor in span_processors:
        tracer_provider.add_span_processor(processor)
    _set_globals_once(meter_provider, tracer_provider)
    return Telemetry(meter_provider, tracer_provider, resource, True, tuple(exporters),
                     tuple(dict.fromkeys(endpoints)))


def _checked_protocol(protocol: str | None, endpoint: str | None,
                      export_interval_ms: int | None, export_timeout_s: float) -> str:
    """The OTLP protocol to use (argument, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc), once
    every argument and the endpoint variables the exporters will read are known to be valid."""
    if export_interval_ms is not None and export_interval_ms <= 0:
        raise ValueError(f"export_interval_ms={export_interval_ms!r} is invalid: expected > 0")
    if export_timeout_s <= 0:
        raise ValueError(f"export_timeout_s={export_timeout_s!r} is invalid: expected > 0")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"endpoint={endpoint!r} is invalid: expected http://host:port (plain "
                         "gRPC) or https://host:port (TLS), e.g. http://localhost:4317")
    protocol = protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r} (or OTEL_EXPORTER_OTLP_PROTOCOL) is invalid: "
                         f"expected one of {', '.join(PROTOCOLS)}")
    if endpoint is None:  # a given endpoint was checked above and wins over the env
        _check_env_schemes(protocol)
    return protocol


def _resource(service_name: str | None, service_namespace: str | None,
              instance_id: str | None, resource_attributes: dict | None):
    """The process's Resource: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, under the
    arguments, which win; a unique service.instance.id and the distrl namespace by default."""
    from opentelemetry.sdk.resources import Resource

    from_env = Resource.create({}).attributes  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    attributes = {"service.instance.id": instance_id or f"{socket.gethostname()}-{os.getpid()}-"
                                                        f"{uuid.uuid4().hex[:8]}"}
    if service_namespace or "service.namespace" not in from_env:
        attributes["service.namespace"] = service_namespace or DEFAULT_SERVICE_NAMESPACE
    attributes.update(resource_attributes or {})
    attributes["service.name"] = (service_name or os.environ.get("OTEL_SERVICE_NAME")
                                  or DEFAULT_SERVICE_NAME)
    # Resource.create adds OTEL_RESOURCE_ATTRIBUTES; explicit attributes win over it.
    return Resource.create(attributes)


def _periodic_reader(exporter, export_interval_ms: int | None, export_timeout_s: float):
    """The metric reader exporting every interval: the argument, else the SDK reads
    OTEL_METRIC_EXPORT_INTERVAL itself, else DEFAULT_EXPORT_INTERVAL_MS."""
    interval = export_interval_ms
    if interval is None and not os.environ.get("OTEL_METRIC_EXPORT_INTERVAL"):
        interval = DEFAULT_EXPORT_INTERVAL_MS
    return _fork_safe_reader_class()(exporter, export_interval_millis=interval,
                                     export_timeout_millis=export_timeout_s * 1000)


def _set_globals_once(meter_provider, tracer_provider) -> None:
    """Make these the process's global providers unless some were set already (the API
    refuses a second set with a warning)."""
    from opentelemetry import metrics, trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(tracer_provider)
    if type(metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider":
        metrics.set_meter_provider(meter_provider)


def _check_env_schemes(protocol: str) -> None:
    """Refuse an env endpoint the exporter would misread: for gRPC a scheme-less one without
    OTEL_EXPORTER_OTLP[_SIGNAL]_INSECURE (TLS by default, per the OTel spec's exporter
    configuration), for OTLP/HTTP one that is not a URL."""
    for signal in ("METRICS", "TRACES"):
        name, value = _env_endpoint(signal)
        if value is None or value.startswith(("http://", "https://")):
            continue
        where = f"{name}={value!r}"
        if protocol != "grpc":
            raise ValueError(f"{where} has no scheme: OTLP/HTTP needs a URL such as "
                             f"http://{value}")
        if not any(os.environ.get(n) for n in (f"OTEL_EXPORTER_OTLP_{signal}_INSECURE",
                                               "OTEL_EXPORTER_OTLP_INSECURE")):
            raise ValueError(f"{where} has no scheme, so the OTLP gRPC exporter would use TLS, "
                             "which a plaintext collector (the local one, GKE's managed one) "
                             f"refuses: write http://{value}, or set "
                             "OTEL_EXPORTER_OTLP_INSECURE=true (false: TLS)")


def _env_endpoint(signal: str) -> tuple[str | None, str | None]:
    """The variable that sets a signal's endpoint, and its value: the signal's own, else
    OTEL_EXPORTER_OTLP_ENDPOINT (OTel spec, exporter configuration); (None, None) if neither."""
    for name in (f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if os.environ.get(name):
            return name, os.environ[name]
    return None, None


def _endpoint_of(signal: str, protocol: str, endpoint: str | None) -> str:
    """Where a signal's exporter sends: the argument, else the environment, else the
    protocol's default."""
    return (endpoint or _env_endpoint(signal)[1]
            or ("http://localhost:4317" if protocol == "grpc" else "http://localhost:4318"))


PROTOCOLS = ("grpc", "http/protobuf")  # what the Python SDK's OTLP exporters speak


def _exporters(protocol: str, endpoint: str | None, timeout_s: float,
               headers: dict[str, str] | None = None):
    """Factories of the OTLP metric and span exporters for a protocol. Given an endpoint, the
    HTTP exporters need the full path; without one they add it to OTEL_EXPORTER_OTLP_ENDPOINT.
    headers: sent with every export (None: the exporters read OTEL_EXPORTER_OTLP_HEADERS)."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return (lambda: OTLPMetricExporter(endpoint=endpoint, timeout=timeout_s, headers=headers),
                lambda: OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s, headers=headers))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    base = endpoint.rstrip("/") if endpoint else None
    return (lambda: OTLPMetricExporter(endpoint=base and f"{base}/v1/metrics", timeout=timeout_s,
                                       headers=headers),
            lambda: OTLPSpanExporter(endpoint=base and f"{base}/v1/traces", timeout=timeout_s,
                                     headers=headers))


@functools.cache
def _fork_safe_reader_class():
    """PeriodicExportingMetricReader that stays stopped in forked children once shut down.

    The SDK restarts the export thread in every forked child (os.register_at_fork), even for
    a reader that was shut down; Ray forks helpers with preexec_fn, so each fork then logged
    "Exporter already shutdown, ignoring batch" from the dead reader.
    """
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    class ForkSafeReader(PeriodicExportingMetricReader):
        def _at_fork_reinit(self):
            if not self._shutdown:
                super()._at_fork_reinit()

    return ForkSafeReader


def common_attributes(*, run_id: str, algorithm: str, environment: str, model: str,
                      system: str = "distrl", system_version: str | None = None) -> dict:
    """The rl.* attributes every metric point carries."""
    return {RL_SYSTEM: system, RL_SYSTEM_VERSION: system_version or __version__,
            RL_RUN_ID: run_id, RL_ALGORITHM: algorithm, RL_ENVIRONMENT_NAME: environment,
            RL_MODEL_NAME: model}


class RLInstruments:
    """The golden-signal instruments of the RL conventions, created once per process.

    Latency: six histograms in ms. Traffic: four counters and the rate gauges. Errors: reward,
    episode length and loss gauges. Saturation: rl.train.mfu. Gauges are synchronous gauges
    (`.set()`), which is what a gauge is.
    """

    def __init__(self, meter, attributes: dict):
        missing = [k for k in COMMON_ATTRIBUTES if k not in attributes]
        if missing:
            raise ValueError(f"attributes lack {missing}; build them with common_attributes()")
        if RL_LOOP_ITERATION in attributes:
            raise ValueError(f"{RL_LOOP_ITERATION} belongs on spans, not on metric points "
                             "(one new time series per iteration)")
        self.attributes = dict(attributes)
        self.histograms = {
            name: meter.create_histogram(name, unit="ms", description=description,
                                         explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_MS)
            for name, description in LATENCY_HISTOGRAMS.items()}
        self.counters = {name: meter.create_counter(name, unit=unit, description=description)
                         for name, (unit, description) in COUNTERS.items()}
        self.gauges = {name: meter.create_gauge(name, unit=unit, description=description)
                       for name, (unit, description) in GAUGES.items()}
        self._cache: dict = {}

    def attrs(self, extra: dict | None = None) -> dict:
        """Common attributes plus extra ones, e.g. {RL_LOOP: "actor"}; cached per combination."""
        key = tuple(sorted((extra or {}).items()))
        cached = self._cache.get(key)
        if cached is None:
            if RL_LOOP_ITERATION in (extra or {}):
                raise ValueError(f"{RL_LOOP_ITERATION} belongs on spans, not on metric points")
            cached = self._cache[key] = {**self.attributes, **(extra or {})}
        return cached

    def duration(self, name: str, ms: float, attributes: dict) -> None:
        self.histograms[name].record(ms, attributes)

    def add(self, name: str, amount: int | float, attributes: dict) -> None:
        self.counters[name].add(amount, attributes)

    def set(self, name: str, value: float, attributes: dict) -> None:
        self.gauges[name].set(value, attributes)


# --- context propagation into Ray calls --------------------------------------------------

def inject_context(context=None) -> dict:
    """The current (or given) span context as a W3C traceparent carrier: a plain dict."""
    from opentelemetry import propagate

    carrier: dict = {}
    propagate.inject(carrier, context=context)
    return carrier


def extract_context(carrier: dict | None):
    from opentelemetry import propagate

    return propagate.extract(carrier or {})


@contextmanager
def in_context(carrier: dict | None):
    """While inside: the context of `carrier` (another process's span) is the current one, so
    spans started inside are its children. Nothing changes for an empty or None carrier."""
    if not carrier:
        yield
        return
    from opentelemetry import context

    token = context.attach(extract_context(carrier))
    try:
        yield
    finally:
        context.detach(token)


# --- model FLOPs utilisation ---------------------------------------------------------------

# Peak fp32 FLOP/s, stated so that MFU can be checked by hand; override with peak_flops.
# CPU: one core of the AVX-512 machine this was built on: 2 FMA units x 16 fp32 lanes x
# 2 FLOP x ~3.0 GHz. GPUs: NVIDIA data sheets, fp32 without tensor cores.
PEAK_FLOPS = {
    "cpu-core": 192e9,
    "NVIDIA L4": 30.3e12,
    "Tesla T4": 8.1e12,
    "Tesla P4": 5.5e12,
    "NVIDIA A100": 19.5e12,
    "NVIDIA H100": 67e12,
    "NVIDIA H200": 67e12,
}


def peak_flops_for(device_names: list[str], cpu_cores: float) -> float:
    """The stated peak of the learner's device: the first GPU listed, else cpu_cores cores."""
    for device in device_names:
        for name, peak in PEAK_FLOPS.items():
            if name != "cpu-core" and name.lower() in device.lower():
                return peak
    return PEAK_FLOPS["cpu-core"] * max(cpu_cores, 1.0)


def mfu(flops_per_update: float, updates_per_s: float, peak_flops: float) -> float:
    if peak_flops <= 0:
        raise ValueError(f"peak_flops={peak_flops!r} is invalid: expected > 0")
    return flops_per_update * updates_per_s / peak_flops
