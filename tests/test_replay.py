"""Prioritized replay, sum tree and rate limiter, against brute-force references."""

import threading
import time

import numpy as np
import pytest
from scipy import stats

from distrl.apex.replay_memory import APEX_CAPACITY, available_memory, sized_capacity
from distrl.rl.frames import images, pack_frames
from distrl.rl.replay import (
    PrioritizedReplay,
    RateLimiter,
    ReplayService,
    SumTree,
)
from distrl.rl.transitions import Transitions


def make_block(n, start=0, obs_size=3, priority=None, rng=None):
    rng = rng or np.random.default_rng(start)
    ids = np.arange(start, start + n, dtype=np.float32)
    return Transitions(
        obs=np.repeat(ids[:, None], obs_size, axis=1), action=np.arange(n) % 2,
        reward=ids.copy(), discount=np.full(n, 0.9, np.float32),
        next_obs=np.repeat(ids[:, None] + 0.5, obs_size, axis=1),
        priority=(rng.random(n).astype(np.float32) if priority is None
                  else np.asarray(priority, np.float32)))


def assert_tree_consistent(tree: SumTree):
    t = tree.tree
    internal = np.arange(1, tree.leaf_offset)
    np.testing.assert_array_equal(t[internal], t[2 * internal] + t[2 * internal + 1])
    assert tree.total == pytest.approx(tree.leaves().sum(), rel=1e-12)


def test_sampling_frequencies_match_priorities():
    rng = np.random.default_rng(1)
    td = rng.exponential(1.0, 50).astype(np.float32).astype(np.float64)  # blocks hold float32
    replay = PrioritizedReplay(64, (3,), alpha=0.6, eps=1e-3, seed=7)
    replay.add(make_block(50, priority=td))
    # Brute force: P(i) = (|d_i| + eps)^alpha / sum_j (|d_j| + eps)^alpha.
    p = (td + 1e-3) ** 0.6
    p /= p.sum()
    counts = np.zeros(50)
    for _ in range(400):
        batch = replay.sample(256)
        np.add.at(counts, batch.keys, 1)
        np.testing.assert_allclose(batch.probabilities, p[batch.keys], rtol=1e-9)
    chi2 = stats.chisquare(counts, counts.sum() * p)
    assert chi2.pvalue > 1e-3, chi2
    # And it is not uniform: the statistic against uniform sampling is huge.
    assert stats.chisquare(counts).pvalue < 1e-6


def test_several_batches_from_one_draw_are_each_proportional_and_stratified():
    """sample_many (what the learner fetches, as one stack): every batch samples in proportion
    to priority, each batch covers the whole priority mass (one transition from each of its
    strata), and each batch's weights are normalised on their own."""
    rng = np.random.default_rng(2)
    td = rng.exponential(1.0, 50).astype(np.float32).astype(np.float64)
    replay = PrioritizedReplay(64, (3,), alpha=0.6, eps=1e-3, seed=7)
    replay.add(make_block(50, priority=td))
    p = (td + 1e-3) ** 0.6
    p /= p.sum()
    edges = np.concatenate([[0.0], np.cumsum(p)])  # the priority mass up to each key
    counts = np.zeros((4, 50))
    for _ in range(300):
        stack = replay.sample_many(64, 4, beta=0.5)
        assert stack.keys.shape == stack.transitions.obs.shape[:2] == (4, 64)
        batches = [stack.take(j) for j in range(4)]
        assert [len(b.transitions) for b in batches] == [64] * 4
        for j, batch in enumerate(batches):
            np.add.at(counts[j], batch.keys, 1)
            np.testing.assert_allclose(batch.probabilities, p[batch.keys], rtol=1e-9)
            assert batch.weights.max() == pytest.approx(1.0)
            w = (50 * p[batch.keys]) ** -0.5
            np.testing.assert_allclose(batch.weights, w / w.max(), rtol=1e-5)
            np.testing.assert_array_equal(batch.transitions.reward, batch.keys.astype(np.float32))
            # Stratified: the i-th row lies in the i-th of 64 equal slices of the mass (a key
            # spans the slices its mass overlaps).
            lo = np.floor(edges[batch.keys] * 64 - 1e-9)
            hi = np.ceil(edges[batch.keys + 1] * 64 + 1e-9)
            rows = np.arange(64)
            assert np.all((lo <= rows) & (rows < hi)), j
    for j in range(4):
        assert stats.chisquare(counts[j], counts[j].sum() * p).pvalue > 1e-3, j
    with pytest.raises(ValueError, match="num_batches=0 is invalid"):
        replay.sample_many(8, 0)


def test_importance_weights_follow_the_formula():
    td = np.linspace(0.1, 5.0, 40).astype(np.float32).astype(np.float64)
    replay = PrioritizedReplay(40, (3,), alpha=0.7, eps=1e-3, seed=3)
    replay.add(make_block(40, priority=td))
    batch = replay.sample(64, beta=0.5)
    p = (td + 1e-3) ** 0.7
    p /= p.sum()
    w = (40 * p[batch.keys]) ** -0.5
    np.testing.assert_allclose(batch.weights, w / w.max(), rtol=1e-5)
    assert batch.weights.max() == pytest.approx(1.0)
    # Rows of the batch are the stored transitions for those keys.
    np.testing.assert_array_equal(batch.transitions.reward, batch.keys.astype(np.float32))
    np.testing.assert_array_equal(batch.transitions.next_obs[:, 0], batch.keys + 0.5)


def test_ring_overwrite_keeps_sum_tree_exact():
    rng = np.random.default_rng(0)
    replay = PrioritizedReplay(100, (3,), alpha=0.6, eps=1e-3)
    start = 0
    for size in [37, 64, 99, 5, 100, 250, 13]:  # wraps many times, one block > capacity
        block = make_block(size, start, rng=rng)
        replay.add(block)
        start += size
        assert_tree_consistent(replay.tree)
    assert replay.total_inserted == start
    assert len(replay) == 100
    # Every slot holds the newest transition written to it, with its own priority.
    keys = replay.key
    np.testing.assert_array_equal(np.sort(keys), np.arange(start - 100, start))
    np.testing.assert_array_equal(replay.reward, keys.astype(np.float32))
    expected = np.empty(100)
    rng2 = np.random.default_rng(0)
    offset = 0
    for size in [37, 64, 99, 5, 100, 250, 13]:
        prio = make_block(size, offset, rng=rng2).priority.astype(np.float64)
        for k, pr in zip(range(offset, offset + size), prio):
            expected[k % 100] = (pr + 1e-3) ** 0.6
        offset += size
    np.testing.assert_allclose(replay.tree.leaves(), expected, rtol=1e-6)
    # Random priority updates keep it exact too.
    batch = replay.sample(64)
    replay.update_priorities(batch.keys, rng.random(64) * 10)
    assert_tree_consistent(replay.tree)


def test_updates_for_overwritten_slots_are_ignored():
    replay = PrioritizedReplay(16, (3,), alpha=1.0, eps=1e-3, seed=0)
    replay.add(make_block(16, priority=np.ones(16)))
    batch = replay.sample(8)
    replay.add(make_block(16, 16, priority=np.full(16, 2.0)))  # overwrites every slot
    leaves_before = replay.tree.leaves().copy()
    live = replay.update_priorities(batch.keys, np.full(8, 100.0))
    assert live == 0
    np.testing.assert_array_equal(replay.tree.leaves(), leaves_before)
    # A live key is updated.
    fresh = replay.sample(4)
    assert replay.update_priorities(fresh.keys, np.full(4, 9.0)) == 4
    np.testing.assert_allclose(replay.tree.leaves(fresh.keys % 16), 9.0 + 1e-3)


def test_sampling_never_returns_an_empty_slot():
    replay = PrioritizedReplay(1000, (3,), seed=0)
    replay.add(make_block(3, priority=[0.0, 5.0, 0.0]))
    batch = replay.sample(512)
    assert set(batch.keys.tolist()) <= {0, 1, 2}
    assert np.all(replay.key[batch.keys] >= 0)


@pytest.mark.parametrize("kwargs, message", [
    ({"capacity": 0}, "capacity=0"),
    ({"alpha": 1.5}, "alpha=1.5"),
    ({"eps": 0.0}, "eps=0.0"),
])
def test_replay_rejects_bad_settings(kwargs, message):
    args = {"capacity": 10, "obs_shape": (3,)} | kwargs
    with pytest.raises(ValueError, match=message):
        PrioritizedReplay(**args)


def test_replay_rejects_bad_input_and_keeps_its_data():
    replay = PrioritizedReplay(10, (3,))
    with pytest.raises(ValueError, match="empty replay"):
        replay.sample(4)
    replay.add(make_block(4))
    before = replay.tree.tree.copy()
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        replay.add(make_block(2, obs_size=5))
    with pytest.raises(ValueError, match="finite"):
        replay.add(make_block(2, priority=[1.0, np.nan]))
    with pytest.raises(ValueError, match="one priority per key"):
        replay.update_priorities(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ValueError, match="beta=2"):
        replay.sample(4, beta=2)
    with pytest.raises(ValueError, match="batch_size=0"):
        replay.sample(0)
    np.testing.assert_array_equal(replay.tree.tree, before)
    assert len(replay) == 4
    with pytest.raises(ValueError, match="Transitions.reward"):
        Transitions(obs=np.zeros((2, 3)), action=np.zeros(2), reward=np.zeros(3),
                    discount=np.zeros(2), next_obs=np.zeros((2, 3)), priority=np.zeros(2))


def test_rate_limiter_enforces_the_ratio():
    limiter = RateLimiter(samples_per_insert=2.0, min_size=10, error_buffer=8.0)
    assert not limiter.can_sample(4)            # below min_size
    assert limiter.await_insert(10, timeout=0)  # warm-up inserts always pass
    assert limiter.can_sample(4)
    # Budget (inserts - min) * spi - samples = 0; a sample of 4 takes it to -4 >= -8.
    assert limiter.await_sample(4, timeout=0)
    assert limiter.await_sample(4, timeout=0)   # -8: at the edge
    assert not limiter.await_sample(4, timeout=0.05)  # -12 would be too far behind
    assert limiter.samples == 8 and limiter.sample_wait_s < 0.01  # refusals are not counted
    # Inserting catches up: budget -8 + 2 * 6 = 4; inserts allowed while budget + 2 <= 8.
    assert limiter.await_insert(6, timeout=0)
    assert limiter.await_insert(1, timeout=0)   # 6
    assert limiter.await_insert(1, timeout=0)   # 8
    assert not limiter.await_insert(1, timeout=0.05)  # 8 + 2 > 8: the inserter must wait


def test_rate_limiter_blocks_and_releases_across_threads():
    limiter = RateLimiter(samples_per_insert=1.0, min_size=4, error_buffer=4.0)
    limiter.await_insert(4)
    assert limiter.await_sample(4, timeout=0)
    got = []

    def sampler():
        got.append(limiter.await_sample(4, timeout=5))

    thread = threading.Thread(target=sampler)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive() and not got  # blocked: budget -4 - 4 < -4
    limiter.await_insert(4)               # budget back to 0: the sampler may go
    thread.join(timeout=5)
    assert got == [True]
    assert limiter.sample_wait_s >= 0.15

    # Inserts block when the learner falls behind, and close() releases every waiter.
    limiter.await_insert(4)  # budget 0
    limiter.await_insert(4)  # budget 4: one more insert would exceed error_buffer
    results = []
    inserter = threading.Thread(target=lambda: results.append(limiter.await_insert(1)))
    inserter.start()
    time.sleep(0.2)
    assert inserter.is_alive()
    limiter.close()
    inserter.join(timeout=5)
    assert results == [False]
    assert not limiter.await_sample(1, timeout=0)


def test_rate_limiter_rejects_bad_settings():
    with pytest.raises(ValueError, match="samples_per_insert=-1"):
        RateLimiter(-1, 10, 1.0)
    with pytest.raises(ValueError, match="min_size=0"):
        RateLimiter(1, 0, 1.0)


def test_replay_service_refuses_whole_blocks_and_loses_nothing():
    service = ReplayService(100, (3,), alpha=0.6, eps=1e-3, samples_per_insert=1.0,
                            min_size=8, error_buffer=8.0)
    assert service.sample(8, 0.4, timeout=0) is None  # warm-up
    assert service.add(make_block(8), timeout=0)
    assert service.add(make_block(8, 8), timeout=0)   # budget 8: at the limit
    assert not service.add(make_block(8, 16), timeout=0.01)  # refused whole
    assert service.stats()["inserted"] == 16
    batch = service.sample(8, 0.4, timeout=0).take(0)  # a stack of one batch
    assert len(batch.keys) == 8
    assert service.sample(8, 0.4, timeout=0, num_batches=2) is None  # budget 0 - 16 < -8
    assert service.add(make_block(8, 16), timeout=0)  # the retried block lands
    assert service.stats()["inserted"] == 24
    assert service.update_priorities(batch.keys, np.ones(8)) == 8


def test_check_finds_a_healthy_replay_healthy_and_a_corrupted_one_not():
    replay = PrioritizedReplay(64, (3,))
    for i in range(5):  # wraps around: 100 inserted into 64 slots
        replay.add(make_block(20, start=20 * i))
    replay.update_priorities(np.arange(60, 80), np.full(20, 2.0))
    report = replay.check()
    assert report == {"ok": True, "problems": [], "size": 64, "inserted": 100}
    replay.key[5] = 7  # a slot claims a key it cannot hold
    assert "keys of live slots" in replay.check()["problems"][0]
    replay.key[5] = 69
    replay.tree.tree[1] += 1.0  # the root no longer sums its leaves
    assert not replay.check()["ok"] and "sum tree root" in replay.check()["problems"][0]


def stacked_stream(rng, steps, restart_at=(), size=(6, 5), stack=4):
    """Observations of one episode stream stacking `stack` frames, as FrameStackObservation
    makes them (an episode starts with its first frame repeated), channels last."""
    frames = rng.integers(0, 256, (steps + stack, *size), dtype=np.uint8)
    obs, window = [], None
    for t in range(steps):
        window = [t] * stack if t == 0 or t in restart_at else window[1:] + [t]
        obs.append(np.stack([frames[i] for i in window], axis=-1))
    return np.array(obs)


def test_pack_frames_stores_each_plane_once_and_rebuilds_every_observation_exactly():
    rng = np.random.default_rng(0)
    stream = stacked_stream(rng, 12, restart_at=(7,))
    frames, refs = pack_frames(stream)
    # Two episode starts take a whole stack each; every other step adds one frame.
    assert len(frames) == 4 + 6 + 4 + 4
    np.testing.assert_array_equal(np.moveaxis(frames[refs], 1, -1), stream)
    # Observations that are no frame stack (MinAtar's object planes) share nothing, exactly.
    planes = rng.integers(0, 2, (9, 10, 10, 4), dtype=np.uint8)
    frames, refs = pack_frames(planes)
    assert len(frames) == 9 * 4
    np.testing.assert_array_equal(np.moveaxis(frames[refs], 1, -1), planes)


def framed_block(rng, key_start, steps, size=(6, 5)):
    """A block as an actor sends it: transition t goes from observation t to t + 1."""
    stream = stacked_stream(rng, steps + 1, size=size)
    frames, refs = pack_frames(stream)
    n = steps
    block = Transitions(obs=refs[:-1], action=np.arange(n) % 2,
                        reward=np.arange(key_start, key_start + n, dtype=np.float32),
                        discount=np.full(n, 0.9, np.float32), next_obs=refs[1:],
                        priority=rng.random(n).astype(np.float32) + 0.1, frames=frames)
    return block, stream


def test_framed_replay_evicts_whole_blocks_with_their_frames_and_samples_exact_images():
    """The frame ring (too small for the capacity here) overwrites old blocks' planes: their
    transitions leave, the live keys stay one contiguous run, and every sampled transition's
    images are exactly the ones inserted under its key."""
    rng = np.random.default_rng(1)
    replay = PrioritizedReplay(200, (6, 5, 4), obs_dtype=np.uint8, frame_capacity=150, seed=3)
    inserted = {}
    for _ in range(12):
        steps = int(rng.integers(10, 40))
        block, stream = framed_block(rng, replay.total_inserted, steps)
        keys = replay.add(block)
        inserted.update({int(k): (stream[i], stream[i + 1]) for i, k in enumerate(keys)})
        health = replay.check()
        assert health["ok"], health
        # Every live transition's planes are still in the ring, and no more than fit.
        assert len(replay) <= min(replay.total_inserted, 150 - 4)
    assert len(replay) < 200  # the frame ring, not the capacity, decided what stays
    batch = replay.sample(64)
    for key, obs, next_obs in zip(batch.keys, batch.transitions.obs, batch.transitions.next_obs):
        np.testing.assert_array_equal(np.moveaxis(obs, 0, -1), inserted[int(key)][0])
        np.testing.assert_array_equal(np.moveaxis(next_obs, 0, -1), inserted[int(key)][1])
    assert batch.transitions.obs.dtype == np.uint8
    # Channels first, gathered plane by plane: element for element what the channels-last
    # gather (frames.images, which replay used before) rebuilds from the same plane numbers.
    slots = batch.keys % replay.capacity
    for sampled, numbers in ((batch.transitions.obs, replay.obs[slots]),
                             (batch.transitions.next_obs, replay.next_obs[slots])):
        assert sampled.shape == (64, 4, 6, 5)
        old = np.ascontiguousarray(images(replay.frames.planes, numbers % replay.frames.capacity))
        np.testing.assert_array_equal(np.moveaxis(sampled, 1, -1), old)
    assert replay.update_priorities(batch.keys, np.ones(64)) == 64


def test_framed_replay_numbers_planes_past_2_to_the_31_and_samples_exact_images():
    """Plane numbers grow for the whole run (about 9 h of 56 Pong actors pass 2^31 on one shard):
    a block's plane indices arrive as int32 from pack_frames, and adding the ring's count to
    them kept int32, so past 2^31 sampled images came from the wrong planes, then add raised.
    A replay whose count starts just below 2^31 keeps every image exact across it."""
    rng = np.random.default_rng(7)
    replay = PrioritizedReplay(200, (6, 5, 4), obs_dtype=np.uint8, frame_capacity=150, seed=3)
    replay.frames.inserted = 2**31 - 40  # as if the run had stored that many planes already
    inserted = {}
    for _ in range(6):
        block, stream = framed_block(rng, replay.total_inserted, 20)
        keys = replay.add(block)
        inserted.update({int(k): (stream[i], stream[i + 1]) for i, k in enumerate(keys)})
        assert replay.check()["ok"], replay.check()
    assert replay.frames.inserted > 2**31 + 50
    batch = replay.sample(64)
    for key, obs, next_obs in zip(batch.keys, batch.transitions.obs, batch.transitions.next_obs):
        np.testing.assert_array_equal(np.moveaxis(obs, 0, -1), inserted[int(key)][0])
        np.testing.assert_array_equal(np.moveaxis(next_obs, 0, -1), inserted[int(key)][1])


def test_framed_replay_refuses_blocks_it_cannot_hold_and_keeps_its_data():
    rng = np.random.default_rng(2)
    replay = PrioritizedReplay(50, (6, 5, 4), obs_dtype=np.uint8, frame_capacity=40)
    block, _ = framed_block(rng, 0, 20)
    replay.add(block)
    before = (replay.tree.tree.copy(), replay.frames.planes.copy(), len(replay))
    with pytest.raises(ValueError, match="frame_capacity=40"):
        replay.add(framed_block(rng, 20, 60)[0])
    with pytest.raises(ValueError, match="expected a block from frames.pack_block"):
        replay.add(make_block(3, obs_size=4))
    with pytest.raises(ValueError, match="frames"):
        replay.add(framed_block(rng, 20, 5, size=(5, 5))[0])  # another image size
    with pytest.raises(ValueError, match="below len\\(frames\\)"):
        Transitions(obs=block.obs + 100, action=block.action, reward=block.reward,
                    discount=block.discount, next_obs=block.next_obs, priority=block.priority,
                    frames=block.frames)
    np.testing.assert_array_equal(replay.tree.tree, before[0])
    np.testing.assert_array_equal(replay.frames.planes, before[1])
    assert len(replay) == before[2] and replay.check()["ok"]
    with pytest.raises(ValueError, match="frame_capacity=2 is invalid"):
        PrioritizedReplay(50, (6, 5, 4), frame_capacity=2)


def test_replay_capacity_is_sized_to_the_memory_and_a_capacity_that_cannot_fit_is_refused():
    gib = 2**30
    shape, per_plane = (84, 84, 4), 84 * 84
    capacity, frame_capacity = sized_capacity(None, shape, obs_dtype=np.uint8,
                                              frames_per_transition=1.06, available=4 * gib)
    # Half of 4 GiB at about 7.4 KiB a transition.
    assert 250_000 < capacity < 300_000 and frame_capacity == int(np.ceil(capacity * 1.06))
    replay = PrioritizedReplay(capacity, shape, obs_dtype=np.uint8, frame_capacity=frame_capacity)
    assert replay.nbytes <= 2 * gib and replay.nbytes / capacity < 7.5 * 1024
    assert replay.nbytes / capacity > 1.06 * per_plane
    with pytest.raises(ValueError, match=rf"replay_capacity=1,000,000 does not fit.*at most "
                                         rf"{capacity:,} transitions fit"):
        sized_capacity(1_000_000, shape, obs_dtype=np.uint8, frames_per_transition=1.06,
                       available=4 * gib)
    assert sized_capacity(capacity, shape, obs_dtype=np.uint8, frames_per_transition=1.06,
                          available=4 * gib)[0] == capacity
    # A big machine is capped at Ape-X's 2 million; vectors keep no frames.
    assert sized_capacity(None, (4,), available=1024 * gib) == (APEX_CAPACITY, None)
    with pytest.raises(ValueError, match="no transition"):
        sized_capacity(None, shape, obs_dtype=np.uint8, frames_per_transition=1.0,
                       available=1000)


@pytest.mark.parametrize("capacity, shape, dtype, frames", [
    (1, (3,), np.float32, None), (1000, (4,), np.float32, None),
    (1025, (84, 84, 4), np.uint8, 1100), (7, (10, 10, 4), np.uint8, None)])
def test_the_bytes_a_replay_will_take_are_the_bytes_it_takes(capacity, shape, dtype, frames):
    replay = PrioritizedReplay(capacity, shape, obs_dtype=dtype, frame_capacity=frames)
    assert replay.nbytes == PrioritizedReplay.bytes_for(capacity, shape, dtype, frames)


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_available_memory_is_what_the_container_limit_leaves(tmp_path, version, monkeypatch):
    """In a pod psutil sees the whole node; the cgroup's limit (less what the container uses,
    less page cache it can drop) is what a replay may really take."""
    import collections

    import psutil

    gib = 2**30
    node = collections.namedtuple("node", "available")(64 * gib)  # a fixed node: exact figures
    monkeypatch.setattr(psutil, "virtual_memory", lambda: node)
    folder = tmp_path if version == "v2" else tmp_path / "memory"
    folder.mkdir(exist_ok=True)
    names = (("memory.max", "memory.current", "inactive_file") if version == "v2" else
             ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
    (folder / names[0]).write_text(f"{2 * gib}\n")
    (folder / names[1]).write_text(f"{gib}\n")
    (folder / "memory.stat").write_text(f"anon 123\n{names[2]} {gib // 4}\nfile 9\n")
    assert available_memory(str(tmp_path)) == 2 * gib - (gib - gib // 4)
    (folder / names[0]).write_text("max\n" if version == "v2" else f"{2**63 - 4096}\n")
    assert available_memory(str(tmp_path)) == 64 * gib
    assert available_memory(str(tmp_path / "no cgroup here")) == 64 * gib


def test_a_limiter_started_now_lets_sampling_begin_before_min_size():
    """RateLimiter.start_now (learn_after_recovery): the inserts so far become min_size, so a
    sample fits at once; it never raises min_size, nor sets it below one."""
    empty = RateLimiter(samples_per_insert=1.0, min_size=1_000, error_buffer=1_000.0)
    assert empty.start_now() == 1 and not empty.can_sample(1)  # one insert is still needed
    limiter = RateLimiter(samples_per_insert=1.0, min_size=1_000, error_buffer=1_000.0)
    limiter.await_insert(300, timeout=0)
    assert not limiter.can_sample(1)
    assert limiter.start_now() == 300 and limiter.can_sample(1)
    limiter.await_insert(5_000, timeout=0)
    assert limiter.start_now() == 300  # already started: unchanged


def live_rows(replay: PrioritizedReplay) -> dict[int, tuple]:
    """Each live transition by key: its observations (images rebuilt), action, reward and
    priority leaf, to compare two replays row for row."""
    keys = np.arange(replay.total_inserted - len(replay), replay.total_inserted)
    keys = keys[replay.key[keys % replay.capacity] == keys]
    slots = keys % replay.capacity
    obs, next_obs = replay._observations(slots), replay._observations(slots, after=True)
    return {int(k): (obs[i].tobytes(), next_obs[i].tobytes(), int(replay.action[s]),
                     float(replay.reward[s]), float(replay.tree.leaves(s)))
            for i, (k, s) in enumerate(zip(keys, slots))}


def test_a_replays_contents_load_into_a_new_replay_row_for_row_with_their_priorities():
    """What a checkpoint keeps of the replay: every live transition, images as their planes,
    with the priority it had (new priorities from the learner included), in insertion order;
    a new replay that loads it holds the same rows with the same leaves."""
    rng = np.random.default_rng(4)
    vectors = PrioritizedReplay(500, (3,), alpha=0.6)
    for start in range(0, 700, 100):  # wraps: 200 overwritten
        vectors.add(make_block(100, start, rng=rng))
    batch = vectors.sample(64)
    vectors.update_priorities(batch.keys, rng.random(64) * 5)
    framed = PrioritizedReplay(200, (6, 5, 4), obs_dtype=np.uint8, frame_capacity=150)
    for _ in range(8):
        framed.add(framed_block(rng, framed.total_inserted, int(rng.integers(10, 40)))[0])
    for replay, capacity in ((vectors, 500), (framed, 200)):
        block = replay.contents()
        assert len(block) == len(replay)
        loaded = PrioritizedReplay(capacity, replay.obs_shape, alpha=0.6,
                                   obs_dtype=replay.obs.dtype if not replay.framed else np.uint8,
                                   frame_capacity=150 if replay.framed else None)
        assert loaded.load(block) == len(replay) == len(loaded)
        assert loaded.check()["ok"]
        before, after = live_rows(replay), live_rows(loaded)
        for (_, old), (_, new) in zip(sorted(before.items()), sorted(after.items())):
            assert old[:4] == new[:4]
            assert new[4] == pytest.approx(old[4], rel=1e-5)
        assert len(after) == len(before)


def test_a_checkpoints_replay_sample_fits_its_bytes_and_spans_the_replays_whole_age():
    """contents(max_bytes): an even random sample, not the newest rows (a resumed learner
    needs the early failures too), whose arrays fit the bytes asked for; a replay smaller
    than the sample loads the newest rows it can hold, images in parts its ring can take."""
    replay = PrioritizedReplay(10_000, (4,))
    for start in range(0, 10_000, 1_000):
        replay.add(make_block(1_000, start, obs_size=4))
    budget = 1_000 * replay.row_bytes()
    block = replay.contents(budget)
    assert len(block) == 1_000
    assert sum(getattr(block, f).nbytes for f in Transitions.ROWS) <= budget
    ids = block.reward  # make_block's rewards number the rows
    assert ids.min() < 500 and ids.max() > 9_500 and np.all(np.diff(ids) > 0)
    assert replay.contents(budget).reward.tolist() == ids.tolist()  # the same sample again
    small = PrioritizedReplay(300, (4,))
    assert small.load(block) == 300  # of the block's 1,000: the newest that fit
    assert small.reward[small.key % 300 >= 0].min() == pytest.approx(np.sort(ids)[-300])
    rng = np.random.default_rng(2)
    framed = PrioritizedReplay(400, (6, 5, 4), obs_dtype=np.uint8)
    for _ in range(12):
        framed.add(framed_block(rng, framed.total_inserted, 30)[0])
    block = framed.contents(framed.row_bytes() * 150)
    assert len(block) == 150 and len(block.frames) <= 150 * 8
    ring = PrioritizedReplay(100, (6, 5, 4), obs_dtype=np.uint8, frame_capacity=60)
    assert 0 < ring.load(block) == len(ring) <= 100 and ring.check()["ok"]


def test_a_loaded_checkpoint_sample_meets_min_size_without_a_sampling_budget():
    """Transitions loaded from a checkpoint let sampling start (min_size) but give the learner
    no budget ahead of new play: it samples at samples_per_insert from the first batch."""
    service = ReplayService(1_000, (3,), alpha=0.6, eps=1e-3, samples_per_insert=2.0,
                            min_size=100, error_buffer=40.0)
    assert service.load(make_block(500)) == 500
    assert (service.stats()["inserted"], service.stats()["loaded"]) == (0, 500)  # not actors'
    assert service.sample(32, 0.4, timeout=0) is not None
    assert service.sample(32, 0.4, timeout=0) is None  # 64 sampled, 0 inserted: over the buffer
    assert service.add(make_block(40, 500), timeout=0)
    assert service.sample(32, 0.4, timeout=0) is not None
