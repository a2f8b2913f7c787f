"""The files through which the evaluator task and the trainers talk, in model_dir.

What belongs here: the three documents, how they are written (one writer each, replaced atomically with
``_io.atomic``, so a reader sees the old or the new document, never half of one), read (a regular file
within a bound; a damaged one is warned about and counts as absent), and the cheap poll the trainers use.
What does not: what the evaluator decides (evaluator.py) and what the trainers do about it (trainer_task.py).

::

    training_run.json   written by the training chief: this run's id, whether an evaluator task evaluates
                        it, the step it started from and its max_steps and, once train returns, the step it
                        ended at and why (``end_cause``, one of ``END_CAUSES``, and the same in words).
    stop_signal.json    written by the evaluator: stop, addressed to one training run by its id, with the
                        evaluated step that decided it and the rule that said so.
    evaluator.json      written by the evaluator: the checkpoint step it is evaluating now (and exporting),
                        which the chief keeps from retention until that is done, and who wrote it.

(``best.json``, the best steps, is the evaluator's too in this setup; see best.py.)

A killed evaluator cannot clear evaluator.json, so its step would stay protected across runs. The chief
ignores the file when its writer is gone (the pid it names is no live process on this host, see
``_io.atomic.writer_is_gone``) or when it was written more than ``EVALUATING_STEP_MAX_AGE_SECS`` ago (a
writer on another host, whose pid cannot be checked from here). An evaluation that outlasts that bound
loses its protection; if retention then deletes its checkpoint, the evaluator skips it with a warning.

Why a stop signal names a run: a model_dir outlives its runs. A signal addressed to an earlier run (the
job that stopped early last week) must not stop the run that continues it; trainers only obey a signal
addressed to their own run id, which the chief draws afresh at every start. The evaluator addresses its
decision to the run training now, and readdresses it if the trainers restart while it waits for them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

from torchestimator._io import filesystems
from torchestimator._io.atomic import WRITER_PATTERN, write_json_atomically, writer_is_gone, writer_tag
from torchestimator._io.regular_file import read_regular_file
from torchestimator.errors import FileTooLargeError, NotARegularFileError

logger = logging.getLogger(__name__)

_Record = TypeVar("_Record")

__all__ = [
    "END_CAUSES",
    "END_EARLY_STOPPING",
    "END_INPUT_OR_HOOK",
    "END_MAX_STEPS",
    "EVALUATING_STEP_MAX_AGE_SECS",
    "EVALUATOR_FILE",
    "STOP_POLL_SECS",
    "STOP_SIGNAL_FILE",
    "TRAINING_RUN_FILE",
    "StopSignal",
    "StopSignalWatch",
    "TrainingRun",
    "new_run_id",
    "read_evaluating_step",
    "read_stop_signal",
    "read_training_run",
    "write_evaluating_step",
    "write_stop_signal",
    "write_training_run",
]

TRAINING_RUN_FILE = "training_run.json"
STOP_SIGNAL_FILE = "stop_signal.json"
EVALUATOR_FILE = "evaluator.json"
STOP_POLL_SECS = 1.0
"""How often the trainers look for a stop signal (one stat of a file), and the evaluator for the trainers' end."""

EVALUATING_STEP_MAX_AGE_SECS = 6 * 3600.0
"""evaluator.json older than this (by its modification time) protects nothing: its writer is taken to be gone."""

END_MAX_STEPS = "max_steps"
"""The run reached its max_steps."""
END_EARLY_STOPPING = "early_stopping"
"""The evaluator's early-stopping verdict ended it (a stop signal, or, before step one, the verdict of its
evaluations in eval/ on a rerun)."""
END_INPUT_OR_HOOK = "input_or_hook"
"""The input ended, or a hook asked to stop."""
END_CAUSES = (END_MAX_STEPS, END_EARLY_STOPPING, END_INPUT_OR_HOOK)

_FORMAT_VERSION = 1
_MAX_BYTES = 64 * 1024  # these documents are a few hundred bytes; a bigger file is not one of ours


def new_run_id() -> str:
    """A fresh id for one training run (32 hex digits)."""
    return secrets.token_hex(16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingRun:
    """The training chief's record of one run (training_run.json)."""

    run_id: str
    evaluator_task: bool
    """True when an evaluator task evaluates this run (the trainers do not evaluate themselves)."""
    start_step: int
    end_step: int | None = None
    """The step training ended at (its final checkpoint); None while it trains."""
    end_reason: str | None = None
    """Why it ended, in words, for people reading the file; code reads ``end_cause``."""
    max_steps: int | None = None
    """The trainers' max_steps (None: none, or a record written before it was recorded)."""
    end_cause: str | None = None
    """Why it ended, one of ``END_CAUSES``; None while it trains (and in records written before it existed)."""

    @property
    def ended(self) -> bool:
        return self.end_step is not None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StopSignal:
    """The evaluator's decision to stop one training run (stop_signal.json)."""

    run_id: str
    """The training run it is addressed to; trainers of any other run ignore it."""
    step: int
    """The evaluated checkpoint's step whose results decided it."""
    rule: str
    """The early-stopping rule that said stop, as its repr (``stop_if_no_decrease('loss', 100)``)."""


def write_training_run(model_dir: str, run: TrainingRun) -> None:
    _write(model_dir, TRAINING_RUN_FILE, dataclasses.asdict(run))


def read_training_run(model_dir: str) -> TrainingRun | None:
    document = _read(model_dir, TRAINING_RUN_FILE)
    if document is None:
        return None
    run = _build(
        model_dir,
        TRAINING_RUN_FILE,
        TrainingRun,
        document,
        {
            "run_id": (str,),
            "evaluator_task": (bool,),
            "start_step": (int,),
            "end_step": (int, None),
            "end_reason": (str, None),
            "max_steps": (int, None),
            "end_cause": (str, None),
        },
    )
    if run is not None and run.end_cause is not None and run.end_cause not in END_CAUSES:
        logger.warning(
            "%s: field 'end_cause' must be one of %s or null; received %r. The file is ignored.",
            filesystems.join(model_dir, TRAINING_RUN_FILE),
            ", ".join(END_CAUSES),
            run.end_cause,
        )
        return None
    return run


def write_stop_signal(model_dir: str, signal: StopSignal) -> None:
    _write(model_dir, STOP_SIGNAL_FILE, dataclasses.asdict(signal))


def read_stop_signal(model_dir: str) -> StopSignal | None:
    document = _read(model_dir, STOP_SIGNAL_FILE)
    if document is None:
        return None
    return _build(model_dir, STOP_SIGNAL_FILE, StopSignal, document, {"run_id": (str,), "step": (int,), "rule": (str,)})


def write_evaluating_step(model_dir: str, step: int | None) -> None:
    """The evaluator says which checkpoint it is evaluating (None: none), so that retention keeps it meanwhile."""
    _write(model_dir, EVALUATOR_FILE, {"evaluating_step": step, "writer": writer_tag()})


def read_evaluating_step(model_dir: str, *, now: Callable[[], float] = time.time) -> int | None:
    """The step evaluator.json protects; None when none, or when the file is stale (see the module docstring)."""
    path = filesystems.join(model_dir, EVALUATOR_FILE)
    document = _read(model_dir, EVALUATOR_FILE)
    if document is None:
        return None
    step = document.get("evaluating_step")
    if step is not None and not _is_step(step):
        logger.warning("%s: evaluating_step must be a step (an int >= 0) or null; received %r. Ignored.", path, step)
        return None
    if step is not None and _is_stale(path, document.get("writer"), now()):
        return None
    return step


def _is_stale(path: str, writer: Any, now: float) -> bool:
    """True when evaluator.json's writer is gone (a dead pid on this host) or the file is older than the bound."""
    match = re.fullmatch(WRITER_PATTERN, writer) if isinstance(writer, str) else None
    # This very process wrote it (evaluator and chief in one process): alive, though writer_is_gone says
    # otherwise of its own pid (its own leftovers are stale at start-up).
    if match is not None and writer != writer_tag() and writer_is_gone(int(match.group("pid")), match.group("host")):
        logger.info(
            "%s was written by process %s, which is gone (an evaluator killed mid-evaluation): the step "
            "it names is not protected from retention.",
            path,
            writer,
        )
        return True
    try:
        age = now - _modified_time(path)
    except OSError:  # replaced or removed since it was read: the next save reads it again
        return False
    if age > EVALUATING_STEP_MAX_AGE_SECS:
        logger.info(
            "%s was written %.0f s ago, more than %.0f s: its writer is taken to be gone and the step it "
            "names is not protected from retention.",
            path,
            age,
            EVALUATING_STEP_MAX_AGE_SECS,
        )
        return True
    return False


def _modified_time(path: str) -> float:
    """When ``path`` was last written, in seconds since the epoch: its mtime on a file system, the object's
    LastModified (by the store's clock) on an object store. OSError when it is gone or the store gives no time."""
    if not filesystems.is_url(path):
        return os.stat(filesystems.local_path(path)).st_mtime
    from torchestimator.checkpoint.object_storage import modified_time

    fs, inner = filesystems.filesystem(path)
    fs.invalidate_cache(inner)  # s3fs and gcsfs keep listings: ask the store
    try:
        stamp = modified_time(fs.info(inner))
    except FileNotFoundError:
        raise
    except Exception as error:
        raise OSError(f"{path}: {error}") from error
    if stamp is None:
        raise OSError(f"{path}: the store gives no modification time")
    return stamp


class StopSignalWatch:
    """Whether the evaluator told this training run to stop; cheap enough to ask after every step.

    Each call reads the clock; at most every ``poll_secs`` it stats stop_signal.json, and it reads the
    file only when the stat shows a new one (an atomic replace is a new inode). A signal addressed to
    another run is logged once and ignored. Once this run's signal is found, every call returns it.
    """

    def __init__(
        self,
        model_dir: str,
        run_id: str,
        *,
        poll_secs: float = STOP_POLL_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_dir, self.run_id, self.poll_secs, self.clock = model_dir, run_id, poll_secs, clock
        self.path = filesystems.join(model_dir, STOP_SIGNAL_FILE)
        self.signal: StopSignal | None = None
        self._last_poll: float | None = None
        self._seen: tuple[int, int, int] | None = None

    def check(self) -> StopSignal | None:
        if self.signal is not None:
            return self.signal
        now = self.clock()
        if self._last_poll is not None and now - self._last_poll < self.poll_secs:
            return None
        self._last_poll = now
        try:
            identity = _identity(self.path)
        except OSError:  # absent (the usual case), or unreachable for now: asked again at the next poll
            self._seen = None
            return None
        if identity == self._seen:
            return None
        self._seen = identity
        signal = read_stop_signal(self.model_dir)
        if signal is not None and signal.run_id != self.run_id:
            logger.info(
                "%s is addressed to training run %s, not to this one (%s): it is an earlier run's, and is ignored.",
                self.path,
                signal.run_id,
                self.run_id,
            )
            return None
        self.signal = signal
        return signal


# -- reading and writing one document ---------------------------------------------------------


def _identity(path: str) -> Any:
    """What tells a new stop_signal.json from the one seen before: inode, time and size on a file system; on an
    object store, the object's ETag (or its bytes, where the store gives none)."""
    if not filesystems.is_url(path):
        status = os.stat(filesystems.local_path(path))
        return (status.st_ino, status.st_mtime_ns, status.st_size)
    fs, inner = filesystems.filesystem(path)
    fs.invalidate_cache(inner)  # s3fs and gcsfs keep listings: ask the store
    try:
        info = fs.info(inner)
    except FileNotFoundError:
        raise
    except Exception as error:
        raise OSError(f"{path}: {error}") from error
    return info.get("ETag") or info.get("etag") or info.get("md5Hash") or filesystems.read_bytes(path)


def _write(model_dir: str, name: str, fields: dict[str, Any]) -> None:
    write_json_atomically(filesystems.join(model_dir, name), {"format_version": _FORMAT_VERSION, **fields})


def _read(model_dir: str, name: str) -> dict[str, Any] | None:
    """The document, or None when absent; a damaged one is warned about (naming the file) and counts as absent."""
    path = filesystems.join(model_dir, name)
    try:
        if filesystems.is_url(path):
            data = filesystems.read_bytes(path)
            if len(data) > _MAX_BYTES:
                raise FileTooLargeError(path, len(data), _MAX_BYTES)
            document = json.loads(data)
        else:
            document = json.loads(read_regular_file(path, _MAX_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, NotARegularFileError, FileTooLargeError, UnicodeDecodeError, json.JSONDecodeError) as error:
        logger.warning("%s is unreadable (%s); it is ignored.", path, error)
        return None
    if not isinstance(document, dict) or document.get("format_version") != _FORMAT_VERSION:
        logger.warning("%s is not a format %d document of torchestimator's; it is ignored.", path, _FORMAT_VERSION)
        return None
    return document


def _build(
    model_dir: str,
    name: str,
    kind: Callable[..., _Record],
    document: dict[str, Any],
    fields: dict[str, tuple[type | None, ...]],
) -> _Record | None:
    """``kind(**fields)`` from the document when each field has one of its types; else a warning and None."""
    values = {}
    for field, types in fields.items():
        value = document.get(field)
        if not _has_type(value, types):
            logger.warning(
                "%s: field %r must be %s; received %r. The file is ignored.",
                filesystems.join(model_dir, name),
                field,
                " or ".join("null" if kind_ is None else kind_.__name__ for kind_ in types),
                value,
            )
            return None
        values[field] = value
    return kind(**values)


def _has_type(value: Any, types: tuple[type | None, ...]) -> bool:
    if value is None:
        return None in types
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int):
        return int in types and value >= 0
    return any(kind is not None and kind not in (bool, int) and isinstance(value, kind) for kind in types)


def _is_step(value: Any) -> bool:
    return _has_type(value, (int,))
