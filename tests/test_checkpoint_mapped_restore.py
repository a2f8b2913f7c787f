"""A restore maps a local checkpoint's files copy-on-write (tensor_files.read_tensors) and checks them whole;
what is kept for the run (the optimizer's state) is copied out of the mapping, so no deleted checkpoint's disk
space stays held."""

from __future__ import annotations

import gc
import os
import shutil

import numpy as np
import pytest
import torch
from test_checkpoint import flip_byte
from torch import nn

from torchestimator._train_state import TrainState
from torchestimator.checkpoint import CheckpointError, CheckpointStore, InMemoryStorage, format as checkpoint_format
from torchestimator.checkpoint.parts import (
    TrainingParts,
    optimizer_signature,
    owning_memory,
    restore_shared,
)
from torchestimator.checkpoint.tensor_files import is_file_mapped


def _state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return {
        "weight": torch.randn(64, 32, generator=generator),
        "steps": torch.arange(7, dtype=torch.int64),
        "flags": torch.tensor([True, False, True]),
        "half": torch.randn(5, generator=generator).to(torch.bfloat16),
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(1.5, dtype=torch.float64),
    }


def _mapped_files() -> list[str]:
    """The files this process has mapped (from /proc/self/maps), deleted ones marked " (deleted)"."""
    with open("/proc/self/maps") as maps:
        return [line.split(maxsplit=5)[5].strip() for line in maps if len(line.split(maxsplit=5)) == 6]


pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads this process's mappings")


def test_restored_tensors_are_copy_on_write_views_of_the_verified_file(tmp_path):
    state = _state()
    store = CheckpointStore(tmp_path)
    path = store.save(1, state)
    model_file = os.path.join(path, checkpoint_format.MODEL_FILE)
    restored = store.restore(path).model_state
    assert list(restored) == list(state)
    for name, tensor in state.items():
        assert restored[name].dtype == tensor.dtype and torch.equal(restored[name], tensor), name
    assert model_file in _mapped_files()
    assert is_file_mapped(restored["weight"]) and not is_file_mapped(state["weight"])
    restored["weight"].fill_(7.0)  # copies the pages written, never the file
    again = store.restore(path).model_state  # still passes its checksum
    assert torch.equal(again["weight"], state["weight"])
    del restored, again
    gc.collect()
    assert model_file not in _mapped_files()  # the mapping goes with its last tensor


def test_a_flipped_byte_is_found_before_any_tensor_is_given(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(1, _state())
    model_file = os.path.join(path, checkpoint_format.MODEL_FILE)
    flip_byte(model_file, offset_from_end=9)
    with pytest.raises(CheckpointError, match=rf"{model_file} fails its checksum: crc32c is "):
        store.restore(path)
    gc.collect()
    assert model_file not in _mapped_files()  # nothing of the damaged file is kept


def test_a_storage_without_files_reads_into_new_tensors():
    store = CheckpointStore(InMemoryStorage())
    state = _state()
    store.save(1, state)
    restored = store.restore().model_state
    assert all(torch.equal(restored[name], state[name]) for name in state)
    assert not any(is_file_mapped(tensor) for tensor in restored.values())  # new tensors: the streamed path


def _parts(seed: int) -> TrainingParts:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 6)).square().mean().backward()
    optimizer.step()
    return TrainingParts(model=model, optimizer=optimizer, train_state=TrainState())


def test_the_optimizer_state_restored_owns_its_memory_and_holds_no_deleted_file(tmp_path):
    saved = _parts(0)
    store = CheckpointStore(tmp_path)
    path = store.save(
        1,
        saved.model.state_dict(),
        {"optimizer": saved.optimizer.state_dict()},
        {"optimizer_signature": optimizer_signature(saved.optimizer)},
    )
    optimizer_file = os.path.join(path, checkpoint_format.OPTIMIZER_TENSORS_FILE)
    fresh = _parts(1)
    checkpoint = store.restore(path)
    fresh.model.load_state_dict(checkpoint.model_state)
    restore_shared(checkpoint, {"optimizer": fresh.optimizer}, fresh.optimizer, fresh.model)
    for parameter, fresh_parameter in zip(saved.optimizer.state.values(), fresh.optimizer.state.values()):
        for key, value in parameter.items():
            assert torch.equal(fresh_parameter[key], value), key
            assert not is_file_mapped(fresh_parameter[key]), key  # copied out of the mapping
    del checkpoint
    gc.collect()
    shutil.rmtree(path)  # what retention does to an old checkpoint
    assert not [name for name in _mapped_files() if name.startswith(optimizer_file)]
    fresh.model(torch.randn(4, 6)).square().mean().backward()
    fresh.optimizer.step()  # trains on


def test_owning_memory_copies_only_views_of_a_mapped_file(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"mapped": torch.arange(6.0)})
    mapped = store.restore().model_state["mapped"]
    owned = torch.ones(3)
    tree = {"a": owned, "b": [mapped, 2], "c": (mapped,), "d": "text"}
    result = owning_memory(tree)
    assert result["a"] is owned and result["d"] == "text" and result["b"][1] == 2
    assert result["b"][0] is not mapped and torch.equal(result["b"][0], mapped) and not is_file_mapped(result["b"][0])
    assert isinstance(result["c"], tuple) and not is_file_mapped(result["c"][0])


def test_get_variable_value_is_a_copy_not_a_view_of_the_file(tmp_path):
    import torchestimator as te

    store = CheckpointStore(tmp_path)
    store.save(1, _state())
    estimator = te.Estimator(
        model_fn=lambda features, labels, mode: None,
        model=nn.Linear(2, 1),  # never called
        model_dir=str(tmp_path),
    )
    value = estimator.get_variable_value("weight")
    assert np.array_equal(value, _state()["weight"].numpy())
    assert value.flags.owndata and value.flags.writeable
    gc.collect()
    assert os.path.join(tmp_path, "ckpt-1", checkpoint_format.MODEL_FILE) not in _mapped_files()


def test_a_resumed_training_holds_no_checkpoint_file_mapped_while_it_runs(tmp_path):
    """Resume maps the checkpoint, copies what it keeps and lets the rest go: retention can free the old files."""
    from helpers import input_fns, make_estimator

    import torchestimator as te

    train, _, _, _ = input_fns(n=64)
    make_estimator(tmp_path, keep_checkpoint_max=1).train(train, max_steps=10)

    class MappedFiles(te.Hook):
        seen: list[list[str]] = []

        def after_step(self, run_context):
            gc.collect()
            self.seen.append([name for name in _mapped_files() if os.fspath(tmp_path) in name])

    make_estimator(tmp_path, keep_checkpoint_max=1).train(train, max_steps=30, hooks=[MappedFiles()])
    assert len(MappedFiles.seen) == 20 and not any(MappedFiles.seen), MappedFiles.seen[:3]
    assert sorted(path.name for path in tmp_path.glob("ckpt-*")) == ["ckpt-30"]  # ckpt-10 went, nothing holds it


def test_a_save_from_an_atexit_handler_is_written_and_restores(tmp_path):
    """Thread pools take no work once the interpreter shuts down: the listing and checksums run on the caller."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import atexit, torch
        from torchestimator.checkpoint import CheckpointStore
        store = CheckpointStore({os.fspath(tmp_path)!r})
        store.save(1, {{"w": torch.ones(4 << 20)}})
        atexit.register(lambda: print("saved", store.save(2, {{"w": torch.full((4 << 20,), 2.0)}})))
    """)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0 and "saved" in finished.stdout, finished.stderr[-2000:]
    checkpoint = CheckpointStore(tmp_path).restore()  # every checksum verified
    assert checkpoint.step == 2 and torch.equal(checkpoint.model_state["w"], torch.full((4 << 20,), 2.0))


@pytest.mark.parametrize("shape", [[0, 2**62, 2**62], [0, 2**40, 2**40, 2**10]])
def test_a_shape_no_tensor_can_hold_is_a_checkpoint_error(tmp_path, shape):
    import json
    import struct

    from torchestimator.checkpoint.tensor_files import read_tensors

    header = json.dumps({"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with open(path, "rb") as stream, pytest.raises(CheckpointError, match="crafted is not a readable safetensors"):
        read_tensors(stream, "crafted", size=path.stat().st_size, expected=None)
