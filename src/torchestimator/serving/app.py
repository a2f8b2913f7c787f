"""The aiohttp application: TF Serving's REST paths, dispatch, error mapping, metrics.

Paths follow SRV ``model_servers/http_rest_api_util.cc`` (case-insensitive):

    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]                       status
    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata              signature defs
    POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict|classify|regress
    GET  /monitoring/prometheus/metrics                                     Prometheus (path configurable)

Parsing, inference and encoding run in a thread pool (or, with batching, the
parsed tensors go to the BatchScheduler's threads), so the event loop only
moves bytes; except for small requests to a model measured fast at load (a
forward of at most ``inline_forward_micros`` for the request's rows), which
run on the loop: for them the hop to a thread and back costs more than the
forward (see _fast_model). Those requests cannot be cut at the request
timeout; they are bounded by the estimate instead, and a model whose inline
calls turn out slow goes back to the threads. Every answer is JSON; a ServingError becomes ``{"error": ...}``
with its HTTP status, anything else a logged 500. Which version serves a
request is the ModelManager's business (manager.py); JSON shapes are
json_tensor.py's and examples_json.py's; gzip and deflate bodies are inflated
by content_coding.py; requests too malformed to reach a handler are answered
by protocol.py; starting a server is server.py's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import os
import re
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from torchestimator._extras import import_extra

web = import_extra("aiohttp.web", extra="serving", feature="the model server")

from torchestimator.export import ExportedModel
from torchestimator.serving.batching import BatchingParameters, BatchScheduler
from torchestimator.serving.completions import LoopCompletions
from torchestimator.serving.content_coding import BodyTooLarge, decode_content
from torchestimator.serving.errors import ServingError, invalid_argument, not_found
from torchestimator.serving.examples_json import classify_results, parse_examples_request, regress_results
from torchestimator.serving.json_tensor import (
    decode_body,
    metadata_document,
    parse_predict,
    predict_response_bytes,
    status_document,
)
from torchestimator.serving.manager import ModelManager
from torchestimator.serving.metrics import API_BY_VERB, ServingMetrics
from torchestimator.serving.settings import (  # the first two re-exported: they lived here
    DEFAULT_INLINE_FORWARD_MICROS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_METRICS_PATH,
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_METRICS_PATH", "make_app"]

logger = logging.getLogger(__name__)

_PREDICT_PATH = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)",
                           re.IGNORECASE)
_MODEL_PATH = re.compile(r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(/metadata)?",
                         re.IGNORECASE)
_BOTH_VERSION_AND_LABEL = re.compile(r"/v1/models/[^/:]+/versions/\d+/labels/[^/:]+.*", re.IGNORECASE)

_STATE = web.AppKey("serving_state", object)
_CALL_KEY = web.RequestKey("torchestimator_serving_call", object)


@dataclasses.dataclass(kw_only=True)
class _ServingState:
    """Everything a handler needs, hung on the app once."""

    managers: dict[str, ModelManager]
    executor: concurrent.futures.ThreadPoolExecutor
    max_body_bytes: int
    timeout_seconds: float | None
    metrics: ServingMetrics
    metrics_path: str | None
    scheduler: BatchScheduler | None
    inline_forward_seconds: float
    """Requests whose estimated forward is at most this run on the event loop (0: never); see _fast_model."""
    slow_inline_calls: weakref.WeakKeyDictionary[Any, int] = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary)
    """Per model, its inline forwards found slow (_run_inline); at _DEMOTION_SLOW_CALLS, worker threads only."""
    completions: LoopCompletions | None = None
    """Batch results to the event loop serving the app (made on its first batched request)."""

    def completions_for(self, loop: asyncio.AbstractEventLoop) -> LoopCompletions:
        if self.completions is None or self.completions.loop is not loop:
            self.completions = LoopCompletions(loop)
        return self.completions


@dataclasses.dataclass(frozen=True)
class _Call:
    """What a request is, for metrics: TF's API label and the model it names."""

    api: str
    model_name: str | None


def make_app(
    managers: ModelManager | Iterable[ModelManager] | Mapping[str, ModelManager],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    num_threads: int | None = None,
    batching: BatchingParameters | None = None,
    metrics_path: str | None = DEFAULT_METRICS_PATH,
    timeout_seconds: float | None = 30.0,
    inline_forward_micros: int = DEFAULT_INLINE_FORWARD_MICROS,
) -> web.Application:
    """An application answering TF Serving's REST API for the given models (polling is added by server.py).

    ``batching`` gathers concurrent requests into one forward pass (TF's
    --enable_batching); ``metrics_path`` None turns the Prometheus page off;
    ``timeout_seconds`` is TF's rest_api_timeout_in_ms (504 when exceeded);
    ``inline_forward_micros``: a small request (body up to 16 KiB) to a model
    whose forward, measured at load on a batch of one, times the request's
    rows is at most this many microseconds runs on the event loop instead of
    a worker thread (0: always a worker thread). Batching ignores it.
    """
    by_name = _managers_by_name(managers)
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be a positive int; received {max_body_bytes!r}.")
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads <= 0):
        raise ValueError(f"num_threads must be a positive int or None (default); received {num_threads!r}.")
    if timeout_seconds is not None and not timeout_seconds > 0:
        raise ValueError(f"timeout_seconds must be positive or None (no limit); received {timeout_seconds!r}.")
    if metrics_path is not None and (not isinstance(metrics_path, str) or not metrics_path.startswith("/")
                                     or metrics_path.lower().startswith("/v1/")):
        raise ValueError(f"metrics_path must be an absolute path outside /v1/ (TF's is {DEFAULT_METRICS_PATH}); "
                         f"received {metrics_path!r}.")
    if isinstance(inline_forward_micros, bool) or not isinstance(inline_forward_micros, int) \
            or inline_forward_micros < 0:
        raise ValueError(f"inline_forward_micros must be an int >= 0 (0: never run a forward on the event loop); "
                         f"received {inline_forward_micros!r}.")
    if batching is not None and not isinstance(batching, BatchingParameters):
        raise TypeError(f"batching must be BatchingParameters or None; received {type(batching).__name__}.")
    metrics = ServingMetrics()
    # Bodies are inflated by content_coding.py, not by aiohttp's parser (where a bad gzip body breaks the connection).
    app = web.Application(client_max_size=max_body_bytes, handler_args={"auto_decompress": False})
    app[_STATE] = _ServingState(
        managers=by_name,
        executor=concurrent.futures.ThreadPoolExecutor(
            max_workers=num_threads or default_num_threads(), thread_name_prefix="torchestimator-serving"),
        max_body_bytes=max_body_bytes,
        timeout_seconds=timeout_seconds,
        metrics=metrics,
        metrics_path=metrics_path,
        inline_forward_seconds=inline_forward_micros * 1e-6,
        scheduler=None if batching is None else BatchScheduler(
            batching, on_batch=lambda real, padded: metrics.observe_batch(None, real, padded)),
    )
    app.router.add_route("*", r"/{tail:[\s\S]*}", _dispatch)  # one handler: TF's paths are case-insensitive
    app.on_cleanup.append(_shutdown)
    return app


def default_num_threads() -> int:
    """One worker thread per CPU core.

    Request work is Python (GIL) plus torch ops: threads beyond the cores
    only contend. Measured on 2 cores, 8 concurrent clients, small MLP: 2
    threads answered 10-25% more requests/s than 6. TF Serving's 4 x cores
    are C++ HTTP threads, which have no GIL to share.
    """
    return os.cpu_count() or 1


def managers_of(app: web.Application) -> dict[str, ModelManager]:
    """The app's models by name; server.py adds and removes entries when the model config file changes."""
    return app[_STATE].managers


async def _dispatch(request: web.Request) -> web.Response:
    state: _ServingState = request.app[_STATE]
    started = time.perf_counter()
    try:
        response = await _route(request, state)
    except ServingError as error:
        response = _json_response({"error": error.message}, error.http_status)
    except (web.HTTPRequestEntityTooLarge, BodyTooLarge):
        response = _too_large(state.max_body_bytes)
    except ConnectionError as error:  # the client left mid-body: one line, no traceback; nobody reads the answer
        logger.info("%s %s: the client disconnected before sending the whole body (%s)", request.method,
                    request.path, error)
        response = _json_response({"error": "The client disconnected before sending the whole body."}, 499)
    except Exception:  # our bug, not the client's: answer and keep serving
        logger.exception("Internal error answering %s %s", request.method, request.path)
        response = _json_response({"error": "Internal server error; see the server log."}, 500)
    call = request.get(_CALL_KEY)  # set by _route once it knows what the request is, errors included
    if call is not None and call.model_name is not None:
        state.metrics.observe_request(call.model_name, call.api, _status_code(response.status),
                                      time.perf_counter() - started)
    return response


async def _route(request: web.Request, state: _ServingState) -> web.Response:
    path, method = request.path, request.method
    if state.metrics_path is not None and path == state.metrics_path:
        if method != "GET":
            return _method_not_allowed(method, path, "GET")
        body, content_type = state.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})
    match = _PREDICT_PATH.fullmatch(path)
    if match:
        name, version, label, verb = match.groups()
        request[_CALL_KEY] = _Call(API_BY_VERB[verb.lower()], name)
        if method != "POST":
            return _method_not_allowed(method, path, "POST")
        return await _infer(request, state, name, _version(version), label, verb.lower())
    match = _MODEL_PATH.fullmatch(path)
    if match:
        name, version, label, metadata = match.groups()
        request[_CALL_KEY] = _Call("GetModelMetadata" if metadata else "GetModelStatus", name)
        if method != "GET":
            return _method_not_allowed(method, path, "GET")
        if name is None:
            raise invalid_argument("Missing model name in request.")
        if metadata:
            return _metadata(state, name, _version(version), label)
        return _status(state, name, _version(version), label)
    if _BOTH_VERSION_AND_LABEL.fullmatch(path):
        raise invalid_argument(f"Malformed request: {method} {path}: a request may name a version or a label, not both.")
    if path[:4].lower() in ("/v1/", "/v1"):
        raise invalid_argument(f"Malformed request: {method} {path}")
    raise not_found(f"Not found: {path}. The REST API lives under /v1/models/<name>.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Parsed:
    """A checked request: what to run, and how to turn the outputs into the response bytes."""

    signature_name: str
    inputs: dict[str, torch.Tensor]
    encode: Any
    """outputs -> JSON bytes."""
    examples: int | None = None
    """How many tf.Examples a classify/regress request carried (TF counts them in its metrics)."""


# Bodies up to this size are decoded on the event loop: a thread hop costs more than parsing them.
_INLINE_BODY_BYTES = 16 * 1024


async def _infer(request: web.Request, state: _ServingState, name: str, version: int | None, label: str | None,
                 verb: str) -> web.Response:
    model, served_version = _servable(state, name, version, label)  # kept through any swap
    if request.content_length is not None and request.content_length > state.max_body_bytes:
        return _too_large(state.max_body_bytes)
    body = await request.read()
    loop = asyncio.get_running_loop()
    encoding = request.headers.get("Content-Encoding")
    if encoding:  # inflating may take a while (up to the body limit): off the event loop
        body = await loop.run_in_executor(state.executor, decode_content, body, encoding, state.max_body_bytes)
    if state.scheduler is not None:
        work = _run_batched(loop, state, model, body, verb)
    elif len(body) <= _INLINE_BODY_BYTES and \
            (forward_seconds := _fast_model(state, model, name, served_version)) is not None:
        parsed = _parse(model, body, verb)  # small: cheaper here than a thread hop
        if forward_seconds * _rows(parsed) <= state.inline_forward_seconds:  # rows x batch-of-one: an upper bound
            payload = _run_inline(state, model, parsed, name, served_version)
            if parsed.examples is not None:
                state.metrics.observe_examples(name, parsed.examples)
            return web.Response(body=payload, status=200, content_type="application/json")
        work = loop.run_in_executor(state.executor, _run_encode_counted, model, parsed)
    else:  # one hop: parse, run and encode in a worker thread
        work = loop.run_in_executor(state.executor, _parse_run_encode, model, body, verb)
    try:
        payload, examples = await asyncio.wait_for(work, state.timeout_seconds)
    except asyncio.TimeoutError:
        raise ServingError("DEADLINE_EXCEEDED", f"The request did not finish within {state.timeout_seconds} s "
                                                "(--rest_api_timeout_in_ms).") from None
    if examples is not None:
        state.metrics.observe_examples(name, examples)
    return web.Response(body=payload, status=200, content_type="application/json")


def _parse_run_encode(model: ExportedModel, body: bytes, verb: str) -> tuple[bytes, int | None]:
    return _run_encode_counted(model, _parse(model, body, verb))


def _run_encode_counted(model: ExportedModel, parsed: _Parsed) -> tuple[bytes, int | None]:
    return _run_encode(model, parsed), parsed.examples


def _run_encode(model: ExportedModel, parsed: _Parsed) -> bytes:
    outputs = _run_model(lambda: model(parsed.inputs, signature_name=parsed.signature_name))
    return parsed.encode(outputs)


def _fast_model(state: _ServingState, model: Any, name: str, version: int) -> float | None:
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
    if type(model) is not ExportedModel or state.slow_inline_calls.get(model, 0) >= _DEMOTION_SLOW_CALLS:
        return None
    manager = state.managers.get(name)
    seconds = None if manager is None else manager.forward_seconds(version)
    return seconds if seconds is not None and seconds <= state.inline_forward_seconds else None


# Inline forwards this many times over the limit (the model or the machine is slower than at load; one
# preempted call on a busy machine is not that) send that model's later requests to the worker threads.
_DEMOTION_FACTOR = 20
_DEMOTION_SLOW_CALLS = 3


def _run_inline(state: _ServingState, model: ExportedModel, parsed: _Parsed, name: str, version: int) -> bytes:
    # This thread's CPU time, not the wall clock: waiting for the GIL while request threads parse big bodies
    # says nothing of the model. Only slow calls in a row count: one fast call clears the strikes.
    started = time.thread_time()
    try:
        return _run_encode(model, parsed)
    finally:
        took = time.thread_time() - started
        if took <= _DEMOTION_FACTOR * state.inline_forward_seconds:
            if state.slow_inline_calls.get(model, 0) < _DEMOTION_SLOW_CALLS:
                state.slow_inline_calls.pop(model, None)
        else:
            slow_calls = state.slow_inline_calls[model] = state.slow_inline_calls.get(model, 0) + 1
            if slow_calls == _DEMOTION_SLOW_CALLS:
                logger.warning("%s version %d: %d requests in a row on the event loop took over %.0f ms of CPU "
                               "(the last %.1f ms; the limit is %.1f ms); its requests run in worker threads from "
                               "now on.", name,
                               version, slow_calls, _DEMOTION_FACTOR * state.inline_forward_seconds * 1e3,
                               took * 1e3, state.inline_forward_seconds * 1e3)


def _rows(parsed: _Parsed) -> int:
    """The request's batch size (its inputs' largest leading dimension; 1 for scalars)."""
    return max((tensor.shape[0] for tensor in parsed.inputs.values() if tensor.dim()), default=1)


async def _run_batched(loop: asyncio.AbstractEventLoop, state: _ServingState, model: ExportedModel, body: bytes,
                       verb: str) -> tuple[bytes, int | None]:
    """Parse, then wait for the batch the scheduler puts the request in, then encode.

    Small requests are parsed and encoded on the event loop, so a request
    costs one hand-off to a batch thread and back rather than three.
    """
    assert state.scheduler is not None
    small = len(body) <= _INLINE_BODY_BYTES
    parsed = _parse(model, body, verb) if small else await loop.run_in_executor(
        state.executor, _parse, model, body, verb)
    # submit checks the inputs against the signature (the model's own checks; 400 naming the input) and
    # raises RESOURCE_EXHAUSTED (429) at once when the queue is full.
    future = _run_model(lambda: state.scheduler.submit(model, parsed.signature_name, parsed.inputs))
    # One wake-up of the loop per batch, not per request (completions.py says why that matters).
    outputs = await state.completions_for(loop).wrap(future, _as_serving_error)
    if sum(array.nbytes for array in outputs.values()) <= _INLINE_BODY_BYTES:
        return parsed.encode(outputs), parsed.examples
    return await loop.run_in_executor(state.executor, parsed.encode, outputs), parsed.examples


def _parse(model: ExportedModel, body: bytes, verb: str) -> _Parsed:
    """Decode and check a request against the model's signature (CPU work: off the event loop unless small)."""
    try:
        return _parse_document(model, decode_body(body), verb)
    except RecursionError:  # no tensor nests deeper than 64 dimensions: any JSON that exhausts the stack is bad
        raise invalid_argument("The request body nests JSON arrays or objects too deeply; tensors have at most "
                               "64 dimensions.") from None


def _parse_document(model: ExportedModel, document: dict[str, Any], verb: str) -> _Parsed:
    if verb == "predict":
        predict = parse_predict(document, model)

        def encode_predictions(outputs: Mapping[str, np.ndarray]) -> bytes:
            return predict_response_bytes(outputs, predict.row_format)

        return _Parsed(signature_name=predict.signature_name, encode=encode_predictions,
                       inputs=predict.inputs)
    examples = parse_examples_request(document, model, verb)
    results = classify_results if verb == "classify" else regress_results

    def encode_results(outputs: Mapping[str, np.ndarray]) -> bytes:
        return json.dumps(results(outputs, examples.count)).encode()

    return _Parsed(signature_name=examples.signature_name, encode=encode_results, examples=examples.count,
                   inputs=examples.inputs)


def _run_model(run: Any) -> Any:
    try:
        return run()
    except Exception as error:
        mapped = _as_serving_error(error)
        if mapped is error:
            raise
        raise mapped from error


def _as_serving_error(error: BaseException) -> BaseException:
    """Model failures caused by the inputs are the client's (400); anything else stays a 500."""
    if isinstance(error, (ValueError, TypeError)):  # the loader's checks: they name the input and the mismatch
        return invalid_argument(str(error))
    if isinstance(error, (RuntimeError, IndexError)):
        return invalid_argument(f"The model failed on these inputs: {error}")  # e.g. an index out of range
    if isinstance(error, AssertionError) and "Guard failed" in str(error):  # torch.export's shape guards
        return invalid_argument(f"The model refused these inputs' shapes: {error}")
    return error


def _status(state: _ServingState, name: str, version: int | None, label: str | None) -> web.Response:
    manager = state.managers.get(name)
    if manager is None:
        raise not_found(f"Could not find any versions of model {name}")
    return _json_response(status_document(manager.statuses(version, label)), 200)


def _metadata(state: _ServingState, name: str, version: int | None, label: str | None) -> web.Response:
    model, served_version = _servable(state, name, version, label)
    return _json_response(metadata_document(name, served_version, model), 200)


def _servable(state: _ServingState, name: str, version: int | None, label: str | None) -> tuple[ExportedModel, int]:
    """The loaded model a request names (latest when no version or label is given), else NOT_FOUND."""
    manager = state.managers.get(name)
    if manager is None:
        spec = f"Latest({name})" if version is None and label is None else \
            f"Specific({name}, {version})" if label is None else f"Label({name}, {label})"
        raise not_found(f"Servable not found for request: {spec} (served models: {sorted(state.managers)})")
    served_version, model = manager.resolve(version, label)
    return model, served_version


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    version = int(text)
    if version >= 2 ** 63:  # TF parses versions as int64
        raise invalid_argument(f"Failed to convert version: {text} (versions are 64-bit signed integers).")
    return version


def _status_code(http_status: int) -> str:
    """TF's canonical code name for the metrics' status label."""
    return _CODE_NAMES.get(http_status, "UNKNOWN")


_CODE_NAMES = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "INVALID_ARGUMENT", 413: "INVALID_ARGUMENT",
               429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
               504: "DEADLINE_EXCEEDED"}


def _managers_by_name(managers: Any) -> dict[str, ModelManager]:
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


async def _shutdown(app: web.Application) -> None:
    state: _ServingState = app[_STATE]
    if state.scheduler is not None:
        state.scheduler.close(timeout=10)
    state.executor.shutdown(wait=False, cancel_futures=True)


def _method_not_allowed(method: str, path: str, allowed: str) -> web.Response:
    return _json_response({"error": f"Method {method} is not allowed for {path}; use {allowed}."}, 405,
                          headers={"Allow": allowed})


def _too_large(limit: int) -> web.Response:
    return _json_response({"error": f"Request body is larger than the server's limit of {limit} bytes; "
                                    "send fewer instances per request or raise the limit."}, 413)


def _json_response(document: Any, status: int, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(document), status=status, content_type="application/json", headers=headers)
