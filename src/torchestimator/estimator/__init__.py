"""``tf.estimator``'s layout: ``import torchestimator as te; te.estimator.Estimator(...)``.

For code moving from TensorFlow: every name here is the object torchestimator documents elsewhere
(``te.estimator.RunConfig is te.RunConfig``, ``te.estimator.BestExporter is te.export.BestExporter``), so
``tf.estimator.X`` becomes ``te.estimator.X``. A name TF has that means something else here
(``SessionRunHook``, ``NanTensorHook``, the canned estimators) is an AttributeError saying what to use
instead. Both come from one table, torchestimator/_tf_names.py, which the docs' page "tf.estimator names"
(docs/tf-names.md) shows. Submodules: ``export`` (tf.estimator.export), ``experimental``
(the early-stopping rules).

Nothing is defined here: the names are imported on first use (``torchestimator._lazy``).
"""

from typing import TYPE_CHECKING, Any

from torchestimator._lazy import lazy_exports
from torchestimator._tf_names import refused_member

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator._core.config import RunConfig as RunConfig
    from torchestimator._core.estimator import Estimator as Estimator
    from torchestimator._core.spec import EstimatorSpec as EstimatorSpec, ModeKeys as ModeKeys
    from torchestimator._policy.specs import EvalSpec as EvalSpec, TrainSpec as TrainSpec
    from torchestimator._policy.train_and_evaluate import train_and_evaluate as train_and_evaluate
    from torchestimator.errors import NanLossDuringTrainingError as NanLossDuringTrainingError
    from torchestimator.estimator import experimental as experimental, export as export
    from torchestimator.export.exporters import (
        BestExporter as BestExporter,
        Exporter as Exporter,
        FinalExporter as FinalExporter,
        LatestExporter as LatestExporter,
    )
    from torchestimator.hooks.base import CheckpointSaverListener as CheckpointSaverListener
    from torchestimator.hooks.basic import (
        CheckpointSaverHook as CheckpointSaverHook,
        LoggingTensorHook as LoggingTensorHook,
        StepCounterHook as StepCounterHook,
        StopAtStepHook as StopAtStepHook,
        SummarySaverHook as SummarySaverHook,
    )
    from torchestimator.warm_start._settings import WarmStartSettings as WarmStartSettings

__all__, _declared, __dir__ = lazy_exports(__name__)


def __getattr__(name: str) -> Any:
    refusal = refused_member("tf.estimator", name)
    if refusal is not None:
        raise AttributeError(refusal)
    return _declared(name)
