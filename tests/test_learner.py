"""The Keras network against its numpy twin, and the learner's maths against numpy."""

import re
from pathlib import Path

import numpy as np
import pytest
from dqn_reference import double_dqn_reference

from distrl.rl.checkpoints import (
    CheckpointError,
    find_resume,
    latest_checkpoint,
    load_policy,
    write_policy,
)
from distrl.rl.config import ApexConfig
from distrl.rl.learner import Learner
from distrl.rl.network import (
    NATURE_TORSO,
    SMALL_TORSO,
    NetworkSpec,
    build_keras_model,
    get_keras_weights,
    init_weights,
)
from distrl.rl.tf_runtime import configure_tensorflow
from distrl.rl.transitions import SampledBatch, Transitions

configure_tensorflow(num_threads=1)


@pytest.mark.parametrize("spec", [NetworkSpec((4,), 2, (16, 8), True),
                                  NetworkSpec((6,), 3, (32,), False),
                                  NetworkSpec((5,), 4, (8, 8, 8), True)])
def test_numpy_forward_equals_keras(spec):
    weights = init_weights(spec, seed=2)
    model = build_keras_model(spec, weights)
    obs = np.random.default_rng(0).normal(size=(33, *spec.obs_shape)).astype(np.float32)
    np.testing.assert_allclose(spec.q_values(weights, obs), model(obs).numpy(),
                               rtol=1e-5, atol=1e-5)
    for a, b in zip(get_keras_weights(model, spec), weights):
        np.testing.assert_array_equal(a, b)


IMAGE_SPECS = [
    # the Nature torso on a frame just large enough for its three kernels, strides included
    NetworkSpec((36, 36, 4), 6, (32,), True, NATURE_TORSO, 1 / 255),
    NetworkSpec((10, 10, 4), 3, (16,), False, SMALL_TORSO),
    NetworkSpec((9, 7, 2), 2, (8,), True, ((4, 3, 2), (3, 2, 1))),  # not square
    # a kernel twice its stride on sides its stride does not divide
    NetworkSpec((11, 13, 3), 2, (8,), True, ((4, 4, 2), (2, 2, 1))),
]


@pytest.mark.parametrize("spec", IMAGE_SPECS)
def test_numpy_forward_of_an_image_network_equals_keras(spec):
    weights = init_weights(spec, seed=3)
    model = build_keras_model(spec, weights)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256 if spec.input_scale != 1 else 2, (5, *spec.obs_shape)).astype(np.uint8)
    expected = model(obs.astype(np.float32)).numpy()
    np.testing.assert_allclose(spec.q_values(weights, obs), expected, rtol=1e-4, atol=1e-5)
    assert spec.q_values(weights, obs).dtype == np.float32
    for a, b in zip(get_keras_weights(model, spec), weights, strict=True):
        np.testing.assert_array_equal(a, b)
    convs = sum(int(np.prod(layer.kernel)) * layer.out[0] * layer.out[1]
                for layer in spec.layers if layer.stride)
    dense = sum(int(np.prod(layer.kernel)) for layer in spec.layers if not layer.stride)
    assert spec.forward_flops(2) == 2 * 2 * (convs + dense)
    assert model.count_params() == sum(int(np.prod(s)) for s in spec.weight_shapes())


def test_the_nature_torso_on_84x84_frames_has_the_papers_shapes():
    spec = NetworkSpec((84, 84, 4), 6, (512,), True, NATURE_TORSO, 1 / 255)
    assert [layer.out for layer in spec.layers if layer.stride] == [(20, 20, 32), (9, 9, 64),
                                                                    (7, 7, 64)]
    assert spec.layers[3].kernel == (3136, 512)  # the torso's output, flattened
    assert spec.q_values(init_weights(spec), np.zeros((2, 84, 84, 4), np.uint8)).shape == (2, 6)


@pytest.mark.parametrize("obs_shape, conv_layers, message", [
    ((400,), SMALL_TORSO, "needs image observations"),
    ((10, 10, 4), (), "needs image observations"),
    ((10, 10), SMALL_TORSO, "obs_shape=(10, 10) is invalid"),
    ((10, 0, 4), SMALL_TORSO, "obs_shape=(10, 0, 4) is invalid: expected (size,) of a vector or "
                              "(height, width, channels)"),
    ((20, 20, 1), NATURE_TORSO, "conv_2's 3x3 kernel does not fit its 1x1 input"),
])
def test_an_image_network_that_cannot_be_built_is_refused_naming_the_value(obs_shape,
                                                                           conv_layers, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        NetworkSpec(obs_shape, 3, (16,), True, conv_layers)


def test_weights_of_the_wrong_shape_are_refused():
    spec = NetworkSpec((4,), 2, (16,), True)
    with pytest.raises(ValueError, match="expects"):
        build_keras_model(spec, init_weights(NetworkSpec((4,), 3, (16,), True)))


def tiny_batch(rng, n=6, obs_size=4):
    t = Transitions(obs=rng.normal(size=(n, obs_size)).astype(np.float32),
                    action=rng.integers(0, 2, n), reward=rng.normal(size=n).astype(np.float32),
                    discount=np.array([0.97, 0.0, 0.5, 0.97, 0.97, 0.0], np.float32)[:n],
                    next_obs=rng.normal(size=(n, obs_size)).astype(np.float32),
                    priority=np.ones(n, np.float32))
    return SampledBatch(t, np.arange(n), np.linspace(0.5, 1.0, n).astype(np.float32),
                        np.full(n, 1.0 / n))


def test_double_dqn_targets_and_priorities_equal_numpy():
    rng = np.random.default_rng(0)
    spec = NetworkSpec((4,), 2, (16, 16), True)
    online, target = init_weights(spec, 1), init_weights(spec, 2)
    config = ApexConfig(hidden_sizes=(16, 16), learning_rate=1e-3, target_update_period=1000)
    learner = Learner(config, spec, online)
    learner.target.set_weights(build_keras_model(spec, target).get_weights())
    batch = tiny_batch(rng)
    t = batch.transitions
    y, td_ref = double_dqn_reference(spec.q_values(online, t.next_obs),
                                     spec.q_values(target, t.next_obs),
                                     spec.q_values(online, t.obs), t.action, t.reward, t.discount)
    # The reference really is double DQN: online picks, target evaluates.
    best = spec.q_values(online, t.next_obs).argmax(1)
    assert y[1] == pytest.approx(t.reward[1])  # discount 0: no bootstrap
    assert y[0] == pytest.approx(t.reward[0] + 0.97 * spec.q_values(target, t.next_obs)[0, best[0]],
                                 rel=1e-5)
    loss, td_abs, _ = learner.update(batch)
    np.testing.assert_allclose(td_abs, td_ref, rtol=1e-4, atol=1e-5)
    # Huber(delta=1) weighted by the IS weights, averaged.
    huber = np.where(td_ref <= 1, 0.5 * td_ref ** 2, td_ref - 0.5)
    assert loss == pytest.approx(float(np.mean(batch.weights * huber)), rel=1e-4)
    # The online network moved; the target did not (period 1000).
    assert not np.allclose(learner.get_weights()[0], online[0])
    np.testing.assert_allclose(learner.target.get_weights()[0], target[0])


def test_target_network_follows_the_period_and_learning_reduces_loss():
    rng = np.random.default_rng(1)
    spec = NetworkSpec((4,), 2, (16,), False)
    config = ApexConfig(hidden_sizes=(16,), dueling=False, target_update_period=3,
                        learning_rate=1e-2, jit_compile=False)  # the period, not XLA, on test
    learner = Learner(config, spec, init_weights(spec, 0))
    batch = tiny_batch(rng)
    losses = [learner.update(batch)[0] for _ in range(2)]
    assert not np.allclose(learner.target.get_weights()[0], learner.online.get_weights()[0])
    losses.append(learner.update(batch)[0])  # third update copies online -> target
    np.testing.assert_array_equal(learner.target.get_weights()[0], learner.online.get_weights()[0])
    losses += [learner.update(batch)[0] for _ in range(60)]
    assert losses[-1] < losses[0]


def test_many_batches_in_one_call_are_the_same_updates_one_by_one():
    """update_many with XLA (the learner process's call) = that many plain update() calls: the
    same losses, priorities and weights, with the target copied at the same steps (period 3,
    mid-call)."""
    rng = np.random.default_rng(4)
    spec = NetworkSpec((4,), 2, (16, 8), True)
    config = ApexConfig(hidden_sizes=(16, 8), target_update_period=3, learning_rate=1e-2,
                        jit_compile=False)
    batches = [tiny_batch(rng) for _ in range(4)]
    one_by_one = Learner(config, spec, init_weights(spec, 0))
    at_once = Learner(config.replace(jit_compile=True), spec, init_weights(spec, 0))
    singles = [one_by_one.update(b) for b in batches]
    stack = SampledBatch.concat([b.take(np.newaxis) for b in batches])  # as sample_many's
    losses, td_abs, diag = at_once.update_many(stack)
    many = [(losses[k], td_abs[k], {name: v[k] for name, v in diag.items()}) for k in range(4)]
    assert at_once.updates == one_by_one.updates == 4
    for (loss_a, td_a, diag_a), (loss_b, td_b, diag_b) in zip(singles, many):
        assert loss_b == pytest.approx(loss_a, rel=1e-5)
        np.testing.assert_allclose(td_b, td_a, rtol=1e-5, atol=1e-6)
        assert diag_b["mean_q"] == pytest.approx(diag_a["mean_q"], rel=1e-5, abs=1e-6)
    # The copy after update 3 happened in both; update 4 moved only the online network.
    for learner in (one_by_one, at_once):
        target = get_keras_weights(learner.target, spec)
        assert not np.allclose(target[0], learner.get_weights()[0])
    for a, b in zip(get_keras_weights(one_by_one.target, spec),
                    get_keras_weights(at_once.target, spec)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(one_by_one.get_weights(), at_once.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_xla_is_left_out_for_convolutions_on_a_cpu_unless_asked_for():
    """jit_compile=None: XLA for dense networks; not for convolutions on a CPU, where it made
    the Nature torso's update far slower (benchmarks/results/learner_throughput-pong-v5.txt). An image
    learner takes its batches as replay samples them, uint8 images channels last, and refuses
    another layout rather than reshaping it."""
    dense = NetworkSpec((4,), 2, (8,), True)
    image = NetworkSpec((10, 10, 4), 3, (8,), True, SMALL_TORSO)
    config = ApexConfig(hidden_sizes=(8,))
    assert config.jit_compile is None
    assert Learner(config, dense, init_weights(dense, 0)).uses_xla
    learner = Learner(config, image, init_weights(image, 0))
    assert not learner.uses_xla
    assert Learner(config.replace(jit_compile=True), image, init_weights(image, 0)).uses_xla
    rng = np.random.default_rng(0)
    n = 16
    obs = rng.integers(0, 2, (n + 1, 10, 10, 4), dtype=np.uint8)

    def batch(layout):
        return SampledBatch(Transitions(obs=layout(obs[:-1]), action=rng.integers(0, 3, n),
                                        reward=np.ones(n, np.float32),
                                        discount=np.full(n, 0.9, np.float32),
                                        next_obs=layout(obs[1:]), priority=np.ones(n, np.float32)),
                            np.arange(n), np.ones(n, np.float32), np.full(n, 1 / n))

    # The same double-DQN priorities as numpy's on the same images (online and target networks
    # start equal: no update has copied anything yet).
    weights = init_weights(image, 0)
    q_next = image.q_values(weights, obs[1:])
    first = batch(lambda o: o.transpose(0, 3, 1, 2))  # channels first, as replay sends them
    t = first.transitions
    _, td_ref = double_dqn_reference(q_next, q_next, image.q_values(weights, obs[:-1]),
                                     t.action, t.reward, t.discount)
    loss, td_abs, _ = learner.update(first)
    assert np.isfinite(loss)
    np.testing.assert_allclose(td_abs, td_ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"shape \(10, 10, 4\); this learner takes \(4, 10, 10\)"):
        learner.update(batch(lambda o: o))
    with pytest.raises(ValueError, match="jit_compile='yes' is invalid"):
        ApexConfig(jit_compile="yes")


def test_beta_anneals_linearly():
    spec = NetworkSpec((4,), 2, (8,), True)
    config = ApexConfig(hidden_sizes=(8,), priority_beta=0.4, priority_beta_final=1.0,
                        beta_anneal_updates=100)
    learner = Learner(config, spec, init_weights(spec, 0))
    assert learner.beta() == pytest.approx(0.4)
    learner.updates = 50
    assert learner.beta() == pytest.approx(0.7)
    learner.updates = 500
    assert learner.beta() == pytest.approx(1.0)


def test_checkpoint_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    spec = NetworkSpec((4,), 2, (8,), True)
    config = ApexConfig(hidden_sizes=(8,), target_update_period=2, jit_compile=False)
    learner = Learner(config, spec, init_weights(spec, 0))
    batch = tiny_batch(rng)
    for _ in range(5):
        learner.update(batch)
    for _ in range(4):  # keep=3 prunes the oldest
        path = learner.save_checkpoint(tmp_path, extra={"env_steps": 123})
        learner.updates += 1
    assert latest_checkpoint(tmp_path) == path
    assert len(list(tmp_path.glob("checkpoint-*.npz"))) == 3
    restored = Learner(config, spec, init_weights(spec, 9))
    meta = restored.restore_checkpoint(path)
    assert meta["updates"] == restored.updates == 8 and meta["env_steps"] == 123
    for a, b in zip(restored.get_weights(), learner.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(restored.optimizer.variables, learner.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Both continue identically from the same state.
    np.testing.assert_allclose(restored.update(batch)[1], learner.update(batch)[1], rtol=1e-6)


def test_a_kept_policy_is_written_whole_beside_the_checkpoints_and_read_back(tmp_path):
    """best.npz: one file holding the weights and what they scored, replaced whole, readable
    as a checkpoint's online network is; refused as a resume, by name."""
    spec = NetworkSpec((4,), 2, (8,), True)
    config = ApexConfig(hidden_sizes=(8,), jit_compile=False)
    learner = Learner(config, spec, init_weights(spec, 0))
    checkpoint = learner.save_checkpoint(tmp_path)
    first, second = init_weights(spec, 1), init_weights(spec, 2)
    path = write_policy(tmp_path, {"weights_version": 10, "mean_return": 50.0}, first)
    assert path == str(tmp_path / "best.npz")
    assert write_policy(tmp_path, {"weights_version": 20, "mean_return": 80.0}, second) == path
    meta, weights = load_policy(path)
    assert meta == {"weights_version": 20, "mean_return": 80.0}
    for a, b in zip(weights, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["best.npz", Path(checkpoint).name, Path(checkpoint).with_suffix(".json").name])
    assert latest_checkpoint(tmp_path) == checkpoint  # a resume never takes best.npz
    _, online = load_policy(checkpoint)  # a checkpoint's online network reads the same way
    for a, b in zip(online, learner.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    # Any fsspec location (gs:// on GKE), here fsspec's in-memory one.
    uri = write_policy("memory://run/checkpoints", {"weights_version": 3}, first)
    assert uri.startswith("memory://") and uri.endswith("/run/checkpoints/best.npz"), uri
    assert load_policy(uri)[0]["weights_version"] == 3
    with pytest.raises(CheckpointError, match=r"resume='.*best\.npz'.*policy's weights only.*"
                                              r"checkpoint-\*\.npz"):
        find_resume(path, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"no policy at .*other\.npz \(expected"):
        load_policy(tmp_path / "other.npz")
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "best.npz").write_bytes(Path(path).read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"policy .*cut/best\.npz cannot be read"):
        load_policy(tmp_path / "cut" / "best.npz")


def test_a_resume_trains_at_the_configured_learning_rate_not_the_checkpoints(tmp_path):
    """Keras 3 keeps the learning rate among the optimizer's variables, which were restored by
    position: a learner made with 1e-5 trained at the checkpoint's 4e-3 while results.json said
    1e-5. Every other optimizer variable comes back by name, also from a checkpoint written
    before names (optimizer_<i>, by position)."""
    from distrl.rl.checkpoints import read_checkpoint, write_checkpoint

    rng = np.random.default_rng(3)
    spec = NetworkSpec((4,), 2, (8,), True)
    config = ApexConfig(hidden_sizes=(8,), learning_rate=4e-3, jit_compile=False)
    first = Learner(config, spec, init_weights(spec, 0))
    batch = tiny_batch(rng)
    for _ in range(3):
        first.update(batch)
    path = first.save_checkpoint(tmp_path / "named")
    saved = {v.name: np.asarray(v) for v in first.optimizer.variables}
    meta, arrays = read_checkpoint(path)
    old = {k: v for k, v in arrays.items() if not k.startswith("optimizer.")}
    old |= {f"optimizer_{i}": saved[v.name] for i, v in enumerate(first.optimizer.variables)}
    old_path = write_checkpoint(tmp_path / "positional", (meta, old), keep=1)
    for checkpoint in (path, old_path):
        resumed = Learner(config.replace(learning_rate=1e-5), spec, init_weights(spec, 9))
        resumed.restore_checkpoint(checkpoint)
        assert float(resumed.optimizer.learning_rate) == pytest.approx(1e-5)
        for v in resumed.optimizer.variables:
            if v.name != "learning_rate":
                np.testing.assert_array_equal(np.asarray(v), saved[v.name], err_msg=v.name)
        assert resumed.updates == 3


def test_only_a_new_shapes_first_call_is_taken_for_a_stale_xla_cache(monkeypatch):
    """Any TensorFlow error was taken for a damaged XLA cache: the cache was cleared, the step
    compiled again and the error hidden (an out-of-memory at update 50,000 would read as a
    cache problem). Only a shape's first call loads from the cache; later errors are raised."""
    import tensorflow as tf

    from distrl.rl import tf_runtime

    cleared = []
    monkeypatch.setattr(tf_runtime, "xla_cache_dir", lambda: "/a/cache")
    monkeypatch.setattr(tf_runtime, "clear_xla_cache", cleared.append)
    spec = NetworkSpec((4,), 2, (8,), True)
    learner = Learner(ApexConfig(hidden_sizes=(8,), jit_compile=False), spec,
                      init_weights(spec, 0))
    batch = tiny_batch(np.random.default_rng(0))
    learner.update(batch)  # the shape's first call: compiled (or loaded)

    def out_of_memory(*args):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")

    learner._train_steps = out_of_memory
    with pytest.raises(tf.errors.ResourceExhaustedError, match="OOM"):
        learner.update(batch)
    assert cleared == [] and learner.updates == 1


def test_the_learner_keeps_to_the_threads_it_was_given():
    """configure_tensorflow caps TensorFlow's thread pools (it once listed the devices first,
    which fixes the pools at one thread per core, and the cap was silently dropped)."""
    import tensorflow as tf

    # This module called configure_tensorflow(num_threads=1) before anything else used TF.
    assert tf.config.threading.get_intra_op_parallelism_threads() == 1
    assert tf.config.threading.get_inter_op_parallelism_threads() == 1


@pytest.mark.slow
def test_a_lean_import_trains_without_pandas_and_matplotlib_and_leaves_them_importable():
    """The learner's process imports Keras without its optional pandas and matplotlib (1 s of
    its start-up); a Learner still trains there, and both import normally afterwards."""
    import json
    import subprocess
    import sys

    code = """if True:
        import json, sys
        import numpy as np
        from distrl.rl.config import ApexConfig
        from distrl.rl.tf_runtime import configure_tensorflow
        from distrl.rl.learner import Learner
        from distrl.rl.network import init_weights, NetworkSpec
        from distrl.rl.transitions import SampledBatch, Transitions
        configure_tensorflow(num_threads=1, lean=True)
        spec = NetworkSpec((4,), 2, (8,), True)
        learner = Learner(ApexConfig(), spec, init_weights(spec, 0))
        rng = np.random.default_rng(0)
        t = Transitions(obs=rng.normal(size=(16, 4)), action=rng.integers(0, 2, 16),
                        reward=np.ones(16), discount=np.full(16, 0.97),
                        next_obs=rng.normal(size=(16, 4)), priority=np.ones(16))
        loss, td_abs, _ = learner.update(SampledBatch(t, np.arange(16), np.ones(16), np.ones(16)))
        loaded = [m for m in ("pandas", "matplotlib") if m in sys.modules]
        import matplotlib.pyplot, pandas
        print(json.dumps({"loaded": loaded, "loss": loss, "td": len(td_abs),
                          "after": [pandas.__name__, matplotlib.pyplot.__name__]}))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert np.isfinite(report["loss"]) and report["td"] == 16
    assert report["after"] == ["pandas", "matplotlib.pyplot"]


# A learner's first update, in a process of its own: its losses, and its XLA cache folder.
FIRST_UPDATE = """if True:
    import json, sys
    import numpy as np
    from distrl.rl import tf_runtime
    from distrl.rl.config import ApexConfig
    from distrl.rl.tf_runtime import configure_tensorflow
    from distrl.rl.learner import Learner
    from distrl.rl.network import init_weights, NetworkSpec
    from distrl.rl.transitions import SampledBatch, Transitions
    configure_tensorflow(num_threads=1, xla_cache=sys.argv[1] == "on")
    spec = NetworkSpec((4,), 2, (8,), True)
    learner = Learner(ApexConfig(jit_compile=True), spec, init_weights(spec, 0))
    rng = np.random.default_rng(0)
    t = Transitions(obs=rng.normal(size=(2, 16, 4)), action=rng.integers(0, 2, (2, 16)),
                    reward=np.ones((2, 16)), discount=np.full((2, 16), 0.97),
                    next_obs=rng.normal(size=(2, 16, 4)), priority=np.ones((2, 16)))
    losses, _, _ = learner.update_many(SampledBatch(t, np.zeros((2, 16), int), np.ones((2, 16)),
                                                    np.ones((2, 16))))
    print(json.dumps({"losses": losses.tolist(), "cache": str(tf_runtime._xla_cache_dir)}))
"""


def first_update(cache: str, env: dict) -> tuple[dict, str]:
    import json
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", FIRST_UPDATE, cache], capture_output=True,
                         text=True, timeout=180, env=os.environ | env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def test_xla_keeps_the_compiled_step_a_new_process_loads_and_a_damaged_one_is_compiled_again(
        tmp_path):
    """With xla_cache, the learner's compiled train step is written to disk and loaded by the
    next process (0.4 s instead of 1.4-3 s of compiling, benchmarks/learner_throughput.py),
    with the same results. An entry that does not load (here: garbage) is not fatal: it is
    cleared and the step compiled again."""
    env = {"DISTRL_XLA_CACHE_DIR": str(tmp_path / "xla"), "TF_XLA_FLAGS": ""}
    written, _ = first_update("on", env)  # compiled, as without the cache, and written
    cache = Path(written["cache"])
    assert cache.parent == tmp_path / "xla" and cache.name.startswith("tf")
    entries = sorted(cache.iterdir())
    assert len(entries) == 1 and entries[0].stat().st_size > 1000, entries
    # A new process with the entry: the same losses, and nothing compiled or written again.
    # Nor any of the ERROR lines TensorFlow writes for a load that works (XLA_CACHE_NOISE).
    stamp = entries[0].stat().st_mtime_ns
    loaded, err = first_update("on", env)
    np.testing.assert_array_equal(loaded["losses"], written["losses"])
    assert err == "", err[-3000:]
    assert sorted(cache.iterdir()) == entries and entries[0].stat().st_mtime_ns == stamp
    # The entry is really read: garbage in it fails the load, which the learner survives.
    entries[0].write_bytes(b"garbage")
    recovered, err = first_update("on", env)
    np.testing.assert_array_equal(recovered["losses"], written["losses"])
    assert "XLA could not load a cached train step" in err and str(cache) in err, err[-3000:]
    assert not entries[0].exists()  # cleared, and the step written again under its new trace
    assert [e.stat().st_size > 1000 for e in cache.iterdir()] == [True]


def test_native_stderr_drops_only_the_harmless_lines_and_keeps_the_rest_in_order():
    """What XLA writes for a cache load that works goes, and oneDNN's note on uint8; the same
    loader's line about a real CPU feature, and anything else written meanwhile (C++ or
    Python), comes through. In a process of its own: pytest's capture would take Python's
    stderr off fd 2."""
    import subprocess
    import sys

    code = """if True:
        import os, sys
        from distrl.rl.tf_runtime import native_stderr_without, FIRST_CALL_NOISE
        absl = "E0000 00:00:1796323457.07 29547 "
        noise = [absl + "text_format.cc:378] Error parsing text-format "
                 "tensorflow.XlaSerializedCacheEntry: 2:1: Expected identifier, got: 5",
                 absl + "cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine "
                 "feature +prefer-no-gather is not  supported on the host machine. Machine ...",
                 absl + "util.cc:131] oneDNN supports DT_UINT8 only on platforms with AVX-512. "
                 "Falling back to the default Eigen-based implementation if present."]
        real = noise[1].replace("+prefer-no-gather", "+avx512f")
        print("before", file=sys.stderr)
        with native_stderr_without(FIRST_CALL_NOISE):
            os.write(2, (noise[0] + "\\n" + real + "\\n" + noise[2] + "\\n").encode())
            print("from Python", file=sys.stderr)
            os.write(2, (noise[1] + "\\nlast, no newline").encode())
        print(real, end="")
    """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    real = run.stdout
    assert "+avx512f" in real
    assert run.stderr == f"before\n{real}\nfrom Python\nlast, no newline"


def test_an_xla_cache_that_cannot_be_made_means_compiling_each_start(tmp_path, monkeypatch,
                                                                   capsys):
    import os

    from distrl.rl import tf_runtime

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DISTRL_XLA_CACHE_DIR", str(blocker))
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    monkeypatch.setattr(tf_runtime, "_xla_cache_dir", tmp_path)  # whatever it was
    configure_tensorflow(num_threads=1, xla_cache=True)
    assert tf_runtime._xla_cache_dir is None and os.environ["TF_XLA_FLAGS"] == ""
    err = capsys.readouterr().err
    assert f"no XLA cache in {blocker}" in err and "compiling each start" in err, err


def test_the_xla_cache_folder_is_per_tensorflow_and_cpu_and_keeps_to_its_size(tmp_path,
                                                                              monkeypatch):
    import os

    from distrl.rl import tf_runtime
    from distrl.rl.tf_runtime import XLA_CACHE_ENV, _enable_xla_cache, default_xla_cache_dir

    monkeypatch.delenv(XLA_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = default_xla_cache_dir("2.21.0")
    assert folder.parent == tmp_path / "xdg" / "distrl" / "xla"
    assert folder.name.startswith("tf2.21.0-") and folder != default_xla_cache_dir("2.22.0")
    monkeypatch.setenv(XLA_CACHE_ENV, str(tmp_path / "mine"))
    assert default_xla_cache_dir("2.21.0").parent == tmp_path / "mine"
    # Beyond the size limit, the oldest entries go until it fits.
    cache = tmp_path / "cache"
    cache.mkdir()
    for i in range(5):
        (cache / f"entry{i}").write_bytes(b"x" * 100)
        os.utime(cache / f"entry{i}", (1000 + i, 1000 + i))
    monkeypatch.setattr(tf_runtime, "XLA_CACHE_MAX_BYTES", 250)
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_enable_lazy_compilation=false")
    assert _enable_xla_cache(cache) == cache
    assert sorted(p.name for p in cache.iterdir()) == ["entry3", "entry4"]
    assert os.environ["TF_XLA_FLAGS"] == ("--tf_xla_enable_lazy_compilation=false "
                                          f"--tf_xla_persistent_cache_directory={cache}")
    # A cache directory the user gave XLA is theirs: kept, and not pruned.
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=/elsewhere")
    assert _enable_xla_cache(tmp_path / "unused") is None
    assert os.environ["TF_XLA_FLAGS"] == "--tf_xla_persistent_cache_directory=/elsewhere"
    assert not (tmp_path / "unused").exists()


def test_a_checkpoint_keeps_each_replay_shards_sample_beside_the_learners_state(tmp_path):
    """replay_arrays/replay_blocks: two shards' blocks (one of images as frames) go into the
    checkpoint's .npz and come back field for field; the learner restores from the same file
    as from one without replay, and a checkpoint without replay gives no blocks."""
    from distrl.rl.checkpoints import (
        read_checkpoint,
        replay_arrays,
        replay_blocks,
        write_checkpoint,
    )
    from distrl.rl.replay import PrioritizedReplay
    from distrl.rl.transitions import Transitions

    rng = np.random.default_rng(5)
    vectors = PrioritizedReplay(100, (4,))
    vectors.add(Transitions(obs=rng.random((60, 4), np.float32), action=np.arange(60) % 2,
                            reward=np.ones(60, np.float32), discount=np.full(60, .9, np.float32),
                            next_obs=rng.random((60, 4), np.float32),
                            priority=rng.random(60).astype(np.float32)))
    planes = rng.integers(0, 2, (8, 3, 3), dtype=np.uint8)
    images = Transitions(obs=np.array([[0, 1], [2, 3]], np.int32), action=np.array([0, 1]),
                         reward=np.zeros(2, np.float32), discount=np.ones(2, np.float32),
                         next_obs=np.array([[4, 5], [6, 7]], np.int32),
                         priority=np.ones(2, np.float32), frames=planes)
    spec = NetworkSpec((4,), 2, (8,), True)
    config = ApexConfig(hidden_sizes=(8,), jit_compile=False)
    learner = Learner(config, spec, init_weights(spec, 0))
    learner.update(tiny_batch(rng))
    meta, arrays = learner.snapshot()
    written = write_checkpoint(tmp_path, (meta, arrays | replay_arrays([vectors.contents(),
                                                                        images])))
    blocks = replay_blocks(read_checkpoint(written)[1])
    assert [len(b) for b in blocks] == [60, 2] and blocks[0].frames is None
    for name in (*Transitions.ROWS, "frames"):
        np.testing.assert_array_equal(getattr(blocks[1], name), getattr(images, name))
    np.testing.assert_array_equal(blocks[0].obs, vectors.contents().obs)
    restored = Learner(config, spec, init_weights(spec, 9))
    restored.restore_checkpoint(written)
    for a, b in zip(restored.get_weights(), learner.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert replay_blocks(arrays) == []
