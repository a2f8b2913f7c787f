"""The `tf.io` feature specs and the values they parse to: what a parse asks for, and what it gives back.

What belongs here: `FixedLenFeature`, `VarLenFeature`, `FixedLenSequenceFeature` and the plain
`RaggedFeature`, checked and normalised when they are made (the dtype to "int64", "float32" or
"string", the shape to a tuple of ints, a default to a flat array of the dtype), so no parser meets
a bad spec halfway through a batch; `SparseValue` and `RaggedValue`, the results of the list-valued
specs; and the dtype tables the parsing modules build arrays and word errors with. What does not:
parsing itself (`parsing.py`, `_sequence_parsing.py`) and which spec gives which result (the
`parsing.py` module docstring). Only int64, float32 and string exist in an Example, so other dtypes
are refused here, when the spec is made, and never by a parse.

`parsing.py` re-exports the public names, and the package's lazy exports find them there.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from torchestimator.data.example import BYTES, FLOAT, INT64

__all__ = [
    "FixedLenFeature",
    "FixedLenSequenceFeature",
    "RaggedFeature",
    "RaggedValue",
    "SparseValue",
    "VarLenFeature",
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
"""What parsing gives for one feature (the `parsing.py` module docstring: which spec gives which)."""
