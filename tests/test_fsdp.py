"""FullyShardedStrategy (FSDP2): its wrap policy and settings, and training on 2 gloo processes that equals DDP
and one process, resumes from its own sharded checkpoints, evaluates inside training and after it."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import class_model_fn, sum_sign_data

import torchestimator as te
from torchestimator.checkpoint import CheckpointStore
from torchestimator.distribute import MirroredStrategy
from torchestimator.distribute.fsdp import FullyShardedStrategy
from torchestimator.errors import ConfigError
from torchestimator.testing import run_in_processes


class _Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3))


def test_the_wrap_policy_shards_transformer_layers_and_named_modules_innermost_first():
    model = _Tagger()
    chosen = FullyShardedStrategy(module_names=["head", "head.1"]).sharded_submodules(model)
    order = [id(module) for module in chosen]
    assert order.index(id(model.head[1])) < order.index(id(model.head))  # inside "head": sharded before it
    assert set(map(id, chosen)) == {
        id(model.encoder.layers[0]),
        id(model.encoder.layers[1]),
        id(model.head),
        id(model.head[1]),
    }
    assert FullyShardedStrategy(layer_types=[]).sharded_submodules(model) == []


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"layer_types": [int]}, "layer_types"),
        ({"module_names": "head"}, "module_names"),
        ({"mixed_precision": "fp8"}, "mixed_precision"),
        ({"mixed_precision": torch.bfloat16}, "mixed_precision"),
        ({"cpu_offload": "yes"}, "cpu_offload"),
    ],
)
def test_bad_settings_are_refused_when_built(settings, field):
    with pytest.raises(ConfigError) as caught:
        FullyShardedStrategy(**settings)
    assert caught.value.field == field


def test_a_module_name_the_model_lacks_is_refused_with_the_names_it_has():
    with pytest.raises(ConfigError, match=r"\['decoder'\] are not modules of _Tagger.*'encoder'"):
        FullyShardedStrategy(module_names=["decoder"]).sharded_submodules(_Tagger())


# ----------------------------------------------------------------------------- two processes


def _train_input_fn(input_context=None):
    x, y = sum_sign_data()
    return te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=5)(
        input_context=input_context
    )


def _eval_input_fn(input_context=None):
    x, y = sum_sign_data()
    # 193 = 3 x 64 + 1: the last global batch leaves the second replica an empty share.
    return te.numpy_input_fn({"x": x[:193]}, y[:193], batch_size=64, shuffle=False)(input_context=input_context)


def _predict_input_fn():
    return te.numpy_input_fn({"x": sum_sign_data()[0][:10]}, batch_size=4, shuffle=False)()


def _estimator(model_dir, strategy=None, **config):
    config = te.RunConfig(
        train_distribute=strategy,
        save_checkpoints_steps=4,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
        **config,
    )
    return te.Estimator(
        model_fn=class_model_fn,
        model=lambda: nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)),
        optimizer=lambda parameters: torch.optim.Adam(parameters, lr=0.01),
        model_dir=model_dir,
        config=config,
    )


def _weights(estimator):
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def _fsdp(**settings):
    return FullyShardedStrategy(num_replicas=2, module_names=["0"], **settings)


def _fsdp_ddp_and_their_checkpoints(root):
    sharded = _estimator(os.path.join(root, "fsdp"), _fsdp())
    sharded.train(_train_input_fn, max_steps=8)
    after_8 = sharded.evaluate(_eval_input_fn)  # a plain module with the gathered weights, uneven shares
    resumed = _estimator(os.path.join(root, "fsdp"), _fsdp())  # a new process's view: restore from ckpt-8
    resumed.train(_train_input_fn, max_steps=12)
    predictions = list(resumed.predict(_predict_input_fn))
    ddp = _estimator(os.path.join(root, "ddp"), MirroredStrategy(num_replicas=2))
    ddp.train(_train_input_fn, max_steps=12)
    accumulated = _estimator(
        os.path.join(root, "accumulated"), _fsdp(), gradient_accumulation_steps=2, clip_grad_norm=0.5
    )
    accumulated.train(_train_input_fn, max_steps=4)
    in_loop, _ = te.train_and_evaluate(
        _estimator(os.path.join(root, "in_loop"), _fsdp()),
        te.TrainSpec(_train_input_fn, max_steps=8),
        te.EvalSpec(_eval_input_fn, steps=None, every_n_steps=4),
    )
    for name, settings in (("bf16", {"mixed_precision": "bf16"}), ("offload", {"cpu_offload": True})):
        _estimator(os.path.join(root, name), _fsdp(**settings)).train(_train_input_fn, max_steps=2)
    return {
        "fsdp": _weights(resumed),
        "ddp": _weights(ddp),
        "after_8": after_8,
        "predictions": len(predictions),
        "accumulated": _weights(accumulated),
        "in_loop": in_loop,
        "module_type": type(resumed._model.module).__name__,
    }


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_on_two_processes_equals_ddp_and_one_process_and_resumes(tmp_path):
    root = str(tmp_path)
    rank_0, rank_1 = run_in_processes(_fsdp_ddp_and_their_checkpoints, nprocs=2, args=(root,), timeout=420)
    single = _estimator(str(tmp_path / "one"))
    single.train(_train_input_fn, max_steps=8)
    single_after_8 = single.evaluate(_eval_input_fn)
    single.train(_train_input_fn, max_steps=12)
    for name, value in _weights(single).items():
        np.testing.assert_allclose(rank_0["fsdp"][name], value, atol=1e-6)  # sharded, resumed at step 8
        np.testing.assert_allclose(rank_0["ddp"][name], value, atol=1e-6)
        np.testing.assert_array_equal(rank_0["fsdp"][name], rank_1["fsdp"][name])
    assert rank_0["after_8"]["loss"] == pytest.approx(single_after_8["loss"], rel=1e-5)
    assert rank_0["after_8"] == rank_1["after_8"] and rank_0["predictions"] == 10
    assert rank_0["module_type"] == "Sequential"  # after train(): a plain module holding the whole weights
    # The sharded checkpoint: each rank wrote its own shards (DTensor pieces), whole tensors read back.
    state = CheckpointStore(str(tmp_path / "fsdp")).restore(str(tmp_path / "fsdp" / "ckpt-8"))
    assert state.sharded and state.extra["num_replicas"] == 2
    assert len([name for name in os.listdir(tmp_path / "fsdp" / "ckpt-8") if name.endswith(".distcp")]) == 2

    accumulated = _estimator(str(tmp_path / "one_accumulated"), gradient_accumulation_steps=2, clip_grad_norm=0.5)
    accumulated.train(_train_input_fn, max_steps=4)
    for name, value in _weights(accumulated).items():
        np.testing.assert_allclose(rank_0["accumulated"][name], value, atol=1e-6)

    in_loop, _ = te.train_and_evaluate(
        _estimator(str(tmp_path / "one_in_loop")),
        te.TrainSpec(_train_input_fn, max_steps=8),
        te.EvalSpec(_eval_input_fn, steps=None, every_n_steps=4),
    )
    assert rank_0["in_loop"]["global_step"] == in_loop["global_step"] == 8
    assert rank_0["in_loop"]["loss"] == pytest.approx(in_loop["loss"], rel=1e-5)
    for name in ("bf16", "offload"):
        assert CheckpointStore(str(tmp_path / name)).restore().step == 2
