"""Run the notebooks with papermill, small parameters, and check what they recorded."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distrl.tutorial import NOTEBOOKS_DIR, run_notebook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
KERNEL = "distrl"


@pytest.fixture(scope="session")
def kernel():
    """The project's own environment as a Jupyter kernel (make install registers it too)."""
    from jupyter_client.kernelspec import KernelSpecManager

    if KERNEL not in KernelSpecManager().find_kernel_specs():
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix",
                        "--name", KERNEL], check=True, capture_output=True)
    return KERNEL


def test_notebooks_are_stored_without_outputs():
    import nbformat

    for path in sorted(NOTEBOOKS_DIR.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: one cell tagged 'parameters'"
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, path.name


def test_01_local_apex_dqn(kernel, tmp_path: Path):
    out_dir = tmp_path / "run"
    executed = run_notebook(
        NOTEBOOKS_DIR / "01-local-apex-dqn.ipynb", tmp_path,
        {"OUTPUT_DIR": str(out_dir), "TARGET_RETURN": 100.0, "MAX_SECONDS": 120.0,
         "EVAL_EPISODES": 5, "ANIMATION_FRAMES": 10}, kernel=kernel, cell_timeout_s=600)
    assert executed.exists()
    results = json.loads((out_dir / "results.json").read_text())
    assert results["reached_target"] is True
    assert results["best_eval_return"] >= 100
    assert results["env_steps"] > 0 and results["learner_updates"] > 0
    assert len(results["actor_epsilons"]) == results["config"]["num_actors"]
    # The animation cell rendered frames of the trained agent.
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    html = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.get("output_type") == "display_data" and "text/html" in o.get("data", {})]
    assert any("<img" in o["data"]["text/html"] or "animation" in o["data"]["text/html"]
               for o in html)


def test_tutorial_runner_refuses_what_it_cannot_run(capsys):
    from distrl.tutorial import main

    assert main(["--only", "99"]) == 2
    assert "no notebooks matched ['99']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["-p", "not-a-parameter"])


def test_02_instrument_with_opentelemetry(kernel, tmp_path: Path):
    out_dir = tmp_path / "run"
    executed = run_notebook(
        NOTEBOOKS_DIR / "02-instrument-with-opentelemetry.ipynb", tmp_path,
        {"OUTPUT_DIR": str(out_dir), "TARGET_RETURN": 100.0, "MAX_SECONDS": 120.0,
         "COLLECTOR_PORT": 0, "EXPORT_INTERVAL_S": 1.0, "OVERHEAD_SECONDS": 12.0},
        kernel=kernel, cell_timeout_s=600)
    assert executed.exists()
    summary = json.loads((out_dir / "telemetry_summary.json").read_text())
    assert summary["metric_types"] >= 14 and summary["points"] > 0
    assert summary["traces"] > 0 and summary["processes"] >= 6  # driver, learner, 2 actors, ...
    assert summary["best_eval_return"] >= 100
    assert set(summary["overhead_env_steps_per_s"]) == {"off", "on"}
