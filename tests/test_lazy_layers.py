"""Lazy layers (nn.LazyLinear, nn.LazyBatchNorm1d), the natural port of tf.layers.dense, work in every later run
(issue 29 point 1): resume bit for bit, evaluate, predict and export in a new Estimator, warm start from and into a
lazy model, on 2 replicas under DDP and FSDP2. The dry forward that gives them shapes leaves no trace: training
reads the same first batch, draws the same random numbers, and BatchNorm starts from its initial statistics."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import class_model_fn, sum_sign_data

import torchestimator as te
from torchestimator.distribute import MirroredStrategy
from torchestimator.distribute.fsdp import FullyShardedStrategy
from torchestimator.errors import ConfigError
from torchestimator.export import TensorSpec, export_saved_model, load, serving_input_receiver
from torchestimator.testing import run_in_processes


def lazy_model() -> nn.Module:
    """tf.layers.dense style: no input sizes anywhere."""
    return nn.Sequential(nn.LazyLinear(16), nn.LazyBatchNorm1d(), nn.Tanh(), nn.Dropout(0.1), nn.LazyLinear(2))


def eager_model() -> nn.Module:
    """The same model with its sizes written out."""
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 2))


def train_input_fn(input_context=None):
    x, y = sum_sign_data()
    return te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=5)(
        input_context=input_context
    )


def eval_input_fn(input_context=None):
    x, y = sum_sign_data()
    return te.numpy_input_fn({"x": x}, y, batch_size=64, shuffle=False)(input_context=input_context)


def predict_input_fn():
    return te.numpy_input_fn({"x": sum_sign_data()[0][:10]}, batch_size=5, shuffle=False)()


def estimator(model_dir, model=lazy_model, strategy=None, model_fn=class_model_fn, **settings):
    return te.Estimator(
        model_fn=model_fn,
        model=model,
        optimizer=lambda parameters: torch.optim.Adam(parameters, lr=0.01),
        model_dir=str(model_dir),
        config=te.RunConfig(
            train_distribute=strategy,
            save_checkpoints_steps=4,
            log_step_count_steps=None,
            progress_bar=False,
            random_seed=0,
            deterministic=True,
        ),
        **settings,
    )


def weights(est) -> dict[str, np.ndarray]:
    return {name: est.get_variable_value(name) for name in est.get_variable_names()}


def assert_same_weights(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> None:
    assert sorted(left) == sorted(right)
    for name in left:
        np.testing.assert_array_equal(left[name], right[name], err_msg=name)


# ----------------------------------------------------------------------------- one process


def test_a_stopped_and_resumed_lazy_model_ends_with_the_weights_of_one_never_stopped(tmp_path):
    estimator(tmp_path / "straight").train(train_input_fn, max_steps=12)
    estimator(tmp_path / "resumed").train(train_input_fn, max_steps=4)
    resumed = estimator(tmp_path / "resumed")  # a new process's view: lazy layers, shapes from ckpt-4
    resumed.train(train_input_fn, max_steps=12)
    straight = weights(estimator(tmp_path / "straight"))
    assert straight["0.weight"].shape == (16, 6) and straight["1.running_mean"].shape == (16,)
    assert_same_weights(weights(resumed), straight)


def test_a_new_estimator_evaluates_predicts_and_exports_a_trained_lazy_model(tmp_path):
    trained = estimator(tmp_path / "model")
    trained.train(train_input_fn, max_steps=8)
    expected = trained.evaluate(eval_input_fn)
    expected_classes = [row["class"] for row in trained.predict(predict_input_fn)]

    assert estimator(tmp_path / "model").evaluate(eval_input_fn) == expected
    assert [row["class"] for row in estimator(tmp_path / "model").predict(predict_input_fn)] == expected_classes
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 6), dtype=torch.float32)})
    export_dir = export_saved_model(estimator(tmp_path / "model"), tmp_path / "export", receiver)
    served = load(export_dir)({"x": sum_sign_data()[0][:10]})
    assert [int(value) for value in served["class"]] == [int(value) for value in expected_classes]


def test_warm_start_into_a_lazy_model_for_training_and_for_evaluation(tmp_path):
    source = estimator(tmp_path / "source", model=eager_model)
    source.train(train_input_fn, max_steps=8)
    source_weights = weights(source)

    # evaluate with no checkpoint: the eval input's first batch gives the shapes, then the warm start loads
    everything = te.WarmStartSettings(str(tmp_path / "source"), vars_to_warm_start=[".*"])  # BatchNorm's too
    warm_evaluated = estimator(tmp_path / "warm_eval", warm_start_from=everything)
    assert warm_evaluated.evaluate(eval_input_fn)["accuracy"] == source.evaluate(eval_input_fn)["accuracy"]
    assert not (tmp_path / "warm_eval").joinpath("ckpt-0").exists()

    # one step at learning rate 0: the weights training starts from are the warm-started ones
    frozen = te.Estimator(
        model_fn=class_model_fn,
        model=lazy_model,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.0),
        model_dir=str(tmp_path / "warm_train"),
        config=te.RunConfig(save_checkpoints_steps=1, log_step_count_steps=None, progress_bar=False),
        warm_start_from=te.WarmStartSettings(str(tmp_path / "source"), vars_to_warm_start=".*weight|.*bias"),
    )
    frozen.train(train_input_fn, max_steps=1)
    for name in ("0.weight", "0.bias", "1.weight", "4.weight", "4.bias"):
        np.testing.assert_array_equal(frozen.get_variable_value(name), source_weights[name], err_msg=name)


def test_warm_start_from_a_lazy_model_into_an_eager_one(tmp_path):
    estimator(tmp_path / "lazy").train(train_input_fn, max_steps=4)
    eager = estimator(tmp_path / "eager", model=eager_model, warm_start_from=str(tmp_path / "lazy"))
    report = eager.warm_start_report()
    assert {entry.target: entry.source_shape for entry in report.entries} == {
        name: tuple(tensor.shape) for name, tensor in eager_model().named_parameters()
    }
    eager.train(train_input_fn, max_steps=5)  # warm-started, then trained on
    lazy_into_lazy = estimator(tmp_path / "lazy2", warm_start_from=str(tmp_path / "lazy"))
    with pytest.raises(ConfigError, match=r"warm_start_report needs the shapes.*0\.weight"):
        lazy_into_lazy.warm_start_report()  # a dry run without input: nothing can give the shapes


def test_the_dry_forward_leaves_no_trace(tmp_path):
    """Training of a lazy model sees the batches, random numbers and BatchNorm statistics an eager model sees."""
    seen: dict[str, list] = {}

    def recording_model_fn(name):
        def model_fn(model, features, labels, mode):
            if torch.is_grad_enabled():  # a training step, not the dry forward
                log = seen.setdefault(name, [])
                log.append((features["x"].clone(), model[1].running_mean.clone(), torch.rand(1)))
            return class_model_fn(model, features, labels, mode)

        return model_fn

    estimator(tmp_path / "lazy", model_fn=recording_model_fn("lazy")).train(train_input_fn, max_steps=3)
    estimator(tmp_path / "eager", model=eager_model, model_fn=recording_model_fn("eager")).train(
        train_input_fn, max_steps=3
    )
    assert len(seen["lazy"]) == len(seen["eager"]) == 3
    for (lazy_x, _, lazy_draw), (eager_x, _, eager_draw) in zip(seen["lazy"], seen["eager"]):
        assert torch.equal(lazy_x, eager_x)  # the first batch is not consumed
        assert torch.equal(lazy_draw, eager_draw)  # the dry forward's draws (shuffle, dropout) were put back
    first_mean = seen["lazy"][0][1]
    assert first_mean.shape == (16,) and torch.count_nonzero(first_mean) == 0  # BatchNorm's initial statistics


def test_a_lazy_layer_model_fn_never_calls_is_named(tmp_path):
    def model_fn(model, features, labels, mode):
        logits = model[0](features["x"])[:, :2]  # model[1] (a LazyLinear) is never called
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels))

    lazy = estimator(
        tmp_path / "model", model=lambda: nn.Sequential(nn.LazyLinear(4), nn.LazyLinear(2)), model_fn=model_fn
    )
    with pytest.raises(ConfigError, match=r"does not call every lazy layer.*1\.weight, 1\.bias"):
        lazy.train(train_input_fn, max_steps=2)
    assert not (tmp_path / "model").exists()


def test_an_input_fn_without_batches_is_named_for_lazy_layers(tmp_path):
    with pytest.raises(ConfigError, match=r"lazy layers \(0\.weight.*input_fn yielded no batch"):
        estimator(tmp_path / "model").train(lambda: iter(()), max_steps=2)


def test_export_of_a_warm_start_alone_names_the_shapeless_variables(tmp_path):
    estimator(tmp_path / "source", model=eager_model).train(train_input_fn, max_steps=4)
    lazy = estimator(tmp_path / "model", warm_start_from=str(tmp_path / "source"))
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 6), dtype=torch.float32)})
    with pytest.raises(ConfigError, match=r"Warm start from .*source needs the shapes.*0\.weight"):
        export_saved_model(lazy, tmp_path / "export", receiver)
    assert not (tmp_path / "export").exists() or os.listdir(tmp_path / "export") == []


# ----------------------------------------------------------------------------- two processes


def _two_replicas(root, kind):
    def strategy():
        if kind == "fsdp":
            return FullyShardedStrategy(num_replicas=2, module_names=["0"])
        return MirroredStrategy(num_replicas=2)

    first = estimator(os.path.join(root, kind), strategy=strategy())
    first.train(train_input_fn, max_steps=4)  # fresh: the dry forward comes before DDP/FSDP2 wrap
    resumed = estimator(os.path.join(root, kind), strategy=strategy())  # shapes from the checkpoint
    resumed.train(train_input_fn, max_steps=8)
    metrics = resumed.evaluate(eval_input_fn)
    return {"weights": weights(resumed), "accuracy": metrics["accuracy"], "step": metrics["global_step"]}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_lazy_layers_on_two_replicas_train_resume_and_evaluate(tmp_path, kind):
    rank_0, rank_1 = run_in_processes(_two_replicas, nprocs=2, args=(str(tmp_path), kind), timeout=300)
    assert rank_0["step"] == rank_1["step"] == 8
    assert rank_0["accuracy"] == rank_1["accuracy"]
    assert_same_weights(rank_0["weights"], rank_1["weights"])
    assert rank_0["weights"]["0.weight"].shape == (16, 6)
