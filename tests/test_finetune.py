"""freeze / unfreeze keep frozen BatchNorm statistics still; param_groups give parts their own learning rate."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from helpers import classifier_model_fn, input_fns

import torchestimator as te


class Backboned(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.head(self.backbone(x))


def _train(tmp_path, prepare):
    model = Backboned()
    prepare(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    estimator = te.Estimator(
        model_fn=classifier_model_fn,
        model=model,
        model_dir=str(tmp_path),
        optimizer=lambda parameters: torch.optim.SGD([p for p in parameters if p.requires_grad], lr=0.1),
        config=te.RunConfig(progress_bar=False, log_step_count_steps=None, save_checkpoints_steps=10),
    )
    estimator.train(input_fns()[0], max_steps=10)
    after = model.state_dict()
    return before, after


def test_frozen_batchnorm_statistics_stay_put_and_unfrozen_ones_move(tmp_path):
    before, after = _train(tmp_path / "freeze", lambda model: te.freeze(model, [r"backbone\b"]))
    assert torch.equal(after["backbone.0.weight"], before["backbone.0.weight"])
    assert torch.equal(after["backbone.1.running_mean"], before["backbone.1.running_mean"])
    assert not torch.equal(after["head.1.running_mean"], before["head.1.running_mean"])
    assert not torch.equal(after["head.0.weight"], before["head.0.weight"])


def test_plain_requires_grad_false_lets_batchnorm_drift(tmp_path):
    def plain(model):
        for parameter in model.backbone.parameters():
            parameter.requires_grad_(False)

    before, after = _train(tmp_path / "plain", plain)
    assert torch.equal(after["backbone.0.weight"], before["backbone.0.weight"])
    assert not torch.equal(after["backbone.1.running_mean"], before["backbone.1.running_mean"])  # the trap


def test_unfreeze_and_errors():
    model = Backboned()
    te.freeze(model, r"backbone\b")
    te.unfreeze(model, r"backbone\b")
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="No parameter or BatchNorm layer"):
        te.freeze(model, r"encoder")


def test_param_groups_give_each_part_its_learning_rate():
    model = Backboned()
    te.freeze(model, r"backbone\.0")
    groups = te.param_groups(model, [(r"backbone\.", {"lr": 1e-4}), (r".*", {"lr": 1e-2})])
    optimizer = torch.optim.SGD(groups, lr=1.0)
    assert [group["lr"] for group in optimizer.param_groups] == [1e-4, 1e-2]
    assert len(optimizer.param_groups[0]["params"]) == 2  # backbone.1 (BatchNorm) only; backbone.0 is frozen
    with pytest.raises(ValueError, match="matches none of the groups"):
        te.param_groups(model, [(r"head\.", {"lr": 1e-3})])
