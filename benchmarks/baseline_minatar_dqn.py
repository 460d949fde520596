"""The peer of benchmarks/image_peer.py: Stable-Baselines3's DQN on a MinAtar game with the
MinAtar authors' own DQN (kenjyoung/MinAtar, examples/dqn.py at commit 46b00d9): one 3x3
convolution of 16 filters, 128 hidden units, batch 32, replay 100,000, centred RMSProp (step
0.00025, squared-gradient momentum 0.95, min squared gradient 0.01), a target network copied
every 1,000 steps, a training step every env step after 5,000 random ones, epsilon from 1 to
0.1 over the next 100,000. One process on the CPU. Every --eval-every-s seconds of training it
runs 10 greedy episodes (their time is not training time), and it stops after --budget-s
seconds of training. Prints one JSON line: the curve as (time.time(), evaluation seconds so
far, greedy mean return) points.

Runs in the baseline venv (benchmarks/requirements-baseline.txt), as baseline_dqn.py does.
"""

from __future__ import annotations

import argparse
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
EVAL_MAX_STEPS = 27_000  # distrl.rl.actor.EVAL_MAX_STEPS: both sides end evaluations there


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


class Curve(BaseCallback):
    """Greedy evaluations every eval_every_s seconds of training; stops at budget_s of it."""

    def __init__(self, env_id: str, eval_every_s: float, budget_s: float, seed: int):
        super().__init__()
        self.env_id, self.every, self.budget, self.seed = env_id, eval_every_s, budget_s, seed
        self.start = time.monotonic()
        self.eval_s = 0.0
        self.next_eval = eval_every_s
        self.points: list[tuple[float, float, float]] = []

    def evaluate(self) -> None:
        began = time.monotonic()
        value = greedy_mean_return(self.model, self.env_id, 10, self.seed + 10_000)
        self.eval_s += time.monotonic() - began
        self.points.append((time.time(), self.eval_s, value))

    def _on_step(self) -> bool:
        trained = time.monotonic() - self.start - self.eval_s
        if trained >= self.next_eval:
            self.next_eval += self.every
            self.evaluate()
        return trained < self.budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--eval-every-s", type=float, default=15.0)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.budget_s, args.eval_every_s = 3.0, 1.0
        AUTHORS["learning_starts"] = 200
    torch.set_num_threads(1)  # one process, one core, as the authors' agent
    register_envs()
    total = 10_000_000  # stopped by time long before; epsilon's schedule is a fraction of it
    model = DQN("MlpPolicy", gym.make(args.env), seed=args.seed, verbose=0, device="cpu",
                exploration_fraction=ANNEAL_STEPS / total,
                policy_kwargs=dict(features_extractor_class=MinAtarTorso, net_arch=[128],
                                   optimizer_class=torch.optim.RMSprop,
                                   optimizer_kwargs=dict(alpha=0.95, eps=0.01, centered=True)),
                **AUTHORS)
    model.set_logger(Logger(folder=None, output_formats=[]))  # no /tmp/SB3-<time> folders
    curve = Curve(args.env, args.eval_every_s, args.budget_s, args.seed)
    model.learn(total_timesteps=total, callback=curve)
    curve.evaluate()  # the return it ends with
    print(json.dumps({"env_steps": model.num_timesteps, "learner_updates": model._n_updates,
                      "curve": curve.points}))


if __name__ == "__main__":
    main()
