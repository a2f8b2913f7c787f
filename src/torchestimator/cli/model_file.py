"""Loading a model file: FILE.py or an importable module that defines model, model_fn, optimizer, input_fns.

A model file defines, by name: model, model_fn, optimizer, and the input
functions train_input_fn, eval_input_fn, predict_input_fn; optionally params
(dict), config (RunConfig), lr_scheduler and max_steps. Flags override what
the file sets.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Any

import numpy as np


def load_model_file(location: str) -> ModuleType:
    """Imports FILE.py by path, or a module by dotted name."""
    if location.endswith(".py") or os.sep in location:
        if not os.path.isfile(location):
            raise SystemExit(f"torchestimator: model file {location!r} does not exist.")
        name = "torchestimator_model_file_" + os.path.splitext(os.path.basename(location))[0]
        spec = importlib.util.spec_from_file_location(name, location)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, os.path.dirname(os.path.abspath(location)))
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(location)
    except ModuleNotFoundError as error:
        if error.name is None or not location.startswith(error.name):
            raise  # the module exists and imports something missing: its own traceback says what
        raise SystemExit(f"torchestimator: no model file or module {location!r} (no module named {error.name!r}). "
                         "Give FILE.py or an importable module name.") from error


def require(module: ModuleType, name: str) -> Any:
    if not hasattr(module, name):
        raise SystemExit(f"torchestimator: {module.__name__} does not define {name!r}, which this command needs.")
    return getattr(module, name)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"torchestimator: --param expects NAME=VALUE; received {pair!r}.")
        key, text = pair.split("=", 1)
        try:
            overrides[key] = json.loads(text)
        except json.JSONDecodeError:
            overrides[key] = text
    return overrides


def build_estimator(module: ModuleType, args: argparse.Namespace) -> Any:
    import torchestimator as te

    params = {**getattr(module, "params", {}), **parse_overrides(args.param)}
    config = getattr(module, "config", None) or te.RunConfig()
    changes: dict[str, Any] = {"model_dir": args.model_dir}
    if args.no_progress:
        changes["progress_bar"] = False
    config = config.replace(**changes)
    return te.Estimator(
        model_fn=require(module, "model_fn"), model=require(module, "model"),
        optimizer=getattr(module, "optimizer", None), config=config, params=params,
        lr_scheduler=getattr(module, "lr_scheduler", None),
    )


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_file", help="FILE.py or an importable module defining model, model_fn, optimizer, input_fns")
    parser.add_argument("--model_dir", required=True, help="where checkpoints and summaries live")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override params[NAME] (VALUE parsed as JSON when it can be)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


