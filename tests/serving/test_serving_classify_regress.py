"""torchestimator.serving.examples_json: TF Serving's :classify and :regress JSON over named-tensor exports."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import make_estimator

import torchestimator as te
from torchestimator.export import (
    ClassificationOutput,
    PredictOutput,
    RegressionOutput,
    TensorSpec,
    export_saved_model,
    load,
    serving_input_receiver,
)
from torchestimator.serving.errors import ServingError
from torchestimator.serving.examples_json import classify_results, parse_examples_request, regress_results


class HalfPlusThree(nn.Module):
    """y = 0.5 x + 3, TF Serving's test model; trained with lr 0 so the weights stay exact."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))
        self.shift = nn.Parameter(torch.tensor(3.0))

    def forward(self, x):
        return x * self.scale + self.shift


def model_fn(model, features, labels, mode):
    y = model(features["x"])
    if mode == te.ModeKeys.PREDICT:
        scores = torch.stack([y, 2 * y], dim=1)
        class_ids = torch.zeros_like(scores, dtype=torch.int64) + torch.arange(2)
        above = (y > 3.75).to(torch.int64)
        return te.EstimatorSpec(
            mode,
            predictions={"y": y},
            export_outputs={
                "serving_default": PredictOutput({"y": y}),
                "tensorflow/serving/regress": RegressionOutput(y),
                "tensorflow/serving/classify": ClassificationOutput(scores=scores, classes=class_ids),
                "scores_only": ClassificationOutput(scores=scores),
                "classes_only": ClassificationOutput(classes=above),
                "mismatched": ClassificationOutput(scores=scores, classes=above),
            },
        )
    return te.EstimatorSpec(mode, predictions={"y": y}, loss=F.mse_loss(y, labels))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One estimator exported three ways: x of shape [-1]; x [-1, 1] with an int64 shift; x [-1, 2, 2] summed."""
    root = tmp_path_factory.mktemp("classify_regress")
    x = np.arange(8, dtype=np.float32)
    train = te.numpy_input_fn({"x": x}, 0.5 * x + 3, batch_size=4, num_epochs=None, shuffle=False)
    estimator = make_estimator(
        root / "model",
        model=HalfPlusThree,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.0),
        model_fn=model_fn,
    )
    estimator.train(train, max_steps=1)
    half = serving_input_receiver({"x": TensorSpec(shape=(None,))})
    pair = serving_input_receiver(
        {"x": TensorSpec(shape=(None, 1)), "shift": TensorSpec(shape=(None,), dtype=torch.int64)},
        receiver_fn=lambda tensors: {"x": tensors["x"][:, 0] + tensors["shift"].to(torch.float32)},
    )
    matrix = serving_input_receiver(
        {"x": TensorSpec(shape=(None, 2, 2))}, receiver_fn=lambda tensors: {"x": tensors["x"].sum(dim=(1, 2))}
    )
    return {
        name: load(export_saved_model(estimator, root / name, receiver))
        for name, receiver in {"half": half, "pair": pair, "matrix": matrix}.items()
    }


def run(model, document, method):
    request = parse_examples_request(document, model, method)
    outputs = model(request.inputs, signature_name=request.signature_name)
    return (classify_results if method == "classify" else regress_results)(outputs, request.count)


def refused(model, document, method="regress", code="INVALID_ARGUMENT") -> str:
    with pytest.raises(ServingError) as caught:
        run(model, document, method)
    assert caught.value.code == code
    return caught.value.message


# -- the documented examples -----------------------------------------------------------


def test_half_plus_three_regress_answers_as_tf_serving_documents(models):
    document = {"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]}
    assert run(models["half"], document, "regress") == {"results": [3.5, 4.0]}
    # TF reads a bool as int64 1/0; a number is a number, whatever its JSON spelling.
    assert run(models["half"], {**document, "examples": [{"x": True}, {"x": 2}]}, "regress") == {"results": [3.5, 4.0]}
    request = parse_examples_request(document, models["half"], "regress")
    assert request.count == 2 and request.signature_name == "tensorflow/serving/regress"
    assert request.inputs["x"].dtype == torch.float32 and request.inputs["x"].shape == (2,)


def test_classify_pairs_labels_and_scores_per_example(models):
    document = {"signature_name": "tensorflow/serving/classify", "examples": [{"x": 1.0}, {"x": 2.0}]}
    assert run(models["half"], document, "classify") == {
        "results": [[["0", 3.5], ["1", 7.0]], [["0", 4.0], ["1", 8.0]]]
    }


def test_scores_only_give_empty_labels_and_classes_only_give_zero_scores(models):
    examples = {"examples": [{"x": 1.0}, {"x": 2.0}]}
    assert run(models["half"], {"signature_name": "scores_only", **examples}, "classify") == {
        "results": [[["", 3.5], ["", 7.0]], [["", 4.0], ["", 8.0]]]
    }
    # classes of shape [batch] count as one class per example; TF leaves the unset score 0.
    assert run(models["half"], {"signature_name": "classes_only", **examples}, "classify") == {
        "results": [[["0", 0.0]], [["1", 0.0]]]
    }


def test_a_scalar_feeds_an_input_of_shape_minus_one_by_one_and_context_is_merged(models):
    document = {
        "signature_name": "tensorflow/serving/regress",
        "context": {"shift": 2},
        "examples": [{"x": 1.0}, {"x": [2.0]}],
    }
    request = parse_examples_request(document, models["pair"], "regress")
    assert request.inputs["x"].shape == (2, 1) and request.inputs["shift"].tolist() == [2, 2]
    assert request.inputs["shift"].dtype == torch.int64
    assert run(models["pair"], document, "regress") == {"results": [4.5, 5.0]}
    # Without context, each example carries every input; true reads as 1, as TF reads a bool.
    document = {
        "signature_name": "tensorflow/serving/regress",
        "examples": [{"x": 1.0, "shift": 0}, {"x": 1.0, "shift": True}],
    }
    assert run(models["pair"], document, "regress") == {"results": [3.5, 4.0]}


def test_nested_and_flat_lists_fill_inputs_with_more_dimensions(models):
    document = {
        "signature_name": "tensorflow/serving/regress",
        "examples": [{"x": [[1.0, 1.0], [1.0, 1.0]]}, {"x": [0.5, 0.5, 0.5, 0.5]}],
    }
    request = parse_examples_request(document, models["matrix"], "regress")
    assert request.inputs["x"].shape == (2, 2, 2)
    assert run(models["matrix"], document, "regress") == {"results": [5.0, 4.0]}


def test_float32_results_are_exact_doubles(models):
    document = {"signature_name": "tensorflow/serving/regress", "examples": [{"x": 0.1}]}
    (value,) = run(models["half"], document, "regress")["results"]
    assert value == float(np.float32(0.1) * np.float32(0.5) + np.float32(3.0))
    assert type(value) is float


# -- request errors --------------------------------------------------------------------


def test_signature_selection_and_method_checks_use_tf_messages(models):
    half = models["half"]
    message = refused(half, {"signature_name": "nope", "examples": [{"x": 1.0}]})
    assert 'Serving signature name: "nope" not found in signature def' in message
    message = refused(half, {"examples": [{"x": 1.0}]}, "classify")  # serving_default is a predict signature
    assert message.startswith(
        "Expected classification signature method_name to be tensorflow/serving/classify. "
        "Was: tensorflow/serving/predict"
    )
    assert "tensorflow/serving/classify" in message.split("Was:")[1]  # names the signatures that would fit
    message = refused(half, {"signature_name": "tensorflow/serving/classify", "examples": [{"x": 1.0}]})
    assert message.startswith(
        "Expected regression signature method_name to be tensorflow/serving/regress. Was: tensorflow/serving/classify"
    )
    assert "'signature_name' key must be a string value" in refused(half, {"signature_name": 3, "examples": []})
    with pytest.raises(ValueError, match="'classify' or 'regress'"):
        parse_examples_request({"examples": [{"x": 1.0}]}, half, "predict")


@pytest.mark.parametrize(
    "document, message",
    [
        ({"signature_name": "tensorflow/serving/regress"}, "When method is regress, key 'examples' is expected"),
        ({"examples": {"x": 1.0}}, "Expecting 'examples' value to be an list/array"),
        ({"examples": []}, "'examples' value is an empty array"),
        ({"examples": [{"x": 1.0}, [1.0]]}, r"Example must be JSON object but got JSON Array (examples[1])"),
        ({"context": [1], "examples": [{"x": 1.0}]}, "Example must be JSON object but got JSON Array ('context')"),
    ],
)
def test_malformed_examples_are_refused_with_tf_messages(models, document, message):
    assert message in refused(models["half"], {"signature_name": "tensorflow/serving/regress", **document})


def test_features_must_match_the_signature_inputs(models):
    pair, regress = models["pair"], {"signature_name": "tensorflow/serving/regress"}
    message = refused(pair, {**regress, "examples": [{"x": 1.0, "shift": 1}, {"x": 1.0}]})
    assert "examples[1]" in message and "missing features ['shift']" in message and "'shift': int64 [-1]" in message
    message = refused(pair, {**regress, "examples": [{"x": 1.0, "shift": 1, "extra": 2}]})
    assert "unexpected features ['extra']" in message
    message = refused(pair, {**regress, "context": {"shift": 1}, "examples": [{"x": 1.0, "shift": 2}]})
    assert "['shift'] of examples[0] are also in 'context'" in message


@pytest.mark.parametrize(
    "value, message",
    [
        ("one", "holds strings; signature input 'x' takes numeric tensors only"),
        ({"b64": "AAAA"}, "holds bytes"),
        ({"b64": "not base64!"}, "Unable to base64 decode"),
        ({"value": 1}, "Feature: x has element with unexpected JSON type: Object"),
        (None, "Feature: x has element with unexpected JSON type: Null"),
        ([1.0, None], "Feature: x has element with unexpected JSON type: Null"),
        ([[1.0], [1.0, 2.0]], "ragged or mis-nested"),
        ([1.0, 2.0], "has shape [2] (2 values)"),
        (1e39, "Cannot convert JSON value: 1e+39 to float32 without loss of precision"),
    ],
)
def test_bad_float_feature_values_are_named(models, value, message):
    document = {"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": value}]}
    found = refused(models["half"], document)
    assert message in found
    assert "'x'" in found or "x has" in found


@pytest.mark.parametrize(
    "value, message",
    [
        (1.5, "holds non-integer numbers; expected int64"),
        (2**63, "has uint64 element. Only int64 is supported"),
        (2**70, "numbers out of range"),
    ],
)
def test_bad_integer_feature_values_are_named(models, value, message):
    document = {"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0, "shift": value}]}
    assert message in refused(models["pair"], document)


def test_examples_with_different_shapes_for_a_dynamic_input_are_refused():
    from torchestimator.export import TensorInfo
    from torchestimator.serving.examples_json import _feature_tensor

    info = TensorInfo(dtype="float32", shape=(-1, -1))
    assert _feature_tensor("tokens", [[1.0, 2.0], [3.0, 4.0]], info, None).shape == (2, 2)
    with pytest.raises(ServingError, match=r"different shapes across examples \[\(2,\), \(3,\)\]"):
        _feature_tensor("tokens", [[1.0, 2.0], [1.0, 2.0, 3.0]], info, None)
    with pytest.raises(ServingError, match="is a scalar"):
        _feature_tensor("x", [1.0], TensorInfo(dtype="float32", shape=()), None)


# -- output errors ---------------------------------------------------------------------


def test_classify_output_shapes_that_do_not_fit_are_refused_with_tf_messages(models):
    document = {"signature_name": "mismatched", "examples": [{"x": 1.0}]}
    assert "Tensors class and score should match in dim_size(1). Got 1 vs. 2" in refused(
        models["half"], document, "classify"
    )
    scores = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(ServingError, match=r"Expected Tensor shape: \[batch_size num_classes\] but got \[2,3,1\]"):
        classify_results({"scores": scores[..., None]}, 2)
    with pytest.raises(ServingError, match="Expected scores output batch size of 3. Got: 2"):
        classify_results({"scores": scores}, 3)
    with pytest.raises(ServingError, match="Expected scores Tensor of DT_FLOAT. Got: DT_INT64"):
        classify_results({"scores": scores.astype(np.int64)}, 2)
    with pytest.raises(ServingError, match="Expected classes Tensor of DT_STRING. Got: DT_FLOAT"):
        classify_results({"classes": scores}, 2)
    with pytest.raises(ServingError, match='at least one of "classes" or "scores"') as caught:
        classify_results({"logits": scores}, 2)
    assert caught.value.code == "FAILED_PRECONDITION"


def test_classify_accepts_string_and_bytes_labels():
    labels = np.array([[b"cat", b"dog"]], dtype=object)
    result = classify_results({"classes": labels, "scores": np.array([[0.25, 0.75]], dtype=np.float32)}, 1)
    assert result == {"results": [[["cat", 0.25], ["dog", 0.75]]]}
    assert classify_results({"classes": np.array([["a"], ["b"]])}, 2) == {"results": [[["a", 0.0]], [["b", 0.0]]]}


def test_regress_output_shapes_that_do_not_fit_are_refused_with_tf_messages():
    values = np.array([1.0, 2.0], dtype=np.float32)
    assert regress_results({"outputs": values[:, None]}, 2) == {"results": [1.0, 2.0]}
    with pytest.raises(ServingError, match=r"either \[batch_size\] or \[batch_size, 1\] but got \[2,2\]"):
        regress_results({"outputs": np.ones((2, 2), dtype=np.float32)}, 2)
    with pytest.raises(ServingError, match="Input batch size did not match output batch size: 3 vs. 2"):
        regress_results({"outputs": values}, 3)
    with pytest.raises(ServingError, match="Expected output Tensor of DT_FLOAT.  Got: DT_INT64"):
        regress_results({"outputs": values.astype(np.int64)}, 2)
    with pytest.raises(ServingError, match="No regression outputs found") as caught:
        regress_results({"y": values}, 2)
    assert caught.value.code == "FAILED_PRECONDITION"
    assert math.isnan(regress_results({"outputs": np.array([np.nan], dtype=np.float32)}, 1)["results"][0])
