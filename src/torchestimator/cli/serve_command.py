"""`torchestimator serve`: TensorFlow Serving's REST and gRPC APIs for exported models, with TF Serving's flags."""

from __future__ import annotations

import argparse
import errno
from typing import Any

from torchestimator.serving.settings import DEFAULT_INLINE_FORWARD_MICROS


def add_command(commands: Any) -> None:
    serve = commands.add_parser("serve", help="TensorFlow Serving REST (and gRPC) API for exported models")
    serve.add_argument("--model_name", help="the name clients use in /v1/models/<name> (or --model_config_file)")
    serve.add_argument(
        "--model_base_path",
        help="folder of integer version folders (an export base), or its "
        "URL in an object store (s3://bucket/models/m, gs://...): each version is copied to the local "
        "cache ($TORCHESTIMATOR_CACHE) and checked against its metadata.json before it loads. A local path "
        "that does not exist, or a model_dir instead of its export/<name> folder, is an error at start; an "
        "existing folder without versions is waited for",
    )
    serve.add_argument(
        "--model_config_file",
        help="TF Serving's model_config_list text file: several models, "
        "version policies (latest/all/specific) and version labels",
    )
    serve.add_argument(
        "--model_config_file_poll_wait_seconds",
        type=float,
        default=0.0,
        help="re-read --model_config_file this often (0: once)",
    )
    serve.add_argument(
        "--rest_api_port",
        type=int,
        default=8501,
        help="port of the REST API, 0-65535 (default 8501, TF Serving's; 0: any free port, announced when listening)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=0,
        help="TF Serving's gRPC API (PredictionService, ModelService) on this port, e.g. 8500, on "
        "--rest_api_host; 0 (the default here; TF's is 8500): no gRPC API",
    )
    serve.add_argument(
        "--rest_api_host",
        default="127.0.0.1",
        help="default 127.0.0.1: unlike TF Serving, not every interface unless asked (gRPC too)",
    )
    serve.add_argument(
        "--file_system_poll_wait_seconds",
        type=float,
        default=1.0,
        help="look for new versions (on disk or in the store) this often (TF Serving's default: 1 s; 0: only at start)",
    )
    serve.add_argument(
        "--enable_batching", action="store_true", help="gather concurrent requests into one forward pass"
    )
    serve.add_argument(
        "--batching_parameters_file",
        help="TF's BatchingParameters text file (max_batch_size { "
        "value: 32 } batch_timeout_micros { value: 1000 } ...); needs --enable_batching",
    )
    serve.add_argument(
        "--allow_version_labels_for_unavailable_models",
        action="store_true",
        help="let --model_config_file's version_labels name versions not loaded yet (as TF Serving)",
    )
    serve.add_argument(
        "--monitoring_config_file",
        help="TF's MonitoringConfig text file (prometheus_config { "
        "enable: true path: ... }); without it metrics are at --metrics_path",
    )
    serve.add_argument(
        "--metrics_path",
        default="/monitoring/prometheus/metrics",
        help="Prometheus metrics page (TF Serving's path by default)",
    )
    serve.add_argument(
        "--rest_api_num_threads",
        type=int,
        default=None,
        help="threads parsing, running and encoding requests (default: one per CPU core)",
    )
    serve.add_argument("--rest_api_timeout_in_ms", type=int, default=30000, help="0: no limit")
    serve.add_argument(
        "--max_body_bytes", type=int, default=64 * 1024 * 1024, help="larger request bodies are refused with 413"
    )
    serve.add_argument(
        "--inline_forward_micros",
        type=int,
        default=DEFAULT_INLINE_FORWARD_MICROS,
        help="a small request to a model whose forward (measured at load) takes at most this many "
        "microseconds for its rows runs on the event loop, not a request thread (0: never)",
    )
    serve.add_argument(
        "--enable_model_warmup",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="replay each version's assets.extra/tf_serving_warmup_requests before it serves "
        "(TF Serving's default: true; --enable_model_warmup=false turns it off)",
    )
    serve.set_defaults(handler=_serve)


def _boolean(text: str) -> bool:
    """A TF-style boolean flag value: true/false (also 1/0, yes/no), any case."""
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false; received {text!r}")


def check_port(port: int, flag: str, *, lowest: int, why: str = "") -> None:
    """ConfigError naming ``flag`` unless ``lowest <= port <= 65535`` (checked before anything is loaded);
    ``why`` says why ports below ``lowest`` are refused."""
    from torchestimator.errors import ConfigError

    if not lowest <= port <= _HIGHEST_PORT:
        what = why if port < lowest and why else "is not a TCP port"
        any_port = " (0: any free port, announced when listening)" if lowest == 0 else ""
        raise ConfigError(f"{flag} {port} {what}: give {lowest}-{_HIGHEST_PORT}{any_port}.", field=flag, value=port)


_HIGHEST_PORT = 65535
_BIND_ERRORS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)


def _serve(args: argparse.Namespace) -> int:
    check_port(args.rest_api_port, "--rest_api_port", lowest=0)
    check_port(args.port, "--port", lowest=0)
    if args.inline_forward_micros < 0:
        from torchestimator.errors import ConfigError

        raise ConfigError(
            f"--inline_forward_micros {args.inline_forward_micros} is negative: give 0 (every forward "
            "on a request thread) or more.",
            field="--inline_forward_micros",
            value=args.inline_forward_micros,
        )
    from torchestimator.serving import (
        BatchingParameters,
        read_batching_parameters_file,
        read_monitoring_config_file,
        serve,
    )

    if args.batching_parameters_file and not args.enable_batching:
        from torchestimator.errors import ConfigError

        raise ConfigError(
            "--batching_parameters_file needs --enable_batching (as in TF Serving).",
            field="--batching_parameters_file",
            value=args.batching_parameters_file,
        )
    batching = None
    if args.enable_batching:
        fields = read_batching_parameters_file(args.batching_parameters_file) if args.batching_parameters_file else {}
        batching = BatchingParameters.from_fields(fields, source=args.batching_parameters_file or "defaults")
    metrics_path = args.metrics_path
    if args.monitoring_config_file:
        monitoring = read_monitoring_config_file(args.monitoring_config_file)
        metrics_path = monitoring.path if monitoring.enable else None
    listening = False

    def announce(app: Any, port: int) -> None:
        # Printed once the port answers, with the versions that are AVAILABLE: a script waiting for this
        # line can send its first request at once.
        from torchestimator.serving.app import managers_of
        from torchestimator.serving.server import grpc_port_of

        nonlocal listening
        listening = True
        versions = {name: manager.served_versions for name, manager in sorted(managers_of(app).items())}
        url = f"http://{args.rest_api_host}:{port}/v1/models/" + ("" if args.model_config_file else args.model_name)
        grpc_port = grpc_port_of(app)
        grpc = "" if grpc_port is None else f" and gRPC {args.rest_api_host}:{grpc_port}"
        print(f"serving {versions_text(versions)} at {url}{grpc}", flush=True)

    try:
        serve(
            args.model_name,
            args.model_base_path,
            host=args.rest_api_host,
            port=args.rest_api_port,
            on_listening=announce,
            model_config_file=args.model_config_file,
            model_config_file_poll_wait_seconds=args.model_config_file_poll_wait_seconds,
            file_system_poll_wait_seconds=args.file_system_poll_wait_seconds,
            batching=batching,
            allow_version_labels_for_unavailable_models=args.allow_version_labels_for_unavailable_models,
            num_threads=args.rest_api_num_threads,
            max_body_bytes=args.max_body_bytes,
            timeout_seconds=args.rest_api_timeout_in_ms / 1000 if args.rest_api_timeout_in_ms > 0 else None,
            metrics_path=metrics_path,
            inline_forward_micros=args.inline_forward_micros,
            grpc_port=args.port or None,
            enable_model_warmup=args.enable_model_warmup,
        )
    except OSError as error:
        if listening:
            raise
        from torchestimator.serving.errors import GrpcListenError

        if isinstance(error, GrpcListenError):  # its message names the address and why
            from torchestimator.errors import ConfigError

            raise ConfigError(f"{error}; choose another --port.", field="port", value=args.port) from error
        if error.errno not in _BIND_ERRORS:
            raise
        raise _bind_refused(args, error.errno) from error
    return 0


def _bind_refused(args: argparse.Namespace, code: int) -> Exception:
    """The bind's OSError (errno ``code``, one of _BIND_ERRORS) in the flags' words: which address, what to change."""
    from torchestimator.errors import ConfigError

    address = f"{args.rest_api_host}:{args.rest_api_port}"
    why = {
        errno.EADDRINUSE: f"port {args.rest_api_port} is already in use on {args.rest_api_host} (another "
        "server, or an earlier serve still running); stop it or choose another --rest_api_port",
        errno.EADDRNOTAVAIL: f"{args.rest_api_host} is not an address of this machine; choose another --rest_api_host",
        errno.EACCES: f"this user may not listen on port {args.rest_api_port} (ports below 1024 need "
        "privileges); choose another --rest_api_port",
    }[code]
    return ConfigError(f"cannot listen on {address}: {why}.", field="rest_api_port", value=args.rest_api_port)


def versions_text(versions: dict[str, Any]) -> str:
    """ "digits (version 1796137644 AVAILABLE)", or "digits (no version AVAILABLE yet)", for each model."""
    parts = []
    for name, served in versions.items():
        served = sorted(served)
        if not served:
            parts.append(f"{name} (no version AVAILABLE yet)")
        else:
            label = "version" if len(served) == 1 else "versions"
            parts.append(f"{name} ({label} {', '.join(map(str, served))} AVAILABLE)")
    return ", ".join(parts)
