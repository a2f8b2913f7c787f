"""torchestimator: the TensorFlow Estimator workflow on PyTorch.

The public API, re-exported; nothing else lives here.
"""

from torchestimator import metrics
from torchestimator.config import RunConfig
from torchestimator.data.inputs import dataset_input_fn, numpy_input_fn, pandas_input_fn
from torchestimator.distribute import InputContext, MirroredStrategy, OneDeviceStrategy
from torchestimator.estimator import Estimator
from torchestimator.finetune import freeze, param_groups, unfreeze
from torchestimator.hooks import (
    CheckpointSaverHook,
    CheckpointSaverListener,
    Every,
    Hook,
    LoggingTensorHook,
    RunContext,
    StepCounterHook,
    StopAtStepHook,
    SummarySaverHook,
)
from torchestimator.persistence import NanLossDuringTrainingError
from torchestimator.spec import EstimatorSpec, ModeKeys
from torchestimator.state import TrainState

__version__ = "0.1.0"

__all__ = [
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "Estimator",
    "EstimatorSpec",
    "Every",
    "Hook",
    "InputContext",
    "LoggingTensorHook",
    "MirroredStrategy",
    "ModeKeys",
    "NanLossDuringTrainingError",
    "OneDeviceStrategy",
    "RunConfig",
    "RunContext",
    "StepCounterHook",
    "StopAtStepHook",
    "SummarySaverHook",
    "TrainState",
    "dataset_input_fn",
    "freeze",
    "metrics",
    "numpy_input_fn",
    "pandas_input_fn",
    "param_groups",
    "unfreeze",
]
