"""Telemetry overhead: the same training with telemetry off and on, interleaved in one run.

    python benchmarks/telemetry_overhead.py [--seeds 100 101 102] [--throughput-seconds 30] [--smoke]

0. Direct cost: the instrument calls an actor makes per block and the learner per update,
   timed in this process against the work they describe (precise, no scheduling noise).
1. Env-step throughput: CartPole-v1 for a fixed time with no target, off and on in ABBA order;
   env steps/s over the run (the rate limiter ties actors to the learner, so any CPU that
   telemetry takes shows up here).
2. Time to solve CartPole-v1 (greedy mean 475), off and on for each seed.
Telemetry exports to a local collector at the default export interval. Target (issue 3): on
within 3% of off.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from learner_throughput import updates_per_second  # benchmarks/ is on sys.path
from time_to_solve import HELD_OUT_SEEDS, run_training, time_to_solve_s

from distrl.otel.collector import LocalCollector


def direct_cost(seconds: float = 5.0, updates: int = 300) -> None:
    """Instrument calls per unit of work, in this process, exporting to a live collector."""
    import numpy as np

    from distrl.apex.process_telemetry import STEP_SAMPLES_PER_BLOCK, TRAFFIC_FLUSH_BLOCKS, TrafficTally
    from distrl.otel import conventions as otel
    from distrl.rl.actor import Actor
    from distrl.rl.config import ApexConfig
    from distrl.rl.network import NetworkSpec, init_weights
    from distrl.rl.tf_runtime import configure_tensorflow

    config = ApexConfig()
    spec = NetworkSpec((4,), 2, config.hidden_sizes, config.dueling)
    # One learner update at the default batch, timed before the collector's server threads
    # start beside it.
    configure_tensorflow(num_threads=1)
    update_s = 1 / updates_per_second(config, spec, updates)[0]
    actor = Actor(config, 0, init_weights(spec, 0))
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCollector(Path(tmp) / "otel.db", port=0) as collector:
        tel = otel.setup_telemetry(endpoint=collector.endpoint, export_interval_ms=1000,
                                   token_file=collector.token_file)
        rl = otel.RLInstruments(tel.meter, otel.common_attributes(
            run_id="bench", algorithm="apex-dqn", environment="CartPole-v1", model="m"))
        attrs = rl.attrs({otel.RL_LOOP: "actor", otel.RL_SAMPLE: "environment"})
        tally = TrafficTally()
        block_s, record_s, blocks = 0.0, 0.0, 0
        while block_s < seconds:
            t0 = time.perf_counter()
            actor.collect(config.actor_block_steps)
            t1 = time.perf_counter()
            # What ActorWorker.run records per block (telemetry on): three latency
            # observations, a sample of env-step times, and the traffic tally that it flushes
            # every 8 blocks.
            for name in ["rl.sample.duration", "rl.reward.duration", "rl.loop.duration"]:
                rl.duration(name, 1.0, attrs)
            for _ in range(STEP_SAMPLES_PER_BLOCK):
                rl.duration("rl.step.duration", 0.01, attrs)
            tally.add(512, [20.0], [20])
            if tally.blocks >= TRAFFIC_FLUSH_BLOCKS:
                tally.flush(rl, attrs)
            t2 = time.perf_counter()
            block_s, record_s, blocks = block_s + t1 - t0, record_s + t2 - t1, blocks + 1
        per_update = []
        for _ in range(int(4_000 * seconds)):
            t0 = time.perf_counter()
            rl.duration("rl.train.duration", 1.5, attrs)
            per_update.append(time.perf_counter() - t0)
        tel.shutdown()
    print(f"direct cost: actor {record_s / blocks * 1e6:.1f} us of recording per block of "
          f"{block_s / blocks * 1e3:.2f} ms = {record_s / block_s:.2%}; learner "
          f"{np.median(per_update) * 1e6:.1f} us per update of ~{update_s * 1e3:.1f} ms = "
          f"{np.median(per_update) / update_s:.2%}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=HELD_OUT_SEEDS[:3])
    parser.add_argument("--throughput-seconds", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-time-to-solve", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.throughput_seconds, args.repeats = args.seeds[:1], 3.0, 1
    direct_cost(*((0.3, 20) if args.smoke else ()))
    solve_budget_s = 2.0 if args.smoke else 120.0
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCollector(Path(tmp) / "otel.db", port=0) as collector:
        runs = Path(tmp) / "runs"
        modes = {"off": [], "on": ["--telemetry", "true", "--otlp-endpoint", collector.endpoint,
                                   "--otlp-token-file", str(collector.token_file)]}
        rates = {"off": [], "on": []}
        for repeat in range(args.repeats):
            # ABBA order: off-on, on-off, ... so a drift of the machine over the run (warming
            # up, other load) does not favour whichever mode always runs second.
            order = ["off", "on"] if repeat % 2 == 0 else ["on", "off"]
            for mode in order:
                flags = modes[mode]
                r = run_training(["--target-return", "none", "--max-seconds",
                                  str(args.throughput_seconds), *flags],
                                 timeout_s=args.throughput_seconds + 120,
                                 output_dir=runs / f"throughput-{repeat}-{mode}")
                rates[mode].append(r["env_steps_per_s"])
                # Per-process CPU seconds, for reading only: with every core busy their sum is
                # about cores x seconds in both modes, so it cannot separate the modes.
                cpu = {k: round(v, 1) for k, v in r["cpu_seconds"].items()}
                print(f"throughput, telemetry {mode:>3}: {r['env_steps_per_s']:,.0f} env steps/s, "
                      f"{r['learner_updates_per_s']:,.0f} updates/s, CPU s {cpu}", flush=True)
        solve = {"off": [], "on": []}
        for n, seed in enumerate([] if args.skip_time_to_solve else args.seeds):
            for mode in (["off", "on"] if n % 2 == 0 else ["on", "off"]):  # alternating
                r = run_training(["--seed", str(seed), "--max-seconds", str(solve_budget_s),
                                  *modes[mode]],
                                 timeout_s=solve_budget_s + 120,  # and start-up, shutdown
                                 output_dir=runs / f"solve-{seed}-{mode}")
                t = time_to_solve_s(r) or float("inf")
                solve[mode].append(t)
                print(f"seed {seed}, telemetry {mode:>3}: time to solve {t:.1f}s", flush=True)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    pairs = [ratio(b, a) for a, b in zip(rates["off"], rates["on"])]
    print(f"env-step throughput: off {off:,.0f}/s, on {on:,.0f}/s, on/off = {ratio(on, off)} "
          f"(target >= 0.97); per pair: {', '.join(pairs)}")
    if args.skip_time_to_solve:
        return
    off_t, on_t = statistics.median(solve["off"]), statistics.median(solve["on"])
    print(f"time to solve (median of {len(args.seeds)} seeds): off {off_t:.1f}s, on {on_t:.1f}s, "
          f"on/off = {ratio(on_t, off_t)} (target <= 1.03; seed-to-seed spread is larger than "
          "3%)")


def ratio(a: float, b: float) -> str:
    """a / b to three places, or 'n/a' where b is 0 or either is infinite (an unsolved run)."""
    return f"{a / b:.3f}" if b and abs(a) != float("inf") and abs(b) != float("inf") else "n/a"

if __name__ == "__main__":
    main()
