"""Propose a target -> source name mapping when the names differ completely; suggest near names.

What belongs here: ``propose_mapping`` (pairs a torch model's layers with a
source's layers by layer type, order and shape, and says how sure it is) and
``nearest_names`` (for "missing required name" errors). What does not:
applying anything (warm start does that, after the user confirms) or reading
files (the format modules).

How ``propose_mapping`` decides:

1. Both sides are grouped into layers: the target by its modules (or by
   state_dict prefixes when only shapes are given), the source by the prefix of
   each tensor name (``dense_1/kernel`` is member ``kernel`` of layer
   ``dense_1``). Optimizer slots and bookkeeping (``.../Adam``,
   ``.OPTIMIZER_SLOT``, ``optimizer/...``, ``global_step``, ``save_counter``)
   are set aside and reported, never matched.
2. Each layer gets a kind (dense, conv, depthwise, conv_transpose, batchnorm,
   layernorm, embedding) from its module type or its member names and shapes;
   convolutions are further split by rank. A source's depthwise layers are
   told by their ``depthwise_kernel`` (Keras 2's name; the Keras reader gives
   Keras 3's depthwise ``kernel`` that alias from the layer's class); where the
   source has none, unmatched depthwise targets name, as advice only, the
   Conv-looking source layers whose kernel would fit them.
3. Within each kind, layers are paired in order: the target's module order,
   and the source's ``source_order`` if given, else its names sorted with
   numbers compared as numbers (``dense``, ``dense_1``, ..., ``dense_10``;
   Keras numbers each layer type separately, so this is creation order).
4. Every member is checked: the source shape after the layout conversion
   (``layouts.CONVERTERS``) must equal the target shape.

Statuses: ``confident`` (same number of layers of that kind on both sides,
shapes agree), ``ambiguous`` (the counts differ and an order-preserving
alignment by shape was guessed, or a Dense follows a convolution so the
Flatten order may differ), ``mismatch`` (paired by order but shapes disagree),
``unmatched`` (no source for that target). The first three come with a
source name; only the user's confirmation turns proposals into a mapping.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from .layouts import converted_shape
from .source import TensorInfo, WeightSource

__all__ = ["MatchResult", "Proposal", "nearest_names", "propose_mapping"]

Shape = tuple[int, ...]

CONFIDENT, AMBIGUOUS, MISMATCH, UNMATCHED = "confident", "ambiguous", "mismatch", "unmatched"

_IGNORED_SOURCES = (
    (re.compile(r"(^|/)(Adam|Adagrad|RMSProp|Momentum|Ftrl|Adadelta|Nadam|SGD)(_\d+)?(/|$)"), "optimizer slot"),
    (re.compile(r"\.OPTIMIZER_SLOT|(^|/)optimizer(/|$)"), "optimizer state"),
    (
        re.compile(r"(^|/)(global_step|save_counter|beta1_power|beta2_power|_CHECKPOINTABLE_OBJECT_GRAPH)(/|$)"),
        "training bookkeeping",
    ),
    (re.compile(r"(^|/)(iter|iterations|learning_rate|decay)(/|$)"), "optimizer state"),
)
_SUFFIXES = ("/.ATTRIBUTES/VARIABLE_VALUE", ":0")

# Target member <- (source member, converter), per kind, for TF/Keras-named sources.
_TF_MEMBERS: Mapping[str, Mapping[str, tuple[str, str]]] = {
    "dense": {"weight": ("kernel", "dense_to_linear"), "bias": ("bias", "identity")},
    "conv": {"weight": ("kernel", "conv_to_torch"), "bias": ("bias", "identity")},
    "depthwise": {"weight": ("depthwise_kernel", "depthwise_conv_to_torch"), "bias": ("bias", "identity")},
    "conv_transpose": {"weight": ("kernel", "conv_transpose_to_torch"), "bias": ("bias", "identity")},
    "batchnorm": {
        "weight": ("gamma", "identity"),
        "bias": ("beta", "identity"),
        "running_mean": ("moving_mean", "identity"),
        "running_var": ("moving_variance", "identity"),
    },
    "layernorm": {"weight": ("gamma", "identity"), "bias": ("beta", "identity")},
    "embedding": {"weight": ("embeddings", "embedding")},
}
# Keras 3 ``.weights.h5`` numbers variables (``vars/0``); their names by kind, in Keras's creation order.
_NUMBERED_MEMBERS = {
    "dense": ("kernel", "bias"),
    "conv": ("kernel", "bias"),
    "batchnorm": ("gamma", "beta", "moving_mean", "moving_variance"),
    "layernorm": ("gamma", "beta"),
    "embedding": ("embeddings",),
}
_TORCH_MEMBERS = {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Proposal:
    """One proposed assignment: target name <- source name, with the layout converter to apply."""

    target: str
    source: str | None
    converter: str | None
    """A name in ``layouts.CONVERTERS``; None when there is no source."""
    confidence: float
    """0 to 1: how likely the pairing is right (1 only for exact structure agreement)."""
    status: str
    """``confident``, ``ambiguous``, ``mismatch`` or ``unmatched``."""
    reason: str
    """Why, in words for people (code reads ``flatten``, never this text)."""
    flatten: tuple[int, int] | None = None
    """(channels, height*width) when the target is a Linear after a Flatten of a convolution's feature map and
    the source a Dense kernel: its rows are in the order the source flattened, which no name tells."""

    def described(self) -> str:
        """``reason``, with the advice for a Linear after a Flatten in Python's words."""
        if self.flatten is None:
            return self.reason
        channels, positions = self.flatten
        return self.reason + flatten_advice(
            f"layouts.flatten_dense_converter({channels}, height, width) where height*width = {positions}"
        )


def flatten_advice(converter: str) -> str:
    """What to do about a Linear after a Flatten, naming ``converter`` (the flatten converter, in some words)."""
    return (
        "; the proposed dense_to_linear is right if the source flattened channels first, or if this module "
        "flattens in the source's order (e.g. permutes to NHWC before flatten, as a model mirroring Keras does); "
        f"if the source flattened NHWC features (Keras's default) and this module flattens NCHW, convert with "
        f"{converter}"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MatchResult:
    """The proposals, for the report and for the user to confirm; nothing has been applied."""

    proposals: tuple[Proposal, ...]
    unused_sources: tuple[str, ...]
    """Source tensors no proposal uses (layers left over, unrecognised tensors)."""
    ignored_sources: tuple[tuple[str, str], ...]
    """(source name, why): optimizer slots and bookkeeping, never matched."""

    @property
    def flagged(self) -> list[Proposal]:
        """Proposals the user must look at: ambiguous pairings and shape mismatches."""
        return [p for p in self.proposals if p.status in (AMBIGUOUS, MISMATCH)]

    @property
    def unmatched(self) -> list[Proposal]:
        return [p for p in self.proposals if p.status == UNMATCHED]

    def mapping(self, *, include_ambiguous: bool = False) -> dict[str, str]:
        """Target -> source for the confident proposals (and the ambiguous ones if asked); never mismatches."""
        accepted = {CONFIDENT, AMBIGUOUS} if include_ambiguous else {CONFIDENT}
        return {p.target: p.source for p in self.proposals if p.status in accepted and p.source is not None}

    def converters(self) -> dict[str, str]:
        """Target -> converter name, for every proposal with a source."""
        return {p.target: p.converter for p in self.proposals if p.source is not None and p.converter}


@dataclasses.dataclass
class _Layer:
    path: str
    kind: str
    members: dict[str, tuple[str, Shape]]  # member -> (full name, shape)
    torch_names: bool = False
    """Source side: members are already torch names (weight, bias, ...)."""
    flatten_channels: int | None = None
    """Target side: a Dense that follows a convolution with this many channels."""

    @property
    def family(self) -> str:
        if self.kind in ("conv", "depthwise", "conv_transpose"):
            for name in ("weight", "kernel", "depthwise_kernel"):
                if name in self.members:
                    return f"{self.kind}{len(self.members[name][1]) - 2}d"
        return self.kind


def nearest_names(name: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """Up to ``n`` candidates closest to ``name``, best first (difflib ratio, then same last component)."""
    candidates = list(candidates)
    close = difflib.get_close_matches(name, candidates, n=n, cutoff=0.4)
    if len(close) < n:
        # Different scopes, same variable ("model/dense/kernel" vs "dense_3/kernel"): compare the tails.
        tail = re.split(r"[/.]", name)[-1]
        close += [c for c in candidates if re.split(r"[/.]", c)[-1] == tail and c not in close][: n - len(close)]
    return close


def propose_mapping(
    target: torch.nn.Module | Mapping[str, Any],
    source: WeightSource | Sequence[TensorInfo],
    *,
    source_order: Sequence[str] | None = None,
) -> MatchResult:
    """Propose target name -> source name (+ converter) by layer kind, order and shape; apply nothing.

    Args:
        target: the torch model, or its state_dict / a mapping of name -> shape in module order.
        source: an open weight source or its ``tensors()``.
        source_order: layer paths or tensor names in the source model's true layer order (e.g. the
            ``layer_names`` of a Keras HDF5 file); default: names sorted with numbers compared as numbers.
    """
    infos = source.tensors() if isinstance(source, WeightSource) else list(source)
    target_layers = _target_layers(target)
    source_layers, ignored, unknown = _source_layers(infos, source_order)
    proposals: list[Proposal] = []
    used: set[str] = set()
    families = dict.fromkeys(layer.family for layer in target_layers)  # deterministic order
    for family in families:
        targets = [layer for layer in target_layers if layer.family == family]
        sources = [layer for layer in source_layers if layer.family == family]
        found = _match_family(family, targets, sources, used)
        if not sources and family.startswith("depthwise"):
            found = _depthwise_hint(found, targets, source_layers)
        proposals += found
    order = {name: index for index, name in enumerate(_target_names(target_layers))}
    proposals.sort(key=lambda proposal: order.get(proposal.target, len(order)))
    unused = sorted({name for layer in source_layers for name, _ in layer.members.values()} - used | set(unknown))
    return MatchResult(proposals=tuple(proposals), unused_sources=tuple(unused), ignored_sources=tuple(ignored))


def _target_names(layers: list[_Layer]) -> list[str]:
    return [name for layer in layers for name, _ in layer.members.values()]


def _match_family(family: str, targets: list[_Layer], sources: list[_Layer], used: set[str]) -> list[Proposal]:
    if not sources:
        reason = f"the source has no {family} layer" if family != "other" else "no recognised layer type"
        return [proposal for layer in targets for proposal in _unmatched(layer, reason)]
    if len(targets) == len(sources):
        pairs = list(zip(targets, sources))
        ambiguous_reason = None
    else:
        pairs = _align(targets, sources)
        ambiguous_reason = (
            f"{len(targets)} target vs {len(sources)} source {family} layers: aligned by order and shape, "
            "please confirm"
        )
    proposals = []
    paired = {id(target) for target, _ in pairs}
    for position, (target, source) in enumerate(pairs):
        base = f"{family} layer {position + 1} of {len(targets)}: {target.path or '(root)'} <- {source.path}"
        proposals += _member_proposals(target, source, base, ambiguous_reason, used)
    for layer in targets:
        if id(layer) not in paired:
            proposals += _unmatched(layer, f"no {family} layer left in the source ({len(sources)} there)")
    return proposals


def _depthwise_hint(proposals: list[Proposal], targets: list[_Layer], sources: list[_Layer]) -> list[Proposal]:
    """Unmatched depthwise targets: name the source Conv-looking layers whose kernel fits them as a depthwise
    kernel ``[*spatial, in, multiplier]``. A Keras 3 ``.weights.h5`` of a custom layer class records no class,
    and its ``kernel`` reads as a Conv's; the shape alone cannot tell, so this is advice, never a mapping."""
    wanted = {layer.members["weight"][1] for layer in targets if "weight" in layer.members}
    fitting = [
        layer.path
        for layer in sources
        if layer.kind == "conv"
        and "kernel" in layer.members
        and converted_shape("depthwise_conv_to_torch", layer.members["kernel"][1]) in wanted
    ]
    if not fitting:
        return proposals
    hint = (
        f"; the source layer(s) {', '.join(fitting[:5])} hold kernels that would fit as depthwise kernels "
        "[*spatial, in, multiplier], but the file records no layer class saying so (nothing was assumed): if "
        "they are DepthwiseConv layers, map each by name with the converter depthwise_conv_to_torch"
    )
    return [dataclasses.replace(p, reason=p.reason + hint) if p.status == UNMATCHED else p for p in proposals]


def _member_proposals(
    target: _Layer, source: _Layer, base: str, ambiguous_reason: str | None, used: set[str]
) -> list[Proposal]:
    proposals = []
    for member, (target_name, target_shape) in target.members.items():
        found = _source_member(target, source, member)
        if found is None:
            reason = (
                "torch-only counter, keeps its fresh value"
                if member == "num_batches_tracked"
                else (f"{base}, but the source layer has no counterpart of {member!r}")
            )
            proposals.append(_unmatched_name(target_name, reason))
            continue
        source_member, converter = found
        source_name, source_shape = source.members[source_member]
        used.add(source_name)
        shape = converted_shape(converter, source_shape)
        if shape != target_shape:
            proposals.append(
                Proposal(
                    target=target_name,
                    source=source_name,
                    converter=converter,
                    confidence=0.1,
                    status=MISMATCH,
                    reason=f"{base}: source shape {source_shape} becomes {shape} after {converter}, target needs "
                    f"{target_shape}",
                )
            )
            continue
        status, confidence, reason = CONFIDENT, 0.9, f"{base}: shapes agree"
        if ambiguous_reason is not None:
            status, confidence, reason = AMBIGUOUS, 0.5, f"{base}; {ambiguous_reason}"
        flatten = None
        if target.flatten_channels and converter == "dense_to_linear" and member == "weight":
            channels = target.flatten_channels
            flatten = (channels, target_shape[1] // channels)
            status, confidence = AMBIGUOUS, min(confidence, 0.5)
            reason += f"; this Linear follows a convolution with {channels} channels and has {target_shape[1]} inputs"
        proposals.append(
            Proposal(
                target=target_name,
                source=source_name,
                converter=converter,
                confidence=confidence,
                status=status,
                reason=reason,
                flatten=flatten,
            )
        )
    return proposals


def _unmatched(layer: _Layer, reason: str) -> list[Proposal]:
    return [_unmatched_name(name, reason) for name, _ in layer.members.values()]


def _unmatched_name(target_name: str, reason: str) -> Proposal:
    return Proposal(target=target_name, source=None, converter=None, confidence=0.0, status=UNMATCHED, reason=reason)


def _align(targets: list[_Layer], sources: list[_Layer]) -> list[tuple[_Layer, _Layer]]:
    """Order-preserving pairing with the most shape-compatible pairs (longest common subsequence)."""
    rows, columns = len(targets), len(sources)
    best = [[0] * (columns + 1) for _ in range(rows + 1)]
    for i in range(rows - 1, -1, -1):
        for j in range(columns - 1, -1, -1):
            fits = best[i + 1][j + 1] + 1 if _layers_fit(targets[i], sources[j]) else -1
            best[i][j] = max(fits, best[i + 1][j], best[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < rows and j < columns:
        if _layers_fit(targets[i], sources[j]) and best[i][j] == best[i + 1][j + 1] + 1:
            pairs.append((targets[i], sources[j]))
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def _layers_fit(target: _Layer, source: _Layer) -> bool:
    for member, (_, target_shape) in target.members.items():
        found = _source_member(target, source, member)
        if found is None:
            continue
        source_member, converter = found
        if converted_shape(converter, source.members[source_member][1]) != target_shape:
            return False
    return True


def _source_member(target: _Layer, source: _Layer, member: str) -> tuple[str, str] | None:
    """The source layer's member that feeds ``member`` of the target, and its converter; None if none.

    A torch source names its members as the target does; a TF/Keras one by its own names (kernel, gamma, ...).
    """
    found: tuple[str, str] | None
    if source.torch_names:
        found = member, "identity"
    else:
        found = _TF_MEMBERS.get(target.kind, {}).get(member)
    if found is None or found[0] not in source.members:
        return None
    return found


# ---------------------------------------------------------------- grouping


def _target_layers(target: torch.nn.Module | Mapping[str, Any]) -> list[_Layer]:
    if isinstance(target, torch.nn.Module):
        shapes = {name: tuple(value.shape) for name, value in target.state_dict().items()}
        kinds = {name: _module_kind(module) for name, module in target.named_modules()}
    elif isinstance(target, Mapping):
        shapes = {
            name: tuple(value.shape) if hasattr(value, "shape") else tuple(value) for name, value in target.items()
        }
        kinds = {}
    else:
        raise TypeError(
            f"propose_mapping: target must be a torch.nn.Module or a mapping name -> shape/tensor; "
            f"received {type(target).__name__}."
        )
    layers: dict[str, _Layer] = {}
    for name, shape in shapes.items():
        path, _, member = name.rpartition(".")
        layer = layers.setdefault(path, _Layer(path=path, kind="", members={}))
        layer.members[member] = (name, shape)
    previous_conv_channels = None
    for layer in layers.values():
        layer.kind = kinds.get(layer.path) or _torch_kind(layer.members)
        if layer.kind == "dense" and previous_conv_channels:
            in_features = layer.members.get("weight", ("", (0, 0)))[1][-1]
            if in_features > previous_conv_channels and in_features % previous_conv_channels == 0:
                layer.flatten_channels = previous_conv_channels
        if layer.kind in ("conv", "depthwise") and "weight" in layer.members:
            previous_conv_channels = layer.members["weight"][1][0]
        elif layer.kind not in ("batchnorm", "other"):
            previous_conv_channels = None
    return list(layers.values())


def _module_kind(module: torch.nn.Module) -> str | None:
    nn = torch.nn
    if isinstance(module, nn.Linear):
        return "dense"
    if isinstance(module, nn.modules.conv._ConvTransposeNd):
        return "conv_transpose"
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        depthwise = module.groups > 1 and module.groups == module.in_channels
        return "depthwise" if depthwise else "conv"
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return "batchnorm"
    if isinstance(module, nn.LayerNorm):
        return "layernorm"
    if isinstance(module, nn.Embedding):
        return "embedding"
    return None


def _torch_kind(members: Mapping[str, tuple[str, Shape]]) -> str:
    """A layer's kind from torch member names and shapes, when the module type is unknown."""
    if "running_mean" in members or "running_var" in members:
        return "batchnorm"
    weight = members.get("weight", ("", None))[1]
    depthwise = weight is not None and len(weight) > 1 and weight[1] == 1 and weight[0] > 1
    return _kind_by_rank(
        weight,
        matrix="dense" if "bias" in members else "embedding",
        conv="depthwise" if depthwise else "conv",
        vector="layernorm",
    )


def _kind_by_rank(shape: Shape | None, *, matrix: str, conv: str, vector: str = "other") -> str:
    """A layer's kind from the rank of its main weight: 2 is a matrix, 3 to 5 a convolution, 1 a vector."""
    if shape is None:
        return "other"
    if len(shape) == 2:
        return matrix
    if len(shape) in (3, 4, 5):
        return conv
    return vector if len(shape) == 1 else "other"


def _source_layers(
    infos: Sequence[TensorInfo], source_order: Sequence[str] | None
) -> tuple[list[_Layer], list[tuple[str, str]], list[str]]:
    ignored, unknown = [], []
    layers: dict[str, _Layer] = {}
    for info in infos:
        why = next((reason for pattern, reason in _IGNORED_SOURCES if pattern.search(info.name)), None)
        if why is not None:
            ignored.append((info.name, why))
            continue
        stripped = info.name
        for suffix in _SUFFIXES:
            stripped = stripped.removesuffix(suffix)
        separator = "/" if "/" in stripped else "."
        path, _, member = stripped.rpartition(separator)
        path = path.removesuffix(f"{separator}vars")  # Keras 3: layers/dense/vars/0
        layer = layers.setdefault(path, _Layer(path=path, kind="", members={}))
        layer.members[member] = (info.name, tuple(info.shape))
    result = []
    for layer in layers.values():
        if all(member.isdigit() for member in layer.members):
            _name_numbered_members(layer)
        layer.torch_names = bool(layer.members) and set(layer.members) <= _TORCH_MEMBERS
        layer.kind = _torch_kind(layer.members) if layer.torch_names else _tf_kind(layer)
        if layer.kind == "other":
            unknown += [name for name, _ in layer.members.values()]
        else:
            result.append(layer)
    return sorted(result, key=_order_key(source_order)), ignored, unknown


def _tf_kind(layer: _Layer) -> str:
    members = layer.members
    if "depthwise_kernel" in members and "pointwise_kernel" not in members:
        return "depthwise"
    if "embeddings" in members:
        return "embedding"
    if "moving_mean" in members or "moving_variance" in members:
        return "batchnorm"
    if "gamma" in members or "beta" in members:
        return "layernorm"
    kernel = members.get("kernel", ("", None))[1]
    return _kind_by_rank(kernel, matrix="dense", conv="conv_transpose" if "transpose" in layer.path.lower() else "conv")


def _name_numbered_members(layer: _Layer) -> None:
    """Keras 3 numbers variables; name them by the layer kind their count and shapes suggest."""
    ordered = [layer.members[key] for key in sorted(layer.members, key=int)]
    ranks = [len(shape) for _, shape in ordered]
    if len(ordered) == 4 and ranks == [1, 1, 1, 1]:
        names = _NUMBERED_MEMBERS["batchnorm"]
    elif ranks and ranks[0] == 2 and "embedding" in layer.path.lower():
        names = _NUMBERED_MEMBERS["embedding"]
    elif ranks and 2 <= ranks[0] <= 5 and all(rank == 1 for rank in ranks[1:]) and len(ordered) <= 2:
        names = _NUMBERED_MEMBERS["dense"]
    elif ranks == [1, 1]:
        names = _NUMBERED_MEMBERS["layernorm"]
    else:
        return
    layer.members = dict(zip(names, ordered))


def _order_key(source_order: Sequence[str] | None) -> Any:
    if source_order is None:
        return lambda layer: _natural_key(layer.path)
    positions = {name: index for index, name in enumerate(source_order)}

    def key(layer: _Layer) -> tuple[int, list[Any]]:
        candidates = [layer.path, *(name for name, _ in layer.members.values())]
        found = [positions[name] for name in candidates if name in positions]
        return (min(found) if found else len(positions), _natural_key(layer.path))

    return key


def _natural_key(text: str) -> list[Any]:
    # Numbers compare as numbers, so dense_2 < dense_10; (kind, value) pairs keep int and str apart.
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part]
