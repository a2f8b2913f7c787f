"""Issue 15, point 7: the last gaps of the Keras reader, on files real Keras 3.15 wrote (tests/fixtures/keras_gaps,
made by its make_fixtures.py).

* Keras 3 names a DepthwiseConv2D weight ``kernel``: a torch MobileNetV2-like model warm-starts from the
  ``.weights.h5``, ``.keras`` and legacy ``.h5`` with no mapping, and reproduces Keras's output.
* The BatchNorm advice quotes the epsilon/momentum the file records (ResNet50's 1.001e-5), and following it
  reproduces Keras's output.
* Sharded Keras 3 weights (``x.weights.json`` + parts) read as the unsharded file does; bad sets are errors
  naming the index.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil

import numpy
import pytest
import torch
from torch import nn

h5py = pytest.importorskip("h5py")

from torchestimator.interop import WeightSourceError, open_weights  # noqa: E402
from torchestimator.interop.keras_h5 import is_keras_h5, open_keras_h5  # noqa: E402
from torchestimator.interop.layouts import batchnorm_settings  # noqa: E402
from torchestimator.warm_start import WarmStartSettings, plan_warm_start, warm_start  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "keras_gaps")
MOBILENET_FILES = ["mobilenet_like.weights.h5", "mobilenet_like.keras", "mobilenet_like.h5"]
DEPTHWISE_LAYERS = ("expanded_conv_depthwise", "block_1_depthwise")


def fixture(name: str) -> str:
    return os.path.join(FIXTURES, name)


def reference(model: str) -> dict[str, numpy.ndarray]:
    with numpy.load(fixture(f"{model}_reference.npz")) as data:
        return {key: data[key] for key in data.files}


def description() -> dict:
    with open(fixture("reference.json"), encoding="utf-8") as handle:
        return json.load(handle)


class TinyMobileNet(nn.Module):
    """The fixture's mobilenet_like model in torch: the layer kinds of MobileNetV2, torch's own names."""

    def __init__(self, eps: float = 1e-3, momentum: float = 0.001) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(8, eps=eps, momentum=momentum)
        self.expand_dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.expand_dw_bn = nn.BatchNorm2d(8, eps=eps, momentum=momentum)
        self.project = nn.Conv2d(8, 8, 1, bias=False)
        self.project_bn = nn.BatchNorm2d(8, eps=eps, momentum=momentum)
        self.widen_dw = nn.Conv2d(8, 16, 3, padding=1, groups=8)  # Keras depth_multiplier=2
        self.widen_dw_bn = nn.BatchNorm2d(16, eps=eps, momentum=momentum)
        self.fc = nn.Linear(16, 4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = nn.functional.relu6(self.stem_bn(self.stem(images)))
        y = nn.functional.relu6(self.expand_dw_bn(self.expand_dw(x)))
        x = x + self.project_bn(self.project(y))
        x = nn.functional.relu6(self.widen_dw_bn(self.widen_dw(x)))
        return self.fc(x.mean((2, 3)))


def warm_started(path: str, **batchnorm: float) -> tuple[TinyMobileNet, object]:
    torch.manual_seed(0)
    module = TinyMobileNet(**batchnorm)
    plan = warm_start(module, WarmStartSettings(path, [".*"], accept_proposed_mapping=True))
    return module.eval(), plan


def nchw(array: numpy.ndarray) -> torch.Tensor:
    return torch.from_numpy(array).permute(0, 3, 1, 2)


# ----------------------------------------------------------------------------- depthwise kernels


@pytest.mark.parametrize("name", MOBILENET_FILES)
def test_keras3_depthwise_kernel_also_gets_its_keras2_name_from_the_layer_class(name):
    expected = reference("mobilenet_like")
    with open_keras_h5(fixture(name)) as source:
        aliases = source.aliases()
        names = {info.name for info in source.tensors()}
        for layer in DEPTHWISE_LAYERS:
            raw = aliases.get(f"{layer}/kernel", f"{layer}/kernel")  # a legacy .h5 names the tensor itself so
            assert raw in names and aliases[f"{layer}/depthwise_kernel"] == raw
            numpy.testing.assert_array_equal(source.read(f"{layer}/depthwise_kernel"), expected[f"{layer}/0"])
        assert not {"Conv1/depthwise_kernel", "expanded_conv_project/depthwise_kernel"} & set(aliases)


@pytest.mark.parametrize("name", MOBILENET_FILES)
def test_mobilenet_like_warm_starts_from_each_keras3_file_with_no_mapping(name):
    expected = reference("mobilenet_like")
    module, plan = warm_started(fixture(name))
    by_target = {entry.target: entry for entry in plan.entries}
    for target, layer in (("expand_dw.weight", DEPTHWISE_LAYERS[0]), ("widen_dw.weight", DEPTHWISE_LAYERS[1])):
        assert by_target[target].converter == "depthwise_conv_to_torch"
        assert by_target[target].source == f"{layer}/depthwise_kernel"
        kernel = expected[f"{layer}/0"]  # [h, w, in, multiplier] -> [in * multiplier, 1, h, w]
        spatial, channels, multiplier = kernel.shape[:2], kernel.shape[2], kernel.shape[3]
        by_hand = kernel.transpose(2, 3, 0, 1).reshape(channels * multiplier, 1, *spatial)
        numpy.testing.assert_array_equal(module.get_parameter(target).detach().numpy(), by_hand)
    with torch.no_grad():
        output = module(nchw(expected["input"]))
    numpy.testing.assert_allclose(output.numpy(), expected["output"], atol=1e-5, rtol=0)
    # MobileNetV2's BatchNorm momentum 0.999 (torch 0.001) is recorded in .keras/.h5; a .weights.h5 has no config.
    if name.endswith(".weights.h5"):
        assert plan.warnings and all("Keras's default" in warning for warning in plan.warnings)
    else:
        assert plan.warnings == ()


def test_keras3_files_give_the_values_the_legacy_h5_gives():
    legacy = warm_started(fixture("mobilenet_like.h5"))[0].state_dict()
    for name in ("mobilenet_like.weights.h5", "mobilenet_like.keras", "sharded/mobilenet_like.weights.json"):
        state = warm_started(fixture(name))[0].state_dict()
        assert list(state) == list(legacy)
        for key, value in legacy.items():
            torch.testing.assert_close(state[key], value, atol=1e-6, rtol=0, msg=f"{name}: {key}")


def test_an_explicit_rename_may_use_keras3s_own_kernel_path():
    module = TinyMobileNet()
    settings = WarmStartSettings(
        fixture("mobilenet_like.keras"),
        [".*"],
        accept_proposed_mapping=True,
        var_name_to_prev_var_name={"expand_dw.weight": "expanded_conv_depthwise/kernel"},
        converters={"expand_dw.weight": "depthwise"},
    )
    plan = plan_warm_start(module, settings)
    plan.close()
    assert plan.ok and {entry.target: entry.source for entry in plan.entries}["expand_dw.weight"] == (
        "expanded_conv_depthwise/depthwise_kernel"
    )


def test_depthwise_layers_of_an_unknown_class_get_advice_naming_the_kernels_that_fit(tmp_path):
    """A .weights.h5 has no config; a custom DepthwiseConv subclass's group name does not say depthwise."""
    copy = tmp_path / "custom.weights.h5"
    shutil.copy(fixture("mobilenet_like.weights.h5"), copy)
    with h5py.File(copy, "r+") as handle:
        handle.move("layers/depthwise_conv2d", "layers/my_depthwise")
        handle.move("layers/depthwise_conv2d_1", "layers/my_depthwise_1")
    plan = plan_warm_start(TinyMobileNet(), WarmStartSettings(str(copy), [".*"], accept_proposed_mapping=True))
    plan.close()
    proposal = {p.target: p for p in plan.proposals}["expand_dw.weight"]
    assert proposal.status == "unmatched" and proposal.source is None
    assert "layers/my_depthwise, layers/my_depthwise_1" in proposal.reason
    assert "depthwise_conv_to_torch" in proposal.reason and "records no layer class" in proposal.reason
    # Following the advice loads the values the known-class file gives.
    renames = {
        "expand_dw.weight": "layers/my_depthwise/vars/0",
        "widen_dw.weight": "layers/my_depthwise_1/vars/0",
        "widen_dw.bias": "layers/my_depthwise_1/vars/1",
    }
    # The two Conv layers are then among four Conv-looking ones: their (ambiguous) proposals need confirming too.
    converters = {
        "expand_dw.weight": "depthwise",
        "widen_dw.weight": "depthwise",
        "stem.weight": "conv",
        "project.weight": "conv",
    }
    module = TinyMobileNet()
    warm_start(
        module, WarmStartSettings(str(copy), [".*"], renames, accept_proposed_mapping=True, converters=converters)
    )
    expected = warm_started(fixture("mobilenet_like.weights.h5"))[0].state_dict()
    for key, value in module.state_dict().items():
        torch.testing.assert_close(value, expected[key], atol=0, rtol=0, msg=key)


# ----------------------------------------------------------------------------- BatchNorm advice


def conv_bn(eps: float, momentum: float) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, eps=eps, momentum=momentum))


def advised(warnings: tuple[str, ...]) -> tuple[float, float]:
    text = " ".join(warnings)
    eps = re.search(r"Build the torch layer with eps=([0-9.e+-]+)\.", text)
    momentum = re.search(r"Build it with momentum=([0-9.e+-]+);", text)
    assert eps and momentum, text
    return float(eps.group(1)), float(momentum.group(1))


@pytest.mark.parametrize("name", ["resnet_bn.keras", "resnet_bn.h5"])
def test_batchnorm_advice_names_the_recorded_settings_and_following_it_reproduces_keras(name):
    recorded = description()["models"]["resnet_bn"]["batchnorm"]["bn"]
    assert recorded == {"epsilon": 1.001e-5, "momentum": 0.97}
    plan = plan_warm_start(conv_bn(1e-5, 0.1), WarmStartSettings(fixture(name), [".*"], accept_proposed_mapping=True))
    plan.close()
    text = " ".join(plan.warnings)
    assert "epsilon=1.001e-05 (as recorded in the file's model config)" in text
    assert "momentum=0.97 (as recorded in the file's model config) is torch momentum=0.03" in text
    eps, momentum = advised(plan.warnings)
    assert (eps, momentum) == (1.001e-5, pytest.approx(0.03))
    expected = reference("resnet_bn")
    outputs = {}
    for label, settings in (("advice", (eps, momentum)), ("keras default", (1e-3, 0.01))):
        module = conv_bn(*settings)
        followed = warm_start(module, WarmStartSettings(fixture(name), [".*"], accept_proposed_mapping=True))
        with torch.no_grad():
            outputs[label] = module.eval()(nchw(expected["input"])).permute(0, 2, 3, 1).numpy()
        if label == "advice":
            assert followed.warnings == ()
    numpy.testing.assert_allclose(outputs["advice"], expected["output"], atol=1e-5, rtol=0)
    # What the advice said before the file's settings were read: Keras's default epsilon, far off here.
    assert numpy.abs(outputs["keras default"] - expected["output"]).max() > 1e-3


def test_batchnorm_advice_without_a_config_says_it_assumes_keras_defaults():
    plan = plan_warm_start(
        conv_bn(1e-5, 0.1), WarmStartSettings(fixture("resnet_bn.weights.h5"), [".*"], accept_proposed_mapping=True)
    )
    plan.close()
    text = " ".join(plan.warnings)
    assert "epsilon=0.001 (Keras's default; the source records no layer settings" in text
    assert "momentum=0.99 (Keras's default" in text


def test_layer_config_of_a_tensor_by_raw_name_or_alias():
    with (
        open_keras_h5(fixture("resnet_bn.keras")) as keras,
        open_keras_h5(fixture("resnet_bn.h5")) as legacy,
        open_keras_h5(fixture("resnet_bn.weights.h5")) as weights_only,
    ):
        for source, name in (
            (keras, "bn/gamma"),
            (keras, keras.aliases()["bn/moving_variance"]),
            (legacy, "bn/moving_mean"),
        ):
            config = source.layer_config(name)
            assert config["class_name"] == "BatchNormalization"
            assert batchnorm_settings(config).epsilon == 1.001e-5 and batchnorm_settings(config).momentum == 0.97
        assert keras.layer_config("conv/kernel")["class_name"] == "Conv2D"
        assert weights_only.layer_config("bn/gamma") is None
    assert batchnorm_settings({"config": {"epsilon": 2e-3}}).momentum == 0.99
    assert "epsilon as recorded" in batchnorm_settings({"config": {"epsilon": 2e-3}}).origin


# ----------------------------------------------------------------------------- sharded weights


def assert_same_source(sharded, whole) -> None:
    assert sharded.format == whole.format == "keras3_weights_h5"
    assert sharded.tensors() == whole.tensors()
    assert sharded.aliases() == whole.aliases()
    assert sharded.layers() == whole.layers()
    for info in whole.tensors():
        numpy.testing.assert_array_equal(sharded.read(info.name), whole.read(info.name))


@pytest.mark.parametrize("model", ["nested", "mobilenet_like"])
def test_sharded_keras3_weights_read_as_the_unsharded_file(model):
    index = fixture(f"sharded/{model}.weights.json")
    files = description()["sharded"][model]
    parts = [name for name in files if not name.endswith(".json")]
    assert len(parts) >= 2 and is_keras_h5(index)
    with open_weights(index) as sharded, open_weights(fixture(f"{model}.weights.h5")) as whole:
        assert sharded.parts == tuple(parts)
        assert_same_source(sharded, whole)


def test_sharded_fixture_splits_a_layer_over_two_parts():
    with open(fixture("sharded/nested.weights.json"), encoding="utf-8") as handle:
        weight_map = json.load(handle)["weight_map"]
    assert any(isinstance(parts, list) and len(parts) > 1 for parts in weight_map.values())


@pytest.fixture
def sharded_copy(tmp_path):
    for name in description()["sharded"]["nested"]:
        shutil.copy(fixture(f"sharded/{name}"), tmp_path / name)
    return tmp_path


def rewrite_index(folder, change) -> str:
    path = folder / "nested.weights.json"
    index = json.loads(path.read_text())
    change(index["weight_map"])
    path.write_text(json.dumps(index))
    return str(path)


def test_a_missing_part_is_an_error_naming_the_index_and_the_part(sharded_copy):
    os.remove(sharded_copy / "nested_00001.weights.h5")
    with pytest.raises(
        WeightSourceError,
        match=r"nested\.weights\.json: the part 'nested_00001\.weights\.h5' .* "
        r"is missing",
    ):
        open_weights(sharded_copy / "nested.weights.json")


def test_an_index_naming_a_variable_no_part_has_is_an_error(sharded_copy):
    path = rewrite_index(
        sharded_copy, lambda weight_map: weight_map.update({"/layers/ghost/vars": "nested_00000.weights.h5"})
    )
    with pytest.raises(
        WeightSourceError,
        match=r"nested\.weights\.json: weight_map puts the variables "
        r"'/layers/ghost/vars' in the part 'nested_00000\.weights\.h5'",
    ):
        open_weights(path)


def test_a_part_from_another_save_is_an_error(sharded_copy):
    index = sharded_copy / "nested.weights.json"
    shutil.copy(fixture("sharded/mobilenet_like_00001.weights.h5"), sharded_copy / "nested_00001.weights.h5")
    with pytest.raises(
        WeightSourceError,
        match=r"nested\.weights\.json: .*'nested_00001\.weights\.h5'.* not the "
        "one written with this index",
    ):
        open_weights(index)


def test_variables_a_part_holds_outside_the_weight_map_are_an_error(sharded_copy):
    path = rewrite_index(sharded_copy, lambda weight_map: weight_map.pop("/layers/sequential/layers/dense/vars"))
    with pytest.raises(
        WeightSourceError,
        match="holds variables under '/layers/sequential/layers/dense/vars', which weight_map does not place there",
    ):
        open_weights(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ('{"metadata": {}}', "no non-empty 'weight_map'"),
        ('{"weight_map": {"/vars": 3}}', "expected a part's file name"),
        ('{"weight_map": {"/vars": "../elsewhere.weights.h5"}}', "without a folder"),
    ],
)
def test_a_damaged_index_is_an_error_naming_it(tmp_path, text, message):
    path = tmp_path / "x.weights.json"
    path.write_text(text)
    with pytest.raises(WeightSourceError, match=re.escape(message)) as raised:
        open_keras_h5(path)
    assert str(path) in str(raised.value)


def test_opening_one_part_warns_that_it_holds_only_some_tensors(sharded_copy, caplog):
    with caplog.at_level(logging.WARNING), open_keras_h5(sharded_copy / "nested_00000.weights.h5"):
        pass
    assert "is one part of the sharded Keras weights" in caplog.text and "nested.weights.json" in caplog.text


def test_a_closed_sharded_source_refuses_reads():
    source = open_keras_h5(fixture("sharded/nested.weights.json"))
    name = source.tensors()[0].name
    source.close()
    with pytest.raises(WeightSourceError, match="closed"):
        source.read(name)


def test_without_a_config_each_class_keeps_keras_counter_order_whatever_the_addresses(tmp_path):
    """HDF5 reuses freed space in big files (MobileNetV2's .weights.h5 listed Conv_1 18th of 35 Conv2D groups by
    address); Keras's class counters (conv2d, conv2d_1, ...) are in model order."""
    path = tmp_path / "reused.weights.h5"
    with h5py.File(path, "w") as handle:  # written against the counters, as a reused lower address would list them
        for group, user_name in (("conv2d_1", "second"), ("dense", "head"), ("conv2d", "first")):
            variables = handle.create_group(f"layers/{group}/vars")
            variables.attrs["name"] = user_name
            variables.create_dataset("0", data=numpy.zeros((1, 1, 2, 2) if group != "dense" else (2, 2), "float32"))
    with open_keras_h5(path) as source:
        assert [layer for layer, _ in source.layers()] == ["first", "head", "second"]
