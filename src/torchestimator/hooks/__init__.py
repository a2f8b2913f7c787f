"""Hooks: the base class, the run context, triggers and the built-in hooks."""

from torchestimator.hooks.base import CheckpointSaverListener, Hook, HookList, RunContext
from torchestimator.hooks.basic import (
    PeriodicHook,
    CheckpointSaverHook,
    LoggingTensorHook,
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
