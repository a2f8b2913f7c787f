"""The source as warm start sees it: its model variables under the names the report shows, optimizer state aside.

What belongs here: one ``SourceView`` per source format family (TF checkpoints:
object paths, Keras 3's ``_kernel`` shown as ``kernel``; Keras HDF5: Keras's own
variable paths; the rest: stored names). What does not: reading the formats
(``torchestimator.interop``), choosing which target loads which source (``_build``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy

from torchestimator.interop import WeightSource
from torchestimator.interop.source import TensorInfo

__all__ = ["TF_FORMATS", "SourceView", "source_view"]

TF_FORMATS = ("tensorflow", "keras_h5", "keras3_weights_h5")


@dataclasses.dataclass
class SourceView:
    """The source's model variables under the names the report shows; optimizer state set aside."""

    source: WeightSource
    infos: dict[str, TensorInfo]  # view name -> info (info.name is the raw key)
    aliases: dict[str, str]  # raw key or other accepted name -> view name
    optimizer: dict[str, str]  # raw key -> why it is not a model variable
    order: list[str] | None

    def resolve(self, name: str) -> str | None:
        if name in self.infos:
            return name
        return self.aliases.get(name)

    def read(self, name: str) -> numpy.ndarray:
        return self.source.read(self.infos[name].name)


def source_view(source: WeightSource) -> SourceView:
    infos = {info.name: info for info in source.tensors()}
    if source.format == "tensorflow":
        return _tensorflow_view(source, infos)
    if source.format in ("keras_h5", "keras3_weights_h5"):
        return _keras_view(source, infos)
    return SourceView(source, infos, {}, {}, None)


def _tensorflow_view(source: Any, infos: dict[str, TensorInfo]) -> SourceView:
    from torchestimator.interop.tf_checkpoint import is_optimizer_variable

    variables = source.model_variables()  # friendly name -> raw key; identity for TF1
    view: dict[str, TensorInfo] = {}
    aliases: dict[str, str] = {}
    for path, key in variables.items():
        head, _, last = path.rpartition("/")
        # Keras 3 keeps Dense/Conv kernels in a private `_kernel` attribute; the layer's weight is `kernel`.
        public = f"{head}/{last.lstrip('_')}" if head and last.startswith("_") and last.lstrip("_") else path
        name = public if public not in variables and public not in view else path
        view[name] = infos[key]
        aliases.setdefault(key, name)
        aliases.setdefault(path, name)
    used = {info.name for info in view.values()}
    optimizer = {
        key: "optimizer slot or bookkeeping" if is_optimizer_variable(key) else "not a model variable"
        for key in infos
        if key not in used
    }
    return SourceView(source, view, aliases, optimizer, None)


def _keras_view(source: Any, infos: dict[str, TensorInfo]) -> SourceView:
    by_raw = {raw: alias for alias, raw in source.aliases().items()}
    view: dict[str, TensorInfo] = {}
    aliases: dict[str, str] = {}
    optimizer: dict[str, str] = {}
    for raw, info in infos.items():
        if raw.startswith(("optimizer/", "optimizer_weights/")):
            optimizer[raw] = "optimizer state"
            continue
        name = by_raw.get(raw, raw)
        view[name] = info
        aliases[raw] = name
    for alias, raw in source.aliases().items():  # a tensor with two aliases (a depthwise `kernel`) answers to both
        if raw in aliases:
            aliases.setdefault(alias, aliases[raw])
    order = [layer for layer, _ in source.layers()]
    return SourceView(source, view, aliases, optimizer, order)
