"""The results of the list-valued specs, built from all records' values and each record's count.

What belongs here: the `SparseValue` of a VarLenFeature, the `RaggedValue` (or values) of a
RaggedFeature and the padded array of a FixedLenSequenceFeature, each built from one flat values
array and the records' lengths, and the record of which SparseValues a parser made. The columns
(`_columns.py`) and the compiled pass (`_parsing_compiled.py`) both build their results here, so
the two paths give the same arrays in the same layout; `to_torch` (`_to_torch.py`) reads the record
to skip torch's index checks for indices that are valid by construction. What does not: collecting
the values (the columns, or the C pass) and any error (the values arrive checked).
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from torchestimator.data.feature_specs import (
    _NUMPY_DTYPE,
    FixedLenSequenceFeature,
    RaggedFeature,
    RaggedValue,
    SparseValue,
)

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
