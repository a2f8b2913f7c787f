"""TensorFlow Serving's text-format config files: models, batching parameters, monitoring.

What belongs here: reading ``--model_config_file`` (a ``ModelServerConfig``),
``--batching_parameters_file`` (``BatchingParameters``) and
``--monitoring_config_file`` (``MonitoringConfig``) into frozen dataclasses,
with TF Serving's own checks. What does not: acting on them (manager.py loads
versions, app.py serves paths, the CLI wires flags).

How: the message classes are built at runtime from ``FileDescriptorProto``s
that mirror TF Serving's ``.proto`` files field for field (names and numbers),
in a private descriptor pool (no protoc step, no clash with a real TF Serving
import), and the files are parsed by protobuf's own ``text_format`` (both
through ``torchestimator._io.protobuf``, the one protobuf helper), so any
file TF Serving accepts parses here, comments, commas and all. Fields we do not
act on (``model_platform``, ``logging_config``, ...) parse and are ignored; the
ones that change TF's behaviour are logged.

    model_config_list {
      config {
        name: 'my_first_model'
        base_path: '/tmp/my_first_model/'
        model_platform: 'tensorflow'
        model_version_policy { specific { versions: 42 versions: 43 } }
        version_labels { key: 'stable' value: 42 }
      }
    }

Sources: SRV ``config/model_server_config.proto``, ``config/logging_config.proto``,
``config/log_collector_config.proto``, ``config/monitoring_config.proto``,
``sources/storage_path/file_system_storage_path_source.proto``,
``servables/tensorflow/session_bundle_config.proto``, ``g3doc/serving_config.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Any

from torchestimator._io import protobuf as _protobuf
from torchestimator._io.filesystems import protocol_of
from torchestimator._io.regular_file import FileTooLargeError, NotARegularFileError, open_regular_file, read_bounded
from torchestimator.errors import ConfigError, ConfigTypeError

__all__ = [
    "DEFAULT_PROMETHEUS_PATH",
    "ModelConfig",
    "MonitoringConfig",
    "VersionPolicy",
    "parse_model_server_config",
    "read_batching_parameters_file",
    "read_model_config_file",
    "read_monitoring_config_file",
]

logger = logging.getLogger(__name__)

DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
"""``PrometheusExporter::kPrometheusPath``: used when ``prometheus_config`` enables metrics without a path."""

_POLICY_KINDS = ("latest", "all", "specific")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VersionPolicy:
    """Which versions under a base path are served (``ServableVersionPolicy``)."""

    kind: str = "latest"
    """latest: the ``num_versions`` highest version folders; all: every one; specific: those in ``versions``."""
    num_versions: int = 1
    """For ``latest`` only: how many of the highest versions to serve at once."""
    versions: tuple[int, ...] = ()
    """For ``specific`` only: the version numbers to serve (those missing on disk are skipped)."""

    def __post_init__(self) -> None:
        if self.kind not in _POLICY_KINDS:
            raise ConfigError(f"VersionPolicy.kind must be one of {list(_POLICY_KINDS)}; received {self.kind!r}.")
        if isinstance(self.num_versions, bool) or not isinstance(self.num_versions, int) or self.num_versions < 1:
            raise ConfigError(f"VersionPolicy.num_versions must be an int >= 1; received {self.num_versions!r}.")
        versions = tuple(self.versions)
        if not all(isinstance(version, int) and not isinstance(version, bool) for version in versions):
            raise ConfigError(f"VersionPolicy.versions must be ints; received {self.versions!r}.")
        object.__setattr__(self, "versions", tuple(sorted(set(versions))))
        if self.kind == "specific" and not self.versions:
            raise ConfigError(
                "VersionPolicy(kind='specific') needs at least one version in versions=(...); "
                "list the versions to serve, or use kind='latest' or 'all'."
            )
        if self.kind != "specific" and self.versions:
            raise ConfigError(
                f"VersionPolicy.versions is only for kind='specific'; received kind={self.kind!r} "
                f"with versions={self.versions}."
            )
        if self.kind != "latest" and self.num_versions != 1:
            raise ConfigError(
                f"VersionPolicy.num_versions is only for kind='latest'; received kind={self.kind!r} "
                f"with num_versions={self.num_versions}."
            )

    def aspired(self, on_disk: list[int]) -> list[int]:
        """The versions to serve out of those found on disk, ascending."""
        found = sorted(set(on_disk))
        if self.kind == "latest":
            return found[-self.num_versions :]
        if self.kind == "all":
            return found
        present = set(found)
        return [version for version in self.versions if version in present]


def _url_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model name or version label, or None: both are parts of URLs.

    TF Serving's REST routes match them with ``[^/:]+`` (``/v1/models/<name>/labels/<label>:predict``), so a
    name holding '/' or ':' is never routed; control characters (NUL included) and the dot segments '.' and
    '..' are refused too, as no HTTP client sends them as a path segment.
    """
    if not name:
        return "is empty; give a name"
    bad = sorted({character for character in name if character in "/:" or ord(character) < 32 or ord(character) == 127})
    if bad:
        return (
            f"holds {', '.join(repr(character) for character in bad)}; names and labels are parts of "
            "/v1/models/<name>/labels/<label> URLs, so '/', ':' and control characters cannot be routed"
        )
    if name in (".", ".."):
        return "is a dot segment of a URL path and cannot be routed; choose another name"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """One model of a ``model_config_list``: its name, base path, version policy and labels."""

    name: str
    base_path: str
    """As written in the file. TF Serving refuses a relative one ("Expected model <name> to have an
    absolute path or URI") unless the server has a ``model_config_list_root_dir``, which it then
    prepends; here a relative path is kept as given and so resolves against the working directory.
    An object-store URL (s3://, gs://, az://) is polled like a folder (manager.py)."""
    version_policy: VersionPolicy = VersionPolicy()
    version_labels: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Label -> version. TF checks at load time that each points at a loaded version (manager.py)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"ModelConfig.name must be a non-empty string; received {self.name!r}.")
        problem = _url_name_problem(self.name)
        if problem:
            raise ConfigError(f"ModelConfig.name {self.name!r} {problem}.")
        if not isinstance(self.base_path, str) or not self.base_path:
            raise ConfigError(
                f"ModelConfig.base_path of model {self.name!r} must be a non-empty string; received {self.base_path!r}."
            )
        protocol_of(self.base_path)  # a URL of a scheme we do not read (hdfs://) is refused here, naming it
        if not isinstance(self.version_policy, VersionPolicy):
            raise ConfigTypeError(
                f"ModelConfig.version_policy must be a VersionPolicy; received {type(self.version_policy).__name__}."
            )
        labels = dict(self.version_labels)
        for label, version in labels.items():
            if not isinstance(label, str) or not label:
                raise ConfigError(
                    f"Version labels of model {self.name!r} must be non-empty strings; received {label!r}."
                )
            problem = _url_name_problem(label)
            if problem:
                raise ConfigError(f"Version label {label!r} of model {self.name!r} {problem}.")
            if isinstance(version, bool) or not isinstance(version, int):
                raise ConfigError(
                    f"Version label {label!r} of model {self.name!r} must map to an int version; received {version!r}."
                )
        object.__setattr__(self, "version_labels", MappingProxyType(labels))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MonitoringConfig:
    """``prometheus_config`` of a monitoring config file: whether to expose metrics, and where."""

    enable: bool = False
    path: str = DEFAULT_PROMETHEUS_PATH


# -- reading files ------------------------------------------------------------------------------------


def parse_model_server_config(text: str, source: str = "<string>") -> list[ModelConfig]:
    """The models of a text-format ``ModelServerConfig``; ConfigError (a ValueError) naming ``source`` on any problem."""
    message = _parse(text, _protos().ModelServerConfig, source)
    choice = message.WhichOneof("config")
    if choice is None:
        logger.info("%s: empty model server config; no models to serve.", source)  # TF takes no action either
        return []
    if choice == "custom_model_config":
        raise ConfigError(
            f"{source}: custom_model_config is not supported (TF Serving needs a custom loader "
            "linked into the server for it); list the models in model_config_list { config { ... } }."
        )
    configs, seen = [], set()
    for index, config in enumerate(message.model_config_list.config):
        where = f"{source}: model_config_list.config[{index}]"
        if config.name in seen:  # TF's ValidateModelConfigList wording
            raise ConfigError(f"{source}: Illegal to list model {config.name} multiple times in config list.")
        seen.add(config.name)
        problem = _url_name_problem(config.name) if config.name else None
        if problem:
            line = _protobuf.text_field_lines(text, "name")[index : index + 1]
            at = f"{source}:{line[0]}: model_config_list.config[{index}]" if line else where
            raise ConfigError(f"{at}: the model name {config.name!r} {problem}.")
        for label in sorted(config.version_labels):
            problem = _url_name_problem(label) if label else None  # an empty one: ModelConfig's own message
            if problem:
                raise ConfigError(f"{where} (model {config.name!r}): the version label {label!r} {problem}.")
        configs.append(_model_config(config, where))
    return configs


def read_model_config_file(path: str | os.PathLike[str]) -> list[ModelConfig]:
    """Reads ``--model_config_file``: the models it lists, in file order."""
    path = os.fspath(path)
    return parse_model_server_config(_read_text(path, "model config file"), source=path)


def read_batching_parameters_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads ``--batching_parameters_file``: only the fields present, wrappers unwrapped.

    ``max_batch_size { value: 128 }`` gives ``{"max_batch_size": 128}``;
    ``allowed_batch_sizes`` comes back as a tuple, booleans as bools. Absent
    fields are absent, so the caller applies TF's defaults (``pad_variable_length_inputs``
    is a plain proto3 bool: ``false`` is indistinguishable from absent).
    """
    path = os.fspath(path)
    message = _parse(_read_text(path, "batching parameters file"), _protos().BatchingParameters, path)
    parameters: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is not None:  # google.protobuf.*Value wrappers
            parameters[field.name] = value.value
        elif not isinstance(value, (bool, int, float, str, bytes)):  # a repeated scalar container
            parameters[field.name] = tuple(value)
        else:
            parameters[field.name] = value
    for name, minimum in _BATCHING_MINIMUMS.items():
        value = parameters.get(name)
        if value is not None and value < minimum:  # TF's SharedBatchScheduler / BatchingSession wording
            rule = "non-negative" if minimum == 0 else "positive"
            raise ConfigError(f"{path}: {name} must be {rule}; was {value}. Fix {name} {{ value: ... }} in the file.")
    sizes = parameters.get("allowed_batch_sizes", ())
    for index, size in enumerate(sizes):
        if size < 1:
            raise ConfigError(f"{path}: allowed_batch_sizes[{index}] must be positive; was {size}.")
    if sizes and list(sizes) != sorted(set(sizes)):
        raise ConfigError(f"{path}: allowed_batch_sizes must be strictly increasing; received {list(sizes)}.")
    if sizes and "max_batch_size" in parameters and sizes[-1] != parameters["max_batch_size"]:
        # TF's CreateBatchScheduler check, made when the file is read rather than at the first load.
        raise ConfigError(
            f"{path}: Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
            f"{sizes[-1]}; expected {parameters['max_batch_size']}."
        )
    return parameters


_BATCHING_MINIMUMS = {
    "max_batch_size": 1,
    "batch_timeout_micros": 0,
    "max_enqueued_batches": 1,
    "num_batch_threads": 1,
    "max_execution_batch_size": 1,
}
"""The least value of each BatchingParameters number TF accepts (the scheduler refuses the rest at load time)."""


def read_monitoring_config_file(path: str | os.PathLike[str]) -> MonitoringConfig:
    """Reads ``--monitoring_config_file``; an enabled config without a path uses TF's default path."""
    path = os.fspath(path)
    message = _parse(_read_text(path, "monitoring config file"), _protos().MonitoringConfig, path)
    prometheus = message.prometheus_config
    metrics_path = prometheus.path or DEFAULT_PROMETHEUS_PATH
    if not metrics_path.startswith("/"):
        raise ConfigError(f"{path}: prometheus_config.path must start with '/'; received {prometheus.path!r}.")
    return MonitoringConfig(enable=prometheus.enable, path=metrics_path)


MAX_CONFIG_BYTES = 16 * 1024 * 1024
"""The largest config file read (16 MiB): TF Serving's config files are a few kilobytes; a bigger one is a mistake
(the wrong file named), and reading it whole would hold the server up and its memory."""


def _read_text(path: str, what: str) -> str:
    """The file's text; every problem (missing, a folder, a FIFO or device, unreadable, too big, not UTF-8) is a
    ConfigError (a ValueError) naming the file. Opened non-blocking and checked to be a regular file before it is read, so a FIFO
    given by mistake cannot hold up the server."""
    try:
        file = open_regular_file(path)
    except FileNotFoundError:
        raise ConfigError(f"The {what} {path} does not exist; check the path given on the command line.") from None
    except NotARegularFileError as error:
        raise ConfigError(f"The {what} {path} is {error.kind}; give the path of a text-format file.") from None
    except OSError as error:
        raise ConfigError(
            f"The {what} {path} could not be opened ({error.strerror or error}); give the path of a "
            "readable text-format file."
        ) from None
    try:
        with file:
            data = read_bounded(file, path, MAX_CONFIG_BYTES)
    except FileTooLargeError:
        raise ConfigError(
            f"The {what} {path} is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB, the most read; "
            "TF Serving's config files are a few kilobytes: check that the right file is named."
        ) from None
    except OSError as error:
        raise ConfigError(
            f"The {what} {path} could not be read ({error.strerror or error}); check the file and its permissions."
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"The {what} {path} is not UTF-8 text ({error}); TF Serving reads an ASCII (text-format) protocol buffer."
        ) from None


def _parse(text: str, message_class: Any, source: str) -> Any:
    try:
        return _protobuf.parse_text(text, message_class, _protos().pool)
    except _protobuf.TextFormatError as error:  # the one boundary where protobuf's error becomes ours
        if error.line is not None:
            source = f"{source}:{error.line}:{error.column}"
        raise ConfigError(
            f"{source}: {error.problem} (expected a text-format {message_class.DESCRIPTOR.name}, "
            "as TF Serving reads it)."
        ) from None


def _model_config(config: Any, where: str) -> ModelConfig:
    if not config.name:
        raise ConfigError(f"{where} has no name; give every model a name: '...'.")
    if not config.base_path:
        raise ConfigError(
            f"{where} (model {config.name}) has no base_path; give the folder holding its integer version folders."
        )
    if config.model_type:  # deprecated ModelType enum: TF warns and maps TENSORFLOW to model_platform
        logger.warning("%s: deprecated model_type field used (model %s); prefer model_platform.", where, config.name)
    if config.model_platform and config.model_platform != "tensorflow":
        logger.warning(
            "%s: model %s asks for model_platform %r; served as a torchestimator export regardless.",
            where,
            config.name,
            config.model_platform,
        )
    if config.HasField("logging_config"):
        logger.warning("%s: model %s has a logging_config (request logging); it is ignored here.", where, config.name)
    try:
        return ModelConfig(
            name=config.name,
            base_path=config.base_path,
            version_policy=_version_policy(config.model_version_policy),
            version_labels=dict(config.version_labels),
        )
    except ValueError as error:
        raise ConfigError(f"{where} (model {config.name}): {error}") from None


def _version_policy(policy: Any) -> VersionPolicy:
    choice = policy.WhichOneof("policy_choice")
    if choice is None:
        return VersionPolicy()
    if choice == "latest":
        # FileSystemStoragePathSource serves max(num_versions, 1): `latest {}` means one version.
        return VersionPolicy(kind="latest", num_versions=max(policy.latest.num_versions, 1))
    if choice == "all":
        return VersionPolicy(kind="all")
    if not policy.specific.versions:
        raise ConfigError("model_version_policy { specific { } } lists no versions; add versions: <number>.")
    return VersionPolicy(kind="specific", versions=tuple(policy.specific.versions))


# -- message classes: TF Serving's protos, rebuilt in a private pool ------------------------------------


@functools.lru_cache(maxsize=1)
def _protos() -> SimpleNamespace:
    return _protobuf.message_classes(
        _file_descriptors(),
        [
            "tensorflow.serving.ModelServerConfig",
            "tensorflow.serving.BatchingParameters",
            "tensorflow.serving.MonitoringConfig",
        ],
    )


_PREFIX = ".tensorflow.serving."
_POLICY = ".tensorflow.serving.FileSystemStoragePathSourceConfig.ServableVersionPolicy"
_add = _protobuf.add_field


def _file_descriptors() -> list[Any]:
    """One FileDescriptorProto per TF Serving .proto file, dependencies first."""
    return [_storage_path_file(), *_logging_files(), _model_server_file(), _batching_file(), _monitoring_file()]


def _new_file(name: str, *dependencies: str) -> Any:
    return _protobuf.new_file(name, "tensorflow.serving", *dependencies)


def _storage_path_file() -> Any:
    """sources/storage_path/file_system_storage_path_source.proto: the version policy part."""
    storage = _new_file("tensorflow_serving/sources/storage_path/file_system_storage_path_source.proto")
    policy = storage.message_type.add(name="FileSystemStoragePathSourceConfig").nested_type.add(
        name="ServableVersionPolicy"
    )
    _add(policy.nested_type.add(name="Latest"), "num_versions", 1, "uint32")
    policy.nested_type.add(name="All")
    _add(policy.nested_type.add(name="Specific"), "versions", 1, "int64", repeated=True)
    policy.oneof_decl.add(name="policy_choice")
    for name, number, type_name in (("latest", 100, "Latest"), ("all", 101, "All"), ("specific", 102, "Specific")):
        _add(policy, name, number, "message", f"{_POLICY}.{type_name}", oneof=0)
    return storage


def _logging_files() -> list[Any]:
    """config/log_collector_config.proto and config/logging_config.proto."""
    collector = _new_file("tensorflow_serving/config/log_collector_config.proto")
    collector_message = collector.message_type.add(name="LogCollectorConfig")
    _add(collector_message, "type", 1, "string")
    _add(collector_message, "filename_prefix", 2, "string")
    logging_file = _new_file("tensorflow_serving/config/logging_config.proto", collector.name)
    sampling = logging_file.message_type.add(name="SamplingConfig")
    _add(sampling, "sampling_rate", 1, "double")
    _add(sampling, "attributes", 2, "int32")
    logging_config = logging_file.message_type.add(name="LoggingConfig")
    _add(logging_config, "log_collector_config", 1, "message", _PREFIX + "LogCollectorConfig")
    _add(logging_config, "sampling_config", 2, "message", _PREFIX + "SamplingConfig")
    return [collector, logging_file]


def _model_server_file() -> Any:
    """config/model_server_config.proto."""
    server = _new_file(
        "tensorflow_serving/config/model_server_config.proto",
        "google/protobuf/any.proto",
        "tensorflow_serving/config/logging_config.proto",
        "tensorflow_serving/sources/storage_path/file_system_storage_path_source.proto",
    )
    model_type = server.enum_type.add(name="ModelType")
    for number, name in enumerate(("MODEL_TYPE_UNSPECIFIED", "TENSORFLOW", "OTHER")):
        model_type.value.add(name=name, number=number)
    model = server.message_type.add(name="ModelConfig")
    _add(model, "name", 1, "string")
    _add(model, "base_path", 2, "string")
    _add(model, "model_type", 3, "enum", _PREFIX + "ModelType")
    _add(model, "model_platform", 4, "string")
    _add(model, "model_version_policy", 7, "message", _POLICY)
    _protobuf.add_map(model, "tensorflow.serving.ModelConfig", "version_labels", 8, "string", "int64")
    _add(model, "logging_config", 6, "message", _PREFIX + "LoggingConfig")
    for reserved in (5, 9):
        model.reserved_range.add(start=reserved, end=reserved + 1)
    _add(
        server.message_type.add(name="ModelConfigList"), "config", 1, "message", _PREFIX + "ModelConfig", repeated=True
    )
    server_config = server.message_type.add(name="ModelServerConfig")
    server_config.oneof_decl.add(name="config")
    _add(server_config, "model_config_list", 1, "message", _PREFIX + "ModelConfigList", oneof=0)
    _add(server_config, "custom_model_config", 2, "message", ".google.protobuf.Any", oneof=0)
    return server


def _batching_file() -> Any:
    """servables/tensorflow/session_bundle_config.proto: BatchingParameters only."""
    session = _new_file(
        "tensorflow_serving/servables/tensorflow/session_bundle_config.proto", "google/protobuf/wrappers.proto"
    )
    batching = session.message_type.add(name="BatchingParameters")
    int64_value, string_value, bool_value = (
        ".google.protobuf.Int64Value",
        ".google.protobuf.StringValue",
        ".google.protobuf.BoolValue",
    )
    for name, number, type_name in (
        ("max_batch_size", 1, int64_value),
        ("batch_timeout_micros", 2, int64_value),
        ("max_enqueued_batches", 3, int64_value),
        ("num_batch_threads", 4, int64_value),
        ("thread_pool_name", 5, string_value),
    ):
        _add(batching, name, number, "message", type_name)
    _add(batching, "allowed_batch_sizes", 6, "int64", repeated=True)
    _add(batching, "pad_variable_length_inputs", 7, "bool")
    # Newer fields: names and wrapper types as TF Serving's saved_model_bundle_factory_test writes them
    # (`enable_large_batch_splitting { value: true }`); their numbers were not checked against the .proto,
    # which text format never uses.
    _add(batching, "enable_large_batch_splitting", 8, "message", bool_value)
    _add(batching, "max_execution_batch_size", 9, "message", int64_value)
    return session


def _monitoring_file() -> Any:
    """config/monitoring_config.proto."""
    monitoring = _new_file("tensorflow_serving/config/monitoring_config.proto")
    prometheus = monitoring.message_type.add(name="PrometheusConfig")
    _add(prometheus, "enable", 1, "bool")
    _add(prometheus, "path", 2, "string")
    _add(
        monitoring.message_type.add(name="MonitoringConfig"),
        "prometheus_config",
        1,
        "message",
        _PREFIX + "PrometheusConfig",
    )
    return monitoring
