"""Weight sources for PyTorch-world files: our own checkpoints, torch state_dict files, safetensors.

What belongs here: ``open_torchestimator``/``is_torchestimator`` (a ``ckpt-<step>``
folder or a ``model_dir``), ``open_torch``/``is_torch`` (``.pt``/``.pth``/``.bin``
state dicts, read with ``torch.load(weights_only=True)``) and
``open_safetensors``/``is_safetensors``. Names are state_dict keys. What does
not: TensorFlow/Keras formats, name mapping, applying weights.

Nothing here runs code from a file: ``torch.load`` is always called with
``weights_only=True``; a file that needs more than tensors and plain
containers is refused.

Nested torch files (Lightning's ``{"state_dict": ...}``, training scripts'
``{"model": ..., "optimizer": ..., "epoch": ...}``) are reduced to one state
dict by this rule, and the choice is recorded in ``source.notes``:

1. every top-level value is a tensor: the file is the state dict;
2. else, if exactly one top-level value is a dict of tensors, that one;
3. else, if several are, the one under ``state_dict``, ``model_state_dict`` or
   ``model`` when exactly one of those keys holds such a dict;
4. else every tensor at any depth, named by its dotted path
   (``"ema.layer.weight"``), so nothing is hidden.

``open_torch(path, key="ema")`` picks a top-level entry explicitly.
"""

from __future__ import annotations

import abc
import io
import json
import logging
import os
import pickle
import re
import struct
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy
import torch
from safetensors import SafetensorError, safe_open

from .._io import filesystems
from ..checkpoint import CheckpointError, CheckpointStore
from ..checkpoint.parts import owning_memory
from ..checkpoint.tensor_files import DTYPE_NAMES, MAX_HEADER_BYTES
from .source import ZIP_ERRORS, TensorInfo, WeightSource, WeightSourceError, missing_tensor_error

__all__ = [
    "SafetensorsSource",
    "TorchFileSource",
    "TorchestimatorSource",
    "is_safetensors",
    "is_torch",
    "is_torchestimator",
    "open_safetensors",
    "open_torch",
    "open_torchestimator",
]

logger = logging.getLogger(__name__)

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
PREFERRED_KEYS = ("state_dict", "model_state_dict", "model")
_CHECKPOINT_FOLDER = re.compile(r"ckpt-\d+")
_ZIP_MAGIC = b"PK\x03\x04"
# The legacy (pre-zip) torch.save format opens with a pickled long: torch's magic number 0x1950a86a20f9469cfc6c.
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_WIDENED_DTYPES = tuple(
    getattr(torch, name) for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)
)


def _to_numpy(tensor: torch.Tensor) -> numpy.ndarray:
    # numpy has no bfloat16/float8: widen to float32, which holds those values exactly.
    if tensor.dtype in _WIDENED_DTYPES:
        tensor = tensor.float()
    return tensor.detach().cpu().contiguous().numpy()


class _TensorDictSource(WeightSource):
    """A source whose tensors are already in a dict (loaded lazily by the subclass)."""

    def __init__(self, path: str, format: str) -> None:
        self.path = path
        self.format = format
        self.notes: list[str] = []
        """What was chosen or left out while reading, for the warm-start report."""

    @abc.abstractmethod
    def _state(self) -> Mapping[str, torch.Tensor]:
        """The whole state dict (loaded once, on first use)."""

    def tensors(self) -> list[TensorInfo]:
        return [
            TensorInfo(name=name, shape=tuple(tensor.shape), dtype=_dtype_name(tensor.dtype))
            for name, tensor in sorted(self._state().items())
        ]

    def read(self, name: str) -> numpy.ndarray:
        state = self._state()
        if name not in state:
            raise missing_tensor_error(self.path, name, state)
        return _to_numpy(state[name])


# ------------------------------------------------------------ our checkpoints


def is_torchestimator(path: str | os.PathLike[str]) -> bool:
    """True for a ``ckpt-<step>`` folder, or a directory with a checkpoint manifest or ``ckpt-*`` folders."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return False
    if _CHECKPOINT_FOLDER.fullmatch(os.path.basename(os.path.normpath(path))):
        return os.path.isfile(os.path.join(path, "state.json"))
    manifest = os.path.join(path, "checkpoint")
    if os.path.isfile(manifest):
        try:
            with open(manifest, "rb") as file:
                return file.read(1) == b"{"  # ours is JSON; TF's `checkpoint` file is a text proto
        except OSError:
            return False
    return any(_CHECKPOINT_FOLDER.fullmatch(entry) for entry in os.listdir(path))


class TorchestimatorSource(_TensorDictSource):
    """The model tensors of one of our checkpoints; optimizer state is never exposed."""

    def __init__(self, path: str, checkpoint_path: str, step: int) -> None:
        super().__init__(path, "torchestimator")
        self.checkpoint_path = checkpoint_path
        self.step = step
        self._store = CheckpointStore(
            filesystems.parent(checkpoint_path.rstrip("/"))
            if filesystems.is_url(checkpoint_path)
            else os.path.dirname(os.path.normpath(checkpoint_path)),
            keep_checkpoint_max=None,
        )
        self._loaded: dict[str, torch.Tensor] | None = None

    def tensors(self) -> list[TensorInfo]:
        if self._loaded is not None:
            return super().tensors()
        try:
            variables = self._store.list_variables(self.checkpoint_path)
        except CheckpointError as error:
            raise WeightSourceError(f"{self.checkpoint_path}: cannot list the tensors: {error}") from None
        return [
            TensorInfo(
                name=name,
                shape=tuple(shape),
                dtype=_dtype_name(dtype) if isinstance(dtype, torch.dtype) else str(dtype).lower(),
            )
            for name, shape, dtype in variables
        ]

    def _state(self) -> Mapping[str, torch.Tensor]:
        if self._loaded is None:
            try:
                checkpoint = self._store.restore(self.checkpoint_path, load_optimizer=False)
            except CheckpointError as error:
                raise WeightSourceError(f"{self.checkpoint_path}: cannot read the checkpoint: {error}") from None
            # Copied out of the mapped files: a source (and the tensors it hands out) may be kept for long.
            self._loaded = owning_memory(dict(checkpoint.model_state))
        return self._loaded


def open_torchestimator(path: str | os.PathLike[str]) -> TorchestimatorSource:
    """Our checkpoint ``.../ckpt-<step>``, or the newest checkpoint of a ``model_dir``."""
    given = os.fspath(path)
    normalized = os.path.normpath(given)
    if not os.path.exists(normalized):
        raise WeightSourceError(f"{given}: no such file or directory; expected a model_dir or a ckpt-<step> folder.")
    if not os.path.isdir(normalized):
        raise WeightSourceError(
            f"{given} is a file; a torchestimator checkpoint is a model_dir or a ckpt-<step> folder."
        )
    if _CHECKPOINT_FOLDER.fullmatch(os.path.basename(normalized)):
        checkpoint_path = normalized
    else:
        try:
            latest = CheckpointStore(normalized, keep_checkpoint_max=None).latest_checkpoint()
        except (CheckpointError, OSError) as error:
            raise WeightSourceError(f"{given}: cannot list its checkpoints: {error}") from None
        if latest is None:
            raise WeightSourceError(
                f"{given} holds no checkpoint (no ckpt-<step> folder with a valid state.json). "
                "Pass a model_dir that has been trained, or the path of a ckpt-<step> folder."
            )
        checkpoint_path = latest
    step = int(os.path.basename(checkpoint_path).removeprefix("ckpt-"))
    if not os.path.isfile(os.path.join(checkpoint_path, "state.json")):
        raise WeightSourceError(f"{checkpoint_path} is not a complete checkpoint: state.json is missing.")
    logger.info("Reading weights from checkpoint %s (step %d).", checkpoint_path, step)
    return TorchestimatorSource(given, checkpoint_path, step)


# ---------------------------------------------------------- torch state dicts


def is_torch(path: str | os.PathLike[str]) -> bool:
    """True for a torch.save file: a zip archive holding ``data.pkl``, a legacy pickle, or a .pt/.pth/.bin name."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    head = b""
    try:
        with open(path, "rb") as file:
            head = file.read(len(_LEGACY_TORCH_MAGIC))
        if head.startswith(_ZIP_MAGIC):
            with zipfile.ZipFile(path) as archive:
                return any(name.endswith("data.pkl") for name in archive.namelist())
    except ZIP_ERRORS:
        pass
    # The suffix catches damaged files, so that the user gets a torch-specific error, not "unknown format".
    return head == _LEGACY_TORCH_MAGIC or path.lower().endswith(TORCH_SUFFIXES)


class TorchFileSource(_TensorDictSource):
    """The state dict in a torch.save file, loaded once (memory-mapped where the format allows)."""

    def __init__(
        self, path: str, state: dict[str, torch.Tensor], notes: list[str], key: str | None, file_size: int
    ) -> None:
        super().__init__(path, "torch")
        self._tensors = state
        self._file_size = file_size
        self.notes = notes
        self.key = key
        """The top-level entry the state dict came from; None for a plain state dict or a flattened file."""

    def _state(self) -> Mapping[str, torch.Tensor]:
        return self._tensors

    def read(self, name: str) -> numpy.ndarray:
        tensor = self._tensors.get(name)
        if tensor is not None and tensor.numel() * tensor.element_size() > self._file_size:
            # Zero or overlapping strides let a few stored bytes declare any size; copying would allocate it.
            raise WeightSourceError(
                f"{self.path}: tensor {name!r} of shape {list(tensor.shape)} would take "
                f"{tensor.numel() * tensor.element_size()} bytes, more than the whole file ({self._file_size} "
                "bytes): its strides repeat stored values (an expanded view) or the file is crafted. Save a "
                "contiguous copy (tensor.contiguous()) instead."
            )
        return super().read(name)


def open_torch(path: str | os.PathLike[str], *, key: str | None = None) -> TorchFileSource:
    """A PyTorch state dict file; nested files are reduced by the module's rule, or by ``key``."""
    given = os.fspath(path)
    content = _load_torch_file(given)
    if isinstance(content, torch.Tensor) or not isinstance(content, Mapping):
        raise WeightSourceError(
            f"{given} holds a {type(content).__name__}, not a dict of tensors. Save the weights with "
            "torch.save(model.state_dict(), path)."
        )
    if key is not None:
        if key not in content or not isinstance(content[key], Mapping):
            dicts = [str(name) for name, value in content.items() if isinstance(value, Mapping)]
            raise WeightSourceError(
                f"{given}: key={key!r} is not a dict in the file; its dict entries are {dicts or 'none'}."
            )
        state, notes = _flatten_tensors(content[key], given, prefix="")
        notes.insert(0, f"Used the state dict under the top-level key {key!r}, as requested.")
    else:
        state, notes, key = _select_state_dict(content, given)
    if not state:
        raise WeightSourceError(f"{given} holds no tensors; expected a state dict (torch.save(model.state_dict())).")
    for note in notes:
        logger.info("%s: %s", given, note)
    return TorchFileSource(given, state, notes, key, os.path.getsize(given))


def _load_torch_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise WeightSourceError(f"{path}: no such file; expected a PyTorch state dict (.pt, .pth or .bin).")
    _check_zip_sizes(path)
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            # Only the zip format can be memory-mapped; the legacy format loads into memory.
            if "mmap" not in str(error):
                raise
            with _BoundedFile(io.FileIO(path, "rb")) as file:
                return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise WeightSourceError(
            f"{path}: the file holds pickled objects beyond tensors and plain containers ({_unpickler_reason(error)}); "
            "loading them could run code from the file, so it is refused. Re-save the weights alone with "
            "torch.save(model.state_dict(), path), or as safetensors."
        ) from None
    # torch's weights-only unpickler lets a damaged stream surface as a missing memo entry (KeyError),
    # a short struct (struct.error), a bad opcode argument (TypeError, IndexError, AssertionError).
    except (RuntimeError, KeyError, IndexError, TypeError, AssertionError, struct.error, *ZIP_ERRORS) as error:
        raise WeightSourceError(
            f"{path} is not a readable PyTorch file (truncated or corrupt?): {type(error).__name__}: {error}"
        ) from None


def _check_zip_sizes(path: str) -> None:
    """Refuse a torch zip whose records declare more bytes than the file holds, before torch inflates any.

    torch.save stores records uncompressed, so their sizes add up to less than
    the file. torch's reader inflates a deflated record (data.pkl included)
    into memory whole, so a 1 MB file could otherwise allocate 1 GB.
    """
    try:
        with open(path, "rb") as file:
            if file.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                return
            size = os.fstat(file.fileno()).st_size
            with zipfile.ZipFile(file) as archive:
                members = archive.infolist()
    except ZIP_ERRORS as error:
        raise WeightSourceError(f"{path} is not a readable PyTorch file (corrupt zip archive?): {error}") from None
    declared = sum(member.file_size for member in members)
    if declared > size:
        largest = max(members, key=lambda member: member.file_size)
        raise WeightSourceError(
            f"{path}: its zip records declare {declared} bytes uncompressed, more than the whole file ({size} "
            f"bytes; largest: {largest.filename!r}, {largest.file_size} bytes from {largest.compress_size} "
            "compressed). torch.save stores records uncompressed; the file is crafted or was re-compressed. "
            "Re-save it with torch.save."
        )


class _BoundedFile(io.BufferedReader):
    """A file whose ``read(n)`` asks for no more than what remains.

    The legacy format's pickles are read straight from the file, and a corrupt
    string length in them would otherwise become a buffer of that many bytes.
    """

    def __init__(self, raw: io.FileIO) -> None:
        super().__init__(raw)
        self._size = os.fstat(raw.fileno()).st_size

    def read(self, size: int | None = -1) -> bytes:
        if size is not None and size > 0:
            size = max(0, min(size, self._size - self.tell()))
        return super().read(size)


def _unpickler_reason(error: pickle.UnpicklingError) -> str:
    # torch's message is long advice about weights_only=False, which we must not follow; keep its diagnosis.
    for line in str(error).splitlines():
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip().split(" was not an allowed", 1)[0]
    return str(error).splitlines()[0] if str(error) else "unpickling refused"


def _is_tensor_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())


def _select_state_dict(content: Mapping[Any, Any], path: str) -> tuple[dict[str, torch.Tensor], list[str], str | None]:
    if all(isinstance(value, torch.Tensor) for value in content.values()):
        return {str(name): value for name, value in content.items()}, [], None
    candidates = [name for name, value in content.items() if _is_tensor_dict(value)]
    chosen = None
    if len(candidates) == 1:
        chosen = candidates[0]
    elif len(candidates) > 1:
        preferred = [name for name in candidates if name in PREFERRED_KEYS]
        chosen = preferred[0] if len(preferred) == 1 else None
    if chosen is not None:
        others = sorted(str(name) for name in content if name != chosen)
        note = f"The file is a {len(content)}-entry dict; used the state dict under {chosen!r}"
        note += f" and ignored {', '.join(others)}." if others else "."
        return {str(name): value for name, value in content[chosen].items()}, [note], str(chosen)
    state, notes = _flatten_tensors(content, path, prefix="")
    notes.insert(
        0,
        f"No single state dict in the file (dicts of tensors: {[str(c) for c in candidates] or 'none'}); "
        "every tensor is named by its dotted path. Use open_torch(path, key=...) to pick one entry.",
    )
    return state, notes, None


def _flatten_tensors(tree: Any, path: str, *, prefix: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    state: dict[str, torch.Tensor] = {}
    skipped: list[str] = []

    def visit(value: Any, name: str) -> None:
        if isinstance(value, torch.Tensor):
            state[name] = value
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, f"{name}.{key}" if name else str(key))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(item, f"{name}.{index}" if name else str(index))
        else:
            skipped.append(name)

    visit(tree, prefix)
    notes = [f"Ignored {len(skipped)} non-tensor entries: {', '.join(skipped[:10])}."] if skipped else []
    return state, notes


# ------------------------------------------------------------------ safetensors


def is_safetensors(path: str | os.PathLike[str]) -> bool:
    """True for a ``.safetensors`` name, or a file opening with a little-endian length then a JSON ``{``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        return False
    if path.lower().endswith(".safetensors"):
        return True
    try:
        with open(path, "rb") as file:
            head = file.read(9)
        size = os.path.getsize(path)
    except OSError:
        return False
    if len(head) < 9:
        return False
    (header_size,) = struct.unpack("<Q", head[:8])
    return head[8:9] == b"{" and 8 + header_size <= size and header_size <= MAX_HEADER_BYTES


class SafetensorsSource(WeightSource):
    """A safetensors file, opened once: the header lists tensors, values are read one at a time.

    The file stays open (memory-mapped by safetensors) until `close()`, so a read
    costs one copy, not a re-parse of the header: with 20k tensors, re-opening
    per read made reading every tensor quadratic.
    """

    def __init__(self, path: str, handle: Any, header: dict[str, Any]) -> None:
        self.path = path
        self.format = "safetensors"
        self.notes: list[str] = []
        self.metadata: dict[str, str] = dict(header.pop("__metadata__", None) or {})
        self._header = header
        self._handle: Any = handle

    def tensors(self) -> list[TensorInfo]:
        return [
            TensorInfo(
                name=name,
                shape=tuple(entry["shape"]),
                dtype=DTYPE_NAMES.get(entry["dtype"], str(entry["dtype"]).lower()),
            )
            for name, entry in sorted(self._header.items())
        ]

    def read(self, name: str) -> numpy.ndarray:
        if name not in self._header:
            raise missing_tensor_error(self.path, name, self._header)
        if self._handle is None:
            raise WeightSourceError(f"{self.path}: the source is closed; open it again to read {name!r}.")
        try:
            return _to_numpy(self._handle.get_tensor(name))
        except (SafetensorError, OSError, RuntimeError, TypeError) as error:
            raise WeightSourceError(f"{self.path}: cannot read tensor {name!r}: {error}") from None

    def close(self) -> None:
        # safe_open has no close(); leaving its context unmaps the file.
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.__exit__(None, None, None)


def open_safetensors(path: str | os.PathLike[str]) -> SafetensorsSource:
    """A safetensors file; its header is read and checked now, values on demand, until the source is closed."""
    given = os.fspath(path)
    if not os.path.isfile(given):
        raise WeightSourceError(f"{given}: no such file; expected a .safetensors file.")
    handle = None
    try:
        # safe_open checks the header against the file: sizes, offsets, overlaps, shape x dtype overflow.
        handle = safe_open(given, framework="pt")
        with open(given, "rb") as file:
            (header_size,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(header_size).decode("utf-8"))
    except (SafetensorError, OSError, struct.error, UnicodeDecodeError, json.JSONDecodeError) as error:
        if handle is not None:
            handle.__exit__(None, None, None)
        raise WeightSourceError(
            f"{given} is not a readable safetensors file (truncated or corrupt?): {type(error).__name__}: {error}"
        ) from None
    if not isinstance(header, dict):
        handle.__exit__(None, None, None)
        raise WeightSourceError(f"{given}: the safetensors header is not a JSON object.")
    return SafetensorsSource(given, handle, header)
