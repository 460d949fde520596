"""Reading a selection's series from the collector's store, for ListTimeSeries: the rows a
filter keeps, each series made once, points in the metric's kind, and what the read holds
charged to its budget (series.Budget)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

import grpc

from distrl.otel.filters import Refused, Term
from distrl.otel.series import (
    Budget,
    Dist,
    Kind,
    Series,
    ValueType,
    kind_of,
    label_text,
    resource_labels,
    resource_type,
    value_of,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

POINT_COLUMNS = ", ".join(f"p.{c}" for c in (
    "resource_id", "attributes", "temporality", "start_ns", "time_ns", "value", "int_value",
    "count", "sum", "bounds", "bucket_counts", "exponential", "scope"))


def sql_int(ns: int) -> int:
    return min(max(ns, INT64_MIN), INT64_MAX)  # SQLite integers are signed 64-bit


def read_rows(store, sql: str, params: tuple, budget: Budget | None):
    """A read's rows; the store's errors as refusals (the budget's, where it stopped the read)."""
    rows = store.rows(sql, params, budget.stopped if budget else None)
    try:
        yield from rows
    except sqlite3.OperationalError as err:
        if budget and budget.stopped():
            raise budget.refusal() from None
        raise Refused(grpc.StatusCode.UNAVAILABLE, f"the store could not be read: {err}") from None
    finally:
        rows.close()


@dataclass(frozen=True)
class Selection:
    """What a read selects: the metric's descriptor, the project its series are labelled with,
    and the filter's terms."""

    descriptor: dict
    project: str
    terms: list[Term]


def read_series(store, selection: Selection, end_ns: int, since_ns: int | None = None,
                budget: Budget | None = None, each=None) -> list[Series]:
    """The selection's series with their points up to end_ns (for a gauge, only those after
    since_ns), in the descriptor's kind (delta points of a cumulative metric are summed up,
    cumulative points of a delta metric differenced). With `each` (a series to a series), the
    rows come series by series and each series is replaced by each(series) once its points
    are in: the read holds one series' points at a time (aligned reads keep the cells)."""
    found = _Found(selection, budget)
    sql = (f"SELECT {POINT_COLUMNS}, r.attributes AS resource FROM points p JOIN resources r "
           "ON r.id = p.resource_id WHERE metric_type = ? AND time_ns <= ?")
    params: tuple = (selection.descriptor["metric_type"], sql_int(end_ns))
    if found.kind == Kind.GAUGE and since_ns is not None:  # counters need the points before
        sql += " AND time_ns > ?"
        params += (sql_int(since_ns),)
    order = (" ORDER BY time_ns, p.id" if each is None else
             " ORDER BY p.resource_id, p.scope, p.attributes, time_ns, p.id")
    current, held = None, 0
    for row in read_rows(store, sql + order, params, budget):
        if each is not None:
            key = (row["resource_id"], row["scope"], row["attributes"])
            if key != current:
                found.finish(current, each, held)
                current, held = key, 0
        kept = found.add(row)
        if budget:
            size = _point_bytes(row) if kept else 0
            held += size
            budget.row(size)
    if each is not None:
        found.finish(current, each, held)
        return found.kept()
    out = found.kept()
    for s in out:
        s.points = _as_kind(s.points, s.temporalities, found.kind)
    return out


# What a read holds for each series and point it keeps, measured as the collector's resident
# memory growth over reads of 50,000-200,000 series and points (1.4-2.0 KB a series,
# 160-270 bytes a number point), rounded up; a distribution's arrays on top.
SERIES_BYTES, POINT_BYTES = 2048, 288
DROPPED_BYTES = 200  # a series the filter drops: its key and a None in the dict
# A bucket count as json.loads gives it (an int and its list slot, 36 B, tracemalloc) and a
# bound (a float, 32 B), each with numpy's copy when aggregated (8 B).
COUNT_BYTES, BOUND_BYTES = 44, 40


def _point_bytes(row: dict) -> int:
    """Of a row _add_row kept (its JSON columns parsed)."""
    if row["bucket_counts"] is not None:
        return (POINT_BYTES + 300 + COUNT_BYTES * len(row["bucket_counts"])
                + BOUND_BYTES * len(row["bounds"] or ()))
    if row["exponential"] is not None:  # the positive side is given bounds when read
        positive, negative = (len(row["exponential"][side]["counts"])
                              for side in ("positive", "negative"))
        return POINT_BYTES + 300 + (COUNT_BYTES + BOUND_BYTES) * positive + COUNT_BYTES * negative
    return POINT_BYTES


def _series_bytes(s: Series) -> int:
    """What a series' (aligned) points hold, as _point_bytes counts them."""
    held = 0
    for *_, value in s.points:
        held += POINT_BYTES
        if isinstance(value, Dist):
            held += 300 + COUNT_BYTES * len(value.counts) + BOUND_BYTES * len(value.bounds)
    return held


def read_headers(store, selection: Selection, start_ns: int, end_ns: int,
                 budget: Budget | None = None) -> list[Series]:
    """The selection's series that have a point in the interval, without their points: what
    the HEADERS view shows of a read without aggregation (a one-hour read of 200 histogram
    series was refused for the points it never showed). Each has one point, a placeholder at
    end_ns."""
    found = _Found(selection, budget)
    sql = ("SELECT DISTINCT p.resource_id, p.scope, p.attributes, r.attributes AS resource "
           "FROM points p JOIN resources r ON r.id = p.resource_id "
           "WHERE metric_type = ? AND time_ns <= ? AND time_ns > ?")
    since_ns = end_ns - 1 if start_ns == end_ns else start_ns  # in_interval's rule
    params = (selection.descriptor["metric_type"], sql_int(end_ns), sql_int(since_ns))
    for row in read_rows(store, sql, params, budget):
        s = found.series_of(row)
        if s is not None:
            s.points.append((end_ns, end_ns, None))
        if budget:
            budget.row(0)
    return found.kept()


class _Found:
    """A read's series as its rows arrive, by (resource, scope, attributes): each kept or
    dropped (None) by the filter once, when first seen; a process's resource labels made once,
    as they are the same on each of its series."""

    def __init__(self, selection: Selection, budget: Budget | None):
        self.selection, self.budget = selection, budget
        self.kind = kind_of(selection.descriptor)
        self.value_type = ValueType.Value(selection.descriptor["value_type"])
        self.series: dict = {}
        self.resources: dict = {}

    def series_of(self, row: dict) -> Series | None:
        """The series of a row (made when new); None when the filter drops it."""
        key = (row["resource_id"], row["scope"], row["attributes"])
        if key not in self.series:  # a new series: decide once whether the filter keeps it
            labels = {k: label_text(v) for k, v in json.loads(row["attributes"]).items()}
            if row["scope"]:
                labels.setdefault("otel_scope_name", row["scope"])
            if row["resource_id"] not in self.resources:
                resource = json.loads(row["resource"])
                self.resources[row["resource_id"]] = (
                    resource_type(resource), resource_labels(resource, self.selection.project))
            rtype, rlabels = self.resources[row["resource_id"]]
            s = Series(labels, rlabels, self.kind, self.value_type,
                       resource_type=rtype)  # the resource labels: read-only, shared
            self.series[key] = s if _matches(self.selection.terms, s) else None
            if self.budget:  # charged for what it keeps: a dropped series leaves only its key
                self.budget.hold((SERIES_BYTES if self.series[key] else DROPPED_BYTES)
                                 + 3 * len(row["attributes"]))
        return self.series[key]

    def add(self, row: dict) -> bool:
        """Add a row's point to its series; False when the filter drops the series."""
        s = self.series_of(row)
        if s is None:
            return False
        for name in ("bounds", "bucket_counts", "exponential"):
            if row[name] is not None:
                row[name] = json.loads(row[name])
        s.points.append((row["start_ns"], row["time_ns"], value_of(row, self.value_type)))
        s.temporalities.append(row["temporality"])
        return True

    def finish(self, key, each, held: int) -> None:
        """Series `key`, its points all read: replaced by each(series), the `held` bytes of its
        points given back to the budget and what it holds now charged."""
        s = self.series.get(key)
        if s is None:
            return
        s.points = _as_kind(s.points, s.temporalities, self.kind)
        self.series[key] = done = each(s)
        if self.budget:
            self.budget.hold(_series_bytes(done) - held)

    def kept(self) -> list[Series]:
        return [s for s in self.series.values() if s is not None]


def _matches(terms: list[Term], s: Series) -> bool:
    for t in terms:
        if t.scope == "metric.label":
            value = s.metric_labels.get(t.key)
        elif t.scope == "resource.label":
            value = s.resource_labels.get(t.key)
        elif t.scope == "resource.type":
            value = s.resource_type
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
