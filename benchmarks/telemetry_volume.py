"""Telemetry volume of a training run: what Cloud Monitoring would bill, per export.

    python benchmarks/telemetry_volume.py [--actors 2] [--seconds 40] [--smoke]

Trains CartPole-v1 with telemetry into a local collector, then counts, from what arrived:
- samples per export, the way Managed Service for Prometheus counts them (a gauge or counter
  series is one sample; a histogram series is one per bucket plus its count and sum), split into
  the actors' share (per actor) and everything else (driver, learner, replay, evaluator);
- spans per second of training.
distrl.gke.cost's SAMPLES_PER_EXPORT_* and SPANS_PER_SECOND come from this.
"""

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from time_to_solve import run_training  # benchmarks/ is on sys.path

from distrl.otel.collector import LocalCollector


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.actors, args.seconds = 1, 8.0
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCollector(Path(tmp) / "otel.db", port=0) as collector:
        result = run_training(["--num-actors", str(args.actors), "--target-return", "none",
                               "--max-seconds", str(args.seconds), "--telemetry", "true",
                               "--otlp-endpoint", collector.endpoint,
                               "--otlp-token-file", str(collector.token_file),
                               "--metric-export-interval-s", "2"],
                              timeout_s=args.seconds + 120, output_dir=Path(tmp) / "run")
        store = collector.store()
        rows = store.query(
            "SELECT p.metric_type, p.resource_id, p.attributes, r.attributes AS resource, "
            "MAX(json_array_length(p.bounds)) AS bounds FROM points p "
            "JOIN resources r ON r.id = p.resource_id "
            "GROUP BY p.metric_type, p.resource_id, p.attributes")
        span_rows = store.query("SELECT r.attributes AS resource, COUNT(*) AS n FROM spans s "
                                "JOIN resources r ON r.id = s.resource_id GROUP BY r.id")
    samples = defaultdict(int)
    for row in rows:
        component = json.loads(row["resource"]).get("service.component", "?")
        weight = (row["bounds"] or 0) + 3 if row["metric_type"].endswith("/histogram") else 1
        samples[component] += weight
    actor = samples.pop("actor", 0) / args.actors
    other = sum(samples.values())
    spans = defaultdict(int)
    for row in span_rows:
        spans[json.loads(row["resource"]).get("service.component", "?")] += row["n"]
    training_s = result["wall_time_s"] - result["startup_s"]  # 0: no transition in the budget
    print(f"{len(rows)} series from {args.actors} actors, {args.seconds:g} s budget, "
          f"{training_s:.0f} s of training")
    print(f"samples per export: {other} for driver, learner, replay and evaluator "
          f"({dict(samples)}), {actor:.0f} per actor")
    if training_s <= 0:
        print(f"spans per second: none to count, no training within the budget ({dict(spans)} "
              "spans in all)")
        return
    actor_spans = spans.pop("actor", 0) / args.actors / training_s
    other_spans = sum(spans.values()) / training_s
    print(f"spans per second: {other_spans:.1f} for the others ({dict(spans)} in all), "
          f"{actor_spans:.1f} per actor")


if __name__ == "__main__":
    main()
