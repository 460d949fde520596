"""Notebook 01's copied Ape-X (its cells tagged copy-path, after its parameters cell) on an
environment of your choice, run as a reader runs it in a project of their own: the time to its
"reached" (the kept weights averaging the target over 100 new episodes), the lucky evaluations
its held-out check refused on the way, and what 100 other new episodes of the saved weights
average.

    python benchmarks/copy_path.py --env LunarLander-v3 --target 200 --seeds 0 1 [--smoke]

LunarLander-v3 needs box2d (`pip install box2d==2.3.10`), which the lock leaves out. Extra
ApexConfig fields go in with --config, e.g. --config "hidden_sizes=(256, 256), learning_rate=5e-4".
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01-local-apex-dqn.ipynb"
CONFIG_CALL = "target_return=TARGET_RETURN, seed=SEED)"  # where --config goes in


def copied_script(env_id: str, target: float, seed: int, max_seconds: float, config: str) -> str:
    """The parameters cell, the settings of this run, the copy-path cells, and a check of the
    saved weights on 100 episodes none of the copy's evaluations played."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    tagged = ["".join(c["source"]) for c in cells if "copy-path" in c["metadata"].get("tags", [])]
    [parameters] = ["".join(c["source"]) for c in cells
                    if "parameters" in c["metadata"].get("tags", [])]
    if config:
        if not any(CONFIG_CALL in cell for cell in tagged):
            raise SystemExit(f"the copy no longer ends its ApexConfig with {CONFIG_CALL!r}")
        tagged = [cell.replace(CONFIG_CALL, f"{CONFIG_CALL[:-1]}, {config})") for cell in tagged]
    return "\n\n".join([
        parameters,
        f"ENV_ID, TARGET_RETURN, SEED = {env_id!r}, {target!r}, {seed!r}\n"
        f"MINIMAL_MAX_SECONDS, OUTPUT_DIR = {max_seconds!r}, 'out'",
        *tagged,
        "from distrl.rl.envs import evaluate_greedy\n"
        "fresh, _ = evaluate_greedy(ENV_ID, trained, 100, 99_000_000, spec)\n"
        "print(f'other new episodes of the saved weights: {fresh.mean():.1f}')\n"
        "ray.shutdown()"])


def run(env_id: str, target: float, seed: int, max_seconds: float, config: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "helpers")}
    with tempfile.TemporaryDirectory(prefix="copy-path-") as cwd:
        done = subprocess.run([sys.executable, "-c", copied_script(env_id, target, seed,
                                                                    max_seconds, config)],
                              cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=max_seconds + 300)
    if done.returncode != 0:
        raise SystemExit(f"{env_id} seed {seed}: the copy failed:\n{done.stderr[-3000:]}")
    return done.stdout


def summary(env_id: str, seed: int, out: str) -> str:
    verdict = re.search(r"(reached|did not reach) (\S+) in (\d+) s", out)
    checks = re.findall(r"held-out check of those weights: (-?[\d.]+) over \d+ new episodes: "
                        r"(kept|not yet)", out)
    fresh = re.search(r"other new episodes of the saved weights: (-?[\d.]+)", out)
    refused = [float(mean) for mean, said in checks if said == "not yet"]
    kept = [float(mean) for mean, said in checks if said == "kept"]
    return (f"{env_id} seed {seed}: {verdict[1]} {verdict[2]} in {verdict[3]} s"
            + (f" (held-out mean {kept[0]:.1f})" if kept else "")
            + f"; lucky evaluations refused on the way: {len(refused)}"
            + (f" (held-out means {', '.join(f'{m:.1f}' for m in refused)})" if refused else "")
            + f"; 100 other new episodes of the saved weights: {fresh[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="LunarLander-v3")
    parser.add_argument("--target", type=float, default=200.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--config", default="", help="extra ApexConfig fields, as Python")
    parser.add_argument("--smoke", action="store_true", help="CartPole to 100, one seed")
    args = parser.parse_args()
    if args.smoke:
        args.env, args.target, args.seeds, args.max_seconds = "CartPole-v1", 100.0, [0], 40.0
    print(f"{args.env} to {args.target:g}, copy-path cells of {NOTEBOOK.name}"
          + (f", ApexConfig(..., {args.config})" if args.config else ", the copy's defaults"))
    for seed in args.seeds:
        print(summary(args.env, seed, run(args.env, args.target, seed, args.max_seconds,
                                          args.config)), flush=True)


if __name__ == "__main__":
    main()
