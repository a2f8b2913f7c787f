"""Export to a versioned serving folder, the exporters, and the loader that runs an export alone.

    export_dir_base/<int(time.time())>/   program.json, tensors.safetensors, signature.json, metadata.json, assets.extra/

Public surface: declare serving inputs with ``serving_input_receiver`` and
``TensorSpec``; shape signatures with ``PredictOutput``,
``ClassificationOutput``, ``RegressionOutput`` in EstimatorSpec.export_outputs;
write with ``export_saved_model``; choose when with ``LatestExporter``,
``BestExporter``, ``FinalExporter``; read back with ``load``.
"""

from torchestimator.export.exporters import (
    BestExporter,
    Exporter,
    FinalExporter,
    LatestExporter,
    garbage_collect_exports,
    loss_smaller,
    read_best_eval,
)
from torchestimator.export.loader import ExportedModel, Signature, TensorInfo, load, read_inputs
from torchestimator.export.outputs import (
    DEFAULT_SERVING_SIGNATURE_DEF_KEY,
    ClassificationOutput,
    ExportOutput,
    PredictOutput,
    RegressionOutput,
)
from torchestimator.export.receiver import ServingInputReceiver, TensorSpec, serving_input_receiver
from torchestimator.export.saved_model import export_saved_model
from torchestimator.export.versions import latest_version, list_versions

__all__ = [
    "DEFAULT_SERVING_SIGNATURE_DEF_KEY",
    "BestExporter",
    "ClassificationOutput",
    "ExportOutput",
    "ExportedModel",
    "Exporter",
    "FinalExporter",
    "LatestExporter",
    "PredictOutput",
    "RegressionOutput",
    "ServingInputReceiver",
    "Signature",
    "TensorInfo",
    "TensorSpec",
    "export_saved_model",
    "garbage_collect_exports",
    "latest_version",
    "list_versions",
    "load",
    "loss_smaller",
    "read_best_eval",
    "read_inputs",
    "serving_input_receiver",
]
