"""Versioned export folders: integer names are versions, everything else (temp-*, notes) is ignored.

TensorFlow Serving's rule (a child folder counts only if its name parses as
an integer), shared by the exporter, the loader and the exporters' retention.
"""

from __future__ import annotations

import os

__all__ = ["latest_version", "list_versions"]


def list_versions(export_dir_base: str | os.PathLike[str]) -> list[int]:
    """The integer version folders under a base, ascending; [] when there is none or no base."""
    base = os.fspath(export_dir_base)
    if not os.path.isdir(base):
        return []
    versions = []
    for entry in os.listdir(base):
        if entry.isascii() and entry.isdigit() and os.path.isdir(os.path.join(base, entry)):
            versions.append(int(entry))
    return sorted(versions)


def latest_version(export_dir_base: str | os.PathLike[str]) -> str | None:
    """The path of the highest integer version folder, or None."""
    base = os.fspath(export_dir_base)
    versions = list_versions(base)
    if not versions:
        return None
    return version_path(base, versions[-1])


def version_path(base: str, version: int) -> str:
    """The folder of ``version`` under ``base``."""
    # Keep the folder's own spelling (leading zeros are legal, if odd).
    for entry in os.listdir(base):
        if entry.isascii() and entry.isdigit() and int(entry) == version:
            return os.path.join(base, entry)
    return os.path.join(base, str(version))
