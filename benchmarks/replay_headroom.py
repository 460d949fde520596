"""Replay ingest headroom: transitions/s one replay process accepts while it serves the learner,
and from it how many actors one replay process can feed.

    python benchmarks/replay_headroom.py [--seconds 15] [--producers 2] [--shards 1]

A real ReplayWorker (the Ray actor Ape-X runs) at capacity 1M, rate limiter off. A learner
stand-in samples 4 x 512 per call and sends priorities back, as fast as replay serves it. Producer
threads add the same ready block of n-step transitions (512 rows, in the object store) over and
over, so what is measured is the replay process, not the producers. The per-actor rate is one
actor process on one core (benchmarks/actor_throughput.py's "actor" figure). The seed runs
100-300 actors. With --shards N, N replay processes share the capacity, producers fill them
round-robin and the learner stand-in samples them by priority mass (ReplayShards), as Ape-X
does with replay_shards=N; on a machine with cores to spare the ingest grows with N.
"""

import argparse
import threading
import time

import numpy as np
import ray

from distrl.apex.workers import ReplayShards, ReplayWorker
from distrl.ray_runtime import init_local_ray
from distrl.rl.actor import Actor
from distrl.rl.config import ApexConfig
from distrl.rl.envs import network_for
from distrl.rl.network import init_weights


def per_actor_rate(config: ApexConfig, seconds: float = 5.0) -> tuple[float, object]:
    """Env steps/s of one actor on one core, and one block it made (to replay)."""
    actor = Actor(config, 0, init_weights(network_for(config), 0))
    block = actor.collect(config.actor_block_steps)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        block = actor.collect(config.actor_block_steps)
        steps += config.actor_block_steps * config.envs_per_actor
    return steps / (time.perf_counter() - start), block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.capacity = 1.0, 20_000
    config = ApexConfig(replay_capacity=args.capacity // args.shards, samples_per_insert=0.0)
    actor_rate, block = per_actor_rate(config)
    print(f"one actor process: {actor_rate:,.0f} env steps/s ({len(block)} transitions per block)")

    init_local_ray(num_cpus=2, include_dashboard=False, logging_level="error")
    replays = [ray.remote(ReplayWorker).options(max_concurrency=16, num_cpus=0).remote(
        config, network_for(config), 1e9) for _ in range(args.shards)]
    shards = ReplayShards(replays)
    block_ref = ray.put(block)
    ray.get([r.add.remote(block_ref) for r in replays for _ in range(8)],  # enough to sample
            timeout=120)
    stop = threading.Event()
    counts = {"inserted": 0, "updates": 0}

    def produce(i: int):
        replay = replays[i % len(replays)]
        while not stop.is_set():
            ray.get([replay.add.remote(block_ref) for _ in range(4)], timeout=120)
            counts["inserted"] += 4 * len(block)

    def learn():  # as LearnerWorker.step asks, takes and answers
        rng = np.random.default_rng(0)
        while not stop.is_set():
            stack = shards.next(config.batch_size, 0.4, 4)
            shards.ask(config.batch_size, 0.4, 4)
            if stack is not None:
                keys = stack.keys.ravel()
                shards.update_priorities(keys, rng.random(len(keys)))
                counts["updates"] += len(stack.keys)
        shards.drain()

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(args.producers)]
    threads.append(threading.Thread(target=learn))
    for t in threads:
        t.start()
    time.sleep(0.5 if args.smoke else 2.0)  # warm up, then measure
    before, t0 = dict(counts), time.perf_counter()
    time.sleep(args.seconds)
    after, dt = dict(counts), time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    ray.shutdown()
    ingest = (after["inserted"] - before["inserted"]) / dt
    served = (after["updates"] - before["updates"]) / dt
    fed = ingest / actor_rate
    print(f"replay ingest ({args.shards} shard(s)) while serving the learner: {ingest:,.0f} "
          "transitions/s "
          f"({served:,.0f} batches of {config.batch_size}/s served meanwhile)")
    print(f"actors {args.shards} replay process(es) can feed: {fed:,.1f} at {actor_rate:,.0f} "
          "env steps/s each "
          f"(CartPole on one core); at a seed-like 1,000 env steps/s per actor: {ingest / 1000:,.0f}")
    per_shard = fed / args.shards
    if fed >= 300:
        print("300 actors: fed")
    elif per_shard > 0:
        print(f"300 actors: need about {int(np.ceil(300 / per_shard))} replay shards at this "
              "per-actor rate, each with a core of its own")
    else:
        print("300 actors: nothing was inserted while measuring (a machine too busy to tell)")


if __name__ == "__main__":
    main()
