"""The peer of benchmarks/image_peer.py: Stable-Baselines3's DQN on a MinAtar game with the
MinAtar authors' own DQN (kenjyoung/MinAtar, examples/dqn.py at commit 46b00d9): one 3x3
convolution of 16 filters, 128 hidden units, batch 32, replay 100,000, centred RMSProp (step
0.00025, squared-gradient momentum 0.95, min squared gradient 0.01), a target network copied
every 1,000 steps, a training step every env step after 5,000 random ones, epsilon from 1 to
0.1 over the next 100,000. One process on the CPU, with torch's default threads (one per
core, as distrl's processes share the cores).

It keeps a copy of its Q-network at each of --points (seconds since --launched-at, the
time.time() its caller launched it) without stopping, and ends at the last one. Then it plays
--episodes greedy episodes (seeds --eval-seed + i, at most 27,000 steps) with each copy: its
evaluations take none of its training time, as distrl's take none of its own in
benchmarks/image_peer.py. Prints one JSON line: the curve as (point, seconds since launch when
the copy was taken, greedy mean return) and the threads it trained with.

Runs in the baseline venv (benchmarks/requirements-baseline.txt), as baseline_dqn.py does.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import gymnasium as gym
import numpy as np
import torch
from minatar.gym import register_envs
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

# MinAtar's examples/dqn.py constants.
AUTHORS = dict(batch_size=32, buffer_size=100_000, target_update_interval=1_000, train_freq=1,
               gradient_steps=1, learning_starts=5_000, exploration_initial_eps=1.0,
               exploration_final_eps=0.1, learning_rate=0.00025, gamma=0.99)
ANNEAL_STEPS = 5_000 + 100_000  # epsilon reaches 0.1 here (after the random steps)
EVAL_MAX_STEPS = 27_000  # distrl.rl.envs.EVAL_MAX_STEPS: both sides end evaluations there


class MinAtarTorso(BaseFeaturesExtractor):
    """The authors' convolution: 16 filters of 3x3, stride 1, on channels-last planes."""

    def __init__(self, space: gym.spaces.Box):
        height, width, channels = space.shape
        super().__init__(space, features_dim=(height - 2) * (width - 2) * 16)
        self.conv = torch.nn.Conv2d(channels, 16, kernel_size=3, stride=1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(obs.permute(0, 3, 1, 2).float())).flatten(1)


def greedy_mean_return(model: DQN, env_id: str, episodes: int, seed: int) -> float:
    envs = [gym.make(env_id) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns, running = np.zeros(episodes), np.ones(episodes, dtype=bool)
    for _ in range(EVAL_MAX_STEPS):
        actions, _ = model.predict(obs, deterministic=True)
        for i, env in enumerate(envs):
            if running[i]:
                obs[i], reward, terminated, truncated, _ = env.step(int(actions[i]))
                returns[i] += reward
                running[i] = not (terminated or truncated)
        if not running.any():
            break
    return float(returns.mean())


class Snapshots(BaseCallback):
    """A copy of the Q-network at each point (seconds since launch); stops at the last one."""

    def __init__(self, launched_at: float, points: list[float]):
        super().__init__()
        self.launched_at, self.points = launched_at, points
        self.taken: list[tuple[float, float, dict]] = []  # (point, taken at, state_dict)

    def _on_step(self) -> bool:
        since = time.time() - self.launched_at
        while len(self.taken) < len(self.points) and since >= self.points[len(self.taken)]:
            state = copy.deepcopy(self.model.q_net.state_dict())
            self.taken.append((self.points[len(self.taken)], since, state))
        return len(self.taken) < len(self.points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--launched-at", type=float, default=None,
                        help="time.time() at the launch (default: this process's start)")
    parser.add_argument("--points", type=float, nargs="+", default=[60.0, 120.0, 180.0],
                        help="seconds since the launch at which the network is copied")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--eval-seed", type=int, default=10_000)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    launched_at = time.time() if args.launched_at is None else args.launched_at
    if args.smoke:
        AUTHORS["learning_starts"] = 200
        args.episodes = 2
        if args.launched_at is None:  # run alone: two points in its first seconds
            args.points = [1.5, 3.0]
    if sorted(args.points) != args.points or args.points[0] <= 0:
        parser.error(f"--points must be increasing seconds after the launch, got {args.points}")
    register_envs()
    total = 10_000_000  # stopped by time long before; epsilon's schedule is a fraction of it
    model = DQN("MlpPolicy", gym.make(args.env), seed=args.seed, verbose=0, device="cpu",
                exploration_fraction=ANNEAL_STEPS / total,
                policy_kwargs=dict(features_extractor_class=MinAtarTorso, net_arch=[128],
                                   optimizer_class=torch.optim.RMSprop,
                                   optimizer_kwargs=dict(alpha=0.95, eps=0.01, centered=True)),
                **AUTHORS)
    model.set_logger(Logger(folder=None, output_formats=[]))  # no /tmp/SB3-<time> folders
    snapshots = Snapshots(launched_at, args.points)
    model.learn(total_timesteps=total, callback=snapshots)
    curve = []
    for point, taken_at, state in snapshots.taken:
        model.q_net.load_state_dict(state)
        curve.append((point, taken_at, greedy_mean_return(model, args.env, args.episodes,
                                                          args.eval_seed)))
    print(json.dumps({"env_steps": model.num_timesteps, "learner_updates": model._n_updates,
                      "threads": torch.get_num_threads(), "curve": curve}))


if __name__ == "__main__":
    main()
