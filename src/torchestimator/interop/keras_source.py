"""A converted Keras model written out as Python source: a ``model.py`` that defines the module, for users who
want to own the code (``torchestimator convert keras-model FILE model.py``).

What belongs here: turning a ``KerasModel`` into text. The file defines one ``nn.Module`` class per (nested)
model whose ``__init__`` builds the same layers (``keras_layers``' classes, with the arguments each was built
with: ``KerasLayer.built_with``; tensors as ``torch.empty`` of their shape) and whose ``forward`` is the call
graph as straight-line code, one line per layer call, named after the Keras layers. The weights are not in the
source: they go to a ``.safetensors`` beside it, whose names are the module's ``state_dict`` names, and the
file's ``load()`` reads them. Building the generated class and loading those weights gives the module
``keras_model`` returned, bit for bit.
"""

from __future__ import annotations

import inspect
import keyword
import math
import re
from typing import Any

from torch import nn

from torchestimator.interop.keras_graph import KerasModel, _Call, _Number, _output_count, _Ref
from torchestimator.interop.keras_layers import KerasLayer, Shaped

__all__ = ["keras_model_source"]


def keras_model_source(model: KerasModel, *, weights_file: str, converted_from: str) -> str:
    """The text of a ``model.py`` that builds ``model`` (weights from ``weights_file``, a path relative to the
    ``model.py``)."""
    classes: dict[str, str] = {}
    top = _write_class(model, classes)
    header = f'''"""{model.keras_name}: the Keras model in {converted_from}, as a PyTorch module.

Written by `torchestimator convert keras-model`; edit it as your own code. The layers are torchestimator's
converted Keras layers (torchestimator.interop.keras_layers, plain torch modules); the weights are in
{weights_file} beside this file, named as this module's state_dict. Inputs: {_inputs_text(model)}.
"""

from __future__ import annotations

from pathlib import Path

import numpy
import torch
from torch import nn

from torchestimator.interop import keras_layers as layers
'''
    footer = f'''

def load(weights: str | Path = Path(__file__).with_name({weights_file!r})) -> {top}:
    """The model with the converted weights, in eval mode (``.train()`` to fine-tune it)."""
    from safetensors.torch import load_file

    model = {top}()
    model.load_state_dict(load_file(str(weights)))
    return model.eval()
'''
    return header + "".join(classes.values()) + footer


def _inputs_text(model: KerasModel) -> str:
    if not model.input_specs:
        return ", ".join(model.input_names)
    layout = f" (channels-first: {', '.join(model.channels_first_inputs)})" if model.channels_first_inputs else ""
    specs = ", ".join(f"{name} {list(shape)} {dtype}" for name, shape, dtype in model.input_specs)
    return f"{specs}, without the batch{layout}"


def _write_class(model: KerasModel, classes: dict[str, str]) -> str:
    """Adds the class of ``model`` (after those of its nested models) to ``classes`` (name -> text); returns its
    name."""
    children = dict(model.named_children())
    lines: list[str] = []
    for attribute, child in children.items():
        if isinstance(child, KerasModel):
            lines.append(f"        self.{attribute} = {_write_class(child, classes)}()")
        else:
            lines.append(_wrapped(f"        self.{attribute} = ", child))
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:  # frozen by the Keras config (BatchNormalization(scale=False))
            lines.append(f"        self.get_parameter({name!r}).requires_grad_(False)")
    name = _class_name(model.keras_name, set(classes))
    body = "\n".join(lines) or "        pass"
    classes[name] = (
        f"\n\nclass {name}(nn.Module):\n"
        f'    """Keras model {model.keras_name!r}."""\n\n'
        f"    def __init__(self) -> None:\n        super().__init__()\n{body}\n\n"
        f"{_forward(model)}"
    )
    return name


def _forward(model: KerasModel) -> str:
    names: dict[_Ref, str] = {}
    taken = set(keyword.kwlist) | {"self", "torch", "nn", "numpy", "layers", "Path"}
    parameters = []
    for key, name in zip(model._inputs, model.input_names):
        variable = _variable(name, taken)
        names[_Ref(key, 0, 0)] = variable
        parameters.append(variable)
    lines = [
        f"        {variable} = {variable}.movedim(1, -1)  # channels-first in, Keras's channels-last from here"
        for variable, name in zip(parameters, model.input_names)
        if name in model.channels_first_inputs
    ]
    masks: dict[_Ref, str] = {}  # the variables holding Keras's masks
    for call in model._calls:
        lines.extend(_call_lines(model, call, names, masks, taken))
    results = [names[ref] for ref in model._outputs]
    signature = ", ".join(f"{parameter}: torch.Tensor" for parameter in parameters)
    returned = "torch.Tensor" if len(results) == 1 else f"tuple[{', '.join(['torch.Tensor'] * len(results))}]"
    lines.append(f"        return {', '.join(results)}")
    return f"    def forward(self, {signature}) -> {returned}:\n" + "\n".join(lines) + "\n"


def _call_lines(
    model: KerasModel, call: _Call, names: dict[_Ref, str], masks: dict[_Ref, str], taken: set[str]
) -> list[str]:
    """The line of one layer call, and the line of the mask it makes (call.mask, as KerasModel.forward)."""
    attribute = model._attribute[call.layer]
    module = getattr(model, attribute)
    arguments = _arguments(call.inputs, names)
    if isinstance(module, KerasModel) and isinstance(call.inputs, list):
        arguments = arguments[1:-1]  # a nested model of several inputs takes them as positional arguments
    options = "".join(f", {key}={value!r}" for key, value in call.options)
    if call.mask.startswith("take"):
        options = f", mask={masks[call.inputs] if call.mask_input is None else names[call.mask_input]}{options}"
    if call.initial_state:
        options += f", initial_state=[{', '.join(names[ref] for ref in call.initial_state)}]"
    variable = _variable(call.layer if call.node == 0 else f"{call.layer}_{call.node}", taken)
    out = _Ref(call.layer, call.node, 0)
    names[out] = variable
    targets = [variable]
    for index in range(1, _output_count(module)):  # an RNN's states, a nested model's other outputs
        names[_Ref(call.layer, call.node, index)] = _variable(f"{variable}_{index}", taken)
        targets.append(names[_Ref(call.layer, call.node, index)])
    lines = [f"        {', '.join(targets)} = self.{attribute}({arguments}{options})"]
    if call.mask == "make":
        masks[out] = _variable(f"{variable}_mask", taken)
        lines.append(f"        {masks[out]} = self.{attribute}.compute_mask({arguments})  # Keras's mask")
    elif call.mask in ("keep", "take-keep"):
        masks[out] = masks[call.inputs]
    return lines


def _arguments(inputs: Any, names: dict[_Ref, str]) -> str:
    if isinstance(inputs, _Ref):
        return names[inputs]
    if isinstance(inputs, _Number):
        return repr(inputs.value)
    return "[" + ", ".join(_arguments(item, names) for item in inputs) + "]"


def _variable(name: str, taken: set[str]) -> str:
    """A Python name from a Keras name, not used before in the same function."""
    base = re.sub(r"\W", "_", name).lower() or "x"
    base = base if not base[0].isdigit() else f"x_{base}"
    candidate, number = base, 1
    while candidate in taken:
        number += 1
        candidate = f"{base}_{number}"
    taken.add(candidate)
    return candidate


def _class_name(keras_name: str, taken: set[str]) -> str:
    words = re.split(r"\W|_", keras_name)
    base = "".join(word[:1].upper() + word[1:] for word in words if word) or "KerasModel"
    base = base if not base[0].isdigit() else f"Model{base}"
    candidate, number = base, 1
    while candidate in taken:
        number += 1
        candidate = f"{base}{number}"
    return candidate


_LINE = 120


def _wrapped(prefix: str, module: nn.Module) -> str:
    """``prefix`` and the module's constructor call, its arguments one per line where one line is too long."""
    line = prefix + _module_expression(module)
    if len(line) <= _LINE or not isinstance(module, KerasLayer):
        return line
    indent = " " * (len(prefix) - len(prefix.lstrip()) + 4)
    arguments = "".join(f"{indent}{argument},\n" for argument in _keyword_arguments(module))
    return f"{prefix}layers.{type(module).__name__}(\n{arguments}{indent[:-4]})"


def _keyword_arguments(layer: KerasLayer) -> list[str]:
    """The arguments the layer was built with, by name, those equal to their defaults left out."""
    args, kwargs = layer.built_with
    signature = inspect.signature(type(layer).__init__)
    bound = signature.bind(None, *args, **kwargs)  # None: self
    written = []
    for name, value in list(bound.arguments.items())[1:]:
        default = signature.parameters[name].default
        if default is not inspect.Parameter.empty and not isinstance(value, Shaped) and value == default:
            continue
        written.append(f"{name}={_value(value)}")
    return written


def _module_expression(module: nn.Module) -> str:
    if isinstance(module, KerasLayer):
        return f"layers.{type(module).__name__}({', '.join(_keyword_arguments(module))})"
    if isinstance(module, nn.BatchNorm1d):
        return (
            f"nn.BatchNorm1d({module.num_features}, eps={module.eps!r}, momentum={module.momentum!r}, "
            f"affine={module.affine}, track_running_stats={module.track_running_stats})"
        )
    if isinstance(module, nn.RNN):
        return (
            f"nn.RNN({module.input_size}, {module.hidden_size}, nonlinearity={module.nonlinearity!r}, "
            f"bias={module.bias}, batch_first={module.batch_first})"
        )
    if isinstance(module, (nn.LSTM, nn.GRU)):
        return (
            f"nn.{type(module).__name__}({module.input_size}, {module.hidden_size}, bias={module.bias}, "
            f"batch_first={module.batch_first})"
        )
    if isinstance(module, nn.Dropout):
        return f"nn.Dropout({module.p!r})"
    raise TypeError(f"{type(module).__name__} has no source form (not a converted Keras layer).")


def _value(value: Any) -> str:
    if isinstance(value, Shaped):
        shape = repr(tuple(value.shape))
        if value.kind == "torch":
            return f"torch.empty({shape}, dtype=torch.{value.dtype})"
        return f"numpy.empty({shape}, dtype={value.dtype!r})"
    if isinstance(value, nn.Module):
        return _module_expression(value)
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)
    if isinstance(value, tuple):
        return "(" + ", ".join(_value(item) for item in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key!r}: {_value(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"a layer argument of type {type(value).__name__} has no source form: {value!r}")
