"""serve/start, the Python client, the CLI's flags, metrics and batching over real HTTP."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.request

import numpy as np
import pytest
import torch
from helpers import exporting_model_fn, trained_classifier, wait_until
from prometheus_client.parser import text_string_to_metric_families

from torchestimator.export import RegressionOutput, TensorSpec, export_saved_model, load, serving_input_receiver
from torchestimator.serving import (
    BatchingParameters,
    Client,
    ModelManager,
    ServerSettings,
    ServingClientError,
    make_app,
    start,
)

X_ONLY = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})


model_fn = exporting_model_fn(lambda logits, predictions: {"score": RegressionOutput(logits[:, 0])})


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Two model bases: 'a' with versions 1 and 2 (same weights), 'b' with version 7."""
    root = tmp_path_factory.mktemp("server")
    estimator, x = trained_classifier(root / "model", model_fn, steps=3)
    exported = export_saved_model(estimator, root / "export", X_ONLY)
    for base, versions in (("a", (1, 2)), ("b", (7,))):
        for version in versions:
            shutil.copytree(exported, root / base / str(version))
    return {"root": root, "x": x[:3], "expected": load(exported)({"x": x[:3]})}


def write(path, text):
    path.write_text(text)
    return str(path)


def test_start_serves_a_model_config_file_with_labels_and_the_client_reads_it(bases, tmp_path):
    config = write(
        tmp_path / "models.config",
        f"""
model_config_list {{
  config {{ name: "a" base_path: "{bases["root"] / "a"}" model_platform: "tensorflow"
           model_version_policy {{ all {{}} }} version_labels {{ key: "stable" value: 1 }}
           version_labels {{ key: "canary" value: 2 }} }}
  config {{ name: "b" base_path: "{bases["root"] / "b"}" }}
}}""",
    )
    with start(model_config_file=config, file_system_poll_wait_seconds=0) as server:
        assert sorted(server.managers) == ["a", "b"]
        states = Client(server.url, "a").status()["model_version_status"]
        assert [(entry["version"], entry["state"]) for entry in states] == [("1", "AVAILABLE"), ("2", "AVAILABLE")]
        canary = Client(server.url, "a", label="canary")
        assert canary.status()["model_version_status"][0]["version"] == "2"
        assert canary.metadata()["model_spec"]["version"] == "2"
        predictions = Client(server.url, "a", version=1).predict(bases["x"])
        assert [row["class"] for row in predictions] == bases["expected"]["class"].tolist()
        outputs = Client(server.url, "b").predict({"x": bases["x"]}, columnar=True)
        np.testing.assert_allclose(outputs["probabilities"], bases["expected"]["probabilities"], rtol=1e-6)
        scores = Client(server.url, "b").regress([{"x": row.tolist()} for row in bases["x"]], signature_name="score")
        assert len(scores) == 3 and all(isinstance(score, float) for score in scores)
        with pytest.raises(ServingClientError) as missing:
            Client(server.url, "nope").predict(bases["x"])
        assert missing.value.status == 404 and "Servable not found for request: Latest(nope)" in missing.value.message
        with pytest.raises(ServingClientError) as unknown_label:
            Client(server.url, "a", label="gold").status()
        assert unknown_label.value.status == 400 and "gold" in unknown_label.value.message


def test_a_label_on_a_version_that_is_not_loaded_refuses_to_start(bases, tmp_path):
    config = write(
        tmp_path / "models.config",
        f"""
model_config_list {{ config {{ name: "a" base_path: "{bases["root"] / "a"}"
                               version_labels {{ key: "stable" value: 1 }} }} }}""",
    )  # latest policy: only 2 loads
    with pytest.raises(ValueError, match="stable"):
        start(model_config_file=config, file_system_poll_wait_seconds=0)
    with start(
        model_config_file=config, file_system_poll_wait_seconds=0, allow_version_labels_for_unavailable_models=True
    ) as server:
        with pytest.raises(ServingClientError) as caught:
            Client(server.url, "a", label="stable").predict(bases["x"])
        assert caught.value.status == 404


def test_model_config_file_changes_are_picked_up_while_serving(bases, tmp_path, te_logs):
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "a" base_path: "{bases["root"] / "a"}" }} }}')
    with start(
        model_config_file=str(config), model_config_file_poll_wait_seconds=0.1, file_system_poll_wait_seconds=0
    ) as server:
        config.write_text("this is not a config")  # a broken edit keeps the running models
        wait_until(lambda: "Keeping the current models" in te_logs.text, what="the poller reading the broken edit")
        assert sorted(server.managers) == ["a"]
        config.write_text(f'model_config_list {{ config {{ name: "b" base_path: "{bases["root"] / "b"}" }} }}')
        wait_until(lambda: sorted(server.managers) == ["b"], what="model 'b' replacing 'a'")
        assert Client(server.url, "b").status()["model_version_status"][0]["version"] == "7"
        with pytest.raises(ServingClientError) as gone:
            Client(server.url, "a").predict(bases["x"])
        assert gone.value.status == 404


def test_a_server_started_before_any_export_waits_and_serves_the_first_version(bases, tmp_path):
    base = tmp_path / "empty"
    with start("late", base, file_system_poll_wait_seconds=0.1) as server:
        with pytest.raises(ServingClientError) as nothing_yet:
            Client(server.url, "late").predict(bases["x"])
        assert nothing_yet.value.status == 404
        shutil.copytree(bases["root"] / "b" / "7", base / "3")
        wait_until(lambda: server.managers["late"].served_version == 3, what="version 3 being served")
        assert Client(server.url, "late").predict(bases["x"])[0]["class"] == bases["expected"]["class"][0]


def test_server_settings_refuse_ambiguous_or_missing_models(tmp_path):
    from torchestimator.errors import ConfigError

    with pytest.raises(ConfigError, match="either --model_config_file or --model_name") as both:
        ServerSettings(model_name="a", model_base_path=str(tmp_path), model_config_file=str(tmp_path / "c"))
    assert both.value.field == "model_config_file"
    with pytest.raises(ConfigError, match="Name the model to serve") as missing:
        ServerSettings(model_name="a")
    assert missing.value.field == "model_base_path"
    with pytest.raises(ValueError, match="base_url"):
        Client("localhost:8501", "a")
    with pytest.raises(ValueError, match="not both"):
        Client("http://localhost:8501", "a", version=1, label="x")


def test_metrics_page_counts_requests_with_tf_servings_names(bases):
    with start("a", bases["root"] / "a", file_system_poll_wait_seconds=0) as server:
        client = Client(server.url, "a")
        client.predict(bases["x"])
        client.predict(bases["x"])
        with pytest.raises(ServingClientError):
            client.predict([[1.0]])
        with urllib.request.urlopen(server.url + "/monitoring/prometheus/metrics") as response:
            page = response.read().decode()
            assert response.headers["Content-Type"].startswith("text/plain")
    assert ":tensorflow:serving:request_count{" in page  # TF's exposition name (the parser adds _total)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
    }
    count = ":tensorflow:serving:request_count_total"
    assert samples[(count, (("model_name", "a"), ("status", "OK")))] == 2
    assert samples[(count, (("model_name", "a"), ("status", "INVALID_ARGUMENT")))] == 1, samples
    latency = [labels for name, labels in samples if name == ":tensorflow:serving:request_latency_count"]
    assert latency and dict(latency[0])["API"] == "Predict" and dict(latency[0])["model_name"] == "a"
    with start("a", bases["root"] / "a", file_system_poll_wait_seconds=0, metrics_path=None) as server:
        with pytest.raises(urllib.error.HTTPError) as off:
            urllib.request.urlopen(server.url + "/monitoring/prometheus/metrics")
        assert off.value.code == 404


class GatedModel:
    """A loaded model whose forward passes wait for a gate: queues fill and time out deterministically."""

    def __init__(self, model):
        self._model, self.gate, self.calls = model, threading.Event(), []
        self.signature_names, self.signature, self.prepare_inputs = (
            model.signature_names,
            model.signature,
            model.prepare_inputs,
        )
        self.version, self.path = model.version, model.path

    def __call__(self, inputs, signature_name="serving_default", output_keys=None):
        self.calls.append(len(next(iter(inputs.values()))))
        if not self.gate.wait(timeout=20):
            raise AssertionError("gate never opened")
        return self._model(inputs, signature_name=signature_name, output_keys=output_keys)


def gated_manager(base):
    holder = {}

    def loader(path):
        holder["model"] = GatedModel(load(path))
        holder["model"].gate.set()  # warm-up passes
        return holder["model"]

    manager = ModelManager("a", base, loader=loader)
    assert manager.poll()
    holder["model"].gate.clear()
    holder["model"].calls.clear()
    return manager, holder["model"]


def post_concurrently(url, bodies):
    """Sends the bodies at once from threads; returns [(status, json)] in order."""
    results = [None] * len(bodies)

    def send(index, body):
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                results[index] = (response.status, json.load(response))
        except urllib.error.HTTPError as error:
            results[index] = (error.code, json.load(error))

    threads = [threading.Thread(target=send, args=(index, body)) for index, body in enumerate(bodies)]
    for thread in threads:
        thread.start()
    return threads, results


def serve_app(app):
    from torchestimator.serving.server import RunningServer

    return RunningServer(app, "127.0.0.1", 0)


def test_batching_gathers_concurrent_requests_and_a_full_queue_answers_429(bases):
    manager, model = gated_manager(bases["root"] / "a")
    batching = BatchingParameters(max_batch_size=4, batch_timeout_micros=0, max_enqueued_batches=1, num_batch_threads=1)
    with serve_app(make_app(manager, batching=batching)) as server:
        url = server.url + "/v1/models/a:predict"
        first, first_results = post_concurrently(url, [{"instances": bases["x"][:1].tolist()}])
        wait_until(lambda: model.calls, what="the first request reaching the model")  # its thread waits at the gate
        rows = [{"instances": bases["x"][index : index + 1].tolist()} for index in range(3)]
        waiting, waiting_results = post_concurrently(url, rows + [{"instances": bases["x"][:2].tolist()}])
        # Five rows in four requests: in any order of arrival the first three fit the one open batch of four,
        # so the 429 answers the last to arrive, and once it is back all four are in.
        wait_until(
            lambda: any(result and result[0] == 429 for result in waiting_results),
            what="the request that overflows the batch being refused",
        )
        model.gate.set()
        for thread in first + waiting:
            thread.join(timeout=30)
    statuses = sorted(status for status, _ in first_results + waiting_results)
    assert statuses.count(200) >= 4 and 429 in statuses, (statuses, model.calls)
    refused = next(answer for status, answer in waiting_results if status == 429)
    assert "queue" in refused["error"] and "full" in refused["error"]
    assert max(model.calls) > 1  # waiting requests ran as one forward pass
    for (status, answer), body in zip(waiting_results, rows):
        if status == 200:
            assert answer["predictions"][0]["class"] == bases["expected"]["class"][rows.index(body)]


def test_a_request_slower_than_the_timeout_answers_504_and_the_server_goes_on(bases):
    manager, model = gated_manager(bases["root"] / "a")
    with serve_app(make_app(manager, timeout_seconds=0.3)) as server:
        url = server.url + "/v1/models/a:predict"
        threads, results = post_concurrently(url, [{"instances": bases["x"][:1].tolist()}])
        for thread in threads:
            thread.join(timeout=30)
        model.gate.set()
        assert results[0][0] == 504 and "did not finish within" in results[0][1]["error"]
        assert Client(server.url, "a").predict(bases["x"][:1])[0]["class"] == bases["expected"]["class"][0]


def test_cli_refuses_inconsistent_flags_with_a_clear_error(bases, tmp_path, capsys):
    from torchestimator.cli import main

    parameters = write(tmp_path / "batching.config", "max_batch_size { value: 8 }")
    base = str(bases["root"] / "a")
    assert (
        main(["serve", "--model_name", "a", "--model_base_path", base, "--batching_parameters_file", parameters]) == 2
    )
    assert "needs --enable_batching" in capsys.readouterr().err
    assert main(["serve", "--model_name", "a", "--model_base_path", "x", "--model_config_file", parameters]) == 2
    assert "not both" in capsys.readouterr().err
    broken = write(tmp_path / "broken.config", "max_batch_size { value: -1 }")
    assert (
        main(
            [
                "serve",
                "--model_name",
                "a",
                "--model_base_path",
                base,
                "--enable_batching",
                "--batching_parameters_file",
                broken,
            ]
        )
        == 2
    )
    assert "max_batch_size" in capsys.readouterr().err
    assert (
        main(
            [
                "serve",
                "--model_name",
                "a",
                "--model_base_path",
                base,
                "--monitoring_config_file",
                str(tmp_path / "missing.config"),
            ]
        )
        == 2
    )
    assert "missing.config" in capsys.readouterr().err


def test_cli_takes_a_tf_serving_command_line_and_passes_its_settings(bases, tmp_path, monkeypatch, caplog):
    """The flags of a TF Serving Docker command line (`--port=8500 --rest_api_port=8501 ...`) are accepted."""
    import torchestimator.serving as serving
    from torchestimator.cli import main

    received = {}
    monkeypatch.setattr(serving, "serve", lambda *arguments, **settings: received.update(settings, args=arguments))
    parameters = write(tmp_path / "batching.config", "max_batch_size { value: 8 } batch_timeout_micros { value: 0 }")
    monitoring = write(tmp_path / "monitoring.config", 'prometheus_config { enable: true path: "/metrics" }')
    with caplog.at_level("WARNING"):
        assert (
            main(
                [
                    "serve",
                    "--port=8500",
                    "--rest_api_port=8601",
                    "--model_name=a",
                    f"--model_base_path={tmp_path}",
                    "--enable_batching",
                    f"--batching_parameters_file={parameters}",
                    f"--monitoring_config_file={monitoring}",
                    "--rest_api_timeout_in_ms=0",
                ]
            )
            == 0
        )
    assert received["grpc_port"] == 8500 and received["enable_model_warmup"] is True  # --port: the gRPC API
    assert received["args"] == ("a", str(tmp_path)) and received["port"] == 8601
    assert received["batching"] == BatchingParameters(max_batch_size=8, batch_timeout_micros=0)
    assert received["metrics_path"] == "/metrics" and received["timeout_seconds"] is None


@pytest.mark.slow
def test_cli_serve_on_port_zero_announces_the_port_it_bound(bases):
    """`--rest_api_port 0` lets the system pick a free port; the announce line names that port, not 0, and a
    request sent to the announced URL is answered by this server."""
    import os
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "torchestimator.cli",
        "serve",
        "--model_name",
        "a",
        "--model_base_path",
        str(bases["root"] / "a"),
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
        line = server.stdout.readline()  # the announce line; readline returns "" if the server dies first
        assert line.startswith("serving a (version 2 AVAILABLE) at http://127.0.0.1:"), line
        url = line.split(" at ", 1)[1].strip()
        port = int(url.split(":")[2].split("/")[0])
        assert port != 0
        predicted = Client(url.rsplit("/v1/models/", 1)[0], "a").predict(bases["x"])
        assert [row["class"] for row in predicted] == list(bases["expected"]["class"])
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_without_asyncio_runner_the_server_loop_still_ends_clean():
    """Python 3.10 has no asyncio.Runner: serve() then runs its loop itself, cancelling what is left and closing it."""
    import asyncio

    from torchestimator.serving import server

    seen = {}

    async def main() -> None:
        seen["leftover"] = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
        seen["loop"] = asyncio.get_running_loop()

    server._run_on_own_loop(main(), asyncio.new_event_loop)
    assert seen["leftover"].cancelled() and seen["loop"].is_closed()
