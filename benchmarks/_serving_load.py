"""The serving benchmark's load and its bookkeeping: raw-HTTP keep-alive clients, per-process CPU and threads.

Split out of benchmarks/serving.py (which starts the servers, checks them and reports) so that each stays
small; serving.py re-exports these names. Nothing here knows which server it loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import importlib.util
import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol


@dataclasses.dataclass
class Run:
    """One load run against one server: latencies of the completed requests, wall time, failures, CPU seconds."""

    latencies: list[float]
    wall: float
    errors: int
    server_cpu: float = math.nan
    """CPU seconds the server's processes used during the run."""
    client_cpu: float = math.nan
    """CPU seconds this process (the load) used during the run."""
    server_threads: int = 0
    """Threads of the server's processes at the end of the run (its pools as the load grew them)."""

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall if self.wall > 0 else 0.0


def free_port() -> int:
    """A port nothing listens on now (the OS picks it); the server binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_tree_cpu_seconds(root: int) -> float:
    """CPU seconds (utime + stime) of `root` and its descendants, from /proc; NaN where /proc is missing."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, cpu seconds)
    try:
        names = os.listdir("/proc")
    except OSError:
        return math.nan
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        stats[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    if root not in stats:
        return math.nan
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        total += stats[pid][1]
        frontier.extend(child for child, (parent, _) in stats.items() if parent == pid)
    return total


def process_tree_threads(root: int) -> int:
    """Threads of `root` and its descendants, from /proc/<pid>/task; 0 where /proc is missing."""
    try:
        parents = {
            int(name): int(open(f"/proc/{name}/stat", "rb").read().rsplit(b")", 1)[1].split()[1])
            for name in os.listdir("/proc")
            if name.isdigit() and os.path.exists(f"/proc/{name}/stat")
        }
    except OSError:
        return 0
    total, frontier = 0, [root]
    while frontier:
        pid = frontier.pop()
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{pid}/task"))
        frontier.extend(child for child, parent in parents.items() if parent == pid)
    return total


def post_once(port: int, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    """One POST of `body` to `path` on its own connection: (status, answer body)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# -- load ------------------------------------------------------------------------------


class LoadSettings(Protocol):
    """What a load run reads of the benchmark's Settings."""

    requests: int
    seconds: float
    warmup_requests: int


def request_bytes(port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bool:
    """One request on a keep-alive connection; True when the answer is 200. Reads the whole answer either way."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at >= 0:
        await reader.readexactly(int(lower[at + 17 : lower.index(b"\r\n", at + 2)]))
    elif b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        raise ConnectionError("an answer without Content-Length or chunked encoding")
    return status == 200


async def _connection(
    port: int,
    request: bytes,
    warmup: int,
    count: int,
    warmed: Callable[[], None],
    start: asyncio.Event,
    deadline: list[float],
    latencies: list[float],
    errors: list[int],
) -> None:
    """One client connection: `warmup` untimed requests, then up to `count` timed ones until the deadline."""
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send() -> bool:
        nonlocal connection
        try:
            if connection is None:
                connection = await asyncio.open_connection("127.0.0.1", port)
            return await asyncio.wait_for(_exchange(*connection, request), 10)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError):
            if connection is not None:
                connection[1].close()
            connection = None  # the next request reconnects
            return False

    try:
        for _ in range(warmup):
            await send()
        warmed()
        await start.wait()
        for _ in range(count):
            if time.perf_counter() >= deadline[0]:
                break
            began = time.perf_counter()
            if await send():
                latencies.append(time.perf_counter() - began)
            else:
                errors.append(1)
    finally:
        if connection is not None:
            connection[1].close()


async def _load(
    port: int, path: str, body: bytes, concurrency: int, settings: LoadSettings, cpu_seconds: Callable[[], float]
) -> Run:
    request = request_bytes(port, path, body)
    start, all_warm, deadline = asyncio.Event(), asyncio.Event(), [math.inf]
    warm = [0]
    latencies: list[float] = []
    errors: list[int] = []

    def warmed() -> None:
        warm[0] += 1
        if warm[0] == concurrency:
            all_warm.set()

    tasks = [
        asyncio.ensure_future(
            _connection(
                port, request, settings.warmup_requests, settings.requests, warmed, start, deadline, latencies, errors
            )
        )
        for _ in range(concurrency)
    ]
    # Every connection warms up first (bounded: each request has a 10 s limit), then all start together.
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(all_warm.wait(), settings.seconds + 60)
    server_before, client_before = cpu_seconds(), time.process_time()
    began = time.perf_counter()
    deadline[0] = began + settings.seconds
    start.set()
    _, pending = await asyncio.wait(tasks, timeout=settings.seconds + 30)
    wall = time.perf_counter() - began
    for task in pending:
        task.cancel()
    return Run(
        latencies=latencies,
        wall=wall,
        errors=len(errors) + len(pending),
        server_cpu=cpu_seconds() - server_before,
        client_cpu=time.process_time() - client_before,
    )


def run_load(
    port: int,
    body: bytes,
    concurrency: int,
    settings: LoadSettings,
    *,
    path: str,
    cpu_seconds: Callable[[], float] = lambda: math.nan,
    threads: Callable[[], int] = lambda: 0,
) -> Run:
    """`concurrency` keep-alive connections POST `body` to `path`; timing starts when all have warmed up."""
    run = _event_loop_runner()(_load(port, path, body, concurrency, settings, cpu_seconds))
    run.server_threads = threads()
    return run


def _event_loop_runner() -> Callable[[Any], Any]:
    """uvloop's run when installed (a cheaper client), else asyncio's."""
    if importlib.util.find_spec("uvloop") is not None:
        import uvloop

        return uvloop.run
    return asyncio.run


# -- measuring ------------------------------------------------------------------------


@dataclasses.dataclass
class Measurement:
    """Per (server, concurrency): every kept round's run."""

    runs: dict[tuple[str, int], list[Run]]

    def rate(self, server: str, concurrency: int) -> float:
        return statistics.median(run.rate for run in self.runs[server, concurrency])

    def latency_ms(self, server: str, concurrency: int, quantile: float) -> float:
        values = sorted(value for run in self.runs[server, concurrency] for value in run.latencies)
        if not values:
            return math.nan
        return values[min(len(values) - 1, int(quantile * len(values)))] * 1e3

    def errors(self, server: str, concurrency: int) -> int:
        return sum(run.errors for run in self.runs[server, concurrency])

    def threads(self, server: str, concurrency: int) -> int:
        """Most threads the server had at the end of a run at this concurrency (its pools keep what earlier runs,
        of any model and concurrency, grew: FastAPI `def` shows its peak, one per connection up to 40)."""
        return max(run.server_threads for run in self.runs[server, concurrency])

    def ratio(self, server: str, reference: str, concurrency: int) -> float:
        """Median over rounds of server's requests/s / reference's requests/s in the same round."""
        pairs = zip(self.runs[server, concurrency], self.runs[reference, concurrency])
        return statistics.median(a.rate / b.rate if b.rate > 0 else math.nan for a, b in pairs)

    def cpu_us_per_request(self, server: str, concurrency: int, side: str = "server") -> float:
        """CPU microseconds per completed request, over every round (server: its processes; client: the load)."""
        runs = self.runs[server, concurrency]
        done = sum(len(run.latencies) for run in runs)
        cpu = sum(run.server_cpu if side == "server" else run.client_cpu for run in runs)
        return cpu / done * 1e6 if done else math.nan

    def cpu_efficiency_ratio(self, server: str, references: Sequence[str], concurrency: int) -> float:
        """The leanest reference's server CPU per request over `server`'s (above 1: `server` spends less per request).

        A server's CPU time per request is what a busy machine disturbs least: other processes take wall time
        from a run, not CPU time from its requests.
        """
        present = [name for name in references if (name, concurrency) in self.runs]
        leanest = min(self.cpu_us_per_request(name, concurrency) for name in present)
        return leanest / self.cpu_us_per_request(server, concurrency)

    def fastest_ratio(self, server: str, references: Sequence[str], concurrency: int) -> float:
        """Median over rounds of server's requests/s over the best of `references` in the same round."""
        present = [name for name in references if (name, concurrency) in self.runs]
        rounds = zip(self.runs[server, concurrency], *(self.runs[name, concurrency] for name in present))
        ratios = []
        for ours, *others in rounds:
            best = max(other.rate for other in others)
            ratios.append(ours.rate / best if best > 0 else math.nan)
        return statistics.median(ratios)
