"""Durable, atomic file writes shared by the checkpoint store, exports and the best-model records.

A reader never sees half a file: write a temporary file next to the target,
fsync it, rename it over the target, fsync the folder.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def fsync_directory(path: str) -> None:
    """Makes renames and new entries in `path` durable; a no-op where a folder cannot be opened (Windows)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_bytes_atomically(path: str, data: bytes) -> None:
    """Replaces `path` with `data` so that readers see the old file or the new one, never a mix."""
    folder = os.path.dirname(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    fsync_directory(folder)


def write_json_atomically(path: str, payload: Any, *, indent: int = 2) -> None:
    write_bytes_atomically(path, json.dumps(payload, indent=indent, sort_keys=True).encode("utf-8"))
