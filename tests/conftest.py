"""Shared fixtures: small models and data that train in milliseconds on a CPU."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import stat
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te

# The fault tools (tools/faults_*.py) are scripts and the fault tests' toolkits: importable by name,
# as they are when run as scripts, so a forkserver child can find its target and they share faults_common.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))


def make_classification(n: int = 256, features: int = 8, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(classes, features)).astype(np.float32)
    labels = rng.integers(0, classes, size=n).astype(np.int64)
    x = (centers[labels] + rng.normal(0, 1, size=(n, features))).astype(np.float32)
    return x, labels


class SmallNet(nn.Module):
    def __init__(
        self, features: int = 8, hidden: int = 16, classes: int = 3, batch_norm: bool = True, dropout: float = 0.0
    ):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(features, hidden)]
        if batch_norm:
            layers.append(nn.BatchNorm1d(hidden))
        layers += [nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, classes)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def classifier_model_fn(model, features, labels, mode):
    logits = model(features["x"])
    predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    loss = F.cross_entropy(logits, labels)
    return te.EstimatorSpec(
        mode,
        predictions=predictions,
        loss=loss,
        eval_metric_ops={"accuracy": te.metrics.accuracy(labels, predictions["class"])},
    )


def exporting_model_fn(extra_signatures):
    """A SmallNet classifier model_fn whose PREDICT spec declares export signatures.

    serving_default predicts every prediction ("class", "probabilities");
    ``extra_signatures(logits, predictions)`` returns the others by name.
    """
    from torchestimator.export import PredictOutput

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(
                mode,
                predictions=predictions,
                export_outputs={"serving_default": PredictOutput(predictions), **extra_signatures(logits, predictions)},
            )
        return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))

    return model_fn


def call_app(app, *requests):
    """Sends (method, path, body) requests to an aiohttp app; returns [(status, JSON body, Content-Type)]."""
    import asyncio
    import json

    from aiohttp.test_utils import TestClient, TestServer

    async def main():
        async with TestClient(TestServer(app)) as client:
            answers = []
            for method, path, body in requests:
                data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
                async with client.request(method, path, data=data) as response:
                    answers.append((response.status, json.loads(await response.text()), response.content_type))
            return answers

    return asyncio.run(main())


def adam(parameters):
    return torch.optim.Adam(parameters, lr=1e-2)


def sgd(parameters):
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


def make_estimator(model_dir, *, model=None, optimizer=adam, model_fn=classifier_model_fn, **config_changes):
    settings = {"save_checkpoints_steps": 10, "log_step_count_steps": None, "progress_bar": False, "random_seed": 0}
    config = te.RunConfig(**{**settings, **config_changes})
    return te.Estimator(
        model_fn=model_fn,
        model=model or (lambda: SmallNet()),
        optimizer=optimizer,
        model_dir=str(model_dir),
        config=config,
    )


def trained_classifier(model_dir, model_fn=classifier_model_fn, steps: int = 5, n: int = 64):
    """A SmallNet estimator trained a few steps (enough to export), and its training features."""
    train, _, _, (x, _) = input_fns(n=n)
    estimator = make_estimator(model_dir, model_fn=model_fn)
    estimator.train(train, max_steps=steps)
    return estimator, x


def input_fns(n: int = 256, batch_size: int = 32, seed: int = 0):
    x, y = make_classification(n, seed=seed)
    train = te.numpy_input_fn({"x": x}, y, batch_size=batch_size, num_epochs=None, shuffle=True, seed=seed)
    evaluate = te.numpy_input_fn({"x": x}, y, batch_size=batch_size, num_epochs=1, shuffle=False)
    predict = te.numpy_input_fn({"x": x}, batch_size=batch_size, num_epochs=1, shuffle=False)
    return train, evaluate, predict, (x, y)


def wait_until(condition, *, timeout: float = 60.0, interval: float = 0.02, what: str = "the condition"):
    """Polls `condition()` until it returns something true and returns that; fails naming `what` after `timeout` s.

    The deadline is generous on purpose: a loaded CI machine makes a server or a thread slow, not wrong, and
    a fixed sleep either wastes time or fails by chance.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(interval)


_CAP_DAC_OVERRIDE = 1  # linux/capability.h
_CAPABILITY_VERSION_3 = 0x20080522


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilitySets(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextlib.contextmanager
def _without_dac_override():
    """As root, drops CAP_DAC_OVERRIDE (which lets root write into read-only folders) for the block.

    Only the effective set of the calling thread changes (capset acts per thread), so the capability is
    still permitted and comes back at the end; other threads of the test process keep theirs.
    """
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapabilityHeader(_CAPABILITY_VERSION_3, 0)
    saved = (_CapabilitySets * 2)()
    if libc.capget(ctypes.byref(header), saved) != 0:
        pytest.skip(f"capget failed ({os.strerror(ctypes.get_errno())}): cannot make a folder read-only for root")
    lowered = (_CapabilitySets * 2)(*saved)
    lowered[0].effective &= ~(1 << _CAP_DAC_OVERRIDE)
    if libc.capset(ctypes.byref(header), lowered) != 0:
        pytest.skip(f"capset failed ({os.strerror(ctypes.get_errno())}): cannot make a folder read-only for root")
    try:
        yield
    finally:
        if libc.capset(ctypes.byref(header), saved) != 0:
            raise OSError(ctypes.get_errno(), "could not give CAP_DAC_OVERRIDE back to the test thread")


@contextlib.contextmanager
def read_only_directory(path: Path):
    """Creates `path` as a folder that refuses writes inside the block, for root too (how CI runs).

    chmod alone does not stop root, so as root the block also runs without CAP_DAC_OVERRIDE.
    """
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(stat.S_IREAD | stat.S_IEXEC)
    try:
        with _without_dac_override():
            yield path
    finally:
        path.chmod(stat.S_IRWXU)


@pytest.fixture(autouse=True)
def _quiet_torch_threads():
    torch.set_num_threads(1)
    yield


@pytest.fixture
def te_logs(caplog):
    caplog.set_level(logging.INFO, logger="torchestimator")
    return caplog


# The modules whose tests reach the compiled cores (TFRecord framing, Example parsing) whatever their speed:
# the pure-Python pass of the test command (TORCHESTIMATOR_PURE_PYTHON=1 ... -m "not slow or compiled_path")
# runs them all, slow ones included, with every fast test of the rest of the suite.
_COMPILED_PATH_MODULES = frozenset(
    {
        "test_tfrecord.py",
        "test_tfrecord_dataset.py",
        "test_tfrecord_benchmark_smoke.py",
        "test_dataset_batched_parse.py",
        "test_dataset_shuffle_resume.py",
        "test_records_cli.py",
        "test_native.py",
        "test_native_records.py",
        "test_native_examples.py",
        "test_parsing.py",
        "test_example.py",
        "test_inputs.py",
        "test_tf_interop.py",
        "test_serving_classify_regress.py",
        "test_crafted_tfrecord.py",
        "test_serving_bytes.py",
        # Found by the check below: event files are TFRecords, and these read or write them in the test's process.
        "test_crafted_events.py",
        "test_distributed_estimator.py",
        "test_evaluator_task.py",
        "test_readme.py",
        "test_training_and_evaluate.py",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in _COMPILED_PATH_MODULES:
            item.add_marker(pytest.mark.compiled_path)


# The list above is checked, not trusted: in the compiled pass every call into a compiled core is counted, and a
# slow test outside those modules that makes one fails, naming its module (the pure pass would have skipped it).
# Calls made in a child process are not seen here; the modules that start them are listed above.
_compiled_calls = [0]


def _counted(function):
    @functools.wraps(function)
    def counting(*args, **kwargs):
        _compiled_calls[0] += 1
        return function(*args, **kwargs)

    return counting


def _watch_compiled_cores() -> None:
    from torchestimator import _native
    from torchestimator.data import tfrecord

    for name, functions in (
        ("_records", ("scan", "frame", "crc32c", "masked_crc32c")),
        ("_examples", ("parse_examples",)),
    ):
        module = _native.load(name)
        if module is not None:  # None in the pure pass: nothing to count
            for function in functions:
                setattr(module, function, _counted(getattr(module, function)))
    if tfrecord._frame_record is not tfrecord._frame_record_python:  # bound to the compiled frame at import
        tfrecord._frame_record = _counted(tfrecord._frame_record)


_watch_compiled_cores()


@pytest.fixture(autouse=True)
def _compiled_path_declared(request):
    if "slow" not in request.keywords or "compiled_path" in request.keywords:
        yield  # a fast test runs in both passes; a listed one too
        return
    before = _compiled_calls[0]
    yield
    if _compiled_calls[0] != before:
        pytest.fail(
            f"{request.node.nodeid} is slow and reaches a compiled core ({_compiled_calls[0] - before} calls), "
            f"but {request.node.path.name} is not in tests/conftest.py's _COMPILED_PATH_MODULES: the "
            "pure-Python pass would skip it.",
            pytrace=False,
        )


# ---------------------------------------------------------------------------- object stores (tests/object_stores.py)


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1, for the whole session."""
    from object_stores import moto_s3_server

    with moto_s3_server() as endpoint:
        yield endpoint


def _fresh_bucket(protocol: str, environment: dict[str, str], monkeypatch):
    """A new bucket on the server ``environment`` points every client (and child process) at, as a user's would."""
    from object_stores import forget_filesystems, new_bucket

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    forget_filesystems()
    yield new_bucket(protocol)
    forget_filesystems()


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch):
    """``s3://<fresh bucket>`` on the session's S3 server, reached through the AWS_* variables."""
    from object_stores import s3_environment

    yield from _fresh_bucket("s3", s3_environment(s3_endpoint), monkeypatch)


@pytest.fixture(scope="session")
def gcs_endpoint():
    """gcp-storage-emulator's GCS server on 127.0.0.1, for the whole session."""
    from object_stores import gcs_emulator_server

    with gcs_emulator_server() as endpoint:
        yield endpoint


@pytest.fixture
def gcs_bucket(gcs_endpoint, monkeypatch):
    """``gs://<fresh bucket>`` on the session's GCS emulator, reached through STORAGE_EMULATOR_HOST."""
    from object_stores import gcs_environment

    yield from _fresh_bucket("gs", gcs_environment(gcs_endpoint), monkeypatch)


@pytest.fixture(scope="session")
def azure_connection_string(tmp_path_factory):
    """Azurite's blob server on 127.0.0.1 for the whole session; skips (saying why) where it cannot run."""
    from object_stores import azurite_missing, azurite_server

    reason = azurite_missing()
    if reason is not None:
        pytest.skip(reason)
    with azurite_server(str(tmp_path_factory.mktemp("azurite"))) as connection_string:
        yield connection_string


@pytest.fixture
def az_bucket(azure_connection_string, monkeypatch):
    """``az://<fresh container>`` on Azurite, reached through AZURE_STORAGE_CONNECTION_STRING."""
    from object_stores import azure_environment

    yield from _fresh_bucket("az", azure_environment(azure_connection_string), monkeypatch)


@pytest.fixture(params=["memory", "s3", "gs", "az"])
def store_url(request, tmp_path):
    """A fresh model_dir URL on each kind of store: memory://, the S3 server, the GCS emulator, Azurite."""
    if request.param == "memory":
        import uuid

        yield f"memory://te-{uuid.uuid4().hex[:12]}"
        return
    bucket = request.getfixturevalue({"s3": "s3_bucket", "gs": "gcs_bucket", "az": "az_bucket"}[request.param])
    yield f"{bucket}/run"
