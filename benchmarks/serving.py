"""Benchmark: torchestimator's model server against FastAPI on uvicorn and Flask on gunicorn, at 1, 8 and 32 clients.

Every server runs in its own process on 127.0.0.1 and serves the same
exports of the same models (all of them, at /v1/models/<model>:predict): ours (`torchestimator serve`, request batching off
and on), FastAPI written both ways a user would write it (an `async def`
endpoint, inference on the event loop; a `def` endpoint, inference in
Starlette's thread pool) on one uvicorn worker with its fast extras (httptools
parser, uvloop loop) when installed, and Flask on gunicorn (one worker process
like ours, the gthread worker with one thread per core). The anchors are ten
lines around the same `torchestimator.export.load` model (so they get its
direct graph call too) and answer `{"predictions": ...}` like TF Serving's row
format. Every server pins torch to one intra-op thread (OMP_NUM_THREADS=1,
MKL_NUM_THREADS=1), logs no requests, and must give the same predictions for
the same request before anything is timed (the script exits 1 otherwise).

Models: "mlp" (64-256-256-10, a forward of ~0.2 ms: per-request costs
dominate), "cnn" (two conv layers on 28x28, compute-bound: a batch costs
about its rows times a row on one CPU thread) and "wide" (512-1536-1536-1536-10,
~22 MB of weights, several ms per forward at batch 1 and read once per batch,
so batching pays on a CPU as it does for most models on a GPU). The forward
time at batch 1 and 32 is measured and printed first.

Load: C keep-alive connections (C = 1, 8, 32) from one asyncio client in this
process (uvloop when installed; a raw HTTP/1.1 exchange of a pre-encoded
one-instance body, so the client costs little), a few warm-up requests each,
then requests until a time cap. requests/s is completed requests over the
run's wall time; p50/p99 pool every request of every round; CPU is the server
processes' CPU time (user + system, workers included) per request, beside the
client's own. Rounds rotate the servers' order; a ratio is the median over
rounds of two servers' requests/s in the same round, then the geometric mean
over the models named. Load and servers share this machine's cores, equally
for all.

Rounds (the time budget: a full run under 3 minutes, --quick under 1, on 2 shared cores): every server is
started once and serves all the models (ours from a model config file, the anchors from a dict of loaded
models keyed by the path's name), so startup is paid once, not per model. A round is, for each model and
each concurrency, one run of every server: 2 warm-up requests per connection, then 0.4 s timed. The default
is 3 rounds (a median of 3 rather than the mean of 2 long ones: a disturbed run moves it less); --quick is 1
round of 0.25 s on tiny models, the mlp only, for the smoke test.

Why ours trailed FastAPI `def` on the wide model with batching off (0.46 and 0.84 at c=8 in issue 14's two
runs): checked, and not a fault of ours. Every server runs torch on one intra-op thread (the environment
above; torch's inter-op pool is never started by a forward); the threads column shows each server's pools as
the load grew them: ours runs at most its 2 request threads' forwards at once (one per core), FastAPI `def`
one per connection (8 at c=8; Starlette's limit is 40), each on one torch thread, so neither oversubscribes
the other's way. Per request our server spends no more CPU than FastAPI `def` (2.3-3.3 ms against 2.8-3.6 ms
on a ~2.1 ms forward, probes of 4 interleaved rounds), logs nothing and observes two metrics. What moved the
figure was the machine: on a shared 2-core machine a 1-second run of one server swings 2x between rounds, and
the median of two rounds is their mean. Hence cpu_vs_fastapi (CPU per request, which other processes disturb
far less than wall time) beside the rate ratios, and more, shorter rounds. One effect remains open: on the
busy machine (load 6-10) the wide model's requests/s rises with forwards in flight (5 interleaved rounds at
c=8/32: FastAPI `def` above ours in 9 of 10 pairs, ours at --request-threads 4 above ours at 2 in 8 of 10, at
equal CPU per request), while the default's own measurement (one thread per core beat three per core on the
small MLP) favours fewer; --request-threads N runs ours with N request threads so a quiet machine can decide.

Where a request's time went (issue 14; py-spy of our server at c=8 on the mlp, 2 shared cores): with every
forward in a request thread the server spent ~620-800 us of CPU per request, of which the forward (graph call
and its checks) ~100 us, parse and encode ~40 us, and the hop to the thread and back (executor submit, the
worker's wake-up, call_soon_threadsafe's self-pipe write and the loop's wake-up, the GIL passed back and forth)
~160 us; the rest is aiohttp (parsing, routing, the response) and the socket calls. Now a model whose forward,
measured at load on a batch of one, times the request's rows is at most 1 ms runs on the event loop (as FastAPI
`async def` does; slower models keep the threads so the loop stays responsive), the loop is uvloop when
installed, and answers are encoded by orjson: ~470 us per request, against ~650-800 us for FastAPI async in the
same runs. The mlp and the cnn (0.5 ms at batch 1) run inline, the wide model (2.2 ms) in threads.

Run:  python benchmarks/serving.py [--seconds S] [--rounds R] [--models mlp,cnn,wide] [--quick]
Last line:  serving rps_vs_fastapi=<ours / the faster FastAPI, c=8> rps_vs_flask=<c=8> batching_gain_c8=<mlp>
            p99_ms_c8=<batching> batching_gain_c32=<mlp> big_batching_gain_c8=<wide> big_batching_gain_c32=<wide>
            p99_ms_c32_batching=<ms> p99_ms_c32_plain=<ms> cpu_vs_fastapi=<the leaner FastAPI's server CPU per
            request over ours, c=8>    (p99s: the worst over the models; ratios: geometric mean over the models)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import itertools
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te
from torchestimator.export import PredictOutput, TensorSpec, export_saved_model, load, serving_input_receiver
from torchestimator.serving.event_loop import loop_name
from torchestimator.serving.settings import DEFAULT_INLINE_FORWARD_MICROS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the helper beside this script, however it is loaded
from _serving_load import (  # re-exported: the smoke tests and other scripts use them from here
    Measurement,
    Run,  # noqa: F401
    free_port,
    post_once,
    process_tree_cpu_seconds,
    process_tree_threads,
    run_load,
)

TARGETS = {"rps_vs_fastapi": 1.2, "big_batching_gain_c32": 2.0}
CONCURRENCIES = (1, 8, 32)
CLASSES = 10
BIG_MODEL = "wide"
MODELS = ("mlp", "cnn", "wide")
# TF Serving's BatchingParameters in protobuf text format, as --batching_parameters_file reads it.
BATCHING_PARAMETERS = (
    "max_batch_size {{ value: {max_batch_size} }}\nbatch_timeout_micros {{ value: {timeout} }}\n"
    "max_enqueued_batches {{ value: 100 }}\nnum_batch_threads {{ value: 1 }}\n"
)
SERVER_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
FLASK_THREADS = os.cpu_count() or 1
"""gunicorn's gthread worker threads: one per core, as our server's default request threads."""

# The anchors: what a user writes in ten lines around the same loaded model.
# Each serves every model at once (argv: port, then name=base pairs), as ours does from its model config file.
FASTAPI_APP = """
import importlib.util, sys, numpy as np, uvicorn
from fastapi import FastAPI
from torchestimator.export import load
models = {name: load(base) for name, base in (pair.split("=", 1) for pair in sys.argv[2:])}
app = FastAPI()

@app.post("/v1/models/{name}:predict")
{endpoint} predict(name: str, body: dict):
    outputs = models[name](np.asarray(body["instances"], dtype=np.float32))
    return {"predictions": outputs["probabilities"].tolist()}

fast = {"loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": "httptools" if importlib.util.find_spec("httptools") else "h11"}
print("uvicorn", fast, flush=True)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), workers=1, access_log=False, log_level="warning", **fast)
"""
FLASK_APP = """
import numpy as np
from flask import Flask, jsonify, request
from torchestimator.export import load

def create_app(bases):
    models = {name: load(base) for name, base in bases.items()}
    app = Flask(__name__)

    @app.post("/v1/models/<name>:predict")
    def predict(name):
        outputs = models[name](np.asarray(request.get_json()["instances"], dtype=np.float32))
        return jsonify(predictions=outputs["probabilities"].tolist())

    return app
"""
ANCHORS = ("fastapi_async", "fastapi_def", "flask")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """One model, exported once and served by every server."""

    name: str
    """Short name used in the output ("mlp", "cnn", "wide")."""
    build_model: Callable[[], nn.Module]
    """Builds the model with random weights."""
    example_shape: tuple[int, ...]
    """Shape of one instance (without the batch dimension)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What the command line chose."""

    models: tuple[str, ...]
    requests: int
    """Most timed requests per connection in one run (after the warm-up)."""
    seconds: float
    """Time cap of one run; a run stops at its count or this, whichever comes first."""
    warmup_requests: int
    """Untimed requests per connection before each run."""
    rounds: int
    startup_seconds: float
    """How long a server may take to answer its first request."""
    seed: int
    quick: bool
    fastapi: bool
    flask: bool
    request_threads: int | None
    """Our server's --rest_api_num_threads (None: its default, one per core)."""
    max_batch_size: int
    batch_timeout_micros: int
    """The batching parameters file's fields (the others: max_enqueued_batches 100, num_batch_threads 1)."""


class ServerFailed(RuntimeError):
    """A server process exited or never answered; the message holds the end of its log."""


# -- models and export -----------------------------------------------------------


def small_mlp(features: int = 64, hidden: int = 256, layers: int = 2) -> nn.Module:
    sizes = [features] + [hidden] * layers
    body = [module for before, after in itertools.pairwise(sizes) for module in (nn.Linear(before, after), nn.ReLU())]
    return nn.Sequential(*body, nn.Linear(hidden, CLASSES))


def small_cnn(side: int = 28, channels: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * (side // 4) ** 2, CLASSES),
    )


def workloads(settings: Settings) -> list[Workload]:
    if settings.quick:  # tiny models so the smoke test spends its time starting servers, not computing
        available = [
            Workload(name="mlp", build_model=lambda: small_mlp(8, 16), example_shape=(8,)),
            Workload(name="cnn", build_model=lambda: small_cnn(8, 4), example_shape=(1, 8, 8)),
            Workload(name="wide", build_model=lambda: small_mlp(16, 64, 3), example_shape=(16,)),
        ]
    else:
        available = [
            Workload(name="mlp", build_model=small_mlp, example_shape=(64,)),
            Workload(name="cnn", build_model=small_cnn, example_shape=(1, 28, 28)),
            Workload(name="wide", build_model=lambda: small_mlp(512, 1536, 3), example_shape=(512,)),
        ]
    return [workload for workload in available if workload.name in settings.models]


def forward_ms(base: str, example_shape: tuple[int, ...], rows: int, repeats: int = 20) -> float:
    """Median milliseconds of one ExportedModel call at `rows` rows (one torch thread, as the servers)."""
    model = load(base)
    batch = np.random.default_rng(0).standard_normal((rows, *example_shape)).astype(np.float32)
    model(batch)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        model(batch)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def _model_fn(model: nn.Module, features: dict[str, torch.Tensor], labels: Any, mode: str) -> te.EstimatorSpec:
    logits = model(features["x"])
    probabilities = logits.softmax(-1)
    if mode == te.ModeKeys.PREDICT:
        # One output, so TF Serving's row format answers a plain list per instance, as the anchors do.
        return te.EstimatorSpec(
            mode,
            predictions={"probabilities": probabilities},
            export_outputs={"serving_default": PredictOutput({"probabilities": probabilities})},
        )
    return te.EstimatorSpec(mode, predictions={"probabilities": probabilities}, loss=F.cross_entropy(logits, labels))


def export_workload(workload: Workload, directory: str, seed: int) -> str:
    """Trains one step (the exporter needs a checkpoint) and exports to `directory/<name>/<version>`; returns the base."""
    generator = np.random.default_rng(seed)
    features = generator.standard_normal((16, *workload.example_shape)).astype(np.float32)
    labels = generator.integers(0, CLASSES, 16).astype(np.int64)
    config = te.RunConfig(
        random_seed=seed, log_step_count_steps=None, save_summary_steps=None, progress_bar=False, device="cpu"
    )
    estimator = te.Estimator(
        model_fn=_model_fn,
        model=workload.build_model,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=1e-3),
        model_dir=os.path.join(directory, f"{workload.name}-model"),
        config=config,
    )
    estimator.train(
        te.numpy_input_fn({"x": features}, labels, batch_size=8, num_epochs=None, shuffle=False), max_steps=1
    )
    base = os.path.join(directory, workload.name)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, *workload.example_shape), dtype=torch.float32)})
    export_saved_model(estimator, base, receiver)
    return base


# -- server processes ---------------------------------------------------------------


def predict_path(model: str) -> str:
    return f"/v1/models/{model}:predict"


def write_model_config(directory: str, bases: dict[str, str]) -> str:
    """TF's model config file (text format) serving every model at once; returns its path."""
    path = os.path.join(directory, "models.config")
    entries = "".join(
        f"  config {{ name: {json.dumps(name)} base_path: {json.dumps(base)} }}\n" for name, base in bases.items()
    )
    with open(path, "w") as file:
        file.write(f"model_config_list {{\n{entries}}}\n")
    return path


def server_commands(
    bases: dict[str, str], scripts: dict[str, str], model_config: str, request_threads: int | None = None
) -> dict[str, tuple[list[str], int]]:
    """(command line, port) of each server, keyed by the name used in the output; each serves every model."""
    commands = {}
    threads = [] if request_threads is None else ["--rest_api_num_threads", str(request_threads)]
    for name in ("ours", "ours_batching"):
        port = free_port()
        commands[name] = (
            [
                sys.executable,
                "-m",
                "torchestimator.cli",
                "serve",
                "--model_config_file",
                model_config,
                "--rest_api_port",
                str(port),
                *threads,
            ],
            port,
        )
    commands["ours_batching"][0].extend(["--enable_batching", "--batching_parameters_file", scripts["batching"]])
    pairs = [f"{name}={base}" for name, base in bases.items()]
    for name in ("fastapi_async", "fastapi_def"):
        if name in scripts:
            port = free_port()
            commands[name] = ([sys.executable, scripts[name], str(port), *pairs], port)
    if "flask" in scripts:
        port = free_port()
        folder, module = os.path.split(scripts["flask"])
        commands["flask"] = (
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--workers",
                "1",
                "--worker-class",
                "gthread",
                "--threads",
                str(FLASK_THREADS),
                "--bind",
                f"127.0.0.1:{port}",
                "--chdir",
                folder,
                "--log-level",
                "warning",
                f"{module.removesuffix('.py')}:create_app({bases!r})",
            ],
            port,
        )
    return commands


class Server:
    """A server in its own process; `stop` ends it (terminate, then kill) and is safe to call twice."""

    def __init__(self, name: str, command: list[str], port: int, log_path: str) -> None:
        self.name, self.command, self.port, self.log_path = name, command, port, log_path
        with open(log_path, "wb") as log:
            # Its own session: Ctrl-C reaches only this script, whose `finally` then stops the server.
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **SERVER_ENVIRONMENT},
                start_new_session=True,
            )

    def log_tail(self, characters: int = 1500) -> str:
        with open(self.log_path, "rb") as log:
            return log.read().decode(errors="replace")[-characters:]

    def wait_ready(self, path: str, body: bytes, deadline: float) -> bytes:
        """Polls with a predict request until it answers 200; returns that answer's body."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerFailed(f"{self.name} exited with status {self.process.returncode}:\n{self.log_tail()}")
            try:
                status, answer = post_once(self.port, path, body, timeout=5)
                if status == 200:
                    return answer
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)
        raise ServerFailed(f"{self.name} did not answer {path} with 200 in time:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the server's process and its children (gunicorn's worker), NaN if unknown."""
        return process_tree_cpu_seconds(self.process.pid)

    def threads(self) -> int:
        """Threads of the server's process and its children now (0 where /proc is missing)."""
        return process_tree_threads(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


@contextlib.contextmanager
def running_servers(
    commands: dict[str, tuple[list[str], int]], path: str, body: bytes, directory: str, startup_seconds: float
) -> Iterator[tuple[dict[str, Server], dict[str, bytes], dict[str, str]]]:
    """Starts all servers at once; yields (the ones that answered `body` at `path`, those answers, why the others
    failed)."""
    servers = {
        name: Server(name, command, port, os.path.join(directory, f"{name}.log"))
        for name, (command, port) in commands.items()
    }
    try:
        answers, failures = {}, {}
        deadline = time.monotonic() + startup_seconds
        for name, server in servers.items():
            try:
                answers[name] = server.wait_ready(path, body, deadline)
            except ServerFailed as failure:
                failures[name] = str(failure)
                server.stop()
        yield {name: servers[name] for name in answers}, answers, failures
    finally:
        for server in servers.values():
            server.stop()


def measure(servers: dict[str, Server], path: str, body: bytes, settings: Settings) -> Measurement:
    names = list(servers)
    measurement = Measurement(runs={(name, concurrency): [] for name in names for concurrency in CONCURRENCIES})
    for round_index in range(settings.rounds):
        shift = round_index % len(names)
        for concurrency in CONCURRENCIES:
            for name in names[shift:] + names[:shift]:
                server = servers[name]
                measurement.runs[name, concurrency].append(
                    run_load(
                        server.port,
                        body,
                        concurrency,
                        settings,
                        path=path,
                        cpu_seconds=server.cpu_seconds,
                        threads=server.threads,
                    )
                )
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
            problems.append(
                f"{name} predicted {predictions.ravel()[:4].tolist()}..., the model {expected.ravel()[:4].tolist()}..."
            )
    return problems


# -- one workload ------------------------------------------------------------------------


def write_scripts(directory: str, settings: Settings) -> dict[str, str]:
    """The batching parameters file and the anchor apps whose packages import."""
    scripts = {"batching": os.path.join(directory, "batching_parameters.txt")}
    contents = {
        "batching": BATCHING_PARAMETERS.format(
            max_batch_size=settings.max_batch_size, timeout=settings.batch_timeout_micros
        )
    }
    if settings.fastapi and have_packages("fastapi", "uvicorn"):
        for name, endpoint in (("fastapi_async", "async def"), ("fastapi_def", "def")):
            scripts[name] = os.path.join(directory, f"{name}_app.py")
            contents[name] = FASTAPI_APP.replace("{endpoint}", endpoint)
    if settings.flask and have_packages("flask", "gunicorn"):
        scripts["flask"], contents["flask"] = os.path.join(directory, "flask_app.py"), FLASK_APP
    for name, path in scripts.items():
        with open(path, "w") as file:
            file.write(contents[name])
    return scripts


def have_packages(*names: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in names)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """One exported model: where it lies, the request every client sends and the answer it must get."""

    name: str
    base: str
    body: bytes
    expected: np.ndarray


def prepare_workload(workload: Workload, directory: str, settings: Settings) -> Prepared:
    """Exports the model, prints its forward time, and computes the one-instance request and its answer."""
    base = export_workload(workload, directory, settings.seed)
    print(
        f"{workload.name}: forward through the exported model, one torch thread: "
        f"{forward_ms(base, workload.example_shape, 1):.2f} ms at batch 1, "
        f"{forward_ms(base, workload.example_shape, 32):.2f} ms at batch 32",
        flush=True,
    )
    instance = np.random.default_rng(settings.seed + 1).standard_normal((1, *workload.example_shape)).astype(np.float32)
    expected = load(base)(instance)["probabilities"]
    return Prepared(workload.name, base, json.dumps({"instances": instance.tolist()}).encode(), expected)


def first_answers(servers: dict[str, Server], prepared: Prepared) -> dict[str, bytes]:
    """Each server's answer to the model's request (an unreachable server's error text, which then fails the check)."""
    answers = {}
    for name, server in servers.items():
        try:
            answers[name] = post_once(server.port, predict_path(prepared.name), prepared.body, timeout=30)[1]
        except OSError as error:
            answers[name] = f"no answer: {error}".encode()
    return answers


def serve_and_measure(
    prepared: list[Prepared], directory: str, scripts: dict[str, str], settings: Settings
) -> tuple[dict[str, Measurement], bool]:
    """Starts every server once for all models, checks each model's answers, measures; (measurements, all well)."""
    bases = {model.name: model.base for model in prepared}
    commands = server_commands(bases, scripts, write_model_config(directory, bases), settings.request_threads)
    logs = os.path.join(directory, "logs")
    os.makedirs(logs)
    measurements, healthy = {}, True
    first = prepared[0]
    with running_servers(commands, predict_path(first.name), first.body, logs, settings.startup_seconds) as (
        servers,
        _,
        failures,
    ):
        healthy = not explain_failures("servers", failures)
        for model in prepared:
            problems = check_predictions(first_answers(servers, model), model.expected)
            if "ours" not in servers:
                problems.append("our server did not start (see above)")
            print(
                f"{model.name}: predictions identical: {'no: ' + '; '.join(problems) if problems else 'yes'}",
                flush=True,
            )
            if problems:
                healthy = False
                continue
            measurements[model.name] = measure(servers, predict_path(model.name), model.body, settings)
    return measurements, healthy


# -- report ---------------------------------------------------------------------------------

SERVERS = ("ours", "ours_batching", "fastapi_async", "fastapi_def", "flask")
FIGURES = (
    "rps_vs_fastapi",
    "rps_vs_flask",
    "batching_gain_c8",
    "p99_ms_c8",
    "batching_gain_c32",
    "big_batching_gain_c8",
    "big_batching_gain_c32",
    "p99_ms_c32_batching",
    "p99_ms_c32_plain",
    "cpu_vs_fastapi",
)


def print_table(measurements: dict[str, Measurement]) -> None:
    print(
        f"{'model':<6} {'conc':>4}  {'server':<14} {'requests/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'srv cpu us/req':>14} {'load cpu us/req':>15} {'errors':>6} {'threads':>7}"
    )
    for model, measurement in measurements.items():
        for concurrency in CONCURRENCIES:
            for server in SERVERS:
                if (server, concurrency) not in measurement.runs:
                    continue
                print(
                    f"{model:<6} {concurrency:>4}  {server:<14} {measurement.rate(server, concurrency):>10.0f} "
                    f"{measurement.latency_ms(server, concurrency, 0.50):>8.2f} "
                    f"{measurement.latency_ms(server, concurrency, 0.99):>8.2f} "
                    f"{measurement.cpu_us_per_request(server, concurrency):>14.0f} "
                    f"{measurement.cpu_us_per_request(server, concurrency, 'client'):>15.0f} "
                    f"{measurement.errors(server, concurrency):>6} {measurement.threads(server, concurrency):>7}"
                )


def geometric_mean(values: Sequence[float]) -> float | None:
    if not values or not all(value > 0 and math.isfinite(value) for value in values):
        return None
    return math.exp(sum(math.log(value) for value in values) / len(values))


def _ratio(
    measurement: Measurement, server: str, references: Sequence[str], concurrency: int, kind: str = "rate"
) -> float | None:
    """Requests/s over the faster reference ("rate") or the leanest reference's CPU per request over ours ("cpu")."""
    if (server, concurrency) not in measurement.runs or not any(
        (name, concurrency) in measurement.runs for name in references
    ):
        return None
    if kind == "cpu":
        return measurement.cpu_efficiency_ratio(server, references, concurrency)
    return measurement.fastest_ratio(server, references, concurrency)


def summarize(measurements: dict[str, Measurement]) -> dict[str, float | None]:
    """Prints each model's ratios; returns the final line's figures (None where a side is missing)."""
    rows = {
        "ours/fastest fastapi": ("ours", ("fastapi_async", "fastapi_def")),
        "ours/fastapi async": ("ours", ("fastapi_async",)),
        "ours/fastapi def": ("ours", ("fastapi_def",)),
        "ours/flask": ("ours", ("flask",)),
        "batching gain": ("ours_batching", ("ours",)),
        "ours_batching/fastest fastapi": ("ours_batching", ("fastapi_async", "fastapi_def")),
    }
    for model, measurement in measurements.items():
        parts = []
        for label, (server, references) in rows.items():
            values = [_ratio(measurement, server, references, concurrency) for concurrency in CONCURRENCIES]
            parts.append(f"{label} " + "/".join("n/a" if value is None else f"{value:.2f}" for value in values))
        print(
            f"{model}: requests/s ratios at c={'/'.join(map(str, CONCURRENCIES))} (median over rounds): "
            + ", ".join(parts)
        )
        lean = [
            _ratio(measurement, "ours", ("fastapi_async", "fastapi_def"), concurrency, "cpu")
            for concurrency in CONCURRENCIES
        ]
        print(
            f"{model}: server CPU per request, the leaner FastAPI's over ours at c="
            f"{'/'.join(map(str, CONCURRENCIES))}: "
            + "/".join("n/a" if value is None else f"{value:.2f}" for value in lean)
        )

    def over_models(
        server: str, references: Sequence[str], concurrency: int, models: Sequence[str], kind: str = "rate"
    ) -> float | None:
        values = [
            _ratio(measurements[model], server, references, concurrency, kind)
            for model in models
            if model in measurements
        ]
        return geometric_mean(values) if values and None not in values else None

    small = [model for model in measurements if model != BIG_MODEL]
    fastapi = ("fastapi_async", "fastapi_def")
    figures: dict[str, float | None] = {
        "rps_vs_fastapi": over_models("ours", fastapi, 8, list(measurements)),
        "rps_vs_flask": over_models("ours", ("flask",), 8, list(measurements)),
        "batching_gain_c8": over_models("ours_batching", ("ours",), 8, ["mlp"]),
        "p99_ms_c8": _worst_p99(measurements, "ours_batching", 8),
        "batching_gain_c32": over_models("ours_batching", ("ours",), 32, ["mlp"]),
        "big_batching_gain_c8": over_models("ours_batching", ("ours",), 8, [BIG_MODEL]),
        "big_batching_gain_c32": over_models("ours_batching", ("ours",), 32, [BIG_MODEL]),
        "p99_ms_c32_batching": _worst_p99(measurements, "ours_batching", 32),
        "p99_ms_c32_plain": _worst_p99(measurements, "ours", 32),
        "cpu_vs_fastapi": over_models("ours", fastapi, 8, list(measurements), "cpu"),
    }
    if "mlp" not in measurements and small:  # --models without mlp: the small models' figures
        figures["batching_gain_c8"] = over_models("ours_batching", ("ours",), 8, small)
        figures["batching_gain_c32"] = over_models("ours_batching", ("ours",), 32, small)
    return figures


def _worst_p99(measurements: dict[str, Measurement], server: str, concurrency: int) -> float | None:
    tails = [
        measurement.latency_ms(server, concurrency, 0.99)
        for measurement in measurements.values()
        if (server, concurrency) in measurement.runs
    ]
    return max(tails) if tails and len(tails) == len(measurements) else None


def format_figures(figures: dict[str, float | None]) -> str:
    def text(name: str, value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return "n/a"
        return f"{value:.2f}" if name.startswith("p99_ms") else f"{value:.3f}"

    return "serving " + " ".join(f"{name}={text(name, value)}" for name, value in figures.items())


def print_verdict(figures: dict[str, float | None]) -> None:
    verdicts = [
        f"{name}>={target:g} "
        + ("n/a" if figures.get(name) is None else "met" if figures[name] >= target else "MISSED")
        for name, target in TARGETS.items()
    ]
    batching, plain = figures.get("p99_ms_c32_batching"), figures.get("p99_ms_c32_plain")
    verdicts.append(
        "p99_ms_c32_batching<=p99_ms_c32_plain "
        + ("n/a" if batching is None or plain is None else "met" if batching <= plain else "MISSED")
    )
    print("targets: " + ", ".join(verdicts))


def explain_failures(model: str, failures: dict[str, str]) -> bool:
    """Prints why servers did not start (each is a failure of the run); True when any did not."""
    for name, failure in failures.items():
        print(f"{model}: {name} failed to start: {failure}")
    return bool(failures)


# -- command line ------------------------------------------------------------------------------


def parse_settings(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default=None, help="comma-separated models to serve (default mlp,cnn,wide; quick mlp)"
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=None,
        help="most timed requests per connection in one run (default 100000; quick 2000)",
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="time cap of one load run (default 0.4; quick 0.25)"
    )
    parser.add_argument(
        "--warmup-requests", type=int, default=None, help="untimed requests per connection first (default 2; quick 1)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of every server, interleaved (default 3; quick 1)"
    )
    parser.add_argument(
        "--startup-seconds", type=float, default=120.0, help="how long a server may take to answer (default 120)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny model and counts, for the smoke test")
    parser.add_argument("--no-fastapi", action="store_true", help="skip the FastAPI/uvicorn anchors")
    parser.add_argument(
        "--max-batch-size", type=int, default=32, help="batching parameters' max_batch_size (default 32)"
    )
    # TF's default and its advice for CPUs: 0 (a batch runs as soon as a batch thread is free, holding what
    # arrived meanwhile), so a lone request never waits for company.
    parser.add_argument(
        "--batch-timeout-micros",
        type=int,
        default=0,
        help="batching parameters' batch_timeout_micros (default 0, TF's)",
    )
    parser.add_argument("--no-flask", action="store_true", help="skip the Flask/gunicorn anchor")
    parser.add_argument(
        "--request-threads",
        type=int,
        default=None,
        help="our server's --rest_api_num_threads (default: its own, one per core)",
    )
    arguments = parser.parse_args(argv)
    quick = arguments.quick

    def chosen(value: Any, default: Any, quick_default: Any) -> Any:
        return value if value is not None else quick_default if quick else default

    models = tuple(name.strip() for name in chosen(arguments.models, ",".join(MODELS), "mlp").split(","))
    settings = Settings(
        models=models,
        requests=chosen(arguments.requests, 100_000, 2000),
        seconds=chosen(arguments.seconds, 0.4, 0.25),
        warmup_requests=chosen(arguments.warmup_requests, 2, 1),
        rounds=chosen(arguments.rounds, 3, 1),
        startup_seconds=arguments.startup_seconds,
        seed=arguments.seed,
        quick=quick,
        fastapi=not arguments.no_fastapi,
        flask=not arguments.no_flask,
        max_batch_size=arguments.max_batch_size,
        batch_timeout_micros=arguments.batch_timeout_micros,
        request_threads=arguments.request_threads,
    )
    unknown = [name for name in settings.models if name not in MODELS]
    if unknown or not settings.models:
        parser.error(f"--models takes a comma-separated subset of {','.join(MODELS)}; received {arguments.models!r}.")
    if settings.requests < 1 or settings.rounds < 1:
        parser.error(f"--requests and --rounds must be at least 1; received {settings.requests} and {settings.rounds}.")
    if settings.max_batch_size < 1 or settings.batch_timeout_micros < 0:
        parser.error(
            f"--max-batch-size must be at least 1 and --batch-timeout-micros >= 0; received "
            f"{settings.max_batch_size} and {settings.batch_timeout_micros}."
        )
    if settings.request_threads is not None and settings.request_threads < 1:
        parser.error(f"--request-threads must be at least 1; received {settings.request_threads}.")
    if settings.warmup_requests < 0:
        parser.error(f"--warmup-requests must be >= 0; received {settings.warmup_requests}.")
    if not 0 < settings.seconds <= 600 or settings.startup_seconds <= 0:
        parser.error(
            f"--seconds must be in (0, 600] and --startup-seconds above 0; received {settings.seconds} and "
            f"{settings.startup_seconds}."
        )
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    torch.set_num_threads(1)
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    fast = [name for name in ("httptools", "uvloop", "gunicorn") if have_packages(name)]
    print(
        f"serving: models {','.join(settings.models)}, concurrency {'/'.join(map(str, CONCURRENCIES))}, runs of "
        f"{settings.seconds:g} s after {settings.warmup_requests} warm-up requests per connection, {settings.rounds} "
        f"interleaved round(s), one instance per request, loopback, every server 1 process on 1 torch thread, "
        f"batching max_batch_size {settings.max_batch_size} batch_timeout_micros {settings.batch_timeout_micros} "
        f"num_batch_threads 1, Flask on gunicorn 1 worker x {FLASK_THREADS} threads, installed: "
        f"{', '.join(fast) or 'none of httptools, uvloop, gunicorn'}, no request logging; ours on the "
        f"{loop_name()} loop, forwards up to {DEFAULT_INLINE_FORWARD_MICROS} us (rows x batch-of-one time "
        "measured at load) on the loop, slower ones in its request threads",
        flush=True,
    )
    status = 0
    with tempfile.TemporaryDirectory(prefix="serving-bench-") as directory, _quiet_logs(["torchestimator"]):
        scripts = write_scripts(directory, settings)
        missing = [
            name
            for name, wanted in (("fastapi", settings.fastapi), ("flask", settings.flask))
            if wanted and not any(script.startswith(name) for script in scripts)
        ]
        if missing:
            print(
                f"note: {', '.join(missing)} not installed (pip install -r benchmarks/requirements-bench.txt); "
                "its ratio is n/a"
            )
        prepared = [prepare_workload(workload, directory, settings) for workload in workloads(settings)]
        measurements, healthy = serve_and_measure(prepared, directory, scripts, settings)
        if not healthy:
            status = 1
    print_table(measurements)
    if any(measurement.errors(*key) for measurement in measurements.values() for key in measurement.runs):
        print("some requests failed (see the errors column)")
        status = 1
    figures = summarize(measurements) if measurements else dict.fromkeys(FIGURES)
    print_verdict(figures)
    print(
        f"benchmark took {time.perf_counter() - wall_started:.0f} s wall, {time.process_time() - cpu_started:.0f} s "
        "CPU in this process (the load and the exports)"
    )
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
