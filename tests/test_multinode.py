"""Several machines, as users start them: two `torchestimator launch --nnodes=2` nodes (on loopback, then
across two network namespaces joined by a veth pair), and TF_CONFIG / SLURM tasks as plain `python train.py`
processes. Each run's final weights must equal one process's with the same global batch (1e-6). Across the
namespaces, with only an s3:// model_dir shared, a whole node is killed -9 and replaced: the run resumes from
the committed checkpoint to the weights, bit for bit, of the same two nodes never interrupted.

Every process runs in its own session and is stopped (SIGTERM, then SIGKILL) when the deadline passes, so
a hang fails the test with the processes' logs instead of blocking CI; the collective timeout is lowered
so that workers torchrun left behind exit on their own too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import wait_until
from task_processes import (
    network_namespaces_unavailable,
    run_together,
    stop,
    task_environment,
    two_network_namespaces,
)

from torchestimator.distribute.launcher import find_free_port

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

DEADLINE_SECONDS = 120.0
"""How long one multi-process run may take before its processes are stopped."""

TRAIN_SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    mode, model_dir, output = sys.argv[1], sys.argv[2], sys.argv[3]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    class ReportStart(te.hooks.Hook):
        """Where this replica starts: the test sees a restarted group resume from a committed checkpoint."""
        def after_restore(self, state):
            rank = strategy.replica_id if strategy else 0
            print(f"start attempt={attempt} rank={rank} step={state.global_step}", flush=True)

    class PauseToBeKilled(te.hooks.Hook):
        """TE_TEST_PAUSE_AT_STEP / TE_TEST_PAUSE_FILE, given to one node only: after that step, once the store
        has a committed checkpoint, writes "<pid> <its name>" into the file and waits for the test's kill -9."""
        def __init__(self, step, path):
            self.step, self.path = step, path
        def after_step(self, run_context):
            if run_context.global_step != self.step:
                return
            deadline = time.monotonic() + 60
            while (latest := te.checkpoint.CheckpointStore(model_dir).latest_checkpoint()) is None:
                if time.monotonic() > deadline:
                    os._exit(4)
                time.sleep(0.1)
            with open(self.path + ".tmp", "w") as handle:
                handle.write(f"{os.getpid()} {os.path.basename(latest)}")
            os.replace(self.path + ".tmp", self.path)
            time.sleep(120)  # bounded: the test kills this process long before
            os._exit(3)

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)}, loss=F.cross_entropy(logits, labels))

    def input_fn(input_context=None):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(128, 6)).astype(np.float32)
        y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
        # batch_size is global: 2 replicas take 16 rows each of the 32 one process takes.
        return te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=5)(
            input_context=input_context)

    strategy = {"single": None, "mirrored": te.MirroredStrategy, "multi_worker": te.MultiWorkerMirroredStrategy}[mode]
    strategy = strategy() if strategy else None
    config = te.RunConfig(train_distribute=strategy, save_checkpoints_steps=5, save_summary_steps=5,
                          log_step_count_steps=None, progress_bar=False, random_seed=0)
    estimator = te.Estimator(model_fn=model_fn,
                             model=lambda: nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)),
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), model_dir=model_dir,
                             config=config)
    hooks = [ReportStart()]
    if os.environ.get("TE_TEST_PAUSE_FILE"):
        hooks.append(PauseToBeKilled(int(os.environ["TE_TEST_PAUSE_AT_STEP"]), os.environ["TE_TEST_PAUSE_FILE"]))
    estimator.train(input_fn, hooks=hooks, max_steps=10)
    rank, replicas = (strategy.replica_id, strategy.num_replicas) if strategy else (0, 1)
    if model_dir.startswith("s3://"):  # the store as this replica sees it (the test's host cannot reach it)
        from torchestimator._io import filesystems
        with open(os.path.join(output, f"store{rank}.json"), "w") as listing:
            json.dump({"checkpoints": [os.path.basename(path) for path in
                                       te.checkpoint.CheckpointStore(model_dir).all_checkpoints()],
                       "names": filesystems.listdir(model_dir)}, listing)
    np.savez(os.path.join(output, f"rank{rank}.npz"),
             **{name: estimator.get_variable_value(name) for name in estimator.get_variable_names()})
    with open(os.path.join(output, f"rank{rank}.json"), "w") as meta:
        json.dump({"replicas": replicas, "source": te.distribute.resolve_cluster().source,
                   "latest": os.path.basename(estimator.latest_checkpoint() or "")}, meta)
''')


def _read_run(output: Path, replicas: int) -> tuple[dict[str, np.ndarray], list[dict]]:
    weights = [dict(np.load(output / f"rank{rank}.npz")) for rank in range(replicas)]
    for other in weights[1:]:
        assert other.keys() == weights[0].keys()
        for name in weights[0]:
            np.testing.assert_array_equal(other[name], weights[0][name])  # replicas hold one model
    return weights[0], [json.loads((output / f"rank{rank}.json").read_text()) for rank in range(replicas)]


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("multinode") / "train.py"
    path.write_text(TRAIN_SCRIPT)
    return path


@pytest.fixture(scope="module")
def one_process_weights(script: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The reference: one process, the same global batch of 32."""
    folder = tmp_path_factory.mktemp("single")
    run_together(
        [([sys.executable, str(script), "single", str(folder / "model"), str(folder)], task_environment())],
        folder / "logs",
        DEADLINE_SECONDS,
    )
    weights, (meta,) = _read_run(folder, 1)
    assert meta == {"replicas": 1, "source": "local", "latest": "ckpt-10"}
    return weights


def _event_files(model_dir: Path) -> int:
    return len([name for name in os.listdir(model_dir) if name.startswith("events.out.tfevents")])


def _assert_same_weights(weights: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert weights.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(weights[name], expected[name], rtol=0, atol=1e-6, err_msg=name)


def _launch_node(
    script: Path,
    endpoint: str,
    run_id: str,
    model_dir: Path | str,
    output: Path,
    local_addr: str | None = None,
    *,
    max_restarts: int = 0,
    rdzv_conf: str = "join_timeout=90",
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "torchestimator",
        "launch",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        f"--rdzv_id={run_id}",
        f"--rdzv_conf={rdzv_conf}",
        "--monitor_interval=0.5",
        f"--max_restarts={max_restarts}",
    ]
    if local_addr is not None:
        command.append(f"--local_addr={local_addr}")  # the address this node's workers are reached at
    return [*command, str(script), "mirrored", str(model_dir), str(output)]


def test_two_launched_nodes_on_loopback_equal_one_process(script, one_process_weights, tmp_path):
    endpoint = f"127.0.0.1:{find_free_port()}"
    output = tmp_path / "output"
    output.mkdir()
    node = _launch_node(script, endpoint, f"loopback-{secrets.token_hex(4)}", tmp_path / "model", output)
    run_together([(node, task_environment()), (node, task_environment())], tmp_path / "logs", DEADLINE_SECONDS)
    weights, metas = _read_run(output, 2)
    assert [meta["source"] for meta in metas] == ["torchrun", "torchrun"]
    assert [meta["replicas"] for meta in metas] == [2, 2] and metas[0]["latest"] == "ckpt-10"
    assert _event_files(tmp_path / "model") == 1  # only the chief writes model_dir
    _assert_same_weights(weights, one_process_weights)


@pytest.mark.parametrize("source", ["tf_config", "slurm"])
def test_plain_python_tasks_form_one_group(script, one_process_weights, tmp_path, source):
    """TF users' launch: `python train.py` in each task with its TF_CONFIG (or each srun task's variables)."""
    port = find_free_port()
    cluster = {"chief": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{find_free_port()}"]}
    tasks = []
    for rank in range(2):
        if source == "tf_config":
            task = {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": 0}
            extra = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}
        else:
            extra = {
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank),
                "SLURM_NTASKS": "2",
                "SLURM_NODEID": "0",
                "SLURM_TASKS_PER_NODE": "2",
                "SLURM_NODELIST": "127.0.0.1",
                "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NAME": "train",
                "MASTER_PORT": str(port),
            }
        tasks.append(extra)
    output = tmp_path / "output"
    output.mkdir()
    mode = "multi_worker" if source == "tf_config" else "mirrored"
    command = [sys.executable, str(script), mode, str(tmp_path / "model"), str(output)]
    run_together([(command, task_environment(**extra)) for extra in tasks], tmp_path / "logs", DEADLINE_SECONDS)
    weights, metas = _read_run(output, 2)
    assert [meta["source"] for meta in metas] == [source, source] and [meta["replicas"] for meta in metas] == [2, 2]
    assert _event_files(tmp_path / "model") == 1  # only the chief writes model_dir
    _assert_same_weights(weights, one_process_weights)


# ---------------------------------------------------------------- two network namespaces


def test_two_launched_nodes_across_network_namespaces_equal_one_process(script, one_process_weights, tmp_path):
    reason = network_namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    output = tmp_path / "output"
    output.mkdir()
    with two_network_namespaces() as sides:
        endpoint = f"{sides[0][2]}:29400"  # inside namespace a: no other program has it
        run_id = f"netns-{secrets.token_hex(4)}"
        commands = []
        for namespace, veth, address in sides:
            node = _launch_node(script, endpoint, run_id, tmp_path / "model", output, local_addr=address)
            # gloo takes its interface from the host name, which resolves outside the namespace: name it.
            commands.append((["ip", "netns", "exec", namespace, *node], task_environment(GLOO_SOCKET_IFNAME=veth)))
        run_together(commands, tmp_path / "logs", DEADLINE_SECONDS)
    weights, metas = _read_run(output, 2)
    assert [meta["replicas"] for meta in metas] == [2, 2]
    _assert_same_weights(weights, one_process_weights)


_S3_VARIABLES = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@contextlib.contextmanager
def _s3_server_in(namespace: str, address: str, logs: Path) -> Iterator[str]:
    """moto's S3 server inside ``namespace``, listening on ``address`` (the other namespace reaches it over the
    veth pair); yields its endpoint once it answers, with a bucket ``run`` made."""
    logs.mkdir(parents=True, exist_ok=True)
    endpoint = f"http://{address}:29500"
    with open(logs / "s3.log", "wb") as log:
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, "-m", "moto.server", "-H", address, "-p", "29500"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        make_bucket = (
            "import boto3, sys, time\n"
            "deadline = time.monotonic() + 60\n"
            "while True:\n"
            "    try:\n"
            f"        boto3.client('s3', endpoint_url={endpoint!r}).create_bucket(Bucket='run'); break\n"
            "    except Exception:\n"
            "        if time.monotonic() > deadline: raise\n"
            "        time.sleep(0.2)\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", namespace, sys.executable, "-c", make_bucket],
            check=True,
            timeout=90,
            env=task_environment(**_S3_VARIABLES),
        )
        yield endpoint
    finally:
        stop(server)


def test_two_nodes_sharing_only_an_s3_model_dir_equal_one_process(script, one_process_weights, tmp_path):
    """No file system is shared: model_dir is s3://run/model on an S3 server in node a's namespace."""
    reason = network_namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    output = tmp_path / "output"
    output.mkdir()
    with two_network_namespaces() as sides, _s3_server_in(sides[0][0], sides[0][2], tmp_path / "logs") as endpoint:
        endpoint_rdzv = f"{sides[0][2]}:29400"
        run_id = f"netns-s3-{secrets.token_hex(4)}"
        commands = []
        for namespace, veth, address in sides:
            node = _launch_node(script, endpoint_rdzv, run_id, "s3://run/model", output, local_addr=address)
            environ = task_environment(GLOO_SOCKET_IFNAME=veth, AWS_ENDPOINT_URL=endpoint, **_S3_VARIABLES)
            commands.append((["ip", "netns", "exec", namespace, *node], environ))
        run_together(commands, tmp_path / "logs", DEADLINE_SECONDS)
    weights, metas = _read_run(output, 2)
    assert [meta["replicas"] for meta in metas] == [2, 2]
    assert [meta["latest"].split(".")[0] for meta in metas] == ["ckpt-10", "ckpt-10"]
    _assert_same_weights(weights, one_process_weights)


# torch 2.13's c10d rendezvous keeps the rank-0 agent's TCPStore across restarts, and the workers' store on it
# has no per-attempt prefix: a restarted group can read the dead workers' gloo addresses (see test_elastic.py).
_NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# A dead node stays a participant of the finished round until its heartbeats are keep_alive_interval *
# keep_alive_max_attempt seconds old (15 s by default): 3 s here, so the surviving node's next round starts soon.
_ELASTIC_RDZV_CONF = "join_timeout=90,keep_alive_interval=1,keep_alive_max_attempt=3"


def _start(command: list[str], environ: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as handle:
        return subprocess.Popen(
            command,
            env=environ,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _logs(logs: dict[str, Path]) -> str:
    return "\n".join(
        f"--- {name}:\n" + (path.read_text(errors="replace")[-3000:] if path.exists() else "(none)")
        for name, path in logs.items()
    )


def _kill_the_whole_node(namespace: str, agent: subprocess.Popen, worker_pid: int) -> None:
    """kill -9 of everything node ``namespace`` runs, as a machine that loses power: its launch agent (its own
    session), its worker (torchrun starts each worker in a session of its own), then whatever else is left in
    the namespace, until ``ip netns pids`` lists nothing."""
    for group in (agent.pid, worker_pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    agent.wait(30)
    deadline = time.monotonic() + 30
    while pids := subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split():
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {pids} still run in namespace {namespace} 30 s after kill -9")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)


def test_a_whole_node_killed_with_only_s3_shared_is_replaced_and_the_run_resumes_bit_exact(script, tmp_path):
    """Node b (launch agent and worker) is killed -9 after step 7, when ckpt-5 is committed to the s3:// model_dir;
    node a's agent (--max_restarts=1) restarts its worker, a fresh node b joins the same rendezvous, and both
    resume from ckpt-5 to weights equal, bit for bit, to those of the same two nodes never interrupted."""
    reason = network_namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    reference_output, output, pid_file = tmp_path / "reference", tmp_path / "output", tmp_path / "paused-worker"
    reference_output.mkdir()
    output.mkdir()
    logs = {name: tmp_path / f"{name}.log" for name in ("node_a", "node_b", "fresh_node_b")}
    processes: list[subprocess.Popen] = []
    with two_network_namespaces() as sides, _s3_server_in(sides[0][0], sides[0][2], tmp_path / "logs") as endpoint:
        (_, _, address_a), (namespace_b, _, _) = sides

        def node(namespace, veth, address, run_id, port, model_dir, folder, max_restarts=0, **extra):
            command = _launch_node(
                script,
                f"{address_a}:{port}",
                run_id,
                model_dir,
                folder,
                local_addr=address,
                max_restarts=max_restarts,
                rdzv_conf=_ELASTIC_RDZV_CONF,
            )
            environ = task_environment(
                GLOO_SOCKET_IFNAME=veth,
                AWS_ENDPOINT_URL=endpoint,
                TORCHESTIMATOR_COLLECTIVE_TIMEOUT="30",
                **_S3_VARIABLES,
                **_NO_SHARED_STORE,
                **extra,
            )
            return ["ip", "netns", "exec", namespace, *command], environ

        # The reference: the same two nodes, never interrupted.
        reference_id = f"netns-reference-{secrets.token_hex(4)}"
        run_together(
            [node(*side, reference_id, 29400, "s3://run/reference", reference_output) for side in sides],
            tmp_path / "logs" / "reference",
            DEADLINE_SECONDS,
        )

        run_id = f"netns-elastic-{secrets.token_hex(4)}"
        try:
            processes.append(
                _start(*node(*sides[0], run_id, 29401, "s3://run/model", output, max_restarts=1), logs["node_a"])
            )
            processes.append(
                _start(
                    *node(
                        *sides[1],
                        run_id,
                        29401,
                        "s3://run/model",
                        output,
                        TE_TEST_PAUSE_AT_STEP="7",
                        TE_TEST_PAUSE_FILE=str(pid_file),
                    ),
                    logs["node_b"],
                )
            )

            def paused() -> bool:
                if any(process.poll() is not None for process in processes):
                    raise AssertionError(f"a node exited before node b paused\n{_logs(logs)}")
                return pid_file.exists()

            try:
                wait_until(paused, timeout=DEADLINE_SECONDS, interval=0.1, what="node b's worker pausing after step 7")
            except AssertionError as error:
                raise AssertionError(f"{error}\n{_logs(logs)}") from None
            worker_pid, committed = pid_file.read_text().split()
            assert committed.split(".")[0] == "ckpt-5"  # committed to the store (ckpt-5.<save id>) before step 7
            _kill_the_whole_node(namespace_b, processes[1], int(worker_pid))
            processes.append(_start(*node(*sides[1], run_id, 29401, "s3://run/model", output), logs["fresh_node_b"]))
            survivors = [processes[0], processes[2]]
            try:
                wait_until(
                    lambda: all(process.poll() is not None for process in survivors),
                    timeout=DEADLINE_SECONDS,
                    interval=0.2,
                    what="node a and the fresh node b finishing",
                )
            except AssertionError as error:
                raise AssertionError(f"{error}\n{_logs(logs)}") from None
        finally:
            for process in processes:
                stop(process)
    assert [process.returncode for process in survivors] == [0, 0], _logs(logs)
    node_a, fresh_node_b = logs["node_a"].read_text(errors="replace"), logs["fresh_node_b"].read_text(errors="replace")
    # Node a's first worker started afresh and stopped naming the lost replica; its restarted one and the fresh
    # node b's resumed from ckpt-5.
    assert re.search(r"start attempt=0 rank=\d step=0\b", node_a), node_a[-4000:]
    assert "ReplicaLostError" in node_a, node_a[-4000:]
    assert re.search(r"resumed s3://run/model from ckpt-5\.\S+ and trained to step 10", node_a), node_a[-4000:]
    assert re.search(r"start attempt=1 rank=\d step=5\b", node_a), node_a[-4000:]
    assert re.search(r"start attempt=0 rank=\d step=5\b", fresh_node_b), fresh_node_b[-4000:]

    weights, metas = _read_run(output, 2)
    reference, _ = _read_run(reference_output, 2)
    assert [meta["latest"].split(".")[0] for meta in metas] == ["ckpt-10", "ckpt-10"]
    assert weights.keys() == reference.keys()
    for name in reference:
        np.testing.assert_array_equal(weights[name], reference[name], err_msg=name)  # bit for bit
    store = json.loads((output / "store0.json").read_text())
    assert [name.split(".")[0] for name in store["checkpoints"]] == ["ckpt-5", "ckpt-10"]
    assert store["checkpoints"][0] == committed  # the one the killed attempt had committed
    # No unfinished checkpoint is left: every ckpt-* prefix in the store is a committed checkpoint (S3 saves are
    # written in place as ckpt-<step>.<writer>-<save>), and there is no staging or set-aside one either.
    assert sorted(name for name in store["names"] if name.startswith("ckpt-")) == sorted(store["checkpoints"])
    assert [name for name in store["names"] if name.startswith((".tmp-ckpt-", ".old-ckpt-", ".del-ckpt-"))] == []
