"""What the gcloud and kubectl stand-ins accept: every subcommand and flag the series runs, as
their reference pages document them, and nothing else. A command the real tool would refuse is
refused here too, with the real tool's exit code 2: a misspelt flag, a flag of another command,
an unknown subcommand, a value given to a flag that takes none or none given to one that needs
it, too many or too few positional arguments, and, for the flags whose values the plan
generates, a value the real tool or the API would refuse (machine types, accelerators and their
machine series, IAM roles, regions and zones, members, output formats).

Sources, read 2026-12 (gcloud 578.0.0's help, which the reference pages are built from;
kubectl's generated reference):
- gcloud: https://cloud.google.com/sdk/gcloud/reference/<command path with slashes>, e.g.
  .../reference/container/clusters/create; global flags: https://cloud.google.com/sdk/gcloud/reference
- kubectl: https://kubernetes.io/docs/reference/kubectl/generated/kubectl_<command>/, e.g.
  .../kubectl_create/kubectl_create_secret_generic/; global options:
  https://kubernetes.io/docs/reference/kubectl/generated/kubectl_options/
- values: gcloud 578.0.0's source (google-cloud-sdk-unofficial/google-cloud-sdk, lib/
  googlecloudsdk/command_lib/container/flags.py AddAcceleratorArgs, api_lib/container/
  api_adapter.py for gpu-driver-version); GPU types and their machine series:
  https://cloud.google.com/compute/docs/gpus; machine types:
  https://cloud.google.com/compute/docs/general-purpose-machines and
  .../accelerator-optimized-machines#g2-vms; IAM roles:
  https://cloud.google.com/iam/docs/roles-permissions/<service>; regions:
  https://cloud.google.com/compute/docs/regions-zones
"""

from __future__ import annotations

import re

# "These flags are available to all commands" (gcloud reference, GLOBAL FLAGS).
GCLOUD_GLOBAL = {"--access-token-file", "--account", "--billing-project", "--configuration",
                 "--flags-file", "--flatten", "--format", "--help", "--impersonate-service-account",
                 "--log-http", "--project", "--quiet", "--trace-token", "--user-output-enabled",
                 "--verbosity"}
LOCATION = {"--location", "--region", "--zone"}  # one exclusive group on container commands
IAM_BINDING = {"--member", "--role", "--condition", "--condition-from-file"}

GCLOUD = {
    "version": set(),
    "auth list": {"--filter", "--filter-account", "--limit", "--page-size", "--sort-by"},
    "auth print-access-token": {"--lifetime", "--scopes"},
    "org-policies describe": {"--effective", "--folder", "--organization"},
    "projects describe": set(),
    "billing projects describe": set(),
    "services list": {"--available", "--enabled", "--filter", "--limit", "--page-size",
                      "--sort-by"},
    "services enable": {"--async"},
    "compute regions describe": set(),
    "compute project-info describe": set(),
    "container clusters create": LOCATION | {
        "--release-channel", "--addons", "--enable-dataplane-v2", "--machine-type",
        "--num-nodes", "--disk-size", "--workload-pool", "--managed-otel-scope", "--labels",
        "--service-account", "--node-locations", "--scopes", "--async",
        # gcloud 578's flags.AddAutoscalingProfilesFlag and AddEnableImageStreamingFlag
        "--autoscaling-profile", "--enable-image-streaming"},
    # No --workload-pool: Autopilot always has Workload Identity (not a create-auto flag).
    "container clusters create-auto": LOCATION | {
        "--release-channel", "--enable-ray-operator", "--managed-otel-scope", "--labels",
        "--service-account", "--scopes", "--async"},
    # The exclusion flags: gcloud 578's flags.AddMaintenanceExclusionFlags (update only; the
    # until-end-of-support flag since 545.0.0, in the end's mutually exclusive group).
    "container clusters update": LOCATION | {
        "--managed-otel-scope", "--async", "--add-maintenance-exclusion-name",
        "--add-maintenance-exclusion-start", "--add-maintenance-exclusion-end",
        "--add-maintenance-exclusion-until-end-of-support", "--add-maintenance-exclusion-scope",
        "--remove-maintenance-exclusion"},
    "container clusters get-credentials": LOCATION | {"--dns-endpoint", "--internal-ip"},
    "container clusters describe": LOCATION,
    "container clusters delete": LOCATION | {"--async"},
    "container node-pools create": LOCATION | {
        "--cluster", "--machine-type", "--accelerator", "--num-nodes", "--disk-size",
        "--node-labels", "--labels", "--spot", "--enable-autoscaling", "--min-nodes",
        "--max-nodes", "--service-account", "--node-locations", "--node-taints", "--scopes",
        "--location-policy", "--async"},
    "container node-pools describe": LOCATION | {"--cluster"},
    "container node-pools delete": LOCATION | {"--cluster", "--async"},
    "artifacts repositories create": {"--location", "--repository-format", "--labels",
                                      "--description", "--async"},
    "artifacts repositories describe": {"--location"},
    "artifacts repositories delete": {"--location", "--async"},
    "artifacts repositories add-iam-policy-binding": {"--location"} | IAM_BINDING,
    "artifacts repositories remove-iam-policy-binding": {"--location", "--all"} | IAM_BINDING,
    "artifacts docker images describe": {"--metadata-filter", "--show-all-metadata",
                                         "--show-build-details", "--show-deployment",
                                         "--show-image-basis", "--show-package-vulnerability",
                                         "--show-provenance", "--show-sbom-references"},
    "iam service-accounts create": {"--display-name", "--description"},
    "iam service-accounts describe": set(),
    "iam service-accounts delete": set(),
    "iam service-accounts add-iam-policy-binding": IAM_BINDING,
    "iam service-accounts remove-iam-policy-binding": IAM_BINDING | {"--all"},
    "projects add-iam-policy-binding": IAM_BINDING,
    "projects remove-iam-policy-binding": IAM_BINDING | {"--all"},
    "projects get-iam-policy": {"--filter", "--flatten", "--limit", "--page-size", "--sort-by"},
    "storage buckets create": {"--location", "--uniform-bucket-level-access",
                               "--no-uniform-bucket-level-access", "--default-storage-class"},
    "storage buckets describe": {"--additional-headers", "--raw"},
    "storage buckets update": {"--update-labels", "--remove-labels", "--clear-labels",
                               "--labels-file"},
    "compute disks list": {"--filter", "--limit", "--page-size", "--sort-by", "--uri",
                           "--zones", "--regions"},
    "compute disks delete": {"--zone", "--region", "--async"},
    "compute networks list": {"--filter", "--limit", "--page-size", "--sort-by", "--uri",
                              "--regexp"},
    # The teardown's inventory (gke.inventory): each list's own flags and its list flags.
    "container clusters list": LOCATION | {"--filter", "--limit", "--page-size", "--sort-by",
                                           "--uri"},
    "compute instances list": {"--filter", "--limit", "--page-size", "--sort-by", "--uri",
                               "--zones"},
    "compute addresses list": {"--filter", "--limit", "--page-size", "--sort-by", "--uri",
                               "--regions", "--global"},
    "storage buckets list": {"--filter", "--limit", "--page-size", "--sort-by", "--uri",
                             "--raw", "--additional-headers"},
    "artifacts repositories list": {"--location", "--filter", "--limit", "--page-size",
                                    "--sort-by"},
    "storage buckets add-iam-policy-binding": IAM_BINDING,
    "storage buckets remove-iam-policy-binding": IAM_BINDING | {"--all"},
    "storage rm": {"--recursive", "--all-versions", "--continue-on-error"},
    "builds submit": {"--tag", "--config", "--region", "--service-account",
                      "--gcs-source-staging-dir", "--gcs-log-dir", "--timeout",
                      "--default-buckets-behavior", "--machine-type", "--async",
                      "--no-source", "--substitutions", "--ignore-file"},
    "monitoring dashboards create": {"--config", "--config-from-file", "--validate-only"},
    "monitoring policies create": {"--policy", "--policy-from-file"},
    "monitoring dashboards list": {"--filter", "--limit", "--page-size", "--sort-by", "--uri"},
    "monitoring dashboards delete": set(),
    "monitoring policies list": {"--filter", "--limit", "--page-size", "--sort-by", "--uri"},
    "monitoring policies delete": set(),
    "logging read": {"--limit", "--freshness", "--order", "--bucket", "--location", "--view",
                     "--resource-names", "--billing-account", "--folder", "--organization"},
}
# Positional arguments each command takes, (fewest, most), from the synopses: `clusters create
# NAME`, `services enable SERVICE [SERVICE ...]`, `builds submit [SOURCE]`, ...
MANY = 1_000
GCLOUD_POSITIONALS = {
    "version": (0, 0), "auth list": (0, 0), "auth print-access-token": (0, 1),
    "org-policies describe": (1, 1),
    "projects describe": (1, 1),
    "billing projects describe": (1, 1), "services list": (0, 0), "services enable": (1, MANY),
    "compute regions describe": (1, 1), "compute project-info describe": (0, 0),
    "container clusters create": (1, 1), "container clusters create-auto": (1, 1),
    "container clusters update": (1, 1), "container clusters get-credentials": (1, 1),
    "container clusters describe": (1, 1), "container clusters delete": (1, MANY),
    "container node-pools create": (1, 1), "container node-pools describe": (1, 1),
    "container node-pools delete": (1, 1), "artifacts repositories create": (1, 1),
    "artifacts repositories describe": (1, 1), "artifacts repositories delete": (1, 1),
    "artifacts repositories add-iam-policy-binding": (1, 1),
    "artifacts repositories remove-iam-policy-binding": (1, 1),
    "artifacts docker images describe": (1, 1), "iam service-accounts create": (1, 1),
    "iam service-accounts describe": (1, 1), "iam service-accounts delete": (1, 1),
    "iam service-accounts add-iam-policy-binding": (1, 1),
    "iam service-accounts remove-iam-policy-binding": (1, 1),
    "projects add-iam-policy-binding": (1, 1), "projects remove-iam-policy-binding": (1, 1),
    "projects get-iam-policy": (1, 1), "storage buckets create": (1, MANY),
    "storage buckets describe": (1, 1), "storage buckets update": (1, MANY),
    "compute disks list": (0, MANY), "compute disks delete": (1, MANY),
    "container clusters list": (0, 0), "compute instances list": (0, MANY),
    "compute networks list": (0, MANY),
    "compute addresses list": (0, MANY), "storage buckets list": (0, MANY),
    "artifacts repositories list": (0, 0),
    "storage buckets add-iam-policy-binding": (1, 1),
    "storage buckets remove-iam-policy-binding": (1, 1), "storage rm": (1, MANY),
    "builds submit": (0, 1), "monitoring dashboards create": (0, 0),
    "monitoring policies create": (0, 0), "logging read": (0, 1),
    "monitoring dashboards list": (0, 0), "monitoring dashboards delete": (1, 1),
    "monitoring policies list": (0, 0), "monitoring policies delete": (1, 1),
}
# Flags that take no value (store_true in gcloud's source: `--spot=true` is refused).
GCLOUD_BOOLEAN = {"--help", "--quiet", "--log-http", "--user-output-enabled", "--available",
                  "--enabled", "--async", "--enable-dataplane-v2", "--spot",
                  "--enable-autoscaling", "--internal-ip", "--dns-endpoint", "--all",
                  "--uniform-bucket-level-access", "--no-uniform-bucket-level-access", "--raw",
                  "--show-all-metadata", "--show-build-details", "--show-deployment",
                  "--show-image-basis", "--show-package-vulnerability", "--show-provenance",
                  "--show-sbom-references", "--recursive", "--all-versions",
                  "--continue-on-error", "--no-source", "--validate-only",
                  "--add-maintenance-exclusion-until-end-of-support", "--enable-image-streaming",
                  "--global", "--effective"}

# Values the reference pages enumerate, for the flags the series sets.
GCLOUD_CHOICES = {
    "--release-channel": {"None", "extended", "rapid", "regular", "stable"},
    "--managed-otel-scope": {"COLLECTION_AND_INSTRUMENTATION_COMPONENTS", "NONE"},
    "--autoscaling-profile": {"optimize-utilization", "balanced"},
    "--add-maintenance-exclusion-scope": {"no_upgrades", "no_minor_upgrades",
                                          "no_minor_or_node_upgrades"},
    "--repository-format": {"apt", "docker", "generic", "go", "kfp", "maven", "npm", "python",
                            "yum"},
    "--verbosity": {"debug", "info", "warning", "error", "critical", "none"},
}

# "Print the list of flags inherited by all commands" (kubectl_options).
KUBECTL_GLOBAL = {"--context", "--namespace", "-n", "--kubeconfig", "--cluster", "--user",
                  "--server", "-s", "--request-timeout", "--as", "--as-group", "--as-uid",
                  "--cache-dir", "--certificate-authority", "--client-certificate",
                  "--client-key", "--insecure-skip-tls-verify", "--tls-server-name", "--token",
                  "--username", "--password", "--disable-compression", "--match-server-version",
                  "--warnings-as-errors"}
KUBECTL = {
    "apply": {"--filename", "-f", "--recursive", "-R", "--server-side", "--force-conflicts",
              "--field-manager", "--dry-run", "--output", "-o", "--wait", "--prune",
              "--selector", "-l"},
    "delete": {"--filename", "-f", "--recursive", "-R", "--ignore-not-found", "--wait",
               "--all", "--all-namespaces", "-A", "--grace-period", "--now", "--force",
               "--timeout", "--selector", "-l"},
    "create secret generic": {"--from-file", "--from-literal", "--from-env-file", "--type",
                              "--dry-run", "--output", "-o", "--save-config"},
    "get": {"--all-namespaces", "-A", "--output", "-o", "--selector", "-l",
            "--ignore-not-found", "--watch", "-w", "--field-selector"},
    "describe": {"--selector", "-l", "--all-namespaces", "-A", "--show-events"},
    "wait": {"--for", "--timeout", "--selector", "-l", "--all", "--all-namespaces", "-A",
             "--field-selector"},
    "exec": {"--container", "-c", "--stdin", "-i", "--tty", "-t", "--quiet", "-q",
             "--pod-running-timeout"},
    "logs": {"--selector", "-l", "--tail", "--since", "--all-containers", "--container", "-c",
             "--follow", "-f", "--previous", "-p", "--prefix", "--since-time", "--timestamps",
             "--max-log-requests", "--all-pods"},
    "port-forward": {"--address", "--pod-running-timeout"},
    "config current-context": set(),
    "config get-contexts": {"--output", "-o", "--no-headers"},
}

KUBECTL_POSITIONALS = {
    "apply": (0, 0), "delete": (0, MANY), "create secret generic": (1, 1), "get": (1, MANY),
    "describe": (1, MANY), "wait": (0, MANY), "exec": (1, 1), "logs": (0, 1),
    "port-forward": (2, MANY), "config current-context": (0, 0), "config get-contexts": (0, 1),
}
# kubectl's boolean flags take no value or `=true`/`=false` (pflag's NoOptDefVal).
KUBECTL_BOOLEAN = {"--recursive", "-R", "--server-side", "--force-conflicts", "--wait",
                   "--prune", "--ignore-not-found", "--all", "--all-namespaces", "-A", "--now",
                   "--force", "--save-config", "--watch", "-w", "--show-events", "--stdin", "-i",
                   "--tty", "-t", "--quiet", "-q", "--all-containers", "--follow", "-f",
                   "--previous", "-p", "--prefix", "--timestamps", "--all-pods", "--no-headers",
                   "--insecure-skip-tls-verify", "--disable-compression",
                   "--match-server-version", "--warnings-as-errors"}
KUBECTL_OUTPUT = re.compile(r"(json|yaml|wide|name|jsonpath=.+|jsonpath-as-json=.+|"
                            r"custom-columns=.+|go-template=.+)$")

# Compute Engine's predefined machine types (the machine families pages): series -> sizes.
MACHINE_SIZES = {"e2-standard": (2, 4, 8, 16, 32), "e2-highmem": (2, 4, 8, 16),
                 "e2-highcpu": (2, 4, 8, 16, 32), "n1-standard": (1, 2, 4, 8, 16, 32, 64, 96),
                 "n2-standard": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
                 "g2-standard": (4, 8, 12, 16, 24, 32, 48, 96)}
MACHINE_TYPES = {f"{series}-{n}" for series, sizes in MACHINE_SIZES.items() for n in sizes} | {
    "e2-micro", "e2-small", "e2-medium"}
# Cloud Build's own workers (`gcloud builds submit --machine-type`).
BUILD_MACHINE_TYPES = {"e2-highcpu-8", "e2-highcpu-32", "e2-medium", "n1-highcpu-8",
                       "n1-highcpu-32"}
# GPU type -> the machine series it runs on (Compute Engine's GPU page): an L4 only on G2, the
# older GPUs attached to N1.
GPU_SERIES = {"nvidia-l4": "g2", "nvidia-tesla-t4": "n1", "nvidia-tesla-v100": "n1",
              "nvidia-tesla-p100": "n1", "nvidia-tesla-p4": "n1", "nvidia-tesla-a100": "a2",
              "nvidia-a100-80gb": "a2", "nvidia-h100-80gb": "a3", "nvidia-h100-mega-80gb": "a3",
              "nvidia-h200-141gb": "a3", "nvidia-b200": "a4"}
# G2 machines come with their L4s: how many each size has.
G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 24: 2, 32: 1, 48: 4, 96: 8}
ACCELERATOR_KEYS = {"type", "count", "gpu-driver-version", "gpu-partition-size",
                    "gpu-sharing-strategy", "max-shared-clients-per-gpu"}
# The predefined roles the plan grants (each on its service's roles-permissions page).
ROLES = {"roles/storage.admin", "roles/artifactregistry.writer", "roles/artifactregistry.reader",
         "roles/logging.logWriter", "roles/container.defaultNodeServiceAccount",
         "roles/monitoring.metricWriter", "roles/cloudtrace.agent",
         "roles/telemetry.metricsWriter", "roles/iam.workloadIdentityUser",
         "roles/serviceusage.serviceUsageConsumer"}
REGIONS = {
    "africa-south1", "asia-east1", "asia-east2", "asia-northeast1", "asia-northeast2",
    "asia-northeast3", "asia-south1", "asia-south2", "asia-southeast1", "asia-southeast2",
    "asia-southeast3", "australia-southeast1", "australia-southeast2", "europe-central2",
    "europe-north1", "europe-north2", "europe-southwest1", "europe-west1", "europe-west2",
    "europe-west3", "europe-west4", "europe-west6", "europe-west8", "europe-west9",
    "europe-west10", "europe-west12", "me-central1", "me-central2", "me-west1",
    "northamerica-northeast1", "northamerica-northeast2", "northamerica-south1",
    "southamerica-east1", "southamerica-west1", "us-central1", "us-east1", "us-east4",
    "us-east5", "us-south1", "us-west1", "us-west2", "us-west3", "us-west4"}
MEMBER = re.compile(r"(user|serviceAccount|group|domain):\S+$|principal(Set)?://\S+$")

TOOLS = {"gcloud": (GCLOUD, GCLOUD_GLOBAL, GCLOUD_POSITIONALS, GCLOUD_BOOLEAN),
         "kubectl": (KUBECTL, KUBECTL_GLOBAL, KUBECTL_POSITIONALS, KUBECTL_BOOLEAN)}


def refusal(tool: str, argv: list[str]) -> str | None:
    """Why the real `tool` would refuse argv (its usage error, in its words), or None if every
    subcommand, flag, value and positional argument is one its reference accepts."""
    if tool not in TOOLS:
        return None
    commands, global_flags, positionals, boolean = TOOLS[tool]
    before_dashes = argv[:argv.index("--")] if "--" in argv else argv  # kubectl exec ... -- cmd
    flags, words, i = [], [], 0
    while i < len(before_dashes):
        arg = before_dashes[i]
        if arg.startswith("-"):
            flag, explicit, value = arg.partition("=")
            if not explicit and flag not in boolean and i + 1 < len(before_dashes):
                value, i = before_dashes[i + 1], i + 1  # `--flag value`
            flags.append((arg, flag, bool(explicit), value))
        else:
            words.append(arg)
        i += 1
    command = next((" ".join(words[:n]) for n in range(len(words), 0, -1)
                    if " ".join(words[:n]) in commands), None)
    if command is None:
        return f"ERROR: ({tool}) Invalid choice: '{' '.join(words[:3])}'."
    where = f"{tool}.{command.replace(' ', '.')}"
    allowed = commands[command] | global_flags
    values = {}
    for arg, flag, explicit, value in flags:
        if flag not in allowed:
            return f"ERROR: ({where}) unrecognized arguments: {arg}"
        if flag in boolean and explicit and (tool == "gcloud" or value not in ("true", "false")):
            return f"ERROR: ({where}) argument {flag}: ignored explicit argument '{value}'"
        if flag not in boolean and not value:
            return f"ERROR: ({where}) argument {flag}: expected one argument"
        values[flag] = value
        why = _bad_value(tool, command, flag, value)
        if why:
            return f"ERROR: ({where}) argument {flag}: {why}"
    fewest, most = positionals[command]
    given = words[len(command.split()):]
    if len(given) < fewest:
        return f"ERROR: ({where}) argument {fewest - len(given)} positional argument(s) required"
    if len(given) > most:
        return f"ERROR: ({where}) unrecognized arguments: {' '.join(given[most:])}"
    return _bad_combination(command, values)


def _bad_value(tool: str, command: str, flag: str, value: str) -> str | None:
    if tool == "kubectl":
        if flag in ("--output", "-o") and not KUBECTL_OUTPUT.match(value):
            return f"unable to match a printer suitable for the output format '{value}'"
        return None
    choices = GCLOUD_CHOICES.get(flag)
    if choices and value not in choices:
        return f"Invalid choice: '{value}'. Valid choices are [{', '.join(sorted(choices))}]."
    if flag == "--machine-type":
        known = BUILD_MACHINE_TYPES if command == "builds submit" else MACHINE_TYPES
        if value not in known:
            return f"Invalid value for [--machine-type]: machine type '{value}' does not exist"
    if flag == "--accelerator":
        return _bad_accelerator(value)
    if flag == "--role" and value not in ROLES:
        return f"INVALID_ARGUMENT: Role {value} is not supported for this resource"
    if flag == "--member" and not MEMBER.match(value):
        return f"Invalid member '{value}': expected TYPE:NAME (user:, serviceAccount:, group:...)"
    if flag == "--region" and value not in REGIONS:
        return f"Invalid region '{value}'"
    if flag == "--zone" and not _zone(value):
        return f"Invalid zone '{value}'"
    # `artifacts repositories list --location=all`: every location (its reference page).
    if flag == "--location" and command == "artifacts repositories list" and value == "all":
        return None
    if flag == "--location" and not (value in REGIONS or _zone(value)):
        return f"Invalid location '{value}'"
    return None


def _zone(value: str) -> bool:
    region, _, letter = value.rpartition("-")
    return region in REGIONS and len(letter) == 1 and letter.isalpha() and letter.islower()


def _bad_accelerator(value: str) -> str | None:
    pairs = [part.partition("=") for part in value.split(",")]
    keys = {key for key, _, _ in pairs}
    if any(not eq for _, eq, _ in pairs) or keys - ACCELERATOR_KEYS or "type" not in keys:
        return (f"Bad syntax for dict arg: [{value}]: expected type=TYPE[,count=COUNT,"
                f"gpu-driver-version=...], keys among {sorted(ACCELERATOR_KEYS)}")
    spec = {key: v for key, _, v in pairs}
    if spec["type"] not in GPU_SERIES:
        return f"Accelerator type '{spec['type']}' does not exist"
    if not spec.get("count", "1").isdigit() or int(spec.get("count", "1")) < 1:
        return f"count={spec['count']}: expected a whole number of GPUs"
    if spec.get("gpu-driver-version", "default").lower() not in ("default", "latest", "disabled"):
        return (f"Invalid gpu driver version [{spec['gpu-driver-version']}] for argument "
                "--accelerator. Valid values are default, latest, or disabled")
    return None


def _bad_combination(command: str, values: dict) -> str | None:
    """What the API refuses across flags: a GPU on a machine series it does not attach to, or
    another count than a G2 machine comes with."""
    machine, accelerator = values.get("--machine-type"), values.get("--accelerator")
    if not (machine and accelerator) or command == "builds submit":
        return None
    spec = dict(part.partition("=")[::2] for part in accelerator.split(","))
    series = GPU_SERIES[spec["type"]]
    if not machine.startswith(f"{series}-"):
        return (f"ERROR: (gcloud) INVALID_ARGUMENT: accelerator {spec['type']} is not "
                f"available on machine type {machine} (it runs on {series} machines)")
    count = int(spec.get("count", "1"))
    if series == "g2" and G2_GPUS[int(machine.rsplit("-", 1)[1])] != count:
        return (f"ERROR: (gcloud) INVALID_ARGUMENT: {machine} comes with "
                f"{G2_GPUS[int(machine.rsplit('-', 1)[1])]} nvidia-l4, not count={count}")
    return None
