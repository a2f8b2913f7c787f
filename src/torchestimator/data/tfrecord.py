"""TFRecord files without TensorFlow: the record framing, its CRCs, GZIP/ZLIB, file lists.

What belongs here: writing and reading the byte format of
`tf.io.TFRecordWriter` / `tf.data.TFRecordDataset` (formats.md section 1),
byte-identical both ways, including GZIP and ZLIB files; the masked CRC32C;
`DataLossError`; expanding paths, globs and lists into files. What does not:
the meaning of the records (`tf.train.Example` is in `example.py` and
`parsing.py`), feeding them to training (`tfrecord_dataset.py`), and the
byte streams of objects in a store (`_remote_files.py`).

Every path may be a URL (`s3://`, `gs://`, `az://`, `memory://`; `file://`
is the local path): reading, globs, GZIP/ZLIB, offsets and every error below
are the same, the error naming the URL. A local path is opened with `open` as
before (no fsspec); a URL is a `_remote_files.RemoteFile`, fetched ahead in
16 MiB ranges while the records are scanned. An object deleted or replaced
while it is read is a FileNotFoundError / an OSError (ESTALE) naming it, not
damaged data. `TFRecordWriter` writes a URL as one upload, published whole when it
closes and dropped when the `with` block raises.

A file is records back to back, each::

    uint64 length (LE) | uint32 masked crc32c(length bytes) | data | uint32 masked crc32c(data)

Reading follows TensorFlow's record reader (`record_reader.cc`):

- A clean end of file at a record boundary ends the file.
- A CRC mismatch raises `DataLossError("corrupted record at N in FILE ...")`;
  a record cut inside its data or data CRC, or a compressed stream cut before
  its end marker, raises `DataLossError("truncated record at N in FILE ...")`.
  N is TensorFlow's number, in *uncompressed* stream coordinates: the record
  start, except for a data CRC mismatch where TensorFlow names the data
  (record start + 12). `DataLossError.offset` is always the record start.
- A file cut inside a 12-byte record header: TensorFlow silently treats it as
  the end of the file and the record is lost without a word. Here
  `strict=True` (the default) raises "truncated record" instead, because a cut
  file is almost always a half-written one; `strict=False` matches TensorFlow.
- A declared length is bounded before memory is spent on it (a damaged or
  crafted length must not become a huge allocation, the "decompression
  bomb" of a few MB of GZIP declaring 2**60 bytes). A record longer than
  `max_record_size` (default `DEFAULT_MAX_RECORD_SIZE`, 2 GiB - 1) raises
  `DataLossError("record too large at N in FILE ...")` saying how to raise
  the limit, whatever its size (a record inside a read block is compared
  too: one integer compare per record). In a plain file a record reaching past the end of the file is
  "truncated" before anything is read (the file size is looked up only for
  records bigger than a read block, and again only if one seems to reach
  past it, so a growing file is not misjudged). In a compressed file a
  record over 64 MiB is first decompressed and thrown away in 1 MiB pieces,
  checking that the stream delivers all of it (and its CRC, with verify),
  then read for real: memory stays bounded whatever the length says, at the
  price of inflating such big records twice.
- The layers below never show through: a broken compressed stream (zlib's
  error) is "corrupted record at N", a failing read (an OSError such as EIO;
  the original is the error's `__cause__`) is "unreadable record at N", both
  DataLossError with the file and the record's start. Opening a missing or
  forbidden file stays FileNotFoundError/PermissionError, which name it.
- `skip_corrupt=True` skips damage and reads on, keeping more than
  TensorFlow's `ignore_errors()` (which drops the rest of a damaged file):
  a record whose data CRC fails (its length and length CRC intact) is
  skipped alone; after damaged framing (a length CRC that fails, a length
  over `max_record_size`) the reader searches forward byte by byte for the
  next place where a whole record checks out, its length CRC *and* its data
  CRC (so a header copied inside some record's data is passed by), bounded
  by `max_record_size` like any record; a record cut by the end of the file
  (or a broken compressed stream) ends the file. Each damaged stretch is a
  `DamagedRegion` (file, start and end offsets, reason, the error that
  `skip_corrupt=False` raises there); `ReadStats` counts them (records,
  bytes, files) and lists them, one warning per damaged file names its
  regions, and `read_records` ends with one warning summing them up. The
  search needs the CRCs, so it runs with `verify=False` too; only a record
  holding a whole valid record inside its data could be taken for one. Without
  `skip_corrupt` the first damage raises DataLossError, as always; its
  message says how to skip it ("pass skip_corrupt=True to ...").

Speed: the reader pulls blocks of about 1 MiB and hands each to a block
scanner that slices out every whole record in it and checks both CRCs. The
compiled one (`torchestimator._native._records.scan`: CRC32C by the SSE4.2
instruction or a slicing-by-8 table, the framing checked without the GIL,
blocks read into one reused buffer) runs where it was built; `TORCHESTIMATOR_PURE_PYTHON=1` or a missing build
gives `_scan_block_python`: `struct.unpack_from`, the C `crc32c` package
for the data CRC and a cache keyed by length for the length CRC (records of
a file usually share a few lengths). Both scanners and their loops live in
`_tfrecord_scan.py`; they report where and why they stopped the same way and
the errors are worded there once, so their messages and offsets do not depend
on the path (`describe_reader()` says which one runs). The writer
frames records with the compiled `frame` the same way. `iter_record_blocks`
hands records out a block at a time so callers can avoid one generator step
per record.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import stat
import struct
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, TypedDict

from torchestimator import _native
from torchestimator._io.filesystems import is_url, local_path
from torchestimator.data import _remote_files
from torchestimator.data._tfrecord_scan import (
    _CRC,
    _FOOTER_SIZE,
    _HEADER_SIZE,
    _MASK_DELTA,
    _UINT32,
    DamagedRegion,
    _crc32c,
    _crc32c_extend,
    _data_loss,
    _mask,
    _read_more,
    _rest_of,
    _scan_compiled,
    _scan_python,
    _too_large,
    _TruncatedStream,
)
from torchestimator.errors import DataLossError

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; annotations are not evaluated at run time
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_RECORD_SIZE",
    "DamagedRegion",
    "DataLossError",
    "ReadOptions",
    "ReadStats",
    "TFRecordWriter",
    "describe_reader",
    "iter_record_blocks",
    "iter_records",
    "list_files",
    "masked_crc32c",
    "read_records",
    "unmask_crc32c",
]

_LENGTH = struct.Struct("<Q")
_BLOCK_SIZE = 1 << 20
DEFAULT_MAX_RECORD_SIZE = (1 << 31) - 1
"""The largest record read unless `max_record_size` says otherwise: protobuf's limit on one message
(2 GiB - 1), so every record TensorFlow can parse as a tf.train.Example is accepted."""
# Compressed records larger than this are decompressed once and thrown away (checking that the
# stream holds them and, with verify, their CRC) before memory is spent on them.
_PROBE_SIZE = 64 << 20
# Reads from a file whose size is unknown (not a regular file) are capped, so memory follows the data.
_MAX_READ_SIZE = 256 << 20
_COMPRESSED_BLOCK_SIZE = 256 << 10
_WRITE_BUFFER_SIZE = 256 << 10
_COMPRESSIONS = {"": None, "NONE": None, "GZIP": "GZIP", "ZLIB": "ZLIB"}
_WINDOW_BITS = {"GZIP": 31, "ZLIB": 15}
# TF's zlib options (zlib_compression_options.h): level Z_DEFAULT_COMPRESSION, memLevel 9.
_COMPRESSION_LEVEL = -1
_MEMORY_LEVEL = 9


# --------------------------------------------------------------------------- checksums


def masked_crc32c(data: bytes) -> int:
    """TensorFlow's masked CRC32C of `data`: the CRC rotated right by 15 plus 0xA282EAD8."""
    return _mask(_crc32c(data))


def unmask_crc32c(value: int) -> int:
    """The plain CRC32C back from a masked one (the inverse of the mask in `masked_crc32c`)."""
    rotated = (value - _MASK_DELTA) & _UINT32
    return ((rotated >> 17) | (rotated << 15)) & _UINT32


# --------------------------------------------------------------------------- stats


@dataclasses.dataclass(kw_only=True)
class ReadStats:
    """What a read saw; pass one in to collect counts across files (it is updated in place)."""

    files: int = 0
    """Files opened."""
    records: int = 0
    """Records handed out."""
    bytes: int = 0
    """Payload bytes handed out (without the 16 bytes of framing per record)."""
    skipped_files: int = 0
    """Files in which damage was skipped (only with skip_corrupt=True)."""
    skipped_records: int = 0
    """Damaged records skipped: one per damaged region (`DamagedRegion.records`)."""
    skipped_bytes: int = 0
    """Bytes skipped in damaged regions, framing included (uncompressed stream bytes)."""
    regions: list[DamagedRegion] = dataclasses.field(default_factory=list)
    """Every damaged region skipped, with its file and offsets, in reading order."""
    errors: list[DataLossError] = dataclasses.field(default_factory=list)
    """The damage found: for each region the error skip_corrupt=False raises there, in reading order."""

    def summary(self) -> str:
        text = f"{self.records} records ({self.bytes} bytes) from {self.files} files"
        if self.regions:
            first = self.regions[0]
            text += (
                f"; skipped {len(self.regions)} damaged regions ({self.skipped_records} records, "
                f"{self.skipped_bytes} bytes) in {self.skipped_files} files "
                f"(first: {first.path} at offset {first.start})"
            )
        return text


# --------------------------------------------------------------------------- files and options


def _normalize_compression(compression: str | None, *, allow_auto: bool) -> str | None:
    if compression is None:
        return None
    if isinstance(compression, str):
        key = compression.upper()
        if key in _COMPRESSIONS:
            return _COMPRESSIONS[key]
        if allow_auto and key == "AUTO":
            return "AUTO"
    choices = 'None, "", "GZIP", "ZLIB"' + (', "auto"' if allow_auto else "")
    raise ValueError(f"compression must be one of {choices}; received {compression!r}.")


def _detect_compression(path: str) -> str | None:
    """GZIP/ZLIB by magic bytes, unless the file already starts with a valid record header."""
    if is_url(path):
        return _compression_of(_remote_files.read_range(path, 0, _HEADER_SIZE))
    with open(local_path(path), "rb") as file:
        return _compression_of(file.read(_HEADER_SIZE))


def _compression_of(head: bytes) -> str | None:
    """`_detect_compression` of a file's first 12 bytes."""
    if len(head) == _HEADER_SIZE and masked_crc32c(head[:8]) == _CRC.unpack_from(head, 8)[0]:
        return None
    if head[:2] == b"\x1f\x8b":
        return "GZIP"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        return "ZLIB"
    return None


def list_files(files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Paths from a path, a glob pattern, or a list of either; any of them may be a URL.

    Each glob expands to its matches in sorted order; a list keeps its own
    order (so an explicit list of shards is read as given). A pattern that
    matches nothing, or a path that does not exist, raises FileNotFoundError
    naming it; a directory raises ValueError. A URL (``s3://b/train-*.tfrecord``,
    ``gs://``, ``az://``, ``memory://``) expands the same way into full URLs; a
    ``file://`` URL is the local path it names.
    """
    if isinstance(files, (str, os.PathLike)):
        entries = [files]
    elif isinstance(files, Iterable) and not isinstance(files, (bytes, bytearray)):
        entries = list(files)
    else:
        raise TypeError(f"files must be a path, a glob pattern, or a list of them; received {type(files).__name__}.")
    if not entries:
        raise ValueError("files is an empty list; pass at least one path or glob pattern.")
    for entry in entries:
        if not isinstance(entry, (str, os.PathLike)):
            raise TypeError(
                f"every entry of files must be a str or os.PathLike; received {type(entry).__name__} ({entry!r})."
            )
    return [path for entry in entries for path in _expand(os.fspath(entry))]


def _expand(pattern: str) -> list[str]:
    if is_url(pattern):
        return _remote_files.expand(pattern)
    pattern = local_path(pattern)
    if glob.has_magic(pattern):
        matches = sorted(path for path in glob.glob(pattern) if not os.path.isdir(path))
        if not matches:
            raise FileNotFoundError(
                f"No files matched pattern {pattern!r}. Check the directory and the pattern (globs use *, ? and [...])."
            )
        return matches
    if os.path.isdir(pattern):
        raise ValueError(
            f"{pattern!r} is a directory; pass the files in it, e.g. {os.path.join(pattern, '*.tfrecord')!r}."
        )
    if not os.path.exists(pattern):
        raise FileNotFoundError(f"TFRecord file {pattern!r} does not exist.")
    return [pattern]


# --------------------------------------------------------------------------- writing


def _frame_record_python(record: bytes | bytearray | memoryview) -> bytes:
    """One record as it is written: length, its masked CRC, the data, the data's masked CRC."""
    data = bytes(record)
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data, _CRC.pack(masked_crc32c(data))))


def _compiled_framer(module: Any) -> Any:
    """`module.frame` (the compiled `_records`), for any bytes-like record; None for no module."""
    if module is None:
        return None
    frame = module.frame

    def frame_record(record: bytes | bytearray | memoryview) -> bytes:
        # frame() reads a contiguous buffer; a strided memoryview is copied into bytes first, as bytes() does.
        if isinstance(record, memoryview) and not record.c_contiguous:
            record = record.tobytes()
        return frame(record)

    return frame_record


_frame_record = _compiled_framer(_native.load("_records")) or _frame_record_python
"""How `TFRecordWriter.write` frames a record: the compiled `frame` where `torchestimator._native` has it."""


class TFRecordWriter:
    """Writes records to one file, byte-identical to `tf.io.TFRecordWriter`.

    `compression` is None/"" (plain), "GZIP" or "ZLIB"; compressed files use
    TensorFlow's zlib settings (level 6, memLevel 9, gzip header with mtime 0),
    so the bytes equal TensorFlow's. Use as a context manager or call close().
    `path` may be a URL: the object is uploaded as it grows and published whole
    at close(); when the `with` block raises, nothing is published.
    """

    def __init__(self, path: str | os.PathLike[str], compression: str | None = None) -> None:
        self.path = os.fspath(path)
        self.compression = _normalize_compression(compression, allow_auto=False)
        self._compressor: Any = None
        if self.compression is not None:
            self._compressor = zlib.compressobj(
                _COMPRESSION_LEVEL, zlib.DEFLATED, _WINDOW_BITS[self.compression], _MEMORY_LEVEL
            )
        self._file: Any = (
            _remote_files.open_for_writing(self.path) if is_url(self.path) else open(local_path(self.path), "wb")  # noqa: SIM115
        )
        self._pending: list[bytes] = []
        self._pending_size = 0

    def write(self, record: bytes | bytearray | memoryview) -> None:
        """Appends one record (any bytes-like payload, e.g. a serialized tf.train.Example)."""
        if self._file is None:
            raise ValueError(f"TFRecordWriter for {self.path!r} is closed; open a new writer.")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"TFRecordWriter.write expects bytes; received {type(record).__name__}. Encode "
                f"text first (e.g. record.encode()) or serialize the example (encode_example)."
            )
        framed = _frame_record(record)
        self._pending.append(framed)
        self._pending_size += len(framed)
        if self._pending_size >= _WRITE_BUFFER_SIZE:
            self._drain()

    def _drain(self) -> None:
        assert self._file is not None
        data = b"".join(self._pending)
        self._pending, self._pending_size = [], 0
        if self._compressor is not None:
            data = self._compressor.compress(data)
        self._file.write(data)

    def flush(self) -> None:
        """Hands buffered records to the OS. Compressed files stay a single stream, so a
        flushed compressed file is readable only up to the last complete deflate block."""
        if self._file is None:
            return
        self._drain()
        self._file.flush()

    def close(self) -> None:
        """Finishes the (compressed) stream and closes the file; closing twice is allowed."""
        if self._file is None:
            return
        try:
            self._drain()
            if self._compressor is not None:
                self._file.write(self._compressor.flush())
        finally:
            self._file.close()
            self._file = None

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, exc_type: Any, *exc_info: object) -> None:
        if exc_type is not None and is_url(self.path) and self._file is not None:
            # an object is published whole or not at all: a write that failed publishes nothing
            handle, self._file = self._file, None
            _remote_files.discard_writing(handle, self.path)
            return
        self.close()


# --------------------------------------------------------------------------- reading


class _InflateStream:
    """`read(size)` over a GZIP/ZLIB file: decompressed bytes, fewer than size only at the end.

    Concatenated gzip members (which TensorFlow reads) are decompressed one after another.
    A cut stream first hands out what it could decompress, then raises _TruncatedStream.
    """

    def __init__(self, raw: BinaryIO, window_bits: int) -> None:
        self._raw = raw
        self._window_bits = window_bits
        self._inflater = zlib.decompressobj(window_bits)
        self._input = b""
        self._fed = False
        self._truncated = False

    def read(self, size: int) -> bytes:
        if self._truncated:
            raise _TruncatedStream()
        parts: list[bytes] = []
        have = 0
        while have < size:
            if not self._input:
                self._input = self._raw.read(_COMPRESSED_BLOCK_SIZE)
                if not self._input:
                    self._truncated = self._fed and not self._inflater.eof
                    if self._truncated and not parts:
                        raise _TruncatedStream()
                    break
            if self._inflater.eof:
                self._inflater = zlib.decompressobj(self._window_bits)
            out = self._inflater.decompress(self._input, size - have)
            self._fed = True
            self._input = self._inflater.unused_data if self._inflater.eof else self._inflater.unconsumed_tail
            if out:
                parts.append(out)
                have += len(out)
        return b"".join(parts)

    def mark(self) -> tuple[Any, ...]:
        """The whole state, for `reset`: raw position, inflater copy, pending input, flags."""
        return (self._raw.tell(), self._inflater.copy(), self._input, self._fed, self._truncated)

    def reset(self, mark: tuple[Any, ...]) -> None:
        position, inflater, self._input, self._fed, self._truncated = mark
        self._inflater = inflater.copy()  # the mark stays usable
        self._raw.seek(position)


def _raw_size(raw: Any) -> int:
    """The size of what `_open_raw` opened: fstat for a local file, the object's size for a URL."""
    return raw.size if isinstance(raw, _remote_files.RemoteFile) else os.fstat(raw.fileno()).st_size


def _open_raw(path: str) -> Any:
    """The unbuffered stream the scanners read: a local file as always, or an object read ahead in
    large ranges (`_remote_files.RemoteFile`)."""
    if is_url(path):
        return _remote_files.RemoteFile(path)
    return open(local_path(path), "rb", buffering=0)


def _skip_to(stream: Any, path: str, start_offset: int, compression: str | None) -> None:
    """Positions the stream at `start_offset` (plain: seek; compressed: inflate and discard)."""
    if compression is None:
        size = _raw_size(stream)
        if start_offset > size:
            raise ValueError(
                f"start_offset {start_offset} is past the end of {path} ({size} "
                f"bytes); pass an offset saved from reading this file."
            )
        stream.seek(start_offset)
        return
    remaining = start_offset
    while remaining:
        skipped = len(_read_more(stream, min(remaining, _BLOCK_SIZE), path, start_offset - remaining))
        if not skipped:
            raise ValueError(
                f"start_offset {start_offset} is past the end of the uncompressed "
                f"stream of {path} ({start_offset - remaining} bytes)."
            )
        remaining -= skipped


class _LengthGuard:
    """Bounds a declared record length before the reader spends memory on it (module docstring).

    Consulted only for a record bigger than a read block; `_scan` compares every other record's length
    with `limit` itself (one integer compare per record).
    """

    def __init__(self, stream: Any, raw: BinaryIO, path: str, compressed: bool, limit: int, verify: bool) -> None:
        """`verify`: whether a probed record's CRC is checked (not with skip_corrupt: the scanner then finds a
        bad one and skips that record alone)."""
        self._stream, self._raw, self._path = stream, raw, path
        self._compressed, self._verify = compressed, verify
        self.limit = limit
        """max_record_size: the longest record data, in bytes."""
        self._size: int | None = -1  # the plain file's size; -1: not looked up yet, None: not a regular file

    def _file_size(self) -> int | None:
        if isinstance(self._raw, _remote_files.RemoteFile):
            return self._raw.size  # an object does not grow: its size at open is its size
        status = os.fstat(self._raw.fileno())
        return status.st_size if stat.S_ISREG(status.st_mode) else None

    def allowance(self, buffer: bytes, position: int, offset: int, need: int) -> int:
        """Bytes to read next for the record at `buffer[position:]` (stream `offset`), which is
        `need` bytes with its framing; raises DataLossError when it must not be read."""
        length = need - _HEADER_SIZE - _FOOTER_SIZE
        missing = need - (len(buffer) - position)
        if self._compressed:
            if length > self.limit:
                raise _too_large(self._path, offset, length, self.limit, present=None)
            if missing > _PROBE_SIZE:
                self._probe(buffer, position, offset, length)
            return missing
        if self._size is not None and (self._size < 0 or offset + need > self._size):
            self._size = self._file_size()  # first use, or the file may have grown since
        if self._size is not None and offset + need > self._size:
            raise _data_loss(
                "truncated",
                self._path,
                offset,
                f"it declares {length} bytes of data but the file ends {self._size - offset} bytes into the record",
            )
        if length > self.limit:
            raise _too_large(self._path, offset, length, self.limit, present=self._size is not None)
        return missing if self._size is not None else min(missing, _MAX_READ_SIZE)

    def rest(self, stream: Any, offset: int) -> int:
        """Bytes the stream holds after `offset`, where it stands: a plain file's size says, a compressed
        stream is read through (to its end, or to where it breaks). What skip_corrupt reports skipped
        when a record cut by the end of the file ends it."""
        size = self.stream_size()
        return max(size - offset, 0) if size is not None else _rest_of(stream, _BLOCK_SIZE)

    def stream_size(self) -> int | None:
        """The stream's length now: a plain file's size (an object's at open); None for a compressed stream
        or what is not a regular file. The compiled loop sizes its buffer by it."""
        return None if self._compressed else self._file_size()

    def _probe(self, buffer: bytes, position: int, offset: int, length: int) -> None:
        """Inflates the rest of the record in pieces and throws it away, checking it is all
        there (and its CRC), then rewinds the stream so the record is read for real."""
        stream, verify = self._stream, self._verify
        mark = stream.mark()
        try:
            data = buffer[position + _HEADER_SIZE :]  # at most about a block: the record is not read yet
            crc = _crc32c(data) if verify else 0
            have = len(data)
            while have < length:
                chunk = self._probe_read(min(length - have, _BLOCK_SIZE), offset, length, have)
                if verify:
                    crc = _crc32c_extend(crc, chunk)
                have += len(chunk)
            footer = self._probe_read(_FOOTER_SIZE, offset, length, have)
            if verify and _mask(crc) != _CRC.unpack(footer)[0]:
                raise _data_loss("corrupted", self._path, offset, "the data CRC does not match", data_part=True)
        finally:
            stream.reset(mark)  # refused too: skip_corrupt reads on from where the record starts

    def _probe_read(self, size: int, offset: int, length: int, have: int) -> bytes:
        chunk = _read_more(self._stream, size, self._path, offset, cut_is_end=True)
        if len(chunk) < size:
            raise _data_loss(
                "truncated",
                self._path,
                offset,
                f"it declares {length} bytes of data but the decompressed stream ends "
                f"{_HEADER_SIZE + have + len(chunk)} bytes into the record",
            )
        return chunk


def _file_blocks(
    path: str,
    raw: Any,
    compression: str | None,
    start_offset: int,
    verify: bool,
    strict: bool,
    block_size: int,
    max_record_size: int,
    skip: Callable[[DamagedRegion], None] | None = None,
) -> Iterator[tuple[list[int], list[bytes]]]:
    """`raw`: the file already opened (a URL's RemoteFile opened ahead of its turn), else None; `skip`: with
    skip_corrupt, what is told of each damaged region skipped (else damage raises DataLossError)."""
    kind = _normalize_compression(compression, allow_auto=True)
    if kind == "AUTO" and raw is None:
        kind = _detect_compression(path)
    if not isinstance(start_offset, int) or isinstance(start_offset, bool) or start_offset < 0:
        raise ValueError(f"start_offset must be an integer >= 0; received {start_offset!r}.")
    _check_max_record_size(max_record_size)
    with raw if raw is not None else _open_raw(path) as raw:
        if kind == "AUTO":  # from the stream opened ahead: its first range is (being) fetched already
            kind = _compression_of(raw.read(_HEADER_SIZE))
            raw.seek(0)
        stream: Any = raw if kind is None else _InflateStream(raw, _WINDOW_BITS[kind])
        _skip_to(stream, path, start_offset, kind)
        guard = _LengthGuard(stream, raw, path, kind is not None, max_record_size, verify and skip is None)
        yield from _scan(stream, path, start_offset, verify, strict, max(block_size, _HEADER_SIZE), guard, skip)


def _check_max_record_size(value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"max_record_size must be an integer >= 0 (bytes); received {value!r}.")


_core = _native.load("_records")
"""The compiled `_records` module `_scan` runs on (`_scan_compiled`), or None: `_scan_python`."""


def describe_reader() -> str:
    """Which path reads and writes records in this process, for `records inspect` and debug logs:
    e.g. "compiled (torchestimator._native._records, CRC32C by SSE4.2)" or "pure Python (...)"."""
    if _core is not None:
        return f"compiled (torchestimator._native._records, CRC32C by {_core.CRC32C_METHOD})"
    return f"pure Python (torchestimator._native: {_native.describe()})"


def _scan(
    stream: Any,
    path: str,
    offset: int,
    verify: bool,
    strict: bool,
    block_size: int,
    guard: _LengthGuard,
    skip: Callable[[DamagedRegion], None] | None,
) -> Iterator[tuple[list[int], list[bytes]]]:
    """The hot loop (`_tfrecord_scan`): `_scan_compiled` where the compiled core is loaded, else
    `_scan_python`. Both read the same sizes, consult the guard for the same records and report
    (and skip) damage through `_FileScan` the same way. `_core` is looked up per file, so tests can switch it."""
    if _core is not None:
        yield from _scan_compiled(_core, stream, path, offset, verify, strict, block_size, guard, skip)
    else:
        yield from _scan_python(stream, path, offset, verify, strict, block_size, guard, skip)


class ReadOptions(TypedDict, total=False):
    """The reading options `iter_records` and `read_records` pass on to `iter_record_blocks`,
    which holds their defaults (module docstring: what each one does)."""

    skip_corrupt: bool
    """False: damage raises DataLossError. True: damaged records are skipped and reading goes on, with a
    warning per damaged file and counts in `stats` (module docstring)."""
    verify: bool
    """True: check both CRCs of every record (framing is checked either way)."""
    strict: bool
    """True: a file cut inside a record header is "truncated"; False: TensorFlow's silent end of file."""
    stats: ReadStats | None
    """Counts to update in place, across files."""
    max_record_size: int
    """The largest record length accepted, in bytes."""


def _check_options(options: Mapping[str, object], caller: str) -> None:
    # **options would pass start_offset or block_size through unnoticed; refuse them as a signature would.
    unknown = sorted(set(options) - ReadOptions.__optional_keys__)
    if unknown:
        raise TypeError(
            f"{caller}() got an unexpected keyword argument {unknown[0]!r}; its options are "
            f"{sorted(ReadOptions.__optional_keys__)}."
        )


def iter_record_blocks(
    path: str | os.PathLike[str],
    compression: str | None = None,
    *,
    start_offset: int = 0,
    skip_corrupt: bool = False,
    verify: bool = True,
    strict: bool = True,
    stats: ReadStats | None = None,
    block_size: int = _BLOCK_SIZE,
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
) -> Generator[tuple[list[int], list[bytes]], None, None]:
    """The records of one file a block at a time: `(offsets, records)`, lists of equal length.

    The fast path under `iter_records` (same options): it saves a generator
    step per record. Every good record before damage is handed out before
    DataLossError is raised (with skip_corrupt, the damage is skipped instead).
    """
    yield from _record_blocks(
        os.fspath(path),
        None,
        compression,
        start_offset=start_offset,
        skip_corrupt=skip_corrupt,
        verify=verify,
        strict=strict,
        stats=stats,
        block_size=block_size,
        max_record_size=max_record_size,
    )


_SKIP_HINT = "pass skip_corrupt=True to TFRecordDataset/read_records/iter_records to skip damaged records and read on"
"""How a DataLossError from the library's readers says it can be skipped (the CLI words its own: --skip_corrupt)."""


def _record_blocks(
    path: str,
    raw: Any,
    compression: str | None,
    *,
    start_offset: int,
    skip_corrupt: bool,
    verify: bool,
    strict: bool,
    stats: ReadStats | None,
    block_size: int,
    max_record_size: int,
    hint: str = _SKIP_HINT,
    log_skips: bool = True,
) -> Generator[tuple[list[int], list[bytes]], None, None]:
    """`iter_record_blocks`, reading `raw` when it is given: a URL's `RemoteFile` that TFRecordDataset
    opened (and started fetching) while the file before it was read. `hint`: how the message of damage
    (without skip_corrupt) says to skip it, for the caller's own way of passing skip_corrupt. `log_skips=False`
    for a caller that reports the skipped regions itself (the CLI prints them)."""
    stats = stats if stats is not None else ReadStats()
    stats.files += 1
    regions: list[DamagedRegion] = []

    def skip(region: DamagedRegion) -> None:
        stats.skipped_files += not regions  # a file read twice (epochs) counts twice, as its records do
        regions.append(region)
        stats.regions.append(region)
        stats.errors.append(region.error)
        stats.skipped_records += region.records
        stats.skipped_bytes += region.size

    try:
        for offsets, records in _file_blocks(
            path,
            raw,
            compression,
            start_offset,
            verify,
            strict,
            block_size,
            max_record_size,
            skip if skip_corrupt else None,
        ):
            stats.records += len(records)
            stats.bytes += sum(map(len, records))
            yield offsets, records
    except DataLossError as error:
        if not skip_corrupt:
            if error.kind and hint:  # damage in the file (not a saved position that no longer fits)
                error.args = (f"{error} Records before it were read; {hint}.",)
            raise
        # not reached by damage the scanners go past: a compressed stream broken before start_offset
        skip(DamagedRegion(path=error.path, start=error.offset, end=error.offset, reason="unreadable", error=error))
    finally:
        if regions and log_skips:
            logger.warning(
                "Skipped %d damaged regions in %s (skip_corrupt=True; %d records, %d bytes): %s",
                len(regions),
                path,
                sum(region.records for region in regions),
                sum(region.size for region in regions),
                "; ".join(region.describe() for region in regions),
            )


def iter_records(
    path: str | os.PathLike[str],
    compression: str | None = None,
    *,
    start_offset: int = 0,
    **options: Unpack[ReadOptions],
) -> Iterator[tuple[int, bytes]]:
    """`(offset, record)` for each record of one file; the next record starts at
    `offset + 16 + len(record)`, which is what `start_offset` takes to resume.

    `options` are `ReadOptions` (`verify=False` skips both CRC checks; framing is
    still checked); see the module docstring for what they do.
    """
    _check_options(options, "iter_records")
    for offsets, records in iter_record_blocks(path, compression, start_offset=start_offset, **options):
        yield from zip(offsets, records)


def read_records(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    compression: str | None = None,
    **options: Unpack[ReadOptions],
) -> Iterator[bytes]:
    """Every record of every file (a path, glob, or list; see `list_files`), in order.

    With skip_corrupt=True, damaged records are skipped with a warning per damaged
    file, and one warning at the end sums up what was skipped. A record longer than
    `max_record_size` bytes is an error (see the module docstring).
    """
    _check_options(options, "read_records")
    stats = options.get("stats")
    if stats is None:  # one ReadStats across the files, for the summary below
        stats = options["stats"] = ReadStats()
    paths = list_files(files)
    for path in paths:
        for _, records in iter_record_blocks(path, compression, **options):
            yield from records
    if stats.regions:
        logger.warning("Read %s.", stats.summary())
