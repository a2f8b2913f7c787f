"""te.interop.keras_model: a Keras model file becomes a plain torch module that computes what Keras computed.

The fixtures (tests/fixtures/keras_models/) were made by Keras 3.15 on TensorFlow 2.21 in a throwaway environment
(tools/make_keras_model_fixtures.py): each model as ``.keras`` and legacy ``.h5``, with Keras's own inference
outputs on fixed inputs. No TensorFlow or Keras runs here.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchestimator as te
from torchestimator.interop import KerasModel, KerasModelError, keras_model

FIXTURES = Path(__file__).parent / "fixtures" / "keras_models"
MODELS = ["mlp", "cnn", "two_towers", "text", "nested", "masked_text", "seq2seq"]


def _reference(name: str) -> tuple[list[torch.Tensor], list[np.ndarray]]:
    saved = np.load(FIXTURES / f"{name}.npz")
    inputs = [torch.from_numpy(saved[f"input_{index}"]) for index in range(sum(k.startswith("input_") for k in saved))]
    outputs = [saved[f"output_{index}"] for index in range(sum(k.startswith("output_") for k in saved))]
    return inputs, outputs


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


@pytest.mark.parametrize("suffix", ["keras", "h5"])
@pytest.mark.parametrize("name", MODELS)
def test_a_converted_model_computes_what_keras_computed(name, suffix):
    model = keras_model(FIXTURES / f"{name}.{suffix}").eval()
    assert isinstance(model, KerasModel) and isinstance(model, torch.nn.Module)
    inputs, expected = _reference(name)
    with torch.no_grad():
        outputs = _as_tuple(model(*inputs))
    assert len(outputs) == len(expected)
    for output, keras_output in zip(outputs, expected):
        assert output.shape == keras_output.shape
        np.testing.assert_allclose(output.numpy(), keras_output, atol=1e-5, rtol=0)


def test_submodules_are_named_after_the_keras_layers_and_print_the_architecture():
    model = keras_model(FIXTURES / "cnn.keras")
    assert [name for name, _ in model.named_children()] == [
        "conv1",
        "bn1",
        "pool1",
        "conv2",
        "tanh",
        "flatten",
        "logits",
    ]
    text = str(model)
    assert (
        "(conv1): Conv(3, 8, kernel_size=(3, 3), strides=(2, 2), padding='same', dilation=(1, 1), groups=1, activation=relu)"
        in text
    )
    assert "(logits): Dense(24, 5, bias=True, activation=linear)" in text
    assert "(pool1): Pool(max, pool=(2, 2), strides=(2, 2), padding='same')" in text
    # BatchNormalization keeps Keras's epsilon and its momentum the torch way round (1 - 0.99).
    assert model.bn1.norm.eps == pytest.approx(1e-3) and model.bn1.norm.momentum == pytest.approx(0.01)


def test_a_converted_model_pickles_whole_and_deep_copies(tmp_path):
    import copy

    model = keras_model(FIXTURES / "text.keras").eval()  # activations, RNNs, Bidirectional
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    inputs, expected = _reference("text")
    with torch.no_grad():
        np.testing.assert_allclose(loaded(*inputs).numpy(), expected[0], atol=1e-5, rtol=0)
        assert torch.equal(copy.deepcopy(model)(*inputs), model(*inputs))
    from torchestimator.interop.keras_source import keras_model_source

    def source(module):  # what model.py is written from survives the round trip
        return keras_model_source(module, weights_file="w.safetensors", converted_from="text.keras")

    assert source(loaded) == source(model)


def test_a_converted_model_exports_with_a_dynamic_batch():
    model = keras_model(FIXTURES / "two_towers.keras").eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    example = (torch.zeros(2, 6), torch.zeros(2, 6))
    # forward(*inputs): the inputs are one argument to torch.export, a tuple of Keras's inputs.
    program = torch.export.export(model, example, dynamic_shapes=(({0: batch}, {0: batch}),))
    left, right = torch.randn(7, 6), torch.randn(7, 6)
    for exported, eager in zip(program.module()(left, right), model(left, right)):
        torch.testing.assert_close(exported, eager)


def test_channels_first_takes_torch_layout_inputs_and_computes_the_same():
    inputs, expected = _reference("cnn")
    model = keras_model(FIXTURES / "cnn.keras", channels_first=True).eval()
    assert model.input_specs == [("image", (3, 12, 11), "float32")] and model.channels_first_inputs == ("image",)
    images = inputs[0].permute(0, 3, 1, 2).contiguous()  # NCHW, as a torch data loader gives them
    with torch.no_grad():
        np.testing.assert_allclose(model(images).numpy(), expected[0], atol=1e-5, rtol=0)
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(model, (images[:2],), dynamic_shapes=(({0: batch},),))
    torch.testing.assert_close(program.module()(images), model(images))

    # Named inputs: only those move (vectors are unchanged either way; here the spec tells which were taken).
    towers = keras_model(FIXTURES / "two_towers.keras", channels_first=["right"])
    assert towers.channels_first_inputs == ("right",)
    with pytest.raises(ValueError, match=r"no input\(s\) \['image'\]; its inputs: left, right"):
        keras_model(FIXTURES / "two_towers.keras", channels_first=["image"])
    with pytest.raises(TypeError, match="a list of input names"):
        keras_model(FIXTURES / "cnn.keras", channels_first="image")


def test_a_converted_model_fine_tunes_in_an_estimator_and_its_batchnorm_statistics_move(tmp_path):
    inputs, _ = _reference("cnn")
    rng = np.random.default_rng(0)
    images = rng.normal(size=(64, 12, 11, 3)).astype(np.float32)
    labels = rng.integers(0, 5, size=64)
    before = keras_model(FIXTURES / "cnn.keras")

    def model_fn(model, features, labels, mode):
        logits = model(features["image"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"logits": logits})
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels))

    estimator = te.Estimator(
        model_fn=model_fn,
        model=lambda: keras_model(FIXTURES / "cnn.keras"),
        optimizer=lambda parameters: torch.optim.Adam(parameters, lr=1e-2),
        model_dir=tmp_path / "run",
        config=te.RunConfig(random_seed=0, log_step_count_steps=None, save_summary_steps=None),
    )
    input_fn = te.numpy_input_fn({"image": images}, labels, batch_size=16, num_epochs=None, shuffle=True, seed=0)
    estimator.train(input_fn, max_steps=12)
    trained = estimator.checkpoint_store.restore(load_optimizer=False).model_state
    assert not torch.allclose(trained["bn1.norm.running_mean"], before.bn1.norm.running_mean)
    assert not torch.allclose(trained["conv1.weight"], before.conv1.weight)
    predictions = list(estimator.predict(te.numpy_input_fn({"image": inputs[0].numpy()}, shuffle=False)))
    restored = keras_model(FIXTURES / "cnn.keras").eval()
    restored.load_state_dict(trained)
    with torch.no_grad():
        np.testing.assert_allclose(
            np.stack([p["logits"] for p in predictions]), restored(inputs[0]).numpy(), atol=1e-5, rtol=0
        )


# ------------------------------------------------------------------------ files that are refused


def _rewritten(tmp_path: Path, member: str, change, model: Path = FIXTURES / "mlp.keras") -> Path:
    """``model`` (mlp.keras) with archive member ``member`` replaced by ``change(its bytes)``."""
    target = tmp_path / "changed.keras"
    with zipfile.ZipFile(model) as source, zipfile.ZipFile(target, "w") as copy:
        for item in source.infolist():
            data = source.read(item)
            copy.writestr(item, change(data) if item.filename == member else data)
    return target


def _with_config(tmp_path: Path, change, model: Path = FIXTURES / "mlp.keras") -> Path:
    """``model`` (mlp.keras) with its config.json changed by ``change`` (a function of the parsed config, changed
    in place)."""

    def rewrite(data: bytes) -> bytes:
        config = json.loads(data)
        change(config)
        return json.dumps(config).encode()

    return _rewritten(tmp_path, "config.json", rewrite, model)


def _insert_layer(entry: dict):
    def change(config: dict) -> None:
        config["config"]["layers"].insert(2, entry)

    return change


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"module": "keras.layers", "class_name": "Lambda", "config": {"name": "sneaky", "function": "x"}},
            r"layer 'sneaky' \(Lambda\) holds code or a custom object; it is never run",
        ),
        (
            {
                "module": None,
                "class_name": "Scale",
                "registered_name": "Custom>Scale",
                "config": {"name": "mine"},
            },
            r"layer 'mine' \(Scale\) holds code or a custom object 'Custom>Scale'",
        ),
        (
            {"module": "os", "class_name": "Dense", "config": {"name": "system", "units": 3}},
            r"layer 'system' \(Dense\) comes from module 'os', not Keras's own",
        ),
        (
            {"module": "keras.layers", "class_name": "ConvLSTM2D", "config": {"name": "rnn"}},
            r"layer 'rnn' is a ConvLSTM2D, which is not converted \(yet\). Converted: .*Dense",
        ),
    ],
    ids=["lambda", "custom_object", "foreign_module", "unsupported_class"],
)
def test_code_custom_objects_and_unknown_layers_are_refused_by_name_before_anything_is_built(
    tmp_path, monkeypatch, entry, message
):
    built = []
    monkeypatch.setattr(torch.nn.Module, "__init__", lambda *a, **k: built.append(a) or None, raising=True)
    with pytest.raises(KerasModelError, match=message):
        keras_model(_with_config(tmp_path, _insert_layer(entry)))
    assert built == []  # refused while reading the config: no module was made


def test_a_config_that_does_not_fit_the_weights_is_refused_naming_the_layer(tmp_path):
    def change(config: dict) -> None:
        config["config"]["layers"][1]["config"]["units"] = 17

    with pytest.raises(
        KerasModelError, match=r"layer 'hidden' \(Dense\): kernel of shape \[8, 16\] does not give units=17"
    ):
        keras_model(_with_config(tmp_path, change))


def test_a_weights_only_file_a_broken_config_and_an_unknown_activation_are_clear_errors(tmp_path):
    weights_only = Path(__file__).parent / "fixtures" / "keras" / "keras2_weights.h5"
    with pytest.raises(KerasModelError, match=r"holds weights only .no model_config.: give the architecture as JSON"):
        keras_model(weights_only)

    broken = _rewritten(tmp_path, "config.json", lambda data: b"{not json")
    with pytest.raises(KerasModelError, match=r"changed.keras: the model config is not JSON"):
        keras_model(broken)

    def change(config: dict) -> None:
        config["config"]["layers"][1]["config"]["activation"] = "os.system"

    with pytest.raises(KerasModelError, match=r"layer 'hidden' \(Dense\): activation 'os.system' is not one of"):
        keras_model(_with_config(tmp_path, change))


def test_a_weights_file_converts_with_its_architecture_from_a_json_file(tmp_path, capsys):
    # What a user has after model.save_weights("cnn.weights.h5") and open("cnn.json", "w").write(model.to_json()):
    # the .keras archive holds exactly those two (to_json's text is its config.json).
    with zipfile.ZipFile(FIXTURES / "cnn.keras") as archive:
        (tmp_path / "cnn.weights.h5").write_bytes(archive.read("model.weights.h5"))
        (tmp_path / "cnn.json").write_bytes(archive.read("config.json"))
    inputs, expected = _reference("cnn")
    model = keras_model(tmp_path / "cnn.weights.h5", config=tmp_path / "cnn.json").eval()
    with torch.no_grad():
        np.testing.assert_allclose(model(*inputs).numpy(), expected[0], atol=1e-5, rtol=0)

    # A legacy .h5 without its model_config attribute, with the config as JSON beside it.
    import h5py

    legacy = tmp_path / "cnn_weights.h5"
    legacy.write_bytes((FIXTURES / "cnn.h5").read_bytes())
    with h5py.File(legacy, "r+") as handle:
        (tmp_path / "legacy.json").write_text(handle.attrs["model_config"])
        del handle.attrs["model_config"]
    from torchestimator.cli import main

    arguments = ["convert", "keras-model", str(legacy), str(tmp_path / "cnn.safetensors")]
    assert main(arguments) == 2 and "--config: model.to_json()'s text" in capsys.readouterr().err
    assert main([*arguments, "--config", str(tmp_path / "legacy.json")]) == 0
    model = keras_model(legacy, config=tmp_path / "legacy.json").eval()
    with torch.no_grad():
        np.testing.assert_allclose(model(*inputs).numpy(), expected[0], atol=1e-5, rtol=0)

    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(KerasModelError, match=r"list.json: the model config is not a JSON object"):
        keras_model(legacy, config=tmp_path / "list.json")
    with pytest.raises(KerasModelError, match=r"missing.json: cannot read the model config"):
        keras_model(legacy, config=tmp_path / "missing.json")


def test_a_mask_reaching_a_layer_whose_math_would_need_it_is_refused_by_name(tmp_path):
    # Sequential: the mask flows with no trace in the config; a Softmax after Embedding(mask_zero=True) would use it.
    softmax = {"class_name": "Softmax", "config": {"name": "masked_softmax", "axis": -1}}
    changed = _with_config(tmp_path, _insert_layer(softmax), FIXTURES / "masked_text.keras")
    with pytest.raises(KerasModelError, match=r"layer 'masked_softmax' \(Softmax\) gets a mask .from Embedding"):
        keras_model(changed)

    # Functional (Keras 3 records the mask it passes): a mask= on a layer that does not take one here.
    def mask_to_dense(config: dict) -> None:
        layers = {entry["name"]: entry for entry in config["config"]["layers"]}
        lstm_mask = layers["lstm_7"]["inbound_nodes"][0]["kwargs"]["mask"]
        layers["dense_3"]["inbound_nodes"][0]["kwargs"]["mask"] = lstm_mask

    changed = _with_config(tmp_path, mask_to_dense, FIXTURES / "layers" / "mask_kept_by_dense.keras")
    with pytest.raises(KerasModelError, match=r"layer .dense_3. is called with mask="):
        keras_model(changed)


def test_the_weights_of_an_archive_are_read_in_place_or_through_zipfile_when_compressed(tmp_path):
    import os

    from torchestimator.interop.keras_hdf5_guard import stored_member

    # Keras stores model.weights.h5 uncompressed: read in place (Python 3.11's zipfile seeks backwards by
    # reading the member again). A deflated copy goes through zipfile; both give the same module.
    deflated = tmp_path / "deflated.keras"
    with (
        zipfile.ZipFile(FIXTURES / "cnn.keras") as source,
        zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as copy,
    ):
        for item in source.infolist():
            copy.writestr(item.filename, source.read(item))
    stored, compressed = keras_model(FIXTURES / "cnn.keras").state_dict(), keras_model(deflated).state_dict()
    assert list(stored) == list(compressed) and all(torch.equal(stored[k], compressed[k]) for k in stored)

    with zipfile.ZipFile(FIXTURES / "cnn.keras") as archive:
        info = archive.getinfo("model.weights.h5")
        whole = archive.read(info)
    member = stored_member(str(FIXTURES / "cnn.keras"), info)
    assert member is not None
    with member:
        member.seek(100)
        assert member.read(50) == whole[100:150]
        member.seek(-10, os.SEEK_END)
        assert member.read(100) == whole[-10:] and member.read(1) == b""
        member.seek(0)
        assert member.read() == whole
    with zipfile.ZipFile(deflated) as archive:
        assert stored_member(str(deflated), archive.getinfo("model.weights.h5")) is None


def test_states_of_an_rnn_are_outputs_only_with_return_state_and_export(tmp_path):
    # seq2seq: the encoder's return_state starts the decoder (initial_state); the GRU's state is an output.
    model = keras_model(FIXTURES / "seq2seq.keras").eval()
    inputs, _ = _reference("seq2seq")
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(model, tuple(inputs), dynamic_shapes=(({0: batch}, {0: batch}),))
    for exported, eager in zip(program.module()(*inputs), model(*inputs)):
        torch.testing.assert_close(exported, eager)

    def no_states(config: dict) -> None:
        for entry in config["config"]["layers"]:
            if entry["name"] == "encoder":
                entry["config"]["return_state"] = False

    with pytest.raises(KerasModelError, match=r"output 1 of layer 'encoder' is used, which gives 1 output"):
        keras_model(_with_config(tmp_path, no_states, FIXTURES / "seq2seq.keras"))


def test_noise_layers_train_as_keras_and_are_the_identity_at_inference():
    from torchestimator.interop.keras_layers import CONVERTERS, LayerSpec

    def layer(class_name: str, **config):
        return CONVERTERS[class_name](LayerSpec("noise", class_name, config, []))

    torch.manual_seed(0)
    x = torch.ones(64, 5, 6, 32)
    layers = {
        "spatial": layer("SpatialDropout2D", rate=0.5),
        "spatial_cf": layer("SpatialDropout2D", rate=0.5, data_format="channels_first"),
        "shared": layer("Dropout", rate=0.5, noise_shape=[None, 1, 1, None]),
        "gaussian_dropout": layer("GaussianDropout", rate=0.2),
        "gaussian_noise": layer("GaussianNoise", stddev=0.3),
    }
    for module in layers.values():
        assert torch.equal(module.eval()(x), x)  # inference: nothing changes
        module.train()
    # SpatialDropout drops whole channels (channels-last: the last axis; channels-first: axis 1), scaling the rest.
    y = layers["spatial"](x)
    assert set(y.unique().tolist()) == {0.0, 2.0} and (y == y[:, :1, :1, :]).all()
    y = layers["spatial_cf"](x)
    assert set(y.unique().tolist()) == {0.0, 2.0} and (y == y[:, :, :1, :1]).all()
    y = layers["shared"](x)
    assert (y == y[:, :1, :1, :]).all() and 0.4 < (y == 0).float().mean() < 0.6
    y = layers["gaussian_dropout"](x)  # x * N(1, sqrt(rate / (1 - rate))) = N(1, 0.5)
    assert abs(y.mean().item() - 1) < 0.02 and abs(y.std().item() - 0.5) < 0.02
    y = layers["gaussian_noise"](x)  # x + N(0, 0.3)
    assert abs(y.mean().item() - 1) < 0.02 and abs(y.std().item() - 0.3) < 0.02


@pytest.mark.parametrize("kind, gates", [("LSTM", 4), ("GRU", 3), ("SimpleRNN", 1)])
def test_rnn_dropout_drops_inputs_and_state_before_their_kernels_in_training_only(kind, gates, monkeypatch):
    from torchestimator.interop.keras_layers import CONVERTERS, LayerSpec

    rng = np.random.default_rng(3)
    features, units = 5, 4
    weights = [
        rng.normal(0, 0.4, size=(features, gates * units)).astype(np.float32),
        rng.normal(0, 0.4, size=(units, gates * units)).astype(np.float32),
        rng.normal(0, 0.1, size=(2, gates * units) if kind == "GRU" else (gates * units,)).astype(np.float32),
    ]

    def layer(rates: dict, scale_recurrent: float = 1.0):
        kernels = [weights[0], weights[1] * scale_recurrent, weights[2]]
        config = {"units": units, "return_sequences": True, **rates}
        return CONVERTERS[kind](LayerSpec("rnn", kind, config, kernels))

    x = torch.from_numpy(rng.normal(size=(3, 6, features)).astype(np.float32))
    plain = layer({}).eval()
    with torch.no_grad():
        expected = plain(x)
        for rates in ({"dropout": 0.5}, {"recurrent_dropout": 0.5}, {"dropout": 0.3, "recurrent_dropout": 0.3}):
            dropping = layer(rates)
            assert torch.equal(dropping.eval()(x), expected)  # inference: no dropout
            dropping.train()
            assert not torch.allclose(dropping(x), expected)  # training: dropped
            # Every unit kept (rand >= rate everywhere): the kept values scaled by 1/(1-rate) are the inputs
            # before the input kernel and the state before the recurrent kernel, nothing else.
            monkeypatch.setattr(torch, "rand_like", lambda like: torch.ones_like(like))
            x_scale = 1 / (1 - rates.get("dropout", 0.0))
            h_scale = 1 / (1 - rates.get("recurrent_dropout", 0.0))
            reference = layer({}, scale_recurrent=h_scale).eval()(x * x_scale)
            torch.testing.assert_close(dropping(x), reference, rtol=1e-5, atol=1e-6)
            monkeypatch.undo()


# ------------------------------------------------------------------------ every layer alone, against Keras

_LAYER_CASES = sorted(path.stem for path in (FIXTURES / "layers").glob("*.keras"))


@pytest.mark.parametrize("case", _LAYER_CASES)
def test_each_layer_alone_computes_what_keras_computed(case):
    saved = np.load(FIXTURES / "layers.npz")
    inputs = [
        torch.from_numpy(saved[f"{case}/input_{index}"]) for index in range(3) if f"{case}/input_{index}" in saved
    ]
    model = keras_model(FIXTURES / "layers" / f"{case}.keras").eval()
    with torch.no_grad():
        output = model(*inputs)
    expected = saved[f"{case}/output_0"]
    assert tuple(output.shape) == expected.shape
    np.testing.assert_allclose(output.numpy(), expected, atol=1e-5, rtol=1e-5)


def _entries(config: dict):
    """Every layer entry of a model config, nested models' included."""
    for entry in config["config"]["layers"]:
        yield entry
        if entry["class_name"] in ("Sequential", "Functional", "Model"):
            yield from _entries(entry)


def test_the_layer_table_covers_every_converter():
    from torchestimator.interop.keras_layers import ACTIVATIONS, CONVERTERS, OP_CONVERTERS

    classes, ops, channels_first = set(), set(), set()
    files = [FIXTURES / "layers" / f"{case}.keras" for case in _LAYER_CASES]
    for path in files + sorted((FIXTURES / "applications").glob("*.keras")):  # the applications: their own classes
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
        for entry in _entries(config):
            is_op = str(entry.get("module", "")).startswith("keras.src.ops")
            (ops if is_op else classes).add(entry["class_name"])
            if entry["config"].get("data_format") == "channels_first":
                channels_first.add(entry["class_name"])
        if path.stem.startswith("activation_"):
            classes.add("activation:" + path.stem.removeprefix("activation_"))
    assert set(OP_CONVERTERS) - ops == set()
    # Classes whose math is the identity at inference, or a twin of a tested one (3-D pooling and padding).
    untested = {
        "GaussianDropout", "GaussianNoise", "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
        "MaxPooling3D", "AveragePooling3D", "GlobalMaxPooling2D", "GlobalMaxPooling3D", "GlobalAveragePooling1D",
        "GlobalAveragePooling3D", "ZeroPadding3D", "Cropping3D", "UpSampling3D", "DepthwiseConv1D",
        "SeparableConv1D", "Conv3DTranspose", "Activation", "Add", "Multiply",
    }  # fmt: skip
    assert set(CONVERTERS) - classes - untested == set()
    # Each layout-dependent class is also checked on channels-first data.
    assert {
        "Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D", "Conv2DTranspose", "MaxPooling2D",
        "AveragePooling1D", "AveragePooling2D", "GlobalAveragePooling2D", "GlobalMaxPooling2D", "Flatten",
        "ZeroPadding2D", "Cropping2D", "UpSampling2D", "Resizing",
    } - channels_first == set()  # fmt: skip
    assert {f"activation:{name}" for name in ACTIVATIONS} - classes == {"activation:hard_swish"}  # hard_silu's alias


# ------------------------------------------------------------------------ the command line


def test_convert_keras_model_writes_a_runnable_program_and_the_weights(tmp_path, capsys):
    from safetensors.torch import load_file

    from torchestimator.cli import main

    inputs, expected = _reference("cnn")
    assert main(["convert", "keras-model", str(FIXTURES / "cnn.h5"), str(tmp_path / "cnn.pt2"), "--show"]) == 0
    printed = capsys.readouterr().out
    assert "(conv1): Conv(3, 8" in printed and "inputs image [12, 11, 3] float32; wrote" in printed
    program = torch.export.load(str(tmp_path / "cnn.pt2")).module()  # torch alone runs it, any batch size
    np.testing.assert_allclose(program(inputs[0]).detach().numpy(), expected[0], atol=1e-5, rtol=0)
    assert tuple(program(inputs[0][:1]).shape) == (1, 5)

    # --channels-first: the program takes NCHW images.
    nchw = str(tmp_path / "cnn_nchw.pt2")
    assert main(["convert", "keras-model", str(FIXTURES / "cnn.keras"), nchw, "--channels-first"]) == 0
    assert "inputs image [3, 12, 11] float32" in capsys.readouterr().out
    program = torch.export.load(nchw).module()
    images = inputs[0].permute(0, 3, 1, 2)
    np.testing.assert_allclose(program(images).detach().numpy(), expected[0], atol=1e-5, rtol=0)

    assert main(["convert", "keras-model", str(FIXTURES / "text.keras"), str(tmp_path / "text.safetensors")]) == 0
    weights = load_file(str(tmp_path / "text.safetensors"))
    model = keras_model(FIXTURES / "text.keras")
    assert weights.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(weights[name], tensor)


def test_convert_keras_model_says_what_is_wrong_in_one_line(tmp_path, capsys):
    from torchestimator.cli import main

    assert main(["convert", "keras-model", str(FIXTURES / "mlp.keras"), str(tmp_path / "mlp.onnx")]) == 2
    assert "mlp.onnx' must end with .safetensors, .pt2 or .py." in capsys.readouterr().err
    weights_only = Path(__file__).parent / "fixtures" / "keras" / "keras2_weights.h5"
    assert main(["convert", "keras-model", str(weights_only), str(tmp_path / "out.pt2")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("torchestimator convert: error:") and "holds weights only" in error
    assert not (tmp_path / "out.pt2").exists()


def _generated_module(model_file: Path, folder: Path, *options: str):
    """`convert keras-model FILE folder/model.py`, then the written model.py imported as a module."""
    import importlib.util

    from torchestimator.cli import main

    folder.mkdir(parents=True, exist_ok=True)
    assert main(["convert", "keras-model", str(model_file), str(folder / "model.py"), *options]) == 0
    assert (folder / "model.safetensors").is_file()
    spec = importlib.util.spec_from_file_location(f"generated_{folder.name}", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _case_inputs(model_file: str) -> list[torch.Tensor]:
    if model_file.startswith("layers/"):
        saved, case = np.load(FIXTURES / "layers.npz"), model_file[len("layers/") : -len(".keras")]
        return [torch.from_numpy(saved[f"{case}/input_{i}"]) for i in range(3) if f"{case}/input_{i}" in saved]
    return _reference(model_file.rsplit(".", 1)[0])[0]


@pytest.mark.parametrize(
    "model_file",
    [f"{name}.{suffix}" for name in MODELS for suffix in ("keras", "h5")] + [f"layers/{c}.keras" for c in _LAYER_CASES],
)
def test_the_generated_source_builds_the_same_module_bit_for_bit(model_file, tmp_path):
    converted = keras_model(FIXTURES / model_file).eval()
    generated = _generated_module(FIXTURES / model_file, tmp_path / "out").load()
    assert not generated.training

    # The same layers with the same arguments, the same weights under the same names, the same frozen parameters.
    def layers(model, nested):
        return [
            (name, "a nested model" if nested(module) else type(module), module.extra_repr())
            for name, module in model.named_modules()
        ]

    assert layers(generated, lambda module: type(module).__module__.startswith("generated_")) == layers(
        converted, lambda module: isinstance(module, KerasModel)
    )
    expected_state, state = converted.state_dict(), generated.state_dict()
    assert list(state) == list(expected_state)
    assert all(torch.equal(state[name], expected_state[name]) for name in state)
    assert [p.requires_grad for p in generated.parameters()] == [p.requires_grad for p in converted.parameters()]
    inputs = _case_inputs(model_file)
    with torch.no_grad():
        for output, expected in zip(_as_tuple(generated(*inputs)), _as_tuple(converted(*inputs))):
            assert torch.equal(output, expected)


def test_the_generated_source_reads_as_the_keras_model_and_takes_channels_first_inputs(tmp_path):
    module = _generated_module(FIXTURES / "cnn.keras", tmp_path / "nchw", "--channels-first")
    source = (tmp_path / "nchw" / "model.py").read_text()
    assert "class Cnn(nn.Module):" in source and "def forward(self, image: torch.Tensor) -> torch.Tensor:" in source
    assert "        conv1 = self.conv1(image)\n        bn1 = self.bn1(conv1)\n" in source
    assert "self.pool1 = layers.Pool(kind='max', pool=(2, 2), strides=(2, 2), padding='same')" in source
    assert "Inputs: image [3, 12, 11] float32, without the batch (channels-first: image)." in source
    inputs, expected = _reference("cnn")
    with torch.no_grad():
        output = module.load()(inputs[0].permute(0, 3, 1, 2))
    np.testing.assert_allclose(output.numpy(), expected[0], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------ keras.applications


_APPLICATIONS = sorted(path.stem for path in (FIXTURES / "applications").glob("*.keras"))
# Skeleton of each format (tools/make_keras_model_fixtures.py, APPLICATION_SKELETONS) and key of Keras's output.
_APPLICATION_FILES = {"keras": ("{name}.keras", "{name}/output_0"), "h5": ("{name}.h5.gz", "{name}.h5/output_0")}


# Keras cannot load back its own legacy .h5 of MobileNetV3, ConvNeXt and InceptionResNetV2 (KERAS_CANNOT_RELOAD in
# the fixture tool): those are checked from .keras only.
_APPLICATION_CASES = [
    (name, suffix)
    for name in _APPLICATIONS
    for suffix, (skeleton, _) in _APPLICATION_FILES.items()
    if (FIXTURES / "applications" / skeleton.format(name=name)).exists()
]


def test_every_application_is_checked_in_both_formats_where_keras_reloads_them():
    only_keras = {name for name in _APPLICATIONS if (name, "h5") not in _APPLICATION_CASES}
    assert only_keras == {"MobileNetV3Small", "ConvNeXtTiny", "InceptionResNetV2"}
    assert len(_APPLICATIONS) == 11


@pytest.mark.slow  # 1-8 s each, and nothing in them differs between the compiled and pure-Python passes
@pytest.mark.parametrize(("name", "suffix"), _APPLICATION_CASES)
def test_keras_applications_compute_what_keras_computed(name, suffix, tmp_path):
    # The weights are not in the repository (ResNet50's alone are 94 MB): the skeleton keeps the file's structure
    # and keras_skeleton.rebuild fills it with the values Keras's outputs were computed for. The legacy .h5 keeps
    # its datasets at other paths than the .keras, so it gets other weights and Keras computed other outputs.
    import keras_skeleton  # tools/ is on sys.path (tests/conftest.py)

    skeleton, key = (pattern.format(name=name) for pattern in _APPLICATION_FILES[suffix])
    full = tmp_path / f"{name}.{suffix}"
    keras_skeleton.rebuild(FIXTURES / "applications" / skeleton, full, seed=31)
    saved = np.load(FIXTURES / "applications.npz")
    model = keras_model(full).eval()
    with torch.no_grad():
        output = model(torch.from_numpy(saved[f"{name}/input_0"]))
    np.testing.assert_allclose(output.numpy(), saved[key], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_benchmark_converts_every_fixture_and_prints_its_line(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "keras_models_benchmark", FIXTURES.parents[2] / "benchmarks" / "keras_models.py"
    )
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    # Three files, one of them rebuilt from a skeleton: the line's form (the full run is the benchmark's; every
    # fixture's error is checked by the tests above).
    assert benchmark.main(["--repeats", "1", "--only", r"^(cnn\.h5|two_towers\.keras|MobileNetV2\.keras)$"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    converted, error = re.fullmatch(
        r"keras_models converted=(\d+/\d+) max_abs_err=(\S+) forward_vs_keras_torch=\S+", last
    ).groups()
    assert converted == "3/3" and float(error) < 1e-5


def test_batchnorm_in_training_normalizes_by_the_batch_and_updates_its_statistics_as_keras_fit():
    # Keras's moving variance takes the batch's biased variance (torch's BatchNorm would fold in the unbiased one).
    saved = np.load(FIXTURES / "bn_training.npz")
    model = keras_model(FIXTURES / "bn_training.keras").train()
    output = model(torch.from_numpy(saved["input_0"]))
    np.testing.assert_allclose(output.detach().numpy(), saved["output_training"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(model.bn.norm.running_mean.numpy(), saved["moving_mean"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(model.bn.norm.running_var.numpy(), saved["moving_variance"], atol=1e-6, rtol=0)


def test_a_huge_declared_weight_is_refused_before_anything_is_allocated(tmp_path):
    import io

    import h5py

    from torchestimator.interop import WeightSourceError

    def declare_256_gib(data: bytes) -> bytes:
        buffer = io.BytesIO(data)
        with h5py.File(buffer, "r+") as weights:
            del weights["layers/dense/vars/0"]
            weights.create_dataset("layers/dense/vars/0", shape=(1 << 20, 1 << 16), dtype="float32")  # no storage
        return buffer.getvalue()

    crafted = _rewritten(tmp_path, "model.weights.h5", declare_256_gib)
    with pytest.raises(WeightSourceError, match=r"declares more data than the file holds"):
        keras_model(crafted)


@pytest.mark.parametrize("name", ["keras2_masked", "keras2_seq2seq"])
def test_keras_2_graphs_carry_masks_and_initial_states_as_keras_2_computed(name, tmp_path):
    # Saved by tf_keras 2.21: its graph records no mask (Embedding(mask_zero=True) -> Bidirectional GRU -> Dense
    # -> GlobalAveragePooling1D on padded ids) and lists an RNN's initial states as extra inputs (seq2seq).
    model = keras_model(FIXTURES / f"{name}.h5").eval()
    inputs, expected = _reference(name)
    with torch.no_grad():
        np.testing.assert_allclose(model(*inputs).numpy(), expected[0], atol=1e-5, rtol=0)
    generated = _generated_module(FIXTURES / f"{name}.h5", tmp_path / name).load()
    with torch.no_grad():
        assert torch.equal(generated(*inputs), model(*inputs))


@pytest.mark.parametrize(
    "file, output",
    [
        ("keras2_model.h5", "keras2_output"),
        ("keras3_model.h5", "keras3_output"),
        ("keras3_model.keras", "keras3_output"),
    ],
)
def test_a_keras_2_model_file_converts_as_keras_2_computed(file, output):
    # tests/fixtures/keras/ (tools/make_keras_fixtures.py): one model saved by tf_keras 2.21 (Keras 2's config and
    # node format: [[name, node, tensor, kwargs]], batch_input_shape) and by Keras 3, with each one's outputs.
    saved = np.load(Path(__file__).parent / "fixtures" / "keras" / "reference.npz")
    model = keras_model(Path(__file__).parent / "fixtures" / "keras" / file).eval()
    with torch.no_grad():
        np.testing.assert_allclose(model(torch.from_numpy(saved["input"])).numpy(), saved[output], atol=1e-5, rtol=0)
    assert model.input_specs[0][1] == (8, 8, 3)
