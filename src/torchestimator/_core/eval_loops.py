"""The evaluation and prediction loops: batches in, metrics or predictions out, never a weight changed.

Both run the module in eval mode under no_grad; the Estimator (or an
InferenceBundle) builds the run and has restored the weights before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from torchestimator._core.batches import DeviceBatches, InputSource, autocast
from torchestimator._core.calling import batch_length
from torchestimator._core.config import RunConfig
from torchestimator._core.progress import Progress
from torchestimator._core.spec import EstimatorSpec, ModeKeys, validate_spec
from torchestimator._train_state import TrainState
from torchestimator.hooks.base import Hook, HookList, RunContext

if TYPE_CHECKING:
    from torchestimator.distribute.strategy import Strategy
    from torchestimator.metrics import MetricAccumulators


def adopt_spec_hooks(hooks: HookList, spec_hooks: Iterable[Hook], state: TrainState) -> None:
    """Hooks from the first batch's EstimatorSpec join the run (model_fn runs per batch, so later
    batches' hook objects would be new copies of the same hooks)."""
    for hook in spec_hooks:
        hooks.add(hook)
        hook.begin(state)
        hook.after_restore(state)


@dataclasses.dataclass
class EvalRun:
    """Everything one evaluate or predict call needs."""

    strategy: Strategy
    module: torch.nn.Module
    call_model_fn: Callable[..., EstimatorSpec]
    hooks: HookList
    state: TrainState
    input_source: InputSource
    steps: int | None
    progress_bar: bool | None
    mixed_precision_config: RunConfig


def eval_loop(run: EvalRun, accumulators: MetricAccumulators) -> dict[str, Any]:
    """Evaluates until `steps` batches or the end of input; returns metrics, loss and global_step."""
    strategy, state = run.strategy, run.state
    batches = DeviceBatches(run.input_source, strategy.device)
    context = RunContext(state, is_chief=strategy.is_chief)
    loss_sum = torch.zeros((), dtype=torch.float64, device=strategy.device)
    example_count = torch.zeros((), dtype=torch.float64, device=strategy.device)
    run.module.eval()
    run.hooks.after_restore(state)
    batches_seen = 0
    with (
        torch.no_grad(),
        Progress("evaluate", total=run.steps, enabled=run.progress_bar and strategy.is_chief) as progress,
    ):
        while run.steps is None or batches_seen < run.steps:
            run.hooks.before_step(context)
            try:
                features, labels = batches.next()
            except StopIteration:
                break
            with autocast(run.mixed_precision_config, strategy.device):
                spec = validate_spec(run.call_model_fn(run.module, features, labels, ModeKeys.EVAL), ModeKeys.EVAL)
            # The loss is weighted by batch size, so it is the per-example mean even with a short last batch.
            rows = batch_length(labels if labels is not None else features)
            rows = 1 if rows is None else rows
            if rows:  # a replica's share of a short last batch may be empty; its loss is NaN
                assert spec.loss is not None  # validate_spec requires one in EVAL mode
                loss_sum += spec.loss.detach().double().reshape(()) * rows
                example_count += rows
            if spec.eval_metric_ops:
                accumulators.update(spec.eval_metric_ops)
            batches_seen += 1
            if batches_seen == 1:
                adopt_spec_hooks(run.hooks, spec.evaluation_hooks, state)
            context.set_step_outputs(spec, features, labels)
            run.hooks.after_step(context)
            progress.update(batches_seen)
            if context.stop_requested:
                break
    loss_sum, example_count = strategy.reduce_sum(torch.stack([loss_sum, example_count]))
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
    batches = DeviceBatches(run.input_source, strategy.device)
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
            with torch.no_grad(), autocast(run.mixed_precision_config, strategy.device):
                spec = validate_spec(run.call_model_fn(run.module, features, None, ModeKeys.PREDICT), ModeKeys.PREDICT)
            predictions = _select_keys(spec.predictions, predict_keys)
            if batches.index == 1:
                adopt_spec_hooks(run.hooks, spec.prediction_hooks, state)
            context.set_step_outputs(spec, features, None)
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
    rows = distinct.pop() if len(distinct) == 1 else None
    if rows is None:
        raise ValueError(
            f"With yield_single_examples=True every prediction must share its first dimension; found {lengths}. "
            "Use yield_single_examples=False to get whole batches."
        )
    for row in range(rows):
        yield {key: array[row] for key, array in arrays.items()}
