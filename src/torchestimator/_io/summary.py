"""TensorBoard event files: a small writer for the loops and a reader for scalars.

What belongs here: :class:`SummaryWriter`, which the train and eval loops use to
write scalars and text to ``model_dir`` (training) or ``model_dir/eval``
(evaluation), and :func:`read_scalars`, which reads scalars back (tests, early
stopping, best-model keeping). What does not: deciding when to write (the
loop's triggers) or which process writes (the caller passes ``enabled``).

Writing is delegated to ``torch.utils.tensorboard.SummaryWriter``: it is
maintained with torch, writes the standard event format with a background
thread, and already encodes text summaries with the metadata TensorBoard's
text plugin expects, which tensorboard's bare ``EventFileWriter`` would leave
to us. Scalars are written as ``simple_value`` (the TF 1.x form), which every
TensorBoard and TensorFlow's ``read_eval_metrics`` understand. The torch writer
creates its event file as soon as it is constructed, so it is built lazily on
the first write: an evaluation that writes nothing leaves no file behind. Its
background thread's write errors surface at a later call (write, flush or
close) as a bare OSError; here they become an error naming the event file
(``DiskFullError`` when there is no room), and the writer is abandoned so that
``close`` does not raise the same error again over whatever is being raised.
The thread itself does not die of the error (``_ThreadRecordWriter``): an
exception escaping a thread reaches ``threading.excepthook``, which would print
it a second time, with no file named, apart from the loop's error.

A ``logdir`` in an object store (``s3://b/run``) cannot be appended to: the torch writer writes into a
local folder, and every event file there is uploaded whole (one PUT, seen whole or not at all) at
``flush``, ``close`` and at most every ``UPLOAD_SECONDS`` while scalars are written, which is how
TensorFlow's own S3 writer behaves (it re-uploads the file at each flush). TensorBoard pointed at the
bucket sees the run up to the last upload.

Reading frames records with our own TFRecord reader (a declared length is
bounded by the file's size before anything is allocated) and parses them with
TensorBoard's ``Event`` message, file by file, rather than ``EventAccumulator``,
whose reservoir sampling and purging of "orphaned" steps after a restart would
silently drop values.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import logging
import math
import numbers
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import numpy as np
import torch

from torchestimator._io import filesystems
from torchestimator.errors import DiskFullError, is_no_room

__all__ = ["EVENT_FILE_PATTERN", "SummaryWriter", "read_scalars"]

logger = logging.getLogger(__name__)

EVENT_FILE_PATTERN = "events.out.tfevents.*"
"""The names of TensorBoard event files inside a log directory."""

UPLOAD_SECONDS = 30.0
"""With a logdir in an object store: the longest time written summaries stay local before being uploaded."""


def _check_step(step: Any, method: str) -> int:
    if isinstance(step, bool) or not isinstance(step, (numbers.Integral, torch.Tensor)):
        raise TypeError(f"SummaryWriter.{method}: `step` must be an int (the global step); received {step!r}.")
    return int(step)


def _check_tag(tag: Any, method: str) -> str:
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"SummaryWriter.{method}: `tag` must be a non-empty string; received {tag!r}.")
    return tag


def _as_number(value: Any) -> float | None:
    """Returns ``value`` as a float if it is a real number (or a one-element tensor/array), else None."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.size == 1 if isinstance(value, np.ndarray) else value.numel() == 1:
            value = value.item()
        else:
            return None
    if isinstance(value, (numbers.Real, np.number)) and not isinstance(value, (complex, np.complexfloating)):
        return float(value)
    return None


class SummaryWriter:
    """Writes scalars and text to TensorBoard event files in ``logdir``.

    With ``enabled=False`` (processes other than the chief) every method is a
    no-op and nothing is created. Usable as a context manager; writing after
    :meth:`close` is an error.
    """

    def __init__(self, logdir: str | os.PathLike[str], *, enabled: bool = True) -> None:
        self.logdir = os.fspath(logdir)
        self.enabled = enabled
        self._writer: Any = None
        self._closed = False
        self._failure: OSError | None = None
        self._mirror: str | None = None  # the local folder the torch writer fills, for a logdir in a store
        self._uploaded_at = time.monotonic()

    def _file_writer(self, method: str) -> Any:
        """The torch writer, built on first use so that the event file appears only when written to."""
        if self._closed:
            raise ValueError(
                f"SummaryWriter.{method}: the writer for {self.logdir!r} is closed; create a new SummaryWriter."
            )
        if self._writer is None:
            # Imported here: torch.utils.tensorboard pulls in tensorboard, which most
            # non-chief processes never need.
            from torch.utils.tensorboard import SummaryWriter as TorchSummaryWriter

            if self._failure is not None:
                raise self._failure
            local = self.logdir
            if filesystems.is_url(self.logdir):
                self._mirror = local = tempfile.mkdtemp(prefix="torchestimator-summaries-")
            else:
                local = filesystems.local_path(self.logdir)
            self._writer = self._guarded(lambda: TorchSummaryWriter(log_dir=local), "the event file")
            for event_writer in _event_writers(self._writer):
                _ThreadRecordWriter.install(event_writer)
            logger.debug("Writing summaries to %s.", self.logdir)
        return self._writer

    def _guarded(self, call: Any, what: str) -> Any:
        """Runs a call into the torch writer; an OSError (its thread's included) names the event file."""
        try:
            return call()
        except OSError as error:
            path = self._event_file()
            if is_no_room(error):
                failure: OSError = DiskFullError(
                    error,
                    path=path,
                    what=what,
                    advice="Free some space (or choose a model_dir with room) and rerun: training resumes from the "
                    "newest intact checkpoint.",
                )
            else:
                failure = OSError(error.errno, f"Could not write {what} to {path}: {error.strerror or error}", path)
            self._abandon()
            self._failure = failure
            raise failure from error

    def _event_file(self) -> str:
        for event_writer in _event_writers(self._writer):
            name = getattr(event_writer, "_file_name", None)
            if name:
                return name
        return os.path.join(self.logdir, EVENT_FILE_PATTERN)

    def _abandon(self) -> None:
        """Drops a failed torch writer: stops its thread, then closes its file without flushing again."""
        for event_writer in _event_writers(self._writer):
            _ThreadRecordWriter.stop(event_writer)
            stream = getattr(event_writer, "_general_file_writer", None)
            if stream is None:
                continue
            try:
                stream.close()
            except Exception:  # the buffered bytes cannot be written either; the error was already raised
                pass
        self._writer = None

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Writes one scalar ``value`` for ``tag`` at ``step``."""
        if not self.enabled:
            return
        tag = _check_tag(tag, "scalar")
        step = _check_step(step, "scalar")
        number = _as_number(value)
        if number is None:
            raise TypeError(
                f"SummaryWriter.scalar: the value for tag {tag!r} must be a real number; received {value!r}."
            )
        if not math.isfinite(number):
            logger.warning("Summary %r at step %d is %s.", tag, step, number)
        writer = self._file_writer("scalar")
        self._guarded(lambda: writer.add_scalar(tag, number, global_step=step), f"summaries (at {tag!r}, step {step})")
        if self._mirror is not None and time.monotonic() - self._uploaded_at >= UPLOAD_SECONDS:
            self.flush()

    def scalars(self, values: Mapping[str, Any], step: int) -> None:
        """Writes every numeric entry of ``values`` (e.g. evaluation results) at ``step``.

        Skips ``global_step`` (it is the step) and non-numeric values such as
        lists from non-scalar metrics.
        """
        if not self.enabled:
            return
        if not isinstance(values, Mapping):
            raise TypeError(f"SummaryWriter.scalars: `values` must be a dict of tag -> number; received {values!r}.")
        step = _check_step(step, "scalars")
        for tag, value in values.items():
            number = _as_number(value)
            if tag == "global_step" or number is None:
                if tag != "global_step":
                    logger.debug("Not writing summary %r: %s is not a number.", tag, type(value).__name__)
                continue
            self.scalar(tag, number, step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Writes ``text`` (shown by TensorBoard's text plugin, Markdown allowed) for ``tag`` at ``step``."""
        if not self.enabled:
            return
        tag = _check_tag(tag, "text")
        step = _check_step(step, "text")
        if not isinstance(text, str):
            raise TypeError(f"SummaryWriter.text: the text for tag {tag!r} must be a string; received {text!r}.")
        writer = self._file_writer("text")
        self._guarded(lambda: writer.add_text(tag, text, global_step=step), f"summaries (at {tag!r}, step {step})")

    def flush(self) -> None:
        """Writes pending events to disk (does not create a file if nothing was written)."""
        if self._failure is not None:
            raise self._failure
        if self._writer is not None:
            self._guarded(self._writer.flush, "pending summaries")
            self._upload()

    def _upload(self) -> None:
        """Puts every event file of the local mirror into the store, whole (a logdir URL only)."""
        if self._mirror is None:
            return
        for name in sorted(os.listdir(self._mirror)):
            with open(os.path.join(self._mirror, name), "rb") as handle:
                filesystems.write_bytes(filesystems.join(self.logdir, name), handle.read())
        self._uploaded_at = time.monotonic()

    def close(self) -> None:
        """Flushes and closes the event file; calling it again does nothing.

        After a write error was raised, closing is quiet: the file is already abandoned.
        """
        self._closed = True
        if self._writer is not None:
            writer = self._writer
            self._guarded(writer.close, "pending summaries")
            self._writer = None
            try:
                self._upload()
            finally:
                if self._mirror is not None:
                    shutil.rmtree(self._mirror, ignore_errors=True)
                    self._mirror = None

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _event_writers(torch_writer: Any) -> list[Any]:
    """The tensorboard ``EventFileWriter`` of each event file of a torch ``SummaryWriter``."""
    writers = getattr(torch_writer, "all_writers", None) or {}
    found = (getattr(writer, "event_writer", None) for writer in writers.values())
    return [event_writer for event_writer in found if event_writer is not None]


class _ThreadRecordWriter:
    """Stands in for the record writer that an event file's background thread writes with.

    tensorboard's thread stores a write error where the next write, flush or close from the loop raises it,
    then re-raises it, ending the thread with an unhandled exception. Here an OSError is only stored: the
    loop's next call still raises it (``SummaryWriter._guarded`` names the event file, ``DiskFullError`` when
    there is no room), nothing escapes the thread, and the records queued after it are dropped, so the
    thread keeps taking them and a loop that writes is never blocked on a full queue. Where tensorboard's
    writer lacks the attributes used here, it is left as it is.
    """

    def __init__(self, worker: Any, record_writer: Any) -> None:
        self._worker = worker
        self._record_writer = record_writer

    @classmethod
    def install(cls, event_writer: Any) -> None:
        worker = getattr(getattr(event_writer, "_async_writer", None), "_worker", None)
        if worker is not None and hasattr(worker, "exception") and hasattr(worker, "_record_writer"):
            worker._record_writer = cls(worker, worker._record_writer)

    @staticmethod
    def stop(event_writer: Any) -> None:
        """Ends the thread of an abandoned event file (it drops what is still queued, or writes it if it can)."""
        worker: Any = getattr(getattr(event_writer, "_async_writer", None), "_worker", None)
        if isinstance(getattr(worker, "_record_writer", None), _ThreadRecordWriter) and worker.is_alive():
            worker.stop()

    def write(self, data: bytes) -> None:
        self._call(self._record_writer.write, data)

    def flush(self) -> None:
        self._call(self._record_writer.flush)

    def close(self) -> None:
        self._record_writer.close()

    def _call(self, method: Any, *arguments: Any) -> None:
        if self._worker.exception is not None:
            return  # the file already failed: what was queued after cannot be written to it either
        try:
            method(*arguments)
        except OSError as error:
            self._worker.exception = error  # raised by the loop's next call into the writer


def _scalar_value(value: Any) -> float | None:
    """The number in one summary value: a legacy ``simple_value`` or a scalar tensor (scalars plugin).

    A tensor's declared shape is checked before it becomes an array: one
    ``float_val`` under a shape of 2**31 elements would otherwise be repeated
    into gigabytes (``make_ndarray`` fills the shape), from a record of a few bytes.
    """
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and value.metadata.plugin_data.plugin_name in ("scalars", ""):
        if any(dimension.size != 1 for dimension in value.tensor.tensor_shape.dim):
            return None
        from tensorboard.util import tensor_util

        array = tensor_util.make_ndarray(value.tensor)
        if array.size == 1 and array.dtype.kind in "biuf":
            return float(array.reshape(()))
    return None


def read_scalars(logdir: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Reads every scalar in ``logdir``'s event files: tag -> [(step, value)] sorted by step.

    Like TensorFlow's ``read_eval_metrics``: only files directly in ``logdir``
    are read (not subdirectories), and when a step was written more than once
    (e.g. an evaluation repeated after a restart) the last write wins, judged
    by the events' wall time (file names only order files within a second).
    A file is read up to its first damage, with a warning naming it; a record
    cut at the end of a file (one being written now) ends it quietly, as in
    TensorBoard. Records are framed by our own TFRecord reader, which bounds a
    declared length by the file's size before reading it. A missing ``logdir`` gives ``{}``.
    """
    # tag -> step -> ((wall_time, read order), value)
    latest: dict[str, dict[int, tuple[tuple[float, int], float]]] = {}
    order = 0
    with _local_copy(os.fspath(logdir)) as local_logdir:
        for path in sorted(glob.glob(os.path.join(glob.escape(local_logdir), EVENT_FILE_PATTERN))):
            order = _read_event_file(path, latest, order)
    return {
        tag: [(step, number) for step, (_, number) in sorted(steps.items())] for tag, steps in sorted(latest.items())
    }


@contextlib.contextmanager
def _local_copy(logdir: str) -> Iterator[str]:
    """``logdir`` itself when local; for a URL, a temporary folder holding a copy of its event files."""
    if not filesystems.is_url(logdir):
        yield filesystems.local_path(logdir)
        return
    with tempfile.TemporaryDirectory(prefix="torchestimator-events-") as folder:
        try:
            names = filesystems.listdir(logdir)
        except FileNotFoundError:
            names = []
        for name in names:
            if fnmatch.fnmatchcase(name, EVENT_FILE_PATTERN):
                with open(os.path.join(folder, name), "wb") as handle:
                    handle.write(filesystems.read_bytes(filesystems.join(logdir, name)))
        yield folder


def _read_event_file(path: str, latest: dict[str, dict[int, Any]], order: int) -> int:
    """Adds one event file's scalars to ``latest`` (tag -> step -> ((wall_time, read order), value)); returns the
    read order reached. A file is read up to its first damage, with a warning naming it."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto.event_pb2 import Event

    from torchestimator.data.tfrecord import DataLossError, iter_records  # the reading side only: import cost

    offset = 0
    try:
        for offset, record in iter_records(path, strict=False):  # noqa: B007 (read after the loop)
            order += 1
            event = Event.FromString(record)
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                number = _scalar_value(value)
                if number is None:
                    continue
                steps = latest.setdefault(value.tag, {})
                written = (event.wall_time, order)
                if event.step not in steps or written >= steps[event.step][0]:
                    steps[int(event.step)] = (written, number)
    except DataLossError as error:
        if error.kind != "truncated":  # a cut tail is a file still being written
            logger.warning("Skipping the rest of event file %s: %s", path, error)
    except (OSError, DecodeError, ValueError) as error:
        logger.warning(
            "Skipping the rest of event file %s: the record at byte %d could not be read as an Event (%s).",
            path,
            offset,
            error,
        )
    return order
