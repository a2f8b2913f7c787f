"""The exported program on disk: torch.export's graph as JSON, its tensors as safetensors; reading it runs no code.

    program.json           the graph, signature and range constraints (torch.export's JSON schema)
    tensors.safetensors    parameters and buffers under ``state_dict/<fqn>``, lifted constants under ``constants/<name>``

Why not torch.export.save/load (``model.pt2``): its archive keeps example
inputs, and any weight or constant flagged ``use_pickle``, as pickles, and
loading unpickles them (example inputs fall back to an unrestricted unpickler
when the restricted one fails); custom and opaque objects are unpickled too, and
the archive can carry AOTInductor libraries. Even the JSON graph is not inert for
torch's deserializer: symbolic expressions go through ``sympy.sympify`` (an
``eval``), call targets resolve as any attribute path under ``torch``,
placeholder and keyword names are written into generated Python source, and
``guards_code`` is ``exec``'d by ``module()``. So ``decode`` checks the document
before torch sees it: every call target is an ATen/prims operator or one of a
few graph-only builtins, every name is an identifier, every expression is made
of sympy constructors and symbols only, custom objects are refused, node
metadata (stack traces, module paths) is dropped, and guards are recomputed
from the checked graph instead of read from the file. Tensors come from
safetensors (data only). No path in ``decode`` reaches pickle or torch.load.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from collections.abc import Iterator
from typing import Any

import torch

from torchestimator.checkpoint.format import bytes_to_tensors, tensors_to_bytes
from torchestimator.errors import ExportFormatError

__all__ = ["LEGACY_FILE", "PROGRAM_FILE", "TENSORS_FILE", "ExportFormatError", "decode", "encode"]

PROGRAM_FILE = "program.json"
TENSORS_FILE = "tensors.safetensors"
LEGACY_FILE = "model.pt2"  # what torchestimator wrote before; refused, never opened
_STATE = "state_dict/"
_CONSTANTS = "constants/"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTTED = re.compile(r"([A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*)?\Z")  # "" is the root module
_OPERATOR = re.compile(r"torch\.ops\.(aten|prims)\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+\Z")
# Graph-only higher-order operators: their bodies are subgraphs, checked like the main one.
_HIGHER_ORDER = {
    f"torch.ops.higher_order.{name}"
    for name in ("cond", "while_loop", "map_impl", "wrap_with_set_grad_enabled", "wrap_with_autocast")
}
# Python builtins torch.export emits for indexing and symbolic shape arithmetic.
_BUILTINS = (
    {
        f"_operator.{name}"
        for name in (
            "getitem",
            "add",
            "sub",
            "mul",
            "floordiv",
            "truediv",
            "mod",
            "pow",
            "neg",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "and_",
            "or_",
            "not_",
        )
    }
    | {
        f"torch.{name}"
        for name in ("sym_int", "sym_float", "sym_ite", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_sum")
    }
    | {"math.ceil", "math.floor", "math.trunc"}
)
# Every overload (from_file.out reads a file as well as from_file.default): they read or write a path named in the graph.
_REFUSED_OPERATORS = {"torch.ops.aten.from_file", "torch.ops.aten.save"}
_NAME_KEYS = {"name", "as_name"}
_DOTTED_KEYS = {"parameter_name", "buffer_name", "tensor_constant_name", "fqn", "forward_arg_names"}
_NAMED_TABLES = {"tensor_values", "sym_int_values", "sym_float_values", "sym_bool_values", "opset_version"}
_REFUSED_KEYS = {"as_custom_obj", "as_string_to_argument", "custom_obj_name", "token"}
_MAX_EXPRESSION = 2000
# sympify evaluates numbers eagerly: 9**999999999 or LShift(1, 2**40) would compute a huge integer. Sizes fit in
# int64, exponents stay small, and the product of all exponents bounds how large any number can grow.
_MAX_NUMBER = 2**63
_MAX_EXPONENT = 64
_MAX_EXPONENT_PRODUCT = 256
_POWERS = {"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"}  # sympy/torch calls that raise to a power


def encode(program: Any) -> dict[str, bytes]:
    """{file name: bytes} for a torch.export ExportedProgram; raises ValueError for what the format cannot hold."""
    from torch._export.serde.serialize import ExportedProgramSerializer, _to_json_bytes

    serialized = ExportedProgramSerializer().serialize(
        program, serialize_state_dict=False, serialize_constants=False, serialize_example_inputs=False
    )
    tensors = {_STATE + name: value for name, value in program.state_dict.items()}
    for name, value in program.constants.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"The traced program holds constant {name!r} of type {type(value).__name__}; exports hold tensors "
                "only (a TorchScript/custom object would need code to load). Compute it from tensors in model_fn."
            )
        tensors[_CONSTANTS + name] = value
    return {
        TENSORS_FILE: tensors_to_bytes(tensors, "exported tensors"),
        PROGRAM_FILE: _to_json_bytes(serialized.exported_program),
    }


def decode(program_bytes: bytes, tensor_bytes: bytes, folder: str) -> Any:
    """The ExportedProgram of a version folder's two files, checked first so that nothing in them runs."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass
    from torch.export.exported_program import _convert_guards_to_code

    program_path, tensors_path = f"{folder}/{PROGRAM_FILE}", f"{folder}/{TENSORS_FILE}"
    try:
        document = json.loads(program_bytes)
        if not isinstance(document, dict) or not isinstance(document.get("graph_module"), dict):
            raise ExportFormatError(f"{program_path} has no 'graph_module' object: it is not a torchestimator export.")
        _check_document(document, program_path)
    except RecursionError:
        raise ExportFormatError(
            f"{program_path} nests its values too deeply to be an export. Re-export the model."
        ) from None
    except ExportFormatError:
        raise
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, integers past Python's digit limit
        raise ExportFormatError(f"{program_path} is not valid JSON ({error}). Re-export the model.") from None
    document["guards_code"] = []  # recomputed below from the checked graph; the file's copy would be exec'd
    try:
        tensors = bytes_to_tensors(tensor_bytes, tensors_path)
    except ValueError as error:
        raise ExportFormatError(f"{error} Re-export the model.") from None
    state_dict, constants = _split_tensors(tensors, document, tensors_path)
    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, document)
        program = ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)
        program._guards_code = _convert_guards_to_code(program.graph_module)
        _check_tensors_match_graph(program, tensors_path)
    except ExportFormatError:
        raise
    except Exception as error:  # torch's deserializer raises many types for a document it cannot rebuild
        raise ExportFormatError(
            f"{program_path} could not be rebuilt into a program ({type(error).__name__}: {error}). It may come "
            f"from another torch version (it says {document.get('torch_version')!r}, this is {torch.__version__}); "
            "re-export the model with this installation."
        ) from error
    return program


def _check_document(document: dict[str, Any], where: str) -> None:
    for path, key, value in _walk(document, "$"):
        problem = _problem(key, value, path)
        if problem:
            raise ExportFormatError(
                f"{where}: {path} {problem}. Loading an export never runs code from a file, so this export is "
                "refused; re-export the model with torchestimator.export.export_saved_model."
            )


def _walk(value: Any, path: str, key: str | None = None) -> Iterator[tuple[str, str | None, Any]]:
    """(JSON path, key, value) for every value; node metadata is emptied on the way (nothing needs it to run)."""
    yield path, key, value
    if isinstance(value, dict):
        if "metadata" in value and ("target" in value or "graph" in value):  # a node, or the graph module
            value["metadata"] = {}
        for child_key, child in value.items():
            yield from _walk(child, f"{path}.{child_key}", child_key)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _walk(child, f"{path}[{index}]", key)


def _problem(key: str | None, value: Any, path: str) -> str | None:
    if key in _REFUSED_KEYS:
        return f"holds {key!r} (a custom object or an effect token), which only code can restore"
    if key in ("custom_obj_values", "treespec_namedtuple_fields") and value:
        return f"holds {key!r} entries (custom objects or namedtuple types), which exports never need"
    if key in _NAMED_TABLES and isinstance(value, dict):
        bad = [name for name in value if not _IDENTIFIER.match(name)]
        return f"has entry name {bad[0]!r}, which is not an identifier" if bad else None
    if key == "range_constraints" and isinstance(value, dict):
        for expression in value:
            problem = _expression_problem(expression)
            if problem:
                return f"has a range constraint on {expression[:80]!r}: {problem}"
        return None
    if not isinstance(value, str):
        return None
    if key == "target" and path.endswith("].target") and ".nodes[" in path:
        return _operator_problem(value)
    if key == "as_operator":
        return _operator_problem(value)
    if key in _NAME_KEYS and not _IDENTIFIER.match(value):
        return f"is the name {value[:80]!r}, which is not an identifier"
    if key in _DOTTED_KEYS and (not _DOTTED.match(value) or "__" in value):
        return f"is the module path {value[:80]!r}, which is not dotted identifiers"
    if key == "expr_str":
        problem = _expression_problem(value)
        return f"is the expression {value[:80]!r}: {problem}" if problem else None
    return None


def _operator_problem(target: str) -> str | None:
    if target.rsplit(".", 1)[0] in _REFUSED_OPERATORS:
        return f"calls {target}, which reads or writes a file named in the graph"
    if _OPERATOR.match(target) or target in _HIGHER_ORDER or target in _BUILTINS:
        return None
    return (
        f"calls {target[:120]!r}, which is not an ATen or prims operator (nor a graph-only builtin); an export "
        "may only call those"
    )


def _allowed_expression_names() -> frozenset[str]:
    import sympy
    import torch.utils._sympy.functions
    from sympy.core.assumptions import _assume_defined

    # Constructors that only build expressions; sympy's namespace also holds eval-like helpers (sympify, lambdify,
    # preview), which must stay out of reach.
    constructors = {
        "Symbol",
        "Integer",
        "Rational",
        "Float",
        "Add",
        "Mul",
        "Pow",
        "Max",
        "Min",
        "Abs",
        "Mod",
        "Eq",
        "Ne",
        "Lt",
        "Le",
        "Gt",
        "Ge",
        "StrictLessThan",
        "LessThan",
        "StrictGreaterThan",
        "GreaterThan",
        "Equality",
        "Unequality",
        "And",
        "Or",
        "Not",
        "Piecewise",
        "ExprCondPair",
        "floor",
        "ceiling",
        "oo",
        "zoo",
        "nan",
        "Infinity",
        "NegativeInfinity",
        "One",
        "Zero",
        "NegativeOne",
        "Half",
        "true",
        "false",
        "BooleanTrue",
        "BooleanFalse",
        "True",
        "False",
        "int_oo",
        "IntInfinity",
        "NegativeIntInfinity",
    }
    functions = {
        name
        for name, value in vars(torch.utils._sympy.functions).items()
        if isinstance(value, type) and issubclass(value, sympy.Basic)
    }
    return frozenset(constructors | functions | set(_assume_defined))


_EXPRESSION_NAMES: frozenset[str] | None = None
_EXPRESSION_OPERATORS = {"(", ")", ",", "=", "+", "-", "*", "/", "**", "%"}
_SYMBOL_STRING = re.compile(r"'[A-Za-z_][A-Za-z0-9_]*'\Z")


def _expression_problem(expression: str) -> str | None:
    """Why a symbolic expression (sympify'd at load, so eval'd) is unsafe, or None when it is plain sympy."""
    global _EXPRESSION_NAMES
    if _EXPRESSION_NAMES is None:
        _EXPRESSION_NAMES = _allowed_expression_names()
    if len(expression) > _MAX_EXPRESSION:
        return f"longer than {_MAX_EXPRESSION} characters"
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(expression).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as error:
        return f"not a sympy expression ({error})"
    for token in tokens:
        kind, text = token.type, token.string
        if kind in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
            continue
        if kind == tokenize.NUMBER and re.fullmatch(r"[0-9]+(\.[0-9]+)?(e-?[0-9]+)?", text):
            continue
        if kind == tokenize.STRING and _SYMBOL_STRING.match(text):
            continue
        if kind == tokenize.NAME and (text in _EXPRESSION_NAMES or re.fullmatch(r"[a-z]+[0-9]+", text)):
            continue
        if kind == tokenize.OP and text in _EXPRESSION_OPERATORS:
            continue
        return f"it contains {text!r}, which is not a sympy constructor, symbol, number or arithmetic"
    return _number_problem(expression)


def _number_problem(expression: str) -> str | None:
    """Why evaluating the (token-checked) expression could build a huge number, or None."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")  # parsing only; the tokens are already checked
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        return f"not a sympy expression ({type(error).__name__}: {error})"
    product = 1
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
            and not abs(node.value) <= _MAX_NUMBER
        ):
            return f"it holds the number {str(node.value)[:40]}, beyond 2**63 (no tensor size is that large)"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "Float"
            and (len(node.args) > 1 or node.keywords)
        ):
            return "it gives Float a precision, which could make it compute millions of digits"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = node.right
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _POWERS:
            if len(node.args) != 2 or node.keywords:
                return f"it calls {node.func.id} with other than 2 arguments"
            exponent = node.args[1]
        else:
            continue
        value = _literal(exponent)
        if value is None or abs(value) > _MAX_EXPONENT:
            return (
                f"it raises to the power (or shifts by) {ast.unparse(exponent)[:40]!r}; exponents must be "
                f"numbers of at most {_MAX_EXPONENT}, as sympy would compute the result"
            )
        product *= max(1, int(abs(value)))
        if product > _MAX_EXPONENT_PRODUCT:
            return f"its exponents multiply to more than {_MAX_EXPONENT_PRODUCT}, which could build a huge number"
    return None


def _literal(node: ast.expr) -> float | None:
    """The value of a plain number, a negated one, or sympy's spelling of one (``Integer(2)``,
    ``Rational(1, 2)``, ``Float(0.5)``: how srepr writes an exponent); None for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        values = [_literal(argument) for argument in node.args]
        if node.func.id == "Integer" and len(values) == 1 and isinstance(values[0], int):
            return values[0]
        if node.func.id == "Rational" and len(values) == 2:
            numerator, denominator = values
            if isinstance(numerator, int) and isinstance(denominator, int) and denominator != 0:
                return numerator / denominator
        if node.func.id == "Float" and len(values) == 1 and values[0] is not None:
            return values[0]
    return None


def _check_tensors_match_graph(program: Any, where: str) -> None:
    """Each stored tensor has the dtype and sizes the graph declares for it (else the first request fails deep
    inside an operator, naming no tensor)."""
    signature = program.graph_signature
    stored = {
        **{
            name: (_STATE + name, program.state_dict)
            for name in (*signature.inputs_to_parameters.values(), *signature.inputs_to_buffers.values())
        },
        **{
            name: (_CONSTANTS + name, program.constants)
            for name in signature.inputs_to_lifted_tensor_constants.values()
        },
    }
    targets = {
        **signature.inputs_to_parameters,
        **signature.inputs_to_buffers,
        **signature.inputs_to_lifted_tensor_constants,
    }
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in targets:
            continue
        key, table = stored[targets[node.name]]
        declared, tensor = node.meta.get("val"), table.get(targets[node.name])
        if not isinstance(declared, torch.Tensor) or not isinstance(tensor, torch.Tensor):
            continue  # a missing tensor is already refused by torch's verifier
        sizes = [size if isinstance(size, int) else None for size in declared.shape]
        if (
            tensor.dtype != declared.dtype
            or len(sizes) != tensor.dim()
            or any(size is not None and size != actual for size, actual in zip(sizes, tensor.shape))
        ):
            raise ExportFormatError(
                f"{where} holds {key!r} as {str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}; the "
                f"program declares {str(declared.dtype).removeprefix('torch.')} {list(declared.shape)}. The two "
                "files come from different exports; re-export the model."
            )


def _split_tensors(
    tensors: dict[str, torch.Tensor],
    document: dict[str, Any],
    where: str,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """state_dict (parameters as Parameters, as torch's verifier wants) and constants, by their key prefixes."""
    parameters = {
        spec["parameter"]["parameter_name"]
        for spec in document["graph_module"].get("signature", {}).get("input_specs", [])
        if isinstance(spec, dict) and isinstance(spec.get("parameter"), dict)
    }
    state_dict: dict[str, torch.Tensor] = {}
    constants: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        if key.startswith(_STATE):
            name = key[len(_STATE) :]
            state_dict[name] = torch.nn.Parameter(tensor, requires_grad=False) if name in parameters else tensor
        elif key.startswith(_CONSTANTS):
            constants[key[len(_CONSTANTS) :]] = tensor
        else:
            raise ExportFormatError(
                f"{where} holds tensor {key!r}; an export's tensors are named {_STATE}<name> or {_CONSTANTS}<name>."
            )
    return state_dict, constants
