"""The start-up agreement: every replica of a run starts from the same checkpoint of the same model_dir.

Belongs here: what each replica saw before step 1 (``ReplicaView``), the probe file that tells whether
every replica sees the same model_dir, the comparison and the one error that names who differs
(``check_start_agreement``); and the roster of replicas (rank, host, pid) that the training loop uses
to name a replica that died (``ReplicaRoster``). Does not belong here: choosing the checkpoint (the
checkpoint store), the collectives themselves (the Strategy), the loop.

model_dir must be storage every node sees (one shared file system mounted on every node: NFS, Lustre,
a cloud bucket mount). With a model_dir on each node's local disk, the node that finds a checkpoint
restores it and the others start at step 0: they would train in lockstep from different states, write
a mixed checkpoint and then wait in a collective until the timeout. The agreement turns that into one
error before step 1, on every replica, naming the replicas and what each saw.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torchestimator._io import filesystems
from torchestimator._io.atomic import temporary_prefix, writer_is_gone, writer_tag
from torchestimator.checkpoint.errors import is_no_room
from torchestimator.errors import (
    CheckpointError,
    DiskFullError,
    ReplicaLostError,
    ReplicasDisagreeError,
    TorchEstimatorError,
)

if TYPE_CHECKING:
    from torchestimator.checkpoint.store import Checkpoint
    from torchestimator.distribute.strategy import Strategy

logger = logging.getLogger("torchestimator")

PROBE_VISIBILITY_SECONDS = 5.0
"""How long a replica that does not see the chief's probe file looks again before it says so.

Shared file systems with close-to-open consistency (NFS) show a new name at once; object-store
mounts may show it a moment later. Replicas that see it at once do not wait.
"""

_PROBE_POLL_SECONDS = 0.05

_EXIT_SECONDS = 2.0
"""After a backend failure, how long to look for a replica on this host to finish exiting before naming none."""

# What gloo and NCCL say when a peer's process is gone or silent ("Connection reset by peer", "Connection closed
# by peer", "Timed out waiting 300000ms for recv operation"); DDP's reducer raises them as plain RuntimeErrors.
_BACKEND_FAILURE = re.compile(r"gloo|nccl|connection (?:reset|closed|refused)|broken pipe|timed out", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ReplicaView:
    """What one replica saw before step 1: the facts every replica must share, and where it runs."""

    rank: int
    host: str
    pid: int
    model_dir: str
    """model_dir as this replica names it (an absolute path; mount points may differ between nodes)."""
    sees_probe: bool
    """Whether this replica sees the probe file the chief wrote into its model_dir."""
    checkpoint_name: str | None
    """The checkpoint folder it restores (``ckpt-40``), None when it finds none."""
    checkpoint_step: int | None
    num_replicas: int
    max_steps: int | None
    steps: int | None

    @property
    def skips_training(self) -> bool:
        """The Estimator's max_steps skip: the checkpoint already reached max_steps."""
        if self.max_steps is None or self.checkpoint_step is None:
            return False
        return self.checkpoint_step >= self.max_steps

    def starting_point(self) -> tuple[Any, ...]:
        """What must be equal on every replica (host, pid and the path's spelling may differ)."""
        return (
            self.checkpoint_name,
            self.checkpoint_step,
            self.num_replicas,
            self.max_steps,
            self.steps,
            self.skips_training,
        )

    def describe(self, *, world: bool = False, steps: bool = False) -> str:
        """This view in words; ``world``, ``steps``: say the world size, the step arguments too (when the
        replicas differ on them)."""
        if self.checkpoint_name is None:
            start = f"finds no checkpoint in {self.model_dir}"
        else:
            start = f"restores {self.checkpoint_name} (step {self.checkpoint_step}) from {self.model_dir}"
        if not self.sees_probe:
            start += " and does not see the probe file rank 0 wrote into its model_dir"
        if steps:
            start += f" with max_steps={self.max_steps}, steps={self.steps}"
        if self.skips_training:
            start += " (so it skips training)"
        return f"{start} in a world of {self.num_replicas}" if world else start


def check_start_agreement(
    strategy: Strategy,
    model_dir: str,
    checkpoint: Checkpoint | None,
    *,
    max_steps: int | None = None,
    steps: int | None = None,
) -> str | None:
    """Fails fast, on every replica, naming the replicas that disagree, when they would start from different states.

    Every replica calls it after choosing the checkpoint to restore and before the max_steps skip. It
    costs nothing with one replica; with several, one broadcast and one gather, and a probe file the
    chief writes into model_dir (creating it) and removes before returning: every replica must see it,
    else model_dir is not the same storage everywhere. Then the restored checkpoint (name and step),
    the world size and the step limits must be equal.

    Returns the probe's random name, which every replica of this start shares and no other start has (the
    Estimator's exports after train() find the chief's version by it); None with one replica.

    Raises:
        ReplicasDisagreeError: on every replica, with the same message: which ranks saw what.
    """
    if strategy.num_replicas == 1:
        return None
    model_dir = os.fspath(model_dir)
    model_dir = model_dir.rstrip("/") if filesystems.is_url(model_dir) else os.path.abspath(model_dir)
    probe_name = _place_probe(strategy, model_dir)
    try:
        view = _this_view(strategy, model_dir, probe_name, checkpoint, max_steps, steps)
        views = strategy.all_gather_object(view)
    finally:
        if strategy.is_chief:  # after the gather: every replica has looked for it
            _remove_quietly(filesystems.join(model_dir, probe_name))
    message = disagreement(views)
    if message is not None:
        raise ReplicasDisagreeError(message, views=views)
    logger.debug("The %d replicas agree on how to start: %s", len(views), views[0].describe())
    return probe_name


def _place_probe(strategy: Strategy, model_dir: str) -> str:
    """The chief creates model_dir and a probe file with a random name; every replica gets the name."""
    name, failure = "", None
    if strategy.is_chief:
        # A temporary name of atomic.py's form: never a checkpoint, and removed at start-up if a kill left it.
        name = temporary_prefix("agreement-probe") + secrets.token_hex(8)
        try:
            if filesystems.is_url(model_dir):  # an object store: one PUT, seen by every node at once after it
                filesystems.write_bytes(filesystems.join(model_dir, name), b"every replica of a run must see this\n")
            else:
                os.makedirs(model_dir, exist_ok=True)
                with open(os.path.join(model_dir, name), "xb") as handle:
                    handle.write(b"every replica of a run must see this file\n")
        except OSError as error:
            failure = error
    chief: tuple[str, str | None] = strategy.broadcast_object(
        (name, None if failure is None else f"{type(failure).__name__}: {failure}"), 0
    )
    name, chief_error = chief
    if failure is not None:
        if is_no_room(failure):
            raise DiskFullError(
                failure,
                path=model_dir,
                what="the probe that checks every replica shares model_dir",
                advice="Free some space (or choose another model_dir) and rerun.",
            ) from failure
        raise PermissionError(
            failure.errno,
            f"model_dir {model_dir!r} is not writable, so the replicas cannot check that they share it "
            f"({failure.strerror}). Choose another model_dir.",
            failure.filename,
        ) from failure
    if chief_error is not None:
        raise ReplicasDisagreeError(
            f"Rank 0 could not write into its model_dir ({chief_error}), so this replica (rank {strategy.replica_id}) "
            "cannot check that every replica shares it; every replica stops. Fix model_dir on rank 0's host.",
            views=[],
        )
    return name


def _this_view(
    strategy: Strategy,
    model_dir: str,
    probe_name: str,
    checkpoint: Checkpoint | None,
    max_steps: int | None,
    steps: int | None,
) -> ReplicaView:
    return ReplicaView(
        rank=strategy.replica_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        model_dir=model_dir,
        sees_probe=_sees(filesystems.join(model_dir, probe_name)),
        checkpoint_name=None if checkpoint is None else os.path.basename(checkpoint.path.rstrip("/")),
        checkpoint_step=None if checkpoint is None else int(checkpoint.step),
        num_replicas=strategy.num_replicas,
        max_steps=max_steps,
        steps=steps,
    )


def _sees(path: str) -> bool:
    # A lookup of the exact (new, random) name: no cached directory listing can hide it on NFS.
    deadline = time.monotonic() + PROBE_VISIBILITY_SECONDS
    while not filesystems.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(_PROBE_POLL_SECONDS)
    return True


def _remove_quietly(path: str) -> None:
    try:
        filesystems.remove(path)
    except OSError as error:  # a leftover of this form is removed by the next start-up's clean-up
        logger.warning("Could not remove the agreement probe %s: %s", path, error)


def disagreement(views: Sequence[ReplicaView]) -> str | None:
    """The message naming who saw what, or None when every replica agrees."""
    everyone_sees = all(view.sees_probe for view in views)
    if everyone_sees and len({view.starting_point() for view in views}) == 1:
        return None
    groups: dict[tuple[Any, ...], list[ReplicaView]] = {}
    for view in views:
        groups.setdefault((view.sees_probe, view.model_dir, *view.starting_point()), []).append(view)
    several_worlds = len({view.num_replicas for view in views}) > 1
    several_steps = len({(view.max_steps, view.steps, view.skips_training) for view in views}) > 1
    lines = [
        f"{_ranks(group)} {group[0].describe(world=several_worlds, steps=several_steps)}" for group in groups.values()
    ]
    return (
        f"The {len(views)} replicas disagree on how to start training, so every replica stops before step 1: "
        + "; ".join(lines)
        + ". "
        + _advice(views, everyone_sees)
    )


def _ranks(group: Sequence[ReplicaView]) -> str:
    ranks = [view.rank for view in group]
    hosts = sorted({view.host for view in group})
    shown = ", ".join(str(rank) for rank in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    where = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more" if len(hosts) > 4 else "")
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {shown} (on {where})"


def _advice(views: Sequence[ReplicaView], everyone_sees: bool) -> str:
    if not everyone_sees:
        return (
            "model_dir must be storage every node sees (one shared file system mounted on every node, e.g. "
            "NFS): give every replica the same shared model_dir."
        )
    if len({(view.max_steps, view.steps) for view in views}) > 1:
        return "Every replica must call train with the same max_steps and steps."
    if len({view.num_replicas for view in views}) > 1:
        return "The replicas were launched with different world sizes; launch them as one group."
    return (
        "They share model_dir but read different checkpoints: another run may be writing into it, or a "
        "checkpoint looks damaged from some hosts only. Run one training per model_dir and check the warnings "
        "each replica logged about damaged checkpoints."
    )


# ---------------------------------------------------------------------------- the roster


@dataclasses.dataclass(frozen=True)
class RosterEntry:
    rank: int
    host: str
    """The host name, for messages."""
    writer: str
    """``<pid>-h<host hash>`` (atomic.writer_tag): what tells a process on this host, and whether it lives."""

    @property
    def pid(self) -> int:
        return int(self.writer.split("-h", 1)[0])

    @property
    def host_hash(self) -> str:
        return self.writer.split("-h", 1)[1]


@dataclasses.dataclass(frozen=True)
class ReplicaRoster:
    """Who the replicas are (rank, host, pid), gathered once, to name a replica that dies during training."""

    entries: tuple[RosterEntry, ...]
    own_rank: int

    @classmethod
    def gather(cls, strategy: Strategy) -> ReplicaRoster:
        """Every replica's host and pid; one all_gather_object (call it on every replica)."""
        entries = strategy.all_gather_object(RosterEntry(strategy.replica_id, socket.gethostname(), writer_tag()))
        return cls(tuple(entries), strategy.replica_id)

    def _on_this_host(self) -> list[RosterEntry]:
        here = writer_tag().split("-h", 1)[1]
        return [entry for entry in self.entries if entry.rank != self.own_rank and entry.host_hash == here]

    def gone_ranks(self, wait_seconds: float = 0.0) -> list[int]:
        """Ranks on this host whose process no longer runs (killed, exited, or a zombie not yet reaped).

        ``wait_seconds``: look again until one is gone, for at most this long. A process killed with
        SIGKILL closes its sockets (the peers see the reset) before it becomes a zombie, so the
        survivors may ask a moment too early.
        """
        deadline = time.monotonic() + wait_seconds
        local = self._on_this_host()
        while True:
            gone = [entry.rank for entry in local if writer_is_gone(entry.pid, entry.host_hash)]
            if gone or not local or time.monotonic() >= deadline:
                return gone
            time.sleep(_PROBE_POLL_SECONDS)

    def describe_loss(self, gone: Sequence[int]) -> str:
        """``gone`` (from ``gone_ranks``) and the replicas this host cannot check, in words."""
        lost = set(gone)
        local = {entry.rank for entry in self._on_this_host()}
        remote = [entry for entry in self.entries if entry.rank != self.own_rank and entry.rank not in local]
        parts = []
        if lost:
            named = [
                f"rank {entry.rank} (pid {entry.pid} on {entry.host})" for entry in self.entries if entry.rank in lost
            ]
            parts.append(", ".join(named) + (" is gone" if len(named) == 1 else " are gone"))
        elif local:
            parts.append(f"the replicas on this host ({_rank_list(sorted(local))}) still run")
        if remote:
            hosts = sorted({entry.host for entry in remote})
            parts.append(
                f"{_rank_list([entry.rank for entry in remote])} on {', '.join(hosts[:4])}"
                f"{' and more' if len(hosts) > 4 else ''} cannot be checked from this host"
            )
        return "; ".join(parts) if parts else "no other replica is known"

    def lost_replica_error(self, error: BaseException, step: int) -> ReplicaLostError | None:
        """The ReplicaLostError that explains ``error`` (raised by a collective at ``step``), or None when
        ``error`` is not a replica going away (a bug in a model_fn raises as it is).

        A checkpoint save's CheckpointError counts when a collective inside the save failed (DCP wraps the
        backend's error, per rank, in its own): the save's words stay in the message and as the cause."""
        saving = isinstance(error, CheckpointError)
        collective_error = _collective_failure_within(error) if saving else error
        if (
            collective_error is None
            or isinstance(collective_error, TorchEstimatorError)
            or not isinstance(collective_error, RuntimeError)
        ):
            return None
        import torch.distributed as distributed  # only to recognise its error classes

        backend_failure = isinstance(collective_error, distributed.DistError) or bool(
            _BACKEND_FAILURE.search(str(collective_error))
        )
        if saving and not backend_failure:
            return None  # a save that failed for its own reasons (a bad path, a crafted state) raises as it is
        gone = self.gone_ranks(wait_seconds=_EXIT_SECONDS if backend_failure else 0.0)
        if not gone and not backend_failure:
            return None  # a bug in a model_fn, say: raised as it is
        what = "a collective of the checkpoint save failed" if saving else "a collective failed"
        after = (
            " That checkpoint was not published: the next start resumes from the newest complete one." if saving else ""
        )
        return ReplicaLostError(
            f"Replica {self.own_rank} stops at global step {step}: {what} because another replica died or stopped "
            f"answering ({self.describe_loss(gone)}).{after} {_where_to_look()} "
            f"{'The save said' if saving else 'The backend said'}: {_first_line(error)}",
            lost_ranks=gone,
            step=step,
        )


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


def _collective_failure_within(error: BaseException) -> BaseException | None:
    """The RuntimeError of a collective behind a failed save: in its cause chain, or in DCP's per-rank failures
    (``CheckpointException.failures``: rank -> the exception, or the exception and its traceback)."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, RuntimeError) and not isinstance(current, TorchEstimatorError):
            return current
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            pending.extend(
                value[0] if isinstance(value, tuple) else value
                for value in failures.values()
                if isinstance(value[0] if isinstance(value, tuple) else value, BaseException)
            )
        pending.extend(link for link in (current.__cause__, current.__context__) if link is not None)
    return None


def _where_to_look() -> str:
    """Where the first failure shows, for the launcher this run has."""
    from torchestimator.distribute.launcher import is_started_replica, started_replicas

    if started_replicas() is not None or is_started_replica():
        return (
            "A plain script's replicas show their errors in replica 0's standard error, in lines marked [rankN]:; "
            "running the program again resumes from the newest checkpoint."
        )
    return (
        "Under torchrun the agent's log names the process that failed first, and --max-restarts restarts the "
        "group, which resumes from the newest checkpoint."
    )


def _rank_list(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(rank) for rank in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {shown}"
