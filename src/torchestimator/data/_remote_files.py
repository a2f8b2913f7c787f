"""TFRecord files in object stores: the byte streams `tfrecord.py` reads from a URL, read ahead in large ranges.

What belongs here: opening an object (``s3://``, ``gs://``, ``az://``, ``memory://``) as the unbuffered
binary stream the record scanners read (`RemoteFile`: ``read``/``readinto``/``seek``/``tell``/``size``),
fetching the bytes ahead of the reader in large ranged GETs on background threads while the records of
the previous range are parsed; expanding URL globs into objects; the few whole-object reads the dataset
does on a URL (the 4 KiB ends that identify a file, the head that tells its compression); writing a
TFRecord object. What does not: the record format (`tfrecord.py`, `_tfrecord_scan.py`), the filesystem
behind a URL, its options and credentials (`_io/filesystems.py`). Local paths never come here: they are
read with ``open`` as before, by the compiled scanner straight into its buffer.

Reading. A read fetches what it asks for, and when it is a large one (the scanners read 1 MiB blocks) or
continues where the last one stopped, the reading is taken to be sequential: from then on `READ_AHEAD`
ranges of `CHUNK_SIZE` bytes are in flight at once (two ranged GETs of 16 MiB over two connections), each
replaced as soon as the reader has used the one before (a resume's re-reads of buffered records open objects with
``read_ahead=0``: one ranged GET each). Every open file has its own fetch threads, so the files of an
interleave are fetched in parallel. Fetches go through the backend's file object: on S3 each ranged GET
carries ``If-Match`` with the ETag seen at open, so an object replaced under a reader is noticed, not
spliced; elsewhere (GCS, Azure, memory) a replacement is noticed only when it made the object shorter
(a position's resume checks every file's identity either way).

Errors name the URL: a missing object or bucket at open is FileNotFoundError (from the layer below);
an object deleted while it is read is a FileNotFoundError, one replaced an OSError with errno ESTALE,
both naming it and marked (`object_changed`) so that the record scanners let them through rather than
calling them damaged data, and ``skip_corrupt`` does not skip them); any other failed fetch is an OSError naming the URL
and the byte range, which the scanners turn into "unreadable record at N in URL" as for a local EIO.
"""

from __future__ import annotations

import errno
import fnmatch
import io
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torchestimator._io import filesystems

__all__ = [
    "CHUNK_SIZE",
    "READ_AHEAD",
    "STREAMING_READ",
    "RemoteFile",
    "discard_writing",
    "expand",
    "object_changed",
    "open_for_writing",
    "read_range",
    "remote_size",
]

CHUNK_SIZE = 16 << 20
"""Bytes per ranged GET once reading is sequential: large enough that a request's latency is a small part
of its transfer time (about 160 ms at 100 MB/s per connection against a first byte in 10-50 ms; fewer,
larger requests also measured faster on moto's server, `benchmarks/object_storage.py`)."""
READ_AHEAD = 2
"""Ranged GETs in flight per open file: the reader parses one range while the next ones arrive. Memory: up
to (1 + READ_AHEAD) x CHUNK_SIZE = 48 MiB per open file (an interleave holds cycle_length files open)."""
STREAMING_READ = 256 << 10
"""A read this large (the scanners read 1 MiB blocks, the inflater 256 KiB) starts read-ahead at once; a
smaller one (a look at a file's first 12 bytes) only when the next read continues it."""


_CHANGED_MARK = "torchestimator_object_changed"


def _changed(error: OSError) -> OSError:
    setattr(error, _CHANGED_MARK, True)
    return error


def object_changed(error: BaseException) -> bool:
    """Whether `error` says an object was deleted (FileNotFoundError) or replaced (OSError, errno ESTALE)
    while it was being read: not damaged data, so the scanners pass it through instead of reporting a
    "corrupted record" and ``skip_corrupt`` does not skip it. Builtin kinds with a mark rather than a class
    of ours: the public error tree lives in errors.py."""
    return getattr(error, _CHANGED_MARK, False)


def _filesystem(url: str) -> tuple[Any, str]:
    """`filesystems.filesystem`, made again in a forked child (a DataLoader worker): an async filesystem
    made in the parent holds the parent's event loop and refuses to run in the child."""
    fs, inner = filesystems.filesystem(url)
    if getattr(fs, "_pid", os.getpid()) != os.getpid():
        import fsspec

        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        fresh = fsspec.filesystem(protocol, **fs.storage_options)  # fsspec's cache is per process: a fresh one here
        if "retries" in vars(fs):  # set on the instance by filesystems (s3fs's rounds of retries)
            fresh.retries = fs.retries
        fs = fresh
    return fs, inner


def expand(pattern: str) -> list[str]:
    """The objects a URL names: itself, or a glob's matches sorted (folders left out); full URLs.

    FileNotFoundError naming the URL when nothing matches or the object is missing; ValueError for a
    prefix with objects under it (a folder), as `list_files` says of a local directory.
    """
    fs, inner = _filesystem(pattern)
    scheme = pattern.split("://", 1)[0]
    if not any(character in inner for character in "*?["):
        info = _info_or_none(fs, inner, pattern)
        if info is None:
            raise FileNotFoundError(
                errno.ENOENT, f"TFRecord file {pattern!r} does not exist (no such object, or no such bucket).", pattern
            )
        if info.get("type") == "directory":
            raise ValueError(
                f"{pattern!r} is a folder (a prefix with objects under it); pass the files in it, "
                f"e.g. {pattern.rstrip('/') + '/*.tfrecord'!r}."
            )
        return [pattern]
    found = filesystems._store_call(pattern, "listing", fs.glob, inner, detail=True)
    # memory:// keeps paths as "/bucket/key": the URLs keep the pattern's own form
    cut = 1 if inner.startswith("/") and not pattern.split("://", 1)[1].startswith("/") else 0
    matches = sorted(
        f"{scheme}://{name[cut:]}"
        for name, info in found.items()
        if info.get("type") != "directory" and fnmatch.fnmatchcase(name, inner)
    )
    if not matches:
        raise FileNotFoundError(
            errno.ENOENT,
            f"No objects matched pattern {pattern!r}. Check the bucket, the "
            f"prefix and the pattern (globs use *, ? and [...]).",
            pattern,
        )
    return matches


def _info_or_none(fs: Any, inner: str, url: str) -> dict[str, Any] | None:
    try:
        return fs.info(inner)
    except FileNotFoundError:
        return None
    except Exception as error:  # a backend's own error type (botocore, google.auth): named
        raise filesystems._named(error, url, "looking for") from error


def remote_size(url: str) -> int:
    """The object's size in bytes (FileNotFoundError naming it when missing)."""
    fs, inner = _filesystem(url)
    return int(filesystems._store_call(url, "looking at", fs.size, inner))


def read_range(url: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of an object (fewer at its end), one ranged GET; errors name the URL."""
    fs, inner = _filesystem(url)
    if end <= start:
        return b""
    return bytes(filesystems._store_call(url, "reading", fs.cat_file, inner, start=start, end=end))


def open_for_writing(url: str) -> Any:
    """A binary file for writing an object: uploaded in parts as it grows, published whole at ``close``
    (readers never see part of it); ``discard()`` drops it instead."""
    fs, inner = _filesystem(url)
    return filesystems._store_call(url, "opening for writing", fs.open, inner, "wb")


def discard_writing(handle: Any, url: str) -> None:
    """Drops what `open_for_writing` gave: the upload is aborted and nothing is published."""
    from fsspec.spec import AbstractBufferedFile

    if isinstance(handle, AbstractBufferedFile):
        handle.discard()  # S3: the multipart upload aborted; GCS: the resumable upload cancelled
        handle.closed = True  # close() would publish what was buffered
    else:  # memory:// publishes at open: take it back
        filesystems.remove(url)


class RemoteFile(io.RawIOBase):
    """An object read front to back as an unbuffered binary stream, with read-ahead (module docstring)."""

    def __init__(self, url: str, *, chunk_size: int | None = None, read_ahead: int | None = None) -> None:
        super().__init__()
        fs, inner = _filesystem(url)
        self.url = url
        self._chunk_size = max(CHUNK_SIZE if chunk_size is None else chunk_size, 1)
        self._read_ahead = max(READ_AHEAD if read_ahead is None else read_ahead, 0)
        handle = filesystems._store_call(
            url, "opening", fs.open, inner, "rb", cache_type="none", block_size=self._chunk_size
        )
        size = getattr(handle, "size", None)
        self.size: int = int(size if size is not None else filesystems._store_call(url, "looking at", fs.size, inner))
        """The object's size in bytes, as seen at open."""
        fetch = getattr(handle, "_fetch_range", None)  # S3File/GCSFile/AzureBlobFile: the checked GET
        self._handle = handle
        self._fetch_range = (
            fetch if fetch is not None else (lambda start, end: fs.cat_file(inner, start=start, end=end))
        )
        self._position = 0
        self._data = b""  # bytes fetched from _data_start on; the reader is somewhere inside
        self._data_start = 0
        self._sequential_at = -1  # where a read must start to count as sequential (the end of the last one)
        self._pending: deque[tuple[int, int, Future[bytes]]] = deque()  # (start, end, fetch), in order
        self._next_fetch = 0  # where the next read-ahead range starts
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ the stream

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        self._position = max(base + offset, 0)
        return self._position

    def readinto(self, buffer: Any) -> int:
        """Fills `buffer` from the fetched ranges: one copy (the scanners read 1 MiB blocks this way)."""
        view = memoryview(buffer).cast("B")
        filled = 0
        for piece in self._pieces(len(view)):
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        return filled

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self.size - self._position
        return b"".join(self._pieces(size))

    def _pieces(self, size: int) -> Iterator[memoryview]:
        """The next `size` bytes (fewer at the end) as views of the fetched ranges, moving the position past them."""
        if self.closed:
            raise ValueError(f"I/O operation on the closed reader of {self.url}.")
        position = self._position
        end = min(position + size, self.size)
        sequential = position == self._sequential_at or size >= STREAMING_READ
        while position < end:
            offset = position - self._data_start
            if not 0 <= offset < len(self._data):
                self._move_to(position, end - position, sequential)
                offset = position - self._data_start
            piece = memoryview(self._data)[offset : offset + end - position]
            position += len(piece)
            self._position = self._sequential_at = position
            sequential = True  # the rest of a read that spans ranges
            yield piece

    def start_reading(self) -> None:
        """Starts fetching the ranges from the current position now, before the first read (a file opened
        ahead of its turn: its first records are there when the reader gets to it)."""
        if self._read_ahead and not self._pending:
            self._next_fetch = self._position
            self._schedule()

    def close(self) -> None:
        if self.closed:
            return
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        self._pending.clear()
        self._data = b""
        try:
            self._handle.close()
        finally:
            super().close()

    # ------------------------------------------------------------------ fetching

    def _move_to(self, position: int, size: int, sequential: bool) -> None:
        """Makes `_data` hold `position`: the read-ahead range holding it, or (after a jump) ranges fetched
        from there when the reading is sequential, else `size` bytes fetched now."""
        pending = self._pending
        while pending and pending[0][1] <= position:  # ranges the reader skipped past
            pending.popleft()
        if not (pending and pending[0][0] <= position):
            pending.clear()  # a jump: what was fetched ahead is for elsewhere
            self._next_fetch = position
            if not (sequential and self._read_ahead):
                end = min(position + size, self.size)
                self._data, self._data_start = self._fetch(position, end), position
                self._next_fetch = end
                return
            self._schedule()  # the first range is waited for just below, the next ones arrive meanwhile
        start, _, future = pending.popleft()
        self._data, self._data_start = future.result(), start
        if sequential and self._read_ahead:
            self._schedule()

    def _schedule(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self._read_ahead, thread_name_prefix="torchestimator-read-ahead"
            )
        while len(self._pending) < self._read_ahead and self._next_fetch < self.size:
            start, end = self._next_fetch, min(self._next_fetch + self._chunk_size, self.size)
            self._pending.append((start, end, self._executor.submit(self._fetch, start, end)))
            self._next_fetch = end

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes [start, end): all of them (the object is at least `size` bytes long) or an error naming the URL."""
        try:
            data = self._fetch_range(start, end)
        except FileNotFoundError as error:
            raise _changed(
                FileNotFoundError(
                    errno.ENOENT,
                    f"{self.url} was deleted while it was being read (bytes "
                    f"{start}-{end} of {self.size}): {filesystems._cause(error)}",
                    self.url,
                )
            ) from error
        except Exception as error:
            if type(error).__name__ == "FileExpired":  # s3fs: the ETag the GET was bound to (If-Match) is gone
                raise self._replaced(start, end, error) from error
            raise filesystems._named(error, self.url, f"reading bytes {start}-{end} of") from error
        if len(data) != end - start:
            raise self._replaced(start, end, None)
        return data if isinstance(data, bytes) else bytes(data)

    def _replaced(self, start: int, end: int, error: BaseException | None) -> OSError:
        why = (
            f": {filesystems._cause(error).rstrip('.')}"
            if error is not None
            else (f": the object no longer holds the {self.size} bytes it had when the reader opened it")
        )
        return _changed(
            OSError(
                errno.ESTALE,
                f"{self.url} was replaced while it was being read (bytes "
                f"{start}-{end}){why}. Read it again from the start.",
                self.url,
            )
        )
