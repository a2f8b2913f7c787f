"""Receivers that take bytes: build_parsing_serving_input_receiver and build_image_serving_input_receiver.

The decode step (parse_example, decode_image) runs outside the torch.export program and is recorded in
signature.json as data; load, the REST parser, classify/regress and the batch scheduler run it the same way.
Serialized Examples made by TensorFlow come from tests/fixtures/receivers (tools/make_receiver_fixtures.py).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import operator
import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import exporting_model_fn, make_estimator, trained_classifier

import torchestimator as te
from torchestimator.cli import main
from torchestimator.data import FixedLenFeature, VarLenFeature, decode_example, read_records
from torchestimator.errors import ExampleDecodeError, ExportFormatError, ServingError
from torchestimator.export import (
    ClassificationOutput,
    RegressionOutput,
    ServingInputReceiver,
    TensorSpec,
    build_image_serving_input_receiver,
    build_parsing_serving_input_receiver,
    export_saved_model,
    load,
    read_inputs,
)
from torchestimator.serving import BatchingParameters, BatchScheduler
from torchestimator.serving.examples_json import (
    classify_results,
    example_from_json,
    examples_request,
    parse_examples_request,
    regress_results,
    serialized_examples,
)
from torchestimator.serving.json_tensor import metadata_document, parse_predict
from torchestimator.serving.manager import warm_up
from torchestimator.serving.protos import serving_protos as protos
from torchestimator.serving.warmup import replay_warmup, warmup_path

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "receivers", "tf_examples.json")
TF = json.load(open(FIXTURES))
TF_EXAMPLES = [base64.b64decode(item) for item in TF["examples"]]
SPEC = {"x": FixedLenFeature([8], "float32")}

model_fn = exporting_model_fn(
    lambda logits, predictions: {
        "tensorflow/serving/classify": ClassificationOutput(
            scores=predictions["probabilities"], classes=torch.arange(3).expand(logits.shape[0], 3)
        ),
        "tensorflow/serving/regress": RegressionOutput(logits[:, 0]),
    }
)


@pytest.fixture(scope="module")
def parsing(tmp_path_factory):
    root = tmp_path_factory.mktemp("parsing")
    estimator, _x = trained_classifier(root / "model", model_fn, steps=3)
    path = export_saved_model(estimator, root / "export", build_parsing_serving_input_receiver(SPEC))
    return {"estimator": estimator, "path": path, "model": load(path), "root": root}


def b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode()}


def refused(call) -> str:
    with pytest.raises(ServingError) as raised:
        call()
    assert raised.value.code == "INVALID_ARGUMENT"
    return raised.value.message


def test_the_parsing_receiver_is_a_string_input_recorded_with_its_parse_step(parsing):
    document = json.load(open(os.path.join(parsing["path"], "signature.json")))
    assert document["format_version"] == 3 and document["program_inputs"] == ["x"]
    assert document["signatures"]["serving_default"]["inputs"] == {"examples": {"dtype": "string", "shape": [-1]}}
    # TF's classification/regression signature defs call their one input "inputs", whatever the receiver's name.
    for name in ("tensorflow/serving/classify", "tensorflow/serving/regress"):
        assert document["signatures"][name]["inputs"] == {
            "inputs": {"dtype": "string", "shape": [-1], "receiver_input": "examples"}
        }
    assert document["decoders"] == {
        "examples": {
            "kind": "parse_example",
            "features": {"x": {"type": "FixedLenFeature", "shape": [8], "dtype": "float32", "default_value": None}},
        }
    }
    model = parsing["model"]
    assert model.signature().inputs["examples"].dtype == "string"
    assert {name: (info.dtype, info.shape) for name, info in model.program_inputs.items()} == {
        "x": ("float32", (-1, 8))
    }
    definitions = metadata_document("m", 1, model)["metadata"]["signature_def"]["signature_def"]
    definition = definitions["serving_default"]
    assert definition["inputs"]["examples"]["dtype"] == "DT_STRING"
    assert definition["inputs"]["examples"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]
    for name in ("tensorflow/serving/classify", "tensorflow/serving/regress"):  # one tensor, two keys, as in TF
        assert {key: info["name"] for key, info in definitions[name]["inputs"].items()} == {"inputs": "examples"}
        assert definitions[name]["inputs"]["inputs"]["dtype"] == "DT_STRING"


def test_classify_and_regress_signatures_take_inputs_and_load_takes_the_receivers_name_too(parsing):
    """TF clients name the classify/regress input "inputs"; load() also takes "examples", as before."""
    model = parsing["model"]
    assert model.signature().inputs.keys() == {"examples"}
    classify = model.signature("tensorflow/serving/classify")
    assert classify.inputs.keys() == {"inputs"} and classify.receiver_input("inputs") == "examples"
    expected = model({"examples": TF_EXAMPLES})["probabilities"]
    for name in ("inputs", "examples"):
        np.testing.assert_array_equal(
            model({name: TF_EXAMPLES}, signature_name="tensorflow/serving/classify")["scores"], expected
        )
        np.testing.assert_array_equal(
            model.prepare_inputs({name: TF_EXAMPLES}, "tensorflow/serving/regress")["x"],
            np.array(TF["parsed_x"], np.float32),
        )
    with pytest.raises(ValueError, match="missing \\['examples'\\], unexpected \\['inputs'\\]"):
        model({"inputs": TF_EXAMPLES})  # predict keeps the receiver's name, as TF's predict signature does
    with pytest.raises(ValueError, match="missing \\[\\], unexpected \\['examples'\\]"):
        model({"inputs": TF_EXAMPLES, "examples": TF_EXAMPLES}, signature_name="tensorflow/serving/classify")
    # The server reads names as TF Serving does: the signature's only.
    served = parse_predict(
        {"signature_name": "tensorflow/serving/classify", "inputs": {"inputs": [b64(item) for item in TF_EXAMPLES]}},
        model,
    )
    np.testing.assert_array_equal(served.inputs["x"].numpy(), np.array(TF["parsed_x"], np.float32))
    assert "unexpected inputs ['examples']" in refused(
        lambda: parse_predict(
            {"signature_name": "tensorflow/serving/classify", "inputs": {"examples": [b64(TF_EXAMPLES[0])]}}, model
        )
    )


def test_warmup_requests_for_a_classify_serving_default_take_either_name_and_replay(parsing, tmp_path):
    """A dict of inputs is a PredictRequest for serving_default; a classify one is written under "inputs"."""
    classify_default = exporting_model_fn(
        lambda logits, predictions: {"serving_default": ClassificationOutput(scores=predictions["probabilities"])}
    )
    estimator = make_estimator(parsing["root"] / "model", model_fn=classify_default)
    path = export_saved_model(
        estimator,
        tmp_path / "export",
        build_parsing_serving_input_receiver(SPEC),
        warmup_requests=[{"examples": TF_EXAMPLES[:2]}, {"inputs": TF_EXAMPLES[2:]}],
    )
    logs = [protos().PredictionLog.FromString(record) for record in read_records(warmup_path(path))]
    assert [list(log.predict_log.request.inputs) for log in logs] == [["inputs"], ["inputs"]]
    assert replay_warmup(load(path), path) == 2


def test_an_export_written_before_inputs_was_named_so_loads_and_serves_as_then(parsing, tmp_path):
    """A format 2 signature.json (every signature named its input "examples") loads, and classify takes it."""

    def as_written_before(document):
        document["format_version"] = 2
        for signature in document["signatures"].values():
            signature["inputs"] = {"examples": {"dtype": "string", "shape": [-1]}}

    model = load(_edited_copy(parsing, tmp_path, as_written_before))
    classify = model.signature("tensorflow/serving/classify")
    assert classify.inputs.keys() == {"examples"} and classify.receiver_inputs == {}
    np.testing.assert_array_equal(
        model({"examples": TF_EXAMPLES}, signature_name="tensorflow/serving/classify")["scores"],
        parsing["model"]({"inputs": TF_EXAMPLES}, signature_name="tensorflow/serving/classify")["scores"],
    )
    definitions = metadata_document("m", 1, model)["metadata"]["signature_def"]["signature_def"]
    assert definitions["tensorflow/serving/classify"]["inputs"].keys() == {"examples"}
    rows = np.array(TF["parsed_x"], np.float32)
    request = parse_examples_request(
        {"signature_name": "tensorflow/serving/regress", "examples": [{"x": row.tolist()} for row in rows]},
        model,
        "regress",
    )
    np.testing.assert_array_equal(request.inputs["x"].numpy(), rows)


def test_tf_made_examples_run_as_estimator_predict_does(parsing):
    """TensorFlow's serialized Examples parse to TF's own values, and the classes equal Estimator.predict's."""
    model = parsing["model"]
    parsed = model.prepare_inputs({"examples": TF_EXAMPLES})
    np.testing.assert_array_equal(parsed["x"].numpy(), np.array(TF["parsed_x"], np.float32))
    expected = [
        row["class"]
        for row in parsing["estimator"].predict(
            te.numpy_input_fn({"x": np.array(TF["parsed_x"], np.float32)}, batch_size=4, shuffle=False)
        )
    ]
    assert model({"examples": TF_EXAMPLES})["class"].tolist() == expected
    assert model(np.array(TF_EXAMPLES, dtype=object))["class"].tolist() == expected  # a single input, unnamed
    assert model(parsed)["class"].tolist() == expected  # the decoded tensors, as the batch scheduler passes them
    served = parse_predict({"instances": [b64(item) for item in TF_EXAMPLES]}, model)
    assert served.inputs.keys() == {"x"} and model(served.inputs)["class"].tolist() == expected
    named = parse_predict({"instances": [{"examples": b64(item)} for item in TF_EXAMPLES]}, model)
    columnar = parse_predict({"inputs": {"examples": [b64(item) for item in TF_EXAMPLES]}}, model)
    for request in (named, columnar):
        torch.testing.assert_close(request.inputs["x"], served.inputs["x"], rtol=0, atol=0)


def test_classify_and_regress_take_examples_as_tf_serving_does(parsing):
    model = parsing["model"]
    rows = np.array(TF["parsed_x"], np.float32)
    document = {"signature_name": "tensorflow/serving/classify", "examples": [{"x": row.tolist()} for row in rows]}
    request = parse_examples_request(document, model, "classify")
    results = classify_results(model(request.inputs, signature_name=request.signature_name), request.count)
    probabilities = model({"x": rows})["probabilities"]
    assert [[label for label, _ in row] for row in results["results"]] == [["0", "1", "2"]] * 4
    np.testing.assert_allclose([[score for _, score in row] for row in results["results"]], probabilities, rtol=1e-6)
    regress = parse_examples_request({**document, "signature_name": "tensorflow/serving/regress"}, model, "regress")
    values = regress_results(model(regress.inputs, signature_name=regress.signature_name), regress.count)["results"]
    np.testing.assert_allclose(values, model({"x": rows}, signature_name="tensorflow/serving/regress")["outputs"])
    # gRPC's path: decode_example's values of TF's own Examples, the context's bytes before each example's.
    context = decode_example(base64.b64decode(TF["context"]))
    examples = [decode_example(base64.b64decode(item)) for item in TF["with_context"]]
    merged = examples_request(context, examples, model, "regress", "tensorflow/serving/regress")
    np.testing.assert_array_equal(merged.inputs["x"].numpy(), np.array(TF["with_context_parsed_x"], np.float32))
    assert merged.count == 2
    # The same in JSON: an example without "x" takes the context's.
    json_merged = parse_examples_request(
        {
            "signature_name": "tensorflow/serving/regress",
            "context": {"x": [0.5] * 8},
            "examples": [{}, {"x": rows[1].tolist()}],
        },
        model,
        "regress",
    )
    np.testing.assert_array_equal(json_merged.inputs["x"].numpy(), merged.inputs["x"].numpy())


def test_a_feature_of_the_wrong_type_fails_with_tfs_parse_error(parsing):
    model = parsing["model"]
    tf_words = "Data types don't match. Data type: int64 but expected type: float"
    assert tf_words in TF["wrong_type_error"] and "Key: x" in TF["wrong_type_error"]
    # JSON integers are an int64_list (AddValueToFeature), which the float feature refuses as TF's parser does.
    message = refused(
        lambda: parse_examples_request(
            {"signature_name": "tensorflow/serving/classify", "examples": [{"x": [1.0] * 8}, {"x": [1] * 8}]},
            model,
            "classify",
        )
    )
    assert tf_words in message and "Key: x" in message and "record 1" in message
    wrong = base64.b64decode(TF["wrong_type"])
    message = refused(lambda: parse_predict({"instances": [b64(TF_EXAMPLES[0]), b64(wrong)]}, model))
    assert tf_words in message and "record 1" in message
    message = refused(
        lambda: parse_examples_request(
            {"signature_name": "tensorflow/serving/regress", "examples": [{"y": [1.0] * 8}]}, model, "regress"
        )
    )
    assert "Feature: x (data type: float) is required but could not be found" in message
    assert (
        refused(lambda: examples_request({}, [], model, "regress", "tensorflow/serving/regress")) == "Input is empty."
    )


@pytest.mark.parametrize(
    "value, expected",
    [
        (1, np.array([1], np.int64)),
        (1.0, np.array([1.0], np.float32)),
        (True, np.array([1], np.int64)),
        ([1, False], np.array([1, 0], np.int64)),
        (1e5, np.array([1e5], np.float32)),
        ("é", ["é".encode()]),
        ({"b64": "AP8"}, [b"\x00\xff"]),
        ([], []),
        ([2.5, float("nan")], np.array([2.5, np.nan], np.float32)),
    ],
)
def test_json_values_become_features_by_tfs_rules(value, expected):
    converted = example_from_json({"x": value}, "examples[0]")["x"]
    if isinstance(expected, np.ndarray):
        assert converted.dtype == expected.dtype
        np.testing.assert_array_equal(converted, expected)
    else:
        assert converted == expected


@pytest.mark.parametrize(
    "value, message",
    [
        ([1, 2.5], "Unexpected element type in feature: x expecting type: int64"),
        ([2.5, "a"], "Unexpected element type in feature: x expecting type: float"),
        (None, "Feature: x has element with unexpected JSON type: Null"),
        ([[1.0]], "Feature: x has element with unexpected JSON type: Array"),
        ({"value": 1}, "Feature: x has element with unexpected JSON type: Object"),
        (2**63, "Feature: x has uint64 element. Only int64 is supported"),
        (1e39, "Cannot convert JSON value: 1e+39 to float without loss of precision"),
        ({"b64": "!!"}, "Unable to base64 decode"),
    ],
)
def test_json_values_tf_refuses_are_refused_in_its_words(value, message):
    said = refused(lambda: example_from_json({"x": value}, "examples[3]"))
    assert message in said and "examples[3]" in said


def test_string_inputs_take_lists_of_bytes_and_refuse_other_values(parsing):
    model = parsing["model"]
    with pytest.raises(TypeError, match="a batch of bytes"):
        model({"examples": TF_EXAMPLES[0]})
    with pytest.raises(TypeError, match="shape \\[2, 1\\]"):
        model({"examples": np.array([[TF_EXAMPLES[0]], [TF_EXAMPLES[1]]], dtype=object)})
    with pytest.raises(TypeError, match="instance 1: expected bytes"):
        model({"examples": [TF_EXAMPLES[0], 3]})
    with pytest.raises(ExampleDecodeError, match="record 1"):
        model({"examples": [TF_EXAMPLES[0], b"\xff\xff not an example"]})
    with pytest.raises(ValueError, match="missing \\['examples'\\], unexpected \\['image'\\]"):
        model({"image": TF_EXAMPLES})
    assert "Type: Number is not of expected type: string" in refused(lambda: parse_predict({"instances": [1]}, model))
    assert "Unable to base64 decode" in refused(lambda: parse_predict({"instances": [{"b64": "a!"}]}, model))
    assert "not formatted correctly for base64" in refused(
        lambda: parse_predict({"inputs": {"examples": [{"b64": 1}]}}, model)
    )
    assert "unexpected level" in refused(lambda: parse_predict({"instances": [[b64(TF_EXAMPLES[0])]]}, model))
    # A plain JSON string is its UTF-8 bytes (TF's rule), here not an Example.
    assert "Could not parse example input" in refused(lambda: parse_predict({"instances": ["text"]}, model))


def test_what_cannot_cross_into_a_program_is_refused_naming_it():
    with pytest.raises(ValueError, match="feature_spec\\['tokens'\\] is a VarLenFeature.*FixedLenFeature\\(\\[N\\]"):
        build_parsing_serving_input_receiver({"x": SPEC["x"], "tokens": VarLenFeature("int64")})
    with pytest.raises(ValueError, match="feature_spec\\['word'\\] is a string FixedLenFeature"):
        build_parsing_serving_input_receiver({"word": FixedLenFeature([], "string", default_value="")})
    with pytest.raises(ValueError, match="shape \\(None,\\)"):
        TensorSpec(shape=(None, 2), dtype="string")
    with pytest.raises(ValueError, match="\\['raw'\\] have no decode step"):
        ServingInputReceiver(receiver_tensors={"raw": TensorSpec(shape=(None,), dtype=bytes)})
    with pytest.raises(ValueError, match="makes a tensor named 'examples'"):
        build_parsing_serving_input_receiver({"examples": SPEC["x"]})
    receiver = build_parsing_serving_input_receiver(
        {"x": FixedLenFeature([2], "int64", default_value=[0, 1])}, input_name="serialized"
    )
    assert receiver.describe() == "'serialized': string (-1,) (parse_example -> 'x': int64 [-1, 2])"


def _edited_copy(parsing, tmp_path, edit):
    copy = tmp_path / "edited"
    shutil.copytree(parsing["path"], copy)
    document = json.load(open(copy / "signature.json"))
    edit(document)
    (copy / "signature.json").write_text(json.dumps(document))
    return copy


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["decoders"]["examples"].update(kind="run_python"), "unknown decode step kind 'run_python'"),
        (lambda d: d["decoders"]["examples"].update(code="import os"), "unknown keys ['code']"),
        (lambda d: d["decoders"]["examples"]["features"]["x"].update(type="VarLenFeature"), "is not FixedLenFeature"),
        (
            lambda d: d["decoders"]["examples"]["features"]["x"].update(shape=[4]),
            "but the program was traced on float32 [-1, 8]",
        ),
        (lambda d: d["decoders"]["examples"]["features"]["x"].update(default_value=[1.0]), "flat list of 8 numbers"),
        (lambda d: d.update(format_version=1), "go together"),
        (lambda d: d.pop("decoders"), "go together"),
        (lambda d: d["program_inputs"].append("y"), "'program_inputs' is ['x', 'y']"),
        (
            lambda d: d["signatures"]["tensorflow/serving/classify"]["inputs"]["inputs"].update(
                receiver_input="nowhere"
            ),
            "input 'inputs' feeds receiver input 'nowhere', which has no decode step",
        ),
        (
            lambda d: d["signatures"]["tensorflow/serving/classify"]["inputs"]["inputs"].update(receiver_input=7),
            "has receiver_input '7'",
        ),
        (
            lambda d: d["signatures"]["tensorflow/serving/classify"]["inputs"]["inputs"].pop("receiver_input"),
            "has string inputs feeding ['inputs'], and the file has decode steps for ['examples']",
        ),
        (
            lambda d: d["signatures"]["tensorflow/serving/classify"]["inputs"]["inputs"].update(dtype="float32"),
            "records a receiver_input but is not a string input",
        ),
        (lambda d: d.update(format_version=2), "only format_version 3 files hold"),
    ],
)
def test_a_decode_step_that_is_not_one_we_wrote_is_refused_naming_the_file(parsing, tmp_path, edit, message):
    copy = _edited_copy(parsing, tmp_path, edit)
    with pytest.raises(ExportFormatError) as raised:
        load(copy)
    assert message in str(raised.value) and str(copy / "signature.json") in str(raised.value)


def test_batches_of_decoded_string_requests_concatenate_and_warm_up_runs(parsing):
    model = parsing["model"]
    assert 0 < warm_up(model) < 1.0
    with BatchScheduler(BatchingParameters(max_batch_size=8, batch_timeout_micros=50_000)) as scheduler:
        futures = [scheduler.submit(model, "serving_default", {"examples": [item]}) for item in TF_EXAMPLES]
        classes = [future.result(timeout=30)["class"].tolist() for future in futures]
    assert functools.reduce(operator.iadd, classes, []) == model({"examples": TF_EXAMPLES})["class"].tolist()


def test_predict_exported_reads_a_b64_request(parsing, tmp_path, capsys):
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"instances": [b64(item) for item in TF_EXAMPLES]}))
    assert main(["predict", "--exported", parsing["path"], "--input", str(request)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [row["class"] for row in answer["predictions"]] == parsing["model"]({"examples": TF_EXAMPLES})[
        "class"
    ].tolist()
    named = tmp_path / "named.json"
    named.write_text(json.dumps({"inputs": {"examples": [b64(item) for item in TF_EXAMPLES]}}))
    assert read_inputs(named) == {"examples": TF_EXAMPLES}


def test_onnx_takes_the_decoded_tensors_and_its_record_says_so(parsing, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    path = export_saved_model(
        parsing["estimator"], tmp_path / "onnx", build_parsing_serving_input_receiver(SPEC), as_onnx=True
    )
    record = json.load(open(os.path.join(path, "metadata.json")))["onnx"]
    assert [entry["name"] for entry in record["inputs"]] == ["x"]
    assert record["decoded_outside"] == {"examples": {"kind": "parse_example", "inputs": ["x"]}}
    session = onnxruntime.InferenceSession(os.path.join(path, "model.onnx"))
    model = load(path)
    x = model.prepare_inputs({"examples": TF_EXAMPLES})["x"].numpy()
    (classes,) = session.run(["serving_default/class"], {"x": x})
    assert classes.tolist() == model({"examples": TF_EXAMPLES})["class"].tolist()


# -- images ---------------------------------------------------------------------------------------------------


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _image_model_fn(model, features, labels, mode):
    logits = model(features["image"])
    predictions = {"class": logits.argmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={
                "serving_default": te.export.PredictOutput(predictions),
                "classify": ClassificationOutput(scores=logits.softmax(-1)),
            },
        )
    return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    pixels = np.random.default_rng(0).integers(0, 256, size=(6, 10, 12, 3), dtype=np.uint8)
    encoded = [_png(item) for item in pixels]
    decoding = te.data.ImageDecoding(size=(8, 8), channels=3, layout="CHW", scale=1 / 255)
    x = decoding.decode_batch(encoded)
    estimator = make_estimator(
        root / "model",
        model_fn=_image_model_fn,
        model=lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)),
    )
    estimator.train(
        te.numpy_input_fn({"image": x}, np.arange(6) % 3, batch_size=3, num_epochs=None, shuffle=False), max_steps=2
    )
    path = export_saved_model(estimator, root / "export", build_image_serving_input_receiver(decoding))
    expected = [row["class"] for row in estimator.predict(te.numpy_input_fn({"image": x}, batch_size=6, shuffle=False))]
    return {"decoding": decoding, "encoded": encoded, "path": path, "model": load(path), "expected": expected}


def test_the_image_receiver_records_its_decoding_and_answers_every_b64_form(images):
    document = json.load(open(os.path.join(images["path"], "signature.json")))
    assert document["decoders"] == {
        "image_bytes": {"kind": "decode_image", "feature_name": "image", "decoding": images["decoding"].to_json()}
    }
    model, encoded = images["model"], images["encoded"]
    assert model.program_inputs["image"].shape == (-1, 3, 8, 8)
    assert model(encoded)["class"].tolist() == images["expected"]
    forms = [
        {"instances": [b64(item) for item in encoded]},  # TF Serving's documented image request
        {"instances": [{"image_bytes": b64(item)} for item in encoded]},
        {"inputs": {"image_bytes": [b64(item) for item in encoded]}},
        {"inputs": [b64(item) for item in encoded]},
    ]
    for document in forms:
        request = parse_predict(document, model)
        assert model(request.inputs, signature_name=request.signature_name)["class"].tolist() == images["expected"]


def test_an_image_that_does_not_decode_is_refused_naming_the_instance(images):
    model, encoded = images["model"], images["encoded"]
    message = refused(lambda: parse_predict({"instances": [b64(encoded[0]), b64(b"GIF89a broken")]}, model))
    assert "input 'image_bytes', instance 1" in message
    message = refused(lambda: parse_predict({"instances": [b64(encoded[0]), "not an image"]}, model))
    assert "instance 1" in message
    with pytest.raises(ValueError, match="feature_name must be a non-empty string"):
        from torchestimator.export.decoders import ImageDecode

        ImageDecode(decoding=images["decoding"], feature_name="")


def test_classify_on_an_image_receiver_takes_one_image_per_example(images):
    """Without a parsing receiver, features feed inputs by name: the string input takes one bytes value each.

    The signature calls its one string input "inputs" (TF's rule); the examples' feature keeps the receiver's name.
    """
    model, encoded = images["model"], images["encoded"]
    assert model.signature("classify").inputs.keys() == {"inputs"}
    document = {
        "signature_name": "classify",
        "examples": [{"image_bytes": b64(item)} for item in encoded[:2]] + [{"image_bytes": [b64(encoded[2])]}],
    }
    request = parse_examples_request(document, model, "classify")
    scores = classify_results(model(request.inputs, signature_name="classify"), request.count)["results"]
    assert [int(np.argmax([score for _, score in row])) for row in scores] == images["expected"][:3]
    message = refused(
        lambda: parse_examples_request(
            {"signature_name": "classify", "examples": [{"image_bytes": [b64(encoded[0]), b64(encoded[1])]}]},
            model,
            "classify",
        )
    )
    assert "give one string or" in message


def test_decoded_examples_serialize_back_to_tfs_bytes():
    """gRPC hands examples_request decode_example's values; serialized again they are TF's own bytes, and a
    Feature with no list (or an empty typed list) keeps what it was."""
    assert serialized_examples({}, [decode_example(item) for item in TF_EXAMPLES]) == TF_EXAMPLES
    context = base64.b64decode(TF["context"])
    assert serialized_examples(decode_example(context), [{}]) == [context]
    kept = decode_example(serialized_examples({}, [{"a": [], "b": np.array([], np.int64)}])[0])
    assert kept["a"] == [] and kept["b"].dtype == np.int64 and kept["b"].size == 0


def test_an_edited_image_decoding_is_refused_naming_the_file(images, tmp_path):
    copy = tmp_path / "edited"
    shutil.copytree(images["path"], copy)
    document = json.load(open(copy / "signature.json"))
    document["decoders"]["image_bytes"]["decoding"]["plugin"] = "evil.so"
    (copy / "signature.json").write_text(json.dumps(document))
    with pytest.raises(ExportFormatError) as raised:
        load(copy)
    assert str(copy / "signature.json") in str(raised.value) and "plugin" in str(raised.value)
