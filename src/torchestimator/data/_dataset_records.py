"""One shard's records of one epoch, in interleaved order, before the shuffle buffer (TFRecordDataset).

What belongs here: the plan that decides which records each shard reads
(`_Plan`), and the reader that walks a shard's files for one epoch and can
say, at any pause, where it stands (`_EpochRecords.position`). What does not:
shuffling (`_dataset_shuffle.py`), batching and positions across epochs and
workers (`tfrecord_dataset.py`), the byte format (`tfrecord.py`).

The reader has two ways out, with the same order and the same positions:

- iterating it yields one record at a time (the unbatched path);
- `take(n)` returns the next `n` records of the shard as lists, slicing them
  out of the blocks `iter_record_blocks` hands over, so a batch costs a few
  list slices instead of a generator step per record. With `refs=True` it
  also returns each record's `(file index, byte offset)`, which is what the
  shuffle buffer saves to resume without replaying the epoch.

Either way the reader's state after a record is handed out is the point just
after that record, so a position read while the consumer holds a batch is
exactly "after the last delivered record".

A position's offsets mean something only in the files they were taken in, so
the reader also records what identifies each file it opens (`file_identity`:
its size and a CRC32C of its first and last 4 KiB, computed once per open) and
its position carries them for the open files; a reader resumed on a file whose
identity differs raises `DataLossError` instead of reading other records.

Files in a store (URLs) are opened ahead: when the reader opens a file, a
thread computes the identity of the one it will open next, opens it and starts
its first ranged reads (`_open_ahead`), so a store's round trips per file
overlap the reading of the file before; the files filling an interleave's
cycle are opened that way all at once. Local files are opened in their turn.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypedDict

import numpy as np

from torchestimator._io.filesystems import is_url, local_path
from torchestimator.data import _remote_files
from torchestimator.data._remote_files import RemoteFile
from torchestimator.data._tfrecord_scan import _crc32c
from torchestimator.data.tfrecord import (
    _BLOCK_SIZE,
    ReadOptions,
    ReadStats,
    _detect_compression,
    _record_blocks,
    iter_record_blocks,
)
from torchestimator.errors import DataLossError

_FRAMING = 16  # bytes of header and footer around each record
_IDENTITY_BYTES = 4096  # hashed at each end of a file: two small reads, yet any rewrite that moves a byte shows


def file_identity(path: str) -> list[int]:
    """[size, crc32c of the first 4 KiB, crc32c of the last 4 KiB]: what a saved position checks
    to know the file is still the one its offsets were taken in (JSON-ready). The same for a URL (two
    ranged reads), so a position saved over local files resumes over the same files uploaded to a store."""
    if is_url(path):
        size = _remote_files.remote_size(path)
        head = _remote_files.read_range(path, 0, min(size, _IDENTITY_BYTES))
        tail = _remote_files.read_range(path, max(size - _IDENTITY_BYTES, 0), size)
        return [size, _crc32c(head), _crc32c(tail)]
    with open(local_path(path), "rb") as file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(min(size, _IDENTITY_BYTES))
        file.seek(max(size - _IDENTITY_BYTES, 0))
        tail = file.read(_IDENTITY_BYTES)
    return [size, _crc32c(head), _crc32c(tail)]


def check_file_identity(path: str, saved: Any, found: list[int]) -> None:
    """Raises DataLossError when `found` (file_identity now) is not the identity the position saved."""
    if [int(value) for value in saved] == found:
        return

    def describe(identity: Any) -> str:
        size, head, tail = (int(value) for value in identity)
        return f"{size} bytes, crc32c of the first/last 4 KiB {head:08x}/{tail:08x}"

    raise DataLossError(
        f"The saved TFRecordDataset position points into {path}, which changed since the position was "
        f"saved (saved: {describe(saved)}; found: {describe(found)}), so its byte offsets would resume "
        f"with other records. Restore the files as they were when the position was saved, or start the "
        f"input afresh by not loading its position.",
        path=path,
    )


class RereadOptions(TypedDict):
    """How `read_records_at` reads records back: the plan's checks, as keywords of `iter_record_blocks`."""

    compression: str | None
    verify: bool
    strict: bool
    max_record_size: int


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

    def random_access(self, files: list[str]) -> bool:
        """True when every file can be read at a byte offset without reading what comes before.

        Compressed files (GZIP, ZLIB) have no random access: reaching an offset
        means inflating the stream up to it.
        """
        if self.compression is None:
            return True
        if self.compression != "AUTO":
            return False
        return all(_detect_compression(path) is None for path in files)

    def reread_options(self) -> RereadOptions:
        # No skip_corrupt: a record that was read once and is damaged now is an error, not a skip.
        return {
            "compression": self.compression,
            "verify": self.verify,
            "strict": self.strict,
            "max_record_size": self.max_record_size,
        }


def _open_ahead(path: str, identity: list[int] | None) -> tuple[list[int], RemoteFile]:
    """What `_EpochRecords` does on its thread for the URL it will open next: the file's identity (unless
    known) and the object opened, its first ranges on the way."""
    if identity is None:
        identity = file_identity(path)
    raw = RemoteFile(path)
    raw.start_reading()
    return identity, raw


class _OpenFile:
    """One interleave slot: a file being read, a block at a time."""

    def __init__(
        self, plan: _Plan, stats: ReadStats, file_index: int, path: str, offset: int, raw: RemoteFile | None = None
    ) -> None:
        self.file_index = file_index
        self.path = path
        self.offset = offset  # of the first record of the current block, or where reading starts
        self.records: list[bytes] = []
        self.offsets: list[int] = []
        self.index = 0
        options: ReadOptions = {
            "skip_corrupt": plan.skip_corrupt,
            "verify": plan.verify,
            "strict": plan.strict,
            "stats": stats,
            "max_record_size": plan.max_record_size,
        }
        self._blocks = (
            iter_record_blocks(path, plan.compression, start_offset=offset, **options)
            if raw is None  # opened here
            else _record_blocks(path, raw, plan.compression, start_offset=offset, block_size=_BLOCK_SIZE, **options)
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


class _Taken:
    """What `_EpochRecords.take` hands out: records, and with refs their (file index, offset)."""

    __slots__ = ("files", "offsets", "records")

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.files: list[int] = []
        self.offsets: list[int] = []


class _EpochRecords:
    """A shard's records of one epoch in interleaved order, before the shuffle buffer."""

    def __init__(
        self,
        plan: _Plan,
        files: list[str],
        modulus: int,
        remainder: int,
        start: Mapping[str, Any] | None,
        stats: ReadStats,
    ) -> None:
        self._plan, self._files, self._stats = plan, files, stats
        self._modulus, self._remainder = modulus, remainder
        self.identities: dict[int, list[int]] = {}  # file index -> file_identity, once per file
        self.opened: list[int] = []  # the keys of `identities` in the order they came (tags send the new ones)
        self._open_ids_key: tuple[int, int] | None = None
        self._open_ids: dict[str, list[int]] = {}  # position()'s "file_ids", rebuilt only when the slots change
        self._ahead: dict[int, Future[tuple[list[int], RemoteFile]]] = {}  # URL files opened before their turn
        self._ahead_threads: ThreadPoolExecutor | None = None
        start = start or {}
        self.next_file = int(start.get("next_file", 0))
        self.slot = int(start.get("slot", 0))
        self.stream_index = int(start.get("stream_index", 0))
        open_files = [(int(index), int(offset)) for index, offset in start.get("open_files", [])]
        self.check_identities((index for index, _ in open_files), start.get("file_ids"))
        self.slots = [self._open(index, offset) for index, offset in open_files]

    @property
    def files(self) -> list[str]:
        return self._files

    def identity(self, file_index: int) -> list[int]:
        """The file's `file_identity`, read the first time this epoch's reader asks for it."""
        identity = self.identities.get(file_index)
        if identity is None:
            identity = self.identities[file_index] = file_identity(self._files[file_index])
            self.opened.append(file_index)
        return identity

    def identities_of(self, file_indices: Any) -> dict[str, list[int]]:
        """{"file index": identity} for the given files (the JSON form a position carries)."""
        return {str(index): self.identity(index) for index in set(file_indices)}

    def check_identities(self, file_indices: Any, saved: Mapping[str, Any] | None) -> None:
        """DataLossError naming the first of these files that differs from the identity `saved` for it.

        A position saved before identities were (no "file_ids") cannot be checked.
        """
        if saved is None:
            return
        for index in sorted(set(file_indices)):
            if str(index) in saved:
                check_file_identity(self._files[index], saved[str(index)], self.identity(index))

    def _open(self, file_index: int, offset: int) -> _OpenFile:
        raw = None
        ahead = self._ahead.pop(file_index, None)
        if ahead is not None and offset == 0:
            identity, raw = ahead.result()  # its errors are raised here, where opening it would
            if file_index not in self.identities:
                self.identities[file_index] = identity
                self.opened.append(file_index)
        self.identity(file_index)
        opened = _OpenFile(self._plan, self._stats, file_index, self._files[file_index], offset, raw)
        following = max(file_index + 1, self.next_file)  # the file the reader opens after this one
        self.open_ahead(range(following, following + 1))
        return opened

    def open_ahead(self, file_indices: range) -> None:
        """These files, if URLs, are opened now on threads (identity, open, first ranges): a store's round trips
        per file then overlap the reading of the file before (or, filling an interleave, of each other).
        Local files are opened when their turn comes."""
        for file_index in file_indices:
            if file_index >= len(self._files) or file_index in self._ahead or not is_url(self._files[file_index]):
                continue
            if self._ahead_threads is None:
                self._ahead_threads = ThreadPoolExecutor(
                    max_workers=self._plan.interleave_cycle_length, thread_name_prefix="torchestimator-open-ahead"
                )
            self._ahead[file_index] = self._ahead_threads.submit(
                _open_ahead, self._files[file_index], self.identities.get(file_index)
            )

    def position(self) -> dict[str, Any]:
        # Slots are opened only with next_file advancing (after __init__) and closed only with their count
        # falling, so (next_file, count) names the set of open files: the tag of every item reuses the dict.
        key = (self.next_file, len(self.slots))
        if key != self._open_ids_key:
            self._open_ids_key = key
            self._open_ids = {str(slot.file_index): self.identities[slot.file_index] for slot in self.slots}
        return {
            "next_file": self.next_file,
            "slot": self.slot,
            "stream_index": self.stream_index,
            "open_files": [[slot.file_index, slot.next_offset()] for slot in self.slots],
            "file_ids": self._open_ids,
        }

    # ------------------------------------------------------------------ many records per call

    def take(self, count: int, refs: bool = False) -> _Taken:
        """The next `count` records of this shard (fewer only at the end of the epoch)."""
        taken = _Taken()
        if count <= 0:
            return taken
        if self._plan.interleave_cycle_length == 1:
            self._take_sequential(count, refs, taken)
        else:
            self._take_interleaved(count, refs, taken)
        return taken

    def take_one(self) -> tuple[bytes, int, int] | None:
        """The next record with its file index and offset (None at the end of the epoch).

        The unbatched shuffle buffer's step: within a block of a file read
        whole by this shard it is a few attribute updates, not a `take(1)`.
        """
        if self._modulus == 1 and self._plan.interleave_cycle_length == 1 and self.slots:
            current = self.slots[0]
            index = current.index
            if index < len(current.records):
                current.index = index + 1
                self.stream_index += 1
                return current.records[index], current.file_index, current.offsets[index]
        taken = self.take(1, refs=True)
        if not taken.records:
            return None
        return taken.records[0], taken.files[0], taken.offsets[0]

    def _take_sequential(self, count: int, refs: bool, taken: _Taken) -> None:
        """Slices of the current block: the same records and state as `_sequential`, without a step each."""
        modulus, remainder, slots, records = self._modulus, self._remainder, self.slots, taken.records
        while len(records) < count:
            if not slots:
                if self.next_file >= len(self._files):
                    return
                slots.append(self._open(self.next_file, 0))
                self.next_file += 1
            current = slots[0]
            if current.index >= len(current.records) and not current.next_block():
                del slots[0]
                continue
            block_start = self.stream_index - current.index  # stream index of the block's record 0
            first = current.index + (remainder - self.stream_index) % modulus
            stop = min(len(current.records), first + (count - len(records)) * modulus)
            if first >= stop:  # no record of this block is this shard's
                current.index = len(current.records)
            else:
                chunk = current.records[first:stop:modulus]
                records += chunk
                if refs:
                    taken.offsets += current.offsets[first:stop:modulus]
                    taken.files += [current.file_index] * len(chunk)
                current.index = first + (len(chunk) - 1) * modulus + 1
            self.stream_index = block_start + current.index

    def _take_rounds(self, count: int, refs: bool, taken: _Taken) -> bool:
        """Whole rounds over the slots at once, while every slot's block has records left.

        k rounds starting at `self.slot` take k records of each slot and leave
        `self.slot` where it was: the state k x len(slots) single steps reach.
        False when no whole round fits (a block or file boundary is next).
        """
        slots, modulus = self.slots, self._modulus
        rounds = min(len(slot.records) - slot.index for slot in slots)
        rounds = min(rounds, (count - len(taken.records)) * modulus // len(slots))
        if rounds <= 0:
            return False
        order = slots[self.slot :] + slots[: self.slot]
        columns = [slot.records[slot.index : slot.index + rounds] for slot in order]
        stream = [record for row in zip(*columns) for record in row]
        first = (self._remainder - self.stream_index) % modulus
        taken.records += stream[first::modulus]
        if refs:
            offsets = [slot.offsets[slot.index : slot.index + rounds] for slot in order]
            taken.offsets += [offset for row in zip(*offsets) for offset in row][first::modulus]
            taken.files += [slot.file_index for _ in range(rounds) for slot in order][first::modulus]
        for slot in slots:
            slot.index += rounds
        self.stream_index += rounds * len(slots)
        return True

    def _take_interleaved(self, count: int, refs: bool, taken: _Taken) -> None:
        """Round robin, one record per slot: whole rounds sliced at once where the blocks allow,
        else the loop of `_interleaved`, appending instead of yielding."""
        slots, cycle = self.slots, self._plan.interleave_cycle_length
        modulus, remainder, records = self._modulus, self._remainder, taken.records
        self.open_ahead(range(self.next_file, self.next_file + cycle - len(slots)))  # the files filling the cycle
        while len(slots) < cycle and self.next_file < len(self._files):
            slots.append(self._open(self.next_file, 0))
            self.next_file += 1
        while slots and len(records) < count:
            if self.slot < len(slots) and self._take_rounds(count, refs, taken):
                continue
            if self.slot >= len(slots):
                self.slot = 0
            current = slots[self.slot]
            if not self._slot_has_record(current):
                continue
            index, stream_index = current.index, self.stream_index
            current.index = index + 1
            self.slot += 1
            self.stream_index = stream_index + 1
            if stream_index % modulus == remainder:
                records.append(current.records[index])
                if refs:
                    taken.files.append(current.file_index)
                    taken.offsets.append(current.offsets[index])

    def _slot_has_record(self, current: Any) -> bool:
        """Whether the current slot's file has a record at its index; if its file is done, the next file takes
        over the slot (or the slot goes when there is none) and the caller looks again."""
        if current.index < len(current.records) or current.next_block():
            return True
        if self.next_file < len(self._files):
            self.slots[self.slot] = self._open(self.next_file, 0)
            self.next_file += 1
        else:
            del self.slots[self.slot]
        return False

    # ------------------------------------------------------------------ one record per step

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
        self.open_ahead(range(self.next_file, self.next_file + cycle - len(slots)))  # the files filling the cycle
        while len(slots) < cycle and self.next_file < len(self._files):
            slots.append(self._open(self.next_file, 0))
            self.next_file += 1
        while slots:
            if self.slot >= len(slots):
                self.slot = 0
            current = slots[self.slot]
            if not self._slot_has_record(current):
                continue
            record = current.records[current.index]
            current.index += 1
            self.slot += 1
            index = self.stream_index
            self.stream_index = index + 1
            if index % modulus == remainder:
                yield record
