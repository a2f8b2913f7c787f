"""The compiled Example parser (torchestimator._native._examples) against the pure-Python one.

Both paths run in this one process: `parsing._parse_records` takes the compiled pass
(`_parsing_compiled.parse_compiled`) when it applies, `parsing._parse_records_python` is the pure
path. Every test holds them to the same results (dtype, shape, values, SparseValue/RaggedValue
parts, bit for bit) and the same errors (type and message), on hand-made wire bytes (packed and
unpacked lists, duplicate keys, unknown fields, missing features, defaults, wrong kinds and counts,
truncated and crafted bytes), hypothesis-generated Examples and the TF-made fixtures.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults_common import varint  # protobuf's varint (tools/, on the path through conftest)
from hypothesis import HealthCheck, given, settings, strategies as st

from torchestimator import _native
from torchestimator.data import _parsing_compiled, parsing
from torchestimator.data.example import encode_example
from torchestimator.data.parsing import (
    FixedLenFeature,
    FixedLenSequenceFeature,
    RaggedFeature,
    RaggedValue,
    SparseValue,
    VarLenFeature,
)
from torchestimator.data.tfrecord import read_records

pytestmark = pytest.mark.skipif(
    _native.load("_examples") is None,
    reason="the compiled _examples core is not built (or TORCHESTIMATOR_PURE_PYTHON=1)",
)

FIXTURES = Path(__file__).parent / "fixtures" / "tfrecord"
HYPOTHESIS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- wire bytes, by hand


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def delimited(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def int64_list(values: list[int], packed: bool = True) -> bytes:
    if packed:
        return delimited(1, b"".join(varint(value) for value in values)) if values else b""
    return b"".join(tag(1, 0) + varint(value) for value in values)


def float_list(values: list[float], packed: bool = True) -> bytes:
    if packed:
        return delimited(1, struct.pack(f"<{len(values)}f", *values)) if values else b""
    return b"".join(tag(1, 5) + struct.pack("<f", value) for value in values)


def bytes_list(values: list[bytes]) -> bytes:
    return b"".join(delimited(1, value) for value in values)


def feature(kind: int, payload: bytes) -> bytes:
    """A Feature message: kind 1 bytes_list, 2 float_list, 3 int64_list, 0 none set."""
    return delimited(kind, payload) if kind else b""


def entry(key: str, value: bytes) -> bytes:
    return delimited(1, delimited(1, key.encode()) + delimited(2, value))


def example_bytes(*entries: bytes) -> bytes:
    return delimited(1, b"".join(entries))


# ----------------------------------------------------------------------------- comparing the paths


def assert_same_value(ours: Any, pure: Any, where: str) -> None:
    assert type(ours) is type(pure), f"{where}: {type(ours).__name__} != {type(pure).__name__}"
    if isinstance(pure, SparseValue):
        for path, value in (("compiled", ours), ("pure", pure)):
            assert_coalesced_layout(value, f"{where} ({path})")
    if isinstance(pure, (SparseValue, RaggedValue)):
        for part, (mine, theirs) in zip(pure._fields, zip(ours, pure)):
            assert_same_value(mine, theirs, f"{where}.{part}")
        return
    assert ours.dtype == pure.dtype and ours.shape == pure.shape, (
        f"{where}: {ours.dtype}{ours.shape} != {pure.dtype}{pure.shape}"
    )
    if pure.dtype == object:
        assert [type(item) for item in ours.flat] == [type(item) for item in pure.flat], where
        assert ours.tolist() == pure.tolist(), where
    else:
        assert ours.tobytes() == pure.tobytes(), f"{where}: {ours!r} != {pure!r}"  # NaN payloads and -0.0 too


def assert_coalesced_layout(value: SparseValue, where: str) -> None:
    """What to_torch relies on to skip torch's checks: int64 indices whose transpose is C-contiguous
    [rank, nnz] (no copy for torch), row-major sorted and unique, inside dense_shape."""
    indices = value.indices.T
    assert indices.dtype == np.int64 and indices.flags.c_contiguous and indices.shape[1] == len(value.values), where
    if indices.shape[1]:
        assert indices.min() >= 0 and np.all(indices.max(axis=1) < value.dense_shape), where
        linear = np.ravel_multi_index(tuple(indices), tuple(value.dense_shape))
        assert np.all(np.diff(linear) > 0), f"{where}: indices not row-major sorted and unique"


def outcome(call: Any) -> tuple:
    try:
        return ("result", call())
    except Exception as error:
        return ("error", type(error), str(error))


def assert_same(records: list[Any], features: Any, single: bool = False) -> tuple:
    """Both paths on the same input: the same result or the same error. Returns the outcome."""
    ours = outcome(lambda: parsing._parse_records(list(records), features, single))
    pure = outcome(lambda: parsing._parse_records_python(list(records), features, single))
    assert ours[0] == pure[0], f"compiled: {ours}, pure: {pure}"
    if ours[0] == "error":
        assert ours[1:] == pure[1:]
    else:
        assert list(ours[1]) == list(pure[1])
        for name in pure[1]:
            assert_same_value(ours[1][name], pure[1][name], name)
    return ours


def assert_compiled(records: list[bytes], features: Any, single: bool = False) -> dict[str, Any]:
    """The compiled pass handles these records (no fallback) and agrees with the pure path."""
    assert _parsing_compiled.parse_compiled(list(records), features, single) is not None, "the compiled pass fell back"
    return assert_same(records, features, single)[1]


SCHEMA = {
    "label": FixedLenFeature([], "int64"),
    "dense": FixedLenFeature([2, 2], "float32", default_value=[1, 2, 3, 4]),
    "name": FixedLenFeature([], "string", default_value="none"),
    "ids": VarLenFeature("int64"),
    "words": VarLenFeature("string"),
    "scores": RaggedFeature("float32"),
    "pairs": FixedLenSequenceFeature([2], "int64", allow_missing=True),
}


# ----------------------------------------------------------------------------- the plain case, compiled


def test_typical_batch_is_compiled_and_identical() -> None:
    rng = np.random.default_rng(7)
    records = [
        encode_example(
            {
                "label": [int(index) - 3],
                "dense": rng.standard_normal(4).astype(np.float32),
                "name": [b"n%d\x00" % index],
                "ids": rng.integers(-(2**62), 2**62, size=index % 4),
                "words": [b"w"] * (index % 3),
                "scores": rng.standard_normal(index % 5),
                "pairs": list(range(2 * (index % 3))),
            },
            kinds={"ids": "int64", "words": "bytes", "scores": "float", "pairs": "int64"},
        )
        for index in range(9)
    ]
    parsed = assert_compiled(records, SCHEMA)
    assert parsed["label"].tolist() == [index - 3 for index in range(9)]
    assert parsed["pairs"].shape == (9, 2, 2)
    assert_compiled(records[:1], SCHEMA, single=True)
    assert_compiled([], SCHEMA)


def test_packed_unpacked_and_mixed_lists_concatenate() -> None:
    record = example_bytes(
        entry("label", feature(3, int64_list([5], packed=False))),
        entry("ids", feature(3, int64_list([1, -2]) + int64_list([3], packed=False) + int64_list([-(2**63)]))),
        entry("scores", feature(2, float_list([0.5], packed=False) + float_list([-0.0, float("nan")]))),
    )
    parsed = assert_compiled([record], SCHEMA)
    assert parsed["ids"].values.tolist() == [1, -2, 3, -(2**63)]
    assert parsed["scores"].row_splits.tolist() == [0, 3]


def test_last_duplicate_key_wins_and_unknown_fields_are_skipped() -> None:
    unknown = tag(9, 0) + varint(300) + delimited(10, b"xyz") + tag(11, 5) + b"abcd" + tag(12, 1) + b"12345678"
    record = (
        unknown
        + example_bytes(entry("label", feature(3, int64_list([1]))), unknown)
        + delimited(1, entry("label", feature(3, unknown + int64_list([2]) + unknown) + unknown))
    )
    assert assert_compiled([record], SCHEMA)["label"].tolist() == [2]


def test_a_later_copy_without_a_list_is_left_to_the_pure_path() -> None:
    """TF skips a Feature() with no list for an earlier copy of the key (FixedLen and FixedLenSequence
    specs; every spec in parse_single_example): the compiled pass hands the record back, and both
    paths read the copy TF reads (tests/test_parse_edge_cases.py has TF's own results)."""
    record = example_bytes(
        entry("label", feature(3, int64_list([4]))), entry("ids", feature(3, int64_list([1])))
    ) + example_bytes(entry("label", b""), entry("ids", b""))
    features = {"label": FixedLenFeature([], "int64"), "ids": VarLenFeature("int64")}
    assert _parsing_compiled.parse_compiled([record], features, False) is None
    batch = assert_same([record, record], features)[1]
    assert batch["label"].tolist() == [4, 4] and batch["ids"].values.tolist() == []
    single = assert_same([record], features, single=True)[1]
    assert single["label"].tolist() == 4 and single["ids"].values.tolist() == [1]


def test_a_zero_element_default_is_no_default() -> None:
    features = {"empty": FixedLenFeature([0], "float32", default_value=[])}
    present = example_bytes(entry("empty", feature(2, b"")))
    assert assert_compiled([present], features)["empty"].shape == (1, 0)
    error = assert_same([present, example_bytes()], features)
    assert error[0] == "error" and "Feature: empty (data type: float) is required but could not be found" in error[2]
    assert "record 1" in error[2]


def test_missing_and_kindless_features_take_defaults() -> None:
    record = example_bytes(entry("label", feature(3, int64_list([1]))), entry("name", b""), entry("ids", b""))
    parsed = assert_compiled([record, record], SCHEMA)
    assert parsed["name"].tolist() == [b"none", b"none"] and parsed["dense"][1].tolist() == [[1, 2], [3, 4]]
    assert parsed["ids"].dense_shape.tolist() == [2, 0]


def test_ragged_value_key_shared_by_two_specs() -> None:
    features = {
        "ids": VarLenFeature("int64"),
        "again": RaggedFeature("int64", value_key="ids", row_splits_dtype="int64"),
    }
    records = [encode_example({"ids": [1, 2, 3]}), encode_example({"other": [1]})]
    parsed = assert_compiled(records, features)
    assert parsed["again"].row_splits.dtype == np.int64 and parsed["again"].row_splits.tolist() == [0, 3, 3]


def test_results_are_writable_like_the_pure_path() -> None:
    parsed = assert_compiled([encode_example({"label": [1], "ids": [4], "scores": [1.0]})], SCHEMA)
    assert parsed["label"].flags.writeable and parsed["ids"].values.flags.writeable
    assert parsed["scores"].values.flags.writeable


def test_plan_cache_follows_the_mapping_contents() -> None:
    features = {"x": FixedLenFeature([], "int64")}
    record = encode_example({"x": [3]})
    assert assert_compiled([record], features)["x"].tolist() == [3]
    features["x"] = FixedLenFeature([1], "int64")
    assert assert_compiled([record], features)["x"].shape == (1, 1)


# ----------------------------------------------------------------------------- falling back: same errors


@pytest.mark.parametrize(
    "records",
    [
        [encode_example({"label": [1]}), encode_example({"other": [1]})],  # missing required, record 1
        [encode_example({"label": [1, 2]})],  # wrong count
        [encode_example({"label": [1.0]})],  # wrong kind
        [encode_example({"label": [1], "ids": [1.5]})],  # wrong kind, VarLen
        [encode_example({"label": [1], "pairs": [1, 2, 3]})],  # a partial row
        [encode_example({"label": [1]}), b"\x0a\x05\x0a"],  # truncated
        [encode_example({"label": [1]}), b"not an example at all"],
        [encode_example({"label": [1]}), "a str"],  # not bytes
        [encode_example({"label": [1]}), None],
        [bytearray(encode_example({"label": [1]}))],
    ],
    ids=lambda records: repr(records[-1])[:30],
)
def test_errors_are_the_pure_paths(records: list[Any]) -> None:
    assert_same(records, SCHEMA)
    assert_same(records[-1:], SCHEMA, single=True)


def test_memoryviews_of_plain_bytes_are_compiled_others_agree() -> None:
    record = encode_example({"label": [4], "ids": [1, 2], "words": [b"x"]})
    assert assert_compiled([memoryview(record), memoryview(bytearray(record))], SCHEMA)["label"].tolist() == [4, 4]
    released = memoryview(record)
    released.release()
    strided = memoryview(record * 2)[::2]
    for view in (released, strided, memoryview(record).cast("c"), memoryview(np.frombuffer(record[:8], np.int64))):
        assert_same([record, view], SCHEMA)
    assert_same([record, np.frombuffer(record, np.uint8)], SCHEMA)


def test_unusual_wire_forms_fall_back_and_agree() -> None:
    label = entry("label", feature(3, int64_list([1])))
    crafted = [
        example_bytes(label, entry("ids", feature(3, int64_list([1])) + feature(3, int64_list([2])))),  # merged kind
        example_bytes(label, entry("ids", feature(3, int64_list([1])) + feature(2, float_list([2.0])))),  # switched
        example_bytes(label, entry("é", feature(3, int64_list([1])))),  # non-ASCII key
        example_bytes(label, delimited(1, delimited(1, b"\xff") + delimited(2, b""))),  # invalid UTF-8 key
        example_bytes(label, delimited(1, delimited(1, b"ids") + delimited(1, b"x"))),  # key twice in an entry
        example_bytes(label, delimited(1, delimited(2, feature(3, int64_list([1]))))),  # no key: ""
        example_bytes(
            label, delimited(1, delimited(1, b"ids") + delimited(2, feature(3, int64_list([1]))) + tag(3, 0) + b"\x00")
        ),  # an unknown field: upb drops the entry
        example_bytes(label) + tag(7, 3) + tag(7, 4),  # a group
        example_bytes(label) + tag(0, 0) + b"\x00",  # field 0
        example_bytes(label, entry("ids", feature(3, delimited(1, b"\x80")))),  # packed varint cut off
        example_bytes(label, entry("scores", feature(2, delimited(1, b"abc")))),  # packed floats of 3 bytes
        example_bytes(label, entry("zz", feature(3, delimited(1, b"\x80")))),  # bad, and not requested
        example_bytes(label, entry("ids", b"\x0a"), entry("ids", feature(3, int64_list([1])))),  # bad, superseded
        example_bytes(label, entry("ids", feature(3, tag(1, 1) + b"12345678"))),  # int64 as fixed64
        example_bytes(label, entry("ids", feature(3, b"\x08" + b"\xff" * 9 + b"\x7f"))),  # varint past 64 bits
        example_bytes(label, entry("ids", feature(3, delimited(1, b"")))),  # empty packed chunk
        bytes.fromhex("0a110a0f0a0161120a1a080a81808080800007"),  # a list's length in 6 bytes: protobuf refuses
        example_bytes(label, entry("ids", feature(3, b"\x0a\x81\x80\x80\x80\x00" + b"\x07"))),  # 5 bytes: fine
        example_bytes(label, entry("scores", feature(2, delimited(1, b"")))),  # empty floats, no buffer
    ]
    for record in crafted:
        assert_same([record], SCHEMA)
        assert_same([encode_example({"label": [1]}), record], SCHEMA)
    for valid in (crafted[-4], crafted[-2], crafted[-1]):  # valid, so still compiled
        assert _parsing_compiled.parse_compiled([valid], SCHEMA, False) is not None


def test_spec_errors_are_the_pure_paths() -> None:
    assert_same([b""], {"x": FixedLenSequenceFeature([], "int64")})  # allow_missing=False
    assert_same([b""], {"x": "not a spec"})
    assert_same([b""], {"x": {"unhashable": 1}})
    assert_same([b""], ["not", "a", "mapping"])
    assert_same([b""], {1: FixedLenFeature([], "int64", default_value=0)})


# ----------------------------------------------------------------------------- hypothesis

KEYS = ["a", "b", "c", ""]
KIND_OF = {"string": 1, "float32": 2, "int64": 3}
NUMPY_DTYPES = {"string": object, "float32": np.float32, "int64": np.int64}
int64s = st.integers(-(2**63), 2**63 - 1)
floats32 = st.floats(width=32, allow_nan=True)
small_bytes = st.binary(max_size=4)
unknown_fields = st.one_of(
    st.tuples(st.integers(4, 30), int64s).map(lambda item: tag(item[0], 0) + varint(item[1])),
    st.tuples(st.integers(4, 30), small_bytes).map(lambda item: delimited(*item)),
    st.tuples(st.integers(4, 30), st.binary(min_size=4, max_size=4)).map(lambda item: tag(item[0], 5) + item[1]),
)


@st.composite
def list_payloads(draw: Any, kind: int) -> bytes:
    """One list message: its values in chunks, each packed or unpacked, with unknown fields between."""
    chunks = []
    for _ in range(draw(st.integers(0, 3))):
        packed = draw(st.booleans())
        if kind == 1:
            chunks.append(bytes_list(draw(st.lists(small_bytes, max_size=3))))
        elif kind == 2:
            chunks.append(float_list(draw(st.lists(floats32, max_size=4)), packed))
        else:
            chunks.append(int64_list(draw(st.lists(int64s, max_size=4)), packed))
        if draw(st.integers(0, 5)) == 0:
            chunks.append(draw(unknown_fields))
    return b"".join(chunks)


@st.composite
def features_bytes(draw: Any) -> bytes:
    kind = draw(st.sampled_from([0, 1, 2, 3, 3, 2]))
    out = feature(kind, draw(list_payloads(kind))) if kind else b""
    if draw(st.integers(0, 8)) == 0:  # a kind field again: protobuf merges or switches the oneof
        again = draw(st.integers(1, 3))
        out += delimited(again, draw(list_payloads(again)))
    if draw(st.integers(0, 6)) == 0:
        out = draw(unknown_fields) + out
    return out


@st.composite
def records(draw: Any) -> bytes:
    entries = []
    for key in draw(st.lists(st.sampled_from(KEYS + ["zz"]), max_size=5)):  # repeats: the last one wins
        body = delimited(1, key.encode()) + delimited(2, draw(features_bytes()))
        if draw(st.integers(0, 8)) == 0:
            body = delimited(2, draw(features_bytes())) + delimited(1, key.encode()) + draw(unknown_fields)
        entries.append(delimited(1, body))
    split = draw(st.integers(0, len(entries)))  # the map may come in two `features` fields
    record = example_bytes(*entries[:split]) + (example_bytes(*entries[split:]) if draw(st.booleans()) else b"")
    if draw(st.integers(0, 6)) == 0:
        record = draw(unknown_fields) + record
    return record


@st.composite
def specs(draw: Any) -> dict[str, Any]:
    features = {}
    for name in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True)):
        dtype = draw(st.sampled_from(list(KIND_OF)))
        values = {"string": small_bytes, "float32": floats32, "int64": st.integers(-5, 5)}[dtype]
        choice = draw(st.integers(0, 4))
        if choice <= 1:
            shape = draw(st.sampled_from([[], [1], [2], [0], [1, 2]]))
            size = int(np.prod(shape))
            default = (
                np.array(draw(st.lists(values, min_size=size, max_size=size)), NUMPY_DTYPES[dtype])
                if draw(st.booleans())
                else None
            )
            features[name] = FixedLenFeature(shape, dtype, default_value=default)
        elif choice == 2:
            features[name] = VarLenFeature(dtype)
        elif choice == 3:
            features[name] = RaggedFeature(
                dtype,
                value_key=draw(st.sampled_from([None, *KEYS])),
                row_splits_dtype=draw(st.sampled_from(["int32", "int64"])),
            )
        else:
            features[name] = FixedLenSequenceFeature(draw(st.sampled_from([[], [2], [0]])), dtype, allow_missing=True)
    return features


@st.composite
def chunked_list(draw: Any, kind: int, count: int) -> bytes:
    """`count` values of one kind, cut into chunks each packed or unpacked (protobuf concatenates them)."""
    values = draw(st.lists({1: small_bytes, 2: floats32, 3: int64s}[kind], min_size=count, max_size=count))
    out, start = b"", 0
    while start < count:
        stop = draw(st.integers(start + 1, count))
        chunk, packed = values[start:stop], draw(st.booleans())
        out += bytes_list(chunk) if kind == 1 else float_list(chunk, packed) if kind == 2 else int64_list(chunk, packed)
        start = stop
    return out


@st.composite
def matching_batches(draw: Any) -> tuple[list[bytes], dict[str, Any]]:
    """Specs, and records that mostly fit them (so that the compiled pass handles most batches)."""
    features = draw(specs())
    batch = []
    for _ in range(draw(st.integers(0, 4))):
        entries = []
        for name, spec in features.items():
            if draw(st.integers(0, 9)) == 0:
                continue  # missing: a default, an empty list, or (without a default) the pure path's error
            key = spec.value_key or name if isinstance(spec, RaggedFeature) else name
            size = int(np.prod(spec.shape)) if isinstance(spec, (FixedLenFeature, FixedLenSequenceFeature)) else 1
            rows = 1 if isinstance(spec, FixedLenFeature) else draw(st.integers(0, 3))
            entries.append(
                entry(key, feature(KIND_OF[spec.dtype], draw(chunked_list(KIND_OF[spec.dtype], size * rows))))
            )
        if draw(st.booleans()):
            entries.append(entry("other", draw(features_bytes())))
        batch.append(example_bytes(*draw(st.permutations(entries))))
    return batch, features


@HYPOTHESIS
@given(case=matching_batches())
def test_generated_fitting_examples_agree(case: tuple[list[bytes], dict[str, Any]]) -> None:
    batch, features = case
    assert_same(batch, features)
    for record in batch[:1]:
        assert_same([record], features, single=True)


@HYPOTHESIS
@given(batch=st.lists(records(), max_size=4), features=specs())
def test_generated_examples_agree(batch: list[bytes], features: dict[str, Any]) -> None:
    assert_same(batch, features)
    for record in batch[:1]:
        assert_same([record], features, single=True)


@HYPOTHESIS
@given(record=records(), features=specs(), data=st.data())
def test_damaged_records_agree(record: bytes, features: dict[str, Any], data: Any) -> None:
    damage = data.draw(st.sampled_from(["truncate", "flip", "insert", "random"]))
    position = data.draw(st.integers(0, len(record)))
    if damage == "truncate":
        record = record[:position]
    elif damage == "flip" and record:
        index = min(position, len(record) - 1)
        record = record[:index] + bytes([record[index] ^ data.draw(st.integers(1, 255))]) + record[index + 1 :]
    elif damage == "insert":
        record = record[:position] + data.draw(st.binary(min_size=1, max_size=3)) + record[position:]
    else:
        record = data.draw(st.binary(max_size=40))
    assert_same([encode_example({"a": [1]}), record], features)


# ----------------------------------------------------------------------------- TF-made fixtures


def fixture_specs(spec: dict[str, Any]) -> dict[str, Any]:
    built = {}
    for name, item in spec.items():
        options = {key: value for key, value in item.items() if key != "kind"}
        if isinstance(options.get("default_value"), str):
            options["default_value"] = options["default_value"].encode()
        built[name] = getattr(parsing, item["kind"])(**options)
    return built


def fixture() -> dict[str, Any]:
    return json.loads((FIXTURES / "tf_parse.json").read_text(encoding="utf-8"))


def test_tf_made_fixtures_agree() -> None:
    cases = fixture()
    for case in cases["example_cases"]:
        records = list(read_records(str(FIXTURES / case["file"])))
        features = fixture_specs(case["spec"])
        assert_compiled(records, features)
        for record in records:
            assert_same([record], features, single=True)
    for case in cases["example_error_cases"]:
        records = [base64.b64decode(record) for record in case["records"]]
        assert_same(records, fixture_specs(case["spec"]))
        assert_same(records[-1:], fixture_specs(case["spec"]), single=True)
    edge_records = list(read_records(str(FIXTURES / "edge_cases.tfrecord")))
    for spec in cases["edge_cases"]["specs"].values():
        for record in edge_records:
            assert_same([record], fixture_specs(spec), single=True)
        assert_same(edge_records, fixture_specs(spec))
