"""What every request goes through, whatever its transport: version resolution, where it runs, errors, metrics.

    core = RequestCore(managers, batching=None, timeout_seconds=30.0, inline_forward_micros=1000)
    model, version = core.servable("digits", None, "stable")          # NOT_FOUND / INVALID_ARGUMENT as TF words them
    payload = await core.run(model, "digits", version, small=True, parse=lambda: Parsed(...))
    core.observe_request("digits", "Predict", "OK", seconds, entrypoint="GRPC")

What belongs here: the state both transports share (the models by name, the
worker threads, the batch scheduler, the metrics), choosing where a parsed
request runs (the batch scheduler's threads; the event loop for a small
request to a model measured fast at load, see ``_fast_model``; else one hop
to a worker thread that parses, runs and encodes), the request timeout, and
turning a model's failure into TF's status code. What does not: reading a
transport's requests and writing its answers (app.py: REST JSON over aiohttp;
grpc_server.py: TF Serving's protos over grpcio). A transport hands ``run`` a
``parse`` callable that checks the request against the model and returns a
``Parsed`` (its tensors, and how to encode the outputs as that transport's
answer), so REST and gRPC share batching, the inline fast path, the worker
pool and the error mapping, and a model answers both the same.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import numpy as np

from torchestimator.export import ExportedModel
from torchestimator.serving.batching import BatchingParameters, BatchScheduler
from torchestimator.serving.completions import LoopCompletions
from torchestimator.serving.errors import ServingError, invalid_argument, not_found
from torchestimator.serving.manager import ModelManager, VersionStatus
from torchestimator.serving.metrics import ServingMetrics

__all__ = [
    "INLINE_BODY_BYTES",
    "Parsed",
    "RequestCore",
    "as_serving_error",
    "default_num_threads",
    "managers_by_name",
    "parse_version",
]

logger = logging.getLogger(__name__)

INLINE_BODY_BYTES = 16 * 1024
"""Requests up to this size are decoded on the event loop: a thread hop costs more than parsing them."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parsed:
    """A checked request: what to run, and how to turn the outputs into the transport's answer."""

    signature_name: str
    inputs: dict[str, Any]
    """Input name -> torch tensor (numeric inputs) or numpy object array of bytes (string inputs)."""
    encode: Callable[[Mapping[str, np.ndarray]], Any]
    """outputs -> the answer (JSON bytes for REST, a response message for gRPC)."""
    examples: int | None = None
    """How many tf.Examples a classify/regress request carried (TF counts them in its metrics)."""
    output_keys: list[str] | None = None
    """The outputs to compute (gRPC's output_filter); None: all of the signature's."""


class RequestCore:
    """The models, threads, batch scheduler and metrics one server's transports share."""

    def __init__(
        self,
        managers: dict[str, ModelManager],
        *,
        num_threads: int | None = None,
        batching: BatchingParameters | None = None,
        timeout_seconds: float | None = 30.0,
        inline_forward_micros: int = 1000,
        metrics: ServingMetrics | None = None,
    ) -> None:
        if num_threads is not None and (
            isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads <= 0
        ):
            raise ValueError(f"num_threads must be a positive int or None (default); received {num_threads!r}.")
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be positive or None (no limit); received {timeout_seconds!r}.")
        if (
            isinstance(inline_forward_micros, bool)
            or not isinstance(inline_forward_micros, int)
            or inline_forward_micros < 0
        ):
            raise ValueError(
                f"inline_forward_micros must be an int >= 0 (0: never run a forward on the event loop); "
                f"received {inline_forward_micros!r}."
            )
        if batching is not None and not isinstance(batching, BatchingParameters):
            raise TypeError(f"batching must be BatchingParameters or None; received {type(batching).__name__}.")
        self.managers = managers
        self.metrics = metrics if metrics is not None else ServingMetrics()
        self.timeout_seconds = timeout_seconds
        self.inline_forward_seconds = inline_forward_micros * 1e-6
        """Requests whose estimated forward is at most this run on the event loop (0: never); see _fast_model."""
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=num_threads or default_num_threads(), thread_name_prefix="torchestimator-serving"
        )
        self.scheduler = (
            None
            if batching is None
            else BatchScheduler(batching, on_batch=lambda real, padded: self.metrics.observe_batch(None, real, padded))
        )
        # Per model, its inline forwards found slow (_run_inline); at _DEMOTION_SLOW_CALLS, worker threads only.
        self.slow_inline_calls: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._completions: LoopCompletions | None = None  # batch results to the serving event loop

    # -- which model ------------------------------------------------------------------------------

    def servable(self, name: str, version: int | None, label: str | None) -> tuple[ExportedModel, int]:
        """The loaded model a request names (latest when no version or label is given), else NOT_FOUND."""
        manager = self.managers.get(name)
        if manager is None:
            spec = (
                f"Latest({name})"
                if version is None and label is None
                else f"Specific({name}, {version})"
                if label is None
                else f"Label({name}, {label})"
            )
            raise not_found(f"Servable not found for request: {spec} (served models: {sorted(self.managers)})")
        served_version, model = manager.resolve(version, label)
        return model, served_version

    def statuses(self, name: str, version: int | None, label: str | None) -> list[VersionStatus]:
        manager = self.managers.get(name)
        if manager is None:
            raise not_found(f"Could not find any versions of model {name}")
        return manager.statuses(version, label)

    def observe_request(self, name: str, api: str, code: str, seconds: float, entrypoint: str) -> None:
        self.metrics.observe_request(name, api, code, seconds, entrypoint=entrypoint)

    # -- where it runs ----------------------------------------------------------------------------

    async def run(
        self,
        model: ExportedModel,
        name: str,
        version: int,
        *,
        small: bool,
        parse: Callable[[], Parsed],
        timeout_hint: str,
    ) -> Any:
        """Parses (``parse``), runs and encodes one request; returns the encoded answer.

        ``small``: the request is cheap enough to parse on the event loop.
        ``timeout_hint`` ends the DEADLINE_EXCEEDED message (which setting to raise).
        """
        loop = asyncio.get_running_loop()
        work: Awaitable[tuple[Any, int | None]]  # the encoded answer and its tf.Example count
        if self.scheduler is not None:
            work = self._run_batched(loop, model, small, parse)
        elif small and (forward_seconds := self._fast_model(model, name, version)) is not None:
            parsed = parse()  # small: cheaper here than a thread hop
            if forward_seconds * _rows(parsed) <= self.inline_forward_seconds:  # rows x batch-of-one: an upper bound
                payload = self._run_inline(model, parsed, name, version)
                if parsed.examples is not None:
                    self.metrics.observe_examples(name, parsed.examples)
                return payload
            work = loop.run_in_executor(self.executor, _run_encode_counted, model, parsed)
        else:  # one hop: parse, run and encode in a worker thread
            work = loop.run_in_executor(self.executor, _parse_run_encode, model, parse)
        try:
            payload, examples = await asyncio.wait_for(work, self.timeout_seconds)
        except asyncio.TimeoutError:
            raise ServingError(
                "DEADLINE_EXCEEDED", f"The request did not finish within {self.timeout_seconds} s ({timeout_hint})."
            ) from None
        if examples is not None:
            self.metrics.observe_examples(name, examples)
        return payload

    def _fast_model(self, model: Any, name: str, version: int) -> float | None:
        """The version's batch-of-one forward seconds when its requests may run on the event loop, else None.

        Inline runs are for models whose forward costs less than handing the
        request to a worker thread and back (the hop's wake-ups and GIL
        hand-offs were ~160 us of a ~620 us small-MLP request on 2 cores); a
        slower model keeps the worker threads, so the loop stays responsive.
        Only torch.export programs (ExportedModel) qualify: their graph has no
        data-dependent control flow, so the time measured at load, times the
        rows, bounds a request's forward. Whatever a custom loader returns may
        wait on I/O or locks, and keeps the threads and the request timeout.
        """
        if type(model) is not ExportedModel or self.slow_inline_calls.get(model, 0) >= _DEMOTION_SLOW_CALLS:
            return None
        manager = self.managers.get(name)
        seconds = None if manager is None else manager.forward_seconds(version)
        return seconds if seconds is not None and seconds <= self.inline_forward_seconds else None

    def _run_inline(self, model: ExportedModel, parsed: Parsed, name: str, version: int) -> Any:
        # This thread's CPU time, not the wall clock: waiting for the GIL while request threads parse big bodies
        # says nothing of the model. Only slow calls in a row count: one fast call clears the strikes.
        started = time.thread_time()
        try:
            return _run_encode(model, parsed)
        finally:
            took = time.thread_time() - started
            if took <= _DEMOTION_FACTOR * self.inline_forward_seconds:
                if self.slow_inline_calls.get(model, 0) < _DEMOTION_SLOW_CALLS:
                    self.slow_inline_calls.pop(model, None)
            else:
                slow_calls = self.slow_inline_calls[model] = self.slow_inline_calls.get(model, 0) + 1
                if slow_calls == _DEMOTION_SLOW_CALLS:
                    logger.warning(
                        "%s version %d: %d requests in a row on the event loop took over %.0f ms of CPU "
                        "(the last %.1f ms; the limit is %.1f ms); its requests run in worker threads "
                        "from now on.",
                        name,
                        version,
                        slow_calls,
                        _DEMOTION_FACTOR * self.inline_forward_seconds * 1e3,
                        took * 1e3,
                        self.inline_forward_seconds * 1e3,
                    )

    async def _run_batched(
        self, loop: asyncio.AbstractEventLoop, model: ExportedModel, small: bool, parse: Callable[[], Parsed]
    ) -> tuple[Any, int | None]:
        """Parse, then wait for the batch the scheduler puts the request in, then encode.

        Small requests are parsed and encoded on the event loop, so a request
        costs one hand-off to a batch thread and back rather than three.
        """
        scheduler = self.scheduler
        assert scheduler is not None
        parsed = parse() if small else await loop.run_in_executor(self.executor, parse)
        # submit checks the inputs against the signature (the model's own checks; INVALID_ARGUMENT naming the
        # input) and raises RESOURCE_EXHAUSTED at once when the queue is full.
        future = _run_model(lambda: scheduler.submit(model, parsed.signature_name, parsed.inputs))
        # One wake-up of the loop per batch, not per request (completions.py says why that matters).
        outputs = await self._completions_for(loop).wrap(future, as_serving_error)
        if parsed.output_keys is not None:
            outputs = {key: outputs[key] for key in parsed.output_keys}
        if sum(array.nbytes for array in outputs.values()) <= INLINE_BODY_BYTES:
            return parsed.encode(outputs), parsed.examples
        return await loop.run_in_executor(self.executor, parsed.encode, outputs), parsed.examples

    def _completions_for(self, loop: asyncio.AbstractEventLoop) -> LoopCompletions:
        if self._completions is None or self._completions.loop is not loop:
            self._completions = LoopCompletions(loop)
        return self._completions

    def close(self) -> None:
        """Stops the batch threads (waiting requests fail UNAVAILABLE) and the worker pool."""
        if self.scheduler is not None:
            self.scheduler.close(timeout=10)
        self.executor.shutdown(wait=False, cancel_futures=True)


# Inline forwards this many times over the limit (the model or the machine is slower than at load; one
# preempted call on a busy machine is not that) send that model's later requests to the worker threads.
_DEMOTION_FACTOR = 20
_DEMOTION_SLOW_CALLS = 3


def _parse_run_encode(model: ExportedModel, parse: Callable[[], Parsed]) -> tuple[Any, int | None]:
    return _run_encode_counted(model, parse())


def _run_encode_counted(model: ExportedModel, parsed: Parsed) -> tuple[Any, int | None]:
    return _run_encode(model, parsed), parsed.examples


def _run_encode(model: ExportedModel, parsed: Parsed) -> Any:
    if parsed.output_keys is None:
        outputs = _run_model(lambda: model(parsed.inputs, signature_name=parsed.signature_name))
    else:
        outputs = _run_model(
            lambda: model(parsed.inputs, signature_name=parsed.signature_name, output_keys=parsed.output_keys)
        )
    return parsed.encode(outputs)


def _rows(parsed: Parsed) -> int:
    """The request's batch size (its inputs' largest leading dimension; 1 for scalars)."""
    return max(
        (
            len(value) if isinstance(value, (list, tuple)) else value.shape[0]
            for value in parsed.inputs.values()
            if isinstance(value, (list, tuple)) or len(value.shape)
        ),
        default=1,
    )


def _run_model(run: Callable[[], Any]) -> Any:
    try:
        return run()
    except Exception as error:
        mapped = as_serving_error(error)
        if mapped is error:
            raise
        raise mapped from error


def as_serving_error(error: BaseException) -> BaseException:
    """Model failures caused by the inputs are the client's (INVALID_ARGUMENT); anything else stays ours."""
    if isinstance(error, ServingError):
        return error
    if isinstance(error, (ValueError, TypeError)):  # the loader's checks: they name the input and the mismatch
        return invalid_argument(str(error))
    if isinstance(error, (RuntimeError, IndexError)):
        return invalid_argument(f"The model failed on these inputs: {error}")  # e.g. an index out of range
    if isinstance(error, AssertionError) and "Guard failed" in str(error):  # torch.export's shape guards
        return invalid_argument(f"The model refused these inputs' shapes: {error}")
    return error


def parse_version(text: str | int | None) -> int | None:
    """A version from a path or a message; TF parses versions as int64."""
    if text is None:
        return None
    version = int(text)
    if version >= 2**63:
        raise invalid_argument(f"Failed to convert version: {text} (versions are 64-bit signed integers).")
    return version


def default_num_threads() -> int:
    """One worker thread per CPU core.

    Request work is Python (GIL) plus torch ops: threads beyond the cores
    only contend. Measured on 2 cores, 8 concurrent clients, small MLP: 2
    threads answered 10-25% more requests/s than 6. TF Serving's 4 x cores
    are C++ HTTP threads, which have no GIL to share.
    """
    return os.cpu_count() or 1


def managers_by_name(
    managers: ModelManager | Iterable[ModelManager] | Mapping[str, ModelManager],
) -> dict[str, ModelManager]:
    if isinstance(managers, ModelManager):
        managers = [managers]
    elif isinstance(managers, Mapping):
        managers = list(managers.values())
    managers = list(managers)
    if not managers or not all(isinstance(manager, ModelManager) for manager in managers):
        raise TypeError(f"make_app takes a ModelManager or a non-empty list of them; received {managers!r}.")
    by_name: dict[str, ModelManager] = {}
    for manager in managers:
        if manager.name in by_name:
            raise ValueError(f"Two managers serve the model name {manager.name!r}; model names must be unique.")
        by_name[manager.name] = manager
    return by_name
