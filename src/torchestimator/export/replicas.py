"""One export for the replicas of a run: replica 0 writes the version, the others return its path.

Belongs here: what ``Estimator.export_saved_model`` does after a train() of several replicas, when each
replica's program goes on to export (a plain script runs the same code in every replica; tf.estimator wrote
one version per task). Replica 0 writes the version as ``export_saved_model`` always does and records which
call it answers in its metadata.json; every other replica writes nothing and waits, polling the export base,
for the version that answers its own call, then returns that path.

No collective: a call made by replica 0 alone (``if strategy.is_chief: export(...)``) returns as soon as it is
written, whether the process group is still up or already gone. A call is named by the run (the random token
every replica shared at train()'s start-up agreement), the export base, the arguments (checkpoint, receiver,
ONNX) and how many such calls this replica made before, so the n-th call of each replica finds replica 0's
n-th, and never a version of an earlier run. A replica waiting for a call replica 0 never makes (only the
others export) gives up after the collective timeout with a TimeoutError that says so.

Does not belong here: writing a version (saved_model.py), choosing when to export during training
(exporters.py, which run on replica 0 only and never wait).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from torchestimator._io import filesystems
from torchestimator.export.versions import list_versions, version_path

__all__ = ["ReplicaExports"]

logger = logging.getLogger(__name__)

_POLL_SECONDS = 0.1
_STORE_POLL_SECONDS = 1.0  # each look at an object store is a LIST request


class ReplicaExports:
    """The replicas of one training run, as its exports see them: who writes, and the calls made so far.

    Args:
        run_token: what every replica of the run shares and no other run has (check_start_agreement's answer).
        replica_id: this replica's rank; 0 writes.
        num_replicas: the run's world size (for messages).
        wait_seconds: how long a replica other than 0 waits for replica 0's version (the collective timeout).
    """

    def __init__(self, run_token: str, replica_id: int, num_replicas: int, wait_seconds: float) -> None:
        self.run_token, self.replica_id, self.num_replicas = run_token, replica_id, num_replicas
        self.wait_seconds = wait_seconds
        self._calls: collections.Counter[str] = collections.Counter()

    @property
    def writes(self) -> bool:
        return self.replica_id == 0

    def export(
        self,
        estimator: Any,
        export_dir_base: str | os.PathLike[str],
        serving_input_receiver: Any,
        *,
        checkpoint_path: str | os.PathLike[str] | None = None,
        assets_extra: Any = None,
        as_onnx: bool = False,
        warmup_requests: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> str:
        """Replica 0: writes the version and returns its path. Others: the path of replica 0's version of this call.

        Raises:
            TimeoutError: (not replica 0) no version answering this call appeared within ``wait_seconds``.
        """
        # Imported here: torch.export's tracer comes with saved_model, and the Estimator imports this module.
        from torchestimator.export import saved_model
        from torchestimator.export.receiver import as_receiver

        base = os.fspath(export_dir_base)
        receiver = as_receiver(serving_input_receiver)
        if not self.writes:  # the arguments are refused here as on replica 0, before any wait
            saved_model._check_assets(assets_extra)
            if as_onnx:
                saved_model.onnx_export.require_onnx_packages()
            if checkpoint_path is not None and not filesystems.exists(checkpoint_path):
                raise ValueError(f"Couldn't find trained model at {os.fspath(checkpoint_path)}: no such checkpoint.")
        call = self._next_call(base, checkpoint_path, estimator.latest_checkpoint(), receiver.describe(), as_onnx)
        if self.writes:
            return saved_model.export_saved_model(
                estimator,
                base,
                receiver,
                checkpoint_path=checkpoint_path,
                assets_extra=assets_extra,
                as_onnx=as_onnx,
                warmup_requests=warmup_requests,
                replica_call=call,
            )
        return self._wait_for_version(base, call, clock, sleep)

    def _next_call(self, base: str, checkpoint_path: Any, latest: str | None, receiver: str, as_onnx: bool) -> str:
        """The name of this call: equal on every replica for their n-th call with these arguments."""
        arguments = json.dumps(
            [
                _normalized(base),
                None if checkpoint_path is None else _normalized(os.fspath(checkpoint_path)),
                None if latest is None else _last_part(latest),
                receiver,
                bool(as_onnx),
            ]
        )
        digest = hashlib.sha256(arguments.encode("utf-8")).hexdigest()[:16]
        self._calls[digest] += 1
        return f"{self.run_token}/{digest}/{self._calls[digest]}"

    def _wait_for_version(
        self, base: str, call: str, clock: Callable[[], float], sleep: Callable[[float], None]
    ) -> str:
        deadline = clock() + self.wait_seconds
        checked: set[int] = set()  # a published version never changes: each is read once
        while True:
            for version in reversed(list_versions(base)):
                if version in checked:
                    continue
                checked.add(version)
                path = version_path(base, version)
                if _answers(path, call):
                    logger.info(
                        "Replica %d of %d: replica 0 exported %s; this replica writes no copy.",
                        self.replica_id,
                        self.num_replicas,
                        path,
                    )
                    return path
            if clock() >= deadline:
                raise TimeoutError(
                    f"Replica {self.replica_id} of {self.num_replicas} waited {self.wait_seconds:g} s for replica "
                    f"0's export to {base} and none appeared. After a train() of several replicas, "
                    "export_saved_model writes one version, on replica 0, and returns its path on every replica "
                    "that calls it: call it in every replica with the same arguments, or only in replica 0 "
                    "(strategy.is_chief), never only in the others; the export base must be storage every "
                    "replica sees. Replica 0 may also have failed: see its error."
                )
            sleep(_STORE_POLL_SECONDS if filesystems.is_url(base) else _POLL_SECONDS)


def _normalized(path: str) -> str:
    """``os.path.normpath`` for a local path; a URL without its trailing '/' (normpath would fold its '//')."""
    return path.rstrip("/") if filesystems.is_url(path) else os.path.normpath(path)


def _last_part(path: str) -> str:
    return _normalized(path).rsplit("/", 1)[-1] if filesystems.is_url(path) else os.path.basename(_normalized(path))


def _answers(path: str, call: str) -> bool:
    from torchestimator.export import saved_model

    try:
        metadata = json.loads(filesystems.read_bytes(filesystems.join(path, saved_model.METADATA_FILE)))
    except (OSError, ValueError):  # a version of someone else's, hand-made or damaged: not ours
        return False
    return isinstance(metadata, dict) and metadata.get(saved_model.REPLICA_CALL_KEY) == call
