"""The files ``torch.distributed.checkpoint`` (DCP) writes into a checkpoint folder, written and read safely.

A checkpoint of several processes is DCP's: every rank writes its own
``__<rank>_<n>.distcp`` file in parallel and the coordinator writes
``.metadata``, DCP's index. Two top-level keys are used:

- ``model``: the module's state dict (``get_model_state_dict``: plain tensors
  under DDP, DTensor shards under FSDP2);
- ``shared``: the tensors of the optimizer, scheduler and scaler tree
  (``get_optimizer_state_dict``, keyed by parameter name), named by their path
  as ``serialization.flatten_state`` names them; the rest of that tree is JSON
  in ``optimizer.json``, so nothing but tensors goes through DCP.

Reading reshards: any number of processes can read what N wrote. Whole
tensors are read in one process without a process group (``no_dist``);
DTensor shards (FSDP2) are read collectively into the live run's placements.

DCP pickles its ``.metadata``; it is read here by an unpickler that builds only
DCP's own metadata classes, sizes and dtypes, so a crafted file cannot run
code (tensors themselves are read by DCP with ``torch.load(weights_only=True)``).
Entries that are pickled objects (``BytesStorageMetadata``) are refused.

Belongs here: DCP's files. Sealing state.json, publication and retention
belong to ``store.py``; when and how a run saves to ``sharded.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import pickle
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, TypeGuard

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, metadata as dcp_metadata
from torch.distributed.tensor import DTensor

from .errors import CheckpointError
from .format import DCP_METADATA_FILE
from .serialization import unflatten_state

__all__ = [
    "MODEL_KEY",
    "SHARED_KEY",
    "ShardWriter",
    "ShardedSharedState",
    "file_digests",
    "is_sharded_tensor",
    "load_full_tensors",
    "read_metadata",
    "share_of_replicated",
    "variables",
]

MODEL_KEY = "model"
SHARED_KEY = "shared"

_HASH_CHUNK_BYTES = 16 << 20


def is_sharded_tensor(tensor: Any) -> TypeGuard[DTensor]:
    """A DTensor (FSDP2's parameters and their optimizer state): each rank holds only its shard."""
    return isinstance(tensor, DTensor)


def share_of_replicated(
    state_dict: Mapping[str, Mapping[str, Any]], rank: int, num_ranks: int
) -> dict[str, dict[str, Any]]:
    """This rank's part of a two-level state dict in which every rank holds the same plain tensors (DDP's
    replicas) and its own DTensor shards: each plain tensor goes to one rank, balancing bytes, the shards stay.

    Every rank computes the same split (same names and sizes everywhere), so the ranks together save every
    tensor once, and each stages (async) and writes only its share. DCP would dedup the same way, but only
    after each rank had copied everything.
    """
    plain = [
        (top, name, tensor)
        for top, entries in state_dict.items()
        for name, tensor in entries.items()
        if not is_sharded_tensor(tensor)
    ]
    plain.sort(key=lambda item: (-item[2].numel() * item[2].element_size(), item[0], item[1]))
    loads, owner = [0] * num_ranks, {}
    for top, name, tensor in plain:
        chosen = min(range(num_ranks), key=lambda candidate: (loads[candidate], candidate))
        loads[chosen] += tensor.numel() * tensor.element_size()
        owner[top, name] = chosen
    return {
        top: {name: tensor for name, tensor in entries.items() if owner.get((top, name), rank) == rank}
        for top, entries in state_dict.items()
    }


class ShardWriter(FileSystemWriter):
    """DCP's file writer, remembering which files this rank wrote (their checksums go into state.json)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, sync_files=True)
        self.written: list[str] = []

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        future.wait()
        self.written = sorted({result.storage_data.relative_path for result in future.value()})
        return future


class _MetadataUnpickler(pickle.Unpickler):
    """Builds what DCP's .metadata holds (its dataclasses, torch.Size, dtypes, paths) and nothing else."""

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
            ("pathlib", "PosixPath"),
            ("pathlib", "WindowsPath"),
            ("pathlib", "PurePosixPath"),
            ("pathlib", "PureWindowsPath"),
            ("collections", "OrderedDict"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if module == dcp_metadata.__name__ and isinstance(getattr(dcp_metadata, name, None), type):
            return getattr(dcp_metadata, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return getattr(torch, name)
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which DCP's metadata never holds")


def read_metadata(path: str) -> dcp_metadata.Metadata:
    """DCP's index of the checkpoint folder ``path``, read without running code from the file."""
    where = os.path.join(path, DCP_METADATA_FILE)
    try:
        with open(where, "rb") as stream:
            metadata = _MetadataUnpickler(io.BytesIO(stream.read())).load()
    except FileNotFoundError:
        raise CheckpointError(f"{where} is missing: the sharded checkpoint is incomplete.") from None
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, IndexError) as error:
        raise CheckpointError(f"{where} is not a DCP metadata file this version reads: {error}.") from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise CheckpointError(f"{where} holds a {type(metadata).__name__}, not DCP metadata.")
    for key, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            raise CheckpointError(
                f"{where}: entry {key!r} is a pickled object ({type(entry).__name__}); torchestimator reads only "
                "tensors from DCP checkpoints, never pickles. Was this folder written by another tool?"
            )
    return metadata


class _IndexedReader(FileSystemReader):
    """DCP's file reader, given the metadata already read (by the restricted unpickler above)."""

    def __init__(self, path: str, metadata: dcp_metadata.Metadata) -> None:
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        if kwargs.get("rank") is not None:
            raise FileNotFoundError("torchestimator's DCP checkpoints have one global .metadata")
        return self._metadata


def _entries(metadata: dcp_metadata.Metadata, top: str) -> dict[str, dcp_metadata.TensorStorageMetadata]:
    """The tensors under one top-level key, by their key below it."""
    entries = {}
    for fqn, entry in metadata.state_dict_metadata.items():
        path = metadata.planner_data.get(fqn) if metadata.planner_data else None
        # Only tensors are written under a top-level key (flatten_state's); bytes entries are other objects.
        if (
            isinstance(path, tuple)
            and len(path) == 2
            and path[0] == top
            and isinstance(entry, dcp_metadata.TensorStorageMetadata)
        ):
            entries[path[1]] = entry
    return entries


def variables(metadata: dcp_metadata.Metadata) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of each model tensor, sorted by name: the whole tensor's, whoever sharded it."""
    rows = [(name, tuple(entry.size), entry.properties.dtype) for name, entry in _entries(metadata, MODEL_KEY).items()]
    return sorted(rows, key=lambda row: row[0])


def _empty(entry: dcp_metadata.TensorStorageMetadata) -> torch.Tensor:
    return torch.empty(tuple(entry.size), dtype=entry.properties.dtype)


@contextlib.contextmanager
def alone_is_intended() -> Iterator[None]:
    """Silences DCP's warning that, without a process group, it saves or loads in a single process: we mean it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (load|save) in a single process.*")
        yield


def _load(path: str, metadata: dcp_metadata.Metadata, state_dict: dict[str, Any], *, collective: bool) -> None:
    try:
        with alone_is_intended():
            dcp.load(state_dict, storage_reader=_IndexedReader(path, metadata), no_dist=not collective)
    except (dcp.CheckpointException, RuntimeError, OSError, ValueError, AssertionError) as error:
        raise CheckpointError(f"Could not read the sharded checkpoint {path}: {error}") from error


def load_full_tensors(path: str, metadata: dcp_metadata.Metadata) -> dict[str, torch.Tensor]:
    """The module's whole tensors, read in this process alone (whatever number of ranks wrote them)."""
    tensors = {name: _empty(entry) for name, entry in _entries(metadata, MODEL_KEY).items()}
    _load(path, metadata, {MODEL_KEY: tensors}, collective=False)
    return tensors


@dataclasses.dataclass(frozen=True)
class ShardedSharedState:
    """The optimizer, scheduler and scaler state of a DCP checkpoint, read once the live parts exist.

    ``tree`` is optimizer.json's tree; its tensors are DCP entries under ``shared``. ``load`` reads them
    into the live run's own tensors where those are shards (FSDP2), else into whole tensors.
    """

    path: str
    tree: Any
    metadata: dcp_metadata.Metadata

    def __contains__(self, part: str) -> bool:
        return isinstance(self.tree, dict) and part in self.tree

    def load(self, live_tensors: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """The decoded tree; ``live_tensors``: this run's tensors by the same names (flatten_state's)."""
        live = live_tensors or {}
        templates: dict[str, torch.Tensor] = {}
        for name, entry in _entries(self.metadata, SHARED_KEY).items():
            target = live.get(name)
            if is_sharded_tensor(target) and tuple(target.shape) == tuple(entry.size):
                templates[name] = target.detach()
            else:
                templates[name] = _empty(entry)
        collective = any(is_sharded_tensor(tensor) for tensor in templates.values())
        if templates:
            _load(self.path, self.metadata, {SHARED_KEY: templates}, collective=collective)
        try:
            tree: dict[str, Any] = unflatten_state(self.tree, templates)
            return tree
        except (ValueError, TypeError) as error:
            raise CheckpointError(f"{self.path}/optimizer.json does not match its DCP tensors: {error}") from None


def file_digests(path: str, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{name: {"sha256", "size"}} of files in folder ``path``, read in chunks."""
    digests = {}
    for name in names:
        digest, size = hashlib.sha256(), 0
        with open(os.path.join(path, name), "rb") as stream:
            while chunk := stream.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
        digests[name] = {"sha256": digest.hexdigest(), "size": size}
    return digests
