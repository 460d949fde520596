"""Command line: `python -m distrl.apex.train --env CartPole-v1 --num-actors 4 ...`.

Every ApexConfig field is an option (`--help` shows each field's docstring and default).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing

from distrl.apex.faults import StopFlag, catch_sigterm, restore_sigterm
from distrl.field_docs import field_help
from distrl.gke.settings import IMAGE_PYTHON_ENV
from distrl.rl.checkpoints import find_resume
from distrl.rl.config import PRESETS, ApexConfig

# Short spellings people expect, beside the field names.
ALIASES = {"env_id": ["--env"]}


def _none_or(cast):
    def parse(text: str):
        return None if text.lower() in {"none", "null", ""} else cast(text)
    parse.__name__ = cast.__name__
    return parse


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean: use true or false")


class _TupleOrNone(argparse.Action):
    """A tuple option: its values as a tuple, or None for a lone 'none'."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, None if values == [None] else tuple(values))


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
    """The options; defaults=False leaves unset options out of the result (for --resume)."""
    parser = argparse.ArgumentParser(
        prog="python -m distrl.apex.train",
        description="Train Ape-X DQN on Ray. Writes results.json, TensorBoard logs and "
                    "checkpoints to --output-dir.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(ApexConfig)
    docs = field_help(ApexConfig)
    for f in dataclasses.fields(ApexConfig):
        hint = hints[f.name]
        kwargs: dict = {"default": f.default if defaults else argparse.SUPPRESS,
                        "help": docs.get(f.name, ""), "dest": f.name}
        args = typing.get_args(hint)
        optional = type(None) in args
        base = next((a for a in args if a is not type(None)), hint) if optional else hint
        if base is bool:
            kwargs["type"] = _none_or(_bool) if optional else _bool
            kwargs["metavar"] = "{true,false,none}" if optional else "{true,false}"
        elif typing.get_origin(base) is tuple:
            element = typing.get_args(base)[0]
            kwargs["type"] = _none_or(element) if optional else element
            kwargs["nargs"] = "+"
            kwargs["action"] = _TupleOrNone
        else:
            kwargs["type"] = _none_or(base) if optional else base
        flags = [f"--{f.name.replace('_', '-')}", *ALIASES.get(f.name, [])]
        parser.add_argument(*flags, **kwargs)
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None if defaults
                        else argparse.SUPPRESS,
                        help="settings that suit one environment (rl.config.PRESETS) as the "
                             "defaults; the options given beside it override them")
    return parser


def config_from_args(argv: list[str] | None = None) -> ApexConfig:
    """The ApexConfig a command line asks for: the defaults, or --preset's, with the options
    given on top; with --resume, the checkpoint's config with the options given on top."""
    args = vars(build_parser().parse_args(argv))
    preset = args.pop("preset")
    if args["resume"] is not None:
        if preset is not None:
            raise ValueError(f"--preset {preset} with --resume: a resumed run keeps its "
                             "checkpoint's settings; give the options to change instead")
        return resumed_config(vars(build_parser(defaults=False).parse_args(argv)))
    if preset is not None:
        parser = build_parser()
        parser.set_defaults(**PRESETS[preset])
        args = vars(parser.parse_args(argv))
        args.pop("preset")
    return ApexConfig(**args)


def resumed_config(explicit: dict) -> ApexConfig:
    """--resume: the checkpoint's config, with the options given on this command line on top."""
    output_dir = explicit.get("output_dir")
    checkpoint_dir = explicit.get("checkpoint_dir") or (f"{output_dir}/checkpoints"
                                                        if output_dir else None)
    if explicit["resume"] == "auto" and checkpoint_dir is None:
        raise ValueError("resume='auto' needs --output-dir or --checkpoint-dir to look in")
    resume = find_resume(explicit["resume"], checkpoint_dir or "")
    for skipped in resume.skipped:
        print(f"warning: {skipped}; resuming from an older checkpoint", file=sys.stderr)
    return ApexConfig.from_dict(resume.meta["config"]).replace(
        **(explicit | {"resume": resume.path}))


def check_image_python() -> None:
    """In a pod (DISTRL_IMAGE_PYTHON set by the manifests): this Python is the one the image was
    built for, so every process of the job (driver, actors, learner) runs the lock's wheels."""
    expected = os.environ.get(IMAGE_PYTHON_ENV)
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if expected is not None and expected != running:
        raise ValueError(f"{IMAGE_PYTHON_ENV}={expected!r}, but this pod runs Python {running}: the "
                         "image and the manifests disagree; rebuild the image from the Dockerfile "
                         "or render the manifests with the image's Python (gke.settings.IMAGE_PYTHON)")


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (a Spot notice, `ray job stop`) is honoured from here on, start-up included: the
    # run then ends at once with results.json (and a checkpoint if the learner exists).
    early_sigterm = StopFlag()
    previous = catch_sigterm(early_sigterm)
    try:
        return _main(argv, early_sigterm)
    finally:
        restore_sigterm(previous)


def _main(argv: list[str] | None, early_sigterm: StopFlag) -> int:
    try:
        check_image_python()
        config = config_from_args(argv)
        from distrl.apex.driver import ApeX  # Ray and gymnasium load once the options are valid

        apex = ApeX(config)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = apex.train(sigterm=early_sigterm)
    outcome = (f"reached {result.target_return} in {result.time_to_target_s:.1f}s"
               if result.reached_target else f"stopped ({result.stop_reason}): {result.stop_detail}")
    best = ("no evaluation" if result.best_eval_return is None
            else f"best greedy return {result.best_eval_return}")
    print(f"{config.env_id}: {outcome}; {result.env_steps:,} env steps, "
          f"{result.learner_updates:,} learner update{'s' * (result.learner_updates != 1)}, "
          f"{best}; results in {result.output_dir}/results.json", flush=True)
    from distrl.apex.record import policy_lines

    # --resume auto continues from the latest; the best is the one to play
    for line in policy_lines(result.policies):
        print(f"  {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
