"""`torchestimator demo` (train and evaluate the digits demo, printing what to run next) and `plot`.

The demo ends with the commands that use what it made, one per line as
``  <label>: <command>`` under a ``next ...`` header. Each runs exactly as
printed, from the folder the demo ran in (tests/test_demo_hints.py runs every
one); labels never contain a colon, so a line splits at its first ``: ``.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from torchestimator._io import filesystems

NEXT_STEPS_HEADER = "next (each command runs as printed, from this folder):"
DEFAULT_REST_API_PORT = 8501  # TF Serving's, and `serve`'s


def add_commands(commands: Any) -> None:
    """`plot` and `demo`."""
    _add_plot(commands)
    _add_demo(commands)


def _add_plot(commands: Any) -> None:
    plot = commands.add_parser("plot", help="PNG of training loss and evaluation metrics against step")
    plot.add_argument("model_dir", help="a model_dir with event files (training, and eval/ or eval_<name>/)")
    plot.add_argument("--output", help="PNG path (default MODEL_DIR/metrics.png)")
    plot.set_defaults(handler=_plot)


def _add_demo(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="train and evaluate the digits demo (resumes when rerun), then print "
        "the commands that run, serve and ask its export",
    )
    demo.add_argument(
        "--model_dir",
        default="runs/digits",
        help="where the demo trains and exports (default runs/digits); a rerun resumes from it",
    )
    demo.add_argument(
        "--max_steps", type=int, default=None, help="global step to train to (default: the demo's own, 1000)"
    )
    demo.add_argument("--no_progress", action="store_true", help="no progress bar")
    demo.add_argument(
        "--rest_api_port",
        type=int,
        default=DEFAULT_REST_API_PORT,
        help=f"the port in the printed serve and curl commands, 1-65535 (default {DEFAULT_REST_API_PORT})",
    )
    demo.set_defaults(handler=_demo)


def _plot(args: argparse.Namespace) -> int:
    from torchestimator.cli.plot import plot_model_dir

    print(f"wrote {plot_model_dir(args.model_dir, args.output)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from torchestimator.cli import demo
    from torchestimator.cli.serve_command import check_port

    check_port(
        args.rest_api_port,
        "--rest_api_port",
        lowest=1,
        why="cannot be printed in the serve and curl commands, which need one fixed port",
    )
    steps = {} if args.max_steps is None else {"steps": args.max_steps}
    outcome = demo.run(model_dir=args.model_dir, progress_bar=False if args.no_progress else None, **steps)
    _print_results(outcome, args.model_dir)
    curves, plot_problem = _draw_curves(args.model_dir)
    print(f"curves: {curves}" if curves else f"curves: not drawn ({plot_problem})")
    print(
        f"event files for TensorBoard: {args.model_dir} (training), {filesystems.join(args.model_dir, 'eval')} "
        "(evaluation)"
    )
    steps_next = next_steps(outcome, args.model_dir, args.rest_api_port, plotted=curves is not None)
    if steps_next:
        print(NEXT_STEPS_HEADER)
        for label, command in steps_next:
            print(f"  {label}: {command}")
    return 0


def _print_results(outcome: dict, model_dir: str) -> None:
    results = outcome["results"]
    if outcome["resumed_from"] is None:
        print(f"digits demo: trained from scratch to step {results['global_step']} in {model_dir}")
    else:
        print(
            f"digits demo: resumed from {outcome['resumed_from']} instead of starting over "
            f"(now at step {results['global_step']})"
        )
    print(
        f"digits demo: held-out accuracy {results['accuracy']:.4f}, loss {results['loss']:.4f}, "
        f"global step {results['global_step']}, model_dir {model_dir}"
    )
    if outcome["best_accuracy"] is not None:
        print(f"best held-out accuracy {outcome['best_accuracy']:.4f} at {outcome['best_checkpoint']}")
    for name, path in outcome["exports"].items():
        print(f"{name} export: {path}")


def _draw_curves(model_dir: str) -> tuple[str | None, str | None]:
    """The PNG's path, or None and why not (matplotlib, the plot extra, is missing)."""
    try:
        from torchestimator.cli.plot import plot_model_dir

        return plot_model_dir(model_dir), None
    except ImportError as error:
        return None, str(error)


def next_steps(outcome: dict, model_dir: str, port: int, *, plotted: bool) -> list[tuple[str, str]]:
    """(label, shell command) for what to do with the demo's export: run it alone, serve it, wait, ask it."""
    found = []
    if "best" in outcome["exports"]:
        base = shlex.quote(os.path.dirname(outcome["exports"]["best"]))
        request = outcome["serving_request"]
        url = f"http://127.0.0.1:{port}/v1/models/digits"
        port_flag = "" if port == DEFAULT_REST_API_PORT else f" --rest_api_port {port}"
        found += [
            ("run the best export alone", f"torchestimator predict --exported {base} --input {shlex.quote(request)}"),
            (
                "serve it (leave it running)",
                f"torchestimator serve --model_name digits --model_base_path {base}{port_flag}",
            ),
            ("in a second shell, wait until it answers", f"until curl -sf {url} > /dev/null; do sleep 1; done"),
            ("then ask it", f"curl -d {shlex.quote('@' + request)} {url}:predict"),
        ]
    if not plotted:
        found.append(
            (
                "plot the curves (pip install 'torchestimator[plot]' first)",
                f"torchestimator plot {shlex.quote(model_dir)}",
            )
        )
    return found
