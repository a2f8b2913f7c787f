"""The `torchestimator` command: train, evaluate, predict, inspect, warm-start, demo, launch, convert, records.

A model file (FILE.py or an importable module) defines, by name: model,
model_fn, optimizer, and the input functions train_input_fn,
eval_input_fn, predict_input_fn; optionally params (dict), config
(RunConfig), lr_scheduler and max_steps. Flags override what the file sets.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
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
    return importlib.import_module(location)


def _require(module: ModuleType, name: str) -> Any:
    if not hasattr(module, name):
        raise SystemExit(f"torchestimator: {module.__name__} does not define {name!r}, which this command needs.")
    return getattr(module, name)


def _parse_overrides(pairs: list[str]) -> dict[str, Any]:
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

    params = {**getattr(module, "params", {}), **_parse_overrides(args.param)}
    config = getattr(module, "config", None) or te.RunConfig()
    changes: dict[str, Any] = {"model_dir": args.model_dir}
    if args.no_progress:
        changes["progress_bar"] = False
    config = config.replace(**changes)
    return te.Estimator(
        model_fn=_require(module, "model_fn"), model=_require(module, "model"),
        optimizer=getattr(module, "optimizer", None), config=config, params=params,
        lr_scheduler=getattr(module, "lr_scheduler", None),
    )


def _train(args: argparse.Namespace) -> int:
    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    max_steps = args.max_steps if args.max_steps is not None else (None if args.steps else getattr(module, "max_steps", None))
    estimator.train(_require(module, "train_input_fn"), steps=args.steps, max_steps=max_steps)
    print(f"trained to global step {_global_step(estimator)}; checkpoint {estimator.latest_checkpoint()}")
    return 0


def _global_step(estimator: Any) -> int | str:
    path = estimator.latest_checkpoint()
    return int(path.rsplit("-", 1)[-1]) if path else "?"


def _train_and_evaluate(args: argparse.Namespace) -> int:
    """FILE.py's train_spec / eval_spec(s) / best / early_stopping when it defines them, else ones built from
    its input functions (evaluate the whole eval input at every checkpoint)."""
    import torchestimator as te

    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    max_steps = args.max_steps if args.max_steps is not None else getattr(module, "max_steps", None)
    train_spec = getattr(module, "train_spec", None) or te.TrainSpec(_require(module, "train_input_fn"),
                                                                       max_steps=max_steps)
    eval_spec = getattr(module, "eval_specs", None) or getattr(module, "eval_spec", None) or te.EvalSpec(
        _require(module, "eval_input_fn"), steps=None, throttle_secs=0, start_delay_secs=0)
    if args.evaluator:  # a separate process following model_dir, as TF_CONFIG's evaluator task
        results = te.run_evaluator(estimator, train_spec, eval_spec, poll_secs=args.poll_secs)
        print(json.dumps({"results": results}, indent=2, sort_keys=True, default=str))
        return 0
    results, exports = te.train_and_evaluate(estimator, train_spec, eval_spec, best=getattr(module, "best", None),
                                             early_stopping=getattr(module, "early_stopping", ()))
    print(json.dumps({"results": results, "exports": exports}, indent=2, sort_keys=True, default=str))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    results = estimator.evaluate(_require(module, "eval_input_fn"), steps=args.steps,
                                 checkpoint_path=args.checkpoint_path, name=args.name)
    print(json.dumps(results, indent=2, sort_keys=True, default=float))
    return 0


def _predict(args: argparse.Namespace) -> int:
    if args.exported:
        return _predict_exported(args)
    if args.model_file is None or args.model_dir is None:
        raise SystemExit("torchestimator predict: give FILE.py and --model_dir, or --exported PATH --input FILE.")
    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    out = open(args.output, "w") if args.output else sys.stdout
    try:
        for index, prediction in enumerate(estimator.predict(_require(module, "predict_input_fn"),
                                                             predict_keys=args.predict_keys,
                                                             checkpoint_path=args.checkpoint_path)):
            out.write(json.dumps(_jsonable(prediction)) + "\n")
            if args.limit is not None and index + 1 >= args.limit:
                break
    finally:
        if args.output:
            out.close()
    return 0


def _predict_exported(args: argparse.Namespace) -> int:
    """Runs an exported model alone: no model file, no training code."""
    from torchestimator.export import load, read_inputs

    if not args.input:
        raise SystemExit("torchestimator predict --exported needs --input FILE (.npz or .json).")
    model = load(args.exported)
    outputs = model(read_inputs(args.input), signature_name=args.signature_name)
    if args.output and args.output.endswith(".npz"):
        np.savez(args.output, **outputs)
    else:
        text = json.dumps(_jsonable(outputs))
        if args.output:
            with open(args.output, "w") as handle:
                handle.write(text + "\n")
        else:
            print(text)
    return 0


def _export(args: argparse.Namespace) -> int:
    module = load_model_file(args.model_file)
    estimator = build_estimator(module, args)
    receiver = _require(module, "serving_input_receiver")
    path = estimator.export_saved_model(args.export_dir, receiver, checkpoint_path=args.checkpoint_path,
                                        as_onnx=args.onnx)
    print(f"exported {path}")
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _inspect(args: argparse.Namespace) -> int:
    from torchestimator.inspection import describe

    print(describe(args.path))
    return 0


def _warm_start(args: argparse.Namespace) -> int:
    from torchestimator.calling import call_factory
    from torchestimator.warm_start import WarmStartSettings, plan_warm_start

    module_file = load_model_file(args.model)
    params = {**getattr(module_file, "params", {}), **_parse_overrides(args.param)}
    source = _require(module_file, "model")
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


def _serve(args: argparse.Namespace) -> int:
    from torchestimator.serving import BatchingParameters, read_batching_parameters_file, read_monitoring_config_file
    from torchestimator.serving import serve

    if args.port:
        logging.getLogger("torchestimator").warning(
            "--port=%d (TF Serving's gRPC port) is accepted for compatibility, but only the REST API is served "
            "(--rest_api_port=%d).", args.port, args.rest_api_port)
    if args.batching_parameters_file and not args.enable_batching:
        raise ValueError("--batching_parameters_file needs --enable_batching (as in TF Serving).")
    batching = None
    if args.enable_batching:
        fields = read_batching_parameters_file(args.batching_parameters_file) if args.batching_parameters_file else {}
        batching = BatchingParameters.from_fields(fields, source=args.batching_parameters_file or "defaults")
    metrics_path = args.metrics_path
    if args.monitoring_config_file:
        monitoring = read_monitoring_config_file(args.monitoring_config_file)
        metrics_path = monitoring.path if monitoring.enable else None
    models = (f"the models in {args.model_config_file}" if args.model_config_file
              else f"{args.model_name} from {args.model_base_path}")
    print(f"serving {models} at http://{args.rest_api_host}:{args.rest_api_port}/v1/models/"
          + ("" if args.model_config_file else args.model_name), flush=True)
    serve(args.model_name, args.model_base_path, host=args.rest_api_host, port=args.rest_api_port,
          model_config_file=args.model_config_file,
          model_config_file_poll_wait_seconds=args.model_config_file_poll_wait_seconds,
          file_system_poll_wait_seconds=args.file_system_poll_wait_seconds, batching=batching,
          allow_version_labels_for_unavailable_models=args.allow_version_labels_for_unavailable_models,
          num_threads=args.rest_api_num_threads, max_body_bytes=args.max_body_bytes,
          timeout_seconds=args.rest_api_timeout_in_ms / 1000 if args.rest_api_timeout_in_ms > 0 else None,
          metrics_path=metrics_path)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from torchestimator.plot import plot_model_dir

    print(f"wrote {plot_model_dir(args.model_dir, args.output)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from torchestimator import demo

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
        from torchestimator.plot import plot_model_dir

        print(f"curves: {plot_model_dir(args.model_dir)}   TensorBoard: tensorboard --logdir {args.model_dir}")
    except ImportError:
        print(f"curves: pip install 'torchestimator[plot]', then torchestimator plot {args.model_dir}")
    return 0


def _launch(args: argparse.Namespace) -> int:
    from torchestimator.distribute.launcher import launch

    return launch(args.nproc_per_node, [args.script, *args.script_args])


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_file", help="FILE.py or an importable module defining model, model_fn, optimizer, input_fns")
    parser.add_argument("--model_dir", required=True, help="where checkpoints and summaries live")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override params[NAME] (VALUE parsed as JSON when it can be)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchestimator", description="The TensorFlow Estimator workflow on PyTorch.")
    parser.add_argument("--verbosity", default="INFO", help="logging level (DEBUG, INFO, WARNING)")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train (resuming from model_dir)")
    _add_model_flags(train)
    train.add_argument("--max_steps", type=int, help="absolute global step to train to")
    train.add_argument("--steps", type=int, help="steps to train beyond the current global step")
    train.set_defaults(handler=_train)

    both = commands.add_parser("train-and-evaluate", help="train, evaluating (and exporting) along the way")
    _add_model_flags(both)
    both.add_argument("--max_steps", type=int, help="absolute global step to train to")
    both.add_argument("--evaluator", action="store_true",
                      help="only evaluate: follow model_dir and evaluate each new checkpoint until max_steps")
    both.add_argument("--poll_secs", type=float, default=None, help="with --evaluator: seconds between looks")
    both.set_defaults(handler=_train_and_evaluate)

    evaluate = commands.add_parser("evaluate", help="evaluate the latest (or a given) checkpoint")
    _add_model_flags(evaluate)
    evaluate.add_argument("--steps", type=int, help="evaluate this many batches (default: the whole input)")
    evaluate.add_argument("--checkpoint_path")
    evaluate.add_argument("--name", help="named evaluation: summaries go to model_dir/eval_<name>")
    evaluate.set_defaults(handler=_evaluate)

    predict = commands.add_parser("predict", help="write predictions as JSON lines, or run an exported model")
    predict.add_argument("model_file", nargs="?", help="FILE.py or module (not needed with --exported)")
    predict.add_argument("--model_dir")
    predict.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    predict.add_argument("--no_progress", action="store_true")
    predict.add_argument("--exported", help="an exported model: a version folder or its base (newest version)")
    predict.add_argument("--input", help="with --exported: inputs as .npz or .json")
    predict.add_argument("--signature_name", default="serving_default")
    predict.add_argument("--checkpoint_path")
    predict.add_argument("--predict_keys", nargs="*")
    predict.add_argument("--output", help="file for the JSON lines (default stdout)")
    predict.add_argument("--limit", type=int, help="stop after this many examples")
    predict.set_defaults(handler=_predict)

    export = commands.add_parser("export", help="export the latest (or a given) checkpoint for serving")
    _add_model_flags(export)
    export.add_argument("--export_dir", required=True, help="base folder; a new integer version is written inside")
    export.add_argument("--checkpoint_path")
    export.add_argument("--onnx", action="store_true", help="also write model.onnx where the model exports")
    export.set_defaults(handler=_export)

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

    serve = commands.add_parser("serve", help="TensorFlow Serving REST API for exported models")
    serve.add_argument("--model_name", help="the name clients use in /v1/models/<name> (or --model_config_file)")
    serve.add_argument("--model_base_path", help="folder of integer version folders (an export base)")
    serve.add_argument("--model_config_file", help="TF Serving's model_config_list text file: several models, "
                       "version policies (latest/all/specific) and version labels")
    serve.add_argument("--model_config_file_poll_wait_seconds", type=float, default=0.0,
                       help="re-read --model_config_file this often (0: once)")
    serve.add_argument("--rest_api_port", type=int, default=8501)
    serve.add_argument("--port", type=int, default=0,
                       help="TF Serving's gRPC port: accepted so TF command lines run unchanged; not served")
    serve.add_argument("--rest_api_host", default="127.0.0.1",
                       help="default 127.0.0.1: unlike TF Serving, not every interface unless asked")
    serve.add_argument("--file_system_poll_wait_seconds", type=float, default=1.0,
                       help="look for new versions this often (0: only at start)")
    serve.add_argument("--enable_batching", action="store_true",
                       help="gather concurrent requests into one forward pass")
    serve.add_argument("--batching_parameters_file", help="TF's BatchingParameters text file (max_batch_size { "
                       "value: 32 } batch_timeout_micros { value: 1000 } ...); needs --enable_batching")
    serve.add_argument("--allow_version_labels_for_unavailable_models", action="store_true")
    serve.add_argument("--monitoring_config_file", help="TF's MonitoringConfig text file (prometheus_config { "
                       "enable: true path: ... }); without it metrics are at --metrics_path")
    serve.add_argument("--metrics_path", default="/monitoring/prometheus/metrics",
                       help="Prometheus metrics page (TF Serving's path by default)")
    serve.add_argument("--rest_api_num_threads", type=int, default=None,
                       help="threads parsing, running and encoding requests (default: one per CPU core)")
    serve.add_argument("--rest_api_timeout_in_ms", type=int, default=30000, help="0: no limit")
    serve.add_argument("--max_body_bytes", type=int, default=64 * 1024 * 1024,
                       help="larger request bodies are refused with 413")
    serve.set_defaults(handler=_serve)

    plot = commands.add_parser("plot", help="PNG of training loss and evaluation metrics against step")
    plot.add_argument("model_dir")
    plot.add_argument("--output", help="PNG path (default MODEL_DIR/metrics.png)")
    plot.set_defaults(handler=_plot)

    demo = commands.add_parser("demo", help="train and evaluate the digits demo (resumes when rerun)")
    demo.add_argument("--model_dir", default="runs/digits")
    demo.add_argument("--max_steps", type=int, default=1000)
    demo.add_argument("--no_progress", action="store_true")
    demo.set_defaults(handler=_demo)

    from torchestimator.records_cli import add_subcommands as add_record_commands

    add_record_commands(commands)  # convert csv-to-tfrecord, records inspect, records verify

    launch = commands.add_parser("launch", help="run a script in N processes (torchrun)")
    launch.add_argument("--nproc_per_node", type=int, default=2)
    launch.add_argument("script")
    launch.add_argument("script_args", nargs=argparse.REMAINDER)
    launch.set_defaults(handler=_launch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except (ValueError, TypeError, PermissionError, FileNotFoundError) as error:
        logging.getLogger("torchestimator").debug("details", exc_info=True)
        print(f"torchestimator {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        print(f"torchestimator {args.command}: {interrupt or 'interrupted'}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
