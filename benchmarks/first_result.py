"""Benchmark: where the digits demo's time goes, from a fresh interpreter to a server answering.

The demo (``torchestimator.cli.demo.run``: train_and_evaluate with early stopping, the best checkpoint kept,
best and final exports) runs in a fresh subprocess on a temporary model_dir, as a user's first
``torchestimator demo`` would. The phases are measured from outside the library: this script's child
wraps the functions that do each phase (``demo.load_digits_split``, ``Estimator._start_training``,
``train_loop``, ``Checkpointer.save``, ``InferenceBundle.evaluate``, ``export_saved_model``) with timers,
and the parent times the interpreter's start from the moment it starts the child. No library code is
changed or timed from inside.

Phases: interpreter start, ``import torch``, ``import torchestimator`` on top of it, data load, train
start-up (strategy, model, restore, input_fn: before step 1), training steps (the loop's time less the
checkpoint saves, evaluations and exports inside it), checkpoint saves, evaluations, exports, the rest of
``run`` (best.json, the request file, train_and_evaluate's bookkeeping); then the CLI's curves (``plot``,
matplotlib), a rerun of the demo in a new process (it resumes and finds max_steps reached), and a model
server (``torchestimator serve`` in its own process) from its start to the best export's version being
AVAILABLE at its status URL.

Run:  python benchmarks/first_result.py [--max_steps N] [--no_rerun] [--no_serve] [--threads N]
Last line:  first_result demo_s=<s> import_s=<s> train_s=<s> eval_s=<s> export_s=<s> serve_available_s=<s>
            accuracy=<x>   (demo_s: from starting the interpreter to run() returning; import_s: interpreter
            start and every import before run(), lazy ones included; train_s: training steps only;
            serve_available_s: n/a without the serving extra)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

SERVE_TIMEOUT_SECONDS = 120.0


# ----------------------------------------------------------------------------- the child: one demo run


class _Phases:
    """Exclusive seconds and calls per phase: a call's time less that of the timed calls inside it (the data load
    inside train start-up, the evaluations inside the training loop), so that the phases add up and the loop's
    own time is its training steps."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._nested: list[float] = []  # per open call: seconds spent in timed calls inside it

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)
        phases = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            phases._nested.append(0.0)
            try:
                return original(*args, **kwargs)
            finally:
                total = time.perf_counter() - started
                inside = phases._nested.pop()
                phases.seconds[name] = phases.seconds.get(name, 0.0) + total - inside
                phases.calls[name] = phases.calls.get(name, 0) + 1
                if phases._nested:
                    phases._nested[-1] += total

        setattr(owner, attribute, timed)


def run_child(model_dir: str, max_steps: int | None, plot: bool) -> dict[str, Any]:
    """One demo run in this (fresh) process; wall-clock marks so the parent can place the interpreter start."""
    marks = {"interpreter_up": time.time()}
    started = time.perf_counter()
    import torch

    marks["torch_s"] = time.perf_counter() - started
    import torchestimator  # noqa: F401

    marks["torchestimator_s"] = time.perf_counter() - started - marks["torch_s"]
    from torchestimator._core import estimator as estimator_module
    from torchestimator._core.inference import InferenceBundle
    from torchestimator.checkpoint.checkpointer import Checkpointer
    from torchestimator.cli import demo
    from torchestimator.export import saved_model

    original_train_loop = estimator_module.train_loop

    def train_loop_noting_threads(run: Any) -> Any:
        marks["threads"] = torch.get_num_threads()  # as the steps run them (the demo sets its own)
        return original_train_loop(run)

    estimator_module.train_loop = train_loop_noting_threads
    phases = _Phases()
    phases.wrap(demo, "load_digits_split", "data")
    phases.wrap(estimator_module.Estimator, "_start_training", "train start-up")
    phases.wrap(estimator_module, "train_loop", "training steps")
    phases.wrap(Checkpointer, "save", "checkpoint saves")
    phases.wrap(InferenceBundle, "evaluate", "evaluations")
    phases.wrap(saved_model, "export_saved_model", "exports")
    marks["modules_s"] = time.perf_counter() - started - marks["torch_s"] - marks["torchestimator_s"]
    run_started = time.perf_counter()
    outcome = demo.run(model_dir=model_dir, steps=max_steps or demo.max_steps, progress_bar=False)
    marks["run_s"] = time.perf_counter() - run_started
    marks["run_returned"] = time.time()
    if plot:
        try:
            from torchestimator.cli.plot import plot_model_dir
        except ImportError:
            marks["plot_s"] = None
        else:
            plot_started = time.perf_counter()
            plot_model_dir(model_dir)
            marks["plot_s"] = time.perf_counter() - plot_started
    results = outcome["results"]
    return {
        "marks": marks,
        "seconds": phases.seconds,
        "calls": phases.calls,
        "accuracy": float(results["accuracy"]),
        "global_step": int(results["global_step"]),
        "resumed_from": outcome["resumed_from"],
        "best_export": outcome["exports"].get("best"),
    }


def _child_main(arguments: list[str]) -> int:
    model_dir, report_path, max_steps, plot = arguments[0], arguments[1], int(arguments[2]), arguments[3] == "plot"
    report = run_child(model_dir, max_steps or None, plot)
    with open(report_path, "w") as handle:
        json.dump(report, handle)
    return 0


# ----------------------------------------------------------------------------- the parent


def _run_demo_process(model_dir: str, max_steps: int | None, plot: bool, threads: int | None) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        report_path = handle.name
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        model_dir,
        report_path,
        str(max_steps or 0),
        "plot" if plot else "no-plot",
    ]
    environ = dict(os.environ)
    if threads is not None:
        environ["OMP_NUM_THREADS"] = str(threads)
    started = time.time()
    completed = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=600)
    if completed.returncode != 0:
        raise SystemExit(f"first_result: the demo process failed (exit {completed.returncode}):\n{completed.stderr}")
    with open(report_path) as handle:
        report = json.load(handle)
    os.remove(report_path)
    report["marks"]["interpreter_s"] = report["marks"]["interpreter_up"] - started
    report["marks"]["demo_s"] = report["marks"]["run_returned"] - started
    return report


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def time_to_available(export_base: str) -> float | None:
    """Seconds from starting ``torchestimator serve`` to the model's status saying AVAILABLE; None without aiohttp."""
    import importlib.util
    import urllib.error
    import urllib.request

    if importlib.util.find_spec("aiohttp") is None:
        return None
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "torchestimator",
        "serve",
        "--model_name",
        "digits",
        "--model_base_path",
        export_base,
        "--rest_api_port",
        str(port),
    ]
    started = time.perf_counter()
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/v1/models/digits"
    try:
        while time.perf_counter() - started < SERVE_TIMEOUT_SECONDS:
            if server.poll() is not None:
                raise SystemExit(f"first_result: the server exited ({server.returncode}):\n{server.stderr.read()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    states = [status["state"] for status in json.load(answer)["model_version_status"]]
                if "AVAILABLE" in states:
                    return time.perf_counter() - started
            except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, ValueError):
                pass
            time.sleep(0.02)  # a poll interval; the deadline above bounds the wait
        raise SystemExit(f"first_result: the server was not AVAILABLE within {SERVE_TIMEOUT_SECONDS:g} s")
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _table(report: dict[str, Any], rerun: dict[str, Any] | None, serve_s: float | None) -> list[tuple[str, str]]:
    marks, seconds, calls = report["marks"], report["seconds"], report["calls"]
    rows = [
        ("interpreter start", marks["interpreter_s"]),
        ("import torch", marks["torch_s"]),
        ("import torchestimator (after torch)", marks["torchestimator_s"]),
        ("imports of the modules the demo uses (lazy ones)", marks["modules_s"]),
        (f"data: load_digits_split ({calls.get('data', 0)} calls)", seconds.get("data", 0.0)),
        ("train start-up (before step 1)", seconds.get("train start-up", 0.0)),
        (
            f"training steps (to step {report['global_step']}, {marks.get('threads', '?')} torch threads)",
            seconds.get("training steps", 0.0),
        ),
        (f"checkpoint saves ({calls.get('checkpoint saves', 0)})", seconds.get("checkpoint saves", 0.0)),
        (f"evaluations ({calls.get('evaluations', 0)})", seconds.get("evaluations", 0.0)),
        (f"exports ({calls.get('exports', 0)})", seconds.get("exports", 0.0)),
        ("rest of run() (policies, files)", marks["run_s"] - sum(seconds.values())),
        ("demo: interpreter start to run() returned", marks["demo_s"]),
        ("plot: the CLI's curves (matplotlib)", marks.get("plot_s")),
    ]
    if rerun is not None:
        rows.append(
            (
                f"rerun in a new process (resumed from {os.path.basename(rerun['resumed_from'] or '-')})",
                rerun["marks"]["demo_s"],
            )
        )
    rows.append(("server: start to AVAILABLE (best export)", serve_s))
    return [(name, "n/a" if value is None else f"{value:.2f}") for name, value in rows]


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments and arguments[0] == "--child":
        return _child_main(arguments[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_steps", type=int, default=None, help="the demo's max_steps (default: the demo's 1000)")
    parser.add_argument("--no_rerun", action="store_true", help="skip the rerun that resumes")
    parser.add_argument("--no_serve", action="store_true", help="skip the server's time to AVAILABLE")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS for the demo's processes (default: inherited; the demo trains on one thread itself)",
    )
    settings = parser.parse_args(arguments)
    if settings.max_steps is not None and settings.max_steps < 1:
        parser.error("--max_steps must be a positive number of steps")
    if settings.threads is not None and settings.threads < 1:
        parser.error("--threads must be a positive number of threads")
    with tempfile.TemporaryDirectory(prefix="first_result-") as folder:
        model_dir = os.path.join(folder, "digits")
        report = _run_demo_process(model_dir, settings.max_steps, plot=True, threads=settings.threads)
        rerun = (
            None
            if settings.no_rerun
            else _run_demo_process(model_dir, settings.max_steps, plot=False, threads=settings.threads)
        )
        best = report["best_export"]
        serve_s = None if settings.no_serve or best is None else time_to_available(os.path.dirname(best))
        rows = _table(report, rerun, serve_s)
        width = max(len(name) for name, _ in rows)
        print(f"{'phase':<{width}}  seconds")
        for name, value in rows:
            print(f"{name:<{width}}  {value:>7}")
        marks, seconds = report["marks"], report["seconds"]
        steps = seconds.get("training steps", 0.0)
        import_s = marks["interpreter_s"] + marks["torch_s"] + marks["torchestimator_s"] + marks["modules_s"]
        print(
            f"first_result demo_s={marks['demo_s']:.2f} import_s={import_s:.2f} train_s={steps:.2f} "
            f"eval_s={seconds.get('evaluations', 0.0):.2f} export_s={seconds.get('exports', 0.0):.2f} "
            f"serve_available_s={'n/a' if serve_s is None else f'{serve_s:.2f}'} accuracy={report['accuracy']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
