"""A GKE cluster for Ape-X: the gcloud/kubectl plan, its dry run and live run, and a cost estimate.

    settings = GkeSettings(project_id="my-project", gpu_type="nvidia-l4", max_actor_nodes=4)
    plan = create_plan(settings, manifests_dir="runs/gke/manifests")
    dry_run(plan)                      # prints every command exactly as it would run
    run_plan(plan)                     # runs them, streaming output, stops at the first failure
    run_plan(teardown_plan(plan))      # deletes what the plan created, newest first

Every command is an argv list, never a shell string, and passes --project explicitly (the
user's gcloud configuration is not changed). Every resource name derives from one prefix and
carries the same labels, so what a plan made is easy to find and to delete.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from distrl import __version__

DEFAULT_TOKEN_FILE = Path.home() / ".ray" / "auth_token"
# The checkout that holds the Dockerfile (the package is installed editable from it).
REPO_ROOT = Path(__file__).resolve().parents[2]
RAY_VERSION = "2.60.0"  # tests check it against requirements.lock, the Dockerfile and k8s/
GPU_TYPES = ("nvidia-l4", "nvidia-tesla-t4", "nvidia-tesla-p4", "none")
MODES = ("standard", "autopilot")
APIS = ("container", "monitoring", "cloudtrace", "telemetry", "logging", "artifactregistry",
        "cloudbuild")
# Roles a pod needs to write metrics and traces (the Telemetry API role for OTLP to Google).
TELEMETRY_ROLES = ("roles/monitoring.metricWriter", "roles/cloudtrace.agent",
                   "roles/telemetry.metricsWriter")
MANAGED_OTEL_SCOPE = "COLLECTION_AND_INSTRUMENTATION_COMPONENTS"
MANAGED_OTEL_ENDPOINT = "http://opentelemetry-collector.gke-managed-otel.svc.cluster.local:4317"

# GCP naming rules (cloud.google.com/resource-manager/docs/creating-managing-projects,
# cloud.google.com/compute/docs/regions-zones, GKE cluster names).
PROJECT_ID_RE = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_REGION_RE = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_ZONE_RE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-[a-z]")
# The prefix names the cluster, pools, repository, service accounts and namespace; 20
# characters keep every derived name inside its own limit (service accounts: 30).
_PREFIX_RE = re.compile(r"[a-z](?:[a-z0-9-]{0,18}[a-z0-9])?")
_MACHINE_RE = re.compile(r"[a-z][a-z0-9]*-[a-z]+(?:-[0-9]+)?")


def check_project_id(project_id) -> str:
    """The project id if it follows GCP's rules, else ValueError naming it."""
    if not isinstance(project_id, str) or not PROJECT_ID_RE.fullmatch(project_id):
        raise ValueError(f"project_id={project_id!r} is invalid: expected a Google Cloud project "
                         "id (6-30 lowercase letters, digits or hyphens, starting with a letter)")
    return project_id


@dataclass(frozen=True)
class MachineType:
    vcpus: int
    memory_gib: float


# GPU node machine: L4 comes built into g2-*; T4 and P4 attach to n1-*.
GPU_MACHINES = {"nvidia-l4": "g2-standard-8", "nvidia-tesla-t4": "n1-standard-8",
                "nvidia-tesla-p4": "n1-standard-8", "none": "n2-standard-8"}


@dataclass(frozen=True)
class GkeSettings:
    """What the reader chooses for the cluster; checked against GCP's naming rules on creation."""

    project_id: str
    region: str = "us-central1"
    zone: str = "us-central1-a"
    prefix: str = "distrl"
    gpu_type: str = "nvidia-l4"
    max_actor_nodes: int = 4
    actor_machine_type: str = "e2-standard-8"
    mode: str = "standard"
    image_tag: str = f"{__version__}-ray{RAY_VERSION}"

    def __post_init__(self):
        problems = []
        if not isinstance(self.project_id, str) or not PROJECT_ID_RE.fullmatch(self.project_id):
            problems.append(f"project_id={self.project_id!r}: 6-30 characters, lowercase letters, "
                            "digits and hyphens, starting with a letter, not ending with a hyphen")
        elif "google" in self.project_id:
            problems.append(f"project_id={self.project_id!r}: may not contain 'google'")
        if not isinstance(self.region, str) or not _REGION_RE.fullmatch(self.region):
            problems.append(f"region={self.region!r}: a GCP region such as 'us-central1'")
        zone = _ZONE_RE.fullmatch(self.zone) if isinstance(self.zone, str) else None
        if not zone:
            problems.append(f"zone={self.zone!r}: a GCP zone such as 'us-central1-a'")
        elif zone.group(1) != self.region:
            problems.append(f"zone={self.zone!r} is not in region={self.region!r}")
        if not isinstance(self.prefix, str) or not _PREFIX_RE.fullmatch(self.prefix):
            problems.append(f"prefix={self.prefix!r}: 1-20 characters, lowercase letters, digits "
                            "and hyphens, starting with a letter, not ending with a hyphen")
        if self.gpu_type not in GPU_TYPES:
            problems.append(f"gpu_type={self.gpu_type!r}: one of {', '.join(GPU_TYPES)}")
        if not (isinstance(self.max_actor_nodes, int) and not isinstance(self.max_actor_nodes, bool)
                and 1 <= self.max_actor_nodes <= 1000):
            problems.append(f"max_actor_nodes={self.max_actor_nodes!r}: an integer from 1 to 1000")
        if not isinstance(self.actor_machine_type, str) or \
                self.actor_machine_type not in PRICES["machines"]:
            problems.append(f"actor_machine_type={self.actor_machine_type!r}: one of "
                            f"{', '.join(sorted(PRICES['machines']))} (the price table's types)")
        if self.mode not in MODES:
            problems.append(f"mode={self.mode!r}: one of {', '.join(MODES)}")
        if not isinstance(self.image_tag, str) or \
                not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", self.image_tag):
            problems.append(f"image_tag={self.image_tag!r}: a Docker tag (letters, digits, _ . -)")
        if problems:
            raise ValueError("invalid GKE settings: " + "; ".join(problems))

    # Every name derives from the prefix.
    @property
    def cluster(self) -> str:
        return f"{self.prefix}-cluster"

    @property
    def head_pool(self) -> str:
        return f"{self.prefix}-head"

    @property
    def actor_pool(self) -> str:
        return f"{self.prefix}-actors"

    @property
    def repository(self) -> str:
        return f"{self.prefix}-images"

    @property
    def namespace(self) -> str:
        return self.prefix

    @property
    def service_account(self) -> str:
        """Both the Kubernetes service account and the Google service account's id."""
        return f"{self.prefix}-ray"

    @property
    def gsa_email(self) -> str:
        return f"{self.service_account}@{self.project_id}.iam.gserviceaccount.com"

    @property
    def image(self) -> str:
        return (f"{self.region}-docker.pkg.dev/{self.project_id}/{self.repository}/distrl:"
                f"{self.image_tag}")

    @property
    def head_machine_type(self) -> str:
        return GPU_MACHINES[self.gpu_type]

    @property
    def labels(self) -> dict[str, str]:
        """GCP resource labels (lowercase keys and values, no dots or slashes)."""
        return {"app": "distrl", "distrl-prefix": self.prefix}

    @property
    def location_flag(self) -> str:
        """Standard clusters are zonal (one free-tier credit covers one), Autopilot is regional."""
        return f"--zone={self.zone}" if self.mode == "standard" else f"--region={self.region}"


@dataclass(frozen=True)
class Step:
    """One command of a plan; `teardown` undoes what it creates (None: nothing to undo)."""

    title: str
    argv: tuple[str, ...]
    why: str = ""
    teardown: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return shlex.join(self.argv)


def _labels_flag(settings: GkeSettings) -> str:
    return "--labels=" + ",".join(f"{k}={v}" for k, v in settings.labels.items())


def create_plan(settings: GkeSettings, manifests_dir: str | Path,
                auth_token_file: str | Path = DEFAULT_TOKEN_FILE,
                source_dir: str | Path = REPO_ROOT) -> list[Step]:
    """The ordered steps from an empty project to a verified Ray cluster.

    manifests_dir: where `distrl.manifests.write_manifests(settings, ...)` put the rendered
    manifests (`kubectl apply` reads them from there).
    auth_token_file: the Ray auth token the cluster will require; by default your own
    (~/.ray/auth_token), so the Jobs client on your machine works through port-forward.
    source_dir: what Cloud Build builds (the directory with the Dockerfile).
    """
    s, project = settings, f"--project={settings.project_id}"
    loc, labels = s.location_flag, _labels_flag(settings)
    manifests = Path(manifests_dir)
    steps = [Step(
        "Enable the APIs",
        ("gcloud", "services", "enable", *(f"{api}.googleapis.com" for api in APIS), project),
        "GKE, Cloud Monitoring, Cloud Trace, the Telemetry API (OTLP into Google Cloud), "
        "Cloud Logging, Artifact Registry and Cloud Build. Enabling twice is harmless.")]
    cluster_common = (f"--workload-pool={s.project_id}.svc.id.goog",
                      f"--managed-otel-scope={MANAGED_OTEL_SCOPE}", labels, project)
    delete_cluster = ("gcloud", "container", "clusters", "delete", s.cluster, loc, project,
                      "--quiet")
    if s.mode == "standard":
        steps.append(Step(
            "Create the Standard cluster",
            ("gcloud", "beta", "container", "clusters", "create", s.cluster, loc,
             "--release-channel=rapid", "--addons=RayOperator", "--enable-dataplane-v2",
             "--machine-type=e2-standard-4", "--num-nodes=1", *cluster_common),
            "One small on-demand node for system pods; Workload Identity; the Ray Operator "
            "add-on (KubeRay); Managed OpenTelemetry, whose collector forwards OTLP to Cloud "
            "Monitoring and Cloud Trace (GKE 1.34.1-gke.2178000 or later, hence the rapid "
            "channel); Dataplane V2 enforces the NetworkPolicy.",
            delete_cluster))
        head_accel = () if s.gpu_type == "none" else (
            f"--accelerator=type={s.gpu_type},count=1,gpu-driver-version=latest",)
        steps.append(Step(
            "Create the head node pool (on-demand" + ("" if s.gpu_type == "none" else ", GPU") + ")",
            ("gcloud", "container", "node-pools", "create", s.head_pool, f"--cluster={s.cluster}",
             loc, f"--machine-type={s.head_machine_type}", *head_accel, "--num-nodes=1",
             f"--node-labels=distrl/pool={s.head_pool}", labels, project),
            "The Ray head runs replay, learner and driver: not Spot, so a preemption never takes "
            "the replay memory. GKE installs the GPU driver (gpu-driver-version=latest).",
            ("gcloud", "container", "node-pools", "delete", s.head_pool, f"--cluster={s.cluster}",
             loc, project, "--quiet")))
        steps.append(Step(
            "Create the Spot CPU node pool for actors",
            ("gcloud", "container", "node-pools", "create", s.actor_pool,
             f"--cluster={s.cluster}", loc, f"--machine-type={s.actor_machine_type}", "--spot",
             "--enable-autoscaling", "--num-nodes=0", "--min-nodes=0",
             f"--max-nodes={s.max_actor_nodes}", f"--node-labels=distrl/pool={s.actor_pool}",
             labels, project),
            "Actors are stateless and restartable, so they run on Spot VMs (about 30 s notice "
            "before preemption). The pool scales from 0 to max_actor_nodes with the Ray "
            "autoscaler's requests.",
            ("gcloud", "container", "node-pools", "delete", s.actor_pool,
             f"--cluster={s.cluster}", loc, project, "--quiet")))
    else:
        steps.append(Step(
            "Create the Autopilot cluster",
            ("gcloud", "beta", "container", "clusters", "create-auto", s.cluster, loc,
             "--release-channel=rapid", "--enable-ray-operator", *cluster_common),
            "Autopilot makes nodes for the pods' requests: actors ask for Spot with the node "
            "selector cloud.google.com/gke-spot, the head for a GPU with "
            "cloud.google.com/gke-accelerator. Workload Identity is always on.",
            delete_cluster))
    steps += [
        Step("Create the Artifact Registry repository",
             ("gcloud", "artifacts", "repositories", "create", s.repository,
              "--repository-format=docker", f"--location={s.region}", labels, project),
             "Where Cloud Build pushes the training image.",
             ("gcloud", "artifacts", "repositories", "delete", s.repository,
              f"--location={s.region}", project, "--quiet")),
        Step("Build the image with Cloud Build",
             ("gcloud", "builds", "submit", str(source_dir), f"--tag={s.image}",
              f"--region={s.region}", project),
             "Builds the repository's Dockerfile in Google Cloud (no local Docker needed) from "
             "the same lock file as `make install`."),
        Step("Fetch cluster credentials for kubectl",
             ("gcloud", "container", "clusters", "get-credentials", s.cluster, loc, project),
             "Writes a kubeconfig entry; kubectl then talks to the new cluster."),
        Step("Create the Google service account for telemetry",
             ("gcloud", "iam", "service-accounts", "create", s.service_account,
              "--display-name=distrl Ray pods (metrics and traces)", project),
             "The identity the Ray pods act as in Google Cloud.",
             ("gcloud", "iam", "service-accounts", "delete", s.gsa_email, project, "--quiet")),
    ]
    for role in TELEMETRY_ROLES:
        binding = (f"--member=serviceAccount:{s.gsa_email}", f"--role={role}",
                   "--condition=None", project)
        steps.append(Step(
            f"Grant {role}", ("gcloud", "projects", "add-iam-policy-binding", s.project_id,
                              *binding),
            "Least privilege: write metrics and traces, nothing else.",
            ("gcloud", "projects", "remove-iam-policy-binding", s.project_id, *binding)))
    steps += [
        Step("Let the Kubernetes service account act as it (Workload Identity)",
             ("gcloud", "iam", "service-accounts", "add-iam-policy-binding", s.gsa_email,
              "--role=roles/iam.workloadIdentityUser",
              f"--member=serviceAccount:{s.project_id}.svc.id.goog"
              f"[{s.namespace}/{s.service_account}]", project),
             "The manifests annotate the Kubernetes service account with the Google one; no "
             "key file exists anywhere."),
        Step("Create the namespace and its service account",
             ("kubectl", "apply", f"--filename={manifests / 'cluster' / '00-namespace.yaml'}"),
             "The service account carries the Workload Identity annotation.",
             ("kubectl", "delete", "namespace", settings.namespace, "--ignore-not-found",
              "--wait=true")),
        Step("Store the Ray auth token as a Secret",
             ("kubectl", "create", "secret", "generic", f"{s.prefix}-ray-token",
              f"--namespace={s.namespace}", f"--from-file=auth_token={auth_token_file}"),
             "Ray keeps token authentication on; the pods read the token from this Secret. It "
             "is read from a file so it never appears in a command line or a manifest."),
        Step("Apply the manifests",
             ("kubectl", "apply", f"--filename={manifests / 'cluster'}", "--recursive"),
             "NetworkPolicy, run volume, the RayCluster (head + Spot actors group, TensorBoard "
             "beside the head) and the TensorBoard Service.",
             ("kubectl", "delete", f"--filename={manifests / 'cluster'}", "--recursive",
              "--ignore-not-found", "--wait=true")),
        Step("Wait for the Ray head pod",
             ("kubectl", "wait", f"--namespace={s.namespace}", "--for=condition=Ready", "pod",
              "--selector=ray.io/node-type=head", "--timeout=900s"),
             "The first start pulls the image and, with a GPU, waits for the driver install."),
        Step("Verify: list the pods",
             ("kubectl", "get", "pods", f"--namespace={s.namespace}", "--output=wide")),
        Step("Verify: `ray status` in the head",
             ("kubectl", "exec", f"--namespace={s.namespace}", f"service/{s.prefix}-head-svc",
              "--container=ray-head", "--", "ray", "status"),
             "Nodes, CPUs and GPUs as Ray sees them. Actor nodes appear when work asks for them."),
    ]
    return steps


def teardown_plan(plan: Sequence[Step]) -> list[Step]:
    """The teardown twins of a plan's steps, newest first: deletes exactly what it created."""
    return [Step(f"Undo: {step.title}", step.teardown) for step in reversed(plan)
            if step.teardown is not None]


def dry_run(plan: Sequence[Step], out: Callable[[str], None] = print, explain: bool = True) -> None:
    """Print every step's command exactly as run_plan would run it (copy-pasteable)."""
    for i, step in enumerate(plan, 1):
        out(f"# {i}. {step.title}")
        if explain and step.why:
            out(f"#    {step.why}")
        out(str(step))


class StepFailed(RuntimeError):
    """A command of the plan exited non-zero; later steps did not run."""

    def __init__(self, step: Step, returncode: int, stderr: str):
        self.step, self.returncode, self.stderr = step, returncode, stderr
        super().__init__(f"step {step.title!r} failed with exit code {returncode}\n"
                         f"command: {step}\nstderr:\n{stderr.strip() or '(empty)'}")


def run_plan(plan: Sequence[Step], out: Callable[[str], None] = print) -> None:
    """Run the steps in order, streaming their output; stop at the first failure (StepFailed)."""
    for i, step in enumerate(plan, 1):
        out(f"# {i}/{len(plan)}. {step.title}")
        out(f"$ {step}")
        returncode, stderr = _stream(step.argv, out)
        if returncode != 0:
            raise StepFailed(step, returncode, stderr)


def _stream(argv: Sequence[str], out: Callable[[str], None]) -> tuple[int, str]:
    """Run argv, passing each output line to `out` as it comes; returns (code, stderr)."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, bufsize=1)
    except FileNotFoundError:
        return 127, f"{argv[0]}: command not found on PATH"
    err_lines: list[str] = []

    def pump_stderr():
        for line in proc.stderr:
            err_lines.append(line)
            out(line.rstrip("\n"))

    pump = threading.Thread(target=pump_stderr, daemon=True)
    pump.start()
    for line in proc.stdout:
        out(line.rstrip("\n"))
    code = proc.wait()
    pump.join()
    return code, "".join(err_lines)


def ensure_auth_token(path: str | Path = DEFAULT_TOKEN_FILE) -> Path:
    """The Ray auth token file the cluster's Secret is made from; created (mode 600) if missing.

    Ray reads the same file on this machine, so the Jobs client works through port-forward."""
    import secrets

    path = Path(path).expanduser()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32))
    return path


class PrerequisiteError(RuntimeError):
    """Something the live run needs is missing; nothing has run."""


def check_prerequisites(settings: GkeSettings) -> str:
    """gcloud, kubectl and the GKE auth plugin on PATH, an authenticated account, the project
    reachable and active. Returns the account; raises PrerequisiteError listing every problem."""
    problems = []
    tools = {"gcloud": "install the Google Cloud CLI: https://cloud.google.com/sdk/docs/install",
             "kubectl": "run `gcloud components install kubectl`",
             "gke-gcloud-auth-plugin": "run `gcloud components install gke-gcloud-auth-plugin`"}
    for tool, fix in tools.items():
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not on PATH: {fix}")
    if shutil.which("gcloud") is None:
        raise PrerequisiteError("cannot run the live plan: " + "; ".join(problems))
    account = _capture(["gcloud", "auth", "list", "--filter=status:ACTIVE",
                        "--format=value(account)"]).strip()
    if not account:
        problems.append("no authenticated gcloud account: run `gcloud auth login`")
    else:
        state = _capture(["gcloud", "projects", "describe", settings.project_id,
                          "--format=value(lifecycleState)"]).strip()
        if state != "ACTIVE":
            problems.append(f"project {settings.project_id!r} is not reachable as {account} "
                            f"(state {state or 'unknown'}): check the id and your access with "
                            f"`gcloud projects describe {settings.project_id}`")
    if problems:
        raise PrerequisiteError("cannot run the live plan: " + "; ".join(problems))
    return account.splitlines()[0]


def _capture(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else ""


# --- cost ---------------------------------------------------------------------------------

# Approximate list prices in USD per hour, us-central1. Spot prices move (up to once a day):
# pass your own table to estimate_cost() for a decision that matters.
PRICES = {
    "date": "2026-11",
    "source": "cloud.google.com/compute/vm-instance-pricing, /compute/gpus-pricing and "
              "/kubernetes-engine/pricing, us-central1 list prices (approximate)",
    "currency": "USD",
    "cluster_fee": 0.10,
    "machines": {  # vcpus, memory GiB, on-demand, spot
        "e2-standard-4": [4, 16, 0.134, 0.040],
        "e2-standard-8": [8, 32, 0.268, 0.080],
        "e2-standard-16": [16, 64, 0.536, 0.161],
        "e2-standard-32": [32, 128, 1.072, 0.322],
        "n2-standard-8": [8, 32, 0.389, 0.094],
        "n2-standard-32": [32, 128, 1.554, 0.376],
        "n1-standard-8": [8, 30, 0.380, 0.080],
        "g2-standard-8": [8, 32, 0.854, 0.341],  # includes its L4
    },
    "gpus": {  # per attached GPU: on-demand, spot (the L4 is in g2's price)
        "nvidia-l4": [0.0, 0.0],
        "nvidia-tesla-t4": [0.350, 0.140],
        "nvidia-tesla-p4": [0.600, 0.240],
    },
    "autopilot": {  # per vCPU-hour and GiB-hour of pod requests: on-demand, spot
        "vcpu": [0.0445, 0.0133],
        "memory_gib": [0.0049225, 0.0014767],
        "gpu": {"nvidia-l4": [0.5600, 0.2240], "nvidia-tesla-t4": [0.3500, 0.1400],
                "nvidia-tesla-p4": [0.6000, 0.2400]},
    },
}


def machine(name: str, prices: dict = PRICES) -> MachineType:
    vcpus, memory, *_ = prices["machines"][name]
    return MachineType(vcpus, memory)


@dataclass(frozen=True)
class CostLine:
    item: str
    count_min: int
    count_max: int
    unit_per_hour: float

    @property
    def min_per_hour(self) -> float:
        return self.count_min * self.unit_per_hour

    @property
    def max_per_hour(self) -> float:
        return self.count_max * self.unit_per_hour


@dataclass(frozen=True)
class CostEstimate:
    lines: list[CostLine]
    currency: str
    date: str
    source: str

    @property
    def min_per_hour(self) -> float:
        return sum(line.min_per_hour for line in self.lines)

    @property
    def max_per_hour(self) -> float:
        return sum(line.max_per_hour for line in self.lines)

    def table(self) -> str:
        rows = [f"{'item':<52} {'count':>7} {'each/h':>8} {'max/h':>8}"]
        for line in self.lines:
            count = (str(line.count_max) if line.count_min == line.count_max
                     else f"{line.count_min}-{line.count_max}")
            rows.append(f"{line.item:<52} {count:>7} {line.unit_per_hour:>8.3f} "
                        f"{line.max_per_hour:>8.3f}")
        rows.append(f"about {self.min_per_hour:.2f}-{self.max_per_hour:.2f} {self.currency} per "
                    f"hour (idle actors to all {self.lines[-1].count_max} actor "
                    f"{'nodes' if 'node' in self.lines[-1].item else 'pods'}); prices of "
                    f"{self.date}, {self.source}")
        return "\n".join(rows)


def estimate_cost(settings: GkeSettings, prices: dict | str | Path = PRICES) -> CostEstimate:
    """Cost per hour of the cluster the plan creates, from a price table (dict or JSON file)."""
    if not isinstance(prices, dict):
        prices = json.loads(Path(prices).read_text())
    missing = [k for k in ("date", "source", "currency", "cluster_fee", "machines", "gpus",
                           "autopilot") if k not in prices]
    if missing:
        raise ValueError(f"price table lacks {', '.join(missing)}; see distrl.gke.PRICES")
    s, lines = settings, [CostLine("GKE cluster management fee", 1, 1, prices["cluster_fee"])]
    from distrl.manifests import pod_sizes  # the pods' requests decide Autopilot's price

    if s.mode == "standard":
        on_demand, spot = 2, 3
        lines.append(CostLine("system node e2-standard-4 (on-demand)", 1, 1,
                              prices["machines"]["e2-standard-4"][on_demand]))
        head = prices["machines"][s.head_machine_type][on_demand]
        gpu = "" if s.gpu_type == "none" else f" + {s.gpu_type}"
        if s.gpu_type != "none":
            head += prices["gpus"][s.gpu_type][0]
        lines.append(CostLine(f"head node {s.head_machine_type}{gpu} (on-demand)", 1, 1, head))
        lines.append(CostLine(f"actor nodes {s.actor_machine_type} (Spot)", 0, s.max_actor_nodes,
                              prices["machines"][s.actor_machine_type][spot]))
    else:
        ap = prices["autopilot"]
        sizes = pod_sizes(s)

        def pod_price(size, spot: bool) -> float:
            k = 1 if spot else 0
            return size.cpu * ap["vcpu"][k] + size.memory_gib * ap["memory_gib"][k]

        head = pod_price(sizes["head"], spot=False)
        if s.gpu_type != "none":
            head += ap["gpu"][s.gpu_type][0]
        lines.append(CostLine("head pod (Autopilot, on-demand)", 1, 1, head))
        lines.append(CostLine("actor pods (Autopilot Spot)", 0, s.max_actor_nodes,
                              pod_price(sizes["actor"], spot=True)))
    return CostEstimate(lines, prices["currency"], prices["date"], prices["source"])


def settings_dict(settings: GkeSettings) -> dict:
    return dataclasses.asdict(settings)


def main(argv: list[str] | None = None) -> int:
    """`distrl gke plan|create|teardown|cost ...`: the plan from the command line."""
    import argparse

    from distrl import manifests as k8s

    parser = argparse.ArgumentParser(prog="distrl gke", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["plan", "create", "teardown", "cost", "render"])
    parser.add_argument("--project-id", required=True)
    for field in dataclasses.fields(GkeSettings):
        if field.name != "project_id":
            parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default),
                                default=field.default)
    parser.add_argument("--manifests-dir", default="runs/gke/manifests")
    parser.add_argument("--auth-token-file", default=str(DEFAULT_TOKEN_FILE),
                        help="the Ray auth token for the cluster (created if missing)")
    args = parser.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(GkeSettings)}
    try:
        settings = GkeSettings(**values)
    except ValueError as e:
        parser.error(str(e))
    if args.action == "cost":
        print(estimate_cost(settings).table())
        return 0
    k8s.write_manifests(settings, args.manifests_dir)
    plan = create_plan(settings, args.manifests_dir, args.auth_token_file)
    if args.action in ("render", "plan"):
        if args.action == "plan":
            dry_run(plan)
        return 0
    try:
        check_prerequisites(settings)
        if args.action == "create":
            ensure_auth_token(args.auth_token_file)
        run_plan(plan if args.action == "create" else teardown_plan(plan))
    except (PrerequisiteError, StepFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
