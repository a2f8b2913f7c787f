"""A key present twice in one record: the copy TensorFlow's parsers read (the columns of _columns.py ask here).

Only reached when the copy protobuf kept has no list: the record is read again as its map entries in wire
order, which protobuf's merged message no longer shows.
"""

from __future__ import annotations

import functools
from typing import Any

from torchestimator._io import protobuf as _protobuf
from torchestimator.data.example import example_protos

__all__ = ["RecordSource", "last_listed_copy"]


class RecordSource:
    """The record the Example parsers are on, shared by their columns (read only to look back)."""

    __slots__ = ("record",)

    def __init__(self) -> None:
        self.record: Any = b""


@functools.cache
def _entries_message() -> Any:
    """Example/SequenceExample field 1 seen as its map entries in wire order, copies of a key apart."""
    add = _protobuf.add_field
    file = _protobuf.new_file("torchestimator/data/feature_entries.proto", "torchestimator_entries")
    entry = file.message_type.add(name="Entry")
    add(entry, "key", 1, "string")
    add(entry, "value", 2, "bytes")
    add(file.message_type.add(name="Entries"), "feature", 1, "message", ".torchestimator_entries.Entry", repeated=True)
    add(
        file.message_type.add(name="Record"), "features", 1, "message", ".torchestimator_entries.Entries", repeated=True
    )
    return _protobuf.message_classes([file], ["torchestimator_entries.Record"]).Record


def last_listed_copy(record: Any, key: str) -> Any:
    """The last copy of `key` in `record` with a list set (a `Feature`), None when no copy has one.

    A key can be present several times in one record: Examples' bytes concatenated (protobuf merges
    their maps) or one map holding it twice. Protobuf keeps the last copy; TensorFlow's fast parsers read
    the copies last to first and skip a `Feature()` with no list (`DT_INVALID`), except the batched
    parser for VarLen and Ragged specs, which takes the last copy whatever it holds (so protobuf's). The
    columns come here only when the copy protobuf kept has no list, and only where TF looks further.
    """
    listed = None
    for features in _entries_message().FromString(bytes(record)).features:
        for entry in features.feature:
            if entry.key == key:
                feature = example_protos().Feature.FromString(entry.value)
                if feature.WhichOneof("kind") is not None:
                    listed = feature
    return listed
