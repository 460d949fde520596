"""hold_learner_within: stop the learner, for good, at the first weights that score within a
window on the episodes a run resumed from them plays first. A run stopped then (notebook 04's
drain) leaves a checkpoint from mid-learning, on any machine, on evidence rather than at a count
of updates.

CartPole's greedy return can leap by hundreds within a few hundred updates, past any window
between two periodic evaluations. So from its first report on, the learner pauses every
CHECK_EVERY updates while its weights are evaluated: below the window it trains on, within it
it holds, and above it (the run passed the window, no longer mid-learning) it trains on freely.

    hold = LearnerHold((150, 450), say)
    hold.reported(learner_stats, topology)  # the first: it pauses; once paused -> check_ref
    hold.checked(check, learner)            # below -> pause again in CHECK_EVERY updates
                                            # (CHECK_NEAR from half the window's low end);
                                            # within -> held for good; above -> passed
"""

from __future__ import annotations

from collections.abc import Callable

# Learner updates between two checks: CartPole once leapt 75 -> 403 in 100 updates, and in a
# clean room's notebook 04 past the whole window [150, 450) within 50. Once a check scores half
# the window's low end, the checks come closer.
CHECK_EVERY, CHECK_NEAR = 50, 10


class LearnerHold:
    """The driver's side of a hold: None (no report yet), pausing (asked; the learner will
    pause), checking (its paused weights, evaluated on the first evaluation's episodes), held,
    or passed (weights scored above the window first: no hold in this run)."""

    def __init__(self, window: tuple[float, float], say: Callable[[str, str], None]):
        self.low, self.high = window
        self.say = say
        self.state: str | None = None
        self.version: int | None = None  # the paused weights' update count, last checked
        self.check_ref = None            # the paused weights' evaluation, in flight
        self.checks = 0

    @property
    def window(self) -> str:
        return f"[{self.low:g}, {self.high:g})"

    def reported(self, stats: dict, topology) -> None:
        """The learner's stats: its first report starts the search (it pauses before any
        update); once it pauses at new weights, they go to the evaluator, on the first
        evaluation's episodes (which a run resumed from them plays first too)."""
        if self.state is None:
            topology.learner.hold.remote()
            self.state = "pausing"
            self.say("hold_asked", f"the learner pauses every {CHECK_EVERY} updates until its "
                     f"weights score within {self.window} on the first evaluation's episodes")
            return
        held_at = stats.get("held_at")
        if self.state == "pausing" and held_at is not None and (
                self.version is None or held_at > self.version):
            self.state, self.version = "checking", held_at
            self.check_ref = topology.evaluator.evaluate.remote(
                topology.learner.get_weights.remote(-1), first_episodes=True)

    def checked(self, check: dict | None, learner) -> None:
        """The paused weights' own evaluation: below the window, train CHECK_EVERY updates
        more; within it, held for good; above it, or none (the evaluator failed), go on free."""
        self.check_ref = None
        self.checks += 1
        score = float("nan") if check is None else check["mean_return"]
        if self.low <= score < self.high:
            self.state = "held"
            self.say("learner_held", f"learner held at {self.version:,} updates: its weights "
                     f"score {score:.1f}, within {self.window} (check {self.checks}); it trains "
                     "no more until the run stops")
        elif score < self.low:
            learner.release.remote(after=CHECK_NEAR if score >= self.low / 2 else CHECK_EVERY)
            self.state = "pausing"
        else:
            learner.release.remote()
            self.state = "passed"
            self.say("hold_missed", f"the weights of {self.version:,} updates scored "
                     f"{score:.1f}, not within {self.window}: the learner trains on, no hold")
