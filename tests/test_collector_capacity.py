"""What no client can take from the collector: exports keep their capacity beside any reads,
a reader survives any request, one collector writes a database. Real collector processes, real
gRPC, google-cloud-monitoring's own client."""

import contextlib
import http.client
import socket
import sqlite3
import struct
import threading

import grpc
import psutil
import pytest
from google.api_core import exceptions as gexc
from google.cloud import monitoring_v3
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2
from test_collector import (
    PREFIX,
    TreePeak,
    _export_with_retries,
    _gauges,
    _stall,
    _warm_readers,
    _wide,
    kv,
    number,
    request,
)

from distrl.otel import explore
from distrl.otel.collector import LocalCollector
from distrl.otel.limits import Limits, MiB

LIST_TIME_SERIES = "/google.monitoring.v3.MetricService/ListTimeSeries"


def _readers(collector) -> list[psutil.Process]:
    """The collector's reader processes (beside them, multiprocessing's resource tracker)."""
    return [p for p in psutil.Process(collector.process.pid).children()
            if "spawn_main" in " ".join(p.cmdline())]


def _list_time_series(channel, **fields):
    """A raw ListTimeSeries call, so that a request can carry what the client would refuse
    to build (an enum number no Aligner has)."""
    req = monitoring_v3.ListTimeSeriesRequest(
        name="projects/local", filter=f'metric.type = "{PREFIX}big/gauge"',
        interval={"start_time": {"seconds": 0}, "end_time": {"seconds": 10}})._pb
    for name, value in fields.items():
        setattr(req.aggregation, name, value)
    call = channel.unary_unary(LIST_TIME_SERIES, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=bytes)
    return call, req


@pytest.fixture
def collector(tmp_path):
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as c:
        yield c


def test_a_reader_answers_unknown_enums_and_an_int64_overflow_and_lives_on(collector):
    """An aligner or reducer number the enum does not know, and a SUM of two INT64 gauges of
    2**62, each killed the reader; the client's retries then spawned a reader a call. They are
    INVALID_ARGUMENT and OUT_OF_RANGE now, answered by the same reader."""
    big = metrics_pb2.Metric(name="big", gauge={"data_points": [
        number(10**9, 2**62, [kv("s", string_value=s)]) for s in "ab"]})
    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
    stub.Export(request(big), timeout=10)
    channel = grpc.insecure_channel(collector.endpoint.removeprefix("http://"))
    try:
        for field, value in (("per_series_aligner", 999), ("cross_series_reducer", 999)):
            call, req = _list_time_series(channel)
            req.aggregation.alignment_period.seconds = 60
            req.aggregation.per_series_aligner = 10  # ALIGN_MAX, unless overwritten
            setattr(req.aggregation, field, value)
            with pytest.raises(grpc.RpcError) as err:
                call(req, timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert f"{field} 999 is not a" in err.value.details()
        (reader,) = _readers(collector)
        client = explore.Monitoring(endpoint=collector.endpoint).client
        summed = {"name": "projects/local", "filter": f'metric.type = "{PREFIX}big/gauge"',
                  "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 60}},
                  "aggregation": {"alignment_period": {"seconds": 60},
                                  "per_series_aligner": "ALIGN_MAX",
                                  "cross_series_reducer": "REDUCE_SUM"}}
        with pytest.raises(gexc.OutOfRange, match="beyond 64 bits"):
            list(client.list_time_series(request=summed, timeout=30))
        summed["aggregation"]["cross_series_reducer"] = "REDUCE_MAX"
        [series] = client.list_time_series(request=summed, timeout=30)
        assert series.points[0].value.int64_value == 2**62
        assert [p.pid for p in _readers(collector)] == [reader.pid]  # none died
    finally:
        channel.close()


def test_an_unforeseen_error_in_a_read_is_internal_and_the_reader_answers_the_next(
        tmp_path, monkeypatch):
    """answer_bytes, what a reader process runs for each call, with a fault no rule foresaw."""
    from distrl.otel import monitoring
    from distrl.otel.store import CollectorStore

    store = CollectorStore(tmp_path / "otel.db", create=True)
    monkeypatch.setattr(monitoring, "_READER", monitoring.MetricService(store))
    request = monitoring_v3.ListMetricDescriptorsRequest(name="projects/local")._pb
    answered = monitoring.answer_bytes("ListMetricDescriptors", request.SerializeToString(),
                                       monitoring._ReadDeadline(5))
    assert answered[0] == 0
    real = monitoring.answer
    monkeypatch.setattr(monitoring, "answer", lambda *a: 1 // 0)
    code, message = monitoring.answer_bytes("ListMetricDescriptors", request.SerializeToString(),
                                            monitoring._ReadDeadline(5))
    assert code == grpc.StatusCode.INTERNAL.value[0] and "ZeroDivisionError" in message
    monkeypatch.setattr(monitoring, "answer", real)
    assert monitoring.answer_bytes("ListMetricDescriptors", request.SerializeToString(),
                                   monitoring._ReadDeadline(5))[0] == 0
    store.close()


def _light_read(client, timeout: float) -> int:
    """The series of the small metric "light", through google-cloud-monitoring's client."""
    return len(list(client.list_time_series(request={
        "name": "projects/local", "filter": f'metric.type = "{PREFIX}light/gauge"',
        "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 60}}},
        timeout=timeout)))


def test_a_read_its_client_cancels_stops_in_the_reader(tmp_path):
    """A cancelled read went on in its reader until its deadline, holding the reader (and a
    server thread) for nothing. The reader now hears of it and is free at once: with one
    reader, a read after the cancel is answered long before the cancelled one's 30 s."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=Limits(max_queries=1)) as c:
        endpoint = c.endpoint.removeprefix("http://")
        stub = metrics_service_pb2_grpc.MetricsServiceStub(grpc.insecure_channel(endpoint))
        for t in range(1, 4):
            stub.Export(_wide("many", range(20_000), t=t * 10**9), timeout=60)
        stub.Export(_gauges("light", 3), timeout=10)
        client = explore.Monitoring(endpoint=c.endpoint).client
        assert _light_read(client, 60) == 3  # the reader is up
        (reader,) = _readers(c)
        channel = grpc.insecure_channel(endpoint)
        call, req = _list_time_series(channel)
        req.filter = f'metric.type = "{PREFIX}many/gauge"'
        req.interval.end_time.seconds = 240
        req.aggregation.alignment_period.seconds = 1
        req.aggregation.per_series_aligner = monitoring_v3.Aggregation.Aligner.ALIGN_MEAN
        req.aggregation.cross_series_reducer = monitoring_v3.Aggregation.Reducer.REDUCE_MEAN
        req.aggregation.group_by_fields.append("metric.label.series")
        busy = reader.cpu_times().user
        future = call.future(req, timeout=60)
        while reader.cpu_times().user < busy + 0.3:  # the reader is on it
            assert not future.done(), future.exception()
            threading.Event().wait(0.05)
        future.cancel()
        assert _light_read(client, 10) == 3
        assert [p.pid for p in _readers(c)] == [reader.pid]  # stopped, not killed
        channel.close()


def _own_connection(endpoint: str):
    """A channel with a connection of its own: gRPC shares one among a process's channels to
    the same address, and the loads here stand for other processes."""
    return grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])


def test_exports_keep_their_capacity_beside_looping_reads_stalled_calls_and_cancels(
        collector):
    """One pool of 18 threads served every call: 18 stalled calls let 5 of 238 exports in,
    40 read loops 7 of 951, cancelled reads 38%. Every export must now be accepted at its
    first try beside 30 read loops, 18 stalled calls reopened every 2 s and reads cancelled
    10 ms after they start."""
    endpoint = collector.endpoint.removeprefix("http://")
    stub = metrics_service_pb2_grpc.MetricsServiceStub(grpc.insecure_channel(endpoint))
    stub.Export(_gauges("light", 5), timeout=10)
    stop, errors, counts = threading.Event(), [], {"reads": 0, "refused": 0, "cancelled": 0}

    def read_loop():
        client = monitoring_v3.MetricServiceClient(
            transport=monitoring_v3.services.metric_service.transports.MetricServiceGrpcTransport(
                channel=_own_connection(endpoint)))
        while not stop.is_set():
            try:
                _light_read(client, 30)
                counts["reads"] += 1
            except gexc.ResourceExhausted:
                counts["refused"] += 1
            except Exception as err:  # noqa: BLE001 - any other outcome fails the test
                errors.append(repr(err))

    def stall_loop():
        channel = _own_connection(endpoint)
        while not stop.is_set():
            again = threading.Event()
            calls = _stall(channel, again, 18)
            stop.wait(2)
            again.set()
            for call in calls:
                call.cancel()
        channel.close()

    def cancel_loop():
        channel = _own_connection(endpoint)
        while not stop.is_set():
            call, req = _list_time_series(channel)
            req.filter = f'metric.type = "{PREFIX}light/gauge"'
            future = call.future(req, timeout=30)
            stop.wait(0.01)
            future.cancel()
            counts["cancelled"] += 1
        channel.close()

    loads = ([threading.Thread(target=read_loop) for _ in range(30)]
             + [threading.Thread(target=stall_loop), threading.Thread(target=cancel_loop)])
    for thread in loads:
        thread.start()
    codes = []
    try:
        threading.Event().wait(2)  # every load running
        for t in range(200):
            try:
                stub.Export(_gauges("beside", 20, t=100 + t), timeout=30)
                codes.append("OK")
            except grpc.RpcError as err:
                codes.append(f"{err.code().name}: {err.details()}")
    finally:
        stop.set()
        for thread in loads:
            thread.join(60)
    assert codes == ["OK"] * 200, {c: codes.count(c) for c in set(codes)}
    assert errors == [] and counts["reads"] > 0 and counts["cancelled"] > 50, (errors, counts)
    assert len(_readers(collector)) <= Limits().max_queries


def test_one_collector_writes_a_database(tmp_path):
    """Two collectors on one file refused each other's writes ("database is locked") on 8% of
    exports, without a word. The second is now refused at its start, naming the first."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as first:
        holder = rf"being written by another collector \(pid {first.process.pid}\)"
        with pytest.raises(OSError, match=holder):
            LocalCollector(tmp_path / "otel.db", token_file=None, port=0).start()
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as second:  # the first has gone
        assert second.running


def test_an_export_waits_for_another_writer_instead_of_failing(collector):
    """A transaction that read before it wrote could not take the write lock from another
    writer once that one had committed (SQLITE_BUSY_SNAPSHOT, which the busy timeout does not
    retry). The writer's transactions take the lock up front."""
    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
    stub.Export(_gauges("first", 5), timeout=10)
    other = sqlite3.connect(collector.db_path, isolation_level=None, timeout=30,
                            check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT OR IGNORE INTO metric_labels VALUES ('elsewhere', 'key')")
    threading.Timer(1.0, lambda: other.execute("COMMIT")).start()
    stub.Export(_gauges("second", 5, t=20), timeout=30)
    other.close()
    assert len(collector.store().points(PREFIX + "second/gauge")) == 5


def test_otlp_http_keeps_its_connection(tmp_path):
    """OTLP/HTTP answered HTTP/1.0, so each export opened a connection (the listen backlog
    was 5). Two exports now go over one HTTP/1.1 connection."""
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, http_port=0) as c:
        host, port = c.http_endpoint.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        for t in (10, 20):
            conn.request("POST", "/v1/metrics", _gauges("kept", 3, t=t).SerializeToString(),
                         {"Content-Type": "application/x-protobuf"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200 and response.version == 11
        sock = conn.sock
        assert sock is not None  # the same socket served both
        conn.close()
        assert len(c.store().points(PREFIX + "kept/gauge")) == 6


def test_a_nan_attribute_is_refused_per_point_and_every_read_works(collector):
    """A NaN attribute value was stored as JSON's NaN, which SQLite's json functions refuse:
    every filtered read of its metric failed ("malformed JSON"). It is refused per point."""
    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
    points = [number(10, 1.0, [kv("x", double_value=float("nan"))]),
              number(10, 2.0, [kv("x", double_value=float("inf"))]),
              number(10, 3.0, [kv("x", double_value=0.5)])]
    response = stub.Export(request(metrics_pb2.Metric(name="nan", gauge={"data_points": points})),
                           timeout=10)
    assert response.partial_success.rejected_data_points == 2
    assert "NaN or infinite" in response.partial_success.error_message
    [kept] = collector.store().points(PREFIX + "nan/gauge", where={"x": 0.5})
    assert kept["value"] == 3.0


def test_caps_on_buckets_and_labels_are_refused_per_point(collector):
    """A point with a million exponential buckets took 1.5 GB past the printed memory bound;
    attribute keys of 2.1 MB made every ListMetricDescriptors fail in the standard client.
    Buckets, label keys and values, and keys a metric type has are capped, each refused per
    point; the points beside them are stored."""
    from distrl.otel.points import MAX_BUCKETS, MAX_KEY_CHARS, MAX_LABEL_KEYS, MAX_VALUE_CHARS

    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(collector.endpoint.removeprefix("http://"),
                              options=[("grpc.max_send_message_length", 64 * 2**20)]))
    wide = metrics_pb2.ExponentialHistogramDataPoint(
        time_unix_nano=10, count=10**6, scale=0, positive={"offset": 0,
                                                           "bucket_counts": [1] * 10**6})
    fine = metrics_pb2.ExponentialHistogramDataPoint(
        time_unix_nano=10, count=3, scale=0, positive={"offset": 0, "bucket_counts": [1, 2]},
        attributes=[kv("ok", string_value="yes")])
    exp = metrics_pb2.Metric(name="exp", exponential_histogram={
        "aggregation_temporality": 1, "data_points": [wide, fine]})
    response = stub.Export(request(exp), timeout=60)
    assert response.partial_success.rejected_data_points == 1
    assert f"1,000,001 buckets; at most {MAX_BUCKETS}" in response.partial_success.error_message

    long_key = kv("k" * (2 * 2**20), string_value="v")
    long_value = kv("v", string_value="x" * (MAX_VALUE_CHARS + 1))
    points = [number(10, 1.0, [long_key]), number(10, 2.0, [long_value]),
              number(10, 3.0, [kv("k", string_value="x" * MAX_VALUE_CHARS)])]
    response = stub.Export(request(metrics_pb2.Metric(name="labels", gauge={
        "data_points": points})), timeout=60)
    assert response.partial_success.rejected_data_points == 2
    assert f"characters; at most {MAX_KEY_CHARS}" in response.partial_success.error_message
    # Keys a metric type has: the point that would add one past the cap is refused.
    many = [number(20, float(i), [kv(f"key{i:03d}", int_value=i)]) for i in range(MAX_LABEL_KEYS)]
    response = stub.Export(request(metrics_pb2.Metric(name="labels", gauge={
        "data_points": many})), timeout=60)
    assert response.partial_success.rejected_data_points == 1  # "k" was the first key
    assert "label keys; at most" in response.partial_success.error_message
    # A resource past the caps: its points are refused, the other resource's stored.
    response = stub.Export(request(metrics_pb2.Metric(name="res", gauge={
        "data_points": [number(10, 1.0)]}), resource=[long_value]), timeout=60)
    assert response.partial_success.rejected_data_points == 1
    assert "the resource's attribute 'v'" in response.partial_success.error_message

    store = collector.store()
    assert len(store.points(PREFIX + "exp/histogram")) == 1
    assert len(store.points(PREFIX + "labels/gauge")) == 1 + MAX_LABEL_KEYS - 1
    assert store.points(PREFIX + "res/gauge") == []
    client = explore.Monitoring(endpoint=collector.endpoint).client
    descriptors = list(client.list_metric_descriptors(
        request={"name": "projects/local", "page_size": 1}, timeout=30))
    labels = next(d for d in descriptors if d.type == PREFIX + "labels/gauge").labels
    assert len(labels) == MAX_LABEL_KEYS


def test_every_read_response_stays_under_a_client_s_4_mib(collector):
    """Series whose labels are as large as the caps allow: a read of them all comes in pages,
    each under the standard client's 4 MiB receive limit."""
    from distrl.otel.points import MAX_LABEL_KEYS, MAX_VALUE_CHARS

    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
    labels = [kv(f"{'k' * 90}{i:03d}", string_value="v" * (MAX_VALUE_CHARS - 4))
              for i in range(MAX_LABEL_KEYS - 1)]
    for series in range(60):  # 60 x ~100 KB of labels: about 6 MB in all
        point = number(10, float(series), [*labels, kv("series", int_value=series)][-MAX_LABEL_KEYS:])
        stub.Export(request(metrics_pb2.Metric(name="fat", gauge={"data_points": [point]})),
                    timeout=30)
    client = explore.Monitoring(endpoint=collector.endpoint).client
    pages = client.list_time_series(request={
        "name": "projects/local", "filter": f'metric.type = "{PREFIX}fat/gauge"',
        "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 60}}}, timeout=60).pages
    sizes = [type(page).pb(page).ByteSize() for page in pages]
    assert len(sizes) > 1 and max(sizes) < 4 * 2**20, sizes


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    """One HTTP/2 frame (RFC 9113, section 4.1)."""
    return (struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream)
            + payload)


def _unread_calls(endpoint: str, path: str, message: bytes, calls: int) -> socket.socket:
    """A client that never reads: an HTTP/2 connection whose flow-control window is 0, so
    that the server can send no answer (RFC 9113 SETTINGS_INITIAL_WINDOW_SIZE), carrying calls
    gRPC calls of path with one message each. Headers are HPACK literals (RFC 7541, 6.2.2)."""
    host, port = endpoint.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    headers = b"".join(b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value
                       for name, value in [(b":method", b"POST"), (b":scheme", b"http"),
                                           (b":path", path.encode()), (b":authority", b"local"),
                                           (b"content-type", b"application/grpc"),
                                           (b"te", b"trailers")])
    body = b"\x00" + struct.pack(">I", len(message)) + message  # gRPC's length prefix
    wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, struct.pack(">HI", 4, 0))
    for k in range(calls):  # HEADERS with END_HEADERS, DATA with END_STREAM
        wire += _frame(1, 4, 2 * k + 1, headers) + _frame(0, 1, 2 * k + 1, body)
    sock.sendall(wire)
    return sock


def _fat_page(collector):
    """34 gauge series of the largest labels the collector takes, one ListTimeSeries page of
    about 3.5 MB: (an export stub, a MetricService client, the request that reads them)."""
    from distrl.otel.points import MAX_LABEL_KEYS, MAX_VALUE_CHARS

    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
    labels = [kv(f"{'k' * 90}{i:03d}", string_value="v" * (MAX_VALUE_CHARS - 4))
              for i in range(MAX_LABEL_KEYS - 1)]
    for series in range(34):
        point = number(10, 1.0, [*labels, kv("series", int_value=series)])
        stub.Export(request(metrics_pb2.Metric(name="fat", gauge={"data_points": [point]})),
                    timeout=30)
    fat = {"name": "projects/local", "filter": f'metric.type = "{PREFIX}fat/gauge"',
           "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 60}}}
    return stub, explore.Monitoring(endpoint=collector.endpoint).client, fat


@pytest.mark.slow
def test_answers_their_clients_never_read_hold_a_bounded_memory(tmp_path):
    """200 ListTimeSeries calls on 8 connections whose clients never read held their 3.5-MB
    answers in gRPC's buffers: +246 MB outside the printed bound. Answers not yet read are
    now capped (UNREAD_ANSWER_BYTES); past it reads are refused until they are taken,
    exports go on, and the collector with its reader stays under the bound it prints."""
    limits = Limits(max_message_bytes=MiB, max_exports=1, max_queries=1,
                    max_read_bytes=16 * MiB, cache_bytes=MiB, page_cache_bytes=MiB)
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=limits) as collector:
        endpoint = collector.endpoint.removeprefix("http://")
        stub, client, fat = _fat_page(collector)
        page = next(iter(client.list_time_series(request=fat, timeout=60).pages))
        assert 3 * MiB < type(page).pb(page).ByteSize() < 4 * MiB
        threading.Event().wait(1.0)
        message = monitoring_v3.ListTimeSeriesRequest(
            name="projects/local", filter=fat["filter"],
            interval={"start_time": {"seconds": 0}, "end_time": {"seconds": 60}})._pb
        sockets: list[socket.socket] = []
        try:
            with TreePeak(psutil.Process(collector.process.pid)) as memory:
                sockets += [_unread_calls(endpoint, LIST_TIME_SERIES,
                                          message.SerializeToString(), 25)
                            for _ in range(8)]
                refused = None
                for _ in range(60):  # until the unread answers fill the cap
                    try:
                        list(client.list_time_series(request=fat, timeout=30, retry=None))
                    except gexc.ResourceExhausted as err:
                        if "wait for their clients" in str(err):
                            refused = str(err)
                            break
                    threading.Event().wait(0.5)
                threading.Event().wait(3.0)  # the 200 calls answered or refused
                stub.Export(_gauges("beside", 5), timeout=10)  # exports go on
        finally:
            for sock in sockets:
                sock.close()
        assert refused is not None, "no read was refused while 200 answers went unread"
        grown, bound = memory.grown, limits.memory_bound_bytes()
        print(f"200 unread answers grew the collector by {grown / MiB:.0f} MiB; "
              f"bound {bound / MiB:.0f} MiB")
        assert grown < bound, f"grew {grown / MiB:.0f} MiB past the bound {bound / MiB:.0f} MiB"
        for _ in range(20):  # closed connections release their answers
            try:
                assert len(list(client.list_time_series(request=fat, timeout=30))) == 34
                break
            except gexc.ResourceExhausted:
                threading.Event().wait(0.5)
        else:
            raise AssertionError("reads stayed refused after the unread answers' clients left")


@pytest.mark.slow
def test_a_connection_that_never_reads_leaves_other_clients_their_reads(tmp_path):
    """One HTTP/2 connection with a zero window, its calls answered and never read, filled the
    cap on unread answers alone: legitimate reads were answered 3 of 59 for 60 s. A connection
    now has 8 calls open and UNREAD_PER_CONNECTION of unread answers at most (its further
    reads are refused, naming it), so another client's reads are all answered beside two."""
    limits = Limits(max_queries=1, max_read_bytes=16 * MiB, page_cache_bytes=MiB)
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=limits) as collector:
        endpoint = collector.endpoint.removeprefix("http://")
        _, client, fat = _fat_page(collector)
        message = monitoring_v3.ListTimeSeriesRequest(**fat)._pb.SerializeToString()
        # two connections of 25 calls (87 MB of answers each), the second opened once the
        # first's answers wait: either alone filled the cap before
        hostile = [_unread_calls(endpoint, LIST_TIME_SERIES, message, 25)]
        try:
            threading.Event().wait(1.0)
            hostile.append(_unread_calls(endpoint, LIST_TIME_SERIES, message, 25))
            threading.Event().wait(3.0)  # its answers are made, and wait
            answered = []
            for _ in range(20):
                try:
                    answered.append(len(list(client.list_time_series(request=fat, timeout=30,
                                                                     retry=None))))
                except gexc.ResourceExhausted as err:
                    answered.append(str(err))
        finally:
            for sock in hostile:
                sock.close()
    assert answered == [34] * 20, answered


@pytest.mark.slow
def test_a_read_of_large_distributions_is_charged_for_what_it_holds(tmp_path):
    """A bucket was charged 24 bytes where a read holds about 77: reads of large histograms
    held three times their limit. 300 points of 1,000 buckets (about 25 MiB held) are now
    answered within a 32 MiB limit and 500 refused, where both had been answered."""
    from distrl.otel.points import MAX_BUCKETS

    limits = Limits(max_queries=1, max_read_bytes=32 * MiB, page_cache_bytes=MiB)
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=limits) as collector:
        endpoint = collector.endpoint.removeprefix("http://")
        stub = metrics_service_pb2_grpc.MetricsServiceStub(grpc.insecure_channel(endpoint))
        bounds = [float(b) for b in range(1, MAX_BUCKETS)]
        for name, points in (("fewer", 300), ("more", 500)):
            for lo in range(0, points, 100):
                stub.Export(request(metrics_pb2.Metric(name=name, histogram={
                    "aggregation_temporality": 2, "data_points": [metrics_pb2.HistogramDataPoint(
                        start_time_unix_nano=1, time_unix_nano=10, count=MAX_BUCKETS * 1000,
                        explicit_bounds=bounds, bucket_counts=[1000] * MAX_BUCKETS,
                        attributes=[kv("series", int_value=i)]) for i in range(lo, lo + 100)]})),
                    timeout=60)
        _warm_readers(collector.endpoint, 1)
        threading.Event().wait(1.0)
        client = explore.Monitoring(endpoint=collector.endpoint).client

        def read(metric: str):
            try:
                return len(list(client.list_time_series(request={
                    "name": "projects/local", "filter": f'metric.type = "{PREFIX}{metric}"',
                    "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 100}}},
                    timeout=120)))
            except gexc.ResourceExhausted as err:
                return str(err)
        with TreePeak(psutil.Process(collector.process.pid)) as memory:
            fewer, more = read("fewer/histogram"), read("more/histogram")
        assert fewer == 300, fewer
        assert "would hold more than 32 MiB" in more, more
        grown = memory.grown
        print(f"a read of 300 histograms grew the collector by {grown / MiB:.0f} MiB")
        assert grown < limits.max_read_bytes, f"grew {grown / MiB:.0f} MiB"


def test_the_write_ahead_log_stays_bounded_beside_looping_readers(tmp_path):
    """Three ingesting clients beside three looping readers grew the WAL to 771 MB in 60 s:
    overlapping read snapshots kept SQLite from ever starting it again. Now the writer starts
    it again when no read holds it, and past 4 x max_wal_bytes the reads on it are stopped
    (UNAVAILABLE) until it does. (The salt in the log's header changes each time it starts
    again: sqlite.org/fileformat2.html#walformat.)"""
    limit = 8 * MiB
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0,
                        limits=Limits(max_wal_bytes=limit)) as c:
        endpoint = c.endpoint.removeprefix("http://")
        wal = tmp_path / "otel.db-wal"
        stop, sizes, salts, codes, reads = threading.Event(), [], [], [], []
        assert _export_with_retries(endpoint, _wide("walread", range(3_000))) == "OK"

        def ingest(k):
            stub = metrics_service_pb2_grpc.MetricsServiceStub(_own_connection(endpoint))
            t = 0
            while not stop.is_set():
                t += 1
                try:
                    stub.Export(_wide(f"wal{k}", range(2_000), t=t * 10**9), timeout=30)
                except grpc.RpcError as err:
                    codes.append(err.code().name)

        def read_loop():
            client = monitoring_v3.MetricServiceClient(
                transport=monitoring_v3.services.metric_service.transports
                .MetricServiceGrpcTransport(channel=_own_connection(endpoint)))
            while not stop.is_set():
                try:
                    reads.append(len(list(client.list_time_series(request={
                        "name": "projects/local",
                        "filter": f'metric.type = "{PREFIX}walread/gauge"',
                        "interval": {"start_time": {"seconds": 0},
                                     "end_time": {"seconds": 10**6}}}, timeout=30, retry=None))))
                except gexc.ServiceUnavailable as err:  # the log is starting again
                    reads.append(str(err))
                    stop.wait(0.1)  # as the client's own retry would

        threads = ([threading.Thread(target=ingest, args=(k,)) for k in range(3)]
                   + [threading.Thread(target=read_loop) for _ in range(3)])
        for thread in threads:
            thread.start()
        try:
            for _ in range(60):  # 15 s
                threading.Event().wait(0.25)
                with contextlib.suppress(FileNotFoundError), wal.open("rb") as log:
                    header = log.read(32)
                    sizes.append(log.seek(0, 2))
                    salts.append(header[16:20])
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        written = sum(len(c.store().points(PREFIX + f"wal{k}/gauge")) for k in range(3))
    assert codes == [] and written > 100_000, (codes, written)
    # Bounded: 4 x the limit and one commit of these 2,000-point exports (each rewrites
    # megabytes of index pages: up to 21 MiB here beside two busy loops); cut back to 4 x the
    # limit after. It grew without end before (177 MB in these 15 s with the first version of
    # the fix, which did not stop reads), and to 107 MiB on CI's loaded machine (67-69 MiB
    # here beside two busy loops) while the writer went on committing until the reads stopped.
    print(f"WAL file sizes (MiB): {[s // MiB for s in sizes]}")
    assert max(sizes) < 4 * limit + 32 * MiB, str([s // MiB for s in sizes])
    assert min(sizes[len(sizes) // 2:]) <= 4 * limit, str([s // MiB for s in sizes])
    assert len(set(salts[len(salts) // 2:])) >= 5, salts  # it went on starting again
    answered = [r for r in reads if r == 3_000]
    refused = [r for r in reads if isinstance(r, str)]
    assert len(answered) + len(refused) == len(reads), reads  # whole answers, or refusals
    # How many get through depends on the machine: 87-90 of ~185 here, 3 of 107 beside two
    # busy loops (this limit is reached every few tenths of a second).
    print(f"{len(answered)} reads answered, {len(refused)} refused")
    assert all("write-ahead log" in r for r in refused), refused
    assert refused, "the reads were never stopped: the test did not reach 4 x the limit"


def test_the_pages_of_a_read_go_to_the_reader_that_keeps_its_result(tmp_path):
    """Paging through 120,000 points recomputed the whole query every other page: consecutive
    pages went to different readers, each with a page cache of its own. A page token now
    names its reader, and the next page waits for that one (here busy with another read for
    about 2 s) rather than going to the idle one to be computed again."""
    import base64
    import json

    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0, limits=Limits(max_queries=2)) as c:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        for t in range(1, 7):
            stub.Export(_wide("paged", range(20_000), t=t * 10**9), timeout=60)
        stub.Export(_gauges("light", 3), timeout=10)
        client = explore.Monitoring(endpoint=c.endpoint).client
        warm = [threading.Thread(target=_light_read, args=(client, 60)) for _ in range(2)]
        for thread in warm:  # both readers up, each with its imports done
            thread.start()
        for thread in warm:
            thread.join(60)
        request = {"name": "projects/local", "filter": f'metric.type = "{PREFIX}paged/gauge"',
                   "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 60}},
                   "page_size": 30_000}
        first = next(iter(client.list_time_series(request=request, timeout=60).pages))
        token = first.next_page_token
        owner = json.loads(base64.urlsafe_b64decode(token))["reader"]
        procs = _readers(c)
        before = {p.pid: p.cpu_times().user for p in procs}

        def busy():  # takes the reader that just answered (the last freed): the owner
            with contextlib.suppress(gexc.DeadlineExceeded):
                list(_heavy(client, timeout=2))
        hog = threading.Thread(target=busy)
        hog.start()
        threading.Event().wait(0.5)
        second = next(iter(client.list_time_series(request={**request, "page_token": token},
                                                   timeout=60).pages))
        hog.join(30)
        assert sum(len(ts.points) for ts in second.time_series) == 30_000
        assert json.loads(base64.urlsafe_b64decode(second.next_page_token))["reader"] == owner
        work = sorted(p.cpu_times().user - before[p.pid] for p in procs)
        assert work[0] < 0.3, work  # the other reader computed nothing meanwhile


def _heavy(client, timeout: float):
    """An aligned read of every "paged" series at 1-s periods: seconds of work."""
    return client.list_time_series(request={
        "name": "projects/local", "filter": f'metric.type = "{PREFIX}paged/gauge"',
        "interval": {"start_time": {"seconds": 0}, "end_time": {"seconds": 60}},
        "aggregation": {"alignment_period": {"seconds": 1}, "per_series_aligner": "ALIGN_MEAN",
                        "cross_series_reducer": "REDUCE_MEAN",
                        "group_by_fields": ["metric.label.series"]}}, timeout=timeout)


def test_points_that_end_before_they_start_or_far_ahead_are_refused(collector):
    """A point whose start is after its time, or one 100 years ahead, was stored without a
    word (and the far one sat at the end of every read)."""
    import time

    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
    now = time.time_ns()
    points = [number(now, 1.0, start=now + 10**9), number(now + 100 * 365 * 86400 * 10**9, 2.0),
              number(now, 3.0, start=now - 10**9)]
    counter = metrics_pb2.Metric(name="times", sum={
        "is_monotonic": True, "aggregation_temporality": 2, "data_points": points})
    response = stub.Export(request(counter), timeout=10)
    assert response.partial_success.rejected_data_points == 2
    assert "is after time_unix_nano" in response.partial_success.error_message
    assert [p["value"] for p in collector.store().points(PREFIX + "times/counter")] == [3.0]


def test_spans_stream_in_constant_memory(tmp_path):
    """CollectorStore.spans() loaded every span (1.5 GB for a million); iter_spans streams
    them, and explore's trace tables read through it."""
    import tracemalloc

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    from distrl.otel.store import CollectorStore

    store = CollectorStore(tmp_path / "otel.db", create=True)
    try:
        for batch in range(4):
            spans = [trace_pb2.Span(name="step", trace_id=(batch * 5000 + i + 1).to_bytes(16),
                                    span_id=b"\x01" * 8, start_time_unix_nano=i + 1,
                                    end_time_unix_nano=i + 2,
                                    attributes=[kv("detail", string_value="x" * 200)])
                     for i in range(5000)]
            store.write_spans(trace_service_pb2.ExportTraceServiceRequest(resource_spans=[
                trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=spans)])]))

        def peak(read) -> tuple[int, int]:
            tracemalloc.start()
            try:
                count = read()
                return count, tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()

        listed, listed_peak = peak(lambda: len(store.spans()))
        streamed, streamed_peak = peak(lambda: sum(1 for _ in store.iter_spans()))
    finally:
        store.close()
    assert listed == streamed == 20_000
    assert streamed_peak * 20 < listed_peak, (streamed_peak, listed_peak)
