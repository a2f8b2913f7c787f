"""Forming a MirroredStrategy's process group: a plain script's own replicas started and waited for, and what a
replica says when its group does not form.

A plain ``python script.py`` with ``num_replicas`` > 1 starts replicas 1..N-1 itself (``launcher.py`` starts the
processes; here, what they print is kept quiet). Their group forms over a store replica 0 serves, and
``init_process_group`` alone would wait the whole collective timeout for a process that already exited: so replica 0
watches the replicas it started until each reaches the store, and each of them watches that replica 0 still runs.
The ``MirroredStrategy`` methods that form the group (``mirrored.py``) call these.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from torchestimator._io.atomic import writer_is_gone
from torchestimator._io.console import log_summary, show_summaries
from torchestimator.distribute.cluster import ClusterSpec
from torchestimator.distribute.launcher import (
    STARTED_REPLICA_VARIABLE,
    LocalReplicas,
    replica_stdout_path,
    start_local_replicas,
)
from torchestimator.errors import ConfigError, ReplicaLostError

REPLICA_STDOUT_VARIABLE = "TORCHESTIMATOR_REPLICA_STDOUT"
"""``all``: the replicas a plain ``python script.py`` starts itself print their standard output to the terminal
too. Unset (or ``file``): only replica 0's shows; the others' goes to a file that a log line names. Their
standard error (warnings, errors, tracebacks) always shows, each line prefixed with ``[rankN]:``. Runs
started by torchrun are torchrun's to filter (``--local-ranks-filter``, ``--tee``)."""

_JOINED_KEY = "torchestimator/replica_joined/{rank}"
"""Set by each replica a plain script started once it reaches the group's store: replica 0 waits for these keys
(watching the processes) before the group forms."""

_JOIN_POLL_SECONDS = 0.1


def _start_quiet_replicas(num_replicas: int) -> LocalReplicas:
    """Starts replicas 1..N-1 of this program (launcher.start_local_replicas), so that what the program prints
    (``print(estimator.evaluate(...))``) shows once, as torchrun's ``--local-ranks-filter 0`` would: their
    standard output goes to a file (``replica_stdout_path``), their standard error shows here, marked per line."""
    mode = os.environ.get(REPLICA_STDOUT_VARIABLE, "file").strip().lower() or "file"
    if mode not in ("file", "all"):
        raise ConfigError(
            f"{REPLICA_STDOUT_VARIABLE} must be 'all' (every replica prints here) or 'file' (the "
            f"default: replicas 1..N-1 print to a file); received {mode!r}.",
            field=REPLICA_STDOUT_VARIABLE,
            value=mode,
        )
    others = "replica 1" if num_replicas == 2 else f"replicas 1-{num_replicas - 1}"
    target = replica_stdout_path() if mode == "file" else None
    replicas = start_local_replicas(num_replicas, stdout_path=target)
    show_summaries()  # said by default, also when no train() call attached the console handler yet
    if target is not None:
        log_summary(
            f"{others}: standard output goes to {target}; errors show here, as [rankN]: lines "
            f"({REPLICA_STDOUT_VARIABLE}=all prints every replica's output here)"
        )
    return replicas


def _wait_for_own_replicas(store: Any, replicas: LocalReplicas, world_size: int, timeout_seconds: float) -> None:
    """Replica 0's side of forming a plain script's group: until every replica has reached the store, watch their
    processes, so that one that exits first (its module code raised) stops this one at once, naming it, instead
    of after the whole collective timeout."""
    deadline = time.monotonic() + timeout_seconds
    waiting = list(range(1, world_size))
    while True:
        waiting = [rank for rank in waiting if not store.check([_JOINED_KEY.format(rank=rank)])]
        if not waiting:
            return
        replicas.raise_if_exited(waiting, before="joining the group")
        if time.monotonic() >= deadline:
            pids = ", ".join(str(replicas.processes[rank - 1].pid) for rank in waiting)
            raise ReplicaLostError(
                f"{'Replica' if len(waiting) == 1 else 'Replicas'} {', '.join(map(str, waiting))} of {world_size} "
                f"(pid {pids}) still {'runs' if len(waiting) == 1 else 'run'} but did not reach train() within "
                f"{timeout_seconds:g} s. Each replica runs this program from its start, so what comes before "
                "train() (loading data, building the model) runs in each; if that takes longer, wait longer: "
                "MirroredStrategy(timeout_seconds=...) or TORCHESTIMATOR_COLLECTIVE_TIMEOUT.",
                lost_ranks=waiting,
            )
        replicas.wait_for_an_end(_JOIN_POLL_SECONDS)


_STORE_PROBE_SECONDS = 0.5
"""How long one attempt to reach replica 0's store waits, between checks that replica 0 still runs."""


def _replica_zero_pid() -> int | None:
    """Replica 0's pid when this process is a replica a plain script started (``STARTED_REPLICA_VARIABLE``)."""
    value = os.environ.get(STARTED_REPLICA_VARIABLE, "")
    return int(value) if value.isdigit() else None


def _raise_if_replica_zero_is_gone(cluster: ClusterSpec, when: str, error: BaseException | None = None) -> None:
    """A replica a plain script started, whose replica 0 (its parent) no longer runs, stops at once naming it: no
    store will ever be served, so joining would wait the whole collective timeout. Nothing for other processes."""
    pid = _replica_zero_pid()
    if pid is None or not writer_is_gone(pid):  # a zombie counts as gone
        return
    said = "" if error is None else f" ({type(error).__name__}: {str(error).strip().splitlines()[0][:200]})"
    raise ReplicaLostError(
        f"Replica {cluster.rank} of {cluster.world_size} stops {when}: replica 0 (pid {pid}), which started it and "
        f"serves the group's store, is gone{said}. Replica 0's own output says why it ended (killed, out of "
        "memory, an error before train()); run the program again: it resumes from the newest checkpoint.",
        lost_ranks=[0],
    ) from error


def _wait_for_replica_zeros_store(cluster: ClusterSpec, timeout_seconds: float) -> None:
    """Until replica 0's store accepts connections (for at most ``timeout_seconds``), look every half second
    whether replica 0 still runs; the store's own connect would retry for the whole timeout."""
    assert cluster.master_addr is not None and cluster.master_port is not None
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        _raise_if_replica_zero_is_gone(cluster, "before joining the group")
        try:
            with socket.create_connection((cluster.master_addr, cluster.master_port), timeout=_STORE_PROBE_SECONDS):
                return
        except OSError:
            time.sleep(min(_STORE_PROBE_SECONDS, max(0.0, deadline - time.monotonic())))


def _group_did_not_form(cluster: ClusterSpec, init_method: str, timeout_seconds: float, error: Exception) -> str:
    """What to tell a replica whose group never formed: who was expected, where, and the wait to change."""
    if cluster.jobs:
        expected = "; ".join(
            f"{job}: {', '.join(addresses)}"
            for job, addresses in sorted(cluster.jobs.items())
            if job not in ("evaluator", "ps")
        )
        who = f"TF_CONFIG task {cluster.task_type}:{cluster.task_index} (rank {cluster.rank})"
        advice = f"Start every training task of TF_CONFIG's cluster ({expected}) with the same cluster"
    else:
        who = f"{cluster.source} rank {cluster.rank}"
        advice = f"Start all {cluster.world_size} processes with the same rendezvous"
    return (
        f"The process group of {cluster.world_size} replicas did not form: {who} waited at {init_method} "
        f"({type(error).__name__}: {error}). {advice}, check that the chief's address is reachable from every "
        f"node, or wait longer: MirroredStrategy(timeout_seconds=...) or TORCHESTIMATOR_COLLECTIVE_TIMEOUT "
        f"(now {timeout_seconds:g} s)."
    )
