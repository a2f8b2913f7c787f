"""The commands that run a model file's Estimator: train, train-and-evaluate, evaluate, predict, export.

Two rules of the command line, not of the library: evaluate and predict refuse a model_dir with nothing trained
in it unless --allow_untrained (``_refuse_untrained``), and under `torchestimator launch` only rank 0 prints
results (``_prints_results``), as only replica 0's output shows in a plain-script run, and only rank 0 writes
predict's and export's output.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import os
import sys
from typing import Any

import numpy as np

from torchestimator.cli.model_file import add_model_flags, build_estimator, jsonable, load_model_file, require
from torchestimator.errors import CheckpointError, ConfigError

logger = logging.getLogger("torchestimator.cli")


def add_commands(commands: Any) -> None:
    """Adds this module's subcommands to the `torchestimator` parser (one table row per command)."""
    for name, (help_text, handler, takes_model_flags, flags) in _COMMANDS.items():
        command = commands.add_parser(name, help=help_text)
        if takes_model_flags:
            add_model_flags(command)
        for flag, options in flags:
            command.add_argument(*flag, **options)
        command.set_defaults(handler=handler)


_MAX_STEPS = (("--max_steps",), {"type": int, "help": "absolute global step to train to"})
_CHECKPOINT_PATH = (("--checkpoint_path",), {"help": "a ckpt-<step> folder (default: the latest in model_dir)"})
_PREDICT_CHECKPOINT_PATH = (
    ("--checkpoint_path",),
    {"help": "with FILE.py: a ckpt-<step> folder (default: the latest in model_dir)"},
)


def _train(args: argparse.Namespace) -> int:
    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    max_steps = (
        args.max_steps if args.max_steps is not None else (None if args.steps else getattr(module, "max_steps", None))
    )
    estimator.train(require(module, "train_input_fn"), steps=args.steps, max_steps=max_steps)
    if _prints_results():
        print(f"trained to global step {_global_step(estimator)}; checkpoint {estimator.latest_checkpoint()}")
    return 0


def _global_step(estimator: Any) -> int | str:
    path = estimator.latest_checkpoint()
    return int(path.rsplit("-", 1)[-1]) if path else "?"


def _prints_results() -> bool:
    """Whether this process prints what the command gives: rank 0 of a launched group (the replica whose
    output a plain-script run shows), or any process outside one (a local run, an evaluator task)."""
    from torchestimator.distribute import resolve_cluster

    return resolve_cluster().rank in (None, 0)


def _refuse_untrained(estimator: Any, args: argparse.Namespace, doing: str) -> None:
    """Refuses (a ConfigError naming model_dir, before anything is written) to ``doing`` (evaluate, predict
    with) the fresh weights of a model_dir with no checkpoint and no warm start, unless --allow_untrained.

    The CLI's rule: a mistyped --model_dir would otherwise report random weights' metrics and create the
    folder. Estimator.evaluate/predict keep tf.estimator's (fresh weights, with a warning).
    """
    if args.allow_untrained or args.checkpoint_path is not None or estimator.latest_checkpoint() is not None:
        return
    from torchestimator import ModeKeys

    try:  # the library's own test: a warm start counts, checkpoints all damaged are named as such
        estimator.inference_bundle(mode=ModeKeys.PREDICT, require_weights=True)
    except CheckpointError:
        raise
    except ValueError as error:
        from torchestimator._io.filesystems import is_url

        model_dir = args.model_dir
        if not is_url(model_dir) and not os.path.exists(model_dir):
            where = f"does not exist (relative to {os.getcwd()}{_nearest_model_dir(model_dir)})"
        else:
            where = "holds no checkpoint (ckpt-<step> folder)"
        raise ConfigError(
            f"--model_dir {model_dir} {where}: nothing trained to {doing}. Check the path, train first "
            f"(torchestimator train {args.model_file} --model_dir {model_dir}), or pass --allow_untrained "
            f"to {doing} freshly initialised (random) weights.",
            field="model_dir",
            value=model_dir,
        ) from error


def _nearest_model_dir(model_dir: str) -> str:
    """'; did you mean runs/demo?' for a folder beside a missing model_dir with a close name, else ''."""
    parent, name = os.path.split(os.path.normpath(model_dir))
    try:
        beside = [entry.name for entry in os.scandir(parent or ".") if entry.is_dir()]
    except OSError:  # the parent is missing too
        return ""
    close = difflib.get_close_matches(name, beside, n=1)
    return f"; did you mean {os.path.join(parent, close[0])}?" if close else ""


def _train_and_evaluate(args: argparse.Namespace) -> int:
    """FILE.py's train_spec / eval_spec(s) / best / early_stopping when it defines them, else ones built from
    its input functions (evaluate the whole eval input at every checkpoint)."""
    import torchestimator as te

    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    max_steps = args.max_steps if args.max_steps is not None else getattr(module, "max_steps", None)
    train_spec = getattr(module, "train_spec", None) or te.TrainSpec(
        require(module, "train_input_fn"), max_steps=max_steps
    )
    if args.max_steps is not None:  # the flag wins over the file's train_spec too
        train_spec = dataclasses.replace(train_spec, max_steps=args.max_steps)
    eval_spec = (
        getattr(module, "eval_specs", None)
        or getattr(module, "eval_spec", None)
        or te.EvalSpec(require(module, "eval_input_fn"), steps=None, throttle_secs=0, start_delay_secs=0)
    )
    # The model file's own objects: the functions they reach check their types.
    policies: dict[str, Any] = {
        "best": getattr(module, "best", None),
        "early_stopping": getattr(module, "early_stopping", ()),
    }
    if args.evaluator:  # a separate process following model_dir, as TF_CONFIG's evaluator task
        # It keeps the best and decides early stopping, as the evaluator task of train_and_evaluate does.
        results, exports = te.run_evaluator(estimator, train_spec, eval_spec, poll_secs=args.poll_secs, **policies)
    else:
        results, exports = te.train_and_evaluate(estimator, train_spec, eval_spec, **policies)
    if _prints_results():
        print(json.dumps({"results": results, "exports": exports}, indent=2, sort_keys=True, default=str))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    input_fn = require(module, "eval_input_fn")  # the file's own gap first: it stands whatever model_dir holds
    _refuse_untrained(estimator, args, "evaluate")
    results = estimator.evaluate(input_fn, steps=args.steps, checkpoint_path=args.checkpoint_path, name=args.name)
    if _prints_results():
        print(json.dumps(results, indent=2, sort_keys=True, default=float))
    return 0


# predict's flags that only one of its two ways takes: flag -> (dest, why it does not apply to the other way).
_MODEL_FILE_ONLY = {
    "FILE.py": ("model_file", "the export holds the model; give --exported PATH alone"),
    "--model_dir": ("model_dir", "the export holds its weights"),
    "--checkpoint_path": ("checkpoint_path", "the export holds the weights of the checkpoint it was made from"),
    "--allow_untrained": ("allow_untrained", "the export holds the weights it was exported with"),
    "--param": ("param", "params were fixed when the model was exported"),
    "--limit": ("limit", "the request file says which rows to run; leave the others out of it"),
}
_EXPORTED_ONLY = {
    "--input": ("input", "with FILE.py, its predict_input_fn gives the examples"),
    "--signature_name": ("signature_name", "with FILE.py, its model_fn gives the predictions"),
}


def _refuse_flags_of_the_other_way(args: argparse.Namespace) -> None:
    """One line naming the first flag given that the chosen way of predicting would silently ignore."""
    for flag, (dest, why) in (_MODEL_FILE_ONLY if args.exported else _EXPORTED_ONLY).items():
        value = getattr(args, dest)
        if value not in (None, False, []):
            shown = f"{flag} ({value!r})" if flag == "FILE.py" else flag
            rule = "does not apply to --exported" if args.exported else "applies only with --exported"
            raise ConfigError(f"{shown} {rule}: {why}.", field=dest, value=value)


def _predict(args: argparse.Namespace) -> int:
    _refuse_flags_of_the_other_way(args)
    if args.exported:
        return _predict_exported(args)
    if args.model_file is None or args.model_dir is None:
        raise ConfigError("give FILE.py and --model_dir, or --exported PATH --input FILE.", field="model_file")
    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    input_fn = require(module, "predict_input_fn")
    _refuse_untrained(estimator, args, "predict with")
    if not _prints_results():  # predict runs whole in every process: one writer, as one printer
        logger.info("Predictions are written by rank 0 of the launched group only.")
        return 0
    out = open(args.output, "w") if args.output else sys.stdout  # noqa: SIM115 (closed below unless stdout)
    try:
        for index, prediction in enumerate(
            estimator.predict(
                input_fn,
                predict_keys=args.predict_keys,
                checkpoint_path=args.checkpoint_path,
            )
        ):
            out.write(json.dumps(jsonable(prediction)) + "\n")
            if args.limit is not None and index + 1 >= args.limit:
                break
    finally:
        if args.output:
            out.close()
    return 0


def _predict_exported(args: argparse.Namespace) -> int:
    """Runs an exported model alone: no model file, no training code.

    A .json input is a TF Serving predict request, read by the server's own parser, and the answer is what the
    server's :predict answers ({"predictions": ...} for "instances", {"outputs": ...} for "inputs"); an .npz
    input holds one array per input name, and the answer is {output name: values}.
    """
    from torchestimator.export import load
    from torchestimator.export.outputs import DEFAULT_SERVING_SIGNATURE_DEF_KEY

    if not args.input:
        raise ConfigError(
            'predict --exported needs --input FILE: a TF Serving request (.json with "instances" '
            'or "inputs") or an .npz of named arrays.',
            field="input",
        )
    model = load(args.exported)
    # --signature_name "" is the default signature, as an empty signature_name in a request is (TF Serving's rule).
    signature_name = None if args.signature_name is None else args.signature_name or DEFAULT_SERVING_SIGNATURE_DEF_KEY
    if _is_npz(args.input):
        from torchestimator.export import read_inputs

        signature_name = signature_name or DEFAULT_SERVING_SIGNATURE_DEF_KEY
        outputs = _selected(
            model(read_inputs(args.input), signature_name=signature_name),
            args.predict_keys,
            args.exported,
            signature_name,
        )
        answer = jsonable(outputs)
    else:
        outputs, answer = _answer_request(model, args.input, signature_name, args.predict_keys, args.exported)
    if args.output and _is_npz(args.output):
        with open(args.output, "wb") as handle:  # a handle: np.savez would append .npz to OUT.NPZ
            np.savez(handle, **outputs)  # type: ignore[arg-type]  # mypy: a key could be savez's allow_pickle
    elif args.output:
        with open(args.output, "w") as handle:
            handle.write(json.dumps(answer) + "\n")
    else:
        print(json.dumps(answer))
    return 0


# As much JSON as the server takes in one request (serve's --max_body_bytes default).
_MAX_REQUEST_BYTES = 64 * 1024 * 1024


def _is_npz(path: str) -> bool:
    return path.lower().endswith(".npz")


def _selected(
    outputs: dict[str, np.ndarray], keys: list[str] | None, exported: str, signature_name: str
) -> dict[str, np.ndarray]:
    """Only the outputs --predict_keys names (all without it); a name the signature lacks is refused."""
    if not keys:
        return outputs
    unknown = [key for key in keys if key not in outputs]
    if unknown:
        raise ConfigError(
            f"--predict_keys {' '.join(unknown)}: not an output of {exported} (signature "
            f"{signature_name!r}); its outputs are {', '.join(outputs)}.",
            field="predict_keys",
            value=unknown,
        )
    return {key: outputs[key] for key in outputs if key in keys}


def _answer_request(
    model: Any, path: str, signature_name: str | None, keys: list[str] | None, exported: str
) -> tuple[dict[str, np.ndarray], dict]:
    """The outputs for a TF Serving predict request file, and the server's JSON answer to it."""
    from torchestimator._io.regular_file import read_regular_file
    from torchestimator.errors import ServingError
    from torchestimator.export.outputs import DEFAULT_SERVING_SIGNATURE_DEF_KEY
    from torchestimator.serving.json_tensor import decode_body, parse_predict, predict_response

    try:
        document = decode_body(read_regular_file(path, _MAX_REQUEST_BYTES))
        if signature_name is not None:
            asked = document.get("signature_name", signature_name)
            if isinstance(asked, str) and (asked or DEFAULT_SERVING_SIGNATURE_DEF_KEY) != signature_name:
                raise ConfigError(
                    f"--signature_name {signature_name!r} differs from the request's signature_name "
                    f"{asked!r}; give one of them.",
                    field="signature_name",
                )
            document = {**document, "signature_name": signature_name}
        request = parse_predict(document, model)
        outputs = model(request.inputs, signature_name=request.signature_name)  # checks shapes, as the server
    except (ServingError, ValueError, TypeError) as error:  # the server's words, naming the file they are about
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{path}: {error}", field="input", value=path) from error
    outputs = _selected(outputs, keys, exported, request.signature_name)
    return outputs, predict_response(outputs, request.row_format)


def _export(args: argparse.Namespace) -> int:
    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    receiver = require(module, "serving_input_receiver")
    if not _prints_results():  # each rank would write a version of its own: one writer, as one printer
        logger.info("The export is written by rank 0 of the launched group only.")
        return 0
    path = estimator.export_saved_model(
        args.export_dir, receiver, checkpoint_path=args.checkpoint_path, as_onnx=args.onnx
    )
    print(f"exported {path}")
    return 0


# name -> (help, handler, takes the model file flags, [(flag names, add_argument options)])
_COMMANDS: dict[str, tuple[str, Any, bool, list[tuple[tuple[str, ...], dict[str, Any]]]]] = {
    "train": (
        "train (resuming from model_dir)",
        _train,
        True,
        [
            _MAX_STEPS,
            (("--steps",), {"type": int, "help": "steps to train beyond the current global step"}),
        ],
    ),
    "train-and-evaluate": (
        "train, evaluating (and exporting) along the way",
        _train_and_evaluate,
        True,
        [
            _MAX_STEPS,
            (
                ("--evaluator",),
                {
                    "action": "store_true",
                    "help": "only evaluate: follow model_dir and evaluate each new checkpoint until max_steps",
                },
            ),
            (("--poll_secs",), {"type": float, "default": None, "help": "with --evaluator: seconds between looks"}),
        ],
    ),
    "evaluate": (
        "evaluate the latest (or a given) checkpoint",
        _evaluate,
        True,
        [
            (("--steps",), {"type": int, "help": "evaluate this many batches (default: the whole input)"}),
            _CHECKPOINT_PATH,
            (("--name",), {"help": "named evaluation: summaries go to model_dir/eval_<name>"}),
            (
                ("--allow_untrained",),
                {
                    "action": "store_true",
                    "help": "evaluate even when model_dir has no checkpoint (random weights); without it "
                    "that is an error and nothing is written",
                },
            ),
        ],
    ),
    "predict": (
        "write predictions as JSON lines, or run an exported model",
        _predict,
        False,
        [
            (("model_file",), {"nargs": "?", "help": "FILE.py or module (not with --exported)"}),
            (("--model_dir",), {"help": "with FILE.py: where its checkpoints live"}),
            (
                ("--param",),
                {
                    "action": "append",
                    "default": [],
                    "metavar": "NAME=VALUE",
                    "help": "with FILE.py: override params[NAME] (VALUE parsed as JSON when it can be)",
                },
            ),
            (("--no_progress",), {"action": "store_true", "help": "no progress bar"}),
            (
                ("--exported",),
                {
                    "help": "an exported model: a version folder or its base (newest version), local or an "
                    "object-store URL (s3://..., gs://...: copied to the local cache and verified)"
                },
            ),
            (
                ("--input",),
                {
                    "help": 'with --exported: a TF Serving predict request (.json: {"instances": [...]} or '
                    '{"inputs": ...}, as curl sends to serve; {"b64": ...} for string inputs: '
                    "serialized Examples, images) or an .npz of named arrays"
                },
            ),
            (
                ("--signature_name",),
                {
                    "help": "with --exported: the signature to run (default: the request's "
                    "signature_name, else serving_default)"
                },
            ),
            _PREDICT_CHECKPOINT_PATH,
            (
                ("--predict_keys",),
                {
                    "nargs": "*",
                    "metavar": "KEY",
                    "help": "only these prediction keys (with --exported: outputs) (default all)",
                },
            ),
            (
                ("--output",),
                {
                    "help": "file for the predictions (default stdout): JSON lines, or with --exported the "
                    "server's JSON answer (.npz: the output arrays)"
                },
            ),
            (("--limit",), {"type": int, "help": "with FILE.py: stop after this many examples"}),
            (
                ("--allow_untrained",),
                {
                    "action": "store_true",
                    "help": "with FILE.py: predict even when model_dir has no checkpoint (random weights); "
                    "without it that is an error and nothing is written",
                },
            ),
        ],
    ),
    "export": (
        "export the latest (or a given) checkpoint for serving",
        _export,
        True,
        [
            (
                ("--export_dir",),
                {
                    "required": True,
                    "help": "base folder (or object-store URL: s3://..., gs://...); "
                    "a new integer version is written inside",
                },
            ),
            _CHECKPOINT_PATH,
            (
                ("--onnx",),
                {
                    "action": "store_true",
                    "help": "also write model.onnx, named as signature.json (needs pip install "
                    "'torchestimator[onnx]'; a model ONNX cannot express is an error, nothing written)",
                },
            ),
        ],
    ),
}
