"""Reading a named file that may be anything: a FIFO must not block, a device must not stream forever.

Exports (loader.py) and the server's config files (serving/config.py) name files
that a user or a crafted folder can point anywhere. ``open_regular_file`` opens
without blocking and refuses what is not a regular file; ``read_bounded`` reads
at most a bound; callers turn the errors into messages that say what the file was for.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from torchestimator.errors import FileTooLargeError, NotARegularFileError

__all__ = ["FileTooLargeError", "NotARegularFileError", "open_regular_file", "read_bounded", "read_regular_file"]


def open_regular_file(path: str) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file.

    Raises what ``os.open`` raises (FileNotFoundError, PermissionError, ...) or
    NotARegularFileError. Opened with O_NONBLOCK, so opening a FIFO with no
    writer returns at once instead of waiting; checked before a file object is
    made (``open`` itself refuses a folder with a less useful error).
    """
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(path, "a folder" if stat.S_ISDIR(mode) else "not a regular file")
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_bounded(file: BinaryIO, path: str, limit: int) -> bytes:
    """All of an open regular file, or FileTooLargeError when it holds more than ``limit`` bytes."""
    size = os.fstat(file.fileno()).st_size
    if size > limit:
        raise FileTooLargeError(path, size, limit)
    data = file.read(size + 1)  # one more: a file that grew past its size is measured, not trusted
    if len(data) > limit:
        raise FileTooLargeError(path, len(data), limit)
    return data


def read_regular_file(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (errors as the two functions above)."""
    with open_regular_file(path) as file:
        return read_bounded(file, path, limit)
