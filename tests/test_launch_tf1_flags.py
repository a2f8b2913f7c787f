"""`torchestimator launch --ps_hosts ... --worker_hosts ... --job_name ... --task_index N script.py`: TF 1.x's task
flags run the program once, as that task, with the TF_CONFIG the flags stand for (worker 0 is the chief)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from torchestimator.cli import main
from torchestimator.distribute import find_free_port, launch_command
from torchestimator.distribute.launcher import parse_launch_arguments, run_in_place, tf_config_from_tf1_flags
from torchestimator.errors import ConfigError

PS = "127.0.0.1:2222,127.0.0.1:2223"
WORKERS = "127.0.0.1:2224,127.0.0.1:2225,127.0.0.1:2226"


@pytest.mark.parametrize(
    ("job_name", "task_index", "task"),
    [
        ("worker", 0, {"type": "chief", "index": 0}),  # TF 1.x: is_chief = task_index == 0
        ("worker", 1, {"type": "worker", "index": 0}),
        ("worker", 2, {"type": "worker", "index": 1}),
        ("ps", 0, {"type": "ps", "index": 0}),
        ("ps", 1, {"type": "ps", "index": 1}),
        ("evaluator", 0, {"type": "evaluator", "index": 0}),
    ],
)
def test_worker_0_is_the_chief_and_the_others_move_down_one(job_name: str, task_index: int, task: dict) -> None:
    tf_config = tf_config_from_tf1_flags(
        job_name, task_index, ps_hosts=PS, worker_hosts=WORKERS, evaluator_hosts="127.0.0.1:2230"
    )
    assert tf_config == {
        "cluster": {
            "chief": ["127.0.0.1:2224"],
            "worker": ["127.0.0.1:2225", "127.0.0.1:2226"],
            "ps": ["127.0.0.1:2222", "127.0.0.1:2223"],
            "evaluator": ["127.0.0.1:2230"],
        },
        "task": task,
    }


@pytest.mark.parametrize(
    ("job_name", "task_index", "task"),
    [("chief", 0, ("chief", 0)), ("worker", 0, ("worker", 0)), ("worker", 1, ("worker", 1)), ("ps", 0, ("ps", 0))],
)
def test_with_chief_hosts_the_workers_keep_their_indices(job_name: str, task_index: int, task: tuple) -> None:
    tf_config = tf_config_from_tf1_flags(
        job_name, task_index, ps_hosts=["h0:1"], worker_hosts=" w0:1 , w1:1 ", chief_hosts="c:1"
    )
    assert tf_config["cluster"] == {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["h0:1"]}
    assert (tf_config["task"]["type"], tf_config["task"]["index"]) == task


def test_one_worker_alone_is_the_chief_of_a_cluster_without_workers() -> None:
    assert tf_config_from_tf1_flags("worker", 0, worker_hosts="[::1]:2222") == {
        "cluster": {"chief": ["[::1]:2222"]},
        "task": {"type": "chief", "index": 0},
    }


def test_both_spellings_parse_and_only_written_options_count_as_given() -> None:
    arguments = parse_launch_arguments(
        ["--ps-hosts", PS, "--worker_hosts", WORKERS, "--job-name", "worker", "--task-index", "1", "t.py", "--lr", "1"]
    )
    assert (arguments.ps_hosts, arguments.worker_hosts, arguments.job_name, arguments.task_index) == (
        PS,
        WORKERS,
        "worker",
        1,
    )
    assert (arguments.training_script, arguments.training_script_args) == ("t.py", ["--lr", "1"])
    assert arguments.given_options == ["job_name", "ps_hosts", "task_index", "worker_hosts"]
    # launch's default --nproc_per_node is 2: written out, it still counts as given.
    assert "nproc_per_node" in parse_launch_arguments(["--nproc_per_node", "2", "t.py"]).given_options


TASK = ["--worker_hosts", "127.0.0.1:2224,127.0.0.1:2225", "--job_name", "worker", "--task_index", "1"]


@pytest.mark.parametrize(
    ("argv", "environ", "field", "message"),
    [
        (["--worker_hosts", "h:1", "--job_name", "worker", "t.py"], {}, "task_index", "needs --task_index"),
        (["--worker_hosts", "h:1", "--task_index", "0", "t.py"], {}, "job_name", "need --job_name"),
        (
            ["--worker_hosts", "h:1,h:2", "--job_name", "worker", "--task_index", "2", "t.py"],
            {},
            "task_index",
            "--task_index 2 is out of range: --worker_hosts lists 2 task(s)",
        ),
        (
            ["--worker_hosts", "h:1", "--job_name", "ps", "--task_index", "0", "t.py"],
            {},
            "ps_hosts",
            "--ps_hosts lists no",
        ),
        (["--job_name", "worker", "--task_index", "0", "t.py"], {}, "worker_hosts", "--worker_hosts lists no task"),
        (["--worker_hosts", "h:1", "--job_name", "chief", "--task_index", "0", "t.py"], {}, "chief_hosts", "worker 0"),
        (["--ps_hosts", "ps0", *TASK, "t.py"], {}, "ps_hosts", "'ps0' is not one"),
        (["--worker_hosts", "h:0", "--job_name", "worker", "--task_index", "0", "t.py"], {}, "worker_hosts", "'h:0'"),
        (["--worker_hosts", "h:1,,h:2", "--job_name", "worker", "--task_index", "0", "t.py"], {}, "worker_hosts", "''"),
        (["--chief_hosts", "c:1,c:2", *TASK, "t.py"], {}, "chief_hosts", "a cluster has one chief"),
        (["--ps_hosts", "127.0.0.1:2225", *TASK, "t.py"], {}, "worker_hosts", "listed twice"),
        ([*TASK, "--from_tf_config", "t.py"], {}, "from_tf_config", "give one of the two"),
        ([*TASK, "--nnodes", "2", "t.py"], {}, "nnodes", "torchrun's --nnodes cannot be given"),
        ([*TASK, "--nproc-per-node", "2", "t.py"], {}, "nproc_per_node", "torchrun's --nproc_per_node cannot"),
        ([*TASK, "--max_restarts", "3", "t.py"], {}, "max_restarts", "--max_restarts cannot"),
        ([*TASK, "t.py"], {"TF_CONFIG": '{"cluster": {}}'}, "TF_CONFIG", "neither wins. Unset TF_CONFIG"),
        ([*TASK, "t.py"], {"RANK": "0", "WORLD_SIZE": "2"}, "RANK", "RANK and WORLD_SIZE are set"),
    ],
)
def test_what_cannot_make_one_tasks_tf_config_is_refused_naming_the_flag(
    argv: list[str], environ: dict, field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        launch_command(argv, environ=environ)
    assert raised.value.field == field
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--worker_hosts", "h:1", "--job_name", "worker", "t.py"], "--job_name worker needs --task_index"),
        ([*TASK, "--nproc_per_node", "1", "t.py"], "torchrun's --nproc_per_node cannot be given too"),
    ],
)
def test_the_cli_refuses_with_exit_status_2_and_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert main(["launch", *argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith("torchestimator launch: error: ") and message in error


SHOW_TASK = """
import json, os, signal, sys, time
print(json.dumps({"tf_config": json.loads(os.environ["TF_CONFIG"]), "argv": sys.argv[1:]}), flush=True)
if "--wait_for_sigterm" in sys.argv:
    signal.signal(signal.SIGTERM, lambda number, frame: (print("stopped by SIGTERM", flush=True), os._exit(7)))
    print("ready", flush=True)
    time.sleep(60)
sys.exit(int(os.environ.get("EXIT_STATUS", "0")))
"""


def _environment(**extra: str) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if name not in ("TF_CONFIG", "RANK", "WORLD_SIZE")}
    return {**environ, **extra}


def test_the_program_runs_once_as_that_task_with_its_tf_config_args_and_exit_status(tmp_path) -> None:
    (tmp_path / "script.py").write_text(SHOW_TASK)
    ps, workers = f"127.0.0.1:{find_free_port()}", [f"127.0.0.1:{find_free_port()}" for _ in range(2)]
    command = [sys.executable, "-m", "torchestimator.cli", "launch", "--ps_hosts", ps, "--worker-hosts"]
    command += [",".join(workers), "--job_name", "worker", "--task_index", "1", "script.py", "--lr", "0.1", "x y"]
    done = subprocess.run(
        command, cwd=tmp_path, env=_environment(EXIT_STATUS="3"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    shown = json.loads(done.stdout.splitlines()[0])
    expected = {
        "cluster": {"chief": [workers[0]], "worker": [workers[1]], "ps": [ps]},
        "task": {"type": "worker", "index": 0},
    }
    assert shown == {"tf_config": expected, "argv": ["--lr", "0.1", "x y"]}
    # One log line says which task it is and the TF_CONFIG made for it.
    said = [line for line in done.stderr.splitlines() if "TF_CONFIG=" in line]
    assert len(said) == 1 and "Task worker:1 (worker 0 is the chief" in said[0]
    assert json.loads(said[0].partition("TF_CONFIG=")[2]) == expected


def test_a_signal_to_the_launcher_reaches_the_program_and_its_status_comes_back(tmp_path) -> None:
    (tmp_path / "script.py").write_text(SHOW_TASK)
    command = [sys.executable, "-m", "torchestimator.cli", "launch", "--worker_hosts", f"127.0.0.1:{find_free_port()}"]
    command += ["--job_name", "worker", "--task_index", "0", "script.py", "--wait_for_sigterm"]
    launcher = subprocess.Popen(
        command, cwd=tmp_path, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert launcher.stdout is not None
        lines = [launcher.stdout.readline() for _ in range(2)]
        assert lines[1] == "ready\n", (lines, launcher.stderr.read() if launcher.poll() is not None else "")
        assert json.loads(lines[0])["tf_config"]["task"] == {"type": "chief", "index": 0}
        launcher.send_signal(signal.SIGTERM)  # to the launcher alone: the program runs in a session of its own
        output, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 7 and output == "stopped by SIGTERM\n"


def test_a_program_ended_by_a_signal_gives_128_plus_its_number_as_a_shell_does() -> None:
    killed = textwrap.dedent("""
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert run_in_place([sys.executable, "-c", killed], _environment(), name="killed.py") == 128 + signal.SIGKILL
    assert run_in_place([sys.executable, "-c", "raise SystemExit(5)"], _environment()) == 5
