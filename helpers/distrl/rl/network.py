"""The dueling Q-network: one list of layers, two implementations.

The learner trains a Keras model; actors and the evaluator run the same weights through a
numpy forward pass, because for the small batches an actor feeds, numpy costs microseconds
where a Keras call costs milliseconds, and an actor process never has to import TensorFlow.

NetworkSpec.layers is the network: both passes, the weight shapes, the layer names and the
initial weights walk it, so a change of torso or head is a change here only. Flat
observations go straight to the dense layers. Image observations (height, width, channels) go
through a convolutional torso first: NATURE_TORSO, the Nature DQN's for 84x84 Atari frames
(Mnih et al. 2015, Methods), or SMALL_TORSO for small grids such as MinAtar's 10x10 (Young &
Tian 2019, section 4). Convolutions are Keras' Conv2D: channels last, "valid" padding, ReLU,
kernels shaped (kernel, kernel, in channels, filters).

Weights are a flat list of numpy arrays, a kernel and a bias per layer in the order of
NetworkSpec.layers: conv_0 ... (images only), hidden_0 ..., then value and advantage (dueling)
or q (plain).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

# (filters, kernel size, stride) of each convolution.
NATURE_TORSO = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # then a dense layer of 512
SMALL_TORSO = ((16, 3, 1),)  # then a dense layer of 128


@dataclass(frozen=True)
class Layer:
    """One layer with weights: a convolution (stride > 0) or a dense layer; a head is a dense
    layer without ReLU that reads the last hidden layer (the dueling value and advantage)."""

    name: str
    kernel: tuple[int, ...]  # (k, k, in channels, filters), or (inputs, units)
    out: tuple[int, ...]     # one observation's output: (height, width, filters), or (units,)
    stride: int = 0
    head: bool = False

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 for one observation."""
        return 2 * math.prod(self.kernel) * math.prod(self.out[:-1])


@dataclass(frozen=True)
class NetworkSpec:
    """What defines the Q-network: observations of obs_shape (a vector, or an image of height,
    width and channels, which needs conv_layers), num_actions outputs."""

    obs_shape: tuple[int, ...]
    num_actions: int
    hidden_sizes: tuple[int, ...] = (64, 64)
    dueling: bool = True
    conv_layers: tuple[tuple[int, int, int], ...] = ()
    input_scale: float = 1.0  # observations are multiplied by it first: 1/255 for uint8 frames

    def __post_init__(self):
        shape = self.obs_shape
        if (not isinstance(shape, tuple) or len(shape) not in (1, 3)
                or not all(isinstance(s, (int, np.integer)) and s >= 1 for s in shape)):
            raise ValueError(f"obs_shape={shape!r} is invalid: expected (size,) of a vector or "
                             "(height, width, channels) of an image")
        object.__setattr__(self, "obs_shape", tuple(int(s) for s in shape))
        if bool(self.conv_layers) != (len(shape) == 3):
            raise ValueError(f"conv_layers={self.conv_layers!r} with obs_shape={shape!r}: a "
                             "convolutional torso needs image observations (height, width, "
                             "channels), and images need one")
        self.layers  # noqa: B018 (a kernel that does not fit raises here)

    @functools.cached_property
    def layers(self) -> tuple[Layer, ...]:
        """Every layer with weights, in weight-list order."""
        layers, out = [], self.obs_shape
        for i, (filters, kernel, stride) in enumerate(self.conv_layers):
            height, width, channels = out
            out = ((height - kernel) // stride + 1, (width - kernel) // stride + 1, filters)
            if out[0] < 1 or out[1] < 1:
                raise ValueError(f"conv_{i}'s {kernel}x{kernel} kernel does not fit its "
                                 f"{height}x{width} input (conv_layers={self.conv_layers!r} "
                                 f"on a {self.obs_shape[0]}x{self.obs_shape[1]} image)")
            layers.append(Layer(f"conv_{i}", (kernel, kernel, channels, filters), out, stride))
        width = math.prod(out)  # the torso's output, flattened
        for i, units in enumerate(self.hidden_sizes):
            layers.append(Layer(f"hidden_{i}", (width, units), (units,)))
            width = units
        heads = (("value", 1), ("advantage", self.num_actions)) if self.dueling else (
            ("q", self.num_actions),)
        return tuple(layers + [Layer(name, (width, units), (units,), head=True)
                               for name, units in heads])

    @property
    def is_image(self) -> bool:
        return len(self.obs_shape) == 3

    @property
    def input_dtype(self) -> type:
        """What observations travel and are stored as: images uint8 (a quarter of float32's
        bytes), vectors float32."""
        return np.uint8 if self.is_image else np.float32

    def weight_shapes(self) -> list[tuple[int, ...]]:
        """The shape of every array of the weight list, in order."""
        return [shape for layer in self.layers for shape in (layer.kernel, layer.out[-1:])]

    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def forward_flops(self, batch_size: int = 1) -> int:
        """Multiply-adds x 2 of one forward pass (the dueling combine is negligible)."""
        return batch_size * sum(layer.flops for layer in self.layers)

    @property
    def name(self) -> str:
        """The rl.model.name of telemetry: e.g. dueling-mlp-64x64, dueling-conv16k3s1-mlp-128."""
        convs = "".join(f"conv{filters}k{kernel}s{stride}-"
                        for filters, kernel, stride in self.conv_layers)
        return (f"{'dueling-' if self.dueling else ''}{convs}mlp-"
                f"{'x'.join(map(str, self.hidden_sizes))}")

    def q_values(self, weights: list[np.ndarray], obs: np.ndarray,
                 conv=None) -> np.ndarray:
        """Q-values of a batch of observations in numpy, float32, (batch, num_actions): the
        actors' every step. conv: another convolution (benchmarks/conv_forward.py)."""
        conv = conv or conv2d_relu
        h = np.asarray(obs, dtype=np.float32)
        if self.input_scale != 1.0 and self.conv_layers:  # once in the first kernel, not per pixel
            weights = [weights[0] * np.float32(self.input_scale), *weights[1:]]
        elif self.input_scale != 1.0:
            h = h * np.float32(self.input_scale)
        heads = []
        for layer, kernel, bias in zip(self.layers, weights[::2], weights[1::2]):
            if layer.stride:
                h = conv(h, kernel, bias, layer.stride)
                continue
            if h.ndim > 2:
                h = h.reshape(len(h), -1)
            if layer.head:
                heads.append(h @ kernel + bias)
            else:
                h = h @ kernel + bias
                np.maximum(h, 0.0, out=h)
        return _combine(heads, np.mean)


def _combine(heads: list, mean):
    """Q from the heads: Q = V + A - mean(A) (dueling, Wang et al. 2016, eq. 9), or Q."""
    if len(heads) == 1:
        return heads[0]
    value, advantage = heads
    return value + advantage - mean(advantage, axis=1, keepdims=True)


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
    """The same network in Keras, walking the same layers (imports TensorFlow: call it in the
    learner only)."""
    import keras

    inputs = keras.Input(shape=spec.obs_shape, name="obs")
    h = inputs
    if spec.input_scale != 1.0:
        h = keras.layers.Rescaling(spec.input_scale, name="scale")(h)
    heads = []
    for layer in spec.layers:
        if layer.stride:
            h = keras.layers.Conv2D(layer.kernel[-1], layer.kernel[0], strides=layer.stride,
                                    activation="relu", name=layer.name)(h)
            continue
        if len(h.shape) > 2:
            h = keras.layers.Flatten(name="flatten")(h)
        dense = keras.layers.Dense(layer.kernel[-1], activation=None if layer.head else "relu",
                                   name=layer.name)
        if layer.head:
            heads.append(dense(h))
        else:
            h = dense(h)
    model = keras.Model(inputs, _combine(heads, keras.ops.mean),
                        name="dueling_q" if spec.dueling else "q")
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
