"""A full disk under the summary writer's background thread: a DiskFullError naming the event file at the loop's
next write, flush or close, and no exception escaping the thread (pytest would warn of it; here that is an error).

The disk is made full by making tensorboard's record writer fail with ENOSPC, so no root (tmpfs) is needed; the
fault suite (tests/faults/test_checkpoint_faults.py) fills a real tmpfs.
"""

from __future__ import annotations

import errno
import threading

import pytest
from helpers import input_fns, make_estimator
from tensorboard.summary.writer.record_writer import RecordWriter

import torchestimator as te
from torchestimator._io.summary import SummaryWriter
from torchestimator.errors import DiskFullError

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

DISK_FULL = r"disk full: could not write .*summaries.* to .*events\.out\.tfevents"


@pytest.fixture
def fill_disk(monkeypatch):
    """Calling it makes every later event record fail as on a full disk."""

    def no_room(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    return lambda: monkeypatch.setattr(RecordWriter, "write", no_room)


def _writer_threads():
    return [thread for thread in threading.enumerate() if type(thread).__name__ == "_AsyncWriterThread"]


@pytest.mark.parametrize("surfaces_at", ["flush", "close"])
def test_the_threads_error_is_disk_full_naming_the_event_file_at_the_next_call(tmp_path, fill_disk, surfaces_at):
    before = _writer_threads()
    writer = SummaryWriter(tmp_path)
    writer.scalar("loss", 1.0, 0)
    writer.flush()
    fill_disk()
    writer.scalar("loss", 2.0, 1)  # queued: the thread fails on it
    with pytest.raises(DiskFullError, match=DISK_FULL) as raised:
        getattr(writer, surfaces_at)()
    assert raised.value.errno == errno.ENOSPC and raised.value.filename.startswith(
        str(tmp_path / "events.out.tfevents")
    )
    writer.close()  # quiet: the error was raised once and the file abandoned
    assert _writer_threads() == before  # the abandoned file's thread was stopped, not left behind


def test_writes_after_the_thread_failed_raise_disk_full(tmp_path, fill_disk):
    writer = SummaryWriter(tmp_path)
    writer.scalar("loss", 1.0, 0)
    writer.flush()
    fill_disk()
    with pytest.raises(DiskFullError, match=DISK_FULL):
        for step in range(1, 100_000):  # the thread's error surfaces at a later scalar
            writer.scalar("loss", float(step), step)
    with pytest.raises(DiskFullError, match=DISK_FULL):
        writer.flush()  # the same error, again, to a caller that goes on
    writer.close()


def test_training_stops_with_disk_full_naming_the_event_file(tmp_path, fill_disk):
    train = input_fns()[0]
    estimator = make_estimator(tmp_path, save_summary_steps=1, save_checkpoints_steps=10**9)

    class FillTheDisk(te.Hook):
        def after_step(self, run_context):
            if run_context.state.global_step == 3:  # the event file exists by then
                fill_disk()

    with pytest.raises(DiskFullError, match=rf"disk full: could not write summaries.* to {tmp_path}/events"):
        estimator.train(train, hooks=[FillTheDisk()], max_steps=3000)
