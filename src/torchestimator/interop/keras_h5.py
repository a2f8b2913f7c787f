"""Read Keras weight files (HDF5 and the `.keras` archive) as a `WeightSource`.

What belongs here: finding the arrays in the layouts Keras writes and naming
them; see /work/shared/reference/formats.md section 4. What does not: layout
conversion to PyTorch (transposes, BatchNorm epsilon) and matching names onto
a model; those belong to the warm-start layer above.

Layouts and the names this module gives their tensors:

* **Legacy** (format ``"keras_h5"``): Keras 2 ``save_weights('x.h5')`` (layer
  groups at the root), Keras 2 and Keras 3 ``model.save('x.h5')`` (the same
  tree under ``/model_weights``). Each layer group lists its weights in the
  ``weight_names`` attribute, in Keras's loading order (trainable, then
  non-trainable); the root lists layers in ``layer_names``. Chunked attributes
  (``layer_names0``, ``layer_names1``, ...) are joined. A tensor's name is its
  weight name with a trailing ``:0`` removed (Keras 2 writes ``conv/kernel:0``,
  Keras 3 ``conv/kernel``), prefixed with ``<layer>/`` when the weight name
  does not already start with it (weights of a nested model, e.g.
  ``inner/inner_fc/kernel``). Optimizer state of a full model is exposed as
  ``optimizer_weights/<weight name>``.
* **Keras 3** (format ``"keras3_weights_h5"``): ``save_weights('x.weights.h5')``
  and the ``model.weights.h5`` member of a ``.keras`` zip archive (read from
  the zip without extracting it). A tensor's name is its HDF5 path,
  ``layers/<group>/vars/<i>``, where the group is Keras's snake_case class
  name (``conv2d``, ``dense_1``), not the user's layer name. Optimizer state is
  ``optimizer/vars/<i>``.

  Friendly aliases (`aliases()`, also accepted by `read`) rebuild Keras 3's
  own variable paths, e.g. ``conv/kernel``, ``lstm/lstm_cell/kernel``,
  ``inner/inner_fc/bias``: the user names come from the ``name`` attribute of
  each ``vars`` group, and the variable names from the known save order of
  standard layers (``_KNOWN_VARIABLES``: kernel, bias; gamma, beta,
  moving_mean, moving_variance; ...). The layer class comes from the archive's
  ``config.json`` when there is one (which also tells ``use_bias=False``,
  ``center``/``scale=False`` apart), else from the group name. A layer whose
  variable count does not match gets no alias rather than a wrong one.

`layers()` lists the layers that hold weights, in the model's order, with
their tensors in Keras's order, for matchers that pair layers by position.
Legacy files record that order; for Keras 3 it is ``config.json``'s order when
available, else the order the groups were written in, recovered from their
object header addresses (HDF5 lists links alphabetically, and Keras does not
turn on creation-order tracking). That holds for files Keras wrote in one go.

Depthwise kernels: Keras 3 calls a DepthwiseConv1D/2D weight ``kernel`` (Keras 2
``depthwise_kernel``), though its layout is ``[*spatial, in, multiplier]``, not a
Conv's. Such a kernel also gets the alias ``<layer>/depthwise_kernel``, listed
after ``<layer>/kernel`` (so a view keeping one name per tensor shows it), for a
legacy file too. The layer's class comes from the file's config (``config.json``,
legacy ``model_config``), else, in a ``.weights.h5``, from its group name
(``depthwise_conv2d_3``: Keras names groups after the class); a layer of a custom
class in a file without config gets no alias (the matcher's advice then names
the kernels whose shape would fit).

`layer_config(name)` gives the config entry of the layer holding a tensor
(BatchNormalization's ``epsilon``/``momentum`` for the warm-start advice); None
without a config. Sharded Keras 3 weights (``x.weights.json`` and its parts) are
read as one source by ``keras_shards``; `open_keras_h5` hands them over.

Nothing in a file is evaluated: only arrays, string attributes and JSON are
read, so Lambda layers or custom objects in a config are never deserialized.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy

from torchestimator._extras import import_extra
from torchestimator.interop.keras_config import (
    MAX_CONFIG_BYTES,
    class_of,
    depthwise_alias,
    index_layer_configs,
    layer_config_for,
    parse_config,
    snake_case,
)
from torchestimator.interop.keras_hdf5_guard import (
    HeapGuard,
    _DamagedHeapError,
    global_heap_problem as _global_heap_problem,  # noqa: F401 - tests
    stored_member,
)
from torchestimator.interop.source import ZIP_ERRORS, TensorInfo, WeightSource, WeightSourceError, missing_tensor_error

try:  # h5py is the optional "keras" extra; the error comes when a file is opened (open_keras_h5).
    import h5py
except ImportError:  # pragma: no cover - exercised only without the extra
    h5py = None

__all__ = ["KerasH5Source", "is_keras_h5", "open_keras_h5"]

logger = logging.getLogger(__name__)

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
ZIP_SIGNATURE = b"PK\x03\x04"
ARCHIVE_WEIGHTS_MEMBER = "model.weights.h5"
ARCHIVE_CONFIG_MEMBER = "config.json"
SHARDED_SUFFIX = ".weights.json"  # Keras 3 save_weights(..., max_shard_size=...): the index of the parts
KERAS_SUFFIXES = (".h5", ".hdf5", ".keras", SHARDED_SUFFIX)
_SHARD_PART = re.compile(r"(?P<base>.+)_\d{5}\.weights\.h5$")  # Keras's name of one part: x_00001.weights.h5
# Bounds on what a file may declare, so that a small crafted file cannot make a read allocate gigabytes.
# Deflate (gzip) cannot expand data more than 1032-fold; no HDF5 codec a weights file uses does more.
MAX_COMPRESSION_RATIO = 1100
_SIZE_KEEPING_FILTERS = (h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32) if h5py is not None else ()
_READ_ERRORS = (KeyError, RuntimeError, TypeError, *ZIP_ERRORS)

# Save order of standard Keras 3 layers (their `save_own_variables`), by snake_case class name.
_KNOWN_VARIABLES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        (
            "dense",
            "einsum_dense",
            "conv1d",
            "conv2d",
            "conv3d",
            "conv1d_transpose",
            "conv2d_transpose",
            "conv3d_transpose",
            "depthwise_conv1d",
            "depthwise_conv2d",
        ),
        ("kernel", "bias"),
    ),
    "separable_conv1d": ("depthwise_kernel", "pointwise_kernel", "bias"),
    "separable_conv2d": ("depthwise_kernel", "pointwise_kernel", "bias"),
    "batch_normalization": ("gamma", "beta", "moving_mean", "moving_variance"),
    "layer_normalization": ("gamma", "beta"),
    "embedding": ("embeddings",),
    "lstm_cell": ("kernel", "recurrent_kernel", "bias"),
    "gru_cell": ("kernel", "recurrent_kernel", "bias"),
    "simple_rnn_cell": ("kernel", "recurrent_kernel", "bias"),
}
# Config flags that remove a variable from the save order when false.
_OPTIONAL_VARIABLES = {"bias": "use_bias", "beta": "center", "gamma": "scale"}


@dataclasses.dataclass(frozen=True)
class _Entry:
    """Where one tensor lives in the HDF5 file, and what it is called."""

    name: str
    h5_path: str
    info: TensorInfo
    bfloat16: bool = False


@dataclasses.dataclass
class _Layout:
    """What reading a file's tree gives: its layout name, tensors, layer order, aliases and layer configs."""

    format: str
    entries: list[_Entry]
    layer_order: list[tuple[str, list[str]]]
    aliases: dict[str, str]
    layer_configs: dict[str, dict[str, Any]]  # tensor name -> its layer's config entry


class KerasH5Source(WeightSource):
    """Tensors of one Keras weight file, read lazily from the open HDF5 file."""

    def __init__(self, path: str, layout: _Layout, handle: Any, closers: list[Any], real_size: int) -> None:
        self.path = path
        self._real_size = real_size  # bytes of the HDF5 file (the member's size inside a .keras archive)
        self.format = layout.format
        self._handle = handle
        self._entries = {entry.name: entry for entry in layout.entries}
        self._layer_order = layout.layer_order
        self._aliases = layout.aliases
        self._layer_configs = layout.layer_configs
        self._closers = closers

    def tensors(self) -> list[TensorInfo]:
        return sorted((entry.info for entry in self._entries.values()), key=lambda info: info.name)

    def layers(self) -> list[tuple[str, list[TensorInfo]]]:
        """Layers holding weights, in model order, each with its tensors in Keras's order."""
        return [(layer, [self._entries[name].info for name in names]) for layer, names in self._layer_order]

    def aliases(self) -> dict[str, str]:
        """Friendly name (e.g. ``conv/kernel``) -> tensor name; for legacy files, whose names are friendly, only
        the ``depthwise_kernel`` names of Keras 3 depthwise kernels."""
        return dict(self._aliases)

    def layer_config(self, name: str) -> dict[str, Any] | None:
        """The config entry (``{"class_name": ..., "config": {...}}``) of the layer holding tensor `name` (a
        tensor name or alias), as the file records it; None when it records none (a ``.weights.h5``)."""
        return self._layer_configs.get(self._aliases.get(name, name))

    def read(self, name: str) -> numpy.ndarray:
        entry = self._entries.get(self._aliases.get(name, name))
        if entry is None:
            raise missing_tensor_error(self.path, name, [*self._entries, *self._aliases])
        if self._handle is None:
            raise WeightSourceError(f"{self.path}: the source is closed; open it again to read {name!r}.")
        try:
            dataset, real_size = self._dataset(entry)
            self._check_declared_size(entry, dataset, real_size)
            value = dataset[()]
        except WeightSourceError:
            raise
        except _READ_ERRORS as error:
            raise WeightSourceError(
                f"{self.path}: cannot read variable {entry.name!r} (HDF5 path {entry.h5_path!r}); "
                f"the file is corrupt or truncated: {error}"
            ) from error
        return _bfloat16_to_float32(value) if entry.bfloat16 else numpy.asarray(value)

    def _dataset(self, entry: _Entry) -> tuple[Any, int]:
        """The HDF5 dataset holding `entry`, and the size of the file it is in (a sharded source overrides)."""
        return self._handle[entry.h5_path], self._real_size

    def _check_declared_size(self, entry: _Entry, dataset: Any, real_size: int) -> None:
        """Refuse, before allocating, a dataset whose values are not in the file.

        Keras writes every value of every variable, so a legitimate dataset's
        bytes are all stored: exactly (uncompressed) or at most
        ``MAX_COMPRESSION_RATIO`` times denser (compressed chunks), and the
        storage lies inside the file. A dataset with no storage allocated would
        read as its fill value, which is how a 4 KB file can declare 8 GB.
        """
        plist = dataset.id.get_create_plist()
        _refuse_other_files(self.path, entry, plist, dataset.id.get_type().get_class())
        shape = dataset.shape or ()
        needed = math.prod(shape) * dataset.dtype.itemsize
        stored = dataset.id.get_storage_size()
        filters = [plist.get_filter(index)[0] for index in range(plist.get_nfilters())]
        compressed = any(code not in _SIZE_KEEPING_FILTERS for code in filters)
        ratio = MAX_COMPRESSION_RATIO if compressed else 1
        problem = None
        if stored > real_size:
            problem = f"its storage is {stored} bytes, more than the whole file ({real_size} bytes)"
        elif needed > stored * ratio:
            how = f"compressed at most {ratio}-fold" if compressed else "uncompressed"
            problem = (
                f"shape {list(shape)} of {dataset.dtype} needs {needed} bytes, but only {stored} bytes are "
                f"stored ({how}); the rest would be fill values no Keras writer leaves"
            )
        if problem:
            raise WeightSourceError(
                f"{self.path}: variable {entry.name!r} (HDF5 path {entry.h5_path!r}) declares more data than the "
                f"file holds: {problem}. The file is corrupt or crafted."
            )

    def close(self) -> None:
        if self._handle is None:
            return
        self._handle = None
        for closer in reversed(self._closers):
            closer.close()
        self._closers = []


def _refuse_other_files(path: str, entry: _Entry, plist: Any, dataset_type_class: int) -> None:
    """Refuse a dataset whose values HDF5 would read from other files (external storage, virtual datasets)
    or whose type is a variable-length sequence.

    Keras stores every value inside the weight file; a dataset pointing at
    ``/etc/passwd`` or another HDF5 file would turn loading weights into
    reading whatever file the writer named.
    """
    where = None
    if dataset_type_class == h5py.h5t.VLEN:  # h5py can crash on a damaged one; Keras writes none
        where = "its values are variable-length sequences, which Keras never writes"
    elif plist.get_external_count():
        files = [plist.get_external(index)[0].decode("utf-8", "replace") for index in range(plist.get_external_count())]
        where = f"its values are stored in external file(s) {files}"
    elif plist.get_layout() == h5py.h5d.VIRTUAL:
        where = "it is a virtual dataset, whose values are mapped from other datasets or files"
    if where:
        raise WeightSourceError(
            f"{path}: variable {entry.name!r} (HDF5 path {entry.h5_path!r}) is refused: {where}. Keras stores "
            "every value inside the weight file; this file is crafted or not written by Keras."
        )


def _refuse_external_links(path: str, handle: Any) -> None:
    """Refuse a file with external links before any lookup follows one (HDF5 opens the named file).

    Walked by hand rather than with ``visititems_links``: an HDF5 error inside
    h5py's visit callback comes out as a SystemError.
    """
    found: list[str] = []
    pending, seen = [handle], set()
    while pending:
        group = pending.pop()
        address = h5py.h5o.get_info(group.id).addr
        if address in seen:
            continue
        seen.add(address)
        for key in group:
            link = group.get(key, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                found.append(f"{group.name.rstrip('/')}/{key} -> {link.filename}:{link.path}")
            elif isinstance(link, h5py.HardLink) and isinstance(child := group.get(key), h5py.Group):
                pending.append(child)  # soft links name paths inside this file, reached through hard links
    if found:
        raise WeightSourceError(
            f"{path}: refused: external link(s) to other files ({', '.join(found[:5])}). Keras weight files hold "
            "all their groups and datasets themselves; this file is crafted or not written by Keras."
        )


def is_keras_h5(path: str | os.PathLike[str]) -> bool:
    """Whether `path` looks like a Keras weight file: HDF5 signature, a .keras zip, or a Keras suffix.

    The suffix alone counts, so that a damaged ``x.h5`` reaches `open_keras_h5`
    and gets its specific error instead of "unknown format".
    """
    text = os.fspath(path)
    if not os.path.isfile(text):
        return text.lower().endswith(KERAS_SUFFIXES)
    try:
        with open(text, "rb") as handle:
            head = handle.read(8)
    except OSError:
        return False
    if head == HDF5_SIGNATURE or text.lower().endswith(KERAS_SUFFIXES):
        return True
    if head[:4] == ZIP_SIGNATURE:
        try:
            with zipfile.ZipFile(text) as archive:
                return ARCHIVE_WEIGHTS_MEMBER in archive.namelist()
        except ZIP_ERRORS:
            return False
    return False


def open_keras_h5(path: str | os.PathLike[str]) -> KerasH5Source:
    """Open a Keras ``.h5``, ``.weights.h5``, ``.keras`` or sharded ``.weights.json``; `WeightSourceError` naming
    the file if unusable, `MissingExtraError` without h5py (the ``keras`` extra)."""
    if h5py is None:  # the import failed when this module loaded: trying it again raises, saying why in one line
        import_extra("h5py", extra="keras", feature=f"reading the Keras file {os.fspath(path)}")
    text = os.fspath(path)
    expected = "Expected a Keras .h5, .weights.h5, .keras or sharded .weights.json file."
    if not os.path.exists(text):
        raise WeightSourceError(f"{text}: no such file. {expected}")
    if os.path.isdir(text):
        raise WeightSourceError(f"{text}: is a directory. {expected}")
    if text.lower().endswith(SHARDED_SUFFIX):
        from torchestimator.interop.keras_shards import open_sharded_keras  # builds on this module

        return open_sharded_keras(text)
    _warn_if_one_part(text)
    closers: list[Any] = []
    with _closed_on_error(closers, f"{text}: corrupt or truncated Keras HDF5 file"):
        handle, config, real_size = _open_checked(text, closers)
        layout = _read_layout(text, handle, config)
    logger.debug("Opened %s as %s with %d tensors", text, layout.format, len(layout.entries))
    return KerasH5Source(text, layout, handle, closers, real_size)


def _open_checked(path: str, closers: list[Any]) -> tuple[Any, dict[str, Any] | None, int]:
    """`_open_hdf5`, the handle added to `closers`, files with external links refused."""
    handle, config, real_size = _open_hdf5(path, closers)
    closers.append(handle)
    _refuse_external_links(path, handle)
    return handle, config, real_size


def _warn_if_one_part(path: str) -> None:
    """Say so when `path` is one part of sharded weights: it holds only some of the model's tensors."""
    match = _SHARD_PART.match(os.path.basename(path))
    index = os.path.join(os.path.dirname(path), f"{match['base']}{SHARDED_SUFFIX}") if match else None
    if index is not None and os.path.isfile(index):
        logger.warning(
            "%s is one part of the sharded Keras weights %s and holds only some of the tensors; "
            "open %s to read them all.",
            path,
            index,
            index,
        )


@contextlib.contextmanager
def _closed_on_error(closers: list[Any], corrupt: str) -> Iterator[None]:
    """Closes what the body opened if it fails; an HDF5 or zip read error becomes a WeightSourceError that
    starts with ``corrupt`` (the file, and what is wrong with it)."""
    try:
        yield
    except WeightSourceError:
        _close_all(closers)
        raise
    except _READ_ERRORS as error:
        _close_all(closers)
        raise WeightSourceError(f"{corrupt}: {error}") from error


def _close_all(closers: list[Any]) -> None:
    for closer in reversed(closers):
        try:
            closer.close()
        except Exception:
            logger.debug("Ignoring an error while closing after a failed open", exc_info=True)


def _open_hdf5(path: str, closers: list[Any]) -> tuple[Any, dict[str, Any] | None, int]:
    """The open h5py.File, the archive's config.json for a .keras zip, and the HDF5 file's size."""
    with open(path, "rb") as probe:
        head = probe.read(8)
        size = os.fstat(probe.fileno()).st_size
    if head[:4] == ZIP_SIGNATURE:
        return _open_archive(path, closers)
    raw = open(path, "rb")  # noqa: SIM115 - closed with the source (closers)
    closers.append(raw)
    try:
        return h5py.File(HeapGuard(raw), "r"), None, size
    except OSError as error:
        if head != HDF5_SIGNATURE:
            raise WeightSourceError(
                f"{path}: not an HDF5 file (its first bytes are {head!r}, an HDF5 file starts with "
                f"{HDF5_SIGNATURE!r}). Expected a Keras .h5, .weights.h5 or .keras file."
            ) from error
        raise WeightSourceError(f"{path}: corrupt or truncated HDF5 file: {error}") from error


def _open_archive(path: str, closers: list[Any]) -> tuple[Any, dict[str, Any] | None, int]:
    try:
        archive = zipfile.ZipFile(path)
    except ZIP_ERRORS as error:
        raise WeightSourceError(f"{path}: corrupt .keras archive (not a readable zip file): {error}") from error
    closers.append(archive)
    names = archive.namelist()
    if ARCHIVE_WEIGHTS_MEMBER not in names:
        raise WeightSourceError(
            f"{path}: the .keras archive has no {ARCHIVE_WEIGHTS_MEMBER!r} (members: {', '.join(names)}). "
            "Was it saved by Keras 3 model.save('x.keras')?"
        )
    config = _read_archive_config(path, archive) if ARCHIVE_CONFIG_MEMBER in names else None
    try:
        info = archive.getinfo(ARCHIVE_WEIGHTS_MEMBER)
        member = stored_member(path, info) or archive.open(info)
        closers.append(member)
        # h5py reads the member through Python's file API, so nothing is extracted to disk.
        return h5py.File(HeapGuard(member), "r"), config, archive.getinfo(ARCHIVE_WEIGHTS_MEMBER).file_size
    except _READ_ERRORS as error:
        raise WeightSourceError(
            f"{path}: corrupt or truncated {ARCHIVE_WEIGHTS_MEMBER} inside the .keras archive: {error}"
        ) from error


def _read_archive_config(path: str, archive: zipfile.ZipFile) -> dict[str, Any] | None:
    """config.json of a .keras archive (JSON only, never deserialized into objects); None when unusable."""
    declared = archive.getinfo(ARCHIVE_CONFIG_MEMBER).file_size
    try:
        if declared > MAX_CONFIG_BYTES:
            raise ValueError(f"it declares {declared} bytes, over the {MAX_CONFIG_BYTES}-byte limit")
        with archive.open(ARCHIVE_CONFIG_MEMBER) as member:
            config = json.loads(member.read(MAX_CONFIG_BYTES + 1))
    except (RecursionError, *ZIP_ERRORS) as error:
        logger.warning("%s: ignoring unreadable config.json (%s); aliases use group names", path, error)
        return None
    return config if isinstance(config, dict) else None


def _read_layout(path: str, handle: Any, config: dict[str, Any] | None) -> _Layout:
    """Which of the Keras layouts the file holds, and its tensors, layer order, aliases and layer configs."""
    if "model_weights" in handle and _has_chunked_attr(handle["model_weights"], "layer_names"):
        return _read_legacy(path, handle, handle["model_weights"])
    if _has_chunked_attr(handle, "layer_names"):
        return _read_legacy(path, handle, handle)
    if isinstance(handle.get("layers"), h5py.Group) or isinstance(handle.get("vars"), h5py.Group):
        return _read_keras3(path, handle, config)
    raise WeightSourceError(
        f"{path}: an HDF5 file without Keras weights. Expected a 'model_weights' group or a 'layer_names' "
        "attribute (Keras .h5), or 'layers'/'vars' groups (Keras 3 .weights.h5); found top-level keys "
        f"{sorted(handle.keys())} and attributes {sorted(handle.attrs.keys())}."
    )


# ----------------------------------------------------------------------------- legacy layout


def _read_legacy(path: str, handle: Any, root: Any) -> _Layout:
    entries: list[_Entry] = []
    layer_order: list[tuple[str, list[str]]] = []
    layer_names = _read_chunked_attr(root, "layer_names")
    if "top_level_model_weights" in root and "top_level_model_weights" not in layer_names:
        layer_names.append("top_level_model_weights")
    for layer in layer_names:
        if layer not in root:
            raise WeightSourceError(f"{path}: layer {layer!r} is listed in layer_names but has no group in the file.")
        group = root[layer]
        names = []
        for weight_name in _read_chunked_attr(group, "weight_names"):
            entry = _legacy_entry(path, group, layer, weight_name)
            entries.append(entry)
            names.append(entry.name)
        if names:
            layer_order.append((layer, names))
    model_entries = list(entries)
    if isinstance(handle.get("optimizer_weights"), h5py.Group):
        group = handle["optimizer_weights"]
        for weight_name in _read_chunked_attr(group, "weight_names"):
            entries.append(_legacy_entry(path, group, "optimizer_weights", weight_name, prefix_always=True))
    _check_unique(path, entries)
    layer_configs, aliases = _legacy_configs(path, handle, model_entries)
    return _Layout("keras_h5", entries, layer_order, aliases, layer_configs)


def _legacy_configs(path: str, handle: Any, entries: list[_Entry]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each tensor's layer config from ``model_config`` (``model.save('x.h5')``; Keras 2 ``save_weights('x.h5')``
    writes none), and the ``depthwise_kernel`` aliases of Keras 3 depthwise kernels."""
    if "model_config" not in handle.attrs:
        return {}, {}
    text = _decode_strings(_string_attr(handle, "model_config"))
    index = index_layer_configs(parse_config(path, text[0], "model_config") if text else None)
    names = {entry.name for entry in entries}
    configs: dict[str, dict[str, Any]] = {}
    aliases: dict[str, str] = {}
    for entry in entries:
        layer_path, _, variable = entry.name.rpartition("/")
        config = layer_config_for(index, tuple(layer_path.split("/")))
        if config is None:
            continue
        configs[entry.name] = config
        alias = depthwise_alias(layer_path, variable, class_of(config))
        if alias is not None and alias not in names:
            aliases[alias] = entry.name
    return configs, aliases


def _legacy_entry(path: str, group: Any, layer: str, weight_name: str, prefix_always: bool = False) -> _Entry:
    dataset = group.get(weight_name)
    if not isinstance(dataset, h5py.Dataset):
        raise WeightSourceError(
            f"{path}: variable {weight_name!r} of layer {layer!r} is listed in weight_names but missing from the file."
        )
    name = weight_name[:-2] if weight_name.endswith(":0") else weight_name
    if prefix_always or not name.startswith(layer + "/"):
        name = f"{layer}/{name}"
    return _make_entry(name, dataset)


def _check_unique(path: str, entries: list[_Entry]) -> None:
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise WeightSourceError(f"{path}: two variables are both named {entry.name!r} after removing ':0'.")
        seen.add(entry.name)


def _has_chunked_attr(group: Any, name: str) -> bool:
    return name in group.attrs or f"{name}0" in group.attrs


def _read_chunked_attr(group: Any, name: str) -> list[str]:
    """A list-of-strings attribute, joined from ``name0``, ``name1``, ... when Keras split it."""
    if name in group.attrs:
        return _decode_strings(_string_attr(group, name))
    values: list[str] = []
    index = 0
    while f"{name}{index}" in group.attrs:
        values.extend(_decode_strings(_string_attr(group, f"{name}{index}")))
        index += 1
    return values


def _string_attr(obj: Any, name: str) -> Any:
    """Attribute `name` of `obj`, read only when HDF5 stores it as strings (or as an empty list).

    Keras writes names as string attributes. Reading one whose datatype was
    damaged into a variable-length sequence crashed the process inside h5py
    (a segmentation fault), so the type is looked at before the values.
    """
    attribute = h5py.h5a.open(obj.id, name.encode("utf-8"))
    type_class = attribute.get_type().get_class()
    if type_class == h5py.h5t.STRING or (
        attribute.get_space().get_simple_extent_npoints() == 0 and type_class in (h5py.h5t.FLOAT, h5py.h5t.INTEGER)
    ):
        try:
            return obj.attrs[name]
        except _DamagedHeapError as error:  # its strings are in a damaged global heap collection
            raise TypeError(f"attribute {name!r} of {obj.name!r} cannot be read: {error}") from error
    # TypeError: the caller names the file (open_keras_h5 turns it into "corrupt ... Keras HDF5 file: ...").
    raise TypeError(
        f"attribute {name!r} of {obj.name!r} is not stored as strings (HDF5 type class {type_class}); "
        "Keras writes names as strings, so the file is corrupt or crafted"
    )


def _decode_strings(value: Any) -> list[str]:
    if isinstance(value, (str, bytes)):
        value = [value]
    # Attributes are variable-length str or fixed-length bytes; an empty list is stored as float64 [].
    return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in numpy.asarray(value).ravel()]


# ----------------------------------------------------------------------------- Keras 3 layout


@dataclasses.dataclass
class _Keras3Walk:
    """What the walk over a Keras 3 tree collects."""

    path: str
    config_index: dict[tuple[str, ...], dict[str, Any]]
    entries: list[_Entry] = dataclasses.field(default_factory=list)
    layer_order: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    layer_configs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    clashing: set[str] = dataclasses.field(default_factory=set)
    visited: set[int] = dataclasses.field(default_factory=set)  # object header addresses of groups walked

    def enter(self, group: Any) -> None:
        """Refuse a group reached twice: Keras writes a tree, and a link back up would walk forever."""
        address = h5py.h5o.get_info(group.id).addr
        if address in self.visited:
            raise WeightSourceError(
                f"{self.path}: group {group.name!r} is reached twice (a hard or soft link back into the tree); "
                "Keras writes each group once. The file is crafted or not written by Keras."
            )
        self.visited.add(address)

    def add_alias(self, alias: str, name: str) -> None:
        """An alias; one that two tensors would share is dropped later rather than pointing at either."""
        if alias in self.aliases:
            self.clashing.add(alias)
        self.aliases[alias] = name


def _read_keras3(path: str, handle: Any, config: dict[str, Any] | None) -> _Layout:
    walk = _Keras3Walk(path=path, config_index=index_layer_configs(config))
    _walk_container(walk, handle, chain=())
    names = {entry.name for entry in walk.entries}
    aliases = {alias: name for alias, name in walk.aliases.items() if alias not in walk.clashing | names}
    return _Layout("keras3_weights_h5", walk.entries, walk.layer_order, aliases, walk.layer_configs)


def _walk_container(walk: _Keras3Walk, group: Any, chain: tuple[str, ...]) -> None:
    """A model: its own variables, then its layers in model order, then its other attributes."""
    walk.enter(group)
    own = _collect_vars(walk, group, chain, config=walk.config_index.get(chain))
    if own:
        walk.layer_order.append(("/".join(chain) or _saveable_name(group, "model"), own))
    layers = group.get("layers")
    if isinstance(layers, h5py.Group):
        for key in _ordered_layer_keys(walk, layers, chain):
            child = layers[key]
            child_chain = (*chain, _saveable_name(child, key))
            if isinstance(child.get("layers"), h5py.Group):
                _walk_container(walk, child, child_chain)
            else:
                names = _walk_layer(walk, child, child_chain, config=walk.config_index.get(child_chain))
                if names:
                    walk.layer_order.append(("/".join(child_chain), names))
    for key in _by_address(group, exclude=("layers", "vars")):
        if not chain and key == "optimizer":
            _walk_layer(walk, group[key], (), config=None, aliases=False)
        else:
            names = _walk_layer(walk, group[key], (*chain, _saveable_name(group[key], key)), config=None)
            if names:
                walk.layer_order.append((group[key].name.strip("/"), names))


def _walk_layer(
    walk: _Keras3Walk, group: Any, chain: tuple[str, ...], config: dict[str, Any] | None, aliases: bool = True
) -> list[str]:
    """A layer's own variables, then those of its sub-objects (an RNN's ``cell``), in write order."""
    walk.enter(group)
    names = _collect_vars(walk, group, chain, config, aliases)
    for key in _by_address(group, exclude=("vars",)):
        child = group[key]
        if isinstance(child, h5py.Group):
            # A cell has no config entry of its own; it shares the layer's flags (use_bias).
            names += _walk_layer(walk, child, (*chain, _saveable_name(child, key)), config, aliases)
    return names


def _collect_vars(
    walk: _Keras3Walk, group: Any, chain: tuple[str, ...], config: dict[str, Any] | None, aliases: bool = True
) -> list[str]:
    variables = group.get("vars")
    if not isinstance(variables, h5py.Group):
        return []
    keys = sorted((key for key in variables if isinstance(variables[key], h5py.Dataset)), key=_numeric_first)
    names = []
    for key in keys:
        entry = _make_entry(variables[key].name.lstrip("/"), variables[key])
        walk.entries.append(entry)
        names.append(entry.name)
    if config is not None:
        walk.layer_configs.update(dict.fromkeys(names, config))
    if aliases and chain:
        layer_class, variable_names = _variable_names(group, config, len(names))
        layer_path = "/".join(chain)
        for alias, name in zip(variable_names, names):
            walk.add_alias(f"{layer_path}/{alias}", name)
            depthwise = depthwise_alias(layer_path, alias, layer_class)
            if depthwise is not None:  # after `kernel`: the name a view keeping one per tensor shows
                walk.add_alias(depthwise, name)
    return names


def _variable_names(group: Any, config: dict[str, Any] | None, count: int) -> tuple[str | None, list[str]]:
    """The layer's snake_case class (from its config, else its group name) and Keras's names for its `count`
    saved variables; (class, []) when unsure of the names, (None, []) when the class is not a known one."""
    key = group.name.rsplit("/", 1)[-1]
    candidates = [re.sub(r"_\d+$", "", key)]
    if config is not None and group.name.rsplit("/", 2)[-2] == "layers":
        candidates.insert(0, snake_case(str(config.get("class_name", ""))))
    if key == "cell":
        candidates.append(re.sub(r"_\d+$", "", _saveable_name(group, key)))
    for candidate in candidates:
        known = _KNOWN_VARIABLES.get(candidate)
        if known is None:
            continue
        flags = (config or {}).get("config", {})
        known = tuple(name for name in known if flags.get(_OPTIONAL_VARIABLES.get(name, ""), True) is not False)
        if len(known) == count:
            return candidate, list(known)
        if config is None and count == len(known) - 1 and known[-1] == "bias":
            return candidate, list(known[:-1])  # use_bias=False, the one drop that is unambiguous without a config
        return candidate, []
    return None, []


def _saveable_name(group: Any, key: str) -> str:
    """The user's name of a saved object: the ``name`` attribute of its ``vars`` group."""
    variables = group.get("vars")
    if isinstance(variables, h5py.Group) and "name" in variables.attrs:
        return (_decode_strings(_string_attr(variables, "name")) or [key])[0]
    return key


def _ordered_layer_keys(walk: _Keras3Walk, layers: Any, chain: tuple[str, ...]) -> list[str]:
    keys = _by_address(layers)
    if not walk.config_index:
        return _class_counters_in_order(keys)
    position = {names: index for index, names in enumerate(walk.config_index)}
    placed = [(position.get((*chain, _saveable_name(layers[key], key))), key) for key in keys]
    if any(index is None for index, _ in placed):
        return keys  # config and file disagree; the write order is the better guess
    return [key for _, key in sorted(placed)]


def _class_counters_in_order(keys: list[str]) -> list[str]:
    """`keys` with each class's groups put back in Keras's counter order, in the places the addresses gave them.

    Keras names a container's layer groups after their class, counting in model order (``conv2d``,
    ``conv2d_1``, ..., ``conv2d_34``). Object header addresses follow the write order only until HDF5 reuses
    freed space, which it does in a model of a few dozen layers (MobileNetV2's ``.weights.h5`` put ``Conv_1``
    18th of its 35 Conv2D groups); the counter is exact within a class, which is what matchers pair by.
    """

    def split(key: str) -> tuple[str, int]:
        match = re.fullmatch(r"(.+?)(?:_(\d+))?", key)
        return (match.group(1), int(match.group(2) or 0)) if match else (key, 0)

    places: dict[str, list[int]] = {}
    for place, key in enumerate(keys):
        places.setdefault(split(key)[0], []).append(place)
    ordered = list(keys)
    for class_places in places.values():
        for place, key in zip(class_places, sorted((keys[p] for p in class_places), key=lambda k: split(k)[1])):
            ordered[place] = key
    return ordered


def _by_address(group: Any, exclude: tuple[str, ...] = ()) -> list[str]:
    """Child groups in the order they were written: creation order where the group tracks it (the merged tree
    of sharded weights), else by object header address (HDF5 lists untracked links alphabetically)."""
    keys = [key for key in group if key not in exclude and isinstance(group[key], h5py.Group)]
    if group.id.get_create_plist().get_link_creation_order() & h5py.h5p.CRT_ORDER_TRACKED:
        created: list[str] = []
        group.id.links.iterate(lambda name: created.append(name.decode("utf-8")), idx_type=h5py.h5.INDEX_CRT_ORDER)
        wanted = set(keys)
        return [key for key in created if key in wanted]
    return sorted(keys, key=lambda key: h5py.h5o.get_info(group[key].id).addr)


def _numeric_first(key: str) -> tuple[int, int, str]:
    return (0, int(key), key) if key.isdigit() else (1, 0, key)


# ----------------------------------------------------------------------------- values


def _make_entry(name: str, dataset: Any) -> _Entry:
    bfloat16 = "dtype" in dataset.attrs and _string_attr(dataset, "dtype") in ("bfloat16", b"bfloat16")
    dtype = "float32" if bfloat16 else _dtype_name(dataset.dtype)
    return _Entry(name, dataset.name, TensorInfo(name=name, shape=tuple(dataset.shape), dtype=dtype), bfloat16)


def _dtype_name(dtype: numpy.dtype) -> str:
    if dtype.kind in ("S", "U", "O"):
        return "string"
    return dtype.name


def _bfloat16_to_float32(value: Any) -> numpy.ndarray:
    """Widen Keras 3's bfloat16 datasets (stored as 2-byte opaque values) to float32, losslessly."""
    array = numpy.asarray(value)
    if array.dtype.itemsize != 2:
        return array.astype(numpy.float32)
    bits = numpy.frombuffer(array.tobytes(), dtype="<u2").astype(numpy.uint32) << 16
    return bits.view(numpy.float32).reshape(array.shape)
