"""What the notebooks' prose states holds for any run: a figure in markdown is a constant (a
default, a documented limit, a cloud fact), listed below with what it is; a figure of the run is
printed by a code cell from the run's own data. The executed notebooks' printed figures are
checked against their results in tests/test_notebooks.py."""

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
UNIT = (r"(?:s|ms|µs|seconds?|minutes?|min|hours?|h|%|k|x|env steps|steps|updates|transitions"
        r"|episodes|GB|GiB|MiB)\b")
FIGURE = re.compile(r"(?<![\w.`/=$-])(?:about |around |~)?\d[\d,.]*(?:\s*[-–]\s*\d[\d,.]*)?\s*"
                    + UNIT)

# Figures that are not a run's: (notebook, figure) -> what it is.
CONSTANTS = {
    ("01", "2 GB"): "what the notebook needs, a requirement",
    ("01", "30 s"): "Ray's fixed wait for a GCS and a raylet (ray/_private/node.py)",
    ("01", "20 ms"): "init_local_ray's poll of the raylet's registration (REGISTRATION_POLL_S)",
    ("01", "1 s"): "ApexConfig.eval_interval_s's default",
    ("01", "2 s"): "the 100-line loop's evaluation interval, in its code",
    ("01", "0.25 s"): "the driver's poll interval (REPORT_INTERVAL_S)",
    ("01", "27,000 steps"): "where a greedy evaluation ends (rl.actor.EVAL_MAX_STEPS)",
    ("02", "128 transitions"): "ApexConfig.batch_size's default",
    ("02", "60 s"): "the OTel SDK's default export interval",
    ("02", "10 s"): "the local export interval; the top of the latency buckets",
    ("02", "30 s"): "the pods' OTEL_METRIC_EXPORT_INTERVAL",
    ("02", "0.01 ms"): "the bottom of conventions.LATENCY_BUCKETS_MS",
    ("03", "744 hours"): "a month of the GKE free tier's credit",
    ("03", "30 s"): "the pods' OTEL_METRIC_EXPORT_INTERVAL",
    ("03", "0.5 GB"): "Artifact Registry's free storage",
    ("03", "100 GB"): "GKE's default boot disk",
    ("03", "about 8 GB"): "the image's size that cost.monthly_costs assumes (image_gb)",
    ("03", "30 seconds"): "a Spot VM's preemption notice (GKE docs)",
    ("03", "10 minutes"): "gcloud builds submit's default timeout",
    ("03", "2 h"): "gke.settings.BUILD_TIMEOUT",
    ("04", "about 30 seconds"): "a Spot VM's preemption notice (GKE docs)",
    ("05", "60 s"): "the OTel SDK's default export interval",
    ("05", "10 s"): "the local export interval; the top of the latency buckets",
    ("05", "30 s"): "the pods' OTEL_METRIC_EXPORT_INTERVAL",
    ("05", "0.01 ms"): "the bottom of conventions.LATENCY_BUCKETS_MS",
}


def prose_figures() -> dict[tuple[str, str], list[str]]:
    """(notebook number, figure) -> where it stands, for every figure in the notebooks'
    markdown outside code spans and the generated listings."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] != "markdown" or any(
                    t.startswith("generated:") for t in cell["metadata"].get("tags", [])):
                continue
            text = re.sub(r"```.*?```", "", "".join(cell["source"]), flags=re.S)
            text = re.sub(r"`[^`]*`", "", text)
            for match in FIGURE.finditer(text):
                context = text[max(0, match.start() - 60):match.end() + 30].replace("\n", " ")
                found.setdefault((path.name[:2], match.group(0)), []).append(
                    f"{path.name} cell {i}: ...{context}...")
    return found


def test_every_figure_in_the_notebooks_prose_is_a_constant_not_a_run_figure():
    found = prose_figures()
    unexplained = {key: where for key, where in found.items() if key not in CONSTANTS}
    assert not unexplained, (
        "a figure in prose: print it from the run in a code cell (or word it for any run); if "
        "it is a constant, add it to CONSTANTS with what it is:\n"
        + "\n".join(f"{key}: {where[0]}" for key, where in unexplained.items()))
    stale = sorted(set(CONSTANTS) - set(found))
    assert not stale, f"CONSTANTS lists figures no notebook states any more: {stale}"


def test_the_lint_catches_the_stale_figures_it_was_written_for():
    for text in ("the full run (about 4 minutes on 2 cores)", "from 390 to 110 at 60-70 s",
                 "64 env steps per update", "noticed in about 15-30 s", "rose to 10.3 k"):
        assert FIGURE.search(text), text
    for text in ("`MAX_SECONDS`", "notebook 05", "Python 3.11", "a 64x64 network"):
        assert not FIGURE.search(re.sub(r"`[^`]*`", "", text)), text


def _notebook_code(number: str) -> str:
    path = next(NOTEBOOKS.glob(f"{number}-*.ipynb"))
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "code")


def test_the_constants_the_prose_states_are_what_the_code_uses():
    """A constant the prose states that the code defines is the code's value, so a changed
    default cannot leave the prose behind. (Cloud facts and requirements have no code value.)"""
    import inspect

    from distrl import ray_runtime
    from distrl.apex import driver
    from distrl.gke import cost, manifests, settings
    from distrl.otel import conventions
    from distrl.rl import actor
    from distrl.rl.config import ApexConfig

    pods_export_ms = {e["name"]: e.get("value") for e in manifests._env(manifests.DEFAULTS)}[
        "OTEL_METRIC_EXPORT_INTERVAL"]
    stated = {  # (notebook, figure) -> (the code's value, the figure's value), in one unit
        ("01", "30 s"): (ray_runtime.RAYLET_REGISTRATION_S, 30),
        ("01", "20 ms"): (ray_runtime.REGISTRATION_POLL_S * 1e3, 20),
        ("01", "1 s"): (ApexConfig().eval_interval_s, 1),
        ("01", "2 s"): ("last_eval > 2.0" in _notebook_code("01"), True),
        ("01", "0.25 s"): (driver.REPORT_INTERVAL_S, 0.25),
        ("01", "27,000 steps"): (actor.EVAL_MAX_STEPS, 27_000),
        ("02", "10 s"): ((conventions.DEFAULT_EXPORT_INTERVAL_MS,
                          conventions.LATENCY_BUCKETS_MS[-1]), (10_000, 10_000)),
        ("02", "0.01 ms"): (conventions.LATENCY_BUCKETS_MS[0], 0.01),
        ("02", "30 s"): (int(pods_export_ms), 30_000),
        ("03", "30 s"): (int(pods_export_ms), 30_000),
        ("03", "2 h"): (settings.BUILD_TIMEOUT, "7200s"),
        ("03", "about 8 GB"): (inspect.signature(cost.monthly_costs).parameters["image_gb"].default,
                               8.0),
        ("05", "10 s"): ((conventions.DEFAULT_EXPORT_INTERVAL_MS,
                          conventions.LATENCY_BUCKETS_MS[-1]), (10_000, 10_000)),
        ("05", "30 s"): (int(pods_export_ms), 30_000),
        ("05", "0.01 ms"): (conventions.LATENCY_BUCKETS_MS[0], 0.01),
    }
    assert set(stated) <= set(CONSTANTS)
    wrong = {key: values for key, values in stated.items() if values[0] != values[1]}
    assert not wrong, f"the prose states these figures, the code has other values: {wrong}"
