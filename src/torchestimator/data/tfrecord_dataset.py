"""TFRecordDataset: TFRecord files as a resumable torch IterableDataset, sharded over ranks and workers.

What belongs here: turning files of records into a stream of records, parsed
examples or batches for training: file shuffling, interleaving, the shuffle
buffer, epochs, sharding across processes and DataLoader workers, and the
position that lets a stopped run continue with the next record. What does not:
the byte format (`tfrecord.py`) and the meaning of records (`example.py`,
`parsing.py`).

Pipeline, per shard and per epoch (epochs never mix)::

    files (shuffled per epoch when shuffle_files, the same order on every shard)
      -> this shard's part: whole files, or every N-th record
      -> interleave: round robin over `interleave_cycle_length` open files, one record each
         (a finished file's slot is taken over by the next file)
      -> shuffle buffer (seeded by seed, epoch and shard)
      -> parse_fn(record) -> batches of batch_size through collate_fn

Sharding. There are `num_shards x num_workers` shards: one per process
(`num_shards`/`shard_index`, an `InputContext`, or torch.distributed when
initialised) times one per DataLoader worker. When the file count is a
multiple of the shard count, each shard reads whole files (`files[i::N]` of the
epoch's order); otherwise every shard reads every file and keeps the records
whose index in the interleaved stream is `i mod N`. Either way each record of an
epoch goes to exactly one shard. `shard_by="file"`/`"record"` forces a mode.
With whole files the shards may hold different record counts, so ranks can see
different numbers of batches per epoch; `num_epochs=None` (train to max_steps)
makes that moot.

`batch_size` is the batch each shard produces, i.e. per process (per replica),
not global; `InputContext.get_per_replica_batch_size` gives it from a global one.
Without batch_size, items are what `parse_fn` returns (records as bytes when
there is none); with it, `collate_fn` (default `default_collate`) builds the
batch. `collate_fn=lambda records: parse_example(records, spec)` with no
parse_fn is the fast path: one batched parse per batch.

Position and resume. Each shard's position is kept on the consumer side, so
items prefetched by DataLoader workers but not handed out are never counted.
Iterated in one process, the dataset reads the position off its paused
generator when `state_dict()` is called (no per-item cost). Through
`.loader(num_workers=...)` (a `TFRecordLoader`), each worker tags every item
with (shard, the shard's position after this item) and the loader strips the
tag and keeps the latest position per shard. `state_dict()` is
`{"shards": {shard: position}, ...}` (JSON); after `load_state_dict()` every
shard starts right after its last delivered item. A shard position is:

- without a shuffle buffer: the epoch, the open files with the byte offset
  of their next record, the next file and the interleave slot. Resume seeks
  there: exact and cheap.
- with a shuffle buffer: the epoch and the count of records that left the
  buffer. Resume replays that shard's epoch from its start with the same seed
  and drops that many records: exact (the same records in the same order),
  paid for by re-reading up to one epoch of the shard's data, not by storing
  the buffer.

The loader also rotates which worker plays which shard so that after a resume
the round robin over workers continues with the shard that was next; the
order of items is then the uninterrupted one (not only the set).

A position belongs to one process: it records `shard_index`/`num_shards` and
the worker count, and loading it under another sharding raises ValueError
rather than silently repeating or skipping data. Under several processes each
rank must therefore get back its own `state_dict()`.

Items are not converted to tensors beyond what `collate_fn` does, so the
loader gives the same items as iterating in one process. A plain
`torch.utils.data.DataLoader(dataset, num_workers=...)` also shards correctly
across its workers, but it cannot report a position; use `.loader()`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from torchestimator.data.tfrecord import (
    DEFAULT_MAX_RECORD_SIZE,
    ReadStats,
    _normalize_compression,
    iter_record_blocks,
    list_files,
)
from torchestimator.distribute.input_context import InputContext

logger = logging.getLogger(__name__)

__all__ = ["TFRecordDataset", "TFRecordLoader"]

_FORMAT = "torchestimator.TFRecordDataset/1"
_FRAMING = 16  # bytes of header and footer around each record


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


# --------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Plan:
    """Everything that decides which records each shard yields, in which order."""

    files: tuple[str, ...]
    compression: str | None
    shuffle_files: bool
    shuffle_buffer_size: int
    seed: int
    num_epochs: int | None
    interleave_cycle_length: int
    shard_by: str
    num_ranks: int
    rank: int
    skip_corrupt: bool
    verify: bool
    strict: bool
    max_record_size: int

    def mode(self, num_shards: int) -> str:
        if self.shard_by != "auto":
            return self.shard_by
        return "file" if len(self.files) % num_shards == 0 else "record"

    def epoch_files(self, epoch: int) -> list[str]:
        if not self.shuffle_files:
            return list(self.files)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))
        return [self.files[index] for index in order]

    def shard_part(self, epoch: int, shard: int, num_shards: int) -> tuple[list[str], int]:
        """The shard's files and the record modulus (1: keep every record of those files)."""
        files = self.epoch_files(epoch)
        if self.mode(num_shards) == "file":
            return files[shard::num_shards], 1
        return files, num_shards

    def shuffle_rng(self, epoch: int, shard: int) -> random.Random:
        # A str seed is hashed with SHA-512, so it is stable across runs and PYTHONHASHSEED.
        return random.Random(f"tfrecord-shuffle:{self.seed}:{epoch}:{shard}")


# --------------------------------------------------------------------------- one epoch of one shard


class _OpenFile:
    """One interleave slot: a file being read, a block at a time."""

    def __init__(self, plan: _Plan, stats: ReadStats, file_index: int, path: str, offset: int) -> None:
        self.file_index = file_index
        self.path = path
        self.offset = offset  # of the first record of the current block, or where reading starts
        self.records: list[bytes] = []
        self.offsets: list[int] = []
        self.index = 0
        self._blocks = iter_record_blocks(
            path, plan.compression, start_offset=offset, skip_corrupt=plan.skip_corrupt,
            verify=plan.verify, strict=plan.strict, stats=stats, max_record_size=plan.max_record_size,
        )

    def next_block(self) -> bool:
        for offsets, records in self._blocks:
            self.offset = self.next_offset()
            self.offsets, self.records, self.index = offsets, records, 0
            return True
        return False

    def next_offset(self) -> int:
        """Byte offset of the record after the last one taken."""
        if self.index < len(self.offsets):
            return self.offsets[self.index]
        if self.records:
            return self.offsets[-1] + _FRAMING + len(self.records[-1])
        return self.offset


class _EpochRecords:
    """A shard's records of one epoch in interleaved order, before the shuffle buffer."""

    def __init__(self, plan: _Plan, files: list[str], modulus: int, remainder: int,
                 start: Mapping[str, Any] | None, stats: ReadStats) -> None:
        self._plan, self._files, self._stats = plan, files, stats
        self._modulus, self._remainder = modulus, remainder
        start = start or {}
        self.next_file = int(start.get("next_file", 0))
        self.slot = int(start.get("slot", 0))
        self.stream_index = int(start.get("stream_index", 0))
        self.slots = [self._open(int(index), int(offset)) for index, offset in start.get("open_files", [])]

    def _open(self, file_index: int, offset: int) -> _OpenFile:
        return _OpenFile(self._plan, self._stats, file_index, self._files[file_index], offset)

    def position(self) -> dict[str, Any]:
        return {
            "next_file": self.next_file, "slot": self.slot, "stream_index": self.stream_index,
            "open_files": [[slot.file_index, slot.next_offset()] for slot in self.slots],
        }

    def __iter__(self) -> Iterator[bytes]:
        if self._plan.interleave_cycle_length == 1:
            return self._sequential()
        return self._interleaved()

    def _sequential(self) -> Iterator[bytes]:
        """One file at a time; the common case, with the least work per record."""
        modulus, remainder, slots = self._modulus, self._remainder, self.slots
        while slots or self.next_file < len(self._files):
            if not slots:
                slots.append(self._open(self.next_file, 0))
                self.next_file += 1
            current = slots[0]
            while current.next_block():
                records, base = current.records, self.stream_index
                for index in range((remainder - base) % modulus, len(records), modulus):
                    current.index = index + 1
                    self.stream_index = base + index + 1
                    yield records[index]
                current.index = len(records)
                self.stream_index = base + len(records)
            del slots[0]

    def _interleaved(self) -> Iterator[bytes]:
        slots, cycle = self.slots, self._plan.interleave_cycle_length
        modulus, remainder = self._modulus, self._remainder
        while len(slots) < cycle and self.next_file < len(self._files):
            slots.append(self._open(self.next_file, 0))
            self.next_file += 1
        while slots:
            if self.slot >= len(slots):
                self.slot = 0
            current = slots[self.slot]
            if current.index == len(current.records) and not current.next_block():
                if self.next_file < len(self._files):  # the next file takes over the slot
                    slots[self.slot] = self._open(self.next_file, 0)
                    self.next_file += 1
                else:
                    del slots[self.slot]
                continue
            record = current.records[current.index]
            current.index += 1
            self.slot += 1
            index = self.stream_index
            self.stream_index = index + 1
            if index % modulus == remainder:
                yield record


def _shuffled(records: Iterator[bytes], size: int, rng: random.Random) -> Iterator[bytes]:
    """TF's shuffle buffer: fill `size`, then emit a random slot and refill it; drain shuffled."""
    buffer: list[bytes] = list(itertools.islice(records, size))
    for record in records:
        slot = rng.randrange(size)
        yield buffer[slot]
        buffer[slot] = record
    rng.shuffle(buffer)
    yield from buffer


# --------------------------------------------------------------------------- one shard, all epochs


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Output:
    parse_fn: Callable[[bytes], Any] | None
    batch_size: int | None
    collate_fn: Callable[[list[Any]], Any]
    drop_remainder: bool


class _ShardStream:
    """One shard's items over all its epochs; `position()` is the point after the last one yielded.

    The position is read from the paused generator's state rather than
    computed per item, so tracking costs nothing until it is asked for.
    """

    def __init__(self, plan: _Plan, output: _Output, shard: int, num_shards: int,
                 start: Mapping[str, Any] | None) -> None:
        self._plan, self._output = plan, output
        self._shard, self._num_shards = shard, num_shards
        self._start = dict(start) if start else None
        self._epoch = int(start["epoch"]) if start else 0
        self._reader: _EpochRecords | None = None
        self._delivered = 0  # records out of the shuffle buffer this epoch (only kept with a buffer)
        self.stats = ReadStats()

    def position(self) -> dict[str, Any] | None:
        if self._reader is None:
            return None if self._start is None else dict(self._start)
        if self._plan.shuffle_buffer_size:
            return {"epoch": self._epoch, "delivered": self._delivered}
        return {"epoch": self._epoch, **self._reader.position()}

    def __iter__(self) -> Iterator[Any]:
        plan, start = self._plan, self._start
        while plan.num_epochs is None or self._epoch < plan.num_epochs:
            yielded = 0
            for item in self._items(self._epoch_records(start)):
                yielded += 1
                yield item
            if start is None and not yielded and plan.num_epochs is None:
                raise ValueError(
                    f"TFRecordDataset shard {self._shard} of {self._num_shards} got no items in epoch "
                    f"{self._epoch} from {len(plan.files)} files, so repeating forever would hang. Check "
                    f"the files, or use fewer processes x workers than records (batches with drop_remainder)."
                )
            start = None
            self._epoch += 1
        self._reader = _EpochRecords(plan, [], 1, 0, None, self.stats)  # at the end: nothing left
        self._delivered = 0
        if self.stats.skipped_files:
            logger.warning("TFRecordDataset shard %d: %s.", self._shard, self.stats.summary())

    def _epoch_records(self, start: Mapping[str, Any] | None) -> Iterator[bytes]:
        plan, shard = self._plan, self._shard
        files, modulus = plan.shard_part(self._epoch, shard, self._num_shards)
        if not plan.shuffle_buffer_size:
            self._reader = _EpochRecords(plan, files, modulus, shard % modulus, start, self.stats)
            return iter(self._reader)
        # Resume by replay: the same seed gives the same order; drop what was delivered.
        self._reader = _EpochRecords(plan, files, modulus, shard % modulus, None, self.stats)
        self._delivered = int(start.get("delivered", 0)) if start else 0
        shuffled = _shuffled(iter(self._reader), plan.shuffle_buffer_size, plan.shuffle_rng(self._epoch, shard))
        return itertools.islice(shuffled, self._delivered, None)

    def _items(self, records: Iterator[bytes]) -> Iterator[Any]:
        output, counting = self._output, bool(self._plan.shuffle_buffer_size)
        parse, batch_size = output.parse_fn, output.batch_size
        if batch_size is not None:
            while batch := list(itertools.islice(records, batch_size)):
                if len(batch) < batch_size and output.drop_remainder:
                    return
                self._delivered += len(batch)
                yield output.collate_fn(batch if parse is None else [parse(record) for record in batch])
        elif counting:
            for record in records:
                self._delivered += 1
                yield record if parse is None else parse(record)
        else:
            yield from (records if parse is None else map(parse, records))


class _TaggedShards(IterableDataset):
    """What runs in each DataLoader worker: its shard's items tagged with (shard, position)."""

    def __init__(self, plan: _Plan, output: _Output, starts: Mapping[int, Mapping[str, Any]],
                 rotation: int, tagged: bool) -> None:
        super().__init__()
        self._plan, self._output, self._starts = plan, output, dict(starts)
        self._rotation, self._tagged = rotation, tagged

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        shard = self._plan.rank * num_workers + (worker + self._rotation) % num_workers
        num_shards = self._plan.num_ranks * num_workers
        stream = _ShardStream(self._plan, self._output, shard, num_shards, self._starts.get(shard))
        if not self._tagged:
            return iter(stream)
        return ((shard, stream.position(), item) for item in stream)


def _untouched(item: Any) -> Any:
    return item


# --------------------------------------------------------------------------- positions


class _Positions:
    """The consumer-side record of each shard's position, and its JSON form."""

    def __init__(self, plan: _Plan, num_workers: int) -> None:
        self._plan, self._num_workers = plan, num_workers
        self.shards: dict[int, dict[str, Any]] = {}
        self.next_worker_shard = 0
        self.pending = False  # set by load(): the next iteration resumes instead of restarting
        self._live: tuple[int, _ShardStream] | None = None  # a stream iterated in this process

    def follow(self, shard: int, stream: _ShardStream) -> None:
        """Reads this shard's position from `stream` itself (same process: no tags needed)."""
        self._live = (shard, stream)

    def record(self, shard: int, position: dict[str, Any]) -> None:
        self.shards[shard] = position
        self.next_worker_shard = (shard - self._plan.rank * self._num_workers + 1) % self._num_workers

    def state_dict(self) -> dict[str, Any]:
        plan = self._plan
        if self._live is not None:
            shard, stream = self._live
            position = stream.position()
            if position is not None:
                self.shards[shard] = position
        return {
            "format": _FORMAT, "num_files": len(plan.files), "num_ranks": plan.num_ranks,
            "rank": plan.rank, "num_workers": self._num_workers,
            "shard_mode": plan.mode(plan.num_ranks * self._num_workers),
            "next_worker_shard": self.next_worker_shard,
            "shards": {str(shard): dict(position) for shard, position in sorted(self.shards.items())},
        }

    def load(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise ValueError(f"This is not a TFRecordDataset position (expected format {_FORMAT!r}); "
                             f"received {state!r:.200}.")
        expected = self.state_dict()
        for key in ("num_files", "num_ranks", "rank", "num_workers", "shard_mode"):
            if state.get(key) != expected[key]:
                raise ValueError(
                    f"The saved TFRecordDataset position was made with {key}={state.get(key)!r}, this "
                    f"input has {key}={expected[key]!r}. A position resumes exactly only with the same "
                    f"files, processes (each rank its own position) and DataLoader workers; keep them, "
                    f"or start the input from the beginning by not restoring its position."
                )
        self.shards = {int(shard): dict(position) for shard, position in state["shards"].items()}
        self.next_worker_shard = int(state.get("next_worker_shard", 0))
        self.pending = True
        self._live = None

    def starts(self) -> tuple[dict[int, dict[str, Any]], int]:
        """Start positions and worker rotation for a new iteration (fresh unless just loaded)."""
        if not self.pending:
            self.shards, self.next_worker_shard = {}, 0
        self.pending, self._live = False, None
        return dict(self.shards), self.next_worker_shard


# --------------------------------------------------------------------------- public classes


def _resolve_ranks(num_shards: int | None, shard_index: int | None,
                   input_context: InputContext | None) -> tuple[int, int]:
    if input_context is not None:
        if num_shards is not None or shard_index is not None:
            raise ValueError("Pass either input_context or num_shards/shard_index to TFRecordDataset, "
                             "not both.")
        return input_context.num_input_pipelines, input_context.input_pipeline_id
    if num_shards is None and shard_index is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0
    if not (_is_int(num_shards, 1) and _is_int(shard_index, 0) and shard_index < num_shards):
        raise ValueError(f"TFRecordDataset needs num_shards >= 1 and 0 <= shard_index < num_shards; "
                         f"received num_shards={num_shards!r}, shard_index={shard_index!r}.")
    return num_shards, shard_index


def _check_options(options: Mapping[str, Any]) -> None:
    for name, minimum in (("shuffle_buffer_size", 0), ("interleave_cycle_length", 1), ("seed", 0),
                          ("max_record_size", 0)):
        if not _is_int(options[name], minimum):
            raise ValueError(f"TFRecordDataset: {name} must be an integer >= {minimum}; "
                             f"received {options[name]!r}.")
    for name in ("num_epochs", "batch_size"):
        if options[name] is not None and not _is_int(options[name], 1):
            raise ValueError(f"TFRecordDataset: {name} must be None or an integer >= 1; "
                             f"received {options[name]!r}.")
    if options["shard_by"] not in ("auto", "file", "record"):
        raise ValueError(f'TFRecordDataset: shard_by must be "auto", "file" or "record"; '
                         f'received {options["shard_by"]!r}.')
    for name in ("parse_fn", "collate_fn"):
        if options[name] is not None and not callable(options[name]):
            raise TypeError(f"TFRecordDataset: {name} must be callable or None; received "
                            f"{type(options[name]).__name__}.")


class TFRecordDataset(IterableDataset):
    """TFRecord files (paths, globs or a list) as a sharded, resumable stream; see the module docstring.

    Iterating it in the main process yields this process's items and tracks
    the position (`state_dict`); `.loader(num_workers=...)` does the same over
    DataLoader workers. `compression`, `skip_corrupt`, `verify`, `strict` and
    `max_record_size` (bytes; a longer record is a DataLossError) are
    `iter_records`'s options.
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        compression: str | None = None,
        *,
        shuffle_files: bool = False,
        shuffle_buffer_size: int = 0,
        seed: int = 0,
        num_epochs: int | None = 1,
        parse_fn: Callable[[bytes], Any] | None = None,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_remainder: bool = False,
        skip_corrupt: bool = False,
        interleave_cycle_length: int = 1,
        shard_by: str = "auto",
        num_shards: int | None = None,
        shard_index: int | None = None,
        input_context: InputContext | None = None,
        verify: bool = True,
        strict: bool = True,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
    ) -> None:
        super().__init__()
        _check_options(locals())
        num_ranks, rank = _resolve_ranks(num_shards, shard_index, input_context)
        paths = tuple(list_files(files))
        self._plan = _Plan(
            files=paths, compression=_normalize_compression(compression, allow_auto=True),
            shuffle_files=bool(shuffle_files), shuffle_buffer_size=shuffle_buffer_size, seed=seed,
            num_epochs=num_epochs, interleave_cycle_length=interleave_cycle_length, shard_by=shard_by,
            num_ranks=num_ranks, rank=rank, skip_corrupt=bool(skip_corrupt), verify=bool(verify),
            strict=bool(strict), max_record_size=max_record_size,
        )
        if shard_by == "file" and len(paths) < num_ranks:
            raise ValueError(f'TFRecordDataset: shard_by="file" needs at least one file per process; '
                             f'received {len(paths)} files for {num_ranks} processes. Use shard_by="auto".')
        self._output = _Output(parse_fn=parse_fn, batch_size=batch_size,
                               collate_fn=collate_fn or default_collate, drop_remainder=bool(drop_remainder))
        self._positions = _Positions(self._plan, num_workers=1)

    @property
    def files(self) -> tuple[str, ...]:
        return self._plan.files

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is not None:  # inside a user's own DataLoader: shard, no position
            return iter(_TaggedShards(self._plan, self._output, {}, 0, tagged=False))
        return self._tracked()

    def _tracked(self) -> Iterator[Any]:
        starts, _ = self._positions.starts()
        shard = self._plan.rank
        stream = _ShardStream(self._plan, self._output, shard, self._plan.num_ranks, starts.get(shard))
        self._positions.follow(shard, stream)
        yield from stream

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position just after the last item handed out by `iter()`."""
        return self._positions.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The next `iter()` continues right after the item `state` points to."""
        self._positions.load(state)

    def loader(self, num_workers: int = 0, **dataloader_options: Any) -> TFRecordLoader:
        """A resumable DataLoader over `num_workers` processes (see `TFRecordLoader`)."""
        return TFRecordLoader(self, num_workers=num_workers, **dataloader_options)


class TFRecordLoader:
    """Iterates a TFRecordDataset through a DataLoader with worker processes, keeping its position.

    Extra keyword options go to DataLoader (pin_memory, prefetch_factor,
    persistent_workers, multiprocessing_context, timeout...); batching is the
    dataset's, so batch_size/sampler/collate_fn options are refused.
    """

    def __init__(self, dataset: TFRecordDataset, num_workers: int = 0, **dataloader_options: Any) -> None:
        if not isinstance(dataset, TFRecordDataset):
            raise TypeError(f"TFRecordLoader wraps a TFRecordDataset; received {type(dataset).__name__}.")
        if not _is_int(num_workers, 0):
            raise ValueError(f"TFRecordLoader: num_workers must be an integer >= 0; received {num_workers!r}.")
        refused = sorted(set(dataloader_options) & {"batch_size", "shuffle", "sampler", "batch_sampler",
                                                    "collate_fn", "drop_last", "in_order", "worker_init_fn"})
        if refused:
            raise ValueError(f"TFRecordLoader: {', '.join(refused)} cannot be set here; batching and "
                             f"shuffling are TFRecordDataset options (batch_size, collate_fn, "
                             f"shuffle_buffer_size).")
        self._dataset = dataset
        self._num_workers = num_workers
        self._options = dataloader_options
        self._positions = _Positions(dataset._plan, num_workers=max(num_workers, 1))

    def __iter__(self) -> Iterator[Any]:
        starts, rotation = self._positions.starts()
        dataset = self._dataset
        tagged = _TaggedShards(dataset._plan, dataset._output, starts, rotation, tagged=True)
        # An own generator keeps DataLoader from drawing seeds from torch's global RNG.
        generator = torch.Generator()
        generator.manual_seed(dataset._plan.seed)
        loader = DataLoader(tagged, batch_size=None, collate_fn=_untouched, num_workers=self._num_workers,
                            generator=generator, **self._options)
        for shard, position, item in loader:
            self._positions.record(shard, position)
            yield item

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position: per shard, just after its last item handed to the consumer."""
        return self._positions.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The next `iter()` continues every shard right after its item in `state`."""
        self._positions.load(state)
