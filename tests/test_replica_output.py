"""A plain ``python train.py`` with MirroredStrategy(num_replicas=2) starts its second replica itself
(distribute/strategy.py): what the program prints shows once (the chief's), the other replica's standard
output goes to a file a log line names, and its errors still show, prefixed with its rank ([rank1]:)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from torchestimator.distribute.cluster import TORCHRUN_VARIABLES
from torchestimator.distribute.strategy import REPLICA_STDOUT_VARIABLE

PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchestimator as te

    model_dir, fail = sys.argv[1], sys.argv[2] == "fail"
    print("starting")  # before setup: every replica runs it
    rng = np.random.default_rng(0)
    features = rng.normal(size=(64, 4)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels),
                                eval_metric_ops={"accuracy": te.metrics.accuracy(labels, logits.argmax(-1))})

    config = te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2), save_checkpoints_steps=4,
                          progress_bar=False, random_seed=0)
    estimator = te.Estimator(model_fn=model_fn, model=lambda: torch.nn.Linear(4, 2),
                             optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.5),
                             model_dir=model_dir, config=config)
    estimator.train(te.numpy_input_fn({"x": features}, labels, batch_size=16, num_epochs=None, shuffle=True,
                                      seed=0), max_steps=4)
    results = estimator.evaluate(te.numpy_input_fn({"x": features}, labels, batch_size=32, num_epochs=1,
                                                       shuffle=False))
    print("global step", results["global_step"])
    if fail and config.train_distribute.replica_id == 1:
        import warnings
        warnings.warn("replica one is unhappy")
        raise ValueError("replica one cannot go on")
""")


def _run(tmp_path, *arguments: str, **environ: str) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text(PROGRAM)
    child = {name: value for name, value in os.environ.items()
             if name not in (*TORCHRUN_VARIABLES, "LOCAL_RANK", "LOCAL_WORLD_SIZE", REPLICA_STDOUT_VARIABLE)}
    child.update(OMP_NUM_THREADS="1", **environ)
    return subprocess.run([sys.executable, str(tmp_path / "train.py"), str(tmp_path / "run"), *arguments],
                          cwd=tmp_path, env=child, capture_output=True, text=True, timeout=150)


def _stdout_file(stderr: str) -> str:
    found = re.search(r"torchestimator: replica 1: standard output goes to (\S+); errors show here", stderr)
    assert found, stderr
    return found.group(1)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_a_plain_script_prints_its_results_once_and_a_failing_replica_still_shows_its_error(tmp_path):
    completed = _run(tmp_path, "fail")  # replica 1 warns and raises after printing its results
    assert completed.stdout == "starting\nglobal step 4\n"  # once: the chief's
    with open(_stdout_file(completed.stderr)) as replica_output:  # nothing lost: replica 1's is in the file
        assert replica_output.read() == "starting\nglobal step 4\n"
    # The summary lines are the chief's only.
    assert len(re.findall(r"^torchestimator: trained .* from step 0 to 4 in", completed.stderr, re.M)) == 1
    assert len(re.findall(r"^torchestimator: evaluated .*ckpt-4: accuracy = ", completed.stderr, re.M)) == 1
    # Replica 1's standard error shows here, each line with its rank, and the chief says it failed.
    assert completed.returncode == 1
    lines = completed.stderr.splitlines()
    assert any(re.fullmatch(r"\[rank1\]: .*train\.py:\d+: UserWarning: replica one is unhappy", line) for line in lines)
    assert "[rank1]: Traceback (most recent call last):" in lines, completed.stderr
    assert "[rank1]: ValueError: replica one cannot go on" in lines
    assert re.search(r"Replica 1 of 2 \(process \d+\) exited with code 1", completed.stderr)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_every_replica_prints_here_when_asked(tmp_path):
    completed = _run(tmp_path, "ok", **{REPLICA_STDOUT_VARIABLE: "all"})
    assert completed.returncode == 0, completed.stderr
    assert sorted(completed.stdout.splitlines()) == ["global step 4", "global step 4", "starting", "starting"]
    assert "standard output goes to" not in completed.stderr
