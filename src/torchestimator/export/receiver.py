"""What a served model receives: named input specs and an optional transform to features.

This is the counterpart of tf.estimator's ServingInputReceiver, declared as
specs rather than placeholders: each receiver input has a dtype and a shape
whose ``None`` entries are dynamic (the first one is the batch dimension).
Tracing and writing the export lives in saved_model.py; reading it back in
loader.py.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["ServingInputReceiver", "TensorSpec", "dtype_name", "parse_dtype", "serving_input_receiver"]

# The size given to dynamic dimensions in example inputs: torch.export specialises sizes 0 and 1.
EXAMPLE_DYNAMIC_SIZE = 2

ReceiverFn = Callable[[dict[str, torch.Tensor]], Any]


def parse_dtype(dtype: Any, where: str) -> torch.dtype:
    """A torch dtype from a torch dtype or a name such as "float32"."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        candidate = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(candidate, torch.dtype):
            return candidate
    raise TypeError(f"{where} must be a torch dtype such as torch.float32 or a name such as 'float32'; received {dtype!r}.")


def dtype_name(dtype: torch.dtype) -> str:
    """The name written to signature.json: torch's, without the 'torch.' prefix (matches numpy's where one exists)."""
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """The dtype and shape of one receiver input."""

    shape: tuple[int | None, ...]
    """Sizes per dimension; None is dynamic. A leading None is the batch dimension, shared by all inputs."""
    dtype: torch.dtype = torch.float32
    """A torch dtype, or its name ("float32", "int64")."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", parse_dtype(self.dtype, "TensorSpec.dtype"))
        if isinstance(self.shape, (str, bytes)) or not hasattr(self.shape, "__iter__"):
            raise TypeError(f"TensorSpec.shape must be a tuple of sizes (None for dynamic); received {self.shape!r}.")
        shape = tuple(self.shape)
        for size in shape:
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
                raise ValueError(
                    f"TensorSpec.shape entries must be non-negative ints or None (dynamic); received {shape!r}."
                )
        object.__setattr__(self, "shape", shape)

    def signature_shape(self) -> list[int]:
        """The shape as signature.json writes it: -1 for dynamic sizes."""
        return [-1 if size is None else size for size in self.shape]

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)} {tuple(self.signature_shape())}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingInputReceiver:
    """The inputs an exported model takes, and how they become model_fn's features.

    Without ``receiver_fn`` the features are the dict of receiver tensors.
    ``receiver_fn`` maps that dict to features (a dict of tensors or a tensor);
    it is traced into the exported program, so it must be torch code (no numpy,
    no Python branching on tensor values).
    """

    receiver_tensors: Mapping[str, TensorSpec]
    receiver_fn: ReceiverFn | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.receiver_tensors, Mapping) or not self.receiver_tensors:
            raise ValueError(
                "ServingInputReceiver.receiver_tensors must be a non-empty dict of name -> TensorSpec; "
                f"received {self.receiver_tensors!r}."
            )
        for name, spec in self.receiver_tensors.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"Receiver input names must be non-empty strings; received {name!r}.")
            if not isinstance(spec, TensorSpec):
                raise TypeError(
                    f"Receiver input {name!r} must be a TensorSpec(shape=..., dtype=...); received {spec!r}."
                )
        if self.receiver_fn is not None and not callable(self.receiver_fn):
            raise TypeError(f"receiver_fn must be callable (dict of tensors -> features); received {self.receiver_fn!r}.")
        object.__setattr__(self, "receiver_tensors", dict(self.receiver_tensors))

    def example_inputs(self) -> dict[str, torch.Tensor]:
        """Tensors matching the specs, dynamic sizes set to 2; integer inputs are zeros (valid as indices)."""
        examples = {}
        for name, spec in self.receiver_tensors.items():
            shape = [EXAMPLE_DYNAMIC_SIZE if size is None else size for size in spec.shape]
            if spec.dtype.is_floating_point or spec.dtype.is_complex:
                # A fixed generator: exporting twice traces the same values.
                generator = torch.Generator().manual_seed(0)
                examples[name] = torch.randn(shape, generator=generator).to(spec.dtype)
            else:
                examples[name] = torch.zeros(shape, dtype=spec.dtype)
        return examples

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        """torch.export dynamic shapes: every leading None shares one batch Dim; other Nones get their own."""
        batch = torch.export.Dim("batch")
        shapes: dict[str, dict[int, Any]] = {}
        for index, (name, spec) in enumerate(self.receiver_tensors.items()):
            dims = {}
            for axis, size in enumerate(spec.shape):
                if size is None:
                    dims[axis] = batch if axis == 0 else torch.export.Dim(_dim_name(name, index, axis))
            shapes[name] = dims
        return shapes

    def features(self, receiver_tensors: dict[str, torch.Tensor]) -> Any:
        return receiver_tensors if self.receiver_fn is None else self.receiver_fn(receiver_tensors)

    def describe(self) -> str:
        return ", ".join(f"{name!r}: {spec.describe()}" for name, spec in self.receiver_tensors.items())


def serving_input_receiver(
    receiver_tensors: Mapping[str, TensorSpec | tuple[Any, ...]],
    receiver_fn: ReceiverFn | None = None,
) -> ServingInputReceiver:
    """A ServingInputReceiver from {name: TensorSpec} (or {name: (shape, dtype)})."""
    if not isinstance(receiver_tensors, Mapping):
        raise TypeError(f"receiver_tensors must be a dict of name -> TensorSpec; received {receiver_tensors!r}.")
    specs = {}
    for name, spec in receiver_tensors.items():
        if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[0], (int, type(None))):
            spec = TensorSpec(shape=spec[0], dtype=spec[1])
        specs[name] = spec
    return ServingInputReceiver(receiver_tensors=specs, receiver_fn=receiver_fn)


def as_receiver(value: Any) -> ServingInputReceiver:
    """Accepts a receiver, or a zero-argument function returning one (TF's serving_input_receiver_fn)."""
    if value is None:
        raise ValueError("A serving input receiver is required: te.export.serving_input_receiver({'x': TensorSpec(...)}).")
    if isinstance(value, ServingInputReceiver):
        return value
    if callable(value):
        built = value()
        if isinstance(built, ServingInputReceiver):
            return built
        raise TypeError(f"serving_input_receiver_fn must return a ServingInputReceiver; it returned {built!r}.")
    raise TypeError(
        f"serving_input_receiver must be a ServingInputReceiver (or a function returning one); received {value!r}."
    )


def _dim_name(name: str, index: int, axis: int) -> str:
    # Dim names must be identifiers; the index keeps two inputs that sanitise alike apart.
    return f"{re.sub(r'[^0-9a-zA-Z_]', '_', name)}_{index}_axis{axis}"
