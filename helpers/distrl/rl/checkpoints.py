"""Checkpoints: one .npz of arrays plus a .json of counters and config, in a local directory
or under any fsspec URI (gs://bucket/run/checkpoints).

    path = write_checkpoint(directory, learner.snapshot())
    resume = find_resume("auto", directory)      # the newest readable one, and what it skipped
    check_checkpoint_network(resume.arrays, spec, resume.path)
    blocks = replay_blocks(resume.arrays)        # what the replay shards held, sampled
    meta, weights = load_policy(f"{directory}/best.npz")  # the kept best policy (write_policy)

A checkpoint keeps the learner's whole state and a sample of the replay (replay_arrays): a
resumed learner that trained on new play alone fell far below its checkpoint's score on the way
back (benchmarks/resume_head_start.py).
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from dataclasses import dataclass

import numpy as np

from distrl.rl.transitions import Transitions

CHECKPOINT_RE = re.compile(r"checkpoint-(\d{9})\.npz$")
REPLAY_KEY_RE = re.compile(r"replay\.(\d+)\.(\w+)$")  # replay.<shard>.<field>


def write_checkpoint(directory: str | os.PathLike, snapshot: tuple[dict, dict[str, np.ndarray]],
                     keep: int = 3) -> str:
    """Write a Learner.snapshot() as checkpoint-<updates>.npz (+ .json); returns its path or URI."""
    meta, arrays = snapshot
    fs, root = _filesystem(directory)
    fs.makedirs(root, exist_ok=True)
    name = f"{root}/checkpoint-{meta['updates']:09d}"
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    fs.pipe_file(f"{name}.json", json.dumps(meta, indent=2).encode())
    # The .npz appears last and whole (a rename, or one object write on GCS): its presence
    # marks a complete checkpoint.
    fs.pipe_file(f"{name}.npz.tmp", buffer.getvalue())
    fs.mv(f"{name}.npz.tmp", f"{name}.npz")
    for old in _checkpoint_paths(fs, root)[:-keep]:
        fs.rm(old)
        if fs.exists(old[:-4] + ".json"):
            fs.rm(old[:-4] + ".json")
    return _uri(fs, f"{name}.npz")


BEST_POLICY = "best.npz"  # the kept best policy's weights, beside the checkpoints


def write_policy(directory: str | os.PathLike, meta: dict, weights: list[np.ndarray]) -> str:
    """Write a policy's online weights and meta (what it scored, which weights version) as one
    best.npz, replacing the one there; returns its path or URI. Only the weights: a resume
    continues from a checkpoint (optimizer, target network, replay), not from this."""
    fs, root = _filesystem(directory)
    fs.makedirs(root, exist_ok=True)
    name = f"{root}/{BEST_POLICY}"
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta)),
             **{f"online_{i}": w for i, w in enumerate(weights)})
    fs.pipe_file(f"{name}.tmp", buffer.getvalue())
    fs.mv(f"{name}.tmp", name)  # whole or not at all: weights and meta always agree
    return _uri(fs, name)


def load_policy(path: str | os.PathLike) -> tuple[dict, list[np.ndarray]]:
    """(meta, online weights) of a kept policy (best.npz) or of a checkpoint (its online
    network), path or URI, for a greedy episode or an evaluation."""
    fs, name = _filesystem(path)
    best = name.endswith("/" + BEST_POLICY) or name == BEST_POLICY
    if not (CHECKPOINT_RE.search(name) or best) or not fs.exists(name):
        raise FileNotFoundError(f"no policy at {path!s} (expected .../{BEST_POLICY} or "
                                ".../checkpoint-NNNNNNNNN.npz)")
    if not best:
        meta, arrays = read_checkpoint(path)
    else:
        arrays = _read_arrays(fs, name, f"policy {path!s}")
        try:
            meta = json.loads(str(arrays.pop("meta")))
        except (KeyError, ValueError) as err:
            raise CheckpointError(f"policy {path!s} cannot be read ({type(err).__name__}: "
                                  f"{err})") from None
    weights = [arrays[f"online_{i}"] for i in range(len(arrays)) if f"online_{i}" in arrays]
    if not weights:
        raise CheckpointError(f"{path!s} holds no online_0: not a distrl policy")
    return meta, weights


def kept_policy(directory: str | os.PathLike) -> dict | None:
    """The record of the policy kept in directory (best.npz's meta and its path, marked
    this_run False), or None where there is none that can be read (a new one replaces it)."""
    fs, root = _filesystem(directory)
    try:
        meta, _ = load_policy(_uri(fs, f"{root}/{BEST_POLICY}"))
    except (FileNotFoundError, CheckpointError):
        return None
    return {**meta, "path": _uri(fs, f"{root}/{BEST_POLICY}"), "this_run": False}


def _read_arrays(fs, name: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of one .npz, or a CheckpointError that names `what` could not be read."""
    try:
        with fs.open(name, "rb") as f, np.load(io.BytesIO(f.read())) as data:
            return {k: data[k] for k in data.files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"{what} cannot be read ({type(err).__name__}: {err})") from None


def _filesystem(location: str | os.PathLike):
    import fsspec

    return fsspec.core.url_to_fs(str(location))


def _uri(fs, path: str) -> str:
    """A local path stays a path; anything else gets its protocol back (gs://...)."""
    from fsspec.implementations.local import LocalFileSystem

    return path if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(path)


def _checkpoint_paths(fs, root: str) -> list[str]:
    return sorted(p for p in fs.glob(f"{root}/checkpoint-*.npz") if CHECKPOINT_RE.search(p))


def latest_checkpoint(directory: str | os.PathLike) -> str | None:
    """The newest complete checkpoint under directory (path or URI), or None."""
    fs, root = _filesystem(directory)
    if not fs.exists(root):
        return None
    found = _checkpoint_paths(fs, root)
    return _uri(fs, found[-1]) if found else None


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that no Learner of this config can take."""


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, arrays) of one checkpoint .npz (path or URI). A checkpoint cut short, or
    not a checkpoint, raises CheckpointError naming the file."""
    fs, name = _filesystem(path)
    if not CHECKPOINT_RE.search(name) or not fs.exists(name):
        raise FileNotFoundError(f"no checkpoint at {path!s} (expected .../checkpoint-NNNNNNNNN.npz)")
    arrays = _read_arrays(fs, name, f"checkpoint {path!s}")
    json_name = name[:-4] + ".json"
    try:
        meta = json.loads(fs.cat_file(json_name))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint metadata {_uri(fs, json_name)} cannot be read "
                              f"({type(err).__name__}: {err})") from None
    if not isinstance(meta, dict) or not {"updates", "config"} <= meta.keys():
        raise CheckpointError(f"checkpoint metadata {_uri(fs, json_name)} has no updates and "
                              "config: not a distrl checkpoint")
    return meta, arrays


@dataclass
class Resume:
    """The checkpoint a run resumes from, and the newer ones that could not be read."""

    path: str
    meta: dict
    arrays: dict
    skipped: list[str]


def find_resume(resume: str, checkpoint_dir: str) -> Resume:
    """'auto' -> the newest readable checkpoint in checkpoint_dir; a directory -> its newest
    readable one (a checkpoint cut short by a lost node is skipped, and named); a file: that
    checkpoint, or a CheckpointError."""
    target = checkpoint_dir if resume == "auto" else resume
    if str(target).endswith(BEST_POLICY):
        raise CheckpointError(f"resume={resume!r}: {BEST_POLICY} holds a policy's weights only, "
                              "and a resume needs a checkpoint's whole state (optimizer, target "
                              "network, replay): give its folder or one checkpoint-*.npz")
    if CHECKPOINT_RE.search(str(target)):
        return Resume(str(target), *read_checkpoint(target), [])
    fs, root = _filesystem(target)
    found = [_uri(fs, p) for p in _checkpoint_paths(fs, root)] if fs.exists(root) else []
    if not found:
        raise FileNotFoundError(f"resume={resume!r}: no checkpoint-*.npz in {target}")
    skipped = []
    for path in reversed(found):
        try:
            return Resume(path, *read_checkpoint(path), skipped)
        except CheckpointError as err:
            skipped.append(str(err))
    raise CheckpointError(f"resume={resume!r}: none of the {len(found)} checkpoints in {target} "
                          f"can be read; the newest: {skipped[0]}")


def check_checkpoint_network(arrays: dict, spec, path: str) -> None:
    """The checkpoint's online network has the layers spec builds, or a CheckpointError that
    names both (before any process starts)."""
    want = spec.weight_shapes()
    got = [tuple(arrays[f"online_{i}"].shape) for i in range(len(arrays))
           if f"online_{i}" in arrays]
    if got != want:
        raise CheckpointError(
            f"checkpoint {path} holds a network of weight shapes {got}, and this config builds "
            f"{want} (obs shape {spec.obs_shape}, conv layers "
            f"{list(spec.conv_layers)}, hidden_sizes {list(spec.hidden_sizes)}, "
            f"{spec.num_actions} actions, dueling={spec.dueling}): resume it with the "
            "settings it was written with (its .json has them), or start a new run")


def replay_arrays(blocks: list[Transitions]) -> dict[str, np.ndarray]:
    """Replay shards' contents (ReplayService.contents, one block a shard) as checkpoint
    arrays, replay.<shard>.<field>."""
    arrays = {}
    for shard, block in enumerate(blocks):
        fields = [*Transitions.ROWS, *(["frames"] if block.frames is not None else [])]
        arrays |= {f"replay.{shard}.{name}": getattr(block, name) for name in fields}
    return arrays


def replay_blocks(arrays: dict) -> list[Transitions]:
    """The replay blocks a checkpoint holds, one a shard of the run that wrote it ([] from a
    checkpoint without replay)."""
    fields: dict[int, dict] = {}
    for key, value in arrays.items():
        if match := REPLAY_KEY_RE.match(key):
            fields.setdefault(int(match[1]), {})[match[2]] = value
    return [Transitions(**fields[shard]) for shard in sorted(fields)]
