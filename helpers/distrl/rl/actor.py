"""Experience collection: vectorised gymnasium envs, per-slot epsilon, n-step folding on the actor.

    actor = Actor(config, actor_index=0, weights=init_weights(spec))
    block = actor.collect(num_steps=16)     # Transitions with initial priorities |delta|
    actor.set_weights(new_weights, version)

An actor never imports TensorFlow: it acts with a numpy forward pass of the learner's weights.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import threading
import time

import gymnasium as gym
import numpy as np

from distrl.rl.config import ApexConfig, epsilons
from distrl.rl.network import NATURE_TORSO, SMALL_TORSO, NetworkSpec
from distrl.rl.replay import Transitions, pack_frames

# gym.make imports an env's module on its first use. Two threads importing a package and one
# of its submodules at once (classic_control and classic_control.acrobot) can each find the
# other's module half-initialised: ImportError or KeyError, in 19 of 20 fresh processes where
# two drivers (notebook 05's threads) checked CartPole-v1 and Acrobot-v1 at once.
_FIRST_MAKE = threading.Lock()


def register_env(env_id: str) -> None:
    """Registers the environments that gymnasium finds only once asked: MinAtar's
    (`minatar.gym.register_envs`) and the Arcade Learning Environment's (ALE/...: ale_py's);
    gymnasium 1.x runs no plugin entry point that would."""
    if env_id in gym.registry:
        return
    if env_id.startswith("MinAtar/"):
        from minatar.gym import register_envs

        register_envs()
    elif stacks_frames(env_id):
        import ale_py

        gym.register_envs(ale_py)


# Atari preprocessing as in the DQN Nature paper (Mnih et al. 2015, Methods), which Ape-X
# builds on: 4 frames a step, each observation the max of the last two, 84x84 grey, the last
# 4 stacked, up to 30 no-op actions at the start of an episode, rewards clipped to [-1, 1] in
# training. gymnasium's AtariPreprocessing does all but the stack and the clip, with these
# defaults (gymnasium/wrappers/atari_preprocessing.py).
FRAME_STACK = 4
NOOP_MAX = 30


def stacks_frames(env_id: str) -> bool:
    """The Atari games (ALE/...), which make_env preprocesses and stacks FRAME_STACK deep."""
    return env_id.startswith("ALE/")


def make_env(env_id: str, training: bool = True, render_mode: str | None = None) -> gym.Env:
    """gym.make, plus for Atari gymnasium's own preprocessing (FRAME_STACK above): an
    (84, 84, 4) uint8 observation, channels last as the network takes images.

    The ALE env itself must not skip frames (AtariPreprocessing refuses one that does) and
    gets no sticky actions: v5 repeats the last action with probability 0.25
    (https://ale.farama.org/environments/), which the DQN papers' Atari did not. Life loss is
    not made terminal: the reset that follows restarts the whole game in AtariPreprocessing
    (it calls env.reset), so an agent would never play past its first life. Pong has none."""
    register_env(env_id)
    if not stacks_frames(env_id):
        return gym.make(env_id) if render_mode is None else gym.make(env_id, render_mode=render_mode)
    from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation, TransformObservation

    env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0, render_mode=render_mode)
    env = AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=4, screen_size=84,
                             terminal_on_life_loss=False, grayscale_obs=True)
    # (4, 84, 84); an episode's first observation has zero planes before its first frame, as
    # ale_py's AtariVectorEnv stacks them (EnvBatch steps Atari through that one).
    env = FrameStackObservation(env, FRAME_STACK, padding_type="zero")
    space = gym.spaces.Box(0, 255, (84, 84, FRAME_STACK), np.uint8)
    env = TransformObservation(env, lambda obs: np.moveaxis(obs, 0, -1), space)
    return ClipReward(env, -1.0, 1.0) if training else env


@functools.cache
def _spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of env_id, from one env made per process and id."""
    register_env(env_id)
    if env_id not in gym.registry:
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
    size = int(np.prod(obs_shape))
    if len(obs_shape) == 1:
        return NetworkSpec(size, num_actions, config.hidden_sizes, config.dueling)
    torso = config.torso
    if torso == "auto":
        torso = "small" if min(obs_shape[:2]) < 36 else "nature"
    scale = 1 / 255 if _spaces(config.env_id)[0].dtype == np.uint8 else 1.0
    return NetworkSpec(size, num_actions, config.hidden_sizes, config.dueling,
                       SMALL_TORSO if torso == "small" else NATURE_TORSO, obs_shape, scale)


def frames_per_transition(config: ApexConfig, obs_shape: tuple[int, ...]) -> float | None:
    """Planes a replay of image observations holds per transition (None: not images): what
    a block from NStepFolder.pop packs, per slot, for T = actor_block_steps new steps. The
    window has T + n - 1 steps (n - 1 carried over) and one final observation, T + n
    observations in all. Where frames are stacked (FRAME_STACK, Atari), the first takes all C
    planes and each later one a single plane: (C + T + n - 1) / T. Elsewhere every
    observation takes its C planes: C (T + n) / T. An episode's end adds a stack's planes."""
    if len(obs_shape) != 3:
        return None
    channels, steps, n = obs_shape[2], config.actor_block_steps, config.n_step
    if stacks_frames(config.env_id):
        return (channels + steps + n - 1) / steps
    return channels * (steps + n) / steps


def frames_per_block(config: ApexConfig, obs_shape: tuple[int, ...]) -> int:
    """Planes in one actor's block of image observations (0: not images), as above."""
    per_transition = frames_per_transition(config, obs_shape) or 0
    return math.ceil(per_transition * config.actor_block_steps * config.envs_per_actor)


def slot_epsilons(config: ApexConfig, actor_index: int) -> np.ndarray:
    """Epsilon of each env slot of one actor: Ape-X's spread over all N actors (x K slots)."""
    if not 0 <= actor_index < config.num_actors:
        raise ValueError(f"actor_index={actor_index!r} is invalid: expected 0 <= index < "
                         f"num_actors={config.num_actors}")
    all_eps = epsilons(config.num_slots, config.epsilon_base, config.epsilon_alpha)
    k = config.envs_per_actor
    if config.per_slot_epsilon:
        return all_eps[actor_index * k: (actor_index + 1) * k]
    return np.full(k, all_eps[actor_index])


class NStepFolder:
    """Folds single steps of K env slots into n-step transitions, vectorised over steps and slots.

    push() only records a step; pop() folds everything recorded so far. A transition that
    starts at step t is emitted once it has n rewards, with discount gamma^n and next_obs the
    observation n steps later. When the episode ends within those n steps it is emitted with
    the k <= n rewards it got:
    - terminated: discount 0 (the return has really ended: nothing to bootstrap from);
    - truncated (a time limit): discount gamma^k, bootstrapping from the final observation,
      because the state had a future that the time limit cut off.
    Steps whose n-step window is still open stay pending (at most n - 1 per slot) for the
    next pop(). A step pushed with valid=False for a slot (a vectorised env resetting it, see
    EnvBatch) starts no transition; it always follows an episode's end, so none folds it in.

    Image observations (obs_shape of rank 3) leave as frames (replay.pack_frames): each block
    holds the planes its transitions reference, each once.
    """

    def __init__(self, num_slots: int, n: int, gamma: float, obs_shape: tuple[int, ...]):
        if n < 1:
            raise ValueError(f"n={n!r} is invalid: expected an integer >= 1")
        self.n, self.gamma, self.num_slots = n, gamma, num_slots
        self.obs_shape = tuple(obs_shape)
        self.framed = len(self.obs_shape) == 3
        self._steps: list[tuple] = []
        # Rows carried over from the last pop: the last n - 1 steps and which are still pending.
        self._carry: tuple | None = None
        self._carry_pending = np.zeros((0, num_slots), dtype=bool)

    def push(self, obs, action, reward, next_obs, terminated, truncated, q_values=None,
             valid=None) -> None:
        """Record one vectorised step. next_obs is the final observation where an episode ended.

        q_values (K x actions), the Q(obs) the actor acted on, lets pop() compute priorities
        without running the network again for the steps it has already seen. valid (K bools,
        default all True) marks the slots whose action the env applied.
        """
        if q_values is None:
            q_values = np.full((len(action), 0), np.nan, np.float32)
        valid = np.ones(len(action), bool) if valid is None else np.asarray(valid, bool)
        self._steps.append((as_observation(obs), np.asarray(action, np.int64),
                            np.asarray(reward, np.float64), as_observation(next_obs),
                            np.asarray(terminated, bool), np.asarray(truncated, bool),
                            np.asarray(q_values, np.float32), valid))

    def pop(self, q_fn=None) -> Transitions:
        """Fold every recorded step; return the transitions that are complete.

        With q_fn (observations -> Q-values) and q_values pushed, each transition gets its
        initial priority |R + discount * max_a Q(s', a) - Q(s, a)|; otherwise priority is 0.
        """
        if not self._steps:
            return _empty_transitions(self.obs_shape, self.framed)
        obs, action, reward, next_obs, terminated, truncated, q, pending = (
            np.stack(column) for column in zip(*self._steps))
        self._steps = []
        if self._carry is not None:
            obs, action, reward, next_obs, terminated, truncated, q = (
                np.concatenate([old, new]) for old, new in
                zip(self._carry, (obs, action, reward, next_obs, terminated, truncated, q)))
            pending = np.concatenate([self._carry_pending, pending])
        length, n = len(action), self.n
        done = terminated | truncated

        ret = np.zeros(action.shape)
        alive = np.ones(action.shape, dtype=bool)      # no episode end seen yet
        ended = np.zeros(action.shape, dtype=bool)     # the episode ended within the window
        last = np.zeros(action.shape, dtype=np.int64)  # index of the step giving next_obs
        folded = np.zeros(action.shape, dtype=np.int64)  # rewards folded
        start = np.arange(length)[:, None]
        for i in range(n):
            idx = start + i
            inside = idx < length
            step = np.minimum(idx, length - 1)
            active = alive & inside
            ret += np.where(active, self.gamma ** i * np.take_along_axis(reward, step, 0), 0.0)
            last = np.where(active, step, last)
            folded += active
            ends_here = active & np.take_along_axis(done, step, 0)
            ended |= ends_here
            alive &= ~ends_here
        complete = ended | (start + n - 1 < length)
        emit = pending & complete

        rows, slots = np.nonzero(emit)
        last_rows = last[rows, slots]
        k = folded[rows, slots]
        discount = self.gamma ** k
        row_ended = ended[rows, slots]
        discount[row_ended & terminated[last_rows, slots]] = 0.0
        reward_n = ret[rows, slots].astype(np.float32)
        discount = discount.astype(np.float32)
        priority = np.zeros(len(rows), np.float32)
        # Where the transition bootstraps from an observation the actor acted on, that is the
        # next step's obs, and Q(s') is already known; else next_obs holds it (an episode's end,
        # or the window's).
        from_obs = ~row_ended & (last_rows + 1 < length)
        if q_fn is not None and q.shape[-1] > 0 and len(rows):
            q_next = np.empty(len(rows), np.float32)
            q_next[from_obs] = q[last_rows[from_obs] + 1, slots[from_obs]].max(axis=1)
            if (~from_obs).any():
                q_next[~from_obs] = q_fn(next_obs[last_rows[~from_obs], slots[~from_obs]]).max(axis=1)
            q_taken = q[rows, slots, action[rows, slots]]
            priority = np.abs(reward_n + discount * q_next - q_taken).astype(np.float32)
        if self.framed:  # each plane once, never each transition's whole observations
            block = _framed(obs, next_obs, rows, slots, last_rows, from_obs, action[rows, slots],
                            reward_n, discount, priority)
        else:
            block = Transitions(obs=obs[rows, slots], action=action[rows, slots], reward=reward_n,
                                discount=discount, next_obs=next_obs[last_rows, slots],
                                priority=priority)

        keep = min(n - 1, length)
        tail = slice(length - keep, length)
        self._carry = tuple(a[tail] for a in (obs, action, reward, next_obs, terminated, truncated,
                                             q))
        self._carry_pending = (pending & ~emit)[tail]
        return block


def as_observation(obs) -> np.ndarray:
    """Observations as the actors keep them: pixels stay uint8 (booleans become uint8, as
    MinAtar's planes), anything else becomes float32."""
    obs = np.asarray(obs)
    if obs.dtype == np.uint8:
        return obs
    return obs.astype(np.uint8 if obs.dtype == bool else np.float32, copy=False)


def _empty_transitions(obs_shape: tuple[int, ...], framed: bool = False) -> Transitions:
    if framed:
        refs = np.zeros((0, obs_shape[2]), np.int32)
        return Transitions(obs=refs, action=np.zeros(0, np.int64), reward=np.zeros(0, np.float32),
                           discount=np.zeros(0, np.float32), next_obs=refs.copy(),
                           priority=np.zeros(0, np.float32),
                           frames=np.zeros((0, *obs_shape[:2]), np.uint8))
    empty_obs = np.zeros((0, *obs_shape), np.float32)
    return Transitions(obs=empty_obs, action=np.zeros(0, np.int64), reward=np.zeros(0, np.float32),
                       discount=np.zeros(0, np.float32), next_obs=empty_obs.copy(),
                       priority=np.zeros(0, np.float32))


def _framed(obs, next_obs, rows, slots, last_rows, from_obs, action, reward, discount,
            priority) -> Transitions:
    """The block of transitions (rows, slots) with its observations packed as frames. The
    observations it references are the obs of steps (row, slot) and, where next_obs is not the
    next step's obs (from_obs False), a step's next_obs; laid out slot by slot in time order,
    a frame stack shares all but one plane with the observation before it."""
    length, num_slots = obs.shape[:2]
    used = np.zeros((length, num_slots, 2), dtype=bool)  # (row, slot, 0: obs / 1: next_obs)
    used[rows, slots, 0] = True
    used[last_rows[from_obs] + 1, slots[from_obs], 0] = True
    used[last_rows[~from_obs], slots[~from_obs], 1] = True
    slot, row, kind = np.nonzero(used.transpose(1, 0, 2))  # slot-major: each slot in time order
    entry = np.full(used.shape, -1, dtype=np.int64)
    entry[row, slot, kind] = np.arange(len(row))
    images = obs[row, slot]
    final = kind == 1
    images[final] = next_obs[row[final], slot[final]]
    frames, refs = pack_frames(images)
    next_entry = np.where(from_obs, entry[np.minimum(last_rows + 1, length - 1), slots, 0],
                          entry[last_rows, slots, 1])
    return Transitions(obs=refs[entry[rows, slots, 0]], action=action, reward=reward,
                       discount=discount, next_obs=refs[next_entry], priority=priority,
                       frames=frames)


def initial_priorities(spec: NetworkSpec, weights, block: Transitions) -> np.ndarray:
    """|R + discount * max_a Q(s', a) - Q(s, a)| with the actor's own copy of the network."""
    if len(block) == 0:
        return np.zeros(0, np.float32)
    obs, next_obs = block.obs, block.next_obs
    if block.frames is not None:
        obs, next_obs = block.observations(obs), block.observations(next_obs)
    q = spec.q_values(weights, obs)
    q_next = spec.q_values(weights, next_obs)
    target = block.reward + block.discount * q_next.max(axis=1)
    return np.abs(target - q[np.arange(len(block)), block.action]).astype(np.float32)


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
        self.channels_first = self.vector is not None and stacks_frames(env_id)
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
    if stacks_frames(env_id):
        return _atari_vector_env(env_id, num_envs, training)
    if gym.spec(env_id).vector_entry_point is None:
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
                          repeat_action_probability=0.0, frameskip=4, stack_num=FRAME_STACK,
                          img_height=84, img_width=84, grayscale=True, maxpool=True,
                          noop_max=NOOP_MAX, episodic_life=False, use_fire_reset=False,
                          reward_clipping=training)


class Actor:
    """K envs of one actor process, stepped together, exploring with their own epsilons."""

    def __init__(self, config: ApexConfig, actor_index: int, weights: list[np.ndarray],
                 weights_version: int = 0):
        self.config = config
        self.index = actor_index
        self.obs_shape, self.num_actions = env_spec(config.env_id)
        self.spec = network_for(config)
        self.epsilons = slot_epsilons(config, actor_index)
        k = config.envs_per_actor
        seeds = np.random.SeedSequence([config.seed, actor_index]).generate_state(k + 1)
        self.rng = np.random.default_rng(seeds[-1])
        self.envs = EnvBatch(config.env_id, k)
        self.obs = self.envs.reset(seeds=[int(s) for s in seeds[:k]])
        self.folder = NStepFolder(k, config.n_step, config.gamma, self.obs_shape)
        self.weights, self.weights_version = weights, weights_version
        self.env_steps = 0
        self.first_step_time: float | None = None  # time.time() when the first env.step returned
        self.episode_return = np.zeros(k)
        self.episode_length = np.zeros(k, dtype=np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []

    def set_weights(self, weights: list[np.ndarray], version: int) -> None:
        self.weights, self.weights_version = weights, version

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.spec.q_values(self.weights, obs)

    def act(self, q_values: np.ndarray) -> np.ndarray:
        """Epsilon-greedy actions from Q-values, one epsilon per slot."""
        actions = q_values.argmax(axis=1)
        explore = self.rng.random(len(actions)) < self.epsilons
        if explore.any():
            actions[explore] = self.rng.integers(self.num_actions, size=int(explore.sum()))
        return actions

    def collect(self, num_steps: int) -> Transitions:
        """Step every env num_steps times; return the folded transitions with priorities."""
        self.step(num_steps)
        return self.fold()

    def step(self, num_steps: int, durations_ms: list | None = None) -> None:
        """Step every env num_steps times (epsilon-greedy), recording the steps for fold();
        with durations_ms, every single env.step's time is appended to it (telemetry: the
        p99 of rl.step.duration must see the slow steps, not a block's average)."""
        for _ in range(num_steps):
            q = self.q_values(self.obs)
            actions = self.act(q)
            next_obs, reward, terminated, truncated, final_obs, stepped = self.envs.step(
                actions, durations_ms)
            if self.first_step_time is None:  # wall-clock: the driver's timeline is another process
                self.first_step_time = time.time()
            done = terminated | truncated
            self.folder.push(self.obs, actions, reward, final_obs, terminated, truncated, q,
                             stepped)
            self.episode_return += reward
            self.episode_length += stepped
            self.env_steps += int(stepped.sum())
            for j in np.flatnonzero(done):
                self.finished_returns.append(float(self.episode_return[j]))
                self.finished_lengths.append(int(self.episode_length[j]))
                self.episode_return[j] = 0.0
                self.episode_length[j] = 0
            self.obs = next_obs

    def fold(self) -> Transitions:
        """n-step transitions completed by the steps so far, with their initial priorities."""
        return self.folder.pop(q_fn=self.q_values)

    def pop_episode_stats(self) -> tuple[list[float], list[int]]:
        returns, lengths = self.finished_returns, self.finished_lengths
        self.finished_returns, self.finished_lengths = [], []
        return returns, lengths

    def close(self) -> None:
        self.envs.close()


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
    return EVAL_EPSILON_ATARI if stacks_frames(env_id) else 0.0


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


__all__ = ["Actor", "EnvBatch", "NStepFolder", "as_observation", "env_spec", "eval_epsilon",
           "evaluate_greedy",
           "frames_per_block", "frames_per_transition", "initial_priorities", "make_env", "network_for",
           "record_greedy_episode", "register_env", "slot_epsilons", "stacks_frames"]
