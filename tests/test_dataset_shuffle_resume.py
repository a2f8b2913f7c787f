"""A shuffled TFRecordDataset resumes at its position without replaying the epoch: it re-reads the
records that were in the buffer by offset (O(buffer) records), and gives exactly the uninterrupted
sequence; compressed files and old {"epoch", "delivered"} positions resume by replay."""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil

import pytest

import torchestimator.data._dataset_records as dataset_records
import torchestimator.data._dataset_shuffle as dataset_shuffle
from torchestimator.data.tfrecord import DataLossError, TFRecordWriter
from torchestimator.data.tfrecord_dataset import TFRecordDataset


def make_files(directory, counts, compression=None):
    for index, count in enumerate(counts):
        with TFRecordWriter(directory / f"part-{index:02d}.tfrecord", compression) as writer:
            for row in range(count):
                writer.write(f"{index}-{row:05d}".encode())
    return os.fspath(directory / "part-*.tfrecord")


def resumed_after(pattern, options, stop, *, loader_workers=None):
    """The items of a run stopped after `stop` items and resumed from its JSON position."""

    def build():
        dataset = TFRecordDataset(pattern, **options)
        return dataset if loader_workers is None else dataset.loader(num_workers=loader_workers)

    first = build()
    head = list(itertools.islice(first, stop))
    state = json.loads(json.dumps(first.state_dict()))
    second = build()
    second.load_state_dict(state)
    return head + list(second), state


CASES = {
    "batches_two_epochs": {
        "shuffle_buffer_size": 7,
        "batch_size": 3,
        "collate_fn": list,
        "num_epochs": 2,
        "shuffle_files": True,
    },
    "interleave_record_shards": {
        "shuffle_buffer_size": 5,
        "batch_size": 2,
        "collate_fn": list,
        "interleave_cycle_length": 2,
        "num_shards": 2,
        "shard_index": 1,
    },
    "items_bigger_buffer_than_epoch": {"shuffle_buffer_size": 40, "num_epochs": 2},
    "drop_remainder": {
        "shuffle_buffer_size": 4,
        "batch_size": 4,
        "collate_fn": list,
        "drop_remainder": True,
        "num_epochs": 2,
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_resumed_at_every_point_it_gives_the_uninterrupted_sequence(tmp_path, case):
    pattern = make_files(tmp_path, [9, 6, 8])
    options = CASES[case]
    expected = list(TFRecordDataset(pattern, **options))
    for stop in range(len(expected) + 1):
        items, state = resumed_after(pattern, options, stop)
        assert items == expected, f"stopped after {stop}"
        if stop:  # uncompressed files: every position after a delivered item names the buffer's records
            assert "buffer_offsets" in state["shards"][str(options.get("shard_index", 0))]


@pytest.mark.slow
def test_loader_with_workers_resumes_a_shuffled_input_in_the_uninterrupted_order(tmp_path):
    pattern = make_files(tmp_path, [9, 6, 8, 7])
    options = {"shuffle_buffer_size": 6, "batch_size": 2, "collate_fn": list, "num_epochs": 2, "seed": 4}
    expected = list(TFRecordDataset(pattern, **options).loader(num_workers=2))
    for stop in (1, 4, 9, 16):
        items, state = resumed_after(pattern, options, stop, loader_workers=2)
        assert items == expected, f"stopped after {stop}"
        assert all("buffer_offsets" in position for position in state["shards"].values())


@pytest.mark.parametrize("batch_size", [2, 4, None])
def test_loader_positions_rebuilt_from_tags_equal_the_in_process_ones(tmp_path, batch_size):
    # Workers send only the buffer slots that changed with each item; the loader's position must
    # still be the whole one, through the fill, the exchanges, the drain and the next epoch.
    pattern = make_files(tmp_path, [9, 6])
    options = {
        "shuffle_buffer_size": 5,
        "batch_size": batch_size,
        "num_epochs": 2,
        "collate_fn": list if batch_size else None,
    }
    dataset, loader = TFRecordDataset(pattern, **options), TFRecordDataset(pattern, **options).loader()
    for stop, (ours, theirs) in enumerate(zip(dataset, loader), start=1):
        assert ours == theirs
        assert loader.state_dict()["shards"] == dataset.state_dict()["shards"], f"after {stop} items"
    assert stop == {2: 15, 4: 8, None: 30}[batch_size]  # 2 epochs of 15 records; batches of 4 run across


def count_records_read(monkeypatch):
    """Every record handed out by the reader, in small blocks so that the count is close to what is used."""
    counted = {"records": 0}
    real = dataset_records.iter_record_blocks

    def counting(path, compression=None, **options):
        options["block_size"] = 64
        for offsets, records in real(path, compression, **options):
            counted["records"] += len(records)
            yield offsets, records

    real_reread = dataset_shuffle._reread_blocks

    def counting_reread(path, raw, options, start, stats, block_size):
        for offsets, records in real_reread(path, raw, options, start, stats, 64):
            counted["records"] += len(records)
            yield offsets, records

    monkeypatch.setattr(dataset_records, "iter_record_blocks", counting)
    monkeypatch.setattr(dataset_shuffle, "_reread_blocks", counting_reread)
    return counted


def test_resume_reads_the_buffer_not_the_epoch(tmp_path, monkeypatch):
    pattern = make_files(tmp_path, [3000])
    options = {"shuffle_buffer_size": 16, "batch_size": 8, "collate_fn": list}
    dataset = TFRecordDataset(pattern, **options)
    iterator = iter(dataset)
    head = [next(iterator) for _ in range(300)]  # 2400 records delivered
    state = json.loads(json.dumps(dataset.state_dict()))
    expected_next = next(iterator)

    counted = count_records_read(monkeypatch)
    resumed = TFRecordDataset(pattern, **options)
    resumed.load_state_dict(state)
    assert next(iter(resumed)) == expected_next
    # 16 buffered records re-read (a block of 64 bytes holds ~3), then 8 new ones: far from 2400.
    assert counted["records"] <= 16 * 3 + 8 + 8, counted

    counted["records"] = 0
    old = {**state, "shards": {"0": {"epoch": 0, "delivered": state["shards"]["0"]["delivered"]}}}
    replayed = TFRecordDataset(pattern, **options)
    replayed.load_state_dict(old)
    assert next(iter(replayed)) == expected_next
    assert counted["records"] >= 2400 + 16
    assert len(head) == 300


def test_an_old_position_resumes_by_replay_and_says_so(tmp_path, caplog):
    pattern = make_files(tmp_path, [10, 10])
    options = {"shuffle_buffer_size": 5, "num_epochs": 2, "shuffle_files": True}
    expected = list(TFRecordDataset(pattern, **options))
    dataset = TFRecordDataset(pattern, **options)
    state = dataset.state_dict()
    state["shards"] = {"0": {"epoch": 1, "delivered": 7}}  # as saved before the buffer was kept
    dataset.load_state_dict(state)
    with caplog.at_level(logging.INFO, logger="torchestimator.data.tfrecord_dataset"):
        assert list(dataset) == expected[20 + 7 :]
    replays = [record for record in caplog.records if "by replaying 7 records" in record.getMessage()]
    assert len(replays) == 1


@pytest.mark.parametrize("compression", ["GZIP", "auto"])
def test_compressed_files_keep_the_replay_position(tmp_path, compression, caplog):
    pattern = make_files(tmp_path, [12, 9], compression="GZIP")
    options = {"shuffle_buffer_size": 4, "batch_size": 3, "collate_fn": list}
    expected = list(TFRecordDataset(pattern, compression, **options))
    dataset = TFRecordDataset(pattern, compression, **options)
    head = list(itertools.islice(dataset, 4))
    position = dataset.state_dict()["shards"]["0"]
    assert position == {"epoch": 0, "delivered": 12}
    resumed = TFRecordDataset(pattern, compression, **options)
    resumed.load_state_dict(json.loads(json.dumps(dataset.state_dict())))
    with caplog.at_level(logging.INFO, logger="torchestimator.data.tfrecord_dataset"):
        assert head + list(resumed) == expected
    assert any("by replaying 12 records" in record.getMessage() for record in caplog.records)


def test_position_size_grows_with_the_buffer_not_the_epoch(tmp_path):
    pattern = make_files(tmp_path, [3000])
    sizes = {}
    for buffer, stop in ((100, 200), (100, 1500), (1000, 1500)):
        dataset = TFRecordDataset(pattern, shuffle_buffer_size=buffer)
        list(itertools.islice(dataset, stop))
        position = dataset.state_dict()["shards"]["0"]
        assert len(position["buffer_offsets"]) == buffer
        sizes[buffer, stop] = len(json.dumps(dataset.state_dict()))
    assert abs(sizes[100, 200] - sizes[100, 1500]) < 200  # offsets gain a digit or so
    assert sizes[1000, 1500] - sizes[100, 1500] < 900 * 16  # about 13 bytes per slot
    assert sizes[100, 1500] < 10_000  # the RNG state (625 ints) and the reader's position


def test_a_file_changed_since_the_position_was_saved_is_an_error_naming_it(tmp_path):
    pattern = make_files(tmp_path, [50])
    dataset = TFRecordDataset(pattern, shuffle_buffer_size=8)
    list(itertools.islice(dataset, 20))
    state = json.loads(json.dumps(dataset.state_dict()))
    path = tmp_path / "part-00.tfrecord"
    path.write_bytes(b"x" + path.read_bytes())  # every record moves one byte
    resumed = TFRecordDataset(pattern, shuffle_buffer_size=8)
    resumed.load_state_dict(state)
    with pytest.raises(DataLossError, match="part-00.tfrecord"):
        next(iter(resumed))


# ---------------------------------------------------------------------- a position fits only its own files

UNBUFFERED_AND_BUFFERED = {"unbuffered": {}, "buffered": {"shuffle_buffer_size": 8}}


def rewrite_with_same_sizes(path, count):
    """The file's records replaced by others of the same length: every saved offset still frames a record."""
    with TFRecordWriter(path) as writer:
        for row in range(count):
            writer.write(f"x-{row:05d}".encode())


def position_after(pattern, options, stop, *, loader=False):
    dataset = TFRecordDataset(pattern, **options)
    source = dataset.loader() if loader else dataset
    list(itertools.islice(source, stop))
    return json.loads(json.dumps(source.state_dict()))


def resume_first(pattern, options, state, **more):
    resumed = TFRecordDataset(pattern, **{**options, **more})
    resumed.load_state_dict(state)
    return next(iter(resumed))


@pytest.mark.parametrize("kind", sorted(UNBUFFERED_AND_BUFFERED))
@pytest.mark.parametrize("loader", [False, True])
def test_a_file_rewritten_with_same_size_records_is_refused_at_resume(tmp_path, kind, loader):
    pattern = make_files(tmp_path, [30, 30])
    options = UNBUFFERED_AND_BUFFERED[kind]
    state = position_after(pattern, options, 12, loader=loader)
    rewrite_with_same_sizes(tmp_path / "part-00.tfrecord", 30)
    with pytest.raises(DataLossError, match=r"part-00\.tfrecord, which changed.*Restore the files"):
        resume_first(pattern, options, state)


@pytest.mark.parametrize("loader", [False, True])
def test_a_rewritten_file_known_only_by_buffered_records_is_refused(tmp_path, loader):
    # The reader has moved on to part-01; part-00 is closed but the buffer still holds its records.
    pattern = make_files(tmp_path, [10, 10])
    options = {"shuffle_buffer_size": 8}
    state = position_after(pattern, options, 5, loader=loader)
    position = state["shards"]["0"]
    assert [index for index, _ in position["reader"]["open_files"]] == [1] and 0 in position["buffer_files"]
    rewrite_with_same_sizes(tmp_path / "part-00.tfrecord", 10)
    with pytest.raises(DataLossError, match=r"part-00\.tfrecord, which changed"):
        resume_first(pattern, options, state)


@pytest.mark.parametrize("kind", sorted(UNBUFFERED_AND_BUFFERED))
def test_files_passed_in_another_order_are_refused_at_load(tmp_path, kind):
    make_files(tmp_path, [30, 30])
    files = [os.fspath(tmp_path / "part-00.tfrecord"), os.fspath(tmp_path / "part-01.tfrecord")]
    options = UNBUFFERED_AND_BUFFERED[kind]
    state = position_after(files, options, 12)
    (tmp_path / "moved").mkdir()
    for path in files:  # the same files under another directory (another machine): the position still fits
        shutil.copy(path, tmp_path / "moved")
    moved = TFRecordDataset(os.fspath(tmp_path / "moved" / "part-*.tfrecord"), **options)
    moved.load_state_dict(state)
    assert next(iter(moved)) == resume_first(files, options, state)
    swapped = TFRecordDataset(files[::-1], **options)
    with pytest.raises(ValueError, match="another order.*not loading its position"):
        swapped.load_state_dict(state)


def open_offset(state):
    position = state["shards"]["0"]
    open_files = (position.get("reader", position))["open_files"]
    assert open_files and open_files[0][0] == 0, position
    return open_files[0][1]


@pytest.mark.parametrize("kind", sorted(UNBUFFERED_AND_BUFFERED))
@pytest.mark.parametrize("cut", ["at_the_offset", "mid_record"])
def test_a_file_truncated_since_the_position_is_refused_even_with_skip_corrupt(tmp_path, kind, cut):
    pattern = make_files(tmp_path, [40])
    options = {**UNBUFFERED_AND_BUFFERED[kind], "skip_corrupt": True}
    state = position_after(pattern, options, 12)
    offset = open_offset(state)
    os.truncate(tmp_path / "part-00.tfrecord", offset + (5 if cut == "mid_record" else 0))
    with pytest.raises(DataLossError, match=r"part-00\.tfrecord, which changed.*saved: 920 bytes"):
        resume_first(pattern, options, state)


@pytest.mark.parametrize("kind", sorted(UNBUFFERED_AND_BUFFERED))
def test_an_old_position_without_file_identities_still_resumes(tmp_path, kind, monkeypatch, caplog):
    import torchestimator.data.tfrecord_dataset as tfrecord_dataset

    monkeypatch.setattr(tfrecord_dataset, "_unchecked_logged", False)
    pattern = make_files(tmp_path, [30, 30])
    options = UNBUFFERED_AND_BUFFERED[kind]
    expected = list(TFRecordDataset(pattern, **options))
    state = position_after(pattern, options, 12)
    state.pop("files_digest", None)
    for position in state["shards"].values():  # as the previous version saved it
        position.pop("file_ids", None)
        position.get("reader", {}).pop("file_ids", None)
    for _ in range(2):
        resumed = TFRecordDataset(pattern, **options)
        with caplog.at_level(logging.INFO, logger="torchestimator.data.tfrecord_dataset"):
            resumed.load_state_dict(state)
        assert list(resumed) == expected[12:]
    unchecked = [record for record in caplog.records if "without file identities" in record.getMessage()]
    assert len(unchecked) == 1
