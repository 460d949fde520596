"""Run the tutorial notebooks in order with papermill (`make tutorial`).

    python -m distrl.tutorial                       # every notebook, full-size parameters
    python -m distrl.tutorial --only 01 -p MAX_SECONDS=60

Executed notebooks land in runs/<timestamp>/, next to what each notebook records (results
JSON, TensorBoard logs, checkpoints). A failing notebook is kept as executed so that the cell
that failed can be read.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from distrl.gke.settings import REPO_ROOT

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"  # make bench's records, which notebooks quote


def run_dir(path: str | os.PathLike) -> Path:
    """Where a notebook writes (its OUTPUT_DIR): an absolute path as it is, a relative one under
    the repository root, so that a notebook run from any folder writes to the same place
    (runs/, which git ignores) and never into notebooks/."""
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def find_notebooks(directory: Path = NOTEBOOKS_DIR, only: list[str] | None = None) -> list[Path]:
    notebooks = sorted(p for p in directory.glob("[0-9][0-9]-*.ipynb"))
    if only:
        notebooks = [p for p in notebooks if any(p.name.startswith(o) for o in only)]
    return notebooks


@functools.cache  # one class, made on first use: jupyter_client loads with papermill, not here
def _quiet_shutdown_kernel_manager():
    """papermill's kernel manager, less the SIGINT that jupyter_client sends before every
    shutdown (manager.py, _async_shutdown_kernel). When it lands while the kernel still handles
    a message, ipykernel logs "ERROR | KeyboardInterrupt caught in kernel." on the console of a
    run that went well (seen at notebook 04's end). The shutdown request alone ends an idle
    kernel. A kernel still busy in a cell past its timeout is no longer interrupted first: it is
    killed after shutdown_wait_time (5 s), and what it started is stopped by the reapers that
    cover a killed kernel (LocalCluster's, Ray's own)."""
    from jupyter_client import AsyncKernelManager

    class QuietShutdownKernelManager(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return QuietShutdownKernelManager


def run_notebook(notebook: Path, output_dir: Path, parameters: dict | None = None,
                 kernel: str = "python3", cell_timeout_s: int = 1800) -> Path:
    """Execute one notebook into output_dir (cwd: its own folder). Raises on a failing cell."""
    import papermill
    from traitlets.config import Config

    output_dir.mkdir(parents=True, exist_ok=True)
    out = output_dir / notebook.name
    params = {"OUTPUT_DIR": str(output_dir.resolve() / notebook.stem)} | (parameters or {})
    # The kernel talks over Unix sockets in a private folder, not over TCP on localhost, where
    # any local user could connect (ipykernel 7 warns about that on every start).
    with tempfile.TemporaryDirectory(prefix="distrl-kernel-") as sockets:
        papermill.execute_notebook(
            str(notebook), str(out), parameters=params, kernel_name=kernel,
            cwd=str(notebook.parent), execution_timeout=cell_timeout_s, progress_bar=False,
            log_output=False, request_save_on_cell_execute=True,
            kernel_manager_class=_quiet_shutdown_kernel_manager(),
            # One output per stream and cell, carriage returns applied: a line redrawn in place
            # (a progress bar) is stored as its last state, not once per refresh.
            coalesce_streams=True,
            config=Config({"KernelManager": {"transport": "ipc", "ip": f"{sockets}/kernel"}}))
    return out


# ERROR-level log lines in a notebook's outputs: Python logging's "ERROR", glog's
# "[<time> E <pid> <tid>]" (Ray's C++ core) and absl's "E1130 00:00:<time> <tid> <file>:<line>]"
# (gRPC, TensorFlow), also behind the "(LearnerWorker pid=N)" that Ray puts before a worker's
# line; tracebacks.
ERROR_LINE = re.compile(r"\bERROR\b|\[[^]]* E \d+ \d+\]|(?:^|\s)E\d{4} \d\d:\d\d:[\d.]+ +\d+ \S+:\d+\]"
                        r"|Traceback \(most recent call last\)")


def stream_text(executed: Path) -> str:
    """Everything an executed notebook's cells printed (stdout and stderr), in order."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    return "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.get("output_type") == "stream")


# Ray lines at ERROR level that report no error. Ray 2.60's GCS logs this one when ray.kill
# meets an actor whose worker exits before it can reply, which is how such a kill succeeds
# (ray-project/ray#53412); later Ray no longer logs it (ray-project/ray#58544). Each run ends by
# killing its actors, and one may still be starting then.
NOT_AN_ERROR = re.compile(r"Failed to kill actor \w+, return status: Invalid: KillActor RPC "
                          r"failed for actor \w+: RpcError: RPC error: Socket closed")


def error_lines(executed: Path) -> list[str]:
    """The ERROR-level lines in an executed notebook's text outputs (a clean run has none)."""
    return [line for line in stream_text(executed).splitlines()
            if ERROR_LINE.search(line) and not NOT_AN_ERROR.search(line)]


def _parse_parameter(text: str) -> tuple[str, object]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value  # a bare string


# What a notebook needs from an earlier one (number -> numbers). Locally each notebook makes its
# own data (05 trains when its collector is empty), so a failure skips no other notebook.
REQUIRES: dict[str, tuple[str, ...]] = {}


def describe_failure(err: BaseException) -> str:
    """Which cell failed and how, in one line (papermill's error names the cell)."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(err, PapermillExecutionError):
        first = (err.source or "").strip().splitlines()[:1]
        where = f"cell {err.exec_count}" + (f" ({first[0][:60]!r})" if first else "")
        return f"{where}: {err.ename}: {str(err.evalue).strip()[:300]}"
    return f"{type(err).__name__}: {str(err).strip()[:300] or 'no message'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="python3",
                        help="Jupyter kernel to execute with (python3: this environment's)")
    parser.add_argument("--only", nargs="*", help="notebook number prefixes, e.g. 01 03")
    parser.add_argument("-p", "--parameter", action="append", type=_parse_parameter, default=[],
                        help="NAME=VALUE passed to every notebook's parameters cell")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="default: runs/<timestamp>; a relative one is under the repository")
    parser.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS_DIR,
                        help="where the NN-*.ipynb notebooks are")
    args = parser.parse_args(argv)
    # The kernels inherit it: TensorFlow's C++ start-up lines (no CUDA driver, CPU features)
    # would otherwise print here from any kernel that imports it (tensorboard's readers do).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    output_dir = run_dir(args.output_dir or Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S"))
    notebooks = find_notebooks(args.notebooks_dir, only=args.only)
    if not notebooks:
        print(f"no notebooks matched {args.only} in {args.notebooks_dir}", file=sys.stderr)
        return 2
    failed: set[str] = set()
    table = [_run_one(notebook, f"[{i}/{len(notebooks)}] {notebook.name}", output_dir,
                      dict(args.parameter), args.kernel, failed)
             for i, notebook in enumerate(notebooks, 1)]
    width = max(len(name) for name, _, _ in table)
    print("\n" + "\n".join(f"  {name:<{width}}  {state:>7}  {took:6.0f} s"
                           for name, state, took in table))
    print(f"  {'total':<{width}}  {'':>7}  {sum(t for _, _, t in table):6.0f} s")
    if failed:
        print(f"{len(failed)} of {len(notebooks)} notebook(s) did not run through; executed "
              f"notebooks are in {output_dir.resolve()}", file=sys.stderr)
        return 1
    print(f"all {len(notebooks)} notebook(s) ran; executed notebooks and results are in "
          f"{output_dir.resolve()}")
    return 0


def _run_one(notebook: Path, tag: str, output_dir: Path, params: dict, kernel: str,
             failed: set[str]) -> tuple[str, str, float]:
    """Run one notebook unless one it needs failed; (name, ok|FAILED|skipped, seconds), and
    its number added to failed unless it ran through."""
    number = notebook.name[:2]
    blocked = [n for n in REQUIRES.get(number, ()) if n in failed]
    if blocked:
        print(f"{tag} skipped: it needs notebook {', '.join(blocked)}, which failed",
              file=sys.stderr)
        failed.add(number)
        return notebook.name, "skipped", 0.0
    print(f"{tag} ...", flush=True)
    start = time.monotonic()
    try:
        out = run_notebook(notebook, output_dir, params, kernel=kernel)
    except Exception as err:  # the kernel is shut down: whatever it started is stopped
        took = time.monotonic() - start
        print(f"{tag} FAILED after {took:.0f}s in {describe_failure(err)}\n"
              f"  the executed notebook is kept at {output_dir / notebook.name}",
              file=sys.stderr, flush=True)
        failed.add(number)
        return notebook.name, "FAILED", took
    took = time.monotonic() - start
    print(f"{tag} done in {took:.0f}s -> {out}", flush=True)
    errors = error_lines(out)
    if errors:  # it ran through, but something logged at ERROR level: show where
        print(f"{tag}: {len(errors)} ERROR-level line(s) in its outputs, the first: "
              f"{errors[0][:200]}", file=sys.stderr, flush=True)
    return notebook.name, "ok", took


if __name__ == "__main__":
    sys.exit(main())
