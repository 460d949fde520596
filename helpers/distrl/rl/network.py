"""The dueling Q-network: one weight layout, two implementations.

The learner trains a Keras model; actors and the evaluator run the same weights through a
numpy forward pass, because for the small batches an actor feeds, numpy costs microseconds
where a Keras call costs milliseconds, and an actor process never has to import TensorFlow.

Flat observations go straight to the dense layers. Image observations (height, width,
channels) go through a convolutional torso first: NATURE_TORSO, the Nature DQN's for 84x84
Atari frames (Mnih et al. 2015, Methods), or SMALL_TORSO for small grids such as MinAtar's 10x10
(Young & Tian 2019, section 4). Convolutions are Keras' Conv2D: channels last, "valid" padding,
ReLU, kernels shaped (kernel, kernel, in channels, filters).

Weights are a flat list of numpy arrays in this order:
    conv_0 kernel, conv_0 bias, ... (images only), then hidden_0 kernel, hidden_0 bias, ...,
    then value kernel, value bias, advantage kernel, advantage bias (dueling) or q kernel,
    q bias (plain).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# (filters, kernel size, stride) of each convolution.
NATURE_TORSO = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # then a dense layer of 512
SMALL_TORSO = ((16, 3, 1),)  # then a dense layer of 128


@dataclass(frozen=True)
class NetworkSpec:
    """Shapes that define the Q-network. With conv_layers, observations are images of
    image_shape (height, width, channels), and obs_size is their size flattened."""

    obs_size: int
    num_actions: int
    hidden_sizes: tuple[int, ...] = (64, 64)
    dueling: bool = True
    conv_layers: tuple[tuple[int, int, int], ...] = ()
    image_shape: tuple[int, int, int] | None = None
    input_scale: float = 1.0  # observations are multiplied by it first: 1/255 for uint8 frames

    def __post_init__(self):
        if bool(self.conv_layers) != (self.image_shape is not None):
            raise ValueError(f"conv_layers={self.conv_layers!r} with image_shape="
                             f"{self.image_shape!r}: a convolutional torso needs image "
                             "observations (height, width, channels), and images need one")
        if self.image_shape is not None:
            if len(self.image_shape) != 3 or int(np.prod(self.image_shape)) != self.obs_size:
                raise ValueError(f"image_shape={self.image_shape!r} is invalid: expected "
                                 f"(height, width, channels) of obs_size={self.obs_size} values")
            size = self.image_shape[:2]
            for name, (_, kernel, _, _), _, out in self.conv_shapes():
                if out[0] < 1 or out[1] < 1:
                    raise ValueError(f"{name}'s {kernel}x{kernel} kernel does not fit its "
                                     f"{size[0]}x{size[1]} input (conv_layers="
                                     f"{self.conv_layers!r} on a {self.image_shape[0]}x"
                                     f"{self.image_shape[1]} image)")
                size = out[:2]

    def conv_shapes(self) -> list[tuple[str, tuple[int, int, int, int], int, tuple[int, int, int]]]:
        """(name, kernel shape, stride, output shape) for every convolution, in order."""
        if self.image_shape is None:
            return []
        shapes, (height, width, channels) = [], self.image_shape
        for i, (filters, kernel, stride) in enumerate(self.conv_layers):
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
            shapes.append((f"conv_{i}", (kernel, kernel, channels, filters), stride,
                           (height, width, filters)))
            channels = filters
        return shapes

    def torso_size(self) -> int:
        """How many values the dense layers get: the last convolution's output, flattened."""
        convs = self.conv_shapes()
        return int(np.prod(convs[-1][3])) if convs else self.obs_size

    def layer_shapes(self) -> list[tuple[str, int, int]]:
        """(name, inputs, outputs) for every dense layer, in weight-list order."""
        shapes, width = [], self.torso_size()
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
        conv = sum(int(np.prod(kernel)) * out[0] * out[1] for _, kernel, _, out in self.conv_shapes())
        return 2 * batch_size * (conv + sum(i * o for _, i, o in self.layer_shapes()))

    def layer_names(self) -> list[str]:
        """Every layer with weights, convolutions first, in weight-list order (two arrays each)."""
        return [c[0] for c in self.conv_shapes()] + [d[0] for d in self.layer_shapes()]

    def weight_shapes(self) -> list[tuple[int, ...]]:
        """The shape of every array of the weight list, in order."""
        conv = [s for _, kernel, _, _ in self.conv_shapes() for s in (kernel, (kernel[3],))]
        return conv + [s for _, i, o in self.layer_shapes() for s in ((i, o), (o,))]

    @property
    def name(self) -> str:
        """The rl.model.name of telemetry: e.g. dueling-mlp-64x64, dueling-conv16k3s1-mlp-128."""
        convs = "".join(f"conv{filters}k{kernel}s{stride}-"
                        for filters, kernel, stride in self.conv_layers)
        return (f"{'dueling-' if self.dueling else ''}{convs}mlp-"
                f"{'x'.join(map(str, self.hidden_sizes))}")

    @functools.cached_property
    def conv_strides(self) -> tuple[int, ...]:
        return tuple(stride for _, _, stride, _ in self.conv_shapes())

    def q_values(self, weights: list[np.ndarray], obs: np.ndarray) -> np.ndarray:
        """numpy_q_values for this network (the actors' every step: nothing recomputed)."""
        return numpy_q_values(weights, obs, self.dueling, self.conv_strides, self.input_scale)


def init_weights(spec: NetworkSpec, seed: int = 0) -> list[np.ndarray]:
    """Glorot-uniform kernels and zero biases (Keras' Dense and Conv2D defaults; a kernel's
    fans count its receptive field), from a seed."""
    rng = np.random.default_rng(seed)
    weights = []
    for shape in spec.weight_shapes():
        if len(shape) == 1:
            weights.append(np.zeros(shape, dtype=np.float32))
            continue
        receptive = int(np.prod(shape[:-2]))
        limit = np.sqrt(6.0 / (receptive * (shape[-2] + shape[-1])))
        weights.append(rng.uniform(-limit, limit, shape).astype(np.float32))
    return weights


def check_weights(spec: NetworkSpec, weights: list[np.ndarray]) -> None:
    expected = spec.weight_shapes()
    got = [tuple(np.shape(w)) for w in weights]
    if got != expected:
        raise ValueError(f"weights have shapes {got}; the network {spec} expects {expected}")


def numpy_q_values(weights: list[np.ndarray], obs: np.ndarray, dueling: bool = True,
                   conv_strides: tuple[int, ...] = (), input_scale: float = 1.0) -> np.ndarray:
    """Q-values for a batch of observations, float32, shape (batch, num_actions). With
    conv_strides (one per convolution: NetworkSpec.q_values passes them), obs are images
    (batch, height, width, channels)."""
    h = np.asarray(obs, dtype=np.float32)
    if input_scale != 1.0 and conv_strides:  # scaled once in the first kernel, not per pixel
        weights = [weights[0] * np.float32(input_scale), *weights[1:]]
    elif input_scale != 1.0:
        h = h * np.float32(input_scale)
    if conv_strides:
        for i, stride in enumerate(conv_strides):
            h = conv2d_relu(h, weights[2 * i], weights[2 * i + 1], stride)
        weights = weights[2 * len(conv_strides):]
    h = h.reshape(len(h), -1)
    num_hidden = len(weights) // 2 - (2 if dueling else 1)
    for i in range(num_hidden):
        h = h @ weights[2 * i] + weights[2 * i + 1]
        np.maximum(h, 0.0, out=h)
    if not dueling:
        return h @ weights[-2] + weights[-1]
    value = h @ weights[-4] + weights[-3]
    advantage = h @ weights[-2] + weights[-1]
    return value + advantage - advantage.mean(axis=1, keepdims=True)


def conv2d_relu(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """relu(conv2d(x) + bias) of a batch of images (batch, height, width, channels), "valid"
    padding: the windows copied into one matrix (im2col), then one matrix product. Chosen on
    `python benchmarks/conv_forward.py`, which compares it with two other numpy ways and Keras
    (benchmarks/results/conv_forward.txt)."""
    k, _, channels, filters = kernel.shape
    windows = sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride]
    batch, out_h, out_w = windows.shape[:3]
    cols = windows.transpose(0, 1, 2, 4, 5, 3).reshape(batch * out_h * out_w, k * k * channels)
    out = cols @ kernel.reshape(k * k * channels, filters)
    out += bias
    return np.maximum(out, 0.0, out=out).reshape(batch, out_h, out_w, filters)


def build_keras_model(spec: NetworkSpec, weights: list[np.ndarray] | None = None):
    """The same network in Keras (imports TensorFlow: call it in the learner only)."""
    import keras

    inputs = keras.Input(shape=spec.image_shape or (spec.obs_size,), name="obs")
    h = inputs
    if spec.input_scale != 1.0:
        h = keras.layers.Rescaling(spec.input_scale, name="scale")(h)
    for name, (k, _, _, filters), stride, _ in spec.conv_shapes():
        h = keras.layers.Conv2D(filters, k, strides=stride, activation="relu", name=name)(h)
    if spec.conv_layers:
        h = keras.layers.Flatten(name="flatten")(h)
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
    for name in spec.layer_names():
        kernel, bias = model.get_layer(name).get_weights()
        out += [np.asarray(kernel, np.float32), np.asarray(bias, np.float32)]
    return out


def set_keras_weights(model, spec: NetworkSpec, weights: list[np.ndarray]) -> None:
    check_weights(spec, weights)
    for i, name in enumerate(spec.layer_names()):
        model.get_layer(name).set_weights([weights[2 * i], weights[2 * i + 1]])
