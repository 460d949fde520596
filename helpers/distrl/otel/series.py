"""What a MetricService read holds and what it may cost: the metric kinds, value types,
aligners and reducers as plain enums, distributions (explicit and exponential buckets) and
series as read from the store, their monitored-resource labels, and Budget, a read's ceiling
(limits.Limits)."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
from google.api import metric_pb2
from google.cloud import monitoring_v3

from distrl.otel.filters import RESOURCE_TYPE, Refused

WAL_RESTART = "the collector is starting its write-ahead log again; retry"

PB = {name: getattr(monitoring_v3, name).pb() for name in (
    "ListTimeSeriesRequest", "ListTimeSeriesResponse", "ListMetricDescriptorsRequest",
    "ListMetricDescriptorsResponse", "GetMetricDescriptorRequest", "TimeSeries", "Aggregation")}


def bucket_percentile(bounds: list[float], counts: list[int], q: float) -> float:
    """The q-quantile (0..1) of an explicit-bucket histogram, interpolating inside the bucket
    (the first bucket starts at 0, the overflow bucket is reported at its lower bound)."""
    if not 0 <= q <= 1:
        raise ValueError(f"q={q!r} is invalid: expected a quantile in [0, 1]")
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} bucket counts for {len(bounds)} bounds; expected "
                         f"{len(bounds) + 1}")
    total = sum(counts)
    if total == 0:
        return float("nan")
    rank = q * total
    cumulative = 0.0
    for i, count in enumerate(counts):
        if count and cumulative + count >= rank:
            lower = 0.0 if i == 0 else bounds[i - 1]
            if i == len(bounds):
                return float(lower)
            upper = bounds[i]
            return float(lower + (upper - lower) * (rank - cumulative) / count)
        cumulative += count
    return float(bounds[-1])

class ProtoEnum:
    """A protobuf enum with its values as plain attributes (Value and Name as before): an
    attribute lookup on protobuf's enum wrapper is a slow call, and reading a query's rows
    makes several a point (`python benchmarks/monitoring_query.py` measures the queries)."""

    def __init__(self, wrapper):
        self.__dict__.update(wrapper.items())
        self.Value, self.Name = wrapper.Value, wrapper.Name
        self.names = {number: name for name, number in wrapper.items()}
        self.type_name = wrapper.DESCRIPTOR.name


Aligner = ProtoEnum(PB["Aggregation"].Aligner)
Reducer = ProtoEnum(PB["Aggregation"].Reducer)
Kind = ProtoEnum(metric_pb2.MetricDescriptor.MetricKind)
ValueType = ProtoEnum(metric_pb2.MetricDescriptor.ValueType)
HEADERS = PB["ListTimeSeriesRequest"].TimeSeriesView.Value("HEADERS")


# ---- series read from the store ----

def _common(a: Dist, b: Dist) -> tuple[Dist, Dist]:
    """Two distributions over common bounds. Two exponential histograms go to the coarser of
    their scales, over both their ranges: every bound of a scale is one of every finer
    scale's, so each count lands whole in its bucket (OTel's data model: the scale may change
    between points). Other bounds that differ (a restart with new buckets) are merged over
    the bounds they share, which keeps every count."""
    if a.bounds == b.bounds:
        return a, b
    if a.scale is not None and b.scale is not None:
        scale = min(a.scale, b.scale)
        a, b = a.at_scale(scale), b.at_scale(scale)
        low = min(a.offset, b.offset)
        high = max(a.offset + len(a.counts) - 2, b.offset + len(b.counts) - 2)
        return a.spanning(low, high), b.spanning(low, high)
    shared = tuple(sorted(set(a.bounds) & set(b.bounds)))
    return a.on(shared), b.on(shared)


def exponential_bounds(scale: int, offset: int, buckets: int) -> tuple:
    """The bounds of `buckets` base-2 exponential buckets from index `offset`: bucket i is
    (2^(i / 2^scale), 2^((i + 1) / 2^scale)]."""
    width = 2.0 ** -scale
    return tuple(2.0 ** ((offset + i) * width) for i in range(buckets + 1))


@dataclass
class Dist:
    """An explicit-bucket distribution (Cloud Monitoring's Distribution value). From an
    exponential histogram it keeps its scale and first positive index: counts are then
    [zero and negative, positive buckets from `offset`..., 0]."""

    count: int
    sum: float
    bounds: tuple
    counts: np.ndarray
    scale: int | None = None
    offset: int = 0

    def _with(self, count: int, total: float, counts: np.ndarray) -> Dist:
        return Dist(count, total, self.bounds, counts, self.scale, self.offset)

    def __sub__(self, other: Dist) -> Dist:
        a, b = _common(self, other)
        return a._with(a.count - b.count, a.sum - b.sum, a.counts - b.counts)

    def __add__(self, other: Dist) -> Dist:
        a, b = _common(self, other)
        counts = a.counts + b.counts  # int64 arrays wrap silently: caught here
        if ((b.counts > 0) & (counts < a.counts)).any() or \
                ((b.counts < 0) & (counts > a.counts)).any():
            raise Refused(grpc.StatusCode.OUT_OF_RANGE,
                          "summed bucket counts of a distribution are beyond 64 bits")
        return a._with(a.count + b.count, a.sum + b.sum, counts)

    def at_scale(self, scale: int) -> Dist:
        """The same exponential histogram at a coarser (or its own) scale: fine bucket i is in
        coarse bucket i >> (the scales' difference), whole."""
        shift = self.scale - scale
        if shift == 0:
            return self
        positive = self.counts[1:-1]
        first = self.offset >> shift
        index = ((self.offset + np.arange(len(positive))) >> shift) - first
        merged = np.zeros(int(index[-1]) + 1 if len(index) else 0, dtype=np.int64)
        np.add.at(merged, index, positive)
        return Dist(self.count, self.sum, exponential_bounds(scale, first, len(merged)),
                    np.array([self.counts[0], *merged, 0], dtype=np.int64), scale, first)

    def spanning(self, low: int, high: int) -> Dist:
        """The same exponential histogram over positive indices low..high, empty buckets added."""
        positive = self.counts[1:-1]
        before, after = self.offset - low, high - (self.offset + len(positive) - 1)
        counts = np.concatenate([[self.counts[0]], np.zeros(before, np.int64), positive,
                                 np.zeros(after, np.int64), [0]]).astype(np.int64)
        return Dist(self.count, self.sum, exponential_bounds(self.scale, low, high - low + 1),
                    counts, self.scale, low)

    def on(self, bounds: tuple) -> Dist:
        """The same distribution over bounds that are a subset of its own: adjacent buckets
        merged, so every count stays exact."""
        if bounds == self.bounds:
            return self
        index = {bound: i for i, bound in enumerate(self.bounds)}
        cuts = [0, *(index[bound] + 1 for bound in bounds), len(self.counts)]
        counts = np.array([self.counts[lo:hi].sum() for lo, hi in zip(cuts, cuts[1:])],
                          dtype=np.int64)
        return Dist(self.count, self.sum, bounds, counts)

    def percentile(self, q: float) -> float:
        return bucket_percentile(list(self.bounds), list(self.counts), q)


@dataclass
class Series:
    metric_labels: dict
    resource_labels: dict
    kind: int                  # Kind.GAUGE | Kind.CUMULATIVE | Kind.DELTA
    value_type: int
    points: list = field(default_factory=list)   # (start_ns, end_ns, value), oldest first
    temporalities: list = field(default_factory=list)  # OTLP temporality of each point read
    resource_type: str = RESOURCE_TYPE  # its monitored resource's type

    @functools.cached_property
    def ends(self) -> list[int]:
        """The points' end times (sorted: points are oldest first)."""
        return [p[1] for p in self.points]


def label_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


# A resource that CreateTimeSeries stored (writes.py): its monitored resource's type and labels
# under these keys. Any other resource is an OTLP one, a prometheus_target.
MONITORED_TYPE, MONITORED_LABEL = "monitored_resource.type", "monitored_resource.labels."


def resource_type(resource: dict) -> str:
    return resource.get(MONITORED_TYPE, RESOURCE_TYPE)


def resource_labels(resource: dict, project: str) -> dict:
    if MONITORED_TYPE in resource:
        return {"project_id": project, **{k.removeprefix(MONITORED_LABEL): label_text(v)
                                          for k, v in resource.items()
                                          if k.startswith(MONITORED_LABEL)}}
    return {"project_id": project, "location": "local", "cluster": "local",
            "namespace": label_text(resource.get("service.namespace", "")),
            "job": label_text(resource.get("service.name", "")),
            "instance": label_text(resource.get("service.instance.id", ""))}


def dist_of(row: dict) -> Dist:
    if row["exponential"] is not None:  # base-2 exponential buckets as explicit bounds
        e = row["exponential"]
        positive, offset = e["positive"]["counts"], e["positive"]["offset"]
        below = e["zero_count"] + sum(e["negative"]["counts"])
        counts = np.array([below, *positive, 0], dtype=np.int64)
        return Dist(row["count"], row["sum"] or 0.0,
                    exponential_bounds(e["scale"], offset, len(positive)), counts, e["scale"],
                    offset)
    return Dist(row["count"], row["sum"] or 0.0, tuple(row["bounds"]),
                np.array(row["bucket_counts"], dtype=np.int64))


def value_of(row: dict, value_type: int):
    if value_type == ValueType.DISTRIBUTION:
        return dist_of(row)
    if value_type == ValueType.INT64 and row["int_value"] is not None:
        return int(row["int_value"])
    return float(row["value"])


def kind_of(descriptor: dict) -> int:
    return Kind.Value(descriptor["metric_kind"])


def ns_of(message) -> int:
    """A protobuf Timestamp or Duration in nanoseconds."""
    return message.seconds * 10**9 + message.nanos


class Budget:
    """The cost ceiling of one read: a deadline (the server's max_query_s, or the client's when
    shorter), whether the client still waits, and how many points it may read."""

    def __init__(self, limits, context=None):
        remaining = context.time_remaining() if context is not None else None
        self.seconds = limits.max_query_s if remaining is None else min(limits.max_query_s,
                                                                        max(remaining, 0.0))
        self.deadline = time.monotonic() + self.seconds
        self.context, self.max_rows, self.rows = context, limits.max_rows_scanned, 0
        self.max_series_periods = limits.max_series_periods
        self.max_bytes, self.bytes = limits.max_read_bytes, 0
        self.cancelled = False

    def stopped(self) -> bool:
        """True once the deadline passed or the client went away (also SQLite's progress
        handler: a true answer interrupts the running statement)."""
        if self.context is not None and not self.context.is_active():
            self.cancelled = True
        return self.cancelled or time.monotonic() > self.deadline

    def refusal(self) -> Refused:
        if getattr(self.context, "interrupted", False):
            return Refused(grpc.StatusCode.UNAVAILABLE, WAL_RESTART)
        if self.cancelled:
            return Refused(grpc.StatusCode.CANCELLED, "the client stopped waiting")
        return Refused(grpc.StatusCode.DEADLINE_EXCEEDED,
                       f"the query ran past its deadline of {self.seconds:.1f} s; narrow the "
                       "interval or the filter, or align over longer periods")

    def check(self) -> None:
        if self.stopped():
            raise self.refusal()

    def row(self, held: int = 0) -> None:
        """One point read; held: the bytes it holds while the read runs (0: dropped)."""
        self.rows += 1
        self.hold(held)
        if self.rows > self.max_rows:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the query reads more than {self.max_rows:,} points; narrow the "
                          "interval or the filter")
        if self.rows % 4096 == 0:
            self.check()

    def hold(self, size: int) -> None:
        self.bytes += size
        if self.bytes > self.max_bytes:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the query would hold more than {self.max_bytes / 2**20:g} MiB of "
                          "series and points; narrow the interval or the filter")

    def cells(self, series: int, periods: int) -> None:
        if series * periods > self.max_series_periods:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{series:,} series x {periods:,} alignment periods is more than "
                          f"{self.max_series_periods:,}; align over longer periods, narrow "
                          "the interval, or filter or group the series")


# What read_series uses of a point (not its id, min or max).
