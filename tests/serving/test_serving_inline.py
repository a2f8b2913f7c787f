"""Fast models' requests run on the event loop (app.py's inline path); slow models, big requests and custom
loaders' objects keep the worker threads; the server's loop is uvloop when installed (event_loop.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import threading
import time
import urllib.request

import pytest
from helpers import exporting_model_fn, trained_classifier

from torchestimator.errors import ConfigError
from torchestimator.export import ExportedModel, TensorSpec, export_saved_model, serving_input_receiver
from torchestimator.serving import ModelManager, make_app
from torchestimator.serving.event_loop import LOOP_ENVIRONMENT_VARIABLE, loop_factory, loop_name
from torchestimator.serving.manager import warm_up
from torchestimator.serving.server import RunningServer

model_fn = exporting_model_fn(lambda logits, predictions: {})
LOOP_THREAD = "torchestimator-server"  # RunningServer's event loop thread
WORKER_PREFIX = "torchestimator-serving"  # app.py's request threads


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("inline")
    estimator, x = trained_classifier(root / "model", model_fn, steps=2)
    export_saved_model(estimator, root / "export", serving_input_receiver({"x": TensorSpec(shape=(None, 8))}))
    return root / "export", x


@pytest.fixture
def forward_threads(monkeypatch):
    """The name of the thread each ExportedModel call ran on, in order (the class stays ExportedModel)."""
    names: list[str] = []
    original = ExportedModel.__call__

    def recording(self, *args, **kwargs):
        names.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ExportedModel, "__call__", recording)
    return names


def polled(base_path) -> ModelManager:
    manager = ModelManager("m", base_path)
    assert manager.poll()
    return manager


def post(server, rows, x):
    body = json.dumps({"instances": x[:rows].tolist()}).encode()
    request = urllib.request.Request(server.url + "/v1/models/m:predict", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read()


def test_warm_up_measures_a_batch_of_one_and_the_manager_keeps_it_per_version(base):
    base_path, _ = base
    manager = polled(base_path)
    version = manager.served_version
    seconds = manager.forward_seconds(version)
    assert seconds is not None and 0 < seconds < 1.0  # a SmallNet forward: well under a second
    assert manager.forward_seconds(version + 1) is None  # never loaded: unknown
    model = manager.get(version)
    assert 0 < warm_up(model) < 1.0


def test_a_fast_model_runs_small_requests_on_the_loop_and_answers_as_the_threads_do(base, forward_threads):
    base_path, x = base
    manager = polled(base_path)
    forward_threads.clear()  # the load's warm-up calls
    with RunningServer(make_app(manager), "127.0.0.1", 0) as inline_server:  # default limit: 1 ms
        inline = post(inline_server, 1, x)
    with RunningServer(make_app(manager, inline_forward_micros=0), "127.0.0.1", 0) as threaded_server:
        threaded = post(threaded_server, 1, x)
    assert forward_threads[0] == LOOP_THREAD
    assert forward_threads[1].startswith(WORKER_PREFIX)
    assert inline == threaded and inline[0] == 200
    assert len(json.loads(inline[1])["predictions"]) == 1


def test_requests_whose_rows_times_the_measured_forward_exceed_the_limit_go_to_a_worker(base, forward_threads):
    base_path, x = base
    manager = polled(base_path)
    limit_micros = math.ceil(manager.forward_seconds(manager.served_version) * 1e6 * 3)  # 3 rows fit, 30 do not
    forward_threads.clear()
    with RunningServer(make_app(manager, inline_forward_micros=limit_micros), "127.0.0.1", 0) as server:
        assert post(server, 1, x)[0] == 200
        status, body = post(server, 30, x)
    assert status == 200 and len(json.loads(body)["predictions"]) == 30
    assert forward_threads[0] == LOOP_THREAD
    assert forward_threads[1].startswith(WORKER_PREFIX)


def test_a_model_slower_than_the_limit_keeps_the_worker_threads(base, forward_threads):
    base_path, x = base
    manager = polled(base_path)
    forward_threads.clear()
    with RunningServer(make_app(manager, inline_forward_micros=1), "127.0.0.1", 0) as server:  # 1 us: none is
        assert post(server, 1, x)[0] == 200
    assert forward_threads == [forward_threads[0]] and forward_threads[0].startswith(WORKER_PREFIX)


def test_a_model_found_slow_on_the_loop_is_sent_back_to_the_threads(base, monkeypatch, caplog):
    base_path, x = base
    manager = polled(base_path)
    names: list[str] = []
    original = ExportedModel.__call__

    def slow_on_the_loop(self, *args, **kwargs):  # slower than measured at load: 25 ms of CPU against a 1 ms limit
        names.append(threading.current_thread().name)
        _spin(0.025)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ExportedModel, "__call__", slow_on_the_loop)
    with RunningServer(make_app(manager), "127.0.0.1", 0) as server:
        for _ in range(4):
            assert post(server, 1, x)[0] == 200
    assert names[:3] == [LOOP_THREAD] * 3  # three slow calls on the loop, then the threads
    assert names[3].startswith(WORKER_PREFIX)
    assert "run in worker threads from now on" in caplog.text


def _spin(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU time (a slow forward; sleeping or waiting is not one)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_only_slow_calls_in_a_row_send_a_model_back_and_waiting_is_not_slowness(base, monkeypatch, caplog):
    """Waiting (for the GIL, behind big requests parsed in threads) is not the model's cost; one fast call in
    between clears the strikes."""
    base_path, x = base
    manager = polled(base_path)
    names: list[str] = []
    original = ExportedModel.__call__
    plan = iter(["spin", "spin", "fast", "spin", "sleep", "spin", "spin", "fast", "fast"])

    def planned(self, *args, **kwargs):
        names.append(threading.current_thread().name)
        step = next(plan, "fast")
        if step == "spin":
            _spin(0.025)
        elif step == "sleep":
            time.sleep(0.05)  # off the CPU: not slowness of the model
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ExportedModel, "__call__", planned)
    with RunningServer(make_app(manager), "127.0.0.1", 0) as server:
        for _ in range(9):
            assert post(server, 1, x)[0] == 200
    # Never three slow calls in a row: the fast call and the sleeping one (no CPU) clear the strikes.
    assert names == [LOOP_THREAD] * 9, names
    assert "run in worker threads from now on" not in caplog.text


def test_a_model_with_a_free_size_past_the_batch_keeps_the_worker_threads(tmp_path, forward_threads):
    """Rows times a batch-of-one forward bounds nothing when a row's own size is free (timed at 1 at load)."""
    import numpy as np
    import torch
    from torch import nn

    import torchestimator as te
    from torchestimator.export import PredictOutput

    class MeanOfRow(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))

        def forward(self, x):
            return x.mean(dim=1) * self.scale

    def row_model_fn(model, features, labels, mode):
        value = model(features["x"])
        predictions = {"mean": value}
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(
                mode, predictions=predictions, export_outputs={"serving_default": PredictOutput(predictions)}
            )
        return te.EstimatorSpec(mode, loss=(value - labels).square().mean())

    estimator = te.Estimator(
        model_fn=row_model_fn,
        model=MeanOfRow,
        model_dir=str(tmp_path / "model"),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.0),
        config=te.RunConfig(log_step_count_steps=None, progress_bar=False),
    )
    estimator.train(
        te.numpy_input_fn(
            {"x": np.ones((4, 3), np.float32)}, np.ones(4, np.float32), batch_size=2, num_epochs=None, shuffle=False
        ),
        max_steps=1,
    )
    export_saved_model(estimator, tmp_path / "export", serving_input_receiver({"x": TensorSpec(shape=(None, None))}))
    manager = polled(tmp_path / "export")
    assert math.isinf(manager.forward_seconds(manager.served_versions[0]))
    forward_threads.clear()
    with RunningServer(make_app(manager), "127.0.0.1", 0) as server:
        body = json.dumps({"instances": [[1.0] * 1000]}).encode()
        request = urllib.request.Request(server.url + "/v1/models/m:predict", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["predictions"] == [1.0]
    assert len(forward_threads) == 1 and forward_threads[0].startswith(WORKER_PREFIX)


def test_a_bad_loop_setting_is_refused_before_any_model_loads(base, monkeypatch):
    import torchestimator.serving.server as server_module

    loaded = []
    monkeypatch.setattr(server_module, "build_app", lambda settings: loaded.append(settings))
    monkeypatch.setenv(LOOP_ENVIRONMENT_VARIABLE, "bogus")
    with pytest.raises(ConfigError, match=LOOP_ENVIRONMENT_VARIABLE):
        server_module.start("m", base[0])
    with pytest.raises(ConfigError, match=LOOP_ENVIRONMENT_VARIABLE):
        server_module.serve("m", base[0])
    assert loaded == []


def test_objects_from_a_custom_loader_never_run_on_the_loop(base, forward_threads):
    base_path, x = base

    class Wrapped:  # not an ExportedModel: it may wait on anything, so it keeps the threads and the timeout
        def __init__(self, model):
            self._model = model
            self.signature_names, self.signature = model.signature_names, model.signature

        def __call__(self, inputs, signature_name="serving_default", output_keys=None):
            return self._model(inputs, signature_name=signature_name, output_keys=output_keys)

    from torchestimator.export import load

    manager = ModelManager("m", base_path, loader=lambda path: Wrapped(load(path)))
    assert manager.poll()
    forward_threads.clear()
    with RunningServer(make_app(manager), "127.0.0.1", 0) as server:
        assert post(server, 1, x)[0] == 200
    assert len(forward_threads) == 1 and forward_threads[0].startswith(WORKER_PREFIX)


@pytest.mark.parametrize("value", [-1, 1.5, True, "1000"])
def test_make_app_refuses_a_bad_inline_limit_naming_it(base, value):
    with pytest.raises(ValueError, match="inline_forward_micros"):
        make_app(polled(base[0]), inline_forward_micros=value)


def test_the_server_loop_is_uvloop_when_installed_and_asyncio_when_asked(base, monkeypatch):
    monkeypatch.delenv(LOOP_ENVIRONMENT_VARIABLE, raising=False)
    has_uvloop = importlib.util.find_spec("uvloop") is not None
    assert loop_name() == ("uvloop" if has_uvloop else "asyncio")
    with RunningServer(make_app(polled(base[0])), "127.0.0.1", 0) as server:
        assert type(server._loop).__module__.startswith("uvloop" if has_uvloop else "asyncio")
        assert post(server, 1, base[1])[0] == 200
    monkeypatch.setenv(LOOP_ENVIRONMENT_VARIABLE, "asyncio")
    assert loop_name() == "asyncio"
    loop = loop_factory()()
    try:
        assert isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.close()
    monkeypatch.setenv(LOOP_ENVIRONMENT_VARIABLE, "trio")
    with pytest.raises(ConfigError, match=LOOP_ENVIRONMENT_VARIABLE):
        loop_name()


def test_answers_are_encoded_by_orjson_with_json_values_and_tf_tokens_for_non_finite_numbers():
    import numpy as np

    from torchestimator.serving.json_tensor import predict_response, predict_response_bytes

    rows = np.random.default_rng(0).standard_normal((3, 10)).astype(np.float32) * 1e-5
    outputs = {"p": rows, "class": np.array([1, 2, 2**40])}
    encoded = predict_response_bytes(outputs, row_format=True)
    assert json.loads(encoded) == predict_response(outputs, row_format=True)  # the very same float64 values
    if importlib.util.find_spec("orjson") is not None:
        assert b'", "' not in encoded and b'":[' in encoded  # orjson's compact separators
    for value, token in ((np.nan, b"NaN"), (np.inf, b"Infinity"), (-np.inf, b"-Infinity")):
        answer = predict_response_bytes({"p": np.array([[0.5, value]], np.float32)}, row_format=False)
        assert answer == b'{"outputs": [[0.5, ' + token + b"]]}"  # TF Serving's tokens, never null
    with pytest.raises(TypeError, match="complex"):
        predict_response_bytes({"p": np.array([[1j]])}, row_format=True)
