"""Test helpers for users' own model_fns, hooks and input_fns, on a laptop CPU.

Belongs here: small, dependency-free kits that a test suite calls, starting with
``run_in_processes``, which runs a function in N processes joined by a gloo
process group, as ``MirroredStrategy`` would under ``torchrun``::

    # test_my_model.py -- the function must be defined at module level
    from torchestimator.distribute import MirroredStrategy
    from torchestimator.testing import run_in_processes

    def train_one_step():
        strategy = MirroredStrategy()      # finds the group run_in_processes made
        strategy.setup()
        model = strategy.wrap(build_model())
        ...
        return strategy.replica_id, strategy.unwrap(model).weight.detach()

    def test_weights_agree_across_replicas():
        results = run_in_processes(train_one_step, nprocs=2)
        assert torch.equal(results[0][1], results[1][1])

Does not belong here: anything the library itself needs at run time.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import queue as queue_module
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from torchestimator.distribute.launcher import find_free_port
from torchestimator.errors import ReplicaFailedError

__all__ = ["ReplicaFailedError", "run_in_processes"]

_FAILURE_GRACE_SECONDS = 3.0
"""After one replica fails, how long to wait for the others' reports before stopping them."""


def run_in_processes(
    fn: Callable[..., Any], nprocs: int = 2, args: Sequence[Any] = (), timeout: float = 120.0
) -> list[Any]:
    """Run ``fn(*args)`` in ``nprocs`` fresh processes with a gloo process group; their results by rank.

    Each process gets the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT on a free port; OMP_NUM_THREADS=1) and an initialised gloo process group, so a
    ``MirroredStrategy`` inside finds a launched run. ``fn`` must be importable by name (defined
    at module level) and ``args`` and the return values picklable; the processes start with
    ``spawn``, so nothing else of the test's state reaches them.

    Raises:
        ReplicaFailedError: ``fn`` raised in a replica (the message names the rank and carries
            its traceback), or a replica process died without reporting.
        TimeoutError: not every replica finished within ``timeout`` seconds.
    """
    _check_function(fn)
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"run_in_processes nprocs must be a positive integer; received {nprocs!r}.")
    if timeout <= 0:
        raise ValueError(f"run_in_processes timeout must be positive seconds; received {timeout!r}.")
    context = multiprocessing.get_context("spawn")
    reports = context.Queue()
    port = find_free_port()
    processes = [
        context.Process(
            target=_replica_main,
            args=(rank, nprocs, port, fn, tuple(args), reports, timeout),
            name=f"replica-{rank}",
            daemon=True,
        )
        for rank in range(nprocs)
    ]
    for process in processes:
        process.start()
    try:
        received = _collect(processes, reports, time.monotonic() + timeout, timeout)
    finally:
        _stop(processes)
        reports.close()
    return [pickle.loads(received[rank][1]) for rank in range(nprocs)]


def _check_function(fn: Callable[..., Any]) -> None:
    if not callable(fn):
        raise TypeError(f"run_in_processes expects a function; received {type(fn).__name__}.")
    qualified_name = getattr(fn, "__qualname__", "")
    if "<lambda>" in qualified_name or "<locals>" in qualified_name:
        raise TypeError(
            f"run_in_processes runs fn in spawned processes, which import it by name, but "
            f"{qualified_name!r} is a lambda or a nested function. Define it at module level."
        )


def _replica_main(
    rank: int,
    nprocs: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    reports: Any,
    timeout: float,
) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )
    import torch
    import torch.distributed as distributed

    torch.set_num_threads(1)
    try:
        distributed.init_process_group(
            "gloo",
            init_method="env://",
            rank=rank,
            world_size=nprocs,
            timeout=datetime.timedelta(seconds=timeout),
        )
        result = fn(*args)
        # Plain pickle copies tensors; torch's queue pickler would share their memory
        # with a process that is about to exit.
        try:
            payload = pickle.dumps(result)
        except Exception as error:
            raise TypeError(
                f"run_in_processes: the value {fn.__qualname__} returned on rank {rank} cannot be pickled "
                f"({error}); return plain data (numbers, strings, lists, dicts, tensors)."
            ) from error
        reports.put((rank, "result", payload))
    except BaseException as error:
        name = f"{type(error).__module__}.{type(error).__qualname__}"
        reports.put((rank, "error", (name, str(error), traceback.format_exc())))
        return
    # Keep the store (served by rank 0) up until every replica is done with it.
    try:
        distributed.barrier()
        distributed.destroy_process_group()
    except Exception:
        pass


def _collect(processes: list[Any], reports: Any, deadline: float, timeout: float) -> dict[int, tuple[str, Any]]:
    received: dict[int, tuple[str, Any]] = {}  # in arrival order: the first error is the cause
    seen_dead: set[int] = set()
    failed_at: float | None = None
    while len(received) < len(processes):
        if failed_at is not None and time.monotonic() > failed_at + _FAILURE_GRACE_SECONDS:
            break
        if time.monotonic() > deadline:
            missing = sorted(set(range(len(processes))) - set(received))
            raise TimeoutError(
                f"run_in_processes: replica(s) {missing} of {len(processes)} did not finish within {timeout} s. "
                "A replica may be waiting in a collective the others never reached; raise timeout if the work is long."
            )
        try:
            rank, kind, payload = reports.get(timeout=0.1)
            received[rank] = (kind, payload)
        except queue_module.Empty:
            _note_silent_exits(processes, received, seen_dead)
        if failed_at is None and any(kind == "error" for kind, _ in received.values()):
            failed_at = time.monotonic()
    if failed_at is not None:
        first = next(rank for rank, (kind, _) in received.items() if kind == "error")
        raise _failure(first, received)
    return received


def _note_silent_exits(processes: list[Any], received: dict[int, tuple[str, Any]], seen_dead: set[int]) -> None:
    for rank, process in enumerate(processes):
        if rank in received or process.exitcode is None:
            continue
        # A report sent just before exit may still be in the pipe: wait one more empty poll.
        if rank in seen_dead:
            received[rank] = (
                "error",
                (
                    "process exit",
                    f"the process exited with code {process.exitcode} without reporting a result",
                    "(no traceback: the process ended outside the function's reach)",
                ),
            )
        seen_dead.add(rank)


def _failure(first: int, received: dict[int, tuple[str, Any]]) -> ReplicaFailedError:
    name, message, traceback_text = received[first][1]
    others = [
        f"rank {rank} ({payload[0]})"
        for rank, (kind, payload) in sorted(received.items())
        if kind == "error" and rank != first
    ]
    also = f"\nAlso failed afterwards: {', '.join(others)}." if others else ""
    return ReplicaFailedError(
        f"Replica with rank {first} failed: {name}: {message}{also}\n\nTraceback in rank {first}:\n{traceback_text}",
        rank=first,
        exception_type=name,
        traceback_text=traceback_text,
    )


def _stop(processes: list[Any]) -> None:
    deadline = time.monotonic() + 10.0
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(5.0)
        if process.is_alive():
            process.kill()
            process.join()
