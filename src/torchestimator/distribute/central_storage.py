"""``CentralStorageStrategy``: TensorFlow's one-machine strategy, as synchronous data parallel over this machine's
devices (``MirroredStrategy``).

Belongs here: taking TensorFlow's arguments (``compute_devices``, ``parameter_device``, TF's device names), the
mapping onto ``MirroredStrategy``, and the refusals that keep it to one machine. Does not belong here: joining
groups, devices and DDP (``mirrored.py``), reading clusters (``cluster.py``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as distributed

from torchestimator.distribute.cluster import PS, resolve_cluster
from torchestimator.distribute.mirrored import MirroredStrategy
from torchestimator.distribute.strategy import Placement
from torchestimator.errors import ConfigError

__all__ = ["CentralStorageStrategy"]

logger = logging.getLogger(__name__)

_TF_DEVICE = re.compile(
    r"(?:/job:[^/]+)?(?:/replica:\d+)?(?:/task:\d+)?(?:/device:|/)?(?P<type>cpu|gpu)(?::(?P<index>\d+))?",
    re.IGNORECASE,
)
"""TensorFlow's device names: ``CPU:0``, ``GPU:1``, ``/gpu:0``, ``/device:GPU:0``, ``/job:localhost/replica:0/task:0/
device:CPU:0``."""


class CentralStorageStrategy(MirroredStrategy):
    """TensorFlow's ``tf.distribute.experimental.CentralStorageStrategy``: one machine, synchronous, as
    ``MirroredStrategy`` over this machine's devices.

    TensorFlow kept the variables on one device (the CPU, or the only GPU), ran the model on each local GPU and
    applied the gradients, aggregated over the replicas, to that one copy at every step. Here every compute device
    runs one replica holding its own copy of the parameters, gradients are averaged by DistributedDataParallel, and
    each replica applies the same update: the parameters stay identical on every device, so the training is the
    same as with one central copy (TensorFlow summed the replicas' gradients of a loss scaled by the global batch;
    the mean of the replicas' mean-loss gradients is the same when their batches are the same size). What differs
    is memory: each compute device holds the parameters and the optimizer's state, as under ``MirroredStrategy``.

    The mapping:

    * ``compute_devices`` -> ``MirroredStrategy(devices=...)``, one replica (process) per device, TF's names
      (``"GPU:0"``, ``"/gpu:1"``, ``"/device:CPU:0"``) or torch's (``"cuda:0"``, ``0``). None: every local GPU,
      else one replica on the CPU (TF's one device without a GPU); ``num_replicas=N`` asks for N CPU processes.
      All CPU or all GPUs: a group has one backend (gloo or nccl), so TF's mixed ``["CPU:0", "GPU:0"]`` is
      refused, and so is a GPU named twice.
    * ``parameter_device``: None or the CPU (TF's default with several GPUs) is accepted and changes nothing:
      there is no central copy to place. A GPU is accepted only when it is the one compute device (TF's default
      with one GPU: the parameters are on it in both). Any other GPU is refused: it asks that the parameters live
      on that GPU alone, which would not hold here (each compute device keeps a copy), so code sized for it
      should say so rather than find out at the first out-of-memory error.
    * One machine only, as in TensorFlow: ``setup()`` refuses a ``TF_CONFIG`` naming several training tasks or
      ``ps`` tasks (use ``MultiWorkerMirroredStrategy``, or ``ParameterServerStrategy`` for ``ps`` tasks), and a
      torchrun or srun launch spanning several machines. The TF_CONFIG evaluator task runs one local replica.

    Args:
        compute_devices: the devices that run the replicas, or None (see above).
        parameter_device: where TensorFlow kept the variables: None, the CPU, or the single compute GPU.
        num_replicas: replicas to run when ``compute_devices`` is None (N CPU processes on a machine without
            CUDA); see ``MirroredStrategy``.
        find_unused_parameters: passed to DistributedDataParallel.
        timeout_seconds: the collective timeout; see ``MirroredStrategy``.
    """

    def __init__(
        self,
        compute_devices: Sequence[str | int | torch.device] | None = None,
        parameter_device: str | torch.device | None = None,
        *,
        num_replicas: int | None = None,
        find_unused_parameters: bool = False,
        timeout_seconds: float | None = None,
    ) -> None:
        if isinstance(compute_devices, (str, torch.device)):
            raise TypeError(
                f"CentralStorageStrategy compute_devices must be a list of devices; received {compute_devices!r}. "
                f"Write [{compute_devices!r}]."
            )
        devices = (
            None
            if compute_devices is None
            else tuple(_torch_device(device, "compute_devices") for device in compute_devices)
        )
        if devices is not None:
            _check_compute_devices(devices, list(compute_devices or ()))
        parameters = None if parameter_device is None else _torch_device(parameter_device, "parameter_device")
        if parameters is not None and parameters.type != "cpu" and devices != (parameters,):
            raise ValueError(
                f"CentralStorageStrategy parameter_device={parameter_device!r}: here every compute device keeps its "
                "own copy of the parameters (DistributedDataParallel, the same updates on each), so no device holds "
                f"them for the others and {parameters} would not be where they live. Leave parameter_device None "
                f"(or 'CPU:0'), or compute on that GPU alone: compute_devices=[{parameter_device!r}]."
            )
        super().__init__(
            num_replicas=num_replicas,
            devices=devices,
            find_unused_parameters=find_unused_parameters,
            timeout_seconds=timeout_seconds,
        )
        self._parameter_device = parameters

    def __repr__(self) -> str:
        devices = None if self._devices is None else [str(device) for device in self._devices]
        parameters = None if self._parameter_device is None else str(self._parameter_device)
        return f"CentralStorageStrategy(compute_devices={devices}, parameter_device={parameters!r})"

    @property
    def compute_devices(self) -> tuple[torch.device, ...] | None:
        """The compute devices as torch names (``GPU:1`` -> ``cuda:1``); None: every local GPU, else the CPU."""
        return self._devices

    @property
    def parameter_device(self) -> torch.device | None:
        """The ``parameter_device`` given, as a torch device; accepted for TF's code, it places nothing."""
        return self._parameter_device

    def _setup(self) -> Placement:
        if not distributed.is_initialized():
            _refuse_several_machines(os.environ)
        placement = super()._setup()
        if self._parameter_device is not None:
            logger.info(
                "%r: the parameters live on each compute device (%d replica(s)), not only on %s: the updates are "
                "the same on every replica, so the training is the same as with one central copy.",
                self,
                placement.num_replicas,
                self._parameter_device,
            )
        return placement


def _torch_device(device: str | int | torch.device, argument: str) -> torch.device:
    """A TF or torch device name as a torch.device (``GPU:1`` -> ``cuda:1``, ``/cpu:0`` -> ``cpu``)."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    if not isinstance(device, str):
        raise TypeError(
            f"CentralStorageStrategy {argument} takes device names ('GPU:0', 'cuda:0', 'CPU:0'), CUDA indices or "
            f"torch.device; received {device!r}."
        )
    named = _TF_DEVICE.fullmatch(device.strip())
    if named is not None:
        if named["type"].lower() == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", int(named["index"] or 0))
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"CentralStorageStrategy {argument}: {device!r} is not a device name TensorFlow or torch knows "
            "('GPU:0', '/device:CPU:0', 'cuda:1', 'cpu')."
        ) from error


def _check_compute_devices(devices: tuple[torch.device, ...], given: Sequence[object]) -> None:
    if not devices:
        raise ValueError("CentralStorageStrategy compute_devices must name at least one device, or be None.")
    kinds = sorted({device.type for device in devices})
    if len(kinds) > 1:
        raise ValueError(
            f"CentralStorageStrategy compute_devices={list(given)!r} mixes {' and '.join(kinds)} devices; here each "
            "compute device is a process of one group with one backend (gloo on the CPU, nccl on GPUs), so they "
            "must be all CPU or all GPUs. Drop the CPU: with GPUs it only ran the variable updates in TensorFlow."
        )
    named = [device for device in devices if device.type != "cpu"]
    twice = sorted({str(device) for device in named if named.count(device) > 1})
    if twice:
        raise ValueError(
            f"CentralStorageStrategy compute_devices={list(given)!r} names {', '.join(twice)} more than once; each "
            "replica needs a device of its own."
        )


def _refuse_several_machines(environ: Mapping[str, str]) -> None:
    """ConfigError when the environment describes training on several machines (or with ps tasks)."""
    cluster = resolve_cluster(environ)
    alternatives = (
        "Use te.distribute.MultiWorkerMirroredStrategy to train the tasks as one synchronous group (every task "
        "holds the model), or te.distribute.ParameterServerStrategy for a cluster with ps tasks; "
        "or train on this machine alone"
    )
    if cluster.source == "tf_config" and (
        cluster.task_type == PS or cluster.num_ps_replicas or (cluster.world_size or 1) > 1
    ):
        tasks = f"{cluster.num_worker_replicas} training task(s)"
        if cluster.num_ps_replicas:
            tasks += f" and {cluster.num_ps_replicas} ps task(s)"
        raise ConfigError(
            f"CentralStorageStrategy trains on one machine (as TensorFlow's did), but TF_CONFIG describes a cluster "
            f"of {tasks} (this is {cluster.task_type}:{cluster.task_index}). {alternatives}: remove "
            '"cluster" from TF_CONFIG.',
            field="TF_CONFIG",
            value=environ.get("TF_CONFIG"),
        )
    if cluster.source in ("torchrun", "slurm") and (cluster.world_size or 1) > cluster.local_world_size:
        launch = "torchrun (WORLD_SIZE" if cluster.source == "torchrun" else "srun (SLURM_NTASKS"
        raise ConfigError(
            f"CentralStorageStrategy trains on one machine (as TensorFlow's did), but {launch}={cluster.world_size}, "
            f"{cluster.local_world_size} on this machine) started processes on several machines. {alternatives}: "
            "launch one node (torchestimator launch --nproc_per_node N).",
            field="WORLD_SIZE" if cluster.source == "torchrun" else "SLURM_NTASKS",
            value=cluster.world_size,
        )
