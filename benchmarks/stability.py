"""Does learning hold to the end of a run? Each environment trains for a fixed budget, with no
target (so a run goes on past its best), over several seeds. For every run: its first greedy
evaluation, its best (and when), its last, the share of its gain it kept at the end, and the
mean greedy return over its time (the area under its curve, per second). The record names the
runs that ended below 0.8 of their gain.

Each run hands back two policies (results.json's `policies`): the latest and the kept best
(best.npz, kept after its confirmation on new episodes). Both are played here on the same
HELD_OUT_EPISODES episodes that no run has played. A run meets the goal if its latest policy,
played here, kept 0.9 of its gain, or its kept best, played here, is within the noise of its
best evaluation: no lower than two standard errors of their difference below it.

The gain kept is (last - first) / (best - first): the first evaluation is the untrained
network's, so returns below zero (Acrobot's) compare as CartPole's do. A run whose best is its
first evaluation learned nothing, and has no share.

    python benchmarks/stability.py                 # 7 environments x seeds 100-102, about 50 min
    python benchmarks/stability.py --envs CartPole-v1 --seeds 100 -- --learning-rate 1e-3
    python benchmarks/stability.py --smoke         # seconds: that it runs

MinAtar's five games run 150 s each, with `--hidden-sizes 128` (notebook 01's and
image_peer.py's network: the MinAtar authors' convolution and dense layer); CartPole-v1 and
Acrobot-v1 run 120 s, with distrl's defaults. Budgets include the process's start-up. Each run is
a fresh `python -m distrl.apex.train` process, as a reader's would be; arguments after `--` go
to every run, to try one change at a time against the record.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from time_to_solve import HELD_OUT_SEEDS, run_training

MINATAR = [f"MinAtar/{game}-v1" for game in
           ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")]
CLASSIC = ["CartPole-v1", "Acrobot-v1"]
BUDGET_S = {**dict.fromkeys(MINATAR, 150.0), **dict.fromkeys(CLASSIC, 120.0)}
ENV_ARGS = {**dict.fromkeys(MINATAR, ["--hidden-sizes", "128"]), **dict.fromkeys(CLASSIC, [])}
KEPT_FLOOR = 0.8  # a run that ends below this share of its gain is named
GOAL_SHARE = 0.9  # or its kept best within the noise of its best evaluation
HELD_OUT_EPISODES = 30
HELD_OUT_SEED = 5 * 10**8  # away from the runs' evaluations (seed + 10,000 k) and confirmations


def run_figures(evals: list[dict]) -> dict | None:
    """From a run's evaluations (time_s, mean_return): first, best and when, last, the gain kept
    and the mean return over the time they span (trapezoids). None without an evaluation."""
    if not evals:
        return None
    times = [e["time_s"] for e in evals]
    returns = [e["mean_return"] for e in evals]
    top = max(range(len(returns)), key=returns.__getitem__)
    gain = returns[top] - returns[0]
    span = times[-1] - times[0]
    area = sum((t1 - t0) * (r0 + r1) / 2 for t0, t1, r0, r1 in
               zip(times, times[1:], returns, returns[1:]))
    return {"first": returns[0], "best": returns[top], "best_at_s": times[top],
            "last": returns[-1], "kept": (returns[-1] - returns[0]) / gain if gain > 0 else None,
            "mean": area / span if span > 0 else returns[0], "evaluations": len(evals)}


def held_out(result: dict, episodes: int = HELD_OUT_EPISODES) -> dict[str, dict]:
    """The run's latest and kept best policies, each played on the same held-out episodes:
    {"latest"|"best": {"mean", "se", "weights_version"}} for those it handed back."""
    from distrl.rl.checkpoints import load_policy
    from distrl.rl.config import ApexConfig
    from distrl.rl.envs import eval_epsilon, evaluate_greedy, network_for

    config = ApexConfig.from_dict(result["config"])
    played = {}
    for name, policy in (result.get("policies") or {}).items():
        if policy and policy.get("path"):
            _, weights = load_policy(policy["path"])
            returns, _ = evaluate_greedy(config.env_id, weights, episodes,
                                         HELD_OUT_SEED + 1000 * config.seed, network_for(config),
                                         epsilon=eval_epsilon(config.env_id))
            played[name] = {"mean": float(returns.mean()), "weights_version":
                            policy["weights_version"], "se": standard_error(returns)}
    return played


def standard_error(returns) -> float:
    returns = np.asarray(returns, dtype=float)
    return float(returns.std(ddof=1) / math.sqrt(len(returns))) if len(returns) > 1 else 0.0


def goal(f: dict, best_returns: list[float], played: dict) -> str | None:
    """How a run meets the goal: "final" (its latest policy, played on held-out episodes, or
    its last evaluation where it handed back none, kept GOAL_SHARE of its gain),
    "no gain to keep" (its best was its first evaluation),
    "kept best" (its kept best, played on held-out episodes, within two standard errors of the
    difference below its best evaluation), or None. The latest policy is the final
    checkpoint's, some updates past the last evaluation: at fd1117f, Acrobot seed 101's last
    evaluation kept 98% of its gain and its latest policy scored -500, as untrained."""
    if f["kept"] is None:
        return "no gain to keep"
    final = f["kept"] if "latest" not in played else \
        (played["latest"]["mean"] - f["first"]) / (f["best"] - f["first"])
    if final >= GOAL_SHARE:
        return "final"
    if "best" in played:
        noise = 2 * math.hypot(standard_error(best_returns), played["best"]["se"])
        if played["best"]["mean"] >= f["best"] - noise:
            return "kept best"
    return None


def describe(env_id: str, seed: int, f: dict | None) -> str:
    if f is None:
        return f"{env_id} seed {seed}: no evaluation in its budget"
    kept = "no gain to keep" if f["kept"] is None else f"kept {f['kept']:.0%} of its gain"
    return (f"{env_id} seed {seed}: first {f['first']:.1f}, best {f['best']:.1f} at "
            f"{f['best_at_s']:.0f} s, last {f['last']:.1f} ({kept}); mean over the run "
            f"{f['mean']:.1f}, {f['evaluations']} evaluations")


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=MINATAR + CLASSIC,
                        help=f"environments (default: {' '.join(MINATAR + CLASSIC)})")
    parser.add_argument("--seeds", type=int, nargs="+", default=HELD_OUT_SEEDS[:3])
    parser.add_argument("--budget-s", type=float, default=None,
                        help="every run's budget (default: 150 s for MinAtar, 120 s otherwise)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(own)
    if args.budget_s is not None and not args.budget_s > 0:
        parser.error(f"--budget-s={args.budget_s!r}: expected a number of seconds > 0")
    unknown = [env for env in args.envs if env not in BUDGET_S and args.budget_s is None]
    if unknown:
        parser.error(f"--envs {' '.join(unknown)}: no default budget; give --budget-s")
    if args.smoke:
        args.envs, args.seeds, args.budget_s = ["CartPole-v1", "MinAtar/Breakout-v1"], [0], 20.0
    print(f"{len(args.envs)} environments x seeds {args.seeds}; extra arguments: "
          f"{' '.join(extra) or 'none'}", flush=True)
    low: list[str] = []
    met_by: list[str] = []
    missed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="stability-") as tmp:
        for env_id in args.envs:
            budget = args.budget_s or BUDGET_S[env_id]
            kept = []
            for seed in args.seeds:
                result = run_training(
                    ["--seed", str(seed), "--max-seconds", str(budget), "--target-return",
                     "none", *ENV_ARGS.get(env_id, []), *extra],
                    timeout_s=budget + 300, output_dir=Path(tmp) / f"{env_id}-{seed}".replace(
                        "/", "_"), env_id=env_id)
                f = run_figures(result["evals"])
                print(describe(env_id, seed, f), flush=True)
                if f is not None:
                    played = held_out(result)
                    best_eval = max(result["evals"], key=lambda e: e["mean_return"])
                    met = goal(f, best_eval["returns"], played)
                    policies = "; ".join(
                        f"{name} (weights of {p['weights_version']:,} updates) "
                        f"{p['mean']:.1f} +- {p['se']:.1f}" for name, p in played.items())
                    print(f"  on {HELD_OUT_EPISODES} held-out episodes: {policies or 'none'}; "
                          f"goal {'met: ' + met if met else 'NOT met'}", flush=True)
                    (met_by if met else missed).append(f"{env_id} seed {seed}")
                if f is not None and f["kept"] is not None:
                    kept.append(f["kept"])
                    if f["kept"] < KEPT_FLOOR:
                        low.append(f"{env_id} seed {seed} ({f['kept']:.0%})")
            if kept:
                print(f"{env_id}: median gain kept {statistics.median(kept):.0%} over "
                      f"{len(kept)} run(s) that learned", flush=True)
    print(f"runs that ended below {KEPT_FLOOR:.0%} of their gain: "
          + (", ".join(low) if low else "none"))
    print(f"goal (last evaluation at {GOAL_SHARE:.0%} of the gain, or the kept best within the "
          f"noise of the best): met by {len(met_by)} of {len(met_by) + len(missed)} runs; not "
          f"by: {', '.join(missed) if missed else 'none'}")


if __name__ == "__main__":
    main()
