"""Distribution strategies: where a replica runs and how replicas cooperate.

Belongs here: the ``Strategy`` interface the training loop talks to (setup,
device, replica ids, wrap/unwrap, no_sync, small collectives for logging and
stopping together, teardown) and its implementations, ``OneDeviceStrategy`` and
``MirroredStrategy`` (DistributedDataParallel over processes on one or several
machines; ``MultiWorkerMirroredStrategy`` is TF's name for the same), and the
collective timeout. Differences between backends live behind this interface,
never in ``if`` chains in the loop. Does not belong here: reading clusters
(``cluster.py``: ``resolve_cluster``) and starting processes (``launcher.py``),
restoring or warm-starting weights (done on the plain module before ``wrap``).

The public methods check their preconditions once (set up? a module?) and call
the ``_``-prefixed methods a subclass overrides; with one replica the
collectives return at once without touching ``torch.distributed``.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import dataclasses
import datetime
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as distributed
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from torchestimator._io.atomic import writer_is_gone
from torchestimator._io.console import log_summary, show_summaries
from torchestimator.distribute import collectives
from torchestimator.distribute.cluster import (
    EVALUATOR,
    PS,
    PS_ADVICE,
    ClusterSpec,
    cluster_from_slurm,
    cluster_from_tf_config,
    cluster_from_torchrun,
    resolve_cluster,
)
from torchestimator.distribute.input_context import InputContext
from torchestimator.distribute.launcher import (
    STARTED_REPLICA_VARIABLE,
    LocalReplicas,
    is_started_replica,
    replica_stdout_path,
    start_local_replicas,
)
from torchestimator.errors import ChiefFailedError, ConfigError, ReplicaLostError

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")
"""torch.distributed backends a MirroredStrategy accepts."""

DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 300.0
"""How long a collective waits for the other replicas by default: 5 minutes, so a dead replica fails the
others in time for torchrun's elastic restart (torch's own default is 30 minutes). Also how long the
first process waits for the others to join at start-up."""

COLLECTIVE_TIMEOUT_VARIABLE = "TORCHESTIMATOR_COLLECTIVE_TIMEOUT"
"""Environment variable (seconds) that sets the collective timeout when the constructor does not."""


def collective_timeout_seconds(requested: float | None, environ: Mapping[str, str] | None = None) -> float:
    """The collective timeout: ``requested`` if given, else TORCHESTIMATOR_COLLECTIVE_TIMEOUT, else 300 s."""
    if requested is not None:
        return requested
    environ = os.environ if environ is None else environ
    text = environ.get(COLLECTIVE_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_COLLECTIVE_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"{COLLECTIVE_TIMEOUT_VARIABLE} must be a positive number of seconds; received {text!r}. "
            f"Unset it for the default ({DEFAULT_COLLECTIVE_TIMEOUT_SECONDS:g} s).",
            field=COLLECTIVE_TIMEOUT_VARIABLE,
            value=text,
        )
    return seconds


@dataclasses.dataclass(frozen=True, kw_only=True)
class Placement:
    """Where this replica runs, decided by ``setup()``."""

    device: torch.device
    """The device this replica computes on."""
    num_replicas: int = 1
    """Replicas training together (the world size)."""
    replica_id: int = 0
    """This replica's rank, in [0, num_replicas)."""
    local_replica_id: int = 0
    """This replica's index on its machine (its LOCAL_RANK)."""
    local_num_replicas: int = 1
    """Replicas on this machine."""


class Strategy(abc.ABC):
    """How the training loop places, wraps and synchronises its replicas.

    Call ``setup()`` first (it is idempotent); ``teardown()`` ends what setup created.
    Subclasses override ``_setup`` and ``_wrap``, and the collectives when they run
    more than one replica.
    """

    shards_parameters: bool = False
    """True when ``wrap`` replaces the parameters with shards (FSDP2): the Estimator then builds the optimizer
    after wrapping, over the sharded parameters."""

    def __init__(self) -> None:
        self._placement: Placement | None = None

    # ------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        """Join or create what this strategy needs (process group, device); a no-op when done."""
        if self._placement is not None:
            return
        placement = self._setup()
        self._placement = placement
        logger.info(
            "%r set up: replica %d of %d on %s.", self, placement.replica_id, placement.num_replicas, placement.device
        )

    def teardown(self) -> None:
        """Release what ``setup()`` created (a process group it started); a no-op when not set up."""
        if self._placement is None:
            return
        self._teardown()
        self._placement = None

    @property
    def is_set_up(self) -> bool:
        return self._placement is not None

    @property
    def placement(self) -> Placement:
        if self._placement is None:
            raise RuntimeError(
                f"{type(self).__name__} is not set up: call strategy.setup() before asking for its "
                "device, replicas or collectives."
            )
        return self._placement

    @property
    def device(self) -> torch.device:
        return self.placement.device

    @property
    def num_replicas(self) -> int:
        return self.placement.num_replicas

    @property
    def replica_id(self) -> int:
        return self.placement.replica_id

    @property
    def is_chief(self) -> bool:
        """Replica 0, the only one that writes files."""
        return self.placement.replica_id == 0

    def input_context(self) -> InputContext:
        """What an input_fn needs to read this replica's share of the data."""
        placement = self.placement
        return InputContext(
            num_replicas_in_sync=placement.num_replicas,
            input_pipeline_id=placement.replica_id,
            num_input_pipelines=placement.num_replicas,
        )

    # ------------------------------------------------------------ modules

    def wrap(self, module: nn.Module) -> nn.Module:
        """Move a plain module to the device and wrap it for this strategy's training.

        Restore and warm start belong before this call, on the plain module.
        """
        self.placement  # noqa: B018 -- raises the setup() advice
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(self).__name__}.wrap expects a torch.nn.Module; received {type(module).__name__}.")
        if isinstance(module, (DistributedDataParallel, DataParallel)):
            raise ValueError(
                f"{type(self).__name__}.wrap received a module already wrapped in {type(module).__name__}; "
                "pass the plain module (strategy.unwrap(module) gives it)."
            )
        return self._wrap(module)

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The plain module inside whatever ``wrap`` returned."""
        while isinstance(module, (DistributedDataParallel, DataParallel)):
            module = module.module
        return module

    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip the gradient all-reduce inside (for the non-final micro-batches of an accumulation)."""
        if isinstance(module, DistributedDataParallel):
            return module.no_sync()
        return contextlib.nullcontext()

    # ------------------------------------------------------------ collectives

    def reduce_mean(self, value: float | torch.Tensor) -> float:
        """The mean over replicas of a scalar (the loss to log); a collective every replica calls at the same step."""
        placement = self.placement
        if isinstance(value, torch.Tensor) and value.numel() != 1:
            raise ValueError(f"reduce_mean expects a scalar; received a tensor of shape {tuple(value.shape)}.")
        if placement.num_replicas == 1:
            return float(value)
        tensor = torch.as_tensor(value).detach().to(device=placement.device, dtype=torch.float64).reshape(())
        return float(self._all_reduce(tensor.clone(), distributed.ReduceOp.SUM)) / placement.num_replicas

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over replicas of ``tensor`` (evaluation's loss and example counts)."""
        if self.placement.num_replicas == 1:
            return tensor
        return self._all_reduce(tensor.clone(), distributed.ReduceOp.SUM)

    def all_agree(self, flags: bool | torch.Tensor | Sequence[bool | torch.Tensor]) -> Any:
        """For each flag, True on every replica if any replica says True, so that all stop or save together.

        Takes one flag (returns a bool) or a sequence (returns a list, one collective for all of them).
        A flag may be a 0-d tensor on the device (a NaN watch), so reading it costs no extra host sync.
        """
        values: list[bool | torch.Tensor]
        if isinstance(flags, Sequence):
            single, values = False, list(flags)
        else:
            single, values = True, [flags]
        if self.placement.num_replicas == 1:
            answers = [bool(value) for value in values]
        else:
            device = self.placement.device
            tensor = torch.stack(
                [torch.as_tensor(value).to(device=device, dtype=torch.int32).reshape(()) for value in values]
            )
            answers = [bool(value) for value in self._all_reduce(tensor, distributed.ReduceOp.MAX).tolist()]
        return answers[0] if single else answers

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every replica's ``obj``, in replica order (pickled in memory between our own processes)."""
        if self.placement.num_replicas == 1:
            return [obj]
        return self._all_gather_object(obj)

    def run_on_chief(
        self, action: Callable[[], _T], what: str, *, broadcast_object: Callable[[Any, int], Any] | None = None
    ) -> _T:
        """``action()`` run by the chief, its result returned on every replica: the one way work done once for
        all (a checkpoint, the best-checkpoint record, an export) reaches the others.

        A failure is raised on every replica, so that none waits on a collective the others left: the chief
        raises its own error, every other replica a ``ChiefFailedError`` naming ``what`` and the chief's error.
        ``broadcast_object``: the collective to answer with (a background save's own group); this strategy's
        by default. Every replica must call it at the same point, as any collective.
        """
        value: Any = None
        failure: Exception | None = None
        fault: str | None = None
        if self.is_chief:
            try:
                value = action()
            except Exception as error:  # told to the other replicas first, so that none waits for the chief
                failure, fault = error, f"{type(error).__name__}: {error}"
        value, fault = (broadcast_object or self.broadcast_object)((value, fault), 0)
        if failure is not None:
            raise failure
        if fault is not None:
            raise ChiefFailedError(f"{what} failed on the chief: {fault}", what=what, chief_error=fault)
        result: _T = value  # the chief's action() result, sent to every replica
        return result

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Replica ``src``'s ``obj`` on every replica (pickled in memory between our own processes)."""
        placement = self.placement
        if not 0 <= src < placement.num_replicas:
            raise ValueError(
                f"broadcast_object src must be a replica id in [0, {placement.num_replicas}); received {src}."
            )
        if placement.num_replicas == 1:
            return obj
        return self._broadcast_object(obj, src)

    def broadcast_buffers(self, module: nn.Module, src: int = 0) -> None:
        """Replica ``src``'s buffers (BatchNorm statistics) in every replica's ``module``, in place.

        DistributedDataParallel copies them from replica 0 at the start of each forward pass, so after the
        last step each replica holds its own; before a checkpoint is saved or the live module evaluated,
        every replica must hold what the checkpoint holds.
        """
        if self.placement.num_replicas == 1:
            return
        for buffer in module.buffers():
            self._broadcast_tensor(buffer, src)

    def barrier(self) -> None:
        """Wait until every replica gets here."""
        if self.placement.num_replicas > 1:
            self._barrier()

    # ------------------------------------------------------------ for subclasses

    @abc.abstractmethod
    def _setup(self) -> Placement:
        """Join or create what the strategy needs; say where this replica runs."""

    @abc.abstractmethod
    def _wrap(self, module: nn.Module) -> nn.Module:
        """The module as this strategy trains it (moved, or wrapped for gradient averaging)."""

    def _teardown(self) -> None:  # noqa: B027 (optional: most strategies create nothing to end)
        pass

    def _all_reduce(self, tensor: torch.Tensor, op: Any) -> torch.Tensor:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")

    def _broadcast_object(self, obj: Any, src: int) -> Any:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")

    def _barrier(self) -> None:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")

    def _all_gather_object(self, obj: Any) -> list[Any]:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")

    def _broadcast_tensor(self, tensor: torch.Tensor, src: int) -> None:
        raise RuntimeError(f"{type(self).__name__} runs one replica and has no collectives.")


def is_chief(strategy: Strategy | None) -> bool:
    """Whether this process writes for all replicas: no strategy, one not set up yet (it will be replica 0 of
    its own or learn otherwise at set-up, before any write), or its replica 0."""
    return strategy is None or not strategy.is_set_up or strategy.is_chief


def _refuse_one_of_several_tasks(environ: Mapping[str, str] | None = None) -> None:
    """A OneDeviceStrategy in one of several launched processes: an error under TF_CONFIG, a warning else.

    TF_CONFIG with chief + workers is how TF users ask for multi-worker training: under tf.estimator the
    tasks trained together (through parameter servers, or a strategy). Training each task alone would
    silently give N different models written into one model_dir, so it is an error. torchrun and srun
    also start programs that only read a model (predict, export) in every process: there, a warning.
    """
    environ = os.environ if environ is None else environ
    launched = cluster_from_torchrun(environ) or cluster_from_slurm(environ)
    if launched is not None:
        if launched.spans_several_processes:
            logger.warning(
                "%s says this program runs as %d processes (this is rank %d), but OneDeviceStrategy trains each "
                "alone and every process will write model_dir. Use MirroredStrategy.",
                "torchrun (WORLD_SIZE)" if launched.source == "torchrun" else "SLURM (SLURM_NTASKS)",
                launched.world_size,
                launched.rank,
            )
        return
    cluster = cluster_from_tf_config(environ)
    if cluster.task_type == PS:
        raise ConfigError(
            f"TF_CONFIG says this task is a 'ps' (parameter server). {PS_ADVICE}",
            field='TF_CONFIG["task"]["type"]',
            value=PS,
        )
    if cluster.in_training_group and cluster.spans_several_processes:
        raise ConfigError(
            f"TF_CONFIG describes {cluster.world_size} training tasks (chief + workers; this is "
            f"{cluster.task_type}:{cluster.task_index}), but this Estimator trains on one device "
            "(RunConfig.train_distribute is None or a OneDeviceStrategy): each task would train alone and all would "
            "write model_dir. Set RunConfig(train_distribute=te.MultiWorkerMirroredStrategy()) (or "
            'te.MirroredStrategy()) so the tasks train as one group, or remove "cluster" from TF_CONFIG to train '
            "this task alone.",
            field="TF_CONFIG",
            value=environ.get("TF_CONFIG"),
        )


def _check_device_exists(device: torch.device, where: str) -> None:
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ValueError(f"{where} asks for {device}, but CUDA is not available here. Use device='cpu' or None.")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{where} asks for {device}, but this machine has {torch.cuda.device_count()} CUDA device(s).")


class OneDeviceStrategy(Strategy):
    """One process on one device; ``wrap`` only moves the module there.

    ``setup()`` refuses to run as one task of a ``TF_CONFIG`` cluster with several training tasks
    (chief + workers), and warns when torchrun or srun started several processes: each would train
    alone and write model_dir. Use ``MirroredStrategy``; ``warn_if_launched=False`` (what predict
    uses, which runs whole in every process on purpose) skips the check.
    """

    def __init__(self, device: str | torch.device | None = None, *, warn_if_launched: bool = True) -> None:
        super().__init__()
        self._requested_device = None if device is None else torch.device(device)
        # Predict runs whole in each process of a distributed run on purpose; it passes False.
        self._warn_if_launched = warn_if_launched

    def __repr__(self) -> str:
        return f"OneDeviceStrategy(device={None if self._requested_device is None else str(self._requested_device)!r})"

    def _setup(self) -> Placement:
        device = self._requested_device
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        _check_device_exists(device, "OneDeviceStrategy")
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        if self._warn_if_launched:
            _refuse_one_of_several_tasks()
        return Placement(device=device)

    def _wrap(self, module: nn.Module) -> nn.Module:
        return module.to(self.placement.device)


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


# ------------------------------------------------------------ a plain script's own replicas

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
