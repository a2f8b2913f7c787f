"""Programs started as a cluster's tasks (plain `python train.py` per task, torchrun nodes): a clean environment,
every process in its own session, stopped with SIGTERM then SIGKILL, and a failure that shows their logs."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_LAUNCH_VARIABLE_PREFIXES = ("SLURM_", "PET_", "TORCHELASTIC_")
_LAUNCH_VARIABLES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TF_CONFIG",
    "GLOO_SOCKET_IFNAME",
}


def task_environment(**extra: str) -> dict[str, str]:
    """This test's environment without any cluster description, one thread per process, short collectives."""
    environ = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCH_VARIABLES and not name.startswith(_LAUNCH_VARIABLE_PREFIXES)
    }
    environ.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCHESTIMATOR_COLLECTIVE_TIMEOUT="60")
    environ.update(extra)
    return environ


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process's session (torchrun stops its workers on it), then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)


def start_tasks(commands: list[tuple[list[str], dict[str, str]]], logs: Path) -> list[subprocess.Popen]:
    """Start every command at once, each in its own session, its output in ``logs/process<index>.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    processes = []
    try:
        for index, (command, environ) in enumerate(commands):
            with open(logs / f"process{index}.log", "wb") as log:
                processes.append(
                    subprocess.Popen(
                        command,
                        env=environ,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
    except BaseException:
        for process in processes:
            stop(process)
        raise
    return processes


def wait_tasks(processes: list[subprocess.Popen], deadline_seconds: float) -> tuple[list[int | None], list[int]]:
    """Every process's exit code once all exited or the deadline passed (those still running are stopped and
    listed second)."""
    try:
        deadline = time.monotonic() + deadline_seconds
        while time.monotonic() < deadline and any(process.poll() is None for process in processes):
            time.sleep(0.2)
    finally:
        timed_out = [index for index, process in enumerate(processes) if process.poll() is None]
        for process in processes:
            stop(process)
    return [process.returncode for process in processes], timed_out


def task_logs(logs: Path, count: int, commands: list[tuple[list[str], dict[str, str]]] | None = None) -> str:
    return "\n".join(
        f"--- process {index}{' (' + ' '.join(commands[index][0][-6:]) + ')' if commands else ''}:\n"
        + (logs / f"process{index}.log").read_text(errors="replace")[-3000:]
        for index in range(count)
    )


def run_together(commands: list[tuple[list[str], dict[str, str]]], logs: Path, deadline_seconds: float) -> None:
    """Start every command at once; fail (with their logs) unless all exit 0 within ``deadline_seconds``."""
    codes, timed_out = wait_tasks(start_tasks(commands, logs), deadline_seconds)
    if timed_out or any(codes):
        reason = f"processes {timed_out} still running after {deadline_seconds:g} s" if timed_out else "a failure"
        pytest.fail(f"{reason}; exit codes {codes}\n{task_logs(logs, len(codes), commands)}")


def _ip(*arguments: str) -> None:
    subprocess.run(["ip", *arguments], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def two_network_namespaces() -> Iterator[list[tuple[str, str, str]]]:
    """Two network namespaces joined by a veth pair: [(namespace, interface, address)] for each side.

    Created here and always deleted (deleting a namespace deletes the veth end inside it).
    """
    tag = secrets.token_hex(3)
    subnet = f"10.213.{secrets.randbelow(254) + 1}"
    sides = [(f"te{tag}{side}", f"vte{tag}{side}", f"{subnet}.{number}") for number, side in ((1, "a"), (2, "b"))]
    created: list[str] = []
    try:
        for namespace, _, _ in sides:
            _ip("netns", "add", namespace)
            created.append(namespace)
        (namespace_a, veth_a, _), (namespace_b, veth_b, _) = sides
        _ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        _ip("link", "set", veth_a, "netns", namespace_a)
        _ip("link", "set", veth_b, "netns", namespace_b)
        for namespace, veth, address in sides:
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", veth)
            _ip("-n", namespace, "link", "set", veth, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
        yield sides
    finally:
        for namespace in created:
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, timeout=30)
        for _, veth, _ in sides:  # only left when it was never moved into a namespace
            subprocess.run(["ip", "link", "delete", veth], capture_output=True, timeout=30)


def network_namespaces_unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"teprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"`ip netns add` is refused here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=30)
    return None
