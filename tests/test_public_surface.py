"""The public surface, pinned: what `import torchestimator` shows, and each public subpackage's `__all__`.

A package's public names are declared once, in its `if TYPE_CHECKING:` block (torchestimator/_lazy.py derives
`__all__`, the lazy table and `dir()` from it); this file pins the result on purpose. A change here is an API
change: add the name on purpose, with its docs, or keep it private (a leading underscore).
"""

from __future__ import annotations

import importlib
import json
import pathlib
import re
import subprocess
import sys

import pytest

import torchestimator as te
from torchestimator._lazy import declared_exports

TOP_LEVEL = [
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
    "ParameterServerStrategy",
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
    "freeze",
    "init_from_checkpoint",
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
TOP_LEVEL_SUBPACKAGES = [
    "checkpoint",
    "cli",
    "data",
    "distribute",
    "errors",
    "estimator",
    "export",
    "hooks",
    "interop",
    "metrics",
    "serving",
    "testing",
    "warm_start",
]

PUBLIC_SUBPACKAGES = {
    "estimator": [  # tf.estimator's layout of the names documented elsewhere (torchestimator/_tf_names.py)
        "BestExporter",
        "CheckpointSaverHook",
        "CheckpointSaverListener",
        "Estimator",
        "EstimatorSpec",
        "EvalSpec",
        "Exporter",
        "FinalExporter",
        "LatestExporter",
        "LoggingTensorHook",
        "ModeKeys",
        "NanLossDuringTrainingError",
        "RunConfig",
        "StepCounterHook",
        "StopAtStepHook",
        "SummarySaverHook",
        "TrainSpec",
        "WarmStartSettings",
        "experimental",
        "export",
        "train_and_evaluate",
    ],
    "estimator.export": [
        "ClassificationOutput",
        "ExportOutput",
        "PredictOutput",
        "RegressionOutput",
        "ServingInputReceiver",
        "build_parsing_serving_input_receiver_fn",
        "build_raw_serving_input_receiver_fn",
    ],
    "estimator.experimental": [
        "stop_if_higher_hook",
        "stop_if_lower_hook",
        "stop_if_no_decrease_hook",
        "stop_if_no_increase_hook",
    ],
    "export": [
        "BestExporter",
        "ClassificationOutput",
        "DEFAULT_SERVING_SIGNATURE_DEF_KEY",
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
        "build_image_serving_input_receiver",
        "build_parsing_serving_input_receiver",
        "build_parsing_serving_input_receiver_fn",
        "build_raw_serving_input_receiver_fn",
        "export_saved_model",
        "garbage_collect_exports",
        "latest_version",
        "list_versions",
        "load",
        "loss_smaller",
        "read_best_eval",
        "read_inputs",
        "serving_input_receiver",
    ],
    "serving": [
        "BatchScheduler",
        "BatchingParameters",
        "Client",
        "DEFAULT_MAX_BODY_BYTES",
        "DEFAULT_METRICS_PATH",
        "GrpcServer",
        "ModelConfig",
        "ModelManager",
        "ModelServiceStub",
        "MonitoringConfig",
        "PredictionServiceStub",
        "RunningServer",
        "ServerSettings",
        "ServingClientError",
        "ServingError",
        "ServingMetrics",
        "VersionPolicy",
        "VersionStatus",
        "build_app",
        "make_app",
        "make_tensor_proto",
        "openapi_document",
        "parse_model_server_config",
        "read_batching_parameters_file",
        "read_model_config_file",
        "read_monitoring_config_file",
        "serve",
        "serving_protos",
        "start",
        "tensor_proto_to_numpy",
    ],
    "data": [
        "DamagedRegion",
        "DataLossError",
        "ExampleDecodeError",
        "ExampleParseError",
        "FixedLenFeature",
        "FixedLenSequenceFeature",
        "ImageDecodeError",
        "ImageDecoding",
        "RaggedFeature",
        "RaggedValue",
        "ReadStats",
        "ResumableIterable",
        "SparseValue",
        "TFRecordDataset",
        "TFRecordLoader",
        "TFRecordWriter",
        "VarLenFeature",
        "dataset_input_fn",
        "decode_example",
        "decode_image",
        "decode_jpeg",
        "decode_png",
        "decode_raw",
        "decode_sequence_example",
        "describe_batch_sizes",
        "encode_example",
        "encode_sequence_example",
        "example_kinds",
        "example_protos",
        "iter_record_blocks",
        "iter_records",
        "list_files",
        "masked_crc32c",
        "numpy_input_fn",
        "pandas_input_fn",
        "parse_example",
        "parse_single_example",
        "parse_single_sequence_example",
        "read_records",
        "resize_image",
        "to_torch",
        "unmask_crc32c",
    ],
    "interop": [
        "FORMATS",
        "KerasModel",
        "KerasModelError",
        "TensorInfo",
        "TensorNotFoundError",
        "WeightSource",
        "WeightSourceError",
        "keras_model",
        "open_weights",
    ],
    "hooks": [
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
    ],
    "distribute": [
        "CentralStorageStrategy",
        "ClusterSpec",
        "CrossReplicaBatchNorm",
        "DEFAULT_LAYER_TYPES",
        "FixedShardsPartitioner",
        "FullyShardedStrategy",
        "InputContext",
        "MaxSizePartitioner",
        "MinSizePartitioner",
        "MirroredStrategy",
        "MultiWorkerMirroredStrategy",
        "OneDeviceStrategy",
        "ParameterServerStrategy",
        "Placement",
        "PlacementPlan",
        "RelaunchError",
        "ShardedEmbedding",
        "ShardedEmbeddingBag",
        "Strategy",
        "cluster_from_slurm",
        "cluster_from_tf_config",
        "cluster_from_torchrun",
        "expand_hostlist",
        "find_free_port",
        "launch",
        "launch_command",
        "resolve_cluster",
    ],
    "warm_start": [
        "PlanEntry",
        "WarmStartPlan",
        "WarmStartSettings",
        "as_warm_start_settings",
        "init_from_checkpoint",
        "plan_init_from_checkpoint",
        "plan_warm_start",
        "warm_start",
    ],
    "checkpoint": [
        "Checkpoint",
        "CheckpointError",
        "CheckpointStore",
        "DiskFullError",
        "InMemoryStorage",
        "LocalStorage",
        "Storage",
        "flatten_state",
        "unflatten_state",
    ],
    "errors": [
        "BodyTooLarge",
        "CheckpointError",
        "ChiefFailedError",
        "ConfigError",
        "ConfigTypeError",
        "DataLossError",
        "DiskFullError",
        "ExampleDecodeError",
        "ExampleParseError",
        "ExportFormatError",
        "FileTooLargeError",
        "GrpcListenError",
        "HTTP_STATUS",
        "ImageDecodeError",
        "InputError",
        "InputTypeError",
        "KerasModelError",
        "MissingExtraError",
        "NanLossDuringTrainingError",
        "NotARegularFileError",
        "RelaunchError",
        "ReplicaFailedError",
        "ReplicaLostError",
        "ReplicasDisagreeError",
        "ServingClientError",
        "ServingError",
        "TaskLostError",
        "TensorNotFoundError",
        "TorchEstimatorError",
        "WeightSourceError",
    ],
}


def test_the_package_pins_its_names_and_its_public_subpackages():
    assert te.__all__ == sorted(TOP_LEVEL + TOP_LEVEL_SUBPACKAGES)
    assert [name for name in te.__all__ if not hasattr(te, name)] == []


@pytest.mark.parametrize("name", sorted(PUBLIC_SUBPACKAGES))
def test_a_public_subpackage_pins_its_names(name):
    module = importlib.import_module(f"torchestimator.{name}")
    assert sorted(module.__all__) == PUBLIC_SUBPACKAGES[name]
    assert [item for item in module.__all__ if not hasattr(module, item)] == []


def test_dir_of_the_package_shows_the_api_and_the_public_subpackages_only():
    import torchestimator.serving  # noqa: F401  (imported subpackages become attributes; still public)

    for name in te.__all__:  # import the whole engine: what it loads must not show either
        getattr(te, name)
    shown = {name for name in dir(te) if not name.startswith("_")}
    subpackages = {name.partition(".")[0] for name in PUBLIC_SUBPACKAGES}  # estimator.export: under estimator
    allowed = set(te.__all__) | subpackages | {"metrics", "testing", "cli"}
    assert shown - allowed == set(), "an internal module shows in dir(torchestimator): give it a leading underscore"
    # dir() lists the names (lazy, torchestimator/_lazy.py), not whatever modules happen to be imported.
    assert set(te.__all__) | subpackages <= set(dir(te))
    assert not {"_core", "_io", "_policy", "_lazy"} & set(dir(te))


def test_the_top_level_names_are_the_objects_of_their_subpackages():
    from torchestimator import warm_start

    assert te.WarmStartSettings is warm_start.WarmStartSettings
    assert te.init_from_checkpoint is warm_start.init_from_checkpoint
    assert te.TorchEstimatorError is te.errors.TorchEstimatorError
    assert te.Estimator.__module__ == "torchestimator._core.estimator"


SUBMODULE_ATTRIBUTES = """
import json, torchestimator as te
found = {path: getattr(eval(path, {"te": te}), "__name__", None)
         for path in ["te.data.tfrecord", "te.export.saved_model", "te.serving.client", "te.checkpoint.store",
                      "te.distribute.launcher", "te.export.program_format"]}
typos = {}
for package, name in [(te, "Estimatr"), (te.data, "tfrecrd"), (te, "__wrapped__")]:
    try:
        getattr(package, name)
    except AttributeError as error:
        typos[name] = str(error)
print(json.dumps({"found": found, "typos": typos, "listed": "tfrecord" in dir(te.data)}))
"""


def test_every_submodule_is_an_attribute_as_with_the_eager_package_and_typos_stay_attribute_errors():
    """`te.data.tfrecord` worked when the eager __init__ had imported it; the lazy package imports it when read.

    A fresh interpreter: in this one, other tests imported the submodules already (which sets the attributes).
    """
    done = subprocess.run([sys.executable, "-c", SUBMODULE_ATTRIBUTES], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["found"] == {
        "te.data.tfrecord": "torchestimator.data.tfrecord",
        "te.export.saved_model": "torchestimator.export.saved_model",
        "te.serving.client": "torchestimator.serving.client",
        "te.checkpoint.store": "torchestimator.checkpoint.store",
        "te.distribute.launcher": "torchestimator.distribute.launcher",
        "te.export.program_format": "torchestimator.export.program_format",
    }
    assert report["typos"] == {
        "Estimatr": "module 'torchestimator' has no attribute 'Estimatr'",
        "tfrecrd": "module 'torchestimator.data' has no attribute 'tfrecrd'",
        "__wrapped__": "module 'torchestimator' has no attribute '__wrapped__'",
    }
    assert report["listed"] is False  # dir() lists the public names (and the public subpackages) only


def test_the_type_checking_block_is_read_as_the_table_of_public_names(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg import sub as sub\n"
        "    from pkg._impl import Thing as Thing, helper as public_helper\n"
    )
    declared = declared_exports("pkg", str(init))
    assert declared.origins == {"Thing": ("pkg._impl", "Thing"), "public_helper": ("pkg._impl", "helper")}
    assert declared.submodules == ["sub"]


@pytest.mark.parametrize(
    ("block", "complaint"),
    [
        ("    import pkg._impl\n", "holds only absolute `from MODULE import NAME as NAME` lines"),
        ("    from ._impl import Thing as Thing\n", "holds only absolute"),
        ("    Thing = int\n", "holds only absolute"),
        ("    from pkg.a import Thing as Thing\n    from pkg.b import Thing as Thing\n", "'Thing' is declared twice"),
    ],
)
def test_a_line_the_table_reader_would_skip_is_refused_with_its_file_and_line(tmp_path, block, complaint):
    """A line the reader skipped would be a name type checkers see and the running package lacks."""
    init = tmp_path / "__init__.py"
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n" + block)
    with pytest.raises(AssertionError, match=re.escape(complaint)) as refused:
        declared_exports("pkg", str(init))
    assert f"{init}:" in str(refused.value)


def test_a_package_without_its_table_of_names_is_refused(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("X = 1\n")
    with pytest.raises(AssertionError, match="expected one `if TYPE_CHECKING:` block"):
        declared_exports("pkg", str(init))


def test_the_package_is_typed_for_users_type_checkers():
    """PEP 561: without py.typed, mypy and pyright treat every torchestimator name as Any."""
    package_folder = pathlib.Path(te.__file__).parent
    assert (package_folder / "py.typed").is_file()
