"""The HTTP connection layer: aiohttp's request handler, with its own error answers in TF Serving's JSON shape.

Some answers never come from app.py's handler: a request line, header or
chunk that aiohttp's parser refuses is answered from
``RequestHandler.handle_error`` in plain text (with a traceback in the log),
and aiohttp's router and Expect handling raise their own plain-text
HTTPExceptions (404 for ``OPTIONS *``, 417 for an unknown Expect, which is a
500 when the header holds undecodable bytes). ``ServingRunner`` runs an
application with a handler whose error answers are ``{"error": ...}`` JSON
like every other answer, logged in one line. A malformed message loses the
framing of the connection, so those answers still close it, as HTTP allows
(RFC 9112 9.6); well-framed bad requests keep the connection open.

Used by server.py (serve, start) and by anything else that puts the app on a
socket; aiohttp's test client keeps its own runner, so it shows app.py's
answers only.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from torchestimator._extras import import_extra

import_extra("aiohttp.web", extra="serving", feature="the model server")  # one line if it is missing
from aiohttp import web  # noqa: E402  (aiohttp is there: import_extra said so)
from aiohttp.web_protocol import RequestHandler  # noqa: E402

__all__ = ["ServingRunner", "error_body"]

logger = logging.getLogger(__name__)

_MAX_DETAIL_CHARS = 300  # the parser quotes the client's bytes; a log line or an answer needs only their start


def error_body(message: str) -> str:
    """TF Serving's error document, as text."""
    return json.dumps({"error": message})


class ServingRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer protocol errors in JSON (see the module docstring)."""

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # the app's own server: its handler, request factory and options
        return _JsonErrorServer(
            _json_http_errors(plain.request_handler),
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **plain._kwargs,
        )


def _json_http_errors(handle: Callable[[Any], Awaitable[web.StreamResponse]]) -> Callable[..., Any]:
    """The application's request handler with aiohttp's own HTTPExceptions answered in JSON."""

    async def handle_json(request: Any) -> web.StreamResponse:
        expect = request.headers.get("Expect")
        if expect is not None and request.version >= (1, 1) and expect.lower() != "100-continue":
            return _json_answer(417, f"Unsupported Expect header {expect!r}; only 100-continue is supported.")
        try:
            return await handle(request)
        except web.HTTPException as error:
            if error.status < 400:
                raise
            answer = _json_answer(error.status, f"{error.status} {error.reason}: {request.method} {request.path!r}")
            if "Allow" in error.headers:
                answer.headers["Allow"] = error.headers["Allow"]
            return answer

    return handle_json


def _json_answer(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=error_body(message), content_type="application/json")


class _JsonErrorServer(web.Server):
    """Makes one ``_JsonErrorRequestHandler`` per connection, with the options aiohttp's Server was given."""

    def __call__(self) -> RequestHandler:
        return _JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class _JsonErrorRequestHandler(RequestHandler):
    """aiohttp's connection handler with JSON error answers and one log line per client error."""

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        # Called for parser errors (400, before any handler ran), a handler's TimeoutError (504) and an
        # exception escaping the app (500; app.py catches its own, so this is a bug of ours or of aiohttp).
        detail = _detail(exc, message, status)
        if status >= 500:
            logger.error("Error answering a request from %s: %s", request.remote, detail, exc_info=exc)
        else:
            logger.info("Refused a malformed request from %s: %d %s", request.remote, status, detail)
        if request.writer.output_size > 0:  # part of an answer is out: no second answer can follow on this socket
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        if status >= 500:
            text = "Internal server error; see the server log."
        else:
            text = (
                f"Malformed HTTP request: {detail}. Expected an HTTP/1.x request such as POST "
                "/v1/models/<name>:predict with a JSON body; the connection is closed."
            )
        response = _json_answer(status, text)
        response.force_close()  # the parser lost the message's framing: nothing after it can be read
        return response


def _detail(exc: BaseException | None, message: str | None, status: int) -> str:
    text = getattr(exc, "message", None) or message or (str(exc) if exc is not None else "")
    text = " ".join(str(text).split()).rstrip(" ^.") or http.HTTPStatus(status).phrase  # ^: aiohttp's column marker
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 3] + "..."
