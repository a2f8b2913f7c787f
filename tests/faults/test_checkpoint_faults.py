"""Checkpoint faults (issue 10): kill -9 mid-run and mid-write, damage to every file, full disks.

The runs come from tools/faults_checkpoint.py (the longer version of these
trials): children forked from one forkserver that imported torch once, so the
whole module starts Python twice (the forkserver and one separate process for
the byte-reproducibility check).
"""

from __future__ import annotations

import random
import re
import time
from types import SimpleNamespace

import faults_checkpoint as tool  # tools/ is on sys.path (tests/conftest.py); the forkserver imports it by name
import numpy as np
import pytest

SUMMARY = re.compile(
    r"^faults_checkpoint kill_trials=(\d+) in_write=(\d+) resumed_identical=(\d+) unloadable=(\d+) leftovers=(\d+) "
    r"damage_kinds=(\d+) detected=(\d+) disk_full_points=(\d+) clean_errors=(\d+) resumed_after_full=(\d+) "
    r"reproducible=(yes|no|n/a)$"
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("faults_checkpoint")
    children = tool.Children(workdir / "reports")
    tally = tool.Tally()
    reference, duration = tool.run_reference(children, workdir, tally)
    assert tally.problems == []  # two forked runs of the same training wrote the same bytes
    return SimpleNamespace(children=children, workdir=workdir, reference=reference, duration=duration)


def _deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def test_kill_9_anywhere_then_rerun_ends_byte_identical_with_no_leftovers(runs):
    tally = tool.Tally()
    tool.kill_trials(
        runs.children, runs.workdir, runs.reference, runs.duration, 8, _deadline(60), random.Random(1), tally
    )
    assert tally.problems == []
    assert tally.kill_trials >= 4 and tally.resumed_identical == tally.kill_trials
    assert tally.unloadable == 0 and tally.leftovers == 0


def test_a_separate_process_writes_byte_identical_checkpoint_files(runs):
    tally = tool.Tally()
    tool.check_reproducible(runs.workdir, runs.reference, tally)
    assert tally.reproducible == "yes", tally.problems
    assert set(runs.reference) >= {"model.safetensors", "optimizer.safetensors", "optimizer.json", "state.json"}


def test_damage_to_any_file_falls_back_with_a_warning_or_raises_naming_each(runs):
    tally = tool.Tally()
    tool.damage_trials(runs.children, runs.workdir, tally)
    assert tally.problems == []
    assert tally.damage_kinds >= 100 and tally.detected == tally.damage_kinds


def test_file_size_limit_stops_with_disk_full_naming_path_and_step_then_resumes(runs):
    tally = tool.Tally()
    tool.file_size_limit_points(runs.children, runs.workdir, runs.reference, 4, _deadline(60), tally)
    assert tally.problems == []
    assert tally.disk_full_points >= 3
    assert tally.clean_errors == tally.resumed_after_full == tally.disk_full_points
    assert len(tally.full_at) >= 3, tally.full_at  # different files / steps


def test_full_tmpfs_stops_with_disk_full_naming_path_and_step_then_resumes(runs):
    tally = tool.Tally()
    if not tool.tmpfs_points(runs.children, runs.workdir, runs.reference, 5, _deadline(60), tally):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); the RLIMIT_FSIZE test covers disk full")
    assert tally.problems == []
    assert tally.disk_full_points >= 3
    assert tally.clean_errors == tally.resumed_after_full == tally.disk_full_points


def test_the_script_runs_with_tiny_bounds_and_ends_with_its_summary(runs, tmp_path, capsys):
    # In this process the forkserver is already warm, so the script's own runs start at once.
    status = tool.main(
        ["--trials", "1", "--seconds", "60", "--no-damage", "--no-separate-process", "--workdir", str(tmp_path)]
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = SUMMARY.match(last)
    assert match, last
    assert status == 0
    kill_trials, _, identical, unloadable, leftovers = (int(value) for value in match.groups()[:5])
    assert (kill_trials, identical, unloadable, leftovers) == (1, 1, 0, 0)
    assert match.group(11) == "n/a"


@pytest.fixture
def full_tmpfs(tmp_path):
    """A 1 MiB tmpfs filled up to its last few bytes; skipped where mounting needs root."""
    with tool.small_tmpfs(tmp_path, 1024 * 1024) as mount_point:
        if mount_point is None:
            pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
        (mount_point / "model_dir").mkdir()
        yield mount_point / "model_dir", lambda: _fill(mount_point / "filler")


def _fill(path):
    with open(path, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the writer thread stays quiet
def test_event_files_on_a_full_disk_raise_disk_full_naming_the_file_once(full_tmpfs):
    from torchestimator._io.summary import SummaryWriter
    from torchestimator.checkpoint import DiskFullError

    model_dir, fill = full_tmpfs
    writer = SummaryWriter(model_dir)
    writer.scalar("loss", 1.0, 0)
    writer.flush()
    fill()
    with pytest.raises(DiskFullError, match=r"disk full: could not write .*summaries.* to .*events\.out\.tfevents"):
        for step in range(1, 100_000):  # the background thread's error surfaces at a later call
            writer.scalar("loss", float(step), step)
            if step % 50 == 0:
                writer.flush()
    writer.close()  # quiet: the error was raised once, the file is abandoned


def test_best_json_on_a_full_disk_is_disk_full_naming_it_and_the_step(full_tmpfs, monkeypatch):
    import torchestimator as te
    from torchestimator._policy.best import BestCheckpointPolicy
    from torchestimator._policy.train_and_evaluate import EvalSpec, TrainSpec, train_and_evaluate
    from torchestimator.checkpoint import DiskFullError

    model_dir, fill = full_tmpfs
    estimator, input_fn = tool._estimator(str(model_dir))
    policy = BestCheckpointPolicy("loss")
    update = policy.update

    def update_on_a_full_disk(*arguments):
        fill()  # after the checkpoint and the evaluation were written
        return update(*arguments)

    monkeypatch.setattr(policy, "update", update_on_a_full_disk)
    features = np.random.default_rng(3).normal(size=(8, 6)).astype(np.float32)
    evaluate = te.numpy_input_fn(
        {"x": features}, (features[:, 0] > 0).astype(np.int64), batch_size=8, num_epochs=1, shuffle=False
    )
    with pytest.raises(DiskFullError, match=rf"best-checkpoint record of global step \d+ to {model_dir}/"):
        train_and_evaluate(
            estimator, TrainSpec(input_fn, max_steps=2), EvalSpec(evaluate, throttle_secs=0), best=policy
        )


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the writer thread stays quiet
def test_training_stopped_by_full_event_files_says_disk_full_with_the_path(full_tmpfs):
    import torchestimator as te
    from torchestimator.checkpoint import DiskFullError

    model_dir, fill = full_tmpfs
    estimator, input_fn = tool._estimator(str(model_dir))
    estimator._config = estimator._config.replace(save_summary_steps=1, save_checkpoints_steps=10**9)

    class FillTheDisk(te.Hook):
        def after_step(self, run_context):
            if run_context.state.global_step == 3:  # the event file exists by then
                fill()

    with pytest.raises(DiskFullError, match=rf"disk full: could not write summaries.* to {model_dir}/events"):
        estimator.train(input_fn, hooks=[FillTheDisk()], max_steps=3000)
