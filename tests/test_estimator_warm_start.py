"""Warm start through the Estimator: precedence, optimizer switch, inference, failures, the report."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers import SmallNet, input_fns, make_estimator, sgd

import torchestimator as te
from torchestimator.warm_start import WarmStartSettings


def _weights(estimator):
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def _warm_estimator(model_dir, source, optimizer=sgd, model=None):
    config = te.RunConfig(save_checkpoints_steps=5, log_step_count_steps=None, progress_bar=False, random_seed=1)
    return te.Estimator(
        model_fn=make_estimator(model_dir)._model_fn,
        model=model or (lambda: SmallNet()),
        optimizer=optimizer,
        model_dir=str(model_dir),
        config=config,
        warm_start_from=source,
    )


@pytest.fixture
def trained_with_adam(tmp_path):
    train, _, _, _ = input_fns()
    source = make_estimator(tmp_path / "adam")
    source.train(train, max_steps=20)
    return str(tmp_path / "adam"), _weights(source)


def test_warm_start_applies_to_a_fresh_model_dir_with_another_optimizer(tmp_path, trained_with_adam, te_logs):
    source_dir, source_weights = trained_with_adam
    settings = WarmStartSettings(source_dir, vars_to_warm_start=[".*"])  # list form: BatchNorm statistics too
    estimator = _warm_estimator(tmp_path / "sgd", settings)
    estimator.train(input_fns()[0], max_steps=1)
    assert "has no checkpoint: warm-started" in te_logs.text
    after_one_step = _weights(estimator)
    assert after_one_step["net.1.running_mean"].shape == source_weights["net.1.running_mean"].shape
    # One SGD step from the warm-started weights stays close to them; a fresh init would not be.
    assert np.abs(after_one_step["net.0.weight"] - source_weights["net.0.weight"]).max() < 0.1
    assert estimator.latest_checkpoint().endswith("ckpt-1")  # the step count starts again, as in TensorFlow


def test_a_checkpoint_in_model_dir_wins_over_warm_start(tmp_path, trained_with_adam, te_logs):
    source_dir, source_weights = trained_with_adam
    first = _warm_estimator(tmp_path / "run", source_dir)
    first.train(input_fns()[0], max_steps=5)
    own = _weights(first)
    te_logs.clear()
    again = _warm_estimator(tmp_path / "run", source_dir)
    assert again.evaluate(input_fns()[1])["global_step"] == 5
    assert "it wins over warm_start_from" in te_logs.text
    assert not np.array_equal(own["net.0.weight"], source_weights["net.0.weight"])
    again.train(input_fns()[0], max_steps=6)
    assert "warm-started" not in te_logs.text


def test_evaluate_and_predict_without_checkpoint_use_the_warm_start_source(tmp_path, trained_with_adam):
    source_dir, _ = trained_with_adam
    _, evaluate, _, _ = input_fns()
    expected = make_estimator(source_dir).evaluate(evaluate)
    warm = _warm_estimator(tmp_path / "fresh", WarmStartSettings(source_dir, vars_to_warm_start=[".*"]))
    results = warm.evaluate(evaluate)
    assert results["accuracy"] == pytest.approx(expected["accuracy"])
    assert results["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert not os.listdir(tmp_path / "fresh") or "ckpt" not in "".join(os.listdir(tmp_path / "fresh"))


def test_a_failed_warm_start_changes_nothing_in_model_dir(tmp_path, trained_with_adam):
    source_dir, _ = trained_with_adam
    wider = _warm_estimator(tmp_path / "wide", source_dir, model=lambda: SmallNet(hidden=32))
    with pytest.raises(ValueError, match=r"Shape of net.0.weight \(32, 8\) doesn.t match net.0.weight \(16, 8\)"):
        wider.train(input_fns()[0], max_steps=2)
    assert not os.path.exists(tmp_path / "wide") or os.listdir(tmp_path / "wide") == []


def test_warm_start_report_is_a_dry_run(tmp_path, trained_with_adam):
    source_dir, _ = trained_with_adam
    estimator = _warm_estimator(tmp_path / "dry", WarmStartSettings(source_dir, vars_to_warm_start="net\\.0"))
    plan = estimator.warm_start_report()
    text = plan.format()
    assert "net.0.weight" in text and "net.0.bias" in text
    assert {entry.target for entry in plan.entries} == {"net.0.weight", "net.0.bias"}
    assert not os.path.exists(tmp_path / "dry") or os.listdir(tmp_path / "dry") == []


def test_warm_start_from_a_torch_file(tmp_path):
    module = SmallNet()
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    estimator = _warm_estimator(tmp_path / "run", WarmStartSettings(str(tmp_path / "weights.pt"), [".*"]))
    list(estimator.predict(input_fns()[2]))
    for name, tensor in module.state_dict().items():
        assert torch.equal(estimator._model.module.state_dict()[name], tensor), name


def test_optimizer_state_is_warm_started_only_when_asked(tmp_path, trained_with_adam, te_logs):
    from helpers import adam

    source_dir, _ = trained_with_adam
    asked = _warm_estimator(
        tmp_path / "asked", WarmStartSettings(source_dir, [".*"], warm_start_optimizer=True), optimizer=adam
    )
    asked.train(input_fns()[0], max_steps=1)
    state = asked._store.restore().optimizer_state["optimizer"]["state"]
    assert int(state[0]["step"]) == 21  # 20 Adam steps from the source, one here
    not_asked = _warm_estimator(tmp_path / "plain", WarmStartSettings(source_dir, [".*"]), optimizer=adam)
    not_asked.train(input_fns()[0], max_steps=1)
    assert int(not_asked._store.restore().optimizer_state["optimizer"]["state"][0]["step"]) == 1
    switched = _warm_estimator(tmp_path / "sgd", WarmStartSettings(source_dir, [".*"], warm_start_optimizer=True))
    switched.train(input_fns()[0], max_steps=1)  # Adam state does not fit SGD: reset with a warning
    assert "optimizer changed" in te_logs.text
