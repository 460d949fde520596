"""The blocks that move between the RL core's parts: Transitions (actor -> replay, as one block
of n-step transitions) and SampledBatch (replay -> learner). Both are struct-of-arrays: one numpy
array per field, so that nothing crosses a process as a list of tuples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distrl.rl import frames as framing


@dataclass
class Transitions:
    """A block of n-step transitions, one row per transition (in a stack of batches, one per batch).

    reward is the discounted n-step return R = sum_k gamma^k r_k; discount is gamma^k for the
    k steps folded when the target should bootstrap from next_obs, and 0 when the episode
    terminated inside the n steps. priority is the actor's |TD error| (before the exponent).

    frames, for image observations on their way to replay (frames.pack_block): the block's
    planes (num_planes, height, width), each stored once; obs and next_obs then hold, per
    transition, the index in frames of each channel's plane ((n, channels) int32).
    observations() rebuilds the images.
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    next_obs: np.ndarray
    priority: np.ndarray
    frames: np.ndarray | None = None

    # The fields with one row per transition (frames is the block's, not a row's).
    ROWS = ("obs", "action", "reward", "discount", "next_obs", "priority")

    def __len__(self) -> int:
        return int(self.action.shape[0])

    def __post_init__(self) -> None:
        n = len(self)
        for name in self.ROWS:
            value = getattr(self, name)
            if not isinstance(value, np.ndarray) or value.shape[:1] != (n,):
                shape = getattr(value, "shape", type(value).__name__)
                raise ValueError(f"Transitions.{name} has shape {shape}; expected a numpy "
                                 f"array with {n} rows like Transitions.action")
        if self.frames is not None:
            for name in ("obs", "next_obs"):
                refs = getattr(self, name)
                if (refs.ndim != 2 or refs.dtype.kind not in "iu"
                        or (refs.size and not 0 <= refs.min() <= refs.max() < len(self.frames))):
                    raise ValueError(f"Transitions.{name} holds {refs.dtype} of shape "
                                     f"{refs.shape}; with frames, expected (rows, channels) "
                                     f"indices below len(frames)={len(self.frames)}")

    def observations(self, refs: np.ndarray) -> np.ndarray:
        """The images (..., height, width, channels) that plane indices refs (..., channels)
        stand for."""
        return framing.images(self.frames, refs)

    @staticmethod
    def concat(blocks: list[Transitions]) -> Transitions:
        if any(b.frames is not None for b in blocks):
            raise ValueError("Transitions.concat takes blocks of observations, not of frames")
        return Transitions(**{name: np.concatenate([getattr(b, name) for b in blocks])
                              for name in Transitions.ROWS})

    def take(self, index) -> Transitions:
        return Transitions(**{name: getattr(self, name)[index] for name in self.ROWS},
                           frames=self.frames)


@dataclass
class SampledBatch:
    """A learner batch: the transitions, their replay keys and importance-sampling weights.
    Image observations in it are channels first, as replay stores their planes
    (frames.channels_first); the learner's graph moves the channels last.

    From sample_many, a stack of batches: every array has a first axis of one row per batch
    (keys, weights and probabilities shaped (num_batches, batch_size)); take(k) is batch k.
    """

    transitions: Transitions
    keys: np.ndarray
    weights: np.ndarray
    probabilities: np.ndarray

    def take(self, index) -> SampledBatch:
        return SampledBatch(self.transitions.take(index), self.keys[index], self.weights[index],
                            self.probabilities[index])

    @staticmethod
    def concat(stacks: list[SampledBatch]) -> SampledBatch:
        """Stacks of batches (of one batch size) as one stack."""
        return SampledBatch(Transitions.concat([s.transitions for s in stacks]),
                            *(np.concatenate([getattr(s, name) for s in stacks])
                              for name in ("keys", "weights", "probabilities")))
