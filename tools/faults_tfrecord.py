"""Fault injection for the TFRecord reader: random damage to a valid file, read back under a memory limit.

Each trial takes a valid file of tf.train.Example records (plain, GZIP or
ZLIB, chosen at random), damages it one way, and reads it all through
`iter_records` and `parse_example`:

- bit flips, in the record stream or (compressed files) in the compressed bytes;
- truncation at a random byte;
- a record's length rewritten, with a *valid* length CRC, to something wild
  (2**60, just under the record limit, a little past the end, a little
  shorter), the declared-size bomb;
- one Example's bytes mutated and re-framed with valid CRCs, so that only the
  Example parser can notice;
- good records followed by a bomb: a header declaring 2**60 (or just under the
  limit, or 100 MiB) bytes, then up to 160 MiB of zeros (compressed to ~160 KB).

A trial ends in a *clean read* (the damage happened to leave a valid file,
e.g. a cut at a record boundary), a *clean error* (`DataLossError` naming the
file and an offset, or the parser's ValueError naming the record), or a
*crash*: any other exception, including MemoryError under the address-space
limit set at start (`--memory-mb` above what the process already maps).

The module is also the toolbox of tests/faults/test_crafted_tfrecord.py
(`record_header`, `zero_bomb`, `compress`, the mutations).

Run:  python tools/faults_tfrecord.py [--trials N] [--seconds S] [--seed S] [--memory-mb M]
Last line:  faults_tfrecord trials=N clean_errors=N clean_reads=N crashes=N max_rss_mb=M rss_growth_mb=G max_trial_ms=T
(max_rss_mb includes the imports; rss_growth_mb is what the trials added to the high-water mark.)
"""

from __future__ import annotations

import argparse
import random
import resource
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from faults_common import limit_memory  # tools/ is on sys.path: run as a script, or from the tests

from torchestimator.data.example import encode_example
from torchestimator.data.parsing import FixedLenFeature, VarLenFeature, parse_example
from torchestimator.data.tfrecord import (
    DEFAULT_MAX_RECORD_SIZE,
    DataLossError,
    iter_records,
    masked_crc32c,
)

COMPRESSIONS = (None, "GZIP", "ZLIB")
WINDOW_BITS = {"GZIP": 31, "ZLIB": 15}
SPEC = {
    "label": FixedLenFeature([], "int64"),
    "dense": FixedLenFeature([8], "float32"),
    "image": FixedLenFeature([], "string"),
    "tokens": VarLenFeature("int64"),
}


# --------------------------------------------------------------------------- crafting


def record_header(length: int) -> bytes:
    """A record's 12-byte header declaring `length`, with a valid length CRC."""
    encoded = struct.pack("<Q", length)
    return encoded + struct.pack("<I", masked_crc32c(encoded))


def frame(data: bytes) -> bytes:
    """One whole record around `data`, both CRCs valid (what TFRecordWriter writes)."""
    return record_header(len(data)) + data + struct.pack("<I", masked_crc32c(data))


def compress(data: bytes, compression: str | None) -> bytes:
    if compression is None:
        return data
    compressor = zlib.compressobj(6, zlib.DEFLATED, WINDOW_BITS[compression], 9)
    return compressor.compress(data) + compressor.flush()


def zero_bomb(declared: int, zeros: int, compression: str | None, prefix: bytes = b"") -> bytes:
    """`prefix` (e.g. good records), then a header declaring `declared` bytes followed by `zeros`
    zero bytes, compressed as a properly ended GZIP/ZLIB stream (about 1 KB per MiB of zeros) or plain.

    Built fast: after a full flush deflate forgets its history, so the compressed form of
    one MiB of zeros can be repeated; only the trailer's checksum sees every byte.
    """
    head = prefix + record_header(declared)
    if compression is None:
        return head + bytes(zeros)
    mebibytes, rest = divmod(zeros, 1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    one_mebibyte = bytes(1 << 20)
    parts = [deflate.compress(head), deflate.flush(zlib.Z_FULL_FLUSH)]
    block = deflate.compress(one_mebibyte) + deflate.flush(zlib.Z_FULL_FLUSH) if mebibytes else b""
    parts += [block] * mebibytes
    parts += [deflate.compress(bytes(rest)), deflate.flush()]
    crc, adler = zlib.crc32(head), zlib.adler32(head)
    for _ in range(mebibytes):
        crc, adler = zlib.crc32(one_mebibyte, crc), zlib.adler32(one_mebibyte, adler)
    crc, adler = zlib.crc32(bytes(rest), crc), zlib.adler32(bytes(rest), adler)
    if compression == "GZIP":  # header: magic, deflate, no flags, mtime 0, no extra flags, OS unknown
        return (
            b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
            + b"".join(parts)
            + struct.pack("<II", crc, (len(head) + zeros) & 0xFFFFFFFF)
        )
    return b"\x78\xda" + b"".join(parts) + struct.pack(">I", adler)


def example_records(rng: random.Random, count: int) -> list[bytes]:
    return [
        encode_example(
            {
                "label": [rng.randrange(10)],
                "dense": np.float32([rng.random() for _ in range(8)]),
                "image": [rng.randbytes(rng.randrange(1, 200))],
                "tokens": [rng.randrange(1000) for _ in range(rng.randrange(6))],
            },
            kinds={"tokens": "int64"},
        )
        for _ in range(count)
    ]


def record_starts(records: list[bytes]) -> list[int]:
    starts, position = [], 0
    for record in records:
        starts.append(position)
        position += 16 + len(record)
    return starts


# --------------------------------------------------------------------------- mutations
# Each takes the records, the compression and an rng, and returns the file's bytes.


def flip_bits(records: list[bytes], compression: str | None, rng: random.Random) -> bytes:
    """Flip 1-3 bits, in the record stream or (compressed, half the time) in the compressed bytes."""
    stream = b"".join(map(frame, records))
    on_compressed = compression is not None and rng.random() < 0.5
    data = bytearray(compress(stream, compression) if on_compressed else stream)
    for _ in range(rng.randint(1, 3)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data) if on_compressed else compress(bytes(data), compression)


def truncate(records: list[bytes], compression: str | None, rng: random.Random) -> bytes:
    data = compress(b"".join(map(frame, records)), compression)
    return data[: rng.randrange(len(data))]


def rewrite_length(records: list[bytes], compression: str | None, rng: random.Random) -> bytes:
    """One record declares another length, with its length CRC made valid again."""
    index = rng.randrange(len(records))
    stream = bytearray(b"".join(map(frame, records)))
    start = record_starts(records)[index]
    past_end = len(stream) - start - 16 + rng.randint(1, 64)
    length = rng.choice(
        [
            2**60,
            2**63 + 5,
            DEFAULT_MAX_RECORD_SIZE - 1,
            DEFAULT_MAX_RECORD_SIZE + 1,
            past_end,
            100 << 20,
            max(len(records[index]) - rng.randint(1, 8), 0),
        ]
    )
    stream[start : start + 12] = record_header(length)
    return compress(bytes(stream), compression)


def mutate_example(records: list[bytes], compression: str | None, rng: random.Random) -> bytes:
    """Damage inside one Example, framed with valid CRCs: only the parser can see it."""
    index = rng.randrange(len(records))
    example = bytearray(records[index])
    choice = rng.randrange(3)
    if choice == 0:  # random bytes overwritten
        for _ in range(rng.randint(1, 4)):
            example[rng.randrange(len(example))] = rng.randrange(256)
    elif choice == 1:  # cut
        del example[rng.randrange(len(example)) :]
    else:  # a huge length-delimited field, then nothing behind it
        example[rng.randrange(len(example)) :] = b"\x0a\xff\xff\xff\xff\x0f"
    damaged = records[:index] + [bytes(example)] + records[index + 1 :]
    return compress(b"".join(map(frame, damaged)), compression)


def append_bomb(records: list[bytes], compression: str | None, rng: random.Random) -> bytes:
    """Good records, then a header declaring a wild length followed by up to 160 MiB of zeros."""
    declared = rng.choice([2**60, DEFAULT_MAX_RECORD_SIZE - 1, 100 << 20, 1 << 62])
    zeros = rng.randrange(1 << 20) if compression is None else rng.randrange(160 << 20)
    return zero_bomb(declared, zeros, compression, prefix=b"".join(map(frame, records)))


MUTATIONS: dict[str, Callable[[list[bytes], str | None, random.Random], bytes]] = {
    "flip_bits": flip_bits,
    "truncate": truncate,
    "rewrite_length": rewrite_length,
    "mutate_example": mutate_example,
    "append_bomb": append_bomb,
}


# --------------------------------------------------------------------------- reading


def read_and_parse(path: str, compression: str | None) -> str:
    """'clean_read' or 'clean_error'; anything else that is raised is a crash."""
    records = []
    try:
        for _, record in iter_records(path, compression):
            records.append(record)
    except DataLossError as error:
        if error.path != path or error.offset < 0 or path not in str(error):
            raise AssertionError(f"DataLossError without file or offset: {error}") from error
        return "clean_error"
    try:
        parse_example(records, SPEC)
    except ValueError as error:
        if "record " not in str(error):
            raise AssertionError(f"parse error without the record: {error}") from error
        return "clean_error"
    return "clean_read"


def run(trials: int, seconds: float, seed: int, memory_mb: int) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"trials": 0, "clean_errors": 0, "clean_reads": 0, "crashes": 0}
    slowest = 0.0
    limit_memory(memory_mb)
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    deadline = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="faults-tfrecord-") as folder:
        while counts["trials"] < trials and time.monotonic() < deadline:
            name = rng.choice(sorted(MUTATIONS))
            compression = rng.choice(COMPRESSIONS)
            path = str(Path(folder) / f"trial-{counts['trials']}.tfrecord")
            Path(path).write_bytes(MUTATIONS[name](example_records(rng, rng.randint(1, 40)), compression, rng))
            started = time.monotonic()
            try:
                outcome = read_and_parse(path, compression)
            except BaseException as error:
                if isinstance(error, KeyboardInterrupt):
                    raise
                outcome = "crashes"
                print(
                    f"crash: trial {counts['trials']} {name} {compression}: {type(error).__name__}: {error}"[:500],
                    file=sys.stderr,
                )
            slowest = max(slowest, time.monotonic() - started)
            counts[{"clean_error": "clean_errors", "clean_read": "clean_reads"}.get(outcome, outcome)] += 1
            counts["trials"] += 1
            Path(path).unlink()
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    counts["max_rss_mb"] = max_rss // 1024
    counts["rss_growth_mb"] = (max_rss - start_rss) // 1024  # over the imports (torch) at start
    counts["max_trial_ms"] = round(slowest * 1000)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=500, help="most trials (default 500)")
    parser.add_argument("--seconds", type=float, default=120.0, help="stop after this long (default 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--memory-mb", type=int, default=400, help="address space allowed beyond what is mapped at start (default 400)"
    )
    args = parser.parse_args(argv)
    if args.trials < 1 or args.seconds <= 0 or args.memory_mb < 1:
        parser.error("--trials, --seconds and --memory-mb must be positive")
    counts = run(args.trials, args.seconds, args.seed, args.memory_mb)
    print("faults_tfrecord " + " ".join(f"{key}={value}" for key, value in counts.items()))
    return 1 if counts["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
