"""A training script for the fault tests: run under torchrun, or as ``python elastic_train_script.py`` (which
starts its own replicas through MirroredStrategy), as a user's script would be.

Deterministic (RunConfig(deterministic=True, random_seed=...)), with dropout and SGD momentum, so that a run
killed and resumed from its checkpoints must end with the same weights, bit for bit, as one never stopped.
Two ways to fail on purpose, each on one rank:

* ``--pause_rank R --pause_at_step S --pause_file F``: on the first torchrun attempt
  (TORCHELASTIC_RESTART_COUNT=0), rank R writes its pid into F after step S and waits there to be killed
  (kill -9 by the test); it gives up with exit status 3 after ``--pause_seconds``.
* ``--die_rank R --die_at_step S --die_how sigkill|exit``: rank R kills itself after step S
  (SIGKILL, or os._exit(7)), writing the time into ``--die_file`` first.

Every replica prints ``start attempt=<n> rank=<r> step=<global step after restore>`` once restored, and
``failed rank=<r> at=<time.time()> error=<class>`` to stderr when training raises.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(192, 6)).astype(np.float32)
    y = (x[:, 0] - x[:, 2] > 0).astype(np.int64)
    return x, y


def _model_fn(model, features, labels, mode):
    logits = model(features["x"])
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)})
    return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels))


def _build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 2))


def _input_fn(input_context=None):
    x, y = _data()
    return te.numpy_input_fn({"x": x}, y, batch_size=16, num_epochs=None, shuffle=True, seed=11)(
        input_context=input_context
    )


def _write_atomically(path: str, text: str) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


class _ReportStart(te.hooks.Hook):
    """Prints where this replica starts, so the test can see the restart resumed from a checkpoint."""

    def __init__(self, rank: int, attempt: int) -> None:
        self.rank, self.attempt = rank, attempt

    def after_restore(self, state) -> None:
        print(f"start attempt={self.attempt} rank={self.rank} step={state.global_step}", flush=True)


class _PauseToBeKilled(te.hooks.Hook):
    """After ``step``, writes this process's pid to ``pid_file`` and waits for the test's kill -9."""

    def __init__(self, step: int, pid_file: str, seconds: float) -> None:
        self.step, self.pid_file, self.seconds = step, pid_file, seconds

    def after_step(self, run_context) -> None:
        if run_context.global_step != self.step:
            return
        _write_atomically(self.pid_file, str(os.getpid()))
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:  # bounded: the test kills this process long before
            time.sleep(0.05)
        print(f"elastic_train_script: nobody killed pid {os.getpid()} within {self.seconds} s", file=sys.stderr)
        os._exit(3)


class _Die(te.hooks.Hook):
    """After ``step``, records the time and dies the way asked (as kill -9 would, or os._exit)."""

    def __init__(self, step: int, how: str, time_file: str) -> None:
        self.step, self.how, self.time_file = step, how, time_file

    def after_step(self, run_context) -> None:
        if run_context.global_step != self.step:
            return
        _write_atomically(self.time_file, repr(time.time()))
        if self.how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(7)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--max_steps", type=int, required=True)
    parser.add_argument("--num_replicas", type=int, default=None, help="None: the launched world size")
    parser.add_argument("--save_checkpoints_steps", type=int, default=4)
    parser.add_argument("--pause_rank", type=int, default=None)
    parser.add_argument("--pause_at_step", type=int, default=None)
    parser.add_argument("--pause_file", default=None)
    parser.add_argument("--pause_seconds", type=float, default=120.0)
    parser.add_argument("--die_rank", type=int, default=None)
    parser.add_argument("--die_at_step", type=int, default=None)
    parser.add_argument("--die_how", choices=("sigkill", "exit"), default="sigkill")
    parser.add_argument("--die_file", default=None)
    args = parser.parse_args(argv)

    strategy = te.MirroredStrategy(num_replicas=args.num_replicas)
    strategy.setup()  # under a plain python run this starts the other replicas, which run this line too
    rank, attempt = strategy.replica_id, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    hooks: list[te.hooks.Hook] = [_ReportStart(rank, attempt)]
    if args.pause_rank == rank and attempt == 0:
        hooks.append(_PauseToBeKilled(args.pause_at_step, args.pause_file, args.pause_seconds))
    if args.die_rank == rank:
        hooks.append(_Die(args.die_at_step, args.die_how, args.die_file))
    config = te.RunConfig(
        train_distribute=strategy,
        deterministic=True,
        random_seed=7,
        save_checkpoints_steps=args.save_checkpoints_steps,
        keep_checkpoint_max=None,
        log_step_count_steps=None,
        save_summary_steps=None,
        progress_bar=False,
    )
    estimator = te.Estimator(
        model_fn=_model_fn,
        model=_build_model,
        model_dir=args.model_dir,
        config=config,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9),
    )
    try:
        estimator.train(_input_fn, hooks=hooks, max_steps=args.max_steps)
    except BaseException as error:
        # When it failed, for the test to measure how long a dead replica takes to stop the others.
        print(f"failed rank={rank} at={time.time()!r} error={type(error).__name__}", file=sys.stderr, flush=True)
        raise
    print(f"done rank={rank} step={args.max_steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
