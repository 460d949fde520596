"""Cloud Monitoring queries against the local collector: how long the golden-signal charts and
the dashboard preview take over a realistic store.

    python benchmarks/monitoring_query.py [--processes 6] [--hours 1] [--export-interval-s 10]

Fills a collector over OTLP/gRPC with what a run of that many processes exports in that time
(every RL instrument from every process, cumulative counters and histograms as the SDK sends
them), then times `Monitoring.golden_signals()` (one ListTimeSeries per chart and percentile,
through google-cloud-monitoring's client) at 60-s alignment over the whole window.

Then a listing too large for one response (--listing-series gauge series of 3 points, raw):
each page's time, with the collector keeping the first page's result for the later pages
and with a page cache too small to keep it (every page reads the store again).
"""

import distrl  # noqa: F401 - first: it turns gRPC's fork support off (grpc/grpc#43055)

# isort: split

import argparse
import datetime as dt
import tempfile
import time
from pathlib import Path

import grpc
from collector_ingest import kv  # benchmarks/ is on sys.path
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2

from distrl.otel import conventions as otel
from distrl.otel import dashboard, explore
from distrl.otel.collector import LocalCollector
from distrl.otel.limits import Limits
from distrl.otel.store import CollectorStore

S = 10**9


def export(process: int, k: int, t0: int, interval_s: float):
    """The k-th export of one process: every instrument, cumulative since t0."""
    t = t0 + int(k * interval_s * S)
    attrs = [kv("rl.run.id", "bench"), kv("rl.algorithm", "apex-dqn"),
             kv("rl.environment.name", "CartPole-v1"), kv("rl.loop", f"p{process}")]
    metrics = []
    bounds = list(otel.LATENCY_BUCKETS_MS)
    for name in otel.LATENCY_HISTOGRAMS:
        counts = [0] * (len(bounds) + 1)
        counts[8] = 100 * k
        m = metrics_pb2.Metric(name=name, unit="ms")
        m.histogram.aggregation_temporality = 2
        m.histogram.data_points.add(attributes=attrs, start_time_unix_nano=t0, time_unix_nano=t,
                                    count=100 * k, sum=300.0 * k, explicit_bounds=bounds,
                                    bucket_counts=counts)
        metrics.append(m)
    for name in otel.COUNTERS:
        m = metrics_pb2.Metric(name=name)
        m.sum.is_monotonic, m.sum.aggregation_temporality = True, 2
        m.sum.data_points.add(attributes=attrs, start_time_unix_nano=t0, time_unix_nano=t,
                              as_double=1000.0 * k)
        metrics.append(m)
    for name in otel.GAUGES:
        m = metrics_pb2.Metric(name=name)
        m.gauge.data_points.add(attributes=attrs, time_unix_nano=t, as_double=float(k % 7))
        metrics.append(m)
    rm = metrics_pb2.ResourceMetrics()
    rm.resource.attributes.extend([kv("service.name", "rl-training-service"),
                                   kv("service.instance.id", f"p{process}")])
    rm.scope_metrics.add().metrics.extend(metrics)
    return metrics_service_pb2.ExportMetricsServiceRequest(resource_metrics=[rm])


def listing_in_pages(series: int) -> None:
    """Pages of one raw ListTimeSeries of `series` gauge series, result kept and not."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "otel.db"
        store = CollectorStore(db, create=True)
        t0 = int(time.time()) * S - 60 * S
        for lo in range(0, series, 5_000):
            m = metrics_pb2.Metric(name="rl.train.loss", unit="1")
            for i in range(lo, min(lo + 5_000, series)):
                attrs = [kv("rl.run.id", f"run-{i}"), kv("rl.environment.name", "CartPole-v1")]
                for k in range(3):
                    m.gauge.data_points.add(attributes=attrs, time_unix_nano=t0 + k * S,
                                            as_double=float(k))
            rm = metrics_pb2.ResourceMetrics()
            rm.resource.attributes.extend([kv("service.name", "rl-training-service")])
            rm.scope_metrics.add().metrics.append(m)
            store.write_metrics(metrics_service_pb2.ExportMetricsServiceRequest(
                resource_metrics=[rm]))
        store.close()
        end = dt.datetime.now(dt.UTC)
        timings = {}
        for label, limits in [("result kept", Limits()),
                              ("read again", Limits(page_cache_bytes=1))]:
            with LocalCollector(db, token_file=None, port=0, limits=limits) as collector:
                mon = explore.Monitoring(endpoint=collector.endpoint)
                start = last = time.perf_counter()
                pages = []
                for _page in mon.client.list_time_series(request={
                        "name": mon.project_name,
                        "filter": 'metric.type = "prometheus.googleapis.com/rl.train.loss/gauge"',
                        "interval": {"start_time": end - dt.timedelta(minutes=5),
                                     "end_time": end}}, timeout=120).pages:
                    now = time.perf_counter()
                    pages.append(now - last)
                    last = now
                timings[label] = time.perf_counter() - start
                print(f"listing of {series:,} series x 3 points, {label}: {len(pages)} pages in "
                      f"{timings[label]:.2f} s (each: "
                      f"{', '.join(f'{t:.2f}' for t in pages)} s)", flush=True)
        print(f"kept / read again: {timings['result kept'] / timings['read again']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--export-interval-s", type=float, default=10.0)
    parser.add_argument("--listing-series", type=int, default=40_000,
                        help="series of the paged listing (0: skip it)")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.processes, args.hours, args.listing_series = 2, 0.05, 6_000
    exports = int(args.hours * 3600 / args.export_interval_s)
    end = dt.datetime.now(dt.UTC).replace(microsecond=0)
    t0 = int(end.timestamp()) * S - int(args.hours * 3600 * S)
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCollector(Path(tmp) / "otel.db", token_file=None, port=0) as collector:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(collector.endpoint.removeprefix("http://")))
        for k in range(1, exports + 1):
            for process in range(args.processes):
                stub.Export(export(process, k, t0, args.export_interval_s), timeout=30)
        points = collector.store().query("SELECT COUNT(*) AS n FROM points")[0]["n"]
        mon = explore.Monitoring(endpoint=collector.endpoint)
        minutes = args.hours * 60
        calls = sum(len(c.reducers) for c in dashboard.CHARTS)
        for label, group_by in [("per run", otel.RL_RUN_ID), ("per process", otel.RL_LOOP)]:
            start = time.perf_counter()
            frames = mon.golden_signals(minutes=minutes, alignment_s=60, end=end,
                                        group_by=group_by)
            elapsed = time.perf_counter() - start
            rows = sum(len(df) for df, _, _ in frames.values())
            print(f"golden_signals {label}: {calls} ListTimeSeries calls over {points:,} stored "
                  f"points ({args.processes} processes, {args.hours:g} h at "
                  f"{args.export_interval_s:g} s): {elapsed:.2f} s, {elapsed / calls * 1e3:.0f} "
                  f"ms per call, {rows:,} aligned points returned", flush=True)
    if args.listing_series:
        listing_in_pages(args.listing_series)


if __name__ == "__main__":
    main()
