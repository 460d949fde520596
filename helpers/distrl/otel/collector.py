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
A point that is exported twice (an exporter retry) is stored once; a second, different value
of a series at a stored time is refused, as is a point that no read could use (a summary, a
non-finite value, buckets beyond a double): each in the reply's partial_success, naming it.

No client takes the exports' capacity: the gRPC receiver runs on one asyncio loop, where a
call waiting for its message or a reader holds no thread; a call has MESSAGE_WAIT_S to send its
message before it takes a turn (exports and reads each have their own), a caller without the
token (when one is set) is refused at its headers, and a failed commit (a full disk) is
answered UNAVAILABLE, which exporters retry. One collector writes a database (_lock_writer).

With http_port, the same store also takes OTLP/HTTP with protobuf bodies (POST /v1/metrics,
/v1/traces: what GKE's managed collector documents on its port 4318).

The gRPC port answers the part of Cloud Monitoring's MetricService API that distrl.otel.monitoring
documents, so google-cloud-monitoring's own client reads what was stored.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import functools
import hmac
import ipaddress
import itertools
import json
import math
import os
import queue
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import zlib
from concurrent import futures
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from distrl.otel import monitoring
from distrl.rl.config import field_help

METRIC_TYPE_PREFIX = "prometheus.googleapis.com/"
MiB = 2**20


# Calls still receiving their message, at most, beside the admitted exports and reads (each a
# coroutine, holding at most one message); calls one HTTP/2 connection may have open; seconds
# after which an idle connection is closed.
# 8 calls a connection (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: a client's further calls
# wait in the client, none is refused): at 32, three connections of calls that sent headers
# and no message held every slot of the server (maximum_concurrent_rpcs).
RECEIVING_CALLS, STREAMS_PER_CONNECTION, CONNECTION_IDLE_S = 32, 8, 300
# gRPC takes message sizes as 32-bit integers; more than 256 threads is no local collector.
LIMIT_MAXIMA = {"max_message_bytes": 2**31 - 1, "max_exports": 256, "max_queries": 256}


@dataclass(frozen=True)
class Limits:
    """What bounds a long-running collector's memory and the cost of each read; printed at
    start. Memory stays under memory_bound_bytes() above the baseline of the collector and its
    reader processes: for each Export in flight on either receiver about 8 times its size
    (wire bytes, the parsed message, the rows; `python benchmarks/collector_under_load.py`
    measures it), max_read_bytes for each read, and the caches (tests/test_collector.py
    measures both)."""

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
    """points (or metric descriptors) one read may scan"""
    max_read_bytes: int = 128 * MiB
    """memory one read may hold (the series and points it has read, estimated as it reads)"""
    max_metric_types: int = 10_000
    """metric types the store takes; points of a new one past it are refused"""
    max_series_periods: int = 5_000_000
    """series x alignment periods of one ListTimeSeries"""
    max_query_s: float = 30.0
    """a read's own deadline in seconds (the client's, when shorter)"""
    max_wal_bytes: int = 128 * MiB
    """write-ahead log length the writer keeps to: it starts the log again from half this
    length when no read holds it, and past 4x stops the reads on it to do so (readers'
    overlapping snapshots kept it growing); a file that grew past 4x is cut back to it"""

    def __post_init__(self):
        for name in ("max_message_bytes", "max_exports", "max_queries", "cache_bytes",
                     "page_cache_bytes", "max_rows_scanned", "max_read_bytes", "max_metric_types",
                     "max_series_periods", "max_wal_bytes"):
            value, most = getattr(self, name), LIMIT_MAXIMA.get(name, 2**62)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
                if name.endswith("_bytes") and isinstance(value, (int, float)):
                    raise ValueError(f"{name}={value!r} ({value / MiB:g} MiB) is invalid: "
                                     f"expected 1 byte to {most / MiB:g} MiB")
                raise ValueError(f"{name}={value!r} is invalid: expected an integer from 1 to "
                                 f"{most:,}")
        if not isinstance(self.max_query_s, (int, float)) or not 0 < self.max_query_s < 3600:
            raise ValueError(f"max_query_s={self.max_query_s!r} is invalid: expected seconds "
                             "in (0, 3600)")

    def memory_bound_bytes(self) -> int:
        # Exports: about 8 times the message for each one stored at once, on either receiver
        # (`python benchmarks/collector_under_load.py` measures it); a call still receiving,
        # a read waiting for a reader, an HTTP body arriving: one message each. Reads: what
        # each may hold, and answers their clients have not read yet. Then the caches.
        receiving = self.max_queries + READ_QUEUE + 2 * RECEIVING_CALLS
        unread = UNREAD_ANSWER_BYTES + self.max_queries * ANSWER_MAX_BYTES
        return ((2 * self.max_exports * 8 + receiving) * self.max_message_bytes
                + self.max_queries * self.max_read_bytes + unread + self.cache_bytes
                + self.page_cache_bytes)

    def max_calls(self) -> int:
        """gRPC calls open at once: the admitted exports and reads, the reads waiting for a
        reader and the calls still receiving their message."""
        return self.max_exports + self.max_queries + READ_QUEUE + RECEIVING_CALLS

    def describe(self) -> str:
        return (f"limits: memory about {self.memory_bound_bytes() / MiB:,.0f} MiB at most above "
                f"the baseline; messages up to {self.max_message_bytes / MiB:g} MiB, "
                f"{self.max_exports} concurrent exports per receiver, {self.max_queries} "
                f"concurrent queries of at most {self.max_rows_scanned:,} points, "
                f"{self.max_read_bytes / MiB:g} MiB, {self.max_series_periods:,} series x "
                f"periods and {self.max_query_s:g} s, {self.max_metric_types:,} metric types, "
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
        try:  # NaN and infinities are no JSON: SQLite's json functions would refuse every read
            cached = json.dumps({kv.key: any_value(kv.value) for kv in key_values},
                                sort_keys=True, separators=(",", ":"), allow_nan=False)
        except ValueError:
            raise InvalidPoint("an attribute's value is NaN or infinite, which JSON (and so "
                               "the store) cannot hold") from None
        _ATTRIBUTE_CACHE.put(wire, cached)
    return cached


def metric_type_of(name: str, kind: str) -> str:
    return f"{METRIC_TYPE_PREFIX}{name}/{kind}"


def _metric_kind(temporality: int) -> str:
    """Cloud Monitoring's metric kind of an OTLP sum or histogram stream."""
    return "DELTA" if temporality == 1 else "CUMULATIVE"


class InvalidPoint(ValueError):
    pass


class StorageUnavailable(Exception):
    """The store could not commit (a full disk, an I/O error, a stopped writer): the Export
    is answered UNAVAILABLE (HTTP 503), which exporters retry."""


# How long an Export waits for the commit holding its rows before it is answered UNAVAILABLE.
COMMIT_WAIT_S = 20.0
# How often the checkpointer looks at the WAL; how long a restart waits for the reads on the
# log (exports wait meanwhile), and how long once they are being stopped; how long reads are
# refused, at most, while the writer starts a log past four times max_wal_bytes again.
WAL_CHECK_S, RESTART_WAIT_MS, STOP_WAIT_MS, STOP_READS_S = 0.1, 10, 200, 2.0
RESTART_TAIL_BYTES = 4 * MiB  # at most this much is left to copy when the log restarts
# A thread of its own copies the log's pages back to the database as they are written,
# beside the writer, which starts the log again with a few pages left to copy. SQLite's
# automatic checkpoint copied ~80 MB inside a COMMIT every ~0.8 s beside 4 exporters, and
# every export waited for it (~105 ms; benchmarks/collector_under_load.py).

# OpenTelemetry's instrument names: "a maximum length of 255 characters"
# (opentelemetry.io/docs/specs/otel/metrics/api/#instrument-name-syntax).
MAX_NAME_CHARS = 255


MAX_ERROR_CHARS = 300  # a client's names and values are cut, so a refusal stays short


def _kinds(metric, data: str, temporality: int, points) -> tuple[str, str, str]:
    """(kind, metric kind, value type) of an OTLP metric: a gauge or a non-monotonic sum is a
    GAUGE, a monotonic sum a counter, a histogram a DISTRIBUTION; an integer gauge is INT64
    (from its first point), every other number DOUBLE."""
    if data == "gauge" or (data == "sum" and not metric.sum.is_monotonic):
        kind, metric_kind = "gauge", "GAUGE"
    elif data == "sum":
        kind, metric_kind = "counter", _metric_kind(temporality)
    else:
        kind, metric_kind = "histogram", _metric_kind(temporality)
    if kind == "histogram":
        return kind, metric_kind, "DISTRIBUTION"
    is_int = bool(points) and points[0].WhichOneof("value") == "as_int"
    return kind, metric_kind, "INT64" if is_int and kind == "gauge" else "DOUBLE"


def _refusal(name: str, index: int, point, err: Exception) -> str:
    """partial_success.error_message for the first refused point: which point, which rule."""
    where = f"{name[:80]!r}{'...' if len(name) > 80 else ''} point {index} " \
            f"(time_unix_nano={point.time_unix_nano})"
    return f"{where}: {err}"[:MAX_ERROR_CHARS]


INT64_MAX = 2 ** 63 - 1  # SQLite's integers are signed 64-bit; OTLP's counts and times uint64
# Exponential histogram scales OTLP allows (opentelemetry.io/docs/specs/otel/metrics/
# data-model/#exponentialhistogram: "scale ... is restricted to the range [-10, 20]").
EXPONENTIAL_SCALES = range(-10, 21)
# A point this far ahead of the collector's clock is refused: a clock that wrong, or a unit
# mistake (microseconds for nanoseconds is 1,000 times ahead), would sit at the end of every
# read. (This bound is the collector's own; clocks of one machine agree far better.)
FUTURE_NS = 24 * 3600 * 10**9
# Caps on what a metric point carries, each refused per point (partial_success). Cloud
# Monitoring's own system limits, for comparison (cloud.google.com/monitoring/quotas): 200
# histogram buckets per custom distribution metric, label keys of 100 characters and values of
# 1,024, 30 labels per user-defined metric descriptor (Managed Service for Prometheus takes
# more). The caps let every OpenTelemetry SDK default through (an exponential histogram keeps
# up to 160 buckets a side) and bound any one series header, so that a read's response stays
# under a client's 4 MiB (monitoring.MAX_RESPONSE_BYTES plus the largest header).
MAX_BUCKETS = 1_000
MAX_KEY_CHARS, MAX_VALUE_CHARS = 100, 1_024
MAX_LABEL_KEYS = 100  # per metric type, and per resource


def _check_labels(attributes: dict, what: str) -> None:
    """InvalidPoint unless the attributes (parsed from attributes_json) keep the caps above."""
    if len(attributes) > MAX_LABEL_KEYS:
        raise InvalidPoint(f"{what} has {len(attributes):,} attributes; at most "
                           f"{MAX_LABEL_KEYS}")
    for key, value in attributes.items():
        if len(key) > MAX_KEY_CHARS:
            raise InvalidPoint(f"{what}'s attribute key {key[:40]!r}... has {len(key):,} "
                               f"characters; at most {MAX_KEY_CHARS}")
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > MAX_VALUE_CHARS:
            raise InvalidPoint(f"{what}'s attribute {key[:40]!r} has a value of {len(text):,} "
                               f"characters; at most {MAX_VALUE_CHARS}")


def _check_point(p, *numbers: tuple[str, float]) -> None:
    """The rules every stored point keeps: times and counts fit SQLite's signed 64 bits, and
    the values are finite (a NaN would be stored as NULL and break every read of its metric)."""
    for field in ("start_time_unix_nano", "time_unix_nano"):
        if getattr(p, field) > INT64_MAX:
            raise InvalidPoint(f"{field}={getattr(p, field)} is above 2^63-1")
    if p.start_time_unix_nano > p.time_unix_nano:  # 0: no start (gauges)
        raise InvalidPoint(f"start_time_unix_nano={p.start_time_unix_nano} is after "
                           f"time_unix_nano={p.time_unix_nano}: an interval cannot end before "
                           "it starts")
    if p.time_unix_nano > time.time_ns() + FUTURE_NS:
        raise InvalidPoint(f"time_unix_nano={p.time_unix_nano} is more than a day ahead of "
                           "the collector's clock")
    for label, value in numbers:
        if isinstance(value, int):
            if not 0 <= value <= INT64_MAX:
                raise InvalidPoint(f"{label}={value} is outside [0, 2^63-1]")
        elif value is not None and not math.isfinite(value):
            raise InvalidPoint(f"{label}={value} is not a finite number")


def _check_buckets(buckets: int) -> None:
    if buckets > MAX_BUCKETS:  # before anything is built for them
        raise InvalidPoint(f"the histogram point has {buckets:,} buckets; at most {MAX_BUCKETS}")


def _histogram_fields(p) -> tuple:
    _check_buckets(max(len(p.bucket_counts), len(p.explicit_bounds) + 1))
    bounds, counts = list(p.explicit_bounds), list(p.bucket_counts)
    _check_point(p, ("count", p.count), *(("bucket count", c) for c in counts),
                 *(("bound", b) for b in bounds), *((f, getattr(p, f)) for f in
                                                    ("sum", "min", "max") if p.HasField(f)))
    if bounds and not counts:
        raise InvalidPoint(f"histogram point has {len(bounds)} bounds and no bucket counts; "
                           "expected none of either, or one count more than bounds")
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
    _check_buckets(len(p.positive.bucket_counts) + len(p.negative.bucket_counts) + 1)
    _check_point(p, ("count", p.count), ("zero_count", p.zero_count),
                 *(("bucket count", c) for c in (*p.positive.bucket_counts,
                                                 *p.negative.bucket_counts)),
                 ("zero_threshold", p.zero_threshold),
                 *((f, getattr(p, f)) for f in ("sum", "min", "max") if p.HasField(f)))
    # Read as explicit bounds 2^(index / 2^scale) (series.dist_of): each must be a
    # normal double.
    low = p.positive.offset * 2.0 ** -p.scale
    high = (p.positive.offset + len(p.positive.bucket_counts)) * 2.0 ** -p.scale
    if low < -1022 or high > 1023:
        raise InvalidPoint(f"exponential buckets from 2^{low:g} to 2^{high:g} (scale {p.scale}, "
                           f"offset {p.positive.offset}) reach beyond a double's 2^-1022 to "
                           "2^1023")
    total = (p.zero_count + sum(p.positive.bucket_counts) + sum(p.negative.bucket_counts))
    if total != p.count:
        raise InvalidPoint(f"exponential histogram count {p.count} != zero + bucket counts {total}")
    exponential = {"scale": p.scale, "zero_count": p.zero_count,
                   "zero_threshold": p.zero_threshold,
                   "positive": {"offset": p.positive.offset, "counts": list(p.positive.bucket_counts)},
                   "negative": {"offset": p.negative.offset, "counts": list(p.negative.bucket_counts)}}
    return (p.count, p.sum if p.HasField("sum") else None, p.min if p.HasField("min") else None,
            p.max if p.HasField("max") else None, None, None, json.dumps(exponential))


SQLITE_HEADER = b"SQLite format 3\x00"  # sqlite.org/fileformat.html, "The Database Header"
OUR_TABLES = {"resources", "metric_descriptors", "points", "metric_labels", "spans"}


def _check_db_file(path: Path) -> None:
    """A collector writes only a new file or its own database: never a directory, another
    kind of file, or another program's SQLite database (it would add tables and switch it to
    WAL)."""
    if path.is_dir():
        raise ValueError(f"db={str(path)!r} is a directory; expected a database file (made "
                         "if missing)")
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as err:
        raise ValueError(f"db={str(path)!r} cannot be read: {err.strerror}") from None
    if header != SQLITE_HEADER:
        raise ValueError(f"db={str(path)!r} is not a SQLite database; expected a collector's "
                         "database or a new file")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error as err:
        raise ValueError(f"db={str(path)!r} cannot be read as SQLite: {err}") from None
    others = tables - OUR_TABLES
    if others or (tables and not {"points", "metric_descriptors"} <= tables):
        raise ValueError(f"db={str(path)!r} is another program's SQLite database (tables "
                         f"{', '.join(sorted(tables))[:120]}); expected a collector's database "
                         "or a new file")


def _lock_writer(path: Path):
    """An exclusive lock on `<db>.lock`, naming this process: one collector writes a database.
    The kernel drops it when the process ends, however it ends."""
    import fcntl

    lock_path = path.with_name(path.name + ".lock")
    try:
        # held open for the store's life; private, as the database is
        lock = os.fdopen(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600), "r+")
    except OSError as err:
        raise ValueError(f"db={str(path)!r} cannot be used: {err.strerror}: {lock_path}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise ValueError(f"db={str(path)!r} is being written by another collector (pid "
                         f"{holder}); stop it, or give this one another --db") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


class CollectorStore:
    """The SQLite file: written by the collector, read by anyone (WAL allows both at once)."""

    def __init__(self, path: str | Path, *, create: bool = False, limits: Limits | None = None):
        self.path = Path(path)
        self.limits = limits or Limits()
        if not create and not self.path.exists():
            raise FileNotFoundError(f"no collector database at {self.path}; start one with "
                                    f"`distrl collector --db {self.path}`")
        if create:
            _check_db_file(self.path)
        self._lock = _lock_writer(self.path) if create else None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if create and not self.path.exists():
                # Readable by its owner only; SQLite gives the -wal and -shm files the same mode.
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            # isolation_level=None: the writer begins and commits its transactions itself.
            self.conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30,
                                        isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            if create:
                self._create()
        except (OSError, sqlite3.Error) as err:
            if self._lock is not None:
                self._lock.close()
            raise ValueError(f"db={str(self.path)!r} cannot be used: "
                             f"{getattr(err, 'strerror', None) or err}") from None
        self._readers = threading.local()  # one read-only connection per reading thread
        self._reader_conns: list[sqlite3.Connection] = []
        _ATTRIBUTE_CACHE.max_bytes = self.limits.cache_bytes // 2
        self._resource_ids = BoundedCache(self.limits.cache_bytes // 8)
        self._labelled = BoundedCache(self.limits.cache_bytes // 8)  # (type, attributes) seen
        self._descriptors = BoundedCache(self.limits.cache_bytes // 8)  # type -> value type
        self._life_bounds = BoundedCache(self.limits.cache_bytes // 8)  # cumulative bounds
        self._jobs: queue.Queue = queue.Queue()
        self._wal_path = self.path.with_name(self.path.name + "-wal")
        self.interrupt_reads = None  # a multiprocessing Event: _Calls gives its readers
        self._checkpointing = threading.Lock()  # one checkpoint at a time
        self._restartable = 0  # the log's bytes, when the last copy left few to copy
        self._retry_at = 0  # after a restart a read held up: the length to try again at
        self._stopping_since = None  # reads are stopped (_stop_reads)
        self._restarted_frames = -1  # the frames of a log that restarts at the next commit
        self._writer = self._checkpointer = None
        self._closing = threading.Event()
        if create:
            self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                            name="collector-writer")
            self._writer.start()
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, daemon=True,
                                                  name="collector-checkpointer")
            self._checkpointer.start()

    def _create(self) -> None:
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL: commits need no fsync
        # No checkpoint inside a commit (_checkpoint_loop, _restart_log). A file that grew
        # past 4 x max_wal_bytes while reads held the log is cut back to that size when the
        # log starts again (sqlite.org/pragma.html#pragma_journal_size_limit).
        self.conn.execute("PRAGMA wal_autocheckpoint=0")
        self.conn.execute(f"PRAGMA journal_size_limit={4 * self.limits.max_wal_bytes}")
        had_labels = self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = "
                                       "'metric_labels'").fetchone()
        self.conn.executescript(SCHEMA)
        if not had_labels:  # a file written before the table existed
            self.conn.execute("INSERT OR IGNORE INTO metric_labels SELECT DISTINCT "
                              "p.metric_type, j.key FROM points p, json_each(p.attributes) j")
        self.conn.commit()

    def close(self) -> None:
        if self._checkpointer is not None:
            self._closing.set()
            self._checkpointer.join(COMMIT_WAIT_S)
            self._checkpointer = None
        if self._writer is not None:
            self._jobs.put(None)  # the writer commits what is queued, then stops
            self._writer.join(COMMIT_WAIT_S)
            if self._writer.is_alive():  # stuck in SQLite: its connection stays open
                return
            self._writer = None
        for conn in self._reader_conns:
            conn.close()
        self._reader_conns.clear()
        self.conn.close()
        if self._lock is not None:
            self._lock.close()  # the lock goes with the file descriptor
            self._lock = None

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

    def _descriptor(self, metric_type, name, kind, metric_kind, value_type, unit,
                    description) -> str:
        """The metric type's value type: the stored descriptor's, or this one's, stored now.
        Raises InvalidPoint for a new metric type past max_metric_types."""
        known = self._descriptors.get(metric_type)
        if known is None:
            row = self.conn.execute("SELECT value_type FROM metric_descriptors WHERE "
                                    "metric_type = ?", (metric_type,)).fetchone()
            if row is None:
                count = self.conn.execute("SELECT COUNT(*) FROM metric_descriptors").fetchone()[0]
                if count >= self.limits.max_metric_types:
                    raise InvalidPoint(f"the store holds {count:,} metric types, its limit "
                                       "(max_metric_types); a new one is refused")
                self.conn.execute("INSERT INTO metric_descriptors VALUES (?,?,?,?,?,?,?)",
                                  (metric_type, name, kind, metric_kind, value_type, unit,
                                   description))
            known = row[0] if row else value_type
            self._descriptors.put(metric_type, known)
        return known

    def write_metrics(self, request) -> tuple[int, int, str]:
        """Store a request's points; returns (stored, rejected, error) once committed."""
        return self._submit(self._insert_metrics, request)

    def write_spans(self, request) -> tuple[int, int, str]:
        """Store a request's spans; returns (stored, rejected, error) once committed."""
        return self._submit(self._insert_spans, request)

    # Group commit: one writer thread drains every request waiting at that moment and commits
    # them in one transaction, so concurrent exporters share a commit instead of queueing for
    # one each. Each request's reply waits for the commit that holds its rows, and every
    # request of a commit gets an answer, also when the commit fails.

    def _submit(self, insert, request):
        if self._writer is None:
            raise StorageUnavailable("the store is closed")
        future: futures.Future = futures.Future()
        self._jobs.put((insert, request, future))
        try:
            return future.result(timeout=COMMIT_WAIT_S)
        except futures.TimeoutError:
            # The rows may still be committed later; a retry of them is then stored once.
            raise StorageUnavailable(f"the store did not commit within {COMMIT_WAIT_S:g} s"
                                     ) from None

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
            if jobs:
                self._commit(jobs)
                self._restart_log()
            if stop:
                return

    def _checkpoint_loop(self) -> None:
        """Copies the log's new pages back to the database every WAL_CHECK_S that anything was
        written, on a connection of its own, beside the writer (a PASSIVE checkpoint:
        sqlite.org/c3ref/wal_checkpoint_v2.html), and tells _restart_log how long the log is
        once at most RESTART_TAIL_BYTES of it are left to copy. A page a read still needs
        stays in the log until that read ends. Past 4 x max_wal_bytes (or half of what the
        disk leaves the log), reads are stopped
        through interrupt_reads (an event the reader processes watch; they answer UNAVAILABLE,
        which clients retry) until the log starts again, STOP_READS_S at most."""
        conn = sqlite3.connect(self.path, timeout=0, isolation_level=None,
                               check_same_thread=False)
        frame_bytes = conn.execute("PRAGMA page_size").fetchone()[0] + 24  # a frame's header
        seen = None
        try:
            while not self._closing.wait(WAL_CHECK_S):
                try:
                    stat = self._wal_path.stat()
                    if (stat.st_size, stat.st_mtime_ns) == seen:  # nothing written since
                        continue
                    seen = (stat.st_size, stat.st_mtime_ns)
                    with self._checkpointing:
                        busy, frames, copied = conn.execute(
                            "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                        if busy or frames == self._restarted_frames:  # not yet restarted
                            continue
                        tail, log = (frames - copied) * frame_bytes, frames * frame_bytes
                        self._restartable = log * (tail <= RESTART_TAIL_BYTES)
                        self._stop_reads(log > min(4 * self.limits.max_wal_bytes,
                                                   self._disk_room(log) // 2))
                except (OSError, sqlite3.Error):  # a full disk: the writer's commits say so
                    continue
        finally:
            with self._checkpointing:
                self._stop_reads(False)
            conn.close()

    def _disk_room(self, log: int) -> int:
        """What the log may take of the disk: its own length and the free space beside it."""
        try:
            return log + shutil.disk_usage(self.path.parent).free
        except OSError:
            return 2**62

    def _disk_tight(self) -> bool:
        """Whether the log's file takes over a quarter of what the disk leaves it. A log that
        took the disk could never be copied back (the database grows by what it copies): on
        a 64-MiB disk the log grew to 59 MiB, and once full no export got through again, also
        after space was freed. So the writer then copies it back itself, between commits,
        without waiting for the checkpointer, and gives the file's space back."""
        try:
            wal = self._wal_path.stat().st_size
        except OSError:
            return False
        return wal > self._disk_room(wal) // 4

    def _stop_reads(self, stop: bool) -> None:
        """Stops the reads, or lets them go on (under _checkpointing)."""
        if self.interrupt_reads is None:
            return
        now = time.monotonic()
        if stop and self._stopping_since is None:
            self.interrupt_reads.set()
            self._stopping_since = now
        elif self._stopping_since is not None and (
                not stop or now > self._stopping_since + STOP_READS_S):
            self.interrupt_reads.clear()
            self._stopping_since = None

    def _restart_log(self) -> None:
        """Between two commits: starts the log again once it is half max_wal_bytes long and
        the checkpointer has copied all but its last pages, or at once on a tight disk
        (_disk_tight) (a RESTART checkpoint,
        sqlite.org/pragma.html#pragma_wal_checkpoint; commits wait while it copies them). It
        waits RESTART_WAIT_MS at most for the reads on the log (short ones end meanwhile; new
        ones read the database); if one is still there, it tries again once the log has grown
        by half. While reads are stopped (past 4 x max_wal_bytes) it tries after every
        commit, waiting STOP_WAIT_MS for them."""
        log, limit = self._restartable, self.limits.max_wal_bytes
        tight = self._disk_tight()
        stopping = self._stopping_since is not None or tight
        wait_ms = STOP_WAIT_MS if stopping else RESTART_WAIT_MS
        if ((not stopping and log <= max(limit // 2, min(self._retry_at, 4 * limit)))
                or not self._checkpointing.acquire(timeout=wait_ms / 1e3 if stopping else 0)):
            return
        try:
            self._restartable = 0  # until the next copy
            self.conn.execute(f"PRAGMA busy_timeout = {wait_ms}")
            try:
                # the file keeps its length for the next log, unless the disk needs it back
                mode = "TRUNCATE" if tight else "RESTART"
                busy, frames, _ = self.conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
                restarted = not busy
            except sqlite3.Error:
                restarted, frames = False, -1
            finally:
                self.conn.execute("PRAGMA busy_timeout = 30000")  # sqlite3.connect's timeout=30
            # The log starts again at the next commit: until then the checkpointer still
            # counts these frames.
            self._restarted_frames = frames if restarted else -1
            self._retry_at = 0 if restarted else log * 3 // 2
            if restarted:
                self._stop_reads(False)
        finally:
            self._checkpointing.release()

    def _commit(self, jobs: list) -> None:
        """One transaction for the jobs, a savepoint each: a request that fails half-way
        leaves nothing stored and fails alone; a failure of the storage itself (a full disk,
        an I/O error) fails every request of the commit with StorageUnavailable."""
        outcomes = []
        try:
            # IMMEDIATE: the write lock up front. A deferred BEGIN that reads first cannot
            # upgrade to a writer when another holds it, and the busy timeout does not retry
            # that (sqlite.org/lang_transaction.html).
            self.conn.execute("BEGIN IMMEDIATE")
            for insert, request, future in jobs:
                self.conn.execute("SAVEPOINT request")
                try:
                    outcomes.append((future, insert(request)))
                except sqlite3.OperationalError:
                    raise  # the storage failed, not this request
                except Exception as err:  # a request we cannot store: only it fails
                    self.conn.execute("ROLLBACK TO request")
                    self._forget()  # rows inserted in the rolled-back part
                    outcomes.append((future, err))
                self.conn.execute("RELEASE request")
            self.conn.execute("COMMIT")
        except Exception as err:
            if self.conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # else SQLite rolled back itself
                    self.conn.execute("ROLLBACK")
            self._forget()  # rows inserted in the rolled-back transaction
            failed = StorageUnavailable(f"storage failed: {err}")
            outcomes = [(future, failed) for *_, future in jobs]
        for future, outcome in outcomes:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _forget(self) -> None:
        self._resource_ids.clear()
        self._labelled.clear()
        self._descriptors.clear()
        self._life_bounds.clear()

    def _labels(self, metric_type: str, attributes: str) -> None:
        """Record the label keys of a point's attributes (once per attribute set), or
        InvalidPoint where they break a cap (_check_labels, MAX_LABEL_KEYS a metric type)."""
        key = f"{metric_type}\n{attributes}"
        if self._labelled.get(key) is not None:
            return
        parsed = json.loads(attributes)
        _check_labels(parsed, "the point")
        known = {row[0] for row in self.conn.execute(
            "SELECT key FROM metric_labels WHERE metric_type = ?", (metric_type,))}
        new = parsed.keys() - known
        if len(known) + len(new) > MAX_LABEL_KEYS:
            raise InvalidPoint(f"its attributes would give the metric {len(known) + len(new):,} "
                               f"label keys; at most {MAX_LABEL_KEYS}")
        self.conn.executemany("INSERT OR IGNORE INTO metric_labels VALUES (?, ?)",
                              [(metric_type, k) for k in new])
        self._labelled.put(key, 1)

    def _insert_metrics(self, request) -> tuple[int, int, str]:
        rows, rejected, error = [], 0, ""
        for rm in request.resource_metrics:
            try:  # a resource the store cannot hold: its points are refused, the others kept
                resource = attributes_json(rm.resource.attributes)
                _check_labels(json.loads(resource), "the resource")
            except InvalidPoint as err:
                refused = sum(len(getattr(m, m.WhichOneof("data")).data_points) if
                              m.WhichOneof("data") else 1 for sm in rm.scope_metrics
                              for m in sm.metrics)
                rejected += refused
                error = error or f"{refused} points: {err}"[:MAX_ERROR_CHARS]
                continue
            rid = self.resource_id(resource)
            for sm in rm.scope_metrics:
                scope = sm.scope.name
                for metric in sm.metrics:
                    bad, msg = self._metric_rows(metric, rid, scope, rows)
                    rejected += bad
                    error = error or msg
        before = self.conn.total_changes
        self.conn.executemany(
            "INSERT OR IGNORE INTO points (metric_type, resource_id, attributes, "
            "temporality, start_ns, time_ns, value, int_value, count, sum, min, max, "
            "bounds, bucket_counts, exponential, scope) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        clashes = 0
        if self.conn.total_changes - before < len(rows):  # some were stored already
            clashes, msg = self._clashes(rows)
            rejected += clashes
            error = error or msg
        return len(rows) - clashes, rejected, error

    def _clashes(self, rows: list) -> tuple[int, str]:
        """Rows of a series and time stored before with other values: refused (a series has
        one value at a time). A row stored before with the same values is a retry: stored."""
        clashes, error = 0, ""
        for row in rows:
            stored = self.conn.execute(
                "SELECT value, int_value, count, sum, min, max, bounds, bucket_counts, "
                "exponential FROM points WHERE metric_type = ? AND resource_id = ? AND "
                "scope = ? AND attributes = ? AND start_ns = ? AND time_ns = ?",
                (row[0], row[1], row[15], row[2], row[4], row[5])).fetchone()
            if stored is not None and tuple(stored) != row[6:15]:
                clashes += 1
                name = row[0].removeprefix(METRIC_TYPE_PREFIX)
                error = error or (f"{name[:80]!r} point at time_unix_nano={row[5]}: its series "
                                  "has another value stored at that time")[:MAX_ERROR_CHARS]
        return clashes, error

    def _metric_rows(self, metric, rid, scope, rows) -> tuple[int, str]:
        """Append the metric's storable points to rows; returns (refused, first refusal)."""
        data = metric.WhichOneof("data")
        name, unit, description = metric.name, metric.unit, metric.description
        if data is None:
            return 1, f"{name[:80]!r}: metric without data"
        container = getattr(metric, data)
        points = container.data_points
        if not 0 < len(name) <= MAX_NAME_CHARS:
            return len(points), (f"metric name {name[:80]!r}{'...' if len(name) > 80 else ''} "
                                 f"has {len(name):,} characters; expected 1 to "
                                 f"{MAX_NAME_CHARS} (OpenTelemetry's instrument name limit)")
        if data == "summary":
            return len(points), (f"{name[:80]!r}: summary points are not stored; the local "
                                 "collector stores gauges, sums and histograms")
        temporality = getattr(container, "aggregation_temporality", 0)
        kind, metric_kind, value_type = _kinds(metric, data, temporality, points)
        metric_type = metric_type_of(name, kind)
        try:
            value_type = self._descriptor(metric_type, name, kind, metric_kind, value_type, unit,
                                          description)
        except InvalidPoint as err:
            return len(points), f"{name[:80]!r}: {err}"[:MAX_ERROR_CHARS]
        rejected, error = 0, ""
        for i, p in enumerate(points):
            try:
                attributes = attributes_json(p.attributes)
                row = self._point_row(metric_type, data, value_type, temporality, rid, scope,
                                      attributes, p)
                self._labels(metric_type, attributes)  # last: only a stored point's keys
            except (InvalidPoint, ValueError, OverflowError, TypeError) as err:
                rejected += 1
                error = error or _refusal(name, i, p, err)
                continue
            rows.append(row)  # only a point every check passed
        return rejected, error

    def _point_row(self, metric_type, data, value_type, temporality, rid, scope, attributes,
                   p) -> tuple:
        """The points row of one data point, or InvalidPoint saying why it cannot be one."""
        if data in ("histogram", "exponential_histogram"):
            extra = _histogram_fields(p) if data == "histogram" else _exponential_fields(p)
            if data == "histogram" and temporality == 2:
                self._check_life_bounds(metric_type, rid, scope, attributes, p, extra[4])
            return (metric_type, rid, attributes, temporality, p.start_time_unix_nano,
                    p.time_unix_nano, None, None, *extra, scope)
        which = p.WhichOneof("value")
        if which != "as_int" and value_type == "INT64":
            raise InvalidPoint(f"a double value ({p.as_double!r}) on a metric whose points are "
                               "integers (INT64, from its first point)")
        _check_point(p, ("value", None if which == "as_int" else p.as_double))
        return (metric_type, rid, attributes, temporality, p.start_time_unix_nano,
                p.time_unix_nano, float(p.as_int) if which == "as_int" else p.as_double,
                p.as_int if which == "as_int" else None,
                None, None, None, None, None, None, None, scope)

    def _check_life_bounds(self, metric_type, rid, scope, attributes, p, bounds: str) -> None:
        """A cumulative series keeps its bucket bounds while its start time stays: its
        points are differenced, and counts of other buckets cannot be."""
        key = f"{metric_type}\n{rid}\n{scope}\n{attributes}\n{p.start_time_unix_nano}"
        known = self._life_bounds.get(key)
        if known is None:
            row = self.conn.execute(
                "SELECT bounds FROM points WHERE metric_type = ? AND resource_id = ? AND "
                "scope = ? AND attributes = ? AND start_ns = ? LIMIT 1",
                (metric_type, rid, scope, attributes, p.start_time_unix_nano)).fetchone()
            known = row[0] if row else bounds
            self._life_bounds.put(key, known)
        if known != bounds:
            raise InvalidPoint(f"bucket bounds {bounds[:60]} differ from {known[:60]}, which "
                               "this cumulative series has had since its start time; new "
                               "bounds need a new start_time_unix_nano")

    def _insert_spans(self, request) -> tuple[int, int, str]:
        rows, rejected, error = [], 0, ""
        for rs in request.resource_spans:
            try:  # a resource the store cannot hold: its spans are refused, the others kept
                rid = self.resource_id(attributes_json(rs.resource.attributes))
            except InvalidPoint as err:
                refused = sum(len(ss.spans) for ss in rs.scope_spans)
                rejected += refused
                error = error or f"{refused} spans: the resource: {err}"[:MAX_ERROR_CHARS]
                continue
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
                    try:
                        attributes = attributes_json(s.attributes)
                        events = [{"name": e.name, "time_ns": e.time_unix_nano,
                                   "attributes": json.loads(attributes_json(e.attributes))}
                                  for e in s.events]
                    except InvalidPoint as err:
                        rejected += 1
                        error = error or f"span {s.name[:60]!r}: {err}"[:MAX_ERROR_CHARS]
                        continue
                    rows.append((s.trace_id.hex(), s.span_id.hex(),
                                 s.parent_span_id.hex() or None, s.name, s.kind,
                                 s.start_time_unix_nano, s.end_time_unix_nano, s.status.code,
                                 s.status.message, attributes, json.dumps(events), rid,
                                 ss.scope.name))
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
        """The spans of one trace (or of the store), oldest first, as a list; iter_spans
        streams them instead (a store of a long run holds millions)."""
        return list(self.iter_spans(trace_id))

    def iter_spans(self, trace_id: str | None = None):
        """The spans, oldest first, one at a time: what spans() lists, in constant memory."""
        sql = ("SELECT s.*, r.attributes AS resource FROM spans s JOIN resources r ON "
               "r.id = s.resource_id")
        for row in self.rows(sql + (" WHERE trace_id = ?" if trace_id else "")
                             + " ORDER BY start_ns", (trace_id,) if trace_id else ()):
            row["attributes"] = json.loads(row["attributes"])
            row["resource"] = json.loads(row["resource"])
            row["events"] = json.loads(row["events"])
            yield row


def _stored(write, request_type, raw: bytes) -> tuple[grpc.StatusCode | None, object]:
    """Parse and store one Export (in an export thread): (None, what write returned), or a
    status and its message: INVALID_ARGUMENT for a message that does not parse, UNAVAILABLE
    (the exporter retries) when the storage failed, INTERNAL naming any other error."""
    try:
        request = request_type.FromString(raw)
    except DecodeError as err:
        return grpc.StatusCode.INVALID_ARGUMENT, f"not a {request_type.__name__}: {err}"
    try:
        return None, write(request)
    except StorageUnavailable as err:
        return grpc.StatusCode.UNAVAILABLE, str(err)[:MAX_ERROR_CHARS]
    except Exception as err:  # noqa: BLE001 (the client gets the reason, not UNKNOWN)
        return (grpc.StatusCode.INTERNAL,
                f"the request could not be stored: {err!r}"[:MAX_ERROR_CHARS])


# A call's one message must arrive within this time of its start, or the call is cancelled:
# a client that sends headers and then nothing (or a trickle) holds no slot for longer.
MESSAGE_WAIT_S = 5.0
# A reader process's CPU priority (nice): ingestion goes first. 19, not 10: beside 2 loops of
# whole reads, exports' p99 was 3.2-4.5x alone at 10, 2.3-2.4x at 19 (beside 40 loops reading
# 20,000 series 3.4-3.5x, and 2.1-3.7x; `python benchmarks/collector_under_load.py`, 2-3 runs
# each). Reads then yield to Ray's workers (nice 15).
READ_NICE = 19
# Reads waiting for a free reader, at most (more are refused at once), and how long each
# waits; how long a new reader process may take to import what it needs; how long a reader
# told that its client went away may take to stop before it is killed.
READ_QUEUE, READ_TURN_S, READER_START_S, READER_CANCEL_S = 32, 10.0, 60.0, 5.0
# Read answers not yet taken by their clients, in bytes: an answer waits in gRPC's buffers
# until its client reads it, and 200 clients that never read once held 700 MB. A read that
# gets its reader while this much waits is refused (RESOURCE_EXHAUSTED); the max_queries
# reads running may add one answer each, under the clients' 4 MiB (ANSWER_MAX_BYTES).
UNREAD_ANSWER_BYTES, ANSWER_MAX_BYTES = 32 * MiB, 4 * MiB
# Of them, what one connection may leave unread: a client that never reads (a zero
# flow-control window) filled the whole cap alone, and every other client's reads were refused.
UNREAD_PER_CONNECTION = UNREAD_ANSWER_BYTES // 4


class _Reader:
    def __init__(self, process, conn, reader_id: int):
        self.process, self.conn, self.id = process, conn, reader_id
        self.ready = False  # it has answered once: its imports are done


async def _answer_ready(reader: _Reader, seconds: float) -> bool:
    """Waits, without a thread, until the reader's answer can be read; False after seconds."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = reader.conn.fileno()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(True))
    try:
        return await asyncio.wait_for(ready, seconds)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


class _Readers:
    """The processes that answer MetricService reads (monitoring.reader_main): up to
    max_queries, each started at its first read and kept, one read at a time each. Up to
    READ_QUEUE reads wait READ_TURN_S for a free one (a coroutine each, no thread), more are
    answered RESOURCE_EXHAUSTED at once. A page token names the reader that keeps its result,
    and the next page goes to that one. A read whose client goes away tells its reader, which
    stops at its next check; one that outlives its deadline, or whose process died, ends with
    its process, and a new one takes its place at the next read. Runs on the server's loop."""

    def __init__(self, db_path: Path, limits: Limits):
        self.db_path, self.limits = str(db_path.resolve()), limits
        self.idle: list[_Reader] = []
        self.freed: asyncio.Condition | None = None  # made on the loop
        self.started, self.waiting, self.all = 0, 0, []
        self.ids = itertools.count()
        import multiprocessing

        # Set while the store starts a log that reads keep growing again (_checkpoint_loop).
        self.interrupt = multiprocessing.get_context("spawn").Event()
        self.cancelled = 0  # reads whose client went away (tests and benchmarks read it)
        self.unread = 0  # bytes of answers their clients have not taken yet
        self.unread_of: dict[str, int] = {}  # the same, per connection (its peer)

    def _take(self, prefer: int | None) -> _Reader | None:
        """An idle reader: the one that holds the pages of a page token (prefer) while it
        lives, else any; None when there is none to take now."""
        if any(r.id == prefer for r in self.all):
            ours = [r for r in self.idle if r.id == prefer]
            if ours:
                self.idle.remove(ours[0])
            return ours[0] if ours else None
        return self.idle.pop() if self.idle else None

    async def _turn(self, prefer: int | None = None) -> _Reader | None:
        if self.freed is None:
            self.freed = asyncio.Condition()
        reader = self._take(prefer)
        if reader is not None:
            return reader
        if self.started < self.limits.max_queries and not any(r.id == prefer
                                                               for r in self.all):
            self.started += 1
            # Spawning takes tens of ms: not on the loop. A cancelled call does not stop it.
            start = asyncio.get_running_loop().run_in_executor(None, self._start)
            try:
                return await asyncio.shield(start)
            except asyncio.CancelledError:
                start.add_done_callback(self._started_late)
                raise
            except BaseException:
                self.started -= 1
                raise
        if self.waiting >= READ_QUEUE:
            return None
        self.waiting += 1
        taken: list[_Reader] = []

        def took() -> bool:  # taken where it is seen free: a read arriving meanwhile cannot
            reader = self._take(prefer)  # take it between the notice and this call's turn
            if reader is not None:
                taken.append(reader)
            return bool(taken)

        try:
            async with self.freed:
                await asyncio.wait_for(self.freed.wait_for(took), READ_TURN_S)
        except TimeoutError:  # the one with the pages stays busy: any other recomputes them
            return taken[0] if taken else self._take(None)
        except asyncio.CancelledError:
            if taken:
                self._free(taken[0])
            raise
        finally:
            self.waiting -= 1
        return taken[0]

    def _free(self, reader: _Reader | None = None) -> None:
        """The reader is idle again (None: one ended); waiting reads look again. The notice
        is a task of its own: a call cancelled meanwhile cannot lose it."""
        if reader is not None:
            self.idle.append(reader)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self.freed:
            self.freed.notify_all()

    def _started_late(self, start) -> None:
        """A reader started for a read whose client went away meanwhile: idle once up."""
        if start.cancelled() or start.exception() is not None:
            self.started -= 1
        else:
            self._free(start.result())

    def _start(self) -> _Reader:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fork would copy gRPC's threads
        conn, child = context.Pipe()
        reader_id = next(self.ids)
        process = context.Process(target=monitoring.reader_main, daemon=True,
                                  args=(child, functools.partial(CollectorStore, self.db_path,
                                                                 limits=self.limits), READ_NICE,
                                        self.interrupt, reader_id),
                                  name="collector-reader")
        process.start()
        child.close()
        reader = _Reader(process, conn, reader_id)
        self.all.append(reader)
        return reader

    def _end(self, reader: _Reader) -> None:
        reader.process.kill()
        reader.process.join(5)
        reader.conn.close()
        self.started -= 1
        self.all.remove(reader)
        self._free()  # reads that waited for it

    async def answer(self, method: str, request: bytes, context):
        reader = await self._turn(monitoring.token_reader(method, request))
        if reader is None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.limits.max_queries} queries are running and "
                                f"{READ_QUEUE} waiting; retry shortly")
        peer = context.peer()
        if self.unread_of.get(peer, 0) >= UNREAD_PER_CONNECTION:
            self._free(reader)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.unread_of[peer] / MiB:.0f} MiB of answers wait for this "
                                "connection to read them; read them, then retry")
        if self.unread >= UNREAD_ANSWER_BYTES:
            self._free(reader)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.unread / MiB:.0f} MiB of answers wait for their "
                                "clients to read them; retry shortly")
        remaining = context.time_remaining()
        seconds = min(self.limits.max_query_s, self.limits.max_query_s if remaining is None
                      else max(remaining, 0.0))
        try:
            reader.conn.send((method, request, seconds))
            # A new reader first imports what it needs; then the read has its deadline.
            ready = await _answer_ready(reader, seconds + 5 + (0 if reader.ready
                                                                else READER_START_S))
            code, payload = reader.conn.recv() if ready else (None, None)
        except asyncio.CancelledError:  # the client went away (or the server stops)
            self.cancelled += 1
            asyncio.get_running_loop().create_task(self._after_cancel(reader))
            raise
        except (EOFError, OSError):  # the reader died (killed, out of memory)
            self._end(reader)
            code, payload = (grpc.StatusCode.UNAVAILABLE.value[0],
                             "the collector's reader process ended; retry")
        else:
            if ready:
                reader.ready = True
                self._free(reader)
            else:
                self._end(reader)
                code, payload = (grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
                                 f"the query ran past its deadline of {seconds:.1f} s")
        if code:
            await context.abort(_STATUS_OF[code], payload if len(payload) <= 400
                                else payload[:400] + "...")
        self.unread += len(payload)
        self.unread_of[peer] = self.unread_of.get(peer, 0) + len(payload)
        context.add_done_callback(functools.partial(self._taken, peer, len(payload)))
        return payload

    def _taken(self, peer: str, size: int, _context) -> None:
        """An answer's call ended: its client read it, or went away."""
        self.unread -= size
        self.unread_of[peer] -= size
        if not self.unread_of[peer]:
            del self.unread_of[peer]

    async def _after_cancel(self, reader: _Reader) -> None:
        """Tell the reader its client went away; it answers CANCELLED at its next check and
        is free again. One that does not answer in READER_CANCEL_S is killed."""
        try:
            reader.conn.send("cancel")
            if await _answer_ready(reader, READER_CANCEL_S + (0 if reader.ready else
                                                              READER_START_S)):
                reader.conn.recv()
                reader.ready = True
                self._free(reader)
                return
        except (EOFError, OSError):
            pass
        self._end(reader)

    def stop(self) -> None:
        for reader in list(self.all):
            with contextlib.suppress(OSError):
                reader.conn.send(None)
        for reader in list(self.all):
            reader.process.join(2)
            if reader.process.is_alive():
                reader.process.kill()
                reader.process.join(5)
            reader.conn.close()
        self.all.clear()


_STATUS_OF = {code.value[0]: code for code in grpc.StatusCode}


class _Calls:
    """Every gRPC method of the collector, on one asyncio loop: a call that waits (for its
    message, for a reader) is a coroutine, not a thread, so no kind of call can take another's
    capacity. A call first receives its one message within MESSAGE_WAIT_S; then an export
    takes one of max_exports turns, stored in a thread of its own, and a read one of the
    readers (_Readers). Without a turn a call is answered RESOURCE_EXHAUSTED (exporters retry
    it)."""

    def __init__(self, store: CollectorStore):
        limits = store.limits
        self.limits, self.exporting = limits, 0
        self.writers = futures.ThreadPoolExecutor(limits.max_exports,
                                                  thread_name_prefix="collector-export")
        self.readers = _Readers(store.path, limits)
        store.interrupt_reads = self.readers.interrupt
        otlp = {
            "opentelemetry.proto.collector.metrics.v1.MetricsService": (
                metrics_service_pb2.ExportMetricsServiceRequest, "metrics", store.write_metrics),
            "opentelemetry.proto.collector.trace.v1.TraceService": (
                trace_service_pb2.ExportTraceServiceRequest, "traces", store.write_spans)}
        self.handlers = [grpc.method_handlers_generic_handler(service, {"Export": self._handler(
            functools.partial(self._export, kind, write, request_type))})
            for service, (request_type, kind, write) in otlp.items()]
        self.handlers.append(grpc.method_handlers_generic_handler(monitoring.SERVICE, {
            method: self._handler(functools.partial(self.readers.answer, method))
            for method in monitoring.METHODS}))

    @staticmethod
    def _handler(function):
        async def handle(requests, context):
            try:
                request = await asyncio.wait_for(context.read(), MESSAGE_WAIT_S)
            except TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                    f"no request message within {MESSAGE_WAIT_S:g} s")
            if request is grpc.aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call sent no message")
            return await function(request, context)

        return grpc.stream_unary_rpc_method_handler(
            handle, response_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString())

    async def _export(self, kind, write, request_type, request: bytes, context):
        # An export does not wait for a turn: its message is held meanwhile.
        if self.exporting >= self.limits.max_exports:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.limits.max_exports} exports are running; retry shortly")
        self.exporting += 1
        try:
            code, stored = await asyncio.get_running_loop().run_in_executor(
                self.writers, _stored, write, request_type, request)
        finally:
            self.exporting -= 1
        if code is not None:
            await context.abort(code, stored)
        return _response(kind, stored)

    def stop(self) -> None:
        self.writers.shutdown(wait=True)
        self.readers.stop()


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


_HTTP_ROUTES = {"/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, "metrics"),
                "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, "traces")}


def _http_handler(store: CollectorStore, token: str | None) -> type:
    """The OTLP/HTTP request handler of one server: _OtlpHttp with this store, token and
    turns."""
    return type("Handler", (_OtlpHttp,), {
        "store": store, "expected": f"Bearer {token}".encode() if token else None,
        "receiving": threading.BoundedSemaphore(RECEIVING_CALLS),
        "turns": threading.BoundedSemaphore(store.limits.max_exports)})


class _OtlpHttp(BaseHTTPRequestHandler):
    """OTLP/HTTP, binary protobuf, plain or gzip (opentelemetry.io/docs/specs/otlp/#otlphttp):
    the same writes as the gRPC services; 400 for a body that does not parse, 401 without the
    bearer token (when one is set), 408 for a body not received within MESSAGE_WAIT_S, 503
    with Retry-After (the exporter retries) when storage failed, RECEIVING_CALLS bodies are
    arriving or max_exports are being stored. A body is received before it asks for a turn,
    so a slow client holds none. HTTP/1.1: an exporter keeps its connection."""

    timeout = 30  # a client that sends no request line does not hold a thread forever
    protocol_version = "HTTP/1.1"
    store: CollectorStore  # these four: _http_handler's
    expected: bytes | None
    receiving: threading.BoundedSemaphore
    turns: threading.BoundedSemaphore

    def do_POST(self):  # noqa: N802 (http.server's method name)
        refused = self._refusal()
        if refused:
            return self._reply(*refused)
        body = self._receive(int(self.headers["Content-Length"]))
        if isinstance(body, tuple):
            return self._reply(*body)
        if not self.turns.acquire(blocking=False):
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE,
                               f"{self.store.limits.max_exports} exports are being stored; "
                               "retry".encode())
        try:
            self._export(_HTTP_ROUTES[self.path.split("?")[0]], body)
        finally:
            self.turns.release()

    def _refusal(self) -> tuple[HTTPStatus, bytes] | None:
        """Why the headers alone refuse the request, or None."""
        if self.expected and not hmac.compare_digest(
                self.headers.get("Authorization", "").encode(), self.expected):
            return HTTPStatus.UNAUTHORIZED, b"missing or wrong bearer token"
        if self.path.split("?")[0] not in _HTTP_ROUTES:
            return HTTPStatus.NOT_FOUND, b"POST /v1/metrics or /v1/traces"
        if self.headers.get("Content-Type", "").split(";")[0] != "application/x-protobuf":
            return (HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                    b"Content-Type must be application/x-protobuf")
        if self._encoding() not in ("identity", "gzip"):
            return (HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Encoding "
                    f"{self._encoding()[:40]!r} is not accepted; send gzip or none".encode())
        length, most = self.headers.get("Content-Length", ""), self.store.limits.max_message_bytes
        if not length.isdigit() or int(length) > most:
            return (HTTPStatus.REQUEST_ENTITY_TOO_LARGE if length.isdigit()
                    else HTTPStatus.LENGTH_REQUIRED, f"Content-Length up to {most} bytes".encode())
        return None

    def _encoding(self) -> str:
        return self.headers.get("Content-Encoding", "identity").strip().lower()

    def _receive(self, length: int) -> bytes | tuple[HTTPStatus, bytes]:
        """The body (one of RECEIVING_CALLS at once), or the reply refusing it."""
        if not self.receiving.acquire(blocking=False):
            return (HTTPStatus.SERVICE_UNAVAILABLE,
                    f"{RECEIVING_CALLS} bodies are arriving; retry".encode())
        try:
            body = self._body(length)
        finally:
            self.receiving.release()
        if body is None:
            return (HTTPStatus.REQUEST_TIMEOUT,
                    f"the body did not arrive within {MESSAGE_WAIT_S:g} s".encode())
        return body

    def _export(self, route, body: bytes):
        if self._encoding() == "gzip":
            body = self._inflate(body)
            if isinstance(body, tuple):
                return self._reply(*body)
        message_type, kind = route
        request = message_type()
        try:
            request.ParseFromString(body)
        except DecodeError as err:
            return self._reply(HTTPStatus.BAD_REQUEST, f"not an OTLP message: {err}".encode())
        try:
            write = self.store.write_metrics if kind == "metrics" else self.store.write_spans
            response = _response(kind, write(request))
        except StorageUnavailable as err:
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE, str(err).encode())
        except Exception as err:  # noqa: BLE001 (the client gets the reason)
            return self._reply(HTTPStatus.INTERNAL_SERVER_ERROR,
                               f"the request could not be stored: {err!r}"[:300].encode())
        self._reply(HTTPStatus.OK, response.SerializeToString(), "application/x-protobuf")

    def _inflate(self, body: bytes) -> bytes | tuple[HTTPStatus, bytes]:
        """A gzip body inflated, up to max_message_bytes; or the reply refusing it."""
        most = self.store.limits.max_message_bytes
        inflate = zlib.decompressobj(wbits=31)  # gzip framing
        try:
            body = inflate.decompress(body, most + 1)
        except zlib.error as err:
            return HTTPStatus.BAD_REQUEST, f"not gzip: {err}".encode()
        if len(body) > most:
            return (HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"the body inflates past {most} bytes".encode())
        if not inflate.eof:
            return HTTPStatus.BAD_REQUEST, b"the gzip body is truncated"
        return body

    def _body(self, length: int) -> bytes | None:
        """The body, or None when it takes longer than MESSAGE_WAIT_S in all (a client
        sending a byte now and then holds a turn no longer)."""
        deadline, chunks = time.monotonic() + MESSAGE_WAIT_S, []
        try:
            while length:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(length, MiB))
                if not chunk:
                    return None
                chunks.append(chunk)
                length -= len(chunk)
        except OSError:  # the socket's timeout, or the client went away
            return None
        finally:
            self.connection.settimeout(self.timeout)
        return b"".join(chunks)

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain"):
        if status != HTTPStatus.OK:  # a body may be left unread: not the next request
            self.close_connection = True
        try:
            self.send_response(status)
            if status == HTTPStatus.SERVICE_UNAVAILABLE:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client went away: nothing to tell it
            self.close_connection = True

    def log_message(self, *args):  # no line per request on stderr
        pass


class _HTTPServer(ThreadingHTTPServer):
    request_queue_size = 128  # the listen backlog: 5 by default, too few for a burst of exporters


async def _deny(requests, context):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


class _BearerToken(grpc.aio.ServerInterceptor):
    """Every gRPC call needs `authorization: Bearer <token>` metadata (what OTel exporters send
    with OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<token>)."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()
        # Refused at the headers: a handler that takes a request stream need not wait for
        # the message.
        self.deny = grpc.stream_unary_rpc_method_handler(_deny)

    async def intercept_service(self, continuation, details):
        got = dict(details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(str(got).encode(), self.expected):
            return await continuation(details)
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
        mode = path.stat().st_mode & 0o777
        token = path.read_text().strip()
    except OSError as err:
        raise ValueError(f"token_file={str(path)!r} cannot be read: {err.strerror}") from None
    if mode & 0o077:
        raise ValueError(f"token_file={str(path)!r} is readable by others (mode {mode:o}); a "
                         f"secret must be private: chmod 600 {path}")
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
        self.calls: _Calls | None = None
        self.server = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
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
        self.calls = _Calls(self.store)
        self._loop = asyncio.new_event_loop()
        started: futures.Future = futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True,
                                        name="collector-grpc")
        self._thread.start()
        try:
            self.port = started.result(timeout=60)
        except BaseException:
            self.stop()
            raise
        if self.http_port is not None:
            try:
                self.http_server = _HTTPServer((self.host, self.http_port),
                                                       _http_handler(self.store, self.token))
            except OSError as err:
                self.stop()
                raise OSError(f"cannot listen for OTLP/HTTP on {self.host}:{self.http_port}: "
                              f"{err}") from None
            self.http_server.daemon_threads = True
            self.http_port = self.http_server.server_address[1]
            threading.Thread(target=self.http_server.serve_forever, daemon=True).start()
        return self

    def _serve(self, started: futures.Future) -> None:
        """The gRPC server's thread: its asyncio loop, until stop()."""
        asyncio.set_event_loop(self._loop)
        try:
            self.server = self._loop.run_until_complete(self._start_grpc())
        except BaseException as err:  # noqa: BLE001 (start() raises it)
            started.set_exception(err)
            return
        started.set_result(self.port)
        self._loop.run_forever()

    async def _start_grpc(self):
        server = grpc.aio.server(
            interceptors=[_BearerToken(self.token)] if self.token else [],
            # past it a call is refused at its headers (RESOURCE_EXHAUSTED)
            maximum_concurrent_rpcs=self.limits.max_calls(),
            options=[("grpc.max_receive_message_length", self.limits.max_message_bytes),
                     ("grpc.so_reuseport", 0),
                     # one connection cannot hold every call; an idle one is closed
                     ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
                     ("grpc.max_connection_idle_ms", CONNECTION_IDLE_S * 1000)])
        server.add_generic_rpc_handlers(self.calls.handlers)
        try:
            bound = server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError:
            bound = 0
        if not bound:
            raise OSError(f"cannot listen on {self.host}:{self.port}: is something else "
                          "listening there? (use another port, or port 0 for a free one)")
        self.port = bound
        await server.start()
        return server

    def stop(self, grace_s: float = 2.0) -> None:
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server.server_close()
            self.http_server = None
        if self._thread is not None:
            if self.server is not None:
                with contextlib.suppress(futures.TimeoutError):
                    asyncio.run_coroutine_threadsafe(self.server.stop(grace_s),
                                                     self._loop).result(grace_s + 10)
                self.server = None
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None
            self._loop.close()
        if self.calls is not None:
            self.calls.stop()
            self.calls = None
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
        cmd = [sys.executable, "-m", "distrl.otel.collector", "--db", str(self.db_path),
               "--host", self.host, "--port", str(self.port)]
        if self.http_port is not None:
            cmd += ["--http-port", str(self.http_port)]
        if self.allow_remote:
            cmd.append("--allow-remote")
        if self.token_file is not None:
            cmd += ["--token-file", str(self.token_file)]
        cmd += [*limit_argv(self.limits), "--stop-with-parent", str(os.getpid())]
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


def _stop_with_parent(pid: int, stopped: threading.Event, every_s: float = 0.5) -> None:
    """Set `stopped` once process pid is no longer the parent (it died, even by SIGKILL, and
    this process was handed to init or a subreaper)."""
    while not stopped.wait(every_s):
        if os.getppid() != pid:
            stopped.set()


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
    parser.add_argument("--stop-with-parent", type=int, default=None, metavar="PID",
                        help="stop when process PID is no longer this one's parent (LocalCollector "
                             "passes its own: a killed notebook kernel leaves no collector holding "
                             "the port and the database)")
    add_limit_options(parser)
    args = parser.parse_args(argv)
    # Reads are Python work holding the interpreter lock; a shorter switch interval than the
    # default 5 ms hands it to the writer and the export threads sooner.
    # `python benchmarks/collector_under_load.py` measures export p99 under query load.
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
    if args.stop_with_parent is not None:
        threading.Thread(target=_stop_with_parent, args=(args.stop_with_parent, stopped),
                         daemon=True, name="parent-watch").start()
    stopped.wait()
    collector.stop()
    print("collector stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
