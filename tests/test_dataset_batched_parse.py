"""TFRecordDataset(features=..., batch_size=...): one parse_example call per batch, the same items as
parsing record by record, under sharding, workers, interleave, drop_remainder, epochs and skip_corrupt."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import torchestimator.data._dataset_records as dataset_records
import torchestimator.data.tfrecord_dataset as tfrecord_dataset
from torchestimator.data.example import encode_example
from torchestimator.data.parsing import (
    FixedLenFeature,
    RaggedFeature,
    RaggedValue,
    VarLenFeature,
    parse_example,
    parse_single_example,
    to_torch,
)
from torchestimator.data.tfrecord import TFRecordWriter
from torchestimator.data.tfrecord_dataset import TFRecordDataset

NUMERIC = {
    "file": FixedLenFeature([], "int64"),
    "row": FixedLenFeature([], "int64"),
    "dense": FixedLenFeature([3], "float32"),
}
FULL = {
    **NUMERIC,
    "name": FixedLenFeature([], "string"),
    "tokens": VarLenFeature("int64"),
    "ragged": RaggedFeature("float32", value_key="tokens_f"),
}
KINDS = {"file": "int64", "row": "int64", "dense": "float", "name": "bytes", "tokens": "int64", "tokens_f": "float"}


def make_example_files(directory, counts, compression=None):
    """File f, row r: an Example whose values say where it came from (and vary in length)."""
    for index, count in enumerate(counts):
        with TFRecordWriter(directory / f"part-{index:02d}.tfrecord", compression) as writer:
            for row in range(count):
                tokens = list(range(row % 4))
                writer.write(
                    encode_example(
                        {
                            "file": [index],
                            "row": [row],
                            "dense": [row, index, row * 0.5],
                            "name": [f"{index}-{row}".encode()],
                            "tokens": tokens,
                            "tokens_f": [float(token) for token in tokens],
                        },
                        kinds=KINDS,
                    )
                )
    return os.fspath(directory / "part-*.tfrecord")


def per_record(record):
    return parse_single_example(record, NUMERIC)


def as_lists(value):
    """Tensors, sparse tensors, ragged values and object arrays as comparable (value, dtype) pairs."""
    if isinstance(value, dict):
        return {key: as_lists(item) for key, item in value.items()}
    if isinstance(value, RaggedValue):
        return ("ragged", as_lists(value.values), as_lists(value.row_splits))
    if isinstance(value, torch.Tensor) and value.is_sparse:
        return ("sparse", value._indices().tolist(), value._values().tolist(), str(value.dtype), value.shape)
    if isinstance(value, torch.Tensor):
        return (value.tolist(), str(value.dtype), tuple(value.shape))
    if isinstance(value, np.ndarray):
        return (value.tolist(), str(value.dtype), value.shape)
    return value


CASES = {
    "plain": {},
    "epochs_and_remainder": {"num_epochs": 2, "drop_remainder": True},
    "interleave": {"interleave_cycle_length": 2, "shuffle_files": True},
    "record_shards": {"num_shards": 2, "shard_index": 1, "interleave_cycle_length": 3},
    "file_shards": {"num_shards": 3, "shard_index": 2, "shard_by": "file"},
    "record_shards_sequential": {"num_shards": 2, "shard_index": 0, "shard_by": "record", "num_epochs": 2},
    "buffer": {"shuffle_buffer_size": 6, "shuffle_files": True, "num_epochs": 2},
}


def global_batch(per_shard: int, options) -> int:
    """The batch_size (global, split across num_shards processes) that gives each shard `per_shard`."""
    return per_shard * options.get("num_shards", 1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_batched_parse_equals_per_record_parse_and_default_collate(tmp_path, case):
    pattern = make_example_files(tmp_path, [7, 5, 6])
    options = CASES[case]
    size = global_batch(4, options)
    batched = list(TFRecordDataset(pattern, features=NUMERIC, batch_size=size, **options))
    reference = list(TFRecordDataset(pattern, parse_fn=per_record, batch_size=size, **options))
    assert len(batched) == len(reference) > 0
    assert [as_lists(item) for item in batched] == [as_lists(item) for item in reference]
    assert batched[0]["row"].dtype == torch.int64 and batched[0]["dense"].dtype == torch.float32


@pytest.mark.parametrize("case", ["plain", "interleave", "record_shards", "buffer"])
def test_strings_varlen_and_ragged_are_to_torch_of_one_parse_example(tmp_path, case):
    pattern = make_example_files(tmp_path, [7, 5, 6])
    options = CASES[case]
    size = global_batch(5, options)
    batched = list(TFRecordDataset(pattern, features=FULL, batch_size=size, **options))
    groups = list(TFRecordDataset(pattern, batch_size=size, collate_fn=list, **options))
    expected = [to_torch(parse_example(records, FULL)) for records in groups]
    assert [as_lists(item) for item in batched] == [as_lists(item) for item in expected]
    assert batched[0]["tokens"].is_sparse and isinstance(batched[0]["ragged"], RaggedValue)
    assert batched[0]["name"].dtype == object


def test_one_parse_example_call_per_batch(tmp_path, monkeypatch):
    pattern = make_example_files(tmp_path, [9, 8])
    calls = []
    real = tfrecord_dataset.parse_example

    def counting(records, features):
        calls.append(len(records))
        return real(records, features)

    monkeypatch.setattr(tfrecord_dataset, "parse_example", counting)
    batches = list(TFRecordDataset(pattern, features=NUMERIC, batch_size=4))
    # The spec is checked at construction with an empty batch; then one call per batch, across files.
    assert calls == [0, 4, 4, 4, 4, 1] and len(batches) == 5


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"interleave_cycle_length": 2, "num_shards": 2, "shard_index": 1},
        {"shuffle_buffer_size": 5, "num_epochs": 2},
    ],
)
def test_through_loader_workers_the_batches_are_the_in_process_ones(tmp_path, options):
    pattern = make_example_files(tmp_path, [6, 5, 4, 7])
    rank, ranks = options.get("shard_index", 0), options.get("num_shards", 1)
    workers = list(TFRecordDataset(pattern, features=FULL, batch_size=3 * ranks, **options).loader(num_workers=2))
    # Each worker is its own shard (with the process's per-replica batch, 3); DataLoader takes from them in
    # turn, skipping one that ran out. Here each worker is played by one of 2 x ranks processes.
    shards = [
        list(
            TFRecordDataset(
                pattern,
                features=FULL,
                batch_size=3 * 2 * ranks,
                **{**options, "num_shards": 2 * ranks, "shard_index": 2 * rank + worker},
            )
        )
        for worker in range(2)
    ]
    in_turn = [item for pair in itertools.zip_longest(*shards) for item in pair if item is not None]
    assert len(workers) == len(in_turn) > 2
    assert [as_lists(item) for item in workers] == [as_lists(item) for item in in_turn]


def test_unbatched_features_parse_each_record(tmp_path):
    pattern = make_example_files(tmp_path, [3, 2])
    items = list(TFRecordDataset(pattern, features=FULL))
    records = list(TFRecordDataset(pattern))
    assert [as_lists(item) for item in items] == [
        as_lists(to_torch(parse_single_example(record, FULL))) for record in records
    ]
    assert items[4]["row"].tolist() == 1 and items[4]["file"].dtype == torch.int64


def test_skip_corrupt_with_features_skips_the_damaged_record_only(tmp_path):
    pattern = make_example_files(tmp_path, [4, 3])
    damaged = tmp_path / "part-00.tfrecord"
    records = list(TFRecordDataset(os.fspath(damaged)))
    data = bytearray(damaged.read_bytes())
    data[2 * 16 + len(records[0]) + len(records[1]) + 20] ^= 1  # payload of record 0-2
    damaged.write_bytes(bytes(data))
    batches = list(TFRecordDataset(pattern, features=NUMERIC, batch_size=3, skip_corrupt=True))
    rows = [(f, r) for batch in batches for f, r in zip(batch["file"].tolist(), batch["row"].tolist())]
    assert rows == [(0, 0), (0, 1), (0, 3), (1, 0), (1, 1), (1, 2)]


def test_features_errors_name_the_problem(tmp_path):
    pattern = make_example_files(tmp_path, [1])
    with pytest.raises(ValueError, match="cannot be combined with parse_fn"):
        TFRecordDataset(pattern, features=NUMERIC, parse_fn=per_record)
    with pytest.raises(ValueError, match="collate_fn"):
        TFRecordDataset(pattern, features=NUMERIC, batch_size=2, collate_fn=default_collate)
    with pytest.raises(TypeError, match="features must be a non-empty mapping"):
        TFRecordDataset(pattern, features={})
    with pytest.raises(TypeError, match=r"features\['row'\]"):
        TFRecordDataset(pattern, features={"row": "int64"})


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("block_size", [64, None])
def test_batches_cut_from_blocks_hold_the_records_of_the_one_by_one_order(tmp_path, monkeypatch, case, block_size):
    # Batches are sliced out of blocks (whole interleave rounds at once); records are otherwise
    # stepped one by one. Small blocks put block and file boundaries inside batches and rounds.
    if block_size:
        real = dataset_records.iter_record_blocks

        def small_blocks(path, compression=None, **options):
            return real(path, compression, **{**options, "block_size": block_size})

        monkeypatch.setattr(dataset_records, "iter_record_blocks", small_blocks)
    pattern = make_example_files(tmp_path, [23, 9, 17])
    options = {key: value for key, value in CASES[case].items() if key != "drop_remainder"}
    one_by_one = list(TFRecordDataset(pattern, **options))
    for batch_size in (1, 4, 7):
        batches = list(
            TFRecordDataset(pattern, batch_size=global_batch(batch_size, options), collate_fn=list, **options)
        )
        assert [record for batch in batches for record in batch] == one_by_one, batch_size


def test_label_key_hands_out_the_pair_an_input_fn_returns(tmp_path):
    pattern = make_example_files(tmp_path, [3, 2])
    pairs = list(TFRecordDataset(pattern, features=NUMERIC, label_key="row", batch_size=2))
    plain = list(TFRecordDataset(pattern, features=NUMERIC, batch_size=2))
    assert len(pairs) == len(plain) == 3
    for (features, labels), batch in zip(pairs, plain):
        assert set(features) == {"file", "dense"}
        assert torch.equal(labels, batch["row"]) and torch.equal(features["dense"], batch["dense"])
    features, label = next(iter(TFRecordDataset(pattern, features=NUMERIC, label_key="row")))
    assert label.tolist() == 0 and set(features) == {"file", "dense"}


def test_label_key_errors_name_the_problem(tmp_path):
    pattern = make_example_files(tmp_path, [1])
    with pytest.raises(ValueError, match=r"label_key 'label' is not one of features= \(\['dense', 'file', 'row'\]\)"):
        TFRecordDataset(pattern, features=NUMERIC, label_key="label")
    with pytest.raises(ValueError, match="pass features= too"):
        TFRecordDataset(pattern, label_key="row", parse_fn=per_record)


def test_an_estimator_trains_on_features_with_label_key(tmp_path):
    from helpers import make_estimator

    from torchestimator import EstimatorSpec

    pattern = make_example_files(tmp_path, [6, 6])
    seen = []

    def model_fn(model, features, labels, mode):
        seen.append(labels.tolist())
        prediction = model(features["dense"]).squeeze(1)
        return EstimatorSpec(mode, loss=((prediction - labels.float()) ** 2).mean())

    def input_fn(input_context):
        return TFRecordDataset(pattern, features=NUMERIC, label_key="row", batch_size=4, input_context=input_context)

    estimator = make_estimator(tmp_path / "model", model=lambda: torch.nn.Linear(3, 1), model_fn=model_fn)
    estimator.train(input_fn)
    assert seen == [[0, 1, 2, 3], [4, 5, 0, 1], [2, 3, 4, 5]]
