"""train_and_evaluate: which task this process is, and the evaluations inside the training loop.

What belongs here: the dispatch on TF_CONFIG's task, and, in local mode, when
to evaluate, which evaluation sets, and what follows an evaluation
(best-checkpoint policy, early stopping, exporters). What does not: the
training and evaluation loops themselves (Estimator.train and
Estimator.evaluate), the specs (specs.py), the stop rules (early_stopping.py),
the best record (best.py), the evaluator task (evaluator.py) and the
trainers beside it (trainer_task.py), the exporters (export/).

Local mode is one ``Estimator.train`` call that evaluates inside its loop:
at an evaluation point the loop runs the due EvalSpecs on the live module
(eval mode, no grad, BatchNorm statistics untouched, generator states put
back after), then the best-checkpoint policy, early stopping and exporters,
and carries on training with the same optimizer and input iterator. So the
weights are those of training without evaluations, also with an input_fn
that cannot resume (it is never restarted for an evaluation).

Evaluation points, per EvalSpec:

- ``every_n_steps=None`` (TensorFlow's rule): at each new checkpoint (the
  RunConfig cadence), at most once every ``throttle_secs``;
- ``every_n_steps=N``: at every multiple of N global steps (a checkpoint is
  written there first, so that the best one can be kept);
- always a final evaluation when training ends (max_steps reached, input
  ended, early stopping, a hook's stop request), unless that step was just
  evaluated. Exporters get ``is_the_final_export=True`` there, also when
  max_steps is None (TensorFlow then never signalled a final export).

Under a distribution strategy every replica runs this same loop: training
and evaluation are collective, evaluation results are reduced across
replicas, and each decision taken on a clock or on files (throttle, early
stopping, best checkpoint) is the chief's, broadcast, so all replicas stop at
the same step.

``TF_CONFIG`` is parsed in one explicit step (``cluster_from_tf_config``):

- task type ``evaluator`` (index 0 only) runs ``run_evaluator``: it follows
  model_dir, evaluates each new checkpoint once (TensorFlow's continuous
  evaluation), writes eval/, runs the exporters, keeps the best checkpoints
  and takes the early-stopping decisions, which it sends to the trainers as a
  stop signal (evaluator.py, evaluator_channel.py);
- chief and workers of a cluster that has an ``evaluator`` job only train:
  no evaluation, no eval/, no exporters; they stop when the evaluator says so,
  all at the same step, and return ``(None, None)`` (trainer_task.py);
- chief and workers of a cluster without one, and local mode, run the local
  loop above (the chief records its run with ``evaluator_task: false``, so
  that an evaluator started anyway refuses to be a second writer of eval/);
- an evaluator whose own TF_CONFIG cluster lists no ``evaluator`` job (TF
  1.x's layout) is refused at start-up: the trainers' TF_CONFIG must list it
  too, or they evaluate themselves;
- ``ps`` is refused.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from torchestimator._core.inference import InferenceBundle
from torchestimator._core.spec import ModeKeys
from torchestimator._io.console import TrainOutcome, describe_results, describe_training, log_summary
from torchestimator._policy.best import BestCheckpointPolicy
from torchestimator._policy.early_stopping import EarlyStoppingRule, as_rules
from torchestimator._policy.evaluator import run_evaluator
from torchestimator._policy.history import eval_history, latest_step, seed_rules
from torchestimator._policy.specs import EvalSpec, TrainSpec, as_spec_list, by_spec, run_exporters
from torchestimator._policy.trainer_task import TrainingRunHook, train_for_evaluator
from torchestimator._train_state import TrainState
from torchestimator.checkpoint.errors import DiskFullError, is_no_room
from torchestimator.distribute.cluster import EVALUATOR, PS, PS_ADVICE, cluster_from_tf_config
from torchestimator.distribute.strategy import is_chief
from torchestimator.errors import ConfigError

if TYPE_CHECKING:
    from torchestimator._core.estimator import Estimator
    from torchestimator.distribute.strategy import Strategy

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

__all__ = ["EvalSpec", "TrainSpec", "run_evaluator", "train_and_evaluate"]


# -- the entry point ----------------------------------------------------------------


def train_and_evaluate(
    estimator: Estimator,
    train_spec: TrainSpec,
    eval_spec: EvalSpec | Sequence[EvalSpec],
    *,
    best: BestCheckpointPolicy | None = None,
    early_stopping: EarlyStoppingRule | Iterable[EarlyStoppingRule] = (),
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Any, Any]:
    """Trains, evaluating along the way (see the module docstring for when), until training ends.

    Args:
        eval_spec: one EvalSpec, or a list of them with unique names (several evaluation sets).
            The first one is primary: ``best`` and ``early_stopping`` read its results.
        best: keeps the best checkpoints by a metric and protects them from retention.
        early_stopping: rules (``stop_if_*_hook``, ``EarlyStopping``) asked after each primary evaluation.
        clock: seconds, for throttle_secs; injectable for tests.

    Returns:
        ``(results, exports)``: the last evaluation results and the values the exporters returned at
        that evaluation; for a list of EvalSpecs, dicts keyed by EvalSpec name. Chief and workers of a
        cluster with an evaluator task return ``(None, None)``: the evaluations are the evaluator's.
    """
    specs, rules = _check_arguments(estimator, train_spec, eval_spec, best, early_stopping)
    cluster = cluster_from_tf_config()  # this process's task, read in one explicit step
    if cluster.task_type == EVALUATOR:
        if cluster.task_index != 0:
            raise ConfigError(
                f'TF_CONFIG["task"] is evaluator {cluster.task_index}: train_and_evaluate runs one evaluator '
                "(index 0), the one writer of eval/, best.json and the stop signal. Start only evaluator 0.",
                field="TF_CONFIG",
                value=cluster.task_index,
            )
        _require_evaluator_in_cluster()
        logger.info(
            "TF_CONFIG task type is evaluator: following %s and evaluating each new checkpoint.", estimator.model_dir
        )
        return run_evaluator(estimator, train_spec, eval_spec, best=best, early_stopping=rules, clock=clock)
    strategy = estimator.config.train_distribute
    parameter_servers = strategy is not None and not strategy.lockstep
    if cluster.task_type == PS:
        if not parameter_servers:
            raise ConfigError(f"TF_CONFIG task type 'ps': {PS_ADVICE}", field="TF_CONFIG", value=PS)
        estimator.train(train_spec.input_fn, max_steps=train_spec.max_steps)  # serves until the chief ends training
        return None, None
    if parameter_servers and not cluster.is_chief and EVALUATOR not in cluster.jobs:
        # A parameter-server worker trains on its own; the chief evaluates (and stops everyone early).
        estimator.train(
            train_spec.input_fn,
            hooks=train_spec.hooks,
            max_steps=train_spec.max_steps,
            saving_listeners=train_spec.saving_listeners,
        )
        return None, None
    if EVALUATOR in cluster.jobs:
        if best is not None or rules:
            logger.info(
                "TF_CONFIG's cluster has an evaluator task: it keeps the best checkpoints and decides early "
                "stopping; this %s only trains, and stops when the evaluator says so.",
                cluster.task_type,
            )
        verdict = EarlierVerdict(estimator, train_spec, specs, None, rules, clock) if rules else None
        train_for_evaluator(estimator, train_spec, is_chief=cluster.is_chief, verdict=verdict)
        return None, None
    # Local mode or a TF_CONFIG cluster without an evaluator job: the trainers evaluate; the chief records its run
    # so that an evaluator started against this model_dir anyway refuses to be a second writer of eval/.
    recorder = None
    if cluster.is_chief:
        recorder = TrainingRunHook(
            estimator.model_dir,
            evaluator_task=False,
            max_steps=train_spec.max_steps,
            is_chief=lambda: is_chief(estimator.config.train_distribute),
        )
    loop = _Evaluations(estimator, train_spec, specs, best, rules, clock)
    estimator.train(
        train_spec.input_fn,
        hooks=[*train_spec.hooks, *([recorder] if recorder else [])],
        max_steps=train_spec.max_steps,
        saving_listeners=train_spec.saving_listeners,
        evaluation=loop,
    )
    loop.finish()
    if is_chief(estimator.config.train_distribute):
        log_summary(loop.summary())
    if recorder is not None:
        recorder.record_end(
            latest_step(estimator.checkpoint_store),
            stopped_before_step_one=loop.said_stop,
            stopped_early=loop.stopped_early,
        )
    return by_spec(eval_spec, specs, loop.results, loop.exports)


def _require_evaluator_in_cluster() -> None:
    """The evaluator's TF_CONFIG must list the evaluator job, as the trainers' must (else they evaluate too).

    TensorFlow 1.x's docs left it out of the cluster; here the trainers learn of the evaluator from their
    cluster, so a layout without it has two writers of eval/. Read from the raw TF_CONFIG: the parsed
    ClusterSpec drops the cluster for the evaluator, as TensorFlow does.
    """
    jobs = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    if jobs and EVALUATOR not in jobs:
        raise ConfigError(
            f"TF_CONFIG's cluster lists no 'evaluator' job (it has {sorted(jobs)}): the trainers, reading the same "
            "cluster, would evaluate inside their own loop, and model_dir/eval would get events from two processes. "
            'Add the evaluator\'s address to the cluster ("evaluator": ["host:port"]) in the TF_CONFIG of every '
            "task, chief and workers included.",
            field='TF_CONFIG["cluster"]',
            value=sorted(jobs),
        )


def _check_arguments(
    estimator: object,
    train_spec: Any,
    eval_spec: Any,
    best: Any,
    early_stopping: Any,
) -> tuple[list[EvalSpec], list[EarlyStoppingRule]]:
    if not (hasattr(estimator, "train") and hasattr(estimator, "evaluate") and hasattr(estimator, "model_dir")):
        raise TypeError(f"train_and_evaluate needs a te.Estimator; received {type(estimator).__name__}.")
    if not isinstance(train_spec, TrainSpec):
        raise TypeError(f"train_spec must be a te.TrainSpec; received {type(train_spec).__name__}.")
    specs = as_spec_list(eval_spec)
    if best is not None and not isinstance(best, BestCheckpointPolicy):
        raise TypeError(f"best must be a BestCheckpointPolicy or None; received {best!r}.")
    return specs, as_rules(early_stopping)


# -- replicas agree --------------------------------------------------------------------


def _strategy(estimator: Estimator) -> Strategy | None:
    strategy = estimator.config.train_distribute
    if strategy is None or not strategy.is_set_up or strategy.num_replicas == 1:
        return None
    return strategy


def _chief_decides(estimator: Estimator, value: _T) -> _T:
    """The chief's ``value`` on every replica, for decisions taken on a clock or on files."""
    strategy = _strategy(estimator)
    if strategy is None:
        return value
    chiefs: _T = strategy.broadcast_object(value, 0)
    return chiefs


# -- local mode --------------------------------------------------------------------------


class _Evaluations:
    """train_and_evaluate's evaluations, run by the training loop on the live module (loop.InLoopEvaluation).

    Decides which EvalSpecs are due at a step (every_n_steps multiples; checkpoint-driven ones at most every
    throttle_secs, on the chief's clock), evaluates them, then applies the best-checkpoint policy, early
    stopping and the exporters. ``finish`` runs the final evaluation once training has ended.
    """

    evaluates_during_training = True

    def __init__(
        self,
        estimator: Estimator,
        train_spec: TrainSpec,
        specs: list[EvalSpec],
        best: BestCheckpointPolicy | None,
        rules: list[EarlyStoppingRule],
        clock: Callable[[], float],
    ) -> None:
        config = estimator.config
        self.checkpoints = config.save_checkpoints_steps is not None or config.save_checkpoints_secs is not None
        if not self.checkpoints and (best is not None or any(spec.every_n_steps for spec in specs)):
            raise ValueError(
                "train_and_evaluate with a best-checkpoint policy or EvalSpec(every_n_steps=...) needs checkpoints: "
                "set RunConfig(save_checkpoints_steps=...) or save_checkpoints_secs. Each evaluation point is a "
                "checkpoint, so that the best one can be kept and training resumes exactly after a restart."
            )
        self.estimator, self.train_spec, self.specs = estimator, train_spec, specs
        self.best, self.rules, self.clock = best, rules, clock
        self.results: list[dict[str, Any] | None] = [None] * len(specs)
        self.exports: list[list[Any]] = [[] for _ in specs]
        self.evaluated_step: list[int | None] = [None] * len(specs)
        self.bundle: InferenceBundle | None = None
        self.state: TrainState | None = None
        self.start_step = 0
        self.history_seeded = False
        self.finalized_step: int | None = None
        self._last_time: dict[int, float] = {}
        self._due: tuple[int, ...] = ()
        self.training: TrainOutcome | None = None
        self.primary_evaluations = 0  # for the summary line
        self.said_stop: str | None = None  # why begin stopped training before step one
        self.stopped_early = False  # early stopping stopped training inside the loop

    # -- what the training loop calls (loop.InLoopEvaluation) ----------------------------

    def begin(self, bundle: InferenceBundle, state: TrainState) -> str | None:
        """Takes the live bundle; returns why training is over already, or None.

        A rerun after early stopping stops before step one: the rules, seeded with the evaluations in the
        primary eval dir, are asked first (TF's stop hook stopped after one more step; here no step is taken).
        """
        self.bundle, self.state, self.start_step = bundle, state, state.global_step
        if not self.rules or self.start_step == 0:
            return None
        self._seed_history()
        verdicts = [rule.should_stop() for rule in self.rules]  # every rule asked: each keeps its own state
        if not _chief_decides(self.estimator, any(verdicts)):
            return None
        said = ", ".join(repr(rule) for rule, stop in zip(self.rules, verdicts) if stop) or "the chief's rules"
        logger.info(
            "Early stopping: the evaluations in %s already say stop at global step %d (%s); not training.",
            self.estimator.eval_dir(self.specs[0].name),
            self.start_step,
            said,
        )
        self.said_stop = f"early stopping stopped it in an earlier run ({said})"
        return self.said_stop

    def wants_checkpoint(self, step: int) -> bool:
        return bool(self._due_by_steps(step))

    def due(self, step: int, saved: bool) -> bool:
        by_checkpoint = self._due_after_checkpoint(step) if saved else ()
        self._due = tuple(sorted(set(self._due_by_steps(step)) | set(by_checkpoint)))
        return bool(self._due)

    def _due_by_steps(self, step: int) -> list[int]:
        """The specs with every_n_steps whose multiple ``step`` is."""
        return [index for index, spec in enumerate(self.specs) if spec.every_n_steps and step % spec.every_n_steps == 0]

    def evaluate(self, step: int, *, final: bool) -> bool:
        return self._round(step, set(self._due), final)

    def training_ended(self, outcome: TrainOutcome) -> None:
        self.training = outcome

    # -- the summary line ---------------------------------------------------------------------

    def summary(self) -> str:
        """train_and_evaluate's one line: the training (or its skip) and the primary evaluation's last results,
        e.g. "trained runs/x from step 0 to 1000 in 9.8 s (final loss 0.03); evaluated 5 times, at step 1000:
        accuracy = 0.97, loss = 0.08"."""
        parts = [describe_training(self.training)] if self.training is not None else []
        results, step = self.results[0], self.evaluated_step[0]
        if results is not None:
            times = f"{self.primary_evaluations} times, " if self.primary_evaluations > 1 else ""
            name = f" ({self.specs[0].name})" if self.specs[0].name else ""
            parts.append(f"evaluated{name} {times}at step {step}: {describe_results(results)}")
        return "; ".join(parts)

    # -- after training ---------------------------------------------------------------------

    def finish(self) -> None:
        """The final evaluation (of every spec not evaluated at the last step), exporters told it is final."""
        step = self.state.global_step if self.state is not None else latest_step(self.estimator.checkpoint_store)
        if self.finalized_step != step:
            self._round(step, set(), final=True)

    # -- the policy --------------------------------------------------------------------------

    def _due_after_checkpoint(self, step: int) -> tuple[int, ...]:
        """Checkpoint-driven specs due now: at most one evaluation per throttle_secs, by the chief's clock."""
        now = self.clock()
        candidates = [index for index, spec in enumerate(self.specs) if spec.every_n_steps is None]
        due = tuple(
            index
            for index in candidates
            if index not in self._last_time or now - self._last_time[index] >= self.specs[index].throttle_secs
        )
        due = _chief_decides(self.estimator, due)
        for index in candidates:
            if index in due:
                self._last_time[index] = now
            else:
                logger.info(
                    "Skip the current checkpoint eval (%s, step %d) due to throttle secs.",
                    self.specs[index].name or "eval",
                    step,
                )
        return due

    def _round(self, step: int, due: set[int], final: bool) -> bool:
        """Evaluates what is due at ``step``, then best/early stopping/exporters; True when training is over."""
        evaluated = [index for index in sorted(due) if self._evaluate(index, step)]
        if 0 in evaluated and self._after_primary(step, check_rules=not final):
            logger.info("Early stopping at global step %d.", step)
            final = self.stopped_early = True
        if final:
            last = [index for index in range(len(self.specs)) if self._evaluate(index, step)]
            if 0 in last:
                self._after_primary(step, check_rules=False)
            # Every spec evaluated at the last step exports as final, also one evaluated there before training
            # was known to end (the input ran out right after): FinalExporter exports exactly once.
            evaluated = [index for index in range(len(self.specs)) if self.evaluated_step[index] == step]
            self.finalized_step = step
        for index in evaluated:
            self._export(index, step, final)
        return final

    def _evaluate(self, index: int, step: int) -> bool:
        """Evaluates spec ``index`` unless it already evaluated ``step``; True if it ran."""
        if self.evaluated_step[index] == step:
            return False
        spec = self.specs[index]
        if self.bundle is not None:  # the live module, as training left it at ``step``
            self.results[index] = self.bundle.evaluate(
                spec.input_fn, steps=spec.steps, hooks=spec.hooks, name=spec.name, global_step=step
            )
        else:  # training was skipped (max_steps already reached): the newest checkpoint (no summary line of its own)
            bundle = self.estimator.inference_bundle(mode=ModeKeys.EVAL)
            self.results[index] = bundle.evaluate(spec.input_fn, steps=spec.steps, hooks=spec.hooks, name=spec.name)
        self.evaluated_step[index] = step
        self.primary_evaluations += index == 0
        return True

    def _after_primary(self, step: int, *, check_rules: bool) -> bool:
        """Best-checkpoint policy and early-stopping rules on the primary results; True to stop."""
        results = self.results[0]
        assert results is not None  # called right after the primary spec was evaluated
        if self.best is not None:
            self._update_best(self.best, step, results)
        if not self.rules:
            return False
        self._seed_history()
        for rule in self.rules:
            rule.observe(step, results)  # every replica: a missing metric fails everywhere alike
        stop = check_rules and any([rule.should_stop() for rule in self.rules])  # noqa: C419 (every rule asked)
        return bool(_chief_decides(self.estimator, stop))

    def _update_best(self, best: BestCheckpointPolicy, step: int, results: dict[str, Any]) -> None:
        best.check_results(step, results)  # every replica, before the chief writes

        def update() -> bool | None:
            try:
                return best.update(self.estimator.checkpoint_store, step, results)
            except OSError as error:
                if not is_no_room(error):
                    raise
                raise DiskFullError(
                    error,
                    path=error.filename or self.estimator.model_dir,
                    what=f"the best-checkpoint record of global step {step}",
                    advice="Free some space (or choose a model_dir with room) and rerun.",
                ) from error

        _on_chief(self.estimator, update, f"The best-checkpoint policy at global step {step}")

    def _seed_history(self) -> None:
        """Early-stopping rules see the primary evaluations of earlier runs in this model_dir, as in TensorFlow."""
        if self.history_seeded:
            return
        self.history_seeded = True
        history: list[tuple[int, dict[str, float]]] | None = None
        if is_chief(self.estimator.config.train_distribute):
            history = eval_history(self.estimator.eval_dir(self.specs[0].name), up_to=self.start_step)
        history = _chief_decides(self.estimator, history)
        seed_rules(self.rules, history or ())

    def _export(self, index: int, step: int, final: bool) -> None:
        """The spec's exporters, run by the chief only (one writer of export/); every replica gets their results."""
        spec = self.specs[index]
        self.exports[index] = _on_chief(
            self.estimator,
            lambda: run_exporters(self.estimator, spec, self.estimator.latest_checkpoint(), self.results[index], final),
            f"Exporting {spec.name or 'eval'} at global step {step}",
        )


class EarlierVerdict(_Evaluations):
    """The trainers' one question when an evaluator task evaluates: do the evaluations already in eval/ say stop?

    Asked before step one with the same rules, seeded the same way, as in local mode, and decided by the
    chief for every replica: a rerun after early stopping takes no step, as in local mode, instead of
    training on until the evaluator's first verdict. Nothing is evaluated here (the evaluator's job).
    """

    evaluates_during_training = False

    def wants_checkpoint(self, step: int) -> bool:
        return False

    def due(self, step: int, saved: bool) -> bool:
        return False


def _on_chief(estimator: Estimator, action: Callable[[], _T], what: str) -> _T:
    """``action()`` run by the chief, its result on every replica (``Strategy.run_on_chief``); one process runs it."""
    strategy = _strategy(estimator)
    if strategy is None:
        return action()
    chiefs: _T = strategy.run_on_chief(action, what)
    return chiefs
