"""Batches on the device and mixed-precision contexts: what the train, eval and predict loops share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from torchestimator._core.calling import split_batch, to_device
from torchestimator._core.config import MIXED_PRECISION_DTYPES, RunConfig

NO_CONTEXT = contextlib.nullcontext()  # reusable; saves building one per step

InputSource = Iterable[Any]
"""What input_fn returns: batches of (features, labels), or of features alone (see calling.split_batch)."""

AutocastFactory = Callable[[], contextlib.AbstractContextManager[Any]]
"""Makes one mixed-precision context (torch.autocast) per use."""


class DeviceBatches:
    """Next (features, labels) on the device, counting batches for error messages."""

    def __init__(self, iterable: InputSource, device: torch.device) -> None:
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


def autocast_factory(config: RunConfig, device: torch.device) -> AutocastFactory | None:
    """A maker of autocast contexts for mixed precision, or None when running in full precision."""
    if config.mixed_precision is None:
        return None
    dtype = getattr(torch, MIXED_PRECISION_DTYPES[config.mixed_precision])
    return lambda: torch.autocast(device.type, dtype=dtype)


def autocast(config: RunConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    factory = autocast_factory(config, device)
    return NO_CONTEXT if factory is None else factory()
