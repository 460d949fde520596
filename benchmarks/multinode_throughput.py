"""Sample throughput on one node vs the same CPUs split over two local nodes, in one run.

    python benchmarks/multinode_throughput.py [--seconds 40] [--actors 2]

Both clusters are real `ray start` processes (distrl.cluster.LocalCluster) and get the same job
through the Jobs API: Ape-X on CartPole-v1, no target, a fixed time. One node: the head has
every CPU (learner and actors share its object store). Two nodes: the head keeps the learner's
CPU and a worker node has the actors' CPUs, so every block of transitions crosses from the
worker's object store to the head's. The ratio is what crossing nodes costs.
"""

import argparse
import json
import tempfile
from pathlib import Path

from distrl.cluster import jobs
from distrl.cluster.local import LocalCluster


def run(cluster: LocalCluster, actors: int, seconds: float, out: Path) -> dict:
    with cluster:
        client = cluster.job_client()
        job_id = jobs.submit_training(
            client, ["--env", "CartPole-v1", "--num-actors", str(actors), "--actor-cpus", "1",
                     "--target-return", "none", "--max-seconds", str(seconds)],
            output_dir=str(out))
        status = jobs.follow(client, job_id, timeout_s=seconds + 120, out=lambda line: None)
    if status != "SUCCEEDED":
        raise SystemExit(f"the job ended {status}; logs in {cluster.log_dir}")
    return json.loads((out / "results.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.actors = 5.0, 1
    with tempfile.TemporaryDirectory() as tmp:
        # smoke: the two-node cluster only (one node is the same code on a smaller cluster)
        one = None if args.smoke else run(LocalCluster(num_workers=0, head_cpus=1 + args.actors),
                                          args.actors, args.seconds, Path(tmp) / "one")
        two = run(LocalCluster(num_workers=1, cpus_per_worker=args.actors, head_cpus=1),
                  args.actors, args.seconds, Path(tmp) / "two")
    for name, r in (("one node", one), ("two nodes", two)):
        if r is not None:
            print(f"{name:>9}: {r['env_steps_per_s']:,.0f} env steps/s, "
                  f"{r['learner_updates_per_s']:,.0f} updates/s, actors on "
                  f"{len(set(r['actor_nodes']))} node(s)")
    if one is None:
        return
    ratios = {key: f"{two[key] / one[key]:.3f}" if one[key] else "n/a (none on one node)"
              for key in ("env_steps_per_s", "learner_updates_per_s")}
    print(f"two nodes / one node: env steps {ratios['env_steps_per_s']}, "
          f"updates {ratios['learner_updates_per_s']}")


if __name__ == "__main__":
    main()
