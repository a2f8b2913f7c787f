"""The digits demo: scikit-learn's 8x8 digits, a small MLP with BatchNorm.

The digits come from scikit-learn (``sklearn.datasets.load_digits``, part of its
installed files: no download), which is the ``demo`` extra:
``pip install 'torchestimator[demo]'``. They are not shipped inside torchestimator.

This module is also a model file for the CLI: `torchestimator train
torchestimator.cli.demo` finds model, model_fn, optimizer and the input
functions here by name, as it would in a user's FILE.py.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import logging
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te
from torchestimator._extras import import_extra
from torchestimator._io import filesystems

# Checked with the module, not in the first input_fn: without scikit-learn the demo stops with one
# line before it writes anything (MissingExtraError, "pip install 'torchestimator[demo]'"). Only
# looked up, not imported: importing sklearn.datasets costs seconds (scipy, pandas).
if importlib.util.find_spec("sklearn") is None:
    import_extra("sklearn", extra="demo", feature="the digits demo")  # raises, naming the extra

params = {"hidden": 128, "learning_rate": 3e-3, "batch_size": 64, "seed": 0}
config = te.RunConfig(save_checkpoints_steps=200, save_summary_steps=50, log_step_count_steps=200, random_seed=0)
max_steps = 1000


@functools.lru_cache(maxsize=1)
def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """80/20 split of the digits, pixels scaled to [0, 1], the same on every call."""
    pixels, targets = _read_digits()
    images = (pixels / 16.0).astype(np.float32)
    labels = targets.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = int(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return images[train], labels[train], images[test], labels[test]


def _read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits (pixels [N, 64] in 0..16, targets [N]) from scikit-learn's installed files: no download.

    The file load_digits reads, read directly (50 ms rather than the 3 s of importing sklearn.datasets);
    where a scikit-learn release keeps it elsewhere, load_digits itself.
    """
    spec = importlib.util.find_spec("sklearn")  # found: checked when this module was imported
    origin = spec.origin if spec is not None else None
    path = os.path.join(os.path.dirname(origin), "datasets", "data", "digits.csv.gz") if origin else ""
    if not os.path.isfile(path):
        digits = import_extra("sklearn.datasets", extra="demo", feature="the digits demo").load_digits()
        return digits.data, digits.target
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",")  # each row: 64 pixels, then the digit
    return table[:, :-1], table[:, -1].astype(np.int64)


def model(params: dict) -> nn.Module:
    hidden = params["hidden"]
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def model_fn(model, features, labels, mode, params):
    logits = model(features["image"])
    predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    loss = F.cross_entropy(logits, labels)
    metrics = {"accuracy": te.metrics.accuracy(labels, predictions["class"])}
    return te.EstimatorSpec(mode, predictions=predictions, loss=loss, eval_metric_ops=metrics)


def optimizer(parameters, params):
    return torch.optim.Adam(parameters, lr=params["learning_rate"])


def train_input_fn(params, config, input_context=None):
    images, labels, _, _ = load_digits_split(params["seed"])
    make = te.numpy_input_fn(
        {"image": images}, labels, batch_size=params["batch_size"], num_epochs=None, shuffle=True, seed=params["seed"]
    )
    return make(input_context=input_context, config=config)


def eval_input_fn(params, input_context=None):
    _, _, images, labels = load_digits_split(params["seed"])
    make = te.numpy_input_fn({"image": images}, labels, batch_size=128, num_epochs=1, shuffle=False)
    return make(input_context=input_context)


def predict_input_fn(params, input_context=None):
    _, _, images, _ = load_digits_split(params["seed"])
    make = te.numpy_input_fn({"image": images}, batch_size=128, num_epochs=1, shuffle=False)
    return make(input_context=input_context)


def serving_input_receiver():
    from torchestimator.export import TensorSpec, serving_input_receiver as receiver

    return receiver({"image": TensorSpec(shape=(None, 64), dtype=torch.float32)})


def run(model_dir: str = "runs/digits", steps: int = max_steps, progress_bar: bool | None = None) -> dict:
    """train_and_evaluate with early stopping, the best checkpoint kept, and best + final exports.

    Returns the last evaluation, the best accuracy and its checkpoint, the export paths, and the
    checkpoint it resumed from (None for a fresh start).
    """
    from torchestimator.export import BestExporter, FinalExporter, latest_version

    log = logging.getLogger("torchestimator")
    estimator = te.Estimator(
        model_fn=model_fn,
        model=model,
        optimizer=optimizer,
        model_dir=model_dir,
        config=config.replace(progress_bar=progress_bar, save_checkpoints_steps=200),
        params=params,
    )
    previous = estimator.latest_checkpoint()
    if previous is None:
        log.info("Training the digits model from scratch in %s.", model_dir)
    else:
        log.info("Found %s: resuming instead of starting over.", previous)
    receiver = serving_input_receiver()
    exporters = [
        BestExporter("best", receiver, metric_name="accuracy", higher_is_better=True, exports_to_keep=2),
        FinalExporter("final", receiver),
    ]
    eval_spec = te.EvalSpec(eval_input_fn, steps=None, throttle_secs=0, exporters=exporters)
    # One intra-op thread: a model this small gains nothing from more, and on a busy machine torch's
    # threads spin against each other (measured: 1.7 ms a step with one thread, 26-57 ms with two).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results, _ = te.train_and_evaluate(
            estimator,
            te.TrainSpec(train_input_fn, max_steps=steps),
            eval_spec,
            best=te.BestCheckpointPolicy("accuracy", higher_is_better=True),
            early_stopping=te.stop_if_no_increase_hook("accuracy", max_steps_without_increase=600),
        )
    finally:
        torch.set_num_threads(threads)
    from torchestimator._policy.best import read_best

    best = read_best(model_dir)
    export_base = filesystems.join(model_dir, "export")
    exports = {
        name: latest_version(filesystems.join(export_base, name))
        for name in ("best", "final")
        if filesystems.is_dir(filesystems.join(export_base, name))
    }
    return {
        "results": results,
        "best_accuracy": best[0].value if best else None,
        "best_checkpoint": best[0].path if best else None,
        "exports": exports,
        "resumed_from": previous,
        "serving_request": write_serving_request(model_dir, params),
    }


def write_serving_request(model_dir: str, params: dict, count: int = 2) -> str:
    """A TF Serving predict body with held-out digits, for `curl -d @<this file> .../v1/models/digits:predict`."""
    import json

    _, _, images, _ = load_digits_split(params["seed"])
    body = json.dumps({"instances": images[:count].tolist()}).encode()
    if filesystems.is_url(model_dir):
        # curl -d @FILE reads a local file: beside the store's copy, one in this machine's temporary folder.
        filesystems.write_bytes(filesystems.join(model_dir, "serving_request.json"), body)
        path = os.path.join(tempfile.gettempdir(), "torchestimator-digits-serving_request.json")
    else:
        path = os.path.join(model_dir, "serving_request.json")
    with open(path, "wb") as handle:
        handle.write(body)
    return path
