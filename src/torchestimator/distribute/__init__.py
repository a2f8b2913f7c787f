"""Distribution: strategies, the InputContext given to input_fns, cluster descriptions, the launcher."""

from __future__ import annotations

from torchestimator.distribute.cluster import (
    ClusterSpec,
    cluster_from_slurm,
    cluster_from_tf_config,
    cluster_from_torchrun,
    expand_hostlist,
    resolve_cluster,
)
from torchestimator.distribute.fsdp import DEFAULT_LAYER_TYPES, FullyShardedStrategy
from torchestimator.distribute.input_context import InputContext
from torchestimator.distribute.launcher import RelaunchError, find_free_port, launch, launch_command
from torchestimator.distribute.sync_batch_norm import CrossReplicaBatchNorm
from torchestimator.distribute.strategy import (
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    OneDeviceStrategy,
    Placement,
    Strategy,
)

__all__ = [
    "ClusterSpec",
    "CrossReplicaBatchNorm",
    "DEFAULT_LAYER_TYPES",
    "FullyShardedStrategy",
    "InputContext",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "Placement",
    "RelaunchError",
    "Strategy",
    "cluster_from_slurm",
    "cluster_from_tf_config",
    "cluster_from_torchrun",
    "expand_hostlist",
    "find_free_port",
    "launch",
    "launch_command",
    "resolve_cluster",
]
