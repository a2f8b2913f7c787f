"""Which version of a model is served: discovery under a base path, load, warm-up, atomic swap.

A ModelManager owns one model name and its ``model_base_path``. ``poll()``
follows TensorFlow Serving's default policy (``latest { num_versions: 1 }``
with AvailabilityPreservingPolicy): the highest integer version folder is
loaded and warmed before it takes traffic, then the old one is released. A
version that fails to load or warm never replaces the working one; its error
shows in ``statuses()``. HTTP and JSON live in app.py and json_tensor.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from torchestimator.export import ExportedModel, list_versions, load
from torchestimator.export.receiver import parse_dtype
from torchestimator.export.versions import _version_path

__all__ = ["ModelManager", "VersionStatus"]

logger = logging.getLogger(__name__)

# TF Serving's ManagerState names (apis/get_model_status.proto).
AVAILABLE = "AVAILABLE"
LOADING = "LOADING"
END = "END"


@dataclasses.dataclass(frozen=True, kw_only=True)
class VersionStatus:
    """One version's state as TF Serving's GetModelStatus reports it."""

    version: int
    state: str
    """START, LOADING, AVAILABLE, UNLOADING or END."""
    error_code: str = "OK"
    """OK, or the canonical code of the load error (INVALID_ARGUMENT, UNKNOWN)."""
    error_message: str = ""


class ModelManager:
    """Serves one model name from the integer version folders under ``base_path``.

    ``get(version)`` hands out the loaded model; a request keeps its reference
    for its whole run, so unloading an old version never breaks a request in
    flight (the object is freed when the last request drops it).
    """

    def __init__(self, name: str, base_path: str | os.PathLike[str], *,
                 loader: Callable[[str], ExportedModel] = load) -> None:
        if not isinstance(name, str) or not name or "/" in name or ":" in name:
            raise ValueError(f"Model name must be a non-empty string without '/' or ':'; received {name!r}.")
        self.name = name
        self.base_path = os.fspath(base_path)
        self._loader = loader
        self._poll_lock = threading.Lock()  # two polls never load the same version twice
        self._served: tuple[int, ExportedModel] | None = None  # replaced whole: readers need no lock
        self._statuses: dict[int, VersionStatus] = {}
        self._failed_fingerprints: dict[int, tuple[Any, ...]] = {}

    def __repr__(self) -> str:
        return f"ModelManager({self.name!r}, {self.base_path!r}, serving={self.served_version})"

    @property
    def served_version(self) -> int | None:
        served = self._served
        return None if served is None else served[0]

    def get(self, version: int | None = None) -> ExportedModel | None:
        """The loaded model for ``version`` (the latest served when None), or None if it is not available."""
        served = self._served
        if served is None or (version is not None and version != served[0]):
            return None
        return served[1]

    def statuses(self) -> list[VersionStatus]:
        """Every version this manager has tried, ascending: the served one AVAILABLE, others END (with errors)."""
        statuses = dict(self._statuses)
        return [statuses[version] for version in sorted(statuses)]

    def poll(self) -> bool:
        """Loads the highest version if it is new; returns True when the served version changed.

        Blocking (it loads and runs the model): call it from a worker thread in
        an event loop. A version that failed is retried only once its files change.
        """
        with self._poll_lock:
            versions = list_versions(self.base_path)
            if not versions:
                if self._served is not None:
                    logger.warning("%s: no integer version folders left under %s; still serving version %d.",
                                   self.name, self.base_path, self._served[0])
                return False
            target = versions[-1]
            if target == self.served_version:
                return False
            path = _version_path(self.base_path, target)
            fingerprint = _fingerprint(path)
            if self._failed_fingerprints.get(target) == fingerprint:
                return False
            return self._load(target, path, fingerprint)

    def _load(self, version: int, path: str, fingerprint: tuple[Any, ...]) -> bool:
        self._statuses[version] = VersionStatus(version=version, state=LOADING)
        logger.info("%s: loading version %d from %s", self.name, version, path)
        try:
            model = self._loader(path)
            warm_up(model)
        except Exception as error:  # any failure keeps the working version; the status carries the reason
            code = "INVALID_ARGUMENT" if isinstance(error, (ValueError, TypeError)) else "UNKNOWN"
            message = f"Failed to load version {version} of model {self.name} from {path}: {error}"
            self._statuses[version] = VersionStatus(version=version, state=END, error_code=code, error_message=message)
            self._failed_fingerprints[version] = fingerprint
            logger.error("%s", message)
            return False
        previous = self._served
        self._served = (version, model)  # the swap: one reference assignment
        self._statuses[version] = VersionStatus(version=version, state=AVAILABLE)
        self._failed_fingerprints.pop(version, None)
        if previous is not None:
            self._statuses[previous[0]] = VersionStatus(version=previous[0], state=END)
            logger.info("%s: serving version %d; unloaded version %d", self.name, version, previous[0])
        else:
            logger.info("%s: serving version %d", self.name, version)
        return True


def warm_up(model: ExportedModel) -> None:
    """Runs each signature once on a batch of one (zeros), so the first request pays no first-call cost."""
    for name in model.signature_names:
        signature = model.signature(name)
        inputs = {}
        for input_name, info in signature.inputs.items():
            shape = [1 if size == -1 else size for size in info.shape]
            inputs[input_name] = torch.zeros(shape, dtype=parse_dtype(info.dtype, f"signature input {input_name!r}"))
        model(inputs, signature_name=name)


def _fingerprint(path: str) -> tuple[Any, ...]:
    """Names, sizes and modification times of a version's files: a failed version is retried when they change."""
    entries = []
    for root, _, files in os.walk(path):
        for file in sorted(files):
            try:
                stat = os.stat(os.path.join(root, file))
            except OSError:
                continue
            entries.append((os.path.relpath(os.path.join(root, file), path), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))
