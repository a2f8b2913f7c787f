"""Tests of the checkpoint store: tree codec, storages, atomicity, fallback, retention."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import struct
import subprocess
import sys

import pytest
import safetensors.torch
import torch

from torchestimator._io.atomic import writer_tag
from torchestimator.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    InMemoryStorage,
    LocalStorage,
    flatten_state,
    unflatten_state,
)
from torchestimator.checkpoint.errors import DiskFullError
from torchestimator.checkpoint.storage import Storage

STORE_LOGGER = "torchestimator.checkpoint.store"
PAYLOAD_NAN = struct.unpack(">d", bytes.fromhex("7ff8000000000123"))[0]  # a NaN with non-default bits


# ------------------------------------------------------------------ helpers


def _bits(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.detach().reshape(-1).contiguous().view(torch.uint8).tolist())


def assert_same_tree(actual, expected, path="tree"):
    """Equal values and equal types, floats and tensors compared bit for bit."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, path
        assert _bits(actual) == _bits(expected), path
    elif isinstance(expected, float):
        assert struct.pack(">d", actual) == struct.pack(">d", expected), f"{path}: {actual} != {expected}"
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            assert_same_tree(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for index, (left, right) in enumerate(zip(actual, expected)):
            assert_same_tree(left, right, f"{path}[{index}]")
    else:
        assert actual == expected, path


def through_files(tree):
    """Flatten, write as JSON text and safetensors bytes, read back, unflatten."""
    json_tree, tensors = flatten_state(tree)
    text = json.dumps(json_tree, allow_nan=False)
    data = safetensors.torch.save({name: tensor.contiguous() for name, tensor in tensors.items()})
    return unflatten_state(json.loads(text), safetensors.torch.load(data))


def make_storage(kind, tmp_path) -> Storage:
    return InMemoryStorage() if kind == "memory" else LocalStorage(tmp_path / "model_dir")


def small_state(value: float) -> dict[str, torch.Tensor]:
    return {"weight": torch.full((2, 3), value), "bias": torch.tensor([value, -value])}


def steps_of(store: CheckpointStore) -> list[int]:
    return [int(os.path.basename(path).split("-")[1]) for path in store.all_checkpoints()]


def flip_byte(path, offset_from_end: int = 1) -> None:
    with open(path, "r+b") as stream:
        stream.seek(-offset_from_end, os.SEEK_END)
        byte = stream.read(1)
        stream.seek(-offset_from_end, os.SEEK_END)
        stream.write(bytes([byte[0] ^ 0xFF]))


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------ serialization


def test_tree_round_trip_keeps_types_and_bits():
    tree = {
        "state": {0: {"step": torch.tensor(3.0), "buffer": torch.arange(6, dtype=torch.int64).reshape(2, 3)}, 7: {}},
        "groups": [{"betas": (0.9, 0.999), "params": [0, 7], "nesterov": False, "foreach": None, "name": "a"}],
        "floats": [-0.0, 5e-324, 0.1, 1e308, math.inf, -math.inf, math.nan, PAYLOAD_NAN],
        "big_int": 2**70,
        "dtypes": [
            torch.ones(2, dtype=torch.bfloat16),
            torch.tensor(True),
            torch.zeros(0, 3),
            torch.ones(2, dtype=torch.complex64),
        ],
        "nested": ((1, (2.5, "x")), []),
        "size": torch.Size([2, 3]),
        "mixed_keys": {(1, "a"): 1, None: 2, 1.5: 3, True: 4},
        "tag_lookalike": {"__tuple__": [1, 2]},
    }
    assert_same_tree(through_files(tree), tree)


def test_flatten_names_tensors_by_path():
    json_tree, tensors = flatten_state({"state": {0: {"exp_avg": torch.ones(2)}}}, root="optimizer")
    assert list(tensors) == ['optimizer["state"][0]["exp_avg"]']
    assert "__dict__" in json_tree["state"]  # int keys survive as ints, not JSON strings


def test_unsupported_leaf_names_its_path():
    with pytest.raises(TypeError) as error:
        flatten_state({"param_groups": [{"lr": 0.1, "foo": lambda epoch: 1.0}]})
    assert 'state["param_groups"][0]["foo"]' in str(error.value)
    assert "function" in str(error.value)


def test_lambda_lr_with_a_callable_object_holding_a_function_is_refused():
    class Warmup:
        def __init__(self):
            self.curve = math.cos  # a function attribute ends up in LambdaLR.state_dict()

        def __call__(self, epoch):
            return 1.0

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, Warmup())
    with pytest.raises(TypeError, match=r'state\["lr_lambdas"\]\[0\]\["curve"\]'):
        flatten_state(scheduler.state_dict())


def test_unsupported_dict_key_is_refused():
    with pytest.raises(TypeError, match=r"dict key"):
        flatten_state({object(): 1})


def test_unflatten_reports_missing_tensor_and_bad_tags():
    with pytest.raises(ValueError, match="exp_avg"):
        unflatten_state({"a": {"__tensor__": "exp_avg"}}, {})
    with pytest.raises(ValueError, match="bad float"):
        unflatten_state({"a": {"__float__": "huge"}}, {})


def _train(model, optimizer, scheduler, steps, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        inputs = torch.randn(8, 4, generator=generator)
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()


OPTIMIZERS = {
    "adam": lambda params: torch.optim.Adam(params, lr=0.01, betas=(0.8, 0.95)),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True),
}
SCHEDULERS = {
    "step": lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5),
    "cosine": lambda optimizer: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=7),
    "one_cycle": lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=20),
}


@pytest.mark.parametrize("scheduler_name", sorted(SCHEDULERS))
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_optimizer_and_scheduler_round_trip_steps_identically(optimizer_name, scheduler_name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    scheduler = SCHEDULERS[scheduler_name](optimizer)
    _train(model, optimizer, scheduler, steps=3, seed=1)

    state = through_files({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()})
    assert_same_tree(state["optimizer"], optimizer.state_dict())
    assert_same_tree(state["scheduler"], scheduler.state_dict())

    resumed = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    resumed.load_state_dict(model.state_dict())
    resumed_optimizer = OPTIMIZERS[optimizer_name](resumed.parameters())
    resumed_scheduler = SCHEDULERS[scheduler_name](resumed_optimizer)
    resumed_optimizer.load_state_dict(state["optimizer"])
    resumed_scheduler.load_state_dict(state["scheduler"])

    _train(model, optimizer, scheduler, steps=4, seed=2)
    _train(resumed, resumed_optimizer, resumed_scheduler, steps=4, seed=2)
    for name, tensor in model.state_dict().items():
        assert _bits(resumed.state_dict()[name]) == _bits(tensor), name
    assert resumed_scheduler.get_last_lr() == scheduler.get_last_lr()


def test_reduce_on_plateau_state_with_infinities_round_trips():
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    assert scheduler.state_dict()["best"] == math.inf
    assert_same_tree(through_files(scheduler.state_dict()), scheduler.state_dict())


# ------------------------------------------------------------- save/restore


@pytest.fixture(params=["memory", "local"])
def storage(request, tmp_path) -> Storage:
    return make_storage(request.param, tmp_path)


def test_storages_behave_alike_behind_the_protocol(storage):
    # The store's policy is written once against Storage, so the fake must answer as the disk does.
    assert storage.read_manifest() is None and storage.list_folders() == []
    storage.write_file(".tmp-ckpt-1-x", "a.bin", b"0123456789")
    storage.write_file(".tmp-ckpt-1-x", "a.bin", b"abcdef")  # rewritten whole, not patched
    assert storage.read_file(".tmp-ckpt-1-x", "a.bin") == b"abcdef"
    assert storage.read_file(".tmp-ckpt-1-x", "a.bin", start=2, length=3) == b"cde"
    with pytest.raises(FileNotFoundError):
        storage.read_file(".tmp-ckpt-1-x", "missing.bin")
    storage.rename_folder(".tmp-ckpt-1-x", "ckpt-1")
    storage.write_file("ckpt-2", "a.bin", b"2")
    assert storage.list_folders() == ["ckpt-1", "ckpt-2"]
    with pytest.raises(FileExistsError):
        storage.rename_folder("ckpt-1", "ckpt-2")
    assert storage.read_file("ckpt-2", "a.bin") == b"2" and storage.read_file("ckpt-1", "a.bin") == b"abcdef"
    storage.delete_folder("ckpt-2")
    storage.delete_folder("ckpt-2")  # a missing folder is not an error
    assert storage.list_folders() == ["ckpt-1"]
    storage.replace_manifest(b"one")
    storage.replace_manifest(b"two")
    assert storage.read_manifest() == b"two"
    assert storage.remove_stale_temporaries() == []  # this process's writes left no temporary behind
    assert storage.location("ckpt-1") == f"{storage.root}/ckpt-1"


def test_weights_round_trip_bit_exact(storage):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 4))
    model(torch.randn(5, 3))  # updates the BatchNorm running statistics
    state = dict(model.state_dict())
    state["half"] = torch.randn(3, 2).to(torch.bfloat16)
    state["transposed"] = torch.randn(3, 5).t()  # not contiguous
    state["scalar"] = torch.tensor(7, dtype=torch.int64)
    store = CheckpointStore(storage)
    path = store.save(10, state)

    checkpoint = store.restore()
    assert isinstance(checkpoint, Checkpoint)
    assert (checkpoint.path, checkpoint.step, checkpoint.optimizer_state, checkpoint.extra) == (path, 10, None, {})
    assert_same_tree(dict(checkpoint.model_state), {name: value.contiguous() for name, value in state.items()})
    assert checkpoint.model_state["1.num_batches_tracked"].item() == 1


def test_tied_and_view_tensors_are_saved(storage):
    embedding = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = embedding.weight  # tied weights: one storage, two names
    state = {"embedding.weight": embedding.weight, "head.weight": head.weight, "row": embedding.weight[1]}
    store = CheckpointStore(storage)
    store.save(1, state)
    restored = store.read_model_state()
    for name, tensor in state.items():
        assert torch.equal(restored[name], tensor.detach()), name


def test_optimizer_and_extra_round_trip_through_store(storage):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
    _train(model, optimizer, scheduler, steps=2, seed=3)
    extra = {"rng": {"torch": torch.get_rng_state(), "python": (3, (1, 2), None)}, "input_position": 16, "epoch": 0}
    store = CheckpointStore(storage)
    store.save(2, model.state_dict(), {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, extra)

    checkpoint = store.restore()
    assert_same_tree(checkpoint.optimizer_state["optimizer"], optimizer.state_dict())
    assert_same_tree(checkpoint.optimizer_state["scheduler"], scheduler.state_dict())
    assert_same_tree(checkpoint.extra, extra)
    assert store.restore(load_optimizer=False).optimizer_state is None


def test_save_rejects_bad_arguments(storage):
    store = CheckpointStore(storage)
    with pytest.raises(TypeError, match=r"model_state\['weight'\]"):
        store.save(1, {"weight": [1.0, 2.0]})
    with pytest.raises(ValueError, match="steps >= 0"):
        store.save(-1, small_state(1.0))
    with pytest.raises(TypeError, match="int steps"):
        store.save(1.5, small_state(1.0))
    with pytest.raises(TypeError, match=r'extra\["callback"\]'):
        store.save(1, small_state(1.0), extra={"callback": print})
    assert store.all_checkpoints() == []


@pytest.mark.parametrize("keep_checkpoint_max", [-1, 1.5, True])
def test_store_rejects_bad_settings(keep_checkpoint_max):
    with pytest.raises(ValueError, match="keep_checkpoint_max"):
        CheckpointStore(InMemoryStorage(), keep_checkpoint_max=keep_checkpoint_max)
    with pytest.raises(ValueError, match="keep_checkpoint_every_n_hours"):
        CheckpointStore(InMemoryStorage(), keep_checkpoint_every_n_hours=0)


def test_saving_an_existing_step_replaces_it(storage):
    store = CheckpointStore(storage)
    store.save(5, small_state(1.0))
    path = store.save(5, small_state(2.0))
    assert store.all_checkpoints() == [path]
    assert torch.equal(store.read_model_state()["weight"], torch.full((2, 3), 2.0))
    assert [folder for folder in storage.list_folders() if folder.startswith(".")] == []


def test_empty_model_dir(storage):
    store = CheckpointStore(storage)
    assert store.latest_checkpoint() is None
    assert store.all_checkpoints() == []
    with pytest.raises(CheckpointError, match="No checkpoint"):
        store.restore()
    with pytest.raises(CheckpointError, match="No checkpoint"):
        store.list_variables()


def test_list_variables_and_history(storage):
    clock = FakeClock(100.0)
    store = CheckpointStore(storage, clock=clock)
    store.save(1, small_state(1.0))
    clock.now = 200.0
    store.save(2, {"weight": torch.zeros(4, 5, dtype=torch.float16), "count": torch.tensor(3)})
    store.mark_best([1])
    assert store.list_variables() == [("count", (), torch.int64), ("weight", (4, 5), torch.float16)]
    first = store.all_checkpoints()[0]
    assert store.list_variables(first) == [("bias", (2,), torch.float32), ("weight", (2, 3), torch.float32)]
    assert store.history() == [
        {"step": 1, "path": storage.location("ckpt-1"), "save_time": 100.0, "best": True, "preserved": False},
        {"step": 2, "path": storage.location("ckpt-2"), "save_time": 200.0, "best": False, "preserved": False},
    ]
    manifest = store.manifest
    assert (manifest["latest"], manifest["best"]) == ("ckpt-2", [1])


def test_restore_from_another_local_model_dir(tmp_path):
    other = CheckpointStore(tmp_path / "other")
    path = other.save(3, small_state(3.0))
    checkpoint = CheckpointStore(tmp_path / "mine").restore(path)
    assert checkpoint.step == 3 and torch.equal(checkpoint.model_state["bias"], torch.tensor([3.0, -3.0]))
    with pytest.raises(CheckpointError, match="not a checkpoint path"):
        CheckpointStore(tmp_path / "mine").restore(str(tmp_path / "other" / "weights"))
    with pytest.raises(CheckpointError, match="No checkpoint folder"):
        CheckpointStore(tmp_path / "mine").restore(str(tmp_path / "other" / "ckpt-9"))


def test_identical_state_gives_identical_bytes(tmp_path):
    # The safetensors library writes its metadata in hash-map order: about one save in two differed.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    digests = set()
    for index in range(12):
        store = CheckpointStore(tmp_path / f"run-{index}", clock=FakeClock(1000.0 + index))
        path = store.save(3, model.state_dict(), {"optimizer": optimizer.state_dict()}, {"input_position": 7})
        digests.add(
            tuple(
                hashlib.sha256((tmp_path / path / name).read_bytes()).hexdigest() for name in sorted(os.listdir(path))
            )
        )
    assert len(digests) == 1


def test_safetensors_files_read_back_with_the_safetensors_library(tmp_path):
    from safetensors import safe_open

    base = torch.arange(12, dtype=torch.float32)
    state = {
        "view": base[2:5],
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "flags": torch.tensor([True, False]),
        "half": torch.randn(2, 3).to(torch.bfloat16),
        "byte": torch.tensor([7], dtype=torch.uint8),
        "tied": base,
    }
    path = CheckpointStore(tmp_path).save(1, state)
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as reader:
        assert json.loads(reader.metadata()["order"]) == list(state)
        assert reader.metadata()["format"] == "pt"
        for name, tensor in state.items():
            assert torch.equal(reader.get_tensor(name), tensor), name
    assert list(safetensors.torch.load_file(os.path.join(path, "model.safetensors"))) != []


# ------------------------------------------------------ atomicity, fallback


@pytest.fixture
def local_store(tmp_path):
    store = CheckpointStore(tmp_path / "model_dir", keep_checkpoint_max=None)
    for step in (1, 2, 3):
        store.save(step, small_state(float(step)), {"momentum": {0: torch.full((2,), float(step))}})
    return store, tmp_path / "model_dir"


def test_a_failed_atomic_write_keeps_the_old_file_and_names_the_target(tmp_path, monkeypatch):
    import torchestimator._io.atomic as atomic

    target = tmp_path / "best.json"
    atomic.write_bytes_atomically(str(target), b"old")

    def no_room(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", no_room)
    with pytest.raises(OSError) as raised:
        atomic.write_bytes_atomically(str(target), b"new")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["best.json"]  # no temporary left


def test_staging_folder_left_by_a_crash_is_ignored_then_removed(local_store):
    store, model_dir = local_store
    staging = model_dir / ".tmp-ckpt-4-99999"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"partial")
    assert store.latest_checkpoint() == str(model_dir / "ckpt-3")
    assert store.restore().step == 3
    store.save(5, small_state(5.0))
    assert not staging.exists()


def test_folder_without_state_json_is_incomplete(local_store, caplog):
    store, model_dir = local_store
    incomplete = model_dir / "ckpt-4"
    incomplete.mkdir()
    (incomplete / "model.safetensors").write_bytes(safetensors.torch.save(small_state(4.0)))
    assert store.latest_checkpoint() == str(model_dir / "ckpt-3")
    (model_dir / "ckpt-3" / "state.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        assert store.restore().step == 2
    assert "ckpt-3" in caplog.text and "state.json is not valid JSON" in caplog.text


def test_truncated_file_falls_back_with_warning(local_store, caplog):
    store, model_dir = local_store
    model_file = model_dir / "ckpt-3" / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:-5])
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        checkpoint = store.restore()
    assert checkpoint.step == 2 and torch.equal(checkpoint.model_state["weight"], torch.full((2, 3), 2.0))
    assert str(model_file) in caplog.text and "truncated" in caplog.text


def test_missing_file_falls_back_with_warning(local_store, caplog):
    store, model_dir = local_store
    (model_dir / "ckpt-3" / "model.safetensors").unlink()
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        assert store.restore().step == 2
    assert "ckpt-3/model.safetensors is missing" in caplog.text


def test_checksum_mismatch_falls_back_with_warning(local_store, caplog):
    store, model_dir = local_store
    flip_byte(model_dir / "ckpt-3" / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        checkpoint = store.restore()
    assert checkpoint.step == 2
    assert "ckpt-3/model.safetensors fails its checksum" in caplog.text
    # Without verification the flipped byte goes unnoticed: the checksum is what caught it.
    unverified = store.restore(str(model_dir / "ckpt-3"), verify=False)
    assert unverified.model_state.keys() == small_state(3.0).keys()
    assert not all(torch.equal(unverified.model_state[name], value) for name, value in small_state(3.0).items())


def test_explicit_corrupt_path_raises_naming_the_file(local_store):
    store, model_dir = local_store
    flip_byte(model_dir / "ckpt-3" / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"ckpt-3/model\.safetensors fails its checksum"):
        store.restore(str(model_dir / "ckpt-3"))
    with pytest.raises(CheckpointError, match=r"ckpt-3/model\.safetensors fails its checksum"):
        store.read_model_state(str(model_dir / "ckpt-3"))


def test_corrupt_optimizer_file_triggers_fallback(local_store, caplog):
    store, model_dir = local_store
    flip_byte(model_dir / "ckpt-3" / "optimizer.safetensors")
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        checkpoint = store.restore()
    assert checkpoint.step == 2 and torch.equal(checkpoint.optimizer_state["momentum"][0], torch.full((2,), 2.0))
    assert "optimizer.safetensors fails its checksum" in caplog.text
    # The optimizer is not read when not requested, so ckpt-3 is fine for the model alone.
    assert store.restore(load_optimizer=False).step == 3


def test_bad_optimizer_json_is_reported(local_store):
    store, model_dir = local_store
    tree_file = model_dir / "ckpt-3" / "optimizer.json"
    tree_file.write_bytes(b"x" * tree_file.stat().st_size)  # same size, so only the checks after it catch it
    with pytest.raises(CheckpointError, match="optimizer.json is not a valid state tree"):
        store.restore(str(model_dir / "ckpt-3"), verify=False)


def test_every_checkpoint_corrupt_raises(local_store):
    store, model_dir = local_store
    for step in (1, 2, 3):
        flip_byte(model_dir / f"ckpt-{step}" / "model.safetensors")
    with pytest.raises(CheckpointError) as error:
        store.restore()
    assert all(f"ckpt-{step}/model.safetensors" in str(error.value) for step in (1, 2, 3))


def test_newer_format_version_asks_for_an_upgrade(local_store):
    store, model_dir = local_store
    state_file = model_dir / "ckpt-3" / "state.json"
    state = json.loads(state_file.read_text())
    state["format_version"] = 99
    state_file.write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match="upgrade torchestimator"):
        store.restore(str(model_dir / "ckpt-3"))


def test_in_memory_damage_falls_back(caplog):
    storage = InMemoryStorage()
    store = CheckpointStore(storage)
    store.save(1, small_state(1.0))
    store.save(2, small_state(2.0))
    data = bytearray(storage.folders["ckpt-2"]["model.safetensors"])
    data[-1] ^= 0xFF
    storage.folders["ckpt-2"]["model.safetensors"] = bytes(data)
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        assert store.restore().step == 1
    assert "memory://model_dir/ckpt-2/model.safetensors fails its checksum" in caplog.text


def test_corrupt_header_is_reported_by_list_variables(local_store):
    store, model_dir = local_store
    (model_dir / "ckpt-3" / "model.safetensors").write_bytes(struct.pack("<Q", 20) + b"{broken")
    with pytest.raises(CheckpointError, match="unreadable safetensors header"):
        store.list_variables()


# ---------------------------------------------------------------- manifest


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_manifest_is_rebuilt_by_scanning(storage, damage, caplog, tmp_path):
    store = CheckpointStore(storage, keep_checkpoint_max=2)
    for step in (1, 2, 3):
        store.save(step, small_state(float(step)))
    if isinstance(storage, InMemoryStorage):
        storage.manifest = None if damage == "missing" else b"\x00garbage"
    elif damage == "missing":
        os.remove(tmp_path / "model_dir" / "checkpoint")
    else:
        (tmp_path / "model_dir" / "checkpoint").write_bytes(b"\x00garbage")
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        assert steps_of(store) == [2, 3]
        assert store.restore().step == 3
    assert "rebuilding the list of checkpoints" in caplog.text
    store.save(4, small_state(4.0))
    assert json.loads(storage.read_manifest())["latest"] == "ckpt-4"
    assert steps_of(store) == [3, 4]


def test_a_reader_between_the_first_publish_and_its_manifest_is_not_warned(tmp_path, caplog):
    store = CheckpointStore(str(tmp_path / "model_dir"))
    store.save(1, small_state(1.0))
    os.remove(tmp_path / "model_dir" / "checkpoint")  # as a reader sees it before the first manifest is written
    reader = CheckpointStore(str(tmp_path / "model_dir"))
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        assert reader.latest_checkpoint().endswith("ckpt-1")
    assert "rebuilding" not in caplog.text


def test_complete_folder_missing_from_manifest_is_still_found(storage):
    store = CheckpointStore(storage)
    store.save(1, small_state(1.0))
    manifest_before = storage.read_manifest()
    store.save(2, small_state(2.0))
    storage.replace_manifest(manifest_before)  # as if the process died after the rename
    assert steps_of(store) == [1, 2]
    assert store.restore().step == 2


def test_manifest_is_valid_json_listing_the_kept_checkpoints(storage):
    store = CheckpointStore(storage, keep_checkpoint_max=2, clock=FakeClock(5.0))
    for step in (1, 2, 3):
        store.save(step, small_state(float(step)))
    manifest = json.loads(storage.read_manifest())
    assert manifest["latest"] == "ckpt-3"
    assert [item["step"] for item in manifest["checkpoints"]] == [2, 3]
    assert manifest["checkpoints"][0]["save_time"] == 5.0


# --------------------------------------------------------------- retention


def test_keep_checkpoint_max(storage):
    store = CheckpointStore(storage, keep_checkpoint_max=3)
    for step in range(7):
        store.save(step * 10, small_state(float(step)))
    assert steps_of(store) == [40, 50, 60]
    assert sorted(storage.list_folders()) == ["ckpt-40", "ckpt-50", "ckpt-60"]


@pytest.mark.parametrize("keep_checkpoint_max", [None, 0])
def test_keep_all(storage, keep_checkpoint_max):
    store = CheckpointStore(storage, keep_checkpoint_max=keep_checkpoint_max)
    for step in range(7):
        store.save(step, small_state(float(step)))
    assert steps_of(store) == list(range(7))


def test_keep_checkpoint_max_one_keeps_the_newest(storage):
    store = CheckpointStore(storage, keep_checkpoint_max=1)
    for step in range(3):
        store.save(step, small_state(float(step)))
    assert steps_of(store) == [2]
    assert store.restore().step == 2


def test_keep_checkpoint_every_n_hours(storage):
    clock = FakeClock(0.0)
    store = CheckpointStore(storage, keep_checkpoint_max=2, keep_checkpoint_every_n_hours=1, clock=clock)
    for step in range(16):  # one save every 20 minutes for 5 hours
        clock.now = step * 1200.0
        store.save(step, small_state(float(step)))
    assert steps_of(store) == [3, 6, 9, 12, 14, 15]
    assert [entry["preserved"] for entry in store.history()] == [True] * 4 + [False] * 2
    # The hourly anchor lives in the manifest, so a new store (a restart) continues the schedule.
    restarted = CheckpointStore(storage, keep_checkpoint_max=2, keep_checkpoint_every_n_hours=1, clock=clock)
    for step in (16, 17, 18):
        clock.now = step * 1200.0
        restarted.save(step, small_state(float(step)))
    assert steps_of(restarted) == [3, 6, 9, 12, 15, 17, 18]


def test_best_and_protected_checkpoints_survive_retention(storage):
    store = CheckpointStore(storage, keep_checkpoint_max=2, protected=[0])
    store.save(0, small_state(0.0))
    store.save(1, small_state(1.0))
    store.mark_best([1])
    for step in range(2, 6):
        store.save(step, small_state(float(step)))
    assert steps_of(store) == [0, 1, 4, 5]
    assert [entry["best"] for entry in store.history()] == [True, True, False, False]
    store.mark_best([4])
    store.save(6, small_state(6.0))
    assert steps_of(store) == [0, 4, 5, 6]


def test_mark_best_rejects_unknown_steps(storage):
    store = CheckpointStore(storage)
    store.save(1, small_state(1.0))
    with pytest.raises(ValueError, match=r"\[7\].*Available steps: \[1\]"):
        store.mark_best([7])


# ------------------------------------------------------- state.json integrity


def _edit_state(model_dir, step, edit):
    state_file = model_dir / f"ckpt-{step}" / "state.json"
    state = json.loads(state_file.read_text())
    edit(state)
    state_file.write_text(json.dumps(state, indent=1))


def _set(path, value):
    def edit(state):
        node = state
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


@pytest.fixture
def store_with_extra(tmp_path):
    store = CheckpointStore(tmp_path / "model_dir", keep_checkpoint_max=None)
    for step in (1, 2):
        extra = {"rng": [{"torch": "AAAB", "python": [3, [1, 2, step], None]}], "input_position": {"batch": step}}
        store.save(step, small_state(float(step)), {"momentum": {0: torch.full((2,), float(step))}}, extra)
    return store, tmp_path / "model_dir"


@pytest.mark.parametrize(
    "edit",
    [
        _set(["extra", "rng", 0, "torch"], "AAAC"),
        _set(["extra", "rng", 0, "python", 1, 2], 9),
        _set(["extra", "input_position", "batch"], 1),
        _set(["extra", "surprise"], True),
        _set(["files", "model.safetensors", "sha256"], "0" * 64),
        lambda state: state.pop("state_sha256"),
        lambda state: state.update(state_sha256="f" * 64),
    ],
    ids=["rng-torch", "rng-python", "input-position", "new-key", "file-checksum", "no-own-checksum", "own-checksum"],
)
def test_any_edited_value_of_state_json_is_detected(store_with_extra, edit, caplog):
    store, model_dir = store_with_extra
    _edit_state(model_dir, 2, edit)
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        checkpoint = store.restore()
    assert checkpoint.step == 1 and checkpoint.extra["input_position"] == {"batch": 1}
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(f"{model_dir / 'ckpt-2' / 'state.json'}" in message for message in warnings), warnings
    with pytest.raises(CheckpointError, match=r"ckpt-2"):
        store.restore(str(model_dir / "ckpt-2"))


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda text: text.replace("\n ", "\n  ", 1),  # whitespace only
        lambda text: json.dumps(dict(reversed(list(json.loads(text).items()))), indent=1),  # key order only
    ],
    ids=["whitespace", "key-order"],
)
def test_state_json_checksum_covers_every_byte(store_with_extra, rewrite):
    store, model_dir = store_with_extra
    state_file = model_dir / "ckpt-2" / "state.json"
    state_file.write_text(rewrite(state_file.read_text()))
    with pytest.raises(CheckpointError, match=r"ckpt-2/state\.json: it fails its checksum"):
        store.restore(str(model_dir / "ckpt-2"))


def test_format_1_checkpoints_are_still_read(store_with_extra):
    store, model_dir = store_with_extra

    def as_format_1(state):
        del state["state_sha256"]
        state.update(format_version=1, save_time=1234.5)

    _edit_state(model_dir, 2, as_format_1)
    (model_dir / "checkpoint").unlink()  # the save time then comes from state.json, as format 1 kept it
    checkpoint = store.restore()
    assert checkpoint.step == 2 and checkpoint.extra["input_position"] == {"batch": 2}
    assert store.history()[-1]["save_time"] == 1234.5


def test_checkpoints_all_without_state_json_are_an_error_naming_each(local_store):
    store, model_dir = local_store
    for step in (1, 2, 3):
        (model_dir / f"ckpt-{step}" / "state.json").unlink()
    assert store.has_checkpoints() and store.latest_checkpoint() is None
    with pytest.raises(CheckpointError) as raised:
        store.restore()
    message = str(raised.value)
    assert "None of the 3 checkpoint(s)" in message
    assert all(f"ckpt-{step}: {model_dir / f'ckpt-{step}' / 'state.json'} is missing" in message for step in (1, 2, 3))
    assert "To start over from step 0, move the ckpt-* folders out of" in message
    assert not CheckpointStore(model_dir.parent / "empty").has_checkpoints()


def test_every_skipped_checkpoint_is_named_in_one_warning(local_store, caplog):
    store, model_dir = local_store
    unlisted = model_dir / "ckpt-9"
    unlisted.mkdir()  # not in the manifest (a crash right after the rename would look like this, but complete)
    (unlisted / "model.safetensors").write_bytes(b"junk")
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        assert store.restore().step == 3
        store.latest_checkpoint()
        store.save(4, small_state(4.0))
    named = [record for record in caplog.records if str(unlisted) in record.getMessage()]
    assert len(named) == 1 and named[0].levelno == logging.WARNING
    assert "ckpt-9/state.json is missing" in named[0].getMessage()


# ------------------------------------------------------ leftovers, full disk


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_leftovers_of_dead_writers_are_removed_and_nothing_else(local_store):
    store, model_dir = local_store
    dead, alive = _dead_pid(), os.getppid()
    here = writer_tag().split("-h")[1]
    elsewhere = format((int(here, 16) + 1) % 2**32, "08x")  # another host: its writers' liveness cannot be seen
    leftovers = [f".tmp-ckpt-4-{dead}", f".old-ckpt-2-{dead}", f".tmp-ckpt-6-{dead}-h{here}"]
    kept_folders = [f".tmp-ckpt-5-{alive}", f".tmp-ckpt-7-{dead}-h{elsewhere}", f".del-ckpt-8-{dead}-h{elsewhere}"]
    for folder in leftovers + kept_folders:
        (model_dir / folder).mkdir()
        (model_dir / folder / "model.safetensors").write_bytes(b"partial")
    temporary_files = [
        f".checkpoint.tmp-{dead}",
        f".checkpoint.tmp-{dead}-1a2b3c4d",
        f".write-probe-{dead}",
        f".write-probe.tmp-{dead}-check",
        f".best.json.tmp-{dead}-00ff00ff",
        f".best.json.tmp-{dead}-h{here}-00ff00ff",
    ]
    kept_files = [
        f".checkpoint.tmp-{alive}-1a2b3c4d",
        "notes.tmp-1",
        ".my-notes",
        f"tmp-{dead}",
        f".best.json.tmp-{dead}-h{elsewhere}-00ff00ff",
        f".checkpoint.tmp-{alive}-h{here}-1a2b3c4d",
    ]
    for name in temporary_files + kept_files:
        (model_dir / name).write_bytes(b"x")
    os.rename(model_dir / "ckpt-3", model_dir / f".old-ckpt-3-{dead}")  # killed between the two renames
    store.remove_leftovers()
    present = set(os.listdir(model_dir))
    assert not present & set(leftovers + temporary_files)
    assert set(kept_files) | set(kept_folders) | {"ckpt-1", "ckpt-2", "ckpt-3"} <= present
    assert store.restore().step == 3  # the set-aside checkpoint was put back


class _FullStorage(InMemoryStorage):
    """Runs out of room when a file named ``full_at`` is written."""

    def __init__(self, full_at: str, error_number: int = errno.ENOSPC) -> None:
        super().__init__()
        self.full_at, self.error_number = full_at, error_number

    def write_file(self, folder, filename, data):
        if filename == self.full_at:
            raise OSError(self.error_number, os.strerror(self.error_number))
        super().write_file(folder, filename, data)

    def replace_manifest(self, data):
        if self.full_at == "checkpoint":
            raise OSError(self.error_number, os.strerror(self.error_number))
        super().replace_manifest(data)


@pytest.mark.parametrize(
    "full_at, error_number",
    [
        ("model.safetensors", errno.ENOSPC),
        ("optimizer.json", errno.EDQUOT),
        ("state.json", errno.EFBIG),
        ("checkpoint", errno.ENOSPC),
    ],
)
def test_no_room_names_path_step_and_bytes_and_keeps_the_previous_checkpoint(full_at, error_number):
    storage = _FullStorage("none", error_number)
    store = CheckpointStore(storage)
    store.save(1, small_state(1.0), {"momentum": {0: torch.ones(2)}})
    storage.full_at = full_at
    with pytest.raises(DiskFullError) as raised:
        store.save(2, small_state(2.0), {"momentum": {0: torch.ones(2)}})
    error = raised.value
    assert isinstance(error, OSError) and error.errno == error_number
    message = str(error)
    assert f"[Errno {error_number}]" in message and "the checkpoint of step 2" in message
    assert (
        "memory://model_dir/" + (full_at if full_at == "checkpoint" else f".tmp-ckpt-2-{writer_tag()}/{full_at}")
        in message
    )
    assert f"it needs {error.bytes_needed:,} bytes" in message and error.bytes_needed > 100
    assert "The newest intact checkpoint is memory://model_dir/ckpt-1." in message
    assert not [folder for folder in storage.list_folders() if folder.startswith(".")]
    assert store.restore().step in (1, 2)


def test_edited_manifest_is_caught_and_rebuilt_and_old_manifests_are_read(local_store, caplog):
    _store, model_dir = local_store
    manifest_file = model_dir / "checkpoint"
    manifest = json.loads(manifest_file.read_text())
    manifest["best"] = [2]  # valid JSON of the right shape: only the checksum tells
    manifest_file.write_text(json.dumps(manifest, indent=1))
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        assert steps_of(CheckpointStore(model_dir)) == [1, 2, 3]
    assert "checkpoint is unreadable (it fails its checksum" in caplog.text
    del manifest["sha256"]  # as written before manifests had one
    manifest_file.write_text(json.dumps(manifest, indent=1))
    assert CheckpointStore(model_dir).manifest["best"] == [2]


def test_a_checkpoint_folder_linked_from_elsewhere_is_unlinked_by_retention_never_emptied(
    local_store, tmp_path, caplog
):
    store, model_dir = local_store
    elsewhere = tmp_path / "archive" / "ckpt-1"
    elsewhere.parent.mkdir()
    os.rename(model_dir / "ckpt-1", elsewhere)
    os.symlink(elsewhere, model_dir / "ckpt-1")
    assert store.restore(str(model_dir / "ckpt-1")).step == 1
    retained = CheckpointStore(model_dir, keep_checkpoint_max=3)
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        retained.save(4, small_state(4.0))
    assert [entry["step"] for entry in retained.history()] == [2, 3, 4]
    assert not [name for name in os.listdir(model_dir) if name.startswith(".del-")]  # no leftover warned at each save
    assert "Could not delete" not in caplog.text
    assert "state.json" in os.listdir(elsewhere)  # the linked files are untouched
    assert CheckpointStore(elsewhere.parent).restore(str(elsewhere)).step == 1


def test_symlink_loops_and_a_folder_named_like_the_manifest_are_not_fatal(local_store, caplog):
    store, model_dir = local_store
    os.symlink(model_dir / "ckpt-8", model_dir / "ckpt-8")  # ELOOP
    os.symlink(model_dir / "missing", model_dir / "ckpt-9")
    (model_dir / "checkpoint").unlink()
    (model_dir / "checkpoint").mkdir()
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        assert store.restore().step == 3
    assert "checkpoint is unreadable" in caplog.text
    assert [entry["step"] for entry in store.history()] == [1, 2, 3]


def test_a_save_failing_for_another_reason_than_space_leaves_no_staging_folder(local_store, monkeypatch):
    """An OSError mid-save (here a permission error on the second file) removes the partial checkpoint at once,
    not at the next start-up; the error is raised as it was and the previous checkpoints stay intact."""
    store, model_dir = local_store
    real_write = type(store.storage).write_file
    calls = []

    def failing_write(self, folder, filename, data):
        calls.append(filename)
        if len(calls) == 2:
            raise PermissionError(errno.EACCES, "Permission denied", os.path.join(folder, filename))
        return real_write(self, folder, filename, data)

    monkeypatch.setattr(type(store.storage), "write_file", failing_write)
    with pytest.raises(PermissionError):
        store.save(4, small_state(4.0))
    assert sorted(name for name in os.listdir(model_dir) if name.startswith(".tmp-")) == []
    assert not (model_dir / "ckpt-4").exists()
    monkeypatch.undo()
    assert store.restore().step == 3
