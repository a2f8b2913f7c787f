"""Benchmark: parameter-server training (asynchronous and synchronous) against 2-process DDP, with and without a
straggler; TensorFlow's own parameter servers on the same model; and the throughput of a ps-sharded embedding.

Every configuration is a cluster of plain processes on 127.0.0.1, each started with its TF_CONFIG as TF users
start theirs (this script re-run with ``--task``), one thread per process (OMP_NUM_THREADS=1):

- ``ddp``: te.MultiWorkerMirroredStrategy, chief + 1 worker (2 processes): each step all-reduces the gradients
  of the global batch split over the 2 replicas;
- ``async``: te.distribute.ParameterServerStrategy, chief + 1 worker + 1 ps (3 processes): each trainer computes
  on its half of the global batch and pushes its gradients; the ps applies each push when it arrives;
- ``sync``: the same cluster with sync_replicas=True (SyncReplicasOptimizer: each step applies the mean of the
  2 trainers' gradients);
- ``tf_async`` (when TensorFlow imports, e.g. in the comparison environment of benchmarks/requirements-bench.txt):
  what tf.estimator did with a TF_CONFIG of chief + worker + ps tasks: between-graph replication,
  ``replica_device_setter`` placing the variables on the ps, each trainer's ``AdamOptimizer.minimize`` applied
  there asynchronously (tf.compat.v1 graph mode, one plain Session per trainer, 1 intra- and 1 inter-op thread);
- ``tf2_ps`` (only when named in --kinds): TF2's ParameterServerStrategy, a ClusterCoordinator (the chief, which
  trains nothing) handing every step to whichever of 2 workers is free, + 1 ps: 4 processes; one window, no
  straggler (its steps are functions run by TF's servers: no hook of ours runs there to slow one);
- ``embedding`` / ``embedding_local`` (where te.distribute.ShardedEmbedding exists): a 1,000,000 x 32 table of
  ShardedEmbedding rows on the ps under ``async`` (16 uniform ids per example, averaged, then a linear layer;
  Adagrad, which updates only the rows a batch touched), and the same model in one process with a local
  nn.Embedding(sparse=True): table rows looked up and updated per second.

Same model for the first ones: an MLP of 64 features -> 3 hidden layers of 512 (ReLU) -> 10 classes, 563,722
parameters (2.25 MB), softmax cross-entropy, Adam (lr 1e-3); the same global batch (default 256: 128 per trainer);
one fixed random batch per trainer (the input costs nothing). Each cluster trains through three phases measured
in global batches (DDP steps): a warm-up, a window with both trainers equal, and a window where the worker is a
straggler (a hook sleeps after each of its steps as long as that step took: half its speed). Asynchronous global
steps are single trainers' updates of half a global batch each, so their phases hold twice as many global steps.

The rates are the chief's: examples/s = global steps it saw pass in a window x examples per global step /
the window's seconds, from its after_step clock (start-up, imports and the warm-up are outside). Beside them:
each trainer's steps in the window, every process's CPU use in it (from /proc, sampled by this script), and for
the parameter servers how long a trainer's push (gradients out, values back) takes per step. Configurations run
in interleaved rounds, each round in a rotated order; the figures are medians over the rounds.

Run:  python benchmarks/parameter_server.py [--rounds N] [--kinds K,...] [--quick] [--no-tensorflow]
Last line:  parameter_server async_vs_ddp= async_vs_ddp_straggler= sync_vs_ddp= embedding_rows_per_s=
            async_vs_tf=   (examples/s over DDP's, equal and with the straggler; distinct table rows/s; async
            over tf.estimator's parameter servers; n/a where not measured)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STRAGGLER_TARGET = 1.3
"""async_vs_ddp_straggler must reach this (issue 30)."""
KINDS = ("ddp", "async", "sync")
TF_KIND = "tf_async"
EMBEDDING_KINDS = ("embedding", "embedding_local")
"""The ps-sharded embedding table under asynchronous parameter servers, and its anchor: the same model in one
process with a local nn.Embedding(sparse=True)."""
TF2_KIND = "tf2_ps"
"""TensorFlow 2's ParameterServerStrategy with a ClusterCoordinator: not in the default run (see its note)."""
TF_KINDS = (TF_KIND, TF2_KIND)
ALL_KINDS = (*KINDS, *TF_KINDS, *EMBEDDING_KINDS)
DEFAULT_KINDS = (*KINDS, TF_KIND, *EMBEDDING_KINDS)
ONE_WINDOW_KINDS = (*EMBEDDING_KINDS, TF2_KIND)
"""Configurations timed in one window, without a straggler."""


def cluster_jobs(kind: str) -> dict[str, int]:
    """The tasks of a configuration, by job. TF2's coordinator (the chief) does not train; its 2 workers do."""
    if kind == "embedding_local":
        return {"chief": 1}
    if kind == "ddp":
        return {"chief": 1, "worker": 1}
    if kind == TF2_KIND:
        return {"chief": 1, "worker": 2, "ps": 1}
    return {"chief": 1, "worker": 1, "ps": 1}


def recorders(kind: str) -> list[str]:
    """The tasks that write step records and end by themselves (TF's servers never do)."""
    if kind == TF2_KIND:
        return ["chief:0"]
    return [f"{job}:{index}" for job, count in cluster_jobs(kind).items() if job != "ps" for index in range(count)]


TASK_DEADLINE_SECONDS = 240.0
SAMPLE_SECONDS = 0.1
"""How often the CPU time of each task process is read from /proc."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What the command line chose."""

    features: int
    hidden: int
    layers: int
    classes: int
    global_batch: int
    warmup: int
    """Global batches (DDP steps) before the first window."""
    equal: int
    """Global batches in the window with both trainers equal."""
    straggler: int
    """Global batches from the start of the straggler's slowing to the end."""
    settle: int
    """Global batches into the straggler phase before its window opens."""
    embedding_rows: int
    embedding_dim: int
    ids_per_example: int
    embedding_window: int
    """Global batches in the embedding runs' one window (after the warm-up; no straggler)."""
    rounds: int
    embedding_rounds: int
    """Rounds (the first ones) that also run the embedding configurations."""
    kinds: tuple[str, ...]
    """Configurations to run, of KINDS and TF_KIND."""
    tensorflow: bool
    tensorflow_python: str | None
    quick: bool

    def task_arguments(self) -> list[str]:
        """The command-line flags that give a task process these settings."""
        return [
            f"--features={self.features}",
            f"--hidden={self.hidden}",
            f"--layers={self.layers}",
            f"--global-batch={self.global_batch}",
            f"--warmup={self.warmup}",
            f"--equal={self.equal}",
            f"--straggler={self.straggler}",
            f"--settle={self.settle}",
            f"--embedding-rows={self.embedding_rows}",
            f"--embedding-dim={self.embedding_dim}",
            f"--ids-per-example={self.ids_per_example}",
            f"--embedding-window={self.embedding_window}",
        ]


def parameter_count(settings: Settings) -> int:
    widths = [settings.features] + [settings.hidden] * settings.layers + [settings.classes]
    return sum(inputs * outputs + outputs for inputs, outputs in itertools.pairwise(widths))


# -- phases and rates (pure: the smoke test checks them) -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Phases:
    """A configuration's phase boundaries in its own global steps, and the examples one global step holds."""

    warm_end: int
    straggle_from: int
    straggle_window_from: int
    last: int
    examples_per_step: int


def phases(kind: str, settings: Settings, trainers: int = 2) -> Phases:
    """Asynchronous global steps are one trainer's update (global batch / trainers examples); the others' are
    global batches."""
    per_batch = trainers if kind in ("async", *TF_KINDS, *EMBEDDING_KINDS) else 1
    warm_end = settings.warmup * per_batch
    if kind in ONE_WINDOW_KINDS:  # one window, no straggler
        end = warm_end + (settings.embedding_window if kind in EMBEDDING_KINDS else settings.equal) * per_batch
        return Phases(warm_end, end, end, end, settings.global_batch // per_batch)
    straggle_from = warm_end + settings.equal * per_batch
    return Phases(
        warm_end=warm_end,
        straggle_from=straggle_from,
        straggle_window_from=straggle_from + settings.settle * per_batch,
        last=straggle_from + settings.straggler * per_batch,
        examples_per_step=settings.global_batch // per_batch,
    )


def window(records: Sequence[tuple[float, int]], first_step: int, last_step: int) -> tuple[float, int, float, int]:
    """(start time, start step, end time, end step) of the chief's records: its first record at or past
    ``first_step`` and its last at or before ``last_step``."""
    inside = [(clock, step) for clock, step in records if first_step <= step <= last_step]
    if len(inside) < 2:
        raise ValueError(
            f"fewer than 2 records between global steps {first_step} and {last_step} "
            f"(of {len(records)}, steps {records[0][1] if records else '-'}..{records[-1][1] if records else '-'})"
        )
    (start, start_step), (end, end_step) = inside[0], inside[-1]
    return start, start_step, end, end_step


def examples_per_second(records: Sequence[tuple[float, int]], first: int, last: int, examples_per_step: int) -> float:
    start, start_step, end, end_step = window(records, first, last)
    return (end_step - start_step) * examples_per_step / (end - start)


def steps_between(records: Sequence[tuple[float, int]], start: float, end: float) -> int:
    """How many of a trainer's own steps ended within [start, end]."""
    return sum(1 for clock, _ in records if start < clock <= end)


def cpu_share(samples: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Cores one process used over [start, end], from (clock, cpu seconds) samples (nearest samples inside)."""
    inside = [(clock, cpu) for clock, cpu in samples if start <= clock <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else float("nan")


def median(values: Sequence[float]) -> float:
    finite = [value for value in values if value == value]
    return statistics.median(finite) if finite else float("nan")


# -- one task of a torchestimator cluster ----------------------------------------------------------------------


def build_model(settings: Settings) -> Any:
    import torch.nn as nn

    widths = [settings.features] + [settings.hidden] * settings.layers
    layers: list[nn.Module] = []
    for inputs, outputs in itertools.pairwise(widths):
        layers += [nn.Linear(inputs, outputs), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], settings.classes))
    return nn.Sequential(*layers)


def one_batch(settings: Settings, trainer: int, size: int) -> tuple[Any, Any]:
    """The fixed batch of trainer ``trainer`` (numpy: the TensorFlow tasks use it too)."""
    import numpy as np

    generator = np.random.default_rng(100 + trainer)
    features = generator.standard_normal((size, settings.features), dtype=np.float32)
    labels = generator.integers(0, settings.classes, size=size).astype(np.int64)
    return features, labels


def _timed_step(optimizer: Any, seconds: list[tuple[float, float]]) -> None:
    """Wraps a parameter-server optimizer's step (its push and the values' return) with a clock."""
    step = optimizer.step

    def timed(closure: Any = None) -> Any:
        start = time.perf_counter()
        result = step(closure)
        seconds.append((time.perf_counter(), time.perf_counter() - start))
        return result

    optimizer.step = timed


def embedding_batches(settings: Settings, trainer: int, size: int, count: int = 8) -> list[tuple[Any, Any]]:
    """``count`` batches of ids drawn uniformly from the table (the most distinct rows a batch can move)."""
    import numpy as np

    generator = np.random.default_rng(200 + trainer)
    return [
        (
            generator.integers(0, settings.embedding_rows, size=(size, settings.ids_per_example)),
            generator.integers(0, settings.classes, size=size),
        )
        for _ in range(count)
    ]


def build_embedding_model(settings: Settings, local: bool) -> Any:
    """ids -> a table's rows, averaged per example -> a linear layer to the classes."""
    import torch.nn as nn

    import torchestimator as te

    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            rows, dim = settings.embedding_rows, settings.embedding_dim
            self.table = nn.Embedding(rows, dim, sparse=True) if local else te.distribute.ShardedEmbedding(rows, dim)
            self.head = nn.Linear(dim, settings.classes)

        def forward(self, ids: Any) -> Any:
            return self.head(self.table(ids).mean(1))

    return Bag()


def run_torch_task(kind: str, settings: Settings, output: Path) -> None:
    import logging

    import numpy as np
    import torch
    import torch.nn.functional as F

    import torchestimator as te
    from torchestimator.distribute.parameter_server import ParameterServerStrategy

    torch.set_num_threads(1)
    task = json.loads(os.environ["TF_CONFIG"])["task"] if "TF_CONFIG" in os.environ else {"type": "chief", "index": 0}
    name = f"{task['type']}:{task['index']}"
    trainer = 0 if task["type"] == "chief" else 1 + task["index"]
    plan = phases(kind, settings)
    push_seconds: list[tuple[float, float]] = []
    embedding = kind in EMBEDDING_KINDS
    rows_per_step: list[float] = []

    class TimedParameterServers(ParameterServerStrategy):
        def wrap_optimizer(self, optimizer: Any, module: Any) -> Any:
            wrapped = super().wrap_optimizer(optimizer, module)
            _timed_step(wrapped, push_seconds)
            return wrapped

    if kind == "ddp":
        strategy: Any = te.MultiWorkerMirroredStrategy()
    elif kind == "embedding_local":
        strategy = None  # one process, one device
    else:
        strategy = TimedParameterServers(sync_replicas=kind == "sync")

    class Clock(te.Hook):
        """Each step's end (clock, global step); on the straggler, sleeps as long as its step took."""

        def __init__(self, straggler: bool) -> None:
            self.records: list[tuple[float, int]] = []
            self.straggler = straggler
            self.started = 0.0

        def before_step(self, run_context: Any) -> None:
            self.started = time.perf_counter()

        def after_step(self, run_context: Any) -> None:
            now = time.perf_counter()
            self.records.append((now, run_context.global_step))
            if self.straggler and run_context.global_step >= plan.straggle_from:
                time.sleep(now - self.started)

    def model_fn(model: Any, features: Any, labels: Any, mode: str) -> Any:
        logits = model(features["x"])
        return te.EstimatorSpec(mode, loss=F.cross_entropy(logits, labels))

    def input_fn(input_context: Any = None) -> Any:
        # One process alone takes one trainer's share, as the 2 trainers of the others do.
        size = (
            settings.global_batch // 2
            if input_context is None or kind == "embedding_local"
            else input_context.get_per_replica_batch_size(settings.global_batch)
        )
        if embedding:
            pool = embedding_batches(settings, trainer, size)
            rows_per_step.append(float(np.mean([len(np.unique(ids)) for ids, _ in pool])))
            batches = [({"x": torch.from_numpy(ids)}, torch.from_numpy(labels)) for ids, labels in pool]
        else:
            features, labels = one_batch(settings, trainer, size)
            batches = [({"x": torch.from_numpy(features)}, torch.from_numpy(labels))]
        while True:
            yield from batches

    if embedding:  # Adagrad: TF's optimizer for embeddings; it updates only the rows a batch touched
        model, optimizer = (
            lambda: build_embedding_model(settings, local=kind == "embedding_local"),
            lambda parameters: torch.optim.Adagrad(parameters, lr=0.05),
        )
    else:
        model, optimizer = lambda: build_model(settings), lambda parameters: torch.optim.Adam(parameters, lr=1e-3)
    clock = Clock(straggler=task["type"] == "worker" and task["index"] == 0 and not embedding)
    estimator = te.Estimator(
        model_fn,
        model=model,
        model_dir=str(output / "model"),
        optimizer=optimizer,
        config=te.RunConfig(
            train_distribute=strategy,
            save_checkpoints_steps=None,
            save_checkpoints_secs=None,
            save_summary_steps=None,
            log_step_count_steps=None,
            progress_bar=False,
            random_seed=0,
        ),
    )
    logging.getLogger("torchestimator").setLevel(logging.ERROR)  # checkpoints off, an endless input: intended
    estimator.train(input_fn, max_steps=plan.last, hooks=[clock])
    if task["type"] != "ps":
        _write_records(output, name, clock.records, push_seconds, rows_per_step[0] if rows_per_step else None)


def _write_records(
    output: Path,
    name: str,
    records: list[tuple[float, int]],
    push_seconds: list[tuple[float, float]],
    rows_per_step: float | None = None,
) -> None:
    path = output / f"{name.replace(':', '-')}.json"
    data = {"records": records, "push": push_seconds, "rows_per_step": rows_per_step}
    path.with_suffix(".tmp").write_text(json.dumps(data))
    path.with_suffix(".tmp").replace(path)


# -- one task of a TensorFlow cluster (tf.estimator's parameter servers: between-graph replication) ------------


def run_tensorflow_task(settings: Settings, output: Path) -> None:
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    description = json.loads(os.environ["TF_CONFIG"])
    job, index = description["task"]["type"], description["task"]["index"]
    cluster = tf.train.ClusterSpec(description["cluster"])
    threads = {"intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1}
    server = tf.distribute.Server(cluster, job_name=job, task_index=index, config=v1.ConfigProto(**threads))
    if job == "ps":
        server.join()  # never returns: the script ends the ps when the trainers are done, as TF users did
        return
    name = f"{job}:{index}"
    trainer = 0 if job == "chief" else 1 + index
    plan = phases(TF_KIND, settings)
    device = f"/job:{job}/task:{index}"
    features, labels = one_batch(settings, trainer, settings.global_batch // 2)
    with v1.device(v1.train.replica_device_setter(worker_device=device, cluster=cluster)):
        global_step = v1.train.get_or_create_global_step()
        widths = [settings.features] + [settings.hidden] * settings.layers + [settings.classes]
        activations = tf.constant(features)
        for layer, (inputs, outputs) in enumerate(itertools.pairwise(widths)):
            kernel = v1.get_variable(
                f"dense_{layer}/kernel", [inputs, outputs], initializer=v1.glorot_uniform_initializer()
            )
            bias = v1.get_variable(f"dense_{layer}/bias", [outputs], initializer=v1.zeros_initializer())
            activations = tf.matmul(activations, kernel) + bias
            if layer < len(widths) - 2:
                activations = tf.nn.relu(activations)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.constant(labels), logits=activations)
        )
        train_op = v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=global_step)
        uninitialized = v1.report_uninitialized_variables()
        initialize = v1.global_variables_initializer()
    config = v1.ConfigProto(device_filters=["/job:ps", device], **threads)
    records: list[tuple[float, int]] = []
    with v1.Session(server.target, config=config) as session:
        if job == "chief":
            session.run(initialize)
        else:  # what MonitoredTrainingSession's worker does, polling faster than its 30 s
            while len(session.run(uninitialized)):
                time.sleep(0.05)
        step = 0
        while step < plan.last:
            started = time.perf_counter()
            _, step = session.run([train_op, global_step])
            now = time.perf_counter()
            records.append((now, int(step)))
            if job == "worker" and index == 0 and step >= plan.straggle_from:
                time.sleep(now - started)
    _write_records(output, name, records, [])


def run_tensorflow2_task(settings: Settings, output: Path) -> None:
    """TF2's ParameterServerStrategy: the workers and the ps are tf.distribute.Servers; the chief is the
    ClusterCoordinator, which hands each step (a tf.function) to whichever worker is free."""
    import tensorflow as tf

    description = json.loads(os.environ["TF_CONFIG"])
    job, index = description["task"]["type"], description["task"]["index"]
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # One intra-op thread each; the inter-op pools stay TF's: with one inter-op thread the coordinator's remote
    # functions deadlock (the step waits on the worker's dataset iterator).
    if job != "chief":
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=job,
            task_index=index,
            protocol="grpc",
            config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1),
        )
        server.join()  # never returns
        return
    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    widths = [settings.features] + [settings.hidden] * settings.layers + [settings.classes]
    initializer = tf.keras.initializers.GlorotUniform(seed=0)
    with strategy.scope():
        variables = []
        for inputs, outputs in itertools.pairwise(widths):
            variables += [tf.Variable(initializer([inputs, outputs])), tf.Variable(tf.zeros([outputs]))]
        slots = [(tf.Variable(tf.zeros_like(v)), tf.Variable(tf.zeros_like(v))) for v in variables]
        beta_powers = tf.Variable(1.0), tf.Variable(1.0)
    # The same batch for both workers: the coordinator's dataset function cannot tell them apart (the cost of a
    # step does not depend on which numbers it holds).
    features, labels = one_batch(settings, 0, settings.global_batch // 2)

    def dataset_fn() -> Any:
        return tf.data.Dataset.from_tensors((features, labels)).repeat()

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(iterator: Any) -> Any:
        def replica(features: Any, labels: Any) -> Any:
            with tf.GradientTape() as tape:
                activations = features
                for layer in range(0, len(variables), 2):
                    activations = tf.matmul(activations, variables[layer]) + variables[layer + 1]
                    if layer < len(variables) - 2:
                        activations = tf.nn.relu(activations)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=activations))
            gradients = tape.gradient(loss, variables)
            beta1_power = beta_powers[0].assign(beta_powers[0] * 0.9)
            beta2_power = beta_powers[1].assign(beta_powers[1] * 0.999)
            for variable, gradient, (m, v) in zip(variables, gradients, slots):
                # v1 AdamOptimizer's own kernel, applied where the variable lives (the ps)
                tf.raw_ops.ResourceApplyAdam(
                    var=variable.handle, m=m.handle, v=v.handle, beta1_power=beta1_power,
                    beta2_power=beta2_power, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, grad=gradient,
                )  # fmt: skip
            return loss

        batch_features, batch_labels = next(iterator)
        return strategy.run(replica, args=(batch_features, batch_labels))

    plan = phases(TF2_KIND, settings)
    # Every step is queued at once; each one's result is fetched in order, its clock the step's end (as seen here).
    results = [coordinator.schedule(step, args=(iterator,)) for _ in range(plan.last)]
    records = []
    for count, result in enumerate(results, start=1):
        result.fetch()
        records.append((time.perf_counter(), count))
    _write_records(output, "chief:0", records, [])
    sys.stdout.flush()
    os._exit(0)  # the coordinator's threads would wait for the servers, which never end


# -- the clusters ----------------------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _task_environment(tf_config: dict[str, Any] | None) -> dict[str, str]:
    skip = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"}
    environ = {name: value for name, value in os.environ.items() if name not in skip}
    environ.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_ENABLE_ONEDNN_OPTS="0",
        TORCHESTIMATOR_COLLECTIVE_TIMEOUT="120",
    )
    if tf_config is not None:
        environ["TF_CONFIG"] = json.dumps(tf_config)
    return environ


class CpuSampler:
    """Reads each process's CPU seconds (utime + stime in /proc/<pid>/stat) every SAMPLE_SECONDS."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: dict[str, list[tuple[float, float]]] = {name: [] for name in pids}
        self.load: list[float] = []
        self._stop = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            now = time.perf_counter()
            for name, pid in self.pids.items():
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                self.samples[name].append((now, (int(fields[11]) + int(fields[12])) / self._tick))
            try:
                self.load.append(float(Path("/proc/loadavg").read_text().split()[0]))
            except OSError:
                pass


@dataclasses.dataclass
class ClusterRun:
    """One configuration's run: its trainers' records, the CPU samples of every task, the seconds it took."""

    kind: str
    records: dict[str, list[tuple[float, int]]]
    push: dict[str, list[tuple[float, float]]]
    cpu: dict[str, list[tuple[float, float]]]
    load: list[float]
    seconds: float
    started: float = 0.0
    """The clock when the first task was started."""
    rows_per_step: float | None = None
    """Embedding runs: distinct table rows one trainer's batch looks up (and updates), on average."""


def run_cluster(kind: str, settings: Settings, root: Path, python: str) -> ClusterRun:
    """Starts the configuration's tasks as plain processes with their TF_CONFIG; returns when the trainers are done."""
    jobs = {job: [f"127.0.0.1:{_free_port()}" for _ in range(count)] for job, count in cluster_jobs(kind).items()}
    output = root / kind
    output.mkdir(parents=True, exist_ok=True)
    tasks = [(job, index) for job, addresses in jobs.items() for index in range(len(addresses))]
    command = [python, str(Path(__file__).resolve()), "--task", kind, f"--output={output}", *settings.task_arguments()]
    processes: dict[str, subprocess.Popen[bytes]] = {}
    started = time.perf_counter()
    try:
        for job, index in tasks:
            with open(output / f"{job}-{index}.log", "wb") as log:
                processes[f"{job}:{index}"] = subprocess.Popen(
                    command,
                    env=_task_environment(
                        None if kind == "embedding_local" else {"cluster": jobs, "task": {"type": job, "index": index}}
                    ),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        trainers = recorders(kind)
        with CpuSampler({name: process.pid for name, process in processes.items()}) as sampler:
            deadline = time.monotonic() + TASK_DEADLINE_SECONDS
            while any(processes[name].poll() is None for name in trainers) and time.monotonic() < deadline:
                if any(processes[name].poll() not in (None, 0) for name in processes):
                    break
                time.sleep(0.05)
        failed = {name: process.poll() for name, process in processes.items() if process.poll() not in (None, 0)}
        unfinished = [name for name in trainers if processes[name].poll() is None]
        if failed or unfinished:
            logs = "\n".join(
                f"--- {job}:{index}\n" + (output / f"{job}-{index}.log").read_text(errors="replace")[-3000:]
                for job, index in tasks
            )
            raise RuntimeError(f"{kind}: tasks failed {failed}, unfinished {unfinished}\n{logs}")
    finally:
        for process in processes.values():
            _stop(process)
    seconds = time.perf_counter() - started
    records, push, rows = {}, {}, []
    for name in trainers:
        data = json.loads((output / f"{name.replace(':', '-')}.json").read_text())
        records[name] = [(clock, step) for clock, step in data["records"]]
        push[name] = [(clock, took) for clock, took in data["push"]]
        if data.get("rows_per_step") is not None:
            rows.append(data["rows_per_step"])
    rows_per_step = statistics.mean(rows) if rows else None
    return ClusterRun(kind, records, push, sampler.samples, sampler.load, seconds, started, rows_per_step)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the task's session, then SIGKILL. The measurement is over when the trainers are done: a ps (which
    in TensorFlow never ends by itself, server.join()) is not waited for."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(5.0)
        except subprocess.TimeoutExpired:
            pass


# -- figures of one run ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Figures:
    """One configuration in one round."""

    equal: float
    """examples/s, both trainers equal."""
    straggler: float
    """examples/s, the worker slowed."""
    steps: dict[str, tuple[int, int]]
    """Each trainer's own steps in the (equal, straggler) windows."""
    cpu: dict[str, float]
    """Cores each process used in the equal window."""
    push_ms: dict[str, float]
    """Median push round trip per step (parameter servers), each trainer, equal window."""
    load: float
    seconds: float
    startup: float
    """Seconds from starting the tasks to the chief's first step."""
    rows_per_second: float = float("nan")
    """Embedding runs: distinct rows looked up and updated per second, all trainers together."""


def figures_of(run: ClusterRun, settings: Settings) -> Figures:
    plan = phases(run.kind, settings)
    chief = run.records["chief:0"]
    equal = window(chief, plan.warm_end, plan.straggle_from)
    has_straggler = plan.last > plan.straggle_window_from
    slow = window(chief, plan.straggle_window_from, plan.last) if has_straggler else equal
    rate = examples_per_second(chief, plan.warm_end, plan.straggle_from, plan.examples_per_step)
    return Figures(
        equal=rate,
        straggler=(
            examples_per_second(chief, plan.straggle_window_from, plan.last, plan.examples_per_step)
            if has_straggler
            else float("nan")
        ),
        rows_per_second=(
            float("nan") if run.rows_per_step is None else rate / plan.examples_per_step * run.rows_per_step
        ),
        steps={
            name: (steps_between(records, equal[0], equal[2]), steps_between(records, slow[0], slow[2]))
            for name, records in run.records.items()
        },
        cpu={name: cpu_share(samples, equal[0], equal[2]) for name, samples in run.cpu.items()},
        push_ms={
            name: 1e3 * median([took for clock, took in pushes if equal[0] < clock <= equal[2]])
            for name, pushes in run.push.items()
            if pushes
        },
        load=max(run.load) if run.load else float("nan"),
        seconds=run.seconds,
        startup=chief[0][0] - run.started,
    )


# -- the run --------------------------------------------------------------------------------------------------


def tensorflow_python(settings: Settings) -> str | None:
    """An interpreter that imports TensorFlow: --tensorflow-python, else this one when it can."""
    if not settings.tensorflow or not set(TF_KINDS) & set(settings.kinds):
        return None
    candidates = [settings.tensorflow_python] if settings.tensorflow_python else [sys.executable]
    for candidate in candidates:
        probe = subprocess.run(
            [candidate, "-c", "import tensorflow"],
            capture_output=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            check=False,
            timeout=120,
        )
        if probe.returncode == 0:
            return candidate
    return None


def parse_settings(argv: Sequence[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds of every configuration (3)")
    parser.add_argument(
        "--embedding-rounds", type=int, default=None, help="of those, rounds that also run the embedding ones (1)"
    )
    parser.add_argument("--global-batch", type=int, default=256, help="examples per global batch, even (256)")
    parser.add_argument("--features", type=int, default=None, help="input features (64)")
    parser.add_argument("--hidden", type=int, default=None, help="width of the hidden layers (512)")
    parser.add_argument("--layers", type=int, default=None, help="hidden layers (3)")
    parser.add_argument("--warmup", type=int, default=None, help="global batches of warm-up (30)")
    parser.add_argument("--equal", type=int, default=None, help="global batches in the equal window (120)")
    parser.add_argument("--straggler", type=int, default=None, help="global batches with the straggler (90)")
    parser.add_argument("--settle", type=int, default=None, help="straggler global batches before its window (5)")
    parser.add_argument("--embedding-rows", type=int, default=None, help="rows of the embedding table (1000000)")
    parser.add_argument("--embedding-dim", type=int, default=None, help="width of the embedding table (32)")
    parser.add_argument("--ids-per-example", type=int, default=None, help="table ids per example (16)")
    parser.add_argument(
        "--embedding-window", type=int, default=None, help="global batches timed per embedding run (60)"
    )
    parser.add_argument(
        "--kinds",
        default=",".join(DEFAULT_KINDS),
        help=f"configurations to run, comma-separated, of {','.join(ALL_KINDS)} (default {','.join(DEFAULT_KINDS)}; "
        "TensorFlow's where it imports, the embedding ones where te.distribute.ShardedEmbedding exists)",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny model, few steps, one round: a smoke run")
    parser.add_argument("--no-tensorflow", action="store_true", help="skip TensorFlow's parameter servers")
    parser.add_argument("--tensorflow-python", default=None, help="an interpreter with TensorFlow (default: this one)")
    parser.add_argument("--task", choices=ALL_KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    quick = arguments.quick

    def given(value: int | None, default: int, quick_default: int) -> int:
        return value if value is not None else (quick_default if quick else default)

    settings = Settings(
        features=given(arguments.features, 64, 16),
        hidden=given(arguments.hidden, 512, 32),
        layers=given(arguments.layers, 3, 2),
        classes=10,
        global_batch=arguments.global_batch,
        warmup=given(arguments.warmup, 30, 5),
        equal=given(arguments.equal, 120, 20),
        straggler=given(arguments.straggler, 90, 20),
        settle=given(arguments.settle, 5, 2),
        embedding_rows=given(arguments.embedding_rows, 1_000_000, 10_000),
        embedding_dim=given(arguments.embedding_dim, 32, 8),
        ids_per_example=given(arguments.ids_per_example, 16, 4),
        embedding_window=given(arguments.embedding_window, 60, 10),
        rounds=given(arguments.rounds, 3, 1),
        embedding_rounds=given(arguments.embedding_rounds, 1, 1),
        kinds=tuple(kind.strip() for kind in arguments.kinds.split(",") if kind.strip()),
        tensorflow=not arguments.no_tensorflow,
        tensorflow_python=arguments.tensorflow_python,
        quick=quick,
    )
    numbers = (
        settings.features,
        settings.hidden,
        settings.layers,
        settings.equal,
        settings.rounds,
        settings.embedding_rounds,
    )
    if min(numbers) < 1 or settings.global_batch < 2 or settings.global_batch % 2 or settings.warmup < 1:
        parser.error(
            "--features, --hidden, --layers, --warmup, --equal, --rounds and --embedding-rounds must be at least 1 "
            "and --global-batch "
            f"even and at least 2; received {numbers}, warmup {settings.warmup}, global batch {settings.global_batch}."
        )
    unknown = sorted(set(settings.kinds) - set(ALL_KINDS))
    if unknown or not settings.kinds:
        parser.error(f"--kinds takes some of {', '.join(ALL_KINDS)}; received {arguments.kinds!r}.")
    table = (settings.embedding_rows, settings.embedding_dim, settings.ids_per_example, settings.embedding_window)
    if min(table) < 1:
        parser.error(
            f"--embedding-rows, --embedding-dim, --ids-per-example and --embedding-window must be at least 1; "
            f"received {table}."
        )
    if not 0 <= settings.settle < settings.straggler - 1:
        parser.error(
            f"--settle must be at least 0 and below --straggler - 1; received {settings.settle} and "
            f"{settings.straggler}."
        )
    return settings, arguments


def _print_conditions(settings: Settings, tensorflow: str | None) -> None:
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"conditions: {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start; torch "
        f"{torch.__version__}; one thread per process (OMP_NUM_THREADS=1), plain processes on 127.0.0.1 with TF_CONFIG"
    )
    print(
        f"conditions: MLP {settings.features} -> {settings.layers} x {settings.hidden} (ReLU) -> {settings.classes}, "
        f"{parameter_count(settings):,} parameters ({parameter_count(settings) * 4 / 1e6:.2f} MB), Adam lr 1e-3, "
        f"softmax cross-entropy; global batch {settings.global_batch} ({settings.global_batch // 2} per trainer); "
        "one fixed random batch per trainer"
    )
    print(
        "conditions: processes: ddp = chief + worker (2, gloo all-reduce); async/sync = chief + worker + ps (3: "
        "one more than DDP, the ps on the same 2 cores, torch RPC over TCP); tf_async = the same 3 tasks in "
        "TensorFlow (tf.compat.v1 replica_device_setter, as tf.estimator ran them; gRPC; 1 intra- and 1 inter-op "
        "thread each)"
    )
    print(
        f"conditions: phases in global batches: warm-up {settings.warmup}, equal window {settings.equal}, then the "
        f"worker slowed 2x (sleeps as long as each of its steps took) for {settings.straggler}, its window from "
        f"{settings.settle} in; {settings.rounds} interleaved round(s) (the embedding ones in the first "
        f"{min(settings.embedding_rounds, settings.rounds)}); rates are the chief's over each window"
    )
    if tensorflow is None:
        reason = (
            "--no-tensorflow"
            if not settings.tensorflow
            else "not in --kinds"
            if not set(TF_KINDS) & set(settings.kinds)
            else "no interpreter here imports tensorflow; give one with --tensorflow-python, e.g. the venv of "
            "benchmarks/requirements-bench.txt"
        )
        print(f"conditions: TensorFlow: not run ({reason})")
    else:
        print(f"conditions: TensorFlow from {tensorflow}")
    if TF2_KIND not in settings.kinds:
        print(
            f"conditions: TF2's ParameterServerStrategy (ClusterCoordinator) runs only with --kinds ...,{TF2_KIND}: "
            "4 processes (its coordinator trains nothing: it hands each step to whichever of 2 workers is free), "
            "one window without a straggler (no hook of ours runs in its workers to slow one), about 25 s more"
        )


def main(argv: Sequence[str] | None = None) -> int:
    settings, arguments = parse_settings(argv)
    if arguments.task:
        output = Path(arguments.output)
        if arguments.task == TF_KIND:
            run_tensorflow_task(settings, output)
        elif arguments.task == TF2_KIND:
            run_tensorflow2_task(settings, output)
        else:
            run_torch_task(arguments.task, settings, output)
        return 0
    tensorflow = tensorflow_python(settings)
    _print_conditions(settings, tensorflow)
    embedding_note = _embedding_unavailable() if any(kind in EMBEDDING_KINDS for kind in settings.kinds) else None
    kinds = [
        kind
        for kind in settings.kinds
        if (kind not in TF_KINDS or tensorflow) and (kind not in EMBEDDING_KINDS or embedding_note is None)
    ]
    results: dict[str, list[Figures]] = {kind: [] for kind in kinds}
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="parameter-server-bench-"))
    try:
        for round_index in range(settings.rounds):
            order = kinds[round_index % len(kinds) :] + kinds[: round_index % len(kinds)]  # each kind first once
            for kind in order:
                if kind in EMBEDDING_KINDS and (embedding_note is not None or round_index >= settings.embedding_rounds):
                    continue
                python = tensorflow if kind in TF_KINDS else sys.executable
                assert python is not None
                try:
                    run = run_cluster(kind, settings, root / f"round{round_index}", python)
                except RuntimeError as error:
                    if kind not in EMBEDDING_KINDS:
                        raise
                    # The table's code is new: a failure is reported as such, and no figure stands in for it.
                    embedding_note = f"the {kind} run failed: {str(error).splitlines()[0]}"
                    print(f"round {round_index} {kind}: failed\n{error}", flush=True)
                    continue
                figures = figures_of(run, settings)
                results[kind].append(figures)
                _print_run(round_index, kind, figures)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _print_summary(settings, results, time.perf_counter() - began, embedding_note)
    return 0


def _embedding_unavailable() -> str | None:
    """Why the embedding figure cannot be measured here, or None when te.distribute.ShardedEmbedding exists."""
    try:
        import torchestimator.distribute as distribute

        distribute.ShardedEmbedding  # noqa: B018 -- the lazy package imports it here
    except (AttributeError, ImportError) as error:
        return f"te.distribute.ShardedEmbedding is not built yet ({type(error).__name__}: {error})"
    return None


def _print_run(round_index: int, kind: str, figures: Figures) -> None:
    steps = " ".join(f"{name} {equal}/{slow}" for name, (equal, slow) in figures.steps.items())
    cpu = " ".join(f"{name} {share:.2f}" for name, share in figures.cpu.items())
    push = " ".join(f"{name} {ms:.1f}" for name, ms in figures.push_ms.items())
    print(
        f"round {round_index} {kind:>8}: equal {figures.equal:8.0f} examples/s, "
        + (
            f"table rows/s {figures.rows_per_second:9.0f}; trainer steps in the window "
            + " ".join(f"{name} {equal}" for name, (equal, _) in figures.steps.items())
            if kind in EMBEDDING_KINDS
            else "no straggler; steps in the window "
            + " ".join(f"{name} {equal}" for name, (equal, _) in figures.steps.items())
            if kind in ONE_WINDOW_KINDS
            else f"straggler {figures.straggler:8.0f} examples/s; trainer steps (equal/straggler window) {steps}"
        )
        + f"; cores used {cpu}"
        + (f"; push round trip ms {push}" if push else "")
        + f"; peak load {figures.load:.2f}; {figures.seconds:.1f} s, {figures.startup:.1f} s to the first step",
        flush=True,
    )


def _print_summary(
    settings: Settings, results: dict[str, list[Figures]], seconds: float, embedding_note: str | None
) -> None:
    def rates(kind: str, which: str) -> list[float]:
        return [getattr(figures, which) for figures in results.get(kind, [])]

    ratios: dict[str, list[float]] = {
        "async_vs_ddp": [ratio(a, d) for a, d in zip(rates("async", "equal"), rates("ddp", "equal"))],
        "async_vs_ddp_straggler": [ratio(a, d) for a, d in zip(rates("async", "straggler"), rates("ddp", "straggler"))],
        "sync_vs_ddp": [ratio(s, d) for s, d in zip(rates("sync", "equal"), rates("ddp", "equal"))],
        "async_vs_tf": [ratio(a, t) for a, t in zip(rates("async", "equal"), rates(TF_KIND, "equal"))],
        "async_vs_tf2": [ratio(a, t) for a, t in zip(rates("async", "equal"), rates(TF2_KIND, "equal"))],
        "async_vs_tf_straggler": [
            ratio(a, t) for a, t in zip(rates("async", "straggler"), rates(TF_KIND, "straggler"))
        ],
    }
    for kind in results:
        equal, slow = median(rates(kind, "equal")), median(rates(kind, "straggler"))
        print(
            f"{kind:>8}: median examples/s equal {equal:8.0f}"
            + (
                f", with the straggler {slow:8.0f} ({ratio(slow, equal):.2f} of equal)"
                if kind not in ONE_WINDOW_KINDS
                else f", table rows/s {median(rates(kind, 'rows_per_second')):10.0f}"
                if kind in EMBEDDING_KINDS
                else " (no straggler run)"
            )
        )
    for name, values in ratios.items():
        if values:
            print(f"{name}: median {median(values):.3f} of {' '.join(f'{value:.3f}' for value in values)}")
    straggler = median(ratios["async_vs_ddp_straggler"])
    verdict = (
        "meets"
        if straggler >= STRAGGLER_TARGET
        else "misses"
        if straggler == straggler
        else "(not measured: ddp and async must both run) for"
    )
    print(
        f"async_vs_ddp_straggler {straggler:.3f} {verdict} the target >= {STRAGGLER_TARGET}"
        + (" (quick run: a tiny model, the figures mean little)" if settings.quick else "")
    )
    embedding_rates = rates("embedding", "rows_per_second")
    if embedding_note is None and "embedding" not in settings.kinds:
        embedding_note = "not run (--kinds)"
    if embedding_note is None and embedding_rates:
        rows = median(embedding_rates)
        embedding_figure = f"{rows:.0f}"
        local = rates("embedding_local", "rows_per_second")
        versus = [ratio(ps, one) for ps, one in zip(embedding_rates, local)]
        print(
            f"embedding: a {settings.embedding_rows:,} x {settings.embedding_dim} te.distribute.ShardedEmbedding on "
            f"the ps, {settings.ids_per_example} uniform ids per example, Adagrad, 2 asynchronous trainers: "
            f"{rows:.0f} distinct rows/s looked up and updated"
            + (
                f"; over one process with a local nn.Embedding(sparse=True): median {median(versus):.3f} of "
                + " ".join(f"{value:.3f}" for value in versus)
                if versus
                else ""
            )
        )
    else:
        print(f"conditions: embedding_rows_per_s n/a: {embedding_note or 'no run'}; no figure stands in for it")
        embedding_figure = "n/a"
    tf_figure = f"{median(ratios['async_vs_tf']):.3f}" if ratios["async_vs_tf"] else "n/a"
    print(f"total: {seconds:.0f} s")
    print(
        f"parameter_server async_vs_ddp={median(ratios['async_vs_ddp']):.3f} "
        f"async_vs_ddp_straggler={straggler:.3f} sync_vs_ddp={median(ratios['sync_vs_ddp']):.3f} "
        f"embedding_rows_per_s={embedding_figure} async_vs_tf={tf_figure}"
    )


if __name__ == "__main__":
    sys.exit(main())
