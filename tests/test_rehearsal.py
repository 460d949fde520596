"""The rendered GKE manifests rehearsed on this machine (distrl.cluster.rehearsal): Ray nodes started with
the pods' own commands and env, the RayJob's entrypoint submitted to them, notebook 04's GKE path
run against them, and the telemetry the pods' OTEL_* variables send landing in the local
collector over OTLP/HTTP, as it would in Managed OpenTelemetry."""

import json
import shlex
from pathlib import Path

import pytest
from conftest import respond

from distrl.cluster import jobs
from distrl.cluster.rehearsal import ManifestRehearsal, container_env, ray_start_argv
from distrl.gke import manifests as m
from distrl.gke.settings import WORKLOADS, GkeSettings
from distrl.otel.collector import LocalCollector
from distrl.ray_runtime import DEFAULT_TOKEN_FILE
from distrl.tutorial import NOTEBOOKS_DIR, run_notebook, stream_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
# A small but real variant: no GPU (the learner refuses a GPU that TensorFlow cannot see), one
# Spot node of e2-standard-4 (2 actors).
SETTINGS = GkeSettings(project_id="rehearsal-1", gpu_type="none", max_actor_nodes=1,
                       actor_machine_type="e2-standard-4")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rehearsal")
    job = m.ray_job(SETTINGS)
    pods = {"metadata": job["metadata"], "spec": job["spec"]["rayClusterSpec"]}
    # in GKE's place: its managed collector asks the pods for no token
    with LocalCollector(tmp / "otel.db", token_file=None, port=0, http_port=0) as collector:
        cluster = ManifestRehearsal(ray_cluster=pods, collector_endpoint=collector.http_endpoint,
                                    runs_dir=tmp / "runs", log_dir=tmp / "logs")
        with cluster:
            yield cluster, collector, job
        pids = cluster.pids()
    assert pids == []  # stop() left nothing running
    # Each pod drained and shut down by itself on SIGTERM: the workers before the head, whose
    # GCS they drain through.
    for pod in cluster.pods:
        log = (tmp / "logs" / f"{pod.name}.log").read_text()
        assert "Local node finished draining; shutting down." in log, (pod.name, log[-2000:])


def test_pods_run_kuberays_command_with_their_env_and_only_the_documented_rewrites(rehearsal):
    cluster, collector, job = rehearsal
    spec = job["spec"]["rayClusterSpec"]
    head, actor = cluster.pods
    assert head.name == "distrl-train-head" and actor.name == "distrl-train-actors-worker-0"
    # A Spot preemption takes worker pods: the head pod, whatever its name, is refused.
    with pytest.raises(ValueError, match=r"expected one of the worker nodes \['distrl-train-actors"):
        cluster.kill_node(head.name)
    # KubeRay's command: the group's rayStartParams, --block, memory from the limits.
    assert head.argv[:6] == ["ray", "start", "--head", "--block", "--dashboard-host=127.0.0.1",
                             "--num-cpus=5"]
    assert ray_start_argv(spec["headGroupSpec"], head=True)[4] == "--dashboard-host=0.0.0.0"
    assert actor.argv[:5] == ["ray", "start", f"--address={cluster.address}", "--block",
                              "--num-cpus=2"]
    # The container's env, as Kubernetes builds it, plus the token KubeRay injects.
    token = Path(cluster.token_file or DEFAULT_TOKEN_FILE).read_text().strip()
    assert head.env["RAY_AUTH_MODE"] == actor.env["RAY_AUTH_MODE"] == "token"
    assert head.env["RAY_AUTH_TOKEN"] == actor.env["RAY_AUTH_TOKEN"] == token
    assert head.env["OTEL_RESOURCE_ATTRIBUTES"] == (
        "service.namespace=distrl,k8s.namespace.name=distrl,k8s.pod.name=distrl-train-head,"
        f"gcp.project_id={SETTINGS.project_id},k8s.cluster.name=distrl-cluster,"
        f"cloud.availability_zone={SETTINGS.zone}")
    assert head.env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert actor.env["OTEL_EXPORTER_OTLP_ENDPOINT"] == collector.http_endpoint
    kinds = {line.split(":")[0] for line in cluster.rewrites}
    assert kinds == {"node 0", "node 1", "env OTEL_EXPORTER_OTLP_ENDPOINT"}, cluster.rewrites


def test_the_rayjob_entrypoint_trains_on_the_pods_and_exports_to_the_collector(rehearsal):
    cluster, collector, job = rehearsal
    # It ends on its first evaluation (every CartPole episode returns at least 1), which comes
    # after the learner's first update: a fixed 25-s budget left a loaded CI run without one.
    # The budget is only for a run that never gets there.
    entrypoint = cluster.entrypoint(job, ["--target-return", "1", "--max-seconds", "150",
                                          "--envs-per-actor", "8",
                                          "--metric-export-interval-s", "2"])
    client = cluster.job_client()
    job_id = client.submit_job(entrypoint=entrypoint,
                               runtime_env={"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "25"}})
    lines: list[str] = []
    status = jobs.follow(client, job_id, timeout_s=240, out=lines.append)
    assert status == "SUCCEEDED", "\n".join(lines[-40:])
    result = json.loads((cluster.runs_dir / "rayjob" / "results.json").read_text())
    assert result["config"]["telemetry"] is True
    assert result["config"]["num_actors"] == m.num_actors(SETTINGS) == 2
    assert result["stop_reason"] == "target_return", result["stop_detail"]
    assert result["env_steps"] > 0 and result["learner_updates"] > 0
    store = collector.store()
    resources = [json.loads(r["attributes"]) for r in
                 store.query("SELECT attributes FROM resources")]
    # Every process names its pod: the head's CPUs all go to the learner, so the actors run on
    # the Spot pod (Ray would place them on the head's idle CPUs otherwise).
    by_pod = {}
    for r in resources:
        by_pod.setdefault(r["k8s.pod.name"], set()).add(r["service.component"])
    assert by_pod == {"distrl-train-head": {"driver", "learner", "replay", "evaluator"},
                      "distrl-train-actors-worker-0": {"actor"}}, by_pod
    assert {r["k8s.namespace.name"] for r in resources} == {"distrl"}
    assert {r["service.name"] for r in resources} == {"rl-training-service"}
    types = {t["metric_type"] for t in store.metric_types()}
    assert "prometheus.googleapis.com/rl.sample.samples/counter" in types
    assert store.spans(), "no spans arrived over OTLP/HTTP"


def test_notebook_04_gke_path_reads_the_raycluster_and_exports_telemetry(
        rehearsal, kernel, stand_ins, tmp_path, monkeypatch):
    """CLUSTER="gke" with the rehearsed pods as notebook 03's cluster (the dashboard URL is
    what port-forward gives) and kubectl stand-ins: `get raycluster` answers the rendered
    RayCluster, `cp` copies from the rehearsed head."""
    cluster, collector, job = rehearsal
    raycluster = m.ray_cluster(SETTINGS)
    respond(monkeypatch, "get raycluster", json.dumps(raycluster))
    out_dir = tmp_path / "run"
    executed = run_notebook(
        NOTEBOOKS_DIR / "04-distributed-training.ipynb", tmp_path,
        {"CLUSTER": "gke", "DASHBOARD_URL": cluster.dashboard_url, "NAMESPACE": "distrl",
         "HEAD_OUTPUT_DIR": str(cluster.runs_dir / "04"), "OUTPUT_DIR": str(out_dir),
         # a small replay to fill, and a hold well above an untrained network (46 on the first
         # evaluation's episodes) and below a near target: the path, not the learning, is
         # tested; a wide window, since CartPole can leap hundreds between two checks
         "MAX_SECONDS": 60.0, "FOLLOW_GRACE_S": 60.0, "TARGET_RETURN": 300.0,
         "MIN_REPLAY_SIZE": 20_000, "HOLD_WITHIN": [60.0, 300.0],  # papermill: a list
         "KUBE_CONTEXT": "gke_p_z_distrl-cluster", "NODE_READY_S": 0.0,
         "RESUME_MAX_SECONDS": 150.0}, kernel=kernel, cell_timeout_s=600)
    text = stream_text(executed)
    assert "from the RayCluster: --num-actors 2 --actor-cpus 1 --learner-cpus 5 --num-gpus 0 " \
        "--telemetry true" in text
    first = json.loads((out_dir / "first-job-results.json").read_text())
    assert first["config"]["telemetry"] is True and first["config"]["num_actors"] == 2
    second = json.loads((out_dir / "fetched" / "results.json").read_text())
    assert second["reached_target"] and second["resumed_from"]
    # The GKE commands it ran: the RayCluster read, the head pod found, its output copied.
    ran = [argv for argv in stand_ins() if argv[0] == "kubectl"]
    assert ["kubectl", "--context=gke_p_z_distrl-cluster", "get", "raycluster", "distrl",
            "--namespace=distrl", "--output=json"] in ran
    assert any(argv[2] == "exec" and "tar" in argv for argv in ran)
    assert all(argv[1] == "--context=gke_p_z_distrl-cluster" for argv in ran)
    # The managed collector's log was read for refused exports after the first job.
    assert any("deployment/opentelemetry-collector" in argv for argv in ran)
    runs = {p["attributes"] for p in collector.store().query(
        "SELECT DISTINCT attributes FROM points WHERE metric_type LIKE '%rl.sample.samples%'")}
    assert any(first["config"]["run_id"] in a for a in runs)  # 05 finds this run's metrics
    # Last, Pong as the parameters cell leaves it: a smoke job, waiting for a Spot node like
    # any job there, its output copied from the head; the hours-long workload was not
    # submitted (PONG = "full" asks for it).
    client = cluster.job_client()
    [pong] = [j for j in client.list_jobs() if "ALE/Pong-v5" in j.entrypoint]
    assert shlex.join(jobs.pong_job_args("smoke", "gke")) in pong.entrypoint
    assert shlex.join(WORKLOADS["pong"].command_args()) not in pong.entrypoint
    assert client.get_job_status(pong.submission_id) == "SUCCEEDED"
    assert "learner update; replay check: ok" in text


def test_container_env_follows_kubernetes_rules_and_refuses_what_it_cannot_rehearse():
    container = {"env": [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)-$(Z)"},
                         {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                         {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    env = container_env(container, "pod-1", {"s": {"k": "v"}}, token_secret=None)
    assert env == {"A": "x", "B": "x-$(Z)", "P": "pod-1", "S": "v"}  # unknown $(Z) stays
    with pytest.raises(ValueError, match="Secret s key k is not among the Secrets given"):
        container_env(container, "pod-1", {}, token_secret=None)
    with pytest.raises(ValueError, match="fieldRef status.podIP is not rehearsed"):
        container_env({"env": [{"name": "IP", "valueFrom": {"fieldRef": {
            "fieldPath": "status.podIP"}}}]}, "pod-1", {}, token_secret=None)


def test_a_gpu_head_gets_the_gpu_from_its_limits_and_the_job_uses_it():
    gpu = m.ray_cluster(m.DEFAULTS)  # nvidia-l4
    argv = ray_start_argv(gpu["spec"]["headGroupSpec"], head=True)
    assert "--num-gpus=1" in argv and "--num-cpus=5" in argv
    args = m.cluster_train_args(gpu["spec"])
    assert args == ["--num-actors", "24", "--actor-cpus", "1", "--learner-cpus", "5",
                    "--num-gpus", "1", "--telemetry", "true"]
    entrypoint = m.ray_job(m.DEFAULTS)["spec"]["entrypoint"]
    assert "--num-gpus 1 --telemetry true" in entrypoint


def test_bad_rehearsal_settings_are_refused():
    with pytest.raises(ValueError, match="expected a RayCluster"):
        ManifestRehearsal(ray_cluster={}, collector_endpoint="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="collector_endpoint='http://10.0.0.1:4318'"):
        ManifestRehearsal(ray_cluster=m.ray_cluster(SETTINGS),
                          collector_endpoint="http://10.0.0.1:4318")
