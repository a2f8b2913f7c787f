"""Distribution: strategies, the InputContext given to input_fns, cluster descriptions, the launcher.

Names are imported on first use (``torchestimator._lazy``): FullyShardedStrategy
pulls in torch.distributed.fsdp and torch.distributed.tensor (about a second),
which a run with one device or DDP never needs.
"""

from torchestimator._lazy import lazy_exports

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
