"""The core's seams: evaluation inside the training loop, the NaN watch off the host, the Strategy's collectives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import SmallNet, classifier_model_fn, make_classification, make_estimator
from torch.utils.data import DataLoader, TensorDataset

import torchestimator as te
from torchestimator._core import loop
from torchestimator._io.summary import read_scalars
from torchestimator.checkpoint import CheckpointStore
from torchestimator.export import LatestExporter, TensorSpec, serving_input_receiver


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
    return [({"x": torch.from_numpy(x[order[i : i + 32]])}, torch.from_numpy(y[order[i : i + 32]])) for i in (0, 32)]


def _dropout_estimator(model_dir, optimizers=None):
    def optimizer(parameters):
        built = torch.optim.Adam(parameters, lr=1e-2)
        if optimizers is not None:
            optimizers.append(built)
        return built

    return make_estimator(
        model_dir, model=lambda: SmallNet(dropout=0.3), optimizer=optimizer, save_checkpoints_steps=10
    )


def _weights(estimator):
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def test_train_and_evaluate_gives_the_weights_of_training_without_evaluations(tmp_path):
    plain = _dropout_estimator(tmp_path / "plain")
    plain.train(_loader_input_fn, max_steps=20)
    evaluated = _dropout_estimator(tmp_path / "evaluated")
    results, _ = te.train_and_evaluate(
        evaluated,
        te.TrainSpec(_loader_input_fn, max_steps=20),
        te.EvalSpec(_eval_input_fn, steps=None, every_n_steps=5),
    )
    # The DataLoader was never restarted, dropout and shuffling drew the same numbers, BatchNorm statistics
    # were not touched by the evaluations: the weights are bit-identical.
    for name, value in _weights(plain).items():
        np.testing.assert_array_equal(_weights(evaluated)[name], value, err_msg=name)
    assert results["global_step"] == 20
    assert [step for step, _ in read_scalars(evaluated.eval_dir())["loss"]] == [5, 10, 15, 20]


def test_evaluations_inside_the_loop_build_one_optimizer_and_read_no_checkpoint(tmp_path, monkeypatch):
    reads = []
    original_restore = CheckpointStore.restore
    monkeypatch.setattr(
        CheckpointStore,
        "restore",
        lambda self, *args, **kwargs: reads.append(args) or original_restore(self, *args, **kwargs),
    )
    optimizers: list[torch.optim.Optimizer] = []
    estimator = _dropout_estimator(tmp_path / "run", optimizers)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    _, exports = te.train_and_evaluate(
        estimator,
        te.TrainSpec(_loader_input_fn, max_steps=30),
        te.EvalSpec(_eval_input_fn, steps=None, every_n_steps=10, exporters=LatestExporter("latest", receiver)),
    )
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
    results, _ = te.train_and_evaluate(
        estimator,
        te.TrainSpec(_loader_input_fn, max_steps=400),
        te.EvalSpec(_eval_input_fn, steps=None, every_n_steps=5),
        early_stopping=rule,
    )
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


class _CallsTheEstimatorMidTraining(te.Hook):
    """A user's hook that evaluates and predicts while training runs (on a copy: training must not notice)."""

    def __init__(self, estimator, at_step):
        self.estimator, self.at_step, self.results = estimator, at_step, None

    def after_step(self, run_context):
        if run_context.global_step == self.at_step:
            # An input that draws no random numbers: a hook's own draws would (rightly) move training's streams.
            x, y = make_classification(64, seed=2)
            self.results = self.estimator.evaluate(te.numpy_input_fn({"x": x}, y, batch_size=32, shuffle=False))
            list(self.estimator.predict(lambda: [({"x": torch.zeros(2, 8)}, None)]))


def test_evaluate_and_predict_from_a_hook_leave_the_live_module_alone(tmp_path):
    plain = _dropout_estimator(tmp_path / "plain")
    plain.train(_loader_input_fn, max_steps=30)
    busy = _dropout_estimator(tmp_path / "busy")
    hook = _CallsTheEstimatorMidTraining(busy, at_step=15)  # step 15 has no checkpoint: step 10's is read
    busy.train(_loader_input_fn, hooks=[hook], max_steps=30)
    assert hook.results["global_step"] == 10
    # A reload of ckpt-10 into the live module, or eval mode left on (dropout off), would change these.
    for name, value in _weights(plain).items():
        np.testing.assert_array_equal(_weights(busy)[name], value, err_msg=name)


class _ExportsAnOlderCheckpoint(LatestExporter):
    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        older = estimator.checkpoint_store.all_checkpoints()[0]
        return estimator.export_saved_model(export_path, self._receiver, checkpoint_path=older)


def test_an_exporter_exporting_an_older_checkpoint_during_training_leaves_training_alone(tmp_path):
    plain = _dropout_estimator(tmp_path / "plain")
    plain.train(_loader_input_fn, max_steps=30)
    exporting = _dropout_estimator(tmp_path / "exporting")
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    te.train_and_evaluate(
        exporting,
        te.TrainSpec(_loader_input_fn, max_steps=30),
        te.EvalSpec(
            _eval_input_fn, steps=None, every_n_steps=20, exporters=_ExportsAnOlderCheckpoint("older", receiver)
        ),
    )
    for name, value in _weights(plain).items():
        np.testing.assert_array_equal(_weights(exporting)[name], value, err_msg=name)


class _RecordingFinalExporter(te.export.FinalExporter):
    def __init__(self, name, receiver, calls):
        super().__init__(name, receiver)
        self.calls = calls

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        self.calls.append((eval_result["global_step"], is_the_final_export))
        return super().export(estimator, export_path, checkpoint_path, eval_result, is_the_final_export)


@pytest.mark.parametrize("ending", ["input ends", "a hook stops"])
def test_a_final_exporter_exports_once_when_training_ends_at_an_evaluation_step(tmp_path, ending):
    x, y = make_classification(256)
    calls: list[tuple[int, bool]] = []
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    if ending == "input ends":  # 8 steps in one epoch; the loop learns of the end after evaluating step 8
        spec = te.TrainSpec(te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=1, shuffle=True))
    else:
        spec = te.TrainSpec(
            te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True),
            hooks=[te.StopAtStepHook(last_step=8)],
        )
    estimator = make_estimator(tmp_path, save_checkpoints_steps=4)
    te.train_and_evaluate(
        estimator,
        spec,
        te.EvalSpec(
            _eval_input_fn, steps=None, every_n_steps=4, exporters=_RecordingFinalExporter("final", receiver, calls)
        ),
    )
    assert [final for _, final in calls].count(True) == 1 and calls[-1] == (8, True)
    assert len(te.export.list_versions(tmp_path / "export" / "final")) == 1


def test_random_seed_gives_the_same_training_whichever_call_builds_the_model(tmp_path):
    trained_first = _dropout_estimator(tmp_path / "train-first")
    trained_first.train(_loader_input_fn, max_steps=10)
    torch.manual_seed(1234)  # whatever the process drew before
    evaluated_first = _dropout_estimator(tmp_path / "evaluate-first")
    evaluated_first.evaluate(_eval_input_fn)  # builds the model (no checkpoint yet: fresh weights)
    evaluated_first.train(_loader_input_fn, max_steps=10)
    for name, value in _weights(trained_first).items():
        np.testing.assert_array_equal(_weights(evaluated_first)[name], value, err_msg=name)


def test_without_checkpoints_the_final_export_holds_the_weights_trained_in_this_process(tmp_path):
    estimator = make_estimator(tmp_path, save_checkpoints_steps=None)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    _, exports = te.train_and_evaluate(
        estimator,
        te.TrainSpec(_loader_input_fn, max_steps=12),
        te.EvalSpec(_eval_input_fn, steps=None, exporters=te.export.FinalExporter("final", receiver)),
    )
    x = torch.from_numpy(make_classification(4, seed=3)[0])
    expected = next(estimator.predict(lambda: [({"x": x}, None)], yield_single_examples=False))
    exported = te.export.load(exports[0])
    assert exported.metadata["global_step"] == 12 and exported.metadata["checkpoint_path"] is None
    np.testing.assert_allclose(exported({"x": x.numpy()})["probabilities"], expected["probabilities"], rtol=1e-6)


def test_reading_the_loss_has_no_side_effect_and_the_state_keeps_the_latest_read(tmp_path):
    """RunContext.loss is a plain getter; after a step's hooks the loop records the loss one of them read."""
    from helpers import input_fns

    seen: dict[str, list] = {"read": [], "state": [], "end": []}

    class ReadsTheLossAtStep2(te.Hook):
        def after_step(self, run_context):
            seen["state"].append(run_context.state.last_loss)  # before this step's read, if any
            if run_context.global_step == 2:
                seen["read"].append(run_context.loss)
                seen["state"].append(run_context.state.last_loss)  # the getter changed nothing

        def end(self, state):
            seen["end"].append(state.last_loss)

    train, _, _, _ = input_fns()
    make_estimator(tmp_path, save_checkpoints_steps=None).train(train, max_steps=3, hooks=[ReadsTheLossAtStep2()])
    (step_2_loss,) = seen["read"]
    # steps 1 and 2 (before and after the read): nothing; step 3: the loop recorded step 2's read loss.
    assert seen["state"] == [None, None, None, step_2_loss]
    assert seen["end"][0] != step_2_loss  # at the end: the final step's loss, not the last one read
