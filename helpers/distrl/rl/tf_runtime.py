"""TensorFlow in a learner process: imported quietly, its threads capped, XLA's compiled
steps kept on disk for the next start.

    gpus = configure_tensorflow(num_threads=1, lean=True, xla_cache=True)

Nothing here is reinforcement learning: it is what a process that trains a Keras model on a
small machine, in a Ray cluster, needs before its first step.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import sys
import tempfile
from pathlib import Path


@contextlib.contextmanager
def native_stderr_without(harmless: re.Pattern):
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
# What it logs at ERROR level the first time a graph moves image planes' channels last: its
# optimizer moves the transpose before the cast to float, onto uint8 (a quarter of the bytes),
# and oneDNN hands uint8 to Eigen's kernel on CPUs without AVX-512 (util.cc in
# tensorflow/core/util/onednn). The step runs, and faster than with the transpose kept on
# float32 (64 Pong stacks through the first convolution on this 2-core machine: 5.6 ms, 6.2).
ONEDNN_UINT8_NOTE = re.compile(r"oneDNN supports DT_UINT8 only on platforms with AVX-512\.")
FIRST_CALL_NOISE = re.compile(f"{XLA_CACHE_NOISE.pattern}|{ONEDNN_UINT8_NOTE.pattern}")


def _quiet_native_stderr():
    """Silence C++ log lines written straight to fd 2 (Python exceptions still propagate).

    TensorFlow prints its oneDNN and "no CUDA driver" notices from C++ before its log level
    applies, once per process; in a Ray cluster every line reaches the driver's output.
    """
    return native_stderr_without(re.compile(""))  # every line is dropped


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


def xla_cache_dir() -> Path | None:
    """This process's XLA cache, once configure_tensorflow set one."""
    return _xla_cache_dir


def clear_xla_cache(why: str) -> None:
    """Every entry of this process's XLA cache goes (XLA keeps a failed load for its trace
    and does not say which entry it was), with a line on stderr saying why."""
    print(f"distrl: {why}; clearing {_xla_cache_dir} and compiling again", file=sys.stderr)
    for entry in _xla_cache_dir.glob("*"):
        with contextlib.suppress(OSError):
            entry.unlink()


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
