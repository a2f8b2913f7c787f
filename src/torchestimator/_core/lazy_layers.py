"""Lazy layers (``nn.LazyLinear``, ``nn.LazyConv2d``, ...): their shapes are fixed before anything needs them.

A lazy layer learns its input size from its first forward, the way ``tf.layers.dense`` does, so a module holding
one has no shapes until it has seen a batch. Everything the Estimator does before the first step needs them:
restoring a checkpoint, warm start, DDP and FSDP2 (both refuse uninitialised parameters), the optimizer. Two
ways give them shapes, whichever comes first:

- a checkpoint: ``load_state_dict`` materialises each lazy parameter with the saved shape (torch's own load hook),
  so resume, evaluate, predict and export need no input at all;
- otherwise a dry forward: ``materialize_lazy_layers`` calls input_fn once more, takes its first batch and runs
  model_fn on it in eval mode without gradients, on the plain module before any wrapping. Nothing of it stays
  but the shapes and the layers' initial weights: the random streams are put back, BatchNorm statistics are not
  updated (eval mode), and the batch is not consumed from the input that training reads.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchestimator._core.calling import split_batch, to_device
from torchestimator._shapeless import some_names, uninitialized_variables
from torchestimator._train_state import rng_preserved
from torchestimator.errors import ConfigError

logger = logging.getLogger("torchestimator")


def materialize_lazy_layers(
    module: torch.nn.Module,
    first_batches: Callable[[], Iterable[Any]],
    call_model_fn: Callable[..., Any],
    mode: str,
    device: torch.device,
) -> None:
    """Gives ``module``'s lazy layers their shapes by one dry forward through model_fn; nothing else changes.

    ``first_batches`` makes a fresh input (input_fn called once more), of which only the first batch is read.
    Does nothing when the module has no uninitialised variable.
    """
    pending = uninitialized_variables(module)
    if not pending:
        return
    logger.info(
        "The model has lazy layers (%s): running model_fn once on the first batch of input_fn to give them shapes.",
        some_names(pending),
    )
    was_training = module.training
    with rng_preserved():  # input_fn's shuffling and dropout draw nothing that training would draw
        iterator = iter(first_batches())
        try:
            batch = next(iterator)
        except StopIteration:
            raise ConfigError(
                f"The model's lazy layers ({some_names(pending)}) get their shapes from the first batch of input_fn, "
                "but input_fn yielded no batch. Give the layers their input sizes (nn.Linear instead of "
                "nn.LazyLinear), or restore a checkpoint that has them."
            ) from None
        finally:
            _close(iterator)
            del iterator  # a DataLoader's worker processes stop with their iterator
        features, labels = split_batch(batch, 0)
        module.eval()  # BatchNorm statistics stay as they are; dropout is off
        try:
            with torch.no_grad():
                call_model_fn(module, to_device(features, device), to_device(labels, device), mode)
        finally:
            module.train(was_training)
    still = uninitialized_variables(module)
    if still:
        raise ConfigError(
            f"model_fn in {mode} mode does not call every lazy layer of the model: {some_names(still)} still have no "
            "shape after a forward on the first batch. Give those layers their input sizes, or call them in "
            "every mode."
        )


def _close(iterator: Any) -> None:
    """Stops a throwaway input's generator now rather than when it is collected."""
    close = getattr(iterator, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # a generator's cleanup failing must not hide the real outcome
            close()
