"""The head pod's memory at the Pong workload's sizes: full replay shards while blocks arrive
through Ray's object store at the pool's rate and the learner's batches leave through it.

    python benchmarks/head_memory.py [--seconds 60]

Real parts: the replay process the run uses (distrl.apex.workers.ReplayWorker, one Ray actor
per shard), real Pong blocks (an Actor with WORKLOADS["pong"]'s options makes a few), and Ray's
object store in /dev/shm, as in the pod. The shards are sized as the head sizes them (the
capacity half of the head container's memory holds, split over the shards) and filled. Then
for --seconds the pool's stream arrives: the workload's actors' blocks at one actor's measured
rate (actor_throughput-pong-v5.txt), each actor with one block in the store on its way and one
being made, as ActorWorker sends them; and batches of 512 leave as the learner takes them
(ReplayShards with the workload's requests in flight to each shard), at most at the rate the
plan serves (learner_feed.py's 150 a second; this machine's two cores give less). Sampled
every 0.5 s: the memory unique to the shards and to Ray's own processes (USS) and the store's
use of /dev/shm, printed against the head container's limit. Not measured here: the learner's
TensorFlow (and, on a GPU, CUDA and XLA) host memory and the evaluator, which share the rest.
"""

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_feed import GPU_TARGETS  # noqa: E402
from pong_pool import pong_actor_rate, pong_config, real_blocks, uss_of  # noqa: E402

from distrl.apex.driver import replay_settings  # noqa: E402
from distrl.apex.replay_memory import MEMORY_SHARE, sized_capacity  # noqa: E402
from distrl.apex.workers import ReplayShards, ReplayWorker  # noqa: E402
from distrl.gke import manifests  # noqa: E402
from distrl.gke.settings import GkeSettings  # noqa: E402
from distrl.ray_runtime import init_local_ray  # noqa: E402
from distrl.rl.envs import network_for
from distrl.rl.frames import replay_sizing

GIB = 2**30
OBJECT_STORE_SHARE = 0.3  # Ray's default object store: 30% of the memory it sees (the pod's)


def titled(title: str):
    """Matches a process whose command line starts with `title` or whose program is `title`."""
    return lambda argv: " ".join(argv).startswith(title) or Path(argv[0]).name == title


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny replay and blocks")
    args = parser.parse_args()
    import ray

    config = pong_config(args.smoke)
    spec = network_for(config)
    shape = spec.obs_shape
    pong = GkeSettings.for_workload("pong", project_id="my-project-id")
    head = manifests.pod_sizes(pong)["head"].memory_gib * GIB
    capacity, _ = sized_capacity(None, shape, obs_dtype=np.uint8, share=MEMORY_SHARE,
                                 available=head, **replay_sizing(config, shape))
    batch, seconds, blocks_made = 512, args.seconds, 3
    if args.smoke:
        capacity, batch, seconds, blocks_made = 2_000, 32, 2.0, 2
    config = config.replace(replay_capacity=capacity, min_replay_size=batch, batch_size=batch)
    actors = config.num_actors
    blocks = real_blocks(config, blocks_made)
    per_block = float(np.mean([len(b) for b in blocks]))
    rate = actors * pong_actor_rate()

    shm = shutil.disk_usage("/dev/shm").used
    init_local_ray(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
                   object_store_memory=int(OBJECT_STORE_SHARE * head), log_to_driver=False)
    try:
        shard_config, error_buffer = replay_settings(config)
        shards = [ray.remote(ReplayWorker).options(num_cpus=0, max_concurrency=actors + 8).remote(
            shard_config.replace(seed=s), spec, error_buffer) for s in range(config.replay_shards)]
        refs = [ray.put(b) for b in blocks]
        start = time.perf_counter()
        for shard in shards:  # fill: the same real blocks until the ring is full
            fills = int(np.ceil(shard_config.replay_capacity / per_block)) + 1
            for i in range(0, fills, 8):
                ray.get([shard.add.remote(refs[(i + k) % len(refs)], None)
                         for k in range(min(8, fills - i))], timeout=600)
        sizes = [ray.get(s.stats.remote(), timeout=60)["size"] for s in shards]
        print(f"{len(shards)} shard(s) of the head's replay filled with {sum(sizes):,} Pong "
              f"transitions in {time.perf_counter() - start:.0f} s ({capacity:,} fit in half of "
              f"the head container's {head / GIB:.0f} GiB)")
        del refs

        peaks = {"shards": 0, "ray": 0, "shm": 0}
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peaks["shards"] = max(peaks["shards"], uss_of(titled("ray::ReplayWorker")))
                peaks["ray"] = max(peaks["ray"], uss_of(titled("raylet")) + uss_of(titled("gcs_server")))
                peaks["shm"] = max(peaks["shm"], shutil.disk_usage("/dev/shm").used - shm)
                time.sleep(0.5)

        taken = [0]

        def learner():  # batches leave as the learner takes them, at most at the plan's rate
            client = ReplayShards(shards, 0, config.fetches_in_flight)
            every, due = 1.0 / GPU_TARGETS[0], time.perf_counter()
            while not stop.is_set():
                stack = client.next(batch, 0.4, 1)
                client.ask(batch, 0.4, 1)
                if stack is not None:
                    client.update_priorities(stack.keys.ravel(), np.ones(stack.keys.size))
                    taken[0] += 1
                due += every
                time.sleep(max(0.0, due - time.perf_counter()))
            client.drain()

        threads = [threading.Thread(target=watch), threading.Thread(target=learner)]
        for t in threads:
            t.start()
        in_flight, sent, start = [], 0, time.perf_counter()
        while time.perf_counter() - start < seconds:  # each actor: one block on its way
            due = int((time.perf_counter() - start) * rate / per_block)
            while sent < due:
                ref = ray.put(blocks[sent % len(blocks)])  # a new object, as an actor's put
                in_flight.append((ref, shards[sent % len(shards)].add.remote(ref, None)))
                sent += 1
                while len(in_flight) > 2 * actors:
                    ray.get(in_flight.pop(0)[1], timeout=120)
            time.sleep(0.01)
        ray.get([add for _, add in in_flight], timeout=300)
        stop.set()
        for t in threads:
            t.join(timeout=300)
        wall = time.perf_counter() - start
        used = peaks["shards"] + peaks["ray"] + peaks["shm"]
        print(f"{sent:,} blocks ({sent * per_block / wall:,.0f} transitions/s, "
              f"{actors} actors' rate {rate:,.0f}) in {wall:.0f} s; batches of {batch} out at "
              f"{taken[0] / wall:.1f}/s (at most {GPU_TARGETS[0]}), "
              f"{config.fetches_in_flight} request(s) in flight to each of {len(shards)} shards")
        print(f"peak memory of the replay shards (USS) {peaks['shards'] / GIB:.2f} GiB; Ray's raylet and "
              f"GCS {peaks['ray'] / GIB:.2f} GiB; object store in /dev/shm "
              f"{peaks['shm'] / GIB:.2f} GiB (its cap {OBJECT_STORE_SHARE:.0%} of the pod: "
              f"{OBJECT_STORE_SHARE * head / GIB:.1f} GiB)")
        print(f"together {used / GIB:.2f} GiB of the head container's {head / GIB:.0f} GiB: "
              f"{(head - used) / GIB:.2f} GiB left for the learner (TensorFlow, and CUDA/XLA on "
              "a GPU), the evaluator and the driver, not measured here")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
