"""A GKE cluster for Ape-X: the gcloud/kubectl plan, its dry run, live run and resume.

    settings = GkeSettings(project_id="my-project", gpu_type="nvidia-l4", max_actor_nodes=4)
    plan = create_plan(settings, manifests_dir="runs/gke/manifests")
    dry_run(plan)                      # prints every command exactly as it would run
    check_prerequisites(settings)      # tools, gcloud version, login, billing, APIs, quotas
    run_plan(plan)                     # runs them, streaming output, stops at the first failure
    run_plan(plan, start=13)           # resumes at the step that failed
    run_teardown(teardown_plan(plan))  # deletes what the plan created, newest first; every
                                       # undo runs, what is gone already counts as done
    check_nothing_bills(project_id)    # then distrl's label in any location: none may be left

Every command is an argv list, never a shell string, and passes --project explicitly (the
user's gcloud configuration is not changed). Every create step first asks whether its resource
exists (describe before create), so a plan run twice creates nothing twice. Check steps read
the live project and cluster (quotas, GKE and KubeRay versions, the managed collector, room on
the head node, the GPU) and stop the plan with the fix before anything depends on them. Every
resource name derives from one prefix and carries the same labels.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
import sys
from pathlib import Path

from distrl.gke import manifests as k8s
from distrl.gke import preflight
from distrl.gke.cost import (
    estimate_cost,
    estimate_run_cost,
    estimate_run_through_cost,
    monthly_costs,
)
from distrl.gke.inventory import StillBilling, check_nothing_bills
from distrl.gke.manifests import SPOT_TAINT, head_pod_request
from distrl.gke.preflight import PrerequisiteError, check_prerequisites
from distrl.gke.runner import Owner, Step, StepFailed, TeardownIncomplete, dry_run, run_plan, run_teardown
from distrl.gke.settings import (
    ADDON_ROLLOUT_S,
    APIS,
    BUILD_BUCKET_ROLE,
    BUILD_LOG_ROLE,
    BUILD_PUSH_ROLE,
    BUILD_REGIONS,
    BUILD_TIMEOUT,
    DISK_GB,
    MANAGED_OTEL_NAMESPACE,
    MANAGED_OTEL_SCOPE,
    NODE_PULL_ROLE,
    NODE_READY_S,
    NODE_ROLE,
    NODE_STREAM_ROLE,
    REPO_ROOT,
    SERVICE_ACCOUNT_VISIBLE_S,
    SYSTEM_MACHINE,
    TELEMETRY_ROLES,
    GkeSettings,
)
from distrl.otel import dashboard
from distrl.ray_runtime import DEFAULT_TOKEN_FILE, ensure_auth_token


def _labels_flag(settings: GkeSettings) -> str:
    return "--labels=" + ",".join(f"{k}={v}" for k, v in settings.labels.items())


def _labelled(s: GkeSettings, describe: tuple[str, ...], field: str = "labels") -> Owner:
    """Made by this plan: the describe command's `field` carries the prefix label."""
    return Owner((*describe, f"--format=value({field}.distrl-prefix)"), s.prefix)


def _account_owner(s: GkeSettings, email: str, project: str) -> Owner:
    """Service accounts take no labels: their description says who made them."""
    return Owner(("gcloud", "iam", "service-accounts", "describe", email, project,
                  "--format=value(description)"), s.owner_description)


def _grant(title: str, member: str, role: str, group: tuple[str, ...], subject: str,
           flags: tuple[str, ...], why: str, undo: bool = True, owner: Owner | None = None) -> Step:
    """An IAM binding: `gcloud <group> add-iam-policy-binding <subject> --member --role <flags>`;
    undo=False where deleting the subject removes the binding with it. owner: the member's
    account, whose bindings the teardown removes only if this plan made it."""
    binding = (subject, f"--member={member}", f"--role={role}", *flags)
    return Step(title, ("gcloud", *group, "add-iam-policy-binding", *binding), why,
                ("gcloud", *group, "remove-iam-policy-binding", *binding) if undo else None,
                owner=owner)


def create_plan(settings: GkeSettings, manifests_dir: str | Path,
                auth_token_file: str | Path = DEFAULT_TOKEN_FILE,
                source_dir: str | Path = REPO_ROOT) -> list[Step]:
    """The ordered steps from an empty project to a verified Ray cluster.

    manifests_dir: where `distrl.gke.manifests.write_manifests(settings, ...)` put the rendered
    manifests (`kubectl apply` reads them from there).
    auth_token_file: the Ray auth token the cluster will require; by default your own
    (~/.ray/auth_token), so the Jobs client on your machine works through port-forward.
    source_dir: what Cloud Build builds (the directory with the Dockerfile).

    The order keeps money for last: the quotas are checked first, the image (half an hour) is
    built before any cluster exists, and the node pools (the GPU head) come after the cluster's
    checks. Teardown (teardown_plan, run_teardown) undoes it newest first.
    """
    s, project = settings, f"--project={settings.project_id}"
    return [*_project_steps(s, project), *_image_steps(s, project, source_dir),
            *_node_identity_steps(s, project), *_cluster_steps(s, project),
            *_pod_identity_steps(s, project), *_apply_steps(s, Path(manifests_dir),
                                                            auth_token_file)]


def _project_steps(s: GkeSettings, project: str) -> list[Step]:
    return [
        Step("Enable the APIs",
             ("gcloud", "services", "enable", *(f"{api}.googleapis.com" for api in APIS), project),
             "GKE, Compute Engine (quotas), IAM, Cloud Monitoring, Cloud Trace, the Telemetry "
             "API (OTLP into Google Cloud), Logging, Artifact Registry, Cloud Build and Cloud "
             "Storage. Enabling twice is harmless; a new API can take minutes to answer."),
        Step("Check the regional quotas",
             ("gcloud", "compute", "regions", "describe", s.region, project, "--format=json"),
             "vCPUs of every node at full scale, boot disks, the head's GPU and IP addresses "
             "against what the region grants (new projects often have 0 GPUs): the node pools "
             "would fail half-way.",
             check=lambda out: preflight.quota_problems(s, out)),
        Step("Check the project-wide quotas",
             ("gcloud", "compute", "project-info", "describe", project, "--format=json"),
             "CPUS_ALL_REGIONS and GPUS_ALL_REGIONS cap every region together, whatever one "
             "region grants (new and trial projects often have 20-32 vCPUs and no GPU).",
             check=functools.partial(preflight.project_quota_problems, s)),
        Step("Check the project has the default network",
             ("gcloud", "compute", "networks", "list", "--filter=name=default",
              "--format=value(name)", project),
             "The cluster goes on the project's `default` network (clusters create without "
             "--network). Projects under the organization policy "
             "compute.skipDefaultNetworkCreation have none, and the create would fail after "
             "the image is built.",
             check=functools.partial(preflight.default_network_problems, project_id=s.project_id)),
    ]


def _image_steps(s: GkeSettings, project: str, source_dir: str | Path) -> list[Step]:
    labels, build_member = _labels_flag(s), f"serviceAccount:{s.build_email}"
    repository = ("gcloud", "artifacts", "repositories", "describe", s.repository,
                  f"--location={s.region}", project)
    build_owner = _account_owner(s, s.build_email, project)
    return [
        Step("Create the Artifact Registry repository",
             ("gcloud", "artifacts", "repositories", "create", s.repository,
              "--repository-format=docker", f"--location={s.region}", labels, project),
             "Where Cloud Build pushes the training image, in the cluster's region.",
             ("gcloud", "artifacts", "repositories", "delete", s.repository,
              f"--location={s.region}", project, "--quiet"),
             exists=(*repository, "--format=value(name)"), owner=_labelled(s, repository)),
        _service_account("Create the build service account", s, s.build_service_account,
                         s.build_email, "distrl image builds", project,
                         "Cloud Build's default identity in new projects is the Compute Engine "
                         "default service account, which may hold no roles; this one holds "
                         "exactly what a build needs."),
        *_bucket_steps(s, project),
        _grant("Let the build account use its bucket", build_member, BUILD_BUCKET_ROLE,
               ("storage", "buckets"), f"gs://{s.build_bucket}", (project,),
               "Storage Admin on this bucket only: what Cloud Build asks for a user-created logs "
               "bucket (cloud.google.com/build/docs/securing-builds/store-manage-build-logs).",
               undo=False),
        _grant("Let the build account push to the repository", build_member, BUILD_PUSH_ROLE,
               ("artifacts", "repositories"), s.repository, (f"--location={s.region}", project),
               "Push images: this repository only.", undo=False),
        _grant("Let the build account write build logs", build_member, BUILD_LOG_ROLE,
               ("projects",), s.project_id, ("--condition=None", project),
               "Cloud Logging of the build steps.", owner=build_owner),
        Step("Build the image with Cloud Build",
             ("gcloud", "builds", "submit", str(source_dir), f"--tag={s.image}",
              f"--region={s.build_region}",
              f"--service-account=projects/{s.project_id}/serviceAccounts/{s.build_email}",
              f"--gcs-source-staging-dir=gs://{s.build_bucket}/source",
              f"--gcs-log-dir=gs://{s.build_bucket}/logs", f"--timeout={BUILD_TIMEOUT}",
              project),
             "Builds the repository's Dockerfile in Google Cloud (no local Docker needed) from "
             f"the same lock file as `make install`, as the build account, with a "
             f"{BUILD_TIMEOUT} limit (gcloud's default of 10 minutes is too short for "
             f"TensorFlow's CUDA wheels), in {s.build_region}: some projects may build only in "
             f"{', '.join(BUILD_REGIONS)} (Cloud Build locations). Before any cluster exists, "
             "so no node is paid for while it builds. Skipped when the tag exists.",
             exists=("gcloud", "artifacts", "docker", "images", "describe", s.image, project,
                     "--format=value(image_summary.digest)")),
    ]


def _bucket_steps(s: GkeSettings, project: str) -> list[Step]:
    """The build bucket, then its label: Cloud Storage's own page labels with `buckets update
    --update-labels` (cloud.google.com/storage/docs/using-bucket-labels), as gcloud 578's
    `buckets create` takes none (surface/storage/buckets/create.py). Updating twice is
    harmless; a stop between the two leaves a bucket that a rerun refuses, saying how to
    label it."""
    bucket = ("gcloud", "storage", "buckets", "describe", f"gs://{s.build_bucket}", project)
    label_bucket = ("gcloud", "storage", "buckets", "update", f"gs://{s.build_bucket}",
                    "--update-labels=" + ",".join(f"{k}={v}" for k, v in s.labels.items()),
                    project)
    return [
        Step("Create the build bucket",
             ("gcloud", "storage", "buckets", "create", f"gs://{s.build_bucket}",
              f"--location={s.build_region}", "--uniform-bucket-level-access", project),
             "The build's source upload and its logs (a build with its own service account must "
             "name where its logs go), in the region the build runs in.",
             ("gcloud", "storage", "rm", "--recursive", f"gs://{s.build_bucket}", project),
             exists=(*bucket, "--format=value(name)"), owner=dataclasses.replace(
                 _labelled(s, bucket), unlabelled=(
                     "If this plan made it and stopped before labelling it, label it and "
                     f"run again: {shlex.join(label_bucket)}"))),
        Step("Label the build bucket", label_bucket,
             "The teardown deletes the bucket only if it carries this plan's label."),
    ]


def _service_account(title: str, s: GkeSettings, account: str, email: str, display: str,
                     project: str, why: str) -> Step:
    """Create a service account (deleted on teardown if this plan made it; skipped when it
    exists)."""
    return Step(title, ("gcloud", "iam", "service-accounts", "create", account,
                        f"--display-name={display}", f"--description={s.owner_description}",
                        project), why,
                ("gcloud", "iam", "service-accounts", "delete", email, project, "--quiet"),
                exists=("gcloud", "iam", "service-accounts", "describe", email, project,
                        "--format=value(email)"),
                owner=_account_owner(s, email, project))


def _node_identity_steps(s: GkeSettings, project: str) -> list[Step]:
    member = f"serviceAccount:{s.node_email}"
    return [
        _service_account("Create the node service account", s, s.node_service_account,
                         s.node_email, "distrl GKE nodes", project,
                         "The nodes' own identity: where the organization policy "
                         "iam.automaticIamGrantsForDefaultServiceAccounts is enforced "
                         "(organizations created since 2024-05-03), the Compute Engine default "
                         "account has no roles and nodes running as it cannot pull the image."),
        Step("Wait until the node service account can be used",
             ("gcloud", "iam", "service-accounts", "describe", s.node_email, project,
              "--format=value(uniqueId)"),
             "IAM is eventually consistent: a new service account may not be usable for 60 s "
             "or more (cloud.google.com/iam/docs/service-accounts-create), and a cluster "
             "created with it at once can fail with 'Service account ... does not exist'.",
             check=functools.partial(preflight.account_visible_problems, email=s.node_email),
             retry_s=SERVICE_ACCOUNT_VISIBLE_S),
        _grant("Let the nodes act as GKE nodes", member, NODE_ROLE, ("projects",),
               s.project_id, ("--condition=None", project),
               "What a node needs to run (logs, metrics, the node's own API calls).",
               owner=_account_owner(s, s.node_email, project)),
        _grant("Let the nodes pull from the repository", member, NODE_PULL_ROLE,
               ("artifacts", "repositories"), s.repository, (f"--location={s.region}", project),
               "Image pulls use the node's account, also with Workload Identity.", undo=False),
        _grant("Let the nodes stream the image", member, NODE_STREAM_ROLE, ("projects",),
               s.project_id, ("--condition=None", project),
               "Image streaming with a node account of one's own needs Service Usage Consumer "
               "on the image's project (docs/how-to/image-streaming); without it nodes pull "
               "the whole 8 GB image.", owner=_account_owner(s, s.node_email, project)),
    ]


def _create_cluster_step(s: GkeSettings, project: str) -> Step:
    """The cluster itself: Standard (a system node; the pools follow) or Autopilot."""
    loc, labels = s.location_flag, _labels_flag(s)
    nodes_as = f"--service-account={s.node_email}"
    describe = ("gcloud", "container", "clusters", "describe", s.cluster, loc, project)
    delete_cluster = ("gcloud", "container", "clusters", "delete", s.cluster, loc, project,
                      "--quiet")
    otel = f"--managed-otel-scope={MANAGED_OTEL_SCOPE}"
    if s.mode == "standard":
        return Step(
            "Create the Standard cluster",
            ("gcloud", "container", "clusters", "create", s.cluster, loc,
             "--release-channel=rapid", "--addons=RayOperator", "--enable-dataplane-v2",
             f"--machine-type={SYSTEM_MACHINE}", "--num-nodes=1", f"--disk-size={DISK_GB}",
             "--autoscaling-profile=optimize-utilization", "--enable-image-streaming",
             f"--workload-pool={s.project_id}.svc.id.goog", nodes_as, otel, labels, project),
            "One small on-demand node for system pods, running as the node service account; "
            "Workload Identity; the Ray Operator add-on (KubeRay, GKE 1.30.0-gke.1747000 or "
            "later); Managed OpenTelemetry, whose collector forwards OTLP to Cloud Monitoring "
            f"and Cloud Trace (GKE {preflight.MIN_GKE_OTEL} or later, hence the rapid channel; "
            "the flag is GA from gcloud 576); Dataplane V2 enforces the NetworkPolicy. Spot "
            "nodes bill while they start and until they go: image streaming can start the "
            "containers before the 8 GB image is pulled (COS with containerd, Artifact "
            "Registry; docs/how-to/image-streaming), though not on an image's first pull: "
            "later pulls, on any cluster, gain, "
            "and the optimize-utilization profile "
            "removes unneeded nodes sooner than the default 10 minutes (GKE's autoscaling "
            "profiles).",
            delete_cluster, exists=(*describe, "--format=value(name)"),
            owner=_labelled(s, describe, "resourceLabels"))
    # gcloud 576.0.0 promoted --managed-otel-scope to GA for clusters create, create-auto
    # and update alike (its release notes); create-auto takes no --workload-pool
    # (Autopilot always has Workload Identity).
    return Step(
        "Create the Autopilot cluster",
        ("gcloud", "container", "clusters", "create-auto", s.cluster, loc,
         "--release-channel=rapid", "--enable-ray-operator", nodes_as, otel, labels, project),
        "Autopilot makes nodes for the pods' requests, running as the node service account: "
        "actors ask for Spot with the node selector cloud.google.com/gke-spot, the head for "
        "a GPU with cloud.google.com/gke-accelerator. Workload Identity is always on.",
        delete_cluster, exists=(*describe, "--format=value(name)"),
        owner=_labelled(s, describe, "resourceLabels"))


def _no_node_upgrades_step(s: GkeSettings, project: str, describe: tuple[str, ...]) -> Step:
    """A maintenance exclusion, so that no node upgrade drains the head mid-run. gcloud 545+
    (its release notes): --add-maintenance-exclusion-until-end-of-support; create takes no
    exclusion, and one update call does one maintenance change. The scope no_minor_or_node_
    upgrades "excludes all minor upgrades for the cluster, and also exclude all node pool
    upgrades. Only control plane patches are allowed" (GKE API, Shared.Types/Scope)."""
    name = f"{s.prefix}-no-node-upgrades"
    autopilot = ("" if s.mode == "standard" else
                 " On Autopilot, too: its upgrades cannot be turned off, only timed 'with "
                 "maintenance windows and exclusions' (docs/concepts/cluster-upgrades-autopilot); "
                 "GKE's pages do not say which scopes an Autopilot cluster takes. Should GKE "
                 "refuse this one, the plan stops here with GKE's message: resume at the next "
                 "step to go on without it, and a node upgrade may then drain the head.")
    return Step(
        "Keep node upgrades out of the runs",
        ("gcloud", "container", "clusters", "update", s.cluster, s.location_flag,
         f"--add-maintenance-exclusion-name={name}",
         "--add-maintenance-exclusion-scope=no_minor_or_node_upgrades",
         "--add-maintenance-exclusion-until-end-of-support", project),
        "A node upgrade drains its node, the head too, and the rapid channel upgrades often. "
        "This exclusion holds node and minor upgrades until the cluster's version ends its "
        "support; control-plane patches still apply. Compute Engine's host maintenance of the "
        "GPU head is not covered (a GPU VM cannot live-migrate: it stops after an hour's "
        f"notice). Kept with the cluster: --remove-maintenance-exclusion={name} lifts it."
        + autopilot,
        exists=(*describe, "--format=value(maintenancePolicy.window.maintenanceExclusions."
                           f"{name}.startTime)"))


def _cluster_steps(s: GkeSettings, project: str) -> list[Step]:
    loc = s.location_flag
    describe = ("gcloud", "container", "clusters", "describe", s.cluster, loc, project)
    steps = [
        _create_cluster_step(s, project),
        Step("Fetch cluster credentials for kubectl",
             ("gcloud", "container", "clusters", "get-credentials", s.cluster, loc, project),
             f"Writes the kubeconfig context {s.kube_context}, which every kubectl command "
             "below names (--context): a later switch of the current context changes nothing "
             "here."),
        Step("Check the GKE version for Managed OpenTelemetry",
             (*describe, "--format=value(currentMasterVersion)"),
             f"{preflight.MIN_GKE_OTEL} or later; {preflight.MIN_GKE_OTEL_GRPC} or later "
             f"for gRPC export ({preflight.OTEL_DOCS}).",
             check=functools.partial(preflight.gke_version_problems,
                                     otlp_protocol=s.otlp_protocol)),
        Step("Check the managed collector's ports",
             s.kubectl("get", "service", "opentelemetry-collector",
                       f"--namespace={MANAGED_OTEL_NAMESPACE}", "--ignore-not-found",
                       "--output=jsonpath={.spec.ports[*].port}|{.spec.ports[*].targetPort}"),
             f"The pods export {s.otlp_protocol} to {s.otlp_endpoint}; under Dataplane V2 the "
             "egress NetworkPolicy sees the collector pods' target port, so both are checked. "
             f"Asked again for up to {ADDON_ROLLOUT_S:.0f} s while the add-on rolls out.",
             check=functools.partial(preflight.otel_service_problems,
                                     otlp_protocol=s.otlp_protocol), retry_s=ADDON_ROLLOUT_S),
        Step("Check the Ray operator supports token auth (KubeRay 1.6 or later)",
             s.kubectl("get", "crd", "rayclusters.ray.io",
                       "--output=jsonpath={.spec.versions[?(@.name==\"v1\")].schema."
                       "openAPIV3Schema.properties.spec.properties.authOptions.properties."
                       "secretName.type}"),
             "spec.authOptions.secretName makes KubeRay hand the Ray token to the autoscaler "
             "sidecar, the RayJob submitter and its own dashboard client. Asked again for up to "
             f"{ADDON_ROLLOUT_S:.0f} s while the add-on rolls out.",
             check=preflight.kuberay_auth_problems, retry_s=ADDON_ROLLOUT_S),
        Step("Check where the Ray operator runs",
             s.kubectl("get", "deployments", "--all-namespaces", "--output=json"),
             "The operator polls the head's port 8265; the NetworkPolicy must admit it "
             + (f"(it admits namespace {s.operator_namespace})." if s.operator_namespace else
                "(it admits any source to 8265; Ray's token guards it)."),
             check=lambda out: preflight.operator_problems(out, s.operator_namespace)[0]),
    ]
    steps.insert(1, _no_node_upgrades_step(s, project, describe))
    if s.mode == "standard":  # Autopilot makes its nodes for the pods
        steps += _node_pool_steps(s, project)
    return steps


def spot_taint_flag() -> str:
    """The Spot pool's taint (manifests.SPOT_TAINT) as gcloud's --node-taints takes it."""
    return f"--node-taints={SPOT_TAINT['key']}={SPOT_TAINT['value']}:{SPOT_TAINT['effect']}"


def _node_pool_steps(s: GkeSettings, project: str) -> list[Step]:
    loc, labels = s.location_flag, _labels_flag(s)
    head_accel = () if s.gpu_type == "none" else (
        f"--accelerator=type={s.gpu_type},count=1,gpu-driver-version=latest",)
    steps = []
    for pool, args, why in (
            (s.head_pool, (f"--machine-type={s.head_machine_type}", *head_accel,
                           "--num-nodes=1"),
             "The Ray head runs replay, learner and driver: not Spot, so a preemption never "
             "takes the replay memory. GKE installs the GPU driver (gpu-driver-version=latest)."),
            (s.actor_pool, (f"--machine-type={s.actor_machine_type}", "--spot",
                            spot_taint_flag(), "--enable-autoscaling", "--num-nodes=0", "--min-nodes=0",
                            f"--max-nodes={s.max_actor_nodes}"),
             "Actors are stateless and restartable, so they run on Spot VMs (about 30 s "
             "notice before preemption). The pool scales from 0 to max_actor_nodes with the "
             "Ray autoscaler's requests. Its taint keeps every Pod but the actors off it, so "
             "nothing else holds a node up or is preempted.")):
        head = pool == s.head_pool
        pool_ref = (f"--cluster={s.cluster}", loc, project)
        describe_pool = ("gcloud", "container", "node-pools", "describe", pool, *pool_ref)
        delete_pool = ("gcloud", "container", "node-pools", "delete", pool, *pool_ref, "--quiet")
        effect = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE",
                  "NoExecute": "NO_EXECUTE"}[SPOT_TAINT["effect"]]  # as the API spells it
        shape = preflight.PoolShape(
            machine_type=s.head_machine_type if head else s.actor_machine_type,
            gpu_type=s.gpu_type if head else "none", spot=not head,
            taints=() if head else ((SPOT_TAINT["key"], SPOT_TAINT["value"], effect),),
            max_nodes=None if head else s.max_actor_nodes)
        steps.append(Step(
            ("Create the head node pool (on-demand" + ("" if s.gpu_type == "none" else ", GPU")
             + ")") if head else "Create the Spot CPU node pool for actors",
            ("gcloud", "container", "node-pools", "create", pool, f"--cluster={s.cluster}",
             loc, *args, f"--disk-size={DISK_GB}", f"--node-labels=distrl/pool={pool}",
             f"--service-account={s.node_email}", labels, project), why,
            delete_pool, exists=(*describe_pool, "--format=value(name)"),
            owner=_labelled(s, describe_pool, "config.resourceLabels"),
            matches=((*describe_pool, "--format=json"), functools.partial(
                preflight.pool_problems, pool=pool, want=shape, replace=shlex.join(delete_pool)))))
    cpu, memory = head_pod_request(s)
    steps.append(Step(
        "Check the head node has room for the head pod",
        s.kubectl("describe", "nodes", f"--selector=cloud.google.com/gke-nodepool={s.head_pool}"),
        f"The head pod requests {cpu:g} CPU and {memory:g} GiB (Ray, TensorBoard, KubeRay's "
        "autoscaler sidecar) beside GKE's own DaemonSets.",
        check=functools.partial(preflight.head_room_problems, cpu_needed=cpu,
                                memory_gib_needed=memory, pool=s.head_pool)))
    return steps


def _pod_identity_steps(s: GkeSettings, project: str) -> list[Step]:
    return [
        _service_account("Create the Google service account for telemetry", s,
                         s.service_account, s.gsa_email, "distrl Ray pods (metrics and traces)",
                         project, "The identity the Ray pods act as in Google Cloud."),
        *(_grant(f"Grant {role}", f"serviceAccount:{s.gsa_email}", role, ("projects",),
                 s.project_id, ("--condition=None", project),
                 "Least privilege: write metrics and traces, nothing else.",
                 owner=_account_owner(s, s.gsa_email, project))
          for role in TELEMETRY_ROLES),
        Step("Let the Kubernetes service account act as it (Workload Identity)",
             ("gcloud", "iam", "service-accounts", "add-iam-policy-binding", s.gsa_email,
              "--role=roles/iam.workloadIdentityUser",
              f"--member=serviceAccount:{s.project_id}.svc.id.goog"
              f"[{s.namespace}/{s.service_account}]", project),
             "The manifests annotate the Kubernetes service account with the Google one; no "
             "key file exists anywhere."),
    ]


def _apply_steps(s: GkeSettings, manifests: Path, auth_token_file: str | Path) -> list[Step]:
    ns = f"--namespace={s.namespace}"
    secret = f"{s.prefix}-ray-token"
    # A teardown fetches the credentials before its kubectl steps (the context may be gone, or
    # this another machine); when the cluster is gone, so is what they delete.
    credentials = ("gcloud", "container", "clusters", "get-credentials", s.cluster,
                   s.location_flag, f"--project={s.project_id}")
    namespace = Owner(s.kubectl("get", "namespace", s.namespace, "--output=jsonpath="
                                "{.metadata.labels.app\\.kubernetes\\.io/instance}"), s.prefix)
    # The run volume's disk: the CSI driver deletes it after its claim, unless the cluster goes
    # first ("deletion of these resources is not always guaranteed: ... persistent disk
    # volumes", cloud.google.com/sdk/gcloud/reference/container/clusters/delete). It carries the
    # plan's labels (manifests.runs_storage_class), so the teardown finds what is left.
    # Only the plan's zone (a regional cluster's: its region's zones), and only disks no VM
    # uses: `-users:*` is "users undefined" (gcloud topic filters). A disk's zone is a URL
    # (.../zones/us-central1-a), so the region's zones match by their path, not from its start.
    where = f"zone:{s.zone}" if s.mode == "standard" else f"zone~/zones/{s.region}-"
    disks = (("gcloud", "compute", "disks", "list",
              f"--filter=labels.distrl-prefix={s.prefix} AND {where} AND -users:*",
              "--format=value(name,zone.basename())", f"--project={s.project_id}"),
             lambda line: ("gcloud", "compute", "disks", "delete", line.split()[0],
                           f"--zone={line.split()[-1]}", f"--project={s.project_id}", "--quiet"))
    steps = [
        Step("Create the namespace and its service account",
             s.kubectl("apply", f"--filename={manifests / 'cluster' / '00-namespace.yaml'}"),
             "The service account carries the Workload Identity annotation.",
             s.kubectl("delete", "namespace", s.namespace, "--ignore-not-found", "--wait=true"),
             owner=namespace, needs=credentials),
        Step("Store the Ray auth token as a Secret",
             s.kubectl("create", "secret", "generic", secret, ns,
                       f"--from-file=auth_token={auth_token_file}"),
             "KubeRay reads the token from this Secret's key auth_token (spec.authOptions."
             "secretName) and gives it to every Ray container, the autoscaler and itself. It is "
             "read from a file so it never appears in a command line or a manifest.",
             exists=s.kubectl("get", "secret", secret, ns, "--output=name")),
        Step("Apply the manifests",
             s.kubectl("apply", f"--filename={manifests / 'cluster'}", "--recursive"),
             "NetworkPolicy, run volume, the RayCluster (head + Spot actors group, TensorBoard "
             "beside the head) and the TensorBoard Service.",
             s.kubectl("delete", f"--filename={manifests / 'cluster'}", "--recursive",
                       "--ignore-not-found", "--wait=true"),
             owner=namespace, needs=credentials, leftovers=disks),
        Step("Wait for the Ray head",
             s.kubectl("wait", f"raycluster/{s.prefix}", ns, "--for=condition=HeadPodReady",
                       f"--timeout={NODE_READY_S:.0f}s"),
             "Waits on the RayCluster, which exists once applied (a pod selector would match "
             "nothing until the operator makes the pod, and kubectl wait then exits at once: "
             "kubernetes/kubectl#665). The first start pulls the image and, with a GPU, waits "
             "for the driver install."),
        Step("Check the autoscaler has the Ray token",
             s.kubectl("get", "pods", ns,
                       f"--selector=ray.io/node-type=head,ray.io/cluster={s.prefix}",
                       "--output=jsonpath={.items[0].spec.containers[?(@.name==\"autoscaler\")]"
                       ".env[?(@.name==\"RAY_AUTH_MODE\")].value}"),
             "Proof that the running operator honoured spec.authOptions (the CRD alone does "
             "not prove it): without the token the actors group never grows.",
             check=preflight.autoscaler_token_problems),
    ]
    return steps + _verify_steps(s)


def _verify_steps(s: GkeSettings) -> list[Step]:
    """What the running cluster shows: TensorFlow's GPU in the head pod, the pods, Ray's
    nodes."""
    ns, steps = f"--namespace={s.namespace}", []
    if s.gpu_type != "none":
        steps.append(Step(
            "Check TensorFlow sees the GPU in the head pod",
            s.kubectl("exec", ns, f"service/{s.prefix}-head-svc", "--container=ray-head", "--",
                      "python", "-c", preflight.GPU_CHECK),
            "The learner trains on it, its update compiled with XLA: a missing driver, CUDA "
            "wheel, ptxas or libdevice shows here in seconds, not at the first update after "
            "the Spot pool is up.",
            check=functools.partial(preflight.gpu_problems, gpu_type=s.gpu_type)))
    steps += [
        Step("Verify: list the pods", s.kubectl("get", "pods", ns, "--output=wide")),
        Step("Verify: `ray status` in the head",
             s.kubectl("exec", ns, f"service/{s.prefix}-head-svc", "--container=ray-head",
                       "--", "ray", "status"),
             "Nodes, CPUs and GPUs as Ray sees them. Actor nodes appear when work asks for them."),
    ]
    return steps


def telemetry_check_step(kube_context: str) -> Step:
    """After the first training run: the managed collector's log must not say that Google
    Cloud refused what it forwarded (the identity it writes as lacks a role, or the resource
    lacks gcp.project_id). Which identity that collector writes with is not stated in the pages
    we could read, hence a check on what actually happened. The Deployment's name,
    opentelemetry-collector like its Service, is what community write-ups show, not a
    documented name: a `not found` here says to list the namespace's pods."""
    return Step(
        "Check the managed collector's log for refused exports",
        ("kubectl", f"--context={kube_context}", "logs", f"--namespace={MANAGED_OTEL_NAMESPACE}",
         "deployment/opentelemetry-collector", "--since=30m", "--tail=2000"),
        "Stops on PermissionDenied or a missing resource attribute in what the collector "
        "forwarded to Cloud Monitoring and Cloud Trace.",
        check=preflight.collector_log_problems)


def rayjob_plan(s: GkeSettings, manifests_dir: str | Path) -> list[Step]:
    """Run the RayJob of `write_manifests` (a one-shot training with a cluster of its own),
    refusing while the RayCluster still runs: both pin their head to the one-node head pool
    and mount the same ReadWriteOnce run volume, so the RayJob's head would stay Pending until
    its activeDeadlineSeconds ran out (manifests.job_deadline_s)."""
    ns = f"--namespace={s.namespace}"

    def cluster_gone(out: str) -> list[str]:
        return [f"RayCluster {s.prefix} still runs on the head pool and its volume: "
                f"`kubectl --context={s.kube_context} delete raycluster {s.prefix} {ns} "
                "--wait=true` first"] if out.strip() else []

    return [
        Step("Check the RayCluster is gone",
             s.kubectl("get", "raycluster", s.prefix, ns, "--ignore-not-found", "--output=name"),
             "The RayJob's cluster needs the head node and the run volume the RayCluster holds.",
             check=cluster_gone),
        Step("Submit the RayJob",
             s.kubectl("apply", f"--filename={Path(manifests_dir) / 'job' / 'rayjob.yaml'}"),
             "KubeRay creates a cluster, runs the training command and deletes the cluster "
             "as the job ends (shutdownAfterJobFinishes, ttlSecondsAfterFinished 0: "
             "rayjob_controller.go deletes it at the job's end time plus the TTL); the "
             "submitter Job stays, with the run's log.",
             s.kubectl("delete", "rayjob", f"{s.prefix}-train", ns, "--ignore-not-found")),
    ]


def teardown_plan(plan: list[Step]) -> list[Step]:
    """The teardown twins of a plan's steps, newest first: deletes what it created, the
    namespace (and the run volume's disk with it) first, the cluster last of what costs by the
    hour, then what the cluster left behind (the run volume's disk, found by its labels). An
    undo deletes only what carries the plan's label (a same-named thing made before is kept),
    and its kubectl steps fetch the cluster's credentials first. Run it with run_teardown,
    which runs every step whatever the ones before did."""
    undo = [Step(f"Undo: {step.title}", step.teardown, owner=step.owner, needs=step.needs)
            for step in reversed(plan) if step.teardown is not None]
    left = [Step(f"Delete what is left of: {step.title}", step.leftovers[0],
                 each=step.leftovers[1]) for step in plan if step.leftovers]
    # Notebook 05's dashboard and alert policies (made with DRY_RUN = False) live in the same
    # project and carry the same label; every command of the plan names the project.
    projects = {a.split("=", 1)[1] for step in plan for a in step.argv
                if a.startswith("--project=")}
    return undo + left + [step for project in sorted(projects)
                          for step in dashboard.cleanup_steps(project)]


def _parser():
    import argparse

    parser = argparse.ArgumentParser(prog="distrl gke", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["plan", "create", "teardown", "cost", "render",
                                           "check-telemetry"],
                        help="check-telemetry: after a training run, whether Google Cloud "
                             "refused what the managed collector forwarded")
    parser.add_argument("--resume-from", type=int, default=1, metavar="STEP",
                        help="create: start at this step (the number a failed run printed)")
    parser.add_argument("--project-id", required=True)
    for field in dataclasses.fields(GkeSettings):
        if field.name != "project_id":
            # The actor pool's two fields default to the workload's (GkeSettings.for_workload).
            pool = field.name in ("actor_machine_type", "max_actor_nodes")
            parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default),
                                default=None if pool else field.default,
                                help="default: the workload's" if pool else None)
    parser.add_argument("--manifests-dir", default="runs/gke/manifests")
    parser.add_argument("--auth-token-file", default=str(DEFAULT_TOKEN_FILE),
                        help="the Ray auth token for the cluster (created if missing)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`distrl gke plan|create|teardown|cost ...`: the plan from the command line."""
    parser = _parser()
    args = parser.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(GkeSettings)
              if getattr(args, f.name) is not None}
    try:
        settings = GkeSettings.for_workload(values.pop("workload"), **values)
    except ValueError as e:
        parser.error(str(e))
    if args.action == "cost":
        print(estimate_cost(settings).table())
        print(monthly_costs(settings).table())
        print(f"\none {settings.workload} training:")
        print(estimate_run_cost(settings).table())
        print("\na first run-through: notebook 03's set-up, notebook 04's jobs, one run, teardown:")
        print(estimate_run_through_cost(settings).table())
        return 0
    if args.action == "check-telemetry":
        try:
            run_plan([telemetry_check_step(settings.kube_context)])
        except StepFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    k8s.write_manifests(settings, args.manifests_dir)
    plan = create_plan(settings, args.manifests_dir, args.auth_token_file)
    if args.action in ("render", "plan"):
        if args.action == "plan":
            dry_run(plan)
        return 0
    try:
        check_prerequisites(settings, creating=args.action == "create")
        if args.action == "create":
            ensure_auth_token(args.auth_token_file)
            run_plan(plan, start=args.resume_from)
            print("After the first training run, `distrl gke check-telemetry` with the same "
                  "options reads the managed collector's log for exports Google Cloud refused.")
        else:
            return _teardown_and_inventory(plan, settings.project_id)
    except (PrerequisiteError, StepFailed, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _teardown_and_inventory(plan: list[Step], project: str) -> int:
    """Every undo, then the inventory of what still bills in any location: 1 if an undo failed
    or anything labelled is left (each named, with the command that deletes it)."""
    failed = False
    try:
        run_teardown(teardown_plan(plan))
    except TeardownIncomplete as e:
        print(f"error: {e}", file=sys.stderr)
        failed = True
    try:
        check_nothing_bills(project)
    except StillBilling as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 1 if failed else 0
