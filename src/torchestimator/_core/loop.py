"""The training loop, with the framework's policy in plain sight.

The Estimator builds everything (strategy, parts, restore, hooks) and hands a
TrainingRun here. Each step reads top to bottom: next batch -> model_fn ->
backward -> optimizer -> hooks -> summaries -> agree (stop, save, NaN) ->
checkpoint -> evaluation -> stop. Every collective goes through the Strategy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import torch

from torchestimator._core.agreement import ReplicaRoster
from torchestimator._core.batches import AutocastFactory, DeviceBatches, InputSource, autocast_factory
from torchestimator._core.config import RunConfig
from torchestimator._core.eval_loops import adopt_spec_hooks
from torchestimator._core.finetune import apply_frozen_modes
from torchestimator._core.progress import Progress
from torchestimator._core.spec import EstimatorSpec, ModeKeys, TrainSpecCheck
from torchestimator._io.console import TrainOutcome
from torchestimator._train_state import TrainState, rng_preserved
from torchestimator.checkpoint.checkpointer import Checkpointer
from torchestimator.checkpoint.parts import TrainingParts
from torchestimator.errors import CheckpointError, NanLossDuringTrainingError
from torchestimator.hooks.base import CheckpointSaverListener, HookList, RunContext
from torchestimator.hooks.triggers import Every

if TYPE_CHECKING:
    from torchestimator._core.inference import InferenceBundle
    from torchestimator._io.summary import SummaryWriter
    from torchestimator.distribute.strategy import Strategy

logger = logging.getLogger("torchestimator")


class InLoopEvaluation(Protocol):
    """Evaluations the loop runs on the live module (train_and_evaluate's; see _policy/train_and_evaluate.py)."""

    evaluates_during_training: bool
    """False for one that only answers ``begin`` (trainers beside an evaluator task): the Estimator then builds
    no evaluation copy of sharded weights and keeps asynchronous saves."""

    def begin(self, bundle: InferenceBundle, state: TrainState) -> str | None:
        """Before step one, with the live module's InferenceBundle: why training is over already (an earlier
        run's evaluations say stop), or None to train."""

    def wants_checkpoint(self, step: int) -> bool:
        """An evaluation is due at ``step`` by step count: the loop writes a checkpoint there first."""

    def due(self, step: int, saved: bool) -> bool:
        """Whether to evaluate now; ``saved``: a checkpoint of ``step`` was just written. Same on every replica."""

    def evaluate(self, step: int, *, final: bool) -> bool:
        """Evaluates what is due on the live module; True asks training to stop (early stopping)."""

    def training_ended(self, outcome: TrainOutcome) -> None:
        """What the train call did (also when it was skipped): its summary line is the evaluation's caller's."""


@dataclasses.dataclass
class TrainingRun:
    """Everything one train call needs, built by the Estimator."""

    config: RunConfig
    strategy: Strategy
    parts: TrainingParts
    wrapped: torch.nn.Module
    call_model_fn: Callable[..., EstimatorSpec]
    hooks: HookList
    checkpointer: Checkpointer | None
    summary_writer: SummaryWriter
    input_source: InputSource
    """What input_fn returned: the batches this call trains on."""
    last_step: int | None
    evaluation: InLoopEvaluation | None = None
    resumed_from: str | None = None
    """The checkpoint this call restored, for its summary line; None for fresh, warm-started or in-process weights."""
    ended_before_start: str | None = None
    """Why no step is to be taken, said before the loop starts (the evaluation's begin: a rerun after early
    stopping); None to train."""

    @property
    def state(self) -> TrainState:
        return self.parts.train_state


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopOutcome:
    """What one train call's loop did; ``train_loop`` returns it."""

    state: TrainState
    ended_by: str | None
    """Why training stopped before last_step, in words ("the input ended", "early stopping"); None otherwise."""
    input_ended_first: bool
    """The input ended before this call's first step (empty, or resumed at its end)."""


class _InterruptFlag:
    """Turns the first Ctrl-C into a flag checked between steps; a second one interrupts at once."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.raised = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
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


class _HostLossWatch:
    """Finds the first step whose loss is NaN or infinite, reading each loss on the host.

    Used on the CPU, where reading a loss costs no device synchronisation.
    """

    def __init__(self) -> None:
        self._first_bad: int | None = None

    def observe(self, loss: torch.Tensor, step: int) -> None:
        if self._first_bad is None and not math.isfinite(loss.item()):
            self._first_bad = step

    def flag(self) -> bool:
        return self._first_bad is not None

    def first_bad_step(self) -> int | None:
        return self._first_bad


class _DeviceLossWatch:
    """The same on an accelerator, without a host read per step: the first bad step stays on the device,
    and the loop reads it only where it synchronises anyway (logging, checkpoints, stop agreement, the end)."""

    def __init__(self, device: torch.device) -> None:
        self._first_bad = torch.full((), -1, dtype=torch.int64, device=device)

    def observe(self, loss: torch.Tensor, step: int) -> None:
        newly_bad = torch.logical_and(torch.logical_not(torch.isfinite(loss)), self._first_bad < 0)
        self._first_bad = torch.where(newly_bad, step, self._first_bad)

    def flag(self) -> torch.Tensor:
        return self._first_bad >= 0

    def first_bad_step(self) -> int | None:
        step = int(self._first_bad)
        return step if step >= 0 else None


def _loss_watch(device: torch.device) -> _HostLossWatch | _DeviceLossWatch:
    return _HostLossWatch() if device.type == "cpu" else _DeviceLossWatch(device)


def _micro_step(
    run: TrainingRun,
    batches: DeviceBatches,
    autocast: AutocastFactory | None,
    accumulation: int,
    last: bool,
    check_spec: TrainSpecCheck,
) -> tuple[EstimatorSpec, torch.Tensor | None]:
    """Forward and backward on one batch; returns the spec and the loss (None after a train_op; see
    _forward_backward)."""
    features, labels = batches.next()
    if last:  # the common case (no accumulation): no gradient-sync context to enter
        return _forward_backward(run, features, labels, autocast, accumulation, check_spec)
    with run.strategy.no_sync(run.wrapped):
        return _forward_backward(run, features, labels, autocast, accumulation, check_spec)


def _forward_backward(
    run: TrainingRun,
    features: Any,
    labels: Any,
    autocast: AutocastFactory | None,
    accumulation: int,
    check_spec: TrainSpecCheck,
) -> tuple[EstimatorSpec, torch.Tensor | None]:
    """model_fn and backward on one batch. The loss returned is the spec's own tensor when there is no
    accumulation (no detach per step: the spec holds it anyway, and it is read with .item(), which does not
    track gradients); a micro-batch's share is detached, since the shares are summed."""
    if autocast is None:
        spec = run.call_model_fn(run.wrapped, features, labels, ModeKeys.TRAIN)
    else:
        with autocast():
            spec = run.call_model_fn(run.wrapped, features, labels, ModeKeys.TRAIN)
    spec = check_spec(spec)  # in full at step one, then a few identity tests unless the spec changed (spec.py)
    if spec.train_op is not None:
        if accumulation > 1:
            raise ValueError("EstimatorSpec.train_op cannot be combined with gradient_accumulation_steps > 1.")
        spec.train_op()
        return spec, None
    loss = spec.loss
    assert loss is not None  # check_spec refuses a TRAIN spec without one
    if loss.dim() != 0:
        loss = loss.reshape(())
    if accumulation > 1:
        loss = loss / accumulation
    scaler = run.parts.grad_scaler
    # torch leaves Tensor.backward unannotated.
    (scaler.scale(loss) if scaler is not None else loss).backward()  # type: ignore[no-untyped-call]
    return spec, loss if accumulation == 1 else loss.detach()


def _train_step(
    run: TrainingRun,
    batches: DeviceBatches,
    autocast: AutocastFactory | None,
    check_spec: TrainSpecCheck,
) -> tuple[EstimatorSpec, torch.Tensor]:
    """One optimizer step over gradient_accumulation_steps micro-batches; StopIteration when input ends."""
    accumulation = run.config.gradient_accumulation_steps
    if accumulation == 1:  # the common case, one call shorter
        features, labels = batches.next()
        spec, total_loss = _forward_backward(run, features, labels, autocast, 1, check_spec)
    else:
        spec, total_loss = _micro_step(run, batches, autocast, accumulation, False, check_spec)
    if total_loss is None:  # the spec's train_op did the whole step
        assert spec.loss is not None  # check_spec refuses a TRAIN spec without one
        return spec, spec.loss.detach()
    for micro_step in range(1, accumulation):
        spec, loss = _micro_step(run, batches, autocast, accumulation, micro_step == accumulation - 1, check_spec)
        assert loss is not None  # a train_op with accumulation raised in _forward_backward
        total_loss = total_loss + loss
    parts = run.parts
    optimizer, scaler = parts.optimizer, parts.grad_scaler
    if run.config.clip_grad_norm is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(parts.model.parameters(), run.config.clip_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if parts.lr_scheduler is not None:
        # TrainingParts types it Stateful (its checkpoint role); Estimator._build_parts checked it also steps.
        parts.lr_scheduler.step()  # type: ignore[attr-defined]
    return spec, total_loss


class _Schedules:
    """When this run checkpoints, writes summaries and logs: the steps every replica agrees on."""

    def __init__(self, run: TrainingRun) -> None:
        config, step = run.config, run.state.global_step
        self.checkpoint: Every | None = None
        if run.checkpointer is not None:
            self.checkpoint = Every(steps=config.save_checkpoints_steps, secs=config.save_checkpoints_secs)
            self.checkpoint.start(step)
        self.summary = Every(steps=config.save_summary_steps) if config.save_summary_steps else None
        # Logging steps are multiples of log_step_count_steps (the built-in logging hooks fire there): the loss is
        # reduced over replicas at these steps only, and read on the host there.
        self.log_every = config.log_step_count_steps
        # Seconds-based checkpoints differ between processes: the chief's clock decides (agreed with the flags).
        self.chief_clock = config.save_checkpoints_steps is None

    @property
    def any_scheduled(self) -> bool:
        """Whether any step can be a logging or summary step (else due_at is (False, False) at every step)."""
        return self.summary is not None or bool(self.log_every)

    def due_at(self, step: int) -> tuple[bool, bool]:
        """(logging step, summary step): asked once per step, the answers passed on."""
        summary_due = self.summary is not None and self.summary.should_fire(step)
        return bool(self.log_every and step % self.log_every == 0) or summary_due, summary_due


class _TrainLoop:
    """One train call's steps; see the module docstring for the order within a step."""

    def __init__(self, run: TrainingRun) -> None:
        self.run = run
        self.state = run.state
        self.strategy = run.strategy
        self.batches = DeviceBatches(run.input_source, run.strategy.device)
        self.autocast = autocast_factory(run.config, run.strategy.device)
        self.schedules = _Schedules(run)
        self.watch = _loss_watch(run.strategy.device)
        # Asked every step: looked up once (the strategy's properties check it is set up on each call).
        self.several = run.strategy.num_replicas > 1
        self.lockstep = run.strategy.lockstep
        self.is_chief = run.strategy.is_chief
        self.watch_is_free = isinstance(self.watch, _HostLossWatch)  # the host watch costs nothing to read
        # One replica, no checkpoints, no in-loop evaluation: a step with no stop, interrupt or checkpoint request
        # has nothing to agree on or save, only the NaN guard to read (see _agree's first lines).
        self.alone_without_saves = not self.several and run.checkpointer is None and run.evaluation is None
        self.pending_listeners: list[tuple[CheckpointSaverListener, ...]] = []
        self.context = RunContext(
            self.state,
            is_chief=self.is_chief,
            summary_writer=run.summary_writer,
            on_checkpoint_request=self.pending_listeners.append,
        )
        # Dispatched from the loop itself: HookList's live lists of the hooks that override these (hooks the first
        # spec brings join them), so a step with no hook due costs an empty loop, not a call.
        self.before_step_hooks = run.hooks.overriding("before_step")
        self.after_step_hooks = run.hooks.overriding("after_step")
        self.check_spec = TrainSpecCheck()
        self.steps_this_call = 0
        self.stop_reason: str | None = None  # who stopped training when not a hook: for ended_by
        self.ended_by: str | None = run.ended_before_start  # why training stopped before last_step
        self.input_ended_first = False
        self.last_loss: torch.Tensor | None = None  # the latest step's (read with .item()), for the final loss
        self.last_loss_mean: float | None = None  # its mean over replicas, when that step was a logging step

    def run_steps(self, interrupt: _InterruptFlag, progress: Progress) -> None:
        run, state, context = self.run, self.state, self.context
        # Asked every step, so settled once: without logging or summaries no step is due for either, and a
        # progress bar that is off has nothing to update.
        due_at = self.schedules.due_at if self.schedules.any_scheduled else None
        update_progress = progress.update if progress.enabled else None
        # The global step after this replica's step: its own count, or a parameter server's count of all updates.
        next_global_step = self.strategy.next_global_step
        # ended_by set before step one: the evaluation's begin said training is over already.
        while self.ended_by is None and (run.last_step is None or state.global_step < run.last_step):
            for before_step in self.before_step_hooks:
                before_step(context)
            try:
                spec, loss = _train_step(run, self.batches, self.autocast, self.check_spec)
            except StopIteration:
                logger.info(
                    "Input ended after %d steps in this call (global step %d).", self.steps_this_call, state.global_step
                )
                self.input_ended_first = self.steps_this_call == 0
                self.ended_by = (
                    "the input ended before its first batch" if self.input_ended_first else "the input ended"
                )
                break
            state.global_step = next_global_step(state.global_step)
            self.steps_this_call += 1
            self.last_loss = loss
            if self.steps_this_call == 1:
                adopt_spec_hooks(run.hooks, spec.training_hooks, state)
            self.watch.observe(loss, state.global_step)
            logging_step, summary_due = (False, False) if due_at is None else due_at(state.global_step)
            self._report(spec, loss, logging_step, summary_due)
            stop, interrupted = self._end_step(interrupt.raised, logging_step)
            if update_progress is not None:
                update_progress(state.global_step, loss=context.loss_if_read)
            if stop and (run.last_step is None or state.global_step < run.last_step):
                self.ended_by = self.stop_reason or "a hook asked to stop"
            elif not self.lockstep and (ended := self.strategy.training_ended) is not None:
                self.ended_by, stop = ended, True
            if stop or interrupted:
                break

    def _report(self, spec: EstimatorSpec, loss: torch.Tensor, logging_step: bool, summary_due: bool) -> None:
        """Hooks and summaries for this step; at logging steps the loss is the mean over replicas."""
        run, step = self.run, self.state.global_step
        value = self.strategy.reduce_mean(loss) if self.several and logging_step else None
        self.last_loss_mean = value
        context = self.context
        context.set_step_outputs(spec, loss=loss, loss_value=value)
        for after_step in self.after_step_hooks:
            after_step(context)
        if summary_due:
            assert self.schedules.summary is not None  # due only where scheduled
            self.schedules.summary.mark(step)
            if self.is_chief:
                loss_value = context.loss
                assert loss_value is not None  # set_step_outputs above was given this step's loss
                _write_train_summaries(run, loss_value, step)
        if context.loss_if_read is not None:  # read by a hook, the logging or the summaries: the state says it too
            self.state.last_loss = context.loss_if_read

    def _end_step(self, interrupt_raised: bool, logging_step: bool) -> tuple[bool, bool]:
        """After a step's hooks: agree, then save and evaluate together; returns (stop, interrupted)."""
        agreement = self._agree(interrupt_raised, logging_step)
        if agreement is None:
            return False, False
        stop, interrupted, save = agreement
        saved = save or (interrupted and self.run.checkpointer is not None)
        if saved and self._save() and not stop:
            stop, self.stop_reason = True, "a checkpoint listener asked to stop"
        if self._evaluate_if_due(saved, stop) and not stop:
            stop, self.stop_reason = True, "early stopping"
        return stop, interrupted

    def _agree(self, interrupt_raised: bool, logging_step: bool) -> tuple[bool, bool, bool] | None:
        """(stop, interrupted, save) as every replica sees them; a non-finite loss on any replica raises on all of
        them here, before anything is saved. None: one replica with nothing to agree on, save or evaluate."""
        if self.alone_without_saves and not (interrupt_raised or self.context.stop_requested or self.pending_listeners):
            # The NaN guard is all that is left, read at its read points.
            if (self.watch_is_free or logging_step) and self.watch.flag():
                self._raise_not_finite()
            return None
        run, step, schedules = self.run, self.state.global_step, self.schedules
        evaluation = run.evaluation
        eval_wants_checkpoint = (
            evaluation is not None and run.checkpointer is not None and evaluation.wants_checkpoint(step)
        )
        due = schedules.checkpoint is not None and schedules.checkpoint.should_fire(step)
        due_here = due and (self.is_chief or not schedules.chief_clock)
        save_wanted = due_here or bool(self.pending_listeners) or eval_wants_checkpoint
        flags = [self.context.stop_requested, interrupt_raised, save_wanted]
        if self.several:
            stop, interrupted, save, not_finite = self.strategy.all_agree([*flags, self.watch.flag()])
        else:
            stop, interrupted, save = flags
            # A device watch is read only where the loop synchronises anyway.
            read_point = self.watch_is_free or stop or interrupted or save or logging_step
            not_finite = bool(self.watch.flag()) if read_point else False
        if not_finite:
            self._raise_not_finite()
        return stop, interrupted, save

    def _evaluate_if_due(self, saved: bool, stop: bool) -> bool:
        """The in-loop evaluation, when due (``saved``: a checkpoint of this step was just written); True asks
        training to stop (early stopping)."""
        run, step, evaluation = self.run, self.state.global_step, self.run.evaluation
        if evaluation is None or not evaluation.due(step, saved):
            return False
        # Final when training ends at this step anyway: max_steps, or a stop every replica agreed on.
        return self._evaluate(evaluation, final=stop or (run.last_step is not None and step >= run.last_step))

    def _save(self) -> bool:
        run = self.run
        if run.checkpointer is None:
            raise ValueError("A hook asked for a checkpoint but checkpoints are disabled in RunConfig.")
        assert self.schedules.checkpoint is not None  # scheduled whenever there is a checkpointer
        self.schedules.checkpoint.mark(self.state.global_step)
        listeners = [listener for group in self.pending_listeners for listener in group]
        self.pending_listeners.clear()
        self._agree_on_buffers()
        return run.checkpointer.save(run.parts, listeners)

    def _agree_on_buffers(self) -> None:
        """Every replica's module holds the chief's buffers, as the checkpoint will (see Strategy.broadcast_buffers)."""
        if self.several:
            self.strategy.broadcast_buffers(self.run.parts.model)

    def _evaluate(self, evaluation: InLoopEvaluation, *, final: bool) -> bool:
        """Evaluates on the live module without moving training's random streams, then back to training mode."""
        model = self.run.parts.model
        try:
            with rng_preserved():
                return evaluation.evaluate(self.state.global_step, final=final)
        finally:
            model.train()
            apply_frozen_modes(model)

    def _raise_not_finite(self) -> None:
        bad_step = self.watch.first_bad_step()  # this replica's; None when another replica's loss went bad
        checkpointer = self.run.checkpointer
        last_good = checkpointer.last_good() if checkpointer is not None else "none (checkpoints are disabled)"
        where = (
            f"at step {bad_step}" if bad_step is not None else f"on another replica by step {self.state.global_step}"
        )
        raise NanLossDuringTrainingError(
            f"NaN or infinite loss {where}; training stopped at step {self.state.global_step} and no checkpoint was "
            f"written for a step after it. The last good checkpoint is {last_good}."
        )

    def finish(self) -> None:
        """The final checkpoint (unless this step was just saved), after a last check that the loss stayed finite."""
        checkpointer, state = self.run.checkpointer, self.state
        if self.steps_this_call and (
            self.strategy.all_agree(self.watch.flag()) if self.several else bool(self.watch.flag())
        ):
            self._raise_not_finite()
        if self.steps_this_call:
            self._agree_on_buffers()  # also without a checkpoint: the module train() leaves is the chief's
        if checkpointer is not None and checkpointer.last_saved_step != state.global_step and self.steps_this_call:
            self.pending_listeners.clear()
            checkpointer.save(self.run.parts)
        if checkpointer is not None:
            checkpointer.publish_in_flight()  # here, where a replica lost during a background save is named
        if self.last_loss is not None:
            state.last_loss = self._final_loss(self.last_loss)

    def _final_loss(self, last_loss: torch.Tensor) -> float:
        """The last step's loss; with several replicas their mean: the one of its logging step, else one more
        collective, which every replica reaches here as the NaN check above (decided by the step, never by what a
        hook read on one replica only)."""
        if self.several:
            return self.last_loss_mean if self.last_loss_mean is not None else self.strategy.reduce_mean(last_loss)
        value = self.context.loss_if_read
        return last_loss.item() if value is None else value


def _write_train_summaries(run: TrainingRun, loss: float, step: int) -> None:
    writer = run.summary_writer
    writer.scalar("loss", loss, step)
    for index, group in enumerate(run.parts.optimizer.param_groups):
        tag = "learning_rate" if index == 0 else f"learning_rate/group_{index}"
        writer.scalar(tag, float(group["lr"]), step)


@contextlib.contextmanager
def _naming_lost_replicas(roster: ReplicaRoster | None, state: TrainState) -> Iterator[None]:
    """A collective that fails because another replica died becomes one ReplicaLostError that names it
    (gloo says only "Connection reset by peer [127.0.0.1]:port"), also inside a checkpoint save (a
    CheckpointError quoting gloo); other errors pass unchanged."""
    try:
        yield
    except (RuntimeError, CheckpointError) as error:
        lost = None if roster is None else roster.lost_replica_error(error, state.global_step)
        if lost is None:
            raise
        raise lost from error


def train_loop(run: TrainingRun) -> LoopOutcome:
    """Runs steps until last_step, the end of input, a stop request or Ctrl-C; returns what it did."""
    state, config, strategy = run.state, run.config, run.strategy
    loop = _TrainLoop(run)
    # Who the replicas are (host, pid), so that one dying mid-training can be named by the others.
    roster = ReplicaRoster.gather(strategy) if loop.several else None
    run.hooks.after_restore(state)
    # The framework owns the mode: TRAIN updates BatchNorm statistics, EVAL and PREDICT never do.
    run.parts.model.train()
    apply_frozen_modes(run.parts.model)  # frozen BatchNorm layers keep their statistics
    progress = Progress(
        "train", total=run.last_step, initial=state.global_step, enabled=config.progress_bar and strategy.is_chief
    )
    with _InterruptFlag(config.checkpoint_on_interrupt) as interrupt, progress, _naming_lost_replicas(roster, state):
        loop.run_steps(interrupt, progress)
        loop.finish()
    if interrupt.raised:
        raise KeyboardInterrupt(
            f"Training interrupted at step {state.global_step}; the checkpoint of that step was written."
        )
    if loop.input_ended_first:
        logger.warning(
            "Training made no steps: the input ended before its first batch. It is empty, or it resumed "
            "at its end (an input with num_epochs resumes where the previous train call in this model_dir "
            "stopped; for more epochs give it a larger num_epochs, or num_epochs=None and max_steps)."
        )
    elif state.last_loss is not None and loop.steps_this_call:
        logger.info("Loss for final step: %s.", state.last_loss)
    run.hooks.end(state)
    return LoopOutcome(state=state, ended_by=loop.ended_by, input_ended_first=loop.input_ended_first)
