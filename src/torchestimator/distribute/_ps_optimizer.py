"""A trainer's side of parameter-server training: its optimizer is a stand-in that pushes and pulls.

The Estimator builds the user's optimizer over the trainer's module as always; ``RemoteOptimizer`` wraps it.
Its ``step()`` sends each ps the gradients of the shards it holds (and how far the forward moved the buffers),
and copies the shards' new values back into the module: one round trip per ps per step, all ps at once. The
optimizer's arithmetic and state live on the ps (``_ps_server.py``); the wrapped optimizer keeps only the
parameter groups, so learning-rate schedulers work unchanged (their hyperparameters travel with each push).

For checkpoints it speaks the wrapped optimizer's own ``state_dict`` format, gathered from the ps tasks and
joined by rows, so a parameter-server checkpoint is an ordinary one: it resumes under any strategy and any
number of ps tasks, and an ordinary checkpoint resumes here.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed.rpc as rpc

from torchestimator.distribute import _ps_server
from torchestimator.distribute.ps_placement import PlacementPlan, Shard, join_rows, join_state, split_state
from torchestimator.distribute.sharded_embedding import sharded_tables
from torchestimator.errors import TaskLostError

logger = logging.getLogger("torchestimator")


class RemoteOptimizer(torch.optim.Optimizer):
    """``local``'s parameter groups, with its updates applied on the ps tasks.

    Not built with ``Optimizer.__init__``: it holds no state of its own (``state`` stays empty); ``param_groups``
    and ``defaults`` are the wrapped optimizer's, so a scheduler built over this object moves the learning rate
    the ps tasks use.
    """

    def __init__(
        self,
        local: torch.optim.Optimizer,
        module: torch.nn.Module,
        plan: PlacementPlan,
        ps_names: list[str],
        trainer: str,
        on_global_step: Callable[[int], None],
        timeout: float,
        chief: bool,
    ) -> None:
        self.local = self.stands_for = local
        self.defaults = local.defaults
        self.param_groups = local.param_groups
        self.state: Any = {}
        self._optimizer_step_pre_hooks: Any = {}
        self._optimizer_step_post_hooks: Any = {}
        self._optimizer_state_dict_pre_hooks: Any = {}
        self._optimizer_state_dict_post_hooks: Any = {}
        self._optimizer_load_state_dict_pre_hooks: Any = {}
        self._optimizer_load_state_dict_post_hooks: Any = {}
        self._module = module
        self._plan = plan
        self._shards = list(plan.shards)
        self._shard_of = {shard.key: shard for shard in self._shards}  # read for every value a step takes back
        self._ps_names = ps_names
        self._trainer = trainer
        self._on_global_step = on_global_step
        self._timeout = timeout
        # By state_dict name: the module's own tensors (a table's is its one-element stand-in).
        tensors = {**dict(module.named_buffers(remove_duplicate=False)), **dict(module.named_parameters())}
        self._variables = {name: tensors[name] for name in module.state_dict(keep_vars=True)}
        self._parameter_names = {id(parameter): name for name, parameter in module.named_parameters()}
        self._tables = sharded_tables(module)  # embedding tables whose rows stay on the ps tasks
        for variable, table in self._tables.items():
            table.client, table.variable = self, variable
        self._table_snapshot: dict[str, torch.Tensor] = {}  # the tables' rows of the last snapshot, by shard key
        self._pulled_buffers: dict[str, torch.Tensor] = {}
        self._chief = chief
        self._pending_state: dict[int, dict[str, dict[str, Any]]] | None = None
        self.global_step = 0
        self.ended: str | None = None

    # -- start and end -------------------------------------------------------------

    def initialize_servers(self, global_step: int, sync_replicas: int | None) -> None:
        """The chief: every ps gets its shards' values (restored or initial), an optimizer like the wrapped one
        over them, the global step, and the optimizer state a restore loaded."""
        trainable = {
            shard.key
            for shard in self._shards
            if isinstance(self._variables[shard.name], torch.nn.Parameter) and self._variables[shard.name].requires_grad
        }
        futures = []
        for ps, ps_name in enumerate(self._ps_names):
            values = {shard.key: self._initial_value(shard) for shard in self._shards if shard.ps == ps}
            tables = {shard.key for shard in self._shards if shard.ps == ps and shard.name in self._tables}
            groups = [
                (
                    {name: value for name, value in group.items() if name != "params"},
                    [
                        shard.key
                        for parameter in group["params"]
                        for shard in self._plan.variable(self._parameter_names[id(parameter)]).shards
                        if shard.ps == ps and shard.key in trainable
                    ],
                )
                for group in self.param_groups
            ]
            spec = _ps_server.OptimizerSpec(type(self.local), dict(self.local.defaults), groups)
            futures.append(
                rpc.rpc_async(
                    ps_name,
                    _ps_server.initialize,
                    args=(values, trainable & set(values), spec, global_step, self._trainer, sync_replicas, tables),
                    timeout=self._timeout,
                )
            )
        _wait_all(futures, self._ps_names, "taking the chief's variables")
        if self._pending_state is not None:
            states = self._pending_state
            self._pending_state = None
            _wait_all(
                [
                    rpc.rpc_async(name, _ps_server.load_optimizer_state, args=(states[ps],), timeout=self._timeout)
                    for ps, name in enumerate(self._ps_names)
                ],
                self._ps_names,
                "taking the restored optimizer state",
            )
        self.global_step = global_step

    def _initial_value(self, shard: Shard) -> torch.Tensor | _ps_server.TableInit:
        """What the chief gives a ps for one shard: its rows of the module, of a restored table, or (a table never
        restored) the seed the ps makes its rows from."""
        table = self._tables.get(shard.name)
        if table is None:
            return _rows(self._variables[shard.name].detach(), shard).cpu()
        if table.restored is not None:
            return _rows(table.restored, shard).clone()
        padding = table.padding_idx
        local_padding = padding - shard.start if padding is not None and shard.start <= padding < shard.stop else None
        seed = (torch.initial_seed() + zlib.crc32(shard.key.encode())) % (1 << 63)
        shape = (shard.rows, *table.weight.shape[1:])
        return _ps_server.TableInit(shape, table.weight.dtype, seed, local_padding)

    # -- the tables' rows ----------------------------------------------------------

    def lookup(self, variable: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (sorted, unique) of a table, from the ps tasks holding them."""
        placement = self._plan.variable(variable)
        rows = torch.empty((len(ids), *placement.shape[1:]), dtype=placement.dtype)
        requests = []
        for shard in placement.shards:
            inside = ((ids >= shard.start) & (ids < shard.stop)).nonzero().squeeze(1)
            if len(inside):
                local = ids.index_select(0, inside) - shard.start
                future = rpc.rpc_async(
                    self._ps_names[shard.ps], _ps_server.lookup, args=(shard.key, local), timeout=self._timeout
                )
                requests.append((inside, future, shard))
        for inside, future, shard in requests:
            try:
                rows.index_copy_(0, inside, future.wait())
            except Exception as error:
                raise self._lost(self._ps_names[shard.ps], f"looking up rows of {variable}", error) from error
        return rows

    def table_weight(self, variable: str) -> torch.Tensor | None:
        """The whole table as of the last snapshot (a checkpoint's), joined from its shards; None before one."""
        placement = self._plan.variable(variable)
        parts = [self._table_snapshot.get(shard.key) for shard in placement.shards]
        if any(part is None for part in parts):
            return None
        return join_rows([part for part in parts if part is not None], placement)

    def detach_tables(self) -> None:
        """Training with the ps tasks is over: the chief keeps the final tables (for evaluation in this process)."""
        for variable, table in self._tables.items():
            table.detach_from_servers(lambda variable=variable: self.table_weight(variable))  # type: ignore[misc]

    def wait_for_servers(self) -> None:
        """A worker: waits until the chief has put the variables on every ps (it may start later)."""
        deadline = time.monotonic() + self._timeout
        for name in self._ps_names:
            left = deadline - time.monotonic()
            ready = left > 0 and rpc.rpc_sync(name, _ps_server.wait_initialized, args=(left,), timeout=left + 10)
            if not ready:
                raise TimeoutError(
                    f"{self._trainer}: {name} did not get the variables from the chief within {self._timeout:.0f} s "
                    "(timeout_seconds): is the chief task running?"
                )
        self.global_step = rpc.rpc_sync(self._ps_names[0], _ps_server.current_step, timeout=self._timeout)

    # -- the step ----------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.local.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if closure is not None:
            raise ValueError("ParameterServerStrategy: optimizer.step(closure) is not supported; the ps apply updates.")
        hyperparameters = [
            {name: value for name, value in group.items() if name != "params" and _plain(value)}
            for group in self.param_groups
        ]
        requests: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {
            ps: ({}, {}) for ps in range(len(self._ps_names))
        }
        row_gradients: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {ps: {} for ps in requests}
        for variable_name, table in self._tables.items():
            taken = table.take_row_gradients()
            if taken is None:
                continue
            ids, gradients_of_rows = taken
            for shard in self._plan.variable(variable_name).shards:
                inside = ((ids >= shard.start) & (ids < shard.stop)).nonzero().squeeze(1)
                if len(inside):
                    row_gradients[shard.ps][shard.key] = (
                        ids.index_select(0, inside) - shard.start,
                        gradients_of_rows.index_select(0, inside),
                    )
        for shard in self._shards:
            if shard.name in self._tables:
                continue
            variable = self._variables[shard.name]
            gradients, moves = requests[shard.ps]
            if isinstance(variable, torch.nn.Parameter):
                if variable.grad is not None:
                    gradients[shard.key] = _rows(variable.grad, shard).cpu()
            else:
                pulled = self._pulled_buffers.get(shard.key)
                if pulled is not None:
                    moved = _rows(variable, shard).cpu() - pulled
                    if torch.count_nonzero(moved):
                        moves[shard.key] = moved
        futures = {
            ps: rpc.rpc_async(
                self._ps_names[ps],
                _ps_server.push,
                args=(self._trainer, gradients, moves, hyperparameters, self.global_step, row_gradients[ps]),
                timeout=self._timeout,
            )
            for ps, (gradients, moves) in requests.items()
        }
        for ps, future in futures.items():
            try:
                answer: _ps_server.PushAnswer = future.wait()
            except Exception as error:
                raise self._lost(self._ps_names[ps], "taking this trainer's update", error) from error
            if answer.ended is not None:
                if answer.failed:
                    raise TaskLostError(
                        f"{self._trainer} stops: {self._ps_names[ps]} says training ended: {answer.ended}",
                        task=answer.lost,
                        step=self.global_step,
                    )
                self.ended = answer.ended
                continue
            self._take_values(answer.values)
            if ps == 0 and answer.global_step is not None:
                self.global_step = answer.global_step
        self._on_global_step(self.global_step)
        return None

    def _lost(self, ps_name: str, doing: str, error: BaseException) -> TaskLostError:
        return TaskLostError(
            f"{ps_name} stopped answering while {doing} (global step {self.global_step}, {self._trainer}): {error}. "
            "Every task stops (the chief ends training for the others); restart every task to resume from the "
            "newest checkpoint.",
            task=ps_name,
            step=self.global_step,
        )

    def pull(self) -> None:
        """The ps tasks' current values into the module (before the first step, and for a checkpoint)."""
        futures = [rpc.rpc_async(name, _ps_server.pull, timeout=self._timeout) for name in self._ps_names]
        with torch.no_grad():
            for values in _wait_all(futures, self._ps_names, "sending its variables"):
                self._take_values(values)

    def _take_values(self, values: Mapping[str, torch.Tensor]) -> None:
        for key, value in values.items():
            shard = self._shard_of[key]
            if shard.name in self._tables:  # a snapshot's table rows: kept for the checkpoint's state_dict
                self._table_snapshot[key] = value
                continue
            variable = self._variables[shard.name]
            _rows(variable.data, shard).copy_(value)
            if not isinstance(variable, torch.nn.Parameter):
                self._pulled_buffers[key] = value.clone()

    # -- checkpoints -------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state_dict, as if it had trained here: shards' states joined by rows."""
        futures = [rpc.rpc_async(name, _ps_server.snapshot, timeout=self._timeout) for name in self._ps_names]
        shard_states: dict[str, dict[str, Any]] = {}
        with torch.no_grad():
            for values, states in _wait_all(futures, self._ps_names, "sending its shards for a checkpoint"):
                self._take_values(values)  # the module the checkpoint writes next holds the same moment's values
                shard_states.update(states)
        state: dict[int, dict[str, Any]] = {}
        for index, parameter in enumerate(parameters_of(self.param_groups)):
            variable = self._plan.variable(self._parameter_names[id(parameter)])
            parts = [shard_states.get(shard.key) for shard in variable.shards]
            if all(part is not None for part in parts):  # a parameter never stepped has no state, as in torch
                state[index] = join_state([part for part in parts if part is not None], variable)
        groups = self.local.state_dict()["param_groups"]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Splits a whole-model optimizer state by the placement and sends each ps its shards' part."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(saved["params"]) != len(group["params"]) for saved, group in zip(groups, self.param_groups)
        ):
            raise ValueError("loaded optimizer state has parameter groups that do not match this optimizer's")
        for saved, group in zip(groups, self.param_groups):
            for name, value in saved.items():
                if name != "params":
                    group[name] = value
        per_ps: dict[int, dict[str, dict[str, Any]]] = {ps: {} for ps in range(len(self._ps_names))}
        saved_state = state_dict["state"]
        for index, parameter in enumerate(parameters_of(self.param_groups)):
            entry = saved_state.get(index, saved_state.get(str(index)))
            if entry is None:
                continue
            variable = self._plan.variable(self._parameter_names[id(parameter)])
            for shard, part in zip(variable.shards, split_state(entry, variable)):
                per_ps[shard.ps][shard.key] = {
                    key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in part.items()
                }
        if self._chief:  # sent with the variables when training begins (a worker's copy would race the chief's)
            self._pending_state = per_ps


def _wait_all(futures: list[Any], names: list[str], doing: str) -> list[Any]:
    """Each future's result, in order; a failure names the ps it came from and what was being done."""
    results = []
    for future, name in zip(futures, names):
        try:
            results.append(future.wait())
        except Exception as error:
            raise TaskLostError(
                f"{name} stopped answering while {doing}: {error}. Every task stops; restart every task to resume "
                "from the newest checkpoint.",
                task=name,
            ) from error
    return results


def _rows(tensor: torch.Tensor, shard: Shard) -> torch.Tensor:
    return tensor if shard.whole else tensor[shard.start : shard.stop]


def _plain(value: Any) -> bool:
    """A hyperparameter that pickles cheaply and means the same on a ps (numbers, bools, tuples, None)."""
    return value is None or isinstance(value, (bool, int, float, str, tuple))


def parameters_of(groups: Iterable[dict[str, Any]]) -> list[torch.Tensor]:
    return [parameter for group in groups for parameter in group["params"]]
