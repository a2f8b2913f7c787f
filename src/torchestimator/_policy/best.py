"""The best-checkpoint policy: which checkpoints scored best, recorded so that a restart remembers.

What belongs here: comparing an evaluation against the recorded best (by
``improvement.Objective``, the rule early stopping and BestExporter share) and
updating the record. The record itself (``model_dir/best.json``: step and metric
value of each best checkpoint, replaced atomically) and marking those steps as
``best`` in the checkpoint manifest, so that retention never deletes them, live
with the checkpoints (``checkpoint/best_record.py``, re-exported here). What does
not: when to evaluate (train_and_evaluate.py) and exporting (export/).

After a restart the policy compares against the recorded best rather than
taking the first result it sees as the best (TensorFlow issue 47396).

Rule: the evaluated step must have a checkpoint. ``train_and_evaluate``
guarantees it, since the loop writes a checkpoint at every evaluation point; with
checkpoints disabled in RunConfig a policy is refused up front.

With an evaluator task the record has two writers' worth of work split in two:
the evaluator owns best.json (``update_record``) and the training chief, which
owns the manifest, copies best.json's steps into it before each save
(``mark_recorded_best``), so that its retention never deletes them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torchestimator._io import filesystems
from torchestimator._policy.improvement import Objective
from torchestimator.checkpoint.best_record import (
    BEST_FILE,
    BestRecord,
    as_store,
    best_checkpoint,
    mark_recorded_best,
    protect_recorded_best,
    read_best,
    read_best_document,
    stored_value,
    write_best_file,
)
from torchestimator.checkpoint.store import CheckpointStore

logger = logging.getLogger(__name__)

__all__ = [
    "BEST_FILE",
    "BestCheckpointPolicy",
    "BestRecord",
    "best_checkpoint",
    "mark_recorded_best",
    "protect_recorded_best",
    "read_best",
]


class BestCheckpointPolicy:
    """Keeps the ``keep`` checkpoints with the best ``metric_name`` and protects them from retention.

    Args:
        metric_name: a key of the evaluation results (``loss``, ``accuracy``, ...).
        higher_is_better: True for accuracy-like metrics, False for losses.
        keep: how many best checkpoints to keep and protect.

    Ties keep the earlier step. A NaN value is never better than a number.
    """

    def __init__(self, metric_name: str = "loss", higher_is_better: bool = False, keep: int = 1) -> None:
        self.objective = Objective(metric_name=metric_name, higher_is_better=higher_is_better)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1 (how many best checkpoints to keep); received {keep!r}.")
        self.keep = keep

    # Read from the objective, so that the policy and its comparison cannot disagree.
    metric_name = property(lambda self: self.objective.metric_name, doc="The compared metric (read-only).")
    higher_is_better = property(lambda self: self.objective.higher_is_better, doc="Its direction (read-only).")

    def __repr__(self) -> str:
        return (
            f"BestCheckpointPolicy(metric_name={self.metric_name!r}, higher_is_better={self.higher_is_better}, "
            f"keep={self.keep})"
        )

    def check_results(self, global_step: int, results: Mapping[str, Any]) -> float:
        """The metric's value in ``results``; ValueError listing the available names when it is absent."""
        return self.objective.value(
            results, role="Best-checkpoint", source=f"the evaluation results at global step {global_step}"
        )

    def update(self, store: CheckpointStore, global_step: int, results: Mapping[str, Any]) -> bool:
        """Compares the evaluation of ``global_step`` with the recorded best; True if it joined the best.

        ``store`` is the model_dir's CheckpointStore (``Estimator.checkpoint_store``). Writes
        ``best.json`` and the manifest's ``best`` list when they change. Call it in the chief only (the store
        has one writer); the other replicas get the answer from the chief.
        """
        value = self.check_results(global_step, results)
        store = as_store(store)
        model_dir = store.model_dir
        steps_on_disk = {entry["step"] for entry in store.history()}
        if global_step not in steps_on_disk:
            raise ValueError(
                f"Cannot record global step {global_step} as a best checkpoint: {model_dir} has no "
                f"checkpoint of that step (it has {sorted(steps_on_disk)}). The best-checkpoint policy needs "
                "checkpoints: set save_checkpoints_steps or save_checkpoints_secs in RunConfig."
            )
        recorded, kept, joined = self._compare(model_dir, steps_on_disk, global_step, value)
        kept_steps = sorted(record.step for record in kept)
        if _changed(recorded, kept):
            # Old and new best both protected while best.json changes: a kill between the two writes loses neither.
            store.mark_best(sorted((set(store.manifest["best"]) & steps_on_disk) | set(kept_steps)))
            write_best_file(model_dir, self.metric_name, self.higher_is_better, kept)
        if store.manifest["best"] != kept_steps:  # also repairs a manifest that lost or outlived best.json's steps
            store.mark_best(kept_steps)
        self._log(global_step, value, joined)
        return joined

    def update_record(self, store: CheckpointStore, global_step: int, results: Mapping[str, Any]) -> bool:
        """The evaluator task's update: compares as ``update`` does, but writes best.json only.

        The manifest has one writer, the training chief, which marks the recorded steps as best before each
        of its saves (``mark_recorded_best``). Meanwhile the evaluator's ``evaluator.json`` names the step
        under evaluation, which the chief also keeps. A step whose checkpoint is already gone cannot be kept:
        it is skipped with a warning (False), the evaluation itself stands.
        """
        value = self.check_results(global_step, results)
        store = as_store(store)
        model_dir = store.model_dir
        steps_on_disk = {entry["step"] for entry in store.history()}
        if global_step not in steps_on_disk:
            logger.warning(
                "The checkpoint of global step %d left %s before it could be recorded as a best one "
                "(retention deleted it during its evaluation); it is not compared.",
                global_step,
                model_dir,
            )
            return False
        recorded, kept, joined = self._compare(model_dir, steps_on_disk, global_step, value)
        if _changed(recorded, kept):
            write_best_file(model_dir, self.metric_name, self.higher_is_better, kept)
        self._log(global_step, value, joined)
        return joined

    def _compare(
        self,
        model_dir: str,
        steps_on_disk: set[int],
        global_step: int,
        value: float,
    ) -> tuple[list[BestRecord], list[BestRecord], bool]:
        """(the recorded best, the best once ``value`` of ``global_step`` is offered, whether it joined them)."""
        recorded = self._recorded(model_dir, steps_on_disk)
        candidates = [record for record in recorded if record.step != global_step]
        candidates.append(BestRecord(step=global_step, value=value))
        kept = sorted(candidates, key=self._rank)[: self.keep]
        return recorded, kept, any(record.step == global_step for record in kept)

    def _log(self, global_step: int, value: float, joined: bool) -> None:
        if joined:
            logger.info(
                "Global step %d is among the best %d by %s = %s; its checkpoint is kept.",
                global_step,
                self.keep,
                self.metric_name,
                value,
            )

    def _rank(self, record: BestRecord) -> tuple[bool, float, int]:
        return self.objective.rank(record.value, record.step)

    def _recorded(self, model_dir: str, steps_on_disk: set[int]) -> list[BestRecord]:
        """The recorded best of earlier evaluations (this or an earlier process) still on disk."""
        document = read_best_document(model_dir)
        if document is None:
            return []
        if (document.get("metric_name"), document.get("higher_is_better")) != (self.metric_name, self.higher_is_better):
            logger.warning(
                "%s records the best by %s (higher_is_better=%s), but the policy now uses %s (higher_is_better=%s): "
                "the old record is not comparable and is replaced.",
                filesystems.join(model_dir, BEST_FILE),
                document.get("metric_name"),
                document.get("higher_is_better"),
                self.metric_name,
                self.higher_is_better,
            )
            return []
        records = [BestRecord(step=int(item["step"]), value=stored_value(item)) for item in document["best"]]
        gone = [record.step for record in records if record.step not in steps_on_disk]
        if gone:
            logger.warning(
                "Best checkpoints of steps %s are no longer in %s; they are dropped from the record.", gone, model_dir
            )
        return sorted((record for record in records if record.step in steps_on_disk), key=self._rank)


def _changed(recorded: list[BestRecord], kept: list[BestRecord]) -> bool:
    return [(r.step, r.value) for r in kept] != [(r.step, r.value) for r in recorded]
