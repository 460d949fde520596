"""Training as a Ray job through the Jobs API: submit, follow its logs, fetch what it wrote.

    client = cluster.job_client()   # or JobSubmissionClient("http://127.0.0.1:8265") after
                                    # `kubectl port-forward service/distrl-head-svc 8265:8265`
    job_id = submit_training(client, ["--env", "CartPole-v1", "--num-actors", "4"],
                             output_dir="runs/04/job")
    status = follow(client, job_id, timeout_s=600)   # streams its log lines until it ends
    if status == "RUNNING":
        status = stop(client, job_id)                  # over time: SIGTERM, checkpoint, end
    results = fetch(output_dir, "runs/04/fetched")

The entrypoint is the package's own training command, exactly what the RayJob in k8s/job runs.
Output directories may be local paths or URIs (gs://bucket/path) read through fsspec.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from distrl.gke.settings import NODE_READY_S, WORKLOADS, parse_quantity

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
_shown: dict[str, int] = {}  # job id -> characters of its log already printed


def training_entrypoint(train_args: Sequence[str], output_dir: str) -> str:
    """The job's shell command: `python -m distrl.apex.train ... --output-dir DIR` (quoted)."""
    if any(a == "--output-dir" or a.startswith("--output-dir=") for a in train_args):
        raise ValueError("train_args must not contain --output-dir; pass output_dir instead")
    return shlex.join(["python", "-m", "distrl.apex.train", *train_args, "--progress", "false",
                       "--output-dir", str(output_dir)])


# Notebook 04's Pong job. "smoke": a few hundred frames through every part (one actor, a small
# replay, one update), minutes on any cluster; "full": the workload's run (WORKLOADS["pong"],
# hours of a GPU head and a Spot pool, the reader's money), on GKE only and only when asked.
PONG_MODES = ("smoke", "full", "off")
PONG_SMOKE_SECONDS = 120
PONG_SMOKE_ARGS = ("--hidden-sizes", "512", "--num-actors", "1", "--actor-cpus", "1",
                   "--envs-per-actor", "2", "--actor-block-steps", "50", "--replay-capacity",
                   "2000", "--min-replay-size", "200", "--batch-size", "32",
                   "--batches-per-fetch", "1", "--max-learner-updates", "1", "--target-return",
                   "none", "--eval-episodes", "1")


def pong_job_args(mode: str, cluster: str, live_spec: dict | None = None,
                  settings=None) -> list[str] | None:
    """The training options of notebook 04's Pong job (None for "off"). On GKE a smoke job
    waits for a Spot node (autoscaling), its budget longer by NODE_READY_S; the full run takes
    its actors and GPU from the live RayCluster's spec (`kubectl get raycluster -o json`), and
    only from the pool notebook 03 makes and prices for Pong with the cluster's own prefix,
    mode and location (settings: GkeSettings.from_kube_context; None: 03's defaults)."""
    if mode not in PONG_MODES:
        raise ValueError(f"PONG={mode!r}: expected one of {', '.join(map(repr, PONG_MODES))}")
    if cluster not in ("local", "gke"):
        raise ValueError(f"cluster={cluster!r}: expected 'local' or 'gke'")
    pong = WORKLOADS["pong"]
    if mode == "off":
        return None
    if mode == "smoke":
        seconds = PONG_SMOKE_SECONDS + (NODE_READY_S if cluster == "gke" else 0)
        wait = ["--autoscaling", "true"] if cluster == "gke" else []
        return ["--env", pong.env_id, *PONG_SMOKE_ARGS, "--max-seconds", f"{seconds:g}", *wait]
    if cluster != "gke" or live_spec is None:
        raise ValueError("PONG='full' is the workload's run on GKE (hours, a GPU and "
                         f"{pong.max_actor_nodes} Spot nodes), from the live RayCluster's spec; "
                         "on this machine use 'smoke'")
    from distrl.gke import manifests

    differences = pool_differences(live_spec, pong_pool_spec(settings))
    if differences:
        raise ValueError(
            "PONG='full' would train on the live cluster's pool, and its price is the Pong "
            f"pool's, which differs: {'; '.join(differences[:4])}: create the cluster with "
            "WORKLOAD = 'pong' in notebook 03, or use PONG = 'smoke'")
    return [*pong.command_args(), *manifests.cluster_train_args(live_spec),
            "--autoscaling", "true"]


def pong_pool_spec(settings=None) -> dict:
    """The RayCluster spec notebook 03 makes for WORKLOAD = 'pong' (the pool that
    estimate_run_cost prices for it), with the prefix, mode and location of `settings` (a
    cluster made with PREFIX 'rl' or on Autopilot is Pong's pool too)."""
    from distrl.gke import manifests
    from distrl.gke.settings import GkeSettings

    where = {} if settings is None else {
        "project_id": settings.project_id, "prefix": settings.prefix, "mode": settings.mode,
        "region": settings.region, "zone": settings.zone}
    return manifests.ray_cluster_spec(GkeSettings.for_workload(
        "pong", **({"project_id": "any-project"} | where)))


def pool_shape(spec: dict) -> dict[str, object]:
    """What of a RayCluster's spec decides the pool a run takes and bills, by name: each worker
    group's size, Ray CPUs, pod resources and node selector (the Spot pool, the machine's
    share), and the head's resources and node selector (its GPU, its pool)."""
    def pod(prefix: str, template: dict) -> dict:
        container = template["spec"]["containers"][0]
        shape = {f"{prefix} nodeSelector": template["spec"].get("nodeSelector", {})}
        for kind, amounts in container.get("resources", {}).items():
            for name, amount in amounts.items():
                shape[f"{prefix} {kind}.{name}"] = parse_quantity(amount)
        return shape

    shape = pod("head", spec["headGroupSpec"]["template"])
    for group in spec.get("workerGroupSpecs", []):
        name = f"worker group {group.get('groupName', '?')}"
        shape |= {f"{name} maxReplicas": group.get("maxReplicas"),
                  f"{name} num-cpus": parse_quantity(group.get("rayStartParams", {})
                                                    .get("num-cpus", 0)),
                  **pod(name, group["template"])}
    return shape


def pool_differences(live_spec: dict, planned_spec: dict) -> list[str]:
    """'name: live X, planned Y' for each part of the pool where the specs differ."""
    live, planned = pool_shape(live_spec), pool_shape(planned_spec)
    return [f"{key}: live {live.get(key)!r}, planned {planned.get(key)!r}"
            for key in sorted(live.keys() | planned.keys()) if live.get(key) != planned.get(key)]


def submit_training(client, train_args: Sequence[str], output_dir: str,
                    submission_id: str | None = None, env_vars: dict | None = None) -> str:
    """Submit the training command as a Ray job; returns its submission id."""
    # `ray job stop` sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (Ray's default
    # 3 s: ray/dashboard/modules/job/job_supervisor.py); the driver's stop sequence needs up to
    # SHUTDOWN_S (20 s) for the final checkpoint and results.json.
    runtime_env = {"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2", "RAY_JOB_STOP_WAIT_TIME_S": "25",
                                **(env_vars or {})}}
    return client.submit_job(entrypoint=training_entrypoint(train_args, output_dir),
                             submission_id=submission_id, runtime_env=runtime_env)


def follow(client, job_id: str, timeout_s: float, out: Callable[[str], None] = print,
           poll_s: float = 0.5, until: Callable[[], bool] | None = None) -> str:
    """Print the job's new log lines as they come; return its final status, or the current one
    when `until()` becomes true or timeout_s passes (the job goes on: `stop` ends it). A later
    call goes on where this one stopped, so following a job in several cells prints every line
    once."""
    if not (isinstance(timeout_s, int | float) and timeout_s > 0):
        raise ValueError(f"timeout_s={timeout_s!r}: expected a number of seconds > 0 (a job "
                         "that never ends must not hang the caller)")
    shown = _shown.get(job_id, 0)
    deadline = time.monotonic() + timeout_s
    while True:
        status = str(client.get_job_status(job_id).value)
        logs = client.get_job_logs(job_id)
        for line in logs[shown:].splitlines():
            out(line)
        shown = _shown[job_id] = len(logs)
        if status in TERMINAL or (until is not None and until()):
            return status
        if time.monotonic() > deadline:
            return status
        time.sleep(poll_s)


def stop(client, job_id: str, timeout_s: float = 30.0) -> str:
    """Stop a job (SIGTERM to its driver, which checkpoints and writes results.json) and wait
    up to timeout_s for it to end; returns its status."""
    if str(client.get_job_status(job_id).value) not in TERMINAL:
        client.stop_job(job_id)
    deadline = time.monotonic() + timeout_s
    while (status := str(client.get_job_status(job_id).value)) not in TERMINAL:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return status


def follow_or_stop(client, job_id: str, timeout_s: float,
                   out: Callable[[str], None] = print) -> str:
    """Follow a job to its end; past timeout_s, stop it (SIGTERM: a final checkpoint)."""
    status = follow(client, job_id, timeout_s, out=out)
    if status == "RUNNING":
        out(f"still running after {timeout_s:.0f} s: stopping it")
        status = stop(client, job_id)
    return status


class JobLog:
    """Every line of the followed jobs' logs, kept; the lines that tell the story (the driver's
    `[distrl]` lines, the autoscaler's, the final one) printed. Pass `add` as follow()'s out."""

    STORY = ("[distrl]", "[autoscaler]", "still running after", "error: ")

    def __init__(self, out: Callable[[str], None] = print, story: Sequence[str] = STORY):
        self.lines: list[str] = []
        self.out, self.story = out, tuple(story)

    def add(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith(self.story) or ": reached " in line or ": stopped (" in line:
            self.out(line)

    def said(self, text: str, after: int = 0) -> bool:
        """Whether a line from the after-th on contains text."""
        return any(text in line for line in self.lines[after:])

    def mark(self) -> int:
        """The position of the next line, for said(..., after=mark)."""
        return len(self.lines)


def fetch(output_dir: str, local_dir: str | Path) -> Path:
    """Copy a run's results.json and checkpoints from output_dir (a path or a URI) to local_dir."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(str(output_dir))
    local = Path(local_dir)
    local.mkdir(parents=True, exist_ok=True)
    if not fs.exists(f"{root}/results.json"):
        raise FileNotFoundError(f"{output_dir}/results.json does not exist (has the job ended?)")
    fs.get(f"{root}/results.json", str(local / "results.json"))
    if fs.exists(f"{root}/checkpoints"):
        (local / "checkpoints").mkdir(exist_ok=True)
        for path in fs.glob(f"{root}/checkpoints/checkpoint-*"):
            fs.get(path, str(local / "checkpoints" / Path(path).name))
    return local


MAX_COPY_BYTES = 4 * 2**30   # what copy_from_head unpacks at most (a run's results, logs,
MAX_COPY_FILES = 100_000     # checkpoints); more is refused, not written


def copy_from_head(remote_dir: str, local_dir: str | Path, context: str,
                   namespace: str = "distrl", container: str = "ray-head",
                   timeout_s: float = 1800.0) -> Path:
    """GKE: copy a job's output directory from the Ray head pod, e.g. the results.json and
    TensorBoard logs a job wrote under the head's run volume.

    The pod runs code of anyone with Jobs API access, so what it sends is untrusted: the tar
    it streams (`kubectl exec ... tar cf -`) is unpacked here with Python's "data" filter
    (absolute paths made relative, no `..`, no links out of local_dir, no devices, no set-uid bits) and
    within MAX_COPY_BYTES and MAX_COPY_FILES, rather than by `kubectl cp`. `context`: the
    cluster's kubeconfig context (GkeSettings.kube_context), named in every command."""
    def kubectl(*args: str) -> str:
        proc = subprocess.run(["kubectl", f"--context={context}", *args], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {shlex.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout.strip()

    pod = kubectl("get", "pods", f"--namespace={namespace}", "--selector=ray.io/node-type=head",
                  "--output=jsonpath={.items[0].metadata.name}")
    if not pod:
        raise RuntimeError(f"no Ray head pod in namespace {namespace!r}")
    local = Path(local_dir)
    local.mkdir(parents=True, exist_ok=True)
    args = [f"--context={context}", "exec", f"--namespace={namespace}", pod,
            f"--container={container}", "--", "tar", "cf", "-", "-C", remote_dir, "."]
    with subprocess.Popen(["kubectl", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        timer = threading.Timer(timeout_s, proc.kill)  # nothing waits forever
        timer.start()
        try:
            unpack_tar(proc.stdout, local)
        except (tarfile.TarError, ValueError) as problem:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)  # a kubectl that failed sent no tar: report its error
            if proc.returncode is None or proc.returncode == 0:
                proc.kill()
                raise
            raise RuntimeError(f"kubectl {shlex.join(args)} failed: "
                               f"{proc.stderr.read().decode(errors='replace').strip()}"
                               ) from problem
        finally:
            timer.cancel()
        err = proc.stderr.read().decode(errors="replace").strip()
        if proc.wait() != 0:
            raise RuntimeError(f"kubectl {shlex.join(args)} failed: {err}")
    return local


def unpack_tar(stream, destination: Path, max_bytes: int = MAX_COPY_BYTES,
               max_files: int = MAX_COPY_FILES) -> int:
    """Unpack an untrusted tar stream into destination; returns the files written. A member
    that would land outside it, a link out of it, a device, or more than max_bytes or
    max_files in all raise tarfile.FilterError or ValueError (members before it stay)."""
    files = total = 0
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            files += 1
            total += member.size
            if files > max_files:
                raise ValueError(f"the archive holds more than {max_files:,} files; refused "
                                 f"at {member.name[:100]!r}")
            if total > max_bytes:
                raise ValueError(f"the archive holds more than {max_bytes:,} bytes; refused "
                                 f"at {member.name[:100]!r}")
            archive.extract(member, destination, filter="data")
    return files
