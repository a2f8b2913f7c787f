"""``model_dir/best.json``: which checkpoints scored best (step and metric value), and keeping them from retention.

What belongs here: the record (read, written whole), and marking its steps as ``best`` in the checkpoint manifest so
that retention never deletes them. It sits with the checkpoints because the Estimator protects the recorded best
before any save, whatever trains; which result is better is the policy's business (``_policy/best.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from torchestimator._io import filesystems
from torchestimator._io.atomic import write_json_atomically
from torchestimator.checkpoint.store import CheckpointStore

logger = logging.getLogger(__name__)

__all__ = [
    "BEST_FILE",
    "BestRecord",
    "as_store",
    "best_checkpoint",
    "mark_recorded_best",
    "protect_recorded_best",
    "read_best",
    "read_best_document",
    "stored_value",
    "write_best_file",
]

BEST_FILE = "best.json"
_FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class BestRecord:
    """One best checkpoint: its step, its metric value, and its path (None when the folder is gone)."""

    step: int
    value: float
    path: str | None = None


def read_best(model_dir: str | os.PathLike[str]) -> list[BestRecord]:
    """The recorded best checkpoints of ``model_dir``, best first, with their paths (None if deleted)."""
    model_dir = os.fspath(model_dir)
    document = read_best_document(model_dir)
    if document is None:
        return []
    if filesystems.is_url(model_dir):  # folder names carry a save's own suffix there: the store knows them
        paths = {entry["step"]: entry["path"] for entry in CheckpointStore(model_dir).history()}
    else:
        paths = {}
        for item in document["best"]:
            path = os.path.join(model_dir, f"ckpt-{int(item['step'])}")
            paths[int(item["step"])] = path if os.path.isdir(path) else None
    return [
        BestRecord(step=int(item["step"]), value=stored_value(item), path=paths.get(int(item["step"])))
        for item in document["best"]
    ]


def protect_recorded_best(model_dir: str | os.PathLike[str], store: Any) -> None:
    """Marks the steps recorded in best.json as best in the manifest, when they are on disk and not marked.

    Called before training saves anything: a manifest rebuilt by scanning (deleted or damaged) has no best
    steps, and retention would otherwise delete the best checkpoints at the next save.
    """
    recorded = {record.step for record in read_best(model_dir) if record.path is not None}
    marked = set(store.manifest["best"])
    if not recorded <= marked:
        on_disk = {entry["step"] for entry in store.history()}
        logger.warning(
            "The manifest of %s does not protect the best checkpoints recorded in %s (steps %s); marking them again.",
            model_dir,
            BEST_FILE,
            sorted((recorded - marked) & on_disk),
        )
        store.mark_best(sorted((marked | recorded) & on_disk))


def mark_recorded_best(store: CheckpointStore) -> None:
    """Makes the manifest's best steps those best.json records (the ones still on disk); the training chief's
    side of the evaluator task's ``update_record``, called before each save.

    Unlike ``protect_recorded_best`` it also releases steps best.json no longer lists (a better one replaced
    them), so that retention can delete them. A missing or unreadable best.json changes nothing.
    """
    store = as_store(store)
    document = read_best_document(store.model_dir)
    if document is None:
        return
    on_disk = {entry["step"] for entry in store.history()}
    steps = sorted({int(item["step"]) for item in document["best"]} & on_disk)
    if sorted(store.manifest["best"]) != steps:
        store.mark_best(steps)


def best_checkpoint(store: CheckpointStore) -> str | None:
    """Path of the best checkpoint recorded for the store's model_dir; None when none is recorded."""
    for record in read_best(as_store(store).model_dir):
        if record.path is not None:
            return record.path
    return None


def as_store(owner: Any) -> CheckpointStore:
    if isinstance(owner, CheckpointStore):
        return owner
    raise TypeError(f"Expected the model_dir's CheckpointStore (Estimator.checkpoint_store); received {owner!r}.")


def stored_value(item: Mapping[str, Any]) -> float:
    return math.nan if item["value"] is None else float(item["value"])


def read_best_document(model_dir: str) -> dict[str, Any] | None:
    path = filesystems.join(model_dir, BEST_FILE)
    try:
        document = json.loads(filesystems.read_bytes(path).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        logger.warning("%s is unreadable (%s); the best checkpoints are compared afresh.", path, error)
        return None
    if not (
        isinstance(document, dict)
        and document.get("format_version") == _FORMAT_VERSION
        and isinstance(document.get("best"), list)
        and all(isinstance(item, dict) and {"step", "value"} <= set(item) for item in document["best"])
    ):
        logger.warning("%s does not have the expected layout; the best checkpoints are compared afresh.", path)
        return None
    for index, item in enumerate(document["best"]):
        step, value = item["step"], item["value"]
        if (
            isinstance(step, bool)
            or not isinstance(step, int)
            or step < 0
            or not (value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)))
        ):
            logger.warning(
                "%s: entry %d (%r) needs an int step >= 0 and a number or null as value; the best "
                "checkpoints are compared afresh.",
                path,
                index,
                item,
            )
            return None
    return document


def write_best_file(model_dir: str, metric_name: str, higher_is_better: bool, records: list[BestRecord]) -> None:
    """Replaces best.json atomically: a temporary file in model_dir, fsynced, then renamed over."""
    document = {
        "format_version": _FORMAT_VERSION,
        "metric_name": metric_name,
        "higher_is_better": higher_is_better,
        # JSON has no NaN; a NaN value (never better than a number) is written as null and read back as NaN.
        "best": [{"step": r.step, "value": None if math.isnan(r.value) else r.value} for r in records],
    }
    write_json_atomically(filesystems.join(model_dir, BEST_FILE), document, indent=1)
