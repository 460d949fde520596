"""What a run pays before its first transition (imports, starting Ray, one actor's process), and
after its last: Ray's own `ray.init()`/`ray.shutdown()` against distrl.ray_runtime's
`init_local_ray()`/`shutdown_ray()`.

    python benchmarks/process_startup.py [--repeats 3] [--smoke]

Each figure is the median of fresh interpreters, run one after another; Ray's calls and
distrl's alternate (A B, then B A), so that a drift of the machine favours neither. Then
TensorFlow's import and init_local_ray() overlapped in one process, both timed from its first
line: the earliest a learner could have TensorFlow and Ray on this machine. Last, what a
notebook sees: ApeX.train() on a Ray that is already up, from the call to the first env step
and to the first learner update (the goal: the first update within 5 s of train() on a running
Ray, within 10 s of process start; benchmarks/time_to_solve.py measures the latter).
Every Ray worker and agent imports Ray, so `import ray` is paid once per process, several times
over on the way to the first transition.
"""

import argparse
import json
import statistics
import subprocess
import sys

# `import ray` is timed in the driver below.
PROBES = {
    "import tensorflow": "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; import tensorflow",
    "import distrl.apex.workers": "import distrl.apex.workers",
}

RAY_START = """
import time
t0 = time.monotonic()
import ray
t1 = time.monotonic()
{init}
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
# The learner's two big start-up costs overlapped as far as one process can: TensorFlow
# imported in a thread from the first line on, beside init_local_ray (issue 15: the first
# update within 5 s of process start would need both done, and the model built, by then).
OVERLAP = """
import time; t0 = time.monotonic()
import os, threading
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
done = {}
def tf_import():
    import tensorflow
    done["tf"] = time.monotonic() - t0
thread = threading.Thread(target=tf_import)
thread.start()
from distrl.ray_runtime import init_local_ray, shutdown_ray
init_local_ray(include_dashboard=False, logging_level="error")
done["ray"] = time.monotonic() - t0
thread.join()
shutdown_ray()
print(done["ray"], done["tf"])
"""
# train() on a Ray already up, as in a notebook's kernel: seconds from the call to its first env
# step and first update (from the run's own timeline).
TRAIN_ON_RAY = """
import json, tempfile
from distrl.ray_runtime import init_local_ray, shutdown_ray
init_local_ray(include_dashboard=False, logging_level="error")
from distrl.apex.driver import ApeX
from distrl.rl.config import ApexConfig
with tempfile.TemporaryDirectory() as out:
    config = ApexConfig(target_return=None, max_seconds={seconds}, progress=False, output_dir=out)
    t = ApeX(config).train().timeline
shutdown_ray()
called = t["train() called"]
print(json.dumps([None if t.get(k) is None else t[k] - called
                  for k in ("first env step", "first update")]))
"""
# Ray's own calls, then distrl.ray_runtime's: init_local_ray starts no dashboard process when
# include_dashboard=False, shutdown_ray does not wait on the autoscaler monitor.
OPTIONS = 'include_dashboard=False, logging_level="error"'
VARIANTS = {"ray": {"init": f'ray.init(address="local", {OPTIONS})', "shutdown": "ray.shutdown()"},
            "distrl": {"init": f"from distrl.ray_runtime import init_local_ray; init_local_ray({OPTIONS})",
                       "shutdown": "from distrl.ray_runtime import shutdown_ray; shutdown_ray()"}}
LABELS = {"ray": ("ray.init()", "ray.shutdown()"), "distrl": ("init_local_ray()", "shutdown_ray()")}


def timed(code: str) -> float:
    wrapped = f"import time; t = time.monotonic()\n{code}\nprint(time.monotonic() - t)"
    out = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return float(out.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--actors", type=int, default=4, help="actors created after ray.init")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.actors = 1, 1
    if args.repeats < 1 or args.actors < 1:
        parser.error(f"--repeats {args.repeats} and --actors {args.actors}: both must be >= 1")
    for name, code in ({} if args.smoke else PROBES).items():  # smoke: distrl's calls only
        runs = [timed(code) for _ in range(args.repeats)]
        print(f"{name:<24} {statistics.median(runs):6.2f} s  (runs: {', '.join(f'{r:.2f}' for r in runs)})")
    rows = {name: [] for name in VARIANTS}  # per run: import ray, start, actors, shutdown
    for repeat in range(args.repeats):
        order = list(VARIANTS) if repeat % 2 == 0 else list(VARIANTS)[::-1]  # A B, B A, ...
        for name in order:
            calls = VARIANTS[name]
            out = subprocess.run(
                [sys.executable, "-c", RAY_START.format(actors=args.actors, **calls)],
                capture_output=True, text=True, check=True, timeout=300).stdout
            rows[name].append([float(x) for x in out.split()[-4:]])

    def show(label: str, runs: list[float]) -> float:
        print(f"{label:<24} {statistics.median(runs):6.2f} s  (runs: {', '.join(f'{r:.2f}' for r in runs)})")
        return statistics.median(runs)

    show("import ray", [r[0] for runs in rows.values() for r in runs])
    show(f"{args.actors} actors ready", [r[2] for runs in rows.values() for r in runs])
    medians = {}
    for step, column in (("start", 1), ("stop", 3)):
        for name in VARIANTS:
            medians[name, step] = show(LABELS[name][column // 2], [r[column] for r in rows[name]])
        ours, theirs = LABELS["distrl"][column // 2], LABELS["ray"][column // 2]
        print(f"{ours} / {theirs}: {medians['distrl', step] / medians['ray', step]:.2f}")
    for name in VARIANTS:
        total = statistics.median(sum(r[:3]) for r in rows[name])
        print(f"driver start to actors, {LABELS[name][0]:<17} {total:6.2f} s")
    overlapped = [[float(x) for x in subprocess.run(
        [sys.executable, "-c", OVERLAP], capture_output=True, text=True, check=True,
        timeout=300).stdout.split()[-2:]] for _ in range(0 if args.smoke else args.repeats)]
    if overlapped:
        show("overlapped: Ray up", [r[0] for r in overlapped])
        show("overlapped: TF imported", [r[1] for r in overlapped])
    on_ray = [json.loads(subprocess.run(
        [sys.executable, "-c", TRAIN_ON_RAY.format(seconds=5 if args.smoke else 20)],
        capture_output=True, text=True, check=True, timeout=300).stdout.splitlines()[-1])
        for _ in range(args.repeats)]
    for label, column, goal in (("first env step", 0, None), ("first update", 1, 5.0)):
        values = [r[column] for r in on_ray if r[column] is not None]
        if not values:
            print(f"train() on a running Ray -> {label}: never, in {len(on_ray)} run(s)")
            continue
        median = show(f"train() -> {label}", values)
        if goal is not None:
            print(f"  on a running Ray: goal {goal:g} s -> {'met' if median <= goal else 'NOT met'}")

if __name__ == "__main__":
    main()
