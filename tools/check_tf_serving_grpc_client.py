"""TF Serving's own Python client (tensorflow-serving-api's stubs, tf.make_tensor_proto) against `torchestimator serve --port`.

Run it in the comparison environment, which has TensorFlow and `pip install --no-deps tensorflow-serving-api==2.21.0`
(its protos import TensorFlow's, so the stubs do not work without TensorFlow installed):

    /tmp/benchenv/bin/python tools/check_tf_serving_grpc_client.py --python .venv/bin/python

It trains and exports a half-plus-three model (y = 0.5 (x + shift) + 3, plus a parsing-receiver export) with the
project's interpreter, starts `torchestimator serve --port <free> --rest_api_port <free>`, and then, with TF's stubs
only: Predict (tf.make_tensor_proto inputs; the answer read with tf.make_ndarray), Predict with a version, Regress
and Classify with tf.train.Examples (and a context), GetModelMetadata (the Any unpacked into TF's SignatureDefMap;
the parsing export's classify/regress signatures take TF's input key "inputs", its predict signature "examples"),
Predict on the classify signature with "inputs" (serialized tf.train.Examples), GetModelStatus, an unknown model
(NOT_FOUND). It also compares every message protos.py defines with TF's
descriptors field by field. Prints one line per check and "all checks passed"; exits 1 on the first failure.
CI does not run it (no TensorFlow there).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

EXPORT_SCRIPT = r"""
import sys, numpy as np, torch, torch.nn as nn, torch.nn.functional as F
import torchestimator as te
from torchestimator.data import FixedLenFeature
from torchestimator.export import (ClassificationOutput, PredictOutput, RegressionOutput, TensorSpec,
                                   build_parsing_serving_input_receiver, export_saved_model, serving_input_receiver)
root = sys.argv[1]

class HalfPlusThree(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale, self.bias = nn.Parameter(torch.tensor(0.5)), nn.Parameter(torch.tensor(3.0))
    def forward(self, x):
        return x * self.scale + self.bias

def model_fn(model, features, labels, mode):
    y = model(features["x"])
    if mode == te.ModeKeys.PREDICT:
        scores = torch.stack([y, 2 * y], dim=1)
        classes = torch.zeros_like(scores, dtype=torch.int64) + torch.arange(2)
        return te.EstimatorSpec(mode, predictions={"y": y}, export_outputs={
            "serving_default": PredictOutput({"y": y}), "tensorflow/serving/regress": RegressionOutput(y),
            "tensorflow/serving/classify": ClassificationOutput(scores=scores, classes=classes)})
    return te.EstimatorSpec(mode, predictions={"y": y}, loss=F.mse_loss(y, labels))

x = np.arange(8, dtype=np.float32)
estimator = te.Estimator(model_fn=model_fn, model=lambda: HalfPlusThree(), model_dir=root + "/model",
                         optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.0))
estimator.train(te.numpy_input_fn({"x": x}, 0.5 * x + 3, batch_size=4, num_epochs=None, shuffle=False), max_steps=1)
receiver = serving_input_receiver(
    {"x": TensorSpec(shape=(None, 1)), "shift": TensorSpec(shape=(None,), dtype=torch.int64)},
    receiver_fn=lambda tensors: {"x": tensors["x"][:, 0] + tensors["shift"].to(torch.float32)})
print(export_saved_model(estimator, root + "/half", receiver))
print(export_saved_model(estimator, root + "/parsed",
                         build_parsing_serving_input_receiver({"x": FixedLenFeature([], "float32")})))
"""

OURS_SCRIPT = r"""
import json
from torchestimator.serving.protos import _file_descriptors
fields = {}
def walk(message, prefix):
    fields[prefix + message.name] = {f.name: [f.number, f.type, f.label == 3] for f in message.field}
    for nested in message.nested_type:
        walk(nested, prefix + message.name + ".")
for file in _file_descriptors():
    if file.package.startswith("tensorflow"):
        for message in file.message_type:
            walk(message, file.package + ".")
print(json.dumps(fields))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check(what: str, condition: bool, detail: object = "") -> None:
    if not condition:
        print(f"FAILED: {what} {detail}")
        sys.exit(1)
    print(f"ok: {what}")


def compare_descriptors(python: str) -> None:
    from google.protobuf import descriptor_pool
    from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, prediction_log_pb2  # noqa: F401

    ours = json.loads(subprocess.run([python, "-c", OURS_SCRIPT], check=True, capture_output=True, text=True).stdout)
    pool = descriptor_pool.Default()
    for name, fields in ours.items():
        theirs = {f.name: [f.number, f.type, f.is_repeated] for f in pool.FindMessageTypeByName(name).fields}
        for field, spec in fields.items():
            found = theirs.get(field)
            # tf.Example fields are declared bytes (type 12) here, a message (11) in TF: same wire format.
            same = found == spec or (
                found is not None and found[0] == spec[0] and found[2] == spec[2] and spec[1] == 12 and found[1] == 11
            )
            check(f"{name}.{field} = {spec[0]} as TF's", same, f"ours {spec}, TF's {found}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=".venv/bin/python", help="the project's interpreter")
    args = parser.parse_args()

    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
        regression_pb2,
    )

    compare_descriptors(args.python)
    root = tempfile.mkdtemp(prefix="tf_grpc_check_")
    half, parsed = subprocess.run(
        [args.python, "-c", EXPORT_SCRIPT, root], check=True, capture_output=True, text=True
    ).stdout.split()[-2:]
    config = os.path.join(root, "models.config")
    with open(config, "w") as file:
        file.write(
            f'model_config_list {{ config {{ name: "half" base_path: "{os.path.dirname(half)}" }} '
            f'config {{ name: "parsed" base_path: "{os.path.dirname(parsed)}" }} }}'
        )
    grpc_port, rest_port = free_port(), free_port()
    server = subprocess.Popen(
        [
            args.python,
            "-m",
            "torchestimator.cli",
            "serve",
            "--port",
            str(grpc_port),
            "--rest_api_port",
            str(rest_port),
            "--model_config_file",
            config,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        check("serve announces gRPC", f"gRPC 127.0.0.1:{grpc_port}" in line, line)
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        version = int(os.path.basename(half))

        request = predict_pb2.PredictRequest()
        request.model_spec.name = "half"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0], [2.0], [5.0]], dtype=tf.float32))
        request.inputs["shift"].CopyFrom(tf.make_tensor_proto([0, 1, 2], dtype=tf.int64))
        response = stub.Predict(request, 10)
        check(
            "Predict: tf.make_ndarray of the answer",
            tf.make_ndarray(response.outputs["y"]).tolist() == [3.5, 4.5, 6.5],
            response,
        )
        check(
            "Predict: model_spec of the version served",
            response.model_spec.version.value == version and response.model_spec.signature_name == "serving_default",
            response.model_spec,
        )
        request.model_spec.version.value = version
        check("Predict with a version", stub.Predict(request, 10).model_spec.version.value == version)

        regress = regression_pb2.RegressionRequest()
        regress.model_spec.name = "half"
        regress.model_spec.signature_name = "tensorflow/serving/regress"
        listed = regress.input.example_list_with_context
        for x in (1.0, 5.0):
            listed.examples.add().features.feature["x"].float_list.value.append(x)
        listed.context.features.feature["shift"].int64_list.value.append(1)
        values = [r.value for r in stub.Regress(regress, 10).result.regressions]
        check("Regress: tf.train.Examples with a context", values == [4.0, 6.0], values)

        classify = classification_pb2.ClassificationRequest()
        classify.model_spec.name = "parsed"
        classify.model_spec.signature_name = "tensorflow/serving/classify"
        classify.input.example_list.examples.add().features.feature["x"].float_list.value.append(1.0)
        classes = [(c.label, c.score) for c in stub.Classify(classify, 10).result.classifications[0].classes]
        check("Classify: a parsing receiver's export", classes == [("0", 3.5), ("1", 7.0)], classes)

        metadata = get_model_metadata_pb2.GetModelMetadataRequest()
        metadata.model_spec.name = "half"
        metadata.metadata_field.append("signature_def")
        signatures = get_model_metadata_pb2.SignatureDefMap()
        check(
            "GetModelMetadata: the Any unpacks into TF's SignatureDefMap",
            stub.GetModelMetadata(metadata, 10).metadata["signature_def"].Unpack(signatures)
            and signatures.signature_def["serving_default"].inputs["shift"].dtype == tf.int64.as_datatype_enum,
        )

        metadata.model_spec.name = "parsed"
        parsed_signatures = get_model_metadata_pb2.SignatureDefMap()
        stub.GetModelMetadata(metadata, 10).metadata["signature_def"].Unpack(parsed_signatures)
        input_keys = {name: sorted(definition.inputs) for name, definition in parsed_signatures.signature_def.items()}
        check(
            "GetModelMetadata: classify/regress take 'inputs', predict 'examples' (TF's signature defs)",
            input_keys
            == {
                "serving_default": ["examples"],
                "tensorflow/serving/classify": ["inputs"],
                "tensorflow/serving/regress": ["inputs"],
            },
            input_keys,
        )

        example = tf.train.Example()
        example.features.feature["x"].float_list.value.append(1.0)
        by_name = predict_pb2.PredictRequest()
        by_name.model_spec.name = "parsed"
        by_name.model_spec.signature_name = "tensorflow/serving/classify"
        by_name.inputs["inputs"].CopyFrom(tf.make_tensor_proto([example.SerializeToString()]))
        scores = tf.make_ndarray(stub.Predict(by_name, 10).outputs["scores"]).tolist()
        check("Predict on the classify signature with input 'inputs'", scores == [[3.5, 7.0]], scores)

        status_request = get_model_status_pb2.GetModelStatusRequest()
        status_request.model_spec.name = "half"
        statuses = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, 10)
        check(
            "GetModelStatus: AVAILABLE",
            [(s.version, s.state) for s in statuses.model_version_status]
            == [(version, get_model_status_pb2.ModelVersionStatus.AVAILABLE)],
            statuses,
        )

        request.model_spec.name = "nope"
        try:
            stub.Predict(request, 10)
            check("an unknown model is NOT_FOUND", False)
        except grpc.RpcError as error:
            check("an unknown model is NOT_FOUND", error.code() == grpc.StatusCode.NOT_FOUND, error.details())
        print("all checks passed")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    start = time.time()
    main()
    print(f"({time.time() - start:.1f} s)")
