"""Prioritized experience replay: numpy ring buffers, a vectorised sum tree, a rate limiter.

    replay = PrioritizedReplay(capacity=100_000, obs_shape=(4,), alpha=0.6)
    replay.add(block)                       # a Transitions block, priorities = |delta| from actors
    batch = replay.sample(512, beta=0.4)    # proportional to (|delta| + eps) ** alpha
    replay.update_priorities(batch.keys, new_abs_td)   # stale keys (overwritten slots) are ignored

Everything is struct-of-arrays: one numpy array per field, blocks in and batches out, so that
nothing is a Python loop over transitions and nothing crosses a process as a list of tuples.

Image observations are stored as frames (distrl.rl.frames): each plane once, a transition
holding the numbers of its observations' planes.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import numpy as np

from distrl.rl import frames as framing
from distrl.rl.transitions import SampledBatch, Transitions


class SumTree:
    """A binary tree over `capacity` leaves whose every node holds the sum of its children.

    Nodes are recomputed from their children (never patched by adding deltas), so after any
    sequence of writes every internal node is exactly the float sum of its two children.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"SumTree capacity={capacity!r} is invalid: expected an integer >= 1")
        self.capacity = capacity
        self.depth = max(1, int(np.ceil(np.log2(capacity))))
        self.leaf_offset = 1 << self.depth
        self.tree = np.zeros(2 * self.leaf_offset, dtype=np.float64)  # node 1 is the root

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def leaves(self, index: np.ndarray | slice = slice(None)) -> np.ndarray:
        return self.tree[self.leaf_offset: self.leaf_offset + self.capacity][index]

    def set(self, index: np.ndarray, values: np.ndarray) -> None:
        """Write leaves at arbitrary indices, then recompute their ancestors level by level."""
        node = np.asarray(index, dtype=np.int64) + self.leaf_offset
        self.tree[node] = values
        pairs = self.tree.reshape(-1, 2)  # row p holds the children of node p
        for _ in range(self.depth):
            node >>= 1
            # Duplicate parents write the same value twice, which is harmless.
            children = pairs.take(node, axis=0)
            self.tree[node] = children[:, 0] + children[:, 1]

    def set_range(self, start: int, values: np.ndarray) -> None:
        """Write a contiguous run of leaves; ancestors are contiguous too, so slices suffice."""
        lo = start + self.leaf_offset
        hi = lo + len(values) - 1
        self.tree[lo: hi + 1] = values
        for _ in range(self.depth):
            lo >>= 1
            hi >>= 1
            self.tree[lo: hi + 1] = (self.tree[2 * lo: 2 * hi + 2: 2]
                                     + self.tree[2 * lo + 1: 2 * hi + 2: 2])

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaf index holding each cumulative `mass` in [0, total). Never returns a zero leaf."""
        node = np.ones(len(mass), dtype=np.int64)
        mass = np.array(mass, dtype=np.float64)
        pairs = self.tree.reshape(-1, 2)  # one gather fetches both children
        for _ in range(self.depth):
            children = pairs.take(node, axis=0)
            left_sum = children[:, 0]
            # Only step right into a subtree with mass: float rounding can push `mass` a hair
            # past the left sum of a node whose right subtree is empty.
            go_right = (mass >= left_sum) & (children[:, 1] > 0)
            mass -= left_sum * go_right
            node = 2 * node + go_right
        return node - self.leaf_offset


class PrioritizedReplay:
    """Proportional prioritized replay (Schaul et al. 2016) as used by Ape-X.

    Priorities arrive as |TD error|; (|delta| + eps) ** alpha is applied here, exactly once.
    Every inserted transition gets a key (its global insertion number); the slot is
    key % capacity, so an update for a key whose slot has since been overwritten is ignored.

    Image observations (obs_shape of rank 3) are kept as frames in a frames.FrameRing of
    frame_capacity planes (default: channels per transition, enough when no two observations
    share a plane). Blocks arrive packed (frames.pack_block); when the ring overwrites a
    block's planes, that block's transitions leave with them: both rings evict oldest first,
    and the live keys stay one contiguous run.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], *, obs_dtype=np.float32,
                 alpha: float = 0.6, eps: float = 1e-3, seed: int = 0,
                 frame_capacity: int | None = None):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity={capacity!r} is invalid: expected an integer >= 1")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha!r} is invalid: expected a number in [0, 1]")
        if not eps > 0:
            raise ValueError(f"eps={eps!r} is invalid: expected a number > 0")
        self.capacity = capacity
        self.obs_shape = tuple(obs_shape)
        self.alpha = alpha
        self.eps = eps
        self.rng = np.random.default_rng(seed)
        self.framed = len(self.obs_shape) == 3
        if self.framed:
            height, width, channels = self.obs_shape
            self.frames = framing.FrameRing(capacity * channels if frame_capacity is None
                                            else frame_capacity, (height, width), obs_dtype,
                                            channels)
            self.obs = np.zeros((capacity, channels), dtype=np.int64)  # plane numbers
            self.next_obs = np.zeros((capacity, channels), dtype=np.int64)
        else:
            self.obs = np.zeros((capacity, *self.obs_shape), dtype=obs_dtype)
            self.next_obs = np.zeros((capacity, *self.obs_shape), dtype=obs_dtype)
        self.action = np.zeros(capacity, dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.discount = np.zeros(capacity, dtype=np.float32)
        self.key = np.full(capacity, -1, dtype=np.int64)
        self.tree = SumTree(capacity)
        self.total_inserted = 0
        self.size = 0  # live transitions

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        """Bytes of every array this replay holds (what it costs in RAM once filled)."""
        arrays = [self.obs, self.next_obs, self.action, self.reward, self.discount, self.key,
                  self.tree.tree] + ([self.frames.planes] if self.framed else [])
        return sum(a.nbytes for a in arrays)

    @staticmethod
    def bytes_for(capacity: int, obs_shape: tuple[int, ...], obs_dtype=np.float32,
                  frame_capacity: int | None = None) -> int:
        """nbytes of a replay of these settings, without making it."""
        leaves = 1 << max(1, math.ceil(math.log2(capacity)))
        fields = capacity * (8 + 4 + 4 + 8) + 2 * leaves * 8  # action, reward, discount, key, tree
        if len(obs_shape) == 3:
            height, width, channels = obs_shape
            planes = capacity * channels if frame_capacity is None else frame_capacity
            return (fields + 2 * capacity * channels * 8
                    + framing.FrameRing.bytes_for(planes, (height, width), obs_dtype))
        return fields + 2 * capacity * math.prod(obs_shape) * np.dtype(obs_dtype).itemsize

    def check(self) -> dict:
        """Integrity after anything went wrong around it (a lost actor mid-insert, ...): every
        live slot holds exactly the key it should, with a finite priority > 0, empty slots
        have none, and the sum tree's root equals the sum of its leaves."""
        size = len(self)
        expected = np.arange(self.total_inserted - size, self.total_inserted, dtype=np.int64)
        live = self.key[expected % self.capacity]
        leaves = self.tree.leaves(np.arange(self.capacity))
        filled = np.zeros(self.capacity, dtype=bool)
        filled[expected % self.capacity] = True
        problems = []
        if not np.array_equal(np.sort(live), expected) or (self.key >= 0).sum() != size:
            problems.append("keys of live slots are not the last `size` insertion numbers")
        if not (np.isfinite(leaves[filled]).all() and (leaves[filled] > 0).all()):
            problems.append("a live slot has a priority that is not finite and > 0")
        if (leaves[~filled] != 0).any():
            problems.append("an empty slot has a priority")
        total = float(leaves.sum())
        if not np.isclose(self.tree.total, total, rtol=1e-6, atol=1e-9):
            problems.append(f"sum tree root {self.tree.total} != sum of leaves {total}")
        if self.framed and size:
            slots = expected % self.capacity
            if min(self.obs[slots].min(), self.next_obs[slots].min()) < self.frames.oldest:
                problems.append("a live transition references an overwritten frame")
        return {"ok": not problems, "problems": problems, "size": size,
                "inserted": self.total_inserted}

    def _scaled(self, td_abs: np.ndarray) -> np.ndarray:
        td_abs = np.asarray(td_abs, dtype=np.float64)
        if td_abs.size and not np.all(np.isfinite(td_abs)):
            raise ValueError("priorities must be finite; got NaN or inf (is the learner diverging?)")
        return (np.abs(td_abs) + self.eps) ** self.alpha

    def _check_block(self, block: Transitions) -> None:
        if self.framed:
            channels = self.obs_shape[2]
            if block.frames is None or block.frames.shape[1:] != self.obs_shape[:2] \
                    or block.obs.shape[1:] != (channels,):
                got = (f"frames {None if block.frames is None else block.frames.shape[1:]} "
                       f"with {block.obs.shape[1:]} plane indices")
                raise ValueError(f"block has {got}; this replay stores {self.obs_shape} images "
                                 f"as frames: expected a block from frames.pack_block")
            if len(block.frames) > self.frames.capacity:
                raise ValueError(f"block has {len(block.frames)} frames; this replay holds "
                                 f"frame_capacity={self.frames.capacity}")
        elif block.frames is not None or block.obs.shape[1:] != self.obs_shape:
            raise ValueError(f"block observations have shape {block.obs.shape[1:]}; this replay "
                             f"stores observations of shape {self.obs_shape}")

    def _evict(self, keys: np.ndarray) -> None:
        slots = keys % self.capacity
        slots = slots[self.key[slots] == keys]
        self.key[slots] = -1
        self.tree.set(slots, np.zeros(len(slots)))
        self.size -= len(slots)

    def add(self, block: Transitions) -> np.ndarray:
        """Insert a block (oldest slots are overwritten); returns the keys given to it."""
        self._check_block(block)
        scaled = self._scaled(block.priority)
        n = len(block)
        if n > self.capacity:  # only the newest `capacity` rows could survive anyway
            skipped = n - self.capacity
            block, scaled = block.take(slice(skipped, None)), scaled[skipped:]
            self.total_inserted += skipped
            n = self.capacity
        obs, next_obs = block.obs, block.next_obs
        if self.framed:
            first, evicted = self.frames.store(block.frames, self.total_inserted)
            for start, stop in evicted:
                self._evict(np.arange(max(start, self.total_inserted - self.capacity), stop))
            # int64: pack_frames numbers a block's planes in int32, and the run's count passes
            # 2^31 (NumPy 2 keeps an int32 array's type when a Python int is added).
            obs, next_obs = obs.astype(np.int64) + first, next_obs.astype(np.int64) + first
        keys = np.arange(self.total_inserted, self.total_inserted + n, dtype=np.int64)
        start = self.total_inserted % self.capacity
        first = min(n, self.capacity - start)  # the block may wrap around the ring's end
        for dst, src in ((slice(start, start + first), slice(0, first)),
                         (slice(0, n - first), slice(first, n))):
            if src.stop <= src.start:
                continue
            self.size += int((self.key[dst] < 0).sum())
            self.obs[dst] = obs[src]
            self.next_obs[dst] = next_obs[src]
            self.action[dst] = block.action[src]
            self.reward[dst] = block.reward[src]
            self.discount[dst] = block.discount[src]
            self.key[dst] = keys[src]
            self.tree.set_range(dst.start, scaled[src])
        self.total_inserted += n
        if self.framed:  # blocks whose transitions the ring has overwritten
            self.frames.forget_below(self.total_inserted - self.capacity)
        return keys

    def sample(self, batch_size: int, beta: float = 0.4) -> SampledBatch:
        """Stratified proportional sampling with normalised importance-sampling weights.

        w_i = (N * P(i)) ** -beta, divided by the batch's largest weight (as in Ape-X and
        Acme) so that weights only ever scale updates down.
        """
        return self.sample_many(batch_size, 1, beta).take(0)

    def sample_many(self, batch_size: int, num_batches: int, beta: float = 0.4) -> SampledBatch:
        """A stack of num_batches batches, each drawn as sample() draws one, from one walk
        down the tree for all of them: the mass is cut into batch_size strata as for one batch,
        each stratum into num_batches sub-strata, one draw in each; every stratum hands its
        draws out to the batches in a random order. So row i of every batch falls uniformly
        within stratum i, as in sample(), and the batches together cover the mass more evenly.
        The stack crosses a process as one set of arrays and goes into the learner's graph as
        it is (Learner.update_many)."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} is invalid: expected an integer >= 1")
        if not isinstance(num_batches, int) or num_batches < 1:
            raise ValueError(f"num_batches={num_batches!r} is invalid: expected an integer >= 1")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta={beta!r} is invalid: expected a number in [0, 1]")
        total, n = self.tree.total, batch_size * num_batches
        mass = (np.arange(n) + self.rng.random(n)) * (total / n)
        slots = self.tree.find(np.minimum(mass, np.nextafter(total, 0)))
        # Row i: the draws of stratum i; shuffled along it, so that no batch keeps one part
        # of every stratum (which would bias each batch though not their union).
        slots = self.rng.permuted(slots.reshape(batch_size, num_batches), axis=1).T
        leaves = self.tree.tree.take(slots + self.tree.leaf_offset)
        probabilities = leaves / total
        weights = (len(self) * probabilities) ** (-beta)
        weights /= weights.max(axis=1, keepdims=True)
        # ndarray.take is markedly faster than fancy indexing for these random gathers.
        transitions = Transitions(
            obs=self._observations(slots), action=self.action.take(slots),
            reward=self.reward.take(slots), discount=self.discount.take(slots),
            next_obs=self._observations(slots, after=True), priority=leaves.astype(np.float32))
        return SampledBatch(transitions, self.key.take(slots), weights.astype(np.float32),
                            probabilities)

    def row_bytes(self) -> int:
        """Bytes a transition takes in contents()' block, at most (images: every plane of
        its two observations its own, as in a sparse sample of the replay)."""
        fields = 8 + 4 + 4 + 4  # action, reward, discount, priority
        if self.framed:
            channels = self.obs_shape[2]
            return fields + 2 * channels * (4 + self.frames.planes[0].nbytes)
        return fields + 2 * self.obs[0].nbytes

    def contents(self, max_bytes: float | None = None) -> Transitions:
        """The live transitions as one block that add() takes (images packed as frames),
        oldest first, each with its priority as the |TD error| it came from: all of them, or
        an even random sample of them that fits max_bytes (what a checkpoint keeps of the
        replay, so that a resumed learner trains on what it learned from, not only on new
        play)."""
        keys = np.arange(self.total_inserted - self.size, self.total_inserted, dtype=np.int64)
        keys = keys[self.key[keys % self.capacity] == keys]
        rows = len(keys) if max_bytes is None else int(max_bytes // self.row_bytes())
        if len(keys) > rows:  # seeded by the count: the same replay gives the same sample
            picked = np.random.default_rng(self.total_inserted).choice(len(keys), rows,
                                                                       replace=False)
            keys = keys[np.sort(picked)]
        slots = keys % self.capacity
        leaves = self.tree.leaves(slots)
        td_abs = (np.maximum(leaves ** (1.0 / self.alpha) - self.eps, 0.0) if self.alpha > 0
                  else np.zeros(len(slots)))  # alpha 0: every priority is 1, whatever |TD|
        obs, next_obs, frames = self.obs[slots], self.next_obs[slots], None
        if self.framed:
            frames, obs, next_obs = framing.repack(
                obs, next_obs, lambda numbers: self.frames.planes[numbers % self.frames.capacity])
        return Transitions(obs=obs, action=self.action[slots], reward=self.reward[slots],
                           discount=self.discount[slots], next_obs=next_obs,
                           priority=td_abs.astype(np.float32), frames=frames)

    def load(self, block: Transitions) -> int:
        """Add a block from contents() (another replay's, perhaps bigger), in parts this
        replay can take whole; returns how many of its transitions this replay holds after
        (fewer than the block's where it did not fit)."""
        first = self.total_inserted
        step = self.capacity
        if self.framed and len(block.frames) > self.frames.capacity:
            # Parts whose planes fit the ring (two observations' planes a row, at most).
            step = max(1, self.frames.capacity // (2 * self.obs_shape[2]))
        # Rows older than the newest `capacity` would be evicted by the ones after them: skip
        # them (a checkpoint's 600,000 transitions into a 100,000 replay: one sixth the work).
        for start in range(max(0, len(block) - self.capacity), len(block), step):
            part = block.take(slice(start, start + step))
            if self.framed and step < len(block):
                frames, obs, next_obs = framing.repack(part.obs, part.next_obs,
                                                       lambda index: block.frames[index])
                part = dataclasses.replace(part, frames=frames, obs=obs, next_obs=next_obs)
            self.add(part)
        # The live keys are the newest `size` ones: those from `first` on are the block's.
        return self.total_inserted - max(first, self.total_inserted - self.size)

    def _observations(self, slots: np.ndarray, after: bool = False) -> np.ndarray:
        """The observations of these slots; images as their planes, channels first
        (frames.channels_first)."""
        stored = (self.next_obs if after else self.obs).take(slots, axis=0)
        return self.frames.stacks(stored) if self.framed else stored

    def update_priorities(self, keys: np.ndarray, td_abs: np.ndarray) -> int:
        """Set new priorities from |TD error|; returns how many keys were still live."""
        keys = np.asarray(keys, dtype=np.int64)
        td_abs = np.asarray(td_abs)
        if keys.shape != td_abs.shape:
            raise ValueError(f"keys has shape {keys.shape} but priorities has shape "
                             f"{td_abs.shape}; expected one priority per key")
        slots = keys % self.capacity
        live = self.key[slots] == keys
        if np.any(live):
            self.tree.set(slots[live], self._scaled(td_abs[live]))
        return int(live.sum())


class RateLimiter:
    """Keeps samples-per-insert near a target, like Reverb's SampleToInsertRatio.

    Counted in transitions: inserting n adds n * samples_per_insert to the budget, sampling a
    batch of b spends b. After `min_size` inserts, an insert waits while the budget is more
    than `error_buffer` ahead of the samples, and a sample waits while it would take the
    budget more than `error_buffer` behind. error_buffer >= (samples_per_insert + batch) / 2
    guarantees that one side can always proceed. samples_per_insert = 0 disables limiting
    (only min_size applies).
    """

    def __init__(self, samples_per_insert: float, min_size: int, error_buffer: float):
        if samples_per_insert < 0:
            raise ValueError(f"samples_per_insert={samples_per_insert!r} is invalid: expected >= 0")
        if min_size < 1:
            raise ValueError(f"min_size={min_size!r} is invalid: expected an integer >= 1")
        if error_buffer < 0:
            raise ValueError(f"error_buffer={error_buffer!r} is invalid: expected >= 0")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size = int(min_size)
        self.error_buffer = float(error_buffer)
        self.inserts = 0
        self.samples = 0
        self.insert_wait_s = 0.0
        self.sample_wait_s = 0.0
        self.closed = False
        self._cond = threading.Condition()

    def _budget(self) -> float:
        return (self.inserts - self.min_size) * self.samples_per_insert - self.samples

    def start_now(self) -> int:
        """The inserts so far become min_size (if fewer), so sampling may start; the budget
        counts from here. Returns the min_size that applies."""
        with self._cond:
            self.min_size = max(1, min(self.min_size, self.inserts))
            self._cond.notify_all()
            return self.min_size

    def count_loaded(self, n: int) -> None:
        """n transitions loaded from a checkpoint: they count toward min_size (sampling may
        start once it is met), not toward the sampling budget, so the learner samples at
        samples_per_insert against new play from the start, as it did before the stop."""
        with self._cond:
            self.inserts += min(n, max(0, self.min_size - self.inserts))
            self._cond.notify_all()

    def can_insert(self) -> bool:
        if self.samples_per_insert == 0 or self.inserts < self.min_size:
            return True
        # Room for at least one more transition; a block may overshoot by its own size.
        return self._budget() + self.samples_per_insert <= self.error_buffer

    def can_sample(self, n: int) -> bool:
        if self.inserts < self.min_size:
            return False
        return self.samples_per_insert == 0 or self._budget() - n >= -self.error_buffer

    def _await(self, ready, record, timeout: float | None) -> bool:
        start = time.monotonic()
        with self._cond:
            ok = self._cond.wait_for(lambda: self.closed or ready(), timeout=timeout)
            waited = time.monotonic() - start
            if not ok or self.closed:
                return False
            record(waited)
            self._cond.notify_all()
            return True

    def await_insert(self, n: int, timeout: float | None = None) -> bool:
        """Block until n transitions may be inserted and count them; False on timeout/close."""
        def record(waited):
            self.inserts += n
            self.insert_wait_s += waited
        return self._await(self.can_insert, record, timeout)

    def await_sample(self, n: int, timeout: float | None = None) -> bool:
        """Block until a batch of n may be sampled and count it; False on timeout/close."""
        def record(waited):
            self.samples += n
            self.sample_wait_s += waited
        return self._await(lambda: self.can_sample(n), record, timeout)

    def close(self) -> None:
        """Release every waiter (they return False) and refuse all later waits."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class ReplayService:
    """Thread-safe replay + rate limiter: the object the Ray replay actor wraps.

    Actors call add() with blocks, the learner calls sample() and update_priorities(); both
    may be called from many threads at once (a threaded Ray actor). A block is either stored
    whole or refused (returns False) so the caller can retry it: nothing accepted is lost.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], *, alpha: float, eps: float,
                 samples_per_insert: float, min_size: int, error_buffer: float, seed: int = 0,
                 obs_dtype=np.float32, frame_capacity: int | None = None):
        if min_size > capacity:
            raise ValueError(f"min_size={min_size:,} is more than the replay's capacity="
                             f"{capacity:,}: the learner would never start")
        self.replay = PrioritizedReplay(capacity, obs_shape, alpha=alpha, eps=eps, seed=seed,
                                        obs_dtype=obs_dtype, frame_capacity=frame_capacity)
        self.limiter = RateLimiter(samples_per_insert, min_size, error_buffer)
        self._lock = threading.Lock()
        self.priority_updates = 0
        self.stale_priority_updates = 0
        self.loaded = 0  # transitions from a checkpoint (load), not inserted by this run's actors

    def add(self, block: Transitions, timeout: float | None = 1.0) -> bool:
        if len(block) == 0:
            return True
        if not self.limiter.await_insert(len(block), timeout):
            return False
        with self._lock:
            self.replay.add(block)
        return True

    def contents(self, max_bytes: float | None = None) -> Transitions:
        """What this replay holds (PrioritizedReplay.contents), for a checkpoint."""
        with self._lock:
            return self.replay.contents(max_bytes)

    def load(self, block: Transitions) -> int:
        """Transitions from a checkpoint (contents() of the run it resumes), before or beside
        new play; they count toward min_size. Returns how many of them this replay holds."""
        with self._lock:
            held = self.replay.load(block)
            self.loaded += len(block)
        self.limiter.count_loaded(len(block))
        return held

    def sample(self, batch_size: int, beta: float, timeout: float | None = 1.0,
               num_batches: int = 1) -> SampledBatch | None:
        """A stack of num_batches batches (one round trip for several learner updates), or None
        on timeout."""
        if not self.limiter.await_sample(batch_size * num_batches, timeout):
            return None
        with self._lock:
            return self.replay.sample_many(batch_size, num_batches, beta)

    def update_priorities(self, keys: np.ndarray, td_abs: np.ndarray) -> int:
        with self._lock:
            live = self.replay.update_priorities(keys, td_abs)
        self.priority_updates += len(keys)
        self.stale_priority_updates += len(keys) - live
        return live

    def check(self) -> dict:
        with self._lock:
            return self.replay.check()

    def start_sampling(self) -> int:
        """Sampling may start now, before min_size inserts (learn_after_recovery): returns the
        minimum that applies from now on."""
        return self.limiter.start_now()

    def stats(self) -> dict:
        with self._lock:
            return {
                "size": len(self.replay),
                # This run's actors' transitions; a checkpoint's loaded ones are counted apart.
                "inserted": self.replay.total_inserted - self.loaded,
                "loaded": self.loaded,
                "sampled": self.limiter.samples,
                "insert_wait_s": self.limiter.insert_wait_s,
                "sample_wait_s": self.limiter.sample_wait_s,
                "priority_updates": self.priority_updates,
                "stale_priority_updates": self.stale_priority_updates,
                "priority_total": self.replay.tree.total,
                "capacity": self.replay.capacity,
                "bytes": self.replay.nbytes,
            }

    def close(self) -> None:
        self.limiter.close()


def merged_check(checks: list[dict]) -> dict:
    """The replay shards' integrity checks (PrioritizedReplay.check) as one."""
    return {"ok": bool(checks) and all(x["ok"] for x in checks),
            "problems": [p for x in checks for p in x["problems"]],
            "size": sum(x["size"] for x in checks),
            "inserted": sum(x["inserted"] for x in checks), "shards": len(checks)}
