"""TF Serving's gRPC API (serving/grpc_server.py): a real grpcio client made from protos.py's messages against a
served export, every RPC, version and label selection, every error code, and answers equal to REST's."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import urllib.request

import grpc
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import make_estimator

import torchestimator as te
from torchestimator.data import FixedLenFeature
from torchestimator.data.example import encode_example
from torchestimator.export import (
    ClassificationOutput,
    PredictOutput,
    RegressionOutput,
    TensorSpec,
    build_parsing_serving_input_receiver,
    export_saved_model,
    serving_input_receiver,
)
from torchestimator.serving import start
from torchestimator.serving.grpc_client import ModelServiceStub, PredictionServiceStub
from torchestimator.serving.protos import DATA_TYPES, serving_protos
from torchestimator.serving.tensor_proto import make_tensor_proto, tensor_proto_to_numpy

protos = serving_protos()


class HalfPlusThree(nn.Module):
    """y = 0.5 x + shift + 3 (TF Serving's test model, with an int64 second input); lr 0 keeps it exact."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))
        self.bias = nn.Parameter(torch.tensor(3.0))

    def forward(self, x):
        return x * self.scale + self.bias


def model_fn(model, features, labels, mode):
    y = model(features["x"])
    if mode == te.ModeKeys.PREDICT:
        scores = torch.stack([y, 2 * y], dim=1)
        classes = torch.zeros_like(scores, dtype=torch.int64) + torch.arange(2)
        return te.EstimatorSpec(
            mode,
            predictions={"y": y},
            export_outputs={
                "serving_default": PredictOutput({"y": y, "twice": 2 * y}),
                "tensorflow/serving/regress": RegressionOutput(y),
                "tensorflow/serving/classify": ClassificationOutput(scores=scores, classes=classes),
            },
        )
    return te.EstimatorSpec(mode, predictions={"y": y}, loss=F.mse_loss(y, labels))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Versions 1 and 2 of one export (labels stable -> 1, canary -> 2), served over REST and gRPC."""
    root = tmp_path_factory.mktemp("grpc")
    x = np.arange(8, dtype=np.float32)
    train = te.numpy_input_fn({"x": x}, 0.5 * x + 3, batch_size=4, num_epochs=None, shuffle=False)
    estimator = make_estimator(
        root / "model",
        model=HalfPlusThree,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.0),
        model_fn=model_fn,
    )
    estimator.train(train, max_steps=1)
    receiver = serving_input_receiver(
        {"x": TensorSpec(shape=(None, 1)), "shift": TensorSpec(shape=(None,), dtype=torch.int64)},
        receiver_fn=lambda tensors: {"x": tensors["x"][:, 0] + tensors["shift"].to(torch.float32)},
    )
    exported = export_saved_model(estimator, root / "exports", receiver)
    base = root / "half"
    for version in (1, 2):
        shutil.copytree(exported, base / str(version))
    parsing = build_parsing_serving_input_receiver({"x": FixedLenFeature([], "float32")})
    shutil.copytree(export_saved_model(estimator, root / "parsing", parsing), root / "parsed" / "1")
    config = root / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "half" base_path: "{base}" '
        'model_version_policy { all {} } version_labels { key: "stable" value: 1 } '
        'version_labels { key: "canary" value: 2 } } '
        f'config {{ name: "parsed" base_path: "{root / "parsed"}" }} }}'
    )
    with start(model_config_file=str(config), grpc_port=0, file_system_poll_wait_seconds=0) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            yield {"server": server, "predict": PredictionServiceStub(channel), "model": ModelServiceStub(channel)}


def predict_request(x, shift, **spec):
    request = protos.PredictRequest()
    request.model_spec.name = spec.pop("name", "half")
    if "version" in spec:
        request.model_spec.version.value = spec.pop("version")
    if "label" in spec:
        request.model_spec.version_label = spec.pop("label")
    request.model_spec.signature_name = spec.pop("signature_name", "")
    content = spec.pop("tensor_content", False)
    request.inputs["x"].CopyFrom(make_tensor_proto(np.asarray(x, np.float32), tensor_content=content))
    request.inputs["shift"].CopyFrom(make_tensor_proto(np.asarray(shift, np.int64), tensor_content=content))
    request.output_filter.extend(spec.pop("output_filter", []))
    assert not spec
    return request


def rest(server, path, document):
    request = urllib.request.Request(server.url + path, data=json.dumps(document).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def grpc_error(call, request):
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    return caught.value.code(), caught.value.details()


# -- Predict ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tensor_content", [False, True])
def test_predict_equals_rest_with_typed_fields_and_tensor_content(served, tensor_content):
    x, shift = [[1.0], [2.0], [5.0]], [0, 1, 2]
    response = served["predict"].Predict(predict_request(x, shift, tensor_content=tensor_content), timeout=30)
    assert response.model_spec.name == "half" and response.model_spec.version.value == 2  # the latest
    assert response.model_spec.signature_name == "serving_default"
    y = response.outputs["y"]
    assert y.dtype == DATA_TYPES["DT_FLOAT"] and [dim.size for dim in y.tensor_shape.dim] == [3]
    assert len(y.float_val) == 3 and not y.tensor_content  # TF Serving answers in typed fields (AsProtoField)
    expected = rest(served["server"], "/v1/models/half:predict", {"inputs": {"x": x, "shift": shift}})["outputs"]
    assert tensor_proto_to_numpy(y).tolist() == expected["y"] == [3.5, 4.5, 6.5]
    assert tensor_proto_to_numpy(response.outputs["twice"]).tolist() == expected["twice"]


def test_output_filter_version_and_label_select_what_answers(served):
    stub = served["predict"]
    response = stub.Predict(predict_request([[1.0]], [0], output_filter=["twice"]), timeout=30)
    assert list(response.outputs) == ["twice"] and list(response.outputs["twice"].float_val) == [7.0]
    assert stub.Predict(predict_request([[1.0]], [0], version=1), timeout=30).model_spec.version.value == 1
    assert stub.Predict(predict_request([[1.0]], [0], label="stable"), timeout=30).model_spec.version.value == 1
    assert stub.Predict(predict_request([[1.0]], [0], label="canary"), timeout=30).model_spec.version.value == 2


@pytest.mark.parametrize(
    "change, code, words",
    [
        (dict(name="nope"), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(nope)"),
        (dict(version=7), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Specific(half, 7)"),
        (dict(label="gone"), grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: gone"),
        (dict(signature_name="nope"), grpc.StatusCode.INVALID_ARGUMENT, 'Serving signature name: "nope" not found'),
        (
            dict(output_filter=["nope"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "output tensor alias not found in signature: nope Outputs expected to be in the set {twice,y}",
        ),
        (dict(output_filter=["y", "y"]), grpc.StatusCode.INVALID_ARGUMENT, "duplicate output tensor alias: y"),
    ],
)
def test_predict_errors_carry_tf_serving_codes_and_words(served, change, code, words):
    found_code, details = grpc_error(served["predict"].Predict, predict_request([[1.0]], [0], **change))
    assert found_code == code and words in details


def test_bad_tensors_are_invalid_argument_naming_the_input(served):
    stub = served["predict"]
    request = predict_request([[1.0]], [0])
    request.inputs["x"].CopyFrom(make_tensor_proto(np.ones((1, 1), np.float64)))
    code, details = grpc_error(stub.Predict, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "Expects arg[1] to be float but double is provided" in details
    request = predict_request([[1.0], [2.0]], [0, 1])
    request.inputs["x"].float_val.append(3.0)  # 3 values for 2 elements
    code, details = grpc_error(stub.Predict, request)
    assert (
        code == grpc.StatusCode.INVALID_ARGUMENT
        and "input 'x': float_val holds 3 values; shape [2, 1] needs 2" in details
    )
    request = predict_request([[1.0]], [0])
    del request.inputs["shift"]
    code, details = grpc_error(stub.Predict, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "Missing but required: ['shift']" in details
    request = predict_request([[1.0, 2.0]], [0])  # x is [-1, 1]: the loader's shape check
    code, details = grpc_error(stub.Predict, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "'x'" in details
    request = predict_request([[1.0]], [0])
    request.ClearField("model_spec")
    assert grpc_error(stub.Predict, request) == (grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")


def test_garbage_bytes_are_invalid_argument(served):
    with grpc.insecure_channel(served["server"].grpc_target) as channel:
        raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        with pytest.raises(grpc.RpcError) as caught:
            raw(b"\xff\xff\xff", timeout=30)
        assert (
            caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "not a valid serialized" in caught.value.details()
        )
        unknown = channel.unary_unary("/tensorflow.serving.PredictionService/MultiInference")
        with pytest.raises(grpc.RpcError) as caught:
            unknown(b"", timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


# -- Classify and Regress -----------------------------------------------------------------------


def examples_input(message, examples, context=None):
    if context is None:
        message.input.example_list.examples.extend(encode_example(example) for example in examples)
    else:
        listed = message.input.example_list_with_context
        listed.examples.extend(encode_example(example) for example in examples)
        listed.context = encode_example(context)


def test_classify_and_regress_take_examples_with_context_as_rest_does(served):
    stub = served["predict"]
    request = protos.RegressionRequest()
    request.model_spec.name = "half"
    request.model_spec.signature_name = "tensorflow/serving/regress"
    examples_input(request, [{"x": [1.0]}, {"x": [5.0]}], context={"shift": [1]})
    response = stub.Regress(request, timeout=30)
    values = [regression.value for regression in response.result.regressions]
    expected = rest(
        served["server"],
        "/v1/models/half:regress",
        {"signature_name": "tensorflow/serving/regress", "context": {"shift": 1}, "examples": [{"x": 1.0}, {"x": 5.0}]},
    )["results"]
    assert values == expected == [4.0, 6.0]
    assert response.model_spec.signature_name == "tensorflow/serving/regress"
    request = protos.ClassificationRequest()
    request.model_spec.name = "half"
    request.model_spec.version_label = "stable"
    request.model_spec.signature_name = "tensorflow/serving/classify"
    examples_input(request, [{"x": [1.0], "shift": [0]}])
    response = stub.Classify(request, timeout=30)
    assert response.model_spec.version.value == 1
    assert [[(c.label, c.score) for c in row.classes] for row in response.result.classifications] == [
        [("0", 3.5), ("1", 7.0)]
    ]
    request.ClearField("input")
    code, details = grpc_error(stub.Classify, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "Input is empty" in details
    request.input.example_list.examples.append(b"\xff\x01")
    code, details = grpc_error(stub.Classify, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "input.example_list.examples[0]" in details


def test_a_parsing_receiver_takes_examples_and_dt_string_tensors(served):
    """The export's string input (serialized tf.Examples): Classify's Examples and a Predict DT_STRING tensor."""
    stub = served["predict"]
    request = protos.ClassificationRequest()
    request.model_spec.name = "parsed"
    request.model_spec.signature_name = "tensorflow/serving/classify"
    examples_input(request, [{"x": [1.0]}, {"x": [3.0]}])
    rows = [
        [(c.label, c.score) for c in row.classes] for row in stub.Classify(request, timeout=30).result.classifications
    ]
    expected = rest(
        served["server"],
        "/v1/models/parsed:classify",
        {"signature_name": "tensorflow/serving/classify", "examples": [{"x": 1.0}, {"x": 3.0}]},
    )["results"]
    assert (
        rows
        == [[tuple(pair) for pair in row] for row in expected]
        == [[("0", 3.5), ("1", 7.0)], [("0", 4.5), ("1", 9.0)]]
    )
    request = protos.PredictRequest()
    request.model_spec.name = "parsed"
    request.inputs["examples"].CopyFrom(make_tensor_proto([encode_example({"x": [x]}) for x in (1.0, 3.0)]))
    y = served["predict"].Predict(request, timeout=30).outputs["y"]
    assert tensor_proto_to_numpy(y).tolist() == [3.5, 4.5]
    request.inputs["examples"].CopyFrom(make_tensor_proto([encode_example({"x": [1.0]}), b"\xff\x01"]))
    code, details = grpc_error(stub.Predict, request)  # the decode step's error names the record
    assert (
        code == grpc.StatusCode.INVALID_ARGUMENT
        and "Could not parse example input" in details
        and "(record 1: not a valid serialized Example" in details
    ), details
    request.inputs["examples"].CopyFrom(make_tensor_proto(np.ones(2, np.float32)))
    code, details = grpc_error(stub.Predict, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "to be string but float is provided" in details


def test_predict_on_a_classify_signature_takes_tfs_input_name_inputs(served):
    """TF names a classify/regress signature's one string input "inputs" (predict's keeps "examples")."""
    request = protos.PredictRequest()
    request.model_spec.name = "parsed"
    request.model_spec.signature_name = "tensorflow/serving/classify"
    request.inputs["inputs"].CopyFrom(make_tensor_proto([encode_example({"x": [x]}) for x in (1.0, 3.0)]))
    outputs = served["predict"].Predict(request, timeout=30).outputs
    assert tensor_proto_to_numpy(outputs["scores"]).tolist() == [[3.5, 7.0], [4.5, 9.0]]
    serialized = [{"b64": base64.b64encode(encode_example({"x": [x]})).decode()} for x in (1.0, 3.0)]
    assert rest(
        served["server"],
        "/v1/models/parsed:predict",
        {  # REST's named form, as TF's
            "signature_name": "tensorflow/serving/classify",
            "inputs": {"inputs": serialized},
        },
    )["outputs"]["scores"] == [[3.5, 7.0], [4.5, 9.0]]
    with urllib.request.urlopen(served["server"].url + "/v1/models/parsed/metadata", timeout=30) as page:
        definitions = json.loads(page.read())["metadata"]["signature_def"]["signature_def"]
    assert [list(definitions[name]["inputs"]) for name in sorted(definitions)] == [["examples"], ["inputs"], ["inputs"]]
    request.model_spec.signature_name = "tensorflow/serving/regress"
    outputs = served["predict"].Predict(request, timeout=30).outputs
    assert tensor_proto_to_numpy(outputs["outputs"]).tolist() == [3.5, 4.5]
    request.inputs["examples"].CopyFrom(request.inputs.pop("inputs"))
    code, details = grpc_error(served["predict"].Predict, request)  # TF Serving refuses it too
    assert (
        code == grpc.StatusCode.INVALID_ARGUMENT
        and "Sent extra: ['examples']" in details
        and "Missing but required: ['inputs']" in details
    ), details


# -- GetModelMetadata and GetModelStatus --------------------------------------------------------


def test_metadata_packs_the_signature_def_map_as_tf_serving(served):
    request = protos.GetModelMetadataRequest()
    request.model_spec.name = "half"
    request.metadata_field.append("signature_def")
    response = served["predict"].GetModelMetadata(request, timeout=30)
    assert response.model_spec.version.value == 2
    packed = response.metadata["signature_def"]
    assert packed.type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    signatures = protos.SignatureDefMap.FromString(packed.value).signature_def
    assert sorted(signatures) == ["serving_default", "tensorflow/serving/classify", "tensorflow/serving/regress"]
    shift = signatures["serving_default"].inputs["shift"]
    assert shift.dtype == DATA_TYPES["DT_INT64"] and [dim.size for dim in shift.tensor_shape.dim] == [-1]
    assert signatures["tensorflow/serving/regress"].method_name == "tensorflow/serving/regress"
    # Classify over tensor inputs (beyond TF) keeps the receiver's names.
    assert sorted(signatures["tensorflow/serving/classify"].inputs) == ["shift", "x"]
    request.model_spec.name = "parsed"
    parsed = protos.SignatureDefMap.FromString(
        served["predict"].GetModelMetadata(request, timeout=30).metadata["signature_def"].value
    ).signature_def
    assert {
        name: {key: (info.name, info.dtype) for key, info in definition.inputs.items()}
        for name, definition in parsed.items()
    } == {
        "serving_default": {"examples": ("examples", DATA_TYPES["DT_STRING"])},
        "tensorflow/serving/classify": {"inputs": ("examples", DATA_TYPES["DT_STRING"])},
        "tensorflow/serving/regress": {"inputs": ("examples", DATA_TYPES["DT_STRING"])},
    }
    request.model_spec.name = "half"
    request.metadata_field[:] = ["nope"]
    code, details = grpc_error(served["predict"].GetModelMetadata, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "Metadata field nope is not supported" in details


def test_model_status_lists_versions_and_errors_as_tf(served):
    request = protos.GetModelStatusRequest()
    request.model_spec.name = "half"
    statuses = served["model"].GetModelStatus(request, timeout=30).model_version_status
    assert [(status.version, status.state, status.status.error_code) for status in statuses] == [(1, 30, 0), (2, 30, 0)]
    request.model_spec.version.value = 9
    assert grpc_error(served["model"].GetModelStatus, request) == (
        grpc.StatusCode.NOT_FOUND,
        "Could not find version 9 of model half",
    )
    request.model_spec.name = "nope"
    assert grpc_error(served["model"].GetModelStatus, request)[0] == grpc.StatusCode.NOT_FOUND


def test_grpc_requests_are_counted_in_the_metrics_with_entrypoint_grpc(served):
    def grpc_predictions():
        with urllib.request.urlopen(served["server"].url + "/monitoring/prometheus/metrics", timeout=30) as page:
            text = page.read().decode()
        series = ':tensorflow:serving:request_latency_count{API="Predict",entrypoint="GRPC",model_name="half"} '
        return float(text.split(series)[1].split()[0]) if series in text else 0.0

    before = grpc_predictions()
    for _ in range(3):
        served["predict"].Predict(predict_request([[1.0]], [0]), timeout=30)
    assert grpc_predictions() == before + 3


# -- TensorProto conversion ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    [
        np.float32,
        np.float64,
        np.int32,
        np.int16,
        np.int8,
        np.uint8,
        np.uint16,
        np.int64,
        np.bool_,
        np.float16,
        np.uint32,
        np.uint64,
        np.complex64,
    ],
)
def test_tensor_proto_round_trips_every_dtype_both_ways(dtype):
    array = (
        (np.arange(6).reshape(2, 3) % 3 == 1)
        if dtype is np.bool_
        else (np.arange(6).reshape(2, 3) * (1 + 1j) if dtype is np.complex64 else np.arange(6).reshape(2, 3)).astype(
            dtype
        )
    )
    for content in (False, True):
        back = tensor_proto_to_numpy(
            protos.TensorProto.FromString(make_tensor_proto(array, tensor_content=content).SerializeToString())
        )
        assert back.dtype == array.dtype and back.shape == (2, 3) and np.array_equal(back, array)


def test_one_value_fills_the_shape_and_strings_and_bad_shapes_are_named():
    proto = make_tensor_proto(np.array([2.5], np.float32))
    proto.tensor_shape.dim[0].size = 4
    assert tensor_proto_to_numpy(proto).tolist() == [2.5] * 4
    strings = make_tensor_proto([b"a", "b"])
    assert strings.dtype == DATA_TYPES["DT_STRING"] and tensor_proto_to_numpy(strings).tolist() == [b"a", b"b"]
    bfloat = protos.TensorProto(dtype=DATA_TYPES["DT_BFLOAT16"], half_val=[0x3F80])  # 1.0
    bfloat.tensor_shape.dim.add(size=1)
    assert tensor_proto_to_numpy(bfloat).tolist() == [0x3F80]
    proto.tensor_shape.unknown_rank = True
    with pytest.raises(ValueError, match="in: tensor_shape has unknown_rank"):
        tensor_proto_to_numpy(proto, where="in")
    content = make_tensor_proto(np.ones(3, np.float32), tensor_content=True)
    content.tensor_content = content.tensor_content[:-1]
    with pytest.raises(ValueError, match="tensor_content holds 11 bytes; shape \\[3\\] of DT_FLOAT needs 12"):
        tensor_proto_to_numpy(content)


# -- the command line ---------------------------------------------------------------------------


def test_a_busy_grpc_port_is_one_clear_error(served):
    busy = served["server"].grpc_port
    with pytest.raises(OSError, match=f"cannot listen for gRPC on 127.0.0.1:{busy}: the port is in use"):
        start("half", served["server"].managers["half"].base_path, grpc_port=busy, file_system_poll_wait_seconds=0)
    with socket.create_connection(("127.0.0.1", served["server"].port), timeout=5):
        pass  # the first server still answers


def test_batching_serves_grpc_and_rest_requests_in_the_same_batches(served, tmp_path):
    """--enable_batching: concurrent gRPC and REST requests go through the one batch scheduler."""
    import concurrent.futures

    from torchestimator.serving import BatchingParameters

    base = served["server"].managers["half"].base_path
    batching = BatchingParameters(max_batch_size=8, batch_timeout_micros=20000)
    with start("half", base, grpc_port=0, batching=batching, file_system_poll_wait_seconds=0) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = PredictionServiceStub(channel)

            def one(index):
                if index % 2:
                    return rest(server, "/v1/models/half:predict", {"inputs": {"x": [[float(index)]], "shift": [0]}})[
                        "outputs"
                    ]["y"]
                return list(stub.Predict(predict_request([[float(index)]], [0]), timeout=30).outputs["y"].float_val)

            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(one, range(6)))
        assert answers == [[0.5 * index + 3] for index in range(6)]
        batches = request_core_of_server(server).metrics.value(
            ":tensorflow:serving:batching:batch_size_count",
            {"model_name": "model_name_unset", "op_name": "torchestimator_batcher"},
        )
        assert batches is not None and 1 <= batches < 6  # some requests shared a batch


def request_core_of_server(server):
    from torchestimator.serving.app import request_core_of

    return request_core_of(server._app)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_cli_serves_grpc_on_port_and_refuses_a_busy_one_in_one_line(served):
    """`serve --port P` as a user runs it: announced, answered by TF's method path, stopped by SIGTERM; a second
    serve on the same --port exits 2 with one line naming the address."""
    import os
    import subprocess
    import sys

    base = served["server"].managers["half"].base_path
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "torchestimator.cli",
        "serve",
        "--model_name",
        "half",
        "--model_base_path",
        base,
        "--rest_api_port",
        "0",
        "--port",
        str(port),
        "--file_system_poll_wait_seconds",
        "0",
    ]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment)
    try:
        line = server.stdout.readline()
        assert line.rstrip().endswith(f" and gRPC 127.0.0.1:{port}"), line
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            response = PredictionServiceStub(channel).Predict(predict_request([[1.0]], [0]), timeout=30)
        assert list(response.outputs["y"].float_val) == [3.5]
        busy = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
        assert busy.returncode == 2
        assert (
            busy.stderr.strip()
            .splitlines()[-1]
            .startswith(f"torchestimator serve: error: cannot listen for gRPC on 127.0.0.1:{port}: the port is in use")
        ), busy.stderr
        assert busy.stderr.strip().endswith("choose another --port.")
    finally:
        server.terminate()
        assert server.wait(timeout=60) in (0, -15)


def test_a_request_over_the_body_limit_is_resource_exhausted(served):
    """The largest gRPC request is the REST body limit (--max_body_bytes), as grpcio words it."""
    base = served["server"].managers["half"].base_path
    with start("half", base, grpc_port=0, max_body_bytes=4096, file_system_poll_wait_seconds=0) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = PredictionServiceStub(channel)
            assert stub.Predict(predict_request([[1.0]], [0]), timeout=30).outputs["y"].float_val[0] == 3.5
            big = predict_request(np.ones((1000, 1)), np.zeros(1000), tensor_content=True)  # ~12 KB
            code, details = grpc_error(stub.Predict, big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "4096" in details


def test_an_image_client_over_grpc_gets_the_classes_estimator_predict_gives(tmp_path):
    """TF Serving's image-classification client over gRPC: encoded PNG/JPEG bytes as a DT_STRING tensor."""
    import io

    from PIL import Image

    from torchestimator.data import ImageDecoding
    from torchestimator.export import build_image_serving_input_receiver

    generator = np.random.default_rng(0)
    encoded = []
    for index in range(6):
        buffer = io.BytesIO()
        Image.fromarray(generator.integers(0, 256, (10, 10), dtype=np.uint8)).save(
            buffer, format="PNG" if index % 2 else "JPEG", quality=95
        )
        encoded.append(buffer.getvalue())
    decoding = ImageDecoding(size=(8, 8), channels=1, layout="CHW", scale=1 / 255)

    def image_model_fn(model, features, labels, mode):
        logits = model(features["image"])
        predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions=predictions)
        return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))

    estimator = make_estimator(
        tmp_path / "model", model=lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 5)), model_fn=image_model_fn
    )
    images = decoding.decode_batch(encoded)
    # Trained until it tells the six images apart (3 classes), so a wrong decode cannot match by chance.
    estimator.train(
        te.numpy_input_fn({"image": images}, np.arange(6) % 3, batch_size=6, num_epochs=None, shuffle=False),
        max_steps=60,
    )
    expected = [row["class"] for row in estimator.predict(te.numpy_input_fn({"image": images}, shuffle=False))]
    estimator.export_saved_model(str(tmp_path / "images"), build_image_serving_input_receiver(decoding))
    with start("images", tmp_path / "images", grpc_port=0, file_system_poll_wait_seconds=0) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            request = protos.PredictRequest()
            request.model_spec.name = "images"
            request.inputs["image_bytes"].CopyFrom(make_tensor_proto(encoded))
            response = PredictionServiceStub(channel).Predict(request, timeout=30)
    assert tensor_proto_to_numpy(response.outputs["class"]).tolist() == expected
    assert len(set(expected)) > 1  # the images tell apart: a wrong decode would not match by chance


def test_string_inputs_are_decoded_before_batching(served):
    """With --enable_batching, DT_STRING requests reach the batch scheduler as the program's tensors, as REST's do."""
    import concurrent.futures

    from torchestimator.serving import BatchingParameters

    base = served["server"].managers["parsed"].base_path
    batching = BatchingParameters(max_batch_size=8, batch_timeout_micros=20000)
    with start("parsed", base, grpc_port=0, batching=batching, file_system_poll_wait_seconds=0) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = PredictionServiceStub(channel)

            def one(index):
                request = protos.PredictRequest()
                request.model_spec.name = "parsed"
                request.inputs["examples"].CopyFrom(make_tensor_proto([encode_example({"x": [float(index)]})]))
                return list(stub.Predict(request, timeout=30).outputs["y"].float_val)

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                assert list(pool.map(one, range(4))) == [[0.5 * index + 3] for index in range(4)]


def test_stopping_the_server_answers_the_calls_in_flight_first(served):
    """SIGTERM's path (serve's stop event): a gRPC call and a REST request waiting in a batch get their answers.

    Before, aiohttp's signal handler raised out of the loop and asyncio.Runner cancelled every task at once: the
    waiting gRPC call was cancelled (grpcio logged an unhandled CancelledError) instead of answered."""
    import asyncio
    import concurrent.futures
    import threading
    import time

    from torchestimator.serving import BatchingParameters, ServerSettings, build_app
    from torchestimator.serving.app import request_core_of
    from torchestimator.serving.server import _serve_forever, grpc_port_of

    base = served["server"].managers["half"].base_path
    # A batch waits 2 s for company: long enough to stop the server while both requests are queued in it.
    batching = BatchingParameters(max_batch_size=64, batch_timeout_micros=2_000_000)
    app = build_app(
        ServerSettings(
            model_name="half",
            model_base_path=base,
            batching=batching,
            file_system_poll_wait_seconds=0,
            inline_forward_micros=0,
        )
    )
    listening, ports = threading.Event(), {}
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def on_listening(app, port):
        ports["rest"], ports["grpc"] = port, grpc_port_of(app)
        listening.set()

    thread = threading.Thread(
        target=loop.run_until_complete, args=(_serve_forever(app, "127.0.0.1", 0, on_listening, 0, stop),)
    )
    thread.start()
    try:
        assert listening.wait(60)
        scheduler = request_core_of(app).scheduler
        with (
            grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}") as channel,
            concurrent.futures.ThreadPoolExecutor(2) as pool,
        ):
            call = PredictionServiceStub(channel).Predict.future(predict_request([[2.0]], [1]), timeout=60)
            server = type("Server", (), {"url": f"http://127.0.0.1:{ports['rest']}"})()
            answer = pool.submit(rest, server, "/v1/models/half:predict", {"inputs": {"x": [[4.0]], "shift": [0]}})
            deadline = time.monotonic() + 30
            while scheduler.num_enqueued_tasks < 2:  # both requests wait in the open batch
                assert time.monotonic() < deadline, "the requests never reached the batch queue"
                time.sleep(0.01)
            loop.call_soon_threadsafe(stop.set)
            assert list(call.result(timeout=60).outputs["y"].float_val) == [0.5 * (2 + 1) + 3]
            assert answer.result(timeout=60)["outputs"]["y"] == [0.5 * 4 + 3]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=60)
    assert not thread.is_alive()
    loop.close()
