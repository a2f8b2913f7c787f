"""Single-file checkpoints written in the background: the loop waits only for the copy of the state.

``BackgroundSaves.save`` copies every tensor of the payload to new CPU memory (the one copy a save that
does not stop training must make: the loop changes the live tensors at the next step), hands the copies
to a thread that writes them with ``CheckpointStore.save`` (streamed, checksummed, fsynced, published by
rename as any save), and returns. At most one save is in flight: the next ``save`` or ``wait`` waits for
it and raises its error. A kill during the background write leaves a staging folder, never a listed
checkpoint, as a synchronous save would.

The copy costs one state's worth of memory while the save is in flight; a synchronous save costs none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from .serialization import flatten_state, unflatten_state

__all__ = ["BackgroundSaves", "copy_state"]

logger = logging.getLogger(__name__)


def copy_state(tree: Any, root: str) -> Any:
    """``tree`` with every tensor copied to new CPU memory (the rest rebuilt as the store's codec would)."""
    if tree is None:
        return None
    json_tree, tensors = flatten_state(tree, root=root)
    return unflatten_state(json_tree, {name: tensor.detach().to("cpu", copy=True) for name, tensor in tensors.items()})


class BackgroundSaves:
    """Saves of one ``CheckpointStore`` written on a thread of their own, one at a time."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="checkpoint-save"
        )
        self._in_flight: tuple[int, Future[str]] | None = None

    @property
    def in_flight_step(self) -> int | None:
        return None if self._in_flight is None else self._in_flight[0]

    def save(
        self,
        step: int,
        model_state: Mapping[str, torch.Tensor],
        optimizer_state: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Copies the state, starts writing it as ``ckpt-<step>`` and returns; ``wait`` gives its path."""
        if self._executor is None:
            raise RuntimeError("BackgroundSaves.save: the saver was closed.")
        if self._in_flight is not None:
            raise RuntimeError("BackgroundSaves.save: call wait() for the save in flight first (one at a time).")
        model_copy = {name: tensor.detach().to("cpu", copy=True) for name, tensor in model_state.items()}
        optimizer_copy = copy_state(optimizer_state, "optimizer_state")
        extra_copy = copy_state(dict(extra or {}), "extra")
        outcome = self._executor.submit(self.store.save, step, model_copy, optimizer_copy, extra_copy)
        self._in_flight = (step, outcome)

    def wait(self) -> tuple[int, str] | None:
        """(step, path) of the save in flight once it is published; None when none is. Raises its error."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return None
        step, outcome = in_flight
        return step, outcome.result()

    def close(self) -> None:
        """Waits for the save in flight (raising its error) and releases the thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
