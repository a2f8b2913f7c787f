"""TF Serving's warm-up file: export_saved_model(warmup_requests=...) writes it, a ModelManager replays it before a
version serves (--enable_model_warmup), a bad file or failing request fails that version's load naming file and
record, and a file written by real TensorFlow (tests/fixtures/tf_warmup, tools/make_tf_warmup_fixture.py) replays."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from helpers import FIXTURES, make_estimator
from test_serving_grpc import HalfPlusThree, model_fn

import torchestimator as te
from torchestimator.data import TFRecordWriter, read_records
from torchestimator.errors import ExportFormatError
from torchestimator.export import TensorSpec, export_saved_model, serving_input_receiver
from torchestimator.export.warmup import MAX_WARMUP_RECORDS, WARMUP_FILE, warmup_records
from torchestimator.serving import ModelManager
from torchestimator.serving.protos import serving_protos
from torchestimator.serving.tensor_proto import make_tensor_proto, tensor_proto_to_numpy
from torchestimator.serving.warmup import replay_warmup, warmup_path

TF_FIXTURE = str(FIXTURES / "tf_warmup" / WARMUP_FILE)
protos = serving_protos()


@pytest.fixture(scope="module")
def estimator(tmp_path_factory):
    root = tmp_path_factory.mktemp("warmup")
    x = np.arange(8, dtype=np.float32)
    train = te.numpy_input_fn({"x": x}, 0.5 * x + 3, batch_size=4, num_epochs=None, shuffle=False)
    estimator = make_estimator(
        root / "model",
        model=HalfPlusThree,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.0),
        model_fn=model_fn,
    )
    estimator.train(train, max_steps=1)
    return estimator


RECEIVER = serving_input_receiver(
    {"x": TensorSpec(shape=(None, 1)), "shift": TensorSpec(shape=(None,), dtype=torch.int64)},
    receiver_fn=lambda tensors: {"x": tensors["x"][:, 0] + tensors["shift"].to(torch.float32)},
)


def classify_request():
    request = protos.ClassificationRequest()
    request.model_spec.signature_name = "tensorflow/serving/classify"
    request.input.example_list.examples.append(te.data.encode_example({"x": [1.0], "shift": [0]}))
    return request


@pytest.fixture(scope="module")
def exported(estimator, tmp_path_factory):
    """An export with two warm-up requests: a dict of arrays (-> PredictRequest) and a ClassificationRequest."""
    return export_saved_model(
        estimator,
        tmp_path_factory.mktemp("exports"),
        RECEIVER,
        warmup_requests=[{"x": np.array([[1.0]]), "shift": [2]}, classify_request()],
    )


def a_version(exported, tmp_path, records=None):
    """A copy of the export as version 1 under a fresh base, its warm-up file replaced by ``records``."""
    version = tmp_path / "base" / "1"
    shutil.copytree(exported, version)
    if records is not None:
        with TFRecordWriter(warmup_path(version)) as writer:
            for record in records:
                writer.write(record)
    return tmp_path / "base", version


def test_the_export_writes_prediction_logs_tf_serving_reads(exported):
    records = list(read_records(warmup_path(exported)))
    logs = [protos.PredictionLog.FromString(record) for record in records]
    assert [log.WhichOneof("log_type") for log in logs] == ["predict_log", "classify_log"]
    request = logs[0].predict_log.request
    assert request.model_spec.signature_name == "serving_default"
    assert request.inputs["x"].tensor_content  # as tf.make_tensor_proto writes numeric arrays
    assert tensor_proto_to_numpy(request.inputs["x"]).tolist() == [[1.0]]  # float64 given, float32 written
    assert tensor_proto_to_numpy(request.inputs["shift"]).dtype == np.int64


def test_a_manager_replays_the_file_before_the_version_serves(exported, tmp_path, caplog):
    base, version = a_version(exported, tmp_path)
    manager = ModelManager("half", base)
    with caplog.at_level("INFO", logger="torchestimator.serving.manager"):
        assert manager.poll()
    assert "version 1 replayed 2 warm-up request(s)" in caplog.text
    assert replay_warmup(manager.get(1), version) == 2


def test_a_tensorflow_written_warmup_file_replays(exported, tmp_path):
    base, version = a_version(exported, tmp_path, records=list(read_records(TF_FIXTURE)))
    assert replay_warmup(ModelManager("half", base, loader=te.export.load)._loader(str(version)), version) == 2


def failing_predict():
    request = protos.PredictRequest()
    request.inputs["x"].CopyFrom(make_tensor_proto(np.ones((1, 1), np.float32)))
    return protos.PredictionLog(predict_log=protos.PredictLog(request=request)).SerializeToString()


@pytest.mark.parametrize(
    "records, words",
    [
        ([b"\x0a\x05garbage"], "record 0 is not a valid serialized PredictionLog"),
        ([protos.PredictionLog().SerializeToString()], "warm-up record 0 failed: it holds no predict_log"),
        (
            lambda: [
                protos.PredictionLog(classify_log=protos.ClassifyLog(request=classify_request())).SerializeToString(),
                failing_predict(),
            ],
            "warm-up record 1 failed: input size does not match signature: 1!=2",
        ),
        (
            lambda: [failing_predict()] * (MAX_WARMUP_RECORDS + 1),
            f"Number of warmup records exceeds the maximum ({MAX_WARMUP_RECORDS})",
        ),
    ],
)
def test_a_bad_file_or_failing_request_fails_the_load_naming_file_and_record(exported, tmp_path, records, words):
    base, version = a_version(exported, tmp_path, records=records() if callable(records) else records)
    manager = ModelManager("half", base)
    assert not manager.poll() and manager.served_versions == []
    [status] = manager.statuses()
    assert status.state == "END" and status.error_code == "INVALID_ARGUMENT"
    assert words in status.error_message and WARMUP_FILE in status.error_message
    with pytest.raises(ExportFormatError, match=str(warmup_path(version)).replace("\\", "\\\\")):
        replay_warmup(manager._loader(str(version)), version)
    # warm-up off (--enable_model_warmup=false): the same version serves
    assert ModelManager("half", base, model_warmup=False).poll()


def test_a_damaged_tfrecord_is_a_warmup_error(exported, tmp_path):
    _base, version = a_version(exported, tmp_path)
    data = bytearray(open(warmup_path(version), "rb").read())
    data[20] ^= 0xFF
    open(warmup_path(version), "wb").write(bytes(data))
    with pytest.raises(ExportFormatError, match="is not a readable TFRecord file"):
        replay_warmup(te.export.load(version), version)


def test_the_writer_refuses_what_it_cannot_write():
    signatures = {"serving_default": {"inputs": {"x": {"dtype": "float32", "shape": [-1, 1]}}}}
    with pytest.raises(
        ValueError,
        match=r"warmup_requests\[0\] has inputs \['y'\]; the 'serving_default' "
        r"signature takes \['x'\]",
    ):
        warmup_records([{"y": [[1.0]]}], signatures)
    with pytest.raises(TypeError, match=r"warmup_requests\[1\] is a str"):
        warmup_records([{"x": [[1.0]]}, "x"], signatures)
    with pytest.raises(ValueError, match="TF Serving replays at most 1000"):
        warmup_records([{"x": [[1.0]]}] * 1001, signatures)
    with pytest.raises(ValueError, match="warmup_requests is empty"):
        warmup_records([], signatures)
    with pytest.raises(ValueError, match="no predict_log, classify_log or regress_log"):
        warmup_records([protos.PredictionLog()], signatures)


def test_serve_takes_enable_model_warmup_as_tf_does(tmp_path, monkeypatch, capsys):
    import torchestimator.serving as serving
    from torchestimator.cli import main

    received = []
    monkeypatch.setattr(serving, "serve", lambda *arguments, **settings: received.append(settings))
    base = ["serve", "--model_name", "m", "--model_base_path", str(tmp_path)]
    for flags in ([], ["--enable_model_warmup"], ["--enable_model_warmup=false"], ["--enable_model_warmup", "true"]):
        assert main(base + flags) == 0
    assert [settings["enable_model_warmup"] for settings in received] == [True, True, False, True]
    assert [settings["grpc_port"] for settings in received] == [None] * 4  # --port 0 (the default): no gRPC
    with pytest.raises(SystemExit):
        main(base + ["--enable_model_warmup=maybe"])
    assert "expected true or false; received 'maybe'" in capsys.readouterr().err
