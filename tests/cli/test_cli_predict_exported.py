"""`predict --exported` takes the flags that apply to an export, applies them, and refuses the others by name.

It ignored --predict_keys, --limit, --checkpoint_path, --allow_untrained, --param, --model_dir and a
positional FILE.py without a word; an empty signature_name (TF Serving's default) was "not found";
OUT.NPZ got JSON.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from torchestimator.cli import main

MODEL_FILE = """
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
import torchestimator as te
from torchestimator import export as te_export

config = te.RunConfig(log_step_count_steps=None, progress_bar=False, save_checkpoints_steps=2, random_seed=0)
max_steps = 2
X = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64)

def model(params):
    return nn.Linear(3, 2)

def model_fn(model, features, labels, mode):
    logits = model(features["x"])
    predictions = {"class": logits.argmax(-1), "logits": logits}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))

def optimizer(parameters):
    return torch.optim.SGD(parameters, lr=0.1)

def train_input_fn():
    return te.numpy_input_fn({"x": X}, Y, batch_size=4, num_epochs=None, shuffle=False)()

def predict_input_fn():
    return te.numpy_input_fn({"x": X}, batch_size=4, shuffle=False)()

serving_input_receiver = te_export.serving_input_receiver({"x": te_export.TensorSpec(shape=(None, 3))})
"""
ROWS = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)[:3].tolist()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A folder with model.py, its model_dir run/, its export under export/ and a request file."""
    folder = tmp_path_factory.mktemp("exported")
    (folder / "model.py").write_text(MODEL_FILE)
    model_file, run = str(folder / "model.py"), str(folder / "run")
    assert main(["train", model_file, "--model_dir", run]) == 0
    assert main(["export", model_file, "--model_dir", run, "--export_dir", str(folder / "export")]) == 0
    (folder / "request.json").write_text(json.dumps({"instances": ROWS}))
    return folder


@pytest.fixture
def here(exported, monkeypatch):
    monkeypatch.chdir(exported)
    return exported


def predict_exported(*flags: str) -> int:
    return main(["predict", "--exported", "export", "--input", "request.json", *flags])


def answer(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--checkpoint_path", "run/ckpt-2"],
            "--checkpoint_path does not apply to --exported: the export holds the "
            "weights of the checkpoint it was made from.",
        ),
        (["--allow_untrained"], "--allow_untrained does not apply to --exported"),
        (
            ["--param", "hidden=3"],
            "--param does not apply to --exported: params were fixed when the model was exported.",
        ),
        (["--model_dir", "run"], "--model_dir does not apply to --exported"),
        (["model.py"], "FILE.py ('model.py') does not apply to --exported"),
        (["--limit", "1"], "--limit does not apply to --exported: the request file says which rows to run"),
        (
            ["--predict_keys", "klass"],
            "--predict_keys klass: not an output of export (signature 'serving_default'); "
            "its outputs are class, logits.",
        ),
    ],
)
def test_flags_that_do_not_apply_are_one_line_exit_2(here, capsys, flags, message):
    assert predict_exported(*flags) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err == f"torchestimator predict: error: {message}\n" or message in captured.err, captured.err


def test_flags_of_exported_are_refused_with_a_model_file(here, capsys):
    assert main(["predict", "model.py", "--model_dir", "run", "--input", "request.json"]) == 2
    assert capsys.readouterr().err == (
        "torchestimator predict: error: --input applies only with --exported: with "
        "FILE.py, its predict_input_fn gives the examples.\n"
    )
    assert main(["predict", "model.py", "--model_dir", "run", "--signature_name", "serving_default"]) == 2
    assert "--signature_name applies only with --exported" in capsys.readouterr().err


def test_predict_keys_filters_the_outputs(here, capsys):
    assert predict_exported() == 0
    rows = answer(capsys)["predictions"]
    assert [sorted(row) for row in rows] == [["class", "logits"]] * 3
    assert predict_exported("--predict_keys", "class") == 0
    assert answer(capsys) == {"predictions": [row["class"] for row in rows]}  # one output: values, as the server
    assert predict_exported("--predict_keys", "logits", "class") == 0
    assert answer(capsys) == {"predictions": rows}
    np.savez("inputs.npz", x=np.array(ROWS, dtype=np.float32))
    assert main(["predict", "--exported", "export", "--input", "inputs.npz", "--predict_keys", "logits"]) == 0
    assert answer(capsys) == {"logits": [row["logits"] for row in rows]}


def test_an_empty_signature_name_is_serving_default(here, capsys):
    """TF Serving's rule (predict_util.cc), in a request file and in --signature_name ''."""
    assert predict_exported() == 0
    expected = answer(capsys)
    (here / "empty_name.json").write_text(json.dumps({"signature_name": "", "instances": ROWS}))
    assert main(["predict", "--exported", "export", "--input", "empty_name.json"]) == 0
    assert answer(capsys) == expected
    assert predict_exported("--signature_name", "") == 0
    assert answer(capsys) == expected
    assert (
        main(["predict", "--exported", "export", "--input", "empty_name.json", "--signature_name", "serving_default"])
        == 0
    )
    assert answer(capsys) == expected


def test_npz_suffixes_are_read_in_any_case(here, capsys):
    assert predict_exported("--output", "answer.NPZ") == 0
    with np.load("answer.NPZ") as written:  # arrays, not JSON
        assert sorted(written.files) == ["class", "logits"] and written["class"].shape == (3,)
        classes = written["class"].tolist()
    with open("INPUTS.NPZ", "wb") as handle:  # a handle: np.savez("INPUTS.NPZ") would write INPUTS.NPZ.npz
        np.savez(handle, x=np.array(ROWS, dtype=np.float32))
    assert main(["predict", "--exported", "export", "--input", "INPUTS.NPZ", "--predict_keys", "class"]) == 0
    assert answer(capsys) == {"class": classes}
