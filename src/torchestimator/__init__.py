"""torchestimator: the TensorFlow Estimator workflow on PyTorch.

The public API, re-exported; nothing else lives here.
"""

from torchestimator import errors, export, metrics
from torchestimator._core.config import RunConfig
from torchestimator.data.inputs import dataset_input_fn, numpy_input_fn, pandas_input_fn
from torchestimator.distribute import (FullyShardedStrategy, InputContext, MirroredStrategy, MultiWorkerMirroredStrategy,
                                       OneDeviceStrategy)
from torchestimator._core.estimator import Estimator
from torchestimator._policy.best import BestCheckpointPolicy
from torchestimator._policy.early_stopping import (
    EarlyStopping,
    stop_if_higher_hook,
    stop_if_lower_hook,
    stop_if_no_decrease_hook,
    stop_if_no_increase_hook,
)
from torchestimator._core.finetune import freeze, param_groups, unfreeze
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
from torchestimator.errors import NanLossDuringTrainingError, TorchEstimatorError
from torchestimator._core.spec import EstimatorSpec, ModeKeys
from torchestimator._core.state import TrainState
from torchestimator._policy.train_and_evaluate import EvalSpec, TrainSpec, run_evaluator, train_and_evaluate
from torchestimator.warm_start import WarmStartSettings, init_from_checkpoint

__version__ = "0.1.0"

__all__ = [
    "BestCheckpointPolicy",
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "EarlyStopping",
    "Estimator",
    "EstimatorSpec",
    "EvalSpec",
    "Every",
    "FullyShardedStrategy",
    "Hook",
    "InputContext",
    "LoggingTensorHook",
    "MirroredStrategy",
    "ModeKeys",
    "MultiWorkerMirroredStrategy",
    "NanLossDuringTrainingError",
    "OneDeviceStrategy",
    "RunConfig",
    "RunContext",
    "StepCounterHook",
    "StopAtStepHook",
    "SummarySaverHook",
    "TorchEstimatorError",
    "TrainSpec",
    "TrainState",
    "WarmStartSettings",
    "dataset_input_fn",
    "errors",
    "export",
    "freeze",
    "init_from_checkpoint",
    "metrics",
    "numpy_input_fn",
    "pandas_input_fn",
    "param_groups",
    "run_evaluator",
    "stop_if_higher_hook",
    "stop_if_lower_hook",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
    "train_and_evaluate",
    "unfreeze",
]
