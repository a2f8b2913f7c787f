"""A plain ``python train.py`` with MirroredStrategy(num_replicas=2) starts its second replica itself
(distribute/strategy.py, launcher.py): what the program prints shows once (the chief's), the other replica's
standard output goes to a file a log line names, and its errors still show, prefixed with its rank ([rank1]:)
by the chief at the file-descriptor level. The chief notices a replica that exits before the group forms at once,
and the line at exit says what happened to each replica."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from torchestimator.distribute.cluster import TORCHRUN_VARIABLES
from torchestimator.distribute.launcher import REPLICA_FOLDER_PREFIX, STARTED_REPLICA_VARIABLE
from torchestimator.distribute.strategy import COLLECTIVE_TIMEOUT_VARIABLE, REPLICA_STDOUT_VARIABLE

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

    # log_step_count_steps=2: the last step is a logging step, where the loss is averaged over the replicas.
    config = te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2), save_checkpoints_steps=4,
                          progress_bar=False, random_seed=0, log_step_count_steps=2)
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


def _environment(**environ: str) -> dict[str, str]:
    child = {
        name: value
        for name, value in os.environ.items()
        if name
        not in (
            *TORCHRUN_VARIABLES,
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            REPLICA_STDOUT_VARIABLE,
            STARTED_REPLICA_VARIABLE,
            COLLECTIVE_TIMEOUT_VARIABLE,
        )
    }
    child.update(OMP_NUM_THREADS="1", **environ)
    return child


def _run(tmp_path, *arguments: str, **environ: str) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text(PROGRAM)
    environ.setdefault("TMPDIR", str(tmp_path))  # the replica's stdout folder, which stays when it printed
    return subprocess.run(
        [sys.executable, str(tmp_path / "train.py"), str(tmp_path / "run"), *arguments],
        cwd=tmp_path,
        env=_environment(**environ),
        capture_output=True,
        text=True,
        timeout=150,
    )


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
    with open(_stdout_file(completed.stderr)) as replica_output:  # nothing lost: replica 1's is in the file, kept
        assert replica_output.read() == "starting\nglobal step 4\n"
    # The summary lines are the chief's only, with the final loss (the mean over replicas: step 4 logs it).
    assert (
        len(
            re.findall(
                r"^torchestimator: trained .* from step 0 to 4 in [\d.]+ s \(final loss \d\.\d+\)$",
                completed.stderr,
                re.M,
            )
        )
        == 1
    ), completed.stderr
    assert len(re.findall(r"^torchestimator: evaluated .*ckpt-4: accuracy = ", completed.stderr, re.M)) == 1
    # Replica 1's standard error shows here, each line with its rank, and the chief says it failed.
    assert completed.returncode == 1
    lines = completed.stderr.splitlines()
    assert any(re.fullmatch(r"\[rank1\]: .*train\.py:\d+: UserWarning: replica one is unhappy", line) for line in lines)
    assert "[rank1]: Traceback (most recent call last):" in lines, completed.stderr
    assert "[rank1]: ValueError: replica one cannot go on" in lines
    assert re.search(
        r"Replica 1 of 2 \(process \d+\) exited with code 1; its standard error is above, in "
        r"\[rank1\]: lines, ending: ValueError: replica one cannot go on",
        completed.stderr,
    )


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_every_replica_prints_here_when_asked(tmp_path):
    completed = _run(tmp_path, "ok", **{REPLICA_STDOUT_VARIABLE: "all"})
    assert completed.returncode == 0, completed.stderr
    assert sorted(completed.stdout.splitlines()) == ["global step 4", "global step 4", "starting", "starting"]
    assert "standard output goes to" not in completed.stderr


# Strategy-level programs (no training) for how replicas start, fail and are reported: each run is two
# interpreters importing torch, about 10 s here.
SETUP_PROGRAM = textwrap.dedent("""
    import logging, os, sys, threading
    # Configured before anything: the handler holds the sys.stderr of the moment, which no later wrapper reaches.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from torchestimator.distribute import MirroredStrategy

    mode = sys.argv[1]
    if mode == "early" and os.environ.get("TORCHESTIMATOR_STARTED_REPLICA_OF"):
        raise FileNotFoundError("replica one has no data")  # module code failing in the re-run replica only
    strategy = MirroredStrategy(num_replicas=2)
    strategy.setup()
    rank = strategy.replica_id
    if mode == "logged" and rank == 1:
        logging.getLogger("torchestimator").warning("a warning from rank %d", rank)
    if mode == "silent_exit" and rank == 1:
        os._exit(3)  # ends without a word
    if mode == "exit_code" and rank == 1:
        import atexit
        atexit.register(lambda: print("replica one's atexit handler ran", file=sys.stderr))
    if mode == "chief_fails":
        if rank == 0:
            raise RuntimeError("replica zero cannot go on")
        threading.Event().wait(120)  # busy outside any collective: replica 0 has to stop it
    strategy.barrier()
    if rank == 0:
        print("done")
    if mode == "exit_code" and rank == 1:
        sys.exit(3)
""")


def _run_setup_program(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, float]:
    (tmp_path / "setup_program.py").write_text(SETUP_PROGRAM)
    # A collective timeout far beyond the test's: only noticing the replica's exit can end the run in time.
    # TMPDIR: the replica's stdout folder is made here, for the test to see what stays.
    environ = _environment(**{COLLECTIVE_TIMEOUT_VARIABLE: "900"}, TMPDIR=str(tmp_path))
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, str(tmp_path / "setup_program.py"), mode],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=150,
    )
    return completed, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_the_chief_notices_at_once_a_replica_that_exits_before_joining(tmp_path):
    completed, seconds = _run_setup_program(tmp_path, "early")
    assert completed.returncode == 1
    lines = completed.stderr.splitlines()
    # Replica 1's traceback, from its first line, marked with its rank.
    assert "[rank1]: Traceback (most recent call last):" in lines, completed.stderr
    assert "[rank1]: FileNotFoundError: replica one has no data" in lines
    assert re.search(
        r"ReplicaLostError: Replica 1 of 2 \(pid \d+\) exited with code 1 before joining the group; "
        r"its standard error is above, in \[rank1\]: lines, ending: FileNotFoundError: replica one has "
        r"no data\.",
        completed.stderr,
    ), completed.stderr
    assert "torchrun" not in completed.stderr and "rendezvous" not in completed.stderr  # no advice that does not apply
    assert completed.stderr.count("exited with code 1") == 1  # said once, not again at exit
    assert seconds < 120  # not the 900 s collective timeout


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_a_replica_logs_through_a_handler_made_before_training_with_its_rank_and_an_empty_stdout_file_goes(tmp_path):
    completed, _ = _run_setup_program(tmp_path, "logged")
    assert completed.returncode == 0, completed.stderr
    lines = completed.stderr.splitlines()
    assert "[rank1]: WARNING torchestimator: a warning from rank 1" in lines, completed.stderr
    assert "WARNING torchestimator: a warning from rank 1" not in lines  # never unmarked
    assert completed.stdout == "done\n"
    # Replica 1 printed nothing, so its stdout folder did not stay. (The line naming it is an INFO record, which a
    # program that configured logging at WARNING does not show.)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(REPLICA_FOLDER_PREFIX)]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_a_replica_that_exits_without_a_word_is_not_said_to_have_printed_its_error(tmp_path):
    completed, _ = _run_setup_program(tmp_path, "silent_exit")
    assert completed.returncode == 1
    assert re.search(
        r"Replica 1 of 2 \(process \d+\) exited with code 3; it wrote nothing to its standard error\.", completed.stderr
    ), completed.stderr
    assert "printed above" not in completed.stderr and "is above, in [rank1]" not in completed.stderr


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_a_replicas_exit_code_and_atexit_handlers_survive_its_exit_without_finalizing(tmp_path):
    """Replicas run through distribute/_replica_main.py, which ends them with os._exit (tests/test_replica_exit.py):
    sys.exit(3) still reads 3 to the chief, and the program's atexit handler ran before the end."""
    completed, _ = _run_setup_program(tmp_path, "exit_code")
    assert completed.returncode == 1
    assert re.search(
        r"Replica 1 of 2 \(process \d+\) exited with code 3; its standard error is above, in \[rank1\]: "
        r"lines, ending: replica one's atexit handler ran\. Command: \S+ -m torchestimator\.distribute\."
        r"_replica_main \S+setup_program\.py exit_code",
        completed.stderr,
    ), completed.stderr
    assert completed.stdout == "done\n"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_when_the_chief_fails_the_exit_line_says_so_and_that_it_stopped_the_replica(tmp_path):
    completed, _ = _run_setup_program(tmp_path, "chief_fails")
    assert completed.returncode == 1
    assert re.search(
        r"Replica 0 \(this process\) failed \(RuntimeError: replica zero cannot go on; its traceback is "
        r"above\), so it stopped replica 1 of 2 \(process \d+\), still running 5 s later\.",
        completed.stderr,
    ), completed.stderr
    assert "exited with code -15" not in completed.stderr and "printed above" not in completed.stderr


def test_the_relay_marks_every_line_once_and_remembers_the_last(capfd):
    import threading

    from torchestimator.distribute.launcher import _StderrRelay

    read_end, write_end = os.pipe()
    ended = threading.Event()
    relay = _StderrRelay(os.fdopen(read_end, "rb"), 1, ended)
    relay.start()
    os.write(write_end, b"first line\n[rank1]: already marked by torch\nsecond ")
    os.write(write_end, b"half\n\nno newline at the end")
    os.close(write_end)
    relay.join(10)
    assert ended.is_set() and not relay.is_alive()
    assert capfd.readouterr().err.splitlines() == [
        "[rank1]: first line",
        "[rank1]: already marked by torch",
        "[rank1]: second half",
        "[rank1]: ",
        "[rank1]: no newline at the end",
    ]
    assert relay.last_line == "no newline at the end"
    assert relay.what_it_wrote() == ("its standard error is above, in [rank1]: lines, ending: no newline at the end")


class _ExitedProcess:
    pid = 4321
    returncode = 1

    def poll(self):
        return self.returncode


@pytest.mark.parametrize(
    "stderr, ending",
    [
        # The quoted line's own period and the sentence's are one period, not two.
        (b"Traceback (most recent call last):\nTypeError: expected a path, got None.\n", "got None. This process"),
        # Only blank lines: no last line to quote, not "ending: None".
        (b"\n   \n", "it wrote only blank lines to its standard error. This process"),
    ],
    ids=["line_with_a_period", "only_blank_lines"],
)
def test_a_replica_that_exited_is_named_without_none_or_a_double_period(capfd, stderr, ending):
    import threading

    from torchestimator.distribute.launcher import LocalReplicas, _StderrRelay
    from torchestimator.errors import ReplicaLostError

    read_end, write_end = os.pipe()
    relay = _StderrRelay(os.fdopen(read_end, "rb"), 1, threading.Event())
    relay.start()
    os.write(write_end, stderr)
    os.close(write_end)
    relay.join(10)
    capfd.readouterr()
    replicas = LocalReplicas([_ExitedProcess()], ["python", "train.py"], [relay])
    with pytest.raises(ReplicaLostError) as raised:
        replicas.raise_if_exited([1], before="joining the group")
    message = str(raised.value)
    assert message.startswith("Replica 1 of 2 (pid 4321) exited with code 1 before joining the group; "), message
    assert ending in message and ".." not in message and "ending: None" not in message, message


def test_old_replica_stdout_folders_are_pruned_to_the_newest_runs(tmp_path, monkeypatch):
    import tempfile

    from torchestimator.distribute.launcher import replica_stdout_path

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone_pid = 999_999_999  # above any pid_max: no such process
    finished = []
    for age in range(7):  # finished runs, the oldest last
        folder = tmp_path / f"{REPLICA_FOLDER_PREFIX}{gone_pid}-{age}"
        folder.mkdir()
        (folder / "stdout.txt").write_text("output\n")
        os.utime(folder, (time.time() - 60 * age, time.time() - 60 * age))
        finished.append(folder)
    running = tmp_path / f"{REPLICA_FOLDER_PREFIX}{os.getpid()}-old"  # a run whose replica 0 still runs
    running.mkdir()
    os.utime(running, (0, 0))
    foreign = tmp_path / f"{REPLICA_FOLDER_PREFIX}{gone_pid}-foreign"  # holds more than our file: not ours to remove
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    os.utime(foreign, (0, 0))
    path = replica_stdout_path(keep=5)
    assert os.path.dirname(path).startswith(str(tmp_path / f"{REPLICA_FOLDER_PREFIX}{os.getpid()}-"))
    assert [folder.exists() for folder in finished] == [True] * 4 + [False] * 3  # with the new one: 5 runs
    assert running.exists() and foreign.exists()
