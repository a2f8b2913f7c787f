"""The Estimator's arguments checked by type before any work: each wrong one a ConfigTypeError naming it.

What belongs here: the type checks of Estimator(...) / Estimator.from_module(...) arguments, the refusal of
factories whose signature cannot take the framework's call (``model=nn.Linear``, ``lr_scheduler=StepLR``),
the check of what a factory returned, and which model_dir a run uses. What does not: value checks of settings (RunConfig) and of
model_fn's arguments (calling.py).
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import torch

from torchestimator._core.calling import factory_call_refusal, required_positionals
from torchestimator._core.config import RunConfig
from torchestimator._io import filesystems
from torchestimator.errors import ConfigError, ConfigTypeError

logger = logging.getLogger(__name__)

__all__ = [
    "check_argument_types",
    "checked_factory_result",
    "is_scheduler",
    "model_argument_required",
    "resolve_model_dir",
]

_Init = TypeVar("_Init", bound=Callable[..., None])

MISSING_MODEL = (
    "Estimator(...) needs model=: the nn.Module, or a factory that builds it (model=lambda params: MyNet(params)). "
    "tf.estimator's Estimator had no such argument because model_fn built its layers (tf.layers.dense, ...) in "
    "each graph; here the module is built once per process and passed to model_fn as its `model` argument: "
    "model_fn(model, features, labels, mode, params). Move the layers into that factory (nn.LazyLinear needs no "
    "input size), and give optimizer= (a factory: lambda parameters: torch.optim.Adam(parameters)) to train. "
    "See docs/porting-from-tf-estimator.md."
)


def model_argument_required(init: _Init) -> _Init:
    """Wraps Estimator.__init__: a call without ``model`` (pasted tf.estimator code, which had no such argument)
    is a ConfigTypeError saying what model= is, not Python's bare "missing 1 required positional argument".
    ``inspect.signature`` still shows the wrapped ``__init__`` (functools.wraps), with ``model`` required."""

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **keywords: Any) -> None:
        if len(args) < 2 and "model" not in keywords:  # args[0] is model_fn, args[1] model
            raise ConfigTypeError(MISSING_MODEL, field="model", value=None)
        init(self, *args, **keywords)

    return cast(_Init, checked)


def check_argument_types(
    *,
    model: Any,
    optimizer: Any,
    model_dir: Any,
    config: Any,
    params: Any,
    lr_scheduler: Any,
    call: str = "Estimator",
    model_field: str = "model",
) -> None:
    """Each Estimator argument of the wrong type is a ConfigTypeError naming it (a TypeError too), before any
    work; the value checks (an empty model_dir, a model_fn's arguments) follow where each is used. ``call`` and
    ``model_field`` name the call the user made (``Estimator.from_module(module=...)``).

    Factories are refused here when their signature shows that the framework's call cannot work (a class whose
    constructor needs what the framework never passes: ``model=nn.Linear``, ``lr_scheduler=StepLR``); what they
    return is checked when they are called (``checked_factory_result``)."""

    def refuse(field: str, expected: str, value: Any) -> None:
        raise ConfigTypeError(
            f"{call}({field}=...) must be {expected}; received {value!r} ({type(value).__name__}).",
            field=field,
            value=value,
        )

    if isinstance(model, (str, os.PathLike)) and call == "Estimator":  # tf.estimator's second argument
        refuse(
            model_field,
            "an nn.Module or a factory returning one (lambda params: MyNet(params)), the second argument here: "
            "tf.estimator's Estimator took model_dir second, so pass model_dir= by name",
            model,
        )
    if not isinstance(model, torch.nn.Module) and not callable(model):
        refuse(model_field, "an nn.Module or a factory returning one (lambda params: MyNet(params))", model)
    if optimizer is not None and not callable(optimizer):  # an optimizer object: it needs the parameters first
        refuse(
            "optimizer",
            "a factory building the optimizer from the parameters (lambda parameters: "
            "torch.optim.Adam(parameters)), or None",
            optimizer,
        )
    if model_dir is not None and not isinstance(model_dir, (str, os.PathLike)):
        refuse("model_dir", "a str or os.PathLike path, or None for a temporary folder", model_dir)
    if config is not None and not isinstance(config, RunConfig):
        refuse("config", "a te.RunConfig or None", config)
    if params is not None and not isinstance(params, Mapping):
        refuse("params", "a dict (a Mapping) of hyperparameters, or None", params)
    if lr_scheduler is not None and not callable(lr_scheduler):
        refuse(
            "lr_scheduler",
            "a factory building the scheduler from the optimizer (lambda optimizer: "
            "torch.optim.lr_scheduler.StepLR(optimizer, 100)), or None",
            lr_scheduler,
        )
    if not isinstance(model, torch.nn.Module):
        _check_model_factory(model, f"{call}({model_field}=...)", model_field)
    if optimizer is not None:
        _check_factory(
            optimizer,
            f"{call}(optimizer=...)",
            "optimizer",
            torch.optim.Optimizer,
            "parameters",
            "torch.optim.Adam(parameters, lr=1e-3)",
        )
    if lr_scheduler is not None:
        _check_factory(
            lr_scheduler,
            f"{call}(lr_scheduler=...)",
            "lr_scheduler",
            torch.optim.lr_scheduler.LRScheduler,
            "optimizer",
            "torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)",
        )


def _check_model_factory(model: Any, where: str, field: str) -> None:
    """A model factory is called as ``model(params)`` when it takes an argument, else ``model()``.

    An nn.Module class is such a factory when its constructor needs nothing (``class Net(nn.Module): def
    __init__(self)``) or one argument, which receives params (``def __init__(self, params)``). Refused: a class
    that is no nn.Module, a constructor needing two or more arguments (``nn.Linear``: in_features,
    out_features), and torch's own layers needing any (``nn.BatchNorm1d``: num_features, never params)."""
    name = _name_of(model)
    if isinstance(model, type):
        if not issubclass(model, torch.nn.Module):
            raise ConfigTypeError(
                f"{where} received the class {name}, which is not an nn.Module; pass an nn.Module "
                f"or a factory returning one ({field}=lambda params: MyNet(params)).",
                field=field,
                value=model,
            )
        required = required_positionals(model) or []
        from_torch = model.__module__.split(".")[0] == "torch"
        if len(required) > 1 or (required and from_torch):
            raise ConfigTypeError(
                f"{where} received the class {name}, whose constructor needs {', '.join(required)}; a model class is "
                f"built as {name}(params) (or {name}() when it takes no argument). Pass an instance ({field}="
                f"{name}(...)) or a factory ({field}=lambda params: {name}(...)).",
                field=field,
                value=model,
            )
    refusal = factory_call_refusal(model, first_is_params=True)
    if refusal is not None:
        raise ConfigTypeError(
            f"{where} cannot be called as a model factory is, with params or with nothing "
            f"({name}: {refusal}); pass lambda params: MyNet(...) or lambda: MyNet(...).",
            field=field,
            value=model,
        )


def _check_factory(factory: Any, where: str, field: str, builds: type, first: str, example: str) -> None:
    """An optimizer or scheduler factory is called with ``(first)`` or ``(first, params)``: a class of what it builds
    whose constructor needs only ``first`` is such a factory (``optimizer=torch.optim.Adam``); other classes, and
    callables that cannot take that call, are refused with the lambda to write instead."""
    name = _name_of(factory)
    if isinstance(factory, type):
        expected = f"{builds.__module__}.{builds.__qualname__}"
        if not issubclass(factory, builds):
            raise ConfigTypeError(
                f"{where} received the class {name}, which is not a {expected}; pass a factory: "
                f"lambda {first}: {example}.",
                field=field,
                value=factory,
            )
        required = required_positionals(factory) or []
        if len(required) > 1:
            extra = ", ".join(f"{argument}=..." for argument in required[1:])
            raise ConfigTypeError(
                f"{where} received {name}, a class whose constructor also needs {', '.join(required[1:])}; pass a "
                f"factory: {field}=lambda {first}: {name}({first}, {extra}).",
                field=field,
                value=factory,
            )
    refusal = factory_call_refusal(factory)
    if refusal is not None:
        raise ConfigTypeError(
            f"{where} cannot be called as the framework calls it, with ({first}) or ({first}, "
            f"params) ({name}: {refusal}); pass lambda {first}: {example}.",
            field=field,
            value=factory,
        )


def checked_factory_result(result: Any, where: str, field: str, expected: str, fits: Callable[[Any], bool]) -> Any:
    """A factory's result, or a ConfigTypeError naming the argument when it is not what the framework needs."""
    if not fits(result):
        kind = "a class" if isinstance(result, type) else type(result).__name__
        raise ConfigTypeError(
            f"The factory given as {where} returned {result!r:.100} ({kind}); it must return {expected}.",
            field=field,
            value=result,
        )
    return result


def is_scheduler(value: Any) -> bool:
    """A torch LRScheduler, or an object that steps and checkpoints like one."""
    if isinstance(value, type):
        return False
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return True
    return all(callable(getattr(value, method, None)) for method in ("step", "state_dict", "load_state_dict"))


def _name_of(value: Any) -> str:
    return getattr(value, "__qualname__", None) or type(value).__name__


def resolve_model_dir(model_dir: str | os.PathLike[str] | None, config: RunConfig) -> str:
    """Estimator(model_dir=) or RunConfig.model_dir (not both, unless equal), or a new temporary folder."""
    if model_dir is not None:
        model_dir = os.fspath(model_dir)
        if not isinstance(model_dir, str):  # a PathLike of bytes
            raise ConfigTypeError(
                f"Estimator(model_dir=...) must be a str path; received {model_dir!r} (bytes).",
                field="model_dir",
                value=model_dir,
            )
        if model_dir == "":
            raise ConfigError(
                "Estimator(model_dir=...) must be a non-empty path, or None for a temporary folder.",
                field="model_dir",
                value=model_dir,
            )
        if filesystems.is_url(model_dir):
            if config.model_dir is not None and config.model_dir.rstrip("/") != model_dir.rstrip("/"):
                raise ConfigError(
                    f"model_dir is set both in Estimator ({model_dir!r}) and in RunConfig ({config.model_dir!r}) and "
                    "they differ. Set it in one place.",
                    field="model_dir",
                    value=model_dir,
                )
            return model_dir.rstrip("/")
        model_dir = filesystems.local_path(model_dir)
        if os.path.exists(model_dir) and not os.path.isdir(model_dir):
            raise ConfigError(
                f"model_dir {model_dir!r} exists and is not a directory. Choose another model_dir.",
                field="model_dir",
                value=model_dir,
            )
        if config.model_dir is not None and os.path.abspath(
            filesystems.local_path(config.model_dir)
        ) != os.path.abspath(model_dir):
            raise ConfigError(
                f"model_dir is set both in Estimator ({model_dir!r}) and in RunConfig ({config.model_dir!r}) and they "
                "differ. Set it in one place.",
                field="model_dir",
                value=model_dir,
            )
        return model_dir
    if config.model_dir is not None:
        return (
            config.model_dir.rstrip("/")
            if filesystems.is_url(config.model_dir)
            else filesystems.local_path(config.model_dir)
        )
    model_dir = tempfile.mkdtemp(prefix="torchestimator-")
    logger.warning("Using temporary folder as model directory: %s", model_dir)
    return model_dir
