"""Distribution: strategies, the InputContext given to input_fns, cluster descriptions, the launcher.

Names are imported on first use (``torchestimator._lazy``): FullyShardedStrategy
pulls in torch.distributed.fsdp and torch.distributed.tensor (about a second),
which a run with one device or DDP never needs.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
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
    from torchestimator.distribute.launcher import find_free_port, launch, launch_command
    from torchestimator.distribute.strategy import (
        MirroredStrategy,
        MultiWorkerMirroredStrategy,
        OneDeviceStrategy,
        Placement,
        Strategy,
    )
    from torchestimator.distribute.sync_batch_norm import CrossReplicaBatchNorm
    from torchestimator.errors import RelaunchError

__all__ = [
    "DEFAULT_LAYER_TYPES",
    "ClusterSpec",
    "CrossReplicaBatchNorm",
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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "torchestimator.distribute.cluster": [
            "ClusterSpec",
            "cluster_from_slurm",
            "cluster_from_tf_config",
            "cluster_from_torchrun",
            "expand_hostlist",
            "resolve_cluster",
        ],
        "torchestimator.distribute.fsdp": ["DEFAULT_LAYER_TYPES", "FullyShardedStrategy"],
        "torchestimator.distribute.input_context": ["InputContext"],
        "torchestimator.distribute.launcher": ["RelaunchError", "find_free_port", "launch", "launch_command"],
        "torchestimator.distribute.sync_batch_norm": ["CrossReplicaBatchNorm"],
        "torchestimator.distribute.strategy": [
            "MirroredStrategy",
            "MultiWorkerMirroredStrategy",
            "OneDeviceStrategy",
            "Placement",
            "Strategy",
        ],
    },
)
