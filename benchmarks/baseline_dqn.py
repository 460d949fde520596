"""The baseline for benchmarks/time_to_solve.py: Stable-Baselines3's DQN on CartPole-v1 with
the RL Baselines3 Zoo's tuned hyperparameters, in one process, stopped when the greedy mean of
10 episodes reaches 475 (checked every 2,500 env steps). Prints one JSON line, with the
time.time() at the end of the solving evaluation (solved_at): time_to_solve.py times both sides
from their launch to that moment.

Runs in its own venv (benchmarks/requirements-baseline.txt): `make install` never installs
torch or Stable-Baselines3. time_to_solve.py builds that venv and calls this script.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger

# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 ("Almost Tuned"), as of commit 22e3ff2
# (2026-04-23). n_timesteps there is 5e4; we keep training past it until --max-steps.
ZOO_CARTPOLE = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
    gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
    exploration_fraction=0.16, exploration_final_eps=0.04,
    policy_kwargs=dict(net_arch=[256, 256]),
)
ZOO_TIMESTEPS = 50_000  # exploration_fraction is a fraction of this


def greedy_mean_return(model: DQN, episodes: int, seed: int) -> float:
    """Mean return of `episodes` greedy episodes, stepped together as a vector env."""
    envs = gym.make_vec("CartPole-v1", num_envs=episodes, vectorization_mode="sync")
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(episodes)
    done = np.zeros(episodes, dtype=bool)
    while not done.all():
        actions, _ = model.predict(obs, deterministic=True)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        returns += reward * ~done
        done |= terminated | truncated
    envs.close()
    return float(returns.mean())


class StopAtTarget(BaseCallback):
    def __init__(self, every: int, target: float, episodes: int, seed: int):
        super().__init__()
        self.every, self.target, self.episodes, self.seed = every, target, episodes, seed
        self.last_return = None
        self.solved_at = None  # env steps
        self.solved_time = None  # time.time() at the end of the solving evaluation
        self.eval_s = 0.0  # wall time of the greedy evaluations, inside the run's own

    def _on_step(self) -> bool:
        if self.num_timesteps % self.every:
            return True
        began = time.monotonic()
        self.last_return = greedy_mean_return(self.model, self.episodes, self.seed + 10_000)
        self.eval_s += time.monotonic() - began
        if self.last_return >= self.target:
            self.solved_at, self.solved_time = self.num_timesteps, time.time()
            return False
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-return", type=float, default=475.0)
    parser.add_argument("--eval-every", type=int, default=2_500)
    parser.add_argument("--max-steps", type=int, default=150_000)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.max_steps, args.eval_every = 1_500, 500
    elif args.max_steps < ZOO_TIMESTEPS or args.eval_every < 1:
        parser.error(f"--max-steps must be >= {ZOO_TIMESTEPS} and --eval-every >= 1")
    start = time.monotonic()
    env = gym.make("CartPole-v1")
    # SB3 anneals epsilon over exploration_fraction of learn()'s total_timesteps: scale it so
    # that epsilon reaches its floor after the zoo's 8,000 steps although we allow more.
    hyper = {**ZOO_CARTPOLE, "exploration_fraction":
             min(1.0, ZOO_CARTPOLE["exploration_fraction"] * ZOO_TIMESTEPS / args.max_steps)}
    model = DQN("MlpPolicy", env, seed=args.seed, verbose=0, device="cpu", **hyper)
    # A logger with no output: SB3's default one makes a new /tmp/SB3-<time> folder every run
    # (stable_baselines3/common/logger.py, configure) and leaves it there.
    model.set_logger(Logger(folder=None, output_formats=[]))
    stop = StopAtTarget(args.eval_every, args.target_return, 10, args.seed)
    model.learn(total_timesteps=args.max_steps, callback=stop)
    print(json.dumps({"solved": stop.solved_at is not None, "env_steps": model.num_timesteps,
                      "learner_updates": model._n_updates, "last_return": stop.last_return,
                      "eval_s": stop.eval_s, "train_s": time.monotonic() - start,
                      "solved_at": stop.solved_time}))


if __name__ == "__main__":
    main()
