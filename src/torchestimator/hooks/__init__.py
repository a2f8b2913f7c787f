"""Hooks: the base class, the run context, triggers and the built-in hooks.

Names are imported on first use (``torchestimator._lazy``), like the rest of the package.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.hooks.base import (
        CheckpointSaverListener as CheckpointSaverListener,
        Hook as Hook,
        HookList as HookList,
        RunContext as RunContext,
    )
    from torchestimator.hooks.basic import (
        CheckpointSaverHook as CheckpointSaverHook,
        LoggingTensorHook as LoggingTensorHook,
        PeriodicHook as PeriodicHook,
        StepCounterHook as StepCounterHook,
        StopAtStepHook as StopAtStepHook,
        SummarySaverHook as SummarySaverHook,
    )
    from torchestimator.hooks.triggers import Every as Every

__all__, __getattr__, __dir__ = lazy_exports(__name__)
