"""Keras layers as plain torch modules, each computing what Keras computes, in Keras's data layout.

One converter per Keras class (``CONVERTERS``): it takes the layer's config and its weights (numpy arrays in
Keras's order) and returns an ``nn.Module``. Data stays channels-last (NHWC) between layers, as in Keras: a
convolution or pooling moves the channels to torch's place and back around its own call, so Flatten,
Reshape, Concatenate and Dense see exactly Keras's element order. What differs between the frameworks is
done here, once: "same" padding that TF puts mostly at the end (an odd total pads one more after), average
pooling that divides by the values inside the input only, BatchNormalization's momentum (torch's is
``1 - keras``), kernels laid out ``[*spatial, in, out]``.

Nothing from the file is evaluated: a converter reads numbers, strings and lists from the config, and an
activation is looked up by name in ``ACTIVATIONS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch
import torch.nn.functional as F
from torch import nn

from torchestimator.errors import KerasModelError

__all__ = ["ACTIVATIONS", "CONVERTERS", "LayerSpec"]


@dataclass(frozen=True)
class LayerSpec:
    """One Keras layer: its name, class, config and weights (Keras's order, e.g. kernel then bias)."""

    name: str
    class_name: str
    config: dict[str, Any]
    weights: list[numpy.ndarray]

    def error(self, problem: str) -> KerasModelError:
        return KerasModelError(f"layer {self.name!r} ({self.class_name}): {problem}")

    def option(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)


def _hard_sigmoid(x: torch.Tensor) -> torch.Tensor:
    return F.relu6(x + 3.0) / 6.0


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "linear": lambda x: x,
    "relu": F.relu,
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": lambda x: F.softmax(x, dim=-1),
    "log_softmax": lambda x: F.log_softmax(x, dim=-1),
    "elu": F.elu,
    "selu": F.selu,
    "softplus": F.softplus,
    "softsign": F.softsign,
    "swish": F.silu,
    "silu": F.silu,
    "gelu": F.gelu,  # Keras 3's default approximate=False: the erf form
    "exponential": torch.exp,
    "hard_sigmoid": _hard_sigmoid,
    "hard_silu": lambda x: x * _hard_sigmoid(x),
    "hard_swish": lambda x: x * _hard_sigmoid(x),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "mish": F.mish,
}


def _activation_name(spec: LayerSpec, value: Any) -> str:
    name = value.get("config", {}).get("name") if isinstance(value, dict) else value
    name = "linear" if name is None else name
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise spec.error(f"activation {value!r} is not one of {', '.join(sorted(ACTIVATIONS))}.")
    return name


class Activation(nn.Module):
    """A Keras activation by name (``ACTIVATIONS``)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self._function = ACTIVATIONS[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._function(x)

    def extra_repr(self) -> str:
        return self.name


def _tensor(array: numpy.ndarray) -> torch.Tensor:
    return torch.from_numpy(numpy.ascontiguousarray(array, dtype=numpy.float32))


def _weights(spec: LayerSpec, names: Sequence[str]) -> dict[str, numpy.ndarray]:
    if len(spec.weights) != len(names):
        raise spec.error(f"expected {len(names)} weights ({', '.join(names)}), the file holds {len(spec.weights)}.")
    return dict(zip(names, spec.weights))


def _tuple(spec: LayerSpec, key: str, rank: int, default: Any) -> tuple[int, ...]:
    value = spec.option(key, default)
    values = [value] * rank if isinstance(value, int) else list(value)
    if len(values) != rank or not all(isinstance(item, int) and item > 0 for item in values):
        raise spec.error(f"{key}={value!r} is not {rank} positive integers.")
    return tuple(values)


def _check_channels_last(spec: LayerSpec) -> None:
    data_format = spec.option("data_format") or "channels_last"
    if data_format != "channels_last":
        raise spec.error(f"data_format={data_format!r}: only channels_last (Keras's default) is converted yet.")


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TF's "same": output ceil(size / stride), the total padding split with the odd one after."""
    effective = (kernel - 1) * dilation + 1
    total = max((math.ceil(size / stride) - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _pad_spatial(x: torch.Tensor, pads: Sequence[tuple[int, int]], value: float = 0.0) -> torch.Tensor:
    """Pads the spatial dims of a channels-first tensor; ``pads`` in spatial order."""
    flat = [amount for before_after in reversed(pads) for amount in before_after]
    return F.pad(x, flat, value=value) if any(flat) else x


class Dense(nn.Module):
    """Keras Dense: ``activation(x @ kernel + bias)`` over the last axis (any rank); ``weight`` is torch's
    ``[out, in]``, the kernel transposed."""

    def __init__(self, kernel: numpy.ndarray, bias: numpy.ndarray | None, activation: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(_tensor(kernel.T))
        self.bias = None if bias is None else nn.Parameter(_tensor(bias))
        self.activation = activation
        self._activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._activation(F.linear(x, self.weight, self.bias))

    def extra_repr(self) -> str:
        out, inputs = self.weight.shape
        return f"{inputs}, {out}, bias={self.bias is not None}, activation={self.activation}"


def _dense(spec: LayerSpec) -> nn.Module:
    use_bias = spec.option("use_bias", True)
    found = _weights(spec, ["kernel", "bias"] if use_bias else ["kernel"])
    kernel = found["kernel"]
    if kernel.ndim != 2 or kernel.shape[1] != spec.option("units", kernel.shape[1]):
        raise spec.error(f"kernel of shape {list(kernel.shape)} does not give units={spec.option('units')!r}.")
    return Dense(kernel, found.get("bias"), _activation_name(spec, spec.option("activation")))


class Conv(nn.Module):
    """Keras Conv1D/2D/3D (and DepthwiseConv, as grouped): channels-last in and out, TF's padding."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        strides: tuple[int, ...],
        dilation: tuple[int, ...],
        padding: str,
        groups: int,
        activation: str,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.strides, self.dilation, self.padding, self.groups = strides, dilation, padding, groups
        self.activation = activation
        self._activation = ACTIVATIONS[activation]
        self._conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(strides)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.movedim(-1, 1)
        kernel = self.weight.shape[2:]
        if self.padding == "same":
            sizes = x.shape[2:]
            x = _pad_spatial(
                x, [_same_padding(s, k, st, d) for s, k, st, d in zip(sizes, kernel, self.strides, self.dilation)]
            )
        elif self.padding == "causal":
            x = _pad_spatial(x, [((kernel[0] - 1) * self.dilation[0], 0)])
        y = self._conv(x, self.weight, self.bias, self.strides, 0, self.dilation, self.groups)
        return self._activation(y.movedim(1, -1))

    def extra_repr(self) -> str:
        out, per_group, *kernel = self.weight.shape
        return (
            f"{per_group * self.groups}, {out}, kernel_size={tuple(kernel)}, strides={self.strides}, "
            f"padding={self.padding!r}, dilation={self.dilation}, groups={self.groups}, activation={self.activation}"
        )


def _conv(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _check_channels_last(spec)
        use_bias = spec.option("use_bias", True)
        found = _weights(spec, ["kernel", "bias"] if use_bias else ["kernel"])
        kernel = found["kernel"]
        if kernel.ndim != rank + 2:
            raise spec.error(f"kernel of shape {list(kernel.shape)} is not a {rank}-D convolution kernel.")
        padding = spec.option("padding", "valid")
        if padding not in ("valid", "same") and not (padding == "causal" and rank == 1):
            raise spec.error(f"padding={padding!r} is not valid/same" + (" /causal" if rank == 1 else "") + ".")
        strides = _tuple(spec, "strides", rank, 1)
        dilation = _tuple(spec, "dilation_rate", rank, 1)
        weight = _tensor(numpy.transpose(kernel, (rank + 1, rank, *range(rank))))  # [*k, in/g, out] -> [out, in/g, *k]
        groups = spec.option("groups", 1)
        bias = found.get("bias")
        return Conv(
            weight,
            None if bias is None else _tensor(bias),
            strides=strides,
            dilation=dilation,
            padding=padding,
            groups=groups,
            activation=_activation_name(spec, spec.option("activation")),
        )

    return convert


def _depthwise_conv(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _check_channels_last(spec)
        use_bias = spec.option("use_bias", True)
        found = _weights(spec, ["kernel", "bias"] if use_bias else ["kernel"])
        kernel = found["kernel"]  # [*k, in, multiplier]
        if kernel.ndim != rank + 2:
            raise spec.error(f"kernel of shape {list(kernel.shape)} is not a {rank}-D depthwise kernel.")
        channels, multiplier = kernel.shape[-2:]
        # Output channel c * multiplier + m (TF's order) is torch's group c, filter m.
        weight = numpy.transpose(kernel, (rank, rank + 1, *range(rank))).reshape(
            channels * multiplier, 1, *kernel.shape[:rank]
        )
        bias = found.get("bias")
        return Conv(
            _tensor(weight),
            None if bias is None else _tensor(bias),
            strides=_tuple(spec, "strides", rank, 1),
            dilation=_tuple(spec, "dilation_rate", rank, 1),
            padding=spec.option("padding", "valid"),
            groups=channels,
            activation=_activation_name(spec, spec.option("activation")),
        )

    return convert


class BatchNormalization(nn.Module):
    """Keras BatchNormalization over one axis (channels-last: the last), with torch's running statistics.

    Inference uses the moving mean and variance; training updates them as Keras's ``fit`` does (torch's momentum
    is ``1 - keras momentum``). The normalized axis moves to torch's place and the rest is flattened, so one
    BatchNorm1d serves every rank."""

    def __init__(self, norm: nn.BatchNorm1d, axis: int) -> None:
        super().__init__()
        self.norm, self.axis = norm, axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.axis % x.dim()
        moved = x.movedim(axis, 1)
        shape = moved.shape
        flat = moved.reshape(shape[0], shape[1], -1) if moved.dim() > 2 else moved
        return self.norm(flat).reshape(shape).movedim(1, axis)


def _batch_normalization(spec: LayerSpec) -> nn.Module:
    axis = spec.option("axis", -1)
    axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
    if not isinstance(axis, int):
        raise spec.error(f"axis={axis!r}: normalizing over several axes is not converted yet.")
    scale, center = spec.option("scale", True), spec.option("center", True)
    names = [*(["gamma"] if scale else []), *(["beta"] if center else []), "moving_mean", "moving_variance"]
    found = _weights(spec, names)
    features = found["moving_mean"].shape[0]
    norm = nn.BatchNorm1d(
        features, eps=float(spec.option("epsilon", 1e-3)), momentum=1.0 - float(spec.option("momentum", 0.99))
    )
    with torch.no_grad():
        assert norm.running_mean is not None and norm.running_var is not None  # track_running_stats
        norm.running_mean.copy_(_tensor(found["moving_mean"]))
        norm.running_var.copy_(_tensor(found["moving_variance"]))
        norm.weight.copy_(_tensor(found["gamma"]) if scale else torch.ones(features))
        norm.bias.copy_(_tensor(found["beta"]) if center else torch.zeros(features))
    norm.weight.requires_grad_(scale)
    norm.bias.requires_grad_(center)
    return BatchNormalization(norm, axis)


class Pool(nn.Module):
    """Keras Max/AveragePooling1D/2D/3D, channels-last; "same" pads as TF, and an average counts only the
    values inside the input."""

    def __init__(self, kind: str, pool: tuple[int, ...], strides: tuple[int, ...], padding: str) -> None:
        super().__init__()
        self.kind, self.pool, self.strides, self.padding = kind, pool, strides, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.movedim(-1, 1)
        rank = len(self.pool)
        pads = (
            [_same_padding(s, k, st, 1) for s, k, st in zip(x.shape[2:], self.pool, self.strides)]
            if self.padding == "same"
            else [(0, 0)] * rank
        )
        if self.kind == "max":
            maximum: Any = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[rank]
            y = maximum(_pad_spatial(x, pads, value=-math.inf), self.pool, self.strides)
        else:
            average: Any = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[rank]
            y = average(_pad_spatial(x, pads), self.pool, self.strides)
            if any(before or after for before, after in pads):
                inside = _pad_spatial(torch.ones_like(x[:1, :1]), pads)
                y = y / average(inside, self.pool, self.strides)
        return y.movedim(1, -1)

    def extra_repr(self) -> str:
        return f"{self.kind}, pool={self.pool}, strides={self.strides}, padding={self.padding!r}"


def _pool(kind: str, rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _check_channels_last(spec)
        _weights(spec, [])
        pool = _tuple(spec, "pool_size", rank, 2)
        strides = _tuple(spec, "strides", rank, pool) if spec.option("strides") is not None else pool
        padding = spec.option("padding", "valid")
        if padding not in ("valid", "same"):
            raise spec.error(f"padding={padding!r} is not valid or same.")
        return Pool(kind, pool, strides, padding)

    return convert


class GlobalPool(nn.Module):
    """Keras Global{Max,Average}Pooling: over every axis between the batch and the channels."""

    def __init__(self, kind: str, keepdims: bool) -> None:
        super().__init__()
        self.kind, self.keepdims = kind, keepdims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(1, x.dim() - 1))
        if self.kind == "max":
            return x.amax(dim=dims, keepdim=self.keepdims)
        return x.mean(dim=dims, keepdim=self.keepdims)


def _global_pool(kind: str) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _check_channels_last(spec)
        _weights(spec, [])
        return GlobalPool(kind, bool(spec.option("keepdims", False)))

    return convert


class Flatten(nn.Module):
    """Keras Flatten of channels-last data: the element order Keras's Dense after it was trained on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1)


class Reshape(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return str(self.shape)


def _reshape(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    target = spec.option("target_shape")
    if not isinstance(target, list) or not all(isinstance(d, int) and (d > 0 or d == -1) for d in target):
        raise spec.error(f"target_shape={target!r} is not a list of positive sizes (one may be -1).")
    return Reshape(tuple(target))


class Merge(nn.Module):
    """Keras Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate of a list of tensors."""

    def __init__(self, kind: str, axis: int = -1) -> None:
        super().__init__()
        self.kind, self.axis = kind, axis

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        if self.kind == "concatenate":
            return torch.cat(inputs, dim=self.axis)
        if self.kind == "subtract":
            return inputs[0] - inputs[1]
        result = inputs[0]
        for other in inputs[1:]:
            if self.kind in ("add", "average"):
                result = result + other
            elif self.kind == "multiply":
                result = result * other
            elif self.kind == "maximum":
                result = torch.maximum(result, other)
            else:
                result = torch.minimum(result, other)
        return result / len(inputs) if self.kind == "average" else result

    def extra_repr(self) -> str:
        return self.kind + (f", axis={self.axis}" if self.kind == "concatenate" else "")


def _merge(kind: str) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _weights(spec, [])
        return Merge(kind, int(spec.option("axis", -1)))

    return convert


def _activation_layer(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    return Activation(_activation_name(spec, spec.option("activation")))


def _relu_layer(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    max_value, slope, threshold = (
        spec.option("max_value"),
        spec.option("negative_slope", 0.0),
        spec.option("threshold", 0.0),
    )
    if max_value is None and not slope and not threshold:
        return Activation("relu")
    if max_value == 6.0 and not slope and not threshold:
        return Activation("relu6")
    raise spec.error(
        f"ReLU(max_value={max_value}, negative_slope={slope}, threshold={threshold}) is not converted yet."
    )


def _dropout(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    return nn.Dropout(float(spec.option("rate", 0.0)))


def _no_weights(module: Callable[[], nn.Module]) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _weights(spec, [])
        return module()

    return convert


class ZeroPadding(nn.Module):
    def __init__(self, pads: list[tuple[int, int]]) -> None:
        super().__init__()
        self.pads = pads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _pad_spatial(x.movedim(-1, 1), self.pads).movedim(1, -1)


def _zero_padding(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _check_channels_last(spec)
        _weights(spec, [])
        value = spec.option("padding", 1)
        if isinstance(value, int):
            pads = [(value, value)] * rank
        else:
            pads = [(item, item) if isinstance(item, int) else tuple(item) for item in value]
        if len(pads) != rank or not all(len(p) == 2 and all(isinstance(a, int) and a >= 0 for a in p) for p in pads):
            raise spec.error(f"padding={value!r} is not {rank} (before, after) pairs.")
        return ZeroPadding([(int(a), int(b)) for a, b in pads])

    return convert


CONVERTERS: dict[str, Callable[[LayerSpec], nn.Module]] = {
    "Dense": _dense,
    "Conv1D": _conv(1),
    "Conv2D": _conv(2),
    "Conv3D": _conv(3),
    "DepthwiseConv1D": _depthwise_conv(1),
    "DepthwiseConv2D": _depthwise_conv(2),
    "BatchNormalization": _batch_normalization,
    "Activation": _activation_layer,
    "ReLU": _relu_layer,
    "Dropout": _dropout,
    "SpatialDropout1D": _dropout,
    "SpatialDropout2D": _dropout,
    "SpatialDropout3D": _dropout,
    "GaussianDropout": _no_weights(nn.Identity),  # inference: identity, as in Keras
    "GaussianNoise": _no_weights(nn.Identity),
    "Flatten": _no_weights(Flatten),
    "Reshape": _reshape,
    "MaxPooling1D": _pool("max", 1),
    "MaxPooling2D": _pool("max", 2),
    "MaxPooling3D": _pool("max", 3),
    "AveragePooling1D": _pool("average", 1),
    "AveragePooling2D": _pool("average", 2),
    "AveragePooling3D": _pool("average", 3),
    "GlobalMaxPooling1D": _global_pool("max"),
    "GlobalMaxPooling2D": _global_pool("max"),
    "GlobalMaxPooling3D": _global_pool("max"),
    "GlobalAveragePooling1D": _global_pool("average"),
    "GlobalAveragePooling2D": _global_pool("average"),
    "GlobalAveragePooling3D": _global_pool("average"),
    "ZeroPadding1D": _zero_padding(1),
    "ZeroPadding2D": _zero_padding(2),
    "ZeroPadding3D": _zero_padding(3),
    "Add": _merge("add"),
    "Subtract": _merge("subtract"),
    "Multiply": _merge("multiply"),
    "Average": _merge("average"),
    "Maximum": _merge("maximum"),
    "Minimum": _merge("minimum"),
    "Concatenate": _merge("concatenate"),
}
