"""Layout converters: TensorFlow/Keras weight layouts to PyTorch ones, on numpy arrays.

What belongs here: one small pure function per layer layout (Dense, Conv1D/2D/3D,
depthwise and transposed convolutions, Embedding), the BatchNormalization name
map and its convention check, the Flatten-order helper for a Dense layer that
follows a convolution, the registry (``CONVERTERS``) that gives each
converter the name the warm-start report shows, and converters named as text
(``converter_from_spec("flatten_dense:4,6,6")``, the CLI's ``--converter``). What does not: reading files
(the format modules) and deciding which tensor goes where (``matching.py`` and
warm start).

Every converter returns a C-contiguous array, so the result can be handed to
``torch.from_numpy`` and copied into a parameter without surprises.

Conventions, for reference:

==========================  =============================  ================================
Keras / TF layer            TF layout                      PyTorch layout
==========================  =============================  ================================
Dense ``kernel``            ``[in, out]``                  Linear ``weight [out, in]``
ConvND ``kernel``           ``[*spatial, in, out]``        ConvNd ``weight [out, in, *spatial]``
Depthwise ``kernel``        ``[*spatial, in, multiplier]``  ConvNd(groups=in) ``[in*mult, 1, *spatial]``
ConvNDTranspose ``kernel``  ``[*spatial, out, in]``        ConvTransposeNd ``[in, out, *spatial]``
Embedding ``embeddings``    ``[vocabulary, dim]``          Embedding ``weight`` (same)
==========================  =============================  ================================

Padding is not a weight: Keras ``padding="same"`` pads asymmetrically for even
kernels and strides, which ``torch.nn.Conv2d(padding=...)`` cannot express;
pad the input with ``torch.nn.functional.pad`` where that matters.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy

__all__ = [
    "BATCHNORM_NAMES",
    "CONVERTERS",
    "CONVERTER_SPECS",
    "BatchNormSettings",
    "Converter",
    "batchnorm_names",
    "batchnorm_settings",
    "check_batchnorm_conventions",
    "conv_to_torch",
    "conv_transpose_to_torch",
    "converted_shape",
    "converter_from_spec",
    "dense_to_linear",
    "depthwise_conv_to_torch",
    "embedding",
    "flatten_dense_converter",
    "flatten_nhwc_to_nchw",
    "get_converter",
    "identity",
]

logger = logging.getLogger(__name__)

Shape = tuple[int, ...]

# Keras's BatchNormalization variables and their torch.nn.BatchNorm*d counterparts.
BATCHNORM_NAMES: Mapping[str, str] = {
    "gamma": "weight",
    "beta": "bias",
    "moving_mean": "running_mean",
    "moving_variance": "running_var",
}

KERAS_BATCHNORM_EPSILON = 1e-3
KERAS_BATCHNORM_MOMENTUM = 0.99


# ------------------------------------------------------------------ converters


def identity(array: numpy.ndarray) -> numpy.ndarray:
    """Same layout in both frameworks (biases, BatchNorm vectors, LayerNorm)."""
    return numpy.ascontiguousarray(array)


def dense_to_linear(kernel: numpy.ndarray) -> numpy.ndarray:
    """Keras Dense ``kernel [in, out]`` to torch Linear ``weight [out, in]``."""
    _check_ndim(kernel, (2,), "dense_to_linear", "a Dense kernel [in, out]")
    return numpy.ascontiguousarray(kernel.T)


def conv_to_torch(kernel: numpy.ndarray) -> numpy.ndarray:
    """Conv1D/2D/3D ``kernel [*spatial, in, out]`` (HWIO) to torch ``weight [out, in, *spatial]`` (OIHW).

    Also right for grouped convolutions (Keras ``groups=g``: ``in`` is then
    in_channels / g, exactly torch's grouped weight) and for the pointwise
    kernel of a SeparableConv.
    """
    _check_ndim(kernel, (3, 4, 5), "conv_to_torch", "a convolution kernel [*spatial, in, out]")
    spatial = tuple(range(kernel.ndim - 2))
    return numpy.ascontiguousarray(kernel.transpose(kernel.ndim - 1, kernel.ndim - 2, *spatial))


def depthwise_conv_to_torch(kernel: numpy.ndarray) -> numpy.ndarray:
    """DepthwiseConv ``kernel [*spatial, in, multiplier]`` to torch ``[in*multiplier, 1, *spatial]``.

    The torch layer is ``ConvNd(in, in * multiplier, kernel_size, groups=in)``.
    TF numbers the output channels ``in_index * multiplier + m``, which is
    torch's grouping order (group ``o // multiplier``), so no channel shuffle is needed.
    """
    _check_ndim(kernel, (3, 4, 5), "depthwise_conv_to_torch", "a depthwise kernel [*spatial, in, multiplier]")
    *spatial, channels, multiplier = kernel.shape
    spatial_axes = tuple(range(len(spatial)))
    moved = kernel.transpose(len(spatial), len(spatial) + 1, *spatial_axes)  # [in, multiplier, *spatial]
    return numpy.ascontiguousarray(moved.reshape(channels * multiplier, 1, *spatial))


def conv_transpose_to_torch(kernel: numpy.ndarray) -> numpy.ndarray:
    """ConvNDTranspose ``kernel [*spatial, out, in]`` to torch ConvTransposeNd ``weight [in, out, *spatial]``.

    Both frameworks define the transposed convolution as the gradient of the
    forward convolution with the same kernel, so no spatial flip is needed:
    the axis permutation is the same as ``conv_to_torch``'s.
    """
    _check_ndim(kernel, (3, 4, 5), "conv_transpose_to_torch", "a transposed-convolution kernel [*spatial, out, in]")
    spatial = tuple(range(kernel.ndim - 2))
    return numpy.ascontiguousarray(kernel.transpose(kernel.ndim - 1, kernel.ndim - 2, *spatial))


def embedding(table: numpy.ndarray) -> numpy.ndarray:
    """Keras Embedding ``embeddings [vocabulary, dim]`` is torch Embedding ``weight``, unchanged."""
    _check_ndim(table, (2,), "embedding", "an embedding table [vocabulary, dim]")
    return numpy.ascontiguousarray(table)


def flatten_nhwc_to_nchw(kernel: numpy.ndarray, channels: int, height: int, width: int) -> numpy.ndarray:
    """Reorder the rows of a Keras Dense kernel that follows ``Flatten`` of an NHWC feature map.

    Keras flattens ``[batch, height, width, channels]``, so row ``(h*W + w)*C + c``
    of the kernel multiplies feature ``(h, w, c)``; torch flattens
    ``[batch, channels, height, width]``, where that feature sits at
    ``(c*H + h)*W + w``. The result is still a Keras-layout kernel
    ``[C*H*W, units]`` whose rows follow torch's order; convert it with
    ``dense_to_linear`` afterwards (``flatten_dense_converter`` does both).
    For Conv1D features (``[batch, length, channels]``) pass ``height=1``.
    """
    _check_ndim(kernel, (2,), "flatten_nhwc_to_nchw", "a Dense kernel [height*width*channels, units]")
    for label, value in (("channels", channels), ("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"flatten_nhwc_to_nchw: {label} must be a positive int; received {value!r}.")
    rows, units = kernel.shape
    if rows != channels * height * width:
        raise ValueError(
            f"flatten_nhwc_to_nchw: the kernel has {rows} rows, but channels*height*width = "
            f"{channels}*{height}*{width} = {channels * height * width}. Pass the shape of the feature map "
            "that enters Flatten (after the last convolution or pooling)."
        )
    reordered = kernel.reshape(height, width, channels, units).transpose(2, 0, 1, 3)
    return numpy.ascontiguousarray(reordered.reshape(rows, units))


# -------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class Converter:
    """A named layout conversion, as shown in the warm-start report."""

    name: str
    """The registry name, e.g. ``"dense_to_linear"``."""
    description: str
    """One line for the report, e.g. ``"transpose [in, out] -> [out, in]"``."""
    function: Callable[[numpy.ndarray], numpy.ndarray]
    output_shape: Callable[[Shape], Shape | None]
    """The converted shape without touching data; None when the input shape does not fit."""

    def __call__(self, array: numpy.ndarray) -> numpy.ndarray:
        return self.function(array)


def _same_shape(shape: Shape) -> Shape | None:
    return tuple(shape)


def _linear_shape(shape: Shape) -> Shape | None:
    return (shape[1], shape[0]) if len(shape) == 2 else None


def _conv_shape(shape: Shape) -> Shape | None:
    if len(shape) not in (3, 4, 5):
        return None
    return (shape[-1], shape[-2], *shape[:-2])


def _depthwise_shape(shape: Shape) -> Shape | None:
    if len(shape) not in (3, 4, 5):
        return None
    return (shape[-2] * shape[-1], 1, *shape[:-2])


def _embedding_shape(shape: Shape) -> Shape | None:
    return tuple(shape) if len(shape) == 2 else None


CONVERTERS: Mapping[str, Converter] = {
    converter.name: converter
    for converter in (
        Converter(name="identity", description="unchanged", function=identity, output_shape=_same_shape),
        Converter(
            name="dense_to_linear",
            description="Dense kernel [in, out] -> Linear weight [out, in] (transpose)",
            function=dense_to_linear,
            output_shape=_linear_shape,
        ),
        Converter(
            name="conv_to_torch",
            description="Conv kernel [*spatial, in, out] -> weight [out, in, *spatial]",
            function=conv_to_torch,
            output_shape=_conv_shape,
        ),
        Converter(
            name="depthwise_conv_to_torch",
            description="DepthwiseConv kernel [*spatial, in, mult] -> weight [in*mult, 1, *spatial] (groups=in)",
            function=depthwise_conv_to_torch,
            output_shape=_depthwise_shape,
        ),
        Converter(
            name="conv_transpose_to_torch",
            description="ConvTranspose kernel [*spatial, out, in] -> weight [in, out, *spatial]",
            function=conv_transpose_to_torch,
            output_shape=_conv_shape,
        ),
        Converter(
            name="embedding",
            description="Embedding table [vocabulary, dim], unchanged",
            function=embedding,
            output_shape=_embedding_shape,
        ),
    )
}


def get_converter(name: str) -> Converter:
    """The registered converter called ``name``; ValueError listing the known names otherwise."""
    try:
        return CONVERTERS[name]
    except KeyError:
        raise ValueError(
            f"Unknown layout converter {name!r}; known converters: {', '.join(sorted(CONVERTERS))}. "
            "For another layout, pass your own function of a numpy array."
        ) from None


def converted_shape(name: str, shape: Shape) -> Shape | None:
    """The shape the converter ``name`` would produce from ``shape``; None when it does not apply."""
    return get_converter(name).output_shape(tuple(shape))


def flatten_dense_converter(channels: int, height: int, width: int) -> Converter:
    """A converter for a Dense kernel after an NHWC Flatten: reorder rows, then transpose to a Linear weight."""
    size = channels * height * width

    def convert(kernel: numpy.ndarray) -> numpy.ndarray:
        return dense_to_linear(flatten_nhwc_to_nchw(kernel, channels, height, width))

    def output_shape(shape: Shape) -> Shape | None:
        return (shape[1], shape[0]) if len(shape) == 2 and shape[0] == size else None

    return Converter(
        name=f"flatten_nhwc_to_nchw(channels={channels}, height={height}, width={width})+dense_to_linear",
        description="Dense kernel after an NHWC Flatten: rows reordered to NCHW order, then transposed",
        function=convert,
        output_shape=output_shape,
    )


# ------------------------------------------------------------- converters as text

# Short names for the registry's converters, as the CLI's --converter TARGET=NAME[:ARGS] takes them.
_SHORT_NAMES: Mapping[str, str] = {
    "identity": "identity",
    "dense": "dense_to_linear",
    "conv": "conv_to_torch",
    "depthwise": "depthwise_conv_to_torch",
    "conv_transpose": "conv_transpose_to_torch",
    "embedding": "embedding",
}
# Converters that take arguments: name -> (argument names, factory of ints).
_WITH_ARGUMENTS: Mapping[str, tuple[tuple[str, ...], Callable[..., Converter]]] = {
    "flatten_dense": (("C", "H", "W"), flatten_dense_converter),
}

CONVERTER_SPECS: tuple[str, ...] = (
    *(f"{short} ({name})" if short != name else short for short, name in _SHORT_NAMES.items()),
    *(f"{name}:{','.join(arguments)}" for name, (arguments, _) in _WITH_ARGUMENTS.items()),
)
"""The converters ``converter_from_spec`` knows, as text: ``dense (dense_to_linear)`` (either name works),
``flatten_dense:C,H,W`` (a Dense kernel after a Flatten of a C x H x W feature map)."""


def converter_from_spec(spec: str) -> Converter:
    """The converter that ``spec`` names: ``NAME`` or ``NAME:ARG,ARG,...`` (see ``CONVERTER_SPECS``).

    ``"dense"`` and ``"dense_to_linear"`` are the same converter; ``"flatten_dense:4,6,6"`` is
    ``flatten_dense_converter(4, 6, 6)``. ValueError (one line, listing the known specs) otherwise.
    """
    if not isinstance(spec, str):
        raise TypeError(f"a converter spec must be a str such as 'dense'; received {type(spec).__name__}.")
    name, colon, text = spec.strip().partition(":")
    if name in _WITH_ARGUMENTS:
        arguments, factory = _WITH_ARGUMENTS[name]
        values = [part.strip() for part in text.split(",")] if colon else []
        if len(values) != len(arguments) or not all(re.fullmatch("[0-9]+", v) and int(v) > 0 for v in values):
            raise ValueError(
                f"converter {name!r} takes {len(arguments)} positive ints, {name}:{','.join(arguments)}; "
                f"received {spec!r}."
            )
        return factory(*(int(value) for value in values))
    registered = _SHORT_NAMES.get(name, name)
    if registered not in CONVERTERS:
        raise ValueError(f"Unknown layout converter {spec!r}; known converters: {', '.join(CONVERTER_SPECS)}.")
    if colon:
        raise ValueError(f"converter {name!r} takes no arguments; received {spec!r}.")
    return CONVERTERS[registered]


# ------------------------------------------------------------------ batch norm


def batchnorm_names(source_prefix: str, target_prefix: str, *, separator: str = "/") -> dict[str, str]:
    """Target name -> source name for one BatchNormalization layer.

    ``batchnorm_names("block1/batch_normalization", "block1.bn")`` gives
    ``{"block1.bn.weight": "block1/batch_normalization/gamma", ...}``. torch's
    ``num_batches_tracked`` has no Keras counterpart and is left out; it only
    matters with ``momentum=None``.
    """
    source = source_prefix.rstrip(separator)
    target = target_prefix.rstrip(".")
    return {
        f"{target}.{torch_name}" if target else torch_name: f"{source}{separator}{tf_name}" if source else tf_name
        for tf_name, torch_name in BATCHNORM_NAMES.items()
    }


@dataclasses.dataclass(frozen=True)
class BatchNormSettings:
    """The epsilon and momentum (Keras's convention) a source BatchNormalization layer ran with, and whence."""

    epsilon: float
    momentum: float
    origin: str
    """Where the numbers come from, for the advice: the file's config, or Keras's defaults."""


def batchnorm_settings(layer_config: Mapping[str, Any] | None) -> BatchNormSettings:
    """The settings a BatchNormalization layer's config entry records (``.keras`` config.json, legacy ``.h5``
    model_config), each falling back to Keras's default (epsilon 1e-3, momentum 0.99) where not recorded.

    ResNet50, for one, records epsilon=1.001e-5: advising Keras's default there would make outputs worse.
    """
    inner = layer_config.get("config") if isinstance(layer_config, Mapping) else None
    inner = inner if isinstance(inner, Mapping) else {}
    recorded = {
        key: inner[key]
        for key in ("epsilon", "momentum")
        if isinstance(inner.get(key), (int, float)) and not isinstance(inner.get(key), bool)
    }
    if not recorded:
        origin = "Keras's default; the source records no layer settings (a .weights.h5 or TF checkpoint has none)"
    elif len(recorded) == 2:
        origin = "as recorded in the file's model config"
    else:
        origin = f"{next(iter(recorded))} as recorded in the file's model config, the other Keras's default"
    return BatchNormSettings(
        epsilon=float(recorded.get("epsilon", KERAS_BATCHNORM_EPSILON)),
        momentum=float(recorded.get("momentum", KERAS_BATCHNORM_MOMENTUM)),
        origin=origin,
    )


def check_batchnorm_conventions(
    tf_epsilon: float | None = KERAS_BATCHNORM_EPSILON,
    tf_momentum: float | None = KERAS_BATCHNORM_MOMENTUM,
    torch_module: Any = None,
    *,
    origin: str | None = None,
) -> list[str]:
    """Warnings where a torch BatchNorm layer would not behave like the Keras/TF layer it is loaded from.

    Keras keeps ``moving = momentum * moving + (1 - momentum) * batch``; torch
    keeps ``running = (1 - momentum) * running + momentum * batch``, so Keras
    ``momentum=0.99`` is torch ``momentum=0.01``. Keras's default epsilon is
    1e-3, torch's 1e-5: a different epsilon changes inference outputs, a
    different momentum only changes how fine-tuning updates the statistics.
    (torch also updates ``running_var`` with the unbiased batch variance,
    Keras with the biased one; the difference is ``n/(n-1)`` per batch.)
    ``None`` for either TF value means unknown: that check is skipped.
    ``origin`` says where the TF values come from (``BatchNormSettings.origin``); the warnings quote it.
    """
    if torch_module is None or not hasattr(torch_module, "eps") or not hasattr(torch_module, "momentum"):
        raise TypeError(
            "check_batchnorm_conventions: torch_module must be a torch.nn.BatchNorm1d/2d/3d (with eps and "
            f"momentum); received {type(torch_module).__name__}."
        )
    whence = f" ({origin})" if origin else ""
    warnings = []
    if tf_epsilon is not None and not math.isclose(torch_module.eps, tf_epsilon, rel_tol=1e-6):
        warnings.append(
            f"BatchNorm epsilon differs: the source layer used epsilon={tf_epsilon:g}{whence}, the torch layer has "
            f"eps={torch_module.eps:g}; inference outputs will differ. Build the torch layer with eps={tf_epsilon:g}."
        )
    if tf_momentum is not None:
        expected = 1.0 - tf_momentum
        if torch_module.momentum is None:
            warnings.append(
                f"BatchNorm momentum differs: the source used a moving average with momentum={tf_momentum:g}"
                f"{whence}, the torch layer uses a cumulative average (momentum=None). Use momentum={expected:g}."
            )
        elif not math.isclose(torch_module.momentum, expected, rel_tol=1e-6, abs_tol=1e-9):
            warnings.append(
                f"BatchNorm momentum differs: TF/Keras momentum={tf_momentum:g}{whence} is torch "
                f"momentum={expected:g} (torch weights the new batch, Keras the old average), but the torch layer "
                f"has momentum={torch_module.momentum:g}. Build it with momentum={expected:g}; this only matters "
                "when fine-tuning the statistics."
            )
    # Returned, not logged as warnings: the warm-start report shows them once, next to the layer.
    for warning in warnings:
        logger.debug("%s", warning)
    return warnings


def _check_ndim(array: Any, allowed: tuple[int, ...], converter: str, expected: str) -> None:
    if not isinstance(array, numpy.ndarray):
        raise TypeError(f"{converter} expects a numpy array; received {type(array).__name__}.")
    if array.ndim not in allowed:
        raise ValueError(
            f"{converter} expects {expected} ({' or '.join(map(str, allowed))} dimensions); received shape "
            f"{tuple(array.shape)}. Check that the source tensor is the one you meant, or use another converter."
        )
