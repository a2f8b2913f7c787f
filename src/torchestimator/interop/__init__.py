"""Readers of foreign weights behind one interface, and the layout converters warm start uses.

`open_weights(path)` recognises the format: our own checkpoints and model_dirs,
TensorFlow checkpoints (tensor bundle V2), safetensors, Keras HDF5 (legacy .h5,
Keras 3 .weights.h5 and .keras) and PyTorch state_dict files (.pt, .pth, .bin,
loaded with weights_only). Nothing here runs code from a file.

`keras_model(path)` goes further for a Keras model file (`.keras`, or an `.h5` saved with its model): the
architecture from the file's own config and its weights, as a plain torch module (`KerasModel`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchestimator.errors import KerasModelError
from torchestimator.interop.source import TensorInfo, TensorNotFoundError, WeightSource, WeightSourceError

if TYPE_CHECKING:  # imported on first use (h5py and the layer converters): `torchestimator --help` needs neither
    from torchestimator.interop.keras_graph import KerasModel as KerasModel, keras_model as keras_model

__all__ = [
    "FORMATS",
    "KerasModel",
    "KerasModelError",
    "TensorInfo",
    "TensorNotFoundError",
    "WeightSource",
    "WeightSourceError",
    "keras_model",
    "open_weights",
]


def _detectors() -> list[tuple[str, Callable[[str], bool], Callable[[str], WeightSource]]]:
    # Imported here so that reading a safetensors file does not need h5py, and so on.
    from torchestimator.interop import keras_h5, tf_checkpoint, torch_sources

    # Order matters: torch accepts any *.bin by name and Keras any *.h5, so the formats
    # recognised by content come first.
    return [
        ("torchestimator", torch_sources.is_torchestimator, torch_sources.open_torchestimator),
        ("tensorflow", tf_checkpoint.is_tensorflow, tf_checkpoint.open_tensorflow),
        ("safetensors", torch_sources.is_safetensors, torch_sources.open_safetensors),
        ("keras", keras_h5.is_keras_h5, keras_h5.open_keras_h5),
        ("torch", torch_sources.is_torch, torch_sources.open_torch),
    ]


FORMATS = ("torchestimator", "tensorflow", "safetensors", "keras", "torch")


def open_weights(path: str | os.PathLike[str]) -> WeightSource:
    """The weights at `path`, whatever the format; an error naming the path if none fits."""
    location = os.fspath(path)
    from torchestimator._io import filesystems

    if filesystems.is_url(location):
        from torchestimator.interop._remote import open_remote_weights

        return open_remote_weights(location, open_weights)
    location = filesystems.local_path(location)
    if not os.path.exists(location) and not os.path.exists(location + ".index"):
        raise WeightSourceError(f"{location}: no such file, directory or TensorFlow checkpoint prefix.")
    for _, detect, open_source in _detectors():
        if detect(location):
            return open_source(location)
    if os.path.isdir(location):
        raise WeightSourceError(
            f"{location} holds no checkpoint: no ckpt-<step> folder with a valid state.json and no TensorFlow "
            "'checkpoint' file pointing at an .index."
        )
    raise WeightSourceError(
        f"{location}: not a format torchestimator reads. Expected a model_dir or ckpt-<step> folder, a TensorFlow "
        "checkpoint (prefix, .index or a folder with a 'checkpoint' file), a .safetensors file, a Keras "
        ".h5/.weights.h5/.keras file, or a PyTorch .pt/.pth/.bin state_dict."
    )


def __getattr__(name: str) -> Any:
    if name in ("KerasModel", "keras_model"):
        from torchestimator.interop import keras_graph

        value = getattr(keras_graph, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
