"""`torchestimator warm-start` finishes the README's case from the command line and writes its result.

The source is the Keras 3 fixture (tests/fixtures/keras: Conv2D -> BatchNormalization -> Flatten ->
Dense), whose torch counterpart needs the Flatten-aware converter for its Linear: the dry run fails
naming the CLI flags, the flags make it sound, and `--write` gives a model_dir that `train` resumes
from (the same run as Estimator(warm_start_from=...)) or a safetensors file.
"""

from __future__ import annotations

import logging
import os
import shlex
import textwrap

import numpy
import pytest
import torch
from helpers import FIXTURES
from safetensors.torch import load_file

from torchestimator.checkpoint import CheckpointStore
from torchestimator.cli import build_parser, main
from torchestimator.cli.model_file import load_model_file
from torchestimator.interop import open_weights
from torchestimator.interop.layouts import CONVERTER_SPECS, converter_from_spec, flatten_dense_converter
from torchestimator.warm_start import WarmStartSettings, plan_warm_start, warm_start

KERAS_FIXTURES = str(FIXTURES / "keras")
KERAS3_WEIGHTS = os.path.join(KERAS_FIXTURES, "keras3_model.weights.h5")
KERAS_REFERENCE = os.path.join(KERAS_FIXTURES, "reference.npz")

MODEL_FILE = textwrap.dedent("""
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    config = te.RunConfig(random_seed=0, save_checkpoints_steps=3, log_step_count_steps=None, progress_bar=False)
    max_steps = 3
    rng = np.random.default_rng(0)
    X = rng.normal(size=(32, 3, 8, 8)).astype(np.float32)
    Y = rng.integers(0, 5, size=32)

    def model(params):  # the Keras fixture's model, in torch: Conv2D(4, 3), BatchNormalization, Flatten, Dense(5)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, eps=1e-3, momentum=0.01), nn.ReLU(),
                             nn.Flatten(), nn.Linear(144, 5))

    def model_fn(model, features, labels, mode):
        logits = model(features["image"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"logits": logits})
        return te.EstimatorSpec(mode, predictions={"logits": logits}, loss=F.cross_entropy(logits, labels))

    def optimizer(parameters):
        return torch.optim.SGD(parameters, lr=0.1)

    def train_input_fn():
        return te.numpy_input_fn({"image": X}, Y, batch_size=8, num_epochs=None, shuffle=True)()
""")

# Every tensor, BatchNorm statistics included; the Linear after Flatten with the NHWC -> NCHW row order.
SOUND = ["--vars", ".*", "--include_buffers", "--accept_proposed", "--converter", "4.weight=flatten_dense:4,6,6"]


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the printed hints use the paths as given
    (tmp_path / "model.py").write_text(MODEL_FILE)
    return "model.py"


def warm_start_cli(model_file: str, *flags: str) -> int:
    return main(["warm-start", "--model", model_file, KERAS3_WEIGHTS, *flags])


def expected_state() -> dict[str, torch.Tensor]:
    """What the Python API warm-starts into the same model (built as the Estimator builds it: seed 0)."""
    torch.manual_seed(0)
    module = load_model_file("model.py").model({})
    warm_start(
        module,
        WarmStartSettings(
            KERAS3_WEIGHTS,
            [".*"],
            accept_proposed_mapping=True,
            converters={"4.weight": flatten_dense_converter(4, 6, 6)},
        ),
    )
    return module.state_dict()


def assert_same_tensors(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(actual) == list(expected) or set(actual) == set(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype and torch.equal(actual[name], value), name


def test_dry_run_of_the_readme_case_fails_naming_the_cli_flags(model_file, capsys):
    assert warm_start_cli(model_file, "--dry_run", "--vars", ".*", "--include_buffers") == 1
    captured = capsys.readouterr()
    assert "pass --accept_proposed to use the proposals" in captured.out
    assert "confirm with --converter 4.weight=flatten_dense:4,H,W (with --accept_proposed)" in captured.out
    assert "flatten_dense:4,H,W where H*W = 36 (4,6,6 if the feature map is square)" in captured.out
    for python_word in ("converters=", "accept_proposed_mapping", "flatten_dense_converter", "var_name_to_prev"):
        assert python_word not in captured.out
    assert "nothing was written" in captured.err
    # Accepting the confident proposals leaves the Linear after Flatten, and the advice for it.
    assert warm_start_cli(model_file, "--vars", ".*", "--include_buffers", "--accept_proposed") == 1
    errors = capsys.readouterr().out.split("ERRORS (nothing will be loaded):\n")[1].strip().splitlines()
    assert len(errors) == 1 and errors[0].strip().startswith("4.weight:") and "--converter 4.weight=" in errors[0]
    assert os.listdir(".") == ["model.py"] or sorted(os.listdir(".")) == ["__pycache__", "model.py"]


def test_the_python_api_keeps_naming_its_arguments():
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 5)
    )
    plan = plan_warm_start(module, WarmStartSettings(KERAS3_WEIGHTS, [".*"], accept_proposed_mapping=True))
    try:
        assert "converters={'4.weight': ...} (with accept_proposed_mapping=True)" in plan.errors[0]
        assert "--converter" not in plan.format() and "converters=" not in plan.format(for_cli=True)
        assert plan.error_messages(for_cli=True)[0] in plan.format(for_cli=True)
        assert "--converter 4.weight=flatten_dense:4,H,W" in plan.to_dict(for_cli=True)["missing"][0]["why"]
    finally:
        plan.close()


def test_converter_and_accept_proposed_make_it_sound_and_a_dry_run_writes_nothing(model_file, capsys):
    assert warm_start_cli(model_file, "--dry_run", *SOUND) == 0
    out = capsys.readouterr().out
    assert "4.weight        <-  fc/kernel" in out and "flatten_nhwc_to_nchw(channels=4, height=6, width=6)" in out
    assert "8 tensors warm-started if applied); nothing was written" in out
    assert sorted(name for name in os.listdir(".") if name != "__pycache__") == ["model.py"]


def test_write_model_dir_then_train_resumes_exactly_as_warm_start_from_does(model_file, capsys, caplog):
    assert warm_start_cli(model_file, "--write", "runs/x", *SOUND) == 0
    out = capsys.readouterr().out
    store = CheckpointStore("runs/x")
    assert [os.path.basename(path) for path in store.all_checkpoints()] == ["ckpt-0"]
    checkpoint = store.restore()
    assert checkpoint.step == 0 and checkpoint.optimizer_state is None
    expected = expected_state()
    assert_same_tensors(checkpoint.model_state, expected)
    with open_weights(KERAS3_WEIGHTS) as keras:  # the source's own values, converted: not only "the same as Python"
        kernel = next(info.name for info in keras.tensors() if info.shape == (144, 5))
        assert torch.equal(
            checkpoint.model_state["4.weight"], torch.from_numpy(flatten_dense_converter(4, 6, 6)(keras.read(kernel)))
        )

    # An Estimator on the written model_dir restores these weights: its predictions are Keras's own.
    module_file = load_model_file("model.py")
    import torchestimator as te

    reference = numpy.load(KERAS_REFERENCE)
    images = numpy.ascontiguousarray(reference["input"].transpose(0, 3, 1, 2))  # NHWC -> NCHW
    estimator = te.Estimator(model_fn=module_file.model_fn, model=module_file.model, model_dir="runs/x")
    logits = numpy.stack(
        [
            row["logits"]
            for row in estimator.predict(te.numpy_input_fn({"image": images}, batch_size=len(images), shuffle=False))
        ]
    )
    numpy.testing.assert_allclose(logits, reference["keras3_output"], atol=1e-5, rtol=0)

    # The printed hint runs as printed, and resumes from step 0 exactly as warm_start_from in a fresh model_dir.
    hint = out.rsplit("Train from it: ", 1)[1].strip()
    assert hint == "torchestimator train model.py --model_dir runs/x"
    with caplog.at_level(logging.INFO, logger="torchestimator"):
        assert main(shlex.split(hint)[1:]) == 0
    # A weights-only checkpoint is not "the optimizer changed": one INFO line says the optimizer starts fresh.
    assert any(
        "holds no optimizer state" in record.getMessage() and record.levelno == logging.INFO
        for record in caplog.records
    )
    assert not [record for record in caplog.records if "optimizer changed" in record.getMessage()]
    python_run = te.Estimator(
        model_fn=module_file.model_fn,
        model=module_file.model,
        optimizer=module_file.optimizer,
        config=module_file.config.replace(model_dir="runs/python"),
        warm_start_from=WarmStartSettings(
            KERAS3_WEIGHTS, [".*"], accept_proposed_mapping=True, converters={"4.weight": "flatten_dense:4,6,6"}
        ),
    )
    python_run.train(module_file.train_input_fn, max_steps=3)
    trained = CheckpointStore("runs/x").restore()
    assert trained.step == 3
    assert_same_tensors(trained.model_state, CheckpointStore("runs/python").restore().model_state)
    assert not torch.equal(trained.model_state["4.weight"], expected["4.weight"])  # it did train


def test_write_safetensors_holds_the_warm_started_state_dict(model_file, capsys):
    assert warm_start_cli(model_file, "--write", "weights/warm.safetensors", *SOUND) == 0
    assert "Wrote weights/warm.safetensors: the module's state_dict (8 tensors warm-started)" in capsys.readouterr().out
    assert_same_tensors(load_file("weights/warm.safetensors"), expected_state())
    assert sorted(os.listdir("weights")) == ["warm.safetensors"]  # no temporary left beside it


def test_json_names_what_was_written(model_file, capsys):
    import json

    assert warm_start_cli(model_file, "--write", "runs/j", "--json", *SOUND) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["ok"] and plan["written"].endswith(os.path.join("runs", "j", "ckpt-0")) and len(plan["load"]) == 8


def test_write_refuses_outputs_it_must_not_touch(model_file, capsys):
    assert warm_start_cli(model_file, "--write", "runs/x", *SOUND) == 0
    before = {name: os.path.getmtime(os.path.join("runs/x/ckpt-0", name)) for name in os.listdir("runs/x/ckpt-0")}
    capsys.readouterr()
    open("taken.safetensors", "wb").close()
    open("weights.pt", "wb").close()
    refusals = [
        ("runs/x", "this model_dir already has checkpoints (ckpt-0); warm start only applies to a fresh model_dir"),
        ("taken.safetensors", "the file exists; warm start never overwrites weights"),
        ("out.pt", "not a .pt file"),
        ("weights.pt", "not a .pt file"),
    ]
    for out, message in refusals:
        assert warm_start_cli(model_file, "--write", out, *SOUND) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured.err
        assert captured.err.startswith(f"torchestimator warm-start: error: --write {out}: ") and message in captured.err
    assert before == {name: os.path.getmtime(os.path.join("runs/x/ckpt-0", name)) for name in before}
    assert os.path.getsize("taken.safetensors") == 0 and not os.path.exists("out.pt")


def test_a_model_dir_without_checkpoints_takes_the_write(model_file, capsys):
    os.makedirs("runs/stopped")
    with open("runs/stopped/params.json", "w") as handle:  # a run that stopped before its first checkpoint
        handle.write("{}")
    assert warm_start_cli(model_file, "--write", "runs/stopped", *SOUND) == 0
    assert_same_tensors(CheckpointStore("runs/stopped").restore().model_state, expected_state())


def test_nothing_is_written_when_the_plan_fails_or_the_write_does(model_file, capsys, monkeypatch):
    assert warm_start_cli(model_file, "--write", "runs/bad/x", "--accept_proposed") == 1  # 4.weight unconfirmed
    assert not os.path.exists("runs")

    def failing_save(self, *args, **kwargs):
        raise OSError(5, "Input/output error", os.path.join(self.model_dir, "ckpt-0"))

    monkeypatch.setattr(CheckpointStore, "save", failing_save)
    assert warm_start_cli(model_file, "--write", "runs/new/x", *SOUND) == 2
    assert "Input/output error" in capsys.readouterr().err
    assert not os.path.exists("runs")  # the folders this write created are gone again


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--converter", "4.weight=flaten_dense:4,6,6"],
            "--converter 4.weight=flaten_dense:4,6,6: Unknown layout converter 'flaten_dense:4,6,6'; known converters: "
            "identity, dense (dense_to_linear), conv (conv_to_torch), depthwise (depthwise_conv_to_torch), "
            "conv_transpose (conv_transpose_to_torch), embedding, flatten_dense:C,H,W.",
        ),
        (["--converter", "4.weight=flatten_dense:4,6"], "converter 'flatten_dense' takes 3 positive ints"),
        (["--converter", "flatten_dense"], "--converter expects TARGET=NAME[:ARGS]"),
        (
            ["--map", "4.weight"],
            "--map expects TARGET=SOURCE (the module's tensor name = the source's); received '4.weight'.",
        ),
        (["--map", "4.weight=fc/kernel", "--map", "4.weight=conv/kernel"], "--map gives 4.weight twice"),
    ],
)
def test_bad_flags_are_one_line_errors_naming_the_flag(model_file, capsys, flags, message):
    assert warm_start_cli(model_file, "--write", "runs/x", *flags) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and message in captured.err, captured.err
    assert not os.path.exists("runs")


def test_plan_errors_from_cli_flags_name_the_flags(model_file, capsys):
    assert warm_start_cli(model_file, "--map", "0.wieght=conv/kernel", "--converter", "9.weight=dense") == 1
    out = capsys.readouterr().out
    assert "--map keys ['0.wieght'] were not used" in out and "--converter keys ['9.weight'] were not used" in out
    assert warm_start_cli(model_file, "--vars", "zz") == 1
    assert "--vars zz selects none of the module's 6 trainable parameters" in capsys.readouterr().out


def test_old_and_dashed_spellings_still_work(model_file, capsys):
    assert (
        warm_start_cli(
            model_file,
            "--dry-run",
            "--vars",
            ".*",
            "--include_buffers",
            "--accept_proposed_mapping",
            "--converter",
            "4.weight=flatten_dense:4,6,6",
        )
        == 0
    )
    assert warm_start_cli(model_file, "--dry_run", "--rename", "4.bias=fc/bias", *SOUND) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  4.bias  ")]
    assert rows[-1] == ["4.bias", "<-", "fc/bias", "identity", "[5]", "renamed"]


def test_every_flag_has_help_and_the_converter_names_are_listed():
    warm = build_parser()._subparsers._group_actions[0].choices["warm-start"]
    for action in warm._actions:
        assert action.help, action.option_strings
    converter_help = next(action.help for action in warm._actions if "--converter" in action.option_strings)
    assert all(spec in converter_help for spec in CONVERTER_SPECS)
    assert converter_from_spec("dense") is converter_from_spec("dense_to_linear")
    assert converter_from_spec(" flatten_dense:4,6,6 ").output_shape((144, 5)) == (5, 144)


KERAS_MAPS = [
    "--map",
    "0.weight=conv/kernel",
    "--map",
    "0.bias=conv/bias",
    "--map",
    "1.weight=bn/gamma",
    "--map",
    "1.bias=bn/beta",
    "--map",
    "1.running_mean=bn/moving_mean",
    "--map",
    "1.running_var=bn/moving_variance",
    "--map",
    "4.weight=fc/kernel",
    "--map",
    "4.bias=fc/bias",
]


def test_map_of_the_dense_after_flatten_is_refused_until_its_converter_is_named(model_file, capsys):
    """--map names the tensor, not its row order (it wrote NHWC rows into the NCHW Linear, exit 0)."""
    assert warm_start_cli(model_file, "--vars", ".*", "--include_buffers", *KERAS_MAPS, "--write", "mapped") == 1
    captured = capsys.readouterr()
    errors = captured.out.split("ERRORS (nothing will be loaded):\n")[1].strip().splitlines()
    assert len(errors) == 1 and errors[0].strip().startswith("4.weight <- fc/kernel: this Linear follows a Flatten")
    assert (
        "confirm with --converter 4.weight=flatten_dense:4,H,W where H*W = 36 (4,6,6 if the feature map is "
        "square), or --converter 4.weight=dense_to_linear"
    ) in errors[0]
    assert "converters=" not in captured.out and "nothing was written" in captured.err
    assert not os.path.exists("mapped")
    assert (
        warm_start_cli(
            model_file,
            "--vars",
            ".*",
            "--include_buffers",
            *KERAS_MAPS,
            "--write",
            "mapped",
            "--converter",
            "4.weight=flatten_dense:4,6,6",
        )
        == 0
    )
    assert_same_tensors(CheckpointStore("mapped").restore().model_state, expected_state())


def test_write_names_what_is_in_the_way_and_takes_the_suffix_in_any_case(model_file, capsys):
    """afile/sub.safetensors said '[Errno 17] File exists', dir.safetensors 'the file exists', and
    OUT.SAFETENSORS became a model_dir."""
    open("afile", "w").close()
    os.mkdir("dir.safetensors")
    refusals = [
        ("afile/sub.safetensors", "afile is a file, so nothing can be written inside it."),
        ("afile/x/model_dir", "afile is a file, so nothing can be written inside it."),
        ("dir.safetensors", "it is a folder, and a name ending in .safetensors names the weights file to write."),
    ]
    for out, message in refusals:
        assert warm_start_cli(model_file, "--write", out, *SOUND) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured.err
        assert captured.err.startswith(f"torchestimator warm-start: error: --write {out}: {message}"), captured.err
    assert os.listdir("dir.safetensors") == [] and os.path.getsize("afile") == 0
    assert warm_start_cli(model_file, "--write", "OUT.SAFETENSORS", *SOUND) == 0
    assert "Wrote OUT.SAFETENSORS: the module's state_dict" in capsys.readouterr().out
    assert os.path.isfile("OUT.SAFETENSORS")
    assert_same_tensors(load_file("OUT.SAFETENSORS"), expected_state())


def test_a_bad_vars_regex_names_the_flag(model_file, capsys):
    assert warm_start_cli(model_file, "--vars", "[") == 2
    assert capsys.readouterr().err == (
        "torchestimator warm-start: error: --vars '[' is not a valid regex: unterminated character set at position 0.\n"
    )
