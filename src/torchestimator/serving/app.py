"""The aiohttp application: TF Serving's REST paths, dispatch, error mapping, and ``serve``.

Paths follow SRV ``model_servers/http_rest_api_util.cc`` (case-insensitive):

    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]            status
    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata   signature defs
    POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict    predict

Parsing, inference and encoding run in a thread pool, so the event loop only
moves bytes. Every answer is JSON; a ServingError becomes ``{"error": ...}``
with its HTTP status, anything else a logged 500. Which version is served is
the ModelManager's business (manager.py); JSON shapes are json_tensor.py's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from aiohttp import web

from torchestimator.export import ExportedModel
from torchestimator.serving.errors import ServingError, invalid_argument, not_found
from torchestimator.serving.json_tensor import (
    PredictRequest,
    decode_body,
    metadata_document,
    parse_predict,
    predict_response,
    status_document,
)
from torchestimator.serving.manager import ModelManager

__all__ = ["DEFAULT_MAX_BODY_BYTES", "add_polling", "make_app", "serve"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024

_PREDICT_PATH = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)",
                           re.IGNORECASE)
_MODEL_PATH = re.compile(r"/v1/models(?:/([^/:]+))?(?:/versions/(\d+)|/labels/([^/:]+))?(/metadata)?",
                         re.IGNORECASE)

_MANAGERS = web.AppKey("managers", dict)
_EXECUTOR = web.AppKey("executor", concurrent.futures.ThreadPoolExecutor)
_MAX_BODY = web.AppKey("max_body_bytes", int)


def make_app(
    managers: ModelManager | Iterable[ModelManager] | Mapping[str, ModelManager],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    num_threads: int | None = None,
) -> web.Application:
    """An application answering TF Serving's REST API for the given models (polling is added separately)."""
    by_name = _managers_by_name(managers)
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be a positive int; received {max_body_bytes!r}.")
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads <= 0):
        raise ValueError(f"num_threads must be a positive int or None (default); received {num_threads!r}.")
    app = web.Application(client_max_size=max_body_bytes)
    app[_MANAGERS] = by_name
    app[_MAX_BODY] = max_body_bytes
    app[_EXECUTOR] = concurrent.futures.ThreadPoolExecutor(
        max_workers=num_threads or min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="torchestimator-serving")
    app.router.add_route("*", "/{tail:.*}", _dispatch)  # one handler: TF's paths are case-insensitive
    app.on_cleanup.append(_shutdown_executor)
    return app


def add_polling(app: web.Application, file_system_poll_wait_seconds: float) -> None:
    """Polls every manager for new versions while the app runs (0 or less: never, beyond the caller's first poll)."""
    if file_system_poll_wait_seconds <= 0:
        return

    async def polling(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_poll_forever(list(app[_MANAGERS].values()), file_system_poll_wait_seconds))
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    app.cleanup_ctx.append(polling)


def serve(
    model_name: str,
    model_base_path: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8501,
    file_system_poll_wait_seconds: float = 1,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    num_threads: int | None = None,
) -> None:
    """Serves the latest version under ``model_base_path`` as ``model_name`` until interrupted (blocking)."""
    manager = ModelManager(model_name, model_base_path)
    if not manager.poll():
        logger.warning("%s: no version could be loaded from %s yet; waiting for one (status: %s)",
                       model_name, manager.base_path, manager.statuses())
    app = make_app(manager, max_body_bytes=max_body_bytes, num_threads=num_threads)
    add_polling(app, file_system_poll_wait_seconds)
    logger.info("Serving %s at http://%s:%d/v1/models/%s", model_name, host, port, model_name)
    web.run_app(app, host=host, port=port, print=None)


async def _dispatch(request: web.Request) -> web.Response:
    try:
        return await _route(request)
    except ServingError as error:
        return _json_response({"error": error.message}, error.http_status)
    except web.HTTPRequestEntityTooLarge:
        return _too_large(request.app[_MAX_BODY])
    except Exception:  # our bug, not the client's: answer and keep serving
        logger.exception("Internal error answering %s %s", request.method, request.path)
        return _json_response({"error": "Internal server error; see the server log."}, 500)


async def _route(request: web.Request) -> web.Response:
    path, method = request.path, request.method
    match = _PREDICT_PATH.fullmatch(path)
    if match:
        if method != "POST":
            return _method_not_allowed(method, path, "POST")
        name, version, label, verb = match.groups()
        return await _predict(request, name, _version(version), label, verb.lower())
    match = _MODEL_PATH.fullmatch(path)
    if match:
        if method != "GET":
            return _method_not_allowed(method, path, "GET")
        name, version, label, metadata = match.groups()
        if name is None:
            raise invalid_argument("Missing model name in request.")
        if metadata:
            return _metadata(request, name, _version(version), label)
        return _status(request, name, _version(version), label)
    if path[:4].lower() in ("/v1/", "/v1"):
        raise invalid_argument(f"Malformed request: {method} {path}")
    raise not_found(f"Not found: {path}. The REST API lives under /v1/models/<name>.")


async def _predict(request: web.Request, name: str, version: int | None, label: str | None, verb: str) -> web.Response:
    model, _ = _servable(request, name, version, label)
    if verb != "predict":
        raise ServingError("UNIMPLEMENTED", f":{verb} is not implemented yet; use :predict with the same model.")
    limit = request.app[_MAX_BODY]
    if request.content_length is not None and request.content_length > limit:
        return _too_large(limit)
    body = await request.read()
    loop = asyncio.get_running_loop()
    payload = await loop.run_in_executor(request.app[_EXECUTOR], _predict_sync, model, body)
    return web.Response(body=payload, status=200, content_type="application/json")


def _predict_sync(model: ExportedModel, body: bytes) -> bytes:
    """Parse, run and encode in a worker thread: all the CPU work of a request."""
    parsed: PredictRequest = parse_predict(decode_body(body), model)
    try:
        outputs = model(parsed.inputs, signature_name=parsed.signature_name)
    except (ValueError, TypeError) as error:  # the loader's checks: they name the input and the mismatch
        raise invalid_argument(str(error)) from error
    except (RuntimeError, IndexError) as error:  # e.g. an index out of range inside the program
        raise invalid_argument(f"The model failed on these inputs: {error}") from error
    return json.dumps(predict_response(outputs, parsed.row_format)).encode()


def _status(request: web.Request, name: str, version: int | None, label: str | None) -> web.Response:
    manager = request.app[_MANAGERS].get(name)
    statuses = [] if manager is None else manager.statuses()
    if label is not None:
        raise not_found(f"Unrecognized servable version label: {label} (model {name} has no version labels).")
    if not statuses:
        raise not_found(f"Could not find any versions of model {name}")
    if version is not None:
        statuses = [status for status in statuses if status.version == version]
        if not statuses:
            raise not_found(f"Could not find version {version} of model {name}")
    return _json_response(status_document(statuses), 200)


def _metadata(request: web.Request, name: str, version: int | None, label: str | None) -> web.Response:
    model, served_version = _servable(request, name, version, label)
    return _json_response(metadata_document(name, served_version, model), 200)


def _servable(request: web.Request, name: str, version: int | None, label: str | None) -> tuple[ExportedModel, int]:
    """The loaded model a request names (latest when no version is given), else a NOT_FOUND error."""
    if label is not None:
        raise not_found(f"Unrecognized servable version label: {label} (model {name} has no version labels).")
    manager = request.app[_MANAGERS].get(name)
    model = None if manager is None else manager.get(version)
    if model is None:
        spec = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        known = sorted(request.app[_MANAGERS])
        raise not_found(f"Servable not found for request: {spec} (served models: {known})")
    return model, model.version if model.version is not None else manager.served_version


def _version(text: str | None) -> int | None:
    return None if text is None else int(text)


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


async def _poll_forever(managers: list[ModelManager], seconds: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(seconds)
        for manager in managers:
            try:
                await loop.run_in_executor(None, manager.poll)
            except Exception:  # a broken file system must not stop polling for good
                logger.exception("%s: polling %s failed", manager.name, manager.base_path)


async def _shutdown_executor(app: web.Application) -> None:
    app[_EXECUTOR].shutdown(wait=False, cancel_futures=True)


def _method_not_allowed(method: str, path: str, allowed: str) -> web.Response:
    return _json_response({"error": f"Method {method} is not allowed for {path}; use {allowed}."}, 405,
                          headers={"Allow": allowed})


def _too_large(limit: int) -> web.Response:
    return _json_response({"error": f"Request body is larger than the server's limit of {limit} bytes; "
                                    "send fewer instances per request or raise the limit."}, 413)


def _json_response(document: Any, status: int, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(document), status=status, content_type="application/json", headers=headers)
