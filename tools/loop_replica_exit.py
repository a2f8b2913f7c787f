"""Runs a 2-replica plain script many times and counts the runs a replica aborted at exit.

    python tools/loop_replica_exit.py --runs 300 --hogs 2

Each run is what tests/test_replica_output.py runs: ``python train.py`` with ``MirroredStrategy(num_replicas=2)``
(the script starts its second replica itself), two training steps, an evaluation with metrics synchronised across
the replicas (accuracy's sums, AUC's concatenated states), an export-free exit. A replica used to end with
SIGABRT ("terminate called without an active exception") after its work in about 1 run of 5 of the test file:
a C++ thread of torch took the GIL while the interpreter finalized (see distribute/_replica_main.py).

``--hogs N`` starts N busy-looping processes for the duration (and stops them), so that the replicas' threads
are descheduled at awkward moments, as on a loaded CI machine. ``--source DIR`` runs another tree's package
(``DIR`` is its ``src``: e.g. a ``git worktree`` of an earlier commit) to measure the rate before a change.

A run counts as an abort when the chief's status is SIGABRT or its standard error (where each replica's shows,
marked ``[rankN]:``) says "terminate called" or SIGABRT; as a failure when it ends otherwise than with status 0
and the expected output. The loop stops starting runs after ``--seconds``. The last line is the summary::

    loop_replica_exit runs=300 aborts=0 failures=0 hogs=2 seconds=1234.5
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    import torch.nn.functional as F
    import torchestimator as te

    features = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        scores = logits.softmax(-1)[:, 1]
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels), eval_metric_ops={
            "accuracy": te.metrics.accuracy(labels, logits.argmax(-1)), "auc": te.metrics.auc(labels, scores)})

    config = te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2), save_checkpoints_steps=2,
                          progress_bar=False, random_seed=0, log_step_count_steps=2)
    estimator = te.Estimator(model_fn=model_fn, model=lambda: torch.nn.Linear(4, 2),
                             optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.5),
                             model_dir=sys.argv[1], config=config)
    estimator.train(te.numpy_input_fn({"x": features}, labels, batch_size=8, num_epochs=None, shuffle=True, seed=0),
                    max_steps=2)
    results = estimator.evaluate(te.numpy_input_fn({"x": features}, labels, batch_size=16, num_epochs=1,
                                                   shuffle=False))
    print("global step", results["global_step"])
""")

EXPECTED_STDOUT = "global step 2\n"

_CLEARED = (
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "TF_CONFIG",
    "TORCHESTIMATOR_STARTED_REPLICA_OF",
    "TORCHESTIMATOR_REPLICA_STDOUT",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="how many runs (default 300)")
    parser.add_argument("--hogs", type=int, default=0, help="busy-looping processes beside the runs (default 0)")
    parser.add_argument(
        "--seconds", type=float, default=3 * 3600.0, help="start no run after this many seconds (default 3 hours)"
    )
    parser.add_argument("--source", help="the src folder of the torchestimator to run (default: the installed one)")
    parser.add_argument("--show", type=int, default=3, help="print the standard error of the first N bad runs")
    arguments = parser.parse_args(argv)

    started = time.monotonic()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(arguments.hogs)]
    runs = aborts = failures = 0
    try:
        with tempfile.TemporaryDirectory(prefix="loop_replica_exit-") as folder:
            program = os.path.join(folder, "train.py")
            with open(program, "w") as file:
                file.write(PROGRAM)
            environ = _environment(folder, arguments.source)
            while runs < arguments.runs and time.monotonic() - started < arguments.seconds:
                runs += 1
                verdict, stderr = _one_run(program, os.path.join(folder, f"run{runs}"), environ)
                aborts += verdict == "abort"
                failures += verdict == "failure"
                if verdict != "ok":
                    print(f"run {runs}: {verdict}", file=sys.stderr, flush=True)
                    if aborts + failures <= arguments.show:
                        print(textwrap.indent(stderr[-3000:], "    "), file=sys.stderr, flush=True)
                if runs % 10 == 0:
                    print(
                        f"... {runs} runs, {aborts} aborts, {failures} failures, {time.monotonic() - started:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(
        f"loop_replica_exit runs={runs} aborts={aborts} failures={failures} hogs={arguments.hogs} "
        f"seconds={time.monotonic() - started:.1f}",
        flush=True,
    )
    return 1 if aborts or failures else 0


def _environment(folder: str, source: str | None) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if name not in _CLEARED}
    environ.update(OMP_NUM_THREADS="1", TMPDIR=folder)  # TMPDIR: the replica's stdout file, removed with the folder
    if source is not None:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(source), environ.get("PYTHONPATH")]))
    return environ


def _one_run(program: str, model_dir: str, environ: dict[str, str]) -> tuple[str, str]:
    """'ok', 'abort' or 'failure', and the run's standard error."""
    try:
        completed = subprocess.run(
            [sys.executable, program, model_dir],
            env=environ,
            capture_output=True,
            text=True,
            timeout=180,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr
        return "failure", f"timed out after 180 s\n{stderr or ''}"
    if (
        completed.returncode == -signal.SIGABRT
        or "terminate called" in completed.stderr
        or "SIGABRT" in completed.stderr
    ):
        return "abort", completed.stderr
    if completed.returncode != 0 or completed.stdout != EXPECTED_STDOUT:
        return "failure", f"status {completed.returncode}, stdout {completed.stdout!r}\n{completed.stderr}"
    return "ok", completed.stderr


if __name__ == "__main__":
    sys.exit(main())
