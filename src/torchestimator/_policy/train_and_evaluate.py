"""train_and_evaluate: TrainSpec, EvalSpec, the local train/evaluate loop and the evaluator process.

What belongs here: when to evaluate, which evaluation sets, and what follows
an evaluation (best-checkpoint policy, early stopping, exporters). What does
not: the training and evaluation loops themselves (Estimator.train and
Estimator.evaluate), the stop rules (early_stopping.py), the best record
(best.py), the exporters (export/).

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

``TF_CONFIG`` is parsed in one explicit step: task type ``evaluator`` runs
``run_evaluator``, which follows model_dir and evaluates each new checkpoint
once (TensorFlow's continuous evaluation); ``ps`` is refused; chief and
worker tasks run the local loop above.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torchestimator._policy.best import BestCheckpointPolicy
from torchestimator.checkpoint import CheckpointError
from torchestimator.checkpoint.errors import DiskFullError, is_no_room
from torchestimator.distribute.launcher import EVALUATOR, PS, cluster_from_tf_config
from torchestimator._policy.early_stopping import EarlyStoppingRule
from torchestimator.hooks.base import CheckpointSaverListener, Hook, check_hook
from torchestimator._core.inference import InferenceBundle
from torchestimator._core.state import TrainState
from torchestimator._io.summary import read_scalars

logger = logging.getLogger(__name__)

__all__ = ["EvalSpec", "TrainSpec", "run_evaluator", "train_and_evaluate"]


def _check_positive_int(owner: str, name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{owner}: {name} must be a positive int or None; received {value!r}.")


def _check_non_negative(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{owner}: {name} must be a number of seconds >= 0; received {value!r}.")


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """What to train on and for how long (tf.estimator.TrainSpec)."""

    input_fn: Callable[..., Any]
    """Returns the training batches; called once when training starts, resumed from the checkpoint's position."""
    _: dataclasses.KW_ONLY
    max_steps: int | None = None
    """Absolute global step to stop at; None trains until the input ends (or a stop rule fires)."""
    hooks: Sequence[Hook] = ()
    """Training hooks, passed to each Estimator.train call."""
    saving_listeners: Sequence[CheckpointSaverListener] = ()
    """Checkpoint listeners, passed to each Estimator.train call."""

    def __post_init__(self) -> None:
        if not callable(self.input_fn):
            raise TypeError(f"TrainSpec: input_fn must be callable; received {self.input_fn!r}.")
        _check_positive_int("TrainSpec", "max_steps", self.max_steps)
        object.__setattr__(self, "hooks", tuple(self.hooks or ()))
        object.__setattr__(self, "saving_listeners", tuple(self.saving_listeners or ()))
        for hook in self.hooks:
            check_hook(hook, "TrainSpec: hooks")
        for listener in self.saving_listeners:
            if not isinstance(listener, CheckpointSaverListener):
                raise TypeError(
                    f"TrainSpec: saving_listeners must be te.CheckpointSaverListener instances; received {listener!r}."
                )


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """What to evaluate on, how often, and what to export afterwards (tf.estimator.EvalSpec)."""

    input_fn: Callable[..., Any]
    """Returns the evaluation batches; called for each evaluation."""
    _: dataclasses.KW_ONLY
    steps: int | None = 100
    """Batches per evaluation (TensorFlow's default 100); None evaluates until the input ends."""
    name: str | None = None
    """Names the evaluation: summaries go to model_dir/eval_<name> (model_dir/eval when None)."""
    hooks: Sequence[Hook] = ()
    """Evaluation hooks."""
    exporters: Any = ()
    """An exporter or a sequence of them, each with a unique, non-empty ``name`` and an ``export`` method."""
    start_delay_secs: float = 120
    """Evaluator process only: seconds to wait before the first evaluation."""
    throttle_secs: float = 600
    """At most one evaluation per this many seconds (checkpoint-driven evaluation and the evaluator process)."""
    every_n_steps: int | None = None
    """Evaluate every this many global steps instead of at checkpoints (throttle_secs then does not apply)."""

    def __post_init__(self) -> None:
        if not callable(self.input_fn):
            raise TypeError(f"EvalSpec: input_fn must be callable; received {self.input_fn!r}.")
        _check_positive_int("EvalSpec", "steps", self.steps)
        _check_positive_int("EvalSpec", "every_n_steps", self.every_n_steps)
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise TypeError(f"EvalSpec: name must be a non-empty string or None; received {self.name!r}.")
        _check_non_negative("EvalSpec", "start_delay_secs", self.start_delay_secs)
        _check_non_negative("EvalSpec", "throttle_secs", self.throttle_secs)
        object.__setattr__(self, "hooks", tuple(self.hooks or ()))
        for hook in self.hooks:
            check_hook(hook, "EvalSpec: hooks")
        object.__setattr__(self, "exporters", _check_exporters(self.exporters))


def _check_exporters(exporters: Any) -> tuple[Any, ...]:
    if exporters is None:
        return ()
    if hasattr(exporters, "export") and hasattr(exporters, "name"):
        exporters = (exporters,)
    exporters = tuple(exporters)
    names: set[str] = set()
    for exporter in exporters:
        if not callable(getattr(exporter, "export", None)):
            raise TypeError(f"EvalSpec: exporters must have an export(...) method; received {exporter!r}.")
        name = getattr(exporter, "name", None)
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"EvalSpec: an exporter's name must be a non-empty string; {exporter!r} has {name!r}.")
        if name in names:
            raise ValueError(f"EvalSpec: exporter names must be unique; {name!r} appears more than once.")
        names.add(name)
    return exporters


# -- the entry point ----------------------------------------------------------------


def train_and_evaluate(
    estimator: Any,
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
        that evaluation; for a list of EvalSpecs, dicts keyed by EvalSpec name.
    """
    specs, rules = _check_arguments(estimator, train_spec, eval_spec, best, early_stopping)
    cluster = cluster_from_tf_config()  # the one place TF_CONFIG is read
    if cluster.task_type == EVALUATOR:
        if best is not None or rules:
            raise ValueError(
                "TF_CONFIG says this process is the evaluator: best-checkpoint policies and early stopping run in "
                "the training processes (the chief owns the manifest and only trainers can stop). Pass them there."
            )
        logger.info("TF_CONFIG task type is evaluator: following %s and evaluating each new checkpoint.",
                    estimator.model_dir)
        return run_evaluator(estimator, train_spec, eval_spec, clock=clock)
    if cluster.task_type == PS:
        raise ValueError("TF_CONFIG task type 'ps': torch.distributed has no parameter servers. Start only chief, "
                         "worker and evaluator tasks.")
    loop = _Evaluations(estimator, train_spec, specs, best, rules, clock)
    estimator.train(train_spec.input_fn, hooks=train_spec.hooks, max_steps=train_spec.max_steps,
                    saving_listeners=train_spec.saving_listeners, evaluation=loop)
    loop.finish()
    if isinstance(eval_spec, EvalSpec):
        return loop.results[0], loop.exports[0]
    return ({spec.name: loop.results[i] for i, spec in enumerate(specs)},
            {spec.name: loop.exports[i] for i, spec in enumerate(specs)})


def _check_arguments(estimator: Any, train_spec: Any, eval_spec: Any, best: Any, early_stopping: Any,
                     ) -> tuple[list[EvalSpec], list[EarlyStoppingRule]]:
    if not (hasattr(estimator, "train") and hasattr(estimator, "evaluate") and hasattr(estimator, "model_dir")):
        raise TypeError(f"train_and_evaluate needs a te.Estimator; received {type(estimator).__name__}.")
    if not isinstance(train_spec, TrainSpec):
        raise TypeError(f"train_spec must be a te.TrainSpec; received {type(train_spec).__name__}.")
    specs = _as_spec_list(eval_spec)
    if best is not None and not isinstance(best, BestCheckpointPolicy):
        raise TypeError(f"best must be a BestCheckpointPolicy or None; received {best!r}.")
    rules = [early_stopping] if isinstance(early_stopping, EarlyStoppingRule) else list(early_stopping or ())
    for rule in rules:
        if not (callable(getattr(rule, "observe", None)) and callable(getattr(rule, "should_stop", None))):
            raise TypeError(
                f"early_stopping takes rules made by te.stop_if_*_hook or te.EarlyStopping; received {rule!r}."
            )
    return specs, rules


def _as_spec_list(eval_spec: Any) -> list[EvalSpec]:
    specs = [eval_spec] if isinstance(eval_spec, EvalSpec) else list(eval_spec or ())
    if not specs:
        raise ValueError("eval_spec must be an EvalSpec or a non-empty list of them.")
    for spec in specs:
        if not isinstance(spec, EvalSpec):
            raise TypeError(f"eval_spec must contain te.EvalSpec instances; received {spec!r}.")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"Each EvalSpec needs its own name (it names the eval dir); received names {names}.")
    exporter_names = [exporter.name for spec in specs for exporter in spec.exporters]
    if len(set(exporter_names)) != len(exporter_names):
        raise ValueError(f"Exporter names must be unique across EvalSpecs (each exports to model_dir/export/<name>); "
                         f"received {exporter_names}.")
    return specs


# -- replicas agree --------------------------------------------------------------------


def _strategy(estimator: Any) -> Any:
    strategy = estimator.config.train_distribute
    if strategy is None or not strategy.is_set_up or strategy.num_replicas == 1:
        return None
    return strategy


def _is_chief(estimator: Any) -> bool:
    strategy = _strategy(estimator)
    return True if strategy is None else strategy.is_chief


def _chief_decides(estimator: Any, value: Any) -> Any:
    """The chief's ``value`` on every replica, for decisions taken on a clock or on files."""
    strategy = _strategy(estimator)
    return value if strategy is None else strategy.broadcast_object(value, 0)


# -- local mode --------------------------------------------------------------------------


class _Evaluations:
    """train_and_evaluate's evaluations, run by the training loop on the live module (loop.InLoopEvaluation).

    Decides which EvalSpecs are due at a step (every_n_steps multiples; checkpoint-driven ones at most every
    throttle_secs, on the chief's clock), evaluates them, then applies the best-checkpoint policy, early
    stopping and the exporters. ``finish`` runs the final evaluation once training has ended.
    """

    def __init__(self, estimator: Any, train_spec: TrainSpec, specs: list[EvalSpec],
                 best: BestCheckpointPolicy | None, rules: list[EarlyStoppingRule], clock: Callable[[], float]) -> None:
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

    # -- what the training loop calls (loop.InLoopEvaluation) ----------------------------

    def begin(self, bundle: InferenceBundle, state: TrainState) -> None:
        self.bundle, self.state, self.start_step = bundle, state, state.global_step

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

    # -- after training ---------------------------------------------------------------------

    def finish(self) -> None:
        """The final evaluation (of every spec not evaluated at the last step), exporters told it is final."""
        step = self.state.global_step if self.state is not None else _latest_step(self.estimator)
        if self.finalized_step != step:
            self._round(step, set(), final=True)

    # -- the policy --------------------------------------------------------------------------

    def _due_after_checkpoint(self, step: int) -> tuple[int, ...]:
        """Checkpoint-driven specs due now: at most one evaluation per throttle_secs, by the chief's clock."""
        now = self.clock()
        candidates = [index for index, spec in enumerate(self.specs) if spec.every_n_steps is None]
        due = tuple(index for index in candidates if index not in self._last_time
                    or now - self._last_time[index] >= self.specs[index].throttle_secs)
        due = _chief_decides(self.estimator, due)
        for index in candidates:
            if index in due:
                self._last_time[index] = now
            else:
                logger.info("Skip the current checkpoint eval (%s, step %d) due to throttle secs.",
                            self.specs[index].name or "eval", step)
        return due

    def _round(self, step: int, due: set[int], final: bool) -> bool:
        """Evaluates what is due at ``step``, then best/early stopping/exporters; True when training is over."""
        evaluated = [index for index in sorted(due) if self._evaluate(index, step)]
        if 0 in evaluated and self._after_primary(step, check_rules=not final):
            logger.info("Early stopping at global step %d.", step)
            final = True
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
            self.results[index] = self.bundle.evaluate(spec.input_fn, steps=spec.steps, hooks=spec.hooks,
                                                       name=spec.name, global_step=step)
        else:  # training was skipped (max_steps already reached): the newest checkpoint
            self.results[index] = self.estimator.evaluate(spec.input_fn, steps=spec.steps, hooks=spec.hooks,
                                                          name=spec.name)
        self.evaluated_step[index] = step
        return True

    def _after_primary(self, step: int, *, check_rules: bool) -> bool:
        """Best-checkpoint policy and early-stopping rules on the primary results; True to stop."""
        results = self.results[0]
        if self.best is not None:
            self._update_best(step, results)
        if not self.rules:
            return False
        self._seed_history()
        for rule in self.rules:
            rule.observe(step, results)  # every replica: a missing metric fails everywhere alike
        stop = check_rules and any([rule.should_stop() for rule in self.rules])
        return bool(_chief_decides(self.estimator, stop))

    def _update_best(self, step: int, results: dict[str, Any]) -> None:
        self.best.check_results(step, results)  # every replica, before the chief writes
        outcome: tuple[bool | None, str | None] = (None, None)
        failure: Exception | None = None
        if _is_chief(self.estimator):
            try:
                outcome = (self.best.update(self.estimator.checkpoint_store, step, results), None)
            except (ValueError, OSError) as error:
                outcome, failure = (None, f"{type(error).__name__}: {error}"), error
        _, error = _chief_decides(self.estimator, outcome)
        if is_no_room(failure):  # the chief keeps the type (an OSError); the others learn it as a ValueError
            raise DiskFullError(failure, path=failure.filename or self.estimator.model_dir,
                                what=f"the best-checkpoint record of global step {step}",
                                advice="Free some space (or choose a model_dir with room) and rerun.") from failure
        if error is not None:  # raised on every replica, so none waits on the others
            raise ValueError(f"The best-checkpoint policy failed at global step {step}: {error}")

    def _seed_history(self) -> None:
        """Early-stopping rules see the primary evaluations of earlier runs in this model_dir, as in TensorFlow."""
        if self.history_seeded:
            return
        self.history_seeded = True
        history = None
        if _is_chief(self.estimator):
            history = _eval_history(self.estimator.eval_dir(self.specs[0].name), up_to=self.start_step)
        for step, results in _chief_decides(self.estimator, history) or ():
            for rule in self.rules:
                if hasattr(rule, "seed"):
                    rule.seed(step, results)

    def _export(self, index: int, step: int, final: bool) -> None:
        """The spec's exporters, run by the chief only (one writer of export/); every replica gets their results."""
        spec = self.specs[index]
        self.exports[index] = _on_chief(
            self.estimator, lambda: _run_exporters(self.estimator, spec, self.estimator.latest_checkpoint(),
                                                   self.results[index], final),
            f"Exporting {spec.name or 'eval'} at global step {step}")


def _on_chief(estimator: Any, action: Callable[[], Any], what: str) -> Any:
    """``action()`` run by the chief, its result given to every replica; a failure is raised on every replica
    (the chief's own error there, a RuntimeError naming it elsewhere), so that none waits for the others."""
    outcome: tuple[Any, str | None] = (None, None)
    failure: Exception | None = None
    if _is_chief(estimator):
        try:
            outcome = (action(), None)
        except Exception as error:
            outcome, failure = (None, f"{type(error).__name__}: {error}"), error
    value, error = _chief_decides(estimator, outcome)
    if failure is not None:
        raise failure
    if error is not None:
        raise RuntimeError(f"{what} failed on the chief: {error}")
    return value


def _run_exporters(estimator: Any, spec: EvalSpec, checkpoint_path: str | None, results: dict[str, Any],
                   final: bool) -> list[Any]:
    exports = []
    for exporter in spec.exporters:
        export_path = os.path.join(estimator.model_dir, "export", exporter.name)
        exports.append(exporter.export(estimator, export_path, checkpoint_path, results, final))
    return exports


def _latest_step(estimator: Any) -> int:
    history = estimator.checkpoint_store.history()
    return history[-1]["step"] if history else 0


def _eval_history(eval_dir: str, *, up_to: int) -> list[tuple[int, dict[str, float]]]:
    """Evaluations written to ``eval_dir`` at steps <= up_to, as (step, {metric: value}) in step order."""
    by_step: dict[int, dict[str, float]] = {}
    for tag, points in read_scalars(eval_dir).items():
        for step, value in points:
            if step <= up_to:
                by_step.setdefault(step, {})[tag] = value
    return sorted(by_step.items())


# -- evaluator mode -------------------------------------------------------------------------


def run_evaluator(
    estimator: Any,
    train_spec: TrainSpec,
    eval_spec: EvalSpec | Sequence[EvalSpec],
    *,
    poll_secs: float | None = None,
    timeout_secs: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Any, Any]:
    """Follows model_dir and evaluates each new checkpoint once, as TensorFlow's evaluator task.

    Waits ``start_delay_secs`` (of the first EvalSpec), then polls every ``poll_secs`` (default: the
    smallest throttle_secs); stops once an evaluated checkpoint's global_step >= train_spec.max_steps,
    or, with ``timeout_secs``, once no new checkpoint appeared for that long (useful when max_steps is
    None). A checkpoint removed by retention before it could be read is skipped. Exporters run after
    each evaluation. Returns what train_and_evaluate returns.
    """
    if not isinstance(train_spec, TrainSpec):
        raise TypeError(f"train_spec must be a te.TrainSpec; received {type(train_spec).__name__}.")
    specs = _as_spec_list(eval_spec)
    for name, value in (("poll_secs", poll_secs), ("timeout_secs", timeout_secs)):
        if value is not None:
            _check_non_negative("run_evaluator", name, value)
    interval = poll_secs if poll_secs is not None else min(spec.throttle_secs for spec in specs)
    sleep(specs[0].start_delay_secs)
    results: list[Any] = [None] * len(specs)
    exports: list[list[Any]] = [[] for _ in specs]
    last_path, last_new = None, clock()
    while True:
        started = clock()
        path = estimator.latest_checkpoint()
        if path is not None and path != last_path:
            step = _evaluate_checkpoint(estimator, train_spec, specs, path, results, exports)
            if step is not None:
                last_path, last_new = path, clock()
                if train_spec.max_steps is not None and step >= train_spec.max_steps:
                    break
        elif timeout_secs is not None and clock() - last_new >= timeout_secs:
            logger.info("No new checkpoint in %s for %s seconds: the evaluator stops.", estimator.model_dir, timeout_secs)
            break
        sleep(max(0.0, interval - (clock() - started)))
    if isinstance(eval_spec, EvalSpec):
        return results[0], exports[0]
    return ({spec.name: results[i] for i, spec in enumerate(specs)},
            {spec.name: exports[i] for i, spec in enumerate(specs)})


def _evaluate_checkpoint(estimator: Any, train_spec: TrainSpec, specs: list[EvalSpec], path: str,
                         results: list[Any], exports: list[list[Any]]) -> int | None:
    """Evaluates ``path`` with every spec and runs their exporters; its global step, or None if it vanished."""
    for index, spec in enumerate(specs):
        try:
            results[index] = estimator.evaluate(spec.input_fn, steps=spec.steps, hooks=spec.hooks,
                                                checkpoint_path=path, name=spec.name)
        except CheckpointError as error:
            logger.warning("Could not evaluate %s (removed or damaged while being read): %s", path, error)
            return None
    step = results[0]["global_step"]
    final = train_spec.max_steps is not None and step >= train_spec.max_steps
    for index, spec in enumerate(specs):
        exports[index] = _run_exporters(estimator, spec, path, results[index], final)
    logger.info("Evaluated %s (global step %d).", path, step)
    return step
