"""A run's clock: seconds since its train(), for moments taken in other processes (a notebook's
kill of a node, the local autoscaler's events).

A wall clock may be stepped while a run goes on: on a test machine one jumped 17 s forward
within a 47-s run, and notebook 04 placed its kill 17 s early on the run's clock. A moment
therefore carries the monotonic clock too, which is one clock for every process on one boot of
one machine (Linux's CLOCK_MONOTONIC), with the boot's id; the wall clock serves where the run
ran elsewhere (a GKE pod)."""

from __future__ import annotations

import time
from pathlib import Path


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux: moments compare by the wall clock
        return None


BOOT_ID = _boot_id()


def moment() -> dict:
    """Now, on both clocks."""
    return {"wall": time.time(), "monotonic": time.monotonic(), "boot_id": BOOT_ID}


def run_seconds(result: dict, at: dict | float) -> float:
    """`at` (a moment(), or a wall-clock time) in seconds since the run's train(), `result`
    its results.json: by the monotonic clock where both were taken on this boot of one
    machine, else by the wall clock."""
    if isinstance(at, dict):
        if (at.get("boot_id") is not None and at["boot_id"] == result.get("boot_id")
                and result.get("started_monotonic") is not None):
            return at["monotonic"] - result["started_monotonic"]
        at = at["wall"]
    return at - result["started_at"]
