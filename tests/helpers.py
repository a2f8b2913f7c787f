"""What the tests share: small models and data that train in milliseconds on a CPU, and test tools.

Imported by name (``from helpers import make_estimator``) from every folder of tests/: tests/conftest.py is the
rootdir conftest, so pytest puts tests/ on sys.path (prepend import mode) before it collects any test module.
Fixtures and pytest hooks stay in conftest.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import stat
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te

FIXTURES = Path(__file__).resolve().parent / "fixtures"  # tests/fixtures, wherever the test module lies


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


# ---------------------------------------------------------------------------- several replicas (2-process tests)


def sum_sign_data(rows: int = 256):
    """``rows`` examples of 6 normal features (seed 0), labelled by the sign of x0 + x1."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64)


def class_model_fn(model, features, labels, mode):
    """Predicts "class" only (nothing float to gather across replicas); cross entropy and accuracy."""
    logits = model(features["x"])
    predictions = {"class": logits.argmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    return te.EstimatorSpec(
        mode,
        predictions=predictions,
        loss=F.cross_entropy(logits, labels),
        eval_metric_ops={"accuracy": te.metrics.accuracy(labels, predictions["class"])},
    )


def loss_model_fn(model, features, labels, mode):
    """A loss and nothing else: for tests of training alone."""
    return te.EstimatorSpec(mode, loss=F.cross_entropy(model(features["x"]), labels))


# ---------------------------------------------------------------------------- the command line (tests/cli)

# A model file as a user writes one for `torchestimator train model.py`: every name the CLI looks for.
CLI_MODEL_FILE = textwrap.dedent("""
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    params = {"hidden": 8, "lr": 0.05}
    config = te.RunConfig(save_checkpoints_steps=5, log_step_count_steps=None, progress_bar=False)
    max_steps = 10
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 4)).astype(np.float32)
    Y = (X[:, 0] > 0).astype(np.int64)

    def model(params):
        return nn.Sequential(nn.Linear(4, params["hidden"]), nn.ReLU(), nn.Linear(params["hidden"], 2))

    def model_fn(model, features, labels, mode, params):
        logits = model(features["x"])
        predictions = {"class": logits.argmax(-1)}
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions=predictions)
        return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels),
                                eval_metric_ops={"accuracy": te.metrics.accuracy(labels, predictions["class"])})

    def optimizer(parameters, params):
        return torch.optim.SGD(parameters, lr=params["lr"])

    def train_input_fn(input_context=None):
        return te.numpy_input_fn({"x": X}, Y, batch_size=16, num_epochs=None, shuffle=True)(input_context=input_context)

    def eval_input_fn():
        return te.numpy_input_fn({"x": X}, Y, batch_size=16, shuffle=False)()

    def predict_input_fn():
        return te.numpy_input_fn({"x": X[:5]}, batch_size=16, shuffle=False)()

    from torchestimator import export as te_export
    serving_input_receiver = te_export.serving_input_receiver({"x": te_export.TensorSpec(shape=(None, 4))})
""")


def one_line_error(capsys):
    """stderr, checked to be one line and no traceback; returned without its newline."""
    error = capsys.readouterr().err
    assert "Traceback" not in error and len(error.splitlines()) == 1, error
    return error.strip()


@contextlib.contextmanager
def tfrecord_scanner(core: object) -> Iterator[None]:
    """TFRecord reading through ``core``: the compiled scanner module, or None for the pure-Python one."""
    from torchestimator.data import tfrecord

    saved = tfrecord._core
    tfrecord._core = core
    try:
        yield
    finally:
        tfrecord._core = saved


def fenced_blocks(page: str, text: str) -> list[tuple[int, str, str]]:
    """Every fenced code block of a Markdown page, in order: (line of its opening fence, info string, text).
    An unclosed fence is an error naming the page and its line."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = re.match(r"^```([\w+-]*)\s*$", lines[index])
        if opening:
            start, index = index, index + 1
            while index < len(lines) and lines[index].strip() != "```":
                index += 1
            if index == len(lines):
                raise AssertionError(f"{page}:{start + 1}: code fence never closed")
            blocks.append((start + 1, opening.group(1), "\n".join(lines[start + 1 : index]) + "\n"))
        index += 1
    return blocks
