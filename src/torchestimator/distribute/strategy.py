"""Distribution strategies: where a replica runs and how replicas cooperate.

Belongs here: the ``Strategy`` interface the training loop talks to (setup,
device, replica ids, wrap/unwrap, no_sync, small collectives for logging and
stopping together, teardown), the ``Placement`` it decides, and ``is_chief``.
Differences between backends live behind this interface, never in ``if`` chains
in the loop. Its implementations live one per module: ``OneDeviceStrategy``
(``one_device.py``), ``MirroredStrategy`` (DistributedDataParallel over processes
on one or several machines; ``MultiWorkerMirroredStrategy`` is TF's name for the
same) in ``mirrored.py``, which forms its process group with
``_group_formation.py``; the collective timeout is in ``_timeouts.py``;
``FullyShardedStrategy`` in ``fsdp.py``. Does not belong here: reading clusters
(``cluster.py``: ``resolve_cluster``) and starting processes (``launcher.py``),
restoring or warm-starting weights (done on the plain module before ``wrap``).

The public methods check their preconditions once (set up? a module?) and call
the ``_``-prefixed methods a subclass overrides; with one replica the
collectives return at once without touching ``torch.distributed``.

The strategies and the timeout settings are also importable from here, where
they were defined before the split (``from torchestimator.distribute.strategy
import MirroredStrategy``). They are imported on first use (PEP 562): their
modules subclass ``Strategy`` from this one, so importing them here at load
time would be a cycle.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import importlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as distributed
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from torchestimator.distribute.input_context import InputContext
from torchestimator.errors import ChiefFailedError

if TYPE_CHECKING:  # the moved names' own modules, for type checkers; imported on first use at run time
    from torchestimator.distribute._group_formation import REPLICA_STDOUT_VARIABLE
    from torchestimator.distribute._timeouts import (
        COLLECTIVE_TIMEOUT_VARIABLE,
        DEFAULT_COLLECTIVE_TIMEOUT_SECONDS,
        collective_timeout_seconds,
    )
    from torchestimator.distribute.mirrored import BACKENDS, MirroredStrategy, MultiWorkerMirroredStrategy
    from torchestimator.distribute.one_device import OneDeviceStrategy

__all__ = [
    "BACKENDS",
    "COLLECTIVE_TIMEOUT_VARIABLE",
    "DEFAULT_COLLECTIVE_TIMEOUT_SECONDS",
    "REPLICA_STDOUT_VARIABLE",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "Placement",
    "Strategy",
    "collective_timeout_seconds",
    "is_chief",
]

_MOVED = {
    name: module
    for module, names in {
        "torchestimator.distribute._timeouts": [
            "COLLECTIVE_TIMEOUT_VARIABLE",
            "DEFAULT_COLLECTIVE_TIMEOUT_SECONDS",
            "collective_timeout_seconds",
        ],
        "torchestimator.distribute.one_device": ["OneDeviceStrategy"],
        "torchestimator.distribute.mirrored": ["BACKENDS", "MirroredStrategy", "MultiWorkerMirroredStrategy"],
        # Still readable here for older scripts; a patch must go on mirrored, whose MirroredStrategy calls it.
        "torchestimator.distribute._group_formation": ["REPLICA_STDOUT_VARIABLE", "_start_quiet_replicas"],
    }.items()
    for name in names
}
"""Names defined here before the split, and the module that defines each now."""


def __getattr__(name: str) -> Any:
    """A name that moved out of this module (``_MOVED``), imported from its new module on first read."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later reads skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(globals().keys() | _MOVED.keys())


logger = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Placement:
    """Where this replica runs, decided by ``setup()``."""

    device: torch.device
    """The device this replica computes on."""
    num_replicas: int = 1
    """Replicas training together (the world size)."""
    replica_id: int = 0
    """This replica's rank, in [0, num_replicas)."""
    local_replica_id: int = 0
    """This replica's index on its machine (its LOCAL_RANK)."""
    local_num_replicas: int = 1
    """Replicas on this machine."""


class Strategy(abc.ABC):
    """How the training loop places, wraps and synchronises its replicas.

    Call ``setup()`` first (it is idempotent); ``teardown()`` ends what setup created.
    Subclasses override ``_setup`` and ``_wrap``, and the collectives when they run
    more than one replica.
    """

    shards_parameters: bool = False
    """True when ``wrap`` replaces the parameters with shards (FSDP2): the Estimator then builds the optimizer
    after wrapping, over the sharded parameters."""

    lockstep: bool = True
    """True when the replicas step together and agree through collectives (every strategy but parameter servers,
    whose trainers step on their own: there each one is a group of one, and only the chief saves)."""

    def __init__(self) -> None:
        self._placement: Placement | None = None

    # ------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        """Join or create what this strategy needs (process group, device); a no-op when done."""
        if self._placement is not None:
            return
        placement = self._setup()
        self._placement = placement
        logger.info(
            "%r set up: replica %d of %d on %s.", self, placement.replica_id, placement.num_replicas, placement.device
        )

    def teardown(self) -> None:
        """Release what ``setup()`` created (a process group it started); a no-op when not set up."""
        if self._placement is None:
            return
        self._teardown()
        self._placement = None

    @property
    def is_set_up(self) -> bool:
        return self._placement is not None

    @property
    def placement(self) -> Placement:
        if self._placement is None:
            raise RuntimeError(
                f"{type(self).__name__} is not set up: call strategy.setup() before asking for its "
                "device, replicas or collectives."
            )
        return self._placement

    @property
    def device(self) -> torch.device:
        return self.placement.device

    @property
    def num_replicas(self) -> int:
        return self.placement.num_replicas

    @property
    def replica_id(self) -> int:
        return self.placement.replica_id

    @property
    def is_chief(self) -> bool:
        """Replica 0, the only one that writes files."""
        return self.placement.replica_id == 0

    def input_context(self) -> InputContext:
        """What an input_fn needs to read this replica's share of the data."""
        placement = self.placement
        return InputContext(
            num_replicas_in_sync=placement.num_replicas,
            input_pipeline_id=placement.replica_id,
            num_input_pipelines=placement.num_replicas,
        )

    # ------------------------------------------------------------ modules

    def wrap(self, module: nn.Module) -> nn.Module:
        """Move a plain module to the device and wrap it for this strategy's training.

        Restore and warm start belong before this call, on the plain module.
        """
        self.placement  # noqa: B018 -- raises the setup() advice
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(self).__name__}.wrap expects a torch.nn.Module; received {type(module).__name__}.")
        if isinstance(module, (DistributedDataParallel, DataParallel)):
            raise ValueError(
                f"{type(self).__name__}.wrap received a module already wrapped in {type(module).__name__}; "
                "pass the plain module (strategy.unwrap(module) gives it)."
            )
        return self._wrap(module)

    # ------------------------------------------------------------ training's seams (parameter servers use them)

    @property
    def serves_variables(self) -> bool:
        """Whether this process serves variables (a ps task) instead of training: then ``serve()`` is its train."""
        return False

    def serve(self) -> None:
        """Serve variables until training ends (a ps task)."""
        raise RuntimeError(f"{type(self).__name__} has no parameter servers to serve.")

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> torch.optim.Optimizer:
        """The optimizer training steps with, built over ``module``'s parameters: ``optimizer`` itself here."""
        return optimizer

    def begin_training(self, module: nn.Module, global_step: int, *, model_dir: str | None = None) -> int:
        """Called once the restore is done, before step one; returns the global step training continues from.
        ``model_dir``: the run's (parameter servers check that every trainer shares it)."""
        return global_step

    @property
    def checkpoint_slot(self) -> tuple[int, int]:
        """(this replica's index, how many) among the per-replica states a checkpoint keeps (input positions,
        generator states): the replica id and count, or a parameter-server trainer's among chief and workers."""
        return self.replica_id, self.num_replicas

    def provide_replica_state(self, provide: Callable[[], Any]) -> None:  # noqa: B027 (only parameter servers)
        """``provide`` makes this replica's state when another replica asks for it between steps."""

    def gather_replica_states(self, own: Any) -> list[Any]:
        """Every replica's state for a checkpoint, in replica order, on the chief (a collective every replica calls;
        parameter servers: the chief asks each worker, see ``provide_replica_state``)."""
        return self.all_gather_object(own)

    def next_global_step(self, step: int) -> int:
        """The global step after this replica's optimizer step (a shared count where updates are shared)."""
        return step + 1

    @property
    def training_ended(self) -> str | None:
        """Why another task ended this training (a parameter-server chief finished), or None."""
        return None

    def end_training(self, reason: str, *, failed: bool = False) -> None:  # noqa: B027 (only parameter servers)
        """This replica's training is over (``reason``; ``failed``: by an error); the chief of parameter servers ends
        every task's."""

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The plain module inside whatever ``wrap`` returned."""
        while isinstance(module, (DistributedDataParallel, DataParallel)):
            module = module.module
        return module

    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradient all-reduce inside (for the non-final micro-batches of an accumulation)."""
        if isinstance(module, DistributedDataParallel):
            return module.no_sync()
        return contextlib.nullcontext()

    # ------------------------------------------------------------ collectives

    def reduce_mean(self, value: float | torch.Tensor) -> float:
        """The mean over replicas of a scalar (the loss to log); a collective every replica calls at the same step."""
        placement = self.placement
        if isinstance(value, torch.Tensor) and value.numel() != 1:
            raise ValueError(f"reduce_mean expects a scalar; received a tensor of shape {tuple(value.shape)}.")
        if placement.num_replicas == 1:
            return float(value)
        tensor = torch.as_tensor(value).detach().to(device=placement.device, dtype=torch.float64).reshape(())
        return float(self._all_reduce(tensor.clone(), distributed.ReduceOp.SUM)) / placement.num_replicas

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over replicas of ``tensor`` (evaluation's loss and example counts)."""
        if self.placement.num_replicas == 1:
            return tensor
        return self._all_reduce(tensor.clone(), distributed.ReduceOp.SUM)

    def all_agree(self, flags: bool | torch.Tensor | Sequence[bool | torch.Tensor]) -> Any:
        """For each flag, True on every replica if any replica says True, so that all stop or save together.

        Takes one flag (returns a bool) or a sequence (returns a list, one collective for all of them).
        A flag may be a 0-d tensor on the device (a NaN watch), so reading it costs no extra host sync.
        """
        values: list[bool | torch.Tensor]
        if isinstance(flags, Sequence):
            single, values = False, list(flags)
        else:
            single, values = True, [flags]
        if self.placement.num_replicas == 1:
            answers = [bool(value) for value in values]
        else:
            device = self.placement.device
            tensor = torch.stack(
                [torch.as_tensor(value).to(device=device, dtype=torch.int32).reshape(()) for value in values]
            )
            answers = [bool(value) for value in self._all_reduce(tensor, distributed.ReduceOp.MAX).tolist()]
        return answers[0] if single else answers

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every replica's ``obj``, in replica order (pickled in memory between our own processes)."""
        if self.placement.num_replicas == 1:
            return [obj]
        return self._all_gather_object(obj)

    def run_on_chief(
        self, action: Callable[[], _T], what: str, *, broadcast_object: Callable[[Any, int], Any] | None = None
    ) -> _T:
        """``action()`` run by the chief, its result returned on every replica: the one way work done once for
        all (a checkpoint, the best-checkpoint record, an export) reaches the others.

        A failure is raised on every replica, so that none waits on a collective the others left: the chief
        raises its own error, every other replica a ``ChiefFailedError`` naming ``what`` and the chief's error.
        ``broadcast_object``: the collective to answer with (a background save's own group); this strategy's
        by default. Every replica must call it at the same point, as any collective.
        """
        value: Any = None
        failure: Exception | None = None
        fault: str | None = None
        if self.is_chief:
            try:
                value = action()
            except Exception as error:  # told to the other replicas first, so that none waits for the chief
                failure, fault = error, f"{type(error).__name__}: {error}"
        value, fault = (broadcast_object or self.broadcast_object)((value, fault), 0)
        if failure is not None:
            raise failure
        if fault is not None:
            raise ChiefFailedError(f"{what} failed on the chief: {fault}", what=what, chief_error=fault)
        result: _T = value  # the chief's action() result, sent to every replica
        return result

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Replica ``src``'s ``obj`` on every replica (pickled in memory between our own processes)."""
        placement = self.placement
        if not 0 <= src < placement.num_replicas:
            raise ValueError(
                f"broadcast_object src must be a replica id in [0, {placement.num_replicas}); received {src}."
            )
        if placement.num_replicas == 1:
            return obj
        return self._broadcast_object(obj, src)

    def broadcast_buffers(self, module: nn.Module, src: int = 0) -> None:
        """Replica ``src``'s buffers (BatchNorm statistics) in every replica's ``module``, in place.

        DistributedDataParallel copies them from replica 0 at the start of each forward pass, so after the
        last step each replica holds its own; before a checkpoint is saved or the live module evaluated,
        every replica must hold what the checkpoint holds.
        """
        if self.placement.num_replicas == 1:
            return
        for buffer in module.buffers():
            self._broadcast_tensor(buffer, src)

    def barrier(self) -> None:
        """Wait until every replica gets here."""
        if self.placement.num_replicas > 1:
            self._barrier()

    # ------------------------------------------------------------ for subclasses

    @abc.abstractmethod
    def _setup(self) -> Placement:
        """Join or create what the strategy needs; say where this replica runs."""

    @abc.abstractmethod
    def _wrap(self, module: nn.Module) -> nn.Module:
        """The module as this strategy trains it (moved, or wrapped for gradient averaging)."""

    def _teardown(self) -> None:  # noqa: B027 (optional: most strategies create nothing to end)
        pass

    def _all_reduce(self, tensor: torch.Tensor, op: Any) -> torch.Tensor:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")

    def _broadcast_object(self, obj: Any, src: int) -> Any:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")

    def _barrier(self) -> None:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")

    def _all_gather_object(self, obj: Any) -> list[Any]:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")

    def _broadcast_tensor(self, tensor: torch.Tensor, src: int) -> None:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")


def is_chief(strategy: Strategy | None) -> bool:
    """Whether this process writes for all replicas: no strategy, one not set up yet (it will be replica 0 of
    its own or learn otherwise at set-up, before any write), or its replica 0."""
    return strategy is None or not strategy.is_set_up or strategy.is_chief


def _check_device_exists(device: torch.device, where: str) -> None:
    """Refuse a CUDA device this machine lacks, naming ``where`` asked for it (for the strategies' ``_setup``):
    said at set-up, not as a CUDA error at the first tensor moved there."""
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ValueError(f"{where} asks for {device}, but CUDA is not available here. Use device='cpu' or None.")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{where} asks for {device}, but this machine has {torch.cuda.device_count()} CUDA device(s).")
