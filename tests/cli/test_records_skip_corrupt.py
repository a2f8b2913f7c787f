"""`torchestimator records verify/inspect --skip_corrupt`: damage skipped and listed, and the hint of an
error naming the flag the command has (not the library's skip_corrupt=True)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from torchestimator import cli
from torchestimator.data.example import encode_example
from torchestimator.data.tfrecord import masked_crc32c

RECORDS = [encode_example({"row": [index], "text": [b"x" * index]}) for index in range(6)]


def framed(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


OFFSETS = [sum(16 + len(record) for record in RECORDS[:index]) for index in range(len(RECORDS))]
STREAM = b"".join(framed(record) for record in RECORDS)


@pytest.fixture
def damaged(tmp_path: Path) -> str:
    """Record 1's data and record 4's length CRC flipped."""
    data = bytearray(STREAM)
    data[OFFSETS[1] + 14] ^= 0x01
    data[OFFSETS[4] + 9] ^= 0x01
    path = tmp_path / "damaged.tfrecord"
    path.write_bytes(bytes(data))
    return str(path)


REGIONS = (
    f"2 damaged regions skipped (2 records, {OFFSETS[2] - OFFSETS[1] + OFFSETS[5] - OFFSETS[4]} bytes): "
    f"bytes {OFFSETS[1]}..{OFFSETS[2]} ({OFFSETS[2] - OFFSETS[1]} bytes): data CRC mismatch; "
    f"bytes {OFFSETS[4]}..{OFFSETS[5]} ({OFFSETS[5] - OFFSETS[4]} bytes): length CRC mismatch"
)


def test_verify_without_the_flag_stops_at_the_first_damage_and_names_the_flag(damaged: str, capsys: Any) -> None:
    assert cli.main(["records", "verify", damaged]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED {damaged}: 1 good records, first bad record at offset {OFFSETS[1]}: " in out
    assert "Records before it were read; pass --skip_corrupt to skip damaged records and read on." in out
    assert "skip_corrupt=True" not in out


def test_verify_with_the_flag_reads_on_and_lists_each_damaged_region(tmp_path: Path, damaged: str, capsys: Any) -> None:
    good = tmp_path / "good.tfrecord"
    good.write_bytes(STREAM)
    assert cli.main(["records", "verify", "--skip_corrupt", damaged, str(good)]) == 1  # damaged is still damaged
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"DAMAGED {damaged}: 4 good records, {REGIONS}"
    assert out[1] == f"OK      {good}: 6 records"
    skipped = OFFSETS[2] - OFFSETS[1] + OFFSETS[5] - OFFSETS[4]
    assert (
        out[2] == f"verified 2 file(s): 1 ok, 1 damaged, 10 good records, 2 damaged records ({skipped} bytes) skipped"
    )
    assert cli.main(["records", "verify", "--skip-corrupt", str(good)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "verified 1 file(s): 1 ok, 0 damaged, 6 good records"


def test_inspect_without_the_flag_fails_naming_the_flag(damaged: str, capsys: Any) -> None:
    assert cli.main(["records", "inspect", damaged]) == 2
    err = capsys.readouterr().err
    assert f"corrupted record at {OFFSETS[1] + 12} in {damaged}" in err
    assert "pass --skip_corrupt to skip damaged records and read on" in err and "skip_corrupt=True" not in err


def test_inspect_with_the_flag_shows_the_records_kept_and_the_regions(
    damaged: str, capsys: Any, caplog: pytest.LogCaptureFixture
) -> None:
    assert cli.main(["records", "inspect", "--skip_corrupt", "--limit", "6", damaged]) == 0
    out = capsys.readouterr().out
    assert f"{damaged}: 4 records (tf.train.Example)\n  {REGIONS}\n" in out
    # Listed once, in the output: the library's own "Skipped 2 damaged regions" warning would repeat the list.
    assert [record.getMessage() for record in caplog.records if "damaged regions" in record.getMessage()] == []
    assert [f'"offset": {OFFSETS[index]},' in out for index in range(6)] == [True, False, True, True, False, True]
