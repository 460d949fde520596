"""A local multi-node Ray cluster: a head and K worker nodes as separate processes, started the
way the pods of k8s/plain start them (`ray start --head`, then the wait-for-head script).

    with LocalCluster(num_workers=2, cpus_per_worker=1) as cluster:
        client = cluster.job_client()            # Ray's JobSubmissionClient, token included
        ...
    # every process the cluster started is gone here, also after a failed start

    # GKE's autoscaled Spot pool, rehearsed: 0 worker nodes, more as Ray asks (distrl.cluster.autoscale)
    cluster = LocalCluster.from_ray_cluster(manifests.ray_cluster(settings), cpus_per_worker=1)

Nothing outlives the process that started the cluster: stop() runs at exit, and a small reaper
process stops the nodes if that process dies without running it (a kernel killed by papermill).

    distrl cluster up --workers 2 --cpus-per-worker 1     # from a shell; `distrl cluster down`

The dashboard (and its Jobs API) listens on 127.0.0.1 only. Ray's token authentication stays on:
the nodes and the job client use ~/.ray/auth_token (made if missing).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from distrl.cluster.autoscale import LocalAutoscaler, NodeGroup
from distrl.ray_runtime import (
    DEFAULT_TOKEN_FILE,
    LOOPBACK_ENV,
    ClusterError,
    ensure_auth_token,
    kill_survivors,
    ray_gave_up,
    ray_temp_dir,
    use_token_auth,
)


def state_file() -> Path:
    """`distrl cluster up`'s record, in this user's own state directory ($XDG_STATE_HOME, else
    ~/.local/state), looked up at each use: a fixed name in the shared temporary directory could
    be planted by another user (and `down` would kill what it names)."""
    return (Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
            / "distrl" / "cluster.json")


class NodeStartFailed(ClusterError):
    """A process that a node's `ray start` launched (its raylet, GCS, ...) ended while the node
    was starting: Ray would wait its fixed 30 s for the node before giving up."""


def free_ports(count: int, taken: Iterable[int] = ()) -> list[int]:
    """`count` distinct free ports on 127.0.0.1, none of them in `taken`. Every socket stays
    bound until all are picked: picked one at a time, the OS may hand out one port twice (CI
    saw a raylet and its dashboard given the same port, and Ray refused to start the node)."""
    taken = set(taken)
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        while len(ports) < count:  # ends: a bound port is never handed out again
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            if (port := sock.getsockname()[1]) not in taken:
                ports.append(port)
    return ports


def pick_head_ports(port: int, dashboard_port: int) -> tuple[int, int]:
    """The head's GCS and dashboard ports: the ones given, or free ones (0 = any free)."""
    picked = iter(free_ports(2, taken=(port, dashboard_port)))
    return port or next(picked), dashboard_port or next(picked)


def node_env(extra: dict | None = None) -> dict:
    """Environment of every node process: this Python's bin first on PATH, token auth on."""
    ensure_auth_token(DEFAULT_TOKEN_FILE)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_AUTH_MODE"] = "token"
    env.pop("RAY_ADDRESS", None)
    return env | (extra or {})


def wait_for_head_script() -> Path:
    return Path(str(resources.files("distrl").joinpath("scripts/wait-for-head.sh")))


@dataclass
class Node:
    name: str
    process: subprocess.Popen
    log: Path
    cpus: float
    group: str | None = None      # the autoscaled group it belongs to (None: a fixed node)
    node_id: str | None = None    # Ray's node id (hex), once known
    # multiprocessing's temp folders its processes were seen listening in (while it started):
    # removed with the node, also when `ray start` gave up and ended them itself.
    temp_dirs: set = field(default_factory=set)
    joined: bool = False          # set by LocalCluster.settle; remove_node's grace depends on it
    cores: frozenset = frozenset()  # the machine's cores its processes run on (empty: any)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class LocalCluster:
    """Head + num_workers worker nodes on this machine, each its own `ray start` process."""

    num_workers: int = 2
    cpus_per_worker: float = 1
    head_cpus: float = 1
    port: int = 0
    dashboard_port: int = 0
    log_dir: str | Path | None = None
    start_timeout_s: float = 120.0
    autoscale: object = None
    """a distrl.cluster.autoscale.NodeGroup: worker nodes added and removed with Ray's demand"""
    on_event: Callable[[str], None] | None = None
    """called with one line per autoscaler event (e.g. print)"""
    loopback_only: bool = True
    """every node listens on 127.0.0.1 only (False: on every interface, Ray's default)"""
    pin_workers: bool = True
    """each worker node's processes run on cores of their own, as many as its CPUs (rounded
    up), as a pod's CPU limit confines it: a lost node takes its cores' work with it, not only
    its Ray resources (Linux; elsewhere, and past the machine's cores, they share)"""
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self):
        def whole(value, name, low):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r}: expected an integer >= {low}")

        whole(self.num_workers, "num_workers", 0)
        for name in ("cpus_per_worker", "head_cpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name}={value!r}: expected a number of CPUs >= 0")
        for name in ("port", "dashboard_port"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise ValueError(f"{name}={value!r}: expected a port from 0 (any free) to 65535")
        if not self.start_timeout_s > 0:
            raise ValueError(f"start_timeout_s={self.start_timeout_s!r}: expected > 0")
        for name in ("loopback_only", "pin_workers"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected True or False")
        if self.log_dir is not None and Path(self.log_dir).exists() \
                and not Path(self.log_dir).is_dir():
            raise ValueError(f"log_dir={str(self.log_dir)!r}: exists and is not a directory")
        if self.autoscale is not None and not isinstance(self.autoscale, NodeGroup):
            raise ValueError(f"autoscale={self.autoscale!r}: expected None or a "
                             "distrl.cluster.autoscale.NodeGroup")
        self.autoscaler = None
        self._reaper: subprocess.Popen | None = None

    @classmethod
    def from_ray_cluster(cls, ray_cluster: dict, head_cpus: float = 1, cpus_per_worker: float = 1,
                         max_workers: int | None = None, **kwargs) -> LocalCluster:
        """A head plus the manifest's `actors` group, autoscaled from its minReplicas to its
        maxReplicas, with CPUs scaled down to this machine."""
        group = NodeGroup.from_ray_cluster(ray_cluster, cpus=cpus_per_worker,
                                           max_nodes=max_workers)
        return cls(num_workers=0, cpus_per_worker=cpus_per_worker, head_cpus=head_cpus,
                   autoscale=group, **kwargs)

    # --- addresses ---
    @property
    def address(self) -> str:
        """The head's GCS address (what `ray start --address` and ray.init take)."""
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        """The dashboard and Jobs API (what JobSubmissionClient takes)."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    # --- lifecycle ---
    def start(self) -> LocalCluster:
        if self.nodes:
            raise ClusterError("this cluster is already started; stop() it first")
        self.port, self.dashboard_port = pick_head_ports(self.port, self.dashboard_port)
        logs = Path(self.log_dir or tempfile.mkdtemp(prefix="distrl-cluster-"))
        logs.mkdir(parents=True, exist_ok=True)
        self.log_dir = logs
        use_token_auth()
        atexit.register(self.stop)  # a normal exit, also of a kernel after a failed cell
        self._reaper = _start_reaper(self._state_file())
        try:
            self.join(lambda: self._start_node("head", [
                "ray", "start", "--head", "--block", f"--port={self.port}",
                f"--num-cpus={self.head_cpus:g}", "--include-dashboard=true",
                "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                *_node_ports(0, head_ports=(self.port, self.dashboard_port)),
                *self._node_address(), "--disable-usage-stats"], self.head_cpus, HEALTH_CHECK))
            # One node at a time: nodes on one machine share the session directory, and Ray's
            # choice of socket names there (raylet.1, raylet.2, ...) races when they start at once.
            for i in range(self.num_workers):
                self.join(lambda i=i: self.add_worker(name=f"worker-{i + 1}"))
            self._wait_for_jobs_api()
            if self.autoscale is not None:
                self.autoscaler = LocalAutoscaler(self, self.autoscale,
                                                  on_event=self.on_event).start()
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, cpus: float | None = None, name: str | None = None,
                   group: str | None = None) -> Node:
        """Start one more worker node (e.g. a replacement after a simulated preemption)."""
        cpus = self.cpus_per_worker if cpus is None else cpus
        name = name or f"worker-{len(self.nodes)}"
        env = {"RAY_HEAD_ADDRESS": self.address, "RAY_NUM_CPUS": f"{cpus:g}",
               "WAIT_FOR_HEAD_TIMEOUT_S": f"{self.start_timeout_s:g}",
               "WAIT_FOR_HEAD_INTERVAL_S": "0.5"}
        if self.loopback_only:  # `ray start` that keeps 127.0.0.1 (distrl.ray_runtime)
            env["RAY_START"] = "python -m distrl.ray_runtime start"
        return self._start_node(name, ["sh", str(wait_for_head_script()), "--block",
                                       *_node_ports(len(self.nodes)), *self._node_address(),
                                       "--disable-usage-stats"], cpus, env, group,
                                self._free_cores(cpus) if self.pin_workers else frozenset())

    def _free_cores(self, cpus: float) -> frozenset:
        """ceil(cpus) of this process's cores, the ones fewest live worker nodes run on."""
        if not hasattr(os, "sched_setaffinity") or cpus <= 0:
            return frozenset()
        used = [c for n in self.nodes[1:] if n.alive() for c in n.cores]
        ranked = sorted(os.sched_getaffinity(0), key=lambda c: (used.count(c), c))
        return frozenset(ranked[:math.ceil(cpus)])

    def _node_address(self) -> list[str]:
        return ["--node-ip-address=127.0.0.1"] if self.loopback_only else []

    def _start_node(self, name: str, argv: list[str], cpus: float, env: dict,
                    group: str | None = None, cores: frozenset = frozenset()) -> Node:
        log = Path(self.log_dir) / f"{name}.log"
        with open(log, "w") as out:
            # Its own session: stop() ends the node and everything it spawned as one group.
            if self.loopback_only:
                env = {**LOOPBACK_ENV, **env}
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                       env=node_env(env), start_new_session=True,
                                       preexec_fn=functools.partial(_start_node_process, cores))
        _set_autogroup_nice(process.pid, START_NICE)
        node = Node(name, process, log, cpus, group, cores=cores)
        self.nodes.append(node)
        self._save_state()
        return node

    def join(self, start: Callable[[], Node]) -> Node:
        """start() one more node and wait until it is alive in the cluster. A node that did not
        start is started once more, the failed start's log kept beside the new one: one whose
        `ray start` saw a process it launched end (its raylet, say) is stopped at once, and one
        that Ray gave up on (its fixed 30 s for a GCS or raylet, as in init_local_ray) has
        ended by itself."""
        count = len(self.nodes) + 1
        node = start()
        try:
            self.wait_for_nodes(count, starting=node)
        except NodeStartFailed as e:
            why = str(e)
        except ClusterError:
            if node.alive() or not ray_gave_up(node.log_tail(100_000)):
                raise
            why = "Ray gave up on its GCS or raylet after its fixed 30 s"
        else:
            self.settle(node)
            return node
        self.remove_node(node)  # this ends anything it left
        failed = node.log.with_suffix(".failed-start.log")
        node.log.replace(failed)
        with open(failed, "a") as log:
            log.write(f"\ndistrl: node {node.name} did not start: {why}\n")
        print(f"node {node.name} did not start ({why}); its log: {failed}; starting it again",
              file=sys.stderr, flush=True)
        node = start()
        self.wait_for_nodes(count, starting=node)
        self.settle(node)
        return node

    def settle(self, node: Node) -> None:
        """A node has joined: every process of it back to normal priority (its workers, started
        later by its raylet, inherit this), and its session's CPU share to the head's weight
        for the first node started, WORKER_NICE's for every other."""
        node.joined = True
        _settle_priority(node, 0 if node is self.nodes[0] else WORKER_NICE)

    def remove_node(self, node: Node) -> None:
        """Stop one node (SIGTERM, then SIGKILL after STOP_GRACE_S, or FAILED_START_GRACE_S
        if it never joined) and forget it."""
        deadline = time.monotonic() + (STOP_GRACE_S if node.joined else FAILED_START_GRACE_S)
        leftovers = node.temp_dirs | _terminate_leaders([node.process.pid], deadline)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(max(0.0, deadline - time.monotonic()))
        _kill_group(node.process, signal.SIGKILL, 5.0)
        _remove_dirs(leftovers)
        self.forget_node(node)

    def forget_node(self, node: Node) -> None:
        if node in self.nodes:
            self.nodes.remove(node)
            self._save_state()

    def _state_file(self) -> Path:
        return Path(self.log_dir) / "cluster-state.json"

    def _save_state(self) -> None:
        """What the reaper stops if this process dies: every node's process group."""
        write_state(self._state_file(), {"port": self.port, **node_groups(self.nodes)})

    def wait_for_nodes(self, count: int, timeout_s: float | None = None,
                       starting: Node | None = None) -> list[dict]:
        """Block until `count` nodes are alive in the cluster; returns them (ray.util.state).
        `starting`: the node being started, given up on (NodeStartFailed) as soon as a process
        its `ray start` launched has ended, not after Ray's 30 s."""
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        alive: list[dict] = []
        last_error = ""
        ended_before: dict[int, str] = {}
        while time.monotonic() < deadline:
            for node in self.nodes:
                processes = _node_processes(node.process.pid)
                node.temp_dirs |= processes.temp_dirs
                if not node.alive():
                    raise ClusterError(f"node {node.name} exited with code "
                                       f"{node.process.returncode} while starting:\n"
                                       f"{node.log_tail()}")
                if node is starting:
                    # Ended in two looks in a row: `ray start` reaps no child while it starts
                    # the node (a parent that does, as sh, leaves none for 0.5 s).
                    ended = {pid: name for pid, name in processes.ended.items()
                             if pid in ended_before}
                    if ended:
                        raise NodeStartFailed(
                            f"its {', '.join(f'{n} (pid {p})' for p, n in ended.items())} "
                            "ended while the node started, before it joined the cluster")
                    ended_before = processes.ended
            try:  # a short timeout: a port that accepts but never answers must not stall this
                alive = [n for n in node_table(self.dashboard_url, timeout_s=5.0)
                         if n["state"] == "ALIVE"]
            except Exception as e:  # the head is not answering yet
                alive, last_error = [], f"{type(e).__name__}: {e}"[:300]
            if len(alive) >= count:
                return alive
            time.sleep(0.5)
        raise ClusterError(f"{len(alive)} of {count} nodes alive after "
                           f"{timeout_s or self.start_timeout_s:g}s ({last_error or 'no error'}); "
                           f"logs in {self.log_dir}:\n"
                           + "\n".join(f"--- {n.name}\n{n.log_tail(600)}" for n in self.nodes))

    def _wait_for_jobs_api(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                self.job_client().list_jobs()
                return
            except Exception as e:
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"the Jobs API at {self.dashboard_url} did not answer: {e}") from e
                time.sleep(0.5)

    def node_table(self) -> list[dict]:
        """Every node the head knows: id, ip, state, CPUs (like the top of `ray status`)."""
        return node_table(self.dashboard_url)

    def job_client(self):
        """Ray's JobSubmissionClient for this cluster (the same call works through port-forward)."""
        return job_client(self.dashboard_url)

    def kill_node(self, name: str) -> Node:
        """Kill a worker node's processes at once (SIGKILL), as a Spot preemption would."""
        workers = self.nodes[1:]  # the head is the first node (start() joins it first)
        node = next((n for n in workers if n.name == name), None)
        if node is None:
            raise ValueError(f"name={name!r}: expected one of the worker nodes "
                             f"{[n.name for n in workers]}")
        _kill_group(node.process, signal.SIGKILL, 5.0)
        return node

    def stop(self) -> None:
        """Forget the cluster, stop every node (workers first) and wait until all their
        processes are gone. Safe to call twice."""
        import psutil

        if self.autoscaler is not None:
            self.autoscaler.stop()
        leftovers = set().union(*(node.temp_dirs for node in self.nodes))
        procs = []
        for pid in self.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.append(psutil.Process(pid))
        # The worker nodes, then the head (the first node: start() joins it first), STOP_GRACE_S
        # each; an idle node drains and exits well within it (`python benchmarks/cluster_stop.py`
        # measures the stop). Then SIGKILL to what is left: `ray start` handles SIGTERM only
        # between steps of its own start-up.
        stop_groups([node.process.pid for node in self.nodes], self.port, STOP_GRACE_S)
        for node in self.nodes:  # the `ray start` processes are this process's children
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(5.0)
        # Anything that left the process groups (the dashboard's multiprocessing children,
        # which end on their own only later): its node is gone, so at once.
        kill_survivors(procs, wait_s=0)
        _remove_dirs(leftovers)
        self.nodes = []
        if self._reaper is not None:  # nothing left for it to do
            _kill_group(self._reaper, signal.SIGKILL, 5.0)
            self._reaper = None
        atexit.unregister(self.stop)

    def detach(self) -> None:
        """Let the nodes outlive this process (`distrl cluster up`; `down` stops them)."""
        atexit.unregister(self.stop)
        if self._reaper is not None:
            _kill_group(self._reaper, signal.SIGKILL, 5.0)
            self._reaper = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pids(self) -> list[int]:
        """Every live process of every node (for checks that nothing is left)."""
        import psutil

        out = []
        for node in self.nodes:
            try:
                parent = psutil.Process(node.process.pid)
                out += [parent.pid] + [c.pid for c in parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return out


def node_table(dashboard_url: str, timeout_s: float = 30.0) -> list[dict]:
    """The nodes of any Ray cluster whose dashboard is reachable (local, or GKE through
    `kubectl port-forward`): id, ip, state, head or not, CPUs and GPUs."""
    from ray.util.state import list_nodes

    use_token_auth()
    nodes = list_nodes(address=dashboard_url, detail=True, raise_on_missing_output=False,
                       timeout=max(1, round(timeout_s)))
    return [{"node_id": n.node_id, "ip": n.node_ip, "state": n.state, "is_head": n.is_head_node,
             "cpus": n.resources_total.get("CPU", 0.0), "gpus": n.resources_total.get("GPU", 0.0)}
            for n in nodes]


def actor_table(dashboard_url: str) -> list[dict]:
    """The live Ray actors of the cluster and the node each runs on (who runs where)."""
    from ray.util.state import list_actors

    use_token_auth()
    actors = list_actors(address=dashboard_url, detail=True, raise_on_missing_output=False,
                         filters=[("state", "=", "ALIVE")])
    return [{"class": a.class_name, "node_id": a.node_id, "pid": a.pid} for a in actors]


def job_client(dashboard_url: str):
    """Ray's JobSubmissionClient with token authentication (local or through port-forward)."""
    from ray.job_submission import JobSubmissionClient

    use_token_auth()
    return JobSubmissionClient(dashboard_url)


def recorded(port: int) -> bool:
    """Whether Ray's record of the current cluster, which `ray start --head` writes and
    ray.init() with no address joins, names this port."""
    try:
        return (ray_temp_dir() / "ray_current_cluster").read_text().strip().endswith(f":{port}")
    except OSError:
        return False


def forget_cluster(port: int) -> None:
    """Once a head is gone, its record would make later ray.init() calls fail: removes the
    record if it names this port."""
    if recorded(port):
        with contextlib.suppress(OSError):
            (ray_temp_dir() / "ray_current_cluster").unlink()


_NODE_PORTS = ("node-manager", "object-manager", "dashboard-agent-listen",
               "dashboard-agent-grpc", "runtime-env-agent", "metrics-export")


def _node_ports(index: int, head_ports: tuple[int, ...] = ()) -> list[str]:
    """Ports of their own for every node on this one machine, all distinct and none of the
    head's GCS and dashboard ports (`head_ports`, given for the head only, which also gets its
    Ray Client port): Ray's fixed defaults (the dashboard agent's 52365, ...) would collide
    between nodes, as they never do across pods."""
    names = _NODE_PORTS + (("ray-client-server",) if head_ports else ())
    low = 10_002 + 1_000 * (index % 40)
    return [*(f"--{name}-port={port}"
              for name, port in zip(names, free_ports(len(names), taken=head_ports))),
            f"--min-worker-port={low}", f"--max-worker-port={low + 999}"]


# A node's daemons start at a higher priority where the OS allows it (root, CAP_SYS_NICE). On one
# busy machine a new node's dashboard agent can take longer than the 15 s its raylet waits for it
# (a fatal "Timed out waiting for file .../dashboard_agent_listen_port"), and the node's start
# then fails, which does not happen on a VM of its own. Linux shares the CPU between sessions
# first (autogroups), so the boost goes to the node's session as well as to its processes.
# Once the node has joined, it goes back to normal priority (LocalCluster.settle), and a worker
# node's session to a lower weight than the head's: the head's session holds the driver, learner,
# replay, evaluator and Ray's GCS, which on GKE have a machine of their own, while each worker
# node's holds an actor or two. At equal weights two busy actor nodes leave the head a third of
# the CPU, and the learner (notebook 04's) is slow to start; at nice 5 (a weight of a third of
# nice 0's, and raising a nice value needs no privilege) the head gets 60%.
START_NICE = -15
WORKER_NICE = 5
# How soon the head's GCS gives up on a node that stopped answering: Ray's default is 5 failed
# checks 3 s apart (src/ray/common/ray_config_def.h: health_check_period_ms 3000,
# health_check_failure_threshold 5), 15 s during which a lost actor's restart waits. Nodes here
# are processes on one machine, and a killed raylet refuses the check at once: 3 checks 1 s apart
# say so in 3 s. A busy but live raylet still gets each check's 10-s timeout (the default).
HEALTH_CHECK = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
STOP_GRACE_S = 5.0  # a set of nodes' time to end after SIGTERM in stop(), before SIGKILL
# A node that never joined (a failed start in join or the autoscaler): its `ray start` is usually
# blocked in Ray's wait for its raylet to register (up to 30 s, in C++), where its SIGTERM handler
# cannot run, so STOP_GRACE_S would be waited out whole at each failed start. One
# second still lets a `ray start` that is not blocked stop its processes itself.
FAILED_START_GRACE_S = 1.0


def _start_node_process(cores: frozenset) -> None:
    """In a node's `ray start`, before it runs: its start-up priority and, where it has cores
    of its own, those cores (every process it starts inherits both)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, START_NICE)
    if cores:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cores)


def _set_autogroup_nice(session_leader: int, nice: int) -> None:
    with contextlib.suppress(OSError):  # no autogroups, or no right to raise priority
        Path(f"/proc/{session_leader}/autogroup").write_text(str(nice))


def _settle_priority(node: Node, session_nice: int) -> None:
    import psutil

    _set_autogroup_nice(node.process.pid, session_nice)
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(node.process.pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                if p.nice() < 0:
                    p.nice(0)


def _start_reaper(state_file: Path) -> subprocess.Popen:
    """A process that stops the cluster's nodes once this process is gone, however it ended."""
    code = f"from distrl.cluster.local import reap; reap({os.getpid()}, {str(state_file)!r})"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def node_groups(nodes: list[Node]) -> dict:
    """The nodes' process groups and their leaders' start times (a state file's groups)."""
    import psutil

    created = []
    for node in nodes:
        try:
            created.append(psutil.Process(node.process.pid).create_time())
        except psutil.Error:
            created.append(0.0)  # already gone: never matches a live process
    return {"groups": [n.process.pid for n in nodes], "created": created}


def write_state(path: Path, state: dict) -> None:
    """Write a state file atomically, readable by its owner only, in a directory only its
    owner can enter; a link at the path is replaced, never written through."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.parent.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ValueError(f"{path.parent} belongs to another user or others may write it")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600, O_EXCL
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def read_state(path: Path) -> dict | None:
    """A state file this user wrote, or None when there is none. A link, a file of another
    user or one others may write, or content that is not a state raise ValueError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as err:  # ELOOP: a symbolic link
        raise ValueError(f"{path} cannot be trusted ({err.strerror}); remove it") from None
    with os.fdopen(fd) as f:
        info = os.fstat(f.fileno())
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise ValueError(f"{path} belongs to another user or others may write it; "
                             "remove it")
        try:
            state = json.load(f)
        except ValueError:
            state = None
    groups, created = (state or {}).get("groups"), (state or {}).get("created")
    if not (isinstance(groups, list) and isinstance(created, list)
            and len(groups) == len(created)
            and all(isinstance(g, int) and not isinstance(g, bool) and g > 1 for g in groups)
            and all(isinstance(c, (int, float)) for c in created)
            and isinstance(state.get("port"), int)):
        raise ValueError(f"{path} is not a cluster state (groups, created, port); remove it")
    return state


def reap(parent_pid: int, state_file: str, poll_s: float = 0.5) -> None:
    """Wait until `parent_pid` has exited (this process is then re-parented), then stop every
    node group listed in `state_file` and forget the cluster."""
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    try:
        state = read_state(Path(state_file))
    except (OSError, ValueError):
        return
    if state:
        stop_groups(state["groups"], state["port"], grace_s=5.0, created=state["created"])


def _ours(pgid: int, created: float) -> bool:
    """Whether process group pgid is still the one recorded: its leader (or, once the leader
    has gone, a member started after it) belongs to this user and started at `created`. A
    reused pid, or another user's process, is never signalled."""
    import psutil

    try:
        leader = psutil.Process(pgid)
        return leader.uids().real == os.getuid() and abs(leader.create_time() - created) < 1
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:
        return False
    for p in psutil.process_iter(["uids", "create_time"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(p.pid) == pgid and p.info["uids"].real == os.getuid() \
                    and p.info["create_time"] >= created - 1:
                return True
    return False


def stop_groups(groups: list[int], port: int, grace_s: float,
                created: list[float] | None = None) -> None:
    """Forget the cluster's record, then stop its node process groups: the worker nodes', then
    the head's (the first group), each SIGTERM and up to grace_s to end; then SIGKILL to what is
    left. LocalCluster.stop, `distrl cluster down` and the reaper all stop nodes this way. The
    record goes first, and again last: once the nodes are gone nothing may still point
    ray.init() at them. With `created` (the leaders' start times), only the groups still the
    recorded ones are signalled.

    Workers first: a worker's `ray start` drains its node through the head's GCS on SIGTERM,
    and signalled together with the head it could wait for a GCS that was already gone until
    the grace ran out (`python benchmarks/cluster_stop.py` measures the stop)."""
    forget_cluster(port)
    head = groups[:1]
    if created is not None:
        groups = [g for g, c in zip(groups, created) if _ours(g, c)]
    leftovers: set[Path] = set()
    workers, head = [g for g in groups if g not in head], [g for g in groups if g in head]
    for part in (workers, head):
        deadline = time.monotonic() + grace_s
        leftovers |= _terminate_leaders(list(reversed(part)), deadline)
        _wait_for_groups_to_end(part, deadline)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    # A head's `ray start` writes the record as its last step, seconds after the head serves
    # when the machine is busy: a cluster stopped right after it started (a notebook that fails
    # in its next cell) could write it after the first forget. Once the head's processes are
    # gone nothing writes it any more.
    _wait_for_groups_to_end(head, time.monotonic() + grace_s)
    forget_cluster(port)
    _remove_dirs(leftovers)


def _wait_for_groups_to_end(groups: list[int], deadline: float) -> None:
    while time.monotonic() < deadline and any(_group_alive(g) for g in groups):
        time.sleep(0.05)


def _remove_dirs(dirs: Iterable[Path]) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (a zombie, waiting for init to reap it, has
    ended)."""
    import psutil

    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


class _NodeProcesses(NamedTuple):
    gcs: list        # a head's GCS (psutil processes; a worker node has none)
    monitor: list    # a head's autoscaler monitor
    temp_dirs: set   # multiprocessing's temp folders (pymp-*) its processes listen in
    ended: dict      # pid -> name: its `ray start`'s children that have ended, not yet reaped


def _node_processes(leader: int) -> _NodeProcesses:
    """What a node's stop needs to know of the processes under its `ray start` (the leader),
    in one look. The temp folders: Ray's dashboard runs a forkserver whose folder
    multiprocessing removes only at a normal exit of the dashboard, so every stopped head left
    one behind (so does a plain `ray start --head` and `ray stop`, Ray 2.60)."""
    import psutil

    found = _NodeProcesses([], [], set(), {})
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(leader).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.status() == psutil.STATUS_ZOMBIE:
                    if _is_ray_start(psutil.Process(p.ppid()).cmdline()):
                        found.ended[p.pid] = p.name()
                    continue
                if p.name() == "gcs_server":
                    found.gcs.append(p)
                elif any(a.endswith("autoscaler/_private/monitor.py") for a in p.cmdline()):
                    found.monitor.append(p)
                found.temp_dirs.update(
                    Path(c.laddr).parent for c in p.net_connections(kind="unix")
                    if c.laddr and Path(c.laddr).parent.name.startswith("pymp-"))
    return found


def _is_ray_start(cmdline: list[str]) -> bool:
    """`ray start ...` (Ray's CLI script, run by its python or on its own), or the same
    through `python -m distrl.ray_runtime start ...`."""
    return any((Path(a).name == "ray" or a == "distrl.ray_runtime")
               and cmdline[i + 1:i + 2] == ["start"] for i, a in enumerate(cmdline))


def _terminate_leaders(leaders: list[int], deadline: float) -> set[Path]:
    """SIGTERM to these nodes' `ray start` processes; a head's monitor then goes as soon as its
    GCS has ended (_skip_monitor_grace), at the latest by `deadline` (time.monotonic()).
    Returns the nodes' temp folders, for the caller to remove once the nodes are gone."""
    seen = []
    for pid in leaders:
        seen.append(_node_processes(pid))  # before the signal: afterwards they are going
        _terminate_leader(pid)
    for node in seen:
        _skip_monitor_grace(node.gcs, node.monitor, max(0.0, deadline - time.monotonic()))
    return set().union(*(node.temp_dirs for node in seen))


def _skip_monitor_grace(gcs: list, monitor: list, wait_s: float) -> None:
    """Once a stopping head's GCS has ended, SIGKILL its monitor. `ray start` stops the GCS
    first, then sends the monitor SIGTERM, whose handler waits on the gone GCS until Ray kills
    it after a fixed 1 s (ray/_private/node.py, _kill_process_impl). Killed then, it is already
    inside that stop: `ray start` does not report it as a process that died unexpectedly."""
    import psutil

    if gcs and monitor:
        _, alive = psutil.wait_procs(gcs, timeout=wait_s)
        if not alive:
            for p in monitor:
                with contextlib.suppress(psutil.Error):
                    p.kill()


def _terminate_leader(pid: int) -> None:
    """SIGTERM to a node's `ray start` only (its group's leader): it drains the node through the
    GCS, then stops the node's processes itself. SIGTERM to the whole group would end the head's
    GCS first, and `ray start` would then wait 30 s for a GCS that is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)


def _kill_group(process: subprocess.Popen, sig: int, wait_s: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(wait_s)


def main(argv: list[str] | None = None) -> int:
    """`distrl cluster up|down|status`: a local multi-node cluster from a shell."""
    import argparse

    parser = argparse.ArgumentParser(prog="distrl cluster", description=main.__doc__)
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus-per-worker", type=float, default=1)
    parser.add_argument("--head-cpus", type=float, default=1)
    parser.add_argument("--log-dir", default=None,
                        help="where the nodes' logs go (default: a new distrl-cluster-* folder "
                             "in the temp dir); they stay after `down`")
    parser.add_argument("--all-interfaces", action="store_true",
                        help="nodes listen on every interface (default: 127.0.0.1 only); "
                             "anyone who reaches them then needs only the auth token")
    args = parser.parse_args(argv)
    state_path = state_file()
    try:
        state = read_state(state_path)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.action == "up":
        if state is not None:
            print(f"error: a cluster is already up ({state_path}); `distrl cluster down` first",
                  file=sys.stderr)
            return 1
        try:
            cluster = LocalCluster(args.workers, args.cpus_per_worker, args.head_cpus,
                                   log_dir=args.log_dir,
                                   loopback_only=not args.all_interfaces).start()
            cluster.detach()
        except (ValueError, ClusterError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        write_state(state_path, {
            "address": cluster.address, "dashboard_url": cluster.dashboard_url,
            "port": cluster.port, **node_groups(cluster.nodes), "log_dir": str(cluster.log_dir)})
        print(f"Ray cluster up: {1 + args.workers} nodes\n  address   {cluster.address}\n"
              f"  dashboard {cluster.dashboard_url}   (Jobs API; 127.0.0.1 only)\n"
              f"  logs      {cluster.log_dir}\nstop it with: distrl cluster down")
        return 0
    if state is None:
        print("no cluster started by `distrl cluster up` is running", file=sys.stderr)
        return 1 if args.action == "status" else 0
    if args.action == "status":
        print(json.dumps(state, indent=2))
        return 0
    stop_groups(state["groups"], state["port"], grace_s=10.0, created=state["created"])
    state_path.unlink()
    print(f"Ray cluster down; its logs stay in {state.get('log_dir', '?')}")
    return 0
