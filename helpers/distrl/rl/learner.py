"""The learner: n-step double DQN with a target network, Huber loss and new priorities.

    learner = Learner(config, spec, initial_weights)
    loss, td_abs, diag = learner.update(batch)  # one gradient step on a SampledBatch
    losses, td_abs, diag = learner.update_many(replay.sample_many(128, 8))  # 8, in one call
    weights = learner.get_weights()            # numpy, versioned by learner.updates
    learner.save_checkpoint(directory)

Target (double DQN, Van Hasselt et al. 2016, with n-step returns as in Ape-X):
    a* = argmax_a Q_online(s', a);   y = R + discount * Q_target(s', a*)
where discount is gamma^n, gamma^k for an episode truncated after k steps, or 0 if it terminated.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import re
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distrl.rl.config import ApexConfig
from distrl.rl.network import NetworkSpec, build_keras_model, get_keras_weights, set_keras_weights
from distrl.rl.replay import SampledBatch

CHECKPOINT_RE = re.compile(r"checkpoint-(\d{9})\.npz$")


@contextlib.contextmanager
def _native_stderr_without(harmless: re.Pattern):
    """Inside the block, what is written to fd 2 (C++ logs and Python's stderr alike) goes to a
    temporary file; on the way out every line of it but the harmless ones reaches stderr, in
    order. Nothing is lost: a line written meanwhile by another thread comes out late."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not harmless.search(line.decode(errors="replace"))]
            if kept:
                os.write(2, b"".join(kept))


# What TensorFlow 2.21 logs at ERROR level each time it loads a train step from the XLA cache,
# though the step loads and runs: the cache reads the entry it wrote as binary with
# ReadTextOrBinaryProto, whose text parse fails first (device_executable_persistor.h in
# tensorflow/compiler/jit), and XLA:CPU's loader (cpu_aot_loader.cc) takes the two tuning
# features it compiled with for CPU features the host lacks. A line about any other feature,
# which could mean an executable this CPU cannot run, still shows.
XLA_CACHE_NOISE = re.compile(
    r"Error parsing text-format tensorflow\.XlaSerializedCacheEntry: |cpu_aot_loader\.cc:\d+\] "
    r"Loading XLA:CPU AOT result\. Target machine feature \+prefer-no-(?:scatter|gather) is not "
    r"+supported on the host machine\.")


def _quiet_native_stderr():
    """Silence C++ log lines written straight to fd 2 (Python exceptions still propagate).

    TensorFlow prints its oneDNN and "no CUDA driver" notices from C++ before its log level
    applies, once per process; in a Ray cluster every line reaches the driver's output.
    """
    return _native_stderr_without(re.compile(""))  # every line is dropped


# Keras probes for these when it is imported (pandas for its data adapters, matplotlib.pyplot
# for its plotting helpers): CPU time in a process that only trains, on the learner's path to
# its first update. `python -X importtime -c "import tensorflow"` measures it.
KERAS_OPTIONAL = ("pandas", "matplotlib")


@contextlib.contextmanager
def _hidden(names: tuple[str, ...]):
    """Inside the block, `import name` fails for each of these not imported yet; afterwards
    they import normally (what cached the failure does without them, as Keras does)."""
    hidden = [n for n in names if n not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # the import system's "not available" marker
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


XLA_CACHE_ENV = "DISTRL_XLA_CACHE_DIR"  # where compiled learner steps persist; default ~/.cache
XLA_CACHE_MAX_BYTES = 256 * 2**20  # oldest entries go beyond this (one is about 0.7 MB on CPU)
_xla_cache_dir: Path | None = None  # this process's XLA cache, once configure_tensorflow set it


def default_xla_cache_dir(tf_version: str) -> Path:
    """$DISTRL_XLA_CACHE_DIR, else ~/.cache/distrl/xla ($XDG_CACHE_HOME respected), with a
    folder per TensorFlow version and CPU: an executable is compiled for the instruction set
    of the CPU it was compiled on, and loaded only by the XLA that wrote it."""
    base = os.environ.get(XLA_CACHE_ENV) or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "distrl" / "xla"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        cpu = ""
    cpu_key = hashlib.sha256((cpu or platform.processor()).encode()).hexdigest()[:12]
    return Path(base) / f"tf{tf_version}-{platform.machine()}-{cpu_key}"


def _enable_xla_cache(directory: Path) -> Path | None:
    """Have XLA keep what it compiles in `directory` and load it from there next time.

    TensorFlow's persistent cache (the tf_xla_persistent_cache_directory flag,
    tensorflow/compiler/jit/flags.cc): a learner's first call then loads its compiled train
    step instead of compiling it again (`python benchmarks/learner_throughput.py` measures
    both). XLA reads its flags at the first compile, so this is set before one. A directory
    the user already gave XLA in TF_XLA_FLAGS is kept, and left alone: None. Entries beyond
    XLA_CACHE_MAX_BYTES go, oldest first. OSError if the directory cannot be made or read."""
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if "tf_xla_persistent_cache_directory" in flags:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for entry in directory.iterdir():
        with contextlib.suppress(OSError):  # gone meanwhile: another learner's pruning
            stat = entry.stat()
            entries.append((stat.st_mtime, stat.st_size, entry))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries):
        if total <= XLA_CACHE_MAX_BYTES:
            break
        with contextlib.suppress(OSError):
            entry.unlink()
        total -= size
    os.environ["TF_XLA_FLAGS"] = f"{flags} --tf_xla_persistent_cache_directory={directory}".strip()
    return directory


def tf_gpus() -> list:
    """The GPUs TensorFlow places ops on in this process."""
    import tensorflow as tf

    return tf.config.list_logical_devices("GPU")


def configure_tensorflow(num_threads: int | None = None, lean: bool = False,
                         xla_cache: bool = False) -> list[str]:
    """Import TensorFlow quietly, optionally cap its CPU threads; returns the visible GPUs.

    lean: for a process that only trains (the learner's): Keras is imported without pandas
    and matplotlib, so its DataFrame inputs and plotting helpers stay unavailable in it.
    xla_cache: keep XLA's compiled steps on disk (default_xla_cache_dir), for the next start.
    """
    global _xla_cache_dir
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    no_cache = None
    with _quiet_native_stderr(), _hidden(KERAS_OPTIONAL if lean else ()):
        import keras  # noqa: F401  (TensorFlow imports it too: this keeps that inside the block)
        import tensorflow as tf

        if xla_cache:  # before listing devices, which has XLA read its flags
            directory = default_xla_cache_dir(tf.__version__)
            try:
                _xla_cache_dir = _enable_xla_cache(directory)
            except OSError as e:  # a read-only or full home: compile each start, as without
                _xla_cache_dir = None
                no_cache = f"distrl: no XLA cache in {directory} ({e}); compiling each start"
        # Before anything initialises TensorFlow's runtime (listing devices does): afterwards
        # the thread pools are fixed at one thread per core, and on a small machine the extra
        # threads compete with the actors for the cores Ray gave them.
        if num_threads:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(num_threads)
                tf.config.threading.set_inter_op_parallelism_threads(num_threads)
            except RuntimeError:  # already initialised in this process: keep what it has
                pass
        gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if no_cache:  # after the block, whose stderr goes nowhere
        print(no_cache, file=sys.stderr)
    return gpus


class Learner:
    """Owns the online and target networks and the optimizer; knows nothing of Ray."""

    def __init__(self, config: ApexConfig, spec: NetworkSpec, weights: list[np.ndarray]):
        import keras

        self.config, self.spec = config, spec
        self._obs_shape = spec.image_shape or (spec.obs_size,)  # what the network takes
        # Images arrive as replay keeps them, uint8 (a quarter of float32's bytes to copy in).
        self._obs_dtype = np.uint8 if spec.image_shape else np.float32
        self.online = build_keras_model(spec, weights)
        self.target = build_keras_model(spec, weights)
        self.optimizer = keras.optimizers.Adam(learning_rate=config.learning_rate,
                                               epsilon=config.adam_epsilon)
        self.optimizer.build(self.online.trainable_variables)
        self.updates = 0
        # The target network's variables, paired with the online network's by layer name.
        self._pairs = [(t, o) for name in spec.layer_names()
                       for t, o in zip(self.target.get_layer(name).weights,
                                       self.online.get_layer(name).weights)]
        jit = config.jit_compile
        self.uses_xla = jit if jit is not None else (
            not spec.conv_layers or bool(tf_gpus()))  # see ApexConfig.jit_compile
        self._train_steps = self._trace()
        self._shapes_run: set[tuple[int, int]] = set()  # (batches, batch size) XLA has built
        self._cache_cleared = False

    def _trace(self):
        """The train steps, traced once for any number of batches of any size: calling the
        concrete function skips tf.function's per-call dispatch on its arguments. Without
        AutoGraph: the loop is an explicit tf.while_loop, so there is no Python source to
        convert (time on the learner's start-up, and a generated file in the temp folder that
        a killed learner never deletes)."""
        import tensorflow as tf

        obs = tf.TensorSpec([None, None, *self._obs_shape], tf.as_dtype(self._obs_dtype))
        column = tf.TensorSpec([None, None], tf.float32)
        return tf.function(self._steps, jit_compile=self.uses_xla,
                           autograph=False).get_concrete_function(
            obs, tf.TensorSpec([None, None], tf.int32), column, column, obs, column,
            tf.TensorSpec([None], tf.bool))

    def _steps(self, obs, action, reward, discount, next_obs, weights, copy_target):
        """len(obs) gradient steps in a row, one per batch (inputs stacked on a first axis);
        after step k the target network takes the online weights where copy_target[k]."""
        import tensorflow as tf

        num = tf.shape(obs)[0]

        def body(k, *outputs):
            step = self._step(obs[k], action[k], reward[k], discount[k], next_obs[k], weights[k])
            outputs = [out.write(k, value) for out, value in zip(outputs, step)]
            for target, online in self._pairs:  # an exact copy where asked, else unchanged
                target.assign(tf.where(copy_target[k], online, target))
            return (k + 1, *outputs)

        # A graph loop, not an unrolled one: the step is traced (and compiled) once.
        _, *outputs = tf.while_loop(lambda k, *_: k < num, body, (
            tf.constant(0), *(tf.TensorArray(tf.float32, size=num) for _ in range(4))))
        return [out.stack() for out in outputs]

    def _step(self, obs, action, reward, discount, next_obs, weights):
        import keras
        import tensorflow as tf

        obs, next_obs = tf.cast(obs, tf.float32), tf.cast(next_obs, tf.float32)
        next_online = self.online(next_obs, training=False)
        best_next = tf.argmax(next_online, axis=1, output_type=tf.int32)
        next_target = self.target(next_obs, training=False)
        bootstrap = tf.gather(next_target, best_next, axis=1, batch_dims=1)
        y = tf.stop_gradient(reward + discount * bootstrap)
        with tf.GradientTape() as tape:
            q = self.online(obs, training=True)
            q_taken = tf.gather(q, action, axis=1, batch_dims=1)
            td = y - q_taken
            huber = keras.losses.Huber(delta=self.config.huber_delta, reduction=None)
            per_sample = huber(y[:, None], q_taken[:, None])
            loss = tf.reduce_mean(weights * per_sample)
        variables = self.online.trainable_variables
        grads = tape.gradient(loss, variables)
        grads, grad_norm = tf.clip_by_global_norm(grads, self.config.max_grad_norm)
        self.optimizer.apply_gradients(zip(grads, variables))
        return loss, tf.abs(td), grad_norm, tf.reduce_mean(q_taken)

    def update(self, batch: SampledBatch) -> tuple[float, np.ndarray, dict]:
        """One gradient step; returns loss, new |TD| priorities and a few diagnostics."""
        losses, td_abs, diag = self.update_many(batch.take(np.newaxis))  # a stack of one
        return float(losses[0]), td_abs[0], {k: float(v[0]) for k, v in diag.items()}

    def update_many(self, stack: SampledBatch) -> tuple[np.ndarray, np.ndarray, dict]:
        """One gradient step per batch of a stack (PrioritizedReplay.sample_many), in order,
        exactly as that many update() calls (the target network follows the online one at the
        same steps), but in one call into the graph: for a network this small the per-call
        cost (converting inputs, dispatch) is a large part of each step, paid once here
        (`python benchmarks/learner_throughput.py` measures it). Returns the losses
        (num_batches,), new |TD| priorities (num_batches, batch_size) and diagnostics, one
        value per batch."""
        import tensorflow as tf

        t = stack.transitions
        num, size = t.action.shape[:2]
        period = self.config.target_update_period
        copy_target = [(self.updates + k + 1) % period == 0 for k in range(num)]
        if t.obs.shape[2:] != self._obs_shape or t.next_obs.shape[2:] != self._obs_shape:
            raise ValueError(f"batch observations of shape {t.obs.shape[2:]}; this learner takes "
                             f"{self._obs_shape}, as replay samples them")
        inputs = [tf.constant(a) for a in (
            t.obs.astype(self._obs_dtype, copy=False),
            t.action.astype(np.int32, copy=False), t.reward.astype(np.float32, copy=False),
            t.discount.astype(np.float32, copy=False),
            t.next_obs.astype(self._obs_dtype, copy=False),
            stack.weights.astype(np.float32, copy=False), np.array(copy_target))]
        # A shape not run yet: XLA compiles the step for it, or loads it from the cache.
        new_shape = (num, size) not in self._shapes_run
        with _native_stderr_without(XLA_CACHE_NOISE) if new_shape else contextlib.nullcontext():
            try:
                losses, td_abs, grad_norms, mean_qs = self._train_steps(*inputs)
            except tf.errors.OpError as e:
                if _xla_cache_dir is None or self._cache_cleared:
                    raise
                self._retrace_without_the_cache(e)
                losses, td_abs, grad_norms, mean_qs = self._train_steps(*inputs)
        if new_shape:
            self._shapes_run.add((num, size))
        self.updates += num
        return losses.numpy(), td_abs.numpy(), {"grad_norm": grad_norms.numpy(),
                                                "mean_q": mean_qs.numpy()}

    def _retrace_without_the_cache(self, error) -> None:
        """After an XLA cache entry that does not load (damaged, or written by another build):
        XLA keeps that failure for this trace and does not say which entry it was, so every
        entry goes and the step is traced (and compiled) afresh, once per learner."""
        print(f"distrl: XLA could not load a cached train step ({error.message}); clearing "
              f"{_xla_cache_dir} and compiling it again", file=sys.stderr)
        for entry in _xla_cache_dir.glob("*"):
            with contextlib.suppress(OSError):
                entry.unlink()
        self._cache_cleared = True
        self._train_steps = self._trace()
        self._shapes_run.clear()

    def beta(self) -> float:
        """Importance-sampling exponent, annealed linearly over beta_anneal_updates."""
        c = self.config
        frac = min(1.0, self.updates / c.beta_anneal_updates)
        return c.priority_beta + frac * (c.priority_beta_final - c.priority_beta)

    def get_weights(self) -> list[np.ndarray]:
        return get_keras_weights(self.online, self.spec)

    # --- checkpoints: one .npz of arrays plus a .json of counters and config, in a local
    # directory or under any fsspec URI (gs://bucket/run/checkpoints) ---

    def save_checkpoint(self, directory: str | os.PathLike, extra: dict | None = None,
                        keep: int = 3) -> str:
        """Write checkpoint-<updates>.npz (+ .json) under directory; returns its path or URI."""
        return write_checkpoint(directory, self.snapshot(extra), keep)

    def snapshot(self, extra: dict | None = None) -> tuple[dict, dict[str, np.ndarray]]:
        """(metadata, arrays) of the current state, copied: cheap, and safe to write to disk
        (or a bucket) while training goes on."""
        arrays = {f"online_{i}": w for i, w in enumerate(self.get_weights())}
        arrays |= {f"target_{i}": w for i, w in enumerate(get_keras_weights(self.target,
                                                                            self.spec))}
        arrays |= {f"optimizer_{i}": np.asarray(v).copy() for i, v in
                   enumerate(self.optimizer.variables)}
        meta = {"updates": self.updates, "config": self.config.to_dict(), **(extra or {})}
        return meta, arrays

    def restore_checkpoint(self, path: str | os.PathLike) -> dict:
        """Weights, target network, optimizer state and counters from a checkpoint; returns
        its metadata (updates, config and whatever extra the writer added)."""
        meta, arrays = read_checkpoint(path)
        count = len(self.spec.weight_shapes())
        set_keras_weights(self.online, self.spec, [arrays[f"online_{i}"] for i in range(count)])
        set_keras_weights(self.target, self.spec, [arrays[f"target_{i}"] for i in range(count)])
        for i, var in enumerate(self.optimizer.variables):
            var.assign(arrays[f"optimizer_{i}"])
        self.updates = int(meta["updates"])
        return meta


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
    try:
        with fs.open(name, "rb") as f, np.load(io.BytesIO(f.read())) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"checkpoint {path!s} cannot be read ({type(err).__name__}: "
                              f"{err})") from None
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


def resolve_resume(resume: str, checkpoint_dir: str) -> str:
    """The path find_resume picks."""
    return find_resume(resume, checkpoint_dir).path


def check_checkpoint_network(arrays: dict, spec, path: str) -> None:
    """The checkpoint's online network has the layers spec builds, or a CheckpointError that
    names both (before any process starts)."""
    want = spec.weight_shapes()
    got = [tuple(arrays[f"online_{i}"].shape) for i in range(len(arrays))
           if f"online_{i}" in arrays]
    if got != want:
        raise CheckpointError(
            f"checkpoint {path} holds a network of weight shapes {got}, and this config builds "
            f"{want} (obs shape {spec.image_shape or (spec.obs_size,)}, conv layers "
            f"{list(spec.conv_layers)}, hidden_sizes {list(spec.hidden_sizes)}, "
            f"{spec.num_actions} actions, dueling={spec.dueling}): resume it with the "
            "settings it was written with (its .json has them), or start a new run")


def double_dqn_reference(online_q_next, target_q_next, q, action, reward, discount):
    """The targets and |TD| in plain numpy, for tests and for readers checking the maths."""
    best = online_q_next.argmax(axis=1)
    y = reward + discount * target_q_next[np.arange(len(best)), best]
    td = y - q[np.arange(len(action)), action]
    return y, np.abs(td)
