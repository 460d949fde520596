"""One actor process against the raw gymnasium step rate of the same env, on the same core.

    python benchmarks/actor_throughput.py [--env CartPole-v1] [--envs-per-actor 32]

Raw: `env.step(action)` in a loop with a reset at episode end, nothing else. Actor: the
Actor class as the Ray actor runs it: numpy inference for a batch of envs, epsilon-greedy,
n-step folding and initial priorities. Target (issue 2): actor >= 50% of raw. Where gymnasium
has a vectorised version of the env (CartPole), the actor steps that and beats the raw single-env
loop; for others (Acrobot-v1) it steps single envs as the raw loop does.
"""

import argparse
import os
import time

import gymnasium as gym
import numpy as np

from distrl.actor import Actor, env_spec
from distrl.config import ApexConfig
from distrl.network import NetworkSpec, init_weights


def raw_rate(env_id: str, seconds: float) -> float:
    env = gym.make(env_id)
    env.reset(seed=0)
    n_actions = env.action_space.n
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            _, _, terminated, truncated, _ = env.step(steps % n_actions)
            steps += 1
            if terminated or truncated:
                env.reset()
    return steps / (time.perf_counter() - start)


def actor_rate(config: ApexConfig, seconds: float) -> float:
    obs_shape, n_actions = env_spec(config.env_id)
    spec = NetworkSpec(int(np.prod(obs_shape)), n_actions, config.hidden_sizes, config.dueling)
    actor = Actor(config, 0, init_weights(spec, 0))
    actor.collect(config.actor_block_steps)  # warm up
    start_steps, start = actor.env_steps, time.perf_counter()
    transitions = 0
    while time.perf_counter() - start < seconds:
        transitions += len(actor.collect(config.actor_block_steps))
    return (actor.env_steps - start_steps) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs-per-actor", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core for both
    raw = raw_rate(args.env, args.seconds)
    print(f"{args.env} raw gymnasium env.step loop: {raw:>10,.0f} steps/s")
    for k in args.envs_per_actor:
        config = ApexConfig(env_id=args.env, num_actors=1, envs_per_actor=k)
        rate = actor_rate(config, args.seconds)
        print(f"actor, {k:>3} envs (inference + n-step + priorities): {rate:>10,.0f} steps/s "
              f"= {rate / raw:.0%} of raw (target 50%)")


if __name__ == "__main__":
    main()
