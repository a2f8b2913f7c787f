"""Export to a versioned serving folder, the exporters, and the loader that runs an export alone.

    export_dir_base/<int(time.time())>/   program.json, tensors.safetensors, signature.json, metadata.json, assets.extra/

Public surface: declare serving inputs with ``serving_input_receiver`` and
``TensorSpec``, or take bytes as TF's clients send them with
``build_parsing_serving_input_receiver`` (serialized tf.Examples) and
``build_image_serving_input_receiver`` (encoded images; their decode steps run
outside the program, recorded as data: decoders.py); TF's call forms
``build_parsing_serving_input_receiver_fn`` and ``build_raw_serving_input_receiver_fn``
return the function TF's do; shape signatures with ``PredictOutput``,
``ClassificationOutput``, ``RegressionOutput`` in EstimatorSpec.export_outputs;
write with ``export_saved_model``; choose when with ``LatestExporter``,
``BestExporter``, ``FinalExporter``; read back with ``load``.

Every path may also be an object-store URL (s3://, gs://, az://): versions are
uploaded with their metadata.json (checksums of every file) last, and loaded
from a verified local copy (_store_versions.py).

Names are imported on first use (``torchestimator._lazy``), so reading an
export (``load``) does not import the Estimator's engine that writing one needs.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.export.exporters import (
        BestExporter as BestExporter,
        Exporter as Exporter,
        FinalExporter as FinalExporter,
        LatestExporter as LatestExporter,
        garbage_collect_exports as garbage_collect_exports,
        loss_smaller as loss_smaller,
        read_best_eval as read_best_eval,
    )
    from torchestimator.export.loader import (
        ExportedModel as ExportedModel,
        Signature as Signature,
        TensorInfo as TensorInfo,
        load as load,
        read_inputs as read_inputs,
    )
    from torchestimator.export.outputs import (
        DEFAULT_SERVING_SIGNATURE_DEF_KEY as DEFAULT_SERVING_SIGNATURE_DEF_KEY,
        ClassificationOutput as ClassificationOutput,
        ExportOutput as ExportOutput,
        PredictOutput as PredictOutput,
        RegressionOutput as RegressionOutput,
    )
    from torchestimator.export.receiver import (
        ServingInputReceiver as ServingInputReceiver,
        TensorSpec as TensorSpec,
        build_image_serving_input_receiver as build_image_serving_input_receiver,
        build_parsing_serving_input_receiver as build_parsing_serving_input_receiver,
        build_parsing_serving_input_receiver_fn as build_parsing_serving_input_receiver_fn,
        build_raw_serving_input_receiver_fn as build_raw_serving_input_receiver_fn,
        serving_input_receiver as serving_input_receiver,
    )
    from torchestimator.export.saved_model import export_saved_model as export_saved_model
    from torchestimator.export.versions import latest_version as latest_version, list_versions as list_versions

__all__, __getattr__, __dir__ = lazy_exports(__name__)
