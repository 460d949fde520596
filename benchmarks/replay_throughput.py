"""Replay throughput at capacity 1M: batched adds, and sample(512) + update_priorities.

    python benchmarks/replay_throughput.py [--capacity 1000000] [--block 256] [--batch 512]

Targets (issue 2): add >= 1,000,000 transitions/s in blocks of 256+; sample(512) plus
update_priorities >= 2,000 times/s. Observations are CartPole-sized (4 floats).
"""

import argparse
import time

import numpy as np

from distrl.rl.replay import PrioritizedReplay
from distrl.rl.transitions import Transitions


def block_of(n, rng, obs_size=4):
    return Transitions(obs=rng.normal(size=(n, obs_size)).astype(np.float32),
                       action=rng.integers(0, 2, n), reward=rng.normal(size=n).astype(np.float32),
                       discount=np.full(n, 0.97, np.float32),
                       next_obs=rng.normal(size=(n, obs_size)).astype(np.float32),
                       priority=rng.exponential(size=n).astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--block", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.capacity, args.block, args.seconds = 10_000, [256], 0.2
    rng = np.random.default_rng(0)
    replay = PrioritizedReplay(args.capacity, (4,), alpha=0.6, eps=1e-3, seed=0)

    for block_size in args.block:
        blocks = [block_of(block_size, rng) for _ in range(64)]
        added, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds or added < args.capacity:
            replay.add(blocks[(added // block_size) % 64])
            added += block_size
        rate = added / (time.perf_counter() - start)
        print(f"add, blocks of {block_size:>5}: {rate:>12,.0f} transitions/s "
              f"(target 1,000,000: {rate / 1e6:.2f}x)  [ring wrapped: {added > args.capacity}]")

    td = rng.exponential(size=args.batch)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        batch = replay.sample(args.batch, beta=0.4)
        replay.update_priorities(batch.keys, td)
        count += 1
    rate = count / (time.perf_counter() - start)
    print(f"sample({args.batch}) + update_priorities: {rate:>8,.0f} /s "
          f"(target 2,000: {rate / 2000:.2f}x) = {rate * args.batch:,.0f} transitions/s")


if __name__ == "__main__":
    main()
