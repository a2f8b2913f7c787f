"""kill -9 during saves to an object store: moto's S3 server on 127.0.0.1, the model_dir an s3:// URL.

    python tools/faults_object_store.py --trials 40 --multipart_trials 4 --seconds 900

The S3 server runs in this process; training children are forked from one forkserver that imported torch once
and reach the server through AWS_ENDPOINT_URL, as a user's program does. Two parts, bounded by the trials and
by --seconds:

- kill: the small deterministic run of faults_checkpoint.py (a checkpoint at every step, three kept) is killed
  with SIGKILL: 3 trials in 4 just after a listing shows a save prefix without its state.json, the others at a
  random moment (counted as ``in_write`` when a save prefix without state.json, or one with it that the manifest
  does not list yet, is left). Every checkpoint the store then lists must restore (none
  is chosen and fails), a rerun trains to the end, its last checkpoint's files must equal the uninterrupted
  run's byte for byte, and model_dir must hold nothing but listed checkpoints and the run's files.
- multipart: a run whose model file is bigger than an upload part (5 MiB parts, TORCHESTIMATOR_UPLOAD_PART_BYTES)
  is killed while the store holds an unfinished multipart upload of it; the same checks follow.

The last line is the summary::

    faults_object_store trials=40 in_write=29 resumed_identical=40 unloadable=0 leftovers=0 multipart_trials=4
    killed_in_upload=4 multipart_resumed_identical=4 seconds=S
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import multiprocessing
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STEPS = 16
BIG_STEPS = 4
PART_BYTES = 5 * 2**20
_CHILD_DEADLINE_S = 180.0
_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "TORCHESTIMATOR_UPLOAD_PART_BYTES": str(PART_BYTES),
}


# ----------------------------------------------------------------- the child


def _big_estimator(model_dir: str):
    """A model whose weights (3 M floats, 12 MB) take three upload parts; plain SGD keeps no optimizer tensors."""
    import numpy as np
    import torch

    import torchestimator as te

    rng = np.random.default_rng(0)
    features = rng.normal(size=(64, 6)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(np.int64)
    input_fn = te.numpy_input_fn({"x": features}, labels, batch_size=16, num_epochs=None, shuffle=True, seed=1)

    class Wide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(3000, 1000) * 0.01)
            self.head = torch.nn.Linear(6, 2)

        def forward(self, x):
            return self.head(x) + self.table[:2, :2].sum() * 0

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        return te.EstimatorSpec(mode, loss=torch.nn.functional.cross_entropy(logits, labels))

    config = te.RunConfig(
        save_checkpoints_steps=1,
        keep_checkpoint_max=2,
        save_summary_steps=None,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
        deterministic=True,
    )
    estimator = te.Estimator(
        model_fn=model_fn,
        model=Wide,
        model_dir=model_dir,
        config=config,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
    )
    return estimator, input_fn


def child_train(model_dir: str, report: str, big: bool, environment: dict[str, str]) -> None:
    """Trains the run to its end in this process; writes the outcome as JSON to ``report`` (a local file).

    ``environment``: the server's variables (the forkserver may have started before they were set)."""
    os.environ.update(environment)
    import faults_checkpoint
    import torch

    torch.set_num_threads(1)
    logging.getLogger("torchestimator").setLevel(logging.ERROR)
    outcome: dict[str, object] = {"ok": True}
    try:
        estimator, input_fn = (_big_estimator if big else faults_checkpoint._estimator)(model_dir)
        estimator.train(input_fn, max_steps=BIG_STEPS if big else STEPS)
    except Exception as error:  # reported to the parent, which judges it
        outcome = {"ok": False, "type": type(error).__name__, "message": str(error)}
    with open(report, "w") as handle:
        json.dump(outcome, handle)


# ---------------------------------------------------------------- the parent


@dataclass
class Tally:
    trials: int = 0
    in_write: int = 0
    resumed_identical: int = 0
    unloadable: int = 0
    leftovers: int = 0
    multipart_trials: int = 0
    killed_in_upload: int = 0
    multipart_resumed_identical: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self, seconds: float) -> str:
        return (
            f"faults_object_store trials={self.trials} in_write={self.in_write} "
            f"resumed_identical={self.resumed_identical} unloadable={self.unloadable} leftovers={self.leftovers} "
            f"multipart_trials={self.multipart_trials} killed_in_upload={self.killed_in_upload} "
            f"multipart_resumed_identical={self.multipart_resumed_identical} seconds={seconds:.0f}"
        )


class Children:
    def __init__(self, reports: Path) -> None:
        self.reports, self.count = reports, 0
        self.pids: list[int] = []  # of each child started, in order: a leftover's name carries its writer's pid
        reports.mkdir(parents=True, exist_ok=True)
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["torch", "torch._dynamo", "torchestimator", "s3fs", __name__])

    def start(self, model_dir: str, big: bool = False):
        self.count += 1
        report = self.reports / f"{self.count}.json"
        environment = {name: os.environ[name] for name in [*_ENVIRONMENT, "AWS_ENDPOINT_URL"]}
        process = self.context.Process(target=child_train, args=(model_dir, str(report), big, environment))
        process.start()
        self.pids.append(process.pid)
        return process, report

    def train(self, model_dir: str, big: bool = False) -> dict[str, object]:
        process, report = self.start(model_dir, big)
        process.join(_CHILD_DEADLINE_S)
        if process.is_alive():
            process.kill()
            process.join()
            return {"ok": False, "type": "hung", "message": f"did not end within {_CHILD_DEADLINE_S} s"}
        if not report.exists():
            return {"ok": False, "type": "died", "message": f"exit code {process.exitcode}"}
        return json.loads(report.read_text())


def last_checkpoint_digest(model_dir: str) -> dict[str, str]:
    """sha256 of every file of the newest checkpoint (names without the save's own prefix)."""
    from torchestimator._io import filesystems
    from torchestimator.checkpoint import CheckpointStore

    latest = CheckpointStore(model_dir).latest_checkpoint()
    if latest is None:
        return {}
    return {
        name: hashlib.sha256(filesystems.read_bytes(f"{latest}/{name}")).hexdigest()
        for name in filesystems.listdir(latest)
    }


def unloadable(model_dir: str) -> list[str]:
    """Every checkpoint the store lists must restore: a listed one that fails is the fault this tool hunts."""
    from torchestimator.checkpoint import CheckpointError, CheckpointStore

    store = CheckpointStore(model_dir, keep_checkpoint_max=None)
    failed = []
    for path in store.all_checkpoints():
        try:
            store.restore(path)
        except CheckpointError as error:
            failed.append(f"{path}: {error}")
    return failed


def junk(model_dir: str) -> list[str]:
    """What is neither a listed checkpoint nor one of the run's own files."""
    from torchestimator._io import filesystems
    from torchestimator.checkpoint import CheckpointStore

    listed = {path.rsplit("/", 1)[1] for path in CheckpointStore(model_dir).all_checkpoints()}
    allowed = {"checkpoint", "params.json", "run_config.json"}
    return [
        name
        for name in filesystems.listdir(model_dir)
        if name not in listed and name not in allowed and not name.startswith("events.out.tfevents.")
    ]


def _contents(model_dir: str, name: str) -> str:
    """What a leftover holds: each object's name, size and age, so that a failure says which save left it."""
    from torchestimator._io import filesystems

    fs, inner = filesystems.filesystem(f"{model_dir}/{name}")
    now = time.time()
    described = []
    for key, info in sorted(fs.find(inner, detail=True).items()):
        modified = info.get("LastModified")
        age = f"{now - modified.timestamp():.1f}s ago" if modified is not None else "age unknown"
        described.append(f"{key.rsplit('/', 1)[1]} {info.get('size')} B {age}")
    return ", ".join(described) or "no objects"


def unsealed_prefixes(model_dir: str) -> list[str]:
    from torchestimator._io import filesystems

    names = filesystems.listdir(model_dir) if filesystems.exists(model_dir) else []
    return [
        name for name in names if name.startswith("ckpt-") and not filesystems.exists(f"{model_dir}/{name}/state.json")
    ]


def sealed_not_in_manifest(model_dir: str) -> list[str]:
    """Save prefixes with their state.json that the manifest does not list yet: killed before the manifest's PUT."""
    import json as json_module

    from torchestimator._io import filesystems

    try:
        listed = {
            item["folder"]
            for item in json_module.loads(filesystems.read_bytes(f"{model_dir}/checkpoint"))["checkpoints"]
        }
    except FileNotFoundError:
        listed = set()
    names = filesystems.listdir(model_dir) if filesystems.exists(model_dir) else []
    return [
        name
        for name in names
        if name.startswith("ckpt-") and name not in listed and filesystems.exists(f"{model_dir}/{name}/state.json")
    ]


def open_uploads(bucket: str) -> int:
    """Multipart uploads started and not finished in ``bucket``."""
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    return len(client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))


def kill_trial(
    children: Children,
    model_dir: str,
    reference: dict[str, str],
    duration: float,
    rng: random.Random,
    tally: Tally,
    number: int,
) -> None:
    process, _ = children.start(model_dir)
    if number % 4:  # 3 in 4 aim inside a save: wait until a save prefix without state.json is listed
        deadline = time.monotonic() + 2 * duration
        skip = rng.randint(0, STEPS // 2)  # not always the first save
        while process.is_alive() and time.monotonic() < deadline:
            if unsealed_prefixes(model_dir):
                if skip == 0:
                    break
                skip -= 1
            process.join(0.002)
        process.join(rng.uniform(0.0, 0.004))
    else:  # anywhere in the run
        process.join(rng.uniform(0.05, 1.0) * duration)  # returns early if the run ended
    if process.is_alive():
        os.kill(process.pid, signal.SIGKILL)
    process.join()
    tally.trials += 1
    tally.in_write += bool(unsealed_prefixes(model_dir) or sealed_not_in_manifest(model_dir))
    check_after_kill(children, model_dir, reference, tally, f"kill trial {number}", big=False)


def multipart_trial(
    children: Children, bucket: str, model_dir: str, reference: dict[str, str], tally: Tally, number: int
) -> None:
    process, _ = children.start(model_dir, big=True)
    deadline = time.monotonic() + _CHILD_DEADLINE_S
    # From the second save on, so that an earlier checkpoint exists to fall back to.
    while (
        process.is_alive()
        and time.monotonic() < deadline
        and len(unsealed_prefixes(model_dir)) + len(_listed(model_dir)) < 2 + number % 2
    ):
        process.join(0.05)
    while process.is_alive() and time.monotonic() < deadline and not open_uploads(bucket):
        process.join(0.005)
    in_upload = process.is_alive() and open_uploads(bucket) > 0
    if process.is_alive():
        os.kill(process.pid, signal.SIGKILL)
    process.join()
    tally.multipart_trials += 1
    tally.killed_in_upload += in_upload
    if check_after_kill(children, model_dir, reference, tally, f"multipart trial {number}", big=True):
        tally.multipart_resumed_identical += 1


def _listed(model_dir: str) -> list[str]:
    from torchestimator.checkpoint import CheckpointStore

    return CheckpointStore(model_dir).all_checkpoints()


def check_after_kill(
    children: Children, model_dir: str, reference: dict[str, str], tally: Tally, what: str, *, big: bool
) -> bool:
    failed = unloadable(model_dir)
    tally.unloadable += len(failed)
    tally.problems += [f"{what}: listed but unloadable {name}" for name in failed]
    outcome = children.train(model_dir, big)
    identical = bool(outcome["ok"]) and last_checkpoint_digest(model_dir) == reference
    if identical and not big:
        tally.resumed_identical += 1
    if not identical:
        tally.problems.append(f"{what}: rerun {outcome}, not identical to the uninterrupted run")
    left = junk(model_dir)
    tally.leftovers += len(left)
    # The killed child's pid and the rerun's: which of them wrote the leftover.
    writers = f"killed pid {children.pids[-2]}, rerun pid {children.pids[-1]}" if len(children.pids) > 1 else ""
    tally.problems += [f"{what}: left {name} ({_contents(model_dir, name)}; {writers})" for name in left]
    return identical


def run(settings: argparse.Namespace, workdir: Path) -> Tally:
    from torchestimator._io import filesystems

    tally = Tally()
    rng = random.Random(settings.seed)
    stop_at = time.monotonic() + settings.seconds
    children = Children(workdir / "reports")
    fs, _ = filesystems.filesystem("s3://any")
    bucket = f"faults-{os.getpid()}-{int(time.time())}"
    fs.mkdir(bucket)
    started = time.monotonic()
    if children.train(f"s3://{bucket}/reference")["ok"] is not True:
        raise RuntimeError("the uninterrupted run failed")
    duration = time.monotonic() - started
    reference = last_checkpoint_digest(f"s3://{bucket}/reference")
    for number in range(settings.trials):
        if time.monotonic() > stop_at:
            break
        kill_trial(children, f"s3://{bucket}/kill-{number}", reference, duration, rng, tally, number)
    if settings.multipart_trials and time.monotonic() < stop_at:
        if children.train(f"s3://{bucket}/big-reference", big=True)["ok"] is not True:
            raise RuntimeError("the uninterrupted run of the big model failed")
        big_reference = last_checkpoint_digest(f"s3://{bucket}/big-reference")
        for number in range(settings.multipart_trials):
            if time.monotonic() > stop_at:
                break
            multipart_trial(children, bucket, f"s3://{bucket}/big-{number}", big_reference, tally, number)
    return tally


def parse_settings(arguments: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="kill trials of the small run")
    parser.add_argument("--multipart_trials", type=int, default=4, help="kills during a multipart upload")
    parser.add_argument("--seconds", type=float, default=900.0, help="no trial starts after this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(arguments)


def main(arguments: list[str] | None = None) -> int:
    import tempfile

    settings = parse_settings(arguments)
    started = time.monotonic()
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {name: os.environ.get(name) for name in [*_ENVIRONMENT, "AWS_ENDPOINT_URL"]}
    os.environ.update(_ENVIRONMENT, AWS_ENDPOINT_URL=f"http://{host}:{port}")
    try:
        with tempfile.TemporaryDirectory(prefix="faults_object_store-") as workdir:
            tally = run(settings, Path(workdir))
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    for problem in tally.problems:
        print(problem)
    print(tally.line(time.monotonic() - started))
    return 0 if not tally.problems else 1


if __name__ == "__main__":
    import faults_object_store  # the children's target must be importable by name in the forkserver

    sys.exit(faults_object_store.main())
