"""The compiled TFRecord core (torchestimator._native._records) against the pure-Python path, byte for byte.

Both paths run in this one process: the compiled module is imported directly
(so these comparisons run even with TORCHESTIMATOR_PURE_PYTHON=1, which only
stops the package from *choosing* it) and `tfrecord._core` is switched
between the compiled scanner and `_tfrecord_scan._scan_block_python` for each read. Every read
must give the same records at the same offsets, the same stats, and the same
error: class, message, offset and file.
"""

from __future__ import annotations

import array
import os
import struct
import zlib
from typing import Any

import google_crc32c
import pytest
from helpers import tfrecord_scanner as scanner
from hypothesis import HealthCheck, given, settings, strategies as st

from torchestimator import _native
from torchestimator.cli import main
from torchestimator.data import _tfrecord_scan, tfrecord
from torchestimator.data.tfrecord import (
    DataLossError,
    ReadStats,
    TFRecordWriter,
    describe_reader,
    iter_record_blocks,
    masked_crc32c,
)

records_c = pytest.importorskip(
    "torchestimator._native._records",
    reason="the compiled TFRecord core is not built (run `python setup.py build_ext --inplace`)",
)

COMPILED = records_c  # what tfrecord._core holds when the package runs the compiled path
PURE = None  # tfrecord._core when it runs the pure-Python one
QUICK = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def read_with(scan: Any, path: str, compression: str | None = None, **options: Any) -> tuple[Any, ...]:
    """Everything a read shows: the records with their offsets, the error, the stats."""
    stats = ReadStats()
    got: list[tuple[int, bytes]] = []
    error = None
    with scanner(scan):
        try:
            for offsets, records in iter_record_blocks(path, compression, stats=stats, **options):
                assert all(type(record) is bytes for record in records)
                got.extend(zip(offsets, records))
        except (DataLossError, ValueError) as caught:
            error = (type(caught), str(caught), getattr(caught, "offset", None), getattr(caught, "path", None))
    counts = (
        stats.files,
        stats.records,
        stats.bytes,
        stats.skipped_files,
        [(str(e), e.offset, e.path) for e in stats.errors],
    )
    return got, error, counts


def assert_same(path: str, compression: str | None = None, **options: Any) -> tuple[Any, ...]:
    pure = read_with(PURE, path, compression, **options)
    compiled = read_with(COMPILED, path, compression, **options)
    assert compiled == pure, (options, compression)
    return pure


def framed(data: bytes, *, length: int | None = None) -> bytes:
    """One record by hand, optionally declaring another length (with a valid length CRC)."""
    header = struct.pack("<Q", len(data) if length is None else length)
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def write_file(path: Any, payload: bytes, compression: str | None = None) -> str:
    if compression == "GZIP":
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        payload = compressor.compress(payload) + compressor.flush()
    elif compression == "ZLIB":
        payload = zlib.compress(payload)
    with open(path, "wb") as file:
        file.write(payload)
    return os.fspath(path)


SMALL = [b"abc", b"", b"0123456789" * 2, b"\x00\xff"]
SMALL_FILE = b"".join(framed(record) for record in SMALL)


# --------------------------------------------------------------------------- CRC32C and framing


@QUICK
@given(data=st.binary(max_size=300), crc=st.integers(0, 0xFFFFFFFF), skip=st.integers(0, 7))
def test_crc32c_equals_google_crc32c(data: bytes, crc: int, skip: int) -> None:
    view = memoryview(data)[min(skip, len(data)) :]  # unaligned starts take the bytewise head
    assert records_c.crc32c(view) == google_crc32c.value(bytes(view))
    assert records_c.crc32c(view, crc) == google_crc32c.extend(crc, bytes(view))
    assert records_c.crc32c_table(view, crc) == google_crc32c.extend(crc, bytes(view))  # the fallback method
    assert records_c.masked_crc32c(data) == masked_crc32c(data)


@pytest.mark.parametrize("size", [767, 768, 769, 1000, 24575, 24576, 24577, 2 * 24576 + 768 + 13])
def test_crc32c_at_the_edges_of_the_three_stream_stretches(size: int) -> None:
    data = os.urandom(size + 7)
    for skip in (0, 1, 5):
        view = memoryview(data)[skip : skip + size]
        expected = google_crc32c.extend(0x1234567, bytes(view))
        assert records_c.crc32c(view, 0x1234567) == expected == records_c.crc32c_table(view, 0x1234567)


def test_crc32c_of_big_buffers_and_the_check_value() -> None:
    big = os.urandom((1 << 20) + 13)  # above the size where the GIL is released
    assert records_c.crc32c(big) == google_crc32c.value(big)
    assert records_c.crc32c(b"123456789") == 0xE3069283  # the Castagnoli check value
    assert records_c.CRC32C_METHOD in {"SSE4.2", "table (slicing-by-8)"}


@pytest.mark.parametrize(
    "record",
    [
        b"",
        b"abc",
        bytearray(b"xyz" * 100),
        os.urandom(5000),
        memoryview(array.array("i", [1, 2, 3])),
        memoryview(b"abcdef")[::2],
    ],
    ids=["empty", "abc", "bytearray", "5000", "int-array", "strided"],
)
def test_frame_equals_the_python_framing(record: Any) -> None:
    assert tfrecord._compiled_framer(records_c)(record) == tfrecord._frame_record_python(record)


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_writer_bytes_are_the_same_both_ways(tmp_path: Any, monkeypatch: Any, compression: str | None) -> None:
    records = [os.urandom(n) for n in (0, 1, 100, 70000, 3)] * 5
    contents = {}
    for name, frame in (("compiled", tfrecord._compiled_framer(records_c)), ("pure", tfrecord._frame_record_python)):
        monkeypatch.setattr(tfrecord, "_frame_record", frame)
        path = tmp_path / name
        with TFRecordWriter(path, compression) as writer:
            for record in records:
                writer.write(record)
        contents[name] = path.read_bytes()
    assert contents["compiled"] == contents["pure"]
    assert [record for _, record in read_with(COMPILED, str(tmp_path / "pure"), compression)[0]] == records


# --------------------------------------------------------------------------- the scanner itself


def both_scans(buffer: bytes, position: int, base: int, verify: bool, limit: int) -> tuple[Any, ...]:
    pure = _tfrecord_scan._scan_block_python(buffer, position, base, verify, limit, {})
    compiled = records_c.scan(buffer, position, len(buffer), base, verify, limit)
    assert compiled == pure
    # the reader's reused bytearray, with stale bytes after `end` that must not be read
    assert records_c.scan(bytearray(buffer) + b"\xff" * 20, position, len(buffer), base, verify, limit) == pure
    return pure


@QUICK
@given(
    records=st.lists(st.binary(max_size=40), max_size=8),
    flips=st.lists(st.integers(0, 10**6), max_size=2),
    cut=st.integers(0, 10**6),
    position=st.integers(0, 30),
    base=st.integers(0, 1 << 40),
    verify=st.booleans(),
    limit=st.integers(0, 50),
)
def test_scan_equals_the_python_scanner_on_damaged_buffers(records, flips, cut, position, base, verify, limit):
    buffer = bytearray(b"".join(framed(record) for record in records))
    for flip in flips:
        if buffer:
            buffer[flip % len(buffer)] ^= 1 << (flip % 8)
    buffer = bytes(buffer[: cut % (len(buffer) + 1)])
    both_scans(buffer, min(position, len(buffer)), base, verify, limit)


@QUICK
@given(buffer=st.binary(max_size=64), verify=st.booleans())
def test_scan_equals_the_python_scanner_on_noise(buffer: bytes, verify: bool) -> None:
    both_scans(buffer, 0, 7, verify, tfrecord.DEFAULT_MAX_RECORD_SIZE)


def test_scan_reports_each_status_where_the_python_scanner_does() -> None:
    good = framed(b"hello")
    limit = tfrecord.DEFAULT_MAX_RECORD_SIZE
    assert both_scans(good * 2, 0, 100, True, limit) == ([100, 121], [b"hello"] * 2, 42, _tfrecord_scan._NEED_HEADER, 0)
    assert both_scans(good + good[:15], 0, 0, True, limit)[2:] == (21, _tfrecord_scan._NEED_RECORD, 5)
    bad_length_crc = good + good[:1] + b"\x09" + good[2:]
    assert both_scans(bad_length_crc, 0, 0, True, limit)[2:] == (21, _tfrecord_scan._LENGTH_CRC_BAD, 0)
    assert both_scans(good + good[:-1] + b"\x00", 0, 0, True, limit)[2:] == (21, _tfrecord_scan._DATA_CRC_BAD, 5)
    assert both_scans(good + framed(b"too long"), 0, 0, True, 5)[2:] == (21, _tfrecord_scan._TOO_LARGE, 8)
    huge = framed(b"", length=(1 << 64) - 1)
    assert both_scans(huge, 0, 0, True, limit)[2:] == (0, _tfrecord_scan._NEED_RECORD, (1 << 64) - 1)


def test_scan_of_a_big_buffer_releases_the_gil_and_agrees() -> None:
    buffer = b"".join(framed(os.urandom(n)) for n in range(0, 3000, 7))  # about 640 KB
    _offsets, records, position, status, _ = both_scans(buffer, 0, 0, True, tfrecord.DEFAULT_MAX_RECORD_SIZE)
    assert len(records) == len(range(0, 3000, 7)) and position == len(buffer) and status == _tfrecord_scan._NEED_HEADER


# --------------------------------------------------------------------------- whole files, damaged


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
@pytest.mark.parametrize("strict", [True, False])
def test_every_cut_of_a_small_file_reads_the_same(tmp_path: Any, compression: str | None, strict: bool) -> None:
    whole = open(write_file(tmp_path / "whole", SMALL_FILE, compression), "rb").read()
    path = str(tmp_path / "cut")
    errors = set()
    for cut in range(len(whole) + 1):
        with open(path, "wb") as file:
            file.write(whole[:cut])
        for block_size in (16, 1 << 20):
            _, error, _ = assert_same(path, compression, strict=strict, block_size=block_size)
            errors.add(None if error is None else error[1].split(" at ")[0])
    assert "truncated record" in errors  # the cuts did reach the error paths


@pytest.mark.parametrize("verify", [True, False])
def test_every_bit_flip_of_a_small_file_reads_the_same(tmp_path: Any, verify: bool) -> None:
    path = str(tmp_path / "flipped")
    kinds = set()
    for bit in range(len(SMALL_FILE) * 8):
        damaged = bytearray(SMALL_FILE)
        damaged[bit // 8] ^= 1 << (bit % 8)
        write_file(path, bytes(damaged))
        for block_size in (16, 1 << 20):
            _, error, _ = assert_same(path, verify=verify, strict=bit % 2 == 0, block_size=block_size)
            kinds.add(None if error is None else error[1].split(" at ")[0])
    # with the CRCs checked a flipped length is "corrupted"; unchecked it declares a record the file lacks
    assert ("corrupted record" if verify else "truncated record") in kinds


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_bit_flips_in_compressed_files_read_the_same(tmp_path: Any, compression: str) -> None:
    whole = open(write_file(tmp_path / "whole", SMALL_FILE, compression), "rb").read()
    path = str(tmp_path / "flipped")
    for bit in range(0, len(whole) * 8, 3):
        damaged = bytearray(whole)
        damaged[bit // 8] ^= 1 << (bit % 8)
        write_file(path, bytes(damaged))
        assert_same(path, compression)


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("length", [1 << 60, (1 << 64) - 1, 40, 1 << 21])
def test_huge_declared_lengths_read_the_same(tmp_path: Any, compression: str | None, length: int) -> None:
    payload = framed(b"first") + framed(b"x" * 30, length=length)
    path = write_file(tmp_path / "huge", payload, compression)
    for options in ({}, {"strict": False}, {"max_record_size": 10}, {"max_record_size": 1 << 70}, {"verify": False}):
        got, error, _ = assert_same(path, compression, **options)
        assert [record for _, record in got] == [b"first"] and error is not None


def test_a_record_over_max_record_size_inside_a_block_reads_the_same(tmp_path: Any) -> None:
    path = write_file(tmp_path / "large", framed(b"ok") + framed(b"y" * 100) + framed(b"z"))
    got, error, _ = assert_same(path, max_record_size=50)
    assert [record for _, record in got] == [b"ok"] and error[1].startswith("record too large at 18 ")


def test_skip_corrupt_start_offset_and_many_files_read_the_same(tmp_path: Any) -> None:
    damaged = bytearray(SMALL_FILE)
    damaged[len(framed(SMALL[0])) + 3] ^= 0x10  # the second record's length
    path = write_file(tmp_path / "damaged", bytes(damaged))
    got, error, counts = assert_same(path, skip_corrupt=True)  # the search finds the record after it
    assert error is None and [record for _, record in got] == [SMALL[0], *SMALL[2:]] and counts[3] == 1
    good = write_file(tmp_path / "good", SMALL_FILE)
    offsets = [offset for offset, _ in assert_same(good)[0]]
    for offset in [*offsets, len(SMALL_FILE)]:
        got, error, _ = assert_same(good, start_offset=offset)
        assert error is None and [o for o, _ in got] == [o for o in offsets if o >= offset]
    gzip_path = write_file(tmp_path / "good.gz", SMALL_FILE, "GZIP")
    assert assert_same(gzip_path, "GZIP", start_offset=offsets[2])[0] == assert_same(good)[0][2:]
    assert assert_same(good, start_offset=len(SMALL_FILE) + 1)[1][0] is ValueError


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(st.binary(max_size=3000), max_size=40),
    compression=st.sampled_from([None, "GZIP", "ZLIB"]),
    block_size=st.sampled_from([12, 100, 4096, 1 << 20]),
    verify=st.booleans(),
)
def test_random_files_read_the_same_and_as_written(tmp_path: Any, records, compression, block_size, verify):
    path = str(tmp_path / "random")
    with TFRecordWriter(path, compression) as writer:
        for record in records:
            writer.write(record)
    got, error, _ = assert_same(path, compression, block_size=block_size, verify=verify)
    assert error is None and [record for _, record in got] == records


# --------------------------------------------------------------------------- the compiled loop's buffer


def buffer_sizes(monkeypatch: Any) -> list[int]:
    """The length of every buffer the compiled loop reads into (what `_compact` gives it), as they come."""
    sizes: list[int] = []
    compact = _tfrecord_scan._compact

    def recorded(*arguments: Any) -> bytearray:
        buffer = compact(*arguments)
        sizes.append(len(buffer))
        return buffer

    monkeypatch.setattr(_tfrecord_scan, "_compact", recorded)
    return sizes


def test_a_small_file_gets_a_buffer_of_its_own_size(tmp_path: Any, monkeypatch: Any) -> None:
    """Not two blocks (2 MiB, zero-filled) per file, which was most of the per-file cost of reading many small
    files: what is left of the file and one byte for the read that finds its end. A compressed stream, whose
    length is unknown, keeps two blocks."""
    sizes = buffer_sizes(monkeypatch)
    path = write_file(tmp_path / "small", SMALL_FILE)
    offsets = [offset for offset, _ in assert_same(path)[0]]
    assert sizes and set(sizes) == {len(SMALL_FILE) + 1}, sizes
    sizes.clear()
    assert assert_same(path, start_offset=offsets[2])[0][0][1] == SMALL[2]
    assert set(sizes) == {len(SMALL_FILE) - offsets[2] + 1}, sizes
    sizes.clear()
    assert assert_same(path, start_offset=len(SMALL_FILE))[0] == []
    assert set(sizes) == {1}, sizes
    sizes.clear()
    assert assert_same(path, block_size=16)[1] is None  # blocks smaller than the file: two blocks, or a record
    assert 32 <= max(sizes) <= len(SMALL_FILE) + 1, sizes
    sizes.clear()
    assert assert_same(write_file(tmp_path / "small.gz", SMALL_FILE, "GZIP"), "GZIP")[1] is None
    assert set(sizes) == {2 << 20}, sizes


@pytest.mark.parametrize("block_size", [16, 1 << 20])
def test_a_file_growing_while_read_is_read_to_its_new_end(tmp_path: Any, monkeypatch: Any, block_size: int) -> None:
    """The buffer sized to the file's length at open still takes what is appended after: both paths read
    to the new end."""
    path = write_file(tmp_path / "growing", SMALL_FILE)
    more = [b"appended" * 40, b"x", b"y" * 3000]
    for core in (PURE, COMPILED):
        write_file(path, SMALL_FILE)
        got = []
        with scanner(core):
            blocks = iter_record_blocks(path, block_size=block_size)
            got.extend(next(blocks)[1])
            with open(path, "ab") as file:
                file.write(b"".join(framed(record) for record in more))
            for _, records in blocks:
                got.extend(records)
        assert got == [*SMALL, *more], core


# --------------------------------------------------------------------------- which path is active


def test_scan_refuses_positions_outside_the_buffer() -> None:
    with pytest.raises(ValueError, match="0 <= position <= end <= 4"):
        records_c.scan(b"abcd", 0, 5, 0, True, 10)
    with pytest.raises(ValueError, match="position 3 and end 2"):
        records_c.scan(b"abcd", 3, 2, 0, True, 10)


def test_the_package_runs_the_compiled_scanner_unless_switched_off() -> None:
    compiled = _native.load("_records") is not None
    assert (tfrecord._core is not None) == compiled
    assert (tfrecord._frame_record is not tfrecord._frame_record_python) == compiled
    assert describe_reader().startswith("compiled (" if compiled else "pure Python (")
    if not compiled and os.environ.get(_native.DISABLE_VARIABLE):
        assert f"{_native.DISABLE_VARIABLE}=1" in describe_reader()


def test_records_inspect_says_which_path_reads(tmp_path: Any, capsys: Any) -> None:
    path = write_file(tmp_path / "small", SMALL_FILE)
    assert main(["records", "inspect", path]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"reader: {describe_reader()}"
