"""A model server speaking TensorFlow Serving's REST API for exports of ``export_saved_model``.

    serve("digits", "export/digits", port=8501)            # blocking, like tensorflow_model_server
    server = start("digits", "export/digits", port=0)      # embedded in a background thread
    Client(server.url, "digits").predict([[0.0] * 64])     # a client for ours or TF Serving
    server.stop()

Modules: server.py (settings, polling, serve/start), app.py (paths, dispatch,
metrics page), manager.py (versions, policies, labels, load, warm-up, swap),
config.py (TF's text-format config files), batching.py (request batching),
json_tensor.py (predict JSON), examples_json.py (classify/regress JSON),
metrics.py (Prometheus), errors.py (ServingError and TF's status mapping),
openapi.py (the API's OpenAPI description), client.py.
"""

from torchestimator.serving.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_METRICS_PATH, make_app
from torchestimator.serving.batching import BatchingParameters, BatchScheduler
from torchestimator.serving.client import Client, ServingClientError
from torchestimator.serving.config import (
    ModelConfig,
    MonitoringConfig,
    VersionPolicy,
    parse_model_server_config,
    read_batching_parameters_file,
    read_model_config_file,
    read_monitoring_config_file,
)
from torchestimator.serving.errors import ServingError
from torchestimator.serving.manager import ModelManager, VersionStatus
from torchestimator.serving.metrics import ServingMetrics
from torchestimator.serving.openapi import openapi_document
from torchestimator.serving.server import RunningServer, ServerSettings, build_app, serve, start

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_METRICS_PATH",
    "BatchScheduler",
    "BatchingParameters",
    "Client",
    "ModelConfig",
    "ModelManager",
    "MonitoringConfig",
    "RunningServer",
    "ServerSettings",
    "ServingClientError",
    "ServingError",
    "ServingMetrics",
    "VersionPolicy",
    "VersionStatus",
    "build_app",
    "make_app",
    "openapi_document",
    "parse_model_server_config",
    "read_batching_parameters_file",
    "read_model_config_file",
    "read_monitoring_config_file",
    "serve",
    "start",
]
