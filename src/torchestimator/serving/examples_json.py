"""TF Serving's Classify and Regress requests: examples (+ context) to the tensors a signature takes.

    {"signature_name": "...", "context": {feature: value|list}, "examples": [{feature: value|list}, ...]}
      -> :classify  {"results": [[[label, score], ...] per example]}
      -> :regress   {"results": [value per example]}

``examples_request`` is the transport-independent entry (REST's JSON and
gRPC's Example protos both reach it, as decode_example's values per feature).

An export whose signature takes one string input parsed as tf.Examples
(build_parsing_serving_input_receiver) gets them exactly as TF Serving feeds
them: each example is made a tf.Example (JSON values by TF's
AddValueToFeature rules: a number with a fraction or exponent is a
float_list, an integer or bool an int64_list, a string or {"b64"} a
bytes_list, an empty list a Feature with no list), the context's serialized
bytes are put before each example's (InputToSerializedExampleTensor: the
example's copy of a repeated feature wins when parsed), and the batch of
serialized Examples goes through the export's parse step, whose errors are
TF's parse errors.

Other exports take named tensors: an example's features feed the
receiver's inputs by name (an image receiver's "image_bytes", even where the
signature calls that input "inputs" as TF does): context features are merged
into every example, each input's values are stacked along a new batch
dimension, and a value's list is reshaped to the input's per-example shape as
a FixedLenFeature is (``{"x": 1.0}`` feeds an input of shape [-1] or [-1, 1]).
Nested lists are allowed for inputs with more dimensions.

Pure functions over parsed JSON, an ExportedModel and output arrays; no HTTP
here (app.py). Messages follow SRV ``util/json_tensor.cc``
(FillClassifyRegressRequestFromJson, AddValueToFeature) and
``servables/tensorflow/classifier.cc`` / ``regressor.cc`` where TF has one;
every user mistake is a ServingError (INVALID_ARGUMENT, or
FAILED_PRECONDITION for a signature without TF's output names, as TF).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch

from torchestimator.export import DEFAULT_SERVING_SIGNATURE_DEF_KEY, ExportedModel, Signature, TensorInfo
from torchestimator.export.decoders import STRING, ExampleParsing
from torchestimator.export.receiver import parse_dtype
from torchestimator.serving.errors import ServingError, invalid_argument
from torchestimator.serving.json_tensor import (
    TF_DTYPES,
    b64_bytes,
    check_b64_object,
    decoded_inputs,
    preview_json,
)

__all__ = [
    "ExamplesRequest",
    "classify_results",
    "example_from_json",
    "examples_request",
    "parse_examples_request",
    "regress_results",
    "serialized_examples",
]

_METHOD_NAMES = {
    "classify": ("classification", "tensorflow/serving/classify"),
    "regress": ("regression", "tensorflow/serving/regress"),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExamplesRequest:
    """A checked :classify or :regress request: one tensor per signature input, batched over the examples."""

    signature_name: str
    inputs: dict[str, torch.Tensor]
    count: int
    """How many examples: the batch size every output must have."""


def parse_examples_request(document: Mapping[str, Any], model: ExportedModel, method: str) -> ExamplesRequest:
    """The tensors a Classify (``method="classify"``) or Regress (``"regress"``) REST request feeds its signature."""
    if method not in _METHOD_NAMES:
        raise ValueError(f"method must be 'classify' or 'regress'; received {method!r}.")
    # TF reads the JSON (signature name, context, examples) before it looks at the model.
    signature_name = document.get("signature_name", DEFAULT_SERVING_SIGNATURE_DEF_KEY)
    if not isinstance(signature_name, str):
        raise invalid_argument(
            f"JSON Value: {preview_json(document)} not formatted correctly. 'signature_name' key must "
            "be a string value."
        )
    context = _context(document)
    examples = _examples(document, method)
    signature = _signature(model, signature_name or DEFAULT_SERVING_SIGNATURE_DEF_KEY, method)
    if _parsed_input(model, signature) is not None:  # JSON -> tf.Example values, by TF's rules
        context = example_from_json(context, "'context'")
        examples = [example_from_json(example, f"examples[{index}]") for index, example in enumerate(examples)]
    return examples_request(context, examples, model, method, signature.name)


def examples_request(
    context: Mapping[str, Any],
    examples: Sequence[Mapping[str, Any]],
    model: ExportedModel,
    method: str,
    signature_name: str,
) -> ExamplesRequest:
    """The program's tensors for a Classify or Regress request's examples and context.

    Values per feature are what ``te.data.decode_example`` returns (int64 or
    float32 array, list of bytes; [] for a Feature with no list); for an
    export without a parsing receiver, JSON values as REST sends them work too.
    With a parsing receiver the examples are serialized (context first, as
    TF) and parsed by the export's parse step; otherwise features feed the
    signature's inputs by name (the module docstring).
    """
    if method not in _METHOD_NAMES:
        raise ValueError(f"method must be 'classify' or 'regress'; received {method!r}.")
    signature = _signature(model, signature_name or DEFAULT_SERVING_SIGNATURE_DEF_KEY, method)
    if not examples:
        raise invalid_argument("Input is empty.")  # TF's InputToSerializedExampleTensor
    parsed = _parsed_input(model, signature)
    if parsed is not None:
        inputs = decoded_inputs(model, {parsed: serialized_examples(context, examples)}, signature.name)
        return ExamplesRequest(signature_name=signature.name, inputs=inputs, count=len(examples))
    features = _feature_names(signature)
    columns = _columns(context, examples, signature, features)
    given: dict[str, list[bytes] | torch.Tensor] = {}
    for feature, name in features.items():
        info, source = signature.inputs[name], "'context'" if feature in context else None
        given[name] = (
            _string_feature(feature, columns[feature], source)
            if info.dtype == STRING
            else _feature_tensor(feature, columns[feature], info, source)
        )
    if any(info.dtype == STRING for info in signature.inputs.values()):
        inputs = decoded_inputs(model, given, signature.name)
    else:
        inputs = cast("dict[str, torch.Tensor]", given)  # no string input: every value is a tensor
    return ExamplesRequest(signature_name=signature.name, inputs=inputs, count=len(examples))


def _parsed_input(model: ExportedModel, signature: Signature) -> str | None:
    """The signature's one input when it is a string input parsed as tf.Examples (TF's classify/regress form)."""
    if len(signature.inputs) != 1:
        return None
    name, info = next(iter(signature.inputs.items()))
    step = getattr(model, "decode_steps", {}).get(signature.receiver_input(name)) if info.dtype == STRING else None
    return name if isinstance(step, ExampleParsing) else None


# -- tf.Examples -----------------------------------------------------------------------


def serialized_examples(context: Mapping[str, Any], examples: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Each example serialized as a tf.Example after the context's bytes (TF Serving's merge: one message, the
    example's copy of a feature read last)."""
    prefix = _example_bytes(context, "'context'") if context else b""
    return [prefix + _example_bytes(example, f"examples[{index}]") for index, example in enumerate(examples)]


def _example_bytes(features: Mapping[str, Any], where: str) -> bytes:
    from torchestimator.data.example import example_protos

    message = example_protos().Example()
    feature_map = message.features.feature
    for name, values in features.items():
        feature = feature_map[name]  # created even when it stays without a list: Feature(), as TF keeps it
        if isinstance(values, np.ndarray) and values.dtype.kind in "iub":
            feature.int64_list.SetInParent()
            feature.int64_list.value.extend(values.astype(np.int64).reshape(-1).tolist())
        elif isinstance(values, np.ndarray) and values.dtype.kind == "f":
            feature.float_list.SetInParent()
            feature.float_list.value.extend(values.astype(np.float32).reshape(-1).tolist())
        elif isinstance(values, (list, tuple)) and all(isinstance(value, bytes) for value in values):
            if values:
                feature.bytes_list.value.extend(values)
            else:
                feature.SetInParent()
        else:
            raise TypeError(
                f"Feature {name!r} of {where}: expected decode_example's values (an int64 or float32 "
                f"array, or a list of bytes); received {type(values).__name__}."
            )
    return message.SerializeToString(deterministic=True)


_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def example_from_json(features: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A JSON example's features as tf.Example values, by TF Serving's MakeExampleFromJsonObject and
    AddValueToFeature (util/json_tensor.cc); errors in TF's words, then ``where``."""
    return {name: _feature_from_json(name, value, where) for name, value in features.items()}


def _feature_from_json(name: str, value: Any, where: str) -> Any:
    kind, values = None, []
    for item in value if isinstance(value, list) else [value]:
        item_kind, converted = _json_feature_value(name, item, where)
        if kind is not None and item_kind != kind:
            raise invalid_argument(f"Unexpected element type in feature: {name} expecting type: {kind} ({where}).")
        kind = item_kind
        values.append(converted)
    if kind is None:
        return []  # an empty list: a Feature with no list set
    if kind == "int64":
        return np.array(values, np.int64)
    if kind == "float":
        return np.array(values, np.float32)
    return values


def _json_feature_value(name: str, item: Any, where: str) -> tuple[str, Any]:
    if isinstance(item, bool):
        return "int64", int(item)
    if isinstance(item, int):
        if _INT64_MIN <= item <= _INT64_MAX:
            return "int64", item
        if 0 < item <= _UINT64_MAX:
            raise invalid_argument(f"Feature: {name} has uint64 element. Only int64 is supported ({where}).")
        item = float(item)  # beyond 64 bits rapidjson reads the number as a double
    if isinstance(item, float):
        if math.isfinite(item) and abs(item) > _FLOAT32_MAX:
            raise invalid_argument(
                f"Cannot convert JSON value: {item!r} to float without loss of precision (feature {name!r}, {where})."
            )
        return "float", item
    if isinstance(item, str):
        return "bytes", item.encode("utf-8")
    if isinstance(item, dict) and list(item) == ["b64"] and isinstance(item["b64"], str):
        return "bytes", b64_bytes(item, f"feature {name!r}, {where}")
    kind = (
        "Null"
        if item is None
        else "Object"
        if isinstance(item, dict)
        else "Array"
        if isinstance(item, list)
        else type(item).__name__
    )
    raise invalid_argument(f"Feature: {name} has element with unexpected JSON type: {kind} ({where}).")


def classify_results(outputs: Mapping[str, np.ndarray], count: int) -> dict[str, Any]:
    """``{"results": [[[label, score], ...], ...]}`` from a classify signature's "classes" and/or "scores".

    As classifier.cc: both are [batch_size, num_classes]; a missing one leaves
    labels "" or scores 0.0. Classes of shape [batch_size] count as one class
    each; integer classes become their decimal strings.
    """
    classes, scores = outputs.get("classes"), outputs.get("scores")
    if classes is None and scores is None:
        raise ServingError(
            "FAILED_PRECONDITION",
            "Expected classification signature outputs to contain at least "
            f'one of "classes" or "scores". Signature outputs were: {sorted(outputs)}.',
        )
    labels = None if classes is None else _class_labels(np.asarray(classes), count)
    if scores is not None:
        scores = np.asarray(scores)
        _check_matrix("scores", scores, count)
        if scores.dtype.kind != "f":
            raise invalid_argument(
                f"Expected scores Tensor of DT_FLOAT. Got: {_tf_dtype(scores)}. Export "
                "floating-point scores (ClassificationOutput does)."
            )
    if labels is not None and scores is not None and labels.shape[1] != scores.shape[1]:
        raise invalid_argument(
            f"Tensors class and score should match in dim_size(1). Got {labels.shape[1]} vs. "
            f"{scores.shape[1]}. Export classes of shape [batch_size, num_classes] next to the "
            "scores, e.g. every class id for every example."
        )
    either = labels if labels is not None else scores
    assert either is not None  # refused above when both are missing
    num_classes = either.shape[1]
    label_rows = labels.tolist() if labels is not None else [[""] * num_classes] * count
    score_rows = scores.tolist() if scores is not None else [[0.0] * num_classes] * count
    return {
        "results": [
            [[label, float(score)] for label, score in zip(label_row, score_row)]
            for label_row, score_row in zip(label_rows, score_rows)
        ]
    }


def regress_results(outputs: Mapping[str, np.ndarray], count: int) -> dict[str, Any]:
    """``{"results": [value, ...]}`` from a regress signature's "outputs" of shape [batch_size] or [batch_size, 1]."""
    if "outputs" not in outputs:
        raise ServingError(
            "FAILED_PRECONDITION",
            "No regression outputs found in SignatureDef: expected an output "
            f"named 'outputs' (RegressionOutput); the signature has {sorted(outputs)}.",
        )
    values = np.asarray(outputs["outputs"])
    if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)):
        raise invalid_argument(
            f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got {_shape(values)}"
        )
    if values.shape[0] != count:
        raise invalid_argument(f"Input batch size did not match output batch size: {count} vs. {values.shape[0]}")
    if values.dtype.kind != "f":
        raise invalid_argument(f"Expected output Tensor of DT_FLOAT.  Got: {_tf_dtype(values)}")
    return {"results": values.reshape(-1).tolist()}  # float32 -> exact Python floats


# -- request parts ---------------------------------------------------------------------


def _context(document: Mapping[str, Any]) -> dict[str, Any]:
    if "context" not in document:
        return {}
    context = document["context"]
    if not isinstance(context, dict):
        raise invalid_argument(f"Example must be JSON object but got JSON {_json_type(context)} ('context').")
    return context


def _examples(document: Mapping[str, Any], method: str) -> list[dict[str, Any]]:
    if "examples" not in document:
        raise invalid_argument(
            f"JSON Value: {preview_json(document)} When method is {method}, key 'examples' is "
            "expected and was not found"
        )
    examples = document["examples"]
    if not isinstance(examples, list):
        raise invalid_argument(f"JSON Value: {preview_json(document)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise invalid_argument(f"JSON Value: {preview_json(document)} 'examples' value is an empty array")
    for index, example in enumerate(examples):
        if not isinstance(example, dict):
            raise invalid_argument(
                f"Example must be JSON object but got JSON {_json_type(example)} (examples[{index}])."
            )
    return examples


def _signature(model: ExportedModel, name: str, method: str) -> Signature:
    if name not in model.signature_names:
        raise invalid_argument(
            f'Serving signature name: "{name}" not found in signature def (the model has {model.signature_names}).'
        )
    signature = model.signature(name)
    if signature.method != method:
        kind, method_name = _METHOD_NAMES[method]
        fitting = [other for other in model.signature_names if model.signature(other).method == method]
        instead = (
            f", or choose one of the model's {kind} signatures {fitting} with 'signature_name'"
            if fitting
            else f"; the model has no {kind} signature"
        )
        raise invalid_argument(
            f"Expected {kind} signature method_name to be {method_name}. Was: "
            f"{signature.method_name}. Signature {name!r} is a {signature.method} signature; "
            f"send it to :{signature.method}{instead}."
        )
    return signature


def _feature_names(signature: Signature) -> dict[str, str]:
    """{feature name: signature input}: features are named as the receiver's inputs, even where the signature
    calls its one string input "inputs" (TF's key, here over an image receiver: the feature stays "image_bytes")."""
    return {signature.receiver_input(name): name for name in signature.inputs}


def _columns(
    context: Mapping[str, Any], examples: Sequence[Mapping[str, Any]], signature: Signature, features: Mapping[str, str]
) -> dict[str, list]:
    """Per feature, its value in every example (context merged in); names are checked against ``features``."""
    for index, example in enumerate(examples):
        repeated = [name for name in example if name in context]
        if repeated:
            raise invalid_argument(
                f"Features {repeated} of examples[{index}] are also in 'context'; context "
                "features are shared by every example and must not repeat in one."
            )
        missing = [name for name in features if name not in example and name not in context]
        unexpected = [name for name in (*context, *example) if name not in features]
        if missing or unexpected:
            described = ", ".join(
                f"{feature!r}: {signature.inputs[name].dtype} {list(signature.inputs[name].shape)}"
                for feature, name in features.items()
            )
            raise invalid_argument(
                f"examples[{index}] (with 'context') has missing features {missing} and "
                f"unexpected features {unexpected}; signature {signature.name!r} takes "
                f"{{{described}}}, one value or list per example."
            )
    return {
        name: [context[name]] * len(examples) if name in context else [example[name] for example in examples]
        for name in features
    }


# -- feature values --------------------------------------------------------------------


def _string_feature(name: str, values: list[Any], source: str | None) -> list[bytes]:
    """A string input's feature across examples: one bytes value each (a string, {"b64"}, or a list of one)."""
    column = []
    for index, value in enumerate(values):
        where = source or f"examples[{index}]"
        item = value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value
        if isinstance(item, bytes):
            column.append(item)
        elif isinstance(item, str):
            column.append(item.encode("utf-8"))
        elif isinstance(item, dict):
            column.append(b64_bytes(item, f"feature {name!r}, {where}"))
        else:
            raise invalid_argument(
                f"Feature {name!r} of {where} feeds the string input {name!r}: give one string or "
                f'{{"b64": ...}} per example; received {preview_json(value)}.'
            )
    return column


def _feature_tensor(name: str, values: list[Any], info: TensorInfo, source: str | None) -> torch.Tensor:
    """One input's values across examples, stacked to [count, *per-example shape] in the signature's dtype."""
    dtype = parse_dtype(info.dtype, f"signature input {name!r} dtype")
    if not info.shape:
        raise invalid_argument(
            f"Input {name!r} is a scalar (shape []); :classify and :regress batch examples "
            "along a first dimension. Use :predict for this signature."
        )
    tail = tuple(info.shape[1:])
    try:
        array = np.array(values)
    except (ValueError, OverflowError):  # ragged: each example is looked at on its own below
        array = None
    if (
        array is not None
        and array.dtype.kind in "biuf"
        and not _fits(array.shape[1:], tail)
        and _static(tail)
        and math.prod(array.shape[1:]) == math.prod(tail)
    ):
        array = array.reshape((len(values), *tail))  # every example a flat list filling the shape: one reshape
    if array is None or array.dtype.kind not in "biuf" or not _fits(array.shape[1:], tail):
        rows = [
            _example_array(name, value, info, tail, source or f"examples[{index}]")
            for index, value in enumerate(values)
        ]
        try:
            array = np.stack(rows)
        except ValueError as error:
            shapes = sorted({row.shape for row in rows})
            raise invalid_argument(
                f"Feature {name!r} has different shapes across examples {shapes}; one batch needs "
                f"one shape per example, {list(tail)} for signature input {name!r}."
            ) from error
    return torch.from_numpy(np.ascontiguousarray(_checked_kind(name, array, dtype, info))).to(dtype)


def _example_array(name: str, value: Any, info: TensorInfo, tail: tuple[int, ...], where: str) -> np.ndarray:
    try:
        array = np.array(value)
    except (ValueError, OverflowError) as error:
        _refuse_non_numbers(name, value, where)
        raise invalid_argument(
            f"Feature {name!r} of {where} is a ragged or mis-nested list ({error}); expected {_expected(info)}."
        ) from error
    if array.dtype.kind not in "biuf" and array.size:
        _refuse_non_numbers(name, value, where)
        raise invalid_argument(f"Feature {name!r} of {where} holds numbers out of range; expected {_expected(info)}.")
    if _fits(array.shape, tail):
        return array
    if _static(tail) and array.size == math.prod(tail):
        return array.reshape(tail)  # a flat list fills the shape, as a FixedLenFeature does
    raise invalid_argument(
        f"Feature {name!r} of {where} has shape {list(array.shape)} ({array.size} values); expected {_expected(info)}."
    )


def _refuse_non_numbers(name: str, value: Any, where: str) -> None:
    """AddValueToFeature's refusals, plus strings and bytes, which no torch program input takes."""
    for item in _leaves(value):
        if item is None:
            raise invalid_argument(f"Feature: {name} has element with unexpected JSON type: Null ({where}).")
        if isinstance(item, dict):
            check_b64_object(
                item,
                malformed=lambda: (
                    f"Feature: {name} has element with unexpected JSON type: Object ({where}); "
                    'the only object allowed is {"b64": "<base64>"}.'
                ),
                undecodable=lambda error: f"Feature {name!r} of {where}: Unable to base64 decode ({error}).",
            )
            raise invalid_argument(
                f'Feature {name!r} of {where} holds bytes ({{"b64": ...}}); exported torch '
                "programs take numeric tensors only. Send the numbers as JSON numbers."
            )
        if isinstance(item, (str, bytes)):
            raise invalid_argument(
                f"Feature {name!r} of {where} holds strings; signature input {name!r} takes "
                "numeric tensors only. Send the numbers as JSON numbers (or export with "
                "build_parsing_serving_input_receiver to take tf.Examples as TF does)."
            )


def _leaves(value: Any, depth: int = 0):
    if isinstance(value, list) and depth < 64:
        for item in value:
            yield from _leaves(item, depth + 1)
    else:
        yield value


def _checked_kind(name: str, array: np.ndarray, dtype: torch.dtype, info: TensorInfo) -> np.ndarray:
    """JSON numbers as TF reads them: bool is int64 0/1, a fraction is float, and nothing narrows silently."""
    kind = array.dtype.kind
    if not array.size:
        return array.astype(np.int64) if not dtype.is_floating_point and dtype != torch.bool else array
    if dtype == torch.bool:
        if kind != "b":
            raise invalid_argument(f"Feature {name!r} holds numbers; expected {_expected(info)} (true/false).")
        return array
    if kind == "b":
        return array.astype(np.int64)  # AddValueToFeature: bool -> int64_list 0/1
    if dtype.is_floating_point:
        if kind == "f":
            finite = np.abs(array[np.isfinite(array)])
            limit = torch.finfo(dtype).max
            if finite.size and finite.max() > limit:
                raise invalid_argument(
                    f"Cannot convert JSON value: {float(finite.max())!r} to {info.dtype} without "
                    f"loss of precision (feature {name!r})."
                )
        return array
    if kind == "f":
        raise invalid_argument(f"Feature {name!r} holds non-integer numbers; expected {_expected(info)}.")
    if kind == "u" and array.max() > np.iinfo(np.int64).max:
        raise invalid_argument(f"Feature: {name} has uint64 element. Only int64 is supported.")
    bounds = torch.iinfo(dtype)
    if array.min() < bounds.min or array.max() > bounds.max:
        raise invalid_argument(
            f"Feature {name!r} holds integers outside {info.dtype}'s range "
            f"[{bounds.min}, {bounds.max}]; expected {_expected(info)}."
        )
    return array


def _static(shape: tuple[int, ...]) -> bool:
    return all(size >= 0 for size in shape)


def _fits(shape: tuple[int, ...], tail: tuple[int, ...]) -> bool:
    return len(shape) == len(tail) and all(want < 0 or want == size for size, want in zip(shape, tail))


def _expected(info: TensorInfo) -> str:
    return (
        f"{info.dtype} values of shape {list(info.shape[1:])} per example (-1 = any size; the signature's "
        f"shape {list(info.shape)} without its batch dimension)"
    )


# -- outputs ---------------------------------------------------------------------------


def _class_labels(classes: np.ndarray, count: int) -> np.ndarray:
    """Classes as a [batch_size, num_classes] array of str labels."""
    if classes.ndim == 1:
        classes = classes[:, None]
    _check_matrix("classes", classes, count)
    kind = classes.dtype.kind
    if kind in "iu":
        return classes.astype(str)
    if kind == "U":
        return classes
    if kind in "SO" and all(isinstance(item, (bytes, str)) for item in classes.flat):
        return np.vectorize(
            lambda item: item.decode("utf-8", "replace") if isinstance(item, bytes) else item, otypes=[object]
        )(classes)
    raise invalid_argument(
        f"Expected classes Tensor of DT_STRING. Got: {_tf_dtype(classes)}. Export class ids "
        "(integers) or names as the classes."
    )


def _check_matrix(output: str, array: np.ndarray, count: int) -> None:
    if array.ndim != 2:
        raise invalid_argument(
            f"Expected Tensor shape: [batch_size num_classes] but got {_shape(array)} (output {output!r})."
        )
    if array.shape[0] != count:
        raise invalid_argument(f"Expected {output} output batch size of {count}. Got: {array.shape[0]}")


def _shape(array: np.ndarray) -> str:
    return "[" + ",".join(str(size) for size in array.shape) + "]"  # TensorShape::DebugString


def _tf_dtype(array: np.ndarray) -> str:
    return TF_DTYPES.get(array.dtype.name, f"DT_INVALID ({array.dtype.name})")


def _json_type(value: Any) -> str:
    """json_tensor.cc's JsonTypeString."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"
