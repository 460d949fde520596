"""What still bills after a teardown: every resource that carries distrl's label (app=distrl) in
the project, in every location, whatever prefix, zone or mode made it (and notebook 05's
dashboard and alert policies).

    left = still_billing("my-project")   # [] when nothing of distrl's is left
    check_nothing_bills("my-project")    # raises StillBilling naming each, and how to delete it

A teardown deletes what its own settings name. Given another ZONE (a cluster made elsewhere
after a stockout), PREFIX or MODE, its deletes find nothing and count as done while the real
cluster bills; this inventory is what proves otherwise. Each list command covers every
location when none is given: `container clusters list` ("queries cluster across all locations
unless ... specified", cloud.google.com/sdk/gcloud/reference/container/clusters/list), the
compute lists (every zone and region unless --zones/--regions), `artifacts repositories list
--location=all` (.../reference/artifacts/repositories/list) and `storage buckets list` (the
project's buckets). GKE puts a cluster's labels on the VMs and disks it makes
(cloud.google.com/kubernetes-engine/docs/how-to/creating-managing-labels), so a node or a run
volume's disk left behind is found by the same label.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from distrl.gke.runner import capture_all

LABEL = "app=distrl"  # GkeSettings.labels: every resource the plan makes carries it

# (kind, the list command after `gcloud`, the filter's label key): each prints one resource a
# line, tab-separated: name, location, prefix label.
LISTS = (
    ("cluster", ("container", "clusters", "list",
                 "--format=value(name,location,resourceLabels.distrl-prefix)"), "resourceLabels"),
    ("VM", ("compute", "instances", "list",
            "--format=value(name,zone.basename(),labels.distrl-prefix)"), "labels"),
    ("disk", ("compute", "disks", "list",  # a regional disk has no zone: its location shows ?
              "--format=value(name,zone.basename(),labels.distrl-prefix)"), "labels"),
    ("address", ("compute", "addresses", "list",
                 "--format=value(name,region.basename(),labels.distrl-prefix)"), "labels"),
    ("bucket", ("storage", "buckets", "list",
                "--format=value(name,location,labels.distrl-prefix)"), "labels"),
    ("repository", ("artifacts", "repositories", "list", "--location=all",
                    "--format=value(name,name.segment(3),labels.distrl-prefix)"), "labels"),
    # Notebook 05's, made with DRY_RUN = False (otel.dashboard.LABELS): global, no prefix.
    ("dashboard", ("monitoring", "dashboards", "list", "--format=value(name)"), "labels"),
    ("alert policy", ("monitoring", "policies", "list", "--format=value(name)"), "userLabels"),
)
GLOBAL = {"dashboard", "alert policy"}  # no location to name
# A list refused because its API is off in the project: nothing of that kind can bill there.
API_OFF = re.compile(r"SERVICE_DISABLED|has not been used in project|is disabled", re.IGNORECASE)


@dataclass(frozen=True)
class Billing:
    """One labelled resource that still exists, and the command that deletes it."""

    kind: str
    name: str
    location: str
    prefix: str
    project: str

    def delete_command(self) -> str:
        p = f"--project={self.project}"
        if self.kind == "cluster":  # the plan's own teardown, with the settings that made it
            where = (f"--mode autopilot --region {self.location}" if _is_region(self.location)
                     else f"--mode standard --zone {self.location} "
                          f"--region {self.location.rsplit('-', 1)[0]}")
            return (f"distrl gke teardown --project-id {self.project} "
                    f"--prefix {self.prefix or '?'} {where}")
        argv = {
            "VM": ("gcloud", "compute", "instances", "delete", self.name,
                   f"--zone={self.location}", p, "--quiet"),
            "disk": ("gcloud", "compute", "disks", "delete", self.name,
                     f"--{'region' if _is_region(self.location) else 'zone'}={self.location}",
                     p, "--quiet"),
            "address": ("gcloud", "compute", "addresses", "delete", self.name,
                        f"--region={self.location}", p, "--quiet"),
            "bucket": ("gcloud", "storage", "rm", "--recursive", f"gs://{self.name}", p),
            "repository": ("gcloud", "artifacts", "repositories", "delete",
                           self.name.rsplit("/", 1)[-1], f"--location={self.location}", p,
                           "--quiet"),
            "dashboard": ("gcloud", "monitoring", "dashboards", "delete", self.name, p, "--quiet"),
            "alert policy": ("gcloud", "monitoring", "policies", "delete", self.name, p,
                             "--quiet"),
        }[self.kind]
        return shlex.join(argv)

    def __str__(self) -> str:
        made = f", prefix {self.prefix}" if self.prefix else ""
        where = f" in {self.location or '?'}" if self.kind not in GLOBAL else ""
        return f"{self.kind} {self.name.rsplit('/', 1)[-1]}{where}{made}"


def _is_region(location: str) -> bool:
    """us-central1 is a region, us-central1-a a zone."""
    return re.fullmatch(r"[a-z]+-[a-z]+\d+", location) is not None


class StillBilling(RuntimeError):
    """Labelled resources left after a teardown (or kinds that could not be listed)."""

    def __init__(self, project: str, left: list[Billing], unlisted: list[str]):
        self.left, self.unlisted = left, unlisted
        lines = [f"  - {b}: {b.delete_command()}" for b in left]
        lines += [f"  - could not list {what}" for what in unlisted]
        said = []
        if left:
            said.append(f"{len(left)} thing(s) labelled {LABEL} still exist in project "
                        f"{project} and bill (made with other settings than this teardown's: "
                        "another ZONE, PREFIX or MODE?)")
        if unlisted:
            said.append(f"{len(unlisted)} kind(s) could not be listed, so the inventory cannot "
                        "say that nothing bills")
        super().__init__("after the teardown, " + "; and ".join(said) + ":\n" + "\n".join(lines))


def inventory_commands(project: str) -> list[tuple[str, tuple[str, ...]]]:
    """(kind, command) of each list the inventory runs."""
    return [(kind, ("gcloud", *argv, f"--filter={key}.{LABEL}", f"--project={project}"))
            for kind, argv, key in LISTS]


def still_billing(project: str, timeout_s: float = 120.0) -> tuple[list[Billing], list[str]]:
    """Every labelled resource in the project, and the kinds whose list failed (with why)."""
    left, unlisted = [], []
    for kind, command in inventory_commands(project):
        code, out, err = capture_all(command, timeout_s)
        if code != 0:
            if not API_OFF.search(err):
                said = (err.strip().splitlines() or [f"exit code {code}"])[-1]
                unlisted.append(f"{kind}s (`{shlex.join(command)}`: {said})")
            continue
        for line in out.splitlines():
            if line.strip():
                name, location, prefix = (line.split("\t") + ["", ""])[:3]
                left.append(Billing(kind, name.strip(), location.strip(), prefix.strip(),
                                    project))
    return left, unlisted


def check_nothing_bills(project: str, out=print, timeout_s: float = 120.0) -> None:
    """Print what the inventory found; StillBilling if anything of distrl's is left."""
    left, unlisted = still_billing(project, timeout_s)
    if left or unlisted:
        raise StillBilling(project, left, unlisted)
    out(f"inventory: nothing labelled {LABEL} is left in project {project}, in any location")
