"""What a resume saves, over several seeds: notebook 04's story on one node. A first run holds
its learner once its weights score within a window (mid-learning) and stops there, with a
checkpoint; a run resumed from it trains to the target, and a run from zero trains to the same
target. Each is measured in learner updates: the resumed run's from its checkpoint, the run from
zero's from zero; and the resumed run's fall, the lowest greedy return it went through on the
way below the checkpoint's own score. Each checkpoint is resumed twice: as it is (with its
sample of the replay) and without replay, as checkpoints were before they kept it.

    python benchmarks/resume_head_start.py [--seeds 11 12 13] [--variant min_replay_size=20000]
                                           [--smoke]

A --variant changes the resumed run only (ApexConfig fields, Python values), to try what a
resume should restore or do differently; the table has one row per seed and variant.
"""

import argparse
import ast
import sys
import tempfile
from pathlib import Path

import distrl  # noqa: F401  (before Ray: gRPC's fork support off)
from distrl.apex.driver import ApeX
from distrl.apex.faults import StopFlag
from distrl.ray_runtime import init_local_ray, shutdown_ray
from distrl.rl.checkpoints import read_checkpoint, write_checkpoint
from distrl.rl.config import ApexConfig

WINDOW = (150.0, 450.0)  # notebook 04's HOLD_WITHIN
TARGET = 475.0


class _DriverLines:
    """stdout for the runs' drivers: their "[distrl]" lines stay out of the record (this
    script prints its figures), and the first run stops when its driver says its learner held
    (the hold is the driver's to decide, on its evaluator's check)."""

    def __init__(self, out, stop: StopFlag | None = None):
        self.out, self.stop, self.pending = out, stop, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if self.stop is not None and "learner held at" in line:
                self.stop.set("the learner held")
            if not line.startswith("[distrl]"):
                self.out.write(line + "\n")
        return len(text)

    def __getattr__(self, name):
        return getattr(self.out, name)


def train(config: ApexConfig, stop: StopFlag | None = None):
    real, sys.stdout = sys.stdout, _DriverLines(sys.stdout, stop)
    try:
        return ApeX(config).train(sigterm=stop)
    finally:
        sys.stdout = real


def first_run(base: ApexConfig, out: Path):
    """Trains until its learner holds within WINDOW, then stops as a drain would."""
    return train(base.replace(hold_learner_within=WINDOW, target_return=None,
                              output_dir=str(out / "first")), StopFlag())


def lowest_after(result, score: float) -> float | None:
    """The lowest greedy return after a run first scored `score`, until it first scored
    TARGET: the fall a run from zero goes through from where the checkpoint was."""
    returns = [e["mean_return"] for e in result.evals]
    first = next((i for i, r in enumerate(returns) if r >= score), None)
    if first is None:
        return None
    end = next((i for i, r in enumerate(returns) if r >= TARGET), len(returns))
    return min(returns[first:end], default=None) if end > first else None


def updates_to(result, score: float, since: int = 0) -> int | None:
    hit = next((e for e in result.evals if e["mean_return"] >= score), None)
    return None if hit is None else hit["weights_version"] - since


def without_replay(checkpoint: str, folder: Path) -> str:
    """The same checkpoint with no replay in it: a resume as it was before checkpoints kept
    a sample of the replay (it trained on new play alone)."""
    meta, arrays = read_checkpoint(checkpoint)
    kept = {k: v for k, v in arrays.items() if not k.startswith("replay.")}
    return write_checkpoint(folder, ({**meta, "replay_transitions": 0}, kept))


def summary(label: str, rows: list[tuple]) -> str:
    done = [(a, f) for _, _, _, a, f, _, _ in rows if a is not None and f is not None]
    falls = [(s - lo) / s for _, s, _, _, _, lo, _ in rows if lo is not None]
    zero_falls = [(s - lo) / s for _, s, _, _, _, _, lo in rows if lo is not None]
    return (f"{label}: {sum(a < f for a, f in done)} of {len(done)} seeds needed fewer "
            "updates resumed than from zero; median updates resumed / from zero: "
            + (f"{sorted(a / f for a, f in done)[len(done) // 2]:.2f}" if done else "-")
            + "; median fall below the checkpoint's score, resumed: "
            + (f"{sorted(falls)[len(falls) // 2]:.0%}" if falls else "-")
            + ", from zero once it scored as much: "
            + (f"{sorted(zero_falls)[len(zero_falls) // 2]:.0%}" if zero_falls else "-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13])
    parser.add_argument("--variant", action="append", default=[],
                        help="FIELD=VALUE for the resumed run (repeat for several fields)")
    parser.add_argument("--max-seconds", type=float, default=240.0)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    variant = {k: ast.literal_eval(v) for k, v in (s.split("=", 1) for s in args.variant)}
    base = ApexConfig(envs_per_actor=16, max_seconds=args.max_seconds, progress=False)
    if args.smoke:
        args.seeds = [0]
        base = base.replace(max_seconds=60.0)
    init_local_ray(include_dashboard=False, logging_level="error")
    resumes = {"with the replay's sample (the resume as it is)": [],
               "without replay (as before checkpoints kept it)": []}
    try:
        with tempfile.TemporaryDirectory(prefix="resume-") as tmp:
            for seed in args.seeds:
                out = Path(tmp) / f"seed-{seed}"
                config = base.replace(seed=seed)
                first = first_run(config, out)
                held = [e for e in first.evals if e.get("hold_check")]
                if first.checkpoint is None or not held or not (
                        WINDOW[0] <= held[-1]["mean_return"] < WINDOW[1]):
                    print(f"seed {seed}: the first run did not hold within {WINDOW} "
                          f"({first.stop_detail}); skipped", flush=True)
                    continue
                score, at = held[-1]["mean_return"], first.learner_updates
                zero = train(config.replace(target_return=TARGET, output_dir=str(out / "zero")))
                fresh, low_zero = updates_to(zero, TARGET), lowest_after(zero, score)
                checkpoints = (first.checkpoint, without_replay(first.checkpoint, out / "bare"))
                for (label, rows), checkpoint in zip(resumes.items(), checkpoints):
                    resumed = train(config.replace(
                        target_return=TARGET, resume=checkpoint,
                        output_dir=str(out / f"resumed-{len(rows)}-{label[:4]}"), **variant))
                    after = updates_to(resumed, TARGET, since=at)
                    low = min((e["mean_return"] for e in resumed.evals[1:]), default=None)
                    rows.append((seed, score, at, after, fresh, low, low_zero))
                    print(f"seed {seed}, resumed {label.split(' (')[0]}: checkpoint at {at:,} "
                          f"updates scoring {score:.1f}; to {TARGET:g}: resumed "
                          f"{after if after is not None else 'never'} updates after it, from "
                          f"zero {fresh if fresh is not None else 'never'}; lowest greedy "
                          f"return on the way from the checkpoint's score: resumed "
                          f"{'-' if low is None else f'{low:.1f}'}, from zero (once it scored "
                          f"as much) {'-' if low_zero is None else f'{low_zero:.1f}'}",
                          flush=True)
    finally:
        shutdown_ray()
    for label, rows in resumes.items():
        print(summary(f"resumed {label}" + (f", variant {variant}" if variant else ""), rows))


if __name__ == "__main__":
    main()
