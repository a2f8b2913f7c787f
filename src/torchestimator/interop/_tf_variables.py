"""Which keys of a TensorFlow checkpoint are model variables, which are optimizer state, and their object paths.

What belongs here: TF1 naming rules (`<var>/Adam`, `beta1_power`, ...), the TF2
object graph (`_CHECKPOINTABLE_OBJECT_GRAPH`, a TrackableObjectGraph decoded by
the protobuf runtime) and what it says: the object path of every saved value,
the optimizer slots of each variable (Keras 3's index-aligned lists too), and
the model variables under their shortest path. What does not: reading the
checkpoint (`tf_checkpoint.py`), mapping the names onto a PyTorch model (warm start).

The functions take the decoded graph, `nodes`, as a list of
`(children, attributes, slot variables)` per node: children as
`(node id, local name)`, attributes as `(name, checkpoint key)`, slot variables
as `(variable node id, slot name, slot node id)`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterator

from torchestimator._io import protobuf as _protobuf
from torchestimator.interop._tf_protos import tf_protos

__all__ = [
    "OBJECT_GRAPH_KEY",
    "TF1_SLOT",
    "Node",
    "decode_object_graph",
    "is_optimizer_variable",
    "model_variables",
    "object_paths",
    "optimizer_slots",
]

logger = logging.getLogger(__name__)

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"

Node = tuple[list[tuple[int, str]], list[tuple[str, str]], list[tuple[int, str, int]]]

# TF1 optimizer slots are `<variable>/<SlotName>`; repeated optimizers add `_1`, `_2`, ...
TF1_SLOT = re.compile(
    r"/(Adam|RMSProp|Adadelta|Ftrl|LazyAdam|Momentum|Adagrad|AdagradDA|ProximalAdagrad|"
    r"ExponentialMovingAverage|GradientDescent|Nadam|Adamax)(_\d+)?$"
)
_TF1_SCALARS = re.compile(r"^(beta1_power|beta2_power|global_step|save_counter)(_\d+)?$")
_TF2_OPTIMIZER = re.compile(r"(^|/)\.OPTIMIZER_SLOT/|^optimizer(_\d+)?/|^save_counter/|^training/")
_MAX_PATHS = 100_000


def is_optimizer_variable(name: str) -> bool:
    """Whether a checkpoint key is optimizer state or bookkeeping rather than a model variable.

    Covers TF1 names (`<var>/Adam`, `<var>/Adam_1`, `<var>/Momentum`, `beta1_power`,
    `global_step`, ...) and TF2 object keys (`.OPTIMIZER_SLOT`, `optimizer/...`,
    `save_counter`, the object graph itself). Keras 3 may store model weights
    under `optimizer/_trainable_variables/N`; use
    `TensorFlowCheckpoint.model_variables()`, which reads the object graph, for those.
    """
    return bool(
        name == OBJECT_GRAPH_KEY or TF1_SLOT.search(name) or _TF1_SCALARS.match(name) or _TF2_OPTIMIZER.search(name)
    )


def decode_object_graph(serialized: bytes) -> list[Node]:
    """The object graph's nodes; MessageDecodeError for bytes that are not one or name nodes it lacks."""
    graph = _protobuf.parse_binary(tf_protos().TrackableObjectGraph, serialized)
    nodes = [
        (
            [(child.node_id, child.local_name) for child in node.children],
            [(attribute.name, attribute.checkpoint_key) for attribute in node.attributes],
            [
                (slot.original_variable_node_id, slot.slot_name, slot.slot_variable_node_id)
                for slot in node.slot_variables
            ],
        )
        for node in graph.nodes
    ]
    # Every node a child or slot reference names exists: a corrupt graph must fail here, not as an IndexError.
    for children, _, slots in nodes:
        ids = [child for child, _ in children] + [ref for variable, _, slot in slots for ref in (variable, slot)]
        bad = [node_id for node_id in ids if not 0 <= node_id < len(nodes)]
        if bad:
            raise _protobuf.MessageDecodeError(f"a reference to node {bad[0]}, but the graph has {len(nodes)} nodes")
    return nodes


def object_paths(nodes: list[Node], prefix: str) -> dict[str, str]:
    """Every object path from the root to a saved value, mapped to its checkpoint key (see the reader's method)."""
    if not nodes:
        return {}
    node_paths = _all_paths(nodes, prefix)
    result: dict[str, str] = {}
    for node_id, paths in node_paths.items():
        for attribute_name, key in nodes[node_id][1]:
            suffix = "" if attribute_name == "VARIABLE_VALUE" else f"/.ATTRIBUTES/{attribute_name}"
            for path in paths:
                result[path + suffix] = key
    for optimizer_id, (_, _, slots) in enumerate(nodes):
        optimizer_path = min(node_paths.get(optimizer_id, [""]), key=lambda p: (p.count("/"), p))
        for variable_id, slot_name, slot_id in slots:
            slot_key = _value_key(nodes[slot_id])
            if not slot_key:
                continue
            for path in node_paths.get(variable_id, []):
                result[f"{path}/.OPTIMIZER_SLOT/{optimizer_path}/{slot_name}"] = slot_key
    return dict(sorted(result.items()))


def optimizer_slots(nodes: list[Node], names: Collection[str]) -> dict[str, dict[str, str]]:
    """Checkpoint key of each variable -> {slot name: checkpoint key of the slot}; `names`: the checkpoint's keys."""
    slots: dict[str, dict[str, str]] = {}
    if nodes:
        for _, _, node_slots in nodes:
            for variable_id, slot_name, slot_id in node_slots:
                variable_key, slot_key = _value_key(nodes[variable_id]), _value_key(nodes[slot_id])
                if variable_key and slot_key:
                    slots.setdefault(variable_key, {})[slot_name] = slot_key
        for variable_key, slot_name, slot_key in _keras3_slots(nodes):
            slots.setdefault(variable_key, {})[slot_name] = slot_key
        return slots
    for name in names:
        match = TF1_SLOT.search(name)
        if match and name[: match.start()] in names:
            slots.setdefault(name[: match.start()], {})[name[match.start() + 1 :]] = name
    return slots


def model_variables(nodes: list[Node], names: Collection[str], prefix: str) -> dict[str, str]:
    """Model variables only: name -> checkpoint key (see the reader's method); `names`: the checkpoint's keys."""
    if not nodes:
        return {name: name for name in sorted(names) if not is_optimizer_variable(name)}
    slot_keys = {key for slots in optimizer_slots(nodes, names).values() for key in slots.values()}
    best: dict[str, str] = {}
    for path, key in object_paths(nodes, prefix).items():
        if key in slot_keys or "/.ATTRIBUTES/" in path or _TF2_OPTIMIZER.search(path + "/"):
            continue
        if key not in best or (path.count("/"), path) < (best[key].count("/"), best[key]):
            best[key] = path
    return {path: key for key, path in sorted(best.items(), key=lambda item: item[1])}


def _value_key(node: Node) -> str | None:
    keys = [key for name, key in node[1] if name == "VARIABLE_VALUE"]
    return keys[0] if keys else None


def _keras3_slots(nodes: list[Node]) -> Iterator[tuple[str, str, str]]:
    """(variable key, slot name, slot key) from Keras 3 optimizers' index-aligned slot lists."""
    for children, _, _ in nodes:
        lists = {
            name: {local: child for child, local in nodes[node_id][0] if local.isdigit()}
            for node_id, name in children
            if 0 <= node_id < len(nodes)
        }
        trainable = lists.get("_trainable_variables")
        if not trainable:
            continue
        for list_name, members in lists.items():
            if list_name in ("_trainable_variables", "_variables") or not members:
                continue
            for index, slot_id in members.items():
                variable_id = trainable.get(index)
                if variable_id is None:
                    continue
                variable_key, slot_key = _value_key(nodes[variable_id]), _value_key(nodes[slot_id])
                if variable_key and slot_key:
                    yield variable_key, list_name.lstrip("_"), slot_key


def _all_paths(nodes: list[Node], prefix: str) -> dict[int, list[str]]:
    """Every cycle-free path of local names from the root (node 0) to each node."""
    paths: dict[int, list[str]] = {}
    stack: list[tuple[int, str, frozenset[int]]] = [(0, "", frozenset([0]))]
    count = 0
    while stack:
        node_id, path, seen = stack.pop()
        for child_id, local_name in nodes[node_id][0]:
            if child_id in seen or not 0 <= child_id < len(nodes):
                continue
            child_path = f"{path}/{local_name}" if path else local_name
            paths.setdefault(child_id, []).append(child_path)
            count += 1
            if count > _MAX_PATHS:
                logger.warning("%s: object graph has over %d paths; listing the first ones only", prefix, _MAX_PATHS)
                return paths
            stack.append((child_id, child_path, seen | {child_id}))
    return paths
