"""Replaying a version's warm-up file before it takes traffic, as TF Serving's --enable_model_warmup does.

    replay_warmup(model, "/models/digits/1796137644")   # -> records replayed (0 when the file is absent)

The file is ``assets.extra/tf_serving_warmup_requests``: a TFRecord of
PredictionLog records, written by ``export_saved_model(..., warmup_requests=...)``
(export/warmup.py) or by TensorFlow's own tools. Each record's request
(predict_log, classify_log or regress_log) is checked and run exactly as the
gRPC API runs it (grpc_requests.py), its outputs encoded too, so a version
that would fail its first requests fails its load instead.

As TF Serving (servables/tensorflow/saved_model_warmup_util.cc; it counts as it
runs, here the records are counted before any runs, so an oversized file fails
without running 1000 requests first): more than 1000 records, a record that is not a PredictionLog, a log kind not supported
(multi_inference_log, session_run_log, ...) or a failing request fails the
version's load with an ExportFormatError (an export's file refused; a
ValueError, so the status says INVALID_ARGUMENT): ModelManager marks it END with this error, which names the
file and the record (0-based), and keeps serving what it served. What does not
belong here: when a version loads (manager.py).
"""

from __future__ import annotations

import os
from typing import Any

from torchestimator._io import protobuf as _protobuf
from torchestimator.data.tfrecord import iter_records
from torchestimator.errors import DataLossError, ExportFormatError
from torchestimator.export.warmup import MAX_WARMUP_RECORDS, WARMUP_FILE
from torchestimator.serving import grpc_requests
from torchestimator.serving.errors import ServingError
from torchestimator.serving.protos import serving_protos

__all__ = ["replay_warmup", "warmup_path"]


def warmup_path(version_path: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(version_path), "assets.extra", WARMUP_FILE)


def replay_warmup(model: Any, version_path: str | os.PathLike[str]) -> int:
    """Runs every request of the version's warm-up file through ``model``; returns how many (0: no file).

    ExportFormatError naming the file (and the record) when the file or one of its requests fails.
    """
    path = warmup_path(version_path)
    if not os.path.isfile(path):
        return 0
    protos = serving_protos()
    records: list[bytes] = []
    try:  # counted before any runs: a file over the limit fails at once, as a whole
        for _, record in iter_records(path):
            if len(records) == MAX_WARMUP_RECORDS:
                raise ExportFormatError(
                    f"Number of warmup records exceeds the maximum ({MAX_WARMUP_RECORDS}) at {path}."
                )
            records.append(bytes(record))
    except DataLossError as error:
        raise ExportFormatError(f"{path} is not a readable TFRecord file: {error}") from None
    for index, record in enumerate(records):
        try:
            log = _protobuf.parse_binary(protos.PredictionLog, record)
        except _protobuf.MessageDecodeError as error:
            raise ExportFormatError(f"{path}: record {index} is {error}.") from None
        try:
            _replay(model, log)
        except (ServingError, ValueError, TypeError, RuntimeError) as error:
            reason = error.message if isinstance(error, ServingError) else str(error)
            raise ExportFormatError(f"{path}: warm-up record {index} failed: {reason}") from None
    return len(records)


def _replay(model: Any, log: Any) -> None:
    kind = log.WhichOneof("log_type")
    if kind == "predict_log":
        parsed = grpc_requests.parse_predict(log.predict_log.request.SerializeToString(), model, "", 0)
    elif kind in ("classify_log", "regress_log"):
        method = "classify" if kind == "classify_log" else "regress"
        parsed = grpc_requests.parse_examples(getattr(log, kind).request.SerializeToString(), model, "", 0, method)
    else:
        raise ExportFormatError(
            "it holds no predict_log, classify_log or regress_log (the log kinds replayed here; "
            "multi_inference_log and session_run_log are not supported)"
        )
    if parsed.output_keys is None:
        outputs = model(parsed.inputs, signature_name=parsed.signature_name)
    else:
        outputs = model(parsed.inputs, signature_name=parsed.signature_name, output_keys=parsed.output_keys)
    parsed.encode(outputs)
