"""The one error type the REST handlers raise, carrying TF Serving's canonical code and its HTTP status.

    ServingError(code, message)
      code: INVALID_ARGUMENT -> 400, NOT_FOUND -> 404, RESOURCE_EXHAUSTED -> 429,
            UNIMPLEMENTED -> 501, ... (model_servers/http_server.cc)

Handlers turn it into ``{"error": message}`` with that status. Anything else
escaping a handler is our bug: it becomes a logged 500, never a crash.
"""

from __future__ import annotations

from torchestimator.errors import HTTP_STATUS, GrpcListenError, ServingError

__all__ = ["HTTP_STATUS", "GrpcListenError", "ServingError"]


def invalid_argument(message: str) -> ServingError:
    return ServingError("INVALID_ARGUMENT", message)


def not_found(message: str) -> ServingError:
    return ServingError("NOT_FOUND", message)
