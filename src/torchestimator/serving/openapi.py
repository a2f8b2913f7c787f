"""An OpenAPI 3.0 description of the REST API the server speaks (TF Serving's), for clients and fuzzers.

    document = openapi_document(["half_plus_two"])   # a plain dict, JSON-ready
    json.dumps(document)

What belongs here: the paths, parameters, request bodies and response
documents of SRV ``g3doc/api_rest.md`` as app.py answers them, written as
data. The paths themselves are matched in app.py and the JSON shapes are built
in json_tensor.py; this module only describes them, so a change there must be
mirrored here (tests/test_serving_fuzz.py checks every answer against it).

Model status and metadata are GETs; predict, classify and regress are POSTs
whose verb follows the path after a colon (``/v1/models/m:predict``), with
optional ``/versions/{version}`` or ``/labels/{label}`` before it. TF Serving
accepts NaN and Infinity tokens in bodies; JSON Schema cannot say so, so the
schemas describe the strict-JSON subset.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

__all__ = ["ERROR_STATUSES", "OPENAPI_VERSION", "openapi_document"]

OPENAPI_VERSION = "3.0.3"

# Every error status the server may answer with, and why (errors.py maps TF's codes to these).
ERROR_STATUSES = {
    "400": "Invalid argument: a malformed HTTP request, JSON or path, a body that does not decode as its "
    "Content-Encoding (gzip, deflate) says, or inputs that do not fit the signature.",
    "404": "Model, version or label not found.",
    "405": "Wrong HTTP method for this path.",
    "413": "Request body larger than the server's limit (after inflating a gzip or deflate body).",
    "417": "An Expect header other than 100-continue.",
    "429": "Resource exhausted: the request queue is full.",
    "501": "Not implemented.",
    "503": "Unavailable: the model is loading or the server is shutting down.",
}

_GET_ERRORS = ("400", "404", "405", "417", "429", "503")
_POST_ERRORS = tuple(ERROR_STATUSES)

# One path segment, as app.py's regexes take it: no slash, no colon.
_SEGMENT_PATTERN = "^[^/:]+$"

_VERBS = {
    "predict": ("PredictRequest", "PredictResponse", "Predict: run a signature on tensors in row or columnar form."),
    "classify": ("ClassifyRegressRequest", "ClassifyResponse", "Classify tf.Example-like feature objects."),
    "regress": ("ClassifyRegressRequest", "RegressResponse", "Regress tf.Example-like feature objects."),
}

_SELECTORS = {  # path suffix after the model name -> (operation id suffix, extra path parameter)
    "": ("", None),
    "/versions/{version}": ("_version", "version"),
    "/labels/{label}": ("_label", "label"),
}


def openapi_document(model_names: Sequence[str] | None = None) -> dict[str, Any]:
    """The OpenAPI 3.0 document of the REST API.

    With ``model_names`` the ``model_name`` parameter is an enum of those
    names: schema-valid requests (schemathesis's positive mode) reach the served
    models, and schema-violating ones (negative mode) name unknown models
    (404) or malformed paths (400). Without it any path segment is valid.
    """
    names = _check_names(model_names)
    paths: dict[str, Any] = {
        "/v1/models": {
            "get": {
                "operationId": "missing_model_name",
                "summary": "Without a model name TF Serving answers 400 'Missing model name in request.'",
                "responses": _responses(None, ("400", "405")),
            }
        },
    }
    for suffix, (operation_suffix, parameter) in _SELECTORS.items():
        parameters = _path_parameters(names, parameter)
        paths[f"/v1/models/{{model_name}}{suffix}"] = {
            "get": {
                "operationId": f"model_status{operation_suffix}",
                "summary": "Status of every version of the model (or of one version or label).",
                "parameters": parameters,
                "responses": _responses("ModelStatusResponse", _GET_ERRORS),
            }
        }
        paths[f"/v1/models/{{model_name}}{suffix}/metadata"] = {
            "get": {
                "operationId": f"model_metadata{operation_suffix}",
                "summary": "Signature definitions of the latest version (or of one version or label).",
                "parameters": parameters,
                "responses": _responses("ModelMetadataResponse", _GET_ERRORS),
            }
        }
        for verb, (request, response, summary) in _VERBS.items():
            paths[f"/v1/models/{{model_name}}{suffix}:{verb}"] = {
                "post": {
                    "operationId": f"{verb}{operation_suffix}",
                    "summary": summary,
                    "parameters": parameters,
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}},
                    },
                    "responses": _responses(response, _POST_ERRORS),
                }
            }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "torchestimator model server (TensorFlow Serving REST API)",
            "version": "1",
            "description": "TF Serving's REST API (tensorflow_serving/g3doc/api_rest.md) for torchestimator exports. "
            "Bodies may also hold the NaN, Infinity and -Infinity tokens.",
        },
        "paths": paths,
        "components": {"schemas": copy.deepcopy(_SCHEMAS)},
    }


def _check_names(model_names: Sequence[str] | None) -> list[str]:
    if model_names is None:
        return []
    if isinstance(model_names, str) or not all(isinstance(name, str) and name for name in model_names):
        raise TypeError(f"model_names must be a sequence of non-empty model names (or None); received {model_names!r}.")
    bad = [name for name in model_names if "/" in name or ":" in name]
    if bad:
        raise ValueError(f"Model names cannot contain '/' or ':' (they are path segments); received {bad}.")
    return list(dict.fromkeys(model_names))


def _path_parameters(names: list[str], selector: str | None) -> list[dict[str, Any]]:
    any_segment = {"type": "string", "pattern": _SEGMENT_PATTERN}
    # An enum, not anyOf(enum, any segment): generators simplify the latter to "any segment" and then never
    # produce a served name.
    model_name = {"type": "string", "enum": names} if names else any_segment
    parameters = [
        {
            "name": "model_name",
            "in": "path",
            "required": True,
            "schema": model_name,
            "description": "The served model name (TF's --model_name or the model config's name).",
        }
    ]
    if selector == "version":
        parameters.append(
            {
                "name": "version",
                "in": "path",
                "required": True,
                "schema": {"type": "integer", "format": "int64", "minimum": 0},
                "description": "An integer version folder under the model's base path.",
            }
        )
    elif selector == "label":
        parameters.append(
            {
                "name": "label",
                "in": "path",
                "required": True,
                "schema": any_segment,
                "description": "A version label from the model config (e.g. stable, canary).",
            }
        )
    return parameters


def _responses(success: str | None, errors: Sequence[str]) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    if success is not None:
        responses["200"] = {
            "description": "Success.",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{success}"}}},
        }
    for status in errors:
        responses[status] = {
            "description": ERROR_STATUSES[status],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    return responses


_ANY: dict[str, Any] = {}  # any JSON value: tensors are nested lists, numbers, strings, booleans or {"b64": ...}

_TENSOR_INFO = {
    "type": "object",
    "required": ["dtype", "tensor_shape", "name"],
    "properties": {
        "dtype": {"type": "string", "pattern": "^DT_[A-Z0-9_]+$"},
        "tensor_shape": {
            "type": "object",
            "required": ["dim", "unknown_rank"],
            "properties": {
                "dim": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["size", "name"],
                        "properties": {"size": {"type": "string", "pattern": "^-?[0-9]+$"}, "name": {"type": "string"}},
                    },
                },
                "unknown_rank": {"type": "boolean"},
            },
        },
        "name": {"type": "string"},
    },
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": 'Every error answer: {"error": <message>}.',
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
        "additionalProperties": False,
    },
    "ModelStatusResponse": {
        "type": "object",
        "description": "GetModelStatusResponse in JSON, default-valued fields included.",
        "required": ["model_version_status"],
        "properties": {
            "model_version_status": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["version", "state", "status"],
                    "properties": {
                        "version": {"type": "string", "pattern": "^[0-9]+$", "description": "int64 as a JSON string"},
                        "state": {
                            "type": "string",
                            "enum": ["UNKNOWN", "START", "LOADING", "AVAILABLE", "UNLOADING", "END"],
                        },
                        "status": {
                            "type": "object",
                            "required": ["error_code", "error_message"],
                            "properties": {"error_code": {"type": "string"}, "error_message": {"type": "string"}},
                        },
                    },
                },
            }
        },
    },
    "ModelMetadataResponse": {
        "type": "object",
        "description": "GetModelMetadataResponse with the signature_def metadata field only.",
        "required": ["model_spec", "metadata"],
        "properties": {
            "model_spec": {
                "type": "object",
                "required": ["name", "signature_name", "version"],
                "properties": {
                    "name": {"type": "string"},
                    "signature_name": {"type": "string"},
                    "version": {"type": "string", "pattern": "^[0-9]+$"},
                },
            },
            "metadata": {
                "type": "object",
                "required": ["signature_def"],
                "properties": {
                    "signature_def": {
                        "type": "object",
                        "required": ["signature_def"],
                        "properties": {
                            "signature_def": {
                                "type": "object",
                                "additionalProperties": {
                                    "type": "object",
                                    "required": ["inputs", "outputs", "method_name"],
                                    "properties": {
                                        "inputs": {"type": "object", "additionalProperties": _TENSOR_INFO},
                                        "outputs": {"type": "object", "additionalProperties": _TENSOR_INFO},
                                        "method_name": {"type": "string"},
                                        "defaults": {"type": "object"},
                                    },
                                },
                            }
                        },
                    }
                },
            },
        },
    },
    "PredictRequest": {
        "type": "object",
        "description": "Row format (instances: one element per example) or columnar format (inputs), never both.",
        "properties": {
            "signature_name": {"type": "string", "description": "Default: serving_default."},
            "instances": {"type": "array", "minItems": 1, "items": _ANY},
            "inputs": _ANY,
        },
        "oneOf": [{"required": ["instances"]}, {"required": ["inputs"]}],
    },
    "PredictResponse": {
        "type": "object",
        "description": "predictions for a row-format request, outputs for a columnar one.",
        "oneOf": [
            {"required": ["predictions"], "properties": {"predictions": {"type": "array"}}},
            {"required": ["outputs"], "properties": {"outputs": _ANY}},
        ],
    },
    "ClassifyRegressRequest": {
        "type": "object",
        "description": "tf.Example-like objects {feature: value | [values]}; context features are shared by all.",
        "required": ["examples"],
        "properties": {
            "signature_name": {"type": "string"},
            "context": {"type": "object"},
            "examples": {"type": "array", "minItems": 1, "items": {"type": "object"}},
        },
    },
    "ClassifyResponse": {
        "type": "object",
        "required": ["results"],
        "properties": {
            "results": {
                "type": "array",
                "items": {
                    "type": "array",
                    "description": '[label, score] pairs; the label may be "".',
                    "items": {"type": "array", "minItems": 2, "maxItems": 2},
                },
            }
        },
    },
    "RegressResponse": {
        "type": "object",
        "required": ["results"],
        "properties": {"results": {"type": "array", "items": {"type": "number"}}},
    },
}
