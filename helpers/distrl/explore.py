"""Looking at what the collector stored: percentiles from histogram buckets, rates from
counters, gauge series, and trace waterfalls.

    store = CollectorStore("runs/otel.db")
    latency_percentiles(store, "rl.sample.duration")          # p50/p95/p99 per rl.loop
    counter_rate(store, "rl.sample.samples")                   # pandas: time -> per-second rate
    plot_trace_waterfall(store.spans(trace_id))                # one loop iteration across processes
"""

from __future__ import annotations

import numpy as np

PREFIX = "prometheus.googleapis.com/"


def _series_key(point: dict) -> tuple:
    return (point["resource"].get("service.instance.id"),
            tuple(sorted((k, str(v)) for k, v in point["attributes"].items())))


def latest_per_series(points: list[dict]) -> list[dict]:
    """The newest point of every series (cumulative points carry the series' totals)."""
    latest: dict = {}
    for p in points:
        key = _series_key(p)
        if key not in latest or p["time_ns"] >= latest[key]["time_ns"]:
            latest[key] = p
    return list(latest.values())


def bucket_percentile(bounds: list[float], counts: list[int], q: float) -> float:
    """The q-quantile (0..1) of an explicit-bucket histogram, interpolating inside the bucket
    (the first bucket starts at 0, the overflow bucket is reported at its lower bound)."""
    if not 0 <= q <= 1:
        raise ValueError(f"q={q!r} is invalid: expected a quantile in [0, 1]")
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} bucket counts for {len(bounds)} bounds; expected "
                         f"{len(bounds) + 1}")
    total = sum(counts)
    if total == 0:
        return float("nan")
    rank = q * total
    cumulative = 0.0
    for i, count in enumerate(counts):
        if count and cumulative + count >= rank:
            lower = 0.0 if i == 0 else bounds[i - 1]
            if i == len(bounds):
                return float(lower)
            upper = bounds[i]
            return float(lower + (upper - lower) * (rank - cumulative) / count)
        cumulative += count
    return float(bounds[-1])


def latency_percentiles(store, name: str, by: str = "rl.loop", quantiles=(0.5, 0.95, 0.99),
                        where: dict | None = None):
    """A DataFrame of count, mean and percentiles (ms) of a latency histogram, grouped by an
    attribute, from the newest cumulative point of each series; `where` filters on exact
    attribute values, e.g. {"rl.run.id": run_id}."""
    import pandas as pd

    rows = {}
    for p in latest_per_series(store.points(f"{PREFIX}{name}/histogram", where)):
        group = p["attributes"].get(by, "")
        bounds, counts = p["bounds"], p["bucket_counts"]
        entry = rows.setdefault(group, {"bounds": bounds, "counts": np.zeros(len(counts)),
                                        "sum": 0.0})
        entry["counts"] += counts
        entry["sum"] += p["sum"] or 0.0
    out = []
    for group, e in sorted(rows.items()):
        n = int(e["counts"].sum())
        row = {by: group, "count": n, "mean_ms": e["sum"] / n if n else float("nan")}
        for q in quantiles:
            row[f"p{round(q * 100)}_ms"] = bucket_percentile(e["bounds"], list(e["counts"]), q)
        out.append(row)
    return pd.DataFrame(out).set_index(by) if out else pd.DataFrame()


def counter_rate(store, name: str, bin_s: float = 1.0, where: dict | None = None):
    """Per-second rate of a cumulative counter, summed over its series, in time bins.

    Each series' rate comes from consecutive points (increase / time between them), so the
    first point of a series, which carries everything counted before it, is not a spike.
    """
    import pandas as pd

    points = store.points(f"{PREFIX}{name}/counter", where)
    if not points:
        return pd.DataFrame(columns=["time_s", "rate"])
    t0 = min(p["time_ns"] for p in points)
    frames = []
    for series, group in enumerate(_by_series(points).values()):
        times = np.array([p["time_ns"] for p in group], dtype=np.float64)
        values = np.array([p["value"] for p in group])
        if len(group) < 2:
            continue
        rate = np.diff(values) / np.maximum(np.diff(times) / 1e9, 1e-9)
        frames.append(pd.DataFrame({"time_s": (times[1:] - t0) / 1e9, "rate": rate,
                                    "series": series}))
    if not frames:
        return pd.DataFrame(columns=["time_s", "rate"])
    df = pd.concat(frames)
    df["bin"] = (df["time_s"] // bin_s) * bin_s
    per_series = df.groupby(["bin", "series"])["rate"].mean()
    return per_series.groupby("bin").sum().rename("rate").reset_index().rename(
        columns={"bin": "time_s"})


def gauge_series(store, name: str, by: str = "rl.loop", where: dict | None = None):
    """A gauge's points as a DataFrame: time (s from the first point), group, value."""
    import pandas as pd

    points = store.points(f"{PREFIX}{name}/gauge", where)
    if not points:
        return pd.DataFrame(columns=["time_s", by, "value"])
    start = min(p["time_ns"] for p in points)
    return pd.DataFrame([{"time_s": (p["time_ns"] - start) / 1e9,
                          by: p["attributes"].get(by, ""), "value": p["value"]}
                         for p in points])


def _by_series(points: list[dict]) -> dict:
    out: dict = {}
    for p in points:
        out.setdefault(_series_key(p), []).append(p)
    return out


def traces(store):
    """One row per trace: root span, start, duration, span count and the processes involved."""
    import pandas as pd

    rows: dict = {}
    for s in store.spans():
        entry = rows.setdefault(s["trace_id"], {"trace_id": s["trace_id"], "spans": 0,
                                                "components": set(), "root": None})
        entry["spans"] += 1
        entry["components"].add(s["resource"].get("service.component", "?"))
        if s["parent_span_id"] is None:
            entry["root"] = s
    out = []
    for entry in rows.values():
        root = entry.pop("root")
        if root is None:
            continue
        out.append({**entry, "iteration": root["attributes"].get("rl.loop.iteration"),
                    "start_ns": root["start_ns"],
                    "duration_ms": (root["end_ns"] - root["start_ns"]) / 1e6,
                    "components": ",".join(sorted(entry["components"]))})
    return pd.DataFrame(out).sort_values("start_ns") if out else pd.DataFrame()


def plot_trace_waterfall(spans: list[dict], ax=None):
    """Horizontal bars, one per span, from the root's start, coloured by process."""
    import matplotlib.pyplot as plt

    if not spans:
        raise ValueError("no spans to draw: pick a trace id from traces(store)")
    spans = sorted(spans, key=lambda s: s["start_ns"])
    t0 = min(s["start_ns"] for s in spans)
    components = sorted({s["resource"].get("service.component", "?") for s in spans})
    colours = {c: f"C{i}" for i, c in enumerate(components)}
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.35 * len(spans) + 1))
    for row, s in enumerate(spans):
        start = (s["start_ns"] - t0) / 1e6
        width = max((s["end_ns"] - s["start_ns"]) / 1e6, 0.01)
        component = s["resource"].get("service.component", "?")
        ax.barh(row, width, left=start, color=colours[component])
        label = f"{s['name']}  [{s['resource'].get('service.instance.id', '?').split('@')[0]}]"
        ax.text(start + width, row, f" {label} {width:.2f} ms", va="center", fontsize=8)
    ax.set_yticks([])
    ax.invert_yaxis()
    end = max((s["end_ns"] - t0) / 1e6 for s in spans)
    ax.set_xlim(0, end * 1.45)  # room for the labels right of the bars
    ax.set_xlabel("ms since the iteration's rl.loop span started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[c]) for c in components]
    ax.legend(handles, components, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return ax
