"""The one line each train / evaluate / train_and_evaluate call shows by default, and where it goes.

What belongs here: the summary records (what they say, how they are marked) and the stderr handler a process
that configured no logging gets. What does not: deciding what happened in a call (the Estimator and
train_and_evaluate build the ``TrainOutcome``), the progress bar (progress.py).

Python shows a library's INFO records only to a program that configures logging; one that configures nothing
gets WARNING and above, bare, from logging's last-resort handler. tf.estimator printed what each call did, and a
rerun that silently skips training (max_steps already reached) looks broken without it. So:

* each call logs ONE summary record: INFO on the ``torchestimator`` logger, marked with ``SUMMARY_ATTRIBUTE``
  ("trained runs/x from step 0 to 1000 in 12.3 s", "skipped training: runs/x is already at step 1000",
  "evaluated runs/x/ckpt-1000: accuracy = 0.97, loss = 0.08"); only the chief logs it;
* ``show_summaries()``, called at the start of train / evaluate / predict, attaches a ``ConsoleHandler`` to the
  ``torchestimator`` logger once, and only when the process has configured no logging (the root logger and
  ``torchestimator`` have no handlers). It prints the summary records and warnings, nothing else at INFO, and
  steps aside as soon as the program configures logging itself;
* a program that configured logging (``logging.basicConfig``, the CLI's ``--verbosity``) gets the summary
  records as ordinary INFO records, through its own handlers, once;
* quiet, the standard way (TF's ``tf.get_logger().setLevel``):
  ``logging.getLogger("torchestimator").setLevel(logging.WARNING)``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

LOGGER_NAME = "torchestimator"
SUMMARY_ATTRIBUTE = "torchestimator_summary"
"""Set (True) on the log records ``log_summary`` makes; ``ConsoleHandler`` passes those and warnings only."""

_attach_lock = threading.Lock()


class ConsoleHandler(logging.Handler):
    """stderr for a process that configured no logging: summary records and WARNING+, one line each.

    The stream is looked up at each record (``sys.stderr`` may be replaced later, e.g. prefixed with a replica's
    rank). Once the program configures logging itself, this handler prints nothing: its handlers do.
    """

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_ConsoleFormatter())

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and not getattr(record, SUMMARY_ATTRIBUTE, False):
            return False
        return _logging_unconfigured(logging.getLogger(LOGGER_NAME), besides=self) and super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging's rule: a failing handler reports and carries on
            self.handleError(record)


class _ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if not getattr(record, SUMMARY_ATTRIBUTE, False):
            text = f"{record.levelname}: {text}"
        if record.exc_info:
            text = f"{text}\n{self.formatException(record.exc_info)}"
        return f"{LOGGER_NAME}: {text}"


def _logging_unconfigured(logger: logging.Logger, besides: logging.Handler | None = None) -> bool:
    """No handler on the root logger, none on ``torchestimator`` other than ``besides``."""
    return not logging.getLogger().handlers and all(handler is besides for handler in logger.handlers)


def _console_handler(logger: logging.Logger) -> ConsoleHandler | None:
    return next((handler for handler in logger.handlers if isinstance(handler, ConsoleHandler)), None)


def show_summaries() -> None:
    """Attaches the ConsoleHandler to ``torchestimator`` if the process configured no logging (once)."""
    logger = logging.getLogger(LOGGER_NAME)
    with _attach_lock:
        if _logging_unconfigured(logger) and _console_handler(logger) is None:
            logger.addHandler(ConsoleHandler())


def log_summary(message: str) -> None:
    """Logs a call's summary line: an INFO record, shown by default where the process configured no logging.

    In such a process the root's WARNING level would drop an INFO record before any handler sees it; the record
    goes to the ConsoleHandler anyway, unless a level was set on ``torchestimator`` (the quiet setting).
    """
    logger = logging.getLogger(LOGGER_NAME)
    extra = {SUMMARY_ATTRIBUTE: True}
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s", message, extra=extra, stacklevel=2)
        return
    handler = _console_handler(logger)
    if (
        handler is None
        or logger.level != logging.NOTSET
        or logger.manager.disable >= logging.INFO
        or not _logging_unconfigured(logger, besides=handler)
    ):
        return
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, "%s", (message,), None, extra=extra)
    logger.handle(record)


# ----------------------------------------------------------------------------- what the lines say


@dataclasses.dataclass(frozen=True)
class TrainOutcome:
    """What one train call did, for its summary line."""

    model_dir: str
    start_step: int
    end_step: int
    seconds: float
    resumed_from: str | None = None
    """The checkpoint training resumed from; None for fresh (or warm-started, or in-process) weights."""
    last_step: int | None = None
    """The step the call was to train to (max_steps, or the start plus steps); None: until the input ends."""
    skipped: bool = False
    """max_steps was already reached: no step was taken."""
    ended_by: str | None = None
    """Why training stopped before its last step ("the input ended", "a stop was requested"), else None."""
    final_loss: float | None = None
    """The last step's loss (the mean over replicas where the loop read it so)."""
    input_ended_first: bool = False
    """The input ended before the call's first step: it was empty, or resumed at its end."""
    served: bool = False
    """This process was a parameter server: it held variables while the chief and workers trained."""


def describe_training(outcome: TrainOutcome) -> str:
    """E.g. "resumed runs/x from ckpt-400 and trained to step 1000 in 5.2 s (final loss 0.081)"."""
    if outcome.served:
        return f"served variables as a parameter server for {outcome.model_dir} until the chief ended training"
    if outcome.skipped:
        return (
            f"skipped training: {outcome.model_dir} is already at step {outcome.end_step} "
            f"(max_steps={outcome.last_step})"
        )
    if outcome.input_ended_first:
        return f"trained no step: {outcome.model_dir} stays at step {outcome.end_step}: {outcome.ended_by}"
    if outcome.ended_by is not None and outcome.end_step == outcome.start_step:  # over before step one
        return f"skipped training: {outcome.model_dir} stays at step {outcome.end_step}: {outcome.ended_by}"
    if outcome.resumed_from is not None:
        text = (
            f"resumed {outcome.model_dir} from {os.path.basename(outcome.resumed_from)} and trained to step "
            f"{outcome.end_step}"
        )
    else:
        text = f"trained {outcome.model_dir} from step {outcome.start_step} to {outcome.end_step}"
    text += f" in {outcome.seconds:.1f} s"
    if outcome.final_loss is not None:
        text += f" (final loss {format_value(outcome.final_loss)})"
    if outcome.ended_by is not None:
        text += f"; stopped at step {outcome.end_step}"
        if outcome.last_step is not None:
            text += f" of {outcome.last_step}"
        text += f": {outcome.ended_by}"
    return text


def describe_results(results: Mapping[str, Any]) -> str:
    """ "accuracy = 0.9722, loss = 0.08123": every result but global_step, in name order, 4 significant digits."""
    return ", ".join(
        f"{name} = {format_value(value)}" for name, value in sorted(results.items()) if name != "global_step"
    )


def format_value(value: Any) -> str:
    """A float with 4 significant digits, still reading as a float (1.0, not 1); anything else as str()."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and not isinstance(value, numbers.Integral):
        if not math.isfinite(value):
            return str(float(value))
        text = f"{float(value):.4g}"
        return text if any(mark in text for mark in ".e") else f"{text}.0"
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a 0-d tensor or array
        return format_value(value.item())
    return str(value)


def describe_evaluation(weights: Any, model_dir: str, results: Mapping[str, Any], name: str | None = None) -> str:
    """E.g. "evaluated runs/x/ckpt-1000: accuracy = 0.9722, loss = 0.08123"; ``weights`` is a WeightsOrigin."""
    return (
        f"evaluated {describe_weights(weights, model_dir)}{f' ({name})' if name else ''}: {describe_results(results)}"
    )


def describe_weights(weights: Any, model_dir: str) -> str:
    """Which weights a WeightsOrigin names, in words."""
    if weights.source == "checkpoint":
        path = str(weights.checkpoint_path)
        if os.path.dirname(os.path.abspath(path)) == os.path.abspath(model_dir):  # as the user named model_dir
            return os.path.join(model_dir, os.path.basename(path))
        return path
    if weights.source == "training":
        return f"the weights trained in this process (step {weights.step}, {model_dir})"
    if weights.source == "warm_start":
        return f"the weights warm-started from {weights.warm_start_from}"
    return f"freshly initialised weights (no checkpoint in {model_dir})"
