"""export_saved_model: an Estimator's PREDICT computation written as a versioned torch.export folder.

A version folder holds:

    program.json         the torch.export graph (torch's JSON schema; see program_format.py)
    tensors.safetensors  its parameters, buffers and constants
    signature.json       each signature: method, inputs and outputs with dtype and shape (-1 dynamic); with
                         string inputs, the decode step of each (``decoders``: data, see decoders.py); an
                         input named otherwise than its receiver input records it (``receiver_input``:
                         TF's "inputs" of classify/regress over one string input, outputs.py)
    metadata.json        checkpoint, global_step, versions, creation time; ``files``: the size and sha256 of
                         every other file of the version (written last)
    assets.extra/        copies of assets_extra
    model.onnx           only with as_onnx=True (onnx_export.py: how it is named and called)

Every file is encoded in memory first, the free space is checked, and the
bytes are written with plain Python I/O, so a full disk is an OSError naming
the file (torch's own zip writer aborted the process). It is written to a
sibling ``temp-<ns>-<pid>-<host>`` folder and renamed to its integer version at
the end, so a server polling the base never sees half a version; a failed
export removes its temp folder, and the next export removes those of writers
that were killed. An ``export_dir_base`` in an object store (s3://, gs://, ...)
gets the same folder built in a local temporary folder, then uploaded file by
file, metadata.json last (_store_versions.py): a version without it is not one.
Reading it back lives in loader.py; when to export (latest, best, final) in
exporters.py.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

# torch.export imports its tracer (and inductor's caches, which need a writable temporary directory) on the
# first export() call. Imported with this module instead: an import that fails half-way (a full /tmp at the
# first export after hours of training) leaves torch unable to import it again in this process.
import torch.export._trace

from torchestimator._core.inference import BundleSource, InferenceBundle
from torchestimator._core.spec import ModeKeys, validate_spec
from torchestimator._io import filesystems
from torchestimator._io.atomic import fsync_directory, write_durably
from torchestimator.export import _store_versions, onnx_export, program_format
from torchestimator.export.outputs import resolve_export_outputs, signature_input_names
from torchestimator.export.receiver import ServingInputReceiver, as_receiver, dtype_name

__all__ = ["export_saved_model"]

logger = logging.getLogger(__name__)

PROGRAM_FILE = program_format.PROGRAM_FILE
TENSORS_FILE = program_format.TENSORS_FILE
SIGNATURE_FILE = "signature.json"
METADATA_FILE = "metadata.json"
ONNX_FILE = onnx_export.ONNX_FILE
ASSETS_EXTRA = "assets.extra"
REPLICA_CALL_KEY = "replica_call"
"""metadata.json's entry naming the several-replica export call a version answers (export/replicas.py)."""
SIGNATURE_FORMAT_VERSION = 1
# Written when the receiver has string inputs: their decode steps are in the file, and a reader that knew only
# format 1 would take the decoded tensors for the inputs, so it must refuse the file instead.
SIGNATURE_FORMAT_WITH_DECODERS = 2
# Format 2 plus signature inputs named otherwise than the receiver input they feed ("receiver_input": TF's "inputs"
# of a classify/regress signature over one string input). Written only then: a reader of format 2 would look for
# a decode step under the signature's name and refuse the file without saying it is newer.
SIGNATURE_FORMAT_WITH_RECEIVER_INPUTS = 3
_VERSION_ATTEMPTS = 10
TEMP_PREFIX = "temp-"
# Filesystems round each file up to whole blocks and need room for folder entries.
_BLOCK = 4096


def export_saved_model(
    estimator: BundleSource,
    export_dir_base: str | os.PathLike[str],
    serving_input_receiver: ServingInputReceiver | Callable[[], ServingInputReceiver],
    checkpoint_path: str | os.PathLike[str] | None = None,
    assets_extra: Mapping[str, str | os.PathLike[str]] | None = None,
    as_onnx: bool = False,
    warmup_requests: Any = None,
    *,
    replica_call: str | None = None,
) -> str:
    """Exports the model in PREDICT mode to ``export_dir_base/<int(time.time())>``; returns that path.

    ``export_dir_base`` may be an object-store URL (``s3://bucket/models/m``): the version is built locally,
    then uploaded with its metadata.json last, and the URL of the version is returned.

    ``warmup_requests`` (dicts of input arrays, or serving protos) are written to
    assets.extra/tf_serving_warmup_requests, which a server with model warm-up replays (export/warmup.py).

    Weights come from ``checkpoint_path``, else the latest checkpoint in
    model_dir, else the warm-start source; with none of them it is an error.
    ``as_onnx=True`` also writes model.onnx (onnx_export.py); without the
    onnx packages, or for a model torch.onnx cannot convert, it is an error.
    ``replica_call`` is recorded in metadata.json: the other replicas of a run find this version by it
    (``Estimator.export_saved_model`` after a several-replica train(); export/replicas.py).
    """
    receiver = as_receiver(serving_input_receiver)
    assets = _check_assets(assets_extra)
    if as_onnx:
        onnx_export.require_onnx_packages()  # before restoring and tracing: a missing package is said at once
    export_dir_base = os.fspath(export_dir_base)
    bundle, provenance = _restore_module(estimator, None if checkpoint_path is None else os.fspath(checkpoint_path))
    module = bundle.module
    was_training = module.training
    module.eval()  # BatchNorm and dropout in inference behaviour, as predict runs them
    try:
        program, signatures, examples = _trace(bundle, receiver)
    except OSError as error:  # the machine, not the model: torch writes caches under the temporary directory
        raise OSError(
            error.errno,
            f"cannot export to {export_dir_base}: tracing the model needs a writable "
            f"temporary directory (TMPDIR) and free space: {error.strerror or error}",
            error.filename,
        ) from error
    finally:
        module.train(was_training)
    files = {SIGNATURE_FILE: _json_bytes(signatures), **program_format.encode(program)}
    onnx_model = (
        onnx_export.convert_to_onnx(program, receiver, examples, signatures, type(module).__name__) if as_onnx else None
    )
    to_store = filesystems.is_url(export_dir_base)
    if to_store:  # built on this machine as below, then uploaded: _store_versions.py
        build_base = tempfile.mkdtemp(prefix="torchestimator-export-")
    else:
        os.makedirs(export_dir_base, exist_ok=True)
        remove_stale_temp_folders(export_dir_base)
        build_base = export_dir_base
    temp_dir = os.path.join(build_base, f"{TEMP_PREFIX}{time.time_ns()}-{os.getpid()}-{_host()}")
    try:
        os.makedirs(temp_dir)
        _write_version(temp_dir, files, assets, onnx_model)
        if warmup_requests is not None:
            from torchestimator.export.warmup import write_warmup_file

            write_warmup_file(temp_dir, warmup_requests, signatures["signatures"])
        metadata = {
            **provenance,
            **_environment(),
            "signatures": sorted(signatures["signatures"]),
            "receiver": receiver.describe(),
            "onnx": None if onnx_model is None else onnx_model.record,
        }
        if replica_call is not None:
            metadata[REPLICA_CALL_KEY] = replica_call
        # Written last, with the size and sha256 of every other file: what makes a version in a store one.
        metadata[_store_versions.FILES_KEY] = _store_versions.file_records(temp_dir)
        _write_file(os.path.join(temp_dir, METADATA_FILE), _json_bytes(metadata))
        if to_store:
            export_dir = _store_versions.publish_version(temp_dir, export_dir_base)
        else:
            export_dir = _rename_to_version(temp_dir, export_dir_base)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)  # a kill leaves it: the next export removes it
        raise
    finally:
        if to_store:
            shutil.rmtree(build_base, ignore_errors=True)
    logger.info(
        "Exported %s (global step %s) to %s.",
        provenance.get("checkpoint_path") or "the model",
        provenance.get("global_step"),
        export_dir,
    )
    return export_dir


def _restore_module(estimator: BundleSource, checkpoint_path: str | None) -> tuple[InferenceBundle, dict[str, Any]]:
    """The bundle holding the weights to export (its module on the CPU), and where the weights came from."""
    if checkpoint_path is not None and not filesystems.exists(checkpoint_path):
        raise ValueError(f"Couldn't find trained model at {checkpoint_path}: no such checkpoint.")
    # Exported programs run on CPU wherever they are loaded; the estimator moves its module back when it next runs.
    bundle = estimator.inference_bundle(checkpoint_path, device=torch.device("cpu"), require_weights=True)
    weights = bundle.weights
    provenance: dict[str, Any] = {"model_dir": absolute(estimator.model_dir), "global_step": weights.step}
    if weights.checkpoint_path is not None:
        provenance["checkpoint_path"] = absolute(weights.checkpoint_path)
    else:
        provenance["checkpoint_path"] = None
        if weights.warm_start_from is not None:
            provenance["warm_start_from"] = weights.warm_start_from
    return bundle, provenance


class _ServingModule(torch.nn.Module):
    """receiver -> features -> model_fn(PREDICT) -> a flat dict of the signatures' output tensors."""

    def __init__(
        self,
        model: torch.nn.Module,
        call_model_fn: Callable[..., Any],
        receiver: ServingInputReceiver,
        selection: Mapping[str, tuple[str, str]],
    ) -> None:
        super().__init__()
        self.model = model
        self._call_model_fn = call_model_fn
        self._receiver = receiver
        self._selection = dict(selection)

    def forward(self, receiver_tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        features = self._receiver.features(receiver_tensors)
        spec = validate_spec(self._call_model_fn(self.model, features, None, ModeKeys.PREDICT), ModeKeys.PREDICT)
        resolved = resolve_export_outputs(spec)
        return {key: resolved[signature].outputs[alias] for key, (signature, alias) in self._selection.items()}


def _trace(
    bundle: InferenceBundle, receiver: ServingInputReceiver
) -> tuple[Any, dict[str, Any], dict[str, torch.Tensor]]:
    module, call_model_fn = bundle.module, bundle.call_model_fn
    examples = receiver.example_inputs()
    spec = _probe(call_model_fn, module, receiver, examples)
    plan, selection = _plan_signatures(spec)
    serving = _ServingModule(module, call_model_fn, receiver, selection)
    try:
        program = torch.export.export(serving, (examples,), dynamic_shapes=(receiver.dynamic_shapes(),))
    except OSError:
        raise  # not the model's fault (no usable temporary directory, a full disk): export_saved_model names it
    except Exception as error:  # torch raises many other types here; all mean "this model_fn does not trace"
        raise ValueError(
            f"torch.export could not trace model_fn in PREDICT mode for the receiver inputs {{{receiver.describe()}}}: "
            f"{error}\nCommon causes: Python branching on tensor values, a fixed batch size inside the model "
            "(use -1 in reshape), or non-torch code in model_fn or receiver_fn."
        ) from error
    signatures = _signature_document(plan, receiver, _program_outputs(program))
    return program, signatures, examples


class _ReadRecorder(dict):
    """A features dict that remembers which keys model_fn read, to name the culprit of a failure."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: list[Any] = []

    def __getitem__(self, key: Any) -> Any:
        self.read.append(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.append(key)
        return super().get(key, default)


def _probe(
    call_model_fn: Callable[..., Any],
    module: torch.nn.Module,
    receiver: ServingInputReceiver,
    examples: dict[str, torch.Tensor],
) -> Any:
    """Runs model_fn eagerly on example inputs so a receiver/model mismatch is reported plainly, at export time."""
    try:
        features = receiver.features(dict(examples))
    except Exception as error:
        raise ValueError(
            f"receiver_fn failed on example inputs for the receiver {{{receiver.describe()}}}: "
            f"{type(error).__name__}: {error}"
        ) from error
    recorder = _ReadRecorder(features) if isinstance(features, Mapping) else None
    try:
        with torch.no_grad():
            spec = call_model_fn(module, recorder if recorder is not None else features, None, ModeKeys.PREDICT)
            return validate_spec(spec, ModeKeys.PREDICT)
    except KeyError as error:
        key = error.args[0] if error.args else None
        if recorder is not None and key not in recorder:
            provided = receiver.describe() if receiver.receiver_fn is None else _describe_features(features)
            raise ValueError(
                f"model_fn reads feature {key!r}, which the serving input receiver does not provide; it provides "
                f"{{{provided}}}. Add {key!r} to the receiver, or build it in receiver_fn."
            ) from error
        raise _mismatch(error, receiver, features, recorder) from error
    except Exception as error:
        raise _mismatch(error, receiver, features, recorder) from error


def _mismatch(
    error: Exception, receiver: ServingInputReceiver, features: Any, recorder: _ReadRecorder | None
) -> ValueError:
    if recorder is not None and recorder.read:
        key = recorder.read[-1]
        culprit = f"the failure came after model_fn read feature {key!r} ({_describe_value(features.get(key))}); "
    elif isinstance(features, torch.Tensor):
        culprit = f"the features are {_describe_value(features)}; "
    else:
        culprit = ""
    return ValueError(
        f"The serving input receiver does not match the model: model_fn failed in PREDICT mode on example inputs "
        f"built from the receiver {{{receiver.describe()}}}; {culprit}{type(error).__name__}: {error}. "
        "Check each receiver input's dtype and trailing shape against what the model expects."
    )


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{dtype_name(value.dtype)}, shape {list(value.shape)} with the dynamic sizes set to 2"
    return type(value).__name__


def _describe_features(features: Mapping[str, Any]) -> str:
    return ", ".join(f"{key!r}: {_describe_value(value)}" for key, value in features.items())


def _plan_signatures(spec: Any) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[str, str]]]:
    """Per signature its method and {alias: program output key}; and what the program returns.

    A signature that repeats another's ExportOutput (the default serving_default
    copy) reuses its program outputs rather than returning tensors twice.
    """
    resolved = resolve_export_outputs(spec)
    owners: dict[int, str] = {}
    plan: dict[str, dict[str, Any]] = {}
    selection: dict[str, tuple[str, str]] = {}
    for name, output in resolved.items():
        owner = owners.setdefault(id(output), name)
        outputs = {}
        for alias in output.outputs:
            key = f"{owner}/{alias}"
            outputs[alias] = key
            selection.setdefault(key, (owner, alias))
        plan[name] = {"method": output.method, "method_name": output.method_name, "outputs": outputs}
    return plan, selection


def _program_outputs(program: Any) -> dict[str, dict[str, Any]]:
    """dtype and shape (-1 where symbolic) of each named program output, read from the traced graph."""
    user_outputs = [spec for spec in program.graph_signature.output_specs if spec.kind.name == "USER_OUTPUT"]
    output_node = next(iter(program.graph.find_nodes(op="output")))
    nodes_by_name = {node.name: node for node in output_node.args[0] if hasattr(node, "name")}
    out_spec = program.call_spec.out_spec
    keys = list(out_spec.context) if out_spec is not None and out_spec.context else []
    described: dict[str, dict[str, Any]] = {}
    for key, output_spec in zip(keys, user_outputs):
        node = nodes_by_name.get(getattr(output_spec.arg, "name", None))
        value = node.meta.get("val") if node is not None else None
        if value is None:
            described[key] = {"dtype": None, "shape": None}
            continue
        shape = [int(size) if isinstance(size, int) else -1 for size in value.shape]
        described[key] = {"dtype": dtype_name(value.dtype), "shape": shape}
    return described


def _signature_document(
    plan: dict[str, dict[str, Any]], receiver: ServingInputReceiver, program_outputs: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    described = {
        name: {"dtype": dtype_name(spec.dtype), "shape": spec.signature_shape()}
        for name, spec in receiver.receiver_tensors.items()
    }
    signatures = {}
    renamed = False
    for name, entry in plan.items():
        inputs = {}
        for alias, receiver_input in signature_input_names(entry["method"], receiver.receiver_tensors).items():
            inputs[alias] = dict(described[receiver_input])
            if alias != receiver_input:  # recorded, so load and serve feed the receiver input (its decode step)
                inputs[alias]["receiver_input"] = receiver_input
                renamed = True
        outputs = {
            alias: {**program_outputs.get(key, {"dtype": None, "shape": None}), "program_output": key}
            for alias, key in entry["outputs"].items()
        }
        signatures[name] = {
            "method": entry["method"],
            "method_name": entry["method_name"],
            "inputs": inputs,
            "outputs": outputs,
        }
    document = {
        "format_version": SIGNATURE_FORMAT_VERSION,
        "program_inputs": list(receiver.program_specs()),
        "signatures": signatures,
    }
    if receiver.decoders:
        document["format_version"] = (
            SIGNATURE_FORMAT_WITH_RECEIVER_INPUTS if renamed else SIGNATURE_FORMAT_WITH_DECODERS
        )
        document["decoders"] = {name: step.to_json() for name, step in receiver.decoders.items()}
    return document


def _write_version(
    folder: str, files: Mapping[str, bytes], assets: dict[str, str], onnx_model: onnx_export.OnnxModel | None
) -> None:
    asset_bytes = sum(_tree_size(source) for source in assets.values())
    onnx_bytes = 0 if onnx_model is None else onnx_model.estimated_bytes()
    _check_free_space(
        folder, sum(len(data) for data in files.values()) + asset_bytes + onnx_bytes, len(files) + len(assets) + 4
    )
    for name, data in files.items():
        _write_file(os.path.join(folder, name), data)
    for destination, source in assets.items():
        target = os.path.join(folder, ASSETS_EXTRA, destination)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.isdir(source):
                shutil.copytree(source, target)
            else:
                shutil.copyfile(source, target)
        except OSError as error:
            raise OSError(
                error.errno, f"Could not copy asset {source} into the export ({_reason(error)})", target
            ) from error
    if onnx_model is not None:
        onnx_model.write(folder, _write_file)


def _json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, indent=2, sort_keys=True).encode("utf-8")


def _write_file(path: str, data: bytes) -> None:
    """Plain Python I/O, so that a full disk or a file size limit is an OSError naming the file."""
    try:
        write_durably(path, data)
    except OSError as error:
        raise OSError(
            error.errno, f"Could not write {len(data)} bytes of the export ({_reason(error)})", path
        ) from error


def _reason(error: OSError) -> str:
    return "disk full" if error.errno == errno.ENOSPC else (error.strerror or str(error))


def _check_free_space(folder: str, needed: int, files: int) -> None:
    """Refuses before writing when the filesystem reports less room than the version needs."""
    try:
        stats = os.statvfs(folder)
    except (AttributeError, OSError):  # no statvfs (Windows) or not answerable: the writes themselves will tell
        return
    free = stats.f_bavail * stats.f_frsize
    required = needed + files * _BLOCK
    if required > free:
        raise OSError(
            errno.ENOSPC,
            f"Disk full: the export needs about {required} bytes and {free} are free under "
            f"{os.path.dirname(folder)}. Free some space or export elsewhere",
            folder,
        )


def _tree_size(path: str) -> int:
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def absolute(path: str | os.PathLike[str]) -> str:
    """``os.path.abspath`` for a local path; a URL (s3://...) as it is."""
    return os.fspath(path) if filesystems.is_url(path) else os.path.abspath(path)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def remove_stale_temp_folders(export_dir_base: str) -> list[str]:
    """Removes the temp folders of exports on this host whose process is gone (killed mid-write); returns them.

    A temp folder is named ``temp-<ns>-<pid>-<host>``: one from another host,
    or from a process still alive, is left alone.
    """
    removed = []
    for entry in os.listdir(export_dir_base):
        parts = entry[len(TEMP_PREFIX) :].split("-", 2) if entry.startswith(TEMP_PREFIX) else []
        if len(parts) != 3 or not parts[1].isdigit() or parts[2] != _host() or _process_alive(int(parts[1])):
            continue
        shutil.rmtree(os.path.join(export_dir_base, entry), ignore_errors=True)
        removed.append(entry)
        logger.info(
            "Removed %s under %s, left by an export that did not finish (process %s is gone).",
            entry,
            export_dir_base,
            parts[1],
        )
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):  # someone else's process, or a platform that cannot tell: keep its folder
        return True
    return True


def _check_assets(assets_extra: Mapping[str, Any] | None) -> dict[str, str]:
    """{destination inside assets.extra: source path}, checked before any work."""
    if assets_extra is None:
        return {}
    if not isinstance(assets_extra, Mapping):
        raise TypeError(f"assets_extra must be a dict of destination -> source path; received {assets_extra!r}.")
    checked = {}
    for destination, source in assets_extra.items():
        destination = os.fspath(destination)
        normalized = os.path.normpath(destination)
        if os.path.isabs(destination) or normalized.startswith(os.pardir) or normalized in ("", "."):
            raise ValueError(
                f"assets_extra destination {destination!r} must be a relative path inside assets.extra/ (no '..')."
            )
        source = os.fspath(source)
        if not os.path.exists(source):
            raise ValueError(f"assets_extra source {source!r} (for {destination!r}) does not exist.")
        checked[normalized] = source
    return checked


def _rename_to_version(
    temp_dir: str,
    export_dir_base: str,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Renames the finished folder to ``<int(time.time())>``; waits a second and retries when that exists.

    The version is taken when the export is complete, so a version that
    finished later always has the higher number.
    """
    for _ in range(_VERSION_ATTEMPTS):
        export_dir = os.path.join(export_dir_base, str(int(clock())))
        if not os.path.exists(export_dir):
            try:
                os.rename(temp_dir, export_dir)  # fails rather than merging if another exporter just took the name
                fsync_directory(export_dir_base)
                return export_dir
            except OSError:
                if not os.path.exists(export_dir):
                    raise
        sleep(1)
    raise RuntimeError(
        f"Failed to obtain a unique export directory name under {export_dir_base} after {_VERSION_ATTEMPTS} attempts; "
        "another process is exporting to the same base every second."
    )


def _environment() -> dict[str, Any]:
    now = time.time()
    return {
        "created": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(),
        "created_unix": now,
        "torch_version": torch.__version__,
        "torchestimator_version": _package_version(),
    }


def _package_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("torchestimator")
    except Exception:  # not installed as a distribution (a source checkout): the version is unknown, not an error
        return None
