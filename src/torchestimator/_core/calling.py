"""Calling user functions with the arguments they declare, and reading what input_fn yields.

model_fn's and input_fn's callers (which of params, config, input_context each gets) and the user factories'
(model, optimizer, scheduler) live here; the Estimator only says what to call them with.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Set as AbstractSet
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchestimator._core.batches import InputSource
    from torchestimator._core.config import RunConfig
    from torchestimator._core.inference import InputCaller
    from torchestimator._core.spec import EstimatorSpec
    from torchestimator.distribute.strategy import Strategy

logger = logging.getLogger("torchestimator")

MODEL_FN_ARGS = {"model", "features", "labels", "mode", "params", "config"}
INPUT_FN_ARGS = {"params", "mode", "config", "input_context"}


def declared_parameters(function: Callable[..., Any]) -> tuple[set[str], bool]:
    """Names the function accepts, and whether it takes **kwargs."""
    signature = inspect.signature(function)
    names = {
        name
        for name, parameter in signature.parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())
    return names, takes_kwargs


def takes_in_order(function: Callable[..., Any], names: list[str]) -> bool:
    """Whether ``function(*values)`` binds the values to ``names``: its parameters are exactly these, positional,
    in this order (no *args or **kwargs to catch them otherwise).

    Asked of the callable itself: a decorator's wrapper (``functools.wraps`` sets ``__wrapped__``) or an
    object declaring a ``__signature__`` may take its arguments otherwise than the signature it shows (a
    wrapper forwarding ``**kwargs``), so those are called by name.
    """
    if getattr(function, "__signature__", None) is not None:
        return False
    try:
        parameters = list(inspect.signature(function, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):  # a signature inspect cannot read: the caller calls by name
        return False
    return [parameter.name for parameter in parameters] == names and all(
        parameter.kind is parameter.POSITIONAL_OR_KEYWORD for parameter in parameters
    )


def check_declared(
    function: Callable[..., Any], role: str, allowed: set[str], required: AbstractSet[str] = frozenset()
) -> set[str]:
    """Refuses arguments the framework cannot supply, before anything runs."""
    if not callable(function):
        raise TypeError(f"{role} must be callable; received {function!r}.")
    names, takes_kwargs = declared_parameters(function)
    unexpected = names - allowed
    if unexpected:
        raise ValueError(
            f"{role} {getattr(function, '__name__', function)!r} has arguments the framework cannot supply: "
            f"{sorted(unexpected)}. Expected some of {sorted(allowed)}."
        )
    missing = required - names
    if missing and not takes_kwargs:
        raise ValueError(f"{role} {getattr(function, '__name__', function)!r} must accept {sorted(missing)}.")
    return allowed if takes_kwargs else names


def call_with(function: Callable[..., Any], declared: set[str], available: Mapping[str, Any]) -> Any:
    return function(**{name: value for name, value in available.items() if name in declared})


def model_fn_caller(
    model_fn: Callable[..., EstimatorSpec], declared: set[str], params: dict[str, Any], config: RunConfig
) -> Callable[..., EstimatorSpec]:
    """(model, features, labels, mode) -> EstimatorSpec, passing model_fn the arguments it ``declared``."""
    takes_labels = "labels" in declared
    # Work out once what is passed, so each batch only builds a small dict.
    fixed = {name: value for name, value in (("params", params), ("config", config)) if name in declared}
    per_batch: list[str] = [name for name in ("model", "features", "labels", "mode") if name in declared]

    if per_batch == ["model", "features", "labels", "mode"] and not fixed:
        if takes_in_order(model_fn, per_batch):
            # The usual signature, in the usual order: the loops call model_fn itself, positionally.
            return model_fn

        # The four arguments in another order: by name, without building the argument dict for every batch.
        def call_all(model: torch.nn.Module, features: Any, labels: Any, mode: str) -> EstimatorSpec:
            return model_fn(model=model, features=features, labels=labels, mode=mode)

        return call_all

    def call(model: torch.nn.Module, features: Any, labels: Any, mode: str) -> EstimatorSpec:
        if labels is not None and not takes_labels:
            raise ValueError("model_fn does not take labels, but input_fn returns labels.")
        values = {"model": model, "features": features, "labels": labels, "mode": mode}
        return model_fn(**{name: values[name] for name in per_batch}, **fixed)

    return call


def input_caller(params: dict[str, Any], config: RunConfig) -> InputCaller:
    """(input_fn, mode, strategy) -> its batches: input_fn's arguments checked at each call, then passed."""

    def call(input_fn: Callable[..., Any], mode: str, strategy: Strategy) -> InputSource:
        return call_input_fn(
            input_fn, check_declared(input_fn, "input_fn", INPUT_FN_ARGS), mode, strategy, params, config
        )

    return call


def call_input_fn(
    input_fn: Callable[..., Any],
    declared: set[str],
    mode: str,
    strategy: Strategy,
    params: dict[str, Any],
    config: RunConfig,
    *,
    warn: bool = True,
) -> InputSource:
    """Calls input_fn with the arguments it ``declared`` (check_declared's answer); refuses what is no input.

    ``warn=False`` for an extra call (the dry forward of lazy layers): its warnings were or will be given once.
    """
    context = strategy.input_context()
    source: InputSource | None = call_with(
        input_fn, declared, {"params": params, "mode": mode, "config": config, "input_context": context}
    )
    if source is None or not hasattr(source, "__iter__"):
        raise TypeError(
            f"input_fn must return an iterable of (features, labels) batches (a DataLoader, a generator, "
            f"te.numpy_input_fn(...)()); it returned {type(source).__name__}."
        )
    if warn and context.num_replicas_in_sync > 1 and "input_context" not in declared:
        logger.warning(
            "input_fn does not take input_context: every one of the %d replicas reads the same batches.",
            context.num_replicas_in_sync,
        )
    return source


def call_factory(factory: Callable[..., Any], first: Any, params: Any, *, first_is_params: bool = False) -> Any:
    """Calls a user factory (model, optimizer, scheduler) with (first) or (first, params), whichever it accepts.

    With ``first_is_params`` (a model factory) ``first`` is the params dict, passed only if the factory takes
    an argument.
    """
    count = factory_argument_count(factory, first_is_params=first_is_params)
    return factory(*(first, params)[: 1 if count is None else count])


def required_positionals(function: Callable[..., Any]) -> list[str] | None:
    """The positional parameters a call must fill (no default), in order; None when the signature cannot be read."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    return [
        name
        for name, p in signature.parameters.items()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def factory_argument_count(factory: Callable[..., Any], *, first_is_params: bool = False) -> int | None:
    """How many positional arguments ``call_factory`` passes to ``factory``; None when its signature cannot be read
    (then it passes the first one)."""
    required = required_positionals(factory)
    if required is None:
        return None
    if first_is_params:
        return 1 if required else 0
    return 2 if len(required) >= 2 else 1


def factory_call_refusal(factory: Callable[..., Any], *, first_is_params: bool = False) -> str | None:
    """Why ``call_factory``'s call cannot bind to ``factory``'s signature ("missing a required argument: 'x'",
    "too many positional arguments"), or None when it can (or the signature cannot be read)."""
    count = factory_argument_count(factory, first_is_params=first_is_params)
    if count is None:
        return None
    try:
        inspect.signature(factory).bind(*range(count))
    except TypeError as error:
        return str(error)
    return None


def split_batch(batch: Any, index: int) -> tuple[Any, Any]:
    """(features, labels) from one element of the input; features alone gives labels None."""
    if isinstance(batch, (tuple, list)):
        if len(batch) != 2:
            raise ValueError(
                f"input_fn must yield (features, labels) pairs or features alone; batch {index} is a "
                f"{type(batch).__name__} of length {len(batch)}."
            )
        return batch[0], batch[1]
    if isinstance(batch, (Mapping, torch.Tensor)):
        return batch, None
    raise TypeError(
        f"input_fn must yield (features, labels) pairs or features (a dict of tensors or a tensor); "
        f"batch {index} is {type(batch).__name__}: {batch!r:.200}."
    )


def to_device(value: Any, device: torch.device) -> Any:
    """Moves every tensor inside dicts, lists and tuples to `device`."""
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device, non_blocking=True)
    if isinstance(value, Mapping):
        return {key: to_device(item, device) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(to_device(item, device) for item in value)
    if isinstance(value, list):
        return [to_device(item, device) for item in value]
    return value


def batch_length(value: Any) -> int | None:
    """Rows in a batch (first dimension of the first tensor found), for weighting the eval loss."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() > 0 else 1
    if isinstance(value, Mapping):
        for item in value.values():
            length = batch_length(item)
            if length is not None:
                return length
    if isinstance(value, (list, tuple)):
        for item in value:
            length = batch_length(item)
            if length is not None:
                return length
    return None
