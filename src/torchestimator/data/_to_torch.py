"""Parsed results to torch: `to_torch`, the one place the parsing modules meet torch.

What belongs here: numeric arrays to tensors sharing their memory where they can, `SparseValue`
to `torch.sparse_coo_tensor` (without torch's index checks for the parsers' own indices, valid and
coalesced by construction: `_parse_results.py` records which those are) and `RaggedValue` to a
`RaggedValue` of tensors; string values stay numpy object arrays, since torch has no string
tensors. What does not: parsing, which stays free of torch (torch is imported on the first call).
`parsing.py` re-exports `to_torch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from torchestimator.data._parse_results import _parsed_indices
from torchestimator.data.feature_specs import RaggedValue, SparseValue

__all__ = ["to_torch"]


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
