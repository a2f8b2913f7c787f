"""Fault injection against a cluster of replicas (issue 26, points 3 and 6): is every lost peer named, in time?

    python tools/faults_cluster.py --trials 6 --seconds 900

Three kinds of trial, by turn, each with two replicas of a plain script (gloo on 127.0.0.1):

- save_kill: ``python script.py`` with MirroredStrategy(num_replicas=2) saving DCP checkpoints (every other
  trial asynchronously); replica 1 is killed with SIGKILL while it writes its shard of one checkpoint.
  Replica 0 must stop with a ReplicaLostError naming rank 1, the checkpoint being saved must never be
  listed (a staging folder without its sealed state.json is not restored), and a rerun must resume from
  the newest complete one and reach max_steps;
- early_chief_kill: replica 0 is killed with SIGKILL right after it started replica 1, before it serves the
  group's store. Replica 1 must end within --bound seconds (the collective timeout stays 300 s), naming
  replica 0;
- stopped: ``torchestimator launch --max_restarts 1`` with a 15 s collective timeout; rank 1 is stopped with
  SIGSTOP after step 7. The restarted group must resume from ckpt-4 and finish; the tool reports the
  seconds from the SIGSTOP to the restarted workers' first line (``restart=``, the slowest trial).

The last line is the summary::

    faults_cluster trials=6 named=4 half_published=0 lingering=0 restarted=2 restart_s=32 seconds=...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from faults_common import poll, run_trials  # tools/ is the script's folder (sys.path[0]) or on sys.path

_KINDS = ("save_kill", "early_chief_kill", "stopped")
_DEADLINE_S = 240.0
_ELASTIC_SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "elastic_train_script.py"
_LAUNCH_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TF_CONFIG",
    "TORCHESTIMATOR_STARTED_REPLICA_OF",
)

_SCRIPT = textwrap.dedent('''
    """argv: model_dir, report folder, max_steps, kind (save_kill_sync, save_kill_async, early_chief_kill, none)."""
    import json, os, signal, sys, time
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te
    from torchestimator.checkpoint.dcp_format import ShardWriter
    from torchestimator.distribute import mirrored as mirrored_module

    model_dir, reports, max_steps, kind = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    replica_zero = os.environ.get("TORCHESTIMATOR_STARTED_REPLICA_OF") is None
    if kind.startswith("save_kill") and not replica_zero:  # replica 1 dies while writing its shard of ckpt-8
        original = ShardWriter.write_data
        def write_or_die(self, plan, planner):
            if "ckpt-8-" in str(self.path):
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, plan, planner)
        ShardWriter.write_data = write_or_die
    if kind == "early_chief_kill" and replica_zero:  # replica 0 dies once replica 1 runs, before the store
        start = mirrored_module._start_quiet_replicas
        def start_then_die(num_replicas):
            replicas = start(num_replicas)
            with open(os.path.join(reports, "replica1.pid"), "w") as handle:
                handle.write(str(replicas.processes[0].pid))
            os.kill(os.getpid(), signal.SIGKILL)
        mirrored_module._start_quiet_replicas = start_then_die
    x = np.random.default_rng(0).normal(size=(256, 6)).astype(np.float32)
    y = (x[:, 0] - x[:, 2] > 0).astype(np.int64)

    def model_fn(model, features, labels, mode):
        return te.EstimatorSpec(mode, loss=F.cross_entropy(model(features["x"]), labels))

    config = te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2), save_checkpoints_steps=4,
                          log_step_count_steps=None, progress_bar=False, random_seed=0,
                          async_checkpoint=kind == "save_kill_async")
    estimator = te.Estimator(model_fn=model_fn, model=lambda: nn.Linear(6, 2), model_dir=model_dir, config=config,
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    try:
        estimator.train(te.numpy_input_fn({"x": x}, y, batch_size=16, num_epochs=None, shuffle=True, seed=1),
                        max_steps=max_steps)
    except BaseException as error:  # what each replica raised, for the tool (replica 1's stderr may be gone)
        with open(os.path.join(reports, f"error-{os.getpid()}.json"), "w") as handle:
            json.dump({"type": type(error).__name__, "message": str(error), "at": time.time(),
                       "cause": type(error.__cause__).__name__ if error.__cause__ else None}, handle)
        raise
''')


@dataclass
class Tally:
    trials: int = 0
    named: int = 0
    half_published: int = 0
    lingering: int = 0
    restarted: int = 0
    restart_seconds: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def summary(self, seconds: float) -> str:
        slowest = f"{max(self.restart_seconds):.0f}" if self.restart_seconds else "-"
        return (
            f"faults_cluster trials={self.trials} named={self.named} half_published={self.half_published} "
            f"lingering={self.lingering} restarted={self.restarted} restart_s={slowest} seconds={seconds:.0f}"
        )


def _environment(**extra: str) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if name not in _LAUNCH_VARIABLES}
    environ.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return environ


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def _errors(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("error-*.json"))]


def _checkpoints(model_dir: Path) -> list[str]:
    return (
        sorted(
            (name for name in os.listdir(model_dir) if re.fullmatch(r"ckpt-\d+", name)), key=lambda name: int(name[5:])
        )
        if model_dir.is_dir()
        else []
    )


def _run_script(workdir: Path, model_dir: Path, max_steps: int, kind: str, **extra: str) -> subprocess.Popen:
    script = workdir / "job.py"
    script.write_text(_SCRIPT)
    log = open(workdir / f"{kind}.log", "ab")
    with log:
        return subprocess.Popen(
            [sys.executable, str(script), str(model_dir), str(workdir), str(max_steps), kind],
            env=_environment(**extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
        )


def trial_save_kill(workdir: Path, asynchronous: bool, tally: Tally, bound: float) -> None:
    model_dir, kind = workdir / "model", "save_kill_async" if asynchronous else "save_kill_sync"
    where = f"{kind} ({workdir})"
    process = _run_script(workdir, model_dir, 12, kind)
    try:
        code = process.wait(timeout=_DEADLINE_S)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        tally.problems.append(f"{where}: replica 0 still ran after {_DEADLINE_S:g} s")
        return
    errors = _errors(workdir)
    said = errors[0] if errors else {}
    if code == 0 or said.get("type") != "ReplicaLostError" or "rank 1 (pid" not in said.get("message", ""):
        tally.problems.append(f"{where}: replica 0 exited {code} and raised {said or 'nothing'}")
    else:
        tally.named += 1
    listed = _checkpoints(model_dir)
    staged = [name for name in os.listdir(model_dir) if name.startswith(".tmp-ckpt-8-")] if model_dir.is_dir() else []
    if "ckpt-8" in listed or any((model_dir / name / "state.json").exists() for name in staged):
        tally.half_published += 1
        tally.problems.append(f"{where}: the save that lost a replica was published: {listed}, {staged}")
    rerun = _run_script(workdir, model_dir, 12, "none")
    try:
        rerun_code = rerun.wait(timeout=_DEADLINE_S)
    except subprocess.TimeoutExpired:
        _kill_group(rerun)
        rerun_code = None
    if rerun_code != 0 or _checkpoints(model_dir)[-1:] != ["ckpt-12"]:
        tally.problems.append(f"{where}: the rerun exited {rerun_code} with checkpoints {_checkpoints(model_dir)}")


def trial_early_chief_kill(workdir: Path, tally: Tally, bound: float) -> None:
    where = f"early_chief_kill ({workdir})"
    # The collective timeout stays 300 s: replica 1 must not wait it out.
    process = _run_script(workdir, workdir / "model", 8, "early_chief_kill", TORCHESTIMATOR_COLLECTIVE_TIMEOUT="300")
    try:
        process.wait(timeout=120)
        died = time.monotonic()
        replica = int((workdir / "replica1.pid").read_text())
        if poll(lambda: not _running(replica), died + bound) is None:
            tally.lingering += 1
            tally.problems.append(f"{where}: replica 1 (pid {replica}) still ran {bound:g} s after replica 0 died")
            os.kill(replica, signal.SIGKILL)
            return
        said = (poll(lambda: _errors(workdir), time.monotonic() + 10) or [{}])[0]
        if said.get("type") == "ReplicaLostError" and "replica 0 (pid" in said.get("message", ""):
            tally.named += 1
        else:
            tally.problems.append(f"{where}: replica 1 ended raising {said or 'nothing'}")
    except (subprocess.TimeoutExpired, OSError, ValueError) as error:
        tally.problems.append(f"{where}: {type(error).__name__}: {error}")
    finally:
        _kill_group(process)


def trial_stopped(workdir: Path, tally: Tally, bound: float) -> None:
    """SIGSTOP rank 1 of a launched run: the seconds until the restarted group's first line."""
    where = f"stopped ({workdir})"
    pid_file, log_path = workdir / "paused.pid", workdir / "stopped.log"
    command = [
        sys.executable,
        "-m",
        "torchestimator",
        "launch",
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "1",
        "--monitor_interval",
        "0.2",
        str(_ELASTIC_SCRIPT),
        "--model_dir",
        str(workdir / "model"),
        "--max_steps",
        "12",
        "--pause_rank",
        "1",
        "--pause_at_step",
        "7",
        "--pause_file",
        str(pid_file),
        "--pause_seconds",
        "600",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_environment(TORCHESTIMATOR_COLLECTIVE_TIMEOUT="15"),
        )
    try:
        deadline = time.monotonic() + _DEADLINE_S
        if poll(pid_file.exists, deadline, 0.05) is None:
            tally.problems.append(f"{where}: rank 1 never paused")
            return
        stopped_at = time.monotonic()
        os.kill(int(pid_file.read_text()), signal.SIGSTOP)
        restarted = poll(lambda: b"start attempt=1 rank=" in log_path.read_bytes(), deadline, 0.05)
        if restarted is None:
            tally.problems.append(f"{where}: no restart within {_DEADLINE_S:g} s")
            return
        seconds = time.monotonic() - stopped_at
        tally.restart_seconds.append(seconds)
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        text = log_path.read_text(errors="replace")
        if code != 0 or "start attempt=1 rank=1 step=4" not in text:
            tally.problems.append(f"{where}: the restarted run exited {code}; see {log_path}")
        elif seconds > bound:
            tally.problems.append(f"{where}: the restart took {seconds:.1f} s (bound {bound:g} s)")
        else:
            tally.restarted += 1
    except subprocess.TimeoutExpired:
        tally.problems.append(f"{where}: the restarted run did not finish")
    finally:
        _kill_group(process)


def run_trial(workdir: Path, kind: str, number: int, tally: Tally, bound: float, restart_bound: float) -> None:
    if kind == "save_kill":
        trial_save_kill(workdir, asynchronous=number % 2 == 1, tally=tally, bound=bound)
    elif kind == "early_chief_kill":
        trial_early_chief_kill(workdir, tally, bound)
    else:
        trial_stopped(workdir, tally, restart_bound)


def run(trials: int, seconds: float, kinds: tuple[str, ...], keep: bool, bound: float, restart_bound: float) -> Tally:
    tally = Tally()

    def trial(number: int, workdir: Path) -> None:
        run_trial(workdir, kinds[number % len(kinds)], number // len(kinds), tally, bound, restart_bound)

    run_trials(tally, trials, seconds, keep, "faults_cluster", trial)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="most trials (default 6: each kind twice)")
    parser.add_argument("--seconds", type=float, default=1200.0, help="start no trial after this long (default 1200)")
    parser.add_argument("--kinds", default=",".join(_KINDS), help=f"which faults, of {','.join(_KINDS)}")
    parser.add_argument(
        "--bound",
        type=float,
        default=30.0,
        help="seconds within which replica 1 must end after replica 0 dies (default 30)",
    )
    parser.add_argument(
        "--restart_bound",
        type=float,
        default=45.0,
        help="seconds from SIGSTOP to the restarted group's first line (default 45)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the folders of passing trials too")
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if not kinds or any(kind not in _KINDS for kind in kinds):
        parser.error(f"--kinds takes a comma-separated list of {', '.join(_KINDS)}; received {args.kinds!r}")
    if args.trials < 1 or args.seconds <= 0:
        parser.error("--trials and --seconds must be positive")
    started = time.monotonic()
    tally = run(args.trials, args.seconds, kinds, args.keep, args.bound, args.restart_bound)
    for problem in tally.problems:
        print("problem:", problem)
    for number, seconds in enumerate(tally.restart_seconds):
        print(f"restart {number}: {seconds:.1f} s from SIGSTOP to the restarted group's first line")
    print(tally.summary(time.monotonic() - started))
    return 1 if tally.problems else 0


if __name__ == "__main__":
    sys.exit(main())
