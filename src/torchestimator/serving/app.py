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
by protocol.py; starting a server is server.py's. Where a request runs (batching,
the inline fast path, worker threads), the request timeout and the mapping of
model failures to TF's codes are request_core.py's, shared with the gRPC API
(grpc_server.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from torchestimator._extras import import_extra

import_extra("aiohttp.web", extra="serving", feature="the model server")  # one line if it is missing
from aiohttp import web

from torchestimator.export import ExportedModel
from torchestimator.serving.batching import BatchingParameters
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
from torchestimator.serving.metrics import API_BY_VERB
from torchestimator.serving.request_core import (  # default_num_threads re-exported: it lived here
    INLINE_BODY_BYTES,
    Parsed,
    RequestCore,
    default_num_threads,
    managers_by_name,
    parse_version,
)
from torchestimator.serving.settings import (  # the first two re-exported: they lived here
    DEFAULT_INLINE_FORWARD_MICROS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_METRICS_PATH,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_METRICS_PATH",
    "default_num_threads",
    "make_app",
    "managers_of",
    "request_core_of",
]

logger = logging.getLogger(__name__)

_PREDICT_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)", re.IGNORECASE
)
_MODEL_PATH = re.compile(r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(/metadata)?", re.IGNORECASE)
_BOTH_VERSION_AND_LABEL = re.compile(r"/v1/models/[^/:]+/versions/\d+/labels/[^/:]+.*", re.IGNORECASE)


@dataclasses.dataclass(kw_only=True)
class _ServingState:
    """Everything a handler needs, hung on the app once."""

    core: RequestCore
    max_body_bytes: int
    metrics_path: str | None


@dataclasses.dataclass(frozen=True)
class _Call:
    """What a request is, for metrics: TF's API label and the model it names."""

    api: str
    model_name: str | None


_STATE = web.AppKey("serving_state", _ServingState)
_CALL_KEY = web.RequestKey("torchestimator_serving_call", _Call)


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
    by_name = managers_by_name(managers)
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be a positive int; received {max_body_bytes!r}.")
    if metrics_path is not None and (
        not isinstance(metrics_path, str) or not metrics_path.startswith("/") or metrics_path.lower().startswith("/v1/")
    ):
        raise ValueError(
            f"metrics_path must be an absolute path outside /v1/ (TF's is {DEFAULT_METRICS_PATH}); "
            f"received {metrics_path!r}."
        )
    core = RequestCore(
        by_name,
        num_threads=num_threads,
        batching=batching,
        timeout_seconds=timeout_seconds,
        inline_forward_micros=inline_forward_micros,
    )
    # Bodies are inflated by content_coding.py, not by aiohttp's parser (where a bad gzip body breaks the connection).
    app = web.Application(client_max_size=max_body_bytes, handler_args={"auto_decompress": False})
    app[_STATE] = _ServingState(core=core, max_body_bytes=max_body_bytes, metrics_path=metrics_path)
    app.router.add_route("*", r"/{tail:[\s\S]*}", _dispatch)  # one handler: TF's paths are case-insensitive
    app.on_cleanup.append(_shutdown)
    return app


def managers_of(app: web.Application) -> dict[str, ModelManager]:
    """The app's models by name; server.py adds and removes entries when the model config file changes."""
    return app[_STATE].core.managers


def request_core_of(app: web.Application) -> RequestCore:
    """The app's request core (models, threads, batching, metrics), which the gRPC API shares (grpc_server.py)."""
    return app[_STATE].core


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
        logger.info(
            "%s %s: the client disconnected before sending the whole body (%s)", request.method, request.path, error
        )
        response = _json_response({"error": "The client disconnected before sending the whole body."}, 499)
    except Exception:  # our bug, not the client's: answer and keep serving
        logger.exception("Internal error answering %s %s", request.method, request.path)
        response = _json_response({"error": "Internal server error; see the server log."}, 500)
    call = request.get(_CALL_KEY)  # set by _route once it knows what the request is, errors included
    if call is not None and call.model_name is not None:
        state.core.observe_request(
            call.model_name, call.api, _status_code(response.status), time.perf_counter() - started, entrypoint="REST"
        )
    return response


async def _route(request: web.Request, state: _ServingState) -> web.Response:
    path, method = request.path, request.method
    if state.metrics_path is not None and path == state.metrics_path:
        if method != "GET":
            return _method_not_allowed(method, path, "GET")
        body, content_type = state.core.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})
    match = _PREDICT_PATH.fullmatch(path)
    if match:
        name, version, label, verb = match.groups()
        request[_CALL_KEY] = _Call(API_BY_VERB[verb.lower()], name)
        if method != "POST":
            return _method_not_allowed(method, path, "POST")
        return await _infer(request, state, name, parse_version(version), label, verb.lower())
    match = _MODEL_PATH.fullmatch(path)
    if match:
        name, version, label, metadata = match.groups()
        request[_CALL_KEY] = _Call("GetModelMetadata" if metadata else "GetModelStatus", name)
        if method != "GET":
            return _method_not_allowed(method, path, "GET")
        if name is None:
            raise invalid_argument("Missing model name in request.")
        if metadata:
            return _metadata(state, name, parse_version(version), label)
        return _status(state, name, parse_version(version), label)
    if _BOTH_VERSION_AND_LABEL.fullmatch(path):
        raise invalid_argument(
            f"Malformed request: {method} {path}: a request may name a version or a label, not both."
        )
    if path[:4].lower() in ("/v1/", "/v1"):
        raise invalid_argument(f"Malformed request: {method} {path}")
    raise not_found(f"Not found: {path}. The REST API lives under /v1/models/<name>.")


async def _infer(
    request: web.Request, state: _ServingState, name: str, version: int | None, label: str | None, verb: str
) -> web.Response:
    core = state.core
    model, served_version = core.servable(name, version, label)  # kept through any swap
    if request.content_length is not None and request.content_length > state.max_body_bytes:
        return _too_large(state.max_body_bytes)
    body = await request.read()
    encoding = request.headers.get("Content-Encoding")
    if encoding:  # inflating may take a while (up to the body limit): off the event loop
        body = await asyncio.get_running_loop().run_in_executor(
            core.executor, decode_content, body, encoding, state.max_body_bytes
        )
    payload = await core.run(
        model,
        name,
        served_version,
        small=len(body) <= INLINE_BODY_BYTES,
        parse=lambda: _parse(model, body, verb),
        timeout_hint="--rest_api_timeout_in_ms",
    )
    return web.Response(body=payload, status=200, content_type="application/json")


def _parse(model: ExportedModel, body: bytes, verb: str) -> Parsed:
    """Decode and check a request against the model's signature (CPU work: off the event loop unless small)."""
    try:
        return _parse_document(model, decode_body(body), verb)
    except RecursionError:  # no tensor nests deeper than 64 dimensions: any JSON that exhausts the stack is bad
        raise invalid_argument(
            "The request body nests JSON arrays or objects too deeply; tensors have at most 64 dimensions."
        ) from None


def _parse_document(model: ExportedModel, document: dict[str, Any], verb: str) -> Parsed:
    if verb == "predict":
        predict = parse_predict(document, model)

        def encode_predictions(outputs: Mapping[str, np.ndarray]) -> bytes:
            return predict_response_bytes(outputs, predict.row_format)

        return Parsed(signature_name=predict.signature_name, encode=encode_predictions, inputs=predict.inputs)
    examples = parse_examples_request(document, model, verb)
    results = classify_results if verb == "classify" else regress_results

    def encode_results(outputs: Mapping[str, np.ndarray]) -> bytes:
        return json.dumps(results(outputs, examples.count)).encode()

    return Parsed(
        signature_name=examples.signature_name, encode=encode_results, examples=examples.count, inputs=examples.inputs
    )


def _status(state: _ServingState, name: str, version: int | None, label: str | None) -> web.Response:
    return _json_response(status_document(state.core.statuses(name, version, label)), 200)


def _metadata(state: _ServingState, name: str, version: int | None, label: str | None) -> web.Response:
    model, served_version = state.core.servable(name, version, label)
    return _json_response(metadata_document(name, served_version, model), 200)


def _status_code(http_status: int) -> str:
    """TF's canonical code name for the metrics' status label."""
    return _CODE_NAMES.get(http_status, "UNKNOWN")


_CODE_NAMES = {
    200: "OK",
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


async def _shutdown(app: web.Application) -> None:
    app[_STATE].core.close()


def _method_not_allowed(method: str, path: str, allowed: str) -> web.Response:
    return _json_response(
        {"error": f"Method {method} is not allowed for {path}; use {allowed}."}, 405, headers={"Allow": allowed}
    )


def _too_large(limit: int) -> web.Response:
    return _json_response(
        {
            "error": f"Request body is larger than the server's limit of {limit} bytes; "
            "send fewer instances per request or raise the limit."
        },
        413,
    )


def _json_response(document: Any, status: int, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(document), status=status, content_type="application/json", headers=headers)
