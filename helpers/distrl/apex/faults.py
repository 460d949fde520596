"""Fault handling of an Ape-X run: SIGTERM (a Spot notice, a drain), deadlines, and the driver's view
of actors that come, go, and wait for a node.

Nothing here waits without a deadline. A lost node shows up as an actor that stops reporting,
its run() failing with RayActorError while Ray restarts it (as soon as some node has a free
CPU), or ActorDiedError once Ray has given up on it; the run goes on with the others.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import textwrap
import threading
import time

from distrl.stop_flag import StopFlag  # also distrl.apex.faults.StopFlag, for the driver's callers

# An actor that has not answered a stats request for this long is no longer counted as running.
STALE_S = 5.0
# Every actor running this long (again, after a loss), the slowest at this share of the median
# actor's pace or more: the fleet says its steady env steps/s.
STEADY_S, STEADY_SHARE = 3.0, 0.2


class Deadline:
    """A point in monotonic time; `left()` is what remains of it (never below 0)."""

    def __init__(self, seconds: float | None):
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float | None:
        if self.at is None:
            return cap
        left = max(0.0, self.at - time.monotonic())
        return left if cap is None else min(left, cap)

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


def get_within(ref, seconds: float | None, default=None, errors: list | None = None):
    """ray.get with a deadline: the value, or `default` when it does not come in time or its
    process is gone (the reason is appended to `errors` when given)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    try:
        return ray.get(ref, timeout=seconds)
    except (GetTimeoutError, RayError) as e:
        if errors is not None:
            errors.append(cause(e))
        return default


def cause(error: BaseException) -> str:
    """The first line of an error, short enough for one log line (cut at a word, not in one).
    Where a process died of an error its own code raised (Ray puts the traceback in the
    message: "The actor died because of an error raised in its creation task ..."), that
    error's message instead, whole: it says what to change."""
    text = str(error).strip().splitlines()
    raised = [i for i, line in enumerate(text) if re.match(r"[A-Za-z_.]*(Error|Exception): ", line)]
    if type(error).__module__.startswith("ray.") and raised:
        return " ".join(line.strip() for line in text[raised[-1]:])
    return textwrap.shorten(text[0] if text else type(error).__name__, 160, placeholder=" ...")


def lost_reason(error: BaseException) -> str:
    """Why an actor is gone, in a reader's words where Ray's message is its transport's ("RPC
    error: Socket closed rpc_code: 14 ..."): the exception's class says it."""
    from ray.exceptions import ActorUnavailableError

    if isinstance(error, ActorUnavailableError):
        return "ActorUnavailableError: Ray cannot reach its process; its node may be gone"
    return cause(error)


# --------------------------------------------------------------------------- SIGTERM


def on_sigterm(action) -> None:
    """Run action() on SIGTERM (a Spot notice, a pod deletion), then end the process as SIGTERM
    would. Ray's own handler cannot be chained to here: raised from a signal handler while the
    worker's main thread waits in Ray's C++ loop, its SystemExit never ends the process.
    Call from the process's main thread (a Ray actor's __init__ runs there)."""

    def handler(signum, frame):
        try:
            action()
        finally:
            os._exit(128 + signal.SIGTERM)

    with contextlib.suppress(ValueError):  # not the main thread: no handler, nothing breaks
        signal.signal(signal.SIGTERM, handler)


def ask_learner_to_checkpoint(get_learner, role: str):
    def action():
        learner = get_learner()
        if learner is not None:
            import ray

            ray.get(learner.checkpoint_now.remote(f"SIGTERM to the {role}"), timeout=20)
    return action


def catch_sigterm(flag: StopFlag):
    """SIGTERM to the driver sets `flag` (the run then ends with a final checkpoint). Returns
    the previous handler, or None when this is not the main thread (nothing installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())
    return previous


def restore_sigterm(previous) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def ray_keeps_our_sigterm_handler():
    """While inside: ray.init cannot replace this process's SIGTERM handler with its own, which
    raises SystemExit wherever the main thread happens to be (StopFlag says why that loses the
    signal). ray.init and the Node it builds both install theirs through
    ray._private.utils.set_sigterm_handler (Ray 2.60); a private API: if it is gone, nothing
    is replaced and the caller still catches SystemExit."""
    try:
        from ray._private import utils
        original = utils.set_sigterm_handler
    except (ImportError, AttributeError):
        yield
        return
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = original


# --------------------------------------------------------------------------- the actor fleet


def in_a_process(actors: list, indices) -> set[int]:
    """Of these actors (by index), those Ray has given a process: still in __init__, not
    waiting for a CPU. In Ray's GCS actor table an actor placed on a worker is PENDING_CREATION
    with its pid, one queued for resources has pid 0 (as Ray 2.60 records them; a worker still
    in its own boot also shows pid 0). One call for every pending actor of the cluster;
    a private API (ray._private.state, as node_groups reads): on any error none counts."""
    try:
        from ray._private import state

        pending = state.actors(actor_state_name="PENDING_CREATION")
        return {i for i in indices
                if pending.get(actors[i]._actor_id.hex(), {}).get("Pid")}
    except Exception:  # noqa: BLE001 - a private API: "waiting" is the safe answer
        return set()


class ActorFleet:
    """The driver's view of its actors: who runs, who waits for a node (and since when), and
    counters that survive restarts. The driver hands it every reply of an actor's run() or
    stats(); it answers with the changes worth a log line."""

    def __init__(self, actors: list, now: float):
        n = len(actors)
        self.actors = actors
        self.restarts = [0] * n          # new processes seen per actor (a pid that changed)
        self.pids: list[int | None] = [None] * n
        self.nodes: list[str | None] = [None] * n
        self.last = [{"env_steps": 0, "transitions_sent": 0} for _ in range(n)]
        self.base = [0] * n              # env steps of earlier lives of each actor
        self.seen: list[float | None] = [None] * n
        self.waiting_since: list[float | None] = [now] * n   # None while it steps
        self.ran = [False] * n           # has stepped in some life
        self.retired: dict[int, str] = {}                    # actor -> why, for good
        self.full_since: tuple[float, int] | None = None     # (time, env steps): all run
        self.said_steady = False
        self.run_refs: dict = {}         # run() ref -> actor
        self.stats_refs: dict = {}       # stats() ref -> actor
        self.rerun_pending: set[int] = set()  # lost actors whose run() goes out again
        self.lost_pid: dict[int, int | None] = {}  # the pid of each one's lost life
        self.none_running_since: float | None = now
        self.first_step_time: float | None = None  # wall-clock: the earliest first env.step

    # --- requests ---
    def start(self) -> None:
        for i, actor in enumerate(self.actors):
            self.run_refs[actor.run.remote()] = i

    def ask(self, carrier: dict | None) -> None:
        """Ask every actor without an open request for its stats."""
        asked = set(self.stats_refs.values())
        for i, actor in enumerate(self.actors):
            if i not in asked and i not in self.retired:
                self.stats_refs[actor.stats.remote(trace_context=carrier)] = i

    def outstanding(self) -> list:
        return [*self.run_refs, *self.stats_refs]

    # --- replies ---
    def handle(self, ref, now: float) -> list[tuple[str, str]] | None:
        """Take one ready reply; returns (kind, detail) events, or None if it is not ours."""
        import ray
        from ray.exceptions import ActorDiedError, RayActorError

        if ref in self.stats_refs:
            i = self.stats_refs.pop(ref)
            try:
                stats = ray.get(ref, timeout=0)
            except RayActorError:
                return []  # its run() reply says what happened
            return self._reported(i, stats, now)
        if ref not in self.run_refs:
            return None
        i = self.run_refs.pop(ref)
        try:
            ray.get(ref, timeout=0)
            return []  # returned: stop() was called
        except ActorDiedError as e:  # for good: Ray has no restarts left for it
            return self._retire(i, f"lost for good ({cause(e)})", now)
        except RayActorError as e:  # its process is gone; Ray restarts it
            self.rerun_pending.add(i)  # run() again once its next life reports
            self.lost_pid[i] = self.pids[i]
            if self.waiting_since[i] is not None:
                return []  # already known: a run() sent while it was restarting
            events = [("actor_lost", f"actor {i} lost ({lost_reason(e)}); Ray restarts it as soon "
                       "as a node has a free CPU")]
            return events + self._stopped(i, now)
        except Exception as e:  # noqa: BLE001 - run() raised: this actor cannot go on
            return self._retire(i, f"failed ({cause(e)})", now)

    def tick(self, now: float) -> list[tuple[str, str]]:
        """Notice actors that went quiet, and every actor running steadily."""
        events = []
        for i in range(len(self.actors)):
            if (self.waiting_since[i] is None and i not in self.retired
                    and now - self.seen[i] >= STALE_S):
                events += [("actor_silent", f"actor {i} stopped reporting")]
                events += self._stopped(i, self.seen[i])
        return events + self._steady(now)

    def _steady(self, now: float) -> list[tuple[str, str]]:
        """Once every actor has run for STEADY_S (again, after a loss), each at STEADY_SHARE of
        the median actor's pace or more, the env steps/s of that stretch: the evidence that a
        demonstration of a lost node waits for. A new process that reports but still warms up
        (beside a loaded machine's other work: 16 env steps/s against its peers' thousands)
        starts the stretch again."""
        if self.running() < self.expected or self.expected == 0:
            self.full_since, self.said_steady = None, False
        elif self.full_since is None:
            self.full_since = (now, self.env_steps_each())
        elif not self.said_steady and now - self.full_since[0] >= STEADY_S:
            (since, steps), each = self.full_since, self.env_steps_each()
            rates = sorted((b - a) / (now - since) for a, b in zip(steps, each))
            # an actor that did not step (all of them, held back by the rate limiter behind a
            # slow learner) is not running steadily, whatever its peers' pace
            if rates[0] <= 0 or rates[0] < STEADY_SHARE * rates[len(rates) // 2]:
                self.full_since = (now, each)
                return []
            self.said_steady = True
            return [("steady", f"all {self.expected} actors running for {now - since:.0f} s: "
                               f"{sum(rates):,.0f} env steps/s")]
        return []

    def _reported(self, i: int, stats: dict, now: float) -> list[tuple[str, str]]:
        if self.pids[i] is not None and stats["pid"] != self.pids[i]:  # a new life of actor i
            self.restarts[i] += 1
            self.base[i] += self.last[i]["env_steps"]
        elif stats["env_steps"] < self.last[i]["env_steps"]:
            self.base[i] += self.last[i]["env_steps"]
        if (stepped := stats.get("first_step_time")) is not None:  # any life's: the earliest
            self.first_step_time = stepped if self.first_step_time is None else \
                min(stepped, self.first_step_time)
        self.pids[i], self.last[i], self.seen[i] = stats["pid"], stats, now
        self.nodes[i] = stats.get("node_id")
        if i in self.rerun_pending:
            if stats["pid"] == self.lost_pid.get(i):
                return []  # a late reply of the life that was lost
            self.rerun_pending.discard(i)  # a new life: set it to work
            self.run_refs[self.actors[i].run.remote()] = i
        if self.waiting_since[i] is None or i in self.retired:
            return []
        if stats["env_steps"] <= 0:
            return []  # its process answers, but it has not stepped: it still builds envs, model
        self.waiting_since[i] = None
        self.none_running_since = None
        node = (self.nodes[i] or "?")[:8]
        first, self.ran[i] = not self.ran[i], True
        kind, verb = ("actor_running", "running") if first else ("actor_back", "is back")
        return [(kind, f"actor {i} {verb} on node {node}: {self.running()} of "
                 f"{self.expected} actors running")]

    def _stopped(self, i: int, since: float) -> list[tuple[str, str]]:
        if self.waiting_since[i] is None:
            self.waiting_since[i] = since
        if self.running() == 0 and self.none_running_since is None:
            self.none_running_since = since
        return []

    def _retire(self, i: int, why: str, now: float) -> list[tuple[str, str]]:
        self.retired[i] = why
        self.rerun_pending.discard(i)
        self._stopped(i, now)
        return [("actor_lost", f"actor {i} {why}: going on with {self.expected} of "
                 f"{len(self.actors)} actors")]

    # --- what the driver reads ---
    @property
    def expected(self) -> int:
        return len(self.actors) - len(self.retired)

    def running(self) -> int:
        return sum(1 for i, w in enumerate(self.waiting_since)
                   if w is None and i not in self.retired)

    def waiting(self, now: float) -> list[tuple[int, float]]:
        """(actor, seconds it has waited) for every actor that should run but does not."""
        return [(i, now - w) for i, w in enumerate(self.waiting_since)
                if w is not None and i not in self.retired]

    def waiting_line(self, now: float, starting: set[int] | frozenset = frozenset()) -> str:
        """E.g. '1 of 3 actors running; actor 0 starting since 8 s; actor 2 waiting for a CPU
        since 40 s'. `starting`: the actors Ray has given a process already (in_a_process)."""
        waits = "; ".join(f"actor {i} {'starting' if i in starting else 'waiting for a CPU'} "
                          f"since {s:.0f} s" for i, s in self.waiting(now))
        return f"{self.running()} of {self.expected} actors running" + (
            f"; {waits}" if waits else "")

    def states(self, now: float) -> list[str]:
        """How each actor ended: running, retired (and why), or never or no longer running
        for want of a CPU."""
        states = []
        for i in range(len(self.actors)):
            if i in self.retired:
                states.append(self.retired[i])
            elif self.waiting_since[i] is not None and self.seen[i] is None:
                states.append(f"never ran: waited {now - self.waiting_since[i]:.0f} s for a CPU")
            elif self.waiting_since[i] is not None:
                states.append(f"not running at the end: waited "
                              f"{now - self.waiting_since[i]:.0f} s for a CPU")
            else:
                states.append("running")
        return states

    def env_steps(self) -> int:
        return sum(self.env_steps_each())

    def env_steps_each(self) -> list[int]:
        """Each actor's env steps over all its lives (a lost actor's count stands still)."""
        return [b + s["env_steps"] for b, s in zip(self.base, self.last)]

    # --- the end ---
    def stop(self) -> None:
        for i, actor in enumerate(self.actors):
            if i not in self.retired:
                actor.stop.remote()

    def finish(self, seconds: float) -> dict[int, dict]:
        """The final stats of every actor whose run() returns within `seconds`. Not waited for:
        an actor that never ran and that Ray has given no process (in_a_process), queued for a
        CPU. It has not begun its run(), and waiting on it would take the whole of `seconds`
        in every run that ends with an actor short of a node. One that ran and went silent may
        still answer."""
        import ray

        never_ran = [i for i in self.run_refs.values() if self.seen[i] is None]
        starting = in_a_process(self.actors, never_ran) if never_ran else set()
        refs = [ref for ref, i in self.run_refs.items()
                if self.seen[i] is not None or i in starting]
        ready, _ = (ray.wait(refs, num_returns=len(refs), timeout=seconds) if refs
                    else ([], []))
        finals = {}
        for ref in ready:
            i = self.run_refs.pop(ref)
            stats = get_within(ref, 0)
            if stats is not None:
                self._reported(i, stats, time.monotonic())
                finals[i] = stats
        return finals
