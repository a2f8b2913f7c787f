"""The `.index` file of a TensorFlow checkpoint: a LevelDB table (SSTable), read in pure Python.

What belongs here: the footer, the index block, the data blocks with their
prefix-compressed keys and restart points, the CRC32C block trailers, raw
snappy blocks (compression type 1, which old TensorFlow versions wrote), and
the base-128 varints these use. What does not: what the keys and values mean
(the bundle records, `_tf_bundle.py`; the reader, `tf_checkpoint.py`).

Why by hand: no library in the dependencies reads these bytes. They are
LevelDB's own format (table/format.cc, table/block.cc), not protocol buffers,
although its varints are encoded like protobuf's; python-snappy or cramjam
would decompress the snappy blocks, but would add a compiled dependency for
index blocks of a few kilobytes that TensorFlow has not written compressed
since 2016. The byte-level format is in formats.md section 3.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from torchestimator.data.tfrecord import masked_crc32c
from torchestimator.interop.source import WeightSourceError

__all__ = ["FOOTER_SIZE", "TABLE_MAGIC", "VarintError", "read_table", "read_varint", "snappy_decompress"]

FOOTER_SIZE = 48
TABLE_MAGIC = 0xDB4775248B80FB57
_TRAILER_SIZE = 5  # after each block: its compression type (1 byte) and the masked CRC32C (4 bytes)
_UINT32 = struct.Struct("<I")
# Snappy's densest element is a 3-byte copy of 64 bytes; a block declaring more than this ratio is corrupt.
_SNAPPY_MAX_RATIO = 22


class VarintError(ValueError):
    """Malformed varint or block bytes; callers add the file and offset."""


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The unsigned varint at ``position`` and the position after it (LevelDB's and TF's coding.cc)."""
    result = shift = 0
    while True:
        if position >= len(data):
            raise VarintError("a varint runs past the end of its buffer")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise VarintError("a varint is longer than 10 bytes")


def read_table(path: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of an SSTable, in key order, with each block's CRC checked."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise WeightSourceError(f"{path}: cannot read the checkpoint index: {error}.") from error
    if len(data) < FOOTER_SIZE:
        raise WeightSourceError(
            f"{path}: {len(data)} bytes, shorter than the 48-byte table footer; the .index file is truncated."
        )
    footer = data[-FOOTER_SIZE:]
    if int.from_bytes(footer[40:], "little") != TABLE_MAGIC:
        raise WeightSourceError(
            f"{path}: not an sstable (bad magic number in the footer at offset {len(data) - FOOTER_SIZE}); "
            "the .index file is truncated, corrupt, or not a TensorFlow checkpoint index."
        )
    try:
        position = read_varint(footer, read_varint(footer, 0)[1])[1]  # skip the metaindex handle
        index_offset, position = read_varint(footer, position)
        index_size, _ = read_varint(footer, position)
    except VarintError as error:
        raise WeightSourceError(f"{path}: corrupt table footer: {error}.") from None
    index = _read_block(data, path, index_offset, index_size, "index block")
    entries: list[tuple[bytes, bytes]] = []
    for _, handle_bytes in _block_entries(index, path, index_offset):
        try:
            block_offset, position = read_varint(handle_bytes, 0)
            block_size, _ = read_varint(handle_bytes, position)
        except VarintError as error:
            raise WeightSourceError(f"{path}: corrupt block handle in the index block: {error}.") from None
        block = _read_block(data, path, block_offset, block_size, "data block")
        entries.extend(_block_entries(block, path, block_offset))
    return entries


def _read_block(data: bytes, path: str, offset: int, size: int, kind: str) -> bytes:
    end = offset + size + _TRAILER_SIZE
    if offset < 0 or end > len(data) - FOOTER_SIZE:
        raise WeightSourceError(
            f"{path}: the {kind} at offset {offset} ({size} bytes plus a 5-byte trailer) runs past the end of the "
            f"table ({len(data)} bytes); the .index file is truncated or corrupt."
        )
    block = data[offset : offset + size]
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
        return snappy_decompress(block, path, offset)
    raise WeightSourceError(f"{path}: the {kind} at offset {offset} has unknown compression type {block_type}.")


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
            shared, position = read_varint(block, position)
            unshared, position = read_varint(block, position)
            value_length, position = read_varint(block, position)
            end = position + unshared + value_length
            if shared > len(key) or end > limit:
                raise VarintError(f"an entry at block byte {position} overruns its block or shared key")
            key = key[:shared] + block[position : position + unshared]
            yield key, block[position + unshared : end]
            position = end
    except VarintError as error:
        raise WeightSourceError(f"{where} is corrupt: {error}.") from None


def snappy_decompress(block: bytes, path: str, offset: int) -> bytes:
    """Raw snappy (no framing), as old TF index blocks of type 1 use; WeightSourceError naming path and offset."""
    try:
        expected, position = read_varint(block, 0)
        if expected > _SNAPPY_MAX_RATIO * len(block):
            raise VarintError(f"it declares {expected} bytes, more than {len(block)} snappy bytes can hold")
        out = bytearray()
        while position < len(block):
            tag = block[position]
            if tag & 3 == 0:
                position = _snappy_literal(block, position, out, expected)
            else:
                position = _snappy_copy(block, position, out, expected)
        if len(out) != expected:
            raise VarintError(f"decompressed to {len(out)} bytes, expected {expected}")
    except (VarintError, IndexError) as error:
        raise WeightSourceError(
            f"{path}: the snappy-compressed block at offset {offset} is corrupt: {error}."
        ) from None
    return bytes(out)


def _snappy_literal(block: bytes, position: int, out: bytearray, expected: int) -> int:
    """Append the literal whose tag is at ``position``; the position after it."""
    length = block[position] >> 2
    position += 1
    if length >= 60:  # the length - 1 follows in 1 to 4 little-endian bytes
        width = length - 59
        if position + width > len(block):
            raise VarintError("a literal's length runs past the end of the block")
        length = int.from_bytes(block[position : position + width], "little")
        position += width
    length += 1
    if position + length > len(block) or len(out) + length > expected:
        raise VarintError("a literal runs past the end of the block or of the declared size")
    out += block[position : position + length]
    return position + length


def _snappy_copy(block: bytes, position: int, out: bytearray, expected: int) -> int:
    """Append the back-reference whose tag is at ``position``; the position after it."""
    tag = block[position]
    position += 1
    if tag & 3 == 1:  # 1-byte offset: length 4..11 and 3 offset bits in the tag
        length, distance = ((tag >> 2) & 7) + 4, ((tag >> 5) << 8) | block[position]
        position += 1
    else:  # 2- or 4-byte offset: length 1..64 in the tag
        width = 2 if tag & 3 == 2 else 4
        if position + width > len(block):  # a short slice would read as a smaller offset, silently
            raise VarintError("a copy's offset runs past the end of the block")
        length, distance = (tag >> 2) + 1, int.from_bytes(block[position : position + width], "little")
        position += width
    if not 0 < distance <= len(out):
        raise VarintError(f"a copy reaches {distance} bytes back, before the start")
    if len(out) + length > expected:
        raise VarintError(f"decompresses past the declared {expected} bytes")
    if length <= distance:
        start = len(out) - distance
        out += out[start : start + length]
    else:
        for _ in range(length):  # byte by byte: the copy overlaps its own output
            out.append(out[-distance])
    return position
