"""``ParameterServerStrategy``: tf.estimator's parameter servers, on ``torch.distributed.rpc``.

TF_CONFIG names the tasks as TensorFlow's does: ``chief``, ``worker``, ``ps`` (and ``evaluator``, which
evaluates checkpoints on its own as with every strategy). Every task runs the same program; what
``setup()`` makes of it depends on its role:

- a ``ps`` task serves: ``Estimator.train`` (or ``train_and_evaluate``) on it holds its shards of the variables
  and the optimizer over them (``_ps_server.py``) until the chief ends training (or is lost), then returns (TF's
  ``server.join()`` never returned; here the program goes on, and exits non-zero if training ended by a failure);
- the chief and the workers train, each on its own share of the input (batch sizes stay global: a global
  batch of 64 over chief + 3 workers is 16 per trainer), each step pulling the variables, computing
  gradients and pushing them (``_ps_optimizer.RemoteOptimizer``); the chief alone writes checkpoints and
  summaries, evaluates in train_and_evaluate, and ends training for every task.

Updates are asynchronous by default (no trainer waits for another: a slow or lost worker does not hold the
others back, as TF's default), synchronous with ``sync_replicas=True`` (``SyncReplicasOptimizer``: each
step averages ``replicas_to_aggregate`` gradients, stale ones dropped). The global step is the ps 0's count of
applied updates; checkpoints are ordinary ones (the variables and the optimizer state gathered from the ps
tasks, joined by rows), so resume under another number of ps tasks or another strategy, warm start, export
and serving work as always.

The RPC group: the chief is rank 0 and hosts the rendezvous at its TF_CONFIG address (as MirroredStrategy's
store), workers follow, ps tasks last (TF's order). It is a dynamic group, so that a worker started again after
its process was lost joins the running cluster (``_ps_membership``). RPC carries unauthenticated pickles, as TF's gRPC did: the
cluster's network must be private.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.rpc as rpc
from torch import nn

from torchestimator._io import filesystems
from torchestimator.distribute import _ps_membership, _ps_server
from torchestimator.distribute._ps_optimizer import RemoteOptimizer
from torchestimator.distribute._timeouts import collective_timeout_seconds
from torchestimator.distribute.cluster import CHIEF, MASTER, PS, WORKER, ClusterSpec, cluster_from_tf_config
from torchestimator.distribute.input_context import InputContext
from torchestimator.distribute.ps_placement import (
    FixedShardsPartitioner,
    Partitioner,
    PlacementPlan,
    module_variables,
    plan_placement,
)
from torchestimator.distribute.sharded_embedding import keep_tables_on_parameter_servers, sharded_tables
from torchestimator.distribute.strategy import Placement, Strategy
from torchestimator.errors import ConfigError, ReplicasDisagreeError, TaskLostError

logger = logging.getLogger(__name__)

_LEAVE_GRACE_SECONDS = 30.0
"""How long a ps keeps serving after training ended, at most, for trainers still finishing a push to hear it."""
_MIN_GRACE_SECONDS = 2.0
"""How long it serves after training ended at least, and after the last call it answered."""


class ParameterServerStrategy(Strategy):
    """Variables on the ps tasks of TF_CONFIG; the chief and workers train against them.

    Args:
        sync_replicas: False (TF's default): each trainer's update is applied when it arrives. True: as
            ``tf.compat.v1.train.SyncReplicasOptimizer``, each step applies the mean of
            ``replicas_to_aggregate`` gradients computed on that step's weights; late ones are dropped.
        replicas_to_aggregate: gradients per synchronous step; None is every trainer (chief + workers).
        partitioner: how many row shards a variable is cut into (``ps_placement.FixedShardsPartitioner``, ``MinSizePartitioner``,
            ``MaxSizePartitioner``: TF's fixed_size_partitioner, min_max_variable_partitioner, variable_axis_size_partitioner);
            None keeps every variable whole. Each shard goes to the ps with the fewest bytes so far (TF's greedy
            load balancing).
        shard_names: regexes (``re.match``) of the variables the partitioner may cut (embedding tables); None: all.
        timeout_seconds: how long an RPC (a pull, a push, the start-up wait for the chief) waits before failing,
            naming the task it waited for. None reads TORCHESTIMATOR_COLLECTIVE_TIMEOUT, else 300 s.
        device: where a trainer computes; None is ``cuda:<local index>`` when CUDA is available, else the CPU.
            Variables on the ps tasks stay on their CPU, as TF placed them.
    """

    lockstep = False

    def __init__(
        self,
        *,
        sync_replicas: bool = False,
        replicas_to_aggregate: int | None = None,
        partitioner: Partitioner | None = None,
        shard_names: str | list[str] | None = None,
        timeout_seconds: float | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(sync_replicas, bool):
            raise TypeError(f"sync_replicas must be True or False; received {sync_replicas!r}.")
        if replicas_to_aggregate is not None and (
            isinstance(replicas_to_aggregate, bool)
            or not isinstance(replicas_to_aggregate, int)
            or replicas_to_aggregate < 1
        ):
            raise ValueError(f"replicas_to_aggregate must be a positive integer; received {replicas_to_aggregate!r}.")
        if replicas_to_aggregate is not None and not sync_replicas:
            raise ValueError("replicas_to_aggregate is for synchronous updates: pass sync_replicas=True with it.")
        self.sync_replicas = sync_replicas
        self.partitioner = partitioner
        self.shard_names = shard_names
        self.plan: PlacementPlan | None = None
        self.replicas_to_aggregate = replicas_to_aggregate
        self._timeout_argument = timeout_seconds
        self.timeout_seconds = 0.0
        self._device = None if device is None else torch.device(device)
        self.cluster: ClusterSpec | None = None
        self.role = ""
        self.name = ""
        self.ps_names: list[str] = []
        self.trainer_names: list[str] = []
        self._optimizer: RemoteOptimizer | None = None
        self._heartbeat_stop = threading.Event()
        self._ended_servers = False
        self._probe: tuple[str, str] | None = None  # the chief: (model_dir, the token it wrote into its probe file)
        # A worker's state, asked for by the chief's checkpoint and made by the training loop between steps.
        self._provide_state: Callable[[], Any] | None = None
        self._final_state: Any = None
        self._state: Any = None
        self._state_step = -1  # synchronous: the global step self._state belongs to
        self._state_changed = threading.Condition()
        self._state_requested = threading.Event()
        self._state_ready = threading.Event()

    def __repr__(self) -> str:
        mode = "sync" if self.sync_replicas else "async"
        return f"ParameterServerStrategy({mode}, {self.name or 'not set up'})"

    # -- setup -------------------------------------------------------------------

    def _setup(self) -> Placement:
        cluster = cluster_from_tf_config()
        if PS not in cluster.jobs:
            raise ConfigError(
                "ParameterServerStrategy needs TF_CONFIG with a 'ps' job (and a chief): "
                '{"cluster": {"chief": ["host:port"], "worker": [...], "ps": ["host:port", ...]}, '
                '"task": {"type": "worker", "index": 0}}; TF_CONFIG is '
                f"{'unset' if not cluster.jobs else 'a cluster of ' + str(sorted(cluster.jobs))}.",
                field="TF_CONFIG",
            )
        chief_job = CHIEF if CHIEF in cluster.jobs else MASTER  # the parser refused a cluster without either
        self.cluster = cluster
        self.timeout_seconds = collective_timeout_seconds(self._timeout_argument)
        workers = len(cluster.jobs.get(WORKER, ()))
        num_ps = len(cluster.jobs[PS])
        self.trainer_names = ["chief", *(f"worker:{index}" for index in range(workers))]
        self.ps_names = [f"ps:{index}" for index in range(num_ps)]
        if cluster.task_type in (chief_job,):
            self.role, rank = CHIEF, 0
        elif cluster.task_type == WORKER:
            self.role, rank = WORKER, 1 + cluster.task_index
        elif cluster.task_type == PS:
            self.role, rank = PS, 1 + workers + cluster.task_index
        else:
            raise ConfigError(
                f"ParameterServerStrategy runs in the chief, worker and ps tasks; this is TF_CONFIG's "
                f"{cluster.task_type!r} task (the evaluator evaluates checkpoints without a strategy).",
                field='TF_CONFIG["task"]["type"]',
                value=cluster.task_type,
            )
        self.name = self.trainer_names[rank] if rank < len(self.trainer_names) else self.ps_names[cluster.task_index]
        address = cluster.jobs[chief_job][0]
        options = rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=16 + 2 * len(self.trainer_names),
            rpc_timeout=self.timeout_seconds,
            init_method=f"tcp://{address}",
            # TCP (libuv) only: faster here than TensorPipe's shared-memory transport, whose threads poll (4 tasks on
            # 2 cores, one thread each, 300 steps: 4.4-8.3 s against 6.0-16.1 s; decision 0035).
            _transports=["uv"],
            _channels=["basic"],
        )
        world = len(self.trainer_names) + num_ps
        # A worker whose earlier process was lost joins the running group again, under a fresh rank.
        restart_rank = (
            _ps_membership.rank_for_a_restart(address, self.name, world, self.timeout_seconds)
            if self.role == WORKER
            else None
        )
        logger.info("%s joining the parameter-server group of %d tasks at %s.", self.name, world, address)
        with warnings.catch_warnings():  # torch's own RPC set-up uses a deprecated gloo call and says so
            warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
            rpc.init_rpc(  # type: ignore[no-untyped-call]
                self.name,
                rank=rank if restart_rank is None else restart_rank,
                world_size=None,  # a dynamic group: a restarted worker can join it again
                rpc_backend_options=options,
            )
        if restart_rank is None:
            _ps_membership.wait_for_members(
                [*self.trainer_names, *self.ps_names], self.name, address, self.timeout_seconds
            )
        else:
            _ps_membership.wait_for_members(["chief", *self.ps_names], self.name, address, self.timeout_seconds)
            _ps_membership.announce_restart(self.name, self.timeout_seconds)
        keep_tables_on_parameter_servers(self.role != PS)  # ShardedEmbedding tables built now stay on the ps
        if self.role == CHIEF:
            self._start_heartbeat()
        _warn_if_oversubscribed(cluster, self.name)
        device = self._device or (
            torch.device("cuda", cluster.local_rank % torch.cuda.device_count())
            if torch.cuda.is_available() and self.role != PS
            else torch.device("cpu")
        )
        return Placement(device=device)

    def _teardown(self) -> None:
        if self._optimizer is not None:
            self._optimizer.detach_tables()
        keep_tables_on_parameter_servers(False)
        rpc.shutdown(graceful=False)

    # -- roles -------------------------------------------------------------------

    @property
    def is_chief(self) -> bool:
        return self.role == CHIEF

    @property
    def serves_variables(self) -> bool:
        """This task is a ps: it serves (``serve``) instead of training."""
        self.placement  # noqa: B018 -- raises the setup() advice
        return self.role == PS

    @property
    def num_trainers(self) -> int:
        return len(self.trainer_names)

    def input_context(self) -> InputContext:
        """Each trainer reads its own share of the input: the chief is pipeline 0, worker i is i + 1."""
        self.placement  # noqa: B018
        index = self.trainer_names.index(self.name) if self.name in self.trainer_names else 0
        return InputContext(
            num_replicas_in_sync=self.num_trainers, input_pipeline_id=index, num_input_pipelines=self.num_trainers
        )

    # -- the ps task ---------------------------------------------------------------

    def serve(self) -> None:
        """Holds this ps's shards until the chief ends training, then leaves the group."""
        assert self.cluster is not None
        server = _ps_server.ShardServer(self.cluster.task_index)
        server.timeout = self.timeout_seconds
        _ps_server.start_serving(server)
        logger.info("%s serving variables; it ends when the chief ends training.", self.name)
        started = time.monotonic()
        while not server.wait_ended(1.0):  # in slices: Ctrl-C still reaches the ps, and the chief is watched
            server.check_chief(started)
        # The chief's end() and trainers' last pushes get their answers before the agent stops: at least a short
        # grace, longer while trainers still call (bounded: a trainer that died never calls again).
        ended_at = time.monotonic()
        deadline = ended_at + _LEAVE_GRACE_SECONDS
        while time.monotonic() < deadline and (
            time.monotonic() - ended_at < _MIN_GRACE_SECONDS or _recently_contacted(server, _MIN_GRACE_SECONDS)
        ):
            time.sleep(0.1)
        logger.info("%s: training ended (%s); leaving the group.", self.name, server.ended)
        self.teardown()
        if server.failed:  # the process exits non-zero, as the trainers do: a cluster manager sees the failure
            raise TaskLostError(f"{self.name} stops: {server.ended}", task=server.lost, step=server.global_step)

    # -- the trainers --------------------------------------------------------------

    def _wrap(self, module: nn.Module) -> nn.Module:
        return module.to(self.device)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> torch.optim.Optimizer:
        """The trainer's optimizer as a stand-in whose step pushes gradients to the ps tasks and pulls values."""
        partitioner, shard_names = self.partitioner, self.shard_names
        tables = sharded_tables(module)
        if tables and partitioner is None:  # tables are cut by rows across every ps, as TF partitioned embeddings
            partitioner = FixedShardsPartitioner(num_shards=len(self.ps_names))
            shard_names = [re.escape(name) + "$" for name in tables]
        plan = plan_placement(module_variables(module), len(self.ps_names), partitioner, shard_names)
        if self.is_chief:
            logger.info("Variables on %d ps tasks:\n%s", len(self.ps_names), plan.describe())
        self.plan = plan
        self._optimizer = RemoteOptimizer(
            optimizer,
            module,
            plan,
            self.ps_names,
            self.name,
            on_global_step=lambda step: None,
            timeout=self.timeout_seconds,
            chief=self.is_chief,
        )
        return self._optimizer

    def begin_training(self, module: nn.Module, global_step: int, *, model_dir: str | None = None) -> int:
        """The chief puts its (restored or initial) values and optimizer on the ps tasks; a worker waits for that and
        pulls them. Returns the global step training continues from.

        ``model_dir``: the chief writes a fresh token into a probe file there for the run (removed when it ends
        training) and tells ps 0; a worker that does not read it in its own model_dir stops before step one
        (``ReplicasDisagreeError``): it would read its input position from other checkpoints than the chief writes."""
        optimizer = self._optimizer
        if optimizer is None:
            raise RuntimeError("ParameterServerStrategy.begin_training before wrap_optimizer.")
        if self.is_chief:
            if model_dir is not None:
                self._probe = (model_dir, _place_model_dir_probe(model_dir))
                rpc.rpc_sync(
                    self.ps_names[0], _ps_server.set_model_dir_probe, args=self._probe, timeout=self.timeout_seconds
                )
            aggregate = (self.replicas_to_aggregate or self.num_trainers) if self.sync_replicas else None
            optimizer.initialize_servers(global_step, aggregate)
        else:
            optimizer.wait_for_servers()
            if model_dir is not None:
                self._check_model_dir(model_dir)
        optimizer.pull()
        return optimizer.global_step

    def _check_model_dir(self, model_dir: str) -> None:
        chief = rpc.rpc_sync(self.ps_names[0], _ps_server.model_dir_probe, timeout=self.timeout_seconds)
        if chief is None:  # a chief that was told no model_dir (never from an Estimator)
            return
        chief_dir, token = chief
        deadline = time.monotonic() + _PROBE_VISIBILITY_SECONDS
        while not _reads_token(model_dir, token):
            # The chief removes the file when it ends training, after ending the ps tasks: a worker that starts
            # that late finds training over (or the ps gone), not another model_dir; its next call says so.
            try:
                if rpc.rpc_sync(self.ps_names[0], _ps_server.ended_reason, timeout=self.timeout_seconds) is not None:
                    return
            except RuntimeError:
                return
            if time.monotonic() > deadline:
                raise ReplicasDisagreeError(
                    f"{self.name} does not see the file {_PROBE_NAME} that the chief wrote into its model_dir "
                    f"({chief_dir}) in this task's model_dir ({model_dir}): every trainer must use the same storage "
                    "for model_dir (a shared file system or an object store), or its input position is read from "
                    "other checkpoints than the chief writes. This task stops before step one.",
                    views=[],
                )
            time.sleep(0.05)

    def _start_heartbeat(self) -> None:
        """Tells every ps, a few times per timeout, that the chief lives (a chief killed -9 says nothing else), from
        set-up on: a ps also learns of a chief that dies before it put the variables there."""
        self._heartbeat_stop.clear()
        interval = max(0.5, min(5.0, self.timeout_seconds / 6))
        names, timeout = list(self.ps_names), self.timeout_seconds

        def beat() -> None:
            while not self._heartbeat_stop.wait(interval):
                for name in names:  # not waited for: a lost ps shows at the next step
                    try:
                        rpc.rpc_async(name, _ps_server.heartbeat, timeout=timeout)
                    except Exception as error:  # the agent is shutting down; the steps report a lost ps
                        logger.debug("heartbeat to %s: %s", name, error)

        threading.Thread(target=beat, name="torchestimator-ps-heartbeat", daemon=True).start()

    def next_global_step(self, step: int) -> int:
        assert self._optimizer is not None
        if self.sync_replicas and self._provide_state is not None:
            # Synchronous: the state after each step, ready for the chief's checkpoint of that step. (Asked instead,
            # it would come after this worker's next push, which waits for the chief's gradient: a deadlock.)
            state = self._provide_state()
            with self._state_changed:
                self._state, self._state_step = state, self._optimizer.global_step
                self._state_changed.notify_all()
        elif self._state_requested.is_set():  # the chief's checkpoint waits for this trainer's state: between steps
            self._answer_state_request()
        return self._optimizer.global_step

    # -- per-trainer states in checkpoints (input positions, generator states) -------------------------

    @property
    def checkpoint_slot(self) -> tuple[int, int]:
        return self.trainer_names.index(self.name), self.num_trainers

    def provide_replica_state(self, provide: Callable[[], Any]) -> None:
        global _TRAINER
        self._provide_state, self._final_state = provide, None
        _TRAINER = self

    def gather_replica_states(self, own: Any) -> list[Any]:
        """The chief: its own state and each worker's, asked over RPC (a worker answers between two steps); a worker
        that does not answer (lost) gets no position saved: on resume its input restarts, with a warning."""
        if not self.is_chief:
            return [own]
        workers = self.trainer_names[1:]
        wait = min(self.timeout_seconds, _STATE_WAIT_SECONDS)
        step = self._optimizer.global_step if self._optimizer is not None else -1
        futures = [rpc.rpc_async(name, _trainer_state, args=(wait, step), timeout=wait + 5) for name in workers]
        states = [own]
        for name, future in zip(workers, futures):
            try:
                state = future.wait()
            except Exception as error:  # a worker that is gone or stopped: the checkpoint goes on without it
                state = None
                logger.debug("%s's state: %s", name, error)
            if state is None:
                logger.warning(
                    "%s did not send its input position for this checkpoint (it stopped or was lost): if training "
                    "resumes from it, that worker's input starts over.",
                    name,
                )
                state = {"train_state": own["train_state"], "input_source": None}
            states.append(state)
        return states

    def _answer_state_request(self) -> None:
        provide = self._provide_state
        self._state = provide() if provide is not None else None
        self._state_requested.clear()
        self._state_ready.set()

    def state_for_chief(self, wait: float, step: int) -> Any:
        """A worker, in an RPC thread: its state as of its next step's end (or its final one once it stopped)."""
        if self._final_state is not None or self.training_ended is not None:
            return self._final_state
        if self.sync_replicas:
            # The state of the checkpoint's own step: this worker may still be taking that step's answer in.
            with self._state_changed:
                ready = self._state_changed.wait_for(
                    lambda: self._state_step >= step or self.training_ended is not None, wait
                )
                return self._state if ready and self._state_step == step else None
        self._state_ready.clear()
        self._state_requested.set()
        if not self._state_ready.wait(wait):
            self._state_requested.clear()
            return None
        return self._state

    @property
    def training_ended(self) -> str | None:
        """Why the ps tasks said training ended (the chief finished), or None."""
        return None if self._optimizer is None else self._optimizer.ended

    def end_training(self, reason: str, *, failed: bool = False) -> None:
        """The chief, when it stops (before step one too): every ps ends, so the workers stop at their next push
        (raising if it failed). A worker that reached the end itself stays in the group until the chief's final
        checkpoint has its state (the ps say training ended), within the timeout."""
        if not self.is_set_up or self.role == PS:
            return
        if self.is_chief:
            self._heartbeat_stop.set()
            self._end_servers(reason, failed)
            if self._probe is not None:
                _remove_probe(self._probe[0])
                self._probe = None
            return
        if self._provide_state is not None and not failed:
            self._final_state = self._provide_state()  # the position the chief's final checkpoint asks for
            if self.training_ended is None:
                self._wait_for_the_chief_to_end()

    def _end_servers(self, reason: str, failed: bool) -> None:
        if self._ended_servers:
            return
        self._ended_servers = True
        if self._optimizer is not None:
            self._optimizer.ended = reason
        futures = [
            rpc.rpc_async(name, _ps_server.end, args=(reason, failed), timeout=self.timeout_seconds)
            for name in self.ps_names
        ]
        for name, future in zip(self.ps_names, futures):
            try:
                future.wait()
            except Exception as error:  # reported: the run is over either way
                logger.warning("Could not tell %s that training ended (%s): %s", name, reason, error)

    def _wait_for_the_chief_to_end(self) -> None:
        deadline = time.monotonic() + self.timeout_seconds
        while time.monotonic() < deadline:
            try:
                if rpc.rpc_sync(self.ps_names[0], _ps_server.ended_reason, timeout=self.timeout_seconds) is not None:
                    return
            except Exception as error:  # ps 0 gone: nothing left to wait for
                logger.debug("waiting for the chief's end: %s", error)
                return
            time.sleep(0.2)
        logger.warning(
            "%s: the chief did not end training within %.0f s of this worker's last step; leaving the group.",
            self.name,
            self.timeout_seconds,
        )


_TRAINER: ParameterServerStrategy | None = None
"""This process's trainer strategy, for the chief's RPC asking its state."""

_STATE_WAIT_SECONDS = 30.0
"""How long the chief waits for a worker's state for a checkpoint (one step, normally)."""


def _trainer_state(wait: float, step: int) -> Any:
    """Called by the chief over RPC: this worker's state for the chief's checkpoint of global step ``step``."""
    return None if _TRAINER is None else _TRAINER.state_for_chief(wait, step)


def _warn_if_oversubscribed(cluster: ClusterSpec, name: str) -> None:
    """Several tasks on this machine, each with torch's default thread pool, share its cores: their threads spin
    against each other (a chief, 2 workers and a ps on 2 cores ran ~100x slower than with one thread each)."""
    here = cluster.jobs[cluster.task_type][cluster.task_index].rsplit(":", 1)[0]
    tasks_here = sum(address.rsplit(":", 1)[0] == here for addresses in cluster.jobs.values() for address in addresses)
    cores, threads = os.cpu_count() or 1, torch.get_num_threads()
    if tasks_here > 1 and threads > max(1, cores // tasks_here):
        logger.warning(
            "%s: %d tasks of this cluster run on this machine (%s), each with %d torch threads, on %d cores: set "
            "OMP_NUM_THREADS=%d (or torch.set_num_threads) in each task's environment, as torchrun does, or the "
            "threads slow each other down badly.",
            name,
            tasks_here,
            here,
            threads,
            cores,
            max(1, cores // tasks_here),
        )


_PROBE_NAME = ".ps-model-dir-probe"
"""The chief's probe file in model_dir: one name (a killed chief's is replaced by the next), a fresh token inside."""
_PROBE_VISIBILITY_SECONDS = 1.0
"""How long a worker looks for the chief's token: the chief wrote and closed the file before any worker asks, so
a shared file system (close-to-open) and object stores (read-after-write) show it at once; a caching mount may
show it a moment late."""


def _place_model_dir_probe(model_dir: str) -> str:
    """The chief: writes a fresh token into model_dir's probe file; returns it."""
    token = secrets.token_hex(16)
    if not filesystems.is_url(model_dir):
        os.makedirs(model_dir, exist_ok=True)
    filesystems.write_bytes(filesystems.join(model_dir, _PROBE_NAME), token.encode())
    return token


def _reads_token(model_dir: str, token: str) -> bool:
    try:
        return filesystems.read_bytes(filesystems.join(model_dir, _PROBE_NAME)) == token.encode()
    except FileNotFoundError:
        return False


def _remove_probe(model_dir: str) -> None:
    try:
        filesystems.remove(filesystems.join(model_dir, _PROBE_NAME))
    except FileNotFoundError:
        pass
    except OSError as error:  # the next chief replaces it
        logger.warning("Could not remove %s: %s", filesystems.join(model_dir, _PROBE_NAME), error)


def _recently_contacted(server: _ps_server.ShardServer, seconds: float) -> bool:
    now = time.monotonic()
    return any(now - seen < seconds for seen in server.last_contact.values())
