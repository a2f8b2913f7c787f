"""TF Serving's own documented REST examples, replayed against our server with equivalent models.

Sources (tensorflow/serving):
  DOC   tensorflow_serving/g3doc/api_rest.md, section "Example" (half_plus_three, version 123)
  TEST  tensorflow_serving/model_servers/http_rest_api_handler_test.cc (saved_model_half_plus_two_2_versions,
        version 123, label "Version_Label" -> 123)
  META  tensorflow_serving/servables/tensorflow/testdata/saved_model_half_plus_two_2_versions_metadata.json

The models are rebuilt with our export: y = 0.5 x + 2 and y = 0.5 x + 3 on one
float input "x", output "y", with the regress/classify signatures the
examples call. Status codes and JSON bodies are compared exactly (the floats
in these examples are exact in float32). Where TF's test only checks that an
error message contains some text, so do we; where our message adds detail
after TF's text, TF's text must be its prefix. Every other difference is
listed, with its reason, where it is asserted.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from benchmark_scripts import imported_script
from helpers import call_app

import torchestimator as te
from torchestimator.export import (
    ClassificationOutput,
    PredictOutput,
    RegressionOutput,
    TensorSpec,
    serving_input_receiver,
)
from torchestimator.serving import ModelManager, make_app

TWO = "saved_model_half_plus_two_2_versions"  # TEST's kTestModelName
THREE = "half_plus_three"  # DOC's model
LABEL = "Version_Label"  # TEST's kTestModelVersionLabel -> kTestModelVersion1
STATUS_123 = {
    "model_version_status": [
        {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    ]
}


def half_plus(offset: float, regress_key: str, classify_key: str):
    """A model_fn for y = 0.5 x + offset with TF's three signatures: predict y, regress y, classify scores = y."""

    def model_fn(model, features, labels, mode):
        y = model(features["x"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(
                mode,
                predictions={"y": y},
                export_outputs={
                    "serving_default": PredictOutput({"y": y}),
                    regress_key: RegressionOutput(y),
                    classify_key: ClassificationOutput(scores=y[:, None]),
                },
            )  # TF's scores are [-1, 1]
        return te.EstimatorSpec(mode, predictions={"y": y}, loss=((y - labels) ** 2).mean())

    return model_fn


@pytest.fixture(scope="module")
def managers(tmp_path_factory):
    """Both models at version 123 only, as TF serves them (TEST loads only version 123 by a specific-version policy)."""
    root = tmp_path_factory.mktemp("contract")
    # x has shape [-1], not TF's [-1, 1]: TF never checks a predict input's shape against the signature, so its
    # {"instances": [1.0, 2.0]} runs on a [-1, 1] signature; we do check, so the examples need [-1].
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None,))})
    with imported_script("fuzz_serving") as script:
        two = script.export_fixed(
            str(root / "two"),
            script.HalfPlus(2.0),
            half_plus(2.0, "regress_x_to_y", "classify_x_to_y"),
            receiver,
            {"x": torch.zeros(2)},
            version=123,
        )
        three = script.export_fixed(
            str(root / "three"),
            script.HalfPlus(3.0),
            half_plus(3.0, "tensorflow/serving/regress", "tensorflow/serving/classify"),
            receiver,
            {"x": torch.zeros(2)},
            version=123,
        )
    managers = [
        ModelManager(TWO, os.path.dirname(two), version_labels={LABEL: 123}),
        ModelManager(THREE, os.path.dirname(three)),
    ]
    for manager in managers:
        assert manager.poll()
    return managers


@pytest.fixture
def app(managers):
    """A fresh application per test: an aiohttp app belongs to the event loop it first ran on."""
    return lambda: make_app(managers)


def call(app, *requests):
    """Sends (method, path, body) requests to a new app from ``app()``; returns [(status, JSON body, Content-Type)]."""
    return call_app(app(), *requests)


def replay(app, cases):
    """Each (method, path, body, TF's status, TF's JSON) is answered with that status, that JSON, as JSON."""
    answers = call(app, *[(method, path, body) for method, path, body, _, _ in cases])
    for (method, path, body, status, document), answer in zip(cases, answers):
        assert answer == (status, document, "application/json"), (method, path, body)


# -- status: DOC and TEST GetStatus ---------------------------------------------------------


def test_status_documents_are_tf_servings_exactly(app):
    replay(
        app,
        [
            ("GET", f"/v1/models/{THREE}", None, 200, STATUS_123),  # DOC: curl http://localhost:8501/v1/models/<name>
            ("GET", f"/v1/models/{TWO}", None, 200, STATUS_123),  # TEST GetStatus: all versions
            ("GET", f"/v1/models/{TWO}/versions/123", None, 200, STATUS_123),  # TEST: a specific version
        ],
    )


def test_status_by_version_label_is_tf_servings_exactly(app):
    # TEST GetStatus "using a version label" (labels come from the model config: version_labels here).
    replay(app, [("GET", f"/v1/models/{TWO}/labels/{LABEL}", None, 200, STATUS_123)])


# -- predict: DOC and TEST Predict ----------------------------------------------------------


def test_predict_examples_answer_tf_servings_json_exactly(app):
    replay(
        app,
        [
            # DOC: curl -d '{"instances": [1.0,2.0,5.0]}' -X POST .../half_plus_three:predict
            (
                "POST",
                f"/v1/models/{THREE}:predict",
                {"instances": [1.0, 2.0, 5.0]},
                200,
                {"predictions": [3.5, 4.0, 5.5]},
            ),
            (
                "POST",
                f"/v1/models/{TWO}:predict",
                {"instances": [1.0, 2.0, 5.0]},
                200,
                {"predictions": [2.5, 3.0, 4.5]},
            ),
            # TEST Predict: "Query specific versions."
            (
                "POST",
                f"/v1/models/{TWO}/versions/123:predict",
                {"instances": [1.0, 2.0]},
                200,
                {"predictions": [2.5, 3.0]},
            ),
            # TEST: "Query specific versions with explicit signature_name."
            (
                "POST",
                f"/v1/models/{TWO}/versions/123:predict",
                {"signature_name": "serving_default", "instances": [3.0, 4.0]},
                200,
                {"predictions": [3.5, 4.0]},
            ),
            # TEST: "... and columnar inputs."
            (
                "POST",
                f"/v1/models/{TWO}/versions/123:predict",
                {"signature_name": "serving_default", "inputs": [3.0, 4.0]},
                200,
                {"outputs": [3.5, 4.0]},
            ),
        ],
    )


def test_predict_by_version_label_answers_tf_servings_json(app):
    # TEST Predict: "Query specific versions using a version label."
    replay(
        app,
        [
            (
                "POST",
                f"/v1/models/{TWO}/labels/{LABEL}:predict",
                {"instances": [1.0, 2.0]},
                200,
                {"predictions": [2.5, 3.0]},
            )
        ],
    )


def test_a_two_dimensional_instance_is_refused_where_tf_does_not_check_the_shape(app):
    # TEST Predict "Query latest version": {"instances": [[1.0, 2.0], [3.0, 4.0]]} -> {"predictions": [[2.5, 3.0],
    # [3.5, 4.0]]}. TF runs it although the signature says [-1, 1]; we check inputs against the signature, so a
    # [2, 2] batch on an [-1] signature is a 400 naming the shapes. A deliberate difference.
    [(status, document, _)] = call(app, ("POST", f"/v1/models/{TWO}:predict", {"instances": [[1.0, 2.0], [3.0, 4.0]]}))
    assert status == 400 and "[2, 2]" in document["error"] and "[-1]" in document["error"], document


def test_the_documented_b64_request_is_refused_with_the_reason(app):
    # DOC "Encoding binary values": {"instances": [{"b64": "aW1hZ2UgYnl0ZXM="}]} feeds a DT_STRING input. Exported
    # torch programs take numbers only, so the bytes are decoded (validated) and refused naming the input's dtype,
    # a 400 as TF gives for a type mismatch. A deliberate, documented difference (README, DESIGN.md).
    [(status, document, _)] = call(
        app, ("POST", f"/v1/models/{TWO}:predict", {"instances": [{"b64": "aW1hZ2UgYnl0ZXM="}]})
    )
    assert status == 400 and "'x'" in document["error"] and "only accepted for string inputs" in document["error"]


def test_an_empty_signature_name_is_the_default_signature(app):
    # servables/tensorflow/predict_util.cc: signature_name().empty() ? kDefaultServingSignatureDefKey (it was
    # 400 'Serving signature name: "" not found'); classifier.cc and regressor.cc read it the same way.
    replay(
        app,
        [
            (
                "POST",
                f"/v1/models/{TWO}:predict",
                {"signature_name": "", "instances": [1.0, 2.0]},
                200,
                {"predictions": [2.5, 3.0]},
            ),
            ("POST", f"/v1/models/{TWO}:predict", {"signature_name": "", "inputs": [3.0]}, 200, {"outputs": [3.5]}),
        ],
    )
    status, message = error_of(
        app, "POST", f"/v1/models/{TWO}:regress", {"signature_name": "", "examples": [{"x": 1.0}]}
    )
    assert status == 400 and "Signature 'serving_default' is a predict signature" in message, message


# -- classify and regress: DOC and TEST Regress / Classify ---------------------------------
# These need :classify and :regress (serving/examples_json.py); app.py answered 501 for them before.


def test_regress_examples_answer_tf_servings_json_exactly(app):
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]}
    replay(
        app,
        [
            # DOC: '{"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]}'
            (
                "POST",
                f"/v1/models/{THREE}:regress",
                {"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]},
                200,
                {"results": [3.5, 4.0]},
            ),
            ("POST", f"/v1/models/{TWO}:regress", body, 200, {"results": [42]}),  # TEST Regress: latest
            ("POST", f"/v1/models/{TWO}/versions/123:regress", body, 200, {"results": [42]}),  # a specific version
            ("POST", f"/v1/models/{TWO}/labels/{LABEL}:regress", body, 200, {"results": [42]}),  # a version label
        ],
    )


def test_classify_examples_answer_tf_servings_json_exactly(app):
    replay(
        app,
        [
            # TEST Classify: a signature with scores and no classes gives the label "".
            (
                "POST",
                f"/v1/models/{TWO}:classify",
                {"signature_name": "classify_x_to_y", "examples": [{"x": 20.0}]},
                200,
                {"results": [[["", 12]]]},
            ),
            (
                "POST",
                f"/v1/models/{TWO}/labels/{LABEL}:classify",
                {"signature_name": "classify_x_to_y", "examples": [{"x": 10.0}]},
                200,
                {"results": [[["", 7]]]},
            ),
        ],
    )


# -- metadata: META -----------------------------------------------------------------------


def _tensor(dtype: str, dims: list[str] | None, name: str) -> dict:
    shape = (
        {"dim": [], "unknown_rank": True}
        if dims is None
        else {"dim": [{"size": size, "name": ""} for size in dims], "unknown_rank": False}
    )
    return {"dtype": dtype, "tensor_shape": shape, "name": name}


# META's entries for the signatures our export has, verbatim. META also lists regress_x2_to_y3,
# classify_x2_to_y3 and regress_x_to_y2, which read other graph tensors (x2, y2, y3) of TF's model; an export of
# ours has one set of inputs for all signatures, so they are not rebuilt.
TF_METADATA = {
    "model_spec": {"name": TWO, "signature_name": "", "version": "123"},
    "metadata": {
        "signature_def": {
            "signature_def": {
                "serving_default": {
                    "inputs": {"x": _tensor("DT_FLOAT", ["-1", "1"], "x:0")},
                    "outputs": {"y": _tensor("DT_FLOAT", ["-1", "1"], "y:0")},
                    "method_name": "tensorflow/serving/predict",
                    "defaults": {},
                },
                "regress_x_to_y": {
                    "inputs": {"inputs": _tensor("DT_STRING", None, "tf_example:0")},
                    "outputs": {"outputs": _tensor("DT_FLOAT", ["-1", "1"], "y:0")},
                    "method_name": "tensorflow/serving/regress",
                    "defaults": {},
                },
                "classify_x_to_y": {
                    "inputs": {"inputs": _tensor("DT_STRING", None, "tf_example:0")},
                    "outputs": {"scores": _tensor("DT_FLOAT", ["-1", "1"], "y:0")},
                    "method_name": "tensorflow/serving/classify",
                    "defaults": {},
                },
            }
        }
    },
}


def expected_metadata() -> dict:
    """META with the differences an export of ours necessarily has; everything else must be equal."""
    expected = copy.deepcopy(TF_METADATA)
    definitions = expected["metadata"]["signature_def"]["signature_def"]
    for key, definition in definitions.items():
        # TF's regress/classify signatures take one serialized tf.Example ("inputs", DT_STRING, unknown rank);
        # torch programs have no string inputs, so ours take the feature tensors by name: x, float, [-1].
        # Tensor names: TF gives graph tensor names ("x:0"); we give the input name and the program's output key.
        definition["inputs"] = {"x": _tensor("DT_FLOAT", ["-1"], "x")}
        for alias, tensor in definition["outputs"].items():
            tensor["name"] = f"{key}/{alias}"
    # y (predict and regress) is [-1], not [-1, 1]: see the fixture; classify's scores stay [-1, 1] as TF's.
    for key, alias in (("serving_default", "y"), ("regress_x_to_y", "outputs")):
        definitions[key]["outputs"][alias]["tensor_shape"]["dim"] = [{"size": "-1", "name": ""}]
    return expected


def test_metadata_matches_tf_servings_document_key_by_key(app):
    (status, document, content_type), (status_label, by_label, _) = call(
        app, ("GET", f"/v1/models/{TWO}/metadata", None), ("GET", f"/v1/models/{TWO}/versions/123/metadata", None)
    )
    assert (status, content_type, status_label) == (200, "application/json", 200)
    expected = expected_metadata()
    assert document["model_spec"] == expected["model_spec"]
    ours = document["metadata"]["signature_def"]["signature_def"]
    theirs = expected["metadata"]["signature_def"]["signature_def"]
    assert sorted(ours) == sorted(theirs)
    for key in theirs:  # one signature at a time, so a failure names it
        assert ours[key] == theirs[key], key
    assert document == expected and by_label == expected


# -- errors: DOC, TEST PredictModelNameVersionErrors / PredictRequestErrors / UnsupportedApiCalls ------------


def error_of(app, method, path, body=None):
    [(status, document, content_type)] = call(app, (method, path, body))
    assert content_type == "application/json" and list(document) == ["error"], document
    return status, document["error"]


def test_unknown_model_is_404_with_tf_servings_message(app):
    # DOC: {"instances": [1.0,5.0]} to .../half:predict
    #   -> 404 {"error": "Servable not found for request: Latest(half)"}.
    # Our message goes on (the served models), so TF's text must be its prefix.
    status, message = error_of(app, "POST", "/v1/models/half:predict", {"instances": [1.0, 5.0]})
    assert status == 404 and message.startswith("Servable not found for request: Latest(half)"), message


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/foo:predict",
        "/v1/models/foo/versions/50:predict",
        f"/v1/models/{TWO}99:predict",
        f"/v1/models/{TWO}/versions/99:predict",
    ],
)
def test_unknown_model_or_version_is_404(app, path):
    status, message = error_of(app, "POST", path, {"instances": [1]})  # TEST PredictModelNameVersionErrors
    assert status == 404 and message.startswith("Servable not found for request: "), message


# (body, words TF's test or code puts in the message): all 400 INVALID_ARGUMENT.
REQUEST_ERRORS = [
    # TEST: "Empty document." TF checks emptiness itself, before its parser, with this fixed message.
    (b"", "JSON Parse error: The document is empty"),
    # TEST: "Badly formatted JSON." The detail after it is rapidjson's ("Invalid value"); only the prefix is TF's own.
    (b"instances = [1, 2]", "JSON Parse error"),
    # TEST: "Incorrect type." TF's TypeError: 'JSON Value: "x" Type: String is not of expected type: float'.
    ({"instances": ["x", "y"]}, "not of expected type: float"),
    # TEST: "Incorrect signature_name type."
    ({"signature_name": 100}, "'signature_name' key must be a string value."),
    # util/json_tensor.cc FillPredictRequestFromJson.
    (
        {"instances": [1.0], "inputs": [1.0]},
        "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist",
    ),
    ({"signature_name": "serving_default"}, "Missing 'inputs' or 'instances' key"),
    # servables/tensorflow/util (reference 9.4).
    ({"signature_name": "nope", "instances": [1.0]}, 'Serving signature name: "nope" not found in signature def'),
]


@pytest.mark.parametrize("body, words", REQUEST_ERRORS, ids=[words[:40] for _, words in REQUEST_ERRORS])
def test_bad_predict_requests_are_400_with_tf_servings_words(app, body, words):
    status, message = error_of(app, "POST", f"/v1/models/{TWO}:predict", body)
    assert status == 400 and words in message, message


def test_an_unknown_version_label_is_400_unrecognized_label(app):
    # TEST PredictRequestErrors "Nonexistent version label": INVALID_ARGUMENT (400), not NOT_FOUND.
    status, message = error_of(
        app, "POST", f"/v1/models/{TWO}/labels/Version_Nonexistent:predict", {"instances": ["x", "y"]}
    )
    assert status == 400 and "Unrecognized servable version label" in message, message


MALFORMED = [  # TEST UnsupportedApiCalls: (method, path, words), all 400 INVALID_ARGUMENT
    ("GET", "/v1/foo", "Malformed request"),
    ("POST", "/v1/foo", "Malformed request"),
    ("GET", "/v1/models", "Missing model name"),
    ("GET", "/v1/models/debug/model_name", "Malformed request"),
    ("GET", "/v1/models/foo/version/50:predict", "Malformed request"),
    ("POST", "/v1/models/foo/version/50:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/HELLO:regress", "Malformed request"),
    ("POST", f"/v1/models/foo/versions/{2**64 - 1}:regress", "Failed to convert version"),
    ("POST", "/v1/models/foo/label/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/50/labels/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/some_label:regress", "Malformed request"),
]


@pytest.mark.parametrize("method, path, words", MALFORMED, ids=[f"{m} {p}" for m, p, _ in MALFORMED])
def test_unsupported_api_calls_are_400_with_tf_servings_words(app, method, path, words):
    status, message = error_of(app, method, path)
    assert status == 400 and words in message, message


# TEST UnsupportedApiCalls also expects 400 "Malformed request" for a known path with the wrong method. We answer
# 405 with an Allow header instead (tests/serving/test_serving.py pins it): the HTTP status for exactly that mistake.
WRONG_METHOD = [
    ("POST", "/v1/models", "GET"),
    ("GET", "/v1/models/foo:predict", "POST"),
    ("POST", "/v1/models/foo/metadata", "GET"),
]


@pytest.mark.parametrize("method, path, allowed", WRONG_METHOD, ids=[f"{m} {p}" for m, p, _ in WRONG_METHOD])
def test_a_wrong_method_is_405_where_tf_says_400_malformed_request(app, method, path, allowed):
    status, message = error_of(app, method, path)
    assert status == 405 and f"use {allowed}" in message, message
