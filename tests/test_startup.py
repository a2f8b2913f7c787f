"""Start-up: `import torchestimator` and `torchestimator --help` load nothing heavy, and the lazy names resolve.

Each check runs in a fresh interpreter: in this one, other tests have imported everything already.
The timings themselves are benchmarks/startup.py's (its smoke test is here too, marked slow).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from benchmark_scripts import assert_arguments_refused, final_line, imported_script

# What made start-up take 2.5x `import torch` (issue 13): none of it is needed to import the package
# or to print the help. torch.export and torch.distributed.* stand for torch's heavy optional parts.
HEAVY = (
    "torchmetrics",
    "scipy",
    "matplotlib",
    "sklearn",
    "aiohttp",
    "prometheus_client",
    "pandas",
    "h5py",
    "PIL",
    "sympy",
    "torch.export",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.run",
    "torch.distributed.checkpoint",
)

LOADED_MODULES = "import json, sys; print(json.dumps(sorted(sys.modules)))"


def _modules_after(code: str) -> set[str]:
    """sys.modules of a fresh interpreter that ran `code` (its own output silenced), as the last stdout line."""
    script = (
        "import contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()):\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + LOADED_MODULES
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.fixture(scope="module")
def loaded_by_torch_itself() -> set[str]:
    """What `import torch` alone loads (torch 2.13 imports torch.export): not ours to avoid."""
    return _modules_after("import torch")


HELP = """
from torchestimator.cli import main
try:
    main(["--help"])
except SystemExit as exit:
    assert exit.code == 0, exit.code
"""


@pytest.mark.parametrize("code", ["import torchestimator", HELP], ids=["import", "help"])
def test_start_up_loads_none_of_the_heavy_modules(code, loaded_by_torch_itself):
    loaded = _modules_after(code)
    heavy = {name for name in loaded if any(name == top or name.startswith(top + ".") for top in HEAVY)}
    assert heavy - loaded_by_torch_itself == set(), "import these where they are used (see torchestimator/_lazy.py)"
    assert "torchestimator" in loaded


LAZY_PACKAGES = [
    "torchestimator",
    "torchestimator.export",
    "torchestimator.distribute",
    "torchestimator.data",
    "torchestimator.hooks",
    "torchestimator.checkpoint",
    "torchestimator.serving",
]

RESOLVE = f"""
import importlib, json
report = {{}}
for name in {LAZY_PACKAGES!r}:
    package = importlib.import_module(name)
    report[name] = {{"unresolved": [item for item in package.__all__ if getattr(package, item, None) is None],
                    "not_in_dir": sorted(set(package.__all__) - set(dir(package)))}}
import torchestimator as te
report["metrics"] = [te.metrics.accuracy.__name__, te.metrics.auc.__name__, te.metrics.MetricAccumulators.__name__]
print(json.dumps(report))
"""


def test_every_lazy_name_resolves_in_a_fresh_interpreter_and_dir_lists_it():
    # A fresh interpreter, reading the names in __all__ order: an import cycle that only shows when a
    # lazy name is read first would fail here, not in a test process that imported everything before.
    done = subprocess.run([sys.executable, "-c", RESOLVE], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report.pop("metrics") == ["accuracy", "auc", "MetricAccumulators"]
    assert report == {name: {"unresolved": [], "not_in_dir": []} for name in LAZY_PACKAGES}


def test_from_imports_and_star_import_of_the_lazy_packages():
    from torchestimator import Estimator, export, metrics
    from torchestimator.distribute import FullyShardedStrategy, MirroredStrategy
    from torchestimator.export import export_saved_model, load

    assert Estimator.__module__ == "torchestimator._core.estimator"
    assert (export.load, metrics.accuracy.__module__) == (load, "torchestimator.metrics")
    assert export_saved_model.__module__ == "torchestimator.export.saved_model"
    assert (FullyShardedStrategy.__module__, MirroredStrategy.__module__) == (
        "torchestimator.distribute.fsdp",
        "torchestimator.distribute.mirrored",
    )
    namespace: dict = {}
    exec("from torchestimator import *", namespace)
    import torchestimator as te

    assert {name for name in namespace if not name.startswith("__")} == set(te.__all__)
    with pytest.raises(AttributeError, match="module 'torchestimator' has no attribute 'Estimatr'"):
        te.Estimatr  # noqa: B018


TRAIN_THEN_EVALUATE = """
import sys
import numpy as np, torch, torch.nn.functional as F
import torchestimator as te

def model_fn(model, features, labels, mode):
    logits = model(features["x"])
    metrics = {"accuracy": te.metrics.accuracy(labels, logits.argmax(-1))}  # built in every mode, as the demo does
    return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)}, loss=F.cross_entropy(logits, labels),
                            eval_metric_ops=metrics)

x = np.eye(4, dtype=np.float32)
y = np.arange(4)
estimator = te.Estimator(model_fn=model_fn, model=lambda: torch.nn.Linear(4, 4), model_dir=sys.argv[1],
                         optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.5),
                         config=te.RunConfig(progress_bar=False, random_seed=0))
estimator.train(te.numpy_input_fn({"x": x}, y, batch_size=4, num_epochs=None, shuffle=False), max_steps=40)
trained = sorted(name for name in sys.modules if name.split(".")[0] == "torchmetrics")
results = estimator.evaluate(te.numpy_input_fn({"x": x}, y, batch_size=4, num_epochs=1, shuffle=False))
print(len(trained), "torchmetrics" in sys.modules, results["accuracy"])
"""


@pytest.mark.slow
def test_training_does_not_import_torchmetrics_and_evaluation_still_computes_metrics(tmp_path):
    # (torch.distributed.fsdp is no test here: torch.optim imports torch._dynamo, which imports it.)
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_THEN_EVALUATE, str(tmp_path / "model")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "True", "1.0"]


# --------------------------------------------------------------------------- benchmarks/startup.py

RATIO = r"\d+\.\d{3}"
FINAL_LINE = re.compile(
    rf"^startup import_vs_torch=({RATIO}) help_vs_torch=({RATIO}) "
    r"serve_available_s=(\d+\.\d{2}|n/a)$"
)


@pytest.fixture(scope="module")
def benchmark():
    with imported_script("startup") as module:
        yield module


@pytest.mark.slow
def test_the_benchmark_prints_its_final_line(benchmark, capsys):
    assert benchmark.main(["--rounds", "1", "--no-serve"]) == 0
    output = capsys.readouterr().out
    import_ratio, help_ratio, serve = final_line(output, FINAL_LINE).groups()
    assert float(import_ratio) > 0 and float(help_ratio) > 0 and serve == "n/a"
    assert re.search(r"^  import torch +\d+\.\d{3}  \(", output, re.M)
    assert re.search(r"^targets: import_vs_torch<=1\.3 (met|MISSED), help_vs_torch<=1\.3 (met|MISSED)$", output, re.M)


@pytest.mark.slow
def test_the_benchmark_times_the_server_until_its_available_line(benchmark, tmp_path):
    base = benchmark.export_tiny_model(str(tmp_path))
    seconds = benchmark.time_server(base, str(tmp_path / "serve.log"), timeout=120)
    assert 0 < seconds < 120


def test_the_benchmark_refuses_bad_arguments(benchmark, capsys):
    assert_arguments_refused(benchmark, ["--rounds", "0"], "--rounds must be at least 1", capsys)
    assert_arguments_refused(benchmark, ["--startup-seconds", "0"], "--startup-seconds must be above 0", capsys)
