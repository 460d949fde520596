"""The dueling Q-network: one weight layout, two implementations.

The learner trains a Keras model; actors and the evaluator run the same weights through a
numpy forward pass, because for the small batches an actor feeds, numpy costs microseconds
where a Keras call costs milliseconds, and an actor process never has to import TensorFlow.

Weights are a flat list of numpy arrays in this order:
    hidden_0 kernel, hidden_0 bias, ..., then value kernel, value bias, advantage kernel,
    advantage bias (dueling) or q kernel, q bias (plain).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NetworkSpec:
    """Shapes that define the Q-network."""

    obs_size: int
    num_actions: int
    hidden_sizes: tuple[int, ...] = (64, 64)
    dueling: bool = True

    def layer_shapes(self) -> list[tuple[str, int, int]]:
        """(name, inputs, outputs) for every dense layer, in weight-list order."""
        shapes, width = [], self.obs_size
        for i, units in enumerate(self.hidden_sizes):
            shapes.append((f"hidden_{i}", width, units))
            width = units
        if self.dueling:
            shapes += [("value", width, 1), ("advantage", width, self.num_actions)]
        else:
            shapes.append(("q", width, self.num_actions))
        return shapes

    def forward_flops(self, batch_size: int = 1) -> int:
        """Multiply-adds x 2 of one forward pass (the dueling combine is negligible)."""
        return 2 * batch_size * sum(i * o for _, i, o in self.layer_shapes())


def init_weights(spec: NetworkSpec, seed: int = 0) -> list[np.ndarray]:
    """Glorot-uniform kernels and zero biases (Keras' Dense defaults), from a seed."""
    rng = np.random.default_rng(seed)
    weights = []
    for _, fan_in, fan_out in spec.layer_shapes():
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        weights.append(rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32))
        weights.append(np.zeros(fan_out, dtype=np.float32))
    return weights


def check_weights(spec: NetworkSpec, weights: list[np.ndarray]) -> None:
    expected = [s for _, i, o in spec.layer_shapes() for s in ((i, o), (o,))]
    got = [tuple(np.shape(w)) for w in weights]
    if got != expected:
        raise ValueError(f"weights have shapes {got}; the network {spec} expects {expected}")


def numpy_q_values(weights: list[np.ndarray], obs: np.ndarray, dueling: bool = True
                   ) -> np.ndarray:
    """Q-values for a batch of observations, float32, shape (batch, num_actions)."""
    h = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
    num_hidden = len(weights) // 2 - (2 if dueling else 1)
    for i in range(num_hidden):
        h = h @ weights[2 * i] + weights[2 * i + 1]
        np.maximum(h, 0.0, out=h)
    if not dueling:
        return h @ weights[-2] + weights[-1]
    value = h @ weights[-4] + weights[-3]
    advantage = h @ weights[-2] + weights[-1]
    return value + advantage - advantage.mean(axis=1, keepdims=True)


def build_keras_model(spec: NetworkSpec, weights: list[np.ndarray] | None = None):
    """The same network in Keras (imports TensorFlow: call it in the learner only)."""
    import keras

    inputs = keras.Input(shape=(spec.obs_size,), name="obs")
    h = inputs
    for name, _, units in spec.layer_shapes()[: len(spec.hidden_sizes)]:
        h = keras.layers.Dense(units, activation="relu", name=name)(h)
    if spec.dueling:
        value = keras.layers.Dense(1, name="value")(h)
        advantage = keras.layers.Dense(spec.num_actions, name="advantage")(h)
        q = value + advantage - keras.ops.mean(advantage, axis=1, keepdims=True)
    else:
        q = keras.layers.Dense(spec.num_actions, name="q")(h)
    model = keras.Model(inputs, q, name="dueling_q" if spec.dueling else "q")
    if weights is not None:
        set_keras_weights(model, spec, weights)
    return model


def get_keras_weights(model, spec: NetworkSpec) -> list[np.ndarray]:
    """The model's weights in this module's layout (by layer name, not creation order)."""
    out = []
    for name, _, _ in spec.layer_shapes():
        kernel, bias = model.get_layer(name).get_weights()
        out += [np.asarray(kernel, np.float32), np.asarray(bias, np.float32)]
    return out


def set_keras_weights(model, spec: NetworkSpec, weights: list[np.ndarray]) -> None:
    check_weights(spec, weights)
    for i, (name, _, _) in enumerate(spec.layer_shapes()):
        model.get_layer(name).set_weights([weights[2 * i], weights[2 * i + 1]])
