"""Where the processes come from: the local replicas of a plain script, and ``launch`` (torchrun).

Belongs here: starting the local replicas of a plain ``python script.py`` run
(``start_local_replicas``), and ``launch``, which hands a command to torchrun
(``torch.distributed.run``) with torchrun's own options (several nodes,
rendezvous, elastic restarts) or a cluster taken from ``TF_CONFIG``, or, with
TF 1.x's task flags (``--ps_hosts``, ``--worker_hosts``, ``--job_name``,
``--task_index``), runs the program once as that task with the TF_CONFIG the
flags stand for (``run_tf1_task``). Does not
belong here: reading the cluster from the environment (``cluster.py``; its
names are re-exported here for older imports), process groups, devices and
module wrapping (the strategies', in ``strategy.py``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torchestimator.distribute._replica_main import REPLICA_MAIN
from torchestimator.distribute.cluster import (  # noqa: F401  (re-exported: older imports name launcher)
    CHIEF,
    EVALUATOR,
    MASTER,
    PS,
    TORCHRUN_VARIABLES,
    WORKER,
    ClusterSpec,
    cluster_from_tf_config,
    cluster_from_torchrun,
)
from torchestimator.errors import ConfigError, RelaunchError, ReplicaLostError

logger = logging.getLogger(__name__)

DEFAULT_NPROC_PER_NODE = "2"
"""``torchestimator launch``'s processes per node when neither --nproc_per_node nor PET_NPROC_PER_NODE says."""


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (another program may still take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


# ---------------------------------------------------------------- self-launch of a plain script


def rerun_command(
    *,
    executable: str,
    orig_argv: Sequence[str],
    argv: Sequence[str],
    main_file: str | None,
    main_spec_name: str | None,
    interactive: bool,
    through: str | None = None,
) -> list[str]:
    """The command line that runs this program again, or RelaunchError if there is none.

    ``orig_argv`` keeps the interpreter's own options (``-u``, ``-X ...``) and ``-m``; the
    script path is made absolute from ``__main__.__file__`` so a later chdir does not matter.
    ``through``: a module that runs the program (``python [options] -m THROUGH script.py args``), as
    ``_replica_main`` does for the replicas.
    """
    advice = (
        "Start it with `torchestimator launch --nproc_per_node N your_script.py ...` or "
        "`torchrun --nproc-per-node N your_script.py ...`, or use num_replicas=1."
    )
    if interactive:
        raise RelaunchError(
            "MirroredStrategy cannot start its other replicas from an interactive session "
            f"(python -i, a REPL or a notebook): they would need to re-run this program. {advice}"
        )
    if main_file is None or "-c" in orig_argv[: len(orig_argv) - len(argv) + 1]:
        raise RelaunchError(
            "MirroredStrategy starts its other replicas by running this program again, but it came "
            f"from `python -c`, standard input or an embedded interpreter and cannot be re-run. {advice}"
        )
    program_at = len(orig_argv) - len(argv)
    options = list(orig_argv[1:program_at])
    runner = [] if through is None else ["-m", through]
    if main_spec_name is not None and main_spec_name != "__main__":
        # `python -m package.module args`: orig_argv ends with the module name, after -m (or in -mpackage.module).
        module = orig_argv[program_at]
        if module.startswith("-m"):
            module = module[2:]
        elif options and options[-1] == "-m":
            options.pop()
        elif options and options[-1].startswith("-") and options[-1].endswith("m"):
            options[-1] = options[-1][:-1]  # grouped flags ending with m: "-um"
        return [executable, *options, *runner, "-m", module, *argv[1:]]
    if main_spec_name == "__main__":
        # A directory or zip archive run as a program: re-run that, not its __main__.py.
        return [executable, *options, *runner, os.path.abspath(orig_argv[program_at]), *argv[1:]]
    return [executable, *options, *runner, os.path.abspath(main_file), *argv[1:]]


def current_rerun_command(through: str | None = None) -> list[str]:
    """rerun_command for the running interpreter."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    orig_argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return rerun_command(
        executable=sys.executable,
        orig_argv=orig_argv,
        argv=sys.argv,
        main_file=getattr(main, "__file__", None),
        main_spec_name=getattr(spec, "name", None),
        interactive=bool(sys.flags.interactive) or hasattr(sys, "ps1"),
        through=through,
    )


STARTED_REPLICA_VARIABLE = "TORCHESTIMATOR_STARTED_REPLICA_OF"
"""Set, to replica 0's pid, in the environment of the replicas ``start_local_replicas`` starts."""

REPLICA_FOLDER_PREFIX = "torchestimator-replicas-"
"""Temporary folders ``replica_stdout_path`` makes: ``torchestimator-replicas-<pid of replica 0>-<random>``."""

KEPT_REPLICA_FOLDERS = 5
"""How many finished runs' replica stdout folders stay in the temporary folder (the newest; see
``replica_stdout_path``)."""

_RELAY_CHUNK = 65536


def is_started_replica(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one of the replicas a plain script started itself (``start_local_replicas``).

    The variable is inherited by whatever such a replica starts in turn, so its value must also be this
    process's parent: the replica the variable names started it directly.
    """
    environ = os.environ if environ is None else environ
    return environ.get(STARTED_REPLICA_VARIABLE, "") == str(os.getppid())


def started_replicas() -> LocalReplicas | None:
    """The replicas this process started as replica 0 of a plain script, or None."""
    return _started


class _StderrRelay(threading.Thread):
    """Copies one replica's standard error (a pipe) to this process's file descriptor 2, each line starting with
    ``[rankN]: ``.

    Prefixing the file descriptor, not ``sys.stderr`` inside the replica, marks what every writer of fd 2 writes:
    a logging handler built before training (holding the original ``sys.stderr``), C++ warnings, a traceback at
    start-up. Lines torch's excepthook already prefixed are left as they are. Each batch of whole lines is one
    ``os.write``, so the lines of two replicas interleave whole.
    """

    def __init__(self, pipe: Any, rank: int, ended: threading.Event) -> None:
        super().__init__(name=f"torchestimator-replica-{rank}-stderr", daemon=True)
        self._pipe = pipe
        self._prefix = f"[rank{rank}]: ".encode()
        self._ended = ended
        self.rank = rank
        self.lines = 0
        """Lines relayed so far."""
        self.last_line: str | None = None
        """The last non-blank line relayed (without its prefix), to quote when the replica fails."""

    def run(self) -> None:
        pending = b""
        try:
            while chunk := self._read():
                pending += chunk
                whole, newline, pending = pending.rpartition(b"\n")
                if newline:
                    self._forward(whole + newline)
                if len(pending) > _RELAY_CHUNK:  # a very long line without an end: pass it on in pieces
                    self._forward(pending + b"\n")
                    pending = b""
            if pending:
                self._forward(pending + b"\n")
        finally:
            self._pipe.close()
            self._ended.set()

    def _read(self) -> bytes:
        try:
            return os.read(self._pipe.fileno(), _RELAY_CHUNK)
        except OSError:
            return b""

    def _forward(self, data: bytes) -> None:
        lines = data.splitlines(keepends=True)
        for line in lines:
            text = line.removeprefix(self._prefix).decode(errors="replace").strip()
            if text:
                self.last_line = text
        self.lines += len(lines)
        marked = b"".join(line if line.startswith(self._prefix) else self._prefix + line for line in lines)
        while marked:
            try:
                written = os.write(2, marked)
            except OSError:  # this process has no fd 2 (closed): nowhere to show it
                return
            marked = marked[written:]

    def what_it_wrote(self) -> str:
        """For the line saying a replica ended: where its errors are, or that it wrote none."""
        if self.lines == 0:
            return "it wrote nothing to its standard error"
        if self.last_line is None:
            return "it wrote only blank lines to its standard error"
        # The clause ends a sentence: a line's own final period would double the caller's.
        return f"its standard error is above, in [rank{self.rank}]: lines, ending: {self.last_line.removesuffix('.')}"


def _quoted(error: BaseException, limit: int = 160) -> str:
    """'ValueError: its message', the message's first line cut to ``limit`` characters."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    text = lines[0] if len(lines[0]) <= limit else lines[0][: limit - 3] + "..."
    return f"{type(error).__name__}: {text}"


def describe_exit(code: int) -> str:
    """'exited with code 3', 'was killed by SIGKILL'."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


class LocalReplicas:
    """Replicas 1..N-1 of a plain ``python script.py`` run; this process is replica 0.

    Their standard error comes through a pipe each and shows on this process's, every line marked ``[rankN]:``;
    their standard output goes to ``stdout_path`` when given (else where this process's goes). At interpreter exit
    this process waits for them and reports, once, each one that failed or that it had to stop.
    """

    def __init__(
        self,
        processes: list[subprocess.Popen[bytes]],
        command: list[str],
        relays: list[_StderrRelay],
        stdout_path: str | None = None,
        ended: threading.Event | None = None,
    ) -> None:
        self.processes = processes
        self.command = command
        self.relays = relays
        self.stdout_path = stdout_path
        self._ended = ended or threading.Event()
        self._reported: set[int] = set()  # ranks whose end an error already told (not repeated at exit)

    def raise_if_exited(self, ranks: Sequence[int], before: str) -> None:
        """ReplicaLostError naming the first of ``ranks`` whose process has ended (``before``: what it did not do)."""
        for rank in ranks:
            process = self.processes[rank - 1]
            if process.poll() is None:
                continue
            relay = self.relays[rank - 1]
            relay.join(2.0)  # its last lines show before this process's error
            self._reported.add(rank)
            raise ReplicaLostError(
                f"Replica {rank} of {len(self.processes) + 1} (pid {process.pid}) {describe_exit(process.returncode)} "
                f"before {before}; {relay.what_it_wrote()}. This process (replica 0) stops too. Fix what stopped "
                f"replica {rank} and run the program again: every replica re-runs it from its start.",
                lost_ranks=[rank],
            )

    def wait_for_an_end(self, seconds: float) -> None:
        """Returns after ``seconds``, or sooner when a replica closes its standard error (it ends)."""
        self._ended.wait(seconds)
        self._ended.clear()

    def finish(self, failure_grace_seconds: float = 5.0) -> list[int | None]:
        """Wait for the replicas (stopping them when this process failed); their exit codes."""
        failure: BaseException | None = getattr(sys, "last_value", None)
        # Replicas blocked in a collective with this process only notice its end when
        # its connections close, so close them before waiting.
        _destroy_process_group()
        deadline = time.monotonic() + failure_grace_seconds if failure is not None else None
        stopped = [_wait_or_stop(process, deadline) for process in self.processes]
        for relay in self.relays:
            relay.join(5.0)  # a process the replica started may hold the pipe open: do not wait on it for long
        codes = [process.returncode for process in self.processes]
        for rank, (process, was_stopped) in enumerate(zip(self.processes, stopped), start=1):
            if not process.returncode or rank in self._reported:
                continue
            if was_stopped:
                assert failure is not None  # replicas are stopped only when this process failed
                said = _quoted(failure)
                logger.error(
                    "Replica 0 (this process) failed (%s; its traceback is above), so it stopped replica "
                    "%d of %d (process %d), still running %g s later.",
                    said,
                    rank,
                    len(codes) + 1,
                    process.pid,
                    failure_grace_seconds,
                )
            elif isinstance(failure, KeyboardInterrupt) and process.returncode == -signal.SIGINT:
                continue  # Ctrl-C reached every replica: nothing to report
            else:
                logger.error(
                    "Replica %d of %d (process %d) %s; %s. Command: %s",
                    rank,
                    len(codes) + 1,
                    process.pid,
                    describe_exit(process.returncode),
                    self.relays[rank - 1].what_it_wrote(),
                    " ".join(self.command),
                )
        self._remove_stdout_if_empty()
        return codes

    def _remove_stdout_if_empty(self) -> None:
        """An empty stdout file says nothing: it goes, with its folder. One with output stays to be read (the log
        line named it), until later runs prune it (``replica_stdout_path``)."""
        path = self.stdout_path
        try:
            if path is None or os.path.getsize(path) > 0:
                return
            os.remove(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass

    def _finish_at_exit(self) -> None:
        codes = self.finish()
        if any(codes) and getattr(sys, "last_value", None) is None:
            # Python gives atexit handlers no other way to make the exit status say
            # that a replica failed.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)


_started: LocalReplicas | None = None


def _destroy_process_group() -> None:
    import torch.distributed as distributed

    if distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def _wait_or_stop(process: subprocess.Popen[bytes], deadline: float | None) -> bool:
    """Waits for ``process`` until ``deadline`` (None: no limit), then stops it; True when it had to be stopped."""
    try:
        process.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return False
    except subprocess.TimeoutExpired:
        process.terminate()
    try:
        process.wait(5.0)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return True


def replica_stdout_path(keep: int = KEPT_REPLICA_FOLDERS) -> str:
    """A new ``<tmp>/torchestimator-replicas-<pid>-<random>/stdout.txt`` for the replicas' standard output.

    The folder goes at exit when the file stayed empty (``LocalReplicas.finish``); one with output stays for the
    user to read. Before making a new one, the folders of finished runs beyond the ``keep - 1`` newest are removed,
    so at most ``keep`` runs' files remain: only this user's, only of runs whose replica 0 no longer runs, and only
    folders holding nothing but that file.
    """
    base = tempfile.gettempdir()
    finished = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        entries = []
    for entry in entries:
        pid_text = entry.name[len(REPLICA_FOLDER_PREFIX) :].split("-", 1)[0]
        if not entry.name.startswith(REPLICA_FOLDER_PREFIX) or not pid_text.isdigit() or _is_running(int(pid_text)):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if (
                entry.is_dir(follow_symlinks=False)
                and info.st_uid == os.getuid()
                and set(os.listdir(entry.path)) <= {"stdout.txt"}
            ):
                finished.append((info.st_mtime, entry.path))
        except OSError:
            continue
    for _, path in sorted(finished, reverse=True)[max(0, keep - 1) :]:
        shutil.rmtree(path, ignore_errors=True)
    return os.path.join(tempfile.mkdtemp(prefix=f"{REPLICA_FOLDER_PREFIX}{os.getpid()}-"), "stdout.txt")


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to someone else
        return True
    return True


def start_local_replicas(num_replicas: int, stdout_path: str | None = None) -> LocalReplicas:
    """Start replicas 1..num_replicas-1 running this program; set this process up as replica 0.

    Each replica gets the variables torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port), and so does this
    process's ``os.environ``, so every later ``setup()`` here and there finds a launched run;
    they also get STARTED_REPLICA_VARIABLE (this process's pid). Their standard output goes to
    ``stdout_path`` (appended), or where this process's goes when None; their standard error is
    relayed here with ``[rankN]:`` marks from their first line on.
    """
    global _started
    if num_replicas < 2:
        raise ValueError(f"start_local_replicas needs at least 2 replicas; received {num_replicas}.")
    command = current_rerun_command(through=REPLICA_MAIN)
    shared = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(find_free_port()),
        "WORLD_SIZE": str(num_replicas),
        "LOCAL_WORLD_SIZE": str(num_replicas),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
    }
    if "OMP_NUM_THREADS" not in os.environ:
        # Like torchrun: N processes each using every core would oversubscribe the CPU.
        shared["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // num_replicas))
    processes, relays, ended = [], [], threading.Event()
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.ExitStack() as files:
        stdout = None if stdout_path is None else files.enter_context(open(stdout_path, "ab"))
        for rank in range(1, num_replicas):
            environ = {
                **os.environ,
                **shared,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                STARTED_REPLICA_VARIABLE: str(os.getpid()),
            }
            process = subprocess.Popen(
                command, env=environ, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE
            )
            processes.append(process)
            relays.append(_StderrRelay(process.stderr, rank, ended))
            relays[-1].start()
    logger.info(
        "Started %d more replica(s) of this program (processes %s) for %d-replica training: %s",
        num_replicas - 1,
        [process.pid for process in processes],
        num_replicas,
        " ".join(command),
    )
    os.environ.update({**shared, "RANK": "0", "LOCAL_RANK": "0"})
    replicas = LocalReplicas(processes, command, relays, stdout_path, ended)
    _started = replicas
    atexit.register(replicas._finish_at_exit)
    return replicas


# ---------------------------------------------------------------- torchestimator launch


def torchrun_arguments(
    nproc_per_node: int, command_argv: Sequence[str], *, cluster: ClusterSpec | None = None
) -> list[str]:
    """The torchrun command-line arguments for ``launch``.

    ``command_argv`` is ``["script.py", args...]`` or ``["-m", "package.module", args...]``.
    Without a cluster (or with one of a single training task) the run is standalone on this machine;
    a TF_CONFIG cluster runs one node per chief/worker task, rendezvous at the chief.
    """
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive integer; received {nproc_per_node!r}.")
    command_argv = list(command_argv)
    if not command_argv or (command_argv[0] == "-m" and len(command_argv) < 2):
        raise ValueError(
            f"launch needs the program to run, e.g. ['train.py', '--flag'] or ['-m', 'package.module']; "
            f"received {command_argv!r}."
        )
    arguments = [f"--nproc-per-node={nproc_per_node}"]
    if cluster is not None and cluster.rank is None:
        cluster.torch_environ()  # raises the explanation for evaluator and ps tasks
    if cluster is None or not cluster.spans_several_processes:
        arguments.append("--standalone")
    else:
        arguments += [
            f"--nnodes={cluster.world_size}",
            f"--node-rank={cluster.rank}",
            f"--master-addr={cluster.master_addr}",
            f"--master-port={cluster.master_port}",
        ]
    if command_argv[0] == "-m":
        return [*arguments, "--module", *command_argv[1:]]
    return [*arguments, *command_argv]


def launch(nproc_per_node: int, command_argv: Sequence[str], *, cluster: ClusterSpec | None = None) -> int:
    """Run ``command_argv`` in ``nproc_per_node`` processes per node with torchrun; the exit code.

    Inside, ``MirroredStrategy`` finds the launched environment and joins the process group.
    Pass ``cluster=cluster_from_tf_config(os.environ)`` to run across the machines of a TF_CONFIG;
    for torchrun's other options (``--nnodes 1:4``, rendezvous, ``--max_restarts``) use
    ``launch_command``, which takes the command line of ``torchestimator launch``.
    """
    from torch.distributed.run import parse_args

    arguments = parse_args(torchrun_arguments(nproc_per_node, command_argv, cluster=cluster))  # type: ignore[no-untyped-call]  # unannotated in torch
    return run_torchrun(arguments)


def launch_command(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """``torchestimator launch ARGV``: torchrun's options and ``--from_tf_config``, or TF 1.x's task flags
    (``--ps_hosts``, ``--worker_hosts``, ``--job_name``, ``--task_index``), then the program; the exit code."""
    return run_launch(parse_launch_arguments(argv), environ)


def parse_launch_arguments(argv: Sequence[str], prog: str = "torchestimator launch") -> argparse.Namespace:
    """``launch_parser``'s parse of ``argv``, plus ``given_options``: the options written on the command line.

    A value equal to its default cannot tell whether the option was written (``--nproc_per_node 2`` is the
    default), and TF 1.x's task flags refuse torchrun's options only when they were written: a second parse,
    with every default suppressed, keeps only what the command line said.
    """
    argv = list(argv)
    arguments = launch_parser(prog).parse_args(argv)
    written = launch_parser(prog)
    written._defaults.clear()  # set_defaults' values (launch's --nproc_per_node) apply whatever an action says
    for action in written._actions:
        if action.option_strings:
            action.default = argparse.SUPPRESS
    arguments.given_options = sorted(
        dest for dest in vars(written.parse_args(argv)) if dest not in ("training_script", "training_script_args")
    )
    return arguments


def run_launch(arguments: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Run what ``torchestimator launch`` was asked: one TF 1.x task when its flags were given
    (``run_tf1_task``), else torchrun (``prepare_torchrun_arguments``, ``run_torchrun``); the exit code."""
    if _tf1_flags_given(arguments):
        return run_tf1_task(arguments, environ)
    return run_torchrun(prepare_torchrun_arguments(arguments, environ))


def launch_parser(prog: str = "torchestimator launch") -> argparse.ArgumentParser:
    """torchrun's own parser (``torch.distributed.run.get_args_parser``) plus ``--from_tf_config``.

    Every torchrun option is accepted in both spellings (``--max_restarts``, ``--max-restarts``) and
    reads its ``PET_*`` variable as torchrun does. One difference: 2 processes per node by default.
    """
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = prog
    parser.description = (
        "Run a training program in several processes with torchrun: standalone on this machine unless "
        "--nnodes, a rendezvous (--rdzv_backend c10d --rdzv_endpoint HOST:PORT --rdzv_id JOB) or "
        "--from_tf_config says otherwise. Every torchrun option is accepted. With TF 1.x's --ps_hosts, "
        "--worker_hosts, --job_name and --task_index it runs the program once, as that task, with TF_CONFIG set."
    )
    if "PET_NPROC_PER_NODE" not in os.environ:
        parser.set_defaults(nproc_per_node=DEFAULT_NPROC_PER_NODE)
    parser.add_argument(
        "--from_tf_config",
        "--from-tf-config",
        action="store_true",
        help="take the nodes from TF_CONFIG: one node per chief/worker task, node rank = the task's rank "
        "(chief 0, worker i at i + 1), static rendezvous at the chief's host:port",
    )
    tf1 = parser.add_argument_group(
        "TF 1.x task flags",
        "as a TF 1.x between-graph replication script took them: run the program once, as this one task, with "
        "the TF_CONFIG it stands for (no torchrun). Without --chief_hosts, worker 0 is the chief.",
    )
    hosts_help = {
        PS: "the parameter servers' addresses, comma-separated",
        WORKER: "the workers' addresses, comma-separated (the first is the chief unless --chief_hosts is given)",
        CHIEF: "the chief's address (one); then the workers keep their indices",
        EVALUATOR: "the evaluator's address",
    }
    for job in TF1_HOSTS_FLAGS:
        tf1.add_argument(
            f"--{job}_hosts", f"--{job}-hosts", default=None, metavar="HOST:PORT,...", help=hosts_help[job]
        )
    tf1.add_argument(
        "--job_name", "--job-name", default=None, choices=TF1_JOB_NAMES, help="this task's job (with --task_index)"
    )
    tf1.add_argument(
        "--task_index", "--task-index", default=None, type=int, help="this task's index in its job's hosts list"
    )
    return parser


CLUSTER_OPTIONS = {
    "nnodes": "--nnodes",
    "node_rank": "--node_rank",
    "master_addr": "--master_addr",
    "master_port": "--master_port",
    "rdzv_backend": "--rdzv_backend",
    "rdzv_endpoint": "--rdzv_endpoint",
    "rdzv_id": "--rdzv_id",
    "standalone": "--standalone",
}
"""The torchrun options that say where the nodes are (a cluster from TF_CONFIG replaces them)."""


def prepare_torchrun_arguments(
    arguments: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """The arguments torchrun runs with: the TF_CONFIG cluster when ``--from_tf_config`` asks for it, else
    what was given, made ``--standalone`` when it describes one node without a rendezvous."""
    arguments = argparse.Namespace(**vars(arguments))
    environ = os.environ if environ is None else environ
    _check_values(arguments)
    if getattr(arguments, "from_tf_config", False):
        _take_nodes_from_tf_config(arguments, environ)
    elif _one_node_without_rendezvous(arguments):
        _refuse_an_ignored_tf_config(environ)
        # torchrun's --standalone: a c10d store on a free local port, so runs never collide.
        arguments.standalone = True
    else:
        _mark_the_rendezvous_host(arguments)
    return arguments


def _check_values(arguments: argparse.Namespace) -> None:
    """torchrun's own checks (config_from_args), as one ConfigError line instead of an AssertionError traceback."""
    from torch.distributed.run import config_from_args

    nproc = str(arguments.nproc_per_node)
    if nproc.isdigit() and int(nproc) < 1:
        raise ConfigError(
            f"--nproc_per_node must be a positive number of processes; received {nproc}.",
            field="nproc_per_node",
            value=nproc,
        )
    try:
        config_from_args(argparse.Namespace(**vars(arguments)))
    except AssertionError as error:
        raise ConfigError(
            f"torchrun refuses these options: {error or 'a value out of range'} (--nnodes "
            f"{arguments.nnodes}, --max_restarts {arguments.max_restarts}).",
            field="launch",
        ) from error


def _refuse_an_ignored_tf_config(environ: Mapping[str, str]) -> None:
    """A TF_CONFIG of several training tasks, launched as one standalone node, would make each task a group of
    its own, all writing model_dir: the silent single replica issue 12 forbids."""
    cluster = cluster_from_tf_config(environ)
    if cluster.in_training_group and (cluster.world_size or 1) > 1:
        raise ConfigError(
            f"TF_CONFIG describes {cluster.world_size} training tasks (this is {cluster.task_type}:"
            f"{cluster.task_index}), but launch was given no nodes: each task would train as a group of its own "
            "and all would write model_dir. Pass --from_tf_config to take the nodes from TF_CONFIG, or unset "
            "TF_CONFIG.",
            field="TF_CONFIG",
            value=environ.get("TF_CONFIG"),
        )


def _mark_the_rendezvous_host(arguments: argparse.Namespace) -> None:
    """Tell c10d's rendezvous it serves the store when the endpoint is one of this machine's addresses.

    torchrun decides by resolving this machine's host name, which misses addresses of other interfaces
    (Debian maps the host name to 127.0.1.1; containers and network namespaces resolve it elsewhere): then
    no node serves the store and every node waits for the join timeout. An address is this machine's
    when a socket can bind to it. Left alone when torchrun already agrees or ``is_host`` is given.
    """
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname, parse_rendezvous_endpoint

    if arguments.rdzv_backend != "c10d" or not arguments.rdzv_endpoint or "is_host" in arguments.rdzv_conf:
        return
    host, _ = parse_rendezvous_endpoint(arguments.rdzv_endpoint, default_port=29400)
    if _matches_machine_hostname(host) or not _is_this_machines_address(host):
        return
    arguments.rdzv_conf = ",".join(filter(None, [arguments.rdzv_conf, "is_host=1"]))
    logger.info(
        "The rendezvous endpoint %s is an address of this machine: this node serves the store (--rdzv_conf is_host=1).",
        arguments.rdzv_endpoint,
    )


def _is_this_machines_address(host: str) -> bool:
    try:
        addresses = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    for family, _, _, _, address in addresses:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address[0], 0))
            except OSError:
                continue
            return True
    return False


def _one_node_without_rendezvous(arguments: argparse.Namespace) -> bool:
    return str(arguments.nnodes) in ("1", "1:1") and arguments.rdzv_backend == "static" and not arguments.rdzv_endpoint


def _take_nodes_from_tf_config(arguments: argparse.Namespace, environ: Mapping[str, str]) -> None:
    defaults = launch_parser()
    given = [flag for dest, flag in CLUSTER_OPTIONS.items() if getattr(arguments, dest) != defaults.get_default(dest)]
    if given:
        raise ConfigError(
            f"--from_tf_config takes the nodes from TF_CONFIG, so {', '.join(given)} cannot be given too. "
            "Drop them, or drop --from_tf_config and describe the nodes with torchrun's options.",
            field=given[0].lstrip("-"),
        )
    cluster = cluster_from_tf_config(environ)
    if not cluster.jobs and cluster.task_type != EVALUATOR:
        raise ConfigError(
            '--from_tf_config, but TF_CONFIG has no "cluster" (it is unset, or names one local task). Set '
            'TF_CONFIG like {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]}, '
            '"task": {"type": "worker", "index": 0}}, or launch without --from_tf_config.',
            field="TF_CONFIG",
            value=environ.get("TF_CONFIG"),
        )
    cluster.torch_environ()  # raises the explanation for evaluator and ps tasks
    if not cluster.spans_several_processes:
        arguments.standalone = True
        return
    arguments.nnodes, arguments.node_rank = str(cluster.world_size), cluster.rank
    arguments.master_addr, arguments.master_port = cluster.master_addr, cluster.master_port
    logger.info(
        "TF_CONFIG: task %s:%d is node %d of %d, rendezvous at the chief, %s:%d.",
        cluster.task_type,
        cluster.task_index,
        cluster.rank,
        cluster.world_size,
        cluster.master_addr,
        cluster.master_port,
    )


# ---------------------------------------------------------------- TF 1.x task flags
#
# TF 1.x's between-graph replication scripts took the cluster and the task as flags: --ps_hosts and --worker_hosts
# (comma-separated "hostname:port" pairs), --job_name ("One of 'ps', 'worker'") and --task_index ("Index of task
# within the job"), one command per task, worker 0 being the chief (is_chief=(FLAGS.task_index == 0)). The script
# built tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts}), started tf.train.Server(cluster,
# job_name=..., task_index=...), joined it as a ps, or placed its variables with tf.train.replica_device_setter as a
# worker: "Putting it all together: example trainer program" in TensorFlow's distributed guide
# (tensorflow/tensorflow, tensorflow/docs_src/deploy/distributed.md, TF 1.x). tf.estimator took the same description
# from TF_CONFIG, where the chief is a job of its own (run_config.py); these flags make that TF_CONFIG for one task.

TF1_HOSTS_FLAGS = (PS, WORKER, CHIEF, EVALUATOR)
"""The jobs with a ``--<job>_hosts`` flag, in the order TF_CONFIG lists them after the chief."""

TF1_JOB_NAMES = (PS, WORKER, CHIEF, EVALUATOR)
"""``--job_name``'s choices."""

TF1_FLAGS = (*(f"{job}_hosts" for job in TF1_HOSTS_FLAGS), "job_name", "task_index")
"""The TF 1.x task flags' destinations; any of them makes ``launch`` run one task instead of torchrun."""

TF1_KEPT_TORCHRUN_OPTIONS = frozenset({"module", "no_python"})
"""torchrun options that still mean something for one task: how the program is run (``-m``, ``--no_python``)."""

FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
"""What a TF 1.x task's launcher passes on to the program: torchrun's ``--signals_to_handle`` default, plus SIGUSR1
and SIGUSR2 (SLURM's ``--signal`` warning before a job is stopped)."""


def _tf1_flags_given(arguments: argparse.Namespace) -> bool:
    return any(getattr(arguments, dest, None) is not None for dest in TF1_FLAGS)


def tf_config_from_tf1_flags(
    job_name: str | None,
    task_index: int | None,
    *,
    ps_hosts: str | Sequence[str] | None = None,
    worker_hosts: str | Sequence[str] | None = None,
    chief_hosts: str | Sequence[str] | None = None,
    evaluator_hosts: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """The TF_CONFIG of the task ``job_name:task_index`` in the cluster TF 1.x's flags describe.

    The hosts are comma-separated ``host:port`` strings (or lists of them). Without ``chief_hosts``, as in TF 1.x,
    worker 0 is the chief: ``worker_hosts[0]`` becomes ``"chief": [worker_hosts[0]]``, worker k (k >= 1) becomes
    worker k - 1, and ``--job_name worker --task_index 0`` is task ``{"type": "chief", "index": 0}``. With
    ``chief_hosts`` (one address) the workers keep their indices. ``ps`` and ``evaluator`` tasks keep theirs.
    A value that cannot describe the task is a ConfigError whose ``field`` is the flag to fix.
    """
    hosts = {
        job: _tf1_hosts(value, job)
        for job, value in zip(TF1_HOSTS_FLAGS, (ps_hosts, worker_hosts, chief_hosts, evaluator_hosts))
    }
    if job_name is None:
        raise ConfigError(
            "the TF 1.x task flags need --job_name (ps, worker, chief or evaluator) and --task_index to say which "
            "task this command runs.",
            field="job_name",
        )
    if job_name not in TF1_JOB_NAMES:
        raise ConfigError(
            f"--job_name must be one of {', '.join(TF1_JOB_NAMES)}; received {job_name!r}.",
            field="job_name",
            value=job_name,
        )
    if task_index is None:
        raise ConfigError(
            f"--job_name {job_name} needs --task_index: this task's index in --{job_name}_hosts (TF 1.x "
            "scripts defaulted it to 0, which silently made every task worker 0, the chief).",
            field="task_index",
        )
    if not hosts[WORKER] and not hosts[CHIEF]:
        raise ConfigError(
            "--worker_hosts lists no task, so no task trains: give the workers' host:port addresses (without "
            "--chief_hosts, worker 0 is the chief).",
            field="worker_hosts",
        )
    if len(hosts[CHIEF]) > 1:
        raise ConfigError(
            f"--chief_hosts lists {len(hosts[CHIEF])} addresses; a cluster has one chief.",
            field="chief_hosts",
            value=",".join(hosts[CHIEF]),
        )
    if job_name == CHIEF and not hosts[CHIEF]:
        raise ConfigError(
            "--job_name chief, but --chief_hosts lists no task: without --chief_hosts worker 0 is the chief, as in "
            "TF 1.x (is_chief = task_index == 0), so run it as --job_name worker --task_index 0, or give "
            "--chief_hosts.",
            field="chief_hosts",
        )
    if not hosts[job_name]:
        raise ConfigError(
            f"--job_name {job_name}, but --{job_name}_hosts lists no task: give the {job_name} tasks' host:port "
            "addresses, comma-separated.",
            field=f"{job_name}_hosts",
        )
    if not 0 <= task_index < len(hosts[job_name]):
        raise ConfigError(
            f"--task_index {task_index} is out of range: --{job_name}_hosts lists {len(hosts[job_name])} "
            f"task(s) ({','.join(hosts[job_name])}), indices 0 to {len(hosts[job_name]) - 1}.",
            field="task_index",
            value=task_index,
        )
    _refuse_an_address_twice(hosts)
    task_type, index = job_name, task_index
    if hosts[CHIEF]:
        chief, workers = hosts[CHIEF], hosts[WORKER]
    else:  # TF 1.x: worker 0 is the chief
        chief, workers = hosts[WORKER][:1], hosts[WORKER][1:]
        if job_name == WORKER:
            task_type, index = (CHIEF, 0) if task_index == 0 else (WORKER, task_index - 1)
    cluster: dict[str, list[str]] = {CHIEF: chief}
    for job, addresses in ((WORKER, workers), (PS, hosts[PS]), (EVALUATOR, hosts[EVALUATOR])):
        if addresses:
            cluster[job] = addresses
    return {"cluster": cluster, "task": {"type": task_type, "index": index}}


def _tf1_hosts(value: str | Sequence[str] | None, job: str) -> list[str]:
    """``--<job>_hosts``'s addresses; ConfigError naming the flag for an empty item or a host without a port."""
    flag = f"--{job}_hosts"
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else [str(item) for item in value]
    items = [item.strip() for item in items]
    if items == [""]:
        return []
    for item in items:
        host, separator, port = item.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        if (
            not separator
            or not host
            or (":" in host and not bracketed)
            or not port.isdigit()
            or not 0 < int(port) < 65536
        ):
            raise ConfigError(
                f'{flag} must be comma-separated "host:port" addresses (a port from 1 to 65535; an IPv6 host in '
                f"brackets, [::1]:2222); {item!r} is not one (in {flag} {value if isinstance(value, str) else ','.join(items)!r}).",
                field=f"{job}_hosts",
                value=value,
            )
    return items


def _refuse_an_address_twice(hosts: Mapping[str, list[str]]) -> None:
    """Two tasks cannot serve on one host:port (TensorFlow's servers, here the chief's store)."""
    seen: dict[str, str] = {}
    for job in TF1_HOSTS_FLAGS:
        for index, address in enumerate(hosts[job]):
            where = f"--{job}_hosts (task {index})"
            if address in seen:
                raise ConfigError(
                    f"{address} is listed twice, in {seen[address]} and {where}: each task needs an address of its "
                    "own.",
                    field=f"{job}_hosts",
                    value=address,
                )
            seen[address] = where


def tf1_task_tf_config(arguments: argparse.Namespace, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The TF_CONFIG ``launch``'s TF 1.x task flags make, after refusing what they cannot be combined with:
    ``--from_tf_config``, torchrun's options (nothing is left for torchrun to do), a TF_CONFIG already set (neither
    would win) and torchrun's variables (they would win over TF_CONFIG, silently)."""
    environ = os.environ if environ is None else environ
    given = [flag for flag in TF1_FLAGS if getattr(arguments, flag, None) is not None]
    said = f"the TF 1.x task flags ({', '.join(f'--{flag}' for flag in given)})"
    if getattr(arguments, "from_tf_config", False):
        raise ConfigError(
            f"--from_tf_config takes the cluster from TF_CONFIG, and {said} describe it as TF 1.x scripts took it: "
            "give one of the two.",
            field="from_tf_config",
        )
    written = [
        dest for dest in _written_torchrun_options(arguments) if dest not in TF1_KEPT_TORCHRUN_OPTIONS | {*TF1_FLAGS}
    ]
    if written:
        flags = ", ".join(f"--{dest}" for dest in written)
        raise ConfigError(
            f"{said} run this one task in this process's place, without torchrun, so torchrun's {flags} cannot be "
            "given too: start one command per task (one process each), or drop the TF 1.x flags and use torchrun's "
            "options (--nnodes, --nproc_per_node) or --from_tf_config.",
            field=written[0],
        )
    if environ.get("TF_CONFIG", "").strip():
        raise ConfigError(
            f"TF_CONFIG is already set in this environment, and {said} would make another one; neither wins. Unset "
            "TF_CONFIG to use the flags, or drop the flags to use TF_CONFIG (python script.py, or "
            "torchestimator launch --from_tf_config).",
            field="TF_CONFIG",
            value=environ.get("TF_CONFIG"),
        )
    launched = [name for name in ("RANK", "WORLD_SIZE") if environ.get(name)]
    if launched:
        raise ConfigError(
            f"{' and '.join(launched)} are set in this environment (torchrun's variables, as in a process torchrun "
            "started): the program would read them before the TF_CONFIG the TF 1.x flags make. Unset them, or run "
            "the task outside torchrun.",
            field=launched[0],
        )
    hosts = {f"{job}_hosts": getattr(arguments, f"{job}_hosts", None) for job in TF1_HOSTS_FLAGS}
    tf_config = tf_config_from_tf1_flags(
        getattr(arguments, "job_name", None), getattr(arguments, "task_index", None), **hosts
    )
    cluster_from_tf_config({"TF_CONFIG": json.dumps(tf_config)})  # TF_CONFIG's own rules, as the program reads it
    return tf_config


def _written_torchrun_options(arguments: argparse.Namespace) -> list[str]:
    """The options the command line wrote (``parse_launch_arguments``' ``given_options``); for a namespace parsed
    otherwise, those whose value is not the default."""
    given = getattr(arguments, "given_options", None)
    if given is not None:
        return list(given)
    defaults = launch_parser()
    return [
        action.dest
        for action in defaults._actions
        if action.option_strings
        and action.dest != "help"
        and getattr(arguments, action.dest, None) != defaults.get_default(action.dest)
    ]


def run_tf1_task(arguments: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Run the program once, as the one task TF 1.x's flags name, with its TF_CONFIG; the program's exit status.

    The program runs as ``python`` would run it (through ``_replica_main``, as torchrun's workers do), with this
    environment plus ``TF_CONFIG``, its standard streams this process's, in a session of its own: the signals this
    process gets (``FORWARDED_SIGNALS``) are passed on once each, and its exit status is returned (128 + N when
    signal N ended it, as a shell says).
    """
    environ = os.environ if environ is None else environ
    tf_config = tf1_task_tf_config(arguments, environ)
    command = _tf1_task_command(arguments)
    text = json.dumps(tf_config)
    task = tf_config["task"]
    mapped = (
        f" (worker 0 is the chief, as in TF 1.x; TF_CONFIG names it {task['type']}:{task['index']})"
        if (task["type"], task["index"]) != (arguments.job_name, arguments.task_index)
        else ""
    )
    logger.info("Task %s:%d%s runs with TF_CONFIG=%s", arguments.job_name, arguments.task_index, mapped, text)
    return run_in_place(command, {**environ, "TF_CONFIG": text}, name=arguments.training_script)


def _tf1_task_command(arguments: argparse.Namespace) -> list[str]:
    script, script_arguments = arguments.training_script, list(arguments.training_script_args)
    if arguments.no_python:
        if arguments.module:
            raise ConfigError("--no_python and -m (--module) cannot be given together.", field="module")
        return [script, *script_arguments]
    program = ["-m", script] if arguments.module else [script]
    return [sys.executable, "-m", REPLICA_MAIN, *program, *script_arguments]


def run_in_place(command: Sequence[str], environ: Mapping[str, str], *, name: str | None = None) -> int:
    """Run ``command`` as a child in a session of its own, passing on the signals this process gets; its status.

    A session of its own (as torchrun starts its workers): a Ctrl-C reaches the child once, through this process,
    not twice. The signals are passed on while the child runs (outside the main thread they cannot be caught, and
    the child gets only what reaches it directly). A child ended by signal N gives 128 + N.
    """
    process: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def pass_on(number: int, frame: Any) -> None:
        if process is None:
            pending.append(number)
        elif process.poll() is None:
            process.send_signal(number)

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for name in FORWARDED_SIGNALS:
            number = getattr(signal, name, None)
            if number is not None:
                previous[number] = signal.signal(number, pass_on)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        process = subprocess.Popen(list(command), env=dict(environ), start_new_session=True)
        for number in pending:
            process.send_signal(number)
        code = process.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if code < 0:
        logger.error("%s %s.", name or " ".join(command), describe_exit(code))
        return 128 - code
    return code


SHARED_STORE_SWITCH = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torch's switch that gives each restart of the group a fresh rendezvous store."""


def restart_environment(arguments: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """What torchrun's agent needs in its environment for ``--max_restarts`` to resume reliably.

    torch 2.13's agent keeps one TCP store across restarts and the restarted workers use it without a
    per-attempt prefix (pytorch/pytorch#135712), so the new group can read the dead workers' gloo addresses:
    measured here, 3 to 5 of every 6 to 10 restarts failed with "connection refused" or hung in
    init_process_group; with a fresh store per restart, none of 13 did. A value the user set is kept.
    """
    if int(getattr(arguments, "max_restarts", 0) or 0) > 0 and SHARED_STORE_SWITCH not in environ:
        return {SHARED_STORE_SWITCH: "1"}
    return {}


SHUTDOWN_TIMEOUT_SECONDS = 5
"""launch's default for torchrun's ``--shutdown_timeout``: how long the agent waits, after SIGTERM, before it
SIGKILLs a worker when it stops the group (torch's default is 30 s). Workers end at once on SIGTERM unless
they are stopped (SIGSTOP) or hung in the kernel, or the program handles SIGTERM itself: give such a
program the time it needs with ``--shutdown_timeout`` or TORCH_ELASTIC_SHUTDOWN_TIMEOUT."""


def shutdown_timeout(arguments: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """The agent's SIGTERM -> SIGKILL grace: the user's (option or TORCH_ELASTIC_SHUTDOWN_TIMEOUT), else launch's."""
    given = getattr(arguments, "shutdown_timeout", None)
    if given is not None:
        return int(given)
    configured = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "").strip()
    return int(configured) if configured.isdigit() else SHUTDOWN_TIMEOUT_SECONDS


@contextlib.contextmanager
def _restarts_use_the_shutdown_timeout(seconds: int) -> Iterator[None]:
    """torch 2.13's agent stops a failed group with a fixed 30 s grace, whatever its shutdown timeout: the worker
    processes' context closes the survivors of a failure with ``close()``'s default, and ``_stop_workers`` calls
    ``_shutdown()`` without the agent's timeout. So a stopped worker (SIGSTOP, or hung in the kernel) delays every
    restart by 30 s. For this launch only, both use ``seconds``."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext

    original_stop, original_close = LocalElasticAgent._stop_workers, PContext.close

    def stop_workers(agent: Any, worker_group: Any) -> None:
        agent._shutdown(timeout=getattr(agent, "_shutdown_timeout", seconds))

    def close(context: Any, death_sig: Any = None, timeout: int = seconds) -> None:
        original_close(context, death_sig, timeout)

    # A patch of torch's methods for the launch: mypy refuses replacing a method (and binds close's self twice).
    LocalElasticAgent._stop_workers, PContext.close = stop_workers, close  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        LocalElasticAgent._stop_workers, PContext.close = original_stop, original_close  # type: ignore[method-assign]


def through_replica_main(arguments: argparse.Namespace) -> argparse.Namespace:
    """torchrun's arguments with the program run by ``_replica_main``, which ends each worker without finalizing
    the interpreter (a C++ thread of torch meeting finalization aborts the worker after its work is done).

    Left as they are for what it cannot run: ``--no-python`` (not a Python program), ``--run-path`` (in torchrun's
    own process) and ``--no-use-env`` (torchrun puts ``--local-rank`` before the program's arguments).
    """
    from torch.distributed.run import get_use_env

    if arguments.no_python or arguments.run_path or not get_use_env(arguments):
        return arguments
    program = ["-m", arguments.training_script] if arguments.module else [arguments.training_script]
    return argparse.Namespace(
        **{
            **vars(arguments),
            "module": True,
            "training_script": REPLICA_MAIN,
            "training_script_args": [*program, *arguments.training_script_args],
        }
    )


def run_torchrun(arguments: argparse.Namespace) -> int:
    """``torch.distributed.run.run``, with a failed child or rendezvous turned into an exit code and a log line."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import run

    os.environ.update(restart_environment(arguments, os.environ))
    grace = shutdown_timeout(arguments, os.environ)
    arguments = argparse.Namespace(**{**vars(arguments), "shutdown_timeout": grace})
    try:
        with _restarts_use_the_shutdown_timeout(grace):
            run(through_replica_main(arguments))  # type: ignore[no-untyped-call]  # unannotated in torch
    except ChildFailedError as error:
        error.name = arguments.training_script  # torch names the entry point: _replica_main
        logger.error("%s", error.format_msg())  # type: ignore[no-untyped-call]  # unannotated in torch
        exit_codes = [failure.exitcode for failure in error.failures.values() if failure.exitcode]
        return exit_codes[0] if exit_codes and exit_codes[0] > 0 else 1
    except RendezvousError as error:
        logger.error(
            "torchrun's rendezvous failed (%s: %s). Check that every node runs the same --nnodes, --rdzv_id and "
            "--rdzv_endpoint, that the endpoint's host:port is reachable from every node, and that the other "
            "nodes started in time.",
            type(error).__name__,
            error,
        )
        return 1
    return 0
