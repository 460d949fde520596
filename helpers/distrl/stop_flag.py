"""StopFlag: a stop asked for by a signal handler or by another thread, which neither can
lose nor deadlock on. The training driver (distrl.apex.faults.catch_sigterm) and the collector's
command (distrl.otel.collector) stop on it."""

from __future__ import annotations

import time


class StopFlag:
    """Set once, by SIGTERM's handler or by another thread; read and waited on by the driver or
    the collector.

    A plain attribute and no lock, so that setting it from a signal handler can neither be lost
    nor deadlock. A handler that raises (Ray's: sys.exit) loses the signal wherever Python
    swallows the exception: seen in a test run, Ray's SystemExit raised inside logging's at-fork
    callback (`Exception ignored in: <function _releaseLock>`) while ray.init started a process,
    and the run trained on. A handler that takes a lock (threading.Event.set) deadlocks if the
    main thread it interrupts holds that lock (inside Event.wait)."""

    POLL_S = 0.05

    def __init__(self) -> None:
        self._set = False
        self.why = "SIGTERM"  # who asked, for the run's stop line

    def set(self, why: str = "SIGTERM") -> None:
        """Stop the run as SIGTERM would; `why` names who asked (another thread: its reason)."""
        if not self._set:
            self.why = why
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, less once set; returns is_set()."""
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._set and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(self.POLL_S, left))
        return self._set
