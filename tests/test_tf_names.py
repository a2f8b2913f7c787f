"""TF's spellings: each row of the one table (torchestimator/_tf_names.py) does what it says, and the docs show it.

An alias gives what our own name gives; a refusal says "TF's X is torchestimator's Y: what differs"; a member of
te.estimator is the object torchestimator documents elsewhere. TF's signatures (below, from tf.estimator 2.15)
check that every argument TF has is ours, an alias or a refusal: none is left to a bare TypeError.
"""

from __future__ import annotations

import inspect
import logging
import pathlib
import re
import subprocess
import sys
import tempfile
from unittest import mock

import pytest
import torch
from helpers import trained_classifier

import torchestimator as te
from torchestimator import _tf_names
from torchestimator._tf_names import ARGUMENT, ATTRIBUTE, MEMBER, TF_NAMES, markdown_table
from torchestimator.errors import ConfigTypeError
from torchestimator.export import TensorSpec, serving_input_receiver
from torchestimator.export.receiver import as_receiver, build_parsing_serving_input_receiver

NAMES_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "tf-names.md"  # the docs page holding the table
RECEIVER = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})


def _input_fn():
    return []


class _ExportCall:
    """Stands in for the export Estimator.export_saved_model runs: what it was handed (the receiver resolved as
    the export resolves it), so an alias's call compares with our own name's without tracing a model."""

    def __init__(self, estimator, export_dir_base, serving_input_receiver, **options):
        self._receiver = as_receiver(serving_input_receiver)
        self.export_dir_base = export_dir_base
        self.options = options


NEVER_WRITTEN = pathlib.Path(tempfile.gettempdir()) / "test_tf_names-never-written"
"""The model_dir of the Estimator whose export_saved_model is called with the export stood in for."""


def _export_call(**keywords):
    estimator = te.Estimator(lambda model, features: None, model=torch.nn.Linear(8, 3), model_dir=str(NEVER_WRITTEN))
    with mock.patch("torchestimator.export.export_saved_model", _ExportCall):
        return estimator.export_saved_model(str(NEVER_WRITTEN / "export"), **keywords)


# Builds an instance of each owner from keyword arguments (the owner's required ones filled in), and what two
# instances compare by; a method owner ("Estimator.export_saved_model") is called instead.
BUILD = {
    "RunConfig": lambda **kw: te.RunConfig(**kw),
    "TrainSpec": lambda **kw: te.TrainSpec(_input_fn, **kw),
    "EvalSpec": lambda **kw: te.EvalSpec(_input_fn, **kw),
    "LatestExporter": lambda **kw: te.export.LatestExporter("latest", **kw),
    "FinalExporter": lambda **kw: te.export.FinalExporter("final", **kw),
    "BestExporter": lambda **kw: te.export.BestExporter(**kw),
    "ServingInputReceiver": lambda **kw: te.export.ServingInputReceiver(**kw),
    "Estimator.export_saved_model": _export_call,
}
NEEDED = {  # what our own spelling needs besides the argument under test
    "LatestExporter": {"serving_input_receiver": RECEIVER},
    "FinalExporter": {"serving_input_receiver": RECEIVER},
    "BestExporter": {"serving_input_receiver": RECEIVER},
    "ServingInputReceiver": {"receiver_tensors": RECEIVER.receiver_tensors},
    "Estimator.export_saved_model": {"serving_input_receiver": RECEIVER},
}
BUILD_CLASSES = {  # whose signature holds our own arguments
    "RunConfig": te.RunConfig,
    "TrainSpec": te.TrainSpec,
    "EvalSpec": te.EvalSpec,
    "LatestExporter": te.export.LatestExporter,
    "FinalExporter": te.export.FinalExporter,
    "BestExporter": te.export.BestExporter,
    "ServingInputReceiver": te.export.ServingInputReceiver,
    "Estimator.export_saved_model": te.Estimator.export_saved_model,
}
VALUES = {"tf_random_seed": 42, "serving_input_receiver_fn": lambda: RECEIVER}

# tf.estimator 2.15's arguments (tensorflow/estimator: run_config.py, training.py, exporter.py, export_lib,
# estimator.py).
TF_SIGNATURES = {
    "RunConfig": "model_dir tf_random_seed save_summary_steps save_checkpoints_steps save_checkpoints_secs "
    "session_config keep_checkpoint_max keep_checkpoint_every_n_hours log_step_count_steps train_distribute "
    "device_fn protocol eval_distribute experimental_distribute experimental_max_worker_delay_secs "
    "session_creation_timeout_secs checkpoint_save_graph_def",
    "TrainSpec": "input_fn max_steps hooks saving_listeners",
    "EvalSpec": "input_fn steps name hooks exporters start_delay_secs throttle_secs",
    "LatestExporter": "name serving_input_receiver_fn assets_extra as_text exports_to_keep",
    "FinalExporter": "name serving_input_receiver_fn assets_extra as_text",
    "BestExporter": "name serving_input_receiver_fn event_file_pattern compare_fn assets_extra as_text exports_to_keep",
    "ServingInputReceiver": "features receiver_tensors receiver_tensors_alternatives",
    "Estimator.export_saved_model": "export_dir_base serving_input_receiver_fn assets_extra as_text checkpoint_path "
    "experimental_mode",
}


def _rows(kind, refused=None):
    return [row for row in TF_NAMES if row.kind == kind and (refused is None or bool(row.differs) == refused)]


def _row_id(row):
    return f"{'/'.join(row.owners)}.{row.tf_key}"


def _arguments(kind_rows):
    return [(owner, row) for row in kind_rows for owner in row.owners]


def test_the_docs_page_holds_the_table_in_code():
    assert markdown_table() in NAMES_PAGE.read_text(encoding="utf-8"), (
        "docs/tf-names.md's table differs from torchestimator/_tf_names.py; paste the output of\n"
        "  .venv/bin/python -c 'from torchestimator._tf_names import markdown_table; print(markdown_table())'"
    )


def test_each_row_renders_as_one_table_line_of_three_cells():
    for row in TF_NAMES:
        line = row.markdown()
        assert "\n" not in line and line.count(" | ") == 2, line


@pytest.mark.parametrize(("owner", "row"), _arguments(_rows(ARGUMENT, refused=False)), ids=lambda x: str(x))
def test_an_argument_alias_builds_what_our_name_builds(owner, row, caplog):
    value = VALUES[row.tf_key]
    needed = {key: item for key, item in NEEDED.get(owner, {}).items() if key != row.our_key}
    with caplog.at_level(logging.DEBUG, logger="torchestimator"):
        theirs = BUILD[owner](**needed, **{row.tf_key: value})
    ours = BUILD[owner](**needed, **{row.our_key: value})
    assert type(theirs) is type(ours)
    assert (theirs == ours) if owner == "RunConfig" else (vars(theirs).keys() == vars(ours).keys())
    if owner == "Estimator.export_saved_model":
        assert vars(theirs) == vars(ours)  # the same export call
    if owner != "RunConfig":  # an exporter or the export: the receiver the function returns, as our name takes it
        assert theirs._receiver is ours._receiver is RECEIVER
    aliases = [record for record in caplog.records if row.tf_key in record.getMessage()]
    assert len(aliases) == 1 and aliases[0].levelno == logging.DEBUG


@pytest.mark.parametrize(("owner", "row"), _arguments(_rows(ARGUMENT, refused=False)), ids=lambda x: str(x))
def test_an_alias_given_with_our_name_too_is_refused(owner, row):
    value = VALUES[row.tf_key]
    with pytest.raises(ConfigTypeError, match=f"got both {row.tf_key}= .* and {row.our_key}="):
        BUILD[owner](**{row.tf_key: value, row.our_key: value})


@pytest.mark.parametrize(("owner", "row"), _arguments(_rows(ARGUMENT, refused=True)), ids=lambda x: str(x))
def test_a_refused_argument_says_what_it_is_here_and_what_differs(owner, row):
    with pytest.raises(ConfigTypeError) as refused:
        BUILD[owner](**NEEDED.get(owner, {}), **{row.tf_key: object()})
    message = str(refused.value)
    assert message == row.refusal()
    assert message.startswith("TF's tf.estimator.") and f"{row.tf_key}=) is torchestimator's " in message
    assert isinstance(refused.value, TypeError) and refused.value.field == row.tf_key


@pytest.mark.parametrize("owner", sorted(TF_SIGNATURES))
def test_every_argument_tf_has_is_ours_an_alias_or_a_refusal(owner):
    ours = set(inspect.signature(BUILD_CLASSES[owner]).parameters)
    table = set(_tf_names.argument_rows(owner))
    left = [name for name in TF_SIGNATURES[owner].split() if name not in ours | table]
    assert left == [], f"{owner}: TF's {left} would be a bare TypeError; add them to _tf_names.TF_NAMES"
    assert not table & ours, "a TF name that is also ours needs no row"


def test_run_config_replace_takes_tf_names_too():
    assert te.RunConfig().replace(tf_random_seed=7).random_seed == 7
    with pytest.raises(ConfigTypeError, match="TF's tf.estimator.RunConfig\\(session_config=\\) is torchestimator's"):
        te.RunConfig().replace(session_config=None)


def test_our_signature_still_shows_our_names():
    assert "random_seed" in inspect.signature(te.RunConfig).parameters
    assert "tf_random_seed" not in inspect.signature(te.RunConfig).parameters
    export = inspect.signature(te.Estimator.export_saved_model).parameters
    assert list(export)[:3] == ["self", "export_dir_base", "serving_input_receiver"]
    assert "serving_input_receiver_fn" not in export and "as_text" not in export


def test_the_export_call_stood_in_for_writes_nothing():
    _export_call(serving_input_receiver_fn=lambda: RECEIVER)
    assert not NEVER_WRITTEN.exists()


@pytest.mark.parametrize("row", _rows(ATTRIBUTE), ids=_row_id)
def test_an_attribute_alias_is_our_attribute(row):
    owner = getattr(te, row.owners[0])
    assert getattr(owner, row.tf_key) == getattr(owner, row.our_key)


def test_mode_keys_infer_is_predict_and_all_stays_the_three_modes():
    assert te.ModeKeys.INFER == te.ModeKeys.PREDICT == "infer"
    assert te.ModeKeys.ALL == ("train", "eval", "infer")


@pytest.mark.parametrize("row", _rows(MEMBER, refused=False), ids=_row_id)
def test_a_member_of_te_estimator_is_the_object_documented_elsewhere(row):
    namespace = eval(row.owners[0].replace("tf.", "te.", 1), {"te": te})  # tf.estimator.export -> te.estimator.export
    assert getattr(namespace, row.tf_key) is eval(f"te.{row.our_key}", {"te": te})
    assert row.tf_key in namespace.__all__


@pytest.mark.parametrize("row", _rows(MEMBER, refused=True), ids=_row_id)
def test_a_member_tf_has_that_means_something_else_here_is_an_attribute_error_saying_so(row):
    namespace = eval(row.owners[0].replace("tf.", "te.", 1), {"te": te})
    with pytest.raises(AttributeError) as refused:
        getattr(namespace, row.tf_key)
    assert str(refused.value) == row.refusal()
    assert str(refused.value).startswith(f"TF's {row.owners[0]}.{row.tf_key} is torchestimator's ")
    assert row.tf_key not in namespace.__all__


def test_te_estimator_lists_every_member_row_and_only_those():
    """The namespace declares its names in its TYPE_CHECKING block; the table documents each of them."""
    for namespace in ("tf.estimator", "tf.estimator.export", "tf.estimator.experimental"):
        module = eval(namespace.replace("tf.", "te.", 1), {"te": te})
        rows = {row.tf_key for row in _rows(MEMBER, refused=False) if row.owners == (namespace,)}
        submodules = {"export", "experimental"} if namespace == "tf.estimator" else set()
        assert set(module.__all__) == rows | submodules, namespace


def test_a_name_neither_tf_nor_ours_has_stays_a_plain_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'Estimatr'"):
        te.estimator.Estimatr  # noqa: B018


def test_te_estimator_imports_nothing_until_a_name_is_read():
    code = (
        "import sys, torchestimator as te; te.estimator; te.estimator.export; "
        "print('torchestimator._core.estimator' in sys.modules, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]


# -- TF's receiver_fn builders ----------------------------------------------------------------------


def test_build_parsing_serving_input_receiver_fn_returns_the_function_tf_returns():
    spec = {"x": te.data.FixedLenFeature([8], torch.float32)}
    receiver_fn = te.estimator.export.build_parsing_serving_input_receiver_fn(spec)
    assert callable(receiver_fn)
    receiver, ours = receiver_fn(), build_parsing_serving_input_receiver(spec)
    assert receiver.describe() == ours.describe()
    assert receiver.program_specs() == ours.program_specs() == {"x": TensorSpec(shape=(None, 8), dtype=torch.float32)}
    with pytest.raises(ValueError, match="default_batch_size=8"):
        te.estimator.export.build_parsing_serving_input_receiver_fn(spec, default_batch_size=8)


def test_build_raw_serving_input_receiver_fn_takes_example_tensors_as_tf_takes_placeholders_shapes():
    features = {"x": torch.zeros(4, 8), "ids": torch.zeros(4, 3, dtype=torch.int64)}
    receiver = te.estimator.export.build_raw_serving_input_receiver_fn(features)()
    assert receiver == serving_input_receiver(
        {"x": TensorSpec(shape=(None, 8), dtype=torch.float32), "ids": TensorSpec(shape=(None, 3), dtype=torch.int64)}
    )
    fixed = te.estimator.export.build_raw_serving_input_receiver_fn(features, default_batch_size=2)()
    assert fixed.receiver_tensors["x"].shape == (2, 8)
    assert te.estimator.export.build_raw_serving_input_receiver_fn({"x": TensorSpec(shape=(None, 8))})() == RECEIVER
    with pytest.raises(TypeError, match=re.escape("features['x'] must be a tensor with a batch dimension")):
        te.estimator.export.build_raw_serving_input_receiver_fn({"x": 1.0})


def test_pasted_tf_code_trains_and_exports_with_tf_spellings(tmp_path):
    """tf.estimator's spellings end to end: RunConfig(tf_random_seed=), ModeKeys.INFER, an exporter given
    serving_input_receiver_fn= from build_raw_serving_input_receiver_fn, and its export loads."""
    estimator, x = trained_classifier(tmp_path / "model")
    receiver_fn = te.estimator.export.build_raw_serving_input_receiver_fn({"x": torch.as_tensor(x[:2])})
    exporter = te.estimator.FinalExporter("final", serving_input_receiver_fn=receiver_fn)
    path = exporter.export(estimator, str(tmp_path / "export"), estimator.latest_checkpoint(), {}, True)
    outputs = te.export.load(path)({"x": x[:3]})
    assert outputs["probabilities"].shape == (3, 3)
    exported = estimator.export_saved_model(str(tmp_path / "saved"), serving_input_receiver_fn=receiver_fn)
    assert (te.export.load(exported)({"x": x[:3]})["probabilities"] == outputs["probabilities"]).all()
    assert te.estimator.ModeKeys.INFER == te.ModeKeys.PREDICT
