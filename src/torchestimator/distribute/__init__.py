"""Distribution: strategies, the InputContext given to input_fns, cluster descriptions, the launcher."""

from __future__ import annotations

from torchestimator.distribute.input_context import InputContext
from torchestimator.distribute.launcher import (
    ClusterSpec,
    RelaunchError,
    cluster_from_tf_config,
    cluster_from_torchrun,
    find_free_port,
    launch,
)
from torchestimator.distribute.strategy import MirroredStrategy, OneDeviceStrategy, Placement, Strategy

__all__ = [
    "ClusterSpec",
    "InputContext",
    "MirroredStrategy",
    "OneDeviceStrategy",
    "Placement",
    "RelaunchError",
    "Strategy",
    "cluster_from_tf_config",
    "cluster_from_torchrun",
    "find_free_port",
    "launch",
]
