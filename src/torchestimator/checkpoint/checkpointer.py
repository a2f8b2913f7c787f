"""Checkpointer: writes the checkpoints of one training run from its registered parts.

Every replica calls ``save`` at the same step (the loop agrees on it first);
one gather brings every replica's own state to the chief, which writes, and
one broadcast tells every replica the path once it is on disk; the listeners
hear before_save/after_save on every replica.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torchestimator.checkpoint.parts import TrainingParts, first_non_finite
from torchestimator.errors import CheckpointError, NanLossDuringTrainingError
from torchestimator.hooks.base import CheckpointSaverListener

logger = logging.getLogger("torchestimator")


class Checkpointer:
    """Writes checkpoints of a training run; all replicas call save together, only the chief writes."""

    def __init__(self, store: Any, strategy: Any, *, listeners: Iterable[CheckpointSaverListener] = ()) -> None:
        self.store = store
        self.strategy = strategy
        self.listeners = list(listeners)
        self.last_saved_step: int | None = None
        self.last_saved_path: str | None = None

    def save(self, parts: TrainingParts, extra_listeners: Iterable[CheckpointSaverListener] = ()) -> bool:
        """Saves the current step; returns True if a listener asked to stop."""
        state = parts.train_state
        step = state.global_step
        bad_variable = first_non_finite(parts.model)
        if bad_variable is not None:
            raise NanLossDuringTrainingError(
                f"Variable {bad_variable!r} is not finite at step {step}; no checkpoint was written. "
                f"The last good checkpoint is {self.last_good()}."
            )
        listeners = [*self.listeners, *extra_listeners]
        replica_states = self.strategy.all_gather_object(parts.replica_state())
        for listener in listeners:
            listener.before_save(state, step)
        path, failure = None, None
        if self.strategy.is_chief:
            try:
                path = self.store.save(step, *parts.payload(replica_states))
                logger.info("Saved checkpoint for step %d: %s", step, path)
            except Exception as error:  # told to the other replicas first, so that none waits for the chief
                failure = error
        # Every replica learns the path, and none goes on (to evaluate, export) before the chief's write is done.
        path, chief_error = self.strategy.broadcast_object(
            (path, None if failure is None else f"{type(failure).__name__}: {failure}"), 0)
        if failure is not None:
            raise failure
        if chief_error is not None:
            raise CheckpointError(f"The chief could not write the checkpoint of global step {step}: {chief_error}")
        self.last_saved_path = path
        self.last_saved_step = step
        stop = [bool(listener.after_save(state, step)) for listener in listeners]
        return any(stop)

    def last_good(self) -> str:
        """The checkpoint a failed run can go back to, in words."""
        return self.last_saved_path or self.store.latest_checkpoint() or "none (model_dir has no checkpoint)"
