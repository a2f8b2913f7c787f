"""Tests for distribute/ (strategies, cluster descriptions, launcher) and torchestimator.testing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torchestimator.distribute import (
    ClusterSpec,
    InputContext,
    MirroredStrategy,
    OneDeviceStrategy,
    RelaunchError,
    cluster_from_tf_config,
    cluster_from_torchrun,
)
from torchestimator.distribute.launcher import TORCHRUN_VARIABLES, rerun_command, torchrun_arguments
from torchestimator.testing import ReplicaFailedError, run_in_processes

LAUNCH_VARIABLES = (*TORCHRUN_VARIABLES, "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def no_launch_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _child_environment() -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if name not in LAUNCH_VARIABLES}
    environ["OMP_NUM_THREADS"] = "1"
    return environ


# ---------------------------------------------------------------- OneDeviceStrategy


def test_one_device_strategy_places_and_passes_through() -> None:
    strategy = OneDeviceStrategy("cpu")
    strategy.setup()
    strategy.setup()  # idempotent
    module = nn.Linear(2, 1)
    wrapped = strategy.wrap(module)
    assert strategy.device == torch.device("cpu")
    assert (strategy.num_replicas, strategy.replica_id, strategy.is_chief) == (1, 0, True)
    assert strategy.input_context() == InputContext(num_replicas_in_sync=1, input_pipeline_id=0, num_input_pipelines=1)
    assert wrapped is module and strategy.unwrap(wrapped) is module
    with strategy.no_sync(wrapped):
        pass
    assert strategy.reduce_mean(torch.tensor(2.5)) == 2.5 and isinstance(strategy.reduce_mean(3), float)
    assert strategy.all_agree(True) is True and strategy.all_agree(False) is False
    assert strategy.broadcast_object({"a": 1}) == {"a": 1}
    strategy.barrier()
    strategy.teardown()
    assert not strategy.is_set_up


def test_one_device_default_device_follows_cuda_availability() -> None:
    strategy = OneDeviceStrategy()
    strategy.setup()
    assert strategy.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_strategy_refuses_use_before_setup() -> None:
    strategy = OneDeviceStrategy("cpu")
    with pytest.raises(RuntimeError, match=r"call strategy.setup\(\)"):
        _ = strategy.device
    with pytest.raises(RuntimeError, match="setup"):
        strategy.wrap(nn.Linear(1, 1))
    with pytest.raises(RuntimeError, match="setup"):
        strategy.reduce_mean(1.0)


def test_wrap_refuses_non_modules_and_wrapped_modules() -> None:
    strategy = OneDeviceStrategy("cpu")
    strategy.setup()
    with pytest.raises(TypeError, match="expects a torch.nn.Module; received dict"):
        strategy.wrap({})
    with pytest.raises(ValueError, match="already wrapped in DataParallel"):
        strategy.wrap(nn.DataParallel(nn.Linear(1, 1)))


def test_reduce_mean_and_broadcast_check_their_arguments() -> None:
    strategy = OneDeviceStrategy("cpu")
    strategy.setup()
    with pytest.raises(ValueError, match=r"expects a scalar; received a tensor of shape \(2,\)"):
        strategy.reduce_mean(torch.ones(2))
    with pytest.raises(ValueError, match=r"src must be a replica id in \[0, 1\); received 1"):
        strategy.broadcast_object("x", src=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_one_device_refuses_cuda_without_cuda() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        OneDeviceStrategy("cuda:0").setup()


# ---------------------------------------------------------------- MirroredStrategy in this process


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"num_replicas": 0}, "positive integer or None; received 0"),
        ({"backend": "tcp"}, "backend must be one of"),
        ({"num_replicas": 2, "devices": ["cpu"]}, "num_replicas=2 but 1 devices"),
        ({"devices": []}, "at least one device"),
        ({"timeout_seconds": 0}, "timeout_seconds must be positive"),
    ],
)
def test_mirrored_strategy_checks_its_arguments(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MirroredStrategy(**arguments)


def test_mirrored_strategy_reads_the_environment_in_setup_not_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "not a number", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    strategy = MirroredStrategy(num_replicas=2)  # builds although the environment is broken: nothing read yet
    with pytest.raises(ValueError, match="RANK must be an integer"):
        strategy.setup()
    assert not strategy.is_set_up


@pytest.mark.skipif(torch.cuda.is_available(), reason="one CPU replica is the default without CUDA")
def test_mirrored_strategy_with_one_cpu_replica_wraps_in_ddp(no_launch_environment: None) -> None:
    strategy = MirroredStrategy()
    strategy.setup()
    try:
        assert distributed.is_initialized() and strategy.num_replicas == 1
        module = nn.Linear(2, 1)
        wrapped = strategy.wrap(module)
        assert isinstance(wrapped, DistributedDataParallel) and strategy.unwrap(wrapped) is module
        frozen = nn.Linear(2, 1).requires_grad_(False)
        assert strategy.wrap(frozen) is frozen  # DDP refuses modules with nothing to train
        assert strategy.reduce_mean(4.0) == 4.0 and strategy.all_agree(True)
    finally:
        strategy.teardown()
    assert not distributed.is_initialized()


def test_mirrored_strategy_refuses_a_different_launched_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    with pytest.raises(ValueError, match=r"num_replicas=3\) but the launched run \(WORLD_SIZE\) has 2"):
        MirroredStrategy(num_replicas=3).setup()
    assert not distributed.is_initialized()


# ---------------------------------------------------------------- cluster descriptions


def test_cluster_from_torchrun() -> None:
    assert cluster_from_torchrun({}) is None
    environ = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
    }
    cluster = cluster_from_torchrun(environ)
    assert (cluster.rank, cluster.world_size, cluster.local_rank, cluster.local_world_size) == (3, 4, 1, 2)
    assert (cluster.task_type, cluster.task_index, cluster.is_chief) == ("worker", 2, False)
    assert cluster.torch_environ()["MASTER_PORT"] == "29500"
    assert cluster_from_torchrun({**environ, "RANK": "0"}).is_chief


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "but not MASTER_ADDR, MASTER_PORT"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "Inconsistent"),
        ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK must be an integer"),
    ],
)
def test_cluster_from_torchrun_errors(environ: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cluster_from_torchrun(environ)


def _tf_config(cluster: dict | None = None, task: dict | None = None, **extra: object) -> dict[str, str]:
    config: dict = dict(extra)
    if cluster is not None:
        config["cluster"] = cluster
    if task is not None:
        config["task"] = task
    return {"TF_CONFIG": json.dumps(config)}


CLUSTER = {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"], "ps": ["host3:2222"]}


def test_tf_config_absent_is_local() -> None:
    for environ in ({}, {"TF_CONFIG": ""}, _tf_config()):
        cluster = cluster_from_tf_config(environ)
        assert cluster == ClusterSpec(source="tf_config")
        assert (cluster.task_type, cluster.task_index, cluster.is_chief) == ("worker", 0, True)
        assert (cluster.num_worker_replicas, cluster.num_ps_replicas, cluster.global_id_in_cluster) == (1, 0, 0)
        assert cluster.master == ""


def test_tf_config_local_keeps_session_masters_and_model_dir() -> None:
    cluster = cluster_from_tf_config(
        _tf_config(
            task={"type": "worker", "index": 0},
            session_master="grpc://m:1",
            eval_session_master="grpc://e:1",
            model_dir="/runs/a",
        )
    )
    assert (cluster.master, cluster.evaluation_master, cluster.model_dir) == ("grpc://m:1", "grpc://e:1", "/runs/a")


def test_tf_config_chief_cluster() -> None:
    chief = cluster_from_tf_config(_tf_config(CLUSTER, {"type": "chief", "index": 0}))
    assert chief.is_chief and chief.global_id_in_cluster == 0
    assert (chief.num_worker_replicas, chief.num_ps_replicas) == (3, 1)
    assert chief.master == "grpc://host0:2222"
    assert (chief.rank, chief.world_size, chief.master_addr, chief.master_port) == (0, 3, "host0", 2222)
    worker = cluster_from_tf_config(_tf_config(CLUSTER, {"type": "worker", "index": "1"}))
    assert not worker.is_chief and worker.task_index == 1
    assert (worker.global_id_in_cluster, worker.rank, worker.master) == (2, 2, "grpc://host2:2222")
    assert worker.torch_environ() == {
        "MASTER_ADDR": "host0",
        "MASTER_PORT": "2222",
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
    ps = cluster_from_tf_config(_tf_config(CLUSTER, {"type": "ps", "index": 0}))
    assert ps.global_id_in_cluster == 3 and ps.rank is None and not ps.in_training_group
    with pytest.raises(ValueError, match="does not join the torch.distributed process group.*ParameterServerStrategy"):
        ps.torch_environ()


def test_tf_config_global_id_orders_jobs_alphabetically_with_ps_last() -> None:
    cluster = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1", "p1:1"], "aux": ["a:1"]}
    ids = {
        (task_type, index): cluster_from_tf_config(
            _tf_config(cluster, {"type": task_type, "index": index})
        ).global_id_in_cluster
        for task_type, addresses in cluster.items()
        for index in range(len(addresses))
    }
    assert ids == {("chief", 0): 0, ("aux", 0): 1, ("worker", 0): 2, ("worker", 1): 3, ("ps", 0): 4, ("ps", 1): 5}


def test_tf_config_evaluator_is_outside_the_training_cluster() -> None:
    environ = _tf_config(CLUSTER, {"type": "evaluator", "index": 3}, session_master="grpc://x:1")
    cluster = cluster_from_tf_config(environ)
    assert (cluster.task_type, cluster.task_index, cluster.is_chief) == ("evaluator", 3, False)
    assert (cluster.num_worker_replicas, cluster.num_ps_replicas, cluster.global_id_in_cluster) == (0, 0, None)
    assert cluster.jobs == {} and cluster.master == "" and cluster.evaluation_master == "grpc://x:1"
    assert cluster.rank is None and cluster.world_size is None


def test_tf_config_legacy_master() -> None:
    jobs = {"master": ["m:3333"], "worker": ["w:3333"]}
    master = cluster_from_tf_config(_tf_config(jobs, {"type": "master", "index": 0}))
    worker = cluster_from_tf_config(_tf_config(jobs, {"type": "worker", "index": 0}))
    assert master.is_chief and not worker.is_chief
    assert (master.num_worker_replicas, worker.global_id_in_cluster, worker.rank) == (2, 1, 1)
    assert (worker.master_addr, worker.master_port) == ("m", 3333)


def test_tf_config_single_node_cluster_has_local_master() -> None:
    cluster = cluster_from_tf_config(_tf_config({"chief": ["h:1"]}, {"type": "chief", "index": 0}))
    assert cluster.master == "" and cluster.world_size == 1


@pytest.mark.parametrize(
    "cluster, task, message",
    [
        (None, {"type": "chief", "index": 0}, 'If "cluster" is not set in TF_CONFIG, task type must be WORKER.'),
        (None, {"type": "worker", "index": 1}, 'If "cluster" is not set in TF_CONFIG, task index must be 0.'),
        ({"worker": ["w:1"]}, {"type": "worker", "index": 0}, 'it must have one "chief" node'),
        ({"chief": ["a:1", "b:1"]}, {"type": "chief", "index": 0}, 'must have only one "chief" node'),
        (CLUSTER, {"index": 0}, "task type must be set"),
        (CLUSTER, {"type": "worker"}, "task index must be set"),
        (CLUSTER, {"type": "worker", "index": -1}, "Task index must be non-negative number."),
        (CLUSTER, {"type": "trainer", "index": 0}, "trainer is not a valid task_type in the cluster_spec"),
        (CLUSTER, {"type": "worker", "index": 2}, "2 is not a valid task_id for task_type worker"),
        ({"master": ["m:1"], "chief": ["c:1"]}, {"type": "master", "index": 0}, "job `chief` is not supported"),
        ({"master": ["m:1"]}, {"type": "evaluator", "index": 0}, "task_type `evaluator` is not supported"),
        ({"chief": ["no-port"]}, {"type": "chief", "index": 0}, "must be \"host:port\"; received 'no-port'"),
        (CLUSTER, {"type": "worker", "index": "one"}, 'TF_CONFIG["task"]["index"] must be an integer'),
    ],
)
def test_tf_config_errors_follow_tensorflow(cluster: dict | None, task: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        cluster_from_tf_config(_tf_config(cluster, task))


def test_tf_config_must_be_a_json_object() -> None:
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        cluster_from_tf_config({"TF_CONFIG": "{cluster"})
    with pytest.raises(ValueError, match="must be a JSON object"):
        cluster_from_tf_config({"TF_CONFIG": "[1]"})


# ---------------------------------------------------------------- relaunch command and torchrun arguments


def _rerun(**overrides: object) -> list[str]:
    values = dict(
        executable="/bin/python3",
        orig_argv=["python", "-u", "train.py", "--steps", "5"],
        argv=["train.py", "--steps", "5"],
        main_file="/home/me/train.py",
        main_spec_name=None,
        interactive=False,
    )
    values.update(overrides)
    return rerun_command(**values)


def test_rerun_command_for_a_script_keeps_interpreter_options() -> None:
    assert _rerun() == ["/bin/python3", "-u", "/home/me/train.py", "--steps", "5"]


def test_rerun_command_for_a_module() -> None:
    command = _rerun(
        orig_argv=["python", "-m", "package.train", "--steps", "5"],
        argv=["/site/package/train.py", "--steps", "5"],
        main_file="/site/package/train.py",
        main_spec_name="package.train",
    )
    assert command == ["/bin/python3", "-m", "package.train", "--steps", "5"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"orig_argv": ["python", "-c", "code"], "argv": ["-c"], "main_file": None}, "python -c"),
        ({"orig_argv": ["python", "-"], "argv": ["-"], "main_file": None}, "standard input"),
        ({"interactive": True}, "interactive session"),
    ],
)
def test_rerun_command_refuses_programs_that_cannot_be_rerun(overrides: dict, message: str) -> None:
    with pytest.raises(RelaunchError, match=message) as raised:
        _rerun(**overrides)
    assert "torchestimator launch" in str(raised.value) and "torchrun" in str(raised.value)


def test_torchrun_arguments_are_accepted_by_torchrun() -> None:
    from torch.distributed.run import parse_args

    standalone = parse_args(torchrun_arguments(2, ["train.py", "--steps", "5"]))
    assert (standalone.nproc_per_node, standalone.standalone) == ("2", True)
    assert (standalone.training_script, standalone.training_script_args) == ("train.py", ["--steps", "5"])
    module = parse_args(torchrun_arguments(1, ["-m", "package.train"]))
    assert module.module and module.training_script == "package.train"
    worker = cluster_from_tf_config(_tf_config(CLUSTER, {"type": "worker", "index": 0}))
    multi_node = parse_args(torchrun_arguments(4, ["train.py"], cluster=worker))
    assert (multi_node.nnodes, multi_node.node_rank, multi_node.master_addr, multi_node.master_port) == (
        "3",
        1,
        "host0",
        2222,
    )
    assert not multi_node.standalone


def test_torchrun_arguments_errors() -> None:
    with pytest.raises(ValueError, match="nproc_per_node must be a positive integer; received 0"):
        torchrun_arguments(0, ["train.py"])
    with pytest.raises(ValueError, match="needs the program to run"):
        torchrun_arguments(2, [])
    evaluator = cluster_from_tf_config(_tf_config(CLUSTER, {"type": "evaluator", "index": 0}))
    with pytest.raises(ValueError, match="'evaluator' task does not join"):
        torchrun_arguments(2, ["train.py"], cluster=evaluator)


def test_run_in_processes_refuses_functions_spawn_cannot_import() -> None:
    with pytest.raises(TypeError, match="Define it at module level"):
        run_in_processes(lambda: 1)
    with pytest.raises(ValueError, match="nprocs must be a positive integer"):
        run_in_processes(_report_rank, nprocs=0)


# ---------------------------------------------------------------- several processes


def _report_rank(offset: int) -> tuple[int, int, int, str]:
    strategy = MirroredStrategy()
    strategy.setup()
    return strategy.replica_id + offset, strategy.num_replicas, torch.get_num_threads(), os.environ["MASTER_ADDR"]


def _fail_on_rank_one() -> None:
    if distributed.get_rank() == 1:
        raise ValueError("bad batch on purpose")


def _replica_batch(replica_id: int) -> torch.Tensor:
    return torch.randn(6, 3, generator=torch.Generator().manual_seed(100 + replica_id))


def _fresh_model() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 1)


def _loss(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    return model(features).pow(2).mean()


def _train_one_step() -> dict:
    strategy = MirroredStrategy()
    strategy.setup()
    model = _fresh_model()
    wrapped = strategy.wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    features = _replica_batch(strategy.replica_id)
    _loss(wrapped, features).backward()
    optimizer.step()
    optimizer.zero_grad()
    with strategy.no_sync(wrapped):
        _loss(wrapped, features).backward()
    return {
        "is_ddp": isinstance(wrapped, DistributedDataParallel),
        "unwraps": strategy.unwrap(wrapped) is model,
        "weight": model.weight.detach().clone(),
        "bias": model.bias.detach().clone(),
        "unsynchronised_gradient": model.weight.grad.clone(),
        "mean": strategy.reduce_mean(torch.tensor(float(strategy.replica_id))),
        "any_true": strategy.all_agree(strategy.replica_id == 1),
        "any_false": strategy.all_agree(False),
        "broadcast": strategy.broadcast_object({"from": strategy.replica_id}, src=1),
        "context": strategy.input_context(),
        "is_chief": strategy.is_chief,
    }


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_run_in_processes_returns_results_by_rank() -> None:
    results = run_in_processes(_report_rank, nprocs=2, args=(10,))
    assert results == [(10, 2, 1, "127.0.0.1"), (11, 2, 1, "127.0.0.1")]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_run_in_processes_names_the_failing_rank() -> None:
    with pytest.raises(ReplicaFailedError, match="rank 1 failed: builtins.ValueError: bad batch on purpose") as raised:
        run_in_processes(_fail_on_rank_one, nprocs=2, timeout=30)
    assert raised.value.rank == 1 and raised.value.exception_type == "builtins.ValueError"
    assert "_fail_on_rank_one" in raised.value.traceback_text and "Traceback in rank 1" in str(raised.value)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_mirrored_strategy_averages_gradients_across_processes() -> None:
    results = run_in_processes(_train_one_step, nprocs=2)
    local_gradients = []
    for replica_id in range(2):
        model = _fresh_model()
        _loss(model, _replica_batch(replica_id)).backward()
        local_gradients.append((model.weight.grad, model.bias.grad))
    expected_model = _fresh_model()
    expected_weight = expected_model.weight.detach() - 0.5 * (local_gradients[0][0] + local_gradients[1][0]) / 2
    expected_bias = expected_model.bias.detach() - 0.5 * (local_gradients[0][1] + local_gradients[1][1]) / 2
    first, second = results
    assert first["is_ddp"] and first["unwraps"] and second["is_ddp"]
    assert torch.equal(first["weight"], second["weight"]) and torch.equal(first["bias"], second["bias"])
    assert torch.allclose(first["weight"], expected_weight, atol=1e-6)
    assert torch.allclose(first["bias"], expected_bias, atol=1e-6)
    assert not torch.allclose(first["unsynchronised_gradient"], second["unsynchronised_gradient"])
    assert (first["mean"], second["mean"]) == (0.5, 0.5)
    assert first["any_true"] and second["any_true"] and not (first["any_false"] or second["any_false"])
    assert first["broadcast"] == second["broadcast"] == {"from": 1}
    assert second["context"] == InputContext(num_replicas_in_sync=2, input_pipeline_id=1, num_input_pipelines=2)
    assert first["is_chief"] and not second["is_chief"]


SELF_LAUNCHED_PROGRAM = """
import os, pathlib, sys
from torchestimator.distribute import MirroredStrategy

strategy = MirroredStrategy(num_replicas=2)
strategy.setup()
strategy.setup()  # a second train/evaluate call must not start more processes
MirroredStrategy(num_replicas=2).setup()  # nor must a second strategy object
mean = strategy.reduce_mean(float(strategy.replica_id))
output = pathlib.Path(sys.argv[1])
(output / f"rank{strategy.replica_id}-pid{os.getpid()}.txt").write_text(f"{strategy.num_replicas} {mean}")
if len(sys.argv) > 2 and strategy.replica_id == 1:
    raise SystemExit(7)
"""


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(60)
@pytest.mark.parametrize("as_module", [False, True], ids=["script", "module"])
def test_plain_python_run_starts_its_own_replicas(tmp_path, as_module: bool) -> None:
    (tmp_path / "self_launched.py").write_text(SELF_LAUNCHED_PROGRAM)
    output = tmp_path / "output"
    output.mkdir()
    program = ["-m", "self_launched"] if as_module else [str(tmp_path / "self_launched.py")]
    completed = subprocess.run(
        [sys.executable, *program, str(output)],
        cwd=tmp_path,
        env=_child_environment(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert completed.returncode == 0, completed.stderr
    written = sorted(path.name.split("-")[0] for path in output.iterdir())
    assert written == ["rank0", "rank1"]
    assert {path.read_text() for path in output.iterdir()} == {"2 0.5"}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_plain_python_run_reports_a_failed_replica(tmp_path) -> None:
    script = tmp_path / "self_launched.py"
    script.write_text(SELF_LAUNCHED_PROGRAM)
    completed = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "fail"],
        env=_child_environment(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert completed.returncode == 1
    assert "Replica 1 of 2" in completed.stderr and "exited with code 7" in completed.stderr


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_program_that_cannot_be_rerun_gets_a_clear_error() -> None:
    code = "from torchestimator.distribute import MirroredStrategy; MirroredStrategy(num_replicas=2).setup()"
    completed = subprocess.run(
        [sys.executable, "-c", code], env=_child_environment(), capture_output=True, text=True, timeout=50
    )
    assert completed.returncode != 0
    assert "RelaunchError" in completed.stderr and "python -c" in completed.stderr
    assert "torchestimator launch --nproc_per_node" in completed.stderr and "torchrun" in completed.stderr


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_launch_runs_the_program_under_torchrun(tmp_path) -> None:
    (tmp_path / "self_launched.py").write_text(SELF_LAUNCHED_PROGRAM)
    code = "import sys; from torchestimator.distribute import launch; sys.exit(launch(2, sys.argv[1:]))"
    output = tmp_path / "output"
    output.mkdir()
    completed = subprocess.run(
        [sys.executable, "-c", code, "self_launched.py", str(output)],
        cwd=tmp_path,
        env=_child_environment(),
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert completed.returncode == 0, completed.stderr
    assert sorted(path.name.split("-")[0] for path in output.iterdir()) == ["rank0", "rank1"]


def _run_on_chief_outcomes() -> dict:
    """In each replica: run_on_chief's answer for an action that succeeds, then for one that fails on the chief."""
    from torchestimator.errors import ChiefFailedError

    strategy = MirroredStrategy()
    strategy.setup()
    ran = []
    value = strategy.run_on_chief(lambda: ran.append(strategy.replica_id) or "ckpt-3", "Writing ckpt-3")

    def fail() -> None:
        raise OSError(28, "No space left on device", "/m/ckpt-4")

    try:
        strategy.run_on_chief(fail, "Writing the checkpoint of global step 4")
    except ChiefFailedError as error:
        failure = ("ChiefFailedError", str(error), error.what)
    except OSError as error:
        failure = ("OSError", str(error), error.errno)
    return {"value": value, "ran": ran, "failure": failure}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_work_run_on_the_chief_reaches_every_replica_and_so_does_its_failure() -> None:
    chief, other = run_in_processes(_run_on_chief_outcomes, nprocs=2, timeout=60)
    assert chief["value"] == other["value"] == "ckpt-3"
    assert chief["ran"] == [0] and other["ran"] == []  # the action runs once, on the chief
    assert chief["failure"] == ("OSError", "[Errno 28] No space left on device: '/m/ckpt-4'", 28)  # its own error
    assert other["failure"] == (
        "ChiefFailedError",
        "Writing the checkpoint of global step 4 failed on the chief: "
        "OSError: [Errno 28] No space left on device: '/m/ckpt-4'",
        "Writing the checkpoint of global step 4",
    )
