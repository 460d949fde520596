"""Learner updates/s at the default batch and network, on one CPU core (or a GPU with --device gpu).

    python benchmarks/learner_throughput.py [--batch-size 512] [--hidden-sizes 128 128] [--device gpu]
    python benchmarks/learner_throughput.py --env ALE/Pong-v5 --batch-size 512 --hidden-sizes 512 \
        --per-call 1 --updates 20      # the Nature torso on 84x84x4 frames (Ape-X's Atari batch)

It also times the first call, tracing plus XLA's compile, in this process and then in two new
ones that share an empty XLA cache (xla_cache, as the learner's process has it): the first
compiles and writes the cache, the second loads what it wrote.

Target (issue 2): aim for at least 150 updates/s on one CPU core (CartPole's network). With
--env, the network is the one network_for builds for that env, fed from a replay of random
observations of its shape (images: uint8 frames, as replay stores them).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from distrl.rl.config import ApexConfig
from distrl.rl.envs import network_for
from distrl.rl.frames import pack_frames
from distrl.rl.learner import Learner
from distrl.rl.network import NetworkSpec, init_weights
from distrl.rl.replay import PrioritizedReplay
from distrl.rl.tf_runtime import XLA_CACHE_ENV, configure_tensorflow
from distrl.rl.transitions import Transitions


def random_replay(spec: NetworkSpec, rng) -> PrioritizedReplay:
    """A full replay of random observations of the network's input: vectors, or images kept
    as frames (each observation a stack moved on by one random frame)."""
    if not spec.is_image:
        n = 50_000
        replay = PrioritizedReplay(n, spec.obs_shape)
        obs = rng.normal(size=(n + 1, *spec.obs_shape)).astype(np.float32)
        replay.add(Transitions(obs=obs[:-1], action=rng.integers(0, spec.num_actions, n),
                               reward=rng.normal(size=n).astype(np.float32),
                               discount=np.full(n, 0.97, np.float32), next_obs=obs[1:],
                               priority=rng.random(n).astype(np.float32)))
        return replay
    n, (height, width, channels) = 4_000, spec.obs_shape
    frames = rng.integers(0, 256, (n + channels, height, width), dtype=np.uint8)
    stacks = np.stack([frames[t: t + channels] for t in range(n + 1)]).transpose(0, 2, 3, 1)
    planes, refs = pack_frames(stacks)
    replay = PrioritizedReplay(n, spec.obs_shape, obs_dtype=np.uint8,
                               frame_capacity=len(planes))
    replay.add(Transitions(obs=refs[:-1], action=rng.integers(0, spec.num_actions, n),
                           reward=rng.normal(size=n).astype(np.float32),
                           discount=np.full(n, 0.97, np.float32), next_obs=refs[1:],
                           priority=rng.random(n).astype(np.float32), frames=planes))
    return replay


def updates_per_second(config: ApexConfig, spec: NetworkSpec, updates: int,
                       device: str = "cpu", per_call: int = 1) -> tuple[float, float]:
    """Learner updates/s on batches from a full replay, after tracing and 10 warm-up calls
    (TensorFlow already configured by the caller); per_call batches go into each call
    (update_many, as the learner process calls it with batches_per_fetch). Also the seconds
    of the first call: tracing, and XLA's compile with jit_compile."""
    import tensorflow as tf

    replay = random_replay(spec, np.random.default_rng(0))
    kept = 32 if not spec.is_image else 4  # image batches are large (512 x 2 x 28 KB)
    stacks = [replay.sample_many(config.batch_size, per_call)
              for _ in range(max(1, kept // per_call))]
    with tf.device("/GPU:0" if device == "gpu" else "/CPU:0"):
        learner = Learner(config, spec, init_weights(spec, 0))
        began = time.perf_counter()
        learner.update_many(stacks[0])  # trace (and compile)
        first_call_s = time.perf_counter() - began
        for stack in stacks[1:10 if not spec.is_image else 2]:
            learner.update_many(stack)  # warm up
        calls = max(1, updates // per_call)
        start = time.perf_counter()
        for i in range(calls):
            learner.update_many(stacks[i % len(stacks)])
        return calls * per_call / (time.perf_counter() - start), first_call_s


def first_call_in_a_new_process(config: ApexConfig, cache_dir: str, per_call: int,
                                device: str) -> float:
    """Seconds of a new process's first update_many call, XLA's cache in cache_dir."""
    argv = [sys.executable, __file__, "--first-call-only", "--device", device, "--batch-size",
            str(config.batch_size), "--per-call", str(per_call), "--env", config.env_id,
            "--hidden-sizes", *map(str, config.hidden_sizes)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                         env=os.environ | {XLA_CACHE_ENV: cache_dir})
    if run.returncode != 0:
        raise SystemExit(run.stderr[-3000:])
    return json.loads(run.stdout.strip().splitlines()[-1])["first_call_s"]


def main() -> None:
    defaults = ApexConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default=defaults.env_id,
                        help="the network network_for builds for this env (default: CartPole's)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=list(defaults.hidden_sizes))
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--per-call", type=int, default=defaults.batches_per_fetch,
                        help="batches per update_many call (the learner's batches_per_fetch)")
    parser.add_argument("--first-call-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.updates = 16
        if args.env != defaults.env_id:
            args.batch_size, args.updates = 8, 2
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    gpus = configure_tensorflow(num_threads=1 if args.device == "cpu" else None,
                                xla_cache=args.first_call_only)
    if args.device == "gpu" and not gpus:
        raise SystemExit("--device gpu: TensorFlow sees no GPU on this machine")
    config = ApexConfig(env_id=args.env, hidden_sizes=tuple(args.hidden_sizes),
                        batch_size=args.batch_size, jit_compile=True)  # XLA, then without
    spec = network_for(config)
    if args.first_call_only:  # one of first_call_in_a_new_process's processes
        _, first_call_s = updates_per_second(config, spec, 0, args.device, args.per_call)
        print(json.dumps({"first_call_s": first_call_s}))
        return
    flops = 3 * spec.forward_flops(args.batch_size) + 2 * spec.forward_flops(args.batch_size)
    single, _ = updates_per_second(config, spec, args.updates, args.device)
    rate, first_call_s = updates_per_second(config, spec, args.updates, args.device, args.per_call)
    # The same without XLA: what jit_compile=False trades.
    plain_rate, plain_first_s = updates_per_second(config.replace(jit_compile=False), spec,
                                                   args.updates, args.device, args.per_call)
    target = f"target 150: {rate / 150:.2f}x, " if not spec.is_image else ""
    print(f"learner on {args.device} ({gpus or 'one core'}), {args.env}'s network {spec.name}, "
          f"batch {args.batch_size}: {rate:,.3g} updates/s with {args.per_call} batches per call "
          f"({target}{rate * args.batch_size:,.0f} samples/s), "
          f"~{rate * flops / 1e9:.1f} GFLOP/s; one batch per call: {single:,.3g} updates/s "
          f"(ratio {rate / single:.2f})")
    print(f"the first call, before any update lands (tracing, XLA's compile): {first_call_s:.2f} s; "
          f"without XLA (jit_compile=False) {plain_first_s:.2f} s, then {plain_rate:,.3g} updates/s "
          f"(ratio {rate / plain_rate:.2f})")
    with tempfile.TemporaryDirectory() as cache:
        compiled = first_call_in_a_new_process(config, cache, args.per_call, args.device)
        loaded = compiled if args.smoke else first_call_in_a_new_process(  # smoke: one process
            config, cache, args.per_call, args.device)
    print(f"the first call in a new process, with XLA's cache (xla_cache): {compiled:.2f} s when "
          f"it compiles and writes the cache, {loaded:.2f} s when it loads it "
          f"(ratio {loaded / compiled:.2f})")


if __name__ == "__main__":
    main()
