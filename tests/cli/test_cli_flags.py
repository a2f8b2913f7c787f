"""The parser's rules for every subcommand: TF's underscore spelling first with the dashed one as an alias, a
help text for every flag, --verbosity before or after the subcommand, inspect's help naming what it reads."""

from __future__ import annotations

import argparse
import logging

import pytest

from torchestimator import cli
from torchestimator.cli import build_parser, main


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    """prog -> parser for the top level and every subcommand below it, torchrun's `launch` aside."""
    found = {}

    def visit(parser: argparse.ArgumentParser) -> None:
        found[parser.prog] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, subparser in action.choices.items():
                    if name != "launch":  # torchrun's own parser: both spellings already, its own help
                        visit(subparser)

    visit(build_parser())
    return found


def test_the_walk_reaches_every_command():
    progs = set(all_parsers())
    for command in (
        "train",
        "train-and-evaluate",
        "evaluate",
        "predict",
        "export",
        "inspect",
        "warm-start",
        "serve",
        "plot",
        "demo",
        "convert csv-to-tfrecord",
        "records inspect",
        "records verify",
    ):
        assert f"torchestimator {command}" in progs


def test_every_flag_and_argument_of_every_command_has_help():
    missing = [
        f"{prog} {'/'.join(action.option_strings) or action.dest}"
        for prog, parser in all_parsers().items()
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()
    ]
    assert missing == [], "flags without a help text: " + ", ".join(missing)


def test_underscore_spelling_comes_first_and_the_dashed_one_is_an_alias_of_the_same_flag():
    checked = 0
    for prog, parser in all_parsers().items():
        for action in parser._actions:
            long_options = [option for option in action.option_strings if option.startswith("--")]
            for option in long_options:
                underscore, dashed = "--" + option[2:].replace("-", "_"), "--" + option[2:].replace("_", "-")
                assert parser._option_string_actions.get(underscore) is action, (prog, option)
                assert parser._option_string_actions.get(dashed) is action, (prog, option)
            spelled = [option for option in long_options if "_" in option or "-" in option[2:]]
            if spelled:
                checked += 1
                assert "-" not in long_options[0][2:], (
                    f"{prog}: {long_options[0]} is shown first; the TF "
                    f"spelling {long_options[0].replace('-', '_')} should be"
                )
    assert checked > 40  # every command has such flags: the rule reached them


@pytest.mark.parametrize(
    "argv",
    [
        ["records", "verify", "--max-record-size", "5", "f.tfrecord"],
        ["records", "verify", "--max_record_size", "5", "f.tfrecord"],
        ["records", "verify", "--max_rec", "5", "f.tfrecord"],  # a prefix of both spellings is still that one flag
    ],
)
def test_either_spelling_and_a_shared_prefix_parse_the_same(argv):
    assert build_parser().parse_args(argv).max_record_size == 5


def test_dashed_aliases_parse_for_the_model_commands_and_the_demo():
    args = build_parser().parse_args(["train", "m.py", "--model-dir", "x", "--max-steps", "3", "--no-progress"])
    assert (args.model_dir, args.max_steps, args.no_progress) == ("x", 3, True)
    args = build_parser().parse_args(["demo", "--no-progress", "--rest-api-port", "9000"])
    assert (args.no_progress, args.rest_api_port) == (True, 9000)
    args = build_parser().parse_args(["convert", "csv-to-tfrecord", "i.csv", "o", "--num_shards", "2"])
    assert args.num_shards == 2


def test_help_shows_the_underscore_spelling_first(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "csv-to-tfrecord", "--help"])
    text = capsys.readouterr().out
    assert "--num_shards NUM_SHARDS, --num-shards NUM_SHARDS" in text and "[--num_shards NUM_SHARDS]" in text


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["train", "m.py", "--model_dir", "x"], "INFO"),
        (["--verbosity", "DEBUG", "train", "m.py", "--model_dir", "x"], "DEBUG"),
        (["train", "m.py", "--model_dir", "x", "--verbosity", "WARNING"], "WARNING"),
        (
            ["--verbosity", "DEBUG", "train", "m.py", "--model_dir", "x", "--verbosity", "ERROR"],
            "ERROR",
        ),  # nearest wins
        (["records", "inspect", "f.tfrecord", "--verbosity", "ERROR"], "ERROR"),
    ],
)
def test_verbosity_is_taken_before_and_after_the_subcommand(argv, level):
    assert build_parser().parse_args(argv).verbosity == level


def test_a_bad_verbosity_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["inspect", str(tmp_path), "--verbosity", "LOUD"]) == 2
    error = capsys.readouterr().err
    assert error == (
        "torchestimator inspect: error: --verbosity 'LOUD' is not a logging level; use one of "
        "DEBUG, INFO, WARNING, ERROR, CRITICAL.\n"
    )
    assert cli.LOG_LEVELS == ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def test_verbosity_after_the_subcommand_sets_the_level(tmp_path, monkeypatch):
    """End to end: main configures logging with the level given after the subcommand."""
    configured = {}
    monkeypatch.setattr(logging, "basicConfig", lambda **options: configured.update(options))
    main(["inspect", str(tmp_path / "none"), "--verbosity", "warning"])
    assert configured["level"] == "WARNING"


def test_inspect_help_names_every_format_it_reads(capsys):
    from torchestimator.cli.inspection import PATH_HELP

    for reads in (
        "model_dir",
        "ckpt-<step>",
        "TensorFlow checkpoint",
        ".index",
        "'checkpoint' file",
        ".h5",
        ".weights.h5",
        ".keras",
        ".safetensors",
        ".pt",
        ".pth",
        ".bin",
    ):
        assert reads in PATH_HELP
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert " ".join(PATH_HELP.split()) in shown
