"""Benchmark: how long torchestimator takes to start, against `import torch` alone, and a server's time to AVAILABLE.

What a user waits for before anything happens: `import torchestimator` (a
script's first line), `torchestimator --help` (the first command anyone types),
and `torchestimator serve` until it prints "serving NAME (version N AVAILABLE)
at URL" (the moment a client may send its first request). The anchor is
`import torch`, measured in the same run: torchestimator cannot start faster
than the library it is built on, and the ratios say how much it adds.

Method: every measurement is a fresh `python` process (sys.executable), its
output discarded, timed on the wall clock from start to exit. A first round is
run and dropped (it fills the OS file cache); then each round runs every
command once, in an order that rotates from round to round, so a change in
the machine's load touches all of them alike. A ratio is the median over
rounds of the two commands' times in the same round; the times printed are
medians over rounds. The server: a one-layer model is exported once (not
timed); each round starts `torchestimator serve --model_name m
--model_base_path DIR --rest_api_port PORT` on a free loopback port, times
until the line appears on its standard output, checks that the status URL
then answers AVAILABLE, and stops the server.

Run:  python benchmarks/startup.py [--rounds N] [--quick] [--no-serve] [--startup-seconds S]
Last line:  startup import_vs_torch=<ratio> help_vs_torch=<ratio> serve_available_s=<seconds>
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence

TARGETS = {"import_vs_torch": 1.3, "help_vs_torch": 1.3}
"""Issue 13: `import torchestimator` and `torchestimator --help` within 1.3x of `import torch` alone."""
MODEL_NAME = "m"
SERVER_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What the command line chose."""

    rounds: int
    """Timed rounds (after the dropped warm-up round)."""
    serve: bool
    """Also time the server to AVAILABLE."""
    startup_seconds: float
    """How long one command or server may take before the run fails."""


class StartupFailed(RuntimeError):
    """A command exited with an error, or the server did not announce itself in time."""


# -- the commands ------------------------------------------------------------------------------


def help_command() -> list[str]:
    """`torchestimator --help` as installed (the console script next to this python), else `python -m`."""
    script = shutil.which("torchestimator", path=os.path.dirname(sys.executable))
    return [script, "--help"] if script else [sys.executable, "-m", "torchestimator", "--help"]


def commands() -> dict[str, list[str]]:
    return {
        "torch": [sys.executable, "-c", "import torch"],
        "import": [sys.executable, "-c", "import torchestimator"],
        "help": help_command(),
    }


def time_command(name: str, command: list[str], timeout: float) -> float:
    """Seconds from start to exit of a fresh process running `command`."""
    started = time.perf_counter()
    completed = subprocess.run(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        raise StartupFailed(
            f"{name} ({' '.join(command)}) exited with status {completed.returncode}:\n"
            f"{completed.stderr.decode(errors='replace')[-1500:]}"
        )
    return elapsed


# -- the server --------------------------------------------------------------------------------


def export_tiny_model(directory: str) -> str:
    """Trains one step of a one-layer model (an export needs a checkpoint) and exports it; returns the base folder."""
    # Imported here: with --no-serve this process never needs torch, and the timed processes are others.
    import numpy as np
    import torch
    import torch.nn.functional as F

    import torchestimator as te
    from torchestimator.export import export_saved_model, serving_input_receiver

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"probabilities": logits.softmax(-1)})
        return te.EstimatorSpec(
            mode, predictions={"probabilities": logits.softmax(-1)}, loss=F.cross_entropy(logits, labels)
        )

    generator = np.random.default_rng(0)
    features = generator.standard_normal((16, 8)).astype(np.float32)
    labels = generator.integers(0, 3, 16).astype(np.int64)
    config = te.RunConfig(
        random_seed=0, log_step_count_steps=None, save_summary_steps=None, progress_bar=False, device="cpu"
    )
    logger = logging.getLogger("torchestimator")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the benchmark's output is its table; restored below
    try:
        estimator = te.Estimator(
            model_fn=model_fn,
            model=lambda: torch.nn.Linear(8, 3),
            optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
            model_dir=os.path.join(directory, "model"),
            config=config,
        )
        estimator.train(
            te.numpy_input_fn({"x": features}, labels, batch_size=8, num_epochs=None, shuffle=False), max_steps=1
        )
        base = os.path.join(directory, "export")
        receiver = serving_input_receiver({"x": te.export.TensorSpec(shape=(None, 8), dtype=torch.float32)})
        export_saved_model(estimator, base, receiver)
    finally:
        logger.setLevel(level)
    return base


def free_port() -> int:
    """A port nothing listens on now (the OS picks it); the server binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_command(base: str, port: int) -> list[str]:
    script = shutil.which("torchestimator", path=os.path.dirname(sys.executable))
    prefix = [script] if script else [sys.executable, "-m", "torchestimator"]
    return [*prefix, "serve", "--model_name", MODEL_NAME, "--model_base_path", base, "--rest_api_port", str(port)]


def _forward_lines(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)  # the server closed its output: it exited


def time_server(base: str, log_path: str, timeout: float) -> float:
    """Seconds from starting `torchestimator serve` until its "serving m (version N AVAILABLE)" line."""
    port = free_port()
    command = serve_command(base, port)
    with open(log_path, "ab") as log:
        started = time.perf_counter()
        # Its own session: Ctrl-C reaches only this script, whose `finally` then stops the server.
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **SERVER_ENVIRONMENT},
            start_new_session=True,
        )
    try:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_forward_lines, args=(process.stdout, lines), daemon=True).start()
        announced = f"serving {MODEL_NAME} ("
        deadline = started + timeout
        while True:
            remaining = deadline - time.perf_counter()
            try:
                line = lines.get(timeout=max(remaining, 0.0))
            except queue.Empty:
                raise StartupFailed(
                    f"the server printed no '{announced}...' line in {timeout:g} s "
                    f"({' '.join(command)}); its log ends:\n{log_tail(log_path)}"
                ) from None
            if line is None:
                raise StartupFailed(
                    f"the server exited with status {process.wait(timeout=10)} before it announced "
                    f"itself ({' '.join(command)}); its log ends:\n{log_tail(log_path)}"
                )
            if line.startswith(announced) and "AVAILABLE" in line:
                elapsed = time.perf_counter() - started
                break
        check_available(port, timeout)
        return elapsed
    finally:
        stop(process)


def log_tail(log_path: str, characters: int = 1500) -> str:
    with open(log_path, "rb") as log:
        return log.read().decode(errors="replace")[-characters:]


def check_available(port: int, timeout: float) -> None:
    """The status URL answers right after the line, with the version AVAILABLE (else the line came too early)."""
    url = f"http://127.0.0.1:{port}/v1/models/{MODEL_NAME}"
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        states = [version["state"] for version in json.load(answer)["model_version_status"]]
    if "AVAILABLE" not in states:
        raise StartupFailed(f"{url} answered {states} right after the server announced AVAILABLE")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# -- rounds and figures ------------------------------------------------------------------------


def run_rounds(settings: Settings, base: str | None, log_path: str) -> dict[str, list[float]]:
    """Times of each command per timed round (the warm-up round dropped), in rotating order."""
    timed = commands()
    names = [*timed, *(["serve"] if base is not None else [])]
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(settings.rounds + 1):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if name == "serve":
                seconds = time_server(base, log_path, settings.startup_seconds)
            else:
                seconds = time_command(name, timed[name], settings.startup_seconds)
            if round_index > 0:  # round 0 fills the file cache
                times[name].append(seconds)
    return times


def paired_ratio(times: dict[str, list[float]], name: str, reference: str) -> float:
    return statistics.median(value / anchor for value, anchor in zip(times[name], times[reference]))


def figures_of(times: dict[str, list[float]]) -> dict[str, float | None]:
    serve = times.get("serve")
    return {
        "import_vs_torch": paired_ratio(times, "import", "torch"),
        "help_vs_torch": paired_ratio(times, "help", "torch"),
        "serve_available_s": statistics.median(serve) if serve else None,
    }


def print_times(times: dict[str, list[float]], rounds: int) -> None:
    labels = {
        "torch": "import torch",
        "import": "import torchestimator",
        "help": "torchestimator --help",
        "serve": "torchestimator serve to AVAILABLE",
    }
    print(f"median over {rounds} round(s), seconds (min-max):")
    for name, values in times.items():
        print(f"  {labels[name]:<34} {statistics.median(values):7.3f}  ({min(values):.3f}-{max(values):.3f})")


def format_figures(figures: dict[str, float | None]) -> str:
    def text(name: str, value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return "n/a"
        return f"{value:.2f}" if name == "serve_available_s" else f"{value:.3f}"

    return "startup " + " ".join(f"{name}={text(name, value)}" for name, value in figures.items())


def print_verdict(figures: dict[str, float | None]) -> None:
    verdicts = [
        f"{name}<={target:g} " + ("n/a" if figures[name] is None else "met" if figures[name] <= target else "MISSED")
        for name, target in TARGETS.items()
    ]
    print("targets: " + ", ".join(verdicts))


# -- command line ------------------------------------------------------------------------------


def parse_settings(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds, interleaved (default 7; quick 3)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, for a quick look")
    parser.add_argument("--no-serve", action="store_true", help="skip the server (serve_available_s=n/a)")
    parser.add_argument(
        "--startup-seconds",
        type=float,
        default=120.0,
        help="how long one command or server start may take (default 120)",
    )
    arguments = parser.parse_args(argv)
    rounds = arguments.rounds if arguments.rounds is not None else 3 if arguments.quick else 7
    if rounds < 1:
        parser.error(f"--rounds must be at least 1; received {rounds}.")
    if not arguments.startup_seconds > 0:
        parser.error(f"--startup-seconds must be above 0; received {arguments.startup_seconds}.")
    return Settings(rounds=rounds, serve=not arguments.no_serve, startup_seconds=arguments.startup_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    print(
        f"startup: {settings.rounds} timed round(s) after one dropped warm-up round, fresh processes of "
        f"{sys.executable}, order rotating; help: {' '.join(help_command())}"
        + ("" if settings.serve else "; server not timed (--no-serve)")
    )
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as directory:
        base = export_tiny_model(directory) if settings.serve else None
        try:
            times = run_rounds(settings, base, os.path.join(directory, "serve.log"))
        except (StartupFailed, subprocess.TimeoutExpired, OSError) as failure:
            print(f"startup: failed: {failure}")
            print(format_figures(dict.fromkeys(("import_vs_torch", "help_vs_torch", "serve_available_s"))))
            return 1
    print_times(times, settings.rounds)
    figures = figures_of(times)
    print_verdict(figures)
    print(format_figures(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
