"""distribute/_replica_main.py: the replicas a plain script starts and the workers of ``torchestimator launch`` run
their program as ``python`` would and end with ``os._exit``, so no C++ thread of torch can meet the interpreter's
finalization (where CPython's pthread_exit of a thread waiting for the GIL aborted a replica after its work:
"terminate called without an active exception", about 1 run in 5 of tests/test_replica_output.py).

What ``python`` does must not change: the exit status of ``sys.exit(n)``, an uncaught exception's traceback,
Ctrl-C's SIGINT, atexit handlers after the non-daemon threads, ``sys.argv`` and ``sys.path[0]``."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
from test_collectives import _run_late_release

from torchestimator.distribute._replica_main import REPLICA_MAIN
from torchestimator.distribute.launcher import launch_parser, rerun_command, through_replica_main

PROGRAM = textwrap.dedent("""
    import atexit, os, sys, threading, time

    atexit.register(lambda: print("atexit: " + ("after the thread" if finished else "thread still running"),
                                  flush=True))
    finished = []
    threading.Thread(target=lambda: (time.sleep(0.3), finished.append(1))).start()  # not a daemon: waited for
    print("argv", sys.argv[1:], "path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)), __name__)

    def fail():
        raise ValueError("the program failed")

    mode = sys.argv[1]
    if mode == "exit_3":
        sys.exit(3)
    if mode == "exit_text":
        sys.exit("a message instead of a code")
    if mode == "raise":
        fail()
    if mode == "interrupt":
        raise KeyboardInterrupt
""")


def _both(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The program run by python and through _replica_main."""
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    runs = [[sys.executable, str(program), mode], [sys.executable, "-m", REPLICA_MAIN, str(program), mode]]
    return tuple(
        subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)  # type: ignore
        for command in runs
    )


@pytest.mark.parametrize(
    "mode, status", [("ok", 0), ("exit_3", 3), ("exit_text", 1), ("raise", 1), ("interrupt", -signal.SIGINT)]
)
def test_the_program_ends_as_under_python(tmp_path, mode: str, status: int) -> None:
    plain, wrapped = _both(tmp_path, mode)
    assert plain.returncode == status, plain.stderr
    assert wrapped.returncode == status, wrapped.stderr
    # Same output: sys.argv, sys.path[0] the script's folder, __main__, the atexit handler after the thread ...
    assert wrapped.stdout == plain.stdout == (f"argv ['{mode}'] path0 True __main__\natexit: after the thread\n")
    # ... and the same standard error: the traceback from the program's frame on, the message of sys.exit(text).
    assert wrapped.stderr == plain.stderr
    if mode == "raise":
        assert wrapped.stderr.startswith("Traceback (most recent call last):\n  File ")
        assert "runpy" not in wrapped.stderr and REPLICA_MAIN not in wrapped.stderr
        assert wrapped.stderr.endswith("ValueError: the program failed\n")
    if mode == "exit_text":
        assert wrapped.stderr == "a message instead of a code\n"


def test_a_module_runs_as_under_python_m(tmp_path) -> None:
    (tmp_path / "package").mkdir()
    (tmp_path / "package" / "__init__.py").write_text("")
    (tmp_path / "package" / "train.py").write_text(
        "import os, sys\nprint(__name__, sys.argv[1:], os.path.basename(sys.argv[0]), sys.path[0] == os.getcwd())\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    plain, wrapped = (
        subprocess.run(
            [sys.executable, *runner, "-m", "package.train", "4"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        for runner in ((), ("-m", REPLICA_MAIN))
    )
    assert plain.returncode == wrapped.returncode == 4, wrapped.stderr
    assert wrapped.stdout == plain.stdout == "__main__ ['4'] train.py True\n"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_a_late_release_by_gloos_worker_of_torchs_own_collective_cannot_abort_through_replica_main(tmp_path) -> None:
    """torch's own all_reduce of a plain tensor (as torchmetrics' sync and FSDP issue), whose release gloo's worker
    makes while the main thread keeps the GIL to the end: under python this aborts (test_collectives' control);
    through _replica_main there is no finalization to meet. Status 0 also says the release did come late (5: not)."""
    completed = _run_late_release(tmp_path, "as_it_is", runner=("-m", REPLICA_MAIN))
    assert completed.returncode == 0, completed.stderr
    assert "terminate called" not in completed.stderr


def test_replicas_and_launched_workers_run_through_replica_main() -> None:
    script = dict(
        executable="/bin/python3",
        orig_argv=["python", "-u", "train.py", "--steps", "5"],
        argv=["train.py", "--steps", "5"],
        main_file="/home/me/train.py",
        main_spec_name=None,
        interactive=False,
        through=REPLICA_MAIN,
    )
    assert rerun_command(**script) == ["/bin/python3", "-u", "-m", REPLICA_MAIN, "/home/me/train.py", "--steps", "5"]
    for orig_argv in (
        ["python", "-u", "-m", "package.train", "5"],
        ["python", "-um", "package.train", "5"],
        ["python", "-u", "-mpackage.train", "5"],
    ):
        module = {
            **script,
            "orig_argv": orig_argv,
            "argv": ["/site/package/train.py", "5"],
            "main_file": "/site/package/train.py",
            "main_spec_name": "package.train",
        }
        assert rerun_command(**module) == ["/bin/python3", "-u", "-m", REPLICA_MAIN, "-m", "package.train", "5"]
        assert rerun_command(**{**module, "through": None}) == ["/bin/python3", "-u", "-m", "package.train", "5"]

    launched = through_replica_main(launch_parser().parse_args(["--nproc_per_node", "2", "train.py", "--steps", "5"]))
    assert (launched.module, launched.training_script, launched.training_script_args) == (
        True,
        REPLICA_MAIN,
        ["train.py", "--steps", "5"],
    )
    launched = through_replica_main(launch_parser().parse_args(["-m", "package.train", "5"]))
    assert (launched.training_script, launched.training_script_args) == (REPLICA_MAIN, ["-m", "package.train", "5"])
    not_python = launch_parser().parse_args(["--no-python", "./train.sh"])
    assert through_replica_main(not_python) is not_python
