"""TensorFlow checkpoints (tensor bundle V2) read in pure Python, without TensorFlow.

What belongs here: locating a checkpoint (prefix, directory with a `checkpoint`
file, or `.index` path), the `.index` SSTable (LevelDB table format: footer,
index block, data blocks with prefix-compressed keys, CRC32C block trailers),
the BundleHeaderProto / BundleEntryProto records in it, the tensor bytes in the
`.data-NNNNN-of-NNNNN` shards (numeric, bool and DT_STRING, each checked against
its CRC32C), partitioned variables saved as slices, and the TF2 object graph
(`_CHECKPOINTABLE_OBJECT_GRAPH`) that maps object paths to checkpoint keys.
What does not: mapping names or layouts onto a PyTorch model (warm start and
the layout converters), and writing checkpoints.

The byte-level format is in formats.md section 3. The few protobuf messages
are decoded by a small wire-format decoder: their fields are plain scalars and
sub-messages, and a hand decoder keeps every failure attributable to a file
and offset.

Values: numeric tensors come back as native-endian numpy arrays of the
matching dtype; DT_STRING tensors as numpy object arrays of `bytes`; bfloat16
(numpy has no such dtype) is widened exactly to float32 while
`TensorInfo.dtype` still says "bfloat16".
"""

from __future__ import annotations

import codecs
import dataclasses
import itertools
import logging
import math
import os
import re
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from torchestimator.data.tfrecord import masked_crc32c
from torchestimator.interop.source import TensorInfo, WeightSource, WeightSourceError, missing_tensor_error

__all__ = [
    "BundleEntry",
    "OBJECT_GRAPH_KEY",
    "TensorFlowCheckpoint",
    "is_optimizer_variable",
    "is_tensorflow",
    "locate_checkpoint",
    "open_tensorflow",
    "read_checkpoint_state",
]

logger = logging.getLogger(__name__)

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

_FOOTER_SIZE = 48
_TRAILER_SIZE = 5
_TABLE_MAGIC = 0xDB4775248B80FB57
_DATA_SUFFIX = re.compile(r"\.data-\d{5}-of-\d{5}$")
_UINT32 = struct.Struct("<I")
# Snappy's densest element is a 3-byte copy of 64 bytes; a block declaring more than this ratio is corrupt.
_SNAPPY_MAX_RATIO = 22
# No array has more elements (numpy's own limit is 2**63 bytes); even zero-size shapes must stay below it.
_MAX_ELEMENTS = 1 << 52

# types.proto DataType -> numpy dtype name. Quantized types share their storage type's layout.
_NUMPY_DTYPES = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 8: "complex64", 9: "int64",
    10: "bool", 11: "int8", 12: "uint8", 13: "int32", 15: "int16", 16: "uint16", 17: "uint16",
    18: "complex128", 19: "float16", 22: "uint32", 23: "uint64",
}
_STRING, _BFLOAT16 = 7, 14
_OTHER_DTYPES = {
    0: "invalid", 7: "string", 14: "bfloat16", 20: "resource", 21: "variant", 24: "float8_e5m2",
    25: "float8_e4m3fn", 26: "float8_e4m3fnuz", 27: "float8_e4m3b11fnuz", 28: "float8_e5m2fnuz", 29: "int4",
    30: "uint4", 31: "int2", 32: "uint2", 33: "float4_e2m1fn",
}

# TF1 optimizer slots are `<variable>/<SlotName>`; repeated optimizers add `_1`, `_2`, ...
_TF1_SLOT = re.compile(
    r"/(Adam|RMSProp|Adadelta|Ftrl|LazyAdam|Momentum|Adagrad|AdagradDA|ProximalAdagrad|"
    r"ExponentialMovingAverage|GradientDescent|Nadam|Adamax)(_\d+)?$"
)
_TF1_SCALARS = re.compile(r"^(beta1_power|beta2_power|global_step|save_counter)(_\d+)?$")
_TF2_OPTIMIZER = re.compile(r"(^|/)\.OPTIMIZER_SLOT/|^optimizer(_\d+)?/|^save_counter/|^training/")


def is_optimizer_variable(name: str) -> bool:
    """Whether a checkpoint key is optimizer state or bookkeeping rather than a model variable.

    Covers TF1 names (`<var>/Adam`, `<var>/Adam_1`, `<var>/Momentum`, `beta1_power`,
    `global_step`, ...) and TF2 object keys (`.OPTIMIZER_SLOT`, `optimizer/...`,
    `save_counter`, the object graph itself). Keras 3 may store model weights
    under `optimizer/_trainable_variables/N`; use
    `TensorFlowCheckpoint.model_variables()`, which reads the object graph, for those.
    """
    return bool(name == OBJECT_GRAPH_KEY or _TF1_SLOT.search(name) or _TF1_SCALARS.match(name)
                or _TF2_OPTIMIZER.search(name))


# --------------------------------------------------------------------------- protobuf wire format


class _WireError(ValueError):
    """Malformed protobuf or varint bytes; callers add the file and offset."""


def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data):
            raise _WireError("a varint runs past the end of its buffer")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise _WireError("a varint is longer than 10 bytes")


def _signed(value: int) -> int:
    # int32/int64 fields hold negative numbers as 64-bit two's complement varints.
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(data: bytes) -> dict[int, list[Any]]:
    """Decode one message into {field number: [values]} (ints for scalars, bytes for sub-messages)."""
    if not isinstance(data, bytes):
        raise _WireError("a sub-message field holds a number")
    fields: dict[int, list[Any]] = {}
    position = 0
    while position < len(data):
        tag, position = _varint(data, position)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, position = _varint(data, position)
        elif wire_type == 2:
            length, position = _varint(data, position)
            value = data[position:position + length]
            position += length
        elif wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            value = int.from_bytes(data[position:position + width], "little")
            position += width
        else:
            raise _WireError(f"unsupported wire type {wire_type} for field {number}")
        if position > len(data) or number == 0:
            raise _WireError(f"field {number} runs past the end of the message")
        fields.setdefault(number, []).append(value)
    return fields


def _last(fields: dict[int, list[Any]], number: int, default: Any) -> Any:
    """The last value of a field; its wire type must match the default's (bytes, else a number)."""
    values = fields.get(number)
    if not values:
        return default
    if isinstance(values[-1], bytes) != isinstance(default, bytes):
        raise _WireError(f"field {number} has the wrong wire type")
    return values[-1]


# --------------------------------------------------------------------------- bundle entries


@dataclasses.dataclass(frozen=True)
class BundleEntry:
    """One BundleEntryProto: where a tensor lives in the data shards."""

    dtype: int  # TensorFlow DataType enum value
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int  # masked, as stored
    slices: tuple[tuple[tuple[int, int | None], ...], ...]  # per slice, per dim (start, length or None = all)

    @property
    def dtype_name(self) -> str:
        return _NUMPY_DTYPES.get(self.dtype) or _OTHER_DTYPES.get(self.dtype, f"dtype_{self.dtype}")


def _decode_shape(data: bytes) -> tuple[int, ...]:
    fields = _fields(data)
    if _last(fields, 3, 0):
        raise _WireError("the shape has unknown rank")
    return tuple(_signed(_last(_fields(dim), 1, 0)) for dim in fields.get(2, []))


def _decode_entry(data: bytes) -> BundleEntry:
    fields = _fields(data)
    slices = []
    for slice_bytes in fields.get(7, []):
        extents = []
        for extent in _fields(slice_bytes).get(1, []):
            extent_fields = _fields(extent)
            length = _last(extent_fields, 2, None)
            extents.append((_signed(_last(extent_fields, 1, 0)), None if length is None else _signed(length)))
        slices.append(tuple(extents))
    return BundleEntry(
        dtype=_last(fields, 1, 0), shape=_decode_shape(_last(fields, 2, b"")), shard_id=_last(fields, 3, 0),
        offset=_signed(_last(fields, 4, 0)), size=_signed(_last(fields, 5, 0)), crc32c=_last(fields, 6, 0),
        slices=tuple(slices),
    )


def _check_entry(index_path: str, key: bytes, entry: BundleEntry) -> None:
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
            problems.append(f"slice '{_slice_spec(extents)}' does not fit shape {list(entry.shape)}")
            break
    if problems:
        name = key.decode("utf-8", "backslashreplace")
        raise WeightSourceError(f"{index_path}: the entry of {name!r} is corrupt: {'; '.join(problems)}.")


# --------------------------------------------------------------------------- the .index SSTable


def _read_block(data: bytes, path: str, offset: int, size: int, kind: str) -> bytes:
    end = offset + size + _TRAILER_SIZE
    if offset < 0 or end > len(data) - _FOOTER_SIZE:
        raise WeightSourceError(
            f"{path}: the {kind} at offset {offset} ({size} bytes plus a 5-byte trailer) runs past the end of the "
            f"table ({len(data)} bytes); the .index file is truncated or corrupt."
        )
    block = data[offset:offset + size]
    block_type = data[offset + size]
    stored = _UINT32.unpack_from(data, offset + size + 1)[0]
    if masked_crc32c(block + bytes([block_type])) != stored:
        raise WeightSourceError(
            f"{path}: CRC32C mismatch in the {kind} at offset {offset} ({size} bytes); the .index file is "
            "corrupt. Restore it from a backup or re-save the checkpoint."
        )
    if block_type == 0:
        return block
    if block_type == 1:
        return _snappy_decompress(block, path, offset)
    raise WeightSourceError(f"{path}: the {kind} at offset {offset} has unknown compression type {block_type}.")


def _snappy_decompress(block: bytes, path: str, offset: int) -> bytes:
    """Raw snappy (no framing), as old TF index blocks of type 1 use; small blocks, so plain Python suffices."""
    try:
        expected, position = _varint(block, 0)
        if expected > _SNAPPY_MAX_RATIO * len(block):
            raise _WireError(f"it declares {expected} bytes, more than {len(block)} snappy bytes can hold")
        out = bytearray()
        while position < len(block):
            tag = block[position]
            position += 1
            kind = tag & 3
            if kind == 0:
                length = tag >> 2
                if length >= 60:
                    width = length - 59
                    length = int.from_bytes(block[position:position + width], "little")
                    position += width
                length += 1
                if position + length > len(block) or len(out) + length > expected:
                    raise _WireError("a literal runs past the end of the block or of the declared size")
                out += block[position:position + length]
                position += length
                continue
            if kind == 1:
                length, distance = ((tag >> 2) & 7) + 4, ((tag >> 5) << 8) | block[position]
                position += 1
            else:
                width = 2 if kind == 2 else 4
                length, distance = (tag >> 2) + 1, int.from_bytes(block[position:position + width], "little")
                position += width
            if not 0 < distance <= len(out):
                raise _WireError(f"a copy reaches {distance} bytes back, before the start")
            if len(out) + length > expected:
                raise _WireError(f"decompresses past the declared {expected} bytes")
            if length <= distance:
                start = len(out) - distance
                out += out[start:start + length]
            else:
                for _ in range(length):  # byte by byte: the copy overlaps its own output
                    out.append(out[-distance])
        if len(out) != expected:
            raise _WireError(f"decompressed to {len(out)} bytes, expected {expected}")
    except (_WireError, IndexError) as error:
        raise WeightSourceError(
            f"{path}: the snappy-compressed block at offset {offset} is corrupt: {error}."
        ) from None
    return bytes(out)


def _block_entries(block: bytes, path: str, offset: int) -> Iterator[tuple[bytes, bytes]]:
    where = f"{path}: the block at offset {offset}"
    if len(block) < 4:
        raise WeightSourceError(f"{where} has {len(block)} bytes, too few for its restart count; corrupt .index.")
    restarts = _UINT32.unpack_from(block, len(block) - 4)[0]
    limit = len(block) - 4 - 4 * restarts
    if restarts < 1 or limit < 0:
        raise WeightSourceError(f"{where} declares {restarts} restart points, impossible for {len(block)} bytes.")
    key = b""
    position = 0
    try:
        while position < limit:
            shared, position = _varint(block, position)
            unshared, position = _varint(block, position)
            value_length, position = _varint(block, position)
            end = position + unshared + value_length
            if shared > len(key) or end > limit:
                raise _WireError(f"an entry at block byte {position} overruns its block or shared key")
            key = key[:shared] + block[position:position + unshared]
            yield key, block[position + unshared:end]
            position = end
    except _WireError as error:
        raise WeightSourceError(f"{where} is corrupt: {error}.") from None


def _read_table(path: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of an SSTable, in key order, with each block's CRC checked."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise WeightSourceError(f"{path}: cannot read the checkpoint index: {error}.") from error
    if len(data) < _FOOTER_SIZE:
        raise WeightSourceError(
            f"{path}: {len(data)} bytes, shorter than the 48-byte table footer; the .index file is truncated."
        )
    footer = data[-_FOOTER_SIZE:]
    if int.from_bytes(footer[40:], "little") != _TABLE_MAGIC:
        raise WeightSourceError(
            f"{path}: not an sstable (bad magic number in the footer at offset {len(data) - _FOOTER_SIZE}); "
            "the .index file is truncated, corrupt, or not a TensorFlow checkpoint index."
        )
    try:
        position = _varint(footer, _varint(footer, 0)[1])[1]  # skip the metaindex handle
        index_offset, position = _varint(footer, position)
        index_size, _ = _varint(footer, position)
    except _WireError as error:
        raise WeightSourceError(f"{path}: corrupt table footer: {error}.") from None
    index = _read_block(data, path, index_offset, index_size, "index block")
    entries: list[tuple[bytes, bytes]] = []
    for _, handle_bytes in _block_entries(index, path, index_offset):
        try:
            block_offset, position = _varint(handle_bytes, 0)
            block_size, _ = _varint(handle_bytes, position)
        except _WireError as error:
            raise WeightSourceError(f"{path}: corrupt block handle in the index block: {error}.") from None
        block = _read_block(data, path, block_offset, block_size, "data block")
        entries.extend(_block_entries(block, path, block_offset))
    return entries


# --------------------------------------------------------------------------- locating checkpoints


def read_checkpoint_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a `checkpoint` file (CheckpointState in protobuf text format) into a dict.

    Keys: `model_checkpoint_path` (str), `all_model_checkpoint_paths` (list),
    `all_model_checkpoint_timestamps` (list of float), `last_preserved_timestamp`.
    """
    path = os.fspath(path)
    state: dict[str, Any] = {"model_checkpoint_path": "", "all_model_checkpoint_paths": [],
                             "all_model_checkpoint_timestamps": [], "last_preserved_timestamp": None}
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read(_MAX_STATE_FILE + 1).splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise WeightSourceError(f"{path}: cannot read the checkpoint state file: {error}.") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"(\w+)\s*:\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|\S+)", line)
        if not match:
            raise WeightSourceError(f"{path}, line {number}: expected 'field: value', found {line!r}.")
        field, raw = match.groups()
        try:
            if raw[0] in "\"'":
                value: Any = codecs.escape_decode(raw[1:-1].encode("utf-8"))[0].decode("utf-8")
            else:
                value = float(raw)
        except ValueError as error:  # UnicodeDecodeError included
            raise WeightSourceError(f"{path}, line {number}: invalid value for {field}: {error}.") from None
        if isinstance(state.get(field), list):
            state[field].append(value)
        elif field in state:
            state[field] = value
    return state


def locate_checkpoint(path: str | os.PathLike[str]) -> str:
    """The checkpoint prefix for a prefix, a `.index`/`.data-*` path, or a directory with a `checkpoint` file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        state_path = os.path.join(path, "checkpoint")
        if not os.path.isfile(state_path):
            indexes = sorted(name for name in os.listdir(path) if name.endswith(".index"))
            hint = f" It holds {', '.join(indexes[:5])}: pass one of those prefixes instead." if indexes else ""
            raise WeightSourceError(
                f"{path}: a directory without a 'checkpoint' file, so no latest TensorFlow checkpoint is "
                f"recorded there.{hint} Pass a checkpoint prefix such as '{os.path.join(path, 'model.ckpt-100')}'."
            )
        latest = read_checkpoint_state(state_path)["model_checkpoint_path"]
        if not latest:
            raise WeightSourceError(f"{state_path}: invalid checkpoint state: model_checkpoint_path is empty.")
        prefix = latest if os.path.isabs(latest) else os.path.join(path, latest)
        if not os.path.exists(prefix + ".index") and os.path.exists(os.path.join(path, os.path.basename(latest))
                                                                    + ".index"):
            # Saver records absolute paths; a moved model_dir still holds the files next to its checkpoint file.
            logger.info("%s names %s, which is absent; using the file of that name in %s", state_path, latest, path)
            prefix = os.path.join(path, os.path.basename(latest))
    elif path.endswith(".index"):
        prefix = path[: -len(".index")]
    elif _DATA_SUFFIX.search(path):
        prefix = _DATA_SUFFIX.sub("", path)
    else:
        prefix = path
    if not os.path.isfile(prefix + ".index"):
        raise WeightSourceError(
            f"{prefix}.index: no such file; expected a TensorFlow checkpoint prefix (e.g. 'dir/model.ckpt-100' "
            f"with 'dir/model.ckpt-100.index' next to it), its .index file, or a directory with a 'checkpoint' "
            f"file; received {path!r}."
        )
    return prefix


def is_tensorflow(path: str | os.PathLike[str]) -> bool:
    """Cheap detection: `path` locates a checkpoint whose `.index` ends with the table magic number.

    A directory counts only when its `checkpoint` file is a CheckpointState
    naming an existing checkpoint (torchestimator's own manifest is also
    called `checkpoint`).
    """
    try:
        prefix = locate_checkpoint(path)
        with open(prefix + ".index", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() < _FOOTER_SIZE:
                return False
            handle.seek(-8, os.SEEK_END)
            return int.from_bytes(handle.read(8), "little") == _TABLE_MAGIC
    except (OSError, ValueError, UnicodeDecodeError):
        return False


def open_tensorflow(path: str | os.PathLike[str]) -> TensorFlowCheckpoint:
    """Open a TensorFlow checkpoint (tensor bundle V2) for reading; see `locate_checkpoint` for `path`."""
    return TensorFlowCheckpoint(path)


# --------------------------------------------------------------------------- slices


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


def _slice_keys(name: str, shape: tuple[int, ...], extents: tuple[tuple[int, int | None], ...]) -> list[bytes]:
    """Candidate keys of one slice (EncodeTensorNameSlice); a full extent may be stored as -1 or as the size."""
    escaped = name.encode("utf-8").replace(b"\xff", b"\xff\x00").replace(b"\x00", b"\x00\xff")
    head = b"\x00" + escaped + b"\x00\x01" + _ordered_unsigned(len(extents))
    keys = [head]
    for dim, (start, length) in enumerate(extents):
        lengths = [length] if length is not None else [-1, shape[dim] - start]
        keys = [key + _ordered_signed(start) + _ordered_signed(option) for key in keys for option in lengths]
    return keys


def _slice_index(shape: tuple[int, ...], extents: tuple[tuple[int, int | None], ...]) -> tuple[slice, ...]:
    return tuple(slice(start, shape[dim] if length in (None, -1) else start + length)
                 for dim, (start, length) in enumerate(extents))


def _slice_spec(extents: tuple[tuple[int, int | None], ...]) -> str:
    return ":".join("-" if length in (None, -1) else f"{start},{length}" for start, length in extents)


# --------------------------------------------------------------------------- the reader


class TensorFlowCheckpoint(WeightSource):
    """A TensorFlow checkpoint read without TensorFlow; names are the raw checkpoint keys."""

    format = "tensorflow"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.prefix = locate_checkpoint(self.path)
        self.index_path = self.prefix + ".index"
        self._files: dict[int, BinaryIO] = {}
        self._graph: list[Any] | None = None
        self._entries: dict[str, BundleEntry] = {}
        self._slice_entries: dict[bytes, BundleEntry] = {}
        self._load_index()

    # ----------------------------------------------------------------- index

    def _load_index(self) -> None:
        table = _read_table(self.index_path)
        if not table or table[0][0] != b"":
            raise WeightSourceError(
                f"{self.index_path}: the table has no header entry (key ''); it is not a tensor bundle index."
            )
        self._load_header(table[0][1])
        for key, value in table[1:]:
            try:
                entry = _decode_entry(value)
            except _WireError as error:
                raise WeightSourceError(
                    f"{self.index_path}: cannot decode the entry of {key!r}: {error}; the .index is corrupt."
                ) from None
            _check_entry(self.index_path, key, entry)
            if key.startswith(b"\x00"):
                self._slice_entries[key] = entry
            else:
                self._entries[key.decode("utf-8", "backslashreplace")] = entry
        # Lazily, and at most 5: a corrupt header may declare billions of shards.
        absent = (self.shard_path(shard) for shard in range(self.num_shards)
                  if not os.path.isfile(self.shard_path(shard)))
        missing = list(itertools.islice(absent, 5))
        if missing:
            raise WeightSourceError(
                f"{self.prefix}: missing data shard file(s) {', '.join(missing)}; a checkpoint needs its .index "
                f"and all {self.num_shards} .data shard(s). Copy the whole checkpoint, not just the .index."
            )

    def _load_header(self, value: bytes) -> None:
        try:
            fields = _fields(value)
            version = _fields(_last(fields, 3, b""))
            self.num_shards = _signed(_last(fields, 1, 0))
            self.big_endian = _last(fields, 2, 0) == 1
            producer, min_consumer = _last(version, 1, 0), _last(version, 2, 0)
        except _WireError as error:
            raise WeightSourceError(f"{self.index_path}: unable to parse the bundle header: {error}.") from None
        if not 0 <= self.num_shards < 1 << 31:
            raise WeightSourceError(f"{self.index_path}: the bundle header declares {self.num_shards} data shards.")
        if min_consumer > 1 or 1 in version.get(3, []):
            raise WeightSourceError(
                f"{self.index_path}: written by a newer tensor bundle version (producer {producer}, min consumer "
                f"{min_consumer}); this reader understands version 1."
            )

    def shard_path(self, shard_id: int) -> str:
        """The file name of one data shard."""
        return f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}"

    def entry(self, name: str) -> BundleEntry:
        """The BundleEntryProto of one tensor (location, size, CRC, slices)."""
        if name not in self._entries:
            raise missing_tensor_error(self.prefix, name, self._entries)
        return self._entries[name]

    def tensors(self) -> list[TensorInfo]:
        return [TensorInfo(name=name, shape=entry.shape, dtype=entry.dtype_name)
                for name, entry in sorted(self._entries.items())]

    # ----------------------------------------------------------------- values

    def read(self, name: str) -> np.ndarray:
        entry = self.entry(name)
        if entry.slices:
            return self._read_sliced(name, entry)
        return self._read_entry(name, entry)

    def _read_sliced(self, name: str, entry: BundleEntry) -> np.ndarray:
        dtype = object if entry.dtype == _STRING else self._numpy_dtype(name, entry)
        # Before allocating the whole: its slices are stored in the shards, so it cannot be bigger than them.
        # (A string takes at least one byte, its length.)
        needed = math.prod(entry.shape) * (1 if entry.dtype == _STRING else self._stored_itemsize(entry, dtype))
        available = sum(self._shard_size(shard) for shard in range(self.num_shards))
        if needed > available:
            raise WeightSourceError(
                f"{self.index_path}: partitioned variable {name!r} declares shape {list(entry.shape)} "
                f"({needed} bytes), more than its {self.num_shards} data shard(s) hold ({available} bytes); "
                "the .index is corrupt."
            )
        for extents in entry.slices:
            if any(start + (0 if length in (None, -1) else length) > dim
                   for (start, length), dim in zip(extents, entry.shape)):
                raise WeightSourceError(
                    f"{self.index_path}: slice '{_slice_spec(extents)}' of {name!r} reaches past its shape "
                    f"{list(entry.shape)}; the .index is corrupt."
                )
        result = np.zeros(entry.shape, dtype=dtype)
        covered = 0
        for extents in entry.slices:
            spec = _slice_spec(extents)
            found = [key for key in _slice_keys(name, entry.shape, extents) if key in self._slice_entries]
            if len(extents) != len(entry.shape) or not found:
                raise WeightSourceError(
                    f"{self.index_path}: partitioned variable {name!r} lists slice '{spec}' of shape "
                    f"{list(entry.shape)}, but no entry for that slice is in the index; cannot assemble it."
                )
            part = self._read_entry(f"{name} (slice {spec})", self._slice_entries[found[0]])
            index = _slice_index(entry.shape, extents)
            if result[index].shape != part.shape:
                raise WeightSourceError(
                    f"{self.index_path}: slice '{spec}' of {name!r} holds shape {list(part.shape)}, expected "
                    f"{list(result[index].shape)}."
                )
            result[index] = part
            covered += part.size
        if covered != result.size:
            raise WeightSourceError(
                f"{self.index_path}: the slices of partitioned variable {name!r} cover {covered} of "
                f"{result.size} values (overlapping or partial slices are not supported)."
            )
        return result

    def _numpy_dtype(self, name: str, entry: BundleEntry) -> np.dtype:
        if entry.dtype == _BFLOAT16:
            return np.dtype(np.float32)
        if entry.dtype not in _NUMPY_DTYPES:
            raise WeightSourceError(
                f"{self.prefix}: variable {name!r} has dtype {entry.dtype_name} (DataType {entry.dtype}), which "
                "this reader cannot convert to numpy; skip it (e.g. exclude it from the warm-start selection)."
            )
        return np.dtype(_NUMPY_DTYPES[entry.dtype])

    @staticmethod
    def _stored_itemsize(entry: BundleEntry, dtype: np.dtype) -> int:
        return 2 if entry.dtype == _BFLOAT16 else dtype.itemsize

    def _read_entry(self, name: str, entry: BundleEntry) -> np.ndarray:
        count = math.prod(entry.shape)
        if entry.dtype == _STRING and count > entry.size:
            raise WeightSourceError(
                f"{self.index_path}: invalid size in bundle entry of {name!r}: {count} strings cannot fit in "
                f"{entry.size} bytes (each needs at least its length byte)."
            )
        if entry.dtype != _STRING:
            dtype = self._numpy_dtype(name, entry)
            itemsize = self._stored_itemsize(entry, dtype)
            if entry.size != count * itemsize:
                raise WeightSourceError(
                    f"{self.index_path}: invalid size in bundle entry of {name!r}: stored size {entry.size}, "
                    f"expected {count * itemsize} for shape {list(entry.shape)} of {entry.dtype_name}."
                )
        raw = self._read_bytes(name, entry)
        if entry.dtype == _STRING:
            return self._decode_strings(name, entry, raw, count)
        self._check_crc(name, entry, raw)
        order = ">" if self.big_endian else "<"
        if entry.dtype == _BFLOAT16:
            bits = np.frombuffer(raw, dtype=order + "u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(entry.shape)
        stored = np.frombuffer(raw, dtype=dtype.newbyteorder(order) if dtype.itemsize > 1 else dtype)
        if dtype == np.bool_:
            stored = np.frombuffer(raw, dtype=np.uint8) != 0
        return stored.astype(dtype.newbyteorder("="), copy=True).reshape(entry.shape)

    def _read_bytes(self, name: str, entry: BundleEntry) -> bytes:
        if not 0 <= entry.shard_id < max(self.num_shards, 1):
            raise WeightSourceError(
                f"{self.index_path}: variable {name!r} names shard {entry.shard_id}, but the header declares "
                f"{self.num_shards} shard(s); the .index is corrupt."
            )
        path = self.shard_path(entry.shard_id)
        end = entry.offset + entry.size
        try:
            handle = self._shard(entry.shard_id)
            real_size = os.fstat(handle.fileno()).st_size
            if end > real_size:  # checked before reading: a corrupt size must not become an allocation
                raise WeightSourceError(
                    f"{path}: variable {name!r} needs bytes {entry.offset}..{end}, but the file has {real_size} "
                    "bytes; the data shard is truncated or the .index is corrupt."
                )
            handle.seek(entry.offset)
            raw = handle.read(entry.size)
        except OSError as error:
            raise WeightSourceError(f"{path}: cannot read variable {name!r}: {error}.") from error
        if len(raw) != entry.size:
            raise WeightSourceError(
                f"{path}: variable {name!r} needs bytes {entry.offset}..{entry.offset + entry.size}, but the "
                f"file ends at {entry.offset + len(raw)}; the data shard is truncated."
            )
        return raw

    def _shard(self, shard_id: int) -> BinaryIO:
        handle = self._files.get(shard_id)
        if handle is None:
            handle = self._files[shard_id] = open(self.shard_path(shard_id), "rb")  # noqa: SIM115 - until close()
        return handle

    def _shard_size(self, shard_id: int) -> int:
        try:
            return os.fstat(self._shard(shard_id).fileno()).st_size
        except OSError as error:
            raise WeightSourceError(f"{self.shard_path(shard_id)}: cannot read the data shard: {error}.") from error

    def _check_crc(self, name: str, entry: BundleEntry, checked: bytes) -> None:
        if masked_crc32c(checked) != entry.crc32c:
            raise WeightSourceError(
                f"{self.shard_path(entry.shard_id)}: checksum mismatch for variable {name!r} at offset "
                f"{entry.offset} ({entry.size} bytes): the data shard is corrupt (or does not belong to this .index)."
            )

    def _decode_strings(self, name: str, entry: BundleEntry, raw: bytes, count: int) -> np.ndarray:
        lengths = []
        position = 0
        try:
            for _ in range(count):
                length, position = _varint(raw, position)
                lengths.append(length)
        except _WireError:
            raise WeightSourceError(
                f"{self.shard_path(entry.shard_id)}: the string lengths of {name!r} at offset {entry.offset} run "
                "past the entry; the data shard is corrupt."
            ) from None
        packed = b"".join(struct.pack("<I" if length <= 0xFFFFFFFF else "<Q", length) for length in lengths)
        stored_checksum = raw[position:position + 4]
        body = raw[position + 4:]
        if (len(stored_checksum) != 4 or _UINT32.unpack(stored_checksum)[0] != masked_crc32c(packed)
                or len(body) != sum(lengths)):
            self._check_crc(name, entry, packed + stored_checksum + body)
            raise WeightSourceError(
                f"{self.shard_path(entry.shard_id)}: the string lengths of {name!r} at offset {entry.offset} do "
                "not match their length checksum or the entry size; the data shard is corrupt."
            )
        self._check_crc(name, entry, packed + stored_checksum + body)
        values = np.empty(count, dtype=object)
        start = 0
        for index, length in enumerate(lengths):
            values[index] = body[start:start + length]
            start += length
        return values.reshape(entry.shape)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    # ----------------------------------------------------------------- TF2 object graph

    def _object_graph(self) -> list[Any]:
        """Nodes of `_CHECKPOINTABLE_OBJECT_GRAPH` as (children, attributes, slot variables); [] for TF1."""
        if self._graph is None:
            self._graph = []
            if OBJECT_GRAPH_KEY in self._entries:
                entry = self._entries[OBJECT_GRAPH_KEY]
                if entry.dtype != _STRING or math.prod(entry.shape) != 1:
                    raise WeightSourceError(
                        f"{self.index_path}: {OBJECT_GRAPH_KEY} is {entry.dtype_name} of shape {list(entry.shape)}, "
                        "not one serialized string; the .index is corrupt."
                    )
                serialized = self.read(OBJECT_GRAPH_KEY).reshape(()).item()
                try:
                    graph = [_decode_node(node) for node in _fields(serialized).get(1, [])]
                    _check_node_ids(graph)
                except (_WireError, UnicodeDecodeError) as error:
                    raise WeightSourceError(
                        f"{self.prefix}: cannot decode {OBJECT_GRAPH_KEY}: {error}."
                    ) from None
                self._graph = graph
        return self._graph

    def object_paths(self) -> dict[str, str]:
        """Every object path from the root to a saved value, mapped to its checkpoint key.

        E.g. `model/layer_with_weights-0/kernel` -> `model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE`.
        A value reachable along several paths (Keras 3 saves a layer's kernel
        once, under `optimizer/_trainable_variables/0`, yet the model reaches it
        too) appears under each path. Optimizer slots appear as
        `<variable path>/.OPTIMIZER_SLOT/<optimizer path>/<slot name>`. Empty for
        TF1 checkpoints (no object graph): use the raw names there.
        """
        nodes = self._object_graph()
        if not nodes:
            return {}
        node_paths = _all_paths(nodes, self.prefix)
        result: dict[str, str] = {}
        for node_id, paths in node_paths.items():
            for attribute_name, key in nodes[node_id][1]:
                suffix = "" if attribute_name == "VARIABLE_VALUE" else f"/.ATTRIBUTES/{attribute_name}"
                for path in paths:
                    result[path + suffix] = key
        for optimizer_id, (_, _, slots) in enumerate(nodes):
            optimizer_path = min(node_paths.get(optimizer_id, [""]), key=lambda p: (p.count("/"), p))
            for variable_id, slot_name, slot_id in slots:
                slot_keys = [key for attribute, key in nodes[slot_id][1] if attribute == "VARIABLE_VALUE"]
                for path in node_paths.get(variable_id, []) if slot_keys else []:
                    result[f"{path}/.OPTIMIZER_SLOT/{optimizer_path}/{slot_name}"] = slot_keys[0]
        return dict(sorted(result.items()))

    def optimizer_slots(self) -> dict[str, dict[str, str]]:
        """Checkpoint key of each variable -> {slot name: checkpoint key of the slot}.

        From the object graph's slot_variables (TF2), Keras 3 optimizers' parallel
        lists (`_momentums/i`, `_velocities/i` belong to `_trainable_variables/i`,
        slot names without the underscore), or `<var>/<Slot>` names (TF1).
        """
        nodes = self._object_graph()
        slots: dict[str, dict[str, str]] = {}
        if nodes:
            for _, _, node_slots in nodes:
                for variable_id, slot_name, slot_id in node_slots:
                    variable_keys = [key for name, key in nodes[variable_id][1] if name == "VARIABLE_VALUE"]
                    slot_keys = [key for name, key in nodes[slot_id][1] if name == "VARIABLE_VALUE"]
                    if variable_keys and slot_keys:
                        slots.setdefault(variable_keys[0], {})[slot_name] = slot_keys[0]
            for variable_key, slot_name, slot_key in _keras3_slots(nodes):
                slots.setdefault(variable_key, {})[slot_name] = slot_key
            return slots
        for name in self._entries:
            match = _TF1_SLOT.search(name)
            if match and name[:match.start()] in self._entries:
                slots.setdefault(name[:match.start()], {})[name[match.start() + 1:]] = name
        return slots

    def model_variables(self) -> dict[str, str]:
        """Model variables only (no optimizer slots, optimizer scalars, step counters): name -> checkpoint key.

        TF1: each name maps to itself. TF2: the shortest object path outside
        the optimizer and `save_counter` (e.g. `model/_functional/_operations/1/_kernel`
        or `model/layer_with_weights-0/kernel`) maps to its checkpoint key, so
        Keras 3 weights saved under `optimizer/_trainable_variables/N` are found.
        """
        if not self._object_graph():
            return {name: name for name in sorted(self._entries) if not is_optimizer_variable(name)}
        slot_keys = {key for slots in self.optimizer_slots().values() for key in slots.values()}
        best: dict[str, str] = {}
        for path, key in self.object_paths().items():
            if key in slot_keys or "/.ATTRIBUTES/" in path or _TF2_OPTIMIZER.search(path + "/"):
                continue
            if key not in best or (path.count("/"), path) < (best[key].count("/"), best[key]):
                best[key] = path
        return {path: key for key, path in sorted(best.items(), key=lambda item: item[1])}


_MAX_PATHS = 100_000
_MAX_STATE_FILE = 16 << 20  # a `checkpoint` text file lists a few paths; anything this long is not one


def _decode_node(data: bytes) -> tuple[list[tuple[int, str]], list[tuple[str, str]], list[tuple[int, str, int]]]:
    fields = _fields(data)
    children = []
    for child in fields.get(1, []):
        child_fields = _fields(child)
        children.append((_last(child_fields, 1, 0), _last(child_fields, 2, b"").decode("utf-8")))
    attributes = []
    for attribute in fields.get(2, []):
        attribute_fields = _fields(attribute)
        attributes.append((_last(attribute_fields, 1, b"").decode("utf-8"),
                           _last(attribute_fields, 3, b"").decode("utf-8")))
    slots = []
    for slot in fields.get(3, []):
        slot_fields = _fields(slot)
        slots.append((_last(slot_fields, 1, 0), _last(slot_fields, 2, b"").decode("utf-8"), _last(slot_fields, 3, 0)))
    return children, attributes, slots


def _check_node_ids(nodes: list[Any]) -> None:
    """Every node a child or slot reference names exists (a corrupt graph must fail here, not as an IndexError)."""
    for children, _, slots in nodes:
        ids = [child for child, _ in children] + [ref for variable, _, slot in slots for ref in (variable, slot)]
        bad = [node_id for node_id in ids if not 0 <= node_id < len(nodes)]
        if bad:
            raise _WireError(f"a reference to node {bad[0]}, but the graph has {len(nodes)} nodes")


def _value_key(node: Any) -> str | None:
    keys = [key for name, key in node[1] if name == "VARIABLE_VALUE"]
    return keys[0] if keys else None


def _keras3_slots(nodes: list[Any]) -> Iterator[tuple[str, str, str]]:
    """(variable key, slot name, slot key) from Keras 3 optimizers' index-aligned slot lists."""
    for children, _, _ in nodes:
        lists = {name: dict(
            (local, child) for child, local in nodes[node_id][0] if local.isdigit()
        ) for node_id, name in children if 0 <= node_id < len(nodes)}
        trainable = lists.get("_trainable_variables")
        if not trainable:
            continue
        for list_name, members in lists.items():
            if list_name in ("_trainable_variables", "_variables") or not members:
                continue
            for index, slot_id in members.items():
                variable_id = trainable.get(index)
                if variable_id is None:
                    continue
                variable_key, slot_key = _value_key(nodes[variable_id]), _value_key(nodes[slot_id])
                if variable_key and slot_key:
                    yield variable_key, list_name.lstrip("_"), slot_key


def _all_paths(nodes: list[Any], prefix: str) -> dict[int, list[str]]:
    """Every cycle-free path of local names from the root (node 0) to each node."""
    paths: dict[int, list[str]] = {}
    stack: list[tuple[int, str, frozenset[int]]] = [(0, "", frozenset([0]))]
    count = 0
    while stack:
        node_id, path, seen = stack.pop()
        for child_id, local_name in nodes[node_id][0]:
            if child_id in seen or not 0 <= child_id < len(nodes):
                continue
            child_path = f"{path}/{local_name}" if path else local_name
            paths.setdefault(child_id, []).append(child_path)
            count += 1
            if count > _MAX_PATHS:
                logger.warning("%s: object graph has over %d paths; listing the first ones only", prefix, _MAX_PATHS)
                return paths
            stack.append((child_id, child_path, seen | {child_id}))
    return paths
