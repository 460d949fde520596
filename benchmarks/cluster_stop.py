"""How long LocalCluster.stop() takes for a head and one worker node, as shipped and without its
two shortcuts: the head's autoscaler monitor killed once its GCS has ended (else Ray waits a
fixed 1 s on it), and a zombie counted as ended (else the wait lasts until init reaps it).

    python benchmarks/cluster_stop.py [--repeats 3]

Every test and notebook that starts a local multi-node cluster pays this once (issue 15).
The two variants alternate, so drift on the machine hits both alike.
"""

import argparse
import statistics
import tempfile
import time

import psutil

from distrl import ray_runtime
from distrl.cluster import local as cluster


def without_shortcuts() -> list[tuple[object, str, object]]:
    """The functions as they were before the shortcuts; returns what to put back."""
    saved = [(cluster, "_skip_monitor_grace", cluster._skip_monitor_grace),
             (ray_runtime, "until_ended", ray_runtime.until_ended)]

    def wait_procs(procs, timeout_s):  # psutil's wait: a zombie still counts as running
        return psutil.wait_procs(procs, timeout=timeout_s)[1]

    cluster._skip_monitor_grace = lambda gcs, monitor, wait_s=0.0: None
    ray_runtime.until_ended = wait_procs
    return saved


def time_stop(workers: int) -> float:
    with tempfile.TemporaryDirectory(prefix="distrl-bench-") as logs:
        c = cluster.LocalCluster(num_workers=workers, cpus_per_worker=1, head_cpus=1,
                                 log_dir=logs).start()
        t0 = time.monotonic()
        c.stop()
        return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.workers = 1, 0
    if args.repeats < 1 or args.workers < 0:
        parser.error(f"--repeats {args.repeats} must be >= 1 and --workers {args.workers} >= 0")
    runs = {"as shipped": [], "without the shortcuts": []}
    for _ in range(args.repeats):
        runs["as shipped"].append(time_stop(args.workers))
        saved = without_shortcuts()
        try:
            runs["without the shortcuts"].append(time_stop(args.workers))
        finally:
            for module, name, function in saved:
                setattr(module, name, function)
    for name, times in runs.items():
        print(f"stop(), {name:<22} {statistics.median(times):5.2f} s  "
              f"(runs: {', '.join(f'{t:.2f}' for t in times)})")
    ratio = statistics.median(runs["as shipped"]) / statistics.median(runs["without the shortcuts"])
    print(f"as shipped / without: {ratio:.2f}")


if __name__ == "__main__":
    main()
