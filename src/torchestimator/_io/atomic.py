"""Durable, atomic file writes: the one implementation the checkpoint store's ``LocalStorage``, exports,
the run's settings and the best-model records all call.

A reader never sees half a file: write a temporary file next to the target,
fsync it, rename it over the target, fsync the folder (``write_bytes_atomically``).
A checkpoint folder is published the same way, one level up: its files are
written and fsynced in a staging folder (``write_durably``), which is then
renamed whole (``rename_durably``).

Temporary names carry the writer's pid and host (``.<name>.tmp-<pid>-h<host>-<random>``,
``writer_tag``), so that what a killed writer left behind can be told from what
a live one is writing: ``remove_stale_temporaries`` removes only the former. A
name written on another host (a model_dir on a shared filesystem) is left alone:
whether its writer lives cannot be seen from here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import socket
from typing import Any

logger = logging.getLogger(__name__)

# Who writes a temporary name: "<pid>-h<host>", the host as 8 hex digits of its name's sha1.
_HOST = hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]
WRITER_PATTERN = r"(?P<pid>\d+)(?:-h(?P<host>[0-9a-f]{8}))?"
# .<target>.tmp-<writer>-<random> (this module); the older .<target>.tmp-<pid>[-<random>] (the manifest's
# former name) and .write-probe-<pid> (the estimator's former write probe) have no host part.
_TEMPORARY_FILE = re.compile(rf"\..+\.tmp-{WRITER_PATTERN}(?:-[A-Za-z0-9_]+)?|\.write-probe-(?P<probe_pid>\d+)")


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


def writer_tag() -> str:
    """``<pid>-h<host>``: this process, as temporary names carry it (``WRITER_PATTERN`` reads it back)."""
    return f"{os.getpid()}-h{_HOST}"


def temporary_prefix(target_name: str) -> str:
    """The start of a temporary name for `target_name` written by this process."""
    return f".{target_name}.tmp-{writer_tag()}-"


def write_durably(path: str, data: bytes | bytearray | memoryview, *, exclusive: bool = False) -> None:
    """Writes `data` to `path` and fsyncs it: the bytes are on disk when this returns.

    Not atomic by itself: `write_bytes_atomically` writes a temporary name with it, and a checkpoint's
    files are written with it into a staging folder that is renamed whole (`rename_durably`).
    `exclusive`: fail if `path` exists (a temporary name is never reused).
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    # Not mkstemp: its 0600 mode would make the file unreadable to others; 0666 & ~umask as for open().
    descriptor = os.open(path, flags, 0o666)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def rename_durably(source: str, target: str) -> None:
    """Renames `source` (a file, or a folder whose entries are first made durable) over `target`, then makes
    the rename itself durable by fsyncing the folder that holds `target`."""
    if os.path.isdir(source):
        fsync_directory(source)  # a folder's entries must be on disk before the rename makes it visible
    os.replace(source, target)
    fsync_directory(os.path.dirname(os.path.abspath(target)))


def write_bytes_atomically(path: str, data: bytes) -> None:
    """Replaces `path` with `data` so that readers see the old file or the new one, never a mix."""
    folder = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(folder, temporary_prefix(os.path.basename(path)) + secrets.token_hex(4))
    try:
        write_durably(temporary, data, exclusive=True)
        rename_durably(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        if isinstance(error, OSError) and error.filename in (None, temporary):
            raise _naming(error, path) from error  # a failed write() names no file, a failed open the temporary
        raise


def _naming(error: OSError, path: str) -> OSError:
    """The same error (errno, so the same OSError subclass) naming `path`, the file being replaced."""
    if error.filename is not None and error.filename != path and error.errno is not None:
        return OSError(error.errno, f"{error.strerror} (while replacing {path})", error.filename)
    return OSError(error.errno, error.strerror, path) if error.errno is not None else error


def write_json_atomically(path: str, payload: Any, *, indent: int = 2) -> None:
    """A JSON document written whole: atomically on a file system; one PUT for a URL (``filesystems``)."""
    data = json.dumps(payload, indent=indent, sort_keys=True).encode("utf-8")
    from torchestimator._io import filesystems

    if filesystems.is_url(path):
        filesystems.write_bytes(path, data)
    else:
        write_bytes_atomically(filesystems.local_path(path), data)


def writer_is_gone(pid: int, host: str | None = None) -> bool:
    """True when `pid` is no live process other than this one (this process's own leftovers are stale at start-up).

    A zombie counts as gone: it writes nothing more. A pid of another user's
    live process (PermissionError) counts as alive, and so does any pid of
    another host (`host` from the name differs from this one's).
    """
    if host is not None and host != _HOST:
        return False
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def remove_stale_temporaries(folder: str) -> list[str]:
    """Removes the temporary files of dead writers in `folder` (names of this module's form only); returns them."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for name in sorted(names):
        match = _TEMPORARY_FILE.fullmatch(name)
        path = os.path.join(folder, name)
        if match is None or not os.path.isfile(path) or os.path.islink(path):
            continue
        if writer_is_gone(int(match.group("pid") or match.group("probe_pid")), match.group("host")):
            try:
                os.remove(path)
            except FileNotFoundError:
                continue
            logger.info("Removed %s, left behind by an interrupted write.", path)
            removed.append(path)
    return removed
