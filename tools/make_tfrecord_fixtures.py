"""Make the TFRecord interop fixtures in tests/fixtures/tfrecord/ with real TensorFlow.

Not part of the package and never run by CI: TensorFlow lives in a throwaway
virtual environment, and what this script writes is committed. Three modes:

* no flag (TensorFlow's python): TF writes plain, GZIP and ZLIB files of
  tf.train.Example and SequenceExample records, damaged copies of them, and
  JSON holding what TF reads back, how TF parses them under given specs, and
  the exact bytes TF serializes for a few single-feature messages.
* ``--write-ours DIR`` (the project's python, no TensorFlow): torchestimator
  writes files described in DIR/ours_manifest.json.
* ``--read-with-tf DIR`` (TensorFlow's python): TF reads those files and saves
  what it saw in DIR/ours_read_by_tf.json.

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu==2.21.0 numpy
    /tmp/tfenv/bin/python tools/make_tfrecord_fixtures.py
    .venv/bin/python tools/make_tfrecord_fixtures.py --write-ours tests/fixtures/tfrecord
    /tmp/tfenv/bin/python tools/make_tfrecord_fixtures.py --read-with-tf tests/fixtures/tfrecord

JSON conventions (shared with tests/test_tf_interop.py): bytes are base64;
floats are JSON numbers except nan/inf/-inf, which are the strings "nan",
"inf", "-inf"; a dense result is {"dtype", "shape", "values" (flat, row-major)};
a sparse one {"sparse": {"indices", "values", "dense_shape"}}; a ragged one
{"ragged": {"flat_values", "nested_row_splits"}}.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import re
import struct
import sys
import zlib
from typing import Any

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tfrecord")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Feature values as (kind, values); kind is one of int64, float, bytes.
EXAMPLES: list[dict[str, tuple[str, list[Any]]]] = [
    {
        "label": ("int64", [3]),
        "vec": ("float", [0.5, -1.25, 2.0]),
        "matrix": ("float", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        "name": ("bytes", [b"first"]),
        "ints": ("int64", [INT64_MIN, INT64_MAX, 0, -1, 1, 300]),
        "floats": ("float", [0.1, -0.0, math.inf, -math.inf, math.nan, 1e-45, 3.4028234663852886e38]),
        "text": ("bytes", ["héllo".encode(), "日本語".encode(), b"", b"\x00\xff\x80"]),
        "tokens": ("int64", [5, 6, 7]),
        "pairs": ("int64", [1, 2, 3, 4]),
    },
    {
        "label": ("int64", [INT64_MAX]),
        "vec": ("float", [1.0, 2.0, 3.0]),
        "matrix": ("float", [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0]),
        "ints": ("int64", []),
        "floats": ("float", []),
        "text": ("bytes", []),
        "tokens": ("int64", []),
        "pairs": ("int64", []),
    },
    {
        "label": ("int64", [INT64_MIN]),
        "matrix": ("float", [0.0] * 6),
        "name": ("bytes", ["emoji 🙂".encode()]),
        "ints": ("int64", [42]),
        "floats": ("float", [-0.0]),
        "text": ("bytes", [b"x" * 300]),
        "tokens": ("int64", [9]),
        "pairs": ("int64", [-7, 8]),
    },
]

# SequenceExample records: (context, feature_lists).
SEQUENCE_EXAMPLES: list[tuple[dict[str, tuple[str, list[Any]]], dict[str, tuple[str, list[list[Any]]]]]] = [
    (
        {"length": ("int64", [2]), "name": ("bytes", ["séq".encode()]), "weights": ("float", [0.25, math.nan])},
        {
            "tok": ("int64", [[7], [8, 9]]),
            "frames": ("float", [[1.0, 2.0], [3.0, -0.0]]),
            "words": ("bytes", [[b"a", "ü".encode()], []]),
            "ids": ("int64", [[INT64_MIN], [INT64_MAX]]),
            "empty_list": ("int64", []),
        },
    ),
    (
        {"length": ("int64", [3]), "weights": ("float", [])},
        {
            "tok": ("int64", [[], [1], [2, 3, 4]]),
            "frames": ("float", [[0.5, 0.5], [math.inf, -math.inf], [1e-45, 2.0]]),
            "words": ("bytes", [[b""], ["日".encode()], [b"\xff"]]),
            "ids": ("int64", [[1], [2], [3]]),
            "empty_list": ("int64", []),
        },
    ),
]


# --------------------------------------------------------------------------- JSON helpers (no TF)


def b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def float_json(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def values_json(kind: str, values: list[Any]) -> list[Any]:
    if kind == "float":
        return [float_json(float(value)) for value in values]
    if kind == "bytes":
        return [b64(value) for value in values]
    return [int(value) for value in values]


def features_json(features: dict[str, tuple[str, list[Any]]]) -> dict[str, Any]:
    return {name: {"kind": kind, "values": values_json(kind, values)} for name, (kind, values) in features.items()}


def feature_lists_json(lists: dict[str, tuple[str, list[list[Any]]]]) -> dict[str, Any]:
    return {
        name: {"kind": kind, "values": [values_json(kind, step) for step in steps]}
        for name, (kind, steps) in lists.items()
    }


def write_json(directory: str, name: str, content: Any) -> None:
    with open(os.path.join(directory, name), "w", encoding="utf-8") as file:
        json.dump(content, file, indent=1, sort_keys=False, ensure_ascii=True)
        file.write("\n")


def frame_offsets(stream: bytes) -> list[tuple[int, int]]:
    """(offset, length) of each complete record of an uncompressed TFRecord stream (formats.md 1.1)."""
    result, offset = [], 0
    while offset + 12 <= len(stream):
        (length,) = struct.unpack_from("<Q", stream, offset)
        if offset + 16 + length > len(stream):
            break
        result.append((offset, length))
        offset += 16 + length
    return result


def uncompressed(path: str, compression: str) -> bytes:
    with open(path, "rb") as file:
        data = file.read()
    if compression == "GZIP":
        return zlib.decompress(data, 31)
    if compression == "ZLIB":
        return zlib.decompress(data, 15)
    return data


# --------------------------------------------------------------------------- TensorFlow side


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    return tf


def tf_feature(tf: Any, kind: str, values: list[Any]) -> Any:
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def tf_example(tf: Any, features: dict[str, tuple[str, list[Any]]]) -> Any:
    return tf.train.Example(
        features=tf.train.Features(
            feature={name: tf_feature(tf, kind, values) for name, (kind, values) in features.items()}
        )
    )


def tf_sequence_example(tf: Any, context: dict, lists: dict) -> Any:
    feature_lists = {
        name: tf.train.FeatureList(feature=[tf_feature(tf, kind, step) for step in steps])
        for name, (kind, steps) in lists.items()
    }
    return tf.train.SequenceExample(
        context=tf.train.Features(
            feature={name: tf_feature(tf, kind, values) for name, (kind, values) in context.items()}
        ),
        feature_lists=tf.train.FeatureLists(feature_list=feature_lists),
    )


def tf_write(tf: Any, path: str, records: list[bytes], compression: str) -> None:
    options = tf.io.TFRecordOptions(compression_type=compression)
    with tf.io.TFRecordWriter(path, options=options) as writer:
        for record in records:
            writer.write(record)


def tf_read(tf: Any, path: str, compression: str) -> dict[str, Any]:
    """What tf.data.TFRecordDataset yields from a file, and the error that stops it (if any)."""
    records: list[bytes] = []
    error = None
    try:
        for record in tf.data.TFRecordDataset(path, compression_type=compression).as_numpy_iterator():
            records.append(bytes(record))
    except tf.errors.OpError as exception:
        message = strip_function_node(exception.message)
        found = re.search(r"record at (\d+)", message)
        # For a data CRC mismatch TF names the offset of the data (record start + 12),
        # for everything else the record start; "message_offset" is whatever TF wrote.
        error = {
            "type": type(exception).__name__,
            "message": message,
            "message_offset": int(found.group(1)) if found else None,
        }
    ignored = [
        bytes(record)
        for record in tf.data.TFRecordDataset(path, compression_type=compression).ignore_errors().as_numpy_iterator()
    ]
    return {"records": [b64(record) for record in records], "error": error, "ignore_errors_count": len(ignored)}


def tensor_json(tf: Any, value: Any) -> dict[str, Any]:
    if isinstance(value, tf.SparseTensor):
        return {
            "sparse": {
                "indices": value.indices.numpy().tolist(),
                "values": tensor_json(tf, value.values),
                "dense_shape": value.dense_shape.numpy().tolist(),
            }
        }
    if isinstance(value, tf.RaggedTensor):
        return {
            "ragged": {
                "flat_values": tensor_json(tf, value.flat_values),
                "nested_row_splits": [split.numpy().tolist() for split in value.nested_row_splits],
            }
        }
    dtype = value.dtype.name
    array = value.numpy()
    if dtype == "string":  # a scalar string tensor comes back as plain bytes
        array = numpy_object_array(array)
    flat = array.reshape(-1).tolist()
    kind = {"float32": "float", "string": "bytes"}.get(dtype, "int64")
    return {"dtype": dtype, "shape": list(array.shape), "values": values_json(kind, flat)}


def numpy_object_array(value: Any) -> Any:
    import numpy as np

    if isinstance(value, bytes):
        array = np.empty((), dtype=object)
        array[()] = value
        return array
    return np.asarray(value, dtype=object)


def decoded_example_json(tf: Any, record: bytes) -> dict[str, Any]:
    """TF's proto view of an Example: name -> {kind, values}; kind "none" when no list is set."""
    example = tf.train.Example.FromString(record)
    return {name: feature_proto_json(feature) for name, feature in sorted(example.features.feature.items())}


def feature_proto_json(feature: Any) -> dict[str, Any]:
    which = feature.WhichOneof("kind")
    kind = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes", None: "none"}[which]
    values = list(getattr(feature, which).value) if which else []
    return {"kind": kind, "values": values_json(kind, values)}


def decoded_sequence_json(tf: Any, record: bytes) -> dict[str, Any]:
    sequence = tf.train.SequenceExample.FromString(record)
    context = {name: feature_proto_json(feature) for name, feature in sorted(sequence.context.feature.items())}
    lists = {
        name: [feature_proto_json(feature) for feature in feature_list.feature]
        for name, feature_list in sorted(sequence.feature_lists.feature_list.items())
    }
    return {"context": context, "feature_lists": lists}


# --------------------------------------------------------------------------- parsing specs


def fixed(shape: list[int], dtype: str, default: Any = None) -> dict[str, Any]:
    return {"kind": "FixedLenFeature", "shape": shape, "dtype": dtype, "default_value": default}


def varlen(dtype: str) -> dict[str, Any]:
    return {"kind": "VarLenFeature", "dtype": dtype}


def sequence(shape: list[int], dtype: str, allow_missing: bool = False, default: Any = None) -> dict[str, Any]:
    return {
        "kind": "FixedLenSequenceFeature",
        "shape": shape,
        "dtype": dtype,
        "allow_missing": allow_missing,
        "default_value": default,
    }


def ragged(dtype: str) -> dict[str, Any]:
    return {"kind": "RaggedFeature", "dtype": dtype}


EXAMPLE_SPECS: dict[str, dict[str, dict[str, Any]]] = {
    "dense_sparse_sequence": {
        "label": fixed([], "int64"),
        "vec": fixed([3], "float32", [-1.0, -1.0, -1.0]),
        "matrix": fixed([2, 3], "float32"),
        "name": fixed([], "string", "none"),
        "ints": varlen("int64"),
        "floats": varlen("float32"),
        "text": varlen("string"),
        "tokens": sequence([], "int64", allow_missing=True, default=-1),
        "pairs": sequence([2], "int64", allow_missing=True),
        "absent": varlen("int64"),
        "absent_sequence": sequence([], "float32", allow_missing=True),
    },
    "ragged": {
        "tokens": ragged("int64"),
        "text": ragged("string"),
        "floats": ragged("float32"),
        "absent": ragged("int64"),
    },
}

SEQUENCE_SPECS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "context_and_lists": (
        {
            "length": fixed([], "int64"),
            "name": fixed([], "string", "anon"),
            "weights": varlen("float32"),
            "missing_context": fixed([], "int64", 5),
        },
        {
            "frames": sequence([2], "float32"),
            "tok": ragged("int64"),
            "words": varlen("string"),
            "ids": sequence([], "int64"),
            "empty_list": sequence([], "int64"),
            "missing_list": sequence([], "float32", allow_missing=True),
        },
    ),
}

# (name, Example records, spec); the last record is the bad one. parse_single_example
# runs on the last record and parse_example on all of them, so TF names the index.
EXAMPLE_ERROR_CASES: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("missing_required", [{"a": ("int64", [1])}], {"z": fixed([], "int64")}),
    ("int64_count", [{"a": ("int64", [1, 2, 3])}, {"a": ("int64", [1, 2])}], {"a": fixed([3], "int64")}),
    ("float_count", [{"f": ("float", [1.0, 2.0])}, {"f": ("float", [1.0])}], {"f": fixed([2], "float32")}),
    ("bytes_count", [{"s": ("bytes", [b"x"])}, {"s": ("bytes", [b"x", b"y"])}], {"s": fixed([], "string")}),
    ("kind_mismatch", [{"a": ("float", [1.0])}, {"a": ("int64", [1])}], {"a": fixed([], "float32")}),
    ("varlen_kind_mismatch", [{"a": ("int64", [1])}, {"a": ("bytes", [b"x"])}], {"a": varlen("int64")}),
    (
        "sequence_feature_count",
        [{"t": ("int64", [1, 2])}, {"t": ("int64", [1, 2, 3])}],
        {"t": sequence([2], "int64", allow_missing=True)},
    ),
    ("invalid_proto", [{"a": ("int64", [1])}, b"\n\x05abc"], {"a": varlen("int64")}),
    ("sequence_feature_without_allow_missing", [{"t": ("int64", [1])}], {"t": sequence([], "int64")}),
]

# (name, SequenceExample index in SEQUENCE_EXAMPLES, context spec, sequence spec)
SEQUENCE_ERROR_CASES: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = [
    ("frame_size", 0, {}, {"tok": sequence([], "int64")}),
    ("missing_feature_list", 0, {}, {"missing": sequence([], "int64")}),
    ("context_kind_mismatch", 0, {"length": fixed([], "float32")}, {}),
    ("sequence_kind_mismatch", 0, {}, {"words": varlen("int64")}),
    ("missing_context", 1, {"name": fixed([], "string")}, {}),
]


def tf_dtype(tf: Any, name: str) -> Any:
    return {"int64": tf.int64, "float32": tf.float32, "string": tf.string}[name]


def default_from_json(dtype: str, value: Any) -> Any:
    if value is None or dtype != "string":
        return value
    return [item.encode() for item in value] if isinstance(value, list) else value.encode()


def tf_spec(tf: Any, spec: dict[str, Any]) -> Any:
    dtype = tf_dtype(tf, spec["dtype"])
    kind = spec["kind"]
    if kind == "FixedLenFeature":
        return tf.io.FixedLenFeature(spec["shape"], dtype, default_from_json(spec["dtype"], spec["default_value"]))
    if kind == "VarLenFeature":
        return tf.io.VarLenFeature(dtype)
    if kind == "FixedLenSequenceFeature":
        return tf.io.FixedLenSequenceFeature(
            spec["shape"], dtype, spec["allow_missing"], default_from_json(spec["dtype"], spec["default_value"])
        )
    return tf.io.RaggedFeature(dtype)


def tf_specs(tf: Any, specs: dict[str, Any]) -> dict[str, Any]:
    return {name: tf_spec(tf, spec) for name, spec in specs.items()}


def outcome(tf: Any, function: Any) -> dict[str, Any]:
    """{"result": ...} or {"error": {"type", "message"}} for one TF parsing call."""
    try:
        result = function()
    except (tf.errors.OpError, ValueError, TypeError) as exception:
        message = exception.message if isinstance(exception, tf.errors.OpError) else str(exception)
        return {"error": {"type": type(exception).__name__, "message": strip_function_node(message)}}
    if isinstance(result, tuple):
        return {"result": [{name: tensor_json(tf, value) for name, value in part.items()} for part in result]}
    return {"result": {name: tensor_json(tf, value) for name, value in result.items()}}


def strip_function_node(message: str) -> str:
    # Eager op errors start with "{{function_node __wrapped__...}} "; the rest is the message.
    if message.startswith("{{function_node"):
        message = message.split("}} ", 1)[-1]
    return message.split(" [Op:", 1)[0]


# --------------------------------------------------------------------------- hand-made protobuf bytes


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example_from_entries(entries: list[tuple[str, bytes]]) -> bytes:
    """Example{features{feature: entries in the given order, duplicates allowed}} from Feature bytes."""
    features = b"".join(field(1, field(1, name.encode()) + field(2, feature)) for name, feature in entries)
    return field(1, features)


def edge_records() -> list[tuple[str, bytes]]:
    """Valid protobuf that TF's own Python writer never produces, but other writers may."""
    unpacked_int64 = field(3, varint(1 << 3 | 0) + varint(1) + varint(1 << 3 | 0) + varint(INT64_MIN))
    unpacked_float = field(2, b"".join(bytes([1 << 3 | 5]) + struct.pack("<f", value) for value in (1.5, -2.0)))
    # A packed list split in two chunks: parsers must concatenate them.
    split_packed = field(3, field(1, varint(4) + varint(5)) + field(1, varint(6)))
    unknown_field = varint(7 << 3 | 0) + varint(99)
    return [
        ("unpacked_lists", example_from_entries([("a", unpacked_int64), ("f", unpacked_float)])),
        ("split_packed_list", example_from_entries([("a", split_packed)])),
        ("feature_without_kind", example_from_entries([("a", field(3, field(1, varint(1)))), ("none", b"")])),
        (
            "duplicate_key_last_wins",
            example_from_entries([("a", field(3, field(1, varint(1)))), ("a", field(3, field(1, varint(2))))]),
        ),
        ("empty_message", b""),
        ("empty_features", field(1, b"")),
        ("unknown_field", example_from_entries([("a", field(3, field(1, varint(3))))]) + unknown_field),
    ]


EDGE_SPECS: dict[str, dict[str, Any]] = {
    "varlen": {"a": varlen("int64"), "f": varlen("float32"), "none": varlen("int64")},
    "defaults": {"a": fixed([], "int64", -1), "none": fixed([], "int64", -5)},
}


# --------------------------------------------------------------------------- fixture generation


def serialize_all(tf: Any) -> tuple[list[bytes], list[bytes]]:
    examples = [tf_example(tf, features).SerializeToString() for features in EXAMPLES]
    sequences = [tf_sequence_example(tf, context, lists).SerializeToString() for context, lists in SEQUENCE_EXAMPLES]
    return examples, sequences


def write_data_files(tf: Any, directory: str, examples: list[bytes], sequences: list[bytes]) -> dict[str, Any]:
    files: dict[str, Any] = {}
    plan = [
        ("examples.tfrecord", examples, ""),
        ("examples.gz.tfrecord", examples, "GZIP"),
        ("examples.zlib.tfrecord", examples, "ZLIB"),
        ("sequence_examples.tfrecord", sequences, ""),
        ("sequence_examples.gz.tfrecord", sequences, "GZIP"),
        ("empty.tfrecord", [], ""),
        ("empty.gz.tfrecord", [], "GZIP"),
        ("empty_payloads.tfrecord", [b"", b"abc", b""], ""),
    ]
    for name, records, compression in plan:
        path = os.path.join(directory, name)
        tf_write(tf, path, records, compression)
        files[name] = {
            "compression": compression,
            "made_by": "tf.io.TFRecordWriter",
            "offsets": [offset for offset, _ in frame_offsets(uncompressed(path, compression))],
            "tf_read": tf_read(tf, path, compression),
        }
    return files


def damage(data: bytearray, kind: str, offsets: list[tuple[int, int]]) -> bytes:
    (first, _), (second, second_length), (third, third_length) = offsets[:3]
    if kind == "corrupted_data_crc":  # last byte of the 2nd record's data CRC
        data[second + 16 + second_length - 1] ^= 0x01
    elif kind == "corrupted_length_crc":  # first byte of the 1st record's length CRC
        data[first + 8] ^= 0x01
    elif kind == "corrupted_payload":  # a data byte of the 3rd record
        data[third + 12 + third_length // 2] ^= 0x40
    elif kind == "corrupted_length":  # the 2nd record's length field, so its length CRC fails
        data[second] ^= 0x02
    elif kind == "truncated_data":  # cut inside the 3rd record's data
        return bytes(data[: third + 12 + third_length // 2])
    elif kind == "truncated_footer":  # 3rd record's data complete, 2 of its 4 CRC bytes
        return bytes(data[: third + 12 + third_length + 2])
    elif kind == "truncated_header":  # 5 bytes of the 3rd record's 12-byte header
        return bytes(data[: third + 5])
    return bytes(data)


def write_bad_files(tf: Any, directory: str, base: list[bytes]) -> dict[str, Any]:
    files: dict[str, Any] = {}
    clean = os.path.join(directory, "_clean.tmp")
    tf_write(tf, clean, base, "")
    stream = uncompressed(clean, "")
    os.remove(clean)
    offsets = frame_offsets(stream)
    kinds = [
        "corrupted_data_crc",
        "corrupted_length_crc",
        "corrupted_payload",
        "corrupted_length",
        "truncated_data",
        "truncated_footer",
        "truncated_header",
    ]
    for kind in kinds:
        name = f"{kind}.tfrecord"
        with open(os.path.join(directory, name), "wb") as file:
            file.write(damage(bytearray(stream), kind, offsets))
        files[name] = {
            "compression": "",
            "made_by": f"tf.io.TFRecordWriter, then {kind}",
            "offsets": [offset for offset, _ in offsets],
            "tf_read": tf_read(tf, os.path.join(directory, name), ""),
        }
    files.update(write_bad_compressed(tf, directory, stream, offsets))
    return files


def write_bad_compressed(tf: Any, directory: str, stream: bytes, offsets: list[tuple[int, int]]) -> dict[str, Any]:
    files: dict[str, Any] = {}
    gz_path = os.path.join(directory, "_clean.gz.tmp")
    tf_write(tf, gz_path, [stream[offset + 12 : offset + 12 + length] for offset, length in offsets], "GZIP")
    with open(gz_path, "rb") as file:
        gz_bytes = file.read()
    os.remove(gz_path)
    # Same zlib parameters as TF (formats.md 1.3), so only the damaged byte differs from TF's output.
    compressor = zlib.compressobj(-1, zlib.DEFLATED, 31, 9)
    corrupted = damage(bytearray(stream), "corrupted_data_crc", offsets)
    made = {
        "corrupted_data_crc.gz.tfrecord": (
            compressor.compress(corrupted) + compressor.flush(),
            "tf.io.TFRecordWriter (GZIP); decompressed, 2nd data CRC flipped, recompressed",
        ),
        "truncated_stream.gz.tfrecord": (
            gz_bytes[: len(gz_bytes) // 2],
            "tf.io.TFRecordWriter (GZIP), then the file cut in half",
        ),
    }
    for name, (content, how) in made.items():
        path = os.path.join(directory, name)
        with open(path, "wb") as file:
            file.write(content)
        files[name] = {
            "compression": "GZIP",
            "made_by": how,
            "tf_read": tf_read(tf, path, "GZIP"),
            "offsets": [offset for offset, _ in offsets],
        }
    return files


def write_edge_file(tf: Any, directory: str) -> dict[str, Any]:
    records = edge_records()
    path = os.path.join(directory, "edge_cases.tfrecord")
    tf_write(tf, path, [record for _, record in records], "")
    cases = []
    for name, record in records:
        cases.append(
            {
                "name": name,
                "decoded": decoded_example_json(tf, record),
                "parsed": {
                    spec_name: outcome(
                        tf, lambda record=record, spec=spec: tf.io.parse_single_example(record, tf_specs(tf, spec))
                    )
                    for spec_name, spec in EDGE_SPECS.items()
                },
            }
        )
    return {"file": "edge_cases.tfrecord", "specs": EDGE_SPECS, "records": cases, "tf_read": tf_read(tf, path, "")}


def example_parse_cases(tf: Any, examples: list[bytes]) -> list[dict[str, Any]]:
    cases = []
    for spec_name, spec in EXAMPLE_SPECS.items():
        single = [
            outcome(tf, lambda record=record: tf.io.parse_single_example(record, tf_specs(tf, spec)))
            for record in examples
        ]
        batch = outcome(tf, lambda: tf.io.parse_example(tf.constant(examples), tf_specs(tf, spec)))
        cases.append(
            {
                "name": spec_name,
                "file": "examples.tfrecord",
                "spec": spec,
                "parse_single_example": single,
                "parse_example": batch,
            }
        )
    return cases


def example_error_cases(tf: Any) -> list[dict[str, Any]]:
    cases = []
    for name, items, spec in EXAMPLE_ERROR_CASES:
        records = [item if isinstance(item, bytes) else tf_example(tf, item).SerializeToString() for item in items]
        cases.append(
            {
                "name": name,
                "spec": spec,
                "records": [b64(record) for record in records],
                "parse_single_example": outcome(
                    tf, lambda: tf.io.parse_single_example(records[-1], tf_specs(tf, spec))
                ),
                "parse_example": outcome(tf, lambda: tf.io.parse_example(tf.constant(records), tf_specs(tf, spec))),
            }
        )
    return cases


def sequence_parse_cases(tf: Any, sequences: list[bytes]) -> list[dict[str, Any]]:
    cases = []
    for name, (context_spec, sequence_spec) in SEQUENCE_SPECS.items():
        results = [
            outcome(
                tf,
                lambda record=record: tf.io.parse_single_sequence_example(
                    record, tf_specs(tf, context_spec), tf_specs(tf, sequence_spec)
                ),
            )
            for record in sequences
        ]
        cases.append(
            {
                "name": name,
                "file": "sequence_examples.tfrecord",
                "context_spec": context_spec,
                "sequence_spec": sequence_spec,
                "parse_single_sequence_example": results,
            }
        )
    for name, index, context_spec, sequence_spec in SEQUENCE_ERROR_CASES:
        record = sequences[index]
        cases.append(
            {
                "name": name,
                "file": "sequence_examples.tfrecord",
                "record_index": index,
                "context_spec": context_spec,
                "sequence_spec": sequence_spec,
                "parse_single_sequence_example": [
                    outcome(
                        tf,
                        lambda: tf.io.parse_single_sequence_example(
                            record, tf_specs(tf, context_spec), tf_specs(tf, sequence_spec)
                        ),
                    )
                ],
            }
        )
    return cases


SINGLE_FEATURE_EXAMPLES: dict[str, dict[str, tuple[str, list[Any]]]] = {
    "int64_extremes": {"x": ("int64", [INT64_MIN, INT64_MAX, 0, -1, 1, 127, 128, 2**32])},
    "int64_scalar": {"label": ("int64", [3])},
    "float_specials": {"x": ("float", [0.1, -0.0, 0.0, math.inf, -math.inf, math.nan, 1e-45, 3.4028234663852886e38])},
    "bytes_unicode": {"x": ("bytes", ["héllo".encode(), "日本語 🙂".encode(), b"", b"\x00\xff"])},
    "bytes_long": {"x": ("bytes", [b"y" * 200])},
    "empty_int64": {"x": ("int64", [])},
    "empty_float": {"x": ("float", [])},
    "empty_bytes": {"x": ("bytes", [])},
    "unicode_key": {"clé 🙂": ("int64", [1])},
}


SEQUENCE_INPUTS = {
    "formats_md_2_1": ({"len": ("int64", [2])}, {"tok": ("int64", [[7], [8, 9]])}),
    "bytes_and_floats": ({"w": ("float", [0.5])}, {"s": ("bytes", [["ü".encode()], [], [b""]])}),
}


def serialized_cases(tf: Any) -> dict[str, Any]:
    singles = [
        {
            "name": name,
            "features": features_json(features),
            "serialized": b64(tf_example(tf, features).SerializeToString()),
        }
        for name, features in SINGLE_FEATURE_EXAMPLES.items()
    ]
    # Features.feature is a map: upb writes it in hash order by default (it changes from one
    # process to the next) and in key order with deterministic=True. Both are recorded; only
    # the sorted bytes are stable.
    multi = [
        {
            "name": f"examples_{index}",
            "features": features_json(features),
            "serialized_default_order": b64(tf_example(tf, features).SerializeToString()),
            "serialized_sorted": b64(tf_example(tf, features).SerializeToString(deterministic=True)),
        }
        for index, features in enumerate(EXAMPLES)
    ]
    sequences = [
        {
            "name": name,
            "context": features_json(context),
            "feature_lists": feature_lists_json(lists),
            "serialized": b64(tf_sequence_example(tf, context, lists).SerializeToString()),
        }
        for name, (context, lists) in SEQUENCE_INPUTS.items()
    ]
    return {"examples": singles, "multi_feature_examples": multi, "sequence_examples": sequences}


def generate(directory: str) -> None:
    tf = _tf()
    os.makedirs(directory, exist_ok=True)
    examples, sequences = serialize_all(tf)
    files = write_data_files(tf, directory, examples, sequences)
    base = [
        tf_example(tf, {"i": ("int64", [index]), "s": ("bytes", [b"record %d" % index])}).SerializeToString()
        for index in range(3)
    ]
    files.update(write_bad_files(tf, directory, base))
    wrong = [
        {"file": name, "compression": compression, "tf_read": tf_read(tf, os.path.join(directory, name), compression)}
        for name, compression in [
            ("examples.gz.tfrecord", ""),
            ("examples.tfrecord", "GZIP"),
            ("examples.tfrecord", "ZLIB"),
            ("examples.gz.tfrecord", "ZLIB"),
        ]
    ]
    write_json(
        directory,
        "tf_files.json",
        {
            "tensorflow_version": tf.__version__,
            "files": files,
            "wrong_compression_reads": wrong,
            "examples": {
                "file": "examples.tfrecord",
                "inputs": [features_json(features) for features in EXAMPLES],
                "decoded": [decoded_example_json(tf, record) for record in examples],
            },
            "sequence_examples": {
                "file": "sequence_examples.tfrecord",
                "inputs": [
                    {"context": features_json(context), "feature_lists": feature_lists_json(lists)}
                    for context, lists in SEQUENCE_EXAMPLES
                ],
                "decoded": [decoded_sequence_json(tf, record) for record in sequences],
            },
        },
    )
    write_json(
        directory,
        "tf_parse.json",
        {
            "tensorflow_version": tf.__version__,
            "example_cases": example_parse_cases(tf, examples),
            "example_error_cases": example_error_cases(tf),
            "sequence_cases": sequence_parse_cases(tf, sequences),
            "edge_cases": write_edge_file(tf, directory),
        },
    )
    write_json(directory, "tf_serialized.json", {"tensorflow_version": tf.__version__, **serialized_cases(tf)})


# --------------------------------------------------------------------------- the reverse direction

OURS_FILES = [
    ("ours_examples.tfrecord", ""),
    ("ours_examples.gz.tfrecord", "GZIP"),
    ("ours_examples.zlib.tfrecord", "ZLIB"),
]


def ours_example_inputs() -> list[dict[str, tuple[str, list[Any]]]]:
    return [*EXAMPLES, *SINGLE_FEATURE_EXAMPLES.values()]


def write_ours(directory: str) -> None:
    """Writes files with torchestimator (no TensorFlow) and the manifest describing them."""
    from torchestimator.data.example import encode_example, encode_sequence_example
    from torchestimator.data.tfrecord import TFRecordWriter

    os.makedirs(directory, exist_ok=True)
    examples = [
        encode_example(
            {name: values for name, (_, values) in features.items()},
            kinds={name: kind for name, (kind, _) in features.items()},
        )
        for features in ours_example_inputs()
    ]
    sequences = [
        encode_sequence_example(
            {name: values for name, (_, values) in context.items()},
            {name: steps for name, (_, steps) in lists.items()},
            kinds={name: kind for name, (kind, _) in [*context.items(), *lists.items()]},
        )
        for context, lists in SEQUENCE_EXAMPLES
    ]
    plan = [(name, compression, "example", examples) for name, compression in OURS_FILES]
    plan += [
        ("ours_sequence_examples.tfrecord", "", "sequence_example", sequences),
        ("ours_empty.tfrecord", "", "example", []),
    ]
    manifest = []
    for name, compression, message, records in plan:
        with TFRecordWriter(os.path.join(directory, name), compression=compression or None) as writer:
            for record in records:
                writer.write(record)
        manifest.append(
            {
                "file": name,
                "compression": compression,
                "message": message,
                "records": [b64(record) for record in records],
            }
        )
    write_json(
        directory,
        "ours_manifest.json",
        {
            "files": manifest,
            "example_inputs": [features_json(features) for features in ours_example_inputs()],
            "sequence_inputs": [
                {"context": features_json(context), "feature_lists": feature_lists_json(lists)}
                for context, lists in SEQUENCE_EXAMPLES
            ],
            "parse_spec": EXAMPLE_SPECS["dense_sparse_sequence"],
            "parse_records": list(range(len(EXAMPLES))),
            "sequence_spec": [SEQUENCE_SPECS["context_and_lists"][0], SEQUENCE_SPECS["context_and_lists"][1]],
        },
    )


def read_ours_with_tf(directory: str) -> None:
    """Reads the files --write-ours made with TensorFlow and saves what TF saw."""
    tf = _tf()
    with open(os.path.join(directory, "ours_manifest.json"), encoding="utf-8") as file:
        manifest = json.load(file)
    results: dict[str, Any] = {"tensorflow_version": tf.__version__, "files": {}}
    for entry in manifest["files"]:
        read = tf_read(tf, os.path.join(directory, entry["file"]), entry["compression"])
        records = [base64.b64decode(record) for record in read["records"]]
        if entry["message"] == "example":
            read["decoded"] = [decoded_example_json(tf, record) for record in records]
            chosen = [records[index] for index in manifest["parse_records"] if index < len(records)]
            if chosen:
                spec = tf_specs(tf, manifest["parse_spec"])
                read["parse_example"] = outcome(tf, lambda: tf.io.parse_example(tf.constant(chosen), spec))
        else:
            read["decoded"] = [decoded_sequence_json(tf, record) for record in records]
            context_spec, sequence_spec = (tf_specs(tf, part) for part in manifest["sequence_spec"])
            read["parse_single_sequence_example"] = [
                outcome(
                    tf, lambda record=record: tf.io.parse_single_sequence_example(record, context_spec, sequence_spec)
                )
                for record in records
            ]
        results["files"][entry["file"]] = read
    write_json(directory, "ours_read_by_tf.json", results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_DIR, help="fixture folder for the TF-written files")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write-ours", metavar="DIR", help="write files with torchestimator (project venv)")
    mode.add_argument("--read-with-tf", metavar="DIR", help="read --write-ours files with TensorFlow")
    args = parser.parse_args(argv)
    if args.write_ours:
        write_ours(args.write_ours)
    elif args.read_with_tf:
        read_ours_with_tf(args.read_with_tf)
    else:
        generate(os.path.normpath(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
