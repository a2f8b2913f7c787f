"""Benchmark: Keras model files converted by te.interop.keras_model, against Keras itself.

The models are the test fixtures (tests/fixtures/keras_models/, made by Keras 3.15 on TensorFlow 2.21): five small
models (an MLP, a CNN with "same" padding at stride 2, two inputs and two outputs, an Embedding + BiLSTM + GRU
text model, nested models, a masked Sequential text model) and eleven keras.applications (MobileNetV2,
MobileNetV3Small, ResNet50, EfficientNetB0, EfficientNetV2B0, DenseNet121, InceptionV3, InceptionResNetV2,
Xception, NASNetMobile, ConvNeXtTiny: random weights rebuilt from their skeletons, small inputs), each in
``.keras`` and, where Keras itself can load it back, legacy ``.h5``. For each file:

- converted: whether ``keras_model`` builds it;
- the largest absolute difference between the converted module's outputs and Keras's own (recorded with the
  fixtures, ``model(x, training=False)``), float32;
- forward speed (where Keras 3 imports, as in the comparison environment of benchmarks/requirements-bench.txt):
  Keras 3 on its torch backend (``KERAS_BACKEND=torch``) loads the same ``.keras`` file and runs
  ``model(x, training=False)``; the converted module runs ``module(x)`` under ``torch.inference_mode()``; the
  ratio is Keras's median time over ours, on the same inputs, in the same process and threads. The figure is the
  geometric mean of the ratios over the ``.keras`` files.

Run:  KERAS_BACKEND=torch python benchmarks/keras_models.py [--repeats N] [--only REGEX]
Last line:  keras_models converted=C/A max_abs_err=E forward_vs_keras_torch=R   (R: n/a without Keras)
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "keras_models"
sys.path.insert(0, str(ROOT / "tools"))  # keras_skeleton


def _median_seconds(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cases(folder: Path, only: re.Pattern[str]) -> list[tuple[str, Path, list[np.ndarray], list[np.ndarray]]]:
    """(label, file, inputs, Keras's outputs) for every fixture model whose label ``only`` finds, applications
    rebuilt into ``folder``."""
    import keras_skeleton

    cases = []
    for reference in sorted(FIXTURES.glob("*.npz")):
        if reference.stem in ("layers", "applications", "bn_training"):
            continue
        saved = np.load(reference)
        inputs = [saved[key] for key in sorted(saved) if key.startswith("input_")]
        outputs = [saved[key] for key in sorted(saved) if key.startswith("output_")]
        for suffix in ("keras", "h5"):  # Keras 2's models (keras2_*) are .h5 only
            if not (FIXTURES / f"{reference.stem}.{suffix}").exists() or not only.search(f"{reference.stem}.{suffix}"):
                continue
            cases.append((f"{reference.stem}.{suffix}", FIXTURES / f"{reference.stem}.{suffix}", inputs, outputs))
    applications = np.load(FIXTURES / "applications.npz")
    for skeleton in sorted((FIXTURES / "applications").glob("*.keras")):
        name = skeleton.stem
        # Each application in .keras and legacy .h5 (skeleton <name>.h5.gz, other weights: Keras's own outputs).
        for suffix, file, key in (
            ("keras", skeleton.name, f"{name}/output_0"),
            ("h5", f"{name}.h5.gz", f"{name}.h5/output_0"),
        ):
            if not (skeleton.parent / file).exists():  # a legacy .h5 Keras cannot load back (MobileNetV3, ...)
                continue
            if not only.search(f"{name}.{suffix}"):
                continue
            full = folder / f"{name}.{suffix}"
            keras_skeleton.rebuild(skeleton.parent / file, full, seed=31)
            cases.append((f"{name}.{suffix}", full, [applications[f"{name}/input_0"]], [applications[key]]))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed forward passes per model and framework")
    parser.add_argument("--only", default="", help="a regular expression: the files whose label it finds (all)")
    args = parser.parse_args(argv)

    from torchestimator.interop import KerasModelError, keras_model

    try:
        import keras
    except ImportError:
        keras = None
    converted, worst, ratios = 0, 0.0, []
    with tempfile.TemporaryDirectory() as folder:
        cases = _cases(Path(folder), re.compile(args.only))
        for label, path, inputs, expected in cases:
            try:
                module = keras_model(path).eval()
            except KerasModelError as error:
                print(f"{label}: not converted: {error}")
                continue
            converted += 1
            tensors = [torch.from_numpy(value) for value in inputs]
            with torch.inference_mode():
                outputs = module(*tensors)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            error = max(float(np.abs(out.numpy() - want).max()) for out, want in zip(outputs, expected))
            worst = max(worst, error)
            line = f"{label}: max_abs_err={error:.2e}"
            if keras is not None and str(path).endswith(".keras"):
                reference = keras.models.load_model(path)
                arguments = inputs if len(inputs) > 1 else inputs[0]

                def ours() -> object:
                    with torch.inference_mode():
                        return module(*tensors)

                ours_s = _median_seconds(ours, args.repeats)
                keras_s = _median_seconds(lambda: reference(arguments, training=False), args.repeats)
                ratios.append(keras_s / ours_s)
                line += f" ours_ms={ours_s * 1e3:.2f} keras_torch_ms={keras_s * 1e3:.2f} ratio={keras_s / ours_s:.2f}"
            print(line, flush=True)
    speed = f"{math.exp(statistics.mean(math.log(r) for r in ratios)):.2f}" if ratios else "n/a"
    print(f"conditions: torch {torch.__version__}, {torch.get_num_threads()} threads, keras "
          f"{keras.__version__ + ' (' + keras.backend.backend() + ' backend)' if keras is not None else 'not installed'}")  # fmt: skip
    print(f"keras_models converted={converted}/{len(cases)} max_abs_err={worst:.1e} forward_vs_keras_torch={speed}")
    return 0 if converted == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
