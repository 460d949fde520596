"""Replay memory for image observations: bytes per transition, measured on real Atari blocks.

    python benchmarks/replay_memory.py [--env ALE/Pong-v5] [--capacity 5000] [--fills 3]

One actor (ALE/Pong-v5 through make_env: 84x84x4 uint8 stacks) fills a PrioritizedReplay
sized as the replay process sizes it (sized_capacity with frames_per_transition and one
block's headroom) `--fills` times over, so that both rings have turned over. Printed: the
planes the blocks packed per transition against the estimate, the live transitions at the
end, the replay's bytes per live transition, and what the same layout costs at 1 M
transitions, against two float32 stacks per transition (what replay held before frames).
"""

import argparse
import time

import numpy as np

from distrl.apex.replay_memory import sized_capacity
from distrl.rl.actor import Actor
from distrl.rl.config import ApexConfig
from distrl.rl.envs import network_for
from distrl.rl.frames import replay_sizing
from distrl.rl.network import init_weights
from distrl.rl.replay import PrioritizedReplay

KIB = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--capacity", type=int, default=5000)
    parser.add_argument("--fills", type=float, default=3.0)
    parser.add_argument("--envs-per-actor", type=int, default=8)
    parser.add_argument("--block-steps", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="seconds: a tiny replay, one fill")
    args = parser.parse_args()
    if args.smoke:
        args.capacity, args.fills, args.envs_per_actor, args.block_steps = 400, 1.5, 2, 50
    config = ApexConfig(env_id=args.env, num_actors=1, envs_per_actor=args.envs_per_actor,
                        actor_block_steps=args.block_steps, hidden_sizes=(32,),
                        replay_capacity=args.capacity, min_replay_size=1, batch_size=1)
    spec = network_for(config)
    shape = spec.obs_shape
    if not spec.is_image:
        raise SystemExit(f"--env {args.env}: vector observations; this measures image replay")
    sizing = replay_sizing(config, shape)
    estimate = sizing["frames_per_transition"]
    capacity, frame_capacity = sized_capacity(args.capacity, shape, obs_dtype=np.uint8,
                                              **sizing)
    replay = PrioritizedReplay(capacity, shape, obs_dtype=np.uint8, frame_capacity=frame_capacity)
    actor = Actor(config, 0, init_weights(spec, 0))
    transitions = planes = 0
    start = time.perf_counter()
    try:
        while transitions < args.fills * capacity:
            block = actor.collect(config.actor_block_steps)
            replay.add(block)
            transitions, planes = transitions + len(block), planes + len(block.frames)
    finally:
        actor.close()
    seconds = time.perf_counter() - start
    health = replay.check()
    if not health["ok"]:
        raise SystemExit(f"replay check failed: {health['problems']}")
    plane = shape[0] * shape[1]
    per_live = replay.nbytes / len(replay)
    # Sized as the replay process sizes it, with the ratio the blocks really packed.
    per_million = PrioritizedReplay.bytes_for(
        1_000_000, shape, np.uint8,
        int(np.ceil(1_000_000 * planes / transitions)) + sizing["frame_headroom"])
    float32 = 2 * int(np.prod(shape)) * 4
    print(f"{args.env}: {transitions:,} transitions from {args.envs_per_actor} envs in blocks of "
          f"{args.block_steps} steps ({seconds:.1f} s); replay capacity {capacity:,}, frame ring "
          f"{frame_capacity:,} planes of {shape[0]}x{shape[1]}")
    print(f"planes per transition: {planes / transitions:.3f} packed "
          f"(replay sized for {estimate:.3f})")
    print(f"live transitions at the end: {len(replay):,} of {capacity:,}")
    print(f"bytes per live transition: {per_live:,.0f} B = {per_live / KIB:.2f} KiB "
          f"({per_live / plane:.3f} planes' worth; a plane is {plane:,} B)")
    print(f"1 M transitions at the packed ratio, plus a block's planes: "
          f"{per_million / 2**30:.2f} GiB, {per_million / 1e6:,.0f} B = "
          f"{per_million / 1e6 / KIB:.2f} KiB a transition; as two float32 stacks: "
          f"{1_000_000 * float32 / 2**30:.1f} GiB ({float32 / KIB:.0f} KiB a transition, "
          f"{float32 * 1_000_000 / per_million:.0f}x)")


if __name__ == "__main__":
    main()
