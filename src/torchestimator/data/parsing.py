"""Parsing specs for tf.train.Example / SequenceExample with TensorFlow's semantics.

What belongs here: the feature specs users know from `tf.io`
(`FixedLenFeature`, `VarLenFeature`, `FixedLenSequenceFeature`, the plain
`RaggedFeature`), `parse_single_example`, `parse_example` (a batch),
`parse_single_sequence_example`, `decode_raw`, and `to_torch`. What does not:
the wire format (`example.py`) and reading records from files (`tfrecord.py`).

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

import abc
import dataclasses
import itertools
import math
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from torchestimator.data._decode_raw import decode_raw
from torchestimator.data._parsing_copies import RecordSource, last_listed_copy
from torchestimator.data.example import (
    _KIND_FIELDS,
    BYTES,
    FLOAT,
    INT64,
    KIND_NAMES,
    ExampleDecodeError,
    ExampleParseError,
    example_protos,
    feature_kind,
    float_list_bytes,
    float_payload,
    float_values,
    parse_example_proto,
    parse_sequence_example_proto,
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

_KIND_OF_DTYPE = {"int64": INT64, "float32": FLOAT, "string": BYTES}
_NUMPY_DTYPE: dict[str, np.dtype[Any]] = {
    "int64": np.dtype(np.int64),
    "float32": np.dtype(np.float32),
    "string": np.dtype(object),
}
_TF_TYPE_NAME = {"int64": "int64", "float32": "float", "string": "string"}  # as TF's messages spell them
_LIST_NAME = {INT64: "int64_list", FLOAT: "float_list", BYTES: "bytes_list"}
_DTYPE_ALIASES = {
    "int64": "int64",
    "float32": "float32",
    "float": "float32",
    "string": "string",
    "bytes": "string",
    "str": "string",
    "object": "string",
}


def _normalize_dtype(dtype: Any, spec: str) -> str:
    """Accept "int64"/"float32"/"string", numpy dtypes, Python bytes/str and torch.int64/torch.float32."""
    if isinstance(dtype, str) or type(dtype).__module__ == "torch":
        name = str(dtype).removeprefix("torch.").removeprefix("tf.")
    elif dtype in (bytes, str, object):
        name = "string"
    else:
        try:
            numpy_dtype = np.dtype(dtype)
        except TypeError:
            numpy_dtype = None
        name = "string" if numpy_dtype is not None and numpy_dtype.kind in "OSU" else str(numpy_dtype or dtype)
    normalized = _DTYPE_ALIASES.get(name)
    if normalized is None:
        raise ValueError(
            f"{spec}: unsupported dtype {dtype!r}. Value for attr 'Tdense' of {name} is not in the list of allowed "
            f"values: float, int64, string. tf.train.Example stores only int64, float32 and bytes; parse as one of "
            f"those and cast afterwards (e.g. array.astype(np.int32))."
        )
    return normalized


def _normalize_shape(shape: Any, spec: str) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{spec}: shape must be a list of ints such as [] or [3]; received {shape!r}.") from None
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 0:
            raise ValueError(
                f"{spec}: shape {list(shape)!r} must hold non-negative ints (no None: for lists of "
                f"varying length use VarLenFeature, RaggedFeature or FixedLenSequenceFeature)."
            )
    return tuple(int(dim) for dim in dims)


def _as_array(value: Any, dtype: str, spec: str) -> np.ndarray:
    numpy_dtype = _NUMPY_DTYPE[dtype]
    if dtype == "string":
        items = np.ravel(np.array(value, dtype=object)).tolist()  # defaults are used flat
        if not all(isinstance(item, (bytes, str)) for item in items):
            raise ValueError(f"{spec}: a string default_value must hold bytes or str; received {value!r}.")
        converted = np.empty(len(items), object)
        converted[:] = [item.encode("utf-8") if isinstance(item, str) else item for item in items]
        return converted
    try:
        array = np.asarray(value)
        if dtype == "int64" and array.dtype.kind not in "iub" and array.size:  # [] is float64 to numpy
            raise TypeError
        return array.astype(numpy_dtype)
    except (TypeError, ValueError):
        raise ValueError(f"{spec}: default_value {value!r} is not a valid {dtype} value.") from None


def _shape_string(shape: Sequence[Any]) -> str:
    return "[" + ",".join("?" if dim is None else str(dim) for dim in shape) + "]"


@dataclasses.dataclass(frozen=True, eq=False)
class FixedLenFeature:
    """A feature with exactly prod(shape) values in every record (`tf.io.FixedLenFeature`).

    Positional like TensorFlow's, so `FixedLenFeature([], "int64")` reads as it does there.
    """

    shape: Sequence[int]
    """Shape of one record's value; [] for a scalar. The values are reshaped row-major."""
    dtype: Any
    """"int64", "float32" or "string" (numpy/torch int64 and float32, bytes, str and object also work)."""
    default_value: Any = None
    """Used when a record lacks the feature (prod(shape) values); None makes the feature required, and so
    does a zero-element default (shape [0] with default_value=[]), as in TensorFlow."""

    if TYPE_CHECKING:  # set by __post_init__; declared for the checker only, so it is no dataclass field
        _default: np.ndarray | None = dataclasses.field(init=False)
        """default_value as a flat array of the dtype; None when the feature is required."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _normalize_shape(self.shape, "FixedLenFeature"))
        object.__setattr__(self, "dtype", _normalize_dtype(self.dtype, "FixedLenFeature"))
        default = None
        if self.default_value is not None:
            default = _as_array(self.default_value, self.dtype, "FixedLenFeature")
            if default.size != math.prod(self.shape):
                raise ValueError(
                    f"FixedLenFeature: default_value has {default.size} values but shape "
                    f"{_shape_string(self.shape)} needs {math.prod(self.shape)}."
                )
            # TF's parsers take a default of no elements for no default (`NumElements() == 0`): required.
            default = default.reshape(-1) if default.size else None
        object.__setattr__(self, "_default", default)


@dataclasses.dataclass(frozen=True, eq=False)
class VarLenFeature:
    """A list of any length per record, parsed to a `SparseValue` (`tf.io.VarLenFeature`)."""

    dtype: Any
    """"int64", "float32" or "string"."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _normalize_dtype(self.dtype, "VarLenFeature"))


@dataclasses.dataclass(frozen=True, eq=False)
class FixedLenSequenceFeature:
    """Rows of `shape` values, any number of rows (`tf.io.FixedLenSequenceFeature`)."""

    shape: Sequence[int]
    """Shape of one row (one frame); the result is [rows] + shape."""
    dtype: Any
    """"int64", "float32" or "string"."""
    allow_missing: bool = False
    """A missing feature gives zero rows; required True when parsing Examples (as in TF 2)."""
    default_value: Any = None
    """Scalar used to pad shorter records in a batch; 0 or b"" when None."""

    if TYPE_CHECKING:  # set by __post_init__; declared for the checker only, so it is no dataclass field
        _pad: np.ndarray = dataclasses.field(init=False)
        """The padding value as a 0-d array of the dtype."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _normalize_shape(self.shape, "FixedLenSequenceFeature"))
        object.__setattr__(self, "dtype", _normalize_dtype(self.dtype, "FixedLenSequenceFeature"))
        pad = _as_array(b"" if self.dtype == "string" else 0, self.dtype, "FixedLenSequenceFeature")
        if self.default_value is not None:
            pad = _as_array(self.default_value, self.dtype, "FixedLenSequenceFeature")
            if pad.size != 1:
                raise ValueError(
                    f"FixedLenSequenceFeature: default_value pads rows and must be a scalar; "
                    f"received {self.default_value!r}."
                )
        object.__setattr__(self, "_pad", pad.reshape(()))


@dataclasses.dataclass(frozen=True, eq=False)
class RaggedFeature:
    """A list of any length per record, parsed to values and row_splits (`tf.io.RaggedFeature`, plain case)."""

    dtype: Any
    """"int64", "float32" or "string"."""
    value_key: str | None = None
    """The feature to read; defaults to the key this spec has in the features dict."""
    partitions: Sequence[Any] = ()
    """Not supported (only the plain case); must stay empty."""
    row_splits_dtype: Any = "int32"
    """"int32" (TF's default) or "int64"."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _normalize_dtype(self.dtype, "RaggedFeature"))
        if self.partitions:
            raise ValueError(
                "RaggedFeature: partitions are not supported; only the plain case (values of one "
                "feature, split by record or frame) is. Build inner dimensions from row lengths "
                "parsed as separate features."
            )
        splits = str(self.row_splits_dtype).removeprefix("torch.")
        if splits not in ("int32", "int64"):
            raise ValueError(
                f"RaggedFeature: row_splits_dtype must be int32 or int64; received {self.row_splits_dtype!r}."
            )
        object.__setattr__(self, "row_splits_dtype", splits)


FeatureSpec = FixedLenFeature | VarLenFeature | FixedLenSequenceFeature | RaggedFeature


class SparseValue(NamedTuple):
    """COO sparse result, like `tf.compat.v1.SparseTensorValue`."""

    indices: np.ndarray
    """int64 [n, rank]: the position of each value, row-major (from the parsers: sorted and unique, and
    the transposed view of a C-contiguous [rank, n] array, which torch takes as it is)."""
    values: np.ndarray
    """[n] values."""
    dense_shape: np.ndarray
    """int64 [rank]."""

    def to_dense(self, default_value: Any = None) -> np.ndarray:
        """Dense array of `dense_shape`, `default_value` (0 or b"") where no value is stored."""
        fill = default_value if default_value is not None else (b"" if self.values.dtype == object else 0)
        dense = np.full(tuple(self.dense_shape), fill, dtype=self.values.dtype)
        if len(self.values):
            dense[tuple(self.indices.T)] = self.values
        return dense


class RaggedValue(NamedTuple):
    """Ragged result: row i is `values[row_splits[i]:row_splits[i + 1]]` (like `tf.RaggedTensor`)."""

    values: Any
    """All rows' values, concatenated."""
    row_splits: Any
    """[rows + 1] offsets into values, starting at 0."""

    def to_list(self) -> list:
        splits = [int(split) for split in self.row_splits]
        return [self.values[start:stop] for start, stop in itertools.pairwise(splits)]


ParsedValue = np.ndarray | SparseValue | RaggedValue
"""What parsing gives for one feature (the module docstring: which spec gives which)."""


# --------------------------------------------------------------------------------------------
# Columns: one accumulator per spec, filled record by record, finished once.
#
# Per record, a column takes the values in bulk (`.value[:]`, or the FloatList's packed bytes)
# and appends them to one Python list; numpy arrays are built once per batch. A feature whose
# list is set with values of the expected length takes that fast path without WhichOneof (a
# oneof member that is not set reads as empty); anything else goes through `checked_values`,
# which has the kind checks and the errors.


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


# The results of the list-valued specs from all records' values and each record's count (shared
# by the columns above and the compiled pass in _parsing_compiled.py, so both build them the same way).


# The SparseValues the parsers build, by the id of their indices (a weak reference tells a reused
# id apart): `to_torch` trusts these indices, valid and coalesced by construction, and checks others.
_parsed_indices: dict[int, weakref.ref[np.ndarray]] = {}


def _parsed_sparse(indices: np.ndarray, values: np.ndarray, dense_shape: np.ndarray) -> SparseValue:
    """A parser's SparseValue from its int64 [rank, n] C-contiguous, row-major sorted, unique indices."""
    view = indices.T  # [n, rank] as TF has it; its .T is `indices` again, no copy for torch
    key = id(view)
    _parsed_indices[key] = weakref.ref(view, lambda _: _parsed_indices.pop(key, None))
    return SparseValue(view, values, dense_shape)


def _sparse_value(values: np.ndarray, lengths: np.ndarray, single: bool) -> SparseValue:
    if single:
        return _parsed_sparse(
            np.arange(len(values), dtype=np.int64).reshape(1, -1), values, np.array([len(values)], np.int64)
        )
    count = len(lengths)
    indices = np.empty((2, len(values)), np.int64)  # the layout the C pass writes: records, then positions
    indices[0] = np.repeat(np.arange(count, dtype=np.int64), lengths)
    indices[1] = np.arange(len(values), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    width = int(lengths.max()) if count else 0
    return _parsed_sparse(indices, values, np.array([count, width], np.int64))


def _ragged_value(
    values: np.ndarray, lengths: np.ndarray, spec: RaggedFeature, single: bool
) -> np.ndarray | RaggedValue:
    if single:
        return values
    return RaggedValue(values, np.concatenate([[0], np.cumsum(lengths)]).astype(spec.row_splits_dtype))


def _sequence_value(values: np.ndarray, lengths: np.ndarray, spec: FixedLenSequenceFeature, single: bool) -> np.ndarray:
    if single:
        return values.reshape(-1, *spec.shape)
    count, row_size = len(lengths), math.prod(spec.shape)
    rows = lengths // max(row_size, 1)
    width = int(rows.max()) if count else 0
    out = np.full((count, width, row_size), spec._pad, _NUMPY_DTYPE[spec.dtype])
    starts = np.cumsum(lengths) - lengths
    for index in np.flatnonzero(rows):
        out[index, : rows[index]] = values[starts[index] : starts[index] + lengths[index]].reshape(-1, row_size)
    return out.reshape(count, width, *spec.shape)


def _example_columns(features: Mapping[str, Any], count: int, what: str) -> list[_Column]:
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
    data = bytes(record[:48]) if isinstance(record, (bytes, bytearray, memoryview)) else record
    return f"{data!r}{'...' if isinstance(record, (bytes, bytearray, memoryview)) and len(record) > 48 else ''}"


def _parse_records(serialized: Sequence[bytes], features: Mapping[str, Any], single: bool) -> dict[str, Any]:
    # Imported here, not at the top: _parsing_compiled builds on this module's specs and helpers.
    from torchestimator.data._parsing_compiled import parse_compiled

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


# --------------------------------------------------------------------------------------------
# SequenceExample.


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


# --------------------------------------------------------------------------------------------
# torch conversion (decode_raw lives in _decode_raw.py and is re-exported here).


def _tensor(torch: Any, array: np.ndarray) -> Any:
    """A numeric array as a tensor sharing its memory (a copy where it is read-only, which torch refuses)."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _sparse_tensor(torch: Any, value: SparseValue) -> Any:
    shape = tuple(np.asarray(value.dense_shape).tolist())
    reference = _parsed_indices.get(id(value.indices))
    if reference is not None and reference() is value.indices:
        # A parser's: in bounds, sorted, unique; torch's checks cost tens of us a batch (ms with OpenMP threads).
        return torch.sparse_coo_tensor(
            torch.from_numpy(value.indices.T),
            _tensor(torch, value.values),
            shape,
            check_invariants=False,
            is_coalesced=True,
        )
    indices = torch.from_numpy(np.ascontiguousarray(value.indices.T, dtype=np.int64))
    return torch.sparse_coo_tensor(indices, torch.from_numpy(np.array(value.values)), shape, check_invariants=True)


def _to_torch_value(value: Any, torch: Any) -> Any:
    kind = type(value)
    if kind is np.ndarray:  # the common cases first, by exact type
        return value if value.dtype == object else _tensor(torch, value)
    if kind is dict or isinstance(value, Mapping):
        return {name: _to_torch_value(item, torch) for name, item in value.items()}
    if isinstance(value, SparseValue):
        return value if value.values.dtype == object else _sparse_tensor(torch, value)
    if isinstance(value, RaggedValue):
        if getattr(value.values, "dtype", None) == object:  # noqa: E721 (a numpy dtype, not a type)
            return value
        return RaggedValue(
            _tensor(torch, np.ascontiguousarray(value.values)),  # a parse's: no copy
            _tensor(torch, np.ascontiguousarray(value.row_splits)),
        )
    if isinstance(value, np.ndarray) and value.dtype != object:
        return _tensor(torch, value)
    if isinstance(value, tuple):
        return tuple(_to_torch_value(item, torch) for item in value)
    return value


def to_torch(parsed: Any) -> Any:
    """Parsed results -> torch: numeric arrays to tensors (sharing memory where writable).

    `SparseValue` -> `torch.sparse_coo_tensor(indices.T, values, dense_shape)` in TF's row-major
    order: one the parsers made is coalesced by construction and converted without torch's checks
    (`is_coalesced=True`, sharing its arrays), any other (built by hand, or by `_replace`) is checked
    by torch and left uncoalesced. Change a parse result's indices only through a new SparseValue.
    `RaggedValue` -> a `RaggedValue` of tensors; string values stay numpy object arrays. Works on a
    dict, on the `(context, sequences)` pair, or on one value.
    """
    import torch

    return _to_torch_value(parsed, torch)
