"""The TFRecord block scanners: a byte stream in, checked whole records out, a block at a time.

Its one job is the reader's hot loop (`tfrecord.py`'s module docstring says what reading does):
pull a block of the stream, slice out every whole record in it with both CRCs checked, carry a
cut record over to the next block, and say where and why it stopped. Two scanners do that, the
compiled one (`torchestimator._native._records.scan`, driven by `_scan_compiled` over one reused
buffer) and its pure-Python fallback and reference (`_scan_block_python`, driven by
`_scan_python`); both stop with the same statuses and report through the same error builders
here (`_data_loss`, `_too_large`, `_read_error`), so a message and its offset never depend on
the path. An object deleted or replaced under the reader (`_remote_files.object_changed`)
passes through as it is: it is not damage in the file. `tfrecord.py` chooses the path, opens the file, bounds long records (its `_LengthGuard`,
passed in as `guard`) and keeps the public names.

It is separate so the loops the speed work tunes sit together, apart from the file format's
public face (writer, options, file lists) and under ~800 lines each; it imports nothing from
`tfrecord.py` (which imports from here), so there is no import cycle.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
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

# What a block scanner reports (the same numbers as in _native/records.c): why it stopped handing out records.
_NEED_HEADER, _NEED_RECORD, _LENGTH_CRC_BAD, _TOO_LARGE, _DATA_CRC_BAD = range(5)


def _mask(crc: int) -> int:
    """TensorFlow's mask of a CRC32C: rotated right by 15 plus 0xA282EAD8."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _UINT32


# --------------------------------------------------------------------------- errors


def _data_loss(kind: str, path: str, offset: int, detail: str, *, data_part: bool = False) -> DataLossError:
    """`kind` is TF's word ("corrupted"/"truncated"); `data_part`: TF's number is offset + 12."""
    number = offset + _HEADER_SIZE if data_part else offset
    hint = " (Is this even a TFRecord file?)" if number == 0 and kind == "corrupted" else ""
    return DataLossError(
        f"{kind} record at {number} in {path}{hint}: {detail} (the record starts at byte {offset}). "
        f"Records before it were read; pass skip_corrupt=True to skip the rest of a damaged file "
        f"instead of failing.",
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


class _Guard(Protocol):
    """What the loops need of `tfrecord._LengthGuard`: the limit, and the bytes to read next for a
    record bigger than a block (raising DataLossError when it must not be read)."""

    limit: int

    def allowance(self, buffer: bytes, position: int, offset: int, need: int) -> int: ...


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
    `detail`; `_LENGTH_CRC_BAD`; `_TOO_LARGE` with the length; `_DATA_CRC_BAD`). `length_crcs` caches
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
                return offsets, records, position, _DATA_CRC_BAD, 0
        add_offset(base + position)
        add_record(record)
        position = stop + _FOOTER_SIZE
    return offsets, records, position, _NEED_HEADER, 0


def _scan_python(
    stream: Any,
    path: str,
    offset: int,
    verify: bool,
    strict: bool,
    block_size: int,
    guard: _Guard,
) -> Iterator[tuple[list[int], list[bytes]]]:
    """The hot loop on `_scan_block_python`: slices whole records out of each block, refilling when one
    is cut. `_scan_compiled` reads the same sizes, consults the guard for the same records and reports
    through `_block_error` the same way.
    """
    limit = guard.limit
    length_crcs: dict[int, int] = {}
    buffer, position, base, need = b"", 0, offset, _HEADER_SIZE  # base: stream offset of buffer[0]
    while True:
        end = len(buffer)
        wanted = need - (end - position)
        if wanted > block_size:  # a record bigger than a block: bound its length before reading it
            wanted = guard.allowance(buffer, position, base + position, need)
        else:
            wanted = block_size
        more = _read_more(stream, wanted, path, base + position)
        if not more:
            _check_end(path, base + position, end - position, strict)
            return
        buffer, base = buffer[position:] + more, base + position
        offsets, records, position, status, detail = _scan_block_python(buffer, 0, base, verify, limit, length_crcs)
        if records:
            yield offsets, records
        need = _need_after(status, detail, path, base + position, limit)


def _scan_compiled(
    scan: Any,
    stream: Any,
    path: str,
    offset: int,
    verify: bool,
    strict: bool,
    block_size: int,
    guard: _Guard,
) -> Iterator[tuple[list[int], list[bytes]]]:
    """The hot loop on the compiled `scan`, reading into one reused bytearray.

    A fresh 1 MiB bytes object per block (the read, then the cut record joined to it) costs a page
    fault per 4 KiB on glibc, which took more time than checking and slicing out the records; the
    reused buffer is allocated once per file (again only for a record bigger than it).
    """
    limit = guard.limit
    scan_limit = min(limit, _UINT64)  # the C side compares with a uint64; a larger limit bounds nothing more
    buffer = bytearray()
    start, end, base, need = 0, 0, offset, _HEADER_SIZE  # records from buffer[start:end]; base: offset of buffer[0]
    while True:
        tail = end - start
        wanted = need - tail
        if wanted > block_size:  # a record bigger than a block: bound its length before reading it
            wanted = guard.allowance(bytes(buffer[start:end]), 0, base + start, need)
        else:
            wanted = block_size
        buffer = _compact(buffer, start, end, tail + wanted, block_size)
        base, start, end = base + start, 0, tail
        got = _read_into(stream, buffer, end, wanted, path, base)
        if not got:
            _check_end(path, base, tail, strict)
            return
        end += got
        offsets, records, start, status, detail = scan(buffer, 0, end, base, verify, scan_limit)
        if records:
            yield offsets, records
        need = _need_after(status, detail, path, base + start, limit)


def _compact(buffer: bytearray, start: int, end: int, size: int, block_size: int) -> bytearray:
    """`buffer[start:end]` moved to the front of a buffer holding at least `size` bytes: the same one
    unless it is too small, or much bigger than needed after a big record (memory follows the data)."""
    if size <= len(buffer) <= 4 * max(size, block_size):
        if start:
            buffer[: end - start] = buffer[start:end]  # the cut record only: usually less than one record
        return buffer
    fresh = bytearray(max(size, 2 * block_size))
    fresh[: end - start] = buffer[start:end]
    return fresh


def _check_end(path: str, offset: int, left: int, strict: bool) -> None:
    """The stream ended with `left` bytes of a record at `offset`: nothing, or a cut header without
    `strict`, is the end of the file; anything else is a truncated record."""
    if left and (strict or left >= _HEADER_SIZE):
        raise _data_loss("truncated", path, offset, f"the file ends {left} bytes into the record")


def _need_after(status: int, detail: int, path: str, offset: int, limit: int) -> int:
    """Bytes the record at `offset` needs from the stream (framing included), from a scanner's status;
    raises the damage it reports."""
    if status == _NEED_HEADER:
        return _HEADER_SIZE
    if status == _NEED_RECORD:
        return detail + _HEADER_SIZE + _FOOTER_SIZE
    raise _block_error(status, detail, path, offset, limit)
