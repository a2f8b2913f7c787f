"""Every fenced code block of README.md, run as written (issue 13, "Done means").

A reader follows the README top to bottom: the Python blocks run in README order in one namespace, in one
temporary working folder (the README's paths are relative: runs/quickstart, export/digits); the bash blocks
run in that folder through `bash -e` with this venv's bin first on PATH. Files a reader is supposed to bring
(their CSV index, their model.py and Keras weights) are made beforehand from project fixtures
(BEFORE); a command that needs an earlier command's state gets it by running that command first
(EARLIER_COMMANDS). Blocks that cannot run on one machine by their nature (several machines, SLURM, Ray,
the network) are listed in NOT_RUNNABLE with the reason and, where that is honest, a partial check (flags
parsed by the real parser, `bash -n`, TF_CONFIG resolved); the plain error-tree block is compared with
torchestimator.errors. test_every_block_is_run_or_listed fails on a README block that is neither run nor
listed and on a listed block that is gone, so a new block cannot slip through untested.

Blocks are keyed by their first non-empty line: editing a block's first line means updating its key here.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import inspect
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import symtable
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIXTURES = ROOT / "tests" / "fixtures"
VENV_BIN = Path(sys.executable).parent
BASH_BLOCK_TIMEOUT = 300  # s; a bash block that runs longer is stopped (with its background jobs) and fails
SERVING_PORT = 8501  # the README's serve commands use TF Serving's default port, as a user would


# ---------------------------------------------------------------- the README's blocks


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of the README."""

    line: int
    """The line of its opening fence (1-based), for messages."""
    language: str
    """The fence's info string: python, bash, or '' for a plain block."""
    text: str

    @property
    def key(self) -> str:
        """Its stable identifier: the first non-empty line."""
        return next(line.strip() for line in self.text.splitlines() if line.strip())

    @property
    def label(self) -> str:
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.key)[:40].strip("-")
        return f"L{self.line}-{self.language or 'plain'}-{slug}"


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order; an unclosed fence is an error naming its line."""
    blocks, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        opening = re.match(r"^```([\w+-]*)\s*$", lines[index])
        if opening:
            start, index = index, index + 1
            while index < len(lines) and lines[index].strip() != "```":
                index += 1
            if index == len(lines):
                raise AssertionError(f"README.md:{start + 1}: code fence never closed")
            blocks.append(Block(start + 1, opening.group(1), "\n".join(lines[start + 1 : index]) + "\n"))
        index += 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def block_with_key(key: str) -> Block:
    return next(block for block in BLOCKS if block.key == key)


# ---------------------------------------------------------------- partial checks of blocks that cannot run here


def bash_syntax_is_valid(block: Block) -> None:
    result = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"README.md:{block.line}: bash -n: {result.stderr}"


def setup_command_is_ci_command(block: Block) -> None:
    """The test command is the one .ci/run runs, as the README says."""
    bash_syntax_is_valid(block)
    assert block.key in (ROOT / ".ci" / "run").read_text().splitlines(), ".ci/run no longer runs the README's command"


def setup_command_uses_the_lock(block: Block) -> None:
    """It installs from the lock file, which pins the CPU torch the README names."""
    bash_syntax_is_valid(block)
    assert "-r requirements-lock.txt" in block.text and "torch==2.13.0" in (ROOT / "requirements-lock.txt").read_text()


def cpu_install_pins_the_locked_torch(block: Block) -> None:
    """The CPU route installs the torch version the lock file tests."""
    bash_syntax_is_valid(block)
    pinned = re.search(r"^torch==(\S+)$", (ROOT / "requirements-lock.txt").read_text(), re.MULTILINE).group(1)
    assert f"pip install torch=={pinned} --index-url https://download.pytorch.org/whl/cpu" in block.text


def bench_environment_is_pinned(block: Block) -> None:
    """The comparison environment installs the lock of benchmarks/ (exact pins: the CPU torch of the test lock,
    TensorFlow, the tfrecord package) and runs a benchmark that exists."""
    bash_syntax_is_valid(block)
    lock = (ROOT / "benchmarks" / "requirements-bench.txt").read_text()
    pins = {
        line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
        for line in lock.splitlines()
        if "==" in line and not line.startswith("#")
    }
    assert pins.get("torch") == re.search(
        r"^torch==(\S+)$", (ROOT / "requirements-lock.txt").read_text(), re.MULTILINE
    ).group(1)
    assert {"tensorflow-cpu", "tfrecord", "fastapi", "uvicorn", "httptools", "uvloop", "flask", "gunicorn"} <= set(pins)
    assert "-r benchmarks/requirements-bench.txt" in block.text
    for script in re.findall(r"benchmarks/\w+\.py", block.text):
        assert (ROOT / script).is_file(), script


@contextlib.contextmanager
def environ_restored():
    """torchrun's argument checks set OMP_NUM_THREADS in os.environ; the test process keeps its own."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(saved):
            del os.environ[name]
        os.environ.update({name: value for name, value in saved.items() if os.environ.get(name) != value})


def parsed_command(command: str):
    """A `torchestimator ...` command line parsed by the real parser (line continuations joined)."""
    from torchestimator.cli import build_parser

    words = shlex.split(command.replace("\\\n", " "), comments=True)
    assert words[0] == "torchestimator", command
    return build_parser().parse_args(words[1:])


def two_node_launch_parses(block: Block) -> None:
    """Its flags parse, and pass launch's own preparation (torchrun's checks, the rendezvous host mark)."""
    from torchestimator.distribute.launcher import prepare_torchrun_arguments

    with environ_restored():
        arguments = prepare_torchrun_arguments(parsed_command(block.text), environ={})
    assert (arguments.nnodes, arguments.nproc_per_node, arguments.rdzv_endpoint) == ("2", "4", "10.0.0.1:29400")
    assert arguments.training_script == "train.py"
    assert arguments.training_script_args == ["--model_dir", "/shared/runs/run42"]


def slurm_script_builds_a_launch_that_parses(block: Block, workdir: Path) -> None:
    """`bash -n`, then the script run with SLURM's variables and stand-ins for scontrol and srun that record
    the command srun would start; that `torchestimator launch` command parses with the real parser."""
    bash_syntax_is_valid(block)
    script = workdir / "job.sh"
    script.write_text(block.text)
    recorded = workdir / "srun_arguments"
    stand_ins = (
        f'scontrol() {{ printf "node01\\nnode02\\n"; }}; '
        f'srun() {{ printf "%s\\n" "$@" > {shlex.quote(str(recorded))}; }}; '
        f"source {shlex.quote(str(script))}"
    )
    slurm = {"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_NNODES": "2", "SLURM_JOB_ID": "4242"}
    result = subprocess.run(
        ["bash", "-e", "-c", stand_ins],
        env={**os.environ, **slurm},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    words = recorded.read_text().splitlines()
    with environ_restored():
        arguments = parsed_command(shlex.join(words))
    assert (arguments.nnodes, arguments.nproc_per_node, arguments.rdzv_endpoint, arguments.rdzv_id) == (
        "2",
        "4",
        "node01:29400",
        "4242",
    )


def tf_config_tasks_resolve(block: Block, workdir: Path) -> None:
    """`bash -n`, then the block run with `python` standing in as a recorder of each task's TF_CONFIG; each
    resolves to its rank in one 2-process group whose store is the chief's address."""
    from torchestimator.distribute import cluster_from_tf_config

    bash_syntax_is_valid(block)
    recorded = workdir / "tf_configs"
    stand_in = f'python() {{ printf "%s\\n" "$TF_CONFIG" >> {shlex.quote(str(recorded))}; }}\n'
    result = subprocess.run(
        ["bash", "-e", "-c", stand_in + block.text], capture_output=True, text=True, timeout=30, cwd=workdir
    )
    assert result.returncode == 0, result.stderr
    clusters = [cluster_from_tf_config({"TF_CONFIG": line}) for line in recorded.read_text().splitlines()]
    assert [(c.task_type, c.rank, c.world_size) for c in clusters] == [("chief", 0, 2), ("worker", 1, 2)]
    assert all((c.master_addr, c.master_port) == ("host0", 2222) for c in clusters)


def names_are_defined_above(block: Block) -> None:
    """A block shown but not run still refers only to names it defines or earlier run blocks define."""
    undefined = undefined_names(block)
    assert not undefined, f"README.md:{block.line} uses {sorted(undefined)}, defined by no block above it"


def synopsis_flags_exist(block: Block) -> None:
    """A synopsis ([optional] parts, placeholders): every line names a real subcommand and only its real flags."""
    from torchestimator.cli import build_parser
    from torchestimator.distribute.launcher import launch_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    for line in block.text.replace("\\\n", " ").splitlines():
        words = line.split("#")[0].split()
        if not words:
            continue
        assert words[0] == "torchestimator", line
        # launch hands every word after it to torchrun's parser, so its flags are that parser's.
        parser = launch_parser() if words[1] == "launch" else commands[words[1]]
        for flag in re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", " ".join(words[2:])):
            assert flag in parser._option_string_actions, f"README.md:{block.line}: {words[1]} has no {flag} ({line})"


def tf_client_calls_are_the_tools(block: Block) -> None:
    """TF Serving's own client (needs TensorFlow): valid Python whose TF calls tools/check_tf_serving_grpc_client.py
    makes against serve --port in the comparison environment."""
    tree = ast.parse(block.text)
    called = {
        node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    tool = (ROOT / "tools" / "check_tf_serving_grpc_client.py").read_text()
    for name in ("PredictionServiceStub", "make_tensor_proto", "make_ndarray", "Predict"):
        assert name in called and f".{name}(" in tool, f"README.md:{block.line}: {name} is not what the tool checks"


@dataclasses.dataclass(frozen=True)
class NotRunnable:
    reason: str
    check: Callable[..., None] | None = None
    """A partial check: takes the block, and a temporary folder as `workdir` when it declares one."""


SETUP = (
    "python3 -m venv .venv && .venv/bin/pip install -q -r requirements-lock.txt && "
    ".venv/bin/pip install -q --no-deps -e . && "
)  # the start of the README's two commands

NOT_RUNNABLE: dict[str, NotRunnable] = {
    SETUP + ".venv/bin/torchestimator demo": NotRunnable(
        "the README's own setup command: it creates a venv and installs from PyPI; CI runs it from a "
        "fresh clone. Its last part, `torchestimator demo`, runs before the serving block here",
        setup_command_uses_the_lock,
    ),
    SETUP + "{ ! command -v npm > /dev/null || npm ci --loglevel=error --no-audit --no-fund --prefix tests/azurite; } "
    "&& scripts/check && .venv/bin/python -m pytest -q && TORCHESTIMATOR_PURE_PYTHON=1 .venv/bin/python -m pytest -q -m "
    '"not slow or compiled_path"': NotRunnable(
        "the README's own test command, which is what CI runs (.ci/run)", setup_command_is_ci_command
    ),
    "python3 -m venv /tmp/benchenv && /tmp/benchenv/bin/pip install -r benchmarks/requirements-bench.txt && "
    "/tmp/benchenv/bin/pip install --no-deps -e . && /tmp/benchenv/bin/python benchmarks/tfrecord_read.py": NotRunnable(
        "installs TensorFlow and the other anchors from PyPI into a venv of its own (20 minutes)",
        bench_environment_is_pinned,
    ),
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": NotRunnable(
        "installs from the network into the current environment", cpu_install_pins_the_locked_torch
    ),
    "torchestimator launch --nnodes 2 --nproc_per_node 4 \\": NotRunnable(
        "two machines (tests/test_multinode.py runs the same launch as two nodes on 127.0.0.1)", two_node_launch_parses
    ),
    "#!/bin/bash": NotRunnable(
        "a SLURM batch script: needs sbatch, srun and two nodes", slurm_script_builds_a_launch_that_parses
    ),
    "from ray.train import ScalingConfig": NotRunnable(
        "needs Ray (not a dependency) and a Ray cluster with /shared", names_are_defined_above
    ),
    "# on host0, the chief:": NotRunnable("two hosts (host0, host1), one command on each", tf_config_tasks_resolve),
    "import grpc, numpy as np, tensorflow as tf": NotRunnable(
        "TF Serving's own client needs TensorFlow and tensorflow-serving-api, not dependencies; "
        "tools/check_tf_serving_grpc_client.py runs it against serve --port",
        tf_client_calls_are_the_tools,
    ),
    "torchestimator serve --model_config_file models.config [--model_config_file_poll_wait_seconds 30] \\": NotRunnable(
        "a synopsis: [optional] flags and config files of the reader's own", synopsis_flags_exist
    ),
    "torchestimator train FILE.py --model_dir runs/x [--max_steps N | --steps N] [--param lr=0.01]": NotRunnable(
        "a synopsis: FILE.py, runs/x and N are placeholders", synopsis_flags_exist
    ),
}


# ---------------------------------------------------------------- the error tree (a plain block)


def error_tree_matches_errors_module(block: Block) -> None:
    """Every class the tree names exists in torchestimator.errors with exactly the stated bases (its parent in
    the tree and the builtin in parentheses), and every exception the module exports is in the tree."""
    from torchestimator import errors

    parents: list[type] = []
    named = set()
    for line in block.text.splitlines():
        match = re.match(r"^(?P<indent>(?:[│ ]   )*)(?P<branch>[├└]── )?(?P<name>\w+)(?:\((?P<base>\w+)\))?", line)
        assert match, f"README.md:{block.line}: cannot read the tree line {line!r}"
        depth = len(match["indent"]) // 4 + (1 if match["branch"] else 0)
        cls = getattr(errors, match["name"], None)
        assert isinstance(cls, type), f"the README's error tree names {match['name']}, not in torchestimator.errors"
        stated = set(parents[depth - 1 : depth]) | ({getattr(builtins, match["base"])} if match["base"] else set())
        bases = set(cls.__bases__) - {errors.PicklableError}  # the pickling mixin is no kind of error to catch
        assert bases == stated, f"{match['name']}: README says bases {stated}, it has {cls.__bases__}"
        del parents[depth:]
        parents.append(cls)
        named.add(match["name"])
    exported = {
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type) and issubclass(getattr(errors, name), BaseException)
    }
    assert exported - named == set(), f"the README's error tree misses {sorted(exported - named)}"


TEXT_CHECKS: dict[str, Callable[[Block], None]] = {
    "TorchEstimatorError(Exception)                 except te.TorchEstimatorError catches them all": error_tree_matches_errors_module,
}


# ---------------------------------------------------------------- before a block: a reader's files, earlier commands


def write_index_csv(workdir: Path) -> None:
    """index.csv is the reader's own data (the block's comment gives its columns): eight small PNG images."""
    import numpy as np
    from PIL import Image

    (workdir / "images").mkdir()
    rows = ["label,path"]
    for number in range(8):
        pixels = np.random.default_rng(number).integers(0, 256, size=(8, 8), dtype=np.uint8)
        Image.fromarray(pixels, mode="L").save(workdir / "images" / f"digit-{number}.png")
        rows.append(f"{number},images/digit-{number}.png")
    (workdir / "index.csv").write_text("\n".join(rows) + "\n")


KERAS_MODEL_IN_PYTORCH = """import torch.nn as nn


def model():  # the Keras model of tests/fixtures/keras: Conv2D(4, 3), BatchNormalization, ReLU, Flatten, Dense(5)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, eps=1e-3, momentum=0.01), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5))
"""


def write_keras_weights_and_model(workdir: Path) -> None:
    """keras_model.weights.h5 and model.py are the reader's: a real Keras 3 file (tests/fixtures/keras, written by
    Keras 3.15 from an 8x8x3 input) and the same layers in PyTorch, the README's own case of a Dense after Flatten."""
    shutil.copy(FIXTURES / "keras" / "keras3_model.weights.h5", workdir / "keras_model.weights.h5")
    (workdir / "model.py").write_text(KERAS_MODEL_IN_PYTORCH)


def serving_port_is_free(workdir: Path) -> None:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", SERVING_PORT)) == 0:
            raise AssertionError(
                f"port {SERVING_PORT} already answers on this machine: the README's serve block "
                "uses TF Serving's default port; stop what listens there and rerun"
            )


# Made in the working folder before the block runs: the reader's own files, or a condition the block needs.
BEFORE: dict[str, Callable[[Path], None]] = {
    "torchestimator convert csv-to-tfrecord index.csv out/train --num_shards 4   # label,path[,other columns]": write_index_csv,
    "torchestimator warm-start --dry_run --model model.py keras_model.weights.h5 --accept_proposed \\": write_keras_weights_and_model,
    "torchestimator export torchestimator.cli.demo --model_dir runs/digits --export_dir export/digits": serving_port_is_free,
}

# "after the demo has trained runs/digits": the demo's command, the last part of the README's first command.
EARLIER_COMMANDS: dict[str, str] = {
    "torchestimator export torchestimator.cli.demo --model_dir runs/digits --export_dir export/digits": "torchestimator demo\n",
}


# ---------------------------------------------------------------- running blocks in order


@dataclasses.dataclass
class Outcome:
    ok: bool
    output: str
    """stdout (and for bash blocks, stderr after it)."""
    error: str = ""


def _members_alive(group: int) -> bool:
    """Whether a process of this process group is still running (zombies do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


def end_process_group(group: int, grace: float = 30.0) -> None:
    """Ends what a bash block left running (its `&` server): SIGTERM to the block's own group, SIGKILL after
    `grace` seconds. The group is the one the block's bash leads (start_new_session), nothing else."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while _members_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _members_alive(group):
            return


class ReadmeRun:
    """The README run top to bottom in one folder; blocks run on demand, in order, each once."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.namespace: dict = {"__name__": "readme"}
        self.outcomes: dict[int, Outcome] = {}
        (workdir / ".readme").mkdir()

    def outcome(self, block: Block) -> Outcome:
        for earlier in BLOCKS[: BLOCKS.index(block) + 1]:
            if earlier.line not in self.outcomes and runs(earlier):
                self.outcomes[earlier.line] = self._run(earlier)
        failed_before = [line for line, outcome in self.outcomes.items() if line < block.line and not outcome.ok]
        result = self.outcomes[block.line]
        if not result.ok and failed_before:
            result = dataclasses.replace(
                result, error=f"{result.error}\n(earlier README blocks failed too: lines {failed_before})"
            )
        return result

    def _run(self, block: Block) -> Outcome:
        try:
            if block.key in BEFORE:
                BEFORE[block.key](self.workdir)
            if block.key in EARLIER_COMMANDS:
                earlier = self._bash(EARLIER_COMMANDS[block.key], f"before-L{block.line}")
                if not earlier.ok:
                    return dataclasses.replace(earlier, error=f"the command run before it failed: {earlier.error}")
        except Exception:
            return Outcome(False, "", f"preparing README.md:{block.line}: {traceback.format_exc()}")
        if block.language == "python":
            return self._python(block)
        return self._bash(block.text, f"L{block.line}")

    @contextlib.contextmanager
    def inside(self):
        """In the working folder, where the README's relative paths point."""
        cwd = os.getcwd()
        os.chdir(self.workdir)
        try:
            yield
        finally:
            os.chdir(cwd)

    def _python(self, block: Block) -> Outcome:
        stdout, stderr = io.StringIO(), io.StringIO()
        try:
            with self.inside(), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                exec(compile(block.text, f"README.md:{block.line}", "exec"), self.namespace)
        except Exception:
            return Outcome(False, stdout.getvalue(), f"{traceback.format_exc()}\nstderr:\n{stderr.getvalue()[-3000:]}")
        return Outcome(True, stdout.getvalue())

    def _bash(self, text: str, name: str) -> Outcome:
        script = self.workdir / ".readme" / f"{name}.sh"
        script.write_text(text)
        out_path, err_path = script.with_suffix(".out"), script.with_suffix(".err")
        environment = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        with open(out_path, "w") as out, open(err_path, "w") as err:
            # Output to files, not pipes: a background server keeps a pipe open after bash is done.
            process = subprocess.Popen(
                ["bash", "-e", str(script)],
                cwd=self.workdir,
                env=environment,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                returncode = process.wait(timeout=BASH_BLOCK_TIMEOUT)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                end_process_group(process.pid)
                process.wait(timeout=30)
        output, errors = out_path.read_text(), err_path.read_text()
        if returncode == 0:
            return Outcome(True, output + errors)
        why = f"still running after {BASH_BLOCK_TIMEOUT} s" if returncode is None else f"exit status {returncode}"
        return Outcome(
            False, output + errors, f"bash -e {name}.sh: {why}\nstdout:\n{output[-3000:]}\nstderr:\n{errors[-3000:]}"
        )


def runs(block: Block) -> bool:
    return block.key not in NOT_RUNNABLE and block.key not in TEXT_CHECKS and block.language in ("python", "bash")


# ---------------------------------------------------------------- what each run block must show


def printed_literal(output: str, start: str):
    line = next(line for line in output.splitlines() if line.startswith(start))
    return ast.literal_eval(line)


def quickstart_learns_and_predicts(run: ReadmeRun, outcome: Outcome) -> None:
    results = printed_literal(outcome.output, "{")
    assert results["global_step"] == 1000 and results["accuracy"] >= 0.9, results  # labels follow a linear rule
    classes = outcome.output.splitlines()[1:]
    assert len(classes) == 5 and all(0 <= int(value) <= 9 for value in classes), outcome.output


def config_has_two_replicas(run: ReadmeRun, outcome: Outcome) -> None:
    import torchestimator as te

    assert isinstance(run.namespace["config"].train_distribute, te.MirroredStrategy)


def tfrecord_input_fn_gives_batches(run: ReadmeRun, outcome: Outcome) -> None:
    """Beyond running the block: its input_fn reads the file it wrote, as the block says."""
    import torch

    import torchestimator as te

    with run.inside():
        features, labels = next(iter(run.namespace["tfrecord_input_fn"](te.InputContext())))
    assert labels.tolist() == [3] * len(labels) and 0 < len(labels) <= 32
    assert torch.allclose(features["dense"], torch.tensor([[0.1, 0.2]] * len(labels)))


def warm_start_loads_the_quickstart(run: ReadmeRun, outcome: Outcome) -> None:
    assert "Warm start from runs/quickstart (torchestimator)" in outcome.output and "9 to load" in outcome.output
    assert run.namespace["estimator"].latest_checkpoint().endswith("ckpt-500")


def best_model_is_kept(run: ReadmeRun, outcome: Outcome) -> None:
    exports = run.namespace["exports"]
    assert exports, "train_and_evaluate returned no exports"
    assert "ckpt-" in outcome.output.splitlines()[-1], outcome.output


def export_loads_and_predicts(run: ReadmeRun, outcome: Outcome) -> None:
    versions = [entry.name for entry in (run.workdir / "export" / "digits").iterdir()]
    assert [name for name in versions if name.isdigit()], versions
    assert re.fullmatch(r"(tensor\()?\[(\d[ ,]*){3}\]\)?\n", outcome.output), outcome.output  # three classes


def onnx_gives_the_exported_classes(run: ReadmeRun, outcome: Outcome) -> None:
    namespace = run.namespace
    expected = namespace["model"]({"image": namespace["x"][:3]})["class"]
    assert [int(value) for value in namespace["outputs"]["serving_default/class"]] == [int(value) for value in expected]


def records_are_written_and_verified(run: ReadmeRun, outcome: Outcome) -> None:
    from torchestimator.data import read_records

    shards = sorted((run.workdir / "out").glob("train-*-of-00004.tfrecord"))
    assert len(shards) == 4 and sum(1 for _ in read_records([str(path) for path in shards])) == 8
    assert "Traceback" not in outcome.output


def keras_weights_are_written_converted(run: ReadmeRun, outcome: Outcome) -> None:
    """The dry run writes nothing; --write leaves a step-0 checkpoint holding Keras's values in PyTorch layouts."""
    import numpy as np

    from torchestimator.interop import open_weights

    assert "6 to load" in outcome.output and "nothing was written" in outcome.output
    assert sorted(path.name for path in (run.workdir / "runs" / "from_keras").glob("ckpt-*")) == ["ckpt-0"]
    keras = np.load(FIXTURES / "keras" / "reference.npz")  # layer.get_weights(), saved by Keras
    with open_weights(str(run.workdir / "runs" / "from_keras")) as written:

        def value(name):
            return np.asarray(written.read(name))

        assert np.array_equal(value("0.weight"), keras["conv/0"].transpose(3, 2, 0, 1))  # HWIO -> OIHW
        assert np.array_equal(value("4.bias"), keras["fc/1"]) and np.array_equal(value("1.weight"), keras["bn/0"])
        # Keras flattened H, W, C; torch flattens C, H, W: the converter reorders the Dense kernel's rows.
        nhwc_rows = keras["fc/0"].reshape(6, 6, 4, 5).transpose(2, 0, 1, 3).reshape(144, 5)
        assert np.array_equal(value("4.weight"), nhwc_rows.T)


def server_answers_the_request(run: ReadmeRun, outcome: Outcome) -> None:
    assert re.search(r"serving digits \(version \d+ AVAILABLE\) at http://127\.0\.0\.1:8501", outcome.output), (
        "the curl answers did not come from this block's server:\n" + outcome.output
    )
    start = outcome.output.index('{"predictions"')  # curl's answer, as the server wrote it
    answer, _ = json.JSONDecoder().raw_decode(outcome.output[start:])
    assert len(answer["predictions"]) == 2 and all(0 <= row["class"] <= 9 for row in answer["predictions"])


def client_gets_predictions(run: ReadmeRun, outcome: Outcome) -> None:
    predictions = printed_literal(outcome.output, "[")
    assert len(predictions) == 2 and all(0 <= row["class"] <= 9 for row in predictions)
    assert "'AVAILABLE'" in outcome.output.splitlines()[1]


def examples_receiver_answers_as_the_model(run: ReadmeRun, outcome: Outcome) -> None:
    """Serialized Examples sent as {"b64"} through the server give the classes of the export fed x[:3]."""
    from torchestimator.export import load

    rows = printed_literal(outcome.output, "[")
    model = load(run.workdir / "export" / "digits_examples")
    assert [row["class"] for row in rows] == model({"image": run.namespace["x"][:3]})["class"].tolist()


def image_request_answers_as_the_model(run: ReadmeRun, outcome: Outcome) -> None:
    """predict --exported on the {"b64"} image request answers the classes of the export fed the PNG bytes."""
    from torchestimator.export import load

    answer = json.loads(outcome.output)
    model = load(run.workdir / "export" / "digits_images")
    assert [row["class"] for row in answer["predictions"]] == model(run.namespace["pngs"])["class"].tolist()


def store_workflow_answers(run: ReadmeRun, outcome: Outcome) -> None:
    """The object-storage block trained into the bucket, listed the run, and the server it started from the
    bucket answered two predictions."""
    assert "digits demo: trained from scratch to step 200 in s3://my-bucket/runs/digits" in outcome.output
    assert "model_dir s3://my-bucket/runs/digits: 1 checkpoint(s)" in outcome.output
    assert "best export: s3://my-bucket/runs/digits/export/best/" in outcome.output
    answer, _ = json.JSONDecoder().raw_decode(outcome.output[outcome.output.index('{"predictions"') :])
    assert len(answer["predictions"]) == 2 and {"class", "probabilities"} <= set(answer["predictions"][0])
    assert "Found credentials" not in outcome.output  # the clients' INFO lines stay out of the CLI's output


CHECKS_AFTER: dict[str, Callable[[ReadmeRun, Outcome], None]] = {
    "python -m moto.server -p 9000 > moto.log 2>&1 &": store_workflow_answers,
    "import numpy as np, torch, torch.nn as nn, torch.nn.functional as F": quickstart_learns_and_predicts,
    "config = te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2))": config_has_two_replicas,
    "from torchestimator.data import (FixedLenFeature, VarLenFeature, TFRecordDataset, TFRecordWriter,": tfrecord_input_fn_gives_batches,
    "from torchestimator.warm_start import WarmStartSettings": warm_start_loads_the_quickstart,
    "from torchestimator.export import TensorSpec, serving_input_receiver": best_model_is_kept,
    "from torchestimator.export import TensorSpec, serving_input_receiver, load": export_loads_and_predicts,
    "import onnxruntime": onnx_gives_the_exported_classes,
    "torchestimator convert csv-to-tfrecord index.csv out/train --num_shards 4   # label,path[,other columns]": records_are_written_and_verified,
    "torchestimator warm-start --dry_run --model model.py keras_model.weights.h5 --accept_proposed \\": keras_weights_are_written_converted,
    "torchestimator export torchestimator.cli.demo --model_dir runs/digits --export_dir export/digits": server_answers_the_request,
    "from torchestimator.cli.demo import load_digits_split": client_gets_predictions,
    "import base64, io, json": examples_receiver_answers_as_the_model,
    "torchestimator predict --exported export/digits_images --input image_request.json": image_request_answers_as_the_model,
}

# Blocks waiting on a feature another change is adding: block key -> "waiting on: ..." (xfail while it fails).
PENDING: dict[str, str] = {}


# ---------------------------------------------------------------- names: each Python block stands on the ones above


def _bound_and_used(text: str) -> tuple[set[str], set[str]]:
    """The names a block binds at top level, and the global names it reads (in any of its scopes)."""
    table = symtable.symtable(text, "block", "exec")
    bound = {symbol.get_name() for symbol in table.get_symbols() if symbol.is_assigned() or symbol.is_imported()}
    used: set[str] = set()
    pending = [table]
    while pending:
        scope = pending.pop()
        for symbol in scope.get_symbols():
            top_level_read = scope is table and symbol.is_referenced()
            if top_level_read or (scope is not table and symbol.is_global() and symbol.is_referenced()):
                used.add(symbol.get_name())
        pending.extend(scope.get_children())
    return bound, used


def undefined_names(block: Block) -> set[str]:
    defined = set(dir(builtins))
    for earlier in BLOCKS[: BLOCKS.index(block)]:
        if earlier.language == "python" and runs(earlier):
            defined |= _bound_and_used(earlier.text)[0]
    bound, used = _bound_and_used(block.text)
    return used - bound - defined


# ---------------------------------------------------------------- the tests


def test_every_block_is_run_or_listed():
    keys = [block.key for block in BLOCKS]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    assert not repeated, f"README blocks must differ in their first line (their key here); repeated: {repeated}"
    unhandled = [
        block.label
        for block in BLOCKS
        if not runs(block) and block.key not in NOT_RUNNABLE and block.key not in TEXT_CHECKS
    ]
    assert not unhandled, f"README blocks neither run nor listed in NOT_RUNNABLE/TEXT_CHECKS: {unhandled}"
    for table_name, table in [
        ("NOT_RUNNABLE", NOT_RUNNABLE),
        ("TEXT_CHECKS", TEXT_CHECKS),
        ("BEFORE", BEFORE),
        ("EARLIER_COMMANDS", EARLIER_COMMANDS),
        ("CHECKS_AFTER", CHECKS_AFTER),
        ("PENDING", PENDING),
    ]:
        stale = sorted(set(table) - set(keys))
        assert not stale, f"{table_name} lists blocks the README no longer has (first lines): {stale}"


@pytest.mark.parametrize("block", [block for block in BLOCKS if block.language == "python"], ids=lambda b: b.label)
def test_python_block_uses_only_names_defined_above(block):
    """A reader running the README top to bottom meets no name that no block above defined."""
    names_are_defined_above(block)


@pytest.mark.parametrize("block", [block for block in BLOCKS if not runs(block)], ids=lambda b: b.label)
def test_listed_block_partial_check(block, tmp_path):
    if block.key not in NOT_RUNNABLE and block.key not in TEXT_CHECKS:
        pytest.fail(f"README.md:{block.line} ({block.language or 'plain'}) is neither run nor listed")
    listed = NOT_RUNNABLE.get(block.key)
    if listed is not None and listed.check is None:
        pytest.skip(f"README.md:{block.line} is not run here: {listed.reason}")
    check = TEXT_CHECKS[block.key] if listed is None else listed.check
    try:
        if "workdir" in inspect.signature(check).parameters:
            check(block, workdir=tmp_path)
        else:
            check(block)
    except AssertionError:
        if block.key in PENDING:
            pytest.xfail(PENDING[block.key])
        raise


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    return ReadmeRun(tmp_path_factory.mktemp("readme"))


@pytest.mark.slow
@pytest.mark.timeout(900)  # a block run alone (-k) first runs every block above it
@pytest.mark.parametrize("block", [block for block in BLOCKS if runs(block)], ids=lambda b: b.label)
def test_readme_block_runs_as_written(block, readme_run):
    outcome = readme_run.outcome(block)
    if not outcome.ok and block.key in PENDING:
        pytest.xfail(PENDING[block.key])
    assert outcome.ok, f"README.md:{block.line} failed:\n{outcome.error}"
    if block.key in CHECKS_AFTER:
        CHECKS_AFTER[block.key](readme_run, outcome)


@pytest.mark.slow
def test_quickstart_rerun_resumes_with_the_same_results(tmp_path):
    """Issue 13, point 2: the Quickstart saved as a script and run twice, a fresh process each time (a user
    rerunning it): the second run resumes at step 1000 and prints the first run's evaluation, digit for digit."""
    quickstart = block_with_key("import numpy as np, torch, torch.nn as nn, torch.nn.functional as F")
    (tmp_path / "quickstart.py").write_text(quickstart.text)
    runs_output, runs_log = [], []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "quickstart.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240
        )
        assert result.returncode == 0, result.stderr
        runs_output.append(result.stdout)
        runs_log.append(result.stderr)
    first, second = (printed_literal(output, "{") for output in runs_output)
    assert first["global_step"] == second["global_step"] == 1000
    assert second == first, (first, second)
    assert runs_output[1] == runs_output[0]  # the predicted classes too
    # The README quotes the line each call prints on stderr by default: trained, then skipped on the rerun.
    assert "torchestimator: trained runs/quickstart from step 0 to 1000 in " in runs_log[0], runs_log[0]
    assert (
        "torchestimator: skipped training: runs/quickstart is already at step 1000 (max_steps=1000)" in runs_log[1]
    ), runs_log[1]
