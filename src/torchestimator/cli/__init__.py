"""The `torchestimator` command: train, evaluate, predict, export, serve, inspect, warm-start, demo, records, launch.

Each group of subcommands lives in its own module and adds itself to the parser
(model_commands.py, serve_command.py, weights_commands.py, records.py, demo_command.py,
launch_command.py); a
command imports what it runs only when it runs, so `--help` stays light.

Two rules hold for every subcommand, applied here once the parser is built so a new flag
gets them for free: flags are spelled TF's way (`--num_shards`, `--no_progress`) and the
dashed spelling (`--num-shards`) is accepted as an alias; `--verbosity` is accepted before
and after the subcommand. `launch` keeps torchrun's own parser, which takes both spellings.

A failing command ends by whose mistake it is (``_report``): our error, one line, exit status 2;
an error that passed through the user's model file, its traceback and then one line saying where,
exit status 1; Ctrl-C, 130.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

from torchestimator.cli import model_file
from torchestimator.cli.model_file import load_model_file
from torchestimator.errors import TorchEstimatorError

__all__ = ["LOG_LEVELS", "build_parser", "load_model_file", "main"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_VERBOSITY_HELP = f"logging level: {', '.join(LOG_LEVELS)} (default INFO); before or after the subcommand"
# Subcommands whose parser is someone else's and already has its own spelling rules (torchrun's).
_OWN_FLAG_RULES = frozenset({"launch"})


class _Parser(argparse.ArgumentParser):
    """argparse's parser, where a prefix matching both spellings of ONE flag (`--num` for `--num_shards` and
    `--num-shards`) means that flag; argparse would call it ambiguous, since the alias is a second string."""

    def _get_option_tuples(self, option_string: str) -> list:
        matches = super()._get_option_tuples(option_string)
        by_action = {id(match[0]): match for match in matches}
        return list(by_action.values())


class _VersionAction(argparse.Action):
    """``--version``: worked out only when asked (reading package metadata, not importing torch)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_line())  # stdout, as argparse's own version action does
        parser.exit()


def version_line() -> str:
    """``torchestimator 0.1.0 (torch 2.13.0; records: compiled, examples: compiled)``."""
    from importlib import metadata

    from torchestimator import _native

    def installed(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"torchestimator {installed('torchestimator')} (torch {installed('torch')}; {_native.describe()})"


def build_parser() -> argparse.ArgumentParser:
    from torchestimator.cli import (
        demo_command,
        keras_command,
        launch_command,
        model_commands,
        records,
        serve_command,
        weights_commands,
    )

    parser = _Parser(
        prog="torchestimator",
        description="The TensorFlow Estimator workflow on PyTorch.",
        epilog=model_file.contract_help(),  # the names a model file defines, for every command that reads one
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--verbosity", default="INFO", help=_VERBOSITY_HELP)
    parser.add_argument(
        "--version",
        action=_VersionAction,
        nargs=0,
        help="print the version, torch's, and which path (compiled or pure Python) the data cores run",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    model_commands.add_commands(commands)  # train, train-and-evaluate, evaluate, predict, export
    weights_commands.add_commands(commands)  # inspect, warm-start
    serve_command.add_command(commands)
    demo_command.add_commands(commands)  # plot, demo
    convert_commands = records.add_subcommands(commands)  # convert csv-to-tfrecord, records inspect, records verify
    keras_command.add_command(convert_commands)  # convert keras-model
    launch_command.add_command(commands)
    for subparser in _subparsers(parser):
        _accept_verbosity(subparser)
        _accept_both_spellings(subparser)
        _epilog_of_the_model_file(subparser)
    return parser


def _epilog_of_the_model_file(parser: argparse.ArgumentParser) -> None:
    """A command that reads a model file ends its --help with the names it reads (model_file.MODEL_FILE_NAMES)."""
    command = parser.prog.partition(" ")[2]  # "torchestimator train" -> "train"; "records inspect" is no match
    if any(command in row.read_by for row in model_file.MODEL_FILE_NAMES):
        parser.epilog = model_file.contract_help(command)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below `parser` (`records`, `records inspect`, ...), except those with their own flag rules."""
    found: dict[int, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():  # aliases map to the same parser: kept once
                if name not in _OWN_FLAG_RULES and id(subparser) not in found:
                    found[id(subparser)] = subparser
                    found.update((id(below), below) for below in _subparsers(subparser))
    return list(found.values())


def _accept_verbosity(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: the subcommand's namespace has no verbosity unless it was given there, so a value given
    # before the subcommand (or the default) is not overwritten.
    if "--verbosity" not in parser._option_string_actions:
        parser.add_argument("--verbosity", default=argparse.SUPPRESS, help=_VERBOSITY_HELP)


def _accept_both_spellings(parser: argparse.ArgumentParser) -> None:
    """`--a_b` primary (first in help and usage), `--a-b` an alias of the same flag, whichever was declared."""
    for action in parser._actions:
        spellings: list[str] = [option for option in action.option_strings if not option.startswith("--")]
        for option in action.option_strings:
            if option.startswith("--"):
                body = option[2:]
                spellings += ["--" + body.replace("-", "_"), "--" + body.replace("_", "-")]
        spellings = list(dict.fromkeys(spellings))
        for option in spellings:
            owner = parser._option_string_actions.setdefault(option, action)
            # Our invariant: no two flags of one command differ only in spelling.
            assert owner is action, f"{parser.prog}: {option} names two flags ({owner.dest}, {action.dest})"
        action.option_strings = spellings


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = str(args.verbosity).upper()
    if level == "WARN":
        level = "WARNING"
    if level not in LOG_LEVELS:
        print(
            f"torchestimator {args.command}: error: --verbosity {args.verbosity!r} is not a logging level; "
            f"use one of {', '.join(LOG_LEVELS)}.",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if level != "DEBUG":  # the store clients' INFO lines ("Found credentials in environment variables") are noise
        for name in ("botocore", "aiobotocore", "s3fs", "gcsfs", "adlfs", "azure", "google", "urllib3"):
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return args.handler(args)
    except KeyboardInterrupt as interrupt:  # str(): the exception object itself is always true
        print(f"torchestimator {args.command}: {str(interrupt) or 'interrupted'}", file=sys.stderr)
        return 130
    except Exception as error:
        return _report(args, error)


def _report(args: argparse.Namespace, error: Exception) -> int:
    """What a failed command prints, by whose mistake it is.

    Ours (a TorchEstimatorError): one line, since it names what is wrong and what to do. The user's (the
    error passed through their model file): its traceback, since the frames are what they need, then one
    line saying where. Any other ValueError/TypeError/OSError of our code (a bad path, a refused value): one
    line, the traceback with --verbosity DEBUG. Anything else is our bug: raised, with its traceback.
    """
    prefix = f"torchestimator {args.command}: error:"
    found = None if isinstance(error, TorchEstimatorError) else model_file.user_frame(error)
    if found is not None:
        where, frame = found
        traceback.print_exception(error, file=sys.stderr)
        print(
            f"{prefix} {type(error).__name__} in {where}, line {frame.lineno}, in {frame.name} "
            f"(the traceback above){_param_note(args)}: {_first_line(error)}",
            file=sys.stderr,
        )
        return 1
    if isinstance(error, (TorchEstimatorError, ValueError, TypeError, OSError)):
        logging.getLogger("torchestimator").debug("details", exc_info=error)
        print(f"{prefix} {error}", file=sys.stderr)
        return 2
    raise error


def _param_note(args: argparse.Namespace) -> str:
    """'; params from --param: hidden='abc'' when the command took --param flags (a bad one often ends here)."""
    flags = getattr(args, "param", None) or []
    try:
        overrides = model_file.parse_overrides(flags)
    except TorchEstimatorError:
        return ""
    return (
        "; params from --param: " + ", ".join(f"{name}={value!r}" for name, value in overrides.items())
        if overrides
        else ""
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
