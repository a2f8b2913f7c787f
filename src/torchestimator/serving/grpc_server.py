"""TF Serving's gRPC API (PredictionService, ModelService.GetModelStatus) with grpcio, beside the REST API.

    server = GrpcServer(request_core_of(app), "127.0.0.1", 8500)   # the REST app's core: same models, threads,
    port = await server.start()                                      # batching and metrics
    ...
    await server.stop(grace=5)

    /tensorflow.serving.PredictionService/Predict | Classify | Regress | GetModelMetadata
    /tensorflow.serving.ModelService/GetModelStatus

What belongs here: the grpc.aio server, its method table and status codes, the
per-call metrics (``entrypoint="GRPC"``). What does not: reading the messages
(grpc_requests.py) and where a request runs (request_core.py, shared with
REST, so batching, the inline fast path, version policies and labels, errors
and metrics are the same on both).

Why these choices: the methods are registered with
``grpc.method_handlers_generic_handler`` on raw bytes (no protoc, no generated
stubs; the messages are protos.py's, parsed where request_core runs them); the
server is grpc.aio on the REST server's own event loop (uvloop included;
checked with grpcio 1.85), so both transports share one loop, one worker pool
and one batch scheduler, and stop together. grpcio's threaded server
(``grpc.server``, its workers calling the core) was measured too and was no
faster on 2 cores (~400-470 us of CPU per small-MLP call against grpc.aio's
~350-390): torch releases the GIL at every op and grpcio's polling thread and
workers take it each time (docs/benchmarks.md). The largest request is the REST
body limit (--max_body_bytes, 64 MiB by default; grpcio's own default is 4 MB,
TF Serving raises it to 2 GiB). SO_REUSEPORT is off, so a port another server
holds is an error at start, not two servers sharing it. A call's deadline is
the client's; the server's request timeout (--rest_api_timeout_in_ms) bounds
gRPC requests too. MultiInference and HandleReloadConfigRequest answer
UNIMPLEMENTED (grpcio's answer for a method not in the table).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from torchestimator._extras import import_extra

import_extra("grpc", extra="serving", feature="the gRPC API (serve --port)")  # one line naming the extra if missing
import grpc.aio

from torchestimator.serving import grpc_requests
from torchestimator.serving.errors import GrpcListenError, ServingError
from torchestimator.serving.protos import MODEL_SERVICE, PREDICTION_SERVICE
from torchestimator.serving.request_core import INLINE_BODY_BYTES, RequestCore
from torchestimator.serving.settings import DEFAULT_MAX_BODY_BYTES

__all__ = ["GrpcServer"]

logger = logging.getLogger(__name__)

_TIMEOUT_HINT = "the server's request timeout, --rest_api_timeout_in_ms, which bounds gRPC requests too"


class GrpcServer:
    """TF Serving's gRPC services over a RequestCore, on the running event loop."""

    def __init__(
        self, core: RequestCore, host: str, port: int, *, max_message_bytes: int = DEFAULT_MAX_BODY_BYTES
    ) -> None:
        self._core = core
        self.host, self.port = host, port
        self._max_message_bytes = max_message_bytes
        self._server: Any = None

    async def start(self) -> int:
        """Listens and returns the bound port (``port=0``: a free one); OSError when the address cannot be bound."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers(self._handlers())
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as error:  # grpcio says only "Failed to bind to address ..."
            raise GrpcListenError(
                f"cannot listen for gRPC on {address}: the port is in use (another server, or an "
                f"earlier serve still running) or {self.host} is not an address of this machine "
                f"({error})"
            ) from None
        await server.start()
        self._server, self.port = server, bound
        logger.info("Serving gRPC (tensorflow.serving.PredictionService, ModelService) at %s:%d", self.host, bound)
        return bound

    async def stop(self, grace: float | None = 5.0) -> None:
        """Stops accepting calls; calls in flight get ``grace`` seconds to finish."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    def _handlers(self) -> tuple[Any, ...]:
        def unary(api: str, answer: Callable[..., Awaitable[bytes]]) -> Any:
            return grpc.unary_unary_rpc_method_handler(self._call(api, answer))  # bytes in, bytes out

        prediction = grpc.method_handlers_generic_handler(
            PREDICTION_SERVICE,
            {
                "Predict": unary("Predict", self._predict),
                "Classify": unary("Classify", lambda *call: self._examples(*call, method="classify")),
                "Regress": unary("Regress", lambda *call: self._examples(*call, method="regress")),
                "GetModelMetadata": unary("GetModelMetadata", self._metadata),
            },
        )
        model = grpc.method_handlers_generic_handler(
            MODEL_SERVICE,
            {
                "GetModelStatus": unary("GetModelStatus", self._status),
            },
        )
        return prediction, model

    def _call(self, api: str, answer: Callable[..., Awaitable[bytes]]) -> Callable[..., Awaitable[bytes]]:
        """The handler: which model, answer, errors as TF's status codes, the request's metrics."""

        async def handle(data: bytes, context: Any) -> bytes:
            started = time.perf_counter()
            name: list[str] = []
            code, details = "OK", ""
            try:
                target = grpc_requests.request_target(data)
                name.append(target[0])
                return await answer(data, *target)
            except asyncio.CancelledError:  # the client went away or its deadline passed: grpcio answers it
                code = "CANCELLED"
                raise
            except ServingError as error:
                code, details = error.code, error.message
            except Exception:  # our bug, not the client's: answer and keep serving
                logger.exception("Internal error answering gRPC %s", api)
                code, details = "INTERNAL", "Internal server error; see the server log."
            finally:
                if name:
                    self._core.observe_request(name[0], api, code, time.perf_counter() - started, entrypoint="GRPC")
            await context.abort(getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN), details)
            raise AssertionError("context.abort returned")  # it raises; this line is never reached

        return handle

    async def _predict(self, data: bytes, name: str, version: int | None, label: str | None) -> bytes:
        model, served = self._core.servable(name, version, label)
        return await self._core.run(
            model,
            name,
            served,
            small=len(data) <= INLINE_BODY_BYTES,
            parse=lambda: grpc_requests.parse_predict(data, model, name, served),
            timeout_hint=_TIMEOUT_HINT,
        )

    async def _examples(self, data: bytes, name: str, version: int | None, label: str | None, *, method: str) -> bytes:
        model, served = self._core.servable(name, version, label)
        return await self._core.run(
            model,
            name,
            served,
            small=len(data) <= INLINE_BODY_BYTES,
            parse=lambda: grpc_requests.parse_examples(data, model, name, served, method),
            timeout_hint=_TIMEOUT_HINT,
        )

    async def _metadata(self, data: bytes, name: str, version: int | None, label: str | None) -> bytes:
        model, served = self._core.servable(name, version, label)
        return grpc_requests.metadata_response(data, model, name, served)

    async def _status(self, data: bytes, name: str, version: int | None, label: str | None) -> bytes:
        return grpc_requests.status_response(self._core.statuses(name, version, label))
