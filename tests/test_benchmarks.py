"""Every script in benchmarks/ runs: each in its --smoke mode (seconds, tiny settings), so that a
changed signature or a renamed field breaks CI rather than a reader's `make bench`. The figures
they print are not judged here (benchmarks print figures; tests never time anything)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))

pytestmark = [pytest.mark.slow, pytest.mark.benchmarks, pytest.mark.timeout(900)]


def test_every_script_in_benchmarks_is_run_here():
    # A new benchmark is picked up by the glob; this guards against the glob finding nothing.
    assert {"time_to_solve.py", "sweep.py", "baseline_dqn.py"} <= set(SCRIPTS)


def test_make_bench_runs_every_script_or_says_why_not():
    sys.path.insert(0, str(BENCHMARKS.parent / "tools"))
    try:
        from bench import BENCHMARKS as BENCH
        from bench import NOT_IN_BENCH, result_path
    finally:
        sys.path.remove(str(BENCHMARKS.parent / "tools"))
    ran = {name.split()[0] for name in BENCH}
    assert ran.isdisjoint(NOT_IN_BENCH)
    assert ran | set(NOT_IN_BENCH) == set(SCRIPTS)
    assert len({result_path(name) for name in BENCH}) == len(BENCH)  # one record each


def test_every_record_in_results_names_its_command_and_a_script_here():
    """benchmarks/results/*.txt are make bench's records: each opens with the command that
    printed it, a script of this tree, and the commit it ran on."""
    records = sorted((BENCHMARKS / "results").glob("*.txt"))
    assert records
    for record in records:
        command, provenance = record.read_text().splitlines()[:2]
        assert command.startswith("$ python benchmarks/"), (record.name, command)
        assert (BENCHMARKS.parent / command.split()[2]).is_file(), (record.name, command)
        assert provenance.startswith("# commit "), (record.name, provenance)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_runs_its_smoke_mode(script, tmp_path):
    python = sys.executable
    if script.startswith("baseline_"):  # Stable-Baselines3 and torch live in a venv of their own
        sys.path.insert(0, str(BENCHMARKS))
        try:
            from time_to_solve import baseline_python
        finally:
            sys.path.remove(str(BENCHMARKS))
        python = str(baseline_python())
    run = subprocess.run([python, str(BENCHMARKS / script), "--smoke"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{script} --smoke:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    assert "Traceback" not in run.stderr, run.stderr[-4000:]
    assert "RuntimeWarning" not in run.stderr, run.stderr[-4000:]
    assert run.stdout.strip(), f"{script} --smoke printed no figures"


def test_stability_figures_keep_the_gain_of_negative_returns_and_refuse_no_gain():
    """benchmarks/stability.py's share of the gain kept: (last - first) / (best - first), so
    that Acrobot's negative returns read as CartPole's do; none where nothing was learned."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from stability import run_figures
    finally:
        sys.path.remove(str(BENCHMARKS))
    acrobot = run_figures([{"time_s": 10.0, "mean_return": -500.0},
                           {"time_s": 20.0, "mean_return": -100.0},
                           {"time_s": 30.0, "mean_return": -180.0}])
    assert acrobot["best"] == -100.0 and acrobot["best_at_s"] == 20.0
    assert acrobot["kept"] == pytest.approx(320 / 400)
    assert acrobot["mean"] == pytest.approx((10 * -300 + 10 * -140) / 20)
    flat = run_figures([{"time_s": 5.0, "mean_return": 9.0}, {"time_s": 6.0, "mean_return": 8.0}])
    assert flat["kept"] is None and flat["best"] == 9.0
    assert run_figures([]) is None


def test_a_run_meets_the_stability_goal_by_its_end_or_by_a_kept_best_within_the_noise():
    """benchmarks/stability.py's goal: the last evaluation kept 0.9 of the gain, or the kept
    best, played on held-out episodes, is no lower than two standard errors of the difference
    below the best evaluation."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from stability import goal, run_figures
    finally:
        sys.path.remove(str(BENCHMARKS))
    fell = run_figures([{"time_s": 1.0, "mean_return": 0.0}, {"time_s": 2.0, "mean_return": 40.0},
                        {"time_s": 3.0, "mean_return": 10.0}])
    held = run_figures([{"time_s": 1.0, "mean_return": 0.0}, {"time_s": 2.0, "mean_return": 40.0},
                        {"time_s": 3.0, "mean_return": 37.0}])
    best_returns = [30.0, 50.0] * 5  # mean 40, standard error 10 / sqrt(10) = 3.16
    assert goal(held, best_returns, {}) == "final"  # 37 of 40: 92% of the gain
    assert goal(fell, best_returns, {}) is None     # no kept best to hand back
    near = {"best": {"mean": 34.0, "se": 1.0}}  # 2 x hypot(3.16, 1.0) = 6.6 below 40: 33.4
    assert goal(fell, best_returns, near) == "kept best"
    assert goal(fell, best_returns, {"best": {"mean": 33.0, "se": 1.0}}) is None
    flat = run_figures([{"time_s": 1.0, "mean_return": 9.0}, {"time_s": 2.0, "mean_return": 8.0}])
    assert goal(flat, [9.0], {}) == "no gain to keep"  # said, not taken for a kept gain
    # The latest policy played on held-out episodes, where there is one, not the last
    # evaluation: a final checkpoint that fell after it does not pass for a kept gain.
    assert goal(held, best_returns, {"latest": {"mean": 1.0, "se": 0.5}}) is None
    assert goal(fell, best_returns, {"latest": {"mean": 38.0, "se": 0.5}}) == "final"
