"""decode_raw: bytes to a numeric array, checking the byte count (`tf.io.decode_raw` without its trap).

Re-exported by parsing.py, where it was first defined: `torchestimator.data.decode_raw`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["decode_raw"]


def _raw_dtype(dtype: Any) -> np.dtype:
    name = str(dtype).removeprefix("torch.") if type(dtype).__module__ == "torch" else dtype
    try:
        numpy_dtype = np.dtype(name)
    except TypeError:
        raise ValueError(
            f"decode_raw: {dtype!r} is not a numeric dtype numpy knows (e.g. 'uint8', 'float32', "
            f"np.int16, torch.float32)."
        ) from None
    if numpy_dtype.kind not in "biufc":
        raise ValueError(f"decode_raw: dtype must be numeric; received {numpy_dtype}.")
    return numpy_dtype


def _fitting_dtypes(byte_count: int) -> str:
    fits = [
        f"{byte_count // size} {name}"
        for name, size in (("uint8", 1), ("int16/float16", 2), ("int32/float32", 4), ("int64/float64", 8))
        if byte_count % size == 0
    ]
    return ", ".join(fits) if fits else "nothing"


def decode_raw(data: Any, dtype: Any, shape: Sequence[int] | None = None, little_endian: bool = True) -> np.ndarray:
    """Bytes -> numeric array, checking the byte count (`tf.io.decode_raw` without its silent-garbage trap).

    `data` is bytes, or a batch (list or object array) of bytes all of one
    length, giving [B] + shape. The byte count must be a multiple of the
    dtype's size and, with `shape` (one -1 allowed), equal prod(shape) x size;
    otherwise a ValueError names both numbers and which dtypes would fit.
    The result is a writable array in native byte order.
    """
    numpy_dtype = _raw_dtype(dtype).newbyteorder("<" if little_endian else ">")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        items = list(np.asarray(data, dtype=object).reshape(-1)) if not isinstance(data, list) else data
        lengths = {len(item) for item in items}
        if len(lengths) > 1:
            raise ValueError(
                f"decode_raw: the records have different lengths {sorted(lengths)[:5]} bytes; a batch "
                f"needs one length (DecodeRaw requires input strings to all be the same size)."
            )
        rows = [decode_raw(item, dtype, shape, little_endian) for item in items]
        size_shape = rows[0].shape if rows else tuple(shape or (0,))
        return np.stack(rows) if rows else np.empty((0, *size_shape), numpy_dtype.newbyteorder("="))
    byte_count, itemsize = len(data), numpy_dtype.itemsize
    if byte_count % itemsize:
        raise ValueError(
            f"decode_raw: {byte_count} bytes is not a multiple of {itemsize} (the size of one "
            f"{numpy_dtype.name}); the data was written with another dtype. {byte_count} bytes would "
            f"be: {_fitting_dtypes(byte_count)}."
        )
    values = np.frombuffer(data, numpy_dtype).astype(numpy_dtype.newbyteorder("="))
    if shape is None:
        return values
    shape = tuple(int(dim) for dim in shape)
    known = math.prod(dim for dim in shape if dim != -1)
    expected = known * itemsize
    if (
        shape.count(-1) > 1
        or (-1 in shape and (known == 0 or len(values) % known))
        or (-1 not in shape and expected != byte_count)
    ):
        raise ValueError(
            f"decode_raw: shape {list(shape)} of {numpy_dtype.name} needs "
            f"{expected if -1 not in shape else f'a multiple of {expected}'} bytes, received "
            f"{byte_count} bytes. {byte_count} bytes would be: {_fitting_dtypes(byte_count)}. Check "
            f"the dtype and shape the data was written with."
        )
    return values.reshape(shape)
