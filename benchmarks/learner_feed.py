"""How fast replay feeds a learner: delivered batches of 512 Pong transitions a second, through
Ray, for 1, 2 and 4 replay shards and 1 or 2 requests in flight to each.

    python benchmarks/learner_feed.py [--seconds 10] [--shards 1 2 4] [--in-flight 1 2]

Real parts: the replay process the run uses (distrl.apex.workers.ReplayWorker, one Ray actor
a shard), filled with real Pong blocks (an Actor with WORKLOADS["pong"]'s options makes a few),
and a stand-in learner: a Ray actor that takes batches as LearnerWorker does (ReplayShards.next,
the batch's arrays copied once, as tf.constant copies them into the graph, new priorities back
through ReplayShards.update_priorities) but trains nothing, so the figure is the replay path's
ceiling, whatever the GPU. No rate limiter (samples_per_insert 0) and no actors inserting.

Printed beside it: one shard's rate in this process (sample + update_priorities, no Ray), and
a plain copy of a batch's bytes (its two observation stacks), the memory's limit on one core.
Each shard and the stand-in count their CPU seconds a batch; from those the record projects the
rate on the GKE head's vCPUs (a projection: nothing here runs on 8 vCPUs).

On a commit before issue 62 (ReplayShards without next(): one request at a time, to one shard),
the stand-in asks as that learner did; copy this file and pong_pool.py there to measure the
change.
"""

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pong_pool import pong_config, real_blocks  # noqa: E402

from distrl.apex import workers  # noqa: E402
from distrl.apex.workers import ReplayWorker  # noqa: E402
from distrl.gke import manifests  # noqa: E402
from distrl.gke.settings import GkeSettings  # noqa: E402
from distrl.ray_runtime import init_local_ray  # noqa: E402
from distrl.rl.envs import network_for  # noqa: E402
from distrl.rl.replay import ReplayService  # noqa: E402

GIB = 2**30
STORE_BYTES = GIB  # Ray's object store here: batches in flight and their copies need < 0.5 GiB


class OneRequestAtATime:
    """The learner's fetch before issue 62: one request out, to one shard drawn by mass, asked
    for before the batch that came trains; priority updates bounded at two a shard."""

    def __init__(self, shards: list):
        self.client = workers.ReplayShards(shards, 0)
        self.pending, self.updates = None, []

    def next(self, batch_size: int, beta: float, num_batches: int):
        if self.pending is None:
            self.pending = self.client.request(batch_size, beta, num_batches)
        stack = self.client.collect(self.pending)
        self.pending = self.client.request(batch_size, beta, num_batches)
        return stack

    def ask(self, batch_size: int, beta: float, num_batches: int) -> None:
        """Asked for in next() already, as that learner did."""

    def update_priorities(self, keys, td_abs) -> None:
        self.updates += self.client.update_priorities(keys, td_abs)
        while len(self.updates) > 2 * len(self.client.shards):
            workers._get(self.updates.pop(0))

    def drain(self) -> None:
        for ref in self.updates:
            workers._get(ref)


class StandInLearner:
    """Takes batches as LearnerWorker.step does, without the network."""

    def __init__(self, shards: list, in_flight: int):
        if hasattr(workers, "keep_freed_batches"):  # as LearnerWorker does
            workers.keep_freed_batches()
        self.shards = shards
        if hasattr(workers.ReplayShards, "next"):
            self.replay = workers.ReplayShards(shards, 0, in_flight)
        elif in_flight != 1:
            raise ValueError(f"in_flight={in_flight}: this commit keeps one request out")
        else:
            self.replay = OneRequestAtATime(shards)
        self.rng = np.random.default_rng(0)

    def run(self, batch_size: int, seconds: float, warm_up: int) -> dict:
        """Batches delivered in `seconds`, counted after `warm_up` batches."""
        got, start, cpu = -warm_up, None, 0.0
        while start is None or time.perf_counter() - start < seconds:
            stack = self.replay.next(batch_size, 0.4, 1)
            if stack is None:
                continue
            if start is None and got >= 0:
                start, cpu, shards_cpu = time.perf_counter(), time.process_time(), self._cpu()
            self.replay.ask(batch_size, 0.4, 1)  # as the learner does before it trains
            t = stack.transitions
            _ = [np.array(a) for a in (t.obs, t.action, t.reward, t.discount, t.next_obs,
                                       stack.weights)]  # as tf.constant copies them in
            self.replay.update_priorities(
                stack.keys.ravel(), self.rng.exponential(size=stack.keys.size).astype(np.float32))
            got += len(stack.keys)
        self.replay.drain()
        return {"batches": got, "seconds": time.perf_counter() - start,
                "fetch": type(self.replay).__name__,
                "cpu_s": time.process_time() - cpu, "shards_cpu_s": self._cpu() - shards_cpu}

    def _cpu(self) -> float:
        """The shards' CPU seconds so far."""
        import ray

        return sum(s["cpu_s"] for s in ray.get([s.stats.remote() for s in self.shards],
                                               timeout=60))


def in_process_rate(config, blocks, capacity: int, batch: int, seconds: float) -> float:
    """One shard's sample + update_priorities a second, in this process."""
    spec = network_for(config)
    shard = ReplayService(  # the shard without Ray or telemetry
        capacity, spec.obs_shape, alpha=config.priority_alpha, eps=config.priority_eps,
        samples_per_insert=0.0, min_size=1, error_buffer=0.0, obs_dtype=np.uint8,
        frame_capacity=frame_capacity(config, capacity))
    for block in filling(blocks, capacity):
        shard.add(block, None)
    rng, done, start = np.random.default_rng(0), 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        stack = shard.sample(batch, 0.4, None)
        shard.update_priorities(stack.keys.ravel(), rng.exponential(size=batch))
        done += 1
    return done / (time.perf_counter() - start)


def frame_capacity(config, capacity: int) -> int:
    from distrl.apex.replay_memory import sized_capacity
    from distrl.rl.frames import replay_sizing

    shape = network_for(config).obs_shape
    return sized_capacity(capacity, shape, obs_dtype=np.uint8, available=64 * GIB,
                          **replay_sizing(config, shape))[1]


def filling(blocks: list, capacity: int) -> list:
    """The blocks, repeated until they fill `capacity` transitions (and one more)."""
    per_block = np.mean([len(b) for b in blocks])
    return [blocks[i % len(blocks)] for i in range(int(np.ceil(capacity / per_block)) + 1)]


def copy_rate(batch: int, shape, seconds: float) -> float:
    """Batches a second if a batch cost only a copy of its two observation stacks."""
    height, width, channels = shape
    source = np.random.default_rng(0).integers(0, 255, (2, batch, channels, height, width),
                                               dtype=np.uint8)
    target, done, start = np.empty_like(source), 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        np.copyto(target, source)
        done += 1
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--capacity", type=int, default=100_000, help="transitions a shard")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny blocks and replay")
    args = parser.parse_args()
    import ray

    config = pong_config(args.smoke)
    shape = network_for(config).obs_shape
    batch = 512
    if args.smoke:
        args.seconds, args.shards, args.in_flight, args.capacity, batch = 0.5, [1, 2], [1, 2], 1_000, 32
    if not hasattr(workers.ReplayShards, "next"):
        args.in_flight = [1]
    store = STORE_BYTES // 4 if args.smoke else STORE_BYTES
    blocks = real_blocks(config, 2 if args.smoke else 3)
    per_batch = 2 * batch * math.prod(shape)
    local = in_process_rate(config, blocks, args.capacity, batch, args.seconds)
    copy = copy_rate(batch, shape, args.seconds)
    print(f"a batch of {batch} Pong transitions: two stacks of {per_batch / 2**20:.1f} MiB together")
    print(f"one shard in this process (sample + update_priorities): {local:,.1f} batches/s; "
          f"a plain copy of a batch's bytes: {copy:,.0f} batches/s ({copy * per_batch / GIB:.1f} "
          "GiB/s)")

    init_local_ray(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False,
                   object_store_memory=store, log_to_driver=False)
    rows = []
    try:
        for shards in args.shards:
            replays = start_shards(ray, config, shards, args.capacity, blocks)
            for in_flight in args.in_flight:
                rows.append(measure(ray, replays, shards, in_flight, batch, args.seconds, store,
                                    per_batch))
            for replay in replays:
                ray.kill(replay)
    finally:
        ray.shutdown()
    alone = [r["rate"] for r in rows if (r["shards"], r["in_flight"]) == (1, 1)]
    if alone:
        print(f"1 shard, 1 in flight, delivers {alone[0] / local:.2f}x the shard's rate in this "
              "process (the rest is Ray's copy into its object store, and the cores it shares)")
    report(rows)


def start_shards(ray, config, shards: int, capacity: int, blocks: list) -> list:
    spec = network_for(config)
    shard_config = config.replace(replay_capacity=capacity, min_replay_size=1,
                                  samples_per_insert=0.0, replay_shards=1)
    replays = [ray.remote(ReplayWorker).options(num_cpus=0, max_concurrency=8).remote(
        shard_config.replace(seed=s), spec, 0.0) for s in range(shards)]
    refs = {id(b): ray.put(b) for b in blocks}
    for replay in replays:
        ray.get([replay.add.remote(refs[id(b)], None) for b in filling(blocks, capacity)],
                timeout=600)
    return replays


def measure(ray, replays: list, shards: int, in_flight: int, batch: int, seconds: float,
            store: int, batch_bytes: int) -> dict:
    learner = ray.remote(StandInLearner).options(num_cpus=0).remote(replays, in_flight)
    # Until each shard has put about the object store's size: a process's first writes to the
    # store fault its pages in (a put of a batch then costs 3x its later CPU).
    warm_up = shards * math.ceil(1.2 * store / batch_bytes)
    got = ray.get(learner.run.remote(batch, seconds, warm_up), timeout=seconds + 600)
    ray.kill(learner)
    rate = got["batches"] / got["seconds"]
    row = {"shards": shards, "in_flight": in_flight, "rate": rate,
           "shard_cpu": got["shards_cpu_s"] / max(1, got["batches"]),
           "learner_cpu": got["cpu_s"] / max(1, got["batches"])}
    print(f"{shards} shard(s), {in_flight} request(s) in flight to each ({got['fetch']}): "
          f"{rate:,.1f} batches/s "
          f"delivered; CPU ms a batch: shards {row['shard_cpu'] * 1e3:.1f}, stand-in learner "
          f"{row['learner_cpu'] * 1e3:.1f}", flush=True)
    return row


def report(rows: list[dict]) -> None:
    """Ratios between the rows, what limits them here, and what the GKE head could do."""
    cores = os.cpu_count() or 1
    best = {}
    for r in rows:
        best[r["shards"]] = max(best.get(r["shards"], 0.0), r["rate"])
    if 1 in best and 2 in best:
        print(f"2 shards deliver {best[2] / best[1]:.2f}x 1 shard (best of each)")
    top = max(rows, key=lambda r: r["rate"])
    busy = top["rate"] * (top["shard_cpu"] + top["learner_cpu"])
    print(f"here the best row keeps {busy:.1f} of {cores} cores busy in the shards and the "
          "stand-in alone (Ray's raylet and object store take more): "
          + ("the cores are the limit" if busy > 0.75 * cores else "the cores are not the limit"))

    pong = GkeSettings.for_workload("pong", project_id="my-project-id")
    head_cpus = manifests.pod_sizes(pong)["head"].cpu
    feed_cpus = head_cpus - HEAD_OTHER_CPUS
    # The CPU a batch hardly depends on the row (the cores here do): the median of the rows.
    cost = {side: float(np.median([r[side] for r in rows])) for side in ("shard_cpu", "learner_cpu")}
    print(f"\nprojection for the GKE head (not measured: the median CPU a batch took here, "
          f"{cost['shard_cpu'] * 1e3:.1f} ms in a shard and {cost['learner_cpu'] * 1e3:.1f} in the "
          f"learner, on the head pod's {head_cpus:g} vCPUs, {HEAD_OTHER_CPUS:g} of them left to "
          f"the evaluator, the driver and Ray): a shard serves {1 / cost['shard_cpu']:,.0f} "
          f"batches/s on a core of its own, the learner's host thread takes "
          f"{1 / cost['learner_cpu']:,.0f} a second, the {feed_cpus:g} vCPUs carry "
          f"{feed_cpus / (cost['shard_cpu'] + cost['learner_cpu']):,.0f}")
    for target in GPU_TARGETS:
        print(f"  for {target} updates/s: {shards_for(target, cost, feed_cpus)}")


# A GPU learner's plausible rates at batch 512 with the Nature torso on an L4 (issue 62: about
# 48 GFLOP an update against about 30 TFLOP/s of FP32 peak), until gpu_check.py measures one.
GPU_TARGETS = (150, 250)
HEAD_OTHER_CPUS = 1.0  # the evaluator, the driver and Ray's own processes on the head


def shards_for(target: float, row: dict, feed_cpus: float) -> str:
    """The shards that serve `target` batches/s by the row's CPU a batch, and what else would
    stop the head short of it."""
    shards = math.ceil(target * row["shard_cpu"])
    stops = []
    if target * row["learner_cpu"] > 1:
        stops.append(f"the learner's host thread stops at {1 / row['learner_cpu']:,.0f} "
                     "batches/s (its batches would need a second thread)")
    if target * (row["shard_cpu"] + row["learner_cpu"]) > feed_cpus:
        stops.append(f"the feed needs {target * (row['shard_cpu'] + row['learner_cpu']):.1f} "
                     f"vCPUs of the head's {feed_cpus:g} (a larger head machine)")
    return f"{shards} shard(s)" + (f", but {'; and '.join(stops)}" if stops else "")


if __name__ == "__main__":
    main()
