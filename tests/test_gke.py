"""distrl.gke: settings checks, the plan's exact commands, dry run, live run against stand-in
gcloud/kubectl executables that record their argv and answer like a healthy project (each check
step then fed a recorded bad answer), describe-before-create, resume, teardown, prerequisites
and cost."""

import dataclasses
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import DESCRIBE_NODE, respond

from distrl.gke import create as gke
from distrl.gke import manifests as k8s
from distrl.gke import preflight
from distrl.gke.cost import PRICES, estimate_cost, estimate_run_cost, monthly_costs
from distrl.gke.create import create_plan, teardown_plan
from distrl.gke.preflight import PrerequisiteError, check_prerequisites
from distrl.gke.runner import StepFailed, TeardownIncomplete, dry_run, run_plan, run_teardown
from distrl.gke.settings import GPU_MACHINES, ONE_GPU_VCPUS, RAY_VERSION, REPO_ROOT, GkeSettings, machine
from distrl.ray_runtime import ensure_auth_token

PROJECT = "demo-project-1"
P = f"--project={PROJECT}"
LABELS = "--labels=app=distrl,distrl-prefix=rl"
ZONE = "--zone=europe-west4-b"


def settings(**kw) -> GkeSettings:
    base = dict(project_id=PROJECT, region="europe-west4", zone="europe-west4-b", prefix="rl",
                gpu_type="nvidia-tesla-t4", max_actor_nodes=3, image_tag="t1")
    return GkeSettings(**(base | kw))


@pytest.fixture(autouse=True)
def quick_rollout_retries(monkeypatch):
    """A check of what an add-on installs asks again for ADDON_ROLLOUT_S (5 min) before it
    judges; here a failing answer is judged after a fraction of a second."""
    from distrl.gke import runner as plan

    monkeypatch.setattr(gke, "ADDON_ROLLOUT_S", 0.05)
    monkeypatch.setattr(gke, "SERVICE_ACCOUNT_VISIBLE_S", 0.05)
    monkeypatch.setattr(plan, "RETRY_EVERY_S", 0.01)


# --- settings ------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("project_id", "My-Project", "project_id='My-Project'"),
    ("project_id", "abc", "6-30 characters"),
    ("project_id", "project-", "not ending with a hyphen"),
    ("project_id", "1project", "starting with a letter"),
    ("project_id", "my-google-proj", "may not contain 'google'"),
    ("project_id", "proj; rm -rf /", "project_id="),
    ("region", "us_central1", "region='us_central1'"),
    ("zone", "us-central1", "zone='us-central1'"),
    ("zone", "us-east1-b", "is not in region='europe-west4'"),
    ("prefix", "Distrl", "prefix='Distrl'"),
    ("prefix", "a" * 21, "1-20 characters"),
    ("prefix", "rl-", "not ending with a hyphen"),
    ("gpu_type", "nvidia-a100", "one of nvidia-l4, nvidia-tesla-t4, nvidia-tesla-p4, none"),
    ("max_actor_nodes", 0, "an integer from 1 to 1000"),
    ("max_actor_nodes", True, "max_actor_nodes=True"),
    ("max_actor_nodes", "4", "max_actor_nodes='4'"),
    ("actor_machine_type", "m1-ultramem-40", "the machine types these settings know"),
    ("mode", "serverless", "one of standard, autopilot"),
    ("image_tag", "bad tag", "image_tag='bad tag'"),
    ("otlp_protocol", "http/json", "one of http/protobuf, grpc"),
    ("operator_namespace", "Kube_System", "a Kubernetes namespace name"),
])
def test_bad_settings_are_refused_naming_the_value(field, value, message):
    with pytest.raises(ValueError, match="invalid GKE settings") as e:
        settings(**{field: value})
    assert message in str(e.value)


def test_the_image_tag_names_the_package_and_ray_versions():
    from distrl import __version__

    assert GkeSettings(project_id=PROJECT).image.endswith(
        f"/distrl-images/distrl:{__version__}-ray{RAY_VERSION}")
    assert (REPO_ROOT / "Dockerfile").exists()  # what Cloud Build builds


def test_every_name_derives_from_the_prefix():
    s = settings()
    assert (s.cluster, s.head_pool, s.actor_pool, s.repository, s.namespace, s.service_account) == \
        ("rl-cluster", "rl-head", "rl-actors", "rl-images", "rl", "rl-ray")
    assert s.gsa_email == f"rl-ray@{PROJECT}.iam.gserviceaccount.com"
    assert s.image == f"europe-west4-docker.pkg.dev/{PROJECT}/rl-images/distrl:t1"
    longest = settings(prefix="a" * 20)
    assert len(longest.service_account) <= 30 and len(longest.cluster) <= 40


# --- the plan ------------------------------------------------------------------------------

GSA = f"rl-ray@{PROJECT}.iam.gserviceaccount.com"
BUILD_SA = f"rl-build@{PROJECT}.iam.gserviceaccount.com"
BUCKET = f"gs://{PROJECT}-rl-build"
IMAGE = f"europe-west4-docker.pkg.dev/{PROJECT}/rl-images/distrl:t1"


NODE_SA = f"rl-nodes@{PROJECT}.iam.gserviceaccount.com"
CONTEXT = f"--context=gke_{PROJECT}_europe-west4-b_rl-cluster"
KC = ["kubectl", CONTEXT]  # every kubectl command names the cluster's context
DESCRIPTION = "--description=made by distrl's GKE plan, prefix rl"  # accounts take no labels


def expected_standard(manifests: Path, token: Path, exists: bool = False) -> list[list[str]]:
    """The exact create sequence for settings(): every command and flag, in order. With
    exists=True, the describe that comes before each create is in it too (a live run). The
    image is built before any cluster exists, the nodes run as their own service account."""
    def made(check: list[str], create: list[str]) -> list[list[str]]:
        return [check, create] if exists else [create]

    pool = ["--cluster=rl-cluster", ZONE, P]
    return [
        ["gcloud", "services", "enable", *(f"{api}.googleapis.com" for api in (
            "container", "compute", "iam", "iamcredentials", "monitoring", "cloudtrace",
            "telemetry", "logging", "artifactregistry", "cloudbuild", "storage",
            "containerfilesystem")), P],
        ["gcloud", "compute", "regions", "describe", "europe-west4", P, "--format=json"],
        ["gcloud", "compute", "project-info", "describe", P, "--format=json"],
        ["gcloud", "compute", "networks", "list", "--filter=name=default", "--format=value(name)",
         P],
        # The image first: half an hour of build, before anything is paid by the hour.
        *made(["gcloud", "artifacts", "repositories", "describe", "rl-images",
               "--location=europe-west4", P, "--format=value(name)"],
              ["gcloud", "artifacts", "repositories", "create", "rl-images",
               "--repository-format=docker", "--location=europe-west4", LABELS, P]),
        *made(["gcloud", "iam", "service-accounts", "describe", BUILD_SA, P,
               "--format=value(email)"],
              ["gcloud", "iam", "service-accounts", "create", "rl-build",
               "--display-name=distrl image builds", DESCRIPTION, P]),
        # europe-west4 is not among the regions every project may build in: us-central1.
        *made(["gcloud", "storage", "buckets", "describe", BUCKET, P, "--format=value(name)"],
              ["gcloud", "storage", "buckets", "create", BUCKET, "--location=us-central1",
               "--uniform-bucket-level-access", P]),
        ["gcloud", "storage", "buckets", "update", BUCKET,
         "--update-labels=app=distrl,distrl-prefix=rl", P],
        ["gcloud", "storage", "buckets", "add-iam-policy-binding", BUCKET,
         f"--member=serviceAccount:{BUILD_SA}", "--role=roles/storage.admin", P],
        ["gcloud", "artifacts", "repositories", "add-iam-policy-binding", "rl-images",
         f"--member=serviceAccount:{BUILD_SA}", "--role=roles/artifactregistry.writer",
         "--location=europe-west4", P],
        ["gcloud", "projects", "add-iam-policy-binding", PROJECT,
         f"--member=serviceAccount:{BUILD_SA}", "--role=roles/logging.logWriter",
         "--condition=None", P],
        *made(["gcloud", "artifacts", "docker", "images", "describe", IMAGE, P,
               "--format=value(image_summary.digest)"],
              ["gcloud", "builds", "submit", str(REPO_ROOT), f"--tag={IMAGE}",
               "--region=us-central1",
               f"--service-account=projects/{PROJECT}/serviceAccounts/{BUILD_SA}",
               f"--gcs-source-staging-dir={BUCKET}/source", f"--gcs-log-dir={BUCKET}/logs",
               "--timeout=7200s", P]),
        # The nodes' own service account, allowed to run nodes and pull the image.
        *made(["gcloud", "iam", "service-accounts", "describe", NODE_SA, P,
               "--format=value(email)"],
              ["gcloud", "iam", "service-accounts", "create", "rl-nodes",
               "--display-name=distrl GKE nodes", DESCRIPTION, P]),
        # Read back until IAM shows it (eventually consistent), before anything uses it.
        ["gcloud", "iam", "service-accounts", "describe", NODE_SA, P,
         "--format=value(uniqueId)"],
        ["gcloud", "projects", "add-iam-policy-binding", PROJECT,
         f"--member=serviceAccount:{NODE_SA}", "--role=roles/container.defaultNodeServiceAccount",
         "--condition=None", P],
        ["gcloud", "artifacts", "repositories", "add-iam-policy-binding", "rl-images",
         f"--member=serviceAccount:{NODE_SA}", "--role=roles/artifactregistry.reader",
         "--location=europe-west4", P],
        ["gcloud", "projects", "add-iam-policy-binding", PROJECT,
         f"--member=serviceAccount:{NODE_SA}", "--role=roles/serviceusage.serviceUsageConsumer",
         "--condition=None", P],
        *made(["gcloud", "container", "clusters", "describe", "rl-cluster", ZONE, P,
               "--format=value(name)"],
              ["gcloud", "container", "clusters", "create", "rl-cluster", ZONE,
               "--release-channel=rapid", "--addons=RayOperator", "--enable-dataplane-v2",
               "--machine-type=e2-standard-4", "--num-nodes=1", "--disk-size=50",
               "--autoscaling-profile=optimize-utilization", "--enable-image-streaming",
               f"--workload-pool={PROJECT}.svc.id.goog", f"--service-account={NODE_SA}",
               "--managed-otel-scope=COLLECTION_AND_INSTRUMENTATION_COMPONENTS", LABELS, P]),
        # No node upgrade drains the head mid-run (gcloud 545+; cluster-wide, Standard only).
        *made(["gcloud", "container", "clusters", "describe", "rl-cluster", ZONE, P,
               "--format=value(maintenancePolicy.window.maintenanceExclusions."
               "rl-no-node-upgrades.startTime)"],
              ["gcloud", "container", "clusters", "update", "rl-cluster", ZONE,
               "--add-maintenance-exclusion-name=rl-no-node-upgrades",
               "--add-maintenance-exclusion-scope=no_minor_or_node_upgrades",
               "--add-maintenance-exclusion-until-end-of-support", P]),
        # What the cluster must offer is checked before the node pools, which cost money.
        ["gcloud", "container", "clusters", "get-credentials", "rl-cluster", ZONE, P],
        ["gcloud", "container", "clusters", "describe", "rl-cluster", ZONE, P,
         "--format=value(currentMasterVersion)"],
        [*KC, "get", "service", "opentelemetry-collector", "--namespace=gke-managed-otel",
         "--ignore-not-found", "--output=jsonpath={.spec.ports[*].port}|{.spec.ports[*].targetPort}"],
        [*KC, "get", "crd", "rayclusters.ray.io",
         '--output=jsonpath={.spec.versions[?(@.name=="v1")].schema.openAPIV3Schema'
         '.properties.spec.properties.authOptions.properties.secretName.type}'],
        [*KC, "get", "deployments", "--all-namespaces", "--output=json"],
        *made(["gcloud", "container", "node-pools", "describe", "rl-head", *pool,
               "--format=value(name)"],
              ["gcloud", "container", "node-pools", "create", "rl-head", "--cluster=rl-cluster",
               ZONE, "--machine-type=n1-standard-8",
               "--accelerator=type=nvidia-tesla-t4,count=1,gpu-driver-version=latest",
               "--num-nodes=1", "--disk-size=50", "--node-labels=distrl/pool=rl-head",
               f"--service-account={NODE_SA}", LABELS, P]),
        *made(["gcloud", "container", "node-pools", "describe", "rl-actors", *pool,
               "--format=value(name)"],
              ["gcloud", "container", "node-pools", "create", "rl-actors",
               "--cluster=rl-cluster", ZONE, "--machine-type=e2-standard-8", "--spot",
               "--node-taints=cloud.google.com/gke-spot=true:NoSchedule", "--enable-autoscaling",
               "--num-nodes=0", "--min-nodes=0", "--max-nodes=3",
               "--disk-size=50", "--node-labels=distrl/pool=rl-actors",
               f"--service-account={NODE_SA}", LABELS, P]),
        [*KC, "describe", "nodes", "--selector=cloud.google.com/gke-nodepool=rl-head"],
        *made(["gcloud", "iam", "service-accounts", "describe", GSA, P, "--format=value(email)"],
              ["gcloud", "iam", "service-accounts", "create", "rl-ray",
               "--display-name=distrl Ray pods (metrics and traces)", DESCRIPTION, P]),
        *[["gcloud", "projects", "add-iam-policy-binding", PROJECT,
           f"--member=serviceAccount:{GSA}", f"--role={role}", "--condition=None", P]
          for role in ("roles/monitoring.metricWriter", "roles/cloudtrace.agent",
                       "roles/telemetry.metricsWriter")],
        ["gcloud", "iam", "service-accounts", "add-iam-policy-binding", GSA,
         "--role=roles/iam.workloadIdentityUser",
         f"--member=serviceAccount:{PROJECT}.svc.id.goog[rl/rl-ray]", P],
        [*KC, "apply", f"--filename={manifests}/cluster/00-namespace.yaml"],
        *made([*KC, "get", "secret", "rl-ray-token", "--namespace=rl", "--output=name"],
              [*KC, "create", "secret", "generic", "rl-ray-token", "--namespace=rl",
               f"--from-file=auth_token={token}"]),
        [*KC, "apply", f"--filename={manifests}/cluster", "--recursive"],
        [*KC, "wait", "raycluster/rl", "--namespace=rl", "--for=condition=HeadPodReady",
         "--timeout=900s"],
        [*KC, "get", "pods", "--namespace=rl",
         "--selector=ray.io/node-type=head,ray.io/cluster=rl",
         '--output=jsonpath={.items[0].spec.containers[?(@.name=="autoscaler")]'
         '.env[?(@.name=="RAY_AUTH_MODE")].value}'],
        [*KC, "exec", "--namespace=rl", "service/rl-head-svc", "--container=ray-head",
         "--", "python", "-c", preflight.GPU_CHECK],
        [*KC, "get", "pods", "--namespace=rl", "--output=wide"],
        [*KC, "exec", "--namespace=rl", "service/rl-head-svc", "--container=ray-head",
         "--", "ray", "status"],
    ]


def expected_teardown(manifests: Path, live: bool = False, inventory: bool = False
                      ) -> list[list[str]]:
    """Newest first: the namespace (and the run volume's disk) first, the cluster after its
    node pools, the image last of all, then the disks the cluster left. With live=True, what
    each undo asks first, as run_teardown runs it: the cluster's credentials before kubectl,
    and whether the plan made what it would delete (its label, or an account's description)."""
    credentials = ["gcloud", "container", "clusters", "get-credentials", "rl-cluster", ZONE, P]
    namespace = [*KC, "get", "namespace", "rl",
                 "--output=jsonpath={.metadata.labels.app\\.kubernetes\\.io/instance}"]

    def account(email: str) -> list[str]:
        return ["gcloud", "iam", "service-accounts", "describe", email, P,
                "--format=value(description)"]

    def labelled(*describe: str, field: str = "labels") -> list[str]:
        return ["gcloud", *describe, f"--format=value({field}.distrl-prefix)"]

    def undo(argv: list[str], *first: list[str]) -> list[list[str]]:
        return [*first, argv] if live else [argv]

    unbind = ["gcloud", "projects", "remove-iam-policy-binding", PROJECT,
              f"--member=serviceAccount:{GSA}"]
    pool = ["--cluster=rl-cluster", ZONE, P]
    return [
        *undo([*KC, "delete", f"--filename={manifests}/cluster", "--recursive",
               "--ignore-not-found", "--wait=true"], credentials, namespace),
        *undo([*KC, "delete", "namespace", "rl", "--ignore-not-found", "--wait=true"],
              credentials, namespace),
        *undo([*unbind, "--role=roles/telemetry.metricsWriter", "--condition=None", P],
              account(GSA)),
        *undo([*unbind, "--role=roles/cloudtrace.agent", "--condition=None", P], account(GSA)),
        *undo([*unbind, "--role=roles/monitoring.metricWriter", "--condition=None", P],
              account(GSA)),
        *undo(["gcloud", "iam", "service-accounts", "delete", GSA, P, "--quiet"], account(GSA)),
        *undo(["gcloud", "container", "node-pools", "delete", "rl-actors", *pool, "--quiet"],
              labelled("container", "node-pools", "describe", "rl-actors", *pool,
                       field="config.resourceLabels")),
        *undo(["gcloud", "container", "node-pools", "delete", "rl-head", *pool, "--quiet"],
              labelled("container", "node-pools", "describe", "rl-head", *pool,
                       field="config.resourceLabels")),
        *undo(["gcloud", "container", "clusters", "delete", "rl-cluster", ZONE, P, "--quiet"],
              labelled("container", "clusters", "describe", "rl-cluster", ZONE, P,
                       field="resourceLabels")),
        *undo(["gcloud", "projects", "remove-iam-policy-binding", PROJECT,
               f"--member=serviceAccount:{NODE_SA}",
               "--role=roles/serviceusage.serviceUsageConsumer", "--condition=None", P],
              account(NODE_SA)),
        *undo(["gcloud", "projects", "remove-iam-policy-binding", PROJECT,
               f"--member=serviceAccount:{NODE_SA}",
               "--role=roles/container.defaultNodeServiceAccount", "--condition=None", P],
              account(NODE_SA)),
        *undo(["gcloud", "iam", "service-accounts", "delete", NODE_SA, P, "--quiet"],
              account(NODE_SA)),
        *undo(["gcloud", "projects", "remove-iam-policy-binding", PROJECT,
               f"--member=serviceAccount:{BUILD_SA}", "--role=roles/logging.logWriter",
               "--condition=None", P], account(BUILD_SA)),
        *undo(["gcloud", "storage", "rm", "--recursive", BUCKET, P],
              labelled("storage", "buckets", "describe", BUCKET, P)),
        *undo(["gcloud", "iam", "service-accounts", "delete", BUILD_SA, P, "--quiet"],
              account(BUILD_SA)),
        *undo(["gcloud", "artifacts", "repositories", "delete", "rl-images",
               "--location=europe-west4", P, "--quiet"],
              labelled("artifacts", "repositories", "describe", "rl-images",
                       "--location=europe-west4", P)),
        ["gcloud", "compute", "disks", "list",
         "--filter=labels.distrl-prefix=rl AND zone:europe-west4-b AND -users:*",
         "--format=value(name,zone.basename())", P],
        ["gcloud", "monitoring", "dashboards", "list", "--filter=labels.app=distrl",
         "--format=value(name)", P],
        ["gcloud", "monitoring", "policies", "list", "--filter=userLabels.app=distrl",
         "--format=value(name)", P],
        *(INVENTORY if inventory else []),  # `distrl gke teardown` runs it after the undos
    ]


# The teardown's inventory, after every undo: distrl's label in every location.
INVENTORY = [
    ["gcloud", "container", "clusters", "list",
     "--format=value(name,location,resourceLabels.distrl-prefix)",
     "--filter=resourceLabels.app=distrl", P],
    ["gcloud", "compute", "instances", "list",
     "--format=value(name,zone.basename(),labels.distrl-prefix)", "--filter=labels.app=distrl", P],
    ["gcloud", "compute", "disks", "list",
     "--format=value(name,zone.basename(),labels.distrl-prefix)", "--filter=labels.app=distrl", P],
    ["gcloud", "compute", "addresses", "list",
     "--format=value(name,region.basename(),labels.distrl-prefix)", "--filter=labels.app=distrl",
     P],
    ["gcloud", "storage", "buckets", "list",
     "--format=value(name,location,labels.distrl-prefix)", "--filter=labels.app=distrl", P],
    ["gcloud", "artifacts", "repositories", "list", "--location=all",
     "--format=value(name,name.segment(3),labels.distrl-prefix)", "--filter=labels.app=distrl",
     P],
    ["gcloud", "monitoring", "dashboards", "list", "--format=value(name)",
     "--filter=labels.app=distrl", P],
    ["gcloud", "monitoring", "policies", "list", "--format=value(name)",
     "--filter=userLabels.app=distrl", P],
]


def test_plan_is_the_exact_command_sequence(tmp_path):
    token = tmp_path / "token"
    plan = create_plan(settings(), tmp_path / "m", token)
    assert [list(step.argv) for step in plan] == expected_standard(tmp_path / "m", token)
    assert all(isinstance(a, str) for step in plan for a in step.argv)  # argv lists only
    assert all(step.title for step in plan)


def test_every_gcloud_creation_is_labelled_and_every_gcloud_command_names_the_project(tmp_path):
    plan = create_plan(settings(), tmp_path)
    for step in plan:
        for argv in (step.argv, step.exists, step.teardown):
            if argv and argv[0] == "gcloud":
                assert P in argv, argv
        creates = "create" in step.argv or "create-auto" in step.argv
        # Service accounts and buckets take no labels flag on create.
        if step.argv[0] == "gcloud" and creates and not {"service-accounts", "buckets"} & set(
                step.argv):
            assert LABELS in step.argv, step


def test_every_create_step_asks_first_whether_its_resource_exists(tmp_path):
    plan = create_plan(settings(), tmp_path)
    for step in plan:
        if step.argv[0] == "gcloud" and ("create" in step.argv or "create-auto" in step.argv):
            assert step.exists and ("describe" in step.exists), step.title
    assert next(s for s in plan if s.title.startswith("Store the Ray auth token")).exists
    assert next(s for s in plan if s.title.startswith("Build the image")).exists[:5] == (
        "gcloud", "artifacts", "docker", "images", "describe")


def test_teardown_deletes_what_create_made_newest_first(tmp_path):
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "t")
    assert [list(s.argv) for s in teardown_plan(plan)] == expected_teardown(tmp_path / "m")


def test_no_gpu_head_pool_is_cpu_only_and_has_no_gpu_checks(tmp_path):
    plan = create_plan(settings(gpu_type="none"), tmp_path)
    head = next(s for s in plan if "rl-head" in s.argv and "create" in s.argv)
    assert "--machine-type=n2-standard-8" in head.argv
    assert not any(a.startswith("--accelerator") for a in head.argv)
    assert not [s for s in plan if "GPU" in s.title]


def test_each_gpu_s_head_machine_has_the_vcpus_one_such_gpu_allows():
    """A head machine beyond its GPU's vCPU limit would fail at node-pool creation, after the
    cluster is paid for: each GPU's machine is inside the table, and the settings say so."""
    for gpu, machine_type in GPU_MACHINES.items():
        head = settings(gpu_type=gpu).head_node
        assert head.startswith(f"{machine_type}: {machine(machine_type).vcpus} vCPUs"), head
        if gpu == "none":
            assert head.endswith("no GPU"), head
            continue
        low, high = ONE_GPU_VCPUS[gpu]
        assert low <= machine(machine_type).vcpus <= high, (gpu, machine_type)
        assert head.endswith(f"1 {gpu} (a VM with one may have {low}-{high} vCPUs)"), head


def test_autopilot_mode_creates_an_autopilot_cluster_without_node_pools(tmp_path):
    plan = create_plan(settings(mode="autopilot"), tmp_path)
    argvs = [list(s.argv) for s in plan]
    # GA gcloud (576+): --managed-otel-scope and --enable-ray-operator; Autopilot always has
    # Workload Identity, and create-auto takes no --workload-pool. Its nodes run as the node
    # service account, and kubectl names the regional cluster's context.
    assert ["gcloud", "container", "clusters", "create-auto", "rl-cluster",
            "--region=europe-west4", "--release-channel=rapid", "--enable-ray-operator",
            f"--service-account={NODE_SA}",
            "--managed-otel-scope=COLLECTION_AND_INSTRUMENTATION_COMPONENTS", LABELS, P] in argvs
    # The same maintenance exclusion as Standard's, right after the create: GKE's pages do not
    # say which scopes Autopilot takes, so the step says what to do if GKE refuses it.
    create = argvs.index(next(a for a in argvs if a[3:4] == ["create-auto"]))
    assert argvs[create + 1] == [
        "gcloud", "container", "clusters", "update", "rl-cluster", "--region=europe-west4",
        "--add-maintenance-exclusion-name=rl-no-node-upgrades",
        "--add-maintenance-exclusion-scope=no_minor_or_node_upgrades",
        "--add-maintenance-exclusion-until-end-of-support", P]
    assert "resume at the next step" in plan[create + 1].why
    assert not any("node-pools" in a for a in argvs)
    assert not any(s.title.startswith("Check the head node") for s in plan)
    assert all(a[1] == f"--context=gke_{PROJECT}_europe-west4_rl-cluster"
               for a in argvs if a[0] == "kubectl")
    undo = [list(s.argv) for s in teardown_plan(plan)]
    assert ["gcloud", "container", "clusters", "delete", "rl-cluster", "--region=europe-west4",
            P, "--quiet"] in undo


def test_no_beta_or_alpha_gcloud_anywhere(tmp_path):
    for mode in ("standard", "autopilot"):
        for step in create_plan(settings(mode=mode), tmp_path):
            assert not {"alpha", "beta"} & set(step.argv), step


def test_dry_run_prints_every_command_exactly(tmp_path):
    plan = create_plan(settings(), tmp_path / "manifests dir")  # a space must survive quoting
    lines = []
    dry_run(plan, out=lines.append)
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert commands == [list(s.argv) for s in plan]
    assert sum(line.startswith("# ") and line[2].isdigit() for line in lines) == len(plan)
    assert sum("skipped when this prints something" in line for line in lines) == \
        sum(s.exists is not None for s in plan)
    # Compact (notebook 03's cells, whose stored listing has the rest): a title and a command.
    compact = []
    dry_run(plan, out=compact.append, explain=False, checks=False)
    assert compact == [line for step_lines in ((f"# {i}. {s.title}", str(s))
                                               for i, s in enumerate(plan, 1))
                       for line in step_lines]


# --- live run with stand-ins ---------------------------------------------------------------

PREREQS = [["gcloud", "version", "--format=json"],
           ["gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"],
           ["gcloud", "projects", "describe", PROJECT, "--format=value(lifecycleState)"],
           ["gcloud", "auth", "print-access-token"],  # testIamPermissions, as the caller
           ["gcloud", "org-policies", "describe", "compute.vmExternalIpAccess", "--effective", P,
            "--format=json"],
           ["gcloud", "billing", "projects", "describe", PROJECT, "--format=value(billingEnabled)"],
           ["gcloud", "services", "list", "--enabled", P, "--format=value(config.name)"],
           ["gcloud", "compute", "regions", "describe", "europe-west4", P, "--format=json"],
           ["gcloud", "compute", "project-info", "describe", P, "--format=json"]]


def test_live_run_executes_the_plan_in_order_and_teardown_undoes_it(stand_ins, tmp_path):
    s, manifests, token = settings(), tmp_path / "m", tmp_path / "token"
    k8s.write_manifests(s, manifests)
    plan = create_plan(s, manifests, token)
    found = check_prerequisites(s)
    assert found.account == "reader@example.com" and found.gcloud_version == "578.0.0"
    assert found.missing_apis == [] and found.notes == []
    output = []
    run_plan(plan, out=output.append)
    assert stand_ins() == PREREQS + expected_standard(manifests, token, exists=True)
    assert f"done: kubectl {CONTEXT} get pods --namespace=rl --output=wide" in output  # streamed
    assert output.count("check passed") == sum(step.check is not None for step in plan)
    run_teardown(teardown_plan(plan), out=output.append)
    assert stand_ins()[len(PREREQS) + len(expected_standard(manifests, token, True)):] == \
        expected_teardown(manifests, live=True)


def test_a_second_run_skips_what_exists_and_resume_starts_at_the_failed_step(
        stand_ins, tmp_path, monkeypatch):
    """The head pool's creation fails (quota). Resumed at that step once fixed, the plan does
    not touch the steps before it; run again from the start, it re-creates nothing that a
    describe finds."""
    monkeypatch.setenv("FAKE_FAIL", "node-pools create rl-head")
    manifests, token = tmp_path / "m", tmp_path / "token"
    plan = create_plan(settings(), manifests, token)
    full = expected_standard(manifests, token, exists=True)
    head_pool = next(i for i, step in enumerate(plan) if step.argv[2:5] == (
        "node-pools", "create", "rl-head"))
    with pytest.raises(StepFailed) as e:
        run_plan(plan, out=lambda line: None)
    number = head_pool + 1
    assert e.value.number == number
    assert f"resume at this step: run_plan(plan, start={number})" in str(e.value)
    ran = stand_ins()
    assert ran == full[:full.index(list(plan[head_pool].argv)) + 1]  # nothing after it
    monkeypatch.delenv("FAKE_FAIL")
    run_plan(plan, out=lambda line: None, start=e.value.number)
    resumed = stand_ins()[len(ran):]
    assert resumed == full[full.index(list(plan[head_pool].exists)):]
    # Everything exists now: a third run from step 1 creates nothing.
    monkeypatch.setenv("FAKE_EXISTS", "|".join(shlex.join(s.exists[1:4]) for s in plan
                                               if s.exists))
    before = len(stand_ins())
    output = []
    run_plan(plan, out=output.append)
    again = stand_ins()[before:]
    assert not [argv for argv in again if "create" in argv or "create-auto" in argv]
    assert sum(line.endswith("skipped") for line in output) == sum(bool(s.exists) for s in plan)


def test_a_rerun_with_another_workload_stops_at_the_pool_that_differs(stand_ins, tmp_path):
    """A pool step skipped on its name alone kept the old pool under a new workload's
    manifests and prices. The rerun compares the live pool (its describe, as JSON) with the
    plan and stops at the first that differs, naming each difference and the delete that
    replaces it; the same settings again skip every pool."""
    first = settings(actor_machine_type="e2-standard-8", max_actor_nodes=3)
    run_plan(create_plan(first, tmp_path / "m", tmp_path / "t"), out=lambda line: None)
    output = []
    run_plan(create_plan(first, tmp_path / "m", tmp_path / "t"), out=output.append)
    assert sum("node-pools describe" in line and line.endswith("skipped") for line in output) == 2
    other = settings(actor_machine_type="e2-standard-4", max_actor_nodes=4)
    plan = create_plan(other, tmp_path / "m", tmp_path / "t")
    with pytest.raises(StepFailed) as e:
        run_plan(plan, out=lambda line: None)
    assert plan[e.value.number - 1].title == "Create the Spot CPU node pool for actors"
    assert ("node pool rl-actors exists with another shape than this plan's: machine type "
            "e2-standard-8 (this plan: e2-standard-4); autoscaling up to 3 (this plan: 4). A "
            "skip would run the new workload on the old pool: replace it (gcloud container "
            "node-pools delete rl-actors --cluster=rl-cluster --zone=europe-west4-b "
            "--project=demo-project-1 --quiet), then run again from this step") in str(e.value)


def test_a_pool_a_failed_create_left_in_error_is_reported_not_skipped(stand_ins, tmp_path,
                                                                       monkeypatch):
    """A GPU stockout can leave the head pool in ERROR; a rerun that skipped it by name went
    on to a cluster without its head. It stops at the pool, with its status and message, the
    delete, and what to do about a stockout (tear down with the old zone, list a zone's
    GPUs)."""
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "t")
    run_plan(plan, out=lambda line: None)
    monkeypatch.setenv("FAKE_POOL_STATUS", "ERROR")
    with pytest.raises(StepFailed) as e:
        run_plan(plan, out=lambda line: None)
    assert plan[e.value.number - 1].title.startswith("Create the head node pool")
    said = str(e.value)
    assert ("node pool rl-head is in status ERROR (Insufficient regional quota): delete it "
            "(gcloud container node-pools delete rl-head") in said
    assert "tear down with this ZONE first" in said
    assert "gcloud compute accelerator-types list --filter=zone:ZONE" in said


POOL = ["gcloud", "container", "node-pools", "create", "p", "--cluster=c", "--zone=us-central1-a"]


def test_a_misspelt_flag_stops_the_plan_where_the_real_tool_would(stand_ins, tmp_path):
    """The stand-ins refuse what gcloud and kubectl refuse (tests/cli_reference.py, from their
    reference pages): a plan whose GPU pool step misspells a flag stops there, with gcloud's
    usage error, and creates nothing after it; kubectl's flags are checked too, and so are the
    values the plan generates, flags' arity and positional arguments."""
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "token")
    pool = next(i for i, step in enumerate(plan) if step.argv[2:5] == (
        "node-pools", "create", "rl-head"))
    typo = tuple(a.replace("--machine-type=", "--machine-typ=") for a in plan[pool].argv)
    plan[pool] = dataclasses.replace(plan[pool], argv=typo, exists=None)
    with pytest.raises(StepFailed, match="unrecognized arguments: --machine-typ=") as e:
        run_plan(plan, out=lambda line: None)
    assert e.value.number == pool + 1
    assert stand_ins()[-1] == list(typo)  # nothing ran after it
    for argv, refused in (
            (["kubectl", "get", "pods", "--namespace=rl", "--selectr=app=x"], "--selectr"),
            (["kubectl", "aply", "--filename=x.yaml"], "Invalid choice"),
            (["gcloud", "container", "clusters", "create-auto", "c", "--workload-pool=p"],
             "--workload-pool"),  # a flag of `clusters create`, not of create-auto
            (["gcloud", "container", "clusters", "create", "c", "--release-channel=fast"],
             "Invalid choice: 'fast'"),
            # values the plan generates, arity and positionals
            ([*POOL, "--machine-type=e2-standard-8", "--accelerator=type=nvidia-l4,count=1"],
             "is not available on machine type e2-standard-8"),
            ([*POOL, "--machine-type=g2-standard-24", "--accelerator=type=nvidia-l4,count=1"],
             "g2-standard-24 comes with 2 nvidia-l4"),
            ([*POOL, "--machine-type=e2-standard-64"], "machine type 'e2-standard-64' does not"),
            ([*POOL, "--machine-type=g2-standard-8",
              "--accelerator=type=nvidia-l4,count=1,gpu-driver-version=newest"],
             "Invalid gpu driver version [newest]"),
            ([*POOL, "--machine-type=g2-standard-8", "--accelerator=type=nvidia-l5"],
             "Accelerator type 'nvidia-l5' does not exist"),
            ([*POOL, "--spot=true"], "--spot: ignored explicit argument 'true'"),
            ([*POOL, "--machine-type"], "--machine-type: expected one argument"),
            (["gcloud", "projects", "add-iam-policy-binding", "p", "--member=serviceAccount:a@b",
              "--role=roles/monitoring.writer"], "Role roles/monitoring.writer is not supported"),
            (["gcloud", "projects", "add-iam-policy-binding", "p", "--member=a@b",
              "--role=roles/cloudtrace.agent"], "Invalid member 'a@b'"),
            (["gcloud", "container", "clusters", "create", "c", "--zone=us-central9-a"],
             "Invalid zone 'us-central9-a'"),
            (["gcloud", "builds", "submit", ".", "--region=mars1"], "Invalid region 'mars1'"),
            (["gcloud", "container", "clusters", "create", "--zone=us-central1-a"],
             "1 positional argument(s) required"),
            (["gcloud", "container", "clusters", "create", "a", "b", "--zone=us-central1-a"],
             "unrecognized arguments: b"),
            (["kubectl", "get", "pods", "--output=table"], "output format 'table'"),
            (["kubectl", "apply", "extra", "--filename=x.yaml"], "unrecognized arguments: extra")):
        run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and refused in run.stderr, (argv, run.returncode, run.stderr)


def test_resume_refuses_a_step_number_outside_the_plan(tmp_path):
    plan = create_plan(settings(), tmp_path)
    for bad in (0, len(plan) + 1, "3", 2.0):
        with pytest.raises(ValueError, match=f"start={bad!r}: expected a step number from 1"):
            run_plan(plan, start=bad)


def test_cli_create_resumes_from_a_step(stand_ins, tmp_path):
    args = ["--project-id", PROJECT, "--region", "europe-west4", "--zone", "europe-west4-b",
            "--prefix", "rl", "--gpu-type", "nvidia-tesla-t4", "--max-actor-nodes", "3",
            "--image-tag", "t1", "--manifests-dir", str(tmp_path / "m"),
            "--auth-token-file", str(tmp_path / "token")]
    steps = len(create_plan(settings(), tmp_path / "m", tmp_path / "token"))
    assert gke.main(["create", "--resume-from", str(steps - 1), *args]) == 0
    assert stand_ins()[len(PREREQS):] == expected_standard(tmp_path / "m", tmp_path / "token",
                                                           True)[-2:]


@pytest.mark.parametrize("key, answer, title, message", [
    ("compute regions describe", json.dumps({"quotas": [
        {"metric": "CPUS", "limit": 24.0, "usage": 4.0},
        {"metric": "SSD_TOTAL_GB", "limit": 500.0, "usage": 0.0},
        {"metric": "NVIDIA_T4_GPUS", "limit": 1.0, "usage": 0.0}]}), "Check the regional quotas",
     "CPUS quota 24 with 4 in use leaves 20; the plan needs 36 at full scale (system node 4 + "
     "head 8 + actor nodes 3 x 8): request more at https://console.cloud.google.com/iam-admin/"
     "quotas?project=demo-project-1, or max_actor_nodes=1"),
    ("compute regions describe", json.dumps({"quotas": [
        {"metric": "CPUS", "limit": 72.0, "usage": 0.0},
        {"metric": "SSD_TOTAL_GB", "limit": 500.0, "usage": 0.0},
        {"metric": "NVIDIA_T4_GPUS", "limit": 0.0, "usage": 0.0}]}), "Check the regional quotas",
     "NVIDIA_T4_GPUS quota 0 with 0 in use leaves 0; the plan needs 1"),
    ("compute project-info describe", json.dumps({"quotas": [
        {"metric": "GPUS_ALL_REGIONS", "limit": 0.0, "usage": 0.0}]}), "Check the project-wide quotas",
     "GPUS_ALL_REGIONS quota 0 with 0 in use leaves no GPU for the head"),
    ("currentMasterVersion", "1.33.5-gke.1000", "Check the GKE version",
     "the cluster runs GKE 1.33.5-gke.1000; Managed OpenTelemetry needs 1.34.1-gke.2178000"),
    ("get service opentelemetry-collector", "", "Check the managed collector",
     "no Service opentelemetry-collector in namespace gke-managed-otel"),
    ("get service opentelemetry-collector", "4317|4317", "Check the managed collector",
     "serves ports [4317], not 4318 (http/protobuf); render the manifests with "
     "otlp_protocol='grpc'"),
    ("get crd rayclusters.ray.io", "", "Check the Ray operator supports",
     "does not know RayCluster spec.authOptions.secretName (KubeRay 1.6.0 or later"),
    ("describe nodes", DESCRIBE_NODE.replace("663m (8%)", "2500m (31%)"), "Check the head node",
     "has 5.41 CPU free after GKE's system pods; the head pod requests 6"),
    ("RAY_AUTH_MODE", "", "Check the autoscaler", "has no RAY_AUTH_MODE=token: the running operator ignored"),
    ("list_physical_devices", "ld_library_path (unset)\nlibcuda failed libcuda.so.1: cannot "
     "open shared object file: No such file or directory\ntf cudart_stub.cc:31] Could not find "
     "cuda drivers on your machine, GPU will not be used.\ngpus 0\nxla ok /job:localhost/"
     "replica:0/task:0/device:CPU:0", "Check TensorFlow",
     "libcuda.so.1 did not load in the head pod (libcuda.so.1: cannot open shared object "
     "file: No such file or directory); LD_LIBRARY_PATH there is (unset). GKE mounts the driver "
     "at /usr/local/nvidia/lib64"),
    ("list_physical_devices", "libcuda ok\ngpus 0\nxla ok /job:localhost/replica:0/task:0/"
     "device:CPU:0", "Check TensorFlow", "TensorFlow in the head pod sees 0 GPU(s)"),
    ("list_physical_devices", "libcuda ok\ngpus 1\nxla failed InternalError libdevice not found "
     "at ./libdevice.10.bc", "Check TensorFlow", "an XLA-compiled convolution did not run on the "
     "head's GPU (failed InternalError libdevice not found"),
    ("get service opentelemetry-collector", "4317 4318|4317 14318", "Check the managed collector",
     "the managed collector's pods listen on ['14318']"),
    ("compute networks list", "", "Check the project has the default network",
     "project demo-project-1 has no network named default, which the cluster goes on: the "
     "organization policy compute.skipDefaultNetworkCreation makes projects without one "
     "(cloud.google.com/vpc/docs/vpc). Create it, then run again from this step: gcloud compute "
     "networks create default --subnet-mode=auto --project=demo-project-1"),
    ("service-accounts describe rl-nodes", "", "Wait until the node service account",
     "service account rl-nodes@demo-project-1.iam.gserviceaccount.com is not visible yet"),
    ("compute project-info describe", json.dumps({"quotas": [
        {"metric": "GPUS_ALL_REGIONS", "limit": 1.0, "usage": 0.0},
        {"metric": "CPUS_ALL_REGIONS", "limit": 24.0, "usage": 0.0}]}),
     "Check the project-wide quotas", "CPUS_ALL_REGIONS quota 24 with 0 in use leaves 24; the "
     "plan needs 36 vCPUs at full scale in all regions together"),
])
def test_each_check_stops_the_plan_with_the_fact_and_its_fix(stand_ins, tmp_path, monkeypatch,
                                                              key, answer, title, message):
    respond(monkeypatch, key, answer)
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "token")
    step = next(i for i, s in enumerate(plan, 1) if s.title.startswith(title))
    with pytest.raises(StepFailed) as e:
        run_plan(plan, out=lambda line: None)
    assert e.value.number == step and e.value.problems, str(e.value)
    assert message in str(e.value)
    full = expected_standard(tmp_path / "m", tmp_path / "token", exists=True)
    first = full.index(list(plan[step - 1].argv))
    ran = stand_ins()
    assert ran[:first + 1] == full[:first + 1]
    # Nothing ran after the check; a check of an add-on's work was asked again meanwhile.
    assert ran[first + 1:] == [list(plan[step - 1].argv)] * (len(ran) - first - 1)


def test_grpc_export_needs_the_newer_gke_and_the_operator_namespace_must_match(
        stand_ins, tmp_path, monkeypatch):
    respond(monkeypatch, "currentMasterVersion", "1.36.2-gke.1100000")
    plan = create_plan(settings(otlp_protocol="grpc"), tmp_path, tmp_path / "token")
    with pytest.raises(StepFailed, match="gRPC export to Managed OpenTelemetry needs "
                       "1.37.1-gke.1697000 or later") as e:
        run_plan(plan, out=lambda line: None)
    assert "otlp_protocol='http/protobuf'" in str(e.value)
    respond(monkeypatch, "get deployments --all-namespaces", json.dumps({"items": [
        {"metadata": {"name": "kuberay-operator", "namespace": "ray-system"}}]}))
    plan = create_plan(settings(operator_namespace="kube-system"), tmp_path, tmp_path / "token")
    operator = next(i for i, step in enumerate(plan) if step.title.startswith(
        "Check where the Ray operator"))
    with pytest.raises(StepFailed, match="admits the dashboard port 8265 only from "
                       "namespace 'kube-system', but the KubeRay operator runs in namespace "
                       "ray-system") as e:
        run_plan(plan[:operator + 1], out=lambda line: None, start=operator + 1)
    assert "operator_namespace='ray-system'" in str(e.value)
    plan = create_plan(settings(operator_namespace="ray-system"), tmp_path, tmp_path / "token")
    run_plan(plan[operator:operator + 1], out=lambda line: None)  # passes when they agree


def test_a_step_that_outlives_its_time_limit_is_killed(tmp_path):
    from distrl.gke.runner import Step as PlanStep

    with pytest.raises(StepFailed, match="killed after 1 s"):
        run_plan([PlanStep("sleeps", ("sleep", "30"))], out=lambda line: None, timeout_s=1)


def test_missing_gcloud_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(PrerequisiteError) as e:
        check_prerequisites(settings())
    assert "gcloud is not on PATH" in str(e.value) and "sdk/docs/install" in str(e.value)
    assert "kubectl is not on PATH" in str(e.value)


def test_no_account_or_an_unreachable_project_is_refused(stand_ins, monkeypatch):
    respond(monkeypatch, "auth list", "")
    with pytest.raises(PrerequisiteError, match="gcloud auth login"):
        check_prerequisites(settings())
    respond(monkeypatch, "auth list", "reader@example.com")
    respond(monkeypatch, "projects describe", "DELETE_REQUESTED")
    with pytest.raises(PrerequisiteError, match=f"project '{PROJECT}' is not reachable"):
        check_prerequisites(settings())
    assert all(argv in PREREQS for argv in stand_ins())  # only the read-only checks ran


def test_prerequisites_name_old_gcloud_billing_off_and_short_quota_together(stand_ins,
                                                                            monkeypatch):
    respond(monkeypatch, "gcloud version", json.dumps({"Google Cloud SDK": "551.0.0"}))
    respond(monkeypatch, "billing projects describe", "False")
    respond(monkeypatch, "compute project-info describe", json.dumps({"quotas": [
        {"metric": "GPUS_ALL_REGIONS", "limit": 0.0, "usage": 0.0}]}))
    with pytest.raises(PrerequisiteError) as e:
        check_prerequisites(settings())
    text = str(e.value)
    assert "gcloud 551.0.0 is older than 576.0.0" in text and "gcloud components update" in text
    assert "billing is off" in text and "gcloud billing projects link" in text
    assert "GPUS_ALL_REGIONS quota 0" in text and "iam-admin/quotas?project=" in text
    assert stand_ins() == PREREQS  # read-only, and all of them


def test_a_fresh_project_lists_the_apis_step_1_enables_and_defers_quotas(stand_ins,
                                                                          monkeypatch):
    respond(monkeypatch, "services list", "storage.googleapis.com")
    found = check_prerequisites(settings())
    assert "compute.googleapis.com" in found.missing_apis
    assert any("step 1 enables" in note and "gcloud services enable" in note
               for note in found.notes)
    assert any("quotas are checked by the plan's quota step" in note for note in found.notes)
    assert stand_ins() == PREREQS[:7]  # no quota query without the Compute Engine API


def test_quota_arithmetic_uses_family_and_preemptible_quotas_when_the_region_has_them():
    from distrl.gke.preflight import quota_needs

    s = settings(actor_machine_type="n2-standard-8", max_actor_nodes=4)
    quotas = {q: {"limit": 10.0} for q in ("CPUS", "N2_CPUS", "PREEMPTIBLE_CPUS")}
    needs = {n.metric: n.amount for n in quota_needs(s, quotas)}
    # Spot actors draw on PREEMPTIBLE_CPUS once it is granted; the on-demand nodes on CPUS.
    assert needs == {"CPUS": 4 + 8, "PREEMPTIBLE_CPUS": 32, "SSD_TOTAL_GB": 6 * 50,
                     "NVIDIA_T4_GPUS": 1, "IN_USE_ADDRESSES": 6}  # an external IP a node
    quotas["PREEMPTIBLE_CPUS"]["limit"] = 0.0
    needs = {n.metric: n.amount for n in quota_needs(s, quotas)}
    assert needs["N2_CPUS"] == 32 and needs["CPUS"] == 12


def test_the_project_wide_quotas_count_every_node_and_the_gpu():
    """What notebook 03's quota table lists after the region's, and what the live check reads
    from `gcloud compute project-info describe`: every vCPU of the plan, Spot ones too, and
    the head's GPU, in all regions together; no GPU line for a CPU head."""
    from distrl.gke.preflight import project_quota_needs

    s = settings(actor_machine_type="n2-standard-8", max_actor_nodes=4)
    [cpus, gpus] = project_quota_needs(s)
    assert (cpus.metric, cpus.amount, cpus.per_actor_node) == ("CPUS_ALL_REGIONS", 4 + 8 + 32, 8)
    assert "actor nodes 4 x 8" in cpus.what and "all regions" in cpus.what
    assert (gpus.metric, gpus.amount) == ("GPUS_ALL_REGIONS", 1)
    assert [n.metric for n in project_quota_needs(settings(gpu_type="none"))] == [
        "CPUS_ALL_REGIONS"]


def test_cli_refuses_bad_names_before_running_anything(stand_ins, capsys):
    with pytest.raises(SystemExit) as e:
        gke.main(["create", "--project-id", "Bad_Project"])
    assert e.value.code == 2
    assert "project_id='Bad_Project'" in capsys.readouterr().err
    assert stand_ins() == []


def test_cli_create_and_teardown_run_live_against_the_stand_ins(stand_ins, tmp_path, capsys):
    args = ["--project-id", PROJECT, "--region", "europe-west4", "--zone", "europe-west4-b",
            "--prefix", "rl", "--gpu-type", "nvidia-tesla-t4", "--max-actor-nodes", "3",
            "--image-tag", "t1", "--manifests-dir", str(tmp_path / "m"),
            "--auth-token-file", str(tmp_path / "token")]
    assert gke.main(["create", *args]) == 0
    assert (tmp_path / "m" / "cluster" / "30-raycluster.yaml").exists()
    created = stand_ins()
    assert created == PREREQS + expected_standard(tmp_path / "m", tmp_path / "token", True)
    token = tmp_path / "token"  # made for the cluster's Secret, readable by its owner only
    assert len(token.read_text()) == 64 and token.stat().st_mode & 0o077 == 0
    assert gke.main(["teardown", *args]) == 0
    # A teardown checks login and project only: no quota, billing or gcloud version blocks it.
    assert stand_ins()[len(created):len(created) + 2] == PREREQS[1:3]
    assert stand_ins()[len(created) + 2:] == expected_teardown(tmp_path / "m", live=True,
                                                               inventory=True)


def test_a_teardown_runs_with_an_old_gcloud_and_no_kubectl(stand_ins, tmp_path, monkeypatch,
                                                           capsys):
    """Teardown needs what teardown uses: gcloud. Without kubectl it skips the steps inside
    the cluster (the cluster's deletion takes what they would delete) and runs the rest."""
    args = ["--project-id", PROJECT, "--region", "europe-west4", "--zone", "europe-west4-b",
            "--prefix", "rl", "--gpu-type", "nvidia-tesla-t4", "--max-actor-nodes", "3",
            "--image-tag", "t1", "--manifests-dir", str(tmp_path / "m"),
            "--auth-token-file", str(tmp_path / "token")]
    assert gke.main(["create", *args]) == 0
    created = len(stand_ins())
    (tmp_path / "bin" / "kubectl").unlink()
    (tmp_path / "bin" / "gke-gcloud-auth-plugin").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # this machine may have a kubectl
    respond(monkeypatch, "gcloud version", json.dumps({"Google Cloud SDK": "400.0.0"}))
    assert gke.main(["teardown", *args]) == 0
    ran = stand_ins()[created:]
    assert ran[:2] == PREREQS[1:3]
    assert ran[2:] == [argv for argv in expected_teardown(tmp_path / "m", live=True,
                                                          inventory=True)
                       if argv[0] != "kubectl"]
    out = capsys.readouterr().out
    assert "kubectl is not on PATH: skipped" in out


CLI_ARGS = ["--project-id", PROJECT, "--region", "europe-west4", "--prefix", "rl",
            "--gpu-type", "nvidia-tesla-t4", "--max-actor-nodes", "3", "--image-tag", "t1"]


@pytest.mark.parametrize("other, still", [
    (["--zone", "europe-west4-c"],  # made in -b (say after a stockout in -c's place)
     ["cluster rl-cluster in europe-west4-b, prefix rl: distrl gke teardown --project-id "
      "demo-project-1 --prefix rl --mode standard --zone europe-west4-b --region europe-west4"]),
    (["--zone", "europe-west4-b", "--prefix", "xx"],  # nothing of prefix xx: all of rl's stays
     ["cluster rl-cluster in europe-west4-b, prefix rl: distrl gke teardown",
      "bucket demo-project-1-rl-build in ?, prefix rl: gcloud storage rm --recursive "
      "gs://demo-project-1-rl-build --project=demo-project-1",
      "repository rl-images in europe-west4, prefix rl: gcloud artifacts repositories delete "
      "rl-images --location=europe-west4 --project=demo-project-1 --quiet"]),
])
def test_a_teardown_given_other_settings_than_the_create_exits_1_naming_what_bills(
        stand_ins, tmp_path, capsys, other, still):
    """Made in one zone, torn down with another ZONE (or PREFIX): every delete finds nothing
    and counts as done, but the inventory after them lists distrl's label in every location,
    and the teardown exits 1 naming the cluster that still bills and the command that deletes
    it. With the create's own settings the inventory finds nothing and the exit is 0."""
    files = ["--manifests-dir", str(tmp_path / "m"), "--auth-token-file", str(tmp_path / "t")]
    assert gke.main(["create", *CLI_ARGS, "--zone", "europe-west4-b", *files]) == 0
    capsys.readouterr()
    assert gke.main(["teardown", *CLI_ARGS, *other, *files]) == 1
    err = capsys.readouterr().err
    assert "labelled app=distrl still exist in project demo-project-1 and bill" in err, err
    for thing in still:
        assert f"  - {thing}" in err, err
    assert gke.main(["teardown", *CLI_ARGS, "--zone", "europe-west4-b", *files]) == 0
    assert ("inventory: nothing labelled app=distrl is left in project demo-project-1, in any "
            "location") in capsys.readouterr().out


def test_an_inventory_that_cannot_list_a_kind_does_not_say_nothing_bills(stand_ins, monkeypatch):
    """A list refused (no permission) proves nothing: the teardown fails naming the list and
    why. A list refused because its API is off in the project is empty: nothing of it bills."""
    from distrl.gke.inventory import StillBilling, check_nothing_bills

    respond(monkeypatch, "compute addresses list", "ERROR: (gcloud.compute.addresses.list) "
            "Compute Engine API has not been used in project 1 before or it is disabled.", 1)
    respond(monkeypatch, "compute instances list", "ERROR: (gcloud.compute.instances.list) "
            "Some requests did not succeed: Required 'compute.instances.list' permission", 1)
    with pytest.raises(StillBilling) as e:
        check_nothing_bills(PROJECT, out=lambda line: None)
    assert e.value.left == [] and len(e.value.unlisted) == 1
    said = str(e.value)
    assert said.startswith("after the teardown, 1 kind(s) could not be listed, so the inventory "
                           "cannot say that nothing bills:\n  - could not list VMs "
                           "(`gcloud compute instances list "), said
    assert said.endswith("Some requests did not succeed: Required 'compute.instances.list' "
                         "permission)"), said


def test_the_teardown_deletes_notebook_05s_dashboard_and_alert_policies_by_their_label(
        stand_ins, tmp_path, monkeypatch):
    """Notebook 05 (DRY_RUN = False) makes a dashboard and four alert policies in the same
    project; they outlived the teardown. They carry the plan's app label (dashboards: labels,
    policies: userLabels), and the teardown lists them by it and deletes each."""
    from distrl.otel import dashboard

    assert dashboard.dashboard()["labels"] == {"app": settings().labels["app"]}
    assert all(p["userLabels"] == {"app": "distrl"} for p in dashboard.alert_policies().values())
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "t")
    board = "projects/demo-project-1/dashboards/4f1c"
    policies = "projects/demo-project-1/alertPolicies/11\nprojects/demo-project-1/alertPolicies/12"
    respond(monkeypatch, "monitoring dashboards list", board)
    respond(monkeypatch, "monitoring policies list", policies)
    run_teardown(gke.teardown_plan(plan), out=lambda line: None)
    ran = stand_ins()
    assert ran[-5:] == [
        ["gcloud", "monitoring", "dashboards", "list", "--filter=labels.app=distrl",
         "--format=value(name)", P],
        ["gcloud", "monitoring", "dashboards", "delete", board, P, "--quiet"],
        ["gcloud", "monitoring", "policies", "list", "--filter=userLabels.app=distrl",
         "--format=value(name)", P],
        ["gcloud", "monitoring", "policies", "delete", "projects/demo-project-1/alertPolicies/11",
         P, "--quiet"],
        ["gcloud", "monitoring", "policies", "delete", "projects/demo-project-1/alertPolicies/12",
         P, "--quiet"]]


def test_a_missing_auth_plugin_is_a_failed_undo_not_one_already_done(stand_ins, tmp_path,
                                                                      monkeypatch):
    """kubectl without gke-gcloud-auth-plugin says "... not found": that is a tool missing,
    not the namespace gone. The undo fails (and is named at the end); before, it counted as
    done while what it deletes stayed."""
    from distrl.gke.runner import already_gone

    plugin = ('error: getting credentials: exec: executable gke-gcloud-auth-plugin not found')
    assert not already_gone(plugin) and not already_gone("bash: kubectl: command not found")
    assert already_gone("ERROR: (gcloud.container.clusters.delete) NOT_FOUND: cluster")
    assert already_gone('Error from server (NotFound): namespaces "rl" not found')
    k8s.write_manifests(settings(), tmp_path / "m")
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "token")
    run_plan(plan, out=lambda line: None)
    respond(monkeypatch, "get namespace rl", plugin, code=1)
    with pytest.raises(TeardownIncomplete) as e:
        run_teardown(gke.teardown_plan(plan), out=lambda line: None)
    assert "gke-gcloud-auth-plugin not found" in str(e.value)


def test_a_missing_right_stops_the_preflight_naming_it_and_the_role_that_grants_it(
        stand_ins, monkeypatch):
    """An Editor cannot grant roles, and nodes running as the plan's account need actAs on it:
    the preflight asks Resource Manager's testIamPermissions (as the caller, with gcloud's
    token) and stops before anything is made, naming each missing permission and its role."""
    from conftest import IAM_ASKED

    IAM_ASKED.clear()
    monkeypatch.setenv("FAKE_IAM_DENIED", "resourcemanager.projects.setIamPolicy,"
                                          "iam.serviceAccounts.actAs")
    with pytest.raises(PrerequisiteError) as e:
        check_prerequisites(settings())
    said = str(e.value)
    assert ("reader@example.com lacks resourcemanager.projects.setIamPolicy on project "
            "demo-project-1: the plan grants roles to its service accounts (Owner or "
            "roles/resourcemanager.projectIamAdmin; Editor has no such permission)") in said
    assert "lacks iam.serviceAccounts.actAs on project demo-project-1" in said
    assert "container.clusters.create" not in said
    [(path, authorization, asked)] = IAM_ASKED
    assert path == "/v1/projects/demo-project-1:testIamPermissions"
    assert authorization == "Bearer ya29.stand-in-token"
    assert sorted(asked) == sorted(preflight.PLAN_PERMISSIONS)
    monkeypatch.delenv("FAKE_IAM_DENIED")
    assert check_prerequisites(settings()).notes == []
    # An organization policy that denies the nodes' external IPs stops it too.
    respond(monkeypatch, "org-policies describe", json.dumps(
        {"spec": {"rules": [{"denyAll": True}]}}))
    with pytest.raises(PrerequisiteError, match="compute.vmExternalIpAccess denies every VM an "
                                                "external IP in project demo-project-1"):
        check_prerequisites(settings())
    respond(monkeypatch, "org-policies describe", json.dumps({"spec": {"rules": [
        {"values": {"allowedValues": ["projects/p/zones/z/instances/bastion"]}}]}}))
    with pytest.raises(PrerequisiteError, match="allows external IPs only on the VMs it lists"):
        check_prerequisites(settings())
    respond(monkeypatch, "org-policies describe", json.dumps({"spec": {"rules": [
        {"allowAll": True}]}}))
    # A question that cannot be asked (no answer) is a note, not a stop.
    monkeypatch.setenv("DISTRL_RESOURCE_MANAGER_URL", "http://127.0.0.1:9/v1")
    notes = check_prerequisites(settings()).notes
    assert len(notes) == 1 and notes[0].startswith("your permissions could not be checked")


def test_a_teardown_is_not_blocked_by_quotas_or_billing(stand_ins, monkeypatch):
    respond(monkeypatch, "compute project-info describe", json.dumps({"quotas": [
        {"metric": "GPUS_ALL_REGIONS", "limit": 0.0, "usage": 0.0}]}))
    respond(monkeypatch, "billing projects describe", "False")
    assert check_prerequisites(settings(), creating=False).account == "reader@example.com"
    with pytest.raises(PrerequisiteError, match="GPUS_ALL_REGIONS"):
        check_prerequisites(settings())


# --- cost ----------------------------------------------------------------------------------

def test_cost_estimate_adds_up_the_price_table_and_the_free_tier_pays_the_fee():
    prices = PRICES
    est = estimate_cost(settings())
    system = prices["machines"]["e2-standard-4"][0]
    head = prices["machines"]["n1-standard-8"][0] + prices["gpus"]["nvidia-tesla-t4"][0]
    spot = prices["machines"]["e2-standard-8"][1]
    disk = 50 * prices["pd_balanced_gb_month"] / 730
    ip, spot_ip = prices["external_ip"]
    # $74.40 a month is 744 h x $0.10: the fee of one zonal cluster, nothing else.
    assert est.lines[0].maximum + est.lines[1].maximum == pytest.approx(0.0)
    # Idle: the system and head nodes, their disks and addresses.
    assert est.min_per_hour == pytest.approx(system + head + 2 * disk + 2 * ip)
    assert est.max_per_hour == pytest.approx(system + head + 3 * spot + 5 * disk + 2 * ip
                                             + 3 * spot_ip)
    table = est.table()
    assert prices["date"] in table and "USD per hour" in table and "(Spot)" in table
    assert "free tier credit" in table


def test_a_run_estimate_prices_the_spot_nodes_tails_and_prints_its_total():
    """Spot nodes bill from their start and image pull, through the job's close, until the
    autoscaler removes them (KubeRay deletes the job's cluster as it ends: ttl 0): each tail
    at its bound, at the highest Spot price seen, with the node's disk and address. Seed-scale's
    10-minute run: about $1.2-1.5 by issue 63's arithmetic at the table's earlier Spot price
    ($0.322 an e2-standard-32, with a 600 s ttl and typical starts); at the catalog's price of
    2026-08-20 ($0.643) the bounds here (a 15-minute start, a 10-minute close) give $2.25."""
    from distrl.gke import cost
    from distrl.gke.manifests import JOB_CLOSE_S, ray_job
    from distrl.gke.settings import NODE_READY_S, NODE_UNNEEDED_S

    s = GkeSettings.for_workload("seed-scale", project_id=PROJECT)
    assert ray_job(s)["spec"]["ttlSecondsAfterFinished"] == 0
    run = estimate_run_cost(s)
    tails = [line for line in run.lines if line.item.startswith("Spot tail")]
    node = (PRICES["machines"]["e2-standard-32"][1] + cost.spot_drift(s, PRICES)
            + 50 * PRICES["pd_balanced_gb_month"] / 730 + PRICES["external_ip"][1])
    assert [line.maximum for line in tails] == pytest.approx(
        [4 * node * seconds / 3600 for seconds in (NODE_READY_S, JOB_CLOSE_S, NODE_UNNEEDED_S)])
    assert all(line.minimum == 0 for line in tails)  # no node came, none bills
    assert run.max_per_hour == pytest.approx(sum(line.maximum for line in run.lines))
    assert 1.2 * 1.5 <= run.max_per_hour <= 1.5 * 2, run.table()  # the nodes: twice as dear
    assert f"about {run.min_per_hour:.2f}-{run.max_per_hour:.2f} USD per seed-scale run" in \
        run.table()


def test_cost_estimate_autopilot_prices_the_pods_requests():
    s = settings(mode="autopilot", gpu_type="nvidia-l4")
    est = estimate_cost(s)
    ap = PRICES["autopilot"]
    from distrl.gke.manifests import pod_sizes

    actor = pod_sizes(s)["actor"]
    actor_price = actor.cpu * ap["vcpu"][1] + actor.memory_gib * ap["memory_gib"][1]
    assert est.lines[-1].unit_price == pytest.approx(actor_price)
    assert est.max_per_hour - est.min_per_hour == pytest.approx(3 * actor_price)


@pytest.mark.parametrize("mode", ["standard", "autopilot"])
def test_a_first_run_through_prices_set_up_demonstrations_and_teardown_beside_the_run(mode):
    """The cluster's always-on part (what bills with no actor node) through the set-up,
    notebook 04's jobs and the teardown; the actor nodes through the jobs, none to all; then
    the run's own lines, unchanged."""
    from distrl.gke import cost

    s = settings(mode=mode, gpu_type="nvidia-l4")
    hourly, run = estimate_cost(s), estimate_run_cost(s)
    through = cost.estimate_run_through_cost(s, setup_s=1800, teardown_s=600)
    assert through.lines[4:] == run.lines  # the run, as its own estimate prices it
    demo_h = sum(budget + cost.NODE_READY_S for _, budget in cost.DEMO_JOBS_S) / 3600
    idle, full = hourly.min_per_hour, hourly.max_per_hour
    assert [line.maximum for line in through.lines[:4]] == pytest.approx(
        [idle * 0.5, idle * demo_h, (full - idle) * demo_h, idle / 6])
    assert through.lines[2].minimum == 0  # no actor node came
    assert through.min_per_hour == pytest.approx(run.min_per_hour + idle * (0.5 + demo_h + 1 / 6))
    assert through.max_per_hour == pytest.approx(run.max_per_hour + full * demo_h
                                                 + idle * (0.5 + 1 / 6))
    assert "assumed" in through.lines[0].item and "assumed" in through.lines[3].item
    assert ("system and head nodes" in through.lines[0].item) == (mode == "standard")
    with pytest.raises(ValueError, match=r"setup_s=-1: expected a number of seconds >= 0"):
        cost.estimate_run_through_cost(s, setup_s=-1)
    with pytest.raises(ValueError, match=r"teardown_s='10 min'"):
        cost.estimate_run_through_cost(s, teardown_s="10 min")


def test_docs_quote_the_default_clusters_run_through_as_the_code_prices_it():
    from distrl.gke import cost
    from distrl.gke.settings import REPO_ROOT, GkeSettings

    figures = []
    for mode in ("standard", "autopilot"):
        s = GkeSettings.for_workload("cartpole", project_id=PROJECT, mode=mode)
        through, run = cost.estimate_run_through_cost(s), estimate_run_cost(s)
        figures.append((f"${through.min_per_hour:.2f}-{through.max_per_hour:.2f}",
                        f"${run.max_per_hour:.2f}"))
    (std, std_run), (auto, auto_run) = figures
    docs = " ".join((REPO_ROOT / "docs" / "gke.md").read_text().split())
    assert (f"comes to {std} on Standard and {auto} on Autopilot, against {std_run} and "
            f"{auto_run} at most for its run alone") in docs


def test_the_run_through_prices_notebook_04s_own_job_budgets():
    """DEMO_JOBS_S holds notebook 04's defaults on GKE: its first job's budget, the resumed
    job's and the Pong smoke job's (no twin from zero unless asked)."""
    import ast
    import json

    from distrl.cluster.jobs import PONG_SMOKE_SECONDS
    from distrl.gke import cost
    from distrl.tutorial import NOTEBOOKS_DIR

    notebook = json.loads((NOTEBOOKS_DIR / "04-distributed-training.ipynb").read_text())
    cell = next(c for c in notebook["cells"] if "parameters" in c["metadata"].get("tags", []))
    values = {node.targets[0].id: ast.literal_eval(node.value)
              for node in ast.parse("".join(cell["source"])).body if isinstance(node, ast.Assign)}
    assert [budget for _, budget in cost.DEMO_JOBS_S] == [
        values["MAX_SECONDS"], values["RESUME_MAX_SECONDS"], PONG_SMOKE_SECONDS]
    assert values["PONG"] == "auto"  # the smoke job on GKE, where the estimate prices it
    assert values["COMPARE_FROM_ZERO"] is False


def test_an_autopilot_run_estimate_prices_its_spot_pods_tails():
    """Autopilot bills pods' requests, not nodes: each actor pod's start and the job's close
    are priced at its Spot requests; no node waits to scale down after the pods are gone."""
    from distrl.gke import cost
    from distrl.gke.manifests import pod_sizes

    s = settings(mode="autopilot", gpu_type="nvidia-l4")
    actor, ap = pod_sizes(s)["actor"], PRICES["autopilot"]
    per_hour = actor.cpu * ap["vcpu"][1] + actor.memory_gib * ap["memory_gib"][1]
    tails = [line for line in estimate_run_cost(s).lines if line.item.startswith("Spot tail")]
    assert [line.item for line in tails] == [
        f"Spot tail: start and image pull, up to {cost.NODE_READY_S / 60:.0f} min a pod",
        f"Spot tail: the job's close, up to {cost.JOB_CLOSE_S / 60:.0f} min a pod"]
    assert [line.maximum for line in tails] == pytest.approx(
        [3 * per_hour * seconds / 3600 for seconds in (cost.NODE_READY_S, cost.JOB_CLOSE_S)])
    assert all(line.minimum == 0 for line in tails)


def test_monthly_costs_add_up_samples_spans_builds_images_volume_and_alerts():
    from distrl.gke import cost
    from distrl.gke.manifests import num_actors

    prices = PRICES
    s = settings()
    month = monthly_costs(s, hours_training=10, builds=2, image_gb=8.0, alert_conditions=4,
                              export_interval_s=30.0)
    per_export = cost.SAMPLES_PER_EXPORT_RUN + cost.SAMPLES_PER_EXPORT_ACTOR * num_actors(s)
    samples = per_export * 10 * 3600 / 30
    spans = (cost.SPANS_PER_SECOND_RUN + cost.SPANS_PER_SECOND_ACTOR * num_actors(s)) * 10 * 3600
    by_item = {line.item.split(":")[0]: line for line in month.lines}
    assert by_item["metric samples"].maximum == pytest.approx(
        samples / 1e6 * prices["metric_samples_per_million"])
    assert by_item["spans"].minimum == pytest.approx((spans - 2.5e6) / 1e6 * 0.20)
    assert by_item["spans"].maximum == pytest.approx(spans / 1e6 * prices["spans_per_million"])
    assert by_item["Cloud Build"].minimum == 0.0  # 60 of 2,500 free build-minutes
    assert by_item["Artifact Registry"].minimum == pytest.approx(15.5 * 0.10)
    assert by_item["alerting"].maximum == pytest.approx(4 * prices["alert_condition_month"])
    assert "USD per month" in month.table()


def test_cost_table_can_be_overridden_from_a_file_and_a_bad_one_is_refused(tmp_path):
    table = json.loads(json.dumps(PRICES))
    table["machines"]["e2-standard-8"][1] = 1.0
    table["date"] = "2030-01"
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(table))
    est = estimate_cost(settings(), path)
    actors = next(line for line in est.lines if line.item.startswith("actor nodes"))
    assert est.date == "2030-01" and actors.unit_price == 1.0
    with pytest.raises(ValueError, match="price table lacks date, source"):
        estimate_cost(settings(), {"currency": "USD"})


def test_cli_plan_and_cost_print_without_running_anything(stand_ins, tmp_path, capsys):
    from distrl.cli import main as distrl

    assert distrl(["gke", "plan", "--project-id", PROJECT, "--manifests-dir",
                   str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "gcloud services enable container.googleapis.com" in out
    assert (tmp_path / "m" / "job" / "rayjob.yaml").exists()
    assert distrl(["gke", "cost", "--project-id", PROJECT, "--max-actor-nodes", "10"]) == 0
    out = capsys.readouterr().out
    assert "0-10" in out and "USD per month" in out
    assert stand_ins() == []


def test_cli_workload_sizes_the_actor_pool_and_prices_its_run(stand_ins, tmp_path, capsys):
    """`--workload pong` plans the pool WORKLOADS["pong"] is sized for (unless the pool's flags
    say otherwise), and `cost` prices one run of it."""
    from distrl.cli import main as distrl

    plans = {}
    for name, extra in (("cartpole", []), ("pong", ["--workload", "pong"]),
                        ("pong-3", ["--workload", "pong", "--max-actor-nodes", "3"])):
        assert distrl(["gke", "plan", "--project-id", PROJECT, "--manifests-dir",
                       str(tmp_path / name), *extra]) == 0
        plans[name] = capsys.readouterr().out
    assert plans["pong"] != plans["cartpole"]
    assert "--machine-type=e2-standard-8" in plans["pong"] and "--max-nodes=2" in plans["pong"]
    from distrl.gke import manifests

    job = next(d for _, d in manifests.load_dir(tmp_path / "pong") if d["kind"] == "RayJob")
    assert "--num-actors 12 " in job["spec"]["entrypoint"]
    assert "--machine-type=e2-standard-8" in plans["cartpole"] and "--max-nodes=4" in plans[
        "cartpole"]
    assert "--max-nodes=3" in plans["pong-3"] and "--machine-type=e2-standard-8" in plans["pong-3"]
    assert "ALE/Pong-v5" in (tmp_path / "pong" / "job" / "rayjob.yaml").read_text()
    assert distrl(["gke", "cost", "--project-id", PROJECT, "--workload", "pong"]) == 0
    out = capsys.readouterr().out
    assert "one pong training:" in out and "pong run of at most 4 h" in out
    from distrl.gke.cost import estimate_run_through_cost
    from distrl.gke.settings import GkeSettings

    through = estimate_run_through_cost(GkeSettings.for_workload("pong", project_id=PROJECT))
    assert out.endswith(through.table() + "\n")  # the whole first run-through, last
    assert stand_ins() == []


def test_the_rayjob_waits_for_the_raycluster_to_be_gone(stand_ins, tmp_path, monkeypatch):
    """Both pin their head to the one-node head pool and mount the same ReadWriteOnce volume:
    the RayJob is refused, naming the delete, while the RayCluster exists."""
    manifests = tmp_path / "m"
    plan = gke.rayjob_plan(settings(), manifests)
    respond(monkeypatch, "get raycluster rl", "raycluster.ray.io/rl")
    with pytest.raises(StepFailed, match=f"kubectl {CONTEXT} delete raycluster rl --namespace=rl"):
        run_plan(plan, out=lambda line: None)
    assert stand_ins() == [[*KC, "get", "raycluster", "rl", "--namespace=rl",
                            "--ignore-not-found", "--output=name"]]
    respond(monkeypatch, "get raycluster rl", "")
    run_plan(plan, out=lambda line: None)
    assert stand_ins()[-1] == [*KC, "apply", f"--filename={manifests}/job/rayjob.yaml"]
    assert [list(s.argv) for s in gke.teardown_plan(plan)] == [
        [*KC, "delete", "rayjob", "rl-train", "--namespace=rl", "--ignore-not-found"]]


def test_the_docs_list_every_command_of_the_plan_as_the_code_makes_it(tmp_path, monkeypatch):
    """docs/gke.md lists every command of the plan, and the stored notebook 03 (no outputs) the
    pods' OTEL_* variables, exactly as the dry run prints them with the notebook's defaults:
    tools/listings.py regenerates both, and a stale copy of either is caught. The notebook
    itself holds no copy of the plan: its executed cells print each command once."""
    import importlib.util

    monkeypatch.undo()  # the plan as shipped (quick_rollout_retries shortens what it prints)

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("listings", root / "tools" / "listings.py")
    listings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(listings)
    assert listings.synced_notebook()[1] == [], "run `python tools/listings.py`"
    assert listings.synced_doc()[1] == [], "run `python tools/listings.py`"
    doc, notebook = listings.DOC.read_text(), listings.NOTEBOOK.read_text()
    assert "gcloud container clusters create distrl-cluster --zone=us-central1-a" in doc
    assert "gcloud container clusters create" not in notebook
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in notebook
    stale_doc = tmp_path / "gke.md"
    stale_doc.write_text(doc.replace("--release-channel=rapid", "--release-channel=stable"))
    assert listings.synced_doc(stale_doc)[1] == ["generated:plan"]
    stale_nb = tmp_path / "03.ipynb"
    stale_nb.write_text(notebook.replace("OTEL_SERVICE_NAME", "OTEL_SERVICE"))
    assert listings.synced_notebook(stale_nb)[1] == ["generated:otel-env"]


def test_teardown_after_a_partial_create_runs_every_undo_and_reports_failures_at_the_end(
        stand_ins, tmp_path, monkeypatch):
    """The create stopped at the actor pool (quota). The teardown finds that what the plan never
    made is not there (the namespace, the pods' account and its bindings, the actor pool) and
    deletes nothing of it; it removes bindings that were never granted (gcloud: not found); one
    undo fails for another reason, and the cluster, the last and most expensive undo, is still
    deleted; the failure is named at the end."""
    monkeypatch.setenv("FAKE_FAIL", "node-pools create rl-actors")
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "token")
    with pytest.raises(StepFailed):
        run_plan(plan, out=lambda line: None)
    monkeypatch.delenv("FAKE_FAIL")
    respond(monkeypatch, "remove-iam-policy-binding", "ERROR: (gcloud.projects.remove-iam-"
            "policy-binding) Policy binding with the specified principal, role, and condition "
            "not found!", code=1)
    respond(monkeypatch, "node-pools delete rl-head", "ERROR: (gcloud.container.node-pools."
            "delete) ResponseError: code=400, message=Operation in progress", code=1)
    before = len(stand_ins())
    output = []
    with pytest.raises(TeardownIncomplete) as e:
        run_teardown(gke.teardown_plan(plan), out=output.append)
    ran = stand_ins()[before:]
    never_made = [argv for argv in expected_teardown(tmp_path / "m") if (
        argv[:3] == [*KC, "delete"] or any(GSA in a for a in argv) or "rl-actors" in argv)]
    assert len(never_made) == 7
    assert ran == [a for a in expected_teardown(tmp_path / "m", live=True) if a not in never_made]
    assert ["gcloud", "container", "clusters", "delete", "rl-cluster", ZONE, P, "--quiet"] in ran
    assert [f.title for f, _, _ in e.value.failures] == ["Undo: Create the head node pool "
                                                         "(on-demand, GPU)"]
    assert "Operation in progress" in str(e.value) and "run the teardown again" in str(e.value)
    # seven never made, three bindings never granted
    assert output.count("already gone: done") == 10


def test_teardown_keeps_what_it_did_not_make_and_stops_a_create_that_would_adopt_it(
        stand_ins, tmp_path, monkeypatch):
    """A repository and a service account of the plan's names were there before it, without
    its label: create stops at the first rather than build into it, and a teardown (run where
    nothing else of the plan exists) deletes neither, saying why."""
    monkeypatch.setenv("FAKE_FOREIGN", "repositories describe rl-images|rl-build@")
    k8s.write_manifests(settings(), tmp_path / "m")
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "token")
    with pytest.raises(StepFailed) as e:
        run_plan(plan, out=lambda line: None)
    assert e.value.step.title == "Create the Artifact Registry repository"
    assert "it was there before this plan" in str(e.value)
    assert "choose another prefix" in str(e.value)
    before, output = len(stand_ins()), []
    run_teardown(gke.teardown_plan(plan), out=output.append)
    ran = stand_ins()[before:]
    assert not [a for a in ran if "delete" in a and ("rl-images" in a or BUILD_SA in a)]
    assert sum(line.startswith("kept: its label says nothing") for line in output) == 3
    assert output[-1].startswith("kept 3 thing(s) of the same name that this plan did not make")


def test_a_bucket_the_plan_made_and_did_not_label_is_refused_with_the_label_command(
        stand_ins, tmp_path, monkeypatch):
    """gcloud's `buckets create` takes no labels, so a stop between creating the build bucket
    and labelling it leaves it unlabelled: a rerun refuses it as not the plan's, and says how
    to label it; labelled so, the rerun goes on past it."""
    import shlex
    import subprocess

    monkeypatch.setenv("FAKE_FOREIGN", f"buckets describe {BUCKET}")
    k8s.write_manifests(settings(), tmp_path / "m")
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "token")
    with pytest.raises(StepFailed) as e:
        run_plan(plan, out=lambda line: None)
    assert e.value.step.title == "Create the build bucket"
    label = ["gcloud", "storage", "buckets", "update", BUCKET,
             "--update-labels=app=distrl,distrl-prefix=rl", P]
    assert f"label it and run again: {shlex.join(label)}" in str(e.value)
    subprocess.run(label, check=True, timeout=60)
    step = next(i for i, s in enumerate(plan, 1) if s.title == "Create the build bucket")
    output = []
    run_plan(plan[:step], out=output.append, start=step)
    assert any(line.startswith("already there") for line in output), output


def test_teardown_fetches_the_credentials_and_deletes_the_disks_the_cluster_left(
        stand_ins, tmp_path, monkeypatch):
    """Teardown on another machine (no kube context): the kubectl undos fetch the credentials
    first. A run volume's disk that outlived the cluster (its deletion does not guarantee the
    PVC's disk) is found by the plan's label and deleted; once the cluster is gone, a second
    teardown counts its kubectl undos done instead of failing on a missing context."""
    k8s.write_manifests(settings(), tmp_path / "m")
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "token")
    run_plan(plan, out=lambda line: None)
    respond(monkeypatch, "compute disks list", "pvc-3f1c9a2e europe-west4-b")
    before, output = len(stand_ins()), []
    run_teardown(gke.teardown_plan(plan), out=output.append)
    ran = stand_ins()[before:]
    credentials = ["gcloud", "container", "clusters", "get-credentials", "rl-cluster", ZONE, P]
    assert ran[0] == credentials and ran[ran.index(credentials) + 2][:3] == [*KC, "delete"]
    assert ran[-3] == ["gcloud", "compute", "disks", "delete", "pvc-3f1c9a2e",
                       "--zone=europe-west4-b", P, "--quiet"]  # then 05's dashboards, policies
    respond(monkeypatch, "get-credentials", "ERROR: (gcloud.container.clusters.get-credentials) "
            "ResponseError: code=404, message=Not found: projects/demo-project-1/zones/"
            "europe-west4-b/clusters/rl-cluster.", code=1)
    respond(monkeypatch, "compute disks list", "")
    output = []
    run_teardown(gke.teardown_plan(plan), out=output.append)
    assert output.count(f"gone with what {shlex.join(credentials)} names: done") == 2
    assert output.count("already gone: done") == 14


def test_a_check_of_an_add_on_asks_again_until_it_passes_or_its_time_is_up(tmp_path):
    from distrl.gke.runner import Step as PlanStep

    counter = tmp_path / "n"
    asks = ("sh", "-c", f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n + 1)) > {counter}; "
            "echo $n")
    passes_third_time = PlanStep("rolls out", asks, check=lambda out: [] if int(out) >= 2 else
                                 [f"not yet: {out.strip()}"], retry_s=5.0)
    lines = []
    run_plan([passes_third_time], out=lines.append)
    assert counter.read_text().strip() == "3" and lines[-1] == "check passed"
    assert sum(line.startswith("not yet (not yet: ") for line in lines) == 2
    never = PlanStep("never", ("echo", "0"), check=lambda out: ["still missing"], retry_s=0.1)
    with pytest.raises(StepFailed, match="still missing"):
        run_plan([never], out=lambda line: None)


def test_the_managed_collectors_log_check_names_refusals_and_their_fix():
    s = settings()
    step = gke.telemetry_check_step(s.kube_context)
    assert list(step.argv[:2]) == ["kubectl", CONTEXT] and "--namespace=gke-managed-otel" in step.argv
    assert step.check("2026-12-04T10:00:00Z info exporter sent 120 points") == []
    denied = step.check('error exporterhelper: rpc error: code = PermissionDenied desc = '
                        'Permission monitoring.timeSeries.create denied')
    assert len(denied) == 1 and "roles/monitoring.metricWriter" in denied[0]
    missing = step.check("error: Resource is missing required attribute \"gcp.project_id\"")
    assert len(missing) == 1 and "gcp.project_id" in missing[0]


def test_every_kubectl_command_names_the_clusters_context(tmp_path):
    """In both modes, create, teardown, the RayJob and the collector's log check: no kubectl
    command relies on the current context (after a switch, a teardown would delete elsewhere)."""
    for mode, location in (("standard", "europe-west4-b"), ("autopilot", "europe-west4")):
        s = settings(mode=mode)
        plan = create_plan(s, tmp_path, tmp_path / "token")
        steps = [*plan, *teardown_plan(plan), *gke.rayjob_plan(s, tmp_path),
                 gke.telemetry_check_step(s.kube_context)]
        argvs = [a for step in steps for a in (step.argv, step.exists, step.teardown) if a]
        kubectl = [a for a in argvs if a[0] == "kubectl"]
        assert kubectl and all(a[1] == f"--context=gke_{PROJECT}_{location}_rl-cluster"
                               for a in kubectl), [a for a in kubectl if not a[1].startswith("--context")]


def test_the_pods_resource_carries_the_project_id(tmp_path):
    from distrl.gke import manifests as m

    m.write_manifests(settings(), tmp_path)
    docs = [doc for _, doc in m.load_dir(tmp_path)]
    env = [e for doc in docs for e in _containers_env(doc) if e["name"] == "OTEL_RESOURCE_ATTRIBUTES"]
    assert env and all(f"gcp.project_id={PROJECT}" in e["value"].split(",") for e in env)


def _containers_env(doc: dict) -> list[dict]:
    """Every env entry of every container in a manifest document (any nesting of templates)."""
    found = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "containers" and isinstance(value, list):
                found += [e for c in value for e in c.get("env", [])]
            else:
                found += _containers_env(value)
    elif isinstance(doc, list):
        for item in doc:
            found += _containers_env(item)
    return found


def test_an_auth_token_ray_wrote_readable_by_all_is_made_private(tmp_path):
    """Ray writes ~/.ray/auth_token 0644 when it makes it; the GKE Secret is built from it."""
    token = tmp_path / "auth_token"
    token.write_text("x" * 64)
    token.chmod(0o644)
    assert ensure_auth_token(token) == token
    assert token.stat().st_mode & 0o777 == 0o600 and token.read_text() == "x" * 64
    made = ensure_auth_token(tmp_path / "new" / "auth_token")
    assert made.stat().st_mode & 0o777 == 0o600 and len(made.read_text()) == 64


# --- the Pong workload ---------------------------------------------------------------------


def test_the_pong_run_is_planned_costed_and_its_job_command_is_a_valid_training(tmp_path):
    """Ape-X's own domain on GKE, without a cloud: the plan renders and validates Pong's RayJob,
    its entrypoint parses into the training it means (the train CLI's own parser and checks),
    its replay fits the head pod's memory, and its cost covers the run's whole budget."""
    import numpy as np

    from distrl.apex.replay_memory import MEMORY_SHARE, sized_capacity
    from distrl.gke import manifests
    from distrl.gke.cost import estimate_run_cost
    from distrl.gke.settings import WORKLOADS
    from distrl.rl.envs import network_for
    from distrl.rl.frames import replay_sizing
    from distrl.rl.network import NATURE_TORSO

    pong = GkeSettings.for_workload("pong", project_id=PROJECT)
    assert (pong.actor_machine_type, pong.max_actor_nodes) == ("e2-standard-8", 2)
    assert GkeSettings.for_workload("pong", project_id=PROJECT,
                                    max_actor_nodes=3).max_actor_nodes == 3
    manifests.write_manifests(pong, tmp_path / "manifests")
    for _, doc in manifests.load_dir(tmp_path / "manifests"):
        manifests.validate(doc)
    lines = []
    dry_run(create_plan(pong, tmp_path / "manifests") + gke.rayjob_plan(pong, tmp_path / "manifests"),
            out=lines.append)
    assert any("rayjob.yaml" in line for line in lines)
    job = next(d for _, d in manifests.load_dir(tmp_path / "manifests") if d["kind"] == "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "distrl.apex.train"]
    from distrl.apex.train import config_from_args

    config = config_from_args(argv[3:])
    assert config.env_id == "ALE/Pong-v5" and config.replay_capacity is None
    assert config.num_gpus == 1 and config.num_actors == 2 * 6 and config.batch_size == 512
    # The pool is the one the measured rates ask for (benchmarks/pong_pool.py's record).
    record = (REPO_ROOT / "benchmarks" / "results" / "pong_pool.txt").read_text()
    asked = re.search(r"asks for (\d+) actors", record)
    assert asked and int(asked[1]) == config.num_actors, record
    # Its replay path is the one learner_feed.py's record sizes for 150 updates/s, and the
    # record measured it (the plan's shards with the plan's requests in flight).
    feed = (REPO_ROOT / "benchmarks" / "results" / "learner_feed.txt").read_text()
    shards = re.search(r"for 150 updates/s: (\d+) shard", feed)
    assert shards and int(shards[1]) == config.replay_shards, feed
    assert (f"{config.replay_shards} shard(s), {config.fetches_in_flight} request(s) in flight "
            "to each (ReplayShards)") in feed
    assert config.max_seconds == WORKLOADS["pong"].run_hours * 3600
    assert network_for(config).conv_layers == NATURE_TORSO
    # The replay, sized in the head pod as the replay process sizes itself, holds what the
    # learner waits for before its first update.
    head_memory = manifests.pod_sizes(pong)["head"].memory_gib * 2**30
    capacity, _ = sized_capacity(None, (84, 84, 4), obs_dtype=np.uint8, share=MEMORY_SHARE,
                                 available=head_memory, **replay_sizing(config, (84, 84, 4)))
    assert config.min_replay_size < capacity
    # The run's cost: the cluster's hourly cost (addresses included) for its whole budget, and
    # beside it the Spot price's drift, the Spot nodes' tails and the telemetry the run sends.
    from distrl.gke import cost

    hourly, run = estimate_cost(pong), estimate_run_cost(pong)
    extra = {line.item.split(",")[0].split(":")[0]: line for line in run.lines[len(hourly.lines):]}
    # The table's E2 Spot prices are the highest seen: no drift line. A table with a higher
    # E2 Spot rate seen prices the drift up to it.
    high = 8 * PRICES["e2_spot_high"]["vcpu"] + 32 * PRICES["e2_spot_high"]["memory_gib"]
    assert high == pytest.approx(PRICES["machines"]["e2-standard-8"][1])
    assert not [line for line in run.lines if line.item.startswith("Spot price drift")]
    dearer = {**PRICES, "e2_spot_high": {"vcpu": 0.015, "memory_gib": 0.002}}
    drifted = estimate_run_cost(pong, dearer)
    [drift] = [line for line in drifted.lines if line.item.startswith("Spot price drift")]
    assert drift.maximum == pytest.approx(2 * 4 * (8 * 0.015 + 32 * 0.002 - high))
    assert drifted.max_per_hour == pytest.approx(run.max_per_hour + drift.maximum + sum(
        2 * (8 * 0.015 + 32 * 0.002 - high) * seconds / 3600 for seconds in (
            cost.NODE_READY_S, cost.JOB_CLOSE_S, cost.NODE_UNNEEDED_S)))
    addresses = [line for line in run.lines if line.item.startswith("external IPv4")]
    assert [a.maximum for a in addresses] == pytest.approx([4 * 2 * 0.005, 4 * 2 * 0.0025])
    spans = (cost.SPANS_PER_SECOND_RUN + cost.SPANS_PER_SECOND_ACTOR * 12) * 4 * 3600
    assert extra["spans"].maximum == pytest.approx(spans / 1e6 * 0.20)
    samples = (cost.SAMPLES_PER_EXPORT_RUN + cost.SAMPLES_PER_EXPORT_ACTOR * 12) * 4 * 120
    assert extra["metric samples"].maximum == pytest.approx(samples / 1e6 * 0.06)
    # The hourly items (addresses among them) over the budget, then the drift and the tails.
    budget = sum(line.maximum for line in run.lines if line.item.endswith(", 4 h")
                 and not line.item.startswith("Spot price"))
    assert budget == pytest.approx(hourly.max_per_hour * 4)
    assert run.min_per_hour == pytest.approx(hourly.min_per_hour * 4 + sum(
        line.minimum for line in run.lines if line.item.startswith(("metric", "spans"))))
    assert [line.item.split(":")[0] for line in run.lines if line.item.startswith("Spot")] == [
        "Spot tail", "Spot tail", "Spot tail"]
    assert "pong run of at most 4 h" in run.table() and "e2-standard-8 (Spot)" in run.table()
    with pytest.raises(ValueError, match="workload='breakout': one of cartpole, pong, seed-scale"):
        GkeSettings(project_id=PROJECT, workload="breakout")
    with pytest.raises(ValueError, match="workload='breakout': one of cartpole, pong, seed-scale"):
        GkeSettings.for_workload("breakout", project_id=PROJECT)


def test_the_gpu_check_loads_libcuda_and_compiles_the_learner_s_convolution_here(tmp_path):
    """The plan's GPU check, run with this machine's TensorFlow (no GPU, no driver): it answers
    with the library path, whether libcuda loads, TensorFlow's own lines on CUDA (which the
    image's log level hides), the GPU count and an XLA-compiled convolution. The check refuses
    a head whose libcuda does not load, naming the folder GKE mounts it in and the path the
    pod has, and quoting TensorFlow; one with no GPU; one whose compile ran on the CPU."""
    import sys

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "3",
           "LD_LIBRARY_PATH": str(tmp_path / "no-driver-here")}
    out = subprocess.run([sys.executable, "-c", preflight.GPU_CHECK], capture_output=True,
                         text=True, timeout=180, env=env, check=True).stdout
    assert f"ld_library_path {tmp_path / 'no-driver-here'}" in out
    assert "libcuda failed libcuda.so.1" in out and "gpus 0" in out and "CPU:0" in out
    said = [line for line in out.splitlines() if line.startswith("tf ")]
    assert said and all("cuda" in line.lower() for line in said), out
    problem = preflight.gpu_problems(out, "nvidia-l4")[0]
    assert "libcuda.so.1 did not load in the head pod (libcuda.so.1: cannot open" in problem
    assert f"LD_LIBRARY_PATH there is {tmp_path / 'no-driver-here'}" in problem
    assert "/usr/local/nvidia/lib64" in problem and f"TensorFlow said: {said[0][3:]}" in problem
    with_driver = re.sub(r"^libcuda failed.*$", "libcuda ok", out, flags=re.M)
    assert "sees 0 GPU(s)" in preflight.gpu_problems(with_driver, "nvidia-l4")[0]
    on_cpu = with_driver.replace("gpus 0", "gpus 1")
    assert "did not run on the head's GPU (ok" in preflight.gpu_problems(on_cpu, "nvidia-l4")[0]
    on_gpu = on_cpu.replace("CPU:0", "GPU:0")
    assert preflight.gpu_problems(on_gpu, "nvidia-l4") == []


def test_cli_check_telemetry_reads_the_managed_collector_s_log(stand_ins, monkeypatch, capsys):
    """`distrl gke check-telemetry`, the check notebook 04 runs after a GKE job, from the
    command line: the collector's log through the cluster's own context, a refusal named."""
    args = ["check-telemetry", "--project-id", PROJECT, "--prefix", "rl"]
    assert gke.main(args) == 0
    assert stand_ins()[-1] == [
        "kubectl", f"--context=gke_{PROJECT}_us-central1-a_rl-cluster", "logs",
        "--namespace=gke-managed-otel", "deployment/opentelemetry-collector", "--since=30m",
        "--tail=2000"]
    respond(monkeypatch, "deployment/opentelemetry-collector",
            "2026-12-05T08:00:00Z error exporting: rpc error: code = PermissionDenied desc = "
            "Permission monitoring.timeSeries.create denied")
    assert gke.main(args) == 1
    assert "lacks roles/monitoring.metricWriter" in capsys.readouterr().err


def test_the_free_trial_advice_fits_the_smallest_plan():
    """No setting fits Free Trial's 8 vCPUs: a system node and a CPU head are 12 already."""
    from distrl.gke.preflight import FREE_TRIAL_GPUS
    from distrl.gke.settings import SYSTEM_MACHINE, machine

    smallest = settings(gpu_type="none", max_actor_nodes=1)
    assert machine(SYSTEM_MACHINE).vcpus + machine(smallest.head_machine_type).vcpus == 12
    assert "needs 12 vCPUs" in FREE_TRIAL_GPUS and "gpu_type='none'" not in FREE_TRIAL_GPUS


def test_the_seed_s_scale_is_a_workload_planned_and_priced(tmp_path):
    """100 actors or more, as the seed ran: 4 Spot e2-standard-32 nodes of 30 actors each,
    within the quotas the plan checks for it, and priced."""
    from distrl.gke import manifests
    from distrl.gke.cost import estimate_run_cost
    from distrl.gke.preflight import quota_needs

    seed = GkeSettings.for_workload("seed-scale", project_id=PROJECT)
    job = manifests.ray_job(seed)
    from distrl.apex.train import config_from_args

    config = config_from_args(shlex.split(job["spec"]["entrypoint"])[3:])
    assert config.num_actors == 120 >= 100 and config.env_id == "CartPole-v1"
    assert config.envs_per_actor == 4
    cpus = {need.metric: need.amount for need in quota_needs(seed, {})}
    assert cpus["CPUS"] == 4 + 8 + 4 * 32  # system node, the L4's g2-standard-8, the pool
    assert "seed-scale run of at most 10 min" in estimate_run_cost(seed).table()
    lines = []
    dry_run(create_plan(seed, tmp_path), out=lines.append)
    assert any("--machine-type=e2-standard-32" in line and "--max-nodes=4" in line
               for line in lines)
