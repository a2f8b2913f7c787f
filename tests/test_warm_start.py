"""Warm start: TF's selection rules, renames, init_from_checkpoint scopes, the report, all-or-nothing apply,
and the acceptance checks against real Keras / TensorFlow files (no TensorFlow needed)."""

from __future__ import annotations

import json
import logging
import os

import numpy
import pytest
import torch
from safetensors.torch import save_file

from torchestimator.checkpoint import CheckpointStore
from torchestimator.interop import open_weights
from torchestimator.interop.layouts import Converter, flatten_dense_converter
from torchestimator.warm_start import (
    WarmStartSettings,
    as_warm_start_settings,
    init_from_checkpoint,
    plan_init_from_checkpoint,
    plan_warm_start,
    warm_start,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
KERAS3_WEIGHTS = os.path.join(FIXTURES, "keras", "keras3_model.weights.h5")
KERAS_REFERENCE = os.path.join(FIXTURES, "keras", "reference.npz")
TF1 = os.path.join(FIXTURES, "tf_checkpoint", "tf1")
TF2 = os.path.join(FIXTURES, "tf_checkpoint", "tf2")


def small_model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def trained_source_model() -> torch.nn.Sequential:
    """A source whose every tensor, running statistics included, differs from a fresh model's."""
    model = small_model(seed=1)
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5), model[1].bias.uniform_(-1, 1)
    model.train()
    model(torch.randn(16, 3) * 3 + 2)
    return model


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in model.state_dict().items()}


def changed(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    return {name for name, value in model.state_dict().items() if not torch.equal(value, before[name])}


@pytest.fixture()
def source_dir(tmp_path):
    """Our own checkpoint of a trained model."""
    model = trained_source_model()
    CheckpointStore(str(tmp_path / "source")).save(7, model.state_dict())
    return str(tmp_path / "source"), model


# ----------------------------------------------------------------------------- selection


def test_single_regex_selects_trainable_parameters_only(source_dir):
    path, source = source_dir
    model = small_model()
    before = snapshot(model)
    plan = warm_start(model, WarmStartSettings(path))
    assert changed(model, before) == {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"}
    assert set(plan.skipped) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert torch.equal(model.state_dict()["3.weight"], source.state_dict()["3.weight"])


def test_frozen_parameter_is_not_selected_by_a_single_regex(source_dir):
    path, _ = source_dir
    model = small_model()
    model[0].weight.requires_grad_(False)
    plan = plan_warm_start(model, WarmStartSettings(path))
    assert "0.weight" in plan.skipped and "0.weight" not in {entry.target for entry in plan.entries}


def test_list_of_regexes_selects_buffers_too(source_dir):
    path, source = source_dir
    model = small_model()
    count = warm_start(model, WarmStartSettings(path, [".*"])).entries
    assert len(count) == 9  # 6 parameters, 2 running statistics, num_batches_tracked (our checkpoint has it)
    for name, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def test_re_match_is_anchored_at_the_start(source_dir):
    path, _ = source_dir
    model = small_model()
    plan = plan_warm_start(model, WarmStartSettings(path, "3"))
    assert {entry.target for entry in plan.entries} == {"3.weight", "3.bias"}
    # "weight" would match every weight with re.search, none with re.match.
    plan = plan_warm_start(model, WarmStartSettings(path, "weight"))
    assert not plan.entries and any("selects none" in error for error in plan.errors)


def test_selection_matching_nothing_is_an_error_and_none_warns(source_dir, caplog):
    path, _ = source_dir
    model = small_model()
    before = snapshot(model)
    with pytest.raises(ValueError, match="selects none of the module's 6 trainable parameters"):
        warm_start(model, WarmStartSettings(path, "encoder"))
    assert not changed(model, before)
    with caplog.at_level(logging.WARNING, logger="torchestimator.warm_start"):
        plan = plan_warm_start(model, WarmStartSettings(path, None))
    assert plan.ok and not plan.entries and "nothing is warm-started" in caplog.text


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        WarmStartSettings("")
    with pytest.raises(ValueError, match="not a valid regex"):
        WarmStartSettings("x", "dense[")
    with pytest.raises(TypeError, match="regex strings only"):
        WarmStartSettings("x", ["dense", 3])
    with pytest.raises(ValueError, match="Unknown layout converter"):
        WarmStartSettings("x", converters={"0.weight": "transpose_please"})
    with pytest.raises(TypeError, match="warm_start_from must be"):
        as_warm_start_settings(3)
    settings = as_warm_start_settings("some/dir")
    assert settings == WarmStartSettings("some/dir", ".*") and settings.vars_to_warm_start == ".*"


# ----------------------------------------------------------------------------- names


def test_renames_map_target_to_source_and_do_not_select(tmp_path):
    source = trained_source_model()
    state = {f"backbone.{name}": value for name, value in source.state_dict().items()}
    path = str(tmp_path / "weights.pt")
    torch.save(state, path)
    model = small_model()
    renames = {"3.weight": "backbone.3.weight", "3.bias": "backbone.3.bias"}
    plan = plan_warm_start(model, WarmStartSettings(path, "3", renames))
    assert [(entry.target, entry.source, entry.origin) for entry in plan.entries] == [
        ("3.weight", "backbone.3.weight", "renamed"),
        ("3.bias", "backbone.3.bias", "renamed"),
    ]
    plan.apply(model)
    assert torch.equal(model[3].weight, source[3].weight)
    assert not torch.equal(model[0].weight, source[0].weight)  # renames do not select


def test_unused_rename_is_an_error(source_dir):
    path, _ = source_dir
    plan = plan_warm_start(small_model(), WarmStartSettings(path, "3", {"0.wieght": "0.weight"}))
    assert any("['0.wieght'] were not used. Perhaps you misspelled them?" in error for error in plan.errors)
    with pytest.raises(ValueError, match="Perhaps you misspelled them"):
        plan.apply(small_model())


def test_mapping_fn_and_safetensors_source(tmp_path):
    source = trained_source_model()
    path = str(tmp_path / "weights.safetensors")
    save_file({f"net/{name}": value.contiguous() for name, value in source.state_dict().items()}, path)
    model = small_model()
    plan = warm_start(model, WarmStartSettings(path, [".*"], mapping_fn=lambda name: f"net/{name}"))
    assert plan.source_format == "safetensors" and len(plan.entries) == 9
    assert {entry.origin for entry in plan.entries} == {"mapping_fn"}
    assert torch.equal(model[1].running_var, source[1].running_var)


def test_missing_name_lists_nearest_names_and_allow_missing(tmp_path):
    source = trained_source_model()
    state = {name: value for name, value in source.state_dict().items() if name != "3.bias"}
    state["3.biases"] = source.state_dict()["3.bias"]
    path = str(tmp_path / "weights.pt")
    torch.save(state, path)
    model = small_model()
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"3\.bias: selected, but the source has no tensor .*3\.biases"):
        warm_start(model, WarmStartSettings(path))
    assert not changed(model, before)
    plan = warm_start(model, WarmStartSettings(path, allow_missing=True))
    assert ("3.bias", "not in the source (allow_missing=True)") in plan.kept_fresh
    assert plan.unused_sources == ("1.num_batches_tracked", "1.running_mean", "1.running_var", "3.biases")
    assert changed(model, before) == {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight"}


def test_renamed_source_absent_is_reported_under_the_given_name(source_dir):
    path, _ = source_dir
    plan = plan_warm_start(small_model(), WarmStartSettings(path, "3", {"3.bias": "head/bias"}))
    assert [target for target, _ in plan.missing] == ["3.bias"]
    assert "Tensor head/bias (for 3.bias) is not found" in plan.errors[0]


def test_shape_mismatch_names_both_shapes_and_changes_nothing(tmp_path):
    source = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 5))
    path = str(tmp_path / "weights.pt")
    torch.save(source.state_dict(), path)
    model = small_model()
    before = snapshot(model)
    plan = plan_warm_start(model, WarmStartSettings(path))
    assert len(plan.entries) == 6  # the other entries are fine: the error is all-or-nothing
    assert any("Shape of 3.weight (2, 4) doesn't match 3.weight (5, 4)" in error for error in plan.errors)
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(5, 4\)"):
        plan.apply(model)
    assert not changed(model, before)


def test_shape_mismatch_is_checked_after_the_converter(tmp_path):
    source = trained_source_model()
    path = str(tmp_path / "weights.pt")
    torch.save(source.state_dict(), path)
    plan = plan_warm_start(small_model(), WarmStartSettings(path, "0", converters={"0.weight": "dense_to_linear"}))
    assert any(
        "Shape of 0.weight (4, 3) doesn't match 0.weight (3, 4) ((4, 3) before dense_to_linear)" in error
        for error in plan.errors
    )


def test_user_converter_function_runs_on_apply(tmp_path):
    source = trained_source_model()
    path = str(tmp_path / "weights.pt")
    torch.save(source.state_dict(), path)
    model = small_model()
    plan = warm_start(model, WarmStartSettings(path, "3", converters={"3.weight": lambda array: array * 2}))
    assert plan.entries[0].converter == "<lambda>" and plan.entries[0].converted_shape == (2, 4)
    assert torch.allclose(model[3].weight, source[3].weight * 2)


def test_apply_casts_dtype_and_refuses_another_module(tmp_path):
    source = trained_source_model()
    path = str(tmp_path / "weights.pt")
    torch.save(source.state_dict(), path)
    model = small_model().double()
    warm_start(model, WarmStartSettings(path))
    assert model[0].weight.dtype == torch.float64
    assert torch.allclose(model[0].weight, source[0].weight.double())
    plan = plan_warm_start(small_model(), WarmStartSettings(path))
    with pytest.raises(ValueError, match="the plan was made for another module"):
        plan.apply(torch.nn.Linear(3, 4))


def test_a_failure_during_apply_leaves_the_module_unchanged(tmp_path):
    source = trained_source_model()
    path = str(tmp_path / "weights.pt")
    torch.save(source.state_dict(), path)
    # A converter that promises the right shape but produces another: caught after earlier entries were read.
    liar = Converter(
        name="liar",
        description="wrong shape",
        function=lambda array: array[:1],
        output_shape=lambda shape: tuple(shape),
    )
    model = small_model()
    before = snapshot(model)
    plan = plan_warm_start(model, WarmStartSettings(path, converters={"3.bias": liar}))
    assert plan.ok
    with pytest.raises(ValueError, match=r"shape of 3.bias \(2,\) doesn't match 3.bias \(1,\) after liar"):
        plan.apply(model)
    assert not changed(model, before)


def test_logs_the_count_as_tensorflow_does(source_dir, caplog):
    path, _ = source_dir
    with caplog.at_level(logging.INFO, logger="torchestimator.warm_start"):
        warm_start(small_model(), WarmStartSettings(path))
    assert "Warm-started 6 variables." in caplog.text


# ----------------------------------------------------------------------------- init_from_checkpoint


def test_init_from_checkpoint_scope_forms(tmp_path):
    source = trained_source_model()
    state = {f"old/{name.replace('.', '/')}": value for name, value in source.state_dict().items()}
    path = str(tmp_path / "weights.safetensors")
    save_file({name: value.contiguous() for name, value in state.items()}, path)
    model = small_model()
    plan = plan_init_from_checkpoint(model, path, {"old/1/": "1.", "old/3/bias": "3.bias"})
    assert {(entry.target, entry.source) for entry in plan.entries} == {
        ("1.weight", "old/1/weight"),
        ("1.bias", "old/1/bias"),
        ("1.running_mean", "old/1/running_mean"),
        ("1.running_var", "old/1/running_var"),
        ("1.num_batches_tracked", "old/1/num_batches_tracked"),
        ("3.bias", "old/3/bias"),
    }
    assert plan.apply(model) == 6
    assert torch.equal(model[1].running_mean, source[1].running_mean) and torch.equal(model[3].bias, source[3].bias)

    root = str(tmp_path / "root.pt")
    torch.save({"weight": source[3].weight, "bias": source[3].bias}, root)
    plan = plan_init_from_checkpoint(small_model(), root, {"/": "3/"})  # "/" loads from the source's root
    assert {(entry.target, entry.source) for entry in plan.entries} == {("3.weight", "weight"), ("3.bias", "bias")}
    model = small_model()
    init_from_checkpoint(model, root, {"/": "3/"})  # plan + apply, as TensorFlow's name suggests
    assert torch.equal(model[3].weight, source[3].weight)
    untouched = small_model()
    before = snapshot(untouched)
    with pytest.raises(ValueError):
        init_from_checkpoint(untouched, root, {"/": "1/"})  # shapes do not fit: nothing is copied
    assert not changed(untouched, before)


def test_init_from_checkpoint_errors(source_dir):
    path, _ = source_dir
    with pytest.raises(ValueError, match="its key must be a scope too"):
        plan_init_from_checkpoint(small_model(), path, {"0.weight": "1."})
    plan = plan_init_from_checkpoint(small_model(), path, {"x/": "encoder/", "0.weight": "0.wieght"})
    assert any("scope 'encoder/' holds no tensor" in error for error in plan.errors)
    assert any("'0.wieght' is not a tensor of the module" in error for error in plan.errors)


# ----------------------------------------------------------------------------- report


def test_report_and_json(source_dir):
    path, _ = source_dir
    plan = plan_warm_start(small_model(), WarmStartSettings(path))
    text = plan.format()
    assert "6 to load, 3 not selected" in text and "0.weight  <-  0.weight" in text
    assert "Not selected (fresh):\n  1.running_mean" in text
    document = json.loads(plan.to_json())
    assert document["ok"] and len(document["load"]) == 6 and document["load"][0]["target_shape"] == [4, 3]
    plan.close()


# ----------------------------------------------------------------------------- TensorFlow / Keras


def keras_equivalent() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4, eps=1e-3, momentum=0.01),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(144, 5),
    )


def test_keras_names_differ_completely_so_proposals_need_opting_in():
    model = keras_equivalent()
    before = snapshot(model)
    plan = plan_warm_start(model, WarmStartSettings(KERAS3_WEIGHTS, [".*"]))
    assert not plan.entries and len(plan.missing) == 8
    assert [(p.target, p.source, p.status) for p in plan.proposals][:2] == [
        ("0.weight", "conv/kernel", "confident"),
        ("0.bias", "conv/bias", "confident"),
    ]
    assert any("pass accept_proposed_mapping=True" in error for error in plan.errors)
    # The Linear after Flatten is ambiguous (NHWC order): accepting confident proposals does not take it.
    plan = plan_warm_start(model, WarmStartSettings(KERAS3_WEIGHTS, [".*"], accept_proposed_mapping=True))
    assert [target for target, _ in plan.missing] == ["4.weight"]
    assert "flatten_dense_converter" in plan.errors[0] and "converters={'4.weight'" in plan.errors[0]
    with pytest.raises(ValueError, match="4.weight"):
        plan.apply(model)
    assert not changed(model, before)


@pytest.mark.parametrize(
    "filename, expected_key",
    [
        ("keras3_model.weights.h5", "keras3_output"),
        ("keras3_model.h5", "keras3_output"),  # Keras 3 model.save('x.h5'), the legacy layout
        ("keras3_model.keras", "keras3_output"),
        ("keras2_model.h5", "keras2_output"),  # tf_keras model.save('x.h5')
        ("keras2_weights.h5", "keras2_output"),  # tf_keras save_weights('x.h5')
    ],
)
def test_keras_files_reproduce_keras_inference_output(filename, expected_key):
    model = keras_equivalent()
    settings = WarmStartSettings(
        os.path.join(os.path.dirname(KERAS3_WEIGHTS), filename),
        [".*"],
        accept_proposed_mapping=True,
        converters={"4.weight": flatten_dense_converter(4, 6, 6)},
    )
    plan = warm_start(model, settings)
    assert len(plan.entries) == 8 and {entry.origin for entry in plan.entries} == {"proposal"}
    assert ("1.num_batches_tracked" in dict(plan.kept_fresh)) and not plan.warnings
    assert {entry.target: entry.converter for entry in plan.entries}["0.weight"] == "conv_to_torch"
    reference = numpy.load(KERAS_REFERENCE)
    model.eval()
    with torch.no_grad():
        output = model(torch.from_numpy(reference["input"]).permute(0, 3, 1, 2))  # NHWC -> NCHW
    numpy.testing.assert_allclose(output.numpy(), reference[expected_key], atol=1e-5, rtol=0)
    assert not numpy.allclose(model[1].running_mean.numpy(), 0)


def test_batchnorm_convention_warnings_for_keras_sources():
    model = keras_equivalent()
    model[1].eps, model[1].momentum = 1e-5, 0.1
    settings = WarmStartSettings(
        KERAS3_WEIGHTS, [".*"], accept_proposed_mapping=True, converters={"4.weight": flatten_dense_converter(4, 6, 6)}
    )
    plan = plan_warm_start(model, settings)
    assert any("epsilon differs" in warning for warning in plan.warnings)
    assert any("momentum differs" in warning for warning in plan.warnings)
    assert "Warnings:" in plan.format()


def test_tf1_checkpoint_optimizer_slots_are_unused_not_errors():
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, eps=1e-3, momentum=0.01), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    plan = warm_start(model, WarmStartSettings(TF1, [".*"], accept_proposed_mapping=True))
    assert plan.ok and len(plan.entries) == 8 and not plan.warnings
    ignored = dict(plan.optimizer_sources)
    assert {"dense/kernel/Adam", "dense/kernel/Adam_1", "beta1_power", "global_step"} <= set(ignored)
    assert not plan.unused_sources
    expected = numpy.load(os.path.join(TF1, "expected.npz"))
    numpy.testing.assert_array_equal(model[0].weight.detach().numpy(), expected["dense/kernel"].T)
    numpy.testing.assert_array_equal(model[1].running_var.numpy(), expected["batch_normalization/moving_variance"])
    numpy.testing.assert_array_equal(model[3].bias.detach().numpy(), expected["dense_1/bias"])


def test_tf1_renames_take_the_proposal_converter_and_scopes_keep_member_names():
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, eps=1e-3, momentum=0.01), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    plan = plan_warm_start(model, WarmStartSettings(TF1, "0", {"0.weight": "dense/kernel", "0.bias": "dense/bias"}))
    assert plan.ok and [entry.converter for entry in plan.entries] == ["dense_to_linear", "identity"]
    # A scope map keeps member names, as in TF: torch's "weight" is not TF's "kernel".
    plan = plan_init_from_checkpoint(model, TF1, {"dense_1/": "3."})
    assert [entry.source for entry in plan.entries] == ["dense_1/bias"]
    assert "Tensor dense_1/weight (for 3.weight) is not found" in plan.errors[0] and "dense_1/kernel" in plan.errors[0]
    plan = plan_init_from_checkpoint(
        model,
        TF1,
        [("dense_1/kernel", "3.weight"), ("dense_1/bias", "3.bias")],
        converters={"3.weight": "dense_to_linear"},
    )
    assert plan.ok and plan.apply(model) == 2
    expected = numpy.load(os.path.join(TF1, "expected.npz"))
    numpy.testing.assert_array_equal(model[3].weight.detach().numpy(), expected["dense_1/kernel"].T)


def test_tf2_object_checkpoint_reproduces_keras_inference_output():
    # The TF2 fixture's model is Dense(8) -> BatchNormalization -> Dense(1), without an activation.
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, eps=1e-3, momentum=0.01), torch.nn.Linear(8, 1)
    )
    with open_weights(TF2) as source:
        plan = warm_start(model, WarmStartSettings(source, [".*"], accept_proposed_mapping=True))
        assert plan.ok and plan.entries[0].source == "model/_functional/_operations/1/kernel"
        assert plan.entries[0].source_key.startswith("optimizer/_trainable_variables/")
    assert any(name.startswith("optimizer/_variables/") for name, _ in plan.optimizer_sources)
    reference = numpy.load(os.path.join(TF2, "inference.npz"))
    model.eval()
    with torch.no_grad():
        output = model(torch.from_numpy(reference["inputs"]))
    numpy.testing.assert_allclose(output.numpy(), reference["outputs"], atol=1e-5, rtol=0)


def test_tf1_checkpoint_reproduces_tensorflow_inference_output():
    # The TF1 fixture's graph is dense -> batch_normalization (epsilon 1e-3) -> relu -> dense_1; its inference.npz
    # is TF's output with batch norm on the moving statistics, from the checkpoint restored with Saver.
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, eps=1e-3, momentum=0.01), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    plan = warm_start(model, WarmStartSettings(TF1, [".*"], accept_proposed_mapping=True))
    assert plan.ok and {entry.origin for entry in plan.entries} == {"proposal"}
    reference = numpy.load(os.path.join(TF1, "inference.npz"))
    inputs = torch.from_numpy(reference["inputs"])
    model.eval()
    with torch.no_grad():
        output = model(inputs)
    numpy.testing.assert_allclose(output.numpy(), reference["outputs"], atol=1e-5, rtol=0)
    # Batch statistics give another answer, so the match above depends on the moving statistics.
    model.train()
    with torch.no_grad():
        assert not numpy.allclose(model(inputs).numpy(), reference["outputs"], atol=1e-3)


KERAS_NAMES = {
    "0.weight": "conv/kernel",
    "0.bias": "conv/bias",
    "1.weight": "bn/gamma",
    "1.bias": "bn/beta",
    "1.running_mean": "bn/moving_mean",
    "1.running_var": "bn/moving_variance",
    "4.weight": "fc/kernel",
    "4.bias": "fc/bias",
}


def test_a_rename_of_the_dense_after_flatten_needs_its_converter_as_a_proposal_does():
    """A rename names the tensor, not its row order: loading Keras's NHWC-flattened kernel with the plain
    transpose wrote wrong weights without a word. The plan refuses it as the proposal route does."""
    model = keras_equivalent()
    before = snapshot(model)
    plan = plan_warm_start(model, WarmStartSettings(KERAS3_WEIGHTS, [".*"], var_name_to_prev_var_name=KERAS_NAMES))
    assert not plan.ok and len(plan.errors) == 1
    assert plan.errors[0].startswith("4.weight <- fc/kernel: this Linear follows a Flatten of a 4-channel feature map")
    assert (
        "confirm with converters={'4.weight': layouts.flatten_dense_converter(4, height, width)} where "
        "height*width = 36, or converters={'4.weight': 'dense_to_linear'}"
    ) in plan.errors[0]
    assert "--converter" not in plan.errors[0]
    with pytest.raises(ValueError, match="4.weight <- fc/kernel"):
        plan.apply(model)
    assert not changed(model, before)
    # mapping_fn is a name rule too.
    plan = plan_warm_start(model, WarmStartSettings(KERAS3_WEIGHTS, [".*"], mapping_fn=KERAS_NAMES.get))
    assert [error.split(":")[0] for error in plan.errors] == ["4.weight <- fc/kernel"]
    # Naming the converter decides, either way; the other targets never needed one.
    reference = numpy.load(KERAS_REFERENCE)
    plan = warm_start(
        model,
        WarmStartSettings(
            KERAS3_WEIGHTS,
            [".*"],
            var_name_to_prev_var_name=KERAS_NAMES,
            converters={"4.weight": "flatten_dense:4,6,6"},
        ),
    )
    assert plan.ok and {e.target: e.converter for e in plan.entries}["4.weight"].startswith("flatten_nhwc_to_nchw")
    model.eval()
    with torch.no_grad():
        output = model(torch.from_numpy(reference["input"]).permute(0, 3, 1, 2))
    numpy.testing.assert_allclose(output.numpy(), reference["keras3_output"], atol=1e-5, rtol=0)
    plan = plan_warm_start(
        keras_equivalent(),
        WarmStartSettings(
            KERAS3_WEIGHTS, [".*"], var_name_to_prev_var_name=KERAS_NAMES, converters={"4.weight": "dense"}
        ),
    )
    assert plan.ok and {e.target: e.converter for e in plan.entries}["4.weight"] == "dense_to_linear"
    plan.close()


def test_a_rename_of_a_linear_not_after_a_convolution_needs_no_converter():
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, eps=1e-3, momentum=0.01), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    names = {
        entry.target: entry.source
        for entry in plan_warm_start(model, WarmStartSettings(TF1, [".*"], accept_proposed_mapping=True)).entries
    }
    plan = warm_start(model, WarmStartSettings(TF1, [".*"], var_name_to_prev_var_name=names))
    assert plan.ok and {entry.origin for entry in plan.entries} == {"renamed"} and len(plan.entries) == 8
