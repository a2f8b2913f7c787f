"""BatchNorm across replicas (``RunConfig(sync_batch_norm=True)``).

Belongs here: what the Estimator does to a model's BatchNorm layers before it is wrapped for several
replicas. With ``sync_batch_norm=True`` the layers are replaced, in place inside their parents, by layers
that normalise with the statistics of the global batch:

* on the devices ``torch.nn.SyncBatchNorm`` runs on (CUDA and the other accelerators it accepts), by
  torch's own layer, converted with ``nn.SyncBatchNorm.convert_sync_batchnorm``;
* elsewhere (the CPU, where torch's layer refuses to run, and gloo), by ``CrossReplicaBatchNorm``: global
  mean and biased variance for the output, the unbiased variance of the global batch for ``running_var``,
  through an all-reduce that autograd differentiates (its backward all-reduces the gradients).

In eval mode both are plain batch norm, so evaluation, predict and ``torch.export`` see ordinary layers;
the state_dict keys do not change, so checkpoints load into the plain model and back. With
``sync_batch_norm=False`` and several replicas, a one-shot hook warns when the per-replica batch is small.
``copy_sharing_process_groups`` is how the Estimator copies a module whose layers hold a process group
(torch's SyncBatchNorm with ``process_group`` set, on CUDA or built by the user): a group cannot be copied.

Does not belong here: the process group itself (the strategy's) and broadcasting buffers before a save
(``Strategy.broadcast_buffers``). The layers all-reduce themselves (``collectives.all_reduce``), as torch's
SyncBatchNorm does: a statistic computed inside ``forward`` cannot go through the strategy.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as distributed
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from torchestimator.distribute import collectives
from torchestimator.errors import ConfigError

if TYPE_CHECKING:  # a type only: the strategy module (and its launcher) need not load with this one
    from torchestimator.distribute.strategy import Strategy

logger = logging.getLogger(__name__)

__all__ = [
    "SMALL_BATCH_PER_REPLICA",
    "CrossReplicaBatchNorm",
    "convert_batch_norm",
    "copy_sharing_process_groups",
    "prepare_batch_norm",
]

SMALL_BATCH_PER_REPLICA = 16
"""Below this many examples per replica, unsynchronised BatchNorm statistics are noisy enough to warn about."""

_TORCH_SYNC_DEVICE_TYPES = frozenset({"cuda", "hpu", "xpu", torch._C._get_privateuse1_backend_name()})
"""Devices torch.nn.SyncBatchNorm accepts in training (its forward raises on any other)."""

_INPUT_RANKS: dict[type[nn.Module], tuple[int, ...] | None] = {
    nn.BatchNorm1d: (2, 3),
    nn.BatchNorm2d: (4,),
    nn.BatchNorm3d: (5,),
    nn.SyncBatchNorm: None,  # any rank >= 2
}
"""The layer types converted, with the input ranks each accepts (kept after conversion: same errors as before)."""

# The hooks users and the framework put on a layer; they move with it to its replacement.
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


class _SumOverReplicas(torch.autograd.Function):
    """Elementwise sum over the replicas of the group; its backward sums the gradients the same way.

    Every replica's loss depends on the global statistics, so the gradient reaching one replica's
    statistics is the sum of what every replica's loss sends back to them.
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        total = tensor.clone(memory_format=torch.contiguous_format)
        return collectives.all_reduce(total, group=group)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        total = grad_output.clone(memory_format=torch.contiguous_format)
        return collectives.all_reduce(total, group=ctx.group), None


def _sum_over_replicas(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    total: torch.Tensor = _SumOverReplicas.apply(tensor, group)  # type: ignore[no-untyped-call]  # torch leaves Function.apply unannotated
    return total


class _GroupReference:
    """A process group held by a layer: shared, never copied, when the model is deep-copied.

    Process groups cannot be pickled, and the Estimator copies the live module for inference during training.
    """

    def __init__(self, group: Any) -> None:
        self.group = group

    def __deepcopy__(self, memo: dict[int, Any]) -> _GroupReference:
        return self


class CrossReplicaBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are those of the global batch, over an all-reduce (gloo on the CPU).

    The same parameters, buffers and state_dict keys as ``nn.BatchNorm1d/2d/3d``, and the same semantics:
    momentum (``None``: cumulative average), ``track_running_stats``, ``affine``, ``num_batches_tracked``.
    Replicas may hold different batch sizes (an empty share included). In eval mode, or when the process
    group has one replica, it is plain batch norm. Build one from a layer with ``from_batch_norm``.

    Args:
        process_group: the replicas to share statistics with; None is the default (world) group.
        input_ranks: the input ranks accepted (``(4,)`` for a layer that was a BatchNorm2d); None is any >= 2.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        *,
        input_ranks: tuple[int, ...] | None = None,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self._group = _GroupReference(process_group)
        self.input_ranks = input_ranks

    @property
    def process_group(self) -> Any:
        """The replicas sharing statistics; None is the default (world) group."""
        return self._group.group

    @classmethod
    def from_batch_norm(cls, layer: _BatchNorm, process_group: Any = None) -> CrossReplicaBatchNorm:
        """A layer that shares ``layer``'s parameters, buffers, mode, hooks and attributes, synchronised."""
        replacement = cls(
            layer.num_features,
            layer.eps,
            layer.momentum,
            layer.affine,
            layer.track_running_stats,
            process_group,
            input_ranks=_INPUT_RANKS.get(type(layer), getattr(layer, "input_ranks", None)),
            bias=layer.bias is not None,
        )
        _take_over(layer, replacement)
        return replacement

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, synchronised across replicas"  # type: ignore[no-untyped-call]  # unannotated in torch

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if self.input_ranks is None and input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
        if self.input_ranks is not None and input.dim() not in self.input_ranks:
            expected = " or ".join(f"{rank}D" for rank in self.input_ranks)
            raise ValueError(f"expected {expected} input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or not _several_replicas(self.process_group):
            return super().forward(input)  # eval mode, one replica: plain batch norm, as torch's SyncBatchNorm
        self._check_input_dim(input)
        return self._normalise_over_replicas(input)

    def _normalise_over_replicas(self, input: torch.Tensor) -> torch.Tensor:
        # Half-precision inputs get their statistics in float32, as BatchNorm's kernels compute them.
        values = input.to(torch.promote_types(input.dtype, torch.float32))
        channels = values.shape[1]
        reduced_dims = [0, *range(2, values.dim())]
        per_channel = [1, channels] + [1] * (values.dim() - 2)
        # Sums and the count travel in float64: a float32 count is exact only up to 2**24 values per channel.
        # (Each replica sums in the input's precision, as BatchNorm's kernels do: summing in float64 cost 4x.)
        local_count = values.new_full((1,), values.numel() // channels if channels else 0, dtype=torch.float64)
        local_sums = values.sum(reduced_dims).to(torch.float64)
        totals = _sum_over_replicas(torch.cat([local_sums, local_count]), self.process_group)
        count = int(totals[-1].item())  # a host sync, free on the CPU this layer is for
        if count <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got {count} over all replicas "
                f"(input of size {list(input.shape)} on this replica): the global batch is too small for BatchNorm."
            )
        mean = totals[:-1] / count
        centered = values - mean.to(values.dtype).reshape(per_channel)
        # A second pass, over deviations from the global mean: the one-pass E[x^2] - mean^2 loses digits.
        local_squares = centered.square().sum(reduced_dims).to(torch.float64)
        squares = _sum_over_replicas(local_squares, self.process_group)
        inverse_std = torch.rsqrt(squares / count + self.eps).to(values.dtype)
        output = centered * inverse_std.reshape(per_channel)
        if self.weight is not None:
            output = output * self.weight.reshape(per_channel)
        if self.bias is not None:
            output = output + self.bias.reshape(per_channel)
        if self.track_running_stats:
            self._update_running_statistics(mean.detach(), squares.detach() / (count - 1))
        return output.to(input.dtype)

    @torch.no_grad()
    def _update_running_statistics(self, mean: torch.Tensor, unbiased_variance: torch.Tensor) -> None:
        factor = 0.0 if self.momentum is None else self.momentum
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        assert self.running_mean is not None and self.running_var is not None  # track_running_stats
        self.running_mean.mul_(1.0 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1.0 - factor).add_(unbiased_variance.to(self.running_var.dtype), alpha=factor)


def _several_replicas(process_group: Any) -> bool:
    if not (distributed.is_available() and distributed.is_initialized()):
        return False
    return distributed.get_world_size(distributed.group.WORLD if process_group is None else process_group) > 1


def _take_over(old: _BatchNorm, new: _BatchNorm) -> None:
    """``new`` holds ``old``'s tensors (the very objects: restored weights stay), mode, hooks and attributes."""
    if old.affine:
        new.weight = old.weight
        new.bias = old.bias
    if old.track_running_stats:
        new.running_mean = old.running_mean
        new.running_var = old.running_var
        new.num_batches_tracked = old.num_batches_tracked
    new.training = old.training
    # The same dict objects, so that handles already given out (hook.remove()) still reach them.
    for name in _HOOK_DICTS:
        if name in vars(old):
            vars(new)[name] = vars(old)[name]
    # Markers set on the layer (freeze's, qconfig, a user's) keep their meaning on the replacement.
    for name, value in vars(old).items():
        if name not in vars(new) and name not in ("process_group", "_group"):
            setattr(new, name, value)


def copy_sharing_process_groups(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose layers hold the very process groups the original's hold.

    A process group cannot be copied or pickled (``TypeError: cannot pickle ... ProcessGroup``), and torch's
    ``nn.SyncBatchNorm`` keeps the one it was given in ``process_group``; the Estimator copies the live
    module for inference during training (an exporter, a hook calling evaluate). ``CrossReplicaBatchNorm``
    shares its group through ``_GroupReference``; this covers any layer holding a group as an attribute.
    """
    shared: dict[int, Any] = {}
    if distributed.is_available():
        for layer in module.modules():
            for value in vars(layer).values():
                if isinstance(value, distributed.ProcessGroup):
                    shared[id(value)] = value
    return copy.deepcopy(module, shared)


# --------------------------------------------------------------------------- converting a model


def convert_batch_norm(module: nn.Module, device: torch.device | str, process_group: Any = None) -> list[str]:
    """Replace ``module``'s BatchNorm layers, in place, by synchronised ones; the names of those replaced.

    On a device torch.nn.SyncBatchNorm runs on, the replacements are torch's; elsewhere
    ``CrossReplicaBatchNorm``. Layers already synchronised for ``device`` stay as they are, so a second
    call replaces nothing. A layer shared by several parents is replaced once, everywhere.

    Raises:
        ConfigError: ``module`` is itself a BatchNorm layer (it cannot be replaced in place), or holds a
            BatchNorm subclass whose own behaviour a replacement would drop.
    """
    target = nn.SyncBatchNorm if torch.device(device).type in _TORCH_SYNC_DEVICE_TYPES else CrossReplicaBatchNorm
    if isinstance(module, _BatchNorm):
        if type(module) is target:
            return []
        raise ConfigError(
            f"RunConfig(sync_batch_norm=True) replaces the BatchNorm layers inside the model, but the model is "
            f"itself a {type(module).__name__}, which cannot be replaced in place. Build it inside a container, "
            f"e.g. nn.Sequential({type(module).__name__}(...)) (its state_dict keys then start with '0.'), "
            "or train with sync_batch_norm=False.",
            field="sync_batch_norm",
            value=True,
        )
    replacements: dict[int, nn.Module] = {}
    converted: list[str] = []
    for parent_name, parent in list(module.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not _needs_replacing(child, target, _qualified(parent_name, child_name)):
                continue
            if id(child) not in replacements:
                replacements[id(child)] = _replacement(child, target, process_group)
                converted.append(_qualified(parent_name, child_name))
            setattr(parent, child_name, replacements[id(child)])
    return converted


def _needs_replacing(layer: nn.Module, target: type[nn.Module], name: str) -> bool:
    if not isinstance(layer, _BatchNorm) or type(layer) is target:
        return False
    if type(layer) in _INPUT_RANKS or type(layer) is CrossReplicaBatchNorm:
        return True
    raise ConfigError(
        f"RunConfig(sync_batch_norm=True) cannot synchronise the layer {name!r}: it is a "
        f"{type(layer).__name__}, a BatchNorm subclass whose own forward or state a replacement would drop "
        "(lazy layers: run one forward pass first). Use nn.BatchNorm1d/2d/3d there, or train with "
        "sync_batch_norm=False.",
        field="sync_batch_norm",
        value=True,
    )


def _replacement(layer: _BatchNorm, target: type[nn.Module], process_group: Any) -> nn.Module:
    if target is CrossReplicaBatchNorm:
        return CrossReplicaBatchNorm.from_batch_norm(layer, process_group)
    # torch's engine, for a BN root (unannotated in torch)
    synced: nn.SyncBatchNorm = nn.SyncBatchNorm.convert_sync_batchnorm(layer, process_group)  # type: ignore[no-untyped-call]
    _take_over(layer, synced)  # the hooks and markers (freeze's) torch's conversion leaves behind
    return synced


def _qualified(parent_name: str, child_name: str) -> str:
    return f"{parent_name}.{child_name}" if parent_name else child_name


# --------------------------------------------------------------------------- the small-batch warning


_BATCH_SIZE_CHECKED = "_torchestimator_batch_size_checked"
"""Set on the layers once their batch size was checked, so later train calls in this process stay quiet."""


class _SmallBatchWarning:
    """A forward pre-hook on every BatchNorm layer: the first training batch decides, then every copy goes.

    Layers in eval mode (frozen, evaluation, export) pass through untouched.
    """

    def __init__(self, layers: Sequence[tuple[str, nn.Module]], num_replicas: int) -> None:
        self._layers = [layer for _, layer in layers]
        self._names = {id(layer): name for name, layer in layers}
        self._num_replicas = num_replicas
        self.handles: list[Any] = []

    def __call__(self, layer: nn.Module, args: tuple[Any, ...]) -> None:
        if not layer.training:
            return
        self.remove()
        for watched in self._layers:
            setattr(watched, _BATCH_SIZE_CHECKED, True)
        batch = args[0] if args else None
        if not isinstance(batch, torch.Tensor) or batch.dim() == 0:
            return
        per_replica = int(batch.shape[0])
        if per_replica < SMALL_BATCH_PER_REPLICA:
            logger.warning(
                "BatchNorm layer %r normalises with the statistics of %d example(s) per replica (%d replicas): "
                "each replica's statistics differ from the global batch's, so training differs from one replica "
                "with the same global batch. Set RunConfig(sync_batch_norm=True) to use the global batch's "
                "statistics, or give each replica at least %d examples.",
                self._names.get(id(layer), type(layer).__name__),
                per_replica,
                self._num_replicas,
                SMALL_BATCH_PER_REPLICA,
            )

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _batch_norm_layers(module: nn.Module) -> Iterator[tuple[str, _BatchNorm]]:
    for name, layer in module.named_modules():
        if isinstance(layer, _BatchNorm):
            yield name or type(layer).__name__, layer


def _remove_small_batch_warnings(module: nn.Module) -> None:
    """Take away a previous train call's warning hooks that never fired."""
    for _, layer in _batch_norm_layers(module):
        for hook in list(layer._forward_pre_hooks.values()):
            if isinstance(hook, _SmallBatchWarning):
                hook.remove()


def _warn_on_small_batches(module: nn.Module, num_replicas: int) -> None:
    layers = list(_batch_norm_layers(module))
    if not layers or any(getattr(layer, _BATCH_SIZE_CHECKED, False) for _, layer in layers):
        return
    warning = _SmallBatchWarning(layers, num_replicas)
    warning.handles = [layer.register_forward_pre_hook(warning) for _, layer in layers]


# --------------------------------------------------------------------------- the Estimator's entry


def prepare_batch_norm(module: nn.Module, strategy: Strategy, *, sync: bool) -> nn.Module:
    """The module to train: its BatchNorm layers synchronised across replicas when ``sync`` asks for it.

    Called on the plain module after restore, before the optimizer is built and the module wrapped. One
    replica: nothing changes. Several: with ``sync``, the layers are replaced in place (the module returned
    is ``module``); without, the chief warns once if the per-replica batch is small. A strategy that trains
    on a sub-group exposes it as ``process_group``; otherwise the default group is used.
    """
    if strategy.num_replicas == 1:
        return module
    _remove_small_batch_warnings(module)
    if not sync:
        if strategy.is_chief:
            _warn_on_small_batches(module, strategy.num_replicas)
        return module
    converted = convert_batch_norm(module, strategy.device, getattr(strategy, "process_group", None))
    if converted:
        implementation = (
            "torch.nn.SyncBatchNorm"
            if strategy.device.type in _TORCH_SYNC_DEVICE_TYPES
            else ("CrossReplicaBatchNorm (all-reduce)")
        )
        logger.info(
            "sync_batch_norm: %d BatchNorm layer(s) now use the global batch's statistics over %d replicas "
            "with %s: %s.",
            len(converted),
            strategy.num_replicas,
            implementation,
            ", ".join(converted),
        )
    elif not any(True for _ in _batch_norm_layers(module)):
        logger.info("sync_batch_norm: the model has no BatchNorm layer; nothing to synchronise.")
    return module
