"""The one error type the REST handlers raise, carrying TF Serving's canonical code and its HTTP status.

    ServingError(code, message)
      code: INVALID_ARGUMENT -> 400, NOT_FOUND -> 404, RESOURCE_EXHAUSTED -> 429,
            UNIMPLEMENTED -> 501, ... (model_servers/http_server.cc)

Handlers turn it into ``{"error": message}`` with that status. Anything else
escaping a handler is our bug: it becomes a logged 500, never a crash.
"""

from __future__ import annotations

__all__ = ["HTTP_STATUS", "ServingError"]

HTTP_STATUS = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}


class ServingError(Exception):
    """A request the server answers with an error: ``code`` is TF's canonical status name."""

    def __init__(self, code: str, message: str) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"Unknown status code {code!r}; expected one of {sorted(HTTP_STATUS)}.")
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]


def invalid_argument(message: str) -> ServingError:
    return ServingError("INVALID_ARGUMENT", message)


def not_found(message: str) -> ServingError:
    return ServingError("NOT_FOUND", message)
