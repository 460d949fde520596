"""What a run pays before its first transition (imports, `ray.init`, one actor's process), and
after its last: `ray.shutdown()` against `distrl.cluster.shutdown_ray()`.

    python benchmarks/process_startup.py [--repeats 3]

Each figure is the median of fresh interpreters, run one after another (issue 15: start-up to
the first env step at most 5 s; time to solve counts the whole process, its exit included).
Every Ray worker and agent imports Ray, so `import ray` is paid once per process, several times
over on the way to the first transition.
"""

import argparse
import statistics
import subprocess
import sys

# `import ray` is timed in the driver below.
PROBES = {
    "import tensorflow": "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; import tensorflow",
    "import distrl.workers": "import distrl.workers",
}

RAY_START = """
import time
t0 = time.monotonic()
import ray
t1 = time.monotonic()
ray.init(address="local", include_dashboard=False, logging_level="error")
t2 = time.monotonic()

@ray.remote
class Probe:
    def ping(self):
        return 1

probes = [Probe.remote() for _ in range({actors})]
ray.get([p.ping.remote() for p in probes], timeout=120)
for p in probes:
    ray.kill(p, no_restart=True)
t3 = time.monotonic()
{shutdown}
print(t1 - t0, t2 - t1, t3 - t2, time.monotonic() - t3)
"""
SHUTDOWNS = {"ray.shutdown()": "ray.shutdown()",
             "shutdown_ray()": "from distrl.cluster import shutdown_ray; shutdown_ray()"}


def timed(code: str) -> float:
    wrapped = f"import time; t = time.monotonic()\n{code}\nprint(time.monotonic() - t)"
    out = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return float(out.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--actors", type=int, default=4, help="actors created after ray.init")
    args = parser.parse_args()
    if args.repeats < 1 or args.actors < 1:
        parser.error(f"--repeats {args.repeats} and --actors {args.actors}: both must be >= 1")
    for name, code in PROBES.items():
        runs = [timed(code) for _ in range(args.repeats)]
        print(f"{name:<24} {statistics.median(runs):6.2f} s  (runs: {', '.join(f'{r:.2f}' for r in runs)})")
    rows, shutdowns = [], {name: [] for name in SHUTDOWNS}
    for _ in range(args.repeats):
        for name, code in SHUTDOWNS.items():  # alternating, so drift hits both alike
            out = subprocess.run(
                [sys.executable, "-c", RAY_START.format(actors=args.actors, shutdown=code)],
                capture_output=True, text=True, check=True, timeout=300).stdout
            *start, stop = [float(x) for x in out.split()[-4:]]
            rows.append(start)
            shutdowns[name].append(stop)
    labels = ["import ray", "ray.init (local)", f"{args.actors} actors ready"]
    for i, label in enumerate(labels):
        runs = [r[i] for r in rows]
        print(f"{label:<24} {statistics.median(runs):6.2f} s  (runs: {', '.join(f'{r:.2f}' for r in runs)})")
    total = statistics.median(sum(r) for r in rows)
    print(f"{'driver start to actors':<24} {total:6.2f} s")
    for name, runs in shutdowns.items():
        print(f"{name:<24} {statistics.median(runs):6.2f} s  (runs: {', '.join(f'{r:.2f}' for r in runs)})")
    plain, ours = (statistics.median(shutdowns[n]) for n in SHUTDOWNS)
    print(f"shutdown_ray() / ray.shutdown(): {ours / plain:.2f}")


if __name__ == "__main__":
    main()
