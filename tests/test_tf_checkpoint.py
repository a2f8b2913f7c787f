"""TensorFlow checkpoint reader: the worked bytes of formats.md 3.3, real TF fixtures, and damaged files."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
from faults_common import WORKED_INDEX, table_block, varint

from torchestimator.data.tfrecord import masked_crc32c
from torchestimator.interop import _sstable
from torchestimator.interop._sstable import snappy_decompress
from torchestimator.interop.source import TensorInfo, WeightSourceError
from torchestimator.interop.tf_checkpoint import (
    TensorFlowCheckpoint,
    is_optimizer_variable,
    is_tensorflow,
    locate_checkpoint,
    open_tensorflow,
    read_checkpoint_state,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "tf_checkpoint")
SNAPPY = os.path.join(os.path.dirname(__file__), "fixtures", "snappy")  # made by cramjam; see its README.md

WORKED_DATA = bytes.fromhex("0000803f00000040020078270b346162")


def write_worked(directory, index: bytes = WORKED_INDEX, data: bytes = WORKED_DATA) -> str:
    prefix = os.path.join(directory, "ckpt")
    with open(prefix + ".index", "wb") as handle:
        handle.write(index)
    with open(prefix + ".data-00000-of-00001", "wb") as handle:
        handle.write(data)
    return prefix


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


# --------------------------------------------------------------------------- worked example


def test_worked_example_sizes_match_the_reference():
    assert len(WORKED_INDEX) == 142 and len(WORKED_DATA) == 16


def test_worked_example_decodes(tmp_path):
    prefix = write_worked(tmp_path)
    with open_tensorflow(prefix) as checkpoint:
        assert checkpoint.format == "tensorflow"
        assert checkpoint.tensors() == [TensorInfo("s", (2,), "string"), TensorInfo("x", (2,), "float32")]
        x = checkpoint.read("x")
        assert x.dtype == np.float32 and x.tolist() == [1.0, 2.0]
        s = checkpoint.read("s")
        assert s.dtype == object and s.tolist() == [b"ab", b""]
        entry = checkpoint.entry("s")
        assert (entry.offset, entry.size, entry.crc32c) == (8, 8, 0x4DB08891)
        assert checkpoint.num_shards == 1 and not checkpoint.big_endian
        assert set(checkpoint.read_all()) == {"s", "x"}
        assert checkpoint.object_paths() == {}


def test_worked_example_checksums():
    assert masked_crc32c(WORKED_DATA[:8]) == 0x35E53C59
    assert masked_crc32c(struct.pack("<II", 2, 0)) == 0x340B2778


def test_missing_tensor_is_a_key_error_naming_nearest(tmp_path):
    with open_tensorflow(write_worked(tmp_path)) as checkpoint:
        with pytest.raises(KeyError, match="'xx'.*Nearest names: x"):
            checkpoint.read("xx")


# --------------------------------------------------------------------------- a synthetic multi-block table


def _table(items, per_block=3, restart_interval=2):
    """A LevelDB table the way TF lays it out, small blocks so that there are several."""
    out, index_items = bytearray(), []

    def emit(block):
        offset = len(out)
        out.extend(block + b"\x00" + struct.pack("<I", masked_crc32c(block + b"\x00")))
        return varint(offset) + varint(len(block))

    for start in range(0, len(items), per_block):
        chunk = items[start : start + per_block]
        index_items.append((chunk[-1][0], emit(table_block(chunk, restart_interval))))
    metaindex = emit(table_block([], 1))
    index = emit(table_block(index_items, 1))
    footer = metaindex + index
    return bytes(out) + footer + b"\x00" * (40 - len(footer)) + struct.pack("<Q", 0xDB4775248B80FB57)


def test_multi_block_table_with_prefix_compression(tmp_path):
    names = [f"layer_{number:02d}/kernel" for number in range(10)]
    data = bytearray()
    items = [(b"", bytes.fromhex("08011a020801"))]
    for number, name in enumerate(names):
        raw = struct.pack("<f", number + 0.5)
        entry = (
            b"\x08\x01\x12\x04\x12\x02\x08\x01"
            + b"\x20"
            + varint(len(data))
            + b"\x28\x04"
            + b"\x35"
            + struct.pack("<I", masked_crc32c(raw))
        )
        items.append((name.encode(), entry))
        data += raw
    prefix = write_worked(tmp_path, _table(items), bytes(data))
    with open_tensorflow(prefix) as checkpoint:
        assert [info.name for info in checkpoint.tensors()] == names
        assert [checkpoint.read(name)[0] for name in names] == [number + 0.5 for number in range(10)]


def _with_snappy_datatable_block(compressed: bytes) -> bytes:
    index = bytearray(WORKED_INDEX)
    # Replace the 57-byte data block with a snappy (type 1) block; the index handle gets its new size.
    trailer = b"\x01" + struct.pack("<I", masked_crc32c(compressed + b"\x01"))
    rest = bytearray(index[62:])
    shift = len(compressed) - 57
    index_block = bytearray(rest[13:27])
    index_block[5] = len(compressed)  # handle(off 0, size): size is the byte after "00" offset
    rest[13:32] = bytes(index_block) + b"\x00" + struct.pack("<I", masked_crc32c(bytes(index_block) + b"\x00"))
    footer = bytes([62 + shift, 8, 75 + shift, 14]) + b"\x00" * 36 + bytes.fromhex("57fb808b247547db")
    return compressed + trailer + bytes(rest[:-48]) + footer


def _fixture_bytes(name: str) -> bytes:
    with open(os.path.join(SNAPPY, name), "rb") as handle:
        return handle.read()


def _counting_snappy(monkeypatch) -> list[int]:
    """Counts the snappy blocks the table reader decompresses (so a fixture stored uncompressed cannot pass)."""
    calls = []
    real = _sstable.snappy_decompress
    monkeypatch.setattr(
        _sstable, "snappy_decompress", lambda block, path, offset: calls.append(offset) or real(block, path, offset)
    )
    return calls


def test_snappy_compressedtable_block(tmp_path, monkeypatch):
    compressed = _fixture_bytes("worked_block.snappy")  # the worked data block, compressed by a reference encoder
    assert snappy_decompress(compressed, "f", 0) == WORKED_INDEX[:57]
    calls = _counting_snappy(monkeypatch)
    prefix = write_worked(tmp_path, _with_snappy_datatable_block(compressed))
    with open_tensorflow(prefix) as checkpoint:
        assert checkpoint.read("x").tolist() == [1.0, 2.0]
        assert checkpoint.read("s").tolist() == [b"ab", b""]
    assert calls == [0]


def test_snappy_reference_stream_with_every_element_kind():
    # Literals short and over 60 bytes, copies with 1- and 2-byte offsets, copies overlapping their output.
    raw, compressed = _fixture_bytes("mixed.bin"), _fixture_bytes("mixed.snappy")
    assert len(compressed) < len(raw) - 1000  # literals alone cannot be shorter than the data: copies are in there
    assert snappy_decompress(compressed, "f", 0) == raw


def test_table_whose_every_block_is_snappy_compressed(monkeypatch):
    calls = _counting_snappy(monkeypatch)
    with open(os.path.join(SNAPPY, "table", "expected.json")) as handle:
        expected = json.load(handle)
    with open_tensorflow(os.path.join(SNAPPY, "table", "ckpt")) as checkpoint:
        assert [info.name for info in checkpoint.tensors()] == sorted(expected)
        for name, values in expected.items():
            assert checkpoint.read(name).tolist() == values
    assert len(calls) == 5  # the index block and four data blocks (the metaindex is never read)


@pytest.mark.parametrize(
    "damage, message",
    [
        # The stream ends in a 2-byte-offset copy: cut short, its offset must not read as a smaller one.
        (lambda stream: stream[:-1], "a copy's offset runs past the end of the block"),
        (lambda stream: stream[:1500], "a literal runs past the end of the block"),
        (lambda stream: b"\xbb\x22" + stream[2:], "decompressed to 4410 bytes, expected 4411"),  # declared 4411
        (lambda stream: b"\xb9\x22" + stream[2:], "decompresses past the declared 4409 bytes"),
    ],
)
def test_damaged_reference_stream_is_refused_naming_file_and_offset(damage, message):
    stream = _fixture_bytes("mixed.snappy")
    assert stream[:2] == b"\xba\x22"  # the declared size, 4410, as a varint
    with pytest.raises(WeightSourceError, match=f"f: the snappy-compressed block at offset 7 is corrupt: {message}"):
        snappy_decompress(damage(stream), "f", 7)


def test_snappy_copies_and_corruption(tmp_path):
    # Hand-made: the 4-byte-offset copy no reference encoder emits (it compresses in 64 KiB fragments).
    four_byte = bytes([8, 3 << 2]) + b"abcd" + bytes([((4 - 1) << 2) | 3]) + (4).to_bytes(4, "little")
    assert snappy_decompress(four_byte, "f", 0) == b"abcdabcd"
    with pytest.raises(WeightSourceError, match="f: the snappy-compressed block at offset 9 is corrupt"):
        snappy_decompress(bytes([10, ((6 - 4) << 2) | 1, 3]), "f", 9)


# --------------------------------------------------------------------------- real TensorFlow fixtures


def _fixture_prefix(name: str) -> str:
    directory = os.path.join(FIXTURES, name)
    index = [file for file in os.listdir(directory) if file.endswith(".index")]
    return os.path.join(directory, index[0][: -len(".index")])


@pytest.mark.parametrize("name", ["tf1", "tf2", "tf2_slots", "raw", "sharded"])
def test_real_checkpoint_matches_tensorflow(name):
    directory = os.path.join(FIXTURES, name)
    with open(os.path.join(directory, "expected.json")) as handle:
        expected = json.load(handle)
    values = np.load(os.path.join(directory, "expected.npz"))
    with open_tensorflow(_fixture_prefix(name)) as checkpoint:
        infos = checkpoint.tensors()
        assert [info.name for info in infos] == sorted(item["name"] for item in expected)
        by_name = {info.name: info for info in infos}
        for item in expected:
            info = by_name[item["name"]]
            assert (list(info.shape), info.dtype) == (item["shape"], item["dtype"]), item["name"]
            value = checkpoint.read(item["name"])
            if "string_values" in item:
                assert value.dtype == object and value.shape == tuple(item["shape"])
                assert [element.hex() for element in value.reshape(-1)] == item["string_values"]
            else:
                reference = values[item["name"]]
                assert value.dtype == reference.dtype and value.shape == reference.shape, item["name"]
                np.testing.assert_array_equal(value, reference)


def test_raw_fixture_special_values():
    with open_tensorflow(_fixture_prefix("raw")) as checkpoint:
        assert checkpoint.read("global_step").item() == 123456789012
        assert checkpoint.read("global_step").shape == ()
        assert checkpoint.read("strings").tolist() == [b"alpha", b"", b"\xff\x00binary"]
        assert checkpoint.read("bfloat16").tolist() == [1.0, -3.5, 0.15625]
        assert checkpoint.entry("emb").slices  # saved as three slices, assembled on read
        np.testing.assert_array_equal(checkpoint.read("emb"), np.arange(12, dtype=np.float32).reshape(6, 2))


def test_locate_forms_agree():
    directory = os.path.join(FIXTURES, "tf1")
    prefix = os.path.join(directory, "model.ckpt-2")
    assert locate_checkpoint(directory) == prefix
    assert locate_checkpoint(prefix) == prefix
    assert locate_checkpoint(prefix + ".index") == prefix
    assert locate_checkpoint(prefix + ".data-00000-of-00001") == prefix
    assert is_tensorflow(directory) and is_tensorflow(prefix) and is_tensorflow(prefix + ".index")
    assert not is_tensorflow(os.path.join(FIXTURES, "tf1", "expected.npz"))
    assert not is_tensorflow(FIXTURES)  # no checkpoint file
    state = read_checkpoint_state(os.path.join(directory, "checkpoint"))
    assert state["model_checkpoint_path"] == "model.ckpt-2"
    assert state["all_model_checkpoint_paths"] == ["model.ckpt-2"]


def test_is_tensorflow_rejects_other_checkpoint_files(tmp_path):
    (tmp_path / "checkpoint").write_text('{"latest": "ckpt-100"}')  # a JSON manifest, not a CheckpointState
    assert not is_tensorflow(tmp_path)
    (tmp_path / "weights.index").write_bytes(b"not a table")
    assert not is_tensorflow(tmp_path / "weights.index")
    prefix = write_worked(tmp_path)
    assert is_tensorflow(prefix + ".index")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt"\n')
    assert is_tensorflow(tmp_path)


def test_checkpoint_state_text_format(tmp_path):
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-2"\n'
        'all_model_checkpoint_paths: "ckpt-3"\nall_model_checkpoint_timestamps: 1795942350.9146118\n'
        "last_preserved_timestamp: 1795942349.864094\n"
    )
    state = read_checkpoint_state(tmp_path / "checkpoint")
    assert state["all_model_checkpoint_paths"] == ["ckpt-2", "ckpt-3"]
    assert state["all_model_checkpoint_timestamps"] == [1795942350.9146118]
    assert state["last_preserved_timestamp"] == 1795942349.864094
    # Protobuf's text format, as TensorFlow reads it: comments, single quotes, escapes.
    (tmp_path / "checkpoint").write_text("# written by hand\nmodel_checkpoint_path: 'ckpt-\\0613'\n")
    assert read_checkpoint_state(tmp_path / "checkpoint")["model_checkpoint_path"] == "ckpt-13"
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "a"\nmodel_checkpoint_pth: "b"\n')
    with pytest.raises(
        WeightSourceError,
        match=r"checkpoint, line 2: not a CheckpointState text file: .*no field "
        r"named \"model_checkpoint_pth\"",
    ):
        read_checkpoint_state(tmp_path / "checkpoint")
    (tmp_path / "checkpoint").write_text("model_checkpoint_path\n")
    with pytest.raises(WeightSourceError, match=r"line 2: not a CheckpointState text file: .*Expected \":\""):
        read_checkpoint_state(tmp_path / "checkpoint")
    os.mkfifo(tmp_path / "fifo")  # a FIFO named by mistake must not block the reader
    with pytest.raises(WeightSourceError, match="fifo: cannot read the checkpoint state file: .*not a regular file"):
        read_checkpoint_state(tmp_path / "fifo")


def test_checkpoint_file_with_moved_absolute_path(tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "tf1"), tmp_path / "run")
    (tmp_path / "run" / "checkpoint").write_text('model_checkpoint_path: "/elsewhere/old/model.ckpt-2"\n')
    assert locate_checkpoint(tmp_path / "run") == str(tmp_path / "run" / "model.ckpt-2")


def test_tf1_model_variables_and_slots():
    with open_tensorflow(os.path.join(FIXTURES, "tf1")) as checkpoint:
        model = checkpoint.model_variables()
        assert sorted(model) == sorted(
            [f"{layer}/{weight}" for layer in ("dense", "dense_1") for weight in ("kernel", "bias")]
            + [f"batch_normalization/{weight}" for weight in ("gamma", "beta", "moving_mean", "moving_variance")]
        )
        assert all(model[name] == name for name in model)
        slots = checkpoint.optimizer_slots()
        assert slots["dense/kernel"] == {"Adam": "dense/kernel/Adam", "Adam_1": "dense/kernel/Adam_1"}
        assert "batch_normalization/moving_mean" not in slots


def test_tf2_keras3_object_paths_reach_weights_saved_under_the_optimizer():
    weights = np.load(os.path.join(FIXTURES, "tf2", "keras_weights.npz"))
    with open_tensorflow(os.path.join(FIXTURES, "tf2")) as checkpoint:
        paths = checkpoint.object_paths()
        assert paths["model/_functional/_operations/1/_kernel"] == (
            "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"
        )
        model = checkpoint.model_variables()
        assert len(model) == 8 and not any(path.startswith("optimizer/") for path in model)
        pairs = {
            "1/_kernel": "0/kernel",
            "1/bias": "0/bias",
            "2/gamma": "1/gamma",
            "2/beta": "1/beta",
            "2/moving_mean": "1/moving_mean",
            "2/moving_variance": "1/moving_variance",
            "3/_kernel": "2/kernel",
            "3/bias": "2/bias",
        }
        for path, keras_name in pairs.items():
            np.testing.assert_array_equal(
                checkpoint.read(model[f"model/_functional/_operations/{path}"]), weights[keras_name]
            )
        slots = checkpoint.optimizer_slots()["optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"]
        assert set(slots) == {"momentums", "velocities"}
        assert checkpoint.read(slots["momentums"]).shape == (4, 8)


def test_tf2_slot_variables_attributed_to_their_variable():
    with open_tensorflow(os.path.join(FIXTURES, "tf2_slots")) as checkpoint:
        kernel = "model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"
        assert checkpoint.model_variables() == {
            "model/dense/bias": "model/dense/bias/.ATTRIBUTES/VARIABLE_VALUE",
            "model/dense/kernel": kernel,
        }
        slot_key = "model/dense/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE"
        assert checkpoint.optimizer_slots()[kernel] == {"m": slot_key, "v": slot_key.replace("/m/", "/v/")}
        assert checkpoint.object_paths()["model/dense/kernel/.OPTIMIZER_SLOT/optimizer/m"] == slot_key
        names = [info.name for info in checkpoint.tensors()]
        assert kernel in names and "_CHECKPOINTABLE_OBJECT_GRAPH" in names  # raw keys stay raw


@pytest.mark.parametrize(
    "name, optimizer",
    [
        ("dense/kernel", False),
        ("dense/kernel/Adam", True),
        ("dense/kernel/Adam_1", True),
        ("beta1_power", True),
        ("global_step", True),
        ("hidden/bias/Momentum", True),
        ("w/RMSProp_1", True),
        ("save_counter/.ATTRIBUTES/VARIABLE_VALUE", True),
        ("model/x/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE", True),
        ("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE", True),
        ("model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE", False),
        ("adam_layer/kernel", False),
    ],
)
def test_is_optimizer_variable(name, optimizer):
    assert is_optimizer_variable(name) is optimizer


# --------------------------------------------------------------------------- bad input


def test_missing_file_and_directory_without_checkpoint(tmp_path):
    with pytest.raises(WeightSourceError, match="nothing.index: no such file"):
        open_tensorflow(tmp_path / "nothing")
    with pytest.raises(WeightSourceError, match=f"{tmp_path}: a directory without a 'checkpoint' file"):
        open_tensorflow(tmp_path)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: ""\n')
    with pytest.raises(WeightSourceError, match="model_checkpoint_path is empty"):
        open_tensorflow(tmp_path)


@pytest.mark.parametrize(
    "offset, message",
    [
        (10, "CRC32C mismatch in the data block at offset 0"),
        (60, "CRC32C mismatch in the data block at offset 0"),
        (80, "CRC32C mismatch in the index block at offset 75"),
        (141, "bad magic number"),
    ],
)
def test_corrupt_index(tmp_path, offset, message):
    prefix = write_worked(tmp_path)
    flip(prefix + ".index", offset)
    with pytest.raises(WeightSourceError, match=message) as error:
        open_tensorflow(prefix)
    assert "ckpt.index" in str(error.value)


@pytest.mark.parametrize("size, message", [(100, "bad magic"), (20, "shorter than the 48-byte")])
def test_truncated_index(tmp_path, size, message):
    prefix = write_worked(tmp_path)
    truncate(prefix + ".index", size)
    with pytest.raises(WeightSourceError, match=message):
        open_tensorflow(prefix)


def test_corrupt_data_names_file_variable_and_offset(tmp_path):
    prefix = write_worked(tmp_path)
    flip(prefix + ".data-00000-of-00001", 3)
    with open_tensorflow(prefix) as checkpoint:
        assert checkpoint.read("s").tolist() == [b"ab", b""]  # the other tensor is intact
        with pytest.raises(
            WeightSourceError,
            match=r"data-00000-of-00001: checksum mismatch for variable 'x' "
            r"at offset 0",
        ):
            checkpoint.read("x")


@pytest.mark.parametrize("offset", [8, 10, 14])
def test_corrupt_string_tensor(tmp_path, offset):
    prefix = write_worked(tmp_path)
    flip(prefix + ".data-00000-of-00001", offset)
    with open_tensorflow(prefix) as checkpoint:
        with pytest.raises(WeightSourceError, match="'s'"):
            checkpoint.read("s")


def test_truncated_data(tmp_path):
    prefix = write_worked(tmp_path)
    truncate(prefix + ".data-00000-of-00001", 12)
    with open_tensorflow(prefix) as checkpoint:
        assert checkpoint.read("x").tolist() == [1.0, 2.0]
        with pytest.raises(WeightSourceError, match="variable 's' needs bytes 8..16.*truncated"):
            checkpoint.read("s")


def test_corrupt_real_data_shard(tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "tf1"), tmp_path / "run")
    with open_tensorflow(tmp_path / "run") as checkpoint:
        entry = checkpoint.entry("dense/kernel")
    flip(str(tmp_path / "run" / "model.ckpt-2.data-00000-of-00001"), entry.offset + 5)
    with open_tensorflow(tmp_path / "run") as checkpoint:
        checkpoint.read("dense/bias")
        with pytest.raises(WeightSourceError, match=f"'dense/kernel' at offset {entry.offset}"):
            checkpoint.read("dense/kernel")


def test_missing_shard(tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "sharded"), tmp_path / "run")
    os.remove(tmp_path / "run" / "ckpt.data-00002-of-00004")
    with pytest.raises(WeightSourceError, match=r"missing data shard file\(s\) .*ckpt.data-00002-of-00004"):
        open_tensorflow(tmp_path / "run" / "ckpt")


def test_entry_size_mismatch_is_an_error(tmp_path):
    index = bytearray(WORKED_INDEX)
    # x's entry has its size field `28 08` at data-block bytes 42..43; claim 12 bytes (3 floats) instead of 8.
    assert index[42:44] == b"\x28\x08"
    index[43] = 0x0C
    block = bytes(index[:57])
    index[58:62] = struct.pack("<I", masked_crc32c(block + b"\x00"))
    prefix = write_worked(tmp_path, bytes(index))
    with open_tensorflow(prefix) as checkpoint:
        with pytest.raises(WeightSourceError, match="invalid size in bundle entry of 'x'"):
            checkpoint.read("x")


def test_open_weights_gives_the_reader_and_close_releases_its_shards(tmp_path):
    from torchestimator.interop import open_weights

    prefix = write_worked(tmp_path)
    with open_weights(prefix + ".index") as source:
        assert isinstance(source, TensorFlowCheckpoint) and source.format == "tensorflow"
        assert source.read_all()["x"].tolist() == [1.0, 2.0]
        shard = source._files[0]
        assert not shard.closed
    assert shard.closed and source._files == {}


# --------------------------------------------------------------------------- declared sizes (issue 10, point 7)


def _tool():
    import faults_readers  # tools/ is on sys.path (tests/conftest.py)

    return faults_readers


@pytest.mark.parametrize(
    "entry, message",
    [
        # A string tensor's size is not implied by its shape: 2**62 was read (a MemoryError) before this check.
        (
            (7, [2], 0, 1 << 62),
            r"ckpt\.data-00000-of-00001: variable 'x' needs bytes 0\.\.4611686018427387904, but the "
            r"file has 8 bytes",
        ),
        ((1, [2], 1 << 40, 8), r"variable 'x' needs bytes 1099511627776\.\.1099511627784, but the file has 8 bytes"),
        ((7, [1 << 40], 0, 8), r"1099511627776 strings cannot fit in 8 bytes"),
        (
            (1, [1 << 25, 1 << 25], 0, 0, 0, [[(0, 1 << 25), (0, 1 << 25)]]),
            r"partitioned variable 'x' declares shape "
            r"\[33554432, 33554432\].*more than",
        ),
        ((1, [2], 0, 0, 0, [[(1 << 40, 2)]]), r"slice '1099511627776,2' of 'x' reaches past its shape \[2\]"),
    ],
)
def test_declared_sizes_beyond_the_data_shard_are_refused_on_read(tmp_path, entry, message):
    tool = _tool()
    prefix = tool.tf_checkpoint(str(tmp_path / "ckpt"), {"x": tool.tf_entry(*entry)}, struct.pack("<2f", 1, 2))
    with open_tensorflow(prefix) as checkpoint:
        with pytest.raises(WeightSourceError, match=message):
            checkpoint.read("x")


@pytest.mark.parametrize(
    "entry, message",
    [
        ((1, [-2], 0, 8), r"the entry of 'x' is corrupt: shape \[-2\] has a negative dimension"),
        ((1, [2], -4, 8), r"the entry of 'x' is corrupt: negative offset -4"),
        ((1, [0, 1 << 62], 0, 0), r"the entry of 'x' is corrupt: shape \[0, 4611686018427387904\] is beyond"),
    ],
)
def test_impossible_entries_are_refused_on_open(tmp_path, entry, message):
    tool = _tool()
    prefix = tool.tf_checkpoint(str(tmp_path / "ckpt"), {"x": tool.tf_entry(*entry)}, struct.pack("<2f", 1, 2))
    with pytest.raises(WeightSourceError, match=message):
        open_tensorflow(prefix)


def test_header_declaring_billions_of_shards_fails_fast(tmp_path):
    tool = _tool()
    prefix = tool.tf_checkpoint(
        str(tmp_path / "ckpt"), {"x": tool.tf_entry(1, [2], 0, 8)}, b"\0" * 8, num_shards=(1 << 31) - 1
    )
    with pytest.raises(WeightSourceError, match=r"missing data shard file\(s\) .*ckpt\.data-00001-of-2147483647"):
        open_tensorflow(prefix)


def test_snappy_block_declaring_more_than_snappy_can_hold():
    with pytest.raises(WeightSourceError, match="declares 4611686018427387904 bytes"):
        snappy_decompress(varint(1 << 62) + b"\x00a", "f", 0)


def test_record_the_protobuf_runtime_refuses_is_an_error_naming_file_and_key(tmp_path):
    tool = _tool()
    # The shape field declares 5 bytes and 1 follows.
    prefix = tool.tf_checkpoint(str(tmp_path / "ckpt"), {"x": b"\x08\x01\x12\x05\x12"}, b"")
    with pytest.raises(
        WeightSourceError,
        match=r"ckpt\.index: cannot decode the entry of b'x': not a valid "
        r"serialized BundleEntryProto .*; the checkpoint is corrupt",
    ):
        open_tensorflow(prefix)
    graph = b"\x0a\x04\x0a\x02\x08\x07"  # node 0 has a child, node 7, in a graph of one node
    data = tool.varint(len(graph)) + struct.pack("<I", masked_crc32c(struct.pack("<I", len(graph)))) + graph
    entry = tool.tf_entry(7, [], 0, len(data), masked_crc32c(struct.pack("<I", len(graph)) + data[-4 - len(graph) :]))
    prefix = tool.tf_checkpoint(str(tmp_path / "graph"), {"_CHECKPOINTABLE_OBJECT_GRAPH": entry}, data)
    with open_tensorflow(prefix) as checkpoint:
        with pytest.raises(
            WeightSourceError,
            match=r"graph\.data-00000-of-00001: cannot decode "
            r"_CHECKPOINTABLE_OBJECT_GRAPH: a reference to node 7, but the "
            r"graph has 1 nodes",
        ):
            checkpoint.model_variables()
