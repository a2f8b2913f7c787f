"""Checkpoints of several processes, written by torch.distributed.checkpoint (DCP).

Every rank writes its own files into the step's staging folder, in parallel;
then each reports the checksums of the files it wrote, the chief seals
state.json over them and publishes the folder by rename (``store.py``). The
staging folder's name is the chief's, agreed before anyone writes.

Each plain tensor (the same on every DDP replica) is saved by one rank, the
ranks sharing the bytes evenly; DTensor shards (FSDP2) by their owners.

Synchronously, the loop waits for all of it. Asynchronously
(``RunConfig(async_checkpoint=True)``) the loop waits only for DCP's copy of
the state into CPU memory (``dcp.async_save``); the write, the checksums and
the publication run in a background thread. That thread's collectives use a
process group of their own: gloo collectives issued from two threads on one
group interleave with training's and pair up wrongly between ranks. At most
one save is in flight (the next waits for it); its outcome, the path or the
error any rank met, is taken by ``wait``: at the next save or at the end of
training, so a failure in the background is raised there, never lost.

Belongs here: the order of a sharded save across ranks. DCP's files are
``dcp_format.py``'s; sealing, publication and retention ``store.py``'s; what
is saved ``parts.py``'s; listeners and the one-process format ``checkpointer.py``'s.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as distributed
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from torchestimator.distribute.collectives import all_gather_object, broadcast_object

from .dcp_format import ShardWriter, alone_is_intended, file_digests, share_of_replicated
from .errors import CheckpointError, DiskFullError, is_no_room
from .format import DCP_METADATA_FILE

if TYPE_CHECKING:  # types only: the strategy and store modules need not load with this one
    from torchestimator.distribute.strategy import Strategy

    from .store import CheckpointStore

logger = logging.getLogger("torchestimator")


class _GroupCollectives:
    """The two collectives a publication needs, on the checkpoint's own process group (all ranks, same order)."""

    def __init__(self, group: Any, num_replicas: int) -> None:
        self.group = group
        self.num_replicas = num_replicas

    # The group is gloo's: the pickles go through CPU tensors.
    def all_gather_object(self, obj: Any) -> list[Any]:
        return all_gather_object(obj, torch.device("cpu"), group=self.group)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return broadcast_object(obj, src, torch.device("cpu"), group=self.group)


@dataclasses.dataclass
class _InFlight:
    step: int
    outcome: concurrent.futures.Future[str]
    """Resolves to the published path, or raises what went wrong on any rank."""


class ShardedSaves:
    """Writes a run's checkpoints with DCP on every rank; the chief seals and publishes them.

    Args:
        store: the CheckpointStore (only the chief calls its writing methods).
        strategy: the run's strategy (rank, chief, the main thread's collectives).
        asynchronous: write in the background (``dcp.async_save``), see the module docstring.
        timeout: how long the background's collectives wait for the other ranks.
    """

    def __init__(
        self,
        store: CheckpointStore,
        strategy: Strategy,
        *,
        asynchronous: bool,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        self.store = store
        self.strategy = strategy
        self._group: Any = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stager: DefaultStager | None = None
        self._in_flight: _InFlight | None = None
        if asynchronous:
            # Created by every rank at the same point (the run's start); gloo: async_save needs a CPU backend.
            self._group = distributed.new_group(backend="gloo", timeout=timeout or None)
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torchestimator-checkpoint")
            # One stager for the run: it keeps the CPU copies and refills them at each save (no new pages to
            # fault in); safe because the next save starts only once the previous one is written.
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=torch.cuda.is_available(),
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )

    @property
    def asynchronous(self) -> bool:
        return self._executor is not None

    @property
    def in_flight_step(self) -> int | None:
        return None if self._in_flight is None else self._in_flight.step

    def save(self, step: int, state_dict: dict[str, Any], shared_tree: Any, extra: dict[str, Any]) -> str | None:
        """Writes ``state_dict`` as ``ckpt-<step>``; returns its path, or None when it was started in the
        background (``wait`` gives the path). Every rank calls it at the same step."""
        if self._in_flight is not None:
            raise RuntimeError("ShardedSaves.save: call wait() for the save in flight first (one at a time).")
        staging = self._agree_on_staging(step)
        writer = ShardWriter(staging)
        state_dict = share_of_replicated(state_dict, self.strategy.replica_id, self.strategy.num_replicas)
        if self._executor is None:
            try:
                with alone_is_intended():  # one replica (a sharded module on one process) has no group to save with
                    dcp.save(state_dict, storage_writer=writer)
            except _DCP_ERRORS as error:
                raise self._write_failed(error, step, staging) from error
            return self._publish(step, staging, writer, shared_tree, extra, self.strategy)
        try:
            upload = dcp.async_save(
                state_dict, storage_writer=writer, process_group=self._group, async_stager=self._stager
            )
        except _DCP_ERRORS as error:
            raise self._write_failed(error, step, staging) from error
        collectives = _GroupCollectives(self._group, self.strategy.num_replicas)
        outcome = self._executor.submit(
            self._finish_in_background, step, staging, upload, writer, shared_tree, extra, collectives
        )
        self._in_flight = _InFlight(step, outcome)
        return None

    def wait(self) -> tuple[int, str] | None:
        """(step, path) of the save in flight once it is published; None when none is. Raises its error."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return None
        return in_flight.step, in_flight.outcome.result()

    def close(self) -> None:
        """Waits for the save in flight (raising its error) and releases the background thread and group."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            if self._group is not None and distributed.is_initialized():
                distributed.destroy_process_group(self._group)
            self._group = None

    # ------------------------------------------------------------------ the steps of one save

    def _agree_on_staging(self, step: int) -> str:
        """The chief's staging folder, on every rank (main thread, before anyone writes)."""
        return self.strategy.run_on_chief(
            lambda: self.store.begin_sharded_save(step), f"Preparing the checkpoint of global step {step}"
        )

    def _finish_in_background(
        self,
        step: int,
        staging: str,
        upload: Any,
        writer: ShardWriter,
        shared_tree: Any,
        extra: dict[str, Any],
        collectives: _GroupCollectives,
    ) -> str:
        try:
            upload.result()  # DCP raises a failed write on every rank, so all stop here together
        except _DCP_ERRORS as error:
            raise self._write_failed(error, step, staging) from error
        return self._publish(step, staging, writer, shared_tree, extra, collectives)

    def _publish(
        self, step: int, staging: str, writer: ShardWriter, shared_tree: Any, extra: dict[str, Any], collectives: Any
    ) -> str:
        """Every rank reports its files' checksums; the chief seals and publishes; every rank learns the path."""
        is_chief = self.strategy.is_chief
        digests, fault = None, None
        names = [*writer.written, *([DCP_METADATA_FILE] if is_chief else [])]
        try:
            digests = file_digests(staging, names)
            self.store.upload_shards(staging, names)  # a model_dir in an object store: this rank's files go up
        except OSError as error:
            fault = f"{type(error).__name__}: {error}"
        reports = collectives.all_gather_object((digests, fault))

        def seal() -> str:
            faults = [f"replica {rank}: {problem}" for rank, (_, problem) in enumerate(reports) if problem is not None]
            if faults:
                self.store.discard_staging(staging)
                raise CheckpointError(f"The checkpoint of global step {step} was not written: {'; '.join(faults)}")
            files = {name: entry for report, _ in reports for name, entry in report.items()}
            return self.store.finish_sharded_save(step, staging, files, shared_tree, extra)

        try:
            return self.strategy.run_on_chief(
                seal, f"Publishing the checkpoint of global step {step}", broadcast_object=collectives.broadcast_object
            )
        finally:
            self.store.release_staging(staging)

    def _write_failed(self, error: BaseException, step: int, staging: str) -> BaseException:
        """The error to raise for a failed DCP write (a full disk as DiskFullError); the staging folder goes."""
        if self.strategy.is_chief:
            self.store.discard_staging(staging)
        no_room = _no_room_cause(error)
        if no_room is not None:
            return DiskFullError(
                no_room,
                path=staging,
                what=f"the checkpoint of step {step}",
                advice="Free some space (or choose a model_dir with room) and rerun: training "
                "resumes from the newest intact checkpoint.",
            )
        return CheckpointError(
            f"Writing the checkpoint of global step {step} into {staging} failed: {_describe(error)}"
        )


_DCP_ERRORS = (Exception, dcp.CheckpointException)  # DCP's own is a BaseException


def _rank_failures(error: BaseException) -> dict[int, BaseException]:
    failures = getattr(error, "failures", None) or {}
    return {rank: value[0] if isinstance(value, tuple) else value for rank, value in failures.items()}


def _describe(error: BaseException) -> str:
    """One line per failed rank (DCP's own message carries every rank's traceback)."""
    failures = _rank_failures(error)
    if not failures:
        return f"{type(error).__name__}: {error}"
    return "; ".join(f"rank {rank}: {type(cause).__name__}: {cause}" for rank, cause in sorted(failures.items()))


def _no_room_cause(error: BaseException) -> OSError | None:
    """The ENOSPC-like OSError behind a DCP failure (its per-rank failures, or the cause chain), if any."""
    seen: list[BaseException] = [error]
    while seen:
        current = seen.pop()
        if is_no_room(current):
            return current  # type: ignore[return-value]
        seen.extend(_rank_failures(current).values())
        if current.__cause__ is not None:
            seen.append(current.__cause__)
    return None
