"""The "Input resumes at ..." log line is one short line (epoch, file, byte offset, records consumed).

A TFRecordDataset with a shuffle buffer saves its RNG state and every buffered record's offset (kilobytes
of JSON); that whole position goes to DEBUG, not into the INFO line.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch
import torch.nn as nn

import torchestimator as te
from torchestimator.data.inputs import describe_position, numpy_input_fn
from torchestimator.data.tfrecord import TFRecordWriter
from torchestimator.data.tfrecord_dataset import TFRecordDataset

ESTIMATOR_LOGGER = "torchestimator"  # the Estimator's logger


def _write(folder) -> str:
    os.makedirs(folder, exist_ok=True)
    for part in range(3):
        with TFRecordWriter(os.path.join(folder, f"train-{part}.tfrecord")) as writer:
            for row in range(700):
                writer.write(np.float32([part, row]).tobytes())
    return os.path.join(folder, "train-*.tfrecord")


def _collate(records: list[bytes]):
    values = torch.from_numpy(np.frombuffer(b"".join(records), dtype=np.float32).reshape(-1, 2).copy())
    return {"x": values}, values[:, 1]


def _estimator(model_dir) -> te.Estimator:
    def model_fn(model, features, labels, mode):
        return te.EstimatorSpec(mode, loss=((model(features["x"]).squeeze(1) - labels) ** 2).mean())

    return te.Estimator(
        model_fn=model_fn,
        model=lambda: nn.Linear(2, 1),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=1e-6),
        model_dir=model_dir,
        config=te.RunConfig(progress_bar=False, log_step_count_steps=None, save_checkpoints_steps=2),
    )


def _resume_lines(caplog, level: int) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == ESTIMATOR_LOGGER and record.levelno == level and "Input resumes at" in record.getMessage()
    ]


def test_a_shuffle_buffer_resume_logs_one_short_line_and_the_whole_position_at_debug(tmp_path, caplog):
    pattern = _write(tmp_path / "records")

    def input_fn(input_context):
        return TFRecordDataset(
            pattern,
            batch_size=16,
            collate_fn=_collate,
            shuffle_buffer_size=1000,
            num_epochs=None,
            input_context=input_context,
        )

    _estimator(tmp_path / "model").train(input_fn, max_steps=2)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=ESTIMATOR_LOGGER):
        _estimator(tmp_path / "model").train(input_fn, max_steps=4)
    (line,) = _resume_lines(caplog, logging.INFO)
    assert len(line) < 250, line
    # 32 records left the buffer of 1000 (filled from train-0 and train-1), so the reader is in train-1.
    assert line.startswith("Input resumes at TFRecordDataset over 3 files: epoch 0, reading train-1.tfrecord at byte ")
    assert line.endswith(", 32 records consumed in the epoch, 1000 buffered records.")
    (whole,) = _resume_lines(caplog, logging.DEBUG)
    assert "'rng'" in whole and "'buffer_offsets'" in whole and len(whole) > 8000


def test_positions_without_a_buffer_and_of_numpy_inputs_read_as_words(tmp_path):
    pattern = _write(tmp_path)
    dataset = TFRecordDataset(pattern, batch_size=300, collate_fn=_collate, interleave_cycle_length=2)
    next(iter(dataset))
    # Interleaved: 150 records of each of the first two files, 8 bytes each in 16 of framing.
    assert describe_position(dataset, dataset.state_dict()) == (
        "TFRecordDataset over 3 files: epoch 0, reading train-0.tfrecord at byte 3600 (+1 open), "
        "300 records consumed in the epoch"
    )
    two = [TFRecordDataset(pattern, batch_size=20, collate_fn=_collate, num_shards=2, shard_index=1)]
    next(iter(two[0]))  # 3 files for 2 shards: every other record of the stream
    assert describe_position(two[0], two[0].state_dict()) == (
        "TFRecordDataset over 3 files: shard 1, epoch 0, reading train-0.tfrecord at byte 480, "
        "10 records consumed in the epoch"
    )
    x = np.arange(10)
    batches = numpy_input_fn(x, x, batch_size=4, num_epochs=None, shuffle=True)()
    list(zip(range(4), batches))
    assert describe_position(batches, batches.state_dict()) == "epoch 1, row 6 of 10 (16 rows consumed)"


def test_a_position_of_ones_own_iterable_is_cut_to_one_short_line():
    position = {"offsets": list(range(2000))}
    line = describe_position(object(), position)
    assert len(line) <= 200 and line.startswith("{'offsets': [0, 1, 2") and "characters" in line
    assert describe_position(object(), {"batch": 3}) == "{'batch': 3}"
