"""One batch rule for every input helper: `batch_size` is the GLOBAL batch, split evenly across replicas.

numpy_input_fn, pandas_input_fn, dataset_input_fn, TFRecordDataset and TFRecordLoader all take the
global batch, give each of 2 replicas half of it, refuse a batch that does not divide naming both
numbers, and log "global batch B = 2 replicas x B/2 per replica" at start. Under one process nothing
changes.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
from torch.utils.data import Dataset

import torchestimator as te
from torchestimator.data.inputs import dataset_input_fn, numpy_input_fn, pandas_input_fn
from torchestimator.data.tfrecord import TFRecordWriter
from torchestimator.data.tfrecord_dataset import TFRecordDataset
from torchestimator.distribute.input_context import InputContext
from torchestimator.testing import run_in_processes

COUNT = 16


def _context(replicas: int, replica: int) -> InputContext:
    return InputContext(num_replicas_in_sync=replicas, num_input_pipelines=replicas, input_pipeline_id=replica)


class _Rows(Dataset):
    def __len__(self) -> int:
        return COUNT

    def __getitem__(self, index: int):
        return {"x": torch.tensor([float(index)])}, index


def _write_records(folder) -> str:
    """Two files of 8 records each, record i an int64 string of i (the labels 0..15 over both files)."""
    os.makedirs(folder, exist_ok=True)
    for part in range(2):
        with TFRecordWriter(os.path.join(folder, f"part-{part}.tfrecord")) as writer:
            for row in range(part * 8, part * 8 + 8):
                writer.write(str(row).encode())
    return os.path.join(folder, "part-*.tfrecord")


def _labels(records: list[bytes]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    labels = torch.tensor([int(record) for record in records])
    return {"x": labels.float().unsqueeze(1)}, labels


def _helpers(pattern: str):
    """Each input helper as `make(batch_size, input_context)`."""
    x = np.arange(COUNT, dtype=np.float32).reshape(COUNT, 1)
    y = np.arange(COUNT)
    frame = pd.DataFrame({"x": x[:, 0]})
    return {
        "numpy_input_fn": lambda size, context: numpy_input_fn({"x": x}, y, batch_size=size, shuffle=False)(
            input_context=context
        ),
        "pandas_input_fn": lambda size, context: pandas_input_fn(frame, pd.Series(y), batch_size=size, shuffle=False)(
            input_context=context
        ),
        "dataset_input_fn": lambda size, context: dataset_input_fn(_Rows(), batch_size=size, shuffle=False)(
            input_context=context
        ),
        "TFRecordDataset": lambda size, context: TFRecordDataset(
            pattern, batch_size=size, collate_fn=_labels, input_context=context
        ),
        "TFRecordLoader": lambda size, context: TFRecordDataset(
            pattern, batch_size=size, collate_fn=_labels, input_context=context
        ).loader(num_workers=0),
    }


HELPERS = ["numpy_input_fn", "pandas_input_fn", "dataset_input_fn", "TFRecordDataset", "TFRecordLoader"]


def _label_batches(batches) -> list[list[int]]:
    return [torch.as_tensor(labels).tolist() for _, labels in batches]


@pytest.mark.parametrize("helper", HELPERS)
def test_two_replicas_each_get_half_of_the_global_batch_and_the_log_says_so(helper, tmp_path, caplog):
    make = _helpers(_write_records(tmp_path))[helper]
    with caplog.at_level(logging.INFO, logger="torchestimator.data"):
        shares = [_label_batches(make(8, _context(2, replica))) for replica in range(2)]
    assert all(len(batch) == 4 for share in shares for batch in share), shares
    seen = sorted(label for share in shares for batch in share for label in batch)
    assert seen == list(range(COUNT))  # every example once, over the two replicas
    assert "global batch 8 = 2 replicas x 4 per replica" in caplog.text


@pytest.mark.parametrize("helper", HELPERS)
def test_one_process_gets_the_whole_batch(helper, tmp_path, caplog):
    make = _helpers(_write_records(tmp_path))[helper]
    with caplog.at_level(logging.INFO, logger="torchestimator.data"):
        batches = _label_batches(make(8, None))
    assert batches == [list(range(8)), list(range(8, 16))]
    assert "global batch 8 = 1 replica x 8 per replica" in caplog.text


@pytest.mark.parametrize("helper", HELPERS)
def test_a_global_batch_that_does_not_divide_is_refused_naming_both_numbers(helper, tmp_path):
    make = _helpers(_write_records(tmp_path))[helper]
    caller = helper.replace("TFRecordLoader", "TFRecordDataset")
    with pytest.raises(
        ValueError, match=rf"{caller}: The global batch size 6 cannot be split evenly across 4 replicas"
    ):
        list(make(6, _context(4, 1)))


def test_tfrecord_num_shards_are_replicas_too(tmp_path):
    pattern = _write_records(tmp_path)
    shards = [
        _label_batches(TFRecordDataset(pattern, batch_size=8, collate_fn=_labels, num_shards=2, shard_index=index))
        for index in range(2)
    ]
    assert shards == [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14, 15]]]


# --------------------------------------------------------------------------- two processes, as users run them


def _record_batch_sizes(model_dir: str) -> dict[str, list[int]]:
    """In each of 2 gloo processes: the batch each replica's model_fn sees, per input helper."""
    # Each process writes its own copy of the files: the parent reaches no compiled core (a slow test's rule).
    pattern = _write_records(os.path.join(model_dir, f"records-{torch.distributed.get_rank()}"))
    sizes: dict[str, list[int]] = {}

    def model_fn(model, features, labels, mode):
        sizes.setdefault(name, []).append(int(labels.shape[0]))
        return te.EstimatorSpec(mode, loss=model(features["x"]).mean())

    x = np.arange(COUNT, dtype=np.float32).reshape(COUNT, 1)
    input_fns = {
        "numpy_input_fn": numpy_input_fn({"x": x}, np.arange(COUNT), batch_size=8, num_epochs=None, shuffle=True),
        "TFRecordDataset": lambda input_context: TFRecordDataset(
            pattern, batch_size=8, collate_fn=_labels, num_epochs=None, input_context=input_context
        ),
    }
    for name, input_fn in input_fns.items():
        estimator = te.Estimator(
            model_fn=model_fn,
            model=lambda: nn.Linear(1, 1),
            optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.01),
            model_dir=os.path.join(model_dir, name),
            config=te.RunConfig(
                train_distribute=te.MirroredStrategy(num_replicas=2), progress_bar=False, log_step_count_steps=None
            ),
        )
        estimator.train(input_fn, max_steps=3)
    # torch.distributed is initialised here: a TFRecordDataset without input_context splits by the world size.
    sizes["TFRecordDataset(no input_context)"] = [
        len(labels) for _, labels in TFRecordDataset(pattern, batch_size=8, collate_fn=_labels)
    ]
    return sizes


@pytest.mark.slow
@pytest.mark.distributed
def test_every_helper_gives_each_of_two_processes_half_the_global_batch(tmp_path):
    results = run_in_processes(_record_batch_sizes, nprocs=2, args=(str(tmp_path),), timeout=240)
    for sizes in results:
        assert sizes == {
            "numpy_input_fn": [4, 4, 4],
            "TFRecordDataset": [4, 4, 4],
            "TFRecordDataset(no input_context)": [4, 4],
        }
