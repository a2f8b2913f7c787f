"""The one summary line per train / evaluate / train_and_evaluate call (_io/console.py), seen the way a user
sees it: a fresh Python process whose program configured no logging, the quiet setting, a program that
configures logging later, and the CLI (which configures logging itself: each line once)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A model file (the CLI's FILE.py) and the program a Python user would write around it.
MODEL_FILE = textwrap.dedent("""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchestimator as te

    rng = np.random.default_rng(0)
    features = rng.normal(size=(64, 4)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)  # learnable: the sign of the first feature
    config = te.RunConfig(save_checkpoints_steps=5, progress_bar=False, random_seed=0)

    def model(params):
        return torch.nn.Linear(4, 2)

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)})
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels),
                                eval_metric_ops={"accuracy": te.metrics.accuracy(labels, logits.argmax(-1))})

    def optimizer(parameters):
        return torch.optim.SGD(parameters, lr=0.5)

    train_input_fn = te.numpy_input_fn({"x": features}, labels, batch_size=16, num_epochs=None, shuffle=True, seed=0)
    eval_input_fn = te.numpy_input_fn({"x": features}, labels, batch_size=32, num_epochs=1, shuffle=False)

    def estimator(model_dir):
        return te.Estimator(model_fn=model_fn, model=model, optimizer=optimizer, model_dir=model_dir, config=config)
""")

PROGRAM = textwrap.dedent("""
    import logging, sys
    import tiny_model as m
    import torchestimator as te

    model_dir, mode = sys.argv[1], sys.argv[2]
    if mode == "quiet":
        logging.getLogger("torchestimator").setLevel(logging.WARNING)
    estimator = m.estimator(model_dir + "/a")
    estimator.train(m.train_input_fn, max_steps=10)
    estimator.evaluate(m.eval_input_fn)
    estimator.train(m.train_input_fn, max_steps=10)  # a rerun: max_steps already reached
    m.estimator(model_dir + "/a").train(m.train_input_fn, max_steps=15)  # a new program resuming
    if mode == "quiet":
        logging.getLogger("torchestimator").setLevel(logging.NOTSET)
        logging.basicConfig(level=logging.INFO, format="CONFIGURED %(name)s %(message)s")
        m.estimator(model_dir + "/a").train(m.train_input_fn, max_steps=20)
    else:
        te.train_and_evaluate(m.estimator(model_dir + "/b"), te.TrainSpec(m.train_input_fn, max_steps=10),
                              te.EvalSpec(m.eval_input_fn, steps=None, throttle_secs=0))
    print("done")
""")

NUMBER = r"(?:\d+\.\d+(?:e[+-]?\d+)?|\d+e[+-]?\d+)"  # as console.format_value writes floats


def _write(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "tiny_model.py").write_text(MODEL_FILE)
    (tmp_path / "program.py").write_text(PROGRAM)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    environ.pop("TORCHESTIMATOR_VERBOSITY", None)
    return environ


def _run(arguments: list[str], tmp_path: Path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    completed = subprocess.run(
        [sys.executable, *arguments], cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=240
    )
    assert completed.returncode == 0, completed.stderr
    return completed


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_program_that_configures_no_logging_sees_one_line_per_call(tmp_path):
    environ = _write(tmp_path)
    completed = _run(["program.py", str(tmp_path), "plain"], tmp_path, environ)
    a, b = re.escape(str(tmp_path / "a")), re.escape(str(tmp_path / "b"))
    expected = [
        rf"torchestimator: trained {a} from step 0 to 10 in {NUMBER} s \(final loss {NUMBER}\)",
        rf"torchestimator: evaluated {a}/ckpt-10: accuracy = {NUMBER}, loss = {NUMBER}",
        rf"torchestimator: skipped training: {a} is already at step 10 \(max_steps=10\)",
        rf"torchestimator: resumed {a} from ckpt-10 and trained to step 15 in {NUMBER} s \(final loss {NUMBER}\)",
        rf"torchestimator: trained {b} from step 0 to 10 in {NUMBER} s \(final loss {NUMBER}\); "
        rf"evaluated 2 times, at step 10: accuracy = {NUMBER}, loss = {NUMBER}",
    ]
    lines = completed.stderr.splitlines()
    assert len(lines) == len(expected), completed.stderr  # nothing else: no other INFO line, no warning
    for line, pattern in zip(lines, expected):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert completed.stdout == "done\n"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quiet_setting_hides_them_and_configured_logging_gets_them_once(tmp_path):
    environ = _write(tmp_path)
    completed = _run(["program.py", str(tmp_path), "quiet"], tmp_path, environ)
    lines = completed.stderr.splitlines()
    assert not [line for line in lines if not line.startswith("CONFIGURED ")], completed.stderr  # quiet: nothing
    summaries = [line for line in lines if "resumed" in line or "trained" in line]
    # Once the program configured logging, its handler shows the line (once), and the library's own stands aside.
    assert len(summaries) == 1, completed.stderr
    assert re.fullmatch(
        rf"CONFIGURED torchestimator resumed {re.escape(str(tmp_path / 'a'))} from ckpt-15 and "
        rf"trained to step 20 in {NUMBER} s \(final loss {NUMBER}\)",
        summaries[0],
    )
    assert any(line.startswith("CONFIGURED torchestimator.checkpoint") for line in lines)  # its INFO lines too


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_cli_shows_each_line_once(tmp_path):
    environ = _write(tmp_path)
    flags = ["tiny_model.py", "--model_dir", str(tmp_path / "cli")]
    trained = _run(["-m", "torchestimator", "train", *flags, "--max_steps", "10"], tmp_path, environ)
    evaluated = _run(["-m", "torchestimator", "evaluate", *flags], tmp_path, environ)
    cli = re.escape(str(tmp_path / "cli"))
    assert len(re.findall(rf"trained {cli} from step 0 to 10 in", trained.stderr)) == 1, trained.stderr
    assert len(re.findall(rf"evaluated {cli}/ckpt-10: accuracy = ", evaluated.stderr)) == 1, evaluated.stderr
    assert "INFO torchestimator" in trained.stderr  # the CLI's own logging (--verbosity INFO) shows the rest


def test_the_lines_name_what_the_user_named_and_say_why_training_stopped(tmp_path, monkeypatch):
    from torchestimator._core.inference import WeightsOrigin
    from torchestimator._io.console import TrainOutcome, describe_evaluation, describe_training, format_value

    monkeypatch.chdir(tmp_path)
    checkpoint = WeightsOrigin("checkpoint", 1000, str(tmp_path / "runs" / "q" / "ckpt-1000"))
    assert describe_evaluation(checkpoint, "runs/q", {"accuracy": 1.0, "loss": 0.012345678, "global_step": 1000}) == (
        "evaluated runs/q/ckpt-1000: accuracy = 1.0, loss = 0.01235"
    )  # relative, as model_dir was given
    assert describe_evaluation(WeightsOrigin("init"), "runs/q", {"loss": 2.0}, "holdout") == (
        "evaluated freshly initialised weights (no checkpoint in runs/q) (holdout): loss = 2.0"
    )
    stopped = TrainOutcome(
        model_dir="runs/q",
        start_step=0,
        end_step=640,
        seconds=3.04,
        last_step=1000,
        ended_by="early stopping",
        final_loss=0.5,
    )
    assert describe_training(stopped) == (
        "trained runs/q from step 0 to 640 in 3.0 s (final loss 0.5); stopped at step 640 of 1000: early stopping"
    )
    assert [format_value(value) for value in (1.0, 12345.6, float("nan"), 7, True)] == [
        "1.0",
        "1.235e+04",
        "nan",
        "7",
        "True",
    ]


def test_a_train_call_that_takes_no_step_still_says_so(tmp_path, te_logs):
    """An input that ends before the first batch (empty, or a num_epochs input resumed at its end) gives its summary
    line and the warning; an input that ends later says so after the trained range."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    import torchestimator as te

    rng = np.random.default_rng(0)
    features = rng.normal(size=(64, 4)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)

    def model_fn(model, features, labels, mode):
        return te.EstimatorSpec(mode, loss=F.cross_entropy(model(features["x"]), labels))

    def estimator(name):
        return te.Estimator(
            model_fn=model_fn,
            model=lambda: torch.nn.Linear(4, 2),
            optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
            model_dir=str(tmp_path / name),
            config=te.RunConfig(progress_bar=False),
        )

    def one_epoch():
        return te.numpy_input_fn({"x": features}, labels, batch_size=16, num_epochs=1, shuffle=False)

    def summaries():
        return [record.getMessage() for record in te_logs.records if getattr(record, "torchestimator_summary", False)]

    def warnings():
        return [record.getMessage() for record in te_logs.records if record.levelname == "WARNING"]

    resumed = estimator("resumed")
    resumed.train(one_epoch(), max_steps=1000)
    resumed.train(one_epoch(), max_steps=1000)  # resumes at the end of its one epoch
    first, second = summaries()
    assert re.fullmatch(
        rf"trained {re.escape(str(tmp_path / 'resumed'))} from step 0 to 4 in {NUMBER} s \(final loss "
        rf"{NUMBER}\); stopped at step 4 of 1000: the input ended",
        first,
    ), first
    assert second == f"trained no step: {tmp_path / 'resumed'} stays at step 4: the input ended before its first batch"
    assert (
        len(
            [
                text
                for text in warnings()
                if text.startswith("Training made no steps: the input ended before its first batch")
            ]
        )
        == 1
    )
    te_logs.clear()
    estimator("empty").train(lambda: [], max_steps=50)
    assert summaries() == [
        f"trained no step: {tmp_path / 'empty'} stays at step 0: the input ended before its first batch"
    ]
    assert any(text.startswith("Training made no steps") for text in warnings())
