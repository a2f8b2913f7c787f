"""Lazy package attributes (PEP 562): a package's public names, imported on first use.

Why: ``import torchestimator`` used to import every subpackage, and with them
torchmetrics (scipy, matplotlib) and torch.distributed.fsdp, which made
``import torchestimator`` and ``torchestimator --help`` 2.5x slower than
``import torch`` alone. A package lists where each public name lives; the
module behind a name is imported the first time the name is read
(``te.Estimator``, ``from torchestimator import Estimator``), and the value is
then stored on the package so later reads are plain attribute lookups.

Two more rules, so the lazy package behaves as the eager one did:

- any submodule is an attribute (``te.data.tfrecord``, ``te.serving.client``), imported when first read,
  as it was when the eager ``__init__`` had imported it; ``dir()`` still lists only the public names;
- a name whose module needs a missing optional dependency (its import raises MissingExtraError) is still
  there: a stand-in that raises that MissingExtraError when called. So ``from torchestimator.serving
  import *``, ``hasattr``, ``inspect.getmembers`` and ``help()`` work without the extra, and using the
  feature says which extra installs it. The stand-in is not stored on the package: the next read tries
  the import again.

What does not belong here: optional third-party dependencies (``_extras.py``).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torchestimator.errors import MissingExtraError

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
        if name in submodule_names or (name not in origin and _has_submodule(package, name)):
            value = importlib.import_module(f"{package}.{name}")
        elif name in origin:
            try:
                module = importlib.import_module(origin[name])
            except MissingExtraError as missing:
                return _needs_extra(package, name, missing)
            value = getattr(module, name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # later reads skip __getattr__
        return value

    def __dir__() -> list[str]:
        dunders = {name for name in vars(sys.modules[package]) if name.startswith("__")}
        return sorted(origin.keys() | submodule_names | dunders)

    return __getattr__, __dir__


def _has_submodule(package: str, name: str) -> bool:
    """Whether ``package.name`` is a module or subpackage that could be imported (found, not imported).

    Dunder names are never submodules: tools probe them on every module (``__wrapped__``, ``__path__``),
    and each probe would otherwise search the package's folder.
    """
    if name.startswith("__") or not hasattr(sys.modules[package], "__path__"):
        return False
    return importlib.util.find_spec(f"{package}.{name}") is not None


def _needs_extra(package: str, name: str, missing: MissingExtraError) -> Callable[..., Any]:
    """A stand-in for ``package.name``, whose module could not be imported: calling it raises ``missing``."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise copy.copy(missing) from None  # a fresh error per call; the message says all (see _extras.py)

    stand_in.__name__ = stand_in.__qualname__ = name
    stand_in.__module__ = package
    stand_in.__doc__ = f"Not available here: {missing}"
    return stand_in
