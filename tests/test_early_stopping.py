"""Early-stopping rules: TensorFlow's stop_if_* semantics and the patience form, fed results directly; and the one
rule of "better" they share with best-checkpoint keeping and BestExporter."""

from __future__ import annotations

import inspect
import math
import os

import pytest
import torch

from torchestimator._policy.best import BestCheckpointPolicy, best_checkpoint
from torchestimator._policy.early_stopping import (
    EarlyStopping,
    stop_if_higher_hook,
    stop_if_lower_hook,
    stop_if_no_decrease_hook,
    stop_if_no_increase_hook,
)
from torchestimator._policy.improvement import Objective
from torchestimator.checkpoint import CheckpointStore
from torchestimator.export import BestExporter, TensorSpec, read_best_eval, saved_model, serving_input_receiver


def feed(rule, values, metric="loss"):
    """Feeds (step, value) pairs; returns the step at which the rule first says stop (None if never)."""
    for step, value in values:
        rule.observe(step, {metric: value, "global_step": step})
        if rule.should_stop():
            return step
    return None


def test_stop_if_higher_and_lower_respect_threshold_and_min_steps():
    assert feed(stop_if_higher_hook("accuracy", 0.9), [(10, 0.5), (20, 0.95), (30, 0.99)], "accuracy") == 20
    # Strictly higher: equal to the threshold does not stop.
    assert feed(stop_if_higher_hook("accuracy", 0.9), [(10, 0.9)], "accuracy") is None
    assert feed(stop_if_lower_hook("loss", 0.2), [(10, 0.5), (20, 0.1)]) == 20
    # Evaluations before min_steps do not count, even when they pass the threshold.
    assert feed(stop_if_lower_hook("loss", 0.2, min_steps=25), [(10, 0.1), (20, 0.1), (30, 0.3), (40, 0.15)]) == 40


def test_tensorflow_leading_estimator_argument_is_accepted_and_ignored():
    class FakeEstimator:
        model_dir = "/nowhere"

    tf_form = stop_if_no_decrease_hook(FakeEstimator(), "loss", 20, min_steps=5)
    plain = stop_if_no_decrease_hook("loss", 20, min_steps=5)
    values = [(10, 1.0), (20, 0.9), (30, 0.95), (40, 0.92), (50, 0.91)]
    assert feed(tf_form, values) == feed(plain, values) == 40
    assert (tf_form.metric_name, tf_form.max_steps_without_improvement, tf_form.min_steps) == ("loss", 20, 5)


def test_no_decrease_counts_steps_since_the_strictly_best_evaluation():
    # Best at 20 (0.5); 30 ties (not an improvement); 40 is 20 steps after the best.
    assert feed(stop_if_no_decrease_hook("loss", 20), [(10, 0.8), (20, 0.5), (30, 0.5), (40, 0.6)]) == 40
    assert feed(stop_if_no_decrease_hook("loss", 20), [(10, 0.8), (20, 0.5), (30, 0.4), (40, 0.3)]) is None


def test_no_increase_with_min_steps_ignores_early_evaluations():
    values = [(5, 0.99), (10, 0.5), (20, 0.6), (30, 0.6)]
    # Without min_steps the best is step 5 and step 20 is 15 steps later.
    assert feed(stop_if_no_increase_hook("accuracy", 15), values, "accuracy") == 20
    # With min_steps=10 the best is step 20 (0.6 > 0.5); 30 is only 10 steps after it.
    assert feed(stop_if_no_increase_hook("accuracy", 15, min_steps=10), values, "accuracy") is None


def test_run_every_steps_spaces_out_checks():
    rule = stop_if_lower_hook("loss", 0.5, run_every_steps=25)
    assert feed(rule, [(10, 0.9)]) is None  # first check at 10
    rule.observe(20, {"loss": 0.1})
    assert rule.should_stop() is False  # only 10 steps since the last check
    rule.observe(40, {"loss": 0.1})
    assert rule.should_stop() is True


def test_patience_form_counts_evaluations_and_min_delta():
    values = [(1, 1.0), (2, 0.9), (3, 0.95), (4, 0.91), (5, 0.8), (6, 0.85), (7, 0.85)]
    assert feed(EarlyStopping("loss", mode="min", patience=2), values) == 4
    assert feed(EarlyStopping("loss", mode="min", patience=3), values) is None
    # With min_delta 0.15 no step improves on 1.0 enough until 0.8: stops after 2 non-improving evaluations.
    assert feed(EarlyStopping("loss", mode="min", patience=2, min_delta=0.15), values) == 3
    accuracy = [(1, 0.5), (2, 0.6), (3, 0.6), (4, 0.7)]
    assert feed(EarlyStopping("accuracy", mode="max", patience=1), accuracy, "accuracy") == 3
    assert feed(EarlyStopping("accuracy", mode="max", patience=1, min_steps=3), accuracy, "accuracy") is None


def test_missing_metric_lists_available_names():
    rule = stop_if_no_increase_hook("acuracy", 10)
    with pytest.raises(
        ValueError, match=r"'acuracy' is not in the evaluation results at global step 10.*\['accuracy', 'loss'\]"
    ):
        rule.observe(10, {"accuracy": 0.5, "loss": 1.0, "global_step": 10})
    # History read back after a restart may predate the metric: skipped, not an error.
    rule.seed(5, {"loss": 1.0})
    assert rule.should_stop() is False


def test_repeated_step_keeps_latest_value():
    rule = stop_if_lower_hook("loss", 0.5)
    rule.observe(10, {"loss": 0.1})
    rule.observe(10, {"loss": 0.9})
    assert rule.should_stop() is False


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: stop_if_higher_hook("loss", 1.0, run_every_secs=60, run_every_steps=10), "Only one of run_every_secs"),
        (lambda: stop_if_no_increase_hook("loss", 0), "max_steps_without_increase must be an int >= 1"),
        (lambda: stop_if_no_decrease_hook("loss", 5, min_steps=-1), "min_steps must be an int >= 0"),
        (lambda: stop_if_lower_hook("", 1.0), "metric_name must be a non-empty string"),
        (lambda: stop_if_lower_hook("loss", "high"), "threshold must be a number"),
        (lambda: EarlyStopping("loss", mode="lowest"), "mode must be 'min'"),
        (lambda: EarlyStopping("loss", patience=0), "patience must be an int >= 1"),
        (lambda: EarlyStopping("loss", min_delta=-0.1), "min_delta must be a number >= 0"),
    ],
)
def test_bad_arguments_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_wrong_positional_count_is_a_type_error():
    with pytest.raises(TypeError, match="needs threshold"):
        stop_if_higher_hook("loss")
    with pytest.raises(TypeError, match=r"takes \(\[estimator,\] metric_name, threshold\); received 3"):
        stop_if_higher_hook("loss", 0.5, 7)


def test_tensorflow_keyword_call_forms_are_accepted():
    from torchestimator._policy import early_stopping as es

    values = [(10, 1.0), (50, 0.9), (100, 0.95), (160, 0.92)]
    by_keyword = es.stop_if_no_decrease_hook(None, metric_name="loss", max_steps_without_decrease=100, min_steps=10)
    by_position = es.stop_if_no_decrease_hook("loss", 100, min_steps=10)
    assert feed(by_keyword, values) == feed(by_position, values) == 160
    assert feed(es.stop_if_higher_hook(metric_name="accuracy", threshold=0.9), [(1, 0.9), (2, 0.91)], "accuracy") == 2
    increase = es.stop_if_no_increase_hook("accuracy", max_steps_without_increase=50)
    assert feed(increase, [(10, 0.5), (40, 0.4), (60, 0.45)], "accuracy") == 60
    with pytest.raises(TypeError, match="needs threshold"):
        es.stop_if_lower_hook("loss")
    with pytest.raises(TypeError, match="both by position and by keyword"):
        es.stop_if_lower_hook("loss", 0.1, threshold=0.2)
    with pytest.raises(TypeError, match=r"stop_if_lower_hook: .*unexpected keyword argument 'min_step'"):
        es.stop_if_lower_hook("loss", 0.1, min_step=5)
    parameters = inspect.signature(es.stop_if_no_increase_hook).parameters
    assert list(parameters)[1:3] == ["metric_name", "max_steps_without_increase"]  # what help() shows


def test_nan_never_improves_and_a_nan_first_value_is_beaten_by_any_number():
    nan = math.nan
    # All NaN: the first evaluation is the baseline, so the steps without improvement count from it.
    assert feed(stop_if_no_decrease_hook("loss", 20), [(10, nan), (20, nan), (30, nan)]) == 30
    # 0.5 beats the NaN baseline at step 20; 40 is 20 steps after it.
    assert feed(stop_if_no_decrease_hook("loss", 20), [(10, nan), (20, 0.5), (30, 0.6), (40, 0.55)]) == 40
    assert feed(stop_if_lower_hook("loss", 0.2), [(10, nan), (20, 0.1)]) == 20  # NaN is not below any threshold
    assert feed(stop_if_higher_hook("loss", 0.2), [(10, nan)]) is None
    assert feed(EarlyStopping("loss", patience=2), [(1, 1.0), (2, nan), (3, nan)]) == 3


# -- one rule of "better" for best checkpoints, BestExporter and early stopping ------------------------


@pytest.mark.parametrize(
    ("values", "best_step"),
    [
        ([(10, 0.5), (20, 0.5), (30, 0.7)], 10),  # a tie keeps the earlier step
        ([(10, 0.5), (15, math.nan), (30, 0.4), (40, 0.45)], 30),  # NaN is never better
        ([(10, math.nan), (20, 0.9), (30, 0.9)], 20),  # any number beats a NaN best
    ],
)
def test_best_checkpoint_best_exporter_and_early_stopping_agree_on_the_best(tmp_path, monkeypatch, values, best_step):
    store = CheckpointStore(str(tmp_path / "model"))
    policy = BestCheckpointPolicy("loss", higher_is_better=False)
    for step, value in values:
        store.save(step, {"w": torch.full((1,), float(step))})
        policy.update(store, step, {"loss": value})
    assert best_checkpoint(store) == os.path.join(store.model_dir, f"ckpt-{best_step}")
    assert store.manifest["best"] == [best_step]

    def fake_export(estimator, base, receiver, checkpoint_path=None, assets_extra=None):
        os.makedirs(os.path.join(base, checkpoint_path))  # the comparison is under test, not the writing
        return os.path.join(base, checkpoint_path)

    monkeypatch.setattr(saved_model, "export_saved_model", fake_export)
    exporter = BestExporter(serving_input_receiver=serving_input_receiver({"x": TensorSpec(shape=(None, 1))}))
    for step, value in values:
        exporter.export(None, str(tmp_path / "export"), f"ckpt-{step}", {"loss": value}, False)
    assert read_best_eval(tmp_path / "export")["checkpoint_path"] == f"ckpt-{best_step}"

    # The rule counts steps without improvement from the best step: it stops at the last step when allowed
    # exactly last - best steps, and never when allowed one more.
    last = values[-1][0]
    assert feed(stop_if_no_decrease_hook("loss", last - best_step), values) == last
    assert feed(stop_if_no_decrease_hook("loss", last - best_step + 1), values) is None


def test_objective_is_checked_when_built_and_names_the_field():
    with pytest.raises(ValueError, match="metric_name must be a non-empty string"):
        Objective(metric_name="", higher_is_better=True)
    with pytest.raises(TypeError, match="higher_is_better must be True or False; received 'yes'"):
        Objective(metric_name="loss", higher_is_better="yes")
    with pytest.raises(ValueError, match="min_delta must be a number >= 0; received nan"):
        Objective(metric_name="loss", higher_is_better=False, min_delta=math.nan)
    with pytest.raises(ValueError, match="mode must be 'min'"):
        Objective.from_mode("loss", "lowest")
    assert Objective.from_mode("accuracy", "max", 0.1) == Objective(
        metric_name="accuracy", higher_is_better=True, min_delta=0.1
    )
    with pytest.raises(
        ValueError,
        match=r"Early stopping metric 'loss' must be a number; in the evaluation results "
        r"at global step 3 it is 'low'",
    ):
        stop_if_lower_hook("loss", 0.5).observe(3, {"loss": "low"})
