"""TF Serving's SavedModel warm-up file: ``assets.extra/tf_serving_warmup_requests``, written with an export.

    export_saved_model(estimator, "export/digits", receiver,
                       warmup_requests=[{"x": np.zeros((1, 64), np.float32)}])   # -> PredictRequest, serving_default

The file is a TFRecord of ``tensorflow.serving.PredictionLog`` records (TF
Serving's g3doc/saved_model_warmup.md), at most 1000 of them as TF allows;
``torchestimator serve`` (and TF Serving) with --enable_model_warmup replays
them through a version before it takes traffic (serving/warmup.py).

What belongs here: turning the requests a user gives into PredictionLog
records and writing them. A request is a dict {input name: array} (a
PredictRequest for the ``serving_default`` signature, checked against its
inputs and converted to their dtypes), or a message of
``torchestimator.serving.protos``: PredictRequest, ClassificationRequest,
RegressionRequest (each wrapped in its log) or a whole PredictionLog. What
does not: replaying the file (serving/warmup.py), the messages (serving/protos.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from torchestimator.data.tfrecord import TFRecordWriter
from torchestimator.export.outputs import DEFAULT_SERVING_SIGNATURE_DEF_KEY

__all__ = ["MAX_WARMUP_RECORDS", "WARMUP_FILE", "warmup_records", "write_warmup_file"]

WARMUP_FILE = "tf_serving_warmup_requests"
"""Its name inside the version's assets.extra/ folder (TF Serving's kSavedModelWarmupRequestsFile... path)."""
MAX_WARMUP_RECORDS = 1000
"""TF Serving refuses a warm-up file with more records (saved_model_warmup_util.cc kMaxNumRecords)."""

_LOGS = {"PredictRequest": "predict_log", "ClassificationRequest": "classify_log", "RegressionRequest": "regress_log"}


def warmup_records(requests: Sequence[Any], signatures: Mapping[str, Mapping[str, Any]]) -> list[bytes]:
    """Each request as a serialized PredictionLog; ValueError/TypeError naming the request that is wrong.

    ``signatures`` is signature.json's "signatures" section (name -> {"inputs": {name: {"dtype", "shape"}}}).
    """
    from torchestimator.serving.protos import serving_protos

    if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Sequence):
        raise TypeError(
            f"warmup_requests must be a list of requests (dicts of arrays or serving protos); "
            f"received {type(requests).__name__}."
        )
    if not requests:
        raise ValueError("warmup_requests is empty; give at least one request, or None for no warm-up file.")
    if len(requests) > MAX_WARMUP_RECORDS:
        raise ValueError(
            f"warmup_requests has {len(requests)} requests; TF Serving replays at most "
            f"{MAX_WARMUP_RECORDS}. Give a few representative ones."
        )
    protos = serving_protos()
    records = []
    for index, request in enumerate(requests):
        log = protos.PredictionLog()
        kind = type(request).__name__ if hasattr(request, "DESCRIPTOR") else None
        if isinstance(request, Mapping):
            log.predict_log.request.CopyFrom(_predict_request(request, signatures, index))
        elif kind == "PredictionLog" and request.DESCRIPTOR.full_name == "tensorflow.serving.PredictionLog":
            if request.WhichOneof("log_type") is None:
                raise ValueError(
                    f"warmup_requests[{index}] is a PredictionLog with no predict_log, classify_log or regress_log."
                )
            log.MergeFromString(request.SerializeToString())  # a real TF message works too: same bytes
        elif kind in _LOGS and request.DESCRIPTOR.full_name == f"tensorflow.serving.{kind}":
            getattr(log, _LOGS[kind]).request.MergeFromString(request.SerializeToString())
        else:
            raise TypeError(
                f"warmup_requests[{index}] is a {type(request).__name__}; give a dict {{input name: "
                "array}} (a predict request for serving_default) or a PredictRequest, "
                "ClassificationRequest, RegressionRequest or PredictionLog message."
            )
        records.append(log.SerializeToString())
    return records


def _predict_request(inputs: Mapping[str, Any], signatures: Mapping[str, Mapping[str, Any]], index: int) -> Any:
    from torchestimator.serving.protos import serving_protos
    from torchestimator.serving.tensor_proto import make_tensor_proto

    if DEFAULT_SERVING_SIGNATURE_DEF_KEY not in signatures:
        raise ValueError(
            f"warmup_requests[{index}] is a dict of inputs for the {DEFAULT_SERVING_SIGNATURE_DEF_KEY!r} "
            f"signature, which this export lacks (it has {sorted(signatures)}); give a PredictRequest "
            "naming its signature instead."
        )
    expected = signatures[DEFAULT_SERVING_SIGNATURE_DEF_KEY]["inputs"]
    # A classify/regress serving_default calls its one string input "inputs" (TF's name); the receiver's name,
    # which the user built it with, is taken too and written under the signature's.
    inputs = dict(inputs)
    for name, info in expected.items():
        receiver_input = info.get("receiver_input")
        if receiver_input in inputs and name not in inputs and receiver_input not in expected:
            inputs[name] = inputs.pop(receiver_input)
    if set(inputs) != set(expected):
        raise ValueError(
            f"warmup_requests[{index}] has inputs {sorted(inputs)}; the {DEFAULT_SERVING_SIGNATURE_DEF_KEY!r} "
            f"signature takes {sorted(expected)}."
        )
    request = serving_protos().PredictRequest()
    request.model_spec.signature_name = DEFAULT_SERVING_SIGNATURE_DEF_KEY
    for name, value in inputs.items():
        dtype = expected[name]["dtype"]
        if dtype == "string":
            request.inputs[name].CopyFrom(make_tensor_proto(value, dtype="DT_STRING"))
            continue
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if dtype != "bfloat16":
            try:
                array = array.astype(np.dtype(dtype), copy=False)
            except (TypeError, ValueError) as error:
                raise ValueError(f"warmup_requests[{index}][{name!r}] cannot be {dtype}: {error}") from None
        request.inputs[name].CopyFrom(make_tensor_proto(array, tensor_content=True))  # as tf.make_tensor_proto
    return request


def write_warmup_file(
    version_folder: str | os.PathLike[str], requests: Sequence[Any], signatures: Mapping[str, Mapping[str, Any]]
) -> str:
    """Writes ``<version_folder>/assets.extra/tf_serving_warmup_requests``; returns its path."""
    records = warmup_records(requests, signatures)
    folder = os.path.join(os.fspath(version_folder), "assets.extra")
    path = os.path.join(folder, WARMUP_FILE)
    if os.path.exists(path):
        raise ValueError(
            f"assets_extra already holds {WARMUP_FILE}; give the warm-up requests either as "
            "warmup_requests or as that asset, not both."
        )
    os.makedirs(folder, exist_ok=True)
    with TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as written:  # durable before the version folder is renamed into place
        os.fsync(written.fileno())
    return path
