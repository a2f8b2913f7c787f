"""Pickle-free encoding of state trees (optimizer and scheduler state dicts).

A state tree is made of dicts (any hashable scalar keys), lists, tuples, None,
bool, int, float, str and tensors. ``flatten_state`` splits it into a JSON
tree and a flat ``{name: tensor}`` dict meant for a safetensors file;
``unflatten_state`` puts them back together with the exact Python types, so a
fresh optimizer loaded from the result steps bit for bit like the original.

What belongs here: the tree codec only. File layout, checksums and the
safetensors bytes belong to ``store.py``.

JSON encoding: str-keyed dicts, lists, None, bool, int, str and finite floats
are written as themselves. Everything else is a one-key tagged object:
``{"__tuple__": [...]}``, ``{"__dict__": [[key, value], ...]}`` (dicts with
non-str keys, e.g. the optimizer's int parameter ids),
``{"__float__": "inf" | "-inf" | "nan" | "nan:<hex bits>"}``,
``{"__tensor__": "<name in the tensors dict>"}`` and ``{"__size__": [...]}``
for ``torch.Size``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["flatten_state", "unflatten_state"]

_TUPLE = "__tuple__"
_DICT = "__dict__"
_FLOAT = "__float__"
_TENSOR = "__tensor__"
_SIZE = "__size__"
_TAGS = frozenset({_TUPLE, _DICT, _FLOAT, _TENSOR, _SIZE})
_CANONICAL_NAN_BITS = struct.pack(">d", float("nan")).hex()

_SUPPORTED = "None, bool, int, float, str, torch.Tensor, torch.Size, and dict, list or tuple containers of these"


def flatten_state(tree: Any, *, root: str = "state") -> tuple[Any, dict[str, torch.Tensor]]:
    """Split a state tree into a JSON-serializable tree and a dict of tensors.

    Tensors are named after their path in the tree (e.g.
    ``state["state"][0]["exp_avg"]``) and returned detached but otherwise as
    they are; the caller moves them to CPU before writing. ``root`` is the
    name used for the top of the tree in tensor names and error messages.

    Raises:
        TypeError: a leaf or dict key has an unsupported type; the message
            names its path in the tree.
    """
    tensors: dict[str, torch.Tensor] = {}
    return _encode(tree, root, tensors), tensors


def unflatten_state(json_tree: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Rebuild the tree written by ``flatten_state``.

    Raises:
        ValueError: the JSON tree is malformed or names a tensor missing from
            ``tensors``.
    """
    return _decode(json_tree, tensors, "state")


_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})
"""Exact types that encode as themselves (subclasses and floats take the general path)."""


def _plain(items: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every item encodes as itself: what RNG states are (Python's and numpy's: 625 ints each), taken
    whole instead of item by item with a path each (12 ms of a 100 MB save's 20 ms of encoding)."""
    return all(type(item) in _PLAIN_SCALARS for item in items)


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if type(value) is list and _plain(value):
        return list(value)
    if type(value) is tuple and _plain(value):
        return {_TUPLE: list(value)}
    # bool before int: bool is a subclass of int and must stay a bool.
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _encode_float(float(value))
    if isinstance(value, torch.Tensor):
        name = _unique_name(path, tensors)
        tensors[name] = value.detach()
        return {_TENSOR: name}
    if isinstance(value, torch.Size):
        return {_SIZE: [int(size) for size in value]}
    if type(value) is tuple:
        return {_TUPLE: [_encode(item, f"{path}[{index}]", tensors) for index, item in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(item, f"{path}[{index}]", tensors) for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        return _encode_dict(value, path, tensors)
    raise TypeError(_unsupported_message(value, path))


def _encode_dict(value: Mapping[Any, Any], path: str, tensors: dict[str, torch.Tensor]) -> Any:
    items = [(key, _encode(item, _child_path(path, key), tensors)) for key, item in value.items()]
    plain = all(type(key) is str for key, _ in items) and not (len(items) == 1 and items[0][0] in _TAGS)
    if plain:
        return dict(items)
    encoded = []
    for key, item in items:
        if isinstance(key, torch.Tensor) or not _is_scalar_key(key):
            raise TypeError(
                f"Cannot serialize the dict key {key!r} (type {type(key).__name__}) at {path}: "
                "keys must be None, bool, int, float, str or tuples of these."
            )
        encoded.append([_encode(key, f"{path}<key>", tensors), item])
    return {_DICT: encoded}


def _is_scalar_key(key: Any) -> bool:
    if key is None or isinstance(key, (bool, int, float, str)):
        return True
    return type(key) is tuple and all(_is_scalar_key(item) for item in key)


def _encode_float(value: float) -> Any:
    if math.isfinite(value):
        # JSON's shortest repr of a finite double parses back to the same bits, -0.0 included.
        return value
    if math.isinf(value):
        return {_FLOAT: "inf" if value > 0 else "-inf"}
    bits = struct.pack(">d", value).hex()
    return {_FLOAT: "nan" if bits == _CANONICAL_NAN_BITS else f"nan:{bits}"}


def _child_path(path: str, key: Any) -> str:
    return f"{path}[{json.dumps(key)}]" if isinstance(key, str) else f"{path}[{key!r}]"


def _unique_name(path: str, tensors: Mapping[str, torch.Tensor]) -> str:
    name, suffix = path, 1
    while name in tensors:
        suffix += 1
        name = f"{path}#{suffix}"
    return name


def _unsupported_message(value: Any, path: str) -> str:
    kind = type(value)
    message = f"Cannot serialize {path}: expected {_SUPPORTED}; received {kind.__module__}.{kind.__qualname__}."
    if callable(value):
        message += (
            " Functions cannot be stored without pickle: keep callables out of the state "
            "(for LambdaLR, use a plain function or lambda, which state_dict() leaves out, "
            "or give the callable object only data attributes)."
        )
    elif kind.__module__ == "numpy":
        message += " Convert numpy values with .item() or torch.from_numpy()."
    else:
        message += " Convert it to one of the supported types or leave it out of the state."
    return message


def _decode(node: Any, tensors: Mapping[str, torch.Tensor], path: str) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(item, tensors, f"{path}[{index}]") for index, item in enumerate(node)]
    if not isinstance(node, dict):
        raise ValueError(f"Malformed state tree at {path}: unexpected JSON value {node!r}.")
    if len(node) == 1:
        ((tag, payload),) = node.items()
        if tag in _TAGS:
            return _decode_tagged(tag, payload, tensors, path)
    return {key: _decode(item, tensors, _child_path(path, key)) for key, item in node.items()}


def _decode_tagged(tag: str, payload: Any, tensors: Mapping[str, torch.Tensor], path: str) -> Any:
    if tag == _TENSOR:
        if payload not in tensors:
            raise ValueError(
                f"Malformed state tree at {path}: it refers to tensor {payload!r}, which is not in the "
                f"tensor file ({len(tensors)} tensors present)."
            )
        return tensors[payload]
    if tag == _FLOAT:
        return _decode_float(payload, path)
    if tag == _SIZE and isinstance(payload, list):
        return torch.Size(payload)
    if tag == _TUPLE and isinstance(payload, list):
        return tuple(_decode(item, tensors, f"{path}[{index}]") for index, item in enumerate(payload))
    if tag == _DICT and isinstance(payload, list):
        result = {}
        for pair in payload:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"Malformed state tree at {path}: dict entry {pair!r} is not a [key, value] pair.")
            key = _decode(pair[0], tensors, f"{path}<key>")
            result[key] = _decode(pair[1], tensors, _child_path(path, key))
        return result
    raise ValueError(f"Malformed state tree at {path}: bad payload for {tag}: {payload!r}.")


def _decode_float(payload: Any, path: str) -> float:
    if payload == "inf":
        return math.inf
    if payload == "-inf":
        return -math.inf
    if payload == "nan":
        return math.nan
    if isinstance(payload, str) and payload.startswith("nan:"):
        try:
            bits: float = struct.unpack(">d", bytes.fromhex(payload[4:]))[0]
            return bits
        except (ValueError, struct.error) as error:
            raise ValueError(f"Malformed state tree at {path}: bad NaN bits {payload!r}.") from error
    raise ValueError(f"Malformed state tree at {path}: bad float {payload!r}.")
