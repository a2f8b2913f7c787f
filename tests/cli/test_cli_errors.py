"""What a failing command prints, by whose mistake it is (cli/__init__.py main, cli/model_file.py).

Ours (a TorchEstimatorError): one line. The user's, an error that passed through their model file:
its traceback, then one line saying where. Another ValueError/TypeError/OSError of our own code: one
line. Also the model file's name as given (a folder, a name that is no module), --param, Ctrl-C.
"""

from __future__ import annotations

import json
import logging
import textwrap

import pytest

from torchestimator.cli import main

MODEL_FILE = textwrap.dedent("""
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    params = {"hidden": 4}
    config = te.RunConfig(log_step_count_steps=None, progress_bar=False, save_checkpoints_steps=2)
    max_steps = 2
    X = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    Y = (X[:, 0] > 0).astype(np.int64)

    def model(params):
        return nn.Sequential(nn.Linear(3, params["hidden"]), nn.ReLU(), nn.Linear(params["hidden"], 2))

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)})
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels))

    def optimizer(parameters):
        return torch.optim.SGD(parameters, lr=0.1)

    def train_input_fn():
        return te.numpy_input_fn({"x": X}, Y, batch_size=4, num_epochs=None, shuffle=False)()

    def predict_input_fn():
        return te.numpy_input_fn({"x": X}, batch_size=4, shuffle=False)()
""")
MODEL_FN_LINE = MODEL_FILE.splitlines().index('    logits = model(features["x"])') + 1
MODEL_LINE = (
    MODEL_FILE.splitlines().index(
        '    return nn.Sequential(nn.Linear(3, params["hidden"]), nn.ReLU(), nn.Linear(params["hidden"], 2))'
    )
    + 1
)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # model files named as a user names them: model.py
    return tmp_path


def write_model(folder, text=MODEL_FILE, name="model.py"):
    (folder / name).write_text(text)
    return name


def one_line(capsys) -> str:
    error = capsys.readouterr().err
    assert "Traceback" not in error and len(error.splitlines()) == 1, error
    return error.strip()


def test_a_bug_in_model_fn_shows_its_traceback_then_where_it_is(folder, capsys):
    """It printed 'torchestimator train: error: bad in model_fn': no file, no line."""
    buggy = MODEL_FILE.replace(
        '    logits = model(features["x"])\n',
        '    logits = model(features["x"])\n    raise ValueError("bad in model_fn")\n',
    )
    write_model(folder, buggy)
    assert main(["train", "model.py", "--model_dir", "run"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("Traceback (most recent call last):\n")
    assert f'model.py", line {MODEL_FN_LINE + 1}, in model_fn\n' in error and "ValueError: bad in model_fn\n" in error
    assert error.splitlines()[-1] == (
        f"torchestimator train: error: ValueError in model.py, line {MODEL_FN_LINE + 1}, "
        "in model_fn (the traceback above): bad in model_fn"
    )


def test_a_bad_param_value_names_the_model_file_line_and_the_param(folder, capsys):
    """--param hidden=abc ended in torch's own words ('empty(): argument size ...'), naming neither."""
    write_model(folder)
    assert main(["train", "model.py", "--model_dir", "run", "--param", "hidden=abc"]) == 1
    error = capsys.readouterr().err
    assert f'model.py", line {MODEL_LINE}, in model' in error
    last = error.splitlines()[-1]
    assert last.startswith(
        f"torchestimator train: error: TypeError in model.py, line {MODEL_LINE}, in model (the "
        "traceback above); params from --param: hidden='abc': "
    )


def test_our_own_errors_stay_one_line_even_raised_inside_the_model_file(folder, capsys):
    # A TorchEstimatorError names what is wrong, wherever it was raised: one line, exit 2.
    refusing = MODEL_FILE.replace(
        '    logits = model(features["x"])\n',
        '    logits = model(features["x"])\n    te.RunConfig(save_checkpoints_steps=-3)\n',
    )
    write_model(folder, refusing, "refusing.py")
    assert main(["train", "refusing.py", "--model_dir", "run"]) == 2
    assert one_line(capsys).startswith("torchestimator train: error: RunConfig.save_checkpoints_steps")
    # An OSError of our own code, with a model file loaded and run: one line, exit 2.
    write_model(folder)
    assert main(["train", "model.py", "--model_dir", "run"]) == 0
    capsys.readouterr()
    assert main(["predict", "model.py", "--model_dir", "run", "--output", "no_such_folder/rows.jsonl"]) == 2
    assert "No such file or directory: 'no_such_folder/rows.jsonl'" in one_line(capsys)


def test_param_needs_a_name_and_an_unknown_name_is_a_warning(folder, capsys, caplog):
    write_model(folder)
    assert main(["train", "model.py", "--model_dir", "run", "--param", "=3"]) == 2
    assert one_line(capsys) == "torchestimator train: error: --param expects NAME=VALUE; received '=3'."
    # TF users pass hparams freely: warned (one line naming the known ones), passed on, the run goes on.
    with caplog.at_level(logging.WARNING, logger="torchestimator"):
        assert main(["train", "model.py", "--model_dir", "run", "--param", "hiden=8"]) == 0
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [
        "--param hiden: model.py's params has no 'hiden' (did you mean 'hidden'?); it has hidden. Passed on as given."
    ]
    assert json.load(open("run/params.json")) == {"hidden": 4, "hiden": 8}
    # A file that defines no params takes any name silently.
    write_model(folder, MODEL_FILE.replace('params = {"hidden": 4}', "").replace('params["hidden"]', "4"), "bare.py")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="torchestimator"):
        assert main(["train", "bare.py", "--model_dir", "bare_run", "--param", "anything=1"]) == 0
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "location, message",
    [
        (".", "model file '.' is a folder, not a model file (its .py files: model.py)."),
        (".tiny", "no model file or module '.tiny': it is neither FILE.py nor a module name"),
        ("my model", "no model file or module 'my model': it is neither FILE.py nor a module name"),
        ("sub/", "model file 'sub/' is a folder, not a model file."),
        ("sub", "no model file or module 'sub': no module named 'sub'"),
    ],
)
def test_a_model_file_that_is_a_folder_or_no_module_name_is_one_line(folder, capsys, location, message):
    """'.' and '.tiny' ended in importlib's TypeError; a folder was said not to exist."""
    write_model(folder)
    (folder / "sub").mkdir()
    assert main(["train", location, "--model_dir", "x"]) == 2
    error = one_line(capsys)
    assert error.startswith(f"torchestimator train: error: {message}"), error
    if location == "sub":
        assert "(sub here is a folder, not a model file)" in error
    assert not (folder / "x").exists()


def test_a_folder_given_by_its_absolute_path_is_called_a_folder(tmp_path, capsys):
    assert main(["train", str(tmp_path), "--model_dir", str(tmp_path / "x")]) == 2
    assert f"model file '{tmp_path}' is a folder, not a model file" in one_line(capsys)


def test_ctrl_c_says_interrupted(monkeypatch, capsys):
    """It printed 'torchestimator inspect: ' and nothing: the exception object is always true."""
    from torchestimator.cli import inspection

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(inspection, "describe", interrupted)
    assert main(["inspect", "anything"]) == 130
    assert capsys.readouterr().err == "torchestimator inspect: interrupted\n"
