"""The package's layers import one way: a module imports only from its own layer or the layers below it.

Layers, lowest first (the first part of a module's name under torchestimator/). A higher layer builds on the lower
ones; a lower one never reaches up, at module level or inside a function. An import inside a function is kept only
for start-up cost (torch.export, an optional extra), never to hide a cycle, and is checked the same way. Imports
under ``if TYPE_CHECKING:`` are for the type checker only and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "torchestimator"

LAYERS: list[set[str]] = [
    # Leaves: no import of the package's other parts (_tf_names: the table of TF's names, read by those it aliases).
    {"errors", "_extras", "_lazy", "_native", "_shapeless", "_train_state", "_tf_names"},
    {"_io"},  # files, URLs, atomic writes, the console
    {"distribute"},  # strategies, clusters, the launcher
    # Input formats, streaming metrics, the hook protocol; event files (read as TFRecords); TF Serving's protobufs.
    {"data", "metrics", "_torchmetrics", "hooks", "_io.summary", "serving.protos", "serving.tensor_proto"},
    {"checkpoint"},  # the checkpoint store and a run's saves
    {"interop"},  # weight files of every format, ours included
    {"warm_start"},
    {"_core"},  # the engine: specs, the loop, evaluation and inference bundles, weights, the run's agreement
    {"_policy"},  # train_and_evaluate, the evaluator task, best checkpoint, early stopping, improvement rules
    {"export"},  # exports of an InferenceBundle; exporters compare as the best policy does
    # The Estimator facade: its export_saved_model hands over to export; te.estimator, tf.estimator's layout of it.
    {"_core.estimator", "_core.module_estimator", "estimator"},
    {"serving"},  # the model server
    {"cli", "testing", "__main__"},  # entry points
]
LAYER_OF = {part: index for index, parts in enumerate(LAYERS) for part in parts}


def _part(module: str) -> str | None:
    """The layer part of a module name: the longest of LAYERS' names it is or lies in (``torchestimator._core.loop``
    -> ``_core``, ``torchestimator.serving.protos`` -> ``serving.protos``); None outside the package."""
    names = module.split(".")
    if names[0] != "torchestimator" or len(names) < 2:
        return None
    for length in range(len(names) - 1, 0, -1):
        candidate = ".".join(names[1 : 1 + length])
        if candidate in LAYER_OF:
            return candidate
    return names[1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every import in ``path`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(), str(path))
    for_types = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in for_types:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            if target == "torchestimator":  # from torchestimator import _native: the names are modules
                found += [(node.lineno, f"torchestimator.{alias.name}") for alias in node.names]
    return found


def _sources() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE or path.name != "__init__.py")


def test_every_part_of_the_package_has_a_layer():
    parts = {_part(_module_name(path)) for path in _sources()}
    assert parts - set(LAYER_OF) == set(), "put the new part of the package in LAYERS (tests/test_layers.py)"


def _upward_imports(path: Path) -> list[str]:
    own = _part(_module_name(path))
    assert own in LAYER_OF, f"{path} lies in no layer"
    return [
        f"{path.relative_to(PACKAGE)}:{line} imports {target} (layer {LAYER_OF[part]}, above {own}'s {LAYER_OF[own]})"
        for line, target in _imports(path)
        if (part := _part(target)) is not None and part in LAYER_OF and LAYER_OF[part] > LAYER_OF[own]
    ]


@pytest.mark.parametrize("path", _sources(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_layer_and_those_below(path):
    upward = _upward_imports(path)
    assert upward == [], "\n".join(upward)


def test_the_check_sees_an_upward_import_at_module_level_or_in_a_function(tmp_path, monkeypatch):
    package = tmp_path / "torchestimator"
    (package / "hooks").mkdir(parents=True)
    leaf = package / "hooks" / "base.py"
    leaf.write_text(
        "from typing import TYPE_CHECKING\n"
        "from torchestimator._io import filesystems\n"  # below: fine
        "from ..checkpoint.store import CheckpointStore\n"  # above, relative
        "if TYPE_CHECKING:\n"
        "    from torchestimator._core.loop import TrainingRun\n"  # for the type checker only: fine
        "def f():\n"
        "    import torchestimator.serving.app\n"  # above, inside a function
    )
    monkeypatch.setattr(f"{__name__}.PACKAGE", package)
    assert _upward_imports(leaf) == [
        "hooks/base.py:3 imports torchestimator.checkpoint.store (layer 4, above hooks's 3)",
        "hooks/base.py:7 imports torchestimator.serving.app (layer 11, above hooks's 3)",
    ]
