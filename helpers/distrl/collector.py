"""The local observability backend: OTLP/gRPC (and, when asked, OTLP/HTTP) in, SQLite out.

    with LocalCollector("runs/otel.db", port=4317) as collector:   # a child process; or in a
                                                                   # shell: distrl collector --db
        ...  # any OpenTelemetry SDK exporting over OTLP/gRPC to localhost:4317 lands here
    store = CollectorStore("runs/otel.db")
    store.metric_types()                   # prometheus.googleapis.com/rl.loop.duration/histogram, ...

Every point and span of a request is committed to SQLite (one file, WAL) before the Export
call is acknowledged. Metrics are stored under the metric types Cloud Monitoring gives them
through GKE Managed OpenTelemetry: the OTel name keeps its dots and gets its kind appended
(`/histogram`, `/counter` for monotonic sums, `/gauge` for gauges and non-monotonic sums).
A point that is exported twice (an exporter retry) is stored once.

With http_port, the same store also takes OTLP/HTTP with protobuf bodies (POST /v1/metrics,
/v1/traces: what GKE's managed collector documents on its port 4318).

The gRPC port answers the part of Cloud Monitoring's MetricService API that distrl.monitoring
documents, so google-cloud-monitoring's own client reads what was stored.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import functools
import hmac
import ipaddress
import json
import math
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from concurrent import futures
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from distrl import monitoring
from distrl.config import field_help

METRIC_TYPE_PREFIX = "prometheus.googleapis.com/"
MiB = 2**20


@dataclass(frozen=True)
class Limits:
    """What bounds a long-running collector's memory and the cost of each read; printed at
    start. Memory peaks near memory_bound_bytes(): for each Export in flight on either receiver
    about 8 times its size (wire bytes, the parsed message, the rows; measured with
    benchmarks/collector_under_load.py), plus the caches."""

    # Each docstring is also the help of the field's `distrl collector` option.
    # 4 MiB: gRPC's and the OpenTelemetry Collector's default; an SDK export is kilobytes.
    max_message_bytes: int = 4 * MiB
    """largest Export request taken, either receiver"""
    max_exports: int = 8
    """concurrent Export calls per receiver; more are refused (RESOURCE_EXHAUSTED, HTTP 503),
    which exporters retry"""
    max_queries: int = 2
    """concurrent reads; more get RESOURCE_EXHAUSTED"""
    cache_bytes: int = 16 * MiB
    """attribute and resource caches of the writer"""
    page_cache_bytes: int = 64 * MiB
    """results kept for their next pages"""
    max_rows_scanned: int = 2_000_000
    """points one ListTimeSeries may read"""
    max_series_periods: int = 5_000_000
    """series x alignment periods of one ListTimeSeries"""
    max_query_s: float = 30.0
    """a read's own deadline in seconds (the client's, when shorter)"""

    def __post_init__(self):
        for name in ("max_message_bytes", "max_exports", "max_queries", "cache_bytes",
                     "page_cache_bytes", "max_rows_scanned", "max_series_periods"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: expected a positive integer")
        if not isinstance(self.max_query_s, (int, float)) or not 0 < self.max_query_s < 3600:
            raise ValueError(f"max_query_s={self.max_query_s!r} is invalid: expected seconds "
                             "in (0, 3600)")

    def memory_bound_bytes(self) -> int:
        return (2 * self.max_exports * self.max_message_bytes * 8 + self.cache_bytes
                + self.page_cache_bytes)

    def describe(self) -> str:
        return (f"limits: memory about {self.memory_bound_bytes() / MiB:,.0f} MiB at most above "
                f"the baseline; messages up to {self.max_message_bytes / MiB:g} MiB, "
                f"{self.max_exports} concurrent exports per receiver, {self.max_queries} "
                f"concurrent queries of at most {self.max_rows_scanned:,} points, "
                f"{self.max_series_periods:,} series x periods and {self.max_query_s:g} s, "
                f"caches {self.cache_bytes / MiB:g} MiB + pages {self.page_cache_bytes / MiB:g} "
                "MiB")


# Each Limits field as a command-line option of `distrl collector` (sizes in MiB), so that
# LocalCollector hands its child every limit it was given, not only some.
def _limit_flag(name: str) -> str:
    return "--" + (name.removesuffix("_bytes") + "_mib" if name.endswith("_bytes")
                   else name).replace("_", "-")


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    defaults, docs = Limits(), field_help(Limits)
    for f in dataclasses.fields(Limits):
        value = getattr(defaults, f.name)
        in_mib = f.name.endswith("_bytes")
        as_float = in_mib or isinstance(value, float)
        default = value / MiB if in_mib else value
        parser.add_argument(_limit_flag(f.name), dest=f.name, default=default,
                            type=float if as_float else int,
                            metavar="MIB" if in_mib else "S" if as_float else "N",
                            help=f"{' '.join(docs[f.name].split())} (default "
                                 f"{f'{default:g}' if as_float else f'{default:,}'}"
                                 f"{' MiB' if in_mib else ''})")


def limits_from(args: argparse.Namespace) -> Limits:
    """The Limits of parsed options; a bad value raises ValueError naming the limit."""
    return Limits(**{f.name: round(getattr(args, f.name) * MiB) if f.name.endswith("_bytes")
                     else getattr(args, f.name) for f in dataclasses.fields(Limits)})


def limit_argv(limits: Limits) -> list[str]:
    """The options that give a `distrl collector` process these limits (exact: MiB is a
    power of two, and repr() keeps every bit of a float)."""
    argv = []
    for f in dataclasses.fields(Limits):
        value = getattr(limits, f.name)
        argv += [_limit_flag(f.name), repr(value / MiB) if f.name.endswith("_bytes")
                 else repr(value)]
    return argv


SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    id INTEGER PRIMARY KEY,
    attributes TEXT NOT NULL UNIQUE,          -- JSON object, sorted keys
    service_name TEXT,
    service_instance_id TEXT
);
CREATE TABLE IF NOT EXISTS metric_descriptors (
    metric_type TEXT PRIMARY KEY,             -- prometheus.googleapis.com/<name>/<kind>
    name TEXT NOT NULL,                       -- the OTel instrument name
    kind TEXT NOT NULL,                       -- gauge | counter | histogram | summary
    metric_kind TEXT NOT NULL,                -- Cloud Monitoring: GAUGE | CUMULATIVE | DELTA
    value_type TEXT NOT NULL,                 -- DOUBLE | INT64 | DISTRIBUTION
    unit TEXT,
    description TEXT
);
CREATE TABLE IF NOT EXISTS points (
    id INTEGER PRIMARY KEY,
    metric_type TEXT NOT NULL,
    resource_id INTEGER NOT NULL REFERENCES resources(id),
    attributes TEXT NOT NULL,                 -- JSON object, sorted keys
    temporality INTEGER NOT NULL,             -- 0 none (gauge), 1 delta, 2 cumulative
    start_ns INTEGER NOT NULL,
    time_ns INTEGER NOT NULL,
    value REAL,                               -- gauges and sums
    int_value INTEGER,                        -- the exact value of integer points
    count INTEGER, sum REAL, min REAL, max REAL,   -- histograms
    bounds TEXT, bucket_counts TEXT,          -- explicit buckets, JSON arrays
    exponential TEXT,                         -- exponential buckets, JSON
    scope TEXT NOT NULL DEFAULT '',           -- the instrumentation scope's name
    -- a retry is stored once; two scopes may send the same attributes (two series)
    UNIQUE (metric_type, resource_id, scope, attributes, start_ns, time_ns)
);
CREATE TABLE IF NOT EXISTS metric_labels (  -- the label keys of each metric type, kept as
    metric_type TEXT NOT NULL,               -- points arrive (reading them from the points
    key TEXT NOT NULL,                       -- took seconds over 200k points)
    PRIMARY KEY (metric_type, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS points_by_type_time ON points (metric_type, time_ns);
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT,
    name TEXT NOT NULL, kind INTEGER, start_ns INTEGER, end_ns INTEGER,
    status_code INTEGER, status_message TEXT,
    attributes TEXT, events TEXT, resource_id INTEGER REFERENCES resources(id), scope TEXT,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_by_start ON spans (start_ns);
"""


def any_value(value):
    """An OTLP AnyValue as a JSON-able Python value (bytes become base64 text)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, kind)


class BoundedCache:
    """A dict of str/bytes keys whose keys and values together stay under max_bytes: emptied
    when full (a high-cardinality stream would otherwise grow it without end)."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes, self.items = max_bytes, 0, {}

    def get(self, key):
        return self.items.get(key)

    def put(self, key, value) -> None:
        size = len(key) + (len(value) if isinstance(value, (str, bytes)) else 8) + 100
        if self.bytes + size > self.max_bytes:
            self.items.clear()
            self.bytes = 0
        self.items[key] = value
        self.bytes += size

    def clear(self) -> None:
        self.items.clear()
        self.bytes = 0


_ATTRIBUTE_CACHE = BoundedCache(8 * 2**20)


def attributes_json(key_values) -> str:
    """Attributes as canonical JSON (sorted keys). Series repeat their attribute sets, so the
    JSON is cached by the attributes' wire bytes."""
    wire = b"".join(kv.SerializeToString() for kv in key_values)
    cached = _ATTRIBUTE_CACHE.get(wire)
    if cached is None:
        cached = json.dumps({kv.key: any_value(kv.value) for kv in key_values}, sort_keys=True,
                            separators=(",", ":"))
        _ATTRIBUTE_CACHE.put(wire, cached)
    return cached


def metric_type_of(name: str, kind: str) -> str:
    return f"{METRIC_TYPE_PREFIX}{name}/{kind}"


def _metric_kind(temporality: int) -> str:
    """Cloud Monitoring's metric kind of an OTLP sum or histogram stream."""
    return "DELTA" if temporality == 1 else "CUMULATIVE"


class InvalidPoint(ValueError):
    pass


MAX_ERROR_CHARS = 300  # a client's names and values are cut, so a refusal stays short


def _refusal(name: str, index: int, point, err: Exception) -> str:
    """partial_success.error_message for the first refused point: which point, which rule."""
    where = f"{name[:80]!r}{'...' if len(name) > 80 else ''} point {index} " \
            f"(time_unix_nano={point.time_unix_nano})"
    return f"{where}: {err}"[:MAX_ERROR_CHARS]


INT64_MAX = 2 ** 63 - 1  # SQLite's integers are signed 64-bit; OTLP's counts and times uint64
# Exponential histogram scales OTLP allows (opentelemetry.io/docs/specs/otel/metrics/
# data-model/#exponentialhistogram: "scale ... is restricted to the range [-10, 20]").
EXPONENTIAL_SCALES = range(-10, 21)


def _check_point(p, *numbers: tuple[str, float]) -> None:
    """The rules every stored point keeps: times and counts fit SQLite's signed 64 bits, and
    the values are finite (a NaN would be stored as NULL and break every read of its metric)."""
    for field in ("start_time_unix_nano", "time_unix_nano"):
        if getattr(p, field) > INT64_MAX:
            raise InvalidPoint(f"{field}={getattr(p, field)} is above 2^63-1")
    for label, value in numbers:
        if isinstance(value, int):
            if not 0 <= value <= INT64_MAX:
                raise InvalidPoint(f"{label}={value} is outside [0, 2^63-1]")
        elif value is not None and not math.isfinite(value):
            raise InvalidPoint(f"{label}={value} is not a finite number")


def _histogram_fields(p) -> tuple:
    bounds, counts = list(p.explicit_bounds), list(p.bucket_counts)
    _check_point(p, ("count", p.count), *(("bucket count", c) for c in counts),
                 *(("bound", b) for b in bounds), *((f, getattr(p, f)) for f in
                                                    ("sum", "min", "max") if p.HasField(f)))
    if counts and len(counts) != len(bounds) + 1:
        raise InvalidPoint(f"histogram point has {len(counts)} bucket counts for {len(bounds)} "
                           f"bounds; expected {len(bounds) + 1}")
    if counts and sum(counts) != p.count:
        raise InvalidPoint(f"histogram point count {p.count} != sum of bucket counts {sum(counts)}")
    if any(lo >= hi for lo, hi in zip(bounds, bounds[1:])):
        raise InvalidPoint(f"histogram bounds {str(bounds)[:120]} are not strictly increasing")
    return (p.count, p.sum if p.HasField("sum") else None, p.min if p.HasField("min") else None,
            p.max if p.HasField("max") else None, _bounds_json(tuple(bounds)), json.dumps(counts),
            None)


@functools.lru_cache(maxsize=1024)
def _bounds_json(bounds: tuple) -> str:
    return json.dumps(list(bounds))


def _exponential_fields(p) -> tuple:
    if p.scale not in EXPONENTIAL_SCALES:
        raise InvalidPoint(f"exponential histogram scale {p.scale} is outside [-10, 20]")
    _check_point(p, ("count", p.count), ("zero_count", p.zero_count),
                 *(("bucket count", c) for c in (*p.positive.bucket_counts,
                                                 *p.negative.bucket_counts)),
                 ("zero_threshold", p.zero_threshold),
                 *((f, getattr(p, f)) for f in ("sum", "min", "max") if p.HasField(f)))
    total = (p.zero_count + sum(p.positive.bucket_counts) + sum(p.negative.bucket_counts))
    if total != p.count:
        raise InvalidPoint(f"exponential histogram count {p.count} != zero + bucket counts {total}")
    exponential = {"scale": p.scale, "zero_count": p.zero_count,
                   "zero_threshold": p.zero_threshold,
                   "positive": {"offset": p.positive.offset, "counts": list(p.positive.bucket_counts)},
                   "negative": {"offset": p.negative.offset, "counts": list(p.negative.bucket_counts)}}
    return (p.count, p.sum if p.HasField("sum") else None, p.min if p.HasField("min") else None,
            p.max if p.HasField("max") else None, None, None, json.dumps(exponential))


class CollectorStore:
    """The SQLite file: written by the collector, read by anyone (WAL allows both at once)."""

    def __init__(self, path: str | Path, *, create: bool = False, limits: Limits | None = None):
        self.path = Path(path)
        self.limits = limits or Limits()
        if not create and not self.path.exists():
            raise FileNotFoundError(f"no collector database at {self.path}; start one with "
                                    f"`distrl collector --db {self.path}`")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if create and not self.path.exists():
            # Readable by its owner only; SQLite gives the -wal and -shm files the same mode.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        self.conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
        self.conn.row_factory = sqlite3.Row
        if create:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL: commits need no fsync
            # Checkpoints (which do fsync) every ~80 MB of WAL instead of every 4 MB.
            self.conn.execute("PRAGMA wal_autocheckpoint=20000")
            had_labels = self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = "
                                           "'metric_labels'").fetchone()
            self.conn.executescript(SCHEMA)
            if not had_labels:  # a file written before the table existed
                self.conn.execute("INSERT OR IGNORE INTO metric_labels SELECT DISTINCT "
                                  "p.metric_type, j.key FROM points p, json_each(p.attributes) j")
            self.conn.commit()
        self._readers = threading.local()  # one read-only connection per reading thread
        self._reader_conns: list[sqlite3.Connection] = []
        _ATTRIBUTE_CACHE.max_bytes = self.limits.cache_bytes // 2
        self._resource_ids = BoundedCache(self.limits.cache_bytes // 4)
        self._labelled = BoundedCache(self.limits.cache_bytes // 4)  # (type, attributes) seen
        self._descriptors: set[str] = set()
        self._jobs: queue.Queue = queue.Queue()
        self._writer = None
        if create:
            self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                            name="collector-writer")
            self._writer.start()

    def close(self) -> None:
        if self._writer is not None:
            self._jobs.put(None)  # the writer commits what is queued, then stops
            self._writer.join()
            self._writer = None
        for conn in self._reader_conns:
            conn.close()
        self._reader_conns.clear()
        self.conn.close()

    # ---- writing (the collector) ----

    def resource_id(self, attributes: str) -> int:
        rid = self._resource_ids.get(attributes)
        if rid is None:
            parsed = json.loads(attributes)
            self.conn.execute(
                "INSERT OR IGNORE INTO resources (attributes, service_name, service_instance_id)"
                " VALUES (?, ?, ?)", (attributes, parsed.get("service.name"),
                                      parsed.get("service.instance.id")))
            rid = self.conn.execute("SELECT id FROM resources WHERE attributes = ?",
                                    (attributes,)).fetchone()[0]
            self._resource_ids.put(attributes, rid)
        return rid

    def _descriptor(self, metric_type, name, kind, metric_kind, value_type, unit, description):
        if metric_type not in self._descriptors:
            self.conn.execute("INSERT OR IGNORE INTO metric_descriptors VALUES (?,?,?,?,?,?,?)",
                              (metric_type, name, kind, metric_kind, value_type, unit,
                               description))
            self._descriptors.add(metric_type)

    def write_metrics(self, request) -> tuple[int, int, str]:
        """Store a request's points; returns (stored, rejected, error) once committed."""
        return self._submit(self._insert_metrics, request)

    def write_spans(self, request) -> tuple[int, int, str]:
        """Store a request's spans; returns (stored, rejected, error) once committed."""
        return self._submit(self._insert_spans, request)

    # Group commit: one writer thread drains every request waiting at that moment and commits
    # them together, so concurrent exporters share a commit instead of queueing for one each.
    # Each request's reply still waits for the commit that holds its rows.

    def _submit(self, insert, request):
        future: futures.Future = futures.Future()
        self._jobs.put((insert, request, future))
        return future.result()

    def _write_loop(self) -> None:
        while True:
            jobs = [self._jobs.get()]
            while len(jobs) < 256:
                try:
                    jobs.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            stop = any(job is None for job in jobs)
            jobs = [job for job in jobs if job is not None]
            done = []
            # The writer is this thread alone; reads use their own connections.
            try:
                for insert, request, future in jobs:
                    # One savepoint per request: a request that fails half-way leaves
                    # nothing stored, and the others in this commit are unaffected.
                    self.conn.execute("SAVEPOINT request")
                    try:
                        value = insert(request)
                    except Exception as err:  # a request we cannot store: only it fails
                        self.conn.execute("ROLLBACK TO request")
                        self.conn.execute("RELEASE request")
                        self._forget()  # rows inserted in the rolled-back part
                        future.set_exception(err)
                        continue
                    self.conn.execute("RELEASE request")
                    done.append((future, value))
                self.conn.commit()
            except BaseException as err:
                self.conn.rollback()
                self._forget()  # rows inserted in the rolled-back transaction
                for future, _ in done:
                    future.set_exception(err)
                done = []
            for future, value in done:
                future.set_result(value)
            if stop:
                return

    def _forget(self) -> None:
        self._resource_ids.clear()
        self._labelled.clear()
        self._descriptors.clear()

    def _labels(self, metric_type: str, attributes: str) -> None:
        """Record the label keys of a point's attributes (once per attribute set)."""
        key = f"{metric_type}\n{attributes}"
        if self._labelled.get(key) is None:
            self.conn.executemany("INSERT OR IGNORE INTO metric_labels VALUES (?, ?)",
                                  [(metric_type, k) for k in json.loads(attributes)])
            self._labelled.put(key, 1)

    def _insert_metrics(self, request) -> tuple[int, int, str]:
        rows, rejected, error = [], 0, ""
        for rm in request.resource_metrics:
            rid = self.resource_id(attributes_json(rm.resource.attributes))
            for sm in rm.scope_metrics:
                scope = sm.scope.name
                for metric in sm.metrics:
                    bad, msg = self._metric_rows(metric, rid, scope, rows)
                    rejected += bad
                    error = error or msg
        for row in rows:
            self._labels(row[0], row[2])
        self.conn.executemany(
            "INSERT OR IGNORE INTO points (metric_type, resource_id, attributes, "
            "temporality, start_ns, time_ns, value, int_value, count, sum, min, max, "
            "bounds, bucket_counts, exponential, scope) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        return len(rows), rejected, error

    def _metric_rows(self, metric, rid, scope, rows) -> tuple[int, str]:
        data = metric.WhichOneof("data")
        name, unit, description = metric.name, metric.unit, metric.description
        rejected, error = 0, ""
        if data in ("gauge", "sum"):
            points = getattr(metric, data).data_points
            temporality = metric.sum.aggregation_temporality if data == "sum" else 0
            if data == "sum" and metric.sum.is_monotonic:
                kind, metric_kind = "counter", _metric_kind(temporality)
            else:
                kind, metric_kind = "gauge", "GAUGE"
            is_int = bool(points) and points[0].WhichOneof("value") == "as_int"
            metric_type = metric_type_of(name, kind)
            self._descriptor(metric_type, name, kind, metric_kind,
                             "INT64" if is_int and kind == "gauge" else "DOUBLE", unit,
                             description)
            for i, p in enumerate(points):
                which = p.WhichOneof("value")
                int_value = p.as_int if which == "as_int" else None
                value = float(p.as_int) if which == "as_int" else p.as_double
                try:
                    _check_point(p, ("value", None if which == "as_int" else value))
                except InvalidPoint as err:
                    rejected += 1
                    error = error or _refusal(name, i, p, err)
                    continue
                rows.append((metric_type, rid, attributes_json(p.attributes), temporality,
                             p.start_time_unix_nano, p.time_unix_nano, value, int_value,
                             None, None, None, None, None, None, None, scope))
            return rejected, error
        if data in ("histogram", "exponential_histogram"):
            container = getattr(metric, data)
            metric_type = metric_type_of(name, "histogram")
            self._descriptor(metric_type, name, "histogram",
                             _metric_kind(container.aggregation_temporality), "DISTRIBUTION",
                             unit, description)
            fields = _histogram_fields if data == "histogram" else _exponential_fields
            for i, p in enumerate(container.data_points):
                try:
                    extra = fields(p)
                except InvalidPoint as err:
                    rejected += 1
                    error = error or _refusal(name, i, p, err)
                    continue
                rows.append((metric_type, rid, attributes_json(p.attributes),
                             container.aggregation_temporality, p.start_time_unix_nano,
                             p.time_unix_nano, None, None, *extra, scope))
            return rejected, error
        if data == "summary":
            metric_type = metric_type_of(name, "summary")
            self._descriptor(metric_type, name, "summary", "GAUGE", "DOUBLE", unit, description)
            for p in metric.summary.data_points:
                quantiles = {str(q.quantile): q.value for q in p.quantile_values}
                rows.append((metric_type, rid, attributes_json(p.attributes), 0,
                             p.start_time_unix_nano, p.time_unix_nano, None, None, p.count,
                             p.sum, None, None, None, None, json.dumps(quantiles), scope))
            return 0, ""
        return 1, f"{name[:80]!r}: metric without data"

    def _insert_spans(self, request) -> tuple[int, int, str]:
        rows, rejected, error = [], 0, ""
        for rs in request.resource_spans:
            rid = self.resource_id(attributes_json(rs.resource.attributes))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    # OTLP: trace ids are 16 bytes, span ids 8, never all zero.
                    problem = ("trace_id is not 16 bytes of which one is not zero"
                               if len(s.trace_id) != 16 or not any(s.trace_id) else
                               "span_id is not 8 bytes of which one is not zero"
                               if len(s.span_id) != 8 or not any(s.span_id) else
                               "a time is above 2^63-1"
                               if max(s.start_time_unix_nano, s.end_time_unix_nano) > INT64_MAX
                               else None)
                    if problem:
                        rejected += 1
                        error = error or f"span {s.name[:60]!r}: {problem}"[:MAX_ERROR_CHARS]
                        continue
                    events = [{"name": e.name, "time_ns": e.time_unix_nano,
                               "attributes": json.loads(attributes_json(e.attributes))}
                              for e in s.events]
                    rows.append((s.trace_id.hex(), s.span_id.hex(),
                                 s.parent_span_id.hex() or None, s.name, s.kind,
                                 s.start_time_unix_nano, s.end_time_unix_nano, s.status.code,
                                 s.status.message, attributes_json(s.attributes),
                                 json.dumps(events), rid, ss.scope.name))
        self.conn.executemany("INSERT OR REPLACE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                              rows)
        return len(rows), rejected, error

    # ---- reading ----

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._readers, "conn", None)
        if conn is None:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                   check_same_thread=False, timeout=30)
            conn.row_factory = sqlite3.Row
            self._readers.conn = conn
            self._reader_conns.append(conn)
        return conn

    def rows(self, sql: str, params: tuple = (), interrupt=None):
        """Rows as dicts, read on this thread's own read-only connection: with WAL a read
        never holds up the writer. interrupt(), when given, is asked every few thousand SQLite
        steps; a true answer ends the query with sqlite3.OperationalError("interrupted")."""
        conn = self._reader()
        conn.set_progress_handler(interrupt, 5_000)
        cursor = conn.execute(sql, params)
        try:
            for row in cursor:
                yield dict(row)
        finally:
            cursor.close()  # ends the read transaction, also when the caller stops early
            conn.set_progress_handler(None, 0)

    def query(self, sql: str, params: tuple = (), interrupt=None) -> list[dict]:
        return list(self.rows(sql, params, interrupt))

    def metric_types(self) -> list[dict]:
        """Every metric type with its kind, unit, label keys and point count."""
        out = self.query("SELECT d.*, (SELECT COUNT(*) FROM points p WHERE p.metric_type = "
                         "d.metric_type) AS points FROM metric_descriptors d ORDER BY metric_type")
        for row in out:
            row["label_keys"] = self.label_keys(row["metric_type"])
        return out

    def label_keys(self, metric_type: str) -> list[str]:
        """Every attribute key the points of a metric type carry, sorted."""
        try:
            return [r["key"] for r in self.query(
                "SELECT key FROM metric_labels WHERE metric_type = ? ORDER BY key",
                (metric_type,))]
        except sqlite3.OperationalError:  # a file from before the table: read the points
            keys: set = set()
            for r in self.rows("SELECT DISTINCT attributes FROM points WHERE metric_type = ?",
                               (metric_type,)):
                keys |= set(json.loads(r["attributes"]))
            return sorted(keys)

    def points(self, metric_type: str, where: dict | None = None) -> list[dict]:
        """Points of one metric type (attributes and resource decoded), oldest first, filtered
        in SQL by exact attribute values (None: the attribute is absent)."""
        sql = ("SELECT p.*, r.attributes AS resource FROM points p JOIN resources r ON "
               "r.id = p.resource_id WHERE metric_type = ?")
        params: list = [metric_type]
        for key, value in (where or {}).items():
            if not isinstance(key, str) or '"' in key or "\\" in key or \
                    not isinstance(value, (str, int, float, bool, type(None))):
                raise ValueError(f"where={{{key!r}: {value!r}}} is invalid: expected attribute "
                                 "keys without double quotes and str, number, bool or None values")
            sql += " AND json_extract(p.attributes, ?) IS ?"  # the key is a bound value
            params += [f'$."{key}"', value]
        rows = self.query(sql + " ORDER BY time_ns, p.id", tuple(params))
        for row in rows:
            row["attributes"] = json.loads(row["attributes"])
            row["resource"] = json.loads(row["resource"])
            for key in ("bounds", "bucket_counts", "exponential"):
                if row[key] is not None:
                    row[key] = json.loads(row[key])
        return rows

    def spans(self, trace_id: str | None = None) -> list[dict]:
        sql = ("SELECT s.*, r.attributes AS resource FROM spans s JOIN resources r ON "
               "r.id = s.resource_id")
        rows = self.query(sql + (" WHERE trace_id = ?" if trace_id else "") + " ORDER BY start_ns",
                          (trace_id,) if trace_id else ())
        for row in rows:
            row["attributes"] = json.loads(row["attributes"])
            row["resource"] = json.loads(row["resource"])
            row["events"] = json.loads(row["events"])
        return rows


def _stored(context, write, request):
    """write(request), or an UNAVAILABLE status (the exporter retries) if SQLite failed."""
    try:
        return write(request)
    except sqlite3.Error as err:
        context.abort(grpc.StatusCode.UNAVAILABLE, f"storage failed: {err}")


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, store: CollectorStore):
        self.store = store

    def Export(self, request, context):  # noqa: N802 (gRPC method name)
        return _response("metrics", _stored(context, self.store.write_metrics, request))


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, store: CollectorStore):
        self.store = store

    def Export(self, request, context):  # noqa: N802
        return _response("traces", _stored(context, self.store.write_spans, request))


def _response(kind: str, stored: tuple[int, int, str]):
    """The Export reply of either receiver: partial_success names what was refused."""
    _, rejected, error = stored
    if kind == "metrics":
        response = metrics_service_pb2.ExportMetricsServiceResponse()
        if rejected:
            response.partial_success.rejected_data_points = rejected
    else:
        response = trace_service_pb2.ExportTraceServiceResponse()
        if rejected:
            response.partial_success.rejected_spans = rejected
    if rejected:
        response.partial_success.error_message = error
    return response


def _http_handler(store: CollectorStore, token: str | None):
    """OTLP/HTTP, binary protobuf (opentelemetry.io/docs/specs/otlp/#otlphttp): the same
    writes as the gRPC services; 400 for a body that does not parse, 401 without the bearer
    token (when one is set), 503 with Retry-After (the exporter retries) when storage failed
    or max_exports requests are already being read."""
    routes = {"/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, "metrics"),
              "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, "traces")}
    limits = store.limits
    turns = threading.BoundedSemaphore(limits.max_exports)
    expected = f"Bearer {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        timeout = 30  # a client that stops sending mid-request does not hold a thread forever

        def do_POST(self):  # noqa: N802 (http.server's method name)
            if expected and not hmac.compare_digest(
                    self.headers.get("Authorization", "").encode(), expected):
                return self._reply(HTTPStatus.UNAUTHORIZED, b"missing or wrong bearer token")
            if not turns.acquire(timeout=5):
                return self._reply(HTTPStatus.SERVICE_UNAVAILABLE,
                                   f"{limits.max_exports} exports are being read; retry".encode())
            try:
                self._export()
            finally:
                turns.release()

        def _export(self):
            route = routes.get(self.path.split("?")[0])
            if route is None:
                return self._reply(HTTPStatus.NOT_FOUND, b"POST /v1/metrics or /v1/traces")
            if self.headers.get("Content-Type", "").split(";")[0] != "application/x-protobuf":
                return self._reply(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                                   b"Content-Type must be application/x-protobuf")
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or int(length) > limits.max_message_bytes:
                return self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE if length.isdigit()
                                   else HTTPStatus.LENGTH_REQUIRED,
                                   f"Content-Length up to {limits.max_message_bytes} bytes"
                                   .encode())
            message_type, kind = route
            request = message_type()
            try:
                request.ParseFromString(self.rfile.read(int(length)))
            except DecodeError as err:
                return self._reply(HTTPStatus.BAD_REQUEST, f"not an OTLP message: {err}".encode())
            try:
                write = store.write_metrics if kind == "metrics" else store.write_spans
                response = _response(kind, write(request))
            except sqlite3.Error as err:
                return self._reply(HTTPStatus.SERVICE_UNAVAILABLE, f"storage failed: {err}".encode())
            self._reply(HTTPStatus.OK, response.SerializeToString(), "application/x-protobuf")

        def _reply(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain"):
            self.send_response(status)
            if status == HTTPStatus.SERVICE_UNAVAILABLE:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # no line per request on stderr
            pass

    return Handler


class _BearerToken(grpc.ServerInterceptor):
    """Every gRPC call needs `authorization: Bearer <token>` metadata (what OTel exporters send
    with OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<token>)."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()
        self.deny = grpc.unary_unary_rpc_method_handler(
            lambda request, context: context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                                   "missing or wrong bearer token"))

    def intercept_service(self, continuation, details):
        got = dict(details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(str(got).encode(), self.expected):
            return continuation(details)
        return self.deny


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | Path) -> str:
    """A bearer token from a file (a file, not an argument: arguments show in `ps`)."""
    path = Path(token_file)
    try:
        token = path.read_text().strip()
    except OSError as err:
        raise ValueError(f"token_file={str(path)!r} cannot be read: {err.strerror}") from None
    if len(token) < 16 or any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"token_file={str(path)!r} must hold one token of at least 16 "
                         "printable characters without spaces")
    return token


def _check_port(port) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port={port!r} is invalid: expected an integer in [0, 65535] "
                         "(0 picks a free port)")


class CollectorServer:
    """The OTLP/gRPC receiver (metrics and traces) storing into SQLite, in this process.

    Ray's own gRPC clients stall when a gRPC server runs in the same process, so notebooks
    and the training driver use LocalCollector, which runs this server in a child process.
    """

    def __init__(self, db_path: str | Path = "otel.db", *, host: str = "127.0.0.1",
                 port: int = 4317, http_port: int | None = None, allow_remote: bool = False,
                 token_file: str | Path | None = None, limits: Limits | None = None):
        _check_port(port)
        if http_port is not None:
            _check_port(http_port)
        if not is_loopback(host) and allow_remote is not True:
            raise ValueError(f"host={host!r} is not a loopback address: the collector has no "
                             "TLS, and anyone who reaches the port could write and read it; "
                             "pass allow_remote=True (--allow-remote), ideally with a "
                             "token_file, to listen there anyway")
        self.db_path = Path(db_path)
        self.host, self.port, self.http_port = host, port, http_port
        self.token = read_token(token_file) if token_file is not None else None
        self.limits = limits or Limits()
        self.store: CollectorStore | None = None
        self.server = None
        self.http_server: ThreadingHTTPServer | None = None

    @property
    def http_endpoint(self) -> str | None:
        """OTLP/HTTP base URL (exporters add /v1/metrics, /v1/traces); None when not asked."""
        return None if self.http_port is None else f"http://{self.host}:{self.http_port}"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> CollectorServer:
        if not is_loopback(self.host):
            print(f"WARNING: the collector listens on {self.host}, beyond this machine, without "
                  "TLS; " + ("every call needs the bearer token" if self.token else
                             "WITHOUT a token: anyone who reaches it can write and read"),
                  file=sys.stderr, flush=True)
        self.store = CollectorStore(self.db_path, create=True, limits=self.limits)
        calls = self.limits.max_exports + self.limits.max_queries + 2
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=calls),
                             interceptors=[_BearerToken(self.token)] if self.token else [],
                             maximum_concurrent_rpcs=calls,  # past it: RESOURCE_EXHAUSTED
                             options=[("grpc.max_receive_message_length",
                                       self.limits.max_message_bytes),
                                      ("grpc.so_reuseport", 0)])
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _MetricsService(self.store), server)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self.store),
                                                                  server)
        server.add_generic_rpc_handlers((monitoring.grpc_handler(self.store),))
        try:
            bound = server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError:
            bound = 0
        if not bound:
            self.store.close()
            raise OSError(f"cannot listen on {self.host}:{self.port}: is something else "
                          "listening there? (use another port, or port 0 for a free one)")
        self.port = bound
        server.start()
        self.server = server
        if self.http_port is not None:
            try:
                self.http_server = ThreadingHTTPServer((self.host, self.http_port),
                                                       _http_handler(self.store, self.token))
            except OSError as err:
                self.stop()
                raise OSError(f"cannot listen for OTLP/HTTP on {self.host}:{self.http_port}: "
                              f"{err}") from None
            self.http_server.daemon_threads = True
            self.http_port = self.http_server.server_address[1]
            threading.Thread(target=self.http_server.serve_forever, daemon=True).start()
        return self

    def stop(self, grace_s: float = 2.0) -> None:
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server.server_close()
            self.http_server = None
        if self.server is not None:
            self.server.stop(grace_s).wait()
            self.server = None
        if self.store is not None:
            self.store.close()
            self.store = None


class LocalCollector:
    """The local collector as a child process: `with LocalCollector("otel.db") as c: ...`.

    start() returns once the child listens (c.endpoint has the real port when port=0);
    stop() ends it with SIGTERM after it has committed what it acknowledged.
    """

    def __init__(self, db_path: str | Path = "otel.db", *, host: str = "127.0.0.1",
                 port: int = 4317, start_timeout_s: float = 30.0, http_port: int | None = None,
                 allow_remote: bool = False, token_file: str | Path | None = None,
                 limits: Limits | None = None):
        # The server checks the same again; checked here too, so the error is raised here.
        CollectorServer(db_path, host=host, port=port, http_port=http_port,
                        allow_remote=allow_remote, token_file=token_file)
        self.db_path = Path(db_path)
        self.host, self.port, self.http_port = host, port, http_port
        self.allow_remote, self.token_file = allow_remote, token_file
        self.limits = limits or Limits()
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen | None = None
        self.banner = ""  # the child's "listening" line, once started

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def http_endpoint(self) -> str | None:
        """OTLP/HTTP base URL when started with http_port, else None."""
        return None if self.http_port is None else f"http://{self.host}:{self.http_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> LocalCollector:
        if self.running:
            return self
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "distrl.collector", "--db", str(self.db_path),
               "--host", self.host, "--port", str(self.port)]
        if self.http_port is not None:
            cmd += ["--http-port", str(self.http_port)]
        if self.allow_remote:
            cmd.append("--allow-remote")
        if self.token_file is not None:
            cmd += ["--token-file", str(self.token_file)]
        cmd += limit_argv(self.limits)
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        line = _read_line(self.process.stdout, self.start_timeout_s)
        match = re.search(r"listening on http://[^:]+:(\d+)", line or "")
        if not match:
            self.process.kill()
            _, err = self.process.communicate(timeout=10)
            self.process = None
            raise OSError(f"the collector did not start: {(err or line or 'no output').strip()}")
        self.banner = line.strip()  # where it listens, and its limits
        self.port = int(match.group(1))
        if self.http_port is not None:
            self.http_port = int(re.search(r"OTLP/HTTP on http://[^:]+:(\d+)", line).group(1))
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            stream.close()
        self.process = None

    def store(self) -> CollectorStore:
        return CollectorStore(self.db_path)

    def __enter__(self) -> LocalCollector:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _read_line(stream, timeout_s: float) -> str | None:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return result[0] if result else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distrl collector",
                                     description="Receive OTLP/gRPC metrics and traces into SQLite; "
                                     "answer Cloud Monitoring MetricService queries on the same port.")
    parser.add_argument("--db", default="otel.db", help="SQLite file (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=4317, help="port to listen on (0: any free)")
    parser.add_argument("--http-port", type=int, default=None,
                        help="also take OTLP/HTTP (protobuf) on this port (0: any free)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host other than loopback (no TLS: use --token-file)")
    parser.add_argument("--token-file", default=None,
                        help="file holding a bearer token every call must send "
                             "(OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%%20<token>)")
    add_limit_options(parser)
    args = parser.parse_args(argv)
    # Reads are Python work holding the interpreter lock; a shorter switch interval than the
    # default 5 ms hands it to the writer and the export threads sooner (export p99 under
    # query load: benchmarks/collector_under_load.py).
    sys.setswitchinterval(0.001)
    # Handlers first: whoever reads the "listening" line may send SIGTERM at once.
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        limits = limits_from(args)
        collector = CollectorServer(args.db, host=args.host, port=args.port,
                                    http_port=args.http_port, allow_remote=args.allow_remote,
                                    token_file=args.token_file, limits=limits).start()
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    http = f" and OTLP/HTTP on {collector.http_endpoint}" if collector.http_endpoint else ""
    print(f"collector listening on {collector.endpoint}{http}, storing into "
          f"{Path(args.db).resolve()}; {limits.describe()}", flush=True)
    stopped.wait()
    collector.stop()
    print("collector stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
