"""TFRecord framing: byte-exact writing (formats.md 1.2, 1.3), reading, damage, file lists."""

from __future__ import annotations

import gzip
import logging
import os
import zlib

import pytest

from torchestimator.data.tfrecord import (
    DataLossError,
    ReadStats,
    TFRecordWriter,
    iter_record_blocks,
    iter_records,
    list_files,
    masked_crc32c,
    read_records,
    unmask_crc32c,
)

ABC_RECORD = bytes.fromhex("03 00 00 00 00 00 00 00 b0 99 49 0e 61 62 63 6e 57 f1 21")
EMPTY_RECORD = bytes.fromhex("00 00 00 00 00 00 00 00 29 03 98 07 d8 ea 82 a2")
GZIP_ABC_DEFG = bytes.fromhex(
    "1f 8b 08 00 00 00 00 00 00 03 63 66 80 80 0d 33 3d f9 12 93 92 f3 c2 3f 2a b2 40 85 9c "
    "5c 83 58 52 52 d3 d2 d5 d9 a5 17 02 00 d7 ce 76 ac 27 00 00 00"
)


def write(path, records, compression=None):
    with TFRecordWriter(path, compression) as writer:
        for record in records:
            writer.write(record)
    return os.fspath(path)


# --------------------------------------------------------------------------- worked bytes


@pytest.mark.parametrize(
    "data, masked",
    [
        (b"", 0xA282EAD8),
        (b"abc", 0x21F1576E),
        (bytes(8), 0x07980329),
        (bytes.fromhex("0300000000000000"), 0x0E4999B0),
        (b"123456789", 0xC78AB0E5),
    ],
)
def test_masked_crc32c_matches_the_worked_values(data, masked):
    assert masked_crc32c(data) == masked


def test_unmask_inverts_the_mask_and_gives_the_castagnoli_check_value():
    assert unmask_crc32c(masked_crc32c(b"123456789")) == 0xE3069283
    assert unmask_crc32c(0xA282EAD8) == 0
    assert unmask_crc32c(0x21F1576E) == 0x364B3FB7


def test_writer_bytes_equal_tensorflow_for_abc_and_empty_records(tmp_path):
    assert open(write(tmp_path / "abc", [b"abc"]), "rb").read() == ABC_RECORD
    assert open(write(tmp_path / "empty", [b""]), "rb").read() == EMPTY_RECORD
    assert open(write(tmp_path / "none", []), "rb").read() == b""


def test_gzip_and_zlib_bytes_equal_tensorflow(tmp_path):
    gzip_bytes = open(write(tmp_path / "g", [b"abc", b"defg"], "GZIP"), "rb").read()
    assert gzip_bytes == GZIP_ABC_DEFG
    zlib_bytes = open(write(tmp_path / "z", [b"abc", b"defg"], "ZLIB"), "rb").read()
    assert len(zlib_bytes) == 38
    assert zlib_bytes.startswith(bytes.fromhex("78 9c 63 66 80 80"))
    assert zlib_bytes.endswith(bytes.fromhex("17 02 00 8e 96 08 02"))
    # The compressed stream is the plain framed stream, compressed as a whole.
    assert zlib.decompress(zlib_bytes) == gzip.decompress(gzip_bytes)
    assert gzip.decompress(gzip_bytes)[:19] == ABC_RECORD


def test_reader_reads_the_worked_bytes(tmp_path):
    path = tmp_path / "tf.gz"
    path.write_bytes(GZIP_ABC_DEFG)
    assert list(iter_records(path, "GZIP")) == [(0, b"abc"), (19, b"defg")]
    plain = tmp_path / "tf"
    plain.write_bytes(ABC_RECORD + EMPTY_RECORD)
    assert list(iter_records(plain)) == [(0, b"abc"), (19, b"")]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("compression", [None, "", "GZIP", "ZLIB", "gzip"])
def test_round_trip_with_empty_big_and_many_records(tmp_path, compression):
    big = os.urandom(1 << 20) + b"tail"  # over 1 MiB: bigger than one read block
    records = [b"", b"x", big] + [bytes([i % 256]) * (i % 300) for i in range(2000)] + [b""]
    path = write(tmp_path / "data.tfrecord", records, compression)
    assert list(read_records(path, compression)) == records
    offsets = [offset for offset, _ in iter_records(path, compression)]
    expected, position = [], 0
    for record in records:
        expected.append(position)
        position += 16 + len(record)
    assert offsets == expected


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_small_blocks_cut_records_everywhere_and_still_read_right(tmp_path, compression):
    records = [os.urandom(size) for size in (0, 1, 5, 11, 12, 13, 40, 3, 100)]
    path = write(tmp_path / "data", records, compression)
    for block_size in (1, 7, 16, 33):
        blocks = list(iter_record_blocks(path, compression, block_size=block_size))
        assert [record for _, chunk in blocks for record in chunk] == records


def test_empty_files_have_no_records(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert list(iter_records(empty)) == []
    assert list(iter_records(empty, "GZIP")) == []
    assert list(read_records(write(tmp_path / "g", [], "GZIP"), "GZIP")) == []
    assert list(read_records(write(tmp_path / "z", [], "ZLIB"), "ZLIB")) == []


def test_auto_compression_detects_gzip_zlib_and_plain(tmp_path):
    records = [b"a" * 50, b"bcd"]
    for compression in (None, "GZIP", "ZLIB"):
        path = write(tmp_path / f"data-{compression}", records, compression)
        assert list(read_records(path, "auto")) == records
    # A plain record whose length bytes look like a zlib header (0x78 0x9c) stays plain.
    ambiguous = [b"q" * 0x9C78]
    path = write(tmp_path / "ambiguous", ambiguous)
    assert open(path, "rb").read(2) == b"\x78\x9c"
    assert list(read_records(path, "auto")) == ambiguous


def test_multi_member_gzip_is_read_whole(tmp_path):
    first = open(write(tmp_path / "a", [b"one"], "GZIP"), "rb").read()
    second = gzip.compress(open(write(tmp_path / "b", [b"two", b"three"]), "rb").read())
    path = tmp_path / "joined.gz"
    path.write_bytes(first + second)
    assert list(iter_records(path, "GZIP")) == [(0, b"one"), (19, b"two"), (38, b"three")]


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_start_offset_resumes_at_the_next_record(tmp_path, compression):
    records = [b"first", b"second", b"third"]
    path = write(tmp_path / "data", records, compression)
    (offset, record), *_ = iter_records(path, compression)
    resume = offset + 16 + len(record)
    assert [r for _, r in iter_records(path, compression, start_offset=resume)] == records[1:]
    end = sum(16 + len(r) for r in records)
    assert list(iter_records(path, compression, start_offset=end)) == []
    with pytest.raises(ValueError, match="past the end"):
        list(iter_records(path, compression, start_offset=end + 1))
    with pytest.raises(ValueError, match="start_offset must be an integer"):
        list(iter_records(path, compression, start_offset=-1))


# --------------------------------------------------------------------------- damage


def damaged(tmp_path, edit, name="bad.tfrecord"):
    """Three records abc (0), defg (19), hi (39); `edit` changes the bytes."""
    data = bytearray(open(write(tmp_path / "good", [b"abc", b"defg", b"hi"]), "rb").read())
    path = tmp_path / name
    path.write_bytes(bytes(edit(data)))
    return os.fspath(path)


def flip(index):
    def edit(data):
        data[index] ^= 0x01
        return data

    return edit


def collect(path, **options):
    records = []
    with pytest.raises(DataLossError) as caught:
        for _, record in iter_records(path, **options):
            records.append(record)
    return records, caught.value


def test_corrupt_data_crc_names_file_and_offset_after_the_good_records(tmp_path):
    path = damaged(tmp_path, flip(19 + 16 + 3))  # last byte of defg's data CRC
    records, error = collect(path)
    assert records == [b"abc"]
    assert (error.path, error.offset) == (path, 19)
    # TensorFlow's number for a data CRC mismatch is the data's offset: record start + 12.
    assert str(error).startswith(f"corrupted record at 31 in {path}")
    assert "the record starts at byte 19" in str(error)
    assert isinstance(error, ValueError)


def test_corrupt_payload_byte_is_caught_by_the_data_crc(tmp_path):
    records, error = collect(damaged(tmp_path, flip(19 + 12)))
    assert records == [b"abc"] and error.offset == 19 and "data CRC" in str(error)


def test_corrupt_length_crc_at_the_start_asks_if_this_is_a_tfrecord_file(tmp_path):
    path = damaged(tmp_path, flip(8))
    records, error = collect(path)
    assert records == [] and error.offset == 0
    assert str(error).startswith(f"corrupted record at 0 in {path} (Is this even a TFRecord file?)")


def test_corrupt_length_itself_is_caught_before_reading_a_huge_record(tmp_path):
    records, error = collect(damaged(tmp_path, flip(19 + 6)))  # a high byte of defg's length
    assert records == [b"abc"] and error.offset == 19 and "length CRC" in str(error)


def test_verify_false_skips_the_crc_checks(tmp_path):
    path = damaged(tmp_path, flip(19 + 12))
    assert [r for _, r in iter_records(path, verify=False)] == [b"abc", b"eefg", b"hi"]
    wild_length = damaged(tmp_path, flip(19 + 7), name="wild")  # length 2**56 + 4
    records, error = collect(wild_length, verify=False)
    assert records == [b"abc"] and "truncated record at 19" in str(error)


def test_truncated_data_raises_truncated_record_even_when_not_strict(tmp_path):
    path = damaged(tmp_path, lambda data: data[: 39 + 15])  # 15 bytes into "hi"'s 18
    for strict in (True, False):
        records, error = collect(path, strict=strict)
        assert records == [b"abc", b"defg"]
        assert error.offset == 39 and str(error).startswith(f"truncated record at 39 in {path}")


def test_truncated_header_raises_when_strict_and_is_eof_like_tensorflow_otherwise(tmp_path):
    path = damaged(tmp_path, lambda data: data[: 39 + 5])
    records, error = collect(path)
    assert records == [b"abc", b"defg"] and error.offset == 39 and "truncated" in str(error)
    assert [r for _, r in iter_records(path, strict=False)] == [b"abc", b"defg"]


def test_wrong_compression_is_data_loss(tmp_path):
    gzip_path = write(tmp_path / "g", [b"abc"], "GZIP")
    records, error = collect(gzip_path)
    assert records == [] and "corrupted record at 0" in str(error)
    plain_path = write(tmp_path / "p", [b"abc"])
    for compression in ("GZIP", "ZLIB"):
        records, error = collect(plain_path, compression=compression)
        assert records == [] and error.offset == 0 and "inflate failed" in str(error)


def test_truncated_gzip_stream_is_data_loss(tmp_path):
    data = open(write(tmp_path / "g", [b"abc" * 100, b"defg"], "GZIP"), "rb").read()
    path = tmp_path / "cut.gz"
    path.write_bytes(data[:-6])  # cuts the gzip trailer: all records decompress, the stream does not end
    records, error = collect(path, compression="GZIP")
    assert records == [b"abc" * 100, b"defg"]  # what was decompressed is handed out first
    assert str(error).startswith("truncated record at 336") and "before its end marker" in str(error)
    assert error.offset == 336


def test_skip_corrupt_skips_the_damaged_record_only_and_counts(tmp_path, caplog):
    good = write(tmp_path / "a-good", [b"one", b"two"])
    bad = damaged(tmp_path, flip(19 + 12), name="b-bad")
    also_good = write(tmp_path / "c-good", [b"three"])
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="torchestimator.data.tfrecord"):
        records = list(read_records([good, bad, also_good], skip_corrupt=True, stats=stats))
    assert records == [b"one", b"two", b"abc", b"hi", b"three"]
    assert (stats.files, stats.records, stats.skipped_files) == (3, 5, 1)
    assert (stats.skipped_records, stats.skipped_bytes) == (1, 20)
    assert stats.bytes == len(b"onetwoabchithree")
    assert (stats.errors[0].path, stats.errors[0].offset) == (bad, 19)
    assert [(region.path, region.start, region.end) for region in stats.regions] == [(bad, 19, 39)]
    messages = [record.getMessage() for record in caplog.records]
    assert any(bad in message and "bytes 19..39 (20 bytes): data CRC mismatch" in message for message in messages)
    assert "skipped 1 damaged regions (1 records, 20 bytes) in 1 files" in messages[-1]
    with pytest.raises(DataLossError, match="pass skip_corrupt=True to TFRecordDataset/read_records"):
        list(read_records([good, bad, also_good]))


def test_iter_records_skip_corrupt_goes_on_after_the_damaged_record_quietly(tmp_path):
    stats = ReadStats()
    path = damaged(tmp_path, flip(39 + 12))
    assert [r for _, r in iter_records(path, skip_corrupt=True, stats=stats)] == [b"abc", b"defg"]
    assert stats.skipped_files == 1 and stats.errors[0].offset == 39 and stats.regions[0].end == 57


# --------------------------------------------------------------------------- declared lengths


def test_a_length_past_the_end_of_a_plain_file_is_truncated_before_it_is_read(tmp_path):
    path = write(tmp_path / "data", [b"abc", b"x" * (3 << 20)])
    data = bytearray(open(path, "rb").read())
    path = tmp_path / "long"
    path.write_bytes(bytes(data[: 19 + 16 + (2 << 20)]))  # the big record is cut 1 MiB short
    records, error = collect(path)
    assert records == [b"abc"] and error.offset == 19
    assert str(error).startswith(f"truncated record at 19 in {path}")
    assert f"declares {3 << 20} bytes of data but the file ends {16 + (2 << 20)} bytes into" in str(error)


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_a_record_over_max_record_size_says_how_to_raise_the_limit(tmp_path, compression):
    big = b"0123456789abcdef" * (3 << 16)  # 3 MiB, more than a read block
    path = write(tmp_path / "data", [b"abc", big, b"after"], compression)
    records, error = collect(path, compression=compression, max_record_size=1 << 20)
    assert records == [b"abc"] and (error.path, error.offset) == (path, 19)
    assert str(error).startswith(
        f"record too large at 19 in {path}: it declares {len(big)} bytes, more than max_record_size={1 << 20}"
    )
    assert f"pass max_record_size={len(big)} or more" in str(error)
    assert f"--max_record_size {len(big)}" in str(error)
    # A plain file is known to hold it; a compressed one may also just have a damaged length.
    assert ("file holds a record this large" in str(error)) == (compression is None)
    assert [r for _, r in iter_records(path, compression, max_record_size=len(big))] == [b"abc", big, b"after"]
    with pytest.raises(ValueError, match="max_record_size must be an integer >= 0"):
        list(iter_records(path, compression, max_record_size=-1))


def test_the_default_limit_is_protobufs(tmp_path):
    from torchestimator.data import tfrecord

    assert tfrecord.DEFAULT_MAX_RECORD_SIZE == 2**31 - 1
    path = write(tmp_path / "data", [b"abc", b"x" * 5000])
    assert list(read_records(path)) == [b"abc", b"x" * 5000]


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_every_record_over_max_record_size_is_refused_however_small(tmp_path, compression):
    """A record inside a read block is bounded too (it once passed unless it was bigger than a block)."""
    path = write(tmp_path / "data", [b"abc", b"y" * 157, b"z" * 488, b"after"], compression)
    records, error = collect(path, compression=compression, max_record_size=10)
    assert records == [b"abc"] and (error.path, error.offset) == (path, 19)
    assert str(error).startswith(
        f"record too large at 19 in {path}: it declares 157 bytes, more than "
        "max_record_size=10. The file holds a record this large"
    )
    assert "--max_record_size 157" in str(error)
    records, error = collect(path, compression=compression, max_record_size=157)
    assert records == [b"abc", b"y" * 157] and error.offset == 19 + 157 + 16
    assert "it declares 488 bytes" in str(error)
    assert list(read_records(path, compression, max_record_size=488)) == [b"abc", b"y" * 157, b"z" * 488, b"after"]
    with pytest.raises(DataLossError, match="record too large at 0 .* declares 3 bytes, more than max_record_size=0"):
        list(read_records(path, compression, max_record_size=0))
    # The limit is the data's length, as the message says: a record of exactly max_record_size bytes is read.
    assert list(
        read_records(write(tmp_path / "exact", [b"0123456789"], compression), compression, max_record_size=10)
    ) == [b"0123456789"]


def test_a_plain_file_that_grew_since_it_was_opened_is_read_whole(tmp_path):
    big = os.urandom(3 << 20)
    full = open(write(tmp_path / "full", [b"abc", big]), "rb").read()
    path = tmp_path / "growing"
    path.write_bytes(full[: 19 + 100])  # a writer is still appending
    blocks = iter_record_blocks(path, block_size=19)
    assert next(blocks) == ([0], [b"abc"])  # the size is not looked up yet
    with open(path, "ab") as file:
        file.write(full[19 + 100 :])
    assert next(blocks) == ([19], [big])


@pytest.fixture
def small_probe(monkeypatch):
    """Compressed records over 2 KiB go through the probe (64 MiB in real use)."""
    from torchestimator.data import tfrecord

    monkeypatch.setattr(tfrecord, "_PROBE_SIZE", 2048)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_big_compressed_records_are_probed_then_read_exactly(tmp_path, compression, small_probe):
    records = [b"a", os.urandom(50_000), b"b" * 3000, b"", os.urandom(9000)]
    path = write(tmp_path / "data", records, compression)
    for block_size in (100, 1 << 20):
        blocks = list(iter_record_blocks(path, compression, block_size=block_size))
        assert [record for _, chunk in blocks for record in chunk] == records
    stream = open(write(tmp_path / "plain", records), "rb").read()
    joined = tmp_path / "joined.gz"  # gzip members split right after the big record's header
    joined.write_bytes(gzip.compress(stream[: 17 + 12]) + gzip.compress(stream[17 + 12 :]))
    for block_size in (17 + 12, 100):  # the probe starts at the end of a member, or inside the next
        blocks = list(iter_record_blocks(joined, "GZIP", block_size=block_size))
        assert [record for _, chunk in blocks for record in chunk] == records


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_the_probe_finds_a_bad_data_crc_or_a_short_stream_before_reading(tmp_path, compression, small_probe):
    from torchestimator.data import tfrecord

    big = os.urandom(60_000)
    stream = bytearray(open(write(tmp_path / "plain", [b"abc", big]), "rb").read())
    stream[-1] ^= 1  # in the data CRC
    path = tmp_path / "bad-crc"
    path.write_bytes(tfrecord_bytes(bytes(stream), compression))
    records, error = collect_blocks(path, compression, block_size=100)
    assert records == [b"abc"] and error.offset == 19
    assert str(error).startswith(f"corrupted record at 31 in {path}") and "data CRC" in str(error)
    for cut in (len(stream) - 10_000, 19 + 12 + 5000):
        short = tmp_path / f"short-{cut}"
        short.write_bytes(tfrecord_bytes(bytes(stream[:cut]), compression))
        records, error = collect_blocks(short, compression, block_size=100)
        assert records == [b"abc"] and error.offset == 19
        assert str(error).startswith(f"truncated record at 19 in {short}")
        assert (
            f"declares {len(big)} bytes of data but the decompressed stream ends {cut - 19} bytes into the record"
        ) in str(error)
    unverified = list(iter_record_blocks(path, compression, verify=False, block_size=100))
    assert unverified == [([0], [b"abc"]), ([19], [big])]
    assert tfrecord._PROBE_SIZE == 2048


def collect_blocks(path, compression, **options):
    records = []
    with pytest.raises(DataLossError) as caught:
        for _, chunk in iter_record_blocks(path, compression, **options):
            records += chunk
    return records, caught.value


def tfrecord_bytes(stream, compression):
    """A record stream as a properly ended GZIP/ZLIB file."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31 if compression == "GZIP" else 15)
    return compressor.compress(stream) + compressor.flush()


# --------------------------------------------------------------------------- files


def test_list_files_expands_globs_sorted_and_keeps_list_order(tmp_path):
    for name in ("b.tfrecord", "a.tfrecord", "c.tfrecord", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "dir.tfrecord").mkdir()
    pattern = os.fspath(tmp_path / "*.tfrecord")
    names = [os.path.basename(path) for path in list_files(pattern)]
    assert names == ["a.tfrecord", "b.tfrecord", "c.tfrecord"]
    listed = list_files([tmp_path / "c.tfrecord", pattern])
    assert [os.path.basename(path) for path in listed] == ["c.tfrecord", "a.tfrecord", "b.tfrecord", "c.tfrecord"]


def test_read_records_reads_files_of_a_glob_in_order(tmp_path):
    write(tmp_path / "part-1", [b"c"])
    write(tmp_path / "part-0", [b"a", b"b"])
    assert list(read_records(os.fspath(tmp_path / "part-*"))) == [b"a", b"b", b"c"]


def test_list_files_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"No files matched pattern .*\*\.tfrecord"):
        list_files(os.fspath(tmp_path / "*.tfrecord"))
    with pytest.raises(FileNotFoundError, match="missing.tfrecord"):
        list_files(tmp_path / "missing.tfrecord")
    with pytest.raises(ValueError, match="is a directory"):
        list_files(tmp_path)
    with pytest.raises(ValueError, match="empty list"):
        list_files([])
    with pytest.raises(TypeError, match="int"):
        list_files(3)
    with pytest.raises(TypeError, match="every entry"):
        list_files([os.fspath(tmp_path), 3])


# --------------------------------------------------------------------------- writer misuse


def test_writer_refuses_text_unknown_compression_and_writes_after_close(tmp_path):
    writer = TFRecordWriter(tmp_path / "w")
    with pytest.raises(TypeError, match="encode"):
        writer.write("text")
    writer.write(bytearray(b"ok"))
    writer.flush()
    assert os.path.getsize(tmp_path / "w") == 18
    writer.close()
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"late")
    with pytest.raises(ValueError, match='"GZIP"'):
        TFRecordWriter(tmp_path / "x", "SNAPPY")
    with pytest.raises(ValueError, match="compression must be one of"):
        list(iter_records(tmp_path / "w", "LZ4"))
