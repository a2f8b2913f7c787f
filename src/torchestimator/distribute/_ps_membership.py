"""Who is in the parameter-server group: joining it, waiting for the tasks of TF_CONFIG, and a restarted worker
taking the place of its lost process while the others train on.

The group is one of torch.distributed.rpc's dynamic groups (``init_rpc`` without a world size): every task joins
through the chief's store (the chief is rank 0 and hosts it), and a member may join later. A static group cannot
take a process back: a worker killed -9 keeps its name and rank in the store and its broken connections in every
other task, so a restart is refused as a duplicate name, and a later join waits on the dead process. What a
restarted worker does here, before and after ``init_rpc``:

1. it finds its name registered (``_ALL_WORKER_INFOS``, torch's list of ``name-rank`` entries) and checks that the
   address registered with it no longer takes connections: a live process of that name is an error, not replaced;
2. it takes torch's group-membership token (the critical section joins and leaves use), removes the dead entry,
   and joins under a fresh rank (the others' connections are kept per rank, and the dead one's is broken);
3. once in, it asks every other task to drop the dead entry for the name and take the new one (a join alone keeps
   the first entry of a name), so calls by name reach the new process.

torch keeps these keys under ``rpc_prefix_<n>`` (n counts this process's ``init_rpc`` calls): the tasks of a
cluster are fresh processes, so every one uses 0.
"""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.rpc as rpc

from torchestimator.errors import ConfigError

logger = logging.getLogger(__name__)

_GROUP_TOKEN = "RpcGroupManagementToken"
"""torch's key for the critical section of a join or a leave (torch/distributed/rpc/_utils.py)."""
_MEMBERS = "_ALL_WORKER_INFOS"
"""torch's list of members under the ``names`` prefix: ``"name-rank,name-rank,"`` (agent_utils.cpp)."""
_RESTARTS = "torchestimator/ps_restarts"
"""Our counter of restarted tasks, for their fresh ranks (above every rank of TF_CONFIG)."""


def rank_for_a_restart(store_address: str, name: str, first_free_rank: int, timeout: float) -> int | None:
    """A worker, before joining: None when ``name`` is not in the group yet (a first start); when a process of that
    name was there and is gone, removes it and returns the fresh rank to join under."""
    host, port = store_address.rsplit(":", 1)
    base = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout))
    group = dist.PrefixStore(f"rpc_prefix_{rpc._init_counter}", base)
    names = dist.PrefixStore("names", group)
    if not names.check([_MEMBERS]) or not _entries_of(name, names.get(_MEMBERS).decode()):
        return None
    address = dist.PrefixStore("addrs", group).get(name).decode()
    if _takes_connections(address):
        raise ConfigError(
            f"{name} is already running in this parameter-server group (at {address}): a second process with the "
            "same TF_CONFIG task cannot join. Stop the first one, or give this one its own task.",
            field='TF_CONFIG["task"]',
            value=name,
        )
    with _membership_token(group, name, timeout):
        members = names.get(_MEMBERS).decode()
        dead = _entries_of(name, members)
        names.set(_MEMBERS, "".join(entry + "," for entry in members.split(",") if entry and entry not in dead))
    rank = first_free_rank + base.add(_RESTARTS, 1)
    logger.warning(
        "%s: its previous process (%s) is gone; joining the running group again as rank %d.", name, dead, rank
    )
    return rank


def wait_for_members(names: list[str], me: str, store_address: str, timeout: float) -> None:
    """Returns once every task in ``names`` has joined; a TimeoutError naming the missing ones otherwise."""
    agent: Any = rpc.api._get_current_rpc_agent()
    deadline = time.monotonic() + timeout
    while True:
        present = {info.name for info in agent.get_worker_infos()}
        missing = [name for name in names if name not in present]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{me}: {', '.join(missing)} did not join the parameter-server group at {store_address} within "
                f"{timeout:.0f} s (timeout_seconds): start every task of TF_CONFIG, each with the same cluster."
            )
        time.sleep(0.05)


def announce_restart(me: str, timeout: float) -> None:
    """A restarted worker, once in: every other task drops the lost process's entry for ``me`` and takes this one."""
    agent: Any = rpc.api._get_current_rpc_agent()
    rank = agent.get_worker_info().id
    for info in agent.get_worker_infos():
        if info.name != me:
            rpc.rpc_sync(info.name, _take_restarted, args=(me, rank), timeout=timeout)


def _take_restarted(name: str, rank: int) -> None:
    """Run in each other task: calls to ``name`` go to its process of rank ``rank`` from now on."""
    agent: Any = rpc.api._get_current_rpc_agent()
    try:
        previous = agent.get_worker_info(name)
    except RuntimeError:  # never knew it
        previous = None
    if previous is not None and previous.id != rank:
        agent._update_group_membership(previous, [], {}, False)
    agent._update_group_membership(rpc.WorkerInfo(name, rank), [], {}, True)


class _membership_token:
    """torch's group-membership token, held while the member list is edited (a join or a leave waits for it). A
    token left by this task's own lost process (killed inside its join) is taken over."""

    def __init__(self, group: Any, name: str, timeout: float) -> None:
        self.group, self.mine, self.timeout = group, f"Token_for_{name}_restart", timeout
        self.lost = f"Token_for_{name}_join"

    def __enter__(self) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            holder = self.group.compare_set(_GROUP_TOKEN, "", self.mine).decode()
            if holder == self.lost:
                holder = self.group.compare_set(_GROUP_TOKEN, self.lost, self.mine).decode()
            if holder == self.mine:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"The parameter-server group stayed busy ({holder}) for {self.timeout:.0f} s.")
            time.sleep(0.05)

    def __exit__(self, *exc_info: object) -> None:
        self.group.set(_GROUP_TOKEN, "")


def _entries_of(name: str, members: str) -> list[str]:
    return [entry for entry in members.split(",") if entry and entry.rsplit("-", 1)[0] == name]


def _takes_connections(address: str) -> bool:
    """Whether the ``uv://host:port`` a member registered still accepts a TCP connection."""
    host, port = address.split("://", 1)[-1].rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
            return True
    except OSError:
        return False
