"""The HDF5 bytes of a Keras file as h5py reads them, checked where HDF5 itself would hang.

What belongs here: `HeapGuard` (the file object h5py's ``fileobj`` driver reads through), the check of
global heap collections, and `stored_member` (a ``.keras`` archive's uncompressed weights file read in place).
What does not: anything about Keras's layouts (``keras_h5``).
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
from typing import Any

__all__ = ["HeapGuard", "StoredMember", "global_heap_problem", "stored_member"]

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, 22 bytes we skip, file name length, extra field length


class StoredMember(io.RawIOBase):
    """The bytes of an uncompressed zip member, read in place through a file handle of its own.

    Python 3.11's ``ZipFile.open`` seeks backwards by reading the member again from its start (3.12 seeks a
    stored member directly: CPython gh-88339), and h5py seeks all over the file: InceptionResNetV2's 219 MB
    weights took 25 s to open that way, 1 s this way."""

    def __init__(self, path: str, start: int, size: int) -> None:
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._start, self._size, self._position = start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"seek to {base + offset}, before the start of the member")
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = max(0, min(len(view), self._size - self._position))
        if not wanted:
            return 0
        self._file.seek(self._start + self._position)
        count = self._file.readinto(view[:wanted]) or 0
        self._position += count
        return count

    def close(self) -> None:
        self._file.close()
        super().close()


def stored_member(path: str, info: zipfile.ZipInfo) -> StoredMember | None:
    """``info``'s bytes read in place when the member is stored whole (Keras writes its archives uncompressed);
    None where it is compressed or encrypted, or its local header does not check out (``ZipFile.open`` then
    reads it, and says what is wrong)."""
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        return None
    with open(path, "rb") as file:
        file.seek(info.header_offset)
        header = file.read(_LOCAL_HEADER.size)
        if len(header) < _LOCAL_HEADER.size:
            return None
        signature, name_length, extra_length = _LOCAL_HEADER.unpack(header)
        start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        if signature != b"PK\x03\x04" or start + info.file_size > os.fstat(file.fileno()).st_size:
            return None
    return StoredMember(path, start, info.file_size)


class _DamagedHeapError(RuntimeError):
    """A global heap collection HDF5 was about to parse would make it spin forever (raised from a read)."""


class HeapGuard(io.RawIOBase):
    """The HDF5 file as h5py reads it (its ``fileobj`` driver), checking each global heap collection read.

    Variable-length strings (Keras's ``name`` attributes) live in global heap
    collections (``GCOL``). HDF5 2.0 parses a collection by stepping from
    object to object by each object's declared size; a free-space object
    declaring 0 bytes makes that loop spin forever at 100% CPU (it never ends,
    and cannot be interrupted). HDF5 reads a collection whole before parsing
    it, so the read is where the collection is checked, in at most 65,537
    steps of 16 bytes or more.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self._inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._inner.seek(offset, whence)

    def tell(self) -> int:
        return self._inner.tell()

    def readinto(self, buffer: Any) -> int:
        start = self._inner.tell()
        count = self._inner.readinto(buffer)
        view = memoryview(buffer).cast("B")
        if count and count >= 16 and view[:4].tobytes() == b"GCOL":
            problem = global_heap_problem(view[:count])
            if problem:
                raise _DamagedHeapError(f"the global heap collection at byte {start} is damaged: {problem}")
        return count


def global_heap_problem(data: memoryview) -> str | None:
    """Why HDF5 could not parse this global heap collection in bounded steps; None when it can (or is not whole).

    Layout (HDF5 format spec, "Global Heap"): ``GCOL``, version, 3 reserved
    bytes, the collection size (8 bytes, as Keras's files use), then objects
    of a 16-byte header (index u16, refcount u16, reserved u32, size u64) and
    their data padded to 8 bytes. Index 0 is free space, whose size counts its
    header. HDF5's own writer never leaves an object reaching past the end, a
    free-space object smaller than a header, or over 65,535 objects.
    """
    size = int.from_bytes(data[8:16], "little")
    if size > len(data):
        return None  # HDF5 reads the whole declared size before parsing; that read is checked
    offset, steps = 16, 0
    while offset + 16 <= size:
        steps += 1
        index = int.from_bytes(data[offset : offset + 2], "little")
        declared = int.from_bytes(data[offset + 8 : offset + 16], "little")
        need = declared if index == 0 else 16 + (declared + 7) // 8 * 8
        if index == 0 and declared < 16:
            return f"its free-space object at byte {offset} of the collection declares {declared} bytes"
        if need > size - offset:
            return (
                f"object {index} at byte {offset} of the collection declares {declared} bytes, past the "
                f"collection's end ({size} bytes)"
            )
        if steps > 65_536:
            return "it lists more objects than an HDF5 global heap collection can hold"
        offset += need
    return None
