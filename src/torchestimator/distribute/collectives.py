"""The collectives torchestimator issues itself, each tensor handed to the backend so that letting go of it later
never needs the GIL.

Belongs here: the tensor collectives (all-reduce, broadcast) and the object collectives (pickles moved through
tensors) that the strategies, CrossReplicaBatchNorm and the sharded checkpoint's own group call, and
``hand_over``, which they all go through. Does not belong here: forming and destroying process groups (the
strategies'), the collectives DDP and FSDP issue inside torch.

Why ``hand_over``: gloo runs each collective on a worker thread of its own, which drops its references to the
tensors a little after the caller's ``wait()`` has returned. In torch 2.13 a tensor's Python object is kept
alive while C++ also references the tensor, and the drop that leaves only the Python object's own reference
releases it, which takes the GIL (``c10::TensorImpl::decref_pyobject``). When the worker makes that drop as the
program ends, it can be waiting for the GIL when the main thread begins finalizing the interpreter; CPython then
ends the worker with ``pthread_exit``, whose unwinding through torch's ``noexcept`` code calls
``std::terminate``: "terminate called without an active exception", SIGABRT, after the program's output (a core
showed the main thread in ``Py_FinalizeEx``, the worker in ``~AsyncAllreduceWork`` -> ``decref_pyobject`` ->
``take_gil`` -> ``pthread_exit``). Keeping the Python object does not help: the worker's drop still releases it.
``hand_over`` gives the backend a fresh alias of each tensor and keeps, with the alias, a C++ reference of its
own (a DLPack capsule), so the worker's drops never leave the alias with one reference. The Python thread lets go
of both once the backend has released the alias, or the interpreter does while finalizing, when torch no longer
calls into Python (it checks ``Py_IsInitialized()``).
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as distributed
from torch.utils.dlpack import to_dlpack

__all__ = ["all_gather_object", "all_reduce", "broadcast", "broadcast_object", "gather_all_tensors", "hand_over"]


class _HandedOver:
    """The aliases given to collectives, each with a C++ reference, until the backend has released them.

    One per process: the backend threads and the interpreter whose end they race are the process's. Entries are
    dropped when the next tensors are handed over; the last few stay until the interpreter finalizes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # collectives also run on the async checkpoint's thread and autograd's
        self._held: list[tuple[torch.Tensor, Any, int]] = []  # alias, C++ reference, the alias's uses that are ours

    def hand_over(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        aliases = [tensor.detach() for tensor in tensors]  # storage shared: the collective writes the caller's
        with self._lock:
            self._held = [entry for entry in self._held if _backend_holds(entry)]
            self._held.extend(_held_with_a_reference(alias) for alias in aliases)
        return aliases

    def still_held(self) -> int:
        """How many aliases a backend still holds."""
        with self._lock:
            return sum(_backend_holds(entry) for entry in self._held)


def _held_with_a_reference(alias: torch.Tensor) -> tuple[torch.Tensor, Any, int]:
    try:
        return alias, to_dlpack(alias), 2  # the alias's Python object and the capsule
    except (BufferError, RuntimeError, TypeError):
        # Sparse and quantized tensors, which none of our callers hand over: held, but the backend's drop of the
        # last reference besides ours takes the GIL again.
        return alias, None, 1


def _backend_holds(entry: tuple[torch.Tensor, Any, int]) -> bool:
    alias, _, ours = entry
    uses: int = alias._use_count()  # type: ignore[attr-defined]  # a private Tensor method torch's stubs omit
    return uses > ours


_HANDED_OVER = _HandedOver()


def hand_over(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors to pass to a ``torch.distributed`` collective in place of ``tensors``: aliases of them (the
    results land in ``tensors``), kept here until the backend lets go (see the module's docstring)."""
    return _HANDED_OVER.hand_over(tensors)


def all_reduce(tensor: torch.Tensor, op: Any = distributed.ReduceOp.SUM, group: Any = None) -> torch.Tensor:
    """``tensor`` reduced over the group's replicas, in place; returns it."""
    (alias,) = hand_over(tensor)
    distributed.all_reduce(alias, op=op, group=group)
    return tensor


def broadcast(tensor: torch.Tensor, src: int, group: Any = None) -> None:
    """Replica ``src``'s (global rank) ``tensor`` into every replica's, in place."""
    (alias,) = hand_over(tensor)
    distributed.broadcast(alias, src=src, group=group)


def all_gather_object(obj: Any, device: torch.device, group: Any = None) -> list[Any]:
    """Every replica's ``obj``, in the group's rank order (pickled, as ``torch.distributed.all_gather_object``)."""
    device = _object_device(device, group)
    world_size = distributed.get_world_size(group)
    payload = _pickled(obj).to(device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world_size)]
    _all_gather(sizes, torch.tensor([payload.numel()], dtype=torch.long, device=device), group)
    lengths = [int(size.item()) for size in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    _all_gather(gathered, padded, group)
    return [_unpickled(data[:length]) for data, length in zip(gathered, lengths)]


def broadcast_object(obj: Any, src: int, device: torch.device, group: Any = None) -> Any:
    """Replica ``src``'s (global rank) ``obj`` on every replica; ``src`` gets its own ``obj`` back."""
    device = _object_device(device, group)
    is_source = distributed.get_rank() == src
    payload = _pickled(obj).to(device) if is_source else None
    size = torch.tensor([0 if payload is None else payload.numel()], dtype=torch.long, device=device)
    broadcast(size, src, group)
    data = payload if payload is not None else torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    broadcast(data, src, group)
    return obj if is_source else _unpickled(data)


def gather_all_tensors(result: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Every replica's ``result`` (the same number of dimensions, each of any size), in rank order: torchmetrics'
    ``gather_all_tensors`` through ``hand_over``, given to metrics as their ``dist_sync_fn``."""
    result = result.contiguous()
    world_size = distributed.get_world_size(group)
    shape = torch.tensor(result.shape, dtype=torch.long, device=result.device)
    shapes = [torch.zeros_like(shape) for _ in range(world_size)]
    _all_gather(shapes, shape, group)
    largest = torch.stack(shapes).max(dim=0).values if result.ndim else shape
    padded = result
    if result.ndim and not all(bool((each == largest).all()) for each in shapes):
        padded = result.new_zeros(torch.Size(largest.tolist()))
        padded[tuple(slice(size) for size in result.shape)] = result
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    with torch.no_grad():
        _all_gather(gathered, padded, group)
    gathered = [each[tuple(slice(int(size)) for size in sizes)] for each, sizes in zip(gathered, shapes)]
    gathered[distributed.get_rank(group)] = result  # this replica's own, with its autograd graph (as torchmetrics)
    return gathered


def _all_gather(outputs: list[torch.Tensor], tensor: torch.Tensor, group: Any) -> None:
    *output_aliases, alias = hand_over(*outputs, tensor)
    distributed.all_gather(output_aliases, alias, group=group)


def _object_device(device: torch.device, group: Any) -> torch.device:
    # gloo moves pickles through CPU tensors (as torch's object collectives do); other backends need theirs.
    return torch.device("cpu") if distributed.get_backend(group) == "gloo" else device


def _pickled(obj: Any) -> torch.Tensor:
    # A copy in torch's own memory: frombuffer's tensor would keep the bytearray, a Python object.
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).clone()


def _unpickled(data: torch.Tensor) -> Any:
    return pickle.loads(data.cpu().numpy().tobytes())
