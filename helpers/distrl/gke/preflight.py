"""What a GKE plan needs before and while it runs, checked against the live project and cluster.

    check_prerequisites(settings)   # before anything: tools, gcloud version, login, project,
                                    # your permissions, billing, APIs and quotas;
                                    # PrerequisiteError lists them all
    quota_problems(settings, region_json, project_json)   # the quota arithmetic, no gcloud

Each problem is one sentence that names the fact, where it comes from, and the command or page
that fixes it. The same judges back the plan's check steps (distrl.gke.create), which run the read-only
command (`gcloud compute regions describe ...`, `kubectl get crd ...`) and stop the plan before
anything that depends on it is created.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field

from distrl.gke.manifests import pod_sizes
from distrl.gke.runner import capture
from distrl.gke.settings import APIS, DISK_GB, SYSTEM_MACHINE, machine

# Managed OpenTelemetry for GKE: the flag is GA in `gcloud container clusters create` from
# gcloud 576.0.0 (cloud.google.com/sdk/docs/release-notes, 576.0.0: "Promoted
# --managed-otel-scope flag to GA"); the cluster needs GKE 1.34.1-gke.2178000, and 1.37.1-gke.
# 1697000 for gRPC export (cloud.google.com/kubernetes-engine/docs/how-to/managed-otel-gke,
# Requirements).
MIN_GCLOUD = (576, 0, 0)
MIN_GKE_OTEL = "1.34.1-gke.2178000"
MIN_GKE_OTEL_GRPC = "1.37.1-gke.1697000"
OTEL_DOCS = "cloud.google.com/kubernetes-engine/docs/how-to/managed-otel-gke"
# KubeRay: spec.authOptions.secretName arrived in v1.6.0 (ray-project/kuberay
# ray-operator/apis/ray/v1/raycluster_types.go at v1.6.0; v1.5.1 has only authOptions.mode).
KUBERAY_AUTH_SOURCE = "ray-project/kuberay v1.6.0, ray-operator/apis/ray/v1/raycluster_types.go"
QUOTAS_PAGE = "https://console.cloud.google.com/iam-admin/quotas?project={project}"
# GPU quota metrics of Compute Engine (regional), per accelerator type.
GPU_QUOTAS = {"nvidia-l4": "NVIDIA_L4_GPUS", "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
              "nvidia-tesla-p4": "NVIDIA_P4_GPUS"}
DISK_QUOTA = "SSD_TOTAL_GB"  # pd-balanced boot disks (GKE's default since 1.24) count here


class PrerequisiteError(RuntimeError):
    """Something the live run needs is missing; nothing has run."""


def parse_version(text: str) -> tuple[int, ...]:
    """'578.0.0' -> (578, 0, 0); '1.34.1-gke.2178000' -> (1, 34, 1, 2178000)."""
    numbers = re.findall(r"\d+", text or "")
    if not numbers:
        raise ValueError(f"version={text!r}: no version number in it")
    return tuple(int(n) for n in numbers)


def _fmt(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def gcloud_problems(version_json: str) -> list[str]:
    """`gcloud version --format=json`: the SDK at least MIN_GCLOUD."""
    try:
        version = parse_version(json.loads(version_json)["Google Cloud SDK"])
    except (ValueError, KeyError, TypeError):
        return [f"cannot read the gcloud version from `gcloud version --format=json` "
                f"({version_json[:80]!r})"]
    if version < MIN_GCLOUD:
        return [f"gcloud {_fmt(version)} is older than {_fmt(MIN_GCLOUD)}, the first with "
                "--managed-otel-scope outside `gcloud beta` (cloud.google.com/sdk/docs/"
                "release-notes): run `gcloud components update`"]
    return []


def gke_version_problems(version: str, otlp_protocol: str) -> list[str]:
    """`gcloud container clusters describe --format=value(currentMasterVersion)` against what
    Managed OpenTelemetry needs for the chosen protocol."""
    version = version.strip()
    try:
        have = parse_version(version)
    except ValueError:
        return [f"cannot read the cluster's GKE version ({version!r})"]
    need = MIN_GKE_OTEL_GRPC if otlp_protocol == "grpc" else MIN_GKE_OTEL
    if have >= parse_version(need):
        return []
    grpc = otlp_protocol == "grpc"
    what = "gRPC export to Managed OpenTelemetry" if grpc else "Managed OpenTelemetry"
    fix = ("upgrade the control plane (`gcloud container clusters upgrade CLUSTER --master "
           f"--cluster-version={need}`)")
    if grpc:
        fix += " or render the manifests with otlp_protocol='http/protobuf'"
    return [f"the cluster runs GKE {version}; {what} needs {need} or later ({OTEL_DOCS}): {fix}"]


def otel_service_problems(ports: str, otlp_protocol: str) -> list[str]:
    """`kubectl get service opentelemetry-collector --namespace=gke-managed-otel
    --output=jsonpath={.spec.ports[*].port}|{.spec.ports[*].targetPort}`: the managed collector
    serves the chosen port, and its pods listen where the egress NetworkPolicy lets pods go
    (under Dataplane V2 the policy sees the pod's target port, not the Service's)."""
    want = 4317 if otlp_protocol == "grpc" else 4318
    service_ports, _, target_ports = ports.partition("|")
    found = {int(p) for p in service_ports.split() if p.isdigit()}
    targets = {p for p in target_ports.split() if p}
    unexpected = sorted(t for t in targets if not (t.isdigit() and int(t) in (4317, 4318)))
    if unexpected:
        return [f"the managed collector's pods listen on {unexpected} (its Service's target "
                "ports), which the egress NetworkPolicy does not allow (4317, 4318): add them "
                "to the policy's collector rule (manifests.egress_policy) and apply it again"]
    if not found:
        return ["no Service opentelemetry-collector in namespace gke-managed-otel: Managed "
                "OpenTelemetry is not on in this cluster (`gcloud container clusters update "
                f"CLUSTER --managed-otel-scope=COLLECTION_AND_INSTRUMENTATION_COMPONENTS`, "
                f"{OTEL_DOCS})"]
    if want not in found:
        other = "http/protobuf" if otlp_protocol == "grpc" else "grpc"
        return [f"the managed collector's Service serves ports {sorted(found)}, not {want} "
                f"({otlp_protocol}); render the manifests with otlp_protocol={other!r}"]
    return []


def kuberay_auth_problems(secret_name_type: str) -> list[str]:
    """`kubectl get crd rayclusters.ray.io --output=jsonpath=...authOptions...secretName.type`:
    'string' when the installed KubeRay knows spec.authOptions.secretName (v1.6.0 or later)."""
    if secret_name_type.strip() == "string":
        return []
    return ["the Ray operator installed in this cluster does not know RayCluster "
            "spec.authOptions.secretName (KubeRay 1.6.0 or later, "
            f"{KUBERAY_AUTH_SOURCE}). Without it KubeRay gives the Ray token neither to the "
            "autoscaler sidecar nor to its own dashboard client, so the actors group never "
            "grows and RayJob status stays unknown. GKE chooses the add-on's KubeRay version "
            "by GKE version and does not publish the mapping: upgrade the cluster on the "
            "rapid channel, or disable the add-on and install KubeRay 1.6 with Helm "
            f"(docs.ray.io, KubeRay Operator Installation): {HELM_KUBERAY}, then resume "
            "the plan at this step"]


# KubeRay without the add-on (both would reconcile the same ray.io resources: never both).
HELM_KUBERAY = ("gcloud container clusters update CLUSTER --zone=ZONE "
                "--update-addons=RayOperator=DISABLED; "
                "helm repo add kuberay https://ray-project.github.io/kuberay-helm/; "
                "helm install kuberay-operator kuberay/kuberay-operator --version 1.6.0 "
                "--namespace=ray-system --create-namespace")


def collector_log_problems(log: str) -> list[str]:
    """The managed collector's recent log (`kubectl logs deployment/opentelemetry-collector`):
    exports Google Cloud refused, each with its fix."""
    problems = []
    if re.search(r"PermissionDenied|PERMISSION_DENIED|permission denied", log):
        line = next(ln for ln in log.splitlines()
                    if re.search(r"PermissionDenied|PERMISSION_DENIED|permission denied", ln))
        problems.append(f"the managed collector was refused: {line.strip()[:300]} -- the "
                        "identity it writes as lacks roles/monitoring.metricWriter, "
                        "roles/cloudtrace.agent or roles/telemetry.metricsWriter: grant them to "
                        "the account the message names")
    missing = re.search(r"[Mm]issing (?:required )?(?:resource )?attribute[^\n]*", log)
    if missing:
        problems.append(f"the managed collector's exports were refused: {missing.group(0)[:300]}"
                        " -- the pods' OTEL_RESOURCE_ATTRIBUTES must carry it (the manifests "
                        "set gcp.project_id)")
    return problems


def operator_problems(deployments_json: str, admitted_namespace: str) -> tuple[list[str], str]:
    """`kubectl get deployments --all-namespaces --output=json`: where the KubeRay operator runs,
    against the namespace the NetworkPolicy admits to the head's dashboard port. Returns
    (problems, what was found)."""
    try:
        items = json.loads(deployments_json or "{}").get("items", [])
    except json.JSONDecodeError:
        return ["cannot read `kubectl get deployments --all-namespaces --output=json`"], ""
    namespaces = sorted({d["metadata"]["namespace"] for d in items
                         if re.search(r"kuberay|ray-operator", d["metadata"].get("name", ""))})
    found = (f"KubeRay operator in namespace {', '.join(namespaces)}" if namespaces else
             "no KubeRay operator Deployment in the cluster (GKE hosts the add-on's operator)")
    if not admitted_namespace or admitted_namespace in namespaces:
        return [], found
    where = (f"runs in namespace {', '.join(namespaces)}" if namespaces else
             "does not run in the cluster (GKE hosts it: cloud.google.com/kubernetes-engine/docs/"
             "add-on/ray-on-gke/concepts/overview)")
    return [f"the NetworkPolicy admits the dashboard port 8265 only from namespace "
            f"{admitted_namespace!r}, but the KubeRay operator {where}; it polls that port for "
            "RayJob status. Render with operator_namespace=" +
            (repr(namespaces[0]) if namespaces else "'' (any source; Ray's token guards it)")], found


def default_network_problems(listed: str, project_id: str) -> list[str]:
    """`compute networks list --filter=name=default`: the plan's cluster needs that network
    (`clusters create --network` "Defaults to the 'default' network", its gcloud reference)."""
    if listed.strip() == "default":
        return []
    return [f"project {project_id} has no network named default, which the cluster goes on: "
            "the organization policy compute.skipDefaultNetworkCreation makes projects without "
            "one (cloud.google.com/vpc/docs/vpc). Create it, then run again from this step: "
            f"gcloud compute networks create default --subnet-mode=auto --project={project_id}"]


def account_visible_problems(described: str, email: str) -> list[str]:
    """A new service account, read back (its uniqueId): IAM's reads are eventually consistent."""
    if described.strip():
        return []
    return [f"service account {email} is not visible yet (IAM is eventually consistent: "
            "cloud.google.com/iam/docs/service-accounts-create); run again from this step in a "
            "minute"]


@dataclass(frozen=True)
class PoolShape:
    """What the plan asks of a node pool, in the GKE API's terms (a describe's --format=json):
    config.machineType, config.accelerators, config.spot, config.taints and autoscaling."""

    machine_type: str
    gpu_type: str  # "none": no accelerator
    spot: bool
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect as the API spells it)
    max_nodes: int | None  # None: no autoscaling


# A node pool's states that a rerun must not skip (GKE API NodePool.Status): a create that
# failed (a GPU stockout, ZONE_RESOURCE_POOL_EXHAUSTED) can leave the pool in ERROR.
BROKEN_POOL = {"ERROR", "RUNNING_WITH_ERROR", "STOPPING"}
STOCKOUT_HINT = (
    "If its create failed for want of the GPU in the zone (ZONE_RESOURCE_POOL_EXHAUSTED), tear "
    "down with this ZONE first, then choose a zone that has it (`gcloud compute "
    "accelerator-types list --filter=zone:ZONE` lists a zone's GPUs) and run again")


def pool_problems(described: str, pool: str, want: PoolShape, replace: str) -> list[str]:
    """How the live pool (`node-pools describe --format=json`) differs from the plan, and its
    state: a pool made for another workload, machine type, size or GPU is not skipped."""
    try:
        live = json.loads(described)
    except ValueError:
        return [f"node pool {pool}: its describe printed no JSON ({described.strip()[:200]!r})"]
    config, scaling = live.get("config", {}), live.get("autoscaling", {})
    status = live.get("status", "?")
    if status in BROKEN_POOL:
        return [f"node pool {pool} is in status {status} "
                f"({live.get('statusMessage', 'no message')}): delete it ({replace}), then run "
                f"again from this step. {STOCKOUT_HINT}"]
    gpus = sorted(a.get("acceleratorType", "?") for a in config.get("accelerators", [])
                  if int(a.get("acceleratorCount", 0)) > 0)
    # Only the plan's own taint keys: GKE may add its own (a GPU node's nvidia.com/gpu).
    keys = {key for key, _, _ in want.taints}
    taints = sorted((t.get("key", ""), t.get("value", ""), t.get("effect", ""))
                    for t in config.get("taints", []) if t.get("key") in keys)
    max_nodes = int(scaling["maxNodeCount"]) if scaling.get("enabled") else None
    differs = [f"{what} {got} (this plan: {planned})" for what, got, planned in (
        ("machine type", config.get("machineType"), want.machine_type),
        ("GPU", ", ".join(gpus) or "none", want.gpu_type),
        ("Spot", bool(config.get("spot")), want.spot),
        ("taints", taints or "none", sorted(want.taints) or "none"),
        ("autoscaling up to", max_nodes, want.max_nodes)) if got != planned]
    if not differs:
        return []
    return [f"node pool {pool} exists with another shape than this plan's: "
            f"{'; '.join(differs)}. A skip would run the new workload on the old pool: replace "
            f"it ({replace}), then run again from this step"]


def head_room_problems(describe_nodes: str, cpu_needed: float, memory_gib_needed: float,
                       pool: str) -> list[str]:
    """`kubectl describe nodes --selector=cloud.google.com/gke-nodepool=POOL`: the node's
    allocatable CPU and memory less what its DaemonSets and system pods request, against the
    head pod (Ray container, TensorBoard and KubeRay's autoscaler sidecar)."""
    alloc = re.search(r"Allocatable:\s*\n(?P<body>(?:\s+\S+:\s+\S+\n)+)", describe_nodes)
    used = re.search(r"Allocated resources:.*?\n\s+cpu\s+(\S+).*?\n\s+memory\s+(\S+)",
                     describe_nodes, re.S)
    if not alloc or not used:
        return [f"cannot read the allocatable and allocated resources of the {pool} node "
                "(`kubectl describe nodes`): is the pool's node up?"]
    fields = dict(re.findall(r"(\S+):\s+(\S+)", alloc.group("body")))
    free_cpu = _cpu(fields.get("cpu", "0")) - _cpu(used.group(1))
    free_mem = _gib(fields.get("memory", "0")) - _gib(used.group(2))
    problems = []
    if free_cpu < cpu_needed:
        problems.append(f"the {pool} node has {free_cpu:.2f} CPU free after GKE's system pods; "
                        f"the head pod requests {cpu_needed:g}: choose a larger head machine")
    if free_mem < memory_gib_needed:
        problems.append(f"the {pool} node has {free_mem:.1f} GiB free after GKE's system pods; "
                        f"the head pod requests {memory_gib_needed:g} GiB")
    return problems


def _cpu(text: str) -> float:
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _gib(text: str) -> float:
    units = {"Ki": 2 ** -20, "Mi": 2 ** -10, "Gi": 1.0, "Ti": 1024.0, "k": 1e3 / 2 ** 30,
             "M": 1e6 / 2 ** 30, "G": 1e9 / 2 ** 30}
    match = re.fullmatch(r"([\d.]+)([A-Za-z]*)", text)
    if not match:
        return 0.0
    return float(match.group(1)) * units.get(match.group(2), 2 ** -30)


# Run in the head pod: how many GPUs TensorFlow sees, then one convolution of the Nature torso
# compiled with XLA on the first of them, as the learner compiles its update (jit_compile). XLA
# needs ptxas and libdevice from the CUDA wheels: a missing one fails here, in seconds, not at
# the learner's first update after the Spot pool is up.
# Where GKE's device plugin mounts the node's driver libraries (libcuda.so.1) in a GPU
# container; it sets no environment, so the image must put this folder on LD_LIBRARY_PATH
# (container-engine-accelerators cmd/nvidia_gpu/README.md, -container-path
# /usr/local/nvidia/lib64; pkg/gpu/nvidia/beta_plugin.go, Allocate returns devices and mounts
# only; GKE's "Run GPUs in Standard node pools", cloud.google.com/kubernetes-engine/docs/how-to/
# gpus, on CUDA applications and this path). The Dockerfile's ENV sets it; a test reads it there.
NVIDIA_LIB_DIR = "/usr/local/nvidia/lib64"

GPU_CHECK = """\
import ctypes
import os
import re
import tempfile

# The lines TensorFlow prints on loading CUDA, which TF_CPP_MIN_LOG_LEVEL=2 in the image hides.
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
print("ld_library_path", os.environ.get("LD_LIBRARY_PATH") or "(unset)")
try:
    ctypes.CDLL("libcuda.so.1")
    print("libcuda ok")
except OSError as e:
    print("libcuda failed", str(e).strip()[:300])
log, saved = tempfile.TemporaryFile(), os.dup(2)
os.dup2(log.fileno(), 2)  # TensorFlow (C++) writes to fd 2: keep its lines for this answer
try:
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
finally:
    os.dup2(saved, 2)
log.seek(0)
said = []
for line in log.read().decode(errors="replace").splitlines():
    line = re.sub(r"^[IWEF]\\d{4} [\\d:.]+ +\\d+ ", "", line.strip())
    if re.search(r"dlopen|libcuda|cuda driver|GPU will not", line, re.I) and line not in said:
        said.append(line)
        print("tf", line[:300])
print("gpus", len(gpus))
try:
    conv = tf.function(lambda x, k: tf.nn.conv2d(x, k, 4, "VALID"), jit_compile=True)
    with tf.device("/GPU:0"):
        y = conv(tf.ones((1, 84, 84, 4)), tf.ones((8, 8, 4, 32)))
    print("xla ok", y.device)
except Exception as e:
    print("xla failed", type(e).__name__, (str(e).strip().splitlines() or [""])[0][:300])
"""


def gpu_problems(output: str, gpu_type: str) -> list[str]:
    """GPU_CHECK's output: the driver's libcuda loads, TensorFlow sees a GPU, and an
    XLA-compiled convolution ran on it. A failure quotes TensorFlow's own lines on CUDA."""
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1:] for line in output.strip().splitlines()
             if line.startswith(("gpus ", "xla ", "libcuda ", "ld_library_path "))}
    tf_said = [line[3:] for line in output.splitlines() if line.startswith("tf ")]
    quoted = f" TensorFlow said: {' | '.join(tf_said)}" if tf_said else ""
    libcuda = (lines.get("libcuda") or ["no answer"])[0]
    if not libcuda.startswith("ok"):
        path = (lines.get("ld_library_path") or ["(not reported)"])[0]
        return [f"the GPU driver's libcuda.so.1 did not load in the head pod "
                f"({libcuda.removeprefix('failed ')}); "
                f"LD_LIBRARY_PATH there is {path}. GKE mounts the driver at {NVIDIA_LIB_DIR} and "
                "sets no environment: the image must put that folder on LD_LIBRARY_PATH (the "
                "Dockerfile's ENV does; rebuild and push the image), and `kubectl describe node` "
                "must list nvidia.com/gpu under Allocatable (GKE's driver installer ran)." + quoted]
    count = (lines.get("gpus") or [""])[0].strip()
    if not (count.isdigit() and int(count) >= 1):
        return [f"TensorFlow in the head pod sees {count or 'no'} GPU(s) although the head pool "
                f"has a {gpu_type} and the driver's libcuda loads: check that the image has "
                "TensorFlow's CUDA wheels (Dockerfile, the lock file's # gpu: lines)." + quoted]
    xla = (lines.get("xla") or ["no answer"])[0]
    if not xla.startswith("ok") or "GPU" not in xla:
        return [f"an XLA-compiled convolution did not run on the head's GPU ({xla}): the learner "
                "compiles its update the same way, so it would fail at its first update. XLA "
                "needs ptxas and libdevice from the CUDA wheels (nvidia-cuda-nvcc-cu12 in the "
                "lock file's # gpu: lines); `--jit-compile false` trains without XLA, slower"]
    return []


def autoscaler_token_problems(value: str) -> list[str]:
    """The env of the head pod's autoscaler container: KubeRay put RAY_AUTH_MODE=token there."""
    if value.strip() == "token":
        return []
    return ["the head pod's autoscaler container has no RAY_AUTH_MODE=token: the running "
            "operator ignored spec.authOptions (an older KubeRay under a newer CRD), so the "
            f"autoscaler cannot reach the head ({KUBERAY_AUTH_SOURCE})"]


# --- quotas --------------------------------------------------------------------------------

@dataclass
class QuotaNeed:
    metric: str
    amount: float
    what: str  # how the amount adds up, for the message
    per_actor_node: float = 0  # the part that grows with max_actor_nodes


def quota_needs(settings, quotas: dict[str, dict]) -> list[QuotaNeed]:
    """Regional quota the plan uses at full scale, by metric. `quotas` is the region's list by
    metric: a machine family's own CPU metric (N2_CPUS, ...) counts when the region lists one,
    else CPUS; Spot VMs count against PREEMPTIBLE_CPUS when it is granted (cloud.google.com/
    compute/docs/instances/create-use-spot), else like on-demand VMs."""
    s = settings
    needs: dict[str, QuotaNeed] = {}

    def add(metric: str, amount: float, what: str, per_actor_node: float = 0):
        need = needs.setdefault(metric, QuotaNeed(metric, 0, ""))
        need.amount += amount
        need.per_actor_node += per_actor_node
        need.what = f"{need.what} + {what}" if need.what else what

    def cpu_metric(machine_type: str, spot: bool) -> str:
        if spot and quotas.get("PREEMPTIBLE_CPUS", {}).get("limit", 0) > 0:
            return "PREEMPTIBLE_CPUS"
        family = f"{machine_type.split('-')[0].upper()}_CPUS"
        return family if family in quotas else "CPUS"

    if s.mode == "standard":
        nodes = [(SYSTEM_MACHINE, 1, False, "system node"), (s.head_machine_type, 1, False, "head"),
                 (s.actor_machine_type, s.max_actor_nodes, True, "actor nodes")]
        for machine_type, count, spot, label in nodes:
            vcpus = machine(machine_type).vcpus
            add(cpu_metric(machine_type, spot), vcpus * count,
                f"{label} {count} x {vcpus}" if spot else f"{label} {vcpus}",
                vcpus if spot else 0)
        disks = 2 + s.max_actor_nodes
        add(DISK_QUOTA, disks * DISK_GB, f"{disks} boot disks x {DISK_GB} GB", DISK_GB)
        # Nodes of a public cluster get an external IP each (IN_USE_ADDRESSES is regional;
        # new projects often have 4-8).
        add("IN_USE_ADDRESSES", disks, f"{disks} nodes' external IPs", 1)
    else:  # Autopilot sizes nodes to the pods: their requests are the least it will use
        sizes = pod_sizes(s)
        add("CPUS", sizes["head"].cpu + 1, "head pod")
        add("CPUS", sizes["actor"].cpu * s.max_actor_nodes, f"{s.max_actor_nodes} actor pods",
            sizes["actor"].cpu)
    if s.gpu_type != "none":
        add(GPU_QUOTAS[s.gpu_type], 1, f"one {s.gpu_type} for the head")
    return list(needs.values())


def project_quota_needs(settings) -> list[QuotaNeed]:
    """Project-wide quota the plan uses at full scale: CPUS_ALL_REGIONS counts every node's
    vCPUs (Spot ones too) in all regions together, and GPUS_ALL_REGIONS the head's GPU; both
    cap the project whatever a region grants, and new projects most often lack them (GPUs: 0;
    CPUs: 20-32). `gcloud compute project-info describe` lists them."""
    cpus = [n for n in quota_needs(settings, {}) if n.metric.endswith("CPUS")]
    needs = [QuotaNeed("CPUS_ALL_REGIONS", sum(n.amount for n in cpus),
                       " + ".join(n.what for n in cpus) + ", in all regions together",
                       sum(n.per_actor_node for n in cpus))]
    if settings.gpu_type != "none":
        needs.append(QuotaNeed("GPUS_ALL_REGIONS", 1, f"one {settings.gpu_type} for the head, "
                                                      "in all regions together"))
    return needs


def _quota_list(describe_json: str) -> dict[str, dict]:
    data = json.loads(describe_json or "{}")
    return {q["metric"]: q for q in data.get("quotas", [])}


def quota_problems(settings, region_json: str, project_json: str | None = None) -> list[str]:
    """`gcloud compute regions describe REGION --format=json` (and `gcloud compute project-info
    describe --format=json` for GPUS_ALL_REGIONS) against quota_needs(settings)."""
    page = QUOTAS_PAGE.format(project=settings.project_id)
    try:
        quotas = _quota_list(region_json)
    except (json.JSONDecodeError, KeyError, TypeError):
        return [f"cannot read the quotas of region {settings.region}"]
    problems = []
    for need in quota_needs(settings, quotas):
        quota = quotas.get(need.metric)
        if quota is None:
            problems.append(f"region {settings.region} lists no {need.metric} quota; the plan "
                            f"needs {need.amount:g} ({need.what}): pick another region")
            continue
        free = quota["limit"] - quota.get("usage", 0)
        if free < need.amount:
            fix = f"request more at {page}"
            fits = (need.per_actor_node and
                    int((free - need.amount) // need.per_actor_node) + settings.max_actor_nodes)
            if fits and fits >= 1:
                fix += f", or max_actor_nodes={fits}"
            problems.append(f"region {settings.region}: {need.metric} quota {quota['limit']:g} "
                            f"with {quota.get('usage', 0):g} in use leaves {free:g}; the plan "
                            f"needs {need.amount:g} at full scale ({need.what}): {fix}")
    if project_json is not None:
        problems += project_quota_problems(settings, project_json)
    return problems


# Free Trial billing accounts may run at most 8 vCPUs at once, add no GPUs to VMs and ask for
# no more quota (cloud.google.com/free/docs/free-cloud-features, "Free Trial restrictions", as
# older copies of the page word it). The smallest plan, a system node and a CPU head, already
# needs 12 vCPUs: no setting makes it fit, so the advice is the upgrade.
FREE_TRIAL_GPUS = ("a Free Trial billing account gets no GPUs, at most 8 vCPUs at once and no "
                   "quota increase, and the smallest plan (system node and head) needs 12 "
                   "vCPUs: upgrade it to a paid account (the remaining credit stays)")


def gpu_quota_problems(settings, project_json: str) -> list[str]:
    """`gcloud compute project-info describe --format=json`: GPUS_ALL_REGIONS caps GPUs
    project-wide, whatever a region grants."""
    if settings.gpu_type == "none":
        return []
    try:
        quota = _quota_list(project_json).get("GPUS_ALL_REGIONS", {})
    except (json.JSONDecodeError, KeyError, TypeError):
        return ["cannot read the project's GPUS_ALL_REGIONS quota"]
    limit, usage = quota.get("limit", 0), quota.get("usage", 0)
    if limit - usage >= 1:
        return []
    page = QUOTAS_PAGE.format(project=settings.project_id)
    return [f"GPUS_ALL_REGIONS quota {limit:g} with {usage:g} in use leaves no GPU for the head "
            f"(new projects start at 0): request 1 at {page}, or gpu_type='none'; "
            f"{FREE_TRIAL_GPUS}"]


def project_quota_problems(settings, project_json: str) -> list[str]:
    """`gcloud compute project-info describe --format=json`: the project-wide quotas, which cap
    every region together whatever one region grants: CPUS_ALL_REGIONS against every node's
    vCPUs at full scale (new and trial projects often have 20-32), and GPUS_ALL_REGIONS."""
    try:
        quota = _quota_list(project_json).get("CPUS_ALL_REGIONS")
    except (json.JSONDecodeError, KeyError, TypeError):
        return ["cannot read the project's quotas (gcloud compute project-info describe)"]
    problems = []
    [cpus] = [n for n in project_quota_needs(settings) if n.metric == "CPUS_ALL_REGIONS"]
    need, per_node = cpus.amount, cpus.per_actor_node
    if quota is not None and quota["limit"] - quota.get("usage", 0) < need:
        free = quota["limit"] - quota.get("usage", 0)
        fits = int((free - need) // per_node) + settings.max_actor_nodes if per_node else 0
        fix = f"request more at {QUOTAS_PAGE.format(project=settings.project_id)}"
        if fits >= 1:
            fix += f", or max_actor_nodes={fits}"
        problems.append(f"CPUS_ALL_REGIONS quota {quota['limit']:g} with "
                        f"{quota.get('usage', 0):g} in use leaves {free:g}; the plan needs "
                        f"{need:g} vCPUs at full scale in all regions together: {fix}")
    return problems + gpu_quota_problems(settings, project_json)


# --- before anything runs ------------------------------------------------------------------

TOOLS = {"gcloud": "install the Google Cloud CLI: https://cloud.google.com/sdk/docs/install",
         "kubectl": "run `gcloud components install kubectl`",
         "gke-gcloud-auth-plugin": "run `gcloud components install gke-gcloud-auth-plugin`"}


# The project permissions the plan needs that a basic role may leave out: an Editor cannot
# grant roles (setIamPolicy is Owner's or Project IAM Admin's), and nodes running as a
# user-managed service account need actAs on it ("you must also have the Service Account User
# role", cloud.google.com/kubernetes-engine/docs/how-to/iam). Asked of the caller itself by
# projects.testIamPermissions, which "requires no permission" and answers with the granted
# subset (cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions).
PLAN_PERMISSIONS = {
    "resourcemanager.projects.setIamPolicy": "the plan grants roles to its service accounts "
                                             "(Owner or roles/resourcemanager.projectIamAdmin; "
                                             "Editor has no such permission)",
    "iam.serviceAccounts.actAs": "the nodes run as the plan's node service account "
                                 "(roles/iam.serviceAccountUser on the project)",
    "iam.serviceAccounts.create": "the plan makes three service accounts "
                                  "(roles/iam.serviceAccountAdmin)",
    "container.clusters.create": "the cluster itself (roles/container.admin)",
    "serviceusage.services.enable": "step 1 enables the APIs (roles/serviceusage.serviceUsageAdmin)",
}
# Where testIamPermissions is asked; DISTRL_RESOURCE_MANAGER_URL points it elsewhere (the tests'
# recording server, a proxy).
RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com/v1"


def permission_problems(project_id: str, account: str,
                        timeout_s: float = 30.0) -> tuple[list[str], list[str]]:
    """(problems, notes): each plan permission the caller lacks on the project, with the role
    that grants it; a note, not a problem, when the question cannot be asked."""
    import os
    import urllib.error
    import urllib.request

    code, token = capture(["gcloud", "auth", "print-access-token"])
    if code != 0 or not token.strip():
        return [], ["your permissions could not be checked (`gcloud auth print-access-token` "
                    "failed); a step that needs one you lack fails with PERMISSION_DENIED"]
    base = os.environ.get("DISTRL_RESOURCE_MANAGER_URL", RESOURCE_MANAGER)
    request = urllib.request.Request(
        f"{base}/projects/{project_id}:testIamPermissions", method="POST",
        data=json.dumps({"permissions": sorted(PLAN_PERMISSIONS)}).encode(),
        headers={"Authorization": f"Bearer {token.strip()}",
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            granted = set(json.load(answer).get("permissions", []))
    except (urllib.error.URLError, OSError, ValueError) as err:
        return [], [f"your permissions could not be checked ({err}); a step that needs one "
                    "you lack fails with PERMISSION_DENIED"]
    return [f"{account} lacks {permission} on project {project_id}: {why}"
            for permission, why in PLAN_PERMISSIONS.items() if permission not in granted], []


def external_ip_problems(described: str, project_id: str) -> list[str]:
    """The effective compute.vmExternalIpAccess policy (`gcloud org-policies describe
    --effective --format=json`; its rules: denyAll, allowAll or values.allowedValues,
    cloud.google.com/resource-manager/docs/reference/orgpolicy/rest/v2/projects.policies): the
    plan's nodes take external IPs, so a policy that denies them, or allows only listed VMs,
    stops the node pools half-way."""
    rules = (json.loads(described or "{}").get("spec") or {}).get("rules") or []
    if any(rule.get("denyAll") for rule in rules):
        how = "denies every VM an external IP"
    elif any((rule.get("values") or {}).get("allowedValues") for rule in rules):
        how = "allows external IPs only on the VMs it lists"
    else:
        return []
    return [f"the organization policy compute.vmExternalIpAccess {how} in project {project_id}, "
            "and the plan's nodes take external IPs: ask an organization policy administrator "
            "for an exception for this project (cloud.google.com/compute/docs/ip-addresses/"
            "configure-static-external-ip-address#disableexternalip)"]


def _external_ip_policy(project_id: str, notes: list[str]) -> list[str]:
    """external_ip_problems of the project's effective policy; a note when it cannot be read."""
    code, policy = capture(["gcloud", "org-policies", "describe", "compute.vmExternalIpAccess",
                            "--effective", f"--project={project_id}", "--format=json"])
    try:
        if code == 0:
            return external_ip_problems(policy, project_id)
    except ValueError:
        pass
    notes.append("the organization policy on external IPs could not be read (`gcloud "
                 "org-policies describe compute.vmExternalIpAccess --effective` needs the "
                 "Organization Policy API and orgpolicy.policies.get); the node pools fail if "
                 "it denies them")
    return []


@dataclass
class Prerequisites:
    account: str
    gcloud_version: str
    missing_apis: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_prerequisites(settings, creating: bool = True) -> Prerequisites:
    """Everything the live plan needs that can be read without changing anything: the tools,
    gcloud's version, the login, the project, and for creating (not for a teardown, which must
    work whatever the quotas) billing, the APIs and, once the Compute Engine API is on, the
    quotas. A teardown needs only gcloud, of any version that has its commands: without
    kubectl it skips the steps inside the cluster, whose deletion takes what they would delete.
    Raises PrerequisiteError listing every problem with its fix."""
    project = f"--project={settings.project_id}"
    missing = [f"{tool} is not on PATH: {fix}" for tool, fix in TOOLS.items()
               if shutil.which(tool) is None]
    if shutil.which("gcloud") is None:
        raise PrerequisiteError("cannot run the live plan: " + "; ".join(missing))
    problems, version_json = [], ""
    if creating:
        version_json = capture(["gcloud", "version", "--format=json"])[1]
        problems = missing + gcloud_problems(version_json)
    account = _login_and_project(settings, problems)
    found = Prerequisites(account.splitlines()[0], _sdk_version(version_json))
    if not creating:
        found.notes += [f"{line}; the teardown skips the steps inside the cluster, whose "
                        "deletion takes what they would delete" for line in missing]
        return found
    lacking, notes = permission_problems(settings.project_id, found.account)
    problems += lacking
    found.notes += notes
    problems += _external_ip_policy(settings.project_id, found.notes)
    code, billing = capture(["gcloud", "billing", "projects", "describe", settings.project_id,
                             "--format=value(billingEnabled)"])
    if code == 0 and billing.strip().lower() == "false":
        problems.append(f"billing is off for {settings.project_id}: link a billing account "
                        f"(`gcloud billing projects link {settings.project_id} "
                        "--billing-account=ACCOUNT_ID`)")
    elif code != 0:
        found.notes.append("billing could not be read (`gcloud billing projects describe` "
                           "needs the Cloud Billing API and billing.resourceAssociations.list); "
                           "the first create step fails if billing is off")
    enabled = set(capture(["gcloud", "services", "list", "--enabled", project,
                           "--format=value(config.name)"])[1].split())
    found.missing_apis = [f"{api}.googleapis.com" for api in APIS
                          if f"{api}.googleapis.com" not in enabled]
    if found.missing_apis:
        found.notes.append(f"step 1 enables {', '.join(found.missing_apis)} "
                           f"(`gcloud services enable {' '.join(found.missing_apis)} {project}`); "
                           "new APIs can take a few minutes to answer")
    if "compute.googleapis.com" in enabled:
        region = capture(["gcloud", "compute", "regions", "describe", settings.region, project,
                          "--format=json"])[1]
        info = capture(["gcloud", "compute", "project-info", "describe", project,
                        "--format=json"])[1] if settings.gpu_type != "none" else None
        problems += quota_problems(settings, region, info)
    else:
        found.notes.append("quotas are checked by the plan's quota step, once step 1 has "
                           "enabled the Compute Engine API")
    if problems:
        raise PrerequisiteError("cannot run the live plan:\n" +
                                "\n".join(f"  - {p}" for p in problems))
    return found


def _login_and_project(settings, problems: list[str]) -> str:
    """The active gcloud account, once it can reach the project; else PrerequisiteError with
    every problem so far."""
    account = capture(["gcloud", "auth", "list", "--filter=status:ACTIVE",
                       "--format=value(account)"])[1].strip()
    if not account:
        problems.append("no authenticated gcloud account: run `gcloud auth login`")
        raise PrerequisiteError("cannot run the live plan: " + "; ".join(problems))
    state = capture(["gcloud", "projects", "describe", settings.project_id,
                     "--format=value(lifecycleState)"])[1].strip()
    if state != "ACTIVE":
        problems.append(f"project {settings.project_id!r} is not reachable as {account} "
                        f"(state {state or 'unknown'}): check the id and your access with "
                        f"`gcloud projects describe {settings.project_id}`")
        raise PrerequisiteError("cannot run the live plan: " + "; ".join(problems))
    return account


def _sdk_version(version_json: str) -> str:
    try:
        return json.loads(version_json)["Google Cloud SDK"]
    except (ValueError, KeyError, TypeError):
        return "unknown"
