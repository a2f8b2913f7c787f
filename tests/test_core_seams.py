"""The core's seams: evaluation inside the training loop, the NaN watch off the host, the Strategy's collectives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchestimator as te
from torchestimator._core import loop
from torchestimator.checkpoint import CheckpointStore
from torchestimator.export import LatestExporter, TensorSpec, serving_input_receiver
from torchestimator._io.summary import read_scalars

from conftest import SmallNet, classifier_model_fn, make_classification, make_estimator


def _loader_input_fn():
    """A plain DataLoader (cannot resume) shuffling with torch's global generator."""
    x, y = make_classification(128, seed=1)
    dataset = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    loader = DataLoader(dataset, batch_size=16, shuffle=True)
    return (({"x": features}, labels) for features, labels in _endless(loader))


def _endless(loader):
    while True:
        yield from loader


def _eval_input_fn():
    """Draws from the global generators too: evaluation must not move training's random streams."""
    x, y = make_classification(64, seed=2)
    order = torch.randperm(64).numpy()
    np.random.rand()
    return [({"x": torch.from_numpy(x[order[i:i + 32]])}, torch.from_numpy(y[order[i:i + 32]])) for i in (0, 32)]


def _dropout_estimator(model_dir, optimizers=None):
    def optimizer(parameters):
        built = torch.optim.Adam(parameters, lr=1e-2)
        if optimizers is not None:
            optimizers.append(built)
        return built

    return make_estimator(model_dir, model=lambda: SmallNet(dropout=0.3), optimizer=optimizer,
                          save_checkpoints_steps=10)


def _weights(estimator):
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def test_train_and_evaluate_gives_the_weights_of_training_without_evaluations(tmp_path):
    plain = _dropout_estimator(tmp_path / "plain")
    plain.train(_loader_input_fn, max_steps=20)
    evaluated = _dropout_estimator(tmp_path / "evaluated")
    results, _ = te.train_and_evaluate(evaluated, te.TrainSpec(_loader_input_fn, max_steps=20),
                                       te.EvalSpec(_eval_input_fn, steps=None, every_n_steps=5))
    # The DataLoader was never restarted, dropout and shuffling drew the same numbers, BatchNorm statistics
    # were not touched by the evaluations: the weights are bit-identical.
    for name, value in _weights(plain).items():
        np.testing.assert_array_equal(_weights(evaluated)[name], value, err_msg=name)
    assert results["global_step"] == 20
    assert [step for step, _ in read_scalars(evaluated.eval_dir())["loss"]] == [5, 10, 15, 20]


def test_evaluations_inside_the_loop_build_one_optimizer_and_read_no_checkpoint(tmp_path, monkeypatch):
    reads = []
    original_restore = CheckpointStore.restore
    monkeypatch.setattr(CheckpointStore, "restore",
                        lambda self, *args, **kwargs: reads.append(args) or original_restore(self, *args, **kwargs))
    optimizers: list[torch.optim.Optimizer] = []
    estimator = _dropout_estimator(tmp_path / "run", optimizers)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    _, exports = te.train_and_evaluate(
        estimator, te.TrainSpec(_loader_input_fn, max_steps=30),
        te.EvalSpec(_eval_input_fn, steps=None, every_n_steps=10, exporters=LatestExporter("latest", receiver)))
    assert len(optimizers) == 1 and reads == []
    # Each export holds the weights of the checkpoint of its step, though the live module trained on.
    assert len(exports) == 1
    loaded = te.export.load(exports[0])
    x = torch.from_numpy(make_classification(4, seed=3)[0])
    expected = next(estimator.predict(lambda: [({"x": x}, None)], yield_single_examples=False))
    np.testing.assert_allclose(loaded.predict({"x": x.numpy()})["probabilities"], expected["probabilities"], rtol=1e-6)


def test_a_stop_from_early_stopping_inside_the_loop_ends_training_at_that_step(tmp_path):
    estimator = _dropout_estimator(tmp_path / "run")
    rule = te.stop_if_no_decrease_hook("loss", max_steps_without_decrease=1)
    results, _ = te.train_and_evaluate(estimator, te.TrainSpec(_loader_input_fn, max_steps=400),
                                       te.EvalSpec(_eval_input_fn, steps=None, every_n_steps=5),
                                       early_stopping=rule)
    stopped = results["global_step"]
    assert stopped < 400 and stopped % 5 == 0
    assert estimator.latest_checkpoint().endswith(f"ckpt-{stopped}")


def _nan_at_step(bad_step):
    calls = {"train": 0}

    def model_fn(model, features, labels, mode):
        spec = classifier_model_fn(model, features, labels, mode)
        if mode == te.ModeKeys.TRAIN:
            calls["train"] += 1
            if calls["train"] == bad_step:
                return te.EstimatorSpec(mode, loss=spec.loss * float("nan"), predictions=spec.predictions)
        return spec

    return model_fn


@pytest.mark.parametrize("watch", ["host", "device"])
def test_a_non_finite_loss_names_its_step_and_writes_no_checkpoint_after_it(tmp_path, monkeypatch, watch):
    if watch == "device":  # the accelerator's watch, run here on CPU tensors: read only at checkpoints and the end
        monkeypatch.setattr(loop, "_loss_watch", lambda device: loop._DeviceLossWatch(device))
    x, y = make_classification(256)
    estimator = make_estimator(tmp_path, model_fn=_nan_at_step(7), save_checkpoints_steps=5)
    with pytest.raises(te.NanLossDuringTrainingError, match="loss at step 7; training stopped at step (7|10)"):
        estimator.train(te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True), max_steps=20)
    assert CheckpointStore(str(tmp_path)).all_checkpoints()[-1].endswith("ckpt-5")


def test_device_loss_watch_keeps_the_first_bad_step():
    watch = loop._DeviceLossWatch(torch.device("cpu"))
    for step, value in enumerate([1.0, 2.0, float("inf"), float("nan"), 3.0], start=1):
        watch.observe(torch.tensor(value), step)
    assert bool(watch.flag()) and watch.first_bad_step() == 3
    clean = loop._DeviceLossWatch(torch.device("cpu"))
    clean.observe(torch.tensor(0.5), 1)
    assert not bool(clean.flag()) and clean.first_bad_step() is None


def test_one_replica_strategy_answers_its_collectives_locally():
    strategy = te.OneDeviceStrategy("cpu")
    strategy.setup()
    assert strategy.all_agree([True, False, torch.tensor(True)]) == [True, False, True]
    assert strategy.all_gather_object({"rank": 0}) == [{"rank": 0}]
    totals = torch.tensor([3.0, 4.0])
    assert strategy.reduce_sum(totals) is totals


def _threads_around_a_strategy():
    torch.set_num_threads(2)
    strategy = te.MirroredStrategy(num_replicas=2)
    strategy.setup()
    during = torch.get_num_threads()
    strategy.teardown()
    return during, torch.get_num_threads()


@pytest.mark.slow
def test_a_strategy_gives_back_the_thread_count_it_lowered():
    from torchestimator.testing import run_in_processes

    # OMP_NUM_THREADS=1 in each replica (as torchrun sets it): setup lowers torch's process-wide count, teardown restores it.
    assert run_in_processes(_threads_around_a_strategy, nprocs=2, timeout=120) == [(1, 2), (1, 2)]
