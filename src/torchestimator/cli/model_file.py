"""Loading a model file: FILE.py or an importable module that defines model, model_fn, optimizer, input_fns.

A model file defines, by name, what the commands read: ``MODEL_FILE_NAMES``
below is the one list of those names (each a function or an object, which
commands read it, what it is). It is shown in ``--help`` (``contract_help``)
and in docs/cli.md (``contract_markdown``; tests/cli/test_model_file_contract.py
checks both, and that the commands read no name it lacks). Flags override what
the file sets. A top-level name that looks like a misspelling of one of them
(``modelfn``, ``eval_spec_s``, ``input_fn_train``, ``optimiser``), while that
name is missing, is warned about when the file is loaded (``near_misses``).

Messages name a model file as the user gave it (``model.py does not define
'eval_input_fn'``), never by the module name it is imported under. That name
is the file's own (``model`` for model.py, as ``import model`` would give, so
its loggers, classes and pickles read naturally) unless another module
already has it (a file called json.py becomes ``json_py``).

What the file raises while it is imported is shown where it happened: a
torchestimator error as one line naming the file and line, anything else
with the traceback of the file's own frames (its bug is what to fix).
Later, while a command runs, ``user_frame`` tells the CLI's ``main`` whether
an error passed through a model file this process loaded (each is recorded
here when it is loaded), so the user's own bug keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import json
import logging
import os
import pkgutil
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import numpy as np

from torchestimator.errors import ConfigError, TorchEstimatorError

_EXAMPLE_MODULE = "torchestimator.cli.demo"
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# The model files loaded in this process, real path -> as the user named it: the CLI runs one command per
# process, and the error handler of main() needs them after the command's frames are gone.
_loaded_paths: dict[str, str] = {}
logger = logging.getLogger("torchestimator.cli")


@dataclasses.dataclass(frozen=True)
class _ModelFileOrigin:
    """Kept as the module spec's loader_state: marks a module this loader made, and how the user named it."""

    location: str


FUNCTION, OBJECT = "function", "object"
_MODEL_COMMANDS = ("train", "train-and-evaluate", "evaluate", "predict", "export")


@dataclasses.dataclass(frozen=True)
class ModelFileName:
    """One name the commands read from a model file."""

    name: str
    kind: str
    """FUNCTION or OBJECT ("function or object" where both are taken)."""
    what: str
    """What it is, in one phrase (its call form for a function)."""
    read_by: tuple[str, ...]
    """The commands that read it."""
    when: str = ""
    """When it is needed, or what overrides it ("" : always needed by those commands)."""


MODEL_FILE_NAMES: tuple[ModelFileName, ...] = (
    ModelFileName(
        "model",
        FUNCTION,
        "model(params) -> torch.nn.Module, built once per process (a module object works too)",
        (*_MODEL_COMMANDS, "warm-start"),
    ),
    ModelFileName(
        "model_fn",
        FUNCTION,
        "model_fn(model, features, labels, mode, params) -> te.EstimatorSpec, taking those it declares",
        _MODEL_COMMANDS,
    ),
    ModelFileName(
        "optimizer",
        FUNCTION,
        "optimizer(parameters, params) -> torch.optim.Optimizer",
        _MODEL_COMMANDS,
        "to train",
    ),
    ModelFileName(
        "lr_scheduler",
        FUNCTION,
        "lr_scheduler(optimizer[, params]) -> a torch LR scheduler, stepped every step",
        _MODEL_COMMANDS,
        "optional",
    ),
    ModelFileName(
        "params",
        OBJECT,
        "a dict, given to the functions that declare params",
        (*_MODEL_COMMANDS, "warm-start"),
        "optional; --param NAME=VALUE overrides an entry",
    ),
    ModelFileName(
        "config",
        OBJECT,
        "a te.RunConfig",
        (*_MODEL_COMMANDS, "warm-start"),
        "optional; flags such as --model_dir override its fields",
    ),
    ModelFileName(
        "train_input_fn",
        FUNCTION,
        "train_input_fn(params, config, input_context) -> batches, taking those it declares",
        ("train", "train-and-evaluate"),
        "train-and-evaluate: unless train_spec is given",
    ),
    ModelFileName(
        "eval_input_fn",
        FUNCTION,
        "eval_input_fn(...) -> batches, as train_input_fn",
        ("evaluate", "train-and-evaluate"),
        "train-and-evaluate: unless eval_spec(s) is given",
    ),
    ModelFileName("predict_input_fn", FUNCTION, "predict_input_fn(...) -> features batches", ("predict",)),
    ModelFileName(
        "serving_input_receiver",
        "object or function",
        "a te.export.ServingInputReceiver, or a function returning one",
        ("export",),
    ),
    ModelFileName(
        "max_steps",
        OBJECT,
        "an int: the global step to train to",
        ("train", "train-and-evaluate"),
        "optional; --max_steps wins",
    ),
    ModelFileName(
        "train_spec",
        OBJECT,
        "a te.TrainSpec",
        ("train-and-evaluate",),
        "optional; else one from train_input_fn and max_steps",
    ),
    ModelFileName(
        "eval_spec",
        OBJECT,
        "a te.EvalSpec (or a list of them)",
        ("train-and-evaluate",),
        "optional; else eval_input_fn, evaluated whole at each checkpoint",
    ),
    ModelFileName(
        "eval_specs",
        OBJECT,
        "a list of te.EvalSpec, the first one primary",
        ("train-and-evaluate",),
        "optional; wins over eval_spec",
    ),
    ModelFileName(
        "best",
        OBJECT,
        "a te.BestCheckpointPolicy: which checkpoints to keep as the best",
        ("train-and-evaluate",),
        "optional",
    ),
    ModelFileName(
        "early_stopping",
        OBJECT,
        "a rule (te.stop_if_*_hook(...), te.EarlyStopping(...)) or a list of them",
        ("train-and-evaluate",),
        "optional",
    ),
)


def contract_help(command: str | None = None) -> str:
    """The ``--help`` epilog: the names ``command`` reads from a model file (every command's without one)."""
    rows = [row for row in MODEL_FILE_NAMES if command is None or command in row.read_by]
    lines = ["model file: FILE.py (or a module) defines at its top level, by name:"]
    for row in rows:
        read_by = "" if command is not None else f" [{', '.join(row.read_by)}]"
        when = f" ({row.when})" if row.when else ""
        lines.append(f"  {row.name:<23} {row.kind}: {row.what}{when}{read_by}")
    return "\n".join(lines)


def contract_markdown() -> str:
    """docs/cli.md's table of the model file's names."""
    lines = ["| name | a function or an object | read by | what it is |", "|---|---|---|---|"]
    for row in MODEL_FILE_NAMES:
        when = f" ({row.when})" if row.when else ""
        lines.append(f"| `{row.name}` | {row.kind} | {', '.join(row.read_by)} | {row.what}{when} |")
    return "\n".join(lines) + "\n"


def near_misses(module: ModuleType) -> list[tuple[str, str]]:
    """(name, the model file name it looks like) for the file's top-level names that look like a misspelling.

    Only names the file defines itself (not modules, nor functions and classes it imported), and only when
    the name it looks like is missing from the file: a file with model_fn may also have a helper modelfn.
    """
    defined = vars(module)
    known = [row.name for row in MODEL_FILE_NAMES]
    found = []
    for name, value in defined.items():
        if name.startswith("_") or name in known or isinstance(value, ModuleType):
            continue
        if (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ != module.__name__:
            continue
        looks_like = next((candidate for candidate in known if _looks_like(name, candidate)), None)
        if looks_like is not None and looks_like not in defined:
            found.append((name, looks_like))
    return found


def _looks_like(name: str, known: str) -> bool:
    """Whether ``name`` is ``known`` misspelt: the same but for underscores (modelfn, eval_spec_s), the same
    words in another order (input_fn_train), one edit from a name of 6 letters or more (optimiser, hparams,
    max_step: difflib's ratio would also take helpers such as eval_steps for eval_specs), or TF's ``_fn``
    suffix (serving_input_receiver_fn)."""
    return (
        name.replace("_", "") == known.replace("_", "")
        or _words(name) == _words(known)
        or (len(known) >= 6 and _one_edit_apart(name, known))
        or name == known + "_fn"
    )


def _words(name: str) -> list[str]:
    return sorted(word for word in name.split("_") if word)


def _one_edit_apart(a: str, b: str) -> bool:
    """One letter inserted, deleted or changed, or two neighbours swapped."""
    if len(a) == len(b):
        differ = [index for index in range(len(a)) if a[index] != b[index]]
        swapped = len(differ) == 2 and differ[1] == differ[0] + 1 and a[differ[0]] == b[differ[1]]
        return len(differ) == 1 or (swapped and a[differ[1]] == b[differ[0]])
    shorter, longer = sorted((a, b), key=len)
    return len(longer) == len(shorter) + 1 and any(
        longer[:index] + longer[index + 1 :] == shorter for index in range(len(longer))
    )


def _warn_near_misses(module: ModuleType) -> None:
    for name, looks_like in near_misses(module):
        logger.warning(
            "%s defines %r, which looks like %r, a name torchestimator reads from model files; %r is not "
            "defined, so %r is not read (see `torchestimator --help`).",
            describe(module),
            name,
            looks_like,
            looks_like,
            name,
        )


def load_model_file(location: str) -> ModuleType:
    """Imports FILE.py by path, or a module by dotted name; warns about names that look like misspelt ones."""
    if location.endswith(".py") or os.sep in location or (os.altsep and os.altsep in location):
        module = _load_file(location)
    elif _MODULE_NAME.fullmatch(location):
        module = _import_module(location)
    elif os.path.isdir(location):  # ".", ".."
        raise _a_folder(location)
    else:  # ".tiny", "my model": importlib would fail with its own words (a TypeError for a leading dot)
        raise ConfigError(
            f"no model file or module {location!r}: it is neither FILE.py nor a module name "
            f"(letters, digits and _ between dots). Give FILE.py or an importable module name such "
            f"as {_EXAMPLE_MODULE}.",
            field="model_file",
            value=location,
        )
    path = getattr(module, "__file__", None)
    if path:
        _loaded_paths[os.path.realpath(path)] = describe(module)
    _warn_near_misses(module)
    return module


def user_frame(error: BaseException) -> tuple[str, traceback.FrameSummary] | None:
    """(the model file as the user named it, its deepest frame) that ``error``, or an error it was raised
    from, passed through; None when it passed through no model file this process loaded."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = [
            (_loaded_paths[os.path.realpath(frame.filename)], frame)
            for frame in traceback.extract_tb(current.__traceback__)
            if os.path.realpath(frame.filename) in _loaded_paths
        ]
        if frames:
            return frames[-1]
        current = current.__cause__ or current.__context__
    return None


def _a_folder(location: str) -> ConfigError:
    try:
        scripts = sorted(name for name in os.listdir(location) if name.endswith(".py"))[:5]
    except OSError:  # an unreadable folder: the refusal stands without the listing
        scripts = []
    inside = f" (its .py files: {', '.join(scripts)})" if scripts else ""
    return ConfigError(
        f"model file {location!r} is a folder, not a model file{inside}. Give the FILE.py that "
        f"defines model and model_fn, or an importable module name such as {_EXAMPLE_MODULE}.",
        field="model_file",
        value=location,
    )


def describe(module: ModuleType) -> str:
    """How the user named the model file: the path they gave for FILE.py, else the module name."""
    origin = getattr(getattr(module, "__spec__", None), "loader_state", None)
    return origin.location if isinstance(origin, _ModelFileOrigin) else module.__name__


def require(module: ModuleType, name: str) -> Any:
    if not hasattr(module, name):
        raise ConfigError(
            f"{describe(module)} does not define {name!r}, which this command needs.",
            field=name,
            value=describe(module),
        )
    return getattr(module, name)


def _load_file(location: str) -> ModuleType:
    if os.path.isdir(location):
        raise _a_folder(location)
    if not os.path.isfile(location):
        raise ConfigError(
            f"model file {location!r} does not exist (relative to {os.getcwd()}). Give FILE.py or "
            f"an importable module name such as {_EXAMPLE_MODULE}.",
            field="model_file",
            value=location,
        )
    name = _module_name(location)
    spec = importlib.util.spec_from_file_location(name, location)
    if spec is None or spec.loader is None:  # no loader for its suffix: model.txt, model.cfg
        raise ConfigError(
            f"model file {location!r} is not a Python file. Give FILE.py or an importable module name "
            f"such as {_EXAMPLE_MODULE}.",
            field="model_file",
            value=location,
        )
    loader = spec.loader
    spec.loader_state = _ModelFileOrigin(location)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickle and typing look the module up by name
    folder = os.path.dirname(os.path.abspath(location))
    if folder not in sys.path:  # so the file imports its neighbours, as `python FILE.py` would
        sys.path.insert(0, folder)
    try:
        _run_module_code(location, os.path.abspath(location), lambda: loader.exec_module(module))
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _module_name(location: str) -> str:
    """The file's stem as a module name, unless a module other than this file already has it."""
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(location))[0])
    stem = stem if stem and not stem[0].isdigit() else "_" + stem
    candidates = [stem, f"{stem}_py"] + [f"{stem}_py{number}" for number in range(2, 100)]
    return next(name for name in candidates if _name_is_free(name, location))


def _name_is_free(name: str, location: str) -> bool:
    loaded = sys.modules.get(name)
    if loaded is not None:  # a model file loaded earlier in this process may be replaced; a real module may not
        return isinstance(getattr(getattr(loaded, "__spec__", None), "loader_state", None), _ModelFileOrigin)
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if found is None:
        return True
    return found.origin is not None and os.path.isfile(found.origin) and os.path.samefile(found.origin, location)


def _import_module(location: str) -> ModuleType:
    try:
        return _run_module_code(location, None, lambda: importlib.import_module(location))
    except ModuleNotFoundError as error:  # the module itself (or its package) is missing; see _run_module_code
        missing = error.name or location
        folder = f" ({location} here is a folder, not a model file)" if os.path.isdir(location) else ""
        raise ConfigError(
            f"no model file or module {location!r}: no module named {missing!r}{_nearest(missing)}"
            f"{folder}. Give FILE.py or an importable module name such as {_EXAMPLE_MODULE}.",
            field="model_file",
            value=location,
        ) from None


def _nearest(missing: str) -> str:
    """' (did you mean torchestimator.cli.demo?)' from the modules beside the missing one, if one is close."""
    parent, _, leaf = missing.rpartition(".")
    try:
        package = importlib.import_module(parent) if parent else None
    except Exception:  # the parent is the user's and may be broken; a suggestion is not worth its error
        return ""
    search = getattr(package, "__path__", None) if package is not None else None
    if parent and search is None:
        return ""
    names = [info.name for info in pkgutil.iter_modules(search)]
    close = difflib.get_close_matches(leaf, names, n=1)
    return f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""


def _run_module_code(location: str, path: str | None, run: Callable[[], ModuleType | None]) -> Any:
    """Runs the model file's code; what it raises names the file (see the module docstring)."""
    try:
        return run()
    except ModuleNotFoundError as error:
        if path is None and error.name and (location == error.name or location.startswith(error.name + ".")):
            raise  # the module itself is missing: _import_module words that
        raise ConfigError(_raised_while_importing(location, error), field="model_file", value=location) from error
    except TorchEstimatorError as error:  # e.g. a RunConfig refused at the file's top level: one line, with where
        raise ConfigError(f"{location}{_where(error, path)}: {error}", field="model_file", value=location) from error
    except Exception as error:
        raise ConfigError(_raised_while_importing(location, error), field="model_file", value=location) from error


def _raised_while_importing(location: str, error: BaseException) -> str:
    report = traceback.TracebackException.from_exception(error)
    frames = list(report.stack)
    # Drop our frames and importlib's, above the first frame of the model file's own code.
    while frames and (frames[0].filename == __file__ or frames[0].filename.startswith("<frozen importlib")):
        frames.pop(0)
    report.stack = traceback.StackSummary.from_list(frames)
    details = "".join(report.format()).rstrip()
    return f"{location} raised {type(error).__name__} while being imported:\n{details}"


def _where(error: BaseException, path: str | None) -> str:
    """', line 12' of the deepest frame in the model file (path), or '' when unknown."""
    if path is None:
        return ""
    lines = [
        frame.lineno for frame in traceback.extract_tb(error.__traceback__) if os.path.abspath(frame.filename) == path
    ]
    return f", line {lines[-1]}" if lines else ""


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, equals, text = pair.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"--param expects NAME=VALUE; received {pair!r}.", field="param", value=pair)
        try:
            overrides[key] = json.loads(text)
        except json.JSONDecodeError:
            overrides[key] = text
    return overrides


def model_params(module: ModuleType, param_flags: list[str]) -> dict[str, Any]:
    """The file's params with the --param overrides; a name the file's params lacks is warned about (one line)
    and passed on, as TF's hparams are passed freely, unless the file defines no params at all."""
    defined = getattr(module, "params", None) or {}
    overrides = parse_overrides(param_flags)
    if isinstance(defined, Mapping) and defined:
        for name in (name for name in overrides if name not in defined):
            close = difflib.get_close_matches(name, [str(known) for known in defined], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            logger.warning(
                "--param %s: %s's params has no %r%s; it has %s. Passed on as given.",
                name,
                describe(module),
                name,
                hint,
                ", ".join(map(str, defined)),
            )
    return {**defined, **overrides}


def build_estimator(module: ModuleType, args: argparse.Namespace) -> Any:
    import torchestimator as te

    params = model_params(module, args.param)
    config = getattr(module, "config", None) or te.RunConfig()
    changes: dict[str, Any] = {"model_dir": args.model_dir}
    if args.no_progress:
        changes["progress_bar"] = False
    config = config.replace(**changes)
    return te.Estimator(
        model_fn=require(module, "model_fn"),
        model=require(module, "model"),
        optimizer=getattr(module, "optimizer", None),
        config=config,
        params=params,
        lr_scheduler=getattr(module, "lr_scheduler", None),
    )


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_file", help="FILE.py or an importable module defining model, model_fn, optimizer, input_fns"
    )
    parser.add_argument("--model_dir", required=True, help="where checkpoints and summaries live")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override params[NAME] (VALUE parsed as JSON when it can be)",
    )
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
