"""Serving from an object store: a base path s3://... is polled like a folder; a version is served only once
complete (metadata.json uploaded last) and verified in the local cache; an incomplete, damaged or unreachable
one leaves the old version serving. Against moto's S3 server (tests/object_stores.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import input_fns, make_estimator, wait_until
from object_stores import upload_version

from torchestimator._io import filesystems
from torchestimator.errors import ConfigError
from torchestimator.export import TensorSpec, _store_versions, export_saved_model, load, serving_input_receiver
from torchestimator.serving import Client, ModelManager, start
from torchestimator.serving.config import ModelConfig

RECEIVER = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Two local exports of one classifier at different steps (distinct answers), and inputs."""
    root = tmp_path_factory.mktemp("store_serving")
    train, _, _, (x, _) = input_fns(n=64)
    estimator = make_estimator(root / "model")
    folders, expected = {}, {}
    for name, steps in (("old", 3), ("new", 9)):
        estimator.train(train, max_steps=steps)
        folders[name] = export_saved_model(estimator, root / name, RECEIVER)
        expected[name] = load(folders[name])({"x": x[:3]})["probabilities"]
    assert not np.allclose(expected["old"], expected["new"])
    return {"folders": folders, "expected": expected, "x": x[:3]}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHESTIMATOR_CACHE", str(tmp_path / "cache"))  # child processes inherit it
    return tmp_path / "cache"


upload = upload_version  # tests/object_stores.py


def answers(manager: ModelManager, exports) -> str:
    predicted = manager.get()({"x": exports["x"]})["probabilities"]
    return next(name for name, value in exports["expected"].items() if np.allclose(predicted, value))


def problems(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def test_an_incomplete_version_is_waited_for_silently_then_served(exports, s3_bucket, caplog, _cache):
    base = f"{s3_bucket}/models/m"
    upload(exports["folders"]["old"], f"{base}/100")
    manager = ModelManager("m", base)
    assert manager.poll() and manager.served_versions == [100] and answers(manager, exports) == "old"
    assert os.path.isdir(_store_versions.cache_folder(f"{base}/100"))
    caplog.set_level(logging.INFO, logger="torchestimator")
    upload(exports["folders"]["new"], f"{base}/200", metadata=False)
    for _ in range(2):
        assert not manager.poll()
    assert manager.served_versions == [100] and answers(manager, exports) == "old" and problems(caplog) == []
    filesystems.write_bytes(
        f"{base}/200/metadata.json", open(os.path.join(exports["folders"]["new"], "metadata.json"), "rb").read()
    )
    assert manager.poll() and manager.served_versions == [200] and answers(manager, exports) == "new"
    assert not os.path.exists(_store_versions.cache_folder(f"{base}/100"))  # unloaded: its copy goes too


def test_a_damaged_version_is_refused_once_and_the_old_one_keeps_serving(exports, s3_bucket, caplog):
    base = f"{s3_bucket}/models/m"
    upload(exports["folders"]["old"], f"{base}/100")
    manager = ModelManager("m", base)
    manager.poll()
    caplog.set_level(logging.INFO, logger="torchestimator")
    upload(exports["folders"]["new"], f"{base}/300", damage="tensors.safetensors")
    for _ in range(3):
        assert not manager.poll()
    assert manager.served_versions == [100] and answers(manager, exports) == "old"
    [status] = manager.statuses(300)
    assert status.state == "END" and status.error_code == "INVALID_ARGUMENT"
    assert f"{base}/300/tensors.safetensors does not match" in status.error_message
    named = [message for message in problems(caplog) if f"{base}/300/tensors.safetensors" in message]
    assert len(named) == 1, problems(caplog)  # said once, not at every poll
    assert len([message for message in problems(caplog) if "keeping version(s) [100]" in message]) == 1
    upload(exports["folders"]["new"], f"{base}/300")  # repaired: its objects changed, so it is tried again
    assert manager.poll() and manager.served_versions == [300] and answers(manager, exports) == "new"


def test_an_unreachable_store_is_logged_once_and_the_served_version_answers(exports, s3_bucket, caplog, monkeypatch):
    base = f"{s3_bucket}/models/m"
    upload(exports["folders"]["old"], f"{base}/100")
    manager = ModelManager("m", base)
    manager.poll()
    caplog.set_level(logging.INFO, logger="torchestimator")
    listing = _store_versions._objects

    def unreachable(url):
        raise OSError(f"listing {url} failed: Could not connect to the endpoint URL")

    monkeypatch.setattr(_store_versions, "_objects", unreachable)
    for _ in range(3):
        assert not manager.poll()
    assert manager.served_versions == [100] and answers(manager, exports) == "old"
    said = [message for message in problems(caplog) if "could not reach" in message]
    assert len(said) == 1 and base in said[0] and "still serving version(s) [100]" in said[0]
    monkeypatch.setattr(_store_versions, "_objects", listing)
    upload(exports["folders"]["new"], f"{base}/200")
    assert manager.poll() and manager.served_versions == [200]
    assert any("answers again" in record.getMessage() for record in caplog.records)


def test_a_running_server_picks_up_a_new_complete_version(exports, s3_bucket, tmp_path):
    base = f"{s3_bucket}/models/m"
    upload(exports["folders"]["old"], f"{base}/100")
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "m" base_path: "{base}" }} }}')
    with start(model_config_file=str(config), file_system_poll_wait_seconds=0.05) as server:
        client = Client(server.url, "m")
        np.testing.assert_allclose(
            client.predict({"x": exports["x"]}, columnar=True)["probabilities"], exports["expected"]["old"], rtol=1e-6
        )
        upload(exports["folders"]["new"], f"{base}/200")
        wait_until(lambda: server.managers["m"].served_versions == [200], what="version 200 served")
        np.testing.assert_allclose(
            client.predict({"x": exports["x"]}, columnar=True)["probabilities"], exports["expected"]["new"], rtol=1e-6
        )


def test_a_base_path_of_a_scheme_we_do_not_read_is_refused():
    with pytest.raises(ConfigError, match="not hdfs://"):
        ModelConfig(name="m", base_path="hdfs://namenode/models/m")


def test_torchestimator_serve_answers_rest_from_s3(exports, s3_bucket):
    """A real `torchestimator serve` process, reaching the S3 server through AWS_ENDPOINT_URL as a user's would."""
    base = f"{s3_bucket}/models/m"
    upload(exports["folders"]["new"], f"{base}/5")
    command = [
        sys.executable,
        "-m",
        "torchestimator.cli",
        "serve",
        "--model_name",
        "m",
        "--model_base_path",
        base,
        "--rest_api_port",
        "0",
    ]
    server = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = server.stdout.readline()  # the announce line; "" if the server died first
        assert line.startswith("serving m (version 5 AVAILABLE) at http://127.0.0.1:"), line
        url = line.split(" at ", 1)[1].strip().rsplit("/v1/models/", 1)[0]
        predicted = Client(url, "m").predict({"x": exports["x"]}, columnar=True)["probabilities"]
        np.testing.assert_allclose(predicted, exports["expected"]["new"], rtol=1e-6)
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.mark.slow
def test_a_store_whose_endpoint_stops_answering_keeps_the_served_version(exports, s3_bucket, caplog, monkeypatch):
    """The endpoint itself gone (s3fs's own retries and error, a few seconds), not a patched listing."""
    from object_stores import forget_filesystems, free_port

    base = f"{s3_bucket}/models/m"
    upload(exports["folders"]["old"], f"{base}/100")
    manager = ModelManager("m", base)
    manager.poll()
    caplog.set_level(logging.INFO, logger="torchestimator")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    forget_filesystems()
    assert not manager.poll() and not manager.poll()
    assert manager.served_versions == [100] and answers(manager, exports) == "old"
    said = [message for message in problems(caplog) if "could not reach" in message]
    assert len(said) == 1 and "Could not connect to the endpoint URL" in said[0], problems(caplog)
