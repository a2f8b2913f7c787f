"""The torchmetrics metrics behind ``torchestimator.metrics``' functions.

A module of its own so that torchmetrics (which imports scipy and matplotlib:
seconds) is imported only when an evaluation builds a metric
(``MetricAccumulators``), not when ``model_fn`` calls ``te.metrics.accuracy``
on every batch, nor at ``import torchestimator``. The semantics (float64
accumulation, 0 without weights, NaN propagation) are described in metrics.py.
"""

from __future__ import annotations

import torch
from torchmetrics.aggregation import MeanMetric

__all__ = ["AbsoluteError", "Accuracy", "Mean", "Precision", "Recall", "SquaredError"]


class Mean(MeanMetric):
    """A weighted mean in float64 that is 0 when no weight was seen.

    ``nan_strategy`` is a float (NaN) on purpose: with ``"disable"``
    torchmetrics 1.x silently ignores the weights, and ``"warn"``/``"ignore"``
    drop NaNs, hiding a diverged model; replacing NaN by NaN keeps both the
    weights and TensorFlow's NaN propagation.
    """

    def __init__(self, *, root: bool = False) -> None:
        super().__init__(nan_strategy=float("nan"))
        self._root = root
        self.set_dtype(torch.float64)

    def update(self, values: torch.Tensor, weights: torch.Tensor | None = None) -> None:  # type: ignore[override]
        super().update(values.to(self.dtype), None if weights is None else weights.to(self.dtype))

    def compute(self) -> torch.Tensor:
        if self.weight == 0:
            return torch.zeros((), dtype=self.dtype, device=self.device)
        value = self.mean_value / self.weight
        return value.sqrt() if self._root else value


class Accuracy(Mean):
    def update(self, labels, predictions, weights=None) -> None:  # type: ignore[override]
        super().update(labels == predictions, weights)


class Precision(Mean):
    """Weighted mean of the labels over the predicted positives: TP / (TP + FP)."""

    def update(self, labels, predictions, weights=None) -> None:  # type: ignore[override]
        # Zero weight for predicted negatives avoids boolean indexing, which would sync the device.
        selected = predictions.bool().to(self.dtype)
        super().update(labels.bool(), selected if weights is None else selected * weights.to(self.dtype))


class Recall(Mean):
    """Weighted mean of the predictions over the actual positives: TP / (TP + FN)."""

    def update(self, labels, predictions, weights=None) -> None:  # type: ignore[override]
        selected = labels.bool().to(self.dtype)
        super().update(predictions.bool(), selected if weights is None else selected * weights.to(self.dtype))


class SquaredError(Mean):
    def update(self, labels, predictions, weights=None) -> None:  # type: ignore[override]
        super().update((predictions.to(self.dtype) - labels.to(self.dtype)).square(), weights)


class AbsoluteError(Mean):
    def update(self, labels, predictions, weights=None) -> None:  # type: ignore[override]
        super().update((predictions.to(self.dtype) - labels.to(self.dtype)).abs(), weights)
