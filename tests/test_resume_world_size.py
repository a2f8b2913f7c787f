"""Resuming with another number of ranks: 2 -> 4 -> 2 gloo processes of one thread each.

What the README promises for a changed world size: a checkpoint saved by N processes resumes with any number
M; the weights and the optimizer state are restored exactly (keyed by parameter name), the global input
position carries over, and only the random number generator states stay behind (a warning says so). One
chain covers both directions: 2 ranks train to step 6, 4 ranks resume to 12, 2 ranks resume to 16; each
resumed run's state right after the restore is compared with the state its predecessor held when it saved,
and the end with one process trained straight to 16.
"""

from __future__ import annotations

import copy
import json
import logging
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import classifier_model_fn, sum_sign_data

import torchestimator as te
from torchestimator.testing import run_in_processes

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _input_fn(input_context=None):
    x, y = sum_sign_data()
    # A global batch of 32: 16 per replica under 2, 8 under 4.
    return te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=5)(
        input_context=input_context
    )


_LIVE: dict[str, object] = {}  # this process's module and optimizer, as the Estimator built them


def _model():
    _LIVE["model"] = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    return _LIVE["model"]


def _optimizer(parameters):
    _LIVE["optimizer"] = torch.optim.Adam(parameters, lr=0.01)
    return _LIVE["optimizer"]


def _estimator(model_dir, strategy=None):
    config = te.RunConfig(
        train_distribute=strategy,
        save_checkpoints_steps=3,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
    )
    return te.Estimator(
        model_fn=classifier_model_fn, model=_model, optimizer=_optimizer, model_dir=model_dir, config=config
    )


def _live_state() -> dict:
    return {
        "weights": {name: tensor.detach().clone() for name, tensor in _LIVE["model"].state_dict().items()},
        "optimizer": copy.deepcopy(_LIVE["optimizer"].state_dict()),
    }  # its tensors change in place


class _Record(te.Hook):
    """The live weights and optimizer state right after the restore, and at the end (what the last save holds)."""

    def __init__(self):
        self.restored = self.final = None

    def after_restore(self, state):
        self.restored = {**_live_state(), "step": state.global_step}

    def end(self, state):
        self.final = {**_live_state(), "step": state.global_step}


def _train(model_dir, num_replicas, max_steps):
    torch.set_num_threads(1)
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("torchestimator").addHandler(handler)
    hook = _Record()
    _estimator(model_dir, te.MirroredStrategy(num_replicas=num_replicas)).train(
        _input_fn, max_steps=max_steps, hooks=[hook]
    )
    return {"restored": hook.restored, "final": hook.final, "warnings": warnings}


def _assert_same_state(restored: dict, saved: dict) -> None:
    assert restored["step"] == saved["step"]
    assert restored["weights"].keys() == saved["weights"].keys()
    for name, tensor in saved["weights"].items():
        assert torch.equal(restored["weights"][name], tensor), name
    restored_optimizer, saved_optimizer = restored["optimizer"], saved["optimizer"]
    assert restored_optimizer["state"].keys() == saved_optimizer["state"].keys()
    for index, values in saved_optimizer["state"].items():
        assert restored_optimizer["state"][index].keys() == values.keys()
        for key, value in values.items():
            assert torch.equal(torch.as_tensor(restored_optimizer["state"][index][key]), torch.as_tensor(value)), (
                index,
                key,
            )
    assert [{k: v for k, v in group.items() if k != "params"} for group in restored_optimizer["param_groups"]] == [
        {k: v for k, v in group.items() if k != "params"} for group in saved_optimizer["param_groups"]
    ]


def _shards(model_dir: str, step: int) -> tuple[int, list[str]]:
    state = json.loads(open(os.path.join(model_dir, f"ckpt-{step}", "state.json")).read())
    return state["extra"]["num_replicas"], sorted(name for name in state["files"] if name.endswith(".distcp"))


def _straight(model_dir, max_steps):
    estimator = _estimator(model_dir)
    estimator.train(_input_fn, max_steps=max_steps)
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def test_a_checkpoint_of_2_ranks_resumes_with_4_and_theirs_with_2(tmp_path):
    model_dir = str(tmp_path / "run")
    two = run_in_processes(_train, nprocs=2, args=(model_dir, 2, 6), timeout=120)
    assert _shards(model_dir, 6) == (2, ["__0_0.distcp", "__1_0.distcp"])
    four = run_in_processes(_train, nprocs=4, args=(model_dir, 4, 12), timeout=120)
    assert _shards(model_dir, 12) == (4, [f"__{rank}_0.distcp" for rank in range(4)])
    back = run_in_processes(_train, nprocs=2, args=(model_dir, 2, 16), timeout=120)
    # 2 -> 4 and 4 -> 2: every rank restores exactly what the ranks before it held when they saved.
    for rank in range(4):
        _assert_same_state(four[rank]["restored"], two[0]["final"])
        assert any("written by 2 replica(s), this run has 4" in text for text in four[rank]["warnings"])
    for rank in range(2):
        _assert_same_state(back[rank]["restored"], four[0]["final"])
        assert any("written by 4 replica(s), this run has 2" in text for text in back[rank]["warnings"])
    assert back[0]["final"]["step"] == 16
    # The global input position carried over both changes: the end equals one process trained straight to 16
    # (to float rounding: the gradients are summed over other numbers of shards).
    straight = _straight(str(tmp_path / "straight"), 16)
    for name, value in straight.items():
        np.testing.assert_allclose(back[0]["final"]["weights"][name].numpy(), value, atol=1e-6, err_msg=name)
