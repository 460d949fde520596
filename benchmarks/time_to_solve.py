"""Time to solve CartPole-v1: wall-clock from process start (Ray start-up included) until the
greedy mean over 10 episodes reaches 475, with default settings, median over seeds.

    python benchmarks/time_to_solve.py                 # seeds 0 1 2
    python benchmarks/time_to_solve.py --seeds 0 1 2 3 4 -- --learning-rate 5e-4

Arguments after `--` go to `python -m distrl.train` unchanged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_training(extra: list[str]) -> dict:
    """`python -m distrl.train --env CartPole-v1 ...` in a fresh process: its results.json,
    plus process_wall_s, the wall-clock the whole process took (Ray start-up included)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "distrl.train", "--env", "CartPole-v1", "--progress",
               "false", "--output-dir", tmp, *extra]
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.monotonic() - start
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        result = json.loads((Path(tmp) / "results.json").read_text())
    result["process_wall_s"] = wall
    return result


def time_to_solve_s(result: dict) -> float | None:
    """Time to target as the process saw it: its wall time minus what came after the target
    was reached (shutdown), i.e. start-up + training until the solving evaluation."""
    if not result["reached_target"]:
        return None
    return result["process_wall_s"] - (result["wall_time_s"] - result["time_to_target_s"])


def run_once(seed: int, extra: list[str], budget_s: float) -> dict:
    result = run_training(["--seed", str(seed), "--max-seconds", str(budget_s), *extra])
    timeline = result["timeline"]  # seconds since the training process started
    return {"seed": seed, "solved": result["reached_target"],
            "time_to_solve_s": time_to_solve_s(result),
            "process_wall_s": result["process_wall_s"], "env_steps": result["env_steps"],
            "learner_updates": result["learner_updates"], "startup_s": result["startup_s"],
            "ray_up_s": timeline.get("Ray up"),
            "first_transition_s": timeline.get("first transition"),
            "first_update_s": timeline.get("first update")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget-s", type=float, default=120.0,
                        help="per-run training budget; unsolved runs count as this")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    runs = []
    for seed in args.seeds:
        r = run_once(seed, extra, args.budget_s)
        runs.append(r)
        shown = f"{r['time_to_solve_s']:.1f}s" if r["solved"] else "not solved"
        print(f"seed {seed}: {shown}  (process {r['process_wall_s']:.1f}s; since process start: "
              f"Ray up {r['ray_up_s']:.1f}s, first transition {r['first_transition_s']:.1f}s, "
              f"first update {r['first_update_s']:.1f}s; {r['env_steps']:,} env steps, "
              f"{r['learner_updates']:,} updates)", flush=True)
    times = [r["time_to_solve_s"] if r["solved"] else float("inf") for r in runs]
    median = statistics.median(times)
    print(f"time to solve CartPole-v1 (median of {len(runs)} seeds, from process start): "
          f"{median:.1f}s; solved {sum(r['solved'] for r in runs)}/{len(runs)}; "
          f"goal 20s -> {'met' if median <= 20 else 'NOT met'}")
    for key, goal in (("first_transition_s", 5.0), ("first_update_s", 5.0)):
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            print(f"{key} (median): {statistics.median(values):.1f}s; goal {goal:g}s -> "
                  f"{'met' if statistics.median(values) <= goal else 'NOT met'}")


if __name__ == "__main__":
    main()
