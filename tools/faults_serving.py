"""Hostile clients against the model server, on raw sockets, and version hot swaps under load.

A model is exported (benchmarks/fuzz_serving.py's ``half``: y = 0.5 x + 2) and
served by ``torchestimator.serving.start`` on 127.0.0.1. Then, bounded in time:

* every hand-written hostile request (``hostile_cases``: malformed request
  lines, bad methods, odd and huge headers, bad Content-Length, chunked
  garbage, gzip lies, deep JSON, huge integers, NaN, invalid UTF-8, ...), each
  on its own connection, followed by a valid :predict on the same socket when
  the request was well framed (HTTP keeps such a connection open);
* pipelined requests, a client leaving mid-body, slowloris connections that
  never finish their headers while a normal client is answered;
* random requests built from hostile parts (``random_request``) until
  ``--seconds`` is spent;
* ``--swap-seconds`` of :predict from a client thread while versions are
  added, broken versions dropped in, and old versions removed.

Every answer must be below 500; every error answer JSON ``{"error": <string>}``;
a connection the server did not close must answer the next request; no
request may fail during hot swaps; the server logs no traceback.

Run:  python tools/faults_serving.py [--seconds 60] [--swap-seconds 30] [--seed 0]
Last line:  faults_serving requests=N status_5xx=0 non_json_errors=0 reset_keepalive=0 hot_swap_failures=0 tracebacks=0
Exit status 1 when any count but requests is not 0 (each problem is printed first).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import http.client
import importlib.util
import json
import logging
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "half"
GOOD_INSTANCES = [1.0, 2.0, 5.0]


# -- a raw HTTP/1.1 client -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answer:
    """One HTTP response as read off the socket."""

    version: str
    status: int
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes

    @property
    def closes(self) -> bool:
        """Whether the server said it closes the connection after this answer."""
        connection = self.headers.get("connection", "").lower()
        return connection == "close" or (self.version != "HTTP/1.1" and connection != "keep-alive")


class RawConnection:
    """A socket to the server: send any bytes, read whole answers (Content-Length framed, as aiohttp sends them)."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._buffer = b""

    def send(self, data: bytes) -> bool:
        """False when the server has already closed or reset the connection."""
        try:
            self._socket.sendall(data)
            return True
        except OSError:
            return False

    def read_answer(self, head: bool = False) -> Answer | None:
        """The next final answer (``head``: to a HEAD request, so no body), or None if the connection ends first.

        Interim answers (100 Continue to ``Expect: 100-continue``) are skipped.
        """
        answer = self._read_one(head)
        while answer is not None and 100 <= answer.status < 200 and answer.status != 101:
            answer = self._read_one(head)
        return answer

    def _read_one(self, head: bool) -> Answer | None:
        try:
            while b"\r\n\r\n" not in self._buffer:
                if not self._receive():
                    return None
            block, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
            status_line, *lines = block.decode("latin-1").split("\r\n")
            version, status = status_line.split(" ", 2)[:2]
            headers = {}
            for line in lines:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            interim = 100 <= int(status) < 200
            length = 0 if head or interim else int(headers.get("content-length", "0"))
            while len(self._buffer) < length:
                if not self._receive():
                    return None
            body, self._buffer = self._buffer[:length], self._buffer[length:]
            return Answer(version, int(status), headers, body)
        except (OSError, ValueError):  # reset, timeout, or an answer that is not HTTP (reported as no answer)
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.close()

    def _receive(self) -> bool:
        chunk = self._socket.recv(65536)
        self._buffer += chunk
        return bool(chunk)


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
    version: str = "HTTP/1.1",
    content_length: bool = True,
) -> bytes:
    """A request's bytes; Content-Length is the body's unless ``content_length`` is False or headers set it."""
    lines = [f"{method} {path} {version}".rstrip(), "Host: 127.0.0.1"]
    names = {name.lower() for name, _ in headers}
    if content_length and body and "content-length" not in names and "transfer-encoding" not in names:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in headers]
    return "\r\n".join(lines).encode("utf-8", "surrogateescape") + b"\r\n\r\n" + body


def predict_path(model_name: str) -> str:
    return f"/v1/models/{model_name}:predict"


def good_request(path: str, body: bytes) -> bytes:
    return request("POST", path, body, [("Content-Type", "application/json")])


# -- the hostile requests --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """A hostile request; ``framed``: HTTP can tell where it ends, so the connection must stay usable."""

    name: str
    data: bytes
    framed: bool
    head: bool = False


def hostile_cases(model_name: str, good_body: bytes) -> list[Case]:
    """Hand-written hostile requests against the model's :predict; ``good_body`` is a valid :predict body."""
    path = predict_path(model_name)

    def post(body: bytes, *headers: tuple[str, str]) -> bytes:
        return request("POST", path, body, headers)

    deep = 1000
    cases = [
        # Framed: the server must answer a JSON 4xx and keep the connection open.
        Case("GET on :predict", request("GET", path), True),
        Case("HEAD on :predict", request("HEAD", path), True, head=True),
        Case("percent garbage in the path", request("GET", "/v1/models/%zz%00"), True),
        Case("absolute-form URL", request("GET", "http://127.0.0.1/v1/models/half"), True),
        Case("asterisk URL", request("OPTIONS", "*"), True),
        Case("path of 8000 bytes", request("GET", "/" + "a" * 8000), True),
        Case(
            "version beyond int64",
            request("POST", f"/v1/models/{model_name}/versions/{'9' * 30}:predict", good_body),
            True,
        ),
        Case("gzip body", post(gzip.compress(good_body), ("Content-Encoding", "gzip")), True),
        Case("deflate body", post(zlib.compress(good_body), ("Content-Encoding", "deflate")), True),
        Case("gzip header on a plain body", post(good_body, ("Content-Encoding", "gzip")), True),
        Case("deflate header on a plain body", post(good_body, ("Content-Encoding", "deflate")), True),
        Case("truncated gzip body", post(gzip.compress(good_body)[:-9], ("Content-Encoding", "gzip")), True),
        Case(
            "gzip bomb beyond the body limit",
            post(gzip.compress(b" " * (80 << 20)), ("Content-Encoding", "gzip")),
            True,
        ),
        Case("unsupported encoding", post(good_body, ("Content-Encoding", "br")), True),
        Case("JSON arrays 1000 deep", post(b'{"instances": ' + b"[" * deep + b"]" * deep + b"}"), True),
        Case(
            "JSON objects 1000 deep in instances",
            post(b'{"instances": ' + b'{"a": ' * deep + b"1" + b"}" * deep + b"}"),
            True,
        ),
        Case(
            "JSON objects 1000 deep in inputs",
            post(b'{"inputs": ' + b'{"b64": ' * deep + b"1" + b"}" * deep + b"}"),
            True,
        ),
        Case("JSON arrays 100000 deep", post(b'{"instances": ' + b"[" * 100000 + b"]" * 100000 + b"}"), True),
        Case("5000-digit integer", post(b'{"instances": [' + b"9" * 5000 + b"]}"), True),
        Case("5000-digit negative integer in inputs", post(b'{"inputs": [-' + b"9" * 5000 + b"]}"), True),
        Case("NaN and Infinity", post(b'{"instances": [NaN, Infinity, -Infinity]}'), True),
        Case("invalid UTF-8", post(b'{"instances": ["\xff\xfe\xc3"]}'), True),
        Case("lone surrogate escape", post(b'{"instances": ["\\ud800"]}'), True),
        Case("empty body", post(b""), True),
        Case("JSON null", post(b"null"), True),
        Case("a bare number of 10^6 digits' exponent", post(b'{"instances": [1e999999]}'), True),
        Case(
            "chunked body",
            request(
                "POST", path, b"%x\r\n%s\r\n0\r\n\r\n" % (len(good_body), good_body), [("Transfer-Encoding", "chunked")]
            ),
            True,
        ),
        Case("Expect: 100-continue", post(good_body, ("Expect", "100-continue")), True),
        Case("odd but legal headers", post(good_body, ("X-Empty", ""), ("X-Tab", "a\tb"), ("X-Latin", "\xe9")), True),
        Case("100 headers", post(good_body, *[(f"X-H{index}", "v") for index in range(100)]), True),
        Case(
            "Upgrade request",
            request("GET", f"/v1/models/{model_name}", headers=[("Connection", "Upgrade"), ("Upgrade", "websocket")]),
            True,
        ),
        Case("HTTP/1.0 request", request("GET", f"/v1/models/{model_name}", version="HTTP/1.0"), False),
        # Not framed (or not HTTP): a JSON 4xx, then the server may close.
        Case("garbage request line", b"GARBAGE\r\n\r\n", False),
        Case("method with @", request("G@T", "/"), False),
        Case("unknown method", request("BREW", path), False),  # aiohttp's parser knows the registered methods only
        Case("unknown Expect", post(good_body, ("Expect", "teapot")), True),
        Case("undecodable Expect", request("OPTIONS", "*", headers=[("Expect", "100-\udca3ontinue")]), True),
        Case("NUL in the method", request("PO\x00ST", path, good_body), False),
        Case("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", False),
        Case("HTTP/0.9 request line", b"GET /\r\n\r\n", False),
        Case("HTTP/3.0 version", request("GET", "/", version="HTTP/3.0"), False),
        Case("header without colon", b"GET / HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n", False),
        Case("obsolete line folding", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\r\n folded\r\n\r\n", False),
        Case("NUL in a header value", request("GET", "/", headers=[("X-A", "a\x00b")]), False),
        Case("header line of 20000 bytes", request("GET", "/", headers=[("X-Big", "a" * 20000)]), False),
        Case("300 headers", request("GET", "/", headers=[(f"X-H{index}", "v") for index in range(300)]), False),
        Case("non-numeric Content-Length", request("POST", path, good_body, [("Content-Length", "abc")]), False),
        Case("negative Content-Length", request("POST", path, good_body, [("Content-Length", "-1")]), False),
        Case(
            "two different Content-Lengths",
            request("POST", path, good_body, [("Content-Length", str(len(good_body))), ("Content-Length", "3")]),
            False,
        ),
        Case("Content-Length beyond int64", request("POST", path, good_body, [("Content-Length", "9" * 30)]), False),
        Case(
            "chunked and Content-Length",
            request("POST", path, b"0\r\n\r\n", [("Transfer-Encoding", "chunked"), ("Content-Length", "5")]),
            False,
        ),
        Case(
            "chunk size garbage",
            request("POST", path, b"zz\r\nabc\r\n0\r\n\r\n", [("Transfer-Encoding", "chunked")]),
            False,
        ),
        Case(
            "chunk longer than said",
            request("POST", path, b"2\r\nabcdef\r\n0\r\n\r\n", [("Transfer-Encoding", "chunked")]),
            False,
        ),
        Case("unknown Transfer-Encoding", request("POST", path, good_body, [("Transfer-Encoding", "gzip")]), False),
    ]
    return cases


# -- checks ------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class Tally:
    """What the run sent and what went wrong; ``problems`` says each failure once, with its case."""

    requests: int = 0
    status_5xx: int = 0
    non_json_errors: int = 0
    reset_keepalive: int = 0
    hot_swap_failures: int = 0
    tracebacks: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, counter: str, problem: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)
            if len(self.problems) < 200:
                self.problems.append(f"{counter}: {problem}")

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1

    @property
    def failures(self) -> int:
        return self.status_5xx + self.non_json_errors + self.reset_keepalive + self.hot_swap_failures + self.tracebacks

    def summary(self) -> str:
        return (
            f"faults_serving requests={self.requests} status_5xx={self.status_5xx} "
            f"non_json_errors={self.non_json_errors} reset_keepalive={self.reset_keepalive} "
            f"hot_swap_failures={self.hot_swap_failures} tracebacks={self.tracebacks}"
        )


def check_answer(answer: Answer | None, name: str, tally: Tally, head: bool = False) -> None:
    """Below 500; an error answer is JSON {"error": <string>} (HEAD answers carry no body to check)."""
    tally.count_request()
    if answer is None:
        return
    if answer.status >= 500:
        tally.add("status_5xx", f"{name}: {answer.status} {answer.body[:200]!r}")
    if answer.status < 400 or head:
        return
    try:
        document = json.loads(answer.body)
        is_error = isinstance(document, dict) and isinstance(document.get("error"), str)
    except ValueError:
        is_error = False
    content_type = answer.headers.get("content-type", "").split(";")[0]
    if not is_error or content_type != "application/json":
        tally.add("non_json_errors", f"{name}: {answer.status} {content_type!r} {answer.body[:200]!r}")


def check_next_request(connection: RawConnection, good: bytes, name: str, tally: Tally) -> None:
    """The connection the server kept open answers a valid :predict correctly."""
    answer = connection.read_answer() if connection.send(good) else None
    tally.count_request()
    if answer is None or answer.status != 200 or json.loads(answer.body).get("predictions") is None:
        got = "the connection was closed or reset" if answer is None else f"{answer.status} {answer.body[:200]!r}"
        tally.add("reset_keepalive", f"after {name!r} the next request on the connection failed: {got}")


def run_case(port: int, case: Case, good: bytes, tally: Tally) -> Answer | None:
    connection = RawConnection(port)
    try:
        answer = connection.read_answer(case.head) if connection.send(case.data) else None
        check_answer(answer, case.name, tally, case.head)
        if answer is None:
            tally.add("non_json_errors", f"{case.name}: no answer at all")
        elif case.framed and answer.closes:
            tally.add(
                "reset_keepalive",
                f"{case.name}: a well-framed request, yet the server closed the connection "
                f"({answer.status} {answer.body[:200]!r})",
            )
        elif not answer.closes:
            check_next_request(connection, good, case.name, tally)
        return answer
    finally:
        connection.close()


def pipelined(port: int, good: bytes, bad: bytes, tally: Tally, count: int = 3) -> None:
    """good, bad, good, ... sent in one write: every answer comes back, in order, on the one connection."""
    connection = RawConnection(port)
    try:
        sequence = [good if index % 2 == 0 else bad for index in range(count)]
        connection.send(b"".join(sequence))
        for index, data in enumerate(sequence):
            answer = connection.read_answer()
            check_answer(answer, f"pipelined request {index}", tally)
            expected = 200 if data is good else 400
            if answer is None or answer.status != expected:
                got = "no answer" if answer is None else answer.status
                tally.add("reset_keepalive", f"pipelined request {index}: expected {expected}, got {got}")
                return
    finally:
        connection.close()


def leave_mid_body(port: int, path: str, tally: Tally) -> None:
    """Headers announcing 100000 bytes, 100 of them sent, then the client is gone."""
    connection = RawConnection(port)
    connection.send(
        request("POST", path, b'{"instances": [' + b"1.0, " * 19, [("Content-Length", "100000")], content_length=False)
    )
    connection.close()
    tally.count_request()


def slowloris(port: int, path: str, good: bytes, tally: Tally, connections: int = 50) -> None:
    """Connections that stop in the middle of their headers must not keep a normal client from an answer."""
    slow = []
    try:
        for _ in range(connections):
            connection = RawConnection(port)
            connection.send(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".encode())
            slow.append(connection)
        normal = RawConnection(port)
        try:
            answer = normal.read_answer() if normal.send(good) else None
            check_answer(answer, "request among slowloris connections", tally)
            if answer is None or answer.status != 200:
                tally.add(
                    "reset_keepalive",
                    f"a normal request among {connections} slowloris connections got "
                    f"{'no answer' if answer is None else answer.status}",
                )
        finally:
            normal.close()
    finally:
        for connection in slow:
            connection.close()


# -- random hostile requests -----------------------------------------------------------------------

_METHODS = ["POST", "POST", "POST", "GET", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW", "G@T", "P OST", "", "post"]
_VERSIONS = ["HTTP/1.1"] * 6 + ["HTTP/1.0", "HTTP/2", "HTTP/1.2", "HTTP/9.9", "http/1.1", "HTTP/1.1 x", ""]
_HEADERS = [
    ("Content-Type", "application/json"),
    ("Content-Type", "text/plain; charset=latin-1"),
    ("Content-Encoding", "gzip"),
    ("Content-Encoding", "deflate"),
    ("Content-Encoding", "gzip, gzip"),
    ("Content-Encoding", "br"),
    ("Content-Encoding", "identity"),
    ("Content-Encoding", ""),
    ("Transfer-Encoding", "chunked"),
    ("Transfer-Encoding", "gzip, chunked"),
    ("Expect", "100-continue"),
    ("Expect", "teapot"),
    ("Connection", "close"),
    ("Connection", "keep-alive"),
    ("Connection", "Upgrade"),
    ("Upgrade", "h2c"),
    ("Accept", "text/html"),
    ("Accept-Encoding", "gzip"),
    ("X-Nul", "a\x00b"),
    ("X-Long", "v" * 9000),
    ("X-Latin", "\xe9\xff"),
    ("", "no name"),
    ("Bad Name", "v"),
    ("Host", "a" * 300),
    ("Content-Length", "abc"),
    ("Content-Length", "-5"),
    ("Content-Length", "0"),
    ("Content-Length", "1e3"),
]


def _bodies(good_body: bytes) -> list[bytes]:
    return [
        good_body,
        good_body,
        gzip.compress(good_body),
        b"",
        b"{",
        b"null",
        b"[]",
        b'{"instances": []}',
        b'{"instances": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        b'{"instances": [' + b"7" * 4400 + b"]}",
        b'{"instances": [NaN]}',
        b'{"inputs": {"x": [1, 2], "y": 3}}',
        b"\xff\xfe\x00\x01",
        os.urandom(64),
        b'{"instances": [1.0, "two"]}',
        b'{"signature_name": 5, "instances": [1.0]}',
        b'{"instances": [{"b64": "!!"}]}',
        b'{"instances": [' + b"1e400," * 10 + b"1]}",
    ]


def _paths(name: str) -> list[str]:
    return [
        predict_path(name),
        predict_path(name),
        f"/v1/models/{name}",
        f"/v1/models/{name}/metadata",
        f"/v1/models/{name}:classify",
        f"/v1/models/{name}:regress",
        f"/v1/models/{name}/versions/1:predict",
        f"/v1/models/{name}/labels/x:predict",
        f"/v1/models/{name}/versions/1/labels/x:predict",
        "/",
        "/v1",
        "/v1/models",
        "/%zz",
        "/%00",
        "//",
        "*",
        "http://h/v1/models",
        "/v1/models/\xe9:predict",
        "/monitoring/prometheus/metrics",
        "/v1/models/" + "n" * 5000,
        "/v1/models/a:b:c",
        "/a?b=%zz&&=",
    ]


def random_request(rng: random.Random, model_name: str, good_body: bytes) -> tuple[bytes, bool, bool]:
    """A request assembled from hostile parts, sometimes with a byte flipped; whether it is a HEAD; whether it is
    framed as it says (no byte flipped: a flip may change the framing, and then the next request on the socket is
    read as this one's body)."""
    method = rng.choice(_METHODS + ["HEAD"])
    headers = rng.sample(_HEADERS, rng.randint(0, 3))
    body = rng.choice(_bodies(good_body))
    names = {name.lower() for name, _ in headers}
    if "transfer-encoding" in names:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    data = request(method, rng.choice(_paths(model_name)), body, headers, version=rng.choice(_VERSIONS))
    flipped = rng.random() < 0.2
    if flipped:  # a flipped byte anywhere, framing included
        position = rng.randrange(len(data))
        data = data[:position] + bytes([rng.randrange(256)]) + data[position + 1 :]
    return data, method == "HEAD", not flipped


def random_requests(port: int, model_name: str, good_body: bytes, tally: Tally, *, seconds: float, seed: int) -> None:
    rng = random.Random(seed)
    good = good_request(predict_path(model_name), good_body)
    deadline = time.monotonic() + seconds
    index = 0
    while time.monotonic() < deadline:
        data, head, framed = random_request(rng, model_name, good_body)
        connection = RawConnection(port, timeout=5.0)
        try:
            # A request announcing more body than it has waits for the rest: read what comes within the timeout.
            answer = connection.read_answer(head) if connection.send(data) else None
            check_answer(answer, f"random request {index} (seed {seed}): {data[:120]!r}", tally, head)
            if answer is not None and not answer.closes and framed:
                check_next_request(connection, good, f"random request {index} (seed {seed}): {data[:120]!r}", tally)
        finally:
            connection.close()
        index += 1


# -- hot swap under load -----------------------------------------------------------------------------


def hot_swap(
    port: int, base: str, export: str, manager: Any, path: str, good_body: bytes, tally: Tally, *, seconds: float
) -> tuple[int, int]:
    """:predict from a client thread while versions come and go; returns (swaps, requests sent during them).

    Each round adds version v+1 (copied under a temp- name, then renamed, as
    exports are written) and waits until it serves; sometimes drops a broken
    version v+2 beside it (a folder of notes, or a symlink to one), waits until
    it failed to load and checks v+1 still serves; then removes v (and v+2).
    """
    stop = threading.Event()
    client = threading.Thread(target=_predict_until, args=(port, path, good_body, stop, tally), daemon=True)
    requests_before = tally.requests
    client.start()
    deadline = time.monotonic() + seconds
    version, swaps = max(int(name) for name in os.listdir(base) if name.isdigit()), 0
    rng = random.Random(version)
    try:
        while time.monotonic() < deadline:
            staging = os.path.join(base, f"temp-{version + 1}")
            shutil.copytree(export, staging)
            os.rename(staging, os.path.join(base, str(version + 1)))
            if not _wait_for(lambda: manager.served_versions == [version + 1], time.monotonic() + 60):
                tally.add(
                    "hot_swap_failures",
                    f"version {version + 1} was not served within 60 s; serving {manager.served_versions}",
                )
                break
            if rng.random() < 0.3:
                _drop_broken_version(base, version + 2, rng)
                if not _wait_for(lambda: _failed(manager, version + 2), time.monotonic() + 60):
                    tally.add("hot_swap_failures", f"broken version {version + 2} was not tried within 60 s")
                if manager.served_versions != [version + 1]:
                    tally.add(
                        "hot_swap_failures",
                        f"after broken version {version + 2}, serving "
                        f"{manager.served_versions} instead of [{version + 1}]",
                    )
                _remove_broken_version(base, version + 2)
            shutil.rmtree(os.path.join(base, str(version)))
            version, swaps = version + 1, swaps + 1
    finally:
        stop.set()
        client.join(timeout=60)
    return swaps, tally.requests - requests_before


def _predict_until(port: int, path: str, body: bytes, stop: threading.Event, tally: Tally) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        while not stop.is_set():
            tally.count_request()
            try:
                connection.request("POST", path, body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
                if response.status != 200 or json.loads(answer).get("predictions") is None:
                    tally.add("hot_swap_failures", f"{response.status} {answer[:200]!r}")
            except (OSError, http.client.HTTPException, ValueError) as error:
                tally.add("hot_swap_failures", f"{type(error).__name__}: {error}")
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    finally:
        connection.close()


def _failed(manager: Any, version: int) -> bool:
    return any(status.version == version and status.error_code != "OK" for status in manager.statuses())


def _drop_broken_version(base: str, version: int, rng: random.Random) -> None:
    """A higher version that is not an export: it must fail to load and leave the served version alone."""
    notes = os.path.join(base, f"notes-{version}")
    os.makedirs(notes, exist_ok=True)
    Path(notes, "private-notes.txt").write_text("not an export")
    target = os.path.join(base, str(version))
    if rng.random() < 0.5:
        os.symlink(notes, target)
    else:
        shutil.copytree(notes, target)


def _remove_broken_version(base: str, version: int) -> None:
    target = os.path.join(base, str(version))
    if os.path.islink(target):
        os.unlink(target)
    elif os.path.isdir(target):
        shutil.rmtree(target)
    shutil.rmtree(os.path.join(base, f"notes-{version}"), ignore_errors=True)


def _wait_for(condition: Callable[[], bool], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)  # polling a condition with a deadline, not a fixed wait
    return condition()


# -- logs -------------------------------------------------------------------------------------------


class TracebackCounter(logging.Handler):
    """Counts log records carrying a traceback (the server must log client errors in one line)."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(logging.DEBUG)
        self._tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[0] is not None:
            self._tally.add(
                "tracebacks",
                f"{record.name}: {record.getMessage()} ({record.exc_info[0].__name__}: {record.exc_info[1]})",
            )


@contextlib.contextmanager
def counting_tracebacks(tally: Tally) -> Iterator[None]:
    """While active, every traceback logged by the server (torchestimator or aiohttp) is counted."""
    handler = TracebackCounter(tally)
    loggers = [logging.getLogger(name) for name in ("torchestimator", "aiohttp")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


# -- the run ----------------------------------------------------------------------------------------


def run_hostile(port: int, model_name: str, good_body: bytes, tally: Tally) -> None:
    """Every hand-written case, pipelining, a mid-body disconnect and slowloris, once each."""
    path = predict_path(model_name)
    good = good_request(path, good_body)
    for case in hostile_cases(model_name, good_body):
        run_case(port, case, good, tally)
    pipelined(port, good, bad_request(path), tally, count=5)
    leave_mid_body(port, path, tally)
    slowloris(port, path, good, tally)


def bad_request(path: str) -> bytes:
    """A well-framed :predict the server refuses (400): a 5000-digit integer."""
    return request("POST", path, b'{"instances": [' + b"9" * 5000 + b"]}")


def _export_model(directory: str) -> str:
    """fuzz_serving's ``half`` model, exported under ``directory``; returns its version folder."""
    spec = importlib.util.spec_from_file_location("fuzz_serving", ROOT / "benchmarks" / "fuzz_serving.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    bases = module.export_models(directory)
    versions = [name for name in os.listdir(bases[MODEL_NAME]) if name.isdigit()]
    return os.path.join(bases[MODEL_NAME], versions[0])


def parse_settings(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="random hostile requests for this long (60)")
    parser.add_argument("--swap-seconds", type=float, default=30.0, help="hot swaps under load for this long (30)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random requests (0)")
    settings = parser.parse_args(argv)
    if settings.seconds < 0 or settings.swap_seconds < 0:
        parser.error(
            f"--seconds and --swap-seconds must be >= 0; received {settings.seconds} and {settings.swap_seconds}."
        )
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from torchestimator.serving import start

    logging.getLogger("torchestimator").setLevel(logging.WARNING)  # the refused requests would flood the output
    tally = Tally()
    path, good_body = predict_path(MODEL_NAME), json.dumps({"instances": GOOD_INSTANCES}).encode()
    with tempfile.TemporaryDirectory() as directory:
        export = _export_model(os.path.join(directory, "models"))
        base = os.path.join(directory, "base")
        shutil.copytree(export, os.path.join(base, "1"))
        with counting_tracebacks(tally), start(MODEL_NAME, base, file_system_poll_wait_seconds=0.1) as server:
            started = time.monotonic()
            run_hostile(server.port, MODEL_NAME, good_body, tally)
            random_requests(server.port, MODEL_NAME, good_body, tally, seconds=settings.seconds, seed=settings.seed)
            swaps, swap_requests = hot_swap(
                server.port,
                base,
                export,
                server.managers[MODEL_NAME],
                path,
                good_body,
                tally,
                seconds=settings.swap_seconds,
            )
            check_next_request(RawConnection(server.port), good_request(path, good_body), "the whole run", tally)
            elapsed = time.monotonic() - started
    for problem in tally.problems:
        print(f"PROBLEM {problem}")
    print(
        f"{tally.requests} requests in {elapsed:.1f} s (seed {settings.seed}); {swaps} version swaps under "
        f"{swap_requests} :predict requests"
    )
    print(tally.summary())
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
