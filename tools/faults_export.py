"""Export faults, the longer runs: crafted version folders, kill -9 inside export writes, full disks.

    python tools/faults_export.py --trials 20 --seconds 300

It trains a small model once, exports a good version, then:

- crafted: version folders that try to run code when loaded (pickles at every
  place torch.export.load unpickles, and a program.json whose strings torch's
  deserializer would eval or exec); each must be refused by ``load`` with an
  error naming the file, and no marker file may appear. ``--prove`` first checks
  that torch.export.load really runs each archive's payload (in a subprocess).
- kill: a subprocess exports in a loop and is killed with SIGKILL once a temp
  folder appears; afterwards every integer version must load, and the next
  export must leave no temp- folder behind.
- disk full: exports under RLIMIT_FSIZE limits that fail at each file of the
  write, and (as root) on a small tmpfs at several free sizes; each must be an
  OSError naming the path, with no signal death, no temp- folder, and the old
  version still loadable.

It ends with one line:

    faults_export crafted_refused=R/N crafted_inert=I/J markers=M kill_trials=K complete_only=C disk_full_oserror=D/P
        files_hit=F temp_left=T [torch_ran_payloads=P/A with --prove]

(inert: a crafted part that load never uses, e.g. guards_code, which is recomputed; it must load and run nothing)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pickle
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

SCRIPT = Path(__file__).resolve()
MARKER = "marker-{}"
FILES_HIT: set[str] = set()  # which files of the version the disk-full errors named


@dataclasses.dataclass(frozen=True)
class Settings:
    trials: int
    seconds: float
    prove: bool
    seed: int
    workdir: str | None


def parse_settings(arguments: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="kill -9 trials (bounded also by --seconds)")
    parser.add_argument("--seconds", type=float, default=300.0, help="time bound for the kill trials")
    parser.add_argument("--prove", action="store_true", help="check that torch.export.load runs each crafted payload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="keep the files here (default: a temporary folder)")
    parsed = parser.parse_args(arguments)
    if parsed.trials < 0 or parsed.seconds <= 0:
        parser.error("--trials must be >= 0 and --seconds > 0")
    return Settings(
        trials=parsed.trials, seconds=parsed.seconds, prove=parsed.prove, seed=parsed.seed, workdir=parsed.workdir
    )


# ---- the model: deep and narrow, so that its program.json is larger than any checkpoint file ----


def build_estimator(model_dir: str, depth: int = 2):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import torchestimator as te

    def model(params):
        layers: list[nn.Module] = [nn.Linear(8, 8)]
        for _ in range(depth - 1):
            layers += [nn.ReLU(), nn.Linear(8, 8)]
        return nn.Sequential(*layers, nn.Linear(8, 3))

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
        if mode == te.ModeKeys.PREDICT:
            return te.EstimatorSpec(mode, predictions=predictions)
        return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))

    config = te.RunConfig(save_checkpoints_steps=5, log_step_count_steps=None, progress_bar=False, random_seed=0)
    return te.Estimator(
        model_fn=model_fn,
        model=model,
        model_dir=model_dir,
        config=config,
        optimizer=lambda parameters, params: torch.optim.SGD(parameters, lr=0.1),
    )


def input_fn():
    import numpy as np

    import torchestimator as te

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0).astype(np.int64)
    return te.numpy_input_fn({"x": x}, y, batch_size=16, num_epochs=None, shuffle=True, seed=0)


def receiver():
    import torch

    from torchestimator.export import TensorSpec, serving_input_receiver

    return serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})


def train_small(model_dir: str, steps: int = 5, depth: int = 2):
    estimator = build_estimator(model_dir, depth)
    estimator.train(input_fn(), max_steps=steps)
    return estimator


# ---- crafted version folders ----


class _Payload:
    """Unpickling this creates the marker file: what an attacker's code would do, harmlessly."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickled(marker: str) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"inputs": _Payload(marker)}, buffer)
    return buffer.getvalue()


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    folder: str
    refused_because: str
    """Text the load error must contain (besides the folder's path); "" for an inert variant that must load."""
    archive: bool
    """True for a model.pt2 variant that torch.export.load would open."""


def craft_variants(good_dir: str, base: str, marker_dir: str, first_version: int = 100) -> list[Variant]:
    """Version folders under ``base`` that each try to run code when loaded; the good version is not touched."""
    from torchestimator.export import load
    from torchestimator.export.program_format import LEGACY_FILE, PROGRAM_FILE, TENSORS_FILE

    program = load(good_dir)._program
    archive_bytes = _torch_archive(program)
    variants: list[Variant] = []

    def new_folder(name: str, keep: tuple[str, ...] = ("signature.json", "metadata.json")) -> str:
        folder = os.path.join(base, str(first_version + len(variants)))
        os.makedirs(folder)
        for entry in keep:
            shutil.copyfile(os.path.join(good_dir, entry), os.path.join(folder, entry))
        return folder

    def marker(name: str) -> str:
        return os.path.join(marker_dir, MARKER.format(name))

    def archive_variant(name: str, change) -> None:
        folder = new_folder(name)
        entries = _read_zip(archive_bytes)
        change(entries, marker(name))
        _write_zip(os.path.join(folder, LEGACY_FILE), entries)
        variants.append(Variant(name, folder, LEGACY_FILE, archive=True))

    def pickled_sample_inputs(entries, marker_path):
        entries[_entry(entries, "data/sample_inputs/model.pt")] = _pickled(marker_path)

    def pickled_weight(entries, marker_path):
        config_name = _entry(entries, "data/weights/model_weights_config.json")
        config = json.loads(entries[config_name])
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        entries[config_name] = json.dumps(config).encode()
        entries[_entry(entries, f"data/weights/{first['path_name']}")] = _pickled(marker_path)

    def pickled_constant(entries, marker_path):
        config_name = _entry(entries, "data/constants/model_constants_config.json")
        prefix = config_name.rsplit("/", 1)[0]
        entries[config_name] = json.dumps(
            {
                "config": {
                    "lifted_tensor_0": {
                        "path_name": "tensor_0",
                        "is_param": False,
                        "use_pickle": True,
                        "tensor_meta": None,
                    }
                }
            }
        ).encode()
        entries[f"{prefix}/tensor_0"] = _pickled(marker_path)

    def pickled_opaque_object(entries, marker_path):  # constants named opaque_obj_* go through pickle.loads
        config_name = _entry(entries, "data/constants/model_constants_config.json")
        prefix = config_name.rsplit("/", 1)[0]
        entries[config_name] = json.dumps(
            {
                "config": {
                    "obj_0": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
                }
            }
        ).encode()
        entries[f"{prefix}/opaque_obj_0"] = pickle.dumps(_Payload(marker_path))

    def pickled_legacy_weights(entries, marker_path):  # a pre-2.7 weights file elsewhere in the archive
        prefix = _entry(entries, "data/weights/model_weights_config.json").rsplit("/", 1)[0]
        entries[f"{prefix}/model.pt"] = _pickled(marker_path)

    for change in (
        pickled_sample_inputs,
        pickled_weight,
        pickled_constant,
        pickled_opaque_object,
        pickled_legacy_weights,
    ):
        archive_variant(change.__name__, change)

    good_document = Path(good_dir, PROGRAM_FILE).read_text()

    def document_variant(name: str, change, because: str) -> None:
        folder = new_folder(name, keep=("signature.json", "metadata.json", TENSORS_FILE))
        document = json.loads(good_document)
        change(document, marker(name))
        Path(folder, PROGRAM_FILE).write_text(json.dumps(document))
        variants.append(Variant(name, folder, because, archive=False))

    def code(marker_path: str) -> str:
        return f"__import__('builtins').open({marker_path!r}, 'w')"

    def exec_in_guards(document, marker_path):  # torch's ExportedProgram.module() exec's guards_code
        document["guards_code"] = [f"{code(marker_path)} is None or True"]

    def eval_in_expression(document, marker_path):  # sympy.sympify evals the symbolic sizes of tensors
        values = document["graph_module"]["graph"]["tensor_values"]
        size = next(size for value in values.values() for size in value["sizes"] if "as_expr" in size)
        size["as_expr"]["expr_str"] = code(marker_path)

    def code_in_placeholder_name(document, marker_path):  # FX writes placeholder names into generated source
        spec = next(spec for spec in document["graph_module"]["signature"]["input_specs"] if "user_input" in spec)
        spec["user_input"]["arg"]["as_tensor"]["name"] = f"x={code(marker_path)}"

    def call_outside_aten(document, marker_path):  # call targets resolve as any attribute path under torch
        node = document["graph_module"]["graph"]["nodes"][0]
        node["target"] = "torch.os.system"

    document_variant("eval_in_expression", eval_in_expression, "is the expression")
    document_variant("code_in_placeholder_name", code_in_placeholder_name, "not an identifier")
    document_variant("call_outside_aten", call_outside_aten, "not an ATen or prims operator")
    document_variant("exec_in_guards", exec_in_guards, "")  # inert: loads, the file's guards are never used

    folder = new_folder("pickled_tensors", keep=("signature.json", "metadata.json", PROGRAM_FILE))
    Path(folder, TENSORS_FILE).write_bytes(_pickled(marker("pickled_tensors")))
    variants.append(Variant("pickled_tensors", folder, TENSORS_FILE, archive=False))
    _add_resource_variants(variants, new_folder, document_variant)
    return variants


def _add_resource_variants(variants: list[Variant], new_folder, document_variant) -> None:
    """Folders that would hang, block or fail obscurely rather than run code: each must be a clear refusal."""
    from torchestimator.checkpoint.format import bytes_to_tensors, tensors_to_bytes
    from torchestimator.export.program_format import PROGRAM_FILE, TENSORS_FILE

    def power_in_expression(document, _):  # sympify would compute 9**999999999 (minutes, hundreds of MB)
        values = document["graph_module"]["graph"]["tensor_values"]
        size = next(size for value in values.values() for size in value["sizes"] if "as_expr" in size)
        size["as_expr"]["expr_str"] = "9**999999999"

    document_variant("power_in_expression", power_in_expression, "exponents must be numbers")
    everything = ("signature.json", "metadata.json", PROGRAM_FILE, TENSORS_FILE)

    def folder_variant(name: str, change, because: str, keep=everything) -> None:
        folder = new_folder(name, keep=keep)
        change(Path(folder))
        variants.append(Variant(name, folder, because, archive=False))

    def mismatched_tensors(folder: Path) -> None:  # the tensors of another export: a weight of another shape
        tensors = bytes_to_tensors((folder / TENSORS_FILE).read_bytes(), "good")
        name = next(key for key in tensors if key.endswith("weight"))
        tensors[name] = tensors[name].reshape(-1)
        (folder / TENSORS_FILE).write_bytes(tensors_to_bytes(tensors, "crafted"))

    folder_variant(
        "deep_json",
        lambda folder: (folder / PROGRAM_FILE).write_text('{"graph_module": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        "nests its values too deeply",
    )
    folder_variant(
        "fifo_program",
        lambda folder: os.mkfifo(folder / PROGRAM_FILE),
        "is not a regular file",
        keep=("signature.json", "metadata.json", TENSORS_FILE),
    )  # opening it would wait for a writer
    folder_variant("mismatched_tensors", mismatched_tensors, "the program declares")
    folder_variant(
        "malformed_signature",
        lambda folder: (folder / "signature.json").write_text("[]"),
        "signature.json must hold a JSON object",
    )


def _torch_archive(program) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


def _read_zip(data: bytes) -> dict[str, bytes]:
    import io

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _write_zip(path: str, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def _entry(entries: dict[str, bytes], suffix: str) -> str:
    return next(name for name in entries if name.endswith(suffix))


def check_crafted(variants: list[Variant], marker_dir: str) -> tuple[int, int, int, list[str]]:
    """(refused as expected, inert ones loaded, markers created, problems): load each variant in this process."""
    from torchestimator.export import load

    refused = inert = 0
    problems = []
    for variant in variants:
        try:
            load(variant.folder)
        except ValueError as error:
            message = str(error)
            if variant.refused_because and variant.refused_because in message and variant.folder in message:
                refused += 1
            else:
                problems.append(f"{variant.name}: unexpected error {message[:300]}")
        else:
            if variant.refused_because:
                problems.append(f"{variant.name}: loaded")
            else:
                inert += 1  # its only payload is in a part of the file that is never used
    markers = len(os.listdir(marker_dir))
    if markers:
        problems.append(f"markers created: {sorted(os.listdir(marker_dir))}")
    return refused, inert, markers, problems


def prove_torch_runs_payloads(variants: list[Variant], marker_dir: str) -> int:
    """How many archive variants run their payload under torch.export.load, in a throwaway subprocess."""
    folders = [variant.folder for variant in variants if variant.archive]
    script = (
        "import sys, torch\n"
        "for folder in sys.argv[1:]:\n"
        "    try:\n"
        "        torch.export.load(folder + '/model.pt2')\n"
        "    except Exception:\n"
        "        pass\n"
    )
    subprocess.run([sys.executable, "-c", script, *folders], capture_output=True, timeout=300, check=False)
    created = sorted(os.listdir(marker_dir))
    for name in created:
        os.remove(os.path.join(marker_dir, name))
    return len(created)


# ---- workers (subprocesses of this script) ----


def _worker(arguments: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["export-loop", "disk-full", "train-export"])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--limits", default="")
    parser.add_argument("--fill", default="")
    parser.add_argument("--no_precheck", action="store_true")
    parser.add_argument("--depth", type=int, default=2)
    parsed = parser.parse_args(arguments)
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past RLIMIT_FSIZE a write fails with EFBIG instead
    if parsed.mode == "train-export":
        return _train_with_exporter(parsed)
    from torchestimator.export import export_saved_model, saved_model

    estimator = build_estimator(parsed.model_dir, parsed.depth)
    if parsed.no_precheck:
        saved_model._check_free_space = lambda *arguments: None
    if parsed.mode == "export-loop":
        print("ready", flush=True)
        while True:
            print("exported", export_saved_model(estimator, parsed.base, receiver()), flush=True)
    limits = [int(value) for value in parsed.limits.split(",") if value]
    fills = [int(value) for value in parsed.fill.split(",") if value]
    for limit, fill in [(limit, None) for limit in limits] + [(None, fill) for fill in fills]:
        with _file_size_limit(limit), _filler(parsed.base, fill):
            try:
                export_saved_model(estimator, parsed.base, receiver())
                outcome = {"limit": limit, "free": fill, "error": None}
            except OSError as error:
                outcome = {"limit": limit, "free": fill, "error": str(error), "type": type(error).__name__}
        print(json.dumps(outcome), flush=True)


def _train_with_exporter(parsed) -> None:
    import torchestimator as te
    from torchestimator.export import LatestExporter

    estimator = build_estimator(parsed.model_dir, parsed.depth)
    exporter = LatestExporter("latest", receiver())
    limits = [int(value) for value in parsed.limits.split(",") if value]
    with _file_size_limit(limits[0] if limits else None):
        try:
            te.train_and_evaluate(
                estimator,
                te.TrainSpec(input_fn(), max_steps=10),
                te.EvalSpec(input_fn(), steps=2, exporters=[exporter], every_n_steps=5),
            )
            print(json.dumps({"error": None}), flush=True)
        except OSError as error:
            print(json.dumps({"error": str(error), "type": type(error).__name__}), flush=True)


@contextlib.contextmanager
def _file_size_limit(limit: int | None) -> Iterator[None]:
    if limit is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@contextlib.contextmanager
def _filler(base: str, free: int | None) -> Iterator[None]:
    """Fills the filesystem of ``base`` until about ``free`` bytes are left."""
    if free is None:
        yield
        return
    path = os.path.join(os.path.dirname(base), "filler")
    stats = os.statvfs(base)
    size = max(0, stats.f_bavail * stats.f_frsize - free)
    try:
        with open(path, "wb") as handle:
            handle.write(b"\0" * size)
        yield
    finally:
        os.remove(path)


def run_worker(mode: str, *arguments: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--worker", mode, *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# ---- the fault loops ----


def kill_trials(model_dir: str, base: str, trials: int, seconds: float, rng: random.Random) -> tuple[int, int]:
    """(trials run, trials after which every integer version loaded)."""
    from torchestimator.export import list_versions, load

    deadline = time.monotonic() + seconds
    done = complete = 0
    while done < trials and time.monotonic() < deadline:
        worker = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--worker", "export-loop", "--model_dir", model_dir, "--base", base],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            worker.stdout.readline()  # "ready": the model is built
            exports_first = rng.randrange(2)  # sometimes kill in the first export, sometimes in a later one
            for _ in range(exports_first):
                worker.stdout.readline()
            _wait_for_temp_folder(base, worker, time.monotonic() + 60)
            time.sleep(rng.uniform(0, 0.02))  # a random point inside the write
        finally:
            worker.kill()
            worker.wait(timeout=60)
        done += 1
        try:
            for version in list_versions(base):
                load(os.path.join(base, str(version)))
            complete += 1
        except ValueError as error:
            print(f"trial {done}: an incomplete version is visible: {error}", file=sys.stderr)
    return done, complete


def _wait_for_temp_folder(base: str, worker: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline and worker.poll() is None:
        if os.path.isdir(base) and any(entry.startswith("temp-") for entry in os.listdir(base)):
            return
        time.sleep(0.001)


def file_limits(good_dir: str) -> list[int]:
    """RLIMIT_FSIZE limits that make the write fail at each of the version's files in turn (and at the first byte)."""
    sizes = sorted(
        os.path.getsize(os.path.join(good_dir, name))
        for name in os.listdir(good_dir)
        if os.path.isfile(os.path.join(good_dir, name))
    )
    return sorted({0, *[size - 1 for size in sizes if size > 0]})


def check_disk_full(result: subprocess.CompletedProcess[str], base: str, good_dir: str) -> tuple[int, int, list[str]]:
    """(OSErrors naming the base, points, problems) from a disk-full worker's output."""
    from torchestimator.export import load

    problems = []
    if result.returncode != 0:
        problems.append(f"the worker died with return code {result.returncode}: {result.stderr[-2000:]}")
    outcomes = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    ok = sum(1 for outcome in outcomes if outcome["error"] and base in outcome["error"])
    FILES_HIT.update(
        name
        for outcome in outcomes
        for name in ("signature.json", "tensors.safetensors", "program.json", "metadata.json")
        if name in (outcome["error"] or "")
    )
    problems += [
        f"not an OSError naming {base}: {outcome}"
        for outcome in outcomes
        if not (outcome["error"] and base in outcome["error"])
    ]
    leftovers = [entry for entry in os.listdir(base) if entry.startswith("temp-")]
    if leftovers:
        problems.append(f"temp folders left: {leftovers}")
    try:
        load(good_dir)
    except ValueError as error:
        problems.append(f"the old version no longer loads: {error}")
    return ok, len(outcomes), problems


@contextlib.contextmanager
def small_tmpfs(path: str, size: str) -> Iterator[bool]:
    """A tmpfs mounted at ``path`` (True), or False when this process may not mount one (not root)."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        yield False
        return
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, check=False
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", path], capture_output=True, check=False)


def main(arguments: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if arguments is None else arguments
    if arguments[:1] == ["--worker"]:
        _worker(arguments[1:])
        return 0
    settings = parse_settings(arguments)
    rng = random.Random(settings.seed)
    with contextlib.ExitStack() as stack:
        root = settings.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="faults_export-"))
        model_dir, base = os.path.join(root, "model"), os.path.join(root, "export")
        estimator = train_small(model_dir)
        from torchestimator.export import export_saved_model

        good_dir = export_saved_model(estimator, base, receiver())
        marker_dir = os.path.join(root, "markers")
        os.makedirs(marker_dir)
        variants = craft_variants(good_dir, os.path.join(root, "crafted"), marker_dir)
        archives = sum(variant.archive for variant in variants)
        proven = prove_torch_runs_payloads(variants, marker_dir) if settings.prove else 0
        refused, inert, markers, problems = check_crafted(variants, marker_dir)
        inert_total = sum(not variant.refused_because for variant in variants)
        all_problems = list(problems)

        trials, complete = kill_trials(model_dir, base, settings.trials, settings.seconds, rng)
        export_saved_model(estimator, base, receiver())  # the next export cleans what the kills left
        temp_left = sum(entry.startswith("temp-") for entry in os.listdir(base))

        full_ok = full_points = 0
        limited = os.path.join(root, "limited")
        limited_good = export_saved_model(estimator, limited, receiver())
        result = run_worker(
            "disk-full",
            "--model_dir",
            model_dir,
            "--base",
            limited,
            "--limits",
            ",".join(map(str, file_limits(limited_good))),
        )
        ok, points, problems = check_disk_full(result, limited, limited_good)
        full_ok, full_points = full_ok + ok, full_points + points
        all_problems += problems
        with small_tmpfs(os.path.join(root, "tmpfs"), "1m") as mounted:
            if mounted:
                small = os.path.join(root, "tmpfs", "export")
                small_good = export_saved_model(estimator, small, receiver())
                needed = sum(os.path.getsize(os.path.join(small_good, name)) for name in os.listdir(small_good))
                fills = ",".join(str(free) for free in (needed // 4, needed))
                for precheck in ([], ["--no_precheck"]):
                    result = run_worker(
                        "disk-full", "--model_dir", model_dir, "--base", small, "--fill", fills, *precheck
                    )
                    ok, points, problems = check_disk_full(result, small, small_good)
                    full_ok, full_points = full_ok + ok, full_points + points
                    all_problems += problems
        for problem in all_problems:
            print(problem, file=sys.stderr)
    print(
        f"faults_export crafted_refused={refused}/{len(variants) - inert_total} crafted_inert={inert}/{inert_total} "
        f"markers={markers} kill_trials={trials} "
        f"complete_only={complete} disk_full_oserror={full_ok}/{full_points} files_hit={len(FILES_HIT)} "
        f"temp_left={temp_left}" + (f" torch_ran_payloads={proven}/{archives}" if settings.prove else "")
    )
    return 1 if all_problems else 0


if __name__ == "__main__":
    sys.exit(main())
