"""Client stubs for TF Serving's gRPC API, shaped as tensorflow-serving-api's, over protos.py's messages.

    channel = grpc.insecure_channel("127.0.0.1:8500")
    stub = PredictionServiceStub(channel)                  # as prediction_service_pb2_grpc.PredictionServiceStub
    request = serving_protos().PredictRequest()
    request.model_spec.name = "digits"
    request.inputs["x"].CopyFrom(make_tensor_proto(rows))
    outputs = stub.Predict(request, timeout=10).outputs

What belongs here: the two stubs (PredictionService: Predict, Classify,
Regress, GetModelMetadata; ModelService: GetModelStatus), each method a
``grpc`` unary-unary callable with TF's path and our message classes. They
talk to any TF Serving server, ours or TensorFlow's. What does not: the
messages (protos.py), tensors (tensor_proto.py), the server (grpc_server.py).
"""

from __future__ import annotations

from typing import Any

from torchestimator._extras import import_extra
from torchestimator.serving.protos import MODEL_SERVICE, PREDICTION_SERVICE, serving_protos

__all__ = ["ModelServiceStub", "PredictionServiceStub"]


def _method(channel: Any, service: str, method: str, request: str, response: str) -> Any:
    protos = serving_protos()
    return channel.unary_unary(
        f"/{service}/{method}",
        request_serializer=getattr(protos, request).SerializeToString,
        response_deserializer=getattr(protos, response).FromString,
    )


class PredictionServiceStub:
    """tensorflow.serving.PredictionService on a ``grpc.Channel`` (or a ``grpc.aio`` channel: await the calls)."""

    def __init__(self, channel: Any) -> None:
        import_extra("grpc", extra="serving", feature="the gRPC client")
        self.Predict = _method(channel, PREDICTION_SERVICE, "Predict", "PredictRequest", "PredictResponse")
        self.Classify = _method(
            channel, PREDICTION_SERVICE, "Classify", "ClassificationRequest", "ClassificationResponse"
        )
        self.Regress = _method(channel, PREDICTION_SERVICE, "Regress", "RegressionRequest", "RegressionResponse")
        self.GetModelMetadata = _method(
            channel, PREDICTION_SERVICE, "GetModelMetadata", "GetModelMetadataRequest", "GetModelMetadataResponse"
        )


class ModelServiceStub:
    """tensorflow.serving.ModelService's GetModelStatus on a ``grpc.Channel``."""

    def __init__(self, channel: Any) -> None:
        import_extra("grpc", extra="serving", feature="the gRPC client")
        self.GetModelStatus = _method(
            channel, MODEL_SERVICE, "GetModelStatus", "GetModelStatusRequest", "GetModelStatusResponse"
        )
