"""The hook protocol: a no-op base class, the run context, and a dispatcher.

Hooks are for users' extensions. The framework's own policy (stop at
max_steps, checkpoint, summaries, NaN guard) lives in loop.py in plain sight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchestimator._train_state import TrainState

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
        on_checkpoint_request: Callable[[tuple[Any, ...]], None] | None = None,
    ) -> None:
        self.state = state
        self.is_chief = is_chief
        self.summary_writer = summary_writer
        self.spec: Any = None
        self.features: Any = None
        self.labels: Any = None
        self._loss_tensor: torch.Tensor | None = None
        self._loss_value: float | None = None
        self._request_checkpoint = on_checkpoint_request  # the training loop's; None in evaluation and prediction
        self._stop_requested = False

    def set_step_outputs(
        self,
        spec: Any,
        features: Any = None,
        labels: Any = None,
        loss: torch.Tensor | None = None,
        loss_value: float | None = None,
    ) -> None:
        """Called by the loops after each step: this step's outputs. `loss` overrides the spec's (the mean over
        accumulated micro-batches); `loss_value`, when given, is what `loss` answers (the mean over replicas)."""
        self.spec = spec
        self.features = features
        self.labels = labels
        self._loss_tensor = loss if loss is not None else (None if spec is None else spec.loss)
        self._loss_value = loss_value

    @property
    def global_step(self) -> int:
        return self.state.global_step

    @property
    def loss_if_read(self) -> float | None:
        """This step's loss as a float if something already read it, else None (never synchronises)."""
        return self._loss_value

    @property
    def loss(self) -> float | None:
        """This step's loss as a float (synchronises with the device once per step, on demand)."""
        if self._loss_value is None and self._loss_tensor is not None:
            self._loss_value = float(self._loss_tensor.detach())  # kept: the next reader of this step pays nothing
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

    def check_config(self, config: Any) -> None:
        """When the hook joins a run, before any work: raise ConfigError if this RunConfig cannot serve it.

        A hook that needs something of the run (checkpoints, summaries) says so
        here, so a wrong combination fails at registration rather than at the
        step where the hook first acts.
        """


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


def _dispatcher(name: str) -> Callable[[HookList, Any], None]:
    def dispatch(self: HookList, argument: Any) -> None:
        for method in self._by_method[name]:
            method(argument)

    dispatch.__name__ = dispatch.__qualname__ = name
    dispatch.__doc__ = f"Calls ``{name}`` on the hooks that override it, in registration order."
    return dispatch


def check_hook(hook: Any, where: str = "hooks") -> None:
    """TypeError unless ``hook`` is a Hook; ``where`` names the argument in the message."""
    if isinstance(hook, Hook):
        return
    # An early-stopping rule (``_policy``, a layer above) is told by its protocol, observe and should_stop.
    if callable(getattr(hook, "observe", None)) and callable(getattr(hook, "should_stop", None)):
        raise TypeError(
            f"{where}: {hook!r} is an early-stopping rule, not a hook; rules are asked after each evaluation, "
            "which a training hook never sees. Pass it as train_and_evaluate(estimator, train_spec, eval_spec, "
            "early_stopping=[rule]) instead."
        )
    raise TypeError(
        f"{where} must be te.Hook instances; received {type(hook).__name__} {hook!r}. "
        "Subclass te.Hook and override the methods you need."
    )


class HookList:
    """Calls each hook method only on hooks that override it, so unused events cost nothing.

    Hooks are checked when they are added: their type, and, once the run's
    RunConfig is known (``config=`` or ``check_config``), ``Hook.check_config``,
    so a hook the run cannot serve fails before step 1.
    """

    def __init__(self, hooks: Iterable[Any], *, config: Any = None) -> None:
        self.hooks: list[Hook] = []
        self.config = config
        self._by_method: dict[str, list[Callable[[Any], None]]] = {name: [] for name in _HOOK_METHODS}
        for hook in hooks:
            self.add(hook)

    def add(self, hook: Any) -> None:
        check_hook(hook)
        if self.config is not None:
            hook.check_config(self.config)
        self.hooks.append(hook)
        for name in _HOOK_METHODS:
            if getattr(type(hook), name) is not getattr(Hook, name):
                self._by_method[name].append(getattr(hook, name))

    def check_config(self, config: Any) -> None:
        """Checks every hook against the run's RunConfig (and every hook added later)."""
        for hook in self.hooks:
            hook.check_config(config)
        self.config = config

    def overriding(self, name: str) -> list[Callable[[Any], None]]:
        """The bound ``name`` methods of the hooks that override it, in registration order: the live list, which
        hooks added later join (the training loop iterates it each step instead of calling the dispatcher)."""
        return self._by_method[name]

    @property
    def wants_steps(self) -> bool:
        return bool(self._by_method["before_step"] or self._by_method["after_step"])

    begin = _dispatcher("begin")
    after_restore = _dispatcher("after_restore")
    before_step = _dispatcher("before_step")
    after_step = _dispatcher("after_step")
    end = _dispatcher("end")
