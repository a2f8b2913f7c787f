"""``MirroredStrategy``: data parallel training, one process per replica, gradients averaged by
DistributedDataParallel; ``MultiWorkerMirroredStrategy`` is TensorFlow's name for the same across machines.

Belongs here: finding this replica's group (an existing one, torchrun's, TF_CONFIG's, srun's, or a plain script's
own replicas), joining or creating it with the collective timeout, choosing the device and backend, wrapping the
module in DDP, and the collectives over the group (through ``collectives.py``). The helpers that start a plain
script's replicas and watch them while the group forms live in ``_group_formation.py``; reading the cluster from the
environment in ``cluster.py``.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torchestimator.distribute import collectives
from torchestimator.distribute._group_formation import (
    _JOINED_KEY,
    _group_did_not_form,
    _raise_if_replica_zero_is_gone,
    _start_quiet_replicas,
    _wait_for_own_replicas,
    _wait_for_replica_zeros_store,
)
from torchestimator.distribute._timeouts import DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, collective_timeout_seconds
from torchestimator.distribute.cluster import (
    EVALUATOR,
    PS,
    PS_ADVICE,
    ClusterSpec,
    cluster_from_torchrun,
    resolve_cluster,
)
from torchestimator.distribute.launcher import LocalReplicas, is_started_replica
from torchestimator.distribute.strategy import Placement, Strategy, _check_device_exists
from torchestimator.errors import ConfigError, ReplicaLostError

logger = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
"""torch.distributed backends a MirroredStrategy accepts."""


class MirroredStrategy(Strategy):
    """Data parallel training: one process per replica, gradients averaged by DistributedDataParallel.

    ``setup()`` finds its processes (``resolve_cluster``) in the first of these that applies:

    * a process group already exists (``torchestimator.testing.run_in_processes``, Ray Train): it
      is used as is and left for its creator to destroy;
    * the program was started by ``torchrun`` or ``torchestimator launch`` (RANK, WORLD_SIZE,
      MASTER_ADDR, MASTER_PORT are set; Kubeflow's PyTorchJob sets them too): each process joins
      the group from those variables;
    * ``TF_CONFIG`` names several training tasks (chief + workers), as TF users run them: a plain
      ``python train.py`` in each task; the chief is rank 0 and serves the group's store at its
      TF_CONFIG address, worker i is rank i + 1. A ``ps`` task is refused (there are no parameter
      servers); the ``evaluator`` task never joins the group and runs one local replica;
    * ``srun`` started several tasks (SLURM_PROCID, SLURM_NTASKS): the group is formed at the first
      host of SLURM_NODELIST, port MASTER_PORT or 15000 + the job id's last 4 digits;
    * otherwise a plain ``python script.py`` (as with tf.estimator): with ``num_replicas`` > 1 this
      process becomes replica 0 and runs the same command line again as replicas 1..N-1, then all
      join the group. Code before ``setup()`` therefore runs in every replica, as under torchrun, but
      what the program prints shows once: replicas 1..N-1's standard output goes to a file named in a log
      line (``TORCHESTIMATOR_REPLICA_STDOUT=all`` shows it here; the folder goes at exit when the file
      stayed empty, and only the newest runs' files stay), their standard error shows here through
      replica 0, each line prefixed with ``[rankN]:`` from their first line on. A replica that exits
      before the group forms stops replica 0 at once with a ``ReplicaLostError`` naming it. At exit,
      replica 0 waits for the others, says which failed (or that it stopped them, when it failed
      itself) and exits with status 1 if one failed. Programs that
      cannot be re-run (``python -c``, stdin, notebooks) get a ``RelaunchError`` that says to use
      the launcher.

    Args:
        num_replicas: replicas to train. None means the launched world size, else one per
            CUDA device, else 1 on a machine without CUDA (as tf.distribute.MirroredStrategy
            uses the CPU as its one replica); ask for several CPU processes explicitly.
        backend: torch.distributed backend; None is nccl on CUDA devices, gloo on CPU.
        devices: one device per local replica (``["cuda:0", "cuda:2"]`` or ``[0, 2]``); None is
            ``cuda:<LOCAL_RANK>`` when CUDA is available, else the CPU.
        find_unused_parameters: passed to DistributedDataParallel, for models whose forward
            skips some parameters.
        timeout_seconds: how long a collective (and the start-up join) waits for the other replicas
            before failing. None reads TORCHESTIMATOR_COLLECTIVE_TIMEOUT (seconds) at ``setup()``, else
            300 s: short enough that a dead replica fails the others and torchrun's elastic restart
            fires within minutes, long enough for the chief to write a checkpoint while the others wait.
    """

    def __init__(
        self,
        num_replicas: int | None = None,
        backend: str | None = None,
        devices: Sequence[str | int | torch.device] | None = None,
        *,
        find_unused_parameters: bool = False,
        timeout_seconds: float | None = None,
    ) -> None:
        super().__init__()
        if num_replicas is not None and (
            isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1
        ):
            raise ValueError(
                f"MirroredStrategy num_replicas must be a positive integer or None; received {num_replicas!r}."
            )
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"MirroredStrategy backend must be one of {BACKENDS} or None; received {backend!r}.")
        if timeout_seconds is not None and (
            isinstance(timeout_seconds, bool)
            or not isinstance(timeout_seconds, (int, float))
            or not math.isfinite(timeout_seconds)
            or timeout_seconds <= 0
        ):
            raise ValueError(
                f"{type(self).__name__} timeout_seconds must be positive seconds or None; received {timeout_seconds!r}."
            )
        self._devices = None if devices is None else tuple(_as_device(device) for device in devices)
        if self._devices is not None and not self._devices:
            raise ValueError("MirroredStrategy devices must name at least one device, or be None.")
        if self._devices is not None and num_replicas is not None and num_replicas != len(self._devices):
            raise ValueError(
                f"MirroredStrategy received num_replicas={num_replicas} but {len(self._devices)} devices "
                f"{[str(device) for device in self._devices]}; give one device per replica."
            )
        self._requested_replicas = num_replicas
        self._backend = backend
        self._find_unused_parameters = find_unused_parameters
        self._requested_timeout = timeout_seconds
        self._timeout = datetime.timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT_SECONDS)  # setup() resolves it
        self._created_group = False
        self._threads_before: int | None = None  # the process-wide thread count setup lowered, for teardown

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_replicas={self._requested_replicas}, backend={self._backend!r})"

    @property
    def timeout_seconds(self) -> float:
        """The collective timeout in force (resolved from the environment by ``setup()``)."""
        return self._timeout.total_seconds()

    # ------------------------------------------------------------ setup

    def _setup(self) -> Placement:
        if distributed.is_initialized():
            return self._adopt_group()
        self._timeout = datetime.timedelta(seconds=collective_timeout_seconds(self._requested_timeout))
        cluster = resolve_cluster(os.environ)
        if cluster.task_type == PS:
            raise ConfigError(
                f"TF_CONFIG says this task is a 'ps' (parameter server). {PS_ADVICE}",
                field='TF_CONFIG["task"]["type"]',
                value=PS,
            )
        if cluster.task_type == EVALUATOR:
            # TF's evaluator is outside the training cluster: it evaluates checkpoints with one replica.
            logger.info(
                "%r: TF_CONFIG says this task is the evaluator, which never joins the training group; "
                "it runs one local replica.",
                self,
            )
            return self._single_process_group()
        if cluster.source == "torchrun" or cluster.spans_several_processes:
            if cluster.source == "torchrun":
                _raise_if_replica_zero_is_gone(cluster, "before joining the group")
            if cluster.source == "torchrun" and is_started_replica():  # one a plain script started (replica 0 waits)
                return self._join_group(cluster, own_replicas=True)
            if cluster.num_ps_replicas:
                logger.warning(
                    "TF_CONFIG names %d 'ps' task(s); they are not used: chief and workers train "
                    "synchronously (DistributedDataParallel).",
                    cluster.num_ps_replicas,
                )
            return self._join_group(cluster)
        num_replicas = self._default_num_replicas()
        if num_replicas == 1:
            return self._single_process_group()
        replicas = _start_quiet_replicas(num_replicas)
        launched = cluster_from_torchrun(os.environ)
        assert launched is not None, "start_local_replicas sets the torchrun variables"
        return self._join_group(launched, own_replicas=replicas)

    def _default_num_replicas(self) -> int:
        if self._requested_replicas is not None:
            return self._requested_replicas
        if self._devices is not None:
            return len(self._devices)
        if torch.cuda.is_available():
            return torch.cuda.device_count()
        logger.info(
            "MirroredStrategy: no CUDA device, so one replica on the CPU; pass num_replicas=N for N CPU processes."
        )
        return 1

    def _check_world_size(self, world_size: int, where: str) -> None:
        if self._requested_replicas is not None and self._requested_replicas != world_size:
            raise ValueError(
                f"{type(self).__name__}(num_replicas={self._requested_replicas}) but {where} has {world_size} "
                f"processes. Launch {self._requested_replicas} processes, or use num_replicas=None to take "
                "the launched count."
            )

    def _pick_device(self, local_rank: int, local_world_size: int) -> torch.device:
        if self._devices is not None:
            if local_world_size > len(self._devices):
                raise ValueError(
                    f"MirroredStrategy has {len(self._devices)} devices for {local_world_size} local replicas "
                    f"(LOCAL_WORLD_SIZE); give one device per local replica."
                )
            device = self._devices[local_rank]
        elif torch.cuda.is_available():
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        _check_device_exists(device, f"MirroredStrategy replica with LOCAL_RANK={local_rank}")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device

    def _backend_for(self, device: torch.device) -> str:
        return self._backend or ("nccl" if device.type == "cuda" else "gloo")

    def _join_group(self, cluster: ClusterSpec, own_replicas: LocalReplicas | bool = False) -> Placement:
        """Joins the group the cluster describes; ``own_replicas``: a plain script's own group (replica 0 passes the
        replicas it started, the others True), formed so that replica 0 watches the others' processes."""
        assert cluster.rank is not None and cluster.world_size is not None
        self._check_world_size(cluster.world_size, _GROUP_DESCRIPTIONS[cluster.source])
        device = self._pick_device(cluster.local_rank, cluster.local_world_size)
        if own_replicas:
            self._form_own_group(cluster, device, own_replicas if isinstance(own_replicas, LocalReplicas) else None)
        else:
            self._init_group(cluster, device)
        self._after_group_created(cluster.local_world_size)
        return Placement(
            device=device,
            num_replicas=cluster.world_size,
            replica_id=cluster.rank,
            local_replica_id=cluster.local_rank,
            local_num_replicas=cluster.local_world_size,
        )

    def _form_own_group(self, cluster: ClusterSpec, device: torch.device, replicas: LocalReplicas | None) -> None:
        """A plain script's group, over a store replica 0 serves: each other replica marks its arrival there, and
        replica 0 creates the group only once all have, watching their processes meanwhile (init_process_group
        itself would wait the whole timeout for a replica that already exited)."""
        assert cluster.master_addr is not None and cluster.master_port is not None and cluster.world_size is not None
        assert cluster.rank is not None  # _join_group checked it
        chief = cluster.rank == 0
        if not chief:  # replica 0 serves the store: while it is not up, watch that replica 0 still runs
            _wait_for_replica_zeros_store(cluster, self.timeout_seconds)
        try:
            store = distributed.TCPStore(
                cluster.master_addr,
                cluster.master_port,
                cluster.world_size,
                is_master=chief,
                timeout=self._timeout,
                wait_for_workers=False,
            )
        except (distributed.DistStoreError, distributed.DistNetworkError) as error:
            where = f"{cluster.master_addr}:{cluster.master_port}"
            what = (
                "could not serve the group's store at"
                if chief
                else f"did not reach the group's store within {self.timeout_seconds:g} s: replica 0, which serves it "
                "(and started this process), is gone or never got there; the store is at"
            )
            raise ReplicaLostError(
                f"Replica {cluster.rank} of {cluster.world_size} {what} {where} ({type(error).__name__}: {error})."
            ) from error
        if chief:
            assert replicas is not None, "replica 0 passes the replicas it started"
            _wait_for_own_replicas(store, replicas, cluster.world_size, self.timeout_seconds)
        try:
            if not chief:
                store.set(_JOINED_KEY.format(rank=cluster.rank), str(os.getpid()))
            distributed.init_process_group(
                self._backend_for(device),
                store=distributed.PrefixStore("default_pg", store),
                rank=cluster.rank,
                world_size=cluster.world_size,
                timeout=self._timeout,
            )
        except (distributed.DistStoreError, distributed.DistNetworkError) as error:
            if not chief:  # the store went with replica 0's process
                _raise_if_replica_zero_is_gone(cluster, "while the group formed", error)
            raise

    def _init_group(self, cluster: ClusterSpec, device: torch.device) -> None:
        assert cluster.rank is not None and cluster.world_size is not None  # _join_group checked them
        if cluster.source == "torchrun":
            # env:// lets torchrun hand its agent's store to the workers (TORCHELASTIC_USE_AGENT_STORE).
            init_method = "env://"
        else:
            assert cluster.master_addr is not None and cluster.master_port is not None
            host = f"[{cluster.master_addr}]" if ":" in cluster.master_addr else cluster.master_addr
            init_method = f"tcp://{host}:{cluster.master_port}"
            logger.info(
                "%r: %s rank %d of %d joins the group at %s (waits up to %g s for the others).",
                self,
                cluster.source,
                cluster.rank,
                cluster.world_size,
                init_method,
                self.timeout_seconds,
            )
        try:
            distributed.init_process_group(
                self._backend_for(device),
                init_method=init_method,
                rank=cluster.rank,
                world_size=cluster.world_size,
                timeout=self._timeout,
            )
        except (distributed.DistStoreError, distributed.DistNetworkError) as error:
            raise ReplicaLostError(_group_did_not_form(cluster, init_method, self.timeout_seconds, error)) from error

    def _single_process_group(self) -> Placement:
        # DDP needs a process group even for one replica; an in-memory store needs no port.
        device = self._pick_device(0, 1)
        distributed.init_process_group(
            self._backend_for(device), store=distributed.HashStore(), rank=0, world_size=1, timeout=self._timeout
        )
        self._after_group_created(1)
        return Placement(device=device)

    def _adopt_group(self) -> Placement:
        world_size, rank = distributed.get_world_size(), distributed.get_rank()
        self._check_world_size(world_size, "the existing process group")
        backend = str(distributed.get_backend())
        if self._backend is not None and self._backend != backend:
            raise ValueError(
                f"MirroredStrategy(backend={self._backend!r}) but the existing process group uses {backend!r}. "
                "Use backend=None to take the existing group's backend."
            )
        cluster = cluster_from_torchrun(os.environ)
        local_rank = cluster.local_rank if cluster is not None else rank
        local_world_size = cluster.local_world_size if cluster is not None else world_size
        device = self._pick_device(local_rank, local_world_size)
        self._threads_before = _limit_threads(local_world_size)
        return Placement(
            device=device,
            num_replicas=world_size,
            replica_id=rank,
            local_replica_id=local_rank,
            local_num_replicas=local_world_size,
        )

    def _after_group_created(self, local_world_size: int) -> None:
        self._created_group = True
        atexit.register(self.teardown)
        self._threads_before = _limit_threads(local_world_size)

    def _teardown(self) -> None:
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        if self._created_group:
            atexit.unregister(self.teardown)
            if distributed.is_initialized():
                distributed.destroy_process_group()
            self._created_group = False

    # ------------------------------------------------------------ modules and collectives

    def _wrap(self, module: nn.Module) -> nn.Module:
        device = self.placement.device
        module = module.to(device)
        if not any(parameter.requires_grad for parameter in module.parameters()):
            # DDP refuses modules with nothing to train (a frozen model being evaluated).
            logger.debug("MirroredStrategy.wrap: no trainable parameters, so no DistributedDataParallel.")
            return module
        return DistributedDataParallel(
            module,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=self._find_unused_parameters,
        )

    # Through collectives.py: its hand_over spares gloo's worker thread taking the GIL to let go of a tensor (when
    # it waits for the GIL as the interpreter ends, CPython ends the thread and std::terminate aborts the process).

    def _all_reduce(self, tensor: torch.Tensor, op: Any) -> torch.Tensor:
        return collectives.all_reduce(tensor, op)

    def _broadcast_object(self, obj: Any, src: int) -> Any:
        return collectives.broadcast_object(obj, src, self.placement.device)

    def _broadcast_tensor(self, tensor: torch.Tensor, src: int) -> None:
        collectives.broadcast(tensor, src)

    def _all_gather_object(self, obj: Any) -> list[Any]:
        return collectives.all_gather_object(obj, self.placement.device)

    def _barrier(self) -> None:
        device = self.placement.device
        if device.type == "cuda":
            distributed.barrier(device_ids=[device.index])
        else:
            distributed.barrier()


class MultiWorkerMirroredStrategy(MirroredStrategy):
    """TensorFlow's name for ``MirroredStrategy`` across machines; the same strategy.

    ``tf.distribute.MultiWorkerMirroredStrategy`` reads the cluster from ``TF_CONFIG``; so does this
    one (and torchrun's and SLURM's variables), through ``MirroredStrategy.setup()``. TF users' launch
    scripts work unchanged: ``python train.py`` in each task with its TF_CONFIG.
    """


_GROUP_DESCRIPTIONS = {
    "torchrun": "the launched run (WORLD_SIZE)",
    "tf_config": "the TF_CONFIG cluster (its chief and workers)",
    "slurm": "the srun step (SLURM_NTASKS)",
}


def _as_device(device: str | int | torch.device) -> torch.device:
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    if isinstance(device, (str, torch.device)):
        return torch.device(device)
    raise TypeError(
        f"MirroredStrategy devices must be device names, CUDA indices or torch.device; received {device!r}."
    )


def _limit_threads(local_world_size: int) -> int | None:
    """Share the CPU cores among the local replicas, never raising a count the user set.

    Returns the count before, when it changed, for teardown to put back (the count is process-wide).
    """
    configured = os.environ.get("OMP_NUM_THREADS", "")
    target = int(configured) if configured.isdigit() and int(configured) > 0 else None
    if target is None:
        target = max(1, (os.cpu_count() or 1) // local_world_size)
    before = torch.get_num_threads()
    if before > target:
        torch.set_num_threads(target)
        return before
    return None
