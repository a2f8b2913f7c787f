"""The training loop's cheaper per-step path (issue 14) keeps every behaviour: hooks fire at their steps, the spec
is still checked at every step (in full at step one and whenever it changes), summaries land at their steps, NaN
stops at its step, and a hook's stop request is honoured with one replica."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te
from torchestimator._core.spec import TrainSpecCheck
from torchestimator._io.summary import read_scalars


def _batches(count: int = 40):
    generator = torch.Generator().manual_seed(0)
    return [
        ({"x": torch.randn(4, 3, generator=generator)}, torch.randint(0, 2, (4,), generator=generator))
        for _ in range(count)
    ]


def _config(**changes):
    settings = dict(
        random_seed=0,
        save_checkpoints_steps=None,
        save_checkpoints_secs=None,
        save_summary_steps=None,
        log_step_count_steps=None,
        progress_bar=False,
        device="cpu",
    )
    return te.RunConfig(**(settings | changes))


def _estimator(tmp_path, model_fn, **config):
    return te.Estimator(
        model_fn=model_fn,
        model=lambda: nn.Linear(3, 2),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        model_dir=str(tmp_path / "model"),
        config=_config(**config),
    )


def _model_fn(model, features, labels, mode):
    return te.EstimatorSpec(mode, loss=F.cross_entropy(model(features["x"]), labels))


class _Steps(te.Hook):
    """Records the global step seen by before_step and after_step."""

    def __init__(self) -> None:
        self.before: list[int] = []
        self.after: list[int] = []

    def before_step(self, run_context):
        self.before.append(run_context.global_step)

    def after_step(self, run_context):
        self.after.append(run_context.global_step)


class _EverySeven(te.Hook):
    def __init__(self) -> None:
        self.fired: list[tuple[int, float]] = []

    def after_step(self, run_context):
        if run_context.global_step % 7 == 0:
            self.fired.append((run_context.global_step, run_context.loss))


def test_a_hook_due_at_step_seven_fires_at_step_seven_with_that_steps_loss(tmp_path):
    every_seven, steps = _EverySeven(), _Steps()
    _estimator(tmp_path, _model_fn).train(lambda: iter(_batches()), hooks=[every_seven, steps], max_steps=21)
    assert [step for step, _ in every_seven.fired] == [7, 14, 21]
    assert all(isinstance(loss, float) and loss > 0 for _, loss in every_seven.fired)
    assert steps.before == list(range(0, 21)) and steps.after == list(range(1, 22))


def test_hooks_from_the_first_spec_join_the_per_step_dispatch(tmp_path):
    spec_hook = _Steps()

    def model_fn(model, features, labels, mode):
        return te.EstimatorSpec(mode, loss=F.cross_entropy(model(features["x"]), labels), training_hooks=[spec_hook])

    _estimator(tmp_path, model_fn).train(lambda: iter(_batches()), max_steps=5)
    assert spec_hook.after == [1, 2, 3, 4, 5]  # its after_step already at step one
    assert spec_hook.before == [1, 2, 3, 4]  # joined after step one's before_step


def _turning_bad_at_step_three(bad):
    calls = []

    def model_fn(model, features, labels, mode):
        calls.append(1)
        loss = F.cross_entropy(model(features["x"]), labels)
        return bad(mode, loss) if len(calls) == 3 else te.EstimatorSpec(mode, loss=loss)

    return model_fn, calls


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (lambda mode, loss: te.EstimatorSpec(mode, loss=loss.expand(2)), ValueError, "must be a scalar"),
        (lambda mode, loss: te.EstimatorSpec(mode, loss=loss.round().long()), TypeError, "floating-point"),
        (lambda mode, loss: te.EstimatorSpec(mode, loss=float(loss.detach())), TypeError, "must be a scalar tensor"),
        (lambda mode, loss: te.EstimatorSpec(mode), ValueError, "loss is required"),
        (lambda mode, loss: {"loss": loss}, TypeError, "must return an EstimatorSpec"),
        (
            lambda mode, loss: te.EstimatorSpec(te.ModeKeys.EVAL, loss=loss),
            ValueError,
            "returned an EstimatorSpec for mode",
        ),
        (lambda mode, loss: te.EstimatorSpec(mode, loss=loss, train_op="step"), TypeError, "train_op must be"),
    ],
)
def test_a_spec_that_turns_bad_at_step_three_raises_at_step_three(tmp_path, bad, error, message):
    model_fn, calls = _turning_bad_at_step_three(bad)
    with pytest.raises(error, match=message):
        _estimator(tmp_path, model_fn).train(lambda: iter(_batches()), max_steps=10)
    assert len(calls) == 3


def test_a_spec_whose_loss_changes_shape_but_stays_valid_still_trains(tmp_path):
    calls = []

    def model_fn(model, features, labels, mode):
        calls.append(1)
        loss = F.cross_entropy(model(features["x"]), labels)
        return te.EstimatorSpec(mode, loss=loss.reshape(1) if len(calls) % 2 else loss.double())

    estimator = _estimator(tmp_path, model_fn)
    estimator.train(lambda: iter(_batches()), max_steps=6)
    assert len(calls) == 6


def test_spec_check_passes_the_same_shape_by_identity_and_checks_any_change_in_full():
    check = TrainSpecCheck()
    first = te.EstimatorSpec(te.ModeKeys.TRAIN, loss=torch.tensor(1.0))
    assert check(first) is first
    assert check(te.EstimatorSpec(te.ModeKeys.TRAIN, loss=torch.tensor(2.0))).loss.item() == 2.0
    with pytest.raises(TypeError, match="floating-point"):
        check(te.EstimatorSpec(te.ModeKeys.TRAIN, loss=torch.tensor(2)))
    with pytest.raises(ValueError, match="must be a scalar"):
        check(te.EstimatorSpec(te.ModeKeys.TRAIN, loss=torch.zeros(3)))


def test_nan_at_step_five_stops_at_step_five(tmp_path):
    calls = []

    def model_fn(model, features, labels, mode):
        calls.append(1)
        loss = F.cross_entropy(model(features["x"]), labels)
        return te.EstimatorSpec(mode, loss=loss * float("nan") if len(calls) == 5 else loss)

    with pytest.raises(te.NanLossDuringTrainingError, match="at step 5"):
        _estimator(tmp_path, model_fn).train(lambda: iter(_batches()), max_steps=10)
    assert len(calls) == 5


def test_summaries_are_written_at_their_steps(tmp_path):
    estimator = _estimator(tmp_path, _model_fn, save_summary_steps=3)
    estimator.train(lambda: iter(_batches()), max_steps=9)
    scalars = read_scalars(str(tmp_path / "model"))
    assert [step for step, _ in scalars["loss"]] == [3, 6, 9]
    assert [step for step, _ in scalars["learning_rate"]] == [3, 6, 9]


def test_a_stop_request_with_one_replica_stops_at_that_step(tmp_path):
    class StopAtFour(te.Hook):
        def after_step(self, run_context):
            if run_context.global_step == 4:
                run_context.request_stop()

    steps = _Steps()
    _estimator(tmp_path, _model_fn).train(lambda: iter(_batches()), hooks=[StopAtFour(), steps], max_steps=10)
    assert steps.after == [1, 2, 3, 4]


def test_estimator_spec_stays_a_frozen_dataclass():
    spec = te.EstimatorSpec(te.ModeKeys.TRAIN, loss=torch.tensor(1.0), training_hooks=[_Steps()])
    assert isinstance(spec.training_hooks, tuple) and len(spec.training_hooks) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.loss = torch.tensor(2.0)
    changed = dataclasses.replace(spec, mode=te.ModeKeys.EVAL)
    assert changed.mode == te.ModeKeys.EVAL and changed.loss is spec.loss
    assert te.EstimatorSpec(te.ModeKeys.PREDICT, predictions=None) == te.EstimatorSpec(te.ModeKeys.PREDICT)
    assert [field.name for field in dataclasses.fields(spec)][:3] == ["mode", "predictions", "loss"]
    with pytest.raises(ValueError, match="mode must be one of"):
        te.EstimatorSpec("training")
    with pytest.raises(TypeError, match="iterable of hooks"):
        te.EstimatorSpec(te.ModeKeys.TRAIN, evaluation_hooks=3)


def test_model_fn_gets_its_arguments_by_name_on_both_call_paths(tmp_path):
    seen = []

    def all_four(model, features, labels, mode):
        seen.append(("all", type(model).__name__, features["x"].shape[0], labels.shape[0], mode))
        return _model_fn(model, features, labels, mode)

    def with_params(features, labels, mode, params, model):
        seen.append(("params", params["p"], mode))
        return _model_fn(model, features, labels, mode)

    _estimator(tmp_path / "a", all_four).train(lambda: iter(_batches()), max_steps=1)
    te.Estimator(
        model_fn=with_params,
        model=lambda: nn.Linear(3, 2),
        params={"p": 7},
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        model_dir=str(tmp_path / "b"),
        config=_config(),
    ).train(lambda: iter(_batches()), max_steps=1)
    assert seen == [("all", "Linear", 4, 4, te.ModeKeys.TRAIN), ("params", 7, te.ModeKeys.TRAIN)]


def test_the_loss_is_read_without_gradient_warnings_and_the_final_loss_is_the_last_steps(tmp_path):
    class LastLoss(te.Hook):
        def after_step(self, run_context):
            self.loss = run_context.loss

    last = LastLoss()
    estimator = _estimator(tmp_path, _model_fn, save_summary_steps=2, log_step_count_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float() of a tensor that requires grad warns
        estimator.train(lambda: iter(_batches()), hooks=[last], max_steps=5)
    assert read_scalars(str(tmp_path / "model"))["loss"][-1][0] == 4
    assert isinstance(last.loss, float) and last.loss > 0


def test_the_final_loss_without_a_hook_reading_it(tmp_path, caplog):
    estimator = _estimator(tmp_path, _model_fn)
    with warnings.catch_warnings(), caplog.at_level("INFO", logger="torchestimator"):
        warnings.simplefilter("error")
        estimator.train(lambda: iter(_batches()), max_steps=3)
    final = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Loss for final step")]
    assert len(final) == 1 and float(final[0].split(": ")[1].rstrip(".")) > 0


def test_a_model_fn_taking_the_four_arguments_in_order_is_called_itself(tmp_path):
    def in_order(model, features, labels, mode):
        return _model_fn(model, features, labels, mode)

    def other_order(features, labels, mode, model):
        return ("other", type(model).__name__, features, labels, mode)

    def keyword_mode(model, features, labels, *, mode):
        return ("keyword", type(model).__name__, features, labels, mode)

    # The bundle's caller is the loops' (both come from calling.model_fn_caller).
    assert _estimator(tmp_path / "a", in_order).inference_bundle().call_model_fn is in_order
    for model_fn, tag in ((other_order, "other"), (keyword_mode, "keyword")):
        caller = _estimator(tmp_path / tag, model_fn).inference_bundle().call_model_fn
        assert caller is not model_fn  # called by name: positionally the values would land in the wrong places
        assert caller(nn.Linear(1, 1), "f", "l", te.ModeKeys.TRAIN) == (tag, "Linear", "f", "l", te.ModeKeys.TRAIN)


def test_takes_in_order_only_for_exactly_those_positional_parameters():
    from torchestimator._core.calling import takes_in_order

    names = ["model", "features", "labels", "mode"]
    assert takes_in_order(lambda model, features, labels, mode=None: None, names)
    assert not takes_in_order(lambda model, features, labels, mode, *rest: None, names)
    assert not takes_in_order(lambda model, features, labels, mode, **rest: None, names)
    assert not takes_in_order(lambda model, labels, features, mode: None, names)
    assert not takes_in_order(print, names)  # a builtin whose signature inspect may not read


def test_a_decorated_model_fn_forwarding_keywords_is_called_by_name(tmp_path):
    """functools.wraps shows the inner function's (model, features, labels, mode); the wrapper takes keywords."""
    import functools

    def forwarding_keywords(function):
        @functools.wraps(function)
        def wrapper(**arguments):
            assert arguments["mode"] in (te.ModeKeys.TRAIN, te.ModeKeys.EVAL)
            return function(**arguments)

        return wrapper

    decorated = forwarding_keywords(_model_fn)
    estimator = _estimator(tmp_path, decorated)
    estimator.train(lambda: iter(_batches(10)), max_steps=10)
    assert estimator.evaluate(lambda: iter(_batches(3)))["global_step"] == 10
    assert estimator.inference_bundle().call_model_fn is not decorated

    from torchestimator._core.calling import takes_in_order

    class Declared:
        __signature__ = inspect.signature(_model_fn)

        def __call__(self, **arguments):
            return arguments

    assert not takes_in_order(Declared(), ["model", "features", "labels", "mode"])


def _recording_progress(monkeypatch):
    from torchestimator._core.progress import Progress

    positions = []
    update = Progress.update
    monkeypatch.setattr(
        Progress, "update", lambda self, position, loss=None: (positions.append(position), update(self, position, loss))
    )
    return positions


def test_the_progress_bar_updates_at_every_step_when_shown_and_is_not_asked_when_off(tmp_path, monkeypatch):
    positions = _recording_progress(monkeypatch)
    _estimator(tmp_path / "shown", _model_fn, progress_bar=True).train(lambda: iter(_batches()), max_steps=4)
    assert positions == [1, 2, 3, 4]
    positions.clear()
    _estimator(tmp_path / "off", _model_fn).train(lambda: iter(_batches()), max_steps=4)
    assert positions == []


def test_with_logging_only_the_loss_is_logged_at_its_steps(tmp_path, caplog):
    with caplog.at_level("INFO", logger="torchestimator"):
        _estimator(tmp_path, _model_fn, log_step_count_steps=3).train(lambda: iter(_batches()), max_steps=7)
    logged = [record.getMessage() for record in caplog.records if record.getMessage().startswith("loss = ")]
    assert [int(message.rsplit("step = ", 1)[1].split()[0].rstrip(",(")) for message in logged] == [3, 6]


@pytest.mark.parametrize("every_n_iter, steps_logged", [(None, [10]), (4, [4, 8, 10])])
def test_logging_tensor_hook_at_end_logs_the_final_steps_values(tmp_path, caplog, every_n_iter, steps_logged):
    """As tf.estimator's: at_end logs the last step's values, alone or after the every-N lines."""
    import logging
    import re

    hook = te.LoggingTensorHook(("step", "loss"), every_n_iter=every_n_iter, at_end=True)
    with caplog.at_level(logging.INFO, logger="torchestimator"):
        _estimator(tmp_path, _model_fn).train(lambda: iter(_batches(10)), max_steps=10, hooks=[hook])
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("step = ")]
    assert [int(re.match(r"step = (\d+), loss = ", line).group(1)) for line in lines] == steps_logged, lines
