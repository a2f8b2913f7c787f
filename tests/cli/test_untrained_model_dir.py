"""A wrong --model_dir fails on the command line (issue 29.2), and a launched group prints once (issue 29.11).

`torchestimator evaluate model.py --model_dir runs/typo` reported the metrics of random weights at global step 0,
created runs/typo/eval/ with an events file and exited 0. evaluate and predict now refuse a model_dir with no
checkpoint (missing or empty) in one line naming it and what to do, exit 2 and create nothing, unless
--allow_untrained; Estimator.evaluate keeps tf.estimator's rule (fresh weights, with a warning).

Under `torchestimator launch` every rank ran the command and printed its results: only rank 0 prints now, as
only replica 0's output shows in a plain-script run, and predict and export write on rank 0 only (export wrote
one version per rank). The ranks are set here by torchrun's variables.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers import CLI_MODEL_FILE, one_line_error

from torchestimator.cli import build_parser, main


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(CLI_MODEL_FILE)
    return str(path)


@pytest.fixture
def trained(tmp_path, model_file, capsys):
    model_dir = str(tmp_path / "runs" / "demo")
    assert main(["train", model_file, "--model_dir", model_dir]) == 0
    capsys.readouterr()
    return model_dir


def _tree(root) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(folder, name), root) for folder, _, names in os.walk(root) for name in names
    )


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_missing_model_dir_is_one_line_exit_2_and_nothing_is_created(tmp_path, model_file, trained, capsys, command):
    typo = os.path.join(os.path.dirname(trained), "dem0")
    before = _tree(tmp_path)
    output = tmp_path / "rows.jsonl"
    extra = ["--output", str(output)] if command == "predict" else []
    assert main([command, model_file, "--model_dir", typo, *extra]) == 2
    error = one_line_error(capsys)
    assert f"--model_dir {typo} does not exist" in error
    assert f"did you mean {trained}?" in error  # the folder beside it with a close name
    assert "Check the path, train first" in error and "--allow_untrained" in error
    assert not os.path.exists(typo) and not output.exists()
    assert _tree(tmp_path) == before  # no folder, no eval/, no events file


def test_an_empty_model_dir_is_refused_and_left_empty(tmp_path, model_file, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["evaluate", model_file, "--model_dir", str(empty), "--name", "check"]) == 2
    error = one_line_error(capsys)
    assert f"--model_dir {empty} holds no checkpoint" in error and "--allow_untrained" in error
    assert os.listdir(empty) == []  # no eval_check/


def test_allow_untrained_evaluates_fresh_weights_as_the_library_does(tmp_path, model_file, capsys):
    fresh = str(tmp_path / "fresh")
    assert main(["evaluate", model_file, "--model_dir", fresh, "--allow_untrained"]) == 0
    assert json.loads(capsys.readouterr().out)["global_step"] == 0
    assert os.path.isdir(os.path.join(fresh, "eval"))


def test_a_trained_model_dir_or_a_given_checkpoint_needs_no_flag(tmp_path, model_file, trained, capsys):
    assert main(["evaluate", model_file, "--model_dir", trained]) == 0
    assert json.loads(capsys.readouterr().out)["global_step"] == 10
    elsewhere = str(tmp_path / "elsewhere")  # the checkpoint is named: the model_dir only receives eval/
    checkpoint = os.path.join(trained, "ckpt-10")
    assert main(["evaluate", model_file, "--model_dir", elsewhere, "--checkpoint_path", checkpoint]) == 0
    assert json.loads(capsys.readouterr().out)["global_step"] == 10


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_help_names_allow_untrained(command):
    assert "--allow_untrained" in build_parser()._subparsers._group_actions[0].choices[command].format_help()


def _launched_rank(monkeypatch, rank: int) -> None:
    for name, value in {
        "RANK": rank,
        "WORLD_SIZE": 2,
        "LOCAL_RANK": rank,
        "LOCAL_WORLD_SIZE": 2,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": 29500,
    }.items():
        monkeypatch.setenv(name, str(value))


def test_under_launch_only_rank_0_prints_results(tmp_path, model_file, trained, capsys, monkeypatch):
    output = tmp_path / "rows.jsonl"
    _launched_rank(monkeypatch, 1)
    assert main(["evaluate", model_file, "--model_dir", trained]) == 0
    assert capsys.readouterr().out == ""
    assert main(["predict", model_file, "--model_dir", trained, "--output", str(output)]) == 0
    assert not output.exists()  # one writer of the predictions file, not one per rank
    _launched_rank(monkeypatch, 0)
    assert main(["evaluate", model_file, "--model_dir", trained]) == 0
    assert json.loads(capsys.readouterr().out)["global_step"] == 10
    assert main(["predict", model_file, "--model_dir", trained, "--output", str(output)]) == 0
    assert len(output.read_text().splitlines()) == 5


def test_under_launch_only_rank_0_exports(tmp_path, model_file, trained, capsys, monkeypatch):
    export_dir = tmp_path / "export"
    flags = [model_file, "--model_dir", trained, "--export_dir", str(export_dir)]
    _launched_rank(monkeypatch, 1)
    assert main(["export", *flags]) == 0
    assert capsys.readouterr().out == "" and not export_dir.exists()
    _launched_rank(monkeypatch, 0)
    assert main(["export", *flags]) == 0
    assert capsys.readouterr().out.startswith(f"exported {export_dir}") and len(os.listdir(export_dir)) == 1
