"""The start-up agreement (_core/agreement.py): replicas that would start from different states fail before
step 1, on every replica, naming who saw what; and the roster that names a replica that died."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import loss_model_fn

import torchestimator as te
from torchestimator._core import agreement
from torchestimator._core.agreement import ReplicaRoster, ReplicaView, RosterEntry, check_start_agreement, disagreement
from torchestimator._io.atomic import writer_tag
from torchestimator.distribute import OneDeviceStrategy
from torchestimator.errors import ReplicaLostError, ReplicasDisagreeError, TorchEstimatorError
from torchestimator.testing import run_in_processes

PROBE_MARK = "agreement-probe"


def _estimator(model_dir: str, strategy=None) -> te.Estimator:
    config = te.RunConfig(
        train_distribute=strategy,
        save_checkpoints_steps=4,
        log_step_count_steps=None,
        save_summary_steps=None,
        progress_bar=False,
        random_seed=0,
    )
    return te.Estimator(
        model_fn=loss_model_fn,
        model=lambda: nn.Linear(4, 2),
        model_dir=model_dir,
        config=config,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
    )


def _input_fn(input_context=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return te.numpy_input_fn({"x": x}, y, batch_size=8, num_epochs=None, shuffle=True, seed=1)(
        input_context=input_context
    )


def _view(rank: int, **changes) -> ReplicaView:
    values = dict(
        rank=rank,
        host="node0",
        pid=100 + rank,
        model_dir="/shared/model",
        sees_probe=True,
        checkpoint_name="ckpt-40",
        checkpoint_step=40,
        num_replicas=2,
        max_steps=None,
        steps=None,
    )
    values.update(changes)
    return ReplicaView(**values)


# ---------------------------------------------------------------------------- one process


def test_one_replica_costs_nothing(tmp_path):
    strategy = OneDeviceStrategy("cpu")
    strategy.setup()
    model_dir = tmp_path / "not-yet"
    assert check_start_agreement(strategy, str(model_dir), None, max_steps=5) is None
    assert not model_dir.exists()  # no probe, no folder: the chief's own start-up creates it later


def test_equal_views_agree_and_each_difference_is_named():
    assert disagreement([_view(0), _view(1, host="node1", pid=7, model_dir="/mnt/other/spelling")]) is None
    message = disagreement(
        [
            _view(0, model_dir="/a/model"),
            _view(1, host="node1", model_dir="/b/model", sees_probe=False, checkpoint_name=None, checkpoint_step=None),
        ]
    )
    assert "rank 0 (on node0) restores ckpt-40 (step 40) from /a/model" in message
    assert "rank 1 (on node1) finds no checkpoint in /b/model and does not see the probe file" in message
    assert "model_dir must be storage every node sees" in message
    message = disagreement([_view(0, max_steps=40), _view(1, max_steps=50)])
    assert "max_steps=40, steps=None (so it skips training)" in message and "max_steps=50" in message
    assert "same max_steps and steps" in message
    message = disagreement([_view(0), _view(1, checkpoint_name="ckpt-36", checkpoint_step=36)])
    assert "restores ckpt-36 (step 36)" in message and "another run may be writing" in message
    message = disagreement([_view(0), _view(1, num_replicas=3)])
    assert "in a world of 3" in message and "different world sizes" in message


def test_many_ranks_are_grouped_by_what_they_saw():
    views = [_view(rank, host=f"node{rank // 4}") for rank in range(12)]
    views.append(_view(12, host="node9", checkpoint_name=None, checkpoint_step=None))
    message = disagreement(views)
    assert "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 4 more (on node0, node1, node2) restores ckpt-40" in message
    assert "rank 12 (on node9) finds no checkpoint" in message


class _OneOfTwo:
    """Replica ``rank`` of two, its collectives answered in this process: the chief's broadcast is ``chief_sends``
    (or what this replica sends, on the chief); the gather returns this replica's view twice, or raises ``fails``."""

    num_replicas = 2

    def __init__(self, rank: int, chief_sends=None, fails: BaseException | None = None) -> None:
        self.replica_id, self.is_chief = rank, rank == 0
        self.chief_sends, self.fails = chief_sends, fails

    def broadcast_object(self, obj, src=0):
        return obj if self.is_chief else self.chief_sends

    def all_gather_object(self, obj):
        if self.fails is not None:
            raise self.fails
        return [dataclasses.replace(obj, rank=0), dataclasses.replace(obj, rank=1)]


def test_the_chief_creates_model_dir_and_removes_its_probe_even_when_the_gather_fails(tmp_path):
    model_dir = tmp_path / "new" / "model"
    check_start_agreement(_OneOfTwo(0), str(model_dir), None)
    assert model_dir.is_dir() and os.listdir(model_dir) == []
    with pytest.raises(RuntimeError, match="Connection reset"):
        check_start_agreement(_OneOfTwo(0, fails=RuntimeError("Connection reset by peer")), str(model_dir), None)
    assert os.listdir(model_dir) == []


def test_a_chief_that_cannot_write_model_dir_stops_every_replica(tmp_path):
    (tmp_path / "a-file").write_bytes(b"")
    model_dir = str(tmp_path / "a-file" / "model")
    with pytest.raises(PermissionError, match="is not writable, so the replicas cannot check that they share it"):
        check_start_agreement(_OneOfTwo(0), model_dir, None)
    with pytest.raises(ReplicasDisagreeError, match=r"Rank 0 could not write into its model_dir \(NotADirectoryError"):
        check_start_agreement(
            _OneOfTwo(1, chief_sends=("", "NotADirectoryError: [Errno 20] Not a directory")), model_dir, None
        )


def _exiting_child_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def test_roster_names_a_gone_local_replica_and_leaves_other_errors_alone():
    here = writer_tag().split("-h", 1)[1]
    dead_pid = _exiting_child_pid()
    roster = ReplicaRoster(
        (
            RosterEntry(0, "me", writer_tag()),
            RosterEntry(1, "me", f"{dead_pid}-h{here}"),
            RosterEntry(2, "far", "55-h00000000"),
        ),
        own_rank=0,
    )
    assert roster.gone_ranks() == [1]
    lost = roster.lost_replica_error(RuntimeError("anything at all"), step=9)
    assert isinstance(lost, ReplicaLostError) and lost.lost_ranks == (1,) and lost.step == 9
    assert f"rank 1 (pid {dead_pid} on me) is gone" in str(lost)
    assert "rank 2 on far cannot be checked from this host" in str(lost)


def test_roster_recognises_backend_failures_when_no_local_replica_is_gone(monkeypatch):
    monkeypatch.setattr(agreement, "_EXIT_SECONDS", 0.2)  # how long it looks for the local replica to finish exiting
    here = writer_tag().split("-h", 1)[1]
    roster = ReplicaRoster(
        (RosterEntry(0, "me", writer_tag()), RosterEntry(1, "me", f"{os.getppid()}-h{here}")), own_rank=0
    )
    assert roster.gone_ranks() == []
    assert roster.lost_replica_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), step=3) is None
    assert roster.lost_replica_error(te.errors.NanLossDuringTrainingError("gloo nan"), step=3) is None
    reset = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:2: Connection reset by peer.")
    lost = roster.lost_replica_error(reset, step=3)
    assert isinstance(lost, TorchEstimatorError) and lost.lost_ranks == ()
    assert "the replicas on this host (rank 1) still run" in str(lost) and "Connection reset by peer" in str(lost)


# ---------------------------------------------------------------------------- two processes


def _agreement_scenarios(root: str) -> dict:
    """In each of 2 replicas: the agreement's outcome in four set-ups, and what it costs when they agree."""
    agreement.PROBE_VISIBILITY_SECONDS = 0.5  # the replica that cannot see the probe looks again for this long
    strategy = te.MirroredStrategy()
    strategy.setup()
    rank = strategy.replica_id
    results: dict = {"rank": rank}

    def attempt(name, call):
        started = time.monotonic()
        try:
            call()
            results[name] = ("ok", "", time.monotonic() - started)
        except ReplicasDisagreeError as error:
            results[name] = (
                "ReplicasDisagreeError",
                str(error),
                time.monotonic() - started,
                [view.rank for view in error.views],
            )

    shared = os.path.join(root, "shared")
    estimator = _estimator(shared, strategy)
    attempt("shared", lambda: estimator.train(_input_fn, max_steps=8))
    results["shared_latest"] = os.path.basename(estimator.latest_checkpoint())
    results["shared_listing"] = sorted(os.listdir(shared))
    # train() ends without a collective, so the chief may already be placing the next probe below while the
    # other replica still lists: every replica lists before any goes on.
    strategy.barrier()
    checkpoint = estimator.checkpoint_store.restore(load_optimizer=False)
    started = time.monotonic()
    for _ in range(5):
        check_start_agreement(strategy, shared, checkpoint, max_steps=12)
    results["agreement_seconds"] = (time.monotonic() - started) / 5

    # Each rank its own model_dir: rank 0's holds a checkpoint, rank 1's is empty (a node-local disk).
    def train_in(folder):
        return lambda: _estimator(os.path.join(root, folder), strategy).train(_input_fn, max_steps=8)

    attempt("per_rank", train_in(f"node-local-{rank}"))
    attempt("both_empty", train_in(f"empty-{rank}"))
    # The same checkpoint, but max_steps says skip on rank 0 and train on rank 1.
    attempt("max_steps", lambda: check_start_agreement(strategy, shared, checkpoint, max_steps=8 if rank == 0 else 12))
    own = os.path.join(root, f"node-local-{rank}")
    results["per_rank_listing"] = sorted(os.listdir(own)) if os.path.isdir(own) else []
    return results


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    root = tmp_path_factory.mktemp("agreement")
    _estimator(str(root / "node-local-0")).train(_input_fn, max_steps=4)  # one process writes ckpt-4
    shutil.copytree(root / "node-local-0", root / "shared")
    started = time.monotonic()
    per_rank = run_in_processes(_agreement_scenarios, nprocs=2, args=(str(root),), timeout=240)
    return root, per_rank, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.distributed
def test_replicas_sharing_model_dir_agree_and_leave_no_probe(scenarios):
    _, per_rank, _ = scenarios
    for result in per_rank:
        assert result["shared"][0] == "ok"
        assert result["shared_latest"] == "ckpt-8"
        assert not [name for name in result["shared_listing"] if PROBE_MARK in name]
        assert result["agreement_seconds"] < 2.0  # measured: a few ms on 2 gloo processes


@pytest.mark.slow
@pytest.mark.distributed
def test_rank_specific_model_dirs_fail_on_every_rank_naming_both(scenarios):
    root, per_rank, _ = scenarios
    outcomes = [result["per_rank"] for result in per_rank]
    assert [outcome[0] for outcome in outcomes] == ["ReplicasDisagreeError"] * 2
    assert outcomes[0][1] == outcomes[1][1]  # the same message on every replica
    message = outcomes[0][1]
    assert f"rank 0 (on {socket.gethostname()}) restores ckpt-4 (step 4) from {root / 'node-local-0'}" in message
    assert f"rank 1 (on {socket.gethostname()}) finds no checkpoint in {root / 'node-local-1'}" in message
    assert "does not see the probe file" in message and "model_dir must be storage every node sees" in message
    assert [outcome[3] for outcome in outcomes] == [[0, 1], [0, 1]]
    assert all(outcome[2] < 30.0 for outcome in outcomes)  # fails fast: no collective timeout
    for result in per_rank:
        assert not [name for name in result["per_rank_listing"] if PROBE_MARK in name]


@pytest.mark.slow
@pytest.mark.distributed
def test_unshared_empty_model_dirs_fail_on_the_probe(scenarios):
    root, per_rank, _ = scenarios
    for result in per_rank:
        kind, message, seconds, _ = result["both_empty"]
        assert kind == "ReplicasDisagreeError" and seconds < 30.0
        assert f"finds no checkpoint in {root / 'empty-1'} and does not see the probe file" in message
        assert f"finds no checkpoint in {root / 'empty-0'}; rank 1" in message  # rank 0 wrote it, so it sees it


@pytest.mark.slow
@pytest.mark.distributed
def test_a_max_steps_skip_decided_differently_fails_instead_of_hanging(scenarios):
    _, per_rank, _ = scenarios
    for result in per_rank:
        kind, message, _, _ = result["max_steps"]
        assert kind == "ReplicasDisagreeError"
        assert "max_steps=8, steps=None (so it skips training)" in message and "max_steps=12" in message
