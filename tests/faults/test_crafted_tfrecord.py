"""Crafted TFRecord files and tf.train.Example records: each one is a clean error that says where,
in bounded memory and time.

The readers run in one child process whose address space is capped (RLIMIT_AS) at what it maps
after its imports plus 300 MB, so a reader that allocates what a crafted length declares fails
with MemoryError there instead of taking the machine (the issue: a 1 MB GZIP file declaring 2**60
bytes grew to 2.45 GB). The child reads every crafted file through `read_records`,
`TFRecordDataset`, `torchestimator records verify` (and, for crafted Examples, `parse_example`
behind a dataset and `records inspect`) and reports per case and reader what was raised, what was
printed, and how long it took. The files come from tools/faults_tfrecord.py's crafting helpers;
that script runs random damage for longer (its smoke test is at the end).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import faults_tfrecord as tool  # tools/ is on sys.path (tests/conftest.py)
import pytest
from faults_common import varint

from torchestimator.data.example import encode_example

TOOL = Path(__file__).resolve().parents[2] / "tools" / "faults_tfrecord.py"
MEMORY_MB = 300
BOMB_ZEROS = 256 << 20  # decompressed bytes behind a bomb's header: ~260 KB of GZIP
SECONDS_PER_READ = 20.0  # generous for a shared 2-core machine; a read takes well under a second


CHILD = r"""
import contextlib, io, json, resource, sys, time
from torchestimator import cli
from torchestimator.data.parsing import FixedLenFeature, VarLenFeature, parse_example
from torchestimator.data.tfrecord import read_records
from torchestimator.data.tfrecord_dataset import TFRecordDataset

SPEC = {"label": FixedLenFeature([], "int64"), "tokens": VarLenFeature("int64")}

def command(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}

def read(reader, path, compression):
    option = compression or "none"
    if reader == "read_records":
        return {"records": sum(1 for _ in read_records(path, compression))}
    if reader == "dataset":
        return {"records": sum(1 for _ in TFRecordDataset(path, compression))}
    if reader == "parse":
        batches = TFRecordDataset(path, compression, batch_size=2, collate_fn=lambda batch: parse_example(batch, SPEC))
        return {"batches": sum(1 for _ in batches)}
    if reader == "verify":
        return command(["records", "verify", "--compression", option, path])
    return command(["records", "inspect", "--compression", option, path])

cases = json.load(sys.stdin)
cli.build_parser()  # imports every command's module before the limit
mapped = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped + int(sys.argv[1]) * 2**20, resource.RLIM_INFINITY))
results = {}
for case in cases:
    for reader in case["readers"]:
        started = time.monotonic()
        try:
            result = read(reader, case["path"], case["compression"])
        except BaseException as error:
            result = {"raised": type(error).__name__, "message": str(error)[:3000],
                      "path": getattr(error, "path", None), "offset": getattr(error, "offset", None)}
        result["seconds"] = time.monotonic() - started
        results[case["name"] + "/" + reader] = result
print(json.dumps(results))
"""

FRAMING = ("read_records", "dataset", "verify")
GOOD = encode_example({"label": [3], "tokens": [1, 2, 3]}, kinds={"tokens": "int64"})
SECOND = 16 + len(GOOD)  # where the second record starts


def field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def nested(depth: int) -> bytes:
    message = b""
    for _ in range(depth):
        message = field(1, message)
    return message


def int64_feature(name: bytes, packed: bytes) -> bytes:
    """Example{features{feature{key: name, value: Feature{int64_list: packed}}}}, `packed` raw."""
    entry = field(1, name) + field(2, field(3, b"\x0a" + packed))
    return field(1, field(1, entry))


# name: (expected start of the DataLossError message, offset). Each builds bytes from the good stream.
def framing_cases(good_stream: bytes):
    data_crc = bytearray(good_stream)
    data_crc[SECOND - 1] ^= 0x10
    length_crc = bytearray(good_stream)
    length_crc[SECOND + 9] ^= 0x01
    past_end = bytearray(good_stream)
    past_end[SECOND : SECOND + 12] = tool.record_header(len(good_stream) - SECOND + 100)
    return {
        "bad_length_crc": (None, bytes(length_crc), f"corrupted record at {SECOND}", SECOND),
        "bad_data_crc": (None, bytes(data_crc), f"corrupted record at {12}", 0),
        "truncated_header": (None, good_stream[: SECOND + 7], f"truncated record at {SECOND}", SECOND),
        "truncated_payload": (None, good_stream[: SECOND + 12 + 3], f"truncated record at {SECOND}", SECOND),
        "length_past_eof": (None, bytes(past_end), f"truncated record at {SECOND}", SECOND),
        "garbage_gzip": ("GZIP", b"\x1f\x8b\x08\x00" + os.urandom(2000), "corrupted record at 0", 0),
        "cut_gzip": ("GZIP", tool.compress(good_stream, "GZIP")[:-9], "truncated record at", None),
        "gzip_of_bad_length_crc": (
            "GZIP",
            tool.compress(bytes(length_crc), "GZIP"),
            f"corrupted record at {SECOND}",
            SECOND,
        ),
        "zlib_of_length_past_eof": (
            "ZLIB",
            tool.compress(bytes(past_end), "ZLIB"),
            f"truncated record at {SECOND}",
            SECOND,
        ),
        "plain_bomb": (None, tool.zero_bomb(2**60, 1 << 20, None), "truncated record at 0", 0),
        "plain_bomb_under_the_limit": (None, tool.zero_bomb(2**31 - 2, 1 << 20, None), "truncated record at 0", 0),
        **{
            f"{compression.lower()}_bomb": (
                compression,
                tool.zero_bomb(2**60, BOMB_ZEROS, compression),
                "record too large at 0",
                0,
            )
            for compression in ("GZIP", "ZLIB")
        },
        **{
            f"{compression.lower()}_bomb_under_the_limit": (
                compression,
                tool.zero_bomb(2**31 - 2, BOMB_ZEROS, compression),
                "truncated record at 0",
                0,
            )
            for compression in ("GZIP", "ZLIB")
        },
    }


EXAMPLE_CASES = {
    "deep_groups": b"\x0b" * 100_000,  # start-group tags nested 100k deep
    "deep_unknown_groups": b"\x7b" * 100_000,
    "deep_messages": nested(300),
    "huge_packed_length": int64_feature(b"label", varint(2**40) + b"\x01\x02"),
    "packed_length_past_the_record": int64_feature(b"label", varint(50) + b"\x01"),
    "float_packed_not_whole_floats": field(1, field(1, field(1, b"label") + field(2, field(2, field(1, b"abc"))))),
    "length_of_2_64_minus_1": b"\x0a" + varint(2**64 - 1),
    "overlong_varint": b"\x0a" + b"\xff" * 11,
    "wrong_wire_type": b"\x0d\x00\x00\x00\x00",  # features as fixed32: an unknown field, so label is missing
    "map_key_not_a_string": field(1, field(1, b"\x08\x05" + field(2, field(3, b"\x0a\x01\x07")))),
}
# Valid protobuf whose odd fields are unknown ones, skipped: they decode, and only the spec finds
# label missing (inspect shows them as records without features).
DECODABLE = {"wrong_wire_type", "map_key_not_a_string"}


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """Writes every crafted file, runs the child once, returns (cases, results)."""
    folder = tmp_path_factory.mktemp("crafted")
    good_stream = tool.frame(GOOD) + tool.frame(GOOD)
    cases, expected = [], {}
    for name, (compression, data, message, offset) in framing_cases(good_stream).items():
        path = folder / f"{name}.tfrecord"
        path.write_bytes(data)
        cases.append({"name": name, "path": str(path), "compression": compression, "readers": FRAMING})
        expected[name] = (message, offset)
    for name, example in EXAMPLE_CASES.items():
        path = folder / f"example-{name}.tfrecord"
        path.write_bytes(tool.frame(GOOD) + tool.frame(example))
        cases.append({"name": name, "path": str(path), "compression": None, "readers": ["parse", "inspect"]})
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, str(MEMORY_MB)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return {case["name"]: case for case in cases}, json.loads(completed.stdout.splitlines()[-1]), expected


FRAMING_NAMES = sorted(framing_cases(tool.frame(GOOD) * 2))


@pytest.mark.parametrize("name", FRAMING_NAMES)
def test_a_crafted_file_is_a_clean_data_loss_error_naming_file_and_offset(crafted, name):
    cases, results, expected = crafted
    path, (message, offset) = cases[name]["path"], expected[name]
    for reader in ("read_records", "dataset"):
        result = results[f"{name}/{reader}"]
        assert result["raised"] == "DataLossError", (reader, result)
        assert result["path"] == path and result["message"].startswith(message), (reader, result)
        assert f" in {path}" in result["message"]
        if offset is not None:
            assert result["offset"] == offset, (reader, result)
        assert result["seconds"] < SECONDS_PER_READ, (reader, result)
    verify = results[f"{name}/verify"]
    assert verify["code"] == 1 and f"DAMAGED {path}: " in verify["out"], verify
    assert message in verify["out"] and "1 damaged" in verify["out"], verify


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_a_bomb_says_what_it_declares_and_how_to_raise_the_limit(crafted, compression):
    _, results, _ = crafted
    over = results[f"{compression}_bomb/read_records"]["message"]
    assert f"it declares {2**60} bytes, more than max_record_size={2**31 - 1}" in over
    assert f"pass max_record_size={2**60} or more" in over and "length field is damaged" in over
    under = results[f"{compression}_bomb_under_the_limit/read_records"]["message"]
    # The whole stream was inflated and thrown away, in constant memory, to find it ends short.
    assert (
        f"declares {2**31 - 2} bytes of data but the decompressed stream ends {12 + BOMB_ZEROS} bytes into the record"
    ) in under
    plain = results["plain_bomb/read_records"]["message"]
    assert f"declares {2**60} bytes of data but the file ends {12 + (1 << 20)} bytes into" in plain


@pytest.mark.parametrize("name", sorted(EXAMPLE_CASES))
def test_a_crafted_example_is_a_parse_error_naming_the_record(crafted, name):
    _cases, results, _ = crafted
    parsed = results[f"{name}/parse"]
    assert parsed["raised"] in ("ExampleDecodeError", "ExampleParseError") and "(record 1" in parsed["message"], parsed
    assert parsed["seconds"] < SECONDS_PER_READ
    inspected = results[f"{name}/inspect"]
    assert inspected["code"] == 0 and inspected["seconds"] < SECONDS_PER_READ, inspected
    if name not in DECODABLE:
        assert f"first failure: record 1 at offset {SECOND}: " in inspected["out"], inspected


def test_random_damage_script_runs_and_reports_no_crash():
    completed = subprocess.run(
        [sys.executable, str(TOOL), "--trials", "60", "--seconds", "30", "--seed", "7"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = completed.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        r"faults_tfrecord trials=(\d+) clean_errors=(\d+) clean_reads=(\d+) crashes=(\d+) "
        r"max_rss_mb=(\d+) rss_growth_mb=(\d+) max_trial_ms=(\d+)",
        last,
    )
    assert match, (last, completed.stderr[-2000:])
    trials, errors, reads, crashes = map(int, match.groups()[:4])
    assert completed.returncode == 0 and crashes == 0, completed.stderr[-2000:]
    assert trials == errors + reads and trials >= 10 and errors > reads
    assert int(match.group(6)) < 250  # the bombs among the trials did not grow memory by what they declare
