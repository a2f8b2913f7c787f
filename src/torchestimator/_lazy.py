"""Lazy package attributes (PEP 562): a package's public names, imported on first use.

Why: ``import torchestimator`` used to import every subpackage, and with them
torchmetrics (scipy, matplotlib) and torch.distributed.fsdp, which made
``import torchestimator`` and ``torchestimator --help`` 2.5x slower than
``import torch`` alone. A package lists where each public name lives; the
module behind a name is imported the first time the name is read
(``te.Estimator``, ``from torchestimator import Estimator``), and the value is
then stored on the package so later reads are plain attribute lookups.

What does not belong here: optional third-party dependencies (``_extras.py``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    names_by_module: Mapping[str, Iterable[str]],
    *,
    submodules: Iterable[str] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    ``names_by_module`` maps a module (absolute name) to the names it defines
    that ``package`` re-exports; ``submodules`` are subpackages or modules of
    ``package`` reachable as attributes (``torchestimator.metrics``).
    ``__dir__`` lists both and the package's dunder names (``__version__``).
    """
    origin = {name: module for module, names in names_by_module.items() for name in names}
    submodule_names = frozenset(submodules)
    clashes = submodule_names & origin.keys()
    if clashes:
        raise AssertionError(f"{package}: {sorted(clashes)} are listed both as names and as submodules")

    def __getattr__(name: str) -> Any:
        if name in submodule_names:
            value = importlib.import_module(f"{package}.{name}")
        elif name in origin:
            value = getattr(importlib.import_module(origin[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # later reads skip __getattr__
        return value

    def __dir__() -> list[str]:
        dunders = {name for name in vars(sys.modules[package]) if name.startswith("__")}
        return sorted(origin.keys() | submodule_names | dunders)

    return __getattr__, __dir__
