"""The TFRecord block scanners: a byte stream in, checked whole records out, a block at a time.

Its one job is the reader's hot loop (`tfrecord.py`'s module docstring says what reading does):
pull a block of the stream, slice out every whole record in it with both CRCs checked, carry a
cut record over to the next block, and say where and why it stopped. Two scanners do that, the
compiled one (`torchestimator._native._records.scan`, driven by `_scan_compiled` over one reused
buffer) and its pure-Python fallback and reference (`_scan_block_python`, driven by
`_scan_python`); both stop with the same statuses and report through the same error builders
here (`_data_loss`, `_too_large`, `_read_error`), so a message and its offset never depend on
the path. Both loops hand each block to `_FileScan.process`, which also holds what
`skip_corrupt=True` does with damage (`DamagedRegion`): a record whose data CRC fails is skipped
alone; after damaged framing (a length CRC that fails, a length over max_record_size) the
stream is searched byte by byte for the next record whose length CRC *and* data CRC both hold
(`_find_record_python`, or the compiled `find`); a cut tail ends the file. An object deleted or replaced under the reader (`_remote_files.object_changed`)
passes through as it is: it is not damage in the file. `tfrecord.py` chooses the path, opens the file, bounds long records (its `_LengthGuard`,
passed in as `guard`) and keeps the public names.

It is separate so the loops the speed work tunes sit together, apart from the file format's
public face (writer, options, file lists) and under ~800 lines each; it imports nothing from
`tfrecord.py` (which imports from here), so there is no import cycle.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import zlib
from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

from torchestimator.data._remote_files import RemoteFile, object_changed
from torchestimator.errors import DataLossError

# The CRC32C backend of the whole TFRecord reader and writer (`_crc32c_extend` serves tfrecord.py's probe).
try:  # Fastest on both small and large payloads (about 20 GB/s with SSE4.2/ARMv8 CRC).
    from crc32c import crc32c as _crc32c

    def _crc32c_extend(crc: int, data: Any) -> int:
        return _crc32c(data, crc)
except ImportError:  # Apache-2.0 alternative, equally fast on small records.
    try:
        from google_crc32c import (
            extend as _crc32c_extend,  # noqa: F401 (tfrecord.py's probe imports it)
            value as _crc32c,
        )
    except ImportError as error:
        raise ImportError(
            "torchestimator.data.tfrecord needs a C CRC32C implementation: install "
            "'google-crc32c' (a dependency of torchestimator) or 'crc32c'."
        ) from error

_MASK_DELTA = 0xA282EAD8
_UINT32 = 0xFFFFFFFF
_UINT64 = (1 << 64) - 1
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_HEADER_SIZE = 12
_FOOTER_SIZE = 4
_LENGTH_CRC_CACHE_SIZE = 4096

# What a block scanner reports (the same numbers as in _native/records.c): why it stopped handing out records;
# _FOUND: the search for the next record after damaged framing found one.
_NEED_HEADER, _NEED_RECORD, _LENGTH_CRC_BAD, _TOO_LARGE, _DATA_CRC_BAD, _FOUND = range(6)


def _mask(crc: int) -> int:
    """TensorFlow's mask of a CRC32C: rotated right by 15 plus 0xA282EAD8."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _UINT32


# --------------------------------------------------------------------------- errors


def _data_loss(kind: str, path: str, offset: int, detail: str, *, data_part: bool = False) -> DataLossError:
    """`kind` is TF's word ("corrupted"/"truncated"); `data_part`: TF's number is offset + 12."""
    number = offset + _HEADER_SIZE if data_part else offset
    hint = " (Is this even a TFRecord file?)" if number == 0 and kind == "corrupted" else ""
    return DataLossError(
        f"{kind} record at {number} in {path}{hint}: {detail} (the record starts at byte {offset}).",
        path,
        offset,
        kind=kind,
    )


def _too_large(path: str, offset: int, length: int, limit: int, *, present: bool | None) -> DataLossError:
    """`present`: whether the file really holds that many bytes (None: unknown, compressed)."""
    if present:
        cause = "the file holds a record this large"
    else:
        cause = "either its length field is damaged, or the file holds records this large"
    return DataLossError(
        f"record too large at {offset} in {path}: it declares {length} bytes, more than "
        f"max_record_size={limit}. {cause[0].upper() + cause[1:]}: to read it, pass "
        f"max_record_size={length} or more (read_records, iter_records, TFRecordDataset; "
        f"`torchestimator records verify/inspect --max_record_size {length}`).",
        path,
        offset,
        kind="too large",
    )


def _read_error(error: Exception, path: str, offset: int) -> DataLossError:
    if isinstance(error, zlib.error):
        return _data_loss("corrupted", path, offset, f"inflate failed ({error})")
    if isinstance(error, _TruncatedStream):
        return _data_loss("truncated", path, offset, "the compressed stream ends before its end marker")
    # EIO from a failing disk or a network file system; the caller keeps the OSError as the cause (errno)
    return _data_loss("unreadable", path, offset, f"reading the file failed ({error})")


def _block_error(status: int, detail: int, path: str, offset: int, limit: int) -> DataLossError:
    if status == _LENGTH_CRC_BAD:
        return _data_loss("corrupted", path, offset, "the length CRC does not match")
    if status == _TOO_LARGE:
        return _too_large(path, offset, detail, limit, present=True)
    return _data_loss("corrupted", path, offset, "the data CRC does not match", data_part=True)


class _TruncatedStream(Exception):
    """The compressed file ended before the stream's end marker."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DamagedRegion:
    """A stretch of a file that `skip_corrupt=True` skipped: bytes [start, end) of its (uncompressed) stream.

    `start` is where the first record not handed out starts (the `offset` of `error`), `end` where
    reading went on: the next good record, or the end of what the file (or its compressed stream,
    when it broke) delivered. A resumed read at `start` skips the same region again.
    """

    path: str
    """The file."""
    start: int
    """Offset of the damaged record (or of the damaged framing) in the uncompressed stream."""
    end: int
    """Offset where reading went on, or where the file ended."""
    reason: str
    """What was wrong, in a few words ("data CRC mismatch", "length CRC mismatch", "truncated record", ...)."""
    error: DataLossError
    """What `skip_corrupt=False` raises there."""

    @property
    def size(self) -> int:
        """Bytes skipped, framing included."""
        return self.end - self.start

    @property
    def records(self) -> int:
        """Damaged records counted for it: 1, or 0 for an empty region (a compressed stream cut right after
        its last record). A data CRC mismatch is exactly one record; a stretch searched past after damaged
        framing usually is one record with a damaged header, but the reader cannot tell how many it held."""
        return 1 if self.end > self.start else 0

    def describe(self) -> str:
        """E.g. "bytes 19..54 (35 bytes): data CRC mismatch"."""
        return f"bytes {self.start}..{self.end} ({self.size} bytes): {self.reason}"


_REASONS = {
    _LENGTH_CRC_BAD: "length CRC mismatch",
    _TOO_LARGE: "length over max_record_size",
    _DATA_CRC_BAD: "data CRC mismatch",
}


class _Guard(Protocol):
    """What the loops need of `tfrecord._LengthGuard`: the limit, and the bytes to read next for a
    record bigger than a block (raising DataLossError when it must not be read)."""

    limit: int

    def allowance(self, buffer: bytes, position: int, offset: int, need: int) -> int: ...

    def rest(self, stream: Any, offset: int) -> int:
        """Bytes the stream still holds after `offset` (where it stands), read through if it must be."""
        ...

    def stream_size(self) -> int | None:
        """The stream's length now where the file says it (a plain local file, an object), else None."""
        ...


# --------------------------------------------------------------------------- reading the stream


def _read_more(stream: Any, size: int, path: str, offset: int, *, cut_is_end: bool = False) -> bytes:
    """Where reading meets the layers below (with `_read_into`): zlib's and the file system's errors
    become DataLossError naming the file and the record's start (`cut_is_end`: a cut stream reads as b"")."""
    try:
        return stream.read(size)
    except _TruncatedStream:
        if cut_is_end:
            return b""
        raise _read_error(_TruncatedStream(), path, offset) from None
    except (zlib.error, OSError) as error:
        if object_changed(error):
            raise  # an object deleted or replaced under the reader: not damage in it (it names itself)
        raise _read_error(error, path, offset) from (error if isinstance(error, OSError) else None)


def _read_into(stream: Any, buffer: bytearray, end: int, size: int, path: str, offset: int) -> int:
    """Reads up to `size` bytes into `buffer[end:]` (which has room), errors as `_read_more`'s."""
    try:
        if type(stream) is io.FileIO or type(stream) is RemoteFile:  # what _file_blocks opens: straight into the buffer
            return stream.readinto(memoryview(buffer)[end : end + size]) or 0
        more = stream.read(size)  # _InflateStream, or any file-like object standing in for the file
        buffer[end : end + len(more)] = more
        return len(more)
    except (zlib.error, OSError, _TruncatedStream) as error:
        if object_changed(error):
            raise
        raise _read_error(error, path, offset) from (error if isinstance(error, OSError) else None)


# --------------------------------------------------------------------------- the scanners


def _scan_block_python(
    buffer: bytes,
    position: int,
    base: int,
    verify: bool,
    limit: int,
    length_crcs: dict[int, int],
) -> tuple[list[int], list[bytes], int, int, int]:
    """The pure-Python block scanner, the fallback of (and the reference for) the compiled `scan`.

    Slices the whole records out of `buffer[position:]` (`base`: the stream offset of buffer[0]) and
    returns `(offsets, records, position, status, detail)`: `position` is the start of the first record
    not handed out and `status` says why (`_NEED_HEADER`; `_NEED_RECORD` with its declared length in
    `detail`; `_LENGTH_CRC_BAD`; `_TOO_LARGE` with the length; `_DATA_CRC_BAD` with the length). `length_crcs` caches
    the length CRCs seen in this file (records of a file usually share a few lengths).
    """
    unpack_header, unpack_crc, crc32c = _HEADER.unpack_from, _CRC.unpack_from, _crc32c
    end = len(buffer)
    offsets: list[int] = []
    records: list[bytes] = []
    add_offset, add_record = offsets.append, records.append
    while end - position >= _HEADER_SIZE:
        length, stored = unpack_header(buffer, position)
        if verify and length_crcs.get(length) != stored:
            if _mask(crc32c(buffer[position : position + 8])) != stored:
                return offsets, records, position, _LENGTH_CRC_BAD, 0
            if len(length_crcs) < _LENGTH_CRC_CACHE_SIZE:
                length_crcs[length] = stored
        start = position + _HEADER_SIZE
        stop = start + length
        if stop + _FOOTER_SIZE > end:
            return offsets, records, position, _NEED_RECORD, length
        if length > limit:  # whole in the buffer, so present; bigger ones met the guard before
            return offsets, records, position, _TOO_LARGE, length
        record = buffer[start:stop]
        if verify:
            crc = crc32c(record)
            if (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _UINT32 != unpack_crc(buffer, stop)[0]:
                return offsets, records, position, _DATA_CRC_BAD, length
        add_offset(base + position)
        add_record(record)
        position = stop + _FOOTER_SIZE
    return offsets, records, position, _NEED_HEADER, 0


def _find_record_python(buffer: bytes, position: int, end: int, limit: int) -> tuple[int, int, int]:
    """The search after damaged framing, the fallback of (and the reference for) the compiled `find`.

    From `position` on, byte by byte, the first place in `buffer[:end]` where a record starts: its length's
    masked CRC matches, the length is at most `limit`, and its data's masked CRC matches too (so 12 bytes
    that only look like a header, e.g. a header copied inside a record's data, are passed by). Returns
    `(position, status, detail)`: `_FOUND` with the length; `_NEED_RECORD` with the length when a header
    holds but its record reaches past `end` (the caller reads on, or passes it by at the end of the
    stream); `_NEED_HEADER` at the first place with fewer than 12 bytes left.
    """
    unpack_header, unpack_crc, crc32c = _HEADER.unpack_from, _CRC.unpack_from, _crc32c
    last = end - _HEADER_SIZE
    while position <= last:
        length, stored = unpack_header(buffer, position)
        if length <= limit and _mask(crc32c(buffer[position : position + 8])) == stored:
            start = position + _HEADER_SIZE
            stop = start + length
            if stop + _FOOTER_SIZE > end:
                return position, _NEED_RECORD, length
            if _mask(crc32c(buffer[start:stop])) == unpack_crc(buffer, stop)[0]:
                return position, _FOUND, length
        position += 1
    return position, _NEED_HEADER, 0


_Blocks = Generator[tuple[list[int], list[bytes]], None, tuple[int, int]]


class _FileScan:
    """What both loops do with a block once it is read: hand out its records and, with `skip` (skip_corrupt),
    go past damage instead of raising it.

    `process` walks `buffer[position:end]` with the block scanner and says where the buffer must go on and
    how many bytes it needs there (0: the file is done). With `skip`, each damaged stretch is reported to it
    as a `DamagedRegion`: a data CRC mismatch skips that one record (its length and length CRC hold, so the
    next record starts right after it); damaged framing (`_LENGTH_CRC_BAD`, `_TOO_LARGE`) starts a search
    (`searching_from`) for the next place where a whole record checks out (`find`), reading on as needed
    and bounded by max_record_size; a record cut by the end of the stream ends the file. The results depend
    on the bytes only, never on where blocks were cut, so a read resumed at any record offset sees the same.
    """

    def __init__(
        self,
        path: str,
        strict: bool,
        guard: _Guard,
        skip: Callable[[DamagedRegion], None] | None,
        scan: Callable[[Any, int, int, int], tuple[list[int], list[bytes], int, int, int]],
        find: Callable[[Any, int, int], tuple[int, int, int]],
    ) -> None:
        self.path, self.strict, self.guard, self.skip = path, strict, guard, skip
        self.scan, self.find = scan, find
        self.searching_from: int | None = None  # stream offset of the damaged framing being searched past
        self.damage: tuple[str, DataLossError] | None = None  # its reason and error

    def process(self, buffer: Any, position: int, end: int, base: int, final: bool) -> _Blocks:
        """Yields the record blocks of `buffer[position:end]` (`base`: the stream offset of buffer[0]; `final`:
        the stream has ended); returns `(position, need)`."""
        path, limit = self.path, self.guard.limit
        while True:
            if self.searching_from is None:
                offsets, records, position, status, detail = self.scan(buffer, position, end, base)
                if records:
                    yield offsets, records
                if status in (_NEED_HEADER, _NEED_RECORD):
                    if final:
                        self._end(base + position, end - position)
                        return position, 0
                    return position, detail + _HEADER_SIZE + _FOOTER_SIZE if status == _NEED_RECORD else _HEADER_SIZE
                error = _block_error(status, detail, path, base + position, limit)
                if self.skip is None:
                    raise error
                if status == _DATA_CRC_BAD:
                    size = _HEADER_SIZE + detail + _FOOTER_SIZE
                    self._skipped(base + position, base + position + size, _REASONS[status], error)
                    position += size
                    continue
                self._search(base + position, _REASONS[status], error)
                position += 1
            position, status, detail = self.find(buffer, position, end)
            if status == _FOUND:
                self._found(base + position)
            elif not final:
                return position, detail + _HEADER_SIZE + _FOOTER_SIZE if status == _NEED_RECORD else _HEADER_SIZE
            elif status == _NEED_RECORD:
                position += 1  # a header whose record the stream does not hold: not a record
            else:
                self._found(base + end)  # nothing more: the stretch reaches the end of the file
                return position, 0

    def refused(self, error: DataLossError, stream: Any, base: int, position: int, end: int) -> int | None:
        """The guard refused to read the record (or the candidate) at `buffer[position]`: raises `error`
        without `skip`; else the position `process` goes on from, or None when the file is done."""
        if self.searching_from is not None:
            return position + 1  # a candidate the file cannot hold, or longer than a record may be
        if self.skip is None:
            raise error
        if error.kind == "too large":
            self._search(base + position, _REASONS[_TOO_LARGE], error)
            return position + 1
        reached = base + end  # a record the file cannot hold is cut by its end; else the stream broke in a probe
        reason = "truncated record" if error.kind == "truncated" else f"{error.kind} stream"
        self._skipped(base + position, reached + self.guard.rest(stream, reached), reason, error)
        return None

    def unreadable(self, error: DataLossError, base: int, position: int, end: int) -> None:
        """Reading the stream failed at `base + end`: raises `error` without `skip`; else what was read from the
        damage (or the record) on is skipped and the file is done."""
        if self.skip is None:
            raise error
        if self.searching_from is not None:
            self._found(base + end)
        else:
            self._skipped(base + position, base + end, f"{error.kind} stream", error)

    def _end(self, offset: int, left: int) -> None:
        """The stream ended with `left` bytes of a record at `offset`: nothing, or a cut header without
        `strict`, is the end of the file; anything else is a truncated record."""
        if left and (self.strict or left >= _HEADER_SIZE):
            error = _data_loss("truncated", self.path, offset, f"the file ends {left} bytes into the record")
            if self.skip is None:
                raise error
            self._skipped(offset, offset + left, "truncated record", error)

    def _search(self, offset: int, reason: str, error: DataLossError) -> None:
        self.searching_from, self.damage = offset, (reason, error)

    def _found(self, offset: int) -> None:
        assert self.searching_from is not None and self.damage is not None
        self._skipped(self.searching_from, offset, *self.damage)
        self.searching_from = self.damage = None

    def _skipped(self, start: int, end: int, reason: str, error: DataLossError) -> None:
        assert self.skip is not None
        self.skip(DamagedRegion(path=self.path, start=start, end=end, reason=reason, error=error))


def _scan_python(
    stream: Any,
    path: str,
    offset: int,
    verify: bool,
    strict: bool,
    block_size: int,
    guard: _Guard,
    skip: Callable[[DamagedRegion], None] | None = None,
) -> Iterator[tuple[list[int], list[bytes]]]:
    """The hot loop on `_scan_block_python`: slices whole records out of each block, refilling when one
    is cut. `_scan_compiled` reads the same sizes, consults the guard for the same records and reports
    through `_FileScan` the same way.
    """
    limit = guard.limit
    length_crcs: dict[int, int] = {}

    def scan(buffer: bytes, position: int, end: int, base: int) -> tuple[list[int], list[bytes], int, int, int]:
        return _scan_block_python(buffer, position, base, verify, limit, length_crcs)

    def find(buffer: bytes, position: int, end: int) -> tuple[int, int, int]:
        return _find_record_python(buffer, position, end, limit)

    state = _FileScan(path, strict, guard, skip, scan, find)
    buffer, position, base, final = b"", 0, offset, False  # base: stream offset of buffer[0]
    while True:
        position, need = yield from state.process(buffer, position, len(buffer), base, final)
        if not need:
            return
        end = len(buffer)
        wanted = need - (end - position)
        if wanted > block_size:  # a record bigger than a block: bound its length before reading it
            try:
                wanted = guard.allowance(buffer, position, base + position, need)
            except DataLossError as error:
                going_on = state.refused(error, stream, base, position, end)
                if going_on is None:
                    return
                position = going_on
                continue
        else:
            wanted = block_size
        try:
            more = _read_more(stream, wanted, path, base + position)
        except DataLossError as error:
            state.unreadable(error, base, position, end)
            return
        buffer, base, position, final = buffer[position:] + more, base + position, 0, not more


def _scan_compiled(
    core: Any,
    stream: Any,
    path: str,
    offset: int,
    verify: bool,
    strict: bool,
    block_size: int,
    guard: _Guard,
    skip: Callable[[DamagedRegion], None] | None = None,
) -> Iterator[tuple[list[int], list[bytes]]]:
    """The hot loop on the compiled `scan` (and `find`) of `core`, reading into one reused bytearray.

    A fresh 1 MiB bytes object per block (the read, then the cut record joined to it) costs a page
    fault per 4 KiB on glibc, which took more time than checking and slicing out the records; the
    reused buffer is allocated once per file (again only for a record bigger than it). Where the
    stream's length is known (a plain file, an object) the buffer is no bigger than what is left of
    it: a zero-filled buffer of two blocks for every file was most of what reading many small files
    cost per file (about 25 us of 85 for a 130 KB file).
    """
    scan_block, find_record = core.scan, core.find
    scan_limit = min(guard.limit, _UINT64)  # the C side compares with a uint64; a larger limit bounds nothing more

    def scan(buffer: bytearray, position: int, end: int, base: int) -> tuple[list[int], list[bytes], int, int, int]:
        return scan_block(buffer, position, end, base, verify, scan_limit)

    def find(buffer: bytearray, position: int, end: int) -> tuple[int, int, int]:
        return find_record(buffer, position, end, scan_limit)

    state = _FileScan(path, strict, guard, skip, scan, find)
    buffer = bytearray()
    start, end, base, final = 0, 0, offset, False  # records from buffer[start:end]; base: offset of buffer[0]
    stream_end = guard.stream_size()  # None: unknown (compressed), or no longer trusted (the file grew)
    while True:
        start, need = yield from state.process(buffer, start, end, base, final)
        if not need:
            return
        tail = end - start
        wanted = need - tail
        if wanted > block_size:  # a record bigger than a block: bound its length before reading it
            try:
                wanted = guard.allowance(bytes(buffer[start:end]), 0, base + start, need)
            except DataLossError as error:
                going_on = state.refused(error, stream, base, start, end)
                if going_on is None:
                    return
                start = going_on
                continue
        else:
            wanted = block_size
        # What the buffer can ever need to hold: the cut record, the rest of the stream and one byte more, so
        # that the read which finds the end has room to come back empty.
        most = None if stream_end is None else tail + max(stream_end - (base + end), 0) + 1
        buffer = _compact(
            buffer, start, end, tail + wanted if most is None else min(tail + wanted, most), block_size, most
        )
        base, start, end = base + start, 0, tail
        try:
            got = _read_into(stream, buffer, end, wanted, path, base)
        except DataLossError as error:
            state.unreadable(error, base, start, end)
            return
        end += got
        final = not got
        if stream_end is not None and base + end > stream_end:
            stream_end = None  # the file grew while it was read: block-sized buffers from now on


def _compact(buffer: bytearray, start: int, end: int, size: int, block_size: int, most: int | None) -> bytearray:
    """`buffer[start:end]` moved to the front of a buffer holding at least `size` bytes: the same one
    unless it is too small, or much bigger than needed after a big record (memory follows the data).

    A fresh buffer has room for two blocks, or `most` bytes if fewer: all the stream can still deliver,
    where its length is known (`size` is at most that), so a small file gets a buffer of its size.
    """
    if size <= len(buffer) <= 4 * max(size, block_size):
        if start:
            buffer[: end - start] = buffer[start:end]  # the cut record only: usually less than one record
        return buffer
    fresh = bytearray(max(size, 2 * block_size if most is None else min(2 * block_size, most)))
    fresh[: end - start] = buffer[start:end]
    return fresh


def _rest_of(stream: Any, block_size: int) -> int:
    """Reads the stream to its end (or to where it breaks) and says how many bytes that was."""
    count = 0
    while True:
        try:
            more = len(stream.read(block_size))
        except (zlib.error, OSError, _TruncatedStream) as error:
            if object_changed(error):
                raise
            return count
        if not more:
            return count
        count += more
