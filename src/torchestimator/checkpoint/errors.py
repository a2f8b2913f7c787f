"""The checkpoint store's exceptions.

``CheckpointError(ValueError)`` is raised when a checkpoint cannot be read or
found: a damaged or incomplete folder, a checksum mismatch, a format written
by a newer version, or a ``model_dir`` whose checkpoints are all damaged.
``DiskFullError(OSError)`` is raised when a write into ``model_dir`` finds no
room (errno ENOSPC, EDQUOT, or EFBIG from a file size limit, kept in
``errno``); it names the path, the step and the bytes needed. Mistakes in
what the caller passes (wrong types, bad settings) raise plain
``TypeError``/``ValueError``.
"""

from __future__ import annotations

import errno as errno_codes

__all__ = ["CheckpointError", "DiskFullError", "is_no_room"]

NO_ROOM_ERRNOS = frozenset({errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EFBIG})
_WHAT = {errno_codes.ENOSPC: "disk full", errno_codes.EDQUOT: "disk quota exceeded",
         errno_codes.EFBIG: "file size limit reached (ulimit -f / RLIMIT_FSIZE)"}


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file and the fault."""


class DiskFullError(OSError):
    """No room to write into model_dir; ``errno`` is the original one (ENOSPC, EDQUOT or EFBIG)."""

    def __init__(self, cause: OSError, *, path: str, what: str, bytes_needed: int | None = None,
                 free_bytes: int | None = None, advice: str = "") -> None:
        message = f"{_WHAT.get(cause.errno, 'no room')}: could not write {what} to {path} ({cause.strerror})"
        if bytes_needed is not None:
            message += f"; it needs {bytes_needed:,} bytes"
            if free_bytes is not None and cause.errno != errno_codes.EFBIG:  # EFBIG: the disk has room
                message += f", {free_bytes:,} are free there"
        message += f". {advice}".rstrip()
        super().__init__(cause.errno, message, path)
        self.bytes_needed = bytes_needed

    def __str__(self) -> str:
        return f"[Errno {self.errno}] {self.strerror}"


def is_no_room(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in NO_ROOM_ERRNOS

