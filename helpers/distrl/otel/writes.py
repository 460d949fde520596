"""MetricService's write calls that Google's own samples make, CreateMetricDescriptor and
CreateTimeSeries, within Cloud Monitoring's documented rules, committed by the collector's
writer as an export is. What they write is read back like any OTLP point: a user-defined metric
type with its descriptor, a series per monitored resource and metric labels.

The rules (cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.timeSeries/create, and
TimeSeries#Point on the same site):
- at most 200 TimeSeries a request, each with one point, of a user-defined type
  (custom.googleapis.com/, external.googleapis.com/, workload.googleapis.com/), fully
  specified: a monitored resource type the collector stores (resources.TYPES) with every one
  of its labels (project_id comes from the request);
- the point is more recent than every other point of its series;
- GAUGE: start_time absent or equal to end_time; CUMULATIVE: start_time before end_time;
- a type without a descriptor gets one from its first point, as Cloud Monitoring makes one;
  a point of another kind or value type than the descriptor's is refused;
- a request whose series fail in part keeps the others and answers INVALID_ARGUMENT naming
  each failed one (timeSeries[i]), as Cloud Monitoring answers.
Differences: points of kind DELTA, and values other than INT64 and DOUBLE, are refused
UNIMPLEMENTED (the samples write GAUGE DOUBLE points); a descriptor keeps its label keys, not
their descriptions; the 5-s minimum between a series' points is not kept (local runs are short,
as the 1-s alignment periods are)."""

from __future__ import annotations

import json

from google.api import metric_pb2
from google.cloud import monitoring_v3
from google.protobuf.message import DecodeError

from distrl.otel import resources
from distrl.otel.aggregation import USER_DEFINED_PREFIXES
from distrl.otel.filters import (
    METRIC_TYPE_PREFIX,
    Refused,
    excerpt,
    invalid,
    project_of,
    unimplemented,
)
from distrl.otel.points import InvalidPoint, check_labels
from distrl.otel.series import MONITORED_LABEL, MONITORED_TYPE, Kind, ValueType, ns_of

# The user-defined types but OTLP's own (prometheus.googleapis.com/, which the exports write).
WRITABLE_PREFIXES = tuple(p for p in USER_DEFINED_PREFIXES if p != METRIC_TYPE_PREFIX)
MAX_SERIES = 200  # TimeSeries objects in one CreateTimeSeries request
KINDS = {Kind.GAUGE: (0, "gauge"), Kind.CUMULATIVE: (2, "counter")}  # temporality, kind
VALUES = {ValueType.DOUBLE: "double_value", ValueType.INT64: "int64_value"}


def _canonical(labels: dict) -> str:
    """Labels as the store keeps attributes (points.attributes_json's JSON)."""
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


def _writable(metric_type: str, what: str) -> None:
    if not metric_type.startswith(WRITABLE_PREFIXES):
        raise invalid(f"{what} {excerpt(metric_type)} is not a user-defined metric type: "
                      f"expected one starting with {', '.join(WRITABLE_PREFIXES)}")


def _kinds(metric_kind: int, value_type: int, metric_type: str) -> None:
    if metric_kind not in KINDS:
        raise unimplemented(f"metric kind {Kind.Name(metric_kind)} of {excerpt(metric_type)}: "
                            "the local collector stores GAUGE and CUMULATIVE written points")
    if value_type not in VALUES:
        raise unimplemented(f"value type {ValueType.Name(value_type)} of "
                            f"{excerpt(metric_type)}: the local collector stores INT64 and "
                            "DOUBLE written points")


def descriptor_to_create(request: bytes) -> tuple[str, metric_pb2.MetricDescriptor]:
    """(project, descriptor) of a CreateMetricDescriptor request, once checked."""
    try:
        parsed = monitoring_v3.CreateMetricDescriptorRequest.pb().FromString(request)
    except DecodeError as err:
        raise invalid(f"not a CreateMetricDescriptor request: {err}") from None
    project, d = project_of(parsed.name, "name"), parsed.metric_descriptor
    _writable(d.type, "metric_descriptor.type")
    _kinds(d.metric_kind, d.value_type, d.type)
    keys = [label.key for label in d.labels]
    if len(set(keys)) != len(keys) or not all(keys):
        raise invalid(f"metric_descriptor.labels {excerpt(', '.join(keys))}: each needs a key "
                      "of its own")
    return project, d


def insert_descriptor(store, created: tuple[str, metric_pb2.MetricDescriptor]):
    """The writer's part: store the descriptor (a type stored already must keep its kind and
    value type) and its label keys; the descriptor as Get answers it."""
    project, d = created
    kind, value_type = Kind.Name(d.metric_kind), ValueType.Name(d.value_type)
    _same_kinds(store, d.type, kind, value_type)
    try:
        store._descriptor(d.type, d.display_name or d.type, KINDS[d.metric_kind][1], kind,
                          value_type, d.unit, d.description)
        store._labels(d.type, _canonical({label.key: "" for label in d.labels}))
    except InvalidPoint as err:
        raise invalid(f"metric_descriptor {excerpt(d.type)}: {err}") from None
    out = metric_pb2.MetricDescriptor()
    out.CopyFrom(d)
    out.name = f"projects/{project}/metricDescriptors/{d.type}"
    return out


def _same_kinds(store, metric_type: str, kind: str, value_type: str) -> None:
    row = store.conn.execute("SELECT metric_kind, value_type FROM metric_descriptors WHERE "
                             "metric_type = ?", (metric_type,)).fetchone()
    if row is None:
        return
    for what, stored, given in (("Metric kind", row[0], kind), ("Value type", row[1], value_type)):
        if stored != given:  # Cloud Monitoring's own words
            raise invalid(f"{what} for metric {metric_type[:200]} must be {stored}, but is "
                          f"{given}.")


def series_to_create(request: bytes) -> list:
    """The time series of a CreateTimeSeries request: the request's own faults refused whole
    (a series keeps no project: reads label it with theirs); a series' own faults are found
    by the writer (insert_series)."""
    try:
        parsed = monitoring_v3.CreateTimeSeriesRequest.pb().FromString(request)
    except DecodeError as err:
        raise invalid(f"not a CreateTimeSeries request: {err}") from None
    project_of(parsed.name, "name")
    if not 0 < len(parsed.time_series) <= MAX_SERIES:
        raise invalid(f"time_series has {len(parsed.time_series)} series: expected 1 to "
                      f"{MAX_SERIES} in one request")
    return list(parsed.time_series)


def insert_series(store, series: list) -> list[str]:
    """The writer's part: each series' point stored, or the reason it is not
    (timeSeries[i]: ...); the stored ones stay whatever the others do."""
    refusals = []
    for i, ts in enumerate(series):
        try:
            _insert_one(store, ts)
        except (Refused, InvalidPoint) as err:
            refusals.append(f"timeSeries[{i}]: {err}")
    return refusals


def _insert_one(store, ts) -> None:
    _writable(ts.metric.type, "metric.type")
    if len(ts.points) != 1:
        raise invalid(f"it has {len(ts.points)} points; each series of a request takes one")
    kind = ts.metric_kind or Kind.GAUGE  # a new type's kind, when the series names none
    [point] = ts.points
    value_type = {"double_value": ValueType.DOUBLE, "int64_value": ValueType.INT64}.get(
        point.value.WhichOneof("value"), ValueType.VALUE_TYPE_UNSPECIFIED)
    if value_type == ValueType.VALUE_TYPE_UNSPECIFIED:
        raise unimplemented(f"a {point.value.WhichOneof('value') or 'missing'} value: the local "
                            "collector stores INT64 and DOUBLE written points")
    _kinds(kind, value_type, ts.metric.type)
    end = ns_of(point.interval.end_time)
    start = ns_of(point.interval.start_time) if point.interval.HasField("start_time") else end
    if kind == Kind.GAUGE and start != end:
        raise invalid("a GAUGE point's start_time must equal its end_time, or be left out")
    if kind == Kind.CUMULATIVE and not start < end:
        raise invalid("a CUMULATIVE point's start_time must be before its end_time")
    _same_kinds(store, ts.metric.type, Kind.Name(kind), ValueType.Name(value_type))
    resource = _resource(ts.resource)
    labels = _canonical(dict(ts.metric.labels))
    check_labels(dict(ts.metric.labels), "the metric")
    store._descriptor(ts.metric.type, ts.metric.type, KINDS[kind][1], Kind.Name(kind),
                      ValueType.Name(value_type), ts.unit, ts.description)
    rid = store.resource_id(resource)
    latest = store.conn.execute(
        "SELECT MAX(time_ns) FROM points WHERE metric_type = ? AND resource_id = ? AND "
        "scope = '' AND attributes = ?", (ts.metric.type, rid, labels)).fetchone()[0]
    if latest is not None and end <= latest:  # Cloud Monitoring's own words
        raise invalid("Points must be written in order. One or more of the points specified "
                      "had an older start time than the most recent point.")
    store._labels(ts.metric.type, labels)
    value = getattr(point.value, VALUES[value_type])
    store.conn.execute(
        "INSERT INTO points (metric_type, resource_id, attributes, temporality, start_ns, "
        "time_ns, value, int_value, scope) VALUES (?,?,?,?,?,?,?,?,'')",
        (ts.metric.type, rid, labels, KINDS[kind][0], start, end, float(value),
         value if value_type == ValueType.INT64 else None))


def _resource(resource) -> str:
    """A written series' monitored resource as the store keeps it: its type and labels (all of
    the type's but project_id, which the request names)."""
    if resource.type not in resources.TYPES or resource.type == resources.RESOURCE_TYPE:
        raise invalid(f"resource.type {excerpt(resource.type)} is not one the local collector "
                      "stores written series of: expected one of " + ", ".join(
                          t for t in sorted(resources.TYPES) if t != resources.RESOURCE_TYPE))
    wanted = set(resources.label_keys(resource.type)) - {"project_id"}
    given = set(resource.labels) - {"project_id"}
    if given != wanted:
        raise invalid(f"the labels of resource.type {resource.type} are "
                      f"{', '.join(sorted(wanted)) or 'project_id alone'}; this series gives "
                      f"{', '.join(sorted(given)) or 'none'}")
    return _canonical({MONITORED_TYPE: resource.type, **{
        MONITORED_LABEL + k: v for k, v in resource.labels.items() if k != "project_id"}})
