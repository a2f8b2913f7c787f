"""Tests for torchestimator.interop.keras_h5 against files written by real Keras (tests/fixtures/keras)."""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import numpy
import pytest
import torch

h5py = pytest.importorskip("h5py")

from torchestimator.interop.keras_h5 import KerasH5Source, is_keras_h5, open_keras_h5  # noqa: E402
from torchestimator.interop.source import WeightSourceError  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "keras")
SIMPLE_FILES = {
    "keras2_weights.h5": "keras_h5",
    "keras2_model.h5": "keras_h5",
    "keras3_model.h5": "keras_h5",
    "keras3_model.weights.h5": "keras3_weights_h5",
    "keras3_model.keras": "keras3_weights_h5",
}
NESTED_FILES = ["keras3_nested.weights.h5", "keras3_nested.keras"]


def fixture(name: str) -> str:
    return os.path.join(FIXTURES, name)


@pytest.fixture(scope="module")
def reference() -> dict[str, numpy.ndarray]:
    with numpy.load(fixture("reference.npz")) as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def description() -> dict:
    with open(fixture("reference.json"), encoding="utf-8") as handle:
        return json.load(handle)


# ----------------------------------------------------------------------------- real Keras files


@pytest.mark.parametrize("name", sorted(SIMPLE_FILES))
def test_values_match_keras_get_weights_in_layer_order(name, reference):
    with open_keras_h5(fixture(name)) as source:
        assert source.format == SIMPLE_FILES[name]
        layers = source.layers()
        assert [layer for layer, _ in layers] == ["conv", "bn", "fc"]
        for layer, infos in layers:
            expected = [reference[f"{layer}/{index}"] for index in range(len(infos))]
            assert f"{layer}/{len(infos)}" not in reference  # no weight of the layer left out
            for info, value in zip(infos, expected):
                read = source.read(info.name)
                assert read.dtype == value.dtype and info.dtype == value.dtype.name
                assert read.shape == value.shape == info.shape
                numpy.testing.assert_array_equal(read, value)


@pytest.mark.parametrize("name", sorted(SIMPLE_FILES))
def test_tensors_are_sorted_and_read_all_matches(name):
    with open_keras_h5(fixture(name)) as source:
        infos = source.tensors()
        assert [info.name for info in infos] == sorted(info.name for info in infos)
        assert len(infos) == 8
        values = source.read_all()
        assert {name: value.shape for name, value in values.items()} == {info.name: info.shape for info in infos}


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("keras2_weights.h5", "keras2"),
        ("keras2_model.h5", "keras2"),
        ("keras3_model.h5", "keras3"),
    ],
)
def test_legacy_names_are_keras_weight_names_without_colon_zero(name, version, description):
    expected = [
        weight.removesuffix(":0")
        for layer in description[f"{version}_layer_order"]
        for weight in description[f"{version}_weight_names"][layer]
    ]
    with open_keras_h5(fixture(name)) as source:
        assert [info.name for _, infos in source.layers() for info in infos] == expected
        assert source.aliases() == {}


@pytest.mark.parametrize("name", ["keras3_model.weights.h5", "keras3_model.keras"])
def test_keras3_names_are_paths_with_keras_variable_paths_as_aliases(name, description, reference):
    with open_keras_h5(fixture(name)) as source:
        assert source.layers()[0][1][0].name == "layers/conv2d/vars/0"
        aliases = source.aliases()
        expected_aliases = [
            weight
            for layer in description["keras3_layer_order"]
            for weight in description["keras3_weight_names"][layer]
        ]
        assert sorted(aliases) == sorted(expected_aliases)
        numpy.testing.assert_array_equal(source.read("bn/moving_variance"), reference["bn/3"])
        numpy.testing.assert_array_equal(source.read("bn/moving_variance"), source.read(aliases["bn/moving_variance"]))


@pytest.mark.parametrize("name", NESTED_FILES)
def test_nested_lstm_and_sequential_layout(name):
    with open(fixture("reference_nested.json"), encoding="utf-8") as handle:
        expected = json.load(handle)
    with numpy.load(fixture("reference_nested.npz")) as data:
        values = {key: data[key] for key in data.files}
    with open_keras_h5(fixture(name)) as source:
        layers = source.layers()
        assert [layer for layer, _ in layers] == ["lstm", "nobias", "inner/inner_fc", "inner/inner_bn", "dense_9", "zz"]
        # Layer order gives Keras's model.weights order.
        ordered = [info for _, infos in layers for info in infos]
        assert [list(info.shape) for info in ordered] == [shape for _, shape in expected["weights"]]
        for info, (path, _) in zip(ordered, expected["weights"]):
            numpy.testing.assert_array_equal(source.read(info.name), values[path])
        aliases = source.aliases()
        without_config = {"inner/inner_bn/beta", "inner/inner_bn/moving_mean", "inner/inner_bn/moving_variance"}
        # BatchNormalization(scale=False) saves 3 of 4 variables: only config.json tells which.
        must_have = {path for path, _ in expected["weights"]} - (without_config if name.endswith(".h5") else set())
        assert must_have <= set(aliases)
        if name.endswith(".h5"):
            assert not without_config & set(aliases)
        for alias in must_have:
            numpy.testing.assert_array_equal(source.read(alias), values[alias])
        optimizer = [info.name for info in source.tensors() if info.name.startswith("optimizer/vars/")]
        assert len(optimizer) == len(source.tensors()) - len(ordered) > 0


@pytest.mark.parametrize("name", sorted(SIMPLE_FILES))
def test_equivalent_torch_model_reproduces_keras_output(name, reference):
    """Loading by layer order with explicit layout conversions reproduces Keras's inference output."""
    torch.manual_seed(0)
    conv, norm, linear = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, eps=1e-3), torch.nn.Linear(144, 5)
    with open_keras_h5(fixture(name)) as source:
        (_, conv_infos), (_, norm_infos), (_, linear_infos) = source.layers()
        kernel, bias = (torch.from_numpy(source.read(info.name)) for info in conv_infos)
        gamma, beta, mean, variance = (torch.from_numpy(source.read(info.name)) for info in norm_infos)
        dense_kernel, dense_bias = (torch.from_numpy(source.read(info.name)) for info in linear_infos)
    with torch.no_grad():
        conv.weight.copy_(kernel.permute(3, 2, 0, 1))  # HWIO -> OIHW
        conv.bias.copy_(bias)
        norm.weight.copy_(gamma), norm.bias.copy_(beta)
        norm.running_mean.copy_(mean), norm.running_var.copy_(variance)
        linear.weight.copy_(dense_kernel.T)
        linear.bias.copy_(dense_bias)
        norm.eval()
        images = torch.from_numpy(reference["input"]).permute(0, 3, 1, 2)  # NHWC -> NCHW
        hidden = torch.relu(norm(conv(images)))
        output = linear(hidden.permute(0, 2, 3, 1).flatten(1))  # Keras flattens in (h, w, c) order
    expected = reference["keras2_output" if name.startswith("keras2") else "keras3_output"]
    numpy.testing.assert_allclose(output.numpy(), expected, atol=1e-5, rtol=0)
    assert not numpy.allclose(mean.numpy(), 0) and not numpy.allclose(variance.numpy(), 1)


def test_keras_archive_is_read_without_extracting(tmp_path):
    copy = tmp_path / "model.keras"
    shutil.copy(fixture("keras3_model.keras"), copy)
    with open_keras_h5(copy) as source:
        assert len(source.read_all()) == 8
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]


def test_read_unknown_name_names_nearest(tmp_path):
    with open_keras_h5(fixture("keras3_model.weights.h5")) as source:
        with pytest.raises(KeyError, match="conv/kernel") as caught:
            source.read("conv/kernal")
        assert "keras3_model.weights.h5" in str(caught.value)
    with pytest.raises(WeightSourceError, match="closed"):
        source.read("conv/kernel")


def test_is_keras_h5(tmp_path):
    for name in [*SIMPLE_FILES, *NESTED_FILES]:
        assert is_keras_h5(fixture(name))
    text = tmp_path / "weights.bin"
    text.write_bytes(b"not weights at all")
    assert not is_keras_h5(text)
    assert not is_keras_h5(fixture("reference.npz"))  # a zip, but not a Keras archive
    renamed = tmp_path / "archive.zip"
    shutil.copy(fixture("keras3_model.keras"), renamed)
    assert is_keras_h5(renamed)
    assert is_keras_h5(tmp_path / "missing.h5")  # so the reader can report the missing file


# ----------------------------------------------------------------------------- hand-built files


def test_chunked_fixed_length_attributes_and_weight_name_order(tmp_path):
    path = tmp_path / "chunked.h5"
    with h5py.File(path, "w") as handle:
        handle.attrs["layer_names0"] = numpy.array([b"first"], dtype="S5")
        handle.attrs["layer_names1"] = numpy.array([b"second"], dtype="S6")
        first = handle.create_group("first")
        first.attrs["weight_names"] = numpy.array([b"first/gamma:0", b"first/beta:0"])
        first.create_dataset("first/beta:0", data=numpy.array([2.0], dtype=numpy.float64))
        first.create_dataset("first/gamma:0", data=numpy.array([1.0], dtype=numpy.float64))
        second = handle.create_group("second")
        second.attrs["weight_names0"] = ["kernel:0"]  # a weight name without the layer prefix
        second.attrs["weight_names1"] = ["steps:0"]
        second.create_dataset("kernel:0", data=numpy.ones((2, 3), dtype=numpy.float16))
        second.create_dataset("steps:0", data=numpy.int64(7))
    with open_keras_h5(path) as source:
        # weight_names order (gamma first), not the alphabetical order HDF5 lists datasets in.
        assert [(layer, [info.name for info in infos]) for layer, infos in source.layers()] == [
            ("first", ["first/gamma", "first/beta"]),
            ("second", ["second/kernel", "second/steps"]),
        ]
        assert [info.name for info in source.tensors()] == [
            "first/beta",
            "first/gamma",
            "second/kernel",
            "second/steps",
        ]
        assert source.read("first/gamma").tolist() == [1.0]
        assert source.read("second/kernel").dtype == numpy.float16
        steps = source.read("second/steps")
        assert steps.shape == () and steps.dtype == numpy.int64 and int(steps) == 7


def test_keras3_layer_order_is_write_order_not_alphabetical(tmp_path):
    path = tmp_path / "order.weights.h5"
    with h5py.File(path, "w") as handle:
        layers = [("zeta", "later", [(2,)]), ("dense", "head", [(3, 2), (2,)]), ("conv2d", "stem", [(1, 1, 1, 3)])]
        for group, user_name, shapes in layers:
            variables = handle.create_group(f"layers/{group}/vars")
            variables.attrs["name"] = user_name
            for index, shape in enumerate(shapes):
                variables.create_dataset(str(index), data=numpy.full(shape, index, dtype=numpy.float32))
        handle.create_group("vars").attrs["name"] = "model"
    with open_keras_h5(path) as source:
        assert [layer for layer, _ in source.layers()] == ["later", "head", "stem"]
        # conv2d with one variable is kernel only (use_bias=False); zeta is unknown, so no alias.
        assert source.aliases() == {
            "head/kernel": "layers/dense/vars/0",
            "head/bias": "layers/dense/vars/1",
            "stem/kernel": "layers/conv2d/vars/0",
        }


def test_bfloat16_dataset_is_widened_to_float32(tmp_path):
    path = tmp_path / "bf16.weights.h5"
    values = numpy.array([1.0, -2.5, 3.140625], dtype=numpy.float32)
    bits = (values.view(numpy.uint32) >> 16).astype("<u2")
    with h5py.File(path, "w") as handle:
        variables = handle.create_group("layers/embedding/vars")
        variables.attrs["name"] = "tokens"
        dataset = variables.create_dataset("0", data=bits.view("V2"))
        dataset.attrs["dtype"] = "bfloat16"
    with open_keras_h5(path) as source:
        assert source.tensors()[0].dtype == "float32"
        read = source.read("tokens/embeddings")
        assert read.dtype == numpy.float32
        numpy.testing.assert_array_equal(read, values)


# ----------------------------------------------------------------------------- bad input


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(WeightSourceError, match="missing.h5: no such file"):
        open_keras_h5(tmp_path / "missing.h5")
    with pytest.raises(WeightSourceError, match="is a directory"):
        open_keras_h5(tmp_path)


def test_not_an_hdf5_file(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("these are not weights\n")
    with pytest.raises(WeightSourceError, match="notes.h5: not an HDF5 file"):
        open_keras_h5(path)


@pytest.mark.parametrize("name", ["keras3_model.weights.h5", "keras2_weights.h5"])
@pytest.mark.parametrize("keep", [0.5, 0.9, 0.99])
def test_truncated_file(tmp_path, name, keep):
    data = open(fixture(name), "rb").read()
    path = tmp_path / name
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(WeightSourceError, match=f"{name}: corrupt or truncated") as caught:
        with open_keras_h5(path) as source:
            source.read_all()
    assert isinstance(caught.value.__cause__, OSError)


@pytest.mark.parametrize("offset", [0, 3, 8, 13, 24, 40])
def test_flipped_superblock_bytes(tmp_path, offset):
    data = bytearray(open(fixture("keras2_weights.h5"), "rb").read())
    for position in range(offset, offset + 4):
        data[position] ^= 0xFF
    path = tmp_path / "flipped.h5"
    path.write_bytes(bytes(data))
    with pytest.raises(WeightSourceError, match="flipped.h5: (not an HDF5 file|corrupt)"):
        with open_keras_h5(path) as source:
            source.read_all()


def test_hdf5_file_without_weights(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("measurements", data=numpy.zeros(3))
    with pytest.raises(WeightSourceError, match=r"other.h5: an HDF5 file without Keras weights.*measurements"):
        open_keras_h5(path)


def test_weight_listed_but_missing(tmp_path):
    path = tmp_path / "partial.h5"
    shutil.copy(fixture("keras2_weights.h5"), path)
    with h5py.File(path, "a") as handle:
        del handle["fc/fc/bias:0"]
    with pytest.raises(WeightSourceError, match=r"partial.h5: variable 'fc/bias:0' of layer 'fc'"):
        open_keras_h5(path)


def test_keras_archive_errors(tmp_path):
    without = tmp_path / "empty.keras"
    with zipfile.ZipFile(without, "w") as archive:
        archive.writestr("config.json", "{}")
    with pytest.raises(WeightSourceError, match="empty.keras: the .keras archive has no 'model.weights.h5'"):
        open_keras_h5(without)
    broken = tmp_path / "broken.keras"
    broken.write_bytes(open(fixture("keras3_model.keras"), "rb").read()[:5000])
    with pytest.raises(WeightSourceError, match="broken.keras: corrupt"):
        open_keras_h5(broken)


def test_source_type():
    with open_keras_h5(fixture("keras3_model.h5")) as source:
        assert isinstance(source, KerasH5Source)
        assert "keras3_model.h5" in repr(source)


def _one_dense_layer(path, **dataset_options):
    with h5py.File(path, "w") as file:
        file.create_group("layers/dense/vars").create_dataset("0", **dataset_options)
        file.create_group("vars")
    return path


def test_dataset_declaring_more_than_its_storage_is_refused_before_reading(tmp_path):
    # Never written, so all fill value: 4 MB from a 2 KB file (the fault suite tries 8 GB under a memory limit).
    path = _one_dense_layer(tmp_path / "fill.weights.h5", shape=(1 << 20,), dtype="float32")
    with open_keras_h5(path) as source:
        with pytest.raises(
            WeightSourceError,
            match=r"fill\.weights\.h5: variable 'layers/dense/vars/0' .*declares "
            r"more data than the file holds.*only 0 bytes are stored",
        ):
            source.read("layers/dense/vars/0")


def test_compressed_and_filtered_datasets_within_the_ratio_still_read(tmp_path):
    zeros = numpy.zeros(1 << 20, dtype="float32")  # gzip shrinks zeros ~1000-fold, the most deflate can
    path = _one_dense_layer(
        tmp_path / "gzip.weights.h5", data=zeros, chunks=(1 << 20,), compression="gzip", shuffle=True, fletcher32=True
    )
    with open_keras_h5(path) as source:
        numpy.testing.assert_array_equal(source.read("layers/dense/vars/0"), zeros)


def test_oversized_config_json_is_ignored_unread(tmp_path, caplog):
    copy = tmp_path / "model.keras"
    with (
        zipfile.ZipFile(os.path.join(FIXTURES, "keras3_model.keras")) as original,
        zipfile.ZipFile(copy, "w", compression=zipfile.ZIP_DEFLATED) as archive,
    ):
        for name in original.namelist():
            data = original.read(name)
            archive.writestr(name, data + b" " * (65 << 20) if name == "config.json" else data)
    with open_keras_h5(copy) as source:
        assert source.tensors()
    assert "over the 67108864-byte limit" in caplog.text


def test_global_heap_check_passes_keras_collections_and_refuses_ones_hdf5_would_spin_on():
    """HDF5 steps through a global heap collection by declared sizes; a 0-byte free-space object spun it forever.

    The end-to-end case (reading such a file ends in WeightSourceError) runs in tests/faults under a timeout.
    """
    from torchestimator.interop.keras_h5 import _global_heap_problem

    with open(fixture("keras3_nested.weights.h5"), "rb") as handle:
        data = handle.read()
    start = data.index(b"GCOL")
    collection = bytearray(data[start : start + int.from_bytes(data[start + 8 : start + 16], "little")])
    assert _global_heap_problem(memoryview(bytes(collection))) is None
    free = 16
    while int.from_bytes(collection[free : free + 2], "little") != 0:
        free += 16 + (int.from_bytes(collection[free + 8 : free + 16], "little") + 7) // 8 * 8
    spinning = bytearray(collection)
    spinning[free + 8 : free + 16] = bytes(8)
    assert "free-space object" in _global_heap_problem(memoryview(bytes(spinning)))
    past_end = bytearray(collection)
    past_end[16 + 8 : 16 + 16] = (1 << 63).to_bytes(8, "little")  # first object's size wraps HDF5's pointer
    assert "past the collection's end" in _global_heap_problem(memoryview(bytes(past_end)))
    assert _global_heap_problem(memoryview(bytes(collection[:64]))) is None  # a partial read: checked when whole
