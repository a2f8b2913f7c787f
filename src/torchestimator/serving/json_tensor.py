"""TF Serving's JSON shapes: predict requests to tensors, outputs to JSON, status and metadata documents.

Pure functions over parsed JSON and an ExportedModel; no HTTP here (app.py).
Every user mistake raises ServingError(INVALID_ARGUMENT) naming the input and
what the signature expects (SRV ``util/json_tensor.cc`` semantics):

* row format ``{"instances": [...]}``: one element per example, plain values
  for a single-input signature, ``{name: value}`` objects otherwise;
* columnar format ``{"inputs": value | {name: value}}``;
* string inputs (dtype "string", DT_STRING: a receiver with a decode step)
  take a list with one value per instance: ``{"b64": "..."}`` is bytes, a
  plain JSON string its UTF-8 bytes, as TF reads them; the decode step then
  runs here (``ExportedModel.prepare_inputs``), so the request carries the
  program's tensors and batches like any other. ``{"b64": ...}`` for a
  numeric input is refused with the reason (after its base64 is checked).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

try:
    import orjson as _orjson
except ImportError:  # optional (the serving extra installs it)
    _orjson = None  # type: ignore[assignment]  # the module, or None: checked before each use

from torchestimator.export import DEFAULT_SERVING_SIGNATURE_DEF_KEY, ExportedModel, Signature, TensorInfo
from torchestimator.export.decoders import STRING
from torchestimator.export.receiver import parse_dtype
from torchestimator.serving.errors import invalid_argument
from torchestimator.serving.manager import VersionStatus

__all__ = [
    "PredictRequest",
    "b64_bytes",
    "decode_body",
    "decoded_inputs",
    "describe_inputs",
    "metadata_document",
    "parse_predict",
    "predict_response",
    "predict_response_bytes",
    "preview_json",
    "status_document",
]

# torch dtype names (signature.json) -> TF DataType names (metadata).
TF_DTYPES = {
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "float16": "DT_HALF",
    "bfloat16": "DT_BFLOAT16",
    "int8": "DT_INT8",
    "int16": "DT_INT16",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "uint8": "DT_UINT8",
    "uint16": "DT_UINT16",
    "uint32": "DT_UINT32",
    "uint64": "DT_UINT64",
    "bool": "DT_BOOL",
    "complex64": "DT_COMPLEX64",
    "complex128": "DT_COMPLEX128",
    "string": "DT_STRING",
}


_NUMPY_DTYPES = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PredictRequest:
    """A checked predict request: tensors in the signature's dtypes, and which response shape to answer in."""

    signature_name: str
    inputs: dict[str, torch.Tensor]
    row_format: bool
    """True for ``instances`` (answer ``predictions``), False for ``inputs`` (answer ``outputs``)."""


def decode_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object (NaN and Infinity tokens accepted, as TF Serving does).

    Errors begin with TF Serving's "JSON Parse error: " so clients matching on it keep working.
    """
    if not body.strip():
        raise invalid_argument(
            "JSON Parse error: The document is empty. Expected a JSON object such as "
            '{"instances": [...]} or {"inputs": ...}.'
        )
    try:
        document = _loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise invalid_argument(
            f"JSON Parse error: {error}. Malformed JSON in request body; expected a JSON object."
        ) from error
    except RecursionError as error:
        raise invalid_argument("JSON Parse error: nested too deeply. Malformed JSON in request body.") from error
    if not isinstance(document, dict):
        raise invalid_argument(f"The request body must be a JSON object; received a JSON {type(document).__name__}.")
    return document


def _loads(body: bytes) -> Any:
    """orjson when installed (parsing floats is most of a request's cost), else json.

    orjson is strict JSON: it refuses the NaN / Infinity tokens and numbers
    beyond float64 or int64 that TF Serving accepts, so those bodies (and
    every malformed one, for json's error message) go through json as well.
    """
    if _orjson is not None:
        try:
            return _orjson.loads(body)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(body, parse_int=_parse_int)


# Beyond every tensor dtype (uint64 has 20 digits), yet far under Python's 4300-digit int() limit.
_MAX_INTEGER_DIGITS = 100


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > _MAX_INTEGER_DIGITS:
        raise invalid_argument(
            f"JSON Parse error: an integer with {digits} digits ({text[:20]}...) is beyond the "
            "range of every tensor dtype; send numbers that fit the input's dtype."
        )
    return int(text)


def parse_predict(document: Mapping[str, Any], model: ExportedModel) -> PredictRequest:
    """The tensors a predict request asks for, checked against the model's signature."""
    signature_name = document.get("signature_name", DEFAULT_SERVING_SIGNATURE_DEF_KEY)
    if not isinstance(signature_name, str):
        raise invalid_argument(
            f"'signature_name' key must be a string value. Received {json.dumps(signature_name)[:100]}."
        )
    # TF Serving (predict_util.cc): an empty name is the default signature, as a missing one is.
    signature_name = signature_name or DEFAULT_SERVING_SIGNATURE_DEF_KEY
    if signature_name not in model.signature_names:
        raise invalid_argument(
            f'Serving signature name: "{signature_name}" not found in signature def '
            f"(the model has {model.signature_names})."
        )
    signature = model.signature(signature_name)
    if "instances" in document and "inputs" in document:
        raise invalid_argument("Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist.")
    if "instances" in document:
        values, row_format = _rows_to_columns(document["instances"], signature), True
    elif "inputs" in document:
        values, row_format = _columnar_inputs(document["inputs"], signature), False
    else:
        raise invalid_argument(
            f"Missing 'inputs' or 'instances' key. Signature {signature_name!r} takes {describe_inputs(signature)}."
        )
    if any(info.dtype == STRING for info in signature.inputs.values()):
        given = {
            name: _string_input(name, values[name]) if info.dtype == STRING else _input_tensor(name, values[name], info)
            for name, info in signature.inputs.items()
        }
        tensors = decoded_inputs(model, given, signature_name)
    else:
        tensors = {name: _input_tensor(name, values[name], info) for name, info in signature.inputs.items()}
    return PredictRequest(signature_name=signature_name, inputs=tensors, row_format=row_format)


def decoded_inputs(model: ExportedModel, inputs: Mapping[str, Any], signature_name: str) -> dict[str, torch.Tensor]:
    """The program's tensors for inputs holding string values: the decode step's errors are the client's."""
    try:
        return model.prepare_inputs(inputs, signature_name)
    except (ValueError, TypeError) as error:  # a record that does not parse, bytes that are no image: named
        raise invalid_argument(str(error)) from error


def _string_input(name: str, value: Any) -> list[bytes]:
    """A string input's JSON values as bytes: {"b64": ...} decoded, a JSON string as its UTF-8 bytes (as TF)."""
    if not isinstance(value, list):
        raise invalid_argument(
            f"Input {name!r} is a string input of shape [-1]: send a list with one string or "
            f'{{"b64": ...}} object per instance; received {preview_json(value)}.'
        )
    values = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            values.append(item.encode("utf-8"))
        elif isinstance(item, dict):
            values.append(b64_bytes(item, f"input {name!r}, instance {index}"))
        elif isinstance(item, list):
            raise invalid_argument(
                f"Encountered list at unexpected level: 1 expected < 1 (input {name!r}, instance "
                f'{index}): a string input takes one string or {{"b64": ...}} per instance.'
            )
        else:  # TF's TypeError wording (json_tensor.cc), then where
            raise invalid_argument(
                f"JSON Value: {preview_json(item)} Type: {_json_type_name(item)} is not of "
                f"expected type: string (input {name!r}, instance {index})."
            )
    return values


def b64_bytes(found: dict[str, Any], where: str) -> bytes:
    """The bytes of a ``{"b64": "..."}`` object; TF's errors for anything else. Padding may be left out, as
    TF's decoder (absl::Base64Unescape) allows."""
    encoded = found.get("b64")
    if len(found) != 1 or not isinstance(encoded, str):
        raise invalid_argument(
            f"JSON Value: {preview_json(found)} not formatted correctly for base64 data ({where}): "
            'expected {"b64": "<base64 string>"}.'
        )
    try:
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError) as error:
        raise invalid_argument(f"Unable to base64 decode ({where}: {error}).") from error


def _json_type_name(value: Any) -> str:
    """json_tensor.cc's JsonTypeString."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return _JSON_TYPE_NAMES.get(type(value), "Number")


_JSON_TYPE_NAMES: dict[type, str] = {dict: "Object", list: "Array", str: "String"}


def predict_response(outputs: Mapping[str, np.ndarray], row_format: bool) -> dict[str, Any]:
    """``{"predictions": [...]}`` (row) or ``{"outputs": ...}`` (columnar), shaped as TF Serving shapes them."""
    if not row_format:
        if len(outputs) == 1:
            return {"outputs": next(iter(outputs.values())).tolist()}
        return {"outputs": {name: array.tolist() for name, array in outputs.items()}}
    sizes = {name: (array.shape[0] if array.ndim else None) for name, array in outputs.items()}
    batch = next(iter(sizes.values()))
    for name, size in sizes.items():
        if size is None or size != batch:
            raise invalid_argument(
                f"Tensor name: {name} has inconsistent batch size: {size} expecting: {batch}. "
                "Use the columnar format ('inputs') for outputs without a shared batch dimension."
            )
    assert batch is not None  # the first size, checked in the loop
    if len(outputs) == 1:
        return {"predictions": next(iter(outputs.values())).tolist()}
    columns = {name: array.tolist() for name, array in outputs.items()}
    return {"predictions": [{name: column[index] for name, column in columns.items()} for index in range(batch)]}


def predict_response_bytes(outputs: Mapping[str, np.ndarray], row_format: bool) -> bytes:
    """``predict_response`` as JSON bytes: orjson when installed and every value is finite, else json.

    Both write each float's shortest round-trip text, so a client reads the
    same numbers (orjson's separators are compact: ``[0.1,0.2]``). orjson
    writes NaN and Infinity as null, where TF Serving writes them as tokens:
    outputs are numbers only, so a ``null`` in orjson's bytes means such a
    value (or an output named so), and that answer is written by json; so are
    complex outputs, which orjson refuses. 17 us -> 4 us for a 10-class row.
    """
    document = predict_response(outputs, row_format)
    if _orjson is not None:
        try:
            encoded = _orjson.dumps(document)
        except TypeError:  # complex numbers: json's own error, as before
            pass
        else:
            if b"null" not in encoded:
                return encoded
    return json.dumps(document).encode()


def status_document(statuses: list[VersionStatus]) -> dict[str, Any]:
    """GetModelStatusResponse as TF Serving prints it: version as a string, default fields included."""
    return {
        "model_version_status": [
            {
                "version": str(status.version),
                "state": status.state,
                "status": {"error_code": status.error_code, "error_message": status.error_message},
            }
            for status in statuses
        ]
    }


def metadata_document(model_name: str, version: int, model: ExportedModel) -> dict[str, Any]:
    """GetModelMetadataResponse (signature_def only) for one loaded version."""
    definitions = {}
    for name in model.signature_names:
        signature = model.signature(name)
        definitions[name] = {
            # The tensor's name is the receiver input's, as TF names the one tensor "inputs" and "examples" feed.
            "inputs": {
                alias: _tensor_info(signature.receiver_input(alias), info) for alias, info in signature.inputs.items()
            },
            "outputs": {
                alias: _tensor_info(signature.program_outputs.get(alias, alias), info)
                for alias, info in signature.outputs.items()
            },
            "method_name": signature.method_name,
            "defaults": {},
        }
    return {
        "model_spec": {"name": model_name, "signature_name": "", "version": str(version)},
        "metadata": {"signature_def": {"signature_def": definitions}},
    }


def _tensor_info(name: str, info: TensorInfo) -> dict[str, Any]:
    known = info.dtype is not None
    return {
        "dtype": TF_DTYPES.get(info.dtype, "DT_INVALID") if known else "DT_INVALID",
        "tensor_shape": {"dim": [{"size": str(size), "name": ""} for size in info.shape], "unknown_rank": not known},
        "name": name,
    }


def _rows_to_columns(instances: Any, signature: Signature) -> dict[str, list[Any]]:
    if not isinstance(instances, list) or not instances:
        raise invalid_argument(
            f"'instances' must be a non-empty list with one element per example; received {preview_json(instances)}."
        )
    names = list(signature.inputs)
    named = [isinstance(row, dict) and not _is_b64(row) for row in instances]
    if not any(named):
        if len(names) != 1:
            raise invalid_argument(
                f"Signature {signature.name!r} takes {len(names)} inputs {describe_inputs(signature)}; "
                "each instance must be an object {input name: value}; received plain values."
            )
        return {names[0]: instances}
    if not all(named):
        raise invalid_argument(
            f"instances[{named.index(False)}] is a plain value while others are objects; every "
            f"instance must be an object {{input name: value}} for {describe_inputs(signature)}."
        )
    columns: dict[str, list[Any]] = {name: [] for name in names}
    for index, row in enumerate(instances):
        missing = [name for name in names if name not in row]
        unexpected = [name for name in row if name not in signature.inputs]
        if missing or unexpected:
            raise invalid_argument(
                f"instances[{index}] has missing inputs {missing} and unexpected inputs "
                f"{unexpected}; signature {signature.name!r} takes {describe_inputs(signature)}."
            )
        for name in names:
            columns[name].append(row[name])
    return columns


def _columnar_inputs(inputs: Any, signature: Signature) -> dict[str, Any]:
    names = list(signature.inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) != 1:
            raise invalid_argument(
                f"Signature {signature.name!r} takes {len(names)} inputs {describe_inputs(signature)}; "
                "'inputs' must be an object {input name: value}."
            )
        return {names[0]: inputs}
    missing = [name for name in names if name not in inputs]
    unexpected = [name for name in inputs if name not in signature.inputs]
    if missing or unexpected:
        raise invalid_argument(
            f"'inputs' has missing inputs {missing} and unexpected inputs {unexpected}; "
            f"signature {signature.name!r} takes {describe_inputs(signature)}."
        )
    return dict(inputs)


def _input_tensor(name: str, value: Any, info: TensorInfo) -> torch.Tensor:
    """JSON values as a tensor of the signature's dtype; shape is checked later by the loader.

    Error texts are built only when raised (each f-string cost ~1 us of a request).
    """
    try:
        array = np.array(value)
    except (ValueError, OverflowError) as error:  # numpy refuses ragged nesting
        _refuse_b64(name, value, info)
        raise invalid_argument(
            f"Input {name!r} is ragged or mis-nested ({error}); expected {_expected(info)}."
        ) from error
    dtype = _TORCH_DTYPES.get(info.dtype) or parse_dtype(info.dtype, f"signature input {name!r} dtype")
    kind = array.dtype.kind
    if array.size and kind not in "biuf":
        _refuse_b64(name, value, info)  # only searched for when numpy saw objects: numbers stay fast
        found = "null" if _contains(value, type(None)) else "strings" if kind in "US" else "non-numeric values"
        # TF's TypeError text first ("... is not of expected type: float"), then what we know more.
        raise invalid_argument(
            f"Input {name!r} is not of expected type: {_tf_type_name(info.dtype)}: it holds "
            f"{found} (or numbers out of range); expected {_expected(info)}."
        )
    if array.size and kind == "b" and dtype != torch.bool:
        raise invalid_argument(f"Input {name!r} holds booleans; expected {_expected(info)}.")
    if array.size and kind in "iuf" and dtype == torch.bool:
        raise invalid_argument(f"Input {name!r} holds numbers; expected {_expected(info)} (true/false).")
    if array.size and kind == "f" and not (dtype.is_floating_point or dtype.is_complex):
        raise invalid_argument(f"Input {name!r} holds non-integer numbers; expected {_expected(info)}.")
    if not array.size and array.dtype == np.float64 and not dtype.is_floating_point:
        array = array.astype(np.int64)  # [] reads as float64; its dtype carries no information
    try:
        numpy_dtype = _NUMPY_DTYPES.get(dtype)
        if array.size and kind in "iu" and numpy_dtype is not None and np.issubdtype(numpy_dtype, np.integer):
            _check_integer_range(name, array, numpy_dtype, info)
        if numpy_dtype is not None:  # numpy converts small arrays without dropping the GIL; a torch op would
            if numpy_dtype not in _NARROW_FLOATS:  # nothing to overflow (integer ranges are checked above)
                return torch.from_numpy(np.ascontiguousarray(array, dtype=numpy_dtype))
            with np.errstate(over="raise"):
                return torch.from_numpy(np.ascontiguousarray(array, dtype=numpy_dtype))
        return torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
    except FloatingPointError as error:  # a finite JSON number beyond the dtype's range, as TF refuses it
        raise invalid_argument(
            f"Cannot convert JSON value in input {name!r} to {info.dtype} without loss of "
            f"precision (a number beyond its range); expected {_expected(info)}."
        ) from error
    except (TypeError, RuntimeError, OverflowError) as error:
        raise invalid_argument(f"Input {name!r} could not be read as {_expected(info)}: {error}") from error


def _check_integer_range(name: str, array: np.ndarray, numpy_dtype: Any, info: TensorInfo) -> None:
    """Integers that do not fit the input's dtype are refused: a cast would wrap them silently."""
    limits = np.iinfo(numpy_dtype)
    low, high = int(array.min()), int(array.max())
    if low < limits.min or high > limits.max:
        value = low if low < limits.min else high
        raise invalid_argument(
            f"Cannot convert JSON value: {value} in input {name!r} to {np.dtype(numpy_dtype).name} "
            f"without loss of precision (its range is {limits.min}..{limits.max}); "
            f"expected {_expected(info)}."
        )


def _expected(info: TensorInfo) -> str:
    return f"{info.dtype} values of shape {list(info.shape)} (-1 = any size)"


# Signature dtype names -> torch dtypes, looked up per request (parse_dtype for any other name, and its error).
_TORCH_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in _NUMPY_DTYPES}
# Targets a finite number can overflow when cast (to inf): float64 values and big ints into these.
_NARROW_FLOATS = (np.float32, np.float16)


def _tf_type_name(dtype: str) -> str:
    """TF's C++ type name in its JSON type errors: float for float32, double, int64, bool, ..."""
    return {"float32": "float", "float64": "double", "float16": "Eigen::half", "bool": "bool"}.get(dtype, dtype)


def _refuse_b64(name: str, value: Any, info: TensorInfo) -> None:
    """{"b64": ...} is bytes (DT_STRING); torch programs take numbers, so it is refused with the reason."""
    found = _find_b64(value)
    if found is None:
        return
    check_b64_object(
        found,
        malformed=lambda: (
            f'Input {name!r} holds the object {preview_json(found)}; only {{"b64": "<base64>"}} '
            f"objects are allowed in tensors, and the signature expects {info.dtype} values."
        ),
        undecodable=lambda error: f'Input {name!r} holds invalid base64 in {{"b64": ...}}: {error}.',
    )
    raise invalid_argument(
        f'Input {name!r} has dtype {info.dtype}; {{"b64": ...}} bytes are only accepted for '
        "string inputs. Send the numbers as JSON numbers."
    )


def check_b64_object(
    found: dict[str, Any], *, malformed: Callable[[], str], undecodable: Callable[[Exception], str]
) -> None:
    """INVALID_ARGUMENT unless ``found`` is ``{"b64": "<valid base64>"}``; the callers word the message.

    Shared by predict's tensors and classify/regress features, which refuse
    even valid b64 afterwards (torch programs take no strings) but first say
    what TF Serving would have said about a broken one.
    """
    encoded = found.get("b64")
    if len(found) != 1 or not isinstance(encoded, str):
        raise invalid_argument(malformed())
    try:
        base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise invalid_argument(undecodable(error)) from error


def _find_b64(value: Any, depth: int = 0) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and depth < 64:
        for item in value:
            found = _find_b64(item, depth + 1)
            if found is not None:
                return found
    return None


def _contains(value: Any, kind: type, depth: int = 0) -> bool:
    if isinstance(value, kind):
        return True
    return isinstance(value, list) and depth < 64 and any(_contains(item, kind, depth + 1) for item in value)


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"]


def describe_inputs(signature: Signature) -> str:
    """{'name': dtype [shape], ...}: what a signature takes, for error messages."""
    return (
        "{" + ", ".join(f"{name!r}: {info.dtype} {list(info.shape)}" for name, info in signature.inputs.items()) + "}"
    )


def preview_json(value: Any) -> str:
    """A value as JSON, cut to 80 characters, for error messages."""
    try:
        text = json.dumps(value, default=str)
    except RecursionError:  # a client's document nested deeper than the stack allows
        return f"a JSON {'array' if isinstance(value, list) else 'value'} nested too deeply to show"
    return text if len(text) <= 80 else text[:77] + "..."
