"""TensorProto <-> numpy, as TensorFlow converts them, for the gRPC API and the warm-up file.

    proto = make_tensor_proto(np.ones((2, 3), np.float32))                  # typed fields (float_val), as TF Serving answers
    proto = make_tensor_proto(array, tensor_content=True)                  # raw little-endian bytes, as tf.make_tensor_proto
    array = tensor_proto_to_numpy(proto, where="input 'x'")               # either form; a string tensor -> object array of bytes

What belongs here: the DataType <-> dtype table, reading ``tensor_content``
and every typed value field, writing either form. What does not: the
messages themselves (protos.py), which signature input a tensor feeds and
whether its dtype fits it (grpc_requests.py).

Reading follows TensorFlow (``Tensor::FromProto``, ``tf.make_ndarray``):
``tensor_content`` holds the values little-endian and row-major; otherwise the
field of the dtype holds them (``int_val`` for int32/int16/int8/uint8/uint16,
``half_val`` for half and bfloat16 as their 16-bit patterns, complex values as
(real, imaginary) pairs), and one value fills the whole shape, as
``tf.make_tensor_proto(0.0, shape=[2, 3])`` writes it. Any other count is an
error naming the tensor: TF's C++ pads a short list with its last value and
cuts a long one, which hides a client's bug; ``tf.make_ndarray`` refuses both.

A TensorProto that does not hold a tensor is a ValueError naming it (a mistake in how the message was built,
which errors.py leaves a plain ValueError); the gRPC API answers it INVALID_ARGUMENT.

Writing follows TF Serving's default answer (``Tensor::AsProtoField``): every
value in its typed field. float and double values go in as one packed field
(``MergeFromString`` of their bytes) rather than one Python float at a time.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from torchestimator._io import protobuf as _protobuf
from torchestimator.serving.protos import DATA_TYPES, serving_protos

__all__ = ["DTYPE_NAMES", "data_type", "make_tensor_proto", "tensor_proto_to_numpy"]


# DataType -> (numpy dtype read from the proto, typed field, numpy dtype of that field's values).
_FIELDS: dict[int, tuple[Any, str, Any]] = {
    DATA_TYPES["DT_FLOAT"]: (np.dtype("<f4"), "float_val", np.float32),
    DATA_TYPES["DT_DOUBLE"]: (np.dtype("<f8"), "double_val", np.float64),
    DATA_TYPES["DT_INT32"]: (np.dtype("<i4"), "int_val", np.int32),
    DATA_TYPES["DT_UINT8"]: (np.dtype("u1"), "int_val", np.int32),
    DATA_TYPES["DT_INT16"]: (np.dtype("<i2"), "int_val", np.int32),
    DATA_TYPES["DT_INT8"]: (np.dtype("i1"), "int_val", np.int32),
    DATA_TYPES["DT_UINT16"]: (np.dtype("<u2"), "int_val", np.int32),
    DATA_TYPES["DT_INT64"]: (np.dtype("<i8"), "int64_val", np.int64),
    DATA_TYPES["DT_BOOL"]: (np.dtype("?"), "bool_val", np.bool_),
    DATA_TYPES["DT_HALF"]: (np.dtype("<f2"), "half_val", np.int32),
    DATA_TYPES["DT_BFLOAT16"]: (np.dtype("<u2"), "half_val", np.int32),  # bit patterns: numpy has no bfloat16
    DATA_TYPES["DT_UINT32"]: (np.dtype("<u4"), "uint32_val", np.uint32),
    DATA_TYPES["DT_UINT64"]: (np.dtype("<u8"), "uint64_val", np.uint64),
    DATA_TYPES["DT_COMPLEX64"]: (np.dtype("<c8"), "scomplex_val", np.float32),
    DATA_TYPES["DT_COMPLEX128"]: (np.dtype("<c16"), "dcomplex_val", np.float64),
    DATA_TYPES["DT_STRING"]: (np.dtype(object), "string_val", object),
}

DTYPE_NAMES = {number: name for name, number in DATA_TYPES.items()}
"""DataType number -> its name (``1`` -> ``"DT_FLOAT"``)."""

_BY_NUMPY = {
    np.dtype(np.float32): "DT_FLOAT",
    np.dtype(np.float64): "DT_DOUBLE",
    np.dtype(np.int32): "DT_INT32",
    np.dtype(np.uint8): "DT_UINT8",
    np.dtype(np.int16): "DT_INT16",
    np.dtype(np.int8): "DT_INT8",
    np.dtype(np.uint16): "DT_UINT16",
    np.dtype(np.int64): "DT_INT64",
    np.dtype(np.bool_): "DT_BOOL",
    np.dtype(np.float16): "DT_HALF",
    np.dtype(np.uint32): "DT_UINT32",
    np.dtype(np.uint64): "DT_UINT64",
    np.dtype(np.complex64): "DT_COMPLEX64",
    np.dtype(np.complex128): "DT_COMPLEX128",
}

_LITTLE_ENDIAN = sys.byteorder == "little"


def data_type(array: np.ndarray) -> str:
    """The DataType name of a numpy array (object, bytes and str arrays are DT_STRING)."""
    if array.dtype.kind in "OSU":
        return "DT_STRING"
    name = _BY_NUMPY.get(array.dtype.newbyteorder("="))  # a big-endian array is the same DataType
    if name is None:
        raise ValueError(f"numpy dtype {array.dtype} has no TensorFlow DataType.")
    return name


# -- reading ------------------------------------------------------------------------------------


def tensor_proto_to_numpy(proto: Any, where: str = "tensor") -> np.ndarray:
    """The tensor a TensorProto holds; DT_STRING as a numpy object array of bytes, DT_BFLOAT16 as uint16 bits.

    ValueError (naming ``where``) for an unknown rank or dtype, a
    negative size, or a value count that neither fills the shape nor is one.
    """
    dtype_number = proto.dtype
    if dtype_number not in _FIELDS:
        name = DTYPE_NAMES.get(dtype_number, f"DataType {dtype_number}")
        raise ValueError(
            f"{where}: {name} tensors are not supported; send one of "
            f"{sorted(DTYPE_NAMES[number] for number in _FIELDS)}."
        )
    numpy_dtype, field, field_dtype = _FIELDS[dtype_number]
    shape = _shape(proto, where)
    count = math.prod(shape)
    if proto.tensor_content:
        if field == "string_val":
            raise ValueError(
                f"{where}: a DT_STRING tensor cannot be given as tensor_content; put the "
                "strings in string_val (tf.make_tensor_proto does)."
            )
        content = proto.tensor_content
        if len(content) != count * numpy_dtype.itemsize:
            raise ValueError(
                f"{where}: tensor_content holds {len(content)} bytes; shape {list(shape)} of "
                f"{DTYPE_NAMES[dtype_number]} needs {count * numpy_dtype.itemsize}."
            )
        array = np.frombuffer(content, numpy_dtype).reshape(shape)
        return array if _LITTLE_ENDIAN else array.astype(numpy_dtype.newbyteorder("="))
    values = getattr(proto, field)
    if field == "string_val":
        flat = np.empty(len(values), object)
        flat[:] = list(values)
    else:
        flat = np.array(values, field_dtype) if len(values) else np.empty(0, field_dtype)
        flat = _from_field(flat, dtype_number, numpy_dtype)
    if flat.size == count:
        return flat.reshape(shape)
    if flat.size == 1:  # one value fills the shape (tf.make_ndarray; tf.make_tensor_proto(0.0, shape=...))
        return np.full(shape, flat[0], dtype=flat.dtype)
    if field in ("scomplex_val", "dcomplex_val") and len(values) % 2:
        raise ValueError(
            f"{where}: {field} holds {len(values)} numbers; complex values come as (real, imaginary) pairs."
        )
    raise ValueError(
        f"{where}: {field} holds {flat.size} values; shape {list(shape)} needs {count} (or one value for all of them)."
    )


def _from_field(flat: np.ndarray, dtype_number: int, numpy_dtype: np.dtype) -> np.ndarray:
    name = DTYPE_NAMES[dtype_number]
    if name in ("DT_HALF", "DT_BFLOAT16"):
        flat = flat.astype(np.uint16)  # the low 16 bits are the value's bit pattern
        return flat.view(np.float16) if name == "DT_HALF" else flat
    if name in ("DT_COMPLEX64", "DT_COMPLEX128"):
        if flat.size % 2:
            return flat  # the count check words it
        return flat.reshape(-1, 2).copy().view(numpy_dtype.newbyteorder("=")).reshape(-1)
    if flat.dtype != numpy_dtype:
        return flat.astype(numpy_dtype.newbyteorder("="))  # int_val holds int8..uint16 widened to int32
    return flat


def _shape(proto: Any, where: str) -> tuple[int, ...]:
    shape = proto.tensor_shape
    if shape.unknown_rank:
        raise ValueError(f"{where}: tensor_shape has unknown_rank set; send the tensor's shape.")
    sizes = tuple(dim.size for dim in shape.dim)
    if any(size < 0 for size in sizes):
        raise ValueError(f"{where}: tensor_shape {list(sizes)} has a negative size; a tensor's sizes are known.")
    return sizes


# -- writing ------------------------------------------------------------------------------------

# float_val and double_val: one packed field written from the array's bytes (fields 5 and 6, wire type 2).
_PACKED_FIELDS = {"DT_FLOAT": (5, "<f4"), "DT_DOUBLE": (6, "<f8")}


def make_tensor_proto(values: Any, *, dtype: str | None = None, tensor_content: bool = False) -> Any:
    """A TensorProto holding ``values`` (an array, nested lists, or a list of bytes/str for DT_STRING).

    ``tensor_content=True`` writes raw little-endian bytes (what
    ``tf.make_tensor_proto`` does for numeric arrays; not for strings);
    otherwise the typed field, as TF Serving writes its answers. ``dtype`` (a
    DataType name) converts numeric values first; bfloat16 values are given as
    their uint16 bit patterns.
    """
    array = _as_array(values, dtype)
    name = dtype or data_type(array)
    if name not in DATA_TYPES or DATA_TYPES[name] not in _FIELDS:
        raise ValueError(
            f"dtype {name!r} is not a supported DataType; use one of "
            f"{sorted(DTYPE_NAMES[number] for number in _FIELDS)}."
        )
    proto = serving_protos().TensorProto()
    proto.dtype = DATA_TYPES[name]
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    if name == "DT_STRING":
        proto.string_val.extend(_as_bytes(item) for item in array.reshape(-1))
        return proto
    numpy_dtype, field, _ = _FIELDS[DATA_TYPES[name]]
    flat = np.ascontiguousarray(array.reshape(-1), numpy_dtype)
    if tensor_content:
        proto.tensor_content = flat.tobytes()
    elif name in _PACKED_FIELDS and flat.size:
        number, little = _PACKED_FIELDS[name]
        proto.MergeFromString(_protobuf.length_delimited(number, flat.astype(little, copy=False).tobytes()))
    elif name in ("DT_HALF", "DT_BFLOAT16"):
        proto.half_val.extend(flat.view(np.uint16).tolist())
    elif name in ("DT_COMPLEX64", "DT_COMPLEX128"):
        getattr(proto, field).extend(np.stack([flat.real, flat.imag], axis=-1).reshape(-1).tolist())
    else:
        getattr(proto, field).extend(flat.tolist())
    return proto


def _as_array(values: Any, dtype: str | None) -> np.ndarray:
    if dtype == "DT_STRING" or (dtype is None and _is_strings(values)):
        if isinstance(values, np.ndarray):  # any shape; S/U arrays become objects, item by item
            return values.astype(object)
        array = np.empty(len(values), object)  # a list of bytes: one dimension (np.array would make S, cut NULs)
        array[:] = list(values)
        return array
    array = np.asarray(values)
    if dtype is not None and dtype in DATA_TYPES and DATA_TYPES[dtype] in _FIELDS:
        target = _FIELDS[DATA_TYPES[dtype]][0]
        if array.dtype != target:
            array = array.astype(target.newbyteorder("="))
    return array


def _is_strings(values: Any) -> bool:
    if isinstance(values, np.ndarray):
        return values.dtype.kind in "OSU"
    return (
        isinstance(values, Sequence)
        and not isinstance(values, (str, bytes))
        and bool(values)
        and all(isinstance(item, (bytes, str)) for item in values)
    )


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    raise ValueError(f"A DT_STRING tensor holds bytes or str; received {type(item).__name__}.")
