"""Environments: gymnasium envs made as the network takes them, stepped K at a time, and
evaluated greedily.

    envs = EnvBatch("CartPole-v1", 32)         # vectorised where gymnasium or ale_py can
    obs = envs.reset(seeds=range(32))
    obs, reward, terminated, truncated, final_obs, stepped = envs.step(actions)

env_spec says what an env gives (observation shape, actions) or why Ape-X cannot take it;
network_for the Q-network it needs.
"""

from __future__ import annotations

import difflib
import functools
import os
import threading
import time

import gymnasium as gym
import numpy as np

from distrl.rl.config import ApexConfig
from distrl.rl.frames import FRAME_STACK, is_atari
from distrl.rl.network import NATURE_TORSO, SMALL_TORSO, NetworkSpec

# gym.make imports an env's module on its first use. Two threads importing a package and one
# of its submodules at once (classic_control and classic_control.acrobot) can each find the
# other's module half-initialised: ImportError or KeyError, in 19 of 20 fresh processes where
# two drivers (notebook 05's threads) checked CartPole-v1 and Acrobot-v1 at once.
_FIRST_MAKE = threading.Lock()


def register_env(env_id: str) -> None:
    """Registers the environments that gymnasium finds only once asked: MinAtar's
    (`minatar.gym.register_envs`), the Arcade Learning Environment's (ALE/...: ale_py's), and
    your own as gym.make takes them, `"my_module:MyEnv-v0"` (importing my_module registers it);
    gymnasium 1.x runs no plugin entry point that would."""
    if registered_id(env_id) in gym.registry:
        return
    if ":" in env_id:
        import importlib

        importlib.import_module(env_id.split(":")[0])
    elif env_id.startswith("MinAtar/"):
        from minatar.gym import register_envs

        register_envs()
    elif is_atari(env_id):
        import ale_py

        gym.register_envs(ale_py)


def registered_id(env_id: str) -> str:
    """The id in gymnasium's registry: `MyEnv-v0` of `"my_module:MyEnv-v0"`."""
    return env_id.split(":")[-1]


# Atari preprocessing as in the DQN Nature paper (Mnih et al. 2015, Methods), which Ape-X
# builds on: 4 frames a step, each observation the max of the last two, 84x84 grey, the last
# 4 stacked, up to 30 no-op actions at the start of an episode, rewards clipped to [-1, 1] in
# training (FRAME_STACK: frames.py). gymnasium's AtariPreprocessing does all but the stack and
# the clip, with these defaults (gymnasium/wrappers/atari_preprocessing.py).
NOOP_MAX, FRAME_SKIP, SCREEN_SIZE = 30, 4, 84


def make_env(env_id: str, training: bool = True, render_mode: str | None = None) -> gym.Env:
    """gym.make, plus for Atari gymnasium's own preprocessing (frames.FRAME_STACK): an
    (84, 84, 4) uint8 observation, channels last as the network takes images.

    The ALE env itself must not skip frames (AtariPreprocessing refuses one that does) and
    gets no sticky actions: v5 repeats the last action with probability 0.25
    (https://ale.farama.org/environments/), which the DQN papers' Atari did not. Life loss is
    not made terminal: the reset that follows restarts the whole game in AtariPreprocessing
    (it calls env.reset), so an agent would never play past its first life. Pong has none."""
    register_env(env_id)
    if not is_atari(env_id):
        return gym.make(env_id) if render_mode is None else gym.make(env_id, render_mode=render_mode)
    from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation, TransformObservation

    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, render_mode=render_mode)
    env = AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
                             terminal_on_life_loss=False, grayscale_obs=True)
    # (4, 84, 84); an episode's first observation has zero planes before its first frame, as
    # ale_py's AtariVectorEnv stacks them (EnvBatch steps Atari through that one).
    env = FrameStackObservation(env, FRAME_STACK, padding_type="zero")
    space = gym.spaces.Box(0, 255, (SCREEN_SIZE, SCREEN_SIZE, FRAME_STACK), np.uint8)
    env = TransformObservation(env, lambda obs: np.moveaxis(obs, 0, -1), space)
    return ClipReward(env, -1.0, 1.0) if training else env


@functools.cache


def _spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of env_id, from one env made per process and id."""
    register_env(env_id)
    if registered_id(env_id) not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"env_id={env_id!r} is not a registered gymnasium environment{hint} "
                         "(gymnasium.pprint_registry() lists them)")
    with _FIRST_MAKE:
        env = make_env(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


ACCEPTED_OBSERVATIONS = ("a Box of rank 1 (a vector: the dense layers) or rank 3 (an image, "
                         "height x width x channels of uint8 or bool pixels: convolutions first)")


# Images travel and are stored as uint8 planes (as_observation, the replay's frames, the
# learner's input): a float image would be cut to integers, so env_spec refuses one.
IMAGE_DTYPES = (np.uint8, np.bool_)


def env_spec(env_id: str) -> tuple[tuple[int, ...], int]:
    """(observation shape, number of actions) of a gymnasium env, or a ValueError saying why not.

    Ape-X DQN needs a Discrete action space, and observations the Q-network takes: a vector, or
    an image (height, width, channels).
    """
    obs_space, act_space = _spaces(env_id)
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ValueError(f"env_id={env_id!r} has action space {act_space}; DQN needs a Discrete "
                         "action space (e.g. CartPole-v1, Acrobot-v1, LunarLander-v3)")
    if (not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (1, 3)
            or (len(obs_space.shape) == 3 and obs_space.dtype not in IMAGE_DTYPES)):
        raise ValueError(f"env_id={env_id!r} has observation space {obs_space}; the Q-network "
                         f"takes {ACCEPTED_OBSERVATIONS}")
    return tuple(obs_space.shape), int(act_space.n)


def network_for(config: ApexConfig) -> NetworkSpec:
    """The Q-network of config for its environment: dense layers for vector observations, a
    convolutional torso first for images (config.torso), whose uint8 pixels are scaled to
    [0, 1]. The learner's, and the one each actor's first life initialises itself (init_weights
    is seeded, so they start from the same weights)."""
    obs_shape, num_actions = env_spec(config.env_id)
    if len(obs_shape) == 1:
        return NetworkSpec(obs_shape, num_actions, config.hidden_sizes, config.dueling)
    torso = config.torso
    if torso == "auto":
        torso = "small" if min(obs_shape[:2]) < 36 else "nature"
    scale = 1 / 255 if _spaces(config.env_id)[0].dtype == np.uint8 else 1.0
    return NetworkSpec(obs_shape, num_actions, config.hidden_sizes, config.dueling,
                       SMALL_TORSO if torso == "small" else NATURE_TORSO, scale)


def as_observation(obs) -> np.ndarray:
    """Observations as the actors keep them: pixels stay uint8 (booleans become uint8, as
    MinAtar's planes), anything else becomes float32."""
    obs = np.asarray(obs)
    if obs.dtype == np.uint8:
        return obs
    return obs.astype(np.uint8 if obs.dtype == bool else np.float32, copy=False)


class EnvBatch:
    """K gymnasium envs stepped in lockstep; an episode that ends starts again by itself.

    Where the env has a vectorised version, that steps all K slots in one call, far cheaper
    per env step than K single envs: gymnasium's own (a `vector_entry_point`, as CartPole-v1
    has: its physics in numpy), or for Atari ale_py's AtariVectorEnv (C++ stepping and
    preprocessing). Otherwise K single envs are stepped in a loop, as fast as gymnasium's
    SyncVectorEnv and without its autoreset rules. `python benchmarks/actor_throughput.py`
    measures all three.

    step() returns (next_obs, reward, terminated, truncated, final_obs, stepped): final_obs is
    the observation an episode ended on, for bootstrapping a truncated one. Single envs are
    reset in the step they end (next_obs already holds the new episode's first observation).
    A vectorised env resets a slot in its *next* step instead (gymnasium's NEXT_STEP autoreset):
    that step ignores the slot's action and gives reward 0, and stepped is False there.
    """

    def __init__(self, env_id: str, num_envs: int, vectorised: bool | None = None,
                 training: bool = True):
        """vectorised: None uses gymnasium's vectorised env where there is one; False never.
        training: False for evaluation (make_env: Atari rewards unclipped)."""
        self.num_envs = num_envs
        register_env(env_id)
        self.vector = _vector_env(env_id, num_envs, training) if vectorised is not False else None
        if vectorised and self.vector is None:
            raise ValueError(f"vectorised=True: gymnasium has no vectorised {env_id} "
                             "(no vector_entry_point in its registration, or make_env "
                             "preprocesses it)")
        self.envs = [] if self.vector is not None else [make_env(env_id, training)
                                                        for _ in range(num_envs)]
        self.channels_first = self.vector is not None and is_atari(env_id)
        self.obs = None
        self.resetting = np.zeros(num_envs, dtype=bool)  # vectorised: slots its next step resets

    def __len__(self) -> int:
        return self.num_envs

    def reset(self, seeds: list[int]) -> np.ndarray:
        """Start every slot. gymnasium's vectorised envs take one seed (the first) for all
        their slots; AtariVectorEnv takes one a slot, each below 2**31 (a C int)."""
        if self.channels_first:
            obs, _ = self.vector.reset(seed=np.asarray(seeds, np.int64) % 2**31)
        elif self.vector is not None:
            obs, _ = self.vector.reset(seed=int(seeds[0]))
        else:
            obs = np.stack([env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)])
        self.obs = self._own_copy(obs) if self.vector is not None else as_observation(obs)
        self.resetting[:] = False
        return self.obs

    def step(self, actions: np.ndarray, durations_ms: list | None = None):
        """One step of every slot (see the class docstring for what it returns); with
        durations_ms, each env.step's own time is appended to it (vectorised: the call's time
        divided by K, once per call)."""
        if self.vector is not None:
            return self._step_vector(actions, durations_ms)
        k = len(self.envs)
        next_obs = np.empty_like(self.obs)
        reward = np.empty(k)
        terminated = np.empty(k, dtype=bool)
        truncated = np.empty(k, dtype=bool)
        ended = []
        for j, (env, action) in enumerate(zip(self.envs, actions.tolist())):
            if durations_ms is None:
                obs, reward[j], terminated[j], truncated[j], _ = env.step(action)
            else:
                t0 = time.perf_counter()
                obs, reward[j], terminated[j], truncated[j], _ = env.step(action)
                durations_ms.append((time.perf_counter() - t0) * 1e3)
            if terminated[j] or truncated[j]:
                ended.append((j, obs))
                obs, _ = env.reset()
            next_obs[j] = obs
        final_obs = next_obs
        if ended:
            final_obs = next_obs.copy()
            for j, obs in ended:
                final_obs[j] = obs
        self.obs = next_obs
        return next_obs, reward, terminated, truncated, final_obs, np.ones(k, bool)

    def _step_vector(self, actions: np.ndarray, durations_ms: list | None):
        t0 = time.perf_counter()
        obs, reward, terminated, truncated, _ = self.vector.step(np.asarray(actions))
        if durations_ms is not None:
            durations_ms.append((time.perf_counter() - t0) * 1e3 / self.num_envs)
        stepped = ~self.resetting
        self.resetting = terminated | truncated
        # One fresh array, never written to again: the next obs, and the final obs (a slot
        # resets in its next step), for the caller to keep.
        self.obs = self._own_copy(obs)
        return (self.obs, np.asarray(reward, np.float64), terminated, truncated, self.obs,
                stepped)

    def _own_copy(self, obs) -> np.ndarray:
        """The vectorised env's observations in an array of our own (it reuses its buffer),
        channels last: ale_py's AtariVectorEnv stacks frames channels first."""
        obs = as_observation(obs)
        if self.channels_first:
            return np.ascontiguousarray(obs.transpose(0, 2, 3, 1))
        return obs.copy()

    def close(self) -> None:
        if self.vector is not None:
            self.vector.close()
        for env in self.envs:
            env.close()


def _vector_env(env_id: str, num_envs: int, training: bool = True):
    """A vectorised env for env_id, or None where there is none: ale_py's AtariVectorEnv for
    Atari, else gymnasium's own (a `vector_entry_point`, as CartPole-v1 has; None where its
    dependencies are missing, as JAX is for phys2d/CartPole)."""
    if is_atari(env_id):
        return _atari_vector_env(env_id, num_envs, training)
    if gym.spec(registered_id(env_id)).vector_entry_point is None:
        return None
    try:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    except (ImportError, gym.error.Error):
        return None


def _atari_vector_env(env_id: str, num_envs: int, training: bool):
    """ale_py's AtariVectorEnv (C++ stepping and preprocessing), set to make_env's Atari: the
    same frames, rewards and episode ends, step for step (tests/test_actor.py compares them).
    Its defaults differ in two places: it fires on reset, and it clips rewards in evaluation
    too. One thread: an actor process has one CPU."""
    from ale_py.vector_env import AtariVectorEnv

    spec = gym.spec(env_id)
    return AtariVectorEnv(spec.kwargs["game"], num_envs, num_threads=1,
                          max_num_frames_per_episode=spec.kwargs["max_num_frames_per_episode"],
                          repeat_action_probability=0.0, frameskip=FRAME_SKIP,
                          stack_num=FRAME_STACK, img_height=SCREEN_SIZE, img_width=SCREEN_SIZE,
                          grayscale=True, maxpool=True, noop_max=NOOP_MAX, episodic_life=False,
                          use_fire_reset=False, reward_clipping=training)


# An evaluation episode ends here at the latest: ALE's own cap, 108,000 frames (ale_py's
# max_num_frames_per_episode for v5), in agent steps of 4 frames. Some games have no end of
# their own (MinAtar's Breakout, for a paddle that never misses): a greedy evaluation must.
EVAL_MAX_STEPS = 27_000


# Atari is evaluated epsilon-greedy, as its literature does: epsilon 0.05 in the Nature DQN
# ("an epsilon-greedy policy with epsilon = 0.05", Mnih et al. 2015, Methods; Dopamine's
# dqn_nature.gin: DQNAgent.epsilon_eval = 0.05; Dopamine's own default is 0.001). Without
# sticky actions (make_env) a greedy policy is deterministic after its no-ops, and a young one
# can return the ball forever without scoring: an episode that ends at EVAL_MAX_STEPS with a
# return near 0 would read as learning. Other environments are evaluated greedily.
EVAL_EPSILON_ATARI = 0.05


def eval_epsilon(env_id: str) -> float:
    """The evaluation's epsilon: EVAL_EPSILON_ATARI for Atari, 0 (greedy) elsewhere."""
    return EVAL_EPSILON_ATARI if is_atari(env_id) else 0.0


def evaluate_greedy(env_id: str, weights: list[np.ndarray], episodes: int, seed: int,
                    spec: NetworkSpec, max_steps: int = EVAL_MAX_STEPS, epsilon: float = 0.0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Returns and lengths of `episodes` greedy episodes (epsilon-greedy with a small epsilon:
    eval_epsilon) of the network spec with these weights, stepped together; an episode still
    running after max_steps counts with the return it has then."""
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon={epsilon!r}: expected a probability in [0, 1)")
    envs = EnvBatch(env_id, episodes, training=False)
    rng = np.random.default_rng(seed)
    try:
        obs = envs.reset(seeds=[seed + i for i in range(episodes)])
        returns = np.zeros(episodes)
        lengths = np.zeros(episodes, dtype=np.int64)
        running = np.ones(episodes, dtype=bool)
        # A slot that has ended starts again; only its first episode counts.
        while running.any() and lengths.max() < max_steps:
            q = spec.q_values(weights, obs)
            actions = q.argmax(axis=1)
            if epsilon > 0:
                explore = rng.random(episodes) < epsilon
                actions = np.where(explore, rng.integers(q.shape[1], size=episodes), actions)
            obs, reward, terminated, truncated, _, _ = envs.step(actions)
            returns += np.where(running, reward, 0.0)
            lengths += running
            running &= ~(terminated | truncated)
        return returns, lengths
    finally:
        envs.close()


def record_greedy_episode(env_id: str, weights: list[np.ndarray], spec: NetworkSpec, seed: int = 0,
                          max_frames: int = 1000) -> tuple[list, float]:
    """RGB frames of one greedy episode of the network spec with these weights (for an
    animation) and its return."""
    # Off-screen rendering: pygame needs neither a display nor a sound card for rgb_array.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    env = make_env(env_id, training=False, render_mode="rgb_array")
    try:
        obs, _ = env.reset(seed=seed)
        frames, total = [env.render()], 0.0
        for _ in range(max_frames):
            q = spec.q_values(weights, as_observation(obs)[None])
            obs, reward, terminated, truncated, _ = env.step(int(q.argmax()))
            total += float(reward)
            frames.append(env.render())
            if terminated or truncated:
                break
        return frames, total
    finally:
        env.close()


__all__ = ["EnvBatch", "as_observation", "env_spec", "eval_epsilon", "evaluate_greedy",
           "make_env", "network_for", "record_greedy_episode", "register_env"]
