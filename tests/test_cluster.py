"""The cluster from the environment (distribute/cluster.py), the strategies that act on it, and launch's options.

Fast unit tests: no process group is formed except a one-process one; where a strategy would join
a group across processes, ``init_process_group`` is replaced by a recorder (tests/test_multinode.py
forms the real groups).
"""

from __future__ import annotations

import json
import re

import pytest
import torch.distributed as distributed

import torchestimator as te
from torchestimator.distribute import (
    ClusterSpec,
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    OneDeviceStrategy,
    cluster_from_slurm,
    cluster_from_tf_config,
    cluster_from_torchrun,
    expand_hostlist,
    resolve_cluster,
)
from torchestimator.distribute.cluster import expand_tasks_per_node
from torchestimator.distribute.launcher import launch_parser, prepare_torchrun_arguments
from torchestimator.distribute.strategy import (
    COLLECTIVE_TIMEOUT_VARIABLE,
    DEFAULT_COLLECTIVE_TIMEOUT_SECONDS,
    collective_timeout_seconds,
)
from torchestimator.errors import ConfigError, TorchEstimatorError

TORCHRUN = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}
SLURM = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_NODELIST": "node[01-02]",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NAME": "train",
}
TWO_TASKS = {"chief": ["127.0.0.1:23456"], "worker": ["127.0.0.1:23457"]}
ENVIRONMENT_NAMES = (
    *TORCHRUN,
    *SLURM,
    "TF_CONFIG",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
    COLLECTIVE_TIMEOUT_VARIABLE,
)


def _tf_config(cluster: dict | None, task: dict | None = None, **extra: object) -> dict[str, str]:
    config: dict = dict(extra)
    if cluster is not None:
        config["cluster"] = cluster
    if task is not None:
        config["task"] = task
    return {"TF_CONFIG": json.dumps(config)}


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No cluster variables from the machine running the tests (CI may run under SLURM or torchrun)."""
    for name in ENVIRONMENT_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---------------------------------------------------------------- the resolver's order


def test_resolve_cluster_is_local_without_a_description() -> None:
    cluster = resolve_cluster({})
    assert cluster.source == "local" and (cluster.rank, cluster.world_size) == (0, 1)
    assert not cluster.spans_several_processes and cluster.master_addr is None
    # A TF_CONFIG without a cluster names one local task and may carry model_dir.
    local = resolve_cluster(_tf_config(None, {"type": "worker", "index": 0}, model_dir="/runs/a"))
    assert (local.source, local.model_dir, local.world_size) == ("local", "/runs/a", 1)


def test_torchrun_variables_win_over_tf_config_and_slurm() -> None:
    # Kubeflow PyTorchJob and Ray Train set torchrun's variables; an inherited TF_CONFIG must not override them.
    environ = {**TORCHRUN, **SLURM, **_tf_config(TWO_TASKS, {"type": "chief", "index": 0})}
    cluster = resolve_cluster(environ)
    assert cluster.source == "torchrun"
    assert (cluster.rank, cluster.world_size, cluster.local_rank, cluster.master_addr, cluster.master_port) == (
        1,
        2,
        1,
        "10.0.0.1",
        29500,
    )


def test_tf_config_with_a_cluster_wins_over_slurm() -> None:
    cluster = resolve_cluster({**SLURM, **_tf_config(TWO_TASKS, {"type": "worker", "index": 0})})
    assert cluster.source == "tf_config"
    assert (cluster.task_type, cluster.rank, cluster.world_size) == ("worker", 1, 2)
    assert (cluster.master_addr, cluster.master_port) == ("127.0.0.1", 23456)
    # Without a cluster in TF_CONFIG, SLURM's step describes the group.
    assert resolve_cluster({**SLURM, **_tf_config(None, {"type": "worker", "index": 0})}).source == "slurm"


def test_the_evaluator_task_is_outside_the_group_and_says_so_by_task_type() -> None:
    environ = _tf_config({**TWO_TASKS, "evaluator": ["127.0.0.1:1"]}, {"type": "evaluator", "index": 0})
    cluster = resolve_cluster(environ)
    assert (cluster.source, cluster.task_type, cluster.rank, cluster.in_training_group) == (
        "tf_config",
        "evaluator",
        None,
        False,
    )


def test_tf_config_numbers_tasks_that_share_a_host() -> None:
    cluster = {"chief": ["a:1"], "worker": ["b:1", "a:2", "a:3", "b:2"]}
    placed = {
        (task_type, index): cluster_from_tf_config(_tf_config(cluster, {"type": task_type, "index": index}))
        for task_type, index in [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("worker", 3)]
    }
    assert {key: (spec.rank, spec.local_rank, spec.local_world_size) for key, spec in placed.items()} == {
        ("chief", 0): (0, 0, 3),
        ("worker", 0): (1, 0, 2),
        ("worker", 1): (2, 1, 3),
        ("worker", 2): (3, 2, 3),
        ("worker", 3): (4, 1, 2),
    }


# ---------------------------------------------------------------- malformed descriptions: ours, quoting the field


@pytest.mark.parametrize(
    "environ, field, message",
    [
        ({"TF_CONFIG": "{cluster"}, "TF_CONFIG", "TF_CONFIG is not valid JSON"),
        (
            _tf_config({"chief": "h:1"}, {"type": "chief", "index": 0}),
            "TF_CONFIG[\"cluster\"]['chief']",
            'must be a list of "host:port" strings',
        ),
        (
            _tf_config(TWO_TASKS, {"type": "worker", "index": 1}),
            'TF_CONFIG["task"]["index"]',
            "1 is not a valid task_id for task_type worker in the cluster_spec",
        ),
        (
            _tf_config(TWO_TASKS, {"type": "worker", "index": True}),
            'TF_CONFIG["task"]["index"]',
            'TF_CONFIG["task"]["index"] must be an integer',
        ),
        (
            _tf_config({"master": ["m:1"], "chief": ["c:1"]}, {"type": "master", "index": 0}),
            'TF_CONFIG["cluster"]',
            "If `master` node exists in `cluster`, job `chief` is not supported.",
        ),
        (
            _tf_config(TWO_TASKS, {"type": "ps", "index": 0}),
            'TF_CONFIG["task"]["type"]',
            "ps is not a valid task_type in the cluster_spec",
        ),
        (
            _tf_config({"chief": ["h:99999"]}, {"type": "chief", "index": 0}),
            'TF_CONFIG["cluster"]["chief"][0]',
            'must be "host:port"',
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "0"},
            "MASTER_PORT",
            "MASTER_PORT must be a TCP port",
        ),
    ],
)
def test_malformed_descriptions_are_config_errors_naming_the_field(environ: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        resolve_cluster(environ)
    assert isinstance(raised.value, TorchEstimatorError) and isinstance(raised.value, ValueError)
    assert raised.value.field == field


def test_master_address_alone_is_no_torchrun_launch() -> None:
    # Users set MASTER_ADDR/MASTER_PORT to steer SLURM's rendezvous; that is not a partial torchrun launch.
    assert cluster_from_torchrun({"MASTER_ADDR": "h", "MASTER_PORT": "1"}) is None
    with pytest.raises(ConfigError, match="but not MASTER_ADDR, MASTER_PORT") as raised:
        cluster_from_torchrun({"RANK": "0", "WORLD_SIZE": "2"})
    assert raised.value.field == "MASTER_ADDR"


# ---------------------------------------------------------------- SLURM


def test_slurm_step_describes_rank_node_and_rendezvous() -> None:
    cluster = cluster_from_slurm(SLURM)
    assert cluster == ClusterSpec(
        task_type="worker",
        task_index=2,
        is_chief=False,
        num_worker_replicas=4,
        global_id_in_cluster=3,
        rank=3,
        world_size=4,
        local_rank=1,
        local_world_size=2,
        master_addr="node01",
        master_port=15000 + 3456,
        source="slurm",
    )


def test_slurm_overrides_and_fallbacks() -> None:
    uneven = {
        **SLURM,
        "SLURM_TASKS_PER_NODE": "2(x3),1",
        "SLURM_NODEID": "3",
        "SLURM_PROCID": "6",
        "SLURM_NTASKS": "7",
        "SLURM_LOCALID": "0",
        "SLURM_NODELIST": "gpu[7,9-10]",
    }
    cluster = cluster_from_slurm(uneven)
    assert (cluster.local_world_size, cluster.master_addr) == (1, "gpu7")
    per_node = cluster_from_slurm({**SLURM, "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "x"})
    assert per_node.local_world_size == 2
    steered = cluster_from_slurm({**SLURM, "MASTER_ADDR": "login1", "MASTER_PORT": "29400"})
    assert (steered.master_addr, steered.master_port) == ("login1", 29400)
    job_nodelist = {name: value for name, value in SLURM.items() if name not in ("SLURM_NODELIST", "SLURM_JOB_ID")}
    fallback = cluster_from_slurm({**job_nodelist, "SLURM_JOB_NODELIST": "c[3-4]"})
    assert (fallback.master_addr, fallback.master_port) == ("c3", 12910)  # Lightning's port without a job id


def test_slurm_is_ignored_outside_a_step_and_in_interactive_allocations() -> None:
    assert cluster_from_slurm({}) is None
    assert cluster_from_slurm({"SLURM_JOB_ID": "5", "SLURM_NODELIST": "n1"}) is None  # an allocation, no task
    assert cluster_from_slurm({**SLURM, "SLURM_JOB_NAME": "interactive"}) is None
    assert resolve_cluster({**SLURM, "SLURM_JOB_NAME": "bash"}).source == "local"


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID"),
        ({"SLURM_NTASKS": "four"}, "SLURM_NTASKS"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID"),
        ({"SLURM_TASKS_PER_NODE": "2(x)"}, "SLURM_TASKS_PER_NODE"),
        ({"SLURM_NODELIST": "node[01-"}, "SLURM_NODELIST"),
        ({"SLURM_JOB_ID": "12_3"}, "SLURM_JOB_ID"),
    ],
)
def test_slurm_errors_name_the_variable(changes: dict, field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        cluster_from_slurm({**SLURM, **changes})
    assert raised.value.field == field and field in str(raised.value)


def test_slurm_without_a_node_list_asks_for_master_addr() -> None:
    environ = {name: value for name, value in SLURM.items() if name != "SLURM_NODELIST"}
    with pytest.raises(ConfigError, match="Set MASTER_ADDR"):
        cluster_from_slurm(environ)
    assert cluster_from_slurm({**environ, "MASTER_ADDR": "n7"}).master_addr == "n7"


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[009-011]", ["n009", "n010", "n011"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a,b.example.org,c-1", ["a", "b.example.org", "c-1"]),
        ("node[5]", ["node5"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


def test_the_first_host_agrees_with_lightning_where_installed() -> None:
    slurm = pytest.importorskip("lightning.fabric.plugins.environments.slurm")
    for hostlist in ("node[01-03,07],gpu5", "n[009-011]", "a,b", "node[5]", "gpu[7,9-10]"):
        assert expand_hostlist(hostlist)[0] == slurm.SLURMEnvironment.resolve_root_node_address(hostlist)


@pytest.mark.parametrize("hostlist", ["", "node[1-", "node]1", "n[3-1]", "n[a]", "n[[1]]", "n[1-2]x[", ","])
def test_expand_hostlist_refuses_malformed_lists(hostlist: str) -> None:
    with pytest.raises(ConfigError, match="is not a SLURM host list") as raised:
        expand_hostlist(hostlist, "SLURM_JOB_NODELIST")
    assert raised.value.field == "SLURM_JOB_NODELIST"


def test_expand_tasks_per_node() -> None:
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    for text in ("", "0", "2(x)", "x(2)"):
        with pytest.raises(ConfigError, match="not a SLURM task count list"):
            expand_tasks_per_node(text)


# ---------------------------------------------------------------- the collective timeout


def test_collective_timeout_comes_from_the_argument_then_the_environment_then_the_default() -> None:
    assert DEFAULT_COLLECTIVE_TIMEOUT_SECONDS == 300.0
    assert collective_timeout_seconds(None, {}) == 300.0
    assert collective_timeout_seconds(None, {COLLECTIVE_TIMEOUT_VARIABLE: "42.5"}) == 42.5
    assert collective_timeout_seconds(7.0, {COLLECTIVE_TIMEOUT_VARIABLE: "42.5"}) == 7.0
    for text in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(ConfigError, match=COLLECTIVE_TIMEOUT_VARIABLE) as raised:
            collective_timeout_seconds(None, {COLLECTIVE_TIMEOUT_VARIABLE: text})
        assert raised.value.field == COLLECTIVE_TIMEOUT_VARIABLE


@pytest.mark.parametrize("timeout", [0, -3.0, float("nan"), float("inf"), True, "300"])
def test_mirrored_strategy_refuses_a_bad_timeout(timeout: object) -> None:
    with pytest.raises(ValueError, match="timeout_seconds must be positive seconds or None"):
        MirroredStrategy(timeout_seconds=timeout)  # type: ignore[arg-type]


class _Joined(Exception):
    """Raised by the recorder in place of forming a group across processes."""


@pytest.fixture
def recorded_joins(clean_environment: pytest.MonkeyPatch) -> list[dict]:
    joins: list[dict] = []

    def record(backend: str, **arguments: object) -> None:
        joins.append({"backend": backend, **arguments})
        raise _Joined

    clean_environment.setattr(distributed, "init_process_group", record)
    return joins


def test_mirrored_strategy_forms_the_group_from_tf_config(
    recorded_joins: list[dict], clean_environment: pytest.MonkeyPatch
) -> None:
    for name, value in _tf_config(TWO_TASKS, {"type": "worker", "index": 0}).items():
        clean_environment.setenv(name, value)
    clean_environment.setenv(COLLECTIVE_TIMEOUT_VARIABLE, "42")
    strategy = MultiWorkerMirroredStrategy()
    with pytest.raises(_Joined):
        strategy.setup()
    (join,) = recorded_joins
    assert (join["init_method"], join["rank"], join["world_size"]) == ("tcp://127.0.0.1:23456", 1, 2)
    assert join["timeout"].total_seconds() == 42 and join["backend"] == "gloo"
    assert not strategy.is_set_up


def test_mirrored_strategy_forms_the_group_from_slurm(
    recorded_joins: list[dict], clean_environment: pytest.MonkeyPatch
) -> None:
    for name, value in SLURM.items():
        clean_environment.setenv(name, value)
    with pytest.raises(_Joined):
        MirroredStrategy(timeout_seconds=9).setup()
    (join,) = recorded_joins
    assert (join["init_method"], join["rank"], join["world_size"]) == ("tcp://node01:18456", 3, 4)
    assert join["timeout"].total_seconds() == 9


def test_mirrored_strategy_checks_num_replicas_against_tf_config(
    recorded_joins: list[dict], clean_environment: pytest.MonkeyPatch
) -> None:
    clean_environment.setenv("TF_CONFIG", _tf_config(TWO_TASKS, {"type": "chief", "index": 0})["TF_CONFIG"])
    with pytest.raises(
        ValueError, match=re.escape("num_replicas=3) but the TF_CONFIG cluster (its chief and workers) has 2 processes")
    ):
        MirroredStrategy(num_replicas=3).setup()
    assert recorded_joins == []


def test_mirrored_strategy_refuses_a_ps_task_pointing_at_parameter_server_strategy(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    cluster = {**TWO_TASKS, "ps": ["127.0.0.1:3"]}
    clean_environment.setenv("TF_CONFIG", _tf_config(cluster, {"type": "ps", "index": 0})["TF_CONFIG"])
    for strategy in (MirroredStrategy(), OneDeviceStrategy("cpu")):
        with pytest.raises(
            ConfigError,
            match="ps.* tasks trains with parameter servers.*ParameterServerStrategy.*MultiWorkerMirroredStrategy",
        ) as raised:
            strategy.setup()
        assert raised.value.field == 'TF_CONFIG["task"]["type"]'


def test_mirrored_strategy_on_the_evaluator_runs_one_local_replica(clean_environment: pytest.MonkeyPatch) -> None:
    cluster = {**TWO_TASKS, "evaluator": ["127.0.0.1:3"]}
    clean_environment.setenv("TF_CONFIG", _tf_config(cluster, {"type": "evaluator", "index": 0})["TF_CONFIG"])
    strategy = MirroredStrategy(num_replicas=2)  # the trainers' setting: the evaluator still runs one replica
    strategy.setup()
    try:
        assert (strategy.num_replicas, strategy.replica_id, strategy.is_chief) == (1, 0, True)
        assert distributed.get_world_size() == 1
    finally:
        strategy.teardown()
    assert not distributed.is_initialized()


def test_one_device_strategy_refuses_a_trainer_of_a_multi_task_tf_config(clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setenv("TF_CONFIG", _tf_config(TWO_TASKS, {"type": "worker", "index": 0})["TF_CONFIG"])
    with pytest.raises(ConfigError, match=r"2 training tasks .*worker:0.*MultiWorkerMirroredStrategy") as raised:
        OneDeviceStrategy("cpu").setup()
    assert raised.value.field == "TF_CONFIG"
    OneDeviceStrategy("cpu", warn_if_launched=False).setup()  # predict runs whole in every process on purpose
    for alone in (
        _tf_config({"chief": ["h:1"], "evaluator": ["h:2"]}, {"type": "chief", "index": 0}),
        _tf_config({**TWO_TASKS, "evaluator": ["h:2"]}, {"type": "evaluator", "index": 0}),
    ):
        clean_environment.setenv("TF_CONFIG", alone["TF_CONFIG"])
        OneDeviceStrategy("cpu").setup()


def test_one_device_strategy_warns_under_several_srun_tasks(clean_environment: pytest.MonkeyPatch, caplog) -> None:
    for name, value in SLURM.items():
        clean_environment.setenv(name, value)
    with caplog.at_level("WARNING", logger="torchestimator"):
        OneDeviceStrategy("cpu").setup()
    assert "SLURM (SLURM_NTASKS) says this program runs as 4 processes (this is rank 3)" in caplog.text


def test_multi_worker_mirrored_strategy_is_the_public_tf_name() -> None:
    assert issubclass(te.MultiWorkerMirroredStrategy, te.MirroredStrategy)
    assert te.MultiWorkerMirroredStrategy is MultiWorkerMirroredStrategy
    assert repr(MultiWorkerMirroredStrategy(num_replicas=2)) == (
        "MultiWorkerMirroredStrategy(num_replicas=2, backend=None)"
    )


# ---------------------------------------------------------------- launch: torchrun's options


def _launch_arguments(argv: list[str], environ: dict | None = None):
    return prepare_torchrun_arguments(launch_parser().parse_args(argv), environ or {})


def _torchrun_config(arguments, monkeypatch: pytest.MonkeyPatch):
    from torch.distributed.run import config_from_args

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # config_from_args sets it otherwise
    config, _, script_args = config_from_args(arguments)
    return config, script_args


def test_launch_is_standalone_on_one_node(clean_environment: pytest.MonkeyPatch) -> None:
    arguments = _launch_arguments(["train.py", "--steps", "5"])
    assert arguments.standalone and arguments.nproc_per_node == "2"  # torchestimator's default: 2 per node
    assert (arguments.training_script, arguments.training_script_args) == ("train.py", ["--steps", "5"])


@pytest.mark.parametrize("spelling", ["_", "-"])
def test_launch_passes_torchrun_multi_node_and_elastic_options(
    spelling: str, clean_environment: pytest.MonkeyPatch
) -> None:
    def flag(name: str) -> str:
        return "--" + name.replace("_", spelling)

    arguments = _launch_arguments(
        [
            "--nnodes",
            "1:2",
            flag("nproc_per_node"),
            "1",
            flag("node_rank"),
            "1",
            flag("rdzv_backend"),
            "c10d",
            flag("rdzv_endpoint"),
            "10.0.0.1:29400",
            flag("rdzv_id"),
            "job7",
            flag("max_restarts"),
            "3",
            flag("monitor_interval"),
            "0.5",
            "train.py",
        ]
    )
    assert not arguments.standalone
    config, script_args = _torchrun_config(arguments, clean_environment)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node, config.max_restarts) == (1, 2, 1, 3)
    assert (config.rdzv_backend, config.rdzv_endpoint, config.run_id, config.monitor_interval) == (
        "c10d",
        "10.0.0.1:29400",
        "job7",
        0.5,
    )
    assert script_args[-1] == "train.py"


def test_launch_from_tf_config_makes_each_task_a_node(clean_environment: pytest.MonkeyPatch) -> None:
    environ = _tf_config(TWO_TASKS, {"type": "worker", "index": 0})
    arguments = _launch_arguments(["--from_tf_config", "--nproc_per_node", "2", "train.py"], environ)
    assert (arguments.nnodes, arguments.node_rank, arguments.master_addr, arguments.master_port) == (
        "2",
        1,
        "127.0.0.1",
        23456,
    )
    assert not arguments.standalone and arguments.rdzv_backend == "static"
    config, _ = _torchrun_config(arguments, clean_environment)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 2)
    alone = _launch_arguments(
        ["--from-tf-config", "train.py"], _tf_config({"chief": ["h:1"]}, {"type": "chief", "index": 0})
    )
    assert alone.standalone


@pytest.mark.parametrize(
    "argv, environ, message",
    [
        (
            ["--from_tf_config", "--nnodes", "2", "t.py"],
            _tf_config(TWO_TASKS, {"type": "chief", "index": 0}),
            "so --nnodes cannot be given too",
        ),
        (
            ["--from_tf_config", "--rdzv_endpoint", "h:1", "t.py"],
            _tf_config(TWO_TASKS, {"type": "chief", "index": 0}),
            "so --rdzv_endpoint cannot be given too",
        ),
        (["--from_tf_config", "t.py"], {}, 'TF_CONFIG has no "cluster"'),
        (
            ["--from_tf_config", "t.py"],
            _tf_config({**TWO_TASKS, "evaluator": ["h:3"]}, {"type": "evaluator", "index": 0}),
            "'evaluator' task does not join",
        ),
    ],
)
def test_launch_from_tf_config_errors(
    argv: list[str], environ: dict, message: str, clean_environment: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        _launch_arguments(argv, environ)


def test_the_cli_launch_command_takes_torchrun_options(clean_environment: pytest.MonkeyPatch) -> None:
    from torchestimator.cli import build_parser

    args = build_parser().parse_args(
        [
            "launch",
            "--nnodes=2",
            "--max-restarts",
            "2",
            "--rdzv_backend",
            "c10d",
            "--rdzv-endpoint",
            "h:29400",
            "-m",
            "package.train",
            "--lr",
            "0.1",
        ]
    )
    assert (args.nnodes, args.max_restarts, args.rdzv_backend, args.rdzv_endpoint, args.module) == (
        "2",
        2,
        "c10d",
        "h:29400",
        True,
    )
    assert (args.training_script, args.training_script_args, args.nproc_per_node) == (
        "package.train",
        ["--lr", "0.1"],
        "2",
    )


def test_launch_marks_this_node_as_the_rendezvous_host_when_torchrun_misses_it(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    # torchrun matches the endpoint against the host name's addresses only; in a network namespace, a
    # container, or with Debian's 127.0.1.1 it misses this machine's other interfaces and no node serves.
    import torch.distributed.elastic.rendezvous.utils as rendezvous_utils

    clean_environment.setattr(rendezvous_utils, "_matches_machine_hostname", lambda host: False)

    def conf(endpoint: str, *extra: str) -> str:
        return _launch_arguments(
            ["--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", *extra, "t.py"]
        ).rdzv_conf

    assert conf("127.0.0.1:29400") == "is_host=1"  # an address a socket here can bind to
    assert conf("127.0.0.1:29400", "--rdzv_conf=join_timeout=90") == "join_timeout=90,is_host=1"
    assert conf("192.0.2.1:29400") == ""  # TEST-NET-1: never this machine's
    assert conf("127.0.0.1:29400", "--rdzv_conf=is_host=0") == "is_host=0"  # the user's word stands


def test_kubeflow_pytorchjob_variables_are_one_process_per_pod() -> None:
    # PyTorchJob sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and no LOCAL_RANK: pod 3 has one process, GPU 0.
    cluster = resolve_cluster({"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"})
    assert (cluster.source, cluster.rank, cluster.world_size, cluster.local_rank, cluster.local_world_size) == (
        "torchrun",
        3,
        4,
        0,
        1,
    )
    assert (cluster.master_addr, cluster.master_port, cluster.task_type, cluster.task_index) == (
        "job-master-0",
        23456,
        "worker",
        2,
    )


def test_launch_command_parses_like_the_cli_and_checks_before_starting_anything() -> None:
    from torchestimator.distribute import launch_command

    with pytest.raises(ConfigError, match='TF_CONFIG has no "cluster"'):
        launch_command(["--from_tf_config", "--nproc_per_node=2", "train.py"], environ={})


def test_launch_gives_restarts_a_fresh_store_unless_the_user_chose() -> None:
    from torchestimator.distribute.launcher import SHARED_STORE_SWITCH, restart_environment

    restarting = launch_parser().parse_args(["--max_restarts", "2", "train.py"])
    assert restart_environment(restarting, {}) == {SHARED_STORE_SWITCH: "1"}
    assert restart_environment(restarting, {SHARED_STORE_SWITCH: "0"}) == {}  # the user's choice stands
    assert restart_environment(launch_parser().parse_args(["train.py"]), {}) == {}  # no restarts: torch's default


CHIEF_AND_WORKER_CONFIG = {
    "cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]},
    "task": {"type": "worker", "index": 0},
}


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--nproc_per_node", "0", "t.py"], "nproc_per_node"),
        (["--nnodes", "3:1", "t.py"], "launch"),
        (["--max_restarts", "-1", "t.py"], "launch"),
    ],
)
def test_launch_refuses_values_torchrun_would_assert_on_in_one_line(argv: list, field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        prepare_torchrun_arguments(launch_parser().parse_args(argv), {})
    assert raised.value.field == field


def test_launch_refuses_a_multi_task_tf_config_it_would_ignore() -> None:
    arguments = launch_parser().parse_args(["--nproc_per_node", "1", "t.py"])
    with pytest.raises(ConfigError, match="--from_tf_config") as raised:
        prepare_torchrun_arguments(arguments, {"TF_CONFIG": json.dumps(CHIEF_AND_WORKER_CONFIG)})
    assert raised.value.field == "TF_CONFIG"
    assert prepare_torchrun_arguments(arguments, {}).standalone  # without TF_CONFIG: one standalone node


def test_estimator_train_refuses_the_evaluator_and_ps_tasks(tmp_path, monkeypatch) -> None:
    import torch

    for task in ({"type": "evaluator", "index": 0}, {"type": "ps", "index": 0}):
        cluster = {"chief": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2224"]}
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
        estimator = te.Estimator(
            model_fn=lambda model, features, labels, mode: None,
            model=torch.nn.Linear(1, 1),
            optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
            model_dir=str(tmp_path / task["type"]),
        )
        with pytest.raises(ConfigError, match="does not train") as raised:
            estimator.train(lambda: [(torch.ones(1, 1), torch.ones(1, 1))], max_steps=1)
        assert raised.value.value == task["type"]
        assert not (tmp_path / task["type"]).exists()  # nothing written into model_dir


def test_a_group_that_never_forms_names_the_missing_tasks_and_the_timeout(monkeypatch) -> None:
    from torchestimator.distribute import find_free_port
    from torchestimator.errors import ReplicaLostError

    port = find_free_port()
    cluster = {"chief": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1:1"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    monkeypatch.setenv("TORCHESTIMATOR_COLLECTIVE_TIMEOUT", "2")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ReplicaLostError) as raised:
        te.MirroredStrategy().setup()
    message = str(raised.value)
    assert "chief:0" in message and "worker: 127.0.0.1:1" in message and "TORCHESTIMATOR_COLLECTIVE_TIMEOUT" in message
    assert not distributed.is_initialized()
