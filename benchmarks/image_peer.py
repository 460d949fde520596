"""Ape-X on an image env against a well-known single-process DQN, same env, same network size,
same machine, same evaluation schedule and episodes, in one invocation: the greedy return each
side had at shared wall-clock points, its final return (the mean over the last points), and the
time each side took to reach the peer's final return on that schedule.

    python benchmarks/image_peer.py [--env MinAtar/Breakout-v1] [--budget-s 180] [--points 12]
                                    [--seeds 100 101 102] [--distrl-args ...]

The peer is Stable-Baselines3's DQN with the MinAtar authors' network (one 3x3 convolution of
16 filters, 128 hidden units) and settings (benchmarks/baseline_minatar_dqn.py, in the baseline
venv that time_to_solve.py builds). distrl runs `python -m distrl.apex.train` with its defaults
and `--hidden-sizes 128` (its small torso is the same convolution; its head is dueling).

Like for like:
- the machine: the two sides run one after the other (alternating which goes first, seed by
  seed), each with every core: distrl's actors and learner, the peer's torch threads (its
  default, one per core);
- the schedule: each side keeps a copy of its network at the same points, seconds since its
  launch (start-up included), and neither evaluates while it trains;
- the episodes: after training, each copy plays the same greedy episodes (seeds 10,000 + seed
  + i, at most 27,000 steps), so both sides are scored on the same games;
- the figures: the return at each point; the final return, the mean over the last
  --final-points points; and the first point at which each side reached the peer's final
  return, so that the ratio of the two times is measured on one schedule.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from time_to_solve import HELD_OUT_SEEDS, HERE, baseline_python

EPISODES = 10


def eval_seed(seed: int) -> int:
    """The first of the evaluation episodes' seeds: apart from the training seeds."""
    return 10_000 + seed


# ----------------------------------------------------------------------- distrl's side


def distrl_side(env_id: str, seed: int, launched_at: float, points: list[float],
                train_args: list[str]) -> dict:
    """In the child process: train with distrl, copy the learner's weights at each point (a
    thread of the driver asks the learner for them; training goes on) and stop the run after the
    last, as the peer stops; then play the evaluation episodes with each copy."""
    import ray

    from distrl.apex.driver import ApeX
    from distrl.apex.faults import StopFlag
    from distrl.apex.train import config_from_args
    from distrl.rl.envs import evaluate_greedy, network_for

    config = config_from_args(
        ["--env", env_id, "--seed", str(seed), "--progress", "false", *train_args])
    apex, stop = ApeX(config), StopFlag()
    taken: list[tuple[float, float, list]] = []
    failed: list[str] = []

    def copy_at_points() -> None:
        try:
            for point in points:
                while time.time() - launched_at < point or apex.topology is None:
                    if stop.wait(0.02):
                        return
                _, weights = ray.get(apex.topology.learner.get_weights.remote(-1), timeout=60)
                taken.append((point, time.time() - launched_at, weights))
        except Exception as err:  # the run ended first: said below, with how many were taken
            failed.append(f"{type(err).__name__}: {err}")
        finally:
            stop.set()  # the last copy is taken (or none can be): the run ends, as the peer's

    copier = threading.Thread(target=copy_at_points, daemon=True)
    copier.start()
    result = apex.train(sigterm=stop)
    stop.set()
    copier.join(timeout=60)
    if len(taken) != len(points):
        raise SystemExit(f"distrl's run ended ({result.stop_reason}: {result.stop_detail}) with "
                         f"{len(taken)} of {len(points)} copies taken {failed}")
    spec = network_for(config)
    curve = [(point, at, float(evaluate_greedy(env_id, weights, EPISODES, eval_seed(seed),
                                               spec)[0].mean()))
             for point, at, weights in taken]
    return {"env_steps": result.env_steps, "learner_updates": result.learner_updates,
            "curve": curve}


def run_distrl(env_id: str, seed: int, budget_s: float, points: list[float],
               train_args: list[str], output_dir: Path) -> dict:
    launched_at = time.time()
    cmd = [sys.executable, __file__, "--distrl-side", json.dumps(
        {"env_id": env_id, "seed": seed, "launched_at": launched_at, "points": points,
         # its own budget is a safety net: it stops after its last copy
        "train_args": ["--max-seconds", str(budget_s + 300), "--target-return", "none",
                        # no evaluation while it trains: the copies are scored afterwards
                        "--eval-interval-s", "1e9", "--output-dir", str(output_dir),
                        "--hidden-sizes", "128", *train_args]})]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s + 900)
    if proc.returncode != 0:
        raise SystemExit(f"distrl's side failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------- the peer's side


def run_peer(python: Path, env_id: str, seed: int, points: list[float], smoke: bool) -> dict:
    launched_at = time.time()
    cmd = [str(python), str(HERE / "baseline_minatar_dqn.py"), "--env", env_id, "--seed",
           str(seed), "--launched-at", repr(launched_at), "--points", *map(str, points),
           "--episodes", str(EPISODES), "--eval-seed", str(eval_seed(seed)),
           *(["--smoke"] if smoke else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=points[-1] + 900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------- the figures


def first_point_reaching(curve: list[list[float]], value: float) -> float:
    """The first scheduled point at which the curve's return was at least value (inf: never)."""
    return next((point for point, _, ret in curve if ret >= value), math.inf)


def final_return(curve: list[list[float]], last: int) -> float:
    return statistics.fmean(ret for _, _, ret in curve[-last:])


def compare(ours: dict, peer: dict, last: int) -> dict:
    peer_final = final_return(peer["curve"], last)
    ours_at = first_point_reaching(ours["curve"], peer_final)
    peer_at = first_point_reaching(peer["curve"], peer_final)
    return {"ours": [ret for _, _, ret in ours["curve"]],
            "peer": [ret for _, _, ret in peer["curve"]],
            "ours_final": final_return(ours["curve"], last), "peer_final": peer_final,
            "ours_at": ours_at, "peer_at": peer_at, "ratio": ours_at / peer_at,
            "late_s": max(at - point for c in (ours, peer) for point, at, _ in c["curve"])}


def show(seed: int, row: dict, points: list[float], ours: dict, peer: dict) -> None:
    print(f"seed {seed}:", flush=True)
    print("  point (s)  " + "".join(f"{p:>7.0f}" for p in points))
    print("  distrl     " + "".join(f"{v:>7.2f}" for v in row["ours"]))
    print("  peer       " + "".join(f"{v:>7.2f}" for v in row["peer"]))
    print(f"  final (mean of the last points): distrl {row['ours_final']:.2f}, peer "
          f"{row['peer_final']:.2f}; the peer's final return first reached at {row['ours_at']:.0f} "
          f"s by distrl, {row['peer_at']:.0f} s by the peer (ratio {row['ratio']:.2f}); copies "
          f"taken at most {row['late_s']:.2f} s after their point", flush=True)
    print(f"  distrl {ours['env_steps']:,} env steps, {ours['learner_updates']:,} updates; peer "
          f"{peer['env_steps']:,} env steps, {peer['learner_updates']:,} updates on "
          f"{peer['threads']} torch threads", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=HELD_OUT_SEEDS[:3])
    parser.add_argument("--points", type=int, default=12, help="shared wall-clock points")
    parser.add_argument("--final-points", type=int, default=3,
                        help="the final return is the mean over this many last points")
    parser.add_argument("--distrl-args", nargs=argparse.REMAINDER, default=[],
                        help="options for distrl.apex.train (the rest of the line)")
    parser.add_argument("--smoke", action="store_true", help="seconds: one seed, a tiny budget")
    parser.add_argument("--distrl-side", help=argparse.SUPPRESS)  # the child's entry
    args = parser.parse_args()
    if args.distrl_side:
        print(json.dumps(distrl_side(**json.loads(args.distrl_side))))
        return
    if args.smoke:
        # A copy waits for the run's topology, so points inside a slow start-up are only late.
        args.budget_s, args.seeds, args.points, args.final_points = 8.0, args.seeds[:1], 2, 1
        args.distrl_args += ["--min-replay-size", "300", "--num-actors", "1"]
    if args.budget_s <= 0 or args.points < 1 or not 1 <= args.final_points <= args.points:
        parser.error(f"need --budget-s > 0 and 1 <= --final-points <= --points, got "
                     f"{args.budget_s}, {args.final_points}, {args.points}")
    python = baseline_python()
    points = [args.budget_s * (k + 1) / args.points for k in range(args.points)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, seed in enumerate(args.seeds):
            sides = ["distrl", "peer"] if n % 2 == 0 else ["peer", "distrl"]
            for side in sides:
                if side == "distrl":
                    ours = run_distrl(args.env, seed, args.budget_s, points, args.distrl_args,
                                      Path(tmp) / f"distrl-{seed}")
                else:
                    peer = run_peer(python, args.env, seed, points, args.smoke)
            rows.append(compare(ours, peer, args.final_points))
            show(seed, rows[-1], points, ours, peer)
    ratios = [r["ratio"] for r in rows]
    ahead = sum(all(o > p for o, p in zip(r["ours"], r["peer"])) for r in rows)
    print(f"{args.env}, budget {args.budget_s:g} s, {args.points} points, seeds {args.seeds}: "
          f"distrl ahead at every point in {ahead} of {len(rows)} seeds; final return distrl "
          f"{statistics.median(r['ours_final'] for r in rows):.2f}, peer "
          f"{statistics.median(r['peer_final'] for r in rows):.2f} (medians); time to the "
          f"peer's final return, distrl's over the peer's: median {statistics.median(ratios):.2f} "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
