"""Fuzz the model server's REST API with schemathesis, longer than CI does.

Two small models are exported to a temporary folder and served by
``make_app`` on a real socket (127.0.0.1, a free port) in a background thread:

* ``half``: y = 0.5 x + 2 on one float input ``x`` of shape [-1], with
  predict, regress and classify signatures, so generated number lists are
  often valid and reach the model;
* ``pair``: a float input ``a`` [-1, 2] and an int64 input ``b`` [-1] used as
  an index into a 4-row table, so out-of-range indices reach the program.

schemathesis generates requests from ``openapi_document(["half", "pair"])``
for every operation, in positive mode (schema-valid requests, real and
unknown model names) and negative mode (schema-violating ones). Every answer
must be: not 5xx, ``application/json``, parseable JSON, ``{"error": <string>}``
for 4xx, and conform to the documented status codes and schemas. After the
fuzz the server must still answer a valid predict correctly.

Run:  python benchmarks/fuzz_serving.py [--examples 5000] [--seed 0] [--max-seconds 600]
Last line:  fuzz_serving cases=<n> failures=<n> statuses=<status:count,...>
Exit status 1 when any answer failed a check (each failure is printed with a curl command to reproduce it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn as nn

import torchestimator as te
from torchestimator.export import (
    ClassificationOutput,
    PredictOutput,
    RegressionOutput,
    TensorSpec,
    export_saved_model,
    serving_input_receiver,
)
from torchestimator.serving import ModelManager, make_app
from torchestimator.serving.openapi import openapi_document

MODEL_NAMES = ("half", "pair")
VALID_PREDICT = ("/v1/models/half:predict", {"instances": [1.0, 2.0, 5.0]}, {"predictions": [2.5, 3.0, 4.5]})


# -- models ------------------------------------------------------------------------------


class HalfPlus(nn.Module):
    """y = slope * x + offset, with parameters so the Estimator can train (lr=0) and checkpoint it."""

    def __init__(self, offset: float) -> None:
        super().__init__()
        self.slope = nn.Parameter(torch.tensor(0.5))
        self.offset = nn.Parameter(torch.tensor(float(offset)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.slope * x + self.offset


class Pair(nn.Module):
    """Two inputs: a float matrix summed per row, plus a lookup of an int64 index in a 4-row table."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.arange(4, dtype=torch.float32))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.sum(-1) + self.table[b]


def _half_model_fn(model: nn.Module, features: dict[str, torch.Tensor], labels: Any, mode: str) -> te.EstimatorSpec:
    y = model(features["x"])
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(
            mode,
            predictions={"y": y},
            export_outputs={
                "serving_default": PredictOutput({"y": y}),
                "regress_x_to_y": RegressionOutput(y),
                "classify_x_to_y": ClassificationOutput(scores=y[:, None]),
            },
        )
    return te.EstimatorSpec(mode, predictions={"y": y}, loss=((y - labels) ** 2).mean())


def _pair_model_fn(model: nn.Module, features: dict[str, torch.Tensor], labels: Any, mode: str) -> te.EstimatorSpec:
    total = model(features["a"], features["b"])
    predictions = {"total": total, "doubled": features["a"] * 2}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    return te.EstimatorSpec(mode, predictions=predictions, loss=((total - labels) ** 2).mean())


def export_fixed(
    directory: str,
    model: nn.Module,
    model_fn: Any,
    receiver: Any,
    batch: dict[str, torch.Tensor],
    version: int | None = None,
) -> str:
    """Exports ``model`` unchanged (one training step at learning rate 0 writes the checkpoint export needs).

    With ``version`` the folder is renamed to that integer version (as TF's test models are 123, 124).
    """
    size = len(next(iter(batch.values())))
    estimator = te.Estimator(
        model_fn=model_fn,
        model=lambda: model,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.0),
        model_dir=os.path.join(directory, "model_dir"),
        config=te.RunConfig(save_checkpoints_steps=1, log_step_count_steps=None, progress_bar=False, random_seed=0),
    )
    estimator.train(lambda: [(batch, torch.zeros(size))], max_steps=1)
    path = export_saved_model(estimator, os.path.join(directory, "export"), receiver)
    if version is None:
        return path
    target = os.path.join(directory, "export", str(version))
    os.rename(path, target)
    return target


def export_models(directory: str) -> dict[str, str]:
    """The fuzz targets, exported under ``directory``: {model name: base path}."""
    half = os.path.join(directory, "half")
    export_fixed(
        half,
        HalfPlus(2.0),
        _half_model_fn,
        serving_input_receiver({"x": TensorSpec(shape=(None,))}),
        {"x": torch.zeros(2)},
    )
    pair = os.path.join(directory, "pair")
    receiver = serving_input_receiver(
        {"a": TensorSpec(shape=(None, 2)), "b": TensorSpec(shape=(None,), dtype=torch.int64)}
    )
    batch = {"a": torch.zeros(2, 2), "b": torch.zeros(2, dtype=torch.int64)}
    export_fixed(pair, Pair(), _pair_model_fn, receiver, batch)
    return {"half": os.path.join(half, "export"), "pair": os.path.join(pair, "export")}


def managers_for(bases: dict[str, str]) -> list[ModelManager]:
    managers = [ModelManager(name, base) for name, base in bases.items()]
    for manager in managers:
        if not manager.poll():
            raise RuntimeError(f"{manager.name}: no version loaded from {manager.base_path}: {manager.statuses()}")
    return managers


# -- a live server -------------------------------------------------------------------------


@contextlib.contextmanager
def live_server(app: Any) -> Iterator[str]:
    """Serves the aiohttp ``app`` on 127.0.0.1 (a free port) from a thread with its own loop; yields the base URL.

    The runner is the server's own (protocol.py), so protocol errors are answered as ``serve`` answers them.
    """
    from aiohttp import web

    from torchestimator.serving.protocol import ServingRunner

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = ServingRunner(app, access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            state["port"] = runner.addresses[0][1]
        except BaseException as error:  # reported to the caller, which would otherwise wait forever
            state["error"] = error
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    thread = threading.Thread(target=run, name="fuzz-server", daemon=True)
    thread.start()
    if not ready.wait(timeout=60):
        raise RuntimeError("The server did not start listening within 60 s.")
    if "error" in state:
        raise RuntimeError(f"The server failed to start: {state['error']!r}") from state["error"]
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)


# -- the fuzz ------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class FuzzReport:
    """What a fuzz run sent and saw."""

    cases: int = 0
    statuses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    by_operation: dict[str, collections.Counter] = dataclasses.field(default_factory=dict)
    failures: list[str] = dataclasses.field(default_factory=list)
    """One entry per failing answer: the problem and a curl command reproducing it."""
    stopped_early: bool = False
    unsatisfiable: list[str] = dataclasses.field(default_factory=list)
    """Operation and mode pairs for which no request can be generated (nothing to send there)."""

    def summary(self) -> str:
        statuses = ",".join(f"{status}:{count}" for status, count in sorted(self.statuses.items()))
        return f"fuzz_serving cases={self.cases} failures={len(self.failures)} statuses={statuses}"


def answer_problems(response: Any) -> list[str]:
    """What is wrong with one answer, by the rules every answer of the server must follow."""
    problems = []
    if response.status_code >= 500:
        problems.append(f"server error {response.status_code}")
    content_type = ",".join(response.headers.get("content-type", []))  # schemathesis: lowercase keys, list values
    if content_type.split(";")[0].strip() != "application/json":
        problems.append(f"Content-Type is {content_type!r}, not application/json")
    try:
        document = json.loads(response.content)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return problems + [f"body is not JSON ({error}): {response.content[:200]!r}"]
    if response.status_code >= 400 and not (isinstance(document, dict) and isinstance(document.get("error"), str)):
        problems.append(f"error answer without a string 'error': {response.content[:200]!r}")
    return problems


def fuzz(
    base_url: str,
    model_names: Sequence[str],
    *,
    examples: int,
    seed: int,
    max_seconds: float,
    request_timeout: float = 30.0,
) -> FuzzReport:
    """Sends about ``examples`` generated requests spread over every operation and both generation modes."""
    import hypothesis
    import hypothesis.errors
    import requests
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.failures import FailureGroup
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    schema = schemathesis.openapi.from_dict(openapi_document(model_names))
    operations = [result.ok() for result in schema.get_all_operations()]
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    per_run = max(1, examples // (len(operations) * len(modes)))
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    report = FuzzReport()
    session = requests.Session()  # keep-alive: one connection rather than one per case
    deadline = time.monotonic() + max_seconds
    settings = hypothesis.settings(
        max_examples=per_run,
        database=None,
        deadline=None,
        phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
        print_blob=False,
    )

    for operation in operations:
        label = f"{operation.method.upper()} {operation.path}"
        counter = report.by_operation.setdefault(label, collections.Counter())
        for mode in modes:
            if time.monotonic() > deadline:
                report.stopped_early = True
                return report

            @hypothesis.seed(seed)
            @settings
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def send(case: Any) -> None:
                if time.monotonic() > deadline:
                    report.stopped_early = True
                    return
                response = case.call(base_url=base_url, session=session, timeout=request_timeout)
                report.cases += 1
                report.statuses[response.status_code] += 1
                counter[response.status_code] += 1
                problems = answer_problems(response)
                try:
                    case.validate_response(response, checks=checks)
                except FailureGroup as group:  # the checks that failed, as one group: record them and keep fuzzing
                    problems.extend(_failure_title(failure) for failure in group.exceptions)
                if problems:
                    report.failures.append(
                        f"{label} ({mode.value}): {'; '.join(problems)}\n  reproduce: "
                        f"{case.as_curl_command(base_url=base_url)}"
                    )

            try:
                send()
            except hypothesis.errors.Unsatisfiable:  # e.g. no negative request exists for a path without parameters
                report.unsatisfiable.append(f"{label} ({mode.value})")
    return report


def _failure_title(failure: BaseException) -> str:
    title = getattr(failure, "title", None) or type(failure).__name__
    message = " ".join(str(getattr(failure, "message", "")).split())
    return f"{title}: {message[:300]}" if message else title


def check_still_serving(base_url: str) -> str | None:
    """None when a valid predict is answered correctly, else what went wrong."""
    import requests

    path, body, expected = VALID_PREDICT
    response = requests.post(base_url + path, json=body, timeout=30)
    if response.status_code != 200 or response.json() != expected:
        return f"after the fuzz, POST {path} {body} answered {response.status_code} {response.text[:200]}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="requests to generate in all (default 5000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop generating after this (default 600)")
    arguments = parser.parse_args(argv)
    if arguments.examples <= 0 or arguments.max_seconds <= 0:
        parser.error(
            f"--examples and --max-seconds must be positive; received {arguments.examples} and {arguments.max_seconds}."
        )
    logging.getLogger("torchestimator").setLevel(logging.CRITICAL)  # expected 4xx would flood the output
    with tempfile.TemporaryDirectory() as directory:
        managers = managers_for(export_models(directory))
        with live_server(make_app(managers)) as base_url:
            started = time.monotonic()
            report = fuzz(
                base_url,
                MODEL_NAMES,
                examples=arguments.examples,
                seed=arguments.seed,
                max_seconds=arguments.max_seconds,
            )
            elapsed = time.monotonic() - started
            problem = check_still_serving(base_url)
    if problem:
        report.failures.append(problem)
    for failure in report.failures:
        print(f"FAILURE {failure}")
    for label, counter in report.by_operation.items():
        print(f"{label}: " + ", ".join(f"{status}x{count}" for status, count in sorted(counter.items())))
    print(
        f"{report.cases} cases in {elapsed:.1f} s (seed {arguments.seed})"
        + (", stopped at --max-seconds" if report.stopped_early else "")
    )
    print(report.summary())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
