"""``OneDeviceStrategy``: one process on one device, what the Estimator uses when no strategy is given.

Its one check beyond the device: a program launched as several processes (TF_CONFIG's chief + workers, torchrun,
srun) would have each train alone and all write model_dir, so ``setup()`` refuses (TF_CONFIG) or warns.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch
from torch import nn

from torchestimator.distribute.cluster import (
    PS,
    PS_ADVICE,
    cluster_from_slurm,
    cluster_from_tf_config,
    cluster_from_torchrun,
)
from torchestimator.distribute.strategy import Placement, Strategy, _check_device_exists
from torchestimator.errors import ConfigError

logger = logging.getLogger(__name__)


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
