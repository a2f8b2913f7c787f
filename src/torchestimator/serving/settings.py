"""The server's settings and defaults, importable without the ``serving`` extra (no aiohttp, no prometheus-client).

What belongs here: ``ServerSettings`` (what ``torchestimator serve`` takes, checked when built) and the
plain defaults the server's modules share. Why a module of its own: ``torchestimator.serving`` lists
them, and a program that only builds settings, reads a config or checks a default must not need the
server's dependencies (server.py and app.py import aiohttp when they load). What does not: anything
that starts, answers or measures (server.py, app.py, metrics.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from torchestimator.errors import ConfigError

if TYPE_CHECKING:  # only an annotation here; batching.py loads torch
    from torchestimator.serving.batching import BatchingParameters

__all__ = ["DEFAULT_INLINE_FORWARD_MICROS", "DEFAULT_MAX_BODY_BYTES", "DEFAULT_METRICS_PATH", "ServerSettings"]

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request body the server reads (after inflating gzip/deflate); larger ones answer 413."""

DEFAULT_METRICS_PATH = "/monitoring/prometheus/metrics"
"""PrometheusExporter::kPrometheusPath, the path TF Serving serves metrics at by default."""

DEFAULT_INLINE_FORWARD_MICROS = 1000
"""Small requests whose forward (rows x the batch-of-one time measured at load) fits in this run on the event
loop, not a worker thread: below ~1 ms the thread hop costs more than the loop's wait (app.py's _fast_model)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """What ``torchestimator serve`` takes, under TF Serving's flag names where they exist."""

    model_name: str | None = None
    model_base_path: str | os.PathLike[str] | None = None
    model_config_file: str | os.PathLike[str] | None = None
    """TF's ModelServerConfig text format (model_config_list); instead of model_name + model_base_path."""
    model_config_file_poll_wait_seconds: float = 0.0
    """Re-read the model config file this often; 0: read it once (TF's default)."""
    file_system_poll_wait_seconds: float = 1.0
    """Look for new versions this often; 0 or less: only at start."""
    batching: BatchingParameters | None = None
    """TF's --enable_batching with its batching parameters; None: each request runs alone."""
    allow_version_labels_for_unavailable_models: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    num_threads: int | None = None
    """Threads parsing, running and encoding requests (TF's --rest_api_num_threads); None: one per CPU core."""
    timeout_seconds: float | None = 30.0
    """TF's --rest_api_timeout_in_ms, in seconds: a slower request answers 504."""
    metrics_path: str | None = DEFAULT_METRICS_PATH
    """Where Prometheus reads the metrics; None: not served."""
    enable_model_warmup: bool = True
    """Replay each version's assets.extra/tf_serving_warmup_requests before it serves (TF's default: on)."""
    inline_forward_micros: int = DEFAULT_INLINE_FORWARD_MICROS
    """Small requests to a model this fast (per request, from its forward time measured at load) run on the
    event loop; 0: every forward runs in a worker thread."""

    def __post_init__(self) -> None:
        has_flags = self.model_name is not None or self.model_base_path is not None
        if self.model_config_file is not None and has_flags:
            raise ConfigError(
                "Give either --model_config_file or --model_name with --model_base_path, not both "
                f"(received model_config_file={os.fspath(self.model_config_file)!r}, "
                f"model_name={self.model_name!r}, model_base_path={self.model_base_path!r}).",
                field="model_config_file",
                value=self.model_config_file,
            )
        if self.model_config_file is None and (self.model_name is None or self.model_base_path is None):
            raise ConfigError(
                "Name the model to serve: --model_name and --model_base_path (a folder of integer "
                "version folders, e.g. an export base), or --model_config_file for several models.",
                field="model_base_path" if self.model_name is not None else "model_name",
                value=None,
            )
