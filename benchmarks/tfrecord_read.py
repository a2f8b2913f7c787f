"""Benchmark: reading TFRecord files with torchestimator against tf.data and the `tfrecord` package.

Figures, measured on the same files in the same run:

- raw: records per second into Python bytes with every CRC checked.
  torchestimator's `read_records` against `tf.data.TFRecordDataset(files).batch(B)`
  at the largest batch size (tf.data's fastest; each batch turned into numpy, an
  object array of bytes) and against the `tfrecord` PyPI package's
  `tfrecord_iterator` (each record copied out of its reused buffer into bytes;
  that reader does not check CRCs, which favours it: the run checks this on a
  damaged file and prints what it found, and prints the same ratio with ours at
  `verify=False` beside it, so that neither side checks a CRC).
- parsed, per batch size B (`--batch-sizes`, default 16,64,256,1024): examples
  per second into numpy arrays for a typical schema (an int64 label, a
  fixed-length float vector, raw image bytes, a variable-length int64 list):
  batches of B records from `read_records` through torchestimator's
  `parse_example` against `tf.data.TFRecordDataset(files).batch(B).map(tf.io.parse_example)`
  with every output turned into numpy. Summed up as the geometric mean and the
  worst of the per-size ratios (the target is >= 1 at every size).
- dataset: the same schema through torchestimator's `TFRecordDataset(file,
  features=spec, batch_size=B)` (parsed batches, as an input_fn hands them to the
  loop) against the same tf.data pipeline, on one file of `--dataset-records`
  records (default 100k: the shards' records repeated in order), B =
  `--dataset-batch-size`.

The records are generated once (seeded) and written with torchestimator's
writer into `--files` shards. Every reader then reads all of them once per
round; rounds are interleaved in rotating order and the first is dropped as
warm-up. A reader's figure is the median over rounds of records / wall-clock
second, with the median wall time of one pass and the CPU time it used per wall
second beside it (so a reader that used more cores, or a run starved by other
programs, shows it); a ratio is the median over rounds of ours / theirs within
the same round, which cancels the slow swings in speed that other programs cause.
Each figure line also gives the ratio of records per CPU second, which a busy
machine disturbs far less (the final line's ratios are the wall-clock ones).
Threads are pinned equal: `torch.set_num_threads(T)`, TensorFlow's intra- and
inter-op pools set to T, tf.data's private thread pool and intra-op
parallelism set to T, and tf.data's autotuning and injected prefetch off
(with them, tf.data runs its pipeline on a second thread while Python
consumes: about 1.5 cores at T=1; `--tfdata-defaults` keeps them).

The ratios depend on the conditions, so three `conditions:` lines before the last
print them: what each raw reader verifies (found by reading a record whose length
CRC, then data CRC, was damaged) and which scanner ours ran; the records' count and
sizes, the files' sizes and their file system; the Python, torch, numpy,
TensorFlow, tfrecord and crc32c versions, the CPU and the load average at the start
and at the end. On the project's 2-core machine (2026-12-06), raw_vs_tfrecord_pkg
at the defaults (1 KB records, 4 files of 12.9 MiB) is about 5 with our compiled
scanner on the CRC32C instruction, about 2 on its slicing-by-8 table (a CPU
without SSE4.2), 1.2-1.6 on the pure-Python path; with the compiled scanner, 16 KB
records give about 2 and 400 files of 130 KB about 2.7: ours pays per byte and
per file, the package per record.

Before timing, every reader's records are checked identical (the same bytes in
the same order), and the first parsed batch of ours (from parse_example and from
TFRecordDataset) is checked against the generated values and against
TensorFlow's; the script exits 1 otherwise.

TensorFlow and `tfrecord` are benchmark-only dependencies (pinned in
benchmarks/requirements-bench.txt); without them the script says so and prints
torchestimator's own figures, with n/a ratios. Both run in one process: the
`tfrecord` package's own copy of TensorFlow's example protos (which protobuf
refuses beside TensorFlow's: "duplicate symbol") is replaced by a stand-in, since
its record reader never uses them.

Run:  python benchmarks/tfrecord_read.py [--records N] [--files F] [--batch-sizes 16,64,256,1024]
          [--dataset-records N] [--dataset-batch-size B] [--rounds R] [--threads T] [--quick]
Last line:  tfrecord_read raw_vs_tfdata=<ratio> parsed_vs_tfdata=<geometric mean over batch sizes>
    raw_vs_tfrecord_pkg=<ratio> dataset_vs_tfdata=<ratio> parsed_vs_tfdata_worst=<ratio>
    parsed_vs_tfdata_b16=<ratio> ... parsed_vs_tfdata_b1024=<ratio>
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import importlib.metadata
import itertools
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from torchestimator import _native
from torchestimator.data.example import encode_example
from torchestimator.data.parsing import FixedLenFeature, VarLenFeature, parse_example
from torchestimator.data.tfrecord import TFRecordWriter, describe_reader, read_records
from torchestimator.data.tfrecord_dataset import TFRecordDataset

TARGETS = {"raw_vs_tfdata": 1.3, "parsed_vs_tfdata_worst": 1.0, "raw_vs_tfrecord_pkg": 3.0, "dataset_vs_tfdata": 1.0}
"""Issue 14's targets; parsed_vs_tfdata_worst >= 1 means ours is no slower than tf.data at any batch size."""
INSTALL_HINT = "pip install -r benchmarks/requirements-bench.txt"
KINDS = {"label": "int64", "dense": "float", "image": "bytes", "tokens": "int64"}
DEFAULT_BATCH_SIZES = (16, 64, 256, 1024)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What the command line chose."""

    records: int
    """Records in all shards together (the raw and parsed figures)."""
    files: int
    """Shards the records are written into (read in order by every reader)."""
    batch_sizes: tuple[int, ...]
    """One parsed figure per batch size."""
    dataset_records: int
    """Records in the one file of the dataset figure."""
    dataset_batch_size: int
    rounds: int
    warmup_rounds: int
    threads: int
    dense_length: int
    """Values in the fixed-length float feature."""
    image_bytes: int
    """Bytes in the raw image feature (784: a 28x28 grayscale image)."""
    max_tokens: int
    """The variable-length int64 list holds 0..max_tokens values."""
    seed: int
    quick: bool
    tensorflow: bool
    """Compare against tf.data when TensorFlow is installed."""
    tfrecord_package: bool
    """Compare against the `tfrecord` package when it is installed."""
    tfdata_defaults: bool
    """Leave tf.data's autotuning and injected prefetch on (it then uses more cores than --threads)."""

    @property
    def raw_batch_size(self) -> int:
        """tf.data's raw reader batches by the largest size: its fastest, so the strongest anchor."""
        return max(self.batch_sizes)


# -- data ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Columns:
    """The generated values of every record, column by column."""

    labels: np.ndarray
    dense: np.ndarray
    images: np.ndarray
    token_lengths: np.ndarray
    tokens: np.ndarray
    """All records' tokens concatenated; record i holds token_lengths[i] of them."""

    def token_slices(self) -> list[np.ndarray]:
        return np.split(self.tokens, np.cumsum(self.token_lengths)[:-1])


def make_columns(settings: Settings) -> Columns:
    rng = np.random.default_rng(settings.seed)
    count = settings.records
    lengths = rng.integers(0, settings.max_tokens + 1, size=count)
    return Columns(
        labels=rng.integers(0, 1000, size=count, dtype=np.int64),
        dense=rng.standard_normal((count, settings.dense_length), dtype=np.float32),
        images=rng.integers(0, 256, size=(count, settings.image_bytes), dtype=np.uint8),
        token_lengths=lengths,
        tokens=rng.integers(-(2**40), 2**40, size=int(lengths.sum()), dtype=np.int64),
    )


def serialize(columns: Columns) -> Iterator[bytes]:
    for label, dense, image, tokens in zip(columns.labels, columns.dense, columns.images, columns.token_slices()):
        yield encode_example(
            {"label": [int(label)], "dense": dense, "image": [image.tobytes()], "tokens": tokens}, kinds=KINDS
        )


def write_files(directory: str, records: Iterable[bytes], settings: Settings) -> list[str]:
    """Contiguous runs of records into `files` shards named like TF's ShardedFilename."""
    paths = [
        os.path.join(directory, f"data-{index:05d}-of-{settings.files:05d}.tfrecord") for index in range(settings.files)
    ]
    per_file = -(-settings.records // settings.files)
    iterator = iter(records)
    for path in paths:
        with TFRecordWriter(path) as writer:
            for record in itertools.islice(iterator, per_file):
                writer.write(record)
    return paths


def write_dataset_file(directory: str, shards: Sequence[str], settings: Settings) -> str:
    """One file of `dataset_records` records: the shards' records in order, repeated as often as needed.

    Repeating them (rather than encoding more) keeps the data's make-up the same and the run short:
    encoding is the slowest part of the set-up. Neither reader caches anything between records.
    """
    path = os.path.join(directory, "dataset.tfrecord")
    written = 0
    with TFRecordWriter(path) as writer:
        while written < settings.dataset_records:
            for record in itertools.islice(read_records(shards), settings.dataset_records - written):
                writer.write(record)
                written += 1
    return path


def ours_spec(settings: Settings) -> dict[str, Any]:
    return {
        "label": FixedLenFeature([], "int64"),
        "dense": FixedLenFeature([settings.dense_length], "float32"),
        "image": FixedLenFeature([], "string"),
        "tokens": VarLenFeature("int64"),
    }


def batches(records: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    iterator = iter(records)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


# -- the optional competitors -------------------------------------------------
# -- the optional competitors -------------------------------------------------


def import_tensorflow(threads: int) -> Any:
    """TensorFlow with its thread pools pinned, or None when it is not installed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # its start-up banner is noise here
    try:
        import tensorflow as tf
    except ImportError:
        return None
    # Only possible before TensorFlow's runtime starts, hence right after the import.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    return tf


class _ProtoPlaceholder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the benchmark uses only tfrecord_iterator from the tfrecord package.")


def import_tfrecord_iterator() -> Callable[[str], Iterator[memoryview]] | None:
    """The `tfrecord` package's record iterator, or None when the package is not installed.

    The package registers its own copy of TensorFlow's `tensorflow.*` example protos in
    protobuf's default descriptor pool, which collides with TensorFlow's own copy in the
    same process ("duplicate symbol 'tensorflow.BytesList'"), whichever is imported
    first. Its record iterator never touches the protos, so a placeholder module stands
    in for them.
    """
    placeholder = types.ModuleType("tfrecord.example_pb2")
    for name in (
        "BytesList",
        "FloatList",
        "Int64List",
        "Feature",
        "Features",
        "FeatureList",
        "FeatureLists",
        "Example",
        "SequenceExample",
    ):
        setattr(placeholder, name, _ProtoPlaceholder)
    previous = sys.modules.setdefault("tfrecord.example_pb2", placeholder)
    try:
        from tfrecord.reader import tfrecord_iterator
    except ImportError:
        if previous is placeholder:
            sys.modules.pop("tfrecord.example_pb2", None)
        return None
    return tfrecord_iterator


def tfdata_options(tf: Any, settings: Settings) -> Any:
    options = tf.data.Options()
    options.threading.private_threadpool_size = settings.threads
    options.threading.max_intra_op_parallelism = settings.threads
    options.deterministic = True
    if not settings.tfdata_defaults:
        # Otherwise tf.data injects a prefetch that runs the pipeline on another thread while
        # Python consumes, whatever the pool sizes: about 1.5 cores at --threads 1.
        options.autotune.enabled = False
        options.experimental_optimization.inject_prefetch = False
    return options


def tf_spec(tf: Any, settings: Settings) -> dict[str, Any]:
    return {
        "label": tf.io.FixedLenFeature([], tf.int64),
        "dense": tf.io.FixedLenFeature([settings.dense_length], tf.float32),
        "image": tf.io.FixedLenFeature([], tf.string),
        "tokens": tf.io.VarLenFeature(tf.int64),
    }


def tf_to_numpy(parsed: dict[str, Any]) -> dict[str, Any]:
    """TensorFlow's parse result as numpy: dense tensors as arrays, sparse ones as (indices, values, dense_shape)."""
    converted: dict[str, Any] = {}
    for name, value in parsed.items():
        if hasattr(value, "indices"):
            converted[name] = (value.indices.numpy(), value.values.numpy(), value.dense_shape.numpy())
        else:
            converted[name] = value.numpy()
    return converted


# -- readers: each reads its files once per call and returns how many records it got -----


@dataclasses.dataclass(frozen=True)
class Contender:
    """One timed reader: a pass over its files, and how many records a pass must count."""

    read: Callable[[], int]
    records: int


def ours_raw_reader(files: Sequence[str], verify: bool = True) -> Callable[[], int]:
    def read() -> int:
        count = 0
        for _ in read_records(files, verify=verify):
            count += 1
        return count

    return read


def ours_parsed_reader(files: Sequence[str], spec: dict[str, Any], batch_size: int) -> Callable[[], int]:
    def read() -> int:
        count = 0
        for batch in batches(read_records(files), batch_size):
            parse_example(batch, spec)
            count += len(batch)
        return count

    return read


def ours_dataset_reader(path: str, spec: dict[str, Any], batch_size: int) -> Callable[[], int]:
    def read() -> int:
        # A new dataset per pass: one that was read to the end resumes there (its position is kept).
        dataset = TFRecordDataset(path, features=spec, batch_size=batch_size)
        count = 0
        for parsed in dataset:
            count += len(parsed["label"])
        return count

    return read


def tfdata_raw_reader(tf: Any, settings: Settings, files: Sequence[str]) -> Callable[[], int]:
    dataset = tf.data.TFRecordDataset(list(files)).batch(settings.raw_batch_size)
    dataset = dataset.with_options(tfdata_options(tf, settings))

    def read() -> int:
        count = 0
        for batch in dataset:
            count += len(batch.numpy())  # an object array of Python bytes
        return count

    return read


def tfdata_parsed_reader(tf: Any, settings: Settings, files: Sequence[str], batch_size: int) -> Callable[[], int]:
    spec = tf_spec(tf, settings)
    dataset = tf.data.TFRecordDataset(list(files)).batch(batch_size)
    dataset = dataset.map(lambda serialized: tf.io.parse_example(serialized, spec))
    dataset = dataset.with_options(tfdata_options(tf, settings))

    def read() -> int:
        count = 0
        for parsed in dataset:
            count += len(tf_to_numpy(parsed)["label"])
        return count

    return read


def tfrecord_package_reader(
    tfrecord_iterator: Callable[[str], Iterator[memoryview]], files: Sequence[str]
) -> Callable[[], int]:
    def read() -> int:
        count = 0
        for path in files:
            for view in tfrecord_iterator(path):
                bytes(view)  # the view points into a buffer the next record overwrites
                count += 1
        return count

    return read


def contenders(
    files: Sequence[str], dataset_file: str, settings: Settings, tf: Any, tfrecord_iterator: Any
) -> dict[str, Contender]:
    """Every timed reader by name: ours_*/tfdata_* pairs (parsed_b<B> per batch size), then the tfrecord package
    and ours without CRC checks (its like-for-like counterpart)."""
    spec = ours_spec(settings)
    found = {"ours_raw": Contender(ours_raw_reader(files), settings.records)}
    if tf is not None:
        found["tfdata_raw"] = Contender(tfdata_raw_reader(tf, settings, files), settings.records)
    for size in settings.batch_sizes:
        found[f"ours_parsed_b{size}"] = Contender(ours_parsed_reader(files, spec, size), settings.records)
        if tf is not None:
            found[f"tfdata_parsed_b{size}"] = Contender(
                tfdata_parsed_reader(tf, settings, files, size), settings.records
            )
    found["ours_dataset"] = Contender(
        ours_dataset_reader(dataset_file, spec, settings.dataset_batch_size), settings.dataset_records
    )
    if tf is not None:
        found["tfdata_dataset"] = Contender(
            tfdata_parsed_reader(tf, settings, [dataset_file], settings.dataset_batch_size), settings.dataset_records
        )
    if tfrecord_iterator is not None:
        found["tfrecord_pkg_raw"] = Contender(tfrecord_package_reader(tfrecord_iterator, files), settings.records)
        # Like for like with the package, which checks no CRC: ours with both checks off (framing still checked).
        found["ours_raw_unverified"] = Contender(ours_raw_reader(files, verify=False), settings.records)
    return found


# -- checks ---------------------------------------------------------------------


def records_digest(records: Iterable[bytes | memoryview]) -> tuple[int, str]:
    """(count, sha256 over each record's length and bytes): equal only for the same records in the same order."""
    digest = hashlib.sha256()
    count = 0
    for record in records:
        digest.update(len(record).to_bytes(8, "little"))
        digest.update(record)
        count += 1
    return count, digest.hexdigest()


def expected_batch(columns: Columns, size: int) -> dict[str, Any]:
    """What parsing the first `size` records must give, built from the generated columns."""
    tokens = columns.token_slices()[:size]
    indices = [(row, column) for row, values in enumerate(tokens) for column in range(len(values))]
    return {
        "label": columns.labels[:size],
        "dense": columns.dense[:size],
        "image": np.array([image.tobytes() for image in columns.images[:size]], dtype=object),
        "tokens": (
            np.array(indices, dtype=np.int64).reshape(-1, 2),
            np.concatenate(tokens) if tokens else np.zeros(0, np.int64),
            np.array([size, max((len(values) for values in tokens), default=0)], dtype=np.int64),
        ),
    }


def sparse_parts(value: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(value, tuple):
        return value
    return np.asarray(value.indices), np.asarray(value.values), np.asarray(value.dense_shape)


def batch_mismatches(actual: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """Names of the features whose values, dtypes or shapes differ (empty when all agree)."""
    wrong = []
    for name, wanted in expected.items():
        if name not in actual:
            wrong.append(f"{name} (missing)")
        elif isinstance(wanted, tuple):
            got = sparse_parts(actual[name])
            if not all(np.array_equal(np.asarray(a), b) for a, b in zip(got, wanted)):
                wrong.append(name)
        else:
            got = np.asarray(actual[name])
            if (
                got.shape != wanted.shape
                or not np.array_equal(got, wanted)
                or (wanted.dtype != object and got.dtype != wanted.dtype)
            ):
                wrong.append(name)
    return wrong


def numpy_batch(parsed: dict[str, Any]) -> dict[str, Any]:
    """A TFRecordDataset batch as numpy: dense tensors as arrays, sparse ones as (indices, values, dense_shape)."""
    converted: dict[str, Any] = {}
    for name, value in parsed.items():
        if isinstance(value, torch.Tensor) and value.layout == torch.sparse_coo:
            value = value.coalesce()  # row-major order of indices, as TensorFlow's
            converted[name] = (value.indices().T.numpy(), value.values().numpy(), np.array(value.shape, np.int64))
        elif isinstance(value, torch.Tensor):
            converted[name] = value.numpy()
        else:
            converted[name] = value
    return converted


def check_readers(
    files: Sequence[str], dataset_file: str, columns: Columns, settings: Settings, tf: Any, tfrecord_iterator: Any
) -> list[str]:
    """One untimed read by each reader; returns what disagreed (empty when everything matched)."""
    problems = []
    ours = records_digest(read_records(files))
    if ours[0] != settings.records:
        problems.append(f"torchestimator read {ours[0]} records; {settings.records} were written")
    if tf is not None:
        dataset = tf.data.TFRecordDataset(list(files)).batch(1024)  # batched: one record at a time is slow
        if records_digest(record for batch in dataset for record in batch.numpy()) != ours:
            problems.append("tf.data read different records")
    if tfrecord_iterator is not None:
        theirs = records_digest(bytes(view) for path in files for view in tfrecord_iterator(path))
        if theirs != ours:
            problems.append("the tfrecord package read different records")
    size = min(max(settings.batch_sizes), settings.records)
    first = list(itertools.islice(read_records(files), size))
    parsed = parse_example(first, ours_spec(settings))
    if wrong := batch_mismatches(parsed, expected_batch(columns, size)):
        problems.append(f"torchestimator parsed {', '.join(wrong)} unlike the generated values")
    if tf is not None:
        theirs = tf_to_numpy(tf.io.parse_example(tf.constant(first), tf_spec(tf, settings)))
        if wrong := batch_mismatches(parsed, theirs):
            problems.append(f"torchestimator parsed {', '.join(wrong)} unlike tf.io.parse_example")
    problems.extend(check_dataset(dataset_file, columns, settings))
    return problems


def check_dataset(dataset_file: str, columns: Columns, settings: Settings) -> list[str]:
    """The dataset file holds dataset_records records, and TFRecordDataset's first batch is the generated values."""
    problems = []
    count = sum(1 for _ in read_records([dataset_file]))
    if count != settings.dataset_records:
        problems.append(f"the dataset file holds {count} records; {settings.dataset_records} were written")
    size = min(settings.dataset_batch_size, settings.records, settings.dataset_records)
    dataset = TFRecordDataset(dataset_file, features=ours_spec(settings), batch_size=size)
    first = numpy_batch(next(iter(dataset)))
    if wrong := batch_mismatches(first, expected_batch(columns, size)):
        problems.append(f"TFRecordDataset parsed {', '.join(wrong)} unlike the generated values")
    return problems


# -- conditions -----------------------------------------------------------------
# What a figure depends on, printed with it: the ratio against the tfrecord package moves from about 5 to
# about 2 with the CRC method of our scanner, the record size or the file size (see the module docstring).

_CRC_DAMAGES = {"length CRC": 8, "data CRC": -4}
"""Where each CRC of a one-record file lies: the length CRC after the 8-byte length, the data CRC last."""


def crc_checks(read: Callable[[str], list[bytes]], directory: str) -> str:
    """What a raw reader verifies, found by reading a one-record file with each CRC damaged in turn.

    `read(path)` returns the file's records (each as bytes); an exception or other records than the
    one written count as the damage seen.
    """
    record = b"crc probe " * 8
    seen = []
    for name, position in _CRC_DAMAGES.items():
        path = os.path.join(directory, f"crc-probe-{position}.tfrecord")
        with TFRecordWriter(path) as writer:
            writer.write(record)
        with open(path, "r+b") as stream:
            stream.seek(position, os.SEEK_SET if position >= 0 else os.SEEK_END)
            byte = stream.read(1)
            stream.seek(-1, os.SEEK_CUR)
            stream.write(bytes([byte[0] ^ 0xFF]))
        try:
            if read(path) != [record]:
                seen.append(name)
        except Exception:  # any refusal counts: the reader saw the damage
            seen.append(name)
        os.remove(path)
    if not seen:
        return "checks no CRC (a record with a damaged length CRC or data CRC is read without error)"
    if len(seen) == len(_CRC_DAMAGES):
        return "checks both CRCs (a damaged length CRC or data CRC is refused)"
    return f"checks the {seen[0]} only (a damaged {seen[0]} is refused, the other read without error)"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _file_system(path: str) -> str:
    """The file system type holding `path` (the longest mount point above it in /proc/mounts), or 'unknown'."""
    path = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                # The kernel writes a space in a mount point as \040 (and so on for tab, newline, backslash).
                point = re.sub(r"\\([0-7]{3})", lambda code: chr(int(code.group(1), 8)), fields[1])
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        pass
    return kind


def _cpu() -> str:
    """The CPU model (from /proc/cpuinfo where there is one) and the cores this process may run on."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model or 'unknown'}, {cores} usable core(s) of {os.cpu_count()}"


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def _mib(size: float) -> str:
    return f"{size / 2**20:.1f} MiB"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Conditions:
    """What the figures were measured under, printed on the lines before the last."""

    ours_checks: str
    """What read_records(verify=True), the reader of the raw figures, verifies (found by `crc_checks`)."""
    tfdata_checks: str | None
    """The same for tf.data's TFRecordDataset; None without TensorFlow."""
    anchor_checks: str | None
    """The same for the tfrecord package's tfrecord_iterator; None without the package."""
    data: str
    """Records, their sizes, the files, the file system."""
    environment: str
    """Python, the packages, the CPU, the load average at the start."""

    def lines(self, measurement: Measurement) -> list[str]:
        tfdata = "tf.data n/a" if self.tfdata_checks is None else f"tf.data's TFRecordDataset {self.tfdata_checks}"
        anchor = "tfrecord package n/a" if self.anchor_checks is None else f"the tfrecord package {self.anchor_checks}"
        unverified = ""
        if "ours_raw_unverified" in measurement.rates and "tfrecord_pkg_raw" in measurement.rates:
            ratio = measurement.ratio("ours_raw_unverified", "tfrecord_pkg_raw")
            unverified = f"; with ours at verify=False (no CRC checked on either side) it is {ratio:.3f}"
        return [
            f"conditions: torchestimator's read_records {self.ours_checks}, its scanner {describe_reader()}; "
            f"{tfdata}; {anchor}. raw_vs_tfrecord_pkg compares them as they are{unverified}",
            f"conditions: {self.data}",
            f"conditions: {self.environment}, {_load()} at the end",
        ]


def conditions(
    files: Sequence[str], dataset_file: str, directory: str, tf: Any, tfrecord_iterator: Any, load_at_start: str
) -> Conditions:
    sizes = [len(record) for record in read_records(files)]
    file_sizes = [os.path.getsize(path) for path in files]
    smallest, largest = _mib(min(file_sizes)), _mib(max(file_sizes))
    data = (
        f"{len(sizes)} records of {min(sizes)}-{max(sizes)} bytes (mean {statistics.fmean(sizes):.0f}) in "
        f"{len(files)} files of {smallest if smallest == largest else f'{smallest[:-4]}-{largest}'} "
        f"({_mib(sum(file_sizes))} in all), the dataset figure's file {_mib(os.path.getsize(dataset_file))}, "
        f"on {_file_system(directory)} ({directory}), written just before the reads"
    )
    environment = (
        f"Python {platform.python_version()} ({platform.python_implementation()} from {sys.base_prefix}, "
        f"run as {sys.executable}), torch "
        f"{torch.__version__}, numpy {np.__version__}, tensorflow "
        f"{getattr(tf, '__version__', 'n/a')}, tfrecord {_version('tfrecord') if tfrecord_iterator else 'n/a'}, "
        f"crc32c {_version('crc32c')}, google-crc32c {_version('google-crc32c')}; {platform.system()} "
        f"{platform.release()}; CPU {_cpu()}; load average (1 min) {load_at_start} at the start"
    )
    tfdata_checks = anchor_checks = None
    if tf is not None:
        tfdata_checks = crc_checks(lambda path: [item.numpy() for item in tf.data.TFRecordDataset(path)], directory)
    if tfrecord_iterator is not None:
        anchor_checks = crc_checks(lambda path: [bytes(view) for view in tfrecord_iterator(path)], directory)
    return Conditions(
        ours_checks=crc_checks(lambda path: list(read_records(path)), directory),
        tfdata_checks=tfdata_checks,
        anchor_checks=anchor_checks,
        data=data,
        environment=environment,
    )


# -- measuring ------------------------------------------------------------------


@dataclasses.dataclass
class Measurement:
    """Per reader, of each kept round: records/s (wall clock), seconds of one pass, CPU seconds per wall second.

    The rates per CPU second (`cpu_ratio`) are what a busy machine disturbs least: other programs take wall
    time from a reader, not CPU time. They also show a reader that spent more cores to be faster.
    """

    rates: dict[str, list[float]]
    walls: dict[str, list[float]]
    cores: dict[str, list[float]]

    def rate(self, reader: str) -> float:
        return statistics.median(self.rates[reader])

    def wall(self, reader: str) -> float:
        return statistics.median(self.walls[reader])

    def cores_used(self, reader: str) -> float:
        return statistics.median(self.cores[reader])

    def ratio(self, reader: str, reference: str) -> float:
        """Median over rounds of reader's rate / reference's rate in the same round."""
        return statistics.median(a / b for a, b in zip(self.rates[reader], self.rates[reference]))

    def cpu_ratio(self, reader: str, reference: str) -> float:
        """Median over rounds of reader's records per CPU second / reference's, in the same round."""

        def per_cpu_second(name: str) -> list[float]:
            return [rate / max(cores, 1e-9) for rate, cores in zip(self.rates[name], self.cores[name])]

        return statistics.median(a / b for a, b in zip(per_cpu_second(reader), per_cpu_second(reference)))


def measure(readers: dict[str, Contender], settings: Settings) -> Measurement:
    names = list(readers)
    measurement = Measurement(
        rates={name: [] for name in names}, walls={name: [] for name in names}, cores={name: [] for name in names}
    )
    # TensorFlow's import leaves ~500k objects (a full collection: 0.3 s of CPU). Frozen, they are out of
    # every collection: the one before each pass is then microseconds, and none inside a pass scans them.
    gc.collect()
    gc.freeze()
    try:
        _timed_rounds(readers, names, settings, measurement)
    finally:
        gc.unfreeze()
    return measurement


def _timed_rounds(
    readers: dict[str, Contender], names: list[str], settings: Settings, measurement: Measurement
) -> None:
    for round_index in range(settings.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            torch.set_num_threads(settings.threads)
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            count = readers[name].read()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if count != readers[name].records:
                raise RuntimeError(
                    f"{name} read {count} records in round {round_index}; expected {readers[name].records}."
                )
            if round_index >= settings.warmup_rounds:
                measurement.rates[name].append(count / wall)
                measurement.walls[name].append(wall)
                measurement.cores[name].append(cpu / wall)


# -- command line ------------------------------------------------------------------


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of integers, e.g. 16,64,256,1024; received {text!r}"
        ) from None
    if any(size < 1 for size in sizes) or len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"every batch size must be at least 1 and appear once; received {text!r}")
    return sizes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=None, help="records in all shards (default 50000; quick 600)")
    parser.add_argument("--files", type=int, default=4, help="shards the records are written into (default 4)")
    parser.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        default=DEFAULT_BATCH_SIZES,
        help="records per batch of the parsed figures, comma-separated (default 16,64,256,1024)",
    )
    parser.add_argument(
        "--dataset-records",
        type=int,
        default=None,
        help="records in the dataset figure's one file (default 100000; quick 1200)",
    )
    parser.add_argument(
        "--dataset-batch-size", type=int, default=256, help="records per batch of the dataset figure (default 256)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of every reader, interleaved (default 5; quick 2)"
    )
    parser.add_argument("--warmup-rounds", type=int, default=1, help="first rounds left out of the figures (default 1)")
    parser.add_argument(
        "--threads", type=int, default=1, help="threads for torch and for TensorFlow's pools (default 1)"
    )
    parser.add_argument("--dense-length", type=int, default=32, help="floats in the fixed-length feature (default 32)")
    parser.add_argument("--image-bytes", type=int, default=784, help="bytes in the raw image feature (default 784)")
    parser.add_argument(
        "--max-tokens", type=int, default=20, help="most values in the variable-length list (default 20)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="few records and rounds, for the smoke test")
    parser.add_argument("--no-tensorflow", action="store_true", help="skip tf.data even when TensorFlow is installed")
    parser.add_argument(
        "--no-tfrecord-package", action="store_true", help="skip the tfrecord package even when installed"
    )
    parser.add_argument(
        "--tfdata-defaults",
        action="store_true",
        help="keep tf.data's autotuning and injected prefetch, which run it on more cores than --threads",
    )
    return parser


def parse_settings(argv: Sequence[str] | None) -> Settings:
    parser = _parser()
    arguments = parser.parse_args(argv)
    quick = arguments.quick
    settings = Settings(
        records=arguments.records or (600 if quick else 50_000),
        files=arguments.files,
        batch_sizes=arguments.batch_sizes,
        dataset_records=arguments.dataset_records or (1_200 if quick else 100_000),
        dataset_batch_size=arguments.dataset_batch_size,
        rounds=arguments.rounds or (2 if quick else 5),
        warmup_rounds=arguments.warmup_rounds,
        threads=arguments.threads,
        dense_length=arguments.dense_length,
        image_bytes=arguments.image_bytes,
        max_tokens=arguments.max_tokens,
        seed=arguments.seed,
        quick=quick,
        tensorflow=not arguments.no_tensorflow,
        tfrecord_package=not arguments.no_tfrecord_package,
        tfdata_defaults=arguments.tfdata_defaults,
    )
    for flag, value in (
        ("--files", settings.files),
        ("--dataset-batch-size", settings.dataset_batch_size),
        ("--threads", settings.threads),
        ("--dense-length", settings.dense_length),
    ):
        if value < 1:
            parser.error(f"{flag} must be at least 1; received {value}.")
    if settings.records < settings.files:
        parser.error(f"--records must be at least --files ({settings.files}); received {settings.records}.")
    if settings.image_bytes < 0 or settings.max_tokens < 0:
        parser.error(
            f"--image-bytes and --max-tokens must be >= 0; received {settings.image_bytes} and {settings.max_tokens}."
        )
    if not 0 <= settings.warmup_rounds < settings.rounds:
        parser.error(
            f"--warmup-rounds must be >= 0 and below --rounds ({settings.rounds}); received {settings.warmup_rounds}."
        )
    return settings


# -- report ---------------------------------------------------------------------


def _format_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(value) for value in values) / len(values))


class _Report:
    """Prints one line per figure and collects the ratios (None where the other side is missing)."""

    def __init__(self, measurement: Measurement, settings: Settings, tf: Any, tfrecord_iterator: Any) -> None:
        self.measurement, self.settings = measurement, settings
        self.why_no_tf = (
            None if tf else ("tensorflow not installed" if settings.tensorflow else "skipped (--no-tensorflow)")
        )
        self.why_no_pkg = (
            None
            if tfrecord_iterator
            else ("tfrecord package not installed" if settings.tfrecord_package else "skipped (--no-tfrecord-package)")
        )
        self.ratios: dict[str, float | None] = {}

    def _side(self, reader: str, unit: str) -> str:
        m = self.measurement
        return (
            f"{m.rate(reader):.0f} {unit}/s ({m.wall(reader) * 1000:.2f} ms wall, cpu/wall {m.cores_used(reader):.2f})"
        )

    def line(
        self,
        name: str,
        figure: str,
        unit: str,
        ours: str,
        theirs: str,
        label: str,
        why_missing: str | None,
        note: str = "",
    ) -> None:
        head = f"{figure}: torchestimator {self._side(ours, unit)}"
        if why_missing is not None:
            print(f"{head}, {label} n/a ({why_missing})")
            self.ratios[name] = None
            return
        ratio = self.measurement.ratio(ours, theirs)
        kept = self.settings.rounds - self.settings.warmup_rounds
        print(
            f"{head}, {label} {self._side(theirs, unit)}, ratio {ratio:.3f} (per CPU second "
            f"{self.measurement.cpu_ratio(ours, theirs):.3f}; {kept} rounds{note})"
        )
        self.ratios[name] = ratio

    def parsed_summary(self) -> None:
        """parsed_vs_tfdata (geometric mean over batch sizes) and parsed_vs_tfdata_worst."""
        by_size = {size: self.ratios[f"parsed_vs_tfdata_b{size}"] for size in self.settings.batch_sizes}
        if self.why_no_tf is not None:
            self.ratios["parsed_vs_tfdata"] = self.ratios["parsed_vs_tfdata_worst"] = None
            return
        worst = min(by_size, key=lambda size: by_size[size])
        self.ratios["parsed_vs_tfdata"] = _geometric_mean(list(by_size.values()))
        self.ratios["parsed_vs_tfdata_worst"] = by_size[worst]
        print(
            f"parsed over batch sizes {','.join(map(str, by_size))}: geometric mean "
            f"{self.ratios['parsed_vs_tfdata']:.3f}, worst {by_size[worst]:.3f} (batch {worst})"
        )


def report(measurement: Measurement, tf: Any, tfrecord_iterator: Any, settings: Settings) -> dict[str, float | None]:
    """Prints one line per figure; returns the ratios in the final line's order."""
    out = _Report(measurement, settings, tf, tfrecord_iterator)
    out.line("raw_vs_tfdata", "raw", "records", "ours_raw", "tfdata_raw", "tf.data", out.why_no_tf)
    for size in settings.batch_sizes:
        out.line(
            f"parsed_vs_tfdata_b{size}",
            f"parsed_b{size}",
            "examples",
            f"ours_parsed_b{size}",
            f"tfdata_parsed_b{size}",
            "tf.data",
            out.why_no_tf,
        )
    out.parsed_summary()
    out.line("dataset_vs_tfdata", "dataset", "examples", "ours_dataset", "tfdata_dataset", "tf.data", out.why_no_tf)
    out.line(
        "raw_vs_tfrecord_pkg",
        "raw_tfrecord_pkg",
        "records",
        "ours_raw",
        "tfrecord_pkg_raw",
        "tfrecord package",
        out.why_no_pkg,
        note="; that reader does not check CRCs",
    )
    if "ours_raw_unverified" in measurement.rates:
        out.line(
            "raw_vs_tfrecord_pkg_unverified",
            "raw_tfrecord_pkg_unverified",
            "records",
            "ours_raw_unverified",
            "tfrecord_pkg_raw",
            "tfrecord package",
            out.why_no_pkg,
            note="; ours at verify=False: neither side checks CRCs",
        )
    order = [
        "raw_vs_tfdata",
        "parsed_vs_tfdata",
        "raw_vs_tfrecord_pkg",
        "dataset_vs_tfdata",
        "parsed_vs_tfdata_worst",
        *(f"parsed_vs_tfdata_b{size}" for size in settings.batch_sizes),
    ]
    return {name: out.ratios[name] for name in order}


def print_verdict(ratios: dict[str, float | None]) -> None:
    verdicts = [
        f"{name}>={target:g} " + ("n/a" if ratios[name] is None else "met" if ratios[name] >= target else "MISSED")
        for name, target in TARGETS.items()
    ]
    print("targets: " + ", ".join(verdicts))


def _print_header(settings: Settings, tf: Any, tfrecord_iterator: Any) -> None:
    print(
        f"tfrecord_read: {settings.records} records in {settings.files} files (int64 label, {settings.dense_length} "
        f"floats, {settings.image_bytes} image bytes, 0..{settings.max_tokens} int64 tokens), parsed at batch sizes "
        f"{','.join(map(str, settings.batch_sizes))} (tf.data raw at {settings.raw_batch_size}), dataset figure "
        f"on one {settings.dataset_records}-record file at batch {settings.dataset_batch_size}, {settings.threads} "
        f"thread(s), {settings.rounds} interleaved rounds (first {settings.warmup_rounds} dropped), medians, tf.data "
        + (
            "defaults (autotune, injected prefetch)"
            if settings.tfdata_defaults
            else "without autotune or injected prefetch"
        )
    )
    print(
        f"versions: torch {torch.__version__}, tensorflow "
        f"{getattr(tf, '__version__', 'not installed') if settings.tensorflow else 'skipped'}, tfrecord package "
        f"{('installed' if tfrecord_iterator else 'not installed') if settings.tfrecord_package else 'skipped'}; "
        f"torchestimator cores: {_native.describe()}"
    )
    if settings.quick:
        print(
            "note: --quick reads too few records for its figures to mean anything (start-up costs dominate); "
            "it checks that the script works"
        )
    if (settings.tensorflow and tf is None) or (settings.tfrecord_package and tfrecord_iterator is None):
        print(
            f"note: some readers to compare against are missing ({INSTALL_HINT}); "
            "torchestimator's own figures are still printed"
        )


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    load_at_start = _load()
    torch.set_num_threads(settings.threads)
    tf = import_tensorflow(settings.threads) if settings.tensorflow else None
    tfrecord_iterator = import_tfrecord_iterator() if settings.tfrecord_package else None
    _print_header(settings, tf, tfrecord_iterator)
    columns = make_columns(settings)
    with tempfile.TemporaryDirectory(prefix="tfrecord-read-") as directory:
        started = time.perf_counter()
        files = write_files(directory, serialize(columns), settings)
        dataset_file = write_dataset_file(directory, files, settings)
        megabytes = sum(os.path.getsize(path) for path in [*files, dataset_file]) / 2**20
        print(f"data: {megabytes:.1f} MiB written by torchestimator in {time.perf_counter() - started:.1f} s")
        problems = check_readers(files, dataset_file, columns, settings, tf, tfrecord_iterator)
        print(f"records identical: {'no: ' + '; '.join(problems) if problems else 'yes'}")
        found = conditions(files, dataset_file, directory, tf, tfrecord_iterator, load_at_start)
        measurement = measure(contenders(files, dataset_file, settings, tf, tfrecord_iterator), settings)
    ratios = report(measurement, tf, tfrecord_iterator, settings)
    print_verdict(ratios)
    for line in found.lines(measurement):
        print(line)
    print("tfrecord_read " + " ".join(f"{name}={_format_ratio(value)}" for name, value in ratios.items()))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
