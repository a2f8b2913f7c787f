"""A whole Keras model (``.keras``, Keras 2/3 ``.h5``) as a plain torch module: architecture from the file's own
config, weights from the same file, no TensorFlow or Keras at run time.

What belongs here: reading the config (``config.json`` of a ``.keras`` archive, the ``model_config`` attribute
of an ``.h5``), refusing what cannot be converted before anything is built (Lambda layers and custom objects
by name, never evaluated; classes without a converter), the call graph (Sequential chains; Functional models
with shared layers, several inputs and outputs, in both Keras 2's and Keras 3's node formats) and the module
that runs it. The layers themselves are ``keras_layers``' job; the weights come through ``keras_h5``'s reader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import zipfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy
import torch
from torch import nn

from torchestimator._extras import import_extra
from torchestimator.errors import KerasModelError
from torchestimator.interop.keras_config import MAX_CONFIG_BYTES
from torchestimator.interop.keras_h5 import ARCHIVE_CONFIG_MEMBER, KerasH5Source, open_keras_h5
from torchestimator.interop.keras_layers import CONVERTERS, OP_CONVERTERS, LayerSpec

__all__ = ["KerasModel", "KerasModelError", "keras_model"]

_MODEL_CLASSES = ("Sequential", "Functional", "Model")
_KERAS_MODULES = re.compile(r"^(keras|tf_keras|tensorflow\.keras|tensorflow\.python\.keras)(\.|$)")


@dataclass(frozen=True)
class _Ref:
    """A tensor of the graph: output ``tensor`` of call ``node`` of layer ``layer`` (Keras's keras_history)."""

    layer: str
    node: int
    tensor: int


@dataclass(frozen=True)
class _Call:
    """One call of a layer: its inputs (a ref, or a list of refs for merge layers) and the node it makes."""

    layer: str
    node: int
    inputs: Any
    options: tuple[tuple[str, Any], ...] = ()
    """Keyword flags of the call the module takes too (MultiHeadAttention's use_causal_mask)."""
    mask_input: _Ref | None = None
    """The mask a Keras 3 functional model passes this call explicitly (``mask=``: the output of its NotEqual/Any
    ops), where it records one."""
    initial_state: tuple[_Ref, ...] = ()
    """An RNN's ``initial_state`` tensors (an encoder's states starting a decoder)."""
    mask: str = ""
    """What the call does with Keras's mask (``_mask_flow``): "" none reaches it (or it drops it), "make" its
    module computes one (Embedding(mask_zero=True), Masking), "keep" its output carries its input's, "take" the
    module is called with it, "take-keep" both (an RNN returning sequences)."""


_MASK_KEEPERS = frozenset(
    {
        "Activation", "Dense", "Dropout", "ELU", "GaussianDropout", "GaussianNoise", "LayerNormalization",
        "LeakyReLU", "Normalization", "PReLU", "ReLU", "Rescaling", "SpatialDropout1D", "SpatialDropout2D",
        "SpatialDropout3D",
    }
)  # fmt: skip
"""Classes whose output carries their input's mask, math unchanged (Keras's supports_masking, compute_mask kept)."""
_MASK_TAKERS = frozenset({"LSTM", "GRU", "SimpleRNN", "Bidirectional", "GlobalAveragePooling1D"})
"""Classes whose math takes the mask (masked steps skipped; the mean of the kept steps)."""
_MASK_REFUSED = frozenset(
    {
        "BatchNormalization", "Softmax", "TimeDistributed", "MultiHeadAttention", "Add", "Subtract", "Multiply",
        "Average", "Maximum", "Minimum", "Concatenate", "Dot",
    }
)  # fmt: skip
"""Classes whose Keras math would use a mask this converter does not apply yet: refused when one reaches them.
Every other class drops the mask, as Keras does (with a warning) for layers without masking support."""

_OP_MODULES = re.compile(r"^keras\.src\.ops(\.|$)")


@dataclass(frozen=True)
class _Number:
    """A number among an op's operands (``x + 3.0``), passed to the module in its place."""

    value: float


_RECURRENT = frozenset({"LSTM", "GRU", "SimpleRNN"})

_CALL_FLAGS = {"MultiHeadAttention": ("use_causal_mask",)}
"""Keyword flags a layer's call may carry, by class; any other keyword that is not a recorded default is refused."""
_TENSOR_KEYWORDS = {"MultiHeadAttention": ("key",)}
"""Keyword tensors a layer's call may take, by class: they follow the positional ones, in this order."""


class KerasModel(nn.Module):
    """A converted Keras model: one submodule per Keras layer (named after it), called in the graph's order.

    ``forward`` takes the model's inputs in Keras's order (channels-last, as Keras does, unless converted with
    ``channels_first``) and returns one tensor, or a tuple in the order of Keras's outputs. ``input_specs``: each
    input's Keras name, shape without the batch (None where Keras left a size open; channels first for the
    inputs taken channels-first) and dtype, as the file's InputLayer records them."""

    def __init__(
        self,
        name: str,
        layers: dict[str, nn.Module],
        calls: list[_Call],
        inputs: list[str],
        outputs: list[_Ref],
        input_specs: list[tuple[str, tuple[int | None, ...], str]] | None = None,
    ) -> None:
        super().__init__()
        self.keras_name = name
        self.input_specs = input_specs or []
        self._attribute = {keras: _attribute_name(keras, index) for index, keras in enumerate(layers)}
        for keras, module in layers.items():
            self.add_module(self._attribute[keras], module)
        self._calls, self._inputs, self._outputs = calls, inputs, outputs
        self.output_masked = any(call.mask in ("make", "keep", "take-keep") for call in calls if _out(call) in outputs)
        """Whether Keras attached a mask to an output (a model nested in another would pass it on)."""
        self.channels_first_inputs: tuple[str, ...] = ()
        """The inputs taken channels-first ([batch, channels, *spatial]) and moved to Keras's layout on entry."""
        self._move: tuple[bool, ...] = ()  # by input position: whether forward moves its channels last

    def take_channels_first(self, names: Collection[str]) -> None:
        """Inputs ``names`` come channels-first, as torch's convolutions and data loaders lay them out: forward
        moves their channels last (a view, no copy; the convolutions then see torch's layout again)."""
        known = self.input_names
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ValueError(f"{self.keras_name} has no input(s) {unknown}; its inputs: {', '.join(known)}.")
        self.channels_first_inputs = tuple(name for name in known if name in names)
        self._move = tuple(name in names for name in known)
        self.input_specs = [
            (name, (shape[-1], *shape[:-1]) if name in names and len(shape) > 1 else shape, dtype)
            for name, shape, dtype in self.input_specs
        ]

    @property
    def input_names(self) -> list[str]:
        """The inputs' Keras names, in forward's order."""
        return [name for name, _, _ in self.input_specs] if self.input_specs else list(self._inputs)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if len(inputs) != len(self._inputs):
            raise TypeError(
                f"{self.keras_name} takes {len(self._inputs)} input(s) ({', '.join(self._inputs)}); got {len(inputs)}."
            )
        if self.channels_first_inputs:
            inputs = tuple(value.movedim(1, -1) if move else value for move, value in zip(self._move, inputs))
        values: dict[_Ref, torch.Tensor] = {_Ref(name, 0, 0): value for name, value in zip(self._inputs, inputs)}
        masks: dict[_Ref, torch.Tensor] = {}  # Keras's masks, where a layer made one (call.mask says)
        for call in self._calls:
            module = getattr(self, self._attribute[call.layer])
            arguments = _resolve(call.inputs, values)
            out = _out(call)
            options = dict(call.options)
            if call.mask.startswith("take"):
                options["mask"] = masks[call.inputs] if call.mask_input is None else values[call.mask_input]
            if call.initial_state:
                options["initial_state"] = [values[ref] for ref in call.initial_state]
            if isinstance(module, KerasModel) and isinstance(arguments, list):  # a nested model of several inputs
                result = module(*arguments)
            else:
                result = module(arguments, **options)
            if isinstance(result, tuple):  # several outputs: an RNN's states, a nested model's outputs
                values.update({_Ref(call.layer, call.node, index): item for index, item in enumerate(result)})
            else:
                values[out] = result
            if call.mask == "make":
                masks[out] = module.compute_mask(arguments)
            elif call.mask in ("keep", "take-keep"):
                masks[out] = masks[call.inputs]
        results = tuple(values[ref] for ref in self._outputs)
        return results[0] if len(results) == 1 else results


def _out(call: _Call) -> _Ref:
    return _Ref(call.layer, call.node, 0)


def _resolve(inputs: Any, values: dict[_Ref, torch.Tensor]) -> Any:
    if isinstance(inputs, _Ref):
        return values[inputs]
    if isinstance(inputs, _Number):
        return inputs.value
    return [_resolve(item, values) for item in inputs]


def _attribute_name(keras_name: str, index: int) -> str:
    """A submodule name from a Keras layer name (torch's names cannot hold '.', nor be empty)."""
    name = re.sub(r"\W", "_", keras_name)
    return name if name and not name[0].isdigit() else f"layer_{index}_{name}"


def keras_model(
    path: str | os.PathLike[str],
    *,
    config: str | os.PathLike[str] | None = None,
    channels_first: bool | Collection[str] = False,
) -> KerasModel:
    """The Keras model in ``path`` (``.keras``, or an ``.h5`` saved with its model) as a plain torch module with
    the file's weights. For a weights-only file (``.weights.h5``, ``save_weights``'s ``.h5``), ``config`` names a
    JSON file with the architecture: ``model.to_json()``'s text, or a ``.keras`` archive's ``config.json``.
    Inputs and outputs as Keras's (channels-last), unless ``channels_first``: True takes every
    input channels-first (``[batch, channels, *spatial]``, torch's layout), a collection of input names takes
    those. Outputs stay as Keras's. Raises ``KerasModelError`` naming the layer and its class for what cannot be
    converted (Lambda layers, custom objects, unsupported classes), before anything is built; nothing in the file
    is run."""
    location = os.fspath(path)
    if isinstance(channels_first, str):
        raise TypeError(f"channels_first={channels_first!r}: give True, or a list of input names.")
    architecture = read_model_config(location) if config is None else read_config_json(os.fspath(config))
    _check_model(location, architecture)
    weights, names = _layer_weights(location)
    model = _build(location, architecture, weights, names)
    if weights:
        raise KerasModelError(f"{location}: weights of layers the config does not list: {sorted(weights)}.")
    if channels_first:
        model.take_channels_first(model.input_names if channels_first is True else channels_first)
    return model


def _check_model(path: str, config: Any) -> None:
    """Every layer of the model, nested models' included, is one this converter builds; refused by name if not."""
    model_config = config.get("config") if isinstance(config, dict) else None
    if config.get("class_name") not in _MODEL_CLASSES or not isinstance(model_config, dict):
        raise KerasModelError(
            f"{path}: the config describes a {config.get('class_name')!r}, not a Sequential or Functional model."
        )
    entries = model_config.get("layers")
    if not isinstance(entries, list) or not entries:
        raise KerasModelError(f"{path}: the model config lists no layers.")
    for entry in entries:
        _check_convertible(path, entry)
        if entry["class_name"] in _MODEL_CLASSES:
            _check_model(path, entry)


def _build(
    path: str, config: dict[str, Any], weights: dict[str, list[numpy.ndarray]], names: dict[str, tuple[str, ...]]
) -> KerasModel:
    """The module of one (possibly nested) model; takes its layers' weights out of ``weights``."""
    model_config, class_name = config["config"], config["class_name"]
    entries = model_config["layers"]
    layers: dict[str, nn.Module] = {}
    for entry in entries:
        name = _layer_name(entry)
        if entry["class_name"] == "InputLayer":
            continue
        if entry["class_name"] in _MODEL_CLASSES:
            inner_weights, inner_names = _nested_weights(name, weights, names)
            layers[name] = _build(path, entry, inner_weights, inner_names)
            if inner_weights:
                raise KerasModelError(
                    f"{path}: weights of layers model {name!r} does not list: {sorted(inner_weights)}."
                )
            continue
        spec = LayerSpec(
            name, entry["class_name"], entry.get("config") or {}, weights.pop(name, []), names.get(name, ())
        )
        try:
            layers[name] = _converters(entry)[spec.class_name](spec)
        except KerasModelError as error:
            raise KerasModelError(f"{path}: {error}") from None
    if class_name == "Sequential":
        calls, inputs, outputs = _sequential_graph(entries)
    else:
        calls, inputs, outputs = _functional_graph(path, model_config, entries)
    calls = _mask_flow(path, calls, layers, {_layer_name(entry): entry["class_name"] for entry in entries})
    _check_output_indices(path, calls, outputs, layers)
    specs = _input_specs(model_config, entries, inputs)
    return KerasModel(str(model_config.get("name", "model")), layers, calls, inputs, outputs, specs)


def _output_count(module: nn.Module) -> int:
    """How many tensors a call of ``module`` gives: a nested model's outputs, an RNN's output and its states."""
    if isinstance(module, KerasModel):
        return len(module._outputs)
    return 1 + int(getattr(module, "state_count", 0)) if getattr(module, "return_state", False) else 1


def _check_output_indices(path: str, calls: list[_Call], outputs: list[_Ref], layers: dict[str, nn.Module]) -> None:
    """Every tensor the graph uses is one its layer gives (output 1 of an LSTM only with return_state)."""
    used = [ref for call in calls for ref in _needed(call)] + outputs
    for ref in used:
        if ref.layer in layers and ref.tensor >= _output_count(layers[ref.layer]):
            raise KerasModelError(
                f"{path}: output {ref.tensor} of layer {ref.layer!r} is used, which gives "
                f"{_output_count(layers[ref.layer])} output(s)."
            )


def _mask_flow(path: str, calls: list[_Call], layers: dict[str, nn.Module], classes: dict[str, str]) -> list[_Call]:
    """Where Keras's masks go (``_Call.mask``): made by Embedding(mask_zero=True) and Masking, carried on by the
    layers that keep them, taken by RNNs and GlobalAveragePooling1D, dropped by the rest, as Keras 3 does; a layer
    whose math would need one this converter does not apply is refused by name."""
    masked: set[_Ref] = set()
    flowed = []
    for call in calls:
        module, kind = layers[call.layer], classes[call.layer]
        mode = ""
        if call.mask_input is not None:  # Keras 3 recorded the mask it passed: that one, whatever flowed here
            mode = _taking(module)
        elif any(ref in masked for ref in _refs(call.inputs)):
            if isinstance(module, KerasModel) or kind in _MASK_REFUSED:
                raise KerasModelError(
                    f"{path}: layer {call.layer!r} ({kind}) gets a mask (from Embedding(mask_zero=True) or Masking), "
                    "which is not converted yet for it."
                )
            if kind in _MASK_TAKERS:
                mode = _taking(module)
            elif kind in _MASK_KEEPERS:
                mode = "keep"
        if kind == "Masking" or (kind == "Embedding" and getattr(module, "mask_zero", False)):
            mode = "make"
        if isinstance(module, KerasModel) and module.output_masked:
            raise KerasModelError(f"{path}: nested model {call.layer!r} passes a mask on: not converted yet.")
        if mode in ("make", "keep", "take-keep"):
            masked.add(_out(call))
        flowed.append(dataclasses.replace(call, mask=mode))
    return flowed


def _taking(module: nn.Module) -> str:
    """An RNN returning sequences passes the mask it takes on (Keras's compute_mask); one returning its last
    output, and GlobalAveragePooling1D, end it."""
    keeps = getattr(module, "return_sequences", False) or getattr(module, "sequences", False)
    return "take-keep" if keeps else "take"


def _input_specs(
    model_config: dict[str, Any], entries: list[dict[str, Any]], inputs: list[str]
) -> list[tuple[str, tuple[int | None, ...], str]]:
    """(name, shape without batch, dtype) of each input, from the InputLayers (Keras 3's batch_shape, Keras 2's
    batch_input_shape) or a Sequential's build_input_shape; empty where the file does not say."""
    by_name = {
        _layer_name(entry): entry.get("config") or {} for entry in entries if entry["class_name"] == "InputLayer"
    }
    specs = []
    for index, name in enumerate(inputs):
        config = by_name.get(name) or (next(iter(by_name.values()), {}) if len(inputs) == 1 else {})
        shape = config.get("batch_shape") or config.get("batch_input_shape")
        if shape is None and index == 0:
            shape = model_config.get("build_input_shape")
        if not isinstance(shape, list) or not all(d is None or isinstance(d, int) for d in shape[1:]):
            return []
        dtype = config.get("dtype", "float32")
        dtype = dtype.get("config", {}).get("name", "float32") if isinstance(dtype, dict) else dtype
        specs.append((config.get("name", name), tuple(shape[1:]), str(dtype)))
    return specs


def _nested_weights(
    model: str, weights: dict[str, list[numpy.ndarray]], names: dict[str, tuple[str, ...]]
) -> tuple[dict[str, list[numpy.ndarray]], dict[str, tuple[str, ...]]]:
    """The weights of nested model ``model``'s layers, keyed by their names inside it (taken out of ``weights``).

    A ``.keras`` archive lists them as layers ``model/layer``; a legacy ``.h5`` as one group ``model`` whose
    weights are named ``model/layer/variable``."""
    inner: dict[str, list[numpy.ndarray]] = {}
    inner_names: dict[str, list[str]] = {}
    prefix = model + "/"
    for layer in [layer for layer in weights if layer.startswith(prefix)]:
        inner[layer[len(prefix) :]] = weights.pop(layer)
        inner_names[layer[len(prefix) :]] = list(names.get(layer, ()))
    for value, name in zip(weights.pop(model, []), names.get(model, ())):
        parts = name.split("/")
        if len(parts) < 3 or parts[0] != model:
            raise KerasModelError(f"weight {name!r} of nested model {model!r} is not named {model}/<layer>/<variable>.")
        inner.setdefault(parts[1], []).append(value)
        inner_names.setdefault(parts[1], []).append("/".join(parts[1:]))
    return inner, {layer: tuple(listed) for layer, listed in inner_names.items()}


def read_model_config(path: str) -> dict[str, Any]:
    """The model's config as the file records it: ``config.json`` of a ``.keras``, ``model_config`` of an ``.h5``."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                info = archive.getinfo(ARCHIVE_CONFIG_MEMBER)
                if info.file_size > MAX_CONFIG_BYTES:
                    raise KerasModelError(f"{path}: config.json declares {info.file_size} bytes: too big for a config.")
                text: str | bytes = archive.read(info)
        else:
            h5py = import_extra("h5py", extra="keras", feature=f"converting the Keras model {path}")
            with h5py.File(path, "r") as handle:
                text = handle.attrs.get("model_config")
                if text is None:
                    raise KerasModelError(
                        f"{path} holds weights only (no model_config): give the architecture as JSON too "
                        "(config=, --config: model.to_json()'s text), save the model with model.save(...), or "
                        "build the module yourself and warm-start it from this file."
                    )
                if len(text) > MAX_CONFIG_BYTES:
                    raise KerasModelError(f"{path}: model_config of {len(text)} bytes is too big for a config.")
    except KeyError:
        raise KerasModelError(f"{path}: a .keras archive without {ARCHIVE_CONFIG_MEMBER}.") from None
    except (OSError, zipfile.BadZipFile) as error:
        raise KerasModelError(f"{path}: cannot read the model config: {error}") from error
    return _parsed(path, text)


def read_config_json(path: str) -> dict[str, Any]:
    """A model config kept apart from its weights: ``model.to_json()``'s text, or a ``.keras``'s config.json."""
    try:
        size = os.path.getsize(path)
        if size > MAX_CONFIG_BYTES:
            raise KerasModelError(f"{path}: {size} bytes is too big for a model config.")
        with open(path, "rb") as file:
            text = file.read()
    except OSError as error:
        raise KerasModelError(f"{path}: cannot read the model config: {error}") from error
    return _parsed(path, text)


def _parsed(path: str, text: str | bytes) -> dict[str, Any]:
    try:
        config = json.loads(text)
    except (RecursionError, ValueError) as error:
        raise KerasModelError(f"{path}: the model config is not JSON: {error}") from None
    if not isinstance(config, dict):
        raise KerasModelError(f"{path}: the model config is not a JSON object.")
    return config


def _layer_name(entry: dict[str, Any]) -> str:
    name = entry.get("name", (entry.get("config") or {}).get("name"))
    if not isinstance(name, str):
        raise KerasModelError(f"a layer without a name: {str(entry)[:200]}")
    return name


def _check_convertible(path: str, entry: Any) -> None:
    """Refuses, by name and before anything is built, a layer this converter would have to run code for or does
    not know."""
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise KerasModelError(f"{path}: a layer entry that is not a Keras layer config: {str(entry)[:200]}")
    class_name, name = entry["class_name"], _layer_name(entry)
    module = entry.get("module")
    if class_name in ("Lambda", "TFOpLambda", "SlicingOpLambda") or entry.get("registered_name") not in (
        None,
        class_name,
    ):
        raise KerasModelError(
            f"{path}: layer {name!r} ({class_name}) holds code or a custom object"
            f"{'' if entry.get('registered_name') is None else ' ' + repr(entry.get('registered_name'))}; "
            "it is never run. Replace it with built-in layers, or build that part yourself."
        )
    if isinstance(module, str) and not _KERAS_MODULES.match(module):
        raise KerasModelError(f"{path}: layer {name!r} ({class_name}) comes from module {module!r}, not Keras's own.")
    if class_name not in ("InputLayer", *_MODEL_CLASSES) and class_name not in _converters(entry):
        kind = "op keras.ops" if _is_op(entry) else "layer"
        raise KerasModelError(
            f"{path}: {kind} {name!r} is a {class_name}, which is not converted (yet). Converted: "
            f"{', '.join(sorted(_converters(entry)))}."
        )


def _is_op(entry: dict[str, Any]) -> bool:
    """A node of a ``keras.ops`` function (Keras 3 functional models record them as layers of module
    ``keras.src.ops.*``), not a layer of the same class name."""
    return isinstance(entry.get("module"), str) and bool(_OP_MODULES.match(entry["module"]))


def _converters(entry: dict[str, Any]) -> dict[str, Any]:
    return OP_CONVERTERS if _is_op(entry) else CONVERTERS


def _layer_weights(path: str) -> tuple[dict[str, list[numpy.ndarray]], dict[str, tuple[str, ...]]]:
    """Each layer's weights in Keras's order, and their names in the file (aliases where the file has them)."""
    with open_keras_h5(path) as opened:
        source = cast(KerasH5Source, opened)
        friendly = {tensor: alias for alias, tensor in source.aliases().items()}
        layers = source.layers()
        weights = {layer: [source.read(info.name) for info in tensors] for layer, tensors in layers}
        names = {layer: tuple(friendly.get(info.name, info.name) for info in tensors) for layer, tensors in layers}
        return weights, names


def _sequential_graph(entries: list[dict[str, Any]]) -> tuple[list[_Call], list[str], list[_Ref]]:
    names = [_layer_name(entry) for entry in entries if entry["class_name"] != "InputLayer"]
    if not names:
        raise KerasModelError("a Sequential model without layers")
    calls, previous = [], _Ref("input", 0, 0)
    for name in names:
        calls.append(_Call(name, 0, previous))
        previous = _Ref(name, 0, 0)
    return calls, ["input"], [previous]


def _functional_graph(
    path: str, config: dict[str, Any], entries: list[dict[str, Any]]
) -> tuple[list[_Call], list[str], list[_Ref]]:
    inputs = [_ref(path, item).layer for item in _listed(config.get("input_layers"))]
    outputs = [_ref(path, item) for item in _listed(config.get("output_layers"))]
    pending: list[_Call] = []
    for entry in entries:
        if entry["class_name"] == "InputLayer":
            continue
        name = _layer_name(entry)
        for node, inbound in enumerate(entry.get("inbound_nodes") or []):
            pending.append(_node_call(path, name, node, entry["class_name"], inbound, _is_op(entry)))
    # Keras lists layers in creation order; a shared layer's later call may need layers listed after it.
    ready = {(name, 0) for name in inputs}  # (layer, node) calls made: all their outputs are there
    ordered: list[_Call] = []
    while pending:
        runnable = [call for call in pending if all((ref.layer, ref.node) in ready for ref in _needed(call))]
        if not runnable:
            missing = sorted(
                {f"{ref.layer}[{ref.node}]" for call in pending for ref in _needed(call)}
                - {f"{layer}[{node}]" for layer, node in ready}
            )
            raise KerasModelError(f"{path}: the graph needs tensors no layer makes: {missing}.")
        for call in runnable:
            ordered.append(call)
            ready.add((call.layer, call.node))
            pending.remove(call)
    for ref in outputs:
        if (ref.layer, ref.node) not in ready:
            raise KerasModelError(f"{path}: output {ref.layer}[{ref.node}] is made by no layer call.")
    return ordered, inputs, outputs


def _listed(value: Any) -> list[Any]:
    """input_layers/output_layers: a list of [name, node, tensor], or one such triple."""
    if isinstance(value, list) and len(value) == 3 and isinstance(value[0], str):
        return [value]
    return value if isinstance(value, list) else []


def _ref(path: str, item: Any) -> _Ref:
    if isinstance(item, list) and len(item) >= 3 and isinstance(item[0], str):
        layer, node, tensor = item[0], item[1], item[2]
        if isinstance(node, int) and isinstance(tensor, int) and tensor >= 0:
            return _Ref(layer, node, tensor)
    raise KerasModelError(f"{path}: not a tensor reference [layer, node, tensor]: {str(item)[:200]}")


def _needed(call: _Call) -> Iterator[_Ref]:
    yield from _refs(call.inputs)
    yield from call.initial_state
    if call.mask_input is not None:
        yield call.mask_input


def _node_call(path: str, layer: str, node: int, class_name: str, inbound: Any, op: bool = False) -> _Call:
    """One call of a layer, from Keras 3's ``{"args": [...], "kwargs": {...}}`` or Keras 2's ``[[name, node,
    tensor, kwargs], ...]``: its inputs (a ref, or a list of refs for a layer called on a list or on several
    tensors; an op's operands, numbers included, in their order), its flags (``_CALL_FLAGS``) and the mask
    passed to it."""
    if isinstance(inbound, dict):  # Keras 3
        tensors: list[Any] = []
        options: list[tuple[str, Any]] = []
        for arg in inbound.get("args") or []:
            if op and isinstance(arg, (int, float)) and not isinstance(arg, bool):
                tensors.append(_Number(arg))
            else:
                tensors.append(_keras3_tensors(path, arg))
        mask_input, initial_state = None, ()
        for key, value in sorted((inbound.get("kwargs") or {}).items()):
            # Keras records defaults it passed (mask=None; training, which inference and train() set here instead).
            if key == "training" or _all_none(value):
                continue
            if key in _TENSOR_KEYWORDS.get(class_name, ()):
                tensors.append(_keras3_tensors(path, value))
            elif key in _CALL_FLAGS.get(class_name, ()) and isinstance(value, bool):
                options.append((key, value))
            elif key == "mask" and class_name in _MASK_TAKERS and isinstance(value, dict):
                mask_input = _keras3_tensors(path, value)
            elif key == "initial_state" and class_name in _RECURRENT:
                states = _keras3_tensors(path, value)
                initial_state = tuple(states) if isinstance(states, list) else (states,)
            else:
                raise KerasModelError(
                    f"{path}: layer {layer!r} is called with {key}={str(value)[:80]}: not converted yet."
                )
        if not any(True for _ in _refs(tensors)):
            raise KerasModelError(f"{path}: layer {layer!r} is called without a tensor.")
        inputs = tensors[0] if len(tensors) == 1 else tensors
        return _Call(layer, node, inputs, tuple(options), mask_input, initial_state)
    if isinstance(inbound, list):  # Keras 2: a list of [name, node, tensor, kwargs]
        for item in inbound:
            keywords = item[3] if isinstance(item, list) and len(item) > 3 and isinstance(item[3], dict) else {}
            extra = sorted(key for key, value in keywords.items() if key != "training" and not _all_none(value))
            if extra:
                raise KerasModelError(f"{path}: layer {layer!r} is called with arguments {extra}: not converted yet.")
        refs = [_ref(path, item) for item in inbound]
        if class_name in _RECURRENT and len(refs) > 1:  # Keras 2 lists an RNN's initial states after its input
            return _Call(layer, node, refs[0], initial_state=tuple(refs[1:]))
        return _Call(layer, node, refs[0] if len(refs) == 1 else refs)
    raise KerasModelError(f"{path}: layer {layer!r} has an inbound node of an unknown form: {str(inbound)[:200]}")


def _all_none(value: Any) -> bool:
    """A recorded default: None, or a list of Nones (the mask of a call on a list)."""
    return value is None or (isinstance(value, list) and all(_all_none(item) for item in value))


def _keras3_tensors(path: str, value: Any) -> Any:
    if isinstance(value, list):
        return [_keras3_tensors(path, item) for item in value]
    if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
        return _ref(path, (value.get("config") or {}).get("keras_history"))
    raise KerasModelError(f"{path}: a call argument that is not a tensor: {str(value)[:200]}")


def _refs(inputs: Any) -> Iterator[_Ref]:
    if isinstance(inputs, _Ref):
        yield inputs
    elif not isinstance(inputs, _Number):
        for item in inputs:
            yield from _refs(item)
