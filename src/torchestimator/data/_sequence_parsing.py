"""The tf.train.SequenceExample parser: `parse_single_sequence_example` (`tf.io.parse_single_sequence_example`).

What belongs here: reading one SequenceExample's context (with the Example parser's columns, in the
context's own rules: the last copy of a repeated key whatever it holds, see the `parsing.py` module
docstring) and its feature lists, one frame per row (FixedLenSequenceFeature frames into one array,
VarLen/Ragged frames through a column each), with TensorFlow's wording for their errors. What does
not: batches of Examples and the rules they share with this parser (`parsing.py`, which re-exports
`parse_single_sequence_example`), the specs (`feature_specs.py`) and the columns (`_columns.py`).
There is no compiled pass for SequenceExamples: this is the only path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from torchestimator.data._columns import _example_columns, _list_values, _preview, _RaggedColumn, _VarLenColumn
from torchestimator.data.example import (
    KIND_NAMES,
    ExampleDecodeError,
    ExampleParseError,
    feature_kind,
    parse_sequence_example_proto,
)
from torchestimator.data.feature_specs import (
    _KIND_OF_DTYPE,
    _NUMPY_DTYPE,
    _TF_TYPE_NAME,
    FeatureSpec,
    FixedLenSequenceFeature,
    RaggedFeature,
    VarLenFeature,
    _shape_string,
)

__all__ = ["parse_single_sequence_example"]


def _frame_array(name: str, spec: FixedLenSequenceFeature, frames, where: str) -> np.ndarray:
    size = math.prod(spec.shape)
    kind = _KIND_OF_DTYPE[spec.dtype]
    out = np.empty((len(frames), size), _NUMPY_DTYPE[spec.dtype])
    for frame_index, frame in enumerate(frames):
        found = feature_kind(frame)
        values = [] if found is None else _list_values(frame, found)
        if found is not None and found != kind:
            raise ExampleParseError(
                f"Feature list: {name}, Index: {frame_index} ({where}).  Data types don't match. Data type: "
                f"{KIND_NAMES[found]} but expected type: {_TF_TYPE_NAME[spec.dtype]}."
            )
        if len(values) != size:
            raise ExampleParseError(
                f"Key: {name}, Index: {frame_index} ({where}).  Number of values != expected.  values size: "
                f"{len(values)} but output shape: {_shape_string(spec.shape)}. Every frame of a "
                f"FixedLenSequenceFeature needs {size} values; use VarLenFeature or RaggedFeature for frames "
                f"of varying length."
            )
        out[frame_index] = values
    return out.reshape(len(frames), *spec.shape)


def _parse_feature_list(name: str, spec: Any, feature_list, where: str) -> Any:
    frames = [] if feature_list is None else list(feature_list.feature)
    if isinstance(spec, FixedLenSequenceFeature):
        if feature_list is None and not spec.allow_missing:
            raise ExampleParseError(
                f"Feature list '{name}' is required but could not be found ({where}).  Did you mean to include it "
                f"in feature_list_dense_missing_assumed_empty or feature_list_dense_defaults? Pass "
                f"allow_missing=True to its FixedLenSequenceFeature to accept records without it."
            )
        return _frame_array(name, spec, frames, where)
    if not isinstance(spec, (VarLenFeature, RaggedFeature)):
        raise TypeError(
            f"sequence_features[{name!r}] must be a FixedLenSequenceFeature, VarLenFeature or "
            f"RaggedFeature; received {type(spec).__name__}."
        )
    location = f"{where}, frame {{}}"
    column = (
        _RaggedColumn(name, spec, len(frames), location=location)
        if isinstance(spec, RaggedFeature)
        else _VarLenColumn(name, spec, len(frames), location=location)
    )
    for frame_index, frame in enumerate(frames):
        column.add(frame_index, frame)
    if isinstance(spec, RaggedFeature):
        return column.result(single=False)
    return column.sparse(single=False)


def parse_single_sequence_example(
    serialized: bytes,
    context_features: Mapping[str, FeatureSpec] | None = None,
    sequence_features: Mapping[str, FeatureSpec] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parse one serialized tf.train.SequenceExample (`tf.io.parse_single_sequence_example`).

    `context_features` take FixedLenFeature, VarLenFeature or RaggedFeature, as
    for an Example. `sequence_features` take FixedLenSequenceFeature ([frames] +
    shape; a missing list is an error unless allow_missing), VarLenFeature (a
    2-D `SparseValue`: [[frame, i]], dense_shape [frames, max values]) or
    RaggedFeature (a `RaggedValue` with one row per frame). Returns
    `(context, sequences)`.
    """
    where = "record 0"
    try:
        message = parse_sequence_example_proto(serialized)
    except ExampleDecodeError as error:
        raise ExampleDecodeError(
            f"Could not parse sequence example input, value: {_preview(serialized)} ({where}: {error})."
        ) from None
    context_columns = _example_columns(context_features or {}, 1, "context_features")
    context_map = message.context.feature
    for column in context_columns:
        column.add(0, context_map[column.key] if column.key in context_map else None)  # noqa: SIM401 (protobuf)
    context = {column.name: column.result(single=True) for column in context_columns}

    if not isinstance(sequence_features or {}, Mapping):
        raise TypeError(
            f"sequence_features must be a dict of feature name to spec; received {type(sequence_features).__name__}."
        )
    lists = message.feature_lists.feature_list
    sequences = {}
    for name, spec in (sequence_features or {}).items():
        key = spec.value_key or name if isinstance(spec, RaggedFeature) else name
        feature_list = lists[key] if key in lists else None  # noqa: SIM401 (a protobuf map: get() adds the key)
        sequences[name] = _parse_feature_list(key, spec, feature_list, where)
    return context, sequences
