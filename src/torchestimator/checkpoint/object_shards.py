"""Sharded (DCP) checkpoints of several processes in an object store: staged on each rank's local disk, uploaded
by the rank that wrote them, read back through a verified local copy.

torch.distributed.checkpoint writes and reads local folders (its fsspec writer deletes the old ``.metadata``
before renaming a new one into place, and fails on ``fileno``/``fsync`` for s3 and gcs paths). So with a
model_dir in a store, each rank lets DCP write into a local staging folder named after the save's prefix,
uploads the files it wrote (the chief also ``.metadata``) under that prefix, and reports their checksums;
the chief seals state.json over all of them and replaces the manifest (``store.py``), exactly as for a
one-process save: nothing in the prefix is a checkpoint before state.json, and no rename is needed.
A restore downloads the files state.json lists into a local folder, checking each against its sha256,
and DCP reads that folder.

Belongs here: the local folders and the transfers. Not here: the order of a save across ranks
(``sharded.py``), the commit (``store.py``).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from torchestimator._io import filesystems

from .errors import CheckpointError

__all__ = ["download_checkpoint", "local_staging", "remove_local_staging", "staging_path", "upload_shards"]

_PARALLEL_TRANSFERS = 4
"""Files of one rank moved at once: shards are independent objects, and one stream rarely fills a link."""
_CHUNK_BYTES = 8 * 2**20

_copies: list[str] = []  # local copies of restored checkpoints, removed at exit


def _scratch(kind: str, root: str, folder: str) -> str:
    digest = hashlib.sha256(root.encode()).hexdigest()[:16]  # one model_dir's files apart from another's
    return os.path.join(
        tempfile.gettempdir(), f"torchestimator-{kind}-{os.getuid() if hasattr(os, 'getuid') else 0}", digest, folder
    )


def staging_path(storage: Any, folder: str) -> str:
    """Where ``local_staging`` puts the save ``folder`` (nothing created)."""
    return _scratch("staging", storage.root, folder)


def local_staging(storage: Any, folder: str) -> str:
    """The local folder DCP writes the save ``folder`` into on this machine (emptied, created)."""
    path = _scratch("staging", storage.root, folder)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def remove_local_staging(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def upload_shards(storage: Any, folder: str, local_folder: str, names: Iterable[str]) -> None:
    """Puts this rank's files of ``local_folder`` under the save prefix ``folder``, several at once; each a whole
    object (a multipart upload for big ones) or none. Raises OSError naming the object that failed."""
    names = sorted(names)

    def put(name: str) -> None:
        url = f"{storage.location(folder)}/{name}"
        filesystems._store_call(
            url, "uploading", storage._fs.put_file, os.path.join(local_folder, name), storage._key(folder, name)
        )

    with concurrent.futures.ThreadPoolExecutor(min(_PARALLEL_TRANSFERS, max(1, len(names)))) as pool:
        for future in [pool.submit(put, name) for name in names]:
            future.result()


def download_checkpoint(storage: Any, folder: str, files: Mapping[str, Mapping[str, Any]]) -> str:
    """A local folder holding the files ``files`` lists (state.json's ``files``), each checked against its size
    and sha256 while it is written; removed when this process exits (or at the next download of the same one).

    Raises:
        CheckpointError: a file missing, of another size, or failing its checksum (naming its URL).
    """
    target = _scratch("restore", storage.root, f"{folder}-{os.getpid()}")  # replicas of one host: a copy each
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    if not _copies:
        atexit.register(_remove_copies)
    _copies.append(target)

    def get(name: str) -> None:
        url = f"{storage.location(folder)}/{name}"
        expected = files[name]
        digest, size = hashlib.sha256(), 0
        try:
            with storage.open_file(folder, name) as source, open(os.path.join(target, name), "wb") as sink:
                while chunk := source.read(_CHUNK_BYTES):
                    digest.update(chunk)
                    size += len(chunk)
                    sink.write(chunk)
        except FileNotFoundError:
            raise CheckpointError(f"{url} is missing although state.json lists it.") from None
        if size != expected["size"]:
            raise CheckpointError(
                f"{url} has {size} bytes; state.json expects {expected['size']} (truncated or overwritten)."
            )
        if digest.hexdigest() != expected["sha256"]:
            raise CheckpointError(
                f"{url} fails its checksum: sha256 is {digest.hexdigest()}, state.json expects "
                f"{expected['sha256']} (the file is corrupt)."
            )

    with concurrent.futures.ThreadPoolExecutor(min(_PARALLEL_TRANSFERS, max(1, len(files)))) as pool:
        for future in [pool.submit(get, name) for name in sorted(files)]:
            future.result()
    return target


def _remove_copies() -> None:
    for path in _copies:
        shutil.rmtree(path, ignore_errors=True)
