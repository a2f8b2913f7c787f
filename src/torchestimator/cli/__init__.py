"""The `torchestimator` command: train, evaluate, predict, export, serve, inspect, warm-start, demo, records, launch.

Each group of subcommands lives in its own module and adds itself to the parser
(model_commands.py, serve_command.py, weights_commands.py, records.py, demo_command.py,
launch_command.py); a
command imports what it runs only when it runs, so `--help` stays light.
"""

from __future__ import annotations

import argparse
import logging
import sys

from torchestimator.cli.model_file import load_model_file
from torchestimator.errors import TorchEstimatorError

__all__ = ["build_parser", "load_model_file", "main"]


def build_parser() -> argparse.ArgumentParser:
    from torchestimator.cli import demo_command, launch_command, model_commands, records, serve_command, weights_commands

    parser = argparse.ArgumentParser(prog="torchestimator", description="The TensorFlow Estimator workflow on PyTorch.")
    parser.add_argument("--verbosity", default="INFO", help="logging level (DEBUG, INFO, WARNING)")
    commands = parser.add_subparsers(dest="command", required=True)
    model_commands.add_commands(commands)  # train, train-and-evaluate, evaluate, predict, export
    weights_commands.add_commands(commands)  # inspect, warm-start
    serve_command.add_command(commands)
    demo_command.add_commands(commands)  # plot, demo
    records.add_subcommands(commands)  # convert csv-to-tfrecord, records inspect, records verify
    launch_command.add_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except (TorchEstimatorError, ValueError, TypeError, OSError) as error:  # one line; --verbosity DEBUG: traceback
        logging.getLogger("torchestimator").debug("details", exc_info=True)
        print(f"torchestimator {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        print(f"torchestimator {args.command}: {interrupt or 'interrupted'}", file=sys.stderr)
        return 130
