"""distrl.gke: settings checks, the plan's exact commands, dry run, live run against stand-in
gcloud/kubectl executables that record their argv, teardown, prerequisites and cost."""

import json
import shlex
from pathlib import Path

import pytest

from distrl import gke
from distrl.gke import GkeSettings, create_plan, dry_run, run_plan, teardown_plan

PROJECT = "demo-project-1"
P = f"--project={PROJECT}"
LABELS = "--labels=app=distrl,distrl-prefix=rl"
ZONE = "--zone=europe-west4-b"


def settings(**kw) -> GkeSettings:
    base = dict(project_id=PROJECT, region="europe-west4", zone="europe-west4-b", prefix="rl",
                gpu_type="nvidia-tesla-t4", max_actor_nodes=3, image_tag="t1")
    return GkeSettings(**(base | kw))


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
    ("actor_machine_type", "m1-ultramem-40", "the price table's types"),
    ("mode", "serverless", "one of standard, autopilot"),
    ("image_tag", "bad tag", "image_tag='bad tag'"),
])
def test_bad_settings_are_refused_naming_the_value(field, value, message):
    with pytest.raises(ValueError, match="invalid GKE settings") as e:
        settings(**{field: value})
    assert message in str(e.value)


def test_the_image_tag_names_the_package_and_ray_versions():
    from distrl import __version__

    assert GkeSettings(project_id=PROJECT).image.endswith(
        f"/distrl-images/distrl:{__version__}-ray{gke.RAY_VERSION}")
    assert (gke.REPO_ROOT / "Dockerfile").exists()  # what Cloud Build builds


def test_every_name_derives_from_the_prefix():
    s = settings()
    assert (s.cluster, s.head_pool, s.actor_pool, s.repository, s.namespace, s.service_account) == \
        ("rl-cluster", "rl-head", "rl-actors", "rl-images", "rl", "rl-ray")
    assert s.gsa_email == f"rl-ray@{PROJECT}.iam.gserviceaccount.com"
    assert s.image == f"europe-west4-docker.pkg.dev/{PROJECT}/rl-images/distrl:t1"
    longest = settings(prefix="a" * 20)
    assert len(longest.service_account) <= 30 and len(longest.cluster) <= 40


# --- the plan ------------------------------------------------------------------------------

def expected_standard(manifests: Path, token: Path) -> list[list[str]]:
    """The exact create sequence for settings(): every command and flag, in order."""
    gsa = f"rl-ray@{PROJECT}.iam.gserviceaccount.com"
    binding = [f"--member=serviceAccount:{gsa}"]
    return [
        ["gcloud", "services", "enable", "container.googleapis.com", "monitoring.googleapis.com",
         "cloudtrace.googleapis.com", "telemetry.googleapis.com", "logging.googleapis.com",
         "artifactregistry.googleapis.com", "cloudbuild.googleapis.com", P],
        ["gcloud", "beta", "container", "clusters", "create", "rl-cluster", ZONE,
         "--release-channel=rapid", "--addons=RayOperator", "--enable-dataplane-v2",
         "--machine-type=e2-standard-4", "--num-nodes=1",
         f"--workload-pool={PROJECT}.svc.id.goog",
         "--managed-otel-scope=COLLECTION_AND_INSTRUMENTATION_COMPONENTS", LABELS, P],
        ["gcloud", "container", "node-pools", "create", "rl-head", "--cluster=rl-cluster", ZONE,
         "--machine-type=n1-standard-8",
         "--accelerator=type=nvidia-tesla-t4,count=1,gpu-driver-version=latest",
         "--num-nodes=1", "--node-labels=distrl/pool=rl-head", LABELS, P],
        ["gcloud", "container", "node-pools", "create", "rl-actors", "--cluster=rl-cluster", ZONE,
         "--machine-type=e2-standard-8", "--spot", "--enable-autoscaling", "--num-nodes=0",
         "--min-nodes=0", "--max-nodes=3", "--node-labels=distrl/pool=rl-actors", LABELS, P],
        ["gcloud", "artifacts", "repositories", "create", "rl-images",
         "--repository-format=docker", "--location=europe-west4", LABELS, P],
        ["gcloud", "builds", "submit", str(gke.REPO_ROOT),
         f"--tag=europe-west4-docker.pkg.dev/{PROJECT}/rl-images/distrl:t1",
         "--region=europe-west4", P],
        ["gcloud", "container", "clusters", "get-credentials", "rl-cluster", ZONE, P],
        ["gcloud", "iam", "service-accounts", "create", "rl-ray",
         "--display-name=distrl Ray pods (metrics and traces)", P],
        ["gcloud", "projects", "add-iam-policy-binding", PROJECT, *binding,
         "--role=roles/monitoring.metricWriter", "--condition=None", P],
        ["gcloud", "projects", "add-iam-policy-binding", PROJECT, *binding,
         "--role=roles/cloudtrace.agent", "--condition=None", P],
        ["gcloud", "projects", "add-iam-policy-binding", PROJECT, *binding,
         "--role=roles/telemetry.metricsWriter", "--condition=None", P],
        ["gcloud", "iam", "service-accounts", "add-iam-policy-binding", gsa,
         "--role=roles/iam.workloadIdentityUser",
         f"--member=serviceAccount:{PROJECT}.svc.id.goog[rl/rl-ray]", P],
        ["kubectl", "apply", f"--filename={manifests}/cluster/00-namespace.yaml"],
        ["kubectl", "create", "secret", "generic", "rl-ray-token", "--namespace=rl",
         f"--from-file=auth_token={token}"],
        ["kubectl", "apply", f"--filename={manifests}/cluster", "--recursive"],
        ["kubectl", "wait", "--namespace=rl", "--for=condition=Ready", "pod",
         "--selector=ray.io/node-type=head", "--timeout=900s"],
        ["kubectl", "get", "pods", "--namespace=rl", "--output=wide"],
        ["kubectl", "exec", "--namespace=rl", "service/rl-head-svc", "--container=ray-head",
         "--", "ray", "status"],
    ]


def expected_teardown(manifests: Path) -> list[list[str]]:
    gsa = f"rl-ray@{PROJECT}.iam.gserviceaccount.com"
    unbind = ["gcloud", "projects", "remove-iam-policy-binding", PROJECT,
              f"--member=serviceAccount:{gsa}"]
    return [
        ["kubectl", "delete", f"--filename={manifests}/cluster", "--recursive",
         "--ignore-not-found", "--wait=true"],
        ["kubectl", "delete", "namespace", "rl", "--ignore-not-found", "--wait=true"],
        [*unbind, "--role=roles/telemetry.metricsWriter", "--condition=None", P],
        [*unbind, "--role=roles/cloudtrace.agent", "--condition=None", P],
        [*unbind, "--role=roles/monitoring.metricWriter", "--condition=None", P],
        ["gcloud", "iam", "service-accounts", "delete", gsa, P, "--quiet"],
        ["gcloud", "artifacts", "repositories", "delete", "rl-images", "--location=europe-west4",
         P, "--quiet"],
        ["gcloud", "container", "node-pools", "delete", "rl-actors", "--cluster=rl-cluster",
         ZONE, P, "--quiet"],
        ["gcloud", "container", "node-pools", "delete", "rl-head", "--cluster=rl-cluster",
         ZONE, P, "--quiet"],
        ["gcloud", "container", "clusters", "delete", "rl-cluster", ZONE, P, "--quiet"],
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
        if step.argv[0] == "gcloud":
            assert P in step.argv
            creates = "create" in step.argv or "create-auto" in step.argv
            if creates and "service-accounts" not in step.argv:
                assert LABELS in step.argv, step


def test_teardown_deletes_what_create_made_newest_first(tmp_path):
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "t")
    assert [list(s.argv) for s in teardown_plan(plan)] == expected_teardown(tmp_path / "m")


def test_no_gpu_head_pool_is_cpu_only(tmp_path):
    plan = create_plan(settings(gpu_type="none"), tmp_path)
    head = next(s for s in plan if "rl-head" in s.argv and "create" in s.argv)
    assert "--machine-type=n2-standard-8" in head.argv
    assert not any(a.startswith("--accelerator") for a in head.argv)


def test_autopilot_mode_creates_an_autopilot_cluster_without_node_pools(tmp_path):
    plan = create_plan(settings(mode="autopilot"), tmp_path)
    argvs = [list(s.argv) for s in plan]
    assert ["gcloud", "beta", "container", "clusters", "create-auto", "rl-cluster",
            "--region=europe-west4", "--release-channel=rapid", "--enable-ray-operator",
            f"--workload-pool={PROJECT}.svc.id.goog",
            "--managed-otel-scope=COLLECTION_AND_INSTRUMENTATION_COMPONENTS", LABELS, P] in argvs
    assert not any("node-pools" in a for a in argvs)
    delete = [list(s.argv) for s in teardown_plan(plan)][-1]
    assert delete == ["gcloud", "container", "clusters", "delete", "rl-cluster",
                      "--region=europe-west4", P, "--quiet"]


def test_dry_run_prints_every_command_exactly(tmp_path):
    plan = create_plan(settings(), tmp_path / "manifests dir")  # a space must survive quoting
    lines = []
    dry_run(plan, out=lines.append)
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert commands == [list(s.argv) for s in plan]
    assert sum(line.startswith("# ") and line[2].isdigit() for line in lines) == len(plan)


# --- live run with stand-ins ---------------------------------------------------------------

PREREQS = [["gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"],
           ["gcloud", "projects", "describe", PROJECT, "--format=value(lifecycleState)"]]


def test_live_run_executes_the_plan_in_order_and_teardown_undoes_it(stand_ins, tmp_path):
    s, manifests, token = settings(), tmp_path / "m", tmp_path / "token"
    plan = create_plan(s, manifests, token)
    assert gke.check_prerequisites(s) == "reader@example.com"
    output = []
    run_plan(plan, out=output.append)
    assert stand_ins() == PREREQS + expected_standard(manifests, token)
    assert "done: kubectl get pods --namespace=rl --output=wide" in output  # streamed
    run_plan(teardown_plan(plan), out=output.append)
    assert stand_ins()[len(PREREQS) + len(plan):] == expected_teardown(manifests)


def test_a_failing_command_stops_the_plan_with_its_command_and_stderr(stand_ins, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "node-pools create rl-head")
    plan = create_plan(settings(), tmp_path / "m", tmp_path / "token")
    with pytest.raises(gke.StepFailed) as e:
        run_plan(plan, out=lambda line: None)
    message = str(e.value)
    assert "Create the head node pool" in message and "exit code 1" in message
    assert "gcloud container node-pools create rl-head" in message
    assert "quota 'GPUS_ALL_REGIONS' exceeded" in message
    ran = stand_ins()
    assert ran == expected_standard(tmp_path / "m", tmp_path / "token")[:3]  # nothing after it


def test_missing_gcloud_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(gke.PrerequisiteError) as e:
        gke.check_prerequisites(settings())
    assert "gcloud is not on PATH" in str(e.value) and "sdk/docs/install" in str(e.value)
    assert "kubectl is not on PATH" in str(e.value)


def test_no_account_or_an_unreachable_project_is_refused(stand_ins, monkeypatch):
    monkeypatch.setenv("FAKE_ACCOUNT", "")
    with pytest.raises(gke.PrerequisiteError, match="gcloud auth login"):
        gke.check_prerequisites(settings())
    monkeypatch.setenv("FAKE_ACCOUNT", "reader@example.com")
    monkeypatch.setenv("FAKE_PROJECT_STATE", "DELETE_REQUESTED")
    with pytest.raises(gke.PrerequisiteError, match=f"project '{PROJECT}' is not reachable"):
        gke.check_prerequisites(settings())
    assert all(argv in PREREQS for argv in stand_ins())  # only the read-only checks ran


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
    assert created[:2] == PREREQS and created[2:] == expected_standard(
        tmp_path / "m", tmp_path / "token")
    token = tmp_path / "token"  # made for the cluster's Secret, readable by its owner only
    assert len(token.read_text()) == 64 and token.stat().st_mode & 0o077 == 0
    assert gke.main(["teardown", *args]) == 0
    assert stand_ins()[len(created) + 2:] == expected_teardown(tmp_path / "m")


# --- cost ----------------------------------------------------------------------------------

def test_cost_estimate_adds_up_the_price_table():
    prices = gke.PRICES
    est = gke.estimate_cost(settings())
    fee, system = prices["cluster_fee"], prices["machines"]["e2-standard-4"][2]
    head = prices["machines"]["n1-standard-8"][2] + prices["gpus"]["nvidia-tesla-t4"][0]
    spot = prices["machines"]["e2-standard-8"][3]
    assert est.min_per_hour == pytest.approx(fee + system + head)
    assert est.max_per_hour == pytest.approx(fee + system + head + 3 * spot)
    table = est.table()
    assert prices["date"] in table and "USD per hour" in table and "(Spot)" in table


def test_cost_estimate_autopilot_prices_the_pods_requests():
    s = settings(mode="autopilot", gpu_type="nvidia-l4")
    est = gke.estimate_cost(s)
    ap = gke.PRICES["autopilot"]
    from distrl.manifests import pod_sizes

    actor = pod_sizes(s)["actor"]
    actor_price = actor.cpu * ap["vcpu"][1] + actor.memory_gib * ap["memory_gib"][1]
    assert est.lines[-1].unit_per_hour == pytest.approx(actor_price)
    assert est.max_per_hour - est.min_per_hour == pytest.approx(3 * actor_price)


def test_cost_table_can_be_overridden_from_a_file_and_a_bad_one_is_refused(tmp_path):
    table = json.loads(json.dumps(gke.PRICES))
    table["machines"]["e2-standard-8"][3] = 1.0
    table["date"] = "2030-01"
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(table))
    est = gke.estimate_cost(settings(), path)
    assert est.date == "2030-01" and est.lines[-1].unit_per_hour == 1.0
    with pytest.raises(ValueError, match="price table lacks date, source"):
        gke.estimate_cost(settings(), {"currency": "USD"})


def test_cli_plan_and_cost_print_without_running_anything(stand_ins, tmp_path, capsys):
    from distrl.cli import main as distrl

    assert distrl(["gke", "plan", "--project-id", PROJECT, "--manifests-dir",
                   str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "gcloud services enable container.googleapis.com" in out
    assert (tmp_path / "m" / "job" / "rayjob.yaml").exists()
    assert distrl(["gke", "cost", "--project-id", PROJECT, "--max-actor-nodes", "10"]) == 0
    assert "0-10" in capsys.readouterr().out
    assert stand_ins() == []
