"""Crafted and randomly damaged weight files against every reader of ``torchestimator.interop``.

Each file is opened with ``open_weights`` and every tensor it lists is read, in
a worker process whose address space is limited to what it uses after start-up
plus ``--headroom-mb`` (300 MB), so that a reader that allocates what a file
declares fails the run instead of the machine. Per file, the outcome is one of:

* ``read_ok``: the damage did not touch anything checked (e.g. a weight value
  in an HDF5 file, which has no checksums);
* ``clean_errors``: ``WeightSourceError`` (the readers' own error) naming the file;
* ``other_errors``: any other exception (MemoryError, IndexError, ...): a bug;
* ``crashes``: the worker died (segfault, abort, killed) or hung past ``--trial-timeout``.

``markers`` counts files that created the marker file a pickle payload in them
would create if anything unpickled it: it must stay 0.

The files: the fixtures under tests/fixtures/keras and tests/fixtures/tf_checkpoint,
plus generated ones (torch zip and legacy ``.pt``, safetensors, one of our
checkpoints), mutated at random (bit flips, overwritten spans, huge integers,
truncation, insertions, pickle payloads spliced in); first, the crafted cases
of `crafted_cases` (also the fault suite's cases, tests/faults/test_crafted_weights.py).

    python tools/faults_readers.py [--trials 300] [--seconds 300] [--seed 0]

Last line: ``faults_readers trials=N read_ok=N clean_errors=N other_errors=0 crashes=0 markers=0 max_rss_mb=M``.
Exit status 1 when other_errors, crashes or markers is not 0.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import io
import json
import logging
import os
import pickle
import random
import resource
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from collections.abc import Callable, Sequence
from typing import Any

from faults_common import limit_memory, varint  # tools/ is on sys.path: run as a script, or from the tests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
HEADROOM_MB = 300


# ----------------------------------------------------------------------------- reading under a memory limit


def outcome(path: str) -> dict[str, Any]:
    """Open ``path`` with open_weights and read every tensor; what happened, as JSON-ready data."""
    from torchestimator.interop import WeightSourceError, open_weights

    try:
        with open_weights(path) as source:
            names = [info.name for info in source.tensors()]
            names += list(getattr(source, "aliases", dict)())
            for name in names:
                source.read(name)
            # What warm start asks beyond values: the TF object graph, the Keras layer order.
            for extra in ("model_variables", "optimizer_slots", "layers"):
                if hasattr(source, extra):
                    getattr(source, extra)()
        result = {"kind": "read_ok", "tensors": len(names)}
    except WeightSourceError as error:
        result = {"kind": "clean_errors", "type": type(error).__name__, "message": str(error)}
    except BaseException as error:
        frames = traceback.extract_tb(error.__traceback__)
        ours = [frame for frame in frames if "torchestimator" in frame.filename] or frames
        where = f" (raised in {frames[-1].filename}:{frames[-1].lineno}, via {ours[-1].filename}:{ours[-1].lineno})"
        result = {"kind": "other_errors", "type": type(error).__name__, "message": str(error)[:500] + where}
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return result


def worker_main(headroom_mb: int) -> None:
    """One path per stdin line; one JSON outcome per stdout line."""
    import h5py  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch

    import torchestimator.interop.keras_h5
    import torchestimator.interop.tf_checkpoint
    import torchestimator.interop.torch_sources  # noqa: F401

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # damaged files make readers warn; the outcome is what counts
    warnings.simplefilter("ignore")
    limit_memory(headroom_mb)
    for line in sys.stdin:
        print(json.dumps(outcome(line.strip())), flush=True)


class Worker:
    """A worker process, restarted after it dies or hangs."""

    def __init__(self, headroom_mb: int, timeout: float) -> None:
        self.headroom_mb, self.timeout = headroom_mb, timeout
        self.process: subprocess.Popen[str] | None = None

    def run(self, path: str) -> dict[str, Any]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", "--headroom-mb", str(self.headroom_mb)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(path + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout)
        line = self.process.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        self.close()
        how = "hung" if not ready else f"died with status {self.process.returncode}"
        return {"kind": "crashes", "type": how, "message": f"worker {how} reading {path}", "max_rss_mb": 0}

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()


# ----------------------------------------------------------------------------- payloads and builders


class _MarkerPayload:
    """Unpickling this creates ``marker``: the proof that a reader ran code from a file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def marker_pickle(marker: str, protocol: int = 2) -> bytes:
    return pickle.dumps(_MarkerPayload(marker), protocol=protocol)


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def tf_entry(
    dtype: int,
    shape: Sequence[int],
    offset: int,
    size: int,
    crc: int = 0,
    slices: Sequence[Sequence[tuple[int, int]]] = (),
) -> bytes:
    """A BundleEntryProto (formats.md 3.4), any field value allowed, bad ones included."""
    shape_bytes = b"".join(_field(2, _field(1, dim)) for dim in shape)
    slice_bytes = b"".join(
        _field(7, b"".join(_field(1, _field(1, start) + _field(2, length)) for start, length in extents))
        for extents in slices
    )
    return (
        _field(1, dtype)
        + _field(2, shape_bytes)
        + _field(4, offset)
        + _field(5, size)
        + b"\x35"
        + struct.pack("<I", crc)
        + slice_bytes
    )


def tf_checkpoint(prefix: str, entries: dict[str, bytes], data: bytes, num_shards: int = 1) -> str:
    """Write ``prefix.index`` (one data block, formats.md 3.2) and its one data shard; returns the prefix."""
    from torchestimator.data.tfrecord import masked_crc32c

    header = _field(1, num_shards) + _field(3, _field(1, 1))
    items = [(b"", header)] + sorted((name.encode(), value) for name, value in entries.items())
    out = bytearray()

    def block(pairs: list[tuple[bytes, bytes]]) -> bytes:
        body = bytearray()
        restarts = []
        for key, value in pairs:
            restarts.append(len(body))
            body += varint(0) + varint(len(key)) + varint(len(value)) + key + value
        body += b"".join(struct.pack("<I", offset) for offset in restarts or [0])
        body += struct.pack("<I", len(restarts or [0]))
        offset = len(out)
        out.extend(bytes(body) + b"\x00" + struct.pack("<I", masked_crc32c(bytes(body) + b"\x00")))
        return varint(offset) + varint(len(body))

    data_handle = block(items)
    metaindex = block([])
    index = block([(items[-1][0] + b"\xff", data_handle)])
    footer = metaindex + index
    out += footer + b"\x00" * (40 - len(footer)) + struct.pack("<Q", 0xDB4775248B80FB57)
    with open(prefix + ".index", "wb") as file:
        file.write(out)
    with open(f"{prefix}.data-00000-of-{num_shards:05d}", "wb") as file:
        file.write(data)
    return prefix


def torch_zip_with_pickle(path: str, pickled: bytes, records: dict[str, bytes] | None = None) -> str:
    """A torch.save zip archive whose data.pkl is ``pickled`` (and whose data/ records are ``records``)."""
    import torch

    torch.save({"w": torch.zeros(4)}, path)
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    root = next(name for name in members if name.endswith("/data.pkl")).rsplit("/", 1)[0]
    members[f"{root}/data.pkl"] = pickled
    for key, value in (records or {}).items():
        members[f"{root}/data/{key}"] = value
    with zipfile.ZipFile(path, "w") as archive:
        for name, value in members.items():
            archive.writestr(name, value)
    return path


def torch_state_pickle(tensors: dict[str, tuple[int, Sequence[int], Sequence[int], int]], legacy: bool) -> bytes:
    """The pickle torch.save writes for ``{name: tensor}``, with any storage size, shape, stride and offset.

    ``tensors`` maps a name to (storage numel, size, stride, storage offset); every tensor
    uses its own float32 storage "<index>".
    """
    import torch

    class Storage:
        def __init__(self, key: str, numel: int) -> None:
            self.key, self.numel = key, numel

    class Tensor:
        def __init__(self, storage: Storage, size: Sequence[int], stride: Sequence[int], offset: int) -> None:
            self.arguments = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

        def __reduce__(self) -> tuple[Any, ...]:
            return (torch._utils._rebuild_tensor_v2, self.arguments)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, Storage):
                saved = ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
                return (*saved, None) if legacy else saved
            return None

    state = {
        name: Tensor(Storage(str(index), numel), size, stride, offset)
        for index, (name, (numel, size, stride, offset)) in enumerate(tensors.items())
    }
    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump(collections.OrderedDict(state))
    return buffer.getvalue()


def torch_legacy_file(
    path: str, tensors: dict[str, tuple[int, Sequence[int], Sequence[int], int]], stored: dict[str, bytes]
) -> str:
    """A legacy (pre-zip) torch.save file: magic, protocol, sys info, the state pickle, keys, storages."""
    import torch

    with open(path, "wb") as file:
        for value in (0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True}):
            pickle.dump(value, file, protocol=2)
        file.write(torch_state_pickle(tensors, legacy=True))
        pickle.dump(list(stored), file, protocol=2)
        for raw in stored.values():
            file.write(struct.pack("<q", len(raw) // 4) + raw)
    del torch
    return path


def safetensors_file(path: str, header: Any, body: bytes, header_size: int | None = None) -> str:
    encoded = json.dumps(header).encode()
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded) if header_size is None else header_size) + encoded + body)
    return path


def keras3_weights(path: str, make: Callable[[Any], None]) -> str:
    """A Keras 3 .weights.h5 whose one layer ``dense`` gets its ``vars`` from ``make(group)``."""
    import h5py

    with h5py.File(path, "w") as file:
        variables = file.create_group("layers").create_group("dense").create_group("vars")
        make(variables)
        file.create_group("vars")
    return path


def keras_archive(path: str, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, value in members.items():
            archive.writestr(name, value)
    return path


def our_checkpoint(model_dir: str) -> str:
    import torch

    from torchestimator.checkpoint import CheckpointStore

    torch.manual_seed(0)
    CheckpointStore(model_dir).save(5, torch.nn.Linear(3, 2).state_dict())
    return model_dir


# ----------------------------------------------------------------------------- crafted cases


@dataclasses.dataclass(frozen=True)
class Case:
    """One crafted file: reading ``path`` must end in WeightSourceError whose message contains ``names``.

    With ``data=True`` the payload is a tensor's bytes: reading succeeds and returns them, unexecuted.
    """

    name: str
    path: str
    names: str
    data: bool = False


def crafted_cases(directory: str, marker: str) -> list[Case]:
    """Pickle payloads, declared-size bombs, bad offsets and truncations for every container we open."""
    import h5py
    import numpy
    import safetensors.torch
    import torch

    cases: list[Case] = []

    def add(name: str, path: str, names: str | None = None) -> None:
        cases.append(Case(name, path, names if names is not None else os.path.basename(path)))

    def at(name: str) -> str:
        return os.path.join(directory, name)

    evil = marker_pickle(marker)
    # torch zip and legacy
    add("torch_zip_pickle", torch_zip_with_pickle(at("evil.pt"), evil))
    with open(at("evil_legacy.pth"), "wb") as file:
        for value in (0x1950A86A20F9469CFC6C, 1001, {}):
            pickle.dump(value, file, protocol=2)
        file.write(evil)
    add("torch_legacy_pickle", at("evil_legacy.pth"))
    stride_bomb = torch_state_pickle({"w": (4, (1 << 31,), (0,), 0)}, legacy=False)
    add("torch_zip_zero_stride_bomb", torch_zip_with_pickle(at("stride.pt"), stride_bomb, {"0": b"\0" * 16}), "'w'")
    numel_bomb = torch_state_pickle({"w": (1 << 40, (1 << 40,), (1,), 0)}, legacy=False)
    add("torch_zip_numel_bomb", torch_zip_with_pickle(at("numel.pt"), numel_bomb, {"0": b"\0" * 16}))
    offset_bomb = torch_state_pickle({"w": (4, (4,), (1,), 1 << 50)}, legacy=False)
    add("torch_zip_bad_offset", torch_zip_with_pickle(at("offset.pt"), offset_bomb, {"0": b"\0" * 16}))
    add(
        "torch_legacy_numel_bomb",
        torch_legacy_file(at("legacy_numel.pth"), {"w": (1 << 40, (4,), (1,), 0)}, {"0": b"\0" * 16}),
    )
    # torch inflates a deflated record whole: 64 KB of data.pkl declaring 64 MB (a good pickle, then zeros)
    torch.save({"w": torch.zeros(4)}, at("deflated.pt"))
    with zipfile.ZipFile(at("deflated.pt")) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    with zipfile.ZipFile(at("deflated.pt"), "w") as archive:
        for name, value in members.items():
            padded = value + bytes(64 << 20) if name.endswith("/data.pkl") else value
            archive.writestr(name, padded, compress_type=zipfile.ZIP_DEFLATED if padded is not value else None)
    add("torch_zip_deflated_pickle_bomb", at("deflated.pt"), "data.pkl")
    torch.save({"w": torch.arange(1000.0)}, at("whole.pt"))
    with open(at("whole.pt"), "rb") as file:
        whole = file.read()
    with open(at("truncated.pt"), "wb") as file:
        file.write(whole[: len(whole) // 2])
    add("torch_zip_truncated", at("truncated.pt"))

    # safetensors
    add("safetensors_pickle", _write(at("evil.safetensors"), evil))
    add("safetensors_header_size_bomb", safetensors_file(at("header.safetensors"), {}, b"", header_size=1 << 62))
    add(
        "safetensors_offset_past_end",
        safetensors_file(
            at("past.safetensors"), {"w": {"dtype": "F32", "shape": [1 << 60], "data_offsets": [0, 1 << 62]}}, b"\0" * 8
        ),
    )
    add(
        "safetensors_shape_overflow",
        safetensors_file(
            at("overflow.safetensors"),
            {"w": {"dtype": "F32", "shape": [1 << 62, 1 << 62], "data_offsets": [0, 8]}},
            b"\0" * 8,
        ),
    )
    safetensors.torch.save_file({"w": torch.ones(64)}, at("cut.safetensors"), metadata={"note": evil.hex()})
    with open(at("cut.safetensors"), "r+b") as file:
        file.truncate(os.path.getsize(at("cut.safetensors")) - 8)
    add("safetensors_truncated", at("cut.safetensors"))

    # our checkpoint folders: the model file replaced by a pickle, or by a header bomb
    for name, payload in (("pickle", evil), ("header_bomb", struct.pack("<Q", 1 << 62) + b"{}")):
        model_dir = our_checkpoint(at(f"run_{name}"))
        with open(os.path.join(model_dir, "ckpt-5", "model.safetensors"), "wb") as file:
            file.write(payload)
        add(f"checkpoint_folder_{name}", os.path.join(model_dir, "ckpt-5"), "ckpt-5")

    # Keras: fill-only datasets (declared, never written), a pickle as data, a pickle as the archive's weights
    def fill_only(group: Any) -> None:
        group.create_dataset("0", shape=(1 << 31,), dtype="float32")

    add("keras3_fill_only_bomb", keras3_weights(at("fill.weights.h5"), fill_only), "layers/dense/vars/0")

    def chunked_fill(group: Any) -> None:
        group.create_dataset("0", shape=(1 << 31,), dtype="float32", chunks=(1 << 16,), compression="gzip")

    add("keras3_chunked_fill_bomb", keras3_weights(at("chunks.weights.h5"), chunked_fill), "layers/dense/vars/0")
    with h5py.File(at("legacy_fill.h5"), "w") as file:
        file.attrs["layer_names"] = [b"dense"]
        group = file.create_group("dense")
        group.attrs["weight_names"] = [b"dense/kernel:0"]
        group.create_dataset("dense/kernel:0", shape=(1 << 16, 1 << 15), dtype="float32")
    add("keras2_fill_only_bomb", at("legacy_fill.h5"), "dense/kernel")
    with open(at("fill.weights.h5"), "rb") as file:
        bomb_member = file.read()
    add(
        "keras_archive_fill_only_bomb",
        keras_archive(
            at("fill.keras"), {"config.json": b"{}", "metadata.json": b"{}", "model.weights.h5": bomb_member}
        ),
        "layers/dense/vars/0",
    )
    add(
        "keras_archive_pickle_weights",
        keras_archive(at("evil.keras"), {"config.json": b"{}", "model.weights.h5": evil}),
    )
    add("keras_h5_pickle_file", _write(at("evil.weights.h5"), evil))

    def pickle_dataset(group: Any) -> None:
        group.create_dataset("0", data=numpy.void(evil))

    # A pickle stored as a dataset's bytes is data: it reads back as bytes, never unpickled.
    cases.append(Case("keras3_pickle_as_data", keras3_weights(at("data.weights.h5"), pickle_dataset), "", data=True))
    # Keras: values or groups that HDF5 would fetch from other files, and a group linked back into the tree
    outside = _write(at("outside.bin"), numpy.arange(16, dtype="float32").tobytes())

    def external_storage(group: Any) -> None:
        group.create_dataset("0", shape=(16,), dtype="float32", external=[(outside, 0, 64)])

    add("keras3_external_storage", keras3_weights(at("external.weights.h5"), external_storage), "outside.bin")
    with h5py.File(at("passwd.h5"), "w") as file:
        file.attrs["layer_names"] = [b"dense"]
        group = file.create_group("dense")
        group.attrs["weight_names"] = [b"kernel:0"]
        group.create_dataset("kernel:0", shape=(64,), dtype="uint8", external=[("/etc/passwd", 0, 64)])
    add("keras2_external_storage_etc_passwd", at("passwd.h5"), "/etc/passwd")
    with h5py.File(at("linked_target.h5"), "w") as file:
        file.create_dataset("k", data=numpy.arange(4.0))

    def external_link(group: Any) -> None:
        group["0"] = h5py.ExternalLink(at("linked_target.h5"), "/k")

    add("keras3_external_link", keras3_weights(at("link.weights.h5"), external_link), "linked_target.h5")
    layout = h5py.VirtualLayout(shape=(4,), dtype="float64")
    layout[:] = h5py.VirtualSource(at("linked_target.h5"), "k", shape=(4,))
    add(
        "keras3_virtual_dataset",
        keras3_weights(at("virtual.weights.h5"), lambda group: group.create_virtual_dataset("0", layout)),
        "virtual dataset",
    )

    def cycle(group: Any) -> None:
        group.create_dataset("0", data=numpy.ones(2, "float32"))
        group.parent["loop"] = group.parent

    add("keras3_link_cycle", keras3_weights(at("cycle.weights.h5"), cycle), "reached twice")

    # The `name` attribute's string type damaged into an invalid variable-length type: h5py segfaulted reading it
    def named(group: Any) -> None:
        group.attrs["name"] = "dense"
        group.create_dataset("0", data=numpy.ones(2, "float32"))

    with open(keras3_weights(at("bad_type.weights.h5"), named), "rb") as file:
        damaged = bytearray(file.read())
    string_type = damaged.index(b"name\0") + damaged[damaged.index(b"name\0") :].index(b"\x19\x01\x01\x00")
    damaged[string_type + 1] = 9  # class bits: type 9, neither sequence (0) nor string (1)
    add("keras3_damaged_string_type", _write(at("bad_type.weights.h5"), bytes(damaged)), "not stored as strings")
    # A damaged global heap (where the `name` strings live): HDF5 spun forever parsing it. The fuzzer's find, 5
    # bytes of the nested fixture: object 5's size grows by 1024, so HDF5 meets a free-space object of 0 bytes.
    with open(os.path.join(FIXTURES, "keras", "keras3_nested.weights.h5"), "rb") as file:
        nested = bytearray(file.read())
    for offset, value in ((2177, 4), (5236, 8), (16653, 8), (24997, 4), (37024, 2)):
        assert nested[offset] == 0, "tests/fixtures/keras/keras3_nested.weights.h5 changed; re-derive this case"
        nested[offset] = value
    add(
        "keras3_global_heap_spin",
        _write(at("heap_spin.weights.h5"), bytes(nested)),
        "global heap collection at byte 2048 is damaged",
    )
    with zipfile.ZipFile(os.path.join(FIXTURES, "keras", "keras3_nested.keras")) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members["model.weights.h5"] = zero_free_space(members["model.weights.h5"])
    add("keras_archive_global_heap_spin", keras_archive(at("heap_spin.keras"), members), "free-space object")
    with open(os.path.join(FIXTURES, "keras", "keras3_model.weights.h5"), "rb") as file:
        real = file.read()
    add("keras3_truncated", _write(at("cut.weights.h5"), real[: len(real) * 2 // 3]))

    # TensorFlow: sizes, offsets, shapes, strings and slices that the data shard cannot hold
    data = struct.pack("<2f", 1.0, 2.0)
    tf_cases = {
        "tf_size_2e62": {"x": tf_entry(1, [2], 0, 1 << 62)},
        "tf_string_size_2e62": {"x": tf_entry(7, [2], 0, 1 << 62)},
        "tf_consistent_size_past_end": {"x": tf_entry(1, [1 << 50], 0, 1 << 52)},
        "tf_offset_past_end": {"x": tf_entry(1, [2], 1 << 40, 8)},
        "tf_negative_size": {"x": tf_entry(1, [2], 0, -8)},
        "tf_negative_offset": {"x": tf_entry(1, [2], -4, 8)},
        "tf_negative_dim": {"x": tf_entry(1, [-2], 0, 8)},
        "tf_shape_overflow": {"x": tf_entry(1, [1 << 40, 1 << 40, 1 << 40], 0, 8)},
        "tf_zero_size_shape_overflow": {"x": tf_entry(1, [0, 1 << 62], 0, 0)},
        "tf_string_count_bomb": {"x": tf_entry(7, [1 << 40], 0, 8)},
        "tf_sliced_bomb": {"x": tf_entry(1, [1 << 25, 1 << 25], 0, 0, slices=[[(0, 1 << 25), (0, 1 << 25)]])},
        "tf_shape_too_big": {"x": tf_entry(1, [1 << 30, 1 << 30], 0, 0, slices=[[(0, 1 << 30), (0, 1 << 30)]])},
        "tf_slice_outside_shape": {"x": tf_entry(1, [2], 0, 0, slices=[[(1 << 40, 2)]])},
    }
    for name, entries in tf_cases.items():
        os.makedirs(at(name))
        add(name, tf_checkpoint(os.path.join(at(name), "ckpt"), entries, data), "'x'")
    os.makedirs(at("tf_header_shards"))
    add(
        "tf_header_shard_bomb",
        tf_checkpoint(
            os.path.join(at("tf_header_shards"), "ckpt"), {"x": tf_entry(1, [2], 0, 8)}, data, num_shards=(1 << 31) - 1
        ),
        "",
    )
    # A pickle in a string tensor is data; as the object graph it is an undecodable graph, never unpickled.
    from torchestimator.data.tfrecord import masked_crc32c

    length_checksum = struct.pack("<I", masked_crc32c(struct.pack("<I", len(evil))))
    strings = varint(len(evil)) + length_checksum + evil
    entry_crc = masked_crc32c(struct.pack("<I", len(evil)) + length_checksum + evil)
    os.makedirs(at("tf_pickle_string"))
    cases.append(
        Case(
            "tf_pickle_as_string_tensor",
            tf_checkpoint(
                os.path.join(at("tf_pickle_string"), "ckpt"),
                {"s": tf_entry(7, [], 0, len(strings), entry_crc)},
                strings,
            ),
            "",
            data=True,
        )
    )
    os.makedirs(at("tf_pickle_graph"))
    add(
        "tf_pickle_object_graph",
        tf_checkpoint(
            os.path.join(at("tf_pickle_graph"), "ckpt"),
            {"_CHECKPOINTABLE_OBJECT_GRAPH": tf_entry(7, [], 0, len(strings), entry_crc)},
            strings,
        ),
        "_CHECKPOINTABLE_OBJECT_GRAPH",
    )
    shutil.copytree(os.path.join(FIXTURES, "tf_checkpoint", "tf1"), at("tf_truncated"))
    shard = next(os.path.join(at("tf_truncated"), name) for name in os.listdir(at("tf_truncated")) if ".data-" in name)
    with open(shard, "r+b") as file:
        file.truncate(os.path.getsize(shard) // 2)
    add("tf_truncated_shard", at("tf_truncated"), os.path.basename(shard))
    return cases


def zero_free_space(data: bytes) -> bytes:
    """The HDF5 file with the free-space object of its first global heap collection declaring 0 bytes."""
    damaged = bytearray(data)
    start = damaged.index(b"GCOL")
    offset = start + 16
    while int.from_bytes(damaged[offset : offset + 2], "little") != 0:  # bounded: each object moves 16+ bytes on
        offset += 16 + (int.from_bytes(damaged[offset + 8 : offset + 16], "little") + 7) // 8 * 8
    damaged[offset + 8 : offset + 16] = bytes(8)
    return bytes(damaged)


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as file:
        file.write(data)
    return path


# ----------------------------------------------------------------------------- random damage


@dataclasses.dataclass(frozen=True)
class Seed:
    """A valid source: ``open_path`` is what open_weights gets, ``files`` what a mutation may damage."""

    name: str
    open_path: str
    files: tuple[str, ...]


def seed_sources(directory: str) -> list[Seed]:
    """The fixtures, and generated torch, safetensors and torchestimator files, copied under ``directory``."""
    import safetensors.torch
    import torch

    seeds = []
    keras = os.path.join(FIXTURES, "keras")
    for name in sorted(os.listdir(keras)):
        if name.endswith((".h5", ".keras")):
            shutil.copy(os.path.join(keras, name), os.path.join(directory, name))
            seeds.append(Seed(name, name, (name,)))
    tf_root = os.path.join(FIXTURES, "tf_checkpoint")
    for name in sorted(os.listdir(tf_root)):
        if os.path.isdir(os.path.join(tf_root, name)):
            shutil.copytree(os.path.join(tf_root, name), os.path.join(directory, f"tf_{name}"))
            files = tuple(
                os.path.join(f"tf_{name}", file)
                for file in sorted(os.listdir(os.path.join(tf_root, name)))
                if file.endswith(".index") or ".data-" in file
            )
            prefix = files[0][: -len(".index")] if files[0].endswith(".index") else files[0].split(".data-")[0]
            seeds.append(Seed(f"tf_{name}", prefix, files))
    torch.manual_seed(0)
    state = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).state_dict()
    torch.save(state, os.path.join(directory, "zip.pt"))
    torch.save(state, os.path.join(directory, "legacy.pth"), _use_new_zipfile_serialization=False)
    safetensors.torch.save_file(state, os.path.join(directory, "plain.safetensors"), metadata={"format": "pt"})
    our_checkpoint(os.path.join(directory, "run"))
    seeds += [
        Seed("zip.pt", "zip.pt", ("zip.pt",)),
        Seed("legacy.pth", "legacy.pth", ("legacy.pth",)),
        Seed("plain.safetensors", "plain.safetensors", ("plain.safetensors",)),
        Seed(
            "checkpoint",
            os.path.join("run", "ckpt-5"),
            tuple(os.path.join("run", "ckpt-5", file) for file in ("model.safetensors", "state.json")),
        ),
    ]
    return seeds


_HUGE = (1 << 62, 1 << 31, (1 << 64) - 1, (1 << 32) - 1, 1 << 40)


def mutate(data: bytes, rng: random.Random, marker: str) -> tuple[bytes, str]:
    """One random damage to ``data``, and a word for it."""
    out = bytearray(data)
    position = rng.randrange(max(len(out), 1))
    how = rng.choice(("flip", "span", "huge", "truncate", "insert", "pickle"))
    if how == "flip" or not out:
        for _ in range(rng.randint(1, 8)):
            if out:
                out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif how == "span":
        length = rng.randint(1, 64)
        out[position : position + length] = bytes(rng.choice((0x00, 0xFF, rng.randrange(256))) for _ in range(length))
    elif how == "huge":
        value = rng.choice(_HUGE)
        width = rng.choice((4, 8))
        out[position : position + width] = (value & ((1 << 8 * width) - 1)).to_bytes(width, "little")
    elif how == "truncate":
        del out[position:]
    elif how == "insert":
        out[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    else:
        payload = marker_pickle(marker, protocol=rng.choice((2, 4)))
        if rng.random() < 0.5:
            out[position : position + len(payload)] = payload
        else:
            out = bytearray(payload)
    return bytes(out), how


def damaged_zip_pickle(path: str, marker: str) -> None:
    """Replace the data.pkl of a torch zip (or add a pickle member to a .keras zip) with a marker payload."""
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    target = next((name for name in members if name.endswith("data.pkl")), "model.weights.h5")
    members[target] = marker_pickle(marker)
    with zipfile.ZipFile(path, "w") as archive:
        for name, value in members.items():
            archive.writestr(name, value)


# ----------------------------------------------------------------------------- the run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300, help="random damaged files (after the crafted cases)")
    parser.add_argument("--seconds", type=float, default=300.0, help="stop starting trials after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--headroom-mb", type=int, default=HEADROOM_MB)
    parser.add_argument("--trial-timeout", type=float, default=60.0, help="seconds before a read counts as hung")
    parser.add_argument("--no-crafted", action="store_true", help="random trials only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    settings = parser.parse_args(argv)
    if settings.trials < 0 or settings.seconds <= 0 or settings.headroom_mb <= 0:
        parser.error("--trials must be >= 0, --seconds and --headroom-mb > 0")
    if settings.worker:
        worker_main(settings.headroom_mb)
        return 0
    sys.path.insert(0, os.path.join(ROOT, "src"))
    counts = collections.Counter(dict.fromkeys(("read_ok", "clean_errors", "other_errors", "crashes"), 0))
    markers = max_rss = trials = 0
    rng = random.Random(settings.seed)
    worker = Worker(settings.headroom_mb, settings.trial_timeout)
    deadline = time.monotonic() + settings.seconds
    with tempfile.TemporaryDirectory(prefix="faults_readers-") as scratch:
        marker = os.path.join(scratch, "MARKER")
        seeds_dir = os.path.join(scratch, "seeds")
        os.makedirs(seeds_dir)
        seeds = seed_sources(seeds_dir)

        def record(label: str, path: str, result: dict[str, Any]) -> None:
            nonlocal markers, max_rss, trials
            trials += 1
            counts[result["kind"]] += 1
            max_rss = max(max_rss, result.get("max_rss_mb", 0))
            if os.path.exists(marker):
                markers += 1
                os.remove(marker)
                print(f"MARKER created by {label}: {path}", flush=True)
            if result["kind"] in ("other_errors", "crashes"):
                print(f"{result['kind']}: {label}: {result['type']}: {result['message']}", flush=True)

        if not settings.no_crafted:
            crafted_dir = os.path.join(scratch, "crafted")
            os.makedirs(crafted_dir)
            for case in crafted_cases(crafted_dir, marker):
                record(case.name, case.path, worker.run(case.path))
        for number in range(settings.trials):
            if time.monotonic() > deadline:
                break
            seed = rng.choice(seeds)
            trial_dir = os.path.join(scratch, f"trial-{number}")
            shutil.copytree(seeds_dir, trial_dir, ignore=_only(seed))
            target = os.path.join(trial_dir, rng.choice(seed.files))
            if target.endswith((".pt", ".keras")) and rng.random() < 0.1:
                damaged_zip_pickle(target, marker)
                how = "zip-pickle"
            else:
                with open(target, "rb") as file:
                    damaged, how = mutate(file.read(), rng, marker)
                with open(target, "wb") as file:
                    file.write(damaged)
            label = f"trial {number} ({seed.name}, {how} in {os.path.basename(target)})"
            record(label, target, worker.run(os.path.join(trial_dir, seed.open_path)))
            shutil.rmtree(trial_dir)
        worker.close()
    print(
        f"faults_readers trials={trials} read_ok={counts['read_ok']} clean_errors={counts['clean_errors']} "
        f"other_errors={counts['other_errors']} crashes={counts['crashes']} markers={markers} max_rss_mb={max_rss}"
    )
    return 1 if counts["other_errors"] or counts["crashes"] or markers else 0


def _only(seed: Seed) -> Callable[[str, list[str]], list[str]]:
    """A copytree filter that copies only the files of ``seed``."""
    top = {path.split(os.sep)[0] for path in (seed.open_path, *seed.files)}

    def ignore(folder: str, names: list[str]) -> list[str]:
        if os.path.basename(folder).startswith("seeds") or folder.endswith(os.sep + "seeds"):
            return [name for name in names if name not in top]
        return []

    return ignore


if __name__ == "__main__":
    sys.exit(main())
