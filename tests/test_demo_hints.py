"""Every command `torchestimator demo` prints as a hint runs exactly as printed, through a shell, and does what
its label says: predict prints predictions, serve serves, the wait returns once it answers, curl gets
predictions (the same ones)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from torchestimator.cli.demo_command import NEXT_STEPS_HEADER

pytestmark = pytest.mark.slow

# A shell command as the demo may print it outside the hints block: the test would miss it there.
COMMAND_OUTSIDE_HINTS = re.compile(r"(^|: )(torchestimator|curl|tensorboard|until|pip) ")


def test_every_command_the_demo_prints_runs_as_printed(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    port = _free_port()
    # 200 steps reach a checkpoint, an evaluation and both exports: the whole story the hints use.
    demo = _run(f"torchestimator demo --max_steps 200 --no_progress --rest_api_port {port}", tmp_path, env, 240)
    assert demo.returncode == 0, demo.stderr
    hints = _hints(demo.stdout)
    kinds = [_kind(command) for _, command in hints]
    assert {"predict", "serve", "wait", "curl"} <= set(kinds), hints
    assert kinds.index("serve") < kinds.index("wait") < kinds.index("curl"), hints
    server, server_log = None, tmp_path / "serve.log"
    predicted = None
    try:
        for (label, command), kind in zip(hints, kinds):
            if kind == "serve":  # leave it running, as the label says; the wait and curl come next
                with open(server_log, "w") as log:
                    server = subprocess.Popen(
                        command,
                        shell=True,
                        executable="/bin/bash",
                        cwd=tmp_path,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                continue
            done = _run(command, tmp_path, env, 120)
            served = server_log.read_text() if server is not None else "(no server started)"
            assert done.returncode == 0, (label, command, done.stdout, done.stderr, served)
            if kind == "predict":
                predicted = _predictions(done.stdout)
            elif kind == "curl":
                assert _predictions(done.stdout) == predicted, "curl's answer differs from predict's"
            elif kind == "plot":
                assert os.path.isfile(tmp_path / "runs" / "digits" / "metrics.png")
    finally:
        if server is not None:
            _stop(server)


def _hints(printed: str) -> list[tuple[str, str]]:
    """(label, command) for each `  label: command` line under the header; no command anywhere else."""
    lines = printed.splitlines()
    assert NEXT_STEPS_HEADER in lines, printed
    start = lines.index(NEXT_STEPS_HEADER)
    for line in lines[:start]:
        assert not COMMAND_OUTSIDE_HINTS.search(line), f"a command outside the hints block: {line!r}"
    hints = []
    for line in lines[start + 1 :]:
        assert line.startswith("  ") and ": " in line, f"not a '  label: command' line: {line!r}"
        label, command = line.strip().split(": ", 1)
        hints.append((label, command))
    return hints


def _kind(command: str) -> str:
    words = command.split()
    if words[0] == "torchestimator" and words[1] in ("predict", "serve", "plot"):
        return words[1]
    if words[0] == "until" and "curl" in words:
        return "wait"
    if words[0] == "curl":
        return "curl"
    raise AssertionError(f"the demo printed {command!r}, which this test does not know how to check: teach it")


def _predictions(stdout: str) -> list:
    predictions = json.loads(stdout)["predictions"]
    assert len(predictions) == 2 and all(0 <= row["class"] <= 9 for row in predictions), predictions
    assert all(abs(sum(row["probabilities"]) - 1) < 1e-5 for row in predictions)
    return predictions


def _run(command: str, cwd, env, timeout: float) -> subprocess.CompletedProcess:
    """The command through bash; on timeout its whole process group is killed (a wait loop's sleep too)."""
    process = subprocess.Popen(
        command,
        shell=True,
        executable="/bin/bash",
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=30)
        raise AssertionError(
            f"{command!r} did not finish within {timeout} s: {stdout[-2000:]} {stderr[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _stop(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
