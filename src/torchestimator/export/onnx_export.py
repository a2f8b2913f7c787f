"""model.onnx beside an export's torch.export program (``as_onnx=True``, ``torchestimator export --onnx``).

What belongs here: checking the packages ONNX export needs, converting the
traced program with torch.onnx's dynamo converter, naming the ONNX inputs and
outputs, and the record that says how to call the file. Not here: tracing
(saved_model.py), reading exports back (loader.py: model.onnx is for
onnxruntime and other ONNX runtimes; torchestimator never loads it).

How model.onnx is called:

    inputs   the program's inputs (signature.json's program_inputs), in the receiver's order, with their
             dtypes; the batch axis is the dim_param "batch" (other dynamic axes are named as the program's
             Dims), every other size as the receiver gives it. For a receiver with string inputs
             (build_parsing_serving_input_receiver, build_image_serving_input_receiver) these are the decoded
             tensors: the decode step runs outside the program, so model.onnx takes what it makes (parsed
             features, decoded images), and the record's ``decoded_outside`` says which string input each came
             from and by which step (signature.json's ``decoders`` holds the step itself)
    outputs  named by the program output keys of signature.json, ``<signature>/<alias>``
             (``serving_default/class``): each signature's ``program_output`` is the ONNX output
             name of that alias, as it is the program's
    files    model.onnx alone; with more than SINGLE_FILE_LIMIT (1.5 GiB) of weights also model.onnx.data
             (one protobuf message cannot pass 2 GiB), which ONNX runtimes read from beside it

The same record (inputs, outputs, signatures -> {alias: output name}) is
written to metadata.json's ``onnx`` entry and into the file itself, as the
metadata property ``torchestimator.signatures`` (JSON), so a model.onnx copied
away from its folder still says which output is which.

Why an explicit request fails rather than warns: ``as_onnx=True`` that writes
no model.onnx is found out only when a deployment looks for the file, long
after the export that could have said why. So missing packages are a
MissingExtraError before any tracing, and an operator the converter cannot
express is a ConfigError naming the model and the operator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib
import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from torchestimator.errors import ConfigError, MissingExtraError
from torchestimator.export.receiver import dtype_name

__all__ = ["METADATA_PROPERTY", "ONNX_FILE", "OnnxModel", "convert_to_onnx", "require_onnx_packages"]

ONNX_FILE = "model.onnx"
METADATA_PROPERTY = "torchestimator.signatures"
RECORD_FORMAT_VERSION = 1
# The converter needs both; onnxruntime (also in the extra) is only needed to run the file.
_PACKAGES = ("onnx", "onnxscript")
_EXTRA = "onnx"
# Above this many bytes of weights the file keeps them in model.onnx.data: one protobuf message cannot pass 2 GiB
# (the threshold torch.onnx uses itself).
SINGLE_FILE_LIMIT = 1536 * 1024 * 1024
# The loggers of the ONNX optimizer's passes (onnxscript's rewriter and constant folding, onnx_ir's passes).
_OPTIMIZER_LOGGERS = ("onnxscript", "onnx_ir")
_NO_TRANSLATION = re.compile(r"No ONNX function found for <OpOverload\(op='([^']+)', overload='([^']+)'\)>")


def require_onnx_packages() -> None:
    """Imports onnx and onnxscript, or raises MissingExtraError naming ``pip install 'torchestimator[onnx]'``."""
    for module in _PACKAGES:
        try:
            importlib.import_module(module)
        except ImportError as error:
            missing = (error.name or "").partition(".")[0]
            if isinstance(error, ModuleNotFoundError) and missing == module:
                message = (
                    f"ONNX export (as_onnx=True, export --onnx) needs {module}: pip install 'torchestimator[onnx]'"
                )
            else:  # installed but broken or too old: one of its own dependencies missing, a name it lacks
                cause = " ".join(str(error).split())
                message = (
                    f"ONNX export (as_onnx=True, export --onnx) needs {module}, which could not be imported "
                    f"({cause}): pip install --upgrade 'torchestimator[onnx]'"
                )
            message += "; or export without as_onnx (the torch.export program does not need it)"
            raise MissingExtraError(message, module=module, extra=_EXTRA) from None


@dataclasses.dataclass(frozen=True)
class OnnxModel:
    """A converted program, not yet written: what it will take on disk, and the record metadata.json keeps."""

    program: Any
    """torch.onnx.ONNXProgram."""
    record: dict[str, Any]
    """inputs, outputs, signatures (alias -> ONNX output name), opset, files."""
    weight_bytes: int

    def write(self, folder: str, write_file: Callable[[str, bytes], None]) -> None:
        """Writes model.onnx (and model.onnx.data past SINGLE_FILE_LIMIT) into ``folder``.

        A single file goes through ``write_file`` (the export's durable writer, whose OSError names the file).
        """
        path = os.path.join(folder, ONNX_FILE)
        if self.weight_bytes <= SINGLE_FILE_LIMIT:
            write_file(path, self.program.model_proto.SerializeToString())
            return
        try:
            self.program.save(path, external_data=True)
        except OSError as error:
            reason = "disk full" if error.errno == errno.ENOSPC else (error.strerror or str(error))
            raise OSError(error.errno, f"Could not write the ONNX model and its weights ({reason})", path) from error

    def estimated_bytes(self) -> int:
        """About what the files take: the weights, and room for the graph."""
        return self.weight_bytes + 1024 * 1024


def convert_to_onnx(
    program: Any, receiver: Any, examples: Mapping[str, torch.Tensor], signatures: Mapping[str, Any], model_name: str
) -> OnnxModel:
    """The export's traced ``program`` as ONNX, inputs named as the receiver's, outputs as the program's keys.

    ``signatures`` is signature.json's document; ``model_name`` names the model in errors.
    """
    import torch.onnx

    input_names = list(receiver.program_specs())
    output_names = _program_output_keys(program)
    try:
        # verbose=False: the converter otherwise prints its progress to stdout, where `export` prints the path.
        with _converter_noise_dropped():
            onnx_program = torch.onnx.export(
                program,
                (dict(examples),),
                dynamo=True,
                input_names=input_names,
                output_names=output_names,
                dynamic_shapes=(_axis_names(receiver),),
                verbose=False,
                optimize=True,
            )
    except OSError:
        raise  # not the model's fault (a full disk, no usable temporary directory): export_saved_model names it
    except Exception as error:  # the converter raises many types; each means "this program has no ONNX form"
        raise _conversion_error(error, program, model_name, receiver) from error
    assert onnx_program is not None  # dynamo=True returns the program (only the legacy exporter returns None)
    graph = onnx_program.model.graph
    converted = ([value.name for value in graph.inputs], [value.name for value in graph.outputs])
    if converted != (input_names, output_names):
        raise ConfigError(
            f"as_onnx=True: torch.onnx converted model {model_name} with inputs {converted[0]} and outputs "
            f"{converted[1]}, not the export's inputs {input_names} and outputs {output_names}; model.onnx would not "
            "be callable as signature.json says. Export without as_onnx, or report it with the model.",
            field="as_onnx",
            value=True,
        )
    weight_bytes = sum(_nbytes(value) for value in (*program.state_dict.values(), *program.constants.values()))
    files = [ONNX_FILE] if weight_bytes <= SINGLE_FILE_LIMIT else [ONNX_FILE, ONNX_FILE + ".data"]
    record = {**_record(receiver, signatures, output_names, onnx_program), "files": files}
    onnx_program.model.metadata_props[METADATA_PROPERTY] = json.dumps(record, sort_keys=True)
    return OnnxModel(program=onnx_program, record=record, weight_bytes=weight_bytes)


class _TorchvisionAbsent(logging.Filter):
    """Drops the converter's "torchvision is not installed. Skipping torchvision::nms" lines (one per op, each
    export): a model without torchvision has none of its operators, so they say nothing about this model."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("torchvision is not installed")


@contextlib.contextmanager
def _converter_noise_dropped() -> Iterator[None]:
    """The conversion without the messages about the converter itself, not the model.

    torch 2.13's converter deep-copies the program, and copying its pytree spec trips torch's own deprecation of
    LeafSpec (a FutureWarning from copyreg): under ``-W error`` that warning would fail every conversion. The
    optimizer's passes log a dozen INFO lines each export ("Removed 20 unused nodes"), which the CLI would print
    between its own; their warnings still come through.
    """
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    absent = _TorchvisionAbsent()
    registration.addFilter(absent)
    passes = [logging.getLogger(name) for name in _OPTIMIZER_LOGGERS]
    levels = [logger.level for logger in passes]
    for logger in passes:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
            )
            yield
    finally:
        registration.removeFilter(absent)
        for logger, level in zip(passes, levels):
            logger.setLevel(level)


def _axis_names(receiver: Any) -> dict[str, dict[int, str]]:
    """{input: {axis: name}} for the dynamic axes, named as the traced program's Dims ("batch" for the leading one).

    Given as strings, torch.onnx names the file's dim_params by them (every value sharing the symbol, outputs
    too) instead of its own symbols ("s48"). Each name is given once: the batch axis of a second input is the
    same symbol, and naming it again only draws a warning.
    """
    given: set[str] = set()
    names: dict[str, dict[int, str]] = {}
    for name, axes in receiver.dynamic_shapes().items():
        names[name] = {}
        for axis, dim in axes.items():
            if dim.__name__ not in given:
                given.add(dim.__name__)
                names[name][axis] = dim.__name__
    return names


def _program_output_keys(program: Any) -> list[str]:
    """The program's output keys in its output order: the flattened dict the serving module returns."""
    out_spec = program.call_spec.out_spec
    return [str(key) for key in (out_spec.context if out_spec is not None and out_spec.context else [])]


def _record(receiver: Any, signatures: Mapping[str, Any], output_names: list[str], onnx_program: Any) -> dict[str, Any]:
    """How to call model.onnx: its inputs and outputs in the file's order (lists: JSON keeps their order), each with
    dtype and shape (-1 dynamic), and each signature's {alias: ONNX output name}."""
    inputs = [
        {"name": name, "dtype": dtype_name(spec.dtype), "shape": spec.signature_shape()}
        for name, spec in receiver.program_specs().items()
    ]
    described: dict[str, Any] = {}
    by_signature: dict[str, Any] = {}
    for signature_name, signature in signatures["signatures"].items():
        aliases = {}
        for alias, info in signature["outputs"].items():
            aliases[alias] = info["program_output"]
            described.setdefault(info["program_output"], {"dtype": info.get("dtype"), "shape": info.get("shape")})
        by_signature[signature_name] = {"method": signature["method"], "outputs": aliases}
    outputs = [{"name": name, **described.get(name, {"dtype": None, "shape": None})} for name in output_names]
    record = {
        "format_version": RECORD_FORMAT_VERSION,
        "file": ONNX_FILE,
        "opset": int(onnx_program.model.opset_imports.get("", 0)),
        "inputs": inputs,
        "outputs": outputs,
        "signatures": by_signature,
    }
    if receiver.decoders:  # model.onnx starts after the decode step: say which of its inputs each string becomes
        record["decoded_outside"] = {
            name: {"kind": step.kind, "inputs": list(step.outputs())} for name, step in receiver.decoders.items()
        }
    return record


def _nbytes(value: Any) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _conversion_error(error: Exception, program: Any, model_name: str, receiver: Any) -> ConfigError:
    messages = list(_chain_messages(error))
    operators = _unconverted_operators("\n".join(messages), program)
    what = (
        f"torch.onnx has no ONNX translation for {', '.join(operators)}"
        if operators
        else "torch.onnx could not convert its traced program"
    )
    # The innermost message says why, in the converter's words; one line, so the CLI prints it as one.
    said = " ".join(messages[-1].split())[:600] if messages else type(error).__name__
    return ConfigError(
        f"as_onnx=True: cannot write model.onnx for model {model_name} (receiver {{{receiver.describe()}}}): {what}. "
        "Compute it from operators ONNX has, or export without as_onnx (the torch.export program, which "
        f"serve and load run, does not need ONNX). torch.onnx said: {type(error).__name__}: {said}",
        field="as_onnx",
        value=True,
    )


def _chain_messages(error: BaseException) -> Iterator[str]:
    """The messages of an error and of its causes, outermost first (bounded: chains can loop)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        yield f"{type(current).__name__}: {current}" if current is not error else str(current)
        current = current.__cause__ or current.__context__


def _unconverted_operators(text: str, program: Any) -> list[str]:
    """The operators the converter's messages say it has no translation for, as ``namespace.op.overload``."""
    found = [f"{op}.{overload}" for op, overload in _NO_TRANSLATION.findall(text)]
    if not found:  # another wording: the graph's own operators that the messages mention
        for module in program.graph_module.modules():  # the main graph and those of cond/map bodies
            graph = getattr(module, "graph", None)
            for node in graph.nodes if graph is not None else ():
                target = node.target
                if isinstance(target, torch._ops.OpOverload) and (repr(target) in text or str(target) in text):
                    found.append(str(target))
    return list(dict.fromkeys(found))
