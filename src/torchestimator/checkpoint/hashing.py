"""Checksums of a file's bytes computed beside its I/O, so that checking a checkpoint costs no extra pass.

A checkpoint's files are checksummed as they are written and as they are read
back (``store.py``, ``tensor_files.py``). The buffers go to a helper thread per
checksum, in order, and the caller does not wait for them: it writes (and fsyncs) or reads on
while the thread hashes behind it; ``hashlib``, ``zlib`` and file I/O all
release the GIL for large buffers, so the two overlap, and a save or restore
takes about the longer of the two, not their sum.

Checksums written: ``sha256``, which state.json has always recorded (previous
versions and other tools check it), and ``crc32c`` (CRC-32C, Castagnoli, as
TensorFlow's tensor bundles and TFRecord use), recorded beside it and checked on
restore. google_crc32c computes it with the CPU's CRC instruction at ~0.3 s/GB
(zlib's crc32 ~1.8 s/GB, sha256 ~2.5 s/GB on the same loaded machine), the same
code whether or not torchestimator's compiled cores are on. A CRC finds the
accidental damage a checkpoint meets (any flipped bit, any burst up to 32 bits,
other damage with probability 1 - 2**-32). ``crc32`` (zlib's) is still read:
checkpoints of the first streaming version recorded it instead. None of them
guards against someone rewriting a file on purpose: state.json's own seal is a
plain sha256 too.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any

import google_crc32c
import numpy

from ._threads import process_thread

__all__ = ["CRC32", "CRC32C", "SHA256", "WRITTEN_KINDS", "OverlappedChecksums", "checksum_of"]

SHA256 = "sha256"
CRC32 = "crc32"
CRC32C = "crc32c"
KINDS = (SHA256, CRC32C, CRC32)
WRITTEN_KINDS = (SHA256, CRC32C)
"""What a save records for each file: sha256 for every earlier reader, crc32c for fast verification."""
# google_crc32c holds the GIL (it releases it for bytes objects only): pieces this size let other threads
# run between calls, at ~0.3 ms each.
_CRC32C_STEP_BYTES = 1 << 20
# Below this a buffer is checksummed at once: handing it to the thread costs more than hashing it.
_OVERLAP_MIN_BYTES = 1 << 20


class OverlappedChecksums:
    """The checksums (``kinds``) of the buffers given to ``update``, in order, computed on helper threads.

    A buffer handed to ``update`` must stay unchanged until ``result`` (or ``close``) returns: the views
    of a checkpoint's tensors are, since the save or restore holds them. Use as a context manager, so no
    buffer is read after an error. The threads (one per kind, ``_threads.process_thread``) are the
    process's, kept between saves; once the interpreter shuts them down (a save from an atexit handler),
    the checksums are computed on the caller, after what was queued.
    """

    def __init__(self, kinds: Iterable[str] = WRITTEN_KINDS) -> None:
        self.kinds = tuple(kinds)
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"OverlappedChecksums: unknown checksum kinds {sorted(unknown)}; use {', '.join(KINDS)}.")
        self._sha256 = hashlib.sha256() if SHA256 in self.kinds else None
        self._crcs = {CRC32: 0, CRC32C: 0}
        # One thread per kind: each sees the buffers in order, and the two kinds run side by side.
        self._pending: list[Future[None]] = []
        self.size = 0
        """Bytes given so far."""

    def __enter__(self) -> OverlappedChecksums:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def update(self, buffer: Any) -> None:
        """Queue ``buffer`` (bytes-like) after the ones before it; returns at once."""
        nbytes = memoryview(buffer).nbytes
        self.size += nbytes
        if nbytes < _OVERLAP_MIN_BYTES and not self._pending:
            for kind in self.kinds:  # nothing queued before it: the order holds
                self._add(kind, buffer)
            return
        for kind in self.kinds:
            try:
                self._pending.append(process_thread(kind).submit(self._add, kind, buffer))
            except RuntimeError:  # shutting down (a save from an atexit handler): thread pools take no work
                self._drain()  # what was queued before it first, so the order holds
                self._add(kind, buffer)

    def passing(self, buffers: Iterable[Any]) -> Iterator[Any]:
        """``buffers`` as they are, each queued for checksumming as it is handed on (to a storage writing it)."""
        for buffer in buffers:
            self.update(buffer)
            yield buffer

    def result(self) -> dict[str, Any]:
        """{"sha256": hex digest, "crc32c": int, "crc32": int, "size": bytes} of every buffer so far (the kinds
        asked for)."""
        self._drain()
        result: dict[str, Any] = {}
        for kind in self.kinds:
            if kind == SHA256:
                assert self._sha256 is not None  # made in __init__ when SHA256 is one of the kinds
                result[kind] = self._sha256.hexdigest()
            else:
                result[kind] = self._crcs[kind]
        result["size"] = self.size
        return result

    def close(self) -> None:
        """Waits for the buffers queued: none is read after the caller lets them go."""
        self._drain()

    def _add(self, kind: str, buffer: Any) -> None:
        if kind == SHA256:
            assert self._sha256 is not None  # made in __init__ when SHA256 is one of the kinds
            self._sha256.update(buffer)
        elif kind == CRC32C:
            self._crcs[CRC32C] = _crc32c(buffer, self._crcs[CRC32C])
        else:
            self._crcs[CRC32] = zlib.crc32(buffer, self._crcs[CRC32])

    def _drain(self) -> None:
        pending, self._pending = self._pending, []
        errors = [future.exception() for future in pending]  # waits for every one, in order, errors or not
        for error in errors:
            if error is not None:
                raise error  # only a buffer that is not bytes-like: the caller's error


def checksum_of(kind: str, buffer: Any) -> Any:
    """One checksum (``kind``) of a whole bytes-like buffer, on this thread: a hex digest for sha256, an int
    for the CRCs."""
    if kind == SHA256:
        return hashlib.sha256(buffer).hexdigest()
    if kind == CRC32C:
        return _crc32c(buffer, 0)
    if kind == CRC32:
        return zlib.crc32(buffer)
    raise ValueError(f"checksum_of: unknown checksum kind {kind!r}; use {', '.join(KINDS)}.")


def _crc32c(buffer: Any, crc: int) -> int:
    """google_crc32c.extend over any bytes-like buffer without copying it.

    google_crc32c parses its argument as ``y#``, which refuses memoryviews and bytearrays (writable tensor
    memory, the pieces a save streams); a numpy array over the same memory is accepted as it is.
    """
    if not isinstance(buffer, bytes):
        buffer = numpy.frombuffer(buffer, dtype=numpy.uint8)
    if len(buffer) <= _CRC32C_STEP_BYTES:
        whole: int = google_crc32c.extend(crc, buffer)
        return whole
    for start in range(0, len(buffer), _CRC32C_STEP_BYTES):
        crc = google_crc32c.extend(crc, buffer[start : start + _CRC32C_STEP_BYTES])
    return crc
