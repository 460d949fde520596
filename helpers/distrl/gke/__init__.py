"""A GKE cluster for Ape-X (notebook 03): its settings (settings, the bottom: it imports no other
module here), the Kubernetes manifests (manifests), what it costs (cost), the checks before and
during creation (preflight), the gcloud/kubectl plan (create) and the plan runner (runner)."""
