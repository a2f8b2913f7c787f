"""The seam between the Estimator and what runs a model it built: evaluation, prediction, export, serving.

``WeightsOrigin`` is the typed record of where a built module's weights came
from; ``InferenceBundle`` is what the Estimator hands out: the plain module
holding known weights, how to call model_fn on it, and how to evaluate it.
Export (export/saved_model.py) and train_and_evaluate's evaluations inside the
training loop (_policy/train_and_evaluate.py) use the bundle instead of the Estimator's internals.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

from torchestimator._core.batches import InputSource
from torchestimator._core.config import RunConfig
from torchestimator._core.eval_loops import EvalRun, eval_loop
from torchestimator._core.spec import EstimatorSpec, ModeKeys
from torchestimator._io.summary import SummaryWriter
from torchestimator._train_state import TrainState
from torchestimator.hooks.base import Hook, HookList
from torchestimator.metrics import MetricAccumulators

if TYPE_CHECKING:
    from torchestimator.distribute.strategy import Strategy

logger = logging.getLogger("torchestimator")

__all__ = ["BundleSource", "InferenceBundle", "WeightsOrigin"]


@dataclasses.dataclass(frozen=True)
class WeightsOrigin:
    """Where the weights a built module holds came from."""

    source: Literal["init", "checkpoint", "warm_start", "training"]
    """``init``: freshly initialised; ``checkpoint``: equal to ``checkpoint_path``; ``warm_start``: warm-started and
    not trained; ``training``: trained in this process past its last checkpoint (or without checkpoints)."""
    step: int = 0
    """The global step these weights belong to."""
    checkpoint_path: str | None = None
    warm_start_from: str | None = None

    def holds(self, checkpoint_path: str | None) -> bool:
        """True when the weights are those of ``checkpoint_path`` (no need to read it again)."""
        return self.source == "checkpoint" and checkpoint_path is not None and self.checkpoint_path == checkpoint_path

    @property
    def in_process(self) -> bool:
        """Weights that exist only in this process (trained or warm-started, no checkpoint of them)."""
        return self.source in ("training", "warm_start")


FRESH = WeightsOrigin("init")

InputCaller = Callable[[Callable[..., Any], str, "Strategy"], InputSource]
"""(input_fn, mode, strategy) -> the iterable of batches, with the Estimator's params/config/input_context."""


@dataclasses.dataclass(frozen=True)
class InferenceBundle:
    """A module holding known weights, and how to evaluate it or call model_fn on it."""

    module: torch.nn.Module
    """The plain module (never a distribution wrapper)."""
    call_model_fn: Callable[[torch.nn.Module, Any, Any, str], EstimatorSpec]
    """(model, features, labels, mode) -> EstimatorSpec, passing params/config as model_fn declared."""
    weights: WeightsOrigin
    strategy: Strategy
    """Where evaluation runs (the training replicas when distributed)."""
    call_input_fn: InputCaller
    config: RunConfig
    eval_dir: Callable[[str | None], str]

    @property
    def global_step(self) -> int:
        return self.weights.step

    def evaluate(
        self,
        input_fn: Callable[..., Any],
        *,
        steps: int | None = None,
        hooks: Iterable[Hook] | None = None,
        name: str | None = None,
        global_step: int | None = None,
    ) -> dict[str, Any]:
        """Evaluates the module as it is (eval mode, no grad); writes the results to eval_dir(name) and returns them.

        ``global_step`` names the step the weights belong to when they moved on since the bundle was made
        (evaluation inside training). Leaves the module in eval mode; a training loop puts it back.
        """
        hook_list = HookList(hooks or ())
        state = TrainState(global_step=self.global_step if global_step is None else global_step, mode=ModeKeys.EVAL)
        hook_list.begin(state)
        run = EvalRun(
            strategy=self.strategy,
            module=self.module,
            call_model_fn=self.call_model_fn,
            hooks=hook_list,
            state=state,
            input_source=self.call_input_fn(input_fn, ModeKeys.EVAL, self.strategy),
            steps=steps,
            progress_bar=self.config.progress_bar,
            mixed_precision_config=self.config,
        )
        results = eval_loop(run, MetricAccumulators(self.strategy.device))
        writer = SummaryWriter(self.eval_dir(name), enabled=self.strategy.is_chief)
        try:
            writer.scalars(
                {key: value for key, value in results.items() if key != "global_step"}, results["global_step"]
            )
        finally:
            writer.close()
        logger.info(
            "Saving dict for global step %d: %s",
            results["global_step"],
            ", ".join(f"{key} = {value}" for key, value in sorted(results.items())),
        )
        return results


class BundleSource(Protocol):
    """What export needs from an Estimator: a model_dir and bundles (so export/ never imports the Estimator)."""

    @property
    def model_dir(self) -> str: ...

    def inference_bundle(
        self,
        checkpoint_path: str | None = None,
        *,
        mode: str = ModeKeys.PREDICT,
        device: torch.device | str | None = None,
        require_weights: bool = False,
    ) -> InferenceBundle: ...
