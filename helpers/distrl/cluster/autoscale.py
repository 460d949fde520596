"""Nodes on demand on one machine: a rehearsal of GKE's autoscaled Spot actor pool.

On GKE, KubeRay's autoscaler watches the work Ray cannot place, adds pods to the `actors`
worker group (up to maxReplicas) and removes pods that stay idle; the Spot node pool follows
the pods. LocalAutoscaler does the same with `ray start` worker nodes of a LocalCluster, and it
reads the same demand: the pending resource requests that Ray's GCS keeps for autoscalers
(Ray's autoscaler v2 API). It also publishes its node group to Ray, as KubeRay's autoscaler v2
does, so a driver can tell that nodes will come (distrl.ray_runtime.node_groups).

    group = NodeGroup.from_ray_cluster(manifests.ray_cluster(settings), cpus=1)
    with LocalCluster(num_workers=0, autoscale=group) as cluster:   # 0 actor nodes at first
        ...                                # pending actors bring nodes; idle nodes go away

Why not Ray's own fake multi-node provider (ray.cluster_utils.AutoscalingCluster): as installed
from the wheel it cannot start (its base config, autoscaler/_private/fake_multi_node/example.yaml,
is not shipped), and its start() runs `ray stop --force`, which ends every Ray process of the
machine, the reader's own included.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from distrl.run_clock import moment, run_seconds

# Ray's NodeState.status values (src/ray/protobuf/autoscaler.proto).
NODE_DEAD = 2


@dataclass(frozen=True)
class NodeGroup:
    """A worker group that grows and shrinks with demand (KubeRay's workerGroupSpecs entry)."""

    name: str = "actors"
    min_nodes: int = 0
    max_nodes: int = 2
    cpus: float = 1.0
    idle_timeout_s: float = 30.0
    """a node with nothing on it for this long is removed (KubeRay's idleTimeoutSeconds: 60)"""

    def __post_init__(self):
        for name in ("min_nodes", "max_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"NodeGroup.{name}={value!r}: expected an integer >= 0")
        if self.max_nodes < self.min_nodes:
            raise ValueError(f"NodeGroup.max_nodes={self.max_nodes} is below min_nodes="
                             f"{self.min_nodes}: expected max_nodes >= min_nodes")
        for name in ("cpus", "idle_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"NodeGroup.{name}={value!r}: expected a number > 0")

    @classmethod
    def from_ray_cluster(cls, ray_cluster: dict, group: str = "actors",
                         cpus: float | None = None, max_nodes: int | None = None,
                         idle_timeout_s: float = 30.0) -> NodeGroup:
        """The group of a RayCluster manifest: min/max replicas and CPUs per node, the last two
        scaled down to this machine when given (a 7-CPU Spot node is one CPU here)."""
        groups = ray_cluster.get("spec", {}).get("workerGroupSpecs", [])
        spec = next((g for g in groups if g.get("groupName") == group), None)
        if spec is None:
            raise ValueError(f"group={group!r}: the RayCluster has the worker groups "
                             f"{[g.get('groupName') for g in groups]}")
        node_cpus = float(spec.get("rayStartParams", {}).get("num-cpus", 1))
        return cls(name=group, min_nodes=int(spec.get("minReplicas", 0)),
                   max_nodes=int(spec["maxReplicas"] if max_nodes is None else max_nodes),
                   cpus=node_cpus if cpus is None else cpus, idle_timeout_s=idle_timeout_s)


class LocalAutoscaler:
    """Adds worker nodes to a LocalCluster while Ray has work it cannot place, up to the group's
    max, and removes nodes idle for idle_timeout_s, down to its min. A lost node (its process
    gone) is forgotten, and the demand it leaves brings a new one. One node starts at a time,
    each with a deadline; a node that does not come up in time is stopped and retried later.
    (KubeRay starts a group's pods together; on one machine two `ray start`s at once race for
    the session's socket names, and one raylet died of "bind: Address already in use".)
    Every decision is an event: `events` (a list of dicts) and `on_event(line)`."""

    def __init__(self, cluster, group: NodeGroup, interval_s: float = 1.0,
                 node_start_timeout_s: float | None = None, on_event=None):
        self.cluster, self.group, self.interval_s = cluster, group, interval_s
        self.node_start_timeout_s = node_start_timeout_s or cluster.start_timeout_s
        self.on_event = on_event
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gcs = None
        self._t0 = time.monotonic()
        self._next_start = 0.0
        self._started = 0

    # --- lifecycle ---
    def start(self) -> LocalAutoscaler:
        from ray._raylet import GcsClient

        self._gcs = GcsClient(address=self.cluster.address)
        self._publish()
        self._thread = threading.Thread(target=self._run, name="distrl-autoscaler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - keep scaling; say what went wrong
                self._event("error", None, f"autoscaler step failed: {type(e).__name__}: "
                            f"{str(e)[:200]}")

    # --- one decision ---
    def step(self) -> None:
        """Look at the demand and the nodes once; start or remove at most one node."""
        from ray.autoscaler.v2.sdk import get_cluster_resource_state

        for node in self.nodes():
            if not node.alive():
                self.cluster.forget_node(node)
                self._event("node_lost", node.name, f"node {node.name} is gone "
                            f"(exit code {node.process.returncode})")
        state = get_cluster_resource_state(self._gcs)
        nodes = self.nodes()
        wanted = len(nodes) + math.ceil(self.pending_cpus(state) / self.group.cpus - 1e-9)
        wanted = max(self.group.min_nodes, min(self.group.max_nodes, wanted))
        if len(nodes) < wanted and time.monotonic() >= self._next_start:
            self._add_node(state)
            return
        idle = {n.node_id.hex(): n.idle_duration_ms / 1000 for n in state.node_states
                if n.status != NODE_DEAD}
        for node in nodes:
            if (len(self.nodes()) > self.group.min_nodes and node.node_id in idle
                    and idle[node.node_id] >= self.group.idle_timeout_s):
                self.cluster.remove_node(node)
                self._event("node_removed", node.name, f"node {node.name} removed: idle for "
                            f"{idle[node.node_id]:.0f} s")

    def pending_cpus(self, state) -> float:
        """CPUs of the pending requests that a node of this group could host."""
        total = 0.0
        for request in state.pending_resource_requests:
            bundle = dict(request.request.resources_bundle)
            if bundle.get("CPU", 0.0) <= self.group.cpus and set(bundle) <= {"CPU", "memory"}:
                total += bundle.get("CPU", 0.0) * request.count
        return total

    def nodes(self) -> list:
        return [n for n in self.cluster.nodes if n.group == self.group.name]

    def _add_node(self, state) -> None:
        known = {n.node_id.hex() for n in state.node_states if n.status != NODE_DEAD}
        self._started += 1
        name = f"{self.group.name}-{self._started}"
        start = time.monotonic()
        self._event("node_starting", name, f"node {name} starting ({len(self.nodes()) + 1} of "
                    f"max {self.group.max_nodes}) for pending work")
        node = self.cluster.add_worker(cpus=self.group.cpus, name=name, group=self.group.name)
        deadline = start + self.node_start_timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            if not node.alive():
                break
            from ray.autoscaler.v2.sdk import get_cluster_resource_state

            fresh = [n.node_id.hex() for n in get_cluster_resource_state(self._gcs).node_states
                     if n.status != NODE_DEAD and n.node_id.hex() not in known]
            if fresh:
                node.node_id = fresh[0]
                self.cluster.settle(node)
                self._event("node_ready", name, f"node {name} joined after "
                            f"{time.monotonic() - start:.1f} s")
                self._next_start = time.monotonic() + 2 * self.interval_s  # let work land
                return
            self._stop.wait(0.5)
        why = "stopped" if self._stop.is_set() else (
            f"exited with code {node.process.returncode}" if not node.alive()
            else f"did not join within {self.node_start_timeout_s:g} s")
        self.cluster.remove_node(node)
        self._next_start = time.monotonic() + 5.0
        self._event("node_failed", name, f"node {name} {why}; its log: {node.log}")

    def _publish(self) -> None:
        """Tell Ray what this group can add (Ray's ClusterConfig record, as KubeRay's
        autoscaler v2 reports it), so that a driver waits for CPUs instead of refusing."""
        import ray._raylet as raylet
        from ray.core.generated import autoscaler_pb2

        g = self.group
        config = autoscaler_pb2.ClusterConfig(node_group_configs=[
            autoscaler_pb2.NodeGroupConfig(name="head", resources={"CPU": math.ceil(self.cluster.head_cpus)},
                                           min_count=1, max_count=1),
            autoscaler_pb2.NodeGroupConfig(name=g.name, resources={"CPU": math.ceil(g.cpus)},
                                           min_count=g.min_nodes, max_count=g.max_nodes)])
        self._gcs.internal_kv_put(raylet.GCS_AUTOSCALER_CLUSTER_CONFIG_KEY.encode(),
                                  config.SerializeToString(), True,
                                  raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode(), timeout=10)

    def _event(self, kind: str, node: str | None, detail: str) -> None:
        self.events.append({"time_s": round(time.monotonic() - self._t0, 1), "kind": kind,
                            "node": node, "detail": detail,
                            "at": moment()})  # to line up with a run's events (run_clock)
        if self.on_event is not None:
            self.on_event(f"[autoscaler] {detail}")


# Kinds of event the preemption story tells, from the driver's and the autoscaler's records
# (and a drain the notebook sent).
STORY_KINDS = {"actor_lost", "actor_silent", "actor_back", "actor_running", "node_lost",
               "node_starting", "node_ready", "steady", "stop", "drain"}


def preemption_effects(result: dict, killed_at: dict | float, node_id: str,
                       window_s: float = 5.0) -> dict:
    """What a node killed under a run did to it, from the run's own record (results.json), on
    the run's clock (seconds since its train()): the actors the node hosted (`lost`), when each
    stepped again as a new process (`back`: actor -> time; `restarts`: new processes seen), the
    env steps/s in the `window_s` before the kill (up to their last step), from the kill until
    the last lost actor stepped again (or the run's end), and after that: the `window_s` before
    the learner starts where it waits for the fleet's recovery (--learn-after-recovery), else
    the `window_s` after; with the actors running in each; the lost actors'
    own env steps/s in each (`lost_env_steps_per_s`), which the remaining actors and the
    learner's start, sharing the cores, do not blur; and the mean of the other actors' own
    (`peer_env_steps_per_s`, None where every actor was lost): the pace a lost actor that
    recovered keeps up with, on a machine whose load changed since the kill. `killed_at`: the kill's
    run_clock.moment() (or wall clock)."""
    import re

    kill_t = run_seconds(result, killed_at)
    events = [(e["time_s"], e["kind"], e["detail"]) for e in result["events"]]
    lost = sorted({int(m.group(1)) for t, _, d in events if t <= kill_t
                   if (m := re.search(rf"actor (\d+) (?:running|is back) on node {node_id[:8]}",
                                      d))})
    back: dict[int, float] = {}
    for t, kind, detail in events:  # the lost actors only: one that went quiet under load
        # and reported again (actor_silent, then actor_back) kept its process and its node
        if kind == "actor_back" and t > kill_t and (m := re.match(r"actor (\d+)", detail)) \
                and int(m.group(1)) in lost:
            back.setdefault(int(m.group(1)), t)
    throughput = result["throughput"]
    end = throughput[-1]["time_s"] if throughput else kill_t
    back_t = max(back[i] for i in lost) if lost and all(i in back for i in lost) else None

    def stretch(start: float, stop: float, before_stop: bool = False) -> dict:
        rows = [r for r in throughput if start <= r["time_s"] <= stop
                if not (before_stop and r["time_s"] == stop)]
        if len(rows) < 2 or rows[-1]["time_s"] <= rows[0]["time_s"]:
            return {"env_steps_per_s": None, "actors_running": None, "lost_env_steps_per_s": None,
                    "peer_env_steps_per_s": None}
        span = rows[-1]["time_s"] - rows[0]["time_s"]
        lost_rate = peer_rate = None  # a record from before actor_env_steps existed has none
        if lost and all("actor_env_steps" in r for r in (rows[0], rows[-1])):
            each = [(b - a) / span for a, b in zip(rows[0]["actor_env_steps"],
                                                   rows[-1]["actor_env_steps"])]
            lost_rate = sum(each[i] for i in lost)
            peers = [rate for i, rate in enumerate(each) if i not in lost]
            peer_rate = sum(peers) / len(peers) if peers else None
        return {"env_steps_per_s": (rows[-1]["env_steps"] - rows[0]["env_steps"]) / span,
                "actors_running": (min(r["actors_running"] for r in rows),
                                   max(r["actors_running"] for r in rows)),
                "lost_env_steps_per_s": lost_rate, "peer_env_steps_per_s": peer_rate}

    # before: the window_s up to the lost actors' last step before the kill (a machine that
    # stalled every process for seconds just before it left no pace to lose in the window
    # ending at the kill)
    counted = [r for r in throughput if r["time_s"] <= kill_t and "actor_env_steps" in r]
    stepped = [b["time_s"] for a, b in zip(counted, counted[1:])
               if any(b["actor_env_steps"][i] > a["actor_env_steps"][i] for i in lost)]
    before_t = stepped[-1] if stepped else kill_t
    return {"kill_t": kill_t, "lost": lost, "back": back,
            "restarts": {i: result["actor_restarts"][i] for i in lost},
            "before": stretch(before_t - window_s, before_t),
            # until the lost actor is back: its first report, which counts its new life's steps
            "during": stretch(kill_t, back_t if back_t is not None else end, before_stop=True),
            "after": stretch(*_after(events, back_t, window_s)) if back_t is not None else None}


def _after(events: list, back_t: float, window_s: float) -> tuple[float, float]:
    """preemption_effects' stretch after the lost actors stepped again: where the learner
    starts after it (--learn-after-recovery), the window_s before that start (the stretch in
    which the fleet found every actor at pace, ActorFleet._steady, not a new process's warm-up;
    from the start on, the learner shares the cores and its rate limiter paces the actors);
    else the window_s after."""
    learns = [t for t, kind, _ in events if kind == "learning_starts" and t > back_t]
    return (max(back_t, learns[0] - window_s), learns[0]) if learns else (back_t, back_t + window_s)


def preemption_story(result: dict, killed_at: dict | float, node_id: str, node_name: str,
                     beside: list[dict], max_nodes: int) -> list[str]:
    """A node killed under a run, told from the run's own events on one clock (seconds since the
    run's train()): the kill and the actors it took, then what the driver and the autoscaler
    recorded after it, and what became of each lost actor. `result` is the run's results.json,
    `killed_at` the kill's run_clock.moment(), `beside` events recorded beside the run, each
    {"at": a moment, "kind", "detail"}: LocalAutoscaler.events, a drain the caller sent."""
    import re

    kill_t = run_seconds(result, killed_at)
    driver = [(e["time_s"], e["kind"], e["detail"]) for e in result["events"]]
    lost = sorted({int(m.group(1)) for t, _, d in driver if t <= kill_t
                   if (m := re.search(rf"actor (\d+) (?:running|is back) on node {node_id[:8]}",
                                      d))})
    others = [(run_seconds(result, e["at"]), e["kind"], e["detail"]) for e in beside]
    after = sorted(event for event in driver + others
                   if event[0] >= kill_t - 0.5 and event[1] in STORY_KINDS)
    lines = [f"{kill_t:6.1f} s  {node_name} killed, with actor(s) {lost} on it"]
    lines += [f"{t:6.1f} s  ({t - kill_t:+.1f} s)  {detail}" for t, _, detail in after]

    def actors_in(kinds: set[str]) -> list[int]:
        return [int(m.group(1)) for _, kind, d in after if kind in kinds
                if (m := re.match(r"actor (\d+)", d))]

    came, noticed = actors_in({"actor_running", "actor_back"}), set(actors_in(
        {"actor_lost", "actor_silent"}))
    for i in lost:
        state, restarts = result["actor_states"][i], result["actor_restarts"][i]
        if i not in noticed:
            lines.append(f"actor {i}: the job stopped before its driver noticed the loss, so its "
                         f"last view of actor {i} ('{state}') is from before the kill")
        elif i in came:
            lines.append(f"actor {i}, the lost one, ran again ({restarts} new process(es) seen); "
                         f"at the end: {state}")
        else:
            others = [j for j in came if j not in lost]
            lines.append(f"actor {i}, the lost one, did not run again before the job stopped (at "
                         f"the end: {state})."
                         + (f" The CPU that came free went to actor(s) {others}, which had been "
                            "waiting for one." if others else "")
                         + f" Ray restarts it when a node has a free CPU; the pool has at most "
                         f"{max_nodes} node(s).")
    return lines
