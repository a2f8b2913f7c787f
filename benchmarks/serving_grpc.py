"""Benchmark: TF Serving's gRPC Predict against the REST :predict of the same server, same model, same request.

One `torchestimator serve --port <gRPC> --rest_api_port <REST>` process (torch on one intra-op thread, batching off,
as benchmarks/serving.py runs ours) serves the small MLP of benchmarks/serving.py (64-256-256-10, a forward of
~0.2 ms, so per-request costs dominate). The load runs in this process, a different one: REST is
_serving_load.py's raw HTTP/1.1 client over C keep-alive connections posting a pre-encoded one-instance
``{"instances": [...]}`` body; gRPC is grpc.aio over C channels (one HTTP/2 connection each) calling
/tensorflow.serving.PredictionService/Predict with a pre-serialized PredictRequest (tensor_content, as
tf.make_tensor_proto writes it). Both clients run on uvloop when installed. Before timing, both answers must
hold the same probabilities (exit 1 otherwise).

Rounds alternate which API goes first; each is, for C = 1 and 8, 2 warm-up calls per connection then a timed
run. requests/s is completed calls over the run's wall time; a ratio is the median over rounds of gRPC's over
REST's in the same round. CPU is the server process's CPU time (user + system) per request, and the client's.

What it showed (2 cores idle, grpcio 1.85.3, uvloop): gRPC ~0.49x REST's requests/s, at ~320-380 us of server
CPU per request against REST's ~150. grpcio's Python server costs 128-162 us per call for an empty handler on
grpc.aio (105-108 us on the threaded grpc.server), and torch work in its handlers several times its own cost
(torch releases the GIL at each op; grpcio's second Python thread takes it): our Predict, ~50-60 us alone, adds
~200-250. The threaded server calling the shared request core was no faster (~400-470 us per call), and
grpcio's blocking stubs in threads as this client gave gRPC 0.36-0.40x instead of grpc.aio's 0.48-0.49x.

Run:  python benchmarks/serving_grpc.py [--seconds S] [--rounds R]      (defaults 2 s, 3 rounds: under a minute)
Last line:  serving_grpc rps_vs_rest=<c=8> rps_vs_rest_c1=<c=1> cpu_vs_rest=<REST server CPU per request over
            gRPC's, c=8; above 1: gRPC costs the server less>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from _serving_load import free_port, post_once, process_tree_cpu_seconds, run_load
from serving import CLASSES, _model_fn, small_mlp  # the mlp and model_fn benchmarks/serving.py serves

import torchestimator as te
from torchestimator.export import TensorSpec, export_saved_model, serving_input_receiver
from torchestimator.serving.protos import serving_protos
from torchestimator.serving.tensor_proto import make_tensor_proto, tensor_proto_to_numpy

FEATURES, HIDDEN = 64, 256
PREDICT = "/tensorflow.serving.PredictionService/Predict"


def export_mlp(directory: str) -> str:
    generator = np.random.default_rng(0)
    features = generator.standard_normal((16, FEATURES)).astype(np.float32)
    labels = generator.integers(0, CLASSES, 16).astype(np.int64)
    config = te.RunConfig(
        random_seed=0, log_step_count_steps=None, save_summary_steps=None, progress_bar=False, device="cpu"
    )
    estimator = te.Estimator(
        model_fn=_model_fn,
        model=lambda: small_mlp(FEATURES, HIDDEN),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=1e-3),
        model_dir=os.path.join(directory, "model"),
        config=config,
    )
    estimator.train(
        te.numpy_input_fn({"x": features}, labels, batch_size=8, num_epochs=None, shuffle=False), max_steps=1
    )
    base = os.path.join(directory, "mlp")
    export_saved_model(estimator, base, serving_input_receiver({"x": TensorSpec(shape=(None, FEATURES))}))
    return base


class Settings:
    """What _serving_load.run_load reads (its LoadSettings): the time cap ends a run, not the request count."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.warmup_requests, self.requests = seconds, 2, 10**7


async def _grpc_load(target: str, body: bytes, concurrency: int, seconds: float, pid: int) -> dict[str, float]:
    import grpc

    channels = [grpc.aio.insecure_channel(target) for _ in range(concurrency)]
    calls = [channel.unary_unary(PREDICT) for channel in channels]  # bytes in, bytes out
    try:
        for call in calls:
            for _ in range(2):
                await call(body, timeout=10)
        done, errors = 0, 0
        server_before, client_before = process_tree_cpu_seconds(pid), time.process_time()
        started = time.perf_counter()
        deadline = started + seconds

        async def worker(call) -> None:
            nonlocal done, errors
            while time.perf_counter() < deadline:
                try:
                    await call(body, timeout=10)
                    done += 1
                except grpc.RpcError:
                    errors += 1

        await asyncio.gather(*(worker(call) for call in calls))
        wall = time.perf_counter() - started
        return {
            "rate": done / wall,
            "done": done,
            "errors": errors,
            "server_cpu": process_tree_cpu_seconds(pid) - server_before,
            "client_cpu": time.process_time() - client_before,
        }
    finally:
        for channel in channels:
            await channel.close()


def grpc_run(target: str, body: bytes, concurrency: int, seconds: float, pid: int) -> dict[str, float]:
    try:
        import uvloop

        return uvloop.run(_grpc_load(target, body, concurrency, seconds, pid))
    except ImportError:
        return asyncio.run(_grpc_load(target, body, concurrency, seconds, pid))


def rest_run(port: int, body: bytes, concurrency: int, seconds: float, pid: int) -> dict[str, float]:
    run = run_load(
        port,
        body,
        concurrency,
        Settings(seconds),
        path="/v1/models/mlp:predict",
        cpu_seconds=lambda: process_tree_cpu_seconds(pid),
    )
    return {
        "rate": run.rate,
        "done": len(run.latencies),
        "errors": run.errors,
        "server_cpu": run.server_cpu,
        "client_cpu": run.client_cpu,
    }


def start_server(base: str, grpc_port: int, rest_port: int) -> subprocess.Popen:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchestimator.cli",
            "serve",
            "--model_name",
            "mlp",
            "--model_base_path",
            base,
            "--port",
            str(grpc_port),
            "--rest_api_port",
            str(rest_port),
            "--file_system_poll_wait_seconds",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=environment,
    )
    line = server.stdout.readline()
    if "gRPC" not in line:
        server.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return server


def same_answers(row: np.ndarray, rest_port: int, grpc_body: bytes, target: str) -> bool:
    import grpc

    status, answer = post_once(
        rest_port, "/v1/models/mlp:predict", json.dumps({"instances": row.tolist()}).encode(), timeout=30
    )
    rest = np.array(json.loads(answer)["predictions"], np.float32)
    with grpc.insecure_channel(target) as channel:
        response = serving_protos().PredictResponse.FromString(channel.unary_unary(PREDICT)(grpc_body, timeout=30))
    ours = tensor_proto_to_numpy(response.outputs["probabilities"])
    return status == 200 and ours.shape == rest.shape and bool(np.allclose(ours, rest, rtol=1e-6, atol=1e-7))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per run (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; ratios are medians over them (default 3)")
    args = parser.parse_args(argv)
    if not args.seconds > 0 or args.rounds < 1:
        parser.error("--seconds must be positive and --rounds at least 1")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="serving_grpc_") as directory:
        base = export_mlp(directory)
        row = np.random.default_rng(1).standard_normal((1, FEATURES)).astype(np.float32)
        request = serving_protos().PredictRequest()
        request.model_spec.name = "mlp"
        request.inputs["x"].CopyFrom(make_tensor_proto(row, tensor_content=True))
        grpc_body = request.SerializeToString()
        rest_body = json.dumps({"instances": row.tolist()}).encode()
        grpc_port, rest_port = free_port(), free_port()
        server = start_server(base, grpc_port, rest_port)
        target = f"127.0.0.1:{grpc_port}"
        try:
            if not same_answers(row, rest_port, grpc_body, target):
                print("gRPC and REST answers differ; nothing timed")
                return 1
            runs: dict[tuple[str, int], list[dict[str, float]]] = {}
            for round_index in range(args.rounds):
                for concurrency in (1, 8):
                    order = ("rest", "grpc") if round_index % 2 == 0 else ("grpc", "rest")
                    for api in order:
                        run = (
                            rest_run(rest_port, rest_body, concurrency, args.seconds, server.pid)
                            if api == "rest"
                            else grpc_run(target, grpc_body, concurrency, args.seconds, server.pid)
                        )
                        runs.setdefault((api, concurrency), []).append(run)
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"{'api':5} {'c':>2} {'req/s':>8} {'server CPU us/req':>18} {'client CPU us/req':>18} {'errors':>6}")
    for (api, concurrency), measured in sorted(runs.items(), key=lambda item: (item[0][1], item[0][0])):
        done = sum(run["done"] for run in measured)
        print(
            f"{api:5} {concurrency:>2} {statistics.median(run['rate'] for run in measured):>8.0f} "
            f"{sum(run['server_cpu'] for run in measured) / done * 1e6:>18.0f} "
            f"{sum(run['client_cpu'] for run in measured) / done * 1e6:>18.0f} "
            f"{sum(run['errors'] for run in measured):>6}"
        )

    def ratio(concurrency: int) -> float:
        pairs = zip(runs["grpc", concurrency], runs["rest", concurrency])
        return statistics.median(g["rate"] / r["rate"] if r["rate"] else math.nan for g, r in pairs)

    def cpu_per_request(api: str) -> float:
        measured = runs[api, 8]
        return sum(run["server_cpu"] for run in measured) / max(1, sum(run["done"] for run in measured))

    print(f"({time.perf_counter() - began:.0f} s)")
    print(
        f"serving_grpc rps_vs_rest={ratio(8):.3f} rps_vs_rest_c1={ratio(1):.3f} "
        f"cpu_vs_rest={cpu_per_request('rest') / cpu_per_request('grpc'):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
