"""The records of a tensor bundle's `.index`: its header, one entry per tensor, and the keys of saved slices.

What belongs here: `BundleHeaderProto` and `BundleEntryProto` decoded (by the
protobuf runtime, from `_tf_protos.py`) into plain values, TensorFlow's DataType
numbers and their numpy dtypes, the checks an entry must pass before anything
is read for it, and the keys under which partitioned variables store their
slices. What does not: the table around the records (`_sstable.py`), reading
tensor bytes (`tf_checkpoint.py`).

Decoding errors surface as `_protobuf.MessageDecodeError`; the reader turns
them into `WeightSourceError` naming the file and key.
"""

from __future__ import annotations

import dataclasses
import math

from torchestimator._io import protobuf as _protobuf
from torchestimator.interop._tf_protos import tf_protos
from torchestimator.interop.source import WeightSourceError

__all__ = [
    "BFLOAT16",
    "NUMPY_DTYPES",
    "STRING",
    "BundleEntry",
    "BundleHeader",
    "check_entry",
    "decode_entry",
    "decode_header",
    "slice_index",
    "slice_keys",
    "slice_spec",
]

# types.proto DataType -> numpy dtype name. Quantized types share their storage type's layout.
NUMPY_DTYPES = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    8: "complex64",
    9: "int64",
    10: "bool",
    11: "int8",
    12: "uint8",
    13: "int32",
    15: "int16",
    16: "uint16",
    17: "uint16",
    18: "complex128",
    19: "float16",
    22: "uint32",
    23: "uint64",
}
STRING, BFLOAT16 = 7, 14
_OTHER_DTYPES = {
    0: "invalid",
    7: "string",
    14: "bfloat16",
    20: "resource",
    21: "variant",
    24: "float8_e5m2",
    25: "float8_e4m3fn",
    26: "float8_e4m3fnuz",
    27: "float8_e4m3b11fnuz",
    28: "float8_e5m2fnuz",
    29: "int4",
    30: "uint4",
    31: "int2",
    32: "uint2",
    33: "float4_e2m1fn",
}
# No array has more elements (numpy's own limit is 2**63 bytes); even zero-size shapes must stay below it.
_MAX_ELEMENTS = 1 << 52
_BUNDLE_VERSION = 1  # tensor_bundle.h kTensorBundleVersion: what this reader understands

Extents = tuple[tuple[int, "int | None"], ...]


@dataclasses.dataclass(frozen=True)
class BundleEntry:
    """One BundleEntryProto: where a tensor lives in the data shards."""

    dtype: int  # TensorFlow DataType enum value
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int  # masked, as stored
    slices: tuple[Extents, ...]  # per slice, per dim (start, length or None = all)

    @property
    def dtype_name(self) -> str:
        return NUMPY_DTYPES.get(self.dtype) or _OTHER_DTYPES.get(self.dtype, f"dtype_{self.dtype}")


@dataclasses.dataclass(frozen=True)
class BundleHeader:
    """The BundleHeaderProto under the empty key: shard count, byte order, versions."""

    num_shards: int
    big_endian: bool
    producer: int
    min_consumer: int
    bad_consumers: tuple[int, ...]

    def problem(self) -> str | None:
        """Why this reader cannot read the bundle, or None."""
        if not 0 <= self.num_shards < 1 << 31:
            return f"the bundle header declares {self.num_shards} data shards"
        if self.min_consumer > _BUNDLE_VERSION or _BUNDLE_VERSION in self.bad_consumers:
            return (
                f"written by a newer tensor bundle version (producer {self.producer}, min consumer "
                f"{self.min_consumer}); this reader understands version {_BUNDLE_VERSION}"
            )
        return None


def decode_header(data: bytes) -> BundleHeader:
    """The header record's bytes decoded; MessageDecodeError when they are not a BundleHeaderProto."""
    header = _protobuf.parse_binary(tf_protos().BundleHeaderProto, data)
    version = header.version
    return BundleHeader(
        num_shards=header.num_shards,
        big_endian=header.endianness == 1,
        producer=version.producer,
        min_consumer=version.min_consumer,
        bad_consumers=tuple(version.bad_consumers),
    )


def decode_entry(data: bytes) -> BundleEntry:
    """One entry record's bytes decoded; MessageDecodeError when they are not a BundleEntryProto."""
    entry = _protobuf.parse_binary(tf_protos().BundleEntryProto, data)
    if entry.shape.unknown_rank:
        raise _protobuf.MessageDecodeError("the shape has unknown rank")
    slices = tuple(
        tuple((extent.start, extent.length if extent.HasField("length") else None) for extent in slice_proto.extent)
        for slice_proto in entry.slices
    )
    return BundleEntry(
        dtype=entry.dtype,
        shape=tuple(dim.size for dim in entry.shape.dim),
        shard_id=entry.shard_id,
        offset=entry.offset,
        size=entry.size,
        crc32c=entry.crc32c,
        slices=slices,
    )


def check_entry(index_path: str, key: bytes, entry: BundleEntry) -> None:
    """Refuse negative dimensions, offsets and sizes now; sizes against the shards are checked on read."""
    problems = []
    if any(dim < 0 for dim in entry.shape):
        problems.append(f"shape {list(entry.shape)} has a negative dimension")
    elif math.prod(max(dim, 1) for dim in entry.shape) > _MAX_ELEMENTS:
        problems.append(f"shape {list(entry.shape)} is beyond any array's size")
    if entry.offset < 0 or entry.size < 0:
        problems.append(f"negative offset {entry.offset} or size {entry.size}")
    for extents in entry.slices:
        if any(start < 0 or (length is not None and length < -1) for start, length in extents):
            problems.append(f"slice '{slice_spec(extents)}' does not fit shape {list(entry.shape)}")
            break
    if problems:
        name = key.decode("utf-8", "backslashreplace")
        raise WeightSourceError(f"{index_path}: the entry of {name!r} is corrupt: {'; '.join(problems)}.")


# ----------------------------------------------------------------------------- slices
# The keys are TensorFlow's OrderedCode (lib/strings/ordered_code.cc), a byte format of its own: by hand.


def _ordered_signed(value: int) -> bytes:
    # OrderedCode::WriteSignedNumIncreasing: n bytes whose first n bits are ones, negatives bit-inverted.
    magnitude = ~value if value < 0 else value
    for length in range(1, 9):
        if magnitude < 1 << (7 * length - 1):
            encoded = bytearray(magnitude.to_bytes(length, "big"))
            encoded[0] |= (0xFF << (8 - length)) & 0xFF
            return bytes(byte ^ 0xFF for byte in encoded) if value < 0 else bytes(encoded)
    raise ValueError(f"slice bound {value} is too large")


def _ordered_unsigned(value: int) -> bytes:
    payload = value.to_bytes((value.bit_length() + 7) // 8, "big") if value else b""
    return bytes([len(payload)]) + payload


def slice_keys(name: str, shape: tuple[int, ...], extents: Extents) -> list[bytes]:
    """Candidate keys of one slice (EncodeTensorNameSlice); a full extent may be stored as -1 or as the size."""
    escaped = name.encode("utf-8").replace(b"\xff", b"\xff\x00").replace(b"\x00", b"\x00\xff")
    head = b"\x00" + escaped + b"\x00\x01" + _ordered_unsigned(len(extents))
    keys = [head]
    for dim, (start, length) in enumerate(extents):
        lengths = [length] if length is not None else [-1, shape[dim] - start]
        keys = [key + _ordered_signed(start) + _ordered_signed(option) for key in keys for option in lengths]
    return keys


def slice_index(shape: tuple[int, ...], extents: Extents) -> tuple[slice, ...]:
    """The numpy index of one slice within the whole tensor."""
    return tuple(
        slice(start, shape[dim] if length in (None, -1) else start + length)
        for dim, (start, length) in enumerate(extents)
    )


def slice_spec(extents: Extents) -> str:
    """TensorFlow's text form of a slice: `start,length` per dimension, `-` for all of it."""
    return ":".join("-" if length in (None, -1) else f"{start},{length}" for start, length in extents)
