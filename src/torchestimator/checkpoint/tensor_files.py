"""safetensors files streamed: written from the tensors' own memory, read into fresh tensors, hashed on the way.

Writing: ``encode_tensors`` gives the file as a header plus zero-copy views of
each tensor's bytes (``EncodedFile``), so a save never builds the file in
memory; the store hashes the views while the storage writes them.

Reading: ``read_tensors`` reads the header, then each tensor straight into a
new tensor with ``readinto`` (one copy, disk to tensor, as ``torch.load``
makes), hashing each piece while the next is read. The tensors are used only
once the whole file's checksum matches. A file whose layout this reader does not
follow (another tool's, or a damaged header) is read whole and handed to the
safetensors library after its checksum, as before.

The bytes are those of ``safetensors.torch.save`` up to the header's key order
(see ``encode_tensors``): other tools read them.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import safetensors.torch
import torch

from .errors import CheckpointError
from .hashing import OverlappedChecksums

__all__ = ["EncodedFile", "encode_tensors", "tensors_to_bytes", "bytes_to_tensors", "read_tensors", "DTYPES"]

# safetensors dtype codes; getattr because older torch builds lack some float8 types.
DTYPES = {
    code: getattr(torch, name)
    for code, name in {
        "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
        "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
        "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
        "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
        "C64": "complex64", "C128": "complex128",
    }.items()
    if hasattr(torch, name)
}
DTYPE_CODES = {dtype: code for code, dtype in DTYPES.items()}
MAX_HEADER_BYTES = 100_000_000
# Large tensors go to the file and the hash in pieces, so hashing one piece overlaps writing or reading the next.
_PIECE_BYTES = 8 << 20


@dataclass(frozen=True)
class EncodedFile:
    """A file's bytes as buffers in order: the header, then views of the tensors' memory (nothing copied).

    The tensors must not change until the file is written: a save runs while the loop waits.
    """

    chunks: tuple[Any, ...]
    size: int

    def to_bytes(self) -> bytes:
        return b"".join(self.chunks)


def encode_tensors(tensors: Mapping[str, torch.Tensor], what: str) -> EncodedFile:
    """Dense tensors as a safetensors file, the same bytes for the same tensors in any process.

    The header lists ``__metadata__`` (format "pt" and the caller's order)
    first, then the tensors in data order: widest elements first, as
    safetensors does, so that every tensor stays aligned when memory-mapped.
    """
    prepared = {name: _prepared(name, tensor, what) for name, tensor in tensors.items()}
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "order": json.dumps(list(prepared))}}
    views, offset = [], 0
    for name in sorted(prepared, key=lambda name: -prepared[name].element_size()):  # stable: ties keep caller order
        value = prepared[name]
        view = _byte_view(value)
        header[name] = {"dtype": DTYPE_CODES[value.dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + view.nbytes]}
        views.extend(_pieces(view))
        offset += view.nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # the data starts 8-byte aligned, as safetensors pads it
    prefix = struct.pack("<Q", len(header_bytes)) + header_bytes
    return EncodedFile(chunks=(prefix, *views), size=len(prefix) + offset)


def tensors_to_bytes(tensors: Mapping[str, torch.Tensor], what: str) -> bytes:
    """``encode_tensors`` joined into one bytes object (small files: exports, warm-start output)."""
    return encode_tensors(tensors, what).to_bytes()


def _prepared(name: Any, tensor: Any, what: str) -> torch.Tensor:
    if not isinstance(name, str):
        raise TypeError(f"{what} keys must be str; received {name!r} ({type(name).__name__}).")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}[{name!r}] must be a torch.Tensor; received {type(tensor).__name__}.")
    if tensor.layout != torch.strided or tensor.is_meta:
        raise TypeError(
            f"{what}[{name!r}] is a {tensor.layout} tensor on {tensor.device}; only dense tensors with "
            "data can be saved. Convert it with .to_dense() or materialize it first."
        )
    if tensor.dtype not in DTYPE_CODES:
        raise TypeError(f"{what}[{name!r}] has dtype {tensor.dtype}, which safetensors cannot store.")
    return tensor.detach().to("cpu").contiguous()  # no copy for a contiguous CPU tensor


def _byte_view(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (a contiguous CPU tensor)."""
    if tensor.numel() == 0:
        return memoryview(b"")
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")


def _pieces(view: memoryview) -> list[memoryview]:
    return [view[start : start + _PIECE_BYTES] for start in range(0, view.nbytes, _PIECE_BYTES)]


def bytes_to_tensors(data: bytes, where: str) -> dict[str, torch.Tensor]:
    """Load safetensors bytes, in the order the tensors were saved."""
    try:
        tensors = safetensors.torch.load(data)
    except Exception as error:  # safetensors raises its own SafetensorError or OSError types
        raise CheckpointError(f"{where} is not a readable safetensors file: {error}") from None
    try:
        (header_size,) = struct.unpack("<Q", data[:8])
        order = json.loads(json.loads(data[8 : 8 + header_size])["__metadata__"]["order"])
    except (KeyError, TypeError, ValueError):
        return tensors  # written by another tool: no recorded order
    return _in_order(tensors, order)


def _in_order(tensors: dict[str, torch.Tensor], order: Any) -> dict[str, torch.Tensor]:
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(tensors):
        return tensors
    return {name: tensors[name] for name in order}


# ------------------------------------------------------------------ streamed, verified reading


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def read_tensors(stream: BinaryIO, where: str, *, size: int, expected: tuple[str, Any] | None
                 ) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file open in ``stream`` (at its start), ``size`` bytes long (checked by
    the caller), checked while reading against ``expected`` ("crc32c", "crc32" or "sha256", its value) unless None."""
    kinds = () if expected is None else (expected[0],)
    with OverlappedChecksums(kinds) as checksums:
        prefix = _read_exactly(stream, min(8, size), where, size)
        header_size = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
        layout = None
        if header_size is not None and 8 + header_size <= min(size, 8 + MAX_HEADER_BYTES):
            header_bytes = _read_exactly(stream, header_size, where, size)
            prefix += header_bytes
            layout = _layout(header_bytes, size - 8 - header_size)
        checksums.update(prefix)
        if layout is None:  # not our layout, or a damaged header: the safetensors library decides, after the check
            rest = _read_exactly(stream, size - len(prefix), where, size)
            checksums.update(rest)
            _check(expected, checksums.result(), where)
            return bytes_to_tensors(prefix + rest, where)
        entries, order = layout
        tensors = {}
        for entry in entries:
            tensor = torch.empty(entry.shape, dtype=entry.dtype)
            for piece in _pieces(_byte_view(tensor)):
                _read_into(stream, piece, where, size)
                if kinds:
                    checksums.update(piece)  # checked behind the reading of the next piece
            tensors[entry.name] = tensor
        _check(expected, checksums.result(), where)
    return _in_order(tensors, order)


def _layout(header_bytes: bytes, data_size: int) -> tuple[list[_Entry], Any] | None:
    """The tensors in data order when the header describes them back to back over exactly ``data_size`` bytes
    (what safetensors writes); None for anything else."""
    try:
        header = json.loads(header_bytes.decode("utf-8"))
        metadata = header.pop("__metadata__", None) or {}
        order = json.loads(metadata["order"]) if "order" in metadata else None
        entries = [_entry(name, value) for name, value in header.items()]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return None
    entries.sort(key=lambda entry: (entry.start, entry.end))
    position = 0
    for entry in entries:
        if entry.start != position:
            return None
        position = entry.end
    return (entries, order) if position == data_size else None


def _entry(name: str, value: Any) -> _Entry:
    dtype = DTYPES[value["dtype"]]
    shape = tuple(value["shape"])
    start, end = value["data_offsets"]
    if not all(type(item) is int and item >= 0 for item in (*shape, start, end)):
        raise ValueError(f"bad entry for {name!r}")
    if end - start != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{name!r}: offsets do not match its shape")
    return _Entry(name, dtype, shape, start, end)


def _read_exactly(stream: BinaryIO, count: int, where: str, size: int) -> bytes:
    buffer = bytearray(count)
    _read_into(stream, memoryview(buffer), where, size)
    return bytes(buffer)


def _read_into(stream: BinaryIO, view: memoryview, where: str, size: int) -> None:
    filled = 0
    while filled < view.nbytes:
        count = stream.readinto(view[filled:])
        if not count:
            raise CheckpointError(
                f"{where} ended early while being read (expected {size} bytes): it was truncated or overwritten."
            )
        filled += count


def _check(expected: tuple[str, Any] | None, computed: dict[str, Any], where: str) -> None:
    if expected is None:
        return
    kind, value = expected
    if computed[kind] != value:
        raise CheckpointError(
            f"{where} fails its checksum: {kind} is {computed[kind]}, state.json expects {value} (the file is corrupt)."
        )
