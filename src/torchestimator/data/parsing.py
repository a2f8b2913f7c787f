"""Parsing tf.train.Example / SequenceExample with TensorFlow's semantics: the entry points, the Example parser.

What belongs here: the Example parser and the public entry points of parsing,
`parse_single_example` and `parse_example` (a batch), with the rules below, which
every parser in the package follows. The other public names are re-exported here
from the modules that do one job each: the specs and result types
(`feature_specs.py`), `parse_single_sequence_example` (`_sequence_parsing.py`),
`decode_raw` (`_decode_raw.py`) and `to_torch` (`_to_torch.py`); the parsers
fill the per-spec columns of `_columns.py` and build their results in
`_parse_results.py`. What does not: the wire format (`example.py`) and reading
records from files (`tfrecord.py`).

Results are numpy arrays: int64, float32, and object arrays of `bytes` for
strings. Per spec, for one record and for a batch of B records:

- `FixedLenFeature(shape)`: an array of `shape` / `[B] + shape`. The record must
  hold exactly prod(shape) values, reshaped row-major; a missing feature takes
  `default_value`, and without one it is an error.
- `VarLenFeature`: a `SparseValue(indices, values, dense_shape)` like
  `tf.SparseTensor`: indices [[i]] and dense_shape [n] for one record;
  [[b, i]] and [B, max n] for a batch. A missing feature is empty.
- `FixedLenSequenceFeature(shape, allow_missing=True)` in an Example: an array
  of [n] + shape / [B, max n] + shape padded with `default_value` (0 or b"").
  In a SequenceExample's feature_lists: one row per frame.
- `RaggedFeature` (plain case, no partitions): the values array for one
  record; a `RaggedValue(values, row_splits)` for a batch or a feature list.
- A `tf.train.Feature()` with no list set counts as missing, as in
  TensorFlow's fast parser.
- A zero-element default (`FixedLenFeature([0], dtype, default_value=[])`)
  is no default: a record without the feature is an error, as in TF (which
  checks `default_value.NumElements() == 0`). An empty list present is fine.
- A SequenceExample's context is read as TF's sequence parser does: the last
  copy of a repeated key whatever it holds, and a `Feature()` with no list is
  present with no values (an error for a FixedLenFeature with elements, even
  one with a default; VarLen/Ragged give empty).
- A key present more than once in one record (Examples' bytes concatenated,
  or one map holding it twice): TF reads the copies last to first. The last
  copy is read, except that a `Feature()` with no list is skipped for the
  last earlier copy that has one (an empty list of any kind is not skipped):
  by `parse_single_example` for every spec, by `parse_example` for FixedLen
  and FixedLenSequence specs; `parse_example` gives VarLen/Ragged specs the
  last copy whatever it holds (empty when it has no list). Copies before the
  one read are not checked (their kind or count may be anything).

Errors are ValueError, keep TensorFlow's wording (so its messages can still be
searched) and add the record index and what to do. Bytes that are not an
Example at all raise ExampleDecodeError (a ValueError and a
TorchEstimatorError) naming the record: protobuf's own error never escapes. Only int64, float32 and
string exist in an Example: other dtypes are refused when the spec is made.

Two paths, one behaviour: where the compiled core `torchestimator._native._examples`
is built (and TORCHESTIMATOR_PURE_PYTHON is not set), `parse_example` and
`parse_single_example` parse a whole batch in one C call that fills the
arrays directly (FixedLen, VarLen, Ragged and FixedLenSequence specs; the spec
is compiled once per features mapping, in `_parsing_compiled.py`). That pass handles only the plain,
well-formed case: for any batch it does not (a missing required feature, a
wrong kind or count, a malformed record, unusual wire forms) the pure-Python
parser below runs instead, and it alone words errors, so results and errors
are the same on both paths.

`to_torch` converts numeric arrays to tensors, `SparseValue` to
`torch.sparse_coo_tensor` and `RaggedValue` to a `RaggedValue` of tensors;
strings stay numpy object arrays (torch has no string tensors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchestimator.data._columns import _example_columns, _FixedLenColumn, _preview, _SequenceColumn
from torchestimator.data._decode_raw import decode_raw
from torchestimator.data._parsing_compiled import parse_compiled
from torchestimator.data._parsing_copies import RecordSource
from torchestimator.data._sequence_parsing import parse_single_sequence_example
from torchestimator.data._to_torch import to_torch
from torchestimator.data.example import ExampleDecodeError, example_protos, parse_example_proto
from torchestimator.data.feature_specs import (
    FeatureSpec,
    FixedLenFeature,
    FixedLenSequenceFeature,
    RaggedFeature,
    RaggedValue,
    SparseValue,
    VarLenFeature,
)

__all__ = [
    "FixedLenFeature",
    "FixedLenSequenceFeature",
    "RaggedFeature",
    "RaggedValue",
    "SparseValue",
    "VarLenFeature",
    "decode_raw",
    "parse_example",
    "parse_single_example",
    "parse_single_sequence_example",
    "to_torch",
]


def _parse_records(serialized: Sequence[bytes], features: Mapping[str, Any], single: bool) -> dict[str, Any]:
    """The compiled pass where it handles the batch, the pure-Python parser otherwise (the module docstring)."""
    parsed = parse_compiled(serialized, features, single)
    return parsed if parsed is not None else _parse_records_python(serialized, features, single)


def _parse_records_python(serialized: Sequence[bytes], features: Mapping[str, Any], single: bool) -> dict[str, Any]:
    """The pure-Python parser: the reference for results and the only place errors are worded."""
    columns = _example_columns(features, len(serialized), "features")
    source = RecordSource()
    for column in columns:  # which copy of a repeated key TF reads: the module docstring's table
        if single or isinstance(column, (_FixedLenColumn, _SequenceColumn)):
            column.looks_back_in = source
    parse = example_protos().Example.FromString
    lookups = [(column.add, column.key) for column in columns]
    for index, record in enumerate(serialized):
        source.record = record
        try:
            feature_map = parse(record).features.feature
        except Exception:
            _raise_record_error(record, index)
        for add, key in lookups:
            add(index, feature_map[key] if key in feature_map else None)  # noqa: SIM401 (a protobuf map)
    return {column.name: column.result(single) for column in columns}


def _raise_record_error(record: Any, index: int) -> None:
    try:
        parse_example_proto(record)
    except ExampleDecodeError as error:
        raise ExampleDecodeError(
            f"Could not parse example input, value: {_preview(record)} (record {index}: {error}). "
            f"Is this a tf.train.Example (and not a SequenceExample or a TFRecord frame)?"
        ) from None
    except TypeError as error:
        raise TypeError(f"record {index}: {error}") from None
    raise AssertionError("a record failed to parse once and parsed the second time")


def parse_single_example(serialized: bytes, features: Mapping[str, FeatureSpec]) -> dict[str, Any]:
    """Parse one serialized tf.train.Example with `tf.io.parse_single_example`'s semantics.

    Returns `{name: value}`; see the module docstring for each spec's result.
    Errors name the feature and "record 0".
    """
    return _parse_records([serialized], features, single=True)


def parse_example(serialized: Sequence[bytes], features: Mapping[str, FeatureSpec]) -> dict[str, Any]:
    """Parse a batch of serialized tf.train.Examples with `tf.io.parse_example`'s semantics.

    `serialized` is a sequence (or 1-D object array) of bytes. Fixed-length
    features fill one preallocated array of [B] + shape; each record is decoded
    once. Errors name the feature and the record's index in the batch.
    """
    if isinstance(serialized, (bytes, bytearray)):
        raise TypeError(
            "parse_example takes a batch (a list of serialized records); for one record use parse_single_example."
        )
    return _parse_records(list(serialized), features, single=False)
