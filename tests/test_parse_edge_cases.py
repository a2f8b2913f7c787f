"""Example parsing edge cases against what TensorFlow 2.21 did with the same bytes (issue 15, point 6).

tests/fixtures/parse_edge/tf_parse_edge.json (made by make_fixtures.py there, with TensorFlow) holds
hand-made records (a zero-element FixedLenFeature missing or present, a feature present two or three
times in one record) and, per spec and API, TF's result or error. Every case is checked through the
public functions (the compiled pass where it is built), the pure-Python parser directly (what
TORCHESTIMATOR_PURE_PYTHON=1 runs), SequenceExample contexts, and TFRecordDataset(features=...) on the
TFRecord file TF wrote with these records.
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
import torch

from torchestimator.data import parsing
from torchestimator.data.example import encode_example
from torchestimator.data.parsing import (
    FixedLenFeature,
    FixedLenSequenceFeature,
    RaggedFeature,
    RaggedValue,
    SparseValue,
    VarLenFeature,
)
from torchestimator.data.tfrecord import TFRecordWriter, read_records
from torchestimator.data.tfrecord_dataset import TFRecordDataset

FIXTURES = Path(__file__).parent / "fixtures" / "parse_edge"
NUMPY_DTYPES = {"int64": np.int64, "float32": np.float32, "string": object}

# Kinds of error, by the phrases TF's parsers word them with. Ours must be of the same kind and carry
# TF's phrase, except for a count, which ours words one way for both Example APIs (parse_single_example's
# "Can't parse serialized Example", or the stride message), so any count phrase of TF's does there.
ERROR_KINDS = {
    "required": ("is required but could not be found",),
    "kind": ("Data types don't match",),
    "count": (
        "Can't parse serialized Example",
        "values != expected",
        "not a multiple of stride length",
        "should be divisible by",
        "Inconsistent max number of elements",
        "Unexpected number of elements",
    ),
}


# The sequence example context words its counts its own way; ours carries those words.
CONTEXT_COUNT_PHRASES = ("Inconsistent max number of elements", "Unexpected number of elements")


def error_kind(message: str) -> tuple[str, list[str]]:
    for kind, phrases in ERROR_KINDS.items():
        found = [phrase for phrase in phrases if phrase in message]
        if found:
            return kind, found
    raise AssertionError(f"an error of no kind this test knows: {message!r}")


@cache
def fixture() -> dict[str, Any]:
    return json.loads((FIXTURES / "tf_parse_edge.json").read_text(encoding="utf-8"))


def build_spec(spec: dict[str, Any]) -> Any:
    kind, dtype, default = spec["kind"], spec["dtype"], spec.get("default_value")
    if kind == "FixedLenFeature":
        return FixedLenFeature(spec["shape"], dtype, default_value=default)
    if kind == "VarLenFeature":
        return VarLenFeature(dtype)
    if kind == "FixedLenSequenceFeature":
        return FixedLenSequenceFeature(spec["shape"], dtype, allow_missing=spec["allow_missing"], default_value=default)
    return RaggedFeature(dtype)


def features_for(spec_name: str) -> dict[str, Any]:
    return {"a": build_spec(fixture()["specs"][spec_name])}


def json_values(dtype: str, values: list[Any]) -> list[Any]:
    if dtype == "string":
        return [base64.b64decode(value) for value in values]
    return [float(value) for value in values] if dtype == "float32" else [int(value) for value in values]


def assert_dense(actual: Any, expected: dict[str, Any], where: str) -> None:
    assert isinstance(actual, np.ndarray), f"{where}: {type(actual).__name__} is not an array"
    assert actual.dtype == np.dtype(NUMPY_DTYPES[expected["dtype"]]), f"{where}: dtype {actual.dtype}"
    assert list(actual.shape) == expected["shape"], f"{where}: shape {actual.shape} != {expected['shape']}"
    assert actual.reshape(-1).tolist() == json_values(expected["dtype"], expected["values"]), where


def assert_value(actual: Any, expected: dict[str, Any], where: str) -> None:
    if "sparse" in expected:
        sparse = expected["sparse"]
        assert isinstance(actual, SparseValue), where
        rank = len(sparse["dense_shape"])
        assert np.asarray(actual.indices).reshape(-1, rank).tolist() == sparse["indices"], f"{where}: indices"
        assert_dense(np.asarray(actual.values), sparse["values"], f"{where}: values")
        assert np.asarray(actual.dense_shape).tolist() == sparse["dense_shape"], f"{where}: dense_shape"
    elif "ragged" in expected:
        ragged = expected["ragged"]
        assert isinstance(actual, RaggedValue), where
        assert [np.asarray(actual.row_splits).tolist()] == ragged["nested_row_splits"], f"{where}: row splits"
        assert_dense(np.asarray(actual.values), ragged["flat_values"], f"{where}: values")
    else:
        assert_dense(actual, expected, where)


def outcome_of(call: Any) -> tuple:
    try:
        return ("result", call())
    except (ValueError, TypeError) as error:
        return ("error", type(error), str(error))


def assert_like_tf(ours: tuple, tf: dict[str, Any], where: str) -> None:
    if "error" in tf:
        assert ours[0] == "error", f"{where}: TF raised {tf['error']['message']!r}; ours returned {ours[1]!r}"
        kind, phrases = error_kind(tf["error"]["message"])
        assert issubclass(ours[1], ValueError), f"{where}: {ours[1].__name__} is not a ValueError"
        named = re.findall(r"(?:Feature|Key): a\b|feature a\b", tf["error"]["message"])  # TF names the feature so
        carried = named + (phrases if kind != "count" or phrases[0] in CONTEXT_COUNT_PHRASES else [])
        assert error_kind(ours[2])[0] == kind and all(phrase in ours[2] for phrase in carried), (
            f"{where}: TF: {tf['error']['message']!r}; ours: {ours[2]!r}"
        )
        return
    assert ours[0] == "result", f"{where}: TF returned {tf['result']}; ours raised {ours[2]!r}"
    result = tf["result"]
    if isinstance(result, list):  # a (context, feature lists) pair
        result = result[0]
    assert sorted(ours[1]) == sorted(result), where
    for name, expected in result.items():
        assert_value(ours[1][name], expected, f"{where}: {name}")


def cases() -> list[Any]:
    return [pytest.param(case, id=case["name"]) for case in fixture()["cases"]]


def spec_names(context: bool = False) -> list[str]:
    return list(fixture()["context_specs"] if context else fixture()["specs"])


PATHS = {
    # the public function's path: the compiled pass where it is built (it hands unusual batches back)
    "public": parsing._parse_records,
    # the pure-Python parser, what TORCHESTIMATOR_PURE_PYTHON=1 runs
    "pure": parsing._parse_records_python,
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", cases())
def test_parse_single_example_like_tensorflow(case: dict[str, Any], path: str) -> None:
    record = base64.b64decode(case["example"])
    for spec_name in spec_names():
        ours = outcome_of(lambda: PATHS[path]([record], features_for(spec_name), True))
        assert_like_tf(ours, case["parse_single_example"][spec_name], f"{case['name']} {spec_name} single {path}")


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", cases())
def test_parse_example_like_tensorflow(case: dict[str, Any], path: str) -> None:
    record = base64.b64decode(case["example"])
    for spec_name in spec_names():
        ours = outcome_of(lambda: PATHS[path]([record], features_for(spec_name), False))
        assert_like_tf(ours, case["parse_example"][spec_name], f"{case['name']} {spec_name} batch {path}")


@pytest.mark.parametrize("single", [True, False], ids=["single", "batch"])
@pytest.mark.parametrize("case", cases())
def test_both_paths_give_the_same_result_or_error(case: dict[str, Any], single: bool) -> None:
    """Not only like TF: the same message word for word, and a batch with an ordinary record first."""
    plain = encode_example({"a": [7, 8]})
    record = base64.b64decode(case["example"])
    batches = [[record]] if single else [[record], [plain, record], [record, plain]]
    for records in batches:
        for spec_name in spec_names():
            public = outcome_of(lambda: parsing._parse_records(list(records), features_for(spec_name), single))
            pure = outcome_of(lambda: parsing._parse_records_python(list(records), features_for(spec_name), single))
            assert public[0] == pure[0] and (public[0] == "result" or public[1:] == pure[1:]), (
                f"{case['name']} {spec_name}: public {public}, pure {pure}"
            )
            if public[0] == "result":
                for name in pure[1]:
                    assert repr(public[1][name]) == repr(pure[1][name]), f"{case['name']} {spec_name}"


@pytest.mark.parametrize("case", cases())
def test_sequence_example_context_like_tensorflow(case: dict[str, Any]) -> None:
    record = base64.b64decode(case["sequence_example"])
    for spec_name in spec_names(context=True):
        ours = outcome_of(lambda: parsing.parse_single_sequence_example(record, features_for(spec_name))[0])
        assert_like_tf(ours, case["parse_single_sequence_example"][spec_name], f"{case['name']} {spec_name} context")


def test_the_tfrecord_file_holds_the_cases_in_order() -> None:
    records = list(read_records(FIXTURES / fixture()["records_file"]))
    assert records == [base64.b64decode(case["example"]) for case in fixture()["cases"]]


def numpy_value(value: Any) -> Any:
    """A to_torch result back to the parser's numpy forms, to compare with TF's."""
    if isinstance(value, torch.Tensor) and value.is_sparse:
        value = value.coalesce()
        return SparseValue(value.indices().numpy().T, value.values().numpy(), np.array(value.shape, np.int64))
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, RaggedValue):
        return RaggedValue(numpy_value(value.values), numpy_value(value.row_splits))
    return value  # strings stay numpy object arrays


@pytest.mark.parametrize("spec_name", ["varlen", "ragged", "fixed2_default", "sequence"])
def test_tfrecord_dataset_parses_the_file_like_tensorflow(spec_name: str, tmp_path: Path) -> None:
    """TFRecordDataset(features=...): per record (parse_single_example) and in batches of one
    (parse_example), the records TF parsed under this spec, written to a file as TF wrote them."""
    kept = [
        case
        for case in fixture()["cases"]
        if "result" in case["parse_single_example"][spec_name] and "result" in case["parse_example"][spec_name]
    ]
    assert len(kept) >= 5, spec_name
    path = tmp_path / "kept.tfrecord"
    with TFRecordWriter(path) as writer:
        for case in kept:
            writer.write(base64.b64decode(case["example"]))
    features = features_for(spec_name)
    for batch_size, api in ((None, "parse_single_example"), (1, "parse_example")):
        items = list(TFRecordDataset(str(path), features=features, batch_size=batch_size))
        assert len(items) == len(kept)
        for case, item in zip(kept, items, strict=True):
            ours = ("result", {name: numpy_value(value) for name, value in item.items()})
            assert_like_tf(ours, case[api][spec_name], f"{case['name']} {spec_name} dataset {api}")


def test_tfrecord_dataset_raises_tensorflows_error_on_the_file() -> None:
    """The TF-written file as it is, in one batch under fixed0_default: the first record TF refused
    alone is the record named, with TF's words."""
    cases_ = fixture()["cases"]
    dataset = TFRecordDataset(
        str(FIXTURES / fixture()["records_file"]), features=features_for("fixed0_default"), batch_size=len(cases_)
    )
    index, tf_error = next(
        (index, case["parse_example"]["fixed0_default"]["error"])
        for index, case in enumerate(cases_)
        if "error" in case["parse_example"]["fixed0_default"]
    )
    with pytest.raises(ValueError) as caught:
        list(dataset)
    assert_like_tf(("error", type(caught.value), str(caught.value)), {"error": tf_error}, "dataset")
    assert f"record {index}" in str(caught.value)
