"""The served heap: models frozen out of the collector's walks once loaded, and freed once unloaded (heap.py)."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch
from helpers import exporting_model_fn, trained_classifier

from torchestimator.export import RegressionOutput, TensorSpec, export_saved_model, serving_input_receiver
from torchestimator.serving import ModelManager, start
from torchestimator.serving.heap import _LOOK_AT_POLLS, FrozenHeap


@pytest.fixture(autouse=True)
def unfrozen():
    """The test process's heap is thawed again after each test, so nothing frozen here outlives it."""
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.collect()


class CyclicModel:
    """A model whose parts point back at it, as an exported graph's nodes do: only a collection frees it."""

    signature_names: tuple[str, ...] = ()

    def __init__(self, path: str) -> None:
        self.version = int(path.rstrip("/").rsplit("/", 1)[-1])
        self.parts = [{"owner": self} for _ in range(100)]


def add_version(base, version):
    (base / str(version)).mkdir(parents=True)


def served(manager):
    return [(manager.name, model) for model in manager.served_models()]


def test_a_loaded_model_is_frozen_and_an_unloaded_one_freed_at_the_next_poll(tmp_path):
    add_version(tmp_path, 1)
    manager, heap = ModelManager("m", tmp_path, loader=CyclicModel), FrozenHeap()
    manager.poll()
    heap.settle(served(manager))
    assert gc.get_freeze_count() > 0
    first = weakref.ref(manager.get())
    assert not any(part is first().parts[0] for part in gc.get_objects())  # frozen: the collector skips it

    add_version(tmp_path, 2)
    manager.poll()
    assert manager.served_versions == [2] and first() is not None  # a cycle: reference counting cannot free it
    heap.settle(served(manager))
    assert first() is None
    assert heap.retired_count == 0
    assert not any(isinstance(item, CyclicModel) and item.version == 2 for item in gc.get_objects())  # frozen


def test_a_model_a_request_still_holds_is_freed_at_a_later_look_once_released(tmp_path):
    add_version(tmp_path, 1)
    manager, heap = ModelManager("m", tmp_path, loader=CyclicModel), FrozenHeap()
    manager.poll()
    heap.settle(served(manager))
    in_flight = manager.get()  # a request that took version 1 before the swap
    first = weakref.ref(in_flight)
    add_version(tmp_path, 2)
    manager.poll()
    heap.settle(served(manager))  # the first look: still held
    assert first() is not None and heap.retired_count == 1
    del in_flight  # the request ends; its model is now only a frozen cycle
    for _ in range(_LOOK_AT_POLLS[2]):
        heap.settle(served(manager))
        if first() is None:
            break
    assert first() is None and heap.retired_count == 0


def test_a_model_held_past_the_last_look_is_given_up_with_a_warning(tmp_path, caplog):
    add_version(tmp_path, 1)
    manager, heap = ModelManager("m", tmp_path, loader=CyclicModel), FrozenHeap()
    manager.poll()
    heap.settle(served(manager))
    kept = manager.get()
    add_version(tmp_path, 2)
    manager.poll()
    with caplog.at_level(logging.WARNING, logger="torchestimator.serving.heap"):
        for _ in range(_LOOK_AT_POLLS[-1]):
            heap.settle(served(manager))
    assert heap.retired_count == 0  # no more full collections for it
    assert kept.version == 1
    assert any(
        "still referenced" in record.getMessage() and record.getMessage().startswith("m:") for record in caplog.records
    )


def test_an_unchanged_poll_collects_nothing(tmp_path, monkeypatch):
    add_version(tmp_path, 1)
    manager, heap = ModelManager("m", tmp_path, loader=CyclicModel), FrozenHeap()
    manager.poll()
    heap.settle(served(manager))
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args))
    for _ in range(5):
        manager.poll()
        heap.settle(served(manager))
    assert collections == []


model_fn = exporting_model_fn(lambda logits, predictions: {"score": RegressionOutput(logits[:, 0])})


def test_a_swapped_out_exported_program_is_freed(tmp_path):
    """The real thing: a torch.export program is a web of cycles, and a version swap frees it."""
    estimator, x = trained_classifier(tmp_path / "model", model_fn, steps=2)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    exported = export_saved_model(estimator, tmp_path / "export", receiver)
    base = tmp_path / "base"
    shutil.copytree(exported, base / "1")
    manager, heap = ModelManager("m", base), FrozenHeap()
    manager.poll()
    heap.settle(served(manager))
    first = weakref.ref(manager.get())
    gc.collect()
    assert first() is not None
    shutil.copytree(exported, base / "2")
    manager.poll()
    assert manager.served_versions == [2]
    heap.settle(served(manager))
    assert first() is None
    assert len(manager.get()({"x": x[:2]})["class"]) == 2  # the new version answers


def test_serve_freezes_its_models_before_the_first_request_and_start_does_not(tmp_path):
    estimator, _x = trained_classifier(tmp_path / "model", model_fn, steps=2)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    exported = export_saved_model(estimator, tmp_path / "export", receiver)
    shutil.copytree(exported, tmp_path / "base" / "1")
    script = textwrap.dedent(f"""
        import gc, os, signal
        from torchestimator.serving import serve

        def listening(app, port):
            print("frozen", gc.get_freeze_count(), flush=True)
            os.kill(os.getpid(), signal.SIGINT)

        serve("m", {str(tmp_path / "base")!r}, port=0, on_listening=listening, file_system_poll_wait_seconds=0)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 0, result.stderr
    frozen = int(result.stdout.split("frozen", 1)[1].split()[0])
    assert frozen > 10_000, result.stdout  # the exported program's objects, and everything imported before

    with start("m", tmp_path / "base", file_system_poll_wait_seconds=0) as server:
        assert server.managers["m"].served_versions == [1]
        assert gc.get_freeze_count() == 0  # a user's process: its heap is left alone
