"""Fault injection against checkpoints and model_dir: kill -9, damaged files, full disks.

    python tools/faults_checkpoint.py --trials 40 --seconds 300

Every run trains the same small deterministic model (dropout, shuffled numpy
input, a checkpoint at every step, three kept) in a child process forked from
one forkserver that has imported torch once, so a trial costs milliseconds to
start. Three parts, each bounded by --trials and the overall --seconds:

- kill: a child is killed with SIGKILL at a random time (mostly inside
  checkpoint writes, which take most of each step), every checkpoint left is
  restored, then a rerun trains to the end: its last checkpoint must be byte
  for byte the uninterrupted run's, and model_dir must hold no temporary name.
- damage: each file of the newest checkpoint (and the manifest) is truncated,
  flipped, deleted, replaced by garbage or by JSON of the wrong shape, and
  state.json's values are edited, one at a time: restore must fall back with a
  warning naming the damaged checkpoint, or (damage to every checkpoint) raise
  a CheckpointError naming each. Never a silent restore.
- disk full: the child trains under RLIMIT_FSIZE (SIGXFSZ ignored) and, as
  root, on a small tmpfs filled to leave a little room: it must stop with a
  DiskFullError naming the path and the step, and after the space is freed the
  rerun must end byte for byte as the uninterrupted run.

Also checked: a second, separate Python process training the same run writes
byte-identical checkpoint files (sha256 of every file).

The last line is the summary::

    faults_checkpoint kill_trials=40 in_write=31 resumed_identical=40 unloadable=0 leftovers=0 damage_kinds=K
    detected=K disk_full_points=N clean_errors=N resumed_after_full=N reproducible=yes
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

STEPS = 16
"""Steps of every training run; a checkpoint is written at each."""
_CHILD_DEADLINE_S = 120.0


# ----------------------------------------------------------------- the child


def _estimator(model_dir: str):
    import numpy as np
    import torch

    import torchestimator as te

    rng = np.random.default_rng(0)
    features = rng.normal(size=(96, 6)).astype(np.float32)
    labels = (features[:, 0] + features[:, 1] > 0).astype(np.int64)
    input_fn = te.numpy_input_fn({"x": features}, labels, batch_size=16, num_epochs=None, shuffle=True, seed=1)

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)}, loss=loss)

    def build_model():
        return torch.nn.Sequential(
            torch.nn.Linear(6, 12),
            torch.nn.BatchNorm1d(12),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.3),
            torch.nn.Linear(12, 2),
        )

    config = te.RunConfig(
        save_checkpoints_steps=1,
        keep_checkpoint_max=3,
        save_summary_steps=4,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
        deterministic=True,
    )
    estimator = te.Estimator(
        model_fn=model_fn,
        model=build_model,
        model_dir=model_dir,
        config=config,
        optimizer=lambda parameters: torch.optim.Adam(parameters, lr=0.01),
    )
    return estimator, input_fn


def child_train(model_dir: str, report: str, file_size_limit: int | None = None) -> None:
    """Trains the run to STEPS in this process; writes the outcome as JSON to `report` (outside model_dir)."""
    import resource

    import torch

    from torchestimator.checkpoint.errors import DiskFullError

    torch.set_num_threads(1)
    logging.getLogger("torchestimator").setLevel(logging.ERROR)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if file_size_limit is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit then fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, hard))
    outcome: dict[str, object] = {"ok": True}
    try:
        estimator, input_fn = _estimator(model_dir)
        estimator.train(input_fn, max_steps=STEPS)
    except Exception as error:  # reported to the parent, which judges it
        outcome = {
            "ok": False,
            "type": type(error).__name__,
            "errno": getattr(error, "errno", None),
            "message": str(error),
            "disk_full": isinstance(error, DiskFullError),
        }
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    with open(report, "w") as handle:
        json.dump(outcome, handle)


# ---------------------------------------------------------------- the parent


class Children:
    """Starts training children forked from one forkserver (torch is imported there once)."""

    def __init__(self, reports: Path) -> None:
        self._reports_folder = reports  # never on a file system a trial fills up
        reports.mkdir(parents=True, exist_ok=True)
        self._context = multiprocessing.get_context("forkserver")
        # torch._dynamo: use_deterministic_algorithms imports it, 4 s a child would otherwise spend.
        self._context.set_forkserver_preload(["torch", "torch._dynamo", "torchestimator", __name__])
        self._reports = 0

    def start(self, model_dir: Path, file_size_limit: int | None = None):
        self._reports += 1
        report = self._reports_folder / f"{model_dir.name}-{self._reports}.json"
        process = self._context.Process(target=child_train, args=(str(model_dir), str(report), file_size_limit))
        process.start()
        return process, report

    def train(self, model_dir: Path, file_size_limit: int | None = None) -> dict[str, object]:
        """Runs a child to its end; returns its outcome."""
        process, report = self.start(model_dir, file_size_limit)
        process.join(_CHILD_DEADLINE_S)
        if process.is_alive():
            process.kill()
            process.join()
            raise RuntimeError(f"training child for {model_dir} did not end within {_CHILD_DEADLINE_S} s")
        if not report.exists():
            return {"ok": False, "type": "died", "message": f"exit code {process.exitcode}", "errno": None}
        return json.loads(report.read_text())


def checkpoint_digest(model_dir: Path, step: int = STEPS) -> dict[str, str]:
    """sha256 of every file of ckpt-<step>."""
    folder = model_dir / f"ckpt-{step}"
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in sorted(os.listdir(folder))}


def temporary_names(model_dir: Path) -> list[str]:
    """Names the framework writes only while it works (all start with a dot)."""
    return sorted(name for name in os.listdir(model_dir) if name.startswith("."))


def unloadable_checkpoints(model_dir: Path) -> list[str]:
    from torchestimator.checkpoint import CheckpointError, CheckpointStore

    store = CheckpointStore(model_dir, keep_checkpoint_max=None)
    failed = []
    for name in sorted(os.listdir(model_dir)):
        if name.startswith("ckpt-"):
            try:
                store.restore(str(model_dir / name))
            except CheckpointError as error:
                failed.append(f"{name}: {error}")
    return failed


@dataclass
class Tally:
    kill_trials: int = 0
    in_write: int = 0
    resumed_identical: int = 0
    unloadable: int = 0
    leftovers: int = 0
    damage_kinds: int = 0
    detected: int = 0
    disk_full_points: int = 0
    clean_errors: int = 0
    resumed_after_full: int = 0
    reproducible: str = "n/a"
    problems: list[str] = field(default_factory=list)
    full_at: set[str] = field(default_factory=set)
    """Where the disk-full errors struck: file@step."""

    def line(self) -> str:
        return (
            f"faults_checkpoint kill_trials={self.kill_trials} in_write={self.in_write} "
            f"resumed_identical={self.resumed_identical} unloadable={self.unloadable} leftovers={self.leftovers} "
            f"damage_kinds={self.damage_kinds} detected={self.detected} disk_full_points={self.disk_full_points} "
            f"clean_errors={self.clean_errors} resumed_after_full={self.resumed_after_full} "
            f"reproducible={self.reproducible}"
        )


def run_reference(children: Children, workdir: Path, tally: Tally) -> tuple[dict[str, str], float]:
    """The uninterrupted run: its last checkpoint's digest, and how long a child takes once the forkserver is warm
    (a second run, which must write the same bytes)."""
    durations, digests = [], []
    for name in ("reference", "reference-again"):
        started = time.monotonic()
        outcome = children.train(workdir / name)
        if not outcome["ok"]:
            raise RuntimeError(f"the reference run failed: {outcome}")
        durations.append(time.monotonic() - started)
        digests.append(checkpoint_digest(workdir / name))
    if digests[0] != digests[1]:
        tally.problems.append(f"two runs of the same training wrote different bytes: {digests}")
    return digests[0], durations[1]


def check_reproducible(workdir: Path, reference: dict[str, str], tally: Tally) -> None:
    """A fresh Python process (not forked) writes the same bytes as the reference."""
    model_dir = workdir / "separate-process"
    subprocess.run([sys.executable, __file__, "--child", str(model_dir)], check=True, timeout=_CHILD_DEADLINE_S)
    same = checkpoint_digest(model_dir) == reference
    tally.reproducible = "yes" if same else "no"
    if not same:
        tally.problems.append(f"a separate process wrote other bytes: {checkpoint_digest(model_dir)} vs {reference}")


def kill_trials(
    children: Children,
    workdir: Path,
    reference: dict[str, str],
    duration: float,
    trials: int,
    deadline: float,
    rng: random.Random,
    tally: Tally,
) -> None:
    for trial in range(trials):
        if time.monotonic() > deadline:
            break
        model_dir = workdir / f"kill-{trial}"
        process, _ = children.start(model_dir)
        if trial % 4:  # 3 in 4 aim inside a checkpoint write: wait for a staging folder, then a few ms more
            _wait_for_staging(
                process, model_dir, rng.randint(2, STEPS - 1), started=time.monotonic(), limit=2 * duration
            )
            process.join(rng.uniform(0.0, 0.006))
        else:  # anywhere in the run
            process.join(rng.uniform(0.05, 1.0) * duration)  # returns early if the run ended
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
        process.join()
        tally.kill_trials += 1
        if model_dir.exists():
            tally.in_write += bool(temporary_names(model_dir))
            failed = unloadable_checkpoints(model_dir)
            tally.unloadable += len(failed)
            tally.problems += [f"kill trial {trial}: unloadable {name}" for name in failed]
        outcome = children.train(model_dir)
        if outcome["ok"] and checkpoint_digest(model_dir) == reference:
            tally.resumed_identical += 1
        else:
            tally.problems.append(f"kill trial {trial}: rerun {outcome}, not identical to the uninterrupted run")
        left = temporary_names(model_dir) + unloadable_checkpoints(model_dir)
        tally.leftovers += len(left)
        tally.problems += [f"kill trial {trial}: left {name}" for name in left]
        shutil.rmtree(model_dir, ignore_errors=True)


def _wait_for_staging(process, model_dir: Path, step: int, *, started: float, limit: float) -> None:
    """Until the run stages ckpt-<step> (or got past it, or ended, or `limit` seconds passed)."""
    prefix = f".tmp-ckpt-{step}-"
    while process.is_alive() and time.monotonic() - started < limit:
        with contextlib.suppress(FileNotFoundError):
            names = os.listdir(model_dir)
            if any(name.startswith(prefix) or name == f"ckpt-{step}" for name in names):
                return
        process.join(0.002)  # polls while the child runs; returns at once if it ends


# ------------------------------------------------------------------- damage


def _flip(offset: Callable[[int], int]) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        if not data:
            return b"\x00"
        position = offset(len(data))
        return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]

    return damage


def _edit_json(edit: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        document = json.loads(data)
        edit(document)
        return json.dumps(document, indent=1).encode()

    return damage


def _set(path: list, value: object) -> Callable[[dict], None]:
    def edit(document: dict) -> None:
        node = document
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value

    return edit


BYTE_DAMAGE: dict[str, Callable[[bytes], bytes] | None] = {
    "truncated-half": lambda data: data[: len(data) // 2],
    "truncated-empty": lambda data: b"",
    "truncated-last-byte": lambda data: data[:-1],
    "flipped-first": _flip(lambda size: 0),
    "flipped-middle": _flip(lambda size: size // 2),
    "flipped-last": _flip(lambda size: size - 1),
    "appended": lambda data: data + b"\n",
    "garbage": lambda data: random.Random(len(data)).randbytes(max(len(data), 1)),
    "json-list": lambda data: b"[]",
    "json-empty-object": lambda data: b"{}",
    "json-wrong-types": lambda data: json.dumps({"format_version": "2", "global_step": [], "files": 3}).encode(),
    "deleted": None,
}
_REPLICA_0 = ["extra", "replicas", 0]  # state.json's per-replica state (checkpoint/parts.py)
STATE_EDITS: dict[str, Callable[[bytes], bytes]] = {
    "rng-torch": _edit_json(
        _set([*_REPLICA_0, "train_state", "rng", "torch"], lambda text: "BC"[text[0] == "B"] + text[1:])
    ),
    "rng-python": _edit_json(_set([*_REPLICA_0, "train_state", "rng", "python", 1, 7], lambda value: value ^ 1)),
    "rng-numpy": _edit_json(_set([*_REPLICA_0, "train_state", "rng", "numpy", 2], lambda value: value + 1)),
    "input-position": _edit_json(_set([*_REPLICA_0, "input_source", "row"], lambda value: value + 1)),
    "train-state-position": _edit_json(
        _set([*_REPLICA_0, "train_state", "input_position", "epoch"], lambda value: value + 1)
    ),
    "global-step": _edit_json(_set(["global_step"], lambda value: value - 1)),
    "optimizer-signature": _edit_json(_set(["extra", "optimizer_signature", "class"], "torch.optim.sgd.SGD")),
    "file-sha256": _edit_json(_set(["files", "model.safetensors", "sha256"], lambda text: text[::-1])),
    "file-size": _edit_json(_set(["files", "optimizer.json", "size"], lambda value: value + 1)),
    "format-version-newer": _edit_json(_set(["format_version"], 3)),
    "format-version-older": _edit_json(_set(["format_version"], 1)),
    "own-checksum": _edit_json(_set(["state_sha256"], lambda text: text[::-1])),
    "own-checksum-removed": _edit_json(lambda document: document.pop("state_sha256")),
    "reformatted": lambda data: json.dumps(json.loads(data)).encode(),
}


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _captured_warnings() -> Iterator[_Warnings]:
    handler, logger = _Warnings(), logging.getLogger("torchestimator")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _apply(path: Path, damage: Callable[[bytes], bytes] | None) -> None:
    if damage is None:
        path.unlink()
    else:
        path.write_bytes(damage(path.read_bytes()))


def judge_damage(
    base: Path, workdir: Path, target: str, damage: Callable[[bytes], bytes] | None, every_checkpoint: bool
) -> str | None:
    """Damages `target` (a file of the newest checkpoint, or "checkpoint", the manifest); None when restore
    noticed (fallback with a warning naming the damage, or a CheckpointError naming each checkpoint)."""
    from torchestimator.checkpoint import CheckpointError, CheckpointStore

    model_dir = workdir / "damaged"
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.copytree(base, model_dir)
    steps = sorted(int(name[5:]) for name in os.listdir(model_dir) if name.startswith("ckpt-"))
    damaged = steps if every_checkpoint else steps[-1:]
    if target == "checkpoint":
        _apply(model_dir / "checkpoint", damage)
        damaged = []
    else:
        for step in damaged:
            _apply(model_dir / f"ckpt-{step}" / target, damage)
    with _captured_warnings() as warnings:
        try:
            restored = CheckpointStore(model_dir, keep_checkpoint_max=None).restore()
        except CheckpointError as error:
            if every_checkpoint and all(f"ckpt-{step}" in str(error) for step in damaged):
                return None
            return f"unexpected error {error}"
    expected_step = max(set(steps) - set(damaged), default=None)
    if restored.step != expected_step:
        return f"restored step {restored.step}, expected {expected_step}"
    named = all(any(str(model_dir / f"ckpt-{step}") in message for message in warnings.messages) for step in damaged)
    if target == "checkpoint" and damage is not None:
        named = any("manifest" in message for message in warnings.messages) or _manifest_harmless(base, model_dir)
    return None if named else f"no warning named the damage (warnings: {warnings.messages})"


def _manifest_harmless(base: Path, model_dir: Path) -> bool:
    # Damage that leaves the manifest valid JSON of the right shape, with the same content, changes nothing.
    try:
        return json.loads((model_dir / "checkpoint").read_bytes()) == json.loads((base / "checkpoint").read_bytes())
    except ValueError:
        return False


def damage_trials(children: Children, workdir: Path, tally: Tally) -> None:
    base = workdir / "damage-base"
    outcome = children.train(base)
    if not outcome["ok"]:
        raise RuntimeError(f"the damage base run failed: {outcome}")
    newest = base / f"ckpt-{STEPS}"
    kinds = [
        (name, kind, damage)
        for name in sorted(os.listdir(newest)) + ["checkpoint"]
        for kind, damage in BYTE_DAMAGE.items()
    ]
    kinds += [("state.json", kind, damage) for kind, damage in STATE_EDITS.items()]
    for target, kind, damage in kinds:
        for every_checkpoint in (False, True) if target != "checkpoint" else (False,):
            tally.damage_kinds += 1
            problem = judge_damage(base, workdir, target, damage, every_checkpoint)
            if problem is None:
                tally.detected += 1
            else:
                where = "every checkpoint" if every_checkpoint else "the newest checkpoint"
                tally.problems.append(f"damage {kind} of {target} in {where}: {problem}")


# ---------------------------------------------------------------- disk full


def _judge_full(
    children: Children,
    model_dir: Path,
    outcome: dict,
    reference: dict[str, str],
    point: str,
    free: Callable[[], None],
    tally: Tally,
) -> None:
    tally.disk_full_points += 1
    message = str(outcome.get("message", ""))
    clean = not outcome["ok"] and outcome.get("disk_full") and str(model_dir) in message and ("step" in message)
    if clean:
        tally.clean_errors += 1
        where = re.search(r"(step \d+) to (\S+)", message)
        if where:
            tally.full_at.add(f"{os.path.basename(where.group(2))}@{where.group(1).replace(' ', '')}")
    elif not outcome["ok"] or point.startswith("tmpfs"):
        tally.problems.append(f"disk full at {point}: not a clean DiskFullError: {outcome}")
    free()
    rerun = children.train(model_dir)
    if rerun["ok"] and checkpoint_digest(model_dir) == reference and not temporary_names(model_dir):
        tally.resumed_after_full += 1
    else:
        tally.problems.append(f"disk full at {point}: rerun {rerun}, left {temporary_names(model_dir)}")


def file_size_limit_points(
    children: Children, workdir: Path, reference: dict[str, str], trials: int, deadline: float, tally: Tally
) -> None:
    """One limit just under the size of each distinct file the run writes, so each file is the one that fails."""
    sizes = sorted({path.stat().st_size for path in (workdir / "reference").rglob("*") if path.is_file()})
    limits = sorted({size - 1 for size in sizes if size > 64})
    if len(limits) > trials:  # spread over small and large files
        limits = sorted({limits[round(index * (len(limits) - 1) / max(trials - 1, 1))] for index in range(trials)})
    for index, limit in enumerate(limits):
        if time.monotonic() > deadline:
            break
        model_dir = workdir / f"fsize-{index}"
        outcome = children.train(model_dir, file_size_limit=limit)
        if outcome["ok"]:
            continue  # no file of this run reached the limit: not a disk-full point
        _judge_full(children, model_dir, outcome, reference, f"RLIMIT_FSIZE={limit}", lambda: None, tally)
        shutil.rmtree(model_dir, ignore_errors=True)


@contextlib.contextmanager
def small_tmpfs(workdir: Path, size: int) -> Iterator[Path | None]:
    """A tmpfs of `size` bytes, or None when this process cannot mount one (not root, no CAP_SYS_ADMIN)."""
    mount_point = workdir / "tmpfs"
    mount_point.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        yield None
        return
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if result.returncode != 0:
        yield None
        return
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def tmpfs_points(
    children: Children, workdir: Path, reference: dict[str, str], trials: int, deadline: float, tally: Tally
) -> bool:
    """Fills a small tmpfs to leave `room` bytes, for a spread of rooms; False when no tmpfs could be mounted."""
    size = 4 * 1024 * 1024
    reference_bytes = sum(path.stat().st_size for path in (workdir / "reference").rglob("*") if path.is_file())
    with small_tmpfs(workdir, size) as mount_point:
        if mount_point is None:
            return False
        rooms = [int(reference_bytes * (0.02 + 1.6 * index / max(trials - 1, 1))) for index in range(trials)]
        for index, room in enumerate(rooms):
            if time.monotonic() > deadline:
                break
            model_dir, filler = mount_point / f"run-{index}", mount_point / "filler"
            with open(filler, "wb") as handle:
                with contextlib.suppress(OSError):
                    handle.write(b"\0" * (size - room - 64 * 1024))
            outcome = children.train(model_dir)
            if outcome["ok"]:
                filler.unlink()
                continue
            _judge_full(children, model_dir, outcome, reference, f"tmpfs room={room}", filler.unlink, tally)
            shutil.rmtree(model_dir, ignore_errors=True)
    return True


# --------------------------------------------------------------------- main


def parse_settings(arguments: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="kill trials (and at most this many disk-full points)")
    parser.add_argument("--seconds", type=float, default=600.0, help="stop starting new trials after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="where runs go (default: a temporary folder, removed after)")
    parser.add_argument("--no-damage", action="store_true", help="skip the damage part")
    parser.add_argument("--no-separate-process", action="store_true", help="skip the reproducibility check")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    settings = parser.parse_args(arguments)
    if settings.trials < 1 or settings.seconds <= 0:
        parser.error("--trials must be >= 1 and --seconds > 0")
    return settings


def run(settings: argparse.Namespace, workdir: Path) -> Tally:
    tally, rng = Tally(), random.Random(settings.seed)
    deadline = time.monotonic() + settings.seconds
    children = Children(workdir / "reports")
    with _timed("reference run"):
        reference, duration = run_reference(children, workdir, tally)
    if not settings.no_separate_process:
        with _timed("separate process"):
            check_reproducible(workdir, reference, tally)
    with _timed("kill trials"):
        kill_trials(children, workdir, reference, duration, settings.trials, deadline, rng, tally)
    if not settings.no_damage:
        with _timed("damage"):
            damage_trials(children, workdir, tally)
    with _timed("RLIMIT_FSIZE"):
        file_size_limit_points(children, workdir, reference, settings.trials, deadline, tally)
    with _timed("tmpfs"):
        if not tmpfs_points(children, workdir, reference, min(settings.trials, 12), deadline, tally):
            print("tmpfs disk-full points skipped: mounting a tmpfs needs root (CAP_SYS_ADMIN)", file=sys.stderr)
    return tally


@contextlib.contextmanager
def _timed(part: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"{part}: {time.monotonic() - started:.1f} s", file=sys.stderr)


def main(arguments: list[str] | None = None) -> int:
    settings = parse_settings(arguments)
    if settings.child:
        child_train(settings.child, settings.child + ".report.json")
        return 0
    with contextlib.ExitStack() as stack:
        if settings.workdir:
            workdir = Path(settings.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="faults_checkpoint-")))
        tally = run(settings, workdir)
    for problem in tally.problems:
        print(problem)
    print(f"disk full struck at: {', '.join(sorted(tally.full_at))}", file=sys.stderr)
    print(tally.line())
    return 0 if not tally.problems else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import faults_checkpoint  # the children's target must be importable by name in the forkserver

    sys.exit(faults_checkpoint.main())
