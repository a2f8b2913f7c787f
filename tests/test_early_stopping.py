"""Early-stopping rules: TensorFlow's stop_if_* semantics and the patience form, fed results directly."""

from __future__ import annotations

import pytest

from torchestimator.early_stopping import (
    EarlyStopping,
    stop_if_higher_hook,
    stop_if_lower_hook,
    stop_if_no_decrease_hook,
    stop_if_no_increase_hook,
)


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
    with pytest.raises(ValueError, match=r"'acuracy' is not in the evaluation results at global step 10.*\['accuracy', 'loss'\]"):
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
    from torchestimator import early_stopping as es

    by_keyword = es.stop_if_no_decrease_hook(None, metric_name="loss", max_steps_without_decrease=100, min_steps=10)
    by_position = es.stop_if_no_decrease_hook("loss", 100, min_steps=10)
    assert type(by_keyword) is type(by_position)
    es.stop_if_higher_hook(metric_name="accuracy", threshold=0.9)
    es.stop_if_no_increase_hook("accuracy", max_steps_without_increase=50)
    with pytest.raises(TypeError, match="needs threshold"):
        es.stop_if_lower_hook("loss")
    with pytest.raises(TypeError, match="both by position and by keyword"):
        es.stop_if_lower_hook("loss", 0.1, threshold=0.2)
