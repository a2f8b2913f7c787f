"""Distribution: strategies, the InputContext given to input_fns, cluster descriptions, the launcher.

Names are imported on first use (``torchestimator._lazy``): FullyShardedStrategy
pulls in torch.distributed.fsdp and torch.distributed.tensor (about a second),
which a run with one device or DDP never needs.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.distribute.central_storage import CentralStorageStrategy as CentralStorageStrategy
    from torchestimator.distribute.cluster import (
        ClusterSpec as ClusterSpec,
        cluster_from_slurm as cluster_from_slurm,
        cluster_from_tf_config as cluster_from_tf_config,
        cluster_from_torchrun as cluster_from_torchrun,
        expand_hostlist as expand_hostlist,
        resolve_cluster as resolve_cluster,
    )
    from torchestimator.distribute.fsdp import (
        DEFAULT_LAYER_TYPES as DEFAULT_LAYER_TYPES,
        FullyShardedStrategy as FullyShardedStrategy,
    )
    from torchestimator.distribute.input_context import InputContext as InputContext
    from torchestimator.distribute.launcher import (
        find_free_port as find_free_port,
        launch as launch,
        launch_command as launch_command,
    )
    from torchestimator.distribute.mirrored import (
        MirroredStrategy as MirroredStrategy,
        MultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy,
    )
    from torchestimator.distribute.one_device import OneDeviceStrategy as OneDeviceStrategy
    from torchestimator.distribute.parameter_server import ParameterServerStrategy as ParameterServerStrategy
    from torchestimator.distribute.ps_placement import (
        FixedShardsPartitioner as FixedShardsPartitioner,
        MaxSizePartitioner as MaxSizePartitioner,
        MinSizePartitioner as MinSizePartitioner,
        PlacementPlan as PlacementPlan,
    )
    from torchestimator.distribute.sharded_embedding import (
        ShardedEmbedding as ShardedEmbedding,
        ShardedEmbeddingBag as ShardedEmbeddingBag,
    )
    from torchestimator.distribute.strategy import Placement as Placement, Strategy as Strategy
    from torchestimator.distribute.sync_batch_norm import CrossReplicaBatchNorm as CrossReplicaBatchNorm
    from torchestimator.errors import RelaunchError as RelaunchError

__all__, __getattr__, __dir__ = lazy_exports(__name__)
