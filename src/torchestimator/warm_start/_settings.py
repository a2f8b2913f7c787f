"""Warm-start settings: what to warm-start from and which tensors, checked when they are built.

What belongs here: ``WarmStartSettings`` (TensorFlow's selection rules, translated
to PyTorch names), ``as_warm_start_settings`` and the checks of patterns,
mappings and converter specs. What does not: applying them (``_selection``,
``_build``), reading files (``torchestimator.interop``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import numpy

from torchestimator.interop import WeightSource
from torchestimator.interop.layouts import Converter, converter_from_spec

__all__ = [
    "ConverterSpec",
    "PathOrSource",
    "WarmStartSettings",
    "as_warm_start_settings",
    "compile_pattern",
    "pattern_list",
    "resolve_converter",
]

ConverterSpec = str | Converter | Callable[[numpy.ndarray], numpy.ndarray]
PathOrSource = Union[str, "os.PathLike[str]", WeightSource]


@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
    """What to warm-start from, and which tensors: ``tf.estimator.WarmStartSettings`` for PyTorch.

    Selection (``vars_to_warm_start``), as in TensorFlow, with ``re.match``
    (anchored at the start only: ``"encoder"`` also picks ``encoder2.weight``;
    end a pattern with ``\\.`` or ``$`` to be strict):

    * a **string**: one regex over the *trainable parameters* only
      (``named_parameters()`` with ``requires_grad``), like TF's
      ``TRAINABLE_VARIABLES`` collection. The default ``".*"`` therefore leaves
      BatchNorm running statistics (buffers) and frozen parameters fresh.
    * a **list of strings**: regexes over *all* ``state_dict`` entries,
      parameters and persistent buffers (BatchNorm ``running_mean`` /
      ``running_var``), like TF's ``GLOBAL_VARIABLES``; ``[".*"]`` warm-starts
      everything. BatchNorm's ``num_batches_tracked`` counter is selected like
      any buffer and loads when the source holds it (our own checkpoints,
      torch files); TF/Keras have no counterpart, so when the source lacks it
      it keeps its fresh value and the report says so, never an error (it only
      matters with ``momentum=None``).
    * ``None``: nothing is warm-started (a warning is logged).

    A selection that matches nothing is an error: a pattern that warm-starts
    nothing is almost always a mistake.

    ``var_name_to_prev_var_name`` maps a target name to its source name; it
    only renames, it does not select, and a key that names no selected target
    is an error ("were not used. Perhaps you misspelled them?"), as in TF.

    Source name of a selected target, first that applies: the rename; then
    ``mapping_fn(target)`` unless it returns None; then the same name; then,
    only when ``accept_proposed_mapping`` is true, ``interop.matching``'s
    proposal (by layer kind, order and shape; ``confident`` proposals only, an
    ``ambiguous`` one when its target also appears in ``converters``, which
    confirms it). Proposals are always computed for targets left without a
    source and shown in the report.

    Layout converter of an entry: ``converters[target]`` (a name as
    ``interop.layouts.CONVERTER_SPECS`` lists them, e.g. ``"dense_to_linear"`` or
    ``"flatten_dense:4,6,6"``; a ``Converter``; or any function of a numpy
    array); else the proposal's converter when the proposal pairs the same two
    names; else none (identity). A Linear after a Flatten of a convolution's
    feature map, loaded from a TF/Keras Dense kernel, needs its converter
    named whatever rule named its source (a rename, ``mapping_fn``, the same
    name): the kernel's rows are in the order the source flattened (NHWC for
    Keras), which no name tells, so the plan has an error until
    ``converters[target]`` says ``flatten_dense:C,H,W`` or ``dense_to_linear``.
    """

    ckpt_to_initialize_from: PathOrSource
    """Any path ``interop.open_weights`` reads (file, model_dir, TF checkpoint), or an open ``WeightSource``."""
    vars_to_warm_start: str | Sequence[str] | None = ".*"
    """One regex (trainable parameters), a list of regexes (parameters and buffers), or None (nothing)."""
    var_name_to_prev_var_name: Mapping[str, str] | None = None
    """Target name -> source name; renames only."""
    _: dataclasses.KW_ONLY
    allow_missing: bool = False
    """Selected targets absent from the source keep their fresh values instead of raising."""
    mapping_fn: Callable[[str], str | None] | None = None
    """target name -> source name, or None to fall through to the other rules."""
    converters: Mapping[str, ConverterSpec] | None = None
    """Target name -> layout converter (a spec such as ``"flatten_dense:4,6,6"``, a ``Converter`` or a function)."""
    accept_proposed_mapping: bool = False
    """Use the matcher's proposals for targets no other rule resolves (see the class docstring)."""
    warm_start_optimizer: bool = False
    """Also take the optimizer (and LR scheduler) state, from a torchestimator checkpoint only; it loads
    when the optimizer's class and parameter groups match, else it starts fresh with a warning."""

    def __post_init__(self) -> None:
        source = self.ckpt_to_initialize_from
        if not isinstance(source, (str, os.PathLike, WeightSource)):
            raise TypeError(
                f"ckpt_to_initialize_from must be a path or a WeightSource; received {type(source).__name__}."
            )
        if isinstance(source, (str, os.PathLike)) and not os.fspath(source):
            raise ValueError("ckpt_to_initialize_from must not be empty: name the checkpoint or weight file.")
        patterns = self.vars_to_warm_start
        if isinstance(patterns, (list, tuple)):
            object.__setattr__(self, "vars_to_warm_start", tuple(patterns))
        elif patterns is not None and not isinstance(patterns, str):
            raise TypeError(
                "vars_to_warm_start must be a regex string, a list of regex strings, or None; received "
                f"{type(patterns).__name__}."
            )
        for pattern in pattern_list(self.vars_to_warm_start):
            compile_pattern(pattern)
        _check_str_mapping(self.var_name_to_prev_var_name, "var_name_to_prev_var_name")
        if self.mapping_fn is not None and not callable(self.mapping_fn):
            raise TypeError(f"mapping_fn must be callable; received {type(self.mapping_fn).__name__}.")
        for target, spec in (self.converters or {}).items():
            resolve_converter(spec, target)
        for flag in ("allow_missing", "accept_proposed_mapping", "warm_start_optimizer"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False; received {getattr(self, flag)!r}.")


def as_warm_start_settings(value: PathOrSource | WarmStartSettings) -> WarmStartSettings:
    """``warm_start_from`` as settings: a path becomes ``WarmStartSettings(path)``, as in TensorFlow."""
    if isinstance(value, WarmStartSettings):
        return value
    if isinstance(value, (str, os.PathLike, WeightSource)):
        return WarmStartSettings(value)
    raise TypeError(
        f"warm_start_from must be a path, a WeightSource or a WarmStartSettings; received {type(value).__name__}."
    )


def pattern_list(patterns: str | Sequence[str] | None) -> list[str]:
    if patterns is None:
        return []
    if isinstance(patterns, str):
        return [patterns]
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(
                "vars_to_warm_start as a list must hold regex strings only; received an item of type "
                f"{type(pattern).__name__} ({pattern!r})."
            )
    return list(patterns)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(f"vars_to_warm_start: {pattern!r} is not a valid regex: {error}.") from None


def _check_str_mapping(mapping: Any, label: str) -> None:
    if mapping is None:
        return
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{label} must be a dict of str -> str; received {type(mapping).__name__}.")
    for key, value in mapping.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"{label} must map str -> str; received {key!r}: {value!r}.")


def resolve_converter(spec: ConverterSpec | None, target: str) -> Converter | None:
    if spec is None:
        return None
    if isinstance(spec, Converter):
        return spec
    if isinstance(spec, str):
        try:
            return converter_from_spec(spec)
        except ValueError as error:
            raise ValueError(f"converters[{target!r}]: {error}") from None
    if callable(spec):
        name = getattr(spec, "__name__", type(spec).__name__)
        return Converter(name=name, description="user function", function=spec, output_shape=lambda shape: None)
    raise TypeError(
        f"converters[{target!r}] must be a converter name, a Converter or a function of a numpy array; "
        f"received {type(spec).__name__}."
    )
