"""Where this process sits in a training cluster, read from the environment in one named step.

Belongs here: ``ClusterSpec`` and the readers that fill it from the variables
``torchrun`` sets (also set by Kubeflow's PyTorchJob and Ray Train), from
``TF_CONFIG`` (TensorFlow's rules: the chief is rank 0, worker i is rank i + 1,
the legacy ``master``), and from SLURM's ``srun`` variables (with its
``node[01-03]`` host lists); ``resolve_cluster`` picks the first that applies,
in that order, and says which in ``.source``. Every malformed value is a
``ConfigError`` naming the variable or field. Does not belong here: starting
processes (``launcher.py``) and process groups (``strategy.py``); nothing here
touches the network.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from torchestimator.errors import ConfigError

CHIEF, WORKER, EVALUATOR, MASTER, PS = "chief", "worker", "evaluator", "master", "ps"
"""TensorFlow's task types (TaskType in tf.estimator's run_config.py)."""

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""The variables torchrun sets that init_process_group(init_method="env://") needs."""

SOURCES = ("torchrun", "tf_config", "slurm", "local")
"""What ``resolve_cluster`` reads, in the order it tries them (``ClusterSpec.source``)."""

SLURM_DEFAULT_PORT_BASE = 15000
"""Under SLURM without MASTER_PORT the port is this plus the job id's last 4 digits (Lightning's rule)."""

SLURM_FALLBACK_PORT = 12910
"""Lightning's port for a SLURM environment without a job id; MASTER_PORT overrides it."""

_TF_CONFIG_HINT = "Note that these values may be coming from the TF_CONFIG environment variable."

PS_ADVICE = (
    "A TF_CONFIG with 'ps' tasks trains with parameter servers: set "
    "RunConfig(train_distribute=te.distribute.ParameterServerStrategy()) in every task (chief, workers and ps "
    "run the same program; the ps tasks serve the variables). Or remove the 'ps' job from TF_CONFIG (and do not "
    "start its tasks) to train synchronously with te.MultiWorkerMirroredStrategy()."
)
"""Why a ``ps`` task is refused, and what to use instead."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """This process's place in a training cluster, in TensorFlow's and torch.distributed's terms."""

    task_type: str = WORKER
    """chief, worker, evaluator, ps or the legacy master; torchrun and SLURM ranks are chief (0) or worker."""
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
    """torch.distributed rank of this process; None for tasks outside the training group (evaluator, ps)."""
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
    """Where this description came from: torchrun, tf_config, slurm or local."""

    @property
    def in_training_group(self) -> bool:
        """Whether this process joins the torch.distributed process group (False for evaluator and ps tasks)."""
        return self.rank is not None

    @property
    def spans_several_processes(self) -> bool:
        """Whether the training group this describes has more than one process."""
        return self.world_size is not None and self.world_size > 1

    def torch_environ(self) -> dict[str, str]:
        """The variables init_process_group(init_method="env://") reads, for this process."""
        if self.task_type == PS:
            raise ConfigError(
                f"A 'ps' task does not join the torch.distributed process group. {PS_ADVICE}",
                field="TF_CONFIG",
                value="ps",
            )
        if self.rank is None or self.world_size is None:
            raise ConfigError(
                f"A {self.task_type!r} task does not join the torch.distributed process group "
                "(the evaluator evaluates checkpoints on its own). Run it as a plain `python train.py` with one "
                "replica, or give it a chief or worker task.",
                field="TF_CONFIG",
                value=self.task_type,
            )
        if self.master_addr is None or self.master_port is None:
            raise ConfigError(
                f"This {self.source} cluster description names no rendezvous address (master_addr="
                f"{self.master_addr!r}, master_port={self.master_port!r}); a single local process "
                "needs no process group. Describe the cluster in TF_CONFIG or run under torchrun.",
                field="master_addr",
            )
        return {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        }


# ---------------------------------------------------------------- the resolver


def resolve_cluster(environ: Mapping[str, str] | None = None) -> ClusterSpec:
    """The cluster this process belongs to, from the first description the environment holds.

    The order: torchrun's variables (RANK and WORLD_SIZE; Kubeflow PyTorchJob and Ray Train set them
    too, so they win), then a ``TF_CONFIG`` that has a ``cluster``, then SLURM's ``srun`` variables
    (SLURM_PROCID and SLURM_NTASKS, unless the job is named ``bash`` or ``interactive``, Lightning's
    rule for an interactive allocation), else one local process. ``.source`` says which was used.
    """
    environ = os.environ if environ is None else environ
    launched = cluster_from_torchrun(environ)
    if launched is not None:
        return launched
    tf_cluster = cluster_from_tf_config(environ)
    if tf_cluster.jobs or tf_cluster.task_type == EVALUATOR:
        return tf_cluster
    slurm = cluster_from_slurm(environ)
    if slurm is not None:
        return slurm
    # A TF_CONFIG without a cluster still names model_dir and session masters for one local task.
    return dataclasses.replace(tf_cluster, source="local")


# ---------------------------------------------------------------- TF_CONFIG


def cluster_from_tf_config(environ: Mapping[str, str] | None = None) -> ClusterSpec:
    """Parse ``TF_CONFIG`` as tf.estimator's RunConfig does (run_config.py, L50-333 and L640-732).

    Without ``TF_CONFIG`` (or without its ``cluster``) the run is local. torch.distributed
    runs one process per chief/worker task: the chief (or legacy master) is rank 0 and
    serves the rendezvous store at its own address; worker i is rank i + 1. Tasks that
    share a host are numbered on it (``local_rank``) in rank order, so each picks its own GPU.
    """
    environ = os.environ if environ is None else environ
    tf_config = _load_tf_config(environ.get("TF_CONFIG", ""))
    jobs = _read_cluster(tf_config.get("cluster") or {})
    task = tf_config.get("task") or {}
    if not isinstance(task, Mapping):
        raise ConfigError(
            f'TF_CONFIG["task"] must be an object like {{"type": "worker", "index": 0}}; received {task!r}.',
            field='TF_CONFIG["task"]',
            value=task,
        )
    common: dict[str, Any] = {"model_dir": tf_config.get("model_dir"), "source": "tf_config"}
    if not jobs:
        return _local_cluster(tf_config, task, common)
    if MASTER in jobs:
        return _legacy_master_cluster(tf_config, task, jobs, common)
    task_type, task_index = _validate_task(jobs, task, CHIEF)
    evaluation_master = _evaluation_master(task_type, tf_config)
    if task_type == EVALUATOR:
        # TensorFlow drops the cluster for the evaluator: it is not part of training.
        return ClusterSpec(
            task_type=task_type,
            task_index=task_index,
            is_chief=False,
            num_worker_replicas=0,
            num_ps_replicas=0,
            global_id_in_cluster=None,
            jobs={},
            master="",
            evaluation_master=evaluation_master,
            rank=None,
            world_size=None,
            **common,
        )
    return _training_cluster(tf_config, task_type, task_index, jobs, CHIEF, evaluation_master, common)


def _tf_config_error(message: str, field: str, value: Any = None) -> ConfigError:
    return ConfigError(message, field=field, value=value)


def _load_tf_config(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as error:
        raise _tf_config_error(
            f"TF_CONFIG is not valid JSON ({error}); received {text!r}.", "TF_CONFIG", text
        ) from error
    if not isinstance(tf_config, dict):
        raise _tf_config_error(
            f"TF_CONFIG must be a JSON object with 'cluster' and 'task'; received {text!r}.", "TF_CONFIG", text
        )
    return tf_config


def _read_cluster(cluster: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(cluster, Mapping):
        raise _tf_config_error(
            f'TF_CONFIG["cluster"] must map job names to address lists; received {cluster!r}.',
            'TF_CONFIG["cluster"]',
            cluster,
        )
    jobs = {}
    for job, addresses in cluster.items():
        if isinstance(addresses, str) or not isinstance(addresses, (list, tuple)):
            raise _tf_config_error(
                f'TF_CONFIG["cluster"][{job!r}] must be a list of "host:port" strings; received {addresses!r}.',
                f'TF_CONFIG["cluster"][{job!r}]',
                addresses,
            )
        if addresses:
            jobs[str(job)] = tuple(str(address) for address in addresses)
    return jobs


def _local_cluster(tf_config: dict[str, Any], task: Mapping[str, Any], common: dict[str, Any]) -> ClusterSpec:
    task_type = task.get("type", WORKER)
    task_index = _task_index(task.get("index", 0))
    if task_type != WORKER:
        raise _tf_config_error(
            'If "cluster" is not set in TF_CONFIG, task type must be WORKER.', 'TF_CONFIG["task"]["type"]', task_type
        )
    if task_index != 0:
        raise _tf_config_error(
            'If "cluster" is not set in TF_CONFIG, task index must be 0.', 'TF_CONFIG["task"]["index"]', task_index
        )
    return ClusterSpec(
        task_type=task_type,
        task_index=0,
        is_chief=True,
        num_worker_replicas=1,
        num_ps_replicas=0,
        global_id_in_cluster=0,
        master=tf_config.get("session_master", ""),
        evaluation_master=tf_config.get("eval_session_master", ""),
        **common,
    )


def _legacy_master_cluster(
    tf_config: dict[str, Any], task: Mapping[str, Any], jobs: dict[str, tuple[str, ...]], common: dict[str, Any]
) -> ClusterSpec:
    # Two chiefs would be confusing, so TensorFlow refuses chief next to master.
    if CHIEF in jobs:
        raise _tf_config_error(
            "If `master` node exists in `cluster`, job `chief` is not supported.", 'TF_CONFIG["cluster"]', dict(jobs)
        )
    task_type, task_index = _validate_task(jobs, task, MASTER)
    if task_type == EVALUATOR:
        raise _tf_config_error(
            "If `master` node exists in `cluster`, task_type `evaluator` is not supported.",
            'TF_CONFIG["task"]["type"]',
            task_type,
        )
    evaluation_master = _evaluation_master(task_type, tf_config)
    return _training_cluster(tf_config, task_type, task_index, jobs, MASTER, evaluation_master, common)


def _training_cluster(
    tf_config: dict[str, Any],
    task_type: str,
    task_index: int,
    jobs: dict[str, tuple[str, ...]],
    chief_type: str,
    evaluation_master: str,
    common: dict[str, Any],
) -> ClusterSpec:
    trainers = [*jobs[chief_type], *jobs.get(WORKER, ())]  # in rank order
    rank = {chief_type: 0, WORKER: task_index + 1}.get(task_type)
    host, port = _split_address(jobs[chief_type][0], f'TF_CONFIG["cluster"]["{chief_type}"][0]')
    local_rank, local_world_size = 0, 1
    if rank is not None:
        hosts = [_host_of(address) for address in trainers]
        local_rank = hosts[:rank].count(hosts[rank])
        local_world_size = hosts.count(hosts[rank])
    return ClusterSpec(
        task_type=task_type,
        task_index=task_index,
        is_chief=task_type == chief_type,
        num_worker_replicas=len(trainers),
        num_ps_replicas=len(jobs.get(PS, ())),
        global_id_in_cluster=_global_id(jobs, task_type, task_index, chief_type),
        jobs=jobs,
        master=_session_master(jobs, task_type, task_index, tf_config),
        evaluation_master=evaluation_master,
        rank=rank,
        world_size=len(trainers) if rank is not None else None,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=host if rank is not None else None,
        master_port=port if rank is not None else None,
        **common,
    )


def _task_index(value: Any) -> int:
    if isinstance(value, bool):
        value = repr(value)  # True would pass int() as 1
    try:
        return int(value)
    except (TypeError, ValueError) as error:
        raise _tf_config_error(
            f'TF_CONFIG["task"]["index"] must be an integer; received {value!r}.', 'TF_CONFIG["task"]["index"]', value
        ) from error


def _validate_task(jobs: dict[str, tuple[str, ...]], task: Mapping[str, Any], chief_type: str) -> tuple[str, int]:
    if chief_type not in jobs:
        raise _tf_config_error(
            f'If "cluster" is set in TF_CONFIG, it must have one "{chief_type}" node.',
            'TF_CONFIG["cluster"]',
            dict(jobs),
        )
    if len(jobs[chief_type]) > 1:
        raise _tf_config_error(
            f'The "cluster" in TF_CONFIG must have only one "{chief_type}" node.',
            f'TF_CONFIG["cluster"]["{chief_type}"]',
            list(jobs[chief_type]),
        )
    task_type, task_index = task.get("type"), task.get("index")
    if not task_type:
        raise _tf_config_error(
            'If "cluster" is set in TF_CONFIG, task type must be set.', 'TF_CONFIG["task"]["type"]', task_type
        )
    if task_index is None:
        raise _tf_config_error(
            'If "cluster" is set in TF_CONFIG, task index must be set.', 'TF_CONFIG["task"]["index"]', task_index
        )
    task_index = _task_index(task_index)
    if task_index < 0:
        raise _tf_config_error("Task index must be non-negative number.", 'TF_CONFIG["task"]["index"]', task_index)
    # The evaluator has no upper bound: it is not in the training cluster.
    if task_type == EVALUATOR:
        return task_type, task_index
    if task_type not in jobs:
        raise _tf_config_error(
            f"{task_type} is not a valid task_type in the cluster_spec:\n{jobs}\n\n{_TF_CONFIG_HINT}",
            'TF_CONFIG["task"]["type"]',
            task_type,
        )
    if not 0 <= task_index < len(jobs[task_type]):
        raise _tf_config_error(
            f"{task_index} is not a valid task_id for task_type {task_type} in the cluster_spec:\n"
            f"{jobs}\n\n{_TF_CONFIG_HINT}",
            'TF_CONFIG["task"]["index"]',
            task_index,
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
        master: str = tf_config["session_master"]
        return master
    # A single-node cluster runs locally in TensorFlow, without an RPC master.
    if len(jobs) == 1 and len(next(iter(jobs.values()))) == 1:
        return ""
    return "grpc://" + jobs[task_type][task_index]


def _evaluation_master(task_type: str, tf_config: dict[str, Any]) -> str:
    if "eval_session_master" in tf_config:
        master: str = tf_config["eval_session_master"]
        return master
    if task_type == EVALUATOR:
        session_master: str = tf_config.get("session_master", "")
        return session_master
    return ""


def _split_address(address: str, field: str) -> tuple[str, int]:
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _tf_config_error(
            f'The address {field} in TF_CONFIG must be "host:port"; received {address!r}. '
            "torch.distributed uses the chief's as MASTER_ADDR and MASTER_PORT.",
            field,
            address,
        )
    return host.strip("[]"), int(port)


def _host_of(address: str) -> str:
    host, separator, _ = address.rpartition(":")
    return host.strip("[]") if separator else address


# ---------------------------------------------------------------- torchrun


def cluster_from_torchrun(environ: Mapping[str, str] | None = None) -> ClusterSpec | None:
    """The cluster torchrun (or ``torchestimator launch``) describes in its variables; None if absent.

    RANK or WORLD_SIZE mark a launched process (MASTER_ADDR/MASTER_PORT alone do not: under
    SLURM they only override the rendezvous address). Rank 0 is the chief; rank r > 0 is
    worker r - 1, as in a TF_CONFIG cluster. Without LOCAL_RANK (Kubeflow's PyTorchJob sets
    only RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, one process per pod) the process is
    alone on its machine: local rank 0 of 1.
    """
    environ = os.environ if environ is None else environ
    if not (environ.get("RANK") or environ.get("WORLD_SIZE")):
        return None
    present = [name for name in TORCHRUN_VARIABLES if environ.get(name)]
    missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"A distributed launch sets {', '.join(TORCHRUN_VARIABLES)}; this environment has "
            f"{', '.join(present)} but not {', '.join(missing)}. Start the program with torchrun or "
            "`torchestimator launch`, or unset the partial variables to run in one process.",
            field=missing[0],
        )
    rank, world_size = _integer(environ, "RANK"), _integer(environ, "WORLD_SIZE")
    # Without LOCAL_RANK each process is alone on its machine: Kubeflow's PyTorchJob runs one per pod.
    local_rank = _integer(environ, "LOCAL_RANK", default=0)
    local_world_size = _integer(environ, "LOCAL_WORLD_SIZE", default=world_size if environ.get("LOCAL_RANK") else 1)
    if world_size < 1 or not 0 <= rank < world_size or not 0 <= local_rank < local_world_size:
        raise ConfigError(
            f"Inconsistent distributed variables: RANK={rank}, WORLD_SIZE={world_size}, "
            f"LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world_size}; expected "
            "0 <= RANK < WORLD_SIZE and 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE.",
            field="RANK",
            value=rank,
        )
    return ClusterSpec(
        task_type=CHIEF if rank == 0 else WORKER,
        task_index=0 if rank == 0 else rank - 1,
        is_chief=rank == 0,
        num_worker_replicas=world_size,
        num_ps_replicas=0,
        global_id_in_cluster=rank,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=environ["MASTER_ADDR"],
        master_port=_port(environ, "MASTER_PORT"),
        source="torchrun",
    )


def _integer(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = environ.get(name)
    if not text and default is not None:
        return default
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"Environment variable {name} must be an integer; received {text!r}.", field=name, value=text
        ) from error


def _port(environ: Mapping[str, str], name: str) -> int:
    port = _integer(environ, name)
    if not 0 < port < 65536:
        raise ConfigError(
            f"Environment variable {name} must be a TCP port in [1, 65535]; received {port}.", field=name, value=port
        )
    return port


# ---------------------------------------------------------------- SLURM


def cluster_from_slurm(environ: Mapping[str, str] | None = None) -> ClusterSpec | None:
    """The cluster an ``srun`` step describes (one task per process); None outside SLURM.

    Rank is SLURM_PROCID, world size SLURM_NTASKS, local rank SLURM_LOCALID; the processes on
    this node are SLURM_NTASKS_PER_NODE, else this node's entry (SLURM_NODEID) of
    SLURM_TASKS_PER_NODE (``"2(x3),1"``). The rendezvous host is MASTER_ADDR if set, else the
    first host of SLURM_NODELIST (or SLURM_JOB_NODELIST); the port is MASTER_PORT if set, else
    15000 + the last 4 digits of SLURM_JOB_ID, so every task of the job computes the same one.
    An allocation whose job is named ``bash`` or ``interactive`` is not treated as a launch.
    """
    environ = os.environ if environ is None else environ
    if "SLURM_PROCID" not in environ or "SLURM_NTASKS" not in environ:
        return None
    if environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    rank, world_size = _integer(environ, "SLURM_PROCID"), _integer(environ, "SLURM_NTASKS")
    local_rank = _integer(environ, "SLURM_LOCALID", default=0)
    local_world_size = _slurm_local_world_size(environ)
    if world_size < 1 or not 0 <= rank < world_size or not 0 <= local_rank < local_world_size:
        raise ConfigError(
            f"Inconsistent SLURM variables: SLURM_PROCID={rank}, SLURM_NTASKS={world_size}, "
            f"SLURM_LOCALID={local_rank}, tasks on this node={local_world_size}; expected "
            "0 <= SLURM_PROCID < SLURM_NTASKS and 0 <= SLURM_LOCALID < tasks per node.",
            # The field to fix: the local rank when the global one is in range.
            field="SLURM_PROCID" if world_size < 1 or not 0 <= rank < world_size else "SLURM_LOCALID",
            value=rank if world_size < 1 or not 0 <= rank < world_size else local_rank,
        )
    return ClusterSpec(
        task_type=CHIEF if rank == 0 else WORKER,
        task_index=0 if rank == 0 else rank - 1,
        is_chief=rank == 0,
        num_worker_replicas=world_size,
        num_ps_replicas=0,
        global_id_in_cluster=rank,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        master_addr=environ.get("MASTER_ADDR") or _slurm_first_host(environ),
        master_port=_slurm_port(environ),
        source="slurm",
    )


def _slurm_local_world_size(environ: Mapping[str, str]) -> int:
    if environ.get("SLURM_NTASKS_PER_NODE"):
        return _integer(environ, "SLURM_NTASKS_PER_NODE")
    if environ.get("SLURM_TASKS_PER_NODE"):
        counts = expand_tasks_per_node(environ["SLURM_TASKS_PER_NODE"], "SLURM_TASKS_PER_NODE")
        node = _integer(environ, "SLURM_NODEID", default=0)
        if not 0 <= node < len(counts):
            raise ConfigError(
                f"SLURM_NODEID={node} but SLURM_TASKS_PER_NODE={environ['SLURM_TASKS_PER_NODE']!r} describes "
                f"{len(counts)} node(s).",
                field="SLURM_NODEID",
                value=node,
            )
        return counts[node]
    return 1


def _slurm_first_host(environ: Mapping[str, str]) -> str:
    for name in ("SLURM_NODELIST", "SLURM_JOB_NODELIST"):
        if environ.get(name):
            return expand_hostlist(environ[name], name)[0]
    raise ConfigError(
        "SLURM_PROCID and SLURM_NTASKS are set but neither SLURM_NODELIST nor SLURM_JOB_NODELIST names the "
        "job's hosts, so the rendezvous host is unknown. Set MASTER_ADDR to the first task's host.",
        field="SLURM_NODELIST",
    )


def _slurm_port(environ: Mapping[str, str]) -> int:
    if environ.get("MASTER_PORT"):
        return _port(environ, "MASTER_PORT")
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id:
        return SLURM_FALLBACK_PORT
    if not job_id.isdigit():
        raise ConfigError(
            f"SLURM_JOB_ID={job_id!r} is not a number, so the rendezvous port cannot be derived from it "
            f"({SLURM_DEFAULT_PORT_BASE} + its last 4 digits). Set MASTER_PORT.",
            field="SLURM_JOB_ID",
            value=job_id,
        )
    return SLURM_DEFAULT_PORT_BASE + int(job_id[-4:])


_HOST_ITEM = re.compile(r"([^\[\],]*)(\[[^\[\]]*\])?")


def expand_hostlist(hostlist: str, variable: str = "SLURM_NODELIST") -> list[str]:
    """SLURM's compressed host list in full: ``"node[01-03,07],gpu5"`` -> node01, node02, node03, node07, gpu5.

    Zero padding follows the range's first bound; several bracket groups in one name
    (``rack[1-2]-n[1-2]``) expand to every combination, in SLURM's order.
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist, variable):
        parts: list[list[str]] = []
        position = 0
        while position < len(item):
            match = _HOST_ITEM.match(item, position)
            assert match is not None  # the pattern matches the empty string
            prefix, brackets = match.group(1), match.group(2)
            if not prefix and not brackets:
                raise _hostlist_error(hostlist, variable, f"unexpected {item[position]!r} at {item!r}")
            parts.append([prefix])
            if brackets:
                parts.append(_expand_ranges(brackets[1:-1], hostlist, variable))
            position = match.end()
        hosts += ["".join(combination) for combination in itertools.product(*parts)]
    if not hosts:
        raise _hostlist_error(hostlist, variable, "it names no host")
    return hosts


def expand_tasks_per_node(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """SLURM's per-node task counts in full: ``"2(x3),1"`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None or int(match.group(1)) < 1:
            raise ConfigError(
                f'{variable}={text!r} is not a SLURM task count list like "2(x3),1" (at {item!r}).',
                field=variable,
                value=text,
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _split_top_level(hostlist: str, variable: str) -> list[str]:
    items, depth, start = [], 0, 0
    for index, character in enumerate(hostlist):
        if character == "[":
            depth += 1
        elif character == "]":
            depth -= 1
        if depth not in (0, 1):
            raise _hostlist_error(hostlist, variable, "its brackets do not pair up")
        if character == "," and depth == 0:
            items.append(hostlist[start:index])
            start = index + 1
    if depth != 0:
        raise _hostlist_error(hostlist, variable, "its brackets do not pair up")
    items.append(hostlist[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_ranges(ranges: str, hostlist: str, variable: str) -> list[str]:
    names: list[str] = []
    for part in ranges.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if match is None:
            raise _hostlist_error(hostlist, variable, f"[{ranges}] holds {part!r}, not a number or a range a-b")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise _hostlist_error(hostlist, variable, f"the range {part!r} runs backwards")
        names += [str(number).zfill(len(first)) for number in range(int(first), int(last) + 1)]
    return names


def _hostlist_error(hostlist: str, variable: str, reason: str) -> ConfigError:
    return ConfigError(
        f'{variable}={hostlist!r} is not a SLURM host list like "node[01-03,07],gpu5": {reason}.',
        field=variable,
        value=hostlist,
    )
