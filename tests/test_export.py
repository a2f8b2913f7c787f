"""export_saved_model, the version folder it writes, and torchestimator.export.load."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import SmallNet, classifier_model_fn, input_fns, make_estimator

import torchestimator as te
from torchestimator.export import (
    ClassificationOutput,
    PredictOutput,
    RegressionOutput,
    TensorSpec,
    export_saved_model,
    list_versions,
    load,
    read_inputs,
    saved_model,
    serving_input_receiver,
)
from torchestimator.export.outputs import resolve_export_outputs

RECEIVER = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One trained estimator and one export of it, shared by the tests that only read."""
    root = tmp_path_factory.mktemp("export")
    train, _, predict, (x, _) = input_fns()
    estimator = make_estimator(root / "model")
    estimator.train(train, max_steps=20)
    asset = root / "vocabulary.txt"
    asset.write_text("cat\ndog\n")
    before = time.time()
    export_dir = export_saved_model(estimator, root / "export", RECEIVER, assets_extra={"vocab/words.txt": str(asset)})
    expected = {
        key: np.concatenate([batch[key] for batch in estimator.predict(predict, yield_single_examples=False)])
        for key in ("class", "probabilities")
    }
    return {
        "estimator": estimator,
        "export_dir": export_dir,
        "base": str(root / "export"),
        "x": x,
        "expected": expected,
        "before": before,
        "root": root,
    }


def test_export_writes_an_integer_version_with_program_signature_metadata_and_assets(exported):
    export_dir, base = exported["export_dir"], exported["base"]
    version = os.path.basename(export_dir)
    assert version.isdigit() and exported["before"] - 1 <= int(version) <= time.time()
    assert os.listdir(base) == [version]  # the temp folder was renamed, nothing else left behind
    assert set(os.listdir(export_dir)) == {
        "program.json",
        "tensors.safetensors",
        "signature.json",
        "metadata.json",
        "assets.extra",
    }
    with open(os.path.join(export_dir, "assets.extra", "vocab", "words.txt")) as handle:
        assert handle.read() == "cat\ndog\n"
    with open(os.path.join(export_dir, "signature.json")) as handle:
        signature = json.load(handle)["signatures"]["serving_default"]
    assert signature["method"] == "predict" and signature["method_name"] == "tensorflow/serving/predict"
    assert signature["inputs"] == {"x": {"dtype": "float32", "shape": [-1, 8]}}
    assert {key: (value["dtype"], value["shape"]) for key, value in signature["outputs"].items()} == {
        "class": ("int64", [-1]),
        "probabilities": ("float32", [-1, 3]),
    }
    with open(os.path.join(export_dir, "metadata.json")) as handle:
        metadata = json.load(handle)
    assert metadata["global_step"] == 20
    assert metadata["checkpoint_path"] == os.path.abspath(exported["estimator"].latest_checkpoint())
    assert metadata["torch_version"] == torch.__version__ and "created" in metadata


def test_loaded_model_gives_the_estimators_predictions_for_any_batch_size(exported):
    model = load(exported["base"])  # the base: its highest version
    assert model.path == exported["export_dir"] and model.signature_names == ["serving_default"]
    outputs = model({"x": exported["x"]})
    np.testing.assert_array_equal(outputs["class"], exported["expected"]["class"])
    np.testing.assert_allclose(outputs["probabilities"], exported["expected"]["probabilities"], rtol=1e-5, atol=1e-6)
    single = model({"x": torch.from_numpy(exported["x"][:1])}, output_keys=["class"])
    assert list(single) == ["class"] and single["class"].shape == (1,)
    from_lists = model({"x": exported["x"][:3].tolist()})  # JSON-style lists take the signature's dtype
    np.testing.assert_array_equal(from_lists["class"], exported["expected"]["class"][:3])


def test_loader_names_the_input_and_the_mismatch(exported):
    # InputError is a ValueError and InputTypeError also a TypeError: code catching the builtins still works.
    model = load(exported["export_dir"])
    x = exported["x"]
    with pytest.raises(te.errors.InputError, match=r"missing \['x'\], unexpected \['image'\]"):
        model({"image": x})
    with pytest.raises(te.errors.InputTypeError, match=r"Input 'x' has dtype float64; the signature expects float32"):
        model({"x": x.astype(np.float64)})
    with pytest.raises(te.errors.InputError, match=r"Input 'x' has shape \[4, 5\]; the signature expects \[-1, 8\]"):
        model({"x": x[:4, :5]})
    with pytest.raises(te.errors.InputError, match=r"Input 'x' could not be read as float32"):
        model({"x": [[1.0, "a"]]})
    with pytest.raises(te.errors.InputError, match="no signature 'classify'.*serving_default"):
        model({"x": x}, signature_name="classify")
    with pytest.raises(te.errors.InputError, match=r"no outputs \['logits'\]"):
        model({"x": x}, output_keys=["logits"])


def test_load_ignores_temp_and_non_integer_folders(exported, tmp_path):
    base = tmp_path / "serving"
    shutil.copytree(exported["export_dir"], base / "100")
    shutil.copytree(exported["export_dir"], base / "7")
    for leftover in ("temp-99999999999", "latest", "200.old"):
        (base / leftover).mkdir()
        (base / leftover / "model.pt2").write_bytes(b"half written")
    assert list_versions(base) == [7, 100]
    model = load(base)
    assert model.version == 100
    only_temp = tmp_path / "only_temp"
    (only_temp / "temp-1700000000").mkdir(parents=True)
    (only_temp / "private-notes.txt").write_text("not for the status page")
    with pytest.raises(ValueError, match="neither an export version") as raised:
        load(only_temp)
    # What was expected, never what the folder holds: this message reaches the server's status page.
    assert "program.json, tensors.safetensors and signature.json" in str(raised.value)
    assert "private-notes" not in str(raised.value) and "temp-1700000000" not in str(raised.value)


def test_an_exception_while_writing_leaves_no_version(exported, tmp_path, monkeypatch):
    base = tmp_path / "export"
    written = []

    def write_then_fail(path, data):
        if path.endswith("metadata.json"):
            written.extend(os.listdir(os.path.dirname(path)))  # the program and signature.json are already there
            with open(path, "w") as handle:
                handle.write('{"global_st')
            raise OSError("disk full")
        return original(path, data)

    original = saved_model._write_file
    monkeypatch.setattr(saved_model, "_write_file", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        export_saved_model(exported["estimator"], base, RECEIVER)
    assert "program.json" in written
    assert list_versions(base) == [] and os.listdir(base) == []
    with pytest.raises(ValueError, match="neither an export version"):
        load(base)


def test_no_usable_temporary_directory_while_tracing_is_an_oserror_naming_the_export(exported, tmp_path, monkeypatch):
    """torch.export writes caches under the temporary directory: when none can be written (a full /tmp, a file
    size limit), the error is the machine's (an OSError naming the export base), not "could not trace model_fn"
    with advice about the model; nothing is written."""
    import errno

    def no_temporary_directory(*arguments, **options):
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp', '/var/tmp']")

    monkeypatch.setattr(torch.export, "export", no_temporary_directory)
    base = tmp_path / "export"
    with pytest.raises(FileNotFoundError) as raised:
        export_saved_model(exported["estimator"], base, RECEIVER)
    message = str(raised.value)
    assert f"cannot export to {base}" in message and "No usable temporary directory" in message
    assert "Common causes" not in message
    assert not base.exists() or list_versions(base) == []


def test_version_name_waits_a_second_when_taken_and_gives_up_after_ten(tmp_path):
    (tmp_path / "100").mkdir()
    (tmp_path / "temp-a").mkdir()
    clock_values, sleeps = iter([100.2, 101.5]), []
    path = saved_model._rename_to_version(
        str(tmp_path / "temp-a"), str(tmp_path), clock=lambda: next(clock_values), sleep=sleeps.append
    )
    assert path == str(tmp_path / "101") and sleeps == [1] and not (tmp_path / "temp-a").exists()
    (tmp_path / "temp-b").mkdir()
    with pytest.raises(RuntimeError, match="after 10 attempts"):
        saved_model._rename_to_version(
            str(tmp_path / "temp-b"), str(tmp_path), clock=lambda: 100.0, sleep=lambda seconds: None
        )


# -- bad input at export time ------------------------------------------------------


def test_export_without_checkpoint_or_warm_start_is_an_error(tmp_path):
    estimator = make_estimator(tmp_path / "empty")
    with pytest.raises(ValueError, match="Couldn't find trained model at .*empty.*warm_start_from"):
        export_saved_model(estimator, tmp_path / "export", RECEIVER)
    with pytest.raises(ValueError, match="Couldn't find trained model at .*ckpt-5"):
        export_saved_model(estimator, tmp_path / "export", RECEIVER, checkpoint_path=str(tmp_path / "ckpt-5"))
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"image": TensorSpec(shape=(None, 8))},
            r"reads feature 'x', which the serving input receiver does not provide.*'image'",
        ),
        (
            {"x": TensorSpec(shape=(None, 10))},
            r"does not match the model.*feature 'x' \(float32, shape \[2, 10\].*shapes",
        ),
        (
            {"x": TensorSpec(shape=(None, 8), dtype=torch.float64)},
            r"does not match the model.*feature 'x' \(float64.*dtype",
        ),
    ],
)
def test_a_receiver_that_does_not_match_the_model_is_an_error_at_export_time(exported, tmp_path, spec, message):
    with pytest.raises(ValueError, match=message):
        export_saved_model(exported["estimator"], tmp_path / "export", serving_input_receiver(spec))
    assert list_versions(tmp_path / "export") == []


def test_bad_receiver_specs_and_assets_are_refused(exported, tmp_path):
    with pytest.raises(ValueError, match="non-negative ints or None"):
        TensorSpec(shape=(None, -1))
    with pytest.raises(TypeError, match="torch dtype.*'floaty'"):
        TensorSpec(shape=(None, 8), dtype="floaty")
    with pytest.raises(ValueError, match="non-empty dict"):
        serving_input_receiver({})
    with pytest.raises(TypeError, match="must be a TensorSpec"):
        serving_input_receiver({"x": [None, 8]})
    with pytest.raises(ValueError, match="relative path inside assets.extra"):
        export_saved_model(exported["estimator"], tmp_path / "e", RECEIVER, assets_extra={"../up.txt": __file__})
    with pytest.raises(ValueError, match="does not exist"):
        export_saved_model(
            exported["estimator"], tmp_path / "e", RECEIVER, assets_extra={"a.txt": str(tmp_path / "no")}
        )
    assert TensorSpec(shape=[None, 3], dtype="int64") == TensorSpec(shape=(None, 3), dtype=torch.int64)


# -- signatures from export_outputs -------------------------------------------------


def model_fn_with_signatures(model, features, labels, mode):
    logits = model(features["x"])
    probabilities = logits.softmax(-1)
    predictions = {"class": logits.argmax(-1), "probabilities": probabilities}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={
                "serving_default": PredictOutput(predictions),
                "classification": ClassificationOutput(scores=probabilities, classes=predictions["class"]),
                "regression": RegressionOutput(probabilities[:, 0]),
            },
        )
    return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))


def test_export_outputs_become_signatures_and_the_onnx_copy_names_them_alike(tmp_path):
    """Signatures from export_outputs; with the onnx packages (else tests/test_export_onnx.py says why not), model.onnx
    has one output per program output, each signature's alias naming it as signature.json does."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        as_onnx = False  # as_onnx=True without them is a MissingExtraError, tested in test_export_onnx.py
    else:
        as_onnx = True
    train, _, _, (x, _) = input_fns(n=64)
    estimator = make_estimator(tmp_path / "model", model_fn=model_fn_with_signatures)
    estimator.train(train, max_steps=10)
    export_dir = export_saved_model(estimator, tmp_path / "export", RECEIVER, as_onnx=as_onnx)
    model = load(export_dir)
    assert model.signature_names == ["classification", "regression", "serving_default"]
    classification = model.signature("classification")
    assert classification.method == "classify" and set(classification.outputs) == {"classes", "scores"}
    assert model.signature("regression").outputs["outputs"].shape == (-1,)
    predicted = model({"x": x[:6]})
    classified = model({"x": x[:6]}, signature_name="classification")
    regressed = model({"x": x[:6]}, signature_name="regression")
    np.testing.assert_array_equal(classified["classes"], predicted["class"])
    np.testing.assert_allclose(regressed["outputs"], predicted["probabilities"][:, 0], rtol=1e-6)
    if not as_onnx:
        assert "model.onnx" not in os.listdir(export_dir) and model.metadata["onnx"] is None
        return
    record = model.metadata["onnx"]
    assert "model.onnx" in os.listdir(export_dir) and record["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [-1, 8]}
    ]
    for name in model.signature_names:
        signature = model.signature(name)
        assert record["signatures"][name] == {"method": signature.method, "outputs": signature.program_outputs}
    # classification's classes is serving_default's class tensor: ONNX still gives each program output its own name.
    assert sorted(output["name"] for output in record["outputs"]) == [
        "classification/classes",
        "classification/scores",
        "regression/outputs",
        "serving_default/class",
        "serving_default/probabilities",
    ]
    try:
        import onnxruntime
    except ImportError:
        return
    session = onnxruntime.InferenceSession(os.path.join(export_dir, "model.onnx"), providers=["CPUExecutionProvider"])
    answered = dict(zip([output.name for output in session.get_outputs()], session.run(None, {"x": x[:6]})))
    np.testing.assert_array_equal(
        answered[record["signatures"]["classification"]["outputs"]["classes"]], classified["classes"]
    )
    np.testing.assert_allclose(
        answered[record["signatures"]["regression"]["outputs"]["outputs"]], regressed["outputs"], atol=1e-5
    )


def test_default_signature_rules_follow_tensorflow():
    tensor = torch.zeros(2, 3)
    default = resolve_export_outputs(te.EstimatorSpec("infer", predictions={"p": tensor}))
    assert list(default) == ["serving_default"] and default["serving_default"].outputs["p"] is tensor
    single = resolve_export_outputs(
        te.EstimatorSpec("infer", predictions=tensor, export_outputs={"scores": PredictOutput(tensor)})
    )
    assert single["serving_default"] is single["scores"]
    with pytest.raises(ValueError, match="none named 'serving_default'"):
        resolve_export_outputs(
            te.EstimatorSpec(
                "infer",
                predictions=tensor,
                export_outputs={"a": PredictOutput(tensor), "b": RegressionOutput(tensor[:, 0])},
            )
        )
    with pytest.raises(TypeError, match="must be a PredictOutput"):
        resolve_export_outputs(te.EstimatorSpec("infer", predictions=tensor, export_outputs={"a": tensor}))
    with pytest.raises(TypeError, match="floating-point"):
        RegressionOutput(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="scores, classes or both"):
        ClassificationOutput()


def test_warm_start_source_is_exported_through_a_receiver_fn(exported, tmp_path):
    # Integer pixels in, scaled floats to model_fn: the transform is part of the exported program.
    receiver = serving_input_receiver(
        {"pixels": TensorSpec(shape=(None, 8), dtype=torch.int64)},
        receiver_fn=lambda tensors: {"x": tensors["pixels"].float() / 2},
    )
    estimator = te.Estimator(
        model_fn=classifier_model_fn,
        model=SmallNet,
        model_dir=str(tmp_path / "fresh"),
        config=te.RunConfig(progress_bar=False),
        warm_start_from=exported["estimator"].model_dir,
    )
    export_dir = export_saved_model(estimator, tmp_path / "export", receiver)
    model = load(export_dir)
    assert model.metadata["checkpoint_path"] is None
    assert model.metadata["warm_start_from"] == exported["estimator"].model_dir
    pixels = np.arange(24, dtype=np.int64).reshape(3, 8) % 5
    predict = te.numpy_input_fn({"x": (pixels / 2).astype(np.float32)}, batch_size=3, num_epochs=1, shuffle=False)
    reference = next(estimator.predict(predict, yield_single_examples=False))
    np.testing.assert_allclose(model({"pixels": pixels})["probabilities"], reference["probabilities"], rtol=1e-5)


def test_read_inputs_accepts_npz_and_tensorflow_serving_json(tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((2, 8), np.float32))
    assert read_inputs(tmp_path / "in.npz")["x"].dtype == np.float32
    (tmp_path / "columns.json").write_text(json.dumps({"inputs": {"x": [[1.0] * 8]}}))
    (tmp_path / "rows.json").write_text(json.dumps({"instances": [{"x": [1.0] * 8}, {"x": [2.0] * 8}]}))
    assert read_inputs(tmp_path / "columns.json") == {"x": [[1.0] * 8]}
    assert read_inputs(tmp_path / "rows.json") == {"x": [[1.0] * 8, [2.0] * 8]}
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="neither .npz nor valid JSON"):
        read_inputs(tmp_path / "bad.json")


# -- a fresh process, with no training code ---------------------------------------------


@pytest.mark.slow
def test_exported_model_reloaded_in_a_fresh_process_matches_estimator_predict(exported, tmp_path):
    np.savez(tmp_path / "inputs.npz", x=exported["x"])
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import torchestimator.export as export
        model = export.load({exported["base"]!r})
        inputs = dict(np.load({str(tmp_path / "inputs.npz")!r}))
        np.savez({str(tmp_path / "outputs.npz")!r}, **model(inputs))
        assert "conftest" not in sys.modules and "helpers" not in sys.modules
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "outputs.npz") as outputs:
        np.testing.assert_array_equal(outputs["class"], exported["expected"]["class"])
        np.testing.assert_allclose(
            outputs["probabilities"], exported["expected"]["probabilities"], rtol=1e-5, atol=1e-6
        )


@pytest.mark.slow
def test_a_process_killed_while_exporting_leaves_no_version(exported, tmp_path):
    # os._exit skips every cleanup, as a kill would: the temp folder stays, no version appears.
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {tests_dir!r})
        import torch
        from helpers import make_estimator
        from torchestimator.export import saved_model, serving_input_receiver, TensorSpec
        estimator = make_estimator({str(exported["root"] / "model")!r})
        original = saved_model._write_file
        def die_at_metadata(path, data):
            if path.endswith("metadata.json"):
                os._exit(9)
            original(path, data)
        saved_model._write_file = die_at_metadata
        saved_model.export_saved_model(estimator, {str(tmp_path / "export")!r},
                                       serving_input_receiver({{"x": TensorSpec(shape=(None, 8))}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 9, result.stderr
    leftovers = os.listdir(tmp_path / "export")
    assert len(leftovers) == 1 and leftovers[0].startswith("temp-")
    assert "program.json" in os.listdir(tmp_path / "export" / leftovers[0])
    assert list_versions(tmp_path / "export") == []
    with pytest.raises(ValueError, match="incomplete temp-\\* folders are never loaded"):
        load(tmp_path / "export")
    # The next export removes the dead writer's folder (its process is gone) and leaves only its own version.
    export_dir = export_saved_model(exported["estimator"], tmp_path / "export", RECEIVER)
    assert os.listdir(tmp_path / "export") == [os.path.basename(export_dir)]


@pytest.mark.parametrize(
    "expression",
    [
        "9**999999999",
        "Pow(9, Pow(9, Pow(9, 9)))",
        "PowByNatural(9, 999999999)",
        "LShift(1, 99999999999)",
        "9**(9*9*9)",
        "((s0**8)**8)**8",
        "9**s0",
        "Float(0.1, 999999999)",
        "99999999999999999999999",
        "1e999",
        "Pow(9, Integer(999999999))",
        "Pow(Symbol('s0'), Integer(65))",
        "Pow(9, Rational(999999999, 1))",
    ],
)
def test_expressions_that_would_make_sympy_build_a_huge_number_are_refused(expression):
    # sympify evaluates numbers eagerly: without the check, loading the first one computes for minutes.
    from torchestimator.export.program_format import _expression_problem

    assert _expression_problem(expression) is not None


@pytest.mark.parametrize(
    "expression",
    [
        "s48",
        "2*s0 + 1",
        "s0**2",
        "(s0**8)**8",
        "s0**-2",
        "s0**0.5",
        "FloorDiv(s0, 2) + 1",
        "PowByNatural(s0, 2)",
        "LShift(s0, 3)",
        "Max(1, s0)",
        "Mod(s0*s1, 8)",
        "Eq(s0, 3)",
        "Symbol('s0', integer=True)",
        "Float(1.5)",
        # sympy's srepr spelling of small exponents (an outer product or attention over a dynamic length):
        "Pow(Symbol('s17', positive=True, integer=True), Integer(2))",
        "Pow(Symbol('s0'), Rational(1, 2))",
        "Pow(Symbol('s0'), Integer(-2))",
        "Pow(Symbol('s0'), Float(0.5))",
    ],
)
def test_expressions_torch_export_writes_stay_allowed(expression):
    from torchestimator.export.program_format import _expression_problem

    assert _expression_problem(expression) is None


def test_read_inputs_names_an_npz_that_is_damaged_cut_or_holds_objects(tmp_path):
    objects = tmp_path / "objects.npz"
    np.savez(objects, x=np.array([{"a": 1}], dtype=object))  # only a pickle could restore it
    (tmp_path / "damaged.npz").write_bytes(b"PK\x03\x04garbage")
    (tmp_path / "cut.npz").write_bytes(objects.read_bytes()[:40])
    for name in ("objects.npz", "damaged.npz", "cut.npz"):
        with pytest.raises(ValueError, match=rf"{name} is not a readable \.npz"):
            read_inputs(tmp_path / name)


@pytest.mark.parametrize(
    "target", ["torch.ops.aten.from_file.default", "torch.ops.aten.from_file.out", "torch.ops.aten.save.default"]
)
def test_operators_that_read_or_write_a_named_file_are_refused_in_every_overload(target):
    # torch.ops.aten.from_file.out(path, False, size, out=...) reads any file into a tensor the graph can return.
    from torchestimator.export.program_format import _operator_problem

    assert "a file named in the graph" in (_operator_problem(target) or "")


@pytest.mark.slow
def test_weights_larger_than_the_json_files_bound_load(tmp_path):
    # 8 x 2.2M float32 = 70 MB of weights: over the 64 MiB bound on an export's JSON files, which must not apply
    # to tensors.safetensors (a real model's weights are as big as the model).
    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = SmallNet()
            self.register_buffer("table", torch.zeros(8, 2_200_000))

        def forward(self, x):
            return self.net(x) + self.table[:, :3].sum() * 0

    train, _, _, (x, _) = input_fns(n=64)
    estimator = make_estimator(tmp_path / "model", model=Wide, save_checkpoints_steps=2)
    estimator.train(train, max_steps=2)
    export_dir = export_saved_model(estimator, tmp_path / "export", RECEIVER)
    assert os.path.getsize(os.path.join(export_dir, "tensors.safetensors")) > 64 << 20
    predictions = load(export_dir)({"x": x[:4]})
    assert predictions["probabilities"].shape == (4, 3)
