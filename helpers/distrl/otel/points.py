"""OTLP points and spans as the store keeps them: attribute JSON, metric types and kinds,
and the checks that refuse what Cloud Monitoring or the store could not hold (names, labels,
values, buckets, times), per point."""

from __future__ import annotations

import base64
import functools
import json
import math
import time
from typing import NamedTuple

from distrl.otel.filters import METRIC_TYPE_PREFIX


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


ATTRIBUTE_CACHE = BoundedCache(8 * 2**20)


def attributes_json(key_values) -> str:
    """Attributes as canonical JSON (sorted keys). Series repeat their attribute sets, so the
    JSON is cached by the attributes' wire bytes."""
    wire = b"".join(kv.SerializeToString() for kv in key_values)
    cached = ATTRIBUTE_CACHE.get(wire)
    if cached is None:
        try:  # NaN and infinities are no JSON: SQLite's json functions would refuse every read
            cached = json.dumps({kv.key: any_value(kv.value) for kv in key_values},
                                sort_keys=True, separators=(",", ":"), allow_nan=False)
        except ValueError:
            raise InvalidPoint("an attribute's value is NaN or infinite, which JSON (and so "
                               "the store) cannot hold") from None
        ATTRIBUTE_CACHE.put(wire, cached)
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


# OpenTelemetry's instrument names: "a maximum length of 255 characters"
# (opentelemetry.io/docs/specs/otel/metrics/api/#instrument-name-syntax).
MAX_NAME_CHARS = 255


MAX_ERROR_CHARS = 300  # a client's names and values are cut, so a refusal stays short


def kinds_of(metric, data: str, temporality: int, points) -> tuple[str, str, str]:
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


def refusal(name: str, index: int, point, err: Exception) -> str:
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


def check_labels(attributes: dict, what: str) -> None:
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


def check_point(p, *numbers: tuple[str, float]) -> None:
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


class HistogramColumns(NamedTuple):
    """A histogram point's columns of the points table (store_file.SCHEMA)."""

    count: int
    sum: float | None
    min: float | None
    max: float | None
    bounds: str | None         # explicit buckets: JSON arrays
    bucket_counts: str | None
    exponential: str | None    # exponential buckets: JSON


def histogram_fields(p) -> HistogramColumns:
    _check_buckets(max(len(p.bucket_counts), len(p.explicit_bounds) + 1))
    bounds, counts = list(p.explicit_bounds), list(p.bucket_counts)
    check_point(p, ("count", p.count), *(("bucket count", c) for c in counts),
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
    return HistogramColumns(p.count, *_sum_min_max(p), _bounds_json(tuple(bounds)),
                            json.dumps(counts), None)


@functools.lru_cache(maxsize=1024)
def _bounds_json(bounds: tuple) -> str:
    return json.dumps(list(bounds))


def _sum_min_max(p) -> tuple:
    return tuple(getattr(p, f) if p.HasField(f) else None for f in ("sum", "min", "max"))


def exponential_fields(p) -> HistogramColumns:
    if p.scale not in EXPONENTIAL_SCALES:
        raise InvalidPoint(f"exponential histogram scale {p.scale} is outside [-10, 20]")
    _check_buckets(len(p.positive.bucket_counts) + len(p.negative.bucket_counts) + 1)
    check_point(p, ("count", p.count), ("zero_count", p.zero_count),
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
    return HistogramColumns(p.count, *_sum_min_max(p), None, None, json.dumps(exponential))
