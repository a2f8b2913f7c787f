"""The evaluator task: follows model_dir, evaluates each new checkpoint once, and takes the decisions.

What belongs here: TensorFlow's continuous evaluation (wait start_delay_secs, then evaluate the newest
checkpoint if it is new, at most once per throttle_secs) and what follows each evaluation in this task:
the best record (best.json, ``BestCheckpointPolicy.update_record``), early stopping (a stop signal to the
trainers, see evaluator_channel.py), the exporters, and the final evaluation of the checkpoint training
ended with. What does not: the trainers' side (trainer_task.py) and the files' formats (evaluator_channel.py).

The evaluator stops:

- once an evaluated checkpoint reached ``train_spec.max_steps`` (TensorFlow's rule);
- once the training chief recorded the end of its run (training_run.json): the checkpoint it ended with
  is evaluated with ``is_the_final_export=True``, also when max_steps is None (TF's evaluator waited);
- after its own early-stopping decision, once the trainers ended their run in answer: their final
  checkpoint is evaluated and exported as final (TensorFlow's evaluator kept waiting for checkpoints that
  never came). If they have not ended within ``stop_timeout_secs``, the newest checkpoint is evaluated as
  final and a warning says the trainers did not answer;
- with ``timeout_secs``, once no new checkpoint appeared for that long.

An evaluator started after its trainers ended (training_run.json records the end, and the newest checkpoint
is the one that run ended with) evaluates that checkpoint as the final one and returns at once. A run that
ended at an older step than the newest checkpoint belongs to an earlier job: its end does not stop this
evaluator. While it waits the evaluator reads training_run.json once a second (``STOP_POLL_SECS``), so it
notices the end without waiting a throttle.

Stop signals and the protection of the best checkpoints (and of the one under evaluation) need trainers
that listen: started by train_and_evaluate with the evaluator listed in their TF_CONFIG, whose chief records
its run in training_run.json. When a checkpoint is evaluated and no such run is recorded (trainers started
with ``torchestimator train FILE``, or ``Estimator.train``), a warning says so once; an early-stopping
decision then reaches no one, so the evaluator does not wait for an answer but goes on evaluating each new
checkpoint up to max_steps (or ``timeout_secs``); the decision is delivered if such a run starts later.
Trainers that evaluate themselves (train_and_evaluate without TF_CONFIG, or whose cluster lists no
evaluator; their record says ``evaluator_task: false``) are refused with a ConfigError: eval/ has one writer.

A checkpoint deleted under the evaluator (by retention, when its protection lapsed) is skipped with a
warning, whether it vanished during the evaluation or under an exporter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from torchestimator._io import filesystems
from torchestimator._policy.best import BestCheckpointPolicy
from torchestimator._policy.early_stopping import EarlyStoppingRule, as_rules
from torchestimator._policy.evaluator_channel import (
    END_EARLY_STOPPING,
    END_MAX_STEPS,
    STOP_POLL_SECS,
    TRAINING_RUN_FILE,
    StopSignal,
    TrainingRun,
    read_training_run,
    write_evaluating_step,
    write_stop_signal,
)
from torchestimator._policy.history import eval_history, seed_rules
from torchestimator._policy.specs import EvalSpec, TrainSpec, as_spec_list, by_spec, check_seconds, run_exporters
from torchestimator.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from torchestimator._core.estimator import Estimator

logger = logging.getLogger(__name__)

__all__ = ["run_evaluator"]


def run_evaluator(
    estimator: Estimator,
    train_spec: TrainSpec,
    eval_spec: EvalSpec | Sequence[EvalSpec],
    *,
    best: BestCheckpointPolicy | None = None,
    early_stopping: EarlyStoppingRule | Iterable[EarlyStoppingRule] = (),
    poll_secs: float | None = None,
    timeout_secs: float | None = None,
    stop_timeout_secs: float = 600.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Any, Any]:
    """Follows model_dir and evaluates each new checkpoint once, as TensorFlow's evaluator task.

    Waits ``start_delay_secs`` (of the first EvalSpec), then looks for a new checkpoint every ``poll_secs``
    (default: the smallest throttle_secs). A checkpoint removed by retention before it could be read is
    skipped. After each evaluation: ``best`` records the best checkpoints in best.json (the training chief
    keeps them from retention), ``early_stopping`` rules may decide to stop the trainers, and the exporters
    run. See the module docstring for when it returns, and ``stop_timeout_secs`` / ``timeout_secs`` there.

    Returns:
        What train_and_evaluate returns: the last evaluation results and the exporters' values at it.
    """
    if not isinstance(train_spec, TrainSpec):
        raise TypeError(f"train_spec must be a te.TrainSpec; received {type(train_spec).__name__}.")
    specs = as_spec_list(eval_spec)
    if best is not None and not isinstance(best, BestCheckpointPolicy):
        raise TypeError(f"best must be a BestCheckpointPolicy or None; received {best!r}.")
    rules = as_rules(early_stopping)
    for name, value in (
        ("poll_secs", poll_secs),
        ("timeout_secs", timeout_secs),
        ("stop_timeout_secs", stop_timeout_secs),
    ):
        if value is not None:
            check_seconds("run_evaluator", name, value)
    if any(spec.every_n_steps for spec in specs):
        logger.warning(
            "EvalSpec(every_n_steps=...) applies to evaluation inside training; the evaluator task "
            "evaluates checkpoints (RunConfig.save_checkpoints_steps sets how often they appear)."
        )
    interval = poll_secs if poll_secs is not None else min(spec.throttle_secs for spec in specs)
    evaluator = _Evaluator(
        estimator,
        train_spec,
        specs,
        best,
        rules,
        interval=interval,
        timeout_secs=timeout_secs,
        stop_timeout_secs=stop_timeout_secs,
        clock=clock,
        sleep=sleep,
    )
    evaluator.run()
    return by_spec(eval_spec, specs, evaluator.results, evaluator.exports)


class _Evaluator:
    """One evaluator task's loop and what it remembers: the last evaluated checkpoint and its decision."""

    def __init__(
        self,
        estimator: Estimator,
        train_spec: TrainSpec,
        specs: list[EvalSpec],
        best: BestCheckpointPolicy | None,
        rules: list[EarlyStoppingRule],
        *,
        interval: float,
        timeout_secs: float | None,
        stop_timeout_secs: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.estimator, self.train_spec, self.specs, self.best, self.rules = estimator, train_spec, specs, best, rules
        self.model_dir = estimator.model_dir
        self.interval, self.timeout_secs, self.stop_timeout_secs = interval, timeout_secs, stop_timeout_secs
        self.clock, self.sleep = clock, sleep
        self.results: list[Any] = [None] * len(specs)
        self.exports: list[list[Any]] = [[] for _ in specs]
        self.last_path: str | None = None
        self.last_step: int | None = None
        self.final_step: int | None = None  # the step whose exporters were told is_the_final_export
        self.decision: StopSignal | None = None  # run_id "" until addressed to a training run
        self.decided_at = 0.0  # when the decision was last addressed to a run
        self.history_seeded = False
        self.warned_unlistened = False
        self.training: TrainingRun | None = None  # as read at the top of the latest round (and after an evaluation)
        self.earlier_run_id: str | None = None  # an ended run of an earlier job: its end does not end this evaluator
        self.skip_path: str | None = None  # that run's final checkpoint, evaluated by the earlier job's evaluator

    def run(self) -> None:
        delay = self.specs[0].start_delay_secs
        if delay:
            logger.info(
                "The evaluator waits start_delay_secs=%g s (EvalSpec's; TensorFlow's default is 120) before "
                "it first looks for a checkpoint in %s; then every %g s.",
                delay,
                self.model_dir,
                self.interval,
            )
        self.sleep(delay)
        self._take_the_earlier_run()
        next_evaluation = last_new = self.clock()
        while True:
            training = self.training = self._training_run()
            if training is not None and training.ended:
                self._finish(training)
                return
            now = self.clock()
            if self.decision is not None and training is not None:  # a run listens: wait for its answer
                self._address(training)
                if now - self.decided_at >= self.stop_timeout_secs:
                    logger.warning(
                        "The trainers did not end their run within %s s of the stop signal (%s): "
                        "evaluating the newest checkpoint as the final one.",
                        self.stop_timeout_secs,
                        self.decision.rule,
                    )
                    self._finish(None)
                    return
            elif now >= next_evaluation:
                newest = self._newest()
                if newest is not None and newest[1] not in (self.last_path, self.skip_path):
                    step = self._evaluate(*newest, final=self._reaches_max_steps(newest[0]))
                    if step is not None:
                        last_new = self.clock()
                        if self._reaches_max_steps(step):
                            return
                        self._decide(step)
                        self._address(self.training)
                elif self.timeout_secs is not None and now - last_new >= self.timeout_secs:
                    logger.info(
                        "No new checkpoint in %s for %s seconds: the evaluator stops.",
                        self.model_dir,
                        self.timeout_secs,
                    )
                    return
                next_evaluation = now + self.interval
            self.sleep(self._pause(next_evaluation))

    def _take_the_earlier_run(self) -> None:
        """Decides, once at start, whether the ended run training_run.json records is this evaluator's to finish.

        It is when it ended with the newest checkpoint and its job is over by this evaluator's own rules:
        max_steps reached (this evaluator's max_steps; a rerun with a higher one is a new job), or the
        early-stopping rules, seeded with eval/, still say stop (relaxed rules train on). Otherwise it belongs
        to an earlier job (the whole job restarted, or only this evaluator started early): this evaluator
        waits for the trainers' next run, and does not re-evaluate the checkpoint that run ended with when
        eval/ already has it.
        """
        earlier = read_training_run(self.model_dir)
        if earlier is None or not earlier.ended or not earlier.evaluator_task:  # the last is refused by _training_run
            return
        newest = self._newest()
        if newest is not None and newest[0] == earlier.end_step and self._job_is_over(earlier.end_cause, newest[0]):
            logger.info(
                "Training run %s ended at global step %d (%s) and its job is over: evaluating that "
                "checkpoint as the final one.",
                earlier.run_id,
                earlier.end_step,
                earlier.end_reason,
            )
            return
        self.earlier_run_id = earlier.run_id
        if newest is not None and newest[0] == earlier.end_step and earlier.end_step in self._evaluated_steps():
            self.skip_path = newest[1]
        limit = "no max_steps" if self.train_spec.max_steps is None else f"max_steps {self.train_spec.max_steps}"
        logger.info(
            "%s records training run %s, which ended at global step %d (%s); with this evaluator's %s and "
            "early-stopping rules it belongs to an earlier job. Waiting for the trainers' next run "
            "(a new %s) and evaluating each new checkpoint meanwhile.",
            TRAINING_RUN_FILE,
            earlier.run_id,
            earlier.end_step,
            earlier.end_reason,
            limit,
            TRAINING_RUN_FILE,
        )

    def _job_is_over(self, end_cause: str | None, end_step: int) -> bool:
        """Whether a run that ended at ``end_step`` for ``end_cause`` ended this evaluator's job too."""
        if end_cause == END_MAX_STEPS:
            return self._reaches_max_steps(end_step)
        if end_cause == END_EARLY_STOPPING:
            return self._verdict_stands(end_step)
        # The input ended or a hook stopped it (or a record from before end_cause): over, as it said.
        return True

    def _verdict_stands(self, step: int) -> bool:
        """The early-stopping rules, seeded with the evaluations in eval/ up to ``step``, still say stop there."""
        if not self.rules:
            return False
        self._seed_history(step)
        return any([rule.should_stop() for rule in self.rules])  # noqa: C419 (every rule asked: each keeps its own state)

    def _seed_history(self, step: int) -> None:
        if not self.history_seeded:  # the evaluations of earlier runs in this model_dir, as in TensorFlow
            self.history_seeded = True
            seed_rules(self.rules, eval_history(self.estimator.eval_dir(self.specs[0].name), up_to=step))

    def _evaluated_steps(self) -> set[int]:
        return {step for step, _ in eval_history(self.estimator.eval_dir(self.specs[0].name), up_to=2**62)}

    def _pause(self, next_evaluation: float) -> float:
        if self.decision is not None and self.training is not None:
            return STOP_POLL_SECS
        return max(0.0, min(next_evaluation - self.clock(), STOP_POLL_SECS))

    def _reaches_max_steps(self, step: int) -> bool:
        return self.train_spec.max_steps is not None and step >= self.train_spec.max_steps

    def _newest(self) -> tuple[int, str] | None:
        history = self.estimator.checkpoint_store.history()
        return (history[-1]["step"], history[-1]["path"]) if history else None

    def _training_run(self) -> TrainingRun | None:
        """The training run this evaluator serves (None: none yet, or only an earlier job's ended one)."""
        training = read_training_run(self.model_dir)
        if training is None or training.run_id == self.earlier_run_id:
            return None
        if not training.evaluator_task:
            raise ConfigError(
                f"{self.model_dir}/{TRAINING_RUN_FILE}: the trainers of run {training.run_id} evaluate inside their "
                "training loop (train_and_evaluate without TF_CONFIG, or with a TF_CONFIG cluster that lists no "
                "'evaluator' job); with this evaluator, model_dir/eval would get events from two processes. Add the "
                'evaluator\'s address to the cluster ("evaluator": ["host:port"]) in the TF_CONFIG of every task, '
                "chief and workers included, or stop this evaluator.",
                field="TF_CONFIG",
                value=training.run_id,
            )
        return training

    def _note_listeners(self, step: int) -> None:
        """Re-reads the training run after evaluating ``step``; says once, loudly, when no run listens."""
        self.training = self._training_run()
        if self.training is not None or self.warned_unlistened:
            return
        self.warned_unlistened = True
        logger.warning(
            "Global step %d was evaluated, but no training run in %s listens to this evaluator (no %s from "
            "trainers started by train_and_evaluate with the evaluator in TF_CONFIG; e.g. `torchestimator train "
            "FILE` or Estimator.train wrote these checkpoints). Early-stopping decisions reach no one and the "
            "trainers' retention may delete the best checkpoints: both need trainers started by train_and_evaluate "
            '(`torchestimator train-and-evaluate FILE`) with "evaluator": ["host:port"] in the cluster of every '
            "task's TF_CONFIG. This evaluator goes on evaluating each new checkpoint up to max_steps (%s)%s.",
            step,
            self.model_dir,
            TRAINING_RUN_FILE,
            self.train_spec.max_steps,
            "" if self.timeout_secs is None else f" or until none appears for {self.timeout_secs} s",
        )

    # -- one evaluation and what follows it ------------------------------------------------------

    def _evaluate(self, step: int, path: str, *, final: bool) -> int | None:
        """Evaluates ``path`` with every spec, records the best, runs the exporters; its step, or None if it vanished.

        While it runs, evaluator.json names the step, so that the training chief's retention keeps it until
        its result is recorded (the chief reads the file before each save); written only for trainers that
        read it (a run recorded with an evaluator task).
        """
        keeps = self.training is not None and self.training.evaluator_task
        if keeps:
            write_evaluating_step(self.model_dir, step)
        try:
            for index, spec in enumerate(self.specs):
                try:
                    self.results[index] = self.estimator.evaluate(
                        spec.input_fn, steps=spec.steps, hooks=spec.hooks, checkpoint_path=path, name=spec.name
                    )
                except CheckpointError as error:
                    logger.warning("Could not evaluate %s (removed or damaged while being read): %s", path, error)
                    return None
            step = self.results[0]["global_step"]
            if self.best is not None:
                self.best.update_record(self.estimator.checkpoint_store, step, self.results[0])
            self.last_path, self.last_step = path, step
            self._export(path, final)  # still protected: exporters read the checkpoint too
        finally:
            if keeps:
                write_evaluating_step(self.model_dir, None)
        logger.info("Evaluated %s (global step %d).", path, step)
        self._note_listeners(step)
        return step

    def _export(self, path: str, final: bool) -> None:
        for index, spec in enumerate(self.specs):
            try:
                self.exports[index] = run_exporters(self.estimator, spec, path, self.results[index], final)
            except Exception as error:
                if filesystems.exists(path):
                    raise
                # Retention deleted it under the exporter (its protection lapsed): a skipped export, not a crash.
                logger.warning(
                    "Skipped the exports of %s (global step %s): the checkpoint was removed while the "
                    "exporters of %s read it (%s: %s).",
                    path,
                    self.last_step,
                    spec.name or "eval",
                    type(error).__name__,
                    error,
                )
                self.exports[index] = []
        if final:
            self.final_step = self.last_step

    def _decide(self, step: int) -> None:
        """The early-stopping rules on the primary results; a decision to stop is kept in ``self.decision``."""
        if not self.rules:
            return
        self._seed_history(step)
        for rule in self.rules:
            rule.observe(step, self.results[0])
        stopping = [rule for rule in self.rules if rule.should_stop()]  # every rule asked: each keeps its state
        if stopping and self.decision is None:  # the first decision stands; a later run gets it when it starts
            self.decision = StopSignal(run_id="", step=step, rule=repr(stopping[0]))
            if self.training is not None:
                logger.info("Early stopping: %s says stop at global step %d; telling the trainers.", stopping[0], step)
            else:
                logger.warning(
                    "Early stopping: %s says stop at global step %d, but no training run listens (see "
                    "the warning above): evaluating on; the decision goes to a run that starts later.",
                    stopping[0],
                    step,
                )

    def _address(self, training: TrainingRun | None) -> None:
        """Writes the stop signal for the run training now (again if the trainers restarted as a new run)."""
        if self.decision is None or training is None or training.ended or training.run_id == self.decision.run_id:
            return
        self.decision = StopSignal(run_id=training.run_id, step=self.decision.step, rule=self.decision.rule)
        self.decided_at = self.clock()
        write_stop_signal(self.model_dir, self.decision)
        logger.info(
            "Stop signal written for training run %s (%s at global step %d).",
            training.run_id,
            self.decision.rule,
            self.decision.step,
        )

    def _finish(self, training: TrainingRun | None) -> None:
        """The final evaluation: the checkpoint the run ended with (``training``), else the newest one."""
        newest = self._newest()
        target = newest
        if training is not None:
            logger.info(
                "Training run %s ended at global step %d (%s).", training.run_id, training.end_step, training.end_reason
            )
            paths = {entry["step"]: entry["path"] for entry in self.estimator.checkpoint_store.history()}
            end_step = training.end_step
            if end_step is not None and end_step in paths:
                target = (end_step, paths[end_step])
            else:
                logger.warning(
                    "Training ended at global step %s but %s has no checkpoint of it; evaluating the "
                    "newest one (%s) as the final one.",
                    training.end_step,
                    self.model_dir,
                    newest,
                )
        if target is None:
            logger.warning("Training ended but %s has no checkpoint to evaluate.", self.model_dir)
            return
        if target[1] != self.last_path:
            self._evaluate(*target, final=True)
        elif self.final_step != self.last_step:  # evaluated before the end was known: exported again, as final
            self._export(target[1], final=True)
