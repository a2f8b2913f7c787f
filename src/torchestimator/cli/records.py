"""The TFRecord commands of `torchestimator`: convert, records inspect, records verify.

What belongs here: argument parsing and the command handlers for
`torchestimator convert csv-to-tfrecord`, `torchestimator records inspect` and
`torchestimator records verify`, plus what only they need (reading an index
CSV, typing its columns, decoding images, summarising a file's schema). What
does not: the record format and the Example codec (`torchestimator.data`).
`add_subcommands(subparsers)` adds the commands to the cli package's parser; each
handler takes the argparse Namespace and returns the exit code.

`convert csv-to-tfrecord` writes one tf.train.Example per CSV row:

- the label column (`--label_column`, default `label`) under its own name;
- the path column (`--path_column`, default `path`) under its own name, as
  written in the CSV (relative paths are resolved against the CSV's folder);
- `image`: the file's bytes as they are (`--image_mode encoded`, the default)
  with `image/format` (the lower-case file extension, e.g. `png`); or the
  decoded pixels (`--image_mode raw`, needs Pillow) as uint8 bytes in
  row-major height x width x channels order with `image/shape` = [H, W, C]
  (read back with `decode_raw(value, "uint8", shape)`). Raw pixels are
  `data.images.decode_image(bytes)`'s, TF's tf.io.decode_image default: the
  file's own channels (gray 1, gray+alpha 2, RGB 3, RGBA 4, palette 3 or 4),
  16-bit PNGs of every colour type as their high byte (dtype uint8), a GIF's
  first frame; PNG, JPEG, GIF and BMP files;
- every other column as a one-value feature typed by its column: int64 when
  every non-empty cell is an integer (written without leading zeros, within
  int64), float when every one is a number, bytes (UTF-8) otherwise; an
  empty cell gives an empty list.

Rows are split into contiguous, near-equal shards named
`OUT_PREFIX-00000-of-0000N.tfrecord` (formats.md 1.5), so reading the shards
in order gives the rows in CSV order. Shards are written under a `.partial`
name and renamed when all are complete, so a failed conversion leaves no
half-written shard behind.

Every file these commands read or write may be a URL (`s3://`, `gs://`,
`az://`, `memory://`; `_io/filesystems.py`): `records verify/inspect` read
objects and URL globs as files, `convert` reads the CSV and its images from a
store and writes shards to one. A store publishes each shard whole when it is
closed, so there shards are written under their own names (a rename is a copy
there), and a failed conversion removes the shards it had finished.

`records verify` and `records inspect` stop at the first damage in a file, naming it (`verify`
goes on with the next file); with `--skip_corrupt` they skip damaged records and read on, as the
library's `skip_corrupt=True` does (`data/tfrecord.py`), and list each damaged region skipped:
its byte offsets and what was wrong. (`convert` reads a CSV and images, no TFRecord, so it has
no such flag.)
"""

from __future__ import annotations

import argparse
import base64
import csv
import io
import json
import logging
import math
import os
import posixpath
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchestimator._extras import import_extra
from torchestimator._io import filesystems

logger = logging.getLogger(__name__)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
IMAGE_FEATURE = "image"
SHARD_SUFFIX = ".tfrecord"
_PREVIEW_VALUES = 16
_PREVIEW_BYTES = 48
_SKIP_HINT = "pass --skip_corrupt to skip damaged records and read on"
"""How the damage these commands report says it can be skipped (the library's wording names skip_corrupt=True)."""


def add_subcommands(subparsers: Any) -> Any:
    """Adds `convert` and `records` (with their own subcommands) to the `torchestimator` parser's subparsers;
    returns `convert`'s subparsers, for the conversions of other modules (``convert keras-model``)."""
    convert = subparsers.add_parser("convert", help="convert data to TFRecord files, or a Keras model to torch")
    convert_commands = convert.add_subparsers(dest="convert_command", required=True)
    csv_command = convert_commands.add_parser(
        "csv-to-tfrecord",
        help="an index CSV (label, file path, other columns) to sharded TFRecords of tf.train.Example",
        description="One tf.train.Example per CSV row; see the torchestimator.cli.records docstring for the schema.",
    )
    csv_command.add_argument("index", metavar="INDEX.csv", help="CSV with a header row")
    csv_command.add_argument("out_prefix", metavar="OUT_PREFIX", help="shards are OUT_PREFIX-00000-of-0000N.tfrecord")
    csv_command.add_argument("--num_shards", type=int, default=1, help="number of output files (default 1)")
    csv_command.add_argument("--label_column", default="label", help="column holding the label (default label)")
    csv_command.add_argument("--path_column", default="path", help="column holding the image file path (default path)")
    csv_command.add_argument(
        "--image_mode",
        choices=["encoded", "raw"],
        default="encoded",
        help="encoded: the file bytes as they are; raw: uint8 pixels as tf.io.decode_image gives "
        "them (the file's channels; 16-bit PNGs keep their high byte, TF's uint8 "
        "default; a GIF its first frame) plus image/shape",
    )
    csv_command.add_argument(
        "--compression",
        type=str.upper,
        choices=["NONE", "GZIP", "ZLIB"],
        default="NONE",
        help="compress each shard (default none)",
    )
    csv_command.add_argument("--no_progress", action="store_true", help="no progress bar")
    csv_command.set_defaults(handler=convert_csv_to_tfrecord)

    records = subparsers.add_parser("records", help="look into TFRecord files")
    records_commands = records.add_subparsers(dest="records_command", required=True)
    inspect = records_commands.add_parser("inspect", help="schema summary and the first records as JSON")
    inspect.add_argument("file", metavar="FILE", help="a TFRecord file (GZIP or ZLIB compressed ones too)")
    inspect.add_argument("--limit", type=int, default=3, help="records to print (default 3)")
    inspect.add_argument("--compression", default="auto", help="auto (default), none, GZIP or ZLIB")
    _add_max_record_size(inspect)
    _add_skip_corrupt(inspect)
    inspect.set_defaults(handler=inspect_records)

    verify = records_commands.add_parser("verify", help="check every CRC; exit code 1 when a file is damaged")
    verify.add_argument("files", metavar="FILES", nargs="+", help="paths or glob patterns")
    verify.add_argument("--compression", default="auto", help="auto (default), none, GZIP or ZLIB")
    _add_max_record_size(verify)
    _add_skip_corrupt(verify)
    verify.set_defaults(handler=verify_records)
    return convert_commands


def _add_max_record_size(command: argparse.ArgumentParser) -> None:
    from torchestimator.data.tfrecord import DEFAULT_MAX_RECORD_SIZE

    command.add_argument(
        "--max_record_size",
        type=int,
        default=DEFAULT_MAX_RECORD_SIZE,
        metavar="BYTES",
        help=f"a longer record is an error, so that a damaged length cannot exhaust "
        f"memory (default {DEFAULT_MAX_RECORD_SIZE}, protobuf's limit)",
    )


def _add_skip_corrupt(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--skip_corrupt",
        action="store_true",
        help="skip damaged records and read on, listing each damaged region, instead of stopping at the "
        "first damage in a file (a bad data CRC skips that record; after a damaged header the next "
        "valid record is searched for; a cut tail ends the file)",
    )


def _records_of(path: str, args: argparse.Namespace, stats: Any) -> Iterator[tuple[int, bytes]]:
    """`(offset, record)` of one file with the command's options; damage is a DataLossError whose hint
    names --skip_corrupt, or with --skip_corrupt a `DamagedRegion` in `stats`."""
    from torchestimator.data.tfrecord import _BLOCK_SIZE, _record_blocks

    for offsets, records in _record_blocks(
        path,
        None,
        _compression(args.compression),
        start_offset=0,
        skip_corrupt=args.skip_corrupt,
        verify=True,
        strict=True,
        stats=stats,
        block_size=_BLOCK_SIZE,
        max_record_size=args.max_record_size,
        hint=_SKIP_HINT,
        log_skips=False,  # the command lists the regions in its own output; the log line would repeat them
    ):
        yield from zip(offsets, records)


def _skipped_text(regions: Sequence[Any]) -> str:
    """E.g. "2 damaged regions skipped (2 records, 80 bytes): bytes 19..59 (40 bytes): data CRC mismatch; ..."."""
    records, size = sum(region.records for region in regions), sum(region.size for region in regions)
    listed = "; ".join(region.describe() for region in regions)
    return f"{len(regions)} damaged regions skipped ({records} records, {size} bytes): {listed}"


def _compression(text: str | None) -> str | None:
    return None if text is None or text.upper() in ("", "NONE") else text


# --------------------------------------------------------------------------- convert csv-to-tfrecord


@dataclass(frozen=True, kw_only=True)
class IndexTable:
    """The rows of an index CSV with each column's feature kind."""

    path: str
    """The CSV file."""
    columns: list[str]
    """Column names in CSV order."""
    rows: list[dict[str, str]]
    """Cells by column name, one dict per data row."""
    kinds: dict[str, str] = field(default_factory=dict)
    """Feature kind per column: "int64", "float" or "bytes"."""


def read_index(path: str, *, label_column: str, path_column: str) -> IndexTable:
    """Reads the CSV, checks its columns and types each column."""
    with _open_text(path) as file:
        reader = csv.DictReader(file)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    for role, name in (("--label_column", label_column), ("--path_column", path_column)):
        if name not in columns:
            raise ValueError(
                f"{path}: {role} {name!r} is not a column; the header has {columns}. "
                f"Pass {role} with one of those names."
            )
    if label_column == path_column:
        raise ValueError(f"--label_column and --path_column are both {label_column!r}; they must differ.")
    taken = {IMAGE_FEATURE, f"{IMAGE_FEATURE}/shape", f"{IMAGE_FEATURE}/format"} & set(columns)
    if taken:
        raise ValueError(
            f"{path}: column(s) {sorted(taken)} clash with the image features the converter writes "
            f"(image, image/shape, image/format); rename them in the CSV."
        )
    if not rows:
        raise ValueError(f"{path} has a header but no rows; there is nothing to convert.")
    short = [index + 1 for index, row in enumerate(rows) if None in row.values() or None in row]
    if short:
        raise ValueError(
            f"{path}: row {short[0]} (line {short[0] + 1}) has a different number of cells than "
            f"the header ({len(columns)} columns)."
        )
    kinds = {column: column_kind(row[column] for row in rows) for column in columns if column != path_column}
    kinds[path_column] = "bytes"
    return IndexTable(path=path, columns=columns, rows=rows, kinds=kinds)


def _open_text(path: str) -> Any:
    """The CSV as text: a local file, or an object read whole (a URL)."""
    if filesystems.is_url(path):
        return io.StringIO(filesystems.read_bytes(path).decode("utf-8-sig"), newline="")
    return open(path, newline="", encoding="utf-8-sig")


def _int_form(text: str) -> str | None:
    """ "int" for a plain int64, "text" for digits that a number would change, None otherwise."""
    try:
        value = int(text)
    except ValueError:
        return None
    # "007", "+3" or a 20-digit id would lose how they were written as int64 or float: keep them as text.
    return "int" if str(value) == text and INT64_MIN <= value <= INT64_MAX else "text"


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def column_kind(cells: Iterator[str] | Sequence[str]) -> str:
    """int64 if every non-empty cell is a plain int64, float if every one is a number, else bytes.

    Integers written with leading zeros or a sign, or beyond int64, make the column bytes (ids, zip codes).
    """
    values = [cell.strip() for cell in cells if cell.strip()]
    if not values:
        return "bytes"
    forms = {_int_form(value) for value in values}
    if forms == {"int"}:
        return "int64"
    if "text" not in forms and all(_is_float(value) for value in values):
        return "float"
    return "bytes"


def cell_values(text: str, kind: str) -> list[Any]:
    text = text.strip() if kind != "bytes" else text
    if not text:
        return []
    if kind == "int64":
        return [int(text)]
    if kind == "float":
        return [float(text)]
    return [text.encode("utf-8")]


def resolve_image_paths(table: IndexTable, path_column: str) -> list[str]:
    """Absolute image paths (or URLs); the first missing file is an error naming its row.

    A relative path is resolved against the CSV's folder, which for a CSV in a store is its URL's prefix;
    a URL is taken as it is."""
    resolved = []
    for index, row in enumerate(table.rows):
        given = row[path_column].strip()
        path = _image_path(table.path, given)
        if not given or not _is_file(path):
            raise ValueError(
                f"{table.path}: row {index + 1} (line {index + 2}): image file {given!r} "
                f"{'is empty' if not given else f'does not exist (looked for {path})'}. "
                f"Relative paths are resolved against the CSV's folder; fix the path or remove the row."
            )
        resolved.append(path)
    return resolved


def _image_path(csv_path: str, given: str) -> str:
    if filesystems.is_url(given):
        return given
    if filesystems.is_url(csv_path):
        scheme, rest = csv_path.split("://", 1)
        return f"{scheme}://{posixpath.normpath(posixpath.join(posixpath.dirname(rest), given))}"
    base = os.path.dirname(os.path.abspath(csv_path))
    return os.path.normpath(os.path.join(base, os.path.expanduser(given)))


def _is_file(path: str) -> bool:
    if filesystems.is_url(path):
        return filesystems.exists(path) and not filesystems.is_dir(path)
    return os.path.isfile(path)


def _pillow_image() -> Any:
    """PIL.Image, or MissingExtraError naming the images extra (and saying why: missing, or installed but broken)."""
    return import_extra(
        "PIL.Image",
        extra="images",
        feature="decoding images (--image_mode raw)",
        alternative="pass --image_mode encoded to store the file bytes as they are",
    )


def image_features(path: str, mode: str, where: str) -> dict[str, list[Any]]:
    """The image features of one row: encoded file bytes, or raw uint8 pixels plus their shape."""
    if mode == "encoded":
        content = filesystems.read_bytes(path)
        extension = os.path.splitext(path)[1].lstrip(".").lower()
        return {IMAGE_FEATURE: [content], f"{IMAGE_FEATURE}/format": [extension.encode()]}
    pixels = decode_image(path, where)
    height, width = pixels.shape[:2]
    return {IMAGE_FEATURE: [pixels.tobytes()], f"{IMAGE_FEATURE}/shape": [height, width, pixels.shape[2]]}


def decode_image(path: str, where: str) -> np.ndarray:
    """uint8 pixels, height x width x channels, as tf.io.decode_image(contents) gives them (data/images.py)."""
    from torchestimator.data.images import ImageDecodeError, decode_image as decode

    _pillow_image()
    contents = filesystems.read_bytes(path)
    try:
        return decode(contents, expand_animations=False, where=f"{where}: {path}")
    except ImageDecodeError as error:
        reason = str(error).removeprefix(f"{error.where}: ")
        raise ImageDecodeError(
            f"{error.where} is not an image --image_mode raw can decode ({reason.rstrip('.')}); "
            f"use --image_mode encoded to store the bytes as they are.",
            where=error.where,
            format=error.format,
        ) from None


def shard_paths(out_prefix: str, num_shards: int) -> list[str]:
    return [f"{out_prefix}-{index:05d}-of-{num_shards:05d}{SHARD_SUFFIX}" for index in range(num_shards)]


def shard_bounds(num_rows: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) row ranges whose sizes differ by at most one."""
    base, extra = divmod(num_rows, num_shards)
    bounds, start = [], 0
    for index in range(num_shards):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def row_example(table: IndexTable, index: int, image_path: str, image_mode: str) -> bytes:
    from torchestimator.data.example import encode_example

    row = table.rows[index]
    where = f"{table.path}: row {index + 1} (line {index + 2})"
    features = {column: cell_values(row[column], table.kinds[column]) for column in table.columns}
    kinds = dict(table.kinds)
    image = image_features(image_path, image_mode, where)
    features.update(image)
    kinds.update({name: "int64" if name.endswith("/shape") else "bytes" for name in image})
    return encode_example(features, kinds=kinds)


def convert_csv_to_tfrecord(args: argparse.Namespace) -> int:
    """`torchestimator convert csv-to-tfrecord INDEX.csv OUT_PREFIX --num_shards N`."""
    from torchestimator.data.tfrecord import TFRecordWriter

    if args.num_shards < 1:
        raise ValueError(f"--num_shards must be at least 1; received {args.num_shards}.")
    if args.image_mode == "raw":
        _pillow_image()  # fail before reading anything when Pillow is missing
    table = read_index(args.index, label_column=args.label_column, path_column=args.path_column)
    image_paths = resolve_image_paths(table, args.path_column)
    paths = shard_paths(args.out_prefix, args.num_shards)
    # A store publishes each shard whole when its writer closes: no ".partial" name to rename (a copy there)
    remote = filesystems.is_url(args.out_prefix)
    if not remote:
        os.makedirs(os.path.dirname(os.path.abspath(args.out_prefix)), exist_ok=True)
    progress = _progress_bar(len(table.rows), disabled=args.no_progress)
    compression = _compression(args.compression)
    written: list[str] = []
    try:
        for path, (start, stop) in zip(paths, shard_bounds(len(table.rows), args.num_shards)):
            written.append(path if remote else path + ".partial")
            with TFRecordWriter(written[-1], compression=compression) as writer:
                for index in range(start, stop):
                    writer.write(row_example(table, index, image_paths[index], args.image_mode))
                    progress.update(1)
    except BaseException:
        for partial in written:
            filesystems.remove(partial)  # a missing one (a store's aborted upload) is not an error
        raise
    finally:
        progress.close()
    if not remote:
        for partial, path in zip(written, paths):
            os.replace(partial, path)
    schema = ", ".join(f"{name} {kind}" for name, kind in _converted_kinds(table, args.image_mode).items())
    print(
        f"wrote {len(table.rows)} records to {args.num_shards} shard(s) {paths[0]}"
        f"{' ... ' + paths[-1] if len(paths) > 1 else ''}; features: {schema}"
    )
    return 0


def _converted_kinds(table: IndexTable, image_mode: str) -> dict[str, str]:
    extra = {f"{IMAGE_FEATURE}/shape": "int64"} if image_mode == "raw" else {f"{IMAGE_FEATURE}/format": "bytes"}
    return {**{column: table.kinds[column] for column in table.columns}, IMAGE_FEATURE: "bytes", **extra}


def _progress_bar(total: int, *, disabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="row", desc="csv-to-tfrecord", disable=disabled or not sys.stderr.isatty())


# --------------------------------------------------------------------------- records inspect


@dataclass(kw_only=True)
class FeatureSummary:
    """What one feature looked like across the records that have it."""

    kinds: set[str] = field(default_factory=set)
    """Kinds seen ("int64", "float", "bytes", or "none" for a Feature with no list set)."""
    records: int = 0
    """Records holding the feature."""
    smallest: int = math.inf  # type: ignore[assignment]
    """Fewest values (for a feature list: fewest frames)."""
    largest: int = 0
    """Most values (for a feature list: most frames)."""
    frame_smallest: int = math.inf  # type: ignore[assignment]
    """Feature lists only: fewest values in one frame."""
    frame_largest: int = 0
    """Feature lists only: most values in one frame."""

    def add(self, kind: str | None, count: int) -> None:
        self.kinds.add(kind or "none")
        self.records += 1
        self.smallest, self.largest = min(self.smallest, count), max(self.largest, count)

    def add_frames(self, kind: str | None, frames: list[Any]) -> None:
        self.add(kind, len(frames))
        for frame in frames:
            self.frame_smallest = min(self.frame_smallest, len(frame))
            self.frame_largest = max(self.frame_largest, len(frame))


def _kind_of(values: Any) -> str | None:
    if isinstance(values, np.ndarray):
        return "float" if values.dtype.kind == "f" else "int64"
    return "bytes" if values else None


def summarize_record(
    record: bytes, context: dict[str, FeatureSummary], lists: dict[str, FeatureSummary]
) -> tuple[dict, dict]:
    """Decodes one record (Example or SequenceExample) and adds it to the summaries."""
    from torchestimator.data.example import decode_sequence_example, example_kinds

    try:
        features, feature_lists = decode_sequence_example(record)
    except ValueError:
        from torchestimator.data.example import decode_example

        decode_example(record)  # raises with the Example wording, which is what most files hold
        raise
    kinds = example_kinds(record) if not feature_lists else {}
    for name, values in features.items():
        context.setdefault(name, FeatureSummary()).add(kinds.get(name) or _kind_of(values), len(values))
    for name, frames in feature_lists.items():
        kind = next((_kind_of(frame) for frame in frames if _kind_of(frame)), None)
        lists.setdefault(name, FeatureSummary()).add_frames(kind, frames)
    return features, feature_lists


def preview_values(values: Any) -> list[Any]:
    """JSON-friendly values: short text as text, other bytes as base64, float32 as its short repr."""
    items = list(values[:_PREVIEW_VALUES])
    shown: list[Any] = [_preview_value(item) for item in items]
    if len(values) > _PREVIEW_VALUES:
        shown.append(f"... ({len(values)} values)")
    return shown


def _preview_value(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            text = bytes(value).decode("utf-8")
            if len(text) <= _PREVIEW_BYTES and text.isprintable():
                return text
        except UnicodeDecodeError:
            pass
        head = base64.b64encode(bytes(value[:_PREVIEW_BYTES])).decode("ascii")
        return f"base64:{head}" + (f"... ({len(value)} bytes)" if len(value) > _PREVIEW_BYTES else "")
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            return str(number)
        return float(str(np.float32(number))) if isinstance(value, np.float32) else number
    return int(value)


def _range(low: float, high: int) -> str:
    low = 0 if low == math.inf else int(low)
    return f"{low}" if low == high else f"{low}..{high}"


def _schema_lines(title: str, summaries: dict[str, FeatureSummary], total: int, frames: bool) -> list[str]:
    if not summaries:
        return []
    width = max(len("feature"), *(len(name) for name in summaries))
    header = f"  {'feature':<{width}}  {'kind':<7}  {'frames' if frames else 'values':<8}"
    header += f"  {'values/frame':<12}" if frames else ""
    lines = [title, header + "  in records"]
    for name in sorted(summaries):
        summary = summaries[name]
        kind = "/".join(sorted(summary.kinds))
        line = f"  {name:<{width}}  {kind:<7}  {_range(summary.smallest, summary.largest):<8}"
        if frames:
            line += f"  {_range(summary.frame_smallest, summary.frame_largest):<12}"
        lines.append(f"{line}  {summary.records}/{total}")
    return lines


def inspect_records(args: argparse.Namespace) -> int:
    """`torchestimator records inspect FILE`: record count, schema summary, the first records as JSON."""
    from torchestimator.data.tfrecord import ReadStats, describe_reader

    if args.limit < 0:
        raise ValueError(f"--limit must be >= 0; received {args.limit}.")
    context: dict[str, FeatureSummary] = {}
    lists: dict[str, FeatureSummary] = {}
    shown: list[str] = []
    count, undecodable = 0, None
    stats = ReadStats()
    for offset, record in _records_of(args.file, args, stats):
        count += 1
        try:
            features, feature_lists = summarize_record(record, context, lists)
        except ValueError as error:
            undecodable = undecodable or f"record {count - 1} at offset {offset}: {error}"
            features, feature_lists = None, None
        if len(shown) < args.limit:
            shown.append(_record_json(count - 1, offset, record, features, feature_lists))
    message = "tf.train.SequenceExample" if lists else "tf.train.Example"
    print(f"{args.file}: {count} records" + (f" ({message})" if count and not undecodable else ""))
    if stats.regions:
        print(f"  {_skipped_text(stats.regions)}")
    if undecodable:
        print(f"  not every record is a tf.train.Example; first failure: {undecodable}")
    schema = _schema_lines("context features:" if lists else "features:", context, count, frames=False) + _schema_lines(
        "feature lists:", lists, count, frames=True
    )
    if schema:
        print("\n".join(schema))
    if shown:
        print(f"first {len(shown)} records:")
        print("\n".join(shown))
    print(f"reader: {describe_reader()}")
    return 0


def _record_json(index: int, offset: int, record: bytes, features: dict | None, feature_lists: dict | None) -> str:
    entry: dict[str, Any] = {"record": index, "offset": offset, "bytes": len(record)}
    if features is None:
        entry["raw"] = _preview_value(record)
    elif feature_lists:
        entry["context"] = {name: preview_values(features[name]) for name in sorted(features)}
        entry["feature_lists"] = {
            name: [preview_values(frame) for frame in feature_lists[name][:_PREVIEW_VALUES]]
            for name in sorted(feature_lists)
        }
    else:
        entry["features"] = {name: preview_values(features[name]) for name in sorted(features)}
    return json.dumps(entry, ensure_ascii=False)


# --------------------------------------------------------------------------- records verify


def verify_records(args: argparse.Namespace) -> int:
    """`torchestimator records verify FILES...`: every CRC of every file; exit code 1 when any is damaged
    (with --skip_corrupt too: it reads on past the damage and lists it)."""
    from torchestimator.data.tfrecord import DataLossError, ReadStats, list_files

    paths = [path for pattern in args.files for path in list_files(pattern)]
    damaged, total, stats = 0, 0, ReadStats()
    for path in paths:
        count, skipped = 0, len(stats.regions)
        try:
            for _ in _records_of(path, args, stats):
                count += 1
        except DataLossError as error:
            damaged += 1
            print(f"DAMAGED {path}: {count} good records, first bad record at offset {error.offset}: {error}")
        else:
            if len(stats.regions) > skipped:
                damaged += 1
                print(f"DAMAGED {path}: {count} good records, {_skipped_text(stats.regions[skipped:])}")
            else:
                print(f"OK      {path}: {count} records")
        total += count
    summary = f"verified {len(paths)} file(s): {len(paths) - damaged} ok, {damaged} damaged, {total} good records"
    if stats.regions:
        summary += f", {stats.skipped_records} damaged records ({stats.skipped_bytes} bytes) skipped"
    print(summary)
    return 1 if damaged else 0
