"""Benchmark: checkpoint save and restore against torch.save+fsync / torch.load and safetensors, peak memory,
and the cost of one save in a model_dir that keeps many checkpoints.

The state is a model plus its Adam state (weights, exp_avg, exp_avg_sq: three times the weights), built
from 2048x2048 linear layers (512x512 for the small states of the smoke test) to the size asked (100 MB and 500 MB by default), one optimizer step taken.
What each contestant writes and reads:

- ours: ``CheckpointStore.save(step, model.state_dict(), {"optimizer": optimizer.state_dict()}, extra)``,
  which writes the safetensors files, the sha256 and crc32c of every byte (computed behind the write),
  fsyncs each file, renames the folder, fsyncs the folders and replaces the manifest; ``restore(path)``
  maps each file copy-on-write, verifies its crc32c over the whole mapping and gives tensors that are views
  of it (as ``load_file`` and ``torch.load(mmap=True)`` do: nothing is copied until a tensor is written).
- torch: ``torch.save({"model": ..., "optimizer": ...})`` then fsync of the file and its folder;
  ``torch.load(weights_only=True)``, which copies every byte into new memory. The anchor of the ratios.
- torch_mmap (loads only): ``torch.load(weights_only=True, mmap=True)`` of the same file, for reference:
  torch's own mapped load, which checks nothing.
- safetensors: ``safetensors.torch.save_file`` of the same tensors, fsync; ``load_file`` (mapped, checks
  nothing). For reference.

Method: after a dropped warm-up round, each round runs the three saves and then the three loads in an order
that rotates from round to round, so a change in the machine's load touches all of them alike; each file is
deleted once read. Ratios are medians over rounds of ours / torch in the same round, on the wall clock (the
work is I/O: CPU time is printed beside it). Loads read what was just written, from the page cache, for
every contestant alike. The training stall is the time the loop waits for a save: a synchronous save's
wall time, and with ``RunConfig(async_checkpoint=True)`` (``checkpoint/background.py``) the time of the copy
of the state to new CPU memory, the write going on in a thread (measured after the rounds, ``--rounds``
times, with the time until the checkpoint is published).

Peak memory: the resident set size is sampled every millisecond by a thread during one save of the largest
state (after the rounds); the figure is the peak minus the size before the save (the state itself is
already there). tracemalloc's peak of Python allocations during the same save is printed beside it.

model_dir with many checkpoints: a small model (an MLP of ~0.3 MB) with the Estimator's per-replica record
(generator states as it captures them) is saved once, the folder copied to make 10 and 1000 checkpoints,
one save lists them into the manifest (not timed); then each timed save adds one checkpoint with
keep_checkpoint_max set to the count (so retention deletes the oldest each time), interleaved between the
two model_dirs. The ratio is the median time of a save at 1000 over one at 10.

Run:  python benchmarks/checkpoint_io.py [--sizes-mb 100 500] [--rounds N] [--quick] [--dir DIR]
Last line:  checkpoint_io save_vs_torch=<ratio> load_vs_torch=<ratio> peak_mb_500=<MB> save_1000_vs_10=<ratio>
(the time ratios are the worst over the sizes; peak_mb_500 is measured on the largest size run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import safetensors.torch
import torch
from torch import nn

from torchestimator._train_state import TrainState
from torchestimator.checkpoint import CheckpointStore, format as checkpoint_format
from torchestimator.checkpoint.background import BackgroundSaves
from torchestimator.checkpoint.serialization import flatten_state

TARGETS = {"save_vs_torch": 1.1, "load_vs_torch": 1.1, "peak_mb_500": 64.0, "save_1000_vs_10": 1.2}
"""Issue 14: no slower than 1.1x torch with checksums and fsync included; peak under 64 MB above the state;
a save at 1000 checkpoints within 1.2x of one at 10."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    sizes_mb: tuple[int, ...]
    rounds: int
    many_saves: int
    """Timed saves in each of the 10- and ``many_count``-checkpoint model_dirs."""
    many_count: int
    directory: str | None
    threads: int


def stamp() -> tuple[float, float]:
    """(wall clock, this process's CPU time) in seconds."""
    return time.perf_counter(), time.process_time()


def timed(action: Callable[[], Any]) -> tuple[float, float]:
    start = stamp()
    action()
    end = stamp()
    return end[0] - start[0], end[1] - start[1]


# -- the state -----------------------------------------------------------------------------------


def build_state(size_mb: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A model of square layers (2048 wide; 512 below 50 MB) and its Adam state, about ``size_mb`` MB
    together, one step taken."""
    width = 2048 if size_mb >= 50 else 512
    layers = max(1, round(size_mb * 1e6 / (width * width * 4 * 3)))
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    return model, optimizer


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    _, tensors = flatten_state({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())


def replica_extra(step: int) -> dict[str, Any]:
    """What the Estimator puts beside the tensors: one replica's step, input position and generator states."""
    return {"replicas": [TrainState(global_step=step, input_position={"batch": step}).state_dict()]}


def fsync_path(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# -- the contestants -----------------------------------------------------------------------------


class Contestants:
    """Save and load actions of ours, torch and safetensors on one state, in one scratch folder.

    Each save writes a new checkpoint and each load reads it; what is removed between rounds (``clear``) is
    not timed: retention's deletion of an old checkpoint (an unlink of its files, done after the new one is
    published) is left out, as the anchors delete nothing.
    """

    def __init__(self, root: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.root, self.model, self.optimizer = root, model, optimizer
        self.torch_path = os.path.join(root, "state.pt")
        self.safetensors_path = os.path.join(root, "state.safetensors")
        self.model_dir = os.path.join(root, "model_dir")
        self.step = 0
        self.saved: str | None = None

    def clear(self) -> None:
        for path in (self.torch_path, self.safetensors_path):
            if os.path.exists(path):
                os.remove(path)
        shutil.rmtree(self.model_dir, ignore_errors=True)

    def save_ours(self) -> None:
        self.step += 1
        store = CheckpointStore(self.model_dir, keep_checkpoint_max=None)
        self.saved = store.save(
            self.step, self.model.state_dict(), {"optimizer": self.optimizer.state_dict()}, replica_extra(self.step)
        )

    def background_save_ours(self) -> tuple[float, float]:
        """(seconds the loop waits: the copy of the state, seconds until the checkpoint is published)."""
        self.step += 1
        saves = BackgroundSaves(CheckpointStore(self.model_dir, keep_checkpoint_max=None))
        try:
            start = time.perf_counter()
            saves.save(
                self.step, self.model.state_dict(), {"optimizer": self.optimizer.state_dict()}, replica_extra(self.step)
            )
            returned = time.perf_counter()
            saves.wait()
            return returned - start, time.perf_counter() - start
        finally:
            saves.close()

    def load_ours(self) -> None:
        checkpoint = CheckpointStore(self.model_dir).restore(self.saved)  # every checksum verified
        assert checkpoint.step == self.step

    def save_torch(self) -> None:
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, self.torch_path)
        fsync_path(self.torch_path)
        fsync_path(self.root)

    def load_torch(self) -> None:
        torch.load(self.torch_path, weights_only=True)

    def load_torch_mmap(self) -> None:
        torch.load(self.torch_path, weights_only=True, mmap=True)

    def save_safetensors(self) -> None:
        _, tensors = flatten_state({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})
        safetensors.torch.save_file(tensors, self.safetensors_path)
        fsync_path(self.safetensors_path)
        fsync_path(self.root)

    def load_safetensors(self) -> None:
        safetensors.torch.load_file(self.safetensors_path)


NAMES = {"save": ("ours", "torch", "safetensors"), "load": ("ours", "torch", "torch_mmap", "safetensors")}


def run_rounds(contestants: Contestants, rounds: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{"save"|"load": {name: [(wall, cpu) per round]}}, the first round dropped."""
    times: dict[str, dict[str, list[tuple[float, float]]]] = {
        kind: {n: [] for n in names} for kind, names in NAMES.items()
    }
    for index in range(rounds + 1):
        for kind, names in NAMES.items():
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                result = timed(getattr(contestants, f"{kind}_{name}"))
                if index:
                    times[kind][name].append(result)
        contestants.clear()
    return times


def ratio(times: dict[str, list[tuple[float, float]]]) -> tuple[float, float, float]:
    """(median, min, max) over rounds of ours / torch on the wall clock."""
    ratios = [ours[0] / anchor[0] for ours, anchor in zip(times["ours"], times["torch"])]
    return statistics.median(ratios), min(ratios), max(ratios)


def median_of(samples: list[tuple[float, float]], clock: int) -> float:
    return statistics.median(sample[clock] for sample in samples)


# -- peak memory ---------------------------------------------------------------------------------


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_memory(action: Callable[[], Any]) -> tuple[float, float]:
    """(peak RSS above the start, tracemalloc's peak) in MB while ``action`` runs."""
    stop, peak = threading.Event(), [0]

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], resident_bytes())
            stop.wait(0.001)

    baseline = resident_bytes()
    sampler = threading.Thread(target=sample, daemon=True)
    tracemalloc.start()
    sampler.start()
    try:
        action()
    finally:
        stop.set()
        sampler.join(timeout=10)
        _, python_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    peak[0] = max(peak[0], resident_bytes())
    return (peak[0] - baseline) / 1e6, python_peak / 1e6


# -- many checkpoints ----------------------------------------------------------------------------


def copy_checkpoint(source: str, target: str, step: int) -> None:
    """A copy of the checkpoint folder ``source`` as step ``step``: its state.json says that step, sealed
    again (saving 1000 checkpoints one by one would take the old code minutes)."""
    shutil.copytree(source, target)
    state_file = os.path.join(target, checkpoint_format.STATE_FILE)
    with open(state_file, "rb") as stream:
        state = json.loads(stream.read())
    state.pop(checkpoint_format.STATE_CHECKSUM_KEY)
    state["global_step"] = step
    with open(state_file, "wb") as stream:
        stream.write(checkpoint_format.sealed_json(state, checkpoint_format.STATE_CHECKSUM_KEY))


def many_checkpoints(root: str, settings: Settings) -> dict[int, list[tuple[float, float]]]:
    """(wall, cpu) seconds of each timed save in a model_dir holding 10 and ``many_count`` checkpoints,
    interleaved."""
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters())
    stores, counts = {}, (10, settings.many_count)
    for count in counts:
        model_dir = os.path.join(root, f"many-{count}")
        store = CheckpointStore(model_dir, keep_checkpoint_max=count)
        first = store.save(1, model.state_dict(), {"optimizer": optimizer.state_dict()}, replica_extra(1))
        for step in range(2, count):
            copy_checkpoint(first, os.path.join(model_dir, f"ckpt-{step}"), step)
        store.save(count, model.state_dict(), {"optimizer": optimizer.state_dict()}, replica_extra(count))
        assert len(store.all_checkpoints()) == count, store.all_checkpoints()[:3]
        stores[count] = CheckpointStore(model_dir, keep_checkpoint_max=count)  # a fresh store: nothing cached
    times: dict[int, list[tuple[float, float]]] = {count: [] for count in counts}
    for index in range(settings.many_saves + 1):
        for count in counts if index % 2 else counts[::-1]:
            step = count + 1 + index
            result = timed(
                lambda: stores[count].save(
                    step, model.state_dict(), {"optimizer": optimizer.state_dict()}, replica_extra(step)
                )
            )
            if index:
                times[count].append(result)
    return times


# -- main ----------------------------------------------------------------------------------------


def parse_settings(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes-mb", type=int, nargs="+", default=None, help="state sizes (default 100 500; quick 20 100)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per size (default 3; quick 2)")
    parser.add_argument("--many-saves", type=int, default=None, help="timed saves per model_dir (default 15; quick 6)")
    parser.add_argument(
        "--many-count", type=int, default=1000, help="checkpoints in the large model_dir (default 1000)"
    )
    parser.add_argument(
        "--dir", default=None, help="scratch folder (default: a temporary one; it needs 2.5x the largest size)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every contestant (default 1)")
    parser.add_argument("--quick", action="store_true", help="smaller states and fewer rounds, for the smoke test")
    arguments = parser.parse_args(argv)
    quick = arguments.quick
    settings = Settings(
        sizes_mb=tuple(arguments.sizes_mb or ((20, 100) if quick else (100, 500))),
        rounds=_given(arguments.rounds, 2 if quick else 3),
        many_saves=_given(arguments.many_saves, 6 if quick else 15),
        many_count=arguments.many_count,
        directory=arguments.dir,
        threads=arguments.threads,
    )
    if settings.rounds < 1 or settings.many_saves < 1 or min(settings.sizes_mb) < 1 or settings.threads < 1:
        parser.error("--sizes-mb, --rounds, --many-saves and --threads must be at least 1.")
    if settings.many_count < 11:
        parser.error(
            f"--many-count must be above 10 (it is compared with 10 checkpoints); received {settings.many_count}."
        )
    return settings


def _given(value: int | None, default: int) -> int:
    return default if value is None else value  # not `or`: a 0 given is refused, not replaced


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    torch.set_num_threads(settings.threads)
    began = stamp()
    root = tempfile.mkdtemp(prefix="checkpoint_io-", dir=settings.directory)
    print(
        f"checkpoint_io: torch {torch.__version__}, safetensors {safetensors.__version__}, "
        f"{settings.threads} thread(s), {settings.rounds} round(s), scratch {root}"
    )
    try:
        save_ratios, load_ratios, peak = [], [], (0.0, 0.0)
        for size_mb in settings.sizes_mb:
            model, optimizer = build_state(size_mb)
            megabytes = state_bytes(model, optimizer) / 1e6
            folder = os.path.join(root, f"size-{size_mb}")
            os.makedirs(folder)
            contestants = Contestants(folder, model, optimizer)
            times = run_rounds(contestants, settings.rounds)
            for kind in ("save", "load"):
                line = " ".join(
                    f"{name}={median_of(times[kind][name], 0):.3f}s(cpu {median_of(times[kind][name], 1):.3f}s)"
                    for name in NAMES[kind]
                )
                middle, low, high = ratio(times[kind])
                print(f"  {kind} {megabytes:.0f} MB: {line} ours/torch={middle:.2f} [{low:.2f}-{high:.2f}]")
                (save_ratios if kind == "save" else load_ratios).append(middle)
            stalls = []
            for _ in range(settings.rounds):
                stalls.append(contestants.background_save_ours())
                contestants.clear()
            print(
                f"  stall {megabytes:.0f} MB: synchronous save {median_of(times['save']['ours'], 0):.3f}s (the loop "
                f"waits for all of it); async_checkpoint {median_of(stalls, 0):.3f}s [{min(s for s, _ in stalls):.3f}-"
                f"{max(s for s, _ in stalls):.3f}] (the copy of the state), published after {median_of(stalls, 1):.3f}s"
            )
            if size_mb == max(settings.sizes_mb):
                peak = peak_memory(contestants.save_ours)
                contestants.clear()
                print(
                    f"  peak memory of one save of {megabytes:.0f} MB: +{peak[0]:.1f} MB resident above the state, "
                    f"tracemalloc peak {peak[1]:.1f} MB"
                )
            del contestants, model, optimizer
            shutil.rmtree(folder, ignore_errors=True)
        many = many_checkpoints(root, settings)
        at_10, at_many = (median_of(many[count], 0) for count in (10, settings.many_count))
        for count in (10, settings.many_count):
            walls = [wall for wall, _ in many[count]]
            print(
                f"  one save in a model_dir with {count} checkpoints: {median_of(many[count], 0) * 1e3:.1f} ms "
                f"[{min(walls) * 1e3:.1f}-{max(walls) * 1e3:.1f}] (cpu {median_of(many[count], 1) * 1e3:.1f} ms), "
                f"median of {settings.many_saves}"
            )
        cpu_ratio = median_of(many[settings.many_count], 1) / median_of(many[10], 1)
        print(f"  save_{settings.many_count}_vs_10 on the cpu clock: {cpu_ratio:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ended = stamp()
    print(f"  total: {ended[0] - began[0]:.1f}s wall, {ended[1] - began[1]:.1f}s cpu")
    print(
        f"checkpoint_io save_vs_torch={max(save_ratios):.2f} load_vs_torch={max(load_ratios):.2f} "
        f"peak_mb_500={peak[0]:.1f} save_{settings.many_count}_vs_10={at_many / at_10:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
