"""TensorFlow checkpoints (tensor bundle V2) read in pure Python, without TensorFlow.

What belongs here: locating a checkpoint (prefix, directory with a `checkpoint`
file, or `.index` path), the `checkpoint` file itself (CheckpointState in
protobuf text format), and the reader: the tensor bytes in the
`.data-NNNNN-of-NNNNN` shards (numeric, bool and DT_STRING, each checked against
its CRC32C) and partitioned variables saved as slices, assembled. What does
not: the `.index` table (`_sstable.py`), its records (`_tf_bundle.py`), which
keys are model variables and their TF2 object paths (`_tf_variables.py`),
mapping names or layouts onto a PyTorch model (warm start and the layout
converters), and writing checkpoints.

The byte-level format is in formats.md section 3. The protobuf records are
parsed by the protobuf runtime from field tables in `_tf_protos.py`; each
refusal becomes a `WeightSourceError` naming the file and record in one place
(`TensorFlowCheckpoint._decoded`, and `read_checkpoint_state` for the text file).

Values: numeric tensors come back as native-endian numpy arrays of the
matching dtype; DT_STRING tensors as numpy object arrays of `bytes`; bfloat16
(numpy has no such dtype) is widened exactly to float32 while
`TensorInfo.dtype` still says "bfloat16".
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import struct
from collections.abc import Callable
from typing import Any, BinaryIO, Literal

import numpy as np

from torchestimator._io import protobuf as _protobuf
from torchestimator._io.regular_file import read_regular_file
from torchestimator.data.tfrecord import masked_crc32c
from torchestimator.interop._sstable import FOOTER_SIZE, TABLE_MAGIC, VarintError, read_table, read_varint
from torchestimator.interop._tf_bundle import (
    BFLOAT16,
    NUMPY_DTYPES,
    STRING,
    BundleEntry,
    check_entry,
    decode_entry,
    decode_header,
    slice_index,
    slice_keys,
    slice_spec,
)
from torchestimator.interop._tf_protos import tf_protos
from torchestimator.interop._tf_variables import (
    OBJECT_GRAPH_KEY,
    Node,
    decode_object_graph,
    is_optimizer_variable,
    model_variables,
    object_paths,
    optimizer_slots,
)
from torchestimator.interop.source import TensorInfo, WeightSource, WeightSourceError, missing_tensor_error

__all__ = [
    "OBJECT_GRAPH_KEY",
    "BundleEntry",
    "TensorFlowCheckpoint",
    "is_optimizer_variable",
    "is_tensorflow",
    "locate_checkpoint",
    "open_tensorflow",
    "read_checkpoint_state",
]

logger = logging.getLogger(__name__)

_DATA_SUFFIX = re.compile(r"\.data-\d{5}-of-\d{5}$")
_UINT32 = struct.Struct("<I")
_MAX_STATE_FILE = 16 << 20  # a `checkpoint` text file lists a few paths; anything this long is not one


# --------------------------------------------------------------------------- locating checkpoints


def read_checkpoint_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a `checkpoint` file (CheckpointState in protobuf text format) into a dict.

    Keys: `model_checkpoint_path` (str), `all_model_checkpoint_paths` (list),
    `all_model_checkpoint_timestamps` (list of float), `last_preserved_timestamp`
    (float, None when absent or 0). Parsed as TensorFlow parses it (protobuf's
    text format: comments, either quote, escapes); a field CheckpointState lacks is an error, as in TensorFlow.
    """
    path = os.fspath(path)
    try:
        text = read_regular_file(path, _MAX_STATE_FILE).decode("utf-8")
    except (OSError, ValueError) as error:  # not a regular file, too big, not UTF-8
        raise WeightSourceError(f"{path}: cannot read the checkpoint state file: {error}.") from None
    try:
        state = _protobuf.parse_text(text, tf_protos().CheckpointState)
    except _protobuf.TextFormatError as error:
        where = f"{path}, line {error.line}" if error.line is not None else path
        raise WeightSourceError(f"{where}: not a CheckpointState text file: {error.problem}") from None
    return {
        "model_checkpoint_path": state.model_checkpoint_path,
        "all_model_checkpoint_paths": list(state.all_model_checkpoint_paths),
        "all_model_checkpoint_timestamps": list(state.all_model_checkpoint_timestamps),
        "last_preserved_timestamp": state.last_preserved_timestamp or None,  # proto3: 0 and absent are one
    }


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
        if not os.path.exists(prefix + ".index") and os.path.exists(
            os.path.join(path, os.path.basename(latest)) + ".index"
        ):
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
            if handle.tell() < FOOTER_SIZE:
                return False
            handle.seek(-8, os.SEEK_END)
            return int.from_bytes(handle.read(8), "little") == TABLE_MAGIC
    except (OSError, ValueError, UnicodeDecodeError):
        return False


def open_tensorflow(path: str | os.PathLike[str]) -> TensorFlowCheckpoint:
    """Open a TensorFlow checkpoint (tensor bundle V2) for reading; see `locate_checkpoint` for `path`."""
    return TensorFlowCheckpoint(path)


# --------------------------------------------------------------------------- the reader


class TensorFlowCheckpoint(WeightSource):
    """A TensorFlow checkpoint read without TensorFlow; names are the raw checkpoint keys."""

    format = "tensorflow"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.prefix = locate_checkpoint(self.path)
        self.index_path = self.prefix + ".index"
        self._files: dict[int, BinaryIO] = {}
        self._graph: list[Node] | None = None
        self._entries: dict[str, BundleEntry] = {}
        self._slice_entries: dict[bytes, BundleEntry] = {}
        self._load_index()

    # ----------------------------------------------------------------- index

    def _load_index(self) -> None:
        table = read_table(self.index_path)
        if not table or table[0][0] != b"":
            raise WeightSourceError(
                f"{self.index_path}: the table has no header entry (key ''); it is not a tensor bundle index."
            )
        header = self._decoded(decode_header, table[0][1], "the bundle header")
        problem = header.problem()
        if problem:
            raise WeightSourceError(f"{self.index_path}: {problem}.")
        self.num_shards, self.big_endian = header.num_shards, header.big_endian
        for key, value in table[1:]:
            entry = self._decoded(decode_entry, value, f"the entry of {key!r}")
            check_entry(self.index_path, key, entry)
            if key.startswith(b"\x00"):
                self._slice_entries[key] = entry
            else:
                self._entries[key.decode("utf-8", "backslashreplace")] = entry
        # Lazily, and at most 5: a corrupt header may declare billions of shards.
        absent = (
            self.shard_path(shard) for shard in range(self.num_shards) if not os.path.isfile(self.shard_path(shard))
        )
        missing = list(itertools.islice(absent, 5))
        if missing:
            raise WeightSourceError(
                f"{self.prefix}: missing data shard file(s) {', '.join(missing)}; a checkpoint needs its .index "
                f"and all {self.num_shards} .data shard(s). Copy the whole checkpoint, not just the .index."
            )

    def _decoded(self, decode: Callable[[bytes], Any], data: bytes, what: str, path: str | None = None) -> Any:
        """``decode(data)``; the one place where the protobuf runtime's refusal becomes a WeightSourceError."""
        try:
            return decode(data)
        except _protobuf.MessageDecodeError as error:
            raise WeightSourceError(
                f"{path or self.index_path}: cannot decode {what}: {error}; the checkpoint is corrupt."
            ) from None

    def shard_path(self, shard_id: int) -> str:
        """The file name of one data shard."""
        return f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}"

    def entry(self, name: str) -> BundleEntry:
        """The BundleEntryProto of one tensor (location, size, CRC, slices)."""
        if name not in self._entries:
            raise missing_tensor_error(self.prefix, name, self._entries)
        return self._entries[name]

    def tensors(self) -> list[TensorInfo]:
        return [
            TensorInfo(name=name, shape=entry.shape, dtype=entry.dtype_name)
            for name, entry in sorted(self._entries.items())
        ]

    # ----------------------------------------------------------------- values

    def read(self, name: str) -> np.ndarray:
        entry = self.entry(name)
        if entry.slices:
            return self._read_sliced(name, entry)
        return self._read_entry(name, entry)

    def _read_sliced(self, name: str, entry: BundleEntry) -> np.ndarray:
        numeric = None if entry.dtype == STRING else self._numpy_dtype(name, entry)
        dtype = object if numeric is None else numeric
        # Before allocating the whole: its slices are stored in the shards, so it cannot be bigger than them.
        # (A string takes at least one byte, its length.)
        needed = math.prod(entry.shape) * (1 if numeric is None else self._stored_itemsize(entry, numeric))
        available = sum(self._shard_size(shard) for shard in range(self.num_shards))
        if needed > available:
            raise WeightSourceError(
                f"{self.index_path}: partitioned variable {name!r} declares shape {list(entry.shape)} "
                f"({needed} bytes), more than its {self.num_shards} data shard(s) hold ({available} bytes); "
                "the .index is corrupt."
            )
        for extents in entry.slices:
            if any(
                start + (0 if length in (None, -1) else length) > dim
                for (start, length), dim in zip(extents, entry.shape)
            ):
                raise WeightSourceError(
                    f"{self.index_path}: slice '{slice_spec(extents)}' of {name!r} reaches past its shape "
                    f"{list(entry.shape)}; the .index is corrupt."
                )
        result = np.zeros(entry.shape, dtype=dtype)
        covered = 0
        for extents in entry.slices:
            spec = slice_spec(extents)
            found = [key for key in slice_keys(name, entry.shape, extents) if key in self._slice_entries]
            if len(extents) != len(entry.shape) or not found:
                raise WeightSourceError(
                    f"{self.index_path}: partitioned variable {name!r} lists slice '{spec}' of shape "
                    f"{list(entry.shape)}, but no entry for that slice is in the index; cannot assemble it."
                )
            part = self._read_entry(f"{name} (slice {spec})", self._slice_entries[found[0]])
            index = slice_index(entry.shape, extents)
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
        if entry.dtype == BFLOAT16:
            return np.dtype(np.float32)
        if entry.dtype not in NUMPY_DTYPES:
            raise WeightSourceError(
                f"{self.prefix}: variable {name!r} has dtype {entry.dtype_name} (DataType {entry.dtype}), which "
                "this reader cannot convert to numpy; skip it (e.g. exclude it from the warm-start selection)."
            )
        return np.dtype(NUMPY_DTYPES[entry.dtype])

    @staticmethod
    def _stored_itemsize(entry: BundleEntry, dtype: np.dtype) -> int:
        return 2 if entry.dtype == BFLOAT16 else dtype.itemsize

    def _read_entry(self, name: str, entry: BundleEntry) -> np.ndarray:
        count = math.prod(entry.shape)
        if entry.dtype == STRING and count > entry.size:
            raise WeightSourceError(
                f"{self.index_path}: invalid size in bundle entry of {name!r}: {count} strings cannot fit in "
                f"{entry.size} bytes (each needs at least its length byte)."
            )
        if entry.dtype != STRING:
            dtype = self._numpy_dtype(name, entry)
            itemsize = self._stored_itemsize(entry, dtype)
            if entry.size != count * itemsize:
                raise WeightSourceError(
                    f"{self.index_path}: invalid size in bundle entry of {name!r}: stored size {entry.size}, "
                    f"expected {count * itemsize} for shape {list(entry.shape)} of {entry.dtype_name}."
                )
        raw = self._read_bytes(name, entry)
        if entry.dtype == STRING:
            return self._decode_strings(name, entry, raw, count)
        self._check_crc(name, entry, raw)
        order: Literal[">", "<"] = ">" if self.big_endian else "<"
        if entry.dtype == BFLOAT16:
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
                length, position = read_varint(raw, position)
                lengths.append(length)
        except VarintError:
            raise WeightSourceError(
                f"{self.shard_path(entry.shard_id)}: the string lengths of {name!r} at offset {entry.offset} run "
                "past the entry; the data shard is corrupt."
            ) from None
        packed = b"".join(struct.pack("<I" if length <= 0xFFFFFFFF else "<Q", length) for length in lengths)
        stored_checksum = raw[position : position + 4]
        body = raw[position + 4 :]
        if (
            len(stored_checksum) != 4
            or _UINT32.unpack(stored_checksum)[0] != masked_crc32c(packed)
            or len(body) != sum(lengths)
        ):
            self._check_crc(name, entry, packed + stored_checksum + body)
            raise WeightSourceError(
                f"{self.shard_path(entry.shard_id)}: the string lengths of {name!r} at offset {entry.offset} do "
                "not match their length checksum or the entry size; the data shard is corrupt."
            )
        self._check_crc(name, entry, packed + stored_checksum + body)
        values = np.empty(count, dtype=object)
        start = 0
        for index, length in enumerate(lengths):
            values[index] = body[start : start + length]
            start += length
        return values.reshape(entry.shape)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    # ----------------------------------------------------------------- TF2 object graph

    def _object_graph(self) -> list[Node]:
        """Nodes of `_CHECKPOINTABLE_OBJECT_GRAPH` (see `_tf_variables`); [] for TF1."""
        if self._graph is None:
            self._graph = []
            if OBJECT_GRAPH_KEY in self._entries:
                entry = self._entries[OBJECT_GRAPH_KEY]
                if entry.dtype != STRING or math.prod(entry.shape) != 1:
                    raise WeightSourceError(
                        f"{self.index_path}: {OBJECT_GRAPH_KEY} is {entry.dtype_name} of shape {list(entry.shape)}, "
                        "not one serialized string; the .index is corrupt."
                    )
                serialized = self.read(OBJECT_GRAPH_KEY).reshape(()).item()
                self._graph = self._decoded(
                    decode_object_graph, serialized, OBJECT_GRAPH_KEY, self.shard_path(entry.shard_id)
                )
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
        return object_paths(self._object_graph(), self.prefix)

    def optimizer_slots(self) -> dict[str, dict[str, str]]:
        """Checkpoint key of each variable -> {slot name: checkpoint key of the slot}.

        From the object graph's slot_variables (TF2), Keras 3 optimizers' parallel
        lists (`_momentums/i`, `_velocities/i` belong to `_trainable_variables/i`,
        slot names without the underscore), or `<var>/<Slot>` names (TF1).
        """
        return optimizer_slots(self._object_graph(), self._entries)

    def model_variables(self) -> dict[str, str]:
        """Model variables only (no optimizer slots, optimizer scalars, step counters): name -> checkpoint key.

        TF1: each name maps to itself. TF2: the shortest object path outside
        the optimizer and `save_counter` (e.g. `model/_functional/_operations/1/_kernel`
        or `model/layer_with_weights-0/kernel`) maps to its checkpoint key, so
        Keras 3 weights saved under `optimizer/_trainable_variables/N` are found.
        """
        return model_variables(self._object_graph(), self._entries, self.prefix)
