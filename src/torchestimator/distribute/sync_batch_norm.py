"""BatchNorm across replicas (RunConfig(sync_batch_norm=True)).

(Placeholder while issue 12 builds it.)
"""

from __future__ import annotations

from typing import Any

from torch import nn


def prepare_batch_norm(module: nn.Module, strategy: Any, *, sync: bool) -> nn.Module:
    """The module to train: its BatchNorm layers synchronised across replicas when ``sync`` asks for it."""
    return module
