"""Estimator: the public train / evaluate / predict surface; owns model_dir.

It resolves the strategy, has the model built once per process and its weights restored (checkpoint in
model_dir, else warm start, else fresh init) into the plain module (weights.py), wraps it for distribution,
builds the optimizer over the wrapped parameters (FSDP2's shards) and restores its state, and hands a run to
loop.py. The loops themselves live in loop.py; how user functions are called in calling.py; checkpoint files in
checkpoint/ (checkpoint/parts.py: what goes into one and comes back).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from torchestimator._core.agreement import check_start_agreement
from torchestimator._core.arguments import (
    check_argument_types,
    checked_factory_result,
    is_scheduler,
    model_argument_required,
    resolve_model_dir,
)
from torchestimator._core.batches import InputSource
from torchestimator._core.calling import (
    INPUT_FN_ARGS,
    MODEL_FN_ARGS,
    call_factory,
    call_input_fn,
    check_declared,
    input_caller,
    model_fn_caller,
)
from torchestimator._core.config import RunConfig
from torchestimator._core.eval_loops import EvalRun, predict_loop
from torchestimator._core.inference import InferenceBundle, WeightsOrigin
from torchestimator._core.lazy_layers import materialize_lazy_layers
from torchestimator._core.loop import InLoopEvaluation, TrainingRun, train_loop
from torchestimator._core.spec import EstimatorSpec, ModeKeys
from torchestimator._core.weights import GatheredWeights, ModelFactory, ModelWeights, warm_start_checkpoint
from torchestimator._io import filesystems
from torchestimator._io.atomic import temporary_prefix
from torchestimator._io.console import (
    TrainOutcome,
    describe_evaluation,
    describe_training,
    log_summary,
    show_summaries,
)
from torchestimator._io.summary import SummaryWriter
from torchestimator._shapeless import refuse_uninitialized
from torchestimator._tf_names import accepts_tf_keywords
from torchestimator._train_state import TrainState, seed_everything
from torchestimator.checkpoint.best_record import best_checkpoint, protect_recorded_best
from torchestimator.checkpoint.checkpointer import Checkpointer
from torchestimator.checkpoint.errors import CheckpointError, DiskFullError, is_no_room
from torchestimator.checkpoint.parts import (
    TrainingParts,
    holds_shards,
    replica_states,
    restore_shared,
    resumable,
)
from torchestimator.checkpoint.store import Checkpoint, CheckpointStore
from torchestimator.data.inputs import describe_position
from torchestimator.distribute.cluster import EVALUATOR, PS, cluster_from_tf_config
from torchestimator.distribute.one_device import OneDeviceStrategy
from torchestimator.distribute.strategy import Strategy, is_chief
from torchestimator.distribute.sync_batch_norm import copy_sharing_process_groups, prepare_batch_norm
from torchestimator.errors import ConfigError
from torchestimator.export.replicas import ReplicaExports
from torchestimator.hooks.base import CheckpointSaverListener, Hook, HookList
from torchestimator.hooks.basic import LoggingTensorHook, StepCounterHook
from torchestimator.hooks.triggers import check_step_count
from torchestimator.warm_start import WarmStartPlan, as_warm_start_settings, plan_warm_start

logger = logging.getLogger("torchestimator")


class Estimator:
    """Trains, evaluates and predicts with a model_fn, keeping everything in model_dir.

    Args:
        model_fn: called for every batch with whichever of (model, features,
            labels, mode, params, config) it names; returns an EstimatorSpec.
        model: an nn.Module, or a factory taking params (or nothing) that
            builds one; built once per process.
        optimizer: a factory `(parameters)` or `(parameters, params)` returning
            a torch optimizer. Required for train.
        lr_scheduler: optional factory `(optimizer)` or `(optimizer, params)`;
            stepped once per global step.
    """

    @model_argument_required  # pasted tf.estimator code has no model=: say what it is
    def __init__(
        self,
        model_fn: Callable[..., EstimatorSpec],
        model: torch.nn.Module | ModelFactory,
        optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        config: RunConfig | None = None,
        params: Mapping[str, Any] | None = None,
        warm_start_from: Any = None,
        *,
        lr_scheduler: Callable[..., Any] | None = None,
    ) -> None:
        if model_fn is None:
            raise ValueError("model_fn must be provided.")
        if isinstance(model_fn, torch.nn.Module):
            # A module is callable, so it would pass the signature check and fail only inside train.
            raise TypeError(
                f"model_fn must be a function (model, features, labels, mode) -> EstimatorSpec; received the module "
                f"{type(model_fn).__name__}. Pass the module as model= and a model_fn that calls it, or use "
                "Estimator.from_module(module, loss=...)."
            )
        check_argument_types(
            model=model,
            optimizer=optimizer,
            model_dir=model_dir,
            config=config,
            params=params,
            lr_scheduler=lr_scheduler,
        )
        self._model_fn_args = check_declared(model_fn, "model_fn", MODEL_FN_ARGS, {"features"})
        config = RunConfig() if config is None else config
        self._model_fn = model_fn
        self._params = copy.deepcopy(dict(params or {}))
        if params and "params" not in self._model_fn_args:
            logger.debug(
                "params given but model_fn does not take them; they still reach model and optimizer factories."
            )
        if config.storage_options is not None:
            filesystems.configure_storage_options(config.storage_options)  # before model_dir is looked at
        self._model_dir = resolve_model_dir(model_dir, config)
        self._config = config.replace(model_dir=self._model_dir) if config.model_dir != self._model_dir else config
        self._optimizer_factory = optimizer
        self._scheduler_factory = lr_scheduler
        # After a train() of several replicas: the export of every replica's export_saved_model is replica 0's.
        self._replica_exports: ReplicaExports | None = None
        self._store = CheckpointStore(
            self._model_dir,
            keep_checkpoint_max=self._config.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=self._config.keep_checkpoint_every_n_hours,
        )
        # The built module and where its weights came from (weights.py).
        self._model = ModelWeights(
            model,
            params=self._params,
            config=self._config,
            model_dir=self._model_dir,
            store=self._store,
            warm_start=None if warm_start_from is None else as_warm_start_settings(warm_start_from),
        )

    @classmethod
    def from_module(
        cls,
        module: torch.nn.Module | ModelFactory,
        loss: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        optimizer: str | type[torch.optim.Optimizer] | Callable[..., torch.optim.Optimizer] = "adam",
        metrics: Iterable[str] | Mapping[str, Callable[..., Any]] | None = None,
        *,
        learning_rate: float | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        config: RunConfig | None = None,
        params: Mapping[str, Any] | None = None,
        lr_scheduler: Callable[..., Any] | None = None,
        warm_start_from: Any = None,
    ) -> Estimator:
        """An Estimator for one module and one loss, as Keras compile + fit or model_to_estimator.

        `loss` is a name (cross_entropy / sparse_categorical_crossentropy, binary_crossentropy, mse, mae)
        or a callable (outputs, labels) -> loss; `optimizer` a name (adam, adamw, sgd, rmsprop, with
        Keras's default learning rates), an Optimizer class or a factory; `metrics` names (accuracy,
        precision, recall, auc, mse, mae, rmse) or {name: callable(labels, predictions) -> metric op}.
        Predictions are {"outputs"}, plus "class" and "probabilities" for classification losses.
        """
        from torchestimator._core.module_estimator import build_model_fn, resolve_optimizer

        call = "Estimator.from_module"
        # Checked as from_module's arguments, so that errors name them as the user wrote them (module=, not model=).
        check_argument_types(
            model=module,
            optimizer=None,
            model_dir=model_dir,
            config=config,
            params=params,
            lr_scheduler=lr_scheduler,
            call=call,
            model_field="module",
        )
        model_fn = build_model_fn(loss, metrics)
        estimator = cls(
            model_fn=model_fn,
            model=module,
            optimizer=resolve_optimizer(optimizer, learning_rate),
            model_dir=model_dir,
            config=config,
            params=params,
            lr_scheduler=lr_scheduler,
            warm_start_from=warm_start_from,
        )
        estimator._model.argument = (call, "module")
        return estimator

    # -- properties -------------------------------------------------------

    @property
    def model_dir(self) -> str:
        return self._model_dir

    @property
    def config(self) -> RunConfig:
        return self._config

    @property
    def params(self) -> dict[str, Any]:
        return copy.deepcopy(self._params)

    def eval_dir(self, name: str | None = None) -> str:
        """model_dir/eval, or model_dir/eval_<name> for a named evaluation."""
        return filesystems.join(self._model_dir, f"eval_{name}" if name else "eval")

    def latest_checkpoint(self) -> str | None:
        return self._store.latest_checkpoint()

    @property
    def checkpoint_store(self) -> CheckpointStore:
        """model_dir's checkpoints: listing, history, retention and the best marks (one writer: the chief)."""
        return self._store

    def best_checkpoint(self) -> str | None:
        """The best checkpoint recorded by train_and_evaluate's BestCheckpointPolicy, or None."""
        return best_checkpoint(self._store)

    def get_variable_names(self) -> list[str]:
        return [name for name, _, _ in self._store.list_variables(self._require_checkpoint())]

    def get_variable_value(self, name: str) -> np.ndarray:
        self._require_checkpoint()
        checkpoint = self._store.restore(load_optimizer=False)  # past a damaged newest one, as evaluate does
        if name not in checkpoint.model_state:
            raise ValueError(
                f"Variable {name!r} is not in {checkpoint.path}; it has {sorted(checkpoint.model_state)[:20]}."
            )
        value: np.ndarray = checkpoint.model_state[name].numpy().copy()  # the tensor may view the checkpoint's file
        return value

    def _raise_if_all_checkpoints_damaged(self) -> None:
        """A model_dir holding checkpoints of which none is intact raises the CheckpointError naming each."""
        if self.latest_checkpoint() is None and self._store.has_checkpoints():
            self._store.restore()

    def _require_checkpoint(self) -> str:
        self._raise_if_all_checkpoints_damaged()
        path = self.latest_checkpoint()
        if path is None:
            raise ValueError(f"Could not find trained model in model_dir: {self._model_dir}.")
        return path

    # -- train ------------------------------------------------------------

    def train(
        self,
        input_fn: Callable[..., Iterable[Any]],
        hooks: Iterable[Hook] | None = None,
        steps: int | None = None,
        max_steps: int | None = None,
        saving_listeners: Iterable[CheckpointSaverListener] | None = None,
        *,
        evaluation: InLoopEvaluation | None = None,
    ) -> Estimator:
        """Trains until max_steps (absolute), for `steps` more steps, or until the input ends.

        Logs one summary line (trained / resumed / skipped, see _io/console.py), on the chief.
        ``evaluation`` (train_and_evaluate's) evaluates inside the loop on the live module; it is
        handed the live InferenceBundle before step one (``evaluation.begin(bundle, state)``) and
        the call's outcome at the end (``evaluation.training_ended(outcome)``) instead of a summary line.
        """
        if steps is not None and max_steps is not None:
            raise ValueError("Can not provide both steps and max_steps.")
        for name, value in (("steps", steps), ("max_steps", max_steps)):
            if value is not None:
                check_step_count("Estimator.train", name, value)
        if self._optimizer_factory is None:
            raise ValueError(
                "Estimator.train needs an optimizer factory: Estimator(..., optimizer=lambda parameters: ...)."
            )
        strategy = self._config.train_distribute
        _refuse_non_training_task(serves_variables=strategy is not None and not strategy.lockstep)
        show_summaries()
        started = time.monotonic()
        with _deterministic_algorithms(self._config.deterministic):
            try:
                run = self._start_training(input_fn, hooks, steps, max_steps, saving_listeners, evaluation)
            except BaseException as error:  # parameter servers: the ps tasks must not wait for a chief that failed
                if strategy is not None and strategy.is_set_up:
                    strategy.end_training(
                        f"the chief failed before step one: {type(error).__name__}: {error}", failed=True
                    )
                raise
            if isinstance(run, TrainOutcome):  # max_steps already reached
                if strategy is not None and not run.served:
                    strategy.end_training(f"{self._model_dir} is already at step {run.end_step} (max_steps)")
                self._report_training(run, evaluation)
                return self
            model = self._model
            model.live_run = run
            try:
                outcome = train_loop(run)
                if run.checkpointer is not None:
                    run.checkpointer.close()  # a background save: the final checkpoint is complete before return
                run.strategy.end_training(f"the chief finished training at global step {outcome.state.global_step}")
            except BaseException as error:
                if run.checkpointer is not None:
                    run.checkpointer.close(raise_errors=False)
                run.strategy.end_training(f"the chief stopped with {type(error).__name__}: {error}", failed=True)
                try:
                    run.summary_writer.close()
                except OSError as error:  # keep the error that stopped training (a full disk fails both)
                    logger.warning("%s", error)
                if holds_shards(run.parts.model):
                    model.module = None  # a sharded module is no module to evaluate: the next call rebuilds it
                raise
            finally:
                model.origin, model.live_run = model.now(), None
                run.parts.model.eval()
            run.summary_writer.close()
            if holds_shards(run.parts.model):
                model.module = model.gathered_copy(run.parts.model, run.strategy.device)  # every replica, together
            run.strategy.barrier()  # the chief's final checkpoint is on disk before any replica reads it
            if not run.strategy.lockstep:
                run.strategy.teardown()  # a parameter-server trainer leaves the group: its training is over
        state = outcome.state
        # No step and no reason: the weights trained in this process (no checkpoints) are already at max_steps.
        already_there = state.global_step == state.start_step and outcome.ended_by is None
        self._report_training(
            TrainOutcome(
                model_dir=self._model_dir,
                start_step=state.start_step,
                end_step=state.global_step,
                seconds=time.monotonic() - started,
                resumed_from=run.resumed_from,
                last_step=run.last_step,
                skipped=already_there,
                ended_by=outcome.ended_by,
                final_loss=state.last_loss,
                input_ended_first=outcome.input_ended_first,
            ),
            evaluation,
        )
        return self

    def _report_training(self, outcome: TrainOutcome, evaluation: InLoopEvaluation | None) -> None:
        """The call's summary line, on the chief, also when no step was taken; train_and_evaluate's evaluation
        reports it with its results."""
        if evaluation is not None:
            evaluation.training_ended(outcome)
        elif is_chief(self._config.train_distribute):
            log_summary(describe_training(outcome))

    def _start_training(
        self,
        input_fn: Callable[..., Any],
        hooks: Iterable[Hook] | None,
        steps: int | None,
        max_steps: int | None,
        saving_listeners: Iterable[CheckpointSaverListener] | None,
        evaluation: InLoopEvaluation | None,
    ) -> TrainingRun | TrainOutcome:
        """Everything before step one, in the order DESIGN.md gives; the skipped call's outcome when max_steps is
        already reached."""
        input_fn_args = check_declared(input_fn, "input_fn", INPUT_FN_ARGS)
        config = self._config
        strategy = config.train_distribute or OneDeviceStrategy(config.device)
        strategy.setup()
        if strategy.serves_variables:  # a ps task: it holds variables while the chief and workers train
            strategy.serve()
            return TrainOutcome(model_dir=self._model_dir, start_step=0, end_step=0, seconds=0.0, served=True)
        hook_list = self._train_hooks(HookList(hooks or ()))  # user hooks are checked before any work
        # A model_dir whose checkpoints are all damaged raises here rather than silently starting over.
        checkpoint = self._store.restore() if self._store.has_checkpoints() else None
        # Every replica must start from the same checkpoint in the same model_dir, or fail here, naming who differs.
        run_token = check_start_agreement(strategy, self._model_dir, checkpoint, max_steps=max_steps, steps=steps)
        self._replica_exports = (
            None
            if run_token is None
            else ReplicaExports(
                run_token, strategy.replica_id, strategy.num_replicas, getattr(strategy, "timeout_seconds", 300.0)
            )
        )
        if max_steps is not None and checkpoint is not None and checkpoint.step >= max_steps:
            return TrainOutcome(
                model_dir=self._model_dir,
                start_step=checkpoint.step,
                end_step=checkpoint.step,
                seconds=0.0,
                last_step=max_steps,
                skipped=True,
            )
        module = self._model.build(strategy.device)  # with random_seed, the first build is seeded: same weights
        if config.random_seed is not None:
            # Training's random streams start from the seed, whichever call (train, evaluate, export) built the model.
            seed_everything(config.random_seed)
        state = TrainState(mode=ModeKeys.TRAIN)
        hook_list.begin(state)
        call_model_fn = model_fn_caller(self._model_fn, self._model_fn_args, self._params, self._config)
        if checkpoint is None:  # a checkpoint gives lazy layers their shapes as it loads; else the first batch does
            materialize_lazy_layers(
                module,
                lambda: call_input_fn(
                    input_fn, input_fn_args, ModeKeys.TRAIN, strategy, self._params, self._config, warn=False
                ),
                call_model_fn,
                ModeKeys.TRAIN,
                strategy.device,
            )
        self._model.restore(module, checkpoint, state)  # on the plain module, before any wrapping
        if strategy.is_chief:  # after warm start, so a failed one leaves model_dir untouched
            self._prepare_model_dir(state.global_step)
        module = prepare_batch_norm(module, strategy, sync=config.sync_batch_norm)
        if self._model.source is module and strategy.shards_parameters:
            self._model.plain_template = copy_sharing_process_groups(module)  # FSDP2 shards the user's module in place
        # Wrapped before the optimizer is built: FSDP2 replaces the parameters by shards, and the optimizer
        # must hold those (DDP keeps the parameters, so the order changes nothing for it).
        wrapped = strategy.wrap(module)
        parts = self._build_parts(module, state, strategy)
        position = None
        if checkpoint is not None:  # generator states before input_fn runs: it may draw from them
            position = parts.restore(checkpoint, *strategy.checkpoint_slot)
        elif (settings := self._model.warm_start) is not None and settings.warm_start_optimizer:
            restore_shared(warm_start_checkpoint(settings), parts.shared_parts(), parts.optimizer, parts.model)
        state.global_step = strategy.begin_training(module, state.global_step, model_dir=self._model_dir)
        state.start_step = state.global_step
        input_source = call_input_fn(input_fn, input_fn_args, ModeKeys.TRAIN, strategy, self._params, self._config)
        parts.input_source = resumable(input_source)
        self._resume_input(input_source, parts, position, checkpoint, strategy.checkpoint_slot[1])
        strategy.provide_replica_state(parts.replica_state)  # parameter servers: the chief asks workers for theirs
        last_step = max_steps if max_steps is not None else (state.global_step + steps if steps is not None else None)
        run = TrainingRun(
            config=config,
            strategy=strategy,
            parts=parts,
            wrapped=wrapped,
            call_model_fn=call_model_fn,
            hooks=hook_list,
            checkpointer=self._checkpointer(strategy, saving_listeners, module, evaluation),
            summary_writer=SummaryWriter(self._model_dir, enabled=strategy.is_chief),
            input_source=input_source,
            last_step=last_step,
            evaluation=evaluation,
            resumed_from=None if checkpoint is None else checkpoint.path,
        )
        if evaluation is not None:
            self._begin_evaluation(run, module, evaluation)
        return run

    def _begin_evaluation(self, run: TrainingRun, module: torch.nn.Module, evaluation: InLoopEvaluation) -> None:
        """Hands train_and_evaluate's evaluation the bundle it evaluates with: the live module, or under a sharded
        strategy a plain copy refreshed at each checkpoint."""
        config, strategy, state = self._config, run.strategy, run.state
        # One that never evaluates (it only answers begin) gets the training strategy, already set up.
        eval_strategy = (config.eval_distribute or strategy) if evaluation.evaluates_during_training else strategy
        if not eval_strategy.lockstep:  # a parameter-server chief evaluates the whole eval input alone
            eval_strategy = OneDeviceStrategy(strategy.device, warn_if_launched=False)
        eval_strategy.setup()
        eval_module = module
        if holds_shards(module) and evaluation.evaluates_during_training:
            # Sharded layers gather their weights in every forward, a collective that replicas with uneven
            # evaluation shares would not pair: evaluations run on a plain copy, refreshed at each checkpoint
            # (every evaluated step has one).
            if run.checkpointer is None:
                raise ConfigError(
                    "train_and_evaluate under FullyShardedStrategy evaluates the weights of each checkpoint, "
                    "but checkpoints are disabled in RunConfig; set save_checkpoints_steps.",
                    field="save_checkpoints_steps",
                    value=None,
                )
            gathered = GatheredWeights(module, self._model.plain_module().to(strategy.device))
            run.checkpointer.listeners.append(gathered)
            eval_module = gathered.plain
        run.ended_before_start = evaluation.begin(
            self._bundle(eval_module, WeightsOrigin("training", state.global_step), eval_strategy), state
        )

    def _train_hooks(self, user_hooks: HookList) -> HookList:
        config = self._config
        hooks: list[Hook] = []
        if config.log_step_count_steps is not None:
            hooks.append(LoggingTensorHook({"loss": "loss", "step": "step"}, every_n_iter=config.log_step_count_steps))
            hooks.append(StepCounterHook(every_n_steps=config.log_step_count_steps))
        return HookList([*hooks, *user_hooks.hooks], config=config)

    def _checkpointer(
        self,
        strategy: Strategy,
        saving_listeners: Iterable[CheckpointSaverListener] | None,
        module: torch.nn.Module,
        evaluation: InLoopEvaluation | None,
    ) -> Checkpointer | None:
        config = self._config
        listeners = list(saving_listeners or ())
        for listener in listeners:
            if not isinstance(listener, CheckpointSaverListener):
                raise TypeError(f"saving_listeners must be CheckpointSaverListener instances; received {listener!r}.")
        if config.save_checkpoints_steps is None and config.save_checkpoints_secs is None:
            if listeners:
                raise ValueError("saving_listeners were given but checkpoints are disabled in RunConfig.")
            logger.warning("Checkpoints are disabled (save_checkpoints_steps and save_checkpoints_secs are None).")
            return None
        if not strategy.lockstep and not strategy.is_chief:
            return None  # a parameter-server worker: the chief alone saves, the variables gathered from the ps
        for listener in listeners:
            listener.begin()
        # Several processes (or sharded parameters) write through torch.distributed.checkpoint, each rank its share.
        sharded = strategy.num_replicas > 1 or holds_shards(module)
        asynchronous = config.async_checkpoint
        if asynchronous and evaluation is not None and evaluation.evaluates_during_training:
            # Each evaluation marks and exports the checkpoint of its step: it must be on disk first.
            logger.info("async_checkpoint: saves are synchronous while train_and_evaluate evaluates during training.")
            asynchronous = False
        timeout = getattr(strategy, "timeout_seconds", None)
        return Checkpointer(
            self._store,
            strategy,
            listeners=listeners,
            sharded=sharded,
            asynchronous=asynchronous,
            timeout=None if timeout is None else datetime.timedelta(seconds=timeout),
        )

    def _build_parts(self, module: torch.nn.Module, state: TrainState, strategy: Strategy) -> TrainingParts:
        """The run's stateful parts: the model, and the optimizer, scheduler and scaler built for it."""
        call = self._model.argument[0]
        assert self._optimizer_factory is not None  # train() refuses to start without one
        optimizer: torch.optim.Optimizer = checked_factory_result(
            call_factory(self._optimizer_factory, module.parameters(), self._params),
            f"{call}(optimizer=...)",
            "optimizer",
            "a torch.optim.Optimizer over the parameters it received",
            lambda built: isinstance(built, torch.optim.Optimizer),
        )
        optimizer = strategy.wrap_optimizer(optimizer, module)  # parameter servers: steps applied on the ps
        parts = TrainingParts(model=module, optimizer=optimizer, train_state=state)
        if self._scheduler_factory is not None:
            parts.lr_scheduler = checked_factory_result(
                call_factory(self._scheduler_factory, optimizer, self._params),
                f"{call}(lr_scheduler=...)",
                "lr_scheduler",
                "a learning-rate scheduler over the optimizer it received (a torch.optim.lr_scheduler."
                "LRScheduler, or an object with step, state_dict and load_state_dict)",
                is_scheduler,
            )
        if self._config.mixed_precision == "fp16":
            parts.grad_scaler = torch.amp.GradScaler(strategy.device.type)
        return parts

    def _resume_input(
        self,
        input_source: InputSource,
        parts: TrainingParts,
        position: dict[str, Any] | None,
        checkpoint: Checkpoint | None,
        num_replicas: int,
    ) -> None:
        if checkpoint is None:
            return
        if parts.input_source is None:
            logger.warning(
                "The input_fn returned a %s, which cannot resume: it restarts from its beginning at global step %d. "
                "For exact resume return te.numpy_input_fn's, te.pandas_input_fn's or te.dataset_input_fn's input, "
                "a torchestimator.data.TFRecordDataset or TFRecordLoader, or any iterable with state_dict and "
                "load_state_dict.",
                type(input_source).__name__,
                checkpoint.step,
            )
        elif position is not None:
            saved_replicas = len(replica_states(checkpoint))
            try:
                parts.input_source.load_state_dict(position)
            except ValueError as error:
                if saved_replicas == num_replicas:
                    raise
                # A per-replica position (a TFRecord shard's) means nothing to a different number of replicas.
                raise CheckpointError(
                    f"{checkpoint.path} was written by {saved_replicas} replica(s), each with its own input position, "
                    f"and this run has {num_replicas}: the input cannot resume ({error}). Resume with "
                    f"{saved_replicas} replica(s); or use an input whose position is global (te.numpy_input_fn, "
                    "te.pandas_input_fn); or train in a new model_dir with warm_start_from="
                    f"{checkpoint.path!r} (weights only, the input starts over)."
                ) from error
            logger.info("Input resumes at %s.", describe_position(parts.input_source, position))
            logger.debug("Input resumes at (the whole position) %s.", position)

    def _prepare_model_dir(self, step: int) -> None:
        """Creates model_dir, clears what killed runs left there, checks it takes writes, records the settings."""
        # On a store one name for every writer: a probe left by a run killed before removing it is replaced and
        # removed by the next run's, where a per-writer name would stay for good (no listing looks for it).
        probe = filesystems.join(
            self._model_dir,
            ".write-probe" if filesystems.is_url(self._model_dir) else temporary_prefix("write-probe") + "check",
        )
        writing = self._model_dir
        try:
            filesystems.makedirs(self._model_dir)
            self._store.remove_leftovers()
            protect_recorded_best(self._model_dir, self._store)  # before any save's retention
            writing = probe
            if filesystems.is_url(probe):  # a missing bucket, no permission or bad credentials: now, not at a save
                filesystems.write_bytes(probe, b"ok")
            else:
                with open(probe, "wb") as handle:
                    handle.write(b"ok")
            for name, payload in (("params.json", self._params), ("run_config.json", self._config.to_json_dict())):
                writing = filesystems.join(self._model_dir, name)
                filesystems.write_bytes(writing, json.dumps(payload, indent=2, sort_keys=True, default=repr).encode())
        except OSError as error:
            if is_no_room(error):
                raise DiskFullError(
                    error,
                    path=writing,
                    what=f"the run's settings before training from step {step}",
                    advice="Free some space (or choose another model_dir) and rerun.",
                ) from error
            if filesystems.is_url(self._model_dir):
                raise type(error)(
                    error.errno,
                    f"model_dir {self._model_dir} cannot be written, so training does not "
                    f"start: {error.strerror or error}. Check that the bucket exists, the credentials "
                    "and their permission to write there, and the endpoint.",
                    writing,
                ) from error
            raise PermissionError(
                f"model_dir {self._model_dir!r} is not writable ({error.strerror}: {writing}). Choose another model_dir."
            ) from error
        finally:
            try:
                filesystems.remove(probe)
            except OSError:
                pass

    # -- evaluate and predict ------------------------------------------------

    def evaluate(
        self,
        input_fn: Callable[..., Iterable[Any]],
        steps: int | None = None,
        hooks: Iterable[Hook] | None = None,
        checkpoint_path: str | None = None,
        name: str | None = None,
    ) -> dict[str, Any]:
        """Evaluates over the whole input (or `steps` batches); returns every metric, loss and global_step."""
        if steps is not None:
            check_step_count("Estimator.evaluate", "steps", steps)
        check_declared(input_fn, "input_fn", INPUT_FN_ARGS)
        HookList(hooks or ())  # a wrong hook fails before any checkpoint is read
        show_summaries()
        bundle = self.inference_bundle(checkpoint_path, mode=ModeKeys.EVAL, input_fn=input_fn)
        results = bundle.evaluate(input_fn, steps=steps, hooks=hooks, name=name)
        if bundle.strategy.is_chief:
            log_summary(describe_evaluation(bundle.weights, self._model_dir, results, name))
        return results

    def predict(
        self,
        input_fn: Callable[..., Iterable[Any]],
        predict_keys: str | list[str] | None = None,
        hooks: Iterable[Hook] | None = None,
        checkpoint_path: str | None = None,
        yield_single_examples: bool = True,
    ) -> Iterator[Any]:
        """Yields predictions (numpy) per example, or per batch with yield_single_examples=False."""
        if isinstance(predict_keys, str):
            predict_keys = [predict_keys]
        check_declared(input_fn, "input_fn", INPUT_FN_ARGS)
        hook_list = HookList(hooks or ())
        show_summaries()  # predict has no summary line; its warnings look like train's and evaluate's
        bundle = self.inference_bundle(checkpoint_path, mode=ModeKeys.PREDICT, input_fn=input_fn)
        state = TrainState(global_step=bundle.global_step, mode=ModeKeys.PREDICT)
        hook_list.begin(state)
        run = EvalRun(
            strategy=bundle.strategy,
            module=bundle.module,
            call_model_fn=bundle.call_model_fn,
            hooks=hook_list,
            state=state,
            input_source=bundle.call_input_fn(input_fn, ModeKeys.PREDICT, bundle.strategy),
            steps=None,
            progress_bar=self._config.progress_bar,
            mixed_precision_config=self._config,
        )
        yield from predict_loop(run, predict_keys, yield_single_examples)

    def inference_bundle(
        self,
        checkpoint_path: str | None = None,
        *,
        mode: str = ModeKeys.PREDICT,
        device: torch.device | str | None = None,
        require_weights: bool = False,
        input_fn: Callable[..., Iterable[Any]] | None = None,
    ) -> InferenceBundle:
        """The built module holding the weights to evaluate, predict with or export, and how to call model_fn.

        Weights: ``checkpoint_path``, else the newest checkpoint, else those trained or warm-started in this
        process, else the warm-start source, else fresh ones (refused with ``require_weights``). While train()
        runs (a hook, an exporter), the bundle holds a copy of the live module: training's weights and
        train/eval mode are never changed by it. ``input_fn`` (the one about to be evaluated or predicted) gives
        lazy layers their shapes when nothing else does before a warm start.
        """
        strategy = (
            self._inference_strategy(mode) if device is None else OneDeviceStrategy(device, warn_if_launched=False)
        )
        strategy.setup()
        module, current = self._model.on(strategy.device)
        if (
            require_weights
            and checkpoint_path is None
            and self.latest_checkpoint() is None
            and (self._model.warm_start is None and not current.in_process)
        ):
            self._raise_if_all_checkpoints_damaged()
            raise ValueError(
                f"Couldn't find trained model at {self._model_dir}: it has no checkpoint, no weights were trained in "
                "this process and the Estimator has no warm_start_from. Train first, pass checkpoint_path=..., or set "
                "warm_start_from."
            )
        give_shapes = None
        if input_fn is not None:
            declared = check_declared(input_fn, "input_fn", INPUT_FN_ARGS)

            def give_shapes(plain: torch.nn.Module) -> None:
                materialize_lazy_layers(
                    plain,
                    lambda: call_input_fn(input_fn, declared, mode, strategy, self._params, self._config, warn=False),
                    model_fn_caller(self._model_fn, self._model_fn_args, self._params, self._config),
                    mode,
                    strategy.device,
                )

        weights = self._model.for_inference(module, current, checkpoint_path, give_shapes)
        return self._bundle(module, weights, strategy)

    def _bundle(self, module: torch.nn.Module, weights: WeightsOrigin, strategy: Strategy) -> InferenceBundle:
        return InferenceBundle(
            module=module,
            call_model_fn=model_fn_caller(self._model_fn, self._model_fn_args, self._params, self._config),
            weights=weights,
            strategy=strategy,
            call_input_fn=input_caller(self._params, self._config),
            config=self._config,
            eval_dir=self.eval_dir,
        )

    def _inference_strategy(self, mode: str) -> Strategy:
        """Evaluation is sharded across the training replicas; predict runs whole in every process,
        so each caller gets every prediction (as tf.estimator's predict, which never distributed)."""
        config = self._config
        distributed = config.eval_distribute or config.train_distribute
        if mode == ModeKeys.EVAL and distributed is not None and distributed.lockstep:
            return distributed
        if distributed is not None and (distributed.is_set_up or not distributed.lockstep):
            # A parameter-server trainer evaluates alone (its group is gone after training).
            device = distributed.device if distributed.is_set_up else config.device
            return OneDeviceStrategy(device, warn_if_launched=False)
        # Inference in one process of a launched run is legitimate (it writes nothing): only training refuses.
        return OneDeviceStrategy(config.device, warn_if_launched=False)

    @accepts_tf_keywords("Estimator.export_saved_model")  # TF's serving_input_receiver_fn=; as_text= refused
    def export_saved_model(
        self,
        export_dir_base: str,
        serving_input_receiver: Any,
        checkpoint_path: str | None = None,
        assets_extra: Mapping[str, str] | None = None,
        as_onnx: bool = False,
        warmup_requests: Any = None,
    ) -> str:
        """Writes `export_dir_base/<version>/` (torch.export program, signature.json, metadata); returns its path.

        Uses `checkpoint_path`, else the latest checkpoint, else the warm-start source; `warmup_requests` become
        TF Serving's warm-up file (export/warmup.py). After a train() of several replicas only replica 0 writes;
        the other replicas that call it wait for that version and return its path (export/replicas.py).
        """
        from torchestimator.export import export_saved_model

        if self._replica_exports is not None:
            return self._replica_exports.export(
                self,
                export_dir_base,
                serving_input_receiver,
                checkpoint_path=checkpoint_path,
                assets_extra=assets_extra,
                as_onnx=as_onnx,
                warmup_requests=warmup_requests,
            )
        return export_saved_model(
            self,
            export_dir_base,
            serving_input_receiver,
            checkpoint_path=checkpoint_path,
            assets_extra=assets_extra,
            as_onnx=as_onnx,
            warmup_requests=warmup_requests,
        )

    def warm_start_report(self) -> WarmStartPlan:
        """What warm_start_from would load, from where, with which conversion, and what stays fresh (a dry run)."""
        settings = self._model.warm_start
        if settings is None:
            raise ValueError("This Estimator has no warm_start_from to report on.")
        module = self._model.new_module()
        refuse_uninitialized(module, "warm_start_report")
        return plan_warm_start(module, settings)


def _refuse_non_training_task(*, serves_variables: bool) -> None:
    """As tf.estimator's train: an evaluator or ps task of TF_CONFIG does not train (it would write model_dir
    beside the chief as a group of its own); under parameter servers a ps task's train serves."""
    task_type = cluster_from_tf_config().task_type
    if task_type == EVALUATOR or (task_type == PS and not serves_variables):
        raise ConfigError(
            f"Estimator.train was called in TF_CONFIG's {task_type!r} task, which does not train: it would train "
            "alone and write the chief's model_dir. Call te.train_and_evaluate in every task (the evaluator task "
            "then evaluates the chief's checkpoints), or train only in the chief and worker tasks.",
            field="TF_CONFIG",
            value=task_type,
        )


@contextlib.contextmanager
def _deterministic_algorithms(enabled: bool) -> Iterator[None]:
    """torch's deterministic algorithms for one train call (RunConfig.deterministic), then the caller's setting back.

    The switch is process-wide in torch; left on, it would change how the rest of the
    process computes (evaluation, the user's own code, other estimators).
    """
    if not enabled:
        yield
        return
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
    )
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.benchmark = previous[2]
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
