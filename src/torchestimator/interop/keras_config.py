"""What a Keras file's model config says about its layers: class, settings, and the names that follow from them.

What belongs here: reading the config a Keras file records (a ``.keras`` archive's ``config.json``, a legacy
``.h5``'s ``model_config`` attribute) as plain JSON, indexing its layers by their name path, and what the reader
derives from a layer's class: Keras 3 calls a DepthwiseConv's weight ``kernel``, Keras 2 ``depthwise_kernel``,
and only the latter tells a matcher that the tensor has the depthwise layout (``[*spatial, in, multiplier]``,
not a Conv's ``[*spatial, in, out]``). What does not: walking the HDF5 tree (``keras_h5``) or converting layouts
(``layouts``).

Nothing is deserialized into objects: custom classes and Lambda layers in a config stay JSON.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEPTHWISE_CLASSES",
    "MAX_CONFIG_BYTES",
    "class_of",
    "depthwise_alias",
    "index_layer_configs",
    "layer_config_for",
    "parse_config",
    "snake_case",
]

logger = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 64 << 20  # a config is kilobytes; it is optional, so a bigger one is ignored
# Keras's snake_case class names of the layers whose Keras 3 ``kernel`` is a depthwise kernel.
DEPTHWISE_CLASSES = frozenset({"depthwise_conv1d", "depthwise_conv2d"})
LayerIndex = dict[tuple[str, ...], dict[str, Any]]


def snake_case(name: str) -> str:
    """Keras 3's `to_snake_case`: ``Conv2D`` -> ``conv2d``, ``BatchNormalization`` -> ``batch_normalization``."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def parse_config(path: str, text: str | bytes, where: str) -> dict[str, Any] | None:
    """A model config as JSON, or None (logged) when it is too big, not JSON or not an object.

    The config is optional for reading weights, so a damaged one costs the names and settings it would
    give, never the read.
    """
    if len(text) > MAX_CONFIG_BYTES:
        logger.warning(
            "%s: ignoring %s of %d bytes (over %d); names and settings come from the weights alone",
            path,
            where,
            len(text),
            MAX_CONFIG_BYTES,
        )
        return None
    try:
        config = json.loads(text)
    except (RecursionError, ValueError) as error:
        logger.warning(
            "%s: ignoring unreadable %s (%s); names and settings come from the weights alone", path, where, error
        )
        return None
    return config if isinstance(config, dict) else None


def index_layer_configs(config: Mapping[str, Any] | None) -> LayerIndex:
    """Layer entries (``{"class_name": ..., "config": {...}}``) by user-name path, in model order.

    Nested models (a Sequential inside a Functional) add their layers under their own name:
    ``("inner", "inner_fc")``. The same structure in Keras 2 and Keras 3 configs.
    """
    index: LayerIndex = {}

    def visit(layers: Any, prefix: tuple[str, ...], depth: int) -> None:
        if depth > 64:  # JSON nesting is bounded by the parser; models nest a few levels
            return
        for layer in layers if isinstance(layers, list) else []:
            inner = layer.get("config", {}) if isinstance(layer, dict) else {}
            if not isinstance(inner, dict) or "name" not in inner:
                continue
            path = (*prefix, str(inner["name"]))
            index[path] = layer
            visit(inner.get("layers"), path, depth + 1)

    if isinstance(config, Mapping) and isinstance(config.get("config"), dict):
        visit(config["config"].get("layers"), (), 0)
    return index


def layer_config_for(index: LayerIndex, chain: tuple[str, ...]) -> dict[str, Any] | None:
    """The entry of the innermost configured layer on ``chain`` (an LSTM's ``cell`` gets the LSTM's)."""
    for end in range(len(chain), 0, -1):
        entry = index.get(chain[:end])
        if entry is not None:
            return entry
    return None


def class_of(entry: Mapping[str, Any] | None) -> str | None:
    """The snake_case class name a config entry records (``DepthwiseConv2D`` -> ``depthwise_conv2d``)."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("class_name"), str):
        return None
    return snake_case(entry["class_name"])


def depthwise_alias(layer_path: str, variable: str, layer_class: str | None) -> str | None:
    """``<layer>/depthwise_kernel`` for a depthwise layer's Keras 3 ``kernel``, else None.

    The alias is Keras 2's name of the same tensor, which says its layout; matchers then pair it with a torch
    ``ConvNd(groups=in_channels)`` and convert it with ``depthwise_conv_to_torch``, as for a Keras 2 file.
    """
    if variable != "kernel" or layer_class not in DEPTHWISE_CLASSES or not layer_path:
        return None
    return f"{layer_path}/depthwise_kernel"
