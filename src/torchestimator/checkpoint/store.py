"""``CheckpointStore``: save, list, restore and prune the checkpoints of a ``model_dir``.

What belongs here: the policy, written once against the ``Storage`` protocol:
atomic publication of a folder, the manifest (``model_dir/checkpoint``),
retention (``keep_checkpoint_max``, ``keep_checkpoint_every_n_hours``, best
and protected steps), and falling back past damaged checkpoints. The bytes of
one checkpoint folder are ``format.py``'s business.

Writes are atomic: files go to ``.tmp-ckpt-<step>-<pid>-h<host>``, are fsynced, and the
folder is renamed to ``ckpt-<step>`` only when complete (``state.json``, with
the checksums, is written last); then the manifest is replaced atomically.
Listing is the union of the manifest and the ``ckpt-*`` folders that have a
valid ``state.json``, so a crash between rename and manifest loses nothing,
and a missing or unreadable manifest is rebuilt by scanning. The manifest is
the index: a folder it lists is taken as listed (one directory listing and one
file read per save, start or listing, however many checkpoints are kept); only
folders it does not list have their state.json read, ``latest_checkpoint``
reads the newest ones' until one is valid, and restore checks everything it
reads. A file's checksums (sha256, crc32c) are computed while it is written (``hashing.py``), not in
a pass of its own.

Every ``ckpt-<step>`` folder was complete when it appeared, so one that
fails its checks is damage, never work in progress: each is named in a
warning, restore falls back past it, and a ``model_dir`` whose checkpoints
are all damaged is an error (starting over silently would discard the run).
``remove_leftovers`` clears what killed writers left (staging folders
``.tmp-ckpt-*``, set-aside ``.old-ckpt-*``, ``.del-ckpt-*`` being deleted,
temporary manifests).

Saving a step that already exists replaces it (new folder written, then
swapped in): the caller asked for the current state to be saved, and a stale
folder with the same step would be silently wrong after a resume.

A checkpoint of several processes is written by ``torch.distributed.checkpoint``
(DCP): the chief asks ``begin_sharded_save`` for the staging folder, every rank
writes its shards into it, and the chief's ``finish_sharded_save`` seals
state.json over the files the ranks report, then publishes by rename as above.
A staging folder without its sealed state.json (a rank killed during the save)
is never listed, so never restored, and is cleared as a leftover. Reading picks
the format per checkpoint (state.json's ``layout``): a model_dir may hold both
after the world size changed.

Only one process may write (``save``, ``mark_best``, ``finish_sharded_save``); the
store does not know about ranks, the caller guards. Any process may read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from torchestimator._io import filesystems
from torchestimator._io.atomic import WRITER_PATTERN, writer_is_gone, writer_tag

from . import format as checkpoint_format
from ._threads import run_behind
from .errors import CheckpointError, DiskFullError, is_no_room
from .hashing import OverlappedChecksums
from .storage import LocalStorage, Storage
from .tensor_files import EncodedFile

__all__ = ["Checkpoint", "CheckpointStore"]

logger = logging.getLogger(__name__)

_MANIFEST_VERSION = 1
_MANIFEST_CHECKSUM_KEY = "sha256"
# ckpt-<step>, or on a storage without atomic rename ckpt-<step>.<writer>-<random>: a prefix no other save used.
_CHECKPOINT_FOLDER = re.compile(rf"ckpt-(\d+)(?:\.{WRITER_PATTERN}-(?P<save>[0-9a-f]{{6}}))?")
_STALE_UPLOAD_SECONDS = 3600.0
"""On an object store, a prefix with no valid state.json whose writer runs on another machine is a leftover once
nothing was written under it for this long (its writer's pid cannot be checked from here); a saving writer
adds an object at least every part it uploads."""
_WRITTEN_ENTRIES = "__written_entries__"  # in a manifest read back from this store's own write; never written
_LEFTOVER_FOLDER = re.compile(rf"\.(?P<kind>tmp|old|del)-ckpt-(?P<step>\d+)-{WRITER_PATTERN}")


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """One restored checkpoint."""

    path: str
    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: Any | None = None
    """The tree given to ``save``; None when none was saved or it was not requested."""
    extra: dict[str, Any] = field(default_factory=dict)
    sharded: bool = False
    """Written by torch.distributed.checkpoint (several processes); ``optimizer_state`` is then a
    ``dcp_format.ShardedSharedState``, read into the live optimizer by ``parts.restore_shared``."""


class _Entry(NamedTuple):
    """One checkpoint in the manifest (a tuple: a model_dir may list thousands, built at every save)."""

    step: int
    folder: str
    save_time: float
    preserved: bool = False
    """Kept for good by ``keep_checkpoint_every_n_hours``."""


class CheckpointStore:
    """Checkpoints of one ``model_dir``, behind a ``Storage``.

    Args:
        model_dir_or_storage: a directory (``LocalStorage`` is used) or any ``Storage``.
        keep_checkpoint_max: how many of the newest checkpoints to keep; None or 0 keeps all.
        keep_checkpoint_every_n_hours: additionally keep one checkpoint per this many hours.
        protected: steps never deleted, besides those marked with ``mark_best``.
        clock: seconds since the epoch; injectable for tests.
    """

    def __init__(
        self,
        model_dir_or_storage: str | os.PathLike[str] | Storage,
        *,
        keep_checkpoint_max: int | None = 5,
        keep_checkpoint_every_n_hours: float | None = None,
        protected: Iterable[int] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keep_checkpoint_max is not None and (
            isinstance(keep_checkpoint_max, bool) or not isinstance(keep_checkpoint_max, int) or keep_checkpoint_max < 0
        ):
            raise ValueError(
                "keep_checkpoint_max must be None or an int >= 0 (0 and None keep all); "
                f"received {keep_checkpoint_max!r}."
            )
        if keep_checkpoint_every_n_hours is not None and not keep_checkpoint_every_n_hours > 0:
            raise ValueError(
                "keep_checkpoint_every_n_hours must be None or a positive number of hours; "
                f"received {keep_checkpoint_every_n_hours!r}."
            )
        if isinstance(model_dir_or_storage, (str, os.PathLike)):
            self.storage: Storage = _storage_at(model_dir_or_storage)
        else:
            self.storage = model_dir_or_storage
        self.keep_checkpoint_max = keep_checkpoint_max or None
        self.keep_checkpoint_every_n_hours = keep_checkpoint_every_n_hours
        self.protected = frozenset(_check_steps(protected, "protected"))
        self._clock = clock
        self._warned: set[str] = set()  # listing runs at every save: each fault is told once per store
        self._leftovers_cleared = False
        self._has_written = False  # a manifest another live process wrote after this store's is a second run
        self._scan_cache: tuple[list[Any], set[str], list[_Entry], dict[str, str]] | None = None
        """The manifest's entries and the folders of this store's last listing, and what it found."""
        self._manifest_cache: tuple[bytes, dict[str, Any], tuple[_Entry, ...] | None] | None = None
        """The manifest's bytes as this store last wrote or read them, and their parsed document: the next
        save reads the file (one small read) and parses it again only when its bytes differ."""
        self._leftovers_seen = False
        """The last listing saw a folder named like a killed save's leftover."""
        self._encoded_entries: tuple[list[_Entry], list[dict[str, Any]], list[str]] = ([], [], [])
        """The checkpoints of the last manifest written and, for each, its item and that item's JSON: a save in a
        model_dir of 1000 checkpoints encodes only the new one."""

    def __repr__(self) -> str:
        return f"CheckpointStore({self.storage!r}, keep_checkpoint_max={self.keep_checkpoint_max})"

    @property
    def model_dir(self) -> str:
        """The folder this store keeps its checkpoints in (the storage's root), for files kept beside them."""
        return self.storage.root

    # ----------------------------------------------------------------- writing

    def save(
        self,
        step: int,
        model_state: Mapping[str, torch.Tensor],
        optimizer_state: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Write ``ckpt-<step>`` atomically, update the manifest, apply retention; return its path.

        ``optimizer_state`` is any state tree (e.g. ``{"optimizer": ..., "scheduler": ...}``);
        ``extra`` is a str-keyed tree of JSON-like values and tensors (RNG states, input position).
        """
        _check_steps([step], "step")
        for name, value in (("model_state", model_state), ("optimizer_state", optimizer_state), ("extra", extra)):
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f"{name} must be a dict; received {type(value).__name__}.")
        if model_state is None:
            raise TypeError("model_state must be a dict of tensors (module.state_dict()); received None.")
        return self._save(step, model_state, optimizer_state, extra)

    def _save(self, step: int, model_state: Mapping[str, torch.Tensor], optimizer_state: Any, extra: Any) -> str:
        files = checkpoint_format.encode_checkpoint(step, model_state, optimizer_state, extra)
        return self._complete(step, self._new_staging(step), files, already_written=0)

    def begin_sharded_save(self, step: int) -> str:
        """The staging folder (a local path) every rank's DCP writer fills; the chief calls it, then
        ``finish_sharded_save``. Leftovers of killed saves are cleared first."""
        _check_steps([step], "step")
        if _in_object_store(self.storage):  # each rank stages on its own disk and uploads what it wrote
            from . import object_shards

            return object_shards.local_staging(self.storage, self._new_staging(step))
        if not isinstance(self.storage, LocalStorage):
            raise CheckpointError(
                f"Checkpoints of several processes are written by torch.distributed.checkpoint, which needs a model_dir "
                f"on a file system or in an object store; {self.storage!r} is neither."
            )
        return self.storage.location(self._new_staging(step))

    def finish_sharded_save(
        self,
        step: int,
        staging_path: str,
        shard_files: Mapping[str, Mapping[str, Any]],
        shared_tree: Any,
        extra: Mapping[str, Any] | None,
    ) -> str:
        """Seal state.json over the files the ranks wrote into ``staging_path``, publish, apply retention.

        ``shard_files``: DCP's files, {name: {"sha256", "size"}}, gathered from the ranks; chief only.
        """
        staging = os.path.basename(os.path.normpath(staging_path))
        if os.path.normpath(self._staging_location(staging)) != os.path.normpath(staging_path):
            raise ValueError(f"{staging_path} is not a staging folder of {self.storage.root}.")
        files = checkpoint_format.encode_sharded_state(step, shared_tree, extra, shard_files)
        return self._complete(
            step, staging, files, already_written=sum(entry["size"] for entry in shard_files.values())
        )

    def _new_staging(self, step: int) -> str:
        if not self._leftovers_cleared:
            # Once per store: what killed writers left stays until then. Later leftovers (a writer killed
            # meanwhile) are seen by the listing of each save (``_scan``), which clears them after publishing.
            self.remove_leftovers()
            self._leftovers_cleared = True
        if not _renames(self.storage):
            return f"ckpt-{step}.{writer_tag()}-{secrets.token_hex(3)}"  # never used before: written in place
        staging = f".tmp-ckpt-{step}-{writer_tag()}"
        self.storage.delete_folder(staging)
        return staging

    def _complete(
        self, step: int, staging: str, files: checkpoint_format.CheckpointFiles, *, already_written: int
    ) -> str:
        """Stream ``files`` into ``staging`` (hashed while written; state.json, sealed over those digests, last),
        publish it as ``ckpt-<step>``, update the manifest."""
        save_time = float(self._clock())
        folder = f"ckpt-{step}" if _renames(self.storage) else staging
        # Read before publishing, so a first save does not look like a lost manifest.
        manifest = self._read_manifest()
        self._refuse_a_second_writer(manifest, step)
        listing = self._list_folders_behind()  # while the files are written: 1 ms at 1000 checkpoints
        listed: list[_Entry] | None = None
        writing, state_size, committed = staging, 0, False
        failed_file: list[str] = []
        try:
            digests = self._write_contents(staging, files, failed_file)
            # state.json last: on storages without atomic rename it marks completion.
            writing = f"{staging}/{checkpoint_format.STATE_FILE}"
            state_bytes = files.seal(digests)
            state_size = len(state_bytes)
            self.storage.write_file(staging, checkpoint_format.STATE_FILE, state_bytes)
            listed = self._entries(manifest, set(listing.result()) - {staging})  # before this save's folder
            writing = folder
            if staging != folder:
                self._publish(staging, folder)
            replaced = [entry.folder for entry in listed if entry.step == step and entry.folder != folder]
            writing = "checkpoint"
            self._apply_retention(manifest, _with_entry(listed, step, folder, save_time), newest=step)
            committed = True  # the manifest lists it: never deleted as a failed save from here on
            for earlier in replaced:  # a store without rename: the earlier save of this step, now unlisted
                self._delete_quietly(earlier)
            if self._leftovers_seen:
                self.remove_leftovers()
        except OSError as error:
            # Whatever failed, the partial checkpoint goes now rather than at the next start-up
            # (after the rename there is no staging folder left, and deleting it is a no-op).
            if not committed:
                self._delete_quietly(staging)  # also gives back the space the partial checkpoint took
            if not is_no_room(error):
                raise
            if failed_file:
                writing = f"{staging}/{failed_file[0]}"
            previous = (
                [entry.folder for entry in listed]
                if listed is not None
                else [item["folder"] for item in manifest["checkpoints"]]
            )
            previous = [name for name in previous if name != folder]
            raise DiskFullError(
                error,
                path=self.storage.location(writing),
                what=f"the checkpoint of step {step}",
                bytes_needed=already_written + files.size + state_size,
                free_bytes=self.storage.free_bytes(),
                advice=(f"The newest intact checkpoint is {self.storage.location(previous[-1])}. " if previous else "")
                + "Free some space (or choose a model_dir with room) and rerun: training resumes from the newest "
                "intact checkpoint.",
            ) from error
        path = self.storage.location(folder)
        logger.info("Saved checkpoint for step %d to %s.", step, path)
        return path

    def _write_contents(
        self, staging: str, files: checkpoint_format.CheckpointFiles, failed_file: list[str]
    ) -> dict[str, dict[str, Any]]:
        """Write every file of ``files`` but state.json into ``staging``; their digests, taken while written.
        The name of a file whose write fails is appended to ``failed_file`` (an error then names it).

        On a disk one file follows the other (each fsynced). On an object store each file is an upload of its
        own, and up to the storage's ``files_in_flight`` go side by side: one PUT leaves most of the link idle
        (a model and its optimizer state, sent together, take about half the time). Every upload has ended,
        written or failed, before this returns or raises, so no late write lands in a prefix being deleted.
        """
        names = list(files.contents)
        parallel = min(len(names), max(1, int(getattr(self.storage, "files_in_flight", 1))))
        if parallel == 1:
            digests = {}
            for name in names:
                failed_file[:] = [name]
                digests[name] = self._write_one(staging, name, files.contents[name])
            failed_file.clear()
            return digests
        with ThreadPoolExecutor(parallel, thread_name_prefix="torchestimator-upload") as pool:
            futures = {name: pool.submit(self._write_one, staging, name, files.contents[name]) for name in names}
            done, _ = wait(futures.values(), return_when=FIRST_EXCEPTION)
            if any(future.exception() is not None for future in done):
                for future in futures.values():
                    future.cancel()  # those not started; the ones sending end on their own (each is bounded)
        failed = [name for name, future in futures.items() if not future.cancelled() and future.exception() is not None]
        if failed:
            failed_file.append(failed[0])
            error = futures[failed[0]].exception()
            assert error is not None  # failed lists the futures that raised
            raise error
        return {name: future.result() for name, future in futures.items()}

    def _write_one(self, staging: str, filename: str, content: EncodedFile) -> dict[str, Any]:
        with OverlappedChecksums() as checksums:  # computed behind the write and its fsync
            self.storage.write_file(staging, filename, checksums.passing(content.chunks))
            digest = checksums.result()
        if digest["size"] != content.size:
            raise CheckpointError(
                f"{self.storage!r}.write_file returned before writing all of {filename}: "
                "a Storage must consume every buffer it is given."
            )
        return digest

    def _refuse_a_second_writer(self, manifest: dict[str, Any], step: int) -> None:
        """CheckpointError when another process that still runs wrote the manifest since this store last did: two
        runs saving into one model_dir would each delete the other's checkpoints by retention and resume from a
        mix. The first save of a run takes the model_dir over (its predecessor stopped or died)."""
        other = manifest.get("writer")
        if not self._has_written or not isinstance(other, str) or other == writer_tag():
            return
        match = re.fullmatch(WRITER_PATTERN, other)
        if match is not None and writer_is_gone(int(match.group("pid")), match.group("host")):
            return
        raise CheckpointError(
            f"Two runs are writing {self.storage.root}: this one (process {writer_tag()}) and process {other}, which "
            f"saved a checkpoint since this one's last save. This run stops without saving step {step}. Give each "
            "run its own model_dir (or stop the other run first: the next save of a run takes the model_dir over)."
        )

    def discard_staging(self, staging_path: str) -> None:
        """Remove a staging folder whose save failed (a rank could not write its shards)."""
        self._delete_quietly(os.path.basename(os.path.normpath(staging_path)))
        self.release_staging(staging_path)

    def _staging_location(self, staging: str) -> str:
        if _in_object_store(self.storage):
            from . import object_shards

            return object_shards.staging_path(self.storage, staging)
        return self.storage.location(staging)

    def upload_shards(self, staging_path: str, names: Iterable[str]) -> None:
        """Every rank, after DCP wrote its files into ``staging_path``: with a model_dir in an object store, put
        them under the save's prefix; nothing to do on a file system (they are in model_dir already)."""
        if _in_object_store(self.storage):
            from . import object_shards

            object_shards.upload_shards(
                self.storage, os.path.basename(os.path.normpath(staging_path)), staging_path, names
            )

    def release_staging(self, staging_path: str) -> None:
        """Every rank, once the save is published or abandoned: drop its local staging folder (object stores)."""
        if _in_object_store(self.storage):
            from . import object_shards

            object_shards.remove_local_staging(staging_path)

    def _publish(self, staging: str, folder: str) -> None:
        try:
            self.storage.rename_folder(staging, folder)
            return
        except FileExistsError:
            pass
        # A directory rename cannot replace a non-empty one: move the old aside, then swap.
        previous = f".old-{folder}-{writer_tag()}"
        self.storage.delete_folder(previous)
        self.storage.rename_folder(folder, previous)
        self.storage.rename_folder(staging, folder)
        self.storage.delete_folder(previous)
        logger.info("Replaced the existing checkpoint %s.", self.storage.location(folder))

    def remove_leftovers(self) -> None:
        """Remove what saves killed midway left: staging and set-aside folders, temporary manifests.

        Only names this store writes, and only those of writers that are gone
        (a live process's pid is left alone). A set-aside ``.old-ckpt-<step>``
        whose replacement never appeared is put back.
        """
        present = set(self.storage.list_folders())
        if not _renames(self.storage):
            self._remove_unsealed_prefixes(present)
            return
        for folder in sorted(present):
            match = _LEFTOVER_FOLDER.fullmatch(folder)
            if match is None or not writer_is_gone(int(match.group("pid")), match.group("host")):
                continue
            target, step = f"ckpt-{match.group('step')}", int(match.group("step"))
            if match.group("kind") == "old" and target not in present and self._is_complete(folder, step):
                self.storage.rename_folder(folder, target)
                present.add(target)
                logger.warning("Put back %s: a save that replaced it was interrupted.", self.storage.location(target))
                continue
            logger.info("Removing %s, left behind by an interrupted save.", self.storage.location(folder))
            self._delete_quietly(folder)
        self.storage.remove_stale_temporaries()

    def _remove_unsealed_prefixes(self, present: set[str]) -> None:
        """On a storage without rename: remove the save prefixes without a valid state.json whose writer is gone
        (its pid, on this machine; elsewhere, nothing written for ``_STALE_UPLOAD_SECONDS``)."""
        for folder in sorted(present):
            match = _CHECKPOINT_FOLDER.fullmatch(folder)
            if match is None or match.group("save") is None or self._is_complete(folder, int(match.group(1))):
                continue
            if not writer_is_gone(int(match.group("pid")), match.group("host")):
                if match.group("host") == writer_tag().split("-h", 1)[1]:
                    continue  # a live process of this machine: a save in progress
                age = getattr(self.storage, "folder_age_seconds", lambda _: None)(folder)
                if age is None or age < _STALE_UPLOAD_SECONDS:
                    continue
            logger.info("Removing %s, left behind by an interrupted save.", self.storage.location(folder))
            self._delete_quietly(folder)

    def _is_complete(self, folder: str, step: int) -> bool:
        try:
            checkpoint_format.read_state(self.storage, folder, step)
        except CheckpointError:
            return False
        return True

    def _delete_quietly(self, folder: str) -> None:
        try:
            self.storage.delete_folder(folder)
        except OSError as error:
            logger.warning("Could not delete %s: %s", self.storage.location(folder), error)

    def _apply_retention(self, manifest: dict[str, Any], entries: list[_Entry], *, newest: int) -> None:
        """Decide what to keep, write the manifest, then delete the rest."""
        best = set(manifest["best"])
        interval = None if self.keep_checkpoint_every_n_hours is None else self.keep_checkpoint_every_n_hours * 3600
        anchor = manifest.get("hours_anchor")
        if anchor is None and entries:
            anchor = min(entry.save_time for entry in entries)
        # The newest keep_checkpoint_max stay; only those before them are looked at (usually one).
        split = 0 if self.keep_checkpoint_max is None else max(0, len(entries) - self.keep_checkpoint_max)
        kept, deleted = [], []
        for entry in entries[:split]:
            if entry.step == newest or entry.preserved or entry.step in best or entry.step in self.protected:
                kept.append(entry)
            elif interval is not None and anchor is not None and entry.save_time >= anchor + interval:
                # Like tf.train.Saver: the first checkpoint leaving the window an interval after the last one kept.
                kept.append(_Entry(entry.step, entry.folder, entry.save_time, preserved=True))
                anchor = entry.save_time
            else:
                deleted.append(entry)
        kept.extend(entries[split:])
        manifest.update(hours_anchor=anchor)
        self._write_manifest(manifest, kept)
        for entry in deleted:
            if not _renames(self.storage):  # its state.json goes first: a deletion cut short is no checkpoint
                self._delete_quietly(entry.folder)
                continue
            # Renamed first, so a kill during the deletion leaves a leftover to clear, not a half ckpt-<step>.
            doomed = f".del-{entry.folder}-{writer_tag()}"
            try:
                self.storage.rename_folder(entry.folder, doomed)
                self.storage.delete_folder(doomed)
                logger.debug("Deleted old checkpoint %s.", self.storage.location(entry.folder))
            except OSError as error:
                logger.warning("Could not delete old checkpoint %s: %s", self.storage.location(entry.folder), error)

    def mark_best(self, steps: Iterable[int]) -> None:
        """Set the steps listed as ``best`` in the manifest; retention never deletes them."""
        steps = sorted(set(_check_steps(steps, "steps")))
        manifest = self._read_manifest()
        entries = self._entries(manifest)
        known = {entry.step for entry in entries}
        unknown = [step for step in steps if step not in known]
        if unknown:
            raise ValueError(
                f"Cannot mark steps {unknown} as best: no such checkpoint in {self.storage.root}. "
                f"Available steps: {sorted(known)}."
            )
        manifest["best"] = steps
        self._write_manifest(manifest, entries)

    # ----------------------------------------------------------------- listing

    def latest_checkpoint(self) -> str | None:
        """Path of the newest checkpoint with a valid ``state.json``; None if there is none.

        Checksums are verified by ``restore``, which falls back past a damaged one. The manifest is the
        index: only the newest entries' state.json are read, until one is valid (usually one file).
        """
        entries = self._entries_to_newest_intact(self._read_manifest())
        return self.storage.location(entries[-1].folder) if entries else None

    def all_checkpoints(self) -> list[str]:
        """Paths of all complete checkpoints, oldest (lowest step) first (up to the newest intact one)."""
        return [self.storage.location(entry.folder) for entry in self._entries_to_newest_intact(self._read_manifest())]

    def _entries_to_newest_intact(self, manifest: dict[str, Any]) -> list[_Entry]:
        """The listed checkpoints, less those newer than the newest whose state.json is valid: what a reader
        is offered agrees with ``latest_checkpoint``; an older damaged one is restore's to skip."""
        entries = self._entries(manifest)
        while entries:
            try:
                checkpoint_format.read_state(self.storage, entries[-1].folder, entries[-1].step)
                break
            except CheckpointError as error:
                self._warn_once(
                    f"Ignoring checkpoint {self.storage.location(entries[-1].folder)}, it is damaged: {error}"
                )
                entries.pop()
        return entries

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest as JSON data, reconciled with the folders actually present."""
        manifest = self._read_manifest()
        return self._manifest_document(manifest, self._entries(manifest))

    def history(self) -> list[dict[str, Any]]:
        """One dict per checkpoint, oldest first: step, path, save_time, best, preserved."""
        manifest = self._read_manifest()
        best = set(manifest["best"]) | self.protected
        return [
            {
                "step": entry.step,
                "path": self.storage.location(entry.folder),
                "save_time": entry.save_time,
                "best": entry.step in best,
                "preserved": entry.preserved,
            }
            for entry in self._entries_to_newest_intact(manifest)
        ]

    def has_checkpoints(self) -> bool:
        """True when ``model_dir`` holds any ``ckpt-<step>`` folder, intact or not (on an object store: with a
        state.json; a save prefix without one is a save cut short, never a checkpoint)."""
        return any(_is_checkpoint_folder(self.storage, folder) for folder in self.storage.list_folders())

    def _entries(self, manifest: dict[str, Any], folders: set[str] | None = None) -> list[_Entry]:
        return self._scan(manifest, folders)[0]

    def _list_folders_behind(self) -> Future[list[str]]:
        """The model_dir's folders, listed on a helper thread for a local model_dir (the listing waits on the
        file system, as the writes beside it do); at once for any other storage, whose listing may not be
        safe beside its writes."""
        if isinstance(self.storage, LocalStorage):
            return run_behind("listing", self.storage.list_folders)
        listed: Future[list[str]] = Future()
        listed.set_result(self.storage.list_folders())
        return listed

    def _scan(self, manifest: dict[str, Any], folders: set[str] | None = None) -> tuple[list[_Entry], dict[str, str]]:
        """Checkpoints by step, and the rejected folders with the reason, each named once in a warning.

        The manifest is the index: a folder it lists is taken as it says (it was complete when it appeared;
        damage found later is restore's to skip), so listing reads one file however many checkpoints are
        kept. Only a ``ckpt-*`` folder the manifest does not list (published just before a crash, or no
        manifest at all) has its state.json read and checked.
        """
        folders = set(self.storage.list_folders()) if folders is None else folders
        cache = self._scan_cache
        if cache is not None and cache[1] == folders and cache[0] == manifest["checkpoints"]:
            return list(cache[2]), dict(cache[3])  # nothing changed since this store's last listing
        entries, rejected = self._scan_folders(manifest, folders)
        self._scan_cache = (list(manifest["checkpoints"]), folders, entries, rejected)
        return list(entries), dict(rejected)

    def _scan_folders(self, manifest: dict[str, Any], folders: set[str]) -> tuple[list[_Entry], dict[str, str]]:
        entries, rejected = [], {}
        written = manifest.get(_WRITTEN_ENTRIES)
        if written is not None:  # this store wrote the manifest: its entries are at hand, in order
            entries = [entry for entry in written if entry.folder in folders]
            listed: dict[str, Any] = {}  # what the entries say: nothing more to take from the items
            missing = sorted({entry.folder for entry in written} - folders)
        else:
            listed = {item["folder"]: item for item in manifest["checkpoints"]}
            missing = sorted(set(listed) - folders)
        for folder, item in listed.items():  # the index: no file read
            save_time = item.get("save_time")
            match = _CHECKPOINT_FOLDER.fullmatch(folder)
            if (
                folder in folders
                and match is not None
                and int(match.group(1)) == item["step"]
                and isinstance(save_time, (int, float))
                and not isinstance(save_time, bool)
            ):
                entries.append(_Entry(item["step"], folder, float(save_time), bool(item.get("preserved"))))
        found = {entry.folder for entry in entries}
        self._leftovers_seen = False
        for folder in sorted(folders - found):  # not in the manifest (or listed wrongly): read and checked
            match = _CHECKPOINT_FOLDER.fullmatch(folder)
            if match is None:
                self._leftovers_seen = self._leftovers_seen or _LEFTOVER_FOLDER.fullmatch(folder) is not None
                continue
            step, item = int(match.group(1)), listed.get(folder, {})
            try:
                state = checkpoint_format.read_state(self.storage, folder, step)
            except CheckpointError as error:
                if match.group("save") is not None and _unsealed(self.storage, folder):
                    self._leftovers_seen = True  # a save in progress, or one cut short: never a checkpoint
                    continue
                rejected[folder] = str(error)
                # A save prefix the manifest never listed, with a damaged state.json: a killed writer's debris (its
                # body cut short) that remove_leftovers clears once the writer is gone, as it clears unsealed ones.
                self._leftovers_seen = self._leftovers_seen or match.group("save") is not None
                self._warn_once(f"Ignoring checkpoint {self.storage.location(folder)}, it is damaged: {error}")
                continue
            save_time = item.get("save_time", state.get("save_time"))  # format 1 kept it in state.json
            if not isinstance(save_time, (int, float)) or isinstance(save_time, bool):
                save_time = self._clock()  # not in the manifest yet: found now
            entries.append(_Entry(step, folder, float(save_time), bool(item.get("preserved"))))
        for folder in missing:
            location = self.storage.location(folder)
            self._warn_once(f"The manifest lists {location}, but the folder is missing; ignoring it.")
        return _one_per_step(entries, set(listed) or {entry.folder for entry in written or ()}), rejected

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("%s", message)

    # ---------------------------------------------------------------- manifest

    def _read_manifest(self) -> dict[str, Any]:
        empty = {"format_version": _MANIFEST_VERSION, "checkpoints": [], "best": [], "hours_anchor": None}
        data = self.storage.read_manifest()
        if data is None:
            folders = [folder for folder in self.storage.list_folders() if _is_checkpoint_folder(self.storage, folder)]
            if len(folders) == 1:
                # The first save publishes its folder, then writes the manifest: a reader (the evaluator task)
                # in between sees this, and the scan finds what the manifest will say. Not damage.
                logger.debug("No manifest yet in %s beside %s; scanning the folders.", self.storage.root, folders[0])
            elif folders:
                self._warn_once(
                    f"The manifest {self.storage.root}/checkpoint is missing; rebuilding the list of checkpoints by "
                    "scanning the folders."
                )
            return empty
        if self._manifest_cache is not None and self._manifest_cache[0] == data:
            # The bytes this store last wrote or read (its own save wrote them): parsed and checked then.
            cached, entries = self._manifest_cache[1], self._manifest_cache[2]
            manifest = {**cached, "checkpoints": list(cached["checkpoints"]), "best": list(cached["best"])}
            if entries is not None:
                manifest[_WRITTEN_ENTRIES] = entries  # the entries those bytes were made of: no item to check again
            return manifest
        try:
            manifest = json.loads(data.decode("utf-8"))
            _check_manifest(manifest)
            fault = checkpoint_format.seal_fault(data, manifest, _MANIFEST_CHECKSUM_KEY)
            if fault is not None and _MANIFEST_CHECKSUM_KEY in manifest:  # manifests written before it had none
                raise ValueError(fault)
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError, KeyError) as error:
            self._warn_once(
                f"The manifest {self.storage.root}/checkpoint is unreadable ({error}); rebuilding the list of "
                "checkpoints by scanning the folders."
            )
            return empty
        manifest.pop(_MANIFEST_CHECKSUM_KEY, None)
        manifest = {**empty, **manifest}
        self._manifest_cache = (data, manifest, None)
        return {**manifest, "checkpoints": list(manifest["checkpoints"]), "best": list(manifest["best"])}

    def _write_manifest(self, manifest: dict[str, Any], entries: list[_Entry]) -> None:
        items, texts = self._encode_entries(entries)
        document = {**self._manifest_document(manifest, entries, items), "writer": writer_tag()}
        data = checkpoint_format.sealed_json(
            document, _MANIFEST_CHECKSUM_KEY, compact=True, encoded={"checkpoints": "[" + ", ".join(texts) + "]"}
        )
        self._manifest_cache = None  # until the new bytes are in place
        self.storage.replace_manifest(data)
        self._manifest_cache = (data, document, tuple(entries))
        self._has_written = True

    def _encode_entries(self, entries: list[_Entry]) -> tuple[list[dict[str, Any]], list[str]]:
        """The manifest items of ``entries`` and their JSON, reusing those of the last manifest written.

        A training's save lists what the last one did, less the oldest (retention) and plus the newest: that
        run of entries is found by comparing the lists (C loops over the same objects), and only the rest is
        looked up entry by entry.
        """
        previous, previous_items, previous_texts = self._encoded_entries
        start = _run_start(previous, entries)
        if start is None:
            known = dict(zip(previous, zip(previous_items, previous_texts))).get
            pairs = [known(entry) or _encoded_item(entry) for entry in entries]
            items, texts = [item for item, _ in pairs], [text for _, text in pairs]
        else:
            new = [_encoded_item(entry) for entry in entries[len(previous) - start :]]
            items = previous_items[start:] + [item for item, _ in new]
            texts = previous_texts[start:] + [text for _, text in new]
        self._encoded_entries = (list(entries), items, texts)  # only those listed now: never more than the manifest
        return items, texts

    @staticmethod
    def _manifest_document(
        manifest: dict[str, Any], entries: list[_Entry], items: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        return {
            "format_version": _MANIFEST_VERSION,
            "latest": entries[-1].folder if entries else None,
            "checkpoints": [_manifest_item(entry) for entry in entries] if items is None else items,
            "best": sorted(manifest["best"]),
            "hours_anchor": manifest.get("hours_anchor"),
        }

    # ----------------------------------------------------------------- reading

    def restore(self, path: str | None = None, *, verify: bool = True, load_optimizer: bool = True) -> Checkpoint:
        """Load a checkpoint: ``path``, or the newest intact one when ``path`` is None.

        With ``path=None``, a damaged newest checkpoint (checksum mismatch,
        missing or truncated file, bad JSON) is skipped with a warning naming
        it and the fault, and the previous one is tried. An explicit ``path``
        is never replaced by another checkpoint: its damage raises.

        The tensors of a local model_dir are copy-on-write views of the files,
        checked whole first (``tensor_files.read_tensors``): writing to them
        never changes a file, and a file deleted stays readable through them.
        A published file is never rewritten by the store; a tool that rewrites
        one in place (``rsync --inplace``, a restore from backup) changes what
        such tensors read, or ends the process with SIGBUS if it truncates the
        file. To keep tensors apart from the files, copy them
        (``parts.owning_memory``), as resuming does for the optimizer's state.

        Raises:
            CheckpointError: no intact checkpoint, or ``path`` is damaged.
        """
        if path is not None and os.path.normpath(os.fspath(path)) != os.path.normpath(self.storage.root):
            storage, folder, step = self._locate(path)
            return _load(storage, folder, step, verify=verify, load_optimizer=load_optimizer)
        entries, rejected = self._scan(self._read_manifest())
        if not entries and not rejected:
            raise CheckpointError(
                f"No checkpoint in {self.storage.root}: nothing to restore. "
                "Train first, or pass the path of a checkpoint."
            )
        failures = dict(rejected)
        for entry in reversed(entries):
            try:
                return _load(self.storage, entry.folder, entry.step, verify=verify, load_optimizer=load_optimizer)
            except CheckpointError as error:
                failures[entry.folder] = str(error)
                logger.warning(
                    "Checkpoint %s is unusable, falling back to the previous one: %s",
                    self.storage.location(entry.folder),
                    error,
                )
        ordered = sorted(failures, key=_step_of)
        raise CheckpointError(
            f"None of the {len(failures)} checkpoint(s) in {self.storage.root} is intact; nothing was restored:\n  "
            + "\n  ".join(f"{folder}: {failures[folder]}" for folder in ordered)
            + f"\nTo keep this training, put back an intact copy of a checkpoint. To start over from step 0, move "
            f"the ckpt-* folders out of {self.storage.root} (or use a new model_dir)."
        )

    def read_model_state(self, path: str | None = None) -> dict[str, torch.Tensor]:
        """The model's tensors of ``path`` (default: newest intact checkpoint)."""
        return self.restore(path, load_optimizer=False).model_state

    def list_variables(self, path: str | None = None) -> list[tuple[str, tuple[int, ...], Any]]:
        """(name, shape, dtype) of each model tensor, sorted by name, reading only the file header."""
        if path is None:
            latest = self.latest_checkpoint()
            if latest is None:
                raise CheckpointError(f"No checkpoint in {self.storage.root}: no variables to list.")
            storage, folder = self.storage, os.path.basename(latest)
        else:
            storage, folder, _ = self._locate(path)
        state = checkpoint_format.read_state(storage, folder, _step_of(folder))
        if checkpoint_format.is_sharded(state):
            from . import dcp_format  # torch.distributed.checkpoint takes seconds to import: only when needed

            location = storage.location(folder)
            if _in_object_store(storage):
                from . import object_shards

                metadata_file = checkpoint_format.DCP_METADATA_FILE
                location = object_shards.download_checkpoint(
                    storage, folder, {metadata_file: state["files"][metadata_file]}
                )
            return dcp_format.variables(dcp_format.read_metadata(location))
        return checkpoint_format.read_safetensors_header(storage, folder, checkpoint_format.MODEL_FILE)

    def _locate(self, path: str | os.PathLike[str]) -> tuple[Storage, str, int]:
        """The storage, folder and step of a checkpoint path, inside this model_dir or another local one."""
        if filesystems.is_url(path):
            normalized = os.fspath(path).rstrip("/")
            parent, folder = normalized.rsplit("/", 1)
        else:
            normalized = os.path.normpath(filesystems.local_path(path))
            parent, folder = os.path.split(normalized)
        match = _CHECKPOINT_FOLDER.fullmatch(folder)
        if match is None:
            raise CheckpointError(
                f"{path} is not a checkpoint path: expected .../ckpt-<step>, as returned by latest_checkpoint()."
            )
        if parent in (self.storage.root, os.path.normpath(self.storage.root)):
            storage: Storage = self.storage
        elif filesystems.is_url(parent):
            storage = _storage_at(parent)
        elif os.path.isdir(normalized):
            storage = LocalStorage(parent)
        else:
            raise CheckpointError(f"No checkpoint folder at {path}.")
        if folder not in storage.list_folders():
            raise CheckpointError(f"No checkpoint folder at {path}.")
        return storage, folder, int(match.group(1))


def _step_of(folder: str) -> int:
    """The step of a checkpoint folder's name (``ckpt-N``, or a save of it being written)."""
    match = _CHECKPOINT_FOLDER.fullmatch(folder)
    assert match is not None, f"{folder} is not a checkpoint folder"  # callers pass only those
    return int(match.group(1))


def _load(storage: Storage, folder: str, step: int, *, verify: bool, load_optimizer: bool) -> Checkpoint:
    state = checkpoint_format.read_state(storage, folder, step)
    if checkpoint_format.is_sharded(state):
        return _load_sharded(storage, folder, step, state, verify=verify, load_optimizer=load_optimizer)
    location = storage.location(folder)
    model_file = checkpoint_format.MODEL_FILE
    model_state = checkpoint_format.read_tensor_file(storage, folder, model_file, state, verify)
    optimizer_state = None
    if load_optimizer and checkpoint_format.OPTIMIZER_TREE_FILE in state["files"]:
        optimizer_state = checkpoint_format.read_tree(
            storage,
            folder,
            state,
            verify,
            tree_file=checkpoint_format.OPTIMIZER_TREE_FILE,
            tensors_file=checkpoint_format.OPTIMIZER_TENSORS_FILE,
        )
    extra = checkpoint_format.read_tree(
        storage, folder, state, verify, tree_file=None, tensors_file=checkpoint_format.EXTRA_TENSORS_FILE
    )
    return Checkpoint(path=location, step=step, model_state=model_state, optimizer_state=optimizer_state, extra=extra)


def _load_sharded(
    storage: Storage, folder: str, step: int, state: dict[str, Any], *, verify: bool, load_optimizer: bool
) -> Checkpoint:
    """A checkpoint DCP wrote: whole weights read here (resharded, whatever number of ranks wrote them); the
    optimizer's tensors are read later, into the live optimizer (``parts.restore_shared``)."""
    from . import dcp_format  # torch.distributed.checkpoint takes seconds to import: only when needed

    location = storage.location(folder)
    if _in_object_store(storage):  # DCP reads local folders: a copy, every file checked as it arrives
        from . import object_shards

        location = object_shards.download_checkpoint(storage, folder, state["files"])
    elif not isinstance(storage, LocalStorage):
        raise CheckpointError(
            f"{location} was written by torch.distributed.checkpoint, which reads local folders only."
        )
    elif verify:
        checkpoint_format.verify_listed_files(storage, folder, state, sorted(state["files"]))
    metadata = dcp_format.read_metadata(location)
    model_state = dcp_format.load_full_tensors(location, metadata)
    shared = None
    if load_optimizer and checkpoint_format.OPTIMIZER_TREE_FILE in state["files"]:
        tree = checkpoint_format.read_json_tree(storage, folder, state, verify, checkpoint_format.OPTIMIZER_TREE_FILE)
        shared = dcp_format.ShardedSharedState(path=location, tree=tree, metadata=metadata)
    extra = checkpoint_format.read_tree(
        storage, folder, state, verify, tree_file=None, tensors_file=checkpoint_format.EXTRA_TENSORS_FILE
    )
    return Checkpoint(
        path=storage.location(folder),
        step=step,
        model_state=model_state,
        optimizer_state=shared,
        extra=extra,
        sharded=True,
    )


def _in_object_store(storage: Storage) -> bool:
    """An ObjectStorage: a model_dir at an s3://, gs://, az:// or memory:// URL."""
    return not _renames(storage) and hasattr(storage, "_fs")


def _renames(storage: Storage) -> bool:
    """Whether ``storage`` renames a folder atomically (a file system); an object store does not."""
    return getattr(storage, "atomic_rename", True)


def _storage_at(model_dir: str | os.PathLike[str]) -> Storage:
    """The storage of a model_dir given as a path or URL: a folder on disk, or a prefix in an object store."""
    if filesystems.is_url(model_dir):
        from .object_storage import ObjectStorage

        return ObjectStorage(os.fspath(model_dir))
    return LocalStorage(filesystems.local_path(model_dir))


def _is_checkpoint_folder(storage: Storage, folder: str) -> bool:
    """A ``ckpt-<step>`` folder, intact or damaged; on an object store, a save prefix with its state.json."""
    match = _CHECKPOINT_FOLDER.fullmatch(folder)
    return match is not None and (match.group("save") is None or not _unsealed(storage, folder))


def _unsealed(storage: Storage, folder: str) -> bool:
    """Whether a save prefix has no state.json yet (in progress or cut short), as opposed to a damaged one."""
    try:
        storage.read_file(folder, checkpoint_format.STATE_FILE, 0, 1)
    except FileNotFoundError:
        return True
    return False


def _one_per_step(entries: list[_Entry], listed: set[str]) -> list[_Entry]:
    """``entries`` sorted by step, one per step: on a storage without rename a step saved again has a second
    prefix until the save that wrote it deletes the first; the one the manifest lists wins, else the newer."""
    chosen: dict[int, _Entry] = {}
    for entry in sorted(entries, key=lambda entry: (entry.folder in listed, entry.save_time)):
        chosen[entry.step] = entry
    if len(chosen) == len(entries):
        return sorted(entries)
    return sorted(chosen.values())


def _manifest_item(entry: _Entry) -> dict[str, Any]:
    return {"step": entry.step, "folder": entry.folder, "save_time": entry.save_time, "preserved": entry.preserved}


def _run_start(previous: list[_Entry], entries: list[_Entry]) -> int | None:
    """Where in ``previous`` a run begins that ``entries`` starts with and that lasts to the end of ``previous``
    (``entries`` may go on after it); None when there is none."""
    if not previous or not entries:
        return None
    try:
        start = previous.index(entries[0])
    except ValueError:
        return None
    kept = len(previous) - start
    return start if len(entries) >= kept and entries[:kept] == previous[start:] else None


def _encoded_item(entry: _Entry) -> tuple[dict[str, Any], str]:
    item = _manifest_item(entry)
    return item, json.dumps(item, allow_nan=False)


def _with_entry(entries: list[_Entry], step: int, folder: str, save_time: float) -> list[_Entry]:
    """``entries`` (by step) with the checkpoint just published: appended when it is the newest (every save of
    a training), else put in its place, replacing one of the same step (it keeps that one's ``preserved``)."""
    if not entries or entries[-1].step < step:
        return [*entries, _Entry(step, folder, save_time)]
    by_step = {entry.step: entry for entry in entries}
    replaced = by_step.get(step)
    by_step[step] = _Entry(step, folder, save_time, preserved=replaced is not None and replaced.preserved)
    return sorted(by_step.values(), key=lambda entry: entry.step)


def _check_steps(steps: Iterable[Any], name: str) -> list[int]:
    steps = list(steps)
    for step in steps:
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"{name} must be int steps; received {step!r} ({type(step).__name__}).")
        if step < 0:
            raise ValueError(f"{name} must be steps >= 0; received {step}.")
    return steps


def _check_manifest(manifest: Any) -> None:
    if not isinstance(manifest, dict):
        raise TypeError(f"expected a JSON object, found {type(manifest).__name__}")
    if manifest.get("format_version") != _MANIFEST_VERSION:
        raise ValueError(f"unsupported format_version {manifest.get('format_version')!r}")
    for item in manifest["checkpoints"]:
        if not (isinstance(item, dict) and isinstance(item["folder"], str) and isinstance(item["step"], int)):
            raise ValueError(f"bad checkpoint entry {item!r}")
    if not all(isinstance(step, int) for step in manifest["best"]):
        raise ValueError(f"bad best list {manifest['best']!r}")
