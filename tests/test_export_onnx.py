"""export_saved_model(as_onnx=True) and `export --onnx`: model.onnx run in onnxruntime against Estimator.predict.

The tests that convert need onnx and onnxscript, those that run the file onnxruntime
(pip install 'torchestimator[onnx]'); without them they skip. The missing-package
tests need none of them: they hide the packages.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import CLI_MODEL_FILE, SmallNet, classifier_model_fn, make_classification, make_estimator, one_line_error

import torchestimator as te
from torchestimator.cli import main
from torchestimator.errors import ConfigError, MissingExtraError
from torchestimator.export import (
    PredictOutput,
    RegressionOutput,
    TensorSpec,
    export_saved_model,
    load,
    onnx_export,
    serving_input_receiver,
)

ATOL = 1e-5


def onnxruntime():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    return pytest.importorskip("onnxruntime")


def session(export_dir):
    return onnxruntime().InferenceSession(os.path.join(export_dir, "model.onnx"), providers=["CPUExecutionProvider"])


def run_onnx(export_dir, inputs):
    """{ONNX output name: array} for one call of model.onnx."""
    runner = session(export_dir)
    names = [output.name for output in runner.get_outputs()]
    return dict(zip(names, runner.run(None, inputs)))


# ----------------------------------------------------------------------------- the three models


def regressor_model_fn(model, features, labels, mode):
    value = model(features["x"]).squeeze(-1)
    predictions = {"value": value}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={"serving_default": PredictOutput(predictions), "regression": RegressionOutput(value)},
        )
    return te.EstimatorSpec(mode, predictions=predictions, loss=F.mse_loss(value, labels))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, image):
        return self.head(self.features(image).flatten(1))


def cnn_model_fn(model, features, labels, mode):
    return classifier_model_fn(model, {"x": features["image"]}, labels, mode)


class WideAndDeep(nn.Module):
    """Two inputs of two dtypes: dense features and category ids (an embedding: ONNX Gather on int64)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.head = nn.Linear(8 + 4, 3)

    def forward(self, x, ids):
        return self.head(torch.cat([x, self.embedding(ids).mean(1)], dim=1))


def wide_and_deep_model_fn(model, features, labels, mode):
    logits = model(features["x"], features["ids"])
    predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))


def _wide_and_deep_data():
    x, labels = make_classification(64)
    return {"x": x, "ids": np.random.default_rng(0).integers(0, 10, size=(64, 2))}, labels


def _regression_data():
    x, _ = make_classification(64)
    return {"x": x}, (x @ np.linspace(-1, 1, 8, dtype=np.float32)).astype(np.float32)


def _image_data():
    x, labels = make_classification(64, features=64)
    return {"image": x.reshape(-1, 1, 8, 8)}, labels


MODELS = {  # name: (model, model_fn, receiver, data)
    "classifier": (
        SmallNet,
        classifier_model_fn,
        {"x": TensorSpec(shape=(None, 8))},
        lambda: ({"x": make_classification(64)[0]}, make_classification(64)[1]),
    ),
    "regressor": (
        lambda: nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)),
        regressor_model_fn,
        {"x": TensorSpec(shape=(None, 8))},
        _regression_data,
    ),
    "cnn": (SmallCNN, cnn_model_fn, {"image": TensorSpec(shape=(None, 1, 8, 8))}, _image_data),
    "wide_and_deep": (
        WideAndDeep,
        wide_and_deep_model_fn,
        {"x": TensorSpec(shape=(None, 8)), "ids": TensorSpec(shape=(None, 2), dtype=torch.int64)},
        _wide_and_deep_data,
    ),
}
ONNX_TYPES = {torch.float32: "tensor(float)", torch.int64: "tensor(int64)"}


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    """One model trained a few steps and exported with model.onnx."""
    onnxruntime()
    build, model_fn, receiver_tensors, data = MODELS[request.param]
    root = tmp_path_factory.mktemp(f"onnx_{request.param}")
    features, labels = data()
    estimator = make_estimator(root / "model", model=build, model_fn=model_fn)
    estimator.train(te.numpy_input_fn(features, labels, batch_size=16, num_epochs=None, shuffle=True), max_steps=5)
    export_dir = export_saved_model(estimator, root / "export", serving_input_receiver(receiver_tensors), as_onnx=True)
    return {
        "name": request.param,
        "estimator": estimator,
        "export_dir": export_dir,
        "features": features,
        "receiver": receiver_tensors,
    }


@pytest.mark.parametrize("batch", [1, 7])
def test_model_onnx_in_onnxruntime_equals_estimator_predict(exported, batch):
    inputs = {name: values[:batch] for name, values in exported["features"].items()}
    predicted = next(
        iter(
            exported["estimator"].predict(
                te.numpy_input_fn(inputs, batch_size=batch, shuffle=False), yield_single_examples=False
            )
        )
    )
    outputs = run_onnx(exported["export_dir"], inputs)
    record = load(exported["export_dir"]).metadata["onnx"]
    served = record["signatures"]["serving_default"]["outputs"]
    assert set(served) == set(predicted)
    for alias, onnx_name in served.items():
        assert outputs[onnx_name].shape == predicted[alias].shape and outputs[onnx_name].dtype == predicted[alias].dtype
        np.testing.assert_allclose(outputs[onnx_name], predicted[alias], atol=ATOL, rtol=0, err_msg=alias)


def test_model_onnx_takes_the_receiver_inputs_with_a_dynamic_batch_and_names_outputs_as_signature_json(exported):
    export_dir = exported["export_dir"]
    runner = session(export_dir)
    inputs = runner.get_inputs()
    assert [value.name for value in inputs] == list(exported["receiver"])
    for value, spec in zip(inputs, exported["receiver"].values()):
        assert value.shape[0] == "batch"  # symbolic, named as the program's Dim: any batch size
        assert value.shape[1:] == list(spec.shape[1:]) and value.type == ONNX_TYPES[spec.dtype]
    signatures = json.loads(open(os.path.join(export_dir, "signature.json")).read())["signatures"]
    record = load(export_dir).metadata["onnx"]
    program_outputs = {
        alias: info["program_output"]
        for name, signature in signatures.items()
        for alias, info in signature["outputs"].items()
    }
    assert {
        alias: name for signature in record["signatures"].values() for alias, name in signature["outputs"].items()
    } == program_outputs
    assert [value.name for value in runner.get_outputs()] == [output["name"] for output in record["outputs"]]
    assert {value.shape[0] for value in runner.get_outputs()} == {"batch"}
    assert {output["name"] for output in record["outputs"]} == set(program_outputs.values())
    assert record["inputs"] == [
        {"name": name, "dtype": str(spec.dtype).removeprefix("torch."), "shape": [-1, *spec.shape[1:]]}
        for name, spec in exported["receiver"].items()
    ]
    assert record["files"] == ["model.onnx"] and record["opset"] >= 18
    # The file says the same by itself, for a model.onnx copied out of its folder.
    embedded = runner.get_modelmeta().custom_metadata_map[onnx_export.METADATA_PROPERTY]
    assert json.loads(embedded) == record
    if exported["name"] == "regressor":  # two signatures: each alias reaches its own output
        assert record["signatures"]["regression"] == {"method": "regress", "outputs": {"outputs": "regression/outputs"}}


class _Collecting(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_weights_past_the_single_file_limit_go_to_model_onnx_data_and_torchs_own_noise_is_dropped(
    tmp_path, monkeypatch
):
    onnxruntime()
    monkeypatch.setattr(onnx_export, "SINGLE_FILE_LIMIT", 0)
    features, labels = {"x": make_classification(64)[0]}, make_classification(64)[1]
    estimator = make_estimator(tmp_path / "model")
    estimator.train(te.numpy_input_fn(features, labels, batch_size=16, num_epochs=None, shuffle=True), max_steps=2)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8))})
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    heard = _Collecting()
    registration.addHandler(heard)  # torch's own handler writes to the stderr it found at import: listen here
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "error", FutureWarning
            )  # torch's own LeafSpec one, in the converter, must not fail it
            export_dir = export_saved_model(estimator, tmp_path / "export", receiver, as_onnx=True)
    finally:
        registration.removeHandler(heard)
    assert [message for message in heard.messages if "torchvision" in message] == []
    record = load(export_dir).metadata["onnx"]
    assert record["files"] == ["model.onnx", "model.onnx.data"]
    assert {"model.onnx", "model.onnx.data"} <= set(os.listdir(export_dir))
    predicted = next(
        iter(
            estimator.predict(
                te.numpy_input_fn({"x": features["x"][:5]}, batch_size=5, shuffle=False), yield_single_examples=False
            )
        )
    )
    outputs = run_onnx(export_dir, {"x": features["x"][:5]})
    np.testing.assert_allclose(outputs["serving_default/probabilities"], predicted["probabilities"], atol=ATOL)


# ----------------------------------------------------------------------------- what it refuses


@torch.library.custom_op("te_onnx_test::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    """An operator torch.export traces and torch.onnx has no translation for."""
    return x * 2


@doubled.register_fake
def _doubled_shape(x):
    return torch.empty_like(x)


def doubling_model_fn(model, features, labels, mode):
    return classifier_model_fn(model, {"x": torch.ops.te_onnx_test.doubled(features["x"])}, labels, mode)


def test_an_operator_onnx_cannot_express_is_an_error_naming_the_model_and_the_operator(tmp_path):
    onnxruntime()
    features, labels = {"x": make_classification(64)[0]}, make_classification(64)[1]
    estimator = make_estimator(tmp_path / "model", model_fn=doubling_model_fn)
    estimator.train(te.numpy_input_fn(features, labels, batch_size=16, num_epochs=None, shuffle=True), max_steps=2)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8))})
    with pytest.raises(ConfigError) as raised:
        export_saved_model(estimator, tmp_path / "export", receiver, as_onnx=True)
    message = str(raised.value)
    assert "model SmallNet" in message and "no ONNX translation for te_onnx_test.doubled.default" in message
    assert "export without as_onnx" in message and "\n" not in message
    assert raised.value.field == "as_onnx"
    assert not os.path.exists(tmp_path / "export") or os.listdir(tmp_path / "export") == []  # no version, no temp
    # Without as_onnx the same model exports: the torch.export program does not need ONNX.
    assert os.path.isdir(export_saved_model(estimator, tmp_path / "export", receiver))


class _BrokenImport:
    """A meta path finder whose module fails to import as a broken install does (its compiled part missing)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            raise ImportError(
                f"cannot import name 'onnx_cpp2py_export' from partially initialized module '{fullname}'", name=fullname
            )
        return None


def _hide(monkeypatch, module: str, *, broken: bool = False) -> None:
    """Makes `import module` fail as if not installed (or, broken=True, as if installed but broken)."""
    for name in [loaded for loaded in sys.modules if loaded.split(".")[0] == module]:
        monkeypatch.delitem(sys.modules, name)
    if broken:
        monkeypatch.setattr(sys, "meta_path", [_BrokenImport(module), *sys.meta_path])
    else:
        monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("module", ["onnx", "onnxscript"])
def test_as_onnx_without_the_packages_is_an_error_naming_the_extra_before_any_work(tmp_path, monkeypatch, module):
    _hide(monkeypatch, module)
    if module == "onnxscript":  # onnx is checked first: let it import where it is installed, else hide it too
        pytest.importorskip("onnx")
    estimator = make_estimator(tmp_path / "model")  # never trained: the package is checked before the weights
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8))})
    with pytest.raises(MissingExtraError) as raised:
        export_saved_model(estimator, tmp_path / "export", receiver, as_onnx=True)
    assert str(raised.value) == (
        f"ONNX export (as_onnx=True, export --onnx) needs {module}: pip install "
        "'torchestimator[onnx]'; or export without as_onnx (the torch.export program does "
        "not need it)"
    )
    assert raised.value.extra == "onnx" and raised.value.module == module
    assert not os.path.exists(tmp_path / "export")


def test_a_broken_onnx_install_is_named_with_its_cause(tmp_path, monkeypatch):
    _hide(monkeypatch, "onnx", broken=True)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8))})
    with pytest.raises(MissingExtraError) as raised:
        export_saved_model(make_estimator(tmp_path / "model"), tmp_path / "export", receiver, as_onnx=True)
    assert str(raised.value).startswith(
        "ONNX export (as_onnx=True, export --onnx) needs onnx, which could not be imported (cannot import name "
        "'onnx_cpp2py_export' from partially initialized module 'onnx'): pip install --upgrade 'torchestimator[onnx]'"
    )


# ----------------------------------------------------------------------------- the command line


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(CLI_MODEL_FILE)
    return str(path)


def test_cli_export_onnx_writes_model_onnx_that_answers_as_the_export(tmp_path, model_file, capsys, caplog):
    onnxruntime()
    model_dir, base = str(tmp_path / "run"), str(tmp_path / "export")
    assert main(["train", model_file, "--model_dir", model_dir]) == 0
    capsys.readouterr()
    caplog.set_level(logging.INFO)  # as the CLI's default --verbosity shows them
    assert main(["export", model_file, "--model_dir", model_dir, "--export_dir", base, "--onnx"]) == 0
    captured = capsys.readouterr()
    printed = captured.out.strip()
    assert printed.startswith("exported ") and len(printed.splitlines()) == 1  # the converter printed nothing
    # nor logged its optimizer passes' INFO lines ("Removed 20 unused nodes") among the CLI's own
    assert [record.name for record in caplog.records if record.name.startswith(("onnx_ir", "onnxscript"))] == []
    export_dir = printed.split()[-1]
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)[:7]
    np.testing.assert_array_equal(
        run_onnx(export_dir, {"x": x})["serving_default/class"], load(export_dir)({"x": x})["class"]
    )


def test_cli_export_onnx_without_the_packages_is_one_line_exit_2(tmp_path, model_file, monkeypatch, capsys):
    _hide(monkeypatch, "onnx")
    code = main(
        ["export", model_file, "--model_dir", str(tmp_path / "run"), "--export_dir", str(tmp_path / "export"), "--onnx"]
    )
    assert code == 2
    assert "needs onnx: pip install 'torchestimator[onnx]'" in one_line_error(capsys)
