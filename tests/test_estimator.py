"""Estimator semantics: train steps/max_steps, resume, evaluate, predict, variables, errors."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import SmallNet, adam, classifier_model_fn, input_fns, make_estimator, sgd

import torchestimator as te


def test_train_max_steps_is_absolute_and_steps_incremental(tmp_path, te_logs):
    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path)
    estimator.train(train, max_steps=20)
    assert estimator.latest_checkpoint().endswith("ckpt-20")
    estimator.train(train, max_steps=20)
    assert f"skipped training: {tmp_path} is already at step 20 (max_steps=20)" in te_logs.text
    estimator.train(train, steps=5)
    assert estimator.latest_checkpoint().endswith("ckpt-25")
    estimator.train(train, steps=5)
    assert estimator.latest_checkpoint().endswith("ckpt-30")


def test_train_argument_errors(tmp_path):
    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path)
    with pytest.raises(ValueError, match="both steps and max_steps"):
        estimator.train(train, steps=1, max_steps=2)
    with pytest.raises(te.errors.ConfigError, match=r"Estimator.train\(steps=...\) must be > 0; received 0"):
        estimator.train(train, steps=0)
    for bad in (1.5, True, "3"):  # a step count is a whole number, not a bool
        with pytest.raises(te.errors.ConfigTypeError, match="must be a whole number of steps"):
            estimator.train(train, max_steps=bad)
    with pytest.raises(te.errors.ConfigTypeError, match="Estimator.evaluate"):
        estimator.evaluate(train, steps=True)
    with pytest.raises(te.errors.ConfigTypeError, match=r"StopAtStepHook\(last_step=...\)"):
        te.StopAtStepHook(last_step=2.5)
    for secs in (float("nan"), float("inf"), True):
        with pytest.raises(te.errors.ConfigError, match="secs"):
            te.Every(secs=secs)


def test_train_until_input_ends_when_no_steps_given(tmp_path):
    x, y = np.zeros((40, 8), np.float32), np.zeros(40, np.int64)
    estimator = make_estimator(tmp_path)
    estimator.train(te.numpy_input_fn({"x": x}, y, batch_size=8, num_epochs=2, shuffle=False))
    assert estimator.latest_checkpoint().endswith("ckpt-10")


def test_new_estimator_resumes_from_model_dir(tmp_path):
    train, evaluate, _, _ = input_fns()
    first = make_estimator(tmp_path)
    first.train(train, max_steps=15)
    weight = first.get_variable_value("net.0.weight")
    second = make_estimator(tmp_path)
    assert second.evaluate(evaluate)["global_step"] == 15
    second.train(train, steps=5)
    assert second.latest_checkpoint().endswith("ckpt-20")
    assert not np.array_equal(second.get_variable_value("net.0.weight"), weight)


def test_evaluate_returns_metrics_loss_and_global_step(tmp_path):
    train, evaluate, _, (x, y) = input_fns(n=250, batch_size=32)  # last batch is short
    estimator = make_estimator(tmp_path)
    estimator.train(train, max_steps=30)
    results = estimator.evaluate(evaluate)
    assert set(results) == {"accuracy", "loss", "global_step"}
    assert results["global_step"] == 30
    model = SmallNet()
    model.load_state_dict(
        {k: torch.from_numpy(estimator.get_variable_value(k)) for k in estimator.get_variable_names()}
    )
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(x))
    assert results["accuracy"] == pytest.approx(float((logits.argmax(-1).numpy() == y).mean()), abs=1e-6)
    assert results["loss"] == pytest.approx(float(F.cross_entropy(logits, torch.from_numpy(y))), rel=1e-5)
    assert os.path.isdir(estimator.eval_dir())


def test_evaluate_steps_limits_batches(tmp_path):
    train, evaluate, _, _ = input_fns()
    estimator = make_estimator(tmp_path)
    estimator.train(train, max_steps=5)
    seen = []

    class Count(te.Hook):
        def after_step(self, run_context):
            seen.append(run_context.global_step)

    estimator.evaluate(evaluate, steps=3, hooks=[Count()])
    assert len(seen) == 3


def test_evaluate_without_checkpoint_uses_fresh_weights(tmp_path, te_logs):
    _, evaluate, _, _ = input_fns()
    results = make_estimator(tmp_path).evaluate(evaluate)
    assert results["global_step"] == 0
    assert "freshly initialised" in te_logs.text


def test_predict_yields_examples_batches_and_filters_keys(tmp_path):
    train, _, predict, (_x, _) = input_fns(n=70, batch_size=32)
    estimator = make_estimator(tmp_path)
    estimator.train(train, max_steps=3)
    rows = list(estimator.predict(predict))
    assert len(rows) == 70
    assert set(rows[0]) == {"class", "probabilities"}
    assert rows[0]["probabilities"].shape == (3,)
    only = list(estimator.predict(predict, predict_keys="class"))
    assert set(only[0]) == {"class"}
    batches = list(estimator.predict(predict, yield_single_examples=False))
    assert [b["class"].shape[0] for b in batches] == [32, 32, 6]
    with pytest.raises(ValueError, match="predict_keys"):
        list(estimator.predict(predict, predict_keys=["nope"]))


def test_predict_from_explicit_checkpoint(tmp_path):
    train, _, predict, _ = input_fns()
    estimator = make_estimator(tmp_path, save_checkpoints_steps=5)
    estimator.train(train, max_steps=10)
    early = os.path.join(str(tmp_path), "ckpt-5")
    at_5 = np.stack([r["probabilities"] for r in estimator.predict(predict, checkpoint_path=early)])
    at_10 = np.stack([r["probabilities"] for r in estimator.predict(predict)])
    again_5 = np.stack([r["probabilities"] for r in estimator.predict(predict, checkpoint_path=early)])
    assert not np.allclose(at_5, at_10)
    np.testing.assert_array_equal(at_5, again_5)


def test_variable_names_and_values(tmp_path):
    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path)
    with pytest.raises(ValueError, match="Could not find trained model"):
        estimator.get_variable_names()
    estimator.train(train, max_steps=2)
    names = estimator.get_variable_names()
    assert "net.1.running_mean" in names and "net.0.weight" in names
    assert estimator.get_variable_value("net.0.weight").shape == (16, 8)
    with pytest.raises(ValueError, match="not in"):
        estimator.get_variable_value("missing")


def test_eval_dir_names(tmp_path):
    estimator = te.Estimator(model_fn=classifier_model_fn, model=SmallNet(), model_dir=str(tmp_path))
    assert estimator.eval_dir() == os.path.join(str(tmp_path), "eval")
    assert estimator.eval_dir("holdout") == os.path.join(str(tmp_path), "eval_holdout")


def test_model_fn_and_input_fn_receive_declared_arguments(tmp_path):
    received = {}
    x, y = np.ones((16, 8), np.float32), np.zeros(16, np.int64)

    def model_fn(features, labels, mode, params, config, model):
        received["model_fn"] = (mode, params["p"], isinstance(config, te.RunConfig), isinstance(model, torch.nn.Module))
        return classifier_model_fn(model, features, labels, mode)

    def input_fn(params, mode, config, input_context):
        received["input_fn"] = (params["p"], mode, input_context.num_replicas_in_sync)
        return te.numpy_input_fn({"x": x}, y, batch_size=8, shuffle=False)(input_context=input_context)

    config = te.RunConfig(progress_bar=False, log_step_count_steps=None)
    estimator = te.Estimator(
        model_fn=model_fn,
        model=lambda params: SmallNet(),
        optimizer=adam,
        model_dir=str(tmp_path),
        config=config,
        params={"p": 7},
    )
    estimator.train(input_fn, max_steps=1)
    assert received["model_fn"] == ("train", 7, True, True)
    assert received["input_fn"] == (7, "train", 1)


def test_unknown_model_fn_argument_is_refused(tmp_path):
    def model_fn(features, labels, mode, session):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="session"):
        te.Estimator(model_fn=model_fn, model=SmallNet(), model_dir=str(tmp_path))


def test_a_module_given_as_model_fn_is_refused_when_the_estimator_is_built(tmp_path):
    with pytest.raises(TypeError, match="received the module SmallNet. Pass the module as model="):
        te.Estimator(model_fn=SmallNet(), model=SmallNet(), model_dir=str(tmp_path))
    assert not os.listdir(tmp_path)  # refused before anything was written


def test_pasted_tf_estimator_call_without_model_says_what_model_is(tmp_path):
    """tf.estimator's Estimator(model_fn=, config=, params=) has no model=: a ConfigTypeError (a TypeError) says
    what it is, not Python's bare "missing 1 required positional argument"; the signature keeps model required."""
    config = te.RunConfig(model_dir=str(tmp_path))
    for call in (
        lambda: te.estimator.Estimator(model_fn=classifier_model_fn, config=config, params={"lr": 0.1}),
        lambda: te.Estimator(classifier_model_fn, config=config),
    ):
        with pytest.raises(te.errors.ConfigTypeError) as refused:
            call()
        assert isinstance(refused.value, TypeError) and refused.value.field == "model"
        message = str(refused.value)
        assert message.startswith("Estimator(...) needs model=: the nn.Module, or a factory that builds it")
        assert "passed to model_fn as its `model` argument" in message and "missing 1 required" not in message
    assert not os.listdir(tmp_path)
    signature = inspect.signature(te.Estimator)
    assert list(signature.parameters)[:2] == ["model_fn", "model"]
    assert signature.parameters["model"].default is inspect.Parameter.empty
    with pytest.raises(te.errors.ConfigTypeError, match="tf.estimator's Estimator took model_dir second"):
        te.Estimator(classifier_model_fn, str(tmp_path))  # TF's positional order: model_fn, model_dir
    assert te.Estimator(classifier_model_fn, SmallNet(), model_dir=str(tmp_path)).model_dir == str(tmp_path)


def test_model_dir_conflict_and_temporary_default(tmp_path, te_logs):
    with pytest.raises(ValueError, match="differ"):
        te.Estimator(
            model_fn=classifier_model_fn,
            model=SmallNet(),
            model_dir=str(tmp_path / "a"),
            config=te.RunConfig(model_dir=str(tmp_path / "b")),
        )
    estimator = te.Estimator(model_fn=classifier_model_fn, model=SmallNet())
    assert os.path.isdir(estimator.model_dir)
    assert "temporary folder" in te_logs.text


def test_params_and_run_config_are_recorded(tmp_path):
    train, _, _, _ = input_fns()
    estimator = te.Estimator(
        model_fn=classifier_model_fn,
        model=lambda: SmallNet(),
        optimizer=adam,
        model_dir=str(tmp_path),
        params={"lr": 0.1},
        config=te.RunConfig(progress_bar=False, save_checkpoints_steps=5),
    )
    estimator.train(train, max_steps=1)
    assert (tmp_path / "params.json").read_text().strip().startswith("{")
    assert '"save_checkpoints_steps": 5' in (tmp_path / "run_config.json").read_text()


def test_lr_scheduler_steps_once_per_global_step_and_resumes(tmp_path):
    train, _, _, _ = input_fns()

    def build(model_dir):
        return te.Estimator(
            model_fn=classifier_model_fn,
            model=lambda: SmallNet(),
            optimizer=sgd,
            lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 10, gamma=0.5),
            model_dir=str(model_dir),
            config=te.RunConfig(progress_bar=False, save_checkpoints_steps=5, save_summary_steps=5),
        )

    build(tmp_path).train(train, max_steps=15)
    estimator = build(tmp_path)
    estimator.train(train, max_steps=25)
    from torchestimator._io.summary import read_scalars

    rates = dict(read_scalars(str(tmp_path))["learning_rate"])
    assert rates[5] == pytest.approx(0.05)
    assert rates[15] == pytest.approx(0.05 * 0.5)
    assert rates[25] == pytest.approx(0.05 * 0.5**2)  # the scheduler's position survived the restart


def test_model_dir_whose_checkpoints_are_all_damaged_is_an_error(tmp_path):
    from torchestimator.cli.inspection import describe
    from torchestimator.export import TensorSpec, serving_input_receiver

    train, evaluate, predict, _ = input_fns()
    make_estimator(tmp_path, save_checkpoints_steps=5).train(train, max_steps=10)
    for step in (5, 10):
        os.remove(tmp_path / f"ckpt-{step}" / "state.json")
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    every_entry_point = (
        lambda estimator: estimator.train(train, max_steps=12),
        lambda estimator: estimator.evaluate(evaluate),
        lambda estimator: list(estimator.predict(predict)),
        lambda estimator: estimator.export_saved_model(tmp_path / "export", receiver),
        lambda estimator: estimator.get_variable_names(),
        lambda estimator: describe(str(tmp_path)),
    )
    for call in every_entry_point:
        with pytest.raises(te.checkpoint.CheckpointError) as raised:
            call(make_estimator(tmp_path, save_checkpoints_steps=5))
        message = str(raised.value)
        assert "ckpt-5: " in message and "ckpt-10: " in message and "state.json is missing" in message
        assert "move the ckpt-* folders out of" in message
    # The documented way to start over: move them away.
    os.makedirs(tmp_path / "damaged")
    for step in (5, 10):
        os.rename(tmp_path / f"ckpt-{step}", tmp_path / "damaged" / f"ckpt-{step}")
    fresh = make_estimator(tmp_path, save_checkpoints_steps=5)
    fresh.train(train, steps=5)
    assert fresh.latest_checkpoint().endswith("ckpt-5")


def test_train_start_removes_what_killed_runs_left(tmp_path):
    import subprocess
    import sys

    train, _, _, _ = input_fns()
    make_estimator(tmp_path).train(train, max_steps=10)
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    leftovers = [
        f".checkpoint.tmp-{process.pid}",
        f".write-probe-{process.pid}",
        f".params.json.tmp-{process.pid}-ab12",
    ]
    for name in leftovers:
        (tmp_path / name).write_text("partial")
    (tmp_path / f".tmp-ckpt-20-{process.pid}").mkdir()
    make_estimator(tmp_path).train(train, max_steps=12)
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith(".")) == []


def test_full_disk_at_start_says_disk_full_and_leaves_no_probe(tmp_path, monkeypatch):
    import builtins
    import errno

    real_open = builtins.open

    class FullFile:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.handle.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_open(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        return FullFile(handle) if "w" in mode else handle

    monkeypatch.setattr("torchestimator._core.estimator.open", full_open, raising=False)
    train, _, _, _ = input_fns()
    with pytest.raises(OSError) as raised:
        make_estimator(tmp_path).train(train, max_steps=2)
    assert not isinstance(raised.value, PermissionError) and raised.value.errno == errno.ENOSPC
    assert "disk full" in str(raised.value) and str(tmp_path) in str(raised.value)
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == []


def test_variables_of_a_damaged_model_dir_fall_back_or_name_every_damaged_checkpoint(tmp_path, caplog):
    from torchestimator.checkpoint import CheckpointError

    train, _, _, _ = input_fns()
    estimator = make_estimator(tmp_path, save_checkpoints_steps=1, keep_checkpoint_max=3)
    estimator.train(train, max_steps=3)
    model_file = tmp_path / "ckpt-3" / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[-1] ^= 1
    model_file.write_bytes(bytes(data))
    reader = make_estimator(tmp_path)
    with caplog.at_level("WARNING"):
        value = reader.get_variable_value("net.0.weight")  # from ckpt-2, as evaluate would use
    assert "ckpt-3" in caplog.text and value.shape == (16, 8)
    for step in (1, 2, 3):
        (tmp_path / f"ckpt-{step}" / "state.json").unlink()
    for call in (reader.get_variable_names, lambda: reader.get_variable_value("net.0.weight")):
        with pytest.raises(CheckpointError, match=r"None of the 3 checkpoint\(s\)[\s\S]*ckpt-1[\s\S]*ckpt-3"):
            call()


def test_deterministic_algorithms_are_on_while_training_and_the_callers_setting_comes_back(tmp_path, monkeypatch):
    class Observe(te.Hook):
        seen: list[tuple[bool, str | None]] = []

        def after_step(self, run_context):
            self.seen.append((torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")))

    train, _, _, _ = input_fns()
    assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        observe = Observe()
        make_estimator(tmp_path, deterministic=True).train(train, hooks=[observe], max_steps=3)
        assert observe.seen == [(True, ":4096:8")] * 3
        assert not torch.are_deterministic_algorithms_enabled()  # process-wide in torch: not left on for what follows
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        torch.use_deterministic_algorithms(True, warn_only=True)
        make_estimator(tmp_path / "second", deterministic=True).train(train, max_steps=2)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize(
    "argument, value, expected",
    [
        ("model_dir", 123, "a str or os.PathLike path"),
        ("config", {"save_checkpoints_steps": 10}, "a te.RunConfig"),
        ("params", [("hidden", 8)], "a dict"),
        ("model", "SmallNet", "an nn.Module or a factory"),
        ("optimizer", "adam", "a factory building the optimizer"),
        ("lr_scheduler", 0.1, "a factory building the scheduler"),
    ],
)
def test_an_argument_of_the_wrong_type_is_a_config_type_error_naming_it(tmp_path, argument, value, expected):
    arguments = {"model_fn": classifier_model_fn, "model": SmallNet(), "optimizer": adam, "model_dir": str(tmp_path)}
    with pytest.raises(
        te.errors.ConfigTypeError, match=rf"Estimator\({argument}=\.\.\.\) must be {expected}"
    ) as caught:
        te.Estimator(**{**arguments, argument: value})
    assert caught.value.field == argument and caught.value.value == value
    assert isinstance(caught.value, TypeError)  # code catching TypeError keeps working


def test_model_dir_may_be_a_path_object(tmp_path):
    from pathlib import Path

    estimator = te.Estimator(model_fn=classifier_model_fn, model=SmallNet(), model_dir=Path(tmp_path) / "run")
    assert estimator.model_dir == str(tmp_path / "run")
    with pytest.raises(te.errors.ConfigError, match="non-empty") as caught:
        te.Estimator(model_fn=classifier_model_fn, model=SmallNet(), model_dir="")
    assert caught.value.field == "model_dir"


@pytest.mark.parametrize(
    "arguments, error, field, message",
    [
        ({"loss": 5}, te.errors.ConfigTypeError, "loss", "loss must be a name or a callable"),
        ({"optimizer": 5}, te.errors.ConfigTypeError, "optimizer", "optimizer must be a name"),
        ({"metrics": 5}, te.errors.ConfigTypeError, "metrics", "metrics must be a list of names"),
        ({"metrics": "mse"}, te.errors.ConfigTypeError, "metrics", r"metrics=\['mse'\]"),
        (
            {"learning_rate": "0.1"},
            te.errors.ConfigTypeError,
            "learning_rate",
            "learning_rate must be a positive number",
        ),
        ({"learning_rate": -1.0}, te.errors.ConfigError, "learning_rate", "learning_rate must be a positive number"),
        ({"optimizer": adam, "learning_rate": 0.1}, te.errors.ConfigError, "learning_rate", "a factory sets its own"),
        ({"model_dir": 5}, te.errors.ConfigTypeError, "model_dir", r"Estimator\.from_module\(model_dir=\.\.\.\)"),
        ({"module": 5}, te.errors.ConfigTypeError, "module", r"Estimator\.from_module\(module=\.\.\.\) must be an nn"),
        (
            {"module": torch.nn.Linear},
            te.errors.ConfigTypeError,
            "module",
            r"from_module\(module=\.\.\.\) received the class Linear, whose constructor needs in_features, out_features",
        ),
        (
            {"loss": torch.nn.CrossEntropyLoss},
            te.errors.ConfigTypeError,
            "loss",
            r"from_module\(loss=CrossEntropyLoss\) is a class; pass an instance \(loss=CrossEntropyLoss\(\)\)",
        ),
    ],
)
def test_from_module_names_the_argument_of_a_wrong_value(arguments, error, field, message):
    with pytest.raises(error, match=message) as caught:
        te.Estimator.from_module(**{"module": torch.nn.Linear(3, 1), "loss": "mse", **arguments})
    assert caught.value.field == field
    assert "Estimator(" not in str(caught.value)  # from_module's arguments, as the user wrote them


class _NetOfParams(torch.nn.Module):  # a class built as _NetOfParams(params): a legitimate model factory
    def __init__(self, params):
        super().__init__()
        self.layer = torch.nn.Linear(8, params["classes"])

    def forward(self, x):
        return self.layer(x)


class _NetOfNothing(_NetOfParams):  # built as _NetOfNothing()
    def __init__(self):
        super().__init__({"classes": 3})


@pytest.mark.parametrize(
    "argument, value, message",
    [
        (
            "model",
            torch.nn.Linear,
            r"Estimator\(model=\.\.\.\) received the class Linear, whose constructor needs "
            r"in_features, out_features; .* Pass an instance \(model=Linear\(\.\.\.\)\) or a factory \(model=lambda params",
        ),
        ("model", torch.nn.BatchNorm1d, r"class BatchNorm1d, whose constructor needs num_features"),  # never params
        ("model", dict, r"received the class dict, which is not an nn.Module"),
        ("model", lambda params, other: None, r"cannot be called as a model factory is"),
        (
            "lr_scheduler",
            torch.optim.lr_scheduler.StepLR,
            r"Estimator\(lr_scheduler=\.\.\.\) received StepLR, a class whose "
            r"constructor also needs step_size; pass a factory: lr_scheduler=lambda optimizer: StepLR\(optimizer, step_size",
        ),
        (
            "lr_scheduler",
            torch.optim.SGD,
            r"received the class SGD, which is not a torch.optim.lr_scheduler.LRScheduler",
        ),
        (
            "optimizer",
            lambda: None,
            r"Estimator\(optimizer=\.\.\.\) cannot be called as the framework calls it, with "
            r"\(parameters\) or \(parameters, params\)",
        ),
        ("optimizer", torch.nn.Linear, r"received the class Linear, which is not a torch.optim.optimizer.Optimizer"),
    ],
)
def test_a_class_or_factory_that_cannot_work_is_refused_when_the_estimator_is_built(tmp_path, argument, value, message):
    arguments = {"model_fn": classifier_model_fn, "model": SmallNet(), "optimizer": adam, "model_dir": str(tmp_path)}
    with pytest.raises(te.errors.ConfigTypeError, match=message) as caught:
        te.Estimator(**{**arguments, argument: value})
    assert caught.value.field == argument and caught.value.value is value


def test_classes_that_work_as_factories_are_accepted(tmp_path):
    train, _, _, _ = input_fns()
    for model, params in ((_NetOfParams, {"classes": 3}), (_NetOfNothing, {})):
        estimator = te.Estimator(
            model_fn=classifier_model_fn,
            model=model,
            params=params,
            optimizer=torch.optim.Adam,  # an Optimizer class needing only the parameters
            lr_scheduler=torch.optim.lr_scheduler.ConstantLR,  # needs only the optimizer
            model_dir=str(tmp_path / model.__name__),
        )
        estimator.train(train, max_steps=1)
        assert estimator.get_variable_value("layer.weight").shape == (3, 8)


@pytest.mark.parametrize(
    "argument, value, field, returned",
    [
        (
            "model",
            lambda params: 5,
            "model",
            r"Estimator\(model=\.\.\.\) returned 5 \(int\); it must return an nn.Module",
        ),
        (
            "model",
            lambda: SmallNet,
            "model",
            r"Estimator\(model=\.\.\.\) returned <class .*SmallNet.> \(a class\); it must return an nn.Module",
        ),
        (
            "optimizer",
            lambda parameters: 5,
            "optimizer",
            r"Estimator\(optimizer=\.\.\.\) returned 5 \(int\); it must "
            r"return a torch.optim.Optimizer",
        ),
        (
            "lr_scheduler",
            lambda optimizer: 5,
            "lr_scheduler",
            r"Estimator\(lr_scheduler=\.\.\.\) returned 5 \(int\); it "
            r"must return a learning-rate scheduler",
        ),
    ],
)
def test_a_factory_returning_the_wrong_thing_names_its_argument(tmp_path, argument, value, field, returned):
    train, _, _, _ = input_fns()
    arguments = {"model_fn": classifier_model_fn, "model": SmallNet, "optimizer": adam, "model_dir": str(tmp_path)}
    estimator = te.Estimator(**{**arguments, argument: value})
    with pytest.raises(te.errors.ConfigTypeError, match=rf"The factory given as {returned}") as caught:
        estimator.train(train, max_steps=1)
    assert caught.value.field == field
    assert not any(name.startswith("ckpt-") for name in os.listdir(tmp_path))  # refused before any step


def test_from_module_names_its_module_argument_when_the_factory_returns_the_wrong_thing(tmp_path):
    train, _, _, _ = input_fns()
    estimator = te.Estimator.from_module(lambda: 5, loss="cross_entropy", model_dir=str(tmp_path))
    returned = r"Estimator\.from_module\(module=\.\.\.\) returned 5"
    with pytest.raises(te.errors.ConfigTypeError, match=returned) as caught:
        estimator.train(train, max_steps=1)
    assert caught.value.field == "module"
