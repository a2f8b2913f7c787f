"""Checkpoints through torch.distributed.checkpoint (DCP): the sharded format, async saves, resharding on load.

The format, the store's rules over it and the asynchronous machinery are tested in this process (a
one-replica strategy writes the same DCP folders); what needs several processes (ranks writing their own
files, 2 -> 1 resharding, a rank killed during a save, async saves beside training's collectives) runs 2
gloo processes.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import sum_sign_data

import torchestimator as te
from torchestimator._io.atomic import writer_tag
from torchestimator._train_state import TrainState
from torchestimator.checkpoint import CheckpointError, CheckpointStore, DiskFullError, format as checkpoint_format
from torchestimator.checkpoint.checkpointer import Checkpointer
from torchestimator.checkpoint.dcp_format import ShardWriter, read_metadata
from torchestimator.checkpoint.parts import TrainingParts, restore_shared
from torchestimator.distribute import MirroredStrategy, OneDeviceStrategy
from torchestimator.hooks.base import CheckpointSaverListener
from torchestimator.testing import ReplicaFailedError, run_in_processes

# ----------------------------------------------------------------------------- one process


def _parts(seed: int = 0) -> TrainingParts:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    return TrainingParts(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train_state=TrainState())


def _step(parts: TrainingParts) -> None:
    parts.model(torch.randn(5, 4)).pow(2).mean().backward()
    parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    parts.train_state.global_step += 1


def _weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def _assert_same_optimizer_state(restored: dict, saved: dict) -> None:
    assert restored["state"].keys() == saved["state"].keys()
    for index, values in saved["state"].items():
        assert restored["state"][index].keys() == values.keys()
        for key, value in values.items():
            assert torch.equal(torch.as_tensor(restored["state"][index][key]), torch.as_tensor(value)), (index, key)
    strip = [{key: value for key, value in group.items() if key != "params"} for group in saved["param_groups"]]
    assert [
        {key: value for key, value in group.items() if key != "params"} for group in restored["param_groups"]
    ] == strip


@pytest.fixture
def one_process():
    strategy = OneDeviceStrategy("cpu")
    strategy.setup()
    return strategy


@pytest.fixture
def one_replica_group():
    """A process group of one (what asynchronous saves need: a checkpoint group of their own)."""
    strategy = MirroredStrategy(num_replicas=1)
    strategy.setup()
    yield strategy
    strategy.teardown()


class _Heard(CheckpointSaverListener):
    def __init__(self) -> None:
        self.saved: list[int] = []

    def after_save(self, state, global_step):
        self.saved.append(global_step)


def test_a_sharded_checkpoint_restores_its_weights_and_optimizer_state(tmp_path, one_process):
    store = CheckpointStore(tmp_path, keep_checkpoint_max=None)
    parts = _parts()
    _step(parts)
    Checkpointer(store, one_process, sharded=True).save(parts)
    state = json.loads((tmp_path / "ckpt-1" / "state.json").read_text())
    assert state["format_version"] == 3 and state["layout"] == "dcp"
    assert {".metadata", "__0_0.distcp", "optimizer.json"} <= set(state["files"])
    assert "model.safetensors" not in state["files"]
    checkpoint = store.restore()
    assert checkpoint.sharded and checkpoint.step == 1
    for name, tensor in parts.model.state_dict().items():
        assert torch.equal(checkpoint.model_state[name], tensor)
    fresh = _parts(seed=1)
    restore_shared(checkpoint, fresh.shared_parts(), fresh.optimizer, fresh.model)
    _assert_same_optimizer_state(fresh.optimizer.state_dict(), parts.optimizer.state_dict())
    assert store.list_variables() == sorted(
        (name, tuple(tensor.shape), tensor.dtype) for name, tensor in parts.model.state_dict().items()
    )


def test_a_damaged_shard_falls_back_to_the_previous_checkpoint(tmp_path, one_process, caplog):
    store = CheckpointStore(tmp_path, keep_checkpoint_max=None)
    parts, checkpointer = _parts(), Checkpointer(store, one_process, sharded=True)
    _step(parts)
    checkpointer.save(parts)
    first = _weights(parts.model)
    _step(parts)
    checkpointer.save(parts)
    shard = tmp_path / "ckpt-2" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        checkpoint = store.restore()
    assert checkpoint.step == 1 and torch.equal(checkpoint.model_state["0.weight"], first["0.weight"])
    assert "__0_0.distcp fails its checksum" in caplog.text
    with pytest.raises(CheckpointError, match="__0_0.distcp fails its checksum"):
        store.restore(str(tmp_path / "ckpt-2"))


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_staging_folder_without_its_state_json_is_never_restored_and_is_cleared(tmp_path, one_process):
    store = CheckpointStore(tmp_path, keep_checkpoint_max=None)
    parts = _parts()
    _step(parts)
    Checkpointer(store, one_process, sharded=True).save(parts)
    # What a save killed between the ranks' writes and the chief's seal leaves: DCP's files, no state.json.
    host = writer_tag().split("-h")[1]
    staging = tmp_path / f".tmp-ckpt-2-{_dead_pid()}-h{host}"
    shutil.copytree(tmp_path / "ckpt-1", staging)
    (staging / "state.json").unlink()
    assert store.all_checkpoints() == [str(tmp_path / "ckpt-1")]
    assert store.restore().step == 1
    store.remove_leftovers()
    assert not staging.exists() and (tmp_path / "ckpt-1").is_dir()


class _RunsCode:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_dcp_metadata_is_read_without_running_code(tmp_path, one_process):
    store = CheckpointStore(tmp_path, keep_checkpoint_max=None)
    parts = _parts()
    _step(parts)
    Checkpointer(store, one_process, sharded=True).save(parts)
    folder, marker = tmp_path / "ckpt-1", tmp_path / "code-ran"
    crafted = pickle.dumps(_RunsCode(str(marker)))
    (folder / ".metadata").write_bytes(crafted)
    # Sealed again, as someone who rewrites the folder would: the checksums alone cannot be the guard.
    state = json.loads((folder / "state.json").read_text())
    state["files"][".metadata"] = {"sha256": __import__("hashlib").sha256(crafted).hexdigest(), "size": len(crafted)}
    state.pop(checkpoint_format.STATE_CHECKSUM_KEY)
    (folder / "state.json").write_bytes(checkpoint_format.sealed_json(state, checkpoint_format.STATE_CHECKSUM_KEY))
    with pytest.raises(CheckpointError, match=r"\.metadata is not a DCP metadata file.*system"):
        store.restore(str(folder))
    with pytest.raises(CheckpointError, match="system"):
        read_metadata(str(folder))
    assert not marker.exists()


def test_retention_and_best_marks_keep_working_for_sharded_checkpoints(tmp_path, one_process):
    store = CheckpointStore(tmp_path, keep_checkpoint_max=2)
    parts, checkpointer = _parts(), Checkpointer(store, one_process, sharded=True)
    for step in range(1, 5):
        _step(parts)
        checkpointer.save(parts)
        if step == 1:
            store.mark_best([1])
    assert [entry["step"] for entry in store.history()] == [1, 3, 4]
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith("ckpt-")) == ["ckpt-1", "ckpt-3", "ckpt-4"]
    assert store.manifest["latest"] == "ckpt-4"


def test_a_model_dir_may_hold_both_formats_and_falls_back_across_them(tmp_path, one_process):
    store = CheckpointStore(tmp_path, keep_checkpoint_max=None)
    parts = _parts()
    _step(parts)
    Checkpointer(store, one_process).save(parts)  # one process: safetensors
    single = _weights(parts.model)
    _step(parts)
    Checkpointer(store, one_process, sharded=True).save(parts)
    assert (tmp_path / "ckpt-1" / "model.safetensors").is_file() and (tmp_path / "ckpt-2" / ".metadata").is_file()
    assert store.restore().sharded
    (tmp_path / "ckpt-2" / ".metadata").write_bytes(b"damaged")
    checkpoint = store.restore()
    assert checkpoint.step == 1 and not checkpoint.sharded
    assert torch.equal(checkpoint.model_state["2.bias"], single["2.bias"])


def _gate_writes(monkeypatch, gate: threading.Event) -> None:
    original = ShardWriter.write_data

    def write_when_opened(self, plan, planner):
        assert gate.wait(60), "the test never opened the gate"
        return original(self, plan, planner)

    monkeypatch.setattr(ShardWriter, "write_data", write_when_opened)


def test_an_async_save_returns_before_its_write_and_is_published_at_the_next_save(
    tmp_path, monkeypatch, one_replica_group
):
    gate = threading.Event()
    _gate_writes(monkeypatch, gate)
    store, heard = CheckpointStore(tmp_path, keep_checkpoint_max=None), _Heard()
    checkpointer = Checkpointer(store, one_replica_group, listeners=[heard], sharded=True, asynchronous=True)
    parts = _parts()
    _step(parts)
    at_save = _weights(parts.model)
    checkpointer.save(parts)  # returns although the writer waits at the closed gate: the loop goes on
    assert checkpointer.last_saved_step == 1 and checkpointer.published_step is None
    assert not (tmp_path / "ckpt-1").exists() and heard.saved == []
    _step(parts)  # training changes the weights while the write is pending: the save holds its own copy
    gate.set()
    checkpointer.save(parts)  # waits for step 1 to be published first: one save in flight
    assert (tmp_path / "ckpt-1").is_dir() and heard.saved == [1]
    checkpointer.close()  # the end of training: the last save is complete when it returns
    assert heard.saved == [1, 2] and checkpointer.published_step == 2
    assert torch.equal(store.restore(str(tmp_path / "ckpt-1")).model_state["0.weight"], at_save["0.weight"])
    assert torch.equal(store.restore().model_state["0.weight"], parts.model.state_dict()["0.weight"])


def _fail_writes(monkeypatch) -> None:
    def no_room(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ShardWriter, "write_data", no_room)


def test_a_failed_background_write_is_raised_at_the_next_save(tmp_path, monkeypatch, one_replica_group):
    _fail_writes(monkeypatch)
    store = CheckpointStore(tmp_path, keep_checkpoint_max=None)
    checkpointer = Checkpointer(store, one_replica_group, sharded=True, asynchronous=True)
    parts = _parts()
    _step(parts)
    checkpointer.save(parts)  # the failure happens in the background
    _step(parts)
    with pytest.raises(DiskFullError, match="checkpoint of step 1"):
        checkpointer.save(parts)
    checkpointer.close()
    assert not [name for name in os.listdir(tmp_path) if "ckpt-" in name]  # the staging folder went too


def test_a_failed_final_background_write_is_raised_by_close(tmp_path, monkeypatch, one_replica_group):
    _fail_writes(monkeypatch)
    checkpointer = Checkpointer(CheckpointStore(tmp_path), one_replica_group, sharded=True, asynchronous=True)
    parts = _parts()
    _step(parts)
    checkpointer.save(parts)
    with pytest.raises(DiskFullError):
        checkpointer.close()


def test_ranks_share_the_replicated_tensors_once_each_and_evenly():
    from torchestimator.checkpoint.dcp_format import share_of_replicated

    state = {
        "model": {f"w{index}": torch.zeros(size) for index, size in enumerate([64, 8, 32, 16, 16, 4])},
        "shared": {"step": torch.zeros(()), "momentum": torch.zeros(40)},
    }
    shares = [share_of_replicated(state, rank, 2) for rank in range(2)]
    for top, entries in state.items():
        names = [name for share in shares for name in share[top]]
        assert sorted(names) == sorted(entries)  # every tensor saved, by one rank only
    sizes = [sum(tensor.numel() for entries in share.values() for tensor in entries.values()) for share in shares]
    assert abs(sizes[0] - sizes[1]) <= 8 and sum(sizes) == 181


def test_the_finite_check_before_a_save_finds_what_a_sum_would_hide_or_invent():
    from torchestimator.checkpoint.parts import first_non_finite

    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    with torch.no_grad():
        model[1].weight[0, :2] = 3e38  # finite values whose sum overflows: no NaN to report
    assert first_non_finite(model) is None
    for bad in (float("nan"), float("inf"), float("-inf")):
        with torch.no_grad():
            model[1].weight[1, 3] = bad
        assert first_non_finite(model) == "1.weight"


def _tfrecord_input_fn(params, input_context=None):
    from torchestimator.data import FixedLenFeature, TFRecordDataset, parse_example, to_torch

    spec = {"x": FixedLenFeature([4], "float32"), "y": FixedLenFeature([], "int64")}

    def collate(records):
        parsed = to_torch(parse_example(records, spec))
        return {"x": parsed["x"]}, parsed["y"]

    return TFRecordDataset(
        os.path.join(params["folder"], "*.tfrecord"),
        input_context=input_context,
        batch_size=8,
        collate_fn=collate,
        num_epochs=None,
    )


def test_per_replica_input_positions_refuse_a_different_replica_count(tmp_path):
    from torchestimator.data import TFRecordWriter, encode_example
    from torchestimator.distribute import InputContext

    folder = tmp_path / "records"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for shard in range(2):
        with TFRecordWriter(str(folder / f"part-{shard}.tfrecord")) as writer:
            for _ in range(32):
                writer.write(encode_example({"x": rng.normal(size=4).astype(np.float32), "y": [1]}))

    def model_fn(model, features, labels, mode):
        return te.EstimatorSpec(mode, loss=F.cross_entropy(model(features["x"]), labels))

    estimator = te.Estimator(
        model_fn,
        model=lambda: nn.Linear(4, 2),
        params={"folder": str(folder)},
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        model_dir=tmp_path / "model",
        config=te.RunConfig(progress_bar=False, random_seed=0),
    )
    estimator.train(_tfrecord_input_fn, max_steps=2)
    # What 2 replicas leave: each its own shard's position (replica 0's made by a 2-replica dataset).
    store = estimator.checkpoint_store
    saved = store.restore()
    two_replica_input = _tfrecord_input_fn(
        {"folder": str(folder)}, InputContext(num_replicas_in_sync=2, input_pipeline_id=0, num_input_pipelines=2)
    )
    next(iter(two_replica_input))
    replicas = [{**state, "input_source": two_replica_input.state_dict()} for state in saved.extra["replicas"]] * 2
    store.save(2, saved.model_state, saved.optimizer_state, {**saved.extra, "replicas": replicas, "num_replicas": 2})
    with pytest.raises(CheckpointError, match=r"written by 2 replica\(s\).*this run has 1.*Resume with 2"):
        estimator.train(_tfrecord_input_fn, max_steps=4)


# ----------------------------------------------------------------------------- two processes


def _model_fn(model, features, labels, mode):
    logits = model(features["x"])
    predictions = {"class": logits.argmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))


def _input_fn(input_context=None):
    x, y = sum_sign_data()
    return te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=5)(
        input_context=input_context
    )


_LIVE: dict[str, object] = {}  # the trained module and optimizer of this process, for the test to compare


def _model():
    _LIVE["model"] = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    return _LIVE["model"]


def _optimizer(parameters):
    _LIVE["optimizer"] = torch.optim.Adam(parameters, lr=0.01)
    return _LIVE["optimizer"]


def _estimator(model_dir, strategy=None, **config):
    config = te.RunConfig(
        train_distribute=strategy,
        save_checkpoints_steps=4,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
        **config,
    )
    return te.Estimator(model_fn=_model_fn, model=_model, optimizer=_optimizer, model_dir=model_dir, config=config)


def _live_state() -> dict:
    return {"weights": _weights(_LIVE["model"]), "optimizer": _LIVE["optimizer"].state_dict()}


def _train_two_ranks(model_dir, max_steps):
    _estimator(model_dir, MirroredStrategy(num_replicas=2)).train(_input_fn, max_steps=max_steps)
    return _live_state()


class _OpenGateAtStep(te.Hook):
    """Records whether the checkpoint of ``saved_step`` was published yet, then lets its writer go on."""

    def __init__(self, model_dir, gate, saved_step, open_at):
        self.model_dir, self.gate, self.saved_step, self.open_at = model_dir, gate, saved_step, open_at
        self.published_when_opened = None

    def after_step(self, run_context):
        if run_context.global_step == self.open_at:
            self.published_when_opened = os.path.isdir(os.path.join(self.model_dir, f"ckpt-{self.saved_step}"))
            self.gate.set()


def _train_two_ranks_async_with_a_slow_writer(model_dir, max_steps):
    gate, original = threading.Event(), ShardWriter.write_data

    def slow_write(self, plan, planner):
        if "ckpt-4" in str(self.path) and not gate.wait(120):
            raise TimeoutError("the training loop never reached step 6 while ckpt-4 was being written")
        return original(self, plan, planner)

    ShardWriter.write_data = slow_write
    hook = _OpenGateAtStep(model_dir, gate, saved_step=4, open_at=6)
    _estimator(model_dir, MirroredStrategy(num_replicas=2), async_checkpoint=True).train(
        _input_fn, max_steps=max_steps, hooks=[hook]
    )
    return {
        **_live_state(),
        "published_when_opened": hook.published_when_opened,
        "folders": sorted(os.listdir(model_dir)),
    }


def _die_while_writing(model_dir, max_steps, dying_rank, step):
    original = ShardWriter.write_data

    def write_or_die(self, plan, planner):
        if f"ckpt-{step}-" in str(self.path) and torch.distributed.get_rank() == dying_rank:
            os._exit(3)  # killed midway: no state.json will be sealed
        return original(self, plan, planner)

    ShardWriter.write_data = write_or_die
    _estimator(model_dir, MirroredStrategy(num_replicas=2)).train(_input_fn, max_steps=max_steps)


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """8 steps on 2 ranks, checkpoints at 4 and 8 (DCP); each rank's live weights and optimizer state."""
    model_dir = str(tmp_path_factory.mktemp("dcp") / "two")
    return model_dir, run_in_processes(_train_two_ranks, nprocs=2, args=(model_dir, 8), timeout=240)


@pytest.mark.slow
@pytest.mark.distributed
def test_saved_by_two_ranks_resumed_by_one(two_rank_run, tmp_path, caplog):
    source, ranks = two_rank_run
    model_dir = str(tmp_path / "resumed")
    shutil.copytree(source, model_dir)
    folder = os.path.join(model_dir, "ckpt-8")
    state = json.loads(open(os.path.join(folder, "state.json")).read())
    assert state["layout"] == "dcp" and state["extra"]["num_replicas"] == 2
    shards = sorted(name for name in state["files"] if name.endswith(".distcp"))
    assert [name.split("_")[2] for name in shards] == ["0", "1"]  # each rank wrote its own file
    # Weights and optimizer state read by one process equal what the two ranks held when they saved.
    checkpoint = CheckpointStore(model_dir).restore()
    assert checkpoint.step == 8
    for name, tensor in ranks[0]["weights"].items():
        assert torch.equal(checkpoint.model_state[name], tensor) and torch.equal(ranks[1]["weights"][name], tensor)
    one = _estimator(model_dir)
    module = _model()
    module.load_state_dict(checkpoint.model_state)
    optimizer = _optimizer(module.parameters())
    restore_shared(checkpoint, {"optimizer": optimizer}, optimizer, module)
    _assert_same_optimizer_state(optimizer.state_dict(), ranks[0]["optimizer"])
    # Training resumes in one process from step 8 (global input position carried over) as if never stopped.
    with caplog.at_level(logging.WARNING):
        one.train(_input_fn, max_steps=12)
    assert "written by 2 replica(s), this run has 1" in caplog.text
    straight = _estimator(str(tmp_path / "straight"))
    straight.train(_input_fn, max_steps=12)
    for name in straight.get_variable_names():
        np.testing.assert_allclose(one.get_variable_value(name), straight.get_variable_value(name), atol=1e-6)
    assert one.latest_checkpoint().endswith("ckpt-12")
    assert os.path.isfile(os.path.join(model_dir, "ckpt-12", "model.safetensors"))  # one process: safetensors


@pytest.mark.slow
@pytest.mark.distributed
def test_inspect_variable_values_and_export_consolidate_a_dcp_checkpoint(two_rank_run, tmp_path):
    from torchestimator.cli.inspection import describe
    from torchestimator.export import TensorSpec, load, serving_input_receiver
    from torchestimator.interop import open_weights

    model_dir, ranks = two_rank_run
    weights = ranks[0]["weights"]
    text = describe(model_dir)
    assert "model_dir" in text and "0.weight" in text and "[16, 6]" in text and "2 checkpoint(s)" in text
    assert "0.weight" in describe(os.path.join(model_dir, "ckpt-8"))
    with open_weights(model_dir) as source:
        assert [info.name for info in source.tensors()] == sorted(weights)
        np.testing.assert_array_equal(source.read("2.weight"), weights["2.weight"].numpy())
    estimator = _estimator(model_dir)
    np.testing.assert_array_equal(estimator.get_variable_value("0.bias"), weights["0.bias"].numpy())
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 6), dtype=torch.float32)})
    exported = load(estimator.export_saved_model(str(tmp_path / "export"), receiver))
    x = torch.from_numpy(sum_sign_data()[0][:8])
    module = _model()
    module.load_state_dict(weights)
    np.testing.assert_array_equal(exported({"x": x})["class"], module(x).argmax(-1).numpy())


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_killed_during_a_save_leaves_nothing_that_is_restored(tmp_path):
    model_dir = str(tmp_path / "killed")
    # The chief dies while writing its shards of step 8: nobody is left to seal or clear the staging folder.
    with pytest.raises(ReplicaFailedError):
        run_in_processes(_die_while_writing, nprocs=2, args=(model_dir, 8, 0, 8), timeout=240)
    leftovers = [name for name in os.listdir(model_dir) if name.startswith(".tmp-ckpt-8-")]
    assert leftovers and not os.path.exists(os.path.join(model_dir, leftovers[0], "state.json"))
    store = CheckpointStore(model_dir)
    assert store.all_checkpoints() == [os.path.join(os.path.abspath(model_dir), "ckpt-4")]
    resumed = _estimator(model_dir)
    resumed.train(_input_fn, max_steps=8)  # from step 4: the partial step-8 folder is cleared, never read
    assert not [name for name in os.listdir(model_dir) if name.startswith(".tmp-ckpt-")]
    straight = _estimator(str(tmp_path / "straight"))
    straight.train(_input_fn, max_steps=8)
    for name in straight.get_variable_names():
        np.testing.assert_allclose(resumed.get_variable_value(name), straight.get_variable_value(name), atol=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_async_saves_let_the_loop_go_on_beside_its_collectives(two_rank_run, tmp_path):
    sync_dir, sync_ranks = two_rank_run
    model_dir = str(tmp_path / "async")
    ranks = run_in_processes(_train_two_ranks_async_with_a_slow_writer, nprocs=2, args=(model_dir, 8), timeout=240)
    for rank in ranks:
        # Steps 5 and 6 ran (with an all-reduce each) while ckpt-4 was still being written.
        assert rank["published_when_opened"] is False
        assert {"ckpt-4", "ckpt-8"} <= set(rank["folders"])  # both complete when train() returned
    # Writing in the background changes nothing that is trained or saved.
    for name, tensor in sync_ranks[0]["weights"].items():
        assert torch.equal(ranks[0]["weights"][name], tensor)
    saved, expected = CheckpointStore(model_dir).restore(), CheckpointStore(sync_dir).restore()
    assert saved.sharded and saved.step == expected.step == 8
    for name, tensor in expected.model_state.items():
        assert torch.equal(saved.model_state[name], tensor)
