"""The compiled cores (C extensions) and the one switch that turns them off.

What belongs here: finding the extension modules built by the package's own
build (`setup.py`: `_records` frames and checks TFRecord blocks, `_examples`
parses batches of tf.train.Example), and saying which path is active. What does
not: the logic around them. Each caller keeps a pure-Python path that gives the
same results and the same errors; the compiled one is only faster. Errors are
always raised from Python: a compiled function reports *where* something is
wrong (a status and an offset or record index), the Python caller words it.

The switch: ``TORCHESTIMATOR_PURE_PYTHON=1`` in the environment makes
:func:`load` return None for every module, so the whole package runs on its
pure-Python paths (CI runs the test suite both ways). It is read once per
process, at the first :func:`load`, so set it before the process starts.
An extension that failed to build (no compiler on the machine: the build only
warns, see setup.py) or fails to import also gives None, and
:func:`describe` says why.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

__all__ = ["DISABLE_VARIABLE", "MODULES", "describe", "load"]

logger = logging.getLogger(__name__)

DISABLE_VARIABLE = "TORCHESTIMATOR_PURE_PYTHON"
"""Set to 1 (or true/yes/on) to run on the pure-Python paths only."""

MODULES = ("_records", "_examples")
"""The extension modules setup.py builds, as named under torchestimator._native."""

_loaded: dict[str, ModuleType | None] = {}
_why_not: dict[str, str] = {}


def _disabled() -> bool:
    return os.environ.get(DISABLE_VARIABLE, "").strip().lower() in {"1", "true", "yes", "on"}


def load(name: str) -> ModuleType | None:
    """The compiled module ``torchestimator._native.<name>``, or None (switched off, not built, broken)."""
    if name not in MODULES:  # our own call sites: a typo would silently run the slow path forever
        raise AssertionError(f"torchestimator._native.load({name!r}): not one of {MODULES}")
    if name in _loaded:
        return _loaded[name]
    module: ModuleType | None = None
    if _disabled():
        _why_not[name] = f"{DISABLE_VARIABLE}=1"
    else:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ImportError as error:  # not built (no compiler at install time) or built for another Python
            if isinstance(error, ModuleNotFoundError) and error.name == f"{__name__}.{name}":
                _why_not[name] = "not built: the install found no working C compiler"
            else:
                _why_not[name] = " ".join(str(error).split()) or type(error).__name__
            logger.debug("torchestimator: compiled %s not available (%s); using pure Python", name, _why_not[name])
    _loaded[name] = module
    return module


def describe() -> str:
    """One line: which path each core runs, e.g. ``records: compiled (CRC32C by SSE4.2), examples: compiled``."""
    parts = []
    for name in MODULES:
        module = load(name)
        label = name.lstrip("_")
        if module is None:
            parts.append(f"{label}: pure Python ({_why_not[name]})")
        else:  # the CRC32C method is chosen at module load by what the CPU offers
            method = getattr(module, "CRC32C_METHOD", None)
            parts.append(f"{label}: compiled" + (f" (CRC32C by {method})" if method else ""))
    return ", ".join(parts)
