"""n-step folding, epsilons, environment checks and the actor's own priorities."""

import time

import gymnasium as gym
import numpy as np
import pytest

from distrl.rl.actor import Actor, NStepFolder, epsilons, initial_priorities, slot_epsilons
from distrl.rl.config import ApexConfig
from distrl.rl.envs import EnvBatch, env_spec, evaluate_greedy, network_for
from distrl.rl.network import SMALL_TORSO, NetworkSpec, init_weights


def push_episode(folder, rewards, end):
    """One slot; obs_t = t, next_obs_t = t + 1 (the final obs is 100 + len)."""
    for t, r in enumerate(rewards):
        last = t == len(rewards) - 1
        next_obs = 100.0 + len(rewards) if last and end else t + 1.0
        folder.push(np.array([[t]]), np.array([t % 2]), np.array([r]), np.array([[next_obs]]),
                    np.array([last and end == "terminated"]), np.array([last and end == "truncated"]))


def rows(block):
    return [(float(o[0]), float(r), float(d), float(n[0]))
            for o, r, d, n in zip(block.obs, block.reward, block.discount, block.next_obs)]


def test_terminated_episode_folds_without_bootstrap():
    folder = NStepFolder(1, n=3, gamma=0.5, obs_shape=(1,))
    push_episode(folder, [1, 2, 3, 4], "terminated")
    assert rows(folder.pop()) == [
        (0, 1 + 0.5 * 2 + 0.25 * 3, 0.125, 3),  # three rewards: bootstraps from obs 3
        (1, 2 + 0.5 * 3 + 0.25 * 4, 0.0, 104),  # the episode ends inside: no bootstrap
        (2, 3 + 0.5 * 4, 0.0, 104),
        (3, 4, 0.0, 104),
    ]


def test_truncated_episode_bootstraps_from_the_final_observation():
    folder = NStepFolder(1, n=3, gamma=0.5, obs_shape=(1,))
    push_episode(folder, [1, 2, 3, 4], "truncated")
    assert rows(folder.pop()) == [
        (0, 2.75, 0.125, 3),
        (1, 4.5, 0.125, 104),  # gamma^3: three rewards, then the cut-off future
        (2, 5.0, 0.25, 104),   # gamma^2
        (3, 4.0, 0.5, 104),    # gamma^1
    ]


def test_open_steps_wait_for_the_next_pop():
    folder = NStepFolder(1, n=3, gamma=0.5, obs_shape=(1,))
    push_episode(folder, [1, 2, 3, 4, 5], None)
    assert [r[0] for r in rows(folder.pop())] == [0, 1, 2]  # 3 and 4 lack rewards
    push_episode(folder, [6], "terminated")  # obs 0 again, but it continues slot's episode
    assert rows(folder.pop()) == [(3, 4 + 0.5 * 5 + 0.25 * 6, 0.0, 101),
                                  (4, 5 + 0.5 * 6, 0.0, 101), (0, 6, 0.0, 101)]
    assert len(folder.pop()) == 0


def reference_fold(steps, n, gamma):
    """Brute force: walk every slot's steps in order, per transition."""
    out = []
    num_slots = len(steps[0][1])
    for j in range(num_slots):
        seq = [(s[0][j], s[1][j], s[2][j], s[3][j], s[4][j], s[5][j]) for s in steps]
        for t in range(len(seq)):
            ret, k = 0.0, 0
            for i in range(n):
                if t + i >= len(seq):
                    k = None
                    break
                obs, a, r, nxt, term, trunc = seq[t + i]
                ret += gamma ** i * r
                k = i + 1
                if term or trunc:
                    disc = 0.0 if term else gamma ** k
                    break
            else:
                disc = gamma ** n
            if k is None:  # the window is still open at the end: not emitted yet
                continue
            out.append((j, float(seq[t][0][0]), round(ret, 9), round(disc, 9),
                        float(seq[t + k - 1][3][0])))
    return sorted(out)


def test_folding_matches_a_brute_force_reference_on_random_episodes():
    rng = np.random.default_rng(0)
    num_slots, n, gamma = 5, 3, 0.9
    folder = NStepFolder(num_slots, n, gamma, (1,))
    steps, got = [], []
    counter = 0.0
    for _ in range(200):
        obs = counter + np.arange(num_slots, dtype=np.float64)[:, None] * 1000
        counter += 1
        action = rng.integers(0, 2, num_slots)
        reward = rng.normal(size=num_slots)
        end = rng.random(num_slots)
        terminated, truncated = end < 0.05, (end >= 0.05) & (end < 0.1)
        next_obs = obs + 0.5
        steps.append((obs, action, reward, next_obs, terminated, truncated))
        folder.push(obs, action, reward, next_obs, terminated, truncated)
        if rng.random() < 0.2:  # pop at random points: carries must be seamless
            got.append(folder.pop())
    got.append(folder.pop())
    got_rows = sorted((int(o[0] // 1000), float(o[0]), round(float(r), 9), round(float(d), 9),
                       float(x[0]))
                      for b in got for o, r, d, x in zip(b.obs, b.reward, b.discount, b.next_obs))
    expected = reference_fold(steps, n, gamma)
    assert len(got_rows) == len(expected)
    for g, e in zip(got_rows, expected):
        assert g[:2] == e[:2] and g[4] == e[4]
        assert g[2] == pytest.approx(e[2], abs=1e-5) and g[3] == pytest.approx(e[3], abs=1e-6)


def test_epsilon_formula():
    eps = epsilons(8, 0.4, 7.0)
    np.testing.assert_allclose(eps, [0.4 ** (1 + 7 * i / 7) for i in range(8)])
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert epsilons(1).tolist() == [0.4]
    with pytest.raises(ValueError, match="num_slots=0"):
        epsilons(0)


def test_slot_epsilons_cover_all_actors():
    config = ApexConfig(num_actors=3, envs_per_actor=4)
    spread = np.concatenate([slot_epsilons(config, i) for i in range(3)])
    np.testing.assert_allclose(spread, epsilons(12))
    per_actor = config.replace(per_slot_epsilon=False)
    np.testing.assert_allclose(slot_epsilons(per_actor, 2), np.full(4, epsilons(3)[2]))
    with pytest.raises(ValueError, match="actor_index=3"):
        slot_epsilons(config, 3)


def test_env_spec_accepts_box_discrete_and_refuses_the_rest():
    assert env_spec("CartPole-v1") == ((4,), 2)
    assert env_spec("Acrobot-v1") == ((6,), 3)
    with pytest.raises(ValueError, match=r"env_id='CartPoel-v1'.*did you mean CartPole-v1"):
        env_spec("CartPoel-v1")
    with pytest.raises(ValueError, match=r"env_id='Pendulum-v1' has action space Box.*Discrete"):
        env_spec("Pendulum-v1")
    with pytest.raises(ValueError, match=r"env_id='FrozenLake-v1' has observation space"):
        env_spec("FrozenLake-v1")


class _Observing(gym.Env):
    """A one-step environment whose observation space is whatever the test registers."""

    def __init__(self, space):
        self.observation_space, self.action_space = space, gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


@pytest.mark.parametrize("name, space", [
    ("Dict", gym.spaces.Dict({"position": gym.spaces.Box(-1, 1, (2,))})),
    ("Text", gym.spaces.Text(8)),
    ("Rank2", gym.spaces.Box(0, 1, (5, 5))),
    ("Rank4", gym.spaces.Box(0, 255, (2, 8, 8, 3), np.uint8)),
    ("FloatImage", gym.spaces.Box(0.0, 1.0, (8, 8, 3), np.float32)),  # would be cut to uint8
])
def test_observations_the_network_cannot_take_are_refused_naming_the_space(name, space):
    env_id = f"distrl-test/{name}Obs-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=_Observing, kwargs={"space": space})
    with pytest.raises(ValueError) as refused:
        env_spec(env_id)
    message = str(refused.value)
    assert f"env_id={env_id!r} has observation space {space}" in message
    assert "a Box of rank 1 (a vector" in message and "rank 3 (an image" in message
    # Blackjack's observation is a Tuple: a real environment refused the same way.
    with pytest.raises(ValueError, match=r"'Blackjack-v1' has observation space Tuple"):
        env_spec("Blackjack-v1")


def test_image_observations_get_a_convolutional_network():
    """MinAtar's 10x10 grids: the small torso (auto), its bool pixels unscaled; the dense layers
    as configured; CartPole's vectors: dense layers only."""
    assert env_spec("MinAtar/Breakout-v1") == ((10, 10, 4), 3)
    spec = network_for(ApexConfig(env_id="MinAtar/Breakout-v1", hidden_sizes=(128,)))
    assert spec.conv_layers == SMALL_TORSO and spec.obs_shape == (10, 10, 4)
    assert spec.input_scale == 1.0 and spec.hidden_sizes == (128,) and spec.num_actions == 3
    with pytest.raises(ValueError, match="conv_1's 4x4 kernel does not fit its 1x1 input.*on a 10x10 image"):
        network_for(ApexConfig(env_id="MinAtar/Breakout-v1", torso="nature"))
    assert network_for(ApexConfig()).conv_layers == ()
    with pytest.raises(ValueError, match="torso='big' is invalid: expected auto, small or nature"):
        ApexConfig(torso="big")


def test_single_envs_reset_in_the_same_step_and_keep_the_final_obs():
    envs = EnvBatch("CartPole-v1", 3, vectorised=False)
    envs.reset(seeds=[0, 1, 2])
    ended = 0
    for _ in range(200):
        next_obs, reward, terminated, truncated, final_obs, stepped = envs.step(
            np.ones(3, np.int64))
        done = terminated | truncated
        ended += done.sum()
        assert stepped.all()  # every action was applied
        # Always pushing right ends episodes fast: the final obs is past a limit, the next
        # obs is a fresh start near zero.
        assert np.all(np.abs(final_obs[done][:, 2]) > 0.2 - 1e-6) or not done.any()
        assert np.all(np.abs(next_obs[done]) < 0.05 + 1e-6)
        np.testing.assert_array_equal(final_obs[~done], next_obs[~done])
    assert ended > 10


def test_a_vectorised_env_resets_a_slot_in_its_next_step_and_says_so():
    envs = EnvBatch("CartPole-v1", 3)
    assert envs.vector is not None  # gymnasium's CartPoleVectorEnv
    envs.reset(seeds=[0])
    ended = 0
    was_done = np.zeros(3, bool)
    for _ in range(200):
        next_obs, reward, terminated, truncated, final_obs, stepped = envs.step(
            np.ones(3, np.int64))
        done = terminated | truncated
        # The step after an end only resets the slot: no action, no reward, a fresh start.
        np.testing.assert_array_equal(stepped, ~was_done)
        assert np.all(reward[was_done] == 0) and not done[was_done].any()
        assert np.all(np.abs(next_obs[was_done]) < 0.05 + 1e-6)
        assert np.all(np.abs(final_obs[done][:, 2]) > 0.2 - 1e-6) or not done.any()
        ended += done.sum()
        was_done = done
    assert ended > 10
    with pytest.raises(ValueError, match="vectorised=True: gymnasium has no vectorised Acrobot"):
        EnvBatch("Acrobot-v1", 2, vectorised=True)


def test_steps_marked_invalid_start_no_transition_and_join_none():
    """A vectorised env's reset step (after an end, the action ignored) leaves no trace."""
    folder = NStepFolder(1, n=3, gamma=0.5, obs_shape=(1,))
    push_episode(folder, [1, 2], "terminated")
    folder.push(np.array([[102.0]]), np.array([1]), np.array([0.0]), np.array([[0.0]]),
                np.array([False]), np.array([False]), valid=np.array([False]))
    push_episode(folder, [5, 6, 7], None)
    assert rows(folder.pop()) == [(0, 1 + 0.5 * 2, 0.0, 102), (1, 2, 0.0, 102),
                                  (0, 5 + 0.5 * 6 + 0.25 * 7, 0.125, 3)]


@pytest.mark.parametrize("vectorised", [True, False])
def test_actor_counts_the_env_steps_it_made(vectorised):
    config = ApexConfig(num_actors=1, envs_per_actor=4, seed=2)
    actor = Actor(config, 0, init_weights(NetworkSpec((4,), 2), 0))
    if not vectorised:
        actor.envs = EnvBatch("CartPole-v1", 4, vectorised=False)
        actor.obs = actor.envs.reset(seeds=[0, 1, 2, 3])
    assert actor.first_step_time is None  # none made yet: the timeline leaves it out
    before = time.time()
    inserted = len(actor.collect(1))
    first = actor.first_step_time
    assert before <= first <= time.time()  # the first env.step's wall-clock, for the timeline
    inserted += sum(len(actor.collect(25)) for _ in range(8))
    assert actor.first_step_time == first  # the first, not the latest
    returns, lengths = actor.pop_episode_stats()
    assert returns == lengths and lengths  # CartPole pays 1 a step: every step counted once
    # Every applied step becomes one transition (the last n - 1 per slot are still open).
    assert actor.env_steps - 4 * (config.n_step - 1) <= inserted <= actor.env_steps
    assert (actor.env_steps < (8 * 25 + 1) * 4) == vectorised  # reset steps are not env steps


def test_actor_priorities_equal_a_fresh_computation():
    config = ApexConfig(num_actors=2, envs_per_actor=8, seed=3)
    spec = NetworkSpec((4,), 2)
    actor = Actor(config, 1, init_weights(spec, 1))
    for _ in range(5):
        block = actor.collect(7)
        np.testing.assert_allclose(block.priority, initial_priorities(actor.spec, actor.weights, block),
                                   rtol=1e-5, atol=1e-6)
    assert 0 < actor.env_steps <= 5 * 7 * 8
    assert np.all(block.discount <= config.gamma ** 1 + 1e-6)


def test_greedy_evaluation_runs_every_episode_to_its_end():
    spec = NetworkSpec((4,), 2)
    returns, lengths = evaluate_greedy("CartPole-v1", init_weights(spec, 0), 4, seed=0, spec=spec)
    assert returns.shape == (4,) and np.all(returns == lengths) and np.all(lengths >= 8)
    q = spec.q_values(init_weights(spec, 0), np.zeros((1, 4)))
    assert q.shape == (1, 2)


def test_a_greedy_evaluation_ends_at_its_step_cap_in_a_game_without_an_end():
    """MinAtar's Breakout has no time limit: a paddle that never misses plays forever. A
    greedy evaluation stops at max_steps and counts each episode's return so far."""
    config = ApexConfig(env_id="MinAtar/Breakout-v1", hidden_sizes=(32,))
    spec = network_for(config)
    returns, lengths = evaluate_greedy(config.env_id, init_weights(spec, 0), 3, seed=0,
                                       spec=spec, max_steps=5)
    assert lengths.max() == 5 and returns.shape == (3,)


def test_atari_is_evaluated_epsilon_greedy_as_its_literature_does():
    """Epsilon 0.05 on Atari (Nature DQN), greedy elsewhere. An epsilon-greedy evaluation
    takes other actions than the greedy one, the same ones for the same seed; a bad epsilon is
    refused."""
    from distrl.rl.envs import EVAL_EPSILON_ATARI, eval_epsilon

    assert eval_epsilon("ALE/Pong-v5") == EVAL_EPSILON_ATARI == 0.05
    assert eval_epsilon("CartPole-v1") == eval_epsilon("MinAtar/Breakout-v1") == 0.0
    spec, weights = NetworkSpec((4,), 2), init_weights(NetworkSpec((4,), 2), 0)
    greedy = evaluate_greedy("CartPole-v1", weights, 6, seed=3, spec=spec)[1]
    noisy = [evaluate_greedy("CartPole-v1", weights, 6, seed=3, spec=spec, epsilon=0.5)[1]
             for _ in range(2)]
    np.testing.assert_array_equal(noisy[0], noisy[1])
    assert not np.array_equal(greedy, noisy[0])
    with pytest.raises(ValueError, match=r"epsilon=1.5: expected a probability in \[0, 1\)"):
        evaluate_greedy("CartPole-v1", weights, 1, seed=0, spec=spec, epsilon=1.5)


RACE = """
import threading
from distrl.rl.envs import env_spec
barrier, errors = threading.Barrier(2), []
def check(env_id):
    barrier.wait()
    try:
        env_spec(env_id)
    except Exception as e:
        errors.append(repr(e)[:200])
threads = [threading.Thread(target=check, args=(e,)) for e in ("CartPole-v1", "Acrobot-v1")]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors)
"""


def test_two_threads_check_their_envs_at_once_in_a_fresh_process():
    """Notebook 05's two driver threads each check their env (its first gym.make imports the
    env's module): at once, in a fresh process, 19 of 20 tries failed with a half-initialised
    classic_control module before env_spec made them one at a time."""
    import subprocess
    import sys

    for _ in range(10):  # each a fresh process: the first imports are the ones that race
        out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True,
                             timeout=120, check=True).stdout
        assert out.strip() == "[]", out


def test_atari_frames_are_preprocessed_stacked_and_packed_once_into_blocks():
    """ALE/Pong-v5 through make_env: 84x84 grey uint8 frames, 4 stacked, channels last. A Pong
    actor's blocks hold each plane once, and rebuild exactly the observations and priorities
    that the same steps folded as whole observations give."""
    from distrl.rl.envs import make_env
    from distrl.rl.frames import frames_per_transition, is_atari

    assert env_spec("ALE/Pong-v5") == ((84, 84, 4), 6) and is_atari("ALE/Pong-v5")
    env = make_env("ALE/Pong-v5")
    try:
        obs, _ = env.reset(seed=0)
        next_obs, *_ = env.step(0)
    finally:
        env.close()
    assert obs.dtype == np.uint8 and obs.shape == (84, 84, 4)
    np.testing.assert_array_equal(next_obs[..., :3], obs[..., 1:])  # moved on by one frame

    config = ApexConfig(env_id="ALE/Pong-v5", num_actors=1, envs_per_actor=3,
                        actor_block_steps=40, hidden_sizes=(32,))
    spec = network_for(config)
    actor = Actor(config, 0, init_weights(spec, seed=0))
    plain = NStepFolder(3, config.n_step, config.gamma, (84 * 84 * 4,))  # whole observations
    framed = actor.folder

    class Both:  # the actor's steps into both folders
        def push(self, obs, action, reward, next_obs, *rest, **kw):
            plain.push(obs.reshape(3, -1), action, reward, next_obs.reshape(3, -1), *rest, **kw)
            framed.push(obs, action, reward, next_obs, *rest, **kw)

        def pop(self, q_fn=None):
            return framed.pop(q_fn)

    actor.folder = Both()
    transitions = planes = 0
    try:
        for _ in range(3):
            actor.step(config.actor_block_steps)
            block, whole = actor.fold(), plain.pop()
            transitions, planes = transitions + len(block), planes + len(block.frames)
            np.testing.assert_array_equal(block.observations(block.obs).reshape(len(block), -1),
                                          whole.obs)
            np.testing.assert_array_equal(
                block.observations(block.next_obs).reshape(len(block), -1), whole.next_obs)
            np.testing.assert_allclose(block.priority,
                                       initial_priorities(spec, actor.weights, block), atol=1e-4)
    finally:
        actor.close()
    # What replay is sized for holds what the blocks packed.
    assert planes / transitions <= frames_per_transition(config, (84, 84, 4)) * 1.02
    assert planes / transitions < 1.2


@pytest.mark.parametrize("training", [True, False])
def test_atari_is_stepped_by_ale_s_vector_env_exactly_as_make_env_steps_it(monkeypatch, training):
    """EnvBatch steps Atari through ale_py's AtariVectorEnv: channels last, the same frames,
    rewards (clipped in training only: Space Invaders scores 5-30 a hit) and episode ends as
    make_env's wrappers give, step for step. No-ops off, both are deterministic."""
    from distrl.rl import envs

    monkeypatch.setattr(envs, "NOOP_MAX", 0)
    env_id, k = "ALE/SpaceInvaders-v5", 2
    vector, single = EnvBatch(env_id, k, training=training), EnvBatch(env_id, k, vectorised=False,
                                                                      training=training)
    try:
        assert vector.vector is not None and single.vector is None
        seeds = [2**31 + 5, 7]  # above a C int: reduced, not refused
        np.testing.assert_array_equal(vector.reset(seeds), single.reset(seeds))
        assert vector.obs.shape == (k, 84, 84, 4) and vector.obs.flags.c_contiguous
        actions = np.random.default_rng(0).integers(0, 6, size=(3000, k))
        rewards = []
        for row in actions:  # up to the first episode's end (the two reset it differently)
            got, want = vector.step(row), single.step(row)
            for a, b in zip(got[2:5], want[2:5]):  # terminated, truncated, final obs
                np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(got[1], want[1])
            rewards.append(got[1])
            if got[2].any():
                break
            np.testing.assert_array_equal(got[0], want[0])
        else:
            raise AssertionError("no episode ended in 3,000 steps")
    finally:
        vector.close()
        single.close()
    rewards = np.concatenate(rewards)
    assert rewards.max() == 1.0 if training else rewards.max() >= 5.0
