"""The checkpoint store's exceptions (defined in ``torchestimator.errors``, re-exported here).

``CheckpointError(ValueError)`` is raised when a checkpoint cannot be read or
found: a damaged or incomplete folder, a checksum mismatch, a format written
by a newer version, or a ``model_dir`` whose checkpoints are all damaged.
``DiskFullError(OSError)`` is raised when a write into ``model_dir`` finds no
room (errno ENOSPC, EDQUOT, or EFBIG from a file size limit, kept in
``errno``); it names the path, the step and the bytes needed. Mistakes in
what the caller passes (wrong types, bad settings) raise plain
``TypeError``/``ValueError``. ``is_no_room`` tells which OSError a full disk is.
"""

from __future__ import annotations

import errno as errno_codes

from torchestimator.errors import CheckpointError, DiskFullError

__all__ = ["CheckpointError", "DiskFullError", "is_no_room"]

NO_ROOM_ERRNOS = frozenset({errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EFBIG})


def is_no_room(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in NO_ROOM_ERRNOS
