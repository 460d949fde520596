"""Cloud Monitoring's aggregation as the local collector answers it: each series aligned to
periods that end at the interval's end (aligners), then reduced across the series of each
group_by group (reducers). distrl.otel.monitoring lists what is answered."""

from __future__ import annotations

import bisect
import functools
import math
import operator

import numpy as np

from distrl.otel.filters import excerpt, invalid, selector, unimplemented
from distrl.otel.series import (
    Aligner,
    Budget,
    Dist,
    Kind,
    Reducer,
    Series,
    ValueType,
    bucket_percentile,
    ns_of,
)

MAX_PERIODS = 100_000

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
        raise invalid(f"per_series_aligner {name} is not valid for the {what}{hint}")


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
        return total_of(values)
    if op == "rate":
        return sum(values) / ((hi - lo) / 1e9)
    if op == "count":
        return len(values)
    if isinstance(op, float):
        return _percentile_of(values, op)
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


def total_of(values: list):
    """The sum of numbers or the merge of distributions (Dist has no zero to start from)."""
    return functools.reduce(operator.add, values)


def _percentile_of(dists: list[Dist], q: float) -> float | None:
    """The q-quantile of distributions together (None: no values). With one set of bounds,
    that of their sum. Otherwise over the union of their bounds, each bucket's count spread
    evenly across the finer buckets it covers (bucket_percentile's own assumption inside a
    bucket): summing onto the bounds they share lost the buckets, and with none shared
    answered 0."""
    if sum(d.count for d in dists) == 0:
        return None
    if all(d.bounds == dists[0].bounds for d in dists):
        return total_of(dists).percentile(q)
    grid = sorted(set().union(*(d.bounds for d in dists)))
    edges = np.array([0.0, *grid])  # grid bucket j is [edges[j], edges[j + 1]); the last open
    counts = np.zeros(len(grid) + 1)
    for d in dists:
        lows = [0.0, *d.bounds]
        for i, count in enumerate(d.counts):
            if not count:
                continue
            if i == len(d.bounds):  # the overflow bucket, reported at its lower bound
                counts[grid.index(d.bounds[-1]) + 1 if d.bounds else 0] += count
                continue
            lo, hi = lows[i], d.bounds[i]
            if hi <= lo:  # a first bound at or below 0: no width to spread over
                counts[grid.index(hi)] += count
                continue
            overlap = np.clip(np.minimum(np.append(edges[1:], np.inf), hi)
                              - np.maximum(edges, lo), 0.0, None)
            counts += count * overlap / (hi - lo)
    return bucket_percentile(grid, list(counts), q)


def _reduce(op, values: list):
    if op == "count":
        return len(values)
    if isinstance(values[0], Dist):  # MIN and MAX were refused by check_aggregation
        merged = total_of(values)
        if op == "sum":
            return merged
        if op == "mean":
            return merged.sum / merged.count if merged.count else math.nan
        percentile = _percentile_of(values, op)
        return math.nan if percentile is None else percentile
    if op == "sum":
        return sum(values)
    if op == "mean":
        return float(np.mean(values))
    if op == "min":
        return min(values)
    if op == "max":
        return max(values)
    return float(np.percentile(values, op * 100))  # linear interpolation between values


# Metric types users define (OTLP's Prometheus ones, custom and external metrics): one that
# does not exist is NOT_FOUND. A built-in type (compute.googleapis.com/...) always exists in
# Cloud Monitoring, and with no data its list is empty.
USER_DEFINED_PREFIXES = ("prometheus.googleapis.com/", "custom.googleapis.com/",
                         "external.googleapis.com/", "workload.googleapis.com/")


def _group_field(text: str) -> tuple[str, str]:
    if text == "resource.type":
        return "resource.type", ""
    head, _, key = text.partition(".")
    if head == "resource" and key and "." not in key and key not in ("label", "labels"):
        # resource.KEY, as Google's own samples group ("resource.zone"): a resource label
        return "resource.label", key
    scope, key = selector(text)
    if key is None:
        raise invalid(f"group_by_fields entry {excerpt(text)}: expected metric.labels.KEY, "
                       "resource.labels.KEY or resource.type")
    return scope, key


def check_aggregation(aggregation, start_ns: int, end_ns: int, metric_type: str,
                      kind: int | None, value_type: int | None) -> None:
    """Refuse what aggregate() does not answer, whether or not there is data (kind None: the
    metric type is unknown, so only the kind-independent rules apply)."""
    aligner, reducer = aggregation.per_series_aligner, aggregation.cross_series_reducer
    # proto3 enums are open: a client can send any number, which .Name() cannot name.
    for name, value, enum in (("per_series_aligner", aligner, Aligner),
                              ("cross_series_reducer", reducer, Reducer)):
        if value not in enum.names:
            raise invalid(f"{name} {value} is not a {enum.type_name}: expected one of "
                           f"{', '.join(enum.names.values())}")
    if reducer != Reducer.REDUCE_NONE and reducer not in _REDUCERS:
        raise unimplemented(f"cross_series_reducer {Reducer.Name(reducer)} is not supported")
    if aligner == Aligner.ALIGN_NONE:
        if reducer != Reducer.REDUCE_NONE:
            raise invalid(f"cross_series_reducer {Reducer.Name(reducer)} needs a "
                           "per_series_aligner other than ALIGN_NONE and an alignment_period")
        return
    if aligner not in _ALIGNERS:
        raise unimplemented(f"per_series_aligner {Aligner.Name(aligner)} is not supported")
    period_ns = ns_of(aggregation.alignment_period)
    if not aggregation.HasField("alignment_period") or period_ns <= 0:
        raise invalid(f"per_series_aligner {Aligner.Name(aligner)} needs an alignment_period")
    if period_ns < 10**9:
        raise invalid(f"alignment_period {period_ns / 1e9}s is too short: expected at least "
                       "1 s (Cloud Monitoring: at least 60 s)")
    if (end_ns - start_ns) // period_ns > MAX_PERIODS:
        raise invalid(f"the interval holds more than {MAX_PERIODS} alignment periods; "
                       "use a longer alignment_period or a shorter interval")
    if reducer != Reducer.REDUCE_NONE:
        for field_name in aggregation.group_by_fields:
            _group_field(field_name)
    if kind is not None:
        _check_aligner(aligner, kind, value_type, metric_type)
        _, aligned_type = _aligned_types(_ALIGNERS[aligner], kind, value_type)
        if aligned_type == ValueType.DISTRIBUTION and reducer in (Reducer.REDUCE_MIN,
                                                                   Reducer.REDUCE_MAX):
            raise invalid(f"cross_series_reducer {Reducer.Name(reducer)} is not valid for "
                           "distribution values")


def aggregate(series: list[Series], aggregation, start_ns: int, end_ns: int,
              budget: Budget | None = None, aligned: bool = False) -> list[Series]:
    """Cloud Monitoring's Aggregation, checked by check_aggregation(), applied to the series
    (see the module docstring): each series aligned (unless `aligned`: align() did it as they
    were read), then the groups reduced; the budget's deadline is checked as it goes."""
    check = budget.check if budget else (lambda: None)
    aligner, reducer = aggregation.per_series_aligner, aggregation.cross_series_reducer
    if aligner == Aligner.ALIGN_NONE:
        for s in series:
            s.points = [p for p in s.points if in_interval(p[1], start_ns, end_ns)]
        return series
    if not series:
        return []
    if not aligned:
        series = _align(series, _ALIGNERS[aligner], ns_of(aggregation.alignment_period),
                        start_ns, end_ns, check)
    if reducer == Reducer.REDUCE_NONE:
        return series
    return _reduce_groups(series, _REDUCERS[reducer], aggregation.group_by_fields, check)


def align(s: Series, aggregation, start_ns: int, end_ns: int) -> Series:
    """One series aligned as aggregate() aligns it: a read aligns each series as soon as its
    points are in, and holds its aligned cells rather than its points."""
    return _align([s], _ALIGNERS[aggregation.per_series_aligner],
                  ns_of(aggregation.alignment_period), start_ns, end_ns, lambda: None)[0]


def _align(series: list[Series], op, period_ns: int, start_ns: int, end_ns: int,
           check) -> list[Series]:
    """Each series as one point a period, the periods ending at end_ns and back to start_ns."""
    out_kind, out_type = _aligned_types(op, series[0].kind, series[0].value_type)
    ends = []
    hi = end_ns
    while hi > start_ns or (hi == end_ns == start_ns):
        ends.append(hi)
        hi -= period_ns
        if start_ns == end_ns:
            break
    aligned = []
    for i, s in enumerate(series):
        if i % 512 == 0:
            check()
        points = []
        for hi in ends:
            value = _period_value(s, op, hi - period_ns, hi)
            if value is not None:
                points.append((hi - period_ns if out_kind == Kind.DELTA else hi, hi, value))
        points.reverse()
        aligned.append(Series(s.metric_labels, s.resource_labels, out_kind, out_type, points,
                              resource_type=s.resource_type))
    return aligned


def _reduce_groups(aligned: list[Series], rop, group_by_fields, check) -> list[Series]:
    """One series per group of the group_by fields' values, its points reduced across the
    group's series period by period."""
    fields = [_group_field(f) for f in group_by_fields]
    by_type = ("resource.type", "") in fields  # else a group may mix types: the first's
    groups: dict = {}
    for s in aligned:
        metric_labels, res_labels = {}, {}
        for scope, key in fields:
            if scope == "metric.label" and key in s.metric_labels:
                metric_labels[key] = s.metric_labels[key]
            elif scope == "resource.label" and key in s.resource_labels:
                res_labels[key] = s.resource_labels[key]
        group_key = (tuple(sorted(metric_labels.items())), tuple(sorted(res_labels.items())),
                     s.resource_type if by_type else "")
        groups.setdefault(group_key, (metric_labels, res_labels, []))[2].append(s)
    if rop == "count":
        red_type = ValueType.INT64
    elif rop == "mean" or isinstance(rop, float):
        red_type = ValueType.DOUBLE
    else:
        red_type = aligned[0].value_type
    reduced = []
    for i, (metric_labels, res_labels, members) in enumerate(groups.values()):
        if i % 512 == 0:
            check()
        by_end: dict = {}
        for s in members:
            for start, end, value in s.points:
                by_end.setdefault((start, end), []).append(value)
        points = [(start, end, _reduce(rop, values))
                  for (start, end), values in sorted(by_end.items(), key=lambda kv: kv[0][1])]
        if points:
            reduced.append(Series(metric_labels, res_labels, aligned[0].kind, red_type, points,
                                  resource_type=members[0].resource_type))
    return reduced


def in_interval(t: int, start_ns: int, end_ns: int) -> bool:
    return t == end_ns if start_ns == end_ns else start_ns < t <= end_ns
