"""Keras model files too big for the repository, kept as skeletons: everything but the weight values.

A skeleton is a ``.keras`` archive whose ``model.weights.h5`` keeps every group, attribute and dataset name, each
dataset holding one value instead of its array, with the array's shape, dtype and kind (kernel, bias, gamma,
moving_variance, ...) in its attributes. ``rebuild`` fills every dataset with values made from a seed and the
dataset's path (``generated``), so that tools/make_keras_model_fixtures.py (with Keras, recording Keras's outputs
for those values) and the tests (without Keras) make the same file. Used for keras.applications models (ResNet50
alone is 94 MB of weights).

A legacy ``.h5`` model file (Keras 3's ``model.save("x.h5")``: a plain HDF5 file, ``model_config`` and the other
root attributes, the weights under ``model_weights/``) gets the same treatment, the whole file being the weights
file; its optimizer state (``optimizer_weights``) is dropped. Its skeleton is an HDF5 file, gzip-compressed when
the target ends with ``.gz`` (``<name>.h5.gz``): the config attribute and the thousands of small groups of a legacy
file take 0.3-1.8 MB uncompressed, which gzip makes 28-130 KB, what the ``.keras`` skeletons take in their zip.

Values are scaled so that a deep network stays in range: kernels ``N(0, 1/fan_in)``, BatchNormalization's gamma
near 0.5 and its variance in [0.8, 1.5], biases and means small.
"""

from __future__ import annotations

import gzip
import io
import math
import zipfile
import zlib
from pathlib import Path

import h5py
import numpy as np

WEIGHTS_MEMBER = "model.weights.h5"
_SHAPE, _DTYPE, _KIND = "skeleton_shape", "skeleton_dtype", "skeleton_kind"


def generated(path: str, kind: str, shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """The values of dataset ``path``: the same in every process and framework."""
    rng = np.random.default_rng([seed, zlib.crc32(path.encode())])
    if kind in ("kernel", "depthwise_kernel", "pointwise_kernel", "embeddings", "recurrent_kernel"):
        fan_in = math.prod(shape[:-1]) if len(shape) > 1 else 1
        values = rng.normal(0.0, 1.0 / math.sqrt(max(fan_in, 1)), size=shape)
    elif kind == "gamma":
        values = rng.uniform(0.4, 0.6, size=shape)
    elif kind in ("moving_variance", "variance"):
        values = rng.uniform(0.8, 1.5, size=shape)
    elif kind == "count":
        values = np.full(shape, 100)
    else:  # bias, beta, moving_mean, mean, and any other variable
        values = rng.normal(0.0, 0.05, size=shape)
    return np.asarray(values).astype(dtype)


def make_skeleton(archive: Path, kinds: dict[str, str], target: Path) -> None:
    """``archive`` (a ``.keras`` file, or a legacy ``.h5`` model file) without its weight values; ``kinds``: h5
    dataset path -> kind (paths inside ``model.weights.h5`` for a ``.keras``, inside the file for an ``.h5``)."""
    if not zipfile.is_zipfile(archive):  # a legacy .h5: the file itself is the weights file
        with h5py.File(archive, "r") as weights:
            # HDF5 1.8's format keeps a small group's links in its header: NASNetMobile's skeleton, 2256 groups,
            # takes 129 KB gzipped instead of 174 KB (readable by any HDF5 since 1.8).
            skeleton = _copied(weights, kinds, fill=None, libver=("v108", "v108"))
            _write(target, skeleton, compress=Path(target).suffix == ".gz")
        return
    with zipfile.ZipFile(archive) as source:
        weights = h5py.File(io.BytesIO(source.read(WEIGHTS_MEMBER)), "r")
        buffer = io.BytesIO()
        with h5py.File(buffer, "w") as skeleton:
            _copy(weights, skeleton, kinds, fill=None)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as copy:
            for item in source.infolist():
                data = buffer.getvalue() if item.filename == WEIGHTS_MEMBER else source.read(item)
                copy.writestr(item.filename, data, compress_type=zipfile.ZIP_DEFLATED)


def rebuild(skeleton: Path, target: Path, seed: int) -> None:
    """The full ``.keras`` (or legacy ``.h5``) file of a skeleton, its weights made by ``generated``."""
    if not zipfile.is_zipfile(skeleton):  # a legacy .h5 skeleton, gzip-compressed or not
        data = Path(skeleton).read_bytes()
        data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        with h5py.File(io.BytesIO(data), "r") as bones:
            _write(target, _copied(bones, None, fill=seed), compress=False)
        return
    with zipfile.ZipFile(skeleton) as source:
        bones = h5py.File(io.BytesIO(source.read(WEIGHTS_MEMBER)), "r")
        buffer = io.BytesIO()
        with h5py.File(buffer, "w") as weights:
            _copy(bones, weights, None, fill=seed)
        with zipfile.ZipFile(target, "w") as copy:
            for item in source.infolist():
                data = buffer.getvalue() if item.filename == WEIGHTS_MEMBER else source.read(item)
                copy.writestr(item.filename, data)


def _copied(
    source: h5py.File, kinds: dict[str, str] | None, fill: int | None, libver: tuple[str, str] | None = None
) -> bytes:
    """The bytes of an HDF5 file holding ``source`` as ``_copy`` gives it (a legacy ``.h5``, all of it); a rebuilt
    file in h5py's default format, as Keras writes it."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w", libver=libver) as target:
        _copy(source, target, kinds, fill)
    return buffer.getvalue()


def _write(target: Path, data: bytes, compress: bool) -> None:
    # mtime=0: no date in the gzip header (HDF5 still records when each group was made: a remade skeleton differs).
    Path(target).write_bytes(gzip.compress(data, compresslevel=9, mtime=0) if compress else data)


def _copy(source: h5py.Group, target: h5py.Group, kinds: dict[str, str] | None, fill: int | None) -> None:
    for key, value in source.attrs.items():
        target.attrs[key] = value
    for name, item in source.items():
        if item.name == "/optimizer_weights":  # a legacy .h5's optimizer state: no part of the model
            continue
        if isinstance(item, h5py.Group):
            _copy(item, target.create_group(name), kinds, fill)
            continue
        if fill is None:  # making a skeleton: one value, and what the array was
            assert kinds is not None
            dataset = target.create_dataset(name, data=np.zeros((1,), dtype=item.dtype))
            dataset.attrs[_SHAPE] = np.asarray(item.shape, dtype=np.int64)
            dataset.attrs[_DTYPE] = str(item.dtype)
            dataset.attrs[_KIND] = kinds.get(item.name, "other")
            for key, attribute in item.attrs.items():
                dataset.attrs[key] = attribute
        else:  # rebuilding: the generated array
            shape = tuple(int(size) for size in item.attrs[_SHAPE])
            values = generated(item.name, str(item.attrs[_KIND]), shape, str(item.attrs[_DTYPE]), fill)
            dataset = target.create_dataset(name, data=values)
            for key, attribute in item.attrs.items():
                if key not in (_SHAPE, _DTYPE, _KIND):
                    dataset.attrs[key] = attribute
