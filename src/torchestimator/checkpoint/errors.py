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

from torchestimator.errors import NO_ROOM_ERRNOS, CheckpointError, DiskFullError, is_no_room

__all__ = ["NO_ROOM_ERRNOS", "CheckpointError", "DiskFullError", "is_no_room"]
