"""skip_corrupt=True keeps every record it can: a bad data CRC skips that record alone, damaged framing
is searched past to the next record whose length CRC *and* data CRC hold, a cut tail ends the file.

Every read runs on both scanners (the compiled `_records` and the pure-Python one, switched through
`tfrecord._core` as in test_native_records.py), which must keep the same records and report the same
regions; block sizes that cut the damage anywhere must not change what is kept.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import struct
import zlib
from typing import Any

import pytest
from helpers import tfrecord_scanner as scanner
from hypothesis import HealthCheck, given, settings, strategies as st

from torchestimator.data import _tfrecord_scan
from torchestimator.data.tfrecord import (
    DataLossError,
    ReadStats,
    iter_record_blocks,
    masked_crc32c,
    read_records,
)
from torchestimator.data.tfrecord_dataset import TFRecordDataset

try:
    from torchestimator._native import _records as COMPILED
except ImportError:  # no build: only the pure-Python scanner runs
    COMPILED = None

SCANNERS = [
    pytest.param(COMPILED, id="compiled", marks=pytest.mark.skipif(COMPILED is None, reason="not built")),
    pytest.param(None, id="pure"),
]
RECORDS = [f"record {index} ".encode() * (index + 2) for index in range(10)]


def framed(data: bytes, *, length: int | None = None) -> bytes:
    """One record by hand, optionally declaring another length (with a valid length CRC)."""
    header = struct.pack("<Q", len(data) if length is None else length)
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def starts(records: list[bytes]) -> list[int]:
    """Where each record of a clean file of `records` starts."""
    return list(itertools.accumulate((16 + len(record) for record in records[:-1]), initial=0))


STREAM = b"".join(framed(record) for record in RECORDS)
OFFSETS = starts(RECORDS)


def write(path: Any, payload: bytes, compression: str | None = None) -> str:
    if compression == "GZIP":
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        payload = compressor.compress(payload) + compressor.flush()
    with open(path, "wb") as file:
        file.write(payload)
    return os.fspath(path)


def read(core: Any, path: str, compression: str | None = None, **options: Any) -> tuple[list[tuple[int, bytes]], Any]:
    """The (offset, record) pairs kept, and the regions as (start, end, reason, error offset, error kind)."""
    stats = ReadStats()
    with scanner(core):
        got = [
            pair
            for offsets, records in iter_record_blocks(path, compression, skip_corrupt=True, stats=stats, **options)
            for pair in zip(offsets, records)
        ]
    regions = [(r.start, r.end, r.reason, r.error.offset, r.error.kind) for r in stats.regions]
    assert stats.errors == [region.error for region in stats.regions]
    assert (stats.skipped_records, stats.skipped_bytes) == (
        sum(region.records for region in stats.regions),
        sum(region.size for region in stats.regions),
    )
    assert stats.skipped_files == (1 if regions else 0) and all(r.path == path for r in stats.regions)
    return got, regions


# --------------------------------------------------------------------------- one kind of damage each


@pytest.mark.parametrize("core", SCANNERS)
def test_a_flipped_data_byte_skips_that_record_alone(tmp_path: Any, core: Any) -> None:
    damaged = bytearray(STREAM)
    damaged[OFFSETS[3] + 12 + 5] ^= 0x01
    got, regions = read(core, write(tmp_path / "f", bytes(damaged)))
    assert [RECORDS.index(record) for _, record in got] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert [offset for offset, _ in got] == [OFFSETS[i] for i in (0, 1, 2, 4, 5, 6, 7, 8, 9)]
    assert regions == [(OFFSETS[3], OFFSETS[4], "data CRC mismatch", OFFSETS[3], "corrupted")]


@pytest.mark.parametrize("core", SCANNERS)
@pytest.mark.parametrize("byte", [0, 2, 7, 8, 11])  # the length (low, middle, top byte) and its CRC
def test_a_flipped_header_byte_is_searched_past_to_the_next_record(tmp_path: Any, core: Any, byte: int) -> None:
    damaged = bytearray(STREAM)
    damaged[OFFSETS[3] + byte] ^= 0x04
    got, regions = read(core, write(tmp_path / "f", bytes(damaged)))
    assert [RECORDS.index(record) for _, record in got] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert regions == [(OFFSETS[3], OFFSETS[4], "length CRC mismatch", OFFSETS[3], "corrupted")]


@pytest.mark.parametrize("core", SCANNERS)
def test_garbage_between_records_is_skipped_and_nothing_is_lost(tmp_path: Any, core: Any) -> None:
    garbage = bytes(range(256)) * 3 + b"\x00" * 40
    payload = STREAM[: OFFSETS[5]] + garbage + STREAM[OFFSETS[5] :]
    got, regions = read(core, write(tmp_path / "f", payload))
    assert [record for _, record in got] == RECORDS
    assert [offset for offset, _ in got][5:] == [offset + len(garbage) for offset in OFFSETS[5:]]
    assert regions == [(OFFSETS[5], OFFSETS[5] + len(garbage), "length CRC mismatch", OFFSETS[5], "corrupted")]


@pytest.mark.parametrize("core", SCANNERS)
@pytest.mark.parametrize("cut", [1, 11, 12, 20])  # inside the header, at the data, inside it
def test_a_truncated_tail_ends_the_file(tmp_path: Any, core: Any, cut: int) -> None:
    path = write(tmp_path / "f", STREAM[: OFFSETS[7] + cut])
    got, regions = read(core, path)
    assert [RECORDS.index(record) for _, record in got] == list(range(7))
    assert regions == [(OFFSETS[7], OFFSETS[7] + cut, "truncated record", OFFSETS[7], "truncated")]
    if cut < 12:  # strict=False: a cut header is TensorFlow's silent end of file, nothing skipped
        assert read(core, path, strict=False) == (got, [])


@pytest.mark.parametrize("core", SCANNERS)
def test_a_header_inside_the_data_is_not_taken_for_a_record(tmp_path: Any, core: Any) -> None:
    # Record 1 carries copies of real headers (their length CRCs hold) in its data: one whose record
    # would fit before the file ends but whose data CRC fails, and one whose record would reach past
    # the end. Record 1's own length is damaged, so the search walks through its data.
    fake_fits = framed(b"x" * 20)[:12] + b"y" * 24  # declares 20 bytes: the data CRC is checked, and fails
    fake_long = framed(b"", length=5000)[:12]  # declares more than the file holds
    carrier = b"head" + fake_fits + fake_long + b"tail"
    records = [b"first", carrier, b"third", b"fourth"]
    payload = bytearray(b"".join(framed(record) for record in records))
    offsets = starts(records)
    payload[offsets[1]] ^= 0x01
    got, regions = read(core, write(tmp_path / "f", bytes(payload)))
    assert got == [(offsets[0], b"first"), (offsets[2], b"third"), (offsets[3], b"fourth")]
    assert regions == [(offsets[1], offsets[2], "length CRC mismatch", offsets[1], "corrupted")]


@pytest.mark.parametrize("core", SCANNERS)
def test_a_whole_record_inside_damaged_data_is_all_the_search_could_take(tmp_path: Any, core: Any) -> None:
    # The limit of "as far as it can be done safely": a record that holds a whole valid record in its data
    # (a TFRecord file stored as a record) and has a damaged header yields that inner record.
    records = [b"first", b"abc" + framed(b"inner") + b"xyz", b"third"]
    payload = bytearray(b"".join(framed(record) for record in records))
    offsets = starts(records)
    payload[offsets[1] + 9] ^= 0x01  # the length CRC
    got, regions = read(core, write(tmp_path / "f", bytes(payload)))
    inner = offsets[1] + 12 + 3
    assert got == [(offsets[0], b"first"), (inner, b"inner"), (offsets[2], b"third")]
    assert [region[:2] for region in regions] == [(offsets[1], inner), (inner + 16 + 5, offsets[2])]


@pytest.mark.parametrize("core", SCANNERS)
def test_damaged_first_and_last_records_and_two_in_a_row(tmp_path: Any, core: Any) -> None:
    damaged = bytearray(STREAM)
    damaged[8] ^= 0x80  # record 0's length CRC: TF's "Is this even a TFRecord file?"
    damaged[OFFSETS[4] + 14] ^= 0x01  # record 4's data
    damaged[OFFSETS[5] + 1] ^= 0x01  # record 5's length
    damaged[-1] ^= 0x01  # record 9's data CRC
    got, regions = read(core, write(tmp_path / "f", bytes(damaged)))
    assert [RECORDS.index(record) for _, record in got] == [1, 2, 3, 6, 7, 8]
    assert [region[:3] for region in regions] == [
        (0, OFFSETS[1], "length CRC mismatch"),
        (OFFSETS[4], OFFSETS[5], "data CRC mismatch"),
        (OFFSETS[5], OFFSETS[6], "length CRC mismatch"),
        (OFFSETS[9], len(STREAM), "data CRC mismatch"),
    ]


@pytest.mark.parametrize("core", SCANNERS)
@pytest.mark.parametrize("block_size", [64, 1 << 20])  # the long record bigger than a block, or inside one
def test_a_length_over_max_record_size_is_searched_past(tmp_path: Any, core: Any, block_size: int) -> None:
    records = [b"small", b"L" * 100, b"after", b"end"]
    offsets = starts(records)
    path = write(tmp_path / "f", b"".join(framed(record) for record in records))
    got, regions = read(core, path, max_record_size=50, block_size=block_size)
    assert got == [(offsets[0], b"small"), (offsets[2], b"after"), (offsets[3], b"end")]
    assert regions == [(offsets[1], offsets[2], "length over max_record_size", offsets[1], "too large")]


@pytest.mark.parametrize("core", SCANNERS)
@pytest.mark.parametrize("block_size", [64, 1 << 20])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_a_length_past_the_end_of_the_file_ends_it(
    tmp_path: Any, core: Any, block_size: int, compression: str | None
) -> None:
    payload = framed(b"one") + framed(b"two") + framed(b"z" * 30, length=10_000) + framed(b"lost")
    path = write(tmp_path / "f", payload, compression)
    got, regions = read(core, path, compression, block_size=block_size)
    assert got == [(0, b"one"), (19, b"two")]
    assert regions == [(38, len(payload), "truncated record", 38, "truncated")]


@pytest.mark.parametrize("core", SCANNERS)
def test_a_gzip_file_skips_the_same_records_at_the_same_offsets(tmp_path: Any, core: Any) -> None:
    damaged = bytearray(STREAM)
    damaged[OFFSETS[2] + 13] ^= 0x01  # data
    damaged[OFFSETS[6] + 3] ^= 0x01  # length
    plain = read(core, write(tmp_path / "plain", bytes(damaged)))
    assert read(core, write(tmp_path / "gz", bytes(damaged), "GZIP"), "GZIP") == plain
    assert [RECORDS.index(record) for _, record in plain[0]] == [0, 1, 3, 4, 5, 7, 8, 9]


@pytest.mark.parametrize("core", SCANNERS)
def test_a_gzip_stream_cut_short_ends_the_file_after_what_it_delivered(tmp_path: Any, core: Any) -> None:
    compressed = open(write(tmp_path / "gz", STREAM, "GZIP"), "rb").read()
    path = write(tmp_path / "cut", compressed[: len(compressed) // 2])
    got, regions = read(core, path, "GZIP")
    ((start, end, reason, offset, kind),) = regions
    assert start == offset == OFFSETS[len(got)] and start <= end < len(STREAM) and kind == "truncated"
    assert reason == "truncated stream" and [record for _, record in got] == RECORDS[: len(got)]


# --------------------------------------------------------------------------- without skip_corrupt


@pytest.mark.parametrize("core", SCANNERS)
def test_without_skip_corrupt_the_first_damage_raises_with_the_library_hint(tmp_path: Any, core: Any) -> None:
    damaged = bytearray(STREAM)
    damaged[OFFSETS[3] + 20] ^= 0x01
    damaged[OFFSETS[6] + 2] ^= 0x01
    path = write(tmp_path / "f", bytes(damaged))
    seen = []
    with scanner(core), pytest.raises(DataLossError) as caught:
        for _, records in iter_record_blocks(path):
            seen += records
    assert seen == RECORDS[:3] and caught.value.offset == OFFSETS[3]
    assert str(caught.value) == (
        f"corrupted record at {OFFSETS[3] + 12} in {path}: the data CRC does not match (the record starts at "
        f"byte {OFFSETS[3]}). Records before it were read; pass skip_corrupt=True to "
        f"TFRecordDataset/read_records/iter_records to skip damaged records and read on."
    )


# --------------------------------------------------------------------------- counts, warnings, summary


def test_stats_and_warnings_name_each_damaged_region_per_file(tmp_path: Any, caplog: Any) -> None:
    first = bytearray(STREAM)
    first[OFFSETS[1] + 13] ^= 0x01
    first[OFFSETS[8] + 9] ^= 0x01
    second = STREAM[: OFFSETS[9] + 5]
    paths = [write(tmp_path / "a", bytes(first)), write(tmp_path / "b", STREAM), write(tmp_path / "c", second)]
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="torchestimator.data.tfrecord"):
        records = list(read_records(paths, skip_corrupt=True, stats=stats))
    assert len(records) == 8 + 10 + 9 == stats.records
    assert [(r.path, r.start, r.end, r.reason) for r in stats.regions] == [
        (paths[0], OFFSETS[1], OFFSETS[2], "data CRC mismatch"),
        (paths[0], OFFSETS[8], OFFSETS[9], "length CRC mismatch"),
        (paths[2], OFFSETS[9], OFFSETS[9] + 5, "truncated record"),
    ]
    skipped_bytes = OFFSETS[2] - OFFSETS[1] + OFFSETS[9] - OFFSETS[8] + 5
    assert (stats.files, stats.skipped_files, stats.skipped_records, stats.skipped_bytes) == (3, 2, 3, skipped_bytes)
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0] == (
        f"Skipped 2 damaged regions in {paths[0]} (skip_corrupt=True; 2 records, {skipped_bytes - 5} bytes): "
        f"bytes {OFFSETS[1]}..{OFFSETS[2]} ({OFFSETS[2] - OFFSETS[1]} bytes): data CRC mismatch; "
        f"bytes {OFFSETS[8]}..{OFFSETS[9]} ({OFFSETS[9] - OFFSETS[8]} bytes): length CRC mismatch"
    )
    assert messages[1].startswith(f"Skipped 1 damaged regions in {paths[2]} (skip_corrupt=True; 1 records, 5 bytes)")
    assert messages[2] == (
        f"Read 27 records ({sum(map(len, records))} bytes) from 3 files; skipped 3 damaged regions "
        f"(3 records, {skipped_bytes} bytes) in 2 files (first: {paths[0]} at offset {OFFSETS[1]})."
    )


# --------------------------------------------------------------------------- any block cut, any resume point


DAMAGE = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
        st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=40)),
        st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 30)),
    ),
    min_size=1,
    max_size=3,
)


def damage(payload: bytes, edits: list[tuple[str, int, Any]]) -> bytes:
    data = bytearray(payload)
    for kind, where, what in edits:
        where %= len(data) + 1
        if kind == "flip" and where < len(data):
            data[where] ^= 1 << what
        elif kind == "insert":
            data[where:where] = what
        elif kind == "delete":
            del data[where : where + what]
    return bytes(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(st.binary(max_size=60), min_size=1, max_size=12),
    edits=DAMAGE,
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_any_damage_reads_the_same_on_both_scanners_any_block_size_and_from_any_resume_point(
    tmp_path: Any, records: list[bytes], edits: Any, cut: int | None
) -> None:
    payload = damage(b"".join(framed(record) for record in records), edits)
    if cut is not None:
        payload = payload[: cut % (len(payload) + 1)]
    path = write(tmp_path / "random", payload)
    cores = [COMPILED, None] if COMPILED is not None else [None]
    expected = read(cores[0], path)
    for core, block_size in itertools.product(cores, [12, 23, 64, 1 << 20]):
        assert read(core, path, block_size=block_size) == expected, (core, block_size)
    got, regions = expected
    # the records kept and the regions skipped cover the file, with no gap and no overlap
    pieces = sorted([(offset, offset + 16 + len(record)) for offset, record in got] + [r[:2] for r in regions])
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    assert not pieces or (pieces[0][0], pieces[-1][1]) == (0, len(payload))
    # resuming at a kept record, or where a skipped region starts, reads on exactly as the whole read did
    for resume in {offset for offset, _ in got} | {region[0] for region in regions}:
        for core in cores:
            again = read(core, path, start_offset=resume)
            assert again[0] == [pair for pair in got if pair[0] >= resume]
            assert again[1] == [region for region in regions if region[0] >= resume]


@settings(max_examples=60, deadline=None)
@given(buffer=st.binary(max_size=200), position=st.integers(0, 200), limit=st.integers(0, 80))
def test_the_compiled_search_equals_the_python_one(buffer: bytes, position: int, limit: int) -> None:
    if COMPILED is None:
        pytest.skip("the compiled core is not built")
    seeded = buffer[: len(buffer) // 2] + framed(buffer[:7]) + buffer[len(buffer) // 2 :]  # one real record in noise
    for data in (buffer, seeded):
        start = min(position, len(data))
        pure = _tfrecord_scan._find_record_python(data, start, len(data), limit)
        assert COMPILED.find(data, start, len(data), limit) == pure
        assert COMPILED.find(bytearray(data) + b"\xff" * 9, start, len(data), limit) == pure  # stale bytes after end
    with pytest.raises(ValueError, match="0 <= position <= end"):
        COMPILED.find(b"abcd", 0, 5, 10)


# --------------------------------------------------------------------------- the dataset resumes exactly


DATASET_CASES = {
    "plain": {},
    "batches": {"batch_size": 3, "collate_fn": list},
    "interleave": {"interleave_cycle_length": 2, "num_epochs": 2},
    "buffer": {"shuffle_buffer_size": 4, "shuffle_files": True, "num_epochs": 2},
}


@pytest.mark.parametrize("case", sorted(DATASET_CASES))
@pytest.mark.parametrize("core", SCANNERS)
def test_a_dataset_stopped_anywhere_around_the_damage_resumes_with_the_next_item(
    tmp_path: Any, caplog: Any, case: str, core: Any
) -> None:
    first = bytearray(STREAM)
    first[OFFSETS[2] + 15] ^= 0x01  # data
    first[OFFSETS[5] + 8] ^= 0x01  # length CRC
    second = STREAM[: OFFSETS[6] + 14]  # a cut tail
    paths = [write(tmp_path / "a.tfrecord", bytes(first)), write(tmp_path / "b.tfrecord", second)]
    options = {**DATASET_CASES[case], "skip_corrupt": True}
    with scanner(core), caplog.at_level(logging.WARNING, logger="torchestimator.data.tfrecord_dataset"):
        expected = list(TFRecordDataset(paths, **options))
        flat = [record for item in expected for record in (item if isinstance(item, list) else [item])]
        epochs = options.get("num_epochs", 1)
        assert sorted(flat) == sorted(([RECORDS[i] for i in (0, 1, 3, 4, 6, 7, 8, 9)] + RECORDS[:6]) * epochs)
        skipped = OFFSETS[3] - OFFSETS[2] + OFFSETS[6] - OFFSETS[5] + 14
        assert f"skipped {3 * epochs} damaged regions ({3 * epochs} records, {skipped * epochs} bytes) in " in (
            caplog.records[-1].getMessage()
        )
        for stop in range(len(expected) + 1):
            stopped = TFRecordDataset(paths, **options)
            head = list(itertools.islice(stopped, stop))
            resumed = TFRecordDataset(paths, **options)
            resumed.load_state_dict(json.loads(json.dumps(stopped.state_dict())))
            assert head + list(resumed) == expected, f"stopped after {stop}"
