"""The command line: train, evaluate, predict, inspect and demo, on real files."""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys

import pytest
from helpers import CLI_MODEL_FILE, FIXTURES, one_line_error

from torchestimator.cli import main


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(CLI_MODEL_FILE)
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
    broken = tmp_path / "broken.py"
    broken.write_text(CLI_MODEL_FILE.replace("def eval_input_fn", "def other_input_fn"))
    assert main(["evaluate", str(broken), "--model_dir", str(tmp_path / "run")]) == 2
    assert one_line_error(capsys) == (
        f"torchestimator evaluate: error: {broken} does not define 'eval_input_fn', which this command needs."
    )
    assert (
        main(["export", "no_such_module.demo", "--model_dir", str(tmp_path / "run"), "--export_dir", str(tmp_path)])
        == 2
    )
    assert "no model file or module 'no_such_module.demo'" in one_line_error(capsys)
    assert main(["train", str(tmp_path / "missing.py"), "--model_dir", str(tmp_path / "run")]) == 2
    assert "missing.py' does not exist" in one_line_error(capsys)
    assert main(["train", model_file, "--model_dir", str(tmp_path / "run"), "--param", "lr"]) == 2
    assert "--param expects NAME=VALUE; received 'lr'" in one_line_error(capsys)
    # A NaN loss (a TorchEstimatorError that is no ValueError) is one line too, naming the step.
    nan = tmp_path / "nan.py"
    nan.write_text(
        CLI_MODEL_FILE.replace(
            "loss=F.cross_entropy(logits, labels)", "loss=F.cross_entropy(logits, labels) * float('nan')"
        )
    )
    capsys.readouterr()
    assert main(["train", str(nan), "--model_dir", str(tmp_path / "nan_run")]) == 2
    assert "NaN or infinite loss at step 1" in one_line_error(capsys)


def test_a_mistyped_module_name_is_one_line_exit_2_in_a_real_process(tmp_path):
    """As a user types it: the installed command, no traceback, exit status 2, and the right name suggested."""
    command = [sys.executable, "-m", "torchestimator.cli", "train", "torchestimator.cli.demoo", "--model_dir", "x"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert "no model file or module 'torchestimator.cli.demoo'" in done.stderr
    assert "did you mean torchestimator.cli.demo?" in done.stderr
    assert not os.path.exists(tmp_path / "x")  # refused before anything was made


def test_messages_name_the_model_file_as_given_never_an_internal_module_name(tmp_path, monkeypatch, capsys):
    from torchestimator.cli.model_file import load_model_file, require

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "model.py").write_text(CLI_MODEL_FILE.replace("def eval_input_fn", "def other_input_fn"))
    assert main(["evaluate", "model.py", "--model_dir", "run"]) == 2
    error = one_line_error(capsys)
    assert (
        error == "torchestimator evaluate: error: model.py does not define 'eval_input_fn', which this command needs."
    )
    # The module is named as `import model` would name it, so its loggers and classes read naturally...
    module = load_model_file("model.py")
    assert module.__name__ == "model" and sys.modules["model"] is module and module.model_fn.__module__ == "model"
    # ...unless that name is another module's: json.py must not replace the json package.
    (tmp_path / "json.py").write_text("VALUE = 1\n")
    shadowing = load_model_file("json.py")
    assert shadowing.__name__ == "json_py" and sys.modules["json"] is json and shadowing.VALUE == 1
    with pytest.raises(Exception, match=r"^json\.py does not define 'model_fn'"):
        require(shadowing, "model_fn")
    # Loading a model file again (another test, another folder) replaces the earlier one under its name.
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "model.py").write_text("VALUE = 2\n")
    assert load_model_file(os.path.join("again", "model.py")).VALUE == 2 and sys.modules["model"].VALUE == 2
    monkeypatch.delitem(sys.modules, "model")
    monkeypatch.delitem(sys.modules, "json_py")


def test_a_model_file_that_raises_at_import_shows_where(tmp_path, monkeypatch, capsys):
    """Its own bug: the traceback of its frames (not importlib's); a torchestimator error: one line, file and line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "buggy.py").write_text("import math\n\ndef scale():\n    return math.sqrt(-1)\n\nSCALE = scale()\n")
    assert main(["train", "buggy.py", "--model_dir", "run"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("torchestimator train: error: buggy.py raised ValueError while being imported:\n")
    assert 'buggy.py", line 6, in <module>' in error and 'buggy.py", line 4, in scale' in error
    assert error.rstrip().endswith("ValueError: math domain error")
    assert "importlib" not in error and "model_file.py" not in error
    (tmp_path / "refused.py").write_text(
        "import torchestimator as te\n\nconfig = te.RunConfig(save_checkpoints_steps=-3)\n"
    )
    assert main(["train", "refused.py", "--model_dir", "run"]) == 2
    error = one_line_error(capsys)
    assert error.startswith("torchestimator train: error: refused.py, line 3: RunConfig.save_checkpoints_steps")
    (tmp_path / "needs.py").write_text("import no_such_package_here\n")
    assert main(["train", "needs.py", "--model_dir", "run"]) == 2
    error = capsys.readouterr().err
    assert "needs.py raised ModuleNotFoundError" in error and "No module named 'no_such_package_here'" in error
    assert not (tmp_path / "run").exists()


DEMO_DIR = os.path.join("runs", "digits")  # relative, as the README runs it
DEMO_COMMAND = [sys.executable, "-m", "torchestimator.cli", "demo", "--model_dir", DEMO_DIR, "--no_progress"]


@pytest.fixture(scope="module")
def trained_demo(tmp_path_factory):
    """The default demo, trained once into a fresh folder: (that folder, what the demo printed)."""
    cwd = tmp_path_factory.mktemp("demo")
    first = subprocess.run(DEMO_COMMAND, capture_output=True, text=True, timeout=240, cwd=cwd)
    assert first.returncode == 0, first.stderr
    return cwd, first.stdout


@pytest.mark.slow
def test_demo_trains_from_scratch_to_accuracy_and_keeps_the_best(trained_demo):
    cwd, printed = trained_demo
    assert "trained from scratch" in printed
    accuracy = float(printed.split("held-out accuracy ")[1].split(",")[0])
    best = float(printed.split("best held-out accuracy ")[1].split(" ")[0])
    assert accuracy >= 0.95 and best >= accuracy
    assert os.path.isfile(os.path.join(cwd, DEMO_DIR, "metrics.png"))


@pytest.mark.slow
def test_demo_exports_best_and_final_versions(trained_demo):
    cwd, printed = trained_demo
    best_export = printed.split("best export: ")[1].split()[0]
    assert os.path.dirname(best_export) == os.path.join(DEMO_DIR, "export", "best")
    assert os.path.basename(best_export).isdigit()
    assert os.path.isfile(os.path.join(cwd, best_export, "program.json"))
    final_export = printed.split("final export: ")[1].split()[0]
    assert os.path.isfile(os.path.join(cwd, final_export, "program.json"))
    assert f"torchestimator predict --exported {os.path.dirname(best_export)} --input" in printed
    assert "torchestimator serve --model_name digits" in printed


@pytest.mark.slow
def test_readme_export_serve_and_ask_after_the_demo(trained_demo):
    cwd, printed = trained_demo
    readme_serving_commands_answer(cwd, DEMO_DIR, printed)


@pytest.mark.slow
def test_demo_rerun_resumes_instead_of_starting_over(trained_demo, tmp_path):
    import shutil

    cwd, _ = trained_demo
    shutil.copytree(os.path.join(cwd, DEMO_DIR), tmp_path / DEMO_DIR)  # the other tests keep their own
    second = subprocess.run(DEMO_COMMAND, capture_output=True, text=True, timeout=240, cwd=tmp_path)
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
    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchestimator.cli",
            "export",
            "torchestimator.cli.demo",
            "--model_dir",
            model_dir,
            "--export_dir",
            "export/digits",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert export.returncode == 0, export.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchestimator.cli",
            "serve",
            "--model_name",
            "digits",
            "--model_base_path",
            "export/digits",
            "--rest_api_port",
            str(port),
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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


def test_predict_exported_answers_a_tf_serving_request_file_as_the_server_does(tmp_path, model_file, capsys):
    """Row ({"instances"}, plain values or objects, signature_name) and columnar ({"inputs"}) request files get
    the server's own answer: {"predictions": ...} and {"outputs": ...}; .npz keeps working."""
    import urllib.request

    import numpy as np

    from torchestimator.serving import start

    model_dir, export = str(tmp_path / "run"), str(tmp_path / "export")
    assert main(["train", model_file, "--model_dir", model_dir]) == 0
    assert main(["export", model_file, "--model_dir", model_dir, "--export_dir", export]) == 0
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)[:3]
    requests = {
        "rows.json": {"instances": x.tolist()},
        "named_rows.json": {"signature_name": "serving_default", "instances": [{"x": row} for row in x.tolist()]},
        "columns.json": {"inputs": {"x": x.tolist()}},
        "plain_columns.json": {"inputs": x.tolist()},
    }
    capsys.readouterr()
    with start("m", export, port=0) as server:
        for name, request in requests.items():
            (tmp_path / name).write_text(json.dumps(request))
            assert main(["predict", "--exported", export, "--input", str(tmp_path / name)]) == 0
            printed = json.loads(capsys.readouterr().out)
            posted = urllib.request.Request(f"{server.url}/v1/models/m:predict", data=json.dumps(request).encode())
            with urllib.request.urlopen(posted, timeout=30) as response:
                assert printed == json.load(response), name
    classes = json.loads(json.dumps(printed))["outputs"]
    assert len(classes) == 3 and all(value in (0, 1) for value in classes)
    assert (
        main(
            [
                "predict",
                "--exported",
                export,
                "--input",
                str(tmp_path / "rows.json"),
                "--output",
                str(tmp_path / "answer.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "answer.json").read_text()) == {"predictions": classes}
    assert (
        main(
            [
                "predict",
                "--exported",
                export,
                "--input",
                str(tmp_path / "columns.json"),
                "--output",
                str(tmp_path / "answer.npz"),
            ]
        )
        == 0
    )
    assert np.load(tmp_path / "answer.npz")["class"].tolist() == classes
    # Mistakes name the file, in the server's words.
    (tmp_path / "wrong.json").write_text(json.dumps({"instances": [[1.0, 2.0]]}))
    assert main(["predict", "--exported", export, "--input", str(tmp_path / "wrong.json")]) == 2
    error = one_line_error(capsys)
    assert f"{tmp_path / 'wrong.json'}: Input 'x' has shape [1, 2]" in error
    (tmp_path / "neither.json").write_text(json.dumps({"x": x.tolist()}))
    assert main(["predict", "--exported", export, "--input", str(tmp_path / "neither.json")]) == 2
    assert "Missing 'inputs' or 'instances' key" in one_line_error(capsys)
    assert (
        main(
            ["predict", "--exported", export, "--input", str(tmp_path / "named_rows.json"), "--signature_name", "other"]
        )
        == 2
    )
    assert "--signature_name 'other' differs from the request's signature_name 'serving_default'" in one_line_error(
        capsys
    )
    assert main(["predict", "--exported", export]) == 2
    assert "predict --exported needs --input FILE" in one_line_error(capsys)


def test_inspect_reads_tensorflow_and_keras_files_without_a_manifest_warning(caplog, capsys):
    """A TF checkpoint folder's 'checkpoint' text file is not our manifest: no 'manifest unreadable' warning."""
    fixtures = str(FIXTURES)
    cases = {
        os.path.join("tf_checkpoint", "tf2"): "model/_functional/_operations/2/moving_mean",
        os.path.join("tf_checkpoint", "tf1"): "batch_normalization/beta/Adam",
        os.path.join("tf_checkpoint", "tf2", "ckpt-1.index"): "_CHECKPOINTABLE_OBJECT_GRAPH",
        os.path.join("keras", "keras3_model.keras"): "layers/batch_normalization/vars/0",
    }
    for path, variable in cases.items():
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert main(["inspect", os.path.join(fixtures, path)]) == 0
        assert variable in capsys.readouterr().out
        assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == [], path


def test_train_and_evaluate_command(tmp_path, model_file, capsys):
    model_dir = str(tmp_path / "run")
    assert main(["train-and-evaluate", model_file, "--model_dir", model_dir, "--max_steps", "10"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["results"]["global_step"] == 10 and "accuracy" in printed["results"]
    from torchestimator._io.summary import read_scalars

    assert [step for step, _ in read_scalars(os.path.join(model_dir, "eval"))["accuracy"]] == [5, 10]
    # --max_steps wins over a model file's own train_spec.
    with_spec = tmp_path / "with_spec.py"
    with_spec.write_text(CLI_MODEL_FILE + "\ntrain_spec = te.TrainSpec(train_input_fn, max_steps=5)\n")
    assert (
        main(["train-and-evaluate", str(with_spec), "--model_dir", str(tmp_path / "spec_run"), "--max_steps", "15"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["results"]["global_step"] == 15


def test_evaluator_flag_evaluates_existing_checkpoints(tmp_path, model_file, capsys):
    model_dir = str(tmp_path / "run")
    assert main(["train", model_file, "--model_dir", model_dir, "--max_steps", "10"]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "train-and-evaluate",
                model_file,
                "--model_dir",
                model_dir,
                "--max_steps",
                "10",
                "--evaluator",
                "--poll_secs",
                "0.1",
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["results"]["global_step"] == 10  # the evaluator reached the final step and stopped
    # The model file's best policy reaches the evaluator: it records the best in best.json.
    with_best = tmp_path / "with_best.py"
    with_best.write_text(CLI_MODEL_FILE + "\nbest = te.BestCheckpointPolicy('loss')\n")
    assert (
        main(
            [
                "train-and-evaluate",
                str(with_best),
                "--model_dir",
                model_dir,
                "--max_steps",
                "10",
                "--evaluator",
                "--poll_secs",
                "0.1",
            ]
        )
        == 0
    )
    capsys.readouterr()
    from torchestimator._policy.best import best_checkpoint
    from torchestimator.checkpoint import CheckpointStore

    assert best_checkpoint(CheckpointStore(model_dir)).endswith("ckpt-10")


def test_predict_refuses_random_weights_unless_allowed(tmp_path, model_file, capsys, caplog):
    empty = str(tmp_path / "never_trained")
    output = tmp_path / "rows.jsonl"
    assert main(["predict", model_file, "--model_dir", empty, "--output", str(output)]) == 2
    error = one_line_error(capsys)
    assert "--allow_untrained" in error and empty in error
    assert not output.exists()  # nothing written
    with caplog.at_level(logging.WARNING, logger="torchestimator"):
        assert main(["predict", model_file, "--model_dir", empty, "--output", str(output), "--allow_untrained"]) == 0
    assert len(output.read_text().splitlines()) > 0
    assert "freshly initialised (random) weights" in caplog.text  # the library says so too


def test_demo_reads_the_digits_load_digits_gives():
    """The demo reads scikit-learn's digits file directly (importing sklearn.datasets costs seconds): the same
    pixels and targets as sklearn.datasets.load_digits()."""
    import numpy as np
    from sklearn.datasets import load_digits

    from torchestimator.cli import demo

    pixels, targets = demo._read_digits()
    expected = load_digits()
    np.testing.assert_array_equal(pixels, expected.data)
    np.testing.assert_array_equal(targets, expected.target)
    assert targets.dtype == np.int64 and pixels.shape == (1797, 64)
