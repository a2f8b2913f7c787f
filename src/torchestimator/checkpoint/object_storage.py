"""``ObjectStorage``: the checkpoint ``Storage`` of a model_dir in an object store (s3://, gs://, az://, memory://).

An object store has no rename (S3's is copy + delete; GCS moves a folder object by object) and no
fsync, but it applies each PUT whole: an object is seen entirely or not at all. So this storage says
``atomic_rename = False`` and the store commits without renaming (``store.py``): every save is written
under a prefix no save used before (``ckpt-<step>.<writer>-<random>``), its ``state.json`` (the
checksums of every other file) last, then the model_dir's manifest is replaced by one PUT. A prefix
without a valid state.json is never a checkpoint; one whose writer is gone is removed as a leftover.

Big files go up as multipart uploads in parts of ``PART_BYTES``; a write that fails midway aborts its
upload, so no part of it becomes an object, and the error names the file's URL. On S3 the parts of one file
go up ``PARTS_IN_FLIGHT`` at a time (``_S3PartUpload``), each retried and bounded in time by the
filesystem's settings (``_io/filesystems.py``: timeouts, retries, the deadline of a stalled send); other
stores stream through their own writer (``fs.open(..., "wb")``), one part after the other. The files of one save
go up side by side, ``FILES_IN_FLIGHT`` at a time (state.json still last, after all of them).

S3 takes at most ``MAX_PARTS`` parts of 5 MiB to 5 GiB each: a file may hold ``MAX_PARTS * PART_BYTES``
bytes (625 GiB at the default 64 MiB, 48.8 GiB at the smallest part, 5 MiB); a bigger one fails at its
10,001st part, naming the file and the setting to raise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import os
import posixpath
import time
from collections.abc import Callable
from typing import Any, TypeVar

from torchestimator._io import filesystems

from .storage import MANIFEST_NAME, Chunks, FileContent, ReadStream

__all__ = ["FILES_IN_FLIGHT", "MAX_PARTS", "PARTS_IN_FLIGHT", "PART_BYTES", "ObjectStorage", "modified_time"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

MAX_PARTS = 10_000
"""S3's limit on the parts of one multipart upload."""

PART_BYTES = min(5 * 2**30, max(5 * 2**20, int(os.environ.get("TORCHESTIMATOR_UPLOAD_PART_BYTES", 64 * 2**20))))
"""Size of one part of a multipart upload: S3 takes 5 MiB to 5 GiB and at most 10,000 parts (so files up to
625 GiB at 64 MiB); bigger parts mean fewer requests, smaller ones less memory held per upload.
``TORCHESTIMATOR_UPLOAD_PART_BYTES`` sets it (5 MiB to 5 GiB)."""

PARTS_IN_FLIGHT = max(1, int(os.environ.get("TORCHESTIMATOR_UPLOAD_PARTS_IN_FLIGHT", 4)))
"""Parts of one file uploading at once on S3 (no more than the filesystem's ``max_concurrency``): an upload
holds up to ``(PARTS_IN_FLIGHT + 1) * PART_BYTES`` bytes (320 MiB by default).
``TORCHESTIMATOR_UPLOAD_PARTS_IN_FLIGHT`` sets it."""

FILES_IN_FLIGHT = max(1, int(os.environ.get("TORCHESTIMATOR_UPLOAD_FILES_IN_FLIGHT", 4)))
"""Files of one checkpoint uploading at once (the model's, the optimizer's, ...): each is an upload of its own, so
a save holds up to ``FILES_IN_FLIGHT * (PARTS_IN_FLIGHT + 1) * PART_BYTES`` bytes in buffers on S3 (a model and its
optimizer state: 640 MiB at the defaults). ``TORCHESTIMATOR_UPLOAD_FILES_IN_FLIGHT`` sets it; 1 sends one file after
the other."""


class ObjectStorage:
    """A ``model_dir`` in an object store, through its fsspec filesystem (``_io/filesystems.py``)."""

    atomic_rename = False
    """There is no atomic rename: the store writes each save under a fresh prefix instead of renaming."""

    files_in_flight = FILES_IN_FLIGHT
    """The files of one save the store sends side by side (``CheckpointStore._write_contents``)."""

    def __init__(self, url: str) -> None:
        if not filesystems.is_url(url):
            raise ValueError(f"{url} is not an object-store URL.")
        self.root = url.rstrip("/")
        self._fs, self._prefix = filesystems.filesystem(self.root)
        self._prefix = self._prefix.rstrip("/")

    def __repr__(self) -> str:
        return f"ObjectStorage({self.root!r})"

    def location(self, folder: str) -> str:
        return f"{self.root}/{folder}"

    def _key(self, *parts: str) -> str:
        return posixpath.join(self._prefix, *parts)

    def _call(self, doing: str, where: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return filesystems._store_call(where, doing, call, *args, **kwargs)

    def write_file(self, folder: str, filename: str, data: FileContent) -> None:
        url = f"{self.location(folder)}/{filename}"
        if isinstance(data, (bytes, bytearray, memoryview)):
            self._call("writing", url, self._fs.pipe_file, self._key(folder, filename), bytes(data))
            return
        if hasattr(self._fs, "_call_s3"):  # s3fs: its client takes the parts of one file in parallel
            handle: Any = _S3PartUpload(self._fs, self._key(folder, filename), url)
        else:
            handle = self._call("writing", url, self._fs.open, self._key(folder, filename), "wb", block_size=PART_BYTES)
        chunks: Chunks = data  # buffers: bytes were written whole above
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                if view.nbytes:
                    self._call("writing", url, handle.write, view)
            self._call("writing", url, handle.close)
        except BaseException:
            _discard(handle, url)  # an aborted multipart upload leaves no object
            raise

    def open_file(self, folder: str, filename: str) -> ReadStream:
        url = f"{self.location(folder)}/{filename}"
        stream = self._call("reading", url, self._fs.open, self._key(folder, filename), "rb", block_size=PART_BYTES)
        return _NamingErrors(stream, url)

    def read_file(self, folder: str, filename: str, start: int = 0, length: int | None = None) -> bytes:
        url = f"{self.location(folder)}/{filename}"
        end = None if length is None else start + length
        data: bytes
        if start == 0 and end is None:
            data = self._call("reading", url, self._fs.cat_file, self._key(folder, filename))
        else:
            data = self._call("reading", url, self._fs.cat_file, self._key(folder, filename), start=start, end=end)
        return data

    def list_folders(self) -> list[str]:
        """The prefixes under model_dir: one LIST request (paged by the store per 1000 names)."""
        try:
            self._fs.invalidate_cache(self._prefix)  # adlfs ignores refresh=; every fsspec store honours this
            entries = self._fs.ls(self._prefix, detail=True, refresh=True)
        except FileNotFoundError:
            return []  # nothing was ever saved there
        except Exception as error:
            raise filesystems._named(error, self.root, "listing") from error
        return sorted(
            posixpath.basename(entry["name"].rstrip("/")) for entry in entries if entry.get("type") == "directory"
        )

    def folder_age_seconds(self, folder: str) -> float | None:
        """Seconds since the newest object under ``folder`` was written; None when it holds none or the store
        does not say. How a leftover of a writer on another machine is told from a save in progress."""
        try:
            details = self._fs.find(self._key(folder), detail=True)
        except FileNotFoundError:
            return None
        except Exception as error:
            raise filesystems._named(error, self.location(folder), "listing") from error
        newest = None
        for info in details.values():
            stamp = modified_time(info)
            if stamp is not None:
                newest = stamp if newest is None else max(newest, stamp)
        return None if newest is None else max(0.0, time.time() - newest)

    def rename_folder(self, source: str, target: str) -> None:
        raise OSError(
            f"{self.root} is an object store: it has no atomic rename, and the checkpoint store "
            f"does not rename there (asked to rename {source} to {target})."
        )

    def delete_folder(self, folder: str) -> None:
        """Remove a folder's objects, its ``state.json`` first: a deletion cut short leaves no checkpoint that
        is listed and fails, only objects the next start-up clears."""
        from . import format as checkpoint_format

        state = self._key(folder, checkpoint_format.STATE_FILE)
        try:
            self._fs.rm_file(state)
        except FileNotFoundError:
            pass
        except Exception as error:
            raise filesystems._named(error, self.location(folder), "deleting") from error
        try:
            self._fs.rm(self._key(folder) + "/", recursive=True)
        except FileNotFoundError:
            pass
        except Exception as error:
            raise filesystems._named(error, self.location(folder), "deleting") from error
        self._fs.invalidate_cache(self._key(folder))

    def read_manifest(self) -> bytes | None:
        try:
            manifest: bytes = self._fs.cat_file(self._key(MANIFEST_NAME))
            return manifest
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return b""
        except Exception as error:
            raise filesystems._named(error, f"{self.root}/{MANIFEST_NAME}", "reading") from error

    def replace_manifest(self, data: bytes) -> None:
        """One PUT: readers see the old manifest or the new one, never a mix."""
        self._call("writing", f"{self.root}/{MANIFEST_NAME}", self._fs.pipe_file, self._key(MANIFEST_NAME), bytes(data))

    def remove_stale_temporaries(self) -> list[str]:
        return []  # no temporary files: a PUT is whole or absent

    def free_bytes(self) -> int | None:
        return None


class _NamingErrors:
    """A store's read stream whose failures (the object deleted or replaced under the reader, a body cut short
    after the backend's retries, a timeout) are OSErrors naming the file's URL, as every other operation's."""

    def __init__(self, stream: Any, url: str) -> None:
        self._stream, self._url = stream, url

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __enter__(self) -> _NamingErrors:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stream.close()

    def read(self, size: int = -1) -> bytes:
        data: bytes = filesystems._store_call(self._url, "reading", self._stream.read, size)
        return data

    def readinto(self, buffer: Any) -> int:
        count: int = filesystems._store_call(self._url, "reading", self._stream.readinto, buffer)
        return count

    def seek(self, offset: int, whence: int = 0) -> int:
        position: int = filesystems._store_call(self._url, "reading", self._stream.seek, offset, whence)
        return position


class _S3PartUpload:
    """One file written to S3 as a multipart upload, ``PARTS_IN_FLIGHT`` parts at a time on s3fs's event loop.

    A file smaller than one part is one PUT at ``close``. ``discard`` cancels the parts in flight and aborts the
    upload: S3 then drops every part, and no object appears.
    """

    def __init__(self, fs: Any, key: str, url: str) -> None:
        self._fs, self._url = fs, url
        self._bucket, self._key, _ = fs.split_path(key)
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._in_flight: list[tuple[int, Any]] = []
        self._parts: list[dict[str, Any]] = []
        self._next_part = 1
        self._parallel = max(1, min(PARTS_IN_FLIGHT, getattr(fs, "max_concurrency", 1)))

    def write(self, view: memoryview) -> None:
        while view.nbytes:
            room = PART_BYTES - len(self._buffer)
            self._buffer += view[:room]
            view = view[room:]
            if len(self._buffer) == PART_BYTES:
                part, self._buffer = bytes(self._buffer), bytearray()
                self._send(part)

    def close(self) -> None:
        if self._upload_id is None:
            self._fs.call_s3("put_object", Bucket=self._bucket, Key=self._key, Body=bytes(self._buffer))
        else:
            if self._buffer:
                self._send(bytes(self._buffer))
            while self._in_flight:
                self._collect_oldest()
            self._fs.call_s3(
                "complete_multipart_upload",
                Bucket=self._bucket,
                Key=self._key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )
            self._upload_id = None
        self._buffer = bytearray()
        self._fs.invalidate_cache(f"{self._bucket}/{self._key}")

    def discard(self) -> None:
        for _, future in self._in_flight:
            future.cancel()
        if self._in_flight:
            concurrent.futures.wait([future for _, future in self._in_flight], timeout=30)
        self._in_flight.clear()
        self._buffer = bytearray()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            self._fs.call_s3("abort_multipart_upload", Bucket=self._bucket, Key=self._key, UploadId=upload_id)

    def _send(self, part: bytes) -> None:
        if self._next_part > MAX_PARTS:
            raise OSError(
                errno.EFBIG,
                f"more than {MAX_PARTS} parts of {PART_BYTES} bytes, S3's limit for one "
                "object; set TORCHESTIMATOR_UPLOAD_PART_BYTES higher (up to 5 GiB)",
                self._url,
            )
        if self._upload_id is None:
            created = self._fs.call_s3("create_multipart_upload", Bucket=self._bucket, Key=self._key)
            self._upload_id = created["UploadId"]
        while len(self._in_flight) >= self._parallel:
            self._collect_oldest()
        coroutine = self._fs._call_s3(
            "upload_part",
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._upload_id,
            PartNumber=self._next_part,
            Body=part,
        )
        self._in_flight.append((self._next_part, asyncio.run_coroutine_threadsafe(coroutine, self._fs.loop)))
        self._next_part += 1

    def _collect_oldest(self) -> None:
        number, future = self._in_flight[0]
        answer = future.result()  # bounded: each request has its timeouts and retries (_io/filesystems.py)
        self._in_flight.pop(0)
        self._parts.append({"PartNumber": number, "ETag": answer["ETag"]})


def _discard(handle: Any, url: str) -> None:
    discard = getattr(handle, "discard", None)  # ours, s3fs, gcsfs, adlfs: abort the upload without committing it
    try:
        if discard is not None:
            discard()
        else:  # memory:// and other simple writers keep nothing until close
            handle.closed = True
    except Exception as error:  # the object was not written either way; its parts may stay until a lifecycle rule
        logger.warning(
            "Could not abort the unfinished upload of %s (%s): its parts stay in the bucket, uncommitted, "
            "until the bucket's lifecycle rule for incomplete multipart uploads removes them.",
            url,
            filesystems._cause(error),
        )


def modified_time(info: dict[str, Any]) -> float | None:
    """An object's time of writing (seconds since the epoch) from an fsspec ``info``/``find`` entry of any store."""
    for key in ("LastModified", "last_modified", "updated", "mtime", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            from datetime import datetime

            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None
