"""TF Serving's gRPC requests to tensors and outputs back to responses: pure functions over serialized messages.

    name, version, label = request_target(data)                      # the ModelSpec only, rest unparsed
    parsed = parse_predict(data, model, name, version)               # request_core.Parsed; .encode -> response bytes
    parsed = parse_examples(data, model, name, version, "classify")  # Classify / Regress
    metadata_response(request, model, name, version); status_response(statuses)

What belongs here: reading PredictRequest / ClassificationRequest /
RegressionRequest / GetModelMetadataRequest / GetModelStatusRequest and
writing their responses as TF Serving does (``predict_util.cc``,
``classifier.cc``, ``regressor.cc``, ``get_model_metadata_impl.cc``,
``get_model_status_impl.cc``), every client mistake a ServingError naming the
input. What does not: the RPC plumbing (grpc_server.py), numpy conversion
(tensor_proto.py), where a request runs (request_core.py). Classify and
Regress results come from examples_json.py's classify_results /
regress_results, so both transports answer the same.

Messages are parsed here, from bytes, not by grpcio: the request core runs
``parse`` on the event loop only for small requests, so a big request's
parsing (protobuf's C parser, then numpy) happens in a worker thread, as a big
REST body's JSON does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from torchestimator._io import protobuf as _protobuf
from torchestimator.data.example import decode_example
from torchestimator.errors import ExampleDecodeError
from torchestimator.export import DEFAULT_SERVING_SIGNATURE_DEF_KEY, ExportedModel, Signature
from torchestimator.serving import examples_json
from torchestimator.serving.errors import invalid_argument
from torchestimator.serving.json_tensor import TF_DTYPES, decoded_inputs, describe_inputs
from torchestimator.serving.manager import VersionStatus
from torchestimator.serving.protos import DATA_TYPES, ERROR_CODES, VERSION_STATES, serving_protos
from torchestimator.serving.request_core import Parsed, parse_version
from torchestimator.serving.tensor_proto import DTYPE_NAMES, make_tensor_proto, tensor_proto_to_numpy

__all__ = [
    "metadata_response",
    "parse_examples",
    "parse_message",
    "parse_predict",
    "predict_inputs",
    "request_target",
    "status_response",
]

SIGNATURE_DEF_FIELD = "signature_def"


def parse_message(message_class: Any, data: bytes) -> Any:
    """``message_class`` from its bytes; INVALID_ARGUMENT when they are not one."""
    try:
        return _protobuf.parse_binary(message_class, data)
    except _protobuf.MessageDecodeError as error:
        raise invalid_argument(f"The request is {error}.") from None


def request_target(data: bytes) -> tuple[str, int | None, str | None]:
    """(model name, version or None, label or None) of any request (model_spec is field 1 of each)."""
    head = parse_message(serving_protos().RequestHead, data)
    if not head.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")
    return spec_target(head.model_spec)


def spec_target(spec: Any) -> tuple[str, int | None, str | None]:
    if not spec.name:
        raise invalid_argument("Missing model name in request (model_spec.name).")
    choice = spec.WhichOneof("version_choice")
    version = parse_version(spec.version.value) if choice == "version" else None
    label = spec.version_label if choice == "version_label" else None
    return spec.name, version, label


def _fill_spec(spec: Any, name: str, version: int, signature_name: str) -> None:
    """The response's model_spec: the version that answered, as TF Serving fills it (MakeModelSpec)."""
    spec.name = name
    spec.version.value = version
    spec.signature_name = signature_name


def _signature(model: ExportedModel, name: str) -> Signature:
    if name not in model.signature_names:
        raise invalid_argument(
            f'Serving signature name: "{name}" not found in signature def (the model has {model.signature_names}).'
        )
    return model.signature(name)


# -- Predict ------------------------------------------------------------------------------------


def parse_predict(data: bytes, model: ExportedModel, name: str, version: int) -> Parsed:
    """A PredictRequest's tensors, checked against the signature; encode() writes the PredictResponse bytes."""
    protos = serving_protos()
    request = parse_message(protos.PredictRequest, data)
    signature_name = request.model_spec.signature_name or DEFAULT_SERVING_SIGNATURE_DEF_KEY
    signature = _signature(model, signature_name)
    inputs = predict_inputs(request.inputs, signature)
    if any(info.dtype == "string" for info in signature.inputs.values()):
        # The export's decode step (parse_example, decode_image) runs here, where the request is parsed, as for
        # REST: its errors name the record, and the batch scheduler gets the program's tensors.
        inputs = decoded_inputs(model, inputs, signature_name)
    output_keys = _output_filter(request.output_filter, signature)

    def encode(outputs: Mapping[str, np.ndarray]) -> bytes:
        response = protos.PredictResponse()
        _fill_spec(response.model_spec, name, version, signature_name)
        for alias, array in outputs.items():
            response.outputs[alias].CopyFrom(make_tensor_proto(array))
        return response.SerializeToString()

    return Parsed(signature_name=signature_name, inputs=inputs, encode=encode, output_keys=output_keys)


def predict_inputs(protos_by_name: Mapping[str, Any], signature: Signature) -> dict[str, Any]:
    """{input: tensor} from {input: TensorProto}: names and dtypes as the signature has them (shapes: the loader)."""
    if protos_by_name.keys() != signature.inputs.keys():
        sent = set(protos_by_name)
        extra = sorted(sent - set(signature.inputs))
        missing = sorted(set(signature.inputs) - sent)
        raise invalid_argument(
            f"input size does not match signature: {len(sent)}!={len(signature.inputs)} "
            f"len({sorted(sent)}) != len({sorted(signature.inputs)}). Sent extra: {extra}. "
            f"Missing but required: {missing}. Signature {signature.name!r} takes "
            f"{describe_inputs(signature)}."
        )
    return {alias: _input_value(alias, protos_by_name[alias], signature) for alias in signature.inputs}


def _input_value(alias: str, proto: Any, signature: Signature) -> Any:
    info = signature.inputs[alias]
    expected = "DT_STRING" if info.dtype == "string" else TF_DTYPES.get(info.dtype, info.dtype)
    sent = DTYPE_NAMES.get(proto.dtype, f"DataType {proto.dtype}")
    if sent != expected:
        raise invalid_argument(
            f"Expects arg[{list(signature.inputs).index(alias)}] to be {_short(expected)} but "
            f"{_short(sent)} is provided: input {alias!r} of signature {signature.name!r} is "
            f"{expected}; send a TensorProto of that dtype."
        )
    try:
        array = tensor_proto_to_numpy(proto, where=f"input {alias!r}")
    except ValueError as error:  # tensor_proto's words: which input, what is wrong
        raise invalid_argument(str(error)) from None
    if expected == "DT_STRING":
        return array  # an object array of bytes: the export's decode step takes it (ExportedModel)
    if not array.flags.writeable:  # tensor_content is a view of the request's bytes
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if expected == "DT_BFLOAT16" else tensor


def _short(dtype_name: str) -> str:
    """TF's DataTypeString: DT_FLOAT -> float."""
    return dtype_name.removeprefix("DT_").lower()


def _output_filter(names: Sequence[str], signature: Signature) -> list[str] | None:
    if not names:
        return None
    seen: set[str] = set()
    for alias in names:
        if alias not in signature.outputs:
            raise invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be in "
                f"the set {{{','.join(sorted(signature.outputs))}}}."
            )
        if alias in seen:
            raise invalid_argument(f"duplicate output tensor alias: {alias}")
        seen.add(alias)
    return list(names)


# -- Classify and Regress -----------------------------------------------------------------------


def parse_examples(data: bytes, model: ExportedModel, name: str, version: int, method: str) -> Parsed:
    """A ClassificationRequest (``method="classify"``) or RegressionRequest (``"regress"``) as tensors;
    encode() writes the response bytes."""
    protos = serving_protos()
    request = parse_message(protos.ClassificationRequest if method == "classify" else protos.RegressionRequest, data)
    signature_name = request.model_spec.signature_name or DEFAULT_SERVING_SIGNATURE_DEF_KEY
    context, examples = _decoded_input(request.input)
    # The one entry point REST shares: with a parsing receiver the Examples are serialized again (context merged,
    # as TF) for its string input; otherwise their features feed the signature's inputs by name.
    examples_request = examples_json.examples_request(context, examples, model, method, signature_name)
    count = examples_request.count

    def encode(outputs: Mapping[str, np.ndarray]) -> bytes:
        if method == "classify":
            response = protos.ClassificationResponse()
            for row in examples_json.classify_results(outputs, count)["results"]:
                classes = response.result.classifications.add().classes
                for label, score in row:
                    classes.add(label=label, score=score)
        else:
            response = protos.RegressionResponse()
            for value in examples_json.regress_results(outputs, count)["results"]:
                response.result.regressions.add(value=value)
        _fill_spec(response.model_spec, name, version, examples_request.signature_name)
        return response.SerializeToString()

    return Parsed(
        signature_name=examples_request.signature_name, inputs=examples_request.inputs, encode=encode, examples=count
    )


def _decoded_input(message: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(context features, each example's features) of an Input, decoded by data.example.decode_example."""
    kind = message.WhichOneof("kind")
    if kind is None:
        raise invalid_argument("Input is empty: set input.example_list or input.example_list_with_context.")
    listed = getattr(message, kind)
    if not listed.examples:
        raise invalid_argument(f"Input is empty: input.{kind}.examples holds no tf.Example.")
    examples = [
        _decode(serialized, f"input.{kind}.examples[{index}]") for index, serialized in enumerate(listed.examples)
    ]
    context = _decode(listed.context, f"input.{kind}.context") if kind == "example_list_with_context" else {}
    return context, examples


def _decode(serialized: bytes, where: str) -> dict[str, Any]:
    try:
        return decode_example(serialized)
    except ExampleDecodeError as error:
        raise invalid_argument(f"{where}: {error}") from None


# -- GetModelMetadata and GetModelStatus --------------------------------------------------------


def metadata_response(data: bytes, model: ExportedModel, name: str, version: int) -> bytes:
    """GetModelMetadataResponse with the SignatureDefMap packed in an Any, as TF Serving answers it."""
    protos = serving_protos()
    request = parse_message(protos.GetModelMetadataRequest, data)
    if not request.metadata_field:
        raise invalid_argument("GetModelMetadataRequest must specify at least one metadata_field")
    for field in request.metadata_field:
        if field != SIGNATURE_DEF_FIELD:
            raise invalid_argument(
                f"Metadata field {field} is not supported (the only one is {SIGNATURE_DEF_FIELD!r})."
            )
    signatures = protos.SignatureDefMap()
    for signature_name in model.signature_names:
        signature = model.signature(signature_name)
        definition = signatures.signature_def[signature_name]
        definition.method_name = signature.method_name
        for alias, info in signature.inputs.items():  # named by the receiver input, as the REST metadata
            _tensor_info(definition.inputs[alias], signature.receiver_input(alias), info)
        for alias, info in signature.outputs.items():
            _tensor_info(definition.outputs[alias], signature.program_outputs.get(alias, alias), info)
    response = protos.GetModelMetadataResponse()
    response.model_spec.name = name
    response.model_spec.version.value = version
    response.metadata[SIGNATURE_DEF_FIELD].Pack(signatures)
    return response.SerializeToString()


def _tensor_info(message: Any, name: str, info: Any) -> None:
    message.name = name
    dtype = "DT_STRING" if info.dtype == "string" else TF_DTYPES.get(info.dtype, "DT_INVALID")
    message.dtype = DATA_TYPES[dtype]
    for size in info.shape:
        message.tensor_shape.dim.add(size=size)


def status_response(statuses: Sequence[VersionStatus]) -> bytes:
    response = serving_protos().GetModelStatusResponse()
    for status in statuses:
        entry = response.model_version_status.add(version=status.version, state=VERSION_STATES[status.state])
        entry.status.error_code = ERROR_CODES.get(status.error_code, ERROR_CODES["UNKNOWN"])
        entry.status.error_message = status.error_message
    return response.SerializeToString()
