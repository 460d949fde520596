"""Ape-X on an image env against a well-known single-process DQN, same env, same network size,
same budget, in one invocation: the greedy return each reached at fixed wall-clock points, and
the time distrl took to reach the peer's final return.

    python benchmarks/image_peer.py [--env MinAtar/Breakout-v1] [--budget-s 300] [--seeds 100 101 102]

The peer is Stable-Baselines3's DQN with the MinAtar authors' network (one 3x3 convolution of
16 filters, 128 hidden units) and settings (benchmarks/baseline_minatar_dqn.py, in the baseline
venv that time_to_solve.py builds). distrl runs `python -m distrl.apex.train` with its defaults
and `--hidden-sizes 128` (its small torso is the same convolution; its head is dueling). The two
run one after the other, each with the whole machine, each for --budget-s seconds of training.
Times are from the process's launch, start-up included; the peer's evaluations stop its
training, so their time is left out of its clock (distrl evaluates in a process of its own).
The return at a point is the last greedy mean (10 episodes) evaluated by then.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from time_to_solve import HELD_OUT_SEEDS, HERE, baseline_python, run_training


def distrl_curve(env_id: str, seed: int, budget_s: float, extra: list[str],
                 output_dir: Path) -> list[tuple[float, float]]:
    """(seconds since launch, greedy return) of one distrl run."""
    launched = time.time()
    result = run_training(["--seed", str(seed), "--max-seconds", str(budget_s),
                           "--target-return", "none", "--hidden-sizes", "128", *extra],
                          timeout_s=budget_s + 180, output_dir=output_dir, env_id=env_id)
    return [(result["started_at"] + e["time_s"] - launched, e["mean_return"])
            for e in result["evals"]]


def peer_curve(python: Path, env_id: str, seed: int, budget_s: float,
               smoke: bool) -> list[tuple[float, float]]:
    """(seconds since launch less evaluation seconds, greedy return) of one peer run."""
    cmd = [str(python), str(HERE / "baseline_minatar_dqn.py"), "--env", env_id, "--seed",
           str(seed), "--budget-s", str(budget_s), "--eval-every-s", str(budget_s / 20),
           *(["--smoke"] if smoke else [])]
    launched = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * budget_s + 300)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    points = json.loads(proc.stdout.strip().splitlines()[-1])["curve"]
    return [(at - launched - eval_s, value) for at, eval_s, value in points]


def value_at(curve: list[tuple[float, float]], t: float) -> float:
    """The last return evaluated by time t (NaN before the first evaluation)."""
    seen = [value for at, value in curve if at <= t]
    return seen[-1] if seen else math.nan


def time_to(curve: list[tuple[float, float]], value: float) -> float:
    """When the curve first reached value (inf: never)."""
    return next((at for at, v in curve if v >= value), math.inf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=HELD_OUT_SEEDS[:3])
    parser.add_argument("--points", type=int, default=5, help="fixed wall-clock points")
    parser.add_argument("--distrl-args", nargs=argparse.REMAINDER, default=[],
                        help="options for distrl.apex.train (the rest of the line)")
    parser.add_argument("--smoke", action="store_true", help="seconds: one seed, a tiny budget")
    args = parser.parse_args()
    if args.smoke:
        args.budget_s, args.seeds, args.points = 8.0, args.seeds[:1], 2
        args.distrl_args += ["--min-replay-size", "300", "--num-actors", "1"]
    python = baseline_python()
    points = [args.budget_s * (k + 1) / args.points for k in range(args.points)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            ours = distrl_curve(args.env, seed, args.budget_s, args.distrl_args,
                                Path(tmp) / f"distrl-{seed}")
            peer = peer_curve(python, args.env, seed, args.budget_s, args.smoke)
            final_at, final = peer[-1]
            rows.append({"seed": seed, "ours": [value_at(ours, t) for t in points],
                         "peer": [value_at(peer, t) for t in points], "peer_final": final,
                         "peer_final_at": final_at, "ours_to_peer_final": time_to(ours, final)})
            print(f"seed {seed}: " + "; ".join(
                f"{t:.0f} s: distrl {o:.2f}, peer {p:.2f}"
                for t, o, p in zip(points, rows[-1]["ours"], rows[-1]["peer"])), flush=True)
            print(f"  the peer ended at {final:.2f} after {final_at:.0f} s; distrl reached it "
                  f"after {rows[-1]['ours_to_peer_final']:.0f} s", flush=True)
    ratios = [r["ours_to_peer_final"] / r["peer_final_at"] for r in rows]
    ahead = sum(all(o > p for o, p in zip(r["ours"], r["peer"])) for r in rows)
    print(f"{args.env}, budget {args.budget_s:g} s, seeds {args.seeds}: distrl ahead at every "
          f"point in {ahead} of {len(rows)} seeds; time to the peer's final return, as a share "
          f"of the peer's time: median {statistics.median(ratios):.2f} (goal 0.33; "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
