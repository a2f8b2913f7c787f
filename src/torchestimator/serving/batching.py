"""Server-side request batching: TF Serving's ``--enable_batching`` for ExportedModel signatures.

What belongs here: BatchingParameters (the batching parameters file's fields)
and BatchScheduler (queues, batch threads, concatenating and splitting
tensors). Parsing the parameters file and wiring the scheduler into the REST
handlers belong to the app.

How it maps to TF's scheduler (TF ``core/kernels/batching_util/
shared_batch_scheduler.h``; TF Serving ``batching/batching_session.cc``):

* One BatchScheduler is one SharedBatchScheduler: ``num_batch_threads``
  threads shared by every queue, taking batches from the queues round robin.
* One queue per (model object, signature, each input's dtype and shape after
  the batch dimension): BatchingSession keeps a queue per signature, and only
  tensors with equal trailing shapes can be concatenated.
* A queue is a list of batches; the last one is "open". A request joins the
  open batch when the rows fit in ``max_batch_size``, else it opens a new
  batch, unless the queue already holds ``max_enqueued_batches`` batches
  (the open one included; batches a thread has taken no longer count), in
  which case it is refused at once with UNAVAILABLE "The batch scheduling
  queue to which this task was submitted is full" (TF's code and wording;
  HTTP 503). A request with more rows than ``max_batch_size`` is refused with
  INVALID_ARGUMENT "Task size N is larger than maximum input batch size M".
* A thread takes the oldest closed batch, or the open batch once it is full
  or ``batch_timeout_micros`` have passed since its first request. With the
  default 0 that means "as soon as a thread is free": while every thread is
  busy, requests keep gathering in the open batch, so batches grow with load.
* ``allowed_batch_sizes`` pads a batch up to the next allowed size with copies
  of the first row of the first request (BatchingSession's choice, since that
  row is known to be valid); the padded rows are dropped from the outputs.

Where we differ, on purpose: ``close()`` answers waiting requests with
UNAVAILABLE instead of running them; a signature whose inputs lack a dynamic
batch dimension, or whose outputs turn out not to have the batch size first,
runs request by request; a batch that raises is rerun request by request so
only the failing request gets the error; ``enable_large_batch_splitting`` and
the priority-queue fields are accepted and ignored (logged).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from torchestimator.serving.errors import ServingError

__all__ = ["QUEUE_FULL_CODE", "BatchScheduler", "BatchingParameters"]

logger = logging.getLogger(__name__)

QUEUE_FULL_CODE = "RESOURCE_EXHAUSTED"
"""A full queue answers HTTP 429, so clients back off and retry as they do for any rate limit. TF's scheduler
returns UNAVAILABLE (503) here (Queue::ValidateBatchTaskQueueCapacity); 429 says "too many requests", which is
what happened, and is what our issue asks for (DESIGN.md, Decisions)."""

# Fields of TF Serving's BatchingParameters proto we accept but do not act on.
_IGNORED_FIELDS = frozenset(
    {
        "thread_pool_name",
        "enable_large_batch_splitting",
        "max_execution_batch_size",
        "batch_padding_policy",
        "enable_priority_queue",
        "mixed_priority_batching_policy",
        "low_priority_max_batch_size",
        "low_priority_batch_timeout_micros",
        "low_priority_allowed_batch_sizes",
        "low_priority_max_enqueued_batches",
    }
)


def _default_num_batch_threads() -> int:
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchingParameters:
    """TF Serving's batching parameters (``--batching_parameters_file``), with TF's defaults."""

    max_batch_size: int = 1000
    """Most rows in one batch; a request with more rows is refused (INVALID_ARGUMENT)."""
    batch_timeout_micros: int = 0
    """Longest wait, from a batch's first request, before running it under-full; 0: as soon as a thread is free."""
    max_enqueued_batches: int = 10
    """Batches a queue may hold waiting (the open one included) before new requests are refused."""
    num_batch_threads: int = dataclasses.field(default_factory=_default_num_batch_threads)
    """Batches run in parallel; TF's default is the machine's parallelism."""
    allowed_batch_sizes: tuple[int, ...] = ()
    """Batch sizes to pad up to: increasing, the last equal to max_batch_size. Empty: no padding."""
    pad_variable_length_inputs: bool = False
    """Not supported: requests with different lengths go to different queues instead."""

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("batch_timeout_micros", self.batch_timeout_micros, minimum=0)
        sizes = self.allowed_batch_sizes
        if not isinstance(sizes, (tuple, list)):
            raise TypeError(f"allowed_batch_sizes must be a tuple of ints; received {sizes!r}.")
        object.__setattr__(self, "allowed_batch_sizes", tuple(sizes))
        for index, size in enumerate(sizes):
            _check_int(f"allowed_batch_sizes[{index}]", size, minimum=1)
        if any(later <= earlier for earlier, later in itertools.pairwise(sizes)):
            raise ValueError(f"allowed_batch_sizes entries must be monotonically increasing; received {list(sizes)}.")
        if sizes and sizes[-1] != self.max_batch_size:
            raise ValueError(
                f"The final entry in allowed_batch_sizes must equal max_batch_size ({self.max_batch_size}); received "
                f"{list(sizes)}. Append {self.max_batch_size} or change max_batch_size."
            )
        if not isinstance(self.pad_variable_length_inputs, bool):
            raise TypeError(f"pad_variable_length_inputs must be a bool; received {self.pad_variable_length_inputs!r}.")
        if self.pad_variable_length_inputs:
            raise ValueError(
                "pad_variable_length_inputs=True is not supported: requests whose inputs differ in length after the "
                "batch dimension are batched separately instead. Set it to false (or leave it out)."
            )

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any], *, source: str = "batching parameters") -> BatchingParameters:
        """Parameters from a parsed parameters file: ``{field: value}`` or TF's wrapper form ``{field: {"value": v}}``.

        ``source`` (e.g. the file's path) is named in errors. Unknown fields are
        errors; fields TF has that we ignore are logged.
        """
        if not isinstance(fields, Mapping):
            raise TypeError(f"{source}: expected a mapping of field -> value; received {type(fields).__name__}.")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(name for name in fields if name not in known and name not in _IGNORED_FIELDS)
        if unknown:
            raise ValueError(f"{source}: unknown batching fields {unknown}; known fields are {sorted(known)}.")
        ignored = sorted(name for name in fields if name in _IGNORED_FIELDS)
        if ignored:
            logger.warning("%s: ignoring batching fields %s (not supported by torchestimator)", source, ignored)
        values = {name: _unwrap(value) for name, value in fields.items() if name in known}
        if "allowed_batch_sizes" in values and isinstance(values["allowed_batch_sizes"], int):
            values["allowed_batch_sizes"] = (values["allowed_batch_sizes"],)  # a repeated field given once
        try:
            return cls(**values)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{source}: {error}") from error

    def padded_size(self, rows: int) -> int:
        """The batch size ``rows`` is padded up to: the next allowed size, or ``rows`` itself."""
        for size in self.allowed_batch_sizes:
            if size >= rows:
                return size
        return rows


@dataclasses.dataclass(eq=False)
class _Task:
    inputs: dict[str, torch.Tensor]
    size: int
    future: concurrent.futures.Future


@dataclasses.dataclass(eq=False)
class _Batch:
    tasks: list[_Task] = dataclasses.field(default_factory=list)
    size: int = 0
    start: float = 0.0
    """time.monotonic() of the first task."""
    alone: bool = False
    """Holds one task that must run by itself (no batch dimension, zero rows, or an unbatchable signature)."""


@dataclasses.dataclass(eq=False)
class _Queue:
    key: tuple
    model: Any
    signature_name: str
    batches: collections.deque[_Batch] = dataclasses.field(default_factory=lambda: collections.deque([_Batch()]))

    @property
    def idle(self) -> bool:
        return len(self.batches) == 1 and not self.batches[0].tasks


class BatchScheduler:
    """Gathers concurrent requests into batches and runs them on ``num_batch_threads`` daemon threads.

    ``submit`` returns at once with a Future; ``close()`` (or leaving a ``with``
    block) stops the threads and answers waiting requests with UNAVAILABLE.
    ``on_batch(real_rows, padded_rows)`` is called before every forward pass
    the scheduler runs (for metrics); its exceptions are logged and ignored.
    """

    def __init__(self, parameters: BatchingParameters, *, on_batch: Callable[[int, int], None] | None = None) -> None:
        if not isinstance(parameters, BatchingParameters):
            raise TypeError(f"BatchScheduler takes BatchingParameters; received {type(parameters).__name__}.")
        if on_batch is not None and not callable(on_batch):
            raise TypeError(f"on_batch must be callable(real_rows, padded_rows) or None; received {on_batch!r}.")
        self._parameters = parameters
        self._on_batch = on_batch
        self._condition = threading.Condition()
        self._queues: dict[tuple, _Queue] = {}
        self._next_queue = 0  # round-robin position, as TF's next_queue_to_schedule_
        self._unbatchable: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"torchestimator-batch-{index}", daemon=True)
            for index in range(parameters.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def parameters(self) -> BatchingParameters:
        return self._parameters

    @property
    def num_enqueued_tasks(self) -> int:
        """Requests waiting in queues (not those a thread is running)."""
        with self._condition:
            return sum(len(batch.tasks) for queue in self._queues.values() for batch in queue.batches)

    def __enter__(self) -> BatchScheduler:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def submit(self, model: Any, signature_name: str, inputs: Mapping[str, torch.Tensor]) -> concurrent.futures.Future:
        """Queues one request; the Future's result is what ``model(inputs, signature_name=...)`` returns.

        Raises at once (never waits for the batch): ValueError/TypeError for
        inputs the signature refuses (as the model would), ServingError
        INVALID_ARGUMENT for more rows than max_batch_size, ServingError
        UNAVAILABLE when the queue is full or the scheduler is closed.
        """
        tensors = model.prepare_inputs(inputs, signature_name)
        signature = model.signature(signature_name)
        batchable = bool(signature.inputs) and all(
            info.shape and info.shape[0] == -1 for info in signature.inputs.values()
        )
        size = int(next(iter(tensors.values())).shape[0]) if batchable else 1
        limit = self._parameters.max_batch_size
        if size > limit:
            raise ServingError("INVALID_ARGUMENT", f"Task size {size} is larger than maximum input batch size {limit}")
        key = (
            id(model),
            signature_name,
            tuple((name, tensor.dtype, tuple(tensor.shape[1:])) for name, tensor in tensors.items()),
        )
        task = _Task(tensors, size, concurrent.futures.Future())
        with self._condition:
            if self._closed:
                raise ServingError(
                    "UNAVAILABLE",
                    "The batch scheduler is closed (the server is shutting down); "
                    "send the request to a running server.",
                )
            alone = not batchable or size == 0 or signature_name in self._unbatchable.get(model, ())
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Queue(key, model, signature_name)
            if self._enqueue_locked(queue, task, alone):
                self._condition.notify()
        return task.future

    def close(self, timeout: float | None = None) -> None:
        """Stops the threads (after the batches they are running) and fails waiting requests with UNAVAILABLE."""
        with self._condition:
            already_closed, self._closed = self._closed, True
            pending = [task for queue in self._queues.values() for batch in queue.batches for task in batch.tasks]
            self._queues.clear()
            self._condition.notify_all()
        if pending:
            logger.info("Batch scheduler closed with %d requests waiting; answering them UNAVAILABLE", len(pending))
        for task in pending:
            _set_exception(
                task.future,
                ServingError(
                    "UNAVAILABLE",
                    "The batch scheduler was closed before this request ran (the server is shutting "
                    "down); retry against a running server.",
                ),
            )
        if not already_closed:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join(timeout)

    # -- queues (all under self._condition) ------------------------------------------

    def _enqueue_locked(self, queue: _Queue, task: _Task, alone: bool) -> bool:
        """Adds the task to its queue; True when a thread should look (a new batch, or one that became ready)."""
        limit = self._parameters.max_batch_size
        open_batch = queue.batches[-1]
        fits = not alone and not open_batch.alone and open_batch.size + task.size <= limit
        if open_batch.tasks and not fits:
            enqueued, most = len(queue.batches), self._parameters.max_enqueued_batches
            if enqueued >= most:
                raise ServingError(
                    QUEUE_FULL_CODE,
                    f"The batch scheduling queue to which this task was submitted is "
                    f"full; currently {enqueued} batches enqueued and "
                    f"max_enqueued_batches is {most}",
                )
            open_batch = _Batch()
            queue.batches.append(open_batch)
        started = not open_batch.tasks
        if started:
            open_batch.start = time.monotonic()
        open_batch.tasks.append(task)
        open_batch.size += task.size
        open_batch.alone = alone
        return started or open_batch.size >= limit

    def _next_batch_locked(self) -> tuple[_Queue, _Batch] | float | None:
        """The next batch to run and its queue (round robin over queues), else how long until one may be ready
        (None: no work)."""
        now = time.monotonic()
        timeout = self._parameters.batch_timeout_micros / 1e6
        queues = list(self._queues.values())
        earliest: float | None = None
        for offset in range(len(queues)):
            queue = queues[(self._next_queue + offset) % len(queues)]
            batch = self._take_locked(queue, now, timeout)
            if batch is not None:
                self._next_queue = (self._next_queue + offset + 1) % len(queues)
                if queue.idle:
                    del self._queues[queue.key]  # no empty queues kept: memory stays bounded by waiting requests
                return queue, batch
            open_batch = queue.batches[-1]
            if open_batch.tasks:
                deadline = open_batch.start + timeout
                earliest = deadline if earliest is None else min(earliest, deadline)
        return None if earliest is None else max(0.0, earliest - now)

    def _take_locked(self, queue: _Queue, now: float, timeout: float) -> _Batch | None:
        if len(queue.batches) > 1:
            return queue.batches.popleft()
        batch = queue.batches[0]
        ready = batch.alone or batch.size >= self._parameters.max_batch_size or now >= batch.start + timeout
        if batch.tasks and ready:
            queue.batches[0] = _Batch()
            return batch
        return None

    # -- batch threads ---------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._condition:
                while True:
                    if self._closed:
                        return
                    found = self._next_batch_locked()
                    if isinstance(found, tuple):
                        queue, batch = found
                        break
                    self._condition.wait(found)  # woken by submit/close, or when the earliest open batch times out
                if self._queues:
                    self._condition.notify()  # more may be ready: let an idle thread look rather than wait
            self._run(queue, batch)

    def _run(self, queue: _Queue, batch: _Batch) -> None:
        tasks = [task for task in batch.tasks if task.future.set_running_or_notify_cancel()]  # skip cancelled
        try:
            if not tasks:
                return
            with self._condition:
                unbatchable = queue.signature_name in self._unbatchable.get(queue.model, ())
            if (
                batch.alone
                or unbatchable
                or (len(tasks) == 1 and self._parameters.padded_size(tasks[0].size) == tasks[0].size)
            ):
                for task in tasks:
                    self._run_alone(queue, task)
            else:
                self._run_together(queue, tasks)
        except Exception as error:  # our bug: answer every request and keep the thread alive
            logger.exception(
                "Batch of %d requests for signature %r failed inside the scheduler", len(tasks), queue.signature_name
            )
            for task in tasks:
                _set_exception(task.future, error)

    def _run_alone(self, queue: _Queue, task: _Task) -> None:
        self._report(task.size, task.size)
        try:
            outputs = queue.model(task.inputs, signature_name=queue.signature_name)
        except Exception as error:  # the request's own failure goes to its caller only
            task.future.set_exception(error)
        else:
            task.future.set_result(outputs)

    def _run_together(self, queue: _Queue, tasks: list[_Task]) -> None:
        rows = sum(task.size for task in tasks)
        padded = self._parameters.padded_size(rows)
        inputs = _concatenate(tasks, padded - rows)
        self._report(rows, padded)
        try:
            outputs = queue.model(inputs, signature_name=queue.signature_name)
        except Exception as error:
            if len(tasks) == 1:
                tasks[0].future.set_exception(error)
                return
            # One bad request must not fail its batch mates: rerun alone so only the guilty get the error.
            logger.info(
                "A batch of %d requests for signature %r failed (%s: %s); running them one by one",
                len(tasks),
                queue.signature_name,
                type(error).__name__,
                error,
            )
            for task in tasks:
                self._run_alone(queue, task)
            return
        results = _split(outputs, tasks, padded)
        if results is None:
            self._mark_unbatchable(queue, outputs, padded)
            for task in tasks:
                self._run_alone(queue, task)
            return
        for task, result in zip(tasks, results):
            task.future.set_result(result)

    def _mark_unbatchable(self, queue: _Queue, outputs: Mapping[str, np.ndarray], padded: int) -> None:
        shapes = {name: list(np.shape(array)) for name, array in outputs.items()}
        logger.warning(
            "Signature %r of %r returns outputs without the batch size (%d) first (%s); its requests run "
            "one at a time from now on",
            queue.signature_name,
            queue.model,
            padded,
            shapes,
        )
        with self._condition:
            self._unbatchable.setdefault(queue.model, set()).add(queue.signature_name)

    def _report(self, rows: int, padded: int) -> None:
        if self._on_batch is None:
            return
        try:
            self._on_batch(rows, padded)
        except Exception:  # metrics must never fail a request
            logger.exception("on_batch callback failed")


def _concatenate(tasks: list[_Task], padding: int) -> dict[str, torch.Tensor]:
    """The tasks' inputs stacked along dim 0, plus ``padding`` copies of the first row (BatchingSession's choice)."""
    batched = {}
    for name in tasks[0].inputs:
        parts = [task.inputs[name] for task in tasks]
        if padding:
            first = parts[0][:1]
            parts.append(first.expand(padding, *first.shape[1:]))
        batched[name] = torch.cat(parts)
    return batched


def _split(outputs: Mapping[str, np.ndarray], tasks: list[_Task], padded: int) -> list[dict[str, np.ndarray]] | None:
    """Each task's rows of every output, padding dropped; None when an output lacks the batch dimension."""
    if any(np.ndim(array) == 0 or np.shape(array)[0] != padded for array in outputs.values()):
        return None
    results, start = [], 0
    for task in tasks:
        stop = start + task.size
        results.append({name: array[start:stop] for name, array in outputs.items()})
        start = stop
    return results


def _set_exception(future: concurrent.futures.Future, error: BaseException) -> None:
    try:
        if not future.done():
            future.set_exception(error)
    except concurrent.futures.InvalidStateError:  # cancelled by its caller meanwhile: nobody is waiting
        pass


def _unwrap(value: Any) -> Any:
    """TF's wrapper types (``max_batch_size { value: 128 }``) parse to {"value": 128}."""
    if isinstance(value, Mapping) and set(value) == {"value"}:
        return value["value"]
    return value


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int; received {value!r} ({type(value).__name__}).")
    if value < minimum:
        kind = "positive" if minimum == 1 else "non-negative"
        raise ValueError(f"{name} must be {kind}; received {value}.")
