"""LatestExporter, BestExporter, FinalExporter: when they export, which versions stay on disk, whose weights they
hold, and the best surviving a restart."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from helpers import input_fns, make_estimator

from torchestimator._policy.train_and_evaluate import EvalSpec
from torchestimator.export import (
    BestExporter,
    Exporter,
    FinalExporter,
    LatestExporter,
    TensorSpec,
    garbage_collect_exports,
    list_versions,
    load,
    loss_smaller,
    read_best_eval,
    saved_model,
    serving_input_receiver,
)

RECEIVER = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An estimator trained 30 steps (ckpt-10, ckpt-20, ckpt-30), its features, and each checkpoint's predictions."""
    train, _, predict, (x, _) = input_fns(n=64)
    estimator = make_estimator(tmp_path_factory.mktemp("model"))
    estimator.train(train, max_steps=30)
    checkpoints = {step: os.path.join(estimator.model_dir, f"ckpt-{step}") for step in (10, 20, 30)}
    probabilities = {
        step: np.stack([p["probabilities"] for p in estimator.predict(predict, checkpoint_path=path)])
        for step, path in checkpoints.items()
    }
    # The checkpoints must tell apart, or "the export holds ckpt-30's weights" would prove nothing.
    assert not np.allclose(probabilities[10], probabilities[30], atol=1e-4)
    return estimator, x, checkpoints, probabilities


def exported_probabilities(version_dir, x):
    return load(version_dir)({"x": x})["probabilities"]


def version_dirs(export_path):
    return [os.path.join(export_path, str(version)) for version in list_versions(export_path)]


@pytest.fixture
def fake_exports(monkeypatch):
    """Replaces the real export with one that makes the next integer folder and records the call."""
    calls = []

    def fake_export(estimator, export_dir_base, receiver, checkpoint_path=None, assets_extra=None):
        os.makedirs(export_dir_base, exist_ok=True)
        path = os.path.join(export_dir_base, str(1000 + len(calls)))
        os.mkdir(path)
        calls.append({"path": path, "checkpoint_path": checkpoint_path, "receiver": receiver})
        return path

    monkeypatch.setattr(saved_model, "export_saved_model", fake_export)
    return calls


# -- BestExporter ---------------------------------------------------------------------------------


def test_best_exporter_exports_only_improvements_with_the_best_checkpoints_weights(trained, tmp_path):
    estimator, x, checkpoints, probabilities = trained
    export_path = str(tmp_path / "best")
    exporter = BestExporter(serving_input_receiver=RECEIVER)
    first = exporter.export(estimator, export_path, checkpoints[10], {"loss": 0.5, "global_step": 10}, False)
    worse = exporter.export(estimator, export_path, checkpoints[20], {"loss": 0.7, "global_step": 20}, False)
    better = exporter.export(
        estimator, export_path, checkpoints[30], {"loss": torch.tensor(0.3), "global_step": 30}, False
    )
    assert worse is None and first is not None and better is not None
    assert version_dirs(export_path) == [first, better]  # nothing was written for the worse evaluation
    np.testing.assert_allclose(exported_probabilities(first, x), probabilities[10], rtol=0, atol=1e-6)
    np.testing.assert_allclose(exported_probabilities(better, x), probabilities[30], rtol=0, atol=1e-6)
    record = read_best_eval(export_path)
    assert record["eval_result"] == {"loss": pytest.approx(0.3), "global_step": 30}
    assert record["checkpoint_path"] == checkpoints[30] and record["export_dir"] == os.path.abspath(better)
    assert sorted(os.listdir(export_path)) == sorted(
        [os.path.basename(first), os.path.basename(better), "best_eval.json"]
    )  # no temporary file left


def test_best_exporter_after_a_restart_compares_with_the_recorded_best(tmp_path, fake_exports):
    # tensorflow/tensorflow#47396: TF's BestExporter exported the first result it saw after a restart.
    first = BestExporter(serving_input_receiver=RECEIVER).export(None, str(tmp_path), "ckpt-10", {"loss": 0.2}, False)
    restarted = BestExporter(serving_input_receiver=RECEIVER)
    assert restarted.export(None, str(tmp_path), "ckpt-20", {"loss": 0.4}, False) is None
    assert version_dirs(tmp_path) == [first]
    better = restarted.export(None, str(tmp_path), "ckpt-30", {"loss": 0.1}, False)
    assert version_dirs(tmp_path) == [first, better]
    assert read_best_eval(tmp_path)["checkpoint_path"] == "ckpt-30"


def test_best_exporter_ties_and_nan_are_not_improvements(tmp_path, fake_exports):
    exporter = BestExporter(serving_input_receiver=RECEIVER)
    first = exporter.export(None, str(tmp_path), "ckpt-10", {"loss": 0.5}, False)
    assert exporter.export(None, str(tmp_path), "ckpt-20", {"loss": 0.5}, False) is None  # a tie keeps the earlier
    assert exporter.export(None, str(tmp_path), "ckpt-30", {"loss": math.nan}, False) is None
    assert version_dirs(tmp_path) == [first] and read_best_eval(tmp_path)["checkpoint_path"] == "ckpt-10"
    # A NaN that was recorded first (nothing to compare with) is beaten by any number.
    nan_first = tmp_path / "nan_first"
    assert exporter.export(None, str(nan_first), "ckpt-10", {"loss": math.nan}, False) is not None
    assert exporter.export(None, str(nan_first), "ckpt-20", {"loss": 9.0}, False) is not None
    assert read_best_eval(nan_first)["checkpoint_path"] == "ckpt-20"


def test_best_exporter_by_metric_name_and_missing_metrics(tmp_path, fake_exports):
    exporter = BestExporter(serving_input_receiver=RECEIVER, metric_name="accuracy", higher_is_better=True)
    first = exporter.export(None, str(tmp_path), "c1", {"accuracy": 0.8, "loss": 0.5}, False)
    assert exporter.export(None, str(tmp_path), "c2", {"accuracy": 0.7, "loss": 0.1}, False) is None
    third = exporter.export(None, str(tmp_path), "c3", {"accuracy": 0.9, "loss": 0.9}, False)
    assert version_dirs(tmp_path) == [first, third]
    missing = BestExporter(serving_input_receiver=RECEIVER, metric_name="auc", higher_is_better=True)
    with pytest.raises(
        ValueError,
        match=r"BestExporter metric 'auc' is not in current_eval_result .*"
        r"produced \['accuracy', 'loss'\]",
    ):
        missing.export(None, str(tmp_path / "other"), "c1", {"accuracy": 0.8, "loss": 0.5}, False)
    with pytest.raises(
        ValueError,
        match=r"default compare_fn metric 'loss' is not in .*produced \['accuracy'\]. "
        r"Pass compare_fn=\.\.\., or metric_name=\.\.\.",
    ):
        BestExporter(serving_input_receiver=RECEIVER).export(
            None, str(tmp_path / "third"), "c1", {"accuracy": 1.0}, False
        )
    assert len(fake_exports) == 2 and not (tmp_path / "other").exists() and not (tmp_path / "third").exists()


def test_custom_compare_fn_and_a_damaged_record(tmp_path, fake_exports):
    def step_larger(best_eval_result, current_eval_result):
        return current_eval_result["global_step"] > best_eval_result["global_step"]

    exporter = BestExporter(serving_input_receiver=RECEIVER, compare_fn=step_larger)
    first = exporter.export(None, str(tmp_path), "c1", {"global_step": 5}, False)
    assert exporter.export(None, str(tmp_path), "c2", {"global_step": 4}, False) is None
    assert version_dirs(tmp_path) == [first]
    (tmp_path / "best_eval.json").write_text('{"eval_res')
    with pytest.raises(ValueError, match="best_eval.json is unreadable.*Delete it"):
        exporter.export(None, str(tmp_path), "c3", {"global_step": 9}, False)
    assert version_dirs(tmp_path) == [first]


def test_loss_smaller_is_tensorflows_default():
    assert loss_smaller({"loss": 1.0}, {"loss": 0.5}) is True
    assert loss_smaller({"loss": 0.5}, {"loss": 0.5}) is False
    assert loss_smaller({"loss": 0.5}, {"loss": 1.0}) is False
    with pytest.raises(ValueError, match=r"'loss' is not in current_eval_result .*produced \['accuracy'\]"):
        loss_smaller({"loss": 1.0}, {"accuracy": 0.5})
    with pytest.raises(ValueError, match=r"'loss' is not in best_eval_result"):
        loss_smaller(None, {"loss": 0.5})


# -- LatestExporter and FinalExporter ----------------------------------------------------------------


def test_latest_exporter_exports_every_evaluation_and_keeps_the_newest(trained, tmp_path):
    estimator, x, checkpoints, probabilities = trained
    export_path = tmp_path / "latest"
    (export_path / "temp-5").mkdir(parents=True)
    (export_path / "notes").mkdir()
    exporter = LatestExporter("latest", lambda: RECEIVER, exports_to_keep=2)  # TF's serving_input_receiver_fn form
    paths = [
        exporter.export(estimator, str(export_path), checkpoints[step], {"loss": 1.0, "global_step": step}, False)
        for step in (10, 20, 30)
    ]
    assert version_dirs(export_path) == paths[1:] and not os.path.exists(paths[0])
    assert (export_path / "temp-5").exists() and (export_path / "notes").exists()  # only integer versions are collected
    for path, step in zip(paths[1:], (20, 30)):
        model = load(path)
        assert model.metadata["checkpoint_path"] == os.path.abspath(checkpoints[step])
        assert model.metadata["global_step"] == step
        np.testing.assert_allclose(model({"x": x})["probabilities"], probabilities[step], rtol=0, atol=1e-6)
    assert load(export_path).path == paths[-1]  # the base folder serves the newest
    with open(os.path.join(paths[-1], "signature.json")) as handle:
        assert json.load(handle)["signatures"]["serving_default"]["inputs"]["x"]["shape"] == [-1, 8]


def test_final_exporter_exports_only_the_final_evaluation(trained, tmp_path):
    estimator, x, checkpoints, probabilities = trained
    export_path = str(tmp_path / "final")
    exporter = FinalExporter("final", RECEIVER)
    assert exporter.export(estimator, export_path, checkpoints[10], {"loss": 1.0}, is_the_final_export=False) is None
    assert not os.path.exists(export_path)  # not even the folder
    path = exporter.export(estimator, export_path, checkpoints[20], {"loss": 1.0}, is_the_final_export=True)
    assert version_dirs(export_path) == [path]
    np.testing.assert_allclose(exported_probabilities(path, x), probabilities[20], rtol=0, atol=1e-6)


# -- arguments, retention, the interface -------------------------------------------------------------


def test_exporter_arguments_are_checked_at_construction():
    with pytest.raises(ValueError, match="exports_to_keep must be a positive int"):
        LatestExporter("latest", RECEIVER, exports_to_keep=0)
    with pytest.raises(ValueError, match="non-empty folder name"):
        LatestExporter("", RECEIVER)
    with pytest.raises(ValueError, match="BestExporter needs serving_input_receiver"):
        BestExporter()
    with pytest.raises(ValueError, match="either compare_fn or metric_name"):
        BestExporter(
            serving_input_receiver=RECEIVER, compare_fn=loss_smaller, metric_name="loss", higher_is_better=False
        )
    with pytest.raises(ValueError, match="needs higher_is_better"):
        BestExporter(serving_input_receiver=RECEIVER, metric_name="accuracy")
    with pytest.raises(ValueError, match="must take two arguments"):
        BestExporter(serving_input_receiver=RECEIVER, compare_fn=lambda current: True)
    with pytest.raises(TypeError, match="ServingInputReceiver"):
        LatestExporter("latest", {"x": TensorSpec(shape=(None, 8))})


def test_garbage_collection_keeps_the_newest_integer_versions(tmp_path):
    for name in ("5", "10", "9", "temp-11", "best_eval.json"):
        (tmp_path / name).mkdir()
    deleted = garbage_collect_exports(tmp_path, 2)
    assert sorted(os.path.basename(path) for path in deleted) == ["5"]
    assert sorted(os.listdir(tmp_path)) == ["10", "9", "best_eval.json", "temp-11"]


def test_an_exporter_must_implement_name_and_export():
    class Forgetful(Exporter):  # a user's exporter without export()
        name = "forgetful"

    with pytest.raises(TypeError, match="abstract method.*export"):
        Forgetful()
    with pytest.raises(TypeError, match="abstract method"):
        Exporter()
    latest = LatestExporter("latest", RECEIVER)
    assert EvalSpec(lambda: [], exporters=latest).exporters == (latest,)


def test_an_exporter_does_not_export_the_same_checkpoint_twice(trained, tmp_path):
    estimator, _x, checkpoints, _probabilities = trained
    export_path = str(tmp_path / "final")
    final = FinalExporter("final", RECEIVER)
    first = final.export(estimator, export_path, checkpoints[20], {"loss": 1.0}, is_the_final_export=True)
    # A rerun of a finished job evaluates and exports its last checkpoint again: the version it has is returned.
    again = FinalExporter("final", RECEIVER).export(
        estimator, export_path, checkpoints[20], {"loss": 1.0}, is_the_final_export=True
    )
    assert again == first and version_dirs(export_path) == [first]
    newer = final.export(estimator, export_path, checkpoints[30], {"loss": 1.0}, is_the_final_export=True)
    assert newer != first and version_dirs(export_path) == [first, newer]
    fixed_batch = serving_input_receiver({"x": TensorSpec(shape=(4, 8), dtype=torch.float32)})
    changed = FinalExporter("final", fixed_batch).export(
        estimator, export_path, checkpoints[30], {"loss": 1.0}, is_the_final_export=True
    )
    assert changed not in (first, newer)  # another serving signature is another export
