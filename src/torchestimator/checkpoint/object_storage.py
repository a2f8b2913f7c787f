"""``ObjectStorage``: the checkpoint ``Storage`` of a model_dir in an object store (s3://, gs://, az://, memory://).

An object store has no rename (S3's is copy + delete; GCS moves a folder object by object) and no
fsync, but it applies each PUT whole: an object is seen entirely or not at all. So this storage says
``atomic_rename = False`` and the store commits without renaming (``store.py``): every save is written
under a prefix no save used before (``ckpt-<step>.<writer>-<random>``), its ``state.json`` (the
checksums of every other file) last, then the model_dir's manifest is replaced by one PUT. A prefix
without a valid state.json is never a checkpoint; one whose writer is gone is removed as a leftover.

Big files go up as multipart uploads (the backend's, in parts of ``PART_BYTES``); a write that fails
midway aborts its upload, so no part of it becomes an object.
"""

from __future__ import annotations

import logging
import os
import posixpath
import time
from typing import Any, BinaryIO

from torchestimator._io import filesystems

from .storage import MANIFEST_NAME, FileContent

__all__ = ["ObjectStorage", "PART_BYTES"]

logger = logging.getLogger(__name__)

PART_BYTES = max(5 * 2**20, int(os.environ.get("TORCHESTIMATOR_UPLOAD_PART_BYTES", 64 * 2**20)))
"""Size of one part of a multipart upload: S3 takes 5 MiB to 5 GiB and at most 10,000 parts (so files up to
640 GiB at 64 MiB); bigger parts mean fewer requests, smaller ones less memory held per upload.
``TORCHESTIMATOR_UPLOAD_PART_BYTES`` sets it (5 MiB at least)."""


class ObjectStorage:
    """A ``model_dir`` in an object store, through its fsspec filesystem (``_io/filesystems.py``)."""

    atomic_rename = False
    """There is no atomic rename: the store writes each save under a fresh prefix instead of renaming."""

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

    def _call(self, doing: str, where: str, call, *args, **kwargs):
        return filesystems._store_call(where, doing, call, *args, **kwargs)

    def write_file(self, folder: str, filename: str, data: FileContent) -> None:
        url = f"{self.location(folder)}/{filename}"
        if isinstance(data, (bytes, bytearray, memoryview)):
            self._call("writing", url, self._fs.pipe_file, self._key(folder, filename), bytes(data))
            return
        handle = self._call("writing", url, self._fs.open, self._key(folder, filename), "wb", block_size=PART_BYTES)
        try:
            for chunk in data:
                view = memoryview(chunk).cast("B")
                if view.nbytes:
                    handle.write(view)
        except BaseException:
            _discard(handle)  # an aborted multipart upload leaves no object
            raise
        self._call("writing", url, handle.close)

    def open_file(self, folder: str, filename: str) -> BinaryIO:
        url = f"{self.location(folder)}/{filename}"
        return self._call("reading", url, self._fs.open, self._key(folder, filename), "rb", block_size=PART_BYTES)

    def read_file(self, folder: str, filename: str, start: int = 0, length: int | None = None) -> bytes:
        url = f"{self.location(folder)}/{filename}"
        end = None if length is None else start + length
        if start == 0 and end is None:
            return self._call("reading", url, self._fs.cat_file, self._key(folder, filename))
        return self._call("reading", url, self._fs.cat_file, self._key(folder, filename), start=start, end=end)

    def list_folders(self) -> list[str]:
        """The prefixes under model_dir: one LIST request (paged by the store per 1000 names)."""
        try:
            entries = self._fs.ls(self._prefix, detail=True, refresh=True)
        except FileNotFoundError:
            return []  # nothing was ever saved there
        except Exception as error:
            raise filesystems._named(error, self.root, "listing") from error
        return sorted(posixpath.basename(entry["name"].rstrip("/")) for entry in entries
                      if entry.get("type") == "directory")

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
            stamp = _modified(info)
            if stamp is not None:
                newest = stamp if newest is None else max(newest, stamp)
        return None if newest is None else max(0.0, time.time() - newest)

    def rename_folder(self, source: str, target: str) -> None:
        raise OSError(f"{self.root} is an object store: it has no atomic rename, and the checkpoint store "
                      f"does not rename there (asked to rename {source} to {target}).")

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
            return self._fs.cat_file(self._key(MANIFEST_NAME))
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return b""
        except Exception as error:
            raise filesystems._named(error, f"{self.root}/{MANIFEST_NAME}", "reading") from error

    def replace_manifest(self, data: bytes) -> None:
        """One PUT: readers see the old manifest or the new one, never a mix."""
        self._call("writing", f"{self.root}/{MANIFEST_NAME}", self._fs.pipe_file, self._key(MANIFEST_NAME),
                   bytes(data))

    def remove_stale_temporaries(self) -> list[str]:
        return []  # no temporary files: a PUT is whole or absent

    def free_bytes(self) -> int | None:
        return None


def _discard(handle: Any) -> None:
    discard = getattr(handle, "discard", None)  # s3fs, gcsfs, adlfs: abort the upload without committing it
    try:
        if discard is not None:
            discard()
        else:  # memory:// and other simple writers keep nothing until close
            handle.closed = True
    except Exception as error:  # the upload is abandoned either way; the store expires unfinished ones
        logger.debug("Could not abort an upload: %s", error)


def _modified(info: dict[str, Any]) -> float | None:
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
