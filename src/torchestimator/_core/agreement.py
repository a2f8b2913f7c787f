"""The start-up agreement: every replica of a run starts from the same checkpoint of the same model_dir.

(Placeholder while issue 12 builds it: one replica passes at once.)
"""

from __future__ import annotations

from typing import Any


def check_start_agreement(strategy: Any, model_dir: str, checkpoint: Any) -> None:
    """Fails fast, naming the replicas that disagree, when the replicas would start from different states."""
    if strategy.num_replicas == 1:
        return
