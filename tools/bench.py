"""`make bench`: every benchmark in benchmarks/, one after another, each output kept in
benchmarks/results/<script>.txt under a header with its command, the commit, the date and the
machine. Those files are where the figures in the README, docs/ and comments come from: a
figure that no file here prints does not belong there.

    python tools/bench.py                 # all of BENCHMARKS (about an hour on 2 cores)
    python tools/bench.py conv_forward    # some, by name
    python tools/bench.py --list

Run it on a quiet machine: the figures are rates and times.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# script -> the arguments make bench runs it with (the ones the figures in the docs quote).
BENCHMARKS: dict[str, list[str]] = {
    "time_to_solve.py": [],
    "actor_throughput.py": [],
    "actor_throughput.py --env ALE/Pong-v5": ["--env", "ALE/Pong-v5", "--hidden-sizes", "512",
                                               "--envs-per-actor", "8", "16"],
    "learner_throughput.py": [],
    "learner_throughput.py --env MinAtar/Breakout-v1": ["--env", "MinAtar/Breakout-v1",
                                                        "--hidden-sizes", "128"],
    "learner_throughput.py --env ALE/Pong-v5": ["--env", "ALE/Pong-v5", "--batch-size", "512",
                                                 "--hidden-sizes", "512", "--per-call", "1",
                                                 "--updates", "4"],
    "replay_throughput.py": [],
    "pong_pool.py": ["--figure", "docs/pong_pool.png"],
    "learner_feed.py": [],
    "head_memory.py": [],
    "hundred_actors.py": [],
    "replay_memory.py": ["--capacity", "20000", "--fills", "2"],
    "replay_headroom.py": [],
    "conv_forward.py": ["--batch", "1", "16", "64", "--seconds", "3"],
    "image_peer.py": [],
    "collector_ingest.py": [],
    "collector_under_load.py": [],
    "monitoring_query.py": [],
    "telemetry_overhead.py": [],
    "telemetry_volume.py": [],
    "multinode_throughput.py": [],
    "autoscale_recovery.py": [],
    "popen_beside_grpc.py": [],
    "process_startup.py": [],
    "cluster_stop.py": [],
    "resume_head_start.py": ["--seeds", *map(str, range(11, 21))],
    "stability.py": [],
}
# Scripts make bench does not run, and why (tests/test_benchmarks.py checks that every script
# is in one of the two tables).
NOT_IN_BENCH = {
    "sweep.py": "tunes the defaults (hours); each round it runs is appended to "
                "results/sweep_cartpole.json with its command",
    "wait_by_test.py": "runs the slow tests to see which wait and which compute",
    "baseline_dqn.py": "the peer of time_to_solve.py, which runs it",
    "baseline_minatar_dqn.py": "the peer of image_peer.py, which runs it",
    "gpu_check.py": "needs a GPU: on a machine with one, `python tools/bench.py gpu_check` "
                    "records it (NAMED_ONLY)",
    "copy_path.py": "trains LunarLander-v3, which needs box2d, which the lock leaves out: "
                    "`pip install box2d==2.3.10`, then `python tools/bench.py copy_path` "
                    "records it (NAMED_ONLY)",
}
# Run only when named: on a machine with a GPU, or with a package the lock leaves out.
NAMED_ONLY: dict[str, list[str]] = {
    "gpu_check.py": [],
    "copy_path.py": ["--env", "LunarLander-v3", "--target", "200", "--seeds", "0", "1"],
}


def result_path(name: str) -> Path:
    """benchmarks/results/<script stem>[-<first option's value>].txt"""
    script, *options = name.split()
    suffix = "".join(f"-{o.split('/')[-1].lower()}" for o in options if not o.startswith("-"))
    return RESULTS / f"{Path(script).stem}{suffix}.txt"


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    return f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}"


def run(name: str) -> int:
    script = name.split()[0]
    command = ["python", f"benchmarks/{script}", *(BENCHMARKS | NAMED_ONLY)[name]]
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    header = (f"$ {' '.join(command)}\n# commit {commit}, {time.strftime('%Y-%m-%d %H:%M')}, "
              f"{machine()}\n")
    print(header, end="", flush=True)
    out = result_path(name)
    began = time.monotonic()
    with open(out.with_suffix(".partial"), "w") as record:
        record.write(header)
        proc = subprocess.Popen([sys.executable, *command[1:]], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in proc.stdout:
            print(line, end="", flush=True)
            record.write(line)
        code = proc.wait()
        record.write(f"# exit {code} after {time.monotonic() - began:.0f} s\n")
    if code == 0:  # a failed run leaves the previous record in place, and its own beside it
        out.with_suffix(".partial").replace(out)
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="scripts (with or without .py), default: all")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    if args.list:
        for name in BENCHMARKS:
            print(f"{name:<50} -> {result_path(name).relative_to(ROOT)}")
        return 0
    known = BENCHMARKS | NAMED_ONLY if args.names else BENCHMARKS
    chosen = [n for n in known if not args.names or any(
        n.split()[0] in (a, f"{a}.py") or n == a for a in args.names)]
    unknown = [a for a in args.names if not any(n.split()[0] in (a, f"{a}.py") or n == a
                                                for n in known)]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: "
                     f"{sorted({n.split()[0] for n in BENCHMARKS})}")
    failed = [name for name in chosen if run(name) != 0]
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
