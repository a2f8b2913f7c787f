"""Benchmark: the per-step cost of Estimator.train against a hand-written PyTorch loop.

Three comparisons, each against the strongest honest hand-written loop (the
same work without the framework, and no per-step `.item()`: on an accelerator
that sync would be the framework's cost, not the anchor's):

* `mlp`, `cnn`: the framework's per-step dispatch alone. Both loops get the
  same model, seed, thread count and pre-built in-memory batches; the
  Estimator runs with checkpoints, summaries, step logging and the progress
  bar disabled. Median step time.
* `mlp_defaults`: the Estimator with its default chores on (a checkpoint every
  100 steps, summaries and a log line every 100 steps; the progress bar off),
  against a hand loop doing the same chores (torch.save + fsync of model and
  optimizer, a torch SummaryWriter scalar for the loss and the learning rate,
  a log line). Mean step time, since the chores are rare and long.
* `input_fn_mlp`: the Estimator reading `te.numpy_input_fn(...)` against a
  hand loop slicing the same arrays with `torch.from_numpy`. Median step time.
* `mlp_paired`: the `mlp` comparison step by step instead of round by round.
  A hook runs one hand-loop step (its own model and optimizer, the batch the
  Estimator just took) after every Estimator step, so each Estimator step is
  timed next to a hand step taken the moment after. This machine's speed
  drifts by up to +-30% between rounds of a fraction of a second (the same
  loop on the same model, round after round); pairing steps cancels that drift,
  which the round medians only average over. Both sides see the other's
  cache footprint between their steps. Median over 3 runs of the ratio of
  median step times.
* `mlp_paired_floor`: the same pairing around the least any framework with
  the model_fn API does per step (call model_fn, which builds an
  EstimatorSpec; backward, step, zero_grad; call the hooks), its runs
  interleaved with `mlp_paired`'s. What a model_fn framework cannot go
  below on this machine; `mlp_paired` over it is what the Estimator's own
  per-step work (spec check, NaN guard, hook context, step count, stop
  agreement) costs.

Method: many short rounds of each loop, interleaved (each round takes the
next permutation of the loops, so every loop follows every other equally
often), the first dropped as warm-up. glibc malloc's thresholds are pinned
for the whole run (see pin_allocator; --allocator default leaves them), and
each loop's minor page faults per step are printed. A loop's time in a round is the median of its step
times (on the process CPU clock by default, which leaves out the time other
programs hold the cores); a ratio is the median over rounds of the two loops'
times in the same round. The hand loop also runs against itself, and that
ratio is printed as the noise floor: differences smaller than its distance
from 1 are not resolved. The final weights of the Estimator and the hand loop
must be bit-identical in every round (the script exits 1 otherwise). When
PyTorch Lightning is installed (the `bench` extra) its Trainer runs the MLP too.

Run:  python benchmarks/loop_overhead.py [--steps N] [--cnn-steps N] [--rounds R] [--threads T] [--allocator pinned|default] [--quick]
Last line:  loop_overhead mlp=<ratio> cnn=<ratio> mlp_defaults=<ratio> input_fn_mlp=<ratio> lightning_mlp=<ratio or n/a> mlp_paired=<ratio> mlp_paired_floor=<ratio>
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import itertools
import logging
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]
TARGETS = {"mlp": 1.02, "cnn": 1.01}
CHORE_EVERY = 100
"""Steps between checkpoints, summaries and log lines in the default-settings comparison (both loops; quick: 10)."""
LEARNING_RATE = 1e-3
CLASSES = 10


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """One model and its data, run identically by every loop."""

    name: str
    """Short name used in the output ("mlp", "cnn")."""
    build_model: Callable[[], nn.Module]
    """Builds the model; called right after seeding, so equal seeds give equal weights."""
    example_shape: tuple[int, ...]
    """Shape of one example (without the batch dimension)."""
    steps: int
    """Optimizer steps per round."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """What the command line chose."""

    steps: int
    cnn_steps: int
    rounds: int
    warmup_rounds: int
    threads: int
    clock: str
    """"cpu" (process CPU time) or "wall": the clock the ratios are computed on."""
    batch_size: int
    seed: int
    quick: bool
    lightning: bool
    allocator: str = "pinned"
    """"pinned" (glibc malloc's thresholds fixed by pin_allocator) or "default"."""
    chore_every: int = CHORE_EVERY
    """Steps between the chores of the default-settings comparison; it runs three times as many steps."""
    paired_steps: int = 1500
    """Estimator steps per run of the step-by-step comparison (mlp_paired)."""


@dataclasses.dataclass
class RoundResult:
    """One loop's run of one round: the clocks after each step and the trained model."""

    stamps: list[tuple[float, float, int]]
    model: nn.Module


def stamp() -> tuple[float, float, int]:
    """(wall clock, this process's CPU time) in seconds, and the process's minor page faults so far.

    CPU time leaves out the time the process waits while other programs run,
    which on a shared machine is most of the noise in wall-clock step times;
    the framework's per-step work is CPU work, so CPU time still counts it.
    The page faults say how often the step touched memory fresh from the
    kernel (see pin_allocator): printed per loop, so that a difference in
    them is seen rather than read as the framework's cost.
    """
    return time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
PINNED_MMAP_THRESHOLD = 32 << 20
"""Allocations up to this size come from the heap (glibc's largest allowed value on 64-bit)."""
PINNED_TRIM_THRESHOLD = 256 << 20
"""Free memory the heap keeps before it is handed back to the kernel."""


def pin_allocator() -> str:
    """Fixes glibc malloc's thresholds for the whole run, the same for every loop; says what it did.

    By default glibc moves its mmap and trim thresholds as a process frees
    large blocks, and returns free heap to the kernel: the next step then
    page-faults its activations in again. On the CNN that is ~1000-2000 faults
    (4-8 MB) per step, 10-30% of a step's time, and how many depends on the
    heap left by whatever ran before (another loop, a gc), not on the loop
    being timed: the same hand loop varied from 100 to 3000 faults per step
    between rounds. Fixed thresholds give every loop the steady state of a
    long training run (the freed memory kept and reused), which is also what
    jemalloc or tcmalloc give. --allocator default keeps glibc's behaviour.
    """
    if not sys.platform.startswith("linux"):
        return "the platform's default (not Linux)"
    try:
        libc = ctypes.CDLL("libc.so.6")
        pinned = (
            libc.mallopt(_M_MMAP_THRESHOLD, PINNED_MMAP_THRESHOLD) == 1
            and libc.mallopt(_M_TRIM_THRESHOLD, PINNED_TRIM_THRESHOLD) == 1
        )
    except (OSError, AttributeError):  # not glibc (musl has no libc.so.6, or no mallopt)
        pinned = False
    if not pinned:
        return "the platform's default (glibc's mallopt unavailable)"
    return (
        f"glibc malloc pinned (mmap threshold {PINNED_MMAP_THRESHOLD >> 20} MiB, trim threshold "
        f"{PINNED_TRIM_THRESHOLD >> 20} MiB) for every loop"
    )


# -- models and data ---------------------------------------------------------


def tiny_mlp(features: int = 32, hidden: int = 64) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)
    )


def small_cnn(side: int = 28, channels: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * (side // 4) ** 2, CLASSES),
    )


def workloads(settings: Settings) -> list[Workload]:
    if settings.quick:
        # Tiny sizes so the smoke test runs in seconds; the numbers mean little.
        return [
            Workload(name="mlp", build_model=lambda: tiny_mlp(8, 16), example_shape=(8,), steps=settings.steps),
            Workload(
                name="cnn", build_model=lambda: small_cnn(8, 4), example_shape=(1, 8, 8), steps=settings.cnn_steps
            ),
        ]
    return [
        Workload(name="mlp", build_model=tiny_mlp, example_shape=(32,), steps=settings.steps),
        Workload(name="cnn", build_model=small_cnn, example_shape=(1, 28, 28), steps=settings.cnn_steps),
    ]


def make_batches(workload: Workload, settings: Settings, pool_size: int = 8) -> list[Batch]:
    """`steps` batches cycling through a small pool of synthetic ones, all built before timing starts."""
    generator = torch.Generator().manual_seed(settings.seed + 1)
    pool = []
    for _ in range(pool_size):
        features = torch.randn((settings.batch_size, *workload.example_shape), generator=generator)
        labels = torch.randint(0, CLASSES, (settings.batch_size,), generator=generator)
        pool.append(({"x": features}, labels))
    return [pool[index % pool_size] for index in range(workload.steps)]


def make_optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=LEARNING_RATE)


# -- the three loops ---------------------------------------------------------


def run_hand(workload: Workload, batches: Sequence[Batch], seed: int) -> RoundResult:
    """The loop a user would write: the same work per step as the framework, nothing else."""
    torch.manual_seed(seed)
    model = workload.build_model()
    optimizer = make_optimizer(model.parameters())
    model.train()
    stamps = []
    loss = None
    for features, labels in batches:
        loss = F.cross_entropy(model(features["x"]), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stamps.append(stamp())
    _check_finite(workload, loss)
    return RoundResult(stamps=stamps, model=model)


def _check_finite(workload: Workload, loss: torch.Tensor | None) -> None:
    """One read after the loop: no per-step sync in the anchor (the framework's NaN guard is its own cost)."""
    if loss is not None and not math.isfinite(loss.item()):
        raise FloatingPointError(f"{workload.name}: the hand loop's final loss is not finite.")


_hand_logger = logging.getLogger("loop_overhead.hand")


def run_hand_with_chores(
    workload: Workload, batches: Sequence[Batch], seed: int, root: str, every: int = CHORE_EVERY
) -> RoundResult:
    """The hand loop with the chores the Estimator's defaults do, at the same steps: a checkpoint of model and
    optimizer (torch.save, then fsync), summaries of the loss and learning rate, a log line with the loss."""
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(seed)
    model = workload.build_model()
    optimizer = make_optimizer(model.parameters())
    model.train()
    os.makedirs(root)
    writer = SummaryWriter(log_dir=root)
    stamps = []
    loss = None
    for step, (features, labels) in enumerate(batches, start=1):
        loss = F.cross_entropy(model(features["x"]), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stamps.append(stamp())
        if step % every == 0:
            value = loss.item()
            writer.add_scalar("loss", value, step)
            writer.add_scalar("learning_rate", optimizer.param_groups[0]["lr"], step)
            _hand_logger.info("loss = %s, step = %d", value, step)
            _save_and_sync(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                os.path.join(root, f"checkpoint-{step}.pt"),
            )
    if len(batches) % every:  # the Estimator writes a final checkpoint too
        _save_and_sync(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(root, "final.pt")
        )
    writer.close()
    _check_finite(workload, loss)
    return RoundResult(stamps=stamps, model=model)


def _save_and_sync(state: dict[str, Any], path: str) -> None:
    with open(path, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())


def _batch_arrays(batches: Sequence[Batch]) -> tuple[Any, Any]:
    """The batches as two numpy arrays (features, labels), rows in batch order, for the input_fn comparison."""
    features = torch.cat([features["x"] for features, _ in batches]).numpy()
    labels = torch.cat([labels for _, labels in batches]).numpy()
    return features, labels


def run_hand_from_arrays(workload: Workload, batches: Sequence[Batch], seed: int) -> RoundResult:
    """The hand loop reading numpy arrays the way a user would: consecutive slices through torch.from_numpy."""
    features, labels = _batch_arrays(batches)
    size = len(batches[0][1])
    sliced = (
        ({"x": torch.from_numpy(features[start : start + size])}, torch.from_numpy(labels[start : start + size]))
        for start in range(0, len(labels), size)
    )
    return run_hand(workload, _Sliced(sliced, len(batches)), seed)


class _Sliced:
    """A generator of batches with a length (run_hand iterates it once)."""

    def __init__(self, batches: Iterator[Batch], length: int) -> None:
        self.batches, self.length = batches, length

    def __iter__(self) -> Iterator[Batch]:
        return self.batches

    def __len__(self) -> int:
        return self.length


class _StepStamps(te.Hook):
    """Records the time after every step; the differences are the step times."""

    def __init__(self) -> None:
        self.stamps: list[tuple[float, float, int]] = []

    def after_step(self, run_context: te.RunContext) -> None:
        self.stamps.append(stamp())


def _classifier_model_fn(model, features, labels, mode):
    return te.EstimatorSpec(mode, loss=F.cross_entropy(model(features["x"]), labels))


CHORES_OFF = dict(
    save_checkpoints_steps=None, save_checkpoints_secs=None, save_summary_steps=None, log_step_count_steps=None
)


def default_chores(every: int) -> dict[str, Any]:
    """RunConfig's defaults but for the intervals, which both loops share (keep_checkpoint_max stays 5)."""
    return dict(save_checkpoints_steps=every, save_summary_steps=every, log_step_count_steps=every)


def _estimator(
    workload: Workload, seed: int, model_dir: str, chores: dict[str, Any] = CHORES_OFF
) -> tuple[te.Estimator, list[nn.Module]]:
    """An Estimator training the workload's model with the benchmark's model_fn and optimizer, and the list its
    model factory appends each model it builds to (the trained one is the first)."""
    built: list[nn.Module] = []

    def build() -> nn.Module:
        built.append(workload.build_model())
        return built[-1]

    config = te.RunConfig(random_seed=seed, progress_bar=False, device="cpu", **chores)
    return te.Estimator(
        model_fn=_classifier_model_fn, model=build, optimizer=make_optimizer, model_dir=model_dir, config=config
    ), built


def run_estimator(
    workload: Workload,
    batches: Sequence[Batch],
    seed: int,
    model_dir: str,
    *,
    chores: dict[str, Any] = CHORES_OFF,
    from_arrays: bool = False,
) -> RoundResult:
    """Estimator.train on the same batches (or, ``from_arrays``, on te.numpy_input_fn over the same rows); the
    framework seeds and builds the model itself."""
    estimator, built = _estimator(workload, seed, model_dir, chores)
    stamps = _StepStamps()
    if from_arrays:
        features, labels = _batch_arrays(batches)
        input_fn = te.numpy_input_fn(
            {"x": features}, labels, batch_size=len(batches[0][1]), num_epochs=1, shuffle=False
        )
    else:

        def input_fn() -> Iterator[Batch]:
            return iter(batches)

    estimator.train(input_fn, hooks=[stamps], max_steps=len(batches))
    return RoundResult(stamps=stamps.stamps, model=built[0])


def _import_lightning() -> Any:
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return __import__(name, fromlist=["Trainer"])
        except ImportError:
            continue
    return None


class _Batches:
    """The pre-built batches as one iterable: Lightning reads a bare list as a list of loaders."""

    def __init__(self, batches: Sequence[Batch]) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def run_lightning(
    lightning: Any, workload: Workload, batches: Sequence[Batch], seed: int, root_dir: str
) -> RoundResult:
    """Lightning's Trainer on the same model and batches, with its logging and checkpoints off."""

    class Module(lightning.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: Batch, batch_index: int) -> torch.Tensor:
            features, labels = batch
            return F.cross_entropy(self.net(features["x"]), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return make_optimizer(self.parameters())

    class Stamps(lightning.Callback):
        def __init__(self) -> None:
            self.stamps: list[tuple[float, float, int]] = []

        def on_train_batch_end(self, *args: Any) -> None:
            self.stamps.append(stamp())

    torch.manual_seed(seed)
    net = workload.build_model()
    stamps = Stamps()
    trainer = lightning.Trainer(
        max_steps=len(batches),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        num_sanity_val_steps=0,
        callbacks=[stamps],
        default_root_dir=root_dir,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # advice about DataLoader workers, irrelevant to in-memory lists
        trainer.fit(Module(net), train_dataloaders=_Batches(batches))
    return RoundResult(stamps=stamps.stamps, model=net)


# -- measuring ---------------------------------------------------------------

CLOCKS = ("wall", "cpu")  # the order of stamp()'s values


@dataclasses.dataclass
class Measurement:
    """Each kept round's step time (the median of its steps, or their mean where rare chores must count), per
    loop and clock, its minor page faults per step, and whether each loop ended with the reference loop's weights
    in every round."""

    round_medians: dict[str, dict[str, list[float]]]
    identical: dict[str, bool]
    faults: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def median_ms(self, loop: str, clock: str) -> float:
        """Median over kept rounds of each round's median step time, in milliseconds."""
        return statistics.median(self.round_medians[loop][clock]) * 1e3

    def median_faults(self, loop: str) -> float:
        """Median over kept rounds of the minor page faults per step."""
        return statistics.median(self.faults[loop])

    def ratio(self, loop: str, reference: str, clock: str) -> float:
        """Median over rounds of loop / reference within the same round.

        Pairing runs that were seconds apart cancels the slow swings in
        speed that other programs on the machine cause; the median drops the
        rounds that a burst of load hit on one side only.
        """
        pairs = zip(self.round_medians[loop][clock], self.round_medians[reference][clock])
        return statistics.median(value / reference_value for value, reference_value in pairs)


def step_times(stamps: Sequence[tuple[float, ...]], skip: int) -> dict[str, list[float]]:
    """Seconds per step on each clock from consecutive stamps, leaving out the first `skip` steps."""
    kept = stamps[skip:]
    return {
        clock: [later[index] - earlier[index] for earlier, later in itertools.pairwise(kept)]
        for index, clock in enumerate(CLOCKS)
    }


def faults_per_step(stamps: Sequence[tuple[float, float, int]], skip: int) -> float:
    """Minor page faults per step over the steps step_times keeps."""
    kept = stamps[skip:]
    return (kept[-1][2] - kept[0][2]) / max(1, len(kept) - 1)


def same_weights(first: nn.Module, second: nn.Module) -> bool:
    """Bit-identical state_dicts: same keys, and torch.equal on every entry."""
    a, b = first.state_dict(), second.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def round_orders(names: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """The order of the loops in each round, endlessly: a Williams design (balanced for what ran just before).

    A plain rotation (a b c, b c a, c a b) always runs each loop after the
    same other one (here c after b, a after c), so whatever one loop leaves
    behind (heap, caches, garbage) always falls on the same next loop. In a
    Williams design every loop follows every other one equally often per
    cycle: n orders for an even number of loops, 2n for an odd one (for three
    loops, all six permutations).
    """
    count = len(names)
    pattern, low, high = [0], 1, count - 1  # 0, 1, n-1, 2, n-2, ...
    while low <= high:
        pattern.append(low)
        low += 1
        if low <= high:
            pattern.append(high)
            high -= 1
    rows = [[(index + shift) % count for index in pattern] for shift in range(count)]
    if count % 2:
        rows += [row[::-1] for row in rows]
    return itertools.cycle([tuple(names[index] for index in row) for row in rows])


def measure(
    workload: Workload,
    settings: Settings,
    loops: dict[str, Callable[..., RoundResult]],
    reference: str = "hand",
    statistic: Callable[[list[float]], float] = statistics.median,
) -> Measurement:
    """Runs every loop once per round, in the order round_orders gives, and checks each against `reference`'s
    weights; `statistic` makes one round's step times into that round's figure."""
    batches = make_batches(workload, settings)
    names = list(loops)
    measurement = Measurement(
        round_medians={name: {clock: [] for clock in CLOCKS} for name in names},
        identical={name: True for name in names if name != reference},
        faults={name: [] for name in names},
    )
    skip = min(10, workload.steps // 10)  # the first steps of a round run colder
    orders = round_orders(names)
    for round_index in range(settings.rounds):
        results: dict[str, RoundResult] = {}
        for name in next(orders):
            torch.set_num_threads(settings.threads)  # a framework may change it; every loop starts equal
            gc.collect()
            results[name] = loops[name](workload, batches, settings.seed)
            if len(results[name].stamps) != workload.steps:
                raise RuntimeError(
                    f"{workload.name}/{name} ran {len(results[name].stamps)} steps in round {round_index}; "
                    f"expected {workload.steps}."
                )
        for name in measurement.identical:
            measurement.identical[name] &= same_weights(results[reference].model, results[name].model)
        if round_index >= settings.warmup_rounds:
            for name in names:
                for clock, values in step_times(results[name].stamps, skip).items():
                    measurement.round_medians[name][clock].append(statistic(values))
                measurement.faults[name].append(faults_per_step(results[name].stamps, skip))
    return measurement


# -- step by step -----------------------------------------------------------


class _PairedHandSteps(te.Hook):
    """After each Estimator step: times it, then takes one hand-loop step on the batch the Estimator just took
    and times that."""

    def __init__(self, workload: Workload, batches: Sequence[Batch], seed: int, clock: Callable[[], float]) -> None:
        torch.manual_seed(seed)  # as run_hand: the hand model starts with the Estimator's weights
        self.model = workload.build_model()
        self.optimizer = make_optimizer(self.model.parameters())
        self.model.train()
        self.batches, self.clock = iter(batches), clock
        self.estimator_steps: list[float] = []
        self.hand_steps: list[float] = []
        self.hand_finished: float | None = None

    def after_step(self, run_context: te.RunContext) -> None:
        started = self.clock()
        if self.hand_finished is not None:
            self.estimator_steps.append(started - self.hand_finished)
        features, labels = next(self.batches)
        # run_hand's loop body written out, not shared through a function: a call per step would slow the anchor.
        loss = F.cross_entropy(self.model(features["x"]), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        finished = self.clock()
        self.hand_steps.append(finished - started)
        self.hand_finished = finished


def run_model_fn_floor(workload: Workload, batches: Sequence[Batch], seed: int, hooks: Sequence[te.Hook]) -> nn.Module:
    """The least any framework with this API does per step: call the user's model_fn, which builds an
    EstimatorSpec, take its loss, backward, step, zero_grad, then call the after-step hooks. No spec check, no
    NaN guard, no hook context, no step counting or stop agreement: the floor for `mlp_paired`, measured the same
    way, so that what the Estimator adds above it is seen apart from what the API itself costs."""
    torch.manual_seed(seed)  # as the Estimator's random_seed: the same first weights
    model = workload.build_model()
    optimizer = make_optimizer(model.parameters())
    model.train()
    mode = te.ModeKeys.TRAIN
    for features, labels in batches:
        spec = _classifier_model_fn(model, features, labels, mode)
        spec.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for hook in hooks:
            hook.after_step(None)
    return model


PAIRED_DRIVERS = ("estimator", "model_fn_floor")
"""What `measure_paired` pairs with the hand steps: Estimator.train, and the API's floor (run_model_fn_floor)."""


def measure_paired(
    workload: Workload, settings: Settings, root: str, runs: int = 3
) -> tuple[dict[str, list[float]], bool]:
    """Per driver and run, the driver's median step time over the paired hand loop's (the first steps left out),
    the drivers' runs interleaved; and whether every driver ended with the hand loop's weights in every run."""
    clock = time.process_time if settings.clock == "cpu" else time.perf_counter
    batches = make_batches(workload, settings)
    skip = min(20, workload.steps // 10)
    ratios: dict[str, list[float]] = {driver: [] for driver in PAIRED_DRIVERS}
    identical = True
    for run in range(runs):
        for driver in PAIRED_DRIVERS if run % 2 == 0 else PAIRED_DRIVERS[::-1]:
            torch.set_num_threads(settings.threads)
            gc.collect()
            paired = _PairedHandSteps(workload, batches, settings.seed, clock)
            if driver == "estimator":
                trained = _train_estimator_beside(
                    paired, workload, batches, settings.seed, f"{root}/{workload.name}-paired-{run}"
                )
            else:
                trained = run_model_fn_floor(workload, batches, settings.seed, [paired])
            ratios[driver].append(
                statistics.median(paired.estimator_steps[skip:]) / statistics.median(paired.hand_steps[skip + 1 :])
            )
            identical &= same_weights(paired.model, trained)
    return ratios, identical


def _train_estimator_beside(
    paired: _PairedHandSteps, workload: Workload, batches: Sequence[Batch], seed: int, model_dir: str
) -> nn.Module:
    estimator, built = _estimator(workload, seed, model_dir)
    estimator.train(lambda: iter(batches), hooks=[paired], max_steps=len(batches))
    return built[0]


# -- command line ------------------------------------------------------------


def parse_settings(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per round for the MLP (default 200; quick 30)")
    parser.add_argument(
        "--cnn-steps", type=int, default=None, help="steps per round for the CNN (default 20; quick 10)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of each loop, interleaved (default 18; quick 3)"
    )
    parser.add_argument("--warmup-rounds", type=int, default=1, help="first rounds left out of the figures (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every loop (default 1)")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="which clock the ratios use: process CPU time (default; robust on a busy machine; with --threads > 1 it sums all threads) or wall",
    )
    parser.add_argument(
        "--allocator",
        choices=("pinned", "default"),
        default="pinned",
        help="pinned (default): glibc malloc's thresholds fixed for every loop, so no loop pays for the "
        "heap another left (see pin_allocator); default: glibc's moving thresholds",
    )
    parser.add_argument(
        "--paired-steps",
        type=int,
        default=None,
        help="Estimator steps per run of the step-by-step MLP comparison (default 1500; quick 30)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny models and few steps, for the smoke test")
    parser.add_argument("--no-lightning", action="store_true", help="skip PyTorch Lightning even when installed")
    arguments = parser.parse_args(argv)
    quick = arguments.quick
    settings = Settings(
        steps=arguments.steps or (30 if quick else 200),
        cnn_steps=arguments.cnn_steps or (10 if quick else 20),
        rounds=arguments.rounds or (3 if quick else 18),
        warmup_rounds=arguments.warmup_rounds,
        threads=arguments.threads,
        clock=arguments.clock,
        batch_size=arguments.batch_size,
        seed=arguments.seed,
        quick=quick,
        lightning=not arguments.no_lightning,
        allocator=arguments.allocator,
        chore_every=10 if quick else CHORE_EVERY,
        paired_steps=arguments.paired_steps or (30 if quick else 1500),
    )
    if min(settings.steps, settings.cnn_steps) < 3:
        parser.error(f"--steps and --cnn-steps must be at least 3; received {settings.steps} and {settings.cnn_steps}.")
    if settings.threads < 1 or settings.batch_size < 1:
        parser.error(
            f"--threads and --batch-size must be at least 1; received {settings.threads} and {settings.batch_size}."
        )
    if not 0 <= settings.warmup_rounds < settings.rounds:
        parser.error(
            f"--warmup-rounds must be >= 0 and below --rounds ({settings.rounds}); received {settings.warmup_rounds}."
        )
    return settings


def _loops(workload: Workload, root: str, lightning: Any) -> dict[str, Callable[..., RoundResult]]:
    """The loops to interleave; `hand_again` runs the hand loop twice to show the noise floor."""
    counter = iter(range(10**9))
    loops: dict[str, Callable[..., RoundResult]] = {
        "hand": run_hand,
        "hand_again": run_hand,
        "estimator": lambda w, b, s: run_estimator(w, b, s, f"{root}/{w.name}-estimator-{next(counter)}"),
    }
    if workload.name == "mlp" and lightning is not None:
        loops["lightning"] = lambda w, b, s: run_lightning(
            lightning, w, b, s, f"{root}/{w.name}-lightning-{next(counter)}"
        )
    return loops


@dataclasses.dataclass(frozen=True)
class Extra:
    """One of the MLP's further comparisons: its loops and how a round's step times become its figure."""

    name: str
    what: str
    workload: Workload
    loops: dict[str, Callable[..., RoundResult]]
    statistic: Callable[[list[float]], float]


def _extras(mlp: Workload, settings: Settings, root: str) -> list[Extra]:
    """The default-settings comparison (3x the chore interval in steps, so two chores fall inside the timed
    steps) and the input_fn comparison."""
    counter = iter(range(10**9))
    every = settings.chore_every
    chores = default_chores(every)
    defaults = dataclasses.replace(mlp, steps=3 * every)
    return [
        Extra(
            name="mlp_defaults",
            what=f"checkpoint, summaries and log line every {every} steps, mean step time",
            workload=defaults,
            statistic=statistics.fmean,
            loops={
                "hand": lambda w, b, s: run_hand_with_chores(w, b, s, f"{root}/hand-chores-{next(counter)}", every),
                "estimator": lambda w, b, s: run_estimator(
                    w, b, s, f"{root}/estimator-chores-{next(counter)}", chores=chores
                ),
            },
        ),
        Extra(
            name="input_fn_mlp",
            what="te.numpy_input_fn against slices through torch.from_numpy",
            workload=mlp,
            statistic=statistics.median,
            loops={
                "hand": run_hand_from_arrays,
                "estimator": lambda w, b, s: run_estimator(
                    w, b, s, f"{root}/estimator-arrays-{next(counter)}", from_arrays=True
                ),
            },
        ),
    ]


def _faults_line(measurement: Measurement, loops: Sequence[str]) -> str:
    faults = ", ".join(f"{loop} {measurement.median_faults(loop):.0f}" for loop in loops)
    return f"minor page faults per step (median of rounds): {faults}"


def _report_extra(extra: Extra, measurement: Measurement, clock: str) -> float:
    other = "wall" if clock == "cpu" else "cpu"
    ratio = measurement.ratio("estimator", "hand", clock)
    print(
        f"{extra.name}: hand {measurement.median_ms('hand', clock):.3f} ms/step, estimator "
        f"{measurement.median_ms('estimator', clock):.3f} ms/step, ratio {ratio:.3f} ({clock} time; on the {other} "
        f"clock {measurement.median_ms('hand', other):.3f} vs {measurement.median_ms('estimator', other):.3f}, "
        f"ratio {measurement.ratio('estimator', 'hand', other):.3f}; {extra.workload.steps} steps/round; {extra.what})"
    )
    print(f"{extra.name}: {_faults_line(measurement, ('hand', 'estimator'))}")
    print(f"{extra.name}: weights identical: {'yes' if measurement.identical['estimator'] else 'no'}")
    return ratio


def _report(workload: Workload, measurement: Measurement, clock: str) -> dict[str, float]:
    """Prints one workload's lines; returns its ratios on the chosen clock."""
    other = "wall" if clock == "cpu" else "cpu"
    name = workload.name
    ratios = {name: measurement.ratio("estimator", "hand", clock)}
    print(
        f"{name}: hand {measurement.median_ms('hand', clock):.3f} ms/step, estimator "
        f"{measurement.median_ms('estimator', clock):.3f} ms/step, ratio {ratios[name]:.3f} "
        f"({clock} time; on the {other} clock {measurement.median_ms('hand', other):.3f} vs "
        f"{measurement.median_ms('estimator', other):.3f}, ratio {measurement.ratio('estimator', 'hand', other):.3f}; "
        f"{workload.steps} steps/round)"
    )
    print(
        f"{name}: noise floor, the hand loop against itself: ratio {measurement.ratio('hand_again', 'hand', clock):.3f} "
        f"({other} clock {measurement.ratio('hand_again', 'hand', other):.3f})"
    )
    print(f"{name}: {_faults_line(measurement, list(measurement.faults))}")
    print(f"{name}: weights identical: {'yes' if measurement.identical['estimator'] else 'no'}")
    if "lightning" in measurement.round_medians:
        ratios[f"lightning_{name}"] = measurement.ratio("lightning", "hand", clock)
        print(
            f"lightning_{name}: lightning {measurement.median_ms('lightning', clock):.3f} ms/step, hand "
            f"{measurement.median_ms('hand', clock):.3f} ms/step, ratio {ratios[f'lightning_{name}']:.3f} "
            f"({other} clock {measurement.ratio('lightning', 'hand', other):.3f}; weights identical to hand: "
            f"{'yes' if measurement.identical['lightning'] else 'no'})"
        )
    return ratios


def _print_verdict(ratios: dict[str, float], have_lightning: bool) -> None:
    verdicts = [f"{name}<={limit} {'met' if ratios[name] <= limit else 'MISSED'}" for name, limit in TARGETS.items()]
    if have_lightning:
        verdicts.append(f"ahead of lightning {'met' if ratios['mlp'] < ratios['lightning_mlp'] else 'MISSED'}")
    else:
        verdicts.append("ahead of lightning n/a (not installed)")
    print("targets: " + ", ".join(verdicts))


@contextlib.contextmanager
def _quiet_logs(names: Sequence[str]) -> Iterator[None]:
    """Errors only from these loggers while the benchmark runs, then their levels as they were."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    allocator = pin_allocator() if settings.allocator == "pinned" else "glibc's default (moving thresholds)"
    torch.set_num_threads(settings.threads)
    lightning = _import_lightning() if settings.lightning else None
    # The Estimator warns on every train call that checkpoints are off, and Lightning describes
    # the hardware on every fit: both intended here.
    quiet = (
        "torchestimator",
        "loop_overhead.hand",
        "lightning",
        "lightning.pytorch",
        "lightning.fabric",
        "pytorch_lightning",
    )
    with _quiet_logs(quiet):
        return _run(settings, lightning, allocator)


def _run(settings: Settings, lightning: Any, allocator: str) -> int:
    version = getattr(lightning, "__version__", "?") if lightning is not None else "not installed"
    print(
        f"loop_overhead: torch {torch.__version__}, lightning {version}, {settings.threads} thread(s), batch "
        f"{settings.batch_size}, {settings.rounds} interleaved rounds (first {settings.warmup_rounds} dropped as "
        f"warm-up), median step time on the {settings.clock} clock"
    )
    print(f"allocator: {allocator}")
    print(
        "mlp, cnn: checkpoints, summaries, step logging and progress bar disabled; data pre-built in memory; "
        "no per-step .item() in the hand loop"
    )
    ratios: dict[str, float] = {}
    identical = True
    started = stamp()
    with tempfile.TemporaryDirectory(prefix="loop-overhead-") as root:
        mlp, cnn = workloads(settings)
        for workload in (mlp, cnn):
            measurement = measure(workload, settings, _loops(workload, root, lightning))
            ratios |= _report(workload, measurement, settings.clock)
            identical &= measurement.identical["estimator"]
        for extra in _extras(mlp, settings, root):
            measurement = measure(extra.workload, settings, extra.loops, statistic=extra.statistic)
            ratios[extra.name] = _report_extra(extra, measurement, settings.clock)
            identical &= measurement.identical["estimator"]
        paired, paired_identical = measure_paired(dataclasses.replace(mlp, steps=settings.paired_steps), settings, root)
        ratios["mlp_paired"] = statistics.median(paired["estimator"])
        ratios["mlp_paired_floor"] = statistics.median(paired["model_fn_floor"])
        identical &= paired_identical
        print(
            f"mlp_paired: each Estimator step beside a hand step taken right after it, {settings.paired_steps} steps, "
            f"{len(paired['estimator'])} runs: ratio {ratios['mlp_paired']:.3f} "
            f"(runs: {', '.join(f'{r:.3f}' for r in paired['estimator'])}; {settings.clock} clock); "
            f"weights identical: {'yes' if paired_identical else 'no'}"
        )
        print(
            f"mlp_paired_floor: the least a model_fn framework does (model_fn -> EstimatorSpec -> backward, step, "
            f"hooks), measured the same way: ratio {ratios['mlp_paired_floor']:.3f} "
            f"(runs: {', '.join(f'{r:.3f}' for r in paired['model_fn_floor'])}); the Estimator above it: "
            f"{ratios['mlp_paired'] / ratios['mlp_paired_floor']:.3f}"
        )
    finished = stamp()
    _print_verdict(ratios, lightning is not None)
    print(f"weights identical: {'yes' if identical else 'no'}")
    print(f"benchmark time: {finished[0] - started[0]:.1f} s wall, {finished[1] - started[1]:.1f} s CPU")
    lightning_ratio = f"{ratios['lightning_mlp']:.3f}" if "lightning_mlp" in ratios else "n/a"
    print(
        f"loop_overhead mlp={ratios['mlp']:.3f} cnn={ratios['cnn']:.3f} mlp_defaults={ratios['mlp_defaults']:.3f} "
        f"input_fn_mlp={ratios['input_fn_mlp']:.3f} lightning_mlp={lightning_ratio} mlp_paired={ratios['mlp_paired']:.3f} mlp_paired_floor={ratios['mlp_paired_floor']:.3f}"
    )
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
