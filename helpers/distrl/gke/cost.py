"""What the GKE cluster costs: per hour while it exists, and per month for what runs beside it.

    estimate_cost(settings).table()      # nodes, boot disks, fee and the free tier's credit
    monthly_costs(settings).table()      # metric samples, spans, builds, images, run volume,
                                         # alerting conditions

Prices come from a table (PRICES, or your own JSON with the same keys): list prices of a
dated source and one region, approximate. Spot prices move (PRICES' comments say how much);
pass your own table when the number matters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from distrl.cluster.jobs import PONG_SMOKE_SECONDS
from distrl.gke.manifests import JOB_CLOSE_S, RUNS_VOLUME_GB, num_actors, pod_sizes
from distrl.gke.settings import (
    BUILD_MINUTES,
    DISK_GB,
    NODE_READY_S,
    NODE_UNNEEDED_S,
    SYSTEM_MACHINE,
    WORKLOADS,
    machine,
)

PRICES = {
    "date": "2026-08-20 (machines), 2026-11 (the rest)",
    "source": "machines: the Cloud Billing Catalog via github.com/Cyclenerd/google-cloud-"
              "pricing-cost-calculator; the rest: cloud.google.com's pricing pages; us-central1 "
              "list prices (approximate; Spot prices move)",
    "currency": "USD",
    "cluster_fee": 0.10,
    # "$74.40 in monthly credits per billing account ... applied to zonal and Autopilot
    # clusters" (cloud.google.com/kubernetes-engine/pricing): 744 h x 0.10, the fee of one
    # cluster; nodes, disks and a regional cluster's fee are not covered.
    "free_tier_credit_per_month": 74.40,
    # Per node: on-demand, Spot (shapes: settings.MACHINES). us-central1's `hour` and
    # `hour_spot` in pricing.yml at commit dac3128 of Cyclenerd/google-cloud-pricing-cost-
    # calculator (generated 2026-08-20 from the Cloud Billing Catalog). Its on-demand prices are
    # this table's earlier ones; its Spot prices are about twice them (e2-standard-8: $0.1608,
    # was $0.080 here). n2-standard-32 was not read there: its Spot price is the n2-standard-8
    # one times four, as the catalog prices vCPUs and memory linearly within a series.
    "machines": {
        "e2-standard-4": [0.134, 0.080424],
        "e2-standard-8": [0.268, 0.160848],
        "e2-standard-16": [0.536, 0.321696],
        "e2-standard-32": [1.072, 0.643392],
        "n2-standard-8": [0.389, 0.222944],
        "n2-standard-32": [1.554, 0.891776],
        "n1-standard-8": [0.380, 0.17836],
        "g2-standard-8": [0.854, 0.512012],  # includes its L4
    },
    # Per attached GPU: on-demand, Spot (the L4 is in g2's price); pricing.yml has no GPU of its
    # own, so these stay the 2026-11 figures of cloud.google.com/compute/gpus-pricing.
    "gpus": {
        "nvidia-l4": [0.0, 0.0],
        "nvidia-tesla-t4": [0.350, 0.140],
        "nvidia-tesla-p4": [0.600, 0.240],
    },
    "autopilot": {  # per vCPU-hour and GiB-hour of pod requests: on-demand, spot
        "vcpu": [0.0445, 0.0133],
        "memory_gib": [0.0049225, 0.0014767],
        "gpu": {"nvidia-l4": [0.5600, 0.2240], "nvidia-tesla-t4": [0.3500, 0.1400],
                "nvidia-tesla-p4": [0.6000, 0.2400]},
    },
    # The highest E2 Spot rates seen, per vCPU-hour and GiB-hour (us-central1): a run's estimate
    # goes up to them where they are above the machines' Spot column (spot_drift). Spot prices
    # move: Google's pages say up to once every 30 days (cloud.google.com/skus), and the
    # catalog's E2 Spot prices above are twice this table's earlier ones. The highest seen are
    # those of 2026-08-20: these rates give the E2 column exactly (8 x 0.01309 + 32 x 0.001754
    # = 0.160848 for e2-standard-8), so a run's estimate has no drift line until a table with
    # higher rates is passed.
    "e2_spot_high": {"vcpu": 0.01309, "memory_gib": 0.001754},
    # An external IPv4 address per node (Standard nodes get one unless the cluster has private
    # nodes), per hour: a standard VM's, a Spot VM's (cloud.google.com/vpc/network-pricing, as a
    # third-party copy dated 2026-10-16 quotes it; not read first-hand here).
    "external_ip": [0.005, 0.0025],
    "pd_balanced_gb_month": 0.10,
    # Managed Service for Prometheus bills samples ingested (cloud.google.com/stackdriver/docs/
    # managed-prometheus/cost-controls); OTLP metrics land there (docs/reference/telemetry/
    # v1.metrics). First tier of cloud.google.com/products/observability/pricing.
    "metric_samples_per_million": 0.06,
    "spans_per_million": 0.20,
    "free_spans_per_month": 2.5e6,
    # cloud.google.com/build/pricing: e2-standard-2 (gcloud's default) per build-minute, and the
    # free build-minutes per billing account and month.
    "build_minute": 0.006,
    "free_build_minutes": 2500,
    # cloud.google.com/artifact-registry/pricing: storage per GB-month after 0.5 GB free.
    "registry_gb_month": 0.10,
    "free_registry_gb": 0.5,
    # Alerting: Google has announced per-condition charges and postponed them more than once
    # (cloud.google.com/products/observability/pricing): this is the announced per-condition
    # price, an upper bound until the page shows it in force.
    "alert_condition_month": 1.50,
}
HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class CostLine:
    item: str
    count_min: float
    count_max: float
    unit_price: float

    @property
    def minimum(self) -> float:
        return self.count_min * self.unit_price

    @property
    def maximum(self) -> float:
        return self.count_max * self.unit_price


@dataclass(frozen=True)
class CostEstimate:
    lines: list[CostLine]
    currency: str
    date: str
    source: str
    per: str = "hour"

    @property
    def min_per_hour(self) -> float:
        return sum(line.minimum for line in self.lines)

    @property
    def max_per_hour(self) -> float:
        return sum(line.maximum for line in self.lines)

    def table(self) -> str:
        rows = [f"{'item':<60} {'count':>9} {'each':>8} {'max':>8}"]
        for line in self.lines:
            count = (f"{line.count_max:.3g}" if line.count_min == line.count_max
                     else f"{line.count_min:.3g}-{line.count_max:.3g}")
            rows.append(f"{line.item:<60} {count:>9} {line.unit_price:>8.3f} "
                        f"{line.maximum:>8.2f}")
        rows.append(f"about {self.min_per_hour:.2f}-{self.max_per_hour:.2f} {self.currency} per "
                    f"{self.per}; prices of {self.date}, {self.source}")
        return "\n".join(rows)


def _load(prices) -> dict:
    if not isinstance(prices, dict):
        prices = json.loads(Path(prices).read_text())
    missing = [k for k in PRICES if k not in prices]
    if missing:
        raise ValueError(f"price table lacks {', '.join(missing)}; see distrl.gke.cost.PRICES")
    return prices


def estimate_cost(settings, prices: dict | str | Path = PRICES) -> CostEstimate:
    """Cost per hour of the cluster the plan creates: from idle (no actor node) to every actor
    node busy. Includes the nodes' boot disks and the free tier's credit for the fee."""
    prices = _load(prices)
    s = settings
    fee = prices["cluster_fee"]
    lines = [CostLine("GKE cluster management fee", 1, 1, fee),
             CostLine("GKE free tier credit (one zonal or Autopilot cluster)", 1, 1,
                      -min(fee, prices["free_tier_credit_per_month"] / HOURS_PER_MONTH))]
    disk = DISK_GB * prices["pd_balanced_gb_month"] / HOURS_PER_MONTH
    if s.mode == "standard":
        on_demand, spot = 0, 1
        lines.append(CostLine(f"system node {SYSTEM_MACHINE} (on-demand)", 1, 1,
                              prices["machines"][SYSTEM_MACHINE][on_demand]))
        head = prices["machines"][s.head_machine_type][on_demand]
        gpu = "" if s.gpu_type == "none" else f" + {s.gpu_type}"
        if s.gpu_type != "none":
            head += prices["gpus"][s.gpu_type][0]
        lines.append(CostLine(f"head node {s.head_machine_type}{gpu} (on-demand)", 1, 1, head))
        lines.append(CostLine(f"actor nodes {s.actor_machine_type} (Spot)", 0, s.max_actor_nodes,
                              prices["machines"][s.actor_machine_type][spot]))
        lines.append(CostLine(f"boot disks, {DISK_GB} GB pd-balanced each", 2,
                              2 + s.max_actor_nodes, disk))
        on_demand_ip, spot_ip = prices["external_ip"]
        lines.append(CostLine("external IPv4 addresses: system and head nodes", 2, 2,
                              on_demand_ip))
        lines.append(CostLine("external IPv4 addresses: actor nodes (Spot)", 0,
                              s.max_actor_nodes, spot_ip))
    else:
        ap = prices["autopilot"]
        sizes = pod_sizes(s)

        def pod_price(size, spot: bool) -> float:
            k = 1 if spot else 0
            return size.cpu * ap["vcpu"][k] + size.memory_gib * ap["memory_gib"][k]

        head = pod_price(sizes["head"], spot=False)
        if s.gpu_type != "none":
            head += ap["gpu"][s.gpu_type][0]
        lines.append(CostLine("head pod (Autopilot, on-demand)", 1, 1, head))
        lines.append(CostLine("actor pods (Autopilot Spot)", 0, s.max_actor_nodes,
                              pod_price(sizes["actor"], spot=True)))
    return CostEstimate(lines, prices["currency"], prices["date"], prices["source"])


def estimate_run_cost(settings, prices: dict | str | Path = PRICES,
                      export_interval_s: float = 30.0) -> CostEstimate:
    """What one run of the settings' workload costs (WORKLOADS: its --max-seconds budget): the
    cluster's hourly cost times its hours, from every actor node missing (Spot capacity that
    never came) to all of them there throughout at the highest Spot price seen; the Spot
    nodes' tails, which bill outside the budget (tail_lines); and the telemetry the run sends
    (samples and spans, from none of the month's free spans left to all of them). The run ends
    sooner where it reaches its target; the cluster costs its hourly rate until you delete it."""
    prices = _load(prices)
    s, hourly = settings, estimate_cost(settings, prices)
    hours = WORKLOADS[s.workload].run_hours
    span = f"{hours:g} h" if hours >= 1 else f"{hours * 60:.0f} min"
    lines = [CostLine(f"{line.item}, {span}", line.count_min, line.count_max,
                      line.unit_price * hours) for line in hourly.lines]
    if s.mode == "standard":
        drift = spot_drift(s, prices)
        if drift > 0:
            i = next(i for i, line in enumerate(lines) if line.item.startswith("actor nodes"))
            lines.insert(i + 1, CostLine(f"Spot price drift, up to the highest seen, {span}",
                                         0, s.max_actor_nodes, drift * hours))
    lines += tail_lines(s, prices)
    lines += telemetry_lines(s, hours, export_interval_s, prices)
    return CostEstimate(lines, hourly.currency, hourly.date, hourly.source,
                        per=f"{s.workload} run of at most {span}")


# A first run-through holds the cluster longer than its run: notebook 03's set-up, notebook 04's
# demonstration jobs on it, and the teardown. The jobs' budgets are notebook 04's defaults on
# GKE (MAX_SECONDS, RESUME_MAX_SECONDS, the Pong smoke's; no twin from zero unless
# COMPARE_FROM_ZERO), each longer there by NODE_READY_S for its Spot nodes; a test reads them
# from the notebook. Google gives no duration for a cluster's or a pool's create or delete: the
# set-up and teardown times are assumptions, named as such wherever they print.
DEMO_JOBS_S = (("first job, to the drain", 150.0), ("resumed job", 300.0),
               ("Pong smoke job", float(PONG_SMOKE_SECONDS)))
SETUP_S = 1800.0  # assumed: the cluster and pools made, add-ons rolled out, the head's image pulled
TEARDOWN_S = 600.0  # assumed: the cluster's delete, with what it made


def estimate_run_through_cost(settings, prices: dict | str | Path = PRICES,
                              setup_s: float = SETUP_S, teardown_s: float = TEARDOWN_S,
                              export_interval_s: float = 30.0) -> CostEstimate:
    """What a first run-through costs: the cluster's always-on part (the fee less the free
    tier's credit; Standard's system and head nodes with their disks and addresses, or
    Autopilot's head pod) through the set-up, notebook 04's demonstration jobs and the
    teardown; the actor nodes through those jobs, from none to all of them; and one run of the
    settings' workload (estimate_run_cost: its nodes, Spot tails and telemetry)."""
    for name, value in (("setup_s", setup_s), ("teardown_s", teardown_s)):
        if not (isinstance(value, int | float) and 0 <= value < float("inf")):
            raise ValueError(f"{name}={value!r}: expected a number of seconds >= 0")
    prices = _load(prices)
    s, hourly = settings, estimate_cost(settings, prices)
    idle = hourly.min_per_hour  # what bills with no actor node
    per_node = (hourly.max_per_hour - idle) / s.max_actor_nodes  # a node, its disk, its address
    demo_s = sum(budget + NODE_READY_S for _, budget in DEMO_JOBS_S)
    always = "fee, system and head nodes" if s.mode == "standard" else "fee and head pod"
    actors = "actor nodes (Spot)" if s.mode == "standard" else "actor pods (Spot)"
    jobs = f"notebook 04's {len(DEMO_JOBS_S)} jobs (<= {demo_s / 60:.0f} min)"
    lines = [CostLine(f"set-up ({setup_s / 60:.0f} min, assumed): {always}", 1, 1,
                      idle * setup_s / 3600),
             CostLine(f"{jobs}: {always}", 1, 1, idle * demo_s / 3600),
             CostLine(f"{jobs}: {actors}", 0, s.max_actor_nodes, per_node * demo_s / 3600),
             CostLine(f"teardown ({teardown_s / 60:.0f} min, assumed): {always}", 1, 1,
                      idle * teardown_s / 3600),
             *estimate_run_cost(s, prices, export_interval_s).lines]
    return CostEstimate(lines, hourly.currency, hourly.date, hourly.source,
                        per=f"first run-through (set-up, notebook 04's jobs, one {s.workload} "
                            "run, teardown)")


def spot_drift(s, prices: dict) -> float:
    """Per actor node and hour: the highest E2 Spot price seen above the table's (0 for other
    series, whose table has one price seen)."""
    if not s.actor_machine_type.startswith("e2-"):
        return 0.0
    shape, high = machine(s.actor_machine_type), prices["e2_spot_high"]
    above = (shape.vcpus * high["vcpu"] + shape.memory_gib * high["memory_gib"]
             - prices["machines"][s.actor_machine_type][1])
    return above if above > 1e-9 else 0.0  # not a float's rounding of the same price


# The Spot nodes' time outside the run's budget, each at most: the node's start and the image
# pull before the job's driver starts (the plan's wait for a Ray pod, NODE_READY_S); the job's
# close after its budget (the RayJob's allowance for it, JOB_CLOSE_S); and, once KubeRay has
# deleted the job's cluster (ttlSecondsAfterFinished 0), the autoscaler's wait before it removes
# an unneeded node (NODE_UNNEEDED_S).
TAILS = (("start and image pull", NODE_READY_S), ("the job's close", JOB_CLOSE_S),
         ("unneeded until scaled down", NODE_UNNEEDED_S))


def tail_lines(s, prices: dict) -> list[CostLine]:
    """What each actor node bills outside the run's budget (TAILS), at the highest Spot price
    seen, with its boot disk and address. On Autopilot each actor pod's requests bill instead,
    through its start and the job's close, as an upper bound (the pricing page bills the
    requests of Pods while they run); no node waits to scale down once the pods are gone."""
    if s.mode == "autopilot":
        ap, actor = prices["autopilot"], pod_sizes(s)["actor"]
        per_hour = actor.cpu * ap["vcpu"][1] + actor.memory_gib * ap["memory_gib"][1]
        return [CostLine(f"Spot tail: {what}, up to {seconds / 60:.0f} min a pod", 0,
                         s.max_actor_nodes, per_hour * seconds / 3600)
                for what, seconds in TAILS[:2]]
    per_hour = (prices["machines"][s.actor_machine_type][1] + spot_drift(s, prices)
                + DISK_GB * prices["pd_balanced_gb_month"] / HOURS_PER_MONTH
                + prices["external_ip"][1])
    return [CostLine(f"Spot tail: {what}, up to {seconds / 60:.0f} min a node", 0,
                     s.max_actor_nodes, per_hour * seconds / 3600) for what, seconds in TAILS]


# Telemetry volume: what `python benchmarks/telemetry_volume.py` (2 actors, 40 s, an export
# every 2 s) printed for a CartPole run: the samples one export carries (a gauge or counter
# series is one sample; a histogram series is one per bucket plus its count and sum, as Managed
# Service for Prometheus counts them) and the spans per second.
SAMPLES_PER_EXPORT_RUN = 138  # driver, learner, replay shard and evaluator together
SAMPLES_PER_EXPORT_ACTOR = 114
SPANS_PER_SECOND_RUN = 22.6
SPANS_PER_SECOND_ACTOR = 7.4


def monthly_costs(settings, hours_training: float = 20, builds: int = 2,
                  image_gb: float = 8.0, alert_conditions: int = 4,
                  export_interval_s: float = 30.0,
                  prices: dict | str | Path = PRICES) -> CostEstimate:
    """What runs beside the nodes, per month: metric samples (series x exports), spans, image
    builds, image storage, the run volume and alerting conditions. The ranges run from the
    free allotments to none left."""
    prices = _load(prices)
    minutes = builds * BUILD_MINUTES
    paid_minutes = max(0, minutes - prices["free_build_minutes"])
    paid_gb = max(0.0, image_gb * builds - prices["free_registry_gb"])
    lines = [
        *telemetry_lines(settings, hours_training, export_interval_s, prices),
        CostLine(f"Cloud Build: {builds} x {BUILD_MINUTES} min ({prices['free_build_minutes']} "
                 "min free), minutes", paid_minutes, minutes, prices["build_minute"]),
        CostLine(f"Artifact Registry: {builds} images x {image_gb:g} GB "
                 f"({prices['free_registry_gb']:g} GB free)", paid_gb, image_gb * builds,
                 prices["registry_gb_month"]),
        CostLine(f"run volume {RUNS_VOLUME_GB} GB pd-balanced", RUNS_VOLUME_GB, RUNS_VOLUME_GB,
                 prices["pd_balanced_gb_month"]),
        CostLine(f"alerting: {alert_conditions} conditions (announced, may be 0)", 0,
                 alert_conditions, prices["alert_condition_month"]),
    ]
    return CostEstimate(lines, prices["currency"], prices["date"], prices["source"],
                        per="month")


def telemetry_lines(settings, hours: float, export_interval_s: float,
                    prices: dict) -> list[CostLine]:
    """Metric samples and spans of `hours` of training on the settings' pool, at the rates
    benchmarks/telemetry_volume.py measured per process (the constants above); the spans range
    from the month's free allotment left whole to none of it left."""
    actors = num_actors(settings)
    per_export = SAMPLES_PER_EXPORT_RUN + SAMPLES_PER_EXPORT_ACTOR * actors
    samples = per_export * hours * 3600 / export_interval_s
    spans = (SPANS_PER_SECOND_RUN + SPANS_PER_SECOND_ACTOR * actors) * hours * 3600
    paid_spans = max(0.0, spans - prices["free_spans_per_month"])
    return [
        CostLine(f"metric samples: {per_export}/export, {actors} actors, {hours:.3g} h, "
                 "millions", samples / 1e6, samples / 1e6, prices["metric_samples_per_million"]),
        CostLine(f"spans: {spans / 1e6:.1f} M ({prices['free_spans_per_month'] / 1e6:g} M free), "
                 "millions", paid_spans / 1e6, spans / 1e6, prices["spans_per_million"]),
    ]
