"""The collector's Cloud Monitoring MetricService, asked by google-cloud-monitoring's own client
over real gRPC, checked against values computed from the raw points in the store."""

import datetime as dt
import time

import grpc
import numpy as np
import pytest
from google.api import metric_pb2
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import monitoring_v3
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from distrl.otel import aggregation, dashboard, explore, monitoring, reads, series
from distrl.otel.collector import LocalCollector
from distrl.otel.limits import Limits
from distrl.otel.store import CollectorStore

T0 = 1_700_000_000 * 10**9
S = 10**9
PREFIX = "prometheus.googleapis.com/"
BOUNDS = [1.0, 2.0, 5.0, 10.0]
Kind = metric_pb2.MetricDescriptor.MetricKind
Aligner = monitoring.Aligner


def _attrs(**kv):
    return [common_pb2.KeyValue(key=k.replace("_", "."), value=common_pb2.AnyValue(
        string_value=v)) for k, v in kv.items()]


def _series_attrs(run, env, loop="actor"):
    return _attrs(rl_run_id=run, rl_environment_name=env, rl_loop=loop)


def _request(instance, metrics):
    rm = metrics_pb2.ResourceMetrics()
    rm.resource.attributes.extend(_attrs(service_name="rl-training-service",
                                         service_namespace="distrl",
                                         service_instance_id=instance))
    rm.scope_metrics.add().metrics.extend(metrics)
    return metrics_service_pb2.ExportMetricsServiceRequest(resource_metrics=[rm])


def _counter(points):
    m = metrics_pb2.Metric(name="rl.sample.samples", unit="1")
    m.sum.is_monotonic = True
    m.sum.aggregation_temporality = 2
    for attrs, start, t, value in points:
        m.sum.data_points.add(attributes=attrs, start_time_unix_nano=start, time_unix_nano=t,
                              as_double=value)
    return m


def _gauge(points):
    m = metrics_pb2.Metric(name="rl.train.loss", unit="1")
    for attrs, t, value in points:
        m.gauge.data_points.add(attributes=attrs, time_unix_nano=t, as_double=value)
    return m


def _histogram(name, temporality, points):
    m = metrics_pb2.Metric(name=name, unit="ms")
    m.histogram.aggregation_temporality = temporality
    for attrs, start, t, counts, total in points:
        m.histogram.data_points.add(attributes=attrs, start_time_unix_nano=start,
                                    time_unix_nano=t, count=sum(counts), sum=total,
                                    explicit_bounds=BOUNDS, bucket_counts=counts)
    return m


LOSS = np.random.default_rng(0).uniform(0, 4, size=(3, 24)).round(3)
GAUGE_SERIES = [("r1", "CartPole-v1"), ("r2", "Acrobot-v1"), ("r3", "CartPole-v1")]


def _requests():
    r1, r2 = _series_attrs("r1", "CartPole-v1"), _series_attrs("r2", "Acrobot-v1")
    counter = [(r1, T0, T0 + 10 * k * S, 100.0 * k) for k in range(1, 13)]
    counter += [(r2, T0, T0 + 10 * k * S, 50.0 * k) for k in range(1, 6)]
    # r2 restarts at 55 s: a new start time, counting from zero again.
    counter += [(r2, T0 + 55 * S, T0 + 10 * k * S, 7.0 * (k - 5)) for k in range(6, 13)]
    gauge = [(_series_attrs(run, env), T0 + 5 * k * S, float(LOSS[i, k - 1]))
             for i, (run, env) in enumerate(GAUGE_SERIES) for k in range(1, 25)]
    loop = [(r1, T0, T0 + 10 * k * S, [0, 10 * k, 0, 0, 0], 15.0 * k) for k in range(1, 11)]
    loop += [(r2, T0, T0 + 10 * k * S, [0, 0, 10 * k, 0, 0], 30.0 * k) for k in range(1, 11)]
    step = [(r1, T0 + 10 * (k - 1) * S, T0 + 10 * k * S, [0, 0, 0, 10, 0], 75.0)
            for k in range(1, 11)]
    return [_request("i1", [_counter(counter[:12]), _gauge(gauge),
                            _histogram("rl.loop.duration", 2, loop),
                            _histogram("rl.step.duration", 1, step)]),
            _request("i2", [_counter(counter[12:])])]


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    with LocalCollector(tmp_path_factory.mktemp("mon") / "otel.db", token_file=None, port=0) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        for request in _requests():
            stub.Export(request, timeout=10)
        yield c


@pytest.fixture(scope="module")
def mon(collector):
    return explore.Monitoring(endpoint=collector.endpoint)


def _time(ns):
    return dt.datetime.fromtimestamp(ns / S, dt.UTC)


def _list(mon, metric, start_s=0, end_s=130, aggregation=None, **extra):
    request = {"name": mon.project_name, "filter": f'metric.type = "{PREFIX}{metric}"'
               + "".join(f" AND {f}" for f in extra.pop("filters", [])),
               "interval": {"start_time": _time(T0 + start_s * S), "end_time": _time(T0 + end_s * S)},
               **extra}
    if aggregation:
        request["aggregation"] = aggregation
    return list(mon.client.list_time_series(request=request))


def _agg(period_s, aligner, reducer="REDUCE_NONE", group_by=()):
    return {"alignment_period": {"seconds": period_s}, "per_series_aligner": aligner,
            "cross_series_reducer": reducer, "group_by_fields": list(group_by)}


def _pts(ts):
    """(end second since T0, value) of a series' points, oldest first."""
    out = []
    for p in ts.points:
        kind = type(p.value).pb(p.value).WhichOneof("value")
        value = getattr(p.value, kind)
        out.append(((p.interval.end_time.timestamp() * S - T0) / S, value))
    return sorted(out, key=lambda x: x[0])


def _by(series, key="rl.run.id"):
    return {ts.metric.labels[key]: ts for ts in series}


def test_raw_points_newest_first_in_the_half_open_interval(mon, collector):
    stored = collector.store().points(PREFIX + "rl.train.loss/gauge", {"rl.run.id": "r1"})
    series = _by(_list(mon, "rl.train.loss/gauge", start_s=20, end_s=60))
    ts = series["r1"]
    ends = [p.interval.end_time.timestamp() for p in ts.points]
    assert ends == sorted(ends, reverse=True)  # newest first
    expected = [(p["time_ns"], p["value"]) for p in stored if T0 + 20 * S < p["time_ns"] <= T0 + 60 * S]
    assert len(expected) == 8  # 25, 30, ..., 60: start excluded, end included
    got = sorted((round(p.interval.end_time.timestamp() * S), p.value.double_value)
                 for p in ts.points)
    assert got == expected
    assert ts.metric_kind == Kind.GAUGE
    assert dict(ts.resource.labels) == {"project_id": "local", "location": "local",
                                        "cluster": "local", "namespace": "distrl",
                                        "job": "rl-training-service", "instance": "i1"}
    assert ts.resource.type == "prometheus_target"
    assert dict(ts.metric.labels) == {"rl.run.id": "r1", "rl.environment.name": "CartPole-v1",
                                      "rl.loop": "actor"}


def test_filters_on_dotted_labels_functions_and_resource_labels(mon):
    def runs(*filters, metric="rl.train.loss/gauge"):
        return sorted(ts.metric.labels["rl.run.id"] for ts in _list(mon, metric,
                                                                    filters=list(filters)))
    assert runs('metric.labels."rl.environment.name" = "CartPole-v1"') == ["r1", "r3"]
    assert runs('metric.label."rl.run.id" != "r1"') == ["r2", "r3"]
    assert runs('metric.labels."rl.run.id" = one_of("r1", "r2")') == ["r1", "r2"]
    assert runs('metric.labels."rl.environment.name" = starts_with("Acro")') == ["r2"]
    assert runs('metric.labels."rl.run.id" = monitoring.regex.full_match("r[23]")') == ["r2", "r3"]
    assert runs('metric.labels."rl.run.id" = "r1"',
                'metric.labels."rl.environment.name" = "Acrobot-v1"') == []
    assert runs('resource.labels.instance = "i2"', metric="rl.sample.samples/counter") == ["r2"]
    assert runs('resource.type = "prometheus_target"', 'resource.label.job = ends_with("service")',
                metric="rl.sample.samples/counter") == ["r1", "r2"]
    with pytest.raises(exceptions.NotFound, match="Cannot find metric"):  # as Cloud Monitoring
        _list(mon, "no.such.metric/gauge")
    # Side by side means AND, as in Google's published dashboards' filters.
    request = {"name": mon.project_name, "interval": {"start_time": _time(T0),
                                                      "end_time": _time(T0 + 130 * S)},
               "filter": f'metric.type="{PREFIX}rl.train.loss/gauge" '
                         'resource.type="prometheus_target" metric.labels."rl.run.id"="r2"'}
    assert [ts.metric.labels["rl.run.id"] for ts in mon.client.list_time_series(request)] == ["r2"]
    request["filter"] = request["filter"].replace(' resource.type', ' = resource.type')
    with pytest.raises(exceptions.InvalidArgument, match="expected"):
        list(mon.client.list_time_series(request))


def test_counter_delta_and_rate_add_up_across_a_restart(mon, collector):
    series = _by(_list(mon, "rl.sample.samples/counter", aggregation=_agg(30, "ALIGN_DELTA"),
                       end_s=120))
    r1, r2 = _pts(series["r1"]), _pts(series["r2"])
    assert r1 == [(30, 300), (60, 300), (90, 300), (120, 300)]
    # 150 by 30 s; 250 - 150 then 7 after the restart; 28 - 7; 49 - 28.
    assert r2 == [(30, 150), (60, 107), (90, 21), (120, 21)]
    stored = collector.store().points(PREFIX + "rl.sample.samples/counter", {"rl.run.id": "r2"})
    lives = {}
    for p in stored:
        lives[p["start_ns"]] = p["value"]  # the last value of each life
    assert sum(v for _, v in r2) == sum(lives.values())  # nothing lost, nothing twice
    assert series["r2"].points[0].interval.start_time.timestamp() * S - T0 == 90 * S  # DELTA
    rates = _by(_list(mon, "rl.sample.samples/counter", aggregation=_agg(30, "ALIGN_RATE"),
                      end_s=120))
    assert _pts(rates["r1"]) == [(t, 10.0) for t in (30, 60, 90, 120)]
    assert rates["r1"].unit == "1/s"


def test_gauge_aligners_match_numpy_on_the_stored_points(mon, collector):
    stored = collector.store().points(PREFIX + "rl.train.loss/gauge", {"rl.run.id": "r3"})
    times = np.array([(p["time_ns"] - T0) / S for p in stored])
    values = np.array([p["value"] for p in stored])
    for aligner, fn in [("ALIGN_MEAN", np.mean), ("ALIGN_MIN", np.min), ("ALIGN_MAX", np.max),
                        ("ALIGN_SUM", np.sum), ("ALIGN_COUNT", len)]:
        got = _pts(_by(_list(mon, "rl.train.loss/gauge", aggregation=_agg(20, aligner),
                             end_s=120))["r3"])
        expected = [(end, fn(values[(times > end - 20) & (times <= end)]))
                    for end in range(20, 121, 20)]
        assert [t for t, _ in got] == [t for t, _ in expected], aligner
        np.testing.assert_allclose([v for _, v in got], [v for _, v in expected], err_msg=aligner)


def test_cross_series_reducers_grouped_by_environment(mon):
    for reducer, fn in [("REDUCE_MEAN", np.mean), ("REDUCE_SUM", np.sum), ("REDUCE_MIN", np.min),
                        ("REDUCE_MAX", np.max), ("REDUCE_COUNT", len),
                        ("REDUCE_PERCENTILE_50", np.median)]:
        series = _list(mon, "rl.train.loss/gauge", end_s=120,
                       aggregation=_agg(40, "ALIGN_MEAN", reducer,
                                        ['metric.labels."rl.environment.name"']))
        # Only the group-by label is left on a reduced series.
        assert all(set(ts.metric.labels) == {"rl.environment.name"} for ts in series), reducer
        by_env = {ts.metric.labels["rl.environment.name"]: _pts(ts) for ts in series}
        assert set(by_env) == {"CartPole-v1", "Acrobot-v1"}
        for env, members in [("CartPole-v1", [0, 2]), ("Acrobot-v1", [1])]:
            for end, value in by_env[env]:
                window = slice(int((end - 40) / 5), int(end / 5))  # points every 5 s
                means = [LOSS[i, window].mean() for i in members]
                assert value == pytest.approx(fn(means)), (reducer, env, end)
    # Grouping by a resource label: the counter's two series are on two instances.
    series = _list(mon, "rl.sample.samples/counter", end_s=120,
                   aggregation=_agg(120, "ALIGN_DELTA", "REDUCE_SUM", ["resource.labels.instance"]))
    assert {ts.resource.labels["instance"]: _pts(ts) for ts in series} == {
        "i1": [(120, 1200.0)], "i2": [(120, 299.0)]}
    assert all(dict(ts.metric.labels) == {} for ts in series)


def test_latency_percentiles_of_cumulative_histograms(mon):
    # r1 observed 100 values in (1, 2], r2 100 in (2, 5]; merged, p50 ends the (1, 2] bucket.
    for reducer, expected in [("REDUCE_PERCENTILE_50", 2.0), ("REDUCE_PERCENTILE_95", 4.7),
                              ("REDUCE_PERCENTILE_99", 4.94), ("REDUCE_MEAN", 2.25)]:
        series = _list(mon, "rl.loop.duration/histogram", end_s=100,
                       aggregation=_agg(100, "ALIGN_DELTA", reducer, ['metric.labels."rl.loop"']))
        assert len(series) == 1 and dict(series[0].metric.labels) == {"rl.loop": "actor"}
        assert _pts(series[0]) == [(100, pytest.approx(expected))], reducer
    # Per series, per period: r1's p95 of the last 50 s is inside (1, 2].
    series = _by(_list(mon, "rl.loop.duration/histogram", end_s=100,
                       aggregation=_agg(50, "ALIGN_DELTA", "REDUCE_PERCENTILE_95",
                                        ['metric.labels."rl.run.id"'])))
    assert _pts(series["r1"]) == [(50, pytest.approx(1.95)), (100, pytest.approx(1.95))]
    delta = _by(_list(mon, "rl.loop.duration/histogram", end_s=100,
                      aggregation=_agg(50, "ALIGN_DELTA")))["r2"]
    d = delta.points[0].value.distribution_value
    assert (d.count, list(d.bucket_counts), d.mean) == (50, [0, 0, 50, 0, 0], 3.0)
    assert list(d.bucket_options.explicit_buckets.bounds) == BOUNDS


def test_percentile_aligners_on_a_delta_histogram(mon):
    raw = _list(mon, "rl.step.duration/histogram", end_s=100)[0]
    assert raw.metric_kind == Kind.DELTA  # it was exported with delta temporality
    for aligner, expected in [("ALIGN_PERCENTILE_50", 7.5), ("ALIGN_PERCENTILE_05", 5.25)]:
        ts = _list(mon, "rl.step.duration/histogram", end_s=90,
                   aggregation=_agg(30, aligner))[0]
        assert _pts(ts) == [(t, pytest.approx(expected)) for t in (30, 60, 90)], aligner
    summed = _list(mon, "rl.step.duration/histogram", end_s=90, aggregation=_agg(30, "ALIGN_SUM"))
    assert [p.value.distribution_value.count for p in summed[0].points] == [30, 30, 30]


def test_paging_and_headers(mon):
    full = _list(mon, "rl.train.loss/gauge", end_s=120)
    pager = mon.client.list_time_series(request={
        "name": mon.project_name, "filter": f'metric.type = "{PREFIX}rl.train.loss/gauge"',
        "interval": {"start_time": _time(T0), "end_time": _time(T0 + 120 * S)},
        "page_size": 7})
    pages = list(pager.pages)
    assert len(pages) == -(-72 // 7)
    assert all(sum(len(ts.points) for ts in page.time_series) <= 7 for page in pages)
    joined = {}
    for page in pages:
        for ts in page.time_series:
            joined.setdefault(ts.metric.labels["rl.run.id"], []).extend(_pts(ts))
    assert {k: sorted(v) for k, v in joined.items()} == {
        ts.metric.labels["rl.run.id"]: _pts(ts) for ts in full}
    headers = list(mon.client.list_time_series(request={
        "name": mon.project_name, "filter": f'metric.type = "{PREFIX}rl.train.loss/gauge"',
        "interval": {"start_time": _time(T0), "end_time": _time(T0 + 120 * S)},
        "view": "HEADERS", "page_size": 2}).pages)
    assert [len(p.time_series) for p in headers] == [2, 1]
    assert all(len(ts.points) == 0 for p in headers for ts in p.time_series)


def test_metric_descriptors(mon):
    descriptors = list(mon.client.list_metric_descriptors(request={
        "name": "projects/local", "filter": f'metric.type = starts_with("{PREFIX}rl.")'}))
    assert [d.type for d in descriptors] == sorted(PREFIX + t for t in (
        "rl.loop.duration/histogram", "rl.sample.samples/counter", "rl.step.duration/histogram",
        "rl.train.loss/gauge"))
    loss = next(d for d in descriptors if d.type.endswith("loss/gauge"))
    assert [label.key for label in loss.labels] == ["rl.environment.name", "rl.loop", "rl.run.id"]
    assert loss.name == f"projects/local/metricDescriptors/{PREFIX}rl.train.loss/gauge"
    pages = list(mon.client.list_metric_descriptors(request={"name": "projects/local",
                                                             "page_size": 3}).pages)
    assert [len(p.metric_descriptors) for p in pages] == [3, 1]
    got = mon.client.get_metric_descriptor(name=loss.name)
    assert got.type == loss.type
    with pytest.raises(exceptions.NotFound, match="no metric descriptor"):
        mon.client.get_metric_descriptor(name="projects/local/metricDescriptors/x/gauge")
    table = mon.metric_types()
    assert list(table["metric_kind"]) == ["CUMULATIVE", "CUMULATIVE", "DELTA", "GAUGE"]


REFUSALS = [
    ({"filter": 'metric.type = "a" OR metric.type = "b"'}, exceptions.MethodNotImplemented, "OR"),
    ({"filter": 'NOT metric.type = "a"'}, exceptions.MethodNotImplemented, "NOT"),
    ({"filter": 'metric.type = "a" AND metric.labels.x > "1"'}, exceptions.MethodNotImplemented,
     "'>'"),
    ({"filter": 'metric.type = has_nothing("a")'}, exceptions.MethodNotImplemented,
     "has_nothing"),
    ({"filter": 'metric.labels.x = "1"'}, exceptions.InvalidArgument, "exactly one metric type"),
    ({"filter": 'metric.type = "a" AND metric.type = "b"'}, exceptions.InvalidArgument,
     "exactly one"),
    ({"filter": 'metric.type = "a" AND'}, exceptions.InvalidArgument, "ends early"),
    ({"filter": 'metric.typo = "a"'}, exceptions.InvalidArgument, "metric.typo"),
    ({"filter": 'metadata.user_labels.x = "a"'}, exceptions.MethodNotImplemented, "metadata"),
    ({"interval": {"start_time": _time(T0 + 10 * S), "end_time": _time(T0)}},
     exceptions.InvalidArgument, "after end_time"),
    ({"interval": {"start_time": _time(T0)}}, exceptions.InvalidArgument, "end_time is required"),
    ({"aggregation": {"per_series_aligner": "ALIGN_MEAN"}}, exceptions.InvalidArgument,
     "needs an alignment_period"),
    ({"aggregation": {"alignment_period": {"nanos": 5000}, "per_series_aligner": "ALIGN_MEAN"}},
     exceptions.InvalidArgument, "at least 1 s"),
    ({"aggregation": {"cross_series_reducer": "REDUCE_SUM"}}, exceptions.InvalidArgument,
     "needs a per_series_aligner"),
    ({"aggregation": _agg(60, "ALIGN_RATE")}, exceptions.InvalidArgument,
     "ALIGN_RATE is not valid for the GAUGE"),
    ({"aggregation": _agg(60, "ALIGN_STDDEV")}, exceptions.MethodNotImplemented, "ALIGN_STDDEV"),
    ({"aggregation": _agg(60, "ALIGN_MEAN", "REDUCE_STDDEV")}, exceptions.MethodNotImplemented,
     "REDUCE_STDDEV"),
    ({"aggregation": _agg(60, "ALIGN_MEAN", "REDUCE_SUM", ["metric.labels"])},
     exceptions.InvalidArgument, "metric.labels"),
    ({"secondary_aggregation": _agg(60, "ALIGN_MEAN")}, exceptions.MethodNotImplemented,
     "secondary_aggregation"),
    ({"order_by": "value"}, exceptions.MethodNotImplemented, "order_by"),
    ({"page_token": "bm9wZQ=="}, exceptions.InvalidArgument, "page_token"),
    # Refused whether or not any series matches: an unknown metric type, a filter with no match.
    ({"filter": 'metric.type = "nothing/gauge"', "aggregation": _agg(60, "ALIGN_STDDEV")},
     exceptions.MethodNotImplemented, "ALIGN_STDDEV"),
    ({"filter": f'metric.type = "{PREFIX}rl.train.loss/gauge" AND metric.labels.x = "none"',
      "aggregation": _agg(60, "ALIGN_RATE")}, exceptions.InvalidArgument, "ALIGN_RATE"),
    ({"aggregation": _agg(1, "ALIGN_MEAN"), "interval": {"start_time": _time(0),
                                                         "end_time": _time(T0)}},
     exceptions.InvalidArgument, "more than 100000 alignment periods"),
    ({"name": "organizations/1"}, exceptions.InvalidArgument, "projects/PROJECT_ID"),
]


@pytest.mark.parametrize("change,error,words", REFUSALS,
                         ids=[str(i) for i in range(len(REFUSALS))])
def test_unsupported_requests_are_refused_by_name(mon, change, error, words):
    request = {"name": mon.project_name, "filter": f'metric.type = "{PREFIX}rl.train.loss/gauge"',
               "interval": {"start_time": _time(T0), "end_time": _time(T0 + 60 * S)}, **change}
    with pytest.raises(error, match=words.replace("(", r"\(")):
        list(mon.client.list_time_series(request=request))


def test_refusals_of_kind_rules_and_other_methods(mon):
    hist = f'metric.type = "{PREFIX}rl.loop.duration/histogram"'
    interval = {"start_time": _time(T0), "end_time": _time(T0 + 60 * S)}
    with pytest.raises(exceptions.InvalidArgument, match="use ALIGN_DELTA with REDUCE_PERCENTILE_99"):
        list(mon.client.list_time_series(request={"name": mon.project_name, "filter": hist,
                                                  "interval": interval,
                                                  "aggregation": _agg(60, "ALIGN_PERCENTILE_99")}))
    with pytest.raises(exceptions.InvalidArgument, match="REDUCE_MIN is not valid for distribution"):
        list(mon.client.list_time_series(request={
            "name": mon.project_name, "filter": hist, "interval": interval,
            "aggregation": _agg(60, "ALIGN_DELTA", "REDUCE_MIN")}))
    with pytest.raises(exceptions.MethodNotImplemented, match="CreateServiceTimeSeries"):
        mon.client.create_service_time_series(name=mon.project_name, time_series=[])
    with pytest.raises(exceptions.InvalidArgument, match="time_series has 0 series"):
        mon.client.create_time_series(name=mon.project_name, time_series=[])
    with pytest.raises(exceptions.MethodNotImplemented, match="ListMetricDescriptors filter on "
                                                              "metric.label"):
        list(mon.client.list_metric_descriptors(request={"name": mon.project_name,
                                                         "filter": 'metric.labels.x = "1"'}))
    # Still serving after every refusal.
    assert len(_list(mon, "rl.train.loss/gauge")) == 3


def test_monitoring_and_explore_reject_bad_arguments():
    with pytest.raises(ValueError, match="project_id='Bad_Project'"):
        explore.Monitoring(project_id="Bad_Project")
    with pytest.raises(ValueError, match="endpoint='localhost'"):
        explore.Monitoring(endpoint="localhost")
    with pytest.raises(ValueError, match="metric 'rl.nope' is unknown"):
        explore.metric_type("rl.nope")
    assert explore.metric_type("rl.train.loss") == PREFIX + "rl.train.loss/gauge"
    with pytest.raises(ValueError, match="minutes=0"):
        explore.Monitoring().request("rl.train.loss", minutes=0)


# ---- the cloud path: the same requests, sent to a project over TLS ----

def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    return cert_pem, key_pem


class Recorder:
    """A MetricService that records each request (method, bytes, metadata), answers empty:
    no series, no descriptors, and NOT_FOUND for a descriptor asked for by name (what Cloud
    Monitoring answers for a type nothing has written)."""

    def __init__(self, credentials=None):
        from concurrent import futures

        from google.cloud import monitoring_v3

        self.calls = []
        responses = {"ListTimeSeries": monitoring_v3.ListTimeSeriesResponse.pb()(),
                     "ListMetricDescriptors": monitoring_v3.ListMetricDescriptorsResponse.pb()(),
                     "GetMetricDescriptor": None}

        def handler(method):
            def handle(request, context):
                self.calls.append((method, request, dict(context.invocation_metadata())))
                if responses[method] is None:
                    context.abort(grpc.StatusCode.NOT_FOUND, "no such metric descriptor")
                return responses[method]
            return grpc.unary_unary_rpc_method_handler(
                handle, request_deserializer=lambda b: b,
                response_serializer=lambda m: m.SerializeToString())

        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "google.monitoring.v3.MetricService", {m: handler(m) for m in responses}),))
        address = "localhost:0" if credentials else "127.0.0.1:0"
        self.port = (self.server.add_secure_port(address, credentials) if credentials
                     else self.server.add_insecure_port(address))
        self.server.start()


CLIENT_SCRIPT = """
import datetime as dt, json, sys
from google.auth.credentials import AnonymousCredentials
from distrl.otel import dashboard, explore
end = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
if sys.argv[1] == "cloud":
    mon = explore.Monitoring(project_id="my-project", credentials=AnonymousCredentials(),
                             client_options={"api_endpoint": sys.argv[2]})
else:
    mon = explore.Monitoring(endpoint=sys.argv[2])
mon.metric_types()
mon.golden_signals(where={"rl.run.id": "r1"}, group_by="rl.environment.name", end=end)
explore.preview_dashboard(mon, dashboard.dashboard(), where={"rl.algorithm": "apex-dqn"}, end=end)
print(mon.project_name)
"""


def test_cloud_path_sends_the_local_requests_to_the_project(tmp_path):
    import os
    import subprocess
    import sys

    from google.cloud import monitoring_v3

    cert, key = _self_signed(tmp_path)
    cloud = Recorder(grpc.ssl_server_credentials([(key, cert)]))
    local = Recorder()
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(tmp_path / "cert.pem"),
           "MPLBACKEND": "Agg"}
    for mode, target in [("cloud", f"localhost:{cloud.port}"), ("local", f"127.0.0.1:{local.port}")]:
        done = subprocess.run([sys.executable, "-c", CLIENT_SCRIPT, mode, target], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    assert len(cloud.calls) == len(local.calls) > 40
    types = {"ListTimeSeries": monitoring_v3.ListTimeSeriesRequest,
             "ListMetricDescriptors": monitoring_v3.ListMetricDescriptorsRequest,
             "GetMetricDescriptor": monitoring_v3.GetMetricDescriptorRequest}
    for (method, sent, metadata), (local_method, local_sent, _) in zip(cloud.calls, local.calls):
        assert method == local_method
        request = types[method].pb().FromString(sent)
        local_request = types[method].pb().FromString(local_sent)
        if method == "GetMetricDescriptor":  # why a query is empty: the type's labels
            assert request.name.startswith("projects/my-project/metricDescriptors/")
            assert local_request.name == request.name.replace("my-project", "local", 1)
            continue
        assert request.name == "projects/my-project" and local_request.name == "projects/local"
        local_request.name = request.name
        assert request == local_request  # the same filter, interval and aggregation
        assert "my-project" in metadata["x-goog-request-params"]
    filters = [types[m].pb().FromString(b).filter for m, b, _ in cloud.calls
               if m != "GetMetricDescriptor"]
    assert any('metric.labels."rl.run.id" = "r1"' in f for f in filters)
    assert any('metric.labels."rl.algorithm" = "apex-dqn"' in f for f in filters)


def test_cloud_monitoring_refuses_an_alignment_under_60_s_before_sending_anything():
    mon = explore.Monitoring(project_id="my-project", credentials=AnonymousCredentials(),
                             client_options={"api_endpoint": "127.0.0.1:9"})  # nothing there
    with pytest.raises(ValueError, match="alignment_s=10: Cloud Monitoring refuses alignment "
                       "periods under 60 s"):
        mon.time_series("rl.train.loss", aligner="ALIGN_MEAN", alignment_s=10)
    with pytest.raises(ValueError, match="alignment_s=30"):
        mon.query('metric.type = "x"', {"alignmentPeriod": "30s",
                                         "perSeriesAligner": "ALIGN_MEAN"})
    assert mon.request("rl.train.loss", aligner="ALIGN_MEAN", alignment_s=60)[
        "aggregation"]["alignment_period"] == {"seconds": 60}
    local = explore.Monitoring(endpoint="127.0.0.1:9")  # the local collector takes 10 s
    assert local.request("rl.train.loss", aligner="ALIGN_MEAN", alignment_s=10)[
        "aggregation"]["alignment_period"] == {"seconds": 10}


def test_a_backtracking_regex_is_linear_and_a_bad_one_is_invalid_argument(tmp_path):
    """Cloud Monitoring's regex dialect is RE2: "(a+)+" against a long label is linear there;
    with Python's re it doubled its time with every character and froze ingestion (here:
    2^41 steps, far past the call's 30-s deadline)."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as collector:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
        stub.Export(_request("i1", [_gauge([(_series_attrs("a" * 40 + "b", "CartPole-v1"),
                                             T0 + S, 1.0)])]), timeout=10)
        mon = explore.Monitoring(endpoint=collector.endpoint)
        request = mon.request("rl.train.loss", minutes=10 ** 7)
        request["filter"] += ' AND metric.labels."rl.run.id" = monitoring.regex.full_match("(a+)+")'
        assert list(mon.client.list_time_series(request=request, timeout=30)) == []
        request["filter"] = request["filter"].replace("(a+)+", "(a+b)")
        assert len(list(mon.client.list_time_series(request=request, timeout=30))) == 1
        request["filter"] = request["filter"].replace("(a+b)", "(a+")
        with pytest.raises(exceptions.InvalidArgument, match="bad RE2 regular expression"):
            list(mon.client.list_time_series(request=request, timeout=30))


# ---- reads against hostile or heavy requests ----

def _filled(tmp_path, series: int, points: int = 1, limits=None):
    """A store with `series` gauge series of `points` points each (T0 + k s), in-process."""
    store = CollectorStore(tmp_path / "otel.db", create=True, limits=limits)
    for lo in range(0, series, 5_000):
        store.write_metrics(_request("i1", [_gauge([
            (_series_attrs(f"run-{i}", "CartPole-v1"), T0 + (k + 1) * S, float(k))
            for i in range(lo, min(lo + 5_000, series)) for k in range(points)])]))
    return store


def _gauge_request(project="projects/local", start_s=0, end_s=130, **extra):
    request = monitoring_v3.ListTimeSeriesRequest(
        name=project, filter=f'metric.type = "{PREFIX}rl.train.loss/gauge"',
        interval={"start_time": _time(T0 + start_s * S), "end_time": _time(T0 + end_s * S)},
        **extra)
    return monitoring_v3.ListTimeSeriesRequest.pb(request)


def test_the_headers_view_reads_no_points(tmp_path):
    """A one-hour read of 200 series (72,000 points) past max_read_bytes was refused
    RESOURCE_EXHAUSTED, and so was its HEADERS view, which shows no point: without aggregation
    HEADERS now reads which series have a point in the interval, not the points. It lists what
    the FULL view lists, series for series."""
    store = _filled(tmp_path, series=200, points=360, limits=Limits(max_read_bytes=8 * 2**20))
    try:
        service = monitoring.MetricService(store)
        with pytest.raises(monitoring.Refused, match="would hold more than 8 MiB"):
            service.list_time_series(_gauge_request(end_s=3600))
        headers = service.list_time_series(_gauge_request(end_s=3600, view="HEADERS"))
        assert len(headers.time_series) == 200 and not any(ts.points for ts in headers.time_series)
        # The same series as the FULL view where it fits, also in a narrow interval.
        for start_s, end_s in ((0, 3), (100, 100), (359, 361), (400, 500)):
            full = service.list_time_series(_gauge_request(start_s=start_s, end_s=end_s,
                                                           page_size=100_000))
            heads = service.list_time_series(_gauge_request(start_s=start_s, end_s=end_s,
                                                            view="HEADERS"))
            without_points = []
            for ts in full.time_series:
                del ts.points[:]
                without_points.append(ts.SerializeToString(deterministic=True))
            assert sorted(without_points) == sorted(
                ts.SerializeToString(deterministic=True) for ts in heads.time_series), (start_s,
                                                                                        end_s)
            assert len(heads.time_series) == (200 if start_s < 360 else 0)
    finally:
        store.close()


def test_reads_past_a_cost_ceiling_are_refused_by_name(tmp_path):
    store = _filled(tmp_path, series=300, points=6,
                    limits=Limits(max_rows_scanned=1_500, max_series_periods=500,
                                  max_query_s=30))
    try:
        service = monitoring.MetricService(store)
        with pytest.raises(monitoring.Refused, match="reads more than 1,500 points") as err:
            service.list_time_series(_gauge_request())
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        aligned = _gauge_request(start_s=0, end_s=4, aggregation={
            "alignment_period": {"seconds": 1}, "per_series_aligner": "ALIGN_MEAN"})
        with pytest.raises(monitoring.Refused, match="series x 4 alignment periods is more "
                                                     "than 500") as err:
            service.list_time_series(aligned)  # refused once the series read reach it
        assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert int(str(err.value).split()[0]) == 126, err.value
        narrow = _gauge_request(start_s=0, end_s=2)  # 300 series x 2 points fit
        assert sum(len(s.points) for s in service.list_time_series(narrow).time_series) == 600
        slow = monitoring.MetricService(CollectorStore(store.path, limits=Limits(
            max_query_s=1e-9)))
        with pytest.raises(monitoring.Refused, match="deadline of 0.0 s") as err:
            slow.list_time_series(narrow)
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        store.close()


def test_a_walk_of_descriptor_pages_reads_each_descriptor_once(tmp_path):
    """Each page of ListMetricDescriptors read every descriptor before its offset again: a
    client walking 4,002 types a page at a time (page_size 1) made the collector read 8 M rows,
    28 s of a reader's CPU. A page now reads on from the last type the previous one listed:
    60 types walked one at a time, each page within a budget of 20 rows, every type once and in
    order, also with a type added before the walk's place (an offset listed one type twice)."""
    store = CollectorStore(tmp_path / "otel.db", create=True, limits=Limits(max_rows_scanned=20))
    try:
        service = monitoring.MetricService(store)

        def add(*names: str) -> None:
            store.write_metrics(_request("i1", [metrics_pb2.Metric(name=n, gauge={
                "data_points": [{"time_unix_nano": T0, "as_double": 1.0}]}) for n in names]))

        add(*(f"walk.{i:03d}" for i in range(1, 61)))
        listed, token = [], ""
        while True:
            page = service.list_metric_descriptors(monitoring_v3.ListMetricDescriptorsRequest.pb(
                monitoring_v3.ListMetricDescriptorsRequest(name="projects/local", page_size=1,
                                                           page_token=token)))
            listed += [d.type for d in page.metric_descriptors]
            if len(listed) == 30:
                add("walk.000")  # sorts before every type listed so far
            token = page.next_page_token
            if not token:
                break
        assert listed == [f"{PREFIX}walk.{i:03d}/gauge" for i in range(1, 61)]
    finally:
        store.close()


def test_a_one_hour_percentile_over_many_histograms_holds_aligned_cells_not_points(tmp_path):
    """A one-hour p99 over 200 latency histograms (72,000 points) was refused
    RESOURCE_EXHAUSTED: a read held every raw point before aligning any. Each series is now
    aligned as soon as its points are in, so the read holds one series' points and the aligned
    cells: here 100 cumulative histograms of 360 points (10 s apart), whose points would hold
    about 33 MiB, read within 8 MiB, and the answer is the one the whole points give."""
    store = CollectorStore(tmp_path / "otel.db", create=True, limits=Limits(
        max_read_bytes=8 * 2**20))
    try:
        for lo in range(0, 100, 25):  # series i puts one observation a point in bucket i % 5
            store.write_metrics(_request("i1", [_histogram("lat", 2, [
                (_series_attrs(f"run-{i}", "CartPole-v1"), T0, T0 + (k + 1) * 10 * S,
                 [k + 1 if b == i % 5 else 0 for b in range(5)], float(k + 1))
                for i in range(lo, lo + 25) for k in range(360)])]))
        request = monitoring_v3.ListTimeSeriesRequest.pb(monitoring_v3.ListTimeSeriesRequest(
            name="projects/local", filter=f'metric.type = "{PREFIX}lat/histogram"',
            interval={"start_time": _time(T0), "end_time": _time(T0 + 3600 * S)},
            aggregation=_agg(60, "ALIGN_DELTA", "REDUCE_PERCENTILE_99")))
        [p99] = monitoring.MetricService(store).list_time_series(request).time_series
        assert len(p99.points) == 60
        whole = series.Budget(Limits(), None)  # the points all held, then aligned: as before
        held = reads.read_series(store, reads.Selection(store.query(
            "SELECT * FROM metric_descriptors")[0], "local", []), T0 + 3600 * S, budget=whole)
        assert whole.bytes > 32 * 2**20, whole.bytes
        [expected] = aggregation.aggregate(held, request.aggregation, T0, T0 + 3600 * S)
        assert [p.value.double_value for p in reversed(p99.points)] == pytest.approx(
            [v for *_, v in expected.points])
    finally:
        store.close()


def test_later_pages_come_from_the_first_pages_result_not_a_recomputation(tmp_path):
    store = _filled(tmp_path, series=50, points=2)
    try:
        service = monitoring.MetricService(store)
        first = service.list_time_series(_gauge_request(page_size=40))
        assert first.next_page_token and sum(len(s.points) for s in first.time_series) == 40
        # A point written after the first page is not in this result's later pages.
        store.write_metrics(_request("i1", [_gauge([(_series_attrs("late", "CartPole-v1"),
                                                     T0 + 5 * S, 9.0)])]))
        pages, token = [first], first.next_page_token
        while token:
            pages.append(service.list_time_series(_gauge_request(page_size=40,
                                                                 page_token=token)))
            token = pages[-1].next_page_token
        runs = [s.metric.labels["rl.run.id"] for p in pages for s in p.time_series]
        assert "late" not in runs and sum(len(s.points) for p in pages
                                          for s in p.time_series) == 100
        # A new query sees the new point; a token whose result left the cache recomputes.
        assert "late" in {s.metric.labels["rl.run.id"]
                          for s in service.list_time_series(_gauge_request()).time_series}
        service.pages = monitoring.PageCache(max_bytes=1)
        again = service.list_time_series(_gauge_request(page_size=40,
                                                        page_token=first.next_page_token))
        assert sum(len(s.points) for s in again.time_series) == 40
    finally:
        store.close()


def test_a_large_result_comes_in_pages_every_client_can_receive(tmp_path):
    """gRPC clients refuse responses over 4 MiB by default: 40,000 series of 3 points came as
    one 4.5 MB page, and google-cloud-monitoring's client failed with RESOURCE_EXHAUSTED."""
    _filled(tmp_path, series=40_000, points=3).close()
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as collector:
        mon = explore.Monitoring(endpoint=collector.endpoint)
        pages = list(mon.client.list_time_series(request={
            "name": mon.project_name, "filter": f'metric.type = "{PREFIX}rl.train.loss/gauge"',
            "interval": {"start_time": _time(T0), "end_time": _time(T0 + 10 * S)}},
            timeout=60).pages)
        assert len(pages) >= 2
        assert all(type(p).pb(p).ByteSize() <= monitoring.MAX_RESPONSE_BYTES + 10_000
                   for p in pages)
        assert sum(len(s.points) for p in pages for s in p.time_series) == 120_000


def _pages(service, request) -> list:
    pages = [service.list_time_series(request)]
    while pages[-1].next_page_token:
        request.page_token = pages[-1].next_page_token
        pages.append(service.list_time_series(request))
    return pages


def _points_by_run(pages) -> dict:
    got: dict = {}
    for page in pages:
        for ts in page.time_series:
            got.setdefault(ts.metric.labels["rl.run.id"], []).extend(
                p.value.double_value for p in ts.points)
    return got


@pytest.mark.parametrize("cache_bytes", [64 * 2**20, 1])
def test_later_pages_come_from_the_first_pages_result_or_are_read_again(tmp_path, cache_bytes):
    """The result of a listing's first page is kept (its headers serialized, no list of every
    point) and later pages read it: points written between pages do not shift them. Where the
    page cache cannot hold it, every page reads the store again and still fits on."""
    import tracemalloc

    store = _filled(tmp_path, series=50, points=4, limits=Limits(page_cache_bytes=cache_bytes))
    try:
        service = monitoring.MetricService(store)
        request = _gauge_request(page_size=30)
        first = service.list_time_series(request)
        assert sum(len(ts.points) for ts in first.time_series) == 30
        store.write_metrics(_request("i1", [_gauge([  # a new series between the pages
            (_series_attrs("run-late", "CartPole-v1"), T0 + 2 * S, 9.0)])]))
        request.page_token = first.next_page_token
        pages = [first, *_pages(service, request)]
        kept = cache_bytes > 1
        assert [sum(len(ts.points) for ts in p.time_series) for p in pages] == \
            [30] * 6 + [20 if kept else 21]
        got = _points_by_run(pages)
        assert ("run-late" in got) is not kept  # read again: the new series joins the end
        got.pop("run-late", None)
        # Each series whole, once, newest point first, across page boundaries.
        assert got == {f"run-{i}": [3.0, 2.0, 1.0, 0.0] for i in range(50)}
        if kept:  # the kept result's size estimate bounds what it holds
            descriptor = service._descriptor(PREFIX + "rl.train.loss/gauge")
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                selection = monitoring.Selection(descriptor, "local",
                                                 monitoring.parse_filter(request.filter))
                series = service._series(request, selection, 0, T0 + 130 * S,
                                         monitoring.Budget(store.limits))
                result = monitoring.PagedResult(series, PREFIX + "rl.train.loss/gauge", "",
                                                headers_only=False)
                del series
                estimate = result.compact()
                held = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert held <= estimate <= 3 * held, (held, estimate)
    finally:
        store.close()


def test_times_outside_a_timestamp_and_huge_filters_get_short_errors(mon):
    huge = 'metric.type = "x" AND metric.labels.k = "' + "v" * 1_000_000 + '"'
    with pytest.raises(exceptions.InvalidArgument) as err:
        list(mon.client.list_time_series(request={
            "name": mon.project_name, "filter": huge,
            "interval": {"end_time": _time(T0)}}, timeout=30))
    assert "longer than" in err.value.message and len(err.value.message) < 400
    junk = "A" * 100_000
    with pytest.raises(exceptions.InvalidArgument) as err:
        list(mon.client.list_time_series(request={
            "name": mon.project_name, "filter": f'metric.type = "{PREFIX}rl.train.loss/gauge"',
            "interval": {"end_time": _time(T0)}, "page_token": junk}, timeout=30))
    assert "100,000 characters" in err.value.message and len(err.value.message) < 400
    request = monitoring_v3.ListTimeSeriesRequest.pb(monitoring_v3.ListTimeSeriesRequest(
        name=mon.project_name, filter=f'metric.type = "{PREFIX}rl.train.loss/gauge"'))
    request.interval.end_time.seconds = 2**62
    with pytest.raises(exceptions.InvalidArgument, match="9999-12-31"):
        mon.client.list_time_series(request=monitoring_v3.ListTimeSeriesRequest(request))
    request.interval.end_time.seconds = 253_402_300_799  # the last second a Timestamp holds
    request.aggregation.alignment_period.seconds = 3 * 10**11  # reaches back before 1970
    request.aggregation.per_series_aligner = Aligner.ALIGN_MEAN
    series = list(mon.client.list_time_series(request=monitoring_v3.ListTimeSeriesRequest(
        request), timeout=30))
    assert series and all(len(s.points) == 1 for s in series)


def test_identical_points_from_two_scopes_are_two_series(tmp_path):
    store = CollectorStore(tmp_path / "otel.db", create=True)
    try:
        for scope in ("lib.a", "lib.b"):
            req = _request("i1", [_gauge([(_series_attrs("r", "CartPole-v1"), T0 + S, 1.0)])])
            req.resource_metrics[0].scope_metrics[0].scope.name = scope
            assert store.write_metrics(req)[0] == 1
        series = monitoring.MetricService(store).list_time_series(_gauge_request()).time_series
        assert sorted(s.metric.labels["otel_scope_name"] for s in series) == ["lib.a", "lib.b"]
    finally:
        store.close()


# The seed's Cloud Monitoring strings, verbatim as issue 14 quotes them (the seed page's own
# text is not readable from this machine; its KIND suffix after the slash is not quoted there,
# so the type's own kind is used).
SEED_QUERIES = [
    (f'metric.type = "{PREFIX}rl_loop_duration_histogram/histogram"', exceptions.NotFound,
     f"did you mean '{PREFIX}rl.loop.duration/histogram'?"),
    (f'metric.type = "{PREFIX}rl_sample_samples_total/counter"', exceptions.NotFound,
     f"did you mean '{PREFIX}rl.sample.samples/counter'?"),
    (f'metric.type = "{PREFIX}rl.train.loss/gauge" AND metric.label."rl_run_id" == "run-42"',
     exceptions.InvalidArgument, "== is not a Monitoring filter comparison; write ="),
]


@pytest.mark.parametrize(("seed_filter", "answer", "hint"), SEED_QUERIES)
def test_the_local_collector_refuses_the_seeds_own_filters_and_hints_the_dotted_form(
        mon, seed_filter, answer, hint):
    """What the local collector (the emulator) answers the seed's filters: the status code
    Cloud Monitoring gives them, and a hint of its own. The text is the emulator's; nothing here
    reaches Cloud Monitoring."""
    interval = {"start_time": _time(T0), "end_time": _time(T0 + 130 * S)}
    with pytest.raises(answer) as refused:
        mon.client.list_time_series(request={"name": mon.project_name, "interval": interval,
                                             "filter": seed_filter})
    assert hint in refused.value.message


def test_the_local_collector_copies_cloud_monitorings_not_found_for_the_seeds_names(mon):
    """The seed writes prometheus.googleapis.com/rl_sample_samples_total/... and
    metric.label."rl_run_id": nothing by those names exists. Cloud Monitoring answers an
    unknown metric type with NOT_FOUND "Cannot find metric(s) that match type = ..." and a
    label no series has with no series. The local collector's copy of that answer (its own
    text, written from Cloud Monitoring's; nothing here reaches Cloud Monitoring), plus the
    dotted form."""
    interval = {"start_time": _time(T0), "end_time": _time(T0 + 130 * S)}
    with pytest.raises(exceptions.NotFound) as refused:
        mon.client.list_time_series(request={
            "name": mon.project_name, "interval": interval,
            "filter": f'metric.type = "{PREFIX}rl_sample_samples_total/counter"'})
    assert refused.value.message.startswith(
        f'Cannot find metric(s) that match type = "{PREFIX}rl_sample_samples_total/counter". '
        "If a metric was created recently, it could take up to 10 minutes to become available.")
    assert f"did you mean '{PREFIX}rl.sample.samples/counter'?" in refused.value.message
    # A type that does not exist and has no dotted twin: the same answer, no hint.
    with pytest.raises(exceptions.NotFound) as refused:
        mon.client.list_time_series(request={
            "name": mon.project_name, "interval": interval,
            "filter": f'metric.type = "{PREFIX}no.such.metric/gauge"'})
    assert "did you mean" not in refused.value.message
    pager = mon.client.list_time_series(request={
        "name": mon.project_name, "interval": interval,
        "filter": f'metric.type = "{PREFIX}rl.train.loss/gauge" AND '
                  'metric.label."rl_run_id" = "r1"'})
    [page] = list(pager.pages)
    assert list(page.time_series) == []
    assert 'metric.labels."rl.run.id"' in page.execution_errors[0].message
    with pytest.warns(UserWarning, match="did you mean"):
        frame = mon.query(f'metric.type = "{PREFIX}rl_train_loss/gauge"',
                          {"alignmentPeriod": "86400s", "perSeriesAligner": "ALIGN_MEAN"},
                          minutes=2 * 10**6)
    assert frame.empty
    # The dotted forms answer, with no hint.
    [page] = list(mon.client.list_time_series(request={
        "name": mon.project_name, "interval": interval,
        "filter": f'metric.type = "{PREFIX}rl.train.loss/gauge" AND '
                  'metric.labels."rl.run.id" = "r1"'}).pages)
    assert list(page.time_series) and not page.execution_errors


def test_a_percentile_across_series_with_disjoint_bounds(tmp_path):
    """REDUCE_PERCENTILE_99 over two series whose buckets share no bound answered 0: they were
    summed onto their shared bounds (none), one bucket from 0. Each bucket is now spread over
    the union of the bounds: r1's 100 values in [1, 2), r2's 100 in [10, 20)."""
    def hist(run, bounds, counts):
        m = metrics_pb2.Metric(name="rl.loop.duration", unit="ms")
        m.histogram.aggregation_temporality = 1  # delta
        m.histogram.data_points.add(attributes=_series_attrs(run, "CartPole-v1"),
                                    start_time_unix_nano=T0, time_unix_nano=T0 + 10 * S,
                                    count=sum(counts), sum=1.0, explicit_bounds=bounds,
                                    bucket_counts=counts)
        return m

    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        stub.Export(_request("i1", [hist("r1", [1.0, 2.0], [0, 100, 0]),
                                    hist("r2", [10.0, 20.0], [0, 100, 0])]), timeout=10)
        mon = explore.Monitoring(endpoint=c.endpoint)
        for reducer, expected in [("REDUCE_PERCENTILE_99", 19.8), ("REDUCE_PERCENTILE_50", 2.0),
                                  ("REDUCE_PERCENTILE_05", 1.1)]:
            [series] = _list(mon, "rl.loop.duration/histogram", end_s=60,
                             aggregation=_agg(60, "ALIGN_SUM", reducer))
            assert _pts(series) == [(60, pytest.approx(expected))], reducer


def test_a_filter_is_charged_for_the_series_it_keeps(tmp_path):
    """A filter that selects one series of a large metric was refused for the metric's size
    (every series was charged before the filter), though the refusal advised narrowing the
    filter. Series the filter drops now cost their key alone."""
    limits = Limits(max_read_bytes=8 * 2**20)
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=limits) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        gauge = metrics_pb2.Metric(name="wide")
        for i in range(10_000):
            gauge.gauge.data_points.add(attributes=_attrs(series=f"s{i}"),
                                        time_unix_nano=T0 + 5 * S, as_double=float(i))
        stub.Export(_request("i1", [gauge]), timeout=60)
        mon = explore.Monitoring(endpoint=c.endpoint)
        with pytest.raises(exceptions.ResourceExhausted, match="narrow the interval or the filter"):
            _list(mon, "wide/gauge", end_s=10)  # 10,000 series x 2 KB: past 8 MiB
        [one] = _list(mon, "wide/gauge", end_s=10, filters=['metric.labels.series = "s5"'])
        assert _pts(one) == [(5, 5.0)]


def test_golden_signals_keep_each_charts_own_filter(tmp_path):
    """The evaluator's panels hold the evaluator's points only: the actors' exploring returns,
    on the same instrument with rl.loop = actor, once lifted the greedy mean above its best."""
    def reward(name, points):
        m = metrics_pb2.Metric(name=name, unit="1")
        for loop, t, value in points:
            m.gauge.data_points.add(attributes=_series_attrs("r1", "CartPole-v1", loop),
                                    time_unix_nano=t, as_double=value)
        return m

    points = [("evaluator", T0 + 10 * S, 14.0), ("evaluator", T0 + 20 * S, 12.0),
              ("actor", T0 + 15 * S, 42.0), ("actor", T0 + 25 * S, 44.0)]
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        stub.Export(_request("i1", [reward("rl.environment.reward.mean", points),
                                    reward("rl.environment.episode.length.mean", points)]),
                    timeout=10)
        mon = explore.Monitoring(endpoint=c.endpoint)
        frames = mon.golden_signals(where={"rl.run.id": "r1"}, alignment_s=60,
                                    end=_time(T0 + 60 * S))
        for title in ("greedy mean episode reward (evaluator)",
                      "greedy mean episode length (evaluator)"):
            df = frames[title][0]
            assert df["value"].tolist() == [13.0], title  # the evaluator's mean, no actor's
        # The caller's own where still applies beside the chart's.
        frames = mon.golden_signals(where={"rl.run.id": "r2"}, alignment_s=60,
                                    end=_time(T0 + 60 * S))
        assert frames["greedy mean episode reward (evaluator)"][0].empty
        # A latency panel's title names the percentiles it draws, not all three.
        titles = mon.golden_signals(alignment_s=60, end=_time(T0 + 60 * S),
                                    percentiles=("p95",)).keys()
        assert "rl.loop.duration p95" in titles and not any("p50" in t for t in titles)


def test_the_sample_rate_alert_fires_on_a_stall_after_training_and_not_at_start_up(tmp_path):
    """dashboard.SAMPLE_RATE_DROP_PROMQL as explore.sample_rate_drops runs it locally: run A's
    learner hangs from 25 s to 40 s (its actors stop stepping); run B only starts slowly (no
    env step until its learner's first update at 10 s, as every run here does); run C never
    trains. A threshold on the rate alone fires on all three."""
    def counter(name, points):
        m = metrics_pb2.Metric(name=name, unit="1")
        m.sum.is_monotonic, m.sum.aggregation_temporality = True, 2
        for run, t, value in points:
            m.sum.data_points.add(attributes=_series_attrs(run, "CartPole-v1"),
                                  start_time_unix_nano=T0, time_unix_nano=T0 + t * S,
                                  as_double=value)
        return m

    def steps(t, hung=()):  # 1,000 env steps/s from 10 s on, none while hung
        return 1000.0 * sum(1 for u in range(11, t + 1) if u not in hung)

    fault = range(26, 41)
    samples = [("A", t, steps(t, fault)) for t in range(56)]
    samples += [("B", t, steps(t)) for t in range(56)] + [("C", t, 0.0) for t in range(56)]
    train = [("A", t, steps(t, fault) / 20) for t in range(11, 56) if t not in fault]
    train += [("B", t, steps(t) / 20) for t in range(11, 56)]
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        stub.Export(_request("i1", [counter("rl.sample.samples", samples),
                                    counter("rl.train.steps", train)]), timeout=10)
        mon = explore.Monitoring(endpoint=c.endpoint)
        kwargs = dict(minutes=2, time_scale=1 / 60, end=_time(T0 + 60 * S))
        rates, windows, alignment_s, duration_s = explore.sample_rate_drops(mon, **kwargs)
        assert (alignment_s, duration_s) == (5, 5.0)
        assert set(rates["rl.run.id"]) == {"A", "B", "C"}
        assert windows["rl.run.id"].tolist() == ["A"]  # the hang, and nothing at start-up
        assert windows["start"].tolist() == [_time(T0 + 25 * S)]
        assert windows["end"].tolist() == [_time(T0 + 40 * S)]
        assert windows["worst"].tolist() == [0.0]
        # What the old threshold on the rate alone made of the same data: all three fired.
        starting = rates[(rates["value"] < dashboard.SAMPLE_RATE_FLOOR)]
        assert set(starting["rl.run.id"]) == {"A", "B", "C"}
        # Nothing recorded: no rates, no firing.
        empty = explore.sample_rate_drops(mon, minutes=2, time_scale=1 / 60,
                                          end=_time(T0 + 60 * S), where={"rl.run.id": "Z"})
        assert empty[0].empty and empty[1].empty
        with pytest.raises(ValueError, match="time_scale=0"):
            explore.sample_rate_drops(mon, time_scale=0)


def test_a_label_spelled_as_the_seed_spells_it_is_named_with_the_stored_key(tmp_path):
    """The seed's documents write rl_run_id where OTLP stores rl.run.id. The collector answers
    that filter with nothing, as Cloud Monitoring does; the reading layer says why and names
    the stored key. A label the metric has, with a value that matches nothing, is just empty."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        stub.Export(_request("i1", [_gauge([(_series_attrs("r1", "CartPole-v1"), T0, 0.5)])]),
                    timeout=10)
        mon = explore.Monitoring(endpoint=c.endpoint)
        end = _time(T0 + 60 * S)
        raw = mon.client.list_time_series(request=mon.request(
            "rl.train.loss", where={"rl_run_id": "r1"}, minutes=5, end=end))
        assert list(raw) == []  # the service's answer, kept
        with pytest.warns(UserWarning, match="its key is 'rl.run.id'"), pytest.raises(
                explore.NoSuchLabel, match=(
                r"no series of rl.train.loss has the label 'rl_run_id', so nothing matched; "
                r"did you mean 'rl.run.id'\? \(its labels: .*rl.run.id")):
            mon.time_series("rl.train.loss", where={"rl_run_id": "r1"}, minutes=5, end=end)
        with pytest.raises(explore.NoSuchLabel, match="'rl_loop'.*did you mean 'rl.loop'"):
            mon.time_series("rl.train.loss", group_by=("rl_loop",), aligner="ALIGN_MEAN",
                            reducer="REDUCE_MEAN", minutes=5, end=end)
        assert mon.time_series("rl.train.loss", where={"rl.run.id": "r2"}, minutes=5,
                               end=end).empty
        assert len(mon.time_series("rl.train.loss", where={"rl.run.id": "r1"}, minutes=5,
                                   end=end)) == 1
        assert mon.time_series("never.written/gauge", where={"x": "y"}, minutes=5, end=end).empty


def test_the_reward_drop_alert_fires_on_a_held_collapse_and_not_on_one_low_evaluation(tmp_path):
    """The reward-drop policy as explore.reward_drop_windows runs it locally (time_scale 1/60:
    5-s means, a 60-s lookback for the best, 5 s held): run A's evaluator scores 400 every
    second but one 0 (ordinary noise: its period's mean stays within 30 % of the best); run
    B's falls from 400 to 100 from 30 s to 45 s and comes back; run C's rewards are negative
    (Acrobot) and only improve. A comparison of each point with its best fired on A too."""
    def gauge(points):
        m = metrics_pb2.Metric(name="rl.environment.reward.mean", unit="1")
        for run, t, value in points:
            m.gauge.data_points.add(attributes=_series_attrs(run, "CartPole-v1", "evaluator"),
                                    time_unix_nano=T0 + t * S, as_double=value)
        return m

    points = [("A", t, 0.0 if t == 33 else 400.0) for t in range(10, 56)]
    points += [("B", t, 100.0 if 30 < t <= 45 else 400.0) for t in range(10, 56)]
    points += [("C", t, -500.0 + 8 * t) for t in range(10, 56)]
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        stub.Export(_request("i1", [gauge(points)]), timeout=10)
        mon = explore.Monitoring(endpoint=c.endpoint)
        kwargs = dict(minutes=2, time_scale=1 / 60, end=_time(T0 + 60 * S))
        means, windows, alignment_s, duration_s = explore.reward_drop_windows(mon, **kwargs)
        assert (alignment_s, duration_s) == (5, 5.0)
        assert set(means["rl.run.id"]) == {"A", "B", "C"}
        assert windows["rl.run.id"].tolist() == ["B"]
        assert windows["start"].tolist() == [_time(T0 + 30 * S)]
        assert windows["end"].tolist() == [_time(T0 + 45 * S)]
        assert windows["worst"].tolist() == [100.0]
        # Each point against its best so far, as the old local twin compared them: A fired.
        a = means[means["rl.run.id"] == "A"]
        raw = [v for run, _, v in points if run == "A"]
        assert min(raw) < 0.7 * max(raw) and a["value"].min() > 0.7 * 400
        empty = explore.reward_drop_windows(mon, where={"rl.run.id": "Z"}, **kwargs)
        assert empty[0].empty and empty[1].empty
        with pytest.raises(ValueError, match="time_scale=2"):
            explore.reward_drop_windows(mon, time_scale=2)


def test_a_users_own_metrics_and_spans_are_listed_read_and_plotted(tmp_path):
    """Instruments outside the RL conventions, exported by the OTel SDK over OTLP/gRPC: docs/
    telemetry.md's own-client recipe lists them, explore lists, reads (NAME/KIND) and plots
    them, an UpDownCounter lands as a gauge, and a span of a process that sets only
    service.name is named by it."""
    import re
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with LocalCollector(tmp_path / "otel.db", port=0) as collector:  # its token, as a user's
        target = collector.endpoint.removeprefix("http://")
        headers = {"authorization": f"Bearer {collector.token_file.read_text().strip()}"}
        resource = Resource.create({"service.name": "shop-service"})
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=target, insecure=True, headers=headers),
            export_interval_millis=60_000)
        meters = MeterProvider(resource=resource, metric_readers=[reader])
        orders = meters.get_meter("shop").create_counter("shop.orders")
        queue = meters.get_meter("shop").create_up_down_counter("queue.depth")
        for shop, n in (("north", 3), ("south", 5)):
            orders.add(n, {"shop": shop})
        queue.add(4)
        queue.add(-1)
        assert meters.force_flush(timeout_millis=10_000)
        orders.add(2, {"shop": "north"})
        assert meters.force_flush(timeout_millis=10_000)
        meters.shutdown()
        tracer = TracerProvider(resource=resource)
        tracer.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint=target, insecure=True, headers=headers)))
        with tracer.get_tracer("shop").start_as_current_span("checkout"):
            pass
        tracer.shutdown()

        docs = (Path(__file__).parents[1] / "docs" / "telemetry.md").read_text()
        recipe = re.search(r"### Your own client.*?```python\n(.*?)```", docs, re.S)[1]
        listed: list = []
        exec(recipe.replace("127.0.0.1:4317", target).replace("print(", "listed.append(")
             .replace('"otel.db.token"', repr(str(collector.token_file))), {"listed": listed})
        assert f"{explore.PREFIX}shop.orders/counter" in listed[0]

        mon = explore.Monitoring(endpoint=collector.endpoint, token_file=collector.token_file)
        kinds = dict(zip(mon.metric_types()["metric_type"], mon.metric_types()["metric_kind"]))
        assert kinds == {f"{explore.PREFIX}shop.orders/counter": "CUMULATIVE",
                         f"{explore.PREFIX}queue.depth/gauge": "GAUGE"}
        assert mon.metric_types("rl.").empty
        frame = mon.time_series("shop.orders/counter", minutes=10)
        assert sorted(frame.groupby("shop")["value"].max().items()) == [("north", 5.0),
                                                                        ("south", 5.0)]
        assert list(mon.time_series("queue.depth/gauge", minutes=10)["value"])[-1] == 3.0
        [ax] = explore.plot_time_series(frame, by=("shop",), title="orders")
        assert len(ax.get_lines()) == 2
        with pytest.raises(ValueError, match=r"NAME/KIND for any other \(KIND: counter, gauge"):
            mon.time_series("shop.orders")
        with pytest.raises(ValueError, match="by='shop' is invalid"):
            explore.plot_time_series(frame, by="shop")
        spans = explore.traces(CollectorStore(tmp_path / "otel.db"))
        assert list(spans["components"]) == ["shop-service"]


def test_percentiles_of_an_exponential_histogram_across_a_scale_change(tmp_path):
    """The OTel SDK's exponential histogram starts at scale 20 and goes coarser as wider values
    arrive (here to 3 or so). The delta of two cumulative points of different scales came back
    with p50 and p99 of 0.0: their bounds were intersected (almost none are shared). Brought to
    the coarser scale, the percentiles are within one bucket of the values recorded."""
    import time

    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import Histogram, MeterProvider
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

    rng = np.random.default_rng(0)
    later = rng.lognormal(3.0, 1.2, 2_000)  # about 1 to 1,000
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as collector:
        exporter = OTLPMetricExporter(
            endpoint=collector.endpoint.removeprefix("http://"), insecure=True,
            preferred_temporality={Histogram: AggregationTemporality.CUMULATIVE})
        meters = MeterProvider(
            metric_readers=[PeriodicExportingMetricReader(exporter, 60_000)],
            views=[View(instrument_name="lat", aggregation=ExponentialBucketHistogramAggregation())])
        latency = meters.get_meter("t").create_histogram("lat")
        for _ in range(10):
            latency.record(19.9)  # one value: the finest scale, 20
        assert meters.force_flush(10_000)
        time.sleep(1.2)  # the next point in the next one-second alignment period
        for value in later:
            latency.record(float(value))
        assert meters.force_flush(10_000)
        meters.shutdown()
        mon = explore.Monitoring(endpoint=collector.endpoint)
        stored = CollectorStore(tmp_path / "otel.db").points(f"{PREFIX}lat/histogram")
        scales = [p["exponential"]["scale"] for p in stored]
        assert scales[0] == 20 and scales[-1] <= 5, scales
        got = {}
        for q in ("50", "99"):
            frame = mon.time_series("lat/histogram", minutes=10, aligner="ALIGN_DELTA",
                                    reducer=f"REDUCE_PERCENTILE_{q}", alignment_s=1)
            got[q] = frame["value"].iloc[-1]
        bucket = 2 ** (2.0 ** -scales[-1])  # the ratio of a bucket's bounds at that scale
        for q, value in got.items():
            truth = np.percentile(later, float(q))
            assert truth / bucket <= value <= truth * bucket, (q, value, truth, scales)


def test_summed_bucket_counts_past_64_bits_are_out_of_range_not_wrapped():
    """Bucket counts are int64: two series summed past 2^63 wrapped silently (a p50 of 2.0 where
    the truth is 1.5); an INT64 sum already answered OUT_OF_RANGE, and so do these now."""
    def dist(count: int) -> series.Dist:
        return series.Dist(count, 1.0, (1.0, 2.0), np.array([0, count, 0], dtype=np.int64))

    assert list((dist(2**61) + dist(2**61)).counts) == [0, 2**62, 0]  # within 64 bits: exact
    with pytest.raises(monitoring.Refused) as refused:
        dist(2**62) + dist(2**62)  # 2^63: one past INT64_MAX
    assert refused.value.code == grpc.StatusCode.OUT_OF_RANGE
    small = series.Dist(3, 4.5, (1.0, 2.0), np.array([1, 1, 1], dtype=np.int64))
    assert list((small + small).counts) == [2, 2, 2]


def test_google_samples_calls_a_built_in_type_and_a_resource_zone_group(mon):
    """Two calls of Google's Cloud Monitoring samples (python-docs-samples monitoring/snippets/
    v3/cloud-client), made the same way through the real client: list_time_series of a
    built-in type with no data answers an empty list, as Cloud Monitoring does (it answered
    NOT_FOUND), while a user-defined type that does not exist stays NOT_FOUND; and the reduce
    sample's group_by "resource.zone" (refused as no selector) groups by that resource label."""
    interval = {"start_time": _time(T0), "end_time": _time(T0 + 130 * S)}
    built_in = list(mon.client.list_time_series(request={
        "name": mon.project_name, "interval": interval, "view": "FULL",
        "filter": 'metric.type = "compute.googleapis.com/instance/cpu/utilization"'}))
    assert built_in == []
    with pytest.raises(exceptions.NotFound, match="Cannot find metric"):
        list(mon.client.list_time_series(request={
            "name": mon.project_name, "interval": interval,
            "filter": f'metric.type = "{PREFIX}no.such.metric/gauge"'}))
    grouped = _list(mon, "rl.train.loss/gauge", aggregation=_agg(
        60, "ALIGN_MEAN", "REDUCE_MEAN", ("resource.zone",)))
    ungrouped = _list(mon, "rl.train.loss/gauge", aggregation=_agg(60, "ALIGN_MEAN",
                                                                  "REDUCE_MEAN"))
    assert [_pts(ts) for ts in grouped] == [_pts(ts) for ts in ungrouped]  # no zone: one group
    # The aggregate and reduce samples' tests check that the points print a start_time: a
    # GAUGE point's is its end time, TimeInterval's documented default (it had none).
    points = [p for ts in grouped for p in ts.points]
    assert points and all(p.interval.start_time == p.interval.end_time for p in points)
    assert "start_time" in str(grouped[0]._pb) and "end_time" in str(grouped[0]._pb)


def test_google_samples_monitored_resource_calls_describe_the_stored_resource_types(mon):
    """The samples' list_monitored_resources and get_monitored_resource_descriptor, through the
    real client: the collector lists prometheus_target, the type of every OTLP series, with the
    labels its series carry, and the types CreateTimeSeries may write (they were
    UNIMPLEMENTED); a Get of a type it does not store is NOT_FOUND naming the ones it does.
    Bad names and filters are refused."""
    listed = list(mon.client.list_monitored_resource_descriptors(name=mon.project_name))
    assert [d.type for d in listed] == ["gce_instance", "generic_node", "generic_task", "global",
                                        "k8s_container", "prometheus_target"]
    got = mon.client.get_monitored_resource_descriptor(
        name=f"{mon.project_name}/monitoredResourceDescriptors/prometheus_target")
    assert got == listed[-1] and got.name.startswith(mon.project_name + "/")
    [series] = _list(mon, "rl.train.loss/gauge")[:1]
    assert sorted(label.key for label in got.labels) == sorted(series.resource.labels)
    gce = mon.client.get_monitored_resource_descriptor(
        name=f"{mon.project_name}/monitoredResourceDescriptors/gce_instance")
    assert [label.key for label in gce.labels] == ["project_id", "instance_id", "zone"]
    assert [d.type for d in mon.client.list_monitored_resource_descriptors(request={
        "name": mon.project_name, "filter": 'resource.type = starts_with("prometheus")'})] == [
            "prometheus_target"]
    assert not list(mon.client.list_monitored_resource_descriptors(request={
        "name": mon.project_name, "filter": 'resource.type = "pubsub_topic"'}))
    with pytest.raises(exceptions.NotFound, match="stores series of gce_instance, generic_node"):
        mon.client.get_monitored_resource_descriptor(
            name=f"{mon.project_name}/monitoredResourceDescriptors/pubsub_topic")
    with pytest.raises(exceptions.InvalidArgument, match="monitoredResourceDescriptors/RESOURCE"):
        mon.client.get_monitored_resource_descriptor(name="prometheus_target")
    with pytest.raises(exceptions.InvalidArgument, match="filters on resource.type only"):
        list(mon.client.list_monitored_resource_descriptors(request={
            "name": mon.project_name, "filter": 'metric.type = "x"'}))


def test_google_samples_write_calls_store_what_they_write_and_refuse_what_cloud_monitoring_does(
        tmp_path):
    """Google's samples create a descriptor, get and delete it, and write a gce_instance series
    (python-docs-samples monitoring/snippets/v3/cloud-client: the same calls with the same
    arguments here, through the real client); they were UNIMPLEMENTED, so the samples' tests
    failed in their fixtures. The series reads back with its resource, also aligned and reduced
    by resource.zone as the samples read; the point rules of CreateTimeSeries refuse a series
    alone, naming it, and keep the others of its request."""
    from google.api import label_pb2 as ga_label
    from google.api import metric_pb2 as ga_metric

    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as collector:
        client = explore.Monitoring(endpoint=collector.endpoint).client
        project_name = "projects/my-project"
        descriptor = ga_metric.MetricDescriptor()  # create_metric_descriptor
        descriptor.type = "custom.googleapis.com/my_metric" + "6c0e6b8a"
        descriptor.metric_kind = ga_metric.MetricDescriptor.MetricKind.GAUGE
        descriptor.value_type = ga_metric.MetricDescriptor.ValueType.DOUBLE
        descriptor.description = "This is a simple example of a custom metric."
        labels = ga_label.LabelDescriptor()
        labels.key = "TestLabel"
        labels.value_type = ga_label.LabelDescriptor.ValueType.STRING
        labels.description = "This is a test label"
        descriptor.labels.append(labels)
        descriptor = client.create_metric_descriptor(name=project_name,
                                                     metric_descriptor=descriptor)
        assert descriptor.name == f"{project_name}/metricDescriptors/{descriptor.type}"
        got = client.get_metric_descriptor(name=descriptor.name)  # get_metric_descriptor
        assert "DOUBLE" in str(got) and [label.key for label in got.labels] == ["TestLabel"]
        assert got.description == "This is a simple example of a custom metric."
        client.delete_metric_descriptor(name=descriptor.name)  # delete_metric_descriptor
        with pytest.raises(exceptions.NotFound):
            client.get_metric_descriptor(name=descriptor.name)

        def series(metric_type, end_s, value=None, resource_type="gce_instance", resource=None):
            s = monitoring_v3.TimeSeries()  # write_time_series
            s.metric.type = metric_type
            s.resource.type = resource_type
            for key, label in ({"instance_id": "1234567890123456789", "zone": "us-central1-f"}
                               if resource is None else resource).items():
                s.resource.labels[key] = label
            s.metric.labels["TestLabel"] = "My Label Data"
            seconds = int(end_s)
            interval = monitoring_v3.TimeInterval(
                {"end_time": {"seconds": seconds, "nanos": int((end_s - seconds) * 10**9)}})
            s.points = [monitoring_v3.Point({"interval": interval, "value": value or {
                "double_value": 3.14}})]
            return s

        mine = "custom.googleapis.com/my_metric" + "b1f4"
        now = time.time()
        client.create_time_series(name=project_name, time_series=[series(mine, now - 60)])
        interval = monitoring_v3.TimeInterval({"end_time": {"seconds": int(now)},
                                               "start_time": {"seconds": int(now) - 1200}})
        [full] = client.list_time_series(request={
            "name": project_name, "filter": f'metric.type = "{mine}"', "interval": interval,
            "view": monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL})
        assert full.resource.type == "gce_instance" and dict(full.resource.labels) == {
            "project_id": "my-project", "instance_id": "1234567890123456789",
            "zone": "us-central1-f"}
        assert dict(full.metric.labels) == {"TestLabel": "My Label Data"}
        assert [p.value.double_value for p in full.points] == [3.14]
        assert full.metric_kind == ga_metric.MetricDescriptor.MetricKind.GAUGE  # made for it
        [reduced] = client.list_time_series(request={
            "name": project_name, "filter": f'metric.type = "{mine}" resource.type = '
            '"gce_instance"', "interval": interval, "aggregation": monitoring_v3.Aggregation({
                "alignment_period": {"seconds": 1200},
                "per_series_aligner": monitoring_v3.Aggregation.Aligner.ALIGN_MEAN,
                "cross_series_reducer": monitoring_v3.Aggregation.Reducer.REDUCE_MEAN,
                "group_by_fields": ["resource.zone"]})})
        assert reduced.resource.type == "gce_instance"
        assert dict(reduced.resource.labels) == {"zone": "us-central1-f"}
        assert [p.value.double_value for p in reduced.points] == [3.14]
        assert not list(client.list_time_series(request={
            "name": project_name, "filter": f'metric.type = "{mine}" resource.type = "global"',
            "interval": interval}))

        # One request: a good series is kept, each faulty one is refused by its index.
        with pytest.raises(exceptions.InvalidArgument) as refused:
            client.create_time_series(name=project_name, time_series=[
                series(mine, now - 60),  # [0] its series has this point already
                series(mine, now - 30, resource_type="pubsub_topic"),  # [1]
                series(mine, now - 30, resource={"zone": "us-central1-f"}),  # [2]
                series(mine, now - 30, value={"int64_value": 3}),  # [3] DOUBLE's type
                series("compute.googleapis.com/instance/cpu/utilization", now - 30),  # [4]
                series("custom.googleapis.com/other", now - 30, resource_type="global",
                       resource={}),
            ])
        said = str(refused.value)
        assert "One or more TimeSeries could not be written" in said, said
        assert "timeSeries[0]: Points must be written in order" in said, said
        assert "timeSeries[1]: resource.type 'pubsub_topic'" in said, said
        assert "timeSeries[2]: the labels of resource.type gce_instance are instance_id, zone"\
            in said, said
        assert "timeSeries[3]: Value type for metric " + mine + " must be DOUBLE, but is INT64" \
            in said, said
        assert "timeSeries[4]: metric.type 'compute.googleapis.com" in said, said
        assert "timeSeries[5]" not in said, said
        [other] = client.list_time_series(request={
            "name": project_name, "filter": 'metric.type = "custom.googleapis.com/other"',
            "interval": interval})
        assert other.resource.type == "global" and dict(other.resource.labels) == {
            "project_id": "my-project"}
        [again] = client.list_time_series(request={
            "name": project_name, "filter": f'metric.type = "{mine}"', "interval": interval})
        assert len(again.points) == 1  # none of the refused ones landed
        two = series(mine, now - 20)
        two.points.append(two.points[0])
        with pytest.raises(exceptions.InvalidArgument, match="2 points; each series"):
            client.create_time_series(name=project_name, time_series=[two])
        with pytest.raises(exceptions.InvalidArgument, match="201 series: expected 1 to 200"):
            client.create_time_series(name=project_name, time_series=[
                series(mine, now - 10)] * 201)
        with pytest.raises(exceptions.MethodNotImplemented, match="metric kind DELTA"):
            client.create_metric_descriptor(name=project_name, metric_descriptor={
                "type": "custom.googleapis.com/d", "metric_kind": "DELTA",
                "value_type": "DOUBLE"})
        with pytest.raises(exceptions.InvalidArgument, match="not a user-defined metric type"):
            client.create_metric_descriptor(name=project_name, metric_descriptor={
                "type": "compute.googleapis.com/x", "metric_kind": "GAUGE",
                "value_type": "DOUBLE"})
        client.create_time_series(name=project_name, time_series=[
            series(mine, now - 10), series(mine, now - 10, resource_type="global", resource={})])
        later = list(client.list_time_series(request={
            "name": project_name, "filter": f'metric.type = "{mine}"', "interval": interval}))
        assert sorted(len(ts.points) for ts in later) == [1, 2]  # a later point lands
        by_type = client.list_time_series(request={
            "name": project_name, "filter": f'metric.type = "{mine}"', "interval": interval,
            "aggregation": monitoring_v3.Aggregation({
                "alignment_period": {"seconds": 1200},
                "per_series_aligner": monitoring_v3.Aggregation.Aligner.ALIGN_MEAN,
                "cross_series_reducer": monitoring_v3.Aggregation.Reducer.REDUCE_COUNT,
                "group_by_fields": ["resource.type"]})})
        assert sorted(ts.resource.type for ts in by_type) == ["gce_instance", "global"]
