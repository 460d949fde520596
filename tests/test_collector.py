"""The local collector with real OTLP over gRPC: exact storage, bad input, restarts, many clients."""

import contextlib
import datetime as dt
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from google.api_core import exceptions as gexc
from google.api_core.exceptions import ResourceExhausted
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from distrl.otel import explore
from distrl.otel.collector import CollectorServer, LocalCollector, main
from distrl.otel.limits import Limits, MiB
from distrl.otel.store import CollectorStore

PREFIX = "prometheus.googleapis.com/"


def kv(key, **value):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**value))


ALL_TYPES = [
    kv("s", string_value="text"), kv("b", bool_value=True), kv("i", int_value=-7),
    kv("d", double_value=2.5), kv("bytes", bytes_value=b"\x00\x01"),
    kv("arr", array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue(int_value=1),
                                                        common_pb2.AnyValue(string_value="x")])),
    kv("map", kvlist_value=common_pb2.KeyValueList(values=[kv("k", double_value=0.5)])),
    kv("rl.loop", string_value="actor"),
]


def request(*metrics, resource=None):
    resource = resource or [kv("service.name", string_value="svc")]
    return metrics_service_pb2.ExportMetricsServiceRequest(resource_metrics=[
        metrics_pb2.ResourceMetrics(
            resource={"attributes": list(resource)},
            scope_metrics=[metrics_pb2.ScopeMetrics(scope={"name": "test"},
                                                    metrics=list(metrics))])])


def number(t, value, attrs=(), start=1):
    point = metrics_pb2.NumberDataPoint(start_time_unix_nano=start, time_unix_nano=t,
                                        attributes=list(attrs))
    if isinstance(value, int):
        point.as_int = value
    else:
        point.as_double = value
    return point


@pytest.fixture
def collector(tmp_path):
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as c:
        yield c


@pytest.fixture
def stub(collector):
    channel = grpc.insecure_channel(f"127.0.0.1:{collector.port}")
    yield metrics_service_pb2_grpc.MetricsServiceStub(channel)
    channel.close()


def test_every_kind_and_value_type_is_stored_exactly(collector, stub):
    gauge = metrics_pb2.Metric(name="rl.train.loss", unit="1", description="loss",
                               gauge={"data_points": [number(10, 0.25, ALL_TYPES)]})
    counter = metrics_pb2.Metric(name="rl.sample.samples", sum={
        "is_monotonic": True, "aggregation_temporality": 2,
        "data_points": [number(10, 1024), number(20, 2**62)]})
    updown = metrics_pb2.Metric(name="queue.depth", sum={
        "is_monotonic": False, "aggregation_temporality": 1, "data_points": [number(10, -3)]})
    histogram = metrics_pb2.Metric(name="rl.loop.duration", unit="ms", histogram={
        "aggregation_temporality": 1, "data_points": [metrics_pb2.HistogramDataPoint(
            start_time_unix_nano=1, time_unix_nano=10, count=6, sum=61.5, min=0.5, max=40.0,
            explicit_bounds=[1.0, 10.0], bucket_counts=[2, 3, 1])]})
    exponential = metrics_pb2.Metric(name="rl.step.duration", exponential_histogram={
        "aggregation_temporality": 2, "data_points": [metrics_pb2.ExponentialHistogramDataPoint(
            time_unix_nano=10, count=5, sum=9.0, scale=2, zero_count=1,
            positive={"offset": 3, "bucket_counts": [1, 2]},
            negative={"offset": -1, "bucket_counts": [1]})]})
    response = stub.Export(request(gauge, counter, updown, histogram, exponential))
    assert not response.HasField("partial_success") or not response.partial_success.rejected_data_points

    store = collector.store()
    types = {m["metric_type"]: m for m in store.metric_types()}
    assert set(types) == {PREFIX + "rl.train.loss/gauge", PREFIX + "rl.sample.samples/counter",
                          PREFIX + "queue.depth/gauge", PREFIX + "rl.loop.duration/histogram",
                          PREFIX + "rl.step.duration/histogram"}
    assert types[PREFIX + "rl.sample.samples/counter"]["metric_kind"] == "CUMULATIVE"
    assert types[PREFIX + "rl.loop.duration/histogram"]["value_type"] == "DISTRIBUTION"
    assert types[PREFIX + "rl.train.loss/gauge"]["unit"] == "1"

    [loss] = store.points(PREFIX + "rl.train.loss/gauge")
    assert loss["value"] == 0.25 and loss["temporality"] == 0
    assert loss["attributes"] == {"s": "text", "b": True, "i": -7, "d": 2.5, "bytes": "AAE=",
                                  "arr": [1, "x"], "map": {"k": 0.5}, "rl.loop": "actor"}
    assert loss["resource"] == {"service.name": "svc"}
    samples = store.points(PREFIX + "rl.sample.samples/counter")
    assert [p["int_value"] for p in samples] == [1024, 2**62]  # exact beyond float precision
    assert samples[0]["temporality"] == 2
    [depth] = store.points(PREFIX + "queue.depth/gauge")
    assert depth["int_value"] == -3 and depth["temporality"] == 1
    [hist] = store.points(PREFIX + "rl.loop.duration/histogram")
    assert (hist["count"], hist["sum"], hist["min"], hist["max"]) == (6, 61.5, 0.5, 40.0)
    assert hist["bounds"] == [1.0, 10.0] and hist["bucket_counts"] == [2, 3, 1]
    assert hist["temporality"] == 1
    [exp] = store.points(PREFIX + "rl.step.duration/histogram")
    assert exp["count"] == 5 and exp["exponential"] == {
        "scale": 2, "zero_count": 1, "zero_threshold": 0.0,
        "positive": {"offset": 3, "counts": [1, 2]}, "negative": {"offset": -1, "counts": [1]}}


def test_a_retried_export_is_stored_once(collector, stub):
    counter = metrics_pb2.Metric(name="c", sum={"is_monotonic": True,
                                               "aggregation_temporality": 2,
                                               "data_points": [number(10, 5)]})
    stub.Export(request(counter))
    stub.Export(request(counter))
    assert len(collector.store().points(PREFIX + "c/counter")) == 1


def test_bad_points_are_rejected_and_the_rest_kept(collector, stub):
    bad = metrics_pb2.Metric(name="h", histogram={"aggregation_temporality": 2, "data_points": [
        metrics_pb2.HistogramDataPoint(time_unix_nano=10, count=3, explicit_bounds=[1.0],
                                       bucket_counts=[1, 1, 1])]})
    good = metrics_pb2.Metric(name="g", gauge={"data_points": [number(10, 1.5)]})
    response = stub.Export(request(bad, good))
    assert response.partial_success.rejected_data_points == 1
    assert "3 bucket counts for 1 bounds" in response.partial_success.error_message
    assert collector.store().points(PREFIX + "g/gauge")[0]["value"] == 1.5
    assert collector.store().points(PREFIX + "h/histogram") == []


def test_garbage_gets_an_error_status_and_the_collector_keeps_serving(collector, stub):
    channel = grpc.insecure_channel(f"127.0.0.1:{collector.port}")
    raw = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                              request_serializer=lambda b: b, response_deserializer=lambda b: b)
    for garbage in [b"\xff\xff\xff\xff", b"\x0a\x05\x01"]:
        with pytest.raises(grpc.RpcError) as err:
            raw(garbage, timeout=5)
        assert err.value.code() in {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT,
                                    grpc.StatusCode.UNKNOWN}
    unknown = channel.unary_unary("/no.such.Service/Export", request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as err:
        unknown(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    channel.close()
    stub.Export(request(metrics_pb2.Metric(name="after", gauge={"data_points": [number(1, 1.0)]})))
    assert collector.running
    assert collector.store().points(PREFIX + "after/gauge")


def test_bad_ports_are_refused(tmp_path):
    for port in (-1, 70000, "4317", True):
        with pytest.raises(ValueError, match=f"port={port!r} is invalid"):
            LocalCollector(tmp_path / "a.db", token_file=None, port=port)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            LocalCollector(tmp_path / "b.db", token_file=None, port=port).start()
        with pytest.raises(OSError, match="cannot listen"):
            CollectorServer(tmp_path / "c.db", port=port).start()
        assert main(["--db", str(tmp_path / "d.db"), "--port", str(port)]) == 2
    finally:
        busy.close()
    with pytest.raises(FileNotFoundError, match="no collector database"):
        CollectorStore(tmp_path / "missing.db")


EXPORTER = textwrap.dedent("""
    import sys, time
    from distrl.otel.conventions import setup_telemetry
    endpoint, name, total, hist = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tel = setup_telemetry(service_name=name, endpoint=endpoint, export_interval_ms=100)
    counter = tel.meter.create_counter("work.done")
    histogram = tel.meter.create_histogram("work.latency", unit="ms")
    for i in range(total):
        counter.add(1, {"worker": name})
    for i in range(hist):
        histogram.record(float(i), {"worker": name})
    time.sleep(0.3)  # a few periodic exports of the same cumulative values
    tel.shutdown()
""")


def test_twenty_processes_at_once_nothing_lost_nothing_twice(collector):
    procs = [subprocess.Popen([sys.executable, "-c", EXPORTER, collector.endpoint, f"w{i}",
                               str(100 + i), str(10 + i)]) for i in range(20)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 20
    store = collector.store()
    # Cumulative temporality: the newest point of each series is its total.
    last = {}
    for p in store.points(PREFIX + "work.done/counter"):
        last[p["resource"]["service.instance.id"]] = p
    assert len(last) == 20
    assert sum(p["int_value"] for p in last.values()) == sum(100 + i for i in range(20))
    assert sorted(p["attributes"]["worker"] for p in last.values()) == sorted(f"w{i}" for i in range(20))
    hist_last = {}
    for p in store.points(PREFIX + "work.latency/histogram"):
        hist_last[p["resource"]["service.instance.id"]] = p
    assert sum(p["count"] for p in hist_last.values()) == sum(10 + i for i in range(20))
    assert all(sum(p["bucket_counts"]) == p["count"] for p in hist_last.values())


def test_later_exports_land_after_a_collector_restart(tmp_path):
    """An exporter keeps exporting through a collector's restart on the same port: what it
    set before the stop and after the restart is stored, up to its last value. The exporter
    runs until the restarted collector has its points (gRPC's reconnect backoff after the
    stop lasts seconds, longer on a busy machine), so the test never races it."""
    db, stop = tmp_path / "otel.db", tmp_path / "stop"
    script = textwrap.dedent("""
        import os, sys, time
        from distrl.otel.conventions import setup_telemetry
        tel = setup_telemetry(endpoint=sys.argv[1], export_interval_ms=200, export_timeout_s=2)
        gauge = tel.meter.create_gauge("phase")
        phase = 0
        while not os.path.exists(sys.argv[2]):
            gauge.set(phase)
            print(phase, flush=True)
            time.sleep(0.25)  # a phase spans export intervals
            phase += 1
        tel.shutdown()
        print("last", phase - 1, flush=True)
    """)
    first = LocalCollector(db, token_file=None, port=0).start()
    port = first.port
    proc = subprocess.Popen([sys.executable, "-c", script, first.endpoint, str(stop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def reach(phase: int) -> None:
        """Read the exporter's output until it has set `phase`."""
        while (line := proc.stdout.readline()) and int(line) < phase:
            pass
        assert line, f"the exporter ended before phase {phase}: {proc.stderr.read()[-2000:]}"

    second = None
    try:
        reach(4)
        first.stop()          # the collector goes away mid-run (after exports of phases 0-4) ...
        reach(8)              # ... for several export intervals (0.2 s) that fail ...
        second = LocalCollector(db, token_file=None, port=port).start()  # ... and comes back on the same port
        store = second.store()
        deadline = dt.datetime.now() + dt.timedelta(seconds=120)
        while not store.query("SELECT 1 FROM points WHERE value > 8 LIMIT 1"):
            assert dt.datetime.now() < deadline, "no export landed after the restart in 120 s"
            threading.Event().wait(0.2)
        stop.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        last = int(out.splitlines()[-1].split()[1])
        values = [p["value"] for p in store.points(PREFIX + "phase/gauge")]
    finally:
        stop.touch()
        if proc.poll() is None:
            proc.kill()
        if second is not None:
            second.stop()
    assert min(values) <= 2 and max(values) == last  # before the restart and up to the end


SIGNAL_STORM = """
import os, signal, threading, time
from {module} import {name} as Flag

flag, waits = Flag(), [0]
signal.signal(signal.SIGUSR1, lambda *_: flag.set())  # as the collector's SIGTERM handler


def storm():  # a signal every 2 ms while the main thread makes progress, landing anywhere in
    # its wait; none once it stops (a handler stuck on a lock would be interrupted again)
    last, since = -1, time.monotonic()
    while True:
        time.sleep(0.002)
        if waits[0] != last:
            last, since = waits[0], time.monotonic()
            os.kill(os.getpid(), signal.SIGUSR1)
        elif time.monotonic() - since > 5:  # no wait in 5 s: stuck in the handler
            print("deadlocked after", waits[0], "waits", flush=True)
            os._exit(3)


threading.Thread(target=storm, daemon=True).start()
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    flag.wait(0.001)
    waits[0] += 1
print("no deadlock in", waits[0], "waits", flush=True)
"""


@pytest.mark.parametrize("flag", ["distrl.otel.collector.StopFlag", "threading.Event"])
def test_the_collectors_stop_flag_takes_signals_while_its_main_thread_waits(flag):
    """`distrl collector` stopped on a threading.Event set by its SIGTERM handler: a signal that
    came while the main thread held the Event's lock inside wait() deadlocked the handler, and
    the collector never stopped (a clean room beside two busy loops: SIGTERM right after the
    "listening" line). A signal every 2 ms while the main thread waits: the collector's flag
    takes them all for 6 s; an Event in its place, the control, deadlocks."""
    module, name = flag.rsplit(".", 1)
    run = subprocess.run([sys.executable, "-c", SIGNAL_STORM.format(
        module=module, name=name, seconds=6 if name == "StopFlag" else 60)],
        capture_output=True, text=True, timeout=120)
    if name == "StopFlag":
        assert run.returncode == 0 and "no deadlock" in run.stdout, run.stdout + run.stderr[-2000:]
    else:
        assert run.returncode == 3 and "deadlocked" in run.stdout, run.stdout + run.stderr[-2000:]


def test_collector_cli_serves_until_terminated(tmp_path):
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "distrl.cli", "collector", "--db",
                             str(tmp_path / "cli.db"), "--port", "0"], stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    assert "collector listening on http://127.0.0.1:" in line
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert "collector stopped" in proc.stdout.read()
    assert json.loads(json.dumps(CollectorStore(tmp_path / "cli.db").metric_types())) == []


def test_points_are_filtered_by_attribute_values_in_sql(collector, stub):
    gauge = metrics_pb2.Metric(name="g", gauge={"data_points": [
        number(10, 1.0, ALL_TYPES), number(11, 2.0, [kv("rl.loop", string_value="learner")])]})
    stub.Export(request(gauge))
    store = collector.store()
    points = PREFIX + "g/gauge"
    assert [p["value"] for p in store.points(points, {"rl.loop": "actor"})] == [1.0]
    assert [p["value"] for p in store.points(points, {"rl.loop": "learner"})] == [2.0]
    assert [p["value"] for p in store.points(points, {"b": True, "i": -7, "d": 2.5})] == [1.0]
    assert [p["value"] for p in store.points(points, {"s": None})] == [2.0]  # absent
    assert store.points(points, {"rl.loop": "replay"}) == []
    for bad in ({"arr": [1, "x"]}, {'we"ird': 1}):
        with pytest.raises(ValueError, match="where=.* is invalid"):
            store.points(points, bad)


# --- OTLP/HTTP ------------------------------------------------------------------------------

def _post(url: str, body: bytes, content_type: str = "application/x-protobuf",
          length: str | None = None) -> tuple[int, bytes]:
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.putrequest("POST", parts.path)
    conn.putheader("Content-Type", content_type)
    if length != "omit":
        conn.putheader("Content-Length", length or str(len(body)))
    conn.endheaders()
    if length in (None, str(len(body))):
        conn.send(body)
    response = conn.getresponse()
    status, data = response.status, response.read()
    conn.close()
    return status, data


def test_otlp_http_stores_what_grpc_stores_and_answers_partial_success(tmp_path):
    """What GKE's managed collector documents (OTLP/HTTP, protobuf, port 4318), on this store."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, http_port=0) as c:
        assert c.http_endpoint.startswith("http://127.0.0.1:") and c.http_port != c.port
        bad = metrics_pb2.Metric(name="h", histogram={"aggregation_temporality": 2,
                                                      "data_points": [
            metrics_pb2.HistogramDataPoint(time_unix_nano=10, count=3, explicit_bounds=[1.0],
                                           bucket_counts=[1, 1, 1])]})
        good = metrics_pb2.Metric(name="g", gauge={"data_points": [number(10, 1.5)]})
        status, body = _post(f"{c.http_endpoint}/v1/metrics",
                             request(bad, good).SerializeToString())
        assert status == 200
        response = metrics_service_pb2.ExportMetricsServiceResponse.FromString(body)
        assert response.partial_success.rejected_data_points == 1
        assert c.store().points(PREFIX + "g/gauge")[0]["value"] == 1.5
        # Bad requests: each answered with its status; nothing stored, the receiver serves on.
        for url, payload, kind, length, want in [
                ("/v1/metrics", b"\xff\xff\xff\xff", "application/x-protobuf", None, 400),
                ("/v1/metrics", b"{}", "application/json", None, 415),
                ("/v1/logs", b"", "application/x-protobuf", None, 404),
                ("/v1/metrics", b"", "application/x-protobuf", "omit", 411),
                ("/v1/traces", b"", "application/x-protobuf", str(65 * 2 ** 20), 413)]:
            assert _post(c.http_endpoint + url, payload, kind, length)[0] == want, url
        status, _ = _post(f"{c.http_endpoint}/v1/metrics", request(metrics_pb2.Metric(
            name="after", gauge={"data_points": [number(1, 2.0)]})).SerializeToString())
        assert status == 200 and c.store().points(PREFIX + "after/gauge")


def test_the_sdk_exports_over_http_when_the_protocol_says_so(tmp_path, monkeypatch):
    from distrl.otel.conventions import setup_telemetry

    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, http_port=0) as c:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.http_endpoint)  # as the pods set it
        tel = setup_telemetry("http-test", export_interval_ms=60_000)
        tel.meter.create_counter("rl.test.count").add(3)
        with tel.tracer.start_as_current_span("one"):
            pass
        tel.shutdown()
        points = c.store().points(PREFIX + "rl.test.count/counter")
        assert [p["value"] for p in points] == [3.0]
        assert [s["name"] for s in c.store().spans()] == ["one"]
    with pytest.raises(ValueError, match="protocol='http/json'"):
        setup_telemetry("x", protocol="http/json")


# --- hostile input (issue 13) ---------------------------------------------------------------

def test_non_finite_values_and_out_of_range_counts_are_refused_per_point(collector, stub):
    """A NaN gauge used to be stored as NULL and break every read of its metric; a count above
    2^63-1 failed the request half-way. Each is refused alone, named, and the rest is stored."""
    nan = metrics_pb2.Metric(name="g", gauge={"data_points": [number(10, float("nan")),
                                                              number(11, 2.0)]})
    inf_sum = metrics_pb2.Metric(name="s", sum={"aggregation_temporality": 2, "data_points": [
        number(10, float("inf"))]})
    huge = metrics_pb2.Metric(name="h", histogram={"aggregation_temporality": 2, "data_points": [
        metrics_pb2.HistogramDataPoint(time_unix_nano=10, count=2 ** 63, explicit_bounds=[1.0],
                                       bucket_counts=[2 ** 63, 0])]})
    nan_bounds = metrics_pb2.Metric(name="b", histogram={"aggregation_temporality": 2,
                                                         "data_points": [
        metrics_pb2.HistogramDataPoint(time_unix_nano=10, count=0,
                                       explicit_bounds=[1.0, float("nan"), 0.0],
                                       bucket_counts=[0, 0, 0, 0])]})
    scale = metrics_pb2.Metric(name="e", exponential_histogram={
        "aggregation_temporality": 2, "data_points": [
            metrics_pb2.ExponentialHistogramDataPoint(time_unix_nano=10, scale=-2000)]})
    far = metrics_pb2.Metric(name="t", gauge={"data_points": [number(2 ** 63, 1.0)]})
    response = stub.Export(request(nan, inf_sum, huge, nan_bounds, scale, far))
    assert response.partial_success.rejected_data_points == 6
    assert response.partial_success.error_message.startswith(
        "'g' point 0 (time_unix_nano=10): value=nan is not a finite")
    assert len(response.partial_success.error_message) < 300
    assert [p["value"] for p in collector.store().points(PREFIX + "g/gauge")] == [2.0]
    from distrl.otel import explore

    mon = explore.Monitoring(endpoint=collector.endpoint)  # every read of the metric works
    epoch = dt.datetime(1970, 1, 1, 0, 1, tzinfo=dt.UTC)  # the points are at 10 and 11 ns
    assert list(mon.time_series(PREFIX + "g/gauge", end=epoch, minutes=5)["value"]) == [2.0]
    for bad in (huge, nan_bounds, scale):
        response = stub.Export(request(bad))
        assert response.partial_success.rejected_data_points == 1, bad.name
    messages = [stub.Export(request(m)).partial_success.error_message
                for m in (huge, nan_bounds, scale, far)]
    assert messages == [
        "'h' point 0 (time_unix_nano=10): count=9223372036854775808 is outside [0, 2^63-1]",
        "'b' point 0 (time_unix_nano=10): bound=nan is not a finite number",
        "'e' point 0 (time_unix_nano=10): exponential histogram scale -2000 is outside [-10, 20]",
        "'t' point 0 (time_unix_nano=9223372036854775808): time_unix_nano=9223372036854775808 "
        "is above 2^63-1"]
    # A client's megabyte of name, or of bounds, comes back as a few hundred characters.
    name = metrics_pb2.Metric(name="n" * 1_000_000, gauge={"data_points": [number(10, 1.0)]})
    message = stub.Export(request(name)).partial_success.error_message
    assert message.startswith("metric name 'nnnn") and "1,000,000 characters" in message
    assert len(message) <= 300
    long = metrics_pb2.Metric(name="n" * 255, histogram={
        "aggregation_temporality": 2, "data_points": [metrics_pb2.HistogramDataPoint(
            time_unix_nano=10, count=0, explicit_bounds=[float(-i) for i in range(900)],
            bucket_counts=[0] * 901)]})
    message = stub.Export(request(long)).partial_success.error_message
    assert message.startswith("'nnnn") and "not strictly increasing" in message
    assert len(message) <= 300


def test_spans_without_ids_are_refused_not_stored_over_each_other(collector):
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
    from opentelemetry.proto.trace.v1 import trace_pb2

    def span(name, trace_id=b"\x01" * 16, span_id=b"\x02" * 8):
        return trace_pb2.Span(name=name, trace_id=trace_id, span_id=span_id,
                              start_time_unix_nano=1, end_time_unix_nano=2)

    spans = [span("ok"), span("no trace", trace_id=b""), span("no span", span_id=b""),
             span("zero", trace_id=b"\x00" * 16)]
    channel = grpc.insecure_channel(f"127.0.0.1:{collector.port}")
    response = trace_service_pb2_grpc.TraceServiceStub(channel).Export(
        trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(
            scope_spans=[trace_pb2.ScopeSpans(spans=spans)])]))
    channel.close()
    assert response.partial_success.rejected_spans == 3
    assert "no trace" in response.partial_success.error_message
    assert [s["name"] for s in collector.store().spans()] == ["ok"]


def test_a_request_that_fails_half_way_stores_nothing(tmp_path):
    """One savepoint per request: rows written before the failure are rolled back with it."""
    store = CollectorStore(tmp_path / "otel.db", create=True)
    try:
        good = metrics_pb2.Metric(name="first", gauge={"data_points": [number(10, 1.0)]})
        req = request(good)
        original = store._metric_rows

        def fail_after_first(metric, *args):
            if metric.name == "second":
                raise RuntimeError("storage broke half-way")
            return original(metric, *args)

        store._metric_rows = fail_after_first
        req.resource_metrics[0].scope_metrics[0].metrics.append(
            metrics_pb2.Metric(name="second", gauge={"data_points": [number(10, 2.0)]}))
        with pytest.raises(RuntimeError, match="half-way"):
            store.write_metrics(req)
        store._metric_rows = original
        assert store.points(PREFIX + "first/gauge") == []
        assert store.write_metrics(request(good))[0] == 1  # the next request is stored
        assert len(store.points(PREFIX + "first/gauge")) == 1
    finally:
        store.close()


def test_a_where_key_cannot_reach_into_sql(collector, stub):
    stub.Export(request(metrics_pb2.Metric(name="g", gauge={"data_points": [
        number(10, 1.0, attrs=[kv("k'x", string_value="v")])]})))
    store = collector.store()
    sneaky = "x') IS NULL UNION SELECT name, 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1 FROM sqlite_master --"
    rows = store.points(PREFIX + "g/gauge", where={sneaky: "v"})
    assert rows == []  # no table names leaked: the key is a bound value, matched as a key
    assert len(store.points(PREFIX + "g/gauge", where={"k'x": "v"})) == 1
    with pytest.raises(ValueError, match="attribute keys without double quotes"):
        store.points(PREFIX + "g/gauge", where={'a"b': 1})


def test_the_database_is_readable_by_its_owner_only(collector, stub):
    stub.Export(request(metrics_pb2.Metric(name="g", gauge={"data_points": [number(1, 1.0)]})))
    for path in collector.db_path.parent.glob(collector.db_path.name + "*"):
        assert path.stat().st_mode & 0o077 == 0, path


def _gauges(name: str, n: int, t: int = 10):
    return request(metrics_pb2.Metric(name=name, gauge={"data_points": [
        number(t, float(i), attrs=[kv("i", int_value=i)]) for i in range(n)]}))


def _export_with_retries(endpoint: str, req, attempts: int = 60) -> str:
    """What an OTel exporter does: RESOURCE_EXHAUSTED and UNAVAILABLE are retried."""
    channel = grpc.insecure_channel(endpoint, options=[("grpc.max_send_message_length", 2**28)])
    try:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        for attempt in range(attempts):
            try:
                stub.Export(req, timeout=60)
                return "OK"
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                      grpc.StatusCode.UNAVAILABLE) or attempt == attempts - 1:
                    return err.code().name
                threading.Event().wait(0.2 * (attempt + 1))
        return "gave up"
    finally:
        channel.close()


@pytest.mark.slow
def test_memory_is_bounded_by_the_limits_it_prints(tmp_path):
    """Four concurrent 40 MB exports once left 623 MB resident. Now a message is at most
    max_message_bytes, and at most max_exports are read at once (more get RESOURCE_EXHAUSTED,
    which exporters retry): eight concurrent exports near the limit all land, within bound."""
    limits = Limits(max_message_bytes=2 * MiB, max_exports=2, max_queries=1)
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=limits) as collector:
        endpoint = collector.endpoint.removeprefix("http://")
        process = psutil.Process(collector.process.pid)
        before = process.memory_info().rss
        too_big = _gauges("big", 60_000)
        assert too_big.ByteSize() > 2 * MiB
        assert _export_with_retries(endpoint, too_big, attempts=1) == "RESOURCE_EXHAUSTED"
        near = [_gauges(f"near{k}", 45_000) for k in range(8)]
        assert all(1.5 * MiB < r.ByteSize() <= 2 * MiB for r in near)
        with futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda r: _export_with_retries(endpoint, r), near))
        assert codes == ["OK"] * 8
        grown = process.memory_info().rss - before
        bound = limits.memory_bound_bytes()
        assert grown < bound, f"RSS grew {grown / MiB:.0f} MiB; bound {bound / MiB:.0f} MiB"
        store = collector.store()
        assert [store.query("SELECT COUNT(*) AS n FROM points WHERE metric_type = ?",
                            (f"{PREFIX}near{k}/gauge",))[0]["n"] for k in range(8)] == [45_000] * 8
        assert store.points(PREFIX + "big/gauge") == []


def _tree_rss(process: psutil.Process) -> int:
    """The resident memory of a collector and its reader processes."""
    total = 0
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


class TreePeak:
    """Inside the block, the resident memory of a collector and its reader processes sampled
    every 10 ms; `grown`: its peak above where it started."""

    def __init__(self, process: psutil.Process):
        self.process, self.done = process, threading.Event()

    def __enter__(self):
        self.before = self.peak = _tree_rss(self.process)
        self.sampler = threading.Thread(target=self._sample)
        self.sampler.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.01):
            self.peak = max(self.peak, _tree_rss(self.process))

    def __exit__(self, *exc):
        self.done.set()
        self.sampler.join()

    @property
    def grown(self) -> int:
        return self.peak - self.before


def _warm_readers(endpoint: str, n: int) -> None:
    """n reads at once, so that n reader processes have started (their imports are the
    baseline, not what a read holds): the first page of one descriptor each (a pager walks
    them all, a page a call)."""
    client = explore.Monitoring(endpoint=endpoint).client
    with futures.ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda _: next(iter(client.list_metric_descriptors(
            request={"name": "projects/local", "page_size": 1}, timeout=120).pages)), range(n)))


def _wide(name: str, series: range, t: int = 10):
    return request(metrics_pb2.Metric(name=name, gauge={"data_points": [
        number(t, 1.0, attrs=[kv("series", string_value=f"series-{i:06d}")]) for i in series]}))


@pytest.mark.slow
def test_reads_hold_no_more_memory_than_the_limits_print(tmp_path):
    """One ListTimeSeries over 1 M series held 1.47 GB, two ListMetricDescriptors over 1 M
    names 1.37 GB, against a printed bound of 592 MiB. Each read now holds at most
    max_read_bytes (refused with RESOURCE_EXHAUSTED past it) and descriptors are streamed a
    page at a time: two reads near the limit, two past it and two descriptor listings at once
    grow the collector by less than max_queries x max_read_bytes."""
    limits = Limits(max_queries=2, max_read_bytes=32 * MiB, page_cache_bytes=MiB)
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=limits) as collector:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
        for lo in range(0, 40_000, 5_000):
            stub.Export(_wide("wide", range(lo, lo + 5_000)), timeout=60)
        for lo in range(0, 10_000, 5_000):
            stub.Export(_wide("near", range(lo, lo + 5_000)), timeout=60)
        for lo in range(0, 4_000, 1_000):
            stub.Export(request(*[metrics_pb2.Metric(name=f"named.{i:05d}", gauge={
                "data_points": [number(10, 1.0)]}) for i in range(lo, lo + 1_000)]), timeout=60)
        process = psutil.Process(collector.process.pid)
        _warm_readers(collector.endpoint, limits.max_queries)
        threading.Event().wait(1.0)
        client = explore.Monitoring(endpoint=collector.endpoint).client

        def read(metric: str):
            for _ in range(120):  # a turn is retried, as a client retries it
                try:
                    if metric == "descriptors":
                        return len(list(client.list_metric_descriptors(
                            request={"name": "projects/local"}, timeout=120)))
                    return len(list(client.list_time_series(request={
                        "name": "projects/local",
                        "filter": f'metric.type = "{PREFIX}{metric}/gauge"',
                        "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 100}}},
                        timeout=120)))
                except ResourceExhausted as err:
                    if "queries are running" not in str(err):
                        return str(err)
                    threading.Event().wait(0.25)
            return "no turn in 120 tries"

        with TreePeak(process) as memory, futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(read, ["near", "wide", "near", "wide", "descriptors",
                                           "descriptors"]))
        grown = memory.grown
        assert answers[0] == answers[2] == 10_000, answers
        assert all("would hold more than 32 MiB" in a for a in (answers[1], answers[3])), answers
        assert answers[4] == answers[5] == 4_002, answers  # named.*, wide and near
        held = limits.max_queries * limits.max_read_bytes
        print(f"reads grew the collector by {grown / MiB:.0f} MiB; the limit {held / MiB:.0f} MiB")
        assert grown < held, f"reads grew the collector by {grown / MiB:.0f} MiB"


# Every limit away from its default, so a limit that does not reach the collector shows.
ODD_LIMITS = Limits(max_message_bytes=3 * MiB + 1, max_exports=3, max_queries=1,
                    cache_bytes=5 * MiB, page_cache_bytes=1, max_rows_scanned=10,
                    max_read_bytes=30 * MiB, max_metric_types=40, max_series_periods=20,
                    max_query_s=7.5, max_wal_bytes=9 * MiB)


def test_every_limit_is_an_option_of_the_collector_command():
    import argparse
    import dataclasses

    from distrl.otel.limits import add_limit_options, limit_argv, limits_from

    assert all(getattr(ODD_LIMITS, f.name) != getattr(Limits(), f.name)
               for f in dataclasses.fields(Limits))
    parser = argparse.ArgumentParser()
    add_limit_options(parser)
    assert limits_from(parser.parse_args(limit_argv(ODD_LIMITS))) == ODD_LIMITS
    assert limits_from(parser.parse_args([])) == Limits()
    with pytest.raises(ValueError, match=r"page_cache_bytes=-1048576 \(-1 MiB\) is invalid"):
        limits_from(parser.parse_args(["--page-cache-mib", "-1"]))
    # gRPC takes a message size as a 32-bit integer: this was an OverflowError traceback.
    with pytest.raises(ValueError, match=r"max_message_bytes=104857600000 \(100000 MiB\) is "
                                         r"invalid: expected 1 byte to 2048 MiB"):
        limits_from(parser.parse_args(["--max-message-mib", "100000"]))
    with pytest.raises(ValueError, match="max_exports=100000 is invalid: expected an integer "
                                         "from 1 to 256"):
        limits_from(parser.parse_args(["--max-exports", "100000"]))


def test_a_local_collector_runs_with_every_limit_it_was_given(tmp_path):
    """LocalCollector handed its child three of its eight limits: a page cache or a read
    ceiling set here was the default there. Its child now prints and keeps them all."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=ODD_LIMITS) as collector:
        assert collector.banner.endswith(ODD_LIMITS.describe()), collector.banner
        assert _export_with_retries(collector.endpoint.removeprefix("http://"),
                                    _gauges("many", 20)) == "OK"
        mon = explore.Monitoring(endpoint=collector.endpoint)
        with pytest.raises(ResourceExhausted, match="reads more than 10 points"):
            list(mon.client.list_time_series(request={
                "name": mon.project_name, "filter": f'metric.type = "{PREFIX}many/gauge"',
                "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 100}}},
                timeout=30))


def test_remote_listening_needs_an_explicit_option_and_honours_a_bearer_token(
        tmp_path, capsys, monkeypatch):
    with pytest.raises(ValueError, match="host='0.0.0.0' is not a loopback address"):
        CollectorServer(tmp_path / "a.db", host="0.0.0.0", port=0)
    with pytest.raises(ValueError, match="token_file=.* must hold one token"):
        (tmp_path / "short").write_text("abc\n")
        (tmp_path / "short").chmod(0o600)
        CollectorServer(tmp_path / "a.db", port=0, token_file=tmp_path / "short")
    token = "t0ken-" + "x" * 26
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o644)  # a secret anyone on the machine can read: refused
    with pytest.raises(ValueError, match=r"is readable by others \(mode 644\); a secret must "
                                         r"be private: chmod 600"):
        CollectorServer(tmp_path / "a.db", port=0, token_file=tmp_path / "token")
    (tmp_path / "token").chmod(0o600)
    server = CollectorServer(tmp_path / "otel.db", host="0.0.0.0", port=0, http_port=0,
                             allow_remote=True, token_file=tmp_path / "token").start()
    try:
        assert "WARNING" in capsys.readouterr().err
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(f"127.0.0.1:{server.port}"))
        gauge = request(metrics_pb2.Metric(name="g", gauge={"data_points": [number(5, 1.0)]}))
        for metadata in ([], [("authorization", "Bearer wrong")]):
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(gauge, metadata=metadata, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        body = gauge.SerializeToString()
        http = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/metrics",
                                      data=body, headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(http, timeout=10)
        assert err.value.code == 401
        assert server.store.points(PREFIX + "g/gauge") == []
        # The OTel SDK's exporter sends it from OTEL_EXPORTER_OTLP_HEADERS.
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{token}")
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(
            endpoint=f"127.0.0.1:{server.port}", insecure=True), export_interval_millis=60_000)
        provider = MeterProvider(metric_readers=[reader])
        provider.get_meter("t").create_counter("sdk.count").add(3)
        provider.shutdown()
        assert server.store.points(PREFIX + "sdk.count/counter")[0]["value"] == 3
    finally:
        server.stop()


SOAK_EXPORTERS = textwrap.dedent("""
    # Five exporter threads of one process, each exporting small requests back to back until
    # the deadline, each retried as an OTel exporter retries (RESOURCE_EXHAUSTED, UNAVAILABLE)
    # up to 20 times. Any other error is kept, not raised: a thread that died would only print
    # to a stderr nobody reads. Prints, as JSON, per exporter: the acknowledged points, exports
    # made, whether its loop ran to the deadline, and its errors; every export's latency (a
    # refused one's up to its last refusal) and the exports refused every time.
    import json, sys, threading, time, traceback
    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
    from test_collector import _gauges
    endpoint, first, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    acked, exports, finished, errors, latencies, refused = {}, {}, [], [], [], []
    def export_loop(index, stub):
        end, t = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            t += 1
            start = time.perf_counter()
            for attempt in range(20):
                try:
                    stub.Export(_gauges(f"soak{index}", 10, t=t), timeout=30)
                    acked[index] = acked.get(index, 0) + 10
                    break
                except grpc.RpcError as err:
                    if err.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                          grpc.StatusCode.UNAVAILABLE):
                        raise
                    time.sleep(0.1)
            else:
                refused.append(t)
            exports[index] = exports.get(index, 0) + 1
            latencies.append(time.perf_counter() - start)
    def run(index):
        try:
            export_loop(index, metrics_service_pb2_grpc.MetricsServiceStub(
                grpc.insecure_channel(endpoint)))
            finished.append(index)
        except BaseException:
            errors.append(f"exporter {index}: {traceback.format_exc(limit=3)}")
    threads = [threading.Thread(target=run, args=(i,)) for i in range(first, first + 5)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps({"acked": acked, "exports": exports, "finished": finished,
                      "errors": errors, "latencies": latencies, "refused": len(refused)}))
""")
SOAK_P99_BOUND_S = 2.0  # measured p99 on 2 busy cores: see the stop note of issue 13


@pytest.mark.slow
def test_soak_twenty_exporters_beside_heavy_queries_lose_nothing(tmp_path):
    """20 exporters for 20 s while a client reads 20,000 series in a loop: every acknowledged
    point is stored, and export latency p99 stays under SOAK_P99_BOUND_S."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as collector:
        endpoint = collector.endpoint.removeprefix("http://")
        stub = metrics_service_pb2_grpc.MetricsServiceStub(grpc.insecure_channel(endpoint))
        for lo in range(0, 20_000, 5_000):
            stub.Export(_gauges("bulk", 5_000, t=lo + 1), timeout=60)
        client = explore.Monitoring(endpoint=collector.endpoint).client
        stop, reads, busy, read_errors = threading.Event(), [], [], []

        def read_loop():
            while not stop.is_set():
                try:
                    pages = client.list_time_series(request={
                        "name": "projects/local", "filter": f'metric.type = "{PREFIX}bulk/gauge"',
                        "interval": {"start_time": dt.datetime.fromtimestamp(0, dt.UTC),
                                     "end_time": dt.datetime.now(dt.UTC)}}, timeout=60)
                    reads.append(sum(len(s.points) for s in pages))
                except ResourceExhausted:  # the exports had every slot: ingestion goes first
                    busy.append(1)
                    stop.wait(0.1)
                except Exception as err:  # kept, so that a dead reader fails the test
                    read_errors.append(repr(err))
                    return

        process = psutil.Process(collector.process.pid)
        _warm_readers(collector.endpoint, Limits().max_queries)
        before, peak = _tree_rss(process), [0]

        def sample():
            while not stop.wait(0.05):
                peak[0] = max(peak[0], _tree_rss(process))

        sampler = threading.Thread(target=sample)
        sampler.start()
        reader = threading.Thread(target=read_loop)
        reader.start()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                           os.environ.get("PYTHONPATH", "")])}
        procs = [subprocess.Popen([sys.executable, "-c", SOAK_EXPORTERS, endpoint, str(5 * k),
                                   "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
                 for k in range(4)]
        try:
            outputs = [p.communicate(timeout=240) for p in procs]
        finally:
            stop.set()
            reader.join(timeout=120)
            sampler.join(timeout=10)
        for proc, (_, err) in zip(procs, outputs):
            assert proc.returncode == 0 and not err.strip(), err[-4000:]
        results = [json.loads(out) for out, _ in outputs]
        errors = [e for r in results for e in r["errors"]] + read_errors
        assert errors == [], "\n".join(errors)[-4000:]
        # Every exporter ran its loop to the deadline and kept exporting (a wedged one would
        # stop after its first few exports), and the reader read to the end.
        assert sorted(i for r in results for i in r["finished"]) == list(range(20))
        exports = {int(i): n for r in results for i, n in r["exports"].items()}
        assert min(exports.values()) >= 10, exports
        assert not reader.is_alive()
        assert reads and set(reads) == {20_000}  # every heavy read was whole
        grown, bound = peak[0] - before, Limits().memory_bound_bytes()
        assert grown < bound, f"the collector grew {grown / MiB:.0f} MiB; it prints {bound / MiB:.0f}"
        store = collector.store()
        for result in results:
            for index, acked in result["acked"].items():
                stored = store.query("SELECT COUNT(*) AS n FROM points WHERE metric_type = ?",
                                     (f"{PREFIX}soak{index}/gauge",))[0]["n"]
                assert stored == acked, (index, stored, acked)
        latencies = np.concatenate([r["latencies"] for r in results])  # refused ones too
        refused = sum(r["refused"] for r in results)
        p99 = float(np.percentile(latencies, 99))
        print(f"soak: {len(latencies):,} exports, {refused} refused 20 times, p50 "
              f"{np.percentile(latencies, 50) * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, "
              f"{len(reads)} whole reads of 20,000 series, {len(busy)} reads told to retry, "
              f"memory +{grown / MiB:.0f} MiB of the {bound / MiB:.0f} MiB it prints")
        assert refused == 0, f"{refused} of {len(latencies)} exports were refused 20 times"
        assert p99 < SOAK_P99_BOUND_S


# --- a collector no client can wedge (issue 41) ----------------------------------------------

METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def _code(stub, req, timeout: float = 10.0) -> str:
    try:
        stub.Export(req, timeout=timeout)
        return "OK"
    except grpc.RpcError as err:
        return err.code().name


def _count(db: Path, metric: str) -> int:
    store = CollectorStore(db)
    try:
        return store.query("SELECT COUNT(*) AS n FROM points WHERE metric_type = ?",
                           (PREFIX + metric,))[0]["n"]
    finally:
        store.close()


def test_a_full_disk_is_answered_unavailable_and_the_collector_recovers(tmp_path):
    """A commit that failed (writes past a full disk) answered one waiting export and left
    the others to hang: they held every slot, and SIGTERM no longer stopped the collector.
    Here the collector's writes fail for real past its file size limit (as on a full disk):
    every export of a failed commit gets UNAVAILABLE, which exporters retry, the first commit
    after space returns succeeds, and nothing acknowledged is lost. (While the disk is full an
    export may also get through: a log the checkpointer has copied starts again in the space
    its file already has, as it would on a full disk.)"""
    db = tmp_path / "otel.db"
    collector = LocalCollector(db, token_file=None, port=0).start()
    try:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
        process = psutil.Process(collector.process.pid)
        _, hard = process.rlimit(psutil.RLIMIT_FSIZE)
        biggest = max(p.stat().st_size for p in tmp_path.glob("otel.db*"))
        process.rlimit(psutil.RLIMIT_FSIZE, (biggest + 256 * 1024, hard))
        acked, codes = 0, []
        for t in range(1, 100):
            codes.append(_code(stub, _gauges("full", 500, t=t)))
            if codes[-1] != "OK":
                break
            acked += 500
        assert acked and codes[-1] == "UNAVAILABLE", codes
        with futures.ThreadPoolExecutor(8) as pool:  # one failed commit of many exports
            many = list(pool.map(lambda t: _code(stub, _gauges("full", 500, t=1000 + t)),
                                 range(8)))
        assert set(many) <= {"OK", "UNAVAILABLE"}, many  # each answered, none hangs
        assert "UNAVAILABLE" in many, many
        acked += 500 * many.count("OK")
        process.rlimit(psutil.RLIMIT_FSIZE, (hard, hard))  # space is back
        for t in range(2000, 2010):
            assert _code(stub, _gauges("full", 500, t=t)) == "OK"
            acked += 500
        collector.process.send_signal(15)
        assert collector.process.wait(timeout=10) == 0  # within its grace
    finally:
        collector.stop()
    assert _count(db, "full/gauge") == acked


def _on_a_small_disk(tmp_path: Path, mib: int, fillers_mib: tuple[int, ...]):
    """A collector child whose database is on a tmpfs of `mib` MiB in a mount namespace of its
    own (unshare: no mount outside it, no root needed where user namespaces are allowed), with
    filler files of fillers_mib beside it: (process, port, folder as this process sees it)."""
    import shlex

    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("this machine allows no mount namespace (unshare -rm): no small disk")
    disk = tmp_path / "disk"
    disk.mkdir()
    fill = "".join(f" && head -c {n}M /dev/zero > {disk}/filler{i}"
                   for i, n in enumerate(fillers_mib))
    child = shlex.join([sys.executable, "-m", "distrl.otel.collector", "--db",
                        str(disk / "otel.db"), "--port", "0", "--no-token", "--stop-with-parent",
                        str(os.getpid())])
    process = subprocess.Popen(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size={mib}m tmpfs {disk}{fill} && "
         f"exec {child}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    port = re.search(r"listening on http://[^:]+:(\d+)", line)
    assert port, line + process.stderr.read()
    return process, int(port.group(1)), Path(f"/proc/{process.pid}/root") / disk.relative_to("/")


@pytest.mark.slow
def test_a_full_disk_takes_exports_again_once_space_returns(tmp_path):
    """On a 64-MiB disk the write-ahead log grew to 59 MiB beside a 4.7-MiB database, and once
    the disk was full no export got through again, also after 44 MiB were freed: a log that
    fills the disk can never be copied back, since the database grows by what it copies. The
    log now starts again within a quarter of what the disk leaves it (and gives its file back
    when the disk is tight), so space is taken by data: exports go through within 5 s of space
    returning, twice, and nothing acknowledged is lost."""
    process, port, disk = _on_a_small_disk(tmp_path, 32, (20, 4))
    acked = 0
    try:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(f"127.0.0.1:{port}"))
        t = 0

        def until_full() -> int:
            nonlocal t, acked
            for oks in range(2_000):
                t += 1
                code = _code(stub, _gauges("full", 500, t=t))
                if code != "OK":
                    assert code == "UNAVAILABLE", code
                    return oks
                acked += 500
            raise AssertionError("the disk did not fill")

        until_full()
        for filler in ("filler0", "filler1"):
            (disk / filler).unlink()  # space is back
            began, code = time.monotonic(), None
            while time.monotonic() - began < 5 and code != "OK":
                t += 1
                code = _code(stub, _gauges("full", 500, t=t))
            assert code == "OK", f"no export was taken within 5 s of {filler}'s space returning"
            acked += 500
            took = until_full()
            sizes = {p.name: p.stat().st_size for p in disk.glob("otel.db*")}
            assert took > 0 and sizes["otel.db"] > sizes["otel.db-wal"], (filler, took, sizes)
        # read back through the collector: its disk goes with its mount namespace
        client = explore.Monitoring(endpoint=f"127.0.0.1:{port}").client
        stored = sum(len(ts.points) for ts in client.list_time_series(request={
            "name": "projects/local", "filter": f'metric.type = "{PREFIX}full/gauge"',
            "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 10**6}}}))
        assert stored == acked
        process.send_signal(15)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def _never(stop: threading.Event):
    stop.wait()
    yield from ()


def _stall(channel, stop: threading.Event, n: int) -> list:
    """n calls that send their headers and then nothing, until stop is set."""
    export = channel.stream_unary(METRICS_EXPORT, request_serializer=bytes,
                                  response_deserializer=bytes)
    return [export.future(_never(stop), timeout=60) for _ in range(n)]


def test_stalled_calls_hold_no_slot_for_long(collector, stub):
    """Twelve calls that sent headers and never a message held every slot for minutes: every
    export and read got RESOURCE_EXHAUSTED. A call now takes a turn only once its message has
    arrived, and one whose message does not come within MESSAGE_WAIT_S is cancelled."""
    from distrl.otel.receivers import MESSAGE_WAIT_S

    stop = threading.Event()
    # a connection of their own (a channel shares one with `stub` otherwise): a connection's
    # own calls beyond STREAMS_PER_CONNECTION wait behind its stalled ones
    channel = grpc.insecure_channel(collector.endpoint.removeprefix("http://"),
                                    options=[("grpc.use_local_subchannel_pool", 1)])
    try:
        stalled = _stall(channel, stop, 12)
        threading.Event().wait(0.5)  # they are in
        assert _code(stub, _gauges("beside", 10)) == "OK"
        mon = explore.Monitoring(endpoint=collector.endpoint)
        assert len(mon.time_series(PREFIX + "beside/gauge",
                                   end=dt.datetime(1970, 1, 1, 0, 1, tzinfo=dt.UTC))) == 10
        # Ended by the collector, not by their 60-s deadline: at their message's deadline, or
        # (UNAVAILABLE) refused as a stream past STREAMS_PER_CONNECTION, opened before the
        # client had the server's SETTINGS (RFC 9113, 5.1.2: REFUSED_STREAM; clients retry it)
        for call in stalled:
            assert call.exception(timeout=MESSAGE_WAIT_S + 10).code() in (
                grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                grpc.StatusCode.UNAVAILABLE)
        # More stalled calls than the collector has threads: others wait seconds, not minutes.
        flood = _stall(channel, stop, 40)
        threading.Event().wait(0.5)
        started = dt.datetime.now()
        assert _export_with_retries(collector.endpoint.removeprefix("http://"),
                                    _gauges("after", 10), attempts=30) == "OK"
        assert (dt.datetime.now() - started).total_seconds() < MESSAGE_WAIT_S + 10
    finally:
        stop.set()
        channel.close()
    assert all(call.done() for call in stalled + flood)


def _stalling_connections(address: str, connections: int, calls: int, stop: threading.Event,
                          ended: list) -> threading.Thread:
    """A hostile client: `connections` HTTP/2 connections, each keeping `calls` calls open that
    send their headers and never a message, each sent again as soon as the collector ends it
    (asyncio, so a stalled call costs no thread). How each call ended goes to `ended`."""
    import asyncio

    async def stall_one(export):
        while not stop.is_set():
            async def nothing():
                await asyncio.sleep(3600)
                yield b""
            try:
                await export(nothing(), timeout=60)
            except grpc.aio.AioRpcError as err:
                ended.append((err.code(), err.details()))
            await asyncio.sleep(0.01)

    async def main():
        channels = [grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(connections)]  # a subchannel pool each: one connection each
        tasks = [asyncio.ensure_future(stall_one(ch.stream_unary(
            METRICS_EXPORT, request_serializer=bytes, response_deserializer=bytes)))
            for ch in channels for _ in range(calls)]
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels:
            await ch.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    return thread


def test_three_connections_of_stalled_calls_leave_other_clients_their_calls(collector, stub):
    """Three connections each holding 32 calls that sent headers and no message (each sent
    again once the collector ended it) filled the server's call cap (74): gRPC exports 2 of 150
    accepted, reads 2 of 15. A connection now has STREAMS_PER_CONNECTION calls open at most
    (HTTP/2's limit: its others wait in the client), so other connections' calls go through."""
    from distrl.otel.receivers import MESSAGE_WAIT_S

    stop, ended = threading.Event(), []
    hostile = _stalling_connections(collector.endpoint.removeprefix("http://"), 3, 32, stop, ended)
    try:
        threading.Event().wait(1.0)  # they are in
        mon = explore.Monitoring(endpoint=collector.endpoint)
        exported, read = [], []
        began = dt.datetime.now()
        for i in range(150):  # over more than MESSAGE_WAIT_S: stalled calls end and come back
            exported.append(_code(stub, _gauges(f"beside{i % 5}", 10, t=10 + i)))
            if i % 10 == 0:
                read.append(len(mon.time_series(PREFIX + "beside0/gauge",
                                                end=dt.datetime(1970, 1, 1, 0, 5, tzinfo=dt.UTC))))
            threading.Event().wait(0.04)
        assert (dt.datetime.now() - began).total_seconds() > MESSAGE_WAIT_S
    finally:
        stop.set()
        hostile.join(30)
    assert exported.count("OK") >= 149, {c: exported.count(c) for c in set(exported)}
    assert len(read) == 15 and all(n >= 10 for n in read), read
    # The hostile calls were in: the collector ended them at their message's deadline.
    assert any(c == grpc.StatusCode.DEADLINE_EXCEEDED for c, _ in ended), ended[:5]


def test_without_the_token_a_stalled_call_is_refused_at_its_headers(tmp_path):
    token = "t0ken-" + "y" * 26
    (tmp_path / "token").write_text(token)
    (tmp_path / "token").chmod(0o600)
    server = CollectorServer(tmp_path / "otel.db", port=0,
                             token_file=tmp_path / "token").start()
    stop = threading.Event()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        stalled = _stall(channel, stop, 20)
        errors = [call.exception(timeout=2) for call in stalled]  # each refused within 2 s
        # at its headers for the token, or (UNAVAILABLE) a stream past STREAMS_PER_CONNECTION
        # opened before the client had the server's SETTINGS (RFC 9113, 5.1.2: REFUSED_STREAM)
        codes = [e.code() for e in errors]
        assert grpc.StatusCode.UNAUTHENTICATED in codes, codes
        assert all(c == grpc.StatusCode.UNAUTHENTICATED or "RST_STREAM" in e.details()
                   for c, e in zip(codes, errors)), [e.details() for e in errors]
    finally:
        stop.set()
        channel.close()
        server.stop()


def test_http_bodies_sent_a_trickle_at_a_time_hold_no_turn_for_long(tmp_path):
    """Eight bodies sent a byte at a time held every OTLP/HTTP turn: other exports got 503
    for as long as the trickle lasted, then waited 4.9 s behind them. A body now has
    MESSAGE_WAIT_S to arrive in full, and asks for a turn only once it has: an export beside
    the trickles is stored before they time out."""
    from distrl.otel.receivers import MESSAGE_WAIT_S

    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, http_port=0) as c:
        stop, answers = threading.Event(), []

        def trickle():
            with socket.create_connection(("127.0.0.1", c.http_port), timeout=30) as sock:
                sock.sendall(b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: "
                             b"application/x-protobuf\r\nContent-Length: 100000\r\n\r\n")
                try:
                    while not stop.wait(0.2):
                        sock.sendall(b"\x00")
                except OSError:  # the collector closed the connection
                    pass
                answers.append(sock.recv(100))

        threads = [threading.Thread(target=trickle) for _ in range(8)]
        for t in threads:
            t.start()
        threading.Event().wait(0.5)
        body = _gauges("http", 10).SerializeToString()
        started = dt.datetime.now()
        status = 503
        while status == 503 and (dt.datetime.now() - started).total_seconds() < 30:
            status, _ = _post(f"{c.http_endpoint}/v1/metrics", body)
        waited = (dt.datetime.now() - started).total_seconds()
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert status == 200 and waited < MESSAGE_WAIT_S, (status, waited)
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
        assert len(c.store().points(PREFIX + "http/gauge")) == 10


def test_connections_sending_their_request_heads_a_byte_at_a_time_leave_files_for_the_rest(
        tmp_path):
    """A slowloris: 1,100 OTLP/HTTP connections, each sending its request head a byte every
    few seconds, took a collector with the common limit of 1,024 open files to that limit
    (a thread and a file each, none timed out): every HTTP export timed out and every read
    failed with "Too many open files". Here at a limit of 512 open files, 600 such connections:
    the collector holds MAX_HTTP_CONNECTIONS, taking a new one in place of the one that has
    waited longest for its head, and HTTP exports, gRPC exports and reads all succeed."""
    from distrl.otel.limits import MAX_HTTP_CONNECTIONS

    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, http_port=0) as c:
        psutil.Process(c.process.pid).rlimit(psutil.RLIMIT_NOFILE, (512, 512))
        stop, slow = threading.Event(), []
        for _ in range(600):
            sock = socket.create_connection(("127.0.0.1", c.http_port), timeout=10)
            sock.sendall(b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(sock)

        def drip():  # a byte of a header, now and then, on each (under the 30-s timeout)
            while not stop.wait(2.0):
                for sock in slow:
                    with contextlib.suppress(OSError):  # one the collector closed
                        sock.sendall(b"X")

        dripper = threading.Thread(target=drip)
        dripper.start()
        try:
            threading.Event().wait(3.0)
            stub = metrics_service_pb2_grpc.MetricsServiceStub(
                grpc.insecure_channel(c.endpoint.removeprefix("http://")))
            client = explore.Monitoring(endpoint=c.endpoint).client
            for k in range(10):
                assert _post(f"{c.http_endpoint}/v1/metrics",
                             _gauges(f"http{k}", 2).SerializeToString())[0] == 200
                stub.Export(_gauges(f"grpc{k}", 2), timeout=10)
                listed = list(client.list_metric_descriptors(name="projects/local", timeout=20))
                assert len(listed) == 2 * (k + 1)
            assert len(psutil.Process(c.process.pid).net_connections()) < MAX_HTTP_CONNECTIONS + 64
        finally:
            stop.set()
            dripper.join(timeout=30)
            for sock in slow:
                sock.close()


def test_the_sdk_exports_gzip_over_http(tmp_path):
    """The OTLP spec has servers accept gzip; the SDK's gzip batches got 400 and were lost."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, http_port=0) as c:
        exporter = OTLPMetricExporter(endpoint=f"{c.http_endpoint}/v1/metrics",
                                      compression=Compression.Gzip)
        provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(
            exporter, export_interval_millis=60_000)])
        provider.get_meter("t").create_counter("gzip.count").add(5)
        provider.shutdown()
        assert [p["value"] for p in c.store().points(PREFIX + "gzip.count/counter")] == [5.0]
        import gzip
        bomb = gzip.compress(b"\x00" * (8 * MiB))  # inflates past the 4 MiB limit
        conn = __import__("http.client").client.HTTPConnection("127.0.0.1", c.http_port,
                                                               timeout=10)
        conn.request("POST", "/v1/metrics", bomb, {"Content-Type": "application/x-protobuf",
                                                   "Content-Encoding": "gzip"})
        assert conn.getresponse().status == 413
        conn.close()


def _histogram(t, bounds, counts, start=1):
    return metrics_pb2.HistogramDataPoint(start_time_unix_nano=start, time_unix_nano=t,
                                          count=sum(counts), explicit_bounds=bounds,
                                          bucket_counts=counts)


def _reads(mon, metric_type: str, aligner: str) -> list[int]:
    """How many series a raw read and an aligned read of the metric give."""
    interval = {"start_time": {"seconds": 0}, "end_time": {"seconds": 120}}
    raw = mon.client.list_time_series(request={
        "name": mon.project_name, "filter": f'metric.type = "{metric_type}"',
        "interval": interval}, timeout=30)
    aligned = mon.client.list_time_series(request={
        "name": mon.project_name, "filter": f'metric.type = "{metric_type}"',
        "interval": interval, "aggregation": {"alignment_period": {"seconds": 60},
                                              "per_series_aligner": aligner}}, timeout=30)
    return [len(list(raw)), len(list(aligned))]


def test_poison_points_are_refused_and_every_read_of_their_metric_works(collector, stub):
    """Each of these was acknowledged and then broke every read of its metric (UNKNOWN), or
    failed its whole request; each is now refused alone, named, and the rest is stored."""
    t = 30 * 10**9
    exp = metrics_pb2.Metric(name="exp", exponential_histogram={
        "aggregation_temporality": 2, "data_points": [
            metrics_pb2.ExponentialHistogramDataPoint(
                time_unix_nano=t, count=1, scale=-9, positive={"offset": 2, "bucket_counts": [1]}),
            metrics_pb2.ExponentialHistogramDataPoint(
                time_unix_nano=t + 1, count=1, scale=0,
                positive={"offset": 2000, "bucket_counts": [1]}),
            metrics_pb2.ExponentialHistogramDataPoint(
                time_unix_nano=t + 2, count=1, scale=0, positive={"offset": 3,
                                                                  "bucket_counts": [1]})]})
    summary = metrics_pb2.Metric(name="summ", summary={"data_points": [
        metrics_pb2.SummaryDataPoint(time_unix_nano=t, count=2**64 - 1, sum=1.0)]})
    gauge = metrics_pb2.Metric(name="beside", gauge={"data_points": [number(t, 1.0)]})
    changed = metrics_pb2.Metric(name="hist", histogram={"aggregation_temporality": 2,
                                                         "data_points": [
        _histogram(t, [1.0], [1, 0]), _histogram(t + 10**9, [1.0, 2.0], [1, 1, 0]),
        _histogram(t + 2 * 10**9, [1.0], [2, 1]),
        _histogram(t + 3 * 10**9, [5.0], [4, 0], start=t + 2 * 10**9 + 1)]})  # a new life
    no_counts = metrics_pb2.Metric(name="hist", histogram={"aggregation_temporality": 2,
                                                           "data_points": [
        metrics_pb2.HistogramDataPoint(start_time_unix_nano=5, time_unix_nano=t, count=0,
                                       explicit_bounds=[1.0, 2.0])]})
    response = stub.Export(request(exp, summary, gauge, changed, no_counts), timeout=10)
    assert response.partial_success.rejected_data_points == 5  # 2 + 1 + 1 + 1
    assert "exponential buckets from 2^1024 to 2^1536" in response.partial_success.error_message
    errors = [stub.Export(request(m), timeout=10).partial_success.error_message for m in (
        summary, metrics_pb2.Metric(name="hist", histogram={"aggregation_temporality": 2,
                                                            "data_points": [
            _histogram(t + 10**9, [1.0, 2.0], [1, 1, 0])]}), no_counts)]
    assert errors[0] == "'summ': summary points are not stored; the local collector stores " \
                        "gauges, sums and histograms"
    assert "differ from [1.0], which this cumulative series has had since its start" in errors[1]
    assert "2 bounds and no bucket counts" in errors[2]
    mon = explore.Monitoring(endpoint=collector.endpoint)
    assert _reads(mon, PREFIX + "exp/histogram", "ALIGN_DELTA") == [1, 1]
    assert _reads(mon, PREFIX + "hist/histogram", "ALIGN_DELTA") == [1, 1]
    assert _reads(mon, PREFIX + "beside/gauge", "ALIGN_MEAN") == [1, 1]
    assert len(collector.store().points(PREFIX + "hist/histogram")) == 3


def test_a_point_is_one_value_at_one_time_and_keeps_its_metrics_value_type(collector, stub):
    """A second value at a stored time was dropped silently yet acknowledged; an int gauge
    followed by a double 0.75 read back as 0. Both are refused, named; a retry is still
    stored once and acknowledged."""
    first = request(metrics_pb2.Metric(name="once", gauge={"data_points": [number(10, 1.0)]}))
    assert not stub.Export(first, timeout=10).HasField("partial_success")
    assert not stub.Export(first, timeout=10).HasField("partial_success")  # a retry
    other = stub.Export(request(metrics_pb2.Metric(name="once", gauge={"data_points": [
        number(10, 2.0), number(11, 3.0)]})), timeout=10).partial_success
    assert other.rejected_data_points == 1
    assert other.error_message == "'once/gauge' point at time_unix_nano=10: its series has " \
                                  "another value stored at that time"
    assert [p["value"] for p in collector.store().points(PREFIX + "once/gauge")] == [1.0, 3.0]
    stub.Export(request(metrics_pb2.Metric(name="ints", gauge={"data_points": [number(10, 7)]})))
    mixed = stub.Export(request(metrics_pb2.Metric(name="ints", gauge={"data_points": [
        number(11, 0.75), number(12, 8)]})), timeout=10).partial_success
    assert mixed.rejected_data_points == 1
    assert "a double value (0.75) on a metric whose points are integers" in mixed.error_message
    assert [p["int_value"] for p in collector.store().points(PREFIX + "ints/gauge")] == [7, 8]


def test_metric_types_past_the_limit_are_refused_not_kept(tmp_path):
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0,
                        limits=Limits(max_metric_types=3)) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        response = stub.Export(request(*[metrics_pb2.Metric(name=f"m{i}", gauge={
            "data_points": [number(10, 1.0)]}) for i in range(5)]), timeout=10)
        assert response.partial_success.rejected_data_points == 2
        assert "holds 3 metric types, its limit (max_metric_types)" in \
            response.partial_success.error_message
        assert [d["name"] for d in c.store().metric_types()] == ["m0", "m1", "m2"]


def test_a_cap_filled_with_junk_is_freed_by_deleting_the_junk_descriptors(tmp_path):
    """Junk metric types (max_metric_types) or junk label keys on a real metric (100 a type)
    made later legitimate points refused, also after a restart, and no call could undo it:
    DeleteMetricDescriptor was UNIMPLEMENTED. It now deletes a user-defined type's descriptor,
    label keys and points, through google-cloud-monitoring's own client and the token, as in
    Cloud Monitoring; a built-in type, a bad name or a type it does not hold is refused."""
    from distrl.otel.points import MAX_LABEL_KEYS

    db = tmp_path / "otel.db"
    with LocalCollector(db, port=0, limits=Limits(max_metric_types=4)) as c:
        bearer = [("authorization", f"Bearer {c.token_file.read_text().strip()}")]
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))

        def export(*metrics):
            return stub.Export(request(*metrics), metadata=bearer, timeout=10).partial_success

        junk = [metrics_pb2.Metric(name=f"junk{i}", gauge={"data_points": [number(10, 1.0)]})
                for i in range(3)]
        wide = metrics_pb2.Metric(name="loss", gauge={"data_points": [number(10, 1.0, attrs=[
            kv(f"k{i}", int_value=i) for i in range(MAX_LABEL_KEYS)])]})
        assert export(*junk, wide).rejected_data_points == 0  # 4 types: the cap
        refused = export(metrics_pb2.Metric(name="new", gauge={"data_points": [number(11, 2.0)]}),
                         metrics_pb2.Metric(name="loss", gauge={"data_points": [number(
                             11, 2.0, attrs=[kv("run", string_value="r1")])]}))
        assert refused.rejected_data_points == 2, refused
        client = explore.Monitoring(endpoint=c.endpoint, token_file=c.token_file).client
        for name in [f"junk{i}" for i in range(3)] + ["loss"]:
            client.delete_metric_descriptor(
                name=f"projects/local/metricDescriptors/{PREFIX}{name}/gauge")
        with pytest.raises(gexc.NotFound, match="no metric descriptor"):
            client.delete_metric_descriptor(name=f"projects/local/metricDescriptors/{PREFIX}junk0/gauge")
        with pytest.raises(gexc.InvalidArgument, match="not a user-defined metric type"):
            client.delete_metric_descriptor(
                name="projects/local/metricDescriptors/compute.googleapis.com/instance/uptime")
        with pytest.raises(gexc.InvalidArgument, match="expected projects/PROJECT_ID/metric"):
            client.delete_metric_descriptor(name="junk0")
        with pytest.raises(gexc.Unauthenticated):  # a delete needs the token too
            explore.Monitoring(endpoint=c.endpoint).client.delete_metric_descriptor(
                name=f"projects/local/metricDescriptors/{PREFIX}new/gauge", retry=None)
        assert c.store().points(PREFIX + "junk1/gauge") == []
    with LocalCollector(db, port=0, limits=Limits(max_metric_types=4)) as again:  # for good
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(again.endpoint.removeprefix("http://")))
        accepted = stub.Export(request(
            metrics_pb2.Metric(name="new", gauge={"data_points": [number(12, 3.0)]}),
            metrics_pb2.Metric(name="loss", gauge={"data_points": [number(
                12, 3.0, attrs=[kv("run", string_value="r1")])]})), metadata=bearer, timeout=10)
        assert accepted.partial_success.rejected_data_points == 0, accepted
        assert sorted(d["name"] for d in again.store().metric_types()) == ["loss", "new"]
        assert again.store().label_keys(PREFIX + "loss/gauge") == ["run"]


def test_a_db_that_is_not_a_collectors_is_refused_in_one_line(tmp_path):
    """A directory, a text file or another program's SQLite file gave a sqlite3 traceback,
    and the last one got three tables added and WAL switched on."""
    import sqlite3

    (tmp_path / "notes.txt").write_text("not a database\n")
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    for db, why in [(tmp_path, "is a directory"), (tmp_path / "notes.txt", "is not a SQLite "
                    "database"), (other, "is another program's SQLite database \\(tables users\\)")]:
        with pytest.raises(ValueError, match=f"db='{db}' {why}"):
            CollectorServer(db, port=0).start()
        result = subprocess.run([sys.executable, "-m", "distrl.otel.collector", "--db", str(db),
                                 "--port", "0"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.startswith(f"error: db='{db}'") and result.stderr.count("\n") == 1
    assert other.read_bytes() == before  # untouched
    assert not list(tmp_path.glob("*.token"))  # and no token was made beside a refused one
    result = subprocess.run([sys.executable, "-m", "distrl.otel.collector", "--max-message-mib",
                             "100000"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.startswith("error: max_message_bytes=")


def test_reads_run_in_reader_processes_below_ingestion_and_one_that_dies_is_replaced(
        collector, stub):
    """Reads held the collector's interpreter lock for seconds: exports beside two query
    loops had a p99 30 times their p99 alone. They now run in processes of their own, at a
    lower CPU priority; a reader that dies fails its read with UNAVAILABLE (clients retry it)
    and the next read gets a new one."""
    from distrl.otel.receivers import READ_NICE

    stub.Export(_gauges("r", 10), timeout=10)
    mon = explore.Monitoring(endpoint=collector.endpoint)
    end = dt.datetime(1970, 1, 1, 0, 1, tzinfo=dt.UTC)
    assert len(mon.time_series(PREFIX + "r/gauge", end=end)) == 10
    def readers():  # beside them, multiprocessing's resource tracker
        return [p for p in psutil.Process(collector.process.pid).children()
                if "spawn_main" in " ".join(p.cmdline())]

    first = readers()
    assert len(first) == 1 and first[0].nice() == READ_NICE, first
    first[0].kill()  # it stays a zombie until the collector reaps it
    for _ in range(100):
        with contextlib.suppress(psutil.NoSuchProcess):
            if first[0].status() != psutil.STATUS_ZOMBIE:
                threading.Event().wait(0.1)
                continue
        break
    outcomes = []
    for _ in range(3):
        try:
            outcomes.append(len(mon.time_series(PREFIX + "r/gauge", end=end)))
            break
        except Exception as err:  # noqa: BLE001 - what the client saw, compared below
            outcomes.append(type(err).__name__)
    assert outcomes[-1] == 10 and set(outcomes[:-1]) <= {"ServiceUnavailable"}, outcomes
    (new,) = readers()
    assert new.pid != first[0].pid and new.nice() == READ_NICE


def test_an_aggregated_read_ends_at_its_deadline(tmp_path):
    """Aggregated reads over many series ran 63-65 s against their 30-s deadline: the
    deadline was checked while reading rows, not while aligning and reducing them."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=Limits(max_query_s=1.0)) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        for t in range(1, 4):
            stub.Export(_wide("many", range(20_000), t=t * 10**9), timeout=60)
        client = explore.Monitoring(endpoint=c.endpoint).client
        _warm_readers(c.endpoint, 1)
        started = dt.datetime.now()
        with pytest.raises(Exception, match="ran past its deadline of 1.0 s") as err:
            list(client.list_time_series(request={
                "name": "projects/local", "filter": f'metric.type = "{PREFIX}many/gauge"',
                "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 240}},
                "aggregation": {"alignment_period": {"seconds": 1},
                                "per_series_aligner": "ALIGN_MEAN",
                                "cross_series_reducer": "REDUCE_MEAN",
                                "group_by_fields": ["metric.label.series"]}}, timeout=60))
        assert type(err.value).__name__ == "DeadlineExceeded"
        assert (dt.datetime.now() - started).total_seconds() < 5


def test_a_collector_whose_starter_is_killed_stops_and_frees_its_port_and_database(tmp_path):
    """A notebook kernel that dies by SIGKILL never stops its LocalCollector: the collector
    lived on, holding the port and the database's lock, and the next start was refused. It
    now watches its parent and stops when it is gone."""
    import select
    import time

    code = textwrap.dedent(f"""
        import time
        from distrl.otel.collector import LocalCollector
        c = LocalCollector({str(tmp_path / "otel.db")!r}, token_file=None, port=0).start()
        print(c.process.pid, c.port, flush=True)
        time.sleep(600)
        """)
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([starter.stdout], [], [], 120)
        assert ready, "the starter printed nothing in 120 s"
        pid, port = map(int, starter.stdout.readline().split())
    finally:
        starter.kill()
        starter.wait(timeout=30)
        starter.stdout.close()
    collector = psutil.Process(pid)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and collector.is_running() and \
            collector.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.1)
    gone = not collector.is_running() or collector.status() == psutil.STATUS_ZOMBIE
    if not gone:
        collector.kill()
    assert gone, "the collector outlived the process that started it"
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=port) as again:  # the port and the lock
        assert again.port == port


def test_a_nan_attribute_refuses_its_resource_or_span_alone(collector, stub):
    """NaN is no JSON, so the store cannot hold it: a NaN in a resource or a span attribute
    failed the whole request with INTERNAL, which exporters do not retry. Now the resource's
    spans or points, or the one span, are refused and named; the rest is stored."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
    from opentelemetry.proto.trace.v1 import trace_pb2

    def span(name, span_id, attributes=()):
        return trace_pb2.Span(name=name, trace_id=b"\x01" * 16, span_id=span_id,
                              start_time_unix_nano=1, end_time_unix_nano=2,
                              attributes=list(attributes))

    nan = kv("x", double_value=float("nan"))
    ok = {"attributes": [kv("service.name", string_value="svc")]}
    channel = grpc.insecure_channel(f"127.0.0.1:{collector.port}")
    response = trace_service_pb2_grpc.TraceServiceStub(channel).Export(
        trace_service_pb2.ExportTraceServiceRequest(resource_spans=[
            trace_pb2.ResourceSpans(resource={"attributes": [nan]}, scope_spans=[
                trace_pb2.ScopeSpans(spans=[span("lost with its resource", b"\x03" * 8)])]),
            trace_pb2.ResourceSpans(resource=ok, scope_spans=[trace_pb2.ScopeSpans(spans=[
                span("kept", b"\x04" * 8), span("nan", b"\x05" * 8, [nan])])])]), timeout=10)
    channel.close()
    assert response.partial_success.rejected_spans == 2
    assert "NaN or infinite" in response.partial_success.error_message
    assert [s["name"] for s in collector.store().spans()] == ["kept"]
    gauge = metrics_pb2.Metric(name="g", gauge={"data_points": [number(10, 1.0)]})
    both = metrics_service_pb2.ExportMetricsServiceRequest(resource_metrics=[
        *request(gauge, resource=[nan]).resource_metrics, *request(gauge).resource_metrics])
    response = stub.Export(both, timeout=10)
    assert response.partial_success.rejected_data_points == 1
    assert len(collector.store().points(PREFIX + "g/gauge")) == 1
