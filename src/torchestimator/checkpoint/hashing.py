"""sha256 of a file's bytes computed beside its I/O, so that checking a checkpoint costs no extra pass.

A checkpoint's files are hashed as they are written and as they are read back
(``tensor_files.py``). Hashing a buffer on a helper thread while the caller
writes it, or reads the next one, overlaps the two: ``hashlib`` and file I/O
both release the GIL for large buffers. The digest is the plain sha256 of the
bytes in order, the value state.json has always recorded.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["OverlappedSha256"]

# Below this a buffer is hashed at once: handing it to the thread costs more than hashing it.
_OVERLAP_MIN_BYTES = 1 << 20


class OverlappedSha256:
    """sha256 of the buffers given to ``update``, in order, each hashed on a helper thread.

    A buffer handed to ``update`` must stay unchanged until the next ``update`` or ``hexdigest`` returns;
    the caller does its I/O on that buffer meanwhile. Use as a context manager (the thread is released).
    """

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    def __enter__(self) -> OverlappedSha256:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def update(self, buffer: Any) -> None:
        """Queue ``buffer`` (bytes-like) after the ones before it; returns once the previous one is hashed."""
        self._wait()
        if memoryview(buffer).nbytes < _OVERLAP_MIN_BYTES:
            self._digest.update(buffer)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-sha256")
        self._pending = self._executor.submit(self._digest.update, buffer)

    def hexdigest(self) -> str:
        """The digest of every buffer given so far (waits for the last one)."""
        self._wait()
        return self._digest.hexdigest()

    def close(self) -> None:
        """Waits for the buffer being hashed (so none is used after the caller frees it), stops the thread."""
        try:
            if self._pending is not None:
                self._pending.exception()  # waits; an error here is the caller's to find through hexdigest
                self._pending = None
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
