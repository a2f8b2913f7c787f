"""A lost peer is named (issue 26, point 3): a replica killed during a checkpoint save, and replica 0 killed
before the group forms, end the survivors with a ReplicaLostError naming it, in bounded time.

Two gloo processes on 127.0.0.1; the dying one kills itself with SIGKILL (as kill -9) at the chosen moment.
Every wait polls against a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import loss_model_fn, wait_until

import torchestimator as te
from torchestimator.checkpoint import CheckpointStore
from torchestimator.checkpoint.dcp_format import ShardWriter
from torchestimator.distribute import MirroredStrategy
from torchestimator.testing import ReplicaFailedError, run_in_processes

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _input_fn(input_context=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return te.numpy_input_fn({"x": x}, y, batch_size=16, num_epochs=None, shuffle=True, seed=3)(
        input_context=input_context
    )


def _outcome(error: BaseException) -> dict:
    return {
        "type": type(error).__name__,
        "message": str(error),
        "cause": type(error.__cause__).__name__ if error.__cause__ is not None else None,
        "cause_message": str(error.__cause__)[:2000] if error.__cause__ is not None else None,
        "lost_ranks": list(getattr(error, "lost_ranks", ())),
        "traceback": traceback.format_exc(),
    }


def _killed_during_save(model_dir, outcome_file, asynchronous):
    """Rank 1 is killed (SIGKILL) while writing its shard of ckpt-8; rank 0 records what it raised."""
    original = ShardWriter.write_data

    def write_or_die(self, plan, planner):
        if "ckpt-8-" in str(self.path) and torch.distributed.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, plan, planner)

    ShardWriter.write_data = write_or_die
    config = te.RunConfig(
        train_distribute=MirroredStrategy(num_replicas=2),
        save_checkpoints_steps=4,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
        async_checkpoint=asynchronous,
    )
    estimator = te.Estimator(
        model_fn=loss_model_fn,
        model=lambda: nn.Linear(6, 2),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        model_dir=model_dir,
        config=config,
    )
    try:
        estimator.train(_input_fn, max_steps=8)
    except BaseException as error:
        with open(outcome_file + ".tmp", "w") as handle:
            json.dump(_outcome(error), handle)
        os.replace(outcome_file + ".tmp", outcome_file)
        return None
    with open(outcome_file, "w") as handle:
        json.dump({"type": None}, handle)
    return None


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_replica_killed_during_a_save_is_named_and_the_save_never_published(tmp_path, asynchronous):
    model_dir, outcome_file = str(tmp_path / "model"), str(tmp_path / "rank0.json")
    started = time.monotonic()
    with pytest.raises(ReplicaFailedError, match="rank 1"):  # rank 1 died without reporting
        run_in_processes(_killed_during_save, nprocs=2, args=(model_dir, outcome_file, asynchronous), timeout=240)
    outcome = json.loads(
        wait_until(
            lambda: os.path.exists(outcome_file) and open(outcome_file).read(), timeout=30, what="rank 0's outcome"
        )
    )
    assert outcome["type"] == "ReplicaLostError", outcome
    assert "Replica 0 stops at global step 8: a collective of the checkpoint save failed" in outcome["message"]
    assert "rank 1 (pid" in outcome["message"] and "is gone" in outcome["message"], outcome["message"]
    assert outcome["lost_ranks"] == [1]
    assert outcome["cause"] == "CheckpointError", outcome  # the save's own error stays as the cause
    assert time.monotonic() - started < 200
    # Never half-published: only ckpt-4 is a checkpoint; a staging folder of step 8 has no sealed state.json.
    store = CheckpointStore(model_dir)
    assert [os.path.basename(path) for path in store.all_checkpoints()] == ["ckpt-4"]
    for name in os.listdir(model_dir):
        if name.startswith(".tmp-ckpt-8-"):
            assert not os.path.exists(os.path.join(model_dir, name, "state.json")), name
    assert store.restore(load_optimizer=False).step == 4


# ----------------------------------------------------------------------------- replica 0 before the group

_PLAIN_SCRIPT = """
import json, os, signal, sys, time, traceback
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
import torchestimator as te
from torchestimator.distribute import mirrored as mirrored_module

model_dir, report_folder = sys.argv[1], sys.argv[2]
if os.environ.get("TORCHESTIMATOR_STARTED_REPLICA_OF") is None:  # replica 0: dies once replica 1 runs
    original = mirrored_module._start_quiet_replicas

    def start_then_die(num_replicas):
        replicas = original(num_replicas)
        with open(os.path.join(report_folder, "replica1.pid"), "w") as handle:
            handle.write(str(replicas.processes[0].pid))
        os.kill(os.getpid(), signal.SIGKILL)

    mirrored_module._start_quiet_replicas = start_then_die
x = np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.int64)

def model_fn(model, features, labels, mode):
    return te.EstimatorSpec(mode, loss=F.cross_entropy(model(features["x"]), labels))

estimator = te.Estimator(model_fn=model_fn, model=lambda: nn.Linear(6, 2),
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1), model_dir=model_dir,
                         config=te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2), progress_bar=False))
try:
    estimator.train(te.numpy_input_fn({"x": x}, y, batch_size=8, num_epochs=None, shuffle=False), max_steps=4)
except BaseException as error:  # its standard error went to replica 0, which is gone: the test reads this file
    with open(os.path.join(report_folder, f"error-{os.getpid()}.txt"), "w") as handle:
        handle.write(f"{type(error).__name__}: {error}")
    raise
"""


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not yet reaped by its new parent counts as ended
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_replicas_of_a_plain_script_stop_at_once_when_replica_0_dies_before_the_group_forms(tmp_path):
    """Replica 0 of ``python script.py`` is killed right after starting replica 1 (before it serves the group's
    store): replica 1 must end, naming replica 0, well within the collective timeout (300 s by default)."""
    script = tmp_path / "script.py"
    script.write_text(_PLAIN_SCRIPT)
    environ = {
        name: value
        for name, value in os.environ.items()
        if name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG")
    }
    environ.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCHESTIMATOR_COLLECTIVE_TIMEOUT="300")
    chief = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "model"), str(tmp_path)],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    replica_pid = None
    try:
        assert chief.wait(timeout=120) == -signal.SIGKILL
        died_at = time.monotonic()
        replica_pid = int((tmp_path / "replica1.pid").read_text())
        wait_until(
            lambda: not _running(replica_pid),
            timeout=60,
            interval=0.1,
            what="replica 1 ending after replica 0 was killed",
        )
        assert time.monotonic() - died_at < 60
        reports = wait_until(lambda: list(tmp_path.glob("error-*.txt")), timeout=10, what="replica 1's error")
        said = reports[0].read_text()
        assert said.startswith("ReplicaLostError: Replica 1 of 2"), said
        assert f"replica 0 (pid {chief.pid})" in said and "is gone" in said, said
    finally:
        for pid in (chief.pid, replica_pid):
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# ----------------------------------------------------------------------------- the time to restart


def test_launch_stops_a_failed_group_within_its_shutdown_timeout(monkeypatch):
    """torch's agent closes the rest of a failed group with a fixed 30 s SIGTERM -> SIGKILL grace; launch uses
    its shutdown timeout there too (5 s unless --shutdown_timeout or TORCH_ELASTIC_SHUTDOWN_TIMEOUT say more)."""
    import argparse

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext

    from torchestimator.distribute import launcher

    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert launcher.shutdown_timeout(argparse.Namespace(shutdown_timeout=None), {}) == 5
    assert (
        launcher.shutdown_timeout(argparse.Namespace(shutdown_timeout=None), {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "40"})
        == 40
    )
    assert launcher.shutdown_timeout(argparse.Namespace(shutdown_timeout=12), {}) == 12
    closed, seen = [], {}

    def record_close(context, death_sig=None, timeout=30):
        closed.append(timeout)

    def record_run(arguments):  # what torchrun's run() would meet: both ways the agent stops workers
        seen["shutdown_timeout"] = arguments.shutdown_timeout
        PContext.close(object())

        class Agent:
            _shutdown_timeout = arguments.shutdown_timeout

            def _shutdown(self, death_sig=None, timeout=30):
                closed.append(timeout)

        LocalElasticAgent._stop_workers(Agent(), None)

    monkeypatch.setattr(PContext, "close", record_close)
    monkeypatch.setattr("torch.distributed.run.run", record_run)
    arguments = launcher.prepare_torchrun_arguments(
        launcher.launch_parser().parse_args(["--nproc_per_node", "2", "--max_restarts", "1", "train.py"]), {}
    )
    assert launcher.run_torchrun(arguments) == 0
    assert seen["shutdown_timeout"] == 5 and closed == [5, 5]
    assert PContext.close is record_close  # put back after the launch
