"""Built-in hooks with TensorFlow's names: logging, step counter, stop, checkpoint and summary savers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from torchestimator._train_state import TrainState
from torchestimator.errors import ConfigError
from torchestimator.hooks.base import CheckpointSaverListener, Hook, RunContext
from torchestimator.hooks.triggers import Every, check_step_count

logger = logging.getLogger("torchestimator")


def _every(steps: int | None, secs: float | None, owner: str) -> Every:
    if (steps is None) == (secs is None):
        raise ValueError(
            f"{owner} needs exactly one of every_n_steps/save_steps or every_n_secs/save_secs; "
            f"received steps={steps}, secs={secs}."
        )
    return Every(steps=steps, secs=secs)


class PeriodicHook(Hook):
    """A hook that acts every N steps or seconds: subclasses set `self.trigger` and implement `on_trigger`."""

    trigger: Every

    def after_restore(self, state: TrainState) -> None:
        self.trigger.start(state.global_step)

    def after_step(self, run_context: RunContext) -> None:
        step = run_context.global_step
        if self.trigger.should_fire(step):
            self.trigger.mark(step)
            self.on_trigger(run_context)

    def on_trigger(self, run_context: RunContext) -> None:
        """What to do when the trigger fires; a no-op here, like every Hook method."""


class StopAtStepHook(Hook):
    """Requests a stop at `last_step`, or `num_steps` after the step the run started at."""

    def __init__(self, num_steps: int | None = None, last_step: int | None = None) -> None:
        if (num_steps is None) == (last_step is None):
            raise ValueError(
                f"StopAtStepHook needs exactly one of num_steps and last_step; received {num_steps}, {last_step}."
            )
        num_steps = None if num_steps is None else check_step_count("StopAtStepHook", "num_steps", num_steps)
        last_step = None if last_step is None else check_step_count("StopAtStepHook", "last_step", last_step)
        self.num_steps = num_steps
        self.last_step = last_step

    def after_restore(self, state: TrainState) -> None:
        if self.num_steps is not None:
            self.last_step = state.global_step + self.num_steps

    def after_step(self, run_context: RunContext) -> None:
        if self.last_step is not None and run_context.global_step >= self.last_step:
            run_context.request_stop()


class LoggingTensorHook(Hook):
    """Logs the loss and named predictions every N steps or seconds (and optionally at the end)."""

    def __init__(
        self,
        tensors: Sequence[str] | Mapping[str, str] = ("loss",),
        every_n_iter: int | None = None,
        every_n_secs: float | None = None,
        at_end: bool = False,
        formatter: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        self.tags = dict(tensors) if isinstance(tensors, Mapping) else {name: name for name in tensors}
        self.trigger = (
            None
            if (every_n_iter is None and every_n_secs is None and at_end)
            else _every(every_n_iter, every_n_secs, "LoggingTensorHook")
        )
        self.at_end = at_end
        self.formatter = formatter
        self._last_context: RunContext | None = None
        self._last_time = time.monotonic()

    def after_restore(self, state: TrainState) -> None:
        if self.trigger is not None:
            self.trigger.start(state.global_step)
        self._last_time = time.monotonic()

    def after_step(self, run_context: RunContext) -> None:
        self._last_context = run_context  # read only at the end (at_end): no value is taken from it per step
        if self.trigger is None or not self.trigger.should_fire(run_context.global_step):
            return
        self.trigger.mark(run_context.global_step)
        self._log(self._values(run_context))

    def end(self, state: TrainState) -> None:
        # As tf.estimator's hook: the final step's values, whether or not the trigger logged that step.
        if self.at_end and self._last_context is not None:
            self._log(self._values(self._last_context))

    def _values(self, run_context: RunContext) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for tag, name in self.tags.items():
            if name == "loss":
                values[tag] = run_context.loss
            elif name in ("step", "global_step"):
                values[tag] = run_context.global_step
            elif isinstance(run_context.predictions, Mapping) and name in run_context.predictions:
                values[tag] = run_context.predictions[name].detach().cpu().tolist()
            else:
                raise KeyError(f"LoggingTensorHook: {name!r} is neither 'loss', 'step' nor a key of the predictions.")
        return values

    def _log(self, values: dict[str, Any]) -> None:
        now = time.monotonic()
        if self.formatter is not None:
            logger.info(self.formatter(values))
        else:
            text = ", ".join(f"{tag} = {_format(value)}" for tag, value in values.items())
            logger.info("%s (%.3f sec)", text, now - self._last_time)
        self._last_time = now


def _format(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class StepCounterHook(PeriodicHook):
    """Logs steps per second and writes it as the `global_step/sec` summary."""

    def __init__(self, every_n_steps: int | None = 100, every_n_secs: float | None = None) -> None:
        if every_n_secs is not None:
            every_n_steps = None
        self.trigger = _every(every_n_steps, every_n_secs, "StepCounterHook")
        self._step = 0
        self._time = 0.0

    def after_restore(self, state: TrainState) -> None:
        super().after_restore(state)
        self._step, self._time = state.global_step, time.monotonic()

    def on_trigger(self, run_context: RunContext) -> None:
        step = run_context.global_step
        now = time.monotonic()
        steps_per_sec = (step - self._step) / max(now - self._time, 1e-9)
        self._step, self._time = step, now
        logger.info("global_step/sec: %.4g", steps_per_sec)
        if run_context.summary_writer is not None:
            run_context.summary_writer.scalar("global_step/sec", steps_per_sec, step)


class CheckpointSaverHook(PeriodicHook):
    """Saves extra checkpoints on its own schedule, telling its listeners before and after."""

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        listeners: Iterable[CheckpointSaverListener] = (),
    ) -> None:
        self.trigger = _every(save_steps, save_secs, "CheckpointSaverHook")
        self.listeners = list(listeners)
        for listener in self.listeners:
            if not isinstance(listener, CheckpointSaverListener):
                raise TypeError(
                    f"CheckpointSaverHook listeners must be CheckpointSaverListener; received {listener!r}."
                )

    def check_config(self, config: Any) -> None:
        # The loop writes the checkpoints this hook asks for; with none configured it has no store to write to.
        if config.save_checkpoints_steps is None and config.save_checkpoints_secs is None:
            raise ConfigError(
                f"CheckpointSaverHook({self._schedule()}) needs checkpoints, but this run's RunConfig disables them "
                "(save_checkpoints_steps=None and save_checkpoints_secs=None). Set one of them, or drop the hook.",
                field="save_checkpoints_steps",
                value=None,
            )

    def begin(self, state: TrainState) -> None:
        for listener in self.listeners:
            listener.begin()

    def on_trigger(self, run_context: RunContext) -> None:
        run_context.request_checkpoint(self.listeners)

    def _schedule(self) -> str:
        return (
            f"save_steps={self.trigger.steps}" if self.trigger.steps is not None else f"save_secs={self.trigger.secs}"
        )

    def end(self, state: TrainState) -> None:
        for listener in self.listeners:
            listener.end(state, state.global_step)


def _loss_summary(run_context: RunContext) -> dict[str, float]:
    """SummarySaverHook's default values_fn: this step's loss."""
    loss = run_context.loss
    if loss is None:  # train and eval specs always carry one; a predict spec has nothing to write
        raise TypeError("SummarySaverHook has no loss to write: this step's EstimatorSpec has none.")
    return {"loss": loss}


class SummarySaverHook(PeriodicHook):
    """Writes scalars to the run's event file every N steps or seconds.

    `values_fn(run_context) -> {tag: float}` chooses what to write; by
    default the loss. Only the chief writes.
    """

    def __init__(
        self,
        save_steps: int | None = None,
        save_secs: float | None = None,
        values_fn: Callable[[RunContext], Mapping[str, float | torch.Tensor]] | None = None,
    ) -> None:
        self.trigger = _every(save_steps, save_secs, "SummarySaverHook")
        self.values_fn = values_fn or _loss_summary

    def on_trigger(self, run_context: RunContext) -> None:
        if run_context.summary_writer is None:
            return
        for tag, value in self.values_fn(run_context).items():
            if isinstance(value, torch.Tensor):
                value = float(value.detach())
            run_context.summary_writer.scalar(tag, float(value), run_context.global_step)
