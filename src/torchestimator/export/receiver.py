"""What a served model receives: named input specs and an optional transform to features.

This is the counterpart of tf.estimator's ServingInputReceiver, declared as
specs rather than placeholders: each receiver input has a dtype and a shape
whose ``None`` entries are dynamic (the first one is the batch dimension).
A string input (dtype "string", shape (None,): a batch of bytes, TF's
DT_STRING) comes with a decode step (decoders.py) that turns it into tensors
outside the program; the program is traced on those tensors
(``program_specs``). The two receivers TF users know are built here:
``build_parsing_serving_input_receiver`` (serialized tf.Examples) and
``build_image_serving_input_receiver`` (encoded images). TF's own call forms,
which return a serving_input_receiver_fn, are here too under TF's names
(``build_parsing_serving_input_receiver_fn``, ``build_raw_serving_input_receiver_fn``).
Tracing and writing the export lives in saved_model.py; reading it back in loader.py.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from torchestimator._tf_names import accepts_tf_arguments
from torchestimator.export.decoders import STRING, DecodeStep, ExampleParsing, ImageDecode

__all__ = [
    "ServingInputReceiver",
    "TensorSpec",
    "build_image_serving_input_receiver",
    "build_parsing_serving_input_receiver",
    "build_parsing_serving_input_receiver_fn",
    "build_raw_serving_input_receiver_fn",
    "dtype_name",
    "parse_dtype",
    "serving_input_receiver",
]

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
    raise TypeError(
        f"{where} must be a torch dtype such as torch.float32 or a name such as 'float32'; received {dtype!r}."
    )


def dtype_name(dtype: torch.dtype | str) -> str:
    """The name written to signature.json: torch's, without the 'torch.' prefix (matches numpy's where one exists);
    "string" for string inputs."""
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """The dtype and shape of one receiver input."""

    shape: tuple[int | None, ...]
    """Sizes per dimension; None is dynamic. A leading None is the batch dimension, shared by all inputs."""
    dtype: torch.dtype | str = torch.float32
    """A torch dtype, or its name ("float32", "int64"); "string" (or bytes) for a batch of bytes values, which
    needs shape (None,) and a decode step (the receivers built by build_*_serving_input_receiver)."""

    def __post_init__(self) -> None:
        if self.dtype in (STRING, bytes, str):
            object.__setattr__(self, "dtype", STRING)
        else:
            object.__setattr__(self, "dtype", parse_dtype(self.dtype, "TensorSpec.dtype"))
        if isinstance(self.shape, (str, bytes)) or not hasattr(self.shape, "__iter__"):
            raise TypeError(f"TensorSpec.shape must be a tuple of sizes (None for dynamic); received {self.shape!r}.")
        shape = tuple(self.shape)
        for size in shape:
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
                raise ValueError(
                    f"TensorSpec.shape entries must be non-negative ints or None (dynamic); received {shape!r}."
                )
        if self.dtype == STRING and shape != (None,):
            raise ValueError(f"A string TensorSpec is a batch of bytes values: shape (None,); received {shape!r}.")
        object.__setattr__(self, "shape", shape)

    @property
    def is_string(self) -> bool:
        return self.dtype == STRING

    def signature_shape(self) -> list[int]:
        """The shape as signature.json writes it: -1 for dynamic sizes."""
        return [-1 if size is None else size for size in self.shape]

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)} {tuple(self.signature_shape())}"


@accepts_tf_arguments("ServingInputReceiver")  # TF's features= and receiver_tensors_alternatives= refused, saying why
@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingInputReceiver:
    """The inputs an exported model takes, and how they become model_fn's features.

    Without ``receiver_fn`` the features are the dict of the program's input
    tensors. ``receiver_fn`` maps that dict to features (a dict of tensors or
    a tensor); it is traced into the exported program, so it must be torch
    code (no numpy, no Python branching on tensor values). The program's
    inputs are the receiver's tensor inputs plus, for each string input, the
    tensors its decode step makes (``decoders``, run outside the program).
    """

    receiver_tensors: Mapping[str, TensorSpec]
    receiver_fn: ReceiverFn | None = None
    decoders: Mapping[str, DecodeStep] | None = None
    """string input name -> its decode step (decoders.py); every string input needs one."""

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
            raise TypeError(
                f"receiver_fn must be callable (dict of tensors -> features); received {self.receiver_fn!r}."
            )
        object.__setattr__(self, "receiver_tensors", dict(self.receiver_tensors))
        object.__setattr__(self, "decoders", _checked_decoders(self.receiver_tensors, self.decoders))
        self.program_specs()  # names clash-checked now, not at export

    def program_specs(self) -> dict[str, TensorSpec]:
        """The traced program's inputs: tensor receiver inputs, then each string input's decoded tensors.

        A decoded name must differ from every receiver input's name, so a dict
        of inputs says by its keys alone whether it is still to be decoded.
        """
        specs = {name: spec for name, spec in self.receiver_tensors.items() if not spec.is_string}
        for input_name, step in (self.decoders or {}).items():
            for name, (dtype, shape) in step.outputs().items():
                if name in specs or name in self.receiver_tensors:
                    raise ValueError(
                        f"The decode step of string input {input_name!r} makes a tensor named {name!r}, which is "
                        f"already a receiver input or another decoded tensor; give them different names."
                    )
                specs[name] = TensorSpec(shape=shape, dtype=dtype)
        return specs

    def example_inputs(self) -> dict[str, torch.Tensor]:
        """Program inputs matching the specs, dynamic sizes set to 2; integer inputs are zeros (valid as indices)."""
        examples = {}
        for name, spec in self.program_specs().items():
            shape = [EXAMPLE_DYNAMIC_SIZE if size is None else size for size in spec.shape]
            dtype = spec.dtype
            assert isinstance(dtype, torch.dtype)  # program_specs holds tensor inputs, not string ones
            if dtype.is_floating_point or dtype.is_complex:
                # A fixed generator: exporting twice traces the same values.
                generator = torch.Generator().manual_seed(0)
                examples[name] = torch.randn(shape, generator=generator).to(dtype)
            else:
                examples[name] = torch.zeros(shape, dtype=dtype)
        return examples

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        """torch.export dynamic shapes: every leading None shares one batch Dim; other Nones get their own."""
        batch = torch.export.Dim("batch")
        shapes: dict[str, dict[int, Any]] = {}
        for index, (name, spec) in enumerate(self.program_specs().items()):
            dims = {}
            for axis, size in enumerate(spec.shape):
                if size is None:
                    dims[axis] = batch if axis == 0 else torch.export.Dim(_dim_name(name, index, axis))
            shapes[name] = dims
        return shapes

    def features(self, receiver_tensors: dict[str, torch.Tensor]) -> Any:
        return receiver_tensors if self.receiver_fn is None else self.receiver_fn(receiver_tensors)

    def describe(self) -> str:
        described = []
        for name, spec in self.receiver_tensors.items():
            step = (self.decoders or {}).get(name)
            described.append(f"{name!r}: {spec.describe()}" + (f" ({step.describe()})" if step is not None else ""))
        return ", ".join(described)


def _checked_decoders(
    receiver_tensors: Mapping[str, TensorSpec], decoders: Mapping[str, DecodeStep] | None
) -> dict[str, DecodeStep] | None:
    if decoders is not None and not isinstance(decoders, Mapping):
        raise TypeError(f"decoders must be a dict of string input name -> decode step; received {decoders!r}.")
    decoders = dict(decoders or {})
    for name, step in decoders.items():
        if not isinstance(step, DecodeStep):
            raise TypeError(
                f"decoders[{name!r}] must be a decode step (torchestimator.export.decoders); received {step!r}."
            )
        spec = receiver_tensors.get(name)
        if spec is None or not spec.is_string:
            raise ValueError(
                f"decoders[{name!r}] decodes a string input, but the receiver has no string input {name!r}."
            )
    undecoded = [name for name, spec in receiver_tensors.items() if spec.is_string and name not in decoders]
    if undecoded:
        raise ValueError(
            f"Receiver string inputs {undecoded} have no decode step: strings cannot enter a torch.export program. "
            "Use te.export.build_parsing_serving_input_receiver (serialized tf.Examples) or "
            "build_image_serving_input_receiver (encoded images)."
        )
    return decoders or None


def serving_input_receiver(
    receiver_tensors: Mapping[str, TensorSpec | tuple[Any, ...]],
    receiver_fn: ReceiverFn | None = None,
) -> ServingInputReceiver:
    """A ServingInputReceiver from {name: TensorSpec} (or {name: (shape, dtype)})."""
    if not isinstance(receiver_tensors, Mapping):
        raise TypeError(f"receiver_tensors must be a dict of name -> TensorSpec; received {receiver_tensors!r}.")
    specs: dict[str, TensorSpec] = {}
    for name, spec in receiver_tensors.items():
        if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[0], (int, type(None))):
            spec = TensorSpec(shape=spec[0], dtype=spec[1])
        specs[name] = spec  # type: ignore[assignment]  # not a spec nor a pair: the receiver's TypeError names it
    return ServingInputReceiver(receiver_tensors=specs, receiver_fn=receiver_fn)


def build_parsing_serving_input_receiver(
    feature_spec: Mapping[str, Any],
    receiver_fn: ReceiverFn | None = None,
    *,
    input_name: str = "examples",
) -> ServingInputReceiver:
    """Serialized tf.Examples in, parsed with ``feature_spec``, then the model (TF's build_parsing_serving_input_receiver_fn).

    The receiver input ``input_name`` is a batch of serialized Examples
    (signature dtype string, DT_STRING, shape [-1]); each request runs
    ``te.data.parse_example(serialized, feature_spec)`` outside the program
    (TF's parse errors, naming the record), and each FixedLenFeature becomes a
    program input of shape [-1, *shape]. The features model_fn gets are those
    tensors, or ``receiver_fn(tensors)``. Only int64/float32 FixedLenFeature
    specs can be program inputs: VarLen, Ragged and sequence features are
    refused here, naming the feature. :classify and :regress then take TF
    Serving's ``examples`` as TF does. A classify or regress signature calls
    this input "inputs", TF's key for it; a predict signature keeps ``input_name``.
    """
    if not isinstance(input_name, str) or not input_name:
        raise ValueError(f"input_name must be a non-empty string; received {input_name!r}.")
    return ServingInputReceiver(
        receiver_tensors={input_name: TensorSpec(shape=(None,), dtype=STRING)},
        receiver_fn=receiver_fn,
        decoders={input_name: ExampleParsing(features=feature_spec)},
    )


def build_parsing_serving_input_receiver_fn(
    feature_spec: Mapping[str, Any], default_batch_size: None = None
) -> Callable[[], ServingInputReceiver]:
    """TF's call form of ``build_parsing_serving_input_receiver``: returns the serving_input_receiver_fn.

    Exporters and ``export_saved_model`` take the function as TF's do. The exported program takes any batch
    size, so ``default_batch_size`` (TF's fixed batch dimension) must stay None.
    """
    if default_batch_size is not None:
        raise ValueError(
            "build_parsing_serving_input_receiver_fn: a batch of serialized Examples has a dynamic size here "
            f"(shape (None,)); received default_batch_size={default_batch_size!r}. Drop default_batch_size."
        )
    receiver = build_parsing_serving_input_receiver(feature_spec)  # checked now, not at the first export
    return lambda: receiver


def build_raw_serving_input_receiver_fn(
    features: Mapping[str, Any], default_batch_size: int | None = None
) -> Callable[[], ServingInputReceiver]:
    """TF's ``build_raw_serving_input_receiver_fn``: the model takes ``features`` as they are, one input each.

    ``features`` maps names to example tensors (a batch: the first dimension is the batch, as TF's placeholders
    are made from the tensors' shapes) or to ``TensorSpec``s; ``default_batch_size`` fixes the batch
    dimension (None: any). Returns the serving_input_receiver_fn; ``serving_input_receiver`` is ours.
    """
    if not isinstance(features, Mapping) or not features:
        raise TypeError(
            f"build_raw_serving_input_receiver_fn takes a dict of name -> example tensor; received {features!r}."
        )
    specs: dict[str, TensorSpec] = {}
    for name, value in features.items():
        if isinstance(value, TensorSpec):
            specs[name] = value
        elif isinstance(value, torch.Tensor) and value.dim() >= 1:
            specs[name] = TensorSpec(shape=(default_batch_size, *value.shape[1:]), dtype=value.dtype)
        else:
            raise TypeError(
                f"build_raw_serving_input_receiver_fn: features[{name!r}] must be a tensor with a batch dimension "
                f"or a TensorSpec; received {value!r}."
            )
    receiver = ServingInputReceiver(receiver_tensors=specs)
    return lambda: receiver


def build_image_serving_input_receiver(
    decoding: Any,
    *,
    input_name: str = "image_bytes",
    feature_name: str = "image",
    receiver_fn: ReceiverFn | None = None,
) -> ServingInputReceiver:
    """Encoded images in (PNG, JPEG, GIF, BMP bytes), decoded as ``decoding`` says, then the model.

    ``decoding`` is the te.data.ImageDecoding the input_fn decodes with
    (channels, size, resize method, layout, scale), so serving sees the
    tensors training saw. The receiver input ``input_name`` is a batch of
    bytes (REST: ``{"instances": [{"b64": "..."}]}``); the decoded float32
    batch is the program input and feature ``feature_name``.
    """
    if not isinstance(input_name, str) or not input_name:
        raise ValueError(f"input_name must be a non-empty string; received {input_name!r}.")
    return ServingInputReceiver(
        receiver_tensors={input_name: TensorSpec(shape=(None,), dtype=STRING)},
        receiver_fn=receiver_fn,
        decoders={input_name: ImageDecode(decoding=decoding, feature_name=feature_name)},
    )


def as_receiver(value: Any) -> ServingInputReceiver:
    """Accepts a receiver, or a zero-argument function returning one (TF's serving_input_receiver_fn)."""
    if value is None:
        raise ValueError(
            "A serving input receiver is required: te.export.serving_input_receiver({'x': TensorSpec(...)})."
        )
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
