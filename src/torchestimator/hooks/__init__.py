"""Hooks: the base class, the run context, triggers and the built-in hooks.

Names are imported on first use (``torchestimator._lazy``), like the rest of the package.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.hooks.base import CheckpointSaverListener, Hook, HookList, RunContext
    from torchestimator.hooks.basic import (
        CheckpointSaverHook,
        LoggingTensorHook,
        PeriodicHook,
        StepCounterHook,
        StopAtStepHook,
        SummarySaverHook,
    )
    from torchestimator.hooks.triggers import Every

__all__ = [
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "Every",
    "Hook",
    "HookList",
    "LoggingTensorHook",
    "PeriodicHook",
    "RunContext",
    "StepCounterHook",
    "StopAtStepHook",
    "SummarySaverHook",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "torchestimator.hooks.base": ["CheckpointSaverListener", "Hook", "HookList", "RunContext"],
        "torchestimator.hooks.basic": [
            "CheckpointSaverHook",
            "LoggingTensorHook",
            "PeriodicHook",
            "StepCounterHook",
            "StopAtStepHook",
            "SummarySaverHook",
        ],
        "torchestimator.hooks.triggers": ["Every"],
    },
)
