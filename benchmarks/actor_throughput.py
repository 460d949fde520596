"""One actor process against the raw step rate of the same vectorised env, on the same core.

    python benchmarks/actor_throughput.py [--env CartPole-v1] [--envs-per-actor 32 64] [--smoke]

Raw: the K envs the actor steps, as the actor steps them (distrl.rl.envs.EnvBatch: a
vectorised version where the env has one, gymnasium's for CartPole and ale_py's AtariVectorEnv
for Atari; else K single envs in a loop), with random actions and nothing else. Actor: the
Actor class as the Ray actor runs it: numpy inference for the batch of K envs, epsilon-greedy,
n-step folding and initial priorities. Both step the same K envs, so the ratio is what the
actor's own work costs. Target (issue 2): actor >= 50% of raw. For Atari, also against
gymnasium's SyncVectorEnv of make_env's wrappers (what the actor stepped before
AtariVectorEnv); issue 51's goal: 0.8x.

Then the ways to step K envs with random actions, each over the same seconds: EnvBatch (what the
actor uses), K single envs in a loop (EnvBatch(vectorised=False)), and gymnasium's own
SyncVectorEnv (which merges every step's info dicts).
"""

import argparse
import os
import time

import numpy as np

from distrl.rl.actor import Actor
from distrl.rl.config import ApexConfig
from distrl.rl.envs import EnvBatch, env_spec, network_for
from distrl.rl.frames import is_atari
from distrl.rl.network import init_weights


def raw_rate(env_id: str, num_envs: int, seconds: float, way: str = "envbatch") -> float:
    """Env steps/s of num_envs envs stepped together with random actions: as EnvBatch steps
    them ("envbatch"), as single envs in a loop ("single") or as gymnasium's SyncVectorEnv
    ("sync")."""
    if way == "sync":
        import gymnasium as gym

        from distrl.rl.envs import make_env
        envs = gym.vector.SyncVectorEnv([lambda: make_env(env_id, True)] * num_envs)
        envs.reset(seed=list(range(num_envs)))
    else:
        envs = EnvBatch(env_id, num_envs, vectorised=None if way == "envbatch" else False)
        envs.reset(list(range(num_envs)))
    actions = np.random.default_rng(0).integers(0, env_spec(env_id)[1], size=(64, num_envs))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for row in actions:
            envs.step(row)
        steps += actions.size
    rate = steps / (time.perf_counter() - start)
    envs.close()
    return rate


def actor_rate(config: ApexConfig, seconds: float) -> float:
    actor = Actor(config, 0, init_weights(network_for(config), 0))
    actor.collect(config.actor_block_steps)  # warm up
    start_steps, start = actor.env_steps, time.perf_counter()
    transitions = 0
    while time.perf_counter() - start < seconds:
        transitions += len(actor.collect(config.actor_block_steps))
    return (actor.env_steps - start_steps) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=None,
                        help="the dense layers (default: ApexConfig's); e.g. 128 for MinAtar")
    parser.add_argument("--envs-per-actor", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.envs_per_actor, args.seconds = [8], 0.3
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core for both
    for k in args.envs_per_actor:
        raw = raw_rate(args.env, k, args.seconds)
        config = ApexConfig(env_id=args.env, num_actors=1, envs_per_actor=k,
                            **({"hidden_sizes": tuple(args.hidden_sizes)} if args.hidden_sizes else {}))
        rate = actor_rate(config, args.seconds)
        ways = {way: raw_rate(args.env, k, args.seconds, way) for way in ("single", "sync")}
        print(f"{args.env}, {k:>3} envs: raw random-action steps {raw:>10,.0f}/s; actor "
              f"(inference + n-step + priorities) {rate:>10,.0f}/s = {rate / raw:.0%} of raw "
              f"(target 50%), {rate / ways['sync']:.2f}x gymnasium's SyncVectorEnv"
              + (" (issue 51's goal for Atari: 0.8x)" if is_atari(args.env) else ""),
              flush=True)
        print(f"{args.env}, {k:>3} envs, random actions: EnvBatch {raw:,.0f}/s; single envs in a "
              f"loop {ways['single']:,.0f}/s (EnvBatch {raw / ways['single']:.1f}x); "
              f"gymnasium's SyncVectorEnv {ways['sync']:,.0f}/s (EnvBatch "
              f"{raw / ways['sync']:.1f}x)", flush=True)

if __name__ == "__main__":
    main()
