"""The learner: n-step double DQN with a target network, Huber loss and new priorities.

    learner = Learner(config, spec, initial_weights)
    loss, td_abs, diag = learner.update(batch)  # one gradient step on a SampledBatch
    losses, td_abs, diag = learner.update_many(replay.sample_many(128, 8))  # 8, in one call
    weights = learner.get_weights()            # numpy, versioned by learner.updates
    learner.save_checkpoint(directory)          # checkpoints.py writes it

TensorFlow's process set-up (quiet import, threads, XLA's cache) is tf_runtime.py's.

Target (double DQN, Van Hasselt et al. 2016, with n-step returns as in Ape-X):
    a* = argmax_a Q_online(s', a);   y = R + discount * Q_target(s', a*)
where discount is gamma^n, gamma^k for an episode truncated after k steps, or 0 if it terminated.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from distrl.rl import tf_runtime
from distrl.rl.checkpoints import read_checkpoint, write_checkpoint
from distrl.rl.config import ApexConfig
from distrl.rl.frames import channels_first
from distrl.rl.network import NetworkSpec, build_keras_model, get_keras_weights, set_keras_weights
from distrl.rl.transitions import SampledBatch


class Learner:
    """Owns the online and target networks and the optimizer; knows nothing of Ray."""

    def __init__(self, config: ApexConfig, spec: NetworkSpec, weights: list[np.ndarray]):
        import keras

        self.config, self.spec = config, spec
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
            not spec.conv_layers or bool(tf_runtime.tf_gpus()))  # see ApexConfig.jit_compile
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

        obs = tf.TensorSpec([None, None, *channels_first(self.spec.obs_shape)],
                            tf.as_dtype(self.spec.input_dtype))
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
        if self.spec.is_image:  # channels first, as replay sends the planes: move them last
            obs, next_obs = (tf.transpose(o, [0, 2, 3, 1]) for o in (obs, next_obs))
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
        takes = channels_first(self.spec.obs_shape)
        if t.obs.shape[2:] != takes or t.next_obs.shape[2:] != takes:
            raise ValueError(f"batch observations of shape {t.obs.shape[2:]}; this learner takes "
                             f"{takes}, as replay samples them")
        inputs = [tf.constant(a) for a in (
            t.obs.astype(self.spec.input_dtype, copy=False),
            t.action.astype(np.int32, copy=False), t.reward.astype(np.float32, copy=False),
            t.discount.astype(np.float32, copy=False),
            t.next_obs.astype(self.spec.input_dtype, copy=False),
            stack.weights.astype(np.float32, copy=False), np.array(copy_target))]
        # A shape not run yet: XLA compiles the step for it, or loads it from the cache.
        new_shape = (num, size) not in self._shapes_run
        with (tf_runtime.native_stderr_without(tf_runtime.FIRST_CALL_NOISE) if new_shape
              else contextlib.nullcontext()):
            try:
                losses, td_abs, grad_norms, mean_qs = self._train_steps(*inputs)
            except tf.errors.OpError as e:
                # Only a shape's first call loads from XLA's cache: any other error (an
                # out-of-memory at update 50,000) is the error it is.
                if not new_shape or tf_runtime.xla_cache_dir() is None or self._cache_cleared:
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
        tf_runtime.clear_xla_cache(f"XLA could not load a cached train step ({error.message})")
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

    # --- checkpoints (checkpoints.py): the state as arrays, and back ---

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
        arrays |= {_optimizer_key(v): np.asarray(v).copy() for v in self.optimizer.variables}
        meta = {"updates": self.updates, "config": self.config.to_dict(), **(extra or {})}
        return meta, arrays

    def restore_checkpoint(self, path: str | os.PathLike) -> dict:
        """Weights, target network, optimizer state and counters from a checkpoint; returns
        its metadata (updates, config and whatever extra the writer added). The learning rate
        stays this learner's: Keras keeps it among the optimizer's variables, and a resume
        with a new learning_rate must train at it."""
        meta, arrays = read_checkpoint(path)
        count = len(self.spec.weight_shapes())
        set_keras_weights(self.online, self.spec, [arrays[f"online_{i}"] for i in range(count)])
        set_keras_weights(self.target, self.spec, [arrays[f"target_{i}"] for i in range(count)])
        for i, var in enumerate(self.optimizer.variables):
            if var.name == "learning_rate":
                continue  # the configured rate, as results.json reports it
            # By name; a checkpoint from before names (optimizer_<i>) by position.
            var.assign(arrays.get(_optimizer_key(var), arrays.get(f"optimizer_{i}")))
        self.updates = int(meta["updates"])
        return meta


def _optimizer_key(variable) -> str:
    """An optimizer variable's name in a checkpoint: its Keras name ("hidden_0_kernel_momentum",
    "iteration"), which names the layer, so a restore never depends on the variables' order
    (nor on the optimizer's own name, which Keras numbers per process: adam, adam_1, ...)."""
    return f"optimizer.{variable.name}"
