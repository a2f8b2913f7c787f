"""One answer to "is this evaluation better than the best so far?", shared by every policy that asks it.

What belongs here: reading a metric out of evaluation results (a missing one
is a ValueError listing the names the evaluation produced), and the comparison
itself: which metric, which direction, by how much (``min_delta``). The rules
are stated once:

- a value is better only when it beats the best by more than ``min_delta``
  (strictly, so a tie keeps the earlier step);
- NaN is never better than anything, and any number is better than a NaN best;
- the first value seen is the best so far, whatever it is.

What does not: what to do about an improvement. Best-checkpoint keeping
(best.py), ``BestExporter`` (export/exporters.py) and early stopping
(early_stopping.py) each act on the answer in their own way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["BestSoFar", "Objective", "metric_value"]

_ADVICE = "Use one of these names, or add the metric to the model_fn's eval_metric_ops."


def read_metric(
    results: Mapping[str, Any], metric_name: str, *, role: str, source: str, advice: str = _ADVICE
) -> float:
    """``results[metric_name]`` as a float.

    ``role`` says who asks ("Early stopping", "BestExporter") and ``source`` which results these are
    ("the evaluation results at global step 10"), so that the error names both.
    """
    if metric_name not in results:
        available = sorted(name for name in results if name != "global_step")
        raise ValueError(
            f"{role} metric {metric_name!r} is not in {source}; the evaluation produced {available}. {advice}"
        )
    value = results[metric_name]
    try:
        return float(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{role} metric {metric_name!r} must be a number; in {source} it is {value!r}.") from error


def metric_value(results: Mapping[str, Any], metric_name: str, global_step: int, role: str) -> float:
    """``results[metric_name]`` of the evaluation at ``global_step``; a ValueError naming the available metrics."""
    return read_metric(results, metric_name, role=role, source=f"the evaluation results at global step {global_step}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Objective:
    """Which metric to compare, in which direction, and how much of a change counts."""

    metric_name: str
    """A key of the evaluation results (``loss``, ``accuracy``, ...)."""
    higher_is_better: bool
    """True for accuracy-like metrics, False for losses."""
    min_delta: float = 0.0
    """A value must beat the best by more than this to count as better (0: any strict improvement)."""

    def __post_init__(self) -> None:
        if not isinstance(self.metric_name, str) or not self.metric_name:
            raise ValueError(f"metric_name must be a non-empty string such as 'loss'; received {self.metric_name!r}.")
        if not isinstance(self.higher_is_better, bool):
            raise TypeError(f"higher_is_better must be True or False; received {self.higher_is_better!r}.")
        delta = self.min_delta
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not delta >= 0:
            raise ValueError(f"min_delta must be a number >= 0; received {delta!r}.")
        object.__setattr__(self, "min_delta", float(delta))

    @classmethod
    def from_mode(cls, metric_name: str, mode: str, min_delta: float = 0.0) -> Objective:
        """Keras's spelling: ``mode="min"`` (lower is better) or ``mode="max"`` (higher is better)."""
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' (lower is better) or 'max' (higher is better); received {mode!r}.")
        return cls(metric_name=metric_name, higher_is_better=mode == "max", min_delta=min_delta)

    def value(self, results: Mapping[str, Any], *, role: str, source: str, advice: str = _ADVICE) -> float:
        """This objective's metric in ``results``; see ``read_metric``."""
        return read_metric(results, self.metric_name, role=role, source=source, advice=advice)

    def is_better(self, value: float, than: float | None) -> bool:
        """Whether ``value`` beats ``than`` (the best so far, or a threshold; None: nothing yet)."""
        if math.isnan(value):
            return False
        if than is None or math.isnan(than):
            return True
        if self.higher_is_better:
            return value > than + self.min_delta
        return value < than - self.min_delta

    def rank(self, value: float, step: int) -> tuple[bool, float, int]:
        """Sort key, best first: NaN last, then by value in this objective's direction, then the earlier step."""
        return (math.isnan(value), -value if self.higher_is_better else value, step)


@dataclasses.dataclass(kw_only=True)
class BestSoFar:
    """The best (step, value) offered so far under an ``Objective``."""

    objective: Objective
    step: int | None = None
    value: float | None = None

    def offer(self, step: int, value: float) -> bool:
        """Records ``value`` of ``step`` if it is the first or better than the best; True if it became the best."""
        if self.step is not None and not self.objective.is_better(value, self.value):
            return False
        self.step, self.value = step, value
        return True
