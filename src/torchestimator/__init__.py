"""torchestimator: the TensorFlow Estimator workflow on PyTorch.

The public API, re-exported; nothing else lives here. Every name is imported on
first use (``_lazy.py``), so ``import torchestimator`` costs little more than
``import torch`` and a command's ``--help`` does not wait for the engine.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator import (
        checkpoint as checkpoint,
        cli as cli,
        data as data,
        distribute as distribute,
        errors as errors,
        estimator as estimator,
        export as export,
        hooks as hooks,
        interop as interop,
        metrics as metrics,
        serving as serving,
        testing as testing,
        warm_start as warm_start,
    )
    from torchestimator._core.config import RunConfig as RunConfig
    from torchestimator._core.estimator import Estimator as Estimator
    from torchestimator._core.finetune import freeze as freeze, param_groups as param_groups, unfreeze as unfreeze
    from torchestimator._core.spec import EstimatorSpec as EstimatorSpec, ModeKeys as ModeKeys
    from torchestimator._policy.best import BestCheckpointPolicy as BestCheckpointPolicy
    from torchestimator._policy.early_stopping import (
        EarlyStopping as EarlyStopping,
        stop_if_higher_hook as stop_if_higher_hook,
        stop_if_lower_hook as stop_if_lower_hook,
        stop_if_no_decrease_hook as stop_if_no_decrease_hook,
        stop_if_no_increase_hook as stop_if_no_increase_hook,
    )
    from torchestimator._policy.evaluator import run_evaluator as run_evaluator
    from torchestimator._policy.specs import EvalSpec as EvalSpec, TrainSpec as TrainSpec
    from torchestimator._policy.train_and_evaluate import train_and_evaluate as train_and_evaluate
    from torchestimator._train_state import TrainState as TrainState
    from torchestimator.data.inputs import (
        dataset_input_fn as dataset_input_fn,
        numpy_input_fn as numpy_input_fn,
        pandas_input_fn as pandas_input_fn,
    )
    from torchestimator.distribute.fsdp import FullyShardedStrategy as FullyShardedStrategy
    from torchestimator.distribute.input_context import InputContext as InputContext
    from torchestimator.distribute.mirrored import (
        MirroredStrategy as MirroredStrategy,
        MultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy,
    )
    from torchestimator.distribute.one_device import OneDeviceStrategy as OneDeviceStrategy
    from torchestimator.distribute.parameter_server import ParameterServerStrategy as ParameterServerStrategy
    from torchestimator.errors import (
        NanLossDuringTrainingError as NanLossDuringTrainingError,
        TorchEstimatorError as TorchEstimatorError,
    )
    from torchestimator.hooks.base import (
        CheckpointSaverListener as CheckpointSaverListener,
        Hook as Hook,
        RunContext as RunContext,
    )
    from torchestimator.hooks.basic import (
        CheckpointSaverHook as CheckpointSaverHook,
        LoggingTensorHook as LoggingTensorHook,
        StepCounterHook as StepCounterHook,
        StopAtStepHook as StopAtStepHook,
        SummarySaverHook as SummarySaverHook,
    )
    from torchestimator.hooks.triggers import Every as Every
    from torchestimator.warm_start._assignment_map import init_from_checkpoint as init_from_checkpoint
    from torchestimator.warm_start._settings import WarmStartSettings as WarmStartSettings

__version__ = "0.1.0"

__all__, __getattr__, __dir__ = lazy_exports(__name__)
