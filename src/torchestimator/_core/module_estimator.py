"""Estimator.from_module: the one-module case (Keras compile + fit, model_to_estimator).

Builds a model_fn from a module, a loss and a few metrics named the way
Keras users name them. Anything beyond one module, one loss and per-batch
metrics deserves a hand-written model_fn.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F

from torchestimator import metrics as metric_ops
from torchestimator._core.spec import EstimatorSpec, ModeKeys
from torchestimator.errors import ConfigError, ConfigTypeError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _binary_cross_entropy_with_logits(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(outputs.reshape(labels.shape), labels.to(outputs.dtype))


def _regression(loss: LossFn) -> LossFn:
    def compute(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return loss(outputs.reshape(labels.shape), labels.to(outputs.dtype))

    return compute


# name -> (loss function, task): the task decides which predictions and metrics make sense.
LOSSES: dict[str, tuple[LossFn, str]] = {
    "cross_entropy": (F.cross_entropy, "multiclass"),
    "sparse_categorical_crossentropy": (F.cross_entropy, "multiclass"),
    "binary_cross_entropy_with_logits": (_binary_cross_entropy_with_logits, "binary"),
    "binary_crossentropy": (_binary_cross_entropy_with_logits, "binary"),
    "mse": (_regression(F.mse_loss), "regression"),
    "mean_squared_error": (_regression(F.mse_loss), "regression"),
    "mae": (_regression(F.l1_loss), "regression"),
    "mean_absolute_error": (_regression(F.l1_loss), "regression"),
}

OPTIMIZERS: dict[str, tuple[Callable[..., torch.optim.Optimizer], float]] = {
    # Keras's default learning rates, so a Keras user's "adam" behaves as they expect.
    "adam": (torch.optim.Adam, 1e-3),
    "adamw": (torch.optim.AdamW, 1e-3),
    "sgd": (torch.optim.SGD, 1e-2),
    "rmsprop": (torch.optim.RMSprop, 1e-3),
}


def resolve_loss(loss: str | LossFn) -> tuple[LossFn, str]:
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ConfigError(
                f"Unknown loss {loss!r}. Expected one of {sorted(LOSSES)} or a callable (outputs, labels) -> loss.",
                field="loss",
                value=loss,
            )
        return LOSSES[loss]
    if not callable(loss):
        raise ConfigTypeError(
            f"loss must be a name or a callable (outputs, labels) -> scalar tensor; received "
            f"{loss!r} ({type(loss).__name__}).",
            field="loss",
            value=loss,
        )
    if isinstance(loss, type):  # nn.CrossEntropyLoss, not nn.CrossEntropyLoss(): calling it builds a module
        raise ConfigTypeError(
            f"Estimator.from_module(loss={loss.__name__}) is a class; pass an instance (loss="
            f"{loss.__name__}()), a function (outputs, labels) -> scalar tensor, or a name "
            "('cross_entropy', 'binary_crossentropy', 'mse', 'mae').",
            field="loss",
            value=loss,
        )
    name = getattr(loss, "__name__", type(loss).__name__).lower()
    task = "multiclass" if "cross_entropy" in name or "crossentropy" in name else "custom"
    if "binary" in name:
        task = "binary"
    return loss, task


def _is_optimizer_class(value: object) -> TypeGuard[type[torch.optim.Optimizer]]:
    return isinstance(value, type) and issubclass(value, torch.optim.Optimizer)


def resolve_optimizer(
    optimizer: str | Callable[..., torch.optim.Optimizer], learning_rate: float | None
) -> Callable[..., torch.optim.Optimizer]:
    if learning_rate is not None and (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, numbers.Real)
        or not math.isfinite(learning_rate)
        or learning_rate <= 0
    ):
        kind = (
            ConfigError
            if isinstance(learning_rate, numbers.Real) and not isinstance(learning_rate, bool)
            else ConfigTypeError
        )
        raise kind(
            f"learning_rate must be a positive number or None (the optimizer's default); received {learning_rate!r}.",
            field="learning_rate",
            value=learning_rate,
        )
    if isinstance(optimizer, str):
        key = optimizer.lower()
        if key not in OPTIMIZERS:
            raise ConfigError(
                f"Unknown optimizer {optimizer!r}. Expected one of {sorted(OPTIMIZERS)} or a factory.",
                field="optimizer",
                value=optimizer,
            )
        cls, default_rate = OPTIMIZERS[key]
        rate = default_rate if learning_rate is None else learning_rate
        return lambda parameters: cls(parameters, lr=rate)
    if _is_optimizer_class(optimizer):
        # A subclass's constructor: (params, lr=..., ...), where the base class takes (params, defaults).
        optimizer_class: Callable[..., torch.optim.Optimizer] = optimizer
        if learning_rate is None:
            return lambda parameters: optimizer_class(parameters)
        return lambda parameters: optimizer_class(parameters, lr=learning_rate)
    if callable(optimizer) and learning_rate is None:
        return optimizer
    if callable(optimizer):
        raise ConfigError(
            "learning_rate is for an optimizer name or class; a factory sets its own learning rate.",
            field="learning_rate",
            value=learning_rate,
        )
    raise ConfigTypeError(
        f"optimizer must be a name, an Optimizer class or a factory; received {optimizer!r} "
        f"({type(optimizer).__name__}).",
        field="optimizer",
        value=optimizer,
    )


def resolve_metrics(metrics: Any) -> Mapping[str, Callable[..., Any]] | list[str]:
    """Metric names (a list or tuple of str) or {name: callable(labels, predictions)}, checked."""
    if metrics is None:
        return []
    if isinstance(metrics, Mapping):
        bad = [name for name, op in metrics.items() if not isinstance(name, str) or not callable(op)]
        if bad:
            raise ConfigTypeError(
                f"metrics as a dict maps names to callables (labels, predictions) -> metric op; {bad[0]!r} does not.",
                field="metrics",
                value=metrics,
            )
        return metrics
    if isinstance(metrics, str):
        raise ConfigTypeError(
            f"metrics must be a list of names (metrics=[{metrics!r}]) or a dict; received the str {metrics!r}.",
            field="metrics",
            value=metrics,
        )
    if not isinstance(metrics, (list, tuple, set, frozenset)) or not all(isinstance(name, str) for name in metrics):
        raise ConfigTypeError(
            f"metrics must be a list of names (accuracy, precision, recall, auc, mse, mae, rmse), "
            f"a dict of callables or None; received {metrics!r} ({type(metrics).__name__}).",
            field="metrics",
            value=metrics,
        )
    return list(metrics)


def _predictions(outputs: torch.Tensor, task: str) -> dict[str, torch.Tensor]:
    predictions = {"outputs": outputs}
    if task == "multiclass":
        predictions["class"] = outputs.argmax(-1)
        predictions["probabilities"] = outputs.softmax(-1)
    elif task == "binary":
        probability = torch.sigmoid(outputs.reshape(outputs.shape[0], -1)[:, 0] if outputs.dim() > 1 else outputs)
        predictions["probabilities"] = probability
        predictions["class"] = (probability > 0.5).long()
    return predictions


def _metric_op(name: str, labels: torch.Tensor, predictions: dict[str, torch.Tensor], task: str) -> Any:
    outputs = predictions["outputs"]
    if name in ("accuracy", "acc"):
        if "class" not in predictions:
            raise ValueError(f"metric 'accuracy' needs a classification loss; this model's task is {task!r}.")
        return metric_ops.accuracy(labels.reshape(-1), predictions["class"].reshape(-1))
    if name in ("precision", "recall", "auc"):
        if task != "binary":
            raise ValueError(f"metric {name!r} is binary; use a binary loss (binary_crossentropy), not {task!r}.")
        if name == "auc":
            return metric_ops.auc(labels.reshape(-1), predictions["probabilities"].reshape(-1))
        op = metric_ops.precision if name == "precision" else metric_ops.recall
        return op(labels.reshape(-1), predictions["class"].reshape(-1))
    regression = {
        "mse": metric_ops.mean_squared_error,
        "mae": metric_ops.mean_absolute_error,
        "rmse": metric_ops.root_mean_squared_error,
    }
    if name in regression:
        return regression[name](labels.reshape(-1).to(outputs.dtype), outputs.reshape(-1))
    raise ValueError(
        f"Unknown metric {name!r}. Expected accuracy, precision, recall, auc, mse, mae, rmse, "
        "or pass {name: callable(labels, predictions) -> te.metrics op}."
    )


def _call_module(model: torch.nn.Module, features: Any) -> torch.Tensor:
    outputs: torch.Tensor
    if isinstance(features, torch.Tensor):
        outputs = model(features)
    elif isinstance(features, Mapping):
        outputs = model(next(iter(features.values()))) if len(features) == 1 else model(**features)
    else:
        raise TypeError(
            f"from_module feeds a tensor or a dict of tensors to the module; received {type(features).__name__}."
        )
    return outputs


def build_model_fn(
    loss: str | LossFn, metrics: Iterable[str] | Mapping[str, Callable[..., Any]] | None
) -> Callable[..., EstimatorSpec]:
    """A model_fn: outputs = module(features); loss(outputs, labels); named metrics on the outputs."""
    loss_fn, task = resolve_loss(loss)
    metrics = resolve_metrics(metrics)
    named: dict[str, Callable[..., Any] | None]  # a metric's callable, or None for a metric named in words
    if isinstance(metrics, Mapping):
        named = dict(metrics)
    else:
        named = dict.fromkeys(metrics or ())
        for name in named:  # refuse a metric that cannot work before any training runs
            if task == "custom" and name not in ("mse", "mae", "rmse"):
                raise ValueError(
                    f"metric {name!r} needs a known loss name to know the task; pass metrics as a dict "
                    "{name: callable(labels, predictions)} for a custom loss."
                )

    def model_fn(model: torch.nn.Module, features: Any, labels: Any, mode: str) -> EstimatorSpec:
        outputs = _call_module(model, features)
        predictions = _predictions(outputs, task)
        if mode == ModeKeys.PREDICT:
            return EstimatorSpec(mode, predictions=predictions)
        ops = {
            name: (custom(labels, predictions) if custom else _metric_op(name, labels, predictions, task))
            for name, custom in named.items()
        }
        return EstimatorSpec(mode, predictions=predictions, loss=loss_fn(outputs, labels), eval_metric_ops=ops)

    return model_fn
