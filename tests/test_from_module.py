"""Estimator.from_module: one module, one loss, named metrics (the Keras compile + fit path)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import SmallNet, make_classification
from sklearn.metrics import roc_auc_score

import torchestimator as te

CONFIG = te.RunConfig(progress_bar=False, log_step_count_steps=None, save_checkpoints_steps=20, random_seed=0)


def test_multiclass_with_accuracy(tmp_path):
    x, y = make_classification(256)
    estimator = te.Estimator.from_module(
        lambda: SmallNet(),
        loss="sparse_categorical_crossentropy",
        optimizer="adam",
        metrics=["accuracy"],
        learning_rate=1e-2,
        model_dir=str(tmp_path),
        config=CONFIG,
    )
    estimator.train(te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True), max_steps=40)
    results = estimator.evaluate(te.numpy_input_fn({"x": x}, y, batch_size=64, shuffle=False))
    assert results["accuracy"] > 0.9
    rows = list(estimator.predict(te.numpy_input_fn(x[:3], batch_size=3, shuffle=False)))
    assert set(rows[0]) == {"outputs", "class", "probabilities"}
    assert rows[0]["probabilities"].sum() == pytest.approx(1.0, abs=1e-5)


def test_binary_with_auc_precision_recall(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] + 0.3 * rng.normal(size=300) > 0).astype(np.float32)
    estimator = te.Estimator.from_module(
        nn.Linear(4, 1),
        loss="binary_crossentropy",
        optimizer="sgd",
        learning_rate=0.5,
        metrics=["accuracy", "auc", "precision", "recall"],
        model_dir=str(tmp_path),
        config=CONFIG,
    )
    estimator.train(te.numpy_input_fn(x, y, batch_size=50, num_epochs=None, shuffle=True), max_steps=60)
    results = estimator.evaluate(te.numpy_input_fn(x, y, batch_size=300, shuffle=False))
    scores = np.concatenate(
        [
            b["probabilities"]
            for b in estimator.predict(te.numpy_input_fn(x, batch_size=300, shuffle=False), yield_single_examples=False)
        ]
    )
    assert results["auc"] == pytest.approx(roc_auc_score(y, scores), abs=0.01)  # 200-threshold approximation
    assert results["accuracy"] > 0.85 and results["precision"] > 0.8 and results["recall"] > 0.8


def test_regression_with_mse_and_a_custom_metric(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    estimator = te.Estimator.from_module(
        nn.Linear(3, 1),
        loss="mse",
        optimizer=torch.optim.SGD,
        learning_rate=0.1,
        metrics={"mean_prediction": lambda labels, predictions: te.metrics.mean(predictions["outputs"])},
        model_dir=str(tmp_path),
        config=CONFIG,
    )
    estimator.train(te.numpy_input_fn(x, y, batch_size=20, num_epochs=None, shuffle=True), max_steps=100)
    results = estimator.evaluate(te.numpy_input_fn(x, y, batch_size=50, shuffle=False))
    assert results["loss"] < 1e-3
    outputs = np.concatenate(
        [
            batch["outputs"]
            for batch in estimator.predict(
                te.numpy_input_fn(x, batch_size=200, shuffle=False), yield_single_examples=False
            )
        ]
    )
    assert results["mean_prediction"] == pytest.approx(float(outputs.mean()), abs=1e-6)


def test_from_module_refuses_what_cannot_work(tmp_path):
    with pytest.raises(ValueError, match="Unknown loss 'hinge'"):
        te.Estimator.from_module(nn.Linear(2, 1), loss="hinge", model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="Unknown optimizer 'lamb'"):
        te.Estimator.from_module(nn.Linear(2, 1), loss="mse", optimizer="lamb", model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="needs a known loss name"):
        te.Estimator.from_module(
            nn.Linear(2, 1),
            loss=lambda output, label: (output - label).abs().mean(),
            metrics=["accuracy"],
            model_dir=str(tmp_path),
        )
    estimator = te.Estimator.from_module(
        nn.Linear(2, 1), loss="mse", metrics=["accuracy"], model_dir=str(tmp_path), config=CONFIG
    )
    x, y = np.zeros((4, 2), np.float32), np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="needs a classification loss"):
        estimator.evaluate(te.numpy_input_fn(x, y, batch_size=4, shuffle=False))
