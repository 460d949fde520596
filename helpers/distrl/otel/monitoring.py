"""The part of Cloud Monitoring's MetricService that the notebooks and the RL dashboard use,
answered from the local collector's SQLite store, on the collector's gRPC port.

    from google.cloud import monitoring_v3
    client = explore.monitoring_client()            # the local collector; a project id: Cloud
    client.list_time_series(name="projects/local", filter='metric.type = "..."', ...)

Answered: ListMetricDescriptors, GetMetricDescriptor and ListTimeSeries (filter, interval,
view, paging, aggregation), the monitored-resource calls (resources.py), and the write calls
of Google's samples, CreateMetricDescriptor, DeleteMetricDescriptor and CreateTimeSeries
(writes.py). The semantics are Cloud Monitoring's documented ones:

- Every series that arrives over OTLP has the monitored resource `prometheus_target` (as GKE
  Managed OpenTelemetry writes them), with labels project_id (from the request), location and
  cluster ("local"), namespace (service.namespace), job (service.name) and instance
  (service.instance.id). The point attributes are the metric labels, as strings, keys with
  their dots. A series that CreateTimeSeries wrote keeps its own resource.
- Filters: `metric.type`, `resource.type`, `metric.label(s).KEY`, `resource.label(s).KEY`
  (KEY may be quoted: `metric.labels."rl.run.id"`), compared with `=` or `!=` to a string
  or to starts_with / ends_with / has_substring / one_of / monitoring.regex.full_match,
  joined by AND (or, as Cloud Monitoring reads them, side by side). ListTimeSeries needs
  exactly one `metric.type = "..."`.
- Points come newest first. A point is in the interval when start_time < t <= end_time
  (t = end_time when the two are equal).
- Alignment periods end at interval.end_time and go back by alignment_period while they end
  after start_time; an aligned point stands for the period (end - period, end]. Periods
  without data have no point (Cloud Monitoring interpolates ALIGN_DELTA into them).
- Aligners NONE, DELTA and RATE (CUMULATIVE and DELTA metrics), MEAN, MIN, MAX, SUM, COUNT
  (GAUGE and DELTA), PERCENTILE_99/95/50/05 (GAUGE and DELTA distributions); reducers NONE,
  MEAN, SUM, MIN, MAX, COUNT, PERCENTILE_99/95/50/05 across the series of each group_by group.
  A latency percentile of a cumulative histogram is therefore ALIGN_DELTA followed by
  REDUCE_PERCENTILE_99, as in Cloud Monitoring.
- A counter's delta over a period is the sum of its increments from the newest point at or
  before the period's start to the newest point in it; across a restart of the series (a new
  start time) the new value counts from zero, so the deltas of all periods add up to all
  that was counted.

- A series is also told apart by its instrumentation scope, shown as the metric label
  `otel_scope_name` (OpenTelemetry's Prometheus compatibility rule, opentelemetry.io/docs/specs/
  otel/compatibility/prometheus_and_openmetrics/), so two libraries' identical points are
  two series.

Two deliberate differences: alignment periods may be as short as 1 s (Cloud Monitoring
requires 60 s; local runs are short), and anything not listed above is refused with
UNIMPLEMENTED (or INVALID_ARGUMENT where Cloud Monitoring also refuses it), naming it.

Every read has a cost ceiling (limits.Limits): at most max_queries at once, a deadline (the
client's, or max_query_s when shorter), max_rows_scanned points (or descriptors) read,
max_read_bytes of series and points held, and max_series_periods aligned cells; past one it
ends with DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED. A response stays under 3.5 MiB (gRPC
clients refuse more than 4 MiB by default; ListMetricDescriptors pages by size as well), and
the later pages of a result are served from the first page's computation while it stays in
the page cache. Distributions whose bucket bounds differ (a series restarted with new
buckets, an exponential histogram that changed its scale) are merged over the bounds they
share, every count kept.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc
from google.api import label_pb2, metric_pb2
from google.cloud import monitoring_v3
from google.protobuf.message import DecodeError
from google.rpc import status_pb2

from distrl.otel import resources
from distrl.otel.aggregation import USER_DEFINED_PREFIXES, aggregate, align, check_aggregation
from distrl.otel.filters import (
    METRIC_TYPE_PREFIX,
    RESOURCE_TYPE,
    Refused,
    Term,
    excerpt,
    invalid,
    parse_filter,
    project_of,
    unimplemented,
)
from distrl.otel.reads import (
    INT64_MAX,
    INT64_MIN,
    Selection,
    read_headers,
    read_rows,
    read_series,
)
from distrl.otel.series import (
    HEADERS,
    PB,
    WAL_RESTART,
    Aligner,
    Budget,
    Kind,
    Series,
    ValueType,
    kind_of,
    ns_of,
)

MAX_PAGE_SIZE = 100_000
MAX_DESCRIPTOR_PAGE_SIZE = 10_000
MAX_RESPONSE_BYTES = 3_500_000  # under gRPC's default 4 MiB receive limit of every client
# google.protobuf.Timestamp's range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
TIMESTAMP_SECONDS = range(-62_135_596_800, 253_402_300_800)

# ---- the service ----



def _time_ns(message, what: str) -> int:
    """A request's Timestamp in nanoseconds, refused outside Timestamp's own range (a time near
    2^62 s once overflowed SQLite's integers and came back as UNKNOWN)."""
    if message.seconds not in TIMESTAMP_SECONDS or not 0 <= message.nanos < 10**9:
        raise invalid(f"{what} {message.seconds} s + {message.nanos} ns is invalid: expected "
                       "a time from 0001-01-01 to 9999-12-31 (google.protobuf.Timestamp)")
    return ns_of(message)


def _timestamp(message, ns: int) -> None:
    message.seconds, message.nanos = divmod(ns, 10**9)


def _fingerprint(request) -> str:
    copy = type(request)()
    copy.CopyFrom(request)
    copy.page_token = ""
    copy.page_size = 0
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()[:16]


# What a Prometheus-style name adds to an OTel one (the seed's rl_sample_samples_total,
# rl_loop_duration_histogram).
_PROMETHEUS_SUFFIXES = ("_total", "_histogram", "_bucket", "_count", "_sum", "_gauge",
                        "_counter")


def _underscored(name: str) -> str:
    """An OTel name and its Prometheus form compare equal: rl.sample.samples and
    rl_sample_samples_total both become rl_sample_samples."""
    name = re.sub(r"[^A-Za-z0-9]", "_", name)
    for suffix in _PROMETHEUS_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class PageToken(NamedTuple):
    """What a page token carries: the offset of the page in its result, the id of the result
    kept in the page cache ("" when none is), and for descriptors the last type already listed
    (the next page reads on from it, not from the start: a walk of N pages stays linear)."""

    offset: int = 0
    result: str = ""
    after: str = ""


def _page(request) -> PageToken:
    if not request.page_token:
        return PageToken()
    try:
        token = json.loads(base64.urlsafe_b64decode(request.page_token.encode()))
        page = PageToken(int(token["offset"]), str(token.get("result", "")),
                         str(token.get("after", "")))
        fingerprint = token["request"]
    except Exception:
        raise invalid(f"page_token {excerpt(request.page_token)} is not one this collector gave "
                       "out") from None
    if fingerprint != _fingerprint(request) or page.offset < 0:
        raise invalid(f"page_token {excerpt(request.page_token)} belongs to a different request "
                       "(name, filter, interval, aggregation and view must stay the same)")
    return page


# This reader process's number (receivers._Readers): a page token of a kept result names it.
_READER_ID: int | None = None


def _page_token(request, offset: int, result: str = "", after: str = "") -> str:
    token = {"offset": offset, "request": _fingerprint(request), "result": result}
    if after:
        token["after"] = after
    if result and _READER_ID is not None:
        token["reader"] = _READER_ID
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode()


def token_reader(method: str, request: bytes) -> int | None:
    """The reader a request's page token names (None: no token, or none named), for the
    collector to send the next page where the result is kept. Anything malformed is None: the
    reader that takes the call refuses it."""
    if method not in ("ListTimeSeries", "ListMetricDescriptors"):
        return None
    try:
        token = request_type(method).FromString(request).page_token
        reader = json.loads(base64.urlsafe_b64decode(token.encode())).get("reader") if token else None
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    return reader if isinstance(reader, int) else None


class PageCache:
    """Results kept for their next pages, the least recently used dropped past max_bytes
    (an estimate of their size) or after ttl_s."""

    def __init__(self, max_bytes: int, ttl_s: float = 300.0):
        self.max_bytes, self.ttl_s, self.bytes = max_bytes, ttl_s, 0
        self.items: OrderedDict = OrderedDict()  # id -> (expires, size, value)
        self.lock = threading.Lock()

    def get(self, key: str):
        with self.lock:
            item = self.items.get(key)
            if item is None or item[0] < time.monotonic():
                return None
            self.items.move_to_end(key)
            return item[2]

    def put(self, value, size: int) -> str:
        """Keep value; returns its id ("" when it is larger than the whole cache)."""
        if size > self.max_bytes:
            return ""
        key = secrets.token_hex(8)
        with self.lock:
            now = time.monotonic()
            for old in [k for k, (expires, _, _) in self.items.items() if expires < now]:
                self.bytes -= self.items.pop(old)[1]
            while self.items and self.bytes + size > self.max_bytes:
                self.bytes -= self.items.popitem(last=False)[1][1]
            self.items[key] = (now + self.ttl_s, size, value)
            self.bytes += size
        return key


def _monitored_types(metric_type: str) -> list[str]:
    """The resource types a descriptor names: an OTLP metric's series are prometheus_target's;
    a type written by CreateTimeSeries may have series of any (Cloud Monitoring names none)."""
    return [RESOURCE_TYPE] if metric_type.startswith(METRIC_TYPE_PREFIX) else []


def _page_size(size: int, maximum: int) -> int:
    if size < 0:
        raise invalid(f"page_size {size} is invalid: expected a positive number (0: the "
                       f"maximum, {maximum})")
    return maximum if size == 0 else min(size, maximum)


def _typed_value(message, value, value_type: int) -> None:
    if value_type == ValueType.DISTRIBUTION:
        d = message.distribution_value
        d.count = int(value.count)
        d.mean = value.sum / value.count if value.count else 0.0
        d.bucket_options.explicit_buckets.bounds.extend(value.bounds)
        d.bucket_counts.extend(int(c) for c in value.counts)
    elif value_type == ValueType.INT64:
        # An INT64 sum stays INT64 in Cloud Monitoring ("The value_type of the output is the
        # same as the value_type of the input": googleapis' google/monitoring/v3/common.proto,
        # Aggregation.Reducer.REDUCE_SUM; cloud.google.com/php/docs/reference/cloud-monitoring/
        # latest/V3.Aggregation.Reducer).
        if not INT64_MIN <= int(value) <= INT64_MAX:
            raise Refused(grpc.StatusCode.OUT_OF_RANGE,
                          f"an aggregated INT64 value ({int(value):.3e}) is beyond 64 bits; "
                          "REDUCE_MEAN gives a DOUBLE")
        message.int64_value = int(value)
    elif value_type == ValueType.BOOL:
        message.bool_value = bool(value)
    else:
        message.double_value = float(value)


def _header(s: Series, metric_type: str, unit: str):
    ts = PB["TimeSeries"]()
    ts.metric.type = metric_type
    ts.metric.labels.update(s.metric_labels)
    ts.resource.type = s.resource_type
    ts.resource.labels.update(s.resource_labels)
    ts.metric_kind = s.kind
    ts.value_type = s.value_type
    ts.unit = unit
    return ts


class PagedResult:
    """A ListTimeSeries result as its pages read it. Kept for the next pages, each series is
    its header serialized once (a fraction of what its label dicts take) and its points; a
    FULL page finds its first point by bisecting the running point counts, so no flat list of
    every point is built."""

    def __init__(self, series: list[Series], metric_type: str, unit: str, headers_only: bool):
        self.series: list[Series] | None = series  # until kept: compact() drops them
        self.metric_type, self.unit, self.headers_only = metric_type, unit, headers_only
        self.headers: list[bytes | None] = [None] * len(series)
        self.types = [(s.kind, s.value_type) for s in series]
        self.points = [s.points for s in series]  # oldest first; a page gives newest first
        self.ends = list(itertools.accumulate(len(p) for p in self.points))
        # HEADERS: page_size counts series; FULL: points, and a series may go on next page.
        self.total = len(series) if headers_only else (self.ends[-1] if series else 0)

    def _header(self, i: int, into) -> None:
        if self.headers[i] is None:
            self.headers[i] = _header(self.series[i], self.metric_type,
                                      self.unit).SerializeToString()
        into.MergeFromString(self.headers[i])

    def compact(self) -> int:
        """Serialize every header and drop the series; returns the estimated size in bytes,
        as Python holds it: each header's length, and about 200 more a series (its bytes
        object, type tuple, points list and running count); 160 a point (a tuple of two large
        ints and a float, and its list slot). tracemalloc checks the bound in the tests."""
        for i, h in enumerate(self.headers):
            if h is None:
                self.headers[i] = _header(self.series[i], self.metric_type,
                                          self.unit).SerializeToString()
        self.series = None
        return (sum(len(h) for h in self.headers) + 200 * len(self.headers)
                + 160 * (self.ends[-1] if self.ends else 0))

    def page(self, response, offset: int, size: int, max_bytes: int) -> int:
        """Add entries from `offset` to response, up to `size` of them or until it holds more
        than max_bytes; returns how many it added."""
        stop, pos, response_bytes = min(self.total, offset + size), offset, 0
        if self.headers_only:
            while pos < stop and response_bytes <= max_bytes:
                header = response.time_series.add()
                self._header(pos, header)
                response_bytes += header.ByteSize()
                pos += 1
            return pos - offset
        i, current = bisect.bisect_right(self.ends, pos), None  # the series holding `pos`
        while pos < stop and response_bytes <= max_bytes:
            if pos == self.ends[i]:  # on to the next series (none is empty)
                i, current = i + 1, None
            if current is None:  # (add() returns the stored message)
                current = response.time_series.add()
                self._header(i, current)
                response_bytes += current.ByteSize()
            kind, value_type = self.types[i]
            start, end, value = self.points[i][self.ends[i] - 1 - pos]  # newest first
            point = current.points.add()
            _timestamp(point.interval.end_time, end)
            # A GAUGE point's start is its end: TimeInterval's documented default (cloud.google.
            # com/monitoring/api/ref_v3/rest/v3/TimeInterval), which Cloud Monitoring returns
            _timestamp(point.interval.start_time, end if kind == Kind.GAUGE else start)
            _typed_value(point.value, value, value_type)
            response_bytes += point.ByteSize() + 4
            pos += 1
        return pos - offset


class MetricService:
    """Answers MetricService requests (protobuf messages) from a CollectorStore, within the
    store's limits (limits.Limits)."""

    def __init__(self, store):
        self.store = store
        self.limits = store.limits
        self.pages = PageCache(self.limits.page_cache_bytes)

    def _descriptors(self, budget: Budget | None = None, after: str = ""):
        """Every descriptor after the type `after`, in metric type order, streamed (a store
        may hold many)."""
        for row in read_rows(self.store, "SELECT * FROM metric_descriptors WHERE metric_type > ?"
                             " ORDER BY metric_type", (after,), budget):
            if budget:
                budget.row()
            yield row

    def _descriptor(self, metric_type: str) -> dict | None:
        rows = self.store.query("SELECT * FROM metric_descriptors WHERE metric_type = ?",
                                (metric_type,))
        return rows[0] if rows else None

    def _descriptor_pb(self, d: dict, project: str):
        out = metric_pb2.MetricDescriptor(
            name=f"projects/{project}/metricDescriptors/{d['metric_type']}",
            type=d["metric_type"], metric_kind=Kind.Value(d["metric_kind"]),
            value_type=ValueType.Value(d["value_type"]), unit=d["unit"] or "",
            description=d["description"] or "", display_name=d["name"],
            monitored_resource_types=_monitored_types(d["metric_type"]))
        out.labels.extend(label_pb2.LabelDescriptor(key=k)
                          for k in self.store.label_keys(d["metric_type"]))
        return out

    def list_metric_descriptors(self, request, context=None):
        budget = Budget(self.limits, context)
        project = project_of(request.name, "name")
        terms = parse_filter(request.filter) if request.filter else []
        for t in terms:
            if t.scope not in ("metric.type", "resource.type"):
                raise unimplemented(f"ListMetricDescriptors filter on {t.scope} is not "
                                     "supported; filter on metric.type or resource.type")
        size = _page_size(request.page_size, MAX_DESCRIPTOR_PAGE_SIZE)
        page = _page(request)
        response = PB["ListMetricDescriptorsResponse"]()
        taken, used = 0, 0
        for d in self._descriptors(budget, page.after):
            if not all(t.matches(d["metric_type"]) if t.scope == "metric.type" else
                       any(t.matches(r) for r in _monitored_types(d["metric_type"]))
                       for t in terms):
                continue
            descriptor = self._descriptor_pb(d, project) if taken < size else None
            if descriptor is not None:
                used += descriptor.ByteSize() + 8
            if descriptor is None or (taken and used > MAX_RESPONSE_BYTES):
                # one more matches: the rest on the next page, read on from the last one listed
                response.next_page_token = _page_token(
                    request, page.offset + taken,
                    after=response.metric_descriptors[-1].type)
                break
            response.metric_descriptors.append(descriptor)
            taken += 1
        return response

    def get_metric_descriptor(self, request):
        project, metric_type = descriptor_name(request.name)
        descriptor = self._descriptor(metric_type)
        if descriptor is not None:
            return self._descriptor_pb(descriptor, project)
        raise Refused(grpc.StatusCode.NOT_FOUND, f"no metric descriptor {excerpt(metric_type)}")

    def list_time_series(self, request, context=None):
        budget = Budget(self.limits, context)
        project = project_of(request.name, "name")
        if not request.filter:
            raise invalid("filter is required and must name one metric type: "
                           'metric.type = "..."')
        terms = parse_filter(request.filter)
        types = [t for t in terms if t.scope == "metric.type"]
        if len(types) != 1 or types[0].negate or types[0].function is not None:
            raise invalid(f"filter {excerpt(request.filter)} must name exactly one metric type with "
                           'metric.type = "..."')
        metric_type = types[0].args[0]
        if not request.interval.HasField("end_time"):
            raise invalid("interval.end_time is required")
        end_ns = _time_ns(request.interval.end_time, "interval.end_time")
        start_ns = _time_ns(request.interval.start_time, "interval.start_time") if \
            request.interval.HasField("start_time") else end_ns
        if start_ns > end_ns:
            raise invalid(f"interval start_time {start_ns} ns is after end_time {end_ns} ns")
        if request.HasField("secondary_aggregation") and (
                request.secondary_aggregation.per_series_aligner
                or request.secondary_aggregation.cross_series_reducer):
            raise unimplemented("secondary_aggregation is not supported")
        if request.order_by:
            raise unimplemented(f"order_by {excerpt(request.order_by)} is not supported")
        headers_only = request.view == HEADERS
        size = _page_size(request.page_size, MAX_PAGE_SIZE)
        offset, result_id, _ = _page(request)
        descriptor = self._descriptor(metric_type)
        check_aggregation(request.aggregation, start_ns, end_ns, metric_type,
                          kind_of(descriptor) if descriptor else None,
                          ValueType.Value(descriptor["value_type"]) if descriptor else None)
        response = PB["ListTimeSeriesResponse"]()
        hints = self._hints(metric_type, descriptor, terms)
        if descriptor is None and not metric_type.startswith(USER_DEFINED_PREFIXES):
            return response  # a built-in type with no data here: Cloud Monitoring lists nothing
        if descriptor is None:  # Cloud Monitoring's answer, word for word, plus the hint
            named = (json.dumps(metric_type, ensure_ascii=False) if len(metric_type) <= 200
                     else excerpt(metric_type, 200))  # as the filter writes it
            raise Refused(grpc.StatusCode.NOT_FOUND, " ".join([
                f"Cannot find metric(s) that match type = {named}. If a metric was created "
                "recently, it could take up to 10 minutes to become available.", *hints]))
        if hints:  # the seed's underscored label keys: answered as asked, with the dotted key
            response.execution_errors.extend(
                status_pb2.Status(code=grpc.StatusCode.NOT_FOUND.value[0], message=hint)
                for hint in hints)
        unit = descriptor["unit"] or ""
        if request.aggregation.per_series_aligner == Aligner.ALIGN_RATE:
            unit = f"{unit}/s" if unit else "1/s"
        result = self.pages.get(result_id) if result_id else None
        if result is None:  # the first page, or a page whose result left the cache
            selection = Selection(descriptor, project, terms)
            result = PagedResult(self._series(request, selection, start_ns, end_ns, budget),
                                 metric_type, unit, headers_only)
        taken = result.page(response, offset, size, MAX_RESPONSE_BYTES)
        if offset + taken < result.total:
            if not result_id:
                result_id = self.pages.put(result, result.compact())
            response.next_page_token = _page_token(request, offset + taken, result_id)
        return response

    def _hints(self, metric_type: str, descriptor: dict | None, terms: list[Term]) -> list[str]:
        """Where a query names a metric type or label key in the underscored form (a Prometheus
        scrape's, the seed's) and the store has it dotted: what to write instead. The answer
        itself stays what Cloud Monitoring gives: NOT_FOUND for a metric type that does not
        exist, no series for a label that no series has."""
        hints = []
        if descriptor is None:
            # prometheus.googleapis.com/NAME/KIND: compare the NAME parts.
            wanted = _underscored(metric_type.rsplit("/", 2)[-2] if metric_type.count("/") >= 2
                                  else metric_type)
            for d in self._descriptors():
                if len(hints) == 3:
                    break
                if _underscored(d["name"]) == wanted:
                    hints.append(f"no metric type {excerpt(metric_type, 100)}: OTLP metrics "
                                 "keep their dots in Cloud Monitoring; did you mean "
                                 f"{d['metric_type']!r}?")
            return hints
        keys = set(self.store.label_keys(descriptor["metric_type"]))
        for t in terms:
            if t.scope == "metric.label" and t.key not in keys:
                dotted = [k for k in keys if _underscored(k) == _underscored(t.key)]
                if dotted:
                    hints.append(f"no series has the label {excerpt(t.key, 60)}; its key is "
                                 f'{dotted[0]!r}: metric.labels."{dotted[0]}"')
        return hints

    def _series(self, request, selection: Selection, start_ns: int, end_ns: int, budget):
        """The request's series after aggregation, those with points."""
        aligned = request.aggregation.per_series_aligner != Aligner.ALIGN_NONE
        if request.view == HEADERS and not aligned:  # no aggregation: no point is shown
            return read_headers(self.store, selection, start_ns, end_ns, budget)
        period_ns = ns_of(request.aggregation.alignment_period) if aligned else 0
        # Nothing older than the first period (or the interval) can matter to a gauge.
        since_ns = start_ns - period_ns if aligned else min(start_ns, end_ns - 1)
        periods = max(1, -(-(end_ns - start_ns) // period_ns)) if aligned else 0
        each, seen = None, itertools.count(1)
        if aligned:  # each series aligned as its points are in: the read holds its cells
            def each(s: Series) -> Series:
                budget.cells(next(seen), periods)
                return align(s, request.aggregation, start_ns, end_ns)
        series = read_series(self.store, selection, end_ns, since_ns, budget, each)
        budget.check()
        series = aggregate(series, request.aggregation, start_ns, end_ns, budget, aligned)
        budget.check()
        return [s for s in series if s.points]


METHODS = ("ListMonitoredResourceDescriptors", "GetMonitoredResourceDescriptor",
            "ListMetricDescriptors", "GetMetricDescriptor", "CreateMetricDescriptor",
            "DeleteMetricDescriptor", "ListTimeSeries", "CreateTimeSeries",
            "CreateServiceTimeSeries")
SERVICE = "google.monitoring.v3.MetricService"
WRITTEN = ("CreateMetricDescriptor", "DeleteMetricDescriptor", "CreateTimeSeries")  # writes.py
ANSWERED = {"ListMetricDescriptors": "ListMetricDescriptorsRequest",
            "GetMetricDescriptor": "GetMetricDescriptorRequest",
            "ListTimeSeries": "ListTimeSeriesRequest",
            "ListMonitoredResourceDescriptors": "ListMonitoredResourceDescriptorsRequest",
            "GetMonitoredResourceDescriptor": "GetMonitoredResourceDescriptorRequest"}


def deletable_type(request: bytes) -> str:
    """The metric type a DeleteMetricDescriptor request names, once checked: only a
    user-defined type can be deleted, as in Cloud Monitoring ("Only user-created custom metrics
    can be deleted": cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.metricDescriptors/
    delete). Refused names the fault."""
    try:
        name = monitoring_v3.DeleteMetricDescriptorRequest.pb().FromString(request).name
    except DecodeError as err:
        raise invalid(f"not a DeleteMetricDescriptor request: {err}") from None
    _, metric_type = descriptor_name(name)
    if not metric_type.startswith(USER_DEFINED_PREFIXES):
        raise invalid(f"{excerpt(metric_type)} is not a user-defined metric type (one of "
                      f"{', '.join(USER_DEFINED_PREFIXES)}): only those can be deleted")
    return metric_type


def descriptor_name(name: str) -> tuple[str, str]:
    """(project, metric type) of projects/PROJECT_ID/metricDescriptors/METRIC_TYPE."""
    match = re.fullmatch(r"projects/([^/]+)/metricDescriptors/(.+)", name)
    if not match:
        raise invalid(f"name {excerpt(name)} is invalid: expected "
                      "projects/PROJECT_ID/metricDescriptors/METRIC_TYPE")
    return match.group(1), match.group(2)


def request_type(method: str):
    """The request message of an answered method; None for the others."""
    return getattr(monitoring_v3, ANSWERED[method]).pb() if method in ANSWERED else None


def answer(service: MetricService, method: str, request, context):
    """One MetricService call, answered from the store; what is refused becomes the call's
    status (a message cut to 400 characters)."""
    if method not in ANSWERED:
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      f"MetricService.{method} is not answered by the local collector "
                      f"(it answers {', '.join(ANSWERED)}, and the collector's writer "
                      f"{', '.join(WRITTEN)})")
    try:
        if method == "ListTimeSeries":
            return service.list_time_series(request, context)
        if method == "ListMetricDescriptors":
            return service.list_metric_descriptors(request, context)
        if method == "GetMetricDescriptor":
            return service.get_metric_descriptor(request)
        if method == "ListMonitoredResourceDescriptors":
            return resources.list_descriptors(request)
        return resources.get_descriptor(request)
    except Refused as err:
        message = str(err)
        context.abort(err.code, message if len(message) <= 400 else message[:400] + "...")


# ---- answering in a reader process ----
# Reads are Python work that holds the interpreter lock for seconds; in the collector's own
# process every export would wait for it. The collector therefore answers reads in processes
# of their own, at a lower CPU priority, on read-only connections to the same file (WAL).
# `python benchmarks/collector_under_load.py` measures export latency beside heavy reads.

_READER: MetricService | None = None




class _ReadDeadline:
    """What Budget and answer() ask of a gRPC context, in a reader process: the time left of
    the call (the collector passes it), whether its client still waits (the collector sends
    "cancel" down the pipe when it went away), and abort() as a Refused."""

    def __init__(self, seconds: float, conn=None, interrupt=None):
        self.end = time.monotonic() + seconds
        self.conn, self.active, self.stop_after = conn, True, False
        self.interrupt, self.interrupted = interrupt, False

    def time_remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def is_active(self) -> bool:
        if self.active and self.interrupt is not None and self.interrupt.is_set():
            self.active, self.interrupted = False, True  # the writer restarts its log
        if self.active and self.conn is not None and self.conn.poll(0):
            message = self.conn.recv()  # "cancel", or None: the collector stops
            self.active, self.stop_after = False, message is None
        return self.active

    def abort(self, code: grpc.StatusCode, message: str):
        raise Refused(code, message)


def reader_main(conn, open_store: Callable[[], Any], nice: int, interrupt=None,
                reader_id: int | None = None) -> None:
    """A reader process (receivers._Readers): at a lower priority, answers the calls that
    come through conn with answer_bytes until it gets None or conn closes. open_store (picklable:
    the process is spawned) opens the collector's store read-only in this process. A "cancel"
    that arrives between reads was meant for the read before: it is dropped."""
    import os

    global _READER, _READER_ID
    _READER_ID = reader_id
    os.nice(nice)
    _READER = MetricService(open_store())
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):  # the collector has gone
            return
        if call is None:
            return
        if call == "cancel":
            continue
        if interrupt is not None and interrupt.is_set():  # not even a short read meanwhile
            conn.send((grpc.StatusCode.UNAVAILABLE.value[0], WAL_RESTART))
            continue
        context = _ReadDeadline(call[2], conn, interrupt)
        conn.send(answer_bytes(*call[:2], context))
        if context.stop_after:
            return


def answer_bytes(method: str, request: bytes, context: _ReadDeadline) -> tuple[int, bytes | str]:
    """One MetricService call in a reader process: (0, the response's bytes), or (a gRPC
    status code's number, its message). No error ends the process: one this module did not
    foresee is INTERNAL, naming it."""
    try:
        message = request_type(method).FromString(request) if method in ANSWERED else None
        return 0, answer(_READER, method, message, context).SerializeToString()
    except Refused as err:
        return err.code.value[0], str(err)
    except DecodeError as err:
        return grpc.StatusCode.INVALID_ARGUMENT.value[0], f"not a {method} request: {err}"
    except Exception as err:  # noqa: BLE001 (a reader answers every call, and lives on)
        return grpc.StatusCode.INTERNAL.value[0], f"the read failed: {err!r}"[:400]
