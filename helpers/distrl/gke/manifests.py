"""Kubernetes manifests for Ape-X on GKE, rendered from GkeSettings, and their validation.

    write_manifests(settings, "runs/gke/manifests")   # cluster/, job/, plain/ as YAML files
    for doc in load_dir("k8s"): validate(doc)          # strict schema checks, no cluster needed

Layout (the same under k8s/, which holds the defaults, and under a rendered directory):
  cluster/  what `kubectl apply` creates with the Ray operator: namespace, service account,
            NetworkPolicy, run volume, the RayCluster (head + Spot `actors` group, TensorBoard
            beside the head) and TensorBoard's ClusterIP Service
  job/      a RayJob: a one-shot training run whose cluster is deleted after the job
  plain/    the seed's shape for clusters without the operator: a headless Service, a head
            pod, actor workers that run the wait-for-head script from a ConfigMap

No Service is of type LoadBalancer: the Ray dashboard (and its Jobs API, which runs any code
it is sent) and TensorBoard are reached with `kubectl port-forward` only.

Why a field is set travels with it: the code that builds a mapping marks its non-obvious keys with
a one-line comment (commented()), and dump() writes each as a `# ...` line above its key.
"""

from __future__ import annotations

import copy
import math
import shlex
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from distrl.gke.settings import (
    IMAGE_PYTHON,
    IMAGE_PYTHON_ENV,
    MANAGED_OTEL_NAMESPACE,
    NODE_READY_S,
    OTLP_PORTS,
    RAY_VERSION,
    WORKLOADS,
    GkeSettings,
    machine,
)

KUBERNETES_VERSION = "1.34.0"  # schemas to validate against (GKE rapid channel or older)
RAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "metrics": 8080}
TENSORBOARD_PORT = 6006
RUNS_DIR = "/home/ray/runs"
SPOT_SELECTOR = {"cloud.google.com/gke-spot": "true"}
# The Spot pool's taint (GKE's Spot VMs page): only the actors land there, so no system Pod keeps
# a node from scaling down (kubernetes/autoscaler#2377) and no RayJob submitter is preempted.
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
SPOT_TOLERATION = {**SPOT_TAINT, "operator": "Equal"}
# A Spot VM gets about 30 s notice, of which GKE gives non-system Pods the first 15 s and its
# system Pods the rest (cloud.google.com/kubernetes-engine/docs/concepts/spot-vms; Standard node
# pools may extend it to 120 s from GKE 1.35.0-gke.1171000). A longer grace is cut short anyway.
SPOT_GRACE_S = 15
DEFAULTS = GkeSettings(project_id="my-project-id")  # what k8s/ is rendered with


@dataclass(frozen=True)
class PodSize:
    cpu: float
    memory_gib: float
    gpus: int = 0


# Beside the head's Ray container: TensorBoard, and the autoscaler sidecar KubeRay injects
# (its default is 500m / 512Mi, ray-project/kuberay ray-operator/controllers/ray/common/pod.go
# BuildAutoscalerContainer; set here explicitly so the sum below is the pod's real request).
TENSORBOARD_SIZE = PodSize(0.5, 1)
AUTOSCALER_SIZE = PodSize(0.5, 0.5)
# CPUs a node keeps for what is not Ray: GKE reserves ~0.09 of 8 vCPUs (allocatable,
# cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes) and its DaemonSets (logging,
# metrics, Dataplane V2, CSI, the GPU device plugin) request roughly 0.3-0.6 more; the head also
# hosts TensorBoard and the autoscaler sidecar. The plan measures the head node before applying.
HEAD_RESERVED_CPUS = 3
ACTOR_RESERVED_CPUS = 2
RUNS_VOLUME_GB = 20


def pod_sizes(settings: GkeSettings) -> dict[str, PodSize]:
    """Requests (= limits) of the head's Ray container and of one actor pod per node.

    Whole CPUs (Ray's num-cpus equals the CPU request), leaving room for GKE's system pods and,
    on the head, the TensorBoard and autoscaler sidecars, so one pod fits one node.
    """
    head, actor = machine(settings.head_machine_type), machine(settings.actor_machine_type)
    return {"head": PodSize(head.vcpus - HEAD_RESERVED_CPUS, math.floor(head.memory_gib * 0.65),
                            0 if settings.gpu_type == "none" else 1),
            "actor": PodSize(actor.vcpus - ACTOR_RESERVED_CPUS,
                             math.floor(actor.memory_gib * 0.75))}


def head_pod_request(settings: GkeSettings) -> tuple[float, float]:
    """(CPU, GiB) the whole head pod requests: Ray, TensorBoard and the autoscaler sidecar."""
    parts = [pod_sizes(settings)["head"], TENSORBOARD_SIZE, AUTOSCALER_SIZE]
    return sum(p.cpu for p in parts), sum(p.memory_gib for p in parts)


class Commented(dict):
    """A mapping whose keys may carry a comment each, `comments` (key -> one line saying why the
    field is set). It is the plain dict to everything else (==, JSON, validation); dump() writes
    the comments into the YAML."""

    comments: dict[str, str]  # set by commented()


def commented(mapping: dict, why: dict[str, str]) -> Commented:
    """mapping (a copy) with why's comments on its keys; a comment for a key it lacks is an error,
    so a renamed field cannot silently lose its comment."""
    if missing := [key for key in why if key not in mapping]:
        raise KeyError(f"comments for fields that are not there: {missing} (fields: {list(mapping)})")
    if bad := [line for line in why.values() if not line or "\n" in line]:
        raise ValueError(f"a comment is one non-empty line: {bad}")
    out = Commented(mapping)
    out.comments = {**getattr(mapping, "comments", {}), **why}
    return out


def comments(doc, path: tuple = ()) -> dict[tuple, str]:
    """The comments of a document's Commented mappings, by the path of their field (keys and list
    indices): what dump() writes above each field."""
    found = {}
    if isinstance(doc, dict):
        found |= {(*path, key): line for key, line in getattr(doc, "comments", {}).items()}
        for key, value in doc.items():
            found |= comments(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found |= comments(value, (*path, i))
    return found


def _labels(s: GkeSettings, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "distrl", "app.kubernetes.io/instance": s.prefix,
            "app.kubernetes.io/component": component}


def _meta(s: GkeSettings, name: str, component: str, namespaced: bool = True) -> dict:
    meta = {"name": name, "labels": _labels(s, component)}
    if namespaced:
        meta["namespace"] = s.namespace
    return meta


def _quantity(value: float, unit: str = "") -> str:
    """Kubernetes quantities: whole numbers as they are, fractions in milli-units (500m) or,
    for memory, in Mi."""
    if float(value).is_integer():
        return f"{int(value)}{unit}"
    return f"{round(value * 1024)}Mi" if unit == "Gi" else f"{round(value * 1000)}m"


def _resources(size: PodSize) -> dict:
    amounts = {"cpu": _quantity(size.cpu), "memory": _quantity(size.memory_gib, "Gi")}
    if not size.gpus:
        return {"requests": dict(amounts), "limits": dict(amounts)}
    amounts["nvidia.com/gpu"] = str(size.gpus)
    # No tolerations: GKE taints its GPU nodes and tolerates the taint for pods that request a GPU
    # (the ExtendedResourceToleration admission controller).
    requests = commented(amounts, {"nvidia.com/gpu": "GKE adds the toleration of its GPU nodes' "
                                                     "taint to pods that request one"})
    return {"requests": requests, "limits": dict(amounts)}


def token_secret_name(s: GkeSettings) -> str:
    return f"{s.prefix}-ray-token"


def _location_attribute(s: GkeSettings) -> str:
    """The Telemetry API writes OTLP metrics to the prometheus_target resource, whose location
    label it takes from the resource's location, cloud.availability_zone or cloud.region
    (cloud.google.com/stackdriver/docs/reference/telemetry/v1.metrics): the cluster's."""
    return (f"cloud.availability_zone={s.zone}" if s.mode == "standard"
            else f"cloud.region={s.region}")


def _env(s: GkeSettings) -> list[dict]:
    """The seed's OTEL_* variables pointed at GKE's managed collector. KubeRay adds the Ray
    token (RAY_AUTH_MODE, RAY_AUTH_TOKEN) to every container from spec.authOptions."""
    def var(name: str, why: str | None = None, **value) -> dict:
        item = {"name": name, **value}
        return commented(item, {"name": why}) if why else item

    return [
        var("POD_NAME", "for k8s.pod.name in OTEL_RESOURCE_ATTRIBUTES",
            valueFrom={"fieldRef": {"fieldPath": "metadata.name"}}),
        var("OTEL_EXPORTER_OTLP_ENDPOINT", "GKE's managed collector: the one place the egress "
            "policy lets telemetry go", value=s.otlp_endpoint),
        var("OTEL_EXPORTER_OTLP_PROTOCOL", value=s.otlp_protocol),
        var("OTEL_SERVICE_NAME", value="rl-training-service"),
        # gcp.project_id: the Telemetry API refuses OTLP whose resource lacks it (reported by
        # several users; Google's own OTLP examples add it with a resource processor,
        # cloud.google.com/stackdriver/docs/otlp-logs/migrate-to-otlp). Harmless if the
        # managed collector adds it too.
        var("OTEL_RESOURCE_ATTRIBUTES", "the Telemetry API needs gcp.project_id and a location "
            "(prometheus_target's labels)",
            value=f"service.namespace={s.namespace},k8s.namespace.name={s.namespace},"
                  f"k8s.pod.name=$(POD_NAME),gcp.project_id={s.project_id},"
                  f"k8s.cluster.name={s.cluster},{_location_attribute(s)}"),
        var("OTEL_METRIC_EXPORT_INTERVAL", "ms; Cloud Monitoring bills by the sample, 30 s is "
            "fresh enough", value="30000"),
        var("TF_CPP_MIN_LOG_LEVEL", "keeps TensorFlow's C++ info and warning lines out of the "
            "pod logs", value="2"),
        var(IMAGE_PYTHON_ENV, "distrl train refuses to run on another Python than the image's",
            value=IMAGE_PYTHON),
    ]


def _token_file(s: GkeSettings) -> tuple[list[dict], dict, dict]:
    """The plain manifests' token (no operator there): env, volume and mount of the file."""
    env = [{"name": "RAY_AUTH_MODE", "value": "token"},
           {"name": "RAY_AUTH_TOKEN_PATH", "value": f"{TOKEN_DIR}/auth_token"}]
    volume = {"name": "ray-token", "secret": {"secretName": token_secret_name(s),
                                              "defaultMode": 0o440}}  # group 100 (fsGroup)
    return env, volume, {"name": "ray-token", "mountPath": TOKEN_DIR, "readOnly": True}


# The "restricted" Pod Security Standard (kubernetes.io/docs/concepts/security/
# pod-security-standards; checks: kubernetes/pod-security-admission policy/check_*.go) plus a
# read-only root file system: Ray writes under /tmp (sessions, logs, spilled objects), an
# emptyDir here.
_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
             "readOnlyRootFilesystem": True}
# The autoscaler sidecar KubeRay adds shares only /tmp/ray with the head, so its root stays
# writable; the restricted rules hold for it too.
_SIDECAR_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
_POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100,
                 "seccompProfile": {"type": "RuntimeDefault"}}
_TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
_TMP_MOUNT = {"name": "tmp", "mountPath": "/tmp"}
# The plain manifests' Ray token: a file from the Secret (Ray reads RAY_AUTH_TOKEN_PATH, in
# ray-project/ray src/ray/rpc/authentication/authentication_token_loader.cc), not an env
# variable that every process and job of the pod inherits. KubeRay's authOptions (the
# RayCluster, the RayJob) only ever injects it as RAY_AUTH_TOKEN (kuberay v1.6 pod.go).
TOKEN_DIR = "/var/run/secrets/ray-token"
_STOP_RAY = {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}}
# Comments shared by the Ray containers and pods (see commented()).
_WHY_RAY_CONTAINER = {
    "securityContext": "restricted Pod Security Standard, read-only root: Ray writes only to /tmp",
    "lifecycle": "`ray stop` first: the node leaves Ray cleanly, not by failing health checks",
}
_WHY_POD = {
    "serviceAccountName": "Workload Identity: bound to the Google service account of the same name",
    "securityContext": "restricted Pod Security Standard; fsGroup: the `ray` user's group owns "
                       "the volumes",
}


def _why_token(autoscaler: bool) -> str:
    return ("KubeRay's autoscaler sidecar calls the Kubernetes API" if autoscaler
            else "no container of this pod calls the Kubernetes API")


def _head_pod_spec(s: GkeSettings, command: list[str] | None = None,
                   autoscaler: bool = False) -> dict:
    size = pod_sizes(s)["head"]
    selector = {}
    if s.mode == "standard":
        selector["cloud.google.com/gke-nodepool"] = s.head_pool
    elif s.gpu_type != "none":
        selector["cloud.google.com/gke-accelerator"] = s.gpu_type
    ray_head = commented({
        "name": "ray-head", "image": s.image, "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": n, "containerPort": p} for n, p in RAY_PORTS.items()],
        "env": _env(s), "resources": _resources(size), "securityContext": _SECURITY,
        "lifecycle": _STOP_RAY,
        "volumeMounts": [{"name": "runs", "mountPath": RUNS_DIR}, _TMP_MOUNT],
    }, {**_WHY_RAY_CONTAINER,
        "resources": f"requests = limits (Ray sizes itself by them); {HEAD_RESERVED_CPUS} CPUs "
                     "left to GKE and the sidecars"})
    if command:
        ray_head["command"] = command
    tensorboard = commented({
        "name": "tensorboard", "image": s.image, "imagePullPolicy": "IfNotPresent",
        "command": ["tensorboard", f"--logdir={RUNS_DIR}", "--host=0.0.0.0",
                    f"--port={TENSORBOARD_PORT}"],
        "ports": [{"name": "tensorboard", "containerPort": TENSORBOARD_PORT}],
        "resources": _resources(TENSORBOARD_SIZE), "securityContext": _SECURITY,
        "volumeMounts": [{"name": "runs", "mountPath": RUNS_DIR, "readOnly": True}, _TMP_MOUNT],
    }, {"name": "beside the head: only pods on its node can mount the ReadWriteOnce run volume",
        "resources": "part of the head pod's request, which the plan checks against the head node"})
    # Only KubeRay's autoscaler sidecar talks to the Kubernetes API; without it no container
    # of the pod gets the service account's token.
    spec = {"serviceAccountName": s.service_account, "automountServiceAccountToken": autoscaler,
            "securityContext": _POD_SECURITY, "containers": [ray_head, tensorboard],
            "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": f"{s.prefix}-runs"}},
                        _TMP_VOLUME]}
    why = {**_WHY_POD, "automountServiceAccountToken": _why_token(autoscaler),
           "volumes": "runs: checkpoints and TensorBoard logs outlive the pods; tmp: Ray's files"}
    if selector:
        spec["nodeSelector"] = selector
        why["nodeSelector"] = ("the head's on-demand pool: a preemption never takes the replay memory"
                               if s.mode == "standard" else "Autopilot makes a node with this GPU")
    return commented(spec, why)


def _actor_pod_spec(s: GkeSettings, container: dict) -> dict:
    """Actor pods: Spot nodes only, gone within the notice GKE gives them (SPOT_GRACE_S)."""
    return commented({
        "serviceAccountName": s.service_account, "automountServiceAccountToken": False,
        "securityContext": _POD_SECURITY,
        "nodeSelector": dict(SPOT_SELECTOR), "tolerations": [dict(SPOT_TOLERATION)],
        "terminationGracePeriodSeconds": SPOT_GRACE_S,
        "containers": [container], "volumes": [_TMP_VOLUME],
    }, {**_WHY_POD, "automountServiceAccountToken": _why_token(False),
        "nodeSelector": "Spot VMs only: actors are stateless and restartable",
        "tolerations": "the Spot pool's taint, which keeps every other Pod off it",
        "terminationGracePeriodSeconds": "of a Spot VM's ~30 s notice, GKE gives non-system "
                                         "Pods 15 s"})


def _actor_container(s: GkeSettings, mounts: tuple[dict, ...] = (), **extra) -> dict:
    return commented({
        "name": "ray-worker", "image": s.image, "imagePullPolicy": "IfNotPresent",
        "env": _env(s), "resources": _resources(pod_sizes(s)["actor"]),
        "securityContext": _SECURITY, "lifecycle": _STOP_RAY,
        "volumeMounts": [_TMP_MOUNT, *mounts], **extra,
    }, {**_WHY_RAY_CONTAINER,
        "resources": f"requests = limits (Ray sizes itself by them); one pod a node, "
                     f"{ACTOR_RESERVED_CPUS} CPUs left to GKE"})


def ray_cluster_spec(s: GkeSettings) -> dict:
    """The KubeRay cluster spec shared by the RayCluster and the RayJob: the actors group
    grows from 0 to max_actor_nodes pods as Ray asks for CPUs."""
    sizes = pod_sizes(s)
    head_params = {"dashboard-host": "0.0.0.0", "num-cpus": str(sizes["head"].cpu)}
    why_head_params = {
        "dashboard-host": "beyond the pod's localhost: for kubectl port-forward and KubeRay's job client",
        "num-cpus": "= the CPU request, all for the learner: actors go to the Spot pods"}
    if sizes["head"].gpus:
        head_params["num-gpus"] = str(sizes["head"].gpus)
        why_head_params["num-gpus"] = "the learner's GPU, the cluster's only one"
    actors = commented({
        "groupName": "actors",
        "replicas": 0,
        "minReplicas": 0,
        "maxReplicas": s.max_actor_nodes,
        "rayStartParams": commented({"num-cpus": str(sizes["actor"].cpu)},
                                    {"num-cpus": "= the CPU request: one Ape-X actor per CPU"}),
        "template": {"metadata": {"labels": _labels(s, "ray-actors")},
                     "spec": _actor_pod_spec(s, _actor_container(s))},
    }, {"replicas": "the autoscaler's to change: no actor pod until Ray asks for one",
        "minReplicas": "no Spot node is kept while no actor runs",
        "maxReplicas": "the Spot pool's max_actor_nodes: one actor pod fills one node"})
    spec = {
        "rayVersion": RAY_VERSION,
        "enableInTreeAutoscaling": True,
        "headGroupSpec": commented({
            "serviceType": "ClusterIP",
            "rayStartParams": commented(head_params, why_head_params),
            "template": {"metadata": {"labels": _labels(s, "ray-head")},
                         "spec": _head_pod_spec(s, autoscaler=True)},
        }, {"serviceType": "never LoadBalancer: the Jobs API runs any code; use kubectl port-forward"}),
        "workerGroupSpecs": [actors],
    }
    why = {"rayVersion": "the image's Ray (requirements.lock); KubeRay checks it: token auth needs 2.52+",
           "enableInTreeAutoscaling": "KubeRay's autoscaler sidecar grows the actors group as Ray "
                                      "asks for CPUs"}
    spec["autoscalerOptions"] = commented({
        "upscalingMode": "Default", "idleTimeoutSeconds": 60,
        "resources": _resources(AUTOSCALER_SIZE), "securityContext": _SIDECAR_SECURITY,
    }, {"upscalingMode": "not rate-limited: every pending actor pod is asked for at once",
        "idleTimeoutSeconds": "an idle actor pod goes, so that its Spot node can scale down",
        "resources": "KubeRay's default, set so that head_pod_request() is the head pod's request",
        "securityContext": "restricted Pod Security Standard; the root stays writable (it "
                           "shares only /tmp/ray)"})
    # KubeRay >= 1.6 hands the token in this Secret (key auth_token) to the Ray containers,
    # the autoscaler sidecar, the RayJob submitter and its own dashboard client
    # (ray-project/kuberay ray-operator/controllers/ray/common/pod.go, rayjob_controller.go).
    spec["authOptions"] = {"mode": "token", "secretName": token_secret_name(s)}
    why["authOptions"] = ("KubeRay hands this Secret's token to Ray, the autoscaler, the job "
                          "submitter and itself")
    # the shared pieces (_SECURITY, ...) stay unchanged by edits
    return copy.deepcopy(commented(spec, why))


def num_actors(s: GkeSettings) -> int:
    """One Ape-X actor per actor-node CPU."""
    return s.max_actor_nodes * int(pod_sizes(s)["actor"].cpu)


def cluster_train_args(spec: dict) -> list[str]:
    """What a training job needs from a RayCluster's spec (rendered here, or `kubectl get
    raycluster -o json` of a live one): one actor per CPU of the worker groups at full size;
    the head's CPUs to the learner (replay and evaluator take none), so that actors go to the
    Spot pool instead of the head's idle CPUs, where they would compete with the learner (the
    manifest rehearsal showed Ray placing them there); the head's GPU when its Ray container has
    one; and telemetry on, which the pods' OTEL_* env sends to Managed OpenTelemetry (notebook
    05 reads it from Cloud Monitoring)."""
    actors = sum(group["maxReplicas"] * int(group["rayStartParams"]["num-cpus"])
                 for group in spec.get("workerGroupSpecs", []))
    head_group = spec["headGroupSpec"]
    head = head_group["template"]["spec"]["containers"][0]
    limits = head.get("resources", {}).get("limits", {})
    head_cpus = int(head_group.get("rayStartParams", {}).get("num-cpus", limits.get("cpu", 1)))
    gpus = int(limits.get("nvidia.com/gpu", 0))
    return ["--num-actors", str(actors), "--actor-cpus", "1", "--learner-cpus", str(head_cpus),
            "--num-gpus", "1" if gpus >= 1 else "0", "--telemetry", "true"]


def training_command(s: GkeSettings, output_dir: str = f"{RUNS_DIR}/rayjob") -> list[str]:
    """The RayJob's entrypoint: the settings' workload (WORKLOADS) on this cluster."""
    return ["python", "-m", "distrl.apex.train", *WORKLOADS[s.workload].command_args(),
            *cluster_train_args(ray_cluster_spec(s)),
            "--output-dir", output_dir, "--progress", "false",
            # Spot pods join over minutes (or not at all): wait for them, never refuse.
            "--autoscaling", "true"]


def _namespace_meta(s: GkeSettings) -> dict:
    """Pod Security Admission: the API server refuses pods below "baseline" and warns about
    (and audits) any below "restricted", which all of ours meet. Not "enforce: restricted":
    pods KubeRay makes itself (the RayJob's submitter) are outside our templates, and a refused
    submitter would fail the job (kubernetes.io/docs/concepts/security/pod-security-admission)."""
    meta = _meta(s, s.namespace, "namespace", namespaced=False)
    meta["labels"] = {**meta["labels"], "pod-security.kubernetes.io/enforce": "baseline",
                      "pod-security.kubernetes.io/warn": "restricted",
                      "pod-security.kubernetes.io/audit": "restricted"}
    return meta


def namespace_docs(s: GkeSettings) -> list[dict]:
    return [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": _namespace_meta(s)},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {**_meta(s, s.service_account, "identity"),
                      "annotations": {"iam.gke.io/gcp-service-account": s.gsa_email}}},
    ]


def network_policy(s: GkeSettings) -> dict:
    """Pods of this namespace reach every port of its pods; the Ray dashboard port (8265, also
    the Jobs API) is open to the KubeRay operator, which polls it for RayJob status: from its
    namespace when settings.operator_namespace names one, else from any source (GKE hosts the
    add-on's operator and its docs do not say where), where Ray's token guards it."""
    dashboard = {"ports": [{"port": RAY_PORTS["dashboard"], "protocol": "TCP"}]}
    if s.operator_namespace:
        dashboard["from"] = [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": s.operator_namespace}}}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(s, f"{s.prefix}-ingress", "network-policy"),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {}}]}, dashboard]}}


def egress_policy(s: GkeSettings) -> dict:
    """What the pods may reach, and only that: the namespace's own pods (Ray), DNS (kube-dns,
    and the node-local addresses NodeLocal DNSCache and Cloud DNS answer on, which no pod
    selector matches), GKE's managed collector, the GKE metadata server (Workload Identity's
    tokens: 169.254.169.254:80, or 169.254.169.252:988 on clusters without Dataplane V2), and
    HTTPS to settings.https_egress_cidrs (Google APIs, the API server for the autoscaler).
    Code sent through the Jobs API can then reach nothing else.

    Under Dataplane V2 the metadata server's traffic is rewritten to the node's own address on
    port 988 before the policy sees it (gke-labs/kube-agents#676; Google's docs name only the
    two addresses above), and node addresses are not known when this is rendered: a pod that
    fetches a Workload Identity token (gcsfs for gs:// checkpoints, say) may be refused. Nothing
    the series runs in the pods needs one: telemetry goes to the in-cluster collector and
    checkpoints to the run volume."""
    tcp = lambda *ports: [{"port": p, "protocol": "TCP"} for p in ports]  # noqa: E731
    dns = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}},
           {"ipBlock": {"cidr": "169.254.20.10/32"}}, {"ipBlock": {"cidr": "169.254.169.254/32"}}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(s, f"{s.prefix}-egress", "network-policy"),
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [
                {"to": [{"podSelector": {}}]},
                {"to": dns, "ports": [{"port": 53, "protocol": "UDP"}, *tcp(53)]},
                {"to": [{"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": MANAGED_OTEL_NAMESPACE}}}],
                 "ports": tcp(*sorted(OTLP_PORTS.values()))},
                {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}], "ports": tcp(80)},
                {"to": [{"ipBlock": {"cidr": "169.254.169.252/32"}}], "ports": tcp(988)},
                {"to": [{"ipBlock": {"cidr": c.strip()}} for c in s.https_egress_cidrs.split(",")],
                 "ports": tcp(443)},
            ]}}


def runs_storage_class(s: GkeSettings) -> dict:
    """The run volume's class: GKE's pd-balanced disk, carrying the plan's labels (the CSI
    driver's `labels` parameter, kubernetes-sigs/gcp-compute-persistent-disk-csi-driver
    README), so a teardown finds a disk the cluster's deletion left behind."""
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": _meta(s, f"{s.prefix}-runs", "runs", namespaced=False),
            "provisioner": "pd.csi.storage.gke.io",
            "parameters": {"type": "pd-balanced",
                           "labels": ",".join(f"{k}={v}" for k, v in s.labels.items())},
            "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": True}


def runs_volume(s: GkeSettings) -> dict:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(s, f"{s.prefix}-runs", "runs"),
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": f"{s.prefix}-runs",
                     "resources": {"requests": {"storage": f"{RUNS_VOLUME_GB}Gi"}}}}


def tensorboard_service(s: GkeSettings, head_component: str = "ray-head") -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(s, f"{s.prefix}-tensorboard", "tensorboard"),
            "spec": {"type": "ClusterIP", "selector": _labels(s, head_component),
                     "ports": [{"name": "tensorboard", "port": TENSORBOARD_PORT,
                                "targetPort": TENSORBOARD_PORT}]}}


def ray_cluster(s: GkeSettings) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": _meta(s, s.prefix, "ray-cluster"), "spec": ray_cluster_spec(s)}


# KubeRay counts a RayJob's activeDeadlineSeconds from the job's start (Status.StartTime, set
# before its cluster is created), and a job past it is Failed (DeadlineExceeded), its cluster
# deleted, without a retry (ray-project/kuberay ray-operator/controllers/ray/rayjob_controller.go).
# The run's own budget (--max-seconds) counts from its driver's start: the deadline adds the
# head's start before it (NODE_READY_S: node, ~8 GB image, GPU driver) and the run's close after
# it (final evaluation, checkpoint, results.json), so the run, not KubeRay, ends the run.
JOB_CLOSE_S = 600


def job_deadline_s(s: GkeSettings) -> int:
    """The RayJob's activeDeadlineSeconds: the head's start, the run's budget, its close."""
    return round(NODE_READY_S + WORKLOADS[s.workload].run_hours * 3600 + JOB_CLOSE_S)


def ray_job(s: GkeSettings) -> dict:
    spec = commented({
        "entrypoint": shlex.join(training_command(s)),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": 0,
        "activeDeadlineSeconds": job_deadline_s(s),
        "submissionMode": "K8sJobMode",
        # Autoscaled like the RayCluster: KubeRay starts a job's submitter once its cluster is
        # ready, and a cluster with minReplicas = maxReplicas is ready only when every Spot
        # worker runs, so one Spot node that never came held the job (and the billing head)
        # until activeDeadlineSeconds. From 0, the job starts on the head; actors join as their
        # nodes come, and a run with no actor for actor_wait_s ends itself ("no_actors").
        # (ray-project/kuberay ray-operator/controllers/ray/rayjob_controller.go: the submitter
        # waits for the cluster's Ready state, which needs every desired worker pod running.)
        "rayClusterSpec": ray_cluster_spec(s),
    }, {"entrypoint": "one actor per Spot CPU; the head's CPUs and GPU to the learner "
                      "(cluster_train_args)",
        "shutdownAfterJobFinishes": "the cluster bills by the hour; the results are on the run volume",
        "ttlSecondsAfterFinished": "the cluster goes as the job ends (Spot nodes bill until then); "
                                   "the submitter Job keeps the log",
        "activeDeadlineSeconds": "caps what a stuck job bills: the head's start, the run's "
                                 "--max-seconds, its close (job_deadline_s)",
        "submissionMode": "a submitter Job follows the run's log: kubectl logs job/<this RayJob>",
        "rayClusterSpec": "a cluster of its own (delete the RayCluster first), grown from 0: "
                          "the job starts on the head"})
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": _meta(s, f"{s.prefix}-train", "ray-job"), "spec": spec}


def wait_for_head_script() -> str:
    return resources.files("distrl").joinpath("scripts/wait-for-head.sh").read_text()


def plain_docs(s: GkeSettings) -> list[dict]:
    """The seed's shape, without the operator: headless Service, head pod, actor Deployment."""
    sizes = pod_sizes(s)
    head_name = f"{s.prefix}-head"
    head_cmd = ["ray", "start", "--head", "--block", "--dashboard-host=0.0.0.0",
                f"--port={RAY_PORTS['gcs-server']}", f"--num-cpus={sizes['head'].cpu}"]
    if sizes["head"].gpus:
        head_cmd.append(f"--num-gpus={sizes['head'].gpus}")
    token_env, token_volume, token_mount = _token_file(s)
    head_spec = _head_pod_spec(s, command=head_cmd)
    head_spec["containers"][0]["env"] += token_env
    head_spec["containers"][0]["volumeMounts"].append(token_mount)
    head_spec["volumes"].append(token_volume)
    head_pod = {"apiVersion": "v1", "kind": "Pod",
                "metadata": _meta(s, head_name, "plain-head"), "spec": head_spec}
    script = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": _meta(s, f"{s.prefix}-wait-for-head", "plain-actors"),
              "data": {"wait-for-head.sh": wait_for_head_script()}}
    container = _actor_container(
        s, mounts=({"name": "scripts", "mountPath": "/opt/distrl", "readOnly": True},
                   token_mount),
        command=["/bin/sh", "/opt/distrl/wait-for-head.sh", "--block"])
    container["env"] = [*container["env"], *token_env,
                        {"name": "RAY_HEAD_ADDRESS",
                         "value": f"{head_name}.{s.namespace}.svc.cluster.local:"
                                  f"{RAY_PORTS['gcs-server']}"},
                        {"name": "RAY_NUM_CPUS", "value": str(sizes["actor"].cpu)},
                        {"name": "WAIT_FOR_HEAD_TIMEOUT_S", "value": "600"}]
    actor_spec = _actor_pod_spec(s, container)
    actor_spec["volumes"] += [{"name": "scripts", "configMap": {
        "name": f"{s.prefix}-wait-for-head", "defaultMode": 0o555}}, token_volume]
    actors = {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": _meta(s, f"{s.prefix}-actors", "plain-actors"),
              "spec": {"replicas": s.max_actor_nodes,
                       "selector": {"matchLabels": _labels(s, "plain-actors")},
                       "template": {"metadata": {"labels": _labels(s, "plain-actors")},
                                    "spec": actor_spec}}}
    headless = {"apiVersion": "v1", "kind": "Service",
                "metadata": _meta(s, head_name, "plain-head"),
                "spec": {"clusterIP": "None", "selector": _labels(s, "plain-head"),
                         "ports": [{"name": n, "port": p, "targetPort": p}
                                   for n, p in RAY_PORTS.items()]}}
    return copy.deepcopy([headless, head_pod, script, actors])


def render(s: GkeSettings) -> dict[str, list[dict]]:
    """Relative file path -> the documents in it."""
    return {
        "cluster/00-namespace.yaml": namespace_docs(s),
        "cluster/10-network-policy.yaml": [network_policy(s), egress_policy(s)],
        "cluster/20-runs-volume.yaml": [runs_storage_class(s), runs_volume(s)],
        "cluster/30-raycluster.yaml": [ray_cluster(s)],
        "cluster/40-tensorboard.yaml": [tensorboard_service(s)],
        "job/rayjob.yaml": [ray_job(s)],
        "plain/00-namespace.yaml": namespace_docs(s),
        "plain/10-network-policy.yaml": [network_policy(s), egress_policy(s)],
        "plain/20-runs-volume.yaml": [runs_storage_class(s), runs_volume(s)],
        "plain/30-head.yaml": plain_docs(s)[:2],
        "plain/40-actors.yaml": plain_docs(s)[2:],
        "plain/50-tensorboard.yaml": [tensorboard_service(s, "plain-head")],
    }


def dump(docs: list[dict]) -> str:
    """YAML as people write it: no anchors for shared pieces, scripts as literal blocks, and the
    comments of Commented mappings on a line of their own above their field."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    def text(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    Dumper.add_representer(Commented, Dumper.represent_dict)
    return "---\n".join(with_comments(yaml.dump(d, Dumper=Dumper, sort_keys=False, width=100),
                                      comments(d)) for d in docs)


def with_comments(text: str, notes: dict[tuple, str]) -> str:
    """text, one YAML document, with a `# note` line above the field at each path of notes
    (keys and list indices, as comments() gives them), indented like the field's line. A path
    that is not in the document is an error."""
    import yaml

    def where(node, path: tuple):
        """The node that starts the line of the field at path: its key, or a list item."""
        if not path:
            return node
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == path[0]:
                    return where(value, path[1:]) if path[1:] else key
        elif isinstance(node, yaml.SequenceNode) and isinstance(path[0], int) \
                and 0 <= path[0] < len(node.value):
            return where(node.value[path[0]], path[1:])
        return None

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    lines = text.splitlines(keepends=True)
    above: dict[int, list[str]] = {}
    for path, note in notes.items():
        if (node := where(root, path)) is None:
            raise ValueError(f"a comment for {'.'.join(map(str, path))}, which the YAML does not "
                             f"have: {note!r}")
        line = lines[node.start_mark.line]
        indent = line[:len(line) - len(line.lstrip(" "))]
        above.setdefault(node.start_mark.line, []).append(f"{indent}# {note}\n")
    return "".join("".join(above.get(i, [])) + line for i, line in enumerate(lines))


HEADER = ("# Generated by distrl.gke.manifests from GkeSettings(project_id='my-project-id', ...).\n"
          "# Regenerate: python -m distrl.gke.manifests k8s   (notebook 03 renders your own values)\n")


def write_manifests(s: GkeSettings, directory: str | Path) -> list[Path]:
    """Write every manifest under directory; returns the paths written."""
    directory = Path(directory)
    written = []
    for rel, docs in render(s).items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((HEADER if s == DEFAULTS else "") + dump(docs))
        written.append(path)
    return written


def load_dir(directory: str | Path) -> list[tuple[Path, dict]]:
    """(file, document) for every YAML document under directory."""
    import yaml

    out = []
    for path in sorted(Path(directory).rglob("*.yaml")):
        out += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return out


# --- validation ----------------------------------------------------------------------------

def validate(doc: dict, kubernetes_version: str = KUBERNETES_VERSION) -> None:
    """Raise ValueError naming the problem: core kinds against the Kubernetes OpenAPI schema in
    strict mode (unknown fields are errors), KubeRay kinds against the fields KubeRay requires,
    including their pod templates as strict Pods; every pod against the restricted Pod Security
    Standard."""
    if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
        raise ValueError(f"not a Kubernetes object (needs apiVersion and kind): {doc!r:.200}")
    name = f"{doc['kind']} {doc.get('metadata', {}).get('name', '?')}"
    if doc["apiVersion"] == "ray.io/v1":
        _check_kuberay(doc, name, kubernetes_version)
    else:
        _strict(doc, name, kubernetes_version)
    for where, pod_spec in _pod_specs(doc):
        if problems := restricted_problems(pod_spec, where):
            raise ValueError(f"{name} does not meet the restricted Pod Security Standard: "
                             + "; ".join(problems))
    autoscaler = doc.get("spec", {}).get("autoscalerOptions")
    if autoscaler is not None and restricted_problems(
            {"containers": [{"name": "autoscaler", **autoscaler}],
             "securityContext": _pod_specs(doc)[0][1].get("securityContext", {})}):
        raise ValueError(f"{name}: spec.autoscalerOptions.securityContext: KubeRay's autoscaler "
                         "sidecar must meet the restricted Pod Security Standard too "
                         "(allowPrivilegeEscalation false, capabilities drop ALL)")
    if doc["kind"] == "Service" and doc.get("spec", {}).get("type") in ("LoadBalancer", "NodePort"):
        raise ValueError(f"{name}: spec.type={doc['spec']['type']} exposes the service outside the "
                         "cluster; use ClusterIP and kubectl port-forward")


# The "restricted" Pod Security Standard, rule by rule (kubernetes/pod-security-admission
# policy/check_*.go, the checks the API server runs; kubernetes.io/docs/concepts/security/
# pod-security-standards). Restricted includes baseline.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret", "image"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def restricted_problems(pod_spec: dict, where: str = "spec") -> list[str]:
    """Where a pod spec falls short of the restricted Pod Security Standard, one line per rule
    broken (empty: it passes)."""
    problems = []
    pod_security = pod_spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            problems.append(f"{where}.{key}: host namespaces are not allowed")
    for volume in pod_spec.get("volumes", []):
        kind = next((k for k in volume if k != "name"), None)
        if kind not in RESTRICTED_VOLUMES:
            problems.append(f"{where}.volumes[{volume.get('name')}]: type {kind} is not allowed")
    for sysctl in pod_security.get("sysctls", []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"{where}.securityContext.sysctls: {sysctl.get('name')} is not safe")
    if pod_security.get("runAsUser") == 0:
        problems.append(f"{where}.securityContext.runAsUser: 0 (root) is not allowed")
    seccomp_ok = {"RuntimeDefault", "Localhost"}
    pod_seccomp = pod_security.get("seccompProfile", {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in seccomp_ok:
        problems.append(f"{where}.securityContext.seccompProfile: {pod_seccomp} is not allowed")
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod_spec.get(group, []):
            at = f"{where}.{group}[{c.get('name')}].securityContext"
            sc = c.get("securityContext", {})
            if sc.get("privileged"):
                problems.append(f"{at}.privileged: privileged containers are not allowed")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{at}.allowPrivilegeEscalation: must be set to false")
            caps = sc.get("capabilities", {})
            if "ALL" not in caps.get("drop", []):
                problems.append(f"{at}.capabilities.drop: must include ALL")
            if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
                problems.append(f"{at}.capabilities.add: only NET_BIND_SERVICE is allowed")
            if not sc.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
                problems.append(f"{at}.runAsNonRoot: must be true (here or for the pod)")
            if sc.get("runAsUser") == 0:
                problems.append(f"{at}.runAsUser: 0 (root) is not allowed")
            seccomp = sc.get("seccompProfile", {}).get("type", pod_seccomp)
            if seccomp not in seccomp_ok:
                problems.append(f"{at}.seccompProfile: must be RuntimeDefault or Localhost "
                                "(here or for the pod)")
            if sc.get("procMount", "Default") != "Default":
                problems.append(f"{at}.procMount: must be Default")
            if any(p.get("hostPort") for p in c.get("ports", [])):
                problems.append(f"{where}.{group}[{c.get('name')}].ports: hostPort is not allowed")
    return problems


def _pod_specs(doc: dict) -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod a document makes: Pods, workload templates, the head and
    worker groups of RayClusters and RayJobs."""
    spec = doc.get("spec", {})
    if doc["kind"] == "Pod":
        return [("spec", spec)]
    if "template" in spec:
        return [("spec.template.spec", spec["template"].get("spec", {}))]
    cluster, where = (spec.get("rayClusterSpec", {}), "spec.rayClusterSpec") \
        if doc["kind"] == "RayJob" else (spec, "spec")
    out = []
    if "headGroupSpec" in cluster:
        out.append((f"{where}.headGroupSpec.template.spec",
                    cluster["headGroupSpec"]["template"].get("spec", {})))
    for i, group in enumerate(cluster.get("workerGroupSpecs", [])):
        out.append((f"{where}.workerGroupSpecs[{i}].template.spec",
                    group["template"].get("spec", {})))
    return out


def _strict(doc: dict, name: str, kubernetes_version: str) -> None:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        raise ValueError(f"{name}: {path or '(top)'}: {e.message}") from None


def _need(obj: dict, key: str, kind: type | tuple, where: str):
    if key not in obj:
        raise ValueError(f"{where}: missing required field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        kinds = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValueError(f"{where}.{key}: expected {kinds}, got {type(value).__name__} {value!r}")
    return value


def _check_group(group: dict, where: str, name: str, kubernetes_version: str) -> None:
    params = _need(group, "rayStartParams", dict, where)
    for k, v in params.items():
        if not isinstance(v, str):  # KubeRay's CRD types rayStartParams as map[string]string
            raise ValueError(f"{where}.rayStartParams.{k}: expected a string, got {v!r}")
    template = _need(group, "template", dict, where)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "template", **template.get("metadata", {})},
           "spec": _need(template, "spec", dict, f"{where}.template")}
    _strict(pod, f"{name} {where}.template", kubernetes_version)
    containers = pod["spec"]["containers"]
    ray_container = containers[0]  # KubeRay runs Ray in the first container
    requests = ray_container.get("resources", {}).get("requests", {})
    limits = ray_container.get("resources", {}).get("limits", {})
    if requests != limits:
        raise ValueError(f"{where}: the Ray container's requests {requests} differ from its "
                         f"limits {limits} (Ray sizes itself by them; keep them equal)")
    if "num-cpus" in params and params["num-cpus"] != str(requests.get("cpu")):
        raise ValueError(f"{where}: rayStartParams num-cpus={params['num-cpus']} does not match "
                         f"the CPU request {requests.get('cpu')}")


def _check_cluster_spec(spec: dict, where: str, name: str, kubernetes_version: str) -> None:
    version = _need(spec, "rayVersion", str, where)
    if version != RAY_VERSION:
        raise ValueError(f"{where}.rayVersion={version!r} differs from the locked Ray {RAY_VERSION}")
    auth = _need(spec, "authOptions", dict, where)
    if auth.get("mode") != "token" or not isinstance(auth.get("secretName"), str):
        raise ValueError(f"{where}.authOptions={auth!r}: expected mode 'token' and a secretName "
                         "(KubeRay >= 1.6 then gives the token to the autoscaler and itself)")
    head = _need(spec, "headGroupSpec", dict, where)
    _check_group(head, f"{where}.headGroupSpec", name, kubernetes_version)
    if head.get("serviceType", "ClusterIP") not in ("ClusterIP",):
        raise ValueError(f"{where}.headGroupSpec.serviceType={head['serviceType']!r}: keep the "
                         "head ClusterIP and use kubectl port-forward (the Jobs API runs any code)")
    for i, group in enumerate(spec.get("workerGroupSpecs", [])):
        w = f"{where}.workerGroupSpecs[{i}]"
        _need(group, "groupName", str, w)
        low, high = _need(group, "minReplicas", int, w), _need(group, "maxReplicas", int, w)
        replicas = _need(group, "replicas", int, w)
        if not 0 <= low <= replicas <= high:
            raise ValueError(f"{w}: needs 0 <= minReplicas ({low}) <= replicas ({replicas}) <= "
                             f"maxReplicas ({high})")
        _check_group(group, w, name, kubernetes_version)


def _check_kuberay(doc: dict, name: str, kubernetes_version: str) -> None:
    meta = _need(doc, "metadata", dict, name)
    _need(meta, "name", str, f"{name}.metadata")
    spec = _need(doc, "spec", dict, name)
    if doc["kind"] == "RayCluster":
        _check_cluster_spec(spec, "spec", name, kubernetes_version)
    elif doc["kind"] == "RayJob":
        _need(spec, "entrypoint", str, "spec")
        _need(spec, "shutdownAfterJobFinishes", bool, "spec")
        ttl = _need(spec, "ttlSecondsAfterFinished", int, "spec")
        if ttl < 0:
            raise ValueError(f"{name}: spec.ttlSecondsAfterFinished={ttl} must be >= 0")
        _check_cluster_spec(_need(spec, "rayClusterSpec", dict, "spec"), "spec.rayClusterSpec",
                            name, kubernetes_version)
    else:
        raise ValueError(f"{name}: unknown ray.io/v1 kind {doc['kind']!r} (RayCluster, RayJob)")


if __name__ == "__main__":
    import sys

    out = sys.argv[1] if len(sys.argv) > 1 else "k8s"
    for p in write_manifests(DEFAULTS, out):
        print(p)
