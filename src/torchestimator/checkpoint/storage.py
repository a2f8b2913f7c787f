"""Where checkpoint bytes live: the ``Storage`` protocol and its implementations.

A storage holds a flat set of folders (``ckpt-100``, ``.tmp-ckpt-200-4242``),
each a set of files, plus one manifest. It knows nothing about steps,
retention or checksums: that policy is written once, in ``store.py``, against
this protocol. ``LocalStorage`` is the real one (a directory on disk; its
fsyncs and renames are ``atomic.py``'s, the one durable writer of the
package; a checkpoint's streamed files are written by ``_write_chunks_durably`` here, with the same
open flags, mode and fsync); ``InMemoryStorage`` is a fake for tests.

A file's content is ``bytes`` or ``Chunks``: buffers written in order (a safetensors header, then views of
the tensors' own memory), so that a checkpoint is never joined into one copy in memory.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

from torchestimator._io.atomic import remove_stale_temporaries, rename_durably, write_bytes_atomically, write_durably

__all__ = ["MANIFEST_NAME", "InMemoryStorage", "LocalStorage", "Storage"]

MANIFEST_NAME = "checkpoint"

Chunks = Iterable[Any]
"""Bytes-like buffers (bytes, memoryview) that make up a file, in order."""
FileContent = bytes | Chunks

_Stream = TypeVar("_Stream", bound="ReadStream")


class ReadStream(Protocol):
    """What ``Storage.open_file`` returns: a binary stream read with ``readinto`` or ``read`` and ``seek``, and
    closed by ``with`` (a file opened "rb", ``io.BytesIO``, a store's read stream). A ``fileno`` is used when it
    has one."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readinto(self, buffer: Any, /) -> int | None: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def __enter__(self: _Stream) -> _Stream: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None, /
    ) -> object: ...


@runtime_checkable
class Storage(Protocol):
    """The operations the checkpoint store needs from a place to keep files."""

    root: str
    """Where the storage lives, for paths shown to users (``model_dir``)."""

    def location(self, folder: str) -> str:
        """The user-facing path of ``folder``."""
        ...

    def write_file(self, folder: str, filename: str, data: FileContent) -> None:
        """Write ``data`` (bytes, or buffers in order) to ``folder/filename`` durably (fsynced); create
        ``folder`` if needed. Each buffer is consumed before the next is asked for."""
        ...

    def open_file(self, folder: str, filename: str) -> ReadStream:
        """A binary stream reading the file (``readinto``, ``seek``); FileNotFoundError if absent."""
        ...

    def read_file(self, folder: str, filename: str, start: int = 0, length: int | None = None) -> bytes:
        """Read ``length`` bytes (all when None) from ``start``; FileNotFoundError if absent."""
        ...

    def list_folders(self) -> list[str]:
        """Names of all folders, hidden staging folders included."""
        ...

    def rename_folder(self, source: str, target: str) -> None:
        """Atomically rename a complete folder; ``target`` must not exist."""
        ...

    def delete_folder(self, folder: str) -> None:
        """Remove a folder and its files; a missing folder is not an error."""
        ...

    def read_manifest(self) -> bytes | None:
        """The manifest's bytes, or None when there is none."""
        ...

    def replace_manifest(self, data: bytes) -> None:
        """Replace the manifest atomically: readers see the old or the new one, never a mix."""
        ...

    def remove_stale_temporaries(self) -> list[str]:
        """Remove the temporary files (not folders) that dead writers of this storage left; return their paths."""
        ...

    def free_bytes(self) -> int | None:
        """Bytes free for new files, for error messages; None when unknown."""
        ...


class LocalStorage:
    """A ``model_dir`` on the local file system."""

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(model_dir))

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    def location(self, folder: str) -> str:
        return os.path.join(self.root, folder)

    def write_file(self, folder: str, filename: str, data: FileContent) -> None:
        directory = self.location(folder)
        os.makedirs(directory, exist_ok=True)
        if isinstance(data, (bytes, bytearray, memoryview)):
            write_durably(os.path.join(directory, filename), data)
        else:
            _write_chunks_durably(os.path.join(directory, filename), data)

    def open_file(self, folder: str, filename: str) -> ReadStream:
        return open(os.path.join(self.location(folder), filename), "rb", buffering=0)

    def read_file(self, folder: str, filename: str, start: int = 0, length: int | None = None) -> bytes:
        with open(os.path.join(self.location(folder), filename), "rb") as stream:
            stream.seek(start)
            return stream.read() if length is None else stream.read(length)

    def list_folders(self) -> list[str]:
        try:
            with os.scandir(self.root) as entries:
                try:
                    return sorted([entry.name for entry in entries if entry.is_dir()])  # model_dir may hold thousands
                except OSError:
                    pass  # a symlink loop or an unreadable link: list again, entry by entry
            with os.scandir(self.root) as entries:
                return sorted(entry.name for entry in entries if _is_folder(entry))
        except (FileNotFoundError, NotADirectoryError):
            # Nothing was ever saved there; whether it can be written is the writer's question.
            return []

    def rename_folder(self, source: str, target: str) -> None:
        source_path, target_path = self.location(source), self.location(target)
        if os.path.exists(target_path):
            raise FileExistsError(f"Cannot rename {source_path} to {target_path}: the target exists.")
        rename_durably(source_path, target_path)

    def delete_folder(self, folder: str) -> None:
        path = self.location(folder)
        try:
            if os.path.islink(path):
                os.unlink(
                    path
                )  # a checkpoint folder linked from elsewhere: drop the link, never the files it points to
            else:
                shutil.rmtree(path)
        except FileNotFoundError:
            pass

    def read_manifest(self) -> bytes | None:
        try:
            with open(os.path.join(self.root, MANIFEST_NAME), "rb") as stream:
                return stream.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError:
            return b""  # not a manifest: the store warns and rebuilds the list by scanning

    def replace_manifest(self, data: bytes) -> None:
        os.makedirs(self.root, exist_ok=True)
        write_bytes_atomically(os.path.join(self.root, MANIFEST_NAME), data)

    def remove_stale_temporaries(self) -> list[str]:
        return remove_stale_temporaries(self.root)

    def free_bytes(self) -> int | None:
        path = self.root
        while not os.path.isdir(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)  # model_dir may not exist yet: ask its file system
        try:
            stats = os.statvfs(path)
        except (OSError, AttributeError):  # AttributeError: no statvfs on Windows
            return None
        return stats.f_bavail * stats.f_frsize


class InMemoryStorage:
    """A storage held in dicts, for tests; ``folders`` may be edited to simulate damage."""

    def __init__(self, root: str = "memory://model_dir") -> None:
        self.root = root
        self.folders: dict[str, dict[str, bytes]] = {}
        self.manifest: bytes | None = None

    def __repr__(self) -> str:
        return f"InMemoryStorage({self.root!r})"

    def location(self, folder: str) -> str:
        return f"{self.root}/{folder}"

    def write_file(self, folder: str, filename: str, data: FileContent) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            data = b"".join(bytes(chunk) for chunk in data)
        self.folders.setdefault(folder, {})[filename] = bytes(data)

    def open_file(self, folder: str, filename: str) -> ReadStream:
        return io.BytesIO(self.read_file(folder, filename))

    def read_file(self, folder: str, filename: str, start: int = 0, length: int | None = None) -> bytes:
        try:
            data = self.folders[folder][filename]
        except KeyError:
            raise FileNotFoundError(f"No such file: {self.location(folder)}/{filename}") from None
        return data[start:] if length is None else data[start : start + length]

    def list_folders(self) -> list[str]:
        return sorted(self.folders)

    def rename_folder(self, source: str, target: str) -> None:
        if target in self.folders:
            raise FileExistsError(f"Cannot rename {self.location(source)}: {self.location(target)} exists.")
        if source not in self.folders:
            raise FileNotFoundError(f"No such folder: {self.location(source)}")
        self.folders[target] = self.folders.pop(source)

    def delete_folder(self, folder: str) -> None:
        self.folders.pop(folder, None)

    def read_manifest(self) -> bytes | None:
        return self.manifest

    def replace_manifest(self, data: bytes) -> None:
        self.manifest = bytes(data)

    def remove_stale_temporaries(self) -> list[str]:
        return []  # the fake writes no temporary files

    def free_bytes(self) -> int | None:
        return None


def _write_chunks_durably(path: str, chunks: Chunks) -> None:
    """``atomic.write_durably`` for buffers in order: each goes to the file as it comes, none is joined."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # as write_durably opens it
    with open(descriptor, "wb", buffering=0, closefd=True) as handle:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            written = 0
            while written < view.nbytes:  # a raw write may take part of a buffer
                written += handle.write(view[written:])
        os.fsync(handle.fileno())


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a symlink loop (ELOOP) or an unreadable link: not a folder the store can use
        return False
