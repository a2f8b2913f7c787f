"""Every fenced block of docs/porting-from-tf-estimator.md, run or checked (issue 29, point 9).

The page ports a TensorFlow 1.x program to torchestimator. Its blocks are keyed by their first non-empty line:

- TensorFlow blocks (TF_BLOCKS) cannot run: TensorFlow is not installed here, and tf.estimator left it in 2.16.
  Each must parse as Python, and each excerpt must be lines of the whole train.py block, so that the part by
  part walk shows the program the page claims it ports;
- the torchestimator files (FILES: model.py, make_data.py, predict_exported.py) are written, as they stand on
  the page, into a temporary folder; the excerpts of model.py shown part by part (MODEL_EXCERPTS) must be lines
  of the whole model.py block, which is the file that runs;
- the bash blocks (COMMANDS) run there in page order, through `bash -e` with this venv's bin first on PATH (the
  page says so), each followed by checks of what it did: checkpoints written, the second run resuming at the
  first one's step, early stopping before max_steps, the best checkpoint kept, the best export loading and
  predicting, the CLI's predict agreeing with it (a rerun after early stopping, which the page describes
  without a block, is tests/test_training_and_evaluate.py's);
- the output the page shows for a command (OUTPUTS, "..." where numbers vary) is matched with what it printed,
  and the model_dir listing (LISTING) with the folder the commands left;
- the warm-start commands (NOT_RUN: they need the reader's TensorFlow checkpoint) are parsed by the real
  command-line parser.

test_every_block_is_run_or_listed fails on a block that is in none of these tables and on a listed key that is
no longer on the page, so a new block cannot slip through unchecked.

The slow test runs every command in a child process, so nothing here calls the compiled cores in this process.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import fenced_blocks

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "porting-from-tf-estimator.md"
VENV_BIN = Path(sys.executable).parent
COMMAND_TIMEOUT = 240  # s; a command block that runs longer fails


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of the page."""

    line: int
    """The line of its opening fence (1-based), for messages."""
    language: str
    text: str

    @property
    def key(self) -> str:
        return next(line.strip() for line in self.text.splitlines() if line.strip())


def page_blocks(text: str) -> list[Block]:
    """Every fenced block, in order (helpers.fenced_blocks)."""
    return [Block(line, language, body) for line, language, body in fenced_blocks(PAGE.name, text)]


BLOCKS = page_blocks(PAGE.read_text(encoding="utf-8"))


def block(key: str) -> Block:
    found = [candidate for candidate in BLOCKS if candidate.key == key]
    assert len(found) == 1, f"{len(found)} blocks of {PAGE.name} start with {key!r}"
    return found[0]


# ---------------------------------------------------------------- the tables: every block is in one

TF_PROGRAM = "# TF 1.x: train.py, the program as it ran on TensorFlow 1.15"
TF_MAKE_DATA = "# TF 1.x: make_data.py, the same records written with TensorFlow"
TF_EXCERPTS = (
    "# TF 1.x: the feature spec of train.py",
    "# TF 1.x: train_input_fn and eval_input_fn of train.py",
    "# TF 1.x: model_fn of train.py",
    "# TF 1.x: the serving input of train.py",
    "# TF 1.x: main of train.py",
)
TF_BLOCKS = dict.fromkeys(
    (TF_PROGRAM, TF_MAKE_DATA, *TF_EXCERPTS),
    "TensorFlow 1.x: not installed here (tf.estimator was removed in TF 2.16); checked to parse",
)

MODEL_FILE = "# model.py: the same program on torchestimator"
FILES = {
    MODEL_FILE: "model.py",
    "# make_data.py: the TFRecord files of tf.train.Example records that the input_fns read": "make_data.py",
    "# predict_exported.py: the best export, loaded without model.py, fed serialized tf.Examples": (
        "predict_exported.py"
    ),
}
MODEL_EXCERPTS = (
    "# torchestimator: the feature spec of model.py",
    "# torchestimator: train_input_fn and eval_input_fn of model.py",
    "# torchestimator: model, model_fn and optimizer of model.py",
    "# torchestimator: the serving input of model.py",
    "# torchestimator: the run's settings at the top level of model.py",
    "# torchestimator: the specs, the exporter and early stopping of model.py",
    "# torchestimator: main of model.py",
)

MAKE_DATA = "python make_data.py"
FIRST_RUN = "python model.py --model_dir runs/digits --max_steps 300"
CLI_RUN = "torchestimator train-and-evaluate model.py --model_dir runs/digits"
PREDICT = "python predict_exported.py runs/digits/export/best"
COMMANDS = (MAKE_DATA, FIRST_RUN, CLI_RUN, PREDICT)  # run in this order, which is the page's

FIRST_RUN_OUTPUT = "final evaluation: {'accuracy': 0.9..., 'loss': 0.0..., 'global_step': 300}"
LISTING = "runs/digits/"
WARM_START = (
    "torchestimator warm-start --dry_run --model model.py /path/to/tf/runs/digits --accept_proposed --include_buffers"
)
OUTPUTS = {FIRST_RUN_OUTPUT: FIRST_RUN}  # what a command prints, "..." where numbers vary: matched with its output
NOT_RUN = {
    WARM_START: "needs the reader's TensorFlow checkpoint; each command is parsed by the real CLI parser "
    "(tests/test_warm_start.py plans and applies warm starts from a real TF 1.x checkpoint)",
}


def test_every_block_is_run_or_listed():
    listed = [*TF_BLOCKS, *FILES, *MODEL_EXCERPTS, *COMMANDS, *OUTPUTS, LISTING, *NOT_RUN]
    assert len(set(listed)) == len(listed), "a key is listed twice"
    keys = [candidate.key for candidate in BLOCKS]
    assert len(set(keys)) == len(keys), f"two blocks share a first line: {keys}"
    unlisted = [f"{PAGE.name}:{candidate.line}: {candidate.key}" for candidate in BLOCKS if candidate.key not in listed]
    assert not unlisted, "blocks neither run nor listed with a reason:\n" + "\n".join(unlisted)
    gone = sorted(set(listed) - set(keys))
    assert not gone, f"listed blocks no longer on the page: {gone}"
    assert [block(key).language for key in COMMANDS] == ["bash"] * len(COMMANDS)


# ---------------------------------------------------------------- blocks checked without running them


def _is_excerpt(excerpt: Block, whole: Block) -> bool:
    """Whether the excerpt's lines after its label (its first line) are consecutive lines of ``whole``."""
    lines = [line.rstrip() for line in excerpt.text.splitlines()[1:]]
    within = [line.rstrip() for line in whole.text.splitlines()]
    return bool(lines) and any(within[start : start + len(lines)] == lines for start in range(len(within)))


@pytest.mark.parametrize("key", list(TF_BLOCKS))
def test_tensorflow_block_parses(key):
    tree = ast.parse(textwrap.dedent(block(key).text.split("\n", 1)[1]))
    assert tree.body, key
    if key in TF_EXCERPTS:
        assert _is_excerpt(block(key), block(TF_PROGRAM)), f"{key!r}: not lines of the whole train.py block"


def test_the_tensorflow_program_is_a_tf_estimator_program():
    """What the page says it ports is in the original: every piece the port maps has its TF line."""
    text = block(TF_PROGRAM).text
    for piece in (
        "tf.layers.dense(",
        "tf.layers.batch_normalization(",
        "tf.io.parse_single_example(",
        "tf.io.parse_example(",
        "tf.io.FixedLenFeature(",
        "tf.data.TFRecordDataset",
        "tf.estimator.RunConfig(",
        "save_checkpoints_steps=",
        "keep_checkpoint_max=",
        "tf_random_seed=",
        "tf.estimator.TrainSpec(",
        "tf.estimator.EvalSpec(",
        "tf.estimator.BestExporter(",
        "tf.estimator.experimental.stop_if_no_decrease_hook(",
        "tf.estimator.train_and_evaluate(",
    ):
        assert piece in text, piece


@pytest.mark.parametrize("key", MODEL_EXCERPTS)
def test_model_excerpt_is_part_of_model_py(key):
    assert _is_excerpt(block(key), block(MODEL_FILE)), f"{key!r}: not lines of the whole model.py block"


def test_model_py_defines_what_the_command_line_reads():
    """The names part 5 says model.py defines are top-level names of it, and all of them are names the CLI reads."""
    from torchestimator.cli.model_file import MODEL_FILE_NAMES

    tree = ast.parse(block(MODEL_FILE).text)
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)} | {
        target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
    }
    contract = {row.name for row in MODEL_FILE_NAMES}
    said = {
        "model",
        "model_fn",
        "optimizer",
        "params",
        "config",
        "train_input_fn",
        "max_steps",
        "eval_spec",
        "best",
        "early_stopping",
        "eval_input_fn",
        "serving_input_receiver",
    }
    assert said <= contract and said <= defined, (said - contract, said - defined)


def test_the_model_part_names_the_lazy_port_of_tf_layers_dense():
    """Where a porting reader meets tf.layers.dense, the page says nn.LazyLinear is its direct port and links to
    the runnable example (docs/train-and-evaluate.md's, which tests/test_readme.py runs)."""
    text = PAGE.read_text(encoding="utf-8")
    model_part = text[text.index("### 2. The model") : text.index("### 3.")]
    assert "`nn.LazyLinear(units)`** is the direct port of `tf.layers.dense(net,\n  units)`" in model_part
    link = re.search(r"\(train-and-evaluate\.md#([\w-]+)\)", model_part)
    assert link, "no link to the lazy-layers example"
    target = (ROOT / "docs" / "train-and-evaluate.md").read_text(encoding="utf-8")
    heading = next(line for line in target.splitlines() if line.startswith("## Lazy layers"))
    assert re.sub(r"[^\w\- ]", "", heading[3:].lower()).replace(" ", "-") == link.group(1)
    assert "nn.LazyLinear(" in target[target.index(heading) :].split("```python", 1)[1]


def test_warm_start_commands_parse():
    """Each command of the warm-start block parses with the real parser, on the page's own model.py."""
    from torchestimator.cli import build_parser

    commands = [line for line in block(WARM_START).text.splitlines() if line.strip()]
    assert len(commands) == 3
    parsed = [build_parser().parse_args(shlex.split(command)[1:]) for command in commands]
    assert [arguments.model for arguments in parsed[:2]] == ["model.py", "model.py"]
    assert parsed[0].dry_run and parsed[1].write == "runs/from_tf"
    assert all(arguments.accept_proposed and arguments.include_buffers for arguments in parsed[:2])
    assert parsed[2].model_file == "model.py" and parsed[2].model_dir == parsed[1].write


# ---------------------------------------------------------------- the port, run as written


def _run(key: str, workdir: Path) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        # One torch thread per process: on this 2-core machine, shared with other tests, torch's threads spin
        # against each other (the demo measured 1.7 ms a step with one, 26-57 ms with two).
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        ["bash", "-e", "-c", block(key).text],
        cwd=workdir,
        env=environment,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    assert result.returncode == 0, f"{key}: exit {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    return result


def _steps(model_dir: Path) -> list[int]:
    return sorted(int(path.name.removeprefix("ckpt-")) for path in model_dir.glob("ckpt-*") if path.is_dir())


def _final_evaluation(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("final evaluation: "))
    return ast.literal_eval(line.removeprefix("final evaluation: "))


def _versions(export_base: Path) -> list[Path]:
    return sorted(path for path in export_base.iterdir() if path.is_dir() and path.name.isdigit())


def _assert_shown_output(key: str, stdout: str) -> None:
    """The output block's lines are the command's stdout, with "..." standing for anything."""
    shown = [re.escape(line).replace(re.escape("..."), ".*") for line in block(key).text.splitlines()]
    printed = stdout.splitlines()
    assert len(printed) == len(shown), (block(key).text, stdout)
    for pattern, line in zip(shown, printed):
        assert re.fullmatch(pattern, line), f"{key}: the page shows {pattern!r}, the command printed {line!r}"


@pytest.mark.slow
def test_the_port_runs_as_written(tmp_path):
    for key, name in FILES.items():
        (tmp_path / name).write_text(block(key).text)
    model_dir = tmp_path / "runs" / "digits"

    made = _run(MAKE_DATA, tmp_path)
    assert "1437 training examples in 2 files, 360 in data/eval.tfrecord" in made.stdout
    assert "'weight': array(1., dtype=float32)" in made.stdout  # the record without "weight" got its default
    assert sorted(path.name for path in (tmp_path / "data").iterdir()) == [
        "eval.tfrecord",
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]

    # The Python route, a short first run: main() of model.py, as `python train.py` ran TF's.
    first = _run(FIRST_RUN, tmp_path)
    results = _final_evaluation(first.stdout)
    assert results["global_step"] == 300 and results["accuracy"] > 0.9, results
    assert _steps(model_dir) == [100, 200, 300]  # keep_checkpoint_max=3
    assert "trained runs/digits from step 0 to 300" in first.stderr
    assert _versions(model_dir / "export" / "best"), "the BestExporter exported nothing"
    _assert_shown_output(FIRST_RUN_OUTPUT, first.stdout)

    # The command line on the same model_dir: it resumes at step 300 and trains on until early stopping.
    resumed = _run(CLI_RUN, tmp_path)
    assert "Restored weights from" in resumed.stderr and "(global step 300)" in resumed.stderr
    assert "Input resumes at TFRecordDataset over 2 files" in resumed.stderr
    ended = re.search(
        r"resumed runs/digits from ckpt-300 and trained to step (\d+) .*stopped at step \1 of 5000: early stopping",
        resumed.stderr,
    )
    assert ended, resumed.stderr[-3000:]
    final_step = int(ended.group(1))
    assert 300 < final_step < 5000
    answer = json.loads(resumed.stdout)
    assert answer["results"]["global_step"] == final_step and answer["results"]["accuracy"] > 0.95, answer
    steps = _steps(model_dir)
    best_step = json.loads((model_dir / "best.json").read_text())["best"][0]["step"]
    assert steps[-3:] == [final_step - 200, final_step - 100, final_step] and best_step in steps, (steps, best_step)
    assert len(steps) <= 4  # the newest 3 and the best one
    assert final_step - best_step >= 500  # early stopping: max_steps_without_decrease=500
    assert 1 <= len(_versions(model_dir / "export" / "best")) <= 3  # exports_to_keep=3

    for line in block(LISTING).text.splitlines()[1:]:
        entry = line.split()[0]
        pattern = entry.replace("<step>", "*").replace("<version>", "[0-9]*").rstrip("/")
        assert list((tmp_path / "runs" / "digits").glob(pattern)), f"{LISTING} lists {entry}, which is not there"

    # The best export, alone: loaded and fed the held-out records, then the CLI's predict on the request it wrote.
    predicted = _run(PREDICT, tmp_path)
    accuracy = re.search(r"accuracy (\S+) on 360 held-out examples", predicted.stdout)
    assert accuracy and float(accuracy.group(1)) > 0.95, predicted.stdout
    classes = re.search(r"request\.json: labels (\[.*?\]), predicted (\[.*?\])", predicted.stdout)
    labels, expected = json.loads(classes.group(1)), json.loads(classes.group(2))
    served = json.loads(predicted.stdout.strip().splitlines()[-1])
    assert [row["class_ids"] for row in served["predictions"]] == expected
    assert sum(a == b for a, b in zip(labels, expected)) >= 2, (labels, expected)
    assert all(abs(sum(row["probabilities"]) - 1) < 1e-4 for row in served["predictions"])
