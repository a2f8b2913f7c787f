"""Early-stopping rules that read evaluation results directly.

What belongs here: the rules (TensorFlow's ``stop_if_*_hook`` family and a
patience/min_delta form) and nothing else. ``train_and_evaluate`` feeds each
rule every evaluation of its first EvalSpec as ``observe(global_step,
results)`` and then asks ``should_stop()``; the rule never scrapes event files
and never touches the model. Every replica feeds its rule the same synced
results, so every replica reaches the same decision at the same step. With
an evaluator task the evaluator asks the rules and sends the decision to the
trainers as a stop signal (evaluator.py), which also stops the evaluator once
the trainers' final checkpoint is evaluated (TensorFlow's evaluator kept
waiting).

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

What counts as an improvement (strictly better, by more than ``min_delta``;
NaN never better) is ``improvement.Objective``'s rule, the same one the best
checkpoint and ``BestExporter`` use.
"""

from __future__ import annotations

import abc
import inspect
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torchestimator._policy.improvement import BestSoFar, Objective, metric_value

logger = logging.getLogger(__name__)

__all__ = [
    "EarlyStopping",
    "EarlyStoppingRule",
    "NoImprovementRule",
    "ThresholdRule",
    "as_rules",
    "metric_value",
    "stop_if_higher_hook",
    "stop_if_lower_hook",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
]


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

    def __init__(
        self,
        metric_name: str,
        *,
        min_steps: int = 0,
        run_every_steps: int | None = None,
        run_every_secs: float | None = None,
    ) -> None:
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
            raise ValueError(
                f"run_every_secs must be a positive number of seconds or None; received {run_every_secs!r}."
            )
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
        if (
            self.run_every_steps is not None
            and self._last_checked is not None
            and latest - self._last_checked < self.run_every_steps
        ):
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

    def __init__(
        self,
        metric_name: str,
        threshold: float,
        *,
        higher: bool,
        min_steps: int = 0,
        run_every_steps: int | None = None,
        run_every_secs: float | None = None,
    ) -> None:
        super().__init__(
            metric_name, min_steps=min_steps, run_every_steps=run_every_steps, run_every_secs=run_every_secs
        )
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold):
            raise ValueError(f"threshold must be a number; received {threshold!r}.")
        self.threshold = float(threshold)
        self.higher = higher
        self.objective = Objective(metric_name=metric_name, higher_is_better=higher)

    def _decide(self, history: list[tuple[int, float]]) -> bool:
        return any(self.objective.is_better(value, than=self.threshold) for _, value in history)

    def __repr__(self) -> str:
        return f"stop_if_{'higher' if self.higher else 'lower'}({self.metric_name!r}, {self.threshold})"


class NoImprovementRule(EarlyStoppingRule):
    """Stops when the metric has not improved for ``max_steps_without_improvement`` global steps.

    As TensorFlow: scanning evaluations in step order (those before min_steps
    ignored), a strictly greater (or smaller) value is an improvement; stop when
    ``step - best_step >= max_steps_without_improvement``.
    """

    def __init__(
        self,
        metric_name: str,
        max_steps_without_improvement: int,
        *,
        increase: bool,
        min_steps: int = 0,
        run_every_steps: int | None = None,
        run_every_secs: float | None = None,
    ) -> None:
        super().__init__(
            metric_name, min_steps=min_steps, run_every_steps=run_every_steps, run_every_secs=run_every_secs
        )
        _check_int(f"max_steps_without_{'increase' if increase else 'decrease'}", max_steps_without_improvement, 1)
        self.max_steps_without_improvement = max_steps_without_improvement
        self.increase = increase
        self.objective = Objective(metric_name=metric_name, higher_is_better=increase)

    def _decide(self, history: list[tuple[int, float]]) -> bool:
        best, best_step = BestSoFar(objective=self.objective), 0
        for step, value in history:
            if best.offer(step, value):  # always for the first
                best_step = step
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

    def __init__(
        self, metric_name: str, mode: str = "min", patience: int = 1, min_delta: float = 0.0, *, min_steps: int = 0
    ) -> None:
        super().__init__(metric_name, min_steps=min_steps)
        self.objective = Objective.from_mode(metric_name, mode, min_delta)
        _check_int("patience", patience, 1)
        self.mode = mode
        self.patience = patience
        self.min_delta = self.objective.min_delta

    def _decide(self, history: list[tuple[int, float]]) -> bool:
        best, waited = BestSoFar(objective=self.objective), 0
        for step, value in history:
            waited = 0 if best.offer(step, value) else waited + 1
        return waited >= self.patience

    def __repr__(self) -> str:
        return f"EarlyStopping({self.metric_name!r}, mode={self.mode!r}, patience={self.patience}, min_delta={self.min_delta})"


def as_rules(early_stopping: Any) -> list[Any]:
    """One rule or an iterable of them, as a list; TypeError for anything that is not a rule."""
    rules = [early_stopping] if isinstance(early_stopping, EarlyStoppingRule) else list(early_stopping or ())
    for rule in rules:
        if not (callable(getattr(rule, "observe", None)) and callable(getattr(rule, "should_stop", None))):
            raise TypeError(
                f"early_stopping takes rules made by te.stop_if_*_hook or te.EarlyStopping; received {rule!r}."
            )
    return rules


def _arguments(
    function: str, args: tuple[Any, ...], keywords: dict[str, Any], names: tuple[str, str]
) -> tuple[Any, Any]:
    """(metric_name, second) from TensorFlow's call forms: positional after an optional leading estimator,
    or by keyword (``metric_name=``, ``threshold=`` / ``max_steps_without_increase=`` ...)."""
    if args and not isinstance(args[0], str):
        args = args[1:]  # tf.estimator passed the estimator first; the results come to the rule directly
    if len(args) > 2:
        raise TypeError(
            f"{function} takes ([estimator,] {names[0]}, {names[1]}); received {len(args)} positional arguments."
        )
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


_Rule = TypeVar("_Rule", bound=EarlyStoppingRule)
_OPTIONS = (("eval_dir", None), ("min_steps", 0), ("run_every_secs", None), ("run_every_steps", None))
_SUMMARIES = {
    "stop_if_higher_hook": "stop once the metric of an evaluation at step >= min_steps exceeds threshold.",
    "stop_if_lower_hook": "stop once the metric of an evaluation at step >= min_steps falls below threshold.",
    "stop_if_no_increase_hook": "stop when the metric has not increased for that many global steps.",
    "stop_if_no_decrease_hook": "stop when the metric has not decreased for that many global steps.",
}


def _tensorflow_form(function: str, second: str, rule: Callable[..., _Rule], **direction: bool) -> Callable[..., _Rule]:
    """TensorFlow's ``function([estimator,] metric_name, <second>, *, eval_dir=None, min_steps=0, run_every_secs=None,
    run_every_steps=None)``, building ``rule(metric_name, <second>, **direction, min_steps=..., ...)``.

    The four stop_if_*_hook functions differ only in their name, their second argument and the rule they
    build, so they are made here from one table rather than written out four times.
    """
    keyword = inspect.Parameter.KEYWORD_ONLY
    signature = inspect.Signature(
        [
            inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
            inspect.Parameter("metric_name", keyword, default=None),
            inspect.Parameter(second, keyword, default=None),
            *(inspect.Parameter(name, keyword, default=default) for name, default in _OPTIONS),
        ],
        return_annotation=rule,
    )

    def make_rule(*args: Any, **keywords: Any) -> _Rule:
        try:
            given = signature.bind(*args, **keywords).arguments
        except TypeError as error:  # an unknown keyword: say whose
            raise TypeError(
                f"{function}: {error}; it takes ([estimator,] metric_name, {second}, *, "
                f"{', '.join(name for name, _ in _OPTIONS)})."
            ) from None
        name, value = _arguments(
            function,
            given.get("args", ()),
            {"metric_name": given.get("metric_name"), second: given.get(second)},
            ("metric_name", second),
        )
        options = {key: given.get(key, default) for key, default in _OPTIONS if key != "eval_dir"}  # eval_dir: unused
        return rule(name, value, **direction, **options)

    make_rule.__name__ = make_rule.__qualname__ = function
    make_rule.__signature__ = signature  # type: ignore[attr-defined]  # what help() and inspect show
    make_rule.__doc__ = (
        f"``{function}([estimator,] metric_name, {second}, *, min_steps=0, ...)``: "
        f"{_SUMMARIES[function]} ``estimator`` and ``eval_dir`` are accepted for TensorFlow's call form and ignored."
    )
    return make_rule


stop_if_higher_hook = _tensorflow_form("stop_if_higher_hook", "threshold", ThresholdRule, higher=True)
stop_if_lower_hook = _tensorflow_form("stop_if_lower_hook", "threshold", ThresholdRule, higher=False)
stop_if_no_increase_hook = _tensorflow_form(
    "stop_if_no_increase_hook", "max_steps_without_increase", NoImprovementRule, increase=True
)
stop_if_no_decrease_hook = _tensorflow_form(
    "stop_if_no_decrease_hook", "max_steps_without_decrease", NoImprovementRule, increase=False
)
