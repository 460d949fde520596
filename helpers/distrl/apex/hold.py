"""hold_learner_within: hold the learner once a greedy evaluation scores within a window, keep
the hold only if the held weights score within it too, on the episodes a run resumed from them
plays first. A run stopped then (notebook 04's drain) leaves a checkpoint from mid-learning,
on any machine, on evidence rather than at a count of updates.

    hold = LearnerHold((200, 400), say)
    hold.evaluated(evaluation, learner)     # each evaluation: within the window -> hold()
    hold.reported(learner_stats, topology)  # the learner holds -> check_ref, its evaluation
    hold.checked(check, learner)            # within -> held for good; outside -> release()
"""

from __future__ import annotations

from collections.abc import Callable


class LearnerHold:
    """The driver's side of a hold: asked, checking (the held weights, evaluated again on the
    first evaluation's episodes) or held; released back to None when the check falls outside."""

    def __init__(self, window: tuple[float, float], say: Callable[[str, str], None]):
        self.low, self.high = window
        self.say = say
        self.state: str | None = None
        self.version: int | None = None  # the held weights' update count
        self.check_ref = None            # the held weights' evaluation, in flight

    @property
    def window(self) -> str:
        return f"[{self.low:g}, {self.high:g})"

    def evaluated(self, ev: dict, learner) -> None:
        """An evaluation within the window asks the learner to hold (once at a time)."""
        if self.state is None and self.low <= ev["mean_return"] < self.high:
            learner.hold.remote()
            self.state = "asked"
            self.say("hold_asked", f"mean return {ev['mean_return']:.1f} within {self.window}: "
                     "the learner holds, and its held weights are evaluated")

    def reported(self, stats: dict, topology) -> None:
        """The learner's stats: once it holds, its weights go to the evaluator, on the first
        evaluation's episodes (which a run resumed from them plays first too)."""
        if self.state == "asked" and stats.get("held_at") is not None:
            self.state, self.version = "checking", stats["held_at"]
            self.check_ref = topology.evaluator.evaluate.remote(
                topology.learner.get_weights.remote(-1), first_episodes=True)

    def checked(self, check: dict | None, learner) -> None:
        """The held weights' own evaluation: within the window keeps the hold; outside it, or
        none (the evaluator failed), releases the learner."""
        self.check_ref = None
        score = float("nan") if check is None else check["mean_return"]
        if self.low <= score < self.high:
            self.state = "held"
            self.say("learner_held", f"learner held at {self.version:,} updates: its weights "
                     f"score {score:.1f}, within {self.window}; it trains no more until the "
                     "run stops")
        else:
            learner.release.remote()
            self.state = None
            self.say("hold_released", f"the held weights scored {score:.1f}, outside "
                     f"{self.window}: training goes on")
