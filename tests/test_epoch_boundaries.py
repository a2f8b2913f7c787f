"""Epochs are repeated, then batched (TF's `repeat(n).batch(b)`): batches run across epoch boundaries.

10 records, batch 4, num_epochs=None: `[0-3] [4-7] [8 9 0 1] [2-5] ...`, never a short batch; with a
finite num_epochs only the very last batch may be short (drop_remainder drops it). A resumed run yields
exactly the batches the uninterrupted one would, wherever it stopped, across the boundaries too.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import operator
import os
import pathlib

import numpy as np
import pytest
import torch

from torchestimator.data import FixedLenFeature, ImageDecoding, TFRecordWriter, encode_example
from torchestimator.data.inputs import dataset_input_fn, numpy_input_fn
from torchestimator.data.tfrecord_dataset import TFRecordDataset
from torchestimator.distribute.input_context import InputContext
from torchestimator.errors import ImageDecodeError

IMAGES = pathlib.Path(__file__).parent / "fixtures" / "images"


def _records(directory, counts=(10,), compression=None) -> str:
    """File f holds the records b"<global index>" in order: 0..9 for one file of 10."""
    index = 0
    for part, count in enumerate(counts):
        with TFRecordWriter(os.path.join(directory, f"part-{part}.tfrecord"), compression) as writer:
            for _ in range(count):
                writer.write(str(index).encode())
                index += 1
    return os.path.join(directory, "part-*.tfrecord")


def _ints(records: list[bytes]) -> list[int]:
    return [int(record) for record in records]


def _round_trip(state):
    return json.loads(json.dumps(state))


# --------------------------------------------------------------------------- TFRecordDataset


def test_endless_tfrecord_batches_run_across_epochs_and_are_never_short(tmp_path):
    pattern = _records(tmp_path)
    batches = list(itertools.islice(TFRecordDataset(pattern, batch_size=4, num_epochs=None, collate_fn=_ints), 10))
    assert batches[:4] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5]]
    assert all(len(batch) == 4 for batch in batches)


def test_finite_tfrecord_epochs_leave_only_the_very_last_batch_short(tmp_path):
    pattern = _records(tmp_path)
    kept = list(TFRecordDataset(pattern, batch_size=4, num_epochs=3, collate_fn=_ints))
    assert [len(batch) for batch in kept] == [4] * 7 + [2]
    assert functools.reduce(operator.iadd, kept, []) == list(range(10)) * 3
    dropped = list(TFRecordDataset(pattern, batch_size=4, num_epochs=3, collate_fn=_ints, drop_remainder=True))
    assert dropped == kept[:-1]


def test_endless_shuffled_batches_shuffle_each_epoch_apart(tmp_path):
    pattern = _records(tmp_path, counts=(5, 5))
    options = {"batch_size": 4, "num_epochs": None, "collate_fn": _ints, "shuffle_files": True}
    batches = list(itertools.islice(TFRecordDataset(pattern, shuffle_buffer_size=4, **options), 15))
    assert all(len(batch) == 4 for batch in batches)
    rows = functools.reduce(operator.iadd, batches, [])
    epochs = [rows[start : start + 10] for start in range(0, 60, 10)]
    assert all(sorted(epoch) == list(range(10)) for epoch in epochs)  # epochs never mix: each is whole
    assert len({tuple(epoch) for epoch in epochs}) > 1  # and each is shuffled afresh


ENDLESS_CASES = {
    "plain": {},
    "interleave": {"interleave_cycle_length": 2, "shuffle_files": True},
    "buffer": {"shuffle_buffer_size": 4, "shuffle_files": True},
    "gzip_buffer": {"shuffle_buffer_size": 4, "compression": "GZIP"},  # replays: no random access
    "record_shards": {"shuffle_buffer_size": 3, "num_shards": 2, "shard_index": 1, "shard_by": "record"},
}


@pytest.mark.parametrize("case", sorted(ENDLESS_CASES))
def test_an_endless_tfrecord_input_resumes_exactly_across_epoch_boundaries(tmp_path, case):
    options = dict(ENDLESS_CASES[case])
    pattern = _records(tmp_path, counts=(6, 4), compression=options.get("compression"))
    shards = options.get("num_shards", 1)
    options.update(batch_size=3 * shards, num_epochs=None, collate_fn=_ints)  # 3 a shard: 10 (or 5) don't divide
    expected = list(itertools.islice(TFRecordDataset(pattern, **options), 16))
    assert all(len(batch) == 3 for batch in expected)
    for stop in range(12):
        dataset = TFRecordDataset(pattern, **options)
        head = list(itertools.islice(dataset, stop))
        resumed = TFRecordDataset(pattern, **options)
        resumed.load_state_dict(_round_trip(dataset.state_dict()))
        assert head + list(itertools.islice(resumed, 16 - stop)) == expected, f"stopped after {stop}"


def test_the_loader_with_workers_resumes_across_epoch_boundaries(tmp_path):
    pattern = _records(tmp_path, counts=(5, 4, 3, 6))
    options = {"batch_size": 4, "num_epochs": 3, "collate_fn": _ints, "shuffle_buffer_size": 3, "shuffle_files": True}
    expected = list(TFRecordDataset(pattern, **options).loader(num_workers=2))
    # Each worker is a shard of two files an epoch: batches of 4 run across its epochs, only its last is short.
    assert sum(len(batch) for batch in expected) == 54 and sum(len(batch) < 4 for batch in expected) <= 2
    for stop in (3, 7):
        loader = TFRecordDataset(pattern, **options).loader(num_workers=2)
        head = list(itertools.islice(loader, stop))
        resumed = TFRecordDataset(pattern, **options).loader(num_workers=2)
        resumed.load_state_dict(_round_trip(loader.state_dict()))
        assert head + list(resumed) == expected, f"stopped after {stop}"


def test_image_batches_run_across_epochs_and_a_bad_image_is_named_in_the_next_epoch(tmp_path):
    path = str(tmp_path / "images.tfrecord")
    good = (IMAGES / "rgb.png").read_bytes()
    with TFRecordWriter(path) as writer:
        for label, data in enumerate([b"not an image", good, good]):
            writer.write(
                encode_example({"image": [data], "label": [label]}, kinds={"image": "bytes", "label": "int64"})
            )
    features = {"image": FixedLenFeature([], "string"), "label": FixedLenFeature([], "int64")}
    decoding = ImageDecoding(size=(4, 4))
    dataset = TFRecordDataset(
        path, features=features, label_key="label", images={"image": decoding}, batch_size=3, num_epochs=None
    )
    iterator = iter(dataset)
    with pytest.raises(ImageDecodeError, match=r"images.tfrecord: record at offset 0, feature 'image'"):
        next(iterator)  # the bad record is the first of epoch 0
    skip_first = TFRecordDataset(  # start after the bad record: batch [1, 2 | 0] meets it again in epoch 1
        path, features=features, label_key="label", images={"image": decoding}, batch_size=2, num_epochs=None
    )
    plain = TFRecordDataset(path, batch_size=1, num_epochs=None)
    walk = iter(plain)
    next(walk)
    skip_first.load_state_dict(plain.state_dict())
    batches = iter(skip_first)
    _, labels = next(batches)
    assert labels.tolist() == [1, 2]
    with pytest.raises(ImageDecodeError, match=r"images.tfrecord: record at offset 0, feature 'image'"):
        next(batches)


# --------------------------------------------------------------------------- numpy_input_fn and friends


def test_endless_numpy_batches_are_never_short_and_each_epoch_is_whole():
    x = np.arange(10)
    batches = numpy_input_fn(x, x, batch_size=4, num_epochs=None, shuffle=False)()
    taken = [labels.tolist() for _, labels in itertools.islice(batches, 10)]
    assert taken[:3] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    shuffled = numpy_input_fn(x, x, batch_size=4, num_epochs=None, shuffle=True, seed=3)()
    rows = [row for _, labels in itertools.islice(shuffled, 10) for row in labels.tolist()]
    epochs = [rows[start : start + 10] for start in range(0, 40, 10)]
    assert all(sorted(epoch) == list(range(10)) for epoch in epochs) and epochs[0] != epochs[1]


@pytest.mark.parametrize("make", ["numpy", "dataset"])
def test_an_endless_numpy_input_resumes_exactly_across_epoch_boundaries(make):
    x = np.arange(10)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, index):
            return {"x": torch.tensor(index)}, index

    if make == "numpy":
        input_fn = numpy_input_fn({"x": x}, x, batch_size=4, num_epochs=None, shuffle=True, seed=1)
    else:
        input_fn = dataset_input_fn(Rows(), batch_size=4, num_epochs=None, shuffle=True, seed=1)
    expected = [labels.tolist() for _, labels in itertools.islice(input_fn(), 12)]
    for stop in range(9):
        interrupted = input_fn()
        head = [labels.tolist() for _, labels in itertools.islice(interrupted, stop)]
        resumed = input_fn()
        resumed.load_state_dict(_round_trip(interrupted.state_dict()))
        assert head + [labels.tolist() for _, labels in itertools.islice(resumed, 12 - stop)] == expected


def test_a_batch_across_the_boundary_is_split_evenly_over_two_replicas(caplog):
    x = np.arange(10)
    input_fn = numpy_input_fn(x, x, batch_size=4, num_epochs=None, shuffle=True, seed=2)
    single = [labels for _, labels in itertools.islice(input_fn(), 6)]
    with caplog.at_level(logging.WARNING, logger="torchestimator.data.inputs"):
        replicas = [
            [
                labels
                for _, labels in itertools.islice(
                    input_fn(
                        input_context=InputContext(
                            num_replicas_in_sync=2, num_input_pipelines=2, input_pipeline_id=replica
                        )
                    ),
                    6,
                )
            ]
            for replica in range(2)
        ]
    assert "empty batch" not in caplog.text  # endless: no short batch, no empty share
    for step, labels in enumerate(single):
        assert torch.equal(torch.cat([replicas[0][step], replicas[1][step]]), labels)
        assert len(replicas[0][step]) == len(replicas[1][step]) == 2


def test_a_position_of_the_earlier_per_epoch_batches_resumes_at_the_same_row():
    # Before, each epoch ended with its own short batch and the position was {"epoch", "batch"}: epoch 1,
    # batch 1 of 10 rows in batches of 4 meant "rows 0-3 of epoch 1 are done", i.e. stream row 14.
    x = np.arange(10)
    input_fn = numpy_input_fn(x, x, batch_size=4, num_epochs=2, shuffle=True, seed=4)
    rows = [row for _, labels in input_fn() for row in labels.tolist()]
    resumed = input_fn()
    resumed.load_state_dict({"epoch": 1, "batch": 1})
    assert [row for _, labels in resumed for row in labels.tolist()] == rows[14:]
    finished = input_fn()
    finished.load_state_dict({"epoch": 0, "batch": 3})  # the end of epoch 0
    assert [row for _, labels in finished for row in labels.tolist()] == rows[10:]
