"""Versioned export folders: integer names are versions, everything else (temp-*, notes) is ignored.

TensorFlow Serving's rule (a child folder counts only if its name parses as
an integer), shared by the exporter, the loader and the exporters' retention.
A base may also be an object-store URL (s3://, gs://, ...): there a version
counts only once its metadata.json is uploaded (the last file of a version,
_store_versions.py); a local base is listed with ``os`` as it always was.
"""

from __future__ import annotations

import os

from torchestimator._io import filesystems

__all__ = ["latest_version", "list_versions"]


def list_versions(export_dir_base: str | os.PathLike[str]) -> list[int]:
    """The integer version folders under a base, ascending; [] when there is none or no base.

    For a URL, the complete versions only; an unreachable store is an OSError naming the URL.
    """
    base = os.fspath(export_dir_base)
    if filesystems.is_url(base):
        from torchestimator.export import _store_versions

        return sorted(_store_versions.list_store_versions(base))
    base = filesystems.local_path(base)
    if not os.path.isdir(base):
        return []
    versions = []
    for entry in os.listdir(base):
        if entry.isascii() and entry.isdigit() and os.path.isdir(os.path.join(base, entry)):
            versions.append(int(entry))
    return sorted(versions)


def latest_version(export_dir_base: str | os.PathLike[str]) -> str | None:
    """The path (or URL) of the highest integer version folder, or None."""
    base = os.fspath(export_dir_base)
    versions = list_versions(base)
    if not versions:
        return None
    return version_path(base, versions[-1])


def version_path(base: str, version: int) -> str:
    """The folder (or URL) of ``version`` under ``base``."""
    if filesystems.is_url(base):
        from torchestimator.export import _store_versions

        name = _store_versions.list_store_versions(base).get(version, str(version))
        return f"{base.rstrip('/')}/{name}"
    base = filesystems.local_path(base)
    # Keep the folder's own spelling (leading zeros are legal, if odd).
    for entry in os.listdir(base):
        if entry.isascii() and entry.isdigit() and int(entry) == version:
            return os.path.join(base, entry)
    return os.path.join(base, str(version))
