"""The Pong workload's pool, sized from measured rates: how many actors one replay shard and
one learner keep up with.

    python benchmarks/pong_pool.py [--capacity 200000] [--seconds 5]

Measured here, in one process, on real Pong blocks (an Actor with WORKLOADS["pong"]'s options
makes them: 16 envs, blocks of 200 steps, 84x84x4 frames): a replay shard's ingest
(transitions/s, PrioritizedReplay.add of whole blocks), its sampling (batches of 512/s:
sample + the learner's update_priorities), and its memory (bytes a live transition). Read
from make bench's records (their commands are in them): one actor's env steps/s on a core
(actor_throughput-pong-v5.txt, 16 envs) and the learner's updates/s at batch 512 on one CPU
core (learner_throughput-pong-v5.txt, without XLA). A GPU learner's rate is not measured here:
the Ape-X paper's, 19 batches of 512 a second, is second-hand (quoted in issue 51) until a GPU
run of benchmarks/gpu_check.py replaces it.

A replay shard is one process: it ingests and samples in turns, so the share of its time the
pool takes is insert_rate / ingest + learner_rate / sample. Printed: that share and the replay
ratio (sampled / inserted) for pools of 6-100 actors, and the capacity the head pod's replay
holds (half of its memory). How many shards serve the learner through Ray is
benchmarks/learner_feed.py's to say.
"""

import argparse
import re
import resource
import time
from pathlib import Path

import numpy as np

from distrl.apex.replay_memory import MEMORY_SHARE, sized_capacity
from distrl.apex.train import config_from_args
from distrl.gke import manifests
from distrl.gke.settings import WORKLOADS, GkeSettings
from distrl.rl.actor import Actor
from distrl.rl.config import ApexConfig
from distrl.rl.envs import network_for
from distrl.rl.frames import replay_sizing
from distrl.rl.network import init_weights
from distrl.rl.replay import PrioritizedReplay

RESULTS = Path(__file__).resolve().parent / "results"
SHARD_BUSY = 0.8  # a shard's time the pool may take: the rest absorbs bursts and checkpoints
GPU_UPDATES_SECOND_HAND = 19.0  # Ape-X paper, §4.1, as issue 51 quotes it: batches of 512/s
# The paper's replay ratio from the same second-hand figures: 19 x 512 sampled a second against
# 360 actors x 139 frames/s / 4 frames a step inserted.
PAPER_RATIO = 19 * 512 / (360 * 139 / 4)


def record_rate(name: str, pattern: str) -> float:
    """A figure from a make bench record, by regular expression (its first group)."""
    text = (RESULTS / name).read_text()
    found = re.search(pattern, text, re.M)
    if not found:
        raise SystemExit(f"{name}: no line matches {pattern!r}; run `python tools/bench.py`")
    return float(found.group(1).replace(",", ""))


def pong_actor_rate() -> float:
    """One Pong actor's env steps/s on a core with 16 envs (actor_throughput-pong-v5.txt)."""
    return record_rate("actor_throughput-pong-v5.txt",
                       r"16 envs: raw .*?actor \(inference \+ n-step \+ priorities\) +([\d,]+)/s")


def real_blocks(config, count: int) -> list:
    """count blocks of real frames, as an Actor with the config's options makes them."""
    actor = Actor(config, 0, init_weights(network_for(config), 0))
    try:
        return [actor.collect(config.actor_block_steps) for _ in range(count)]
    finally:
        actor.close()


def uss_of(match) -> int:
    """Memory unique to this machine's processes whose argv `match` accepts: their USS, less
    the pages of Ray's object store (in /dev/shm) that only they map: the store is counted once,
    apart, from /dev/shm's use (a replay shard writing batches into it maps pages no other
    process touches, which USS counts as its own)."""
    import contextlib

    import psutil

    total = 0
    for p in psutil.process_iter(["cmdline"]):
        if match(p.info["cmdline"] or [""]):
            with contextlib.suppress(psutil.Error, OSError):  # ended while looked at
                total += p.memory_full_info().uss - shm_private(p.pid)
    return total


def shm_private(pid: int) -> int:
    """Bytes of /dev/shm mappings that only process pid maps (/proc/PID/smaps)."""
    total, in_shm = 0, False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=6)
            if not line[0].isupper():  # a mapping's first line: address range ... path
                in_shm = len(head) >= 6 and head[5].startswith("/dev/shm/")
            elif in_shm and head[0] in ("Private_Clean:", "Private_Dirty:"):
                total += int(head[1]) * 1024
    return total


def pong_config(smoke: bool) -> ApexConfig:
    """The Pong workload's config as its RayJob runs it (its pool: one actor a CPU)."""
    actors = manifests.num_actors(GkeSettings.for_workload("pong", project_id="my-project-id"))
    args = [*WORKLOADS["pong"].command_args(), "--num-actors", str(actors)]
    config = config_from_args(args)
    if smoke:
        from dataclasses import replace
        config = replace(config, envs_per_actor=2, actor_block_steps=50)
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=200_000)
    parser.add_argument("--blocks", type=int, default=3, help="real blocks to make and reuse")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--figure", type=Path, help="also draw the table as a PNG here")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny blocks and replay")
    args = parser.parse_args()
    if args.smoke:
        args.capacity, args.blocks, args.seconds = 2_000, 2, 0.5
    config = pong_config(args.smoke)
    spec = network_for(config)
    shape = spec.obs_shape
    batch = 512 if not args.smoke else 32

    start = time.perf_counter()
    blocks = real_blocks(config, args.blocks)
    made = time.perf_counter() - start
    per_block = sum(len(b) for b in blocks) / len(blocks)
    planes = sum(len(b.frames) for b in blocks) / sum(len(b) for b in blocks)
    print(f"{len(blocks)} real blocks of {config.envs_per_actor} envs x "
          f"{config.actor_block_steps} steps: {per_block:,.0f} transitions, {planes:.3f} planes "
          f"a transition, {per_block * planes * shape[0] * shape[1] / 2**20:.1f} MiB a block "
          f"(made in {made:.1f} s)")

    capacity, frame_capacity = sized_capacity(args.capacity, shape, obs_dtype=np.uint8,
                                              **replay_sizing(config, shape))
    replay = PrioritizedReplay(capacity, shape, obs_dtype=np.uint8, frame_capacity=frame_capacity)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    added, start = 0, time.perf_counter()
    while added < capacity or time.perf_counter() - start < args.seconds:
        replay.add(blocks[(added // int(per_block)) % len(blocks)])
        added += int(per_block)
    ingest = added / (time.perf_counter() - start)
    rng = np.random.default_rng(0)
    sampled, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        drawn = replay.sample(batch)
        replay.update_priorities(drawn.keys, rng.exponential(size=batch).astype(np.float32))
        sampled += 1
    sample = sampled / (time.perf_counter() - start)
    health = replay.check()
    if not health["ok"]:
        raise SystemExit(f"replay check failed: {health['problems']}")
    per_live = replay.nbytes / len(replay)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    print(f"replay shard at capacity {capacity:,} ({replay.nbytes / 2**30:.2f} GiB, peak RSS "
          f"+{rss / 2**30:.2f} GiB): ingest {ingest:,.0f} transitions/s; "
          f"sample({batch}) + update_priorities {sample:,.1f} batches/s "
          f"({sample * batch:,.0f} transitions/s)")

    actor_rate = pong_actor_rate()
    cpu_learner = record_rate("learner_throughput-pong-v5.txt",
                              r"without XLA \(jit_compile=False\) .*?then ([\d.]+) updates/s")
    print(f"one actor on a core: {actor_rate:,.0f} env steps/s (actor_throughput-pong-v5.txt); "
          f"the learner at batch 512: {cpu_learner:.2f} updates/s on one CPU core "
          f"(learner_throughput-pong-v5.txt, no XLA), {GPU_UPDATES_SECOND_HAND:g} on the paper's "
          "GPU (second-hand)")

    print(f"\n{'actors':>6} {'inserted/s':>11} {'shard share, CPU learner':>25} "
          f"{'shard share, GPU learner':>25} {'replay ratio (GPU)':>19}")
    pools, shares, ratios = (6, 12, 18, 24, 42, 56, 70, 100), [], []
    for actors in pools:
        inserted = actors * actor_rate
        share = {name: inserted / ingest + rate / sample
                 for name, rate in (("cpu", cpu_learner), ("gpu", GPU_UPDATES_SECOND_HAND))}
        shares.append(share["gpu"])
        ratios.append(GPU_UPDATES_SECOND_HAND * 512 / inserted)
        print(f"{actors:>6} {inserted:>11,.0f} {share['cpu']:>24.0%} {share['gpu']:>24.0%} "
              f"{ratios[-1]:>19.2f}")
    if args.figure:
        draw(args.figure, pools, shares, ratios)

    pong = GkeSettings.for_workload("pong", project_id="my-project-id")
    actors = manifests.num_actors(pong)
    head = manifests.pod_sizes(pong)["head"].memory_gib * 2**30
    fits, _ = sized_capacity(None, shape, obs_dtype=np.uint8, share=MEMORY_SHARE,
                             available=head, **replay_sizing(config, shape))
    inserted = actors * actor_rate
    share = inserted / ingest + GPU_UPDATES_SECOND_HAND / sample
    paper_pool = round(GPU_UPDATES_SECOND_HAND * 512 / PAPER_RATIO / actor_rate)
    print(f"\nthe paper's replay ratio ({PAPER_RATIO:.2f}) with a learner at its rate asks for "
          f"{paper_pool} actors of {actor_rate:,.0f} env steps/s")
    print(f"the workload (WORKLOADS['pong']): {actors} actors insert {inserted:,.0f} "
          "transitions/s, "
          f"{share:.0%} of one shard's time in this process with a GPU learner at the paper's "
          "rate (through Ray, learner_feed.py sizes the shards); the head pod's "
          f"{head / 2**30:.0f} GiB hold {fits:,} transitions in half of it "
          f"({fits * per_live / 2**30:.1f} GiB at {per_live / 1024:.2f} KiB a live transition), "
          f"{fits / inserted:.0f} s of the pool's experience")


def draw(path: Path, pools, shares, ratios) -> None:
    """Replay ratio and one shard's busy share against the pool, with the paper's ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    ax.plot(pools, ratios, marker="o", label="replay ratio (sampled / inserted)")
    ax.axhline(PAPER_RATIO, color="C0", linestyle=":", label=f"Ape-X paper's {PAPER_RATIO:.2f}")
    ax.plot(pools, shares, marker="s", color="C1", label="one replay shard's busy share")
    ax.axhline(SHARD_BUSY, color="C1", linestyle=":", label=f"a shard's budget, {SHARD_BUSY:.0%}")
    ax.set(xlabel="actors (one per core)", ylabel="ratio / share", yscale="log",
           title=f"Pong, a learner at {GPU_UPDATES_SECOND_HAND:g} batches of 512/s (second-hand)")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=72)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
