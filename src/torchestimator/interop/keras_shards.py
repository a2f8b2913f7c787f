"""Read sharded Keras 3 weights (``x.weights.json`` and its parts) as one source, named as the unsharded file.

What belongs here: Keras 3's sharded layout, checking it, and merging its parts. What does not: naming the
tensors (``keras_h5``'s Keras 3 walk does it, on the merged tree) or matching them onto a model.

Keras 3 ``model.save_weights("x.weights.json", max_shard_size=GB)`` writes the index ``x.weights.json``::

    {"metadata": {"total_size": <bytes>},
     "weight_map": {"/vars": "x_00000.weights.h5",
                    "/layers/dense/vars": ["x_00000.weights.h5", "x_00001.weights.h5"], ...}}

next to the parts ``x_00000.weights.h5``, ``x_00001.weights.h5``, ... Each part is an HDF5 file with the tree
of a ``.weights.h5`` holding some of the variables, in write order; a layer's variables may be split over two
parts (weight_map then lists both), and the ``name`` attribute of its ``vars`` group is only in the part that
was current when Keras started the layer. Groups of layers without variables are in no weight_map entry.

How they are read: every part is opened and checked like a ``.weights.h5`` (no external links; each dataset
refused at read time if it declares more than its part holds); their trees are merged into an in-memory HDF5
file with the groups, the ``name`` attributes, and empty datasets of each variable's shape and dtype (no values
are copied), the groups holding variables created in weight_map's order (Keras's write order), with creation
order tracked. ``keras_h5`` walks that tree as it walks an unsharded file, so names, aliases and layer order
are the same; a read goes to the part holding the tensor.

Errors name the index file: a part it lists that is missing or unreadable, a part name with a folder (parts
sit next to the index), a variable group weight_map places in a part that lacks it, variables in a part that
weight_map does not place there (a part from another save), a variable stored in two parts.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Any

from torchestimator.interop.keras_config import MAX_CONFIG_BYTES
from torchestimator.interop.keras_h5 import (
    KerasH5Source,
    _closed_on_error,
    _Entry,
    _Layout,
    _open_checked,
    _read_layout,
    _string_attr,
    h5py,
)
from torchestimator.interop.source import WeightSourceError

__all__ = ["ShardedKerasSource", "open_sharded_keras"]

_EXPECTED = (
    'expected the index Keras 3 save_weights("x.weights.json", max_shard_size=...) writes: '
    '{"metadata": {...}, "weight_map": {"/layers/<group>/vars": "x_00000.weights.h5", ...}}'
)


@dataclasses.dataclass(frozen=True)
class _Part:
    """One open part of the sharded weights."""

    name: str  # as the index names it: a file name next to the index
    handle: Any
    size: int


class ShardedKerasSource(KerasH5Source):
    """Tensors of sharded Keras 3 weights: the merged tree names them, each part holds its own values."""

    def __init__(
        self, path: str, layout: _Layout, merged: Any, closers: list[Any], parts: list[_Part], owner: dict[str, int]
    ) -> None:
        super().__init__(path, layout, merged, closers, real_size=0)
        self.parts = tuple(part.name for part in parts)
        """The part files, in write order."""
        self._parts = parts
        self._owner = owner  # merged dataset path -> index in parts

    def _dataset(self, entry: _Entry) -> tuple[Any, int]:
        part = self._parts[self._owner[entry.h5_path]]
        return part.handle[entry.h5_path], part.size


def open_sharded_keras(path: str) -> ShardedKerasSource:
    """Open ``x.weights.json`` and every part it lists; `WeightSourceError` naming the index if unusable."""
    closers: list[Any] = []
    with _closed_on_error(closers, f"{path}: a part of these sharded Keras weights is corrupt or truncated"):
        weight_map = _read_index(path)
        names = list(dict.fromkeys(name for names in weight_map.values() for name in names))
        parts = [_open_part(path, name, closers) for name in names]
        _check_weight_map(path, weight_map, parts)
        merged, owner = _merge(path, weight_map, parts, closers)
        layout = _read_layout(path, merged, None)
    return ShardedKerasSource(path, layout, merged, closers, parts, owner)


def _read_index(path: str) -> dict[str, list[str]]:
    """weight_map of the index: variable group path -> the parts holding it, checked to be plain file names."""
    size = os.path.getsize(path)
    if size > MAX_CONFIG_BYTES:
        raise WeightSourceError(f"{path}: {size} bytes, over the {MAX_CONFIG_BYTES}-byte limit; {_EXPECTED}.")
    with open(path, "rb") as handle:
        text = handle.read()
    try:
        index = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise WeightSourceError(f"{path}: not JSON ({error}); {_EXPECTED}.") from error
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightSourceError(f"{path}: no non-empty 'weight_map' object; {_EXPECTED}.")
    result: dict[str, list[str]] = {}
    for key, value in weight_map.items():
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
            raise WeightSourceError(
                f"{path}: weight_map[{key!r}] is {value!r}; expected a part's file name or a list of them."
            )
        for name in names:
            if name in ("", ".", "..") or os.path.basename(name) != name or "\\" in name:
                raise WeightSourceError(
                    f"{path}: weight_map[{key!r}] names the part {name!r}; a part is a file "
                    "name next to the index, without a folder."
                )
        result[key] = names
    return result


def _open_part(path: str, name: str, closers: list[Any]) -> _Part:
    location = os.path.join(os.path.dirname(path), name)
    if not os.path.isfile(location):
        raise WeightSourceError(
            f"{path}: the part {name!r} its weight_map lists is missing ({location}). Keep "
            "every part Keras wrote with this index next to it."
        )
    try:
        handle, _, size = _open_checked(location, closers)
    except WeightSourceError as error:
        raise WeightSourceError(f"{path}: the part {name!r} is unusable: {error}") from error
    return _Part(name, handle, size)


def _check_weight_map(path: str, weight_map: dict[str, list[str]], parts: list[_Part]) -> None:
    """Each variable group where weight_map puts it, and no variables a part holds that it does not list."""
    by_name = {part.name: part for part in parts}
    for key, names in weight_map.items():
        for name in names:
            if not isinstance(by_name[name].handle.get(key), h5py.Group):
                raise WeightSourceError(
                    f"{path}: weight_map puts the variables {key!r} in the part {name!r}, which has no such group: "
                    "the part is not the one written with this index. Save the weights again, or copy all parts."
                )
    for part in parts:
        listed = {key for key, names in weight_map.items() if part.name in names}
        for group in _groups_depth_first(path, part):
            holds = any(
                isinstance(group.get(key, getlink=True), h5py.HardLink) and isinstance(group.get(key), h5py.Dataset)
                for key in group
            )
            if holds and group.name not in listed:
                raise WeightSourceError(
                    f"{path}: the part {part.name!r} holds variables under {group.name!r}, which weight_map does "
                    "not place there: the part is not the one written with this index."
                )


def _merge(
    path: str, weight_map: dict[str, list[str]], parts: list[_Part], closers: list[Any]
) -> tuple[Any, dict[str, int]]:
    """The merged tree (groups, name attributes, empty datasets) and, per dataset, the part that holds it.

    The groups holding variables are created first, in weight_map's order: Keras adds each to the map when it
    writes the group's first variable, so that is the write order (object header addresses within a part are
    not: HDF5 reuses freed space). The rest (layers without variables) follow; their order names nothing.
    """
    merged = h5py.File(io.BytesIO(), "w", track_order=True)
    closers.append(merged)
    for key in weight_map:
        _require_tracked_group(merged, key)
    owner: dict[str, int] = {}
    for index, part in enumerate(parts):
        for group in _groups_depth_first(path, part):
            target = _require_tracked_group(merged, group.name)
            if "name" in group.attrs and "name" not in target.attrs:
                target.attrs["name"] = _string_attr(group, "name")
            for key in group:
                if not isinstance(group.get(key, getlink=True), h5py.HardLink):
                    continue
                dataset = group[key]
                if not isinstance(dataset, h5py.Dataset):
                    continue
                where = f"{group.name.rstrip('/')}/{key}"
                if where in owner:
                    raise WeightSourceError(
                        f"{path}: the variable {where!r} is in two parts, {parts[owner[where]].name!r} and "
                        f"{part.name!r}; Keras writes each variable once."
                    )
                copy = target.create_dataset(key, shape=dataset.shape, dtype=dataset.dtype)
                if "dtype" in dataset.attrs:  # Keras 3 marks bfloat16 values this way
                    copy.attrs["dtype"] = _string_attr(dataset, "dtype")
                owner[where] = index
    return merged, owner


def _require_tracked_group(merged: Any, name: str) -> Any:
    """The group at `name`, created with its ancestors, each tracking creation order, where missing."""
    group = merged
    for component in name.strip("/").split("/") if name.strip("/") else []:
        group = group[component] if component in group else group.create_group(component, track_order=True)
    return group


def _groups_depth_first(path: str, part: _Part) -> list[Any]:
    """The part's groups (hard links only), depth first; a group reached twice is refused."""
    order: list[Any] = []
    pending, seen = [part.handle], set()
    while pending:
        group = pending.pop()
        address = h5py.h5o.get_info(group.id).addr
        if address in seen:
            raise WeightSourceError(
                f"{path}: in the part {part.name!r}, the group {group.name!r} is reached twice "
                "(a link back into the tree); Keras writes each group once."
            )
        seen.add(address)
        order.append(group)
        pending += [
            group[key]
            for key in group
            if isinstance(group.get(key, getlink=True), h5py.HardLink) and isinstance(group[key], h5py.Group)
        ]
    return order
