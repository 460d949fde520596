"""Image observations as frames: packing, block folding, sizing and the replay's ring.

Each channel of an image observation is a plane (height x width, the env's dtype, uint8 for
pixels) stored once, and a transition holds the indices of its observations' planes. Four
stacked Atari frames share three planes with the next step's, and a transition's next
observation is a later transition's observation, so a transition costs about one plane (7 KB
at 84x84) instead of two float32 stacks (220 KB).

The actor packs each block (pack_block); the replay keeps the planes in a FrameRing; the
replay's size follows frames_per_transition. How frames are stored is this module's business
only.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

# Atari observations stack the last FRAME_STACK frames (the Nature DQN's 4; envs.make_env).
FRAME_STACK = 4


def is_atari(env_id: str) -> bool:
    """The Atari games (ALE/...), which envs.make_env preprocesses and stacks FRAME_STACK deep."""
    return env_id.startswith("ALE/")


def frames_per_transition(config, obs_shape: tuple[int, ...]) -> float | None:
    """Planes a replay of image observations holds per transition (None: not images): what
    a block from pack_block holds, per slot, for T = actor_block_steps new steps. The window
    has T + n - 1 steps (n - 1 carried over) and one final observation, T + n observations in
    all. Where frames are stacked (Atari), the first takes all C planes and each later one a
    single plane: (C + T + n - 1) / T. Elsewhere every observation takes its C planes:
    C (T + n) / T. An episode's end adds a stack's planes."""
    if len(obs_shape) != 3:
        return None
    channels, steps, n = obs_shape[2], config.actor_block_steps, config.n_step
    if is_atari(config.env_id):
        return (channels + steps + n - 1) / steps
    return channels * (steps + n) / steps


def frames_per_block(config, obs_shape: tuple[int, ...]) -> int:
    """Planes in one actor's block of image observations (0: not images), as above."""
    per_transition = frames_per_transition(config, obs_shape) or 0
    return math.ceil(per_transition * config.actor_block_steps * config.envs_per_actor)


def replay_sizing(config, obs_shape: tuple[int, ...]) -> dict:
    """What apex.replay_memory.sized_capacity needs to know of the frames: planes per transition, and one
    block's planes of headroom (the ring evicts a block whole once its first plane goes)."""
    return {"frames_per_transition": frames_per_transition(config, obs_shape),
            "frame_headroom": frames_per_block(config, obs_shape)}


def pack_frames(observations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Image observations (E, height, width, channels) as planes stored once, and each
    observation's plane indices (E, channels).

    Where observation e's channels 0..C-2 are exactly e - 1's channels 1..C-1 (a frame stack
    moved on by one frame), only its last plane is new; otherwise all its C planes are. So an
    episode's observations in time order share all but one plane each. The test is on the
    values, so the packing is exact for any env: one that stacks no frames shares no planes.
    """
    num, channels = len(observations), observations.shape[-1]
    shifted = np.zeros(num, dtype=bool)
    if num > 1 and channels == 4 and observations.dtype == np.uint8:
        # A pixel's 4 planes as one little-endian uint32: planes 0-2 of e are planes 1-3 of
        # e - 1 shifted down a byte. 5x faster than comparing strided planes (a Pong block).
        pixels = np.ascontiguousarray(observations).view("<u4")[..., 0]
        shifted[1:] = ((pixels[1:] & 0xFFFFFF) == (pixels[:-1] >> 8)).all(axis=(1, 2))
    elif num > 1 and channels > 1:
        shifted[1:] = (observations[1:, ..., :-1] == observations[:-1, ..., 1:]).all(axis=(1, 2, 3))
    new = np.where(shifted, 1, channels)
    first_new = np.cumsum(new) - new          # index of each observation's first new plane
    # run[e]: how many observations in a row up to e moved on by one frame (0 where e did not).
    run = np.arange(num) - np.maximum.accumulate(np.where(~shifted, np.arange(num), 0))
    channel = np.arange(channels)
    back = channels - 1 - channel                               # frames ago a channel was new
    head = np.arange(num) - run                                 # where the run started
    in_run = back[None, :] <= run[:, None]
    earlier = np.maximum(np.arange(num)[:, None] - back[None, :], 0)
    recent = first_new[earlier] + new[earlier] - 1              # the newest plane of e - back
    at_head = first_new[head][:, None] + channel[None, :] + run[:, None]
    refs = np.where(in_run, recent, at_head).astype(np.int32)
    source, plane = np.nonzero(np.where(shifted[:, None], channel[None, :] == channels - 1, True))
    frames = observations[source, :, :, plane]
    return frames, refs


def pack_block(obs, next_obs, rows, slots, last_rows, from_obs
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The planes of a block of transitions (rows, slots) of an actor's steps, each once, and
    the plane indices of each transition's obs and next_obs: (frames, obs refs, next refs).
    obs and next_obs are the steps' (length, slots, height, width, channels); a transition's
    next observation is the obs of step last_rows + 1 where from_obs, else next_obs of step
    last_rows (an episode's end). Laid out slot by slot in time order, a frame stack shares
    all but one plane with the observation before it."""
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
    return frames, refs[entry[rows, slots, 0]], refs[next_entry]


def repack(obs_refs: np.ndarray, next_refs: np.ndarray, planes_of
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Transitions' plane references (numbers in the replay's ring, or indices into a bigger
    block's frames) as a block of their own: the planes they use, each once (planes_of(numbers)
    fetches them), and each reference renumbered from 0. (frames, obs refs, next refs)."""
    numbers, inverse = np.unique(np.concatenate([obs_refs, next_refs]).ravel(),
                                 return_inverse=True)
    refs = inverse.reshape(2, *obs_refs.shape).astype(np.int32)
    return planes_of(numbers), refs[0], refs[1]


def channels_first(obs_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape replay samples an observation of obs_shape in: an image (height, width,
    channels) as its planes, (channels, height, width); a vector as it is."""
    if len(obs_shape) != 3:
        return tuple(obs_shape)
    height, width, channels = obs_shape
    return channels, height, width


def images(frames: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """The images (..., height, width, channels) that plane indices refs (..., channels) of
    frames (planes, height, width) stand for."""
    return np.moveaxis(frames.take(refs, axis=0), -3, -1)


class FrameRing:
    """The replay's planes: a ring of `capacity` planes, where each block's planes arrive
    packed and are numbered on (plane numbers only grow). A block's transitions reference only
    its own planes, so when the ring overwrites a block's first plane, that block's
    transitions must leave the replay: store() says which keys."""

    def __init__(self, capacity: int, plane_shape: tuple[int, int], dtype, channels: int):
        if not isinstance(capacity, int) or capacity < channels:
            raise ValueError(f"frame_capacity={capacity!r} is invalid: expected an integer >= "
                             f"{channels} (one observation's planes)")
        self.capacity = capacity
        self.planes = np.zeros((capacity, *plane_shape), dtype=dtype)
        self.inserted = 0  # planes stored so far: the next plane's number
        self._blocks: deque[tuple[int, int]] = deque()  # (first key, first plane number)

    @staticmethod
    def bytes_for(capacity: int, plane_shape: tuple[int, int], dtype) -> int:
        return capacity * math.prod(plane_shape) * np.dtype(dtype).itemsize

    @property
    def oldest(self) -> int:
        """The number of the oldest plane still held."""
        return self.inserted - self.capacity

    def store(self, frames: np.ndarray, first_key: int) -> tuple[int, list[tuple[int, int]]]:
        """Write a block's planes, its transitions keyed from first_key; returns the first
        plane's number and the key ranges [start, stop) of the blocks whose planes it
        overwrote."""
        first, count = self.inserted, len(frames)
        self.planes[np.arange(first, first + count) % self.capacity] = frames
        self.inserted += count
        self._blocks.append((first_key, first))
        evicted = []
        while self._blocks and self._blocks[0][1] < self.oldest:
            start, _ = self._blocks.popleft()
            evicted.append((start, self._blocks[0][0] if self._blocks else first_key))
        return first, evicted

    def forget_below(self, key: int) -> None:
        """Blocks all of whose transitions are older than key (the replay overwrote them)."""
        while len(self._blocks) > 1 and self._blocks[1][0] <= key:
            self._blocks.popleft()

    def stacks(self, numbers: np.ndarray) -> np.ndarray:
        """The planes of plane numbers (..., channels) as one array (..., channels, height,
        width): channels first, as the planes are stored, so the gather copies whole planes
        (a Pong batch of 512 in about a millisecond, where moving the channels last here
        took 16: a strided copy, byte by byte). The learner moves them last in its graph."""
        return self.planes.take(numbers % self.capacity, axis=0)
