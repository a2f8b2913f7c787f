"""torchestimator.serving: TF Serving's REST API over exported versions, hot reload, bad input as 4xx JSON."""

from __future__ import annotations

import base64
import shutil

import numpy as np
import pytest
import torch
from helpers import call_app, exporting_model_fn, trained_classifier, wait_until

from torchestimator.export import PredictOutput, TensorSpec, export_saved_model, load, serving_input_receiver
from torchestimator.serving import ModelManager, ServingError, make_app

X_ONLY = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
# Two inputs: the second shifts the first, so both reach the program.
X_AND_SHIFT = serving_input_receiver(
    {"x": TensorSpec(shape=(None, 8)), "shift": TensorSpec(shape=(None, 1))},
    receiver_fn=lambda tensors: {"x": tensors["x"] + tensors["shift"]},
)


model_fn = exporting_model_fn(
    lambda logits, predictions: {"probabilities": PredictOutput({"probabilities": predictions["probabilities"]})}
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A single-input and a two-input export of one small trained classifier."""
    root = tmp_path_factory.mktemp("serving")
    estimator, x = trained_classifier(root / "model", model_fn, steps=5)
    single = export_saved_model(estimator, root / "single", X_ONLY)
    pair = export_saved_model(estimator, root / "pair", X_AND_SHIFT)
    return {"single": single, "pair": pair, "x": x[:4], "root": root}


@pytest.fixture(scope="module")
def managers(exported):
    single, pair = ModelManager("mlp", exported["root"] / "single"), ModelManager("pair", exported["root"] / "pair")
    assert single.poll() and pair.poll()
    return [single, pair]


def call(app, *requests):
    """Sends (method, path, body) requests to the app; returns [(status, json body, content type)]."""
    return call_app(app, *requests)


def one(app, method, path, body=None):
    return call(app, (method, path, body))[0][:2]


def version_of(path) -> str:
    return str(load(path).version)


# -- status and metadata --------------------------------------------------------------


def test_status_is_shaped_like_tf_serving(exported, managers):
    app = make_app(managers)
    version = version_of(exported["single"])
    expected = {
        "model_version_status": [
            {"version": version, "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    (status, body, content_type), (status_v, body_v, _), (status_case, body_case, _) = call(
        app,
        ("GET", "/v1/models/mlp", None),
        ("GET", f"/v1/models/mlp/versions/{version}", None),
        ("GET", "/V1/Models/mlp", None),
    )
    assert (status, body, content_type) == (200, expected, "application/json")
    assert (status_v, body_v) == (200, expected)
    assert (status_case, body_case) == (200, expected)  # TF's path regexes are case-insensitive


def test_metadata_lists_signature_defs_with_tf_dtypes_and_shapes(exported, managers):
    status, body = one(make_app(managers), "GET", "/v1/models/pair/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": "pair", "signature_name": "", "version": version_of(exported["pair"])}
    definitions = body["metadata"]["signature_def"]["signature_def"]
    assert sorted(definitions) == ["probabilities", "serving_default"]
    default = definitions["serving_default"]
    assert default["method_name"] == "tensorflow/serving/predict"
    assert default["inputs"]["x"] == {
        "dtype": "DT_FLOAT",
        "name": "x",
        "tensor_shape": {"dim": [{"size": "-1", "name": ""}, {"size": "8", "name": ""}], "unknown_rank": False},
    }
    assert set(default["inputs"]) == {"x", "shift"}
    assert default["outputs"]["class"]["dtype"] == "DT_INT64"
    assert [dim["size"] for dim in default["outputs"]["probabilities"]["tensor_shape"]["dim"]] == ["-1", "3"]


# -- predict ---------------------------------------------------------------------------


def test_row_and_columnar_predict_equal_the_loaded_model(exported, managers):
    x = exported["x"]
    expected = load(exported["single"])({"x": x})
    version = version_of(exported["single"])
    (row_status, row, _), (column_status, column, _), (named_status, named, _), (one_status, single, _) = call(
        make_app(managers),
        ("POST", "/v1/models/mlp:predict", {"instances": x.tolist()}),
        ("POST", f"/v1/models/mlp/versions/{version}:predict", {"inputs": {"x": x.tolist()}}),
        ("POST", "/v1/models/mlp:predict", {"instances": [{"x": row} for row in x.tolist()]}),
        ("POST", "/v1/models/mlp:predict", {"signature_name": "probabilities", "inputs": x.tolist()}),
    )
    assert row_status == column_status == named_status == one_status == 200
    assert [entry["class"] for entry in row["predictions"]] == expected["class"].tolist()
    np.testing.assert_allclose(
        [entry["probabilities"] for entry in row["predictions"]], expected["probabilities"], rtol=1e-6
    )
    assert named == row
    assert column["outputs"]["class"] == expected["class"].tolist()
    np.testing.assert_allclose(column["outputs"]["probabilities"], expected["probabilities"], rtol=1e-6)
    np.testing.assert_allclose(single["outputs"], expected["probabilities"], rtol=1e-6)  # one output: bare value


def test_two_input_predict_in_both_formats(exported, managers):
    x = exported["x"]
    shift = np.full((len(x), 1), 0.5, dtype=np.float32)
    expected = load(exported["pair"])({"x": x, "shift": shift})
    instances = [{"x": row, "shift": [0.5]} for row in x.tolist()]
    (row_status, row, _), (column_status, column, _) = call(
        make_app(managers),
        ("POST", "/v1/models/pair:predict", {"signature_name": "probabilities", "instances": instances}),
        ("POST", "/v1/models/pair:predict", {"inputs": {"x": x.tolist(), "shift": shift.tolist()}}),
    )
    assert row_status == column_status == 200
    np.testing.assert_allclose(row["predictions"], expected["probabilities"], rtol=1e-6)  # one output: bare rows
    assert column["outputs"]["class"] == expected["class"].tolist()


BAD_REQUESTS = [
    # (method, path, body, status, words the error must contain)
    ("POST", "/v1/models/mlp:predict", b"{not json", 400, ["JSON Parse error", "Malformed JSON"]),
    ("POST", "/v1/models/mlp:predict", b"\xff\xfe", 400, ["Malformed JSON"]),
    ("POST", "/v1/models/mlp:predict", [1, 2], 400, ["JSON object"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[0.0] * 8], "inputs": [[0.0] * 8]}, 400, ["only one of"]),
    ("POST", "/v1/models/mlp:predict", {"signature_name": "serving_default"}, 400, ["Missing 'inputs' or"]),
    ("POST", "/v1/models/mlp:predict", {"instances": []}, 400, ["non-empty list"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[0.0] * 8, [0.0] * 7]}, 400, ["'x'", "ragged", "float32"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[0.0] * 5]}, 400, ["'x'", "shape [1, 5]", "[-1, 8]"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [["a"] * 8]}, 400, ["'x'", "strings", "float32"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[None] * 8]}, 400, ["'x'", "null"]),
    ("POST", "/v1/models/mlp:predict", {"instances": [[True] * 8]}, 400, ["'x'", "booleans"]),
    ("POST", "/v1/models/mlp:predict", {"inputs": {"y": [[0.0] * 8]}}, 400, ["missing inputs ['x']", "['y']"]),
    ("POST", "/v1/models/mlp:predict", {"inputs": [[{"b64": "!!!"}] * 8]}, 400, ["'x'", "invalid base64"]),
    (
        "POST",
        "/v1/models/mlp:predict",
        {"inputs": [[{"b64": base64.b64encode(b"ab").decode()}] * 8]},
        400,
        ["'x'", "float32", "string inputs"],
    ),
    (
        "POST",
        "/v1/models/mlp:predict",
        {"signature_name": "nope", "inputs": [[0.0] * 8]},
        400,
        ['"nope" not found', "serving_default"],
    ),
    (
        "POST",
        "/v1/models/mlp:predict",
        {"signature_name": 3, "inputs": [[0.0] * 8]},
        400,
        ["key must be a string value"],
    ),
    ("POST", "/v1/models/pair:predict", {"instances": [[0.0] * 8]}, 400, ["2 inputs", "'shift'", "object"]),
    ("POST", "/v1/models/pair:predict", {"instances": [{"x": [0.0] * 8}]}, 400, ["missing inputs ['shift']"]),
    ("POST", "/v1/models/pair:predict", {"inputs": {"x": [[0.0] * 8] * 2, "shift": [[0.0]] * 3}}, 400, ["batch size"]),
    ("POST", "/v1/models/ghost:predict", {"inputs": [[0.0] * 8]}, 404, ["Servable not found", "Latest(ghost)"]),
    ("POST", "/v1/models/mlp/versions/1:predict", {"inputs": [[0.0] * 8]}, 404, ["Specific(mlp, 1)"]),
    ("POST", "/v1/models/mlp:predict", {"inputs": [[1e39] * 8]}, 400, ["'x'", "without loss of precision"]),
    (
        "POST",
        "/v1/models/mlp/labels/stable:predict",
        {"inputs": [[0.0] * 8]},
        400,
        ["Unrecognized servable version label: stable"],
    ),
    ("GET", "/v1/models/ghost", None, 404, ["ghost"]),
    ("GET", "/v1/models/mlp/versions/1", None, 404, ["version 1 of model mlp"]),
    ("GET", "/v1/models/ghost/metadata", None, 404, ["Servable not found"]),
    ("GET", "/v1/models", None, 400, ["Missing model name"]),
    ("GET", "/v1/models/mlp/extra/path", None, 400, ["Malformed request: GET"]),
    ("GET", "/v1/models/mlp:predict", None, 405, ["use POST"]),
    ("POST", "/v1/models/mlp", {}, 405, ["use GET"]),
]


@pytest.mark.parametrize(
    "method, path, body, expected_status, words",
    BAD_REQUESTS,
    ids=[f"{case[0]} {case[1]} {str(case[2])[:40]}" for case in BAD_REQUESTS],
)
def test_bad_requests_get_a_4xx_json_error_naming_the_problem(managers, method, path, body, expected_status, words):
    status, answer = one(make_app(managers), method, path, body)
    assert status == expected_status, answer
    assert list(answer) == ["error"]
    for word in words:
        assert word in answer["error"], (word, answer["error"])


def test_oversized_body_is_413_and_the_server_keeps_answering(managers):
    app = make_app(managers, max_body_bytes=1000)
    big = {"instances": [[0.0] * 8] * 200}
    (status, answer, _), (after, body, _) = call(
        app, ("POST", "/v1/models/mlp:predict", big), ("POST", "/v1/models/mlp:predict", {"instances": [[0.0] * 8]})
    )
    assert status == 413 and "limit of 1000 bytes" in answer["error"]
    assert after == 200 and len(body["predictions"]) == 1


def test_serving_error_maps_tf_codes_to_http():
    assert ServingError("RESOURCE_EXHAUSTED", "queue full").http_status == 429
    assert ServingError("NOT_FOUND", "x").http_status == 404
    with pytest.raises(ValueError, match="Unknown status code 'NOPE'"):
        ServingError("NOPE", "x")


def test_make_app_refuses_bad_arguments(managers):
    with pytest.raises(TypeError, match="ModelManager"):
        make_app([])
    with pytest.raises(ValueError, match="unique"):
        make_app([managers[0], ModelManager("mlp", "elsewhere")])
    with pytest.raises(ValueError, match="max_body_bytes"):
        make_app(managers, max_body_bytes=0)


# -- versions and hot reload ----------------------------------------------------------


def test_poll_ignores_temp_and_non_integer_folders_and_picks_up_a_new_version(exported, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(exported["single"], base / "1")
    for leftover in ("temp-99999", "latest"):
        shutil.copytree(exported["single"], base / leftover)
    manager = ModelManager("mlp", base)
    assert manager.poll() and manager.served_version == 1
    assert not manager.poll()  # nothing new
    app = make_app(manager)
    shutil.copytree(exported["single"], base / "2")
    assert manager.poll() and manager.served_version == 2
    (status, body, _), (predict_status, predicted, _), (old_status, _, _) = call(
        app,
        ("GET", "/v1/models/mlp", None),
        ("POST", "/v1/models/mlp:predict", {"instances": [[0.0] * 8]}),
        ("POST", "/v1/models/mlp/versions/1:predict", {"instances": [[0.0] * 8]}),
    )
    assert status == 200 and [(entry["version"], entry["state"]) for entry in body["model_version_status"]] == [
        ("1", "END"),
        ("2", "AVAILABLE"),
    ]
    assert predict_status == 200 and len(predicted["predictions"]) == 1
    assert old_status == 404  # the old version was unloaded


def test_a_broken_version_does_not_replace_the_working_one_and_its_error_shows(exported, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(exported["single"], base / "1")
    manager = ModelManager("mlp", base)
    assert manager.poll()
    shutil.copytree(exported["single"], base / "5")
    (base / "5" / "program.json").write_bytes(b"not a JSON document")
    assert not manager.poll() and manager.served_version == 1
    assert not manager.poll()  # unchanged files are not retried on every poll
    (_status, body, _), (predict_status, _, _) = call(
        make_app(manager),
        ("GET", "/v1/models/mlp", None),
        ("POST", "/v1/models/mlp:predict", {"instances": [[0.0] * 8]}),
    )
    entries = {entry["version"]: entry for entry in body["model_version_status"]}
    assert entries["1"]["state"] == "AVAILABLE"
    assert entries["5"]["state"] == "END" and entries["5"]["status"]["error_code"] != "OK"
    assert "Failed to load version 5" in entries["5"]["status"]["error_message"]
    assert predict_status == 200
    shutil.copyfile(exported["single"] + "/program.json", base / "5" / "program.json")  # repaired: retried
    assert manager.poll() and manager.served_version == 5


def test_a_non_export_folder_or_symlink_under_the_base_shows_a_short_status_without_its_file_names(exported, tmp_path):
    base, outside = tmp_path / "base", tmp_path / "outside"
    shutil.copytree(exported["single"], base / "1")
    outside.mkdir()
    for index in range(30):  # the loader once listed up to 20 of these names in the status
        (outside / f"private-{index:02d}-{'x' * 60}.txt").write_text("not an export")
    shutil.copytree(outside, base / "2")
    manager = ModelManager("mlp", base)
    assert manager.poll() is False and manager.served_versions == []  # latest = 2, which fails
    (base / "3").symlink_to(outside, target_is_directory=True)
    manager.poll()
    ((status, body, _),) = call(make_app(manager), ("GET", "/v1/models/mlp", None))
    assert status == 200
    failed = {entry["version"]: entry["status"] for entry in body["model_version_status"]}
    assert set(failed) == {"2", "3"}
    for version, entry in failed.items():
        message = entry["error_message"]
        assert entry["error_code"] != "OK" and f"Failed to load version {version}" in message
        assert "private-" not in message, message
        assert len(message) <= 1000 and "export_saved_model" in message, message


def test_a_load_error_of_any_length_is_cut_in_the_status(tmp_path):
    (tmp_path / "base" / "1").mkdir(parents=True)

    def loader(path):
        raise ValueError("reason " * 10_000)

    manager = ModelManager("mlp", tmp_path / "base", loader=loader)
    manager.poll()
    message = manager.statuses()[0].error_message
    assert message.startswith("Failed to load version 1 of model mlp") and "reason reason" in message
    assert len(message) <= 1000 and "export_saved_model" in message


def test_no_version_yet_means_404_and_an_empty_manager_is_not_found(tmp_path):
    manager = ModelManager("mlp", tmp_path / "missing")
    assert not manager.poll() and manager.get() is None
    status, answer = one(make_app(manager), "GET", "/v1/models/mlp")
    assert status == 404 and "Could not find any versions of model mlp" in answer["error"]
    with pytest.raises(ValueError, match="without '/' or ':'"):
        ModelManager("a:b", tmp_path)


@pytest.mark.slow
def test_serve_command_answers_tf_serving_clients(exported):
    """`torchestimator serve` in its own process: status and predict over real HTTP."""
    import json
    import socket
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchestimator.cli",
            "serve",
            "--model_name",
            "m",
            "--model_base_path",
            str(exported["root"] / "single"),
            "--rest_api_port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def model_status():
        assert server.poll() is None, f"the server exited: {server.stderr.read()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/m", timeout=2) as response:
                return json.load(response)
        except OSError:  # not listening yet
            return None

    try:
        status = wait_until(model_status, timeout=120, what="the server answering its status page")
        assert status["model_version_status"][0]["state"] == "AVAILABLE"
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/models/m:predict",
            method="POST",
            data=json.dumps({"instances": exported["x"][:2].tolist()}).encode(),
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert len(json.load(response)["predictions"]) == 2
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_numbers_beyond_an_input_dtype_are_refused_not_wrapped():
    """A cast would turn 2**41 into 0 for an int32 input, or -1 into 255 for uint8: refused, naming the value."""
    from torchestimator.export import Signature, TensorInfo
    from torchestimator.serving.json_tensor import parse_predict

    class OneInput:
        signature_names = ["serving_default"]

        def __init__(self, dtype):
            self.info = TensorInfo(dtype=dtype, shape=(-1,))

        def signature(self, name):
            return Signature(
                name=name,
                method="predict",
                method_name="tensorflow/serving/predict",
                inputs={"ids": self.info},
                outputs={},
                program_outputs={},
            )

    parsed = parse_predict({"instances": [1, -2, 2**31 - 1]}, OneInput("int32"))
    assert parsed.inputs["ids"].dtype == torch.int32 and parsed.inputs["ids"].tolist() == [1, -2, 2**31 - 1]
    with pytest.raises(ServingError, match=r"2199023255552 in input 'ids' to int32 without loss of precision"):
        parse_predict({"instances": [1, 2**41]}, OneInput("int32"))
    with pytest.raises(ServingError, match=r"-1 in input 'ids' to uint8"):
        parse_predict({"inputs": [-1, 3]}, OneInput("uint8"))
    assert parse_predict({"inputs": [0, 255]}, OneInput("uint8")).inputs["ids"].tolist() == [0, 255]
