"""The command line: train, evaluate, predict, inspect and demo, on real files."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import select
import textwrap

import pytest

from torchestimator.cli import main

MODEL_FILE = textwrap.dedent('''
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    params = {"hidden": 8, "lr": 0.05}
    config = te.RunConfig(save_checkpoints_steps=5, log_step_count_steps=None, progress_bar=False)
    max_steps = 10
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 4)).astype(np.float32)
    Y = (X[:, 0] > 0).astype(np.int64)

    def model(params):
        return nn.Sequential(nn.Linear(4, params["hidden"]), nn.ReLU(), nn.Linear(params["hidden"], 2))

    def model_fn(model, features, labels, mode, params):
        logits = model(features["x"])
        predictions = {"class": logits.argmax(-1)}
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions=predictions)
        return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels),
                                eval_metric_ops={"accuracy": te.metrics.accuracy(labels, predictions["class"])})

    def optimizer(parameters, params):
        return torch.optim.SGD(parameters, lr=params["lr"])

    def train_input_fn(input_context=None):
        return te.numpy_input_fn({"x": X}, Y, batch_size=16, num_epochs=None, shuffle=True)(input_context=input_context)

    def eval_input_fn():
        return te.numpy_input_fn({"x": X}, Y, batch_size=16, shuffle=False)()

    def predict_input_fn():
        return te.numpy_input_fn({"x": X[:5]}, batch_size=16, shuffle=False)()

    from torchestimator import export as te_export
    serving_input_receiver = te_export.serving_input_receiver({"x": te_export.TensorSpec(shape=(None, 4))})
''')


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL_FILE)
    return str(path)


def test_train_evaluate_predict_inspect(tmp_path, model_file, capsys):
    model_dir = str(tmp_path / "run")
    assert main(["train", model_file, "--model_dir", model_dir]) == 0
    assert "global step 10" in capsys.readouterr().out
    assert main(["train", model_file, "--model_dir", model_dir, "--steps", "3", "--param", "lr=0.01"]) == 0
    assert "global step 13" in capsys.readouterr().out
    assert json.load(open(os.path.join(model_dir, "params.json")))["lr"] == 0.01

    assert main(["evaluate", model_file, "--model_dir", model_dir, "--name", "check"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["global_step"] == 13 and 0.0 <= results["accuracy"] <= 1.0
    assert os.path.isdir(os.path.join(model_dir, "eval_check"))

    output = tmp_path / "predictions.jsonl"
    assert main(["predict", model_file, "--model_dir", model_dir, "--output", str(output)]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 5 and set(rows[0]) == {"class"}

    assert main(["inspect", model_dir]) == 0
    listing = capsys.readouterr().out
    assert "step       13" in listing and "0.weight" in listing and "[8, 4]" in listing
    assert main(["inspect", os.path.join(model_dir, "ckpt-13", "model.safetensors")]) == 0
    assert "2.bias" in capsys.readouterr().out


def test_cli_errors_are_reported_without_traceback(tmp_path, model_file, capsys):
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["inspect", str(empty)]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="does not define 'eval_input_fn'"):
        broken = tmp_path / "broken.py"
        broken.write_text(MODEL_FILE.replace("def eval_input_fn", "def other_input_fn"))
        main(["evaluate", str(broken), "--model_dir", str(tmp_path / "run")])
    with pytest.raises(SystemExit, match="no model file or module 'no_such_module.demo'"):
        main(["export", "no_such_module.demo", "--model_dir", str(tmp_path / "run"), "--export_dir", str(tmp_path)])
    # A NaN loss (a TorchEstimatorError that is no ValueError) is one line too, naming the step.
    nan = tmp_path / "nan.py"
    nan.write_text(MODEL_FILE.replace("loss=F.cross_entropy(logits, labels)", "loss=F.cross_entropy(logits, labels) * float('nan')"))
    capsys.readouterr()
    assert main(["train", str(nan), "--model_dir", str(tmp_path / "nan_run")]) == 2
    error = capsys.readouterr().err
    assert "NaN or infinite loss at step 1" in error and "Traceback" not in error and len(error.splitlines()) == 1


@pytest.mark.slow
def test_demo_reaches_accuracy_and_resumes_when_rerun(tmp_path):
    model_dir = os.path.join("runs", "digits")  # relative, as the README runs it
    command = [sys.executable, "-m", "torchestimator.cli", "demo", "--model_dir", model_dir, "--no_progress"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "trained from scratch" in first.stdout
    accuracy = float(first.stdout.split("held-out accuracy ")[1].split(",")[0])
    best = float(first.stdout.split("best held-out accuracy ")[1].split(" ")[0])
    assert accuracy >= 0.95 and best >= accuracy
    best_export = first.stdout.split("best export: ")[1].split()[0]
    assert os.path.dirname(best_export) == os.path.join(model_dir, "export", "best")
    assert os.path.basename(best_export).isdigit()
    assert os.path.isfile(os.path.join(tmp_path, best_export, "program.json"))
    assert "final export: " in first.stdout and "torchestimator predict --exported" in first.stdout
    assert "torchestimator serve --model_name digits" in first.stdout
    assert os.path.isfile(os.path.join(tmp_path, model_dir, "metrics.png"))
    readme_serving_commands_answer(tmp_path, model_dir, first.stdout)
    second = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout and "instead of starting over" in second.stdout
    assert float(second.stdout.split("held-out accuracy ")[1].split(",")[0]) >= 0.95


def readme_serving_commands_answer(cwd, model_dir, demo_output):
    """The README's export, serve and curl commands, run as written (the port aside) after the demo."""
    import json
    import socket
    import urllib.request

    request_file = demo_output.split("curl -d @")[1].split()[0]
    assert request_file == os.path.join(model_dir, "serving_request.json")
    export = subprocess.run([sys.executable, "-m", "torchestimator.cli", "export", "torchestimator.cli.demo", "--model_dir",
                             model_dir, "--export_dir", "export/digits"], capture_output=True, text=True, timeout=300,
                            cwd=cwd)
    assert export.returncode == 0, export.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "torchestimator.cli", "serve", "--model_name", "digits",
                               "--model_base_path", "export/digits", "--rest_api_port", str(port)], cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/v1/models/digits:predict"
        with open(os.path.join(cwd, request_file), "rb") as handle:
            body = handle.read()
        # The "serving ..." line comes only once the port answers with the model loaded: one request, no retry.
        ready, _, _ = select.select([server.stdout], [], [], 120)
        assert ready, "serve printed nothing within 120 s"
        line = server.stdout.readline()
        assert line.startswith("serving digits (version ") and "AVAILABLE) at http://127.0.0.1:" in line, line
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as response:
            predictions = json.load(response)["predictions"]
        assert len(predictions) == 2 and all(0 <= row["class"] <= 9 for row in predictions)
        assert all(abs(sum(row["probabilities"]) - 1) < 1e-5 for row in predictions)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_warm_start_dry_run_reports_without_loading(tmp_path, model_file, capsys):
    model_dir = str(tmp_path / "run")
    assert main(["train", model_file, "--model_dir", model_dir, "--max_steps", "5"]) == 0
    capsys.readouterr()
    assert main(["warm-start", model_dir, "--model", model_file, "--dry-run"]) == 0
    report = capsys.readouterr().out
    assert "0.weight" in report and "2.bias" in report
    assert main(["warm-start", model_dir, "--model", model_file, "--dry-run", "--param", "hidden=16"]) == 1
    assert "doesn't match" in capsys.readouterr().out
    assert main(["warm-start", str(tmp_path / "missing.pt"), "--model", model_file, "--dry-run"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_export_then_predict_with_the_exported_model_alone(tmp_path, model_file, capsys):
    import numpy as np

    model_dir = str(tmp_path / "run")
    assert main(["train", model_file, "--model_dir", model_dir]) == 0
    assert main(["export", model_file, "--model_dir", model_dir, "--export_dir", str(tmp_path / "export")]) == 0
    exported = capsys.readouterr().out.strip().split()[-1]
    assert os.path.basename(exported).isdigit()
    assert main(["predict", model_file, "--model_dir", model_dir, "--output", str(tmp_path / "rows.jsonl")]) == 0
    expected = [json.loads(line)["class"] for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)[:5]
    np.savez(tmp_path / "inputs.npz", x=x)
    assert main(["predict", "--exported", str(tmp_path / "export"), "--input", str(tmp_path / "inputs.npz")]) == 0
    outputs = json.loads(capsys.readouterr().out)
    assert outputs["class"] == expected


def test_train_and_evaluate_command(tmp_path, model_file, capsys):
    model_dir = str(tmp_path / "run")
    assert main(["train-and-evaluate", model_file, "--model_dir", model_dir, "--max_steps", "10"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["results"]["global_step"] == 10 and "accuracy" in printed["results"]
    from torchestimator._io.summary import read_scalars

    assert [step for step, _ in read_scalars(os.path.join(model_dir, "eval"))["accuracy"]] == [5, 10]
    # --max_steps wins over a model file's own train_spec.
    with_spec = tmp_path / "with_spec.py"
    with_spec.write_text(MODEL_FILE + "\ntrain_spec = te.TrainSpec(train_input_fn, max_steps=5)\n")
    assert main(["train-and-evaluate", str(with_spec), "--model_dir", str(tmp_path / "spec_run"), "--max_steps", "15"]) == 0
    assert json.loads(capsys.readouterr().out)["results"]["global_step"] == 15


def test_evaluator_flag_evaluates_existing_checkpoints(tmp_path, model_file, capsys):
    model_dir = str(tmp_path / "run")
    assert main(["train", model_file, "--model_dir", model_dir, "--max_steps", "10"]) == 0
    capsys.readouterr()
    assert main(["train-and-evaluate", model_file, "--model_dir", model_dir, "--max_steps", "10", "--evaluator",
                 "--poll_secs", "0.1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["results"]["global_step"] == 10  # the evaluator reached the final step and stopped
    # The model file's best policy reaches the evaluator: it records the best in best.json.
    with_best = tmp_path / "with_best.py"
    with_best.write_text(MODEL_FILE + "\nbest = te.BestCheckpointPolicy('loss')\n")
    assert main(["train-and-evaluate", str(with_best), "--model_dir", model_dir, "--max_steps", "10", "--evaluator",
                 "--poll_secs", "0.1"]) == 0
    capsys.readouterr()
    from torchestimator._policy.best import best_checkpoint
    from torchestimator.checkpoint import CheckpointStore

    assert best_checkpoint(CheckpointStore(model_dir)).endswith("ckpt-10")


def test_predict_refuses_random_weights_unless_allowed(tmp_path, model_file, capsys, caplog):
    empty = str(tmp_path / "never_trained")
    output = tmp_path / "rows.jsonl"
    with pytest.raises(SystemExit) as refused:
        main(["predict", model_file, "--model_dir", empty, "--output", str(output)])
    assert "--allow_untrained" in str(refused.value.code) and empty in str(refused.value.code)
    assert not output.exists()  # nothing written
    with caplog.at_level(logging.WARNING, logger="torchestimator"):
        assert main(["predict", model_file, "--model_dir", empty, "--output", str(output), "--allow_untrained"]) == 0
    assert len(output.read_text().splitlines()) > 0
    assert "freshly initialised (random) weights" in caplog.text  # the library says so too
