"""Which versions of a model are served: discovery under a base path, version policy, labels, load, swap.

A ModelManager owns one model name and its ``model_base_path``, and plays the
part of TF Serving's AspiredVersionsManager with AvailabilityPreservingPolicy:

- ``poll()`` lists the integer version folders and asks the version policy
  (config.py's VersionPolicy: ``latest {num_versions}``, ``all``,
  ``specific {versions}``) which of them to serve (the *aspired* versions).
- Each new aspired version is loaded and warmed before it takes traffic,
  highest first: its warm-up file's requests are replayed first when it has
  one (TF's --enable_model_warmup, on by default; serving/warmup.py), then
  each signature runs on a batch of one (warm_up). A failing warm-up fails
  the load. Versions no longer aspired are unloaded only once an aspired
  version serves, so the model never goes dark during a swap; a version that
  fails to load never removes a working one, and its error shows in
  ``statuses()`` (it is retried once its files change).
- The served versions are an immutable mapping replaced whole under the poll
  lock: readers take no lock, and a request holding a model keeps it through
  a swap (it is freed when the last request drops it).
- A base path may be an object-store URL (s3://, gs://, ...): a version counts there once its
  metadata.json is uploaded (an upload in progress is not listed, so it is waited for silently); it is
  copied to the local cache and checked against metadata.json's sha256s before it loads (a damaged one
  fails its load like a broken folder: END, logged once, the old version keeps serving). A store that
  cannot be reached at a poll is logged once and the served versions keep answering.
- Labels (``stable`` -> 42) name served versions; like TF, a label may only be
  assigned to a loaded version unless the caller allows unavailable ones.

HTTP and JSON live in app.py and json_tensor.py; config files in config.py.
Errors raised for requests are ServingError with TF's wording (errors.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

from torchestimator._io.filesystems import is_url
from torchestimator.export import ExportedModel, _store_versions, list_versions, load
from torchestimator.export.receiver import parse_dtype
from torchestimator.export.versions import version_path
from torchestimator.serving.config import ModelConfig, VersionPolicy
from torchestimator.serving.errors import ServingError, invalid_argument, not_found

__all__ = ["ModelManager", "VersionStatus"]

logger = logging.getLogger(__name__)

# TF Serving's ManagerState names (apis/get_model_status.proto).
LOADING = "LOADING"
AVAILABLE = "AVAILABLE"
END = "END"

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


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

    ``get(version)`` / ``resolve(version, label)`` hand out loaded models;
    ``poll()`` (blocking: run it in a worker thread) follows the version policy.
    """

    def __init__(
        self,
        name: str,
        base_path: str | os.PathLike[str],
        *,
        version_policy: VersionPolicy | None = None,
        version_labels: Mapping[str, int] | None = None,
        loader: Callable[[str], ExportedModel] = load,
        model_warmup: bool = True,
    ) -> None:
        if not isinstance(name, str) or not name or "/" in name or ":" in name:
            raise ValueError(f"Model name must be a non-empty string without '/' or ':'; received {name!r}.")
        if version_policy is not None and not isinstance(version_policy, VersionPolicy):
            raise TypeError(
                f"version_policy must be a VersionPolicy or None (latest version only); "
                f"received {type(version_policy).__name__}."
            )
        self.name = name
        self.base_path = os.fspath(base_path)
        self._policy = version_policy or VersionPolicy()
        self._loader = loader
        self._model_warmup = model_warmup  # replay assets.extra/tf_serving_warmup_requests before serving
        self._poll_lock = threading.RLock()  # two polls never load the same version twice
        # Each of these is replaced whole, never mutated: readers need no lock.
        self._served: Mapping[int, ExportedModel] = _EMPTY
        self._statuses: Mapping[int, VersionStatus] = _EMPTY
        self._labels: Mapping[str, int] = _EMPTY
        self._forward_seconds: Mapping[int, float] = _EMPTY  # per loaded version: warm_up's batch-of-one time
        self._failed_fingerprints: dict[int, tuple[Any, ...]] = {}  # only touched under the poll lock
        self._said: dict[str, str] = {}  # topic -> the warning last logged about it (only under the poll lock)
        self._unreachable = False  # a store base that failed its last listing
        if version_labels:
            # Before the first poll nothing is loaded: labels given here are taken as they are.
            self.set_version_labels(version_labels, allow_unavailable=True)

    def __repr__(self) -> str:
        return f"ModelManager({self.name!r}, {self.base_path!r}, serving={self.served_versions})"

    # -- what is served ---------------------------------------------------------------------------

    @property
    def version_policy(self) -> VersionPolicy:
        return self._policy

    @property
    def served_versions(self) -> list[int]:
        """The versions that answer requests now, ascending."""
        return sorted(self._served)

    @property
    def served_version(self) -> int | None:
        """The highest served version (what a request without version or label gets), or None."""
        served = self._served
        return max(served) if served else None

    @property
    def version_labels(self) -> dict[str, int]:
        return dict(self._labels)

    def served_models(self) -> list[ExportedModel]:
        """The loaded models that answer requests now, by ascending version."""
        served = self._served
        return [served[version] for version in sorted(served)]

    def get(self, version: int | None = None) -> ExportedModel | None:
        """The loaded model for ``version`` (the highest served when None), or None if it is not available."""
        served = self._served
        if not served:
            return None
        return served[max(served)] if version is None else served.get(version)

    def resolve(self, version: int | None = None, label: str | None = None) -> tuple[int, ExportedModel]:
        """The (version, model) a request names; ServingError with TF's code and wording when there is none."""
        if version is not None and label is not None:
            raise _both_given(version, label)
        served = self._served  # one snapshot for the whole lookup
        if label is not None:
            version = self._label_version(label)
            if version not in served:
                state = self._state_words(version)
                raise not_found(
                    f"Servable not found for request: Specific({self.name}, {version}) "
                    f"(label {label!r} points at version {version}, which is {state})"
                )
            return version, served[version]
        if version is None:
            if not served:
                raise not_found(f"Servable not found for request: Latest({self.name})")
            version = max(served)
            return version, served[version]
        if version not in served:
            raise not_found(f"Servable not found for request: Specific({self.name}, {version})")
        return version, served[version]

    def forward_seconds(self, version: int) -> float | None:
        """Seconds of one batch-of-one forward of a loaded version, measured when it loaded; None if unknown."""
        return self._forward_seconds.get(version)

    def statuses(self, version: int | None = None, label: str | None = None) -> list[VersionStatus]:
        """Every version this manager has tried, ascending (GetModelStatus); filtered by version or label.

        Raises ServingError as TF's GetModelStatus does: NOT_FOUND "Could not find
        any versions of model <name>" when nothing was tried yet, "Could not find
        version <v> of model <name>" for an unknown version, INVALID_ARGUMENT for an
        unknown label or for both a version and a label.
        """
        if version is not None and label is not None:
            raise _both_given(version, label)
        statuses = self._statuses
        if label is not None:
            version = self._label_version(label)
        if version is None:
            if not statuses:
                raise not_found(f"Could not find any versions of model {self.name}")
            return [statuses[number] for number in sorted(statuses)]
        if version not in statuses:
            raise not_found(f"Could not find version {version} of model {self.name}")
        return [statuses[version]]

    # -- labels and configuration -----------------------------------------------------------------

    def set_version_labels(self, labels: Mapping[str, int], *, allow_unavailable: bool = False) -> None:
        """Replaces the label map (as each TF config reload does). All labels are checked before any changes.

        As TF's ServerCore: each label must point at a version that is AVAILABLE now.
        ``allow_unavailable`` (``--allow_version_labels_for_unavailable_models``)
        lifts that for new labels and unchanged ones only, never for moving an
        existing label, so a label never points at a version still loading.
        """
        checked = _checked_labels(labels, self.name)
        with self._poll_lock:
            served, current = self._served, self._labels
            for label, version in checked.items():
                if version in served:
                    continue
                if allow_unavailable and current.get(label, version) == version:
                    continue
                moving = f" (moving it from version {current[label]})" if label in current else ""
                raise ValueError(
                    f"Request to assign label {label!r} to version {version} of model {self.name}{moving}, "
                    f"which is not currently available for inference (it is {self._state_words(version)}). "
                    "Assign labels to loaded versions only: first make the version policy serve it and wait "
                    "for it to load"
                    + (
                        ""
                        if allow_unavailable
                        else ", or allow labels for unavailable versions (allow_unavailable=True) for a new label"
                    )
                    + "."
                )
            self._labels = MappingProxyType(checked)
        if checked != dict(current):
            logger.info("%s: version labels %s", self.name, checked or "cleared")

    def apply_config(self, config: ModelConfig, *, allow_unavailable_labels: bool = False) -> bool:
        """A config-file reload for this model: base path, version policy, then labels after the poll.

        Returns what ``poll()`` returned. A ValueError from the labels leaves the
        new policy in force (its versions loaded) and the previous labels in place.
        """
        if not isinstance(config, ModelConfig):
            raise TypeError(f"apply_config takes a ModelConfig; received {type(config).__name__}.")
        if config.name != self.name:
            raise ValueError(
                f"apply_config got the config of model {config.name!r} for the manager of model "
                f"{self.name!r}; give each manager its own model's config."
            )
        with self._poll_lock:
            if config.base_path != self.base_path or config.version_policy != self._policy:
                logger.info(
                    "%s: new configuration: base path %s, %s", self.name, config.base_path, config.version_policy
                )
            self.base_path = config.base_path
            self._policy = config.version_policy
            changed = self.poll()
            self.set_version_labels(config.version_labels, allow_unavailable=allow_unavailable_labels)
        return changed

    # -- polling: the aspired-versions loop -------------------------------------------------------

    def poll(self) -> bool:
        """Loads new aspired versions and unloads those no longer aspired; True when the served set changed.

        Blocking (it loads and runs the model): call it from a worker thread in
        an event loop. A version that failed is retried only once its files change.
        """
        with self._poll_lock:
            try:
                on_disk = list_versions(self.base_path)
            except OSError as error:
                if not is_url(self.base_path):
                    raise
                self._store_unreachable(error)
                return False
            self._store_reachable()
            aspired = self._policy.aspired(on_disk)
            if not aspired:
                self._warn_nothing_aspired(on_disk)
                return False
            loaded = [
                version for version in sorted(set(aspired) - set(self._served), reverse=True) if self._load(version)
            ]
            return bool(loaded) | self._unload_unaspired(set(aspired))

    def _load(self, version: int) -> bool:
        in_store = is_url(self.base_path)
        try:
            path = version_path(self.base_path, version)
            fingerprint = _store_versions.version_fingerprint(path) if in_store else _fingerprint(path)
        except OSError as error:
            if not in_store:
                raise
            self._store_unreachable(error)
            return False
        if self._failed_fingerprints.get(version) == fingerprint:
            return False
        previous = self._statuses.get(version)
        self._set_status(VersionStatus(version=version, state=LOADING))
        logger.info("%s: loading version %d from %s", self.name, version, path)
        try:
            model = self._loader(path)  # from a store: copied to the local cache and verified first
            if self._model_warmup:
                from torchestimator.serving.warmup import replay_warmup  # protobuf only when versions load

                replayed = replay_warmup(model, getattr(model, "path", path) if in_store else path)
                if replayed:
                    logger.info("%s: version %d replayed %d warm-up request(s)", self.name, version, replayed)
            forward_seconds = warm_up(model)
        except OSError as error:
            if not in_store:
                return self._load_failed(version, path, fingerprint, error)
            # The store or the cache, not the version: tried again at the next poll, said once until then.
            self._statuses = MappingProxyType(
                {**self._statuses, version: previous}
                if previous
                else {number: status for number, status in self._statuses.items() if number != version}
            )
            self._say_once(
                f"copy {version}",
                logging.ERROR,
                f"{self.name}: could not copy version {version} from "
                f"{path} (tried again at the next poll): {_reason(error)}",
            )
            return False
        except Exception as error:  # any failure keeps the working versions; the status carries the reason
            return self._load_failed(version, path, fingerprint, error)
        # Before the swap, so a request that finds the version finds its time too.
        self._forward_seconds = MappingProxyType({**self._forward_seconds, version: forward_seconds})
        self._served = MappingProxyType({**self._served, version: model})  # the swap: one reference assignment
        self._set_status(VersionStatus(version=version, state=AVAILABLE))
        self._failed_fingerprints.pop(version, None)
        self._said.pop(f"copy {version}", None)
        logger.info("%s: serving version %d", self.name, version)
        return True

    def _load_failed(self, version: int, path: str, fingerprint: tuple[Any, ...], error: Exception) -> bool:
        """Records a version that failed (END, with the reason) and logs it once: it is tried again only
        when its files change."""
        code = "INVALID_ARGUMENT" if isinstance(error, (ValueError, TypeError)) else "UNKNOWN"
        message = _load_error_message(self.name, version, path, error)
        self._set_status(VersionStatus(version=version, state=END, error_code=code, error_message=message))
        self._failed_fingerprints[version] = fingerprint
        logger.error("%s", message)
        return False

    def _unload_unaspired(self, aspired: set[int]) -> bool:
        served = self._served
        unaspired = sorted(set(served) - aspired)
        if not unaspired:
            return False
        if not aspired & set(served):
            # AvailabilityPreservingPolicy: no aspired version serves yet, so the old ones keep answering.
            # Polled every second: said once for as long as it stays so.
            self._say_once(
                "keeping",
                logging.WARNING,
                f"{self.name}: keeping version(s) {unaspired}: none of the "
                f"aspired versions {sorted(aspired)} could be loaded yet",
            )
            return False
        self._served = MappingProxyType({version: model for version, model in served.items() if version in aspired})
        self._forward_seconds = MappingProxyType(
            {version: seconds for version, seconds in self._forward_seconds.items() if version in aspired}
        )
        for version in unaspired:
            self._set_status(VersionStatus(version=version, state=END))
        self._said.pop("keeping", None)
        logger.info("%s: unloaded version(s) %s; serving %s", self.name, unaspired, self.served_versions)
        if is_url(self.base_path):  # their local copies (the cache) go with them
            for version in unaspired:
                _store_versions.forget_cached(f"{self.base_path.rstrip('/')}/{version}")
        return True

    def _store_unreachable(self, error: OSError) -> None:
        """A poll that could not list or read the store: the served versions keep answering; said once."""
        if not self._unreachable:
            serving = f"still serving version(s) {self.served_versions}" if self._served else "no version is served yet"
            logger.error(
                "%s: could not reach %s (%s); %s, trying again at each poll",
                self.name,
                self.base_path,
                _reason(error),
                serving,
            )
            self._unreachable = True

    def _store_reachable(self) -> None:
        if self._unreachable:
            logger.info("%s: %s answers again", self.name, self.base_path)
            self._unreachable = False

    def _say_once(self, topic: str, level: int, message: str) -> None:
        """Logs ``message`` unless it is what was last said about ``topic`` (polls repeat every second)."""
        if self._said.get(topic) != message:
            logger.log(level, "%s", message)
            self._said[topic] = message

    def _warn_nothing_aspired(self, on_disk: list[int]) -> None:
        # TF would unload everything here; a server that answers nothing helps no one, so we keep serving.
        if not self._served:
            return
        if not on_disk:
            message = (
                f"{self.name}: no integer version folders left under {self.base_path}; still serving "
                f"version(s) {self.served_versions}."
            )
        else:
            message = (
                f"{self.name}: the version policy {self._policy} matches none of the versions on disk "
                f"{on_disk}; still serving version(s) {self.served_versions}."
            )
        self._say_once("nothing aspired", logging.WARNING, message)  # polled every second: once, not once a second

    # -- helpers ----------------------------------------------------------------------------------

    def _set_status(self, status: VersionStatus) -> None:
        self._statuses = MappingProxyType({**self._statuses, status.version: status})

    def _label_version(self, label: str) -> int:
        labels = self._labels
        if label not in labels:
            # TF's ServerCore::GetModelVersionForLabel: INVALID_ARGUMENT (REST 400), not NOT_FOUND.
            raise invalid_argument(f"Unrecognized servable version label: {label}")
        return labels[label]

    def _state_words(self, version: int) -> str:
        status = self._statuses.get(version)
        if status is None:
            return "not loaded (never tried)"
        if status.error_code != "OK":
            return f"{status.state} after a failed load: {status.error_message}"
        return status.state


def _reason(error: OSError) -> str:
    """An OSError's words on one line, without the "[Errno 5] ...: 'path'" frame (our messages name the URL)."""
    return " ".join(str(error.strerror or error).split())


def _both_given(version: int, label: str) -> ServingError:
    # SRV http_rest_api_util.cc FillModelSpecWithNameVersionAndLabel
    return invalid_argument(f"Both model version ({version}) and model version label ({label}) cannot be supplied.")


def _checked_labels(labels: Mapping[str, int], name: str) -> dict[str, int]:
    if not isinstance(labels, Mapping):
        raise TypeError(
            f"Version labels of model {name} must be a mapping label -> version; received {type(labels).__name__}."
        )
    checked = {}
    for label, version in labels.items():
        if not isinstance(label, str) or not label or "/" in label or ":" in label:
            raise ValueError(
                f"Version labels of model {name} must be non-empty strings without '/' or ':' "
                f"(they appear in /labels/<label> paths); received {label!r}."
            )
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(
                f"Version label {label!r} of model {name} must map to an int version; received {version!r}."
            )
        checked[label] = version
    return checked


def warm_up(model: ExportedModel) -> float:
    """Runs each signature on a batch of one (zeros), so the first request pays no first-call cost; returns the
    seconds of one such forward (the slowest signature's median of a few timed calls after the first).

    The time decides whether requests to this model may run on the event loop (app.py's inline path):
    only a model measured fast is ever run there, and only when rows times this time bounds a request's
    forward. That holds when every input has fixed sizes past the batch dimension; an input with a free
    size past it (a sequence length, an image side) makes a batch of one as slow as its request makes it,
    so such a model's time is infinite here: it keeps the worker threads and the request timeout.
    """
    slowest = 0.0
    for name in model.signature_names:
        signature = model.signature(name)
        inputs = {}
        # String inputs are decoded before the program runs: warm up the program on its own (decoded) inputs.
        infos = getattr(model, "program_inputs", None) or signature.inputs
        for input_name, info in infos.items():
            shape = [1 if size == -1 else size for size in info.shape]
            inputs[input_name] = torch.zeros(shape, dtype=parse_dtype(info.dtype, f"signature input {input_name!r}"))
            if any(size == -1 for size in info.shape[1:]):
                slowest = math.inf
        model(inputs, signature_name=name)
        slowest = max(slowest, _median_call_seconds(functools.partial(model, inputs, signature_name=name)))
    return slowest


# Timed forwards per signature at load: enough for a median that one disturbed call does not move, and
# never more than about _TIMING_BUDGET_SECONDS of a slow model's load.
_TIMED_CALLS = 5
_TIMING_BUDGET_SECONDS = 0.25


def _median_call_seconds(call: Callable[[], Any]) -> float:
    times: list[float] = []
    spent = 0.0
    while len(times) < _TIMED_CALLS and (spent < _TIMING_BUDGET_SECONDS or not times):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
        spent += times[-1]
    return statistics.median(times)


# A status is shown to every client and logged at each retry: the loader's reason, cut to this length.
_MAX_ERROR_CHARS = 400


def _load_error_message(name: str, version: int, path: str, error: BaseException) -> str:
    """Why a version failed to load, bounded in length, and what the server expects instead."""
    reason = " ".join(str(error).split()) or type(error).__name__
    if len(reason) > _MAX_ERROR_CHARS:
        reason = reason[: _MAX_ERROR_CHARS - 3] + "..."
    return (
        f"Failed to load version {version} of model {name} from {path}: {reason} A version folder must hold "
        "an export written by export_saved_model; fix or replace it (it is retried when its files change)."
    )


# A version folder holds a handful of files; a symlink to a big tree must not make every poll walk all of it.
_MAX_FINGERPRINT_FILES = 1000


def _fingerprint(path: str) -> tuple[Any, ...]:
    """Names, sizes and modification times of a version's files: a failed version is retried when they change."""
    entries: list[tuple[str, int, int]] = []
    for root, _, files in os.walk(path):
        if len(entries) >= _MAX_FINGERPRINT_FILES:
            break
        for file in sorted(files)[: _MAX_FINGERPRINT_FILES - len(entries)]:
            try:
                stat = os.stat(os.path.join(root, file))
            except OSError:
                continue
            entries.append((os.path.relpath(os.path.join(root, file), path), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))
