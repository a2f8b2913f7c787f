"""What a parameter server task holds and does: its shards of the model's variables and the optimizer over them.

One ``ShardServer`` lives in each ps process (``SERVER``); trainers reach it through the module-level functions
below, which ``torch.distributed.rpc`` calls by their qualified name (the ps imports this module, nothing of the
user's code is needed for a ``torch.optim`` optimizer). A shard is a row range of one variable, keyed
``"name[start:stop]"``; a ps holds the shards the placement plan gives it (``ps_placement.py``).

The updates, as TensorFlow's parameter servers apply them:

- asynchronous (the default): each trainer's ``push`` is applied when it arrives, under one lock per ps, and
  answers with the shards' new values: a trainer pulls what every other trainer pushed before it;
- synchronous (``SyncReplicasOptimizer``'s rule): gradients of step s are summed until
  ``replicas_to_aggregate`` have arrived, then averaged and applied once; a gradient computed on weights older
  than the current step is stale and dropped; the trainers wait for the step to be applied.

Buffers (BatchNorm's running statistics) are not trained: a trainer pushes how much its forward moved them, and
the ps adds that, so concurrent trainers' moves add up as TF's ``assign_sub`` of moving averages does.
Only the ps 0 counts the global step. Trusted traffic only: RPC carries pickles, as TF's gRPC and gloo do.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

logger = logging.getLogger("torchestimator")


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """How to build, on a ps, the trainers' optimizer over the shards it holds.

    ``cls`` is the trainer's optimizer class (pickled by reference: torch.optim's, or one the ps can import),
    ``defaults`` its constructor defaults, and each group the hyperparameters of one of its parameter groups
    with the keys of the shards (of that group's parameters) that live on this ps.
    """

    cls: type[torch.optim.Optimizer]
    defaults: dict[str, Any]
    groups: list[tuple[dict[str, Any], list[str]]]


@dataclasses.dataclass(frozen=True)
class TableInit:
    """Rows a ps makes itself for a sharded embedding table (the chief never holds the whole table): N(0, 1), as
    ``nn.Embedding`` initialises, from a generator seeded by the run's seed and the shard, the padding row zero."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    seed: int
    padding_row: int | None = None

    def make(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed)
        rows = torch.randn(self.shape, generator=generator, dtype=torch.float32).to(self.dtype)
        if self.padding_row is not None:
            rows[self.padding_row].zero_()
        return rows


SPARSE_OPTIMIZERS = (torch.optim.SGD, torch.optim.SparseAdam, torch.optim.Adagrad)
"""Optimizers given a table's gradient as a sparse tensor (only the rows a batch touched); others get it dense,
zeros elsewhere, so every optimizer updates a table exactly as it updates a local nn.Embedding."""


@dataclasses.dataclass
class PushAnswer:
    """What a push returns: the shards' values now, the global step (ps 0 only) and whether training ended."""

    values: dict[str, torch.Tensor]
    global_step: int | None
    ended: str | None
    applied: bool = True
    """False for a synchronous push that came too late for its step (stale: dropped)."""
    failed: bool = False
    """Training ended by a failure (the chief's error, the chief lost, a synchronous step's trainer lost)."""
    lost: str = ""
    """The task a failure lost, when one was ("chief", "worker:1")."""


class ShardServer:
    """The shards of one ps, and the optimizer over them."""

    def __init__(self, ps_index: int) -> None:
        self.ps_index = ps_index
        self._lock = threading.Condition(threading.RLock())  # snapshot reads the state under the lock it holds
        self._values: dict[str, torch.Tensor] = {}
        self._tables: set[str] = set()  # embedding shards: looked up by rows, never sent whole to a trainer
        self._trainable: dict[str, torch.nn.Parameter] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self._group_keys: list[list[str]] = []
        self.global_step = 0
        self.initialized_by: str | None = None
        self.model_dir_probe: tuple[str, str] | None = None
        """The chief's model_dir and the token it wrote into its probe file: every trainer must read it in its own."""
        self.ended: str | None = None
        self.failed = False
        self.lost = ""
        # Every task that stopped answering ends training: the chief's heartbeat, a synchronous step's gradients.
        self.timeout = 300.0
        # Synchronous mode: the step being aggregated, its gradients summed so far and from how many pushes.
        self.sync_replicas: int | None = None
        self._pending: dict[str, dict[str, torch.Tensor]] = {}  # this synchronous step's gradients, by trainer
        self._applied_step = 0
        self.last_contact: dict[str, float] = {}

    # -- set up by the chief -------------------------------------------------

    def initialize(
        self,
        values: Mapping[str, torch.Tensor | TableInit],
        trainable: set[str],
        optimizer: OptimizerSpec | None,
        global_step: int,
        chief: str,
        sync_replicas: int | None,
        tables: set[str] = frozenset(),  # type: ignore[assignment]  # read only
    ) -> None:
        """Takes the chief's values (restored or initial; a table's rows made here) and builds the optimizer; a
        restarted chief replaces everything, as a restore in TF assigns every variable."""
        with self._lock:
            self._values = {
                key: value.make() if isinstance(value, TableInit) else value.detach().clone()
                for key, value in values.items()
            }
            self._tables = set(tables)
            self._trainable = {
                key: torch.nn.Parameter(self._values[key], requires_grad=True) for key in values if key in trainable
            }
            for key, parameter in self._trainable.items():
                self._values[key] = parameter.data
            self._optimizer, self._group_keys = None, []
            if optimizer is not None and any(keys for _, keys in optimizer.groups):
                groups = [
                    {**hyper, "params": [self._trainable[key] for key in keys]} for hyper, keys in optimizer.groups
                ]
                self._optimizer = optimizer.cls(groups, **optimizer.defaults)
                self._group_keys = [keys for _, keys in optimizer.groups]
            self.global_step = self._applied_step = global_step
            self.sync_replicas = sync_replicas
            self._pending = {}
            self.initialized_by, self.ended, self.failed, self.lost = chief, None, False, ""
            self.last_contact[chief] = time.monotonic()
            self._lock.notify_all()
        logger.info(
            "ps %d holds %d shards (%d trainable, %.1f MB) from %s at global step %d.",
            self.ps_index,
            len(self._values),
            len(self._trainable),
            sum(tensor.numel() * tensor.element_size() for tensor in self._values.values()) / 1e6,
            chief,
            global_step,
        )

    def wait_initialized(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self.initialized_by is not None, timeout)

    # -- the trainers' calls -------------------------------------------------

    def pull(self) -> dict[str, torch.Tensor]:
        with self._lock:
            return self._dense_values()

    def _dense_values(self) -> dict[str, torch.Tensor]:
        return {key: tensor.clone() for key, tensor in self._values.items() if key not in self._tables}

    def lookup(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        """Rows of a table shard (indices within the shard): all that travels of an embedding table."""
        with self._lock:
            return self._values[key].index_select(0, rows)

    def push(
        self,
        trainer: str,
        gradients: Mapping[str, torch.Tensor],
        buffer_moves: Mapping[str, torch.Tensor],
        hyperparameters: list[dict[str, Any]],
        computed_at: int,
        row_gradients: Mapping[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> PushAnswer:
        if row_gradients:  # a table's gradient: (rows, values) of the rows a batch touched, as a sparse tensor
            gradients = dict(gradients)
            for key, (rows, values) in row_gradients.items():
                shape = self._values[key].shape
                gradients[key] = torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape, check_invariants=True)
        with self._lock:
            self.last_contact[trainer] = time.monotonic()
            if self.ended is not None:
                return self._ended_answer()
            for key, move in buffer_moves.items():
                self._values[key].add_(move.to(self._values[key].dtype))
            if self.sync_replicas is None:
                self._apply(gradients, hyperparameters, scale=1.0)
                self.global_step += 1
                applied = True
            else:
                applied = self._aggregate(trainer, gradients, hyperparameters, computed_at)
            if self.ended is not None:  # a synchronous step that ended while waiting
                return self._ended_answer()
            return PushAnswer(self._dense_values(), self.global_step, None, applied)

    def _ended_answer(self) -> PushAnswer:
        return PushAnswer({}, self.global_step, self.ended, applied=False, failed=self.failed, lost=self.lost)

    def _aggregate(
        self, trainer: str, gradients: Mapping[str, torch.Tensor], hyperparameters: list[dict[str, Any]], at: int
    ) -> bool:
        """SyncReplicasOptimizer: keep this step's gradients; once enough arrived, apply their mean; wait for it.

        The gradients are summed in the trainers' name order, not their arrival order, so that a synchronous run
        is bit for bit the same every time (a float sum depends on its order): a resumed run equals one never
        stopped.
        """
        assert self.sync_replicas is not None
        if at < self._applied_step:  # computed on weights an applied step has replaced: stale, dropped
            return False
        self._pending[trainer] = dict(gradients)
        target = at + 1
        if len(self._pending) >= self.sync_replicas:
            summed: dict[str, torch.Tensor] = {}
            for name in sorted(self._pending):
                for key, gradient in self._pending[name].items():
                    summed[key] = gradient.clone() if key not in summed else summed[key] + gradient
            self._apply(summed, hyperparameters, scale=1.0 / len(self._pending))
            self._pending = {}
            self._applied_step = self.global_step = target
            self._lock.notify_all()
            return True
        # Bounded: a trainer that died never pushes, and the others must not wait for it forever.
        if not self._lock.wait_for(lambda: self._applied_step >= target or self.ended is not None, self.timeout):
            missing = sorted(set(self.last_contact) - set(self._pending) - {"chief-heartbeat"}) or ["a trainer"]
            self._end_locked(
                f"synchronous step {target} waited {self.timeout:.0f} s for {self.sync_replicas} gradients and got "
                f"{len(self._pending)}: {', '.join(missing)} stopped pushing (lost?)",
                failed=True,
                lost=missing[0],
            )
        return True

    def _apply(
        self, gradients: Mapping[str, torch.Tensor], hyperparameters: list[dict[str, Any]], scale: float
    ) -> None:
        optimizer = self._optimizer
        if optimizer is None or not gradients:
            return
        for group, hyper in zip(optimizer.param_groups, hyperparameters):
            for name, value in hyper.items():  # a trainer's scheduler moved the learning rate
                group[name] = value
        sparse_ok = isinstance(optimizer, SPARSE_OPTIMIZERS)
        for key, parameter in self._trainable.items():
            gradient = gradients.get(key)
            if gradient is None and key in self._tables:
                # A table's shard no batch row fell in: a zero gradient, as a local nn.Embedding gets every step
                # (its optimizer state, Adam's step included, stays the same on every shard of the table).
                gradient = torch.sparse_coo_tensor(
                    torch.zeros((1, 0), dtype=torch.long),
                    torch.zeros((0, *parameter.shape[1:])),
                    parameter.shape,
                    check_invariants=True,
                )
            if gradient is not None and gradient.is_sparse:
                gradient = gradient.coalesce() if sparse_ok else gradient.to_dense()
            parameter.grad = None if gradient is None else (gradient * scale if scale != 1.0 else gradient)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # -- checkpoints ---------------------------------------------------------

    def optimizer_state(self) -> dict[str, dict[str, Any]]:
        """Each trainable shard's optimizer state (``{key: {"exp_avg": tensor, ...}}``), for the chief's checkpoint."""
        with self._lock:
            optimizer = self._optimizer
            if optimizer is None:
                return {}
            return {
                key: {name: _copy(value) for name, value in optimizer.state[self._trainable[key]].items()}
                for keys in self._group_keys
                for key in keys
                if self._trainable[key] in optimizer.state
            }

    def snapshot(self) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
        """The values and the optimizer state of one moment (no push between them), for a checkpoint."""
        with self._lock:
            return {key: tensor.clone() for key, tensor in self._values.items()}, self.optimizer_state()

    def load_optimizer_state(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        with self._lock:
            optimizer = self._optimizer
            if optimizer is None:
                return
            for key, state in states.items():
                parameter = self._trainable[key]
                optimizer.state[parameter] = {
                    name: value.to(parameter.device) if isinstance(value, torch.Tensor) else value
                    for name, value in state.items()
                }

    def wait_ended(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self.ended is not None, timeout)

    def end(self, reason: str, failed: bool = False, lost: str = "") -> None:
        with self._lock:
            self.last_contact["chief"] = time.monotonic()
            self._end_locked(reason, failed, lost)

    def _end_locked(self, reason: str, failed: bool, lost: str) -> None:
        if self.ended is None:
            self.ended, self.failed, self.lost = reason, failed, lost
            (logger.error if failed else logger.info)("ps %d: training ended: %s", self.ps_index, reason)
        self._lock.notify_all()

    # -- the chief's heartbeat -----------------------------------------------

    def heartbeat(self) -> None:
        with self._lock:
            self.last_contact["chief-heartbeat"] = time.monotonic()

    def check_chief(self, started: float) -> None:
        """Ends training when the chief has said nothing (heartbeat or push) for the timeout: it died (before it
        put the variables here too: its heartbeat starts when it joins the group)."""
        with self._lock:
            if self.ended is not None:
                return
            heard = max(self.last_contact.get("chief-heartbeat", started), self.last_contact.get("chief", started))
            silent = time.monotonic() - heard
            if silent > self.timeout:
                self._end_locked(
                    f"the chief stopped answering: no heartbeat for {silent:.0f} s (timeout_seconds "
                    f"{self.timeout:.0f}); restart every task to resume from the newest checkpoint",
                    failed=True,
                    lost="chief",
                )


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


SERVER: ShardServer | None = None
"""This process's shards when it is a ps task (set by ``start_serving``)."""

_SERVING = threading.Event()
_SERVER_WAIT_SECONDS = 600.0
"""How long a call waits for this ps to start serving: the group forms before the ps program reaches its train."""


def start_serving(server: ShardServer) -> None:
    global SERVER
    SERVER = server
    _SERVING.set()


def _server() -> ShardServer:
    if SERVER is None and not _SERVING.wait(_SERVER_WAIT_SECONDS):
        raise RuntimeError("This process is not serving as a parameter server.")
    assert SERVER is not None
    return SERVER


# The functions trainers call over RPC (by qualified name), each one line onto this process's ShardServer.


def initialize(
    values: dict[str, torch.Tensor | TableInit],
    trainable: set[str],
    optimizer: OptimizerSpec | None,
    global_step: int,
    chief: str,
    sync_replicas: int | None,
    tables: set[str],
) -> None:
    _server().initialize(values, trainable, optimizer, global_step, chief, sync_replicas, tables)


def wait_initialized(timeout: float) -> bool:
    return _server().wait_initialized(timeout)


def set_model_dir_probe(model_dir: str, probe: str) -> None:
    _server().model_dir_probe = (model_dir, probe)


def model_dir_probe() -> tuple[str, str] | None:
    return _server().model_dir_probe


def pull() -> dict[str, torch.Tensor]:
    return _server().pull()


def lookup(key: str, rows: torch.Tensor) -> torch.Tensor:
    return _server().lookup(key, rows)


def push(
    trainer: str,
    gradients: dict[str, torch.Tensor],
    buffer_moves: dict[str, torch.Tensor],
    hyperparameters: list[dict[str, Any]],
    computed_at: int,
    row_gradients: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> PushAnswer:
    return _server().push(trainer, gradients, buffer_moves, hyperparameters, computed_at, row_gradients)


def optimizer_state() -> dict[str, dict[str, Any]]:
    return _server().optimizer_state()


def snapshot() -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    return _server().snapshot()


def current_step() -> int:
    return _server().global_step


def load_optimizer_state(states: dict[str, dict[str, Any]]) -> None:
    _server().load_optimizer_state(states)


def end(reason: str, failed: bool = False) -> None:
    _server().end(reason, failed)


def heartbeat() -> None:
    _server().heartbeat()


def ended_reason() -> str | None:
    return _server().ended
