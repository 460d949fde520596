"""How fast the autoscaling rehearsal brings actors: from job submission to the first env step
with 0 actor nodes, and from a node loss to its replacement's first env step.

    .venv/bin/python benchmarks/autoscale_recovery.py [--repeats 2] [--busy]

A local cluster from the RayCluster manifest's `actors` group (min 0, max 2 one-CPU nodes) runs a
2-actor training job. "First env step" is the driver's first report of an actor ("actor i
running on node ..."), which it asks for every 0.25 s while the actor steps its environments.
The node that hosts an actor is then killed (SIGKILL, a Spot preemption without notice); the
figures split the recovery into Ray noticing the loss, the replacement node joining, and the
restarted actor's first report. --busy keeps every core busy with a CPU burner meanwhile. The
head declares a lost node dead after 3 failed health checks 1 s apart (LocalCluster's
HEALTH_CHECK); with Ray's defaults, 5 checks 3 s apart, the replacement joined about 12 s later
(18.7 s against 6.7 s, one run each on this repository's 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from distrl.cluster import jobs
from distrl.cluster.local import LocalCluster, actor_table
from distrl.gke import manifests
from distrl.gke.settings import GkeSettings


def one_run(busy: bool, actors: int = 2) -> dict:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(os.cpu_count() or 2)] if busy else []
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def note(line: str) -> None:
        lines.append((time.monotonic() - t0, line))

    def first(text: str, after: float = 0.0) -> float | None:
        return next((t for t, line in lines if text in line and t >= after), None)

    doc = manifests.ray_cluster(GkeSettings(project_id="bench-autoscale",
                                            max_actor_nodes=actors))
    out = tempfile.mkdtemp(prefix="distrl-bench-")
    try:
        with LocalCluster.from_ray_cluster(doc, cpus_per_worker=1, on_event=note,
                                           log_dir=f"{out}/logs") as cluster:
            client = cluster.job_client()
            submitted = time.monotonic() - t0
            job_id = jobs.submit_training(client, [
                "--num-actors", str(actors), "--actor-cpus", "1", "--autoscaling", "true",
                "--envs-per-actor", "16", "--target-return", "none", "--max-seconds", "300"],
                output_dir=f"{out}/job")
            jobs.follow(client, job_id, timeout_s=240, out=note,
                        until=lambda: sum("running on node" in line for _, line in lines) >= actors)
            first_step = first("running on node")
            hosts = {a["node_id"] for a in actor_table(cluster.dashboard_url)
                     if a["class"] == "ActorWorker"}
            victim = next(n.name for n in cluster.nodes if n.node_id in hosts)
            cluster.kill_node(victim)
            killed = time.monotonic() - t0
            jobs.follow(client, job_id, timeout_s=240, out=note,
                        until=lambda: first("is back", killed) is not None)
            noticed = min((t for t in (first("lost", killed), first("stopped reporting", killed))
                           if t is not None), default=None)
            joined, back = first("joined", killed), first("is back", killed)
            jobs.stop(client, job_id)
    finally:
        for b in burners:
            b.kill()
    return {"submit_to_first_step_s": first_step - submitted if first_step else None,
            "loss_noticed_s": noticed - killed if noticed else None,
            "replacement_joined_s": joined - killed if joined else None,
            "loss_to_replacement_step_s": back - killed if back else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--busy", action="store_true", help="keep every core busy meanwhile")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.busy = 1, False
    runs = [one_run(args.busy, actors=1 if args.smoke else 2) for _ in range(args.repeats)]
    print(f"autoscaling rehearsal, {args.repeats} run(s), "
          f"{'every core busy' if args.busy else 'quiet machine'}, {os.cpu_count()} cores")
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        shown = ", ".join(f"{v:.1f}" for v in values) or "never"
        median = f"median {statistics.median(values):6.1f} s" if values else ""
        print(f"  {key:<28} {median}   ({shown}; {len(values)} of {len(runs)} runs)")


if __name__ == "__main__":
    main()
