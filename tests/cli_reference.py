"""What the gcloud and kubectl stand-ins accept: every subcommand and flag the series runs, as
their reference pages document them, and nothing else. A command the real tool would refuse
(a misspelt flag, a flag of another command, an unknown subcommand) is refused here too, with
the real tool's exit code 2.

Sources, read 2026-12 (gcloud 578.0.0's help, which the reference pages are built from;
kubectl's generated reference):
- gcloud: https://cloud.google.com/sdk/gcloud/reference/<command path with slashes>, e.g.
  .../reference/container/clusters/create; global flags: https://cloud.google.com/sdk/gcloud/reference
- kubectl: https://kubernetes.io/docs/reference/kubectl/generated/kubectl_<command>/, e.g.
  .../kubectl_create/kubectl_create_secret_generic/; global options:
  https://kubernetes.io/docs/reference/kubectl/generated/kubectl_options/
"""

from __future__ import annotations

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
        "--service-account", "--node-locations", "--scopes", "--async"},
    # No --workload-pool: Autopilot always has Workload Identity (not a create-auto flag).
    "container clusters create-auto": LOCATION | {
        "--release-channel", "--enable-ray-operator", "--managed-otel-scope", "--labels",
        "--service-account", "--scopes", "--async"},
    "container clusters update": LOCATION | {"--managed-otel-scope", "--async"},
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
    "storage buckets add-iam-policy-binding": IAM_BINDING,
    "storage buckets remove-iam-policy-binding": IAM_BINDING | {"--all"},
    "storage rm": {"--recursive", "--all-versions", "--continue-on-error"},
    "builds submit": {"--tag", "--config", "--region", "--service-account",
                      "--gcs-source-staging-dir", "--gcs-log-dir", "--timeout",
                      "--default-buckets-behavior", "--machine-type", "--async",
                      "--no-source", "--substitutions", "--ignore-file"},
    "monitoring dashboards create": {"--config", "--config-from-file", "--validate-only"},
    "monitoring policies create": {"--policy", "--policy-from-file"},
    "logging read": {"--limit", "--freshness", "--order", "--bucket", "--location", "--view",
                     "--resource-names", "--billing-account", "--folder", "--organization"},
}
# Values the reference pages enumerate, for the flags the series sets.
GCLOUD_CHOICES = {
    "--release-channel": {"None", "extended", "rapid", "regular", "stable"},
    "--managed-otel-scope": {"COLLECTION_AND_INSTRUMENTATION_COMPONENTS", "NONE"},
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

TOOLS = {"gcloud": (GCLOUD, GCLOUD_GLOBAL), "kubectl": (KUBECTL, KUBECTL_GLOBAL)}


def refusal(tool: str, argv: list[str]) -> str | None:
    """Why the real `tool` would refuse argv (its usage error, in its words), or None if every
    subcommand and flag is one its reference documents."""
    if tool not in TOOLS:
        return None
    commands, global_flags = TOOLS[tool]
    before_dashes = argv[:argv.index("--")] if "--" in argv else argv  # kubectl exec ... -- cmd
    words = [a for a in before_dashes if not a.startswith("-")]
    command = next((" ".join(words[:n]) for n in range(len(words), 0, -1)
                    if " ".join(words[:n]) in commands), None)
    if command is None:
        return f"ERROR: ({tool}) Invalid choice: '{' '.join(words[:3])}'."
    allowed = commands[command] | global_flags
    for arg in before_dashes:
        if not arg.startswith("-"):
            continue
        flag, _, value = arg.partition("=")
        if flag not in allowed:
            return (f"ERROR: ({tool}.{command.replace(' ', '.')}) unrecognized arguments: "
                    f"{arg}")
        choices = GCLOUD_CHOICES.get(flag) if tool == "gcloud" else None
        if choices and value and value not in choices:
            return (f"ERROR: ({tool}.{command.replace(' ', '.')}) argument {flag}: Invalid "
                    f"choice: '{value}'. Valid choices are [{', '.join(sorted(choices))}].")
    return None
