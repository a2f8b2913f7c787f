"""`torchestimator demo` (train and evaluate the digits demo, printing what to run next) and `plot`."""

from __future__ import annotations

import argparse
import os
from typing import Any


def add_commands(commands: Any) -> None:
    """`plot` and `demo`."""
    _add_plot(commands)
    _add_demo(commands)


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
