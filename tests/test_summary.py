"""Tests for torchestimator._io.summary: event files written lazily and read back with TensorBoard's readers."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

from torchestimator._io.summary import EVENT_FILE_PATTERN, SummaryWriter, read_scalars


def _event_files(logdir):
    return sorted(logdir.glob(EVENT_FILE_PATTERN))


def test_scalars_are_read_back_by_tensorboard(tmp_path):
    with SummaryWriter(tmp_path / "run") as writer:
        writer.scalar("loss", 0.5, step=10)
        writer.scalar("loss", 0.25, step=20)
        writer.scalars({"accuracy": 0.75, "auc": np.float32(0.5), "count": torch.tensor(3)}, step=20)

    accumulator = EventAccumulator(str(tmp_path / "run"))
    accumulator.Reload()
    assert sorted(accumulator.Tags()["scalars"]) == ["accuracy", "auc", "count", "loss"]
    assert [(event.step, event.value) for event in accumulator.Scalars("loss")] == [(10, 0.5), (20, 0.25)]
    assert [(event.step, event.value) for event in accumulator.Scalars("count")] == [(20, 3.0)]

    assert read_scalars(tmp_path / "run") == {
        "accuracy": [(20, 0.75)],
        "auc": [(20, 0.5)],
        "count": [(20, 3.0)],
        "loss": [(10, 0.5), (20, 0.25)],
    }


def test_scalars_skips_global_step_and_non_numeric_values(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.scalars(
            {"global_step": 100, "loss": 1.5, "per_class": [0.1, 0.9], "name": "x", "matrix": torch.ones(2, 2)},
            step=100,
        )
    assert read_scalars(tmp_path) == {"loss": [(100, 1.5)]}


def test_text_is_written_for_the_text_plugin(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.text("checkpoint_path", "model_dir/ckpt-5", step=5)
    (event_file,) = _event_files(tmp_path)
    values = [
        (event.step, value) for event in LegacyEventFileLoader(str(event_file)).Load() for value in event.summary.value
    ]
    assert len(values) == 1
    step, value = values[0]
    assert step == 5
    assert value.tag.startswith("checkpoint_path")
    assert value.metadata.plugin_data.plugin_name == "text"
    assert value.tensor.string_val == [b"model_dir/ckpt-5"]
    assert read_scalars(tmp_path) == {}  # text is not a scalar


def test_no_file_until_the_first_write(tmp_path):
    logdir = tmp_path / "eval"
    writer = SummaryWriter(logdir)
    writer.scalars({"global_step": 3}, step=3)  # nothing to write
    writer.flush()
    assert not logdir.exists()
    writer.scalar("loss", 1.0, step=3)
    writer.flush()
    assert len(_event_files(logdir)) == 1
    writer.close()
    writer.close()  # closing twice is harmless
    assert read_scalars(logdir) == {"loss": [(3, 1.0)]}


def test_closing_an_unused_writer_creates_nothing(tmp_path):
    SummaryWriter(tmp_path / "unused").close()
    assert not (tmp_path / "unused").exists()


def test_disabled_writer_creates_nothing(tmp_path):
    logdir = tmp_path / "not_chief"
    with SummaryWriter(logdir, enabled=False) as writer:
        writer.scalar("loss", 1.0, step=1)
        writer.scalars({"accuracy": 0.5}, step=1)
        writer.text("note", "hello", step=1)
        writer.flush()
    assert not logdir.exists()
    assert list(tmp_path.iterdir()) == []


def test_last_write_of_a_step_wins_across_files(tmp_path):
    with SummaryWriter(tmp_path) as first:
        first.scalar("accuracy", 0.5, step=200)
        first.scalar("accuracy", 0.25, step=100)
    with SummaryWriter(tmp_path) as second:  # e.g. a restarted run evaluating step 200 again
        second.scalar("accuracy", 0.75, step=200)
    assert len(_event_files(tmp_path)) == 2
    assert read_scalars(tmp_path) == {"accuracy": [(100, 0.25), (200, 0.75)]}
    # File names order files only to the second (and their counters are not zero-padded),
    # so the later write must win by its wall time even when its file name sorts first.
    _, later_file = _event_files(tmp_path)
    later_file.rename(tmp_path / "events.out.tfevents.0000000000.host.1.0")
    assert read_scalars(tmp_path) == {"accuracy": [(100, 0.25), (200, 0.75)]}


def test_read_scalars_ignores_subdirectories_and_missing_directories(tmp_path):
    with SummaryWriter(tmp_path / "eval") as writer:
        writer.scalar("accuracy", 0.5, step=1)
    with SummaryWriter(tmp_path) as writer:
        writer.scalar("loss", 2.0, step=1)
    assert read_scalars(tmp_path) == {"loss": [(1, 2.0)]}
    assert read_scalars(tmp_path / "absent") == {}


def test_a_truncated_file_is_read_up_to_the_damage(tmp_path, caplog):
    with SummaryWriter(tmp_path) as writer:
        writer.scalar("loss", 1.0, step=1)
        writer.scalar("loss", 2.0, step=2)
    (event_file,) = _event_files(tmp_path)
    content = event_file.read_bytes()
    event_file.write_bytes(content[:-3])  # e.g. a process killed while writing
    with caplog.at_level(logging.WARNING):
        assert read_scalars(tmp_path) == {"loss": [(1, 1.0)]}
    assert "Skipping" not in caplog.text  # a cut tail is a file still being written: nothing to warn about
    damaged = bytearray(content)
    damaged[-10] ^= 0xFF  # the second record's data: a CRC mismatch is damage, and is named
    event_file.write_bytes(bytes(damaged))
    with caplog.at_level(logging.WARNING):
        assert read_scalars(tmp_path) == {"loss": [(1, 1.0)]}
    assert f"Skipping the rest of event file {event_file}" in caplog.text and "corrupted record" in caplog.text


def test_non_finite_values_are_kept(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.scalar("loss", float("nan"), step=1)
    ((step, value),) = read_scalars(tmp_path)["loss"]
    assert step == 1 and math.isnan(value)


def test_bad_arguments_are_refused(tmp_path):
    writer = SummaryWriter(tmp_path / "run")
    with pytest.raises(TypeError, match="`step` must be an int"):
        writer.scalar("loss", 1.0, step=1.5)
    with pytest.raises(TypeError, match="`step` must be an int"):
        writer.scalars({"loss": 1.0}, step=True)
    with pytest.raises(TypeError, match="value for tag 'loss' must be a real number"):
        writer.scalar("loss", "high", step=1)
    with pytest.raises(TypeError, match="`tag` must be a non-empty string"):
        writer.scalar("", 1.0, step=1)
    with pytest.raises(TypeError, match="text for tag 'note' must be a string"):
        writer.text("note", 3, step=1)
    with pytest.raises(TypeError, match="`values` must be a dict"):
        writer.scalars([1.0], step=1)
    assert not (tmp_path / "run").exists()  # refused writes create nothing
    writer.close()
    with pytest.raises(ValueError, match="is closed"):
        writer.scalar("loss", 1.0, step=1)
