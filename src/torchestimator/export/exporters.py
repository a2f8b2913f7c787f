"""Exporters: when train_and_evaluate exports (latest, best, final) and how many versions it keeps.

The interface is tf.estimator's: ``export(estimator, export_path,
checkpoint_path, eval_result, is_the_final_export)`` returns the new version
folder or None. Unlike TF, BestExporter records the best evaluation result in
``export_path/best_eval.json`` and compares against it after a restart rather
than exporting whatever result comes first (tensorflow/tensorflow#47396).
"Better" is ``improvement.Objective``'s rule (strict, NaN never better), the
one best-checkpoint keeping and early stopping use.
Writing a version is saved_model.py's job. Call exporters from one process
(the chief) only. An export path may be an object-store URL (a model_dir on
s3:// or gs://): versions are uploaded (_store_versions.py), best_eval.json is
one PUT, and retention deletes each version's metadata.json first.
"""

from __future__ import annotations

import abc
import inspect
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torchestimator._io import filesystems
from torchestimator._io.atomic import write_json_atomically as _write_json_atomically
from torchestimator._policy.improvement import Objective
from torchestimator._tf_names import accepts_tf_arguments
from torchestimator.export import saved_model
from torchestimator.export.receiver import ServingInputReceiver, as_receiver
from torchestimator.export.versions import list_versions, version_path

if TYPE_CHECKING:
    from torchestimator._core.estimator import Estimator

__all__ = ["BestExporter", "Exporter", "FinalExporter", "LatestExporter", "garbage_collect_exports", "loss_smaller"]

logger = logging.getLogger(__name__)

BEST_EVAL_FILE = "best_eval.json"
CompareFn = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
_LOWER_LOSS = Objective(metric_name="loss", higher_is_better=False)


def loss_smaller(best_eval_result: Mapping[str, Any], current_eval_result: Mapping[str, Any]) -> bool:
    """True when the current evaluation's loss is lower than the best one's (TF's default compare_fn)."""
    return _compare_results(
        _LOWER_LOSS,
        best_eval_result,
        current_eval_result,
        "BestExporter's default compare_fn",
        "Pass compare_fn=..., or metric_name=... with higher_is_better=...",
    )


def metric_compare_fn(metric_name: str, higher_is_better: bool) -> CompareFn:
    """A compare_fn on one metric: True when the current result improves on the best."""
    objective = Objective(metric_name=metric_name, higher_is_better=higher_is_better)

    def compare(best_eval_result: Mapping[str, Any], current_eval_result: Mapping[str, Any]) -> bool:
        return _compare_results(
            objective, best_eval_result, current_eval_result, "BestExporter", "Use one of these names as metric_name."
        )

    compare.__name__ = f"{'higher' if higher_is_better else 'lower'}_{metric_name}"
    return compare


def _compare_results(
    objective: Objective,
    best_eval_result: Mapping[str, Any],
    current_eval_result: Mapping[str, Any],
    role: str,
    advice: str,
) -> bool:
    # The current result first: before anything is recorded it is compared with itself, and a missing metric is
    # then the current evaluation's fault.
    current, best = (
        objective.value(result or {}, role=role, source=f"{which} (the {kind} evaluation)", advice=advice)
        for which, kind, result in (
            ("current_eval_result", "current", current_eval_result),
            ("best_eval_result", "recorded best", best_eval_result),
        )
    )
    return objective.is_better(current, than=best)


class Exporter(abc.ABC):
    """TF's Exporter interface: a name (the folder under model_dir/export/) and export()."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The folder name under model_dir/export/."""

    @abc.abstractmethod
    def export(
        self,
        estimator: Estimator,
        export_path: str,
        checkpoint_path: str | None,
        eval_result: Mapping[str, Any] | None,
        is_the_final_export: bool,
    ) -> str | None:
        """Exports if this exporter's policy says so; returns the new version folder or None."""


class _SavedModelExporter(Exporter):
    """Template for the built-in exporters: check the arguments once, ask the policy, export, keep the newest N."""

    def __init__(
        self,
        name: str,
        serving_input_receiver: Any,
        assets_extra: Mapping[str, Any] | None,
        exports_to_keep: int | None,
    ) -> None:
        if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
            raise ValueError(f"Exporter name must be a non-empty folder name; received {name!r}.")
        if exports_to_keep is not None and (
            isinstance(exports_to_keep, bool) or not isinstance(exports_to_keep, int) or exports_to_keep <= 0
        ):
            raise ValueError(
                f"exports_to_keep must be a positive int or None (keep all); received {exports_to_keep!r}."
            )
        self._name = name
        self._receiver: ServingInputReceiver = as_receiver(serving_input_receiver)
        self._assets_extra = dict(assets_extra) if assets_extra else None
        self._exports_to_keep = exports_to_keep

    @property
    def name(self) -> str:
        return self._name

    def export(
        self,
        estimator: Estimator,
        export_path: str | os.PathLike[str],
        checkpoint_path: str | None,
        eval_result: Mapping[str, Any] | None,
        is_the_final_export: bool,
    ) -> str | None:
        export_path = os.fspath(export_path)
        if not self._should_export(export_path, eval_result, is_the_final_export):
            return None
        already = _newest_export_of(export_path, checkpoint_path, self._receiver)
        if already is not None:  # a rerun evaluating the same checkpoint again: one version is enough
            logger.info("%s: %s is already exported as %s; not exported again.", self._name, checkpoint_path, already)
            return already
        export_dir = saved_model.export_saved_model(
            estimator, export_path, self._receiver, checkpoint_path=checkpoint_path, assets_extra=self._assets_extra
        )
        self._after_export(export_path, export_dir, checkpoint_path, eval_result)
        if self._exports_to_keep is not None:
            garbage_collect_exports(export_path, self._exports_to_keep)
        return export_dir

    def _should_export(
        self, export_path: str, eval_result: Mapping[str, Any] | None, is_the_final_export: bool
    ) -> bool:
        return True

    def _after_export(
        self, export_path: str, export_dir: str, checkpoint_path: str | None, eval_result: Mapping[str, Any] | None
    ) -> None:
        pass


@accepts_tf_arguments("LatestExporter")  # TF's serving_input_receiver_fn=; as_text= refused, saying why
class LatestExporter(_SavedModelExporter):
    """Exports after every evaluation and keeps the newest ``exports_to_keep`` versions."""

    def __init__(
        self,
        name: str,
        serving_input_receiver: Any,
        assets_extra: Mapping[str, Any] | None = None,
        exports_to_keep: int | None = 5,
    ) -> None:
        super().__init__(name, serving_input_receiver, assets_extra, exports_to_keep)


@accepts_tf_arguments("FinalExporter")  # TF's serving_input_receiver_fn=; as_text= refused, saying why
class FinalExporter(_SavedModelExporter):
    """Exports once, at the final evaluation (``is_the_final_export``)."""

    def __init__(self, name: str, serving_input_receiver: Any, assets_extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(name, serving_input_receiver, assets_extra, None)

    def _should_export(
        self, export_path: str, eval_result: Mapping[str, Any] | None, is_the_final_export: bool
    ) -> bool:
        return bool(is_the_final_export)


@accepts_tf_arguments("BestExporter")  # TF's serving_input_receiver_fn=; as_text= refused, saying why
class BestExporter(_SavedModelExporter):
    """Exports when an evaluation beats the recorded best; the best survives restarts in best_eval.json.

    ``compare_fn(best_eval_result, current_eval_result) -> bool`` defaults to a
    lower loss; ``metric_name`` with ``higher_is_better`` is the shorthand for
    one metric. A metric the evaluation does not produce is an error at the
    first evaluation, listing the ones it does.
    """

    def __init__(
        self,
        name: str = "best_exporter",
        serving_input_receiver: Any = None,
        compare_fn: CompareFn | None = None,
        assets_extra: Mapping[str, Any] | None = None,
        exports_to_keep: int | None = 5,
        *,
        metric_name: str | None = None,
        higher_is_better: bool | None = None,
    ) -> None:
        if serving_input_receiver is None:
            raise ValueError("BestExporter needs serving_input_receiver=te.export.serving_input_receiver({...}).")
        super().__init__(name, serving_input_receiver, assets_extra, exports_to_keep)
        self._compare_fn = _resolve_compare_fn(compare_fn, metric_name, higher_is_better)

    def _should_export(
        self, export_path: str, eval_result: Mapping[str, Any] | None, is_the_final_export: bool
    ) -> bool:
        if not eval_result:
            raise ValueError(
                f"BestExporter {self.name!r} needs an evaluation result to compare; received {eval_result!r}."
            )
        current = _jsonable_result(eval_result)
        best = read_best_eval(export_path)
        if best is None:
            # Comparing the result with itself checks that the metric exists before anything is exported.
            _compare(self._compare_fn, current, current)
            logger.info("BestExporter %s: no recorded best in %s; exporting the first result.", self.name, export_path)
            return True
        better = _compare(self._compare_fn, best["eval_result"], current)
        logger.info(
            "BestExporter %s: %s than the recorded best (%s)%s.",
            self.name,
            "better" if better else "not better",
            best.get("export_dir"),
            "; exporting" if better else "",
        )
        return better

    def _after_export(
        self, export_path: str, export_dir: str, checkpoint_path: str | None, eval_result: Mapping[str, Any] | None
    ) -> None:
        record = {
            "eval_result": _jsonable_result(eval_result or {}),
            "export_dir": saved_model.absolute(export_dir),
            "checkpoint_path": checkpoint_path,
        }
        if filesystems.is_url(export_path):  # one PUT: whole or absent
            filesystems.write_bytes(
                filesystems.join(export_path, BEST_EVAL_FILE), json.dumps(record, sort_keys=True).encode("utf-8")
            )
        else:
            _write_json_atomically(os.path.join(export_path, BEST_EVAL_FILE), record)


def _newest_export_of(export_path: str, checkpoint_path: str | None, receiver: ServingInputReceiver) -> str | None:
    """The newest version under ``export_path`` when it was exported from ``checkpoint_path`` with the same
    receiver, else None (weights without a checkpoint, or anything unreadable, export again)."""
    versions = list_versions(export_path)
    if checkpoint_path is None or not versions:
        return None
    newest = version_path(export_path, versions[-1])
    try:
        metadata = json.loads(filesystems.read_bytes(filesystems.join(newest, saved_model.METADATA_FILE)))
    except (OSError, ValueError):
        return None
    same = (
        isinstance(metadata, dict)
        and metadata.get("checkpoint_path") == saved_model.absolute(checkpoint_path)
        and metadata.get("receiver") == json.loads(json.dumps(receiver.describe()))
    )
    return newest if same else None


def read_best_eval(export_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The best evaluation recorded under an exporter's folder, or None."""
    path = filesystems.join(os.fspath(export_path), BEST_EVAL_FILE)
    if not filesystems.is_url(path) and not os.path.exists(path):
        return None
    try:
        record = json.loads(filesystems.read_bytes(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{path} is unreadable ({error}); it records the best evaluation so far. Delete it to start the "
            "comparison afresh (the next evaluation is then exported)."
        ) from error
    if not isinstance(record, dict) or not isinstance(record.get("eval_result"), dict):
        raise ValueError(f"{path} has no 'eval_result' object. Delete it to start the comparison afresh.")
    return record


def garbage_collect_exports(export_path: str | os.PathLike[str], exports_to_keep: int) -> list[str]:
    """Deletes all but the newest ``exports_to_keep`` integer version folders; returns what was deleted.

    In an object store each version's metadata.json goes first (_store_versions.remove_version), and the
    prefixes of uploads killed long ago (no metadata.json, numbered before the versions kept and more than
    an hour ago) go too.
    """
    export_path = os.fspath(export_path)
    if filesystems.is_url(export_path):
        return _garbage_collect_store_exports(export_path, exports_to_keep)
    deleted = []
    for version in list_versions(export_path)[:-exports_to_keep] if exports_to_keep > 0 else []:
        folder = os.path.join(export_path, str(version))
        if not os.path.isdir(folder):  # a zero-padded name: find its real spelling
            folder = next(
                os.path.join(export_path, entry)
                for entry in os.listdir(export_path)
                if entry.isdigit() and int(entry) == version
            )
        try:
            shutil.rmtree(folder)
            deleted.append(folder)
            logger.info("Deleted old export %s (keeping the newest %d).", folder, exports_to_keep)
        except OSError as error:
            logger.warning("Could not delete old export %s: %s", folder, error)
    return deleted


def _garbage_collect_store_exports(export_path: str, exports_to_keep: int) -> list[str]:
    from torchestimator.export import _store_versions

    complete = _store_versions.list_store_versions(export_path)
    ordered = sorted(complete)
    doomed = [complete[version] for version in (ordered[:-exports_to_keep] if exports_to_keep > 0 else [])]
    oldest_kept = ordered[-exports_to_keep] if 0 < exports_to_keep <= len(ordered) else (ordered or [0])[0]
    killed_before = min(oldest_kept, time.time() - _store_versions.STALE_UPLOAD_SECONDS)
    doomed += [
        name
        for version, name in _store_versions.list_store_versions(export_path, complete=False).items()
        if version < killed_before
    ]
    deleted = []
    for name in doomed:
        url = f"{export_path.rstrip('/')}/{name}"
        try:
            _store_versions.remove_version(url)
            deleted.append(url)
            logger.info("Deleted old export %s (keeping the newest %d).", url, exports_to_keep)
        except OSError as error:
            logger.warning("Could not delete old export %s: %s", url, error)
    return deleted


def _resolve_compare_fn(
    compare_fn: CompareFn | None, metric_name: str | None, higher_is_better: bool | None
) -> CompareFn:
    if metric_name is not None:
        if compare_fn is not None:
            raise ValueError("Give BestExporter either compare_fn or metric_name (with higher_is_better), not both.")
        if higher_is_better is None:
            raise ValueError(
                f"BestExporter metric_name={metric_name!r} needs higher_is_better=True (e.g. accuracy) or False (e.g. loss)."
            )
        return metric_compare_fn(metric_name, higher_is_better)
    if higher_is_better is not None:
        raise ValueError("higher_is_better only applies with metric_name=...")
    if compare_fn is None:
        return loss_smaller
    if not callable(compare_fn):
        raise TypeError(
            f"compare_fn must be callable (best_eval_result, current_eval_result) -> bool; received {compare_fn!r}."
        )
    try:
        inspect.signature(compare_fn).bind({}, {})
    except TypeError as error:
        raise ValueError(
            f"compare_fn must take two arguments (best_eval_result, current_eval_result); {compare_fn!r} does not: {error}."
        ) from error
    except ValueError:  # builtins without a signature: trust them
        pass
    return compare_fn


def _compare(compare_fn: CompareFn, best: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    return bool(compare_fn(best, current))


def _jsonable_result(eval_result: Mapping[str, Any]) -> dict[str, Any]:
    """Scalars as floats/ints (tensors and numpy included) so the record survives a restart unchanged."""
    result: dict[str, Any] = {}
    for key, value in eval_result.items():
        if isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
            value = value.tolist() if getattr(value, "ndim", 0) else value.item()
        if isinstance(value, (bool, int, float, str)) or value is None or isinstance(value, list):
            result[str(key)] = value
        else:
            logger.debug("Evaluation result %r (%s) is not recorded in best_eval.json.", key, type(value).__name__)
    return result
