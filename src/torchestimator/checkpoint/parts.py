"""The stateful parts of a training run, and how they become one checkpoint and come back from it.

Every part has ``state_dict()`` / ``load_state_dict()``, the protocol
``torch.distributed.checkpoint`` calls ``Stateful``. The parts are typed
fields of ``TrainingParts`` rather than entries of a dict, and each has a
scope:

- shared, the same on every replica: the model's weights, the optimizer, the
  learning-rate scheduler, the grad scaler. One process: the chief writes them
  once (``payload``, safetensors). Several processes: DCP writes them
  (``sharded_payload``), each rank its share; under FSDP2 each rank holds a
  different shard of them.
- per replica: the TrainState (step, generator states) and the input source's
  position (TFRecord shards differ per replica). Every replica's is gathered
  and written, and each replica gets its own back.

This module decides compatibility (weights must fit exactly, optimizer state
only if it fits, else it starts fresh with one warning); the store
(store.py) knows files, atomicity and retention.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch.nn.parameter import is_lazy

from torchestimator._train_state import TrainState

from .serialization import flatten_state
from .tensor_files import is_file_mapped

logger = logging.getLogger("torchestimator")

FORMAT_VERSION = 2
"""Of state.json's ``extra``: 2 keeps per-replica states under ``replicas``; 1 (read too) kept parallel lists."""


@runtime_checkable
class Stateful(Protocol):
    """What a part of a checkpoint provides (torch.distributed.checkpoint.stateful.Stateful)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None: ...


def resumable(source: Any) -> Stateful | None:
    """The input source as a stateful part, or None for inputs that cannot resume (a plain DataLoader)."""
    return source if hasattr(source, "state_dict") and hasattr(source, "load_state_dict") else None


@dataclasses.dataclass
class TrainingParts:
    """The registered stateful parts of one train call."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_state: TrainState
    lr_scheduler: Stateful | None = None
    grad_scaler: torch.amp.GradScaler | None = None
    input_source: Stateful | None = None

    SHARED: ClassVar[tuple[str, ...]] = ("optimizer", "lr_scheduler", "grad_scaler")
    """Parts besides the weights that are the same on every replica; their names name their state on disk."""

    def shared_parts(self) -> dict[str, Stateful]:
        return {name: getattr(self, name) for name in self.SHARED if getattr(self, name) is not None}

    def replica_state(self) -> dict[str, Any]:
        """This replica's own state: the train state and where its input stands."""
        position = self.input_source.state_dict() if self.input_source is not None else None
        self.train_state.input_position = position
        return {"train_state": self.train_state.state_dict(), "input_source": position}

    def payload(
        self, replica_states: list[dict[str, Any]]
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
        """(weights, shared training state, state.json extra) for the checkpoint store; chief only."""
        shared = {name: part.state_dict() for name, part in self.shared_parts().items()}
        return self.model.state_dict(), shared, self._extra(replica_states)

    def sharded_payload(self, replica_states: list[dict[str, Any]]) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        """(DCP state dict, optimizer.json tree, state.json extra) for a checkpoint DCP writes; every replica calls.

        The optimizer state is keyed by parameter name (``get_optimizer_state_dict``), so that it reshards;
        its tensors go to DCP under ``shared``, the rest of the tree (hyperparameters) to JSON.
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        from .dcp_format import MODEL_KEY, SHARED_KEY

        shared = {name: part.state_dict() for name, part in self.shared_parts().items()}
        shared["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)
        tree, tensors = flatten_state(shared, root=SHARED_KEY)
        return {MODEL_KEY: get_model_state_dict(self.model), SHARED_KEY: tensors}, tree, self._extra(replica_states)

    def _extra(self, replica_states: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "global_step": self.train_state.global_step,
            "replicas": replica_states,
            "num_replicas": len(replica_states),
            "optimizer_signature": optimizer_signature(self.optimizer),
            "torch_version": torch.__version__,
        }

    def restore(self, checkpoint: Any, replica_id: int, num_replicas: int) -> dict[str, Any] | None:
        """The shared parts and the train state (generator states too) from ``checkpoint``; returns this
        replica's saved input position, for the input source built after (input_fn may draw random numbers).

        The weights are not restored here: the Estimator loads them into the plain module before wrapping.
        """
        restore_shared(checkpoint, self.shared_parts(), self.optimizer, self.model)
        replicas = replica_states(checkpoint)
        if len(replicas) == num_replicas:
            mine, same_replicas = replicas[replica_id], True
        else:
            # Global positions (numpy_input_fn's) are the same on every replica; per-shard ones refuse a foreign one.
            mine, same_replicas = replicas[0], False
            logger.warning(
                "Random number generator states were not restored: %s was written by %d replica(s), this run has %d. "
                "Resume is not bit-exact.",
                checkpoint.path,
                len(replicas),
                num_replicas,
            )
        self.train_state.load_state_dict(mine["train_state"], restore_rng=same_replicas)
        self.train_state.global_step = checkpoint.step
        return mine.get("input_source")


def restore_shared(
    checkpoint: Any,
    parts: Mapping[str, Stateful],
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module | None = None,
) -> None:
    """Restores optimizer, scheduler and scaler state if they fit; otherwise they start fresh with one warning.

    ``model`` (the module the optimizer trains) is needed for checkpoints keyed by parameter name (DCP's) and
    for optimizers over sharded parameters (FSDP2).
    """
    saved_signature = checkpoint.extra.get("optimizer_signature")
    current_signature = optimizer_signature(optimizer)
    saved_state: Any = checkpoint.optimizer_state or {}  # a dict, or a DCP checkpoint's tree (loaded below)
    if saved_signature is None and "optimizer" not in saved_state:
        # A weights-only checkpoint (`torchestimator warm-start --write`): nothing changed, there is nothing to load.
        logger.info(
            "Checkpoint %s holds no optimizer state: model weights and global_step are restored, "
            "the optimizer starts fresh.",
            checkpoint.path,
        )
        return
    if saved_signature != current_signature or "optimizer" not in saved_state:
        logger.warning(
            "The optimizer changed since %s (was %s with parameter groups %s, now %s with %s): model weights and "
            "global_step are restored, the optimizer state starts fresh.",
            checkpoint.path,
            (saved_signature or {}).get("class", "no optimizer state"),
            (saved_signature or {}).get("param_group_sizes"),
            current_signature["class"],
            current_signature["param_group_sizes"],
        )
        return
    if model is None and (getattr(checkpoint, "sharded", False) or _has_sharded_parameters(optimizer)):
        raise ValueError(f"restoring {checkpoint.path} into this optimizer needs the model it trains (model=...).")
    if getattr(checkpoint, "sharded", False):
        assert model is not None  # checked above
        saved_state = saved_state.load(_live_optimizer_tensors(model, optimizer))
    for name, part in parts.items():
        if name not in saved_state:
            logger.warning("Checkpoint %s has no %s state; it starts fresh.", checkpoint.path, name)
            continue
        if name == "optimizer" and getattr(checkpoint, "sharded", False):
            assert model is not None  # checked above
            _set_named_optimizer_state(model, optimizer, saved_state[name], full=False)
        elif name == "optimizer" and _has_sharded_parameters(optimizer):
            assert model is not None  # checked above
            # A one-process (safetensors) checkpoint, keyed by parameter position, read into FSDP2's shards.
            _set_named_optimizer_state(
                model, optimizer, _named_by_position(model, optimizer, saved_state[name]), full=True
            )
        else:
            part.load_state_dict(owning_memory(saved_state[name]))


def owning_memory(tree: Any) -> Any:
    """``tree`` with every tensor that is a view of a mapped checkpoint file (``tensor_files.read_tensors``)
    copied into memory of its own; other tensors pass unchanged.

    For state kept as long as the run: an optimizer keeps the tensors it is given, and a mapping would keep
    the checkpoint's disk space after retention deletes the files.
    """
    if isinstance(tree, torch.Tensor):
        return tree.clone() if is_file_mapped(tree) else tree
    if isinstance(tree, dict):
        return {key: owning_memory(value) for key, value in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(owning_memory(value) for value in tree)
    return tree


def is_shard(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor (FSDP2's parameters and their state: each replica holds a shard).

    Asked without importing torch.distributed.tensor (a second or more): until something imported it,
    no tensor can be one.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def holds_shards(module: torch.nn.Module) -> bool:
    """Whether FSDP2 sharded ``module``'s parameters."""
    return any(is_shard(parameter) for parameter in module.parameters())


def _has_sharded_parameters(optimizer: torch.optim.Optimizer) -> bool:
    return any(is_shard(parameter) for group in optimizer.param_groups for parameter in group["params"])


def _live_optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """This run's optimizer tensors named as a DCP checkpoint names them, for reading shards into place (FSDP2).

    Empty for optimizers over whole tensors: those read whole tensors from the checkpoint, and asking
    get_optimizer_state_dict would initialise their state with a zero step first.
    """
    if not _has_sharded_parameters(optimizer):
        return {}
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from .dcp_format import SHARED_KEY

    return flatten_state({"optimizer": get_optimizer_state_dict(model, optimizer)}, root=SHARED_KEY)[1]


def _set_named_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Any, *, full: bool
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=full))


def _named_by_position(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]
) -> dict[str, Any]:
    """torch's optimizer state (parameters by position) keyed by parameter name, as get_optimizer_state_dict keys it."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    position_names = [names[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
    groups = [
        {**group, "params": [position_names[index] for index in group["params"]]} for group in state["param_groups"]
    ]
    return {"state": {position_names[index]: value for index, value in state["state"].items()}, "param_groups": groups}


def replica_states(checkpoint: Any) -> list[dict[str, Any]]:
    """Each replica's saved state, in rank order, from either format of state.json's extra."""
    extra = checkpoint.extra
    if isinstance(extra.get("replicas"), list) and extra["replicas"]:
        replicas: list[dict[str, Any]] = extra["replicas"]
        return replicas
    # Format 1: parallel lists of RNG states and input positions.
    rngs = extra.get("rng") or [None]
    positions = extra.get("input_positions")
    if not isinstance(positions, list) or len(positions) != len(rngs):
        positions = [extra.get("input_position")] * len(rngs)
    return [
        {
            "train_state": {"global_step": checkpoint.step, "input_position": position, "rng": rng},
            "input_source": position,
        }
        for rng, position in zip(rngs, positions)
    ]


def optimizer_signature(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What must match for optimizer state to be reusable: its class and its parameter groups' sizes.

    An optimizer standing in for another (a parameter-server trainer's, which applies the steps on the ps) names
    the one it stands for in ``stands_for``: its checkpoints are that optimizer's.
    """
    cls = type(getattr(optimizer, "stands_for", optimizer))
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "param_group_sizes": [len(group["params"]) for group in optimizer.param_groups],
    }


def load_model_state(module: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Loads weights strictly, naming the variable and both shapes on any mismatch."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"The checkpoint {source} does not fit this model. Variables the model has but the checkpoint lacks: "
            f"{missing[:10]}{' ...' if len(missing) > 10 else ''}; variables in the checkpoint the model lacks: "
            f"{unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}. Use a fresh model_dir, or warm start "
            "to load a different model's weights."
        )
    for name, tensor in expected.items():
        if is_lazy(tensor):  # a lazy layer's variable takes the checkpoint's shape as it loads (torch's load hook)
            continue
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(
                f"The checkpoint {source} does not fit this model: variable {name!r} has shape "
                f"{list(state[name].shape)} in the checkpoint and {list(tensor.shape)} in the model."
            )
    module.load_state_dict(state, strict=True)


def first_non_finite(module: torch.nn.Module) -> str | None:
    """The name of the first floating-point variable holding a NaN or an infinity, or None."""
    for name, tensor in module.state_dict().items():
        local = tensor.to_local() if is_shard(tensor) else tensor  # a shard: this replica checks its own
        if not local.is_floating_point() or local.numel() == 0:
            continue
        # A NaN or an infinity makes the sum non-finite: one reduction, no mask the size of the tensor (0.5 s of
        # a 25M-parameter model's save on a busy CPU). A finite tensor whose sum overflows is checked exactly.
        if not bool(torch.isfinite(local.detach().sum())) and not bool(torch.isfinite(local).all()):
            return name
    return None
