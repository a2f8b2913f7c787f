"""What earlier work left in model_dir that the policy reads back: evaluation results and the newest step.

What belongs here: reading the primary eval dir's scalars into (step, results) pairs and handing them to
early-stopping rules (TensorFlow's rules re-read the eval dir after a restart; ours are fed results, and
this is the one place that feeds them the old ones), and the newest checkpoint's step. What does not: the
rules (early_stopping.py) and writing anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchestimator._io.summary import read_scalars

__all__ = ["eval_history", "latest_step", "seed_rules"]


def eval_history(eval_dir: str, *, up_to: int) -> list[tuple[int, dict[str, float]]]:
    """Evaluations written to ``eval_dir`` at steps <= up_to, as (step, {metric: value}) in step order."""
    by_step: dict[int, dict[str, float]] = {}
    for tag, points in read_scalars(eval_dir).items():
        for step, value in points:
            if step <= up_to:
                by_step.setdefault(step, {})[tag] = value
    return sorted(by_step.items())


def seed_rules(rules: Iterable[Any], history: Iterable[tuple[int, dict[str, float]]]) -> None:
    """Gives each rule that takes a history (``seed``) the evaluations of earlier runs, oldest first."""
    rules = [rule for rule in rules if hasattr(rule, "seed")]
    for step, results in history:
        for rule in rules:
            rule.seed(step, results)


def latest_step(store: Any) -> int:
    """The global step of the newest complete checkpoint in ``store`` (a CheckpointStore); 0 without one."""
    history = store.history()
    return history[-1]["step"] if history else 0
