"""Ape-X on Ray: the driver. It creates the processes, follows them, and decides when to stop.

    result = ApeX(ApexConfig(env_id="CartPole-v1", num_actors=2)).train()

The data flows (none of them through the driver; the processes are in distrl.apex.workers):

    actors --blocks of n-step transitions + priorities--> replay
    replay --prioritized batches (prefetched)-----------> learner
    learner --new priorities----------------------------> replay
    learner --versioned weights (pulled)----------------> actors, evaluator

The driver's loop waits with `ray.wait` on whatever it has asked and not yet heard back (the
actors' and learner's stats, an evaluation, each process's run()), asks again every
REPORT_INTERVAL_S, and never waits without a deadline: start-up counts against max_seconds, and
SIGTERM ends the run at any moment with a final checkpoint (if the learner exists) and
results.json (always). What the loop hears, and the results it saves, are the run's RunRecord
(distrl.apex.record).

Nodes come and go (distrl.apex.faults): the processes are created at once, so actors that no node
can host yet are the demand an autoscaler reacts to; training starts as soon as the learner and
one actor run, and the others join as nodes arrive. A lost actor is restarted by Ray wherever a
CPU is free, and the run goes on with fewer actors meanwhile. If no actor runs for actor_wait_s
the run ends ("no_actors"), and so it does if the learner does not run for learner_wait_s
("no_learner"). A lost learner or replay ends the run; `resume="auto"` continues from the
newest checkpoint. With replay_shards > 1 several replay processes share the work."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from distrl.apex.faults import (
    ActorFleet,
    Deadline,
    StopFlag,
    catch_sigterm,
    cause,
    get_within,
    in_a_process,
    ray_keeps_our_sigterm_handler,
    restore_sigterm,
)
from distrl.apex.hold import LearnerHold
from distrl.apex.process_telemetry import IterationTraces, ProcessTelemetry
from distrl.apex.record import RunRecord, TrainingResult
from distrl.apex.workers import ActorWorker, EvaluatorWorker, LearnerWorker, ReplayWorker
from distrl.otel.export_outcomes import refusals
from distrl.ray_runtime import (
    DASHBOARD_FAILURES,
    StartInterrupted,
    init_local_ray,
    join_ray,
    node_groups,
    shutdown_ray,
)
from distrl.rl.checkpoints import check_checkpoint_network, find_resume, replay_blocks
from distrl.rl.config import ApexConfig
from distrl.rl.envs import network_for
from distrl.rl.network import NetworkSpec, init_weights
from distrl.rl.replay import merged_check

REPORT_INTERVAL_S = 0.25   # the driver asks for stats this often (one trace per interval)
WAITING_REPORT_S = 10.0    # how often it says which actors, or the learner, still do not run
REPLAY_LOAD_S = 120.0      # a resumed run's replay shards loading the checkpoint's sample
SHUTDOWN_S = 20.0          # the whole stop sequence, inside a Spot VM's ~30 s notice


# --------------------------------------------------------------------------- the topology


@dataclass
class Topology:
    """The processes of one run (Ray actor handles)."""

    replays: list
    learner: object
    actors: list
    evaluator_options: dict  # Ray's .options() for the evaluator, made by start_evaluator()
    policy_dir: str | None = None  # where the evaluator writes the kept best policy
    resumed_from: str | None = None  # the checkpoint resumed from: an earlier best beside it
    evaluator: object = None

    def all(self) -> list:
        return [*self.replays, self.learner, *self.actors,
                *([self.evaluator] if self.evaluator is not None else [])]

    def start_evaluator(self, ray, c: ApexConfig) -> None:
        """The greedy evaluator, created once the learner runs: it has nothing to do before the
        first update. Created with the others, it would be a fifth process starting in the same
        second as the actors and the learner, taking the CPU they need for their first env
        step (`python benchmarks/time_to_solve.py --no-baseline` measures when it comes)."""
        self.evaluator = ray.remote(EvaluatorWorker).options(**self.evaluator_options).remote(
            c, self.policy_dir, self.resumed_from)
        self.evaluator.set_learner.remote(self.learner)


def create_topology(ray, c: ApexConfig, plan: dict, spec: NetworkSpec, weights,
                    output_dir: str, checkpoint_dir: str, resume_path: str | None) -> Topology:
    """Who runs where. Replay, learner and evaluator (created once the learner runs:
    Topology.start_evaluator) beside the driver (on GKE: the head, never Spot); the learner
    goes elsewhere only if this node cannot give it its CPUs or GPU. Actors spread over the
    cluster, and Ray restarts one whose process or node is lost. Nothing here waits: an actor
    that no node can host yet is pending, which is what an autoscaler sees."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    here = NodeAffinitySchedulingStrategy(node, soft=False)
    near = NodeAffinitySchedulingStrategy(node, soft=True)
    shard_config, error_buffer = replay_settings(c)
    # Actors find the replay and the learner by name (a restarted actor too); the names are
    # unique to this topology, so a second run in the same Ray session never meets them.
    prefix = f"distrl-{uuid.uuid4().hex[:12]}"
    replay_names = [f"{prefix}-replay-{s}" for s in range(c.replay_shards)]
    replays = [ray.remote(ReplayWorker).options(
        name=name, max_concurrency=c.num_actors + 8, scheduling_strategy=here,
        **plan["replay"]).remote(shard_config.replace(seed=c.seed + 1000 * s), spec,
                                 error_buffer)
        for s, name in enumerate(replay_names)]
    learner = ray.remote(LearnerWorker).options(
        name=f"{prefix}-learner", max_concurrency=c.num_actors + 8, scheduling_strategy=near,
        **plan["learner"]).remote(c, spec, weights, replays, output_dir, checkpoint_dir,
                                  resume_path)
    actors = [ray.remote(ActorWorker).options(
        max_concurrency=4, max_restarts=c.max_actor_restarts, scheduling_strategy="SPREAD",
        **plan["actor"]).remote(c, i, spec, replay_names[i % c.replay_shards], f"{prefix}-learner")
        for i in range(c.num_actors)]
    for r in replays:  # who to ask for a checkpoint on SIGTERM
        r.set_learner.remote(learner)
    return Topology(replays, learner, actors,
                    evaluator_options={"scheduling_strategy": here, **plan["evaluator"]},
                    policy_dir=checkpoint_dir, resumed_from=resume_path)


def load_replay(ray, replays: list, blocks: list, record: RunRecord) -> None:
    """A resumed run's replay: the checkpoint's sample of each shard that wrote it, dealt to
    this run's shards in turn (their number may differ), before the learner samples. Without
    it the learner trains on new play alone, and fell far below its checkpoint's score on the
    way back (benchmarks/resume_head_start.py)."""
    if not blocks:
        record.say("replay", "the checkpoint holds no replay: the learner trains on new play")
        return
    from ray.exceptions import GetTimeoutError

    refs = [replays[k % len(replays)].load.remote(block) for k, block in enumerate(blocks)]
    sent = sum(map(len, blocks))
    try:
        held = sum(ray.get(refs, timeout=REPLAY_LOAD_S))  # what the shards say they hold
    except GetTimeoutError:
        raise RuntimeError(f"the replay shards did not load the checkpoint's {sent:,} "
                           f"transitions within {REPLAY_LOAD_S:g} s") from None
    record.replay_loaded = {"sent": sent, "held": held}
    record.say("replay", f"replay loaded {held:,} transitions from the checkpoint into "
                         f"{len(replays)} shard(s)" + (f" (of {sent:,}: the rest did not fit)"
                                                       if held < sent else ""))


def replay_settings(c: ApexConfig) -> tuple[ApexConfig, float]:
    """Each shard's config (its share of capacity and warm-up) and its rate limiter's slack,
    which must still fit one actor block and the learner's fetches in flight."""
    shards = c.replay_shards
    capacity = None if c.replay_capacity is None else c.replay_capacity // shards
    shard_config = c.replace(replay_capacity=capacity,
                             min_replay_size=-(-c.min_replay_size // shards))
    error_buffer = max(shard_config.min_replay_size * c.samples_per_insert
                       * c.samples_per_insert_tolerance,
                       c.samples_per_insert * c.envs_per_actor * c.actor_block_steps
                       + c.batch_size * c.batches_per_fetch * c.fetches_in_flight)
    return shard_config, error_buffer


# --------------------------------------------------------------------------- the driver


class ApeX:
    """Runs one Ape-X training on a Ray cluster: the one this process is connected to, the one
    RAY_ADDRESS names (a Ray job), or else a new local one."""

    def __init__(self, config: ApexConfig | None = None, **overrides):
        if config is None:
            config = ApexConfig(**overrides)
        elif overrides:
            config = config.replace(**overrides)
        if not isinstance(config, ApexConfig):
            raise TypeError(f"config must be an ApexConfig, got {type(config).__name__}")
        self.config = config
        # The network for this environment: an unusable one is refused before any process starts.
        self.spec = network_for(config)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.output_dir = Path(config.output_dir or f"runs/{config.env_id}-{stamp}")
        _check_output_dir(self.output_dir)
        # The checkpoint to resume from, read and checked against this network before any
        # process starts.
        self.resume = None
        if config.resume is not None:
            self.resume = find_resume(config.resume, config.checkpoint_dir
                                      or str(self.output_dir / "checkpoints"))
            check_checkpoint_network(self.resume.arrays, self.spec, self.resume.path)
        if config.run_id is None:  # every process labels its telemetry with the same id
            self.config = config = config.replace(
                run_id=f"{config.env_id}-{stamp}-{uuid.uuid4().hex[:6]}")
        self.sigterm = StopFlag()
        self.marks: dict[str, float] = {}  # start-up milestones of train(), for the timeline
        self.topology: Topology | None = None  # its processes, once train() has made them

    def resource_plan(self, cluster_cpus: float, autoscaling: bool = False) -> dict:
        """What each Ray actor asks for. Without actor_cpus, actors share what the learner
        leaves of a fixed cluster, or take one CPU each where nodes come on demand."""
        c = self.config
        actor_cpus = c.actor_cpus
        if actor_cpus is None and autoscaling:
            actor_cpus = 1.0
        elif actor_cpus is None:
            actor_cpus = max(cluster_cpus - c.learner_cpus, 0.01 * c.num_actors) / c.num_actors
            actor_cpus = max(0.01, round(actor_cpus - 0.005, 2))  # round down: it must fit
        return {"learner": {"num_cpus": c.learner_cpus, "num_gpus": c.num_gpus},
                "actor": {"num_cpus": actor_cpus}, "replay": {"num_cpus": 0},
                "evaluator": {"num_cpus": 0}}

    def check_cluster(self, ray) -> dict:
        """The resource plan, once the cluster could host it. Refuses, after waiting up to
        resource_timeout_s for nodes that are still joining, only what no node could ever host:
        a GPU or CPUs no node (nor node group of an autoscaler) offers, or, on a fixed-size
        cluster, more CPUs than it has."""
        c = self.config
        deadline = Deadline(c.resource_timeout_s)
        while True:
            nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
            groups = node_groups()
            autoscaling = c.autoscaling if c.autoscaling is not None else any(
                g["max_count"] == -1 or g["max_count"] > g["min_count"] for g in groups)
            have_cpu = sum(n.get("CPU", 0.0) for n in nodes)
            plan = self.resource_plan(have_cpu, autoscaling)
            problems = self.cannot_host(plan, nodes, groups, autoscaling, have_cpu)
            if not problems or self.sigterm.is_set():
                return plan
            if deadline.passed():
                raise RuntimeError(f"the Ray cluster cannot host this run after waiting "
                                   f"{c.resource_timeout_s:g}s: it asks for "
                                   + "; and ".join(problems))
            self.sigterm.wait(0.5)

    def cannot_host(self, plan: dict, nodes: list[dict], groups: list[dict], autoscaling: bool,
                    have_cpu: float) -> list[str]:
        """Why the cluster (its live nodes, and the node groups an autoscaler may add) could
        never host the plan; [] when it could."""
        c = self.config
        shapes = nodes + [g["resources"] for g in groups if g["max_count"] != 0]
        most_gpus = max((s.get("GPU", 0.0) for s in shapes), default=0.0)
        most_cpus = max((s.get("CPU", 0.0) for s in shapes), default=0.0)
        actor_cpus = plan["actor"]["num_cpus"]
        problems = []
        if c.num_gpus > most_gpus + 1e-9:
            problems.append(f"num_gpus={c.num_gpus:g} for the learner but the cluster has "
                            f"{sum(n.get('GPU', 0.0) for n in nodes):g} GPU(s) and no node type "
                            "with one; use num_gpus=0 to train on the CPU or connect to a "
                            "cluster with a GPU node")
        # Where nodes come on demand but their shapes are unknown, any size may still come.
        if not autoscaling or groups:
            for role, cpus in (("learner_cpus", c.learner_cpus), ("actor_cpus", actor_cpus)):
                if cpus > most_cpus + 1e-9:
                    problems.append(f"{role}={cpus:g} but the largest node offers "
                                    f"{most_cpus:g} CPUs")
        need_cpu = c.learner_cpus + c.num_actors * actor_cpus
        if not autoscaling and need_cpu > have_cpu + 1e-9:
            problems.append(f"{need_cpu:g} CPUs (learner_cpus={c.learner_cpus:g} + num_actors="
                            f"{c.num_actors} x actor_cpus={actor_cpus:g}) but the cluster has "
                            f"{have_cpu:g}; lower num_actors or actor_cpus, or set "
                            "autoscaling=True if nodes join on demand")
        return problems

    def train(self, sigterm: StopFlag | None = None) -> TrainingResult:
        """Run to a stop. `sigterm`: a flag that a SIGTERM caught earlier may have set (or that
        another thread sets to stop the run as SIGTERM would)."""
        import ray

        t_start = time.monotonic()
        self.marks = {"train() called": 0.0}  # seconds since t_start, for the timeline
        self.startup_notes: list[str] = []  # what went wrong but did not stop the start
        self.sigterm = sigterm or StopFlag()
        previous = catch_sigterm(self.sigterm)
        # Quiet TensorFlow in every worker this driver starts (workers inherit the environment).
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        started_ray = not ray.is_initialized()
        try:
            if started_ray:
                self._init_ray(ray)
            self.marks["Ray up"] = time.monotonic() - t_start
            plan = None if self.sigterm.is_set() else self.check_cluster(ray)
            return self._train(ray, plan, t_start)
        finally:
            restore_sigterm(previous)
            if started_ray:
                shutdown_ray()

    def _init_ray(self, ray) -> None:
        """A Ray job's driver has RAY_ADDRESS; anything else gets a fresh local Ray, never a
        cluster that an old `ray start` recorded and that may be dead or someone else's.
        SIGTERM meanwhile sets self.sigterm (Ray's own handler is kept out: StopFlag says why),
        and a local start gives up at its next wait once it is set."""
        import signal

        notes_before = len(DASHBOARD_FAILURES.notes)
        options = dict(include_dashboard=False, logging_level="warning", log_to_driver=True)
        try:
            with ray_keeps_our_sigterm_handler():
                if os.environ.get("RAY_ADDRESS"):
                    join_ray(os.environ["RAY_ADDRESS"], **options)
                else:
                    init_local_ray(stop=self.sigterm.is_set, **options)
        except StartInterrupted:
            pass  # self.sigterm is set; what the start had begun is stopped
        except SystemExit as e:  # Ray's own handler, where it could not be kept out
            if e.code != signal.SIGTERM:
                raise
            self.sigterm.set()
        catch_sigterm(self.sigterm)
        self.startup_notes += DASHBOARD_FAILURES.notes[notes_before:]

    def _train(self, ray, plan: dict | None, t_start: float) -> TrainingResult:
        c = self.config
        self.output_dir.mkdir(parents=True, exist_ok=True)
        checkpoint_dir = c.checkpoint_dir or str(self.output_dir / "checkpoints")
        weights = init_weights(self.spec, c.seed)  # what first-life actors compute themselves
        resume_path, resumed = None, None
        if self.resume is not None:
            resume_path, resumed = self.resume.path, self.resume.meta
            weights = [self.resume.arrays[f"online_{i}"] for i in range(len(weights))]
        record = RunRecord(c, t_start, self.output_dir, self.marks, resume_path, resumed)
        for note in self.startup_notes:
            record.add(self.marks.get("Ray up", 0.0), "ray", note)
        for skipped in self.resume.skipped if self.resume else []:
            record.add(0.0, "checkpoint skipped", skipped)
        if self.sigterm.is_set() or plan is None:  # nothing created yet: nothing to stop
            return record.stopped_before_start("sigterm", "SIGTERM during start-up")
        topology = create_topology(ray, c, plan, self.spec, weights,
                                   str(self.output_dir), checkpoint_dir, resume_path)
        self.marks["processes created"] = time.monotonic() - t_start
        self.topology = topology  # the run's Ray actors, for a reader (or a fault) to reach
        try:
            if self.resume is not None:
                load_replay(ray, topology.replays, replay_blocks(self.resume.arrays), record)
            return _Run(self, ray, record, topology,
                        weights if resumed is not None else None).drive()
        finally:
            for w in topology.all():
                ray.kill(w, no_restart=True)

    def lost(self, role: str, error: BaseException) -> RuntimeError:
        if "error raised in its creation task" in str(error):  # Ray's words: __init__ raised
            return RuntimeError(f"the {role} process could not start: {cause(error)}")
        where = self.config.checkpoint_dir or self.output_dir / "checkpoints"
        return RuntimeError(f"the {role} process was lost ({cause(error)}), and the run with "
                            f"it; the last checkpoint is in {where}: resubmit with "
                            "--resume auto to continue")


def _check_output_dir(path: Path) -> None:
    """A run's output directory exists (made here) and takes files, before anything starts."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"output_dir={str(path)!r} is a file; expected a directory (made if "
                         "missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(f"output_dir={str(path)!r} cannot be written: {err.strerror}") from None
    results = path / "results.json"  # written at the end: a run would lose it there
    if results.exists() and not results.is_file():
        raise ValueError(f"output_dir={str(path)!r} holds a results.json that is not a file; "
                         "the run writes its results there: remove it or choose another "
                         "output_dir")


class _Run:
    """One run's driver loop: the processes it follows, what it has asked them and not yet
    heard back, and a handler for each kind of reply. What it hears goes to its RunRecord."""

    def __init__(self, apex: ApeX, ray, record: RunRecord, topology: Topology, resumed_weights):
        self.apex, self.ray, self.config, self.record = apex, ray, apex.config, record
        self.topology, c, now = topology, apex.config, time.monotonic()
        self.deadline = Deadline(None if c.max_seconds is None
                                 else c.max_seconds - (now - record.t_start))
        self.fleet = ActorFleet(topology.actors, now)
        self.learner_run = None  # run()'s reply, asked for as the loop starts
        self.learner_since = now  # when the learner was created, or the loop started
        self.learner_final: dict = {}  # what run() returned, once it has ended on its own
        self.learner_stats: dict | None = None  # the learner's last stats
        self.said_first_update = False
        self.learner_ref = None  # stats asked for and not yet heard, as each below
        self.replay_refs: dict = {}
        self.replay_stats: dict[int, dict] = {}
        self.eval_ref, self.last_eval = None, now
        self.confirm_ref = None  # the evaluator's confirmation of a candidate best policy
        self.next_waiting_report = now + WAITING_REPORT_S
        window = c.hold_learner_within
        self.hold = LearnerHold(window, record.say) if window else None
        self.resumed_weights = resumed_weights  # a resumed run's checkpoint: its first evaluation
        # That first evaluation is the run's baseline: it shows where training resumes and
        # stops nothing (a resumed run trains on, even from a checkpoint at its target).
        self.baseline_pending = False
        self.tel = ProcessTelemetry(c, "driver", apex.spec)
        self.traces = IterationTraces(self.tel, c)

    # --- the loop ---
    def drive(self) -> TrainingResult:
        # Text, not a notebook widget: a widget saved by papermill (or opened without its
        # frontend) shows a stale state, while a text line ends on the last figures.
        from tqdm import tqdm

        ray, c = self.ray, self.config
        self.fleet.start()
        self.learner_run = self.topology.learner.run.remote()
        self.learner_since = now = time.monotonic()
        self.record.say("start", f"{c.num_actors} actor{'s' * (c.num_actors != 1)}, learner "
                        f"and {c.replay_shards} replay shard(s) created; training starts once "
                        "the learner and one actor run")
        self.record.bar = tqdm(total=c.max_env_steps, unit="step", disable=not c.progress,
                               desc=f"Ape-X {c.env_id}", dynamic_ncols=True, mininterval=1.0)
        next_tick = now
        try:
            while not self.record.stop_reason:
                now = time.monotonic()
                if now >= next_tick:
                    self.tick(now)
                    next_tick = now + REPORT_INTERVAL_S
                    continue
                outstanding = self.outstanding()
                if outstanding:  # whatever comes first, then all that has come with it
                    ready, rest = ray.wait(outstanding, num_returns=1, timeout=next_tick - now)
                    if ready and rest:
                        ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
                else:
                    ready = []
                    self.apex.sigterm.wait(next_tick - now)
                for ref in ready:
                    self.handle(ref)
        except KeyboardInterrupt:
            self.record.stop("interrupted", "interrupted (Ctrl-C)")
        finally:  # (on an error the bar is closed as it is collected)
            self.traces.end()
        if self.record.stop_detail:
            self.record.say("stop", self.record.stop_detail)
        try:
            result = self.finish()
            # the actors' final counts, as the results say
            self.record.bar.update(result.env_steps - self.record.bar.n)
        finally:
            self.record.bar.close()
        return result

    def outstanding(self) -> list:
        refs = [*self.fleet.outstanding(), *self.replay_refs]
        hold = self.hold.check_ref if self.hold else None
        return refs + [r for r in (self.learner_run, self.learner_ref, self.eval_ref,
                                   self.confirm_ref, hold) if r is not None]

    def tick(self, now: float) -> None:
        """Every REPORT_INTERVAL_S: ask for fresh stats, record progress, check the stops."""
        for kind, detail in self.fleet.tick(now):
            self.record.say(kind, detail)
            if kind == "steady" and self.config.learn_after_recovery and any(self.fleet.restarts):
                self._start_learning()
        self._ask_for_stats()
        env_steps = self.record.steps_before + self.fleet.env_steps()
        learner = self.learner_stats or {}
        updates = learner.get("updates", 0)
        self._note_learner(now, learner, env_steps)
        self._record_throughput(now, env_steps, updates)
        # The stops come after the record, so that the run's last state is in the throughput.
        self._check_stops(now, env_steps, updates)

    def _start_learning(self) -> None:
        """learn_after_recovery: the fleet is whole and steady again after a loss. Said once;
        the replay's last polled size, not a wait inside the driver's loop."""
        if any(e["kind"] == "learning_starts" for e in self.record.events):
            return
        for replay in self.topology.replays:
            replay.start_sampling.remote()
        size = sum(s.get("size", 0) for s in self.replay_stats.values())
        self.record.say("learning_starts", f"the fleet recovered from the loss: learning starts, "
                        f"with {size:,} transitions in replay, not "
                        f"{self.config.min_replay_size:,}")

    def _ask_for_stats(self) -> None:
        """Every process's stats, asked for once at a time (a new iteration's trace)."""
        t = self.topology
        carrier = self.traces.next_iteration()
        self.fleet.ask(carrier)
        if self.learner_ref is None:
            self.learner_ref = t.learner.stats.remote(trace_context=carrier)
        asked = set(self.replay_refs.values())
        self.replay_refs |= {r.stats.remote(): s for s, r in enumerate(t.replays)
                             if s not in asked}

    def _note_learner(self, now: float, learner: dict, env_steps: int) -> None:
        """The learner's first update, said once; its stats to the hold; the progress to it."""
        if self.hold is not None:
            self.hold.reported(learner, self.topology)
        # This process's first update (a resumed learner's count starts above 0 before it).
        if not self.said_first_update and learner.get("first_update_time") is not None:
            self.said_first_update = True
            # its own stamp, not when it was heard
            at = self.record.since_start(learner["first_update_time"])
            self.record.say("first_update", f"first learner update {at:.1f} s after start: "
                            "training")
        if self.learner_stats is not None:
            self.topology.learner.note_progress.remote(
                {"env_steps": env_steps,
                 "train_s": self.record.seconds_before + now - self.record.t_start})

    def _record_throughput(self, now: float, env_steps: int, updates: int) -> None:
        replays = self.replay_stats.values()
        inserted = sum(s["inserted"] for s in replays)
        if self.record.startup_s is None and inserted > 0:
            self.record.startup_s = now - self.record.t_start
        self.record.throughput.append({
            "time_s": now - self.record.t_start, "env_steps": env_steps, "learner_updates": updates,
            "inserted": inserted, "replay_size": sum(s["size"] for s in replays),
            # the rate limiter's waits so far: actors held back (summed over actors), the
            # learner kept waiting for data
            "actors_waited_s": sum(s["insert_wait_s"] for s in replays),
            "learner_waited_s": sum(s["sample_wait_s"] for s in replays),
            "actors_running": self.fleet.running(), "actor_env_steps": self.fleet.env_steps_each(),
            "actors_waiting": len(self.fleet.waiting(now))})
        self._show_progress(env_steps)

    def _check_stops(self, now: float, env_steps: int, updates: int) -> None:
        """Stop for a SIGTERM, a limit reached or a process that never ran; start an
        evaluation when one is due."""
        c, t = self.config, self.topology
        if self.apex.sigterm.is_set():
            why = getattr(self.apex.sigterm, "why", "SIGTERM")  # a StopFlag's, or any flag's
            return self.record.stop("sigterm", f"{why}: stopping after a final checkpoint"
                                    + self.not_running(now))
        if self.deadline.passed():
            return self.record.stop("max_seconds", f"max_seconds={c.max_seconds:g} reached"
                                    + self.not_running(now))
        if self.something_waits(now) and now >= self.next_waiting_report:
            self.next_waiting_report = now + WAITING_REPORT_S
            self.record.say("waiting", self.waiting_line(now))
        # updates > 0 comes with the learner's stats, when the evaluator has been created
        if self.eval_ref is None and updates > 0 and now - self.last_eval >= c.eval_interval_s:
            self.eval_ref = t.evaluator.evaluate.remote(t.learner.get_weights.remote(-1))
            self.last_eval = now
        if c.max_env_steps and env_steps >= c.max_env_steps:
            self.record.stop("max_env_steps", f"max_env_steps={c.max_env_steps:,} reached")
        idle = self.fleet.none_running_since
        if idle is not None and now - idle >= c.actor_wait_s:
            self.record.stop("no_actors", f"no actor has run for {now - idle:.0f} s "
                             f"(actor_wait_s={c.actor_wait_s:g}): {self.waiting_line(now)}; the "
                             "cluster has no free CPU for them (a node pool at its limit or "
                             "quota?)")
        if self.learner_stats is None and now - self.learner_since >= c.learner_wait_s:
            self.record.stop("no_learner", "the learner has not run for "
                             f"{now - self.learner_since:.0f} s (learner_wait_s="
                             f"{c.learner_wait_s:g}): {self.waiting_line(now)}; no node can give "
                             "it learner_cpus/num_gpus?")

    def something_waits(self, now: float) -> bool:
        """Whether an actor or the learner does not run (yet)."""
        return bool(self.fleet.waiting(now)) or self.learner_stats is None

    def not_running(self, now: float) -> str:
        """For a stop line: '; ' and the waiting line if something does not run (a run cut
        short says what never ran in its last line), else ''."""
        return f"; {self.waiting_line(now)}" if self.something_waits(now) else ""

    def waiting_line(self, now: float) -> str:
        """The fleet's line on its actors that do not run, each starting or waiting for a CPU,
        then the learner's while it does not run (on a busy node its TensorFlow start-up is
        slow, and without this line the run looks stuck)."""
        fleet, learner = self.fleet, self.topology.learner
        waiting = [i for i, _ in fleet.waiting(now)]
        learner_waits = self.learner_stats is None
        # One GCS call for both: the learner's index is the one after the actors'.
        started = in_a_process([*fleet.actors, learner],
                               waiting + ([len(fleet.actors)] if learner_waits else []))
        line = fleet.waiting_line(now, started)
        if learner_waits:
            resource = "a GPU" if self.config.num_gpus else "a CPU"
            state = "starting" if len(fleet.actors) in started else f"waiting for {resource}"
            line += f"; learner {state} since {now - self.learner_since:.0f} s"
        return line

    def _show_progress(self, env_steps: int) -> None:
        self.record.bar.update(env_steps - self.record.bar.n)
        steps_per_s, updates_per_s = _rates(self.record.throughput)
        self.traces.record_rates(steps_per_s)
        postfix = {"env/s": f"{steps_per_s:,.0f}", "upd/s": f"{updates_per_s:,.0f}",
                   "actors": f"{self.fleet.running()}/{self.fleet.expected}"}
        if self.record.evals:
            postfix["eval"] = f"{self.record.evals[-1]['mean_return']:.1f}"
        self.record.bar.set_postfix(postfix, refresh=False)

    def handle(self, ref) -> None:
        """One reply that has arrived."""
        from ray.exceptions import RayError

        now = time.monotonic()
        events = self.fleet.handle(ref, now)
        if events is not None:
            for kind, detail in events:
                self.record.say(kind, detail)
        elif ref == self.learner_run:  # run() ends on its own: max_learner_updates, or lost
            try:  # its final stats: the last poll's update count may lag behind them
                self.learner_final = self.ray.get(ref, timeout=0) or {}
            except RayError as e:
                raise self.apex.lost("learner", e) from e
            self.learner_run = None
            self.record.stop("max_learner_updates",
                             f"max_learner_updates={self.config.max_learner_updates:,} reached")
        elif ref == self.learner_ref:
            self.learner_ref = None
            self._learner_stats(get_within(ref, 0), now)
        elif ref in self.replay_refs:
            shard = self.replay_refs.pop(ref)
            try:
                self.replay_stats[shard] = self.ray.get(ref, timeout=0)
            except RayError as e:
                raise self.apex.lost("replay", e) from e
        elif ref == self.eval_ref:
            self.eval_ref = None
            evaluation = get_within(ref, 0)
            if evaluation is not None:
                self._evaluation(evaluation, now)
        elif ref == self.confirm_ref:
            self.confirm_ref = None
            failed: list[str] = []  # e.g. best.npz could not be written: training goes on
            self._confirmed(get_within(ref, 0, None, failed), now)
            for why in failed:
                self.record.say("best_failed", f"a candidate best policy was not kept: {why}")
        elif self.hold is not None and ref == self.hold.check_ref:
            check = get_within(ref, 0)
            if check is not None:  # a greedy evaluation as the others are, of the paused weights
                self._evaluation(dict(check, hold_check=True), now)
            self.hold.checked(check, self.topology.learner)

    def _learner_stats(self, stats: dict | None, now: float) -> None:
        """The learner's stats; its first start the evaluator (which first evaluates the
        checkpoint a run resumed from)."""
        if stats is not None and self.learner_stats is None:
            self.record.say("learner_running", "learner running "
                            f"({now - self.record.t_start:.1f} s after start)")
            self.topology.start_evaluator(self.ray, self.config)
            if self.resumed_weights is not None:
                self.eval_ref = self.topology.evaluator.evaluate.remote(
                    (self.record.resumed["updates"], self.resumed_weights))
                self.last_eval, self.baseline_pending = now, True
        self.learner_stats = stats or self.learner_stats

    def _evaluation(self, ev: dict, now: float) -> None:
        """An evaluation's result: kept, said when it is the best so far, logged to
        TensorBoard, and a stop when it reaches target_return."""
        last = self.record.throughput[-1]
        ev |= {"time_s": now - self.record.t_start, "env_steps": last["env_steps"],
               "learner_updates": last["learner_updates"]}
        best = max((e["mean_return"] for e in self.record.evals), default=None)
        self.record.evals.append(ev)
        # Atari is evaluated with a small epsilon (envs.eval_epsilon): the log says so.
        how = f"epsilon-{ev['epsilon']:g}" if ev.get("epsilon") else "greedy"
        if best is None or ev["mean_return"] > best:
            # A job's log shows learning as it happens (the progress bar, where there is
            # one, shows the latest return already).
            self.record.say("eval_best", f"{how} mean return {ev['mean_return']:.1f}, the best "
                            f"so far, after {ev['time_s']:.1f} s, weights of "
                            f"{ev['weights_version']:,} updates",
                            print_it=not self.config.progress)
        self.topology.learner.log_scalars.remote(
            {"eval/mean_return": ev["mean_return"], "throughput/env_steps": ev["env_steps"]},
            ev["learner_updates"])
        kept = self.record.best
        if (self.config.best_eval_episodes and self.confirm_ref is None
                and (kept is None or ev["mean_return"] > kept["mean_return"])):
            # played again on new episodes before it is kept: the best of many noisy
            # evaluations is, more often than not, a lucky one
            self.confirm_ref = self.topology.evaluator.confirm.remote(ev["weights_version"])
        target = self.config.target_return
        baseline = self.baseline_pending and "hold_check" not in ev  # a resumed run's first
        self.baseline_pending = self.baseline_pending and not baseline
        if target is not None and ev["mean_return"] >= target and not baseline:
            self.record.time_to_target = ev["time_s"]
            self.record.stop("target_return", f"{how} mean return {ev['mean_return']:.1f} >= "
                             f"target {target:g} after {ev['time_s']:.1f} s")

    def _confirmed(self, found: dict | None, now: float) -> None:
        """The evaluator's confirmation of a candidate: the kept best policy when it beat the
        one kept before."""
        if found is None:
            return
        best = found.pop("best")
        self.record.confirmations.append({**found, "time_s": now - self.record.t_start})
        self.record.best = best  # a resumed run's first: the one its run kept, if better
        if found["kept"]:
            self.record.say("best_kept", f"weights of {found['weights_version']:,} updates kept as "
                            f"the best policy: {found['mean_return']:.1f} on "
                            f"{found['episodes']} new episodes (their evaluation: "
                            f"{found['evaluated_return']:.1f})", print_it=not self.config.progress)

    # --- the end ---
    def finish(self) -> TrainingResult:
        """Stop actors and learner; the learner's final checkpoint and the evaluator's close
        run while the actors end, replay's counts are read after them; every wait shares one
        deadline of SHUTDOWN_S."""
        t, fleet = self.topology, self.fleet
        deadline = Deadline(SHUTDOWN_S)
        problems: list[str] = []
        learner_up = self.learner_stats is not None
        fleet.stop()
        t.learner.stop.remote()
        for r in t.replays:
            r.close.remote()
        learner_final = self.learner_final
        if learner_up and self.learner_run is not None:
            learner_final = get_within(self.learner_run, deadline.left(), {}, problems)
        # The learner's and the evaluator's closing (a final checkpoint, each process's
        # telemetry flush: up to 3 s each with the collector gone) runs while the actors end.
        if learner_up:
            closing = [t.learner.close.remote(), t.learner.get_weights.remote(-1)]
        evaluator_closing = t.evaluator.close.remote() if t.evaluator is not None else None
        actor_finals = fleet.finish(deadline.left(10.0))
        if self.confirm_ref is not None:  # a candidate in play when the run stopped
            self._confirmed(get_within(self.confirm_ref, deadline.left(), None, problems),
                            time.monotonic())
        checkpoint = final_weights = None
        if learner_up:
            checkpoint, versioned = (get_within(ref, deadline.left(), None, problems)
                                     for ref in closing)
            final_weights = versioned[1] if versioned else None
        shards = [get_within(r.stats.remote(), deadline.left(), None, problems)
                  for r in t.replays]
        shards = [s for s in shards if s] or list(self.replay_stats.values())
        checks = [get_within(r.check.remote(), deadline.left(), None, problems)
                  for r in t.replays]
        checks = [x for x in checks if x]
        evaluator_cpu_s = (0.0 if evaluator_closing is None
                           else get_within(evaluator_closing, deadline.left(), 0.0, problems))
        self.tel.shutdown()
        exports = self._export_outcomes(actor_finals, deadline, problems)
        if problems:
            self.record.say("shutdown", f"while stopping: {problems[0]}"
                            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        self.record.add_learner_events(learner_final)
        replay = {k: sum(s[k] for s in shards) for k in ("inserted", "sampled", "cpu_s")}
        updates = (learner_final or self.learner_stats or {}).get("updates", 0)
        n = len(t.actors)

        def per_actor(key: str) -> list:
            return [actor_finals[i][key] if i in actor_finals else None for i in range(n)]

        # the learner's own last word where it gave one: a run that ends before the driver's
        # next poll still has its first update on the timeline
        learner_last = learner_final or self.learner_stats
        return self.record.result(self.fleet.first_step_time, learner_last, dict(
            env_steps=self.record.steps_before + fleet.env_steps(), learner_updates=updates,
            transitions_inserted=replay["inserted"], transitions_sampled=replay["sampled"],
            checkpoint=checkpoint, weights=final_weights, replay_check=merged_check(checks),
            cpu_seconds={"driver": time.process_time() - self.record.driver_cpu_start,
                         "learner": (learner_final or {}).get("cpu_s", 0.0),
                         "replay": replay["cpu_s"], "evaluator": evaluator_cpu_s,
                         "actors": sum(f["cpu_s"] for f in actor_finals.values())},
            actor_weights_versions=per_actor("weights_version"),
            actor_epsilons=per_actor("epsilons"),
            actor_env_steps=[fleet.base[i] + fleet.last[i]["env_steps"] for i in range(n)],
            actor_restarts=list(fleet.restarts), actor_nodes=list(fleet.nodes),
            actor_states=fleet.states(time.monotonic()),
            actor_transitions_sent=per_actor("transitions_sent"), telemetry_exports=exports))

    def _export_outcomes(self, actor_finals: dict, deadline: Deadline,
                         problems: list[str]) -> dict[str, list[dict]]:
        """What each process's exports came to, after its last flush: {process: outcomes}.
        A process whose exports were refused is said in the run's log, by name."""
        if not self.apex.config.telemetry:
            return {}
        t = self.topology
        exports = {"driver": self.tel.export_outcomes()}
        # by the names their telemetry carries: the replay shards are all "replay"
        others = [("learner", t.learner)] if self.learner_stats is not None else []
        others += [("evaluator", t.evaluator)] if t.evaluator is not None else []
        others += [("replay", r) for r in t.replays]
        for name, handle in others:
            outcomes = get_within(handle.export_outcomes.remote(), deadline.left(), None,
                                  problems)
            if outcomes is not None:
                exports.setdefault(name, []).extend(outcomes)
        for i, final in sorted(actor_finals.items()):
            if final.get("exports") is not None:
                exports[f"actor-{i}"] = final["exports"]
        for said in refusals(exports):
            self.record.say("telemetry", f"exports refused: {said}")
        return exports


def _rates(throughput: list[dict], window_s: float = 3.0) -> tuple[float, float]:
    """Env steps/s and learner updates/s over the last few seconds."""
    if len(throughput) < 2:
        return 0.0, 0.0
    last = throughput[-1]
    first = next((p for p in throughput if last["time_s"] - p["time_s"] <= window_s),
                 throughput[-2])
    if first is last:
        first = throughput[-2]
    dt = max(last["time_s"] - first["time_s"], 1e-9)
    return ((last["env_steps"] - first["env_steps"]) / dt,
            (last["learner_updates"] - first["learner_updates"]) / dt)
