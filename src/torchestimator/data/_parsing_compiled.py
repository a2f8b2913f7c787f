"""The compiled Example pass: spec compilation for `_native._examples` and finishing its results.

What belongs here: turning a `parse_example` features mapping into the C pass's plan (compiled
once per mapping and cached), calling `_examples.parse_examples` on a batch, and finishing each
spec's part of its answer into the same numpy results and `SparseValue`/`RaggedValue` that the
pure path in `parsing.py` builds (through the builders both share, in `_parse_results.py`). What
does not: any error wording. The C pass handles only the plain, well-formed case; for any record it does not
(a malformed record, a missing required feature, a wrong kind or count, anything unusual in the
wire format) `parse_compiled` returns None and `parsing._parse_records_python` parses the batch,
which raises its exact error or returns its result. So errors and results never differ between
the paths.

It builds on the specs (`feature_specs.py`), the columns' spec checks and value arrays (`_columns.py`)
and the result builders, never on `parsing.py`, which imports it and calls `parse_compiled` first.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from torchestimator import _native
from torchestimator.data._columns import _example_columns, _values_array
from torchestimator.data._parse_results import _parsed_sparse, _ragged_value, _sequence_value, _sparse_value
from torchestimator.data.example import BYTES, FLOAT, INT64
from torchestimator.data.feature_specs import (
    _NUMPY_DTYPE,
    FeatureSpec,
    FixedLenFeature,
    FixedLenSequenceFeature,
    ParsedValue,
    RaggedFeature,
    RaggedValue,
    SparseValue,
    VarLenFeature,
)

__all__ = ["parse_compiled"]

_LITTLE_ENDIAN = sys.byteorder == "little"  # the compiled pass copies float32 payloads as they are on the wire

_NATIVE_KIND = {"string": BYTES, "float32": FLOAT, "int64": INT64}
_PLAN_CACHE_SIZE = 64
_plans: dict[tuple, _Plan | None] = {}


# How each spec's part of the C pass's answer becomes its result: finish(spec, part, count, single),
# None when the pure path must decide after all. Each takes its own kind of spec and part (Any here).
_Finish = Callable[[Any, Any, int, bool], ParsedValue | None]


def _finish_dense(spec: FixedLenFeature, out: np.ndarray, count: int, single: bool) -> np.ndarray:
    return out.reshape(spec.shape if single else (count, *spec.shape))


def _finish_strings(spec: FixedLenFeature, values: list, count: int, single: bool) -> np.ndarray:
    return _values_array(values, "string").reshape(spec.shape if single else (count, *spec.shape))


def _list_parts(spec: Any, part: tuple) -> tuple[np.ndarray, np.ndarray]:
    values = (
        _values_array(part[0], "string") if spec.dtype == "string" else np.frombuffer(part[0], _NUMPY_DTYPE[spec.dtype])
    )
    return values, np.frombuffer(part[1], np.int64)


def _finish_sparse(spec: VarLenFeature, part: tuple, count: int, single: bool) -> SparseValue:
    values, lengths = _list_parts(spec, part)
    if single:
        return _sparse_value(values, lengths, single)
    width = int(lengths.max()) if count else 0  # the indices came from the C pass, as _sparse_value has them
    return _parsed_sparse(np.frombuffer(part[2], np.int64).reshape(2, -1), values, np.array([count, width], np.int64))


def _finish_ragged(spec: RaggedFeature, part: tuple, count: int, single: bool) -> np.ndarray | RaggedValue:
    return _ragged_value(*_list_parts(spec, part), spec, single)


def _finish_sequence(spec: FixedLenSequenceFeature, part: tuple, count: int, single: bool) -> np.ndarray | None:
    values, lengths = _list_parts(spec, part)
    row_size = math.prod(spec.shape)
    if np.any(lengths % max(row_size, 1)) or (row_size == 0 and np.any(lengths)):
        return None  # a record of a partial row: an error the pure path words
    return _sequence_value(values, lengths, spec, single)


class _Plan(NamedTuple):
    """A features mapping compiled for `_examples.parse_examples`, once per mapping (cached)."""

    keys: tuple[bytes, ...]
    """The distinct feature keys the records are searched for, UTF-8."""
    specs: tuple[tuple, ...]
    """Per spec, the C pass's (slot in keys, kind, mode, values per record, None, default)."""
    arrays: tuple[tuple[int, np.dtype, int], ...]
    """(position in specs, dtype, values per record) of the FixedLen numeric specs, filled in place."""
    finishers: tuple[tuple[str, FeatureSpec, _Finish], ...]
    """Per spec, (name, spec, finish function)."""


def _compile_plan(features: Mapping[str, Any]) -> _Plan | None:
    _example_columns(features, 0, "features")  # the pure path's spec errors, raised the same way
    keys: dict[bytes, int] = {}
    specs: list[tuple[Any, ...]] = []
    arrays: list[tuple[int, np.dtype[Any], int]] = []
    finishers: list[tuple[str, FeatureSpec, _Finish]] = []
    for name, spec in features.items():
        key = spec.value_key or name if isinstance(spec, RaggedFeature) else name
        if not isinstance(key, str):
            return None
        try:
            slot = keys.setdefault(key.encode("utf-8"), len(keys))
        except UnicodeEncodeError:  # a lone surrogate: protobuf's own lookup decides
            return None
        size, mode = 0, 0
        fill: tuple[bytes, ...] | bytes | None = None  # the default: strings as they are, numbers packed
        finish: _Finish
        if isinstance(spec, FixedLenFeature):
            size, default, mode = math.prod(spec.shape), spec._default, 1
            if default is not None:
                fill = (
                    tuple(default.tolist())
                    if spec.dtype == "string"
                    else default.astype(_NUMPY_DTYPE[spec.dtype]).tobytes()
                )
            if spec.dtype != "string":
                arrays.append((len(specs), _NUMPY_DTYPE[spec.dtype], size))
            finish = _finish_strings if spec.dtype == "string" else _finish_dense
        elif isinstance(spec, VarLenFeature):
            mode, finish = 2, _finish_sparse  # 2: the C pass also writes the SparseValue indices
        else:
            finish = _finish_ragged if isinstance(spec, RaggedFeature) else _finish_sequence
        specs.append((slot, _NATIVE_KIND[spec.dtype], mode, size, None, fill))
        finishers.append((name, spec, finish))
    return _Plan(tuple(keys), tuple(specs), tuple(arrays), tuple(finishers))


def _plan_for(features: Any) -> _Plan | None:
    if not isinstance(features, Mapping):
        return None
    try:
        cache_key = tuple(features.items())  # the specs hash by identity (eq=False)
        plan: _Plan | Literal[False] | None = _plans.get(cache_key, False)
    except TypeError:  # an unhashable spec: not a spec at all, the pure path says so
        return None
    if plan is False:
        plan = _compile_plan(features)
        if len(_plans) >= _PLAN_CACHE_SIZE:
            _plans.clear()
        _plans[cache_key] = plan
    return plan


def parse_compiled(serialized: Sequence[bytes], features: Any, single: bool) -> dict[str, Any] | None:
    """The batch parsed by the compiled pass, or None where it does not apply (then the pure path runs)."""
    native = _native.load("_examples")
    if native is None or not _LITTLE_ENDIAN:
        return None
    plan = _plan_for(features)
    if plan is None:
        return None
    count = len(serialized)
    specs = list(plan.specs)
    for position, dtype, size in plan.arrays:
        slot, kind, mode, _, _, fill = specs[position]
        specs[position] = (slot, kind, mode, size, np.empty((count, size), dtype), fill)
    parts = native.parse_examples(serialized, plan.keys, tuple(specs))
    if isinstance(parts, int):  # record `parts` is not the plain case: the pure path decides
        return None
    parsed = {}
    for (name, spec, finish), part, spec_tuple in zip(plan.finishers, parts, specs):
        value = finish(spec, spec_tuple[4] if part is None else part, count, single)
        if value is None:
            return None
        parsed[name] = value
    return parsed
