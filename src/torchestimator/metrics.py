"""Streaming metrics for ``eval_metric_ops``, correct across batches and processes.

What belongs here: the metric functions a ``model_fn`` calls on every batch
(``accuracy``, ``auc``, ...), the light :class:`MetricOp` record they return,
and :class:`MetricAccumulators`, which the eval loop uses to accumulate those
records over one whole evaluation and to compute the final values. What does
not: the eval loop itself, the ``loss`` metric policy, summaries.

As with ``tf.metrics``, a metric is aggregated over the whole evaluation, never
as a mean of per-batch means: every metric is a ``torchmetrics.Metric`` whose
state is summed (or concatenated) over batches, and torchmetrics synchronises
that state across processes in ``compute()`` when ``torch.distributed`` is
initialized. Weighted averages (``mean``, ``accuracy``, ``precision``,
``recall`` and the error metrics) are ``torchmetrics.MeanMetric`` fed with the
right per-element values and weights, which is exactly how ``tf.metrics``
defines them; they accumulate in float64 (float32 on MPS) and return 0 when no
weight was seen, like TensorFlow's ``div_no_nan``. A NaN input makes the
result NaN, as in TensorFlow, instead of being silently dropped.

``auc`` uses torchmetrics' binary AUROC (``curve="ROC"``) or binary average
precision (``curve="PR"``):

- ``num_thresholds=200`` (the default, like ``tf.metrics.auc``) bins the scores
  at ``num_thresholds`` evenly spaced thresholds in [0, 1] (torchmetrics'
  ``thresholds=int``): constant memory and a small fixed-size all-reduce,
  an approximation of the exact value just like TensorFlow's. TensorFlow puts
  its thresholds at ``[-eps, 1/(n-1), ..., (n-2)/(n-1), 1+eps]``; the ROC value
  agrees with TensorFlow's trapezoidal estimate to within the binning error
  (about 1/num_thresholds), not bit for bit.
- ``num_thresholds=None`` keeps every score and computes the exact value (what
  ``sklearn.metrics.roc_auc_score`` / ``average_precision_score`` give); memory
  grows with the evaluation set and all scores are gathered across processes.
- ``curve="PR"`` is average precision (a step-wise sum), the standard estimate
  of the area under the precision-recall curve; TensorFlow's default
  trapezoidal PR area interpolates linearly between points and is known to be
  optimistic, so the two differ slightly.
"""

from __future__ import annotations

import functools
import logging
import numbers
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torchmetrics import Metric

__all__ = [
    "MetricAccumulators",
    "MetricOp",
    "accuracy",
    "auc",
    "from_torchmetrics",
    "mean",
    "mean_absolute_error",
    "mean_squared_error",
    "precision",
    "recall",
    "root_mean_squared_error",
]

logger = logging.getLogger(__name__)

_AUC_CURVES = ("ROC", "PR")


@dataclass(frozen=True, kw_only=True)
class MetricOp:
    """One batch's contribution to a metric, as returned by the metric functions.

    ``model_fn`` puts these in ``EstimatorSpec.eval_metric_ops``; the eval loop
    hands them to :meth:`MetricAccumulators.update`, which builds the metric
    with ``factory`` the first time a name is seen and then calls its
    ``update(*args, **kwargs)`` for every batch.
    """

    kind: str
    """What the metric is, with its settings (e.g. ``"auc(curve='ROC', num_thresholds=200)"``).

    A metric name must keep the same kind for the whole evaluation."""
    factory: Callable[[], Metric]
    """Builds a fresh ``torchmetrics.Metric``; called once per name and evaluation."""
    args: tuple[Any, ...] = ()
    """Positional arguments for this batch's ``update`` call."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for this batch's ``update`` call."""


# --- the torchmetrics metrics behind the functions -------------------------
# They live in _torchmetrics.py: importing torchmetrics takes seconds (scipy, matplotlib), and
# model_fn calls the functions below on every batch, in training too, where no metric is built.


def _factory(class_name: str, **settings: Any) -> Callable[[], Metric]:
    """Builds ``_torchmetrics.<class_name>(**settings)``, importing torchmetrics only when called (the eval loop)."""

    def build() -> Metric:
        from torchestimator import _torchmetrics

        return getattr(_torchmetrics, class_name)(**settings)

    build.__qualname__ = f"{class_name}({', '.join(f'{key}={value!r}' for key, value in settings.items())})"
    return build


_new_mean = _factory("Mean")
_new_accuracy = _factory("Accuracy")
_new_precision = _factory("Precision")
_new_recall = _factory("Recall")
_new_squared_error = _factory("SquaredError")
_new_root_squared_error = _factory("SquaredError", root=True)
_new_absolute_error = _factory("AbsoluteError")


# --- input checks ----------------------------------------------------------


def _to_tensor(value: Any, metric: str, argument: str) -> torch.Tensor:
    """Returns ``value`` as a detached tensor, or raises naming the metric and argument."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    expected = f"{metric}: `{argument}` must be a tensor or an array-like of numbers"
    if value is None or isinstance(value, (str, bytes, Mapping)):
        raise ValueError(f"{expected}; received {type(value).__name__}.")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{expected}; received {type(value).__name__} that numpy cannot convert ({error}).") from error
    if array.dtype.kind not in "biuf":
        raise ValueError(f"{expected}; received {type(value).__name__} of numpy dtype {array.dtype}.")
    return torch.as_tensor(array)


def _paired(metric: str, labels: Any, predictions: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Converts labels and predictions and flattens them; their element counts must match."""
    labels_tensor = _to_tensor(labels, metric, "labels")
    predictions_tensor = _to_tensor(predictions, metric, "predictions")
    if labels_tensor.numel() != predictions_tensor.numel():
        raise ValueError(
            f"{metric}: `labels` and `predictions` must have the same number of elements; received labels of shape "
            f"{tuple(labels_tensor.shape)} and predictions of shape {tuple(predictions_tensor.shape)}. "
            "Pass one value per example (e.g. predictions.argmax(-1) for class ids)."
        )
    return labels_tensor.reshape(-1), predictions_tensor.reshape(-1)


def _weights(metric: str, weights: Any, shape: torch.Size) -> torch.Tensor | None:
    """Converts ``weights`` and broadcasts them to ``shape`` (a view: works on any device)."""
    if weights is None:
        return None
    weights_tensor = _to_tensor(weights, metric, "weights")
    try:
        return torch.broadcast_to(weights_tensor, shape)
    except RuntimeError as error:
        raise ValueError(
            f"{metric}: `weights` of shape {tuple(weights_tensor.shape)} cannot be broadcast to the values' "
            f"shape {tuple(shape)}; pass one weight per example or a scalar."
        ) from error


def _labelled_op(kind: str, factory: Callable[[], Metric], labels: Any, predictions: Any, weights: Any) -> MetricOp:
    labels_tensor, predictions_tensor = _paired(kind, labels, predictions)
    weights_tensor = _weights(kind, weights, predictions_tensor.shape)
    return MetricOp(kind=kind, factory=factory, args=(labels_tensor, predictions_tensor, weights_tensor))


# --- the metric functions --------------------------------------------------


def mean(values: Any, weights: Any = None) -> MetricOp:
    """The (weighted) mean of all ``values`` seen in the evaluation, like ``tf.metrics.mean``."""
    values_tensor = _to_tensor(values, "mean", "values")
    return MetricOp(
        kind="mean", factory=_new_mean, args=(values_tensor, _weights("mean", weights, values_tensor.shape))
    )


def accuracy(labels: Any, predictions: Any, weights: Any = None) -> MetricOp:
    """The (weighted) fraction of examples where ``predictions == labels``, like ``tf.metrics.accuracy``.

    ``predictions`` are class ids (or booleans), not scores: pass ``logits.argmax(-1)``.
    """
    return _labelled_op("accuracy", _new_accuracy, labels, predictions, weights)


def precision(labels: Any, predictions: Any, weights: Any = None) -> MetricOp:
    """Binary precision TP / (TP + FP), with labels and predictions cast to bool, like ``tf.metrics.precision``.

    Is 0 when nothing was predicted positive.
    """
    return _labelled_op("precision", _new_precision, labels, predictions, weights)


def recall(labels: Any, predictions: Any, weights: Any = None) -> MetricOp:
    """Binary recall TP / (TP + FN), with labels and predictions cast to bool, like ``tf.metrics.recall``.

    Is 0 when no label was positive.
    """
    return _labelled_op("recall", _new_recall, labels, predictions, weights)


def mean_squared_error(labels: Any, predictions: Any, weights: Any = None) -> MetricOp:
    """The (weighted) mean of ``(predictions - labels) ** 2`` over all elements."""
    return _labelled_op("mean_squared_error", _new_squared_error, labels, predictions, weights)


def root_mean_squared_error(labels: Any, predictions: Any, weights: Any = None) -> MetricOp:
    """The square root of the whole evaluation's mean squared error (not a mean of per-batch roots)."""
    return _labelled_op("root_mean_squared_error", _new_root_squared_error, labels, predictions, weights)


def mean_absolute_error(labels: Any, predictions: Any, weights: Any = None) -> MetricOp:
    """The (weighted) mean of ``|predictions - labels|`` over all elements."""
    return _labelled_op("mean_absolute_error", _new_absolute_error, labels, predictions, weights)


def auc(
    labels: Any,
    predictions: Any,
    weights: Any = None,
    curve: str = "ROC",
    num_thresholds: int | None = 200,
) -> MetricOp:
    """Binary area under the ROC curve (``curve="ROC"``) or average precision (``curve="PR"``).

    ``labels`` are cast to bool; ``predictions`` are scores in [0, 1] (apply
    ``sigmoid`` to logits first). ``num_thresholds`` bins the scores like
    ``tf.metrics.auc``; ``None`` computes the exact value (see the module
    docstring). Sample weights are not supported by torchmetrics' AUROC and
    are refused rather than ignored.
    """
    kind = f"auc(curve={curve!r}, num_thresholds={num_thresholds!r})"
    if curve not in _AUC_CURVES:
        raise ValueError(f"auc: `curve` must be one of {_AUC_CURVES}; received {curve!r}.")
    if num_thresholds is not None and (
        isinstance(num_thresholds, bool) or not isinstance(num_thresholds, int) or num_thresholds < 2
    ):
        raise ValueError(
            f"auc: `num_thresholds` must be an integer >= 2, or None for the exact value; received {num_thresholds!r}."
        )
    if weights is not None:
        raise ValueError(
            "auc: `weights` are not supported (torchmetrics' binary AUROC and average precision take no sample "
            "weights); received weights. Drop them, or filter the examples with weight 0 out of labels and predictions."
        )
    labels_tensor, predictions_tensor = _paired(kind, labels, predictions)
    if not predictions_tensor.is_floating_point():
        predictions_tensor = predictions_tensor.float()
    # torchmetrics applies a sigmoid to any batch whose scores leave [0, 1], so logits
    # would be transformed in some batches and not in others: refuse them instead.
    if predictions_tensor.numel() and bool((predictions_tensor.min() < 0) | (predictions_tensor.max() > 1)):
        raise ValueError(
            f"{kind}: `predictions` must be scores in [0, 1]; received values from {predictions_tensor.min().item()} "
            f"to {predictions_tensor.max().item()}. Pass probabilities, e.g. torch.sigmoid(logits)."
        )

    def factory() -> Metric:
        from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision

        metric_class = BinaryAUROC if curve == "ROC" else BinaryAveragePrecision
        return metric_class(thresholds=num_thresholds, validate_args=False)

    return MetricOp(kind=kind, factory=factory, args=(predictions_tensor, labels_tensor.bool().long()))


def from_torchmetrics(factory: Callable[[], Metric], *update_args: Any, **update_kwargs: Any) -> MetricOp:
    """Any torchmetrics metric, built by ``factory()`` once per evaluation and updated with the given arguments.

    Each batch calls ``metric.update(*update_args, **update_kwargs)``. Example:
    ``from_torchmetrics(lambda: MulticlassF1Score(num_classes=10), logits, labels)``.
    The metric's kind is the factory's qualified name, so use the same factory
    for a name throughout the evaluation. Tensors are detached and moved to the
    accumulators' device; NumPy arrays become tensors.
    """
    from torchmetrics import Metric  # the caller's factory makes torchmetrics metrics: already imported

    if not callable(factory) or isinstance(factory, Metric):
        raise TypeError(
            "from_torchmetrics: `factory` must be a zero-argument callable returning a torchmetrics.Metric "
            f"(e.g. lambda: BinaryF1Score()); received {type(factory).__name__}. "
            "A fresh metric is built for each evaluation."
        )
    kind = f"from_torchmetrics({_describe(factory)})"
    return MetricOp(
        kind=kind, factory=factory, args=tuple(_detached(update_args)), kwargs=dict(_detached(update_kwargs))
    )


def _detached(arguments: Any) -> Any:
    """Detaches the tensors in ``arguments`` and turns its NumPy arrays into tensors."""
    from torchmetrics.utilities.data import apply_to_collection

    detached = apply_to_collection(arguments, torch.Tensor, torch.Tensor.detach)
    return apply_to_collection(detached, np.ndarray, torch.as_tensor)


def _describe(factory: Callable[..., Any]) -> str:
    """A stable description of a factory across batches: its qualified name, with a partial's arguments."""
    if isinstance(factory, functools.partial):
        arguments = [repr(argument) for argument in factory.args]
        arguments += [f"{key}={value!r}" for key, value in factory.keywords.items()]
        return f"{_describe(factory.func)}({', '.join(arguments)})"
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    return f"{getattr(factory, '__module__', None)}.{name}"


# --- accumulation over one evaluation -------------------------------------


def _to_python(value: Any) -> Any:
    """Turns a computed value into floats (scalars), nested lists, or dicts of those."""
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.ndim == 0 else value.tolist()
    if isinstance(value, Mapping):
        return {key: _to_python(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_python(item) for item in value]
    if isinstance(value, numbers.Real):
        return float(value)
    return value


class MetricAccumulators:
    """The metrics of one evaluation, keyed by their ``eval_metric_ops`` name.

    Create a fresh one for each evaluation, call :meth:`update` with every
    batch's ``eval_metric_ops`` and :meth:`compute` once at the end. Every
    process must call :meth:`compute` (it synchronises), after having seen the
    same metric names: a mismatch is detected and raised on all processes
    rather than left to deadlock.
    """

    def __init__(self, device: torch.device | str = "cpu", *, process_group: Any = None) -> None:
        self.device = torch.device(device)
        self._process_group = process_group
        self._metrics: dict[str, Metric] = {}
        self._kinds: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._metrics)

    def __contains__(self, name: object) -> bool:
        return name in self._metrics

    def update(self, eval_metric_ops: Mapping[str, MetricOp] | None) -> None:
        """Adds one batch: builds each metric on first sight, then updates it with this batch's arguments."""
        if eval_metric_ops is None:
            return
        if not isinstance(eval_metric_ops, Mapping):
            raise TypeError(
                "eval_metric_ops must be a dict of name -> MetricOp (e.g. {'accuracy': te.metrics.accuracy(labels, "
                f"predictions)}}); received {type(eval_metric_ops).__name__}."
            )
        from torchmetrics.utilities.data import apply_to_collection  # imported by _metric_for's first metric

        for name, op in eval_metric_ops.items():
            metric = self._metric_for(name, op)
            args = apply_to_collection(op.args, torch.Tensor, self._to_device)
            kwargs = apply_to_collection(dict(op.kwargs), torch.Tensor, self._to_device)
            try:
                metric.update(*args, **kwargs)
            except torch.OutOfMemoryError:
                raise
            except (ValueError, RuntimeError) as error:
                # torchmetrics reports bad inputs as either; keep the kind of error, add which metric.
                message = f"eval_metric_ops[{name!r}] ({op.kind}) could not be updated with this batch: {error}"
                raise (ValueError if isinstance(error, ValueError) else RuntimeError)(message) from error

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        # Blocking on purpose: a non-blocking copy to the CPU may be read before it lands.
        return tensor.to(self.device)

    def _metric_for(self, name: Any, op: Any) -> Metric:
        """Returns the metric for ``name``, building it the first time; refuses a change of kind."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"eval_metric_ops keys must be non-empty strings; received {name!r}.")
        if not isinstance(op, MetricOp):
            raise TypeError(
                f"eval_metric_ops[{name!r}] must be a MetricOp from torchestimator.metrics (e.g. "
                f"te.metrics.accuracy(labels, predictions)); received {type(op).__name__}. tf.metrics-style "
                "(value, update_op) pairs are not used; wrap a torchmetrics metric with "
                "te.metrics.from_torchmetrics(factory, *update_args)."
            )
        known_kind = self._kinds.get(name)
        if known_kind is not None:
            if known_kind != op.kind:
                raise ValueError(
                    f"eval_metric_ops[{name!r}] changed kind during the evaluation: it was {known_kind} and is now "
                    f"{op.kind}. A metric name must keep the same metric and settings for every batch."
                )
            return self._metrics[name]
        metric = op.factory()
        from torchmetrics import Metric  # imported by the factory (see _factory)

        if not isinstance(metric, Metric):
            raise TypeError(
                f"eval_metric_ops[{name!r}]: the factory of {op.kind} must return a torchmetrics.Metric; "
                f"received {type(metric).__name__}."
            )
        if self._process_group is not None:
            metric.process_group = self._process_group
        if metric.dist_sync_fn is None:
            from torchestimator.distribute import collectives  # with the strategies, imported when one is used

            # torchmetrics' own gather hands gloo tensors whose release by gloo's worker may take the GIL as the
            # program ends, which aborts it (distribute/collectives.py).
            metric.dist_sync_fn = collectives.gather_all_tensors
        self._metrics[name] = self._place(metric)
        self._kinds[name] = op.kind
        logger.debug("Metric %r is %s on %s.", name, op.kind, self.device)
        return metric

    def _place(self, metric: Metric) -> Metric:
        """Moves ``metric`` to the device, keeping the dtype it was built with (float32 on MPS)."""
        dtype = torch.float32 if self.device.type == "mps" and metric.dtype == torch.float64 else metric.dtype
        # torchmetrics' Metric.to() resets the dtype used to cast inputs to the default
        # float32 while the states keep theirs, so float64 accumulation would be lost.
        metric = metric.to(self.device)
        if metric.dtype != dtype:
            metric.set_dtype(dtype)
        return metric

    def compute(self) -> dict[str, Any]:
        """The value of every metric over all batches (and all processes): floats for scalar metrics.

        Non-scalar results become (nested) lists, dict results dicts of those.
        """
        self._check_same_metrics_across_processes()
        # Sorted, so that every process runs the metrics' collectives in the same order.
        return {name: _to_python(self._metrics[name].compute()) for name in sorted(self._metrics)}

    def _check_same_metrics_across_processes(self) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            return
        signature = ";".join(f"{name}={self._kinds[name]}" for name in sorted(self._kinds))
        checksum = zlib.crc32(signature.encode("utf-8"))
        # One all-reduce of [x, -x] with MAX gives the maximum and minus the minimum:
        # all processes agree exactly when they are equal.
        extremes = torch.tensor([checksum, -checksum], dtype=torch.int64, device=self.device)
        from torchestimator.distribute import collectives

        collectives.all_reduce(extremes, dist.ReduceOp.MAX, group=self._process_group)
        if extremes[0].item() != -extremes[1].item():
            raise ValueError(
                "The processes of this evaluation saw different eval_metric_ops; this process saw "
                f"{sorted(self._kinds) or 'none'}. Every process must evaluate at least one batch and "
                "return the same metric names and kinds."
            )
