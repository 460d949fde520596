"""Run the notebooks with papermill, small parameters, and check what they recorded."""

import json
import os
import re
from pathlib import Path

import psutil
import pytest
from conftest import respond

from distrl.apex.faults import STEADY_SHARE
from distrl.gke.inventory import inventory_commands
from distrl.gke.settings import GkeSettings
from distrl.tutorial import NOTEBOOKS_DIR, RESULTS_DIR, error_lines, run_notebook, stream_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def assert_quiet(executed: Path) -> None:
    """What a reader scrolls past on GitHub: at most 15 stream outputs (progress is one line per
    new best, and make tutorial keeps one output per stream and cell) and under 500 KB."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    # one per cell and stream: how Jupyter and GitHub show them, however papermill stored them
    streams = len({(i, o.name) for i, c in enumerate(nb.cells) if c.cell_type == "code"
                   for o in c.outputs if o.output_type == "stream"})
    assert streams <= 15, f"{executed.name}: {streams} stream outputs"
    assert executed.stat().st_size < 500_000, f"{executed.name}: {executed.stat().st_size:,} bytes"
def test_notebooks_are_stored_without_outputs(caplog):
    import nbformat
    import papermill

    for path in sorted(NOTEBOOKS_DIR.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)  # every cell has its id (a future nbformat requires it)
        assert all("id" in cell for cell in nb.cells), path.name
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: one cell tagged 'parameters'"
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, path.name
        # papermill reads every parameter line (it warned "Unable to parse line 16" on 04).
        caplog.clear()
        parameters = papermill.inspect_notebook(str(path))
        assert not [r for r in caplog.records if r.levelname == "WARNING"], path.name
        lines = [line for line in tagged[0].source.splitlines() if line and line[0].isalpha()]
        assert len(parameters) == len(lines), path.name


def test_01_local_apex_dqn(tmp_path: Path):
    """01 as the README's CI use runs it: plain papermill from the repository root, with the
    environment's own kernel. Its paths resolve from the repository, nothing lands in the source
    tree, and the package warns of nothing (01 imports distrl before Ray, so gRPC's fork support
    is off). make tutorial runs it from notebooks/, and test_plain_papermill 03 from both."""
    from distrl.tutorial import REPO_ROOT

    before = untracked_in_source()
    out_dir, executed = tmp_path / "run", tmp_path / "01-local-apex-dqn.ipynb"
    said = plain_papermill("01-local-apex-dqn.ipynb", REPO_ROOT, executed, OUTPUT_DIR=out_dir)
    # The package warns inside the kernel, into the cells' outputs; papermill's own output too.
    for printed in (said, stream_text(executed)):
        assert "grpc was imported before distrl" not in printed and "RuntimeWarning" not in printed
    assert untracked_in_source() == before
    assert error_lines(executed) == []
    assert_quiet(executed)
    results = json.loads((out_dir / "results.json").read_text())
    assert results["reached_target"] is True
    assert results["best_eval_return"] >= 100  # SMOKE's target
    assert results["env_steps"] > 0 and results["learner_updates"] > 0
    # Each actor reported the epsilons it explored with: the paper's spread over every slot.
    slots = results["config"]["num_actors"] * results["config"]["envs_per_actor"]
    assert sum(results["actor_epsilons"], []) == pytest.approx(
        [0.4 ** (1 + 7 * i / (slots - 1)) for i in range(slots)], rel=1e-6)
    assert "first update" in results["timeline"]  # plotted as the start-up timeline
    text = stream_text(executed)
    # The 140-line Ape-X learned too (SMOKE: to 100), with its own ray.wait loop.
    assert "reached 100 in" in text, text[-2000:]
    assert "the run is learner-bound" in text or "the run is actor-bound" in text
    # The agent watched is the kept best policy, as the cell says, from results.json's record.
    best = results["policies"]["best"]
    assert Path(best["path"]) == out_dir / "checkpoints" / "best.npz" and best["this_run"]
    assert (f"the kept best policy, weights of {best['weights_version']:,} updates, scored "
            f"{best['mean_return']:.0f} on {best['episodes']} new episodes") in text, text[-2000:]
    # The figures the prose points to are the run's: printed from its results.
    tp = results["throughput"]
    learning = [r for r in tp if r["learner_updates"] > tp[0]["learner_updates"]]
    per_update = (learning[-1]["env_steps"] - learning[0]["env_steps"]) / (
        learning[-1]["learner_updates"] - learning[0]["learner_updates"])
    printed = float(re.search(r"updates/s, ([\d.]+) env steps per update", text).group(1))
    assert printed == pytest.approx(per_update, abs=0.06)
    assert re.search(r"first env step [\d.]+ s after train\(\); learner running at [\d.]+ s", text)
    assert re.search(r"140-line version: reached 100 in \d+ s after [\d,]+ transitions", text)
    assert re.search(r"the same defaults over seeds \[[\d, ]+\] \(python benchmarks/sweep.py", text)
    # Images: MinAtar's Breakout through the convolutional network trained for its budget of
    # updates, whatever the machine's load, and the figures printed are the run's.
    image = json.loads((out_dir / "images" / "results.json").read_text())
    assert image["env_id"] == "MinAtar/Breakout-v1" and image["stop_reason"] == "max_learner_updates"
    assert image["learner_updates"] >= image["config"]["max_learner_updates"]
    first, late = map(float, re.search(r"greedy return ([\d.]+) at the first evaluation, "
                                       r"([\d.]+) over the last three", text).groups())
    assert first == pytest.approx(image["evals"][0]["mean_return"], abs=0.05)
    late_evals = [e["mean_return"] for e in image["evals"][-3:]]
    assert late == pytest.approx(sum(late_evals) / 3, abs=0.05)
    # The animation cell rendered frames of the trained agent.
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    html = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.get("output_type") == "display_data" and "text/html" in o.get("data", {})]
    assert any("<img" in o["data"]["text/html"] or "animation" in o["data"]["text/html"]
               for o in html)


def plain_papermill(notebook: str, cwd: Path, out: Path, **parameters) -> str:
    """`papermill NOTEBOOK OUT -p SMOKE True ...` as the README gives it: no kernel name (the
    environment's default), from cwd; returns what it printed. It must succeed."""
    import subprocess
    import sys

    args = [sys.executable, "-m", "papermill", str(NOTEBOOKS_DIR / notebook), str(out),
            "-p", "SMOKE", "True", "--log-level", "ERROR"]
    for name, value in parameters.items():
        args += ["-p", name, str(value)]
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    run = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return run.stdout + run.stderr


def untracked_in_source() -> list[str]:
    """Files git does not track under notebooks/ and helpers/, ignored ones too."""
    import subprocess

    out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all",
                          "notebooks", "helpers"], cwd=NOTEBOOKS_DIR.parent, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return sorted(line for line in out.splitlines() if "__pycache__" not in line
                  and ".egg-info" not in line)


def test_plain_papermill_runs_03_from_any_folder_with_the_default_kernel(tmp_path):
    """The README's CI use: plain papermill, the environment's own kernel, from the repository
    root and from notebooks/. Paths resolve from the repository, outputs go where OUTPUT_DIR
    says, nothing lands in the source tree. test_01 runs 01 the same way from the root."""
    from distrl.tutorial import REPO_ROOT, run_dir

    assert run_dir("runs/x") == REPO_ROOT / "runs" / "x" and run_dir(tmp_path) == tmp_path
    before = untracked_in_source()
    for cwd in (REPO_ROOT, NOTEBOOKS_DIR):
        out = tmp_path / f"03-from-{cwd.name}"
        said = plain_papermill("03-create-gke-cluster.ipynb", cwd, out.with_suffix(".ipynb"),
                               OUTPUT_DIR=out, WORKLOAD="seed-scale")
        for printed in (said, stream_text(out.with_suffix(".ipynb"))):
            assert "Warning" not in printed, printed[-3000:]
        assert (out / "manifests" / "job" / "rayjob.yaml").is_file()
    assert untracked_in_source() == before


def test_error_lines_pass_over_rays_successful_kill_and_nothing_else(tmp_path):
    """Ray 2.60's GCS logs a successful kill of a starting actor at ERROR level (seen in CI,
    notebook 02); any other ERROR line of the GCS still counts, and so does a worker's."""
    import nbformat

    kill = ("\x1b[36m(pid=gcs_server)\x1b[0m [2026-12-03 15:02:58,235 E 32620 32620] (gcs_server) "
            "gcs_actor_scheduler.cc:538: Failed to kill actor 280f4418ea2ffadaa4caf57a01000000, "
            "return status: Invalid: KillActor RPC failed for actor "
            "280f4418ea2ffadaa4caf57a01000000: RpcError: RPC error: Socket closed rpc_code: 14")
    other = ("\x1b[36m(pid=gcs_server)\x1b[0m [2026-12-03 15:02:58,235 E 32620 32620] (gcs_server) "
             "gcs_actor_manager.cc:1773: Failed to create actor: Socket closed")
    # An absl ERROR line of a worker's native code, behind Ray's prefix for that worker.
    native = ("\x1b[36m(LearnerWorker pid=29434)\x1b[0m E0000 00:00:1796323457.078729   29547 "
              "cpu_aot_loader.cc:220] Loading XLA:CPU AOT result. Target machine feature +avx512f "
              "is not  supported on the host machine.")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr",
                                           text=f"{kill}\n{other}\n{native}\n")]
    nb.cells = [cell]
    nbformat.write(nb, tmp_path / "run.ipynb")
    assert error_lines(tmp_path / "run.ipynb") == [other, native]


def test_tutorial_runner_refuses_what_it_cannot_run(capsys):
    from distrl.tutorial import main

    assert main(["--only", "99"]) == 2
    assert "no notebooks matched ['99']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["-p", "not-a-parameter"])


def test_tutorial_runner_reports_a_failing_notebook_and_runs_the_rest(kernel, tmp_path, capsys):
    """A notebook that fails: its name, cell and error are reported, the notebooks after it
    still run, the table lists every one, and the exit code says something failed."""
    import nbformat

    from distrl.tutorial import main

    meta = {"kernelspec": {"name": kernel, "language": "python", "display_name": kernel},
            "language_info": {"name": "python"}}
    for name, code in (("01-fails.ipynb", "x = 1\nraise ValueError('bad value 42')"),
                       ("02-works.ipynb", "print('second ran')\nprint('ERROR demo: logged')")):
        params = nbformat.v4.new_code_cell("OUTPUT_DIR = ''")
        params.metadata["tags"] = ["parameters"]
        nb = nbformat.v4.new_notebook(metadata=meta)
        nb.cells = [params, nbformat.v4.new_code_cell(code)]
        nbformat.write(nb, tmp_path / name)
    code = main(["--kernel", kernel, "--notebooks-dir", str(tmp_path),
                 "--output-dir", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 1
    assert "01-fails.ipynb FAILED after" in captured.err
    assert "cell 3 ('x = 1'): ValueError: bad value 42" in captured.err
    assert "02-works.ipynb done in" in captured.out
    assert "02-works.ipynb: 1 ERROR-level line(s) in its outputs, the first: ERROR demo" \
        in captured.err  # it ran through, and what it logged is not hidden
    assert "FAILED" in captured.out and "ok" in captured.out  # the table
    assert "1 of 2 notebook(s) did not run through" in captured.err


def test_a_kernel_that_ran_through_is_shut_down_without_an_interrupt(kernel, tmp_path):
    """jupyter_client sends SIGINT before every shutdown; when it lands inside one of the
    kernel's message handlers, ipykernel logs "ERROR | KeyboardInterrupt caught in kernel." on
    the console of a run that went well (seen at notebook 04's end in `make tutorial`). Here the
    kernel keeps a SIGINT handler of its own after the cell, so an interrupt would show."""
    import nbformat

    from distrl.tutorial import run_notebook

    marker = tmp_path / "interrupted"
    params = nbformat.v4.new_code_cell("OUTPUT_DIR = ''")
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": kernel, "language": "python", "display_name": kernel}})
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import signal\n"
        "kernel = get_ipython().kernel\n"
        "kernel.pre_handler_hook = kernel.post_handler_hook = lambda: None  # keep it below\n"
        f"signal.signal(signal.SIGINT, lambda *_: open({str(marker)!r}, 'w').close())\n"
        "import os\nprint('ran in', os.getpid())")]
    nbformat.write(nb, tmp_path / "quiet.ipynb")
    executed = run_notebook(tmp_path / "quiet.ipynb", tmp_path / "out", kernel=kernel)
    pid = int(stream_text(executed).split("ran in")[1].split()[0])
    assert not marker.exists(), "the kernel was sent SIGINT at shutdown"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# The copy runs in this test's environment (the whole lock): what it imported must come from
# the box's pins or what they require (their extras aside), as in a project with only those.
# Ray's own start imports what it finds of its extras (aiohttp, pydantic, ...) and does
# without them: what it imported (BEFORE, kept after the first ray.init) and what that requires
# is allowed too; the copied code's own imports come after.
ONLY_THESE_PACKAGES = """
import importlib.metadata as md, re, sys
def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()
owners = md.packages_distributions()
started = [d for m in BEFORE if "." not in m and m != "distrl" for d in owners.get(m, [])]
allowed, todo = set(), list(PINS) + started
while todo:
    name = norm(todo.pop())
    if name in allowed:
        continue
    allowed.add(name)
    try:
        requires = md.requires(name) or []
    except md.PackageNotFoundError:
        continue
    todo += [re.match(r"[A-Za-z0-9_.-]+", r)[0] for r in requires if "extra ==" not in r]
used = {norm(d) for m in set(sys.modules) - BEFORE if "." not in m and m != "distrl"
        for d in owners.get(m, [])}
print("imported from outside the pins:", sorted(used - allowed))
"""


LUCKY_ENV = """
import gymnasium as gym
import numpy as np


class Lucky(gym.Env):
    \"\"\"One step an episode, paying 1 with probability 0.6 whatever the action.\"\"\"

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        reward = float(self.np_random.random() < 0.6)
        return np.zeros(2, np.float32), reward, True, False, {}


gym.register("Lucky-v0", entry_point=Lucky)
"""


def test_01s_copied_ape_x_runs_from_its_copy_box_alone(tmp_path: Path):
    """What a reader copies, as the box in notebook 01 says: the cells tagged `copy-path` (the
    140-line Ape-X, from ray.init() to its last figures) and the `parameters` cell, as a plain
    script beside a copy of helpers/distrl/rl/ and helpers/distrl/__init__.py alone: no other
    part of the package, no Jupyter. Run on CartPole and on Acrobot, whose returns are
    negative. The box's pip line pins what the lock pins."""
    import shutil
    import subprocess
    import sys

    nb = json.loads((NOTEBOOKS_DIR / "01-local-apex-dqn.ipynb").read_text())
    tagged = [c for c in nb["cells"] if "copy-path" in c["metadata"].get("tags", [])]
    [parameters] = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    assert len(tagged) >= 5, "the 140-line Ape-X's cells are tagged copy-path"
    code = [line for c in tagged for line in "".join(c["source"]).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    assert 130 <= len(code) <= 150, f"{len(code)} lines: say so in 01 and the README"
    [box] = [c for c in nb["cells"] if "Copy this into your project" in "".join(c["source"])]
    pins = re.search(r"pip install (.+)", "".join(box["source"]))[1].split()
    lock = (NOTEBOOKS_DIR.parent / "requirements.lock").read_text()
    assert all(re.search(rf"^{re.escape(p)}$", lock, re.M) for p in pins), pins
    assert {p.split("==")[0] for p in pins} >= {"ray", "tensorflow", "gymnasium", "numpy"}
    package = tmp_path / "copy" / "distrl"
    helpers = NOTEBOOKS_DIR.parent / "helpers" / "distrl"
    shutil.copytree(helpers / "rl", package / "rl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(helpers / "__init__.py", package / "__init__.py")
    # Acrobot's returns are negative. Lucky-v0, an environment the project does not use, pays 1
    # with probability 0.6 whatever the agent does: judged on one episode an evaluation, a lucky
    # draw at the target 0.9 comes every few evaluations, and no policy averages 0.9.
    (package.parent / "lucky_env.py").write_text(LUCKY_ENV)
    runs = (("CartPole-v1", 475.0, 5), ("Acrobot-v1", -100.0, 5), ("lucky_env:Lucky-v0", 0.9, 1))
    # One process, the cells twice (ray.init(ignore_reinit_error=True) keeps its Ray): what a
    # reader who changes ENV_ID and runs the cells again does, without a second start-up. After
    # each, the saved weights play 100 episodes none of the copy's evaluations played.
    script = "\n\n".join([
        "".join(parameters["source"]),
        *(part for env_id, target, episodes in runs for part in (
            f"ENV_ID, TARGET_RETURN, EVAL_EPISODES = {env_id!r}, {target}, {episodes}\n"
            f"MINIMAL_MAX_SECONDS = {20.0 if 'Lucky' in env_id else 60.0}\n"
            f"OUTPUT_DIR = 'out-{env_id}'\nprint('=== run of', ENV_ID)",
            "".join(tagged[0]["source"]), "import sys\nBEFORE = globals().get('BEFORE') or "
            "set(sys.modules)  # once, after the first ray.init",
            *("".join(c["source"]) for c in tagged[1:]),
            "from distrl.rl.envs import evaluate_greedy\n"
            "fresh, _ = evaluate_greedy(ENV_ID, trained, 100, 99_000_000, spec)\n"
            "print(f'fresh episodes of the saved weights: {fresh.mean():.1f}')")),
        "import importlib.util, distrl\n"
        "print('distrl from', distrl.__file__)\n"
        "assert importlib.util.find_spec('distrl.apex') is None\n"
        "ray.shutdown()",
        ONLY_THESE_PACKAGES.replace("PINS", repr([p.split("==")[0] for p in pins]))])
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    env.pop("GRPC_ENABLE_FORK_SUPPORT", None)  # the copied __init__ sets it, as for a reader
    run = subprocess.run([sys.executable, "-c", script],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert f"distrl from {package / '__init__.py'}" in run.stdout
    assert "grpc was imported before distrl" not in run.stderr
    said = run.stdout.split("=== run of ")[1:]
    assert [part.split()[0] for part in said] == [env_id for env_id, _, _ in runs], run.stdout[-2000:]
    for (env_id, target, _), out in zip(runs, said, strict=True):
        evaluations = [float(x) for x in re.findall(r"updates  greedy return +(-?[\d.]+)", out)]
        checks = re.findall(r"held-out check of those weights: (-?[\d.]+) over 100 new episodes: "
                            r"(kept|not yet)", out)
        # Every evaluation at the target, and only those, had its weights checked; a check
        # keeps them only at the target, and the first kept ends the run.
        assert len(checks) == sum(e >= target for e in evaluations), out[-2000:]
        assert [verdict == "kept" for _, verdict in checks] == [
            float(mean) >= target for mean, _ in checks], out[-2000:]
        reached = re.search(rf"(reached|did not reach) {target:g} in \d+ s, [\d,]+ "
                            r"transitions, [\d,]+ updates; (kept|last) weights saved to "
                            rf"out-{env_id}/apex-weights.npz", out)
        assert reached and (reached[1] == "reached") == (reached[2] == "kept"), out[-2000:]
        assert (reached[1] == "reached") == bool(checks and checks[-1][1] == "kept")
        fresh = float(re.search(r"fresh episodes of the saved weights: (-?[\d.]+)", out)[1])
        if reached[1] == "reached":  # 100 other new episodes agree with the held-out check
            assert fresh >= target - 0.1 * abs(target), (fresh, out[-2000:])
        assert re.search(r"\d+ arrays loaded from apex-weights.npz; .*greedy action \d", out)
        assert re.search(r"halfway to the target \(-?\d+\) first at \d+ s", out), out[-2000:]
    # Acrobot reached its target. Lucky-v0's lucky draws were each checked and refused: the
    # copy did not say "reached" from one evaluation.
    assert "reached -100 in" in said[1], said[1][-2000:]
    lucky = re.findall(r"held-out check of those weights: ([\d.]+) over 100 new episodes: (\w+)",
                       said[2])
    assert lucky and {verdict for _, verdict in lucky} == {"not"}, said[2][-2000:]
    assert "did not reach 0.9 in" in said[2] and "last weights saved" in said[2], said[2][-2000:]
    # Nothing it imported comes from a package the box's pip line does not bring.
    assert "imported from outside the pins: []" in run.stdout, run.stdout[-2000:]


def test_02_instrument_with_opentelemetry(kernel, tmp_path: Path):
    out_dir = tmp_path / "run"
    executed = run_notebook(
        NOTEBOOKS_DIR / "02-instrument-with-opentelemetry.ipynb", tmp_path,
        {"OUTPUT_DIR": str(out_dir), "SMOKE": True}, kernel=kernel, cell_timeout_s=600)
    assert error_lines(executed) == []
    assert_quiet(executed)
    summary = json.loads((out_dir / "telemetry_summary.json").read_text())
    assert summary["metric_types"] >= 14 and summary["points"] > 0
    # driver, learner, 2 actors, replay, evaluator: the run's own, not the notebook's demo
    assert summary["traces"] > 0 and summary["processes"] == 6
    assert summary["best_eval_return"] > 30  # learning showed (random play scores about 20)
    assert set(summary["overhead_env_steps_per_s"]) == {"off", "on"}
    # The trace across the Ray call, read from the store as the notebook's check reads it: the
    # notebook's rl.loop span and the Ray task's rl.sample span under it, from two processes.
    notebook, worker = summary["trace_across_ray_call"]
    assert notebook.startswith("notebook-") and worker.startswith("ray-worker-"), summary
    from distrl.otel.store import CollectorStore

    store = CollectorStore(out_dir / "otel.db")
    [root] = [s for s in store.spans() if s["attributes"].get("rl.loop.iteration") == 99]
    by_process = {s["resource"]["service.instance.id"]: s for s in store.spans(root["trace_id"])}
    assert set(by_process) == {notebook, worker}
    assert by_process[worker]["name"] == "rl.sample"
    assert by_process[worker]["parent_span_id"] == root["span_id"]
    assert re.search(rf"one trace across two processes: {notebook}'s rl.loop span and {worker}'s",
                     stream_text(executed))
    # Every process of the run stored telemetry (the notebook checks it after the run).
    assert summary["processes_reported"] == ["driver", "learner", "replay", "evaluator",
                                             "actor-0", "actor-1"]
    # The golden-signal panels are described by figures drawn from the same data.
    text = stream_text(executed)
    assert re.search(r"traffic: first env steps at \d+ s; median [\d,]+ env steps/s", text), text[-3000:]
    # The exported greedy return shows the rise, not only its end: it starts below half its best.
    first, best = map(float, re.search(r"greedy return: (\d+) at its first evaluation, best (\d+) "
                                       r"at \d+ s", text).groups())
    assert first <= best / 2, (first, best)
    # The raw-SDK cell's instruments arrived under the seed's scope names.
    demo = store.query("SELECT DISTINCT metric_type, scope FROM points WHERE json_extract("
                       "attributes, '$.\"rl.run.id\"') = 'raw-sdk-demo' ORDER BY metric_type")
    assert {r["scope"] for r in demo} == {"rl-training-meter"}
    assert [r["metric_type"] for r in demo] == [
        "prometheus.googleapis.com/rl.environment.reward.mean/gauge",
        "prometheus.googleapis.com/rl.loop.duration/histogram",
        "prometheus.googleapis.com/rl.sample.duration/histogram",
        "prometheus.googleapis.com/rl.sample.samples/counter"]


def test_02_fails_its_own_check_when_the_ray_tasks_exporter_has_no_token(kernel, tmp_path):
    """Notebook 02 up to its trace across a Ray call, with the token taken from the Ray task's
    hand-built exporter: the collector refuses the task's span, and the notebook's check of the
    store fails in that cell, naming the task's process, rather than calling it one trace."""
    import nbformat
    from papermill.exceptions import PapermillExecutionError

    nb = nbformat.read(NOTEBOOKS_DIR / "02-instrument-with-opentelemetry.ipynb", as_version=4)
    end = next(i for i, c in enumerate(nb.cells) if "sample_remotely.remote(" in c.source)
    call = "sample_remotely.remote(carrier, endpoint, str(collector.token_file))"
    assert call in nb.cells[end].source
    nb.cells[end].source = nb.cells[end].source.replace(
        call, "sample_remotely.remote(carrier, endpoint, None)")
    nb.cells = nb.cells[:end + 1] + [nbformat.v4.new_code_cell("collector.stop()\nray.shutdown()")]
    nbformat.write(nb, tmp_path / "02-without-token.ipynb")
    with pytest.raises(PapermillExecutionError, match=(
            r"RuntimeError: trace [0-9a-f]{32} has no span of the Ray task's process "
            r"ray-worker-\d+ in the store: its export was answered FAILURE")):
        run_notebook(tmp_path / "02-without-token.ipynb", tmp_path,
                     {"OUTPUT_DIR": str(tmp_path / "run"), "SMOKE": True}, kernel=kernel)
    from distrl.otel.store import CollectorStore

    spans = CollectorStore(tmp_path / "run" / "otel.db").spans()
    assert not [s for s in spans if s["resource"]["service.instance.id"].startswith("ray-worker")]


def test_03_create_gke_cluster_dry_run(kernel, tmp_path: Path):
    from distrl.gke import create as gke
    from distrl.gke import manifests
    from distrl.gke.settings import GkeSettings

    out_dir = tmp_path / "run"
    executed = run_notebook(
        NOTEBOOKS_DIR / "03-create-gke-cluster.ipynb", tmp_path,
        {"OUTPUT_DIR": str(out_dir), "PROJECT_ID": "demo-project-1", "PREFIX": "rl-demo",
         "GPU_TYPE": "nvidia-tesla-t4", "MODE": "autopilot", "WORKLOAD": "pong",
         "DRY_RUN": False, "SMOKE": True},
        kernel=kernel)
    assert error_lines(executed) == []
    assert_quiet(executed)
    text = stream_text(executed)
    import nbformat

    shown = "\n".join("".join(o.get("data", {}).get("text/plain", "")) for c in
                      nbformat.read(executed, as_version=4).cells if c.cell_type == "code"
                      for o in c.outputs)
    assert "dry run: commands are printed, nothing is created" in shown  # SMOKE forced it
    assert "gcloud container clusters create-auto rl-demo-cluster --region=us-central1" in text
    plan = gke.create_plan(GkeSettings.for_workload("pong", project_id="demo-project-1",
                                                    prefix="rl-demo", gpu_type="nvidia-tesla-t4",
                                                    mode="autopilot"),
                           out_dir / "manifests")
    for step in plan:  # every command of the plan, exactly as it would run
        assert str(step) in text, step.title
    assert f"all {len(plan)} steps printed" in text
    assert "USD per hour" in text and "USD per month" in text and "free tier credit" in text
    assert "USD per pong run of at most 4 h" in text
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in text and "secretName: rl-demo-ray-token" in text
    docs = manifests.load_dir(out_dir / "manifests")
    cluster_wide = ("Namespace", "StorageClass")
    assert {d["metadata"]["namespace"] for _, d in docs if d["kind"] not in cluster_wide} == {
        "rl-demo"}
    job = next(d for _, d in docs if d["kind"] == "RayJob")
    assert "--env ALE/Pong-v5" in job["spec"]["entrypoint"]


@pytest.mark.parametrize("workload", ["cartpole", "pong", "seed-scale"])
def test_03_runs_to_the_end_for_every_workload_and_prints_its_own_pool(workload, kernel,
                                                                       tmp_path: Path):
    """Each workload's dry run ends in Standard mode (the test above runs Pong on Autopilot),
    and names only its own pool: the actor machine and node count, the quotas it needs (with
    the smaller Spot shape where its machine is larger), and a run price with the Spot nodes'
    tails and a total."""
    from distrl.gke.cost import estimate_run_cost
    from distrl.gke.settings import WORKLOADS, GkeSettings

    assert set(WORKLOADS) == {"cartpole", "pong", "seed-scale"}  # a new one joins the list
    executed = run_notebook(
        NOTEBOOKS_DIR / "03-create-gke-cluster.ipynb", tmp_path,
        {"OUTPUT_DIR": str(tmp_path / "run"), "WORKLOAD": workload, "SMOKE": True},
        kernel=kernel)
    assert error_lines(executed) == []
    text = stream_text(executed)
    s = GkeSettings.for_workload(workload, project_id="my-project-id")
    run = estimate_run_cost(s)
    assert run.table() in text  # its own run, tails and total included
    assert sum("Spot tail" in line.item for line in run.lines) == 3
    assert f"about {run.min_per_hour:.2f}-{run.max_per_hour:.2f} USD per {workload} run" in text
    from distrl.gke.cost import estimate_run_through_cost

    through = estimate_run_through_cost(s)  # set-up, 04's jobs and teardown beside the run
    assert (f"a first run-through (this set-up, notebook 04's jobs, one run, teardown): about "
            f"{through.min_per_hour:,.2f}-{through.max_per_hour:,.2f} USD") in text
    import nbformat

    shown = "\n".join("".join(o.get("data", {}).get("text/plain", "")) for c in
                      nbformat.read(executed, as_version=4).cells if c.cell_type == "code"
                      for o in c.outputs)
    assert "https://console.cloud.google.com/iam-admin/quotas?project=my-project-id" in shown
    # the project-wide quotas that new projects most often lack are in the table too
    assert "CPUS_ALL_REGIONS" in shown and "GPUS_ALL_REGIONS" in shown
    smaller = "ACTOR_MACHINE_TYPE = 'e2-standard-8', MAX_ACTOR_NODES = 20: the same 120 actors"
    assert (smaller in shown) == (workload == "seed-scale")
    pools = set(re.findall(r"(\d+) x (e2-standard-\d+)", text))
    assert pools <= {(str(s.max_actor_nodes), s.actor_machine_type), ("2", "e2-standard-8")}, pools


def test_03_live_path_runs_the_plan_against_stand_ins(kernel, tmp_path: Path, stand_ins,
                                                     monkeypatch):
    """DRY_RUN=False with gcloud and kubectl stand-ins recording their argv: the notebook runs
    the prerequisite checks, every step of the plan, then (TEARDOWN=True) every undo."""
    from distrl.gke import create as gke

    home = tmp_path / "home"  # the notebook makes the Ray auth token in ~/.ray when missing
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    out_dir = tmp_path / "run"
    run_notebook(NOTEBOOKS_DIR / "03-create-gke-cluster.ipynb", tmp_path,
                 {"OUTPUT_DIR": str(out_dir), "PROJECT_ID": "demo-project-1", "DRY_RUN": False,
                  "TEARDOWN": True}, kernel=kernel)
    plan = gke.create_plan(GkeSettings(project_id="demo-project-1"), out_dir / "manifests",
                           home / ".ray" / "auth_token")
    p = "--project=demo-project-1"
    expected = [["gcloud", "version", "--format=json"],
                ["gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"],
                ["gcloud", "projects", "describe", "demo-project-1",
                 "--format=value(lifecycleState)"],
                ["gcloud", "auth", "print-access-token"],
                ["gcloud", "org-policies", "describe", "compute.vmExternalIpAccess", "--effective",
                 p, "--format=json"],
                ["gcloud", "billing", "projects", "describe", "demo-project-1",
                 "--format=value(billingEnabled)"],
                ["gcloud", "services", "list", "--enabled", p, "--format=value(config.name)"],
                ["gcloud", "compute", "regions", "describe", "us-central1", p, "--format=json"],
                ["gcloud", "compute", "project-info", "describe", p, "--format=json"]]
    for step in plan:  # describe before create, then the command
        expected += [list(step.exists)] if step.exists else []
        expected.append(list(step.argv))
    for step in gke.teardown_plan(plan):  # what the plan made carries its label: all deleted
        expected += [list(step.needs)] if step.needs else []
        expected += [list(step.owner.argv)] if step.owner else []
        expected.append(list(step.argv))
    # Then the inventory, which finds nothing of distrl's left (else the cell would have failed).
    expected += [list(argv) for _, argv in inventory_commands("demo-project-1")]
    assert stand_ins() == expected
    assert (home / ".ray" / "auth_token").stat().st_mode & 0o077 == 0


def test_03_live_path_without_a_login_stops_before_any_command(kernel, tmp_path: Path,
                                                               stand_ins, monkeypatch):
    from papermill.exceptions import PapermillExecutionError

    respond(monkeypatch, "auth list", "")
    with pytest.raises(PapermillExecutionError, match="gcloud auth login"):
        run_notebook(NOTEBOOKS_DIR / "03-create-gke-cluster.ipynb", tmp_path,
                     {"OUTPUT_DIR": str(tmp_path / "run"), "PROJECT_ID": "demo-project-1",
                      "DRY_RUN": False}, kernel=kernel)
    assert [argv[:3] for argv in stand_ins()] == [["gcloud", "version", "--format=json"],
                                                  ["gcloud", "auth", "list"]]


def test_05_refuses_an_alignment_cloud_monitoring_would_refuse(kernel, tmp_path: Path):
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError, match="ALIGNMENT_S=10: Cloud Monitoring needs "
                       "at least 60"):
        run_notebook(NOTEBOOKS_DIR / "05-explore-metrics.ipynb", tmp_path,
                     {"OUTPUT_DIR": str(tmp_path / "run"), "SOURCE": "cloud",
                      "PROJECT_ID": "my-project", "ALIGNMENT_S": 10}, kernel=kernel)


def test_04_distributed_training(kernel, tmp_path: Path):
    """The autoscaled local cluster from 0 actor nodes (at most 2), a job that loses a node once
    its actors run steadily and whose lost actor runs again as a new process on a replacement,
    a drain (`ray job stop`) once the learner holds mid-learning, a resumed job and a twin from
    zero; every follow has a timeout. The one end-to-end run of this scenario. The notebook
    checks each effect itself (a failed check is a cell error); this asserts the same."""
    out_dir = tmp_path / "run"
    executed = run_notebook(
        NOTEBOOKS_DIR / "04-distributed-training.ipynb", tmp_path,
        {"OUTPUT_DIR": str(out_dir), "SMOKE": True}, kernel=kernel, cell_timeout_s=600)
    assert error_lines(executed) == []
    assert_quiet(executed)
    text = stream_text(executed)
    first = json.loads((out_dir / "first-job-results.json").read_text())
    second = json.loads((out_dir / "fetched" / "results.json").read_text())
    assert second["reached_target"] and second["resumed_from"].endswith(".npz")
    assert "[autoscaler] node actors-1 starting" in text  # nodes came for the pending actors
    # The kill came once every actor ran steadily (the driver's line), and its story is told from
    # the run's own events: the kill, the driver's report, the replacement, the actor back.
    steady = text.index("actors running for 3 s:")
    assert steady < text.index("killed actors-"), text[-3000:]
    assert re.search(r"\d+\.\d s  actors-\d killed, with actor\(s\) \[\d\] on it", text), text[-3000:]
    assert re.search(r"\(\+ ?\d+\.\d s\)  actor \d lost", text), text[-3000:]
    assert re.search(r"\(\+ ?\d+\.\d s\)  node actors-\d joined", text), text[-3000:]
    # The dip and the lost actor running again as a new process (restarted by Ray), as the
    # notebook measured them from the run's record (autoscale.preemption_effects).
    loss = json.loads((out_dir / "node-loss.json").read_text())
    [lost] = loss["lost"]
    own = [loss[k]["lost_env_steps_per_s"] for k in ("before", "during", "after")]
    # its own steps stopped, then went on beside the other actor at the share of its pace that
    # the driver asks of every actor before the learner starts (on a machine whose load changed)
    assert own[0] > 0 and own[1] < 0.05 * own[0], loss
    assert own[2] >= STEADY_SHARE * loss["after"]["peer_env_steps_per_s"] > 0, loss
    assert str(lost) in loss["back"] and loss["back"][str(lost)] > loss["kill_t"], loss
    assert first["actor_restarts"][lost] >= 1, first["actor_restarts"]
    assert re.search(rf"the kill at [\d.]+ s; actor {lost} at [\d.]+ s \(\d restart\)\. env "
                     r"steps/s before / while it was gone / once it stepped again, until the learner "
                     r"started:\n  the lost actor: [\d,]+ / \d+ / [\d,]+\n"
                     r"  each other one: [\d,]+ / [\d,]+ / [\d,]+\n  all actors: ", text), text[-3000:]
    assert first["actor_states"] == ["running", "running"]
    # Learning waited for that recovery (--learn-after-recovery), not for the large replay.
    kinds = [e["kind"] for e in first["events"]]
    assert kinds.index("actor_back") < kinds.index("learning_starts") < kinds.index(
        "first_update"), kinds
    assert re.search(r"learning starts, with [\d,]+ transitions in replay, not 2,000,000", text)
    # The drain landed mid-learning: the learner held once its weights scored within the
    # notebook's HOLD_WITHIN on the first evaluation's episodes, the drain (SIGTERM, not a stop
    # of the job's own) came, and the learner checkpointed on it.
    low, high = 150.0, 450.0  # the notebook's HOLD_WITHIN
    assert first["stop_reason"] == "sigterm", (first["stop_reason"], first["stop_detail"])
    assert first["wall_time_s"] < 180  # SMOKE's budget
    held = [e for e in first["events"] if e["kind"] == "learner_held"]
    assert len(held) == 1 and f"held at {first['learner_updates']:,} updates" in held[0]["detail"]
    assert "the drain: SIGTERM to the driver" in text
    assert first["events"][-1]["kind"] == "stop" and "SIGTERM" in first["events"][-1]["detail"]
    # The resumed job began from the drain's checkpoint (whose file it may since have pruned:
    # it keeps its 3 newest).
    assert (Path(second["resumed_from"]).name == Path(first["checkpoint"]).name
            == f"checkpoint-{first['learner_updates']:09d}.npz"), (second["resumed_from"], first)
    # The resumed job began from the checkpoint's weights: its first evaluation played the
    # episodes the notebook evaluated the checkpoint on, with those weights, and scored the same,
    # within the hold's window: mid-learning, above an untrained network, below the target.
    found = re.search(r"checkpoint after [\d,]+ updates: greedy return ([\d.]+) \(untrained: "
                      r"([\d.]+); the first job's best before it: ([\d.]+|none \(its first "
                      r"evaluation was the hold's\)); target: 475\)", text)
    restored, untrained = float(found[1]), float(found[2])
    assert untrained < low <= restored < high < second["target_return"]
    # on the way up: the first job's earlier weights (if it evaluated any) scored no higher
    # than the window
    earlier = [e["mean_return"] for e in first["evals"]
               if e["weights_version"] < first["learner_updates"]]
    assert found[3] == (f"{max(earlier):.1f}" if earlier else
                        "none (its first evaluation was the hold's)")
    assert max(earlier, default=0) < high
    start = second["evals"][0]
    assert start["weights_version"] == first["learner_updates"], start
    assert start["mean_return"] == pytest.approx(restored, abs=0.05)
    assert second["learner_updates"] > first["learner_updates"]
    # The checkpoint kept the replay (the notebook checked the count against the checkpoint's
    # metadata, since pruned), and the resumed job's record says how much of it its replay
    # held: the staging's 4M replay was the first job's alone, the resumed job's has the
    # default size, and keeps the newest that fit.
    loaded, capacity = second["replay_loaded"], second["config"]["replay_capacity"]
    assert first["config"]["replay_capacity"] == 4_000_000 and capacity == 100_000
    assert 0 < loaded["held"] == min(loaded["sent"], capacity), loaded
    assert (f"its replay began with {loaded['held']:,} of the checkpoint's {loaded['sent']:,} "
            f"transitions, the newest, in a replay of {capacity:,}") in text
    # What the resume saved, read from the three jobs' own records: the twin from zero trained
    # to the target or for as many updates as the resumed job needed after its checkpoint, and
    # the notebook says which won. One run can go either way (the head start is the first
    # job's updates, fewer than runs from zero differ by); the claim is over seeds, in
    # benchmarks/resume_head_start.py's record, which the notebook reads and checks.
    zero = json.loads((out_dir / "job-from-zero" / "results.json").read_text())
    assert zero.get("resumed_from") is None and zero["learner_updates"] > 0
    assert zero["config"]["replay_capacity"] == capacity  # the same replay as the resumed job
    assert zero["target_return"] == second["target_return"] == 475

    def updates_to(result, since=0):
        hit = next((e for e in result["evals"] if e["mean_return"] >= 475), None)
        return None if hit is None else hit["weights_version"] - since

    resumed_needed = updates_to(second, since=first["learner_updates"])
    zero_needed = updates_to(zero)
    assert resumed_needed is not None
    assert zero["config"]["max_learner_updates"] == resumed_needed  # the race's length
    if zero_needed is None:  # stopped at the resumed job's count, short of the target
        assert zero["stop_reason"] == "max_learner_updates" and not zero["reached_target"]
        zero_said = f"the job from zero had not got there after as many ({zero['learner_updates']:,})"
    else:
        assert zero_needed <= resumed_needed and zero["reached_target"]
        zero_said = f"the job from zero needed {zero_needed:,} from zero"
    assert (f"to the target 475: the resumed job needed {resumed_needed:,} updates after its "
            "checkpoint") in text and f"\n{zero_said}: " in text, text[-3000:]
    saved = zero_needed is None or resumed_needed < zero_needed
    assert ("the resume saved updates" in text) == saved
    record = (RESULTS_DIR / "resume_head_start.txt").read_text()
    won, runs, ratio = re.search(r"^resumed with the replay's sample.*: (\d+) of (\d+) seeds "
                                 r"needed fewer updates resumed than from zero; median updates "
                                 r"resumed / from zero: ([\d.]+)", record, re.M).groups()
    assert 2 * int(won) > int(runs) and float(ratio) < 1  # what the notebook checked
    assert (f"over {runs} seeds on one node (resume_head_start.txt): the resume needed fewer "
            f"updates than from zero in {won}, and a median {float(ratio):.2f} of theirs") in text
    assert text.count(f"CartPole-v1: stopped ({first['stop_reason']})") <= 1  # printed once
    assert text.count("CartPole-v1: reached 475.0") == 1 + (zero_needed is not None)  # both jobs
    assert "Traceback" not in text and "StackTrace" not in text  # one line per event
    # Ape-X's own domain on the same cluster: Pong frames through an actor, the frame replay
    # and one update of the Nature torso.
    pong = json.loads((out_dir / "job-pong" / "results.json").read_text())
    assert pong["env_id"] == "ALE/Pong-v5" and pong["learner_updates"] == 1
    assert pong["replay_check"]["ok"] and pong["transitions_inserted"] >= 200
    assert re.search(r"Pong: [\d,]+ agent steps \([\d,]+ frames\), [\d,]+ transitions into the "
                     r"frame replay, 1 learner update; replay check: ok", text), text[-3000:]
    assert "processes left: 0" in text
    # The head stopped on SIGTERM, its monitor ended inside that stop (LocalCluster.stop), so
    # `ray start` reported no subprocess as having died.
    head_log = (out_dir / "cluster-logs" / "head.log").read_text()
    assert "received SIGTERM" in head_log and "exited unexpectedly" not in head_log, head_log[-3000:]


def test_05_explore_metrics(kernel, tmp_path: Path):
    out_dir = tmp_path / "run"
    executed = run_notebook(NOTEBOOKS_DIR / "05-explore-metrics.ipynb", tmp_path,
                            {"OUTPUT_DIR": str(out_dir), "SMOKE": True}, kernel=kernel,
                            cell_timeout_s=600)
    assert error_lines(executed) == []
    assert_quiet(executed)
    assert (out_dir / "otel.db").exists()  # the store lives under OUTPUT_DIR
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["environments"] == ["Acrobot-v1", "CartPole-v1"]  # trained both itself
    assert summary["run_id"].startswith("cartpole-")
    assert len(summary["tiles_with_data"]) == summary["tiles"]
    assert len(summary["golden_signal_charts_with_data"]) == 13
    # The fault (the CartPole learner hung on purpose, once the store showed it training)
    # made the sample-rate alert fire, on the collected data, during the fault and for that
    # run only: not at either run's start-up (the notebook's own check says the same).
    text = stream_text(executed)
    assert re.search(r"fault: the CartPole-v1 run's learner \(pid \d+\) hangs .*, once it trains",
                     text)
    assert summary["fault_at"] is not None and "sample-rate-drop" in summary["alerts_fired"]
    drops = [f for f in summary["firings"] if f["policy"] == "sample-rate-drop"]
    assert drops and all(f["series"] == summary["run_id"] for f in drops), summary["firings"]
    assert 0 < summary["sample_rate_alert_after_fault_s"] <= 12 + 2 * 5, summary  # FAULT_SECONDS
    assert re.search(r"the sample-rate alert fired \d+ s later, for cartpole-\d+ only", text)
    # The hang found in the data: the faulted run's learner stored nothing for about the fault's
    # 12 s, and no other process was silent as long (the notebook checks the same).
    silence = summary["longest_silence"]
    assert (silence["run"], silence["process"]) == (summary["run_id"], "learner"), silence
    assert 12 - 1 <= silence["silent_s"] <= 12 + 10, silence
    assert re.search(rf"the longest silence: learner of {summary['run_id']} stored nothing for "
                     r"[\d.]+ s", text)
    # The fault landed once the run had learned some: its greedy return on record reached 100,
    # and through the fault the evaluator played the hung learner's weights.
    assert re.search(r"hangs at .*, once it trains and scores 100, for 12 s", text)
    evaluator_wait = re.search(rf"{summary['run_id']}: best greedy mean \d+ \(\d+ periods\); "
                               r"its evaluator, which asks the learner for weights, waited with "
                               r"it: no evaluation from [\d:]+ to [\d:]+ \((\d+) s\)", text)
    assert evaluator_wait and int(evaluator_wait[1]) >= 12 - 1, text[-3000:]
    # Google's published RL dashboard, tile by tile: the empty ones are exactly the GPU and
    # token tiles, and each is explained.
    assert summary["google_tiles_empty"] == ["Samples/sec/GPU", "Tokens/sec", "Tokens/sec/GPU",
                                             "Total Tokens"]
    assert "no data: unexpected!" not in text and text.count("no data: ") == 4
    # The seed's own filters were sent and answered, and the corrected ones found data.
    assert text.count("-> the local collector: NOT_FOUND: Cannot find metric(s)") == 2
    assert "-> the local collector: INVALID_ARGUMENT:" in text and "fixed: " in text
    # The slowest work is a learner's or an actor's span, not the driver's poll.
    assert re.search(r"\d+ of \d+ spans of this trace reach past its root span", text)
