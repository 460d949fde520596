"""Alert policies evaluated on data: when a threshold condition held for its duration
(firing_windows), a policy's condition run as its query (evaluate_alert), the sample-rate-drop
policy after a run first trained (sample_rate_drops), and the reward-drop policy's held fall
below each run's own best (reward_drop_windows). `monitoring` is an explore.Monitoring;
explore.py offers these beside it."""

from __future__ import annotations

import datetime as dt
import re

from distrl.otel import conventions as otel
from distrl.otel import dashboard as dash


def firing_windows(frame, comparison: str, threshold: float, duration_s: float,
                   alignment_s: float, by: tuple[str, ...] = ()):
    """When a threshold condition held for at least duration_s, per series: frame is the
    condition's aligned query (time, value and the `by` columns); each aligned point stands
    for the period it ends. Returns one row per window: the series, start, end, and the
    value at its worst. Nothing is inferred for periods without points, as in Cloud
    Monitoring's threshold conditions."""
    import pandas as pd

    if comparison not in ("COMPARISON_GT", "COMPARISON_LT"):
        raise ValueError(f"comparison={comparison!r}: expected COMPARISON_GT or COMPARISON_LT")
    rows = []
    keys = [k for k in by if k in frame.columns]
    groups = frame.groupby(keys) if keys else [((), frame)]
    for group, series in groups:
        series = series.sort_values("time")
        held = series["value"] > threshold if comparison == "COMPARISON_GT" \
            else series["value"] < threshold
        run_start = previous = None
        worst = []
        for (t, value), ok in zip(series[["time", "value"]].itertuples(index=False), held):
            gap = previous is not None and (t - previous).total_seconds() > 1.5 * alignment_s
            if run_start is not None and (not ok or gap):
                rows.append(_window(group, keys, run_start, previous, worst, alignment_s,
                                    duration_s, comparison))
                run_start, worst = None, []
            if ok:
                run_start = t if run_start is None else run_start
                worst.append(value)
            previous = t
        if run_start is not None:
            rows.append(_window(group, keys, run_start, previous, worst, alignment_s, duration_s,
                                comparison))
    rows = [r for r in rows if r is not None]
    return pd.DataFrame(rows, columns=[*keys, "start", "end", "worst"])


def _window(group, keys, first, last, values, alignment_s, duration_s, comparison):
    start = first - dt.timedelta(seconds=alignment_s)  # a point ends its period
    if (last - start).total_seconds() < duration_s:
        return None
    group = group if isinstance(group, tuple) else (group,)
    worst = max(values) if comparison == "COMPARISON_GT" else min(values)
    return {**dict(zip(keys, group)), "start": start, "end": last, "worst": worst}


def evaluate_alert(monitoring, policy: dict, *, minutes: float = 60.0,
                   time_scale: float = 1.0, end: dt.datetime | None = None):
    """Evaluate an alert policy's threshold condition on the data `monitoring` holds: its
    filter and aggregation run as a query, and firing_windows says when the condition held
    for its duration. time_scale shortens the policy's alignment period and duration alike,
    for runs of seconds on the local collector (Cloud Monitoring takes the policy as
    written: time_scale 1). Returns (query frame, firing windows, the scaled alignment and
    duration in seconds). A PromQL condition is not evaluated here: ValueError."""
    if not 0 < time_scale <= 1:
        raise ValueError(f"time_scale={time_scale!r} is invalid: expected 0 < time_scale <= 1")
    condition = policy["conditions"][0]
    threshold = condition.get("conditionThreshold")
    if threshold is None:
        raise ValueError(f"policy {policy.get('displayName')!r}: only threshold conditions are "
                         "evaluated here (its condition is "
                         f"{next(iter(condition.keys() - {'displayName'}))})")
    aggregation = dict(threshold["aggregations"][0])
    alignment_s = max(1, round(_seconds(aggregation["alignmentPeriod"]) * time_scale))
    duration_s = _seconds(threshold.get("duration", "0s")) * time_scale
    aggregation["alignmentPeriod"] = f"{alignment_s}s"
    frame = monitoring.query(threshold["filter"], aggregation, minutes=minutes, end=end)
    by = tuple(re.sub(r'^metric\.labels?\."?([^"]+)"?$', r"\1", field)
               for field in aggregation.get("groupByFields", []))
    windows = firing_windows(frame, threshold["comparison"], threshold["thresholdValue"],
                             duration_s, alignment_s, by) if not frame.empty else frame
    return frame, windows, alignment_s, duration_s


def sample_rate_drops(monitoring, *, minutes: float = 60.0,
                      time_scale: float = 1.0, end: dt.datetime | None = None,
                      where: dict | None = None):
    """The sample-rate-drop policy (dashboard.SAMPLE_RATE_DROP_PROMQL) on the data `monitoring`
    holds, the way evaluate_alert runs a threshold condition: each run's env steps/s over
    periods of the PromQL rate window (5 min, scaled by time_scale) below
    dashboard.SAMPLE_RATE_FLOOR for the policy's duration, counted only after the first period
    in which the run's learner trained (a run still starting is not a drop). Returns (the
    runs' sample rates, firing windows, alignment and duration in seconds)."""
    import pandas as pd

    if not 0 < time_scale <= 1:
        raise ValueError(f"time_scale={time_scale!r} is invalid: expected 0 < time_scale <= 1")
    condition = dash.alert_policies()["sample-rate-drop"]["conditions"][0]
    duration_s = _seconds(condition["conditionPrometheusQueryLanguage"]["duration"]) * time_scale
    alignment_s = max(1, round(dash.SAMPLE_RATE_WINDOW_S * time_scale))
    query = dict(where=where, minutes=minutes, end=end, aligner="ALIGN_RATE",
                 reducer="REDUCE_SUM", group_by=(otel.RL_RUN_ID,), alignment_s=alignment_s)
    samples = monitoring.time_series("rl.sample.samples", **query)
    trained = monitoring.time_series("rl.train.steps", **query)
    kept = samples.iloc[:0]
    if not samples.empty and not trained.empty:
        first_trained = trained[trained["value"] > 0].groupby(otel.RL_RUN_ID)["time"].min()
        after = samples["time"] > samples[otel.RL_RUN_ID].map(first_trained)
        kept = samples[after.fillna(False).astype(bool)]
    by = (otel.RL_RUN_ID,)
    windows = (firing_windows(kept, "COMPARISON_LT", dash.SAMPLE_RATE_FLOOR, duration_s,
                              alignment_s, by) if not kept.empty
               else pd.DataFrame(columns=[*by, "start", "end", "worst"]))
    return samples, windows, alignment_s, duration_s


def reward_drop_windows(monitoring, *, minutes: float = 60.0, time_scale: float = 1.0,
                        end: dt.datetime | None = None, where: dict | None = None):
    """The reward-drop policy on the data `monitoring` holds, the way sample_rate_drops runs
    its PromQL twin: each run's greedy (evaluator) reward averaged over periods of the policy's
    window, its best such mean over the lookback before each period, and a firing where the
    mean stayed more than dash.REWARD_DROP_FRACTION of that best's magnitude below it for the
    policy's duration; windows, lookback and duration scaled by time_scale. A single low
    evaluation is not a drop: it moves a period's mean, and the drop must hold. Returns (the
    runs' period means with their best so far, firing windows, alignment and duration in s)."""
    import pandas as pd

    if not 0 < time_scale <= 1:
        raise ValueError(f"time_scale={time_scale!r} is invalid: expected 0 < time_scale <= 1")
    condition = dash.alert_policies()["reward-drop"]["conditions"][0]
    duration_s = _seconds(condition["conditionPrometheusQueryLanguage"]["duration"]) * time_scale
    alignment_s = max(1, round(dash.REWARD_WINDOW_S * time_scale))
    lookback = pd.Timedelta(seconds=dash.REWARD_LOOKBACK_S * time_scale)
    means = monitoring.time_series(
        "rl.environment.reward.mean", where={**(where or {}), otel.RL_LOOP: "evaluator"},
        minutes=minutes, end=end, aligner="ALIGN_MEAN", reducer="REDUCE_MEAN",
        group_by=(otel.RL_RUN_ID,), alignment_s=alignment_s)
    by = (otel.RL_RUN_ID,)
    empty = pd.DataFrame(columns=[*by, "start", "end", "worst"])
    if means.empty:
        return means, empty, alignment_s, duration_s
    parts = []
    for _, series in means.groupby(otel.RL_RUN_ID):
        series = series.sort_values("time").set_index("time", drop=False)
        best = series["value"].rolling(lookback).max()  # the period's own mean included
        parts.append(series.assign(best=best.to_numpy()).reset_index(drop=True))
    means = pd.concat(parts, ignore_index=True)
    fallen = means.assign(value=(means["best"] - means["value"]
                                 > dash.REWARD_DROP_FRACTION * means["best"].abs()).astype(float))
    windows = firing_windows(fallen, "COMPARISON_GT", 0.5, duration_s, alignment_s, by)
    if len(windows):  # the worst: the lowest mean while it held, not the indicator
        windows["worst"] = [means[(means[otel.RL_RUN_ID] == w[otel.RL_RUN_ID])
                                  & means["time"].between(w["start"], w["end"])]["value"].min()
                            for _, w in windows.iterrows()]
    return means, windows, alignment_s, duration_s


def _seconds(duration: str) -> float:
    """'300s' -> 300.0 (the JSON form of a google.protobuf.Duration)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", duration)
    if match is None:
        raise ValueError(f"duration={duration!r} is invalid: expected seconds such as '300s'")
    return float(match.group(1))
