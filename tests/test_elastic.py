"""Replicas that die: the others stop at once naming the dead one, and torchrun's elastic restart resumes
from the newest checkpoint to the same weights, bit for bit, as a run never stopped.

The training script is tests/elastic_train_script.py, run as a user runs one: ``python script.py`` (which
starts its own replicas) or under ``python -m torch.distributed.run`` with c10d rendezvous on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import wait_until

from torchestimator.checkpoint import CheckpointStore

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SCRIPT = str(Path(__file__).with_name("elastic_train_script.py"))
LAUNCH_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
)

# torch 2.13's c10d rendezvous keeps one TCPStore (the rank-0 agent's) across restarts and the workers'
# env:// store on it has no per-attempt prefix, so a restarted group can read the dead workers' gloo
# addresses: "Connection refused" to the old port (5 of 6 restarts here; torch issue #135712). With this,
# each rendezvous round publishes a fresh store port in its own round-prefixed keys (8 of 8 restarts).
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _environment(**extra: str) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if name not in LAUNCH_VARIABLES}
    environ.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return environ


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _torchrun(model_dir: Path | str, log: Path, *, max_restarts: int, extra: list[str] = ()) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(max_restarts),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{_free_port()}",
        "--monitor-interval",
        "0.2",
        SCRIPT,
        "--model_dir",
        str(model_dir),
        "--max_steps",
        "12",
        *extra,
    ]
    with open(log, "wb") as handle:
        return subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=_environment(**NO_SHARED_STORE),
            start_new_session=True,
        )


def _stop(process: subprocess.Popen) -> None:
    """Kills the process and what it started (its own session: torchrun's workers, a script's replicas)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def _finish(process: subprocess.Popen, log: Path, timeout: float) -> str:
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        raise AssertionError(
            f"{process.args[2]} did not finish within {timeout} s; its log:\n{log.read_text()[-4000:]}"
        ) from None
    return log.read_text(errors="replace")


def _final_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    checkpoint = CheckpointStore(str(model_dir)).restore(load_optimizer=False)
    assert checkpoint.step == 12, checkpoint.path
    return checkpoint.model_state


def test_a_worker_killed_mid_training_is_restarted_and_resumes_bit_exact(tmp_path):
    pid_file = tmp_path / "paused-worker.pid"
    reference = _torchrun(tmp_path / "uninterrupted", tmp_path / "uninterrupted.log", max_restarts=0)
    elastic = _torchrun(
        tmp_path / "elastic",
        tmp_path / "elastic.log",
        max_restarts=1,
        extra=["--pause_rank", "1", "--pause_at_step", "7", "--pause_file", str(pid_file)],
    )
    try:
        # Rank 1 waits after step 7; ckpt-4 was written at step 4 and is the newest complete checkpoint.
        wait_until(pid_file.exists, timeout=180, what="rank 1 pausing after step 7 of the first attempt")
        wait_until(lambda: (tmp_path / "elastic" / "ckpt-4").is_dir(), timeout=30, what="ckpt-4 in model_dir")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        elastic_log = _finish(elastic, tmp_path / "elastic.log", timeout=240)
        reference_log = _finish(reference, tmp_path / "uninterrupted.log", timeout=120)
    finally:
        for process in (elastic, reference):
            _stop(process)  # also workers a failed run left behind
    assert reference.returncode == 0, reference_log[-4000:]
    assert elastic.returncode == 0, elastic_log[-4000:]
    # The agent saw the kill, and the restarted group resumed from ckpt-4 on both ranks.
    assert re.search(r"exitcode: -9\) local_rank: 1", elastic_log), elastic_log[-4000:]
    assert "start attempt=1 rank=0 step=4" in elastic_log and "start attempt=1 rank=1 step=4" in elastic_log
    resumed, uninterrupted = _final_weights(tmp_path / "elastic"), _final_weights(tmp_path / "uninterrupted")
    assert sorted(resumed) == sorted(uninterrupted)
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), name


def test_a_worker_killed_with_its_model_dir_in_s3_is_restarted_and_resumes_bit_exact(s3_bucket, tmp_path):
    """The same with only an s3:// model_dir shared (moto's S3 server): no file system holds the run."""
    pid_file, url = tmp_path / "paused-worker.pid", f"{s3_bucket}/elastic"
    reference = _torchrun(tmp_path / "uninterrupted", tmp_path / "uninterrupted.log", max_restarts=0)
    elastic = _torchrun(
        url,
        tmp_path / "elastic.log",
        max_restarts=1,
        extra=["--pause_rank", "1", "--pause_at_step", "7", "--pause_file", str(pid_file)],
    )
    try:
        wait_until(pid_file.exists, timeout=180, what="rank 1 pausing after step 7 of the first attempt")
        wait_until(lambda: CheckpointStore(url).latest_checkpoint() is not None, timeout=30, what="ckpt-4 in the store")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        elastic_log = _finish(elastic, tmp_path / "elastic.log", timeout=240)
        reference_log = _finish(reference, tmp_path / "uninterrupted.log", timeout=120)
    finally:
        for process in (elastic, reference):
            _stop(process)
    assert reference.returncode == 0, reference_log[-4000:]
    assert elastic.returncode == 0, elastic_log[-4000:]
    assert "start attempt=1 rank=0 step=4" in elastic_log and "start attempt=1 rank=1 step=4" in elastic_log
    resumed, uninterrupted = _final_weights(url), _final_weights(tmp_path / "uninterrupted")
    assert sorted(resumed) == sorted(uninterrupted)
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), name
    listed = {path.rsplit("/", 1)[1] for path in CheckpointStore(url).all_checkpoints()}
    from torchestimator._io import filesystems

    left = [name for name in filesystems.listdir(url) if name.startswith("ckpt-") and name not in listed]
    assert left == []  # the killed attempt's unfinished save (if any) was cleared by the restarted one


def test_a_rank_that_dies_stops_the_others_at_once_naming_it(tmp_path):
    """Plain ``python script.py`` runs (MirroredStrategy starts the second replica) in which rank 1 dies after
    step 5: by SIGKILL (as kill -9) in one, by os._exit in the other, run side by side."""
    runs = {}
    for how in ("sigkill", "exit"):
        die_file, log = tmp_path / f"{how}-died-at", tmp_path / f"{how}.log"
        command = [
            sys.executable,
            SCRIPT,
            "--model_dir",
            str(tmp_path / how),
            "--max_steps",
            "40",
            "--num_replicas",
            "2",
            "--die_rank",
            "1",
            "--die_at_step",
            "5",
            "--die_how",
            how,
            "--die_file",
            str(die_file),
        ]
        with open(log, "wb") as handle:
            runs[how] = (
                subprocess.Popen(
                    command, stdout=handle, stderr=subprocess.STDOUT, env=_environment(), start_new_session=True
                ),
                die_file,
                log,
            )
    try:
        outputs = {how: _finish(process, log, timeout=180) for how, (process, _, log) in runs.items()}
    finally:
        for process, _, _ in runs.values():
            _stop(process)
    for how, (process, die_file, _) in runs.items():
        output = outputs[how]
        assert process.returncode != 0, output[-4000:]
        assert "ReplicaLostError: Replica 0 stops at global step 5" in output, output[-4000:]
        assert re.search(r"rank 1 \(pid \d+ on [^)]+\) is gone", output), output[-4000:]
        failed_at = float(re.search(r"failed rank=0 at=([0-9.]+) error=ReplicaLostError", output).group(1))
        # Well within the collective timeout (300 s by default): on 127.0.0.1 gloo sees the reset at once.
        assert failed_at - float(die_file.read_text()) < 20.0, how
