"""FullyShardedStrategy: data parallel training with parameters, gradients and optimizer state sharded (FSDP2).

TensorFlow has no strategy of this name; it is what ``MultiWorkerMirroredStrategy``
becomes when a model's weights and optimizer state no longer fit on one device:
each replica keeps 1/N of every sharded layer and gathers a layer's weights
just before it runs (``torch.distributed.fsdp.fully_shard``).

Belongs here: how a module is sharded (which sub-modules get their own
``fully_shard``: the wrap policy), the mixed precision and CPU offload policies,
and gradient accumulation without the reduce-scatter. The process group, device
placement and collectives are MirroredStrategy's, reused as they are.

What changes for the rest of the framework (the Estimator does it):
the optimizer is built after ``wrap`` over the sharded parameters; checkpoints
are written by torch.distributed.checkpoint, every replica its own shards;
restoring reads whole weights into the plain module before it is sharded (as
warm start does) and the optimizer's shards after; evaluation, prediction and
export after training run on a plain module holding the gathered weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from torchestimator.distribute.mirrored import MirroredStrategy
from torchestimator.errors import ConfigError

__all__ = ["DEFAULT_LAYER_TYPES", "FullyShardedStrategy"]

DEFAULT_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
"""Layers that get their own ``fully_shard`` by default: each is gathered only while it runs."""

_MIXED_PRECISION = {
    "bf16": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    "fp16": MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32),
}


class FullyShardedStrategy(MirroredStrategy):
    """One process per replica; every layer the wrap policy names, then the whole model, sharded by FSDP2.

    ``num_replicas``, ``backend``, ``devices`` and ``timeout_seconds`` are MirroredStrategy's.

    Args:
        layer_types: module classes sharded one by one (default: Transformer encoder and decoder layers).
        module_names: names (as ``named_modules`` gives them, e.g. ``"encoder.layers.0"``) of more modules to
            shard on their own.
        mixed_precision: ``"bf16"``, ``"fp16"`` (computations in that type, gradients reduced in float32) or a
            ``torch.distributed.fsdp.MixedPrecisionPolicy``; None computes in the parameters' dtype.
        cpu_offload: keep the shards and their optimizer state in CPU memory between uses (CPUOffloadPolicy).
        reshard_after_forward: free gathered weights after each forward (less memory, one more gather in
            backward).
    """

    shards_parameters = True
    """``wrap`` shards the module in place: the optimizer is built after it, over the shards."""

    def __init__(
        self,
        num_replicas: int | None = None,
        backend: str | None = None,
        devices: Sequence[str | int | torch.device] | None = None,
        *,
        layer_types: Sequence[type[nn.Module]] = DEFAULT_LAYER_TYPES,
        module_names: Sequence[str] = (),
        mixed_precision: str | MixedPrecisionPolicy | None = None,
        cpu_offload: bool = False,
        reshard_after_forward: bool = True,
        timeout_seconds: float | None = None,
    ) -> None:
        super().__init__(num_replicas, backend, devices, timeout_seconds=timeout_seconds)
        self._layer_types = _check_layer_types(layer_types)
        if isinstance(module_names, str) or not all(isinstance(name, str) and name for name in module_names):
            raise ConfigError(
                f"FullyShardedStrategy module_names must be a list of module names (named_modules()'s); "
                f"received {module_names!r}.",
                field="module_names",
                value=module_names,
            )
        self._module_names = tuple(module_names)
        if isinstance(mixed_precision, str):
            if mixed_precision not in _MIXED_PRECISION:
                raise ConfigError(
                    f"FullyShardedStrategy mixed_precision must be one of {sorted(_MIXED_PRECISION)}, a "
                    f"MixedPrecisionPolicy or None; received {mixed_precision!r}.",
                    field="mixed_precision",
                    value=mixed_precision,
                )
            mixed_precision = _MIXED_PRECISION[mixed_precision]
        elif mixed_precision is not None and not isinstance(mixed_precision, MixedPrecisionPolicy):
            raise ConfigError(
                f"FullyShardedStrategy mixed_precision must be 'bf16', 'fp16', a MixedPrecisionPolicy or None; "
                f"received {type(mixed_precision).__name__}.",
                field="mixed_precision",
                value=mixed_precision,
            )
        self._mixed_precision = mixed_precision
        if not isinstance(cpu_offload, bool):
            raise ConfigError(
                f"FullyShardedStrategy cpu_offload must be True or False; received {cpu_offload!r}.",
                field="cpu_offload",
                value=cpu_offload,
            )
        self._cpu_offload = cpu_offload
        self._reshard_after_forward = bool(reshard_after_forward)

    def __repr__(self) -> str:
        return (
            f"FullyShardedStrategy(num_replicas={self._requested_replicas}, "
            f"layer_types={[cls.__name__ for cls in self._layer_types]}, module_names={list(self._module_names)})"
        )

    # ------------------------------------------------------------ modules

    def _wrap(self, module: nn.Module) -> nn.Module:
        if isinstance(module, FSDPModule):
            raise ValueError(
                "FullyShardedStrategy.wrap received a module FSDP2 already sharded; pass the plain module."
            )
        placement = self.placement
        module = module.to(placement.device)
        options: dict[str, Any] = {
            "mesh": init_device_mesh(placement.device.type, (placement.num_replicas,)),
            "reshard_after_forward": self._reshard_after_forward,
        }
        if self._mixed_precision is not None:
            options["mp_policy"] = self._mixed_precision
        if self._cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        for submodule in self.sharded_submodules(module):
            fully_shard(submodule, **options)
        fully_shard(module, **options)  # the root last: it holds what no inner unit took
        return module

    def sharded_submodules(self, module: nn.Module) -> list[nn.Module]:
        """The modules the wrap policy shards on their own, innermost first (the root is sharded after them)."""
        modules = dict(module.named_modules())
        unknown = [name for name in self._module_names if name not in modules or name == ""]
        if unknown:
            known = [name for name in modules if name][:12]
            raise ConfigError(
                f"FullyShardedStrategy module_names {unknown} are not modules of {type(module).__name__}; "
                f"its modules include {known}.",
                field="module_names",
                value=list(self._module_names),
            )
        chosen = [
            name
            for name, submodule in modules.items()
            if name and (name in self._module_names or isinstance(submodule, self._layer_types))
        ]
        return [modules[name] for name in sorted(chosen, key=lambda name: -name.count("."))]

    def unwrap(self, module: nn.Module) -> nn.Module:
        return module  # fully_shard changes the module in place: it is its own plain module

    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Gradient accumulation: no reduce-scatter inside, gradients stay unsharded until the last micro-batch."""
        if isinstance(module, FSDPModule):
            return _without_gradient_sync(module)
        return super().no_sync(module)


@contextlib.contextmanager
def _without_gradient_sync(module: FSDPModule) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def _check_layer_types(given: Sequence[type[nn.Module]] | type[nn.Module]) -> tuple[type[nn.Module], ...]:
    layer_types = (given,) if isinstance(given, type) else tuple(given)  # one class is taken too
    bad = [layer for layer in layer_types if not (isinstance(layer, type) and issubclass(layer, nn.Module))]
    if bad:
        raise ConfigError(
            f"FullyShardedStrategy layer_types must be nn.Module subclasses (e.g. nn.TransformerEncoderLayer); "
            f"received {bad!r}.",
            field="layer_types",
            value=layer_types,
        )
    return layer_types
