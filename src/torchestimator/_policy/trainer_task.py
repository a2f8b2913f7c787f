"""The trainers' side of train_and_evaluate when an evaluator task evaluates: train, keep, stop when told.

What belongs here: what chief and workers do when TF_CONFIG's cluster has an ``evaluator`` job (TensorFlow's
distributed train_and_evaluate): they train and checkpoint, and do not evaluate, write no eval/ and run no
exporters; those are the evaluator's (evaluator.py). What does not: the files' formats (evaluator_channel.py).

The chief, besides training:

- records the run in training_run.json once training starts (a fresh run id, the step it restored) and
  again when train returns (the step it ended at and why), so that the evaluator knows when to do its final
  evaluation and whom to address a stop signal to;
- before each save, copies best.json's steps into the manifest (``mark_recorded_best``) and keeps the step
  the evaluator is evaluating (evaluator.json) from retention: the evaluator cannot write the manifest;
- after each step, asks a ``StopSignalWatch`` (one clock read; a file stat per ``STOP_POLL_SECS``) whether
  the evaluator addressed a stop to this run, and if so requests a stop. The loop's stop agreement (one
  all-reduce per step) stops every replica at that same step; the loop then writes the final checkpoint.

Workers only train: the chief's stop request reaches them through that agreement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchestimator._policy.best import mark_recorded_best
from torchestimator._policy.evaluator_channel import (
    END_EARLY_STOPPING,
    END_INPUT_OR_HOOK,
    END_MAX_STEPS,
    STOP_POLL_SECS,
    StopSignalWatch,
    TrainingRun,
    new_run_id,
    read_evaluating_step,
    write_training_run,
)
from torchestimator._policy.history import latest_step
from torchestimator._policy.specs import TrainSpec
from torchestimator.errors import ConfigError
from torchestimator.hooks.base import CheckpointSaverListener, Hook, RunContext

if TYPE_CHECKING:
    from torchestimator._core.estimator import Estimator
    from torchestimator._core.loop import InLoopEvaluation

logger = logging.getLogger(__name__)

__all__ = ["EvaluatorRecordsKeeper", "TrainingRunHook", "train_for_evaluator"]


def train_for_evaluator(
    estimator: Estimator,
    train_spec: TrainSpec,
    *,
    is_chief: bool,
    poll_secs: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    verdict: InLoopEvaluation | None = None,
) -> None:
    """Trains as a chief or worker of a cluster whose evaluator task evaluates (see the module docstring).

    ``poll_secs``: how often the chief looks for a stop signal (default ``STOP_POLL_SECS``, read at the call).
    ``verdict``: train_and_evaluate's ``EarlierVerdict`` (loop.InLoopEvaluation), asked before step one
    whether the evaluations already in eval/ say stop (a rerun after early stopping takes no step).
    """
    poll_secs = STOP_POLL_SECS if poll_secs is None else poll_secs
    config = estimator.config
    if config.save_checkpoints_steps is None and config.save_checkpoints_secs is None:
        raise ConfigError(
            "TF_CONFIG's cluster has an evaluator task, which evaluates the checkpoints the trainers write, but "
            "checkpoints are disabled in RunConfig: set save_checkpoints_steps (or save_checkpoints_secs).",
            field="save_checkpoints_steps",
            value=None,
        )
    hooks, listeners = list(train_spec.hooks), list(train_spec.saving_listeners)
    recorder = keeper = None
    if is_chief:
        recorder = TrainingRunHook(
            estimator.model_dir, evaluator_task=True, max_steps=train_spec.max_steps, poll_secs=poll_secs, clock=clock
        )
        keeper = EvaluatorRecordsKeeper(estimator.checkpoint_store)
        hooks.append(recorder)
        listeners.append(keeper)
    try:
        estimator.train(
            train_spec.input_fn,
            hooks=hooks,
            max_steps=train_spec.max_steps,
            saving_listeners=listeners,
            evaluation=verdict,
        )
    finally:
        if keeper is not None:
            keeper.release()
    if recorder is not None:
        recorder.record_end(
            latest_step(estimator.checkpoint_store), stopped_before_step_one=getattr(verdict, "said_stop", None)
        )


class TrainingRunHook(Hook):
    """The chief's record of its run in training_run.json and, with an evaluator task, its ear for a stop signal.

    With ``evaluator_task=False`` (train_and_evaluate in local mode, or a TF_CONFIG cluster without an
    evaluator job: the trainers evaluate themselves) it only records, so that an evaluator started against
    this model_dir can refuse to be a second writer of eval/. ``is_chief`` is asked once training started
    (replicas are placed by then): only the chief replica writes.
    """

    def __init__(
        self,
        model_dir: str,
        *,
        evaluator_task: bool,
        max_steps: int | None = None,
        poll_secs: float = STOP_POLL_SECS,
        clock: Callable[[], float] = time.monotonic,
        is_chief: Callable[[], bool] = lambda: True,
    ) -> None:
        self.model_dir, self.evaluator_task, self.poll_secs, self.clock = model_dir, evaluator_task, poll_secs, clock
        self.max_steps = max_steps
        self.is_chief = is_chief
        self.run: TrainingRun | None = None
        self.watch: StopSignalWatch | None = None

    def after_restore(self, state: Any) -> None:
        if not self.is_chief():
            return
        # After restore, model_dir exists and is the chief's to write; the step is the one training resumes from.
        self.run = TrainingRun(
            run_id=new_run_id(),
            evaluator_task=self.evaluator_task,
            start_step=state.global_step,
            max_steps=self.max_steps,
        )
        write_training_run(self.model_dir, self.run)
        if self.evaluator_task:
            self.watch = StopSignalWatch(self.model_dir, self.run.run_id, poll_secs=self.poll_secs, clock=self.clock)
        logger.info(
            "Training run %s starts at global step %d%s.",
            self.run.run_id,
            state.global_step,
            "; the evaluator task evaluates its checkpoints" if self.evaluator_task else "",
        )

    def after_step(self, run_context: RunContext) -> None:
        signal = self.watch.check() if self.watch is not None else None
        if signal is not None and not run_context.stop_requested:
            logger.info(
                "The evaluator says stop (%s, decided at global step %d): training stops at step %d.",
                signal.rule,
                signal.step,
                run_context.global_step,
            )
            run_context.request_stop()

    def record_end(
        self, end_step: int, *, stopped_before_step_one: str | None = None, stopped_early: bool = False
    ) -> None:
        """training_run.json says the run ended at ``end_step`` (its final checkpoint is on disk) and why.

        ``stopped_before_step_one``: why the evaluations already in eval/ stopped a rerun before its first step;
        ``stopped_early``: early stopping inside the loop stopped it (local mode).
        """
        signal = self.watch.signal if self.watch is not None else None
        if signal is not None:
            cause, reason = END_EARLY_STOPPING, f"stopped by the evaluator: {signal.rule} at global step {signal.step}"
        elif stopped_before_step_one is not None:
            cause, reason = END_EARLY_STOPPING, f"took no step: {stopped_before_step_one}"
        elif stopped_early:
            cause, reason = END_EARLY_STOPPING, "early stopping"
        elif self.max_steps is not None and end_step >= self.max_steps:
            cause, reason = END_MAX_STEPS, f"max_steps {self.max_steps} reached"
        else:
            cause, reason = END_INPUT_OR_HOOK, "the input ended or a hook stopped training"
        run = self.run
        if run is None and not self.is_chief():
            return
        if run is None:  # training made no step (max_steps already reached): the record still tells the evaluator
            run = TrainingRun(
                run_id=new_run_id(), evaluator_task=self.evaluator_task, start_step=end_step, max_steps=self.max_steps
            )
        self.run = TrainingRun(
            run_id=run.run_id,
            evaluator_task=run.evaluator_task,
            start_step=run.start_step,
            end_step=end_step,
            end_reason=reason,
            max_steps=run.max_steps,
            end_cause=cause,
        )
        write_training_run(self.model_dir, self.run)


class EvaluatorRecordsKeeper(CheckpointSaverListener):
    """Before each save, keeps from retention what the evaluator still needs: best.json's steps (marked as
    best in the manifest) and the step it is evaluating (protected until its result is recorded)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._configured = frozenset(store.protected)

    def before_save(self, state: Any, global_step: int) -> None:
        mark_recorded_best(self.store)
        evaluating = read_evaluating_step(self.store.model_dir)
        # CheckpointStore's protected steps are read by its retention at this save; not persisted, since the
        # evaluator names a new step (or none) for every evaluation.
        self.store.protected = self._configured | ({evaluating} if evaluating is not None else set())

    def release(self) -> None:
        """Gives the store back the protected steps it was built with."""
        self.store.protected = self._configured
