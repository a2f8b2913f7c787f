"""The hook protocol: a no-op base class, the run context, and a dispatcher.

Hooks are for users' extensions. The framework's own policy (stop at
max_steps, checkpoint, summaries, NaN guard) lives in loop.py in plain sight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchestimator.state import TrainState

logger = logging.getLogger(__name__)


class RunContext:
    """What a hook sees around one step: the state, this step's outputs, and a way to stop.

    `loss` turns the loss tensor into a float only when a hook asks for it,
    so runs whose hooks never read it pay no device synchronisation.
    """

    def __init__(
        self,
        state: TrainState,
        *,
        is_chief: bool = True,
        summary_writer: Any = None,
    ) -> None:
        self.state = state
        self.is_chief = is_chief
        self.summary_writer = summary_writer
        self.spec: Any = None
        self.features: Any = None
        self.labels: Any = None
        self._loss_tensor: torch.Tensor | None = None
        self._loss_value: float | None = None
        self._request_checkpoint: Callable[[tuple[Any, ...]], None] | None = None
        self._stop_requested = False

    def _set_step_outputs(self, spec: Any, features: Any = None, labels: Any = None,
                          loss: torch.Tensor | None = None, loss_value: float | None = None) -> None:
        """This step's outputs; `loss` overrides the spec's (the mean over accumulated micro-batches)."""
        self.spec = spec
        self.features = features
        self.labels = labels
        self._loss_tensor = loss if loss is not None else (None if spec is None else spec.loss)
        self._loss_value = loss_value

    @property
    def global_step(self) -> int:
        return self.state.global_step

    @property
    def loss(self) -> float | None:
        """This step's loss as a float (synchronises with the device once per step, on demand)."""
        if self._loss_value is None and self._loss_tensor is not None:
            self._loss_value = float(self._loss_tensor.detach())
            self.state.last_loss = self._loss_value
        return self._loss_value

    @property
    def predictions(self) -> Any:
        return None if self.spec is None else self.spec.predictions

    def request_stop(self) -> None:
        """Asks the loop to stop after this step (every replica stops together)."""
        self._stop_requested = True

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def request_checkpoint(self, listeners: Iterable[Any] = ()) -> None:
        """Asks for a checkpoint of this step, written when the step ends (training only).

        The save happens after every replica agrees, so a hook on one replica
        cannot leave the others waiting; `listeners` hear before_save/after_save.
        """
        if self._request_checkpoint is None:
            raise RuntimeError("request_checkpoint is only available to hooks during training.")
        self._request_checkpoint(tuple(listeners))


class Hook:
    """Base class for hooks: every method is a no-op; override the ones you need.

    Order: begin -> after_restore -> (before_step -> step -> after_step)* -> end.
    `end` runs when the loop finishes normally or its input runs out, not
    after an error, as with TensorFlow's SessionRunHook.
    """

    def begin(self, state: TrainState) -> None:
        """Before the first step, before weights are restored."""

    def after_restore(self, state: TrainState) -> None:
        """After weights are restored (or freshly initialised), before the first step."""

    def before_step(self, run_context: RunContext) -> None:
        """Before each step; run_context.global_step is the step about to run."""

    def after_step(self, run_context: RunContext) -> None:
        """After each step; global_step has been incremented, outputs are in run_context."""

    def end(self, state: TrainState) -> None:
        """After the last step."""


class CheckpointSaverListener:
    """Notified around checkpoint saves; after_save returning True stops training."""

    def begin(self) -> None:
        pass

    def before_save(self, state: TrainState, global_step: int) -> None:
        pass

    def after_save(self, state: TrainState, global_step: int) -> bool | None:
        pass

    def end(self, state: TrainState, global_step: int) -> None:
        pass


_HOOK_METHODS = ("begin", "after_restore", "before_step", "after_step", "end")


class HookList:
    """Calls each hook method only on hooks that override it, so unused events cost nothing."""

    def __init__(self, hooks: Iterable[Any]) -> None:
        self.hooks: list[Hook] = []
        for hook in hooks:
            self.add(hook)

    def add(self, hook: Any) -> None:
        # Checked at registration so a wrong hook fails before step 1.
        if not isinstance(hook, Hook):
            raise TypeError(
                f"Hooks must be instances of torchestimator.Hook; received {type(hook).__name__} {hook!r}. "
                "Subclass te.Hook and override the methods you need."
            )
        self.hooks.append(hook)
        self._by_method = {
            name: [h for h in self.hooks if getattr(type(h), name) is not getattr(Hook, name)] for name in _HOOK_METHODS
        }

    @property
    def wants_steps(self) -> bool:
        return bool(self.hooks) and bool(self._by_method["before_step"] or self._by_method["after_step"])

    def begin(self, state: TrainState) -> None:
        for hook in self._for("begin"):
            hook.begin(state)

    def after_restore(self, state: TrainState) -> None:
        for hook in self._for("after_restore"):
            hook.after_restore(state)

    def before_step(self, run_context: RunContext) -> None:
        for hook in self._for("before_step"):
            hook.before_step(run_context)

    def after_step(self, run_context: RunContext) -> None:
        for hook in self._for("after_step"):
            hook.after_step(run_context)

    def end(self, state: TrainState) -> None:
        for hook in self._for("end"):
            hook.end(state)

    def _for(self, name: str) -> list[Hook]:
        return self._by_method[name] if self.hooks else []
