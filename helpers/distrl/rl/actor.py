"""Experience collection: per-slot epsilon, n-step folding on the actor.

    actor = Actor(config, actor_index=0, weights=init_weights(spec))
    block = actor.collect(num_steps=16)     # Transitions with initial priorities |delta|
    actor.set_weights(new_weights, version)

An actor steps its envs together (envs.EnvBatch) and never imports TensorFlow: it acts with a
numpy forward pass of the learner's weights.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from distrl.rl import frames
from distrl.rl.config import ApexConfig
from distrl.rl.envs import EnvBatch, as_observation, env_spec, network_for
from distrl.rl.network import NetworkSpec
from distrl.rl.transitions import Transitions


def epsilons(num_slots: int, base: float = 0.4, alpha: float = 7.0):
    """Ape-X per-slot exploration: eps_i = base ** (1 + alpha * i / (N - 1)); N = 1 gives base."""
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
        raise ValueError(f"num_slots={num_slots!r} is invalid: expected an integer >= 1")
    if num_slots == 1:
        return np.array([base], dtype=np.float64)
    i = np.arange(num_slots, dtype=np.float64)
    return base ** (1.0 + alpha * i / (num_slots - 1))


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


def actor_epsilon_table(config: ApexConfig) -> list[list[float]]:
    """The epsilons every actor's env slots will use (no Ray needed)."""
    return [slot_epsilons(config, i).tolist() for i in range(config.num_actors)]


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

    Image observations (obs_shape of rank 3) leave as frames (frames.pack_block): each block
    holds the planes its transitions reference, each once.
    """

    def __init__(self, num_slots: int, n: int, gamma: float, obs_shape: tuple[int, ...]):
        if n < 1:
            raise ValueError(f"n={n!r} is invalid: expected an integer >= 1")
        self.n, self.gamma, self.num_slots = n, gamma, num_slots
        self.obs_shape = tuple(obs_shape)
        self.framed = len(self.obs_shape) == 3
        self._steps: list[_Steps] = []
        self._carry: _Steps | None = None  # the last n - 1 steps of the last pop

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
        self._steps.append(_Steps(
            obs=as_observation(obs), action=np.asarray(action, np.int64),
            reward=np.asarray(reward, np.float64), next_obs=as_observation(next_obs),
            terminated=np.asarray(terminated, bool), truncated=np.asarray(truncated, bool),
            q=np.asarray(q_values, np.float32), pending=valid))

    def pop(self, q_fn=None) -> Transitions:
        """Fold every recorded step; return the transitions that are complete.

        With q_fn (observations -> Q-values) and q_values pushed, each transition gets its
        initial priority |R + discount * max_a Q(s', a) - Q(s, a)|; otherwise priority is 0.
        """
        if not self._steps:
            return _empty_transitions(self.obs_shape, self.framed)
        steps = self._recorded()
        obs, action, next_obs, q = steps.obs, steps.action, steps.next_obs, steps.q
        length = len(action)
        ret, ended, last, folded = fold_windows(steps.reward, steps.terminated | steps.truncated,
                                                self.n, self.gamma)
        emit = steps.pending & (ended | (np.arange(length)[:, None] + self.n - 1 < length))
        rows, slots = np.nonzero(emit)
        last_rows, row_ended = last[rows, slots], ended[rows, slots]
        discount = (self.gamma ** folded[rows, slots]).astype(np.float32)
        discount[row_ended & steps.terminated[last_rows, slots]] = 0.0
        reward_n, taken = ret[rows, slots].astype(np.float32), action[rows, slots]
        # Where the transition bootstraps from an observation the actor acted on, that is the
        # next step's obs, and Q(s') is already known; else next_obs holds it (an episode's end,
        # or the window's).
        from_obs = ~row_ended & (last_rows + 1 < length)
        priority = np.zeros(len(rows), np.float32)
        if q_fn is not None and q.shape[-1] > 0 and len(rows):
            q_next = np.empty(len(rows), np.float32)
            q_next[from_obs] = q[last_rows[from_obs] + 1, slots[from_obs]].max(axis=1)
            if (~from_obs).any():
                q_next[~from_obs] = q_fn(next_obs[last_rows[~from_obs], slots[~from_obs]]).max(axis=1)
            priority = np.abs(reward_n + discount * q_next - q[rows, slots, taken])
        if self.framed:  # each plane once, never each transition's whole observations
            planes, obs_refs, next_refs = frames.pack_block(obs, next_obs, rows, slots, last_rows,
                                                            from_obs)
            block = Transitions(obs=obs_refs, action=taken, reward=reward_n, discount=discount,
                                next_obs=next_refs, priority=priority, frames=planes)
        else:
            block = Transitions(obs=obs[rows, slots], action=taken, reward=reward_n,
                                discount=discount, next_obs=next_obs[last_rows, slots],
                                priority=priority)
        tail = slice(length - min(self.n - 1, length), length)
        self._carry = _Steps._make(field[tail] for field in steps._replace(
            pending=steps.pending & ~emit))
        return block

    def _recorded(self) -> _Steps:
        """The steps recorded since the last pop, after the n - 1 carried over."""
        steps = _Steps._make(np.stack(field) for field in zip(*self._steps))
        self._steps = []
        if self._carry is not None:
            steps = _Steps._make(np.concatenate(pair) for pair in zip(self._carry, steps))
        return steps


class _Steps(NamedTuple):
    """Steps as NStepFolder records them: per step (a row), per env slot (a column)."""
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray  # the final observation where an episode ended
    terminated: np.ndarray
    truncated: np.ndarray
    q: np.ndarray  # Q(obs) the actor acted on, x actions (no columns when not given)
    pending: np.ndarray  # the step starts a transition not emitted yet


def fold_windows(reward: np.ndarray, done: np.ndarray, n: int, gamma: float
                 ) -> tuple[np.ndarray, ...]:
    """The n-step window starting at each step (length x slots), cut at an episode's end:
    its discounted return, whether the episode ended in it, the step whose next_obs closes
    it, and how many rewards it folded."""
    length = len(reward)
    ret = np.zeros(reward.shape)
    alive = np.ones(reward.shape, dtype=bool)      # no episode end seen yet
    ended = np.zeros(reward.shape, dtype=bool)     # the episode ended within the window
    last = np.zeros(reward.shape, dtype=np.int64)  # index of the step giving next_obs
    folded = np.zeros(reward.shape, dtype=np.int64)
    start = np.arange(length)[:, None]
    for i in range(n):
        idx = start + i
        step = np.minimum(idx, length - 1)
        active = alive & (idx < length)
        ret += np.where(active, gamma ** i * np.take_along_axis(reward, step, 0), 0.0)
        last = np.where(active, step, last)
        folded += active
        ends_here = active & np.take_along_axis(done, step, 0)
        ended |= ends_here
        alive &= ~ends_here
    return ret, ended, last, folded


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


__all__ = ["Actor", "NStepFolder", "epsilons", "fold_windows", "initial_priorities",
           "slot_epsilons"]
