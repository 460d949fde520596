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
    ("02", "128 transitions"): "ApexConfig.batch_size's default",
    ("02", "60 s"): "the OTel SDK's default export interval",
    ("02", "10 s"): "the local export interval; the top of the latency buckets",
    ("02", "5 s"): "this notebook's EXPORT_INTERVAL_S",
    ("02", "30 s"): "the pods' OTEL_METRIC_EXPORT_INTERVAL",
    ("02", "0.01 ms"): "the bottom of telemetry.LATENCY_BUCKETS_MS",
    ("03", "744 hours"): "a month of the GKE free tier's credit",
    ("03", "30 s"): "the pods' OTEL_METRIC_EXPORT_INTERVAL",
    ("03", "0.5 GB"): "Artifact Registry's free storage",
    ("03", "100 GB"): "GKE's default boot disk",
    ("03", "about 8 GB"): "the image's size that cost.monthly_costs assumes (image_gb)",
    ("03", "30 seconds"): "a Spot VM's preemption notice (GKE docs)",
    ("03", "10 minutes"): "gcloud builds submit's default timeout",
    ("03", "2 h"): "gke.BUILD_TIMEOUT",
    ("04", "about 30 seconds"): "a Spot VM's preemption notice (GKE docs)",
    ("05", "60 s"): "the OTel SDK's default export interval",
    ("05", "10 s"): "the local export interval; the top of the latency buckets",
    ("05", "30 s"): "the pods' OTEL_METRIC_EXPORT_INTERVAL",
    ("05", "0.01 ms"): "the bottom of telemetry.LATENCY_BUCKETS_MS",
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
