"""Keras layers as plain torch modules, each computing what Keras computes, in Keras's data layout.

One converter per Keras class (``CONVERTERS``): it takes the layer's config and its weights (numpy arrays in
Keras's order) and returns an ``nn.Module``. Data keeps Keras's layout between layers (each layer's
``data_format``: channels-last, NHWC, unless the file says channels_first): a channels-last convolution or
pooling moves the channels to torch's place and back around its own call (views, no copies), so Flatten,
Reshape, Concatenate and Dense see exactly Keras's element order. What differs between the frameworks is
done here, once: "same" padding that TF puts mostly at the end (an odd total pads one more after), average
pooling that divides by the values inside the input only, BatchNormalization's momentum (torch's is
``1 - keras``), kernels laid out ``[*spatial, in, out]``.

Nothing from the file is evaluated: a converter reads numbers, strings and lists from the config, and an
activation is looked up by name in ``ACTIVATIONS``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch
import torch.nn.functional as F
from torch import nn

from torchestimator.errors import KerasModelError
from torchestimator.interop.layouts import (
    batchnorm_settings,
    conv_to_torch,
    conv_transpose_to_torch,
    dense_to_linear,
    depthwise_conv_to_torch,
    embedding,
)

__all__ = ["ACTIVATIONS", "CONVERTERS", "OP_CONVERTERS", "KerasLayer", "LayerSpec", "Shaped"]


@dataclass(frozen=True)
class LayerSpec:
    """One Keras layer: its name, class, config and weights (Keras's order, e.g. kernel then bias)."""

    name: str
    class_name: str
    config: dict[str, Any]
    weights: list[numpy.ndarray]
    weight_names: tuple[str, ...] = ()
    """The weights' names in the file, where a wrapper's parts must be told apart (Bidirectional)."""

    def error(self, problem: str) -> KerasModelError:
        return KerasModelError(f"layer {self.name!r} ({self.class_name}): {problem}")

    def option(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)


@dataclass(frozen=True)
class Shaped:
    """A tensor or array a layer was built from, by shape only: what ``KerasLayer.built_with`` keeps of it."""

    kind: str  # "torch" or "numpy"
    shape: tuple[int, ...]
    dtype: str


def _shapes_only(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return Shaped("torch", tuple(value.shape), str(value.dtype).removeprefix("torch."))
    if isinstance(value, numpy.ndarray):
        return Shaped("numpy", tuple(value.shape), str(value.dtype))
    if isinstance(value, (list, tuple)):
        return type(value)(_shapes_only(item) for item in value)
    if isinstance(value, dict):
        return {key: _shapes_only(item) for key, item in value.items()}
    return value


class KerasLayer(nn.Module):
    """A converted Keras layer. ``built_with`` keeps the arguments it was built with, tensors and arrays by shape
    only (their values are the module's parameters and buffers): what ``keras_source`` writes back out as the
    constructor call of a generated ``model.py``."""

    built_with: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> KerasLayer:
        layer = super().__new__(cls)
        object.__setattr__(layer, "built_with", (_shapes_only(args), _shapes_only(kwargs)))  # before Module's init
        return layer


# Module-level functions, not lambdas: a converted model pickles whole (torch.save(model), copy.deepcopy).
def _hard_sigmoid(x: torch.Tensor) -> torch.Tensor:
    return F.relu6(x + 3.0) / 6.0


def _linear(x: torch.Tensor) -> torch.Tensor:
    return x


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return F.softmax(x, dim=-1)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(x, dim=-1)


def _hard_silu(x: torch.Tensor) -> torch.Tensor:
    return x * _hard_sigmoid(x)


def _leaky_relu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, 0.2)  # Keras's activation default (the layer's is 0.3)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "linear": _linear,
    "relu": F.relu,
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "elu": F.elu,
    "selu": F.selu,
    "softplus": F.softplus,
    "softsign": F.softsign,
    "swish": F.silu,
    "silu": F.silu,
    "gelu": F.gelu,  # Keras 3's default approximate=False: the erf form
    "exponential": torch.exp,
    "hard_sigmoid": _hard_sigmoid,
    "hard_silu": _hard_silu,
    "hard_swish": _hard_silu,
    "leaky_relu": _leaky_relu,
    "mish": F.mish,
}


def _activation_name(spec: LayerSpec, value: Any) -> str:
    name = value.get("config", {}).get("name") if isinstance(value, dict) else value
    name = "linear" if name is None else name
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise spec.error(f"activation {value!r} is not one of {', '.join(sorted(ACTIVATIONS))}.")
    return name


class Activation(KerasLayer):
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


def _channels_first(spec: LayerSpec) -> bool:
    """The layer's ``data_format``: channels_last (Keras's default) or channels_first."""
    data_format = spec.option("data_format") or "channels_last"
    if data_format not in ("channels_last", "channels_first"):
        raise spec.error(f"data_format={data_format!r} is neither channels_last nor channels_first.")
    return data_format == "channels_first"


def _to_torch_layout(x: torch.Tensor, channels_first: bool) -> torch.Tensor:
    """``x`` with its channels at torch's place (axis 1): a view, no copy."""
    return x if channels_first else x.movedim(-1, 1)


def _to_keras_layout(y: torch.Tensor, channels_first: bool) -> torch.Tensor:
    return y if channels_first else y.movedim(1, -1)


def _layout_repr(channels_first: bool) -> str:
    return ", data_format='channels_first'" if channels_first else ""


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TF's "same": output ceil(size / stride), the total padding split with the odd one after."""
    effective = (kernel - 1) * dilation + 1
    total = max((math.ceil(size / stride) - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _pad_spatial(x: torch.Tensor, pads: Sequence[tuple[int, int]], value: float = 0.0) -> torch.Tensor:
    """Pads the spatial dims of a channels-first tensor; ``pads`` in spatial order."""
    flat = [amount for before_after in reversed(pads) for amount in before_after]
    return F.pad(x, flat, value=value) if any(flat) else x


class Dense(KerasLayer):
    """Keras Dense: ``activation(x @ kernel + bias)`` over the last axis (any rank); ``weight`` is torch's
    ``[out, in]``, the kernel transposed."""

    def __init__(self, kernel: numpy.ndarray, bias: numpy.ndarray | None, activation: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(_tensor(dense_to_linear(kernel)))
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


class Conv(KerasLayer):
    """Keras Conv1D/2D/3D (and DepthwiseConv, as grouped): in and out in the layer's data_format (channels-last
    unless ``channels_first``), TF's padding."""

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
        channels_first: bool = False,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.strides, self.dilation, self.padding, self.groups = strides, dilation, padding, groups
        self.channels_first = channels_first
        self.activation = activation
        self._activation = ACTIVATIONS[activation]
        self._conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(strides)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _to_torch_layout(x, self.channels_first)
        kernel = self.weight.shape[2:]
        if self.padding == "same":
            sizes = x.shape[2:]
            x = _pad_spatial(
                x, [_same_padding(s, k, st, d) for s, k, st, d in zip(sizes, kernel, self.strides, self.dilation)]
            )
        elif self.padding == "causal":
            x = _pad_spatial(x, [((kernel[0] - 1) * self.dilation[0], 0)])
        y = self._conv(x, self.weight, self.bias, self.strides, 0, self.dilation, self.groups)
        return self._activation(_to_keras_layout(y, self.channels_first))

    def extra_repr(self) -> str:
        out, per_group, *kernel = self.weight.shape
        return (
            f"{per_group * self.groups}, {out}, kernel_size={tuple(kernel)}, strides={self.strides}, "
            f"padding={self.padding!r}, dilation={self.dilation}, groups={self.groups}, activation={self.activation}"
            + _layout_repr(self.channels_first)
        )


def _conv(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        channels_first = _channels_first(spec)
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
        weight = _tensor(conv_to_torch(kernel))  # [*k, in/g, out] -> [out, in/g, *k]
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
            channels_first=channels_first,
        )

    return convert


def _depthwise_conv(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        channels_first = _channels_first(spec)
        use_bias = spec.option("use_bias", True)
        found = _weights(spec, ["kernel", "bias"] if use_bias else ["kernel"])
        kernel = found["kernel"]  # [*k, in, multiplier]
        if kernel.ndim != rank + 2:
            raise spec.error(f"kernel of shape {list(kernel.shape)} is not a {rank}-D depthwise kernel.")
        channels = kernel.shape[-2]
        weight = depthwise_conv_to_torch(kernel)  # output channel c * multiplier + m is torch's group c, filter m
        bias = found.get("bias")
        return Conv(
            _tensor(weight),
            None if bias is None else _tensor(bias),
            strides=_tuple(spec, "strides", rank, 1),
            dilation=_tuple(spec, "dilation_rate", rank, 1),
            padding=spec.option("padding", "valid"),
            groups=channels,
            activation=_activation_name(spec, spec.option("activation")),
            channels_first=channels_first,
        )

    return convert


class BatchNormalization(KerasLayer):
    """Keras BatchNormalization over one axis (channels-last: the last), with torch's running statistics.

    Inference uses the moving mean and variance. Training normalizes with the batch's statistics and updates the
    moving ones as Keras's ``fit`` does: ``moving = moving * momentum + batch * (1 - momentum)`` with the batch's
    biased variance (torch's own BatchNorm would fold in the unbiased one). The normalized axis moves to torch's
    place and the rest is flattened, so one BatchNorm1d (which holds the parameters and statistics) serves every
    rank."""

    def __init__(self, norm: nn.BatchNorm1d, axis: int) -> None:
        super().__init__()
        self.norm, self.axis = norm, axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.axis % x.dim()
        moved = x.movedim(axis, 1)
        shape = moved.shape
        flat = moved.reshape(shape[0], shape[1], -1) if moved.dim() > 2 else moved
        norm = self.norm
        if not self.training:
            return norm(flat).reshape(shape).movedim(1, axis)
        dims = [0, *range(2, flat.dim())]
        mean, variance = flat.mean(dim=dims), flat.var(dim=dims, unbiased=False)
        assert norm.running_mean is not None and norm.running_var is not None and norm.momentum is not None
        with torch.no_grad():
            norm.running_mean.mul_(1 - norm.momentum).add_(mean.detach(), alpha=norm.momentum)
            norm.running_var.mul_(1 - norm.momentum).add_(variance.detach(), alpha=norm.momentum)
        view = [1, -1, *([1] * (flat.dim() - 2))]
        y = (flat - mean.reshape(view)) * torch.rsqrt(variance.reshape(view) + norm.eps)
        if norm.weight is not None:
            y = y * norm.weight.reshape(view) + norm.bias.reshape(view)
        return y.reshape(shape).movedim(1, axis)


def _batch_normalization(spec: LayerSpec) -> nn.Module:
    axis = spec.option("axis", -1)
    axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
    if not isinstance(axis, int):
        raise spec.error(f"axis={axis!r}: normalizing over several axes is not converted yet.")
    scale, center = spec.option("scale", True), spec.option("center", True)
    names = [*(["gamma"] if scale else []), *(["beta"] if center else []), "moving_mean", "moving_variance"]
    found = _weights(spec, names)
    features = found["moving_mean"].shape[0]
    settings = batchnorm_settings({"config": spec.config})  # warm start's reading of the same config
    norm = nn.BatchNorm1d(features, eps=settings.epsilon, momentum=1.0 - settings.momentum)
    with torch.no_grad():
        assert norm.running_mean is not None and norm.running_var is not None  # track_running_stats
        norm.running_mean.copy_(_tensor(found["moving_mean"]))
        norm.running_var.copy_(_tensor(found["moving_variance"]))
        norm.weight.copy_(_tensor(found["gamma"]) if scale else torch.ones(features))
        norm.bias.copy_(_tensor(found["beta"]) if center else torch.zeros(features))
    norm.weight.requires_grad_(scale)
    norm.bias.requires_grad_(center)
    return BatchNormalization(norm, axis)


class Pool(KerasLayer):
    """Keras Max/AveragePooling1D/2D/3D, channels-last; "same" pads as TF, and an average counts only the
    values inside the input."""

    def __init__(
        self, kind: str, pool: tuple[int, ...], strides: tuple[int, ...], padding: str, channels_first: bool = False
    ) -> None:
        super().__init__()
        self.kind, self.pool, self.strides, self.padding = kind, pool, strides, padding
        self.channels_first = channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _to_torch_layout(x, self.channels_first)
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
        return _to_keras_layout(y, self.channels_first)

    def extra_repr(self) -> str:
        return f"{self.kind}, pool={self.pool}, strides={self.strides}, padding={self.padding!r}" + _layout_repr(
            self.channels_first
        )


def _pool(kind: str, rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        channels_first = _channels_first(spec)
        _weights(spec, [])
        pool = _tuple(spec, "pool_size", rank, 2)
        strides = _tuple(spec, "strides", rank, pool) if spec.option("strides") is not None else pool
        padding = spec.option("padding", "valid")
        if padding not in ("valid", "same"):
            raise spec.error(f"padding={padding!r} is not valid or same.")
        return Pool(kind, pool, strides, padding, channels_first)

    return convert


class GlobalPool(KerasLayer):
    """Keras Global{Max,Average}Pooling: over every axis but the batch and the channels."""

    def __init__(self, kind: str, keepdims: bool, channels_first: bool = False) -> None:
        super().__init__()
        self.kind, self.keepdims, self.channels_first = kind, keepdims, channels_first

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        dims = tuple(range(2, x.dim())) if self.channels_first else tuple(range(1, x.dim() - 1))
        if self.kind == "max":
            return x.amax(dim=dims, keepdim=self.keepdims)
        if mask is not None:  # GlobalAveragePooling1D: the mean of the steps the mask keeps
            kept = mask.unsqueeze(1 if self.channels_first else -1)
            total = torch.where(kept, x, torch.zeros((), dtype=x.dtype)).sum(dim=dims, keepdim=self.keepdims)
            return total / kept.to(x.dtype).sum(dim=dims, keepdim=self.keepdims)
        return x.mean(dim=dims, keepdim=self.keepdims)

    def extra_repr(self) -> str:
        return f"{self.kind}, keepdims={self.keepdims}{_layout_repr(self.channels_first)}"


def _global_pool(kind: str) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        channels_first = _channels_first(spec)
        _weights(spec, [])
        return GlobalPool(kind, bool(spec.option("keepdims", False)), channels_first)

    return convert


class Flatten(KerasLayer):
    """Keras Flatten: the element order Keras's Dense after it was trained on. Keras flattens channels-first
    data in channels-last order (the channels moved to the end first), and so does this."""

    def __init__(self, channels_first: bool = False) -> None:
        super().__init__()
        self.channels_first = channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_first and x.dim() > 2:
            x = x.movedim(1, -1)
        return x.reshape(x.shape[0], -1)

    def extra_repr(self) -> str:
        return _layout_repr(self.channels_first).lstrip(", ")


def _flatten(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    return Flatten(_channels_first(spec))


class Reshape(KerasLayer):
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


class Merge(KerasLayer):
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


class Noise(KerasLayer):
    """Keras's training-time noise layers, the identity at inference as in Keras:

    - "dropout": Dropout (``noise_shape``: the mask's shape, None for the input's size, 1 to share along an axis);
    - "spatial": SpatialDropout1D/2D/3D, whole channels dropped (the mask spans the spatial axes);
    - "gaussian_dropout": GaussianDropout, ``x * N(1, sqrt(rate / (1 - rate)))``;
    - "gaussian_noise": GaussianNoise, ``x + N(0, stddev)``."""

    def __init__(
        self, kind: str, amount: float, noise_shape: tuple[int | None, ...] | None = None, channels_first: bool = False
    ) -> None:
        super().__init__()
        self.kind, self.amount, self.noise_shape, self.channels_first = kind, amount, noise_shape, channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.amount == 0:
            return x
        if self.kind == "gaussian_noise":
            return x + torch.randn_like(x) * self.amount
        if self.kind == "gaussian_dropout":
            return x * (1 + torch.randn_like(x) * math.sqrt(self.amount / (1 - self.amount)))
        if self.kind == "spatial":  # one draw per example and channel
            shape = [x.shape[0], *([1] * (x.dim() - 2))]
            shape = [shape[0], x.shape[1], *shape[1:]] if self.channels_first else [*shape, x.shape[-1]]
        elif self.noise_shape is not None:
            shape = [x.shape[axis] if size is None else size for axis, size in enumerate(self.noise_shape)]
        else:
            return F.dropout(x, self.amount, training=True)
        keep = torch.rand(shape, device=x.device) >= self.amount
        return x * keep.to(x.dtype) / (1 - self.amount)

    def extra_repr(self) -> str:
        return f"{self.kind}, {'stddev' if self.kind == 'gaussian_noise' else 'rate'}={self.amount}"


def _dropout(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    rate = float(spec.option("rate", 0.0))
    if not 0 <= rate < 1:
        raise spec.error(f"rate={rate!r} is not in [0, 1).")
    if spec.class_name.startswith("SpatialDropout"):
        return Noise("spatial", rate, channels_first=_channels_first(spec))
    if spec.class_name == "GaussianDropout":
        return Noise("gaussian_dropout", rate)
    noise_shape = spec.option("noise_shape")
    if noise_shape is not None and not (
        isinstance(noise_shape, list) and all(size is None or isinstance(size, int) for size in noise_shape)
    ):
        raise spec.error(f"noise_shape={noise_shape!r} is not a list of sizes (None for the input's).")
    return Noise("dropout", rate, None if noise_shape is None else tuple(noise_shape))


def _gaussian_noise(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    stddev = spec.option("stddev", 0.0)
    if not isinstance(stddev, (int, float)) or isinstance(stddev, bool) or stddev < 0:
        raise spec.error(f"stddev={stddev!r} is not a non-negative number.")
    return Noise("gaussian_noise", float(stddev))


def _no_weights(module: Callable[[], nn.Module]) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _weights(spec, [])
        return module()

    return convert


class ZeroPadding(KerasLayer):
    def __init__(self, pads: list[tuple[int, int]], channels_first: bool = False) -> None:
        super().__init__()
        self.pads, self.channels_first = pads, channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padded = _pad_spatial(_to_torch_layout(x, self.channels_first), self.pads)
        return _to_keras_layout(padded, self.channels_first)

    def extra_repr(self) -> str:
        return f"{self.pads}{_layout_repr(self.channels_first)}"


def _zero_padding(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _weights(spec, [])
        return ZeroPadding(_pairs(spec, "padding", rank, 1), _channels_first(spec))

    return convert


class SeparableConv(KerasLayer):
    """Keras SeparableConv1D/2D: a depthwise convolution (TF's padding) then a 1x1 one with the bias."""

    def __init__(self, depthwise: Conv, pointwise: Conv) -> None:
        super().__init__()
        self.depthwise, self.pointwise = depthwise, pointwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


def _separable_conv(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        channels_first = _channels_first(spec)
        use_bias = spec.option("use_bias", True)
        found = _weights(spec, ["depthwise_kernel", "pointwise_kernel", *(["bias"] if use_bias else [])])
        depthwise_kernel, pointwise_kernel = found["depthwise_kernel"], found["pointwise_kernel"]
        channels = depthwise_kernel.shape[-2]
        depthwise, pointwise = depthwise_conv_to_torch(depthwise_kernel), conv_to_torch(pointwise_kernel)
        bias = found.get("bias")
        ones = (1,) * rank
        return SeparableConv(
            Conv(
                _tensor(depthwise),
                None,
                strides=_tuple(spec, "strides", rank, 1),
                dilation=_tuple(spec, "dilation_rate", rank, 1),
                padding=spec.option("padding", "valid"),
                groups=channels,
                activation="linear",
                channels_first=channels_first,
            ),
            Conv(
                _tensor(pointwise),
                None if bias is None else _tensor(bias),
                strides=ones,
                dilation=ones,
                padding="valid",
                groups=1,
                activation=_activation_name(spec, spec.option("activation")),
                channels_first=channels_first,
            ),
        )

    return convert


class ConvTranspose(KerasLayer):
    """Keras Conv1D/2D/3DTranspose, channels-last: torch's transposed convolution without padding, then TF's
    output size ("valid": ``in * stride + max(kernel - stride, 0)``; "same": ``in * stride``, cropped as TF
    pads its forward convolution, the odd one after)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        strides: tuple[int, ...],
        padding: str,
        activation: str,
        channels_first: bool = False,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.strides, self.padding, self.activation = strides, padding, activation
        self.channels_first = channels_first
        self._activation = ACTIVATIONS[activation]
        self._conv: Any = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[len(strides)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _to_torch_layout(x, self.channels_first)
        sizes, kernel = x.shape[2:], self.weight.shape[2:]
        y = self._conv(x, self.weight, None, self.strides)
        for dim, (size, k, stride) in enumerate(zip(sizes, kernel, self.strides)):
            axis = 2 + dim
            if self.padding == "same":
                total = max(k - stride, 0)
                y = y.narrow(axis, total // 2, size * stride)
            elif stride > k:  # TF's output is in * stride: the tail the kernel never reaches is zeros
                pad = [0, 0] * (y.dim() - axis - 1) + [0, stride - k]
                y = F.pad(y, pad)
        if self.bias is not None:
            y = y + self.bias.reshape(1, -1, *([1] * len(sizes)))
        return self._activation(_to_keras_layout(y, self.channels_first))

    def extra_repr(self) -> str:
        inputs, out, *kernel = self.weight.shape
        return (
            f"{inputs}, {out}, kernel_size={tuple(kernel)}, strides={self.strides}, padding={self.padding!r}"
            + _layout_repr(self.channels_first)
        )


def _conv_transpose(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        channels_first = _channels_first(spec)
        use_bias = spec.option("use_bias", True)
        found = _weights(spec, ["kernel", "bias"] if use_bias else ["kernel"])
        if _tuple(spec, "dilation_rate", rank, 1) != (1,) * rank or spec.option("output_padding") is not None:
            raise spec.error("dilation_rate or output_padding other than the defaults is not converted yet.")
        padding = spec.option("padding", "valid")
        if padding not in ("valid", "same"):
            raise spec.error(f"padding={padding!r} is not valid or same.")
        kernel = found["kernel"]  # [*k, out, in] -> torch [in, out, *k]
        bias = found.get("bias")
        return ConvTranspose(
            _tensor(conv_transpose_to_torch(kernel)),
            None if bias is None else _tensor(bias),
            _tuple(spec, "strides", rank, 1),
            padding,
            _activation_name(spec, spec.option("activation")),
            channels_first,
        )

    return convert


class LayerNormalization(KerasLayer):
    """Keras LayerNormalization over ``axes`` (the last by default): mean and variance of those axes, gamma and
    beta shaped as them."""

    def __init__(self, axes: tuple[int, ...], epsilon: float, gamma: torch.Tensor | None, beta: torch.Tensor | None):
        super().__init__()
        self.axes, self.epsilon = axes, epsilon
        self.gamma = None if gamma is None else nn.Parameter(gamma)
        self.beta = None if beta is None else nn.Parameter(beta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        axes = tuple(axis % x.dim() for axis in self.axes)
        mean = x.mean(dim=axes, keepdim=True)
        variance = (x - mean).square().mean(dim=axes, keepdim=True)
        y = (x - mean) * torch.rsqrt(variance + self.epsilon)
        shape = [x.shape[d] if d in axes else 1 for d in range(x.dim())]
        if self.gamma is not None:
            y = y * self.gamma.reshape(shape)
        if self.beta is not None:
            y = y + self.beta.reshape(shape)
        return y

    def extra_repr(self) -> str:
        return f"axes={self.axes}, epsilon={self.epsilon}"


def _layer_normalization(spec: LayerSpec) -> nn.Module:
    if spec.option("rms_scaling"):
        raise spec.error("rms_scaling=True is not converted yet.")
    axis = spec.option("axis", -1)
    axes = tuple(axis) if isinstance(axis, list) else (axis,)
    scale, center = spec.option("scale", True), spec.option("center", True)
    found = _weights(spec, [*(["gamma"] if scale else []), *(["beta"] if center else [])])
    return LayerNormalization(
        axes,
        float(spec.option("epsilon", 1e-3)),
        _tensor(found["gamma"]) if scale else None,
        _tensor(found["beta"]) if center else None,
    )


class Crop(KerasLayer):
    """Keras Cropping1D/2D/3D: (before, after) off each spatial axis."""

    def __init__(self, crops: list[tuple[int, int]], channels_first: bool = False) -> None:
        super().__init__()
        self.crops, self.channels_first = crops, channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = 2 if self.channels_first else 1
        for dim, (before, after) in enumerate(self.crops):
            x = x.narrow(first + dim, before, x.shape[first + dim] - before - after)
        return x

    def extra_repr(self) -> str:
        return f"{self.crops}{_layout_repr(self.channels_first)}"


def _pairs(spec: LayerSpec, key: str, rank: int, default: Any) -> list[tuple[int, int]]:
    value = spec.option(key, default)
    if isinstance(value, int):
        pairs = [(value, value)] * rank
    elif rank == 1 and isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        pairs = [(value[0], value[1])]
    else:
        pairs = [(item, item) if isinstance(item, int) else tuple(item) for item in value]
    if len(pairs) != rank or not all(len(p) == 2 and all(isinstance(a, int) and a >= 0 for a in p) for p in pairs):
        raise spec.error(f"{key}={value!r} is not {rank} (before, after) pairs.")
    return [(int(a), int(b)) for a, b in pairs]


def _cropping(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _weights(spec, [])
        return Crop(_pairs(spec, "cropping", rank, 1), _channels_first(spec))

    return convert


class Permute(KerasLayer):
    def __init__(self, dims: tuple[int, ...]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, *self.dims)

    def extra_repr(self) -> str:
        return str(self.dims)


def _permute(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    dims = spec.option("dims")
    if not isinstance(dims, list) or sorted(dims) != list(range(1, len(dims) + 1)):
        raise spec.error(f"dims={dims!r} is not a permutation of 1..n.")
    return Permute(tuple(dims))


class UpSampling(KerasLayer):
    """Keras UpSampling1D/2D/3D: each value repeated ``size`` times per axis ("nearest"), or UpSampling2D's
    "bilinear" (TF's half-pixel centers, torch's align_corners=False)."""

    def __init__(self, size: tuple[int, ...], interpolation: str, channels_first: bool = False) -> None:
        super().__init__()
        self.size, self.interpolation, self.channels_first = size, interpolation, channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.interpolation == "nearest":
            first = 2 if self.channels_first else 1
            for dim, repeats in enumerate(self.size):
                x = x.repeat_interleave(repeats, dim=first + dim)
            return x
        y = F.interpolate(
            _to_torch_layout(x, self.channels_first), scale_factor=self.size, mode="bilinear", align_corners=False
        )
        return _to_keras_layout(y, self.channels_first)

    def extra_repr(self) -> str:
        return f"size={self.size}, interpolation={self.interpolation!r}{_layout_repr(self.channels_first)}"


def _upsampling(rank: int) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _weights(spec, [])
        interpolation = spec.option("interpolation", "nearest")
        if interpolation not in ("nearest", "bilinear") or (interpolation == "bilinear" and rank != 2):
            raise spec.error(f"interpolation={interpolation!r} is not converted yet.")
        return UpSampling(_tuple(spec, "size", rank, 2), interpolation, _channels_first(spec))

    return convert


class ReLU(KerasLayer):
    """Keras ReLU(max_value, negative_slope, threshold): ``max_value`` from it up, ``x`` from ``threshold`` up,
    ``negative_slope * (x - threshold)`` below."""

    def __init__(self, max_value: float | None, negative_slope: float, threshold: float) -> None:
        super().__init__()
        self.max_value, self.negative_slope, self.threshold = max_value, negative_slope, threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.where(x >= self.threshold, x, self.negative_slope * (x - self.threshold))
        return y if self.max_value is None else torch.clamp(y, max=self.max_value)

    def extra_repr(self) -> str:
        return f"max_value={self.max_value}, negative_slope={self.negative_slope}, threshold={self.threshold}"


def _relu(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    max_value = spec.option("max_value")
    return ReLU(
        None if max_value is None else float(max_value),
        float(spec.option("negative_slope", 0.0)),
        float(spec.option("threshold", 0.0)),
    )


class ParametricActivation(KerasLayer):
    """Keras LeakyReLU, ELU and Softmax layers: the activation with the layer's own constant."""

    def __init__(self, kind: str, value: float) -> None:
        super().__init__()
        self.kind, self.value = kind, value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "leaky_relu":
            return F.leaky_relu(x, self.value)
        if self.kind == "elu":
            return F.elu(x, self.value)
        return F.softmax(x, dim=int(self.value))

    def extra_repr(self) -> str:
        return f"{self.kind}, {self.value}"


def _parametric(kind: str, key: str, default: float) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _weights(spec, [])
        value = spec.option(key, default)
        if kind == "leaky_relu" and key not in spec.config and "alpha" in spec.config:  # Keras 2 spelling
            value = spec.config["alpha"]
        if isinstance(value, list):
            raise spec.error(f"{key}={value!r}: one axis only.")
        return ParametricActivation(kind, float(value))

    return convert


class PReLU(KerasLayer):
    """Keras PReLU: ``max(0, x) + alpha * min(0, x)``, alpha shaped as the input without the batch axis."""

    def __init__(self, alpha: torch.Tensor) -> None:
        super().__init__()
        self.alpha = nn.Parameter(alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x) - self.alpha * F.relu(-x)


def _prelu(spec: LayerSpec) -> nn.Module:
    return PReLU(_tensor(_weights(spec, ["alpha"])["alpha"]))


class Rescaling(KerasLayer):
    scale: torch.Tensor
    offset: torch.Tensor

    def __init__(self, scale: torch.Tensor, offset: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.offset


def _rescaling(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])

    def number(key: str, default: float) -> torch.Tensor:
        value = spec.option(key, default)
        if isinstance(value, dict):  # Keras 3 serializes a list scale as a tensor config
            value = value.get("config", {}).get("value")
        try:
            return torch.tensor(value, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):
            raise spec.error(f"{key}={value!r} is not a number or a list of numbers.") from None

    return Rescaling(number("scale", 1.0), number("offset", 0.0))


class Embedding(KerasLayer):
    """Keras Embedding: rows of ``weight`` by integer index. With ``mask_zero``, index 0 is padding: the mask
    (``compute_mask``) tells the layers after it which steps to skip, as in Keras."""

    def __init__(self, table: torch.Tensor, mask_zero: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(table)
        self.mask_zero = mask_zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.embedding(x.long(), self.weight)

    def compute_mask(self, x: torch.Tensor) -> torch.Tensor:
        return x != 0

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}" + (", mask_zero=True" if self.mask_zero else "")


def _embedding(spec: LayerSpec) -> nn.Module:
    table = _tensor(embedding(_weights(spec, ["embeddings"])["embeddings"]))
    return Embedding(table, bool(spec.option("mask_zero", False)))


class Masking(KerasLayer):
    """Keras Masking: steps whose every feature equals ``mask_value`` are zeroed and masked for the layers after
    it."""

    def __init__(self, mask_value: float) -> None:
        super().__init__()
        self.mask_value = mask_value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.compute_mask(x).unsqueeze(-1).to(x.dtype)

    def compute_mask(self, x: torch.Tensor) -> torch.Tensor:
        return (x != self.mask_value).any(dim=-1)

    def extra_repr(self) -> str:
        return f"mask_value={self.mask_value}"


_BINARY_OPS: dict[str, Callable[[Any, Any], torch.Tensor]] = {
    "Add": torch.add,
    "Subtract": torch.sub,
    "Multiply": torch.mul,
    "Divide": torch.true_divide,
    "TrueDivide": torch.true_divide,
    "Maximum": torch.maximum,
    "Minimum": torch.minimum,
    "NotEqual": torch.ne,
}


class BinaryOp(KerasLayer):
    """An elementwise op of ``keras.ops`` that a Keras 3 functional model records as a node (``x + 3.0`` in
    MobileNetV3's hard sigmoid, ``ids != 0`` for a mask): called on ``[a, b]``, either a tensor or a number, in
    the recorded order."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op
        self._function = _BINARY_OPS[op]

    def forward(self, operands: list[torch.Tensor | float]) -> torch.Tensor:
        a, b = operands
        if not isinstance(a, torch.Tensor):  # a number first: torch's ops want a tensor there
            assert isinstance(b, torch.Tensor)
            a = torch.tensor(a, dtype=b.dtype if isinstance(a, float) or b.is_floating_point() else torch.int64)
        if not isinstance(b, torch.Tensor) and self.op in ("Maximum", "Minimum"):
            b = torch.tensor(b, dtype=a.dtype)
        return self._function(a, b)

    def extra_repr(self) -> str:
        return self.op


def _binary_op(op: str) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        _weights(spec, [])
        return BinaryOp(op)

    return convert


class AnyOf(KerasLayer):
    """The op Keras 3 records for Masking's mask (its ``Any``): whether any value along ``axis`` is true."""

    def __init__(self, axis: int | tuple[int, ...] | None, keepdims: bool) -> None:
        super().__init__()
        self.axis, self.keepdims = axis, keepdims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.axis is None:
            return x.any().reshape([1] * x.dim() if self.keepdims else [])
        return torch.any(x, dim=self.axis, keepdim=self.keepdims)

    def extra_repr(self) -> str:
        return f"axis={self.axis}, keepdims={self.keepdims}"


def _any(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    axis = spec.option("axis")
    if not (
        axis is None or isinstance(axis, int) or (isinstance(axis, list) and all(isinstance(a, int) for a in axis))
    ):
        raise spec.error(f"axis={axis!r} is not an axis or a list of axes.")
    return AnyOf(tuple(axis) if isinstance(axis, list) else axis, bool(spec.option("keepdims", False)))


class LayerScale(KerasLayer):
    """keras.applications.convnext's LayerScale: ``x * gamma`` over the channels."""

    def __init__(self, gamma: torch.Tensor) -> None:
        super().__init__()
        self.gamma = nn.Parameter(gamma)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


def _layer_scale(spec: LayerSpec) -> nn.Module:
    return LayerScale(_tensor(_weights(spec, ["gamma"])["gamma"]))


class CustomScaleLayer(KerasLayer):
    """keras.applications.inception_resnet_v2's CustomScaleLayer: ``inputs[0] + inputs[1] * scale``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return inputs[0] + inputs[1] * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


def _custom_scale(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    scale = spec.option("scale")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise spec.error(f"scale={scale!r} is not a number.")
    return CustomScaleLayer(float(scale))


def _masking(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    value = spec.option("mask_value", 0.0)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise spec.error(f"mask_value={value!r} is not a number.")
    return Masking(float(value))


class Dot(KerasLayer):
    """Keras Dot(axes, normalize): per example, the sum over ``axes`` of the two inputs' product."""

    def __init__(self, axes: tuple[int, int], normalize: bool) -> None:
        super().__init__()
        self.axes, self.normalize = axes, normalize

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        a, b = inputs
        axis_a, axis_b = self.axes[0] % a.dim(), self.axes[1] % b.dim()
        if self.normalize:
            a, b = F.normalize(a, dim=axis_a), F.normalize(b, dim=axis_b)
        a = a.movedim(axis_a, -1)
        b = b.movedim(axis_b, 1)
        rest_a, rest_b = a.shape[1:-1], b.shape[2:]
        y = torch.bmm(a.reshape(a.shape[0], -1, a.shape[-1]), b.reshape(b.shape[0], b.shape[1], -1))
        y = y.reshape(a.shape[0], *rest_a, *rest_b)
        return y.unsqueeze(-1) if y.dim() == 1 else y

    def extra_repr(self) -> str:
        return f"axes={self.axes}, normalize={self.normalize}"


def _dot(spec: LayerSpec) -> nn.Module:
    _weights(spec, [])
    axes = spec.option("axes", -1)
    pair = (axes, axes) if isinstance(axes, int) else tuple(axes)
    if len(pair) != 2 or not all(isinstance(a, int) for a in pair):
        raise spec.error(f"axes={axes!r} is not an axis or a pair of axes.")
    return Dot((pair[0], pair[1]), bool(spec.option("normalize", False)))


class Recurrent(KerasLayer):
    """Keras LSTM, GRU (``reset_after=True``) and SimpleRNN on torch's fused layers, batch first.

    Keras's gate order i, f, c, o is torch's LSTM order; a GRU's z, r, h become torch's r, z, n; Keras's one bias
    is torch's input bias (the recurrent bias zero), a GRU's two biases (reset_after) are torch's two.
    ``go_backwards`` reads the sequence from its end and, as Keras, returns the outputs in that order."""

    def __init__(
        self,
        rnn: nn.RNNBase,
        return_sequences: bool,
        go_backwards: bool,
        zero_output_for_mask: bool = False,
        return_state: bool = False,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.rnn, self.return_sequences, self.go_backwards = rnn, return_sequences, go_backwards
        self.zero_output_for_mask, self.return_state = zero_output_for_mask, return_state
        self.dropout, self.recurrent_dropout = dropout, recurrent_dropout

    @property
    def state_count(self) -> int:
        """How many states Keras returns after the output with ``return_state`` (LSTM: h and c)."""
        return 2 if isinstance(self.rnn, nn.LSTM) else 1

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, initial_state: list[torch.Tensor] | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.go_backwards:
            x = x.flip(1)
            mask = None if mask is None else mask.flip(1)
        zeros = x.new_zeros(x.shape[0], self.rnn.hidden_size)
        state, cell = (zeros, zeros) if initial_state is None else (initial_state[0], initial_state[-1])
        gates = {nn.LSTM: 4, nn.GRU: 3}.get(type(self.rnn), 1)
        # Keras drops with one mask per sequence; with recurrent_dropout its cells run implementation 1, one mask
        # per gate for the inputs and for the state (stepped here: torch's fused layers drop nothing between steps).
        recurrent_masks = _dropout_masks(zeros, self.recurrent_dropout, self.training, gates)
        input_masks = _dropout_masks(x[:, 0], self.dropout, self.training, gates if recurrent_masks else 1)
        if input_masks and not recurrent_masks:
            x = x * input_masks[0].unsqueeze(1)
            input_masks = None
        if (recurrent_masks or input_masks) and mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if mask is None:
            if isinstance(self.rnn, nn.LSTM):
                y, (last_state, last_cell) = self.rnn(x, (state.unsqueeze(0), cell.unsqueeze(0)))
                state, cell = last_state[0], last_cell[0]
            else:
                y, last_state = self.rnn(x, state.unsqueeze(0))
                state = last_state[0]
        else:
            y, state, cell = self._masked(x, mask, state, cell, input_masks, recurrent_masks)
        output = y if self.return_sequences else y[:, -1]
        if not self.return_state:
            return output
        return (output, state, cell) if isinstance(self.rnn, nn.LSTM) else (output, state)

    def _masked(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        state: torch.Tensor,
        cell: torch.Tensor,
        input_masks: list[torch.Tensor] | None = None,
        recurrent_masks: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keras's masked loop, stepped here (torch's fused layers take no masks): a masked step keeps the state
        and outputs the previous output (zeros with ``zero_output_for_mask``). ``input_masks`` and
        ``recurrent_masks``, one per gate, drop inputs and state units before each gate's kernel (Keras's dropout
        and recurrent_dropout). The outputs, the last state and the last cell (LSTM)."""
        rnn = self.rnn
        weight_ih, weight_hh = rnn.get_parameter("weight_ih_l0"), rnn.get_parameter("weight_hh_l0")
        bias_ih, bias_hh = (
            (rnn.get_parameter("bias_ih_l0"), rnn.get_parameter("bias_hh_l0")) if rnn.bias else (None, None)
        )
        projected = _gate_linear(
            x, weight_ih, bias_ih, None if input_masks is None else [m[:, None] for m in input_masks]
        )
        output, outputs = x.new_zeros(x.shape[0], rnn.hidden_size), []
        for step in range(x.shape[1]):
            recurrent = _gate_linear(state, weight_hh, bias_hh, recurrent_masks)
            if isinstance(rnn, nn.LSTM):
                i, f, g, o = (projected[:, step] + recurrent).chunk(4, dim=-1)
                new_cell = torch.sigmoid(f) * cell + torch.sigmoid(i) * torch.tanh(g)
                new_state = torch.sigmoid(o) * torch.tanh(new_cell)
            elif isinstance(rnn, nn.GRU):
                input_r, input_z, input_n = projected[:, step].chunk(3, dim=-1)
                state_r, state_z, state_n = recurrent.chunk(3, dim=-1)
                r, z = torch.sigmoid(input_r + state_r), torch.sigmoid(input_z + state_z)
                new_state = (1 - z) * torch.tanh(input_n + r * state_n) + z * state
                new_cell = cell
            else:
                activation = torch.tanh if rnn.nonlinearity == "tanh" else torch.relu
                new_state, new_cell = activation(projected[:, step] + recurrent), cell
            keep = mask[:, step].unsqueeze(-1)
            output = torch.where(keep, new_state, torch.zeros_like(output) if self.zero_output_for_mask else output)
            state, cell = torch.where(keep, new_state, state), torch.where(keep, new_cell, cell)
            outputs.append(output)
        return torch.stack(outputs, dim=1), state, cell

    def extra_repr(self) -> str:
        return f"return_sequences={self.return_sequences}, go_backwards={self.go_backwards}" + _dropouts_repr(self)


def _dropouts_repr(layer: Any) -> str:
    return "".join(
        f", {name}={getattr(layer, name)}" for name in ("dropout", "recurrent_dropout") if getattr(layer, name)
    )


def _dropout_masks(like: torch.Tensor, rate: float, training: bool, count: int) -> list[torch.Tensor] | None:
    """Keras's RNN dropout masks, ``count`` of them (one per gate, or one shared): one draw per sequence, shared
    by every step, the kept values scaled by 1/(1-rate). None outside training or at rate 0."""
    if not training or rate == 0:
        return None
    return [(torch.rand_like(like) >= rate).to(like.dtype) / (1 - rate) for _ in range(count)]


def _gate_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, masks: list[torch.Tensor] | None
) -> torch.Tensor:
    """``F.linear`` for a torch RNN weight of stacked gates, each gate's input multiplied by its own mask."""
    if masks is None:
        return F.linear(x, weight, bias)
    weights = weight.chunk(len(masks), dim=0)
    biases = [None] * len(masks) if bias is None else bias.chunk(len(masks))
    return torch.cat([F.linear(x * m, w, b) for m, w, b in zip(masks, weights, biases)], dim=-1)


class GRUResetBefore(KerasLayer):
    """Keras GRU with ``reset_after=False`` (Keras 2's default, TF 1's GRUCell): the reset gate applies to the
    state before the recurrent kernel, which torch's GRU cannot express; stepped here."""

    def __init__(
        self,
        kernel: torch.Tensor,
        recurrent: torch.Tensor,
        bias: torch.Tensor | None,
        return_sequences: bool,
        go_backwards: bool,
        zero_output_for_mask: bool = False,
        return_state: bool = False,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
    ):
        super().__init__()
        self.kernel, self.recurrent = nn.Parameter(kernel), nn.Parameter(recurrent)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.return_sequences, self.go_backwards = return_sequences, go_backwards
        self.zero_output_for_mask, self.return_state = zero_output_for_mask, return_state
        self.dropout, self.recurrent_dropout = dropout, recurrent_dropout
        self.state_count = 1

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, initial_state: list[torch.Tensor] | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.go_backwards:
            x = x.flip(1)
            mask = None if mask is None else mask.flip(1)
        units = self.recurrent.shape[0]
        state = x.new_zeros(x.shape[0], units) if initial_state is None else initial_state[0]
        output, outputs = x.new_zeros(x.shape[0], units), []
        # As Recurrent: one shared input mask, or with recurrent_dropout one per gate (z, r, h) for both.
        recurrent_masks = _dropout_masks(output, self.recurrent_dropout, self.training, 3)
        input_masks = _dropout_masks(x[:, 0], self.dropout, self.training, 3 if recurrent_masks else 1)
        if input_masks is None:
            projected = x @ self.kernel + (0 if self.bias is None else self.bias)
        else:  # _gate_linear takes the kernel as [3 * units, features], gates z, r, h
            per_gate = input_masks * 3 if len(input_masks) == 1 else input_masks
            projected = _gate_linear(x, self.kernel.t(), self.bias, [m[:, None] for m in per_gate])
        ones = [torch.ones((), dtype=x.dtype)] * 3
        for step in range(x.shape[1]):
            masks = recurrent_masks or ones
            inputs_z, inputs_r, inputs_h = projected[:, step].split(units, dim=-1)
            recurrent_z = (state * masks[0]) @ self.recurrent[:, :units]
            recurrent_r = (state * masks[1]) @ self.recurrent[:, units : 2 * units]
            z = torch.sigmoid(inputs_z + recurrent_z)
            r = torch.sigmoid(inputs_r + recurrent_r)
            state_h = state * masks[2]
            candidate = torch.tanh(inputs_h + (r * state_h) @ self.recurrent[:, 2 * units :])
            new_state = z * state + (1 - z) * candidate
            if mask is None:
                state = output = new_state
            else:  # as Recurrent._masked: a masked step keeps the state, outputs the previous output (or zeros)
                keep = mask[:, step].unsqueeze(-1)
                previous = torch.zeros_like(output) if self.zero_output_for_mask else output
                output, state = torch.where(keep, new_state, previous), torch.where(keep, new_state, state)
            outputs.append(output)
        result = torch.stack(outputs, dim=1) if self.return_sequences else output
        return (result, state) if self.return_state else result


def _rnn_dropouts(spec: LayerSpec) -> tuple[float, float]:
    """``dropout`` and ``recurrent_dropout``: applied in training, as Keras's fit does."""
    rates = (spec.option("dropout", 0.0) or 0.0, spec.option("recurrent_dropout", 0.0) or 0.0)
    if not all(isinstance(rate, (int, float)) and 0 <= rate < 1 for rate in rates):
        raise spec.error(f"dropout, recurrent_dropout = {rates!r} are not rates in [0, 1).")
    return float(rates[0]), float(rates[1])


def _check_recurrent(spec: LayerSpec, activations: tuple[str, ...]) -> None:
    for key, default in (("activation", "tanh"), ("recurrent_activation", "sigmoid")):
        if key in spec.config or key == "activation":
            name = _activation_name(spec, spec.option(key, default))
            allowed = activations if key == "activation" else ("sigmoid",)
            if name not in allowed:
                raise spec.error(f"{key}={name!r}: torch's fused layer computes {'/'.join(allowed)} only.")
    for key in ("stateful",):
        if spec.option(key):
            raise spec.error(f"{key}=True is not converted yet.")


def _recurrent(kind: str) -> Callable[[LayerSpec], nn.Module]:
    def convert(spec: LayerSpec) -> nn.Module:
        use_bias = spec.option("use_bias", True)
        found = _weights(spec, ["kernel", "recurrent_kernel", *(["bias"] if use_bias else [])])
        kernel, recurrent, bias = found["kernel"], found["recurrent_kernel"], found.get("bias")
        units = recurrent.shape[0]
        sequences, backwards = bool(spec.option("return_sequences", False)), bool(spec.option("go_backwards", False))
        zero_output_for_mask = bool(spec.option("zero_output_for_mask", False))
        if kind == "GRU" and not spec.option("reset_after", True):
            _check_recurrent(spec, ("tanh",))
            return GRUResetBefore(
                _tensor(kernel),
                _tensor(recurrent),
                None if bias is None else _tensor(bias),
                sequences,
                backwards,
                zero_output_for_mask,
                bool(spec.option("return_state", False)),
                *_rnn_dropouts(spec),
            )
        if kind == "SimpleRNN":
            _check_recurrent(spec, ("tanh", "relu"))
            name = _activation_name(spec, spec.option("activation", "tanh"))
            rnn: nn.RNNBase = nn.RNN(kernel.shape[0], units, nonlinearity=name, bias=use_bias, batch_first=True)
            order = [0]
        else:
            _check_recurrent(spec, ("tanh",))
            if kind == "LSTM":
                rnn, order = nn.LSTM(kernel.shape[0], units, bias=use_bias, batch_first=True), [0, 1, 2, 3]
            else:
                rnn, order = nn.GRU(kernel.shape[0], units, bias=use_bias, batch_first=True), [1, 0, 2]

        def gates(matrix: numpy.ndarray) -> torch.Tensor:  # Keras [in, gates * units] -> torch [gates * units, in]
            blocks = numpy.split(matrix, len(order), axis=-1)
            return _tensor(numpy.concatenate([blocks[index] for index in order], axis=-1).T)

        parameters = dict(rnn.named_parameters())
        with torch.no_grad():
            parameters["weight_ih_l0"].copy_(gates(kernel))
            parameters["weight_hh_l0"].copy_(gates(recurrent))
            if bias is not None:
                biases = bias.reshape(2, -1) if kind == "GRU" else numpy.stack([bias, numpy.zeros_like(bias)])
                parameters["bias_ih_l0"].copy_(gates(biases[0][None, :]).reshape(-1))
                parameters["bias_hh_l0"].copy_(gates(biases[1][None, :]).reshape(-1))
        return Recurrent(
            rnn,
            sequences,
            backwards,
            zero_output_for_mask,
            bool(spec.option("return_state", False)),
            *_rnn_dropouts(spec),
        )

    return convert


class Bidirectional(KerasLayer):
    """Keras Bidirectional: the forward layer and a backward one (reading from the end), the backward outputs put
    back in time order, merged ("concat", "sum", "mul", "ave")."""

    def __init__(self, forward_layer: nn.Module, backward_layer: nn.Module, merge_mode: str, sequences: bool):
        super().__init__()
        self.forward_layer, self.backward_layer = forward_layer, backward_layer
        self.merge_mode, self.sequences = merge_mode, sequences

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            ahead, behind = self.forward_layer(x), self.backward_layer(x)
        else:
            ahead, behind = self.forward_layer(x, mask=mask), self.backward_layer(x, mask=mask)
        if self.sequences:
            behind = behind.flip(1)
        if self.merge_mode == "concat":
            return torch.cat([ahead, behind], dim=-1)
        if self.merge_mode == "sum":
            return ahead + behind
        if self.merge_mode == "mul":
            return ahead * behind
        return (ahead + behind) / 2

    def extra_repr(self) -> str:
        return f"merge_mode={self.merge_mode!r}"


def _inner(
    spec: LayerSpec, entry: Any, weights: list[numpy.ndarray], suffix: str
) -> tuple[LayerSpec, Callable[[LayerSpec], nn.Module]]:
    if not isinstance(entry, dict) or entry.get("class_name") not in CONVERTERS:
        kind = entry.get("class_name") if isinstance(entry, dict) else entry
        raise spec.error(f"wraps a {kind!r}, which is not converted (yet).")
    if entry.get("registered_name") not in (None, entry["class_name"]):
        raise spec.error(f"wraps a custom object {entry.get('registered_name')!r}; it is never run.")
    config = entry.get("config") or {}
    return LayerSpec(f"{spec.name}/{config.get('name', suffix)}", entry["class_name"], config, weights), CONVERTERS[
        entry["class_name"]
    ]


def _bidirectional(spec: LayerSpec) -> nn.Module:
    merge_mode = spec.option("merge_mode", "concat")
    if merge_mode not in ("concat", "sum", "mul", "ave"):
        raise spec.error(f"merge_mode={merge_mode!r}: two separate outputs are not converted yet.")
    forward_entry = spec.option("layer")
    backward_entry = spec.option("backward_layer") or {
        **forward_entry,
        "config": {**(forward_entry or {}).get("config", {}), "go_backwards": True},
    }
    if len(spec.weights) % 2:
        raise spec.error(f"{len(spec.weights)} weights cannot split between a forward and a backward layer.")
    # Keras 3's archive lists the backward layer's variables first (its groups sort by name); legacy files list
    # Keras's own order, forward first. The names tell them apart.
    backward = [index for index, name in enumerate(spec.weight_names) if "backward" in name]
    if len(backward) * 2 != len(spec.weights):
        backward = list(range(len(spec.weights) // 2, len(spec.weights)))
    ahead = [index for index in range(len(spec.weights)) if index not in backward]
    forward_spec, forward_convert = _inner(spec, forward_entry, [spec.weights[i] for i in ahead], "forward")
    backward_spec, backward_convert = _inner(spec, backward_entry, [spec.weights[i] for i in backward], "backward")
    # Keras's Bidirectional runs its backward layer backwards, and sets both layers' zero_output_for_mask to
    # their return_sequences (masked steps of a sequence output are zeros, not the previous output).
    sequences = bool(forward_spec.option("return_sequences", False))
    if forward_spec.option("return_state") or backward_spec.option("return_state"):
        raise spec.error("return_state=True inside a Bidirectional is not converted yet.")
    forward_spec = dataclasses.replace(forward_spec, config={**forward_spec.config, "zero_output_for_mask": sequences})
    backward_spec = dataclasses.replace(
        backward_spec, config={**backward_spec.config, "go_backwards": True, "zero_output_for_mask": sequences}
    )
    return Bidirectional(forward_convert(forward_spec), backward_convert(backward_spec), merge_mode, sequences)


class TimeDistributed(KerasLayer):
    """Keras TimeDistributed: the inner layer on every step, steps folded into the batch."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps = x.shape[:2]
        y = self.layer(x.reshape(batch * steps, *x.shape[2:]))
        return y.reshape(batch, steps, *y.shape[1:])


def _time_distributed(spec: LayerSpec) -> nn.Module:
    inner, convert = _inner(spec, spec.option("layer"), spec.weights, "layer")
    return TimeDistributed(convert(inner))


class Normalization(KerasLayer):
    """Keras Normalization over ``axes`` (the last by default): ``(x - mean) / max(sqrt(variance), 1e-7)``
    (Keras's epsilon), or its inverse; the statistics shaped as those axes."""

    mean: torch.Tensor
    variance: torch.Tensor

    def __init__(self, mean: torch.Tensor, variance: torch.Tensor, invert: bool, axes: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("variance", variance)
        self.invert, self.axes = invert, axes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = {axis % x.dim() for axis in self.axes}
        shape = [x.shape[d] if d in kept else 1 for d in range(x.dim())]
        mean, variance = self.mean.reshape(shape), self.variance.reshape(shape)
        deviation = torch.clamp(torch.sqrt(variance), min=1e-7)  # Keras: maximum(sqrt(variance), epsilon)
        return x * deviation + mean if self.invert else (x - mean) / deviation

    def extra_repr(self) -> str:
        return f"axes={self.axes}, invert={self.invert}"


def _normalization(spec: LayerSpec) -> nn.Module:
    axis = spec.option("axis", [-1])
    axes = [axis] if isinstance(axis, int) else list(axis or [])
    if not axes or not all(isinstance(item, int) and item != 0 for item in axes):
        raise spec.error(f"axis={axis!r}: normalizing every value alike (no axis) is not converted yet.")
    if spec.weights:  # adapted: mean, variance, count
        found = _weights(spec, ["mean", "variance", "count"])
        mean, variance = _tensor(found["mean"]), _tensor(found["variance"])
    elif spec.option("mean") is not None and spec.option("variance") is not None:
        try:
            mean = torch.tensor(spec.option("mean"), dtype=torch.float32)
            variance = torch.tensor(spec.option("variance"), dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):
            raise spec.error("mean and variance are not numbers or lists of numbers.") from None
    else:
        raise spec.error("neither adapted statistics nor mean and variance in its config.")
    return Normalization(mean.reshape(-1), variance.reshape(-1), bool(spec.option("invert", False)), tuple(axes))


class Resizing(KerasLayer):
    """Keras Resizing of channels-last images to (height, width): "bilinear" is TF2's resize (half-pixel centers,
    no antialiasing: torch's align_corners=False), "nearest" is torch's "nearest-exact"."""

    def __init__(self, size: tuple[int, int], interpolation: str, channels_first: bool = False) -> None:
        super().__init__()
        self.size, self.interpolation, self.channels_first = size, interpolation, channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = _to_torch_layout(x, self.channels_first)
        if self.interpolation == "bilinear":
            y = F.interpolate(images, size=self.size, mode="bilinear", align_corners=False)
        else:
            y = F.interpolate(images, size=self.size, mode="nearest-exact")
        return _to_keras_layout(y, self.channels_first)

    def extra_repr(self) -> str:
        return f"size={self.size}, interpolation={self.interpolation!r}{_layout_repr(self.channels_first)}"


def _resizing(spec: LayerSpec) -> nn.Module:
    channels_first = _channels_first(spec)
    _weights(spec, [])
    interpolation = spec.option("interpolation", "bilinear")
    if interpolation not in ("bilinear", "nearest"):
        raise spec.error(f"interpolation={interpolation!r} is not converted yet (bilinear and nearest are).")
    if spec.option("crop_to_aspect_ratio") or spec.option("pad_to_aspect_ratio"):
        raise spec.error("crop_to_aspect_ratio/pad_to_aspect_ratio are not converted yet.")
    size = (spec.option("height"), spec.option("width"))
    if not all(isinstance(side, int) and side > 0 for side in size):
        raise spec.error(f"height, width = {size!r} are not positive integers.")
    return Resizing((int(size[0]), int(size[1])), interpolation, channels_first)


class MultiHeadAttention(KerasLayer):
    """Keras MultiHeadAttention over the sequence axis of ``[batch, steps, features]`` inputs: called on
    ``[query, value]`` or ``[query, value, key]`` (key defaults to value), ``use_causal_mask`` per call. The
    query is scaled by ``1/sqrt(key_dim)`` before the scores, masked scores get Keras's -1e9, and the attention
    probabilities go through dropout in training, as in Keras."""

    def __init__(self, weights: dict[str, torch.Tensor], key_dim: int, dropout: float) -> None:
        super().__init__()
        for name, value in weights.items():
            self.register_parameter(name, nn.Parameter(value))
        self.key_dim = key_dim
        self.dropout = nn.Dropout(dropout)

    def forward(self, inputs: list[torch.Tensor], use_causal_mask: bool = False) -> torch.Tensor:
        query, value = inputs[0], inputs[1]
        key = inputs[2] if len(inputs) > 2 else value
        q = torch.einsum("btd,dhk->bthk", query, self.query_kernel) + self._bias("query_bias")
        k = torch.einsum("bsd,dhk->bshk", key, self.key_kernel) + self._bias("key_bias")
        v = torch.einsum("bsd,dhv->bshv", value, self.value_kernel) + self._bias("value_bias")
        scores = torch.einsum("bshk,bthk->bhts", k, q * (1.0 / math.sqrt(self.key_dim)))
        if use_causal_mask:
            allowed = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
            scores = scores + (~allowed).to(scores.dtype) * -1e9
        attention = self.dropout(F.softmax(scores, dim=-1))
        out = torch.einsum("bhts,bshv->bthv", attention, v)
        return torch.einsum("bthv,hvo->bto", out, self.output_kernel) + self._bias("output_bias")

    def _bias(self, name: str) -> torch.Tensor | float:
        bias = getattr(self, name, None)
        return 0.0 if bias is None else bias

    def extra_repr(self) -> str:
        query, value = self.get_parameter("query_kernel"), self.get_parameter("value_kernel")
        return f"num_heads={query.shape[1]}, key_dim={query.shape[2]}, value_dim={value.shape[2]}"


def _multi_head_attention(spec: LayerSpec) -> nn.Module:
    for key in ("use_gate", "sliding_window", "output_shape"):
        if spec.option(key):
            raise spec.error(f"{key}={spec.option(key)!r} is not converted yet.")
    axes = spec.option("attention_axes")
    if axes not in (None, [1], (1,)):
        raise spec.error(f"attention_axes={axes!r}: attention over the sequence axis of 3-D inputs only, yet.")
    use_bias = spec.option("use_bias", True)
    parts = ("query", "key", "value", "output")
    if len(spec.weights) != len(parts) * (2 if use_bias else 1):
        raise spec.error(f"expected {len(parts) * (2 if use_bias else 1)} weights, the file holds {len(spec.weights)}.")
    found: dict[str, torch.Tensor] = {}
    names = spec.weight_names or tuple(
        f"{part}/{kind}" for part in parts for kind in (("kernel", "bias") if use_bias else ("kernel",))
    )
    for name, value in zip(names, spec.weights):
        # Legacy files name them query/kernel ... attention_output/bias; a .keras archive query_dense/vars/0.
        part = next((p for p in parts if f"/{p}" in "/" + name.replace("attention_output", "output")), None)
        kind = "bias" if name.endswith(("bias", "vars/1")) else "kernel"
        if part is None or f"{part}_{kind}" in found:
            raise spec.error(f"cannot tell which projection weight {name!r} is.")
        found[f"{part}_{kind}"] = _tensor(value)
    return MultiHeadAttention(found, int(spec.option("key_dim")), float(spec.option("dropout", 0.0)))


CONVERTERS: dict[str, Callable[[LayerSpec], nn.Module]] = {
    "Dense": _dense,
    "Conv1D": _conv(1),
    "Conv2D": _conv(2),
    "Conv3D": _conv(3),
    "DepthwiseConv1D": _depthwise_conv(1),
    "DepthwiseConv2D": _depthwise_conv(2),
    "BatchNormalization": _batch_normalization,
    "Activation": _activation_layer,
    "ReLU": _relu,
    "LeakyReLU": _parametric("leaky_relu", "negative_slope", 0.3),
    "ELU": _parametric("elu", "alpha", 1.0),
    "Softmax": _parametric("softmax", "axis", -1),
    "PReLU": _prelu,
    "SeparableConv1D": _separable_conv(1),
    "SeparableConv2D": _separable_conv(2),
    "Conv1DTranspose": _conv_transpose(1),
    "Conv2DTranspose": _conv_transpose(2),
    "Conv3DTranspose": _conv_transpose(3),
    "LayerNormalization": _layer_normalization,
    "Cropping1D": _cropping(1),
    "Cropping2D": _cropping(2),
    "Cropping3D": _cropping(3),
    "Permute": _permute,
    "UpSampling1D": _upsampling(1),
    "UpSampling2D": _upsampling(2),
    "UpSampling3D": _upsampling(3),
    "Rescaling": _rescaling,
    "Normalization": _normalization,
    "Resizing": _resizing,
    "MultiHeadAttention": _multi_head_attention,
    "Embedding": _embedding,
    "Masking": _masking,
    "LayerScale": _layer_scale,
    "CustomScaleLayer": _custom_scale,
    "Dot": _dot,
    "LSTM": _recurrent("LSTM"),
    "GRU": _recurrent("GRU"),
    "SimpleRNN": _recurrent("SimpleRNN"),
    "Bidirectional": _bidirectional,
    "TimeDistributed": _time_distributed,
    "Dropout": _dropout,
    "SpatialDropout1D": _dropout,
    "SpatialDropout2D": _dropout,
    "SpatialDropout3D": _dropout,
    "GaussianDropout": _dropout,
    "GaussianNoise": _gaussian_noise,
    "Flatten": _flatten,
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

OP_CONVERTERS: dict[str, Callable[[LayerSpec], nn.Module]] = {
    **{op: _binary_op(op) for op in _BINARY_OPS},
    "Any": _any,
}
"""The ``keras.ops`` a Keras 3 functional model records as nodes (module ``keras.src.ops.*``), by class; their
names can be a layer's too (the op ``Add`` is not the layer ``Add``)."""
