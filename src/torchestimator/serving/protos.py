"""TF Serving's gRPC messages and TensorFlow's TensorProto, rebuilt from their field tables without TensorFlow.

    protos = serving_protos()
    request = protos.PredictRequest()
    request.model_spec.name = "digits"
    request.inputs["x"].CopyFrom(make_tensor_proto(np.zeros((1, 64), np.float32)))   # tensor_proto.py

What belongs here: the messages of ``tensorflow_serving/apis/*.proto`` the
PredictionService and ModelService speak (Predict, Classify, Regress,
GetModelMetadata, GetModelStatus), ``prediction_log.proto`` (the warm-up file's
records), and what they need from TensorFlow (``types.proto``,
``tensor_shape.proto``, ``tensor.proto``, ``meta_graph.proto``'s SignatureDef
and TensorInfo, ``error_codes.proto``), with TF's package and message names,
field numbers and types, written here from the published .proto files
(tensorflow/serving 2.21, tensorflow 2.21). The full names are TF's because
they are part of the protocol: gRPC method paths
(``/tensorflow.serving.PredictionService/Predict``) and ``google.protobuf.Any``
type URLs (``type.googleapis.com/tensorflow.serving.SignatureDefMap``) carry
them. What does not: numpy conversion (tensor_proto.py), answering RPCs
(grpc_server.py), the warm-up file (export/warmup.py).

Built as data/example.py and config.py build theirs: ``FileDescriptorProto``s
given to protobuf's runtime in a private descriptor pool
(``torchestimator._io.protobuf``), so no protoc step and no clash with a real
TensorFlow or tensorflow-serving-api imported in the same process (their
classes live in the default pool under the same names).

Left out, as unknown fields the parser skips: fields of TF's messages that
no request here reads (TensorProto's resource_handle_val/variant_val/
float8_val, TensorInfo's coo_sparse/composite_tensor, PredictRequest's
streaming and request options, PredictionLog's log_metadata and
multi-inference/session-run logs, MultiInference itself).

``tf.Example`` fields (ExampleList.examples, ExampleListWithContext.context)
are declared ``bytes``: an embedded message and a bytes field have the same
wire format (length-delimited), so a client's Example messages arrive here as
their serialized bytes, which ``data.example.decode_example`` parses in one
call (declaring them as Example messages would parse each twice: into a
message, then back out of it), and a warm-up record holds the Examples
TensorFlow wrote, byte for byte.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from torchestimator._io import protobuf as _protobuf

__all__ = [
    "ANY_TYPE_URL_PREFIX",
    "DATA_TYPES",
    "ERROR_CODES",
    "MODEL_SERVICE",
    "PREDICTION_SERVICE",
    "VERSION_STATES",
    "serving_protos",
]

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
"""The service name in gRPC paths: ``/tensorflow.serving.PredictionService/Predict``."""
MODEL_SERVICE = "tensorflow.serving.ModelService"
ANY_TYPE_URL_PREFIX = "type.googleapis.com/"
"""What ``Any.Pack`` writes before the full message name (GetModelMetadataResponse.metadata)."""

# tensorflow/core/framework/types.proto: DataType (the _REF types, +100, never cross a serving API).
DATA_TYPES = {
    "DT_INVALID": 0,
    "DT_FLOAT": 1,
    "DT_DOUBLE": 2,
    "DT_INT32": 3,
    "DT_UINT8": 4,
    "DT_INT16": 5,
    "DT_INT8": 6,
    "DT_STRING": 7,
    "DT_COMPLEX64": 8,
    "DT_INT64": 9,
    "DT_BOOL": 10,
    "DT_QINT8": 11,
    "DT_QUINT8": 12,
    "DT_QINT32": 13,
    "DT_BFLOAT16": 14,
    "DT_QINT16": 15,
    "DT_QUINT16": 16,
    "DT_UINT16": 17,
    "DT_COMPLEX128": 18,
    "DT_HALF": 19,
    "DT_RESOURCE": 20,
    "DT_VARIANT": 21,
    "DT_UINT32": 22,
    "DT_UINT64": 23,
    "DT_FLOAT8_E5M2": 24,
    "DT_FLOAT8_E4M3FN": 25,
    "DT_INT4": 29,
    "DT_UINT4": 30,
}

# tensorflow/core/protobuf/error_codes.proto (xla/tsl/protobuf/error_codes.proto since TF 2.13): tensorflow.error.Code.
# The numbers are gRPC's status codes too.
ERROR_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}

# apis/get_model_status.proto: ModelVersionStatus.State.
VERSION_STATES = {"UNKNOWN": 0, "START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}

_MESSAGES = [
    "tensorflow.TensorShapeProto",
    "tensorflow.TensorProto",
    "tensorflow.TensorInfo",
    "tensorflow.SignatureDef",
    "tensorflow.serving.ModelSpec",
    "tensorflow.serving.PredictRequest",
    "tensorflow.serving.PredictResponse",
    "tensorflow.serving.ExampleList",
    "tensorflow.serving.ExampleListWithContext",
    "tensorflow.serving.Input",
    "tensorflow.serving.Class",
    "tensorflow.serving.Classifications",
    "tensorflow.serving.ClassificationResult",
    "tensorflow.serving.ClassificationRequest",
    "tensorflow.serving.ClassificationResponse",
    "tensorflow.serving.Regression",
    "tensorflow.serving.RegressionResult",
    "tensorflow.serving.RegressionRequest",
    "tensorflow.serving.RegressionResponse",
    "tensorflow.serving.SignatureDefMap",
    "tensorflow.serving.GetModelMetadataRequest",
    "tensorflow.serving.GetModelMetadataResponse",
    "tensorflow.serving.StatusProto",
    "tensorflow.serving.GetModelStatusRequest",
    "tensorflow.serving.ModelVersionStatus",
    "tensorflow.serving.GetModelStatusResponse",
    "tensorflow.serving.ClassifyLog",
    "tensorflow.serving.RegressLog",
    "tensorflow.serving.PredictLog",
    "tensorflow.serving.PredictionLog",
    "torchestimator.serving.RequestHead",
]


@functools.lru_cache(maxsize=1)
def serving_protos() -> SimpleNamespace:
    """The message classes, each under its short name (``PredictRequest``, ``TensorProto``, ...), and ``pool``.

    Needs the ``protobuf`` package; built once per process.
    """
    return _protobuf.message_classes(_file_descriptors(), _MESSAGES)


_add = _protobuf.add_field
_TF = ".tensorflow."
_SERVING = ".tensorflow.serving."


def _file_descriptors() -> list[Any]:
    """One FileDescriptorProto per .proto file, dependencies first."""
    return [
        _types_file(),
        _shape_file(),
        _tensor_file(),
        _meta_graph_file(),
        _error_codes_file(),
        _status_file(),
        _model_file(),
        _predict_file(),
        _input_file(),
        _classification_file(),
        _regression_file(),
        _metadata_file(),
        _model_status_file(),
        _prediction_log_file(),
        _head_file(),
    ]


def _enum(file: Any, name: str, values: dict[str, int]) -> None:
    enum = file.enum_type.add(name=name)
    for value_name, number in sorted(values.items(), key=lambda item: item[1]):
        enum.value.add(name=value_name, number=number)


def _types_file() -> Any:
    file = _protobuf.new_file("tensorflow/core/framework/types.proto", "tensorflow")
    _enum(file, "DataType", DATA_TYPES)
    return file


def _shape_file() -> Any:
    file = _protobuf.new_file("tensorflow/core/framework/tensor_shape.proto", "tensorflow")
    _protobuf.add_tensor_shape_proto(file)
    return file


def _tensor_file() -> Any:
    file = _protobuf.new_file(
        "tensorflow/core/framework/tensor.proto",
        "tensorflow",
        "tensorflow/core/framework/tensor_shape.proto",
        "tensorflow/core/framework/types.proto",
    )
    tensor = file.message_type.add(name="TensorProto")
    _add(tensor, "dtype", 1, "enum", _TF + "DataType")
    _add(tensor, "tensor_shape", 2, "message", _TF + "TensorShapeProto")
    _add(tensor, "version_number", 3, "int32")
    _add(tensor, "tensor_content", 4, "bytes")
    # proto3: repeated scalars are packed unless marked otherwise (TF marks them [packed = true] anyway).
    for name, number, kind in (
        ("half_val", 13, "int32"),
        ("float_val", 5, "float"),
        ("double_val", 6, "double"),
        ("int_val", 7, "int32"),
        ("string_val", 8, "bytes"),
        ("scomplex_val", 9, "float"),
        ("int64_val", 10, "int64"),
        ("bool_val", 11, "bool"),
        ("dcomplex_val", 12, "double"),
        ("uint32_val", 16, "uint32"),
        ("uint64_val", 17, "uint64"),
    ):
        _add(tensor, name, number, kind, repeated=True)
    return file


def _meta_graph_file() -> Any:
    """core/protobuf/meta_graph.proto: TensorInfo (by name only) and SignatureDef."""
    file = _protobuf.new_file(
        "tensorflow/core/protobuf/meta_graph.proto",
        "tensorflow",
        "tensorflow/core/framework/tensor.proto",
        "tensorflow/core/framework/tensor_shape.proto",
        "tensorflow/core/framework/types.proto",
    )
    info = file.message_type.add(name="TensorInfo")
    info.oneof_decl.add(name="encoding")
    _add(info, "name", 1, "string", oneof=0)
    _add(info, "dtype", 2, "enum", _TF + "DataType")
    _add(info, "tensor_shape", 3, "message", _TF + "TensorShapeProto")
    signature = file.message_type.add(name="SignatureDef")
    _protobuf.add_map(signature, "tensorflow.SignatureDef", "inputs", 1, "string", "message", _TF + "TensorInfo")
    _protobuf.add_map(signature, "tensorflow.SignatureDef", "outputs", 2, "string", "message", _TF + "TensorInfo")
    _add(signature, "method_name", 3, "string")
    _protobuf.add_map(signature, "tensorflow.SignatureDef", "defaults", 4, "string", "message", _TF + "TensorProto")
    return file


def _error_codes_file() -> Any:
    file = _protobuf.new_file("tensorflow/core/protobuf/error_codes.proto", "tensorflow.error")
    _enum(file, "Code", {**ERROR_CODES, "DO_NOT_USE_RESERVED_FOR_FUTURE_EXPANSION_USE_DEFAULT_IN_SWITCH_INSTEAD_": 20})
    return file


def _status_file() -> Any:
    """tensorflow_serving/util/status.proto."""
    file = _protobuf.new_file(
        "tensorflow_serving/util/status.proto", "tensorflow.serving", "tensorflow/core/protobuf/error_codes.proto"
    )
    status = file.message_type.add(name="StatusProto")
    _add(status, "error_code", 1, "enum", ".tensorflow.error.Code")
    _add(status, "error_message", 2, "string")
    return file


def _serving_file(name: str, *dependencies: str) -> Any:
    return _protobuf.new_file(f"tensorflow_serving/apis/{name}", "tensorflow.serving", *dependencies)


def _model_file() -> Any:
    file = _serving_file("model.proto", "google/protobuf/wrappers.proto")
    spec = file.message_type.add(name="ModelSpec")
    spec.oneof_decl.add(name="version_choice")
    _add(spec, "name", 1, "string")
    _add(spec, "version", 2, "message", ".google.protobuf.Int64Value", oneof=0)
    _add(spec, "version_label", 4, "string", oneof=0)
    _add(spec, "signature_name", 3, "string")
    return file


def _predict_file() -> Any:
    file = _serving_file(
        "predict.proto", "tensorflow/core/framework/tensor.proto", "tensorflow_serving/apis/model.proto"
    )
    request = file.message_type.add(name="PredictRequest")
    _add(request, "model_spec", 1, "message", _SERVING + "ModelSpec")
    _protobuf.add_map(
        request, "tensorflow.serving.PredictRequest", "inputs", 2, "string", "message", _TF + "TensorProto"
    )
    _add(request, "output_filter", 3, "string", repeated=True)
    response = file.message_type.add(name="PredictResponse")
    _add(response, "model_spec", 2, "message", _SERVING + "ModelSpec")
    _protobuf.add_map(
        response, "tensorflow.serving.PredictResponse", "outputs", 1, "string", "message", _TF + "TensorProto"
    )
    return file


def _input_file() -> Any:
    file = _serving_file("input.proto")
    _add(file.message_type.add(name="ExampleList"), "examples", 1, "bytes", repeated=True)  # tensorflow.Example
    with_context = file.message_type.add(name="ExampleListWithContext")
    _add(with_context, "examples", 1, "bytes", repeated=True)
    _add(with_context, "context", 2, "bytes")
    message = file.message_type.add(name="Input")
    message.oneof_decl.add(name="kind")
    _add(message, "example_list", 1, "message", _SERVING + "ExampleList", oneof=0)
    _add(message, "example_list_with_context", 2, "message", _SERVING + "ExampleListWithContext", oneof=0)
    return file


def _request_and_response(file: Any, kind: str, result: str) -> None:
    """XRequest {model_spec = 1; input = 2} and XResponse {model_spec = 2; result = 1}, as TF writes both."""
    request = file.message_type.add(name=f"{kind}Request")
    _add(request, "model_spec", 1, "message", _SERVING + "ModelSpec")
    _add(request, "input", 2, "message", _SERVING + "Input")
    response = file.message_type.add(name=f"{kind}Response")
    _add(response, "model_spec", 2, "message", _SERVING + "ModelSpec")
    _add(response, "result", 1, "message", _SERVING + result)


def _classification_file() -> Any:
    file = _serving_file(
        "classification.proto", "tensorflow_serving/apis/input.proto", "tensorflow_serving/apis/model.proto"
    )
    one = file.message_type.add(name="Class")
    _add(one, "label", 1, "string")
    _add(one, "score", 2, "float")
    _add(file.message_type.add(name="Classifications"), "classes", 1, "message", _SERVING + "Class", repeated=True)
    _add(
        file.message_type.add(name="ClassificationResult"),
        "classifications",
        1,
        "message",
        _SERVING + "Classifications",
        repeated=True,
    )
    _request_and_response(file, "Classification", "ClassificationResult")
    return file


def _regression_file() -> Any:
    file = _serving_file(
        "regression.proto", "tensorflow_serving/apis/input.proto", "tensorflow_serving/apis/model.proto"
    )
    _add(file.message_type.add(name="Regression"), "value", 1, "float")
    _add(
        file.message_type.add(name="RegressionResult"),
        "regressions",
        1,
        "message",
        _SERVING + "Regression",
        repeated=True,
    )
    _request_and_response(file, "Regression", "RegressionResult")
    return file


def _metadata_file() -> Any:
    file = _serving_file(
        "get_model_metadata.proto",
        "google/protobuf/any.proto",
        "tensorflow/core/protobuf/meta_graph.proto",
        "tensorflow_serving/apis/model.proto",
    )
    _protobuf.add_map(
        file.message_type.add(name="SignatureDefMap"),
        "tensorflow.serving.SignatureDefMap",
        "signature_def",
        1,
        "string",
        "message",
        _TF + "SignatureDef",
    )
    request = file.message_type.add(name="GetModelMetadataRequest")
    _add(request, "model_spec", 1, "message", _SERVING + "ModelSpec")
    _add(request, "metadata_field", 2, "string", repeated=True)
    response = file.message_type.add(name="GetModelMetadataResponse")
    _add(response, "model_spec", 1, "message", _SERVING + "ModelSpec")
    _protobuf.add_map(
        response,
        "tensorflow.serving.GetModelMetadataResponse",
        "metadata",
        2,
        "string",
        "message",
        ".google.protobuf.Any",
    )
    return file


def _model_status_file() -> Any:
    file = _serving_file(
        "get_model_status.proto", "tensorflow_serving/apis/model.proto", "tensorflow_serving/util/status.proto"
    )
    _add(file.message_type.add(name="GetModelStatusRequest"), "model_spec", 1, "message", _SERVING + "ModelSpec")
    status = file.message_type.add(name="ModelVersionStatus")
    state = status.enum_type.add(name="State")
    for name, number in VERSION_STATES.items():
        state.value.add(name=name, number=number)
    _add(status, "version", 1, "int64")
    _add(status, "state", 2, "enum", _SERVING + "ModelVersionStatus.State")
    _add(status, "status", 3, "message", _SERVING + "StatusProto")
    _add(
        file.message_type.add(name="GetModelStatusResponse"),
        "model_version_status",
        1,
        "message",
        _SERVING + "ModelVersionStatus",
        repeated=True,
    )
    return file


def _prediction_log_file() -> Any:
    file = _serving_file(
        "prediction_log.proto",
        "tensorflow_serving/apis/classification.proto",
        "tensorflow_serving/apis/predict.proto",
        "tensorflow_serving/apis/regression.proto",
    )
    for log, kind in (("ClassifyLog", "Classification"), ("RegressLog", "Regression"), ("PredictLog", "Predict")):
        message = file.message_type.add(name=log)
        _add(message, "request", 1, "message", _SERVING + f"{kind}Request")
        _add(message, "response", 2, "message", _SERVING + f"{kind}Response")
    log = file.message_type.add(name="PredictionLog")
    log.oneof_decl.add(name="log_type")
    _add(log, "classify_log", 2, "message", _SERVING + "ClassifyLog", oneof=0)
    _add(log, "regress_log", 3, "message", _SERVING + "RegressLog", oneof=0)
    _add(log, "predict_log", 6, "message", _SERVING + "PredictLog", oneof=0)
    return file


def _head_file() -> Any:
    """Ours, not TF's: field 1 of every request (model_spec) alone. Parsing a request as this reads which model
    it names while skipping the rest unparsed, so a big request is parsed in full only where it will run."""
    file = _protobuf.new_file(
        "torchestimator/serving/request_head.proto", "torchestimator.serving", "tensorflow_serving/apis/model.proto"
    )
    _add(file.message_type.add(name="RequestHead"), "model_spec", 1, "message", _SERVING + "ModelSpec")
    return file
