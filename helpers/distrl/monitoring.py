"""The part of Cloud Monitoring's MetricService that the notebooks and the RL dashboard use,
answered from the local collector's SQLite store, on the collector's gRPC port.

    from google.cloud import monitoring_v3
    client = explore.monitoring_client()            # the local collector; a project id: Cloud
    client.list_time_series(name="projects/local", filter='metric.type = "..."', ...)

Answered: ListMetricDescriptors, GetMetricDescriptor and ListTimeSeries (filter, interval,
view, paging, aggregation). The semantics are Cloud Monitoring's documented ones:

- Every series has the monitored resource `prometheus_target` (as GKE Managed OpenTelemetry
  writes them), with labels project_id (from the request), location and cluster ("local"),
  namespace (service.namespace), job (service.name) and instance (service.instance.id). The
  point attributes are the metric labels, as strings, keys with their dots.
- Filters: `metric.type`, `resource.type`, `metric.label(s).KEY`, `resource.label(s).KEY`
  (KEY may be quoted: `metric.labels."rl.run.id"`), compared with `=` or `!=` to a string
  or to starts_with / ends_with / has_substring / one_of / monitoring.regex.full_match,
  joined by AND. ListTimeSeries needs exactly one `metric.type = "..."`.
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

Two deliberate differences: alignment periods may be as short as 1 s (Cloud Monitoring
requires 60 s; local runs are short), and anything not listed above is refused with
UNIMPLEMENTED (or INVALID_ARGUMENT where Cloud Monitoring also refuses it), naming it.
"""

from __future__ import annotations

import base64
import bisect
import functools
import hashlib
import json
import math
import operator
import re
from dataclasses import dataclass, field

import grpc
import numpy as np
import re2
from google.api import label_pb2, metric_pb2
from google.cloud import monitoring_v3

RESOURCE_TYPE = "prometheus_target"
MAX_PAGE_SIZE = 100_000
MAX_DESCRIPTOR_PAGE_SIZE = 10_000
MAX_PERIODS = 100_000

_pb = {name: getattr(monitoring_v3, name).pb() for name in (
    "ListTimeSeriesRequest", "ListTimeSeriesResponse", "ListMetricDescriptorsRequest",
    "ListMetricDescriptorsResponse", "GetMetricDescriptorRequest", "TimeSeries", "Aggregation")}
Aligner = _pb["Aggregation"].Aligner
Reducer = _pb["Aggregation"].Reducer
Kind = metric_pb2.MetricDescriptor.MetricKind
ValueType = metric_pb2.MetricDescriptor.ValueType
HEADERS = _pb["ListTimeSeriesRequest"].TimeSeriesView.Value("HEADERS")


class Refused(Exception):
    """A request the local collector does not answer; becomes a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def _invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def _unimplemented(message: str) -> Refused:
    return Refused(grpc.StatusCode.UNIMPLEMENTED, f"{message} (the local collector answers "
                   "the subset of Cloud Monitoring that distrl.monitoring documents)")


# ---- filters ----

@functools.lru_cache(maxsize=256)
def _re2(pattern: str):
    """Cloud Monitoring's regex dialect is RE2 (cloud.google.com/monitoring/api/v3/filters):
    linear time, no backtracking, so no pattern can stall the collector ("(a+)+" with Python's
    re doubles its time with every character)."""
    options = re2.Options()
    options.log_errors = False  # a client's bad pattern is its error, not our log line
    return re2.compile(pattern, options)


_TOKEN = re.compile(r"""
    \s*(?:
      (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<selector>[A-Za-z_]\w*(?:\.(?:[A-Za-z_][\w-]*|"(?:[^"\\]|\\.)*"))*)
    | (?P<op>!=|=~|>=|<=|=|<|>|:)
    | (?P<punct>[(),])
    | (?P<bad>\S)
    )""", re.VERBOSE)
_FUNCTIONS = {
    "starts_with": lambda value, args: value.startswith(args[0]),
    "ends_with": lambda value, args: value.endswith(args[0]),
    "has_substring": lambda value, args: args[0] in value,
    "one_of": lambda value, args: value in args,
    "monitoring.regex.full_match": lambda value, args: _re2(args[0]).fullmatch(value) is not None,
}


def _unquote(text: str) -> str:
    return json.loads(text) if text.startswith('"') else text


@dataclass(frozen=True)
class Term:
    """One comparison of a filter: selector (e.g. ("metric.label", "rl.run.id")) op value."""

    scope: str                 # metric.type | resource.type | metric.label | resource.label
    key: str | None
    negate: bool
    function: str | None       # None: equality with args[0]
    args: tuple[str, ...]

    def matches(self, value: str | None) -> bool:
        if value is None:
            hit = False
        elif self.function is None:
            hit = value == self.args[0]
        else:
            hit = _FUNCTIONS[self.function](value, self.args)
        return hit != self.negate


def _selector(text: str) -> tuple[str, str | None]:
    parts = re.findall(r'"(?:[^"\\]|\\.)*"|[^.]+', text)
    head = ".".join(parts[:2])
    if head in ("metric.type", "resource.type") and len(parts) == 2:
        return head, None
    if head in ("metric.label", "metric.labels", "resource.label", "resource.labels") \
            and len(parts) >= 3:
        key = ".".join(_unquote(p) for p in parts[2:])
        return head.rstrip("s"), key
    if parts[0] in ("metadata", "project", "group"):  # real selectors, not answered here
        raise _unimplemented(f"filter selector {text!r} is not supported; use metric.type, "
                             "resource.type, metric.labels.KEY or resource.labels.KEY")
    raise _invalid(f"filter selector {text!r} is not a Cloud Monitoring selector (expected "
                   "metric.type, resource.type, metric.labels.KEY or resource.labels.KEY)")


def parse_filter(text: str) -> list[Term]:
    """The terms of a Cloud Monitoring filter (all must hold), or Refused."""
    tokens = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "bad":
            raise _invalid(f"filter {text!r}: unexpected character {value!r}")
        tokens.append((kind, value))
    terms, i = [], 0

    def take(expected_kind=None):
        nonlocal i
        if i >= len(tokens):
            raise _invalid(f"filter {text!r} ends early")
        token = tokens[i]
        i += 1
        if expected_kind and token[0] != expected_kind:
            raise _invalid(f"filter {text!r}: expected a {expected_kind}, got {token[1]!r}")
        return token

    while i < len(tokens):
        if terms:
            kind, value = take()
            if value == "AND":
                pass
            elif value in ("OR", "NOT"):
                raise _unimplemented(f"filter operator {value} is not supported; join "
                                     "comparisons with AND")
            else:
                raise _invalid(f"filter {text!r}: expected AND between comparisons, got "
                               f"{value!r}")
        kind, value = take()
        if value in ("NOT", "OR", "AND") or value == "(":
            raise _unimplemented(f"filter {'parentheses' if value == '(' else value} "
                                 "is not supported; join comparisons with AND")
        if kind != "selector":
            raise _invalid(f"filter {text!r}: expected a selector such as metric.type, got "
                           f"{value!r}")
        scope, key = _selector(value)
        _, op = take("op")
        if op not in ("=", "!="):
            raise _unimplemented(f"filter operator {op!r} is not supported; use = or != "
                                 "(with a function such as starts_with or "
                                 "monitoring.regex.full_match for patterns)")
        kind, value = take()
        if kind == "string":
            terms.append(Term(scope, key, op == "!=", None, (_unquote(value),)))
            continue
        if kind != "selector":
            raise _invalid(f"filter {text!r}: expected a quoted string or a function after "
                           f"{op}, got {value!r}")
        if value not in _FUNCTIONS:
            raise _unimplemented(f"filter function {value!r} is not supported; supported: "
                                 f"{', '.join(_FUNCTIONS)}")
        function = value
        take("punct")  # (
        args = []
        while True:
            args.append(_unquote(take("string")[1]))
            _, punct = take("punct")
            if punct == ")":
                break
            if punct != ",":
                raise _invalid(f"filter {text!r}: expected , or ) in {function}(...)")
        if function != "one_of" and len(args) != 1:
            raise _invalid(f"filter {text!r}: {function} takes one string, got {len(args)}")
        if function == "monitoring.regex.full_match":
            try:
                _re2(args[0])
            except re2.error as err:
                raise _invalid(f"filter: bad RE2 regular expression {args[0][:80]!r}: "
                               f"{err.args[0] if err.args else err}") from None
        terms.append(Term(scope, key, op == "!=", function, tuple(args)))
    return terms


# ---- series read from the store ----

@dataclass
class Dist:
    """An explicit-bucket distribution (Cloud Monitoring's Distribution value)."""

    count: int
    sum: float
    bounds: tuple
    counts: np.ndarray

    def __sub__(self, other: Dist) -> Dist:
        return Dist(self.count - other.count, self.sum - other.sum, self.bounds,
                    self.counts - other.counts)

    def __add__(self, other: Dist) -> Dist:
        if self.bounds != other.bounds:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                          f"cannot merge distributions with different bucket bounds "
                          f"{list(self.bounds)} and {list(other.bounds)}")
        return Dist(self.count + other.count, self.sum + other.sum, self.bounds,
                    self.counts + other.counts)

    def percentile(self, q: float) -> float:
        from distrl.explore import bucket_percentile
        return bucket_percentile(list(self.bounds), list(self.counts), q)


@dataclass
class Series:
    metric_labels: dict
    resource_labels: dict
    kind: int                  # Kind.GAUGE | Kind.CUMULATIVE | Kind.DELTA
    value_type: int
    points: list = field(default_factory=list)   # (start_ns, end_ns, value), oldest first
    temporalities: list = field(default_factory=list)  # OTLP temporality of each point read

    @functools.cached_property
    def ends(self) -> list[int]:
        """The points' end times (sorted: points are oldest first)."""
        return [p[1] for p in self.points]


def _label(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def resource_labels(resource: dict, project: str) -> dict:
    return {"project_id": project, "location": "local", "cluster": "local",
            "namespace": _label(resource.get("service.namespace", "")),
            "job": _label(resource.get("service.name", "")),
            "instance": _label(resource.get("service.instance.id", ""))}


def _dist_of(row: dict) -> Dist:
    if row["exponential"] is not None:  # base-2 exponential buckets as explicit bounds
        e = row["exponential"]
        base = 2.0 ** (2.0 ** -e["scale"])
        positive = e["positive"]["counts"]
        bounds = tuple(base ** (e["positive"]["offset"] + i) for i in range(len(positive) + 1))
        below = e["zero_count"] + sum(e["negative"]["counts"])
        counts = np.array([below, *positive, 0], dtype=np.int64)
        return Dist(row["count"], row["sum"] or 0.0, bounds, counts)
    return Dist(row["count"], row["sum"] or 0.0, tuple(row["bounds"]),
                np.array(row["bucket_counts"], dtype=np.int64))


def _value_of(row: dict, value_type: int):
    if value_type == ValueType.DISTRIBUTION:
        return _dist_of(row)
    if value_type == ValueType.INT64 and row["int_value"] is not None:
        return int(row["int_value"])
    return float(row["value"])


def _kind_of(descriptor: dict) -> int:
    return Kind.Value(descriptor["metric_kind"])


def read_series(store, descriptor: dict, project: str, terms: list[Term], end_ns: int,
                since_ns: int | None = None) -> list[Series]:
    """The descriptor's series that match the filter terms, with their points up to end_ns
    (for a gauge, only those after since_ns), in the descriptor's kind (delta points of a
    cumulative metric are summed up, cumulative points of a delta metric differenced)."""
    kind, value_type = _kind_of(descriptor), ValueType.Value(descriptor["value_type"])
    sql = ("SELECT p.*, r.attributes AS resource FROM points p JOIN resources r ON "
           "r.id = p.resource_id WHERE metric_type = ? AND time_ns <= ?")
    params: tuple = (descriptor["metric_type"], end_ns)
    if kind == Kind.GAUGE and since_ns is not None:  # counters need the points before, too
        sql += " AND time_ns > ?"
        params += (since_ns,)
    series: dict = {}
    for row in store.query(sql + " ORDER BY time_ns, p.id", params):
        key = (row["resource_id"], row["attributes"])
        if key not in series:  # a new series: decide once whether the filter keeps it
            attributes = json.loads(row["attributes"])
            s = Series({k: _label(v) for k, v in attributes.items()},
                       resource_labels(json.loads(row["resource"]), project), kind, value_type)
            series[key] = s if _matches(terms, s) else None
        s = series[key]
        if s is None:
            continue
        for name in ("bounds", "bucket_counts", "exponential"):
            if row[name] is not None:
                row[name] = json.loads(row[name])
        s.points.append((row["start_ns"], row["time_ns"], _value_of(row, value_type)))
        s.temporalities.append(row["temporality"])
    out = [s for s in series.values() if s is not None]
    for s in out:
        s.points = _as_kind(s.points, s.temporalities, kind)
    return out


def _matches(terms: list[Term], s: Series) -> bool:
    for t in terms:
        if t.scope == "metric.label":
            value = s.metric_labels.get(t.key)
        elif t.scope == "resource.label":
            value = s.resource_labels.get(t.key)
        elif t.scope == "resource.type":
            value = RESOURCE_TYPE
        else:
            continue  # metric.type: chose the descriptor
        if not t.matches(value):
            return False
    return True


def _as_kind(points: list, temporalities: list, kind: int) -> list:
    if kind == Kind.GAUGE:
        return [(t, t, v) for _, t, v in points]
    out, total, last = [], None, None
    for (start, end, value), temporality in zip(points, temporalities):
        if kind == Kind.CUMULATIVE and temporality == 1:  # delta into running totals
            total = value if total is None else total + value
            first_start = out[0][0] if out else start
            out.append((first_start, end, total))
        elif kind == Kind.DELTA and temporality == 2:     # cumulative into deltas
            same_life = last is not None and last[0] == start
            out.append((last[1] if same_life else start, end,
                        value - last[2] if same_life else value))
            last = (start, end, value)
        else:
            out.append((start, end, value))
    return out


# ---- alignment and reduction ----

_ALIGNERS = {
    Aligner.ALIGN_DELTA: "delta", Aligner.ALIGN_RATE: "rate", Aligner.ALIGN_MEAN: "mean",
    Aligner.ALIGN_MIN: "min", Aligner.ALIGN_MAX: "max", Aligner.ALIGN_SUM: "sum",
    Aligner.ALIGN_COUNT: "count", Aligner.ALIGN_PERCENTILE_99: 0.99,
    Aligner.ALIGN_PERCENTILE_95: 0.95, Aligner.ALIGN_PERCENTILE_50: 0.50,
    Aligner.ALIGN_PERCENTILE_05: 0.05}
_REDUCERS = {
    Reducer.REDUCE_MEAN: "mean", Reducer.REDUCE_SUM: "sum", Reducer.REDUCE_MIN: "min",
    Reducer.REDUCE_MAX: "max", Reducer.REDUCE_COUNT: "count",
    Reducer.REDUCE_PERCENTILE_99: 0.99, Reducer.REDUCE_PERCENTILE_95: 0.95,
    Reducer.REDUCE_PERCENTILE_50: 0.50, Reducer.REDUCE_PERCENTILE_05: 0.05}


def _check_aligner(aligner: int, kind: int, value_type: int, metric_type: str) -> None:
    name = Aligner.Name(aligner)
    op = _ALIGNERS[aligner]
    dist = value_type == ValueType.DISTRIBUTION
    what = f"{Kind.Name(kind)} {ValueType.Name(value_type)} metric {metric_type}"
    if op in ("delta", "rate"):
        ok = kind in (Kind.CUMULATIVE, Kind.DELTA) and (op == "delta" or not dist)
    elif isinstance(op, float):
        ok = kind in (Kind.GAUGE, Kind.DELTA) and dist
    else:
        ok = kind in (Kind.GAUGE, Kind.DELTA) and (op == "sum" or not dist)
    if not ok:
        hint = ""
        if isinstance(op, float) and kind == Kind.CUMULATIVE:
            hint = (f"; for a percentile of a cumulative histogram use ALIGN_DELTA with "
                    f"REDUCE_PERCENTILE_{round(op * 100):02d}")
        elif kind == Kind.CUMULATIVE:
            hint = "; for a counter use ALIGN_DELTA or ALIGN_RATE"
        raise _invalid(f"per_series_aligner {name} is not valid for the {what}{hint}")


def _period_value(s: Series, op, lo: int, hi: int):
    """The aligned value of series s for the period (lo, hi], or None without data there."""
    ends = s.ends
    first, last = bisect.bisect_right(ends, lo), bisect.bisect_right(ends, hi)
    if first == last:
        return None
    inside = s.points[first:last]
    values = [p[2] for p in inside]
    if s.kind == Kind.CUMULATIVE:  # delta / rate: the increments from lo to hi
        previous = s.points[first - 1] if first else None
        delta = None
        for point in inside:
            # Across a restart (a new start time) the new value counts from zero.
            step = point[2] - previous[2] if previous and previous[0] == point[0] else point[2]
            delta = step if delta is None else delta + step
            previous = point
        return delta if op == "delta" else delta / ((hi - lo) / 1e9)
    if op == "delta" or op == "sum":
        return _total(values)
    if op == "rate":
        return sum(values) / ((hi - lo) / 1e9)
    if op == "count":
        return len(values)
    if isinstance(op, float):
        merged = _total(values)
        return merged.percentile(op) if merged.count else None
    return {"mean": lambda: float(np.mean(values)), "min": lambda: min(values),
            "max": lambda: max(values)}[op]()


def _aligned_types(op, kind: int, value_type: int) -> tuple[int, int]:
    if op == "delta":
        return Kind.DELTA, value_type
    if op == "sum":
        return (Kind.DELTA if kind == Kind.DELTA else Kind.GAUGE), value_type
    if op == "count":
        return Kind.GAUGE, ValueType.INT64
    if op in ("min", "max"):
        return Kind.GAUGE, value_type
    return Kind.GAUGE, ValueType.DOUBLE  # rate, mean, percentiles


def _total(values: list):
    """The sum of numbers or the merge of distributions (Dist has no zero to start from)."""
    return functools.reduce(operator.add, values)


def _reduce(op, values: list):
    if op == "count":
        return len(values)
    if isinstance(values[0], Dist):  # MIN and MAX were refused by check_aggregation
        merged = _total(values)
        if op == "sum":
            return merged
        if op == "mean":
            return merged.sum / merged.count if merged.count else math.nan
        return merged.percentile(op)
    if op == "sum":
        return sum(values)
    if op == "mean":
        return float(np.mean(values))
    if op == "min":
        return min(values)
    if op == "max":
        return max(values)
    return float(np.percentile(values, op * 100))  # linear interpolation between values


def _group_field(text: str) -> tuple[str, str]:
    if text == "resource.type":
        return "resource.type", ""
    scope, key = _selector(text)
    if key is None:
        raise _invalid(f"group_by_fields entry {text!r}: expected metric.labels.KEY, "
                       "resource.labels.KEY or resource.type")
    return scope, key


def check_aggregation(aggregation, start_ns: int, end_ns: int, metric_type: str,
                      kind: int | None, value_type: int | None) -> None:
    """Refuse what aggregate() does not answer, whether or not there is data (kind None: the
    metric type is unknown, so only the kind-independent rules apply)."""
    aligner, reducer = aggregation.per_series_aligner, aggregation.cross_series_reducer
    if reducer != Reducer.REDUCE_NONE and reducer not in _REDUCERS:
        raise _unimplemented(f"cross_series_reducer {Reducer.Name(reducer)} is not supported")
    if aligner == Aligner.ALIGN_NONE:
        if reducer != Reducer.REDUCE_NONE:
            raise _invalid(f"cross_series_reducer {Reducer.Name(reducer)} needs a "
                           "per_series_aligner other than ALIGN_NONE and an alignment_period")
        return
    if aligner not in _ALIGNERS:
        raise _unimplemented(f"per_series_aligner {Aligner.Name(aligner)} is not supported")
    period_ns = _ns(aggregation.alignment_period)
    if not aggregation.HasField("alignment_period") or period_ns <= 0:
        raise _invalid(f"per_series_aligner {Aligner.Name(aligner)} needs an alignment_period")
    if period_ns < 10**9:
        raise _invalid(f"alignment_period {period_ns / 1e9}s is too short: expected at least "
                       "1 s (Cloud Monitoring: at least 60 s)")
    if (end_ns - start_ns) // period_ns > MAX_PERIODS:
        raise _invalid(f"the interval holds more than {MAX_PERIODS} alignment periods; "
                       "use a longer alignment_period or a shorter interval")
    if reducer != Reducer.REDUCE_NONE:
        for field_name in aggregation.group_by_fields:
            _group_field(field_name)
    if kind is not None:
        _check_aligner(aligner, kind, value_type, metric_type)
        _, aligned_type = _aligned_types(_ALIGNERS[aligner], kind, value_type)
        if aligned_type == ValueType.DISTRIBUTION and reducer in (Reducer.REDUCE_MIN,
                                                                   Reducer.REDUCE_MAX):
            raise _invalid(f"cross_series_reducer {Reducer.Name(reducer)} is not valid for "
                           "distribution values")


def aggregate(series: list[Series], aggregation, start_ns: int, end_ns: int) -> list[Series]:
    """Cloud Monitoring's Aggregation, checked by check_aggregation(), applied to the series
    (see the module docstring)."""
    aligner, reducer = aggregation.per_series_aligner, aggregation.cross_series_reducer
    if aligner == Aligner.ALIGN_NONE:
        for s in series:
            s.points = [p for p in s.points if _in_interval(p[1], start_ns, end_ns)]
        return series
    if not series:
        return []
    period_ns = _ns(aggregation.alignment_period)
    kind, value_type = series[0].kind, series[0].value_type
    op = _ALIGNERS[aligner]
    out_kind, out_type = _aligned_types(op, kind, value_type)
    ends = []
    hi = end_ns
    while hi > start_ns or (hi == end_ns == start_ns):
        ends.append(hi)
        hi -= period_ns
        if start_ns == end_ns:
            break
    aligned = []
    for s in series:
        points = []
        for hi in ends:
            value = _period_value(s, op, hi - period_ns, hi)
            if value is not None:
                points.append((hi - period_ns if out_kind == Kind.DELTA else hi, hi, value))
        points.reverse()
        aligned.append(Series(s.metric_labels, s.resource_labels, out_kind, out_type, points))
    if reducer == Reducer.REDUCE_NONE:
        return aligned
    rop = _REDUCERS[reducer]
    fields = [_group_field(f) for f in aggregation.group_by_fields]
    groups: dict = {}
    for s in aligned:
        metric_labels, res_labels = {}, {}
        for scope, key in fields:
            if scope == "metric.label" and key in s.metric_labels:
                metric_labels[key] = s.metric_labels[key]
            elif scope == "resource.label" and key in s.resource_labels:
                res_labels[key] = s.resource_labels[key]
        group_key = (tuple(sorted(metric_labels.items())), tuple(sorted(res_labels.items())))
        groups.setdefault(group_key, (metric_labels, res_labels, []))[2].append(s)
    if rop == "count":
        red_type = ValueType.INT64
    elif rop == "mean" or isinstance(rop, float):
        red_type = ValueType.DOUBLE
    else:
        red_type = out_type
    reduced = []
    for metric_labels, res_labels, members in groups.values():
        by_end: dict = {}
        for s in members:
            for start, end, value in s.points:
                by_end.setdefault((start, end), []).append(value)
        points = [(start, end, _reduce(rop, values))
                  for (start, end), values in sorted(by_end.items(), key=lambda kv: kv[0][1])]
        if points:
            reduced.append(Series(metric_labels, res_labels, out_kind, red_type, points))
    return reduced


def _in_interval(t: int, start_ns: int, end_ns: int) -> bool:
    return t == end_ns if start_ns == end_ns else start_ns < t <= end_ns


# ---- the service ----

def _project(name: str, what: str) -> str:
    match = re.fullmatch(r"projects/([^/]+)", name)
    if not match:
        raise _invalid(f"{what} {name!r} is invalid: expected projects/PROJECT_ID")
    return match.group(1)


def _ns(message) -> int:
    """A protobuf Timestamp or Duration in nanoseconds."""
    return message.seconds * 10**9 + message.nanos


def _timestamp(message, ns: int) -> None:
    message.seconds, message.nanos = divmod(ns, 10**9)


def _fingerprint(request) -> str:
    copy = type(request)()
    copy.CopyFrom(request)
    copy.page_token = ""
    copy.page_size = 0
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()[:16]


def _page_offset(request) -> int:
    if not request.page_token:
        return 0
    try:
        token = json.loads(base64.urlsafe_b64decode(request.page_token.encode()))
        offset = int(token["offset"])
        fingerprint = token["request"]
    except Exception:
        raise _invalid(f"page_token {request.page_token!r} is not one this collector gave "
                       "out") from None
    if fingerprint != _fingerprint(request) or offset < 0:
        raise _invalid(f"page_token {request.page_token!r} belongs to a different request "
                       "(name, filter, interval, aggregation and view must stay the same)")
    return offset


def _page_token(request, offset: int) -> str:
    token = json.dumps({"offset": offset, "request": _fingerprint(request)})
    return base64.urlsafe_b64encode(token.encode()).decode()


def _page_size(size: int, maximum: int) -> int:
    if size < 0:
        raise _invalid(f"page_size {size} is invalid: expected a positive number (0: the "
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
        message.int64_value = int(value)
    elif value_type == ValueType.BOOL:
        message.bool_value = bool(value)
    else:
        message.double_value = float(value)


def _header(s: Series, metric_type: str, unit: str):
    ts = _pb["TimeSeries"]()
    ts.metric.type = metric_type
    ts.metric.labels.update(s.metric_labels)
    ts.resource.type = RESOURCE_TYPE
    ts.resource.labels.update(s.resource_labels)
    ts.metric_kind = s.kind
    ts.value_type = s.value_type
    ts.unit = unit
    return ts


class MetricService:
    """Answers MetricService requests (protobuf messages) from a CollectorStore."""

    def __init__(self, store):
        self.store = store

    def _descriptors(self) -> list[dict]:
        return self.store.query("SELECT * FROM metric_descriptors ORDER BY metric_type")

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
            monitored_resource_types=[RESOURCE_TYPE])
        out.labels.extend(label_pb2.LabelDescriptor(key=k)
                          for k in self.store.label_keys(d["metric_type"]))
        return out

    def list_metric_descriptors(self, request):
        project = _project(request.name, "name")
        terms = parse_filter(request.filter) if request.filter else []
        for t in terms:
            if t.scope not in ("metric.type", "resource.type"):
                raise _unimplemented(f"ListMetricDescriptors filter on {t.scope} is not "
                                     "supported; filter on metric.type or resource.type")
        descriptors = [d for d in self._descriptors()
                       if all(t.matches(d["metric_type"] if t.scope == "metric.type"
                                        else RESOURCE_TYPE) for t in terms)]
        size = _page_size(request.page_size, MAX_DESCRIPTOR_PAGE_SIZE)
        offset = _page_offset(request)
        response = _pb["ListMetricDescriptorsResponse"]()
        response.metric_descriptors.extend(
            self._descriptor_pb(d, project) for d in descriptors[offset:offset + size])
        if offset + size < len(descriptors):
            response.next_page_token = _page_token(request, offset + size)
        return response

    def get_metric_descriptor(self, request):
        match = re.fullmatch(r"projects/([^/]+)/metricDescriptors/(.+)", request.name)
        if not match:
            raise _invalid(f"name {request.name!r} is invalid: expected "
                           "projects/PROJECT_ID/metricDescriptors/METRIC_TYPE")
        descriptor = self._descriptor(match.group(2))
        if descriptor is not None:
            return self._descriptor_pb(descriptor, match.group(1))
        raise Refused(grpc.StatusCode.NOT_FOUND, f"no metric descriptor {match.group(2)!r}")

    def list_time_series(self, request):
        project = _project(request.name, "name")
        if not request.filter:
            raise _invalid("filter is required and must name one metric type: "
                           'metric.type = "..."')
        terms = parse_filter(request.filter)
        types = [t for t in terms if t.scope == "metric.type"]
        if len(types) != 1 or types[0].negate or types[0].function is not None:
            raise _invalid(f"filter {request.filter!r} must name exactly one metric type with "
                           'metric.type = "..."')
        metric_type = types[0].args[0]
        if not request.interval.HasField("end_time"):
            raise _invalid("interval.end_time is required")
        end_ns = _ns(request.interval.end_time)
        start_ns = _ns(request.interval.start_time) if request.interval.HasField(
            "start_time") else end_ns
        if start_ns > end_ns:
            raise _invalid(f"interval start_time {start_ns} ns is after end_time {end_ns} ns")
        if request.HasField("secondary_aggregation") and (
                request.secondary_aggregation.per_series_aligner
                or request.secondary_aggregation.cross_series_reducer):
            raise _unimplemented("secondary_aggregation is not supported")
        if request.order_by:
            raise _unimplemented(f"order_by {request.order_by!r} is not supported")
        headers_only = request.view == HEADERS
        size = _page_size(request.page_size, MAX_PAGE_SIZE)
        offset = _page_offset(request)
        descriptor = self._descriptor(metric_type)
        check_aggregation(request.aggregation, start_ns, end_ns, metric_type,
                          _kind_of(descriptor) if descriptor else None,
                          ValueType.Value(descriptor["value_type"]) if descriptor else None)
        response = _pb["ListTimeSeriesResponse"]()
        if descriptor is None:
            return response
        aligned = request.aggregation.per_series_aligner != Aligner.ALIGN_NONE
        # Nothing older than the first period (or the interval) can matter to a gauge.
        since_ns = (start_ns - _ns(request.aggregation.alignment_period) if aligned
                    else min(start_ns, end_ns - 1))
        series = read_series(self.store, descriptor, project, terms, end_ns, since_ns)
        series = aggregate(series, request.aggregation, start_ns, end_ns)
        series = [s for s in series if s.points]
        unit = descriptor["unit"] or ""
        if request.aggregation.per_series_aligner == Aligner.ALIGN_RATE:
            unit = f"{unit}/s" if unit else "1/s"
        if headers_only:
            for s in series[offset:offset + size]:
                response.time_series.append(_header(s, metric_type, unit))
            if offset + size < len(series):
                response.next_page_token = _page_token(request, offset + size)
            return response
        # FULL: page_size counts points; a series may continue on the next page.
        flat = [(i, p) for i, s in enumerate(series) for p in reversed(s.points)]
        current, current_index = None, None
        for i, (start, end, value) in flat[offset:offset + size]:
            if i != current_index:  # (append copies; add() returns the stored message)
                current, current_index = response.time_series.add(), i
                current.CopyFrom(_header(series[i], metric_type, unit))
            point = current.points.add()
            _timestamp(point.interval.end_time, end)
            if series[i].kind != Kind.GAUGE:
                _timestamp(point.interval.start_time, start)
            _typed_value(point.value, value, series[i].value_type)
        if offset + size < len(flat):
            response.next_page_token = _page_token(request, offset + size)
        return response


_METHODS = ("ListMonitoredResourceDescriptors", "GetMonitoredResourceDescriptor",
            "ListMetricDescriptors", "GetMetricDescriptor", "CreateMetricDescriptor",
            "DeleteMetricDescriptor", "ListTimeSeries", "CreateTimeSeries",
            "CreateServiceTimeSeries")


def grpc_handler(store) -> grpc.GenericRpcHandler:
    """google.monitoring.v3.MetricService for a gRPC server, answered from the store."""
    service = MetricService(store)
    answered = {
        "ListMetricDescriptors": (service.list_metric_descriptors,
                                  _pb["ListMetricDescriptorsRequest"]),
        "GetMetricDescriptor": (service.get_metric_descriptor,
                                _pb["GetMetricDescriptorRequest"]),
        "ListTimeSeries": (service.list_time_series, _pb["ListTimeSeriesRequest"]),
    }

    def wrap(method, function):
        def handle(request, context):
            if function is None:
                context.abort(grpc.StatusCode.UNIMPLEMENTED,
                              f"MetricService.{method} is not answered by the local collector "
                              f"(it answers {', '.join(answered)}; metrics arrive over OTLP)")
            try:
                return function(request)
            except Refused as err:
                context.abort(err.code, str(err))
        return handle

    handlers = {}
    for method in _METHODS:
        function, request_type = answered.get(method, (None, None))
        handlers[method] = grpc.unary_unary_rpc_method_handler(
            wrap(method, function),
            request_deserializer=(request_type.FromString if request_type
                                  else lambda data: data),
            response_serializer=lambda message: message.SerializeToString())
    return grpc.method_handlers_generic_handler("google.monitoring.v3.MetricService", handlers)
