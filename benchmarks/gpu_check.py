"""The Pong workload on a machine with a GPU, in a few minutes: what benchmarks/pong_pool.py and
WORKLOADS["pong"] take second-hand until it has run.

    python benchmarks/gpu_check.py [--minutes 4] [--actors N]      # needs a GPU
    python benchmarks/gpu_check.py --smoke                           # CPU, seconds: it runs

1. The learner's updates/s at batch 512 with the Nature torso on the GPU (XLA on):
   benchmarks/learner_throughput.py --device gpu, the figure pong_pool.py's GPU_UPDATES_SECOND_HAND
   stands in for.
2. The replay path's rate on this machine: benchmarks/learner_feed.py with the workload's
   shards and requests in flight, batches delivered to a learner that trains nothing.
3. Pong itself for --minutes: WORKLOADS["pong"]'s options with the learner on the GPU, two replay
   shards and every core but three as an actor (the learner, the shards and the evaluator keep
   those). Printed: env steps and frames a second, updates a second, the replay ratio, and each
   evaluation's return (epsilon 0.05, as Atari is evaluated) with how many episodes hit the cap,
   and the training's updates/s beside the replay path's: which side was the limit.

Its output goes to benchmarks/results/gpu_check.txt (`python tools/bench.py gpu_check` on that
machine); no figure in this tree comes from it until then.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from distrl.gke.settings import WORKLOADS

HERE = Path(__file__).resolve().parent


def has_gpu() -> bool:
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return out.returncode == 0 and out.stdout.strip().splitlines()[-1:] != ["0"]


def run(argv: list[str], timeout_s: float) -> str:
    """A child's output (it must succeed within timeout_s), printed as it comes."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="Pong's training time")
    parser.add_argument("--actors", type=int, default=max(1, (os.cpu_count() or 4) - 3))
    parser.add_argument("--updates", type=int, default=200, help="learner updates to time")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny: that the script runs")
    args = parser.parse_args()
    gpu = not args.smoke
    if gpu and not has_gpu():
        raise SystemExit("TensorFlow sees no GPU here: this check is for a GPU machine "
                         "(--smoke runs its path on the CPU)")

    options = WORKLOADS["pong"].options()
    feed = None
    if args.smoke:  # each has a --smoke test of its own: not twice
        print("learner_throughput.py, learner_feed.py: left out of --smoke "
              "(tests/test_benchmarks.py runs their own)")
    else:
        print(run([sys.executable, str(HERE / "learner_throughput.py"), "--env", "ALE/Pong-v5",
                   "--batch-size", "512", "--hidden-sizes", "512", "--per-call", "1",
                   "--updates", str(args.updates), "--device", "gpu"], 1800).strip())
        fed = run([sys.executable, str(HERE / "learner_feed.py"), "--shards",
                   options["--replay-shards"], "--in-flight", options["--fetches-in-flight"]],
                  1800).strip()
        print(fed)
        feed = float(re.findall(r"([\d,.]+) batches/s delivered", fed)[-1].replace(",", ""))

    seconds = 40 if args.smoke else round(args.minutes * 60)
    train = [*WORKLOADS["pong"].command_args()[:-2], "--max-seconds", str(seconds),
             "--target-return", "none", "--replay-capacity", "200000",
             "--min-replay-size", "20000", "--eval-interval-s", "30",
             "--num-actors", str(args.actors), "--actor-cpus", "1", "--learner-cpus", "1",
             "--num-gpus", "1" if gpu else "0", "--progress", "false"]
    if args.smoke:  # one actor's few blocks, two small updates, one short evaluation
        train += ["--num-actors", "1", "--replay-shards", "1", "--envs-per-actor", "2",
                  "--actor-block-steps", "50",
                  "--batch-size", "32", "--min-replay-size", "200", "--replay-capacity", "2000",
                  "--max-learner-updates", "2", "--eval-episodes", "1"]
    with tempfile.TemporaryDirectory() as out:
        run([sys.executable, "-m", "distrl.apex.train", *train, "--output-dir", out],
            seconds + 900)
        result = json.loads((Path(out) / "results.json").read_text())
    steps_s = result["env_steps_per_s"]
    print(f"Pong, {result['wall_time_s']:.0f} s, learner on the {'GPU' if gpu else 'CPU'}, "
          f"{args.actors if not args.smoke else 1} actor(s): {steps_s:,.0f} env steps/s "
          f"({4 * steps_s:,.0f} frames/s), {result['learner_updates_per_s']:.1f} updates/s, "
          f"replay ratio {result['samples_per_insert']:.2f}, {result['env_steps']:,} env steps, "
          f"{result['learner_updates']:,} updates; stop: {result['stop_reason']}")
    if feed is not None:
        updates = result["learner_updates_per_s"]
        side = "the replay path" if updates >= 0.9 * feed else "the learner"
        print(f"the learner trained {updates:.1f} updates/s; the replay path alone delivers "
              f"{feed:.1f} batches/s here (learner_feed.py): the limit was {side}")
    for ev in result["evals"]:
        print(f"  at {ev['time_s']:6.0f} s, {ev['env_steps']:>10,} env steps: return "
              f"{ev['mean_return']:6.1f} over {len(ev['returns'])} episodes (epsilon "
              f"{ev.get('epsilon', 0):g}; {ev.get('capped', 0)} cut at the step cap)")


if __name__ == "__main__":
    main()
