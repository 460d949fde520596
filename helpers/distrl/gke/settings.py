"""What a GKE cluster for Ape-X is: GkeSettings (every name, size and endpoint derives from it),
the constants the plan, the manifests, the preflight checks and the cost estimate share, and the
machine shapes they size pods with. The bottom of distrl.gke: it imports nothing of the package
but its version.

    settings = GkeSettings(project_id="my-project", gpu_type="nvidia-l4", max_actor_nodes=4)
    settings.cluster, settings.image, settings.otlp_endpoint   # the names everything else uses
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from distrl import __version__

# The checkout that holds the Dockerfile (the package is installed editable from it).
REPO_ROOT = Path(__file__).resolve().parents[3]
RAY_VERSION = "2.60.0"  # tests check it against requirements.lock, the Dockerfile and k8s/
# The Python of the image every pod runs: the Ray image's -py311 tag (Dockerfile), checked there
# when the image is built and by `distrl train` in the pods (DISTRL_IMAGE_PYTHON). The reader's
# own Python may differ: Ray's Jobs API, which notebook 04 submits through, runs the driver in
# the pod (docs.ray.io/en/latest/cluster/running-applications/job-submission).
IMAGE_PYTHON = "3.11"
IMAGE_PYTHON_ENV = "DISTRL_IMAGE_PYTHON"
GPU_TYPES = ("nvidia-l4", "nvidia-tesla-t4", "nvidia-tesla-p4", "none")
MODES = ("standard", "autopilot")
APIS = ("container", "compute", "iam", "iamcredentials", "monitoring", "cloudtrace",
        "telemetry", "logging", "artifactregistry", "cloudbuild", "storage",
        "containerfilesystem")  # image streaming (docs/how-to/image-streaming)
# Roles a pod needs to write metrics and traces (the Telemetry API role for OTLP to Google).
TELEMETRY_ROLES = ("roles/monitoring.metricWriter", "roles/cloudtrace.agent",
                   "roles/telemetry.metricsWriter")
MANAGED_OTEL_SCOPE = "COLLECTION_AND_INSTRUMENTATION_COMPONENTS"
# Managed OpenTelemetry's in-cluster endpoint. The concept page documents OTLP/HTTP on 4318
# (cloud.google.com/kubernetes-engine/docs/concepts/managed-otel-gke); gRPC export is stated
# only from GKE 1.37.1-gke.1697000 (docs/how-to/managed-otel-gke, Requirements), so HTTP is the
# default and the plan checks the Service's ports and the GKE version before anything uses them.
MANAGED_OTEL_NAMESPACE = "gke-managed-otel"
MANAGED_OTEL_HOST = f"opentelemetry-collector.{MANAGED_OTEL_NAMESPACE}.svc.cluster.local"
OTLP_PORTS = {"http/protobuf": 4318, "grpc": 4317}
SYSTEM_MACHINE = "e2-standard-4"  # the default pool's one node, for GKE's system pods
DISK_GB = 50  # every node's pd-balanced boot disk (GKE's default is 100 GB): the image is ~8 GB
# `gcloud builds submit`: gcloud documents 10 minutes when its builds/timeout property is unset
# (the Build API's own default is 60), short for the image (Ray, TensorFlow and ~2.5 GB of CUDA
# wheels): the plan says how long, explicitly. BUILD_MINUTES is the cost box's estimate.
BUILD_TIMEOUT = "7200s"
BUILD_MINUTES = 30
# Projects created since mid-2024 build as the Compute Engine default service account, which
# may hold no roles at all (cloud.google.com/build/docs/cloud-build-service-account-updates):
# the plan builds as its own account holding exactly these.
BUILD_LOG_ROLE = "roles/logging.logWriter"
BUILD_PUSH_ROLE = "roles/artifactregistry.writer"
# A build that writes its logs to a user-created bucket needs Storage Admin on it for the build's
# service account (cloud.google.com/build/docs/securing-builds/store-manage-build-logs).
BUILD_BUCKET_ROLE = "roles/storage.admin"
# "Some projects may be restricted to using Cloud Build only in specific regions" (Cloud Build
# locations, cloud.google.com/build/docs/locations: these six); elsewhere such a project's build
# fails with FAILED_PRECONDITION. The image is built in one of them and pushed to the
# repository in the cluster's region (a push crosses regions).
BUILD_REGIONS = ("us-central1", "us-west2", "europe-west1", "asia-east1", "australia-southeast1",
                 "southamerica-east1")
# Nodes run as their own service account: in organizations created since 2024-05-03
# iam.automaticIamGrantsForDefaultServiceAccounts is enforced and the Compute Engine default
# account holds no roles, so nodes running as it cannot pull the image
# (cloud.google.com/artifact-registry/docs/integrate-gke). A node account needs
# roles/container.defaultNodeServiceAccount on the project ("configure node service accounts",
# cloud.google.com/kubernetes-engine/docs/how-to/service-accounts) and Artifact Registry Reader
# on the repository to pull (image pulls use the node's account even with Workload Identity).
NODE_ROLE = "roles/container.defaultNodeServiceAccount"
NODE_PULL_ROLE = "roles/artifactregistry.reader"
# Image streaming with a node account other than the default needs Service Usage Consumer on the
# project that holds the image (cloud.google.com/kubernetes-engine/docs/how-to/image-streaming,
# "Requirements"); without it the nodes pull the whole image.
NODE_STREAM_ROLE = "roles/serviceusage.serviceUsageConsumer"
# `gcloud container clusters get-credentials` names its kubeconfig context
# gke_PROJECT_LOCATION_CLUSTER; every kubectl command names it, so a teardown after switching
# clusters never deletes on the other one.
KUBE_CONTEXT = "gke_{project}_{location}_{cluster}"
# Check steps that read what the cluster's add-ons install (the managed collector's Service,
# KubeRay's CRD) ask again for this long: create returns before every add-on has rolled out.
ADDON_ROLLOUT_S = 300.0
# How long the plan asks again for a new service account before it judges: "you might need to
# wait for 60 seconds or more" (cloud.google.com/iam/docs/service-accounts-create).
SERVICE_ACCOUNT_VISIBLE_S = 180.0
# How long a new Ray pod may take to be ready: a node to start and an image of about 8 GB to be
# pulled (with a GPU, the driver install too). The plan waits this long for the head; notebook 04
# gives a job on GKE this much more than a local one, for its Spot actor nodes.
NODE_READY_S = 900.0
# How long the cluster autoscaler keeps a node it no longer needs before it removes it: the
# default scale-down-unneeded-time, "10 minutes" (kubernetes/autoscaler cluster-autoscaler/
# FAQ.md). The plan's optimize-utilization profile removes nodes "faster" (GKE's autoscaling
# profiles), without a figure: the estimate keeps the 10 minutes as its bound.
NODE_UNNEEDED_S = 600.0

# GCP naming rules (cloud.google.com/resource-manager/docs/creating-managing-projects,
# cloud.google.com/compute/docs/regions-zones, GKE cluster names).
PROJECT_ID_RE = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_REGION_RE = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_ZONE_RE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-[a-z]")
# The prefix names the cluster, pools, repository, service accounts and namespace; 20
# characters keep every derived name inside its own limit (service accounts: 30).
_PREFIX_RE = re.compile(r"[a-z](?:[a-z0-9-]{0,18}[a-z0-9])?")


def check_project_id(project_id) -> str:
    """The project id if it follows GCP's rules, else ValueError naming it."""
    if not isinstance(project_id, str) or not PROJECT_ID_RE.fullmatch(project_id):
        raise ValueError(f"project_id={project_id!r} is invalid: expected a Google Cloud project "
                         "id (6-30 lowercase letters, digits or hyphens, starting with a letter)")
    return project_id


# GPU node machine: L4 comes built into g2-*; T4 and P4 attach to n1-*.
GPU_MACHINES = {"nvidia-l4": "g2-standard-8", "nvidia-tesla-t4": "n1-standard-8",
                "nvidia-tesla-p4": "n1-standard-8", "none": "n2-standard-8"}
# The vCPUs a VM with one such GPU may have (cloud.google.com/compute/docs/gpus, updated
# 2026-04-14: "N1 instances with fewer GPUs limit the maximum number of vCPUs"; one T4 allows 1 to
# 48, one P4 1 to 24). An L4 comes only in fixed G2 shapes: g2-standard-4 to -16 and -32 have one
# L4 (4 to 32 vCPUs), g2-standard-24 has two (cloud.google.com/compute/docs/accelerator-optimized-machines).
ONE_GPU_VCPUS = {"nvidia-l4": (4, 32), "nvidia-tesla-t4": (1, 48), "nvidia-tesla-p4": (1, 24)}


@dataclass(frozen=True)
class Workload:
    """A training the RayJob runs: its env, the distrl.apex.train options it gets besides the
    cluster's (manifests.cluster_train_args), and the run's wall-clock budget, which its
    --max-seconds enforces and its cost estimate covers (cost.estimate_run_cost)."""

    env_id: str
    train_args: tuple[str, ...]
    run_hours: float
    actor_machine_type: str = "e2-standard-8"  # the Spot actor pool it is sized for
    max_actor_nodes: int = 4

    def command_args(self) -> list[str]:
        return ["--env", self.env_id, *self.train_args,
                "--max-seconds", str(round(self.run_hours * 3600))]

    def options(self) -> dict[str, str]:
        """Its options that take a value, by flag ("--replay-shards": "2")."""
        return option_values(self.command_args())


def option_values(args) -> dict[str, str]:
    """The options of a command line that take a value, by flag."""
    return {flag: value for flag, value in zip(args, args[1:]) if flag.startswith("--")
            and not value.startswith("--")}


# What notebook 04 runs on GKE. "pong" is Ape-X's own domain, Atari from pixels: a GPU learner,
# the Nature DQN torso, and Spot actors stepping 84x84x4 frames.
#
# Ape-X's values as a reimplementation gives them (kakaoenterprise/JORLDY,
# jorldy/config/ape_x/atari.py: n = 3, a distributed batch of 512, the target copied every
# 2,500 updates, priority exponents 0.6 and 0.4, 2 M transitions, learning from 50,000).
# Second-hand, not read in the paper (Horgan et al. 2018, arXiv 1803.00933, whose body could
# not be read from here): the optimiser (JORLDY: centred RMSProp at 0.00025 / 4, gradient norm
# clipped at 40; here Adam at 0.0001), whether the dueling streams share a layer, the learner's
# 19 batches of 512 a second on a 2018 GPU and the 360 actors at about 139 frames/s each.
#
# The replay path, from `python benchmarks/learner_feed.py` (results/learner_feed.txt): through
# Ray a batch of 512 costs a shard about 13 ms of CPU and the learner 7, so on the head pod's
# 5 vCPUs two shards serve 150 batches a second (a GPU learner's plausible rate), with two
# requests in flight to each. The pool, from `python benchmarks/pong_pool.py`
# (results/pong_pool.txt, this machine): one actor steps about 1,000 times a second on a core
# (actor_throughput-pong-v5.txt, stepping ale_py's AtariVectorEnv): 12 actors insert about
# 12,000 transitions/s, which a learner at 19 batches of 512 samples about 0.8 times each, the
# paper's own ratio (9,728 sampled against 12,510 inserted a second); pong_pool.py prints the
# pool that ratio asks for. The 56 actors
# planned before would insert over four times as much. Two e2-standard-8 Spot nodes hold 12.
#
# Yardsticks (Pong, Ape-X on Ray's RLlib, each with its hardware): "~20 reward in 50 minutes
# (6M train steps, 2M env steps)" on a p3.2xlarge (one V100; ray-project/ray
# rllib/tuned_examples/pong-apex.yaml, 4 workers x 8 envs) and "~19 reward in < 40 minutes
# (3M env steps)" on a p3.8xlarge (rllib/tuned_examples/apex_dqn/pong-apex-dqn.yaml). The run
# stops at a return of 20; its 4 hours are a cap, which the cost estimate prices whole. These
# settings have not been run on GKE here; the first run is yours.
WORKLOADS = {
    "cartpole": Workload("CartPole-v1", (), 600 / 3600),  # ApexConfig's default budget
    # rl.config.PRESETS["pong"]: the settings above, also `distrl train --preset pong`
    "pong": Workload("ALE/Pong-v5", ("--preset", "pong"), 4.0,
                     actor_machine_type="e2-standard-8", max_actor_nodes=2),  # 6 a node: 12
    # The seed's own scale: its tutorial ran 100 actors on 128 vCPUs. CartPole on 4 Spot
    # e2-standard-32 nodes, 30 actors each: 120. `python benchmarks/hundred_actors.py`
    # rehearses 100 on this machine (results/hundred_actors.txt): every transition accounted
    # for, 64 MiB an actor, the driver at a third of a core.
    "seed-scale": Workload("CartPole-v1", ("--envs-per-actor", "4"), 600 / 3600,
                           actor_machine_type="e2-standard-32", max_actor_nodes=4),
}


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
    otlp_protocol: str = "http/protobuf"
    operator_namespace: str = ""
    workload: str = "cartpole"  # the training the RayJob runs: a key of WORKLOADS
    # Where pods may open HTTPS (TCP 443): Google APIs (checkpoints in a bucket) and, for the
    # head's autoscaler, the Kubernetes API server. Google publishes no fixed range for its
    # public API addresses, so the default is any address, on 443 only; with Private Google
    # Access, give e.g. "199.36.153.8/30,<control plane endpoint>/32" (private.googleapis.com).
    https_egress_cidrs: str = "0.0.0.0/0"

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
                self.actor_machine_type not in MACHINES:
            problems.append(f"actor_machine_type={self.actor_machine_type!r}: one of "
                            f"{', '.join(sorted(MACHINES))} (the machine types these settings know)")
        if self.mode not in MODES:
            problems.append(f"mode={self.mode!r}: one of {', '.join(MODES)}")
        if self.workload not in WORKLOADS:
            problems.append(f"workload={self.workload!r}: one of {', '.join(WORKLOADS)}")
        if not isinstance(self.image_tag, str) or \
                not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", self.image_tag):
            problems.append(f"image_tag={self.image_tag!r}: a Docker tag (letters, digits, _ . -)")
        if self.otlp_protocol not in OTLP_PORTS:
            problems.append(f"otlp_protocol={self.otlp_protocol!r}: one of "
                            f"{', '.join(OTLP_PORTS)} (how pods export to Managed OpenTelemetry)")
        if not isinstance(self.operator_namespace, str) or (
                self.operator_namespace and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
                                                             self.operator_namespace)):
            problems.append(f"operator_namespace={self.operator_namespace!r}: a Kubernetes "
                            "namespace name, or '' to admit the dashboard port from any source")
        try:
            cidrs = [ipaddress.ip_network(c.strip()) for c in self.https_egress_cidrs.split(",")]
            if not cidrs:
                raise ValueError
        except (AttributeError, ValueError):
            problems.append(f"https_egress_cidrs={self.https_egress_cidrs!r}: comma-separated "
                            "CIDRs such as '0.0.0.0/0' or '199.36.153.8/30,34.1.2.3/32'")
        if problems:
            raise ValueError("invalid GKE settings: " + "; ".join(problems))

    @classmethod
    def for_workload(cls, workload: str, **fields) -> GkeSettings:
        """Settings whose actor pool is the one WORKLOADS[workload] is sized for (fields
        override it)."""
        if workload not in WORKLOADS:
            raise ValueError(f"workload={workload!r}: one of {', '.join(WORKLOADS)}")
        w = WORKLOADS[workload]
        return cls(**{"workload": workload, "actor_machine_type": w.actor_machine_type,
                      "max_actor_nodes": w.max_actor_nodes} | fields)

    @classmethod
    def from_kube_context(cls, context: str, workload: str, **fields) -> GkeSettings:
        """The settings of the cluster a kube context names (KUBE_CONTEXT, as get-credentials
        writes it: gke_PROJECT_LOCATION_PREFIX-cluster), sized for `workload`: a zone means
        Standard, a region Autopilot."""
        found = re.fullmatch(r"gke_([a-z][-a-z0-9]+)_([a-z]+-[a-z]+\d+)(-[a-z])?_([a-z][-a-z0-9]*)"
                             r"-cluster", context or "")
        if not found:
            raise ValueError(f"kube context {context!r} is not one the plan writes: expected "
                             "gke_PROJECT_LOCATION_PREFIX-cluster (notebook 03's KUBE_CONTEXT)")
        project, region, zone_suffix, prefix = found.groups()
        where = ({"mode": "standard", "region": region, "zone": region + zone_suffix}
                 if zone_suffix else {"mode": "autopilot", "region": region})
        return cls.for_workload(workload, **({"project_id": project, "prefix": prefix} | where
                                             | fields))

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
    def build_service_account(self) -> str:
        return f"{self.prefix}-build"

    @property
    def build_email(self) -> str:
        return f"{self.build_service_account}@{self.project_id}.iam.gserviceaccount.com"

    @property
    def node_service_account(self) -> str:
        return f"{self.prefix}-nodes"

    @property
    def node_email(self) -> str:
        return f"{self.node_service_account}@{self.project_id}.iam.gserviceaccount.com"

    @property
    def build_region(self) -> str:
        """Where Cloud Build runs: the region itself if every project may build there."""
        return self.region if self.region in BUILD_REGIONS else BUILD_REGIONS[0]

    @property
    def location(self) -> str:
        """Standard clusters are zonal (one free-tier credit covers one), Autopilot regional."""
        return self.zone if self.mode == "standard" else self.region

    @property
    def kube_context(self) -> str:
        return KUBE_CONTEXT.format(project=self.project_id, location=self.location,
                                   cluster=self.cluster)

    def kubectl(self, *args: str) -> tuple[str, ...]:
        """A kubectl argv that names this cluster's context."""
        return ("kubectl", f"--context={self.kube_context}", *args)

    @property
    def build_bucket(self) -> str:
        """Cloud Build's source and logs; bucket names are global, hence the project id."""
        return f"{self.project_id}-{self.prefix}-build"

    @property
    def otlp_endpoint(self) -> str:
        return f"http://{MANAGED_OTEL_HOST}:{OTLP_PORTS[self.otlp_protocol]}"

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
    def head_node(self) -> str:
        """The head's machine and GPU, against the vCPUs a VM with that one GPU may have."""
        shape = machine(self.head_machine_type)
        node = f"{self.head_machine_type}: {shape.vcpus} vCPUs, {shape.memory_gib:g} GiB"
        if self.gpu_type == "none":
            return f"{node}, no GPU"
        low, high = ONE_GPU_VCPUS[self.gpu_type]
        return f"{node}, 1 {self.gpu_type} (a VM with one may have {low}-{high} vCPUs)"

    @property
    def labels(self) -> dict[str, str]:
        """GCP resource labels (lowercase keys and values, no dots or slashes)."""
        return {"app": "distrl", "distrl-prefix": self.prefix}

    @property
    def owner_description(self) -> str:
        """What a service account (which takes no labels) says about who made it."""
        return f"made by distrl's GKE plan, prefix {self.prefix}"

    @property
    def location_flag(self) -> str:
        return f"--zone={self.zone}" if self.mode == "standard" else f"--region={self.region}"


@dataclass(frozen=True)
class MachineType:
    vcpus: int
    memory_gib: float


# The machine types the settings accept, and their shapes (cloud.google.com/compute/docs/
# general-purpose-machines, /accelerator-optimized-machines); their prices are in cost.PRICES.
MACHINES = {
    "e2-standard-4": MachineType(4, 16),
    "e2-standard-8": MachineType(8, 32),
    "e2-standard-16": MachineType(16, 64),
    "e2-standard-32": MachineType(32, 128),
    "n2-standard-8": MachineType(8, 32),
    "n2-standard-32": MachineType(32, 128),
    "n1-standard-8": MachineType(8, 30),
    "g2-standard-8": MachineType(8, 32),
}


def machine(name: str) -> MachineType:
    """The shape of a machine type the settings accept (KeyError for another)."""
    return MACHINES[name]


# Kubernetes' quantity suffixes (k8s.io/apimachinery resource.Quantity): decimal and binary.
QUANTITY_UNITS = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
                  "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def parse_quantity(amount: str | float) -> float:
    """A Kubernetes quantity as a number: '500m' 0.5, '30Gi' 30 * 2**30, 8 and '8' 8.0, so that
    the API server's way of writing one back reads as the same amount."""
    text = str(amount)
    unit = next((u for u in sorted(QUANTITY_UNITS, key=len, reverse=True) if text.endswith(u)), "")
    try:
        return float(text[:len(text) - len(unit)]) * QUANTITY_UNITS.get(unit, 1)
    except ValueError:
        raise ValueError(f"quantity {amount!r} is invalid: expected a number with an optional "
                         f"suffix ({', '.join(QUANTITY_UNITS)})") from None
