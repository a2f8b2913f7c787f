"""The train, eval and predict loops: one of each, with the framework's policy in plain sight.

The Estimator builds everything (strategy, model, optimizer, restore,
hooks) and hands a TrainingRun here. Each loop reads top to bottom:
next batch -> model_fn -> step -> hooks -> summaries -> checkpoint -> stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from torchestimator.calling import batch_length, split_batch, to_device
from torchestimator.config import MIXED_PRECISION_DTYPES, RunConfig
from torchestimator.finetune import apply_frozen_modes
from torchestimator.hooks.base import HookList, RunContext
from torchestimator.hooks.triggers import Every
from torchestimator.persistence import Checkpointer, NanLossDuringTrainingError
from torchestimator.progress import Progress
from torchestimator.spec import EstimatorSpec, ModeKeys, validate_spec
from torchestimator.state import TrainState

logger = logging.getLogger("torchestimator")


@dataclasses.dataclass
class TrainingRun:
    """Everything one train call needs, built by the Estimator."""

    config: RunConfig
    strategy: Any
    module: torch.nn.Module
    wrapped: torch.nn.Module
    call_model_fn: Callable[..., EstimatorSpec]
    training_objects: dict[str, Any]
    hooks: HookList
    state: TrainState
    checkpointer: Checkpointer | None
    summary_writer: Any
    input_source: Any
    last_step: int | None
    batches: _Batches | None = None
    autocast: Callable[[], Any] | None = None


class _InterruptFlag:
    """Turns the first Ctrl-C into a flag checked between steps; a second one interrupts at once."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.raised = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.raised:
            raise KeyboardInterrupt
        self.raised = True
        logger.warning("Interrupted: finishing this step and writing a checkpoint. Press Ctrl-C again to abort.")

    def __enter__(self) -> _InterruptFlag:
        if self.enabled:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            signal.signal(signal.SIGINT, self._previous)


def _agree(strategy: Any, flags: list[bool]) -> list[bool]:
    """One small all-reduce per step so every replica stops and saves together."""
    if strategy.num_replicas == 1 or not dist.is_initialized():
        return flags
    tensor = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=strategy.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(value) for value in tensor.tolist()]


def _autocast_factory(config: RunConfig, device: torch.device) -> Callable[[], Any] | None:
    """A maker of autocast contexts for mixed precision, or None when running in full precision."""
    if config.mixed_precision is None:
        return None
    dtype = getattr(torch, MIXED_PRECISION_DTYPES[config.mixed_precision])
    return lambda: torch.autocast(device.type, dtype=dtype)


def _autocast(config: RunConfig, device: torch.device) -> contextlib.AbstractContextManager:
    factory = _autocast_factory(config, device)
    return _NO_CONTEXT if factory is None else factory()


class _Batches:
    """Next (features, labels) on the device, counting batches for error messages."""

    def __init__(self, iterable: Any, device: torch.device) -> None:
        self.iterator: Iterator[Any] = iter(iterable)
        self.device = device
        self.index = 0

    def next(self) -> tuple[Any, Any]:
        batch = next(self.iterator)
        if type(batch) is tuple and len(batch) == 2:  # the common case, without the checks' cost
            features, labels = batch
        else:
            features, labels = split_batch(batch, self.index)
        self.index += 1
        if self.device.type == "cpu":
            return features, labels
        return to_device(features, self.device), to_device(labels, self.device)


_NO_CONTEXT = contextlib.nullcontext()  # reusable; saves building one per step


def _micro_step(run: TrainingRun, accumulation: int, last: bool) -> tuple[EstimatorSpec, torch.Tensor | None]:
    """Forward and backward on one batch; returns the spec and the detached loss (None after a train_op)."""
    features, labels = run.batches.next()
    sync = _NO_CONTEXT if last else run.strategy.no_sync(run.wrapped)
    with sync:
        with run.autocast() if run.autocast is not None else _NO_CONTEXT:
            spec = validate_spec(run.call_model_fn(run.wrapped, features, labels, ModeKeys.TRAIN), ModeKeys.TRAIN)
        if spec.train_op is not None:
            if accumulation > 1:
                raise ValueError("EstimatorSpec.train_op cannot be combined with gradient_accumulation_steps > 1.")
            spec.train_op()
            return spec, None
        loss = spec.loss if spec.loss.dim() == 0 else spec.loss.reshape(())
        if accumulation > 1:
            loss = loss / accumulation
        scaler = run.training_objects["grad_scaler"]
        (scaler.scale(loss) if scaler is not None else loss).backward()
    return spec, loss.detach()


def _train_step(run: TrainingRun) -> tuple[EstimatorSpec, torch.Tensor]:
    """One optimizer step over gradient_accumulation_steps micro-batches; StopIteration when input ends."""
    accumulation = run.config.gradient_accumulation_steps
    spec, total_loss = _micro_step(run, accumulation, accumulation == 1)
    if total_loss is None:  # the spec's train_op did the whole step
        return spec, spec.loss.detach()
    for micro_step in range(1, accumulation):
        spec, loss = _micro_step(run, accumulation, micro_step == accumulation - 1)
        total_loss = total_loss + loss
    optimizer = run.training_objects["optimizer"]
    scaler = run.training_objects["grad_scaler"]
    if run.config.clip_grad_norm is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(run.module.parameters(), run.config.clip_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if run.training_objects["lr_scheduler"] is not None:
        run.training_objects["lr_scheduler"].step()
    return spec, total_loss


def _adopt_spec_hooks(hooks: HookList, spec_hooks: tuple[Any, ...], state: TrainState) -> None:
    """Hooks from the first batch's EstimatorSpec join the run (model_fn runs per batch, so later
    batches' hook objects would be new copies of the same hooks)."""
    for hook in spec_hooks:
        hooks.add(hook)
        hook.begin(state)
        hook.after_restore(state)


def _input_position(source: Any) -> dict[str, Any] | None:
    return source.state_dict() if hasattr(source, "state_dict") and hasattr(source, "load_state_dict") else None


def _write_train_summaries(run: TrainingRun, loss: torch.Tensor, step: int) -> None:
    writer = run.summary_writer
    writer.scalar("loss", float(loss), step)
    for index, group in enumerate(run.training_objects["optimizer"].param_groups):
        tag = "learning_rate" if index == 0 else f"learning_rate/group_{index}"
        writer.scalar(tag, float(group["lr"]), step)


def train_loop(run: TrainingRun) -> TrainState:
    """Runs steps until last_step, the end of input, a stop request or Ctrl-C; returns the final state."""
    state, config, strategy = run.state, run.config, run.strategy
    run.batches = _Batches(run.input_source, strategy.device)
    run.autocast = _autocast_factory(config, strategy.device)
    checkpointer = run.checkpointer
    checkpoint_every = None
    if checkpointer is not None:
        checkpoint_every = Every(steps=config.save_checkpoints_steps, secs=config.save_checkpoints_secs)
        checkpoint_every.start(state.global_step)
    summary_every = Every(steps=config.save_summary_steps) if config.save_summary_steps else None
    context = RunContext(state, is_chief=strategy.is_chief, summary_writer=run.summary_writer)
    pending_listeners: list[Any] = []
    context._request_checkpoint = pending_listeners.append
    run.hooks.after_restore(state)
    # The framework owns the mode: TRAIN updates BatchNorm statistics, EVAL and PREDICT never do.
    run.module.train()
    apply_frozen_modes(run.module)  # frozen BatchNorm layers keep their statistics
    total = None if run.last_step is None else run.last_step
    progress = Progress("train", total=total, initial=state.global_step, enabled=config.progress_bar and strategy.is_chief)
    steps_this_call = 0
    several_replicas = strategy.num_replicas > 1
    with _InterruptFlag(config.checkpoint_on_interrupt) as interrupt, progress:
        while run.last_step is None or state.global_step < run.last_step:
            run.hooks.before_step(context)
            try:
                spec, loss = _train_step(run)
            except StopIteration:
                logger.info("Input ended after %d steps in this call (global step %d).", steps_this_call, state.global_step)
                break
            state.global_step += 1
            steps_this_call += 1
            if steps_this_call == 1:
                _adopt_spec_hooks(run.hooks, spec.training_hooks, state)
            # The NaN guard needs the loss on the host each step (one sync; free on CPU).
            state.last_loss = float(loss)
            context._set_step_outputs(spec, loss=loss, loss_value=state.last_loss)
            run.hooks.after_step(context)
            if summary_every is not None and strategy.is_chief and summary_every.should_fire(state.global_step):
                summary_every.mark(state.global_step)
                _write_train_summaries(run, loss, state.global_step)
            due = checkpoint_every is not None and checkpoint_every.should_fire(state.global_step)
            # Seconds-based triggers differ between processes: the chief's clock decides.
            due_here = due and (strategy.is_chief or config.save_checkpoints_steps is not None)
            flags = [context.stop_requested, interrupt.raised, due_here or bool(pending_listeners),
                     not math.isfinite(context._loss_value)]
            stop, interrupted, save, not_finite = _agree(strategy, flags) if several_replicas else flags
            if not_finite:  # on any replica: all of them stop here, before anything is saved
                raise NanLossDuringTrainingError(
                    f"NaN or infinite loss at step {state.global_step}; training stopped and no checkpoint was "
                    f"written for this step. The last good checkpoint is "
                    f"{checkpointer.last_saved_path if checkpointer and checkpointer.last_saved_path else 'the newest in model_dir'}."
                )
            if save or (interrupted and checkpointer is not None):
                if checkpointer is None:
                    raise ValueError("A hook asked for a checkpoint but checkpoints are disabled in RunConfig.")
                checkpoint_every.mark(state.global_step)
                stop |= checkpointer.save(state, run.module, run.training_objects, _input_position(run.input_source),
                                          [listener for group in pending_listeners for listener in group])
                pending_listeners.clear()
            progress.update(state.global_step, loss=context._loss_value)
            if stop or interrupted:
                break
        if checkpointer is not None and checkpointer.last_saved_step != state.global_step and steps_this_call:
            checkpointer.save(state, run.module, run.training_objects, _input_position(run.input_source))
    if interrupt.raised:
        raise KeyboardInterrupt(f"Training interrupted at step {state.global_step}; the checkpoint of that step was written.")
    if steps_this_call == 0:
        logger.warning("Training made no steps: the input was empty or max_steps was already reached.")
    elif context._loss_tensor is not None:
        logger.info("Loss for final step: %s.", float(context._loss_tensor))
    run.hooks.end(state)
    return state


@dataclasses.dataclass
class EvalRun:
    """Everything one evaluate or predict call needs."""

    strategy: Any
    module: torch.nn.Module
    call_model_fn: Callable[..., EstimatorSpec]
    hooks: HookList
    state: TrainState
    input_source: Any
    steps: int | None
    progress_bar: bool | None
    mixed_precision_config: RunConfig


def eval_loop(run: EvalRun, accumulators: Any) -> dict[str, Any]:
    """Evaluates until `steps` batches or the end of input; returns metrics, loss and global_step."""
    strategy, state = run.strategy, run.state
    batches = _Batches(run.input_source, strategy.device)
    context = RunContext(state, is_chief=strategy.is_chief)
    loss_sum = torch.zeros((), dtype=torch.float64, device=strategy.device)
    example_count = torch.zeros((), dtype=torch.float64, device=strategy.device)
    run.module.eval()
    run.hooks.after_restore(state)
    batches_seen = 0
    with torch.no_grad(), Progress("evaluate", total=run.steps, enabled=run.progress_bar and strategy.is_chief) as progress:
        while run.steps is None or batches_seen < run.steps:
            run.hooks.before_step(context)
            try:
                features, labels = batches.next()
            except StopIteration:
                break
            with _autocast(run.mixed_precision_config, strategy.device):
                spec = validate_spec(run.call_model_fn(run.module, features, labels, ModeKeys.EVAL), ModeKeys.EVAL)
            # The loss is weighted by batch size, so it is the per-example mean even with a short last batch.
            rows = batch_length(labels if labels is not None else features)
            rows = 1 if rows is None else rows
            if rows:  # a replica's share of a short last batch may be empty; its loss is NaN
                loss_sum += spec.loss.detach().double().reshape(()) * rows
                example_count += rows
            if spec.eval_metric_ops:
                accumulators.update(spec.eval_metric_ops)
            batches_seen += 1
            if batches_seen == 1:
                _adopt_spec_hooks(run.hooks, spec.evaluation_hooks, state)
            context._set_step_outputs(spec, features, labels)
            run.hooks.after_step(context)
            progress.update(batches_seen)
            if context.stop_requested:
                break
    if strategy.num_replicas > 1 and dist.is_initialized():
        totals = torch.stack([loss_sum, example_count])
        dist.all_reduce(totals)
        loss_sum, example_count = totals[0], totals[1]
    if float(example_count) == 0:
        raise ValueError("evaluate's input_fn yielded no batches; there is nothing to evaluate.")
    results = accumulators.compute()
    results["loss"] = float(loss_sum / example_count)
    results["global_step"] = state.global_step
    run.hooks.end(state)
    return results


def predict_loop(run: EvalRun, predict_keys: list[str] | None, yield_single_examples: bool) -> Iterator[Any]:
    """Yields predictions per example (or per batch), filtered to predict_keys."""
    strategy, state = run.strategy, run.state
    batches = _Batches(run.input_source, strategy.device)
    context = RunContext(state, is_chief=strategy.is_chief)
    run.module.eval()
    run.hooks.after_restore(state)
    with Progress("predict", total=None, enabled=run.progress_bar and strategy.is_chief) as progress:
        while True:
            run.hooks.before_step(context)
            try:
                features, _ = batches.next()
            except StopIteration:
                break
            with torch.no_grad(), _autocast(run.mixed_precision_config, strategy.device):
                spec = validate_spec(run.call_model_fn(run.module, features, None, ModeKeys.PREDICT), ModeKeys.PREDICT)
            predictions = _select_keys(spec.predictions, predict_keys)
            if batches.index == 1:
                _adopt_spec_hooks(run.hooks, spec.prediction_hooks, state)
            context._set_step_outputs(spec, features, None)
            run.hooks.after_step(context)
            progress.update(batches.index)
            if yield_single_examples:
                yield from _split_examples(predictions)
            else:
                yield _to_numpy(predictions)
            if context.stop_requested:
                break
    run.hooks.end(state)


def _select_keys(predictions: Any, predict_keys: list[str] | None) -> Any:
    if predict_keys is None:
        return predictions
    if not isinstance(predictions, Mapping):
        raise ValueError(f"predict_keys {predict_keys} was given but model_fn's predictions are not a dict.")
    selected = {key: value for key, value in predictions.items() if key in predict_keys}
    if not selected:
        raise ValueError(f"None of predict_keys {predict_keys} is among the predictions {sorted(predictions)}.")
    return selected


def _to_numpy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _to_numpy(item) for key, item in value.items()}
    return value.detach().cpu().numpy()


def _split_examples(predictions: Any) -> Iterator[Any]:
    arrays = _to_numpy(predictions)
    if not isinstance(arrays, dict):
        yield from arrays
        return
    lengths = {key: (array.shape[0] if array.ndim else None) for key, array in arrays.items()}
    distinct = set(lengths.values())
    if len(distinct) != 1 or None in distinct:
        raise ValueError(
            f"With yield_single_examples=True every prediction must share its first dimension; found {lengths}. "
            "Use yield_single_examples=False to get whole batches."
        )
    for row in range(distinct.pop()):
        yield {key: array[row] for key, array in arrays.items()}
