"""ParameterServerStrategy (issue 30): a ps task's shards and optimizer, a trainer's RemoteOptimizer against them,
and real TF_CONFIG clusters of plain `python train.py` tasks on 127.0.0.1 (chief + 2 workers + 1 or 2 ps):
asynchronous training reaches the accuracy of synchronous training, synchronous training equals
MirroredStrategy on the same global batch (1e-6), and a checkpoint resumes with another number of ps tasks and
in a plain Estimator, optimizer state included."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.rpc as rpc
from helpers import wait_until
from task_processes import (
    network_namespaces_unavailable,
    run_together,
    start_tasks,
    task_environment,
    task_logs,
    two_network_namespaces,
    wait_tasks,
)

import torchestimator as te
from torchestimator.distribute import _ps_server
from torchestimator.distribute._ps_optimizer import RemoteOptimizer
from torchestimator.distribute.launcher import find_free_port
from torchestimator.distribute.parameter_server import ParameterServerStrategy
from torchestimator.distribute.ps_placement import FixedShardsPartitioner, module_variables, plan_placement
from torchestimator.errors import ConfigError

DEADLINE_SECONDS = 150.0
"""How long one cluster run may take before its processes are stopped (a hang fails with their logs)."""


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _spec(module: torch.nn.Module, optimizer: torch.optim.Optimizer, keys: dict[str, str]) -> _ps_server.OptimizerSpec:
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    groups = [
        ({k: v for k, v in group.items() if k != "params"}, [keys[names[id(p)]] for p in group["params"]])
        for group in optimizer.param_groups
    ]
    return _ps_server.OptimizerSpec(type(optimizer), dict(optimizer.defaults), groups)


# ----------------------------------------------------------------------------- one ps, in this process


def test_an_asynchronous_push_applies_the_trainers_optimizer_as_a_local_step_would():
    local, served = _model(), _model()
    optimizer = torch.optim.Adam(local.parameters(), lr=0.05, betas=(0.8, 0.9))
    keys = {name: f"{name}[0:{tensor.shape[0] if tensor.dim() else 1}]" for name, tensor in served.state_dict().items()}
    trainable = {keys[name] for name, _ in served.named_parameters()}
    server = _ps_server.ShardServer(0)
    values = {keys[name]: tensor for name, tensor in served.state_dict().items()}
    server.initialize(values, trainable, _spec(local, optimizer, keys), 7, "chief", None)
    for step in range(3):
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(step))
        local.zero_grad()
        local(x).square().mean().backward()
        gradients = {keys[name]: parameter.grad.clone() for name, parameter in local.named_parameters()}
        optimizer.step()
        answer = server.push("chief", gradients, {}, [{"lr": 0.05}], computed_at=7 + step)
        assert answer.applied and answer.global_step == 8 + step and answer.ended is None
    for name, parameter in local.named_parameters():
        torch.testing.assert_close(answer.values[keys[name]], parameter.detach(), rtol=0, atol=1e-7)
    states = server.optimizer_state()
    torch.testing.assert_close(states[keys["0.weight"]]["exp_avg"], optimizer.state[local[0].weight]["exp_avg"])


def test_synchronous_pushes_average_the_step_and_drop_a_stale_gradient():
    parameter_key = "w[0:2]"
    server = _ps_server.ShardServer(0)
    spec = _ps_server.OptimizerSpec(torch.optim.SGD, {"lr": 1.0}, [({"lr": 1.0}, [parameter_key])])
    server.initialize({parameter_key: torch.zeros(2)}, {parameter_key}, spec, 0, "chief", sync_replicas=2)
    answers: dict[str, _ps_server.PushAnswer] = {}

    def push(trainer: str, gradient: list[float]) -> None:
        answers[trainer] = server.push(trainer, {parameter_key: torch.tensor(gradient)}, {}, [{}], computed_at=0)

    first = threading.Thread(target=push, args=("chief", [2.0, 4.0]))
    first.start()
    first.join(0.5)
    assert first.is_alive()  # the step waits for its second gradient
    push("worker:0", [4.0, 8.0])
    first.join(10)
    assert not first.is_alive()
    for answer in answers.values():
        assert answer.applied and answer.global_step == 1
        torch.testing.assert_close(answer.values[parameter_key], torch.tensor([-3.0, -6.0]))  # the mean, applied once
    stale = server.push("worker:1", {parameter_key: torch.tensor([100.0, 100.0])}, {}, [{}], computed_at=0)
    assert not stale.applied  # computed on step 0's weights after step 1 was applied
    torch.testing.assert_close(stale.values[parameter_key], torch.tensor([-3.0, -6.0]))
    server.end("the chief finished")
    assert server.push("worker:1", {}, {}, [{}], computed_at=1).ended == "the chief finished"


def test_buffer_moves_of_concurrent_trainers_add_up():
    server = _ps_server.ShardServer(0)
    server.initialize({"mean[0:2]": torch.zeros(2)}, set(), None, 0, "chief", None)
    server.push("chief", {}, {"mean[0:2]": torch.tensor([1.0, 0.0])}, [], computed_at=0)
    answer = server.push("worker:0", {}, {"mean[0:2]": torch.tensor([0.5, 2.0])}, [], computed_at=0)
    torch.testing.assert_close(answer.values["mean[0:2]"], torch.tensor([1.5, 2.0]))


@pytest.fixture
def rpc_alone():
    """An RPC group of this one process, which is both the trainer and the ps ("chief")."""
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{find_free_port()}", _transports=["uv"], _channels=["basic"], rpc_timeout=30
    )
    rpc.init_rpc("chief", rank=0, world_size=1, rpc_backend_options=options)
    _ps_server.start_serving(_ps_server.ShardServer(0))
    try:
        yield
    finally:
        _ps_server.SERVER = None
        _ps_server._SERVING.clear()
        rpc.shutdown(graceful=False)


def _serving_alone(local: torch.optim.Optimizer, module: torch.nn.Module, plan) -> RemoteOptimizer:
    """A chief's RemoteOptimizer over ``module`` whose one ps is this process (rpc_alone), set up and pulled."""
    remote = RemoteOptimizer(
        local, module, plan, ["chief"], "chief", on_global_step=lambda step: None, timeout=30, chief=True
    )
    remote.initialize_servers(global_step=0, sync_replicas=None)
    remote.pull()
    return remote


def test_a_remote_optimizer_trains_partitioned_shards_and_checkpoints_as_the_local_optimizer(rpc_alone):
    local_module, remote_module = _model(), _model()
    local = torch.optim.Adam(local_module.parameters(), lr=0.05)
    plan = plan_placement(module_variables(remote_module), 1, FixedShardsPartitioner(num_shards=3))
    assert plan.variable("0.weight").partitioned
    remote = _serving_alone(torch.optim.Adam(remote_module.parameters(), lr=0.05), remote_module, plan)
    for step in range(4):
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(step))
        for module, optimizer in ((local_module, local), (remote_module, remote)):
            optimizer.zero_grad()
            module(x).square().mean().backward()
            optimizer.step()
    assert remote.global_step == 4
    for (name, expected), actual in zip(local_module.state_dict().items(), remote_module.state_dict().values()):
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6, msg=name)
    saved, reference = remote.state_dict(), local.state_dict()
    assert saved["param_groups"] == reference["param_groups"] and saved["state"].keys() == reference["state"].keys()
    for index, entry in reference["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(saved["state"][index][key], value, rtol=1e-6, atol=1e-7)
    # Restored into a new server (a resume), the state comes back by shards and trains on as the local optimizer.
    _ps_server.SERVER = _ps_server.ShardServer(0)
    remote.load_state_dict(saved)
    remote.initialize_servers(global_step=4, sync_replicas=None)
    restored = remote.state_dict()
    torch.testing.assert_close(restored["state"][0]["exp_avg_sq"], reference["state"][0]["exp_avg_sq"])


# ----------------------------------------------------------------------------- set-up refusals


def test_bad_settings_are_refused_when_built():
    with pytest.raises(ValueError, match="replicas_to_aggregate is for synchronous updates"):
        ParameterServerStrategy(replicas_to_aggregate=2)
    with pytest.raises(ValueError, match="positive integer"):
        ParameterServerStrategy(sync_replicas=True, replicas_to_aggregate=0)
    with pytest.raises(TypeError, match="sync_replicas must be True or False"):
        ParameterServerStrategy(sync_replicas="yes")  # type: ignore[arg-type]


def test_a_cluster_without_ps_tasks_or_a_chief_is_refused_at_setup(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}
        ),
    )
    with pytest.raises(ConfigError, match="needs TF_CONFIG with a 'ps' job"):
        ParameterServerStrategy().setup()
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {"cluster": {"worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, "task": {"type": "worker", "index": 0}}
        ),
    )
    with pytest.raises(ConfigError, match='must have one "chief" node'):  # TF's rule (TF 1.x flags: worker 0)
        ParameterServerStrategy().setup()


# ----------------------------------------------------------------------------- clusters of processes

TRAIN_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te
    from torchestimator.distribute.parameter_server import ParameterServerStrategy
    from torchestimator.distribute.ps_placement import FixedShardsPartitioner

    kind, model_dir, max_steps, output = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    task = json.loads(os.environ["TF_CONFIG"])["task"]

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)})
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels),
                                eval_metric_ops={"accuracy": te.metrics.accuracy(labels, logits.argmax(-1))})

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1536, 12)).astype(np.float32)
    y = (x @ rng.standard_normal((12, 3))).argmax(1)

    def train_input_fn(input_context=None):
        return te.numpy_input_fn({"x": x}, y, batch_size=48, num_epochs=None, shuffle=True, seed=1)(
            input_context=input_context)

    def eval_input_fn(input_context=None):
        return te.numpy_input_fn({"x": x}, y, batch_size=384, shuffle=False)(input_context=input_context)

    class MarkStep(te.hooks.Hook):
        # PS_TEST_MARK_STEP / PS_TEST_MARK: after that global step, writes this task's pid into the file (once),
        # for the test to kill a task mid-training.
        def __init__(self):
            self.step, self.path = int(os.environ.get("PS_TEST_MARK_STEP", "0")), os.environ.get("PS_TEST_MARK")
            # PS_TEST_HOLD_STEP / PS_TEST_HOLD: at that global step, waits (at most 240 s) for that file to appear.
            self.hold_step, self.hold = int(os.environ.get("PS_TEST_HOLD_STEP", "0")), os.environ.get("PS_TEST_HOLD")
        def after_step(self, run_context):
            if self.path and run_context.global_step >= self.step and not os.path.exists(self.path):
                with open(self.path + ".tmp", "w") as file:
                    file.write(str(os.getpid()))
                os.replace(self.path + ".tmp", self.path)
            if self.hold and run_context.global_step >= self.hold_step:
                deadline = time.monotonic() + 240
                while not os.path.exists(self.hold) and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.hold = None

    if kind == "mirrored":
        strategy = te.MultiWorkerMirroredStrategy()
    else:
        strategy = ParameterServerStrategy(
            sync_replicas=kind == "sync", partitioner=FixedShardsPartitioner(num_shards=2) if kind == "sync" else None)
    estimator = te.Estimator(
        model_fn=model_fn, model=lambda: nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 3)),
        optimizer=lambda parameters: torch.optim.Adam(parameters, lr=0.01), model_dir=model_dir,
        config=te.RunConfig(save_checkpoints_steps=20, random_seed=0, log_step_count_steps=None,
                            train_distribute=strategy))
    results, _ = te.train_and_evaluate(estimator, te.TrainSpec(train_input_fn, max_steps=max_steps, hooks=[MarkStep()]),
                                       te.EvalSpec(eval_input_fn))
    if task["type"] == "chief":
        np.savez(os.path.join(output, "weights.npz"),
                 **{name: estimator.get_variable_value(name) for name in estimator.get_variable_names()})
        with open(os.path.join(output, "results.json"), "w") as file:
            json.dump({key: float(value) for key, value in results.items()}, file)
    print(f"task {task['type']}:{task['index']} done", flush=True)
""")


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("parameter_server") / "train.py"
    path.write_text(TRAIN_SCRIPT)
    return path


def _commands(
    script: Path, kind: str, model_dir: Path, max_steps: int, output: Path, num_ps: int, **extra: dict[str, str]
) -> list[tuple[list[str], dict[str, str]]]:
    """chief + 2 workers (+ num_ps ps tasks), in that order, as plain processes with their TF_CONFIG; ``extra``:
    more environment variables by task name ("worker:1")."""
    output.mkdir(parents=True, exist_ok=True)
    jobs = {"chief": [f"127.0.0.1:{find_free_port()}"], "worker": [f"127.0.0.1:{find_free_port()}" for _ in range(2)]}
    if num_ps:
        jobs["ps"] = [f"127.0.0.1:{find_free_port()}" for _ in range(num_ps)]
    tasks = [{"type": job, "index": index} for job, addresses in jobs.items() for index in range(len(addresses))]
    command = [sys.executable, str(script), kind, str(model_dir), str(max_steps), str(output)]
    return [
        (
            command,
            task_environment(
                TF_CONFIG=json.dumps({"cluster": jobs, "task": task}),
                **extra.get(f"{task['type']}:{task['index']}", {}),
            ),
        )
        for task in tasks
    ]


def _cluster(script: Path, kind: str, model_dir: Path, max_steps: int, output: Path, num_ps: int) -> None:
    """The cluster of _commands; returns when every task exited 0."""
    run_together(_commands(script, kind, model_dir, max_steps, output, num_ps), output / "logs", DEADLINE_SECONDS)


def _kill_when_marked(
    commands: list[tuple[list[str], dict[str, str]]], victim: int, mark: Path, logs: Path, deadline: float
) -> list[int | None]:
    """Starts the tasks, kills -9 task ``victim`` once the mark file appears (a trainer writes it after a step), and
    returns every exit code."""
    processes = start_tasks(commands, logs)
    try:
        wait_until(lambda: mark.exists() or processes[victim].poll() is not None, timeout=DEADLINE_SECONDS)
        assert processes[victim].poll() is None, task_logs(logs, len(commands))
        processes[victim].send_signal(signal.SIGKILL)
    except BaseException:
        wait_tasks(processes, 0)
        raise
    codes, timed_out = wait_tasks(processes, deadline)
    assert not timed_out, (
        f"tasks {timed_out} still running {deadline:g} s after the kill\n{task_logs(logs, len(codes))}"
    )
    return codes


def _logs(output: Path) -> str:
    return "\n".join(path.read_text(errors="replace") for path in sorted((output / "logs").glob("*.log")))


@pytest.mark.slow
@pytest.mark.distributed
def test_synchronous_parameter_servers_equal_mirrored_and_asynchronous_reach_their_accuracy(script, tmp_path):
    _cluster(script, "mirrored", tmp_path / "mirrored", 60, tmp_path / "out_mirrored", num_ps=0)
    _cluster(script, "sync", tmp_path / "sync", 60, tmp_path / "out_sync", num_ps=2)
    mirrored, sync = (dict(np.load(tmp_path / f"out_{kind}" / "weights.npz")) for kind in ("mirrored", "sync"))
    assert mirrored.keys() == sync.keys()
    for name in mirrored:
        np.testing.assert_allclose(sync[name], mirrored[name], rtol=0, atol=1e-6, err_msg=name)
    sync_results = json.loads((tmp_path / "out_sync" / "results.json").read_text())
    assert sync_results["global_step"] == 60

    # Asynchronous: each global step is one trainer's update of 16 examples, so 180 steps see the examples that
    # 60 synchronous steps of 48 do.
    _cluster(script, "async", tmp_path / "async", 180, tmp_path / "out_async", num_ps=1)
    async_results = json.loads((tmp_path / "out_async" / "results.json").read_text())
    logs = _logs(tmp_path / "out_async")
    assert "served variables as a parameter server" in logs and logs.count(" done") == 4
    assert async_results["global_step"] >= 180  # asynchronous pushes may overshoot, as TF's global step does
    # The workers stay until the chief's final checkpoint has their input positions.
    (final,) = sorted((tmp_path / "async").glob("ckpt-*"), key=lambda path: int(path.name.split("-")[1]))[-1:]
    replicas = json.loads((final / "state.json").read_text())["extra"]["replicas"]
    assert len(replicas) == 3 and all(replica["input_source"] is not None for replica in replicas)
    assert "did not send its input position" not in logs
    # A fixed task, the same examples: asynchronous updates reach synchronous training's accuracy within 0.03.
    assert async_results["accuracy"] >= sync_results["accuracy"] - 0.03 > 0.9


@pytest.mark.slow
@pytest.mark.distributed
def test_a_checkpoint_resumes_with_another_ps_count_and_in_a_plain_estimator(script, tmp_path, caplog):
    model_dir = tmp_path / "model"
    _cluster(script, "async", model_dir, 40, tmp_path / "first", num_ps=2)
    _cluster(script, "async", model_dir, 80, tmp_path / "second", num_ps=1)
    chief_log = (tmp_path / "second" / "logs" / "process0.log").read_text()
    assert "resumed" in chief_log and "optimizer changed" not in chief_log
    results = json.loads((tmp_path / "second" / "results.json").read_text())
    assert results["global_step"] >= 80
    # Run again at a max_steps already reached: the chief skips and ends the ps tasks at once (none waits).
    _cluster(script, "async", model_dir, 80, tmp_path / "third", num_ps=1)
    assert "skipped training" in (tmp_path / "third" / "logs" / "process0.log").read_text()
    # An ordinary checkpoint: a plain Estimator restores weights and the Adam state the ps tasks kept.
    estimator = te.Estimator(
        model_fn=lambda model, features, labels, mode: te.EstimatorSpec(
            mode, loss=torch.nn.functional.cross_entropy(model(features["x"]), labels)
        ),
        model=lambda: torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)),
        optimizer=lambda parameters: torch.optim.Adam(parameters, lr=0.01),
        model_dir=str(model_dir),
    )
    batch = ({"x": torch.randn(32, 12)}, torch.zeros(32, dtype=torch.long))
    with caplog.at_level(logging.WARNING, logger="torchestimator"):
        estimator.train(lambda: [batch], steps=1)  # a list: it cannot resume the cluster's input, and says so
    assert not [record for record in caplog.records if "optimizer" in record.getMessage()]
    assert os.path.isdir(estimator.latest_checkpoint())


# ----------------------------------------------------------------------------- faults

FAULT_TIMEOUT = "10"
"""TORCHESTIMATOR_COLLECTIVE_TIMEOUT for the fault runs: a lost task is noticed within it."""


@pytest.mark.slow
@pytest.mark.distributed
def test_a_worker_killed_in_asynchronous_training_does_not_stop_the_others_and_rejoins_when_restarted(script, tmp_path):
    mark, rejoined = tmp_path / "mark", tmp_path / "rejoined"
    # Every trainer waits at step 400 until the restarted worker has taken a step: training cannot end before it is
    # back (the others train on meanwhile: the kill comes after step 30).
    hold = {"PS_TEST_HOLD": str(rejoined), "PS_TEST_HOLD_STEP": "400"}
    tasks = {
        "worker:1": {**hold, "PS_TEST_MARK": str(mark), "PS_TEST_MARK_STEP": "30"},
        "chief:0": hold,
        "worker:0": hold,
    }
    logs = tmp_path / "out" / "logs"
    commands = _commands(script, "async", tmp_path / "model", 1500, tmp_path / "out", 1, **tasks)
    processes = start_tasks(commands, logs)
    try:
        wait_until(lambda: mark.exists() or processes[2].poll() is not None, timeout=DEADLINE_SECONDS)
        assert processes[2].poll() is None, task_logs(logs, 4)
        # A second process for the task while the first still runs is refused, naming it.
        duplicate = start_tasks([commands[2]], tmp_path / "out" / "duplicate")[0]
        assert duplicate.wait(timeout=DEADLINE_SECONDS) != 0
        duplicate_log = (tmp_path / "out" / "duplicate" / "process0.log").read_text(errors="replace")
        assert "worker:1 is already running in this parameter-server group" in duplicate_log, duplicate_log[-3000:]
        processes[2].send_signal(signal.SIGKILL)
        assert processes[2].wait(timeout=60) == -signal.SIGKILL
        # The same task started again, while the chief and worker:0 train on: it joins and trains.
        command, environ = commands[2]
        environ = {**environ, "PS_TEST_MARK": str(rejoined), "PS_TEST_MARK_STEP": "0", "PS_TEST_HOLD": ""}
        processes += start_tasks([(command, environ)], tmp_path / "out" / "restarted")
    except BaseException:
        wait_tasks(processes, 0)
        raise
    codes, timed_out = wait_tasks(processes, DEADLINE_SECONDS)
    restarted_log = (tmp_path / "out" / "restarted" / "process0.log").read_text(errors="replace")
    assert not timed_out and [codes[0], codes[1], codes[3], codes[4]] == [0, 0, 0, 0], (
        codes,
        task_logs(logs, 4),
        restarted_log[-3000:],
    )
    assert "joining the running group again" in restarted_log and "task worker:1 done" in restarted_log
    assert rejoined.exists()  # the restarted worker took a step
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["global_step"] >= 1500 and results["accuracy"] > 0.9


@pytest.mark.slow
@pytest.mark.distributed
def test_a_worker_with_another_model_dir_stops_before_step_one_and_the_others_train(script, tmp_path):
    logs = tmp_path / "out" / "logs"
    # 1500 steps: the chief still trains when worker:1 checks (its check gives the file 1 s to show).
    commands = _commands(script, "async", tmp_path / "model", 1500, tmp_path / "out", 1)
    command, environ = commands[2]
    commands[2] = ([*command[:3], str(tmp_path / "elsewhere"), *command[4:]], environ)  # worker:1's own model_dir
    codes, timed_out = wait_tasks(start_tasks(commands, logs), DEADLINE_SECONDS)
    assert not timed_out and codes[2] != 0 and [codes[0], codes[1], codes[3]] == [0, 0, 0], (
        codes,
        task_logs(logs, 4),
    )
    text = (logs / "process2.log").read_text(errors="replace")
    assert (
        "ReplicasDisagreeError: worker:1 does not see the file .ps-model-dir-probe" in text
        and str(tmp_path / "model") in text
    ), text
    # The chief's probe went when it ended training: model_dir holds the run's own files only.
    assert not [path.name for path in (tmp_path / "model").iterdir() if "probe" in path.name]
    assert (tmp_path / "out" / "results.json").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_a_ps_killed_stops_every_task_naming_it_and_a_restart_resumes_bit_exact_in_sync_mode(script, tmp_path):
    environ = {"TORCHESTIMATOR_COLLECTIVE_TIMEOUT": FAULT_TIMEOUT}
    mark = tmp_path / "mark"
    marked = {**environ, "PS_TEST_MARK": str(mark), "PS_TEST_MARK_STEP": "45"}
    tasks = {"chief:0": marked, "worker:0": environ, "worker:1": environ, "ps:0": environ, "ps:1": environ}
    logs = tmp_path / "first" / "logs"
    commands = _commands(script, "sync", tmp_path / "model", 100000, tmp_path / "first", 2, **tasks)
    codes = _kill_when_marked(commands, 4, mark, logs, 60 + 3 * float(FAULT_TIMEOUT))
    assert codes[4] == -signal.SIGKILL
    assert all(code not in (0, None) for code in codes[:4]), (codes, task_logs(logs, 5))
    for index in range(3):  # the chief and both workers say which task was lost
        text = (logs / f"process{index}.log").read_text()
        assert "TaskLostError" in text and "ps:1" in text, text[-2000:]
    assert "TaskLostError" in (logs / "process3.log").read_text()  # ps:0, ended by the chief's failure
    saved = sorted(int(path.name.split("-")[1]) for path in (tmp_path / "model").glob("ckpt-*"))
    assert saved and saved[-1] >= 40
    # Each trainer's own state (input position, generator states) is in the checkpoint, as with DDP's replicas.
    extra = json.loads((tmp_path / "model" / f"ckpt-{saved[-1]}" / "state.json").read_text())["extra"]
    assert extra["num_replicas"] == 3
    assert all(replica["input_source"] is not None for replica in extra["replicas"])  # every worker answered

    # Every task restarted: the run resumes from the newest checkpoint and ends where one never stopped does.
    last = saved[-1] + 20
    _cluster(script, "sync", tmp_path / "model", last, tmp_path / "second", num_ps=2)
    assert (
        f"resumed {tmp_path / 'model'} from ckpt-{saved[-1]}"
        in (tmp_path / "second" / "logs" / "process0.log").read_text()
    )
    _cluster(script, "sync", tmp_path / "straight", last, tmp_path / "straight_out", num_ps=2)
    resumed = dict(np.load(tmp_path / "second" / "weights.npz"))
    straight = dict(np.load(tmp_path / "straight_out" / "weights.npz"))
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.distributed
def test_the_chief_killed_stops_the_workers_and_the_ps_within_the_timeout(script, tmp_path):
    environ = {"TORCHESTIMATOR_COLLECTIVE_TIMEOUT": FAULT_TIMEOUT}
    mark = tmp_path / "mark"
    tasks = {
        "chief:0": {**environ, "PS_TEST_MARK": str(mark), "PS_TEST_MARK_STEP": "30"},
        "worker:0": environ,
        "worker:1": environ,
        "ps:0": environ,
    }
    logs = tmp_path / "out" / "logs"
    commands = _commands(script, "async", tmp_path / "model", 100000, tmp_path / "out", 1, **tasks)
    codes = _kill_when_marked(commands, 0, mark, logs, 60 + 3 * float(FAULT_TIMEOUT))
    assert codes[0] == -signal.SIGKILL
    assert all(code not in (0, None) for code in codes[1:]), (codes, task_logs(logs, 4))
    for index in (1, 2, 3):
        text = (logs / f"process{index}.log").read_text()
        assert "TaskLostError" in text and "the chief stopped answering" in text, text[-2000:]


# ----------------------------------------------------------------------------- embedding tables on the ps


class _Recommender(torch.nn.Module):
    def __init__(self, embedding: torch.nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        self.head = torch.nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids).mean(1))


class _BagRecommender(torch.nn.Module):
    def __init__(self, bag: torch.nn.Module) -> None:
        super().__init__()
        self.embedding = bag
        self.head = torch.nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids))  # one bag per row of ids


TABLES = {
    "embedding": (
        _Recommender,
        lambda: torch.nn.Embedding(50, 4, padding_idx=0),
        lambda sharded: sharded.ShardedEmbedding(50, 4, padding_idx=0),
    ),
    "bag": (
        _BagRecommender,
        lambda: torch.nn.EmbeddingBag(50, 4, mode="mean", padding_idx=0),
        lambda sharded: sharded.ShardedEmbeddingBag(50, 4, mode="mean", padding_idx=0),
    ),
}


@pytest.mark.parametrize(
    ("optimizer", "table"),
    [(torch.optim.Adam, "embedding"), (torch.optim.SGD, "embedding"), (torch.optim.Adagrad, "embedding")]
    + [(torch.optim.Adam, "bag"), (torch.optim.SGD, "bag")],
)
def test_a_sharded_table_trains_as_a_local_embedding_and_only_its_rows_travel(rpc_alone, monkeypatch, optimizer, table):
    from torchestimator.distribute import sharded_embedding

    model, make_local, make_sharded = TABLES[table]
    torch.manual_seed(3)
    local = model(make_local())
    sharded_embedding.keep_tables_on_parameter_servers(True)
    try:
        remote_module = model(make_sharded(sharded_embedding))
    finally:
        sharded_embedding.keep_tables_on_parameter_servers(False)
    assert remote_module.embedding.weight.untyped_storage().nbytes() <= 8  # no table on the trainer
    remote_module.load_state_dict(local.state_dict())  # the chief's restore: the table is kept to send
    plan = plan_placement(
        module_variables(remote_module), 1, FixedShardsPartitioner(num_shards=3), shard_names=[r"embedding\."]
    )
    looked_up: list[int] = []
    real_lookup = _ps_server.ShardServer.lookup
    monkeypatch.setattr(
        _ps_server.ShardServer,
        "lookup",
        lambda self, key, rows: looked_up.append(len(rows)) or real_lookup(self, key, rows),
    )
    remote = _serving_alone(optimizer(remote_module.parameters(), lr=0.1), remote_module, plan)
    reference = optimizer(local.parameters(), lr=0.1)
    for step in range(4):
        ids = torch.randint(0, 50, (8, 3), generator=torch.Generator().manual_seed(step))
        ids[0, 0] = 0  # the padding row is looked up, never updated
        for module, opt in ((local, reference), (remote_module, remote)):
            opt.zero_grad()
            module(ids).square().mean().backward()
            opt.step()
    assert max(looked_up) <= 24  # a batch's rows, never the table
    saved = remote.state_dict()  # the snapshot: the table comes back whole for the checkpoint
    state = remote_module.state_dict()
    for name, expected in local.state_dict().items():
        torch.testing.assert_close(state[name], expected, rtol=1e-6, atol=1e-6, msg=name)
    assert torch.count_nonzero(state["embedding.weight"][0]) == 0
    for index, entry in reference.state_dict()["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(saved["state"][index][key], value, rtol=1e-6, atol=1e-6)


TABLE_SCRIPT = textwrap.dedent("""
    import json, os, resource, sys
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    model_dir, output, rows, dim = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    strategy = te.ParameterServerStrategy()
    strategy.setup()  # joins the group first: its threads' stacks count in the address space the limit caps
    headroom = int(os.environ.get("PS_TEST_HEADROOM_MB", "0")) << 20
    if headroom:  # this trainer may grow by less than the table: it must never hold it
        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + headroom, size + headroom))
        try:
            torch.empty((rows, dim))
            print("the limit let a whole table be allocated", flush=True)
            sys.exit(3)
        except (MemoryError, RuntimeError):
            print(f"a whole table ({rows * dim * 4 >> 20} MiB) does not fit under the limit", flush=True)

    class Recommender(nn.Module):
        def __init__(self):
            super().__init__()
            self.items = te.distribute.ShardedEmbedding(rows, dim)
            self.head = nn.Linear(dim, 1)
        def forward(self, ids):
            return self.head(self.items(ids).mean(1)).squeeze(1)

    def model_fn(model, features, labels, mode):
        prediction = model(features["ids"])
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions={"score": prediction})
        return te.EstimatorSpec(mode, loss=F.mse_loss(prediction, labels))

    rng = np.random.default_rng(0)
    ids = rng.integers(0, rows, size=(4096, 5))
    target = (ids % 7 == 0).mean(1).astype(np.float32)

    def input_fn(input_context=None):
        return te.numpy_input_fn({"ids": ids}, target, batch_size=96, num_epochs=None, shuffle=True, seed=2)(
            input_context=input_context)

    estimator = te.Estimator(
        model_fn=model_fn, model=Recommender, model_dir=model_dir,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.5),
        config=te.RunConfig(save_checkpoints_steps=1000, random_seed=0, log_step_count_steps=None,
                            train_distribute=strategy))
    estimator.train(input_fn, max_steps=40)
    print(f"task {task['type']}:{task['index']} done", flush=True)
""")


@pytest.mark.slow
@pytest.mark.distributed
def test_an_embedding_table_larger_than_a_workers_memory_limit_trains_on_two_ps(tmp_path):
    script = tmp_path / "table.py"
    script.write_text(TABLE_SCRIPT)
    rows, dim = 2_000_000, 32  # 244 MiB; each worker may grow by 160 MiB
    jobs = {
        "chief": [f"127.0.0.1:{find_free_port()}"],
        "worker": [f"127.0.0.1:{find_free_port()}" for _ in range(2)],
        "ps": [f"127.0.0.1:{find_free_port()}" for _ in range(2)],
    }
    tasks = [{"type": job, "index": index} for job, addresses in jobs.items() for index in range(len(addresses))]
    command = [sys.executable, str(script), str(tmp_path / "model"), str(tmp_path), str(rows), str(dim)]
    run_together(
        [
            (
                command,
                task_environment(
                    TF_CONFIG=json.dumps({"cluster": jobs, "task": task}),
                    **({"PS_TEST_HEADROOM_MB": "160"} if task["type"] == "worker" else {}),
                ),
            )
            for task in tasks
        ],
        tmp_path / "logs",
        DEADLINE_SECONDS,
    )
    logs = {index: (tmp_path / "logs" / f"process{index}.log").read_text() for index in range(5)}
    for worker in (1, 2):
        assert "does not fit under the limit" in logs[worker] and "done" in logs[worker]
    # The checkpoint is ordinary: the whole table as the embedding's weight, trained rows moved from their start.
    from safetensors.torch import load_file

    (checkpoint,) = (tmp_path / "model").glob("ckpt-*")
    weights = load_file(str(checkpoint / "model.safetensors"))
    assert weights["items.weight"].shape == (rows, dim)
    assert int(checkpoint.name.split("-")[1]) >= 40


@pytest.mark.slow
@pytest.mark.distributed
def test_parameter_servers_across_two_network_namespaces(script, tmp_path):
    """chief + worker:0 on one side of a veth pair, worker:1 + ps:0 on the other: the tasks reach each other only
    over that link (TensorPipe's TCP transport bound to it by TP_SOCKET_IFNAME)."""
    reason = network_namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    with two_network_namespaces() as sides:
        (namespace_a, veth_a, address_a), (namespace_b, veth_b, address_b) = sides
        jobs = {
            "chief": [f"{address_a}:{find_free_port()}"],
            "worker": [f"{address_a}:{find_free_port()}", f"{address_b}:{find_free_port()}"],
            "ps": [f"{address_b}:{find_free_port()}"],
        }
        placed = [("chief", 0, namespace_a, veth_a), ("worker", 0, namespace_a, veth_a)]
        placed += [("worker", 1, namespace_b, veth_b), ("ps", 0, namespace_b, veth_b)]
        command = [sys.executable, str(script), "async", str(tmp_path / "model"), "60", str(tmp_path)]
        run_together(
            [
                (
                    ["ip", "netns", "exec", namespace, *command],
                    task_environment(
                        TF_CONFIG=json.dumps({"cluster": jobs, "task": {"type": job, "index": index}}),
                        TP_SOCKET_IFNAME=veth,
                        GLOO_SOCKET_IFNAME=veth,
                    ),
                )
                for job, index, namespace, veth in placed
            ],
            tmp_path / "logs",
            DEADLINE_SECONDS,
        )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["global_step"] >= 60 and results["accuracy"] > 0.8


def test_several_tasks_on_one_machine_with_default_threads_are_warned_about(monkeypatch, caplog):
    from torchestimator.distribute import parameter_server
    from torchestimator.distribute.cluster import cluster_from_tf_config

    jobs = {"chief": ["10.0.0.1:1"], "worker": ["10.0.0.1:2", "10.0.0.2:2"], "ps": ["10.0.0.1:3"]}
    cluster = cluster_from_tf_config({"TF_CONFIG": json.dumps({"cluster": jobs, "task": {"type": "ps", "index": 0}})})
    monkeypatch.setattr(parameter_server.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(parameter_server.torch, "get_num_threads", lambda: 4)
    with caplog.at_level(logging.WARNING, logger="torchestimator"):
        parameter_server._warn_if_oversubscribed(cluster, "ps:0")
    assert (
        "3 tasks of this cluster run on this machine (10.0.0.1), each with 4 torch threads, on 4 cores" in caplog.text
    )
    assert "OMP_NUM_THREADS=1" in caplog.text
    caplog.clear()
    monkeypatch.setattr(parameter_server.torch, "get_num_threads", lambda: 1)
    parameter_server._warn_if_oversubscribed(cluster, "ps:0")
    assert caplog.text == ""
