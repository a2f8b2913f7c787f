"""What the training loop promises: BatchNorm modes, NaN guard, hooks, spec and input errors, Ctrl-C,
summaries, mixed precision, gradient accumulation and clipping."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import SmallNet, classifier_model_fn, input_fns, make_classification, make_estimator, read_only_directory

import torchestimator as te
from torchestimator._io.summary import read_scalars

# -- BatchNorm -----------------------------------------------------------------


def test_batchnorm_statistics_change_in_train_only_and_are_checkpointed(tmp_path):
    train, evaluate, predict, _ = input_fns()
    estimator = make_estimator(tmp_path, save_checkpoints_steps=5)
    estimator.train(train, max_steps=5)
    after_train = estimator.get_variable_value("net.1.running_mean")
    assert not np.allclose(after_train, 0.0)  # statistics moved during TRAIN
    assert estimator.get_variable_value("net.1.num_batches_tracked") == 5
    module = estimator._model.module
    before = module.net[1].running_mean.clone()
    estimator.evaluate(evaluate)
    list(estimator.predict(predict))
    assert torch.equal(module.net[1].running_mean, before)  # unchanged by EVAL and PREDICT
    estimator.train(train, max_steps=10)
    assert not np.allclose(estimator.get_variable_value("net.1.running_mean"), after_train)


def test_predict_accuracy_equals_evaluate_accuracy_with_batchnorm(tmp_path):
    train, evaluate, predict, (_, y) = input_fns(n=300, batch_size=64)
    estimator = make_estimator(tmp_path)
    estimator.train(train, max_steps=30)
    accuracy = estimator.evaluate(evaluate)["accuracy"]
    classes = np.array([row["class"] for row in estimator.predict(predict)])
    assert accuracy == pytest.approx(float((classes == y).mean()), abs=1e-9)
    assert accuracy > 0.8


# -- NaN guard -------------------------------------------------------------------


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path):
    train, _, _, _ = input_fns()
    calls = {"n": 0}

    def model_fn(model, features, labels, mode):
        spec = classifier_model_fn(model, features, labels, mode)
        calls["n"] += 1
        if calls["n"] == 8:
            return te.EstimatorSpec(mode, predictions=spec.predictions, loss=spec.loss * float("nan"))
        return spec

    estimator = make_estimator(tmp_path, model_fn=model_fn, save_checkpoints_steps=5)
    with pytest.raises(te.NanLossDuringTrainingError, match="step 8"):
        estimator.train(train, max_steps=20)
    assert estimator.latest_checkpoint().endswith("ckpt-5")
    assert all(np.isfinite(estimator.get_variable_value(name)).all() for name in estimator.get_variable_names())


def test_non_finite_weights_are_never_saved(tmp_path):
    train, _, _, _ = input_fns()

    class Poison(te.Hook):
        def __init__(self, module_holder):
            self.holder = module_holder

        def after_step(self, run_context):
            if run_context.global_step == 4:
                with torch.no_grad():
                    self.holder["module"].net[0].weight[0, 0] = float("inf")

    holder = {}

    def build():
        holder["module"] = SmallNet()
        return holder["module"]

    estimator = make_estimator(tmp_path, model=build, save_checkpoints_steps=2)
    with pytest.raises(te.NanLossDuringTrainingError, match="net.0.weight"):
        estimator.train(train, max_steps=10, hooks=[Poison(holder)])
    assert estimator.latest_checkpoint().endswith("ckpt-2")


# -- hooks -----------------------------------------------------------------------


class Recorder(te.Hook):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def begin(self, state):
        self.log.append((self.name, "begin", state.global_step))

    def after_restore(self, state):
        self.log.append((self.name, "after_restore", state.global_step))

    def before_step(self, run_context):
        self.log.append((self.name, "before_step", run_context.global_step))

    def after_step(self, run_context):
        self.log.append((self.name, "after_step", run_context.global_step, round(run_context.loss, 6)))

    def end(self, state):
        self.log.append((self.name, "end", state.global_step))


def test_hook_order_and_hooks_from_spec_and_call_both_run(tmp_path):
    train, _, _, _ = input_fns()
    log: list = []
    spec_hook = Recorder("spec", log)

    def model_fn(model, features, labels, mode):
        spec = classifier_model_fn(model, features, labels, mode)
        return te.EstimatorSpec(mode, predictions=spec.predictions, loss=spec.loss, training_hooks=[spec_hook])

    estimator = make_estimator(tmp_path, model_fn=model_fn)
    estimator.train(train, max_steps=3, hooks=[Recorder("call", log)])
    call_events = [event[:3] for event in log if event[0] == "call"]
    assert call_events == [
        ("call", "begin", 0),
        ("call", "after_restore", 0),
        ("call", "before_step", 0),
        ("call", "after_step", 1),
        ("call", "before_step", 1),
        ("call", "after_step", 2),
        ("call", "before_step", 2),
        ("call", "after_step", 3),
        ("call", "end", 3),
    ]
    assert any(event[0] == "spec" and event[1] == "after_step" for event in log)


def test_request_stop_and_stop_at_step_hook(tmp_path):
    train, _, _, _ = input_fns()

    class StopAtFour(te.Hook):
        def after_step(self, run_context):
            if run_context.global_step == 4:
                run_context.request_stop()

    estimator = make_estimator(tmp_path)
    estimator.train(train, max_steps=50, hooks=[StopAtFour()])
    assert estimator.latest_checkpoint().endswith("ckpt-4")
    estimator.train(train, hooks=[te.StopAtStepHook(num_steps=3)])
    assert estimator.latest_checkpoint().endswith("ckpt-7")
    estimator.train(train, hooks=[te.StopAtStepHook(last_step=9)])
    assert estimator.latest_checkpoint().endswith("ckpt-9")


def test_hooks_are_checked_before_the_first_step(tmp_path):
    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path)
    with pytest.raises(TypeError, match="te.Hook"):
        estimator.train(train, max_steps=2, hooks=[object()])
    assert estimator.latest_checkpoint() is None


def test_saving_listeners_and_checkpoint_saver_hook(tmp_path):
    train, _, _, _ = input_fns()
    events = []

    class Listener(te.CheckpointSaverListener):
        def __init__(self, name):
            self.name = name

        def before_save(self, state, global_step):
            events.append((self.name, "before", global_step))

        def after_save(self, state, global_step):
            events.append((self.name, "after", global_step))
            return self.name == "extra" and global_step >= 6

        def end(self, state, global_step):
            events.append((self.name, "end", global_step))

    estimator = make_estimator(tmp_path, save_checkpoints_steps=4)
    hook = te.CheckpointSaverHook(save_steps=3, listeners=[Listener("extra")])
    estimator.train(train, max_steps=20, hooks=[hook], saving_listeners=[Listener("main")])
    assert ("main", "before", 3) in events and ("extra", "after", 3) in events
    assert ("main", "after", 4) in events and ("extra", "after", 4) not in events
    assert ("extra", "after", 6) in events
    assert estimator.latest_checkpoint().endswith("ckpt-6")  # the listener asked to stop at 6
    assert ("extra", "end", 6) in events


# -- wrong model_fn / input_fn / model_dir ---------------------------------------


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda spec, mode: {"loss": spec.loss}, "must return an EstimatorSpec"),
        (lambda spec, mode: te.EstimatorSpec(mode, predictions=spec.predictions), "loss is required in TRAIN"),
        (lambda spec, mode: te.EstimatorSpec(mode, loss=spec.loss * torch.ones(3)), "loss must be a scalar"),
        (lambda spec, mode: te.EstimatorSpec(mode, loss=1.0), "loss must be a scalar tensor"),
    ],
)
def test_wrong_spec_fails_on_first_batch_naming_the_field(tmp_path, bad, message):
    train, _, _, _ = input_fns()
    calls = []

    def model_fn(model, features, labels, mode):
        calls.append(mode)
        return bad(classifier_model_fn(model, features, labels, mode), mode)

    with pytest.raises((ValueError, TypeError), match=message):
        make_estimator(tmp_path, model_fn=model_fn).train(train, max_steps=5)
    assert len(calls) == 1


def test_predict_spec_errors(tmp_path):
    _, _, predict, _ = input_fns()

    def no_predictions(model, features, mode):
        return te.EstimatorSpec(mode)

    def list_predictions(model, features, mode):
        return te.EstimatorSpec(mode, predictions={"class": [1, 2]})

    with pytest.raises(ValueError, match="predictions is required in PREDICT"):
        list(make_estimator(tmp_path, model_fn=no_predictions).predict(predict))
    with pytest.raises(TypeError, match=r"predictions\['class'\] must be a tensor; received list"):
        list(make_estimator(tmp_path, model_fn=list_predictions).predict(predict))


def test_input_fn_yielding_wrong_things(tmp_path):
    estimator = make_estimator(tmp_path)
    with pytest.raises(ValueError, match="batch 0 is a tuple of length 3"):
        estimator.train(lambda: [(1, 2, 3)], max_steps=1)
    with pytest.raises(TypeError, match="batch 0 is str"):
        estimator.train(lambda: ["text"], max_steps=1)
    with pytest.raises(TypeError, match="must return an iterable"):
        estimator.train(lambda: 42, max_steps=1)


def test_model_fn_without_labels_but_input_with_labels(tmp_path):
    train, _, _, _ = input_fns()

    def model_fn(model, features, mode):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="does not take labels"):
        make_estimator(tmp_path, model_fn=model_fn).train(train, max_steps=1)


def test_unwritable_model_dir_is_a_clear_error(tmp_path):
    """A read-only folder, as root too: the model_dir to create in it, or the model_dir itself."""
    train = input_fns()[0]
    with read_only_directory(tmp_path / "locked") as locked:
        with pytest.raises(PermissionError, match=r"model_dir '.*locked/run' is not writable \(Permission denied"):
            make_estimator(locked / "run").train(train, max_steps=1)
        with pytest.raises(
            PermissionError, match=r"model_dir '.*locked' is not writable \(Permission denied: .*locked/"
        ):
            make_estimator(locked).train(train, max_steps=1)
        assert list(locked.iterdir()) == []
    estimator = make_estimator(locked)  # the same folder made writable trains: the refusal was the folder's
    estimator.train(train, max_steps=1)
    assert estimator.latest_checkpoint().endswith("ckpt-1")


def test_model_dir_that_is_a_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match="is not a directory"):
        make_estimator(blocker)
    with pytest.raises(PermissionError, match="not writable"):
        make_estimator(blocker / "run").train(input_fns()[0], max_steps=1)
    assert blocker.read_text() == "not a folder"


# -- Ctrl-C ----------------------------------------------------------------------


def test_ctrl_c_finishes_the_step_and_writes_a_checkpoint(tmp_path):
    train, _, _, _ = input_fns()

    class Interrupt(te.Hook):
        def after_step(self, run_context):
            if run_context.global_step == 7:
                os.kill(os.getpid(), signal.SIGINT)

    estimator = make_estimator(tmp_path, save_checkpoints_steps=5)
    with pytest.raises(KeyboardInterrupt, match="step 7"):
        estimator.train(train, max_steps=100, hooks=[Interrupt()])
    assert estimator.latest_checkpoint().endswith("ckpt-7")
    resumed = make_estimator(tmp_path, save_checkpoints_steps=5)
    resumed.train(train, max_steps=9)
    assert resumed.latest_checkpoint().endswith("ckpt-9")


def test_ctrl_c_without_checkpoint_on_interrupt_keeps_last_checkpoint(tmp_path):
    train, _, _, _ = input_fns()

    class Interrupt(te.Hook):
        def after_step(self, run_context):
            if run_context.global_step == 7:
                raise KeyboardInterrupt

    estimator = make_estimator(tmp_path, save_checkpoints_steps=5, checkpoint_on_interrupt=False)
    with pytest.raises(KeyboardInterrupt):
        estimator.train(train, max_steps=100, hooks=[Interrupt()])
    assert estimator.latest_checkpoint().endswith("ckpt-5")
    assert make_estimator(tmp_path).evaluate(input_fns()[1])["global_step"] == 5


# -- summaries -------------------------------------------------------------------


def test_train_and_eval_summaries_are_readable_by_tensorboard(tmp_path):
    train, evaluate, _, _ = input_fns()
    estimator = make_estimator(tmp_path, save_summary_steps=5, log_step_count_steps=5)
    estimator.train(train, max_steps=10)
    results = estimator.evaluate(evaluate)
    estimator.evaluate(evaluate, name="holdout")
    scalars = read_scalars(str(tmp_path))
    assert [step for step, _ in scalars["loss"]] == [5, 10]
    assert "learning_rate" in scalars and "global_step/sec" in scalars
    evaluation = read_scalars(estimator.eval_dir())
    assert evaluation["accuracy"] == [(10, pytest.approx(results["accuracy"]))]
    assert evaluation["loss"] == [(10, pytest.approx(results["loss"]))]
    assert "accuracy" in read_scalars(estimator.eval_dir("holdout"))


# -- mixed precision, accumulation, clipping --------------------------------------


def test_bf16_mixed_precision_trains(tmp_path):
    train, evaluate, _, _ = input_fns()
    estimator = make_estimator(tmp_path, mixed_precision="bf16")
    estimator.train(train, max_steps=30)
    assert estimator.evaluate(evaluate)["accuracy"] > 0.8


def _linear_model_fn(model, features, labels, mode):
    logits = model(features["x"])
    loss = F.cross_entropy(logits, labels)
    return te.EstimatorSpec(mode, predictions={"logits": logits}, loss=loss)


def _linear_weights(model_dir, batch_size, accumulation, clip=None):
    x, y = make_classification(128)
    estimator = te.Estimator(
        model_fn=_linear_model_fn,
        model=lambda: nn.Linear(8, 3),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        model_dir=str(model_dir),
        config=te.RunConfig(
            random_seed=1,
            gradient_accumulation_steps=accumulation,
            clip_grad_norm=clip,
            progress_bar=False,
            log_step_count_steps=None,
            save_checkpoints_steps=100,
        ),
    )
    estimator.train(te.numpy_input_fn({"x": x}, y, batch_size=batch_size, num_epochs=None, shuffle=False), max_steps=4)
    return estimator.get_variable_value("weight")


def test_gradient_accumulation_matches_the_larger_batch(tmp_path):
    large = _linear_weights(tmp_path / "large", batch_size=32, accumulation=1)
    accumulated = _linear_weights(tmp_path / "accumulated", batch_size=16, accumulation=2)
    np.testing.assert_allclose(accumulated, large, rtol=1e-5, atol=1e-6)


def test_gradient_clipping_changes_the_update(tmp_path):
    plain = _linear_weights(tmp_path / "plain", batch_size=32, accumulation=1)
    clipped = _linear_weights(tmp_path / "clipped", batch_size=32, accumulation=1, clip=1e-3)
    initial = _linear_weights(tmp_path / "none", batch_size=32, accumulation=1, clip=1e-12)
    assert not np.allclose(plain, clipped)
    # With a tiny norm cap the weights barely move from where a near-zero cap leaves them.
    assert np.abs(clipped - initial).max() < 4 * 1e-3 * 0.1 + 1e-6


def test_train_op_override_runs_instead_of_the_framework_step(tmp_path):
    train, _, _, _ = input_fns()
    calls = []

    def model_fn(model, features, labels, mode):
        spec = classifier_model_fn(model, features, labels, mode)

        def train_op():
            calls.append(1)  # a custom step that deliberately leaves the weights alone

        return te.EstimatorSpec(mode, predictions=spec.predictions, loss=spec.loss, train_op=train_op)

    estimator = make_estimator(tmp_path, model_fn=model_fn)
    estimator.train(train, max_steps=3)
    fresh = make_estimator(tmp_path / "fresh")
    fresh.train(train, max_steps=1)
    assert len(calls) == 3
    assert estimator.latest_checkpoint().endswith("ckpt-3")
