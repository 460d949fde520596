"""Views of the local collector's store (SQLite) for what Cloud Monitoring's API has no call
for: latency percentiles per loop, rates and gauges by series, traces and their waterfall, the
slowest work; and a learner's TensorBoard scalars, read without TensorFlow. explore.py offers
them beside its Monitoring client."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np

from distrl.otel.dashboard import PREFIX
from distrl.otel.series import bucket_percentile


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


def counter_rate(store, name: str, bin_s: float = 1.0, where: dict | None = None,
                 t0_ns: int | None = None):
    """Per-second rate of a cumulative counter, summed over its series, in time bins; time_s
    counts from t0_ns (a run's start, so that panels share one clock) or the first point.

    Each series' rate comes from consecutive points (increase / time between them); its first
    point's from the series' start (a cumulative point's start_ns, when its counting began), so
    the first interval shows, as an average rather than a spike, and a series whose start is not
    known starts at its second point. A point less than half the series' usual spacing after
    the previous one (a flush at shutdown, right after a periodic export) is merged into the
    next one, or left out at the end: over a few milliseconds, one block of steps reads as a
    burst.
    """
    import pandas as pd

    points = store.points(f"{PREFIX}{name}/counter", where)
    if not points:
        return pd.DataFrame(columns=["time_s", "rate"])
    t0 = min(p["time_ns"] for p in points) if t0_ns is None else t0_ns
    frames = []
    for series, group in enumerate(_by_series(points).values()):
        start = group[0].get("start_ns") or 0
        started = [start] if 0 < start < group[0]["time_ns"] else []
        times = np.array(started + [p["time_ns"] for p in group], dtype=np.float64)
        values = np.array([0.0] * len(started) + [p["value"] for p in group])
        if len(times) < 2:
            continue
        kept, min_gap = [0], 0.5 * np.median(np.diff(times))
        for i in range(1, len(times)):
            if times[i] - times[kept[-1]] >= min_gap:
                kept.append(i)
        times, values = times[kept], values[kept]
        if len(times) < 2:
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


def gauge_series(store, name: str, by: str = "rl.loop", where: dict | None = None,
                 t0_ns: int | None = None):
    """A gauge's points as a DataFrame: time (s from t0_ns, or from the first point), group,
    value."""
    import pandas as pd

    points = store.points(f"{PREFIX}{name}/gauge", where)
    if not points:
        return pd.DataFrame(columns=["time_s", by, "value"])
    start = min(p["time_ns"] for p in points) if t0_ns is None else t0_ns
    return pd.DataFrame([{"time_s": (p["time_ns"] - start) / 1e9,
                          by: p["attributes"].get(by, ""), "value": p["value"]}
                         for p in points])


def _by_series(points: list[dict]) -> dict:
    out: dict = {}
    for p in points:
        out.setdefault(_series_key(p), []).append(p)
    return out


def process_of(span: dict) -> str:
    """Which process made a span: the series' service.component (driver, learner, ...), or for
    spans of your own that set none, their service.name."""
    resource = span["resource"]
    return resource.get("service.component") or resource.get("service.name", "?")


def traces(store):
    """One row per trace: root span, start, duration, span count and the processes involved."""
    import pandas as pd

    rows: dict = {}
    for s in store.iter_spans():
        entry = rows.setdefault(s["trace_id"], {"trace_id": s["trace_id"], "spans": 0,
                                                "components": set(), "root": None})
        entry["spans"] += 1
        entry["components"].add(process_of(s))
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
    components = sorted({process_of(s) for s in spans})
    colours = {c: f"C{i}" for i, c in enumerate(components)}
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.35 * len(spans) + 1))
    for row, s in enumerate(spans):
        start = (s["start_ns"] - t0) / 1e6
        width = max((s["end_ns"] - s["start_ns"]) / 1e6, 0.01)
        component = process_of(s)
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


def slowest_iterations(store, n: int = 5):
    """The n slowest loop iterations (root rl.loop spans), slowest first."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r} is invalid: expected a positive integer")
    table = traces(store)
    if table.empty:
        return table
    return table.sort_values("duration_ms", ascending=False).head(n).reset_index(drop=True)


WORK_SPANS = ("rl.train", "rl.sample")  # a learner's fetch of batches, an actor's block


def slowest_work(store, n: int = 5, names: tuple[str, ...] = WORK_SPANS):
    """The n slowest spans of real work (by default the learner's rl.train and the actors'
    rl.sample), slowest first, with the run (rl.run.id) and the trace each belongs to, and
    `first`: whether it is its process's first span of that name (a learner's first update
    traces and compiles its graph).
    The root rl.loop spans are the driver's polls, which last as long as the poll interval
    whatever the work."""
    import pandas as pd

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r} is invalid: expected a positive integer")
    rows = [{"name": s["name"], "run": s["attributes"].get("rl.run.id"),
             "process": process_of(s), "instance": s["resource"].get("service.instance.id", "?"),
             "duration_ms": (s["end_ns"] - s["start_ns"]) / 1e6, "trace_id": s["trace_id"],
             "span_id": s["span_id"], "start_ns": s["start_ns"], "end_ns": s["end_ns"]}
            for s in store.iter_spans() if s["name"] in names]
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    frame["first"] = frame["start_ns"] == frame.groupby(["name", "instance"])["start_ns"].transform("min")
    return (frame.drop(columns="instance").sort_values("duration_ms", ascending=False).head(n)
            .reset_index(drop=True))


def silences(store, n: int = 5, min_s: float = 0.0):
    """The n longest silences of any process, longest first: the time between two consecutive
    things it stored (metric points, which its exporter sends every interval whatever the
    process does, and spans), from its first to its last. A process that hangs writes no span,
    so a hang is a gap rather than a slow span; its exporter stops with it, so its points stop
    too. One row a silence: the run (rl.run.id), the process (service.component), its
    service.instance.id, from, to (UTC) and seconds."""
    import pandas as pd

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r} is invalid: expected a positive integer")
    if min_s < 0:
        raise ValueError(f"min_s={min_s!r} is invalid: expected seconds >= 0")
    rows = []
    for table, when in (("points", "t.time_ns"), ("spans", "t.end_ns")):
        rows += store.query(
            "SELECT r.service_instance_id AS instance, json_extract(r.attributes, "
            "'$.\"service.component\"') AS process, json_extract(t.attributes, "
            f"'$.\"rl.run.id\"') AS run, {when} AS time_ns FROM {table} t JOIN resources r "
            "ON r.id = t.resource_id")
    columns = ["run", "process", "instance", "from", "to", "silent_s"]
    if not rows:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame(rows).dropna(subset=["time_ns"])
    # a process's run: the one its points name (a span of your own may carry none)
    frame["run"] = frame.groupby("instance")["run"].transform(
        lambda runs: runs.dropna().iloc[0] if runs.notna().any() else None)
    frame = frame.sort_values(["instance", "time_ns"]).drop_duplicates(["instance", "time_ns"])
    frame["previous_ns"] = frame.groupby("instance")["time_ns"].shift()
    gaps = frame.dropna(subset=["previous_ns"]).assign(
        silent_s=lambda f: (f["time_ns"] - f["previous_ns"]) / 1e9)
    gaps = gaps[gaps["silent_s"] >= min_s].sort_values("silent_s", ascending=False).head(n)
    return pd.DataFrame({
        "run": gaps["run"], "process": gaps["process"].fillna("?"), "instance": gaps["instance"],
        "from": pd.to_datetime(gaps["previous_ns"].astype("int64"), utc=True),
        "to": pd.to_datetime(gaps["time_ns"].astype("int64"), utc=True),
        "silent_s": gaps["silent_s"].round(1)}, columns=columns).reset_index(drop=True)


def outside_root(spans: list[dict]) -> list[dict]:
    """The spans of a trace that start before its root span or end after it. A driver's
    rl.loop span ends once it has sent its calls; work it started can run on past it."""
    roots = [s for s in spans if s["parent_span_id"] is None]
    if not roots:
        return []
    root = roots[0]
    return [s for s in spans if s is not root
            and (s["start_ns"] < root["start_ns"] or s["end_ns"] > root["end_ns"])]


def tensorboard_scalars(logdir, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one scalar in a TensorBoard log directory, by step; [] without it.

    Read with TensorBoard's own reader on its TensorFlow-free stub: it would otherwise import
    TensorFlow, a slow import in a notebook's kernel whose C++ start-up lines print to its
    stderr (`python benchmarks/process_startup.py` times TensorFlow's import).
    The stub is taken when a `tensorboard.compat.notf` module imports (the marker of
    TensorBoard's own build without TensorFlow, tensorboard/compat/__init__.py); a process that
    has imported TensorFlow already keeps reading with it.
    """
    if not Path(logdir).is_dir():
        raise FileNotFoundError(f"logdir={str(logdir)!r}: no such directory")
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    # Every point: by default the reader keeps a sample of 10 tensors a tag (size_guidance; 0 is all).
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    tags = acc.Tags()
    if tag in tags.get("tensors", []):  # tf.summary.scalar (TF 2) writes tensors
        return sorted((e.step, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag))
    if tag in tags.get("scalars", []):
        return sorted((e.step, float(e.value)) for e in acc.Scalars(tag))
    return []


class TelemetryLost(RuntimeError):
    """A process of a run ran and the store holds nothing of it."""


def processes_reported(store, run_id: str) -> dict[str, dict[str, int]]:
    """Every process that stored points or spans under rl.run.id = run_id:
    {service.instance.id: {"points": n, "spans": m}}."""
    found: dict[str, dict[str, int]] = {}
    for table in ("points", "spans"):
        rows = store.query(
            f"SELECT r.service_instance_id AS process, COUNT(*) AS n FROM {table} t JOIN "
            "resources r ON r.id = t.resource_id WHERE json_extract(t.attributes, "
            "'$.\"rl.run.id\"') = ? GROUP BY r.id", (run_id,))
        for row in rows:
            entry = found.setdefault(row["process"] or "?", {"points": 0, "spans": 0})
            entry[table] += row["n"]
    return found


def _named(instance_id: str) -> str:
    """The process name in an Ape-X instance id: `actor-0` of `actor-0-4242@host`."""
    head, _, _ = instance_id.partition("@")
    name, _, pid = head.rpartition("-")
    return name if pid.isdigit() and name else head


def check_every_process_reported(store, run_id: str, processes: list[str],
                                 exports: dict[str, list[dict]] | None = None,
                                 timeout_s: float = 10.0) -> dict[str, dict[str, int]]:
    """Wait until each named process of the run (driver, learner, actor-0, ...: the names an
    Ape-X process's service.instance.id starts with) has points or spans in the store, and
    return what each stored, by name. Raises TelemetryLost naming every process with nothing
    stored after timeout_s, with what its exporters said (`exports`, the run's
    telemetry_exports), so a refused exporter fails the run's check rather than a later cell."""
    import time

    if not processes:
        raise ValueError("processes=[] names no process to look for: expected names such as "
                         "['driver', 'learner', 'actor-0']")
    deadline = time.monotonic() + timeout_s
    while True:
        stored: dict[str, dict[str, int]] = {}
        for instance, counts in processes_reported(store, run_id).items():
            entry = stored.setdefault(_named(instance), {"points": 0, "spans": 0})
            entry["points"] += counts["points"]
            entry["spans"] += counts["spans"]
        missing = [name for name in processes if name not in stored]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if missing:
        from distrl.otel.export_outcomes import refusals

        said = refusals({name: (exports or {}).get(name, []) for name in missing})
        raise TelemetryLost(
            f"run {run_id}: no points or spans in the store from {', '.join(missing)} "
            f"({len(processes) - len(missing)} of {len(processes)} processes reported)"
            + (": " + "; ".join(said) if said else
               ": its exporters reported no refusal, so look for an endpoint or a run id of "
               "its own"))
    return {name: stored[name] for name in processes}
