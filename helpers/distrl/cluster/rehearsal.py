"""The rendered GKE manifests, rehearsed on this machine: the pods' own commands and env.

    cluster = ManifestRehearsal(manifests.ray_cluster(settings), collector_endpoint=...,
                                runs_dir=tmp / "runs").start()
    job_id = cluster.job_client().submit_job(entrypoint=cluster.entrypoint(ray_job), ...)

Every Ray node is started with the command KubeRay gives a Ray container (`ray start` with the
group's rayStartParams, --block, and the CPU, GPU and memory of its resource limits: ray-project/
kuberay ray-operator/controllers/ray/common/pod.go, generateRayStartCommand) and with the
container's env as Kubernetes builds it: values, fieldRefs, the Secret KubeRay reads for
spec.authOptions, the token variables it adds, and $(VAR) references expanded in order.

What differs from a pod, and only that (`rewrites` lists each one): service host names
(`*.svc.cluster.local`) become 127.0.0.1 and the managed collector's port the local collector's;
fixed ports become free ones, since all nodes share one machine; the dashboard listens on
127.0.0.1, not 0.0.0.0; the run volume's mount path becomes a local directory. A mismatch
between what the pods run and what the code expects then fails here, not in a reader's cluster.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from distrl.cluster.local import LocalCluster, _node_ports, _start_reaper, pick_head_ports
from distrl.gke.manifests import RUNS_DIR
from distrl.gke.settings import parse_quantity
from distrl.ray_runtime import DEFAULT_TOKEN_FILE, ClusterError, ensure_auth_token, use_token_auth


@dataclass
class PodCommand:
    name: str
    argv: list[str]
    env: dict[str, str]
    cpus: float


def _limit(container: dict, key: str) -> str | None:
    return container.get("resources", {}).get("limits", {}).get(key)


def ray_start_argv(group: dict, head: bool, head_address: str = "") -> list[str]:
    """KubeRay's `ray start` for a group's Ray container (its first container): the
    rayStartParams as --key=value, --block, and num-cpus / num-gpus / memory from the container's
    limits when the params do not set them."""
    container = group["template"]["spec"]["containers"][0]
    params = dict(group.get("rayStartParams", {}))
    if "num-cpus" not in params and _limit(container, "cpu"):
        params["num-cpus"] = str(int(float(_limit(container, "cpu"))))
    if "num-gpus" not in params and _limit(container, "nvidia.com/gpu"):
        params["num-gpus"] = _limit(container, "nvidia.com/gpu")
    if "memory" not in params and _limit(container, "memory"):
        params["memory"] = str(int(parse_quantity(_limit(container, "memory"))))
    argv = ["ray", "start", "--head" if head else f"--address={head_address}", "--block"]
    return argv + [f"--{key}={value}" for key, value in params.items()]


def container_env(container: dict, pod_name: str, secrets: dict[str, dict[str, str]],
                  token_secret: str | None) -> dict[str, str]:
    """The env Kubernetes gives the container: literal values, metadata.name fieldRefs, Secret
    keys, KubeRay's token variables (spec.authOptions), and $(VAR) expanded from the variables
    defined before it (kubernetes.io/docs/tasks/inject-data-application/
    define-interdependent-environment-variables)."""
    env: dict[str, str] = {}
    entries = list(container.get("env", []))
    if token_secret is not None:
        entries += [{"name": "RAY_AUTH_MODE", "value": "token"},
                    {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {
                        "name": token_secret, "key": "auth_token"}}}]
    for entry in entries:
        if "value" in entry:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)),
                           entry["value"])
        elif "fieldRef" in entry.get("valueFrom", {}):
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            if path != "metadata.name":
                raise ValueError(f"env {entry['name']}: fieldRef {path} is not rehearsed")
            value = pod_name
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            try:
                value = secrets[ref["name"]][ref["key"]]
            except KeyError:
                raise ValueError(f"env {entry['name']}: Secret {ref['name']} key {ref['key']} "
                                 f"is not among the Secrets given ({sorted(secrets)})") from None
        else:
            raise ValueError(f"env entry {entry!r} is not rehearsed")
        env[entry["name"]] = value
    return env


@dataclass
class ManifestRehearsal(LocalCluster):
    """A RayCluster manifest's head and worker pods as local Ray nodes, started with their own
    commands and env (see the module's doc for the rewrites). Workers: `workers_per_group` pods
    of each worker group (at most its maxReplicas)."""

    ray_cluster: dict = field(default_factory=dict)
    collector_endpoint: str = ""
    """the local collector that stands in for the managed one (OTLP/HTTP or gRPC, as the
    manifests export)"""
    runs_dir: str | Path = ""
    token_file: str | Path = ""
    workers_per_group: int = 1
    loopback_only: bool = False
    """the pods' own `ray start`, which listens on every interface, as in a pod: a rehearsal
    lasts a test or a notebook cell, and its nodes require the Ray token"""
    rewrites: list[str] = field(default_factory=list)
    pods: list[PodCommand] = field(default_factory=list)

    def __post_init__(self):
        super().__post_init__()
        if not self.ray_cluster.get("spec", {}).get("headGroupSpec"):
            raise ValueError("ray_cluster: expected a RayCluster (spec.headGroupSpec)")
        if not str(self.collector_endpoint).startswith("http://127.0.0.1:"):
            raise ValueError(f"collector_endpoint={self.collector_endpoint!r}: expected the "
                             "local collector, http://127.0.0.1:PORT")

    def _rewrite_env(self, env: dict[str, str]) -> dict[str, str]:
        out = {}
        local_port = self.collector_endpoint.rsplit(":", 1)[1]
        for key, value in env.items():
            new = re.sub(r"[a-z0-9.-]+\.svc\.cluster\.local:\d+", f"127.0.0.1:{local_port}",
                         value)
            if new != value:
                self.rewrites.append(f"env {key}: {value} -> {new}")
            out[key] = new
        return out

    def _rewrite_argv(self, argv: list[str], head: bool, index: int) -> list[str]:
        out = []
        for arg in argv:
            if arg == "--dashboard-host=0.0.0.0":
                arg = "--dashboard-host=127.0.0.1"
            out.append(arg.replace(RUNS_DIR, str(self.runs_dir)))
        if head:
            out += [f"--port={self.port}", f"--dashboard-port={self.dashboard_port}"]
        out.append("--disable-usage-stats")
        self.rewrites.append(f"node {index}: {shlex.join(argv)} -> {shlex.join(out)} "
                             "+ free ports for its daemons, chosen as it starts")
        return out

    def plan_pods(self) -> list[PodCommand]:
        """The head and worker pods' commands and env, rewritten for this machine."""
        spec = self.ray_cluster["spec"]
        auth = spec.get("authOptions", {})
        token_secret = auth.get("secretName") if auth.get("mode") == "token" else None
        token = ensure_auth_token(self.token_file or DEFAULT_TOKEN_FILE).read_text().strip()
        secrets = {token_secret: {"auth_token": token}} if token_secret else {}
        name = self.ray_cluster["metadata"]["name"]
        groups = [(spec["headGroupSpec"], True, f"{name}-head")]
        for group in spec.get("workerGroupSpecs", []):
            count = min(self.workers_per_group, group["maxReplicas"])
            groups += [(group, False, f"{name}-{group['groupName']}-worker-{i}")
                       for i in range(count)]
        self.pods = []
        for index, (group, head, pod_name) in enumerate(groups):
            container = group["template"]["spec"]["containers"][0]
            argv = ray_start_argv(group, head, head_address=self.address)
            env = container_env(container, pod_name, secrets, token_secret)
            cpus = float(group["rayStartParams"].get("num-cpus", _limit(container, "cpu")))
            self.pods.append(PodCommand(pod_name, self._rewrite_argv(argv, head, index),
                                        self._rewrite_env(env), cpus))
        return self.pods

    def start(self) -> ManifestRehearsal:
        import atexit
        import tempfile


        if self.nodes:
            raise ClusterError("this cluster is already started; stop() it first")
        self.port, self.dashboard_port = pick_head_ports(self.port, self.dashboard_port)
        self.log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="distrl-rehearsal-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        Path(self.runs_dir or self.log_dir / "runs").mkdir(parents=True, exist_ok=True)
        self.runs_dir = self.runs_dir or self.log_dir / "runs"
        use_token_auth()
        atexit.register(self.stop)
        self._reaper = _start_reaper(self._state_file())
        try:
            for i, pod in enumerate(self.plan_pods()):
                # Ports of its own for every node on this machine, picked just before it starts:
                # ports picked earlier may be taken by the nodes started in between.
                head_ports = (self.port, self.dashboard_port) if i == 0 else ()
                pod.argv += _node_ports(i, head_ports=head_ports)
                self.join(lambda pod=pod: self._start_node(pod.name, pod.argv, pod.cpus, pod.env))
            self._wait_for_jobs_api()
        except BaseException:
            self.stop()
            raise
        return self

    def entrypoint(self, ray_job: dict, extra_args: list[str] = ()) -> str:
        """A RayJob's entrypoint with the run volume's path rewritten, plus extra arguments
        (argparse takes the last of a repeated option, so they override)."""
        command = ray_job["spec"]["entrypoint"].replace(RUNS_DIR, str(self.runs_dir))
        return command + "".join(f" {shlex.quote(a)}" for a in extra_args)
