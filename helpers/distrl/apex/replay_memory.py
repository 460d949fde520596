"""How large a replay this node can hold: its available memory (a container's limit included)
and the replay's bytes per transition. A process placement concern, not the RL core's: the
replay worker sizes its shard with it, and the GKE plan's head must fit one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from distrl.rl.replay import PrioritizedReplay

# A replay may take this share of its node's available memory: the learner's batches, Ray's
# object store and the actors on the node need the rest.
MEMORY_SHARE = 0.5
# Transitions held when the capacity is left to the machine: 2 million, Ape-X's replay size as
# reimplementations give it (the paper's own text could not be read from here to check it).
APEX_CAPACITY = 2_000_000


def available_memory(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """Bytes of memory this process can still take: the node's available memory (psutil's
    'available'), or less where its container's memory limit leaves less. In a pod psutil sees
    the whole node, and the kernel ends the pod at its limit. cgroup v2 (GKE's nodes) keeps the
    limit in memory.max, v1 in memory/memory.limit_in_bytes; page cache it could drop
    (inactive_file) does not count as used, as the kernel reclaims it before the limit."""
    import psutil

    available = int(psutil.virtual_memory().available)
    root = Path(cgroup_root)
    for folder, limit_name, usage_name, cache_name in (
            (root, "memory.max", "memory.current", "inactive_file"),
            (root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
             "total_inactive_file")):
        try:
            limit = (folder / limit_name).read_text().strip()
            usage = int((folder / usage_name).read_text())
            stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines()
                        if line.strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit():  # v2 writes "max" where there is no limit
            usage -= int(stat.get(cache_name, 0))
            available = min(available, int(limit) - usage)
        break
    return max(0, available)


def sized_capacity(capacity: int | None, obs_shape: tuple[int, ...], *, obs_dtype=np.float32,
                   frames_per_transition: float | None = None, frame_headroom: int = 0,
                   share: float = MEMORY_SHARE,
                   available: int | None = None) -> tuple[int, int | None]:
    """(capacity, frame_capacity) for a replay on this node. capacity None: as many
    transitions as fit in `share` of the available memory, at most APEX_CAPACITY. A capacity
    that does not fit is refused, with how many would.

    Image observations: the frame ring holds frames_per_transition planes per transition, plus
    frame_headroom (a block's planes: the ring evicts a block whole once its first plane goes).
    """
    def frames_for(n: int) -> int | None:
        if frames_per_transition is None:
            return None
        return max(obs_shape[-1], math.ceil(n * frames_per_transition) + frame_headroom)

    def bytes_for(n: int) -> int:
        return PrioritizedReplay.bytes_for(n, obs_shape, obs_dtype, frames_for(n))

    probe = 1 << 16
    per_transition = bytes_for(probe) / probe
    budget = (available_memory() if available is None else available) * share
    fits = int(budget // per_transition)
    while fits > 0 and bytes_for(fits) > budget:  # the sum tree rounds up to a power of 2
        fits -= max(1, math.ceil((bytes_for(fits) - budget) / per_transition))
    if capacity is None:
        capacity = min(APEX_CAPACITY, fits)
        if capacity < 1:
            raise ValueError(f"no transition of {obs_shape} observations fits in "
                             f"{budget / 2**20:.0f} MiB ({share:.0%} of the available memory)")
    elif bytes_for(capacity) > budget:
        raise ValueError(
            f"replay_capacity={capacity:,} does not fit: it needs "
            f"{bytes_for(capacity) / 2**30:.2f} GiB ({per_transition / 1024:.2f} KiB a "
            f"transition of {obs_shape} observations), and a replay may take {share:.0%} of the "
            f"{budget / share / 2**30:.2f} GiB this node has available: at most {fits:,} "
            "transitions fit")
    return capacity, frames_for(capacity)
