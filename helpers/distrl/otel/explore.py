"""Looking at the metrics and traces of RL runs.

Through Cloud Monitoring's API, from the local collector or from a project (the same code):

    mon = Monitoring()                           # the local collector on 127.0.0.1:4317
    mon = Monitoring(project_id="my-project")    # Cloud Monitoring (application default login)
    mon.time_series("rl.train.loss", where={"rl.run.id": run_id})        # a DataFrame
    plot_golden_signals(mon.golden_signals(where={"rl.algorithm": "apex-dqn"}))

Straight from the local store (SQLite), for what Cloud Monitoring's API has no call for:

    store = CollectorStore("runs/otel.db")
    latency_percentiles(store, "rl.sample.duration")          # p50/p95/p99 per rl.loop
    slowest_iterations(store)                                  # traces, slowest first
    slowest_work(store)                                        # learner/actor spans, slowest first
    plot_trace_waterfall(store.spans(trace_id))                # one loop iteration across processes

And from the learner's TensorBoard logs, without TensorFlow:

    tensorboard_scalars("runs/job/tensorboard", "learner/loss")  # [(update, loss), ...]
"""

from __future__ import annotations

import datetime as dt
import re

import numpy as np

from distrl.gke.settings import check_project_id
from distrl.otel import conventions as otel
from distrl.otel import dashboard as dash

# The store's views and the alerts' evaluation live in their own modules; explore offers them
# too, as the one module a notebook imports to look at a run.
from distrl.otel.alerts import (  # noqa: F401
    evaluate_alert,
    firing_windows,
    reward_drop_windows,
    sample_rate_drops,
)
from distrl.otel.dashboard import PREFIX
from distrl.otel.store_views import (  # noqa: F401
    TelemetryLost,
    check_every_process_reported,
    counter_rate,
    gauge_series,
    latency_percentiles,
    latest_per_series,
    outside_root,
    plot_trace_waterfall,
    process_of,
    processes_reported,
    silences,
    slowest_iterations,
    slowest_work,
    tensorboard_scalars,
    traces,
)
from distrl.otel.token import bearer_header

LOCAL_PROJECT = "local"


# ---- Cloud Monitoring's API: the local collector or a project ----

_KINDS = {**{name: "histogram" for name in otel.LATENCY_HISTOGRAMS},
          **{name: "counter" for name in otel.COUNTERS},
          **{name: "gauge" for name in otel.GAUGES}}


# What an OTLP instrument becomes in Cloud Monitoring (Managed Service for Prometheus' naming):
# a Counter "counter" (cumulative), a Histogram "histogram", a Gauge "gauge", and an
# UpDownCounter "gauge" too, as its sum is not monotonic (the local collector does the same).
KINDS = ("counter", "gauge", "histogram")


def metric_type(name: str) -> str:
    """The Cloud Monitoring metric type of an instrument: an RL one by its name
    ("rl.train.loss"), any other as NAME/KIND ("shop.orders/counter"), or a full type as it
    is."""
    if name.startswith(PREFIX):
        return name
    if name in _KINDS:
        return f"{PREFIX}{name}/{_KINDS[name]}"
    base, _, kind = name.rpartition("/")
    if base and kind in KINDS:
        return f"{PREFIX}{name}"
    raise ValueError(f"metric {name!r} is unknown: expected an RL instrument ({sorted(_KINDS)}), "
                     f"NAME/KIND for any other (KIND: {', '.join(KINDS)}; an UpDownCounter is a "
                     f"gauge), or a full metric type ({PREFIX}NAME/KIND)")


MIN_CLOUD_ALIGNMENT_S = 60


def _with_bearer(channel, header: dict[str, str]):
    """The channel, each of its calls carrying the collector's bearer token (MetricService's
    calls are all unary)."""
    import grpc

    class Bearer(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            metadata = (*(details.metadata or ()), *header.items())
            return continuation(details._replace(metadata=metadata), request)

    return grpc.intercept_channel(channel, Bearer())


class NoSuchLabel(LookupError):
    """A query named a label its metric does not have: why an answer is empty."""

    def __init__(self, metric: str, missing: list[str], labels: list[str]):
        import difflib

        def hint(key: str) -> str:
            spelled = key.replace("_", ".")  # the seed's rl_run_id for the stored rl.run.id
            near = [spelled] if spelled in labels else difflib.get_close_matches(key, labels, 1)
            return f"; did you mean {near[0]!r}?" if near else ""

        super().__init__(
            "; ".join(f"no series of {metric} has the label {key!r}, so nothing matched"
                      f"{hint(key)}" for key in missing)
            + f" (its labels: {', '.join(sorted(labels))})")
        self.metric, self.missing, self.labels = metric, missing, labels


class Monitoring:
    """google-cloud-monitoring's MetricServiceClient, and DataFrames of what it returns.

    Monitoring() talks to the local collector (`endpoint`, with the bearer token of
    `token_file`, LocalCollector's c.token_file); Monitoring(project_id="my-project") to Cloud
    Monitoring with application default credentials. Every other call is the same. `client`
    and `project_name` are there for your own calls. The id is checked before anything is sent.
    """

    def __init__(self, project_id: str | None = None, *, endpoint: str = "127.0.0.1:4317",
                 token_file=None, credentials=None, client_options=None):
        from google.cloud import monitoring_v3

        if project_id is not None:
            check_project_id(project_id)  # (None: the local collector)
        self.project_name = f"projects/{project_id or LOCAL_PROJECT}"
        self.cloud = project_id is not None
        if project_id is None:
            import grpc
            from google.cloud.monitoring_v3.services.metric_service.transports import (
                MetricServiceGrpcTransport,
            )

            target = re.sub(r"^https?://", "", endpoint)
            if not re.fullmatch(r"[\w.\-\[\]:]+:\d+", target):
                raise ValueError(f"endpoint={endpoint!r} is invalid: expected HOST:PORT of the "
                                 "local collector, e.g. 127.0.0.1:4317")
            channel = grpc.insecure_channel(target)
            if token_file is not None:
                channel = _with_bearer(channel, bearer_header(token_file))
            self.client = monitoring_v3.MetricServiceClient(
                transport=MetricServiceGrpcTransport(channel=channel))
        else:
            if token_file is not None:
                raise ValueError(f"token_file={str(token_file)!r} with project_id: Cloud "
                                 "Monitoring takes your Google credentials, not a token file")
            # credentials / client_options: as MetricServiceClient takes them (None: the
            # application default login and monitoring.googleapis.com).
            self.client = monitoring_v3.MetricServiceClient(credentials=credentials,
                                                            client_options=client_options)

    def metric_types(self, name_prefix: str = ""):
        """The metric types OTLP metrics became (yours too), whose instrument name starts with
        name_prefix ("rl.": the RL conventions' only): type, kind, value type, unit and label
        keys."""
        import pandas as pd
        from google.api import metric_pb2

        descriptor = metric_pb2.MetricDescriptor  # (the client returns these raw protobufs)
        rows = [{"metric_type": d.type, "metric_kind": descriptor.MetricKind.Name(d.metric_kind),
                 "value_type": descriptor.ValueType.Name(d.value_type), "unit": d.unit,
                 "labels": ", ".join(label.key for label in d.labels)}
                for d in self.client.list_metric_descriptors(request={
                    "name": self.project_name,
                    "filter": f'metric.type = starts_with("{PREFIX}{name_prefix}")'})]
        return pd.DataFrame(rows)

    def request(self, metric: str, *, where: dict | None = None, minutes: float = 30.0,
                end: dt.datetime | None = None, aligner: str = "ALIGN_NONE",
                reducer: str = "REDUCE_NONE", group_by: tuple[str, ...] = (),
                alignment_s: int = 60) -> dict:
        """The ListTimeSeries request for a metric, as a dict the client takes."""
        from google.cloud import monitoring_v3

        names = monitoring_v3.Aggregation
        if aligner not in names.Aligner.__members__:
            raise ValueError(f"aligner={aligner!r} is invalid: expected one of "
                             f"{list(names.Aligner.__members__)}")
        if reducer not in names.Reducer.__members__:
            raise ValueError(f"reducer={reducer!r} is invalid: expected one of "
                             f"{list(names.Reducer.__members__)}")
        if not isinstance(alignment_s, int) or isinstance(alignment_s, bool) or alignment_s < 1:
            raise ValueError(f"alignment_s={alignment_s!r} is invalid: expected a whole number "
                             "of seconds >= 1 (Cloud Monitoring: >= 60)")
        if isinstance(group_by, str) or not all(isinstance(k, str) for k in group_by):
            raise ValueError(f"group_by={group_by!r} is invalid: expected a tuple of label "
                             "keys, e.g. ('rl.run.id',)")
        filter_ = " AND ".join([f'metric.type = "{metric_type(metric)}"',
                                *dash.label_terms(where)])
        aggregation = (None if aligner == "ALIGN_NONE" else
                       dash.aggregation_json(aligner, reducer, alignment_s, tuple(group_by)))
        return self._request(filter_, aggregation, minutes, end)

    def _request(self, filter_: str, aggregation: dict | None, minutes: float,
                 end: dt.datetime | None) -> dict:
        """A ListTimeSeries request from a filter and an aggregation in dashboard JSON form."""
        if not isinstance(minutes, (int, float)) or not minutes > 0:
            raise ValueError(f"minutes={minutes!r} is invalid: expected a positive number")
        end = end or dt.datetime.now(dt.UTC)
        request = {"name": self.project_name, "filter": filter_,
                   "interval": {"start_time": end - dt.timedelta(minutes=minutes),
                                "end_time": end}}
        if aggregation is not None:
            period = int(str(aggregation.get("alignmentPeriod", "60s")).rstrip("s"))
            if self.cloud and period < MIN_CLOUD_ALIGNMENT_S:
                raise ValueError(
                    f"alignment_s={period}: Cloud Monitoring refuses alignment periods under "
                    f"{MIN_CLOUD_ALIGNMENT_S} s ('The value must be at least 60 seconds', "
                    "cloud.google.com/monitoring/api/ref_v3/rest/v3/Aggregation); use 60 or "
                    "more (the local collector takes shorter ones)")
            request["aggregation"] = {
                "alignment_period": {"seconds": period},
                "per_series_aligner": aggregation["perSeriesAligner"],
                "cross_series_reducer": aggregation.get("crossSeriesReducer", "REDUCE_NONE"),
                "group_by_fields": aggregation.get("groupByFields", [])}
        return request

    def time_series(self, metric: str, **query):
        """A DataFrame with one row per point: time, value, metric and resource labels.

        query: where, minutes, end, aligner, reducer, group_by, alignment_s (see request()).
        Distribution points give their mean as value and their count. A `where` or `group_by`
        label the metric does not have raises NoSuchLabel, naming the labels it has, where the
        answer is empty or its groups lack that label (Cloud Monitoring answers such a query
        with nothing, or with one group, and says nothing).
        """
        frame = _answer(self.client.list_time_series, self.request(metric, **query))
        # an empty answer, or groups without their label: was a label misspelled?
        keys = [*(query.get("where") or {})] if frame.empty else []
        keys += [k for k in query.get("group_by", ()) if frame.empty or k not in frame.columns]
        self._check_labels(metric, keys)
        return frame

    def _check_labels(self, metric: str, keys: list[str]) -> None:
        """NoSuchLabel where a key is not among the labels of the metric's descriptor (none
        when the type itself is not there yet: then nothing was written)."""
        from google.api_core import exceptions

        if not keys:
            return
        name = f"{self.project_name}/metricDescriptors/{metric_type(metric)}"
        try:
            labels = [label.key for label in self.client.get_metric_descriptor(name=name).labels]
        except exceptions.NotFound:
            return
        missing = [k for k in dict.fromkeys(keys) if k not in labels]
        if missing:
            raise NoSuchLabel(metric, missing, labels)

    def query(self, filter: str, aggregation: dict, minutes: float = 30.0,
              end: dt.datetime | None = None):
        """A DataFrame of a raw filter and an aggregation in dashboard JSON form (what the
        dashboard's tiles and the alert policies hold)."""
        request = self._request(filter, aggregation, minutes, end)
        return _answer(self.client.list_time_series, request)

    def golden_signals(self, *, where: dict | None = None, group_by: str = otel.RL_RUN_ID,
                       minutes: float = 30.0, alignment_s: int = 60,
                       end: dt.datetime | None = None,
                       percentiles: tuple[str, ...] = ("p50", "p95", "p99")) -> dict:
        """Every chart of dashboard.CHARTS as a DataFrame (by chart title), filtered by the
        chart's own label equalities and `where` (as dashboard.chart_filter does) and grouped
        by `group_by` (and by rl.loop for the latency charts), with the latency `percentiles`
        asked for (fewer lines where many groups share a panel)."""
        known = {_statistic(r) for chart in dash.CHARTS if chart.signal == "latency"
                 for r in chart.reducers}
        if not percentiles or not set(percentiles) <= known:
            raise ValueError(f"percentiles={percentiles!r}: expected some of {sorted(known)}")
        frames = {}
        for chart in dash.CHARTS:
            # Latency charts keep their per-phase lines (rl.loop); group_by may be rl.loop too.
            phases = (otel.RL_LOOP,) if otel.RL_LOOP in chart.group_by else ()
            groups = tuple(dict.fromkeys((*phases, group_by)))
            chart_where = {**dict(chart.where), **(where or {})}  # the evaluator's, say
            parts = []
            for reducer in chart.reducers:
                if chart.signal == "latency" and _statistic(reducer) not in percentiles:
                    continue
                df = self.time_series(chart.metric_type, where=chart_where, minutes=minutes,
                                      aligner=chart.aligner, reducer=reducer, group_by=groups,
                                      alignment_s=alignment_s, end=end)
                if not df.empty:
                    df["statistic"] = _statistic(reducer)
                    parts.append(df)
            title = chart.title  # a latency title names the percentiles drawn
            if chart.signal == "latency":
                title = title.replace("p50/p95/p99", "/".join(
                    p for p in ("p50", "p95", "p99") if p in percentiles))
            frames[title] = (_concat(parts), chart, groups)
        return frames


def _statistic(reducer: str) -> str:
    return f"p{reducer.rsplit('_', 1)[1]}" if "PERCENTILE" in reducer else reducer[7:].lower()


def _concat(parts):
    import pandas as pd

    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _answer(list_time_series, request):
    """series_frame of every page. A metric type that does not exist (yet) is NOT_FOUND in
    Cloud Monitoring: no rows, and a warning when the answer names the type meant (the local
    collector's hint for the seed's underscored forms). The hints a page carries
    (execution_errors: an underscored label key) become warnings too."""
    import warnings

    from google.api_core.exceptions import NotFound

    try:
        pager = list_time_series(request=request)
        series = []
        for page in pager.pages:
            for error in page.execution_errors:
                warnings.warn(error.message, stacklevel=3)
            series += list(page.time_series)
    except NotFound as err:
        if "did you mean" in err.message:
            warnings.warn(err.message, stacklevel=3)
        series = []
    return series_frame(series)


def series_frame(time_series):
    """TimeSeries (from list_time_series) as a DataFrame, one row per point, oldest first."""
    import pandas as pd

    rows = []
    for ts in time_series:
        labels = dict(ts.metric.labels)
        resource = {f"resource.{k}": v for k, v in ts.resource.labels.items()}
        for p in ts.points:
            value, count = _point_value(p.value)
            rows.append({"time": pd.Timestamp(p.interval.end_time), "value": value,
                         "count": count, **labels, **resource})
    if not rows:
        return pd.DataFrame(columns=["time", "value"])
    return pd.DataFrame(rows).sort_values("time", kind="stable").reset_index(drop=True)


def _point_value(value) -> tuple[float, int | None]:
    kind = type(value).pb(value).WhichOneof("value")
    if kind == "distribution_value":
        return value.distribution_value.mean, value.distribution_value.count
    return float(getattr(value, kind)), None


class CompactFigure:
    """A figure as a PNG of at most 256 colours, which a notebook displays (`_repr_png_`) and
    stores: a dozen panels of lines in a third of the bytes of matplotlib's own PNG."""

    def __init__(self, png: bytes):
        self.png = png

    def _repr_png_(self) -> bytes:
        return self.png


def compact(fig=None, colors: int = 256) -> CompactFigure:
    """The figure (default: the current one) as a CompactFigure, and closed: the last line of a
    notebook cell, in place of plt.show(), for figures of many panels."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    if not (isinstance(colors, int) and 2 <= colors <= 256):
        raise ValueError(f"colors={colors!r}: expected an integer from 2 to 256")
    fig = fig or plt.gcf()
    raw = io.BytesIO()
    fig.savefig(raw, format="png", bbox_inches="tight")
    plt.close(fig)
    out = io.BytesIO()
    Image.open(raw).convert("RGB").quantize(colors=colors).save(out, format="PNG", optimize=True)
    return CompactFigure(out.getvalue())


def plot_golden_signals(frames: dict, axes=None, spans: list | None = None):
    """One panel per chart of golden_signals(): a line per group (and per percentile).
    `spans`: (label, start, end) datetimes shaded on every panel, for frames of one group."""
    panels = []
    for title, (df, chart, groups) in frames.items():
        if chart.metric == "rl.train.mfu":  # a fraction on the wire, a percentage to read
            df = df.assign(value=100 * df["value"]) if not df.empty else df
            title = f"{title}, in %"  # the dashboard's tile of that title draws the fraction
        panels.append((f"{chart.signal}: {title}", _AXIS_WORDS.get(chart.metric) or
                       _AXIS_WORDS.get(chart.unit, chart.unit), df, list(groups)))
    return _plot_panels(panels, columns=4, size=(3.6, 2.6), axes=axes, spans=spans)


# A panel's y axis in words, by metric or by unit (the charts' units are UCUM: "1", "1/s").
_AXIS_WORDS = {"ms": "milliseconds", "1/s": "per second",
               "rl.environment.reward.mean": "return", "rl.environment.episode.length.mean":
               "steps", "rl.train.loss": "loss", "rl.train.mfu": "% of the device's peak"}


def plot_time_series(frame, *, by: tuple[str, ...] = (), title: str = "", unit: str = "",
                     ax=None):
    """Any metric's time_series() frame (a metric of your own too) as lines against seconds
    since its first point: one line per value of the `by` labels."""
    if isinstance(by, str):
        raise ValueError(f"by={by!r} is invalid: expected a tuple of label keys, e.g. ('shop',)")
    df = frame if frame.empty or "statistic" in frame.columns else frame.assign(statistic="")
    return _plot_panels([(title, unit, df, list(by))], columns=1, size=(6.0, 3.0),
                        axes=None if ax is None else [ax])


def _group_origins(panels: list) -> tuple[list[str], dict[tuple, object]]:
    """The group keys every panel has (a run, not its loops) and each group's first point in
    any panel: the zero of its time axis in all of them, so a run's panels share one clock and
    runs made at different times line up."""
    drawn = [(df, [k for k in keys if k in df.columns]) for _, _, df, keys in panels
             if not df.empty]
    common = [k for k in (drawn[0][1] if drawn else []) if all(k in keys for _, keys in drawn)]
    origins: dict[tuple, object] = {}
    for df, _ in drawn:
        firsts = df.groupby(common)["time"].min().items() if common else [((), df["time"].min())]
        for group, t in firsts:
            group = group if isinstance(group, tuple) else (group,)
            origins[group] = min(origins.get(group, t), t)
    return common, origins


def _usual_step(panels: list) -> float | None:
    """The figure's usual spacing of points in seconds (its alignment period), from all its
    series: a single series of a few points cannot tell its own gaps."""

    steps = [part["time"].sort_values().diff().dt.total_seconds().dropna().to_numpy()
             for _, _, df, keys in panels if not df.empty
             for _, part in df.groupby(["statistic", *[k for k in keys if k in df.columns]])]
    steps = np.concatenate(steps) if steps else np.array([])
    steps = steps[steps > 0]
    return float(np.median(steps)) if len(steps) else None


def _broken_at_gaps(x, y, step: float | None):
    """x and y with a gap (NaN) where more than one `step` of points is missing: a line drawn
    across a stretch with no data would show values nobody reported."""

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if step is None or len(x) < 2:
        return x, y
    cut = np.flatnonzero(np.diff(x) > 1.5 * step) + 1
    return np.insert(x, cut, np.nan), np.insert(y, cut, np.nan)


def _plot_panels(panels: list, columns: int, size: tuple[float, float], axes=None,
                 spans: list | None = None):
    """Draw (title, y label, DataFrame, group keys) panels: a line per statistic and group,
    each group from its own first point (in any panel), and `spans` shaded."""
    import matplotlib.pyplot as plt
    import pandas as pd

    common, origins = _group_origins(panels)
    step = _usual_step(panels)
    if spans and len(origins) != 1:
        raise ValueError(f"spans need the frames of one group, got {len(origins)} groups: "
                         "filter the frames to one run (where=...) to mark its events")
    if axes is None:
        rows = -(-len(panels) // columns)
        # Constrained: titles never overlap. 72 dpi: a dozen panels stay a small image in a
        # stored notebook.
        _, grid = plt.subplots(rows, columns, figsize=(size[0] * columns, size[1] * rows),
                               squeeze=False, layout="constrained", dpi=72)
        axes = grid.ravel()
    styles = {"p50": ":", "p95": "-", "p99": "--"}
    # One colour a group, the same in every panel, and one legend for the figure: a legend in
    # each small panel was too small to read and lay over the lines.
    names = sorted({" ".join(map(str, row)) for _, _, df, keys in panels if not df.empty
                    for row in df[[k for k in keys if k in df.columns]].drop_duplicates()
                    .itertuples(index=False)})
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    stats_used: set[str] = set()
    for ax, (title, ylabel, df, keys) in zip(axes, panels):
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        for _, start, end in spans or []:
            [origin] = origins.values()
            ax.axvspan((pd.Timestamp(start) - origin).total_seconds(),
                       (pd.Timestamp(end) - origin).total_seconds(), color="grey", alpha=0.2)
        if df.empty:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            continue
        keys = [k for k in keys if k in df.columns]
        starts = df[common].apply(tuple, axis=1).map(origins) if common else origins[()]
        df = df.assign(elapsed_s=(df["time"] - starts).dt.total_seconds())
        for (stat, *group), part in df.groupby(["statistic", *keys], sort=True):
            part = part.sort_values("elapsed_s")
            stats_used.add(stat)
            ax.plot(*_broken_at_gaps(part["elapsed_s"], part["value"], step), styles.get(stat, "-"),
                    color=colors.get(" ".join(map(str, group)), "C0"),
                    marker="." if len(part) < 20 else None)  # a few points: show each
        ax.set_xlabel("s since the group's first point", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes)[len(panels):]:
        ax.axis("off")
    _figure_legend(list(axes)[0].figure, colors, [s for s in styles if s in stats_used], styles,
                   [label for label, _, _ in spans or []])
    return axes


def _figure_legend(fig, colors: dict, stats: list[str], styles: dict, spans: list[str]) -> None:
    """One legend under the figure: a colour a group, a line style a percentile, the spans."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Line2D([], [], color=c, label=name) for name, c in colors.items() if name]
    handles += [Line2D([], [], color="grey", linestyle=styles[s], label=s) for s in stats]
    handles += [Patch(color="grey", alpha=0.2, label=label) for label in spans]
    if handles:  # below the panels where the layout makes room for it (constrained)
        outside = isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
        fig.legend(handles=handles, loc="outside lower center" if outside else "lower center",
                   fontsize=9, ncol=min(len(handles), 6), frameon=False)


def preview_dashboard(monitoring: Monitoring, board: dict, *, where: dict | None = None,
                      minutes: float = 30.0, alignment_s: int | None = None,
                      end: dt.datetime | None = None):
    """Run every tile of a dashboard (dashboard.dashboard() or its JSON) through `monitoring`
    and draw it; `where` adds the dashboard filters' label values, `alignment_s` overrides
    the tiles' period (short local runs). Returns {tile title: DataFrame}."""
    if not isinstance(board, dict) or "mosaicLayout" not in board:
        raise ValueError("board is invalid: expected a dashboard dict with mosaicLayout "
                         "(dashboard.dashboard(), or k8s/monitoring/dashboard.json loaded)")
    tiles: dict = {}
    for title, filter_, aggregation in dash.tile_queries(board):
        if where:
            filter_ = " AND ".join([filter_, *dash.label_terms(where)])
        if alignment_s is not None:
            aggregation = {**aggregation, "alignmentPeriod": f"{alignment_s}s"}
        df = monitoring.query(filter_, aggregation, minutes=minutes, end=end)
        df["statistic"] = _statistic(aggregation.get("crossSeriesReducer", "REDUCE_NONE"))
        tiles.setdefault(title, []).append(df)
    tiles = {title: _concat([p for p in parts if not p.empty]) for title, parts in tiles.items()}
    _plot_panels([(title, "", df, [c for c in df.columns if c.startswith("rl.")])
                  for title, df in tiles.items()], columns=4, size=(3.6, 2.4))
    return tiles
