"""Weights at a URL (s3://, gs://, az://, memory://): our checkpoints read in place, other formats from a local copy.

Our model_dirs and ``ckpt-<step>`` folders are read through the checkpoint store, which reads object
stores itself. The other formats' readers (TensorFlow's bundle, HDF5, safetensors' and torch's mapped
files) need local files, so the file (a TensorFlow prefix: its ``.index`` and ``.data-*`` files; a
TensorFlow model_dir: its ``checkpoint`` file and the prefix it names) is copied into a temporary
folder that lives until the process exits, and opened there; errors still name the URL.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile

from torchestimator._io import filesystems
from torchestimator.interop.source import WeightSource, WeightSourceError

__all__ = ["open_remote_weights"]

logger = logging.getLogger(__name__)

_OUR_FOLDER = re.compile(r"ckpt-\d+(?:\.[0-9]+(?:-h[0-9a-f]{8})?-[0-9a-f]{6})?")
_copies: list[str] = []


def open_remote_weights(url: str, open_local) -> WeightSource:
    """The weights at ``url``; ``open_local`` opens a local path (``open_weights``)."""
    url = url.rstrip("/")
    name = url.rsplit("/", 1)[1]
    if _OUR_FOLDER.fullmatch(name) and filesystems.exists(f"{url}/state.json"):
        return _ours(url, filesystems.parent(url), name)
    if _is_our_model_dir(url):
        from torchestimator.checkpoint import CheckpointStore

        latest = CheckpointStore(url, keep_checkpoint_max=None).latest_checkpoint()
        if latest is None:
            raise WeightSourceError(
                f"{url} holds no checkpoint (no ckpt-<step> folder with a valid state.json). "
                "Pass a model_dir that has been trained, or the URL of a ckpt-<step> folder."
            )
        return _ours(latest, url, latest.rsplit("/", 1)[1], given=url)
    return open_local(_local_copy(url))


def _is_our_model_dir(url: str) -> bool:
    try:
        head = filesystems.read_bytes(f"{url}/checkpoint")[:1]
    except FileNotFoundError:
        return any(_OUR_FOLDER.fullmatch(entry) for entry in _names(url))
    return head == b"{"  # ours is JSON; TensorFlow's `checkpoint` file is a text proto


def _names(url: str) -> list[str]:
    try:
        return filesystems.listdir(url)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _ours(checkpoint_url: str, root: str, folder: str, given: str | None = None) -> WeightSource:
    from torchestimator.interop.torch_sources import TorchestimatorSource

    step = int(folder.removeprefix("ckpt-").split(".")[0])
    logger.info("Reading weights from checkpoint %s (step %d).", checkpoint_url, step)
    return TorchestimatorSource(given or checkpoint_url, checkpoint_url, step)


def _remove_copies() -> None:
    for path in _copies:
        shutil.rmtree(path, ignore_errors=True)


def _local_copy(url: str) -> str:
    """A local path standing for ``url``: the same file name in a temporary folder, with what it needs beside it."""
    folder = tempfile.mkdtemp(prefix="torchestimator-weights-")
    if not _copies:
        atexit.register(_remove_copies)
    _copies.append(folder)
    parent, name = url.rsplit("/", 1)
    siblings = _names(parent)
    if name in siblings and not filesystems.is_dir(url):  # one file (safetensors, .h5, .keras, .pt, a TF .index)
        wanted = [name]
        if name.endswith(".index"):  # a TensorFlow prefix given by its .index: its data files too
            wanted += [entry for entry in siblings if entry.startswith(name[: -len(".index")] + ".data-")]
        _fetch(parent, wanted, folder)
        return os.path.join(folder, name)
    if f"{name}.index" in siblings:  # a TensorFlow checkpoint prefix
        _fetch(parent, [entry for entry in siblings if entry.startswith(name + ".")], folder)
        return os.path.join(folder, name)
    entries = _names(url)
    if "checkpoint" in entries:  # a TensorFlow model_dir: its `checkpoint` file and the prefix it names
        text = filesystems.read_bytes(f"{url}/checkpoint").decode("utf-8", "replace")
        match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', text, re.MULTILINE)
        prefix = os.path.basename(match.group(1)) if match else ""
        _fetch(url, ["checkpoint", *[entry for entry in entries if prefix and entry.startswith(prefix + ".")]], folder)
        return folder
    if entries:  # a Keras sharded checkpoint or another folder format: all of it
        _fetch(url, [entry for entry in entries if not filesystems.is_dir(f"{url}/{entry}")], folder)
        return folder
    raise WeightSourceError(f"{url}: no such object, folder or TensorFlow checkpoint prefix.")


def _fetch(base: str, names: list[str], folder: str) -> None:
    for name in names:
        logger.debug("Copying %s/%s to %s.", base, name, folder)
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(filesystems.read_bytes(f"{base}/{name}"))
