"""TFRecordDataset: order, shuffling, epochs, batching, sharding over ranks x workers, exact resume."""

from __future__ import annotations

import collections
import itertools
import json
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from torchestimator.data.tfrecord import DataLossError, TFRecordWriter
from torchestimator.data.tfrecord_dataset import TFRecordDataset, TFRecordLoader
from torchestimator.distribute.input_context import InputContext


def make_files(directory, counts, compression=None):
    """File f holds records b"f-i" for i < counts[f]; returns the glob and all records."""
    records = []
    for index, count in enumerate(counts):
        with TFRecordWriter(directory / f"part-{index:02d}.tfrecord", compression) as writer:
            for row in range(count):
                record = f"{index}-{row}".encode()
                writer.write(record)
                records.append(record)
    return os.fspath(directory / "part-*.tfrecord"), records


def parse_pair(record):
    file_index, row = record.decode().split("-")
    return {"file": int(file_index), "row": int(row)}


def json_round_trip(state):
    return json.loads(json.dumps(state))


# --------------------------------------------------------------------------- order and options


def test_reads_files_in_order_and_interleaves_round_robin(tmp_path):
    pattern, records = make_files(tmp_path, [3, 2, 2])
    assert list(TFRecordDataset(pattern)) == records
    interleaved = list(TFRecordDataset(pattern, interleave_cycle_length=2))
    # Files 0 and 1 alternate; when file 1 ends, file 2 takes its slot.
    assert interleaved == [b"0-0", b"1-0", b"0-1", b"1-1", b"0-2", b"2-0", b"2-1"]


def test_gzip_files_and_auto_detection(tmp_path):
    pattern, records = make_files(tmp_path, [4, 3], compression="GZIP")
    assert list(TFRecordDataset(pattern, "GZIP")) == records
    assert list(TFRecordDataset(pattern, "auto")) == records


def test_shuffling_is_seeded_per_epoch_and_keeps_every_record(tmp_path):
    pattern, records = make_files(tmp_path, [20, 20, 20, 20])

    def epochs(seed):
        items = list(TFRecordDataset(pattern, shuffle_files=True, shuffle_buffer_size=16, seed=seed, num_epochs=2))
        return items[:80], items[80:]

    first, second = epochs(seed=7)
    assert sorted(first) == sorted(records) and sorted(second) == sorted(records)
    assert first != records and first != second  # shuffled, and differently each epoch
    assert epochs(seed=7) == (first, second)
    assert epochs(seed=8)[0] != first


def test_num_epochs_none_repeats_forever(tmp_path):
    pattern, records = make_files(tmp_path, [2, 3])
    items = list(itertools.islice(TFRecordDataset(pattern, num_epochs=None), 3 * len(records) + 1))
    assert items == records * 3 + records[:1]


def test_parse_fn_batches_run_across_epochs_as_repeat_then_batch(tmp_path):
    pattern, _ = make_files(tmp_path, [5])
    batches = list(TFRecordDataset(pattern, parse_fn=parse_pair, batch_size=2, num_epochs=3))
    assert [batch["row"].tolist() for batch in batches] == [[0, 1], [2, 3], [4, 0], [1, 2], [3, 4], [0, 1], [2, 3], [4]]
    assert isinstance(batches[0]["row"], torch.Tensor)
    dropped = list(TFRecordDataset(pattern, parse_fn=parse_pair, batch_size=2, num_epochs=3, drop_remainder=True))
    assert [batch["row"].tolist() for batch in dropped] == [[0, 1], [2, 3], [4, 0], [1, 2], [3, 4], [0, 1], [2, 3]]
    joined = list(TFRecordDataset(pattern, batch_size=3, collate_fn=b"|".join))
    assert joined == [b"0-0|0-1|0-2", b"0-3|0-4"]


def test_option_errors_name_the_option(tmp_path):
    pattern, _ = make_files(tmp_path, [1])
    for options, message in [
        ({"shuffle_buffer_size": -1}, "shuffle_buffer_size"),
        ({"num_epochs": 0}, "num_epochs"),
        ({"batch_size": 0}, "batch_size"),
        ({"interleave_cycle_length": 0}, "interleave_cycle_length"),
        ({"shard_by": "rows"}, "shard_by"),
        ({"num_shards": 2, "shard_index": 2}, "shard_index"),
        ({"num_shards": 2}, "shard_index"),
        ({"num_shards": 2, "shard_index": 0, "input_context": InputContext()}, "not both"),
        ({"shard_by": "file", "num_shards": 2, "shard_index": 0}, "one file per process"),
        ({"max_record_size": -1}, "max_record_size"),
    ]:
        with pytest.raises(ValueError, match=message):
            TFRecordDataset(pattern, **options)
    with pytest.raises(TypeError, match="parse_fn"):
        TFRecordDataset(pattern, parse_fn="json")
    with pytest.raises(ValueError, match="compression"):
        TFRecordDataset(pattern, "LZ4")
    with pytest.raises(FileNotFoundError, match="No files matched"):
        TFRecordDataset(os.fspath(tmp_path / "*.missing"))
    with pytest.raises(ValueError, match="batch_size"):
        TFRecordDataset(pattern).loader(batch_size=4)


def test_a_shard_without_records_fails_instead_of_hanging_forever(tmp_path):
    pattern, _ = make_files(tmp_path, [1])
    dataset = TFRecordDataset(pattern, num_epochs=None, num_shards=2, shard_index=1)
    with pytest.raises(ValueError, match="got no items in epoch 0"):
        next(iter(dataset))


def test_damaged_file_fails_or_is_skipped(tmp_path):
    pattern, records = make_files(tmp_path, [3, 3])
    damaged = tmp_path / "part-00.tfrecord"
    data = bytearray(damaged.read_bytes())
    data[19 + 12] ^= 1  # payload of record 0-1
    damaged.write_bytes(bytes(data))
    with pytest.raises(DataLossError, match="corrupted record at 31 .* starts at byte 19"):
        list(TFRecordDataset(pattern))
    assert list(TFRecordDataset(pattern, skip_corrupt=True)) == [b"0-0", b"0-2"] + records[3:]  # 0-1 alone skipped


def test_max_record_size_reaches_the_reader_in_workers_too(tmp_path):
    path = tmp_path / "big.tfrecord"
    big = b"x" * (2 << 20)
    with TFRecordWriter(path) as writer:
        for record in (b"small", big):
            writer.write(record)
    with pytest.raises(DataLossError, match=f"record too large at 21 .* max_record_size={1 << 20}"):
        list(TFRecordDataset(path, max_record_size=1 << 20))
    with pytest.raises(DataLossError, match="record too large at 21"):
        list(TFRecordDataset(path, max_record_size=1 << 20).loader(num_workers=1))
    assert list(TFRecordDataset(path)) == [b"small", big]


# --------------------------------------------------------------------------- sharding


def read_all_ranks(pattern, num_ranks, num_workers, **options):
    items = []
    for rank in range(num_ranks):
        dataset = TFRecordDataset(pattern, num_shards=num_ranks, shard_index=rank, **options)
        items += list(dataset.loader(num_workers=num_workers))
    return items


@pytest.mark.parametrize("counts, mode", [([5, 3, 4, 6], "file"), ([5, 3, 7], "record")])
def test_two_ranks_by_two_workers_see_every_record_once_per_epoch(tmp_path, counts, mode):
    pattern, records = make_files(tmp_path, counts)
    dataset = TFRecordDataset(pattern, num_shards=2, shard_index=0)
    assert dataset.loader(num_workers=2).state_dict()["shard_mode"] == mode
    items = read_all_ranks(
        pattern, 2, 2, num_epochs=2, shuffle_files=True, shuffle_buffer_size=3, interleave_cycle_length=2
    )
    assert collections.Counter(items) == collections.Counter(records * 2)


def test_input_context_shards_like_num_shards(tmp_path):
    pattern, records = make_files(tmp_path, [4, 4, 4])
    halves = [
        list(
            TFRecordDataset(
                pattern,
                input_context=InputContext(num_replicas_in_sync=2, num_input_pipelines=2, input_pipeline_id=rank),
            )
        )
        for rank in range(2)
    ]
    assert sorted(halves[0] + halves[1]) == sorted(records)
    assert halves[0] == list(TFRecordDataset(pattern, num_shards=2, shard_index=0))
    assert set(halves[0]).isdisjoint(halves[1])


def test_a_plain_dataloader_shards_across_its_workers(tmp_path):
    pattern, records = make_files(tmp_path, [3, 4, 5])
    items = list(DataLoader(TFRecordDataset(pattern), batch_size=None, num_workers=2))
    assert sorted(items) == sorted(records)


# --------------------------------------------------------------------------- resume


RESUME_CASES = {
    "plain": {},
    "interleave": {"interleave_cycle_length": 2, "shuffle_files": True, "num_epochs": 2},
    "buffer": {"shuffle_buffer_size": 5, "shuffle_files": True, "num_epochs": 2},
    "batches": {"batch_size": 3, "parse_fn": parse_pair, "interleave_cycle_length": 3},
    # 18 records an epoch, batches of 4 and 5: batches run across the epoch boundaries.
    "batches_across_epochs": {"batch_size": 4, "parse_fn": parse_pair, "num_epochs": 3},
    "interleaved_batches_across_epochs": {
        "batch_size": 5,
        "collate_fn": list,
        "interleave_cycle_length": 2,
        "shuffle_files": True,
        "num_epochs": 3,
        "drop_remainder": True,
    },
    "buffered_batches_across_epochs": {
        "batch_size": 4,
        "collate_fn": list,
        "shuffle_buffer_size": 5,
        "shuffle_files": True,
        "num_epochs": 3,
    },
    "record_shards": {"num_shards": 2, "shard_index": 1, "interleave_cycle_length": 2, "num_epochs": 2},
}


def comparable(item):
    return {key: value.tolist() for key, value in item.items()} if isinstance(item, dict) else item


@pytest.mark.parametrize("case", sorted(RESUME_CASES))
def test_stopped_and_resumed_it_continues_with_the_next_item(tmp_path, case):
    pattern, _ = make_files(tmp_path, [7, 5, 6], compression="GZIP" if case == "plain" else None)
    options = RESUME_CASES[case]
    compression = "GZIP" if case == "plain" else None
    expected = [comparable(item) for item in TFRecordDataset(pattern, compression, **options)]
    for stop in range(len(expected) + 1):
        dataset = TFRecordDataset(pattern, compression, **options)
        head = [comparable(item) for item in itertools.islice(dataset, stop)]
        resumed = TFRecordDataset(pattern, compression, **options)
        resumed.load_state_dict(json_round_trip(dataset.state_dict()))
        assert head + [comparable(item) for item in resumed] == expected, f"stopped after {stop}"


def test_position_without_buffer_is_file_and_byte_offset(tmp_path):
    pattern, _ = make_files(tmp_path, [3, 3])
    dataset = TFRecordDataset(pattern)
    iterator = iter(dataset)
    next(iterator), next(iterator)
    position = dataset.state_dict()["shards"]["0"]
    assert position["epoch"] == 0 and position["next_file"] == 1 and position["stream_index"] == 2
    assert position["open_files"] == [[0, 2 * (16 + 3)]]  # file 0, next record at byte 38
    buffered = TFRecordDataset(pattern, shuffle_buffer_size=2)
    next(iter(buffered))
    position = buffered.state_dict()["shards"]["0"]
    # Two records filled the buffer, a third took the place of the one handed out: the position
    # names the reader's next record (byte 57) and the two records now in the buffer.
    assert position["epoch"] == 0 and position["delivered"] == 1
    assert position["reader"]["open_files"] == [[0, 3 * (16 + 3)]]
    assert position["buffer_files"] == [0, 0] and 38 in position["buffer_offsets"]
    assert set(position["buffer_offsets"]) < {0, 19, 38}


def test_loader_with_workers_resumes_in_the_uninterrupted_order(tmp_path):
    pattern, _ = make_files(tmp_path, [6, 5, 4, 7])
    options = {"interleave_cycle_length": 2, "num_epochs": 2, "shuffle_files": True}
    expected = list(TFRecordDataset(pattern, **options).loader(num_workers=2))
    for stop in (3, 10):
        loader = TFRecordDataset(pattern, **options).loader(num_workers=2)
        head = list(itertools.islice(loader, stop))
        state = json_round_trip(loader.state_dict())
        resumed = TFRecordDataset(pattern, **options).loader(num_workers=2)
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected


def test_two_ranks_by_two_workers_resume_without_repeats_or_gaps(tmp_path):
    pattern, records = make_files(tmp_path, [5, 6, 4])
    options = {"shuffle_buffer_size": 4, "seed": 3}
    items = []
    for rank in range(2):
        loader = TFRecordDataset(pattern, num_shards=2, shard_index=rank, **options).loader(num_workers=2)
        items += list(itertools.islice(loader, 3))
        resumed = TFRecordDataset(pattern, num_shards=2, shard_index=rank, **options).loader(num_workers=2)
        resumed.load_state_dict(json_round_trip(loader.state_dict()))
        items += list(resumed)
    assert sorted(items) == sorted(records)


def test_iterating_again_without_loading_starts_over(tmp_path):
    pattern, records = make_files(tmp_path, [3])
    dataset = TFRecordDataset(pattern)
    next(iter(dataset))
    assert list(dataset) == records
    dataset.load_state_dict(dataset.state_dict())  # points after the last record
    assert list(dataset) == []


def test_a_position_from_another_sharding_is_refused(tmp_path):
    pattern, _ = make_files(tmp_path, [3, 3])
    loader = TFRecordDataset(pattern).loader(num_workers=2)
    next(iter(loader))
    with pytest.raises(ValueError, match="num_workers=2"):
        TFRecordDataset(pattern).load_state_dict(loader.state_dict())
    rank_zero = TFRecordDataset(pattern, num_shards=2, shard_index=0).state_dict()
    with pytest.raises(ValueError, match="rank=0"):
        TFRecordDataset(pattern, num_shards=2, shard_index=1).load_state_dict(rank_zero)
    with pytest.raises(ValueError, match="not a TFRecordDataset position"):
        TFRecordDataset(pattern).load_state_dict({"epoch": 0, "batch": 3})
    assert isinstance(TFRecordDataset(pattern).loader(), TFRecordLoader)


def tag_with_process(record):
    return record, os.getpid()


def test_loader_reads_in_worker_processes_and_counts_only_delivered_items(tmp_path):
    pattern, _records = make_files(tmp_path, [8, 8])
    loader = TFRecordDataset(pattern, parse_fn=tag_with_process).loader(num_workers=2, prefetch_factor=4)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(3)]
    assert {pid for _, pid in head} - {os.getpid()} and len({pid for _, pid in head}) == 2
    # Workers have prefetched more than 3 items, yet the position counts the 3 handed out:
    # each worker reads one whole file, and its next offset says how many records it gave.
    shards = loader.state_dict()["shards"]
    assert sum(position["open_files"][0][1] // (16 + 3) for position in shards.values()) == 3


# --------------------------------------------------------------------------- with the Estimator


def encode_row(features, label):
    return features.astype("<f4").tobytes() + int(label).to_bytes(8, "little")


def decode_rows(records):
    rows = [np.frombuffer(record[:-8], dtype="<f4") for record in records]
    labels = [int.from_bytes(record[-8:], "little") for record in records]
    return {"x": torch.from_numpy(np.stack(rows))}, torch.tensor(labels)


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_estimator_resume_is_bit_exact_with_tfrecord_input(tmp_path, num_workers):
    from helpers import SmallNet, make_classification, make_estimator

    x, y = make_classification(150)
    for shard in range(3):
        with TFRecordWriter(tmp_path / f"train-{shard}.tfrecord") as writer:
            for row in range(shard, len(x), 3):
                writer.write(encode_row(x[row], y[row]))
    pattern = os.fspath(tmp_path / "train-*.tfrecord")

    def train_input_fn():
        dataset = TFRecordDataset(
            pattern,
            shuffle_files=True,
            shuffle_buffer_size=20,
            seed=1,
            num_epochs=None,
            batch_size=16,
            collate_fn=decode_rows,
        )
        return dataset.loader(num_workers=num_workers) if num_workers else dataset

    def estimator(directory):
        return make_estimator(directory, model=lambda: SmallNet(dropout=0.3), deterministic=True)

    straight = estimator(tmp_path / "straight")
    straight.train(train_input_fn, max_steps=25)
    estimator(tmp_path / "resumed").train(train_input_fn, max_steps=13)  # checkpoints at 10 and 13
    resumed = estimator(tmp_path / "resumed")
    resumed.train(train_input_fn, max_steps=25)
    for name in straight.get_variable_names():
        assert np.array_equal(straight.get_variable_value(name), resumed.get_variable_value(name)), name


def test_a_buffered_record_damaged_since_the_position_was_saved_says_so_not_pass_skip_corrupt(tmp_path):
    """Records in a saved shuffle buffer are read again on resume with skipping off (they were intact once): the
    error names the file and offset and does not tell a user who passed skip_corrupt=True to pass it."""
    path = tmp_path / "big.tfrecord"
    with TFRecordWriter(path) as writer:  # 1 KiB records: the middle lies outside the 4 KiB the position checks
        for row in range(40):
            writer.write(bytes([row]) * 1024)
    dataset = TFRecordDataset(os.fspath(path), shuffle_buffer_size=4, seed=1, skip_corrupt=True)
    iterator = iter(dataset)
    for _ in range(12):
        next(iterator)
    state = json_round_trip(dataset.state_dict())
    damaged = min(state["shards"]["0"]["buffer_offsets"])
    assert 8 * 1024 < damaged < 30 * 1024
    data = bytearray(path.read_bytes())
    data[damaged + 12] ^= 0xFF  # the first byte of a buffered record's data: its CRC no longer fits
    path.write_bytes(bytes(data))
    resumed = TFRecordDataset(os.fspath(path), shuffle_buffer_size=4, seed=1, skip_corrupt=True)
    resumed.load_state_dict(state)
    with pytest.raises(DataLossError) as caught:
        list(resumed)
    assert caught.value.path == os.fspath(path) and caught.value.offset == damaged
    message = str(caught.value)
    assert "pass skip_corrupt=True" not in message and "read intact before" in message and "changed since" in message
