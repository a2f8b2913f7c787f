"""ModeKeys and EstimatorSpec: what a model_fn returns, and the checks on it.

Only the contract between model_fn and the loops lives here; running the
spec (backward, metrics, export) belongs to loop.py and export/.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from torchestimator._tf_names import tf_attribute_aliases


@tf_attribute_aliases("ModeKeys")
class ModeKeys:
    """The three modes a model_fn is called in; the strings are TensorFlow's.

    ``INFER`` (tf.contrib.learn's name) is PREDICT, set from the table of TF names (_tf_names.py).
    """

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"
    INFER: str  # = PREDICT

    ALL = (TRAIN, EVAL, PREDICT)


_HOOK_FIELDS = ("training_hooks", "evaluation_hooks", "prediction_hooks")


@dataclasses.dataclass(frozen=True, init=False)
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

    def __init__(
        self,
        mode: str,
        predictions: Any = None,
        loss: torch.Tensor | None = None,
        train_op: Callable[[], Any] | None = None,
        eval_metric_ops: Mapping[str, Any] | None = None,
        export_outputs: Mapping[str, Any] | None = None,
        training_hooks: Iterable[Any] = (),
        evaluation_hooks: Iterable[Any] = (),
        prediction_hooks: Iterable[Any] = (),
    ) -> None:
        # A spec is built for every batch: one dict update instead of the frozen dataclass's nine
        # object.__setattr__ calls (6.7 us -> 3 us per spec on the benchmark machine). Still frozen afterwards.
        self.__dict__.update(
            mode=mode,
            predictions=predictions,
            loss=loss,
            train_op=train_op,
            eval_metric_ops=eval_metric_ops,
            export_outputs=export_outputs,
            training_hooks=training_hooks,
            evaluation_hooks=evaluation_hooks,
            prediction_hooks=prediction_hooks,
        )
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.mode not in ModeKeys.ALL:
            raise ValueError(f"EstimatorSpec.mode must be one of {ModeKeys.ALL}; received {self.mode!r}.")
        fields = self.__dict__
        if (
            type(fields["training_hooks"])
            is type(fields["evaluation_hooks"])
            is type(fields["prediction_hooks"])
            is tuple
        ):
            return  # the defaults: nothing to convert (this runs for every batch)
        for field in _HOOK_FIELDS:
            hooks = fields[field]
            if type(hooks) is tuple:
                continue
            if hooks is None:
                hooks = ()
            if not isinstance(hooks, Iterable):
                raise TypeError(f"EstimatorSpec.{field} must be an iterable of hooks; received {hooks!r}.")
            fields[field] = tuple(hooks)


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
            raise TypeError(
                f"EstimatorSpec.eval_metric_ops must be a dict of name -> metric; received {_describe(spec.eval_metric_ops)}."
            )
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
            f"EstimatorSpec.loss must be a scalar; received {_describe(loss)}. Reduce it, e.g. with .mean()."
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
            raise TypeError(f"EstimatorSpec.predictions[{key!r}] must be a tensor; received {_describe(value)}.")


class TrainSpecCheck:
    """validate_spec(spec, TRAIN) for the training loop's every batch, at a fraction of its cost, catching the
    same errors at the same step.

    The first spec is checked in full and its shape remembered: its class, its loss's tensor class, dtype and
    shape, and that it has no train_op. A later spec that matches all of them is exactly as valid as the first
    (same type, a scalar floating-point loss), so a few identity tests pass it; any other spec, for instance one
    whose loss turns into a float or a vector at step 3, goes through validate_spec in full and raises there,
    with its message. Specs with a train_op are checked in full every time.
    """

    def __init__(self) -> None:
        self._expected: tuple[type[EstimatorSpec], type[torch.Tensor], torch.dtype, torch.Size] | None = None

    def __call__(self, spec: Any) -> EstimatorSpec:
        expected = self._expected
        if expected is not None and type(spec) is expected[0] and spec.train_op is None and spec.mode == ModeKeys.TRAIN:
            loss = spec.loss
            if type(loss) is expected[1] and loss.dtype is expected[2] and loss.shape == expected[3]:
                return spec
        checked = validate_spec(spec, ModeKeys.TRAIN)
        loss = checked.loss
        if checked.train_op is None and isinstance(loss, torch.Tensor):
            self._expected = (type(checked), type(loss), loss.dtype, loss.shape)
        return checked
