"""The content of one ``ckpt-<step>`` folder: encoding, checksums, validated reading.

Files in a checkpoint folder::

    model.safetensors       the module's state_dict
    optimizer.safetensors   tensors of the optimizer/scheduler state tree (when saved)
    optimizer.json          the rest of that tree, see ``serialization.py``
    extra.safetensors       tensors inside the caller's ``extra`` tree (only when there are any)
    state.json              format_version, global_step, extra (RNG states, input positions...),
                            {"files": {name: {"sha256", "size", "crc32c"}}} and state_sha256; written last

Every byte that restore reads is covered by a checksum: the other files by
their sha256 and size in ``state.json``; ``state.json`` itself by its last
key, ``state_sha256``: the sha256 of the file's exact bytes with that value
written as 64 zeros. So an edited value, key order or whitespace is caught,
and checking costs one hash, no re-encoding. ``format_version`` 1 files (no
``state_sha256``, a ``save_time``) are still read, without that check.

A checkpoint written by several processes (``layout: "dcp"``, format_version 3)
holds DCP's files instead of the safetensors ones (``dcp_format.py`` reads and
writes them)::

    .metadata               DCP's index of every tensor and where its pieces are
    __<rank>_<n>.distcp     the tensors each rank wrote: ``model.<state_dict key>`` and
                            ``shared.<path>`` (the tensors of optimizer.json's tree)
    optimizer.json          the optimizer/scheduler/scaler tree, its tensors named by DCP key
    extra.safetensors, state.json   as above; state.json lists every file's sha256 and size

The bytes are deterministic: identical state gives identical files in any
process. Save times live in the manifest, not here. safetensors files are
encoded by ``tensor_files.py`` (the safetensors library writes its metadata in
hash-map order, which differs between processes), as views of the tensors'
memory: ``encode_checkpoint`` returns ``CheckpointFiles``, whose contents the
store streams to disk while hashing them, then ``seal`` writes state.json over
those digests. Reading a tensor file checks its size, then its fastest recorded
checksum (crc32c, else crc32, else sha256) while the tensors are read
(``read_tensor_file``). The bytes are the same as before streaming, and sha256
is still recorded: a previous version reads and verifies these checkpoints.

What belongs here: turning tensors and trees into file bytes and back, and
deciding whether a folder is intact. Which folder to read, retention and the
manifest belong to ``store.py``; where the bytes go belongs to ``storage.py``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import CheckpointError
from .hashing import CRC32, CRC32C, SHA256
from .serialization import flatten_state, unflatten_state
from .storage import Storage
from .tensor_files import (
    DTYPES as _DTYPES,
    MAX_HEADER_BYTES as _MAX_HEADER_BYTES,
    EncodedFile,
    bytes_to_tensors,
    encode_tensors,
    read_tensors,
    tensors_to_bytes,
)

__all__ = [
    "CheckpointFiles",
    "bytes_to_tensors",
    "encode_checkpoint",
    "encode_sharded_state",
    "read_json_tree",
    "read_state",
    "read_tensor_file",
    "read_tree",
    "read_verified_file",
    "tensors_to_bytes",
]

FORMAT_VERSION = 2
SHARDED_FORMAT_VERSION = 3
"""state.json of a checkpoint whose tensors DCP wrote; older readers then ask for an upgrade instead of
calling the folder damaged."""
_UNCHECKED_FORMAT_VERSION = 1  # written before state.json had its own checksum
LAYOUT_KEY = "layout"
DCP_LAYOUT = "dcp"
DCP_METADATA_FILE = ".metadata"
STATE_CHECKSUM_KEY = "state_sha256"
MODEL_FILE = "model.safetensors"
OPTIMIZER_TENSORS_FILE = "optimizer.safetensors"
OPTIMIZER_TREE_FILE = "optimizer.json"
EXTRA_TENSORS_FILE = "extra.safetensors"
STATE_FILE = "state.json"


@dataclass(frozen=True)
class CheckpointFiles:
    """The files of one checkpoint before they are written: every one but state.json as content to stream
    (``contents``, in write order), and state.json, sealed by ``seal`` over the digests taken while writing."""

    state: dict[str, Any]
    """state.json's document without its ``files`` table."""
    contents: dict[str, EncodedFile]
    known_files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Files already in the folder ({name: {"sha256", "size"}}): DCP's shards, written by the ranks."""

    @property
    def size(self) -> int:
        """Bytes of the files still to write, state.json apart."""
        return sum(content.size for content in self.contents.values())

    def seal(self, digests: Mapping[str, Mapping[str, Any]]) -> bytes:
        """state.json's bytes, listing ``known_files`` then ``contents`` with their ``digests``."""
        table = {name: {"sha256": entry["sha256"], "size": entry["size"]} for name, entry in self.known_files.items()}
        table.update(
            {
                name: {
                    "sha256": digests[name]["sha256"],
                    "size": digests[name]["size"],
                    "crc32c": digests[name]["crc32c"],
                }
                for name in self.contents
            }
        )
        return sealed_json({**self.state, "files": table}, STATE_CHECKSUM_KEY)


def encode_checkpoint(
    step: int,
    model_state: Mapping[str, torch.Tensor],
    optimizer_state: Mapping[str, Any] | None,
    extra: Mapping[str, Any] | None,
) -> CheckpointFiles:
    """The files of one checkpoint; the tensors are views of the caller's memory until written."""
    contents = {MODEL_FILE: encode_tensors(model_state, "model_state")}
    if optimizer_state is not None:
        tree, tensors = flatten_state(optimizer_state, root="optimizer_state")
        contents[OPTIMIZER_TENSORS_FILE] = encode_tensors(tensors, "optimizer_state")
        contents[OPTIMIZER_TREE_FILE] = _small_file(_json_bytes({"format_version": FORMAT_VERSION, "tree": tree}))
    extra_tree, extra_tensors = flatten_state(dict(extra or {}), root="extra")
    if extra_tensors:
        contents[EXTRA_TENSORS_FILE] = encode_tensors(extra_tensors, "extra")
    state = {"format_version": FORMAT_VERSION, "global_step": step, "extra": extra_tree}
    return CheckpointFiles(state=state, contents=contents)


def encode_sharded_state(
    step: int,
    shared_tree: Any,
    extra: Mapping[str, Any] | None,
    shard_files: Mapping[str, Mapping[str, Any]],
) -> CheckpointFiles:
    """The files the chief adds to a folder DCP wrote: optimizer.json, extra.safetensors and state.json last.

    ``shard_files`` are DCP's files ({name: {"sha256", "size"}}, gathered from the ranks that wrote them);
    ``shared_tree`` is the JSON tree of the optimizer/scheduler/scaler state, its tensors in DCP.
    """
    if DCP_METADATA_FILE not in shard_files:
        raise CheckpointError(
            f"The sharded checkpoint of step {step} lacks DCP's {DCP_METADATA_FILE}: it is incomplete."
        )
    contents = {
        OPTIMIZER_TREE_FILE: _small_file(_json_bytes({"format_version": SHARDED_FORMAT_VERSION, "tree": shared_tree}))
    }
    extra_tree, extra_tensors = flatten_state(dict(extra or {}), root="extra")
    if extra_tensors:
        contents[EXTRA_TENSORS_FILE] = encode_tensors(extra_tensors, "extra")
    known = {name: {"sha256": entry["sha256"], "size": entry["size"]} for name, entry in sorted(shard_files.items())}
    state = {"format_version": SHARDED_FORMAT_VERSION, LAYOUT_KEY: DCP_LAYOUT, "global_step": step, "extra": extra_tree}
    return CheckpointFiles(state=state, contents=contents, known_files=known)


def _small_file(data: bytes) -> EncodedFile:
    return EncodedFile(chunks=(data,), size=len(data))


def is_sharded(state: Mapping[str, Any]) -> bool:
    """Whether a checked state.json (``read_state``) describes a checkpoint DCP wrote."""
    return state.get(LAYOUT_KEY) == DCP_LAYOUT


_CHECKSUM_PLACEHOLDER = b"0" * 64


def sealed_json(
    document: dict[str, Any], key: str, *, compact: bool = False, encoded: Mapping[str, str] | None = None
) -> bytes:
    """``document`` as JSON bytes ending with ``key``: the sha256 of these exact bytes with its value as 64 zeros.

    ``compact``: on one line (the manifest of a model_dir keeping 1000 checkpoints is written at every
    save); else one top-level key per line for people reading it (``_json_lines``). Both are json's C
    encoder: indenting every level takes its pure-Python one, 7 ms per save for state.json's RNG states.
    ``encoded`` (compact only): top-level values given as their JSON text, exactly as ``json.dumps`` writes
    them (the manifest's list of 1000 checkpoints, kept encoded between saves); the bytes are the same as
    for the document alone.
    """
    sealed = {**document, key: _CHECKSUM_PLACEHOLDER.decode()}
    if encoded:
        if not compact:
            raise ValueError("sealed_json: encoded values are for the compact form")
        sealed.update({name: _stand_in(name) for name in encoded})
    data = _json_bytes(sealed, compact=True) if compact else _json_lines(sealed)
    for name, text in (encoded or {}).items():
        data = data.replace(json.dumps(_stand_in(name)).encode(), text.encode("utf-8"), 1)
    start = data.rindex(_checksum_marker(key)) + len(_checksum_marker(key))
    return data[:start] + hashlib.sha256(data).hexdigest().encode() + data[start + 64 :]


def _stand_in(name: str) -> str:
    # Written in place of an encoded value, then replaced by its text: no value of a manifest or state.json
    # is a string like it (names of folders and files, dtypes, digests).
    return f"\u2063encoded {name}\u2063"


def seal_fault(data: bytes, document: dict[str, Any], key: str) -> str | None:
    """Why ``data`` (parsed as ``document``) fails its ``sealed_json`` checksum; None when it holds."""
    recorded, marker = document.get(key), _checksum_marker(key)
    start = data.rfind(marker) + len(marker)
    if not isinstance(recorded, str) or start < len(marker) or data[start : start + 64] != recorded.encode():
        return f"it lacks its {key}: the file was edited or damaged"
    digest = hashlib.sha256(data[:start] + _CHECKSUM_PLACEHOLDER + data[start + 64 :]).hexdigest()
    if digest != recorded:
        return f"it fails its checksum: sha256 is {digest}, it records {recorded} (its content was edited or damaged)"
    return None


def _checksum_marker(key: str) -> bytes:
    return f'"{key}": "'.encode()


def read_state(storage: Storage, folder: str, step: int) -> dict[str, Any]:
    """Read and check ``state.json``; a folder without a valid one is incomplete or damaged."""
    where = f"{storage.location(folder)}/{STATE_FILE}"
    try:
        data = storage.read_file(folder, STATE_FILE)
    except FileNotFoundError:
        raise CheckpointError(f"{where} is missing: the checkpoint is incomplete or damaged.") from None
    try:
        state = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"{where} is not valid JSON ({error}): the checkpoint is incomplete or damaged."
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{where} should hold a JSON object; found {type(state).__name__}.")
    version = state.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{where} has no valid format_version (found {version!r}).")
    if version > SHARDED_FORMAT_VERSION:
        raise CheckpointError(
            f"{where} has format_version {version}, newer than this torchestimator reads ({SHARDED_FORMAT_VERSION}); "
            "upgrade torchestimator to read it."
        )
    if version > _UNCHECKED_FORMAT_VERSION:
        fault = seal_fault(data, state, STATE_CHECKSUM_KEY)
        if fault is not None:
            raise CheckpointError(f"{where}: {fault}.")
    elif STATE_CHECKSUM_KEY in state:  # format 1 never had one: its format_version was edited
        raise CheckpointError(f"{where} says format_version 1 but carries a {STATE_CHECKSUM_KEY}: it was edited.")
    if state.get("global_step") != step:
        raise CheckpointError(
            f"{where} says global_step {state.get('global_step')!r}, but the folder name says {step}."
        )
    layout = state.get(LAYOUT_KEY)
    if (version == SHARDED_FORMAT_VERSION) != (layout == DCP_LAYOUT):
        raise CheckpointError(
            f"{where} says format_version {version} with layout {layout!r}; format_version "
            f"{SHARDED_FORMAT_VERSION} goes with layout {DCP_LAYOUT!r} only: the file was edited."
        )
    required = DCP_METADATA_FILE if layout == DCP_LAYOUT else MODEL_FILE
    files = state.get("files")
    if (
        not isinstance(files, dict)
        or required not in files
        or not all(
            isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("size"), int)
            for entry in files.values()
        )
    ):
        raise CheckpointError(f"{where} lacks a valid 'files' table with {required}'s sha256 and size.")
    if not isinstance(state.get("extra", {}), dict):
        raise CheckpointError(f"{where}: 'extra' should be a JSON object.")
    return state


_VERIFY_CHUNK_BYTES = 16 << 20


def verify_listed_files(storage: Storage, folder: str, state: Mapping[str, Any], names: list[str]) -> None:
    """Check the size and sha256 of files state.json lists, reading each in chunks (DCP shards can be large)."""
    for filename in names:
        where = f"{storage.location(folder)}/{filename}"
        expected = state["files"][filename]
        digest, size = hashlib.sha256(), 0
        try:
            while True:
                chunk = storage.read_file(folder, filename, size, _VERIFY_CHUNK_BYTES)
                if not chunk:
                    break
                digest.update(chunk)
                size += len(chunk)
        except FileNotFoundError:
            raise CheckpointError(f"{where} is missing although state.json lists it.") from None
        if size != expected["size"]:
            raise CheckpointError(
                f"{where} has {size} bytes; state.json expects {expected['size']} (truncated or overwritten)."
            )
        if digest.hexdigest() != expected["sha256"]:
            raise CheckpointError(
                f"{where} fails its checksum: sha256 is {digest.hexdigest()}, state.json expects {expected['sha256']} "
                "(the file is corrupt)."
            )


def read_verified_file(storage: Storage, folder: str, filename: str, state: Mapping[str, Any], verify: bool) -> bytes:
    """Read a file listed in ``state.json``, checking its size always and its sha256 if ``verify``."""
    where = f"{storage.location(folder)}/{filename}"
    expected = state["files"][filename]
    try:
        data = storage.read_file(folder, filename)
    except FileNotFoundError:
        raise CheckpointError(f"{where} is missing although state.json lists it.") from None
    if len(data) != expected["size"]:
        raise CheckpointError(
            f"{where} has {len(data)} bytes; state.json expects {expected['size']} (truncated or overwritten)."
        )
    if verify:
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected["sha256"]:
            raise CheckpointError(
                f"{where} fails its checksum: sha256 is {digest}, state.json expects {expected['sha256']} "
                "(the file is corrupt)."
            )
    return data


def read_tensor_file(
    storage: Storage, folder: str, filename: str, state: Mapping[str, Any], verify: bool
) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file listed in ``state.json``: size checked first, sha256 (if ``verify``)
    while reading, each tensor read straight into its own memory."""
    where = f"{storage.location(folder)}/{filename}"
    expected = state["files"][filename]
    try:
        stream = storage.open_file(folder, filename)
    except FileNotFoundError:
        raise CheckpointError(f"{where} is missing although state.json lists it.") from None
    with stream:
        size = stream.seek(0, 2)
        if size != expected["size"]:
            raise CheckpointError(
                f"{where} has {size} bytes; state.json expects {expected['size']} (truncated or overwritten)."
            )
        stream.seek(0)
        return read_tensors(stream, where, size=size, expected=_checksum_to_verify(expected) if verify else None)


def _checksum_to_verify(entry: Mapping[str, Any]) -> tuple[str, Any]:
    """The fastest checksum the writer recorded: crc32c (this version), else crc32 (the first streaming
    version's), else sha256 (every earlier version's)."""
    for kind in (CRC32C, CRC32):
        value = entry.get(kind)
        if isinstance(value, int) and not isinstance(value, bool):
            return kind, value
    return SHA256, entry["sha256"]


def read_tree(
    storage: Storage, folder: str, state: Mapping[str, Any], verify: bool, *, tree_file: str | None, tensors_file: str
) -> Any:
    """Rebuild a state tree from its JSON (in ``tree_file`` or state.json's ``extra``) and tensor file."""
    location = storage.location(folder)
    tensors: dict[str, torch.Tensor] = {}
    if tensors_file in state["files"]:
        tensors = read_tensor_file(storage, folder, tensors_file, state, verify)
    if tree_file is None:
        tree, where = state.get("extra", {}), f"{location}/{STATE_FILE} (extra)"
    else:
        where, tree = f"{location}/{tree_file}", read_json_tree(storage, folder, state, verify, tree_file)
    try:
        return unflatten_state(tree, tensors)
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"{where}: {error}") from None


def read_json_tree(storage: Storage, folder: str, state: Mapping[str, Any], verify: bool, tree_file: str) -> Any:
    """The JSON tree of a state tree file (optimizer.json), its tensors still placeholders."""
    where = f"{storage.location(folder)}/{tree_file}"
    data = read_verified_file(storage, folder, tree_file, state, verify)
    try:
        return json.loads(data.decode("utf-8"))["tree"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(f"{where} is not a valid state tree file: {error!r}.") from None


def read_safetensors_header(storage: Storage, folder: str, filename: str) -> list[tuple[str, tuple[int, ...], Any]]:
    """(name, shape, dtype) of every tensor, reading only the file's header."""
    where = f"{storage.location(folder)}/{filename}"
    try:
        prefix = storage.read_file(folder, filename, 0, 8)
        if len(prefix) < 8:
            raise CheckpointError(f"{where} is truncated: {len(prefix)} bytes, shorter than a safetensors header.")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > _MAX_HEADER_BYTES:
            raise CheckpointError(f"{where} declares a {header_size}-byte header: not a safetensors file.")
        header_bytes = storage.read_file(folder, filename, 8, header_size)
    except FileNotFoundError:
        raise CheckpointError(f"{where} is missing.") from None
    try:
        header = json.loads(header_bytes.decode("utf-8"))
        variables = [
            (name, tuple(entry["shape"]), _DTYPES.get(entry["dtype"], entry["dtype"]))
            for name, entry in header.items()
            if name != "__metadata__"
        ]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{where} has an unreadable safetensors header: {error!r}.") from None
    return sorted(variables, key=lambda variable: variable[0])


def _json_lines(document: dict[str, Any]) -> bytes:
    """``document`` as JSON with one top-level key per line, each value on its line (json's C encoder)."""
    lines = (f" {json.dumps(key)}: {json.dumps(value, allow_nan=False)}" for key, value in document.items())
    return ("{\n" + ",\n".join(lines) + "\n}").encode("utf-8")


def _json_bytes(value: Any, *, compact: bool = False) -> bytes:
    # allow_nan=False: the serializer tags non-finite floats, so the files stay standard JSON.
    return json.dumps(value, indent=None if compact else 1, allow_nan=False).encode("utf-8")
