"""Export latency of the local collector while clients run heavy queries, and its memory after
large exports.

    python benchmarks/collector_under_load.py [--series 20000] [--exporters 4] [--seconds 20]

Fills a collector with `--series` gauge series (and `--descriptor-points` more points, over
which ListMetricDescriptors is timed), then runs `--exporters` processes that each
export small requests back to back (what a training's processes do) for `--seconds`, first
alone and then beside two processes that read every series (ListTimeSeries) and list the
metric descriptors in a loop. Prints export latency p50/p99 for both, their ratio, the queries
answered or refused, and the collector's resident memory after max_exports concurrent exports
of nearly the largest message it takes.
"""

import distrl  # noqa: F401 - first: it turns gRPC's fork support off (grpc/grpc#43055)

# isort: split

import argparse
import datetime as dt
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
from google.cloud import monitoring_v3
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from distrl.otel.collector import Limits, LocalCollector

S = 10**9


def gauge_request(name: str, series: range, t: int, value: float = 1.0):
    metric = metrics_pb2.Metric(name=name)
    for i in series:
        metric.gauge.data_points.add(time_unix_nano=t, as_double=value, attributes=[
            common_pb2.KeyValue(key="series", value=common_pb2.AnyValue(string_value=f"s{i}"))])
    return metrics_service_pb2.ExportMetricsServiceRequest(resource_metrics=[
        metrics_pb2.ResourceMetrics(
            resource={"attributes": [common_pb2.KeyValue(
                key="service.name", value=common_pb2.AnyValue(string_value="bench"))]},
            scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[metric])])])


def exporter(endpoint: str, index: int, seconds: float, out) -> None:
    stub = metrics_service_pb2_grpc.MetricsServiceStub(grpc.insecure_channel(endpoint))
    latencies, k, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        k += 1
        request = gauge_request(f"bench.exporter{index}", range(20), time.time_ns(), float(k))
        start = time.perf_counter()
        stub.Export(request, timeout=60)
        latencies.append(time.perf_counter() - start)
    out.put(latencies)


def querier(endpoint: str, project: str, stop, out) -> None:
    from google.api_core import exceptions

    client = monitoring_v3.MetricServiceClient(
        transport=monitoring_v3.services.metric_service.transports.MetricServiceGrpcTransport(
            channel=grpc.insecure_channel(endpoint)))
    answered, refused, first_error = 0, 0, ""
    now = dt.datetime.now(dt.UTC)
    while not stop.is_set():
        try:
            for _ in client.list_time_series(request={
                    "name": f"projects/{project}",
                    "filter": 'metric.type = "prometheus.googleapis.com/bench.filled/gauge"',
                    "interval": {"end_time": now, "start_time": now - dt.timedelta(hours=1)},
                    "view": monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL},
                    timeout=30):
                pass
            list(client.list_metric_descriptors(name=f"projects/{project}", timeout=30))
            answered += 1
        except exceptions.GoogleAPICallError as err:
            refused += 1
            first_error = first_error or f"{type(err).__name__}: {str(err)[:120]}"
            time.sleep(0.05)
    out.put((answered, refused, first_error))


def export_latencies(endpoint: str, exporters: int, seconds: float, queries: int):
    ctx = mp.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    readers = [ctx.Process(target=querier, args=(endpoint, "bench", stop, out))
               for _ in range(queries)]
    for r in readers:
        r.start()
    writers = [ctx.Process(target=exporter, args=(endpoint, i, seconds, out))
               for i in range(exporters)]
    for w in writers:
        w.start()
    latencies = np.concatenate([out.get(timeout=seconds + 120) for _ in writers]) * 1e3
    stop.set()
    query_counts = [out.get(timeout=120) for _ in readers]
    for p in readers + writers:
        p.join(timeout=30)
    return latencies, query_counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=20_000)
    parser.add_argument("--exporters", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--descriptor-points", type=int, default=200_000)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.series, args.exporters, args.seconds, args.descriptor_points = 2_000, 1, 1.0, 5_000
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCollector(Path(tmp) / "otel.db", port=0) as collector:
        endpoint = collector.endpoint.removeprefix("http://")
        stub = metrics_service_pb2_grpc.MetricsServiceStub(grpc.insecure_channel(endpoint))
        t = time.time_ns() - 60 * S
        for lo in range(0, args.series, 5_000):
            stub.Export(gauge_request("bench.filled", range(lo, min(lo + 5_000, args.series)),
                                      t), timeout=120)
        for lo in range(0, args.descriptor_points, 5_000):  # a series per point (worst case)
            stub.Export(gauge_request("bench.history", range(lo, lo + 5_000), t), timeout=120)
        client = monitoring_v3.MetricServiceClient(
            transport=monitoring_v3.services.metric_service.transports.MetricServiceGrpcTransport(
                channel=grpc.insecure_channel(endpoint)))
        start = time.perf_counter()
        descriptors = list(client.list_metric_descriptors(name="projects/bench", timeout=120))
        print(f"ListMetricDescriptors over {args.series + args.descriptor_points:,} points: "
              f"{time.perf_counter() - start:.2f} s ({len(descriptors)} descriptors)")
        print(f"filled {args.series:,} series; {args.exporters} exporter processes, "
              f"{args.seconds:g} s each", flush=True)
        quiet, _ = export_latencies(endpoint, args.exporters, args.seconds, queries=0)
        loaded, counts = export_latencies(endpoint, args.exporters, args.seconds, queries=2)
        for label, lat in [("alone", quiet), ("beside 2 query loops", loaded)]:
            print(f"export latency {label}: p50 {np.percentile(lat, 50):.1f} ms, "
                  f"p99 {np.percentile(lat, 99):.1f} ms, max {lat.max():.0f} ms "
                  f"({len(lat):,} exports)")
        print(f"p99 ratio loaded/alone: {np.percentile(loaded, 99) / np.percentile(quiet, 99):.1f}"
              f"; query loops answered {sum(c[0] for c in counts)}, refused "
              f"{sum(c[1] for c in counts)} {next((c[2] for c in counts if c[2]), '')}")
        process = psutil.Process(collector.process.pid)
        before = process.memory_info().rss
        limits = Limits()
        big = gauge_request("bench.big", range(95_000), time.time_ns())  # just under the limit
        size = big.ByteSize()
        n = 2 if args.smoke else limits.max_exports
        with mp.get_context("spawn").Pool(n) as pool:
            codes = pool.starmap(_export_code, [(endpoint, big)] * n)
        print(f"collector RSS {before / 2**20:.0f} MiB before and "
              f"{process.memory_info().rss / 2**20:.0f} MiB after {n} concurrent exports of "
              f"{size / 2**20:.1f} MiB ({', '.join(sorted(set(codes)))}); the limits' bound "
              f"above the baseline: {limits.memory_bound_bytes() / 2**20:.0f} MiB")


def _export_code(endpoint: str, request) -> str:
    stub = metrics_service_pb2_grpc.MetricsServiceStub(grpc.insecure_channel(
        endpoint, options=[("grpc.max_send_message_length", 256 * 2**20)]))
    try:
        stub.Export(request, timeout=120)
        return "OK"
    except grpc.RpcError as err:
        return err.code().name


if __name__ == "__main__":
    main()
