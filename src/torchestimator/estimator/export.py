"""``tf.estimator.export``'s layout: ``te.estimator.export.ServingInputReceiver``, the receiver_fn builders.

The same objects as ``torchestimator.export``'s (the table: torchestimator/_tf_names.py);
``TensorServingInputReceiver`` is an AttributeError saying what to use instead.
"""

from typing import TYPE_CHECKING, Any

from torchestimator._lazy import lazy_exports
from torchestimator._tf_names import refused_member

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.export.outputs import (
        ClassificationOutput as ClassificationOutput,
        ExportOutput as ExportOutput,
        PredictOutput as PredictOutput,
        RegressionOutput as RegressionOutput,
    )
    from torchestimator.export.receiver import (
        ServingInputReceiver as ServingInputReceiver,
        build_parsing_serving_input_receiver_fn as build_parsing_serving_input_receiver_fn,
        build_raw_serving_input_receiver_fn as build_raw_serving_input_receiver_fn,
    )

__all__, _declared, __dir__ = lazy_exports(__name__)


def __getattr__(name: str) -> Any:
    refusal = refused_member("tf.estimator.export", name)
    if refusal is not None:
        raise AttributeError(refusal)
    return _declared(name)
