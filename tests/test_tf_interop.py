"""Interop with real TensorFlow, through fixtures it wrote (tests/fixtures/tfrecord/README.md).

TensorFlow is never imported: tools/make_tfrecord_fixtures.py ran TF 2.21 once and
committed the files it wrote, what it read back, how it parsed them, and what it
read from files torchestimator wrote. These tests hold torchestimator to all of it.
"""

from __future__ import annotations

import base64
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from torchestimator.data import example as example_codec
from torchestimator.data.tfrecord import DataLossError, TFRecordWriter, iter_records

FIXTURES = Path(__file__).parent / "fixtures" / "tfrecord"
NUMPY_DTYPES = {"int64": np.int64, "float32": np.float32, "string": object}


@cache
def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def unbase64(text: str) -> bytes:
    return base64.b64decode(text)


def json_values(kind: str, values: list[Any]) -> Any:
    """The fixture encoding back to Python: floats may be "nan"/"inf"/"-inf", bytes are base64."""
    if kind in ("float", "float32"):
        return np.asarray([float(value) for value in values], dtype=np.float32)
    if kind in ("bytes", "string"):
        return [unbase64(value) for value in values]
    return np.asarray(values, dtype=np.int64)


def python_values(kind: str, values: list[Any]) -> list[Any]:
    """Fixture values as the plain lists a user would pass to encode_example."""
    converted = json_values(kind, values)
    return converted if isinstance(converted, list) else converted.tolist()


def assert_same_values(kind: str, actual: Any, expected: Any, where: str) -> None:
    if kind in ("bytes", "string"):
        assert [bytes(item) for item in np.asarray(actual, dtype=object).reshape(-1)] == list(expected), where
        return
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_array_equal(actual, expected, err_msg=where)
    if kind in ("float", "float32"):
        # -0.0 == 0.0 numerically; TF keeps the sign bit, so must we.
        assert np.array_equal(np.signbit(actual), np.signbit(expected)), f"{where}: signs of zeros differ"


def tf_read(name: str) -> dict[str, Any]:
    return load("tf_files.json")["files"][name]["tf_read"]


def tf_records(name: str) -> list[bytes]:
    return [unbase64(record) for record in tf_read(name)["records"]]


def all_records(name: str, compression: str, **options: Any) -> list[tuple[int, bytes]]:
    return list(iter_records(FIXTURES / name, compression or None, **options))


# Differences from TF 2.21 that are known and deliberate (or not yet settled): strict xfail,
# so a change that removes one makes the test fail and the entry must go.
KNOWN_DIFFERENCES = {
    (
        "parse",
        "split_packed_list",
    ): "a packed int64 list sent as two chunks (0a 02 04 05, then 0a 01 06): TF's fast parser "
    "keeps only the first chunk ([4, 5]; its own proto decode gives [4, 5, 6]); ours "
    "follows protobuf and gives [4, 5, 6]",
}


def with_known(test: str, names: list[str]) -> list[Any]:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_DIFFERENCES[(test, name)]))
        if (test, name) in KNOWN_DIFFERENCES
        else name
        for name in names
    ]


GOOD_FILES = sorted(
    name
    for name, entry in load("tf_files.json")["files"].items()
    if entry["tf_read"]["error"] is None and not name.startswith("truncated_header")
)
BAD_FILES = sorted(name for name, entry in load("tf_files.json")["files"].items() if entry["tf_read"]["error"])


# --------------------------------------------------------------------------- framing


@pytest.mark.parametrize("name", GOOD_FILES)
def test_reads_what_tensorflow_wrote(name: str) -> None:
    entry = load("tf_files.json")["files"][name]
    read = all_records(name, entry["compression"])
    assert [record for _, record in read] == tf_records(name)
    assert [offset for offset, _ in read] == entry["offsets"]


@pytest.mark.parametrize("name", GOOD_FILES)
def test_writes_the_bytes_tensorflow_writes(name: str, tmp_path: Path) -> None:
    entry = load("tf_files.json")["files"][name]
    path = tmp_path / name
    with TFRecordWriter(path, compression=entry["compression"] or None) as writer:
        for record in tf_records(name):
            writer.write(record)
    assert path.read_bytes() == (FIXTURES / name).read_bytes()


@pytest.mark.parametrize("name", ["examples.gz.tfrecord", "examples.zlib.tfrecord", "examples.tfrecord"])
def test_auto_compression_reads_tensorflow_files(name: str) -> None:
    assert [record for _, record in all_records(name, "auto")] == tf_records(name)


@pytest.mark.parametrize("name", BAD_FILES)
def test_damaged_files_fail_like_tensorflow(name: str) -> None:
    entry = load("tf_files.json")["files"][name]
    good = tf_records(name)
    seen: list[bytes] = []
    with pytest.raises(DataLossError) as caught:
        for _, record in iter_records(FIXTURES / name, entry["compression"] or None):
            seen.append(record)
    assert seen == good, "the records before the damage are the ones TensorFlow hands out"
    error = caught.value
    assert error.path.endswith(name) and name in str(error)
    # The API's offset is the start of the damaged record (the next one after those read).
    assert error.offset == entry["offsets"][len(good)]
    assert re.search(r"(corrupted|truncated) record at \d+", str(error))


@pytest.mark.parametrize("name", with_known("kind", BAD_FILES))
def test_damage_is_named_like_tensorflow(name: str) -> None:
    entry = load("tf_files.json")["files"][name]
    kind = entry["tf_read"]["error"]["message"].split(" ", 1)[0]  # "corrupted" or "truncated"
    with pytest.raises(DataLossError) as caught:
        all_records(name, entry["compression"])
    assert str(caught.value).startswith(f"{kind} record at ")


@pytest.mark.parametrize("name", with_known("message_offset", BAD_FILES))
def test_message_offset_matches_tensorflow(name: str) -> None:
    """TF names record start + 12 for a data CRC mismatch; the message should carry TF's number."""
    entry = load("tf_files.json")["files"][name]
    with pytest.raises(DataLossError) as caught:
        all_records(name, entry["compression"])
    found = re.search(r"record at (\d+)", str(caught.value))
    assert found is not None and int(found.group(1)) == entry["tf_read"]["error"]["message_offset"], (
        f"TF: {entry['tf_read']['error']['message']!r}; ours: {caught.value}"
    )


# What skip_corrupt=True keeps of each damaged file (record offsets): more than TF's ignore_errors(), which
# drops the rest of the file; the damaged record alone is skipped, and a cut tail ends the file.
SKIP_CORRUPT_KEEPS = {
    "corrupted_data_crc.tfrecord": [0, 98],
    "corrupted_data_crc.gz.tfrecord": [0, 98],
    "corrupted_length_crc.tfrecord": [49, 98],  # found again by the search after the damaged header
    "corrupted_length.tfrecord": [0, 98],
    "corrupted_payload.tfrecord": [0, 49],
    "truncated_data.tfrecord": [0, 49],
    "truncated_footer.tfrecord": [0, 49],
    "truncated_header.tfrecord": [0, 49],
    "truncated_stream.gz.tfrecord": [],
}


@pytest.mark.parametrize("name", BAD_FILES + ["truncated_header.tfrecord"])
def test_skip_corrupt_keeps_what_ignore_errors_keeps_and_the_records_after_the_damage(name: str) -> None:
    entry = load("tf_files.json")["files"][name]
    kept = all_records(name, entry["compression"], skip_corrupt=True)
    assert [offset for offset, _ in kept] == SKIP_CORRUPT_KEEPS[name]
    assert set(SKIP_CORRUPT_KEEPS[name]) <= set(entry["offsets"])  # records where TF wrote them, none made up
    ignore_errors = entry["tf_read"]["ignore_errors_count"]
    assert [record for _, record in kept[:ignore_errors]] == tf_records(name)[:ignore_errors]
    assert [record.split(b"record ")[1][:1] for _, record in kept] == [
        str(entry["offsets"].index(offset)).encode() for offset, _ in kept
    ]  # each record is the one TF wrote there ("record 0", "record 1", "record 2")


def test_truncated_header_is_silent_only_when_not_strict() -> None:
    name = "truncated_header.tfrecord"
    entry = load("tf_files.json")["files"][name]
    assert tf_read(name)["error"] is None  # TF drops a cut header without a word
    assert [record for _, record in all_records(name, "", strict=False)] == tf_records(name)
    with pytest.raises(DataLossError) as caught:
        all_records(name, "")
    assert caught.value.offset == entry["offsets"][2] and "truncated record at" in str(caught.value)


@pytest.mark.parametrize(
    "read",
    load("tf_files.json")["wrong_compression_reads"],
    ids=lambda read: f"{read['file']}-as-{read['compression'] or 'plain'}",
)
def test_wrong_compression_is_data_loss(read: dict[str, Any]) -> None:
    assert read["tf_read"]["error"]["type"] == "DataLossError"
    with pytest.raises(DataLossError) as caught:
        all_records(read["file"], read["compression"])
    assert read["file"] in str(caught.value)


# --------------------------------------------------------------------------- Example / SequenceExample bytes


def feature_inputs(features: dict[str, Any]) -> tuple[dict[str, list[Any]], dict[str, str]]:
    values = {name: python_values(entry["kind"], entry["values"]) for name, entry in features.items()}
    return values, {name: entry["kind"] for name, entry in features.items()}


def assert_decoded(actual: dict[str, Any], kinds: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    assert sorted(actual) == sorted(expected), where
    for name, entry in expected.items():
        expected_kind = None if entry["kind"] == "none" else entry["kind"]
        assert kinds[name] == expected_kind, f"{where}: kind of {name}"
        kind = entry["kind"] if entry["kind"] != "none" else "int64"
        assert_same_values(kind, actual[name], json_values(kind, entry["values"]), f"{where}: {name}")


def test_decodes_examples_like_tensorflow() -> None:
    section = load("tf_files.json")["examples"]
    for index, (record, expected) in enumerate(zip(tf_records(section["file"]), section["decoded"])):
        assert_decoded(
            example_codec.decode_example(record), example_codec.example_kinds(record), expected, f"record {index}"
        )


def test_decodes_sequence_examples_like_tensorflow() -> None:
    section = load("tf_files.json")["sequence_examples"]
    for index, (record, expected) in enumerate(zip(tf_records(section["file"]), section["decoded"])):
        context, lists = example_codec.decode_sequence_example(record)
        context_kinds = {name: entry["kind"] for name, entry in expected["context"].items()}
        assert_decoded(context, context_kinds, expected["context"], f"record {index} context")
        assert sorted(lists) == sorted(expected["feature_lists"])
        for name, frames in expected["feature_lists"].items():
            assert len(lists[name]) == len(frames), f"record {index}: frames of {name}"
            for step, (actual, frame) in enumerate(zip(lists[name], frames)):
                assert_same_values(
                    frame["kind"],
                    actual,
                    json_values(frame["kind"], frame["values"]),
                    f"record {index}: {name}[{step}]",
                )


@pytest.mark.parametrize("case", load("tf_serialized.json")["examples"], ids=lambda case: case["name"])
def test_encodes_the_bytes_tensorflow_encodes(case: dict[str, Any]) -> None:
    values, kinds = feature_inputs(case["features"])
    assert example_codec.encode_example(values, kinds=kinds) == unbase64(case["serialized"])


@pytest.mark.parametrize("case", load("tf_serialized.json")["multi_feature_examples"], ids=lambda case: case["name"])
def test_multi_feature_bytes_equal_tensorflow_deterministic(case: dict[str, Any]) -> None:
    values, kinds = feature_inputs(case["features"])
    ours = example_codec.encode_example(values, kinds=kinds)
    assert ours == unbase64(case["serialized_sorted"])
    # TF's default (hash-ordered) bytes differ only in map order: both decode the same.
    default = unbase64(case["serialized_default_order"])
    assert len(ours) == len(default)
    decoded, expected = example_codec.decode_example(ours), example_codec.decode_example(default)
    assert sorted(decoded) == sorted(expected)


@pytest.mark.parametrize("case", load("tf_serialized.json")["sequence_examples"], ids=lambda case: case["name"])
def test_encodes_sequence_examples_like_tensorflow(case: dict[str, Any]) -> None:
    context, kinds = feature_inputs(case["context"])
    lists = {
        name: [python_values(entry["kind"], frame) for frame in entry["values"]]
        for name, entry in case["feature_lists"].items()
    }
    kinds.update({name: entry["kind"] for name, entry in case["feature_lists"].items()})
    assert example_codec.encode_sequence_example(context, lists, kinds=kinds) == unbase64(case["serialized"])


def edge_record(name: str) -> bytes:
    names = [case["name"] for case in load("tf_parse.json")["edge_cases"]["records"]]
    return all_records("edge_cases.tfrecord", "")[names.index(name)][1]


@pytest.mark.parametrize("case", load("tf_parse.json")["edge_cases"]["records"], ids=lambda case: case["name"])
def test_decodes_hand_made_protobuf_like_tensorflow(case: dict[str, Any]) -> None:
    record = edge_record(case["name"])
    assert_decoded(
        example_codec.decode_example(record), example_codec.example_kinds(record), case["decoded"], case["name"]
    )


# --------------------------------------------------------------------------- the other way: TF read what we wrote


def ours_entries() -> list[dict[str, Any]]:
    return load("ours_manifest.json")["files"]


def ours_inputs(message: str) -> list[dict[str, Any]]:
    manifest = load("ours_manifest.json")
    return manifest["example_inputs"] if message == "example" else manifest["sequence_inputs"]


def encode_input(message: str, item: dict[str, Any]) -> bytes:
    if message == "example":
        values, kinds = feature_inputs(item)
        return example_codec.encode_example(values, kinds=kinds)
    context, kinds = feature_inputs(item["context"])
    lists = {
        name: [python_values(entry["kind"], frame) for frame in entry["values"]]
        for name, entry in item["feature_lists"].items()
    }
    kinds.update({name: entry["kind"] for name, entry in item["feature_lists"].items()})
    return example_codec.encode_sequence_example(context, lists, kinds=kinds)


@pytest.mark.parametrize("entry", ours_entries(), ids=lambda entry: entry["file"])
def test_tensorflow_read_our_files_without_error(entry: dict[str, Any]) -> None:
    seen = load("ours_read_by_tf.json")["files"][entry["file"]]
    assert seen["error"] is None
    assert seen["records"] == entry["records"]
    assert seen["ignore_errors_count"] == len(entry["records"])


@pytest.mark.parametrize("entry", ours_entries(), ids=lambda entry: entry["file"])
def test_we_still_write_the_files_tensorflow_read(entry: dict[str, Any], tmp_path: Path) -> None:
    """Today's encoder and writer reproduce, byte for byte, the files TF read back then."""
    records = [encode_input(entry["message"], item) for item in ours_inputs(entry["message"])][: len(entry["records"])]
    assert records == [unbase64(record) for record in entry["records"]]
    path = tmp_path / entry["file"]
    with TFRecordWriter(path, compression=entry["compression"] or None) as writer:
        for record in records:
            writer.write(record)
    assert path.read_bytes() == (FIXTURES / entry["file"]).read_bytes()


def test_tensorflow_decoded_our_examples_as_written() -> None:
    entry = next(entry for entry in ours_entries() if entry["file"] == "ours_examples.tfrecord")
    decoded = load("ours_read_by_tf.json")["files"][entry["file"]]["decoded"]
    assert len(decoded) == len(ours_inputs("example"))
    for index, (item, seen) in enumerate(zip(ours_inputs("example"), decoded)):
        assert sorted(seen) == sorted(item), f"record {index}"
        for name, feature in item.items():
            assert seen[name]["kind"] == feature["kind"], f"record {index}: {name}"
            assert_same_values(
                feature["kind"],
                json_values(feature["kind"], seen[name]["values"]),
                json_values(feature["kind"], feature["values"]),
                f"record {index}: {name}",
            )


def test_tensorflow_decoded_our_sequence_examples_as_written() -> None:
    decoded = load("ours_read_by_tf.json")["files"]["ours_sequence_examples.tfrecord"]["decoded"]
    for index, (item, seen) in enumerate(zip(ours_inputs("sequence_example"), decoded, strict=True)):
        assert sorted(seen["context"]) == sorted(item["context"])
        for name, feature in item["context"].items():
            assert_same_values(
                feature["kind"],
                json_values(feature["kind"], seen["context"][name]["values"]),
                json_values(feature["kind"], feature["values"]),
                f"record {index}: {name}",
            )
        assert sorted(seen["feature_lists"]) == sorted(item["feature_lists"])
        for name, feature in item["feature_lists"].items():
            frames = seen["feature_lists"][name]
            assert [frame["kind"] for frame in frames] == [feature["kind"]] * len(feature["values"])
            for step, frame in enumerate(frames):
                assert_same_values(
                    feature["kind"],
                    json_values(feature["kind"], frame["values"]),
                    json_values(feature["kind"], feature["values"][step]),
                    f"{name}[{step}]",
                )


# --------------------------------------------------------------------------- parsing specs


@pytest.fixture(scope="module")
def parsing() -> Any:
    return pytest.importorskip("torchestimator.data.parsing")


def default_value(spec: dict[str, Any]) -> Any:
    value = spec.get("default_value")
    if value is None or spec["dtype"] != "string":
        return value
    return [item.encode() for item in value] if isinstance(value, list) else value.encode()


def build_spec(parsing: Any, spec: dict[str, Any]) -> Any:
    kind, dtype = spec["kind"], spec["dtype"]
    if kind == "FixedLenFeature":
        return parsing.FixedLenFeature(tuple(spec["shape"]), dtype, default_value=default_value(spec))
    if kind == "VarLenFeature":
        return parsing.VarLenFeature(dtype)
    if kind == "FixedLenSequenceFeature":
        return parsing.FixedLenSequenceFeature(
            tuple(spec["shape"]), dtype, allow_missing=spec["allow_missing"], default_value=default_value(spec)
        )
    assert kind == "RaggedFeature", kind
    return parsing.RaggedFeature(dtype)


def build_specs(parsing: Any, specs: dict[str, Any]) -> dict[str, Any]:
    return {name: build_spec(parsing, spec) for name, spec in specs.items()}


def ragged_parts(value: Any) -> tuple[Any, list[Any]]:
    """(flat values, row splits per ragged dimension) of whatever ragged form parsing returns."""
    if hasattr(value, "nested_row_splits"):
        return value.flat_values, list(value.nested_row_splits)
    if hasattr(value, "row_splits"):
        return value.values, [value.row_splits]
    rows = list(value)
    splits = np.concatenate([[0], np.cumsum([len(row) for row in rows])]).astype(np.int64)
    flat: Any = [item for row in rows for item in list(row)]
    return flat, [splits]


def assert_dense(actual: Any, expected: dict[str, Any], where: str) -> None:
    dtype = NUMPY_DTYPES[expected["dtype"]]
    assert isinstance(actual, np.ndarray), f"{where}: expected a numpy array, got {type(actual).__name__}"
    assert actual.dtype == dtype, f"{where}: dtype {actual.dtype} != {np.dtype(dtype)}"
    assert list(actual.shape) == expected["shape"], f"{where}: shape {actual.shape} != {expected['shape']}"
    flat = json_values(expected["dtype"], expected["values"])
    assert_same_values(expected["dtype"], actual.reshape(-1), flat, where)


def assert_parsed(actual: Any, expected: dict[str, Any], where: str) -> None:
    if "sparse" in expected:
        sparse = expected["sparse"]
        rank = len(sparse["dense_shape"])
        assert np.asarray(actual.indices).reshape(-1, rank).tolist() == sparse["indices"] or (
            not sparse["indices"] and np.asarray(actual.indices).size == 0
        ), f"{where}: indices"
        assert_dense(
            np.asarray(actual.values, dtype=NUMPY_DTYPES[sparse["values"]["dtype"]]),
            sparse["values"],
            f"{where}: values",
        )
        assert np.asarray(actual.dense_shape).tolist() == sparse["dense_shape"], f"{where}: dense_shape"
    elif "ragged" in expected:
        flat, splits = ragged_parts(actual)
        ragged = expected["ragged"]
        assert [np.asarray(split).tolist() for split in splits] == ragged["nested_row_splits"], f"{where}: row splits"
        dtype = ragged["flat_values"]["dtype"]
        assert_same_values(
            dtype,
            np.asarray(flat, dtype=NUMPY_DTYPES[dtype]).reshape(-1),
            json_values(dtype, ragged["flat_values"]["values"]),
            f"{where}: values",
        )
    else:
        assert_dense(actual, expected, where)


def assert_result(actual: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    assert sorted(actual) == sorted(expected), where
    for name, value in expected.items():
        assert_parsed(actual[name], value, f"{where}: {name}")


def example_case_ids(case: dict[str, Any]) -> str:
    return case["name"]


@pytest.mark.parametrize("case", load("tf_parse.json")["example_cases"], ids=example_case_ids)
def test_parse_single_example_like_tensorflow(parsing: Any, case: dict[str, Any]) -> None:
    specs = build_specs(parsing, case["spec"])
    for index, (record, outcome) in enumerate(zip(tf_records(case["file"]), case["parse_single_example"], strict=True)):
        assert_result(parsing.parse_single_example(record, specs), outcome["result"], f"record {index}")


@pytest.mark.parametrize("case", load("tf_parse.json")["example_cases"], ids=example_case_ids)
def test_parse_example_batch_like_tensorflow(parsing: Any, case: dict[str, Any]) -> None:
    specs = build_specs(parsing, case["spec"])
    assert_result(parsing.parse_example(tf_records(case["file"]), specs), case["parse_example"]["result"], "batch")


def assert_same_failure(call: Any, tf_error: dict[str, Any], names: list[str]) -> Exception:
    with pytest.raises((ValueError, TypeError)) as caught:
        call()
    message = str(caught.value)
    named = [name for name in names if name in tf_error["message"]]
    assert all(name in message for name in named), f"TF: {tf_error['message']!r}; ours: {message!r}"
    return caught.value


@pytest.mark.parametrize("case", load("tf_parse.json")["example_error_cases"], ids=example_case_ids)
def test_parse_errors_like_tensorflow(parsing: Any, case: dict[str, Any]) -> None:
    records = [unbase64(record) for record in case["records"]]
    names = list(case["spec"])
    single, batch = case["parse_single_example"], case["parse_example"]
    assert "error" in single and "error" in batch  # every case is an error case in TF
    assert_same_failure(
        lambda: parsing.parse_single_example(records[-1], build_specs(parsing, case["spec"])), single["error"], names
    )
    error = assert_same_failure(
        lambda: parsing.parse_example(records, build_specs(parsing, case["spec"])), batch["error"], names
    )
    if f"Index: {len(records) - 1}" in batch["error"]["message"]:
        assert re.search(rf"\b{len(records) - 1}\b", str(error)), f"the record index is not named: {error}"


@pytest.mark.parametrize("case", load("tf_parse.json")["sequence_cases"], ids=example_case_ids)
def test_parse_single_sequence_example_like_tensorflow(parsing: Any, case: dict[str, Any]) -> None:
    records = tf_records(case["file"])
    if "record_index" in case:
        records = [records[case["record_index"]]]
    names = [*case["context_spec"], *case["sequence_spec"]]
    for index, (record, outcome) in enumerate(zip(records, case["parse_single_sequence_example"], strict=True)):

        def call(record: bytes = record) -> Any:
            return parsing.parse_single_sequence_example(
                record, build_specs(parsing, case["context_spec"]), build_specs(parsing, case["sequence_spec"])
            )

        if "error" in outcome:
            assert_same_failure(call, outcome["error"], names)
            continue
        context, sequences = call()
        assert_result(context, outcome["result"][0], f"record {index} context")
        assert_result(sequences, outcome["result"][1], f"record {index} feature lists")


def edge_cases_with_known() -> list[Any]:
    return [
        pytest.param(case, marks=pytest.mark.xfail(strict=True, reason=KNOWN_DIFFERENCES[("parse", case["name"])]))
        if ("parse", case["name"]) in KNOWN_DIFFERENCES
        else case
        for case in load("tf_parse.json")["edge_cases"]["records"]
    ]


@pytest.mark.parametrize("case", edge_cases_with_known(), ids=example_case_ids)
def test_parse_hand_made_protobuf_like_tensorflow(parsing: Any, case: dict[str, Any]) -> None:
    record = edge_record(case["name"])
    for spec_name, spec in load("tf_parse.json")["edge_cases"]["specs"].items():
        outcome = case["parsed"][spec_name]
        call = lambda spec=spec: parsing.parse_single_example(record, build_specs(parsing, spec))  # noqa: E731
        if "error" in outcome:
            assert_same_failure(call, outcome["error"], list(spec))
        else:
            assert_result(call(), outcome["result"], f"{case['name']} / {spec_name}")


def test_tensorflow_parsed_our_examples_as_we_do(parsing: Any) -> None:
    manifest = load("ours_manifest.json")
    for entry in ours_entries():
        seen = load("ours_read_by_tf.json")["files"][entry["file"]]
        records = [unbase64(record) for record in entry["records"]]
        if "parse_example" in seen:
            chosen = [records[index] for index in manifest["parse_records"]]
            ours = parsing.parse_example(chosen, build_specs(parsing, manifest["parse_spec"]))
            assert_result(ours, seen["parse_example"]["result"], entry["file"])
        for index, outcome in enumerate(seen.get("parse_single_sequence_example", [])):
            context_spec, sequence_spec = (build_specs(parsing, part) for part in manifest["sequence_spec"])
            context, sequences = parsing.parse_single_sequence_example(records[index], context_spec, sequence_spec)
            assert_result(context, outcome["result"][0], f"{entry['file']} record {index}")
            assert_result(sequences, outcome["result"][1], f"{entry['file']} record {index}")
