"""Checkpointer: writes the checkpoints of one training run from its registered parts.

Every replica calls ``save`` at the same step (the loop agrees on it first);
one gather brings every replica's own state to the chief. With one process
the chief writes the safetensors format and one broadcast tells every replica
the path once it is on disk. With several (``sharded``), every rank writes its
share through torch.distributed.checkpoint (``sharded.py``), synchronously or,
with ``asynchronous``, in the background: then the listeners hear
``after_save`` when that checkpoint is published (at the next save, or at
``close`` at the end of training). One process with ``asynchronous`` writes its
single-file checkpoints in the background too (``background.py``): the loop
waits for the copy of the state to new CPU memory only. Listeners hear
before_save/after_save on every replica.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torchestimator.checkpoint.parts import TrainingParts, first_non_finite
from torchestimator.errors import NanLossDuringTrainingError
from torchestimator.hooks.base import CheckpointSaverListener

if TYPE_CHECKING:  # types only: at run time these modules load when used, not with this one
    from torchestimator.checkpoint.background import BackgroundSaves
    from torchestimator.checkpoint.sharded import ShardedSaves
    from torchestimator.checkpoint.store import CheckpointStore
    from torchestimator.distribute.strategy import Strategy

logger = logging.getLogger("torchestimator")


class Checkpointer:
    """Writes checkpoints of a training run; all replicas call save together.

    Args:
        sharded: write with torch.distributed.checkpoint, every rank its share (several processes, FSDP2).
        asynchronous: write in the background (DCP with ``sharded``, else ``BackgroundSaves``, one process only);
            the loop waits only for the copy to CPU.
        timeout: how long the background's collectives wait for the other replicas.
    """

    def __init__(
        self,
        store: CheckpointStore,
        strategy: Strategy,
        *,
        listeners: Iterable[CheckpointSaverListener] = (),
        sharded: bool = False,
        asynchronous: bool = False,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        self.store = store
        self.strategy = strategy
        self.listeners = list(listeners)
        self.last_saved_step: int | None = None
        """The newest step saved, or being saved in the background (the loop saves a step once)."""
        self.last_saved_path: str | None = None
        """The newest checkpoint on disk (published)."""
        self.published_step: int | None = None
        self._sharded: ShardedSaves | None = None
        self._background: BackgroundSaves | None = None
        if sharded:
            from torchestimator.checkpoint.sharded import ShardedSaves  # DCP: seconds to import, only when used

            self._sharded = ShardedSaves(store, strategy, asynchronous=asynchronous, timeout=timeout)
        elif asynchronous:
            if strategy.num_replicas != 1:
                raise ValueError(
                    "Checkpointer: asynchronous saves of several processes are written by DCP; "
                    f"they need sharded=True ({strategy.num_replicas} replicas here)."
                )
            from torchestimator.checkpoint.background import BackgroundSaves

            self._background = BackgroundSaves(store)
        self._waiting_listeners: list[CheckpointSaverListener] = []
        self._state: Any = None

    @property
    def asynchronous(self) -> bool:
        return self._background is not None or (self._sharded is not None and self._sharded.asynchronous)

    def save(self, parts: TrainingParts, extra_listeners: Iterable[CheckpointSaverListener] = ()) -> bool:
        """Saves the current step; returns True if a listener asked to stop."""
        state = parts.train_state
        step = state.global_step
        self._check_finite(parts, step)
        listeners = [*self.listeners, *extra_listeners]
        replica_states = self.strategy.gather_replica_states(parts.replica_state())
        stop = self._take_in_flight()  # at most one save in flight: the previous one is published first
        for listener in listeners:
            listener.before_save(state, step)
        if self._background is not None:  # one process: the loop waits for the copy of the state only
            self._background.save(step, *parts.payload(replica_states))
            path = None
        elif self._sharded is None:
            path = self._write_on_chief(step, parts, replica_states)
        else:
            path = self._sharded.save(step, *parts.sharded_payload(replica_states))
        self.last_saved_step = step
        if path is None:  # written in the background; its listeners hear when it is published
            self._waiting_listeners, self._state = listeners, state
            return stop
        return self._published(state, step, path, listeners) or stop

    def publish_in_flight(self) -> bool:
        """Waits for the save being written in the background, if any, and tells its listeners (raising its
        error, as the next save would); True if one asks to stop. The loop calls it at its end, so that a
        failure of the last save is raised where the loop names a lost replica."""
        return self._take_in_flight()

    def close(self, *, raise_errors: bool = True) -> None:
        """Publishes the save in flight (the final checkpoint is complete when train returns), then releases
        the background thread; ``raise_errors=False`` (training already failed) logs its error instead."""
        saves = self._sharded if self._sharded is not None else self._background
        if saves is None:
            return
        try:
            self._take_in_flight()
        except BaseException as error:
            if raise_errors:
                raise
            logger.error("The checkpoint being written in the background failed too: %s", error)
        finally:
            saves.close()

    def last_good(self) -> str:
        """The checkpoint a failed run can go back to, in words."""
        return self.last_saved_path or self.store.latest_checkpoint() or "none (model_dir has no checkpoint)"

    # ------------------------------------------------------------------ steps

    def _check_finite(self, parts: TrainingParts, step: int) -> None:
        bad_variable = first_non_finite(parts.model)
        bad = bad_variable is not None
        if self._sharded is not None:
            bad = self.strategy.all_agree(bad)  # shards differ: every replica must stop if one finds a NaN
        if bad:
            where = repr(bad_variable) if bad_variable is not None else "on another replica"
            raise NanLossDuringTrainingError(
                f"Variable {where} is not finite at step {step}; no checkpoint was written. "
                f"The last good checkpoint is {self.last_good()}."
            )

    def _write_on_chief(self, step: int, parts: TrainingParts, replica_states: list[Any]) -> str:
        def write() -> str:
            path = self.store.save(step, *parts.payload(replica_states))
            logger.info("Saved checkpoint for step %d: %s", step, path)
            return path

        # Every replica learns the path, and none goes on (to evaluate, export) before the chief's write is done.
        return self.strategy.run_on_chief(write, f"Writing the checkpoint of global step {step}")

    def _take_in_flight(self) -> bool:
        """Waits for the background save (raising its error) and tells its listeners; True if one asks to stop."""
        saves = self._sharded if self._sharded is not None else self._background
        if saves is None:
            return False
        done = saves.wait()
        if done is None:
            return False
        listeners, self._waiting_listeners = self._waiting_listeners, []
        return self._published(self._state, *done, listeners)

    def _published(self, state: Any, step: int, path: str, listeners: list[CheckpointSaverListener]) -> bool:
        self.last_saved_path, self.published_step = path, step
        return any([bool(listener.after_save(state, step)) for listener in listeners])  # noqa: C419 (each is told)
