"""Percentiles, rates and waterfalls computed from what the collector stores."""

import numpy as np
import pytest

from distrl.otel import explore
from distrl.otel.series import bucket_percentile


def test_bucket_percentile_against_the_raw_values():
    rng = np.random.default_rng(0)
    values = rng.uniform(0, 100, 100_000)
    bounds = list(np.arange(5.0, 100.1, 5.0))  # the last bound covers every value
    counts = np.histogram(values, bins=[-np.inf, *bounds, np.inf])[0].tolist()
    for q in (0.5, 0.95, 0.99):
        assert bucket_percentile(bounds, counts, q) == pytest.approx(
            np.quantile(values, q), abs=0.5)
    assert bucket_percentile([1.0, 2.0], [0, 4, 0], 0.5) == pytest.approx(1.5)
    assert bucket_percentile([1.0], [0, 3], 0.9) == 1.0  # overflow: its lower bound
    assert np.isnan(bucket_percentile([1.0], [0, 0], 0.5))
    with pytest.raises(ValueError, match="q=1.5"):
        bucket_percentile([1.0], [1, 1], 1.5)
    with pytest.raises(ValueError, match="3 bucket counts for 1 bounds"):
        bucket_percentile([1.0], [1, 1, 1], 0.5)


class FakeStore:
    """Rows shaped exactly as CollectorStore.points/spans returns them."""

    def __init__(self, points=None, spans=None):
        self._points, self._spans = points or {}, spans or []

    def points(self, metric_type, where=None):
        return [p for p in self._points.get(metric_type, [])
                if all(p["attributes"].get(k) == v for k, v in (where or {}).items())]

    def spans(self, trace_id=None):
        return [s for s in self._spans if trace_id in (None, s["trace_id"])]

    def iter_spans(self, trace_id=None):
        return iter(self.spans(trace_id))


def point(instance, t, attrs=None, **fields):
    return {"resource": {"service.instance.id": instance}, "attributes": attrs or {},
            "time_ns": int(t * 1e9), **fields}


def test_latency_percentiles_merge_the_newest_point_of_each_series():
    p = "prometheus.googleapis.com/rl.sample.duration/histogram"
    rows = [point("a", 1, {"rl.loop": "actor"}, bounds=[1.0, 10.0], bucket_counts=[1, 0, 0], sum=0.5),
            point("a", 2, {"rl.loop": "actor"}, bounds=[1.0, 10.0], bucket_counts=[2, 2, 0], sum=10.0),
            point("b", 2, {"rl.loop": "actor"}, bounds=[1.0, 10.0], bucket_counts=[0, 0, 4], sum=80.0),
            point("c", 2, {"rl.loop": "replay"}, bounds=[1.0, 10.0], bucket_counts=[4, 0, 0], sum=2.0)]
    table = explore.latency_percentiles(FakeStore({p: rows}), "rl.sample.duration")
    assert table.loc["actor", "count"] == 8 and table.loc["actor", "mean_ms"] == 90.0 / 8
    assert table.loc["actor", "p50_ms"] == pytest.approx(10.0)
    assert table.loc["replay", "p50_ms"] == pytest.approx(0.5)


def test_counter_rate_sums_increments_over_series():
    p = "prometheus.googleapis.com/rl.sample.samples/counter"
    rows = [point("a", 0, value=100.0), point("a", 1, value=300.0), point("a", 2, value=400.0),
            point("b", 0, value=50.0), point("b", 1, value=150.0),
            point("c", 0, {"rl.run.id": "other"}, value=1e6), point("c", 1, {"rl.run.id": "other"},
                                                                    value=2e6)]
    rate = explore.counter_rate(FakeStore({p: rows}), "rl.sample.samples", bin_s=1.0,
                                where={"rl.run.id": None})
    # a: 200/s then 100/s; b: 100/s; c is another run. The first points are not spikes.
    assert rate["time_s"].tolist() == [1.0, 2.0] and rate["rate"].tolist() == [300.0, 100.0]
    # A flush 10 ms after an export (a block of 160 steps) is no burst of 16,000/s; the clock
    # can start at the run's start, shared by every panel.
    flushed = [point("a", t, value=v) for t, v in [(0, 0.0), (1, 100.0), (1.5, 150.0),
                                                    (2, 200.0), (3, 300.0), (3.01, 460.0)]]
    rate = explore.counter_rate(FakeStore({p: flushed}), "rl.sample.samples", bin_s=1.0,
                                t0_ns=int(-10 * 1e9))
    assert rate["time_s"].tolist() == [11.0, 12.0, 13.0] and rate["rate"].max() == 100.0
    # A series that says when its counting began (start_ns) has a rate from its first point:
    # the actors' steps before their first export show (02's panel started at the second).
    started = [point("a", t, value=v, start_ns=int(2e9)) for t, v in [(3, 50.0), (4, 150.0)]]
    rate = explore.counter_rate(FakeStore({p: started}), "rl.sample.samples", t0_ns=0)
    assert rate["time_s"].tolist() == [3.0, 4.0] and rate["rate"].tolist() == [50.0, 100.0]
    gauge = explore.gauge_series(FakeStore({"prometheus.googleapis.com/rl.train.loss/gauge": [
        point("a", 4, value=1.0)]}), "rl.train.loss", t0_ns=int(1e9))
    assert gauge["time_s"].tolist() == [3.0]


def test_waterfall_draws_one_bar_per_span():
    import matplotlib

    matplotlib.use("Agg")
    spans = [{"trace_id": "t", "span_id": str(i), "parent_span_id": None if i == 0 else "0",
              "name": n, "start_ns": i * 1_000_000, "end_ns": i * 1_000_000 + 500_000,
              "attributes": {"rl.loop.iteration": 4} if i == 0 else {},
              "resource": {"service.component": c, "service.instance.id": f"{c}-1@h"}}
             for i, (n, c) in enumerate([("rl.loop", "driver"), ("rl.sample", "actor"),
                                         ("rl.train", "learner")])]
    ax = explore.plot_trace_waterfall(spans)
    assert len(ax.patches) == 3
    table = explore.traces(FakeStore(spans=spans))
    assert table.iloc[0]["spans"] == 3 and table.iloc[0]["iteration"] == 4
    assert table.iloc[0]["components"] == "actor,driver,learner"
    with pytest.raises(ValueError, match="no spans"):
        explore.plot_trace_waterfall([])


def test_slowest_iterations_come_first_and_bad_n_is_refused():
    spans = []
    for trace, (iteration, ms) in enumerate([(1, 5.0), (2, 50.0), (3, 20.0)]):
        root = {"trace_id": f"t{trace}", "span_id": "r", "parent_span_id": None, "name": "rl.loop",
                "start_ns": trace * 10**9, "end_ns": trace * 10**9 + int(ms * 1e6),
                "attributes": {"rl.loop.iteration": iteration},
                "resource": {"service.component": "driver"}}
        child = {**root, "span_id": "c", "parent_span_id": "r", "name": "rl.train",
                 "resource": {"service.component": "learner"}}
        spans += [root, child]
    slowest = explore.slowest_iterations(FakeStore(spans=spans), n=2)
    assert slowest["iteration"].tolist() == [2, 3]
    assert slowest["duration_ms"].tolist() == pytest.approx([50.0, 20.0])
    assert explore.slowest_iterations(FakeStore(spans=[])).empty
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"n={bad!r}"):
            explore.slowest_iterations(FakeStore(spans=spans), n=bad)


def test_monitoring_requests_reject_bad_query_values():
    mon = explore.Monitoring(endpoint="127.0.0.1:1")  # nothing is sent: the request is built
    request = mon.request("rl.sample.samples", where={"rl.run.id": 'a"b'}, aligner="ALIGN_RATE",
                          reducer="REDUCE_SUM", group_by=("rl.run.id",), alignment_s=30)
    assert request["filter"] == ('metric.type = "prometheus.googleapis.com/rl.sample.samples/'
                                 'counter" AND metric.labels."rl.run.id" = "a\\"b"')
    assert request["aggregation"]["group_by_fields"] == ['metric.labels."rl.run.id"']
    for kwargs, words in [({"aligner": "ALIGN_FAST"}, "aligner='ALIGN_FAST'"),
                          ({"reducer": "SUM"}, "reducer='SUM'"),
                          ({"alignment_s": 0}, "alignment_s=0"),
                          ({"alignment_s": 1.5}, "alignment_s=1.5"),
                          ({"group_by": "rl.run.id"}, "group_by='rl.run.id'"),
                          ({"minutes": -1}, "minutes=-1")]:
        with pytest.raises(ValueError, match=words.replace("(", r"\(")):
            mon.request("rl.sample.samples", **kwargs)
    with pytest.raises(ValueError, match="board is invalid"):
        explore.preview_dashboard(mon, {"tiles": []})
    for bad in [(), ("p42",), ("p95", "median")]:
        with pytest.raises(ValueError, match=r"percentiles=.*expected some of \['p50', 'p95', 'p99'\]"):
            mon.golden_signals(percentiles=bad)


# A TensorBoard log as the learner's tf.summary.scalar writes it (a float tensor with the
# scalars plugin's metadata) and as TF 1 did (simple_value), by TensorBoard's own writer (on its
# stub too: the real TensorFlow would cost this test 5 s), out of order, and more points than
# TensorBoard's reader keeps of a tag by default (10 tensors: a notebook's loss curve lost 22 of 32).
TENSORBOARD_WRITE = """
import sys, types
sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

writer = EventFileWriter(sys.argv[1])
for step in [*range(300, 4100, 100), 100, 200]:
    tensor = tensor_pb2.TensorProto(dtype=1, float_val=[step / 100])  # DT_FLOAT
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
        plugin_name="scalars"))
    writer.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag="learner/loss", tensor=tensor, metadata=meta),
        summary_pb2.Summary.Value(tag="old/simple", simple_value=-step)])))
writer.close()
"""
# Read back through explore in a fresh process: TensorFlow must stay unimported.
TENSORBOARD_READ = """
import json, sys
from distrl.otel import explore
from distrl.otel.series import bucket_percentile

logdir = sys.argv[1]
print(json.dumps({"loss": explore.tensorboard_scalars(logdir, "learner/loss"),
                  "simple": explore.tensorboard_scalars(logdir, "old/simple"),
                  "missing": explore.tensorboard_scalars(logdir, "no/such/tag"),
                  "tensorflow": "tensorflow" in sys.modules}))
"""


def test_tensorboard_scalars_are_read_by_step_without_tensorflow(tmp_path):
    import json
    import subprocess
    import sys

    for script in (TENSORBOARD_WRITE, TENSORBOARD_READ):
        out = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
    read = json.loads(out.stdout.strip().splitlines()[-1])
    steps = range(100, 4100, 100)
    assert read == {"loss": [[step, step / 100] for step in steps],
                    "simple": [[step, -float(step)] for step in steps],
                    "missing": [], "tensorflow": False}
    with pytest.raises(FileNotFoundError, match="logdir='.*nowhere'"):
        explore.tensorboard_scalars(tmp_path / "nowhere", "learner/loss")


def test_slowest_work_is_learner_and_actor_spans_and_outside_root_finds_late_children():
    def span(trace, sid, parent, name, component, start_ms, end_ms):
        return {"trace_id": trace, "span_id": sid, "parent_span_id": parent, "name": name,
                "start_ns": int(start_ms * 1e6), "end_ns": int(end_ms * 1e6), "attributes": {},
                "resource": {"service.component": component}}

    spans = [span("a", "r", None, "rl.loop", "driver", 0, 250),  # a poll: not work
             span("a", "t", "r", "rl.train", "learner", 10, 400),  # runs on past its root
             span("a", "s", "r", "rl.sample", "actor", 20, 60),
             span("b", "r2", None, "rl.loop", "driver", 500, 750),
             span("b", "t2", "r2", "rl.train", "learner", 510, 530)]
    slowest = explore.slowest_work(FakeStore(spans=spans), n=2)
    assert slowest["name"].tolist() == ["rl.train", "rl.sample"]
    assert slowest["duration_ms"].tolist() == pytest.approx([390.0, 40.0])
    assert slowest["trace_id"].tolist() == ["a", "a"]
    assert slowest["first"].tolist() == [True, True]  # each its process's first of its name
    everything = explore.slowest_work(FakeStore(spans=spans), n=5)
    assert everything.loc[everything["span_id"] == "t2", "first"].tolist() == [False]
    assert [s["span_id"] for s in explore.outside_root([s for s in spans if s["trace_id"] == "a"])] \
        == ["t"]
    assert explore.outside_root([s for s in spans if s["trace_id"] == "b"]) == []
    assert explore.slowest_work(FakeStore(spans=[])).empty
    with pytest.raises(ValueError, match="n=0"):
        explore.slowest_work(FakeStore(spans=spans), n=0)


def test_firing_windows_need_the_condition_for_the_whole_duration():
    import pandas as pd

    t0 = pd.Timestamp("2026-12-04T12:00:00Z")
    rate = [900, 850, 20, 10, 0, 0, 880, 5, 900]  # a 40-s drop, then a single low point
    frame = pd.DataFrame({"time": [t0 + pd.Timedelta(seconds=10 * (i + 1)) for i in range(9)],
                          "value": rate, "rl.run.id": "r1"})
    windows = explore.firing_windows(frame, "COMPARISON_LT", 100, duration_s=30, alignment_s=10,
                                     by=("rl.run.id",))
    assert len(windows) == 1  # the single low point (10 s) is shorter than the duration
    [w] = windows.to_dict("records")
    assert w["rl.run.id"] == "r1" and w["worst"] == 0
    assert (w["start"], w["end"]) == (t0 + pd.Timedelta(seconds=20), t0 + pd.Timedelta(seconds=60))
    assert explore.firing_windows(frame, "COMPARISON_GT", 1000, 10, 10).empty
    gap = frame.drop(index=[4])  # a period without a point ends a window: nothing inferred
    assert explore.firing_windows(gap, "COMPARISON_LT", 100, 30, 10, ("rl.run.id",)).empty
    with pytest.raises(ValueError, match="comparison='COMPARISON_EQ'"):
        explore.firing_windows(frame, "COMPARISON_EQ", 1, 1, 1)


def test_evaluate_alert_refuses_promql_and_bad_time_scale():
    policy = {"displayName": "x", "conditions": [{"conditionPrometheusQueryLanguage": {}}]}
    with pytest.raises(ValueError, match="only threshold conditions"):
        explore.evaluate_alert(None, policy)
    with pytest.raises(ValueError, match="time_scale=0"):
        explore.evaluate_alert(None, policy, time_scale=0)


def _frame(seconds: list[float], value: float, run: str = "run-a"):
    import pandas as pd

    t0 = pd.Timestamp("2026-12-06T09:00:00Z")
    return pd.DataFrame({"time": [t0 + pd.Timedelta(seconds=s) for s in seconds],
                         "value": value, "statistic": "mean", "rl.run.id": run})


def test_golden_signal_panels_share_each_runs_clock_break_at_gaps_and_shade_spans():
    """The panels of one run start from its first point in any panel (a panel whose series
    begins later is drawn later, not from 0), a stretch with no points is a gap rather than a
    line across it, and a span (a fault) lands at its own time on every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from distrl.otel import dashboard as dash

    traffic, reward = dash.CHARTS[0], next(c for c in dash.CHARTS if c.signal == "errors")
    latency = next(c for c in dash.CHARTS if c.signal == "latency")
    loops = pd.concat([_frame([2, 7], 1.0).assign(**{"rl.loop": loop}) for loop in ("actor", "learner")])
    frames = {"traffic": (_frame([0, 5, 10, 15, 20], 100.0), traffic, ("rl.run.id",)),
              "reward": (_frame([10, 15, 35, 40], 20.0), reward, ("rl.run.id",)),
              "latency": (loops, latency, ("rl.loop", "rl.run.id")),  # a run's loops: one clock
              "loss": (_frame([5, 20, 25], 1.0), dash.CHARTS[-1], ("rl.run.id",))}  # few points
    fault = (pd.Timestamp("2026-12-06T09:00:21Z"), pd.Timestamp("2026-12-06T09:00:33Z"))
    axes = explore.plot_golden_signals(frames, spans=[("fault", *fault)])
    [traffic_line], [reward_line] = axes[0].get_lines(), axes[1].get_lines()
    assert list(traffic_line.get_xdata()) == [0, 5, 10, 15, 20]
    x = reward_line.get_xdata()
    assert list(x[:2]) == [10, 15] and np.isnan(x[2]) and list(x[3:]) == [35, 40]
    [shade] = axes[1].patches
    assert shade.get_x() == pytest.approx(21.0) and shade.get_width() == pytest.approx(12.0)
    assert [list(line.get_xdata()) for line in axes[2].get_lines()] == [[2, 7], [2, 7]]
    x = axes[3].get_lines()[0].get_xdata()  # three points: the figure's 5-s step finds the gap
    assert x[0] == 5 and np.isnan(x[1]) and list(x[2:]) == [20, 25]
    two_runs = dict(frames, reward=(_frame([0, 5], 1.0, run="run-b"), reward, ("rl.run.id",)))
    with pytest.raises(ValueError, match="spans need the frames of one group, got 2 groups"):
        explore.plot_golden_signals(two_runs, spans=[("fault", *fault)])
