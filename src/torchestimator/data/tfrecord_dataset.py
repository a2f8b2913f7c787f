"""TFRecordDataset: TFRecord files as a resumable torch IterableDataset, sharded over ranks and workers.

What belongs here: turning files of records into a stream of records, parsed
examples or batches for training: file shuffling, interleaving, the shuffle
buffer, epochs, sharding across processes and DataLoader workers, and the
position that lets a stopped run continue with the next record. What does not:
the byte format (`tfrecord.py`) and the meaning of records (`example.py`,
`parsing.py`).

Files may be URLs (`gs://b/train-*.tfrecord`, `s3://`, `az://`): the same
records, batches and positions as the same files on disk (a position saved over
local files resumes over their copies in a bucket: names and bytes are what it
checks). Each open object is fetched ahead in large ranges, the next file of the
epoch is opened (and its first ranges fetched) while the one before it is read,
and an interleave's files are fetched in parallel (`_remote_files.py`).

Pipeline, per shard and per epoch (the shuffle buffer never mixes epochs)::

    files (shuffled per epoch when shuffle_files, the same order on every shard)
      -> this shard's part: whole files, or every N-th record
      -> interleave: round robin over `interleave_cycle_length` open files, one record each
         (a finished file's slot is taken over by the next file)
      -> shuffle buffer (seeded by seed, epoch and shard)
    then over the epochs laid end to end (TF's `shuffle(...).repeat(num_epochs).batch(batch_size)`):
      -> parse_fn(record) -> batches of batch_size through collate_fn

Batches run across epoch boundaries (10 records, batch 4: `[0-3] [4-7] [8 9 0 1]
[2-5] ...`), so with `num_epochs=None` every batch is full, and with a finite
num_epochs only the very last batch of the shard may be short (drop_remainder
drops it). A batch that runs across is handed out with the next epoch's
position, so a resume continues right after it.

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

`batch_size` is the global batch, as for every input helper
(`inputs.split_global_batch`): each of the `num_shards` processes (replicas)
produces batches of batch_size / num_shards (refused when it does not divide),
and the start-up log says both ("global batch 64 = 2 replicas x 32 per
replica"). DataLoader workers are not replicas: each worker of a process
produces that process's per-replica batches. Without batch_size, items are what `parse_fn` returns (records as bytes when
there is none); with it, `collate_fn` (default `default_collate`) builds the
batch.

`features=` (a `parse_example` spec, instead of parse_fn/collate_fn) is the
fast path: with batch_size, each batch is ONE `parse_example(records,
features)` call converted by `to_torch` (numeric arrays become tensors,
strings stay numpy object arrays, VarLen a sparse tensor, Ragged a
RaggedValue of tensors); without batch_size each record is
`to_torch(parse_single_example(record, features))`. `label_key="label"`
makes each item the pair `(features without label, label)` that an
input_fn returns (TF's `make_batched_features_dataset(label_key=)`).
Batches are cut out of
the reader's blocks with list slices (`_dataset_records.py`; through an
interleave, whole rounds over the open files at once), so there is no
Python step per record between the file and the parser, except in the
shuffle buffer (one random draw per record, as TF's).
For FixedLen features the batches equal parse_fn=parse_single_example with
the default collate, value for value and dtype for dtype.

`images={"image": ImageDecoding(size=(224, 224))}` (with features=, each name
a `FixedLenFeature([], "string")` of encoded PNG/JPEG/GIF bytes) decodes those
features after parsing, into a float32 tensor [N, ...] per batch
(`ImageDecoding.decode_batch` of the same bytes: HWC or CHW), or one image per
item without batch_size. Decoding happens on the batch output only, so
sharding and positions are untouched; a bad image is an ImageDecodeError
naming the feature and, without a shuffle buffer (or with one over
uncompressed files), the file and byte offset of its record.

Position and resume. Each shard's position is kept on the consumer side, so
items prefetched by DataLoader workers but not handed out are never counted.
Iterated in one process, the dataset reads the position off its paused
generator when `state_dict()` is called (no per-item cost). Through
`.loader(num_workers=...)` (a `TFRecordLoader`), each worker tags every item
with (shard, the shard's position after this item) and the loader strips the
tag and keeps the latest position per shard (a shuffle buffer's tag carries
only the slots that changed since the worker's previous item, and the
loader patches its copy). `state_dict()` is
`{"shards": {shard: position}, ...}` (JSON); after `load_state_dict()` every
shard starts right after its last delivered item. A shard position is:

- without a shuffle buffer: the epoch, the open files with the byte offset
  of their next record, the next file and the interleave slot. Resume seeks
  there: exact and cheap.
- with a shuffle buffer, on uncompressed files: the epoch, the reader's
  position, the RNG state and the (file, byte offset) of every record in the
  buffer. Resume re-reads those records by offset: the same order as the
  uninterrupted run, in time that depends on the buffer size, not on how far
  into the epoch it stopped (`_dataset_shuffle.py`; ~140 KB of JSON for a
  10k buffer).
- with a shuffle buffer on GZIP/ZLIB files (no random access), and for
  positions saved before the buffer was (`{"epoch", "delivered"}`): the epoch
  and the count of records that left the buffer. Resume replays that shard's
  epoch from its start with the same seed and drops that many records: exact,
  but paid for by re-reading up to one epoch of the shard's data (logged once
  at resume).

The loader also rotates which worker plays which shard so that after a resume
the round robin over workers continues with the shard that was next; the
order of items is then the uninterrupted one (not only the set).

A position names the files it points into, not only their count:
`files_digest` hashes the ordered list of file basenames (paths may move
between machines; names and order may not), and each shard position carries
`file_ids`, the size and a CRC32C of the first and last 4 KiB of every file it
points into (open files and, with a buffer, the files of buffered records;
computed once per file open). Loading under renamed or reordered files is a
ValueError; resuming on a file rewritten, truncated or grown since is a
DataLossError naming the file, even with skip_corrupt. Either way: restore the
files, or start the input afresh by not loading the position. Positions saved
before these fields resume unchecked (logged once at INFO).

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
import hashlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from torchestimator.data._dataset_records import _EpochRecords, _Plan
from torchestimator.data._dataset_shuffle import _ShuffleBuffer, position_from_tag, position_to_json
from torchestimator.data._to_torch import to_torch
from torchestimator.data.images import ImageDecoding
from torchestimator.data.inputs import split_global_batch
from torchestimator.data.parsing import parse_example, parse_single_example
from torchestimator.data.tfrecord import DEFAULT_MAX_RECORD_SIZE, ReadStats, _normalize_compression, list_files
from torchestimator.distribute.input_context import InputContext

logger = logging.getLogger(__name__)

__all__ = ["TFRecordDataset", "TFRecordLoader"]

_FORMAT = "torchestimator.TFRecordDataset/1"
_unchecked_logged = False  # the INFO line for a position without file identities, once per process


def _files_digest(files: Sequence[str]) -> str:
    """A short hash of the ordered file basenames: a position's file indices mean these files."""
    names = "\0".join(os.path.basename(path) for path in files)
    return hashlib.sha256(names.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _is_int(value: object, minimum: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


# --------------------------------------------------------------------------- one shard, all epochs


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Output:
    """What becomes of the records: items one by one, or batches of batch_size."""

    parse_fn: Callable[[bytes], Any] | None
    features: Mapping[str, Any] | None
    label_key: str | None
    batch_size: int | None
    collate_fn: Callable[[list[Any]], Any]
    drop_remainder: bool
    images: Mapping[str, ImageDecoding] | None = None

    def item(self, record: bytes, where: Callable[[int], str] | None = None) -> Any:
        if self.features is not None:
            parsed = to_torch(parse_single_example(record, self.features))
            for name, decoding in (self.images or {}).items():
                parsed[name] = torch.from_numpy(decoding.decode(parsed[name].item(), _image_where(where, 0, name)))
            return self._split_label(parsed)
        return record if self.parse_fn is None else self.parse_fn(record)

    def batch(self, records: list[bytes], where: Callable[[int], str] | None = None) -> Any:
        if self.features is not None:  # one parse call for the whole batch
            parsed = to_torch(parse_example(records, self.features))
            for name, decoding in (self.images or {}).items():
                parsed[name] = torch.from_numpy(self._decoded(decoding, parsed[name], name, where))
            return self._split_label(parsed)
        if self.parse_fn is None:
            return self.collate_fn(records)
        parse = self.parse_fn
        return self.collate_fn([parse(record) for record in records])

    @staticmethod
    def _decoded(decoding: ImageDecoding, values: Any, name: str, where: Callable[[int], str] | None) -> Any:
        out = np.empty((len(values), *decoding.shape), dtype=np.float32)
        for index, contents in enumerate(values):
            out[index] = decoding.decode(contents, _image_where(where, index, name))
        return out

    def _split_label(self, parsed: dict[str, Any]) -> Any:
        # (features, labels), the pair an input_fn returns, as TF's make_batched_features_dataset(label_key=)
        if self.label_key is None:
            return parsed
        label = parsed.pop(self.label_key)
        return parsed, label


def _image_where(where: Callable[[int], str] | None, index: int, name: str) -> str:
    return f"{where(index) if where else 'TFRecordDataset record'}, feature {name!r}"


def _joined_names(parts: list[tuple[int, Callable[[int], str]]]) -> Callable[[int], str]:
    """Names the records of a batch taken in parts (e.g. across an epoch boundary): (first index, names)."""
    if len(parts) == 1:
        return parts[0][1]

    def where(index: int) -> str:
        first, names = next((first, names) for first, names in reversed(parts) if index >= first)
        return names(index - first)

    return where


class _ShardStream:
    """One shard's items over all its epochs; `position()` is the point after the last one yielded.

    The position is read from the paused generator's state rather than
    computed per item, so tracking costs nothing until it is asked for.
    """

    def __init__(
        self,
        plan: _Plan,
        output: _Output,
        shard: int,
        num_shards: int,
        start: Mapping[str, Any] | None,
        tagged: bool = False,
    ) -> None:
        self._plan, self._output, self._tagged = plan, output, tagged
        self._shard, self._num_shards = shard, num_shards
        self._start = dict(start) if start else None
        self._epoch = int(start["epoch"]) if start else 0
        self._reader: _EpochRecords | None = None
        self._buffer: _ShuffleBuffer | None = None  # only with a shuffle buffer
        self._random_access: dict[str, bool] = {}
        self.stats = ReadStats()

    def position(self) -> dict[str, Any] | None:
        if self._reader is None:
            return None if self._start is None else dict(self._start)
        if self._buffer is not None:
            return {"epoch": self._epoch, **self._buffer.position()}
        return {"epoch": self._epoch, **self._reader.position()}

    def tag(self) -> dict[str, Any] | None:
        """`position()` as sent with each item from a worker: a buffer sends only what changed."""
        if self._buffer is not None and self._reader is not None:
            return {"epoch": self._epoch, **self._buffer.tag()}
        return self.position()

    def __iter__(self) -> Iterator[Any]:
        plan = self._plan
        yield from (self._items_of_epochs() if self._output.batch_size is None else self._batches())
        self._reader = _EpochRecords(plan, [], 1, 0, None, self.stats)  # at the end: nothing left
        self._buffer = None
        if self.stats.skipped_files:
            logger.warning("TFRecordDataset shard %d: %s.", self._shard, self.stats.summary())

    def _open_epoch(self, start: Mapping[str, Any] | None) -> _EpochRecords:
        """Sets up the reader (and buffer) of the current epoch at `start` (None: its beginning); the reader."""
        plan, shard = self._plan, self._shard
        files, modulus = plan.shard_part(self._epoch, shard, self._num_shards)
        remainder = shard % modulus
        self._buffer = None
        if not plan.shuffle_buffer_size:
            self._reader = _EpochRecords(plan, files, modulus, remainder, start, self.stats)
            return self._reader
        random_access = self._has_random_access(files)
        saved_buffer = start if start is not None and random_access and "buffer_files" in start else None
        reader_start = saved_buffer["reader"] if saved_buffer is not None else None
        self._reader = _EpochRecords(plan, files, modulus, remainder, reader_start, self.stats)
        buffer = _ShuffleBuffer(
            self._reader, plan.shuffle_buffer_size, plan.shuffle_rng(self._epoch, shard), random_access
        )
        if saved_buffer is not None:
            buffer.restore(saved_buffer, ReadStats())  # re-reads count apart: stats say what the epoch read
        elif start:  # no random access, or a position from before the buffer was saved: replay
            buffer.skip(int(start.get("delivered", 0)))
        if self._tagged:
            buffer.track_changes()
        self._buffer = buffer
        return self._reader

    def _has_random_access(self, files: list[str]) -> bool:
        known = self._random_access
        for path in files:
            if path not in known:
                known[path] = self._plan.random_access([path])
        return all(known[path] for path in files)

    def _take(self, reader: _EpochRecords, count: int) -> list[bytes]:
        if self._buffer is not None:
            return self._buffer.take(count)
        return reader.take(count).records

    def _record_names(self, files: list[int], offsets: list[int]) -> Callable[[int], str]:
        """Names a batch's records by file and offset, for image decode errors."""
        paths = self._reader.files if self._reader is not None else []
        return lambda index: f"{paths[files[index]]}: record at offset {offsets[index]}"

    def _batch_position_names(self, first: int) -> Callable[[int], str]:
        """Without (file, offset) refs: the shard, epoch and the record's place in its epoch."""
        shard, epoch = self._shard, self._epoch
        return lambda index: (
            f"TFRecordDataset shard {shard}, epoch {epoch}: record {first + index} of the "
            f"shard's epoch (after the shuffle buffer)"
        )

    def _take_named(self, reader: _EpochRecords, count: int) -> tuple[list[bytes], Callable[[int], str]]:
        """`_take`, with what names each record for image decode errors."""
        if self._buffer is None:
            taken = reader.take(count, refs=True)
            return taken.records, self._record_names(taken.files, taken.offsets)
        where = self._batch_position_names(self._buffer.delivered)
        return self._buffer.take(count), where

    def _check_not_empty(self, start: Mapping[str, Any] | None, records: int) -> None:
        plan = self._plan
        if start is None and not records and plan.num_epochs is None:
            raise ValueError(
                f"TFRecordDataset shard {self._shard} of {self._num_shards} got no items in epoch "
                f"{self._epoch} from {len(plan.files)} files, so repeating forever would hang. Check "
                f"the files, or use fewer processes x workers than records."
            )

    def _batches(self) -> Iterator[Any]:
        """Batches over the epochs laid end to end, as TF's `repeat(num_epochs).batch(batch_size)`.

        A batch runs across an epoch boundary (the tail of one epoch's records,
        then the head of the next one's), so only the very last batch of a
        finite input may be short, and drop_remainder drops only that one. A
        batch is handed out with the state after its last record (the next
        epoch's, when it ran across), which is what `position()` reads.
        """
        plan, output, start = self._plan, self._output, self._start
        size = output.batch_size
        assert size is not None, "_batches is the batched output's"
        pending: list[bytes] = []
        names: list[tuple[int, Callable[[int], str]]] = []  # (first index in the batch, names), with images=
        while plan.num_epochs is None or self._epoch < plan.num_epochs:
            reader, taken = self._open_epoch(start), 0
            while True:
                if output.images:
                    records, where = self._take_named(reader, size - len(pending))
                    names.append((len(pending), where))
                else:
                    records = self._take(reader, size - len(pending))
                if not records:
                    break
                taken += len(records)
                pending = pending + records if pending else records
                if len(pending) == size:
                    yield output.batch(pending, _joined_names(names) if output.images else None)
                    pending, names = [], []
            self._check_not_empty(start, taken)
            if pending and self._epoch + 1 == plan.num_epochs and not output.drop_remainder:
                yield output.batch(pending, _joined_names(names) if output.images else None)  # the last, short
            start = None
            self._epoch += 1

    def _items_of_epochs(self) -> Iterator[Any]:
        """The unbatched items, epoch after epoch."""
        plan, start = self._plan, self._start
        while plan.num_epochs is None or self._epoch < plan.num_epochs:
            yielded = 0
            for item in self._items(start):
                yielded += 1
                yield item
            self._check_not_empty(start, yielded)
            start = None
            self._epoch += 1

    def _items(self, start: Mapping[str, Any] | None) -> Iterator[Any]:
        reader = self._open_epoch(start)
        output = self._output
        if output.images:
            while True:
                record, where = self._take_named(reader, 1)
                if not record:
                    return
                yield output.item(record[0], where)
        elif self._buffer is not None:
            records = self._buffer.one_by_one()
            yield from (records if output.parse_fn is None and output.features is None else map(output.item, records))
        elif output.parse_fn is None and output.features is None:
            yield from reader
        else:
            yield from map(output.item, reader)


class _TaggedShards(IterableDataset):
    """What runs in each DataLoader worker: its shard's items tagged with (shard, position)."""

    def __init__(
        self, plan: _Plan, output: _Output, starts: Mapping[int, Mapping[str, Any]], rotation: int, tagged: bool
    ) -> None:
        super().__init__()
        self._plan, self._output, self._starts = plan, output, dict(starts)
        self._rotation, self._tagged = rotation, tagged

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        shard = self._plan.rank * num_workers + (worker + self._rotation) % num_workers
        num_shards = self._plan.num_ranks * num_workers
        stream = _ShardStream(self._plan, self._output, shard, num_shards, self._starts.get(shard), tagged=self._tagged)
        if not self._tagged:
            return iter(stream)
        return ((shard, stream.tag(), item) for item in stream)


def _untouched(item: Any) -> Any:
    return item


# --------------------------------------------------------------------------- positions


class _Positions:
    """The consumer-side record of each shard's position, and its JSON form."""

    def __init__(self, plan: _Plan, num_workers: int) -> None:
        self._plan, self._num_workers = plan, num_workers
        self._files_digest = _files_digest(plan.files)
        self.shards: dict[int, dict[str, Any]] = {}
        self.next_worker_shard = 0
        self.pending = False  # set by load(): the next iteration resumes instead of restarting
        self._live: tuple[int, _ShardStream] | None = None  # a stream iterated in this process

    def follow(self, shard: int, stream: _ShardStream) -> None:
        """Reads this shard's position from `stream` itself (same process: no tags needed)."""
        self._live = (shard, stream)

    def record(self, shard: int, tag: dict[str, Any]) -> None:
        self.shards[shard] = position_from_tag(self.shards.get(shard), tag)
        self.next_worker_shard = (shard - self._plan.rank * self._num_workers + 1) % self._num_workers

    def state_dict(self) -> dict[str, Any]:
        plan = self._plan
        if self._live is not None:
            shard, stream = self._live
            position = stream.position()
            if position is not None:
                self.shards[shard] = position
        return {
            "format": _FORMAT,
            "num_files": len(plan.files),
            "files_digest": self._files_digest,
            "num_ranks": plan.num_ranks,
            "rank": plan.rank,
            "num_workers": self._num_workers,
            "shard_mode": plan.mode(plan.num_ranks * self._num_workers),
            "next_worker_shard": self.next_worker_shard,
            "shards": {str(shard): position_to_json(position) for shard, position in sorted(self.shards.items())},
        }

    def load(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("format") != _FORMAT:
            raise ValueError(
                f"This is not a TFRecordDataset position (expected format {_FORMAT!r}); received {state!r:.200}."
            )
        expected = self.state_dict()
        for key in ("num_files", "num_ranks", "rank", "num_workers", "shard_mode"):
            if state.get(key) != expected[key]:
                raise ValueError(
                    f"The saved TFRecordDataset position was made with {key}={state.get(key)!r}, this "
                    f"input has {key}={expected[key]!r}. A position resumes exactly only with the same "
                    f"files, processes (each rank its own position) and DataLoader workers; keep them, "
                    f"or start the input from the beginning by not restoring its position."
                )
        self._check_files_digest(state)
        self.shards = {int(shard): dict(position) for shard, position in state["shards"].items()}
        self.next_worker_shard = int(state.get("next_worker_shard", 0))
        self.pending = True
        self._live = None

    def _check_files_digest(self, state: Mapping[str, Any]) -> None:
        global _unchecked_logged
        saved = state.get("files_digest")
        if saved is None:
            if not _unchecked_logged:
                _unchecked_logged = True
                logger.info(
                    "TFRecordDataset: this position was saved without file identities (an earlier "
                    "version), so resuming cannot check that its files are the ones it was saved over."
                )
            return
        if saved != self._files_digest:
            names = [os.path.basename(path) for path in self._plan.files]
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise ValueError(
                f"The saved TFRecordDataset position was made over files whose ordered names hash to "
                f"{saved!r}; this input's {len(names)} files ({shown}) hash to {self._files_digest!r}: they "
                f"were renamed, replaced or passed in another order, so the position's file indices would "
                f"point into other files. Pass the files of the run that saved the position, in its order, "
                f"or start the input afresh by not loading its position."
            )

    def describe(self, state: Mapping[str, Any]) -> str:
        """`state` in one short line: per shard (two at most) the epoch, the file and byte offset read next
        and the records consumed in the epoch; the whole position (RNG state, buffer refs) is for DEBUG."""
        shards = sorted((int(shard), position) for shard, position in dict(state.get("shards", {})).items())
        head = f"TFRecordDataset over {len(self._plan.files)} files"
        if not shards:
            return f"{head}: the beginning"
        named = len(shards) > 1 or self._plan.num_ranks > 1
        words = [self._describe_shard(shard, position, named) for shard, position in shards[:2]]
        more = f"; {len(shards) - 2} more shards" if len(shards) > 2 else ""
        return f"{head}: {'; '.join(words)}{more}"

    def _describe_shard(self, shard: int, position: Mapping[str, Any], named: bool) -> str:
        epoch = int(position.get("epoch", 0))
        files, modulus = self._plan.shard_part(epoch, shard, self._plan.num_ranks * self._num_workers)
        reader = position.get("reader", position)  # a buffered position nests its reader's

        def name(index: int) -> str:
            return os.path.basename(files[index]) if 0 <= index < len(files) else f"file {index}"

        open_files = reader.get("open_files") or []
        if open_files:
            where = f"{name(int(open_files[0][0]))} at byte {int(open_files[0][1])}"
            where += f" (+{len(open_files) - 1} open)" if len(open_files) > 1 else ""
        elif "next_file" not in reader:
            where = "the epoch replayed from its start"  # compressed files: no offsets saved
        elif int(reader["next_file"]) < len(files):
            where = f"{name(int(reader['next_file']))} at byte 0"
        else:
            where = "the end of the epoch's files"
        if "delivered" in position:
            consumed = int(position["delivered"])
        else:  # records of the interleaved stream that were this shard's (every modulus-th)
            consumed = max(0, -(-(int(reader.get("stream_index", 0)) - shard % modulus) // modulus))
        buffered = f", {len(position['buffer_files'])} buffered records" if "buffer_files" in position else ""
        label = f"shard {shard}, " if named else ""
        return f"{label}epoch {epoch}, reading {where}, {consumed} records consumed in the epoch{buffered}"

    def starts(self) -> tuple[dict[int, dict[str, Any]], int]:
        """Start positions and worker rotation for a new iteration (fresh unless just loaded)."""
        if not self.pending:
            self.shards, self.next_worker_shard = {}, 0
        self.pending, self._live = False, None
        return {shard: position_to_json(kept) for shard, kept in self.shards.items()}, self.next_worker_shard


# --------------------------------------------------------------------------- public classes


def _resolve_ranks(
    num_shards: int | None, shard_index: int | None, input_context: InputContext | None
) -> tuple[int, int]:
    if input_context is not None:
        if num_shards is not None or shard_index is not None:
            raise ValueError("Pass either input_context or num_shards/shard_index to TFRecordDataset, not both.")
        return input_context.num_input_pipelines, input_context.input_pipeline_id
    if num_shards is None and shard_index is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_world_size(), torch.distributed.get_rank()
        return 1, 0
    if not (_is_int(num_shards, 1) and _is_int(shard_index, 0) and shard_index < num_shards):
        raise ValueError(
            f"TFRecordDataset needs num_shards >= 1 and 0 <= shard_index < num_shards; "
            f"received num_shards={num_shards!r}, shard_index={shard_index!r}."
        )
    return num_shards, shard_index


def _check_options(options: Mapping[str, Any]) -> None:
    for name, minimum in (
        ("shuffle_buffer_size", 0),
        ("interleave_cycle_length", 1),
        ("seed", 0),
        ("max_record_size", 0),
    ):
        if not _is_int(options[name], minimum):
            raise ValueError(f"TFRecordDataset: {name} must be an integer >= {minimum}; received {options[name]!r}.")
    for name in ("num_epochs", "batch_size"):
        if options[name] is not None and not _is_int(options[name], 1):
            raise ValueError(f"TFRecordDataset: {name} must be None or an integer >= 1; received {options[name]!r}.")
    if options["shard_by"] not in ("auto", "file", "record"):
        raise ValueError(
            f'TFRecordDataset: shard_by must be "auto", "file" or "record"; received {options["shard_by"]!r}.'
        )
    for name in ("parse_fn", "collate_fn"):
        if options[name] is not None and not callable(options[name]):
            raise TypeError(
                f"TFRecordDataset: {name} must be callable or None; received {type(options[name]).__name__}."
            )


def _checked_label_key(label_key: Any, features: Mapping[str, Any] | None) -> str | None:
    if label_key is None:
        return None
    if features is None:
        raise ValueError(
            "TFRecordDataset: label_key names one of features= to hand out as the label; "
            "pass features= too (with parse_fn/collate_fn, return (features, label) yourself)."
        )
    if label_key not in features:
        raise ValueError(f"TFRecordDataset: label_key {label_key!r} is not one of features= ({sorted(features)}).")
    return label_key


def _checked_features(features: Mapping[str, Any] | None, parse_fn: Any, collate_fn: Any) -> Mapping[str, Any] | None:
    """A parse_example spec, checked now (a bad spec fails here, not in the first batch of a worker)."""
    if features is None:
        return None
    if parse_fn is not None or collate_fn is not None:
        given = " and ".join(
            name for name, value in (("parse_fn", parse_fn), ("collate_fn", collate_fn)) if value is not None
        )
        raise ValueError(
            f"TFRecordDataset: features= parses the records itself, so it cannot be combined "
            f"with {given}; pass features alone, or parse_fn/collate_fn without features."
        )
    if not isinstance(features, Mapping) or not features:
        raise TypeError(
            f"TFRecordDataset: features must be a non-empty mapping of feature name to "
            f"FixedLenFeature/VarLenFeature/RaggedFeature...; received {features!r:.200}."
        )
    parse_example([], features)  # raises TypeError/ValueError naming the bad entry
    return dict(features)


def _checked_images(images: Any, features: Mapping[str, Any] | None) -> dict[str, ImageDecoding] | None:
    """images= checked now: each name a scalar string feature of features=, each value an ImageDecoding."""
    if images is None:
        return None
    if features is None:
        raise ValueError(
            "TFRecordDataset: images= decodes features that features= parses; pass features= too, "
            'with each image a FixedLenFeature([], "string").'
        )
    if not isinstance(images, Mapping) or not images:
        raise TypeError(
            f"TFRecordDataset: images must be a non-empty mapping of feature name to ImageDecoding; "
            f"received {images!r:.200}."
        )
    for name, decoding in images.items():
        if not isinstance(decoding, ImageDecoding):
            raise TypeError(
                f"TFRecordDataset: images[{name!r}] must be an ImageDecoding; received {type(decoding).__name__}."
            )
        feature = features.get(name)
        if (
            feature is None
            or type(feature).__name__ != "FixedLenFeature"
            or tuple(feature.shape) != ()
            or feature.dtype != "string"
        ):
            raise ValueError(
                f"TFRecordDataset: images[{name!r}] needs features[{name!r}] to be "
                f'FixedLenFeature([], "string") (one encoded image per record); received '
                f"{feature!r}."
            )
    return dict(images)


class TFRecordDataset(IterableDataset):
    """TFRecord files (paths, globs or a list) as a sharded, resumable stream; see the module docstring.

    Iterating it in the main process yields this process's items and tracks
    the position (`state_dict`); `.loader(num_workers=...)` does the same over
    DataLoader workers. `features` (a parse_example spec) parses each batch
    in one call, in place of parse_fn/collate_fn; `label_key` (one of its
    names) makes each item `(features, label)`, as an input_fn returns. `images` (name -> ImageDecoding)
    decodes those encoded-image features of each batch into float32 tensors. `compression`, `skip_corrupt`, `verify`, `strict` and
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
        features: Mapping[str, Any] | None = None,
        label_key: str | None = None,
        images: Mapping[str, ImageDecoding] | None = None,
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
        if batch_size is not None:
            batch_size = split_global_batch(
                "TFRecordDataset",
                batch_size,
                num_ranks,
                f"{len(paths)} files, shuffle_buffer_size={shuffle_buffer_size}, num_epochs={num_epochs}",
            )
        self._plan = _Plan(
            files=paths,
            compression=_normalize_compression(compression, allow_auto=True),
            shuffle_files=bool(shuffle_files),
            shuffle_buffer_size=shuffle_buffer_size,
            seed=seed,
            num_epochs=num_epochs,
            interleave_cycle_length=interleave_cycle_length,
            shard_by=shard_by,
            num_ranks=num_ranks,
            rank=rank,
            skip_corrupt=bool(skip_corrupt),
            verify=bool(verify),
            strict=bool(strict),
            max_record_size=max_record_size,
        )
        if shard_by == "file" and len(paths) < num_ranks:
            raise ValueError(
                f'TFRecordDataset: shard_by="file" needs at least one file per process; '
                f'received {len(paths)} files for {num_ranks} processes. Use shard_by="auto".'
            )
        checked_features = _checked_features(features, parse_fn, collate_fn)
        self._output = _Output(
            parse_fn=parse_fn,
            features=checked_features,
            label_key=_checked_label_key(label_key, checked_features),
            batch_size=batch_size,
            collate_fn=collate_fn or default_collate,
            drop_remainder=bool(drop_remainder),
            images=_checked_images(images, checked_features),
        )
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

    def describe_position(self, state: Mapping[str, Any]) -> str:
        """`state` in one short line (epoch, file and byte offset, records consumed), for the log at resume."""
        return self._positions.describe(state)

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
        refused = sorted(
            set(dataloader_options)
            & {
                "batch_size",
                "shuffle",
                "sampler",
                "batch_sampler",
                "collate_fn",
                "drop_last",
                "in_order",
                "worker_init_fn",
            }
        )
        if refused:
            raise ValueError(
                f"TFRecordLoader: {', '.join(refused)} cannot be set here; batching and "
                f"shuffling are TFRecordDataset options (batch_size, collate_fn, "
                f"shuffle_buffer_size)."
            )
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
        loader = DataLoader(
            tagged,
            batch_size=None,
            collate_fn=_untouched,
            num_workers=self._num_workers,
            generator=generator,
            **self._options,
        )
        for shard, position, item in loader:
            self._positions.record(shard, position)
            yield item

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable position: per shard, just after its last item handed to the consumer."""
        return self._positions.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The next `iter()` continues every shard right after its item in `state`."""
        self._positions.load(state)

    def describe_position(self, state: Mapping[str, Any]) -> str:
        """`state` in one short line (epoch, file and byte offset, records consumed), for the log at resume."""
        return self._positions.describe(state)
