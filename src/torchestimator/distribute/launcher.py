"""Where the processes come from: cluster descriptions and process launching.

Belongs here: reading a cluster from ``TF_CONFIG`` or from the variables
``torchrun`` sets (each an explicit, named step, never done in a constructor),
starting the local replicas of a plain ``python script.py`` run, and
``launch``, which hands a command to ``torchrun`` (``torch.distributed.run``).
Does not belong here: process groups, devices and module wrapping (those are
the strategies', in ``strategy.py``).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from torchestimator.errors import RelaunchError

logger = logging.getLogger(__name__)

CHIEF, WORKER, EVALUATOR, MASTER, PS = "chief", "worker", "evaluator", "master", "ps"
"""TensorFlow's task types (TaskType in tf.estimator's run_config.py)."""

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""The variables torchrun sets that init_process_group(init_method="env://") needs."""

_TF_CONFIG_HINT = "Note that these values may be coming from the TF_CONFIG environment variable."


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """This process's place in a training cluster, in TensorFlow's and torch.distributed's terms."""

    task_type: str = WORKER
    """chief, worker, evaluator, ps or the legacy master."""
    task_index: int = 0
    """Index of this task within its job."""
    is_chief: bool = True
    """The task that writes checkpoints and summaries (chief, or master in legacy clusters)."""
    num_worker_replicas: int = 1
    """Tasks that train: workers plus the chief (or master)."""
    num_ps_replicas: int = 0
    """Parameter servers in the cluster; torch.distributed has no use for them."""
    global_id_in_cluster: int | None = 0
    """TensorFlow's id: chief 0, other jobs alphabetically by index, ps last; None for the evaluator."""
    jobs: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """The cluster: job name to host:port addresses (empty when local or for the evaluator)."""
    master: str = ""
    """TensorFlow's session master ('' for local, else grpc://host:port)."""
    evaluation_master: str = ""
    """TensorFlow's evaluation session master."""
    model_dir: str | None = None
    """model_dir given in TF_CONFIG, if any."""
    rank: int | None = 0
    """torch.distributed rank of this process; None for tasks outside the training group."""
    world_size: int | None = 1
    """torch.distributed world size; None for tasks outside the training group."""
    local_rank: int = 0
    """Index of this process on its machine (picks the GPU)."""
    local_world_size: int = 1
    """Processes training on this machine."""
    master_addr: str | None = None
    """Host of the rank-0 process that serves the rendezvous store; None when local."""
    master_port: int | None = None
    """Port of that store; None when local."""
    source: str = "local"
    """Where this description came from: local, tf_config or torchrun."""

    @property
    def in_training_group(self) -> bool:
        """Whether this process joins the torch.distributed process group."""
        return self.rank is not None

    def torch_environ(self) -> dict[str, str]:
        """The variables init_process_group(init_method="env://") reads, for this process."""
        if self.rank is None or self.world_size is None:
            raise ValueError(
                f"A {self.task_type!r} task does not join the torch.distributed process group "
                "(the evaluator evaluates on its own; torch.distributed has no parameter servers). "
                "Run it without a distribute strategy, or give it a chief or worker task."
            )
        if self.master_addr is None or self.master_port is None:
            raise ValueError(
                f"This {self.source} cluster description names no rendezvous address (master_addr="
                f"{self.master_addr!r}, master_port={self.master_port!r}); a single local process "
                "needs no process group. Describe the cluster in TF_CONFIG or run under torchrun."
            )
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        }


# ---------------------------------------------------------------- TF_CONFIG


def cluster_from_tf_config(environ: Mapping[str, str] | None = None) -> ClusterSpec:
    """Parse ``TF_CONFIG`` as tf.estimator's RunConfig does (run_config.py, L50-333 and L640-732).

    Without ``TF_CONFIG`` (or without its ``cluster``) the run is local. torch.distributed
    runs one process per chief/worker task: the chief (or legacy master) is rank 0 and
    serves the rendezvous store at its own address; worker i is rank i + 1.
    """
    environ = os.environ if environ is None else environ
    tf_config = _load_tf_config(environ.get("TF_CONFIG", ""))
    jobs = _read_cluster(tf_config.get("cluster") or {})
    task = tf_config.get("task") or {}
    if not isinstance(task, Mapping):
        raise ValueError(
            f'TF_CONFIG["task"] must be an object like {{"type": "worker", "index": 0}}; received {task!r}.'
        )
    common = {"model_dir": tf_config.get("model_dir"), "source": "tf_config"}
    if not jobs:
        return _local_cluster(tf_config, task, common)
    if MASTER in jobs:
        return _legacy_master_cluster(tf_config, task, jobs, common)
    task_type, task_index = _validate_task(jobs, task, CHIEF)
    evaluation_master = _evaluation_master(task_type, tf_config)
    if task_type == EVALUATOR:
        # TensorFlow drops the cluster for the evaluator: it is not part of training.
        return ClusterSpec(
            task_type=task_type, task_index=task_index, is_chief=False, num_worker_replicas=0,
            num_ps_replicas=0, global_id_in_cluster=None, jobs={}, master="",
            evaluation_master=evaluation_master, rank=None, world_size=None, **common,
        )
    return _training_cluster(tf_config, task_type, task_index, jobs, CHIEF, evaluation_master, common)


def _load_tf_config(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}); received {text!r}.") from error
    if not isinstance(tf_config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object with 'cluster' and 'task'; received {text!r}.")
    return tf_config


def _read_cluster(cluster: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(cluster, Mapping):
        raise ValueError(f'TF_CONFIG["cluster"] must map job names to address lists; received {cluster!r}.')
    jobs = {}
    for job, addresses in cluster.items():
        if isinstance(addresses, str) or not isinstance(addresses, (list, tuple)):
            raise ValueError(
                f'TF_CONFIG["cluster"][{job!r}] must be a list of "host:port" strings; received {addresses!r}.'
            )
        if addresses:
            jobs[str(job)] = tuple(str(address) for address in addresses)
    return jobs


def _local_cluster(tf_config: dict[str, Any], task: Mapping[str, Any], common: dict[str, Any]) -> ClusterSpec:
    task_type = task.get("type", WORKER)
    task_index = _task_index(task.get("index", 0))
    if task_type != WORKER:
        raise ValueError('If "cluster" is not set in TF_CONFIG, task type must be WORKER.')
    if task_index != 0:
        raise ValueError('If "cluster" is not set in TF_CONFIG, task index must be 0.')
    return ClusterSpec(
        task_type=task_type, task_index=0, is_chief=True, num_worker_replicas=1, num_ps_replicas=0,
        global_id_in_cluster=0, master=tf_config.get("session_master", ""),
        evaluation_master=tf_config.get("eval_session_master", ""), **common,
    )


def _legacy_master_cluster(
    tf_config: dict[str, Any], task: Mapping[str, Any], jobs: dict[str, tuple[str, ...]], common: dict[str, Any]
) -> ClusterSpec:
    # Two chiefs would be confusing, so TensorFlow refuses chief next to master.
    if CHIEF in jobs:
        raise ValueError("If `master` node exists in `cluster`, job `chief` is not supported.")
    task_type, task_index = _validate_task(jobs, task, MASTER)
    if task_type == EVALUATOR:
        raise ValueError("If `master` node exists in `cluster`, task_type `evaluator` is not supported.")
    evaluation_master = _evaluation_master(task_type, tf_config)
    return _training_cluster(tf_config, task_type, task_index, jobs, MASTER, evaluation_master, common)


def _training_cluster(
    tf_config: dict[str, Any], task_type: str, task_index: int, jobs: dict[str, tuple[str, ...]],
    chief_type: str, evaluation_master: str, common: dict[str, Any],
) -> ClusterSpec:
    num_workers = len(jobs.get(WORKER, ())) + len(jobs.get(chief_type, ()))
    rank = {chief_type: 0, WORKER: task_index + 1}.get(task_type)
    host, port = _split_address(jobs[chief_type][0], chief_type)
    return ClusterSpec(
        task_type=task_type, task_index=task_index, is_chief=task_type == chief_type,
        num_worker_replicas=num_workers, num_ps_replicas=len(jobs.get(PS, ())),
        global_id_in_cluster=_global_id(jobs, task_type, task_index, chief_type), jobs=jobs,
        master=_session_master(jobs, task_type, task_index, tf_config), evaluation_master=evaluation_master,
        rank=rank, world_size=num_workers if rank is not None else None,
        master_addr=host if rank is not None else None, master_port=port if rank is not None else None, **common,
    )


def _task_index(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f'TF_CONFIG["task"]["index"] must be an integer; received {value!r}.') from error


def _validate_task(jobs: dict[str, tuple[str, ...]], task: Mapping[str, Any], chief_type: str) -> tuple[str, int]:
    if chief_type not in jobs:
        raise ValueError(f'If "cluster" is set in TF_CONFIG, it must have one "{chief_type}" node.')
    if len(jobs[chief_type]) > 1:
        raise ValueError(f'The "cluster" in TF_CONFIG must have only one "{chief_type}" node.')
    task_type, task_index = task.get("type"), task.get("index")
    if not task_type:
        raise ValueError('If "cluster" is set in TF_CONFIG, task type must be set.')
    if task_index is None:
        raise ValueError('If "cluster" is set in TF_CONFIG, task index must be set.')
    task_index = _task_index(task_index)
    if task_index < 0:
        raise ValueError("Task index must be non-negative number.")
    # The evaluator has no upper bound: it is not in the training cluster.
    if task_type == EVALUATOR:
        return task_type, task_index
    if task_type not in jobs:
        raise ValueError(f"{task_type} is not a valid task_type in the cluster_spec:\n{jobs}\n\n{_TF_CONFIG_HINT}")
    if not 0 <= task_index < len(jobs[task_type]):
        raise ValueError(
            f"{task_index} is not a valid task_id for task_type {task_type} in the cluster_spec:\n"
            f"{jobs}\n\n{_TF_CONFIG_HINT}"
        )
    return task_type, task_index


def _global_id(jobs: dict[str, tuple[str, ...]], task_type: str, task_index: int, chief_type: str) -> int:
    # TensorFlow's order: the chief first, other jobs alphabetically, ps last.
    ordered = [chief_type] + [job for job in sorted(jobs) if job not in (chief_type, PS)]
    if PS in jobs:
        ordered.append(PS)
    next_id = 0
    for job in ordered:
        if job == task_type:
            return next_id + task_index
        next_id += len(jobs[job])
    raise AssertionError(f"task_type {task_type!r} was validated against the cluster {jobs}")


def _session_master(
    jobs: dict[str, tuple[str, ...]], task_type: str, task_index: int, tf_config: dict[str, Any]
) -> str:
    if "session_master" in tf_config:
        return tf_config["session_master"]
    # A single-node cluster runs locally in TensorFlow, without an RPC master.
    if len(jobs) == 1 and len(next(iter(jobs.values()))) == 1:
        return ""
    return "grpc://" + jobs[task_type][task_index]


def _evaluation_master(task_type: str, tf_config: dict[str, Any]) -> str:
    if "eval_session_master" in tf_config:
        return tf_config["eval_session_master"]
    if task_type == EVALUATOR:
        return tf_config.get("session_master", "")
    return ""


def _split_address(address: str, job: str) -> tuple[str, int]:
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit():
        raise ValueError(
            f'The {job} address in TF_CONFIG["cluster"] must be "host:port"; received {address!r}. '
            "torch.distributed uses it as MASTER_ADDR and MASTER_PORT."
        )
    return host.strip("[]"), int(port)


# ---------------------------------------------------------------- torchrun


def cluster_from_torchrun(environ: Mapping[str, str] | None = None) -> ClusterSpec | None:
    """The cluster torchrun (or ``torchestimator launch``) describes in its variables; None if absent.

    Rank 0 is the chief; rank r > 0 is worker r - 1, as in a TF_CONFIG cluster.
    """
    environ = os.environ if environ is None else environ
    present = [name for name in TORCHRUN_VARIABLES if environ.get(name)]
    if not present:
        return None
    missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name)]
    if missing:
        raise ValueError(
            f"A distributed launch sets {', '.join(TORCHRUN_VARIABLES)}; this environment has "
            f"{', '.join(present)} but not {', '.join(missing)}. Start the program with torchrun or "
            "`torchestimator launch`, or unset the partial variables to run in one process."
        )
    rank, world_size = _integer(environ, "RANK"), _integer(environ, "WORLD_SIZE")
    local_rank = _integer(environ, "LOCAL_RANK", default=rank)
    local_world_size = _integer(environ, "LOCAL_WORLD_SIZE", default=world_size)
    if world_size < 1 or not 0 <= rank < world_size or not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"Inconsistent distributed variables: RANK={rank}, WORLD_SIZE={world_size}, "
            f"LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world_size}; expected "
            "0 <= RANK < WORLD_SIZE and 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE."
        )
    return ClusterSpec(
        task_type=CHIEF if rank == 0 else WORKER, task_index=0 if rank == 0 else rank - 1,
        is_chief=rank == 0, num_worker_replicas=world_size, num_ps_replicas=0, global_id_in_cluster=rank,
        rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size,
        master_addr=environ["MASTER_ADDR"], master_port=_integer(environ, "MASTER_PORT"), source="torchrun",
    )


def _integer(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if not text and default is not None:
        return default
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise ValueError(f"Environment variable {name} must be an integer; received {text!r}.") from error


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (another program may still take it before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------- self-launch of a plain script


def rerun_command(
    *,
    executable: str,
    orig_argv: Sequence[str],
    argv: Sequence[str],
    main_file: str | None,
    main_spec_name: str | None,
    interactive: bool,
) -> list[str]:
    """The command line that runs this program again, or RelaunchError if there is none.

    ``orig_argv`` keeps the interpreter's own options (``-u``, ``-X ...``) and ``-m``; the
    script path is made absolute from ``__main__.__file__`` so a later chdir does not matter.
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
    if main_spec_name is not None and main_spec_name != "__main__":
        # `python -m package.module args`: orig_argv already ends with the module name.
        return [executable, *options, *orig_argv[program_at:]]
    if main_spec_name == "__main__":
        # A directory or zip archive run as a program: re-run that, not its __main__.py.
        return [executable, *options, os.path.abspath(orig_argv[program_at]), *argv[1:]]
    return [executable, *options, os.path.abspath(main_file), *argv[1:]]


def current_rerun_command() -> list[str]:
    """rerun_command for the running interpreter."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    orig_argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return rerun_command(
        executable=sys.executable, orig_argv=orig_argv, argv=sys.argv,
        main_file=getattr(main, "__file__", None), main_spec_name=getattr(spec, "name", None),
        interactive=bool(sys.flags.interactive) or hasattr(sys, "ps1"),
    )


class LocalReplicas:
    """Replicas 1..N-1 of a plain ``python script.py`` run; this process is replica 0.

    At interpreter exit this process waits for them and reports any that failed.
    """

    def __init__(self, processes: list[subprocess.Popen], command: list[str]) -> None:
        self.processes = processes
        self.command = command

    def finish(self, failure_grace_seconds: float = 5.0) -> list[int | None]:
        """Wait for the replicas (stopping them when this process failed); their exit codes."""
        this_process_failed = getattr(sys, "last_value", None) is not None
        # Replicas blocked in a collective with this process only notice its end when
        # its connections close, so close them before waiting.
        _destroy_process_group()
        deadline = time.monotonic() + failure_grace_seconds if this_process_failed else None
        for process in self.processes:
            _wait_or_stop(process, deadline)
        codes = [process.returncode for process in self.processes]
        for rank, code in enumerate(codes, start=1):
            if code:
                logger.error(
                    "Replica %d of %d (process %d) exited with code %d; its error is printed above. "
                    "Command: %s", rank, len(codes) + 1, self.processes[rank - 1].pid, code,
                    " ".join(self.command),
                )
        return codes

    def _finish_at_exit(self) -> None:
        codes = self.finish()
        if any(codes) and getattr(sys, "last_value", None) is None:
            # Python gives atexit handlers no other way to make the exit status say
            # that a replica failed.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)


def _destroy_process_group() -> None:
    import torch.distributed as distributed

    if distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def _wait_or_stop(process: subprocess.Popen, deadline: float | None) -> None:
    try:
        process.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return
    except subprocess.TimeoutExpired:
        process.terminate()
    try:
        process.wait(5.0)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_local_replicas(num_replicas: int) -> LocalReplicas:
    """Start replicas 1..num_replicas-1 running this program; set this process up as replica 0.

    Each replica gets the variables torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port), and so does this
    process's ``os.environ``, so every later ``setup()`` here and there finds a launched run.
    """
    if num_replicas < 2:
        raise ValueError(f"start_local_replicas needs at least 2 replicas; received {num_replicas}.")
    command = current_rerun_command()
    shared = {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_port()), "WORLD_SIZE": str(num_replicas),
        "LOCAL_WORLD_SIZE": str(num_replicas), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
    }
    if "OMP_NUM_THREADS" not in os.environ:
        # Like torchrun: N processes each using every core would oversubscribe the CPU.
        shared["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // num_replicas))
    processes = []
    for rank in range(1, num_replicas):
        environ = {**os.environ, **shared, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        processes.append(subprocess.Popen(command, env=environ, stdin=subprocess.DEVNULL))
    logger.info(
        "Started %d more replica(s) of this program (processes %s) for %d-replica training: %s",
        num_replicas - 1, [process.pid for process in processes], num_replicas, " ".join(command),
    )
    os.environ.update({**shared, "RANK": "0", "LOCAL_RANK": "0"})
    replicas = LocalReplicas(processes, command)
    atexit.register(replicas._finish_at_exit)
    return replicas


# ---------------------------------------------------------------- torchestimator launch


def torchrun_arguments(
    nproc_per_node: int, command_argv: Sequence[str], *, cluster: ClusterSpec | None = None
) -> list[str]:
    """The torchrun command-line arguments for ``launch``.

    ``command_argv`` is ``["script.py", args...]`` or ``["-m", "package.module", args...]``.
    Without a cluster (or with a local one) the run is standalone on this machine; a
    TF_CONFIG cluster runs one node per chief/worker task, rendezvous at the chief.
    """
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive integer; received {nproc_per_node!r}.")
    command_argv = list(command_argv)
    if not command_argv or command_argv[0] == "-m" and len(command_argv) < 2:
        raise ValueError(
            f"launch needs the program to run, e.g. ['train.py', '--flag'] or ['-m', 'package.module']; "
            f"received {command_argv!r}."
        )
    arguments = [f"--nproc-per-node={nproc_per_node}"]
    if cluster is not None and cluster.rank is None:
        cluster.torch_environ()  # raises the explanation for evaluator and ps tasks
    if cluster is None or cluster.master_addr is None:
        arguments.append("--standalone")
    else:
        arguments += [
            f"--nnodes={cluster.world_size}", f"--node-rank={cluster.rank}",
            f"--master-addr={cluster.master_addr}", f"--master-port={cluster.master_port}",
        ]
    if command_argv[0] == "-m":
        return [*arguments, "--module", *command_argv[1:]]
    return [*arguments, *command_argv]


def launch(nproc_per_node: int, command_argv: Sequence[str], *, cluster: ClusterSpec | None = None) -> int:
    """Run ``command_argv`` in ``nproc_per_node`` processes per node with torchrun; the exit code.

    Inside, ``MirroredStrategy`` finds the launched environment and joins the process group.
    Pass ``cluster=cluster_from_tf_config(os.environ)`` to run across the machines of a TF_CONFIG.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    arguments = parse_args(torchrun_arguments(nproc_per_node, command_argv, cluster=cluster))
    try:
        run(arguments)
    except ChildFailedError as error:
        logger.error("%s", error.format_msg())
        exit_codes = [failure.exitcode for failure in error.failures.values() if failure.exitcode]
        return exit_codes[0] if exit_codes and exit_codes[0] > 0 else 1
    return 0
