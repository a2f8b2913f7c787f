"""torchestimator: the TensorFlow Estimator workflow on PyTorch.

The public API, re-exported; nothing else lives here. Every name is imported on
first use (``_lazy.py``), so ``import torchestimator`` costs little more than
``import torch`` and a command's ``--help`` does not wait for the engine.
"""

from torchestimator._lazy import lazy_exports

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
        "torchestimator._core.state": ["TrainState"],
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
