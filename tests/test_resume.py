"""Exact resume, optimizer changes on resume, and corrupt or foreign checkpoints."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers import SmallNet, adam, input_fns, make_classification, make_estimator, sgd

import torchestimator as te


def _weights(estimator):
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def _assert_bit_identical(left, right):
    assert left.keys() == right.keys()
    for name in left:
        assert np.array_equal(left[name], right[name]), f"{name} differs"


def _dropout_estimator(model_dir, optimizer=adam, **changes):
    return make_estimator(
        model_dir, model=lambda: SmallNet(dropout=0.3), optimizer=optimizer, deterministic=True, **changes
    )


@pytest.mark.parametrize("stop_at", [7, 8, 13])  # mid-epoch (8 batches per epoch), epoch end, next epoch
def test_resume_is_bit_exact_with_numpy_input(tmp_path, stop_at):
    train, _, _, _ = input_fns(n=256, batch_size=32)
    straight = _dropout_estimator(tmp_path / "straight")
    straight.train(train, max_steps=20)
    interrupted = _dropout_estimator(tmp_path / "resumed")
    interrupted.train(train, max_steps=stop_at)
    resumed = _dropout_estimator(tmp_path / "resumed")  # a new process would build a new Estimator
    resumed.train(train, max_steps=20)
    _assert_bit_identical(_weights(straight), _weights(resumed))


def test_resume_is_bit_exact_with_dataset_input(tmp_path):
    x, y = make_classification(200)
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return len(dataset)

        def __getitem__(self, index):
            features, label = dataset[index]
            return {"x": features}, label

    train = te.dataset_input_fn(Pairs(), batch_size=16, shuffle=True, num_epochs=None, seed=3)
    straight = _dropout_estimator(tmp_path / "straight")
    straight.train(train, max_steps=18)
    first = _dropout_estimator(tmp_path / "resumed")
    first.train(train, max_steps=11)
    second = _dropout_estimator(tmp_path / "resumed")
    second.train(train, max_steps=18)
    _assert_bit_identical(_weights(straight), _weights(second))


def test_plain_iterable_restarts_with_a_warning(tmp_path, te_logs):
    x, y = make_classification(64)

    def input_fn():
        return [({"x": torch.from_numpy(x[i : i + 16])}, torch.from_numpy(y[i : i + 16])) for i in range(0, 64, 16)]

    make_estimator(tmp_path).train(input_fn, max_steps=3)
    make_estimator(tmp_path).train(input_fn, max_steps=6)
    assert "cannot resume: it restarts from its beginning at global step 3" in te_logs.text
    # It names every input that resumes, the TFRecord ones included.
    assert (
        "For exact resume return te.numpy_input_fn's, te.pandas_input_fn's or te.dataset_input_fn's input, a "
        "torchestimator.data.TFRecordDataset or TFRecordLoader, or any iterable with state_dict and load_state_dict."
    ) in te_logs.text


@pytest.mark.parametrize("first, second", [(adam, sgd), (sgd, adam)], ids=["adam-to-sgd", "sgd-to-adam"])
def test_optimizer_change_keeps_weights_and_step_and_resets_state(tmp_path, te_logs, first, second):
    train, _, _, _ = input_fns()
    make_estimator(tmp_path, optimizer=first).train(train, max_steps=10)
    saved = _weights(make_estimator(tmp_path))
    changed = make_estimator(tmp_path, optimizer=second)
    changed.train(train, steps=1)
    assert changed.latest_checkpoint().endswith("ckpt-11")
    warnings = [r for r in te_logs.records if "optimizer changed" in r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert type(first(SmallNet().parameters())).__name__ in message
    assert type(second(SmallNet().parameters())).__name__ in message
    # Weights were restored (one step moves them only a little), not re-initialised.
    after = _weights(changed)
    assert np.abs(after["net.0.weight"] - saved["net.0.weight"]).max() < 0.2


def _recording_adam(built):
    def optimizer(parameters):
        built.append(torch.optim.Adam(parameters, lr=1e-2))
        return built[-1]

    return optimizer


def test_same_optimizer_restores_its_state(tmp_path, te_logs):
    train, _, _, _ = input_fns()
    straight: list[torch.optim.Optimizer] = []
    make_estimator(tmp_path / "straight", optimizer=_recording_adam(straight)).train(train, max_steps=6)
    resumed: list[torch.optim.Optimizer] = []
    make_estimator(tmp_path / "resumed", optimizer=_recording_adam(resumed)).train(train, max_steps=5)
    make_estimator(tmp_path / "resumed", optimizer=_recording_adam(resumed)).train(train, max_steps=6)
    assert "optimizer changed" not in te_logs.text
    # Adam's moments and step counts after the resumed step equal those of the uninterrupted run: a state that
    # started fresh at step 5 would have step 1 and other moments.
    expected, actual = straight[-1].state_dict()["state"], resumed[-1].state_dict()["state"]
    assert sorted(actual) == sorted(expected) and len(expected) > 0
    for index, slots in expected.items():
        for slot, tensor in slots.items():
            torch.testing.assert_close(actual[index][slot], tensor, rtol=0, atol=0, msg=f"param {index} {slot}")
    assert int(actual[0]["step"]) == 6


def test_checkpoint_from_a_different_model_names_variable_and_shapes(tmp_path):
    train, _, _, _ = input_fns()
    make_estimator(tmp_path).train(train, max_steps=2)
    wider = make_estimator(tmp_path, model=lambda: SmallNet(hidden=32))
    with pytest.raises(ValueError, match=r"'net.0.weight' has shape \[16, 8\] in the checkpoint and \[32, 8\]"):
        wider.train(train, max_steps=4)
    other = make_estimator(tmp_path, model=lambda: SmallNet(batch_norm=False))
    with pytest.raises(ValueError, match="does not fit this model"):
        other.evaluate(input_fns()[1])


def test_corrupted_latest_checkpoint_falls_back_to_previous(tmp_path, te_logs):
    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path, save_checkpoints_steps=5)
    estimator.train(train, max_steps=10)
    weights_file = os.path.join(str(tmp_path), "ckpt-10", "model.safetensors")
    data = bytearray(open(weights_file, "rb").read())
    data[-5] ^= 0xFF
    open(weights_file, "wb").write(bytes(data))
    resumed = make_estimator(tmp_path, save_checkpoints_steps=5)
    assert resumed.evaluate(input_fns()[1])["global_step"] == 5
    assert any(r.levelname == "WARNING" and "ckpt-10" in r.getMessage() for r in te_logs.records)
    resumed.train(train, max_steps=12)
    assert resumed.latest_checkpoint().endswith("ckpt-12")


def test_incomplete_checkpoint_folder_is_ignored(tmp_path):
    train, _, _, _ = input_fns()
    make_estimator(tmp_path, save_checkpoints_steps=5).train(train, max_steps=5)
    os.makedirs(tmp_path / ".tmp-ckpt-10-999")
    (tmp_path / ".tmp-ckpt-10-999" / "model.safetensors").write_bytes(b"partial")
    estimator = make_estimator(tmp_path, save_checkpoints_steps=5)
    assert estimator.latest_checkpoint().endswith("ckpt-5")
    assert estimator.evaluate(input_fns()[1])["global_step"] == 5


def test_keep_checkpoint_max(tmp_path):
    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path, save_checkpoints_steps=2, keep_checkpoint_max=3)
    estimator.train(train, max_steps=12)
    kept = sorted(name for name in os.listdir(tmp_path) if name.startswith("ckpt-"))
    assert kept == ["ckpt-10", "ckpt-12", "ckpt-8"]


def test_edited_rng_state_in_the_newest_checkpoint_is_caught_and_resume_stays_exact(tmp_path, te_logs):
    import json

    train, _, _, _ = input_fns(n=256, batch_size=32)
    straight = _dropout_estimator(tmp_path / "straight", save_checkpoints_steps=5)
    straight.train(train, max_steps=15)
    _dropout_estimator(tmp_path / "resumed", save_checkpoints_steps=5).train(train, max_steps=10)
    state_file = tmp_path / "resumed" / "ckpt-10" / "state.json"
    state = json.loads(state_file.read_text())
    replica = state["extra"]["replicas"][0]
    replica["train_state"]["rng"]["python"][1][5] ^= 1  # still valid JSON and a valid RNG state, only different
    replica["input_source"]["row"] += 1
    state_file.write_text(json.dumps(state, indent=1))
    resumed = _dropout_estimator(tmp_path / "resumed", save_checkpoints_steps=5)
    resumed.train(train, max_steps=15)  # falls back to ckpt-5 and redoes steps 6..15
    assert any(r.levelname == "WARNING" and str(state_file) in r.getMessage() for r in te_logs.records)
    _assert_bit_identical(_weights(straight), _weights(resumed))
