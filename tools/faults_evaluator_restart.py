"""Fault injection against a TF_CONFIG job with an evaluator task: whole-job restarts and kill -9.

    python tools/faults_evaluator_restart.py --trials 6 --seconds 900

Each trial runs a chief, a worker and an evaluator (three plain processes, the
same script, the task from TF_CONFIG, gloo on 127.0.0.1) in a fresh model_dir,
then restarts the whole job the way users do, and checks that no run is lost:

- rerun: the first job ends at max_steps, the second has a higher one;
- early_stop: the first job is stopped by the evaluator's early stopping, the
  second is the same job again (it must take no step, and every task ends);
- kill: the first job is killed with SIGKILL (all three tasks) at a random
  moment of its training, the second is the same job again.

The second job's tasks start in one of three orders, by turn: the evaluator
well before the trainers (once it says it waits for their next run), with
them, or after them (once their new run is recorded). A trial passes when
every task of the second job exits 0 within its deadline, the evaluator's
last evaluation is the checkpoint the trainers' new run ended with, the
exporter was told ``is_the_final_export`` at that step, eval/'s steps only
grow, and (early_stop) the newest checkpoint is the first job's last one.

The last line is the summary::

    faults_evaluator_restart trials=6 followed=6 lost_runs=0 failed_tasks=0 stepless_reruns=2 seconds=...
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from faults_common import poll, run_trials  # tools/ is the script's folder (sys.path[0]) or on sys.path

_JOB_DEADLINE_S = 240.0
_TASKS = ("chief", "worker", "evaluator")
_ORDERS = ("before", "with", "after")
_KINDS = ("rerun", "early_stop", "kill")
# What the evaluator logs once it has read model_dir: it waits for a new run, finishes the ended one, or follows
# a run that did not end (killed).
_PAST_START_UP = (b"Waiting for the trainers' next run", b"its job is over", b"Evaluated ")

_SCRIPT = textwrap.dedent('''
    """Every task runs this unchanged; argv: model_dir, result file, max_steps, early-stopping patience."""
    import json, os, sys
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    model_dir, out, max_steps, patience = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
    if task == "evaluator":  # its start-up decisions, for the tool to see when it has looked at model_dir
        import logging
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 6)).astype(np.float32)
    y = (x @ rng.normal(size=6) > 0).astype(np.int64)

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        metrics = {"flat": te.metrics.mean(features["flat"])} if "flat" in features else {}
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels), eval_metric_ops=metrics)

    class Calls:
        name = "calls"
        def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
            os.makedirs(export_path, exist_ok=True)
            with open(os.path.join(export_path, "calls.jsonl"), "a") as calls:
                calls.write(json.dumps({"step": eval_result["global_step"], "final": is_the_final_export}) + "\\n")
            return checkpoint_path

    config = te.RunConfig(train_distribute=te.MirroredStrategy(), save_checkpoints_steps=4, keep_checkpoint_max=4,
                          log_step_count_steps=None, progress_bar=False, random_seed=0)
    estimator = te.Estimator(model_fn=model_fn, model=lambda: nn.Linear(6, 2),
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1), model_dir=model_dir, config=config)
    results, _ = te.train_and_evaluate(
        estimator,
        te.TrainSpec(te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=0),
                     max_steps=max_steps),
        te.EvalSpec(te.numpy_input_fn({"x": x[:64], "flat": np.zeros(64, np.float32)}, y[:64], batch_size=32,
                                      num_epochs=1, shuffle=False), steps=None, start_delay_secs=0,
                    throttle_secs=0, exporters=[Calls()]),
        early_stopping=te.EarlyStopping("flat", mode="max", patience=patience))  # a flat metric never improves
    with open(out, "w") as handle:
        json.dump({"task": task, "evaluated_step": None if results is None else results["global_step"]}, handle)
''')


@dataclass
class Tally:
    trials: int = 0
    followed: int = 0
    lost_runs: int = 0
    failed_tasks: int = 0
    stepless_reruns: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self, seconds: float) -> str:
        return (
            f"faults_evaluator_restart trials={self.trials} followed={self.followed} lost_runs={self.lost_runs} "
            f"failed_tasks={self.failed_tasks} stepless_reruns={self.stepless_reruns} seconds={seconds:.0f}"
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Job:
    """The three tasks of one job over one model_dir; each writes its log and its result file into ``workdir``."""

    def __init__(self, workdir: Path, model_dir: Path, max_steps: int, patience: int, name: str) -> None:
        self.workdir, self.model_dir, self.name = workdir, model_dir, name
        self.arguments = [str(max_steps), str(patience)]
        ports = {task: f"127.0.0.1:{_free_port()}" for task in _TASKS}
        self.cluster = {task: [address] for task, address in ports.items()}
        self.processes: dict[str, subprocess.Popen] = {}
        self.script = workdir / "job.py"
        self.script.write_text(_SCRIPT)

    def start(self, task: str) -> None:
        environ = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "TORCHESTIMATOR_COLLECTIVE_TIMEOUT": "60",
            "TF_CONFIG": json.dumps({"cluster": self.cluster, "task": {"type": task, "index": 0}}),
        }
        for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            environ.pop(variable, None)
        self.result(task).unlink(missing_ok=True)
        with open(self.log(task), "wb") as log:
            self.processes[task] = subprocess.Popen(
                [sys.executable, str(self.script), str(self.model_dir), str(self.result(task)), *self.arguments],
                env=environ,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )

    def log(self, task: str) -> Path:
        return self.workdir / f"{self.name}.{task}.log"

    def result(self, task: str) -> Path:
        return self.workdir / f"{self.name}.{task}.json"

    def wait(self, deadline: float) -> dict[str, int | None]:
        """Every task's exit status; those still running at ``deadline`` are killed and reported as None."""
        codes: dict[str, int | None] = {}
        for task, process in self.processes.items():
            try:
                codes[task] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[task] = None
        self.kill()
        return codes

    def kill(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)


def _training_run(model_dir: Path) -> dict | None:
    try:
        return json.loads((model_dir / "training_run.json").read_text())
    except (OSError, ValueError):
        return None


def _checkpoint_steps(model_dir: Path) -> list[int]:
    if not model_dir.is_dir():
        return []
    return sorted(int(name[5:]) for name in os.listdir(model_dir) if name.startswith("ckpt-") and name[5:].isdigit())


def _export_calls(model_dir: Path) -> list[dict]:
    path = model_dir / "export" / "calls" / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _start_in_order(job: Job, order: str, earlier_run: str | None, deadline: float) -> None:
    """Starts the job's three tasks: the evaluator before the trainers, with them, or after them."""
    if order == "before":
        job.start("evaluator")
        poll(
            lambda: (
                any(sign in job.log("evaluator").read_bytes() for sign in _PAST_START_UP)
                or job.processes["evaluator"].poll() is not None
            ),
            deadline,
        )
    if order in ("before", "with"):
        job.start("chief"), job.start("worker")
    if order == "with":
        job.start("evaluator")
    if order == "after":
        job.start("chief"), job.start("worker")
        poll(lambda: (_training_run(job.model_dir) or {}).get("run_id") not in (None, earlier_run), deadline)
        job.start("evaluator")


def run_trial(workdir: Path, kind: str, order: str, rng: random.Random, tally: Tally) -> None:
    """One first job and its restart (see the module docstring); what went wrong goes to ``tally.problems``."""
    model_dir = workdir / "model"
    first_steps, patience = (16, 2) if kind == "early_stop" else (16, 1000)
    first = Job(workdir, model_dir, 1000 if kind == "early_stop" else first_steps, patience, "first")
    deadline = time.monotonic() + _JOB_DEADLINE_S
    for task in _TASKS:
        first.start(task)
    if kind == "kill":  # somewhere in its training, once it has checkpoints
        poll(lambda: len(_checkpoint_steps(model_dir)) >= 1 + rng.randrange(3), deadline, 0.02)
        first.kill()
    elif any(code != 0 for code in first.wait(deadline).values()):
        tally.problems.append(f"{kind}/{order}: the first job failed; see {workdir}/first.*.log")
        first.kill()
        return
    earlier = _training_run(model_dir) or {}
    before_restart = _checkpoint_steps(model_dir)
    second_steps = {"rerun": 2 * first_steps, "early_stop": 1000, "kill": first_steps}[kind]
    second = Job(workdir, model_dir, second_steps, patience, "second")
    deadline = time.monotonic() + _JOB_DEADLINE_S
    _start_in_order(second, order, earlier.get("run_id"), deadline)
    codes = second.wait(deadline)
    where = f"{kind}/{order} ({workdir})"
    failed = [task for task, code in codes.items() if code != 0]
    tally.failed_tasks += len(failed)
    if failed:
        tally.problems.append(f"{where}: tasks {failed} of the restarted job exited {[codes[t] for t in failed]}")
        return
    run = _training_run(model_dir) or {}
    evaluated = json.loads(second.result("evaluator").read_text())["evaluated_step"]
    finals = [call["step"] for call in _export_calls(model_dir) if call["final"]]
    if run.get("run_id") == earlier.get("run_id") or run.get("end_step") is None:
        tally.problems.append(f"{where}: the restarted job recorded no run of its own: {run}")
    elif evaluated != run["end_step"] or not finals or finals[-1] != run["end_step"]:
        tally.lost_runs += 1
        tally.problems.append(
            f"{where}: the run ended at {run['end_step']}, the evaluator's last evaluation was at "
            f"{evaluated}, final exports at {finals}"
        )
    else:
        tally.followed += 1
    if kind == "early_stop":
        if _checkpoint_steps(model_dir)[-1:] == before_restart[-1:] and run.get("end_cause") == "early_stopping":
            tally.stepless_reruns += 1
        else:
            tally.problems.append(
                f"{where}: the rerun after early stopping trained on: checkpoints "
                f"{before_restart} -> {_checkpoint_steps(model_dir)}, run {run}"
            )


def run(trials: int, seconds: float, seed: int, keep: bool, kinds_wanted: tuple[str, ...] = _KINDS) -> Tally:
    rng, tally = random.Random(seed), Tally()
    kinds = [(kind, order) for order in _ORDERS for kind in kinds_wanted]

    def trial(number: int, workdir: Path) -> None:
        run_trial(workdir, *kinds[number % len(kinds)], rng, tally)

    run_trials(tally, trials, seconds, keep, "faults_evaluator_restart", trial)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=9, help="most trials (default 9: each kind in each order)")
    parser.add_argument("--seconds", type=float, default=1200.0, help="start no trial after this long (default 1200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the model_dirs and logs of passing trials too")
    parser.add_argument("--kinds", default=",".join(_KINDS), help=f"which restarts, of {','.join(_KINDS)}")
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if not kinds or any(kind not in _KINDS for kind in kinds):
        parser.error(f"--kinds takes a comma-separated list of {', '.join(_KINDS)}; received {args.kinds!r}")
    if args.trials < 1 or args.seconds <= 0:
        parser.error("--trials and --seconds must be positive")
    started = time.monotonic()
    tally = run(args.trials, args.seconds, args.seed, args.keep, kinds)
    for problem in tally.problems:
        print("problem:", problem)
    print(tally.summary(time.monotonic() - started))
    return 1 if tally.problems else 0


if __name__ == "__main__":
    sys.exit(main())
