"""A model server speaking TensorFlow Serving's REST API for exports of ``export_saved_model``.

    serve("digits", "export/digits", port=8501)            # blocking, like tensorflow_model_server
    server = start("digits", "export/digits", port=0)      # embedded in a background thread
    Client(server.url, "digits").predict([[0.0] * 64])     # a client for ours or TF Serving
    server.stop()
    serve("digits", "export/digits", grpc_port=8500)       # TF Serving's gRPC API too (serve --port 8500)

Modules: server.py (polling, serve/start), settings.py (ServerSettings and the defaults), app.py (paths, dispatch,
metrics page), manager.py (versions, policies, labels, load, warm-up, swap),
config.py (TF's text-format config files), batching.py (request batching),
json_tensor.py (predict JSON), examples_json.py (classify/regress JSON),
metrics.py (Prometheus), errors.py (ServingError and TF's status mapping),
openapi.py (the API's OpenAPI description), client.py; the gRPC API: request_core.py (what REST and gRPC
share), grpc_server.py, grpc_requests.py, protos.py (TF Serving's messages), tensor_proto.py (TensorProto <->
numpy), grpc_client.py (PredictionServiceStub, ModelServiceStub), warmup.py (the warm-up file's replay).

Names are imported on first use (``torchestimator._lazy``): the Client, the config readers,
ServerSettings and the defaults work without the ``serving`` extra; the server itself needs aiohttp
and prometheus-client (``pip install 'torchestimator[serving]'``). Without them its names are still
there (``from torchestimator.serving import *``, ``help()`` work) and calling one (``serve``,
``start``, ``make_app``, ``RunningServer``, ``ServingMetrics``) raises MissingExtraError, one line
naming the extra.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.errors import ServingClientError as ServingClientError, ServingError as ServingError
    from torchestimator.serving.app import make_app as make_app
    from torchestimator.serving.batching import (
        BatchingParameters as BatchingParameters,
        BatchScheduler as BatchScheduler,
    )
    from torchestimator.serving.client import Client as Client
    from torchestimator.serving.config import (
        ModelConfig as ModelConfig,
        MonitoringConfig as MonitoringConfig,
        VersionPolicy as VersionPolicy,
        parse_model_server_config as parse_model_server_config,
        read_batching_parameters_file as read_batching_parameters_file,
        read_model_config_file as read_model_config_file,
        read_monitoring_config_file as read_monitoring_config_file,
    )
    from torchestimator.serving.grpc_client import (
        ModelServiceStub as ModelServiceStub,
        PredictionServiceStub as PredictionServiceStub,
    )
    from torchestimator.serving.grpc_server import GrpcServer as GrpcServer
    from torchestimator.serving.manager import ModelManager as ModelManager, VersionStatus as VersionStatus
    from torchestimator.serving.metrics import ServingMetrics as ServingMetrics
    from torchestimator.serving.openapi import openapi_document as openapi_document
    from torchestimator.serving.protos import serving_protos as serving_protos
    from torchestimator.serving.server import (
        RunningServer as RunningServer,
        build_app as build_app,
        serve as serve,
        start as start,
    )
    from torchestimator.serving.settings import (
        DEFAULT_MAX_BODY_BYTES as DEFAULT_MAX_BODY_BYTES,
        DEFAULT_METRICS_PATH as DEFAULT_METRICS_PATH,
        ServerSettings as ServerSettings,
    )
    from torchestimator.serving.tensor_proto import (
        make_tensor_proto as make_tensor_proto,
        tensor_proto_to_numpy as tensor_proto_to_numpy,
    )

__all__, __getattr__, __dir__ = lazy_exports(__name__)
