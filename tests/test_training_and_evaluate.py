"""train_and_evaluate: specs, evaluation points, several eval sets, exporters, early stopping,
the best checkpoint kept across restarts, the evaluator process, and two replicas stopping together."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import SmallNet, adam, input_fns, make_classification, make_estimator

import torchestimator as te
import torchestimator._policy.best as best_module
from torchestimator._io.summary import read_scalars
from torchestimator._policy.best import BEST_FILE, BestCheckpointPolicy, best_checkpoint, read_best
from torchestimator._policy.early_stopping import EarlyStopping, stop_if_higher_hook, stop_if_no_decrease_hook
from torchestimator._policy.train_and_evaluate import EvalSpec, TrainSpec, run_evaluator, train_and_evaluate
from torchestimator.testing import run_in_processes


def scored_model_fn(model, features, labels, mode):
    """The classifier, plus a `score` metric equal to the eval input's `score` column (a metric tests control)."""
    logits = model(features["x"])
    predictions = {"class": logits.argmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    metrics = {"accuracy": te.metrics.accuracy(labels, predictions["class"])}
    if "score" in features:
        metrics["score"] = te.metrics.mean(features["score"])
    return te.EstimatorSpec(
        mode, predictions=predictions, loss=F.cross_entropy(logits, labels), eval_metric_ops=metrics
    )


def scored_eval_input(score, n=64, seed=1):
    x, y = make_classification(n, seed=seed)
    return te.numpy_input_fn(
        {"x": x, "score": np.full(n, score, np.float32)}, y, batch_size=32, num_epochs=1, shuffle=False
    )


def estimator(model_dir, **config):
    return make_estimator(model_dir, model_fn=scored_model_fn, **config)


class FakeExporter:
    """The Exporter interface of torchestimator.export, recording its calls."""

    def __init__(self, name="fake"):
        self.name = name
        self.calls = []

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        self.calls.append(
            {
                "export_path": export_path,
                "checkpoint_path": checkpoint_path,
                "step": eval_result["global_step"],
                "final": is_the_final_export,
            }
        )
        return f"{export_path}/{eval_result['global_step']}"


def eval_steps(model_dir, name=None, tag="loss"):
    return [step for step, _ in read_scalars(os.path.join(model_dir, f"eval_{name}" if name else "eval")).get(tag, [])]


# -- specs ---------------------------------------------------------------------------------


def test_spec_defaults_follow_tensorflow():
    train, evaluate, _, _ = input_fns()
    spec = EvalSpec(evaluate)
    assert (spec.steps, spec.name, spec.start_delay_secs, spec.throttle_secs, spec.every_n_steps) == (
        100,
        None,
        120,
        600,
        None,
    )
    assert TrainSpec(train).max_steps is None
    exporter = FakeExporter()
    assert EvalSpec(evaluate, exporters=exporter).exporters == (exporter,)  # a single exporter is accepted


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda f: TrainSpec(f, max_steps=0), ValueError, "max_steps must be a positive int"),
        (lambda f: TrainSpec(f, hooks=[object()]), TypeError, "hooks must be te.Hook"),
        (lambda f: TrainSpec(f, saving_listeners=[te.Hook()]), TypeError, "saving_listeners must be"),
        (lambda f: TrainSpec("data.csv"), TypeError, "input_fn must be callable"),
        (lambda f: EvalSpec(f, steps=0), ValueError, "steps must be a positive int"),
        (lambda f: EvalSpec(f, name=""), TypeError, "name must be a non-empty string"),
        (lambda f: EvalSpec(f, throttle_secs=-1), ValueError, "throttle_secs must be a number of seconds >= 0"),
        (lambda f: EvalSpec(f, start_delay_secs=-1), ValueError, "start_delay_secs"),
        (lambda f: EvalSpec(f, every_n_steps=0), ValueError, "every_n_steps must be a positive int"),
        (
            lambda f: EvalSpec(f, exporters=[FakeExporter("a"), FakeExporter("a")]),
            ValueError,
            "'a' appears more than once",
        ),
        (lambda f: EvalSpec(f, exporters=[FakeExporter("")]), ValueError, "name must be a non-empty string"),
        (lambda f: EvalSpec(f, exporters=[object()]), TypeError, "export\\(...\\) method"),
    ],
)
def test_spec_validation(make, error, message):
    train, _, _, _ = input_fns()
    with pytest.raises(error, match=message):
        make(train)


def test_argument_errors(tmp_path):
    train, evaluate, _, _ = input_fns()
    est = estimator(tmp_path)
    with pytest.raises(ValueError, match="its own name"):
        train_and_evaluate(
            est, TrainSpec(train, max_steps=5), [EvalSpec(evaluate, name="a"), EvalSpec(evaluate, name="a")]
        )
    with pytest.raises(ValueError, match="unique across EvalSpecs"):
        train_and_evaluate(
            est,
            TrainSpec(train, max_steps=5),
            [
                EvalSpec(evaluate, name="a", exporters=FakeExporter()),
                EvalSpec(evaluate, name="b", exporters=FakeExporter()),
            ],
        )
    with pytest.raises(TypeError, match="train_spec must be a te.TrainSpec"):
        train_and_evaluate(est, train, EvalSpec(evaluate))
    with pytest.raises(TypeError, match="early_stopping takes rules"):
        train_and_evaluate(est, TrainSpec(train, max_steps=5), EvalSpec(evaluate), early_stopping=[object()])
    assert est.latest_checkpoint() is None  # refused before any training


# -- when evaluations happen ------------------------------------------------------------------


def test_several_eval_specs_write_separate_eval_dirs_with_their_own_metrics(tmp_path):
    train, _, _, _ = input_fns()
    est = estimator(tmp_path)
    specs = [
        EvalSpec(scored_eval_input(0.25), name="validation", throttle_secs=0),
        EvalSpec(scored_eval_input(0.75, seed=2), name="test", throttle_secs=0),
    ]
    results, exports = train_and_evaluate(est, TrainSpec(train, max_steps=20), specs)
    assert set(results) == {"validation", "test"} and exports == {"validation": [], "test": []}
    assert results["validation"]["score"] == pytest.approx(0.25) and results["test"]["score"] == pytest.approx(0.75)
    validation = read_scalars(tmp_path / "eval_validation")
    test = read_scalars(tmp_path / "eval_test")
    assert validation["score"] == [(10, 0.25), (20, 0.25)]
    assert test["score"] == [(10, 0.75), (20, 0.75)]
    assert test["loss"][-1][1] == pytest.approx(results["test"]["loss"])
    assert not (tmp_path / "eval").exists()


def test_throttle_secs_zero_evaluates_each_checkpoint_and_large_only_first_and_final(tmp_path):
    train, evaluate, _, _ = input_fns()
    train_and_evaluate(
        estimator(tmp_path / "each"), TrainSpec(train, max_steps=40), EvalSpec(evaluate, throttle_secs=0)
    )
    assert eval_steps(tmp_path / "each") == [10, 20, 30, 40]
    train_and_evaluate(
        estimator(tmp_path / "throttled"), TrainSpec(train, max_steps=40), EvalSpec(evaluate, throttle_secs=10_000)
    )
    assert eval_steps(tmp_path / "throttled") == [10, 40]  # the first checkpoint, then the final evaluation


def test_throttle_uses_the_injected_clock(tmp_path):
    train, evaluate, _, _ = input_fns()
    ticks = iter(range(0, 10_000, 6))  # each checkpoint is 6 "seconds" after the previous
    train_and_evaluate(
        estimator(tmp_path),
        TrainSpec(train, max_steps=50),
        EvalSpec(evaluate, throttle_secs=10),
        clock=lambda: next(ticks),
    )
    assert eval_steps(tmp_path) == [10, 30, 50]  # 0 -> 12 -> 24 seconds at checkpoints 10, 30, 50


def test_every_n_steps_evaluates_between_checkpoints_and_training_is_unchanged(tmp_path):
    train, evaluate, _, _ = input_fns()
    exporter = FakeExporter()
    est = estimator(tmp_path / "chunked")
    results, exports = train_and_evaluate(
        est, TrainSpec(train, max_steps=20), EvalSpec(evaluate, every_n_steps=7, exporters=exporter)
    )
    assert eval_steps(tmp_path / "chunked") == [7, 14, 20]
    assert [call["step"] for call in exporter.calls] == [7, 14, 20]
    assert [call["final"] for call in exporter.calls] == [False, False, True]
    assert exporter.calls[0]["export_path"] == os.path.join(est.model_dir, "export", "fake")
    assert exporter.calls[0]["checkpoint_path"].endswith("ckpt-7")
    assert results["global_step"] == 20 and exports == [os.path.join(est.model_dir, "export", "fake", "20")]
    # Pausing to evaluate resumes optimizer, RNG and input exactly: same weights as one train call.
    straight = estimator(tmp_path / "straight")
    straight.train(train, max_steps=20)
    for name in straight.get_variable_names():
        np.testing.assert_array_equal(est.get_variable_value(name), straight.get_variable_value(name))


def test_final_evaluation_when_the_input_ends(tmp_path):
    x, y = make_classification(80)
    finite = te.numpy_input_fn({"x": x}, y, batch_size=8, num_epochs=2, shuffle=False)  # 20 steps
    exporter = FakeExporter()
    results, _ = train_and_evaluate(
        estimator(tmp_path),
        TrainSpec(finite),
        EvalSpec(scored_eval_input(0.5), throttle_secs=10_000, exporters=exporter),
    )
    assert results["global_step"] == 20
    assert eval_steps(tmp_path) == [10, 20]
    assert exporter.calls[-1]["final"] is True and exporter.calls[0]["final"] is False


def test_without_checkpoints_one_final_evaluation_of_the_trained_weights(tmp_path):
    train, evaluate, _, _ = input_fns()
    est = estimator(tmp_path, save_checkpoints_steps=None)
    results, _ = train_and_evaluate(est, TrainSpec(train, max_steps=12), EvalSpec(evaluate, throttle_secs=0))
    assert results["global_step"] == 12 and est.latest_checkpoint() is None
    with pytest.raises(ValueError, match="needs checkpoints"):
        train_and_evaluate(
            estimator(tmp_path / "other", save_checkpoints_steps=None),
            TrainSpec(train, max_steps=12),
            EvalSpec(evaluate, every_n_steps=5),
        )


# -- early stopping -------------------------------------------------------------------------------


def test_early_stopping_stops_training_and_flags_the_final_export(tmp_path):
    train, _, _, _ = input_fns()
    exporter = FakeExporter()
    est = estimator(tmp_path)
    rule = stop_if_no_decrease_hook("score", 10)  # a constant score never decreases
    results, _ = train_and_evaluate(
        est,
        TrainSpec(train, max_steps=100),
        EvalSpec(scored_eval_input(0.5), every_n_steps=5, exporters=exporter),
        early_stopping=rule,
    )
    assert results["global_step"] == 15  # best at 5, 15 - 5 >= 10
    assert est.latest_checkpoint().endswith("ckpt-15")
    assert [(call["step"], call["final"]) for call in exporter.calls] == [(5, False), (10, False), (15, True)]


def test_early_stopping_patience_and_threshold_rules_together(tmp_path):
    train, evaluate, _, _ = input_fns()
    est = estimator(tmp_path)
    results, _ = train_and_evaluate(
        est,
        TrainSpec(train, max_steps=200),
        EvalSpec(evaluate, throttle_secs=0),
        early_stopping=[EarlyStopping("loss", patience=50), stop_if_higher_hook("accuracy", 0.9)],
    )
    assert results["accuracy"] > 0.9 and results["global_step"] < 200
    assert eval_steps(tmp_path)[-1] == results["global_step"]


def test_early_stopping_sees_evaluations_of_an_earlier_run(tmp_path):
    train, _, _, _ = input_fns()
    spec = EvalSpec(scored_eval_input(0.5), every_n_steps=5)
    train_and_evaluate(estimator(tmp_path), TrainSpec(train, max_steps=10), spec)  # evaluations at 5 and 10
    results, _ = train_and_evaluate(
        estimator(tmp_path), TrainSpec(train, max_steps=100), spec, early_stopping=stop_if_no_decrease_hook("score", 10)
    )
    assert results["global_step"] == 15  # the best is still step 5 of the first run


def test_a_rerun_after_early_stopping_takes_no_step_and_says_why(tmp_path, caplog):
    """The rules, seeded with the earlier run's evaluations, are asked before step one: a run that early stopping
    ended stays at its step (TF's stop hook took one more step), the final evaluation still runs, and the
    summary line says training was skipped and why."""
    train, _, _, _ = input_fns()
    spec = EvalSpec(scored_eval_input(0.5), every_n_steps=5)
    rule = lambda: stop_if_no_decrease_hook("score", 10)  # noqa: E731 - a fresh rule per run, as a rerun builds
    first, _ = train_and_evaluate(estimator(tmp_path), TrainSpec(train, max_steps=100), spec, early_stopping=rule())
    assert first["global_step"] == 15
    checkpoints = sorted(os.listdir(tmp_path))
    with caplog.at_level("INFO", logger="torchestimator"):
        again, _ = train_and_evaluate(estimator(tmp_path), TrainSpec(train, max_steps=100), spec, early_stopping=rule())
    assert again["global_step"] == 15 and again["score"] == pytest.approx(0.5)
    assert sorted(os.listdir(tmp_path)) == checkpoints  # no new checkpoint: not one step was taken
    messages = [record.getMessage() for record in caplog.records]
    assert any(
        message.startswith(
            f"skipped training: {tmp_path} stays at step 15: early stopping stopped it in an "
            "earlier run (stop_if_no_decrease('score', 10))"
        )
        for message in messages
    ), messages
    assert not any("Training made no steps" in message for message in messages)
    # Without the rule the same model_dir trains on: the skip is the rule's decision, not the model_dir's.
    onward, _ = train_and_evaluate(estimator(tmp_path), TrainSpec(train, max_steps=20), spec)
    assert onward["global_step"] == 20


def test_missing_metric_fails_at_the_first_evaluation_listing_names(tmp_path):
    train, evaluate, _, _ = input_fns()
    est = estimator(tmp_path)
    with pytest.raises(
        ValueError, match=r"'auc' is not in the evaluation results at global step 10.*\['accuracy', 'loss'\]"
    ):
        train_and_evaluate(
            est,
            TrainSpec(train, max_steps=50),
            EvalSpec(evaluate, throttle_secs=0),
            early_stopping=stop_if_higher_hook("auc", 0.9),
        )
    assert est.latest_checkpoint().endswith("ckpt-10")
    with pytest.raises(ValueError, match=r"Best-checkpoint metric 'acc' is not in .*\['accuracy', 'loss'\]"):
        train_and_evaluate(
            estimator(tmp_path / "best"),
            TrainSpec(train, max_steps=50),
            EvalSpec(evaluate, throttle_secs=0),
            best=BestCheckpointPolicy("acc", higher_is_better=True),
        )


# -- the best checkpoint --------------------------------------------------------------------------


def test_best_checkpoint_survives_restart_and_is_protected_from_retention(tmp_path):
    train, _, _, _ = input_fns()
    policy = BestCheckpointPolicy("score", higher_is_better=False)
    first = estimator(tmp_path, keep_checkpoint_max=1)
    train_and_evaluate(
        first, TrainSpec(train, max_steps=20), EvalSpec(scored_eval_input(0.2), throttle_secs=0), best=policy
    )
    assert best_checkpoint(first.checkpoint_store).endswith("ckpt-10")  # ties keep the earlier step
    # A new estimator and policy (as a new process) compare against the record, not the first result they see.
    second = estimator(tmp_path, keep_checkpoint_max=1)
    train_and_evaluate(
        second,
        TrainSpec(train, max_steps=40),
        EvalSpec(scored_eval_input(0.6), throttle_secs=0),
        best=BestCheckpointPolicy("score", higher_is_better=False),
    )
    assert best_checkpoint(second.checkpoint_store).endswith("ckpt-10")
    assert [(record.step, record.value) for record in read_best(tmp_path)] == [(10, pytest.approx(0.2))]
    assert second._store.manifest["best"] == [10]
    assert sorted(os.listdir(tmp_path / "ckpt-10")) and {e["step"] for e in second._store.history()} == {10, 40}
    # A better result later replaces it and releases the old one to retention.
    third = estimator(tmp_path, keep_checkpoint_max=1)
    train_and_evaluate(
        third,
        TrainSpec(train, max_steps=60),
        EvalSpec(scored_eval_input(0.1), throttle_secs=10_000),
        best=BestCheckpointPolicy("score", higher_is_better=False),
    )
    assert best_checkpoint(third.checkpoint_store).endswith("ckpt-50")
    third.train(train, max_steps=70)
    assert {e["step"] for e in third._store.history()} == {50, 70}


def test_best_policy_keeps_several_and_records_atomically(tmp_path):
    train, _, _, _ = input_fns()
    est = estimator(tmp_path, keep_checkpoint_max=1)
    est.train(train, max_steps=30)
    est.train(train, max_steps=40)
    policy = BestCheckpointPolicy("accuracy", higher_is_better=True, keep=2)
    with pytest.raises(ValueError, match="no checkpoint of that step"):
        policy.update(est.checkpoint_store, 30, {"accuracy": 0.9})
    est._store.save(30, {"w": torch.zeros(1)})  # a checkpoint to rank (retention would otherwise have removed it)
    assert policy.update(est.checkpoint_store, 30, {"accuracy": 0.8}) is True
    assert policy.update(est.checkpoint_store, 40, {"accuracy": 0.7}) is True
    est._store.save(50, {"w": torch.zeros(1)})
    assert policy.update(est.checkpoint_store, 50, {"accuracy": 0.9}) is True  # pushes out 40
    assert [record.step for record in read_best(tmp_path)] == [50, 30]
    assert est._store.manifest["best"] == [30, 50]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".best-")]  # no temporary file left
    document = json.loads((tmp_path / BEST_FILE).read_text())
    assert document["metric_name"] == "accuracy" and document["higher_is_better"] is True
    # A policy on another metric does not compare against this record.
    assert BestCheckpointPolicy("loss").update(est.checkpoint_store, 50, {"loss": 3.0}) is True
    assert [record.step for record in read_best(tmp_path)] == [50]


def test_best_policy_argument_errors():
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        BestCheckpointPolicy(keep=0)
    with pytest.raises(TypeError, match="higher_is_better must be True or False"):
        BestCheckpointPolicy("accuracy", "yes")


def test_best_checkpoint_is_none_without_a_record(tmp_path):
    assert best_checkpoint(estimator(tmp_path).checkpoint_store) is None


# -- the evaluator process ------------------------------------------------------------------------


def test_evaluator_follows_a_training_run_and_evaluates_each_checkpoint_once(tmp_path):
    train, evaluate, _, _ = input_fns()
    trainer = estimator(tmp_path)
    exporter = FakeExporter()
    failures = []

    def train_in_background():
        try:
            trainer.train(train, max_steps=40)
        except BaseException as error:  # reported by the test below
            failures.append(error)

    thread = threading.Thread(target=train_in_background)
    thread.start()
    try:
        results, exports = run_evaluator(
            estimator(tmp_path),
            TrainSpec(train, max_steps=40),
            EvalSpec(evaluate, start_delay_secs=0, exporters=exporter),
            poll_secs=0.02,
            timeout_secs=60,
        )
    finally:
        thread.join()
    assert not failures
    steps = eval_steps(tmp_path)
    assert results["global_step"] == 40 and steps[-1] == 40
    assert steps == sorted(set(steps))  # each checkpoint evaluated once, in order
    assert [call["step"] for call in exporter.calls] == steps and exporter.calls[-1]["final"] is True
    assert exports == [os.path.join(tmp_path, "export", "fake", "40")]


def test_evaluator_stops_after_timeout_without_new_checkpoints(tmp_path):
    train, evaluate, _, _ = input_fns()
    estimator(tmp_path).train(train, max_steps=10)
    clock = iter(range(1000))
    sleeps = []
    results, _ = run_evaluator(
        estimator(tmp_path),
        TrainSpec(train),
        EvalSpec(evaluate, start_delay_secs=3),
        poll_secs=1,
        timeout_secs=5,
        clock=lambda: next(clock),
        sleep=sleeps.append,
    )
    assert results["global_step"] == 10 and sleeps[0] == 3
    assert eval_steps(tmp_path) == [10]


def test_tf_config_evaluator_task_runs_the_evaluator(tmp_path, monkeypatch):
    train, evaluate, _, _ = input_fns()
    estimator(tmp_path).train(train, max_steps=20)
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2223"], "evaluator": ["localhost:2224"]},
                "task": {"type": "evaluator", "index": 0},
            }
        ),
    )
    est = estimator(tmp_path)
    results, _ = train_and_evaluate(est, TrainSpec(train, max_steps=20), EvalSpec(evaluate, start_delay_secs=0))
    assert results["global_step"] == 20 and est.latest_checkpoint().endswith("ckpt-20")  # evaluated, not trained
    # The evaluator keeps the best (best.json) but leaves the manifest to the training chief, its one writer.
    manifest = est.checkpoint_store.manifest
    train_and_evaluate(
        est, TrainSpec(train, max_steps=20), EvalSpec(evaluate, start_delay_secs=0), best=BestCheckpointPolicy()
    )
    assert [record.step for record in read_best(tmp_path)] == [20]
    assert est.checkpoint_store.manifest == manifest
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": {"chief": ["localhost:2222"]}, "task": {"type": "evaluator", "index": 1}})
    )
    with pytest.raises(te.errors.ConfigError, match="runs one evaluator"):
        train_and_evaluate(est, TrainSpec(train, max_steps=20), EvalSpec(evaluate))
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"chief": ["localhost:2222"], "ps": ["localhost:2224"]}, "task": {"type": "ps", "index": 0}}
        ),
    )
    with pytest.raises(
        ValueError,
        match="trains with parameter servers: set RunConfig.train_distribute=te.distribute.ParameterServerStrategy",
    ):
        train_and_evaluate(est, TrainSpec(train, max_steps=20), EvalSpec(evaluate))


# -- two replicas ------------------------------------------------------------------------------


def _two_replica_input(input_context=None):
    x, y = make_classification(128, seed=3)
    return te.numpy_input_fn({"x": x}, y, batch_size=16, num_epochs=None, shuffle=True, seed=0)(
        input_context=input_context
    )


def _two_replica_eval(input_context=None):
    x, y = make_classification(64, seed=4)
    score = np.full(64, 0.5, np.float32)
    return te.numpy_input_fn({"x": x, "score": score}, y, batch_size=16, num_epochs=1, shuffle=False)(
        input_context=input_context
    )


def _early_stop_two_replicas(model_dir):
    torch.manual_seed(0)
    config = te.RunConfig(
        train_distribute=te.MirroredStrategy(),
        save_checkpoints_steps=4,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
    )
    est = te.Estimator(
        model_fn=scored_model_fn,
        model=lambda: SmallNet(batch_norm=False),
        optimizer=adam,
        model_dir=model_dir,
        config=config,
    )
    results, _ = train_and_evaluate(
        est,
        TrainSpec(_two_replica_input, max_steps=100),
        EvalSpec(_two_replica_eval, every_n_steps=3),
        early_stopping=stop_if_no_decrease_hook("score", 6),
        best=BestCheckpointPolicy("loss"),
    )
    return results, est.latest_checkpoint()


@pytest.mark.slow
@pytest.mark.distributed
def test_early_stopping_stops_both_replicas_at_the_same_step(tmp_path):
    (results_0, latest_0), (results_1, latest_1) = run_in_processes(
        _early_stop_two_replicas, nprocs=2, args=(str(tmp_path),), timeout=180
    )
    assert results_0 == results_1
    assert results_0["global_step"] == 9  # best at 3, 9 - 3 >= 6
    assert latest_0 == latest_1 and latest_0.endswith("ckpt-9")
    assert eval_steps(tmp_path) == [3, 6, 9]
    records = read_best(tmp_path)  # written once, by the chief
    assert len(records) == 1 and records[0].step in (3, 6, 9) and os.path.isdir(records[0].path)


def test_a_kill_between_best_json_and_the_manifest_loses_no_best_checkpoint(tmp_path, monkeypatch):
    train, _, _, _ = input_fns()
    est = estimator(tmp_path, keep_checkpoint_max=1)
    est.train(train, max_steps=10)
    policy = BestCheckpointPolicy("score", higher_is_better=False)
    policy.update(est.checkpoint_store, 10, {"score": 0.2})
    est.train(train, max_steps=20)

    write_best_file = best_module.write_best_file

    def killed_after_writing(*arguments):
        write_best_file(*arguments)
        raise KeyboardInterrupt  # as a kill -9 right after best.json was replaced

    monkeypatch.setattr(best_module, "write_best_file", killed_after_writing)
    with pytest.raises(KeyboardInterrupt):
        policy.update(est.checkpoint_store, 20, {"score": 0.1})
    assert [record.step for record in read_best(tmp_path)] == [20]
    restarted = estimator(tmp_path, keep_checkpoint_max=1)
    restarted.train(train, max_steps=40)
    assert best_checkpoint(restarted.checkpoint_store).endswith("ckpt-20")
    assert {entry["step"] for entry in restarted._store.history()} == {10, 20, 40}  # old and new best kept
    # The next evaluation puts the manifest in line with best.json: step 10 is released to retention.
    BestCheckpointPolicy("score", higher_is_better=False).update(restarted.checkpoint_store, 40, {"score": 0.5})
    assert restarted._store.manifest["best"] == [20]
    restarted.train(train, max_steps=50)
    assert {entry["step"] for entry in restarted._store.history()} == {20, 50}


def test_a_lost_manifest_keeps_the_best_checkpoints_recorded_in_best_json(tmp_path):
    train, _, _, _ = input_fns()
    est = estimator(tmp_path, keep_checkpoint_max=1)
    est.train(train, max_steps=10)
    BestCheckpointPolicy("score", higher_is_better=False).update(est.checkpoint_store, 10, {"score": 0.2})
    os.remove(tmp_path / "checkpoint")  # rebuilt by scanning, which cannot know the best steps
    restarted = estimator(tmp_path, keep_checkpoint_max=1)
    restarted.train(train, max_steps=30)
    assert best_checkpoint(restarted.checkpoint_store).endswith("ckpt-10")
    assert restarted._store.manifest["best"] == [10]


@pytest.mark.parametrize(
    "item",
    [
        {"step": "ten", "value": 0.1},
        {"step": [10], "value": 0.1},
        {"step": 10, "value": "low"},
        {"step": 10.5, "value": 0.1},
        {"step": True, "value": 1},
        {"step": -3, "value": 0.1},
        {"step": 10, "value": [0.1]},
    ],
)
def test_a_crafted_best_json_is_compared_afresh_with_a_warning_naming_it(tmp_path, caplog, item):
    train, _, _, _ = input_fns()
    est = estimator(tmp_path, keep_checkpoint_max=1)
    est.train(train, max_steps=10)
    (tmp_path / BEST_FILE).write_text(
        json.dumps({"format_version": 1, "metric_name": "score", "higher_is_better": False, "best": [item]})
    )
    assert read_best(tmp_path) == []
    assert best_checkpoint(est.checkpoint_store) is None
    with caplog.at_level("WARNING"):
        assert (
            BestCheckpointPolicy("score", higher_is_better=False).update(est.checkpoint_store, 10, {"score": 0.3})
            is True
        )
    assert str(tmp_path / BEST_FILE) in caplog.text
    assert [(record.step, record.value) for record in read_best(tmp_path)] == [(10, pytest.approx(0.3))]
