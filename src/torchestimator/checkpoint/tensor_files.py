"""safetensors files streamed: written from the tensors' own memory, read into fresh tensors, hashed on the way.

Writing: ``encode_tensors`` gives the file as a header plus zero-copy views of
each tensor's bytes (``EncodedFile``), so a save never builds the file in
memory; the store hashes the views while the storage writes them.

Reading: ``read_tensors`` maps a local file into memory copy-on-write (as
``safetensors.torch.load_file`` and ``torch.load(mmap=True)`` do), checks the
whole file's checksum over the mapping, and gives tensors that are views of it:
no copy is made, pages come from the page cache, and writing to a tensor copies
only the page written (the file never changes). Whoever keeps the tensors for
long (an optimizer's state) copies them (``parts.restore_shared``): a mapping
keeps a deleted checkpoint's disk space until it is released. A stream that
cannot be mapped (in-memory storage, a file system without mmap) is read
piece by piece into new tensors with ``readinto`` (one copy, as ``torch.load``
makes), hashing each piece while the next is read. Either way the tensors are
given only once the whole file's checksum matches. A file whose layout this
reader does not follow (another tool's, or a damaged header) is read whole and
handed to the safetensors library after its checksum, as before.

The bytes are those of ``safetensors.torch.save`` up to the header's key order
(see ``encode_tensors``): other tools read them.
"""

from __future__ import annotations

import io
import json
import math
import mmap
import struct
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import safetensors.torch
import torch

from .errors import CheckpointError
from .hashing import OverlappedChecksums, checksum_of
from .storage import ReadStream

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "EncodedFile",
    "bytes_to_tensors",
    "encode_tensors",
    "is_file_mapped",
    "read_tensors",
    "tensors_to_bytes",
]

# safetensors dtype codes and the torch dtypes they name (interop lists a file's tensors with these names).
DTYPE_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
    "C128": "complex128",
}
# hasattr because older torch builds lack some float8 types.
DTYPES = {code: getattr(torch, name) for code, name in DTYPE_NAMES.items() if hasattr(torch, name)}
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
        header[name] = {
            "dtype": DTYPE_CODES[value.dtype],
            "shape": list(value.shape),
            "data_offsets": [offset, offset + view.nbytes],
        }
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
    return tensor.reshape(-1).view(torch.uint8).numpy().data.cast("B")


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


def read_tensors(
    stream: ReadStream, where: str, *, size: int, expected: tuple[str, Any] | None
) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file open in ``stream`` (at its start), ``size`` bytes long (checked by
    the caller), checked while reading against ``expected`` ("crc32c", "crc32" or "sha256", its value) unless None."""
    mapping = _mapped(stream, size)
    if mapping is not None:
        tensors = _read_mapped(mapping, where, size, expected)
        if tensors is not None:
            return tensors
    stream.seek(0)
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


def _mapped(stream: ReadStream, size: int) -> mmap.mmap | None:
    """A private (copy-on-write) mapping of the file open in ``stream``, or None when it has no file
    descriptor or cannot be mapped."""
    fileno = getattr(stream, "fileno", None)  # not every store's stream has one
    if fileno is None:
        return None
    try:
        descriptor: int = fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    if size == 0:
        return None  # mmap refuses empty files; the streamed path says what is wrong with one
    try:
        mapping = mmap.mmap(descriptor, size, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None
    if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
        mapping.madvise(mmap.MADV_WILLNEED)  # a file not in the page cache is read ahead, not page by page
    return mapping


# The mappings whose views read_tensors gave and that are still alive (a view keeps its mapping), with the
# address range of each: what tells a tensor backed by a checkpoint file from one in torch's own memory.
_live_mappings: weakref.WeakKeyDictionary[mmap.mmap, tuple[int, int]] = weakref.WeakKeyDictionary()
_live_mappings_lock = threading.Lock()


def is_file_mapped(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a view of a checkpoint file mapped by ``read_tensors`` (still alive)."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return False
    address = tensor.data_ptr()
    with _live_mappings_lock:
        ranges = list(_live_mappings.values())
    return any(start <= address < end for start, end in ranges)


def _read_mapped(
    mapping: mmap.mmap, where: str, size: int, expected: tuple[str, Any] | None
) -> dict[str, torch.Tensor] | None:
    """The tensors of a mapped file as views of the mapping, after the whole file's checksum; None when the
    layout is not ours (the streamed path handles it and words its errors)."""
    if size < 8:
        return None
    (header_size,) = struct.unpack_from("<Q", mapping, 0)
    data_start = 8 + header_size
    if data_start > min(size, 8 + MAX_HEADER_BYTES) or data_start % 8:
        return None
    layout = _layout(mapping[8:data_start], size - data_start)
    if layout is None:
        return None
    entries, order = layout
    if any((data_start + entry.start) % entry.dtype.itemsize for entry in entries):
        return None  # a tensor off its alignment: the copying path gives aligned memory
    if expected is not None:
        with memoryview(mapping) as whole:
            _check(expected, {expected[0]: checksum_of(expected[0], whole)}, where)
    start = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    with _live_mappings_lock:
        _live_mappings[mapping] = (start, start + size)
    tensors = {}
    for entry in entries:
        count = math.prod(entry.shape)
        if count == 0:
            tensors[entry.name] = torch.empty(entry.shape, dtype=entry.dtype)
        else:
            flat = torch.frombuffer(mapping, dtype=entry.dtype, count=count, offset=data_start + entry.start)
            tensors[entry.name] = flat.view(entry.shape)
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
    if math.prod(max(size, 1) for size in shape) * dtype.itemsize >= 2**63:
        raise ValueError(f"{name!r}: its shape {list(shape)} has strides no tensor can hold")  # even with a 0 in it
    return _Entry(name, dtype, shape, start, end)


def _read_exactly(stream: ReadStream, count: int, where: str, size: int) -> bytes:
    buffer = bytearray(count)
    _read_into(stream, memoryview(buffer), where, size)
    return bytes(buffer)


def _read_into(stream: ReadStream, view: memoryview, where: str, size: int) -> None:
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
