"""Time to solve CartPole-v1: wall-clock from the process's launch (imports and Ray's start-up
included) to the end of the evaluation whose greedy mean over 10 episodes reaches 475, with
default settings, median over seeds; both sides are timed this way (what comes after, the
shutdown and the interpreter's exit, counts for neither). Beside it,
in the same invocation, a well-known single-process DQN (Stable-Baselines3 with the RL Zoo's
tuned CartPole settings, benchmarks/baseline_dqn.py), and the ratio of the two. Absolute times
drift between machines and days; the ratio is the figure.

The seeds are held out: the defaults were tuned by benchmarks/sweep.py on seeds 0-4, so the
default seeds here are 100-104. Each seed runs both sides, in alternating order (A B, then B A),
so that a drift of the machine over the invocation favours neither. The baseline evaluates
in its own process, inside its wall time, and the seconds it spent evaluating are shown beside
it; every run is shown, unsolved ones included.

    python benchmarks/time_to_solve.py                       # seeds 100-104, with the baseline
    python benchmarks/time_to_solve.py --seeds 0 1 --no-baseline -- --learning-rate 5e-4
    python benchmarks/time_to_solve.py --smoke               # seconds: that it runs

Arguments after `--` go to `python -m distrl.apex.train` unchanged. The first run with the baseline
builds its venv (benchmarks/.venv-baseline, from requirements-baseline.txt: torch and SB3).
The learner's XLA cache is on, as a reader's is: after the machine's first run, each start loads
its compiled train step; `-- --xla-cache false` times compiling it at every start instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASELINE_VENV = HERE / ".venv-baseline"
BASELINE_PYTHON = BASELINE_VENV / "bin" / "python"


def run_training(extra: list[str], timeout_s: float, output_dir: Path,
                 env_id: str = "CartPole-v1") -> dict:
    """`python -m distrl.apex.train --env CartPole-v1 ...` in a fresh process: its results.json,
    plus process_wall_s, the wall-clock the whole process took (Ray start-up included).
    `timeout_s` bounds the whole process, in case it hangs past its own --max-seconds; launched_at
is the time.time() just before the launch. The run's
    results.json (timeline, events, CPU seconds per role) and its console stay in output_dir,
    so that a slow seed can be read afterwards."""
    cmd = [sys.executable, "-m", "distrl.apex.train", "--env", env_id, "--progress",
           "false", "--output-dir", str(output_dir), *extra]
    output_dir.mkdir(parents=True)
    launched_at, start = time.time(), time.monotonic()
    with open(output_dir / "console.log", "w") as console:
        proc = subprocess.run(cmd, stdout=console, stderr=subprocess.STDOUT, timeout=timeout_s)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        tail = (output_dir / "console.log").read_text()[-3000:]
        raise SystemExit(f"{' '.join(cmd)} failed:\n{tail}")
    result = json.loads((output_dir / "results.json").read_text())
    result["process_wall_s"], result["launched_at"] = wall, launched_at
    return result


def time_to_solve_s(result: dict) -> float | None:
    """From the launch to the end of the solving evaluation (start-up and training; not the
    shutdown after it), timed as the baseline is: a wall-clock stamp of the process's own at the
    solving evaluation, less the launch's."""
    if not result["reached_target"]:
        return None
    return result["started_at"] + result["time_to_target_s"] - result["launched_at"]


def run_once(seed: int, extra: list[str], budget_s: float, output_dir: Path) -> dict:
    # The budget is for training; start-up and shutdown get two minutes on top.
    result = run_training(["--seed", str(seed), "--max-seconds", str(budget_s), *extra],
                          timeout_s=budget_s + 120, output_dir=output_dir)
    timeline = result["timeline"]  # seconds since the training process started
    return {"seed": seed, "solved": result["reached_target"],
            "time_to_solve_s": time_to_solve_s(result),
            "process_wall_s": result["process_wall_s"], "env_steps": result["env_steps"],
            "learner_updates": result["learner_updates"], "startup_s": result["startup_s"],
            "ray_up_s": timeline.get("Ray up"),
            "first_env_step_s": timeline.get("first env step"),
            "first_transition_s": timeline.get("first transition"),
            "learner_running_s": timeline.get("learner running"),
            "first_update_s": timeline.get("first update"), "target_s": timeline.get("target")}


MILESTONES = {"ray_up_s": "Ray up", "first_env_step_s": "first env step",
              "first_transition_s": "first transition", "learner_running_s": "learner running",
              "first_update_s": "first update"}


def baseline_python() -> Path:
    """The baseline's interpreter, building its venv from requirements-baseline.txt if needed."""
    stamp = BASELINE_VENV / ".installed"
    requirements = HERE / "requirements-baseline.txt"
    if not stamp.exists() or stamp.read_text() != requirements.read_text():
        print(f"building {BASELINE_VENV} (torch, Stable-Baselines3) ...", flush=True)
        if not BASELINE_PYTHON.exists():  # else the pins change in the venv there is
            subprocess.run([sys.executable, "-m", "venv", str(BASELINE_VENV)], check=True)
        subprocess.run(_installer() + ["-r", str(requirements)], check=True, timeout=1800)
        stamp.write_text(requirements.read_text())
    return BASELINE_PYTHON


def _installer() -> list[str]:
    """uv where the project's venv has it (as make install uses it: 9 s for torch and SB3 where
    pip takes 30 s), given pip's find-links, which uv does not read (where the CPU build of torch
    lies on the project's machines); else pip."""
    uv = Path(sys.executable).with_name("uv")
    if not uv.is_file():
        return [str(BASELINE_PYTHON), "-m", "pip", "install", "--quiet"]
    configured = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                                capture_output=True, text=True, timeout=60).stdout.split()
    links = os.environ.get("PIP_FIND_LINKS", "").split() or configured
    return [str(uv), "pip", "install", "--quiet", "--no-cache", "--python", str(BASELINE_PYTHON),
            *[arg for link in links for arg in ("--find-links", link)]]


def run_baseline(python: Path, seed: int, budget_s: float, smoke: bool = False) -> dict:
    """benchmarks/baseline_dqn.py in a fresh process. Its time to solve runs from the launch to
    the end of its solving evaluation (its solved_at stamp), as distrl's does: neither side's
    exit counts."""
    cmd = [str(python), str(HERE / "baseline_dqn.py"), "--seed", str(seed),
           *(["--smoke"] if smoke else [])]
    launched_at, start = time.time(), time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s)
    except subprocess.TimeoutExpired:
        return {"seed": seed, "solved": False, "time_to_solve_s": None,
                "process_wall_s": time.monotonic() - start, "env_steps": None,
                "learner_updates": None, "eval_s": None}
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"seed": seed, "solved": result["solved"],
            "time_to_solve_s": result["solved_at"] - launched_at if result["solved"] else None,
            "process_wall_s": wall,
            "env_steps": result["env_steps"], "learner_updates": result["learner_updates"],
            "eval_s": result["eval_s"]}


def median_time(runs: list[dict]) -> float:
    """Median time to solve; an unsolved run counts as infinitely slow."""
    return statistics.median(r["time_to_solve_s"] if r["solved"] else float("inf")
                             for r in runs)


def unsolved(runs: list[dict]) -> str:
    seeds = [r["seed"] for r in runs if not r["solved"]]
    return f" (not solved: seed {', '.join(map(str, seeds))})" if seeds else ""


def spread(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs if r["solved"]]
    return f"{min(values):,}-{max(values):,}" if values else "-"


HELD_OUT_SEEDS = [100, 101, 102, 103, 104]  # benchmarks/sweep.py tunes on 0-4


def show_distrl(r: dict) -> None:
    shown = f"{r['time_to_solve_s']:.1f}s" if r["solved"] else "not solved"
    # A milestone the run never reached (a learner that did not start in time) shows as "-".
    at = {key: "-" if r[key] is None else f"{r[key]:.1f}s" for key in MILESTONES}
    print(f"seed {r['seed']} distrl:   {shown}  (process {r['process_wall_s']:.1f}s; since process "
          "start: " + ", ".join(f"{name} {at[key]}" for key, name in MILESTONES.items())
          + f"; {r['env_steps']:,} env steps, {r['learner_updates']:,} updates)", flush=True)


def show_baseline(b: dict) -> None:
    shown = f"{b['time_to_solve_s']:.1f}s" if b["solved"] else "not solved"
    steps = f"{b['env_steps']:,} env steps" if b["env_steps"] else "stopped at budget"
    evals = "-" if b["eval_s"] is None else f"{b['eval_s']:.1f}s"
    print(f"seed {b['seed']} baseline: {shown}  (process {b['process_wall_s']:.1f}s, of which "
          f"greedy evaluation {evals}; {steps}, {b['learner_updates'] or 0:,} updates)",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=HELD_OUT_SEEDS)
    parser.add_argument("--budget-s", type=float, default=180.0,
                        help="per-run budget (each side); an unsolved run counts as never")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the Stable-Baselines3 baseline (and its venv)")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.smoke:
        args.seeds, args.budget_s = [HELD_OUT_SEEDS[0]], 4.0
        extra += ["--envs-per-actor", "8", "--hidden-sizes", "32", "32", "--jit-compile",
                  "false"]
    if not args.seeds or args.budget_s <= 0:
        parser.error(f"need at least one seed and --budget-s > 0, got {args.budget_s}")
    python = None if args.no_baseline else baseline_python()
    kept = HERE.parent / "runs" / "time_to_solve" / time.strftime("%Y%m%d-%H%M%S")
    if args.smoke:  # nothing kept
        smoke_dir = tempfile.TemporaryDirectory(prefix="distrl-time-to-solve-smoke-")
        kept = Path(smoke_dir.name)
    runs, baseline = [], []
    for n, seed in enumerate(args.seeds):
        sides = ["distrl", "baseline"] if n % 2 == 0 else ["baseline", "distrl"]
        for side in sides:
            if side == "distrl":
                r = run_once(seed, extra, args.budget_s, kept / f"seed-{seed}")
                runs.append(r)
                show_distrl(r)
            elif python is not None:
                b = run_baseline(python, seed, args.budget_s, smoke=args.smoke)
                baseline.append(b)
                show_baseline(b)
    print(f"each run's results.json and console: {kept}")
    median = median_time(runs)
    print(f"time to solve CartPole-v1 (median of {len(runs)} seeds, from launch to the solving "
          "evaluation): "
          f"{median:.1f}s; solved {sum(r['solved'] for r in runs)}/{len(runs)}"
          f"{unsolved(runs)}; goal 20s -> {'met' if median <= 20 else 'NOT met'}")
    print(f"  distrl to solve: {spread(runs, 'env_steps')} env steps, "
          f"{spread(runs, 'learner_updates')} learner updates (min-max over solved seeds)")
    if baseline:
        base = median_time(baseline)
        print(f"baseline (SB3 DQN, RL Zoo settings) median: {base:.1f}s; solved "
              f"{sum(b['solved'] for b in baseline)}/{len(baseline)}{unsolved(baseline)}; "
              f"{spread(baseline, 'env_steps')} env steps, "
              f"{spread(baseline, 'learner_updates')} updates")
        print(f"ratio distrl / baseline (medians): {median / base:.2f} "
              "(below 1: distrl solves sooner)")
    # The goal's "first env step" is the actors' own clock; the first transition (the driver
    # found it in replay) is shown beside it, without a goal. The first update's goal counts
    # from process start here; from train() on a Ray already up: benchmarks/process_startup.py.
    for key, goal in (("first_env_step_s", 5.0), ("first_transition_s", None),
                      ("first_update_s", 10.0)):
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            mid = statistics.median(values)
            verdict = "" if goal is None else f"; goal {goal:g}s -> {'met' if mid <= goal else 'NOT met'}"
            print(f"{key} (median): {mid:.1f}s{verdict}")
    # Where the time to solve goes: Ray's own start, then distrl's processes up to the first
    # update, then learning (the solved runs' timelines, seconds since process start).
    solved = [r for r in runs if r["solved"] and r["target_s"] is not None]
    if solved:
        def median_of(f):
            return statistics.median(f(r) for r in solved)

        print(f"  where it goes (medians): process start -> Ray up "
              f"{median_of(lambda r: r['ray_up_s']):.1f}s; "
              f"Ray up -> first update {median_of(lambda r: r['first_update_s'] - r['ray_up_s']):.1f}s; "
              f"first update -> solved {median_of(lambda r: r['target_s'] - r['first_update_s']):.1f}s "
              f"(a Ray cluster already up, as in a notebook's kernel, saves the first part)")


if __name__ == "__main__":
    main()
