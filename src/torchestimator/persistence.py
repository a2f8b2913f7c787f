"""Between the loop and the checkpoint store: what goes into a checkpoint and how it comes back.

The store (checkpoint/) knows files, atomicity and retention; this module
knows models, optimizers, RNG states and input positions. It decides
compatibility: weights must match exactly, optimizer state only if it fits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from torchestimator.hooks.base import CheckpointSaverListener
from torchestimator.state import TrainState, capture_rng_state, restore_rng_state

logger = logging.getLogger("torchestimator")

FORMAT_VERSION = 1


class NanLossDuringTrainingError(RuntimeError):
    """The loss (or a weight about to be saved) stopped being finite."""


def optimizer_signature(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What must match for optimizer state to be reusable: its class and its parameter groups' sizes."""
    cls = type(optimizer)
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
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise ValueError(
                f"The checkpoint {source} does not fit this model: variable {name!r} has shape "
                f"{list(state[name].shape)} in the checkpoint and {list(tensor.shape)} in the model."
            )
    module.load_state_dict(state, strict=True)


def first_non_finite(module: torch.nn.Module) -> str | None:
    for name, tensor in module.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def gather_objects(obj: Any, num_replicas: int) -> list[Any]:
    """Every replica's object, in rank order (a collective when several replicas run)."""
    if num_replicas == 1 or not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * num_replicas
    dist.all_gather_object(gathered, obj)
    return gathered


class Checkpointer:
    """Writes checkpoints of a training run; all replicas call save together, only the chief writes."""

    def __init__(
        self,
        store: Any,
        *,
        is_chief: bool,
        num_replicas: int,
        listeners: Iterable[CheckpointSaverListener] = (),
    ) -> None:
        self.store = store
        self.is_chief = is_chief
        self.num_replicas = num_replicas
        self.listeners = list(listeners)
        self.last_saved_step: int | None = None
        self.last_saved_path: str | None = None

    def save(self, state: TrainState, module: torch.nn.Module, training_objects: Mapping[str, Any],
             input_position: dict[str, Any] | None, extra_listeners: Iterable[CheckpointSaverListener] = ()) -> bool:
        """Saves the current step; returns True if a listener asked to stop."""
        step = state.global_step
        bad_variable = first_non_finite(module)
        if bad_variable is not None:
            raise NanLossDuringTrainingError(
                f"Variable {bad_variable!r} is not finite at step {step}; no checkpoint was written. "
                f"The last good checkpoint is {self.last_saved_path or self.store.latest_checkpoint()}."
            )
        listeners = [*self.listeners, *extra_listeners]
        # One collective brings every replica's RNG state and input position (TFRecord shards differ per replica).
        per_replica = gather_objects((capture_rng_state(), input_position), self.num_replicas)
        rng_states = [rng for rng, _ in per_replica]
        input_positions = [position for _, position in per_replica]
        for listener in listeners:
            listener.before_save(state, step)
        if self.is_chief:
            optimizer_state = {name: obj.state_dict() for name, obj in training_objects.items() if obj is not None}
            extra = {
                "format_version": FORMAT_VERSION,
                "global_step": step,
                "input_position": input_positions[0],
                "input_positions": input_positions,
                "rng": rng_states,
                "num_replicas": self.num_replicas,
                "optimizer_signature": optimizer_signature(training_objects["optimizer"]),
                "torch_version": torch.__version__,
            }
            self.last_saved_path = self.store.save(step, module.state_dict(), optimizer_state, extra)
            logger.info("Saved checkpoint for step %d: %s", step, self.last_saved_path)
        self.last_saved_step = step
        stop = [bool(listener.after_save(state, step)) for listener in listeners]
        return any(stop)


def restore_training_objects(checkpoint: Any, training_objects: Mapping[str, Any]) -> None:
    """Restores optimizer, scheduler and scaler state if they fit; otherwise resets them with one warning."""
    optimizer = training_objects["optimizer"]
    saved_signature = checkpoint.extra.get("optimizer_signature")
    current_signature = optimizer_signature(optimizer)
    saved_state = checkpoint.optimizer_state or {}
    if saved_signature != current_signature or "optimizer" not in saved_state:
        old = (saved_signature or {}).get("class", "no optimizer state")
        logger.warning(
            "The optimizer changed since %s (was %s with parameter groups %s, now %s with %s): model weights and "
            "global_step are restored, the optimizer state starts fresh.",
            checkpoint.path, old, (saved_signature or {}).get("param_group_sizes"),
            current_signature["class"], current_signature["param_group_sizes"],
        )
        return
    for name, obj in training_objects.items():
        if obj is None:
            continue
        if name not in saved_state:
            logger.warning("Checkpoint %s has no %s state; it starts fresh.", checkpoint.path, name)
            continue
        obj.load_state_dict(saved_state[name])


def input_position_for(checkpoint: Any, replica_id: int, num_replicas: int) -> dict[str, Any] | None:
    """This replica's saved input position; the chief's when the replica count changed (global positions,
    such as numpy_input_fn's, are the same on every replica; per-shard ones refuse a foreign position)."""
    positions = checkpoint.extra.get("input_positions")
    if isinstance(positions, list) and len(positions) == num_replicas:
        return positions[replica_id]
    return checkpoint.extra.get("input_position")


def restore_rng(checkpoint: Any, replica_id: int, num_replicas: int) -> None:
    states = checkpoint.extra.get("rng") or []
    if len(states) != num_replicas:
        logger.warning(
            "Random number generator states were not restored: %s was written by %d replica(s), this run has %d. "
            "Resume is not bit-exact.", checkpoint.path, len(states), num_replicas,
        )
        return
    restore_rng_state(states[replica_id])


def is_finite(value: float) -> bool:
    return math.isfinite(value)
