"""The learner: n-step double DQN with a target network, Huber loss and new priorities.

    learner = Learner(config, spec, initial_weights)
    loss, td_abs = learner.update(batch)       # one tf.function step on a SampledBatch
    weights = learner.get_weights()            # numpy, versioned by learner.updates
    learner.save_checkpoint(directory)

Target (double DQN, Van Hasselt et al. 2016, with n-step returns as in Ape-X):
    a* = argmax_a Q_online(s', a);   y = R + discount * Q_target(s', a*)
where discount is gamma^n, gamma^k for an episode truncated after k steps, or 0 if it terminated.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

from distrl.config import ApexConfig
from distrl.network import NetworkSpec, build_keras_model, get_keras_weights, set_keras_weights
from distrl.replay import SampledBatch

CHECKPOINT_RE = re.compile(r"checkpoint-(\d{9})\.npz$")


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence C++ log lines written straight to fd 2 (Python exceptions still propagate).

    TensorFlow prints its oneDNN and "no CUDA driver" notices from C++ before its log level
    applies, once per process; in a Ray cluster every line reaches the driver's output.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def configure_tensorflow(num_threads: int | None = None) -> list[str]:
    """Import TensorFlow quietly, optionally cap its CPU threads; returns the visible GPUs."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with _quiet_native_stderr():
        import tensorflow as tf

        gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if num_threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(num_threads)
            tf.config.threading.set_inter_op_parallelism_threads(num_threads)
        except RuntimeError:  # already initialised in this process: keep what it has
            pass
    return gpus


class Learner:
    """Owns the online and target networks and the optimizer; knows nothing of Ray."""

    def __init__(self, config: ApexConfig, spec: NetworkSpec, weights: list[np.ndarray]):
        import keras
        import tensorflow as tf

        self.config, self.spec = config, spec
        self.online = build_keras_model(spec, weights)
        self.target = build_keras_model(spec, weights)
        self.optimizer = keras.optimizers.Adam(learning_rate=config.learning_rate,
                                               epsilon=config.adam_epsilon)
        self.optimizer.build(self.online.trainable_variables)
        self.updates = 0
        self._train_step = tf.function(self._step, jit_compile=config.jit_compile,
                                       reduce_retracing=True)

    def _step(self, obs, action, reward, discount, next_obs, weights):
        import keras
        import tensorflow as tf

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
        t = batch.transitions
        n = len(t)
        loss, td_abs, grad_norm, mean_q = self._train_step(
            t.obs.reshape(n, -1).astype(np.float32, copy=False), t.action.astype(np.int32),
            t.reward, t.discount, t.next_obs.reshape(n, -1).astype(np.float32, copy=False),
            batch.weights)
        self.updates += 1
        if self.updates % self.config.target_update_period == 0:
            self.target.set_weights(self.online.get_weights())
        return float(loss), td_abs.numpy(), {"grad_norm": float(grad_norm),
                                             "mean_q": float(mean_q)}

    def beta(self) -> float:
        """Importance-sampling exponent, annealed linearly over beta_anneal_updates."""
        c = self.config
        frac = min(1.0, self.updates / c.beta_anneal_updates)
        return c.priority_beta + frac * (c.priority_beta_final - c.priority_beta)

    def get_weights(self) -> list[np.ndarray]:
        return get_keras_weights(self.online, self.spec)

    # --- checkpoints: one .npz of arrays plus a .json of counters and config ---

    def save_checkpoint(self, directory: str | os.PathLike, extra: dict | None = None,
                        keep: int = 3) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"checkpoint-{self.updates:09d}.npz"
        arrays = {f"online_{i}": w for i, w in enumerate(self.get_weights())}
        arrays |= {f"target_{i}": w for i, w in enumerate(get_keras_weights(self.target,
                                                                            self.spec))}
        arrays |= {f"optimizer_{i}": np.asarray(v) for i, v in
                   enumerate(self.optimizer.variables)}
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        meta = {"updates": self.updates, "config": self.config.to_dict(), **(extra or {})}
        path.with_suffix(".json").write_text(json.dumps(meta, indent=2))
        os.replace(tmp, path)  # the .npz appears last, whole: its presence marks a checkpoint
        for old in _checkpoints(directory)[:-keep]:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
        return path

    def restore_checkpoint(self, path: str | os.PathLike) -> dict:
        path = Path(path)
        with np.load(path) as data:
            count = len(self.spec.layer_shapes()) * 2
            set_keras_weights(self.online, self.spec, [data[f"online_{i}"] for i in range(count)])
            set_keras_weights(self.target, self.spec, [data[f"target_{i}"] for i in range(count)])
            for i, var in enumerate(self.optimizer.variables):
                var.assign(data[f"optimizer_{i}"])
        meta = json.loads(path.with_suffix(".json").read_text())
        self.updates = int(meta["updates"])
        return meta


def _checkpoints(directory: str | os.PathLike) -> list[Path]:
    return sorted(p for p in Path(directory).glob("checkpoint-*.npz") if CHECKPOINT_RE.search(p.name))


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    found = _checkpoints(directory)
    return found[-1] if found else None


def double_dqn_reference(online_q_next, target_q_next, q, action, reward, discount):
    """The targets and |TD| in plain numpy, for tests and for readers checking the maths."""
    best = online_q_next.argmax(axis=1)
    y = reward + discount * target_q_next[np.arange(len(best)), best]
    td = y - q[np.arange(len(action)), action]
    return y, np.abs(td)
