"""Every fenced code block of README.md and of the docs pages (docs/), run as written (issue 13, "Done means"; 29.9).

A reader follows a page top to bottom: each page's Python blocks run in page order in one namespace, in one
temporary working folder of the page's own (the pages' paths are relative: runs/quickstart, export/digits); its
bash blocks run in that folder through `bash -e` with this venv's bin first on PATH (as the docs say: the venv
activated). A page whose examples continue the Quickstart says so and links to it; here the Quickstart block runs
first in that page's namespace (PRELUDES), resuming from a copy of the model_dir it trained, as a reader's rerun
does. Files a reader is supposed to bring (their CSV index) are made beforehand (BEFORE); a command that needs an
earlier command's state gets it by running that command first (EARLIER_COMMANDS). Blocks that cannot run on one
machine by their nature (several machines, SLURM, Ray, the network) are listed in NOT_RUNNABLE with the reason and,
where that is honest, a partial check (flags parsed by the real parser, `bash -n`, TF_CONFIG resolved); the plain
error-tree block is compared with torchestimator.errors. test_every_block_is_run_or_listed fails on a block of any
page that is neither run nor listed, on a listed block that is gone, and on a docs page this file does not cover,
so a new block or page cannot slip through untested. The API reference pages are checked against each package's
public names (test_api_reference_lists_each_public_name).

Blocks are keyed by their first non-empty line: editing a block's first line means updating its key here. A key
names one block within a page; the same key on two pages must be the same block, word for word (README.md and
docs/index.md both show the two commands), and one entry here then covers both.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import importlib
import importlib.util
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
from helpers import fenced_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
VENV_BIN = Path(sys.executable).parent
BASH_BLOCK_TIMEOUT = 300  # s; a bash block that runs longer is stopped (with its background jobs) and fails
SERVING_PORT = 8501  # the serving page's serve commands use TF Serving's default port, as a user would

OTHER_TESTS: dict[str, str] = {
    "docs/porting-from-tf-estimator.md": "tests/test_porting_doc.py",
}
"""Pages whose blocks another test module runs: page -> that module."""

NOT_PAGES: dict[str, str] = {
    "docs/decisions/": "design records (the history of decisions, linked from DESIGN.md), not instructions to run",
}
"""Folders of docs/ whose Markdown files are not pages this file runs: folder -> why."""


# ---------------------------------------------------------------- the pages and their blocks


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: str
    """The page's path from the repository root: README.md, docs/data.md."""
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
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def label(self) -> str:
        page = Path(self.page).stem if self.page != "README.md" else "README"
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.key)[:40].strip("-")
        return f"{page}-L{self.line}-{self.language or 'plain'}-{slug}"


def page_blocks(page: str, text: str) -> list[Block]:
    """Every fenced block of a Markdown page, in order (helpers.fenced_blocks)."""
    return [Block(page, line, language, body) for line, language, body in fenced_blocks(page, text)]


def markdown_pages() -> list[str]:
    """README.md, then docs/index.md, then every other Markdown file under docs/ (paths from the root)."""
    found = sorted(path.relative_to(ROOT).as_posix() for path in DOCS.rglob("*.md"))
    found = [page for page in found if not any(page.startswith(folder) for folder in NOT_PAGES)]
    return ["README.md"] + sorted(found, key=lambda page: (page != "docs/index.md", page))


PAGES = [page for page in markdown_pages() if page not in OTHER_TESTS]
BLOCKS = [block for page in PAGES for block in page_blocks(page, (ROOT / page).read_text(encoding="utf-8"))]


def block_with_key(key: str) -> Block:
    return next(block for block in BLOCKS if block.key == key)


# ---------------------------------------------------------------- partial checks of blocks that cannot run here


def bash_syntax_is_valid(block: Block) -> None:
    result = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"{block.where}: bash -n: {result.stderr}"


def setup_command_is_ci_command(block: Block) -> None:
    """The test command is the one .ci/run runs, as the README and docs/index.md say."""
    bash_syntax_is_valid(block)
    assert block.key in (ROOT / ".ci" / "run").read_text().splitlines(), (
        ".ci/run no longer runs the pages' test command"
    )


def setup_command_uses_the_lock(block: Block) -> None:
    """It installs from the lock file, which pins the CPU torch the pages name."""
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


def tf1_flags_make_each_tasks_tf_config(block: Block) -> None:
    """`bash -n`; the command parses with launch's own parser, and with --task_index 0 to 3 (as its comment says)
    makes the TF_CONFIG of the chief (worker 0, at host0) and of workers 0 to 2, without torchrun."""
    from torchestimator.distribute.launcher import parse_launch_arguments, tf1_task_tf_config

    bash_syntax_is_valid(block)
    words = shlex.split(block.text.replace("\\\n", " "), comments=True)
    assert words[:2] == ["torchestimator", "launch"], words
    tasks = []
    for index in range(4):
        argv = [str(index) if before == "--task_index" else word for before, word in zip(["", *words[2:]], words[2:])]
        with environ_restored():
            arguments = parse_launch_arguments(argv)
            tf_config = tf1_task_tf_config(arguments, environ={})
        assert arguments.training_script == "train.py", arguments
        assert tf_config["cluster"] == {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222", "host3:2222"]}
        tasks.append((tf_config["task"]["type"], tf_config["task"]["index"]))
    assert tasks == [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)], tasks


def names_are_defined_above(block: Block) -> None:
    """A block shown but not run still refers only to names it defines or earlier run blocks define."""
    undefined = undefined_names(block)
    assert not undefined, (
        f"{block.where} uses {sorted(undefined)}, defined by no block above it on its page or its prelude"
    )


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
            assert flag in parser._option_string_actions, f"{block.where}: {words[1]} has no {flag} ({line})"


def tf_client_calls_are_the_tools(block: Block) -> None:
    """TF Serving's own client (needs TensorFlow): valid Python whose TF calls tools/check_tf_serving_grpc_client.py
    makes against serve --port in the comparison environment."""
    tree = ast.parse(block.text)
    called = {
        node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    tool = (ROOT / "tools" / "check_tf_serving_grpc_client.py").read_text()
    for name in ("PredictionServiceStub", "make_tensor_proto", "make_ndarray", "Predict"):
        assert name in called and f".{name}(" in tool, f"{block.where}: {name} is not what the tool checks"


@dataclasses.dataclass(frozen=True)
class NotRunnable:
    reason: str
    check: Callable[..., None] | None = None
    """A partial check: takes the block, and a temporary folder as `workdir` when it declares one."""


SETUP = (
    "python3 -m venv .venv && .venv/bin/pip install -q -r requirements-lock.txt && "
    ".venv/bin/pip install -q --no-deps -e . && "
)  # the start of the two commands (README.md and docs/index.md)

NOT_RUNNABLE: dict[str, NotRunnable] = {
    SETUP + ".venv/bin/torchestimator demo": NotRunnable(
        "the pages' own setup command: it creates a venv and installs from PyPI; CI runs it from a "
        "fresh clone. Its last part, `torchestimator demo`, runs before the serving page's first block here",
        setup_command_uses_the_lock,
    ),
    SETUP + "{ ! command -v npm > /dev/null || npm ci --loglevel=error --no-audit --no-fund --prefix tests/azurite; } "
    "&& scripts/check && .venv/bin/python -m pytest -q && TORCHESTIMATOR_PURE_PYTHON=1 .venv/bin/python -m pytest -q -m "
    '"not slow or compiled_path"': NotRunnable(
        "the pages' own test command, which is what CI runs (.ci/run)", setup_command_is_ci_command
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
    "# on host0 to host3, one command each: --task_index 0 to 3 (worker 0 is the chief)": NotRunnable(
        "four hosts, one command on each (the parameter-server section runs TF 1.x flags on 127.0.0.1)",
        tf1_flags_make_each_tasks_tf_config,
    ),
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
        assert match, f"{block.where}: cannot read the tree line {line!r}"
        depth = len(match["indent"]) // 4 + (1 if match["branch"] else 0)
        cls = getattr(errors, match["name"], None)
        assert isinstance(cls, type), (
            f"the error tree ({block.where}) names {match['name']}, not in torchestimator.errors"
        )
        stated = set(parents[depth - 1 : depth]) | ({getattr(builtins, match["base"])} if match["base"] else set())
        bases = set(cls.__bases__) - {errors.PicklableError}  # the pickling mixin is no kind of error to catch
        assert bases == stated, f"{match['name']}: {block.where} says bases {stated}, it has {cls.__bases__}"
        del parents[depth:]
        parents.append(cls)
        named.add(match["name"])
    exported = {
        name
        for name in errors.__all__
        if isinstance(getattr(errors, name), type) and issubclass(getattr(errors, name), BaseException)
    }
    assert exported - named == set(), f"the error tree ({block.where}) misses {sorted(exported - named)}"


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


def serving_port_is_free(workdir: Path) -> None:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", SERVING_PORT)) == 0:
            raise AssertionError(
                f"port {SERVING_PORT} already answers on this machine: the serving page's serve block "
                "uses TF Serving's default port; stop what listens there and rerun"
            )


# Made in the working folder before the block runs: the reader's own files, or a condition the block needs.
def copy_keras_model(workdir: Path) -> None:
    """The warm-start page's model.keras: a Keras 3 image classifier made by Keras (tests/fixtures/keras_models)."""
    shutil.copy(ROOT / "tests" / "fixtures" / "keras_models" / "cnn.keras", workdir / "model.keras")


def keras_model_in_the_clone(workdir: Path) -> None:
    """The README's Keras block runs in the clone's root: its tests/fixtures/keras_models/cnn.keras is there."""
    (workdir / "tests" / "fixtures" / "keras_models").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixtures" / "keras_models" / "cnn.keras", workdir / "tests/fixtures/keras_models")
    serving_port_is_free(workdir)


BEFORE: dict[str, Callable[[Path], None]] = {
    "cp tests/fixtures/keras_models/cnn.keras model.keras                # a Keras 3 file, made by Keras": keras_model_in_the_clone,
    "# model.keras: a Keras 3 image classifier (inputs 12x11x3, channels-last; 5 classes)": copy_keras_model,
    "torchestimator convert csv-to-tfrecord index.csv out/train --num_shards 4   # label,path[,other columns]": write_index_csv,
    "torchestimator export torchestimator.cli.demo --model_dir runs/digits --export_dir export/digits": serving_port_is_free,
}

# "after the demo has trained runs/digits": the demo's command, the last part of the first of the two commands.
EARLIER_COMMANDS: dict[str, str] = {
    "torchestimator export torchestimator.cli.demo --model_dir runs/digits --export_dir export/digits": "torchestimator demo\n",
}

QUICKSTART = "import numpy as np, torch, torch.nn as nn, torch.nn.functional as F"
"""The Quickstart's key (docs/index.md): the block the other pages' examples continue."""

# page -> blocks of other pages run first in its namespace: the page's text says it continues them, and links there.
PRELUDES: dict[str, list[str]] = {
    "docs/train-and-evaluate.md": [QUICKSTART],
    "docs/warm-start.md": [QUICKSTART],
    "docs/distributed.md": [QUICKSTART],
    "docs/export.md": [QUICKSTART],
}

# A prelude block's model_dir, trained once by the first page that ran it and copied into each later page's folder,
# so that the block resumes there (training skipped, as a reader's rerun) instead of training again.
TRAINS: dict[str, str] = {QUICKSTART: "runs/quickstart"}


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


def runs(block: Block) -> bool:
    return block.key not in NOT_RUNNABLE and block.key not in TEXT_CHECKS and block.language in ("python", "bash")


def prelude(page: str) -> list[Block]:
    return [block_with_key(key) for key in PRELUDES.get(page, [])]


class PageRun:
    """One page run top to bottom in a folder of its own: its prelude first, then its blocks on demand, in
    order, each once."""

    def __init__(self, page: str, workdir: Path, trained: dict[str, Path]) -> None:
        self.page = page
        self.workdir = workdir
        self.trained = trained
        """TRAINS' model_dirs as first trained, shared by the pages of one session: key -> a copy."""
        self.namespace: dict = {"__name__": "docs"}
        self.outcomes: dict[int, Outcome] = {}
        self.prelude_failure: Outcome | None = None
        self.prelude_done = False
        (workdir / ".blocks").mkdir()

    def outcome(self, block: Block) -> Outcome:
        assert block.page == self.page, (block.where, self.page)
        if not self.prelude_done:
            self.prelude_done = True
            for earlier in prelude(self.page):
                result = self._run(earlier)
                if not result.ok:
                    self.prelude_failure = dataclasses.replace(
                        result, error=f"the prelude block {earlier.where} failed: {result.error}"
                    )
                    break
        if self.prelude_failure is not None:
            return self.prelude_failure
        page_blocks_in_order = [each for each in BLOCKS if each.page == self.page]
        for earlier in page_blocks_in_order[: page_blocks_in_order.index(block) + 1]:
            if earlier.line not in self.outcomes and runs(earlier):
                self.outcomes[earlier.line] = self._run(earlier)
        failed_before = [line for line, outcome in self.outcomes.items() if line < block.line and not outcome.ok]
        result = self.outcomes[block.line]
        if not result.ok and failed_before:
            result = dataclasses.replace(
                result, error=f"{result.error}\n(earlier blocks of {self.page} failed too: lines {failed_before})"
            )
        return result

    def _run(self, block: Block) -> Outcome:
        try:
            if block.key in TRAINS and block.key in self.trained:
                shutil.copytree(self.trained[block.key], self.workdir / TRAINS[block.key])
            if block.key in BEFORE:
                BEFORE[block.key](self.workdir)
            if block.key in EARLIER_COMMANDS:
                earlier = self._bash(EARLIER_COMMANDS[block.key], f"before-L{block.line}")
                if not earlier.ok:
                    return dataclasses.replace(earlier, error=f"the command run before it failed: {earlier.error}")
        except Exception:
            return Outcome(False, "", f"preparing {block.where}: {traceback.format_exc()}")
        if block.language == "python":
            result = self._python(block)
        else:
            result = self._bash(block.text, f"L{block.line}")
        if result.ok and block.key in TRAINS and block.key not in self.trained:
            keep = self.workdir.parent / f"trained-{len(self.trained)}"
            shutil.copytree(self.workdir / TRAINS[block.key], keep)
            self.trained[block.key] = keep
        return result

    @contextlib.contextmanager
    def inside(self):
        """In the working folder, where the page's relative paths point."""
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
                exec(compile(block.text, block.where, "exec"), self.namespace)
        except Exception:
            return Outcome(False, stdout.getvalue(), f"{traceback.format_exc()}\nstderr:\n{stderr.getvalue()[-3000:]}")
        return Outcome(True, stdout.getvalue())

    def _bash(self, text: str, name: str) -> Outcome:
        script = self.workdir / ".blocks" / f"{name}.sh"
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


# ---------------------------------------------------------------- what each run block must show


def printed_literal(output: str, start: str):
    line = next(line for line in output.splitlines() if line.startswith(start))
    return ast.literal_eval(line)


def example_learns_and_exports(run: PageRun, outcome: Outcome) -> None:
    """The README's example: evaluated at step 300 with the rule learned, and one export version written."""
    results = printed_literal(outcome.output, "{")
    assert results["global_step"] == 300 and results["accuracy"] >= 0.9, results
    versions = [entry.name for entry in (run.workdir / "export" / "example").iterdir() if entry.name.isdigit()]
    assert len(versions) == 1 and outcome.output.splitlines()[-1].endswith(versions[0]), (versions, outcome.output)


def quickstart_learns_and_predicts(run: PageRun, outcome: Outcome) -> None:
    results = printed_literal(outcome.output, "{")
    assert results["global_step"] == 1000 and results["accuracy"] >= 0.9, results  # labels follow a linear rule
    classes = outcome.output.splitlines()[1:]
    assert len(classes) == 5 and all(0 <= int(value) <= 9 for value in classes), outcome.output


def batches_split_across_replicas(run: PageRun, outcome: Outcome) -> None:
    """Repeat then batch across the epoch boundary, and replica 1 of 2 reads the second half of each global batch."""
    lines = [ast.literal_eval(line) for line in outcome.output.splitlines()]
    assert lines[:5] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]], lines
    assert lines[5:] == [[2, 3], [6, 7], [0, 1], [4, 5], [8, 9]], lines


def config_has_two_replicas(run: PageRun, outcome: Outcome) -> None:
    import torchestimator as te

    assert isinstance(run.namespace["config"].train_distribute, te.MirroredStrategy)


def tfrecord_input_fn_gives_batches(run: PageRun, outcome: Outcome) -> None:
    """Beyond running the block: its input_fn reads the file it wrote, as the block says."""
    import torch

    import torchestimator as te

    with run.inside():
        features, labels = next(iter(run.namespace["tfrecord_input_fn"](te.InputContext())))
    assert labels.tolist() == [3] * len(labels) and 0 < len(labels) <= 32
    assert torch.allclose(features["dense"], torch.tensor([[0.1, 0.2]] * len(labels)))


def lazy_layers_get_their_shapes(run: PageRun, outcome: Outcome) -> None:
    """Shaped by the dry forward on the first batch (64 features in), then restored by an Estimator that only
    evaluates: the checkpoint gives the shapes, and the results are the trained model's."""
    shape, results = outcome.output.splitlines()[:2]
    assert shape == "(32, 64)", outcome.output
    results = ast.literal_eval(results)
    assert results["global_step"] == 100 and results["accuracy"] > 0.3, results  # 10 classes: chance is 0.1


def warm_start_loads_the_quickstart(run: PageRun, outcome: Outcome) -> None:
    assert "Warm start from runs/quickstart (torchestimator)" in outcome.output and "9 to load" in outcome.output
    assert run.namespace["estimator"].latest_checkpoint().endswith("ckpt-500")


def best_model_is_kept(run: PageRun, outcome: Outcome) -> None:
    exports = run.namespace["exports"]
    assert exports, "train_and_evaluate returned no exports"
    assert "ckpt-" in outcome.output.splitlines()[-1], outcome.output


def export_loads_and_predicts(run: PageRun, outcome: Outcome) -> None:
    versions = [entry.name for entry in (run.workdir / "export" / "digits").iterdir()]
    assert [name for name in versions if name.isdigit()], versions
    assert re.fullmatch(r"(tensor\()?\[(\d[ ,]*){3}\]\)?\n", outcome.output), outcome.output  # three classes


def onnx_gives_the_exported_classes(run: PageRun, outcome: Outcome) -> None:
    namespace = run.namespace
    expected = namespace["model"]({"image": namespace["x"][:3]})["class"]
    assert [int(value) for value in namespace["outputs"]["serving_default/class"]] == [int(value) for value in expected]


def warmup_file_is_written(run: PageRun, outcome: Outcome) -> None:
    assert outcome.output == "['tf_serving_warmup_requests']\n", outcome.output


def records_are_written_and_verified(run: PageRun, outcome: Outcome) -> None:
    from torchestimator.data import read_records

    shards = sorted((run.workdir / "out").glob("train-*-of-00004.tfrecord"))
    assert len(shards) == 4 and sum(1 for _ in read_records([str(path) for path in shards])) == 8
    assert "Traceback" not in outcome.output


def keras_files_are_made(run: PageRun, outcome: Outcome) -> None:
    """The block's model.py builds the module, and its file reads as a Keras 3 weights file (the h5 reader)."""
    from torchestimator.interop import open_weights

    with open_weights(str(run.workdir / "keras_model.weights.h5")) as source:
        assert source.format == "keras3_weights_h5", source.format
        assert len(list(source.tensors())) == 8


def keras_weights_are_written_converted(run: PageRun, outcome: Outcome) -> None:
    """The dry run writes nothing; --write leaves a step-0 checkpoint holding the Keras file's values in PyTorch
    layouts, BatchNorm's running statistics included (--include_buffers)."""
    import h5py
    import numpy as np

    from torchestimator.interop import open_weights

    assert "8 to load" in outcome.output and "nothing was written" in outcome.output, outcome.output
    assert "Not selected" not in outcome.output, "--include_buffers left buffers out of the plan"
    assert sorted(path.name for path in (run.workdir / "runs" / "from_keras").glob("ckpt-*")) == ["ckpt-0"]
    with h5py.File(run.workdir / "keras_model.weights.h5", "r") as file:

        def keras(layer, index):
            return np.asarray(file[f"layers/{layer}/vars/{index}"])

        with open_weights(str(run.workdir / "runs" / "from_keras")) as written:

            def value(name):
                return np.asarray(written.read(name))

            assert np.array_equal(value("0.weight"), keras("conv2d", 0).transpose(3, 2, 0, 1))  # HWIO -> OIHW
            assert np.array_equal(value("4.bias"), keras("dense", 1))
            for index, name in enumerate(["weight", "bias", "running_mean", "running_var"]):
                assert np.array_equal(value(f"1.{name}"), keras("batch_normalization", index)), name
            # Keras flattened H, W, C; torch flattens C, H, W: the converter reorders the Dense kernel's rows.
            nhwc_rows = keras("dense", 0).reshape(6, 6, 4, 5).transpose(2, 0, 1, 3).reshape(144, 5)
            assert np.array_equal(value("4.weight"), nhwc_rows.T)


def server_answers_the_request(run: PageRun, outcome: Outcome) -> None:
    assert re.search(r"serving digits \(version \d+ AVAILABLE\) at http://127\.0\.0\.1:8501", outcome.output), (
        "the curl answers did not come from this block's server:\n" + outcome.output
    )
    start = outcome.output.index('{"predictions"')  # curl's answer, as the server wrote it
    answer, _ = json.JSONDecoder().raw_decode(outcome.output[start:])
    assert len(answer["predictions"]) == 2 and all(0 <= row["class"] <= 9 for row in answer["predictions"])


def keras_model_is_fine_tuned_and_served(run: PageRun, outcome: Outcome) -> None:
    """The README's Keras block: the module printed, the program written, training moved the loss off chance
    (ln 5 = 1.61), and the server answered with the exported model's predictions."""
    assert (
        "(logits): Dense(24, 5, bias=True, activation=linear)" in outcome.output
        and (run.workdir / "model.pt2").is_file()
    )
    loss = float(
        re.search(r"trained runs/keras_cnn from step 0 to 200 in .* \(final loss ([\d.]+)\)", outcome.output)[1]
    )
    assert loss < 1.5, outcome.output
    assert re.search(r"serving keras_cnn \(version \d+ AVAILABLE\) at http://127\.0\.0\.1:8501", outcome.output)
    start = outcome.output.index('{"predictions"')
    answer, _ = json.JSONDecoder().raw_decode(outcome.output[start:])
    assert [len(row["probabilities"]) for row in answer["predictions"]] == [5, 5]
    assert all(abs(sum(row["probabilities"]) - 1) < 1e-5 and 0 <= row["class"] < 5 for row in answer["predictions"])


def client_gets_predictions(run: PageRun, outcome: Outcome) -> None:
    predictions = printed_literal(outcome.output, "[")
    assert len(predictions) == 2 and all(0 <= row["class"] <= 9 for row in predictions)
    assert "'AVAILABLE'" in outcome.output.splitlines()[1]


def grpc_answers_with_the_version(run: PageRun, outcome: Outcome) -> None:
    """The Python client's line: the version that answered, then the two rows' classes."""
    answer = re.search(r"^(\d+) \[(\d) (\d)\]$", outcome.output, re.MULTILINE)
    assert answer and int(answer.group(1)) > 0, outcome.output


def examples_receiver_answers_as_the_model(run: PageRun, outcome: Outcome) -> None:
    """Serialized Examples sent as {"b64"} through the server give the classes of the export fed x[:3]."""
    from torchestimator.export import load

    rows = printed_literal(outcome.output, "[")
    model = load(run.workdir / "export" / "digits_examples")
    assert [row["class"] for row in rows] == model({"image": run.namespace["x"][:3]})["class"].tolist()


def image_request_answers_as_the_model(run: PageRun, outcome: Outcome) -> None:
    """predict --exported on the {"b64"} image request answers the classes of the export fed the PNG bytes."""
    from torchestimator.export import load

    answer = json.loads(outcome.output)
    model = load(run.workdir / "export" / "digits_images")
    assert [row["class"] for row in answer["predictions"]] == model(run.namespace["pngs"])["class"].tolist()


def store_workflow_answers(run: PageRun, outcome: Outcome) -> None:
    """The object-storage block trained into the bucket, listed the run, and the server it started from the
    bucket answered two predictions."""
    assert "digits demo: trained from scratch to step 200 in s3://my-bucket/runs/digits" in outcome.output
    assert "model_dir s3://my-bucket/runs/digits: 1 checkpoint(s)" in outcome.output
    assert "best export: s3://my-bucket/runs/digits/export/best/" in outcome.output
    answer, _ = json.JSONDecoder().raw_decode(outcome.output[outcome.output.index('{"predictions"') :])
    assert len(answer["predictions"]) == 2 and {"class", "probabilities"} <= set(answer["predictions"][0])
    assert "Found credentials" not in outcome.output  # the clients' INFO lines stay out of the CLI's output


def latest_step(model_dir: Path) -> int:
    return max((int(path.name.split("-")[1]) for path in model_dir.glob("ckpt-*")), default=-1)


def parameter_servers_train(run: PageRun, outcome: Outcome) -> None:
    """The four tasks of the TF_CONFIG block all exited 0 (bash -e): the chief evaluated past max_steps with the
    rule learned well above chance, wrote its checkpoint, and the workers and the ps returned None."""
    results = printed_literal(outcome.output, "{")
    assert results["global_step"] >= 600 and results["accuracy"] >= 0.5, results
    assert latest_step(run.workdir / "runs" / "ps") >= 600
    assert "served variables as a parameter server for runs/ps until the chief ended training" in outcome.output
    assert outcome.output.splitlines().count("None") == 3, outcome.output  # two workers and the ps


def tf1_flags_train_with_parameter_servers(run: PageRun, outcome: Outcome) -> None:
    """launch made worker 0 the chief and its TF_CONFIG, the job trained to max_steps, and its ps served."""
    assert "worker 0 is the chief, as in TF 1.x; TF_CONFIG names it chief:0" in outcome.output, outcome.output
    results = printed_literal(outcome.output, "{")
    assert results["global_step"] >= 600 and results["accuracy"] >= 0.5, results
    assert latest_step(run.workdir / "runs" / "ps_tf1") >= 600
    assert "served variables as a parameter server" in (run.workdir / "tf1-ps:0.log").read_text()


CHECKS_AFTER: dict[str, Callable[[PageRun, Outcome], None]] = {
    "import numpy as np, torch, torch.nn as nn, torch.nn.functional as F": quickstart_learns_and_predicts,
    "import torch, torch.nn as nn, torch.nn.functional as F": example_learns_and_exports,
    "# 10 examples, a global batch of 4, two epochs": batches_split_across_replicas,
    "python -m moto.server -p 9000 > moto.log 2>&1 &": store_workflow_answers,
    "config = te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2))": config_has_two_replicas,
    "cat > train.py <<'EOF'": parameter_servers_train,
    'read worker0 worker1 worker2 ps0 < <(python -c "from torchestimator.distribute import find_free_port as port; '
    "print(*(f'127.0.0.1:{port()}' for _ in range(4)))\")": tf1_flags_train_with_parameter_servers,
    "from torchestimator.data import (FixedLenFeature, VarLenFeature, TFRecordDataset, TFRecordWriter,": tfrecord_input_fn_gives_batches,
    "def build_lazy_model(params):                          # no input sizes, as tf.layers.dense": lazy_layers_get_their_shapes,
    "from torchestimator.warm_start import WarmStartSettings": warm_start_loads_the_quickstart,
    "from torchestimator.export import TensorSpec, serving_input_receiver": best_model_is_kept,
    "from torchestimator.export import TensorSpec, serving_input_receiver, load": export_loads_and_predicts,
    "import onnxruntime": onnx_gives_the_exported_classes,
    "import os": warmup_file_is_written,
    "torchestimator convert csv-to-tfrecord index.csv out/train --num_shards 4   # label,path[,other columns]": records_are_written_and_verified,
    "cat > model.py <<'EOF'": keras_files_are_made,
    "torchestimator warm-start --dry_run --model model.py keras_model.weights.h5 --accept_proposed --include_buffers \\": keras_weights_are_written_converted,
    "torchestimator export torchestimator.cli.demo --model_dir runs/digits --export_dir export/digits": server_answers_the_request,
    "cp tests/fixtures/keras_models/cnn.keras model.keras                # a Keras 3 file, made by Keras": keras_model_is_fine_tuned_and_served,
    "from torchestimator.cli.demo import load_digits_split": client_gets_predictions,
    "torchestimator serve --model_name digits --model_base_path export/digits --port 8500 --rest_api_port 8501 &": grpc_answers_with_the_version,
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
    same_page = [each for each in BLOCKS if each.page == block.page]
    for earlier in prelude(block.page) + same_page[: same_page.index(block)]:
        if earlier.language == "python" and runs(earlier):
            defined |= _bound_and_used(earlier.text)[0]
    bound, used = _bound_and_used(block.text)
    return used - bound - defined


# ---------------------------------------------------------------- the API reference pages


def public_names(module: str) -> list[str]:
    """A public package's or module's names: its TYPE_CHECKING block (lazy packages) or its __all__."""
    from torchestimator._lazy import declared_exports

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    if "lazy_exports(" in Path(spec.origin).read_text(encoding="utf-8"):
        return sorted(declared_exports(module, spec.origin).origins)
    return sorted(importlib.import_module(module).__all__)


def reference_pages() -> dict[str, list[str]]:
    """docs/reference/*.md: module -> the members its `::: module` directive lists (mkdocstrings options)."""
    pages = {}
    for path in sorted((DOCS / "reference").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        directive = re.search(r"^::: (\S+)\n    options:\n      members:\n((?:        - \w+\n)+)", text, re.MULTILINE)
        if directive is None:
            assert ":::" not in text, f"{path}: a `:::` directive this test cannot read"
            continue
        pages[directive.group(1)] = re.findall(r"- (\w+)", directive.group(2))
    return pages


NOT_IN_REFERENCE: dict[str, str] = {
    "torchestimator.cli": "its interface is the command line (docs/cli.md), not Python names",
    "torchestimator.estimator": "te.estimator mirrors tf.estimator's layout: aliases of names documented elsewhere",
}


# ---------------------------------------------------------------- the tests


def test_every_block_is_run_or_listed():
    keys = [block.key for block in BLOCKS]
    for page in PAGES:
        on_page = [block.key for block in BLOCKS if block.page == page]
        repeated = sorted({key for key in on_page if on_page.count(key) > 1})
        assert not repeated, f"{page}: blocks must differ in their first line (their key here); repeated: {repeated}"
    for key in set(keys):
        copies = {block.text for block in BLOCKS if block.key == key}
        where = [block.where for block in BLOCKS if block.key == key]
        assert len(copies) == 1, f"blocks with the first line {key!r} differ ({where}): make them one, or change a key"
    unhandled = [
        f"{block.where} {block.label}"
        for block in BLOCKS
        if not runs(block) and block.key not in NOT_RUNNABLE and block.key not in TEXT_CHECKS
    ]
    assert not unhandled, f"blocks neither run nor listed in NOT_RUNNABLE/TEXT_CHECKS: {unhandled}"
    for table_name, table in [
        ("NOT_RUNNABLE", NOT_RUNNABLE),
        ("TEXT_CHECKS", TEXT_CHECKS),
        ("BEFORE", BEFORE),
        ("EARLIER_COMMANDS", EARLIER_COMMANDS),
        ("CHECKS_AFTER", CHECKS_AFTER),
        ("PENDING", PENDING),
        ("TRAINS", TRAINS),
    ]:
        stale = sorted(set(table) - set(keys))
        assert not stale, f"{table_name} lists blocks no page has any longer (first lines): {stale}"
    stale_pages = sorted(set(PRELUDES) - set(PAGES))
    assert not stale_pages, f"PRELUDES names pages that are gone: {stale_pages}"
    for page, keys_first in PRELUDES.items():
        for key in keys_first:
            source = block_with_key(key)
            link = f"({Path(os.path.relpath(ROOT / source.page, (ROOT / page).parent)).as_posix()}#"
            assert link in (ROOT / page).read_text(encoding="utf-8"), (
                f"{page} runs {source.where} first: its text must say so and link there ({link}...)"
            )


def test_every_page_is_covered():
    """Each Markdown file of the repository's docs is run here, run by the test module named in OTHER_TESTS (which
    exists), or in a folder of NOT_PAGES; the site's nav lists every page."""
    pages = set(markdown_pages())
    assert set(PAGES) | set(OTHER_TESTS) >= pages and "README.md" in PAGES and "docs/index.md" in PAGES
    for page, module in OTHER_TESTS.items():
        if (ROOT / page).exists():
            assert (ROOT / module).is_file(), f"{page} is said to be run by {module}, which does not exist"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = sorted(page for page in pages | set(OTHER_TESTS) if page != "README.md" and page[5:] not in nav)
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


def test_the_two_commands_are_the_same_in_the_readme_and_getting_started():
    """README.md and docs/index.md show the same two commands, word for word, and both are the listed ones (the
    test command being .ci/run's): editing one copy, or both, fails here before the slow run would try it."""
    for page in ("README.md", "docs/index.md"):
        commands = [block.key for block in BLOCKS if block.page == page and block.key.startswith(SETUP)]
        assert len(commands) == 2 and all(key in NOT_RUNNABLE for key in commands), (page, commands)


def test_api_reference_lists_each_public_name():
    """Each public package has a reference page, and its `:::` directive lists exactly the package's public names
    (so a name added to a package is added to its page, and a removed one leaves it)."""
    pages = reference_pages()
    packages = {f"torchestimator.{name}" for name in public_names_of_submodules()} | {"torchestimator"}
    assert packages - set(pages) - set(NOT_IN_REFERENCE) == set(), "add a page under docs/reference/ for each"
    for module, members in pages.items():
        declared = public_names(module)
        assert sorted(members) == declared, (
            f"docs/reference: the members listed for {module} differ from its public names (its TYPE_CHECKING block "
            f"or __all__): add {sorted(set(declared) - set(members))}, remove {sorted(set(members) - set(declared))}"
        )


def public_names_of_submodules() -> list[str]:
    from torchestimator._lazy import declared_exports

    spec = importlib.util.find_spec("torchestimator")
    assert spec is not None and spec.origin is not None
    return declared_exports("torchestimator", spec.origin).submodules


@pytest.mark.parametrize("block", [block for block in BLOCKS if block.language == "python"], ids=lambda b: b.label)
def test_python_block_uses_only_names_defined_above(block):
    """A reader running a page top to bottom (after its prelude) meets no name that no block above defined."""
    names_are_defined_above(block)


@pytest.mark.parametrize("block", [block for block in BLOCKS if not runs(block)], ids=lambda b: b.label)
def test_listed_block_partial_check(block, tmp_path):
    if block.key not in NOT_RUNNABLE and block.key not in TEXT_CHECKS:
        pytest.fail(f"{block.where} ({block.language or 'plain'}) is neither run nor listed")
    listed = NOT_RUNNABLE.get(block.key)
    if listed is not None and listed.check is None:
        pytest.skip(f"{block.where} is not run here: {listed.reason}")
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
def page_runs(tmp_path_factory):
    """One PageRun per page, made when its first block runs; the pages share TRAINS' trained model_dirs."""
    trained: dict[str, Path] = {}
    made: dict[str, PageRun] = {}

    def run_of(page: str) -> PageRun:
        if page not in made:
            slug = re.sub(r"[^A-Za-z0-9]+", "-", Path(page).stem)
            made[page] = PageRun(page, tmp_path_factory.mktemp(slug), trained)
        return made[page]

    return run_of


@pytest.mark.slow
@pytest.mark.timeout(900)  # a block run alone (-k) first runs its page's prelude and every block above it
@pytest.mark.parametrize("block", [block for block in BLOCKS if runs(block)], ids=lambda b: b.label)
def test_block_runs_as_written(block, page_runs):
    run = page_runs(block.page)
    outcome = run.outcome(block)
    if not outcome.ok and block.key in PENDING:
        pytest.xfail(PENDING[block.key])
    assert outcome.ok, f"{block.where} failed:\n{outcome.error}"
    if block.key in CHECKS_AFTER:
        CHECKS_AFTER[block.key](run, outcome)


@pytest.mark.slow
def test_quickstart_rerun_resumes_with_the_same_results(tmp_path):
    """Issue 13, point 2: the Quickstart saved as a script and run twice, a fresh process each time (a user
    rerunning it): the second run resumes at step 1000 and prints the first run's evaluation, digit for digit."""
    quickstart = block_with_key(QUICKSTART)
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
    # The Quickstart quotes the line each call prints on stderr by default: trained, then skipped on the rerun.
    assert "torchestimator: trained runs/quickstart from step 0 to 1000 in " in runs_log[0], runs_log[0]
    assert (
        "torchestimator: skipped training: runs/quickstart is already at step 1000 (max_steps=1000)" in runs_log[1]
    ), runs_log[1]
