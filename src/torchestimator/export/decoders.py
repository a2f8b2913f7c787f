"""Decode steps: how a receiver's string input (a batch of bytes) becomes the program's tensor inputs.

torch.export traces tensors. Serialized tf.Examples and encoded images are
bytes, and what reads them (the Example parser, Pillow) is Python or C that
cannot be traced, so they stay outside the program: a receiver with a string
input records a decode step, and the program is traced on the tensors that
step makes. The step is data, not code: ``to_json`` writes it into
signature.json (``decoders``: {string input: step}) and ``decoder_from_json``
rebuilds it from there with checked fields (unknown kinds or keys are an
ExportFormatError naming the file), so ``load``, ``predict --exported`` and
the server all run the same step, and nothing in an export runs code.

What belongs here: the steps (ExampleParsing, ImageDecode), their JSON forms,
and the FixedLenFeature <-> JSON mapping. Not here: the receivers that use
them (receiver.py), tracing (saved_model.py), running them on requests
(loader.py, serving/).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from torchestimator.errors import ExportFormatError

__all__ = ["STRING", "DecodeStep", "ExampleParsing", "ImageDecode", "decoder_from_json"]

STRING = "string"
"""The dtype name of string inputs (TF's DT_STRING): a 1-D batch of bytes values."""


class DecodeStep(abc.ABC):
    """One string input's decode step: ``decode(values)`` gives named arrays the program takes."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def outputs(self) -> dict[str, tuple[torch.dtype, tuple[int | None, ...]]]:
        """{program input name: (dtype, shape with None for the batch)} this step makes, in order."""

    @abc.abstractmethod
    def decode(self, values: Sequence[bytes], input_name: str) -> dict[str, np.ndarray]:
        """The arrays for a batch of bytes; a ValueError naming ``input_name`` and the instance when one is bad."""

    @abc.abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The step as data, for signature.json's ``decoders`` (``decoder_from_json`` reads it back)."""

    def describe(self) -> str:
        return f"{self.kind} -> " + ", ".join(
            f"{name!r}: {str(dtype).removeprefix('torch.')} {[-1 if size is None else size for size in shape]}"
            for name, (dtype, shape) in self.outputs().items()
        )


# -- tf.Example parsing -------------------------------------------------------------------

_EXAMPLE_DTYPES = {"float32": torch.float32, "int64": torch.int64}


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ExampleParsing(DecodeStep):
    """tf.io.parse_example on the batch: each FixedLenFeature becomes a program input [-1, *shape]."""

    kind: ClassVar[str] = "parse_example"
    features: Mapping[str, Any]
    """name -> FixedLenFeature (int64 or float32)."""

    def __post_init__(self) -> None:
        from torchestimator.data.feature_specs import FixedLenFeature

        if not isinstance(self.features, Mapping) or not self.features:
            raise ValueError(
                f"feature_spec must be a non-empty dict of name -> FixedLenFeature; received {self.features!r}."
            )
        for name, spec in self.features.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"feature_spec names must be non-empty strings; received {name!r}.")
            if not isinstance(spec, FixedLenFeature):
                raise ValueError(
                    f"feature_spec[{name!r}] is a {type(spec).__name__}; an exported program takes dense tensors "
                    "only, so a parsing receiver takes FixedLenFeature specs. A variable-length feature cannot cross "
                    f"into a torch.export program as it is: parse it as FixedLenFeature([N], dtype, "
                    "default_value=[...]) with a fixed N (pad the records to N values), or split it into fixed-size "
                    "features."
                )
            if spec.dtype not in _EXAMPLE_DTYPES:
                raise ValueError(
                    f"feature_spec[{name!r}] is a {spec.dtype} FixedLenFeature; exported programs take numeric "
                    "tensors only (torch has no string tensors). Store the feature as int64 ids or float32 values in "
                    "the Examples, or leave it out of the serving feature_spec."
                )
        object.__setattr__(self, "features", dict(self.features))

    def outputs(self) -> dict[str, tuple[torch.dtype, tuple[int | None, ...]]]:
        return {name: (_EXAMPLE_DTYPES[spec.dtype], (None, *spec.shape)) for name, spec in self.features.items()}

    def decode(self, values: Sequence[bytes], input_name: str) -> dict[str, np.ndarray]:
        from torchestimator.data.parsing import parse_example

        # The parser's errors keep TF's wording and name the record (its index in this batch).
        parsed = parse_example(values, self.features)
        return {name: parsed[name] for name in self.features}

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "features": {name: fixed_len_feature_to_json(spec) for name, spec in self.features.items()},
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any], where: str) -> ExampleParsing:
        _check_keys(document, {"kind", "features"}, where)
        features = document["features"]
        if not isinstance(features, dict) or not features:
            raise ExportFormatError(f"{where}: 'features' must be a non-empty object of name -> FixedLenFeature.")
        specs = {
            name: fixed_len_feature_from_json(value, f"{where}: features[{name!r}]") for name, value in features.items()
        }
        try:
            return cls(features=specs)
        except ValueError as error:
            raise ExportFormatError(f"{where}: {error}") from None


def fixed_len_feature_to_json(spec: Any) -> dict[str, Any]:
    """{"type": "FixedLenFeature", "shape", "dtype", "default_value": flat list or null}."""
    default = getattr(spec, "_default", None)  # the spec's own checked, flattened default (None: required)
    return {
        "type": "FixedLenFeature",
        "shape": list(spec.shape),
        "dtype": spec.dtype,
        "default_value": None if default is None else default.tolist(),
    }


def fixed_len_feature_from_json(document: Any, where: str) -> Any:
    from torchestimator.data.feature_specs import FixedLenFeature

    _check_keys(document, {"type", "shape", "dtype", "default_value"}, where)
    if document["type"] != "FixedLenFeature":
        raise ExportFormatError(
            f"{where}: type {document['type']!r} is not FixedLenFeature, the only spec an export's parsing step holds."
        )
    shape, dtype, default = document["shape"], document["dtype"], document["default_value"]
    if not isinstance(shape, list) or not all(type(size) is int and size >= 0 for size in shape):
        raise ExportFormatError(f"{where}: shape must be a list of non-negative integers; it is {str(shape)[:80]}.")
    if dtype not in _EXAMPLE_DTYPES:
        raise ExportFormatError(f"{where}: dtype must be one of {sorted(_EXAMPLE_DTYPES)}; it is {str(dtype)[:40]!r}.")
    if default is not None and not (
        isinstance(default, list)
        and len(default) == math.prod(shape)
        and all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in default)
    ):
        raise ExportFormatError(f"{where}: default_value must be null or a flat list of {math.prod(shape)} numbers.")
    try:
        return FixedLenFeature(shape, dtype, default_value=None if default is None else np.reshape(default, shape))
    except (TypeError, ValueError) as error:
        raise ExportFormatError(f"{where}: {error}") from None


# -- images -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ImageDecode(DecodeStep):
    """Encoded PNG/JPEG/GIF/BMP bytes -> one float32 image tensor per instance, as ``decoding`` says."""

    kind: ClassVar[str] = "decode_image"
    decoding: Any
    """A torchestimator.data.ImageDecoding (channels, size, resize method, layout, scale)."""
    feature_name: str = "image"
    """The program input (and feature) the images become."""

    def __post_init__(self) -> None:
        from torchestimator.data.images import ImageDecoding

        if not isinstance(self.decoding, ImageDecoding):
            raise TypeError(
                f"decoding must be a torchestimator.data.ImageDecoding(size=..., channels=...); received "
                f"{self.decoding!r}."
            )
        if not isinstance(self.feature_name, str) or not self.feature_name:
            raise ValueError(f"feature_name must be a non-empty string; received {self.feature_name!r}.")
        if not self.decoding.channels:
            raise ValueError(
                "An image receiver needs a fixed channel count (ImageDecoding(channels=1, 3 or 4)): "
                "channels=0 keeps each file's own, and one batch of a program input has one shape."
            )

    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.decoding.shape)

    def outputs(self) -> dict[str, tuple[torch.dtype, tuple[int | None, ...]]]:
        return {self.feature_name: (torch.float32, (None, *self.image_shape()))}

    def decode(self, values: Sequence[bytes], input_name: str) -> dict[str, np.ndarray]:
        images = np.empty((len(values), *self.image_shape()), np.float32)
        for index, contents in enumerate(values):  # one at a time: an error names the instance
            images[index] = self.decoding.decode(contents, where=f"input {input_name!r}, instance {index}")
        return {self.feature_name: images}

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "feature_name": self.feature_name, "decoding": self.decoding.to_json()}

    @classmethod
    def from_json(cls, document: Mapping[str, Any], where: str) -> ImageDecode:
        from torchestimator.data.images import ImageDecoding

        _check_keys(document, {"kind", "feature_name", "decoding"}, where)
        if not isinstance(document["decoding"], dict):
            raise ExportFormatError(f"{where}: 'decoding' must be an object (ImageDecoding.to_json()).")
        try:
            decoding = ImageDecoding.from_json(document["decoding"], where=f"{where}: decoding")
            return cls(decoding=decoding, feature_name=document["feature_name"])
        except ExportFormatError:
            raise
        except (TypeError, ValueError) as error:
            raise ExportFormatError(f"{where}: {error}") from None


_KINDS: dict[str, Callable[[Mapping[str, Any], str], DecodeStep]] = {
    ExampleParsing.kind: ExampleParsing.from_json,
    ImageDecode.kind: ImageDecode.from_json,
}
"""Each step's kind and its reader."""


def decoder_from_json(document: Any, where: str) -> DecodeStep:
    """The step a signature.json ``decoders`` entry describes; ExportFormatError (``where`` names the file) if
    it is not one this torchestimator knows, field for field."""
    if not isinstance(document, dict):
        raise ExportFormatError(f"{where} must be an object with a 'kind'; it is {type(document).__name__}.")
    kind = document.get("kind")
    read = _KINDS.get(kind) if isinstance(kind, str) else None
    if read is None:
        raise ExportFormatError(
            f"{where}: unknown decode step kind {str(kind)[:40]!r}; this torchestimator knows "
            f"{sorted(_KINDS)}. Re-export with this version or upgrade torchestimator."
        )
    return read(document, where)


def _check_keys(document: Any, keys: set[str], where: str) -> None:
    if not isinstance(document, dict):
        raise ExportFormatError(f"{where} must be an object; it is {type(document).__name__}.")
    unknown, missing = sorted(set(document) - keys), sorted(keys - set(document))
    if unknown or missing:
        raise ExportFormatError(
            f"{where}: unknown keys {unknown[:8]}, missing keys {missing}; expected exactly {sorted(keys)}."
        )
