"""The golden-signal charts, as a Cloud Monitoring dashboard and alert policies.

    python -m distrl.otel.dashboard k8s/monitoring     # (re)writes dashboard.json and alerts/*.json

CHARTS is the one list of queries: `explore.golden_signals` draws them from the local
collector or Cloud Monitoring, `dashboard()` turns them into the dashboard that
`gcloud monitoring dashboards create --config-from-file` takes, and `deploy_plan()` lists the
gcloud commands that create the dashboard and the alert policies in a project.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from distrl.gke.runner import Step
from distrl.gke.settings import check_project_id
from distrl.otel import conventions as otel

PREFIX = "prometheus.googleapis.com/"
DASHBOARD_NAME = "RL golden signals (distrl)"
# The label the dashboard and the alert policies carry, as every resource of the GKE plan
# does (GkeSettings.labels): the teardown finds them by it (cleanup_steps, gke.inventory).
LABELS = {"app": "distrl"}
FILTER_LABELS = (otel.RL_RUN_ID, otel.RL_ALGORITHM, otel.RL_ENVIRONMENT_NAME)
ALIGNMENT_S = 60  # Cloud Monitoring's shortest alignment period


@dataclass(frozen=True)
class Chart:
    """One chart: a metric, how each series is aligned, and one line per reducer and group."""

    signal: str                   # latency | traffic | errors | saturation
    title: str
    metric: str                   # the OTel instrument name
    kind: str                     # histogram | counter | gauge
    aligner: str
    reducers: tuple[str, ...]
    group_by: tuple[str, ...]
    unit: str
    where: tuple[tuple[str, str], ...] = ()  # fixed label equalities of every query

    @property
    def metric_type(self) -> str:
        return f"{PREFIX}{self.metric}/{self.kind}"


def label_field(key: str) -> str:
    """A metric label as Cloud Monitoring filters and group_by_fields name it."""
    return f'metric.labels."{key}"'


_PERCENTILES = ("REDUCE_PERCENTILE_50", "REDUCE_PERCENTILE_95", "REDUCE_PERCENTILE_99")
CHARTS = (
    *(Chart("latency", f"{name} p50/p95/p99", name, "histogram", "ALIGN_DELTA", _PERCENTILES,
            (otel.RL_LOOP,), "ms")
      for name in ("rl.loop.duration", "rl.sample.duration", "rl.reward.duration",
                   "rl.train.duration", "rl.sync.duration", "rl.step.duration")),
    Chart("traffic", "env steps/s (rl.sample.samples)", "rl.sample.samples", "counter",
          "ALIGN_RATE", ("REDUCE_SUM",), (otel.RL_RUN_ID,), "1/s"),
    Chart("traffic", "episodes/s (rl.sample.episodes)", "rl.sample.episodes", "counter",
          "ALIGN_RATE", ("REDUCE_SUM",), (otel.RL_RUN_ID,), "1/s"),
    Chart("traffic", "learner updates/s (rl.train.steps)", "rl.train.steps", "counter",
          "ALIGN_RATE", ("REDUCE_SUM",), (otel.RL_RUN_ID,), "1/s"),
    # The greedy evaluator's episodes only: the actors' returns, which the same instrument
    # carries with rl.loop = "actor", include their exploration (epsilon up to 0.4).
    Chart("errors", "greedy mean episode reward (evaluator)", "rl.environment.reward.mean",
          "gauge", "ALIGN_MEAN", ("REDUCE_MEAN",), (otel.RL_RUN_ID,), "1",
          ((otel.RL_LOOP, "evaluator"),)),
    Chart("errors", "greedy mean episode length (evaluator)",
          "rl.environment.episode.length.mean", "gauge", "ALIGN_MEAN", ("REDUCE_MEAN",),
          (otel.RL_RUN_ID,), "1", ((otel.RL_LOOP, "evaluator"),)),
    Chart("errors", "TD loss (rl.train.loss)", "rl.train.loss", "gauge", "ALIGN_MEAN",
          ("REDUCE_MEAN",), (otel.RL_RUN_ID,), "1"),
    Chart("saturation", "model FLOPs utilisation (rl.train.mfu)", "rl.train.mfu", "gauge",
          "ALIGN_MEAN", ("REDUCE_MAX",), (otel.RL_RUN_ID,), "1"),
)


def label_terms(where: dict | None) -> list[str]:
    """Filter terms for equality on metric labels, e.g. {"rl.run.id": "r1"}."""
    return [f"{label_field(k)} = {json.dumps(str(v))}" for k, v in (where or {}).items()]


def chart_filter(chart: Chart, where: dict | None = None) -> str:
    """The chart's Cloud Monitoring filter, with equality on metric labels from the chart's
    own `where` and from `where`."""
    return " AND ".join([f'metric.type = "{chart.metric_type}"',
                         'resource.type = "prometheus_target"',
                         *label_terms({**dict(chart.where), **(where or {})})])


def aggregation_json(aligner: str, reducer: str, alignment_s: int,
                     group_by: tuple[str, ...]) -> dict:
    """An Aggregation in the JSON form of dashboards and alert policies."""
    return {"alignmentPeriod": f"{alignment_s}s", "perSeriesAligner": aligner,
            "crossSeriesReducer": reducer, "groupByFields": [label_field(k) for k in group_by]}


def chart_aggregation(chart: Chart, reducer: str, alignment_s: int = ALIGNMENT_S) -> dict:
    return aggregation_json(chart.aligner, reducer, alignment_s, chart.group_by)


def _legend(chart: Chart, reducer: str) -> str:
    group = " ".join(f"${{metric.labels.{k}}}" for k in chart.group_by)
    if reducer.startswith("REDUCE_PERCENTILE_"):
        return f"p{reducer.rsplit('_', 1)[1]} {group}"
    return group


def dashboard() -> dict:
    """The dashboard, in the JSON form the Cloud Monitoring API and gcloud take."""
    tiles = []
    for i, chart in enumerate(CHARTS):
        data_sets = [{"timeSeriesQuery": {"timeSeriesFilter": {
                          "filter": chart_filter(chart),
                          "aggregation": chart_aggregation(chart, reducer)}},
                      "plotType": "LINE", "legendTemplate": _legend(chart, reducer),
                      "targetAxis": "Y1"}
                     for reducer in chart.reducers]
        tiles.append({"xPos": (i % 3) * 16, "yPos": (i // 3) * 16, "width": 16, "height": 16,
                      "widget": {"title": f"{chart.signal}: {chart.title}", "xyChart": {
                          "dataSets": data_sets,
                          "yAxis": {"label": chart.unit, "scale": "LINEAR"},
                          "chartOptions": {"mode": "COLOR"}}}})
    return {"displayName": DASHBOARD_NAME, "labels": dict(LABELS),
            "dashboardFilters": [{"labelKey": key, "filterType": "METRIC_LABEL",
                                  "templateVariable": key.replace(".", "_")}
                                 for key in FILTER_LABELS],
            "mosaicLayout": {"columns": 48, "tiles": tiles}}


# Google's published RL dashboard, "RL workload performance" (GoogleCloudPlatform/
# monitoring-dashboard-samples, dashboards/reinforcement-learning/rl-workload-performance.json,
# at 25d8c3e): each tile's title, metric type and aggregation, rebuilt here from those facts.
# Its filters put two comparisons side by side with no AND, as Monitoring filters allow.
_P99_95_50 = ("REDUCE_PERCENTILE_99", "REDUCE_PERCENTILE_95", "REDUCE_PERCENTILE_50")
GOOGLE_RL_TILES = (
    ("Loop Duration", "rl.loop.duration/histogram", "ALIGN_DELTA", _P99_95_50),
    ("Reward", "rl.environment.reward.mean/gauge", "ALIGN_MEAN", ("REDUCE_MEAN",)),
    ("Train Loss", "rl.train.loss/gauge", "ALIGN_MEAN", ("REDUCE_MEAN",)),
    ("Training MFU", "rl.train.mfu/gauge", "ALIGN_MEAN", ("REDUCE_MEAN",)),
    ("Samples/sec/GPU", "rl.samples.rate_per_gpu/gauge", "ALIGN_MEAN", ("REDUCE_MEAN",)),
    ("Samples/sec", "rl.samples.rate/gauge", "ALIGN_MEAN", ("REDUCE_MEAN",)),
    ("Total Samples", "rl.sample.samples/counter", "ALIGN_RATE", ("REDUCE_SUM",)),
    ("Total Episodes", "rl.sample.episodes/counter", "ALIGN_RATE", ("REDUCE_SUM",)),
    ("Tokens/sec/GPU", "rl.tokens.rate_per_gpu/gauge", "ALIGN_MEAN", ("REDUCE_MEAN",)),
    ("Tokens/sec", "rl.tokens.rate/gauge", "ALIGN_MEAN", ("REDUCE_MEAN",)),
    ("Total Tokens", "rl.train.tokens/counter", "ALIGN_RATE", ("REDUCE_SUM",)),
    ("Total Steps", "rl.train.steps/counter", "ALIGN_RATE", ("REDUCE_SUM",)),
    *((f"{phase.title()} Duration", f"rl.{phase}.duration/histogram", "ALIGN_DELTA", _P99_95_50)
      for phase in ("train", "sync", "sample", "reward")),
)
# Why a tile of Google's board can be empty for a DQN on a CPU: the metrics nothing here writes.
EMPTY_BECAUSE = {
    "rl.samples.rate_per_gpu": "written only by a learner with a GPU (num_gpus > 0)",
    "rl.tokens.rate_per_gpu": "tokens are a language model's unit: a DQN on gymnasium has none "
                              "(and this one has no GPU either)",
    "rl.tokens.rate": "tokens are a language model's unit: a DQN on gymnasium has none",
    "rl.train.tokens": "tokens are a language model's unit: a DQN on gymnasium has none",
}


def google_rl_dashboard() -> dict:
    """Google's "RL workload performance" dashboard (GOOGLE_RL_TILES) in the JSON form the
    Cloud Monitoring API takes, its filters as published."""
    tiles = [{"widget": {"title": title, "xyChart": {"dataSets": [{"timeSeriesQuery": {
        "timeSeriesFilter": {
            "filter": f'metric.type="{PREFIX}{metric}" resource.type="prometheus_target"',
            "aggregation": {"alignmentPeriod": f"{ALIGNMENT_S}s", "perSeriesAligner": aligner,
                            "crossSeriesReducer": reducer, "groupByFields": []}}}}
        for reducer in reducers]}}} for title, metric, aligner, reducers in GOOGLE_RL_TILES]
    return {"displayName": "RL workload performance", "mosaicLayout": {"tiles": tiles}}


def why_empty(filter_: str) -> str:
    """Why a tile with this filter has no data in a run of this series, or '' if it should
    have data."""
    for name, why in EMPTY_BECAUSE.items():
        if f"/{name}/" in filter_:
            return why
    return ""


def tile_queries(board: dict) -> list[tuple[str, str, dict]]:
    """(tile title, filter, aggregation) of every data set of a dashboard's xyChart tiles."""
    out = []
    for tile in board["mosaicLayout"]["tiles"]:
        widget = tile["widget"]
        for data_set in widget.get("xyChart", {}).get("dataSets", []):
            query = data_set["timeSeriesQuery"]["timeSeriesFilter"]
            out.append((widget["title"], query["filter"], query["aggregation"]))
    return out


def promql(chart: Chart, where: dict | None = None, window: str = "1m") -> list[str]:
    """The chart's queries in PromQL, for Cloud Monitoring's Prometheus API (Managed Service
    for Prometheus): UTF-8 names quoted inside the braces, one query per reducer."""
    selector = ", ".join([json.dumps(chart.metric + ("_bucket" if chart.kind == "histogram"
                                                     else ""))]
                         + [f"{json.dumps(k)}={json.dumps(str(v))}"
                            for k, v in {**dict(chart.where), **(where or {})}.items()])
    by = ", ".join(json.dumps(k) for k in chart.group_by)
    out = []
    for reducer in chart.reducers:
        if chart.kind == "histogram":
            q = int(reducer.rsplit("_", 1)[1]) / 100
            out.append(f'histogram_quantile({q}, sum by ("le", {by}) '
                       f"(rate({{{selector}}}[{window}])))")
        elif chart.kind == "counter":
            out.append(f"sum by ({by}) (rate({{{selector}}}[{window}]))")
        else:
            op = {"REDUCE_MEAN": "avg", "REDUCE_MAX": "max", "REDUCE_SUM": "sum"}[reducer]
            out.append(f"{op} by ({by}) (avg_over_time({{{selector}}}[{window}]))")
    return out


def _threshold(name: str, chart: Chart, reducer: str, comparison: str, value: float,
               duration_s: int, doc: str) -> dict:
    return {"displayName": f"distrl: {name}", "combiner": "OR", "enabled": True,
            "userLabels": dict(LABELS),
            "documentation": {"content": doc, "mimeType": "text/markdown"},
            "conditions": [{"displayName": name, "conditionThreshold": {
                "filter": chart_filter(chart),
                "aggregations": [chart_aggregation(chart, reducer, 300)],
                "comparison": comparison, "thresholdValue": value,
                "duration": f"{duration_s}s", "trigger": {"count": 1}}}]}


def _promql(name: str, query: str, doc: str) -> dict:
    """A policy of one PromQL condition, held for 5 minutes, evaluated every minute."""
    return {"displayName": f"distrl: {name}", "combiner": "OR", "enabled": True,
            "userLabels": dict(LABELS),
            "documentation": {"content": doc, "mimeType": "text/markdown"},
            "conditions": [{"displayName": name, "conditionPrometheusQueryLanguage": {
                "query": query, "duration": "300s", "evaluationInterval": "60s"}}]}


def _chart(metric: str) -> Chart:
    return next(c for c in CHARTS if c.metric == metric)


# The greedy reward of a run dropping from its best: no threshold fits every environment
# (CartPole rewards are positive, Acrobot's negative), and ALIGN_PERCENT_CHANGE ignores values
# < 0, so this one is PromQL: 5-minute mean more than 30% of |best| below the best of the last
# hour. The evaluator's returns only: exploring actors' returns would trip it for nothing.
REWARD_WINDOW_S, REWARD_LOOKBACK_S, REWARD_DROP_FRACTION = 300, 3600, 0.3  # [5m], [1h:1m], 0.3
_GREEDY_REWARD = '{"rl.environment.reward.mean", "rl.loop"="evaluator"}'
_REWARD_MEAN = (f'avg by ("rl.run.id") (avg_over_time({_GREEDY_REWARD}'
                f'[{REWARD_WINDOW_S // 60}m]))')
_REWARD_BEST = f'max_over_time(({_REWARD_MEAN})[{REWARD_LOOKBACK_S // 3600}h:1m])'
REWARD_DROP_PROMQL = (f'{_REWARD_BEST} - {_REWARD_MEAN} > {REWARD_DROP_FRACTION:g} * '
                      f'abs({_REWARD_BEST})')


# A run's env steps/s below a floor, once its learner has trained: a threshold on the rate
# alone also fires while a run starts (its actors wait for the learner's first update, and a
# new counter's first period is empty), which is no fault. A filter-based threshold condition
# cannot ask about another metric's past, so this one is PromQL too.
SAMPLE_RATE_FLOOR = 100.0
SAMPLE_RATE_WINDOW_S = 300  # the rate's window, [5m]
_SAMPLE_RATE = 'sum by ("rl.run.id") (rate({"rl.sample.samples"}[5m]))'
_HAS_TRAINED = ('max_over_time((sum by ("rl.run.id") (rate({"rl.train.steps"}[5m])))[1h:1m])'
                ' > 0')
SAMPLE_RATE_DROP_PROMQL = (f'({_SAMPLE_RATE} < {SAMPLE_RATE_FLOOR:g}) and on ("rl.run.id") '
                           f"({_HAS_TRAINED})")


def alert_policies() -> dict[str, dict]:
    """Alert policies by file name, in the JSON form `gcloud monitoring policies create
    --policy-from-file` takes (GA: cloud.google.com/sdk/gcloud/reference/monitoring/policies/
    create). Thresholds suit CartPole-sized runs; tune them."""
    return {
        "reward-drop": _promql(
            "mean reward drop", REWARD_DROP_PROMQL, "A run's 5-minute mean episode reward fell "
            "more than 30% (of its magnitude) below its best of the last hour."),
        "loss-spike": _threshold(
            "loss spike", _chart("rl.train.loss"), "REDUCE_MAX", "COMPARISON_GT", 100.0, 120,
            "The TD loss of a run stayed above 100 for 2 minutes: Q-values diverging (learning "
            "rate, target update period, reward scale)."),
        "loop-latency-p95": _threshold(
            "loop latency p95", _chart("rl.loop.duration"), "REDUCE_PERCENTILE_95",
            "COMPARISON_GT", 1000.0, 300,
            "The 95th percentile of rl.loop.duration stayed above 1 s for 5 minutes: a slow "
            "phase (see the trace waterfall of the slowest iterations)."),
        "sample-rate-drop": _promql(
            "sample rate drop", SAMPLE_RATE_DROP_PROMQL, f"A run whose learner had trained "
            f"collected fewer than {SAMPLE_RATE_FLOOR:g} env steps/s for 5 minutes: actors lost "
            "(Spot preemption) or blocked on replay (a learner that hangs)."),
    }


def write(directory: str | Path) -> list[Path]:
    """dashboard.json and alerts/<name>.json under directory."""
    directory = Path(directory)
    (directory / "alerts").mkdir(parents=True, exist_ok=True)
    paths = [directory / "dashboard.json"]
    paths[0].write_text(json.dumps(dashboard(), indent=2) + "\n")
    for name, policy in alert_policies().items():
        path = directory / "alerts" / f"{name}.json"
        path.write_text(json.dumps(policy, indent=2) + "\n")
        paths.append(path)
    return paths


def validate(directory: str | Path) -> None:
    """Parse dashboard.json and alerts/*.json with the Cloud Monitoring API's own message
    types, rejecting unknown fields (what gcloud sends is this JSON)."""
    from google.cloud import monitoring_dashboard_v1, monitoring_v3

    directory = Path(directory)
    monitoring_dashboard_v1.Dashboard.from_json((directory / "dashboard.json").read_text())
    for path in sorted((directory / "alerts").glob("*.json")):
        try:
            monitoring_v3.AlertPolicy.from_json(path.read_text())
        except Exception as err:
            raise ValueError(f"{path}: not an AlertPolicy: {err}") from err


def deploy_plan(project_id: str, directory: str | Path) -> list[Step]:
    """The gcloud commands that create the dashboard and the alert policies in a project."""
    check_project_id(project_id)
    directory = Path(directory)
    steps = [Step("Create the golden-signals dashboard",
                  ("gcloud", "monitoring", "dashboards", "create", f"--project={project_id}",
                   f"--config-from-file={directory / 'dashboard.json'}"),
                  "charts of every golden signal, with filters on run, algorithm, environment")]
    for path in sorted((directory / "alerts").glob("*.json")):
        steps.append(Step(f"Create the alert policy {path.stem}",
                          ("gcloud", "monitoring", "policies", "create",
                           f"--project={project_id}", f"--policy-from-file={path}"),
                          json.loads(path.read_text())["documentation"]["content"]))
    return steps


def cleanup_steps(project_id: str) -> list[Step]:
    """The teardown of what deploy_plan made: every dashboard and alert policy carrying the
    label, found by it (a create returns a new id each time) and deleted one by one. `gcloud
    monitoring policies` is GA from gcloud 549.0.0 (its release notes), below the plan's floor;
    both lists filter on the label in gcloud, as the API's dashboards.list takes no filter."""
    check_project_id(project_id)
    label = ",".join(f"{k}={v}" for k, v in LABELS.items())
    project = f"--project={project_id}"
    return [Step(f"Delete what is left of: notebook 05's {what}",
                 ("gcloud", "monitoring", group, "list", f"--filter={field}.{label}",
                  "--format=value(name)", project),
                 each=lambda line, group=group: ("gcloud", "monitoring", group, "delete",
                                                 line.split()[0], project, "--quiet"))
            for what, group, field in (("dashboards", "dashboards", "labels"),
                                       ("alert policies", "policies", "userLabels"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distrl.otel.dashboard",
                                     description="Write the dashboard and alert policy JSON.")
    parser.add_argument("directory", help="where to write (k8s/monitoring in the repo)")
    args = parser.parse_args(argv)
    for path in write(args.directory):
        print(path)
    validate(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
