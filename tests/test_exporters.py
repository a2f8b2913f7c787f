"""LatestExporter, BestExporter, FinalExporter: when they export, what they keep, and the best surviving a restart."""

from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import input_fns, make_estimator
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
    serving_input_receiver,
)
from torchestimator.export import saved_model

RECEIVER = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})


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


def test_latest_exporter_exports_every_time_and_keeps_the_newest(tmp_path, fake_exports):
    (tmp_path / "temp-5").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    exporter = LatestExporter("latest", RECEIVER, exports_to_keep=2)
    paths = [exporter.export(None, str(tmp_path), f"ckpt-{step}", {"loss": 1.0}, False) for step in (10, 20, 30)]
    assert paths == [call["path"] for call in fake_exports] and fake_exports[-1]["checkpoint_path"] == "ckpt-30"
    assert list_versions(tmp_path) == [1001, 1002]
    assert (tmp_path / "temp-5").exists() and (tmp_path / "notes").exists()  # only integer versions are collected
    assert exporter.name == "latest"


def test_final_exporter_exports_only_the_final_evaluation(tmp_path, fake_exports):
    exporter = FinalExporter("final", RECEIVER)
    assert exporter.export(None, str(tmp_path), "ckpt-10", {"loss": 1.0}, is_the_final_export=False) is None
    path = exporter.export(None, str(tmp_path), "ckpt-20", {"loss": 1.0}, is_the_final_export=True)
    assert path == fake_exports[0]["path"] and len(fake_exports) == 1


def test_best_exporter_exports_only_improvements_and_records_the_best(tmp_path, fake_exports):
    exporter = BestExporter(serving_input_receiver=RECEIVER)
    assert exporter.name == "best_exporter"
    first = exporter.export(None, str(tmp_path), "ckpt-10", {"loss": 0.5, "global_step": 10}, False)
    assert first is not None  # nothing recorded yet: the first result is the best so far
    assert exporter.export(None, str(tmp_path), "ckpt-20", {"loss": 0.7, "global_step": 20}, False) is None
    better = exporter.export(None, str(tmp_path), "ckpt-30", {"loss": torch.tensor(0.3), "global_step": 30}, False)
    assert better == fake_exports[-1]["path"] and len(fake_exports) == 2
    record = read_best_eval(tmp_path)
    assert record["eval_result"] == {"loss": pytest.approx(0.3), "global_step": 30}
    assert record["checkpoint_path"] == "ckpt-30" and record["export_dir"] == os.path.abspath(better)
    assert not any(name.startswith("best_eval.json.tmp") for name in os.listdir(tmp_path))


def test_best_exporter_after_a_restart_compares_with_the_recorded_best(tmp_path, fake_exports):
    # tensorflow/tensorflow#47396: TF's BestExporter exported the first result it saw after a restart.
    BestExporter(serving_input_receiver=RECEIVER).export(None, str(tmp_path), "ckpt-10", {"loss": 0.2}, False)
    restarted = BestExporter(serving_input_receiver=RECEIVER)
    assert restarted.export(None, str(tmp_path), "ckpt-20", {"loss": 0.4}, False) is None
    assert len(fake_exports) == 1
    assert restarted.export(None, str(tmp_path), "ckpt-30", {"loss": 0.1}, False) is not None
    assert read_best_eval(tmp_path)["eval_result"]["loss"] == 0.1


def test_best_exporter_by_metric_name_and_missing_metrics(tmp_path, fake_exports):
    exporter = BestExporter(serving_input_receiver=RECEIVER, metric_name="accuracy", higher_is_better=True)
    assert exporter.export(None, str(tmp_path), "c1", {"accuracy": 0.8, "loss": 0.5}, False) is not None
    assert exporter.export(None, str(tmp_path), "c2", {"accuracy": 0.7, "loss": 0.1}, False) is None
    assert exporter.export(None, str(tmp_path), "c3", {"accuracy": 0.9, "loss": 0.9}, False) is not None
    missing = BestExporter(serving_input_receiver=RECEIVER, metric_name="auc", higher_is_better=True)
    with pytest.raises(ValueError, match=r"metric_name 'auc' is not in the .* evaluation result; .*\['accuracy', 'loss'\]"):
        missing.export(None, str(tmp_path / "other"), "c1", {"accuracy": 0.8, "loss": 0.5}, False)
    with pytest.raises(ValueError, match=r"no 'loss' for the default compare_fn; it has \['accuracy'\]"):
        BestExporter(serving_input_receiver=RECEIVER).export(None, str(tmp_path / "third"), "c1", {"accuracy": 1.0}, False)
    assert len(fake_exports) == 2 and not (tmp_path / "other").exists()


def test_custom_compare_fn_and_a_damaged_record(tmp_path, fake_exports):
    def step_larger(best_eval_result, current_eval_result):
        return current_eval_result["global_step"] > best_eval_result["global_step"]

    exporter = BestExporter(serving_input_receiver=RECEIVER, compare_fn=step_larger)
    assert exporter.export(None, str(tmp_path), "c1", {"global_step": 5}, False) is not None
    assert exporter.export(None, str(tmp_path), "c2", {"global_step": 4}, False) is None
    (tmp_path / "best_eval.json").write_text('{"eval_res')
    with pytest.raises(ValueError, match="best_eval.json is unreadable.*Delete it"):
        exporter.export(None, str(tmp_path), "c3", {"global_step": 9}, False)


def test_loss_smaller_is_tensorflows_default():
    assert loss_smaller({"loss": 1.0}, {"loss": 0.5}) is True
    assert loss_smaller({"loss": 0.5}, {"loss": 0.5}) is False
    with pytest.raises(ValueError, match="current_eval_result has no 'loss'"):
        loss_smaller({"loss": 1.0}, {"accuracy": 0.5})


def test_exporter_arguments_are_checked_at_construction():
    with pytest.raises(ValueError, match="exports_to_keep must be a positive int"):
        LatestExporter("latest", RECEIVER, exports_to_keep=0)
    with pytest.raises(ValueError, match="non-empty folder name"):
        LatestExporter("", RECEIVER)
    with pytest.raises(ValueError, match="BestExporter needs serving_input_receiver"):
        BestExporter()
    with pytest.raises(ValueError, match="either compare_fn or metric_name"):
        BestExporter(serving_input_receiver=RECEIVER, compare_fn=loss_smaller, metric_name="loss", higher_is_better=False)
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


def test_a_custom_exporter_implements_the_interface(tmp_path):
    class Recording(Exporter):
        name = "recording"

        def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
            return os.path.join(export_path, "1")

    assert Recording().export(None, str(tmp_path), None, {}, True) == os.path.join(str(tmp_path), "1")
    with pytest.raises(TypeError):
        Exporter()


def test_latest_exporter_exports_the_evaluated_checkpoint_for_real(tmp_path):
    train, _, _, (x, _) = input_fns(n=64)
    estimator = make_estimator(tmp_path / "model")
    estimator.train(train, max_steps=20)
    evaluated = os.path.join(str(tmp_path / "model"), "ckpt-10")
    export_path = os.path.join(estimator.model_dir, "export", "latest")
    exporter = LatestExporter("latest", lambda: RECEIVER)  # TF's serving_input_receiver_fn form
    path = exporter.export(estimator, export_path, evaluated, {"loss": 0.5, "global_step": 10}, False)
    model = load(export_path)
    assert model.path == path and model.metadata["checkpoint_path"] == os.path.abspath(evaluated)
    assert model.metadata["global_step"] == 10
    assert model({"x": x[:4]})["probabilities"].shape == (4, 3)
    with open(os.path.join(path, "signature.json")) as handle:
        assert json.load(handle)["signatures"]["serving_default"]["inputs"]["x"]["shape"] == [-1, 8]
