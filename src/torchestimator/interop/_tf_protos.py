"""The protobuf messages of a TensorFlow checkpoint, defined field for field as TensorFlow's .proto files define them.

What belongs here: the field tables (names and numbers as in TensorFlow's
sources) and the message classes built from them by `torchestimator._io.protobuf`,
parsed by the protobuf runtime. What does not: the table and block bytes around
the records (`_sstable.py`), and what the records mean (`_tf_bundle.py`,
`_tf_variables.py`, `tf_checkpoint.py`).

Enum fields (DataType, Endianness) are declared int32: the wire format is the
same and proto3 enums are open anyway, so any number a file holds comes through
as that number, which is all the reader uses. Fields the reader never reads
may be left out, as TrackableObject's registered_saver and
has_checkpoint_values are: the runtime skips unknown fields.

Sources: core/protobuf/tensor_bundle.proto, core/framework/tensor_shape.proto,
core/framework/tensor_slice.proto, core/framework/versions.proto,
core/protobuf/trackable_object_graph.proto, python/training/checkpoint_state.proto.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from torchestimator._io import protobuf as _protobuf

__all__ = ["tf_protos"]

_add = _protobuf.add_field


def _framework_file() -> Any:
    """tensor_shape.proto, tensor_slice.proto and versions.proto in one file (the pool needs no split)."""
    framework = _protobuf.new_file("torchestimator/tf_framework.proto", "tensorflow")
    _protobuf.add_tensor_shape_proto(framework)
    slice_proto = framework.message_type.add(name="TensorSliceProto")
    extent = slice_proto.nested_type.add(name="Extent")
    _add(extent, "start", 1, "int64")
    extent.oneof_decl.add(name="has_length")  # absent length: the whole dimension
    _add(extent, "length", 2, "int64", oneof=0)
    _add(slice_proto, "extent", 1, "message", ".tensorflow.TensorSliceProto.Extent", repeated=True)
    version = framework.message_type.add(name="VersionDef")
    _add(version, "producer", 1, "int32")
    _add(version, "min_consumer", 2, "int32")
    _add(version, "bad_consumers", 3, "int32", repeated=True)
    return framework


def _bundle_file(framework: Any) -> Any:
    """tensor_bundle.proto."""
    bundle = _protobuf.new_file("torchestimator/tf_tensor_bundle.proto", "tensorflow", framework.name)
    header = bundle.message_type.add(name="BundleHeaderProto")
    _add(header, "num_shards", 1, "int32")
    _add(header, "endianness", 2, "int32")  # enum Endianness { LITTLE = 0; BIG = 1; }
    _add(header, "version", 3, "message", ".tensorflow.VersionDef")
    entry = bundle.message_type.add(name="BundleEntryProto")
    _add(entry, "dtype", 1, "int32")  # enum DataType
    _add(entry, "shape", 2, "message", ".tensorflow.TensorShapeProto")
    _add(entry, "shard_id", 3, "int32")
    _add(entry, "offset", 4, "int64")
    _add(entry, "size", 5, "int64")
    _add(entry, "crc32c", 6, "fixed32")
    _add(entry, "slices", 7, "message", ".tensorflow.TensorSliceProto", repeated=True)
    return bundle


def _object_graph_file() -> Any:
    """trackable_object_graph.proto (what the reader uses) and checkpoint_state.proto."""
    graph_file = _protobuf.new_file("torchestimator/tf_trackable_object_graph.proto", "tensorflow")
    graph = graph_file.message_type.add(name="TrackableObjectGraph")
    node = graph.nested_type.add(name="TrackableObject")
    scope = ".tensorflow.TrackableObjectGraph.TrackableObject"
    reference = node.nested_type.add(name="ObjectReference")
    _add(reference, "node_id", 1, "int32")
    _add(reference, "local_name", 2, "string")
    tensor = node.nested_type.add(name="SerializedTensor")
    _add(tensor, "name", 1, "string")
    _add(tensor, "full_name", 2, "string")
    _add(tensor, "checkpoint_key", 3, "string")
    slot = node.nested_type.add(name="SlotVariableReference")
    _add(slot, "original_variable_node_id", 1, "int32")
    _add(slot, "slot_name", 2, "string")
    _add(slot, "slot_variable_node_id", 3, "int32")
    _add(node, "children", 1, "message", f"{scope}.ObjectReference", repeated=True)
    _add(node, "attributes", 2, "message", f"{scope}.SerializedTensor", repeated=True)
    _add(node, "slot_variables", 3, "message", f"{scope}.SlotVariableReference", repeated=True)
    _add(graph, "nodes", 1, "message", scope, repeated=True)
    state = graph_file.message_type.add(name="CheckpointState")
    _add(state, "model_checkpoint_path", 1, "string")
    _add(state, "all_model_checkpoint_paths", 2, "string", repeated=True)
    _add(state, "all_model_checkpoint_timestamps", 3, "double", repeated=True)
    _add(state, "last_preserved_timestamp", 4, "double")
    return graph_file


@functools.cache
def tf_protos() -> SimpleNamespace:
    """BundleHeaderProto, BundleEntryProto, TrackableObjectGraph, CheckpointState (and the pool)."""
    framework = _framework_file()
    files = [framework, _bundle_file(framework), _object_graph_file()]
    names = [
        "tensorflow.BundleHeaderProto",
        "tensorflow.BundleEntryProto",
        "tensorflow.TrackableObjectGraph",
        "tensorflow.CheckpointState",
    ]
    return _protobuf.message_classes(files, names)
