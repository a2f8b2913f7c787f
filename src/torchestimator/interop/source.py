"""The common interface of every weight reader under `torchestimator.interop`.

What belongs here: `TensorInfo` (what a source holds, without reading values),
the `WeightSource` base class every format reader implements, and the errors
they raise (defined in `torchestimator.errors`, re-exported here). What does
not: any file format (one module per format, each offering `open_<format>(path)`
and `is_<format>(path)`), and anything that maps names onto a model (warm start).
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import zipfile
from collections.abc import Iterable
from typing import Any

import numpy

# Defined with every public error in torchestimator.errors; re-exported here, where readers import them from.
from torchestimator.errors import TensorNotFoundError, WeightSourceError

__all__ = [
    "ZIP_ERRORS",
    "TensorInfo",
    "TensorNotFoundError",
    "WeightSource",
    "WeightSourceError",
    "missing_tensor_error",
]

# What zipfile raises on a damaged archive: besides BadZipFile, undecodable names (ValueError), short
# reads (EOFError), unknown compression methods (NotImplementedError).
ZIP_ERRORS = (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a weight source, as listed without reading its values."""

    name: str  # the name in the source, e.g. "dense/kernel", "layer_with_weights-0/kernel", "net.0.weight"
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "float32", "int64", ...; "string" for TF string tensors


def missing_tensor_error(path: str, name: str, names: Iterable[str]) -> TensorNotFoundError:
    """Build the error for a missing tensor, naming the closest names the source does hold."""
    known = list(names)
    nearest = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    if not nearest:
        nearest = sorted(known)[:5]
    hint = f" Nearest names: {', '.join(nearest)}." if nearest else " The source holds no tensors."
    return TensorNotFoundError(
        f"{path}: no tensor named {name!r} ({len(known)} tensors in the file).{hint} Use tensors() to list every name."
    )


class WeightSource(abc.ABC):
    """A read-only set of named tensors from one file or checkpoint."""

    path: str  # what the user gave
    format: str  # "torchestimator", "torch", "safetensors", "keras_h5", "keras3_weights_h5", "tensorflow"

    @abc.abstractmethod
    def tensors(self) -> list[TensorInfo]:
        """Every tensor, sorted by name; reads headers/index only, never values."""

    @abc.abstractmethod
    def read(self, name: str) -> numpy.ndarray:
        """The values of one tensor; `TensorNotFoundError` (a KeyError) naming the nearest names if absent."""

    def read_all(self) -> dict[str, numpy.ndarray]:
        """Every tensor's values, by name."""
        return {info.name: self.read(info.name) for info in self.tensors()}

    def layer_config(self, name: str) -> dict[str, Any] | None:
        """The recorded config of the layer holding tensor `name` (Keras files with a model config give
        ``{"class_name": ..., "config": {...}}``); None where the format records none, as by default."""
        return None

    def close(self) -> None:  # noqa: B027 (optional: most sources hold no file)
        """Release open files; the default holds none."""

    def __enter__(self) -> WeightSource:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={getattr(self, 'path', '?')!r}, format={getattr(self, 'format', '?')!r})"
