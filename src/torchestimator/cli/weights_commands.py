"""`inspect` (what a checkpoint or model_dir holds) and `warm-start` (a dry run of what warm start would load)."""

from __future__ import annotations

import argparse
from typing import Any

from torchestimator.cli.model_file import load_model_file, parse_overrides, require


def add_commands(commands: Any) -> None:
    """`inspect` (a checkpoint or model_dir) and `warm-start` (a dry run of what warm start would load)."""
    inspect = commands.add_parser("inspect", help="list variables of a checkpoint and the history of a model_dir")
    inspect.add_argument("path", help="a model_dir, a ckpt-<step> folder or a .safetensors file")
    inspect.set_defaults(handler=_inspect)

    warm = commands.add_parser("warm-start", help="dry run: what warm start would load into a model, from where")
    warm.add_argument("source", help="weights: model_dir, TF checkpoint, .h5/.weights.h5/.keras, .pt/.pth/.bin, .safetensors")
    warm.add_argument("--model", required=True, help="FILE.py (or module) defining model (and params)")
    warm.add_argument("--dry-run", action="store_true", help="only report (the only mode: warm start itself "
                      "happens in train through Estimator(warm_start_from=...))")
    warm.add_argument("--vars", nargs="+", default=[".*"], help="vars_to_warm_start regexes (one: trainable only)")
    warm.add_argument("--include_buffers", action="store_true", help="treat --vars as a list: buffers too (BatchNorm)")
    warm.add_argument("--rename", action="append", default=[], metavar="TARGET=SOURCE", help="var_name_to_prev_var_name")
    warm.add_argument("--allow_missing", action="store_true")
    warm.add_argument("--accept_proposed_mapping", action="store_true")
    warm.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    warm.add_argument("--json", action="store_true", help="the plan as JSON")
    warm.set_defaults(handler=_warm_start)


def _inspect(args: argparse.Namespace) -> int:
    from torchestimator.cli.inspection import describe

    print(describe(args.path))
    return 0


def _warm_start(args: argparse.Namespace) -> int:
    from torchestimator._core.calling import call_factory
    from torchestimator.warm_start import WarmStartSettings, plan_warm_start

    module_file = load_model_file(args.model)
    params = {**getattr(module_file, "params", {}), **parse_overrides(args.param)}
    source = require(module_file, "model")
    model = source if not callable(source) or hasattr(source, "state_dict") else call_factory(
        source, params, None, first_is_params=True)
    renames = dict(pair.split("=", 1) for pair in args.rename)
    selection: str | list[str] = args.vars[0] if len(args.vars) == 1 and not args.include_buffers else args.vars
    settings = WarmStartSettings(args.source, vars_to_warm_start=selection, var_name_to_prev_var_name=renames or None,
                                 allow_missing=args.allow_missing, accept_proposed_mapping=args.accept_proposed_mapping)
    plan = plan_warm_start(model, settings)
    try:
        print(plan.to_json() if args.json else plan.format())
    finally:
        plan.close()
    return 0 if plan.ok else 1
