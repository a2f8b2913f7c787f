"""Early-stopping rules that read evaluation results directly.

What belongs here: the rules (TensorFlow's ``stop_if_*_hook`` family and a
patience/min_delta form) and nothing else. ``train_and_evaluate`` feeds each
rule every evaluation of its first EvalSpec as ``observe(global_step,
results)`` and then asks ``should_stop()``; the rule never scrapes event files
and never touches the model. Every replica feeds its rule the same synced
results, so every replica reaches the same decision at the same step.

Differences from ``tf.estimator.experimental``:

- The rules are checked right after each evaluation, the only moment new
  information arrives. ``run_every_steps`` still spaces checks out by global
  step; ``run_every_secs`` is accepted (and validated) for familiarity but
  unused, since a wall-clock trigger would let replicas disagree.
- TensorFlow's leading ``estimator`` argument and ``eval_dir`` are accepted and
  ignored: ``stop_if_higher_hook(estimator, "loss", 0.5)`` and
  ``stop_if_higher_hook("loss", 0.5)`` are the same rule.
- A metric the evaluation does not produce is a ValueError at the first
  evaluation, listing the names it does produce (TensorFlow raised KeyError).
"""

from __future__ import annotations

import abc
import logging
import math
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "EarlyStopping",
    "EarlyStoppingRule",
    "NoImprovementRule",
    "ThresholdRule",
    "metric_value",
    "stop_if_higher_hook",
    "stop_if_lower_hook",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
]


def metric_value(results: Mapping[str, Any], metric_name: str, global_step: int, role: str) -> float:
    """``results[metric_name]`` as a float; a ValueError naming the available metrics when absent."""
    if metric_name not in results:
        available = sorted(name for name in results if name != "global_step")
        raise ValueError(
            f"{role} metric {metric_name!r} is not in the evaluation results at global step {global_step}; "
            f"the evaluation produced {available}. Use one of these names, or add the metric to "
            "the model_fn's eval_metric_ops."
        )
    value = results[metric_name]
    try:
        return float(value)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{role} metric {metric_name!r} must be a number; at global step {global_step} it is {value!r}."
        ) from error


def _check_int(name: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{' or None' if optional else ''}; received {value!r}.")


class EarlyStoppingRule(abc.ABC):
    """Base class: fed ``observe(global_step, results)`` after each evaluation, asked ``should_stop()``.

    Subclasses implement ``_decide(history)`` over the ``(step, value)`` pairs
    seen so far, in step order. A step observed twice (an evaluation repeated
    after a restart) keeps its latest value.
    """

    role = "Early stopping"

    def __init__(self, metric_name: str, *, min_steps: int = 0, run_every_steps: int | None = None,
                 run_every_secs: float | None = None) -> None:
        if not isinstance(metric_name, str) or not metric_name:
            raise ValueError(f"metric_name must be a non-empty string such as 'loss'; received {metric_name!r}.")
        _check_int("min_steps", min_steps, 0)
        _check_int("run_every_steps", run_every_steps, 1, optional=True)
        if run_every_secs is not None and run_every_steps is not None:
            raise ValueError(
                "Only one of run_every_secs and run_every_steps can be set; received "
                f"run_every_secs={run_every_secs!r}, run_every_steps={run_every_steps!r}."
            )
        if run_every_secs is not None and not (isinstance(run_every_secs, (int, float)) and run_every_secs > 0):
            raise ValueError(f"run_every_secs must be a positive number of seconds or None; received {run_every_secs!r}.")
        self.metric_name = metric_name
        self.min_steps = min_steps
        self.run_every_steps = run_every_steps
        self.run_every_secs = run_every_secs
        self._history: dict[int, float] = {}
        self._last_checked: int | None = None
        self._stop = False

    def observe(self, global_step: int, results: Mapping[str, Any]) -> None:
        """Records one evaluation; ValueError if it lacks the metric."""
        self._history[int(global_step)] = metric_value(results, self.metric_name, global_step, self.role)

    def seed(self, global_step: int, results: Mapping[str, Any]) -> None:
        """Records an evaluation of an earlier run (read back after a restart); one lacking the metric is skipped."""
        if self.metric_name in results:
            self._history[int(global_step)] = float(results[self.metric_name])

    def should_stop(self) -> bool:
        """Whether the evaluations seen so far say training should stop (once True, stays True)."""
        if self._stop or not self._history:
            return self._stop
        latest = max(self._history)
        if self.run_every_steps is not None and self._last_checked is not None:
            if latest - self._last_checked < self.run_every_steps:
                return False
        self._last_checked = latest
        history = [(step, self._history[step]) for step in sorted(self._history) if step >= self.min_steps]
        self._stop = bool(history) and self._decide(history)
        if self._stop:
            logger.info("%s: %r says stop at global step %d.", self.role, self, latest)
        return self._stop

    @abc.abstractmethod
    def _decide(self, history: list[tuple[int, float]]) -> bool:
        """Whether to stop, given (step, value) pairs at or after min_steps, in step order."""


class ThresholdRule(EarlyStoppingRule):
    """Stops once an evaluation at step >= min_steps has the metric above (or below) a threshold."""

    def __init__(self, metric_name: str, threshold: float, *, higher: bool, min_steps: int = 0,
                 run_every_steps: int | None = None, run_every_secs: float | None = None) -> None:
        super().__init__(metric_name, min_steps=min_steps, run_every_steps=run_every_steps,
                         run_every_secs=run_every_secs)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold):
            raise ValueError(f"threshold must be a number; received {threshold!r}.")
        self.threshold = float(threshold)
        self.higher = higher

    def _decide(self, history: list[tuple[int, float]]) -> bool:
        if self.higher:
            return any(value > self.threshold for _, value in history)
        return any(value < self.threshold for _, value in history)

    def __repr__(self) -> str:
        return f"stop_if_{'higher' if self.higher else 'lower'}({self.metric_name!r}, {self.threshold})"


class NoImprovementRule(EarlyStoppingRule):
    """Stops when the metric has not improved for ``max_steps_without_improvement`` global steps.

    As TensorFlow: scanning evaluations in step order (those before min_steps
    ignored), a strictly greater (or smaller) value is an improvement; stop when
    ``step - best_step >= max_steps_without_improvement``.
    """

    def __init__(self, metric_name: str, max_steps_without_improvement: int, *, increase: bool, min_steps: int = 0,
                 run_every_steps: int | None = None, run_every_secs: float | None = None) -> None:
        super().__init__(metric_name, min_steps=min_steps, run_every_steps=run_every_steps,
                         run_every_secs=run_every_secs)
        _check_int(f"max_steps_without_{'increase' if increase else 'decrease'}", max_steps_without_improvement, 1)
        self.max_steps_without_improvement = max_steps_without_improvement
        self.increase = increase

    def _decide(self, history: list[tuple[int, float]]) -> bool:
        best_value, best_step = None, None
        for step, value in history:
            better = best_value is None or (value > best_value if self.increase else value < best_value)
            if better:
                best_value, best_step = value, step
            if step - best_step >= self.max_steps_without_improvement:
                return True
        return False

    def __repr__(self) -> str:
        kind = "increase" if self.increase else "decrease"
        return f"stop_if_no_{kind}({self.metric_name!r}, {self.max_steps_without_improvement})"


class EarlyStopping(EarlyStoppingRule):
    """Stops after ``patience`` evaluations in a row without an improvement of more than ``min_delta``.

    For those who think in evaluations rather than steps (Keras's EarlyStopping):
    with mode="min" an evaluation improves when ``value < best - min_delta``,
    with mode="max" when ``value > best + min_delta``. Evaluations before
    ``min_steps`` are ignored.
    """

    def __init__(self, metric_name: str, mode: str = "min", patience: int = 1, min_delta: float = 0.0, *,
                 min_steps: int = 0) -> None:
        super().__init__(metric_name, min_steps=min_steps)
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' (lower is better) or 'max' (higher is better); received {mode!r}.")
        _check_int("patience", patience, 1)
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not min_delta >= 0:
            raise ValueError(f"min_delta must be a number >= 0; received {min_delta!r}.")
        self.mode = mode
        self.patience = patience
        self.min_delta = float(min_delta)

    def _decide(self, history: list[tuple[int, float]]) -> bool:
        best, waited = None, 0
        for _, value in history:
            if best is None:
                best = value
                continue
            improved = value < best - self.min_delta if self.mode == "min" else value > best + self.min_delta
            if improved:
                best, waited = value, 0
            else:
                waited += 1
        return waited >= self.patience

    def __repr__(self) -> str:
        return f"EarlyStopping({self.metric_name!r}, mode={self.mode!r}, patience={self.patience}, min_delta={self.min_delta})"


def _arguments(function: str, args: tuple[Any, ...], keywords: dict[str, Any], names: tuple[str, str]) -> tuple[Any, Any]:
    """(metric_name, second) from TensorFlow's call forms: positional after an optional leading estimator,
    or by keyword (``metric_name=``, ``threshold=`` / ``max_steps_without_increase=`` ...)."""
    if args and not isinstance(args[0], str):
        args = args[1:]  # tf.estimator passed the estimator first; the results come to the rule directly
    if len(args) > 2:
        raise TypeError(f"{function} takes ([estimator,] {names[0]}, {names[1]}); received {len(args)} positional "
                        "arguments.")
    values = dict(zip(names, args))
    for name in names:
        if keywords.get(name) is not None:
            if name in values:
                raise TypeError(f"{function} got {name} both by position and by keyword.")
            values[name] = keywords[name]
    missing = [name for name in names if name not in values]
    if missing:
        raise TypeError(f"{function} needs {' and '.join(missing)}.")
    return values[names[0]], values[names[1]]


def stop_if_higher_hook(*args: Any, metric_name: str | None = None, threshold: float | None = None,
                        eval_dir: str | None = None, min_steps: int = 0, run_every_secs: float | None = None,
                        run_every_steps: int | None = None) -> ThresholdRule:
    """``stop_if_higher_hook([estimator,] metric_name, threshold, *, min_steps=0, ...)``: stop once the metric
    of an evaluation at step >= min_steps exceeds threshold. ``estimator`` and ``eval_dir`` are ignored."""
    name, value = _arguments("stop_if_higher_hook", args, {"metric_name": metric_name, "threshold": threshold},
                             ("metric_name", "threshold"))
    return ThresholdRule(name, value, higher=True, min_steps=min_steps,
                         run_every_steps=run_every_steps, run_every_secs=run_every_secs)


def stop_if_lower_hook(*args: Any, metric_name: str | None = None, threshold: float | None = None,
                       eval_dir: str | None = None, min_steps: int = 0, run_every_secs: float | None = None,
                       run_every_steps: int | None = None) -> ThresholdRule:
    """``stop_if_lower_hook([estimator,] metric_name, threshold, *, min_steps=0, ...)``: stop once the metric
    of an evaluation at step >= min_steps falls below threshold."""
    name, value = _arguments("stop_if_lower_hook", args, {"metric_name": metric_name, "threshold": threshold},
                             ("metric_name", "threshold"))
    return ThresholdRule(name, value, higher=False, min_steps=min_steps,
                         run_every_steps=run_every_steps, run_every_secs=run_every_secs)


def stop_if_no_increase_hook(*args: Any, metric_name: str | None = None, max_steps_without_increase: int | None = None,
                             eval_dir: str | None = None, min_steps: int = 0, run_every_secs: float | None = None,
                             run_every_steps: int | None = None) -> NoImprovementRule:
    """``stop_if_no_increase_hook([estimator,] metric_name, max_steps_without_increase, *, min_steps=0, ...)``:
    stop when the metric has not increased for that many global steps."""
    name, steps = _arguments("stop_if_no_increase_hook", args,
                             {"metric_name": metric_name, "max_steps_without_increase": max_steps_without_increase},
                             ("metric_name", "max_steps_without_increase"))
    return NoImprovementRule(name, steps, increase=True, min_steps=min_steps,
                             run_every_steps=run_every_steps, run_every_secs=run_every_secs)


def stop_if_no_decrease_hook(*args: Any, metric_name: str | None = None, max_steps_without_decrease: int | None = None,
                             eval_dir: str | None = None, min_steps: int = 0, run_every_secs: float | None = None,
                             run_every_steps: int | None = None) -> NoImprovementRule:
    """``stop_if_no_decrease_hook([estimator,] metric_name, max_steps_without_decrease, *, min_steps=0, ...)``:
    stop when the metric has not decreased for that many global steps."""
    name, steps = _arguments("stop_if_no_decrease_hook", args,
                             {"metric_name": metric_name, "max_steps_without_decrease": max_steps_without_decrease},
                             ("metric_name", "max_steps_without_decrease"))
    return NoImprovementRule(name, steps, increase=False, min_steps=min_steps,
                             run_every_steps=run_every_steps, run_every_secs=run_every_secs)
