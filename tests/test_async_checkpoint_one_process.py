"""RunConfig(async_checkpoint=True) with one process: saves are written by a background thread through the
checkpoint store, every checkpoint is complete and restorable, and the weights are those of a synchronous run."""

from __future__ import annotations

import json
import threading

import numpy as np
import torch
from helpers import make_estimator

from torchestimator import EstimatorSpec
from torchestimator.checkpoint.store import CheckpointStore
from torchestimator.data.inputs import numpy_input_fn


def _model_fn(model, features, labels, mode):
    prediction = model(features).squeeze(1)
    loss = torch.nn.functional.mse_loss(prediction, labels)
    return EstimatorSpec(mode, loss=loss)


def _train(model_dir, steps, **config):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = x.sum(axis=1).astype(np.float32)
    estimator = make_estimator(
        model_dir,
        model=lambda: torch.nn.Linear(4, 1),
        model_fn=_model_fn,
        save_checkpoints_steps=5,
        keep_checkpoint_max=100,
        random_seed=3,
        **config,
    )
    estimator.train(numpy_input_fn(x, y, batch_size=8, num_epochs=None, shuffle=True), max_steps=steps)
    return estimator


def _record_saving_threads(monkeypatch):
    threads = []
    save = CheckpointStore.save

    def recording_save(self, *args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return save(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointStore, "save", recording_save)
    return threads


def test_background_saves_give_the_synchronous_runs_checkpoints(tmp_path, monkeypatch):
    on_main_thread = _record_saving_threads(monkeypatch)
    _train(tmp_path / "sync", 20)
    assert on_main_thread == [True] * 4
    on_main_thread.clear()
    _train(tmp_path / "async", 20, async_checkpoint=True)
    assert on_main_thread == [False] * 4  # written by the background writer, not the loop
    for name in ("sync", "async"):
        manifest = json.loads((tmp_path / name / "checkpoint").read_text())
        assert "20" in json.dumps(manifest)
    sync_steps = sorted(p.name for p in (tmp_path / "sync").glob("ckpt-*"))
    async_steps = sorted(p.name for p in (tmp_path / "async").glob("ckpt-*"))
    assert async_steps == sync_steps == ["ckpt-10", "ckpt-15", "ckpt-20", "ckpt-5"]
    for step in (5, 10, 15, 20):  # every background save is complete and holds the same tensors
        for file in ("model.safetensors", "optimizer.safetensors"):
            assert (tmp_path / "sync" / f"ckpt-{step}" / file).read_bytes() == (
                tmp_path / "async" / f"ckpt-{step}" / file
            ).read_bytes(), (step, file)


def test_a_run_resumed_from_background_saves_continues_exactly(tmp_path):
    _train(tmp_path / "async", 10, async_checkpoint=True)
    resumed = _train(tmp_path / "async", 20, async_checkpoint=True)
    straight = _train(tmp_path / "sync", 20)
    assert resumed.get_variable_names() == straight.get_variable_names()
    for name in straight.get_variable_names():
        np.testing.assert_array_equal(resumed.get_variable_value(name), straight.get_variable_value(name))
    assert (tmp_path / "async" / "ckpt-20" / "model.safetensors").read_bytes() == (
        tmp_path / "sync" / "ckpt-20" / "model.safetensors"
    ).read_bytes()
