"""Columns: one accumulator per feature spec, filled record by record and finished once into the spec's result.

What belongs here: the columns both parsers fill (an Example's features in `parsing.py`, a
SequenceExample's context and its VarLen/Ragged feature lists in `_sequence_parsing.py`), the
per-spec checks of what a record holds (kind, count, a missing feature, a default) with their
TensorFlow-worded errors, and `_example_columns`, which turns a features mapping into columns and
refuses a bad one before any record is read (the compiled pass calls it for the same errors). What
does not: decoding the records (the parsers), building the results from the collected values
(`_parse_results.py`, shared with the compiled pass) and which copy of a repeated key TF reads
(`_parsing_copies.py`, asked only when the copy protobuf kept has no list).

Per record, a column takes the values in bulk (`.value[:]`, or the FloatList's packed bytes)
and appends them to one Python list; numpy arrays are built once per batch. A feature whose
list is set with values of the expected length takes that fast path without WhichOneof (a
oneof member that is not set reads as empty); anything else goes through `checked_values`,
which has the kind checks and the errors.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from torchestimator.data._parse_results import _ragged_value, _sequence_value, _sparse_value
from torchestimator.data._parsing_copies import RecordSource, last_listed_copy
from torchestimator.data.example import (
    _KIND_FIELDS,
    BYTES,
    FLOAT,
    KIND_NAMES,
    ExampleParseError,
    float_list_bytes,
    float_payload,
    float_values,
)
from torchestimator.data.feature_specs import (
    _KIND_OF_DTYPE,
    _LIST_NAME,
    _TF_TYPE_NAME,
    FixedLenFeature,
    FixedLenSequenceFeature,
    ParsedValue,
    RaggedFeature,
    RaggedValue,
    SparseValue,
    VarLenFeature,
    _shape_string,
)


def _list_values(feature, kind: int) -> Any:
    if kind == FLOAT:
        return float_values(feature.float_list)
    return getattr(feature, _LIST_NAME[kind]).value[:]


def _values_array(parts: list, dtype: str) -> np.ndarray:
    """A column's collected values -> a writable 1-D array (floats arrive as little-endian payload bytes)."""
    if dtype == "float32":
        return np.frombuffer(b"".join(parts), "<f4").astype(np.float32)
    if dtype == "int64":
        return np.array(parts, np.int64)
    out = np.empty(len(parts), object)
    out[:] = parts
    return out


def _mismatch(key: str, where: str, found: int, dtype: str) -> ExampleParseError:
    return ExampleParseError(
        f"Key: {key}, {where}.  Data types don't match. Data type: {KIND_NAMES[found]} but expected type: "
        f"{_TF_TYPE_NAME[dtype]}. The record holds a {_LIST_NAME[found]} there; declare the feature with the "
        f"matching dtype or fix the writer."
    )


class _Column(abc.ABC):
    """Values of one spec over the records of a batch (or over the frames of a feature list).

    `add(index, feature)` is called once per record, in order (`feature` None when the record
    lacks it). `location` formats an index for error messages ("record {}" or "record 0, frame
    {}"); it is only formatted when an error is raised, so the per-record path stays free of
    string work.
    """

    def __init__(self, name: str, spec: Any, count: int, key: str | None = None, location: str = "record {}") -> None:
        self.name, self.spec, self.count, self.location = name, spec, count, location
        self.key = key or name
        self.dtype = spec.dtype
        self.kind = _KIND_OF_DTYPE[spec.dtype]
        self.list_name = _LIST_NAME[self.kind]
        self.parts: list = []
        # Set by the Example parsers where a Feature() with no list defers to an earlier copy of the key in
        # the record being parsed (`last_listed_copy`): that record. Feature lists' frames never do.
        self.looks_back_in: RecordSource | None = None

    @abc.abstractmethod
    def add(self, index: int, feature: Any) -> None:
        """Takes record `index`'s copy of the feature (None when the record lacks it)."""

    @abc.abstractmethod
    def result(self, single: bool) -> ParsedValue:
        """The spec's value over all records added (`single`: of the one record, without a batch dimension)."""

    def resolved(self, index: int, feature) -> Any:
        """The copy of the feature TF reads (None when it counts as missing); checks its kind."""
        if feature is None:
            return None
        found = feature.WhichOneof("kind")
        if found is None and self.looks_back_in is not None:
            feature = last_listed_copy(self.looks_back_in.record, self.key)
            found = None if feature is None else feature.WhichOneof("kind")
        if found != self.list_name:
            if found is None:
                return None
            raise _mismatch(self.key, self.location.format(index), _KIND_FIELDS[found], self.dtype)
        return feature

    def checked_values(self, index: int, feature) -> Any:
        """The feature's values, None when it counts as missing; checks the kind."""
        feature = self.resolved(index, feature)
        return None if feature is None else _list_values(feature, self.kind)


class _FixedLenColumn(_Column):
    """[B] + shape. Floats are kept as each record's serialized FloatList, all of one length
    (`float_list_bytes` of the default for a missing record), and cut apart as one 2-D array."""

    def __init__(self, name: str, spec: FixedLenFeature, count: int) -> None:
        super().__init__(name, spec, count)
        self.size = math.prod(spec.shape)
        # Floats: the length of each record's serialized FloatList (all have `size` values).
        self.packed_size = len(float_list_bytes(np.zeros(self.size, np.float32))) if self.kind == FLOAT else 0
        # What a record's list must measure for the fast path; never matches for size 0, whose
        # empty list the checked path tells apart from a missing feature.
        self.expected = -1 if self.size == 0 else (self.packed_size if self.kind == FLOAT else self.size)

    def add(self, index: int, feature) -> None:
        if feature is not None:
            if self.kind == FLOAT:
                data = feature.float_list.SerializeToString()
                # the packed length grows with the count: same length, same count (unless unknown fields
                # in the list make up the difference: the count check tells)
                if len(data) == self.expected and len(feature.float_list.value) == self.size:
                    self.parts.append(data)
                    return
            else:
                values = getattr(feature, self.list_name).value[:]
                if len(values) == self.expected:
                    self.parts += values
                    return
        self.add_checked(index, feature)

    def add_checked(self, index: int, feature) -> None:
        values = self.checked_values(index, feature)
        if values is None:
            values = self.default(index)
        elif len(values) != self.size:
            raise ExampleParseError(
                f"Key: {self.key}, {self.location.format(index)}.  Can't parse serialized Example: "
                f"{_count_phrase(self.kind)} FixedLenFeature shape {_shape_string(self.spec.shape)} needs "
                f"{self.size} values, the record has {len(values)}. Fix the shape, or parse lists of varying "
                f"length with VarLenFeature or RaggedFeature."
            )
        self.append_values(values)

    def append_values(self, values: Any) -> None:
        if self.kind == FLOAT:
            self.parts.append(float_list_bytes(values) if self.size else b"")
        else:
            self.parts += list(values)

    def default(self, index: int) -> np.ndarray:
        if self.spec._default is None:
            advice = (
                "Give its FixedLenFeature a default_value, or parse it with VarLenFeature, to accept "
                "records without it."
                if self.size
                else "Its shape has no elements, so no default_value can stand in (TensorFlow takes [] for no "
                "default): parse it with VarLenFeature to accept records without it."
            )
            raise ExampleParseError(
                f"Feature: {self.key} (data type: {_TF_TYPE_NAME[self.dtype]}) is required but could not be "
                f"found ({self.location.format(index)}). {advice}"
            )
        return self.spec._default

    def result(self, single: bool) -> np.ndarray:
        if self.kind == FLOAT and self.size:
            rows = np.frombuffer(b"".join(self.parts), np.uint8).reshape(self.count, self.packed_size)
            payload = np.array(rows[:, self.packed_size - 4 * self.size :])  # a contiguous, writable copy
            values = payload.view("<f4").astype(np.float32, copy=False)
        elif self.kind == FLOAT:
            values = np.empty(0, np.float32)
        else:
            values = _values_array(self.parts, self.dtype)
        return values.reshape(self.spec.shape if single else (self.count, *self.spec.shape))


class _ContextFixedLenColumn(_FixedLenColumn):
    """A SequenceExample context's FixedLenFeature, as TF's sequence parser reads it: the last copy of a
    repeated key whatever it holds, a Feature() with no list present with no values (not missing), and
    the count checked against the most values a record has (at least the default's size), in its words."""

    def add_checked(self, index: int, feature) -> None:
        values = (
            [] if feature is not None and feature.WhichOneof("kind") is None else self.checked_values(index, feature)
        )
        found = 0 if values is None else len(values)
        most = max(found, self.size) if self.spec._default is not None else found
        where, shape = self.location.format(index), _shape_string(self.spec.shape)
        if most != self.size:
            lacks = (
                "the context lacks it, or holds a Feature() with no list, and its FixedLenFeature has no default_value"
                if not found
                else f"the context holds {found} values"
            )
            raise ExampleParseError(
                f"Key: {self.key}, {where}.  Inconsistent max number of elements for feature {self.key}: expected "
                f"{self.size}, but found {most} ({lacks}; shape {shape} needs {self.size})."
            )
        if values is None:
            values = self.default(index)
        elif found != self.size:
            raise ExampleParseError(
                f"Key: {self.key}, {where}.  Unexpected number of elements in example: the context holds {found} "
                f"values (a Feature() with no list holds none), shape {shape} needs {self.size}."
            )
        self.append_values(values)


def _count_phrase(kind: int) -> str:
    # TensorFlow's fast-parser wording for a count mismatch, per list kind.
    if kind == BYTES:
        return "Parsing bytes_list failed."
    return f"Some {_LIST_NAME[kind]} slice was not parsed."


class _VarLenColumn(_Column):
    """Any number of values per record: the values of all records, and each record's count."""

    def __init__(self, name: str, spec: Any, count: int, key: str | None = None, location: str = "record {}") -> None:
        super().__init__(name, spec, count, key, location)
        self.counts: list[int] = []

    def add(self, index: int, feature) -> None:
        if feature is not None:
            if self.kind == FLOAT:
                payload = float_payload(feature.float_list)
                if payload:
                    self.parts.append(payload)
                    self.counts.append(len(payload) >> 2)
                    return
            else:
                values = getattr(feature, self.list_name).value[:]
                if values:
                    self.parts += values
                    self.counts.append(len(values))
                    return
        listed = self.resolved(index, feature)  # the kind check (a list with values took the path above)
        if listed is not None and listed is not feature:
            self.add(index, listed)  # an earlier copy's list, where TF reads that one
            return
        self.counts.append(0)

    def lengths(self) -> np.ndarray:
        return np.array(self.counts, np.int64).reshape(self.count)

    def sparse(self, single: bool) -> SparseValue:
        return _sparse_value(_values_array(self.parts, self.dtype), self.lengths(), single)

    def result(self, single: bool) -> ParsedValue:
        return self.sparse(single)


class _RaggedColumn(_VarLenColumn):
    def __init__(self, name: str, spec: RaggedFeature, count: int, location: str = "record {}") -> None:
        super().__init__(name, spec, count, spec.value_key, location)

    def result(self, single: bool) -> np.ndarray | RaggedValue:
        return _ragged_value(_values_array(self.parts, self.dtype), self.lengths(), self.spec, single)


class _SequenceColumn(_VarLenColumn):
    """FixedLenSequenceFeature in an Example: [rows] + shape per record, padded in a batch."""

    def __init__(self, name: str, spec: FixedLenSequenceFeature, count: int) -> None:
        super().__init__(name, spec, count)
        self.row_size = math.prod(spec.shape)

    def add(self, index: int, feature) -> None:
        super().add(index, feature)
        length = self.counts[-1]
        if length and (self.row_size == 0 or length % self.row_size):
            raise ExampleParseError(
                f"Key: {self.key}, {self.location.format(index)}.  Number of {KIND_NAMES[self.kind]} values is not "
                f"a multiple of stride length. Saw {length} values but output shape is: {_shape_string([None, *self.spec.shape])}. "
                f"Each row needs {self.row_size} values."
            )

    def result(self, single: bool) -> np.ndarray:
        return _sequence_value(_values_array(self.parts, self.dtype), self.lengths(), self.spec, single)


def _example_columns(features: Mapping[str, Any], count: int, what: str) -> list[_Column]:
    """The columns of `features` ("features" of an Example or a SequenceExample's "context_features", as `what`
    names them in errors) for `count` records; a bad mapping or spec is refused here, before any record is read."""
    if not isinstance(features, Mapping):
        raise TypeError(f"{what} must be a dict of feature name to spec; received {type(features).__name__}.")
    columns: list[_Column] = []
    for name, spec in features.items():
        if isinstance(spec, FixedLenFeature):
            column_class = _ContextFixedLenColumn if what == "context_features" else _FixedLenColumn
            columns.append(column_class(name, spec, count))
        elif isinstance(spec, VarLenFeature):
            columns.append(_VarLenColumn(name, spec, count))
        elif isinstance(spec, RaggedFeature):
            columns.append(_RaggedColumn(name, spec, count))
        elif isinstance(spec, FixedLenSequenceFeature) and what == "features":
            if not spec.allow_missing:
                raise ValueError(
                    f"Feature {name!r}: Unsupported: FixedLenSequenceFeature requires allow_missing "
                    f"to be True. (as in TensorFlow when parsing Examples)"
                )
            columns.append(_SequenceColumn(name, spec, count))
        else:
            allowed = (
                "FixedLenFeature, VarLenFeature, FixedLenSequenceFeature or RaggedFeature"
                if what == "features"
                else "FixedLenFeature, VarLenFeature or RaggedFeature"
            )
            raise TypeError(f"{what}[{name!r}] must be a {allowed}; received {type(spec).__name__}.")
    return columns


def _preview(record: Any) -> str:
    """A record as both parsers quote it when it does not decode: its first 48 bytes (records can be large)."""
    data = bytes(record[:48]) if isinstance(record, (bytes, bytearray, memoryview)) else record
    return f"{data!r}{'...' if isinstance(record, (bytes, bytearray, memoryview)) and len(record) > 48 else ''}"
