"""The `torchestimator` command: train, evaluate, predict, export, serve, inspect, warm-start, demo, records, launch.

Each group of subcommands lives in its own module and adds itself to the parser
(model_commands.py, serve_command.py, weights_commands.py, records.py); a
command imports what it runs only when it runs, so `--help` stays light.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from torchestimator.cli.model_file import load_model_file
from torchestimator.errors import TorchEstimatorError

__all__ = ["build_parser", "load_model_file", "main"]


def build_parser() -> argparse.ArgumentParser:
    from torchestimator.cli import model_commands, records, serve_command, weights_commands

    parser = argparse.ArgumentParser(prog="torchestimator", description="The TensorFlow Estimator workflow on PyTorch.")
    parser.add_argument("--verbosity", default="INFO", help="logging level (DEBUG, INFO, WARNING)")
    commands = parser.add_subparsers(dest="command", required=True)
    model_commands.add_commands(commands)  # train, train-and-evaluate, evaluate, predict, export
    weights_commands.add_commands(commands)  # inspect, warm-start
    serve_command.add_command(commands)
    _add_plot(commands)
    _add_demo(commands)
    records.add_subcommands(commands)  # convert csv-to-tfrecord, records inspect, records verify
    _add_launch(commands)
    return parser


def _add_plot(commands: Any) -> None:
    plot = commands.add_parser("plot", help="PNG of training loss and evaluation metrics against step")
    plot.add_argument("model_dir")
    plot.add_argument("--output", help="PNG path (default MODEL_DIR/metrics.png)")
    plot.set_defaults(handler=_plot)


def _add_demo(commands: Any) -> None:
    demo = commands.add_parser("demo", help="train and evaluate the digits demo (resumes when rerun)")
    demo.add_argument("--model_dir", default="runs/digits")
    demo.add_argument("--max_steps", type=int, default=1000)
    demo.add_argument("--no_progress", action="store_true")
    demo.set_defaults(handler=_demo)


def _add_launch(commands: Any) -> None:
    from torchestimator.distribute.launcher import launch_parser

    # torchrun's own parser is the parent, so every torchrun option (--nnodes MIN:MAX, --node_rank,
    # --rdzv_backend/--rdzv_endpoint/--rdzv_id, --max_restarts, ...) is accepted in both spellings.
    torchrun = launch_parser()
    launch = commands.add_parser("launch", parents=[torchrun], add_help=False, description=torchrun.description,
                                 help="run a script in N processes per node, on one or several machines (torchrun)")
    launch.set_defaults(handler=_launch)


def _plot(args: argparse.Namespace) -> int:
    from torchestimator.cli.plot import plot_model_dir

    print(f"wrote {plot_model_dir(args.model_dir, args.output)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from torchestimator.cli import demo

    outcome = demo.run(model_dir=args.model_dir, steps=args.max_steps, progress_bar=False if args.no_progress else None)
    results = outcome["results"]
    if outcome["resumed_from"] is None:
        print(f"digits demo: trained from scratch to step {results['global_step']} in {args.model_dir}")
    else:
        print(f"digits demo: resumed from {outcome['resumed_from']} instead of starting over "
              f"(now at step {results['global_step']})")
    print(f"digits demo: held-out accuracy {results['accuracy']:.4f}, loss {results['loss']:.4f}, "
          f"global step {results['global_step']}, model_dir {args.model_dir}")
    if outcome["best_accuracy"] is not None:
        print(f"best held-out accuracy {outcome['best_accuracy']:.4f} at {outcome['best_checkpoint']}")
    for name, path in outcome["exports"].items():
        print(f"{name} export: {path}")
    if "best" in outcome["exports"]:
        base = os.path.dirname(outcome["exports"]["best"])
        print(f"run it alone: torchestimator predict --exported {base} --input inputs.npz   "
              "(inputs.npz holds image: float32 [N, 64])")
        print(f"serve it: torchestimator serve --model_name digits --model_base_path {base}")
        print(f"then ask it: curl -d @{outcome['serving_request']} http://127.0.0.1:8501/v1/models/digits:predict")
    try:
        from torchestimator.cli.plot import plot_model_dir

        print(f"curves: {plot_model_dir(args.model_dir)}   TensorBoard: tensorboard --logdir {args.model_dir}")
    except ImportError:
        print(f"curves: pip install 'torchestimator[plot]', then torchestimator plot {args.model_dir}")
    return 0


def _launch(args: argparse.Namespace) -> int:
    from torchestimator.distribute.launcher import prepare_torchrun_arguments, run_torchrun

    return run_torchrun(prepare_torchrun_arguments(args))


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
