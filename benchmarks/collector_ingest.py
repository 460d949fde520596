"""Local collector ingest: metric data points per second committed to SQLite over OTLP/gRPC.

    python benchmarks/collector_ingest.py [--clients 2] [--points-per-request 2000] [--seconds 10]

Clients send pre-serialized ExportMetricsServiceRequests (gauges, counters and histograms with
RL attributes) as fast as the collector acknowledges them; every acknowledged point has been
committed. Target (issue 3): at least 50,000 points/s sustained.
"""

import distrl  # noqa: F401 - first: it turns gRPC's fork support off (grpc/grpc#43055)

# isort: split

import argparse
import tempfile
import threading
import time
from pathlib import Path

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from distrl.otel.collector import LocalCollector
from distrl.otel.store import CollectorStore

EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def kv(key, value):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def build_request(seq: int, points: int) -> bytes:
    """points data points split over a gauge, a counter and a histogram; times unique per seq."""
    common = [kv("rl.run.id", "bench"), kv("rl.algorithm", "apex-dqn"),
              kv("rl.environment.name", "CartPole-v1"), kv("rl.system", "distrl")]
    per = points // 3
    t = 1_000_000_000 * (seq + 1)
    gauge = metrics_pb2.Metric(name="rl.train.loss", gauge={"data_points": [
        metrics_pb2.NumberDataPoint(time_unix_nano=t + i, as_double=0.5,
                                    attributes=common + [kv("rl.loop", f"actor-{i % 64}")])
        for i in range(per)]})
    counter = metrics_pb2.Metric(name="rl.sample.samples", sum={
        "is_monotonic": True, "aggregation_temporality": 2, "data_points": [
            metrics_pb2.NumberDataPoint(start_time_unix_nano=1, time_unix_nano=t + i,
                                        as_int=seq * 512, attributes=common)
            for i in range(per)]})
    histogram = metrics_pb2.Metric(name="rl.sample.duration", unit="ms", histogram={
        "aggregation_temporality": 2, "data_points": [
            metrics_pb2.HistogramDataPoint(start_time_unix_nano=1, time_unix_nano=t + i,
                                           count=10, sum=42.0, explicit_bounds=[1.0, 10.0, 100.0],
                                           bucket_counts=[2, 5, 3, 0], attributes=common)
            for i in range(points - 2 * per)]})
    request = metrics_service_pb2.ExportMetricsServiceRequest(resource_metrics=[
        metrics_pb2.ResourceMetrics(
            resource={"attributes": [kv("service.name", "bench")]},
            scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[gauge, counter, histogram])])])
    return request.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--points-per-request", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.points_per_request, args.seconds = 1, 200, 0.5
    # Enough distinct requests for the whole run at well above the target rate.
    count = max(100, int(150_000 * args.seconds / args.points_per_request))
    requests = [build_request(i, args.points_per_request) for i in range(count)]
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCollector(Path(tmp) / "bench.db", token_file=None, port=0) as collector:
        sent = [0] * args.clients
        stop = threading.Event()

        def client(index: int) -> None:
            with grpc.insecure_channel(f"127.0.0.1:{collector.port}") as channel:
                export = channel.unary_unary(EXPORT, request_serializer=lambda b: b,
                                             response_deserializer=lambda b: b)
                seq = index
                while not stop.is_set() and seq < len(requests):
                    export(requests[seq], timeout=60)
                    sent[index] += args.points_per_request
                    seq += args.clients

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        deadline = start + args.seconds
        while any(t.is_alive() for t in threads) and time.perf_counter() < deadline:
            time.sleep(0.01)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start  # until the last acknowledged request
        stored = CollectorStore(collector.db_path).query("SELECT COUNT(*) AS n FROM points")[0]["n"]
    rate = stored / elapsed
    print(f"collector ingest: {stored:,} points acknowledged and committed in {elapsed:.1f}s = "
          f"{rate:,.0f} points/s (target 50,000: {rate / 50_000:.2f}x); "
          f"{args.clients} clients, {args.points_per_request} points per request")
    assert stored == sum(sent), (stored, sum(sent))


if __name__ == "__main__":
    main()
