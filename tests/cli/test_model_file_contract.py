"""The model file's contract: every name the commands read is in one table (cli/model_file.py), shown in --help and
in docs/cli.md, and a top-level name that looks like a misspelling of one of them is warned about when the file loads."""

from __future__ import annotations

import ast
import logging
import pathlib
import textwrap

import pytest
from helpers import CLI_MODEL_FILE

from torchestimator.cli import build_parser, main, model_file
from torchestimator.cli.model_file import MODEL_FILE_NAMES, contract_help, contract_markdown, load_model_file

CLI = pathlib.Path(model_file.__file__).parent
CLI_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "cli.md"  # the docs page holding the table
NAMES = {row.name for row in MODEL_FILE_NAMES}


def _names_the_commands_read() -> dict[str, set[str]]:
    """name -> the cli modules reading it: getattr/hasattr/require(module or module_file, "name", ...)."""
    read: dict[str, set[str]] = {}
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "require")
                and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("module", "module_file")
                and isinstance(node.args[1], ast.Constant)
                and not node.args[1].value.startswith("__")
            ):
                read.setdefault(node.args[1].value, set()).add(path.name)
    return read


def test_the_table_lists_every_name_the_commands_read_and_no_other():
    read = _names_the_commands_read()
    assert {"train_spec", "eval_specs", "best", "early_stopping", "serving_input_receiver"} <= set(read)
    assert set(read) - NAMES == set(), "add the name to cli/model_file.py's MODEL_FILE_NAMES"
    assert NAMES - set(read) == set(), "a name in MODEL_FILE_NAMES that no command reads"


def test_each_row_says_whether_it_is_a_function_or_an_object():
    for row in MODEL_FILE_NAMES:
        assert row.kind in ("function", "object", "object or function"), row
        assert row.read_by and row.what, row


def test_the_docs_page_holds_the_table():
    assert contract_markdown() in CLI_PAGE.read_text(encoding="utf-8"), (
        "docs/cli.md's model-file table differs from cli/model_file.py; paste the output of\n"
        "  .venv/bin/python -c 'from torchestimator.cli import model_file; print(model_file.contract_markdown())'"
    )


def test_help_ends_with_the_names_a_command_reads(capsys):
    with pytest.raises(SystemExit):
        main(["train-and-evaluate", "--help"])
    shown = capsys.readouterr().out
    assert contract_help("train-and-evaluate") in shown  # as written, not rewrapped
    for name in ("train_spec", "eval_spec", "eval_specs", "best", "early_stopping", "train_input_fn", "model_fn"):
        assert f"\n  {name} " in shown
    assert "predict_input_fn" not in shown and "serving_input_receiver" not in shown


def test_the_top_level_help_lists_every_name_with_the_commands_reading_it():
    shown = build_parser().format_help()
    assert contract_help() in shown
    assert "early_stopping" in contract_help() and "[train-and-evaluate]" in contract_help()


def test_every_command_reading_a_model_file_shows_its_names():
    commands = {command for row in MODEL_FILE_NAMES for command in row.read_by}
    parser = build_parser()
    subparsers = next(action for action in parser._actions if hasattr(action, "choices") and action.choices)
    for command in commands:
        assert contract_help(command) in subparsers.choices[command].format_help(), command


# -- names that look misspelt ---------------------------------------------------------------------

HELPERS = """
    import os, json
    import numpy as np
    import torch
    from torch import nn
    from torch.optim import Optimizer
    import torchestimator as te
    from torchestimator import EarlyStopping

    DATA_DIR = "data"
    batch_size = 16
    eval_steps = 10
    learning_rate = 0.1
    feature_spec = {}
    train_data = eval_data = None
    mode = "train"

    class Net(nn.Module):
        pass

    def build_model(params):
        return Net()

    def input_fn(mode, params):
        return []

    def make_input_fn(data):
        return lambda: data

    def parse(record):
        return record

    def test():
        pass
"""


def _load(tmp_path, source, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return load_model_file(str(path))


def _warnings(caplog):
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def test_a_complete_model_file_with_ordinary_helpers_loads_without_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        _load(tmp_path, CLI_MODEL_FILE + textwrap.dedent(HELPERS))
        load_model_file("torchestimator.cli.demo")
    assert _warnings(caplog) == []


def test_a_file_of_helpers_only_loads_without_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        _load(tmp_path, HELPERS)
    assert _warnings(caplog) == []


@pytest.mark.parametrize(
    ("misspelt", "meant"),
    [
        ("modelfn", "model_fn"),
        ("eval_spec_s", "eval_specs"),
        ("input_fn_train", "train_input_fn"),
        ("optimiser", "optimizer"),
        ("hparams", "params"),
        ("max_step", "max_steps"),
        ("lr_schedule", "lr_scheduler"),
        ("serving_input_receiver_fn", "serving_input_receiver"),
        ("earlystopping", "early_stopping"),
    ],
)
def test_a_name_that_looks_misspelt_is_warned_about_in_one_line_naming_the_file(tmp_path, caplog, misspelt, meant):
    with caplog.at_level(logging.INFO):
        _load(tmp_path, f"{misspelt} = lambda *args: None\n", name="mine.py")
    [warning] = _warnings(caplog)
    assert "\n" not in warning
    assert warning.startswith(f"{tmp_path / 'mine.py'} defines {misspelt!r}, which looks like {meant!r}")


def test_no_warning_when_the_name_it_looks_like_is_defined_too(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        _load(tmp_path, "def model_fn(): pass\ndef modelfn(): pass\nparams = {}\nhparams = {}\n")
    assert _warnings(caplog) == []


def test_a_name_imported_from_elsewhere_is_not_the_files_own_misspelling(tmp_path, caplog):
    (tmp_path / "shared.py").write_text("def optimiser(parameters): pass\n")
    with caplog.at_level(logging.INFO):
        _load(tmp_path, "from shared import optimiser\n")
    assert _warnings(caplog) == []
