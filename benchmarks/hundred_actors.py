"""The seed's scale, rehearsed here: 100 Ape-X actor processes on a local Ray for a minute of
CartPole, every transition accounted for.

    python benchmarks/hundred_actors.py [--actors 100] [--seconds 60]

The seed's tutorial ran 100 actors on 128 vCPUs; WORKLOADS["cartpole-100"] is that pool on
GKE. Here the 100 share this machine's cores (Ray's fractional CPUs: the actors get what the
learner leaves, split evenly), so the rates say nothing about speed; what is measured is the
plumbing at that count. Real parts: ApeX's driver, learner, replay, evaluator and 100
ActorWorker processes on a local Ray (distrl.ray_runtime.init_local_ray). Printed: how long
until every actor ran, the transitions every actor says the replay accepted against what the
replay counts (they must agree: nothing lost, nothing counted twice), the replay's own check,
the peak memory of the actors and of all Ray's processes (USS, sampled every second), and the
driver's CPU time against the run's.
"""

import argparse
import contextlib
import io
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pong_pool import uss_of  # noqa: E402

from distrl.apex.driver import ApeX  # noqa: E402
from distrl.ray_runtime import init_local_ray, shutdown_ray  # noqa: E402
from distrl.rl.config import ApexConfig  # noqa: E402

GIB = 2**30


def is_ray(argv: list[str]) -> bool:
    cmd = " ".join(argv)
    return cmd.startswith("ray::") or "/ray/" in argv[0] or "ray/core" in cmd


def ray_memory() -> tuple[int, int]:
    """(USS of the ActorWorker processes, USS of every Ray process) on this machine."""
    return (uss_of(lambda argv: " ".join(argv).startswith("ray::ActorWorker")), uss_of(is_ray))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0, help="training after start-up")
    parser.add_argument("--startup-s", type=float, default=180.0,
                        help="what start-up may take (it counts against the run's budget)")
    parser.add_argument("--smoke", action="store_true", help="seconds: 4 actors")
    args = parser.parse_args()
    if args.smoke:
        args.actors, args.seconds, args.startup_s = 4, 4.0, 8.0
    cores = os.cpu_count() or 2
    # Ray starts as many worker processes at once as it has CPUs: with 2, a hundred take minutes.
    os.environ.setdefault("RAY_worker_maximum_startup_concurrency", str(max(cores, 8)))
    init_local_ray(num_cpus=cores, include_dashboard=False, logging_level="warning",
                   log_to_driver=False)
    peaks = {"actors": 0, "ray": 0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            actors, everything = ray_memory()
            peaks["actors"], peaks["ray"] = max(peaks["actors"], actors), max(peaks["ray"],
                                                                            everything)
            stop.wait(1.0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with tempfile.TemporaryDirectory() as out:
            config = ApexConfig(env_id="CartPole-v1", num_actors=args.actors,
                                actor_cpus=(cores - 0.5) / args.actors, learner_cpus=0.5,
                                envs_per_actor=4, target_return=None,
                                max_seconds=args.startup_s + args.seconds,
                                actor_wait_s=args.startup_s, output_dir=out, progress=False)
            with contextlib.redirect_stdout(io.StringIO()):  # a line per actor joining
                result = ApeX(config).train()
    finally:
        stop.set()
        watcher.join(timeout=10)
        shutdown_ray()
    everyone = f"{args.actors} of {args.actors} actors running"
    all_ran = next((e["time_s"] for e in result.events if e["detail"].endswith(everyone)), None)
    sent = [s for s in result.actor_transitions_sent if s is not None]
    print(f"{args.actors} actors on {cores} cores ({config.actor_cpus:.3f} CPU each): every actor "
          f"running after {all_ran if all_ran is None else round(all_ran)} s; run "
          f"{result.wall_time_s:.0f} s, stop: {result.stop_reason}")
    print(f"transitions the actors say replay took: {sum(sent):,} from {len(sent)} actors; "
          f"replay counted {result.transitions_inserted:,}; "
          f"{'the same' if sum(sent) == result.transitions_inserted else 'NOT THE SAME'}; "
          f"restarts {sum(result.actor_restarts)}; replay check "
          f"{'ok' if result.replay_check['ok'] else result.replay_check['problems']}")
    print(f"{result.env_steps:,} env steps ({result.env_steps_per_s:,.0f}/s), "
          f"{result.learner_updates:,} updates")
    print(f"peak memory (USS): the actors {peaks['actors'] / GIB:.2f} GiB "
          f"({peaks['actors'] / max(args.actors, 1) / 2**20:.0f} MiB each), every Ray process "
          f"{peaks['ray'] / GIB:.2f} GiB; driver CPU {result.cpu_seconds['driver']:.1f} s in a "
          f"{result.wall_time_s:.0f}-s run ({result.cpu_seconds['driver'] / result.wall_time_s:.1%}"
          " of a core)")
    if sum(sent) != result.transitions_inserted or not result.replay_check["ok"]:
        raise SystemExit("transitions lost or counted twice")


if __name__ == "__main__":
    main()
