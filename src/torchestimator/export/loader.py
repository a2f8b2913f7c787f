"""Loading an exported version and running it, without the training code.

``load(path)`` reads ``program.json`` and ``tensors.safetensors`` through
program_format.decode (checked JSON and safetensors: nothing in the files is
unpickled, eval'd or exec'd) and ``signature.json``, and returns an
ExportedModel: a callable from named numpy arrays or tensors to named numpy
arrays, checking names, dtypes and shapes against the signature first. A
folder holding only ``model.pt2`` (torch.export.save's archive, which
earlier torchestimator versions wrote) is refused without opening it: loading
that archive unpickles parts of it, so it must be re-exported. A string input (dtype "string", a batch of bytes) is decoded by the decode step signature.json records
(decoders.py: rebuilt from checked JSON, never code) into the tensors the program takes, before the program
runs; ``prepare_inputs`` returns those tensors, and a call given them (the batch scheduler concatenates them)
runs the program directly. ``read_inputs`` reads named inputs from an .npz
file (what the CLI's ``predict --exported`` does with one) or a JSON file; the CLI reads a JSON request with the
server's own parser instead (serving/json_tensor.py), which knows the signature, so rows of plain values work.
A path in an object store (s3://, gs://, ...) is first copied to a local cache folder and verified against the
sha256s of its metadata.json (_store_versions.py); what is loaded is that local copy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from torchestimator._io.filesystems import is_url, local_path
from torchestimator._io.regular_file import FileTooLargeError, NotARegularFileError, read_regular_file
from torchestimator.errors import ExportFormatError, InputError, InputTypeError
from torchestimator.export.decoders import STRING, DecodeStep, decoder_from_json
from torchestimator.export.outputs import DEFAULT_SERVING_SIGNATURE_DEF_KEY
from torchestimator.export.program_format import LEGACY_FILE, PROGRAM_FILE, TENSORS_FILE, decode
from torchestimator.export.receiver import dtype_name, parse_dtype
from torchestimator.export.saved_model import (
    METADATA_FILE,
    SIGNATURE_FILE,
    SIGNATURE_FORMAT_VERSION,
    SIGNATURE_FORMAT_WITH_DECODERS,
    SIGNATURE_FORMAT_WITH_RECEIVER_INPUTS,
)
from torchestimator.export.versions import latest_version

__all__ = ["ExportedModel", "LiftedCall", "Signature", "TensorInfo", "load", "read_inputs"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TensorInfo:
    """One signature input or output: dtype name and shape (-1 where dynamic)."""

    dtype: str
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Signature:
    """A served signature: TF's SignatureDef in JSON."""

    name: str
    method: str
    """predict, classify or regress."""
    method_name: str
    """TF's method string, e.g. tensorflow/serving/predict."""
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    program_outputs: dict[str, str]
    """output alias -> the key the program returns it under."""
    receiver_inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    """input name -> the receiver input it feeds, for inputs named otherwise (TF's "inputs" of a classify or
    regress signature over one string input, such as build_parsing_serving_input_receiver's "examples")."""

    def receiver_input(self, name: str) -> str:
        """The receiver input (and so the decode step) that signature input ``name`` feeds."""
        return self.receiver_inputs.get(name, name)


class ExportedModel:
    """A loaded export version: call it with {input name: array} to get {output name: numpy array}."""

    def __init__(self, path: str, program: Any, document: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
        self.path = path
        self.metadata = dict(metadata)
        self._program = program
        self._module = _without_input_constraint_hook(program.module())
        self._program_inputs = list(document["program_inputs"])
        renames = document["format_version"] == SIGNATURE_FORMAT_WITH_RECEIVER_INPUTS
        self._signatures = {
            name: _signature(name, entry, path, renames) for name, entry in document["signatures"].items()
        }
        self._decoders, self._program_infos = _decode_plan(document, self._signatures, path)
        if self._decoders:
            _check_decoded_against_program(program, self._program_infos, path)
        # The graph itself, called without the unlifted module's pytree and attribute walk when its calling
        # convention is the plain one (checked once here); None: every call goes through the module.
        self._lifted = LiftedCall.build(program, self._program_inputs)
        # Parsed once; a dtype name torch does not know stays None so the call reports it, as before.
        self._input_dtypes = {
            (name, key): _known_dtype(info.dtype)
            for name, signature in self._signatures.items()
            for key, info in signature.inputs.items()
        }
        self._program_dtypes = {key: _known_dtype(info.dtype) for key, info in self._program_infos.items()}

    def __repr__(self) -> str:
        return f"ExportedModel({self.path!r}, signatures={self.signature_names})"

    @property
    def version(self) -> int | None:
        name = os.path.basename(os.path.normpath(self.path))
        return int(name) if name.isdigit() else None

    @property
    def signature_names(self) -> list[str]:
        return sorted(self._signatures)

    @property
    def program_inputs(self) -> dict[str, TensorInfo]:
        """The tensors the program takes: the signature's inputs, each string input replaced by what its decode
        step makes (the same as the signature's inputs when there is no string input)."""
        return dict(self._program_infos)

    @property
    def decode_steps(self) -> dict[str, DecodeStep]:
        """string input name -> the decode step signature.json records for it (empty without string inputs)."""
        return dict(self._decoders)

    def signature(self, name: str = DEFAULT_SERVING_SIGNATURE_DEF_KEY) -> Signature:
        if name not in self._signatures:
            raise InputError(f"{self.path} has no signature {name!r}; it has {self.signature_names}.")
        return self._signatures[name]

    def __call__(
        self,
        inputs: Mapping[str, Any] | np.ndarray | torch.Tensor,
        signature_name: str = DEFAULT_SERVING_SIGNATURE_DEF_KEY,
        output_keys: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Runs one batch. Arrays and tensors must have the signature's dtype; lists are converted to it.

        A string input takes a list of bytes (str is encoded UTF-8) or a 1-D
        bytes/object array; its decode step runs first. The program's own
        inputs (``prepare_inputs``' result) are taken as they are. An input the
        signature names otherwise than the receiver (TF's "inputs" of a classify
        or regress signature) may also be given under the receiver's name
        ("examples"), as before signatures named it so.
        """
        signature = self.signature(signature_name)
        tensors = self._prepare(inputs, signature)
        wanted = _select_outputs(signature, output_keys, self.path)
        with torch.no_grad():
            if self._lifted is not None:
                results = self._lifted(tensors)
            else:
                results = self._module({name: tensors[name] for name in self._program_inputs})
        return {alias: _to_numpy(results[signature.program_outputs[alias]]) for alias in wanted}

    predict = __call__

    def prepare_inputs(
        self, inputs: Any, signature_name: str = DEFAULT_SERVING_SIGNATURE_DEF_KEY
    ) -> dict[str, torch.Tensor]:
        """The program's input tensors, checked against the signature; errors name the input and the mismatch.

        String inputs are decoded here (their decode step), so what comes back
        is plain tensors that concatenate along the batch; given those tensors
        again, it checks them and hands them back.
        """
        return self._prepare(inputs, self.signature(signature_name))

    def _prepare(self, inputs: Any, signature: Signature) -> dict[str, torch.Tensor]:
        if type(inputs) is not dict and not isinstance(inputs, Mapping):  # a plain dict skips the ABC check
            if len(signature.inputs) != 1:
                raise InputTypeError(
                    f"Inputs must be a dict of name -> array for signature {signature.name!r}, which takes "
                    f"{_describe_inputs(signature)}; received {type(inputs).__name__}."
                )
            inputs = {next(iter(signature.inputs)): inputs}
        if self._decoders:
            return self._prepare_decoded(inputs, signature)
        _check_input_names(inputs, signature, self.path)
        tensors = {
            name: _as_tensor(name, inputs[name], info, self._input_dtypes[signature.name, name])
            for name, info in signature.inputs.items()
        }
        _check_batch(tensors, signature)
        return tensors

    def _prepare_decoded(self, inputs: Mapping[str, Any], signature: Signature) -> dict[str, torch.Tensor]:
        """The program's tensors from the signature's inputs (decoding the strings), or checked when given them."""
        tensors: dict[str, torch.Tensor]
        if inputs.keys() == self._program_infos.keys():  # already decoded (a batch the scheduler concatenated)
            tensors = {
                name: _as_tensor(name, inputs[name], info, self._program_dtypes[name])
                for name, info in self._program_infos.items()
            }
            _check_batch(
                tensors,
                Signature(
                    name=signature.name,
                    method=signature.method,
                    method_name="",
                    inputs=self._program_infos,
                    outputs={},
                    program_outputs={},
                ),
            )
            return tensors
        if signature.receiver_inputs and inputs.keys() != signature.inputs.keys():
            inputs = _under_signature_names(inputs, signature)
        _check_input_names(inputs, signature, self.path)
        tensors = {}
        sizes: dict[str, int] = {}
        for name, info in signature.inputs.items():
            if info.dtype == STRING:
                values = _string_values(name, inputs[name])
                sizes[name] = len(values)
                decoded = self._decoders[signature.receiver_input(name)].decode(values, name)
                for key, array in decoded.items():
                    tensors[key] = torch.from_numpy(np.ascontiguousarray(array))
            else:
                tensors[name] = _as_tensor(name, inputs[name], info, self._input_dtypes[signature.name, name])
                if info.shape and info.shape[0] == -1:
                    sizes[name] = int(tensors[name].shape[0])
        if len(set(sizes.values())) > 1:
            raise InputError(f"Inputs must share one batch size; received {sizes}.")
        missing = [name for name in self._program_infos if name not in tensors]
        if missing:  # a decode step that made fewer arrays than it declares: ours, not the caller's
            raise AssertionError(f"the decode steps of {self.path} did not make {missing}")
        return {name: tensors[name] for name in self._program_infos}


class LiftedCall:
    """The exported graph called directly: parameters and buffers passed as its leading inputs, no pytree walk.

    ``program.module()`` wraps the graph in a module that flattens the input
    dict with pytree, fetches every parameter by attribute and unflattens the
    outputs on each call (~100 us of Python per call, more than a small MLP's
    forward). When the program's calling convention is the plain one (one
    dict of tensors in, a flat dict of tensors out, no mutations, no tokens or
    custom objects) ``build`` resolves all of that once and the call is the
    graph's own ``forward``. The shape ranges torch.export recorded for the
    inputs' symbolic sizes are checked here, since the module's guards are
    skipped (prepare_inputs has checked names, dtypes and static sizes).
    """

    def __init__(
        self,
        forward: Any,
        constants: list[torch.Tensor],
        input_names: list[str],
        output_positions: dict[str, int],
        ranges: list[tuple[str, int, int, float]],
    ) -> None:
        self._forward = forward
        self._constants = constants
        self._input_names = input_names
        self._output_positions = output_positions
        self._ranges = ranges
        """(input name, dim, lowest, highest) for every symbolic size with a bound that can be broken."""

    @classmethod
    def build(cls, program: Any, program_inputs: list[str]) -> LiftedCall | None:
        """The direct call for this program, or None when its convention is not the plain one."""
        try:
            return cls._build(program, program_inputs)
        except (AttributeError, KeyError, TypeError, ValueError):  # an unexpected program layout: the module path
            return None

    @classmethod
    def _build(cls, program: Any, program_inputs: list[str]) -> LiftedCall | None:
        import torch.utils._pytree as pytree
        from torch.export.graph_signature import InputKind, OutputKind

        if pytree.tree_structure(((dict.fromkeys(program_inputs, 0),), {})) != program.call_spec.in_spec:
            return None
        specs = program.graph_signature.input_specs
        user = [index for index, spec in enumerate(specs) if spec.kind == InputKind.USER_INPUT]
        if user != list(range(len(specs) - len(program_inputs), len(specs))):  # lifted state first, then ours
            return None
        state = {**program.state_dict, **program.constants}
        lifted_kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
        if not all(
            spec.kind in lifted_kinds and isinstance(state.get(spec.target), torch.Tensor)
            for spec in specs[: user[0] if user else len(specs)]
        ):
            return None
        constants = [state[spec.target].detach() for spec in specs if spec.kind != InputKind.USER_INPUT]
        outputs = program.graph_signature.output_specs
        if not all(spec.kind == OutputKind.USER_OUTPUT for spec in outputs):
            return None
        positions = pytree.tree_unflatten(list(range(len(outputs))), program.call_spec.out_spec)
        if not isinstance(positions, dict) or not all(type(value) is int for value in positions.values()):
            return None
        placeholders = [node for node in program.graph.nodes if node.op == "placeholder"][len(constants) :]
        ranges = _symbolic_ranges(program, program_inputs, placeholders)
        if ranges is None:
            return None
        return cls(program.graph_module.forward, constants, list(program_inputs), positions, ranges)

    def __call__(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for name, dim, lowest, highest in self._ranges:
            size = tensors[name].shape[dim]
            if not lowest <= size <= highest:
                raise InputError(
                    f"Input {name!r} has size {size} in dimension {dim}; the exported program accepts "
                    f"{lowest} to {highest} there (the range torch.export recorded)."
                )
        flat = self._forward(*self._constants, *[tensors[name] for name in self._input_names])
        return {key: flat[position] for key, position in self._output_positions.items()}


def _symbolic_ranges(
    program: Any, names: list[str], placeholders: list[Any]
) -> list[tuple[str, int, int, float]] | None:
    """The breakable bounds of the user inputs' symbolic sizes; None when a size is an expression (not a symbol)."""
    import sympy

    if len(placeholders) != len(names):
        return None
    ranges: list[tuple[str, int, int, float]] = []
    for name, node in zip(names, placeholders):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            return None
        for dim, size in enumerate(value.shape):
            if isinstance(size, int):
                continue  # static: prepare_inputs checks it against the signature
            symbol = size.node.expr
            if not isinstance(symbol, sympy.Symbol):
                return None
            bounds = program.range_constraints.get(symbol)
            lowest = _finite_bound(bounds.lower, 0) if bounds is not None else 0
            highest = _finite_bound(bounds.upper, float("inf")) if bounds is not None else float("inf")
            if lowest > 0 or highest != float("inf"):
                ranges.append((name, dim, lowest, highest))
    return ranges


def _finite_bound(value: Any, unbounded: float) -> float:
    """A range bound as an int; sympy's (int_)oo, which int() cannot convert, as ``unbounded``."""
    text = str(value)
    return int(text) if text.lstrip("-").isdigit() else unbounded


def load(path: str | os.PathLike[str]) -> ExportedModel:
    """Loads a version folder, or the highest integer version under a base folder.

    ``path`` may be an object-store URL (``s3://bucket/models/m`` or ``.../m/<version>``): the version is
    copied to a local cache folder, each file checked against the sha256 its metadata.json records, and
    loaded from there (_store_versions.py); a verified copy already cached is reused.
    """
    path = os.fspath(path)
    if is_url(path):
        path = _local_copy(path)
    path = local_path(path)
    if not os.path.isdir(path):
        raise ExportFormatError(f"Exported model path {path!r} is not a folder. Pass a version folder or its base.")
    if not any(os.path.exists(os.path.join(path, name)) for name in (PROGRAM_FILE, LEGACY_FILE, SIGNATURE_FILE)):
        version = latest_version(path)
        if version is None:
            # Never list the folder's contents: this message reaches the server's status page.
            raise ExportFormatError(
                f"{path} is neither an export version nor a base holding integer version folders: a version folder "
                f"holds {PROGRAM_FILE}, {TENSORS_FILE} and {SIGNATURE_FILE}, as export_saved_model writes them. "
                "Pass a version folder or its base; incomplete temp-* folders are never loaded."
            )
        path = version
    if not os.path.exists(os.path.join(path, PROGRAM_FILE)) and os.path.exists(os.path.join(path, LEGACY_FILE)):
        raise ExportFormatError(
            f"{path} holds {LEGACY_FILE}, the torch.export archive earlier torchestimator versions wrote; loading it "
            f"would unpickle parts of it, and loading never runs code from a file, so it is not opened. Re-export the "
            f"model with this torchestimator (it writes {PROGRAM_FILE} and {TENSORS_FILE})."
        )
    signature_path, metadata_path = os.path.join(path, SIGNATURE_FILE), os.path.join(path, METADATA_FILE)
    document = _checked_signature_document(
        _read_json(signature_path, _read_export_file, ExportFormatError), signature_path
    )
    metadata = _read_json(metadata_path, _read_export_file, ExportFormatError) if os.path.lexists(metadata_path) else {}
    if not isinstance(metadata, dict):
        raise ExportFormatError(f"{metadata_path} must hold a JSON object; it holds {type(metadata).__name__}.")
    program = decode(
        _read_export_file(os.path.join(path, PROGRAM_FILE), _MAX_PROGRAM_BYTES),
        _read_export_file(os.path.join(path, TENSORS_FILE), _MAX_TENSORS_BYTES),
        path,
    )
    return ExportedModel(path, program, document, metadata)


def _local_copy(url: str) -> str:
    """The verified local copy of the version at ``url``, or of the newest complete version under it."""
    from torchestimator.export import _store_versions

    url = url.rstrip("/")
    if not _store_versions.has_metadata(url):
        newest = latest_version(url)
        if newest is None and url.rsplit("/", 1)[-1].isdigit():
            return _store_versions.fetch_version(url)  # says the version is incomplete
        if newest is None:
            raise ExportFormatError(
                f"{url} is neither a complete export version nor a base holding one: a version in an object store "
                f"counts once its {METADATA_FILE} is uploaded, after every other file (export_saved_model does "
                "this); an upload in progress or cut short is never loaded."
            )
        url = newest
    return _store_versions.fetch_version(url)


def read_inputs(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Inputs from an .npz file, or a JSON file in any of TF Serving's forms.

    JSON: {"inputs": {name: values}} (columnar), {"instances": [{name: value}, ...]}
    (row), or a plain {name: values}. JSON values stay lists so the model casts
    them to the signature's dtype; ``{"b64": "..."}`` objects become bytes (for
    string inputs, as TF Serving reads them).
    """
    path = os.fspath(path)
    if path.lower().endswith(".npz"):  # INPUTS.NPZ too
        try:
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        except (zipfile.BadZipFile, EOFError, ValueError) as error:  # not a zip, cut short, object arrays, bad header
            raise InputError(
                f"{path} is not a readable .npz of plain arrays ({type(error).__name__}: {error})."
            ) from None
    try:
        document = _read_json(path)
    except ValueError as error:
        raise InputError(f"{path} is neither .npz nor valid JSON: {error}") from error
    if not isinstance(document, Mapping):
        raise InputError(
            f"{path} must hold a JSON object ({{'inputs': ...}}, {{'instances': [...]}}, or name -> values)."
        )
    if "instances" in document:
        instances = document["instances"]
        if not isinstance(instances, list) or not instances or not all(isinstance(row, Mapping) for row in instances):
            raise InputError(f"{path}: 'instances' must be a non-empty list of {{name: value}} objects.")
        if any(list(row) == ["b64"] for row in instances):
            raise InputError(
                f"{path}: 'instances' are {{\"b64\": ...}} values without an input name, which only a "
                'reader that knows the signature can place; name the input ({"instances": '
                '[{"image_bytes": {"b64": ...}}]}), or run `torchestimator predict --exported DIR '
                "--input FILE`, which reads the request as the server does."
            )
        return {name: _b64_to_bytes([row.get(name) for row in instances], path) for name in instances[0]}
    inputs = document.get("inputs", document)
    if not isinstance(inputs, Mapping):
        raise InputError(f"{path}: 'inputs' must be an object of name -> values.")
    return {name: _b64_to_bytes(value, path) for name, value in inputs.items()}


def _b64_to_bytes(value: Any, path: str, depth: int = 0) -> Any:
    """JSON values with every {"b64": "..."} object decoded to bytes (padding optional, as TF Serving)."""
    if isinstance(value, list) and depth < 64:
        return [_b64_to_bytes(item, path, depth + 1) for item in value]
    if isinstance(value, dict) and list(value) == ["b64"] and isinstance(value["b64"], str):
        import base64
        import binascii

        try:
            return base64.b64decode(value["b64"] + "=" * (-len(value["b64"]) % 4), validate=True)
        except (binascii.Error, ValueError) as error:
            raise InputError(f'{path}: invalid base64 in {{"b64": ...}} ({error}).') from None
    return value


def _under_signature_names(inputs: Mapping[str, Any], signature: Signature) -> dict[str, Any]:
    """``inputs`` with each receiver name the signature calls otherwise put under the signature's name."""
    renamed = dict(inputs)
    for name, receiver_input in signature.receiver_inputs.items():
        if receiver_input in renamed and name not in renamed and receiver_input not in signature.inputs:
            renamed[name] = renamed.pop(receiver_input)
    return renamed


def _signature(name: str, entry: Mapping[str, Any], path: str, renames: bool) -> Signature:
    """``renames``: the file's format records receiver_input (a signature input named otherwise than the
    receiver input it feeds); in an older format the key is refused, as any hand-made key would be."""

    def infos(section: str) -> dict[str, TensorInfo]:
        result = {
            key: TensorInfo(dtype=value["dtype"], shape=tuple(value["shape"] or ()))
            for key, value in entry[section].items()
        }
        for key, info in result.items():
            if not isinstance(info.dtype, str) or not all(type(size) is int and size >= -1 for size in info.shape):
                raise ValueError(
                    f"{section[:-1]} {key!r} has dtype {info.dtype!r} and shape {list(info.shape)[:8]}; "
                    "expected a dtype name and sizes that are integers (-1 where dynamic)"
                )
        return result

    def receiver_inputs() -> dict[str, str]:
        named = {key: value["receiver_input"] for key, value in entry["inputs"].items() if "receiver_input" in value}
        for key, receiver_input in named.items():
            if not renames:
                raise ValueError(
                    f"input {key!r} records a receiver_input, which only format_version "
                    f"{SIGNATURE_FORMAT_WITH_RECEIVER_INPUTS} files hold"
                )
            if not isinstance(receiver_input, str) or not receiver_input or receiver_input == key:
                raise ValueError(
                    f"input {key!r} has receiver_input {str(receiver_input)[:60]!r}; expected the name "
                    "of the receiver input it feeds, which differs from the input's own"
                )
            if entry["inputs"][key]["dtype"] != STRING:
                raise ValueError(
                    f"input {key!r} records a receiver_input but is not a string input; only a "
                    "string input is named otherwise than its receiver input"
                )
        return named

    try:
        return Signature(
            name=name,
            method=entry["method"],
            method_name=entry["method_name"],
            inputs=infos("inputs"),
            outputs=infos("outputs"),
            program_outputs={key: value["program_output"] for key, value in entry["outputs"].items()},
            receiver_inputs=receiver_inputs(),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise ExportFormatError(
            f"{os.path.join(path, SIGNATURE_FILE)}: signature {name!r} is malformed ({error})."
        ) from None


def _decode_plan(
    document: Mapping[str, Any], signatures: Mapping[str, Signature], path: str
) -> tuple[dict[str, DecodeStep], dict[str, TensorInfo]]:
    """The decode steps of the string inputs, rebuilt from signature.json, and the program's input infos.

    Checked against each other: the program inputs must be the tensor inputs
    followed by the decoded tensors, so a hand-edited file cannot feed the
    program tensors of another shape than it was traced on.
    """
    where = os.path.join(path, SIGNATURE_FILE)
    entries = document.get("decoders", {})
    decoders = {name: decoder_from_json(entry, f"{where}: decoders[{name!r}]") for name, entry in entries.items()}
    first = next(iter(signatures.values()), None)
    if first is None:
        return decoders, {}
    for signature in signatures.values():
        for name, receiver_input in signature.receiver_inputs.items():
            if receiver_input not in decoders:
                raise ExportFormatError(
                    f"{where}: signature {signature.name!r} input {name!r} feeds receiver input "
                    f"{receiver_input!r}, which has no decode step (the file has them for "
                    f"{sorted(decoders)}); the file was changed after export. Re-export the model."
                )
        strings = [name for name, info in signature.inputs.items() if info.dtype == STRING]
        fed = sorted(signature.receiver_input(name) for name in strings)
        if fed != sorted(decoders):
            raise ExportFormatError(
                f"{where}: signature {signature.name!r} has string inputs feeding {fed}, and "
                f"the file has decode steps for {sorted(decoders)}; each string input needs one."
            )
        for name in strings:
            if signature.inputs[name].shape != (-1,):
                raise ExportFormatError(
                    f"{where}: string input {name!r} has shape {list(signature.inputs[name].shape)}"
                    "; string inputs are a batch of bytes, shape [-1]."
                )
    infos = {name: info for name, info in first.inputs.items() if info.dtype != STRING}
    for step in decoders.values():
        for name, (dtype, shape) in step.outputs().items():
            infos[name] = TensorInfo(
                dtype=dtype_name(dtype), shape=tuple(-1 if size is None else size for size in shape)
            )
    program_inputs = list(document["program_inputs"])
    if sorted(infos) != sorted(program_inputs):  # signature.json's objects are written with sorted keys
        raise ExportFormatError(
            f"{where}: 'program_inputs' is {program_inputs[:16]}, but the signature's inputs "
            f"and decode steps make {sorted(infos)[:16]}."
        )
    return decoders, {name: infos[name] for name in program_inputs}


def _check_decoded_against_program(program: Any, infos: Mapping[str, TensorInfo], path: str) -> None:
    """The decode steps make what the program was traced on: dtype and every static size of each input."""
    try:
        names = list(program.graph_signature.user_inputs)
        nodes = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
        traced = [nodes[name].meta["val"] for name in names]
    except (AttributeError, KeyError):  # an unexpected program layout: the call's own guards still check
        return
    if len(traced) != len(infos):
        raise ExportFormatError(
            f"{os.path.join(path, SIGNATURE_FILE)}: the program takes {len(traced)} inputs and "
            f"'program_inputs' names {len(infos)}."
        )
    for (name, info), value in zip(infos.items(), traced):
        sizes = [size if isinstance(size, int) else -1 for size in value.shape]
        if (
            dtype_name(value.dtype) != info.dtype
            or len(sizes) != len(info.shape)
            or any(want not in (-1, size) for want, size in zip(info.shape, sizes))
        ):
            raise ExportFormatError(
                f"{os.path.join(path, SIGNATURE_FILE)}: the decode steps make {name!r} as {info.dtype} "
                f"{list(info.shape)}, but the program was traced on {dtype_name(value.dtype)} {sizes}; the file was "
                "changed after export. Re-export the model."
            )


def _string_values(name: str, value: Any) -> list[bytes]:
    """A string input's batch as a list of bytes: from bytes/str items (str is UTF-8), or a 1-D bytes/object array.

    A fixed-width bytes array (dtype 'S') cannot hold trailing NUL bytes (numpy drops them), so serialized
    records that may end in one belong in a list or an object array.
    """
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "OSU":
            raise InputTypeError(
                f"Input {name!r} is a string input (a batch of bytes, shape [-1]); received a numpy "
                f"array of dtype {value.dtype} and shape {list(value.shape)}. Pass a list of bytes or a "
                "1-D array of bytes."
            )
        value = value.tolist()
    if isinstance(value, (bytes, bytearray, str)) or not isinstance(value, (list, tuple)):
        raise InputTypeError(
            f"Input {name!r} is a string input (a batch of bytes, shape [-1]); received "
            f"{type(value).__name__}. Pass a list with one bytes value per instance, e.g. [png_bytes]."
        )
    values = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            values.append(item.encode("utf-8"))
        elif isinstance(item, (bytes, bytearray, memoryview)):
            values.append(bytes(item))
        else:
            raise InputTypeError(
                f"Input {name!r}, instance {index}: expected bytes (or str); received "
                f"{type(item).__name__}. A string input takes one bytes value per instance."
            )
    return values


def _check_input_names(inputs: Mapping[str, Any], signature: Signature, path: str) -> None:
    """InputError naming the missing and unexpected inputs unless ``inputs`` has exactly the signature's names."""
    if inputs.keys() != signature.inputs.keys():
        missing = [name for name in signature.inputs if name not in inputs]
        unexpected = [name for name in inputs if name not in signature.inputs]
        raise InputError(
            f"Signature {signature.name!r} of {path} takes inputs {_describe_inputs(signature)}; "
            f"missing {missing}, unexpected {unexpected}."
        )


def _known_dtype(name: str) -> torch.dtype | None:
    try:
        return parse_dtype(name, "dtype")
    except TypeError:
        return None


def _as_tensor(name: str, value: Any, info: TensorInfo, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is None:
        dtype = parse_dtype(info.dtype, f"signature input {name!r} dtype")
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype == object:
            raise InputTypeError(f"Input {name!r} is an object array; expected {info.dtype}.")
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    else:  # lists and Python scalars (JSON) carry no dtype of their own: take the signature's
        try:
            tensor = torch.tensor(value, dtype=dtype)
        except (TypeError, ValueError, RuntimeError) as error:
            raise InputError(f"Input {name!r} could not be read as {info.dtype} {list(info.shape)}: {error}") from error
    if tensor.dtype != dtype:
        raise InputTypeError(
            f"Input {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}; the signature expects {info.dtype}. "
            f"Convert it first (e.g. array.astype('{info.dtype}'))."
        )
    expected = info.shape
    if tensor.dim() != len(expected) or any(
        size != -1 and size != actual for size, actual in zip(expected, tensor.shape)
    ):
        raise InputError(
            f"Input {name!r} has shape {list(tensor.shape)}; the signature expects {list(expected)} (-1 = any size)."
        )
    return tensor if tensor.device.type == "cpu" else tensor.cpu()


def _check_batch(tensors: Mapping[str, torch.Tensor], signature: Signature) -> None:
    sizes = {
        name: int(tensor.shape[0])
        for name, tensor in tensors.items()
        if signature.inputs[name].shape and signature.inputs[name].shape[0] == -1
    }
    if len(set(sizes.values())) > 1:
        raise InputError(f"Inputs must share one batch size; received {sizes}.")


def _select_outputs(signature: Signature, output_keys: list[str] | None, path: str) -> list[str]:
    if output_keys is None:
        return list(signature.outputs)
    unknown = [key for key in output_keys if key not in signature.outputs]
    if unknown:
        raise InputError(
            f"Signature {signature.name!r} of {path} has no outputs {unknown}; it has {sorted(signature.outputs)}."
        )
    return list(output_keys)


def _describe_inputs(signature: Signature) -> str:
    return (
        "{" + ", ".join(f"{name!r}: {info.dtype} {list(info.shape)}" for name, info in signature.inputs.items()) + "}"
    )


def _without_input_constraint_hook(module: torch.nn.Module) -> torch.nn.Module:
    """The unlifted module without torch.export's pytree-walking input check (~80 us of a ~190 us MLP call).

    Every call goes through prepare_inputs first, which checks names, dtypes
    and static sizes against the signature, and the module's own guard
    function still checks the shapes torch.export assumed, so nothing goes
    unchecked. If torch renames the hook, it simply stays.
    """
    for key, hook in list(module._forward_pre_hooks.items()):
        if getattr(hook, "__name__", "") == "_check_input_constraints_pre_hook":
            del module._forward_pre_hooks[key]
    return module


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
        tensor = tensor.float()
    return tensor.numpy()


# What a version's JSON files may hold: graphs of big models with their metadata stay far below these.
_MAX_PROGRAM_BYTES = 1 << 30
_MAX_JSON_BYTES = 64 << 20
_MAX_TENSORS_BYTES = sys.maxsize  # the weights are as big as the model; the file's real size bounds the read


def _read_export_file(path: str, limit: int = _MAX_JSON_BYTES) -> bytes:
    """A version folder's file: a regular file (a FIFO or device named program.json must not block or stream
    forever) of at most ``limit`` bytes."""
    try:
        return read_regular_file(path, limit)
    except FileNotFoundError as error:
        raise ExportFormatError(f"{path} is missing: the export folder is incomplete or not an export.") from error
    except NotARegularFileError as error:
        raise ExportFormatError(
            f"{path} is not a regular file (a FIFO, device or folder); an export holds files only."
        ) from error
    except FileTooLargeError as error:
        raise ExportFormatError(
            f"{path} holds {error.size} bytes, more than the {limit} an export's file may hold."
        ) from error


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError as error:
        raise InputError(f"{path} does not exist; give the path of a .npz or JSON file of inputs.") from error


def _read_json(path: str, read=_read_bytes, error_class: type[ValueError] = InputError) -> Any:
    """``path``'s JSON; ``error_class`` (ExportFormatError for an export's own files) names the file otherwise."""
    data = read(path)
    try:
        return json.loads(data)
    except RecursionError:
        raise error_class(f"{path} is not valid JSON: its values are nested too deeply.") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, integers past Python's digit limit
        raise error_class(f"{path} is not valid JSON ({error}).") from None


def _checked_signature_document(document: Any, path: str) -> dict[str, Any]:
    """signature.json with the types ExportedModel reads, so a malformed one is an error naming the file."""
    if not isinstance(document, dict):
        raise ExportFormatError(f"{path} must hold a JSON object; it holds {type(document).__name__}.")
    version = document.get("format_version")
    known = (SIGNATURE_FORMAT_VERSION, SIGNATURE_FORMAT_WITH_DECODERS, SIGNATURE_FORMAT_WITH_RECEIVER_INPUTS)
    if version not in known:
        raise ExportFormatError(
            f"{path} has format_version {version!r}; this torchestimator reads {', '.join(map(str, known))}. "
            "Re-export with this version or upgrade torchestimator."
        )
    decoders = document.get("decoders")
    if (version != SIGNATURE_FORMAT_VERSION) != isinstance(decoders, dict) or (
        decoders is not None and (not isinstance(decoders, dict) or not decoders)
    ):
        raise ExportFormatError(
            f"{path}: format_version {SIGNATURE_FORMAT_WITH_DECODERS} or later and a non-empty "
            "'decoders' object (the decode steps of string inputs) go together; this file has "
            f"format_version {version!r} and 'decoders' {str(decoders)[:60]}."
        )
    inputs, signatures = document.get("program_inputs"), document.get("signatures")
    if not isinstance(inputs, list) or not all(isinstance(name, str) for name in inputs):
        raise ExportFormatError(f"{path}: 'program_inputs' must be a list of input names; it is {str(inputs)[:80]}.")
    if not isinstance(signatures, dict) or not all(isinstance(entry, dict) for entry in signatures.values()):
        raise ExportFormatError(f"{path}: 'signatures' must be an object of name -> signature objects.")
    return document
