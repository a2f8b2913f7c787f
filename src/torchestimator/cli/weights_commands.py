"""`inspect` (what a checkpoint or model_dir holds) and `warm-start` (what warm start would load, and writing it).

`warm-start` takes the settings of ``WarmStartSettings`` as flags (``--map`` for
var_name_to_prev_var_name, ``--converter`` for converters, ``--accept_proposed``), reports the
plan with its advice worded as these flags, and with ``--write OUT`` applies it to the model the
file builds and writes the result: a fresh model_dir's step-0 checkpoint that ``train`` resumes
from, or a ``.safetensors`` file. Exit status: 0 the plan is sound (and written), 1 it is not
(nothing written), 2 an error (a bad flag, an unreadable source, a refused output).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from torchestimator.cli.inspection import PATH_HELP
from torchestimator.cli.model_file import load_model_file, model_params, require
from torchestimator.errors import ConfigError


def add_commands(commands: Any) -> None:
    """`inspect` (a checkpoint or model_dir) and `warm-start` (plan, and with --write apply, a warm start)."""
    inspect = commands.add_parser("inspect", help="list variables of a checkpoint and the history of a model_dir")
    inspect.add_argument("path", help=PATH_HELP)
    inspect.set_defaults(handler=_inspect)
    _add_warm_start(commands)


def _add_warm_start(commands: Any) -> None:
    from torchestimator.interop.layouts import CONVERTER_SPECS

    warm = commands.add_parser(
        "warm-start",
        help="what warm start would load into a model, from where (--dry_run); --write OUT writes it",
        description="Plan a warm start of the model FILE.py builds from SOURCE and print the plan (what loads, from "
        "where, converted how, what stays fresh). With --write OUT, apply it and write the result: a "
        "fresh model_dir whose step-0 checkpoint `torchestimator train` resumes from, or a .safetensors "
        "file. Exit status: 0 the plan is sound, 1 it is not (nothing written), 2 an error.",
    )
    warm.add_argument(
        "source",
        help="the weights: a model_dir, a TF checkpoint, .h5/.weights.h5/.keras, .pt/.pth/.bin or .safetensors",
    )
    warm.add_argument("--model", required=True, help="FILE.py (or a module name) defining model (and params)")
    mode = warm.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry_run", "--dry-run", action="store_true", help="only print the plan; nothing is written (the default)"
    )
    mode.add_argument(
        "--write",
        metavar="OUT",
        help="apply the plan and write the result: OUT ending in .safetensors gets the warm-started "
        "state_dict (target names); any other OUT is a model_dir that gets a step-0 checkpoint "
        "(refused if it has checkpoints already). Nothing is written unless the plan is sound",
    )
    warm.add_argument(
        "--vars",
        nargs="+",
        default=[".*"],
        metavar="REGEX",
        help="vars_to_warm_start: one regex selects among trainable parameters (default '.*'); "
        "several, or one with --include_buffers, among parameters and buffers",
    )
    warm.add_argument(
        "--include_buffers",
        action="store_true",
        help="treat --vars as a list, so buffers (BatchNorm running statistics) are selected too",
    )
    warm.add_argument(
        "--map",
        "--rename",
        action="append",
        default=[],
        metavar="TARGET=SOURCE",
        dest="map",
        help="var_name_to_prev_var_name: load the module's TARGET from the source's SOURCE "
        "(repeatable; --rename is the old name)",
    )
    warm.add_argument(
        "--converter",
        action="append",
        default=[],
        metavar="TARGET=NAME[:ARGS]",
        help=f"the layout converter for TARGET (repeatable); NAME is one of: {', '.join(CONVERTER_SPECS)}",
    )
    warm.add_argument(
        "--accept_proposed",
        "--accept_proposed_mapping",
        action="store_true",
        dest="accept_proposed",
        help="use the proposed mapping (by layer kind, order and shape) for targets no name rule "
        "resolves; an ambiguous proposal needs its --converter too",
    )
    warm.add_argument(
        "--allow_missing",
        action="store_true",
        help="selected targets the source lacks keep their fresh values instead of failing the plan",
    )
    warm.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override params[NAME] of the model file (VALUE parsed as JSON when it can be)",
    )
    warm.add_argument("--json", action="store_true", help="print the plan as JSON (with 'written': OUT or null)")
    warm.set_defaults(handler=_warm_start)


def _inspect(args: argparse.Namespace) -> int:
    from torchestimator.cli.inspection import describe

    print(describe(args.path))
    return 0


def _warm_start(args: argparse.Namespace) -> int:
    from torchestimator.warm_start import WarmStartSettings, plan_warm_start
    from torchestimator.warm_start._write import check_output, write_weights

    renames = _pairs(args.map, "--map", "TARGET=SOURCE (the module's tensor name = the source's)")
    converters = _converters(args.converter)
    _check_patterns(args.vars)  # WarmStartSettings would name its argument, vars_to_warm_start
    if args.write is not None:
        check_output(args.write, label="--write")  # before the model is built and the source read
    module_file, model = _build_model(args.model, args.param)
    selection: str | list[str] = args.vars[0] if len(args.vars) == 1 and not args.include_buffers else args.vars
    settings = WarmStartSettings(
        args.source,
        vars_to_warm_start=selection,
        var_name_to_prev_var_name=renames or None,
        converters=converters or None,
        allow_missing=args.allow_missing,
        accept_proposed_mapping=args.accept_proposed,
    )
    plan = plan_warm_start(model, settings)
    try:
        if not args.json:
            print(plan.format(for_cli=True))
        written = None
        if plan.ok and args.write is not None:
            plan.apply(model)
            written = write_weights(model, args.write, label="--write")
        if args.json:
            print(json.dumps({**plan.to_dict(for_cli=True), "written": written}, indent=1))
        elif plan.ok:
            print(_outcome(plan, args, written, module_file))
        if not plan.ok:
            print("torchestimator warm-start: the plan has errors (above); nothing was written.", file=sys.stderr)
    finally:
        plan.close()
    return 0 if plan.ok else 1


def _check_patterns(patterns: list[str]) -> None:
    import re

    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ConfigError(
                f"--vars {pattern!r} is not a valid regex: {error}.", field="--vars", value=pattern
            ) from None


def _pairs(items: list[str], flag: str, form: str) -> dict[str, str]:
    """``TARGET=VALUE`` flags as a dict; ConfigError naming the flag for a bad one or a target given twice."""
    pairs: dict[str, str] = {}
    for item in items:
        target, equals, value = item.partition("=")
        target, value = target.strip(), value.strip()
        if not equals or not target or not value:
            raise ConfigError(f"{flag} expects {form}; received {item!r}.", field=flag, value=item)
        if pairs.get(target, value) != value:
            raise ConfigError(
                f"{flag} gives {target} twice ({pairs[target]!r} and {value!r}); give it once.", field=flag, value=item
            )
        pairs[target] = value
    return pairs


def _converters(items: list[str]) -> dict[str, str]:
    """``--converter TARGET=NAME[:ARGS]`` checked now, so a bad one is refused naming the flag, before any work."""
    from torchestimator.interop.layouts import converter_from_spec

    converters = _pairs(items, "--converter", "TARGET=NAME[:ARGS] (the module's tensor name = a converter)")
    for target, spec in converters.items():
        try:
            converter_from_spec(spec)
        except ValueError as error:
            raise ConfigError(f"--converter {target}={spec}: {error}", field="--converter", value=spec) from None
    return converters


def _build_model(location: str, param_flags: list[str]) -> tuple[Any, Any]:
    """The model file and the model it builds, seeded as the Estimator seeds its first build (RunConfig.random_seed)."""
    from torchestimator._core.calling import call_factory
    from torchestimator._train_state import seed_everything

    module_file = load_model_file(location)  # its refusals are ConfigErrors: one line, exit status 2
    params = model_params(module_file, param_flags)
    source = require(module_file, "model")
    seed = getattr(getattr(module_file, "config", None), "random_seed", None)
    if seed is not None:  # the fresh (not warm-started) tensors are then those the Estimator would build
        seed_everything(seed)
    model = (
        source
        if not callable(source) or hasattr(source, "state_dict")
        else call_factory(source, params, None, first_is_params=True)
    )
    return module_file, model


def _outcome(plan: Any, args: argparse.Namespace, written: str | None, module_file: Any) -> str:
    """The line after a sound plan's report: what happened, and what to run next."""
    from torchestimator.warm_start._write import is_safetensors_path

    loaded = f"{len(plan.entries)} tensors warm-started"
    if written is None:
        return f"\nDry run ({loaded} if applied); nothing was written. --write OUT writes the result."
    if is_safetensors_path(written):
        return f"\nWrote {written}: the module's state_dict ({loaded}), under the module's names."
    line = f"\nWrote {written} (step 0, {loaded})."
    if hasattr(module_file, "model_fn") and hasattr(module_file, "train_input_fn"):
        command = ["torchestimator", "train", args.model, "--model_dir", args.write]
        command += [part for pair in args.param for part in ("--param", pair)]
        line += f" Train from it: {shlex.join(command)}"
    else:
        line += f" Estimator(model_dir={args.write!r}) resumes from it."
    return line
