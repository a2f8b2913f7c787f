"""The checkpoint store's exception.

``CheckpointError(ValueError)`` is raised when a checkpoint cannot be read or
found: a damaged or incomplete folder, a checksum mismatch, a format written
by a newer version, or an empty ``model_dir``. Mistakes in what the caller
passes (wrong types, bad settings) raise plain ``TypeError``/``ValueError``.
"""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file and the fault."""
