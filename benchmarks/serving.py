"""Benchmark: torchestimator's model server against a bare FastAPI/uvicorn app and a hand-written Flask app.

Every server runs in its own process on 127.0.0.1 and serves the same
export of the same model: ours (`torchestimator serve`, with request
batching off and on), a ten-line FastAPI app on one uvicorn worker (the floor
a user could write: a plain `def` endpoint, so inference runs in Starlette's
thread pool instead of blocking the event loop, as FastAPI's docs advise for
blocking calls), and a hand-written Flask app on its threaded development
server. The two anchors call `torchestimator.export.load`'s model directly and
answer `{"predictions": ...}` like TF Serving's row format. All servers pin
torch to one intra-op thread (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1) and log no
requests (ours never writes a line per request, like TF Serving), and all
must give the same predictions for the same request before
anything is timed (the script exits 1 otherwise).

Load: C threads (C = 1 and 8) in this process, each with its own keep-alive
`http.client.HTTPConnection`, send the same pre-encoded one-instance body: a
few warm-up requests, then a fixed count per thread, stopped early at a time
cap. requests/s is completed requests over the wall time of the run; p50/p99
are over every request of every kept round. Rounds rotate the servers' order;
requests/s is the median over rounds, and a ratio is the median over rounds
of the two servers' requests/s in the same round, then the geometric mean
over the models. Load and servers share this machine's cores, equally for all.

Run:  python benchmarks/serving.py [--requests N] [--seconds S] [--rounds R] [--models mlp,cnn] [--quick]
Last line:  serving rps_vs_fastapi=<ratio> rps_vs_flask=<ratio> batching_gain_c8=<ratio> p99_ms_c8=<ms>
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import importlib.util
import json
import logging
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te
from torchestimator.export import PredictOutput, TensorSpec, export_saved_model, load, serving_input_receiver

TARGETS = {"rps_vs_fastapi": 1.0, "batching_gain_c8": 2.0}
MODEL_NAME = "m"
PREDICT_PATH = f"/v1/models/{MODEL_NAME}:predict"
CONCURRENCIES = (1, 8)
CLASSES = 10
# TF Serving's BatchingParameters in protobuf text format, as --batching_parameters_file reads it.
BATCHING_PARAMETERS = ("max_batch_size {{ value: {max_batch_size} }}\nbatch_timeout_micros {{ value: {timeout} }}\n"
                       "max_enqueued_batches {{ value: 100 }}\nnum_batch_threads {{ value: 1 }}\n")
SERVER_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

# The anchors: what a user writes in ten lines around the same loaded model.
FASTAPI_APP = '''
import sys, numpy as np, uvicorn
from fastapi import FastAPI
from torchestimator.export import load
model = load(sys.argv[1])
app = FastAPI()

@app.post("/v1/models/m:predict")
{endpoint} predict(body: dict):
    outputs = model(np.asarray(body["instances"], dtype=np.float32))
    return {"predictions": outputs["probabilities"].tolist()}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), workers=1, access_log=False, log_level="warning")
'''
FLASK_APP = '''
import logging, sys, numpy as np
from flask import Flask, jsonify, request
from torchestimator.export import load
model = load(sys.argv[1])
app = Flask(__name__)

@app.post("/v1/models/m:predict")
def predict():
    outputs = model(np.asarray(request.get_json()["instances"], dtype=np.float32))
    return jsonify(predictions=outputs["probabilities"].tolist())

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request, like the other servers
app.run(host="127.0.0.1", port=int(sys.argv[2]), threaded=True)
'''


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """One model, exported once and served by every server."""

    name: str
    """Short name used in the output ("mlp", "cnn")."""
    build_model: Callable[[], nn.Module]
    """Builds the model with random weights."""
    example_shape: tuple[int, ...]
    """Shape of one instance (without the batch dimension)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What the command line chose."""

    models: tuple[str, ...]
    requests: int
    """Requests per load thread in one run (after the warm-up)."""
    seconds: float
    """Time cap of one run; a run stops at its count or this, whichever comes first."""
    warmup_requests: int
    """Untimed requests per load thread before each run."""
    rounds: int
    startup_seconds: float
    """How long a server may take to answer its first request."""
    seed: int
    quick: bool
    fastapi: bool
    fastapi_endpoint: str
    """"def" (inference in Starlette's thread pool) or "async def" (inference on the event loop)."""
    flask: bool
    max_batch_size: int
    batch_timeout_micros: int
    """The batching parameters file's fields (the others: max_enqueued_batches 100, num_batch_threads 1)."""


@dataclasses.dataclass
class Run:
    """One load run against one server: latencies of the completed requests, wall time, failures."""

    latencies: list[float]
    wall: float
    errors: int

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall if self.wall > 0 else 0.0


class ServerFailed(RuntimeError):
    """A server process exited or never answered; the message holds the end of its log."""


# -- models and export -----------------------------------------------------------


def small_mlp(features: int = 64, hidden: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, CLASSES))


def small_cnn(side: int = 28, channels: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * channels * (side // 4) ** 2, CLASSES),
    )


def workloads(settings: Settings) -> list[Workload]:
    if settings.quick:  # tiny models so the smoke test spends its time starting servers, not computing
        available = [Workload(name="mlp", build_model=lambda: small_mlp(8, 16), example_shape=(8,)),
                     Workload(name="cnn", build_model=lambda: small_cnn(8, 4), example_shape=(1, 8, 8))]
    else:
        available = [Workload(name="mlp", build_model=small_mlp, example_shape=(64,)),
                     Workload(name="cnn", build_model=small_cnn, example_shape=(1, 28, 28))]
    return [workload for workload in available if workload.name in settings.models]


def _model_fn(model: nn.Module, features: dict[str, torch.Tensor], labels: Any, mode: str) -> te.EstimatorSpec:
    logits = model(features["x"])
    probabilities = logits.softmax(-1)
    if mode == te.ModeKeys.PREDICT:
        # One output, so TF Serving's row format answers a plain list per instance, as the anchors do.
        return te.EstimatorSpec(mode, predictions={"probabilities": probabilities},
                                export_outputs={"serving_default": PredictOutput({"probabilities": probabilities})})
    return te.EstimatorSpec(mode, predictions={"probabilities": probabilities}, loss=F.cross_entropy(logits, labels))


def export_workload(workload: Workload, directory: str, seed: int) -> str:
    """Trains one step (the exporter needs a checkpoint) and exports to `directory/<name>/<version>`; returns the base."""
    generator = np.random.default_rng(seed)
    features = generator.standard_normal((16, *workload.example_shape)).astype(np.float32)
    labels = generator.integers(0, CLASSES, 16).astype(np.int64)
    config = te.RunConfig(random_seed=seed, log_step_count_steps=None, save_summary_steps=None, progress_bar=False,
                          device="cpu")
    estimator = te.Estimator(model_fn=_model_fn, model=workload.build_model,
                             optimizer=lambda parameters: torch.optim.SGD(parameters, lr=1e-3),
                             model_dir=os.path.join(directory, f"{workload.name}-model"), config=config)
    estimator.train(te.numpy_input_fn({"x": features}, labels, batch_size=8, num_epochs=None, shuffle=False),
                    max_steps=1)
    base = os.path.join(directory, workload.name)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, *workload.example_shape), dtype=torch.float32)})
    export_saved_model(estimator, base, receiver)
    return base


# -- server processes ---------------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on now (the OS picks it); the server binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_commands(base: str, scripts: dict[str, str]) -> dict[str, tuple[list[str], int]]:
    """(command line, port) of each server, keyed by the name used in the output."""
    commands = {}
    for name in ("ours", "ours_batching"):
        port = free_port()
        commands[name] = ([sys.executable, "-m", "torchestimator.cli", "serve", "--model_name", MODEL_NAME,
                           "--model_base_path", base, "--rest_api_port", str(port)], port)
    commands["ours_batching"][0].extend(["--enable_batching", "--batching_parameters_file", scripts["batching"]])
    for name in ("fastapi", "flask"):
        if name in scripts:
            port = free_port()
            commands[name] = ([sys.executable, scripts[name], base, str(port)], port)
    return commands


class Server:
    """A server in its own process; `stop` ends it (terminate, then kill) and is safe to call twice."""

    def __init__(self, name: str, command: list[str], port: int, log_path: str) -> None:
        self.name, self.command, self.port, self.log_path = name, command, port, log_path
        with open(log_path, "wb") as log:
            # Its own session: Ctrl-C reaches only this script, whose `finally` then stops the server.
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **SERVER_ENVIRONMENT}, start_new_session=True)

    def log_tail(self, characters: int = 1500) -> str:
        with open(self.log_path, "rb") as log:
            return log.read().decode(errors="replace")[-characters:]

    def wait_ready(self, body: bytes, deadline: float) -> bytes:
        """Polls with a predict request until it answers 200; returns that answer's body."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerFailed(f"{self.name} exited with status {self.process.returncode}:\n{self.log_tail()}")
            try:
                status, answer = post_once(self.port, body, timeout=5)
                if status == 200:
                    return answer
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)
        raise ServerFailed(f"{self.name} did not answer {PREDICT_PATH} with 200 in time:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def post_once(port: int, body: bytes, timeout: float) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", PREDICT_PATH, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@contextlib.contextmanager
def running_servers(commands: dict[str, tuple[list[str], int]], body: bytes, directory: str,
                    startup_seconds: float) -> Iterator[tuple[dict[str, Server], dict[str, bytes], dict[str, str]]]:
    """Starts all servers at once; yields (the ones that answered, their first answers, why the others failed)."""
    servers = {name: Server(name, command, port, os.path.join(directory, f"{name}.log"))
               for name, (command, port) in commands.items()}
    try:
        answers, failures = {}, {}
        deadline = time.monotonic() + startup_seconds
        for name, server in servers.items():
            try:
                answers[name] = server.wait_ready(body, deadline)
            except ServerFailed as failure:
                failures[name] = str(failure)
                server.stop()
        yield {name: servers[name] for name in answers}, answers, failures
    finally:
        for server in servers.values():
            server.stop()


# -- load ------------------------------------------------------------------------------


def _client(port: int, body: bytes, warmup: int, count: int, start: threading.Barrier, deadline: list[float],
            latencies: list[float], errors: list[int]) -> None:
    """One load thread: a keep-alive connection, `warmup` untimed requests, then up to `count` timed ones."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json"}

    def send() -> bool:
        try:
            connection.request("POST", PREDICT_PATH, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status == 200
        except (OSError, http.client.HTTPException):
            connection.close()  # the next request reconnects
            return False

    try:
        for _ in range(warmup):
            send()
        start.wait()
        for _ in range(count):
            if time.perf_counter() >= deadline[0]:
                break
            began = time.perf_counter()
            if send():
                latencies.append(time.perf_counter() - began)
            else:
                errors.append(1)
    finally:
        connection.close()


def run_load(port: int, body: bytes, concurrency: int, settings: Settings) -> Run:
    """`concurrency` threads hammer one server; timing starts when all have warmed up."""
    deadline = [math.inf]
    start_time = [0.0]

    def release() -> None:  # runs once, in the last thread to reach the barrier
        start_time[0] = time.perf_counter()
        deadline[0] = start_time[0] + settings.seconds

    start = threading.Barrier(concurrency, action=release, timeout=settings.seconds + 60)
    per_thread: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[int] = []
    threads = [threading.Thread(target=_client, daemon=True,
                                args=(port, body, settings.warmup_requests, settings.requests, start, deadline,
                                      per_thread[index], errors))
               for index in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        # Each request has a 10 s socket timeout, so a thread ends at most that long after the cap.
        thread.join(timeout=settings.seconds + 90)
    wall = time.perf_counter() - start_time[0]
    stuck = sum(thread.is_alive() for thread in threads)
    return Run(latencies=[value for values in per_thread for value in values], wall=wall, errors=len(errors) + stuck)


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

    def ratio(self, server: str, reference: str, concurrency: int) -> float:
        """Median over rounds of server's requests/s / reference's requests/s in the same round."""
        pairs = zip(self.runs[server, concurrency], self.runs[reference, concurrency])
        return statistics.median(a.rate / b.rate if b.rate > 0 else math.nan for a, b in pairs)


def measure(servers: dict[str, Server], body: bytes, settings: Settings) -> Measurement:
    names = list(servers)
    measurement = Measurement(runs={(name, concurrency): [] for name in names for concurrency in CONCURRENCIES})
    for round_index in range(settings.rounds):
        shift = round_index % len(names)
        for concurrency in CONCURRENCIES:
            for name in names[shift:] + names[:shift]:
                measurement.runs[name, concurrency].append(run_load(servers[name].port, body, concurrency, settings))
    return measurement


def check_predictions(answers: dict[str, bytes], expected: np.ndarray) -> list[str]:
    """Names the servers whose first answer differs from the loaded model's output (empty when all agree)."""
    problems = []
    for name, answer in answers.items():
        try:
            predictions = np.asarray(json.loads(answer)["predictions"], dtype=np.float64)
        except (ValueError, KeyError, TypeError) as error:
            problems.append(f"{name} answered {answer[:200]!r} ({error})")
            continue
        if predictions.shape != expected.shape or not np.allclose(predictions, expected, rtol=1e-5, atol=1e-6):
            problems.append(f"{name} predicted {predictions.ravel()[:4].tolist()}..., the model "
                            f"{expected.ravel()[:4].tolist()}...")
    return problems


# -- one workload ------------------------------------------------------------------------


def write_scripts(directory: str, settings: Settings) -> dict[str, str]:
    """The batching parameters file and the anchor apps whose packages import."""
    scripts = {"batching": os.path.join(directory, "batching_parameters.txt")}
    contents = {"batching": BATCHING_PARAMETERS.format(max_batch_size=settings.max_batch_size,
                                                       timeout=settings.batch_timeout_micros)}
    if settings.fastapi and have_packages("fastapi", "uvicorn"):
        scripts["fastapi"] = os.path.join(directory, "fastapi_app.py")
        contents["fastapi"] = FASTAPI_APP.replace("{endpoint}", settings.fastapi_endpoint)
    if settings.flask and have_packages("flask"):
        scripts["flask"], contents["flask"] = os.path.join(directory, "flask_app.py"), FLASK_APP
    for name, path in scripts.items():
        with open(path, "w") as file:
            file.write(contents[name])
    return scripts


def have_packages(*names: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in names)


def run_workload(workload: Workload, directory: str, scripts: dict[str, str],
                 settings: Settings) -> tuple[Measurement | None, dict[str, str], list[str]]:
    """Exports, starts every server, checks their answers, measures; returns (measurement, failures, problems)."""
    base = export_workload(workload, directory, settings.seed)
    instance = np.random.default_rng(settings.seed + 1).standard_normal((1, *workload.example_shape)).astype(np.float32)
    expected = load(base)(instance)["probabilities"]
    body = json.dumps({"instances": instance.tolist()}).encode()
    logs = os.path.join(directory, f"{workload.name}-logs")
    os.makedirs(logs)
    commands = server_commands(base, scripts)
    with running_servers(commands, body, logs, settings.startup_seconds) as (servers, answers, failures):
        problems = check_predictions(answers, expected)
        if "ours" not in servers:
            problems.append("our server did not start (see above)")
        if problems:
            return None, failures, problems
        return measure(servers, body, settings), failures, []


# -- report ---------------------------------------------------------------------------------

SERVERS = ("ours", "ours_batching", "fastapi", "flask")


def print_table(measurements: dict[str, Measurement]) -> None:
    print(f"{'model':<6} {'conc':>4}  {'server':<14} {'requests/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for model, measurement in measurements.items():
        for concurrency in CONCURRENCIES:
            for server in SERVERS:
                if (server, concurrency) not in measurement.runs:
                    continue
                print(f"{model:<6} {concurrency:>4}  {server:<14} {measurement.rate(server, concurrency):>10.0f} "
                      f"{measurement.latency_ms(server, concurrency, 0.50):>8.2f} "
                      f"{measurement.latency_ms(server, concurrency, 0.99):>8.2f} "
                      f"{measurement.errors(server, concurrency):>6}")


def geometric_mean(values: Sequence[float]) -> float | None:
    if not values or not all(value > 0 and math.isfinite(value) for value in values):
        return None
    return math.exp(sum(math.log(value) for value in values) / len(values))


def summarize(measurements: dict[str, Measurement]) -> dict[str, float | None]:
    """Prints each model's ratios; returns the final line's figures (None where a side is missing)."""
    pairs = {"rps_vs_fastapi": ("ours", "fastapi"), "rps_vs_flask": ("ours", "flask"),
             "batching_gain_c8": ("ours_batching", "ours")}
    per_model: dict[str, list[float]] = {name: [] for name in pairs}
    for model, measurement in measurements.items():
        parts = []
        for name, (server, reference) in pairs.items():
            if (server, 8) in measurement.runs and (reference, 8) in measurement.runs:
                per_model[name].append(measurement.ratio(server, reference, 8))
                at_one = measurement.ratio(server, reference, 1)
                parts.append(f"{server}/{reference} {per_model[name][-1]:.3f} (c=1: {at_one:.3f})")
            else:
                parts.append(f"{server}/{reference} n/a")
        print(f"{model}: requests/s at c=8, median over rounds of paired ratios: " + ", ".join(parts))
    figures: dict[str, float | None] = {name: geometric_mean(values) if len(values) == len(measurements) else None
                                        for name, values in per_model.items()}
    tails = [measurement.latency_ms("ours_batching", 8, 0.99) for measurement in measurements.values()
             if ("ours_batching", 8) in measurement.runs]
    figures["p99_ms_c8"] = max(tails) if tails and len(tails) == len(measurements) else None
    return figures


def format_figures(figures: dict[str, float | None]) -> str:
    def text(name: str, value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return "n/a"
        return f"{value:.2f}" if name == "p99_ms_c8" else f"{value:.3f}"

    return "serving " + " ".join(f"{name}={text(name, value)}" for name, value in figures.items())


def print_verdict(figures: dict[str, float | None]) -> None:
    verdicts = [f"{name}>={target:g} " + ("n/a" if figures[name] is None else "met" if figures[name] >= target
                                          else "MISSED") for name, target in TARGETS.items()]
    print("targets: " + ", ".join(verdicts))


def explain_failures(model: str, failures: dict[str, str]) -> bool:
    """Prints why servers did not start (each is a failure of the run); True when any did not."""
    for name, failure in failures.items():
        print(f"{model}: {name} failed to start: {failure}")
    return bool(failures)


# -- command line ------------------------------------------------------------------------------


def parse_settings(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None, help="comma-separated models to serve (default mlp,cnn; quick mlp)")
    parser.add_argument("--requests", type=int, default=None, help="timed requests per load thread (default 300; quick 10)")
    parser.add_argument("--seconds", type=float, default=None, help="time cap of one load run (default 5; quick 2)")
    parser.add_argument("--warmup-requests", type=int, default=None, help="untimed requests per thread first (default 20; quick 2)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every server, interleaved (default 3; quick 1)")
    parser.add_argument("--startup-seconds", type=float, default=120.0, help="how long a server may take to answer (default 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny model and counts, for the smoke test")
    parser.add_argument("--no-fastapi", action="store_true", help="skip the FastAPI/uvicorn anchor")
    parser.add_argument("--fastapi-endpoint", choices=("def", "async def"), default="def",
                        help="the anchor's endpoint: def (default; runs in the thread pool) or async def (on the loop)")
    parser.add_argument("--max-batch-size", type=int, default=32, help="batching parameters' max_batch_size (default 32)")
    # TF's default and its advice for CPUs: 0 (a batch runs as soon as a batch thread is free, holding what
    # arrived meanwhile). Measured here: 0 gave batching_gain_c8 1.36 and 0.82 at c=1; 500 us gave 1.25 and 0.64.
    parser.add_argument("--batch-timeout-micros", type=int, default=0,
                        help="batching parameters' batch_timeout_micros (default 0, TF's)")
    parser.add_argument("--no-flask", action="store_true", help="skip the Flask anchor")
    arguments = parser.parse_args(argv)
    quick = arguments.quick

    def chosen(value: Any, default: Any, quick_default: Any) -> Any:
        return value if value is not None else quick_default if quick else default

    models = tuple(name.strip() for name in chosen(arguments.models, "mlp,cnn", "mlp").split(","))
    settings = Settings(
        models=models, requests=chosen(arguments.requests, 300, 10), seconds=chosen(arguments.seconds, 5.0, 2.0),
        warmup_requests=chosen(arguments.warmup_requests, 20, 2), rounds=chosen(arguments.rounds, 3, 1),
        startup_seconds=arguments.startup_seconds, seed=arguments.seed, quick=quick,
        fastapi=not arguments.no_fastapi, fastapi_endpoint=arguments.fastapi_endpoint, flask=not arguments.no_flask,
        max_batch_size=arguments.max_batch_size,
        batch_timeout_micros=arguments.batch_timeout_micros,
    )
    unknown = [name for name in settings.models if name not in ("mlp", "cnn")]
    if unknown or not settings.models:
        parser.error(f"--models takes a comma-separated subset of mlp,cnn; received {arguments.models!r}.")
    if settings.requests < 1 or settings.rounds < 1:
        parser.error(f"--requests and --rounds must be at least 1; received {settings.requests} and {settings.rounds}.")
    if settings.max_batch_size < 1 or settings.batch_timeout_micros < 0:
        parser.error(f"--max-batch-size must be at least 1 and --batch-timeout-micros >= 0; received "
                     f"{settings.max_batch_size} and {settings.batch_timeout_micros}.")
    if settings.warmup_requests < 0:
        parser.error(f"--warmup-requests must be >= 0; received {settings.warmup_requests}.")
    if not 0 < settings.seconds <= 600 or settings.startup_seconds <= 0:
        parser.error(f"--seconds must be in (0, 600] and --startup-seconds above 0; received {settings.seconds} and "
                     f"{settings.startup_seconds}.")
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    torch.set_num_threads(1)
    print(f"serving: models {','.join(settings.models)}, concurrency {' and '.join(map(str, CONCURRENCIES))}, "
          f"{settings.requests} requests per thread (cap {settings.seconds:g} s) after {settings.warmup_requests} "
          f"warm-up, {settings.rounds} interleaved round(s), one instance per request, loopback, servers on 1 torch "
          f"thread each, batching max_batch_size {settings.max_batch_size} batch_timeout_micros "
          f"{settings.batch_timeout_micros}, FastAPI endpoint `{settings.fastapi_endpoint}`, no request logging")
    status = 0
    measurements: dict[str, Measurement] = {}
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as directory, \
            _quiet_logs(["torchestimator"]):
        scripts = write_scripts(directory, settings)
        missing = [name for name, wanted in (("fastapi", settings.fastapi), ("flask", settings.flask))
                   if wanted and name not in scripts]
        if missing:
            print(f"note: {', '.join(missing)} not installed (pip install 'torchestimator[bench]'); "
                  "its ratio is n/a")
        for workload in workloads(settings):
            measurement, failures, problems = run_workload(workload, directory, scripts, settings)
            if explain_failures(workload.name, failures):
                status = 1
            print(f"{workload.name}: predictions identical: {'no: ' + '; '.join(problems) if problems else 'yes'}")
            if measurement is None:
                status = 1
                continue
            measurements[workload.name] = measurement
    print_table(measurements)
    if any(measurement.errors(*key) for measurement in measurements.values() for key in measurement.runs):
        print("some requests failed (see the errors column)")
        status = 1
    figures = summarize(measurements) if measurements else dict.fromkeys(
        ("rps_vs_fastapi", "rps_vs_flask", "batching_gain_c8", "p99_ms_c8"))
    print_verdict(figures)
    print(format_figures(figures))
    return status


@contextlib.contextmanager
def _quiet_logs(names: Sequence[str]) -> Iterator[None]:
    """Errors only from these loggers while the benchmark runs, then their levels as they were."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
