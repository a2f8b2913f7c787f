"""sha256 of a file's bytes computed beside its I/O, so that checking a checkpoint costs no extra pass.

A checkpoint's files are hashed as they are written and as they are read back
(``tensor_files.py``, ``store.py``). The buffers go to a helper thread in order
and the caller does not wait for them: it writes (and fsyncs) or reads on
while the thread hashes behind it; ``hashlib`` and file I/O both release the
GIL for large buffers, so the two overlap, and a save or restore takes about
the longer of the two, not their sum. The digest is the plain sha256 of the
bytes in order, the value state.json has always recorded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["OverlappedSha256"]

# Below this a buffer is hashed at once: handing it to the thread costs more than hashing it.
_OVERLAP_MIN_BYTES = 1 << 20


class OverlappedSha256:
    """sha256 of the buffers given to ``update``, in order, hashed on a helper thread behind the caller.

    A buffer handed to ``update`` must stay unchanged until ``hexdigest`` (or ``close``) returns: the views
    of a checkpoint's tensors are, since the save or restore holds them. Use as a context manager, so the
    thread is released and no buffer is read after an error.
    """

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._executor: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None
        self.size = 0
        """Bytes given so far."""

    def __enter__(self) -> OverlappedSha256:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def update(self, buffer: Any) -> None:
        """Queue ``buffer`` (bytes-like) after the ones before it; returns at once."""
        nbytes = memoryview(buffer).nbytes
        self.size += nbytes
        if nbytes < _OVERLAP_MIN_BYTES and self._last is None:
            self._digest.update(buffer)  # nothing queued before it: the order holds
            return
        if self._executor is None:
            # One worker: the buffers are hashed in the order they were queued.
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-sha256")
        self._last = self._executor.submit(self._digest.update, buffer)

    def passing(self, buffers: Iterable[Any]) -> Iterator[Any]:
        """``buffers`` as they are, each queued for hashing as it is handed on (to a storage writing it)."""
        for buffer in buffers:
            self.update(buffer)
            yield buffer

    def hexdigest(self) -> str:
        """The digest of every buffer given so far (waits for the thread to catch up)."""
        self._drain()
        return self._digest.hexdigest()

    def close(self) -> None:
        """Waits for the buffers queued (none is read after the caller lets them go), stops the thread."""
        try:
            self._drain()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _drain(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)  # every queued buffer hashed, in order
            self._executor = None
        last, self._last = self._last, None
        if last is not None:
            last.result()  # hashlib raises only for a buffer that is not bytes-like: the caller's error
