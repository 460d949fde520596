"""A small recorded sweep of the Ape-X defaults on CartPole-v1: one setting changed at a time
from the defaults, each over the same seeds, reporting what it takes to solve (greedy mean of
10 episodes >= 475): env steps, learner updates and seconds from process start, with the
seed-to-seed spread. Sample efficiency comes first: a setting that needs fewer env steps and
updates is preferred, then time.

    python benchmarks/sweep.py                     # the grid below, seeds 0 1 2
    python benchmarks/sweep.py --only learning_rate --seeds 0 1 2 3
    python benchmarks/sweep.py --smoke             # seconds: that it runs (appends nothing)

Each invocation appends one round to benchmarks/results/sweep_cartpole.json (committed: the
defaults in distrl.rl.config cite it), with the defaults it swept around, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from time_to_solve import run_once

from distrl.rl.config import ApexConfig

# One setting at a time around the defaults: each round's values bracket a default by about
# 2x, or go further on the side an earlier round pointed to (round 3: higher learning rates and
# fewer samples per insert, after round 1; round 5: around batch 128, which round 4 chose, the
# learning rate and samples per insert again, since both interact with the batch size; round
# 6: batch 128 against the old 512 on 5 seeds, nothing else running, after round 5's noise;
# round 7: batches per fetch, once the learner trained them in one XLA call, and samples per
# insert again, since a learner twice as fast changes what the actors can keep up with).
GRID: dict[str, list[str]] = {
    "batches_per_fetch": ["4", "16"],
    "learning_rate": ["2e-3", "8e-3"],
    "samples_per_insert": ["4", "16"],
    "target_update_period": ["25", "200"],
    "batch_size": ["512"],
    "hidden_sizes": ["128 128", "256 256"],  # a smaller one than (64, 64) is unlikely to help
}
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "sweep_cartpole.json"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def summarize(runs: list[dict], budget_s: float) -> dict:
    solved = [r for r in runs if r["solved"]]

    def stats(key: str) -> dict | None:
        values = [r[key] for r in solved]
        if not values:
            return None
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    # An unsolved seed counts as the whole budget for the time median (and is shown as such).
    times = [r["time_to_solve_s"] if r["solved"] else budget_s for r in runs]
    return {"solved": len(solved), "seeds": len(runs), "env_steps": stats("env_steps"),
            "learner_updates": stats("learner_updates"),
            "time_to_solve_s": {"median": statistics.median(times), "min": min(times),
                                "max": max(times)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget-s", type=float, default=90.0,
                        help="per-run training budget; an unsolved run counts as this")
    parser.add_argument("--only", choices=sorted(GRID), nargs="+",
                        help="sweep only these settings (the defaults always run)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the JSON file each invocation appends its round to")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    smoke_dir = None
    if args.smoke:  # one setting, one seed, a few seconds; its round goes to a temporary file
        args.seeds, args.budget_s, args.only = [0], 3.0, ["batch_size"]
        smoke_dir = tempfile.TemporaryDirectory(prefix="distrl-sweep-smoke-")
        args.results = Path(smoke_dir.name) / "sweep.json"
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be > 0, got {args.budget_s}")
    grid = {k: v for k, v in GRID.items() if not args.only or k in args.only}
    variants = [("defaults", [])] + [(f"{name}={value}", [flag(name), *value.split()])
                                     for name, values in grid.items() for value in values]
    table = []
    started = time.time()
    kept = (Path(smoke_dir.name) if smoke_dir else HERE.parent / "runs" / "sweep"
            / time.strftime("%Y%m%d-%H%M%S"))
    for n, (label, extra) in enumerate(variants):
        runs = [run_once(seed, extra, args.budget_s, kept / f"{n:02d}-seed-{seed}")
                for seed in args.seeds]
        row = {"variant": label, "args": extra, **summarize(runs, args.budget_s),
               "runs": runs}
        table.append(row)
        steps, updates, t = row["env_steps"], row["learner_updates"], row["time_to_solve_s"]
        print(f"{label:28s} solved {row['solved']}/{row['seeds']}  "
              + (f"env steps {steps['median']:>9,.0f} ({steps['min']:,}-{steps['max']:,})  "
                 f"updates {updates['median']:>6,.0f} ({updates['min']:,}-{updates['max']:,})  "
                 if steps else "")
              + f"time {t['median']:5.1f}s ({t['min']:.1f}-{t['max']:.1f})", flush=True)
    # Each invocation is one round, appended: a later round sweeps around the defaults that
    # the earlier ones chose, so the record shows how they were reached.
    rounds = json.loads(args.results.read_text())["rounds"] if args.results.exists() else []
    defaults = ApexConfig()
    rounds.append({
        "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "command": "python benchmarks/sweep.py " + " ".join(sys.argv[1:]),
        "defaults": {name: getattr(defaults, name) for name in GRID},
        "seeds": args.seeds, "budget_s": args.budget_s, "table": table})
    args.results.parent.mkdir(exist_ok=True)
    args.results.write_text(json.dumps({"rounds": rounds}, indent=1) + "\n")
    print(f"round {len(rounds)} appended to {args.results}; each run's results.json and "
          f"console: {kept}")
    if smoke_dir is not None:
        smoke_dir.cleanup()


if __name__ == "__main__":
    main()
