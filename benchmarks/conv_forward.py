"""The convolutional Q-network's forward pass on the actors' side: three numpy ways against
Keras, for the Nature torso on 84x84x4 frames and the small torso on 10x10x4 grids.

    python benchmarks/conv_forward.py [--batch 1 16] [--seconds 2] [--smoke]

im2col: the windows copied into one matrix, then one product (distrl.rl.network.conv2d_relu,
chosen on this benchmark); offsets: one matrix product per kernel offset over a strided view
of the input, no copy; einsum: numpy's einsum over the window view. Keras: the learner's model
on the same batch, on one thread, called eagerly ("keras") and as a `tf.function` graph
("tf.function", the fair Keras baseline: an actor that used Keras would trace its forward pass
once). Every way is timed from the uint8 batch to the numpy Q-values an actor needs. Each
prints ms per batch and its time over im2col's; every way must agree with eager Keras.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from distrl.rl.network import (
    NATURE_TORSO,
    SMALL_TORSO,
    NetworkSpec,
    conv2d_relu,
    init_weights,
)


def conv_offsets(x, kernel, bias, stride):
    k, _, _, filters = kernel.shape
    batch, height, width, _ = x.shape
    out_h, out_w = (height - k) // stride + 1, (width - k) // stride + 1
    out = np.empty((batch, out_h, out_w, filters), dtype=np.float32)
    out[...] = bias
    for i in range(k):
        rows = x[:, i:i + stride * (out_h - 1) + 1:stride]
        for j in range(k):
            out += rows[:, :, j:j + stride * (out_w - 1) + 1:stride] @ kernel[i, j]
    return np.maximum(out, 0.0, out=out)


def conv_einsum(x, kernel, bias, stride):
    k = kernel.shape[0]
    windows = sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride]
    out = np.einsum("bhwcij,ijcf->bhwf", windows, kernel, optimize=True) + bias
    return np.maximum(out, 0.0, out=out)


WAYS = {"im2col": conv2d_relu, "offsets": conv_offsets, "einsum": conv_einsum}


def per_call_ms(fn, seconds: float) -> float:
    fn()  # warm up
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or calls < 3:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.batch, args.seconds = [2], 0.05
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from distrl.rl.network import build_keras_model

    torsos = {"nature 84x84x4": (NATURE_TORSO, (84, 84, 4), (512,), 6),
              "small 10x10x4": (SMALL_TORSO, (10, 10, 4), (128,), 3)}
    rng = np.random.default_rng(0)
    columns = [*WAYS, "keras", "tf.function"]
    print(f"{'torso':<16}{'batch':>6}  " + "".join(f"{w + ' ms':>17}" for w in columns))
    for name, (conv_layers, image, hidden, actions) in torsos.items():
        spec = NetworkSpec(image, actions, hidden, True, conv_layers, 1 / 255)
        weights = init_weights(spec, 0)
        model = build_keras_model(spec, weights)
        graph = tf.function(lambda x, m=model: m(x, training=False))
        for batch in args.batch:
            obs = rng.integers(0, 256, (batch, *image), dtype=np.uint8)
            reference = model(obs.astype(np.float32), training=False).numpy()
            times = {}
            for way, conv in WAYS.items():
                np.testing.assert_allclose(spec.q_values(weights, obs, conv), reference,
                                           rtol=1e-3, atol=1e-4)
                times[way] = per_call_ms(
                    lambda c=conv, s=spec, w=weights, o=obs: s.q_values(w, o, c), args.seconds)
            np.testing.assert_allclose(graph(obs.astype(np.float32)).numpy(), reference,
                                       rtol=1e-3, atol=1e-4)
            times["keras"] = per_call_ms(
                lambda m=model, o=obs: m(o.astype(np.float32), training=False).numpy(),
                args.seconds)
            times["tf.function"] = per_call_ms(
                lambda g=graph, o=obs: g(o.astype(np.float32)).numpy(), args.seconds)
            base = times["im2col"]
            print(f"{name:<16}{batch:>6}  " + "".join(
                f"{t:>10.2f} {t / base:>5.1f}x" for t in times.values()))


if __name__ == "__main__":
    main()
