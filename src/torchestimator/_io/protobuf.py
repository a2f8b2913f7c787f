"""Protocol buffer messages from field tables written here, parsed by the protobuf runtime: one helper for all.

What belongs here: building ``FileDescriptorProto``s from our own field
definitions (no protoc step, no TensorFlow), message classes in a private
descriptor pool (so that a real TensorFlow or TF Serving import in the same
process never clashes with them), binary and text-format parsing with the
runtime's errors caught in one type each, and the two bits of wire encoding
that let callers hand packed bytes to the C runtime instead of Python numbers.
What does not: any particular message (``data/example.py``: tf.train.Example;
``serving/config.py``: TF Serving's config files; ``interop/_tf_protos.py``: the
TF checkpoint's records), nor turning errors into a reader's words: each reader
translates ``MessageDecodeError`` / ``TextFormatError`` at its one boundary,
adding the file, record and offset it knows.

Imports of ``google.protobuf`` stay inside the functions: ``protobuf`` is only
needed by the parts that read these formats.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from types import SimpleNamespace
from typing import Any

from torchestimator.errors import PicklableError

__all__ = [
    "MessageDecodeError",
    "TextFormatError",
    "add_field",
    "add_map",
    "add_tensor_shape_proto",
    "encode_varint",
    "length_delimited",
    "length_delimited_start",
    "message_classes",
    "new_file",
    "parse_binary",
    "parse_text",
    "text_field_lines",
]


class MessageDecodeError(ValueError):
    """Bytes the protobuf runtime refused as a serialized message; the reader adds where they came from."""


class TextFormatError(PicklableError, ValueError):
    """Text the protobuf runtime refused as a text-format message.

    ``problem`` is the runtime's message without its location; ``line`` and
    ``column`` are 1-based, or None when the runtime gave none.
    """

    def __init__(self, problem: str, line: int | None, column: int | None) -> None:
        super().__init__(problem if line is None else f"{line}:{column}: {problem}")
        self.problem, self.line, self.column = problem, line, column


# ----------------------------------------------------------------------------- descriptors


def new_file(name: str, package: str, *dependencies: str) -> Any:
    """An empty proto3 ``FileDescriptorProto``; messages are added with ``file.message_type.add(name=...)``."""
    from google.protobuf import descriptor_pb2

    return descriptor_pb2.FileDescriptorProto(
        name=name, package=package, syntax="proto3", dependency=list(dependencies)
    )


def add_field(
    message: Any,
    name: str,
    number: int,
    field_type: str,
    type_name: str = "",
    *,
    repeated: bool = False,
    packed: bool = False,
    oneof: int | None = None,
) -> None:
    """Add one field to a ``DescriptorProto``.

    ``field_type`` is the .proto type word ("int64", "string", "message", "enum", ...);
    ``type_name`` the fully qualified name (".tensorflow.Feature") for messages and enums.
    """
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FieldDescriptorProto
    field = message.field.add(name=name, number=number, type=proto.Type.Value(f"TYPE_{field_type.upper()}"))
    field.label = proto.LABEL_REPEATED if repeated else proto.LABEL_OPTIONAL
    if type_name:
        field.type_name = type_name
    if packed:
        field.options.packed = True
    if oneof is not None:
        field.oneof_index = oneof


def add_map(
    message: Any,
    full_name: str,
    field_name: str,
    number: int,
    key_type: str,
    value_type: str,
    value_type_name: str = "",
) -> None:
    """Add ``map<key_type, value_type> field_name = number;`` to the message whose full name is ``full_name``.

    As protoc does: a nested ``<FieldName>Entry`` message marked map_entry, and a repeated field of it.
    """
    entry_name = "".join(part[:1].upper() + part[1:] for part in field_name.split("_")) + "Entry"
    entry = message.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    add_field(entry, "key", 1, key_type)
    add_field(entry, "value", 2, value_type, value_type_name)
    add_field(message, field_name, number, "message", f".{full_name}.{entry_name}", repeated=True)


def add_tensor_shape_proto(file: Any) -> None:
    """tensorflow.TensorShapeProto (tensor_shape.proto) into ``file``, whose package must be "tensorflow".

    Both readers that meet it (TF checkpoints' BundleEntryProto, TF Serving's TensorProto) define it in their own
    pool, so the field table lives once, here.
    """
    shape = file.message_type.add(name="TensorShapeProto")
    dim = shape.nested_type.add(name="Dim")
    add_field(dim, "size", 1, "int64")
    add_field(dim, "name", 2, "string")
    add_field(shape, "dim", 2, "message", ".tensorflow.TensorShapeProto.Dim", repeated=True)
    add_field(shape, "unknown_rank", 3, "bool")


def message_classes(files: Iterable[Any], names: Sequence[str]) -> SimpleNamespace:
    """Message classes for the full ``names`` (e.g. "tensorflow.Example"), from ``files`` in a private pool.

    Returns a namespace with each class under its short name, and the pool as
    ``pool`` (text-format parsing of ``Any`` fields needs it). Dependencies on
    protobuf's own files (``google/protobuf/wrappers.proto``, ...) are copied in
    from the runtime; ``files`` come dependencies first.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    files = list(files)
    own = {file.name for file in files}
    well_known = sorted({name for file in files for name in file.dependency if name not in own})
    for name in well_known:
        if not name.startswith("google/protobuf/"):
            raise ValueError(f"{name}: a dependency neither defined here nor one of protobuf's own files.")
        # google/protobuf/wrappers.proto is compiled into google.protobuf.wrappers_pb2, and so on.
        module = importlib.import_module("google.protobuf." + name.removeprefix("google/protobuf/")[:-6] + "_pb2")
        file_proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(file_proto)
        pool.Add(file_proto)
    for file_proto in files:
        pool.Add(file_proto)
    classes = {
        name.rpartition(".")[2]: message_factory.GetMessageClass(pool.FindMessageTypeByName(name)) for name in names
    }
    return SimpleNamespace(pool=pool, **classes)


# ----------------------------------------------------------------------------- parsing


def parse_binary(message_class: Any, data: bytes) -> Any:
    """``message_class`` parsed from serialized bytes; MessageDecodeError when they are not one."""
    from google.protobuf.message import DecodeError

    try:
        return message_class.FromString(data)
    except DecodeError as error:
        raise MessageDecodeError(f"not a valid serialized {message_class.DESCRIPTOR.name} ({error})") from None


def parse_text(text: str, message_class: Any, pool: Any = None) -> Any:
    """``message_class`` parsed from protobuf text format (comments, commas and all); TextFormatError if not one."""
    from google.protobuf import text_format

    message = message_class()
    try:
        text_format.Parse(text, message, descriptor_pool=pool)
    except text_format.ParseError as error:
        problem, line, column = str(error), error.GetLine(), error.GetColumn()
        if line is not None:  # the runtime puts "line:column : " in front of the problem
            problem = problem.split(" : ", 1)[-1]
        raise TextFormatError(problem, line, column) from None
    return message


def text_field_lines(text: str, field: str) -> list[int]:
    """The 1-based line of each ``field`` name in a text-format message, in order; comments are skipped.

    For errors about a value the parser accepted but the caller refuses: the
    parsed message keeps no positions, so the caller finds its line here.
    """
    from google.protobuf import text_format

    lines, previous = [], ""
    tokenizer = text_format.Tokenizer(text.splitlines(True))
    while not tokenizer.AtEnd():
        if tokenizer.token == field and previous != ":":
            lines.append(tokenizer._line + 1)  # the tokenizer's only record of where a token is
        previous = tokenizer.token
        tokenizer.NextToken()
    return lines


# ----------------------------------------------------------------------------- wire encoding
# Kept by hand: the runtime's own encoders are private (google.protobuf.internal), and these two let a caller
# give the C parser a packed list as bytes (MergeFromString) rather than one Python number at a time.

_ONE_BYTE = tuple(bytes((value,)) for value in range(256))


def encode_varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2): tag, length, payload; for field numbers up to 15."""
    return _ONE_BYTE[number << 3 | 2] + encode_varint(len(payload)) + payload


def length_delimited_start(data: bytes) -> int:
    """Where the payload starts in ``data``, a serialized message whose first field is length-delimited
    (number up to 15): after the one-byte tag and the length's varint."""
    start = 2
    while data[start - 1] >= 0x80:
        start += 1
    return start
