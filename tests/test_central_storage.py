"""te.distribute.CentralStorageStrategy: TensorFlow's arguments, mapped onto MirroredStrategy on one machine."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as distributed
import torch.nn as nn
from helpers import class_model_fn, sum_sign_data
from torch.nn.parallel import DistributedDataParallel

import torchestimator as te
from torchestimator.distribute import CentralStorageStrategy, MirroredStrategy
from torchestimator.errors import ConfigError

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TF_CONFIG")


@pytest.fixture(autouse=True)
def no_launch_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*LAUNCH_VARIABLES, "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)


def test_tf_arguments_map_onto_mirrored_strategys_devices() -> None:
    strategy = CentralStorageStrategy()
    assert isinstance(strategy, MirroredStrategy)
    assert (strategy.compute_devices, strategy.parameter_device) == (None, None)

    # TensorFlow's device names, in each spelling TF users wrote them, become torch's.
    tf_names = CentralStorageStrategy(["GPU:0", "/gpu:1", "/job:localhost/replica:0/task:0/device:GPU:3"], "CPU:0")
    assert tf_names.compute_devices == (torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cuda", 3))
    assert tf_names.parameter_device == torch.device("cpu")
    assert CentralStorageStrategy(compute_devices=["/device:CPU:0"]).compute_devices == (torch.device("cpu"),)
    assert CentralStorageStrategy(["cuda:2", 1]).compute_devices == (torch.device("cuda", 2), torch.device("cuda", 1))
    # A GPU parameter_device is TF's default with one GPU: accepted when it is the one compute device.
    one_gpu = CentralStorageStrategy(compute_devices=["GPU:1"], parameter_device="/device:GPU:1")
    assert one_gpu.parameter_device == torch.device("cuda", 1)
    assert repr(one_gpu) == "CentralStorageStrategy(compute_devices=['cuda:1'], parameter_device='cuda:1')"


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"compute_devices": ["GPU:0", "GPU:1"], "parameter_device": "GPU:0"}, ValueError, "keeps its own copy"),
        ({"parameter_device": "GPU:0"}, ValueError, "compute_devices=['GPU:0']"),
        ({"compute_devices": ["CPU:0", "GPU:0"]}, ValueError, "mixes cpu and cuda devices"),
        ({"compute_devices": ["GPU:0", "cuda:0"]}, ValueError, "names cuda:0 more than once"),
        ({"compute_devices": []}, ValueError, "at least one device"),
        ({"compute_devices": ["TPU:0"]}, ValueError, "'TPU:0' is not a device name"),
        ({"compute_devices": "GPU:0"}, TypeError, "Write ['GPU:0']"),
        ({"compute_devices": [0.5]}, TypeError, "received 0.5"),
    ],
)
def test_arguments_it_cannot_honour_are_refused_when_built(arguments: dict, error: type, message: str) -> None:
    with pytest.raises(error) as raised:
        CentralStorageStrategy(**arguments)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("cluster", "task", "named"),
    [
        ({"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}, {"type": "worker", "index": 0}, "2 training"),
        ({"chief": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2224"]}, {"type": "chief", "index": 0}, "1 ps task"),
        ({"chief": ["127.0.0.1:2222"], "ps": ["127.0.0.1:2224"]}, {"type": "ps", "index": 0}, "this is ps:0"),
    ],
)
def test_a_cluster_of_several_tasks_is_refused_naming_the_strategies_for_it(
    monkeypatch: pytest.MonkeyPatch, cluster: dict, task: dict, named: str
) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    with pytest.raises(ConfigError) as raised:
        CentralStorageStrategy().setup()
    message = str(raised.value)
    assert named in message and "one machine" in message
    assert "MultiWorkerMirroredStrategy" in message and "ParameterServerStrategy" in message
    assert raised.value.field == "TF_CONFIG"
    assert not distributed.is_initialized()


def test_a_launch_across_machines_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    variables = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    for name, value in {**variables, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=4, 2 on this machine\) started processes on several machines"):
        CentralStorageStrategy().setup()
    assert not distributed.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU is the one device without CUDA")
def test_on_a_machine_without_gpus_it_is_one_replica_on_the_cpu_and_the_evaluator_task_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for environment in ({}, {"cluster": {"chief": ["h:1"], "evaluator": ["h:2"]}, "task": {"type": "evaluator"}}):
        if environment:
            environment["task"]["index"] = 0
            monkeypatch.setenv("TF_CONFIG", json.dumps(environment))
        strategy = CentralStorageStrategy(parameter_device="/cpu:0")
        strategy.setup()
        try:
            assert (strategy.num_replicas, strategy.device) == (1, torch.device("cpu"))
            assert isinstance(strategy.wrap(nn.Linear(2, 1)), DistributedDataParallel)
        finally:
            strategy.teardown()
        assert not distributed.is_initialized()


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="several GPUs would start a replica per GPU")
def test_the_estimator_trains_with_it_to_a_checkpoint(tmp_path) -> None:
    strategy = te.distribute.CentralStorageStrategy()
    wrapped = []
    plain_wrap = strategy._wrap
    strategy._wrap = lambda module: wrapped.append(plain_wrap(module)) or wrapped[-1]  # type: ignore[method-assign]
    x, y = sum_sign_data()
    estimator = te.Estimator(
        model_fn=class_model_fn,
        model=lambda: nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        model_dir=str(tmp_path / "model"),
        config=te.RunConfig(
            train_distribute=strategy, save_checkpoints_steps=5, log_step_count_steps=None, progress_bar=False
        ),
    )
    try:
        estimator.train(
            te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=1), max_steps=10
        )
        assert strategy.num_replicas == 1 and strategy.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
        assert any(isinstance(module, DistributedDataParallel) for module in wrapped)  # it trained through DDP
    finally:
        strategy.teardown()  # the Estimator keeps the group for a later evaluate; the next tests start without one
    checkpoint = estimator.latest_checkpoint()
    assert checkpoint is not None and checkpoint.endswith("10")
