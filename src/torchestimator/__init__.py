"""torchestimator: the TensorFlow Estimator workflow on PyTorch.

The public API, re-exported; nothing else lives here. Every name is imported on
first use (``_lazy.py``), so ``import torchestimator`` costs little more than
``import torch`` and a command's ``--help`` does not wait for the engine.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator import checkpoint as checkpoint
    from torchestimator import cli as cli
    from torchestimator import data as data
    from torchestimator import distribute as distribute
    from torchestimator import errors as errors
    from torchestimator import export as export
    from torchestimator import hooks as hooks
    from torchestimator import interop as interop
    from torchestimator import metrics as metrics
    from torchestimator import serving as serving
    from torchestimator import testing as testing
    from torchestimator import warm_start as warm_start
    from torchestimator._core.config import RunConfig
    from torchestimator._core.estimator import Estimator
    from torchestimator._core.finetune import freeze, param_groups, unfreeze
    from torchestimator._core.spec import EstimatorSpec, ModeKeys
    from torchestimator._policy.best import BestCheckpointPolicy
    from torchestimator._policy.early_stopping import (
        EarlyStopping,
        stop_if_higher_hook,
        stop_if_lower_hook,
        stop_if_no_decrease_hook,
        stop_if_no_increase_hook,
    )
    from torchestimator._policy.evaluator import run_evaluator
    from torchestimator._policy.specs import EvalSpec, TrainSpec
    from torchestimator._policy.train_and_evaluate import train_and_evaluate
    from torchestimator._train_state import TrainState
    from torchestimator.data.inputs import dataset_input_fn, numpy_input_fn, pandas_input_fn
    from torchestimator.distribute.fsdp import FullyShardedStrategy
    from torchestimator.distribute.input_context import InputContext
    from torchestimator.distribute.strategy import MirroredStrategy, MultiWorkerMirroredStrategy, OneDeviceStrategy
    from torchestimator.errors import NanLossDuringTrainingError, TorchEstimatorError
    from torchestimator.hooks.base import CheckpointSaverListener, Hook, RunContext
    from torchestimator.hooks.basic import (
        CheckpointSaverHook,
        LoggingTensorHook,
        StepCounterHook,
        StopAtStepHook,
        SummarySaverHook,
    )
    from torchestimator.hooks.triggers import Every
    from torchestimator.warm_start._assignment_map import init_from_checkpoint
    from torchestimator.warm_start._settings import WarmStartSettings

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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "torchestimator._core.config": ["RunConfig"],
        "torchestimator._core.estimator": ["Estimator"],
        "torchestimator._core.finetune": ["freeze", "param_groups", "unfreeze"],
        "torchestimator._core.spec": ["EstimatorSpec", "ModeKeys"],
        "torchestimator._train_state": ["TrainState"],
        "torchestimator._policy.best": ["BestCheckpointPolicy"],
        "torchestimator._policy.early_stopping": [
            "EarlyStopping",
            "stop_if_higher_hook",
            "stop_if_lower_hook",
            "stop_if_no_decrease_hook",
            "stop_if_no_increase_hook",
        ],
        "torchestimator._policy.train_and_evaluate": ["EvalSpec", "TrainSpec", "run_evaluator", "train_and_evaluate"],
        "torchestimator.data.inputs": ["dataset_input_fn", "numpy_input_fn", "pandas_input_fn"],
        "torchestimator.distribute": [
            "FullyShardedStrategy",
            "InputContext",
            "MirroredStrategy",
            "MultiWorkerMirroredStrategy",
            "OneDeviceStrategy",
        ],
        "torchestimator.errors": ["NanLossDuringTrainingError", "TorchEstimatorError"],
        "torchestimator.hooks": [
            "CheckpointSaverHook",
            "CheckpointSaverListener",
            "Every",
            "Hook",
            "LoggingTensorHook",
            "RunContext",
            "StepCounterHook",
            "StopAtStepHook",
            "SummarySaverHook",
        ],
        "torchestimator.warm_start": ["WarmStartSettings", "init_from_checkpoint"],
    },
    # The public subpackages (DESIGN.md), reachable as te.<name> without importing them first.
    submodules=[
        "checkpoint",
        "cli",
        "data",
        "distribute",
        "errors",
        "export",
        "hooks",
        "interop",
        "metrics",
        "serving",
        "testing",
        "warm_start",
    ],
)
