"""ModeKeys and EstimatorSpec: what a model_fn returns, and the checks on it.

Only the contract between model_fn and the loops lives here; running the
spec (backward, metrics, export) belongs to loop.py and export/.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch


class ModeKeys:
    """The three modes a model_fn is called in; the strings are TensorFlow's."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"

    ALL = (TRAIN, EVAL, PREDICT)


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
    """What model_fn computed for one batch, in one mode.

    The training step (backward, optimizer and scheduler step, zero_grad,
    mixed precision, accumulation, clipping) belongs to the framework.
    ``train_op`` is an escape hatch: a zero-argument callable that does the
    whole step itself (backward, step, zero_grad); the framework then only
    counts the step.
    """

    mode: str
    predictions: torch.Tensor | Mapping[str, torch.Tensor] | None = None
    loss: torch.Tensor | None = None
    train_op: Callable[[], Any] | None = None
    eval_metric_ops: Mapping[str, Any] | None = None
    export_outputs: Mapping[str, Any] | None = None
    training_hooks: Iterable[Any] = ()
    evaluation_hooks: Iterable[Any] = ()
    prediction_hooks: Iterable[Any] = ()

    def __post_init__(self) -> None:
        if self.mode not in ModeKeys.ALL:
            raise ValueError(
                f"EstimatorSpec.mode must be one of {ModeKeys.ALL}; received {self.mode!r}."
            )
        for field in ("training_hooks", "evaluation_hooks", "prediction_hooks"):
            hooks = getattr(self, field)
            if type(hooks) is tuple:  # the default: nothing to convert (this runs for every batch)
                continue
            if hooks is None:
                hooks = ()
            if not isinstance(hooks, Iterable):
                raise TypeError(f"EstimatorSpec.{field} must be an iterable of hooks; received {hooks!r}.")
            object.__setattr__(self, field, tuple(hooks))


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)} and dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}"[:200]


def validate_spec(spec: Any, mode: str) -> EstimatorSpec:
    """Checks what model_fn returned for this mode; the error names the field and what was found."""
    if not isinstance(spec, EstimatorSpec):
        raise TypeError(
            f"model_fn must return an EstimatorSpec; received {_describe(spec)}. "
            "Return te.EstimatorSpec(mode, predictions=..., loss=...)."
        )
    if spec.mode != mode:
        raise ValueError(f"model_fn was called in mode {mode!r} but returned an EstimatorSpec for mode {spec.mode!r}.")
    if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
        _check_loss(spec.loss, mode)
    if mode == ModeKeys.PREDICT:
        if spec.predictions is None:
            raise ValueError("EstimatorSpec.predictions is required in PREDICT mode; model_fn returned none.")
        _check_predictions(spec.predictions)
    if mode == ModeKeys.TRAIN and spec.train_op is not None and not callable(spec.train_op):
        raise TypeError(
            f"EstimatorSpec.train_op must be a zero-argument callable doing the whole step; received {_describe(spec.train_op)}."
        )
    if spec.eval_metric_ops is not None and mode == ModeKeys.EVAL:
        if not isinstance(spec.eval_metric_ops, Mapping):
            raise TypeError(f"EstimatorSpec.eval_metric_ops must be a dict of name -> metric; received {_describe(spec.eval_metric_ops)}.")
        for reserved in ("loss", "global_step"):
            if reserved in spec.eval_metric_ops:
                raise ValueError(
                    f"eval_metric_ops may not contain a metric named {reserved!r}: the framework adds it. Rename your metric."
                )
    return spec


def _check_loss(loss: Any, mode: str) -> None:
    if loss is None:
        raise ValueError(f"EstimatorSpec.loss is required in {mode.upper()} mode; model_fn returned none.")
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"EstimatorSpec.loss must be a scalar tensor; received {_describe(loss)}.")
    if loss.numel() != 1:
        raise ValueError(
            f"EstimatorSpec.loss must be a scalar; received {_describe(loss)}. "
            "Reduce it, e.g. with .mean()."
        )
    if not loss.is_floating_point():
        raise TypeError(f"EstimatorSpec.loss must be a floating-point tensor; received {_describe(loss)}.")


def _check_predictions(predictions: Any) -> None:
    if isinstance(predictions, torch.Tensor):
        return
    if not isinstance(predictions, Mapping):
        raise TypeError(
            f"EstimatorSpec.predictions must be a tensor or a dict of tensors; received {_describe(predictions)}."
        )
    for key, value in predictions.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"EstimatorSpec.predictions[{key!r}] must be a tensor; received {_describe(value)}."
            )
