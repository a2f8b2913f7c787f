"""A fault proxy of our own: HTTP/1.1 on 127.0.0.1 between a client and a real server (moto's S3, the GCS emulator,
Azurite), with faults switched on by the test.

Each request the client sends is read whole (head and body, ``Content-Length`` or chunked), then either
forwarded on a fresh connection to the server, the answer framed and sent back, or met with a fault:

- ``RESET``: the connection is closed with an RST (SO_LINGER 0), nothing answered;
- ``RESET_MID_BODY``: the first half of the request body is read, then an RST;
- ``STALL``: the request's head is read and never answered, not even with ``100 Continue`` (the connection
  stays open until the proxy stops or ``release_stalls()``); ``STALL_MID_BODY``: half of the body is read,
  then nothing more;
- ``SLOW_DOWN`` / ``INTERNAL_ERROR``: 503 (throttling) / 500, with the error body the store sends (``dialect``:
  S3's XML SlowDown / InternalError, GCS's JSON, Azure's XML ServerBusy / InternalError and x-ms-error-code);
- ``ACCESS_DENIED_KEY``: 403 (bad credentials: S3's InvalidAccessKeyId, Azure's AuthenticationFailed);
- ``CUT_BODY``: forwarded, then the answer's body cut at half and the connection closed.

``proxy.inject(fault, times=K, when=predicate, after=N)`` arms one rule: the K requests that match
``predicate`` (a function of a ``Request``), after skipping the first N matches, get ``fault``. Rules are
tried in the order armed; ``proxy.clear()`` disarms them. ``proxy.log`` lists every request seen with the
fault it got. Nothing here sleeps: the threads wait on sockets with short timeouts and on the stop event,
and ``stop()`` (or leaving the ``with``) closes every socket and joins every thread within seconds.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

PASS = "pass"
RESET = "reset"
RESET_MID_BODY = "reset_mid_body"
STALL = "stall"
STALL_MID_BODY = "stall_mid_body"
SLOW_DOWN = "slow_down"
INTERNAL_ERROR = "internal_error"
ACCESS_DENIED_KEY = "invalid_access_key"
CUT_BODY = "cut_body"

_ERRORS = {  # status, reason, the error code per dialect, message
    SLOW_DOWN: (
        503,
        "Slow Down",
        {"s3": "SlowDown", "gcs": "backendError", "azure": "ServerBusy"},
        "Please reduce your request rate.",
    ),
    INTERNAL_ERROR: (
        500,
        "Internal Server Error",
        {"s3": "InternalError", "gcs": "internalError", "azure": "InternalError"},
        "We encountered an internal error. Please try again.",
    ),
    ACCESS_DENIED_KEY: (
        403,
        "Forbidden",
        {"s3": "InvalidAccessKeyId", "gcs": "forbidden", "azure": "AuthenticationFailed"},
        "The access key you provided does not exist in our records.",
    ),
}
DIALECTS = ("s3", "gcs", "azure")
_POLL_SECONDS = 0.2
_LONGEST_WAIT_SECONDS = 120.0  # no thread of the proxy outlives a test by more than this, whatever happens


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body_bytes: int

    @property
    def is_part_upload(self) -> bool:
        return self.method == "PUT" and "partNumber=" in self.target and "uploadId=" in self.target

    @property
    def is_write(self) -> bool:
        return self.method in ("PUT", "POST")


@dataclasses.dataclass
class _Rule:
    fault: str
    times: int
    when: Callable[[Request], bool]
    after: int


class _Closed(Exception):
    """The peer closed, or the proxy is stopping."""


class FaultProxy:
    """``with FaultProxy("http://127.0.0.1:5000") as proxy: ... proxy.url ...``; ``dialect`` ("s3", "gcs",
    "azure"): whose error bodies the faults answer with."""

    def __init__(self, upstream: str, *, dialect: str = "s3") -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {DIALECTS}; received {dialect!r}")
        self.dialect = dialect
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname, parts.port)
        self._stop = threading.Event()
        self._released = threading.Condition()
        self._release_count = 0  # release_stalls() lets go of the requests stalled before it, not later ones
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.log: list[tuple[Request, str]] = []
        self.bytes_per_second: float | None = None
        """When set, each request body is held as long as sending it at this rate takes, per connection (as
        one TCP stream to a distant store is slower than the link): what parallel parts gain shows."""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_POLL_SECONDS)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- what the tests call -----------------------------------------------------------------------------

    def start(self) -> None:
        self._spawn(self._accept_loop)

    def inject(
        self, fault: str, *, times: int = 1, when: Callable[[Request], bool] | None = None, after: int = 0
    ) -> None:
        with self._lock:
            self._rules.append(_Rule(fault, times, when or (lambda request: True), after))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def release_stalls(self) -> None:
        with self._released:
            self._release_count += 1
            self._released.notify_all()

    def faults_applied(self, fault: str) -> int:
        with self._lock:
            return sum(1 for _, applied in self.log if applied == fault)

    def stop(self) -> None:
        self._stop.set()
        self.release_stalls()
        with self._lock:
            sockets = list(self._sockets)
        for sock in [self._listener, *sockets]:
            _close(sock)
        deadline = time.monotonic() + 10
        for thread in list(self._threads):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- the proxy -----------------------------------------------------------------------------------------

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="fault-proxy")
        self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> socket.socket:
        sock.settimeout(_POLL_SECONDS)
        with self._lock:
            self._sockets.add(sock)
        return sock

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        _close(sock)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, self._track(client))

    def _choose(self, request: Request) -> str:
        with self._lock:
            fault = PASS
            for rule in self._rules:
                if rule.times > 0 and rule.when(request):
                    if rule.after > 0:
                        rule.after -= 1
                        continue
                    rule.times -= 1
                    fault = rule.fault
                    break
            self.log.append((request, fault))
            return fault

    def _serve(self, client: socket.socket) -> None:
        reader = _Reader(client, self._stop)
        try:
            while not self._stop.is_set():
                head = reader.until(b"\r\n\r\n", limit=64 * 1024, eof_ok=True)
                if head is None:
                    return
                method, target, headers = _parse_head(head)
                size = int(headers.get("content-length", 0) or 0)
                fault = self._choose(Request(method, target, headers, size))
                expects = headers.get("expect", "").lower() == "100-continue"
                if fault == STALL:  # not even a 100 Continue
                    self._wait_for_release()
                    return
                if fault in _ERRORS:
                    self._send(
                        client,
                        _error_response(*_ERRORS[fault], target, dialect=self.dialect, with_body=method != "HEAD"),
                    )
                    if expects:
                        return  # answered before the body was sent: the connection cannot be reused
                    reader.body(headers)
                    continue
                if expects:
                    self._send(client, b"HTTP/1.1 100 Continue\r\n\r\n")
                    head = _without_expect(head)
                if fault in (RESET_MID_BODY, STALL_MID_BODY):
                    reader.exactly(size // 2)
                    if fault == STALL_MID_BODY:
                        self._wait_for_release()
                    _reset(client)
                    return
                body = reader.body(headers)
                if fault == RESET:
                    _reset(client)
                    return
                if self.bytes_per_second:  # this connection's transfer time, each connection on its own
                    self._stop.wait(len(body) / self.bytes_per_second)
                response, body_start, body_length = self._forward(head + body, method)
                if fault == CUT_BODY and body_length:
                    self._send(client, response[: body_start + body_length // 2])
                    return  # closed with half the body sent: the client sees a payload cut short
                self._send(client, response)
                if _wants_close(response[:body_start]):
                    return
        except (_Closed, OSError):
            return
        finally:
            self._untrack(client)

    def _send(self, sock: socket.socket, data: bytes) -> None:
        """``sendall`` through the sockets' poll timeout: a slow reader is waited for, a stopping proxy is not."""
        view, deadline = memoryview(data), time.monotonic() + _LONGEST_WAIT_SECONDS
        while view.nbytes:
            if self._stop.is_set() or time.monotonic() > deadline:
                raise _Closed()
            try:
                view = view[sock.send(view) :]
            except TimeoutError:
                continue

    def _wait_for_release(self) -> None:
        deadline = time.monotonic() + _LONGEST_WAIT_SECONDS
        with self._released:
            stalled_at = self._release_count
            self._released.wait_for(
                lambda: self._release_count != stalled_at or self._stop.is_set(),
                timeout=max(0.0, deadline - time.monotonic()),
            )

    def _forward(self, request: bytes, method: str) -> tuple[bytes, int, int]:
        """Send one request upstream on a fresh connection; the whole answer, where its body starts, its size."""
        upstream = self._track(socket.create_connection(self._upstream, timeout=_POLL_SECONDS * 10))
        try:
            self._send(upstream, request)
            reader = _Reader(upstream, self._stop)
            head = reader.until(b"\r\n\r\n", limit=64 * 1024, eof_ok=False)
            status = int(head.split(b" ", 2)[1])
            headers = _parse_head(head)[2]
            if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                body = b""
            elif "content-length" in headers or "chunked" in headers.get("transfer-encoding", ""):
                body = reader.body(headers)
            else:
                body = reader.rest()
            return head + body, len(head), len(body)
        finally:
            self._untrack(upstream)


class _Reader:
    """Buffered reads from a socket with a poll timeout, giving up when the proxy stops."""

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        self._sock, self._stop, self._buffer = sock, stop, b""

    def _fill(self) -> bool:
        deadline = time.monotonic() + _LONGEST_WAIT_SECONDS
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not data:
                return False
            self._buffer += data
            return True
        raise _Closed()

    def until(self, marker: bytes, *, limit: int, eof_ok: bool) -> bytes | None:
        while marker not in self._buffer:
            if len(self._buffer) > limit or not self._fill():
                if eof_ok and not self._buffer:
                    return None
                raise _Closed()
        end = self._buffer.index(marker) + len(marker)
        data, self._buffer = self._buffer[:end], self._buffer[end:]
        return data

    def exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not self._fill():
                raise _Closed()
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def rest(self) -> bytes:
        while self._fill():
            pass
        data, self._buffer = self._buffer, b""
        return data

    def body(self, headers: dict[str, str]) -> bytes:
        """A message body as sent (chunked framing kept), by Content-Length or chunked transfer coding."""
        if "chunked" not in headers.get("transfer-encoding", ""):
            return self.exactly(int(headers.get("content-length", 0) or 0))
        parts = []
        while True:
            size_line = self.until(b"\r\n", limit=1024, eof_ok=False)
            parts.append(size_line)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                trailer = self.until(b"\r\n", limit=64 * 1024, eof_ok=False)
                parts.append(trailer)
                while trailer != b"\r\n":
                    trailer = self.until(b"\r\n", limit=64 * 1024, eof_ok=False)
                    parts.append(trailer)
                return b"".join(parts)
            parts.append(self.exactly(size + 2))


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return first[0], first[1] if len(first) > 1 else "", headers


def _without_expect(head: bytes) -> bytes:
    """The head forwarded upstream: the proxy answered ``100 Continue`` itself."""
    lines = head.split(b"\r\n")
    return b"\r\n".join(line for line in lines if not line.lower().startswith(b"expect:"))


def _wants_close(head: bytes) -> bool:
    return b"connection: close" in head.lower()


def _error_response(
    status: int, reason: str, codes: dict[str, str], message: str, target: str, *, dialect: str, with_body: bool
) -> bytes:
    code = codes[dialect]
    if dialect == "gcs":  # the JSON API's error object
        body = json.dumps(
            {"error": {"code": status, "message": message, "errors": [{"reason": code, "message": message}]}}
        ).encode()
        headers = "Content-Type: application/json; charset=UTF-8\r\n"
    elif dialect == "azure":
        body = (
            f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}\n'
            "RequestId:FAULTPROXY</Message></Error>"
        ).encode()
        headers = f"Content-Type: application/xml\r\nx-ms-error-code: {code}\r\nx-ms-request-id: FAULTPROXY\r\n"
    else:
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<Resource>{target.split('?', 1)[0]}</Resource><RequestId>FAULTPROXY</RequestId></Error>"
        ).encode()
        headers = "Content-Type: application/xml\r\nx-amz-request-id: FAULTPROXY\r\n"
    head = f"HTTP/1.1 {status} {reason}\r\n{headers}Content-Length: {len(body)}\r\n\r\n".encode()
    return head + body if with_body else head  # a HEAD's answer has no body, its Content-Length notwithstanding


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
