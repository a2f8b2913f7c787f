"""export_saved_model after a train() of several replicas: replica 0 writes one version, every caller gets its path.

The rules run in this process with two ReplicaExports of one run (no group needed: no collective is used);
the Estimator's path runs 2 gloo processes, as a plain multi-replica script does.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import classifier_model_fn

import torchestimator as te
from torchestimator.export import TensorSpec, list_versions, load, serving_input_receiver
from torchestimator.export.replicas import ReplicaExports
from torchestimator.testing import run_in_processes


def _input_fn(input_context=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return te.numpy_input_fn({"x": x}, y, batch_size=16, num_epochs=None, shuffle=True, seed=1)(
        input_context=input_context
    )


def _estimator(model_dir, strategy=None):
    config = te.RunConfig(
        train_distribute=strategy,
        save_checkpoints_steps=4,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
    )
    return te.Estimator(
        model_fn=classifier_model_fn,
        model=lambda: nn.Linear(4, 2),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        model_dir=model_dir,
        config=config,
    )


def _receiver():
    return serving_input_receiver({"x": TensorSpec(shape=(None, 4), dtype=torch.float32)})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    estimator = _estimator(str(tmp_path_factory.mktemp("replica_export") / "run"))
    estimator.train(_input_fn, max_steps=4)
    return estimator


# ----------------------------------------------------------------------------- the rules, in this process


def test_replica_0_writes_and_another_replica_returns_that_version(trained, tmp_path):
    base = str(tmp_path / "export")
    chief, other = ReplicaExports("run-a", 0, 2, 5.0), ReplicaExports("run-a", 1, 2, 5.0)
    written = chief.export(trained, base, _receiver())
    assert other.export(trained, base, _receiver()) == written
    assert list_versions(base) == [int(os.path.basename(written))]
    # The n-th call of each replica is replica 0's n-th: a second call waits for a second version.
    ticks, waited = iter(range(100)), []
    with pytest.raises(TimeoutError, match=r"Replica 1 of 2 waited 5 s for replica 0's export"):
        other.export(trained, base, _receiver(), clock=lambda: float(next(ticks)), sleep=waited.append)
    assert waited == [0.1] * 4  # it looked at 1, 2, 3, 4 and 5 s, then gave up, and wrote nothing
    assert len(list_versions(base)) == 1


def test_a_version_of_another_run_or_call_is_never_taken(trained, tmp_path):
    base = str(tmp_path / "export")
    ReplicaExports("earlier-run", 0, 2, 5.0).export(trained, base, _receiver())
    ReplicaExports("run-b", 0, 2, 5.0).export(trained, str(tmp_path / "elsewhere"), _receiver())  # another base
    waiting = ReplicaExports("run-b", 1, 2, 0.3)
    with pytest.raises(TimeoutError, match="call it in every replica with the same arguments, or only in replica 0"):
        waiting.export(trained, base, _receiver())
    # A wrong argument is refused on every replica at once, as replica 0 refuses it, not after the wait.
    with pytest.raises(ValueError, match="no such checkpoint"):
        ReplicaExports("run-b", 1, 2, 60.0).export(trained, base, _receiver(), checkpoint_path=str(tmp_path / "no"))


def test_one_process_writes_a_version_per_call_as_before(trained, tmp_path):
    base = str(tmp_path / "export")
    first = trained.export_saved_model(base, _receiver())
    second = trained.export_saved_model(base, _receiver())
    assert first != second and len(list_versions(base)) == 2
    assert "replica_call" not in json.loads(open(os.path.join(first, "metadata.json")).read())


# ----------------------------------------------------------------------------- two processes


def _train_and_export(model_dir, base, chief_only_base):
    estimator = _estimator(model_dir, te.MirroredStrategy(num_replicas=2))
    estimator.train(_input_fn, max_steps=8)
    first = estimator.export_saved_model(base, _receiver())
    chief_alone_seconds = None
    if estimator.config.train_distribute.is_chief:  # replica 0 alone: nobody waits, nothing hangs
        started = time.monotonic()
        estimator.export_saved_model(chief_only_base, _receiver())
        chief_alone_seconds = time.monotonic() - started
    second = estimator.export_saved_model(base, _receiver(), as_onnx=False)
    return first, second, chief_alone_seconds


@pytest.mark.slow
@pytest.mark.distributed
def test_every_replica_exporting_after_train_writes_one_version_and_gets_its_path(tmp_path):
    base, chief_only = str(tmp_path / "export"), str(tmp_path / "chief_only")
    (first_0, second_0, alone), (first_1, second_1, _) = run_in_processes(
        _train_and_export, nprocs=2, args=(str(tmp_path / "run"), base, chief_only), timeout=180
    )
    assert first_0 == first_1 and second_0 == second_1 and first_0 != second_0
    assert [os.path.join(base, str(version)) for version in list_versions(base)] == [first_0, second_0]
    assert len(list_versions(chief_only)) == 1 and alone < 60
    x = torch.from_numpy(np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32))
    module = nn.Linear(4, 2)
    module.load_state_dict(
        {
            name: torch.from_numpy(_estimator(str(tmp_path / "run")).get_variable_value(name))
            for name in ("weight", "bias")
        }
    )
    np.testing.assert_array_equal(load(first_0)({"x": x.numpy()})["class"], module(x).argmax(-1).numpy())


SCRIPT = """
import sys, numpy as np, torch, torch.nn as nn, torch.nn.functional as F
import torchestimator as te
from torchestimator.export import TensorSpec, serving_input_receiver

def model_fn(model, features, labels, mode):
    logits = model(features["x"])
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)})
    return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)}, loss=F.cross_entropy(logits, labels))

def input_fn(input_context):
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    return te.numpy_input_fn({"x": x}, (x[:, 0] > 0).astype(np.int64), batch_size=16, num_epochs=None,
                             shuffle=True)(input_context=input_context)

config = te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2), save_checkpoints_steps=5,
                      log_step_count_steps=None, progress_bar=False)
estimator = te.Estimator(model_fn=model_fn, model=lambda: nn.Linear(4, 2),
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1), model_dir=sys.argv[1], config=config)
estimator.train(input_fn, max_steps=5)
receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 4), dtype=torch.float32)})
path = estimator.export_saved_model(sys.argv[2], receiver)
print(f"replica {config.train_distribute.replica_id} exported {path}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_a_plain_two_replica_script_exporting_in_every_replica_writes_one_version(tmp_path):
    import subprocess
    import sys

    script, base = tmp_path / "train.py", tmp_path / "export"
    script.write_text(SCRIPT)
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHESTIMATOR_REPLICA_STDOUT": "all"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"):
        environment.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), str(base)],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [version] = list_versions(base)
    for rank in range(2):
        assert f"replica {rank} exported {os.path.join(str(base), str(version))}" in done.stdout, done.stdout
