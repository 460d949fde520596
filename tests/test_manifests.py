"""k8s/ manifests: strict schema validation, KubeRay's required fields, agreement of the lock
file, Dockerfile and manifests on versions, hadolint, and the wait-for-head script run for real."""

import copy
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from distrl.cluster.local import forget_cluster
from distrl.gke import manifests as m
from distrl.gke.settings import (
    IMAGE_PYTHON,
    IMAGE_PYTHON_ENV,
    RAY_VERSION,
    WORKLOADS,
    GkeSettings,
)

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
VARIANTS = {
    "defaults": m.DEFAULTS,
    "t4-prefix": GkeSettings(project_id="demo-project-1", prefix="rl-exp", zone="us-central1-b",
                             gpu_type="nvidia-tesla-t4", max_actor_nodes=10,
                             actor_machine_type="n2-standard-32"),
    "cpu-only": GkeSettings(project_id="demo-project-1", gpu_type="none"),
    "autopilot": GkeSettings(project_id="demo-project-1", mode="autopilot"),
}


def locked(name: str) -> str:
    text = (ROOT / "requirements.lock").read_text()
    return re.search(rf"^{re.escape(name)}==(\S+)$", text, re.M | re.I).group(1)


def test_shipped_manifests_are_the_rendering_of_the_defaults(tmp_path):
    """k8s/ is generated; a hand edit that the code does not know about is caught here."""
    written = m.write_manifests(m.DEFAULTS, tmp_path)
    shipped = sorted(p.relative_to(K8S) for p in K8S.rglob("*.yaml")
                     if "monitoring" not in p.parts)
    assert shipped == sorted(p.relative_to(tmp_path) for p in written)
    for rel in shipped:
        assert (K8S / rel).read_text() == (tmp_path / rel).read_text(), \
            f"k8s/{rel} differs from the rendering: run `python -m distrl.gke.manifests k8s`"


def test_every_shipped_manifest_validates_strictly():
    docs = m.load_dir(K8S)
    kinds = {d["kind"] for _, d in docs}
    assert {"Namespace", "ServiceAccount", "NetworkPolicy", "PersistentVolumeClaim", "Service",
            "RayCluster", "RayJob", "Pod", "ConfigMap", "Deployment"} <= kinds
    for _, doc in docs:
        m.validate(doc)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_manifests_validate_for_every_variant(variant, tmp_path):
    s = VARIANTS[variant]
    m.write_manifests(s, tmp_path)
    docs = m.load_dir(tmp_path)
    for _, doc in docs:
        m.validate(doc)
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == s.prefix
        if doc["kind"] not in ("Namespace", "StorageClass"):  # cluster-wide kinds
            assert doc["metadata"]["namespace"] == s.namespace
    cluster = next(d for _, d in docs if d["kind"] == "RayCluster")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    actors = cluster["spec"]["workerGroupSpecs"][0]
    sizes = m.pod_sizes(s)
    assert actors["maxReplicas"] == s.max_actor_nodes and actors["minReplicas"] == 0
    assert actors["rayStartParams"]["num-cpus"] == str(sizes["actor"].cpu)
    assert actors["template"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    assert head["containers"][0]["image"] == s.image
    assert head["serviceAccountName"] == s.service_account
    assert "cloud.google.com/gke-spot" not in head.get("nodeSelector", {})  # head not on Spot
    gpu = head["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
    assert gpu == (None if s.gpu_type == "none" else "1")
    if s.mode == "standard":
        assert head["nodeSelector"] == {"cloud.google.com/gke-nodepool": s.head_pool}
    elif s.gpu_type != "none":
        assert head["nodeSelector"] == {"cloud.google.com/gke-accelerator": s.gpu_type}
    job = next(d for _, d in docs if d["kind"] == "RayJob")
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["ttlSecondsAfterFinished"] == 0  # the cluster goes as the job ends
    assert f"--num-actors {m.num_actors(s)}" in job["spec"]["entrypoint"]


def test_no_service_leaves_the_cluster_and_only_the_dashboard_port_admits_the_operator():
    docs = [d for _, d in m.load_dir(K8S)]
    for d in docs:
        if d["kind"] == "Service":
            assert d["spec"].get("type", "ClusterIP") == "ClusterIP"
        if d["kind"] == "RayCluster":
            assert d["spec"]["headGroupSpec"]["serviceType"] == "ClusterIP"
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    # Every port from the namespace's own pods; 8265 (dashboard, Jobs API) for the KubeRay
    # operator, which polls it for RayJob status: from anywhere by default (GKE hosts the
    # add-on's operator; Ray's token guards the port), from its namespace when it is known.
    dashboard = {"ports": [{"port": 8265, "protocol": "TCP"}]}
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": {}}]}, dashboard]}
    named = m.network_policy(GkeSettings(project_id="demo-project-1",
                                         operator_namespace="ray-system"))
    assert named["spec"]["ingress"][1] == {**dashboard, "from": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}}]}
    m.validate(named)


def test_kuberay_gets_the_token_from_auth_options_and_telemetry_goes_to_the_managed_collector():
    cluster = next(d for _, d in m.load_dir(K8S) if d["kind"] == "RayCluster")
    job = next(d for _, d in m.load_dir(K8S) if d["kind"] == "RayJob")
    for spec in (cluster["spec"], job["spec"]["rayClusterSpec"]):
        assert spec["authOptions"] == {"mode": "token", "secretName": "distrl-ray-token"}
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in head["env"]}
    # The documented endpoint: OTLP/HTTP on 4318 (gRPC only from GKE 1.37.1-gke.1697000).
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == \
        "http://opentelemetry-collector.gke-managed-otel.svc.cluster.local:4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"]["value"] == "http/protobuf"
    assert env["OTEL_SERVICE_NAME"]["value"] == "rl-training-service"
    assert "RAY_AUTH_TOKEN" not in env  # KubeRay injects it from authOptions
    grpc = m.ray_cluster(GkeSettings(project_id="demo-project-1", otlp_protocol="grpc"))
    env = {e["name"]: e.get("value") for e in
           grpc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith(":4317")
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    # Without the operator, the plain manifests mount the token as a file (no env variable
    # that every process and job of the pod inherits).
    plain = {d["kind"]: d for _, d in m.load_dir(K8S / "plain")}
    for spec in (plain["Pod"]["spec"], plain["Deployment"]["spec"]["template"]["spec"]):
        container = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RAY_AUTH_MODE"] == "token" and "RAY_AUTH_TOKEN" not in env
        assert env["RAY_AUTH_TOKEN_PATH"] == f"{m.TOKEN_DIR}/auth_token"
        assert {"name": "ray-token", "mountPath": m.TOKEN_DIR, "readOnly": True} in \
            container["volumeMounts"]
        assert {"name": "ray-token", "secret": {"secretName": "distrl-ray-token",
                                                "defaultMode": 0o440}} in spec["volumes"]


def test_every_pod_meets_the_restricted_pod_security_standard():
    docs = [d for _, d in m.load_dir(K8S)]
    pods = [(d["kind"], where, spec) for d in docs for where, spec in m._pod_specs(d)]
    assert {kind for kind, _, _ in pods} == {"RayCluster", "RayJob", "Pod", "Deployment"}
    for kind, where, spec in pods:
        assert m.restricted_problems(spec, where) == [], (kind, where)
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]  # Ray writes here
    # Only the head with KubeRay's autoscaler gets the service account's token.
    tokens = {(kind, where): spec["automountServiceAccountToken"] for kind, where, spec in pods}
    assert [key for key, mounted in tokens.items() if mounted] == [
        ("RayCluster", "spec.headGroupSpec.template.spec"),
        ("RayJob", "spec.rayClusterSpec.headGroupSpec.template.spec")]
    namespace = next(d for d in docs if d["kind"] == "Namespace")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/warn"] == "restricted"
    assert namespace["pod-security.kubernetes.io/enforce"] == "baseline"


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_only_actor_pods_tolerate_the_spot_pools_taint(workload, tmp_path):
    """The plan taints the Spot pool; every actor template (RayCluster, RayJob, the plain
    Deployment) tolerates the taint and selects Spot nodes, and no other Pod tolerates it, so
    nothing else keeps a Spot node up or is preempted with it."""
    from distrl.gke.create import create_plan, spot_taint_flag

    s = GkeSettings.for_workload(workload, project_id="my-project-id")
    plan = create_plan(s, tmp_path / "manifests", tmp_path / "token")
    creates = {step.argv[4]: step.argv for step in plan
               if step.argv[:4] == ("gcloud", "container", "node-pools", "create")}
    pool, head_pool = creates[s.actor_pool], creates[s.head_pool]
    assert "--spot" in pool and spot_taint_flag() in pool
    assert spot_taint_flag() == "--node-taints=cloud.google.com/gke-spot=true:NoSchedule"
    assert not any(arg.startswith("--node-taints") for arg in head_pool)
    actors = others = 0
    for docs in m.render(s).values():
        for doc in docs:
            for where, spec in m._pod_specs(doc):
                tolerations = spec.get("tolerations", [])
                if "workerGroupSpecs" in where or doc["kind"] == "Deployment":
                    actors += 1
                    assert tolerations == [m.SPOT_TOLERATION], (doc["kind"], where)
                    assert spec["nodeSelector"] == m.SPOT_SELECTOR, (doc["kind"], where)
                else:
                    others += 1
                    # nor by a wildcard: a toleration without a key and with operator Exists
                    # tolerates every taint (kubernetes.io's taint-and-toleration page)
                    assert not any(t.get("key") == m.SPOT_TAINT["key"] or (
                        not t.get("key") and t.get("operator") == "Exists")
                        for t in tolerations), (doc["kind"], where)
    assert actors == 3 and others >= 3, (actors, others)


@pytest.mark.parametrize("break_it, rule", [
    (lambda spec: spec["securityContext"].pop("seccompProfile"), "seccompProfile: must be"),
    (lambda spec: spec["containers"][0]["securityContext"].update(privileged=True),
     "privileged containers"),
    (lambda spec: spec["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
     "allowPrivilegeEscalation: must be set to false"),
    (lambda spec: spec["containers"][0]["securityContext"]["capabilities"].update(
        add=["SYS_ADMIN"]), "only NET_BIND_SERVICE"),
    (lambda spec: spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
     "type hostPath is not allowed"),
    (lambda spec: spec.update(hostNetwork=True), "host namespaces"),
    (lambda spec: spec["securityContext"].update(runAsNonRoot=False, runAsUser=0),
     "runAsNonRoot: must be true"),
    (lambda spec: spec["containers"][0]["ports"].append({"containerPort": 1, "hostPort": 80}),
     "hostPort is not allowed"),
])
def test_a_pod_below_the_restricted_standard_is_refused_by_rule(break_it, rule):
    cluster = m.ray_cluster(m.DEFAULTS)
    break_it(cluster["spec"]["headGroupSpec"]["template"]["spec"])
    with pytest.raises(ValueError, match=f"restricted Pod Security Standard.*{rule}"):
        m.validate(cluster)
    cluster = m.ray_cluster(m.DEFAULTS)
    cluster["spec"]["autoscalerOptions"].pop("securityContext")
    with pytest.raises(ValueError, match="autoscaler sidecar must meet"):
        m.validate(cluster)


@pytest.mark.parametrize("workload", ["cartpole", "pong"])
def test_kuberay_s_deadline_leaves_the_run_its_whole_budget(workload):
    """KubeRay counts activeDeadlineSeconds from the RayJob's start, the head's start-up
    included; the run's --max-seconds counts from its driver's. A deadline equal to the budget
    (4 h for Pong, as it was) kills the run before it writes results.json."""
    import shlex

    from distrl.gke.settings import NODE_READY_S

    job = m.ray_job(GkeSettings.for_workload(workload, project_id="demo-project-1"))
    argv = shlex.split(job["spec"]["entrypoint"])
    budget = float(argv[argv.index("--max-seconds") + 1])
    assert job["spec"]["activeDeadlineSeconds"] >= NODE_READY_S + budget + m.JOB_CLOSE_S


def test_pods_reach_only_what_they_need():
    policy = next(d for _, d in m.load_dir(K8S) if d["kind"] == "NetworkPolicy"
                  and d["spec"]["policyTypes"] == ["Egress"])
    assert policy["spec"]["podSelector"] == {}  # every pod of the namespace
    rules = policy["spec"]["egress"]
    reach = {(tuple(sorted(str(t) for t in r["to"])),
              tuple((p["port"], p["protocol"]) for p in r.get("ports", []))) for r in rules}
    assert (("{'podSelector': {}}",), ()) in reach  # Ray between its pods, every port
    dns = next(r for r in rules if {"port": 53, "protocol": "UDP"} in r.get("ports", []))
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}} in dns["to"]
    otel = next(r for r in rules if {"port": 4318, "protocol": "TCP"} in r.get("ports", []))
    assert otel["to"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "gke-managed-otel"}}}]
    https = next(r for r in rules if r.get("ports") == [{"port": 443, "protocol": "TCP"}])
    assert https["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    ports = {p["port"] for r in rules for p in r.get("ports", [])}
    assert ports == {53, 80, 443, 988, 4317, 4318}  # nothing else leaves the namespace
    private = m.egress_policy(GkeSettings(project_id="demo-project-1",
                                          https_egress_cidrs="199.36.153.8/30, 34.1.2.3/32"))
    assert private["spec"]["egress"][-1]["to"] == [{"ipBlock": {"cidr": "199.36.153.8/30"}},
                                                   {"ipBlock": {"cidr": "34.1.2.3/32"}}]
    m.validate(private)
    with pytest.raises(ValueError, match="https_egress_cidrs='anywhere'"):
        GkeSettings(project_id="demo-project-1", https_egress_cidrs="anywhere")


def test_the_head_pod_leaves_room_for_gke_system_pods():
    """g2-standard-8: 7.91 CPU allocatable; Ray 5 + TensorBoard 0.5 + the autoscaler sidecar
    0.5 (set explicitly, KubeRay's default) leaves ~1.9 CPU for GKE's DaemonSets."""
    s = m.DEFAULTS
    cluster = m.ray_cluster(s)
    cpu, memory = m.head_pod_request(s)
    assert (cpu, memory) == (6.0, 21.5)
    assert cluster["spec"]["autoscalerOptions"]["resources"]["requests"] == {
        "cpu": "500m", "memory": "512Mi"}
    containers = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert [c["resources"]["requests"]["cpu"] for c in containers] == ["5", "500m"]
    assert 7.91 - cpu >= 1.5


def _ray_cluster() -> dict:
    return copy.deepcopy(m.ray_cluster(m.DEFAULTS))


@pytest.mark.parametrize("break_it, message", [
    (lambda d: d["spec"].pop("headGroupSpec"), "missing required field 'headGroupSpec'"),
    (lambda d: d["spec"].update(rayVersion="2.9.0"), "differs from the locked Ray"),
    (lambda d: d["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 6}),
     "expected a string"),
    (lambda d: d["spec"]["workerGroupSpecs"][0].update(minReplicas=5, maxReplicas=2),
     "minReplicas (5) <= replicas (0) <= maxReplicas (2)"),
    (lambda d: d["spec"]["workerGroupSpecs"][0].update(replicas="3"), "expected int, got str"),
    (lambda d: d["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
     ["resources"]["limits"].update(cpu="8"), "differ from its limits"),
    (lambda d: d["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
     .update(imagePullPolcy="Always"), "imagePullPolcy"),  # strict: unknown fields fail
    (lambda d: d["spec"]["headGroupSpec"].update(serviceType="LoadBalancer"),
     "kubectl port-forward"),
    (lambda d: d["spec"].pop("authOptions"), "missing required field 'authOptions'"),
    (lambda d: d["spec"]["authOptions"].update(mode="disabled"), "expected mode 'token'"),
])
def test_validation_rejects_broken_kuberay_objects(break_it, message):
    doc = _ray_cluster()
    break_it(doc)
    with pytest.raises(ValueError) as e:
        m.validate(doc)
    assert message in str(e.value)


def test_validation_rejects_broken_core_objects():
    service = m.tensorboard_service(m.DEFAULTS)
    service["spec"]["type"] = "LoadBalancer"
    with pytest.raises(ValueError, match="ClusterIP and kubectl port-forward"):
        m.validate(service)
    deployment = m.plain_docs(m.DEFAULTS)[3]
    deployment["spec"]["replicas"] = "three"
    with pytest.raises(ValueError, match="Deployment distrl-actors: spec.replicas"):
        m.validate(deployment)
    with pytest.raises(ValueError, match="needs apiVersion and kind"):
        m.validate({"metadata": {}})


# --- comments: why each non-obvious field of the RayCluster and RayJob is set -----------------

COMMENTED = {"cluster/30-raycluster.yaml": m.ray_cluster, "job/rayjob.yaml": m.ray_job}
MIN_COMMENT_LINES = 40  # each file has 44-46 besides the 2 header lines


def _field_line(root: yaml.Node, path: tuple) -> int:
    """The line (0-based) where the field at path starts: its key, or its list item."""
    node = line_node = root
    for step in path:
        if isinstance(node, yaml.MappingNode):
            line_node, node = next((k, v) for k, v in node.value if k.value == step)
        else:
            line_node = node = node.value[step]
    return line_node.start_mark.line


def _comment_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("#")]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_comment_lands_on_the_line_above_its_field(variant):
    s = VARIANTS[variant]
    for build in COMMENTED.values():
        doc = build(s)
        notes = m.comments(doc)
        text = m.dump([doc])
        lines, root = text.splitlines(), yaml.compose(text, Loader=yaml.SafeLoader)
        for path, note in notes.items():
            assert 0 < len(note) <= 100 and "\n" not in note, (path, note)
            at = _field_line(root, path)
            indent = lines[at][:len(lines[at]) - len(lines[at].lstrip())]
            assert lines[at - 1] == f"{indent}# {note}", (path, lines[at - 1], lines[at])
        assert len(_comment_lines(text)) == len(notes)  # nothing else, nothing lost


def test_a_comment_for_a_field_that_is_not_there_fails_loudly():
    with pytest.raises(KeyError, match="minReplica"):
        m.commented({"minReplicas": 0}, {"minReplica": "a typo"})
    with pytest.raises(ValueError, match="one non-empty line"):
        m.commented({"replicas": 0}, {"replicas": "two\nlines"})
    text = m.dump([m.ray_cluster(m.DEFAULTS)])
    with pytest.raises(ValueError, match="spec.workerGroupSpecs.0.minSize"):
        m.with_comments(text, {("spec", "workerGroupSpecs", 0, "minSize"): "why"})
    with pytest.raises(ValueError, match="spec.workerGroupSpecs.1"):
        m.with_comments(text, {("spec", "workerGroupSpecs", 1, "replicas"): "why"})
    # A field renamed after its comment was written: the render refuses, the comment is not lost.
    cluster = m.ray_cluster(m.DEFAULTS)
    group = cluster["spec"]["workerGroupSpecs"][0]
    group["minSize"] = group.pop("minReplicas")
    with pytest.raises(ValueError, match="spec.workerGroupSpecs.0.minReplicas"):
        m.dump([cluster])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_commented_yaml_loads_to_what_the_spec_functions_return(variant):
    s = VARIANTS[variant]
    for build in COMMENTED.values():
        doc = build(s)
        assert m.comments(doc)
        assert yaml.safe_load(m.dump([doc])) == doc
    for rel, build in COMMENTED.items():
        assert yaml.safe_load((K8S / rel).read_text()) == build(m.DEFAULTS)


def test_the_shipped_raycluster_and_rayjob_say_why_their_fields_are_set():
    for rel, build in COMMENTED.items():
        text = (K8S / rel).read_text()
        body = _comment_lines(text)[len(m.HEADER.splitlines()):]
        assert len(body) >= MIN_COMMENT_LINES, f"k8s/{rel}: {len(body)} comment lines"
        assert len(body) == len(m.comments(build(m.DEFAULTS)))
    # The fields a reader of KubeRay manifests asks about
    head, actors = ("spec", "headGroupSpec", "template", "spec"), ("spec", "workerGroupSpecs", 0)
    cluster = m.comments(m.ray_cluster(m.DEFAULTS))
    for path in [("spec", "enableInTreeAutoscaling"), ("spec", "authOptions"),
                 ("spec", "autoscalerOptions", "upscalingMode"),
                 ("spec", "autoscalerOptions", "idleTimeoutSeconds"),
                 ("spec", "headGroupSpec", "rayStartParams", "num-cpus"),
                 (*actors, "replicas"), (*actors, "minReplicas"), (*actors, "maxReplicas"),
                 (*actors, "template", "spec", "nodeSelector"),
                 (*actors, "template", "spec", "terminationGracePeriodSeconds"),
                 (*actors, "template", "spec", "containers", 0, "lifecycle"),
                 (*head, "automountServiceAccountToken"), (*head, "securityContext"),
                 (*head, "containers", 0, "resources", "requests", "nvidia.com/gpu")]:
        assert path in cluster, path
    job = m.comments(m.ray_job(m.DEFAULTS))
    for field in ["shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
                  "submissionMode", "rayClusterSpec"]:
        assert ("spec", field) in job, field


def test_lock_dockerfile_and_manifests_agree_on_ray_and_python():
    ray = locked("ray")
    dockerfile = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^FROM rayproject/ray:(\S+)-py(\d)(\d+)(?:-\S+)?$", dockerfile, re.M)
    assert base, "the Dockerfile must start from a rayproject/ray:<version>-py<XY> image"
    assert base.group(1) == ray == RAY_VERSION
    # The image's Python: stated once (IMAGE_PYTHON), the base image's tag, checked when the image
    # is built and in every Ray pod; one the lock supports. The reader's own Python may differ.
    python = f"{base.group(2)}.{base.group(3)}"
    assert python == IMAGE_PYTHON
    assert f'assert v == "{IMAGE_PYTHON}"' in dockerfile
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(f"{IMAGE_PYTHON}.99"), requires
    assert f"python{requires}" in (ROOT / "environment.yml").read_text().replace(" ", "")
    ray_containers = 0
    for _, doc in m.load_dir(K8S):
        if doc["kind"] == "RayCluster":
            assert doc["spec"]["rayVersion"] == ray
        if doc["kind"] == "RayJob":
            assert doc["spec"]["rayClusterSpec"]["rayVersion"] == ray
        for container in _containers(doc):
            if container["name"].startswith("ray"):
                ray_containers += 1
                assert {"name": IMAGE_PYTHON_ENV, "value": IMAGE_PYTHON} in container["env"], doc
    assert ray_containers >= 6  # the RayCluster's two groups, the RayJob's, the plain ones


def _containers(doc: dict) -> list[dict]:
    found = []
    for key, value in doc.items() if isinstance(doc, dict) else enumerate(doc):
        if key == "containers" and isinstance(value, list):
            found += value
        elif isinstance(value, (dict, list)):
            found += _containers(value)
    return found


def test_dockerfile_installs_from_the_lock_file_as_a_non_root_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "-r requirements.lock" in dockerfile
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    gpu_pins = re.findall(r"^# gpu: (\S+)==(\S+)$", (ROOT / "requirements.lock").read_text(),
                          re.M)
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12"} <= {name for name, _ in gpu_pins}


def test_dockerfile_is_hadolint_clean():
    hadolint = Path(sys.executable).parent / "hadolint"
    proc = subprocess.run([str(hadolint), str(ROOT / "Dockerfile")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the wait-for-head script, run for real -------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               RAY_AUTH_MODE="token")
    return env | extra


def _stop(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (ray start --block and what it started). This test is about
    joining; a graceful stop is LocalCluster's, and SIGTERM to a whole group of Ray's kills the
    GCS first, after which `ray start` waits out its drain."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait(30)


def _nodes(address: str, token_env: dict) -> int:
    proc = subprocess.run(["ray", "status", "--address", address], capture_output=True,
                          text=True, env=_env(**token_env), timeout=60)
    active = proc.stdout.split("Active:")[-1].split("Pending:")[0] if "Active:" in proc.stdout else ""
    return active.count("node_")


@pytest.mark.slow
@pytest.mark.waits
def test_wait_for_head_script_joins_a_real_head_with_the_token_file(tmp_path):
    """As the plain manifests run it: the worker starts first and waits, and both nodes read
    the Ray token from the file RAY_AUTH_TOKEN_PATH names (the mounted Secret), not from env."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    (tmp_path / "wait-for-head.sh").write_text(m.wait_for_head_script())
    (tmp_path / "auth_token").write_text(secrets.token_hex(32))
    pod_env = {e["name"]: e["value"] for e in m.plain_docs(m.DEFAULTS)[3]["spec"]["template"][
        "spec"]["containers"][0]["env"] if e["name"].startswith("RAY_AUTH")}
    assert pod_env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": f"{m.TOKEN_DIR}/auth_token"}
    token_env = {**pod_env, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "auth_token")}
    worker = subprocess.Popen(
        ["sh", str(tmp_path / "wait-for-head.sh"), "--block"],
        env=_env(RAY_HEAD_ADDRESS=address, RAY_NUM_CPUS="1", WAIT_FOR_HEAD_INTERVAL_S="1",
                 WAIT_FOR_HEAD_TIMEOUT_S="120", **token_env),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    head = None
    try:
        for _ in range(2):  # no head yet: it keeps trying, and says so each time
            line = worker.stdout.readline()
            assert "waiting for the Ray head" in line, line + worker.stdout.read()
        head = subprocess.Popen(
            ["ray", "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
             "--include-dashboard=false"], env=_env(**token_env), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while _nodes(address, token_env) < 2:
            assert time.monotonic() < deadline, "the worker never joined the head"
            assert worker.poll() is None, worker.stdout.read()
            time.sleep(2)
        assert _nodes(address, {}) == 0  # without the file's token the cluster says nothing
    finally:
        _stop(worker)
        if head is not None:
            _stop(head)
        forget_cluster(port)  # later ray.init() calls must not try to join it
    # The rest of its log (its first two lines, the waits, were read above; a head that came up
    # within the next retry leaves no third wait line, as in one CI run)
    log = worker.stdout.read()
    assert "is up; joining" in log, log


def test_wait_for_head_script_gives_up_with_a_clear_error(tmp_path):
    (tmp_path / "wait-for-head.sh").write_text(m.wait_for_head_script())
    start = time.monotonic()
    proc = subprocess.run(["sh", str(tmp_path / "wait-for-head.sh")], capture_output=True,
                          text=True, timeout=60,
                          env=_env(RAY_HEAD_ADDRESS=f"127.0.0.1:{_free_port()}",
                                   WAIT_FOR_HEAD_TIMEOUT_S="2", WAIT_FOR_HEAD_INTERVAL_S="1"))
    assert proc.returncode == 1
    assert "no Ray head answered at 127.0.0.1:" in proc.stderr and "within 2s" in proc.stderr
    assert time.monotonic() - start < 30
    proc = subprocess.run(["sh", str(tmp_path / "wait-for-head.sh")], capture_output=True,
                          text=True, env={k: v for k, v in _env().items()
                                          if k != "RAY_HEAD_ADDRESS"})
    assert proc.returncode != 0 and "set RAY_HEAD_ADDRESS" in proc.stderr


def test_the_run_volume_s_disk_carries_the_label_the_teardown_finds_it_by():
    """The claim's class gives the disk the plan's labels (the CSI driver's `labels`
    parameter); the teardown lists disks with labels.distrl-prefix=PREFIX after the cluster."""
    s = GkeSettings(project_id="demo-project-1", prefix="rl")
    claim, storage = m.runs_volume(s), m.runs_storage_class(s)
    assert claim["spec"]["storageClassName"] == storage["metadata"]["name"] == "rl-runs"
    assert storage["provisioner"] == "pd.csi.storage.gke.io"
    labels = dict(kv.split("=") for kv in storage["parameters"]["labels"].split(","))
    assert labels == s.labels and labels["distrl-prefix"] == "rl"
    assert storage["reclaimPolicy"] == "Delete"
    for rel in ("cluster/20-runs-volume.yaml", "plain/20-runs-volume.yaml"):
        assert [d["kind"] for d in m.render(s)[rel]] == ["StorageClass", "PersistentVolumeClaim"]


@pytest.mark.parametrize("mode, location", [("standard", "cloud.availability_zone=europe-west4-b"),
                                            ("autopilot", "cloud.region=europe-west4")])
def test_the_pods_resource_carries_what_the_telemetry_api_labels_targets_with(mode, location):
    """prometheus_target needs a location (from location, cloud.availability_zone or
    cloud.region) beside gcp.project_id; the cluster's name tells two clusters apart."""
    s = GkeSettings(project_id="demo-project-1", region="europe-west4", zone="europe-west4-b",
                    mode=mode)
    env = {e["name"]: e.get("value") for e in
           m.ray_cluster_spec(s)["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    attributes = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    assert attributes["gcp.project_id"] == "demo-project-1"
    assert attributes["k8s.cluster.name"] == "distrl-cluster"
    key, value = location.split("=")
    assert attributes[key] == value


def test_the_image_puts_the_driver_gke_mounts_on_the_library_path():
    """GKE mounts the GPU driver at preflight.NVIDIA_LIB_DIR and sets no environment; without
    the folder on LD_LIBRARY_PATH, TensorFlow in the head pod loads no libcuda and sees no GPU.
    The Dockerfile's ENV puts it first, keeping any path the base image set."""
    from distrl.gke import preflight

    dockerfile = (ROOT / "Dockerfile").read_text()
    setting = re.search(r"^\s*LD_LIBRARY_PATH=(\S+)", dockerfile, re.M)
    assert setting, "the Dockerfile sets no LD_LIBRARY_PATH"
    assert setting[1] == f"{preflight.NVIDIA_LIB_DIR}${{LD_LIBRARY_PATH:+:${{LD_LIBRARY_PATH}}}}"
