"""TFRecordDataset's shuffle buffer, and the position that resumes it without replaying the epoch.

What belongs here: TF's shuffle buffer over one shard's epoch of records
(`_ShuffleBuffer`), its JSON position, and reading back the records that
were in the buffer by their byte offsets. What does not: which records the
shard reads (`_dataset_records.py`), batching and workers
(`tfrecord_dataset.py`).

The algorithm is TF's, drawn from `random.Random` exactly as before: fill
`size` records; then for each new record pick a random slot, hand out its
record and put the new one there; at the end of the epoch shuffle what is
left once and hand it out in order.

The position after k delivered records is, on files with random access
(uncompressed):

    {"epoch", "delivered": k, "reader": <the reader's position>,
     "rng": random.Random.getstate() as JSON (625 ints),
     "buffer_files": [...], "buffer_offsets": [...],    # each slot's record: file index, byte offset
     "file_ids": {"file index": [size, crc32c head, crc32c tail]}}  # each file the buffer points into

or, once the epoch's records are all in and the rest is being drained,
`"draining": true` with the remaining records' refs in delivery order and no
RNG state. Resuming re-reads those records by offset (`read_records_at`:
a few block reads near each one, O(buffer) records, whatever k is; from a
store, reads of 1 MiB, eight at a time, each serving the records within
512 KiB of its first), seeks the reader and restores the RNG: the same order
as the uninterrupted run.
The JSON grows with the buffer: about 13 bytes per slot plus ~7 KB of RNG
state, ~140 KB for a 10k buffer.

Compressed files (GZIP, ZLIB) have no random access, so there the position
stays `{"epoch", "delivered"}` and resuming replays the shard's epoch from its
start with the same seed, dropping the k delivered records (exact, but the
cost grows with k: about a read and a random draw per record). Positions
saved before this format existed are the same shape and resume the same way.

Resuming first checks every file the buffer (and the reader) points into
against its saved `file_ids` (`_dataset_records.file_identity`): a file
rewritten, truncated or grown since is a DataLossError naming it, whatever
`skip_corrupt` says (that option is for damaged data, not for a position that
no longer fits its files). Positions without `file_ids` (saved by earlier
versions) resume unchecked.
"""

from __future__ import annotations

import bisect
import logging
import random
from collections.abc import Generator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from torchestimator._io.filesystems import is_url
from torchestimator.data._dataset_records import RereadOptions, _EpochRecords, _Plan
from torchestimator.data._remote_files import RemoteFile
from torchestimator.data.tfrecord import ReadStats, _record_blocks
from torchestimator.errors import DataLossError

logger = logging.getLogger("torchestimator.data.tfrecord_dataset")

# A read by offset pulls this much: enough for the record and often for its neighbours in the
# buffer (records that entered it close together), without reading a whole 1 MiB block for each.
_REREAD_BLOCK_SIZE = 64 << 10
# From a store a read is a request (a round trip): larger reads, several at once, none read ahead.
_REMOTE_REREAD_BLOCK_SIZE = 1 << 20
_REMOTE_REREAD_SPAN = 512 << 10  # one read serves the records starting within this many bytes of its first
_REMOTE_REREADS = 8  # reads in flight at once


def _rng_state_to_json(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def _rng_state_from_json(state: Sequence[Any]) -> tuple[Any, ...]:
    version, internal, gauss_next = state
    return (int(version), tuple(int(word) for word in internal), gauss_next)


# Said of damage in a record read again (a resumed shuffle buffer's): skip_corrupt, if given, does not apply to it.
_NO_SKIP_ON_REREAD = (
    "this record was read intact before (it is in the saved shuffle buffer), so the file changed since; "
    "skip_corrupt does not skip a record read once. Restore the file, or start the input afresh by not loading "
    "its position"
)


def _reread_blocks(
    path: str, raw: Any, options: RereadOptions, start: int, stats: ReadStats, block_size: int
) -> Generator[tuple[list[int], list[bytes]], None, None]:
    """Blocks of records read again from ``start``, skipping nothing (they were intact once)."""
    return _record_blocks(
        path,
        raw,
        options["compression"],
        start_offset=start,
        skip_corrupt=False,
        verify=options["verify"],
        strict=options["strict"],
        stats=stats,
        block_size=block_size,
        max_record_size=options["max_record_size"],
        hint=_NO_SKIP_ON_REREAD,
    )


def _no_record_at(path: str, offset: int) -> DataLossError:
    return DataLossError(
        f"The saved TFRecordDataset position holds a record at byte {offset} of {path}, but no record "
        f"starts there: the file changed since the position was saved. Restore the files, or start "
        f"the input from the beginning by not restoring its position.",
        path=path,
        offset=offset,
    )


def read_records_at(
    plan: _Plan, files: Sequence[str], file_indices: Sequence[int], offsets: Sequence[int], stats: ReadStats
) -> list[bytes]:
    """The records at (files[file_indices[i]], offsets[i]), in the order asked, with the plan's checks.

    Refs are visited in file and offset order, so one read of a block serves
    every wanted record inside it.
    """
    count = len(offsets)
    # Sorted with numpy: 10k (file, offset) tuples sorted in Python cost more than all the reads.
    order = np.lexsort((np.asarray(offsets, dtype=np.int64), np.asarray(file_indices, dtype=np.int64)))
    sorted_files = np.asarray(file_indices, dtype=np.int64)[order].tolist()
    sorted_offsets = np.asarray(offsets, dtype=np.int64)[order].tolist()
    order = order.tolist()
    records: list[Any] = [None] * count
    options = plan.reread_options()
    if any(is_url(path) for path in files):
        found = _read_remote_records(files, sorted_files, sorted_offsets, options, stats)
        for index, record in zip(order, found):
            records[index] = record
        return records
    index = 0
    while index < count:
        file_index, offset = sorted_files[index], sorted_offsets[index]
        path = files[file_index]
        blocks = _reread_blocks(path, None, options, offset, stats, _REREAD_BLOCK_SIZE)
        try:
            block_offsets, block_records = next(blocks, ([], []))
        finally:
            blocks.close()  # the reader's file closes now, not when the generator is collected
        if not block_offsets:
            raise _no_record_at(path, offset)
        last = block_offsets[-1]
        # Every wanted record of this file up to the block's last one is in the block (bisect, in C).
        while index < count and sorted_files[index] == file_index and sorted_offsets[index] <= last:
            wanted = sorted_offsets[index]
            position = bisect.bisect_left(block_offsets, wanted)
            if block_offsets[position] != wanted:
                raise _no_record_at(path, wanted)
            records[order[index]] = block_records[position]
            index += 1
    return records


def _read_remote_records(
    files: Sequence[str], sorted_files: list[int], sorted_offsets: list[int], options: RereadOptions, stats: ReadStats
) -> list[bytes]:
    """`read_records_at` for files in a store: the refs (sorted by file and offset) grouped into reads of
    `_REMOTE_REREAD_SPAN` bytes, `_REMOTE_REREADS` of them at once; the records in the refs' order."""
    groups: list[tuple[str, list[int]]] = []
    index, count = 0, len(sorted_offsets)
    while index < count:
        file_index, first, stop = sorted_files[index], sorted_offsets[index], index
        while stop < count and sorted_files[stop] == file_index and sorted_offsets[stop] < first + _REMOTE_REREAD_SPAN:
            stop += 1
        groups.append((files[file_index], sorted_offsets[index:stop]))
        index = stop
    with ThreadPoolExecutor(max_workers=_REMOTE_REREADS, thread_name_prefix="torchestimator-reread") as pool:
        results = list(pool.map(lambda group: _records_from(group[0], group[1], options), groups))
    out: list[bytes] = []
    for records, own in results:  # each read counted in its own stats (threads), added up here
        out += records
        stats.files, stats.records, stats.bytes = (
            stats.files + own.files,
            stats.records + own.records,
            stats.bytes + own.bytes,
        )
    return out


def _records_from(path: str, wanted: list[int], options: RereadOptions) -> tuple[list[bytes], ReadStats]:
    """The records of `path` at the sorted offsets `wanted`, read from the first on (more than one block
    only for records longer than one), the object opened without read-ahead."""
    own = ReadStats()
    raw = RemoteFile(path, read_ahead=0) if is_url(path) else None
    blocks = _reread_blocks(path, raw, options, wanted[0], own, _REMOTE_REREAD_BLOCK_SIZE)
    out: list[bytes] = []
    try:
        for block_offsets, block_records in blocks:
            while len(out) < len(wanted) and wanted[len(out)] <= block_offsets[-1]:
                position = bisect.bisect_left(block_offsets, wanted[len(out)])
                if block_offsets[position] != wanted[len(out)]:
                    raise _no_record_at(path, wanted[len(out)])
                out.append(block_records[position])
            if len(out) == len(wanted):
                break
    finally:
        blocks.close()
    if len(out) < len(wanted):
        raise _no_record_at(path, wanted[len(out)])
    return out, own


class _ShuffleBuffer:
    """TF's shuffle buffer over one epoch's reader, handing out `take(n)` records at a time."""

    def __init__(self, reader: _EpochRecords, size: int, rng: random.Random, random_access: bool) -> None:
        self._reader, self._size, self._rng = reader, size, rng
        self._refs = random_access  # keep each slot's (file, offset): the position can then name them
        self.delivered = 0
        self._filled = False
        self._records: list[bytes] = []
        self._files: list[int] = []
        self._offsets: list[int] = []
        self._draining = False
        self._drain_index = 0
        self._tagging = False  # set by track_changes(): tag() then sends only what changed
        self._send_all = True  # the next tag carries every slot (after the fill, a restore, the drain)
        self._changed: list[int] = []  # slots replaced since the last tag
        self._identities_sent = 0  # how many of the reader's file identities tags have carried

    # ------------------------------------------------------------------ position

    def position(self) -> dict[str, Any]:
        if not self._refs or not self._filled:
            return {"delivered": self.delivered}
        if self._draining:
            rest = slice(self._drain_index, None)
            return {
                "delivered": self.delivered,
                "reader": self._reader.position(),
                "draining": True,
                "buffer_files": self._files[rest],
                "buffer_offsets": self._offsets[rest],
                "file_ids": self._reader.identities_of(self._files[rest]),
            }
        return {
            "delivered": self.delivered,
            "reader": self._reader.position(),
            "rng": _rng_state_to_json(self._rng.getstate()),
            "buffer_files": list(self._files),
            "buffer_offsets": list(self._offsets),
            "file_ids": self._reader.identities_of(self._files),
        }

    def track_changes(self) -> None:
        """Items will be tagged with `tag()` (DataLoader workers): remember which slots change."""
        self._tagging = True

    def tag(self) -> dict[str, Any]:
        """`position()` as sent along with every item from a worker: the slots changed since the last
        tag instead of all of them (a 10k buffer would otherwise cost ~150 KB per item), the RNG
        state as a tuple. `_TaggedBufferPosition` on the consumer side rebuilds `position()` from them.
        """
        if not self._refs or not self._filled:
            return self.position()
        reader = self._reader
        tag: dict[str, Any] = {"tagged": True, "delivered": self.delivered, "reader": reader.position()}
        if self._identities_sent < len(reader.opened):  # a file opened since the last tag: its identity, once
            tag["new_ids"] = [(index, reader.identities[index]) for index in reader.opened[self._identities_sent :]]
            self._identities_sent = len(reader.opened)
        if self._draining:
            tag["drain_index"] = self._drain_index
        else:
            tag["rng"] = self._rng.getstate()
        if self._send_all:
            tag["all"] = (list(self._files), list(self._offsets))
            self._send_all = False
        else:
            slots = self._changed
            tag["changes"] = (slots, [self._files[slot] for slot in slots], [self._offsets[slot] for slot in slots])
        self._changed = []
        return tag

    def restore(self, start: Mapping[str, Any], stats: ReadStats) -> None:
        """Puts back the buffer `position()` described (the reader was built at start["reader"])."""
        files = [int(index) for index in start["buffer_files"]]
        offsets = [int(offset) for offset in start["buffer_offsets"]]
        if len(files) != len(offsets) or (not start.get("draining") and len(files) > self._size):
            raise ValueError(
                f"The saved TFRecordDataset shuffle buffer holds {len(files)} file indices and "
                f"{len(offsets)} offsets for a buffer of {self._size}: the position is damaged "
                f"or from another shuffle_buffer_size. Start the input from the beginning."
            )
        self._reader.check_identities(files, start.get("file_ids"))
        self._records = read_records_at(self._reader._plan, self._reader.files, files, offsets, stats)
        self._files, self._offsets = files, offsets
        self.delivered = int(start["delivered"])
        self._filled = True
        self._draining = bool(start.get("draining"))
        if not self._draining:
            self._rng.setstate(_rng_state_from_json(start["rng"]))

    def skip(self, count: int) -> None:
        """Replays `count` deliveries (the resume of a source without random access)."""
        if count:
            logger.info(
                "TFRecordDataset: resuming a shuffled epoch by replaying %d records (compressed "
                "files have no random access, or the position predates saving the buffer).",
                count,
            )
        while count > 0:
            step = min(count, 1 << 14)
            if not self.take(step):
                break
            count -= step

    # ------------------------------------------------------------------ records out

    def take(self, count: int) -> list[bytes]:
        """The next `count` records out of the buffer (fewer only at the end of the epoch)."""
        out: list[bytes] = []
        if not self._filled:
            taken = self._reader.take(self._size, refs=self._refs)
            self._records, self._files, self._offsets = taken.records, taken.files, taken.offsets
            self._filled = True
            if len(self._records) < self._size:
                self._start_draining()
        if not self._draining:
            self._exchange(count, out)
        if self._draining and len(out) < count:
            stop = self._drain_index + count - len(out)
            out += self._records[self._drain_index : stop]
            self._drain_index = min(stop, len(self._records))
        self.delivered += len(out)
        return out

    def one_by_one(self) -> Iterator[bytes]:
        """The records one at a time, the state exact at every pause (the unbatched path)."""
        reader, size, randrange = self._reader, self._size, self._rng.randrange
        buffer = None
        while True:
            if not self._filled or self._draining:
                out = self.take(1)
                if not out:
                    return
                yield out[0]
                continue
            if buffer is not self._records:  # taken after the fill (or a restore)
                buffer, files, offsets = self._records, self._files, self._offsets
            step = reader.take_one()
            if step is None:
                self._start_draining()
                continue
            record, file_index, offset = step
            slot = randrange(size)
            out_record = buffer[slot]
            buffer[slot] = record
            if self._refs:
                files[slot], offsets[slot] = file_index, offset
                if self._tagging:
                    self._changed.append(slot)
            self.delivered += 1
            yield out_record

    def _exchange(self, count: int, out: list[bytes]) -> None:
        """One new record in, one random slot out, `count` times (or until the reader runs dry)."""
        taken = self._reader.take(count, refs=self._refs)
        randrange, size, buffer = self._rng.randrange, self._size, self._records
        if self._refs:
            files, offsets = self._files, self._offsets
            changed = self._changed if self._tagging else []
            for record, file_index, offset in zip(taken.records, taken.files, taken.offsets):
                slot = randrange(size)
                out.append(buffer[slot])
                buffer[slot], files[slot], offsets[slot] = record, file_index, offset
                changed.append(slot)
        else:
            for record in taken.records:
                slot = randrange(size)
                out.append(buffer[slot])
                buffer[slot] = record
        if len(taken.records) < count:
            self._start_draining()

    def _start_draining(self) -> None:
        # The same draws as rng.shuffle(buffer), applied to records and refs alike.
        order = list(range(len(self._records)))
        self._rng.shuffle(order)
        self._records = [self._records[index] for index in order]
        if self._refs:
            self._files = [self._files[index] for index in order]
            self._offsets = [self._offsets[index] for index in order]
        self._draining = True
        self._send_all = True


class _TaggedBufferPosition:
    """The consumer's copy of a worker's buffered position, patched by each item's `tag()`."""

    def __init__(self) -> None:
        self._files: list[int] = []
        self._offsets: list[int] = []
        self._tag: dict[str, Any] = {}
        self._identities: dict[int, Any] = {}  # of the files opened in the tag's epoch (each sent once)

    def apply(self, tag: Mapping[str, Any]) -> None:
        if tag["epoch"] != self._tag.get("epoch"):  # a new epoch's reader: its file indices mean other files
            self._identities = {}
        self._identities.update(tag.get("new_ids", ()))
        if "all" in tag:
            self._files, self._offsets = list(tag["all"][0]), list(tag["all"][1])
        else:
            files, offsets = self._files, self._offsets
            for slot, file_index, offset in zip(*tag["changes"]):
                files[slot], offsets[slot] = file_index, offset
        self._tag = dict(tag)

    def to_json(self) -> dict[str, Any]:
        """The `{"epoch", **_ShuffleBuffer.position()}` this tag stands for."""
        tag = self._tag
        position = {"epoch": tag["epoch"], "delivered": tag["delivered"], "reader": tag["reader"]}
        if "drain_index" in tag:
            rest = slice(tag["drain_index"], None)
            position.update(draining=True, buffer_files=self._files[rest], buffer_offsets=self._offsets[rest])
        else:
            position.update(
                rng=_rng_state_to_json(tag["rng"]), buffer_files=list(self._files), buffer_offsets=list(self._offsets)
            )
        identities = self._identities
        position["file_ids"] = {
            str(index): list(identities[index]) for index in set(position["buffer_files"]) if index in identities
        }
        return position


def position_from_tag(previous: Any, tag: dict[str, Any]) -> Any:
    """What the consumer keeps for a shard after an item tagged `tag` (see `_ShuffleBuffer.tag`)."""
    if not tag.get("tagged"):
        return tag
    kept = previous if isinstance(previous, _TaggedBufferPosition) else _TaggedBufferPosition()
    kept.apply(tag)
    return kept


def position_to_json(kept: Any) -> dict[str, Any]:
    return kept.to_json() if isinstance(kept, _TaggedBufferPosition) else dict(kept)
