"""A run's record: what the driver heard (events, evaluations, throughput), how the run stopped,
and the TrainingResult that it saves as results.json. The driver's loop (distrl.apex.driver)
writes it; nothing here talks to Ray."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from distrl.ray_runtime import process_age_s
from distrl.rl.config import ApexConfig
from distrl.run_clock import BOOT_ID


@dataclass
class TrainingResult:
    """What a run achieved; saved as results.json in the run's output directory."""

    env_id: str
    reached_target: bool
    target_return: float | None
    time_to_target_s: float | None
    wall_time_s: float
    startup_s: float
    env_steps: int
    learner_updates: int
    transitions_inserted: int
    transitions_sampled: int
    env_steps_per_s: float  # this run's env steps over the time since its first env step
    learner_updates_per_s: float  # this run's updates over the time since its first update
    samples_per_insert: float
    final_eval_return: float | None
    best_eval_return: float | None  # the highest evaluation: of eval_episodes, often a lucky one
    stop_reason: str
    stop_detail: str = ""
    evals: list[dict] = field(default_factory=list)
    actor_epsilons: list[list[float] | None] = field(default_factory=list)  # as each used
    actor_weights_versions: list[int | None] = field(default_factory=list)
    actor_env_steps: list[int] = field(default_factory=list)  # each actor's, all its lives
    # each actor's transitions that replay accepted, its last life's (None: it never reported)
    actor_transitions_sent: list[int | None] = field(default_factory=list)
    actor_restarts: list[int] = field(default_factory=list)
    actor_nodes: list[str | None] = field(default_factory=list)
    actor_states: list[str] = field(default_factory=list)
    cpu_seconds: dict = field(default_factory=dict)
    throughput: list[dict] = field(default_factory=list)
    output_dir: str = ""
    checkpoint: str | None = None
    # the two policies a run hands back: {"latest": the final checkpoint's weights, with the
    # last evaluation (of weights some updates older); "best": the kept best policy (best.npz),
    # with its confirmation's mean over best_eval_episodes new episodes, or None}
    policies: dict = field(default_factory=dict)
    confirmations: list[dict] = field(default_factory=list)  # every candidate played again
    events: list[dict] = field(default_factory=list)
    timeline: dict[str, float] = field(default_factory=dict)
    resumed_from: str | None = None
    # a resumed run's replay from the checkpoint: {"sent": its transitions, "held": how many of
    # them this run's shards held after the load (fewer where they did not fit)}
    replay_loaded: dict = field(default_factory=dict)
    started_at: float | None = None  # wall clock (time.time()) of train()'s start: events' zero
    started_monotonic: float | None = None  # the same on time.monotonic(), of boot boot_id:
    boot_id: str | None = None                # distrl.run_clock compares moments by them
    replay_check: dict = field(default_factory=dict)
    # with telemetry: what each process's OTLP exports came to, {process: [{signal, exported,
    # failed, error}]} (distrl.otel.export_outcomes), read after its last flush
    telemetry_exports: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    weights: list[np.ndarray] | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("weights")
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Written whole or not at all (a rename): a reader never sees half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            partial.write_text(json.dumps(self.to_dict(), indent=2))
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> TrainingResult:
        return cls(**json.loads(Path(path).read_text()))

    def processes(self) -> list[str]:
        """The processes of this run that had something to report, by the name their
        telemetry's service.instance.id starts with: the driver; the learner once it updated;
        the replay once it was sampled; the evaluator once it evaluated; every actor that
        stepped (one that never got a CPU did nothing to report)."""
        names = ["driver"]
        names += ["learner"] if "first update" in self.timeline else []
        names += ["replay"] if self.transitions_sampled > 0 else []
        names += ["evaluator"] if self.evals else []
        return names + [f"actor-{i}" for i, steps in enumerate(self.actor_env_steps) if steps]



def policy_lines(policies: dict) -> list[str]:
    """results.json's two policies in words: which file, which weights, what each scored."""
    lines = []
    if (best := policies.get("best")) is not None:
        lines.append(f"best policy: {best['path'] or 'not written'} (weights of "
                     f"{best['weights_version']:,} updates: {best['mean_return']:.1f} on "
                     f"{best['episodes']} new episodes, {best['evaluated_return']:.1f} on the "
                     "evaluation that made it a candidate"
                     + ("" if best["this_run"] else "; kept by the run this one resumed") + ")")
    if (latest := policies.get("latest")) and latest["path"] is not None:
        scored = ("" if latest["evaluated_return"] is None else
                  f"; the last evaluation, of {latest['evaluated_version']:,} updates: "
                  f"{latest['evaluated_return']:.1f}")
        lines.append(f"latest policy: {latest['path']} (weights of "
                     f"{latest['weights_version']:,} updates{scored})")
    return lines


class RunRecord:
    """What one run has heard, on its own clock (seconds since train() began), and how it says
    it: a line in the job's log for each event, above the progress bar where there is one."""

    def __init__(self, config: ApexConfig, t_start: float, output_dir: Path,
                 marks: dict[str, float], resume_path: str | None = None,
                 resumed: dict | None = None):
        self.config, self.t_start, self.output_dir = config, t_start, Path(output_dir)
        self.marks = marks  # train()'s start-up milestones, for the timeline
        self.resume_path, self.resumed = resume_path, resumed  # the checkpoint's path and meta
        self.replay_loaded: dict = {}  # driver.load_replay's counts
        before = (resumed or {}).get("progress", {})  # what the resumed run had done
        self.steps_before = before.get("env_steps", 0)
        self.seconds_before = before.get("train_s", 0.0)
        self.events: list[dict] = []
        if resume_path is not None:
            self.add(0.0, "resumed", resume_path)
        self.evals: list[dict] = []
        self.confirmations: list[dict] = []  # candidates for the best policy, played again
        self.best: dict | None = None  # the kept one's confirmation
        self.throughput: list[dict] = []
        self.stop_reason, self.stop_detail = "", ""
        self.time_to_target = None
        self.startup_s = None  # when the first transition reached replay
        self.driver_cpu_start = time.process_time()
        self.bar = None  # the loop's progress bar, once the loop runs

    def add(self, time_s: float, kind: str, detail: str) -> None:
        """An event heard of afterwards, at its own time (not said in the log)."""
        self.events.append({"time_s": time_s, "kind": kind, "detail": detail})

    def say(self, kind: str, detail: str, print_it: bool = True) -> None:
        self.add(time.monotonic() - self.t_start, kind, detail)
        if not print_it:
            return
        line = f"[distrl] {self.config.env_id}: {detail}"  # which run, where runs share a log
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line)  # above the bar, which redraws below it
        else:
            print(line)
        # Flushed: a job's log (a pipe, a file) is read while the run goes on, and Python
        # buffers a pipe unless PYTHONUNBUFFERED is set; tqdm.write does not flush.
        sys.stdout.flush()

    def stop(self, reason: str, detail: str) -> None:
        if not self.stop_reason:
            self.stop_reason, self.stop_detail = reason, detail

    def add_learner_events(self, learner_final: dict | None) -> None:
        """The learner's own events (checkpoints, holds), on the run's clock, in order."""
        for event in (learner_final or {}).get("events", []):
            self.add(self.since_start(event["time"]), event["kind"], event["detail"])
        self.events.sort(key=lambda e: e["time_s"])

    def stopped_before_start(self, reason: str, detail: str) -> TrainingResult:
        self.stop(reason, detail)
        self.say("stop", detail)
        n = self.config.num_actors
        return self.result(None, None, dict(
            env_steps=self.steps_before, learner_updates=(self.resumed or {}).get("updates", 0),
            transitions_inserted=0, transitions_sampled=0, checkpoint=None, weights=None,
            replay_check={"ok": True, "problems": [], "size": 0, "inserted": 0, "shards": 0},
            cpu_seconds={"driver": time.process_time() - self.driver_cpu_start},
            actor_weights_versions=[None] * n, actor_epsilons=[None] * n,
            actor_env_steps=[0] * n, actor_restarts=[0] * n, actor_nodes=[None] * n,
            actor_states=["never created"] * n, actor_transitions_sent=[]))

    def since_start(self, wall_clock: float | None) -> float | None:
        """Seconds since train() began of a time.time() stamp from a worker's own clock."""
        if wall_clock is None:
            return None
        return wall_clock - (time.time() - (time.monotonic() - self.t_start))

    def timeline(self, first_step_time: float | None, learner_stats: dict | None
                 ) -> dict[str, float]:
        """When each start-up milestone came, in seconds since this process started (the
        interpreter, imports and all), in the order they came; milestones never reached are
        left out."""
        since_process = process_age_s()
        offset = since_process - (time.monotonic() - self.t_start)  # process start -> train()
        actor_running = next((e["time_s"] for e in self.events if e["kind"] == "actor_running"),
                             None)
        # The actors' first env step, the learner's readiness and first update come from their
        # own clocks (wall-clock: they may be on other machines, within their clocks' sync): the
        # driver sees each up to one REPORT_INTERVAL_S and a call later, and the first
        # transition in replay comes a block and a trip to replay after the first env step.
        learner = learner_stats or {}
        marks = {**self.marks, "first actor running": actor_running,
                 "first env step": self.since_start(first_step_time),
                 "first transition": self.startup_s,
                 "learner running": self.since_start(learner.get("ready_time")),
                 "first update": self.since_start(learner.get("first_update_time")),
                 "first evaluation": self.evals[0]["time_s"] if self.evals else None,
                 "target": self.time_to_target}
        reached = sorted((t, name) for name, t in marks.items() if t is not None)
        return {"process start": 0.0} | {name: round(offset + t, 3) for t, name in reached}

    def policies(self, ended: dict) -> dict:
        """The latest policy (the final checkpoint) and the kept best one, each with its
        return: results.json's `policies`."""
        last = self.evals[-1] if self.evals else {}
        best = self.best
        return {"latest": {"path": ended["checkpoint"], "weights_version": ended["learner_updates"],
                           "evaluated_return": last.get("mean_return"),
                           "evaluated_version": last.get("weights_version")},
                "best": None if best is None else {
                    "path": best["path"], "weights_version": best["weights_version"],
                    "mean_return": best["mean_return"], "std": best["std"],
                    "episodes": best["episodes"], "evaluated_return": best["evaluated_return"],
                    "this_run": best["this_run"]}}  # False: kept by the run it resumed

    def result(self, first_step_time: float | None, learner_stats: dict | None,
               ended: dict) -> TrainingResult:
        """The run's TrainingResult, saved: `ended` holds what the processes reported as it
        ended, under TrainingResult's own field names; the rest is the driver's record."""
        c = self.config
        now, wall = time.time(), time.monotonic() - self.t_start
        updates_this_run = ended["learner_updates"] - (self.resumed or {}).get("updates", 0)

        def per_second(count: float, since: float | None) -> float:
            """count over the time from a milestone (before which there was none) to the end;
            0 where the milestone never came. Clamped to the run: workers' clocks may differ."""
            if since is None or count <= 0:
                return 0.0
            return count / min(wall, max(wall - since, 1e-3))

        first_step = self.since_start(first_step_time)
        first_update = self.since_start((learner_stats or {}).get("first_update_time"))
        result = TrainingResult(
            env_id=c.env_id, reached_target=self.time_to_target is not None,
            target_return=c.target_return, time_to_target_s=self.time_to_target,
            wall_time_s=wall, startup_s=self.startup_s or wall,
            env_steps_per_s=per_second(ended["env_steps"] - self.steps_before, first_step),
            learner_updates_per_s=per_second(updates_this_run, first_update),
            samples_per_insert=ended["transitions_sampled"] / max(ended["transitions_inserted"], 1),
            final_eval_return=self.evals[-1]["mean_return"] if self.evals else None,
            best_eval_return=max((e["mean_return"] for e in self.evals), default=None),
            stop_reason=self.stop_reason, stop_detail=self.stop_detail, evals=self.evals,
            throughput=self.throughput, output_dir=str(self.output_dir),
            events=self.events, timeline=self.timeline(first_step_time, learner_stats),
            resumed_from=self.resume_path, replay_loaded=self.replay_loaded,
            policies=self.policies(ended), confirmations=self.confirmations,
            started_at=now - wall, started_monotonic=self.t_start, boot_id=BOOT_ID,
            config=c.to_dict(), **ended)
        result.save(self.output_dir / "results.json")
        return result

