"""Ports: `serve` takes 0-65535 (0: any free port), `demo` 1-65535 (its printed commands need one fixed port),
refused in one line before anything is loaded or trained; a port in use is one line naming it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from torchestimator.cli import main


def one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err and captured.err.count("\n") == 1, captured.err
    return captured.err.strip()


@pytest.mark.parametrize("port", ["-1", "65536", "70000"])
def test_serve_refuses_a_port_outside_0_65535_before_loading(tmp_path, capsys, port):
    """It loaded the model, then bind raised OverflowError with a traceback."""
    missing = str(tmp_path / "no_export")  # never read: the port is refused first
    assert main(["serve", "--model_name", "m", "--model_base_path", missing, "--rest_api_port", port]) == 2
    assert one_line(capsys) == (
        f"torchestimator serve: error: --rest_api_port {port} is not a TCP port: give "
        "0-65535 (0: any free port, announced when listening)."
    )
    assert main(["serve", "--model_name", "m", "--model_base_path", missing, "--port", port]) == 2
    assert f"--port {port} is not a TCP port" in one_line(capsys)


@pytest.mark.parametrize(
    "port, message",
    [
        (
            "0",
            "--rest_api_port 0 cannot be printed in the serve and curl commands, which need one fixed port: give "
            "1-65535.",
        ),
        ("70000", "--rest_api_port 70000 is not a TCP port: give 1-65535."),
    ],
)
def test_demo_refuses_a_port_its_printed_commands_cannot_use(tmp_path, monkeypatch, capsys, port, message):
    """--rest_api_port 0 printed a curl loop on :0 that never answers."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--rest_api_port", port]) == 2
    assert one_line(capsys) == f"torchestimator demo: error: {message}"
    assert os.listdir(tmp_path) == []  # nothing trained


def test_a_port_in_use_is_one_line_naming_it(tmp_path):
    """As a user sees it: the installed command, a socket this test holds on the port."""
    export = _tiny_export(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [
            sys.executable,
            "-m",
            "torchestimator.cli",
            "serve",
            "--model_name",
            "m",
            "--model_base_path",
            export,
            "--rest_api_port",
            str(port),
            "--file_system_poll_wait_seconds",
            "0",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"torchestimator serve: error: cannot listen on 127.0.0.1:{port}: port {port} is already in use on "
        "127.0.0.1 (another server, or an earlier serve still running); stop it or choose another --rest_api_port."
    )


def _tiny_export(folder) -> str:
    """An export base of a one-layer model trained one step, made in this process."""
    import torch

    import torchestimator as te
    from torchestimator.export import TensorSpec, serving_input_receiver

    def model_fn(model, features, labels, mode):
        y = model(features["x"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"y": y})
        return te.EstimatorSpec(mode, loss=((y - labels) ** 2).mean())

    estimator = te.Estimator(
        model_fn=model_fn,
        model=lambda: torch.nn.Linear(2, 1),
        model_dir=str(folder / "run"),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        config=te.RunConfig(progress_bar=False, random_seed=0),
    )
    estimator.train(lambda: [({"x": torch.ones(4, 2)}, torch.ones(4, 1))], max_steps=1)
    return os.path.dirname(
        estimator.export_saved_model(str(folder / "export"), serving_input_receiver({"x": TensorSpec(shape=(None, 2))}))
    )


def test_serve_passes_inline_forward_micros_and_refuses_a_negative_one(tmp_path, monkeypatch, capsys):
    import torchestimator.serving as serving
    from torchestimator.serving.settings import DEFAULT_INLINE_FORWARD_MICROS

    received = []
    monkeypatch.setattr(serving, "serve", lambda *args, **settings: received.append(settings))
    missing = str(tmp_path / "no_export")
    assert main(["serve", "--model_name", "m", "--model_base_path", missing]) == 0
    assert main(["serve", "--model_name", "m", "--model_base_path", missing, "--inline_forward_micros", "0"]) == 0
    assert [settings["inline_forward_micros"] for settings in received] == [DEFAULT_INLINE_FORWARD_MICROS, 0]
    capsys.readouterr()
    assert main(["serve", "--model_name", "m", "--model_base_path", missing, "--inline_forward_micros", "-5"]) == 2
    assert one_line(capsys) == (
        "torchestimator serve: error: --inline_forward_micros -5 is negative: give 0 (every "
        "forward on a request thread) or more."
    )
