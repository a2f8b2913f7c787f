"""Lazy package attributes (PEP 562): a package's public names, imported on first use.

Why: ``import torchestimator`` used to import every subpackage, and with them
torchmetrics (scipy, matplotlib) and torch.distributed.fsdp, which made
``import torchestimator`` and ``torchestimator --help`` 2.5x slower than
``import torch`` alone. A package lists where each public name lives; the
module behind a name is imported the first time the name is read
(``te.Estimator``, ``from torchestimator import Estimator``), and the value is
then stored on the package so later reads are plain attribute lookups.

Where the list is: the package's ``if TYPE_CHECKING:`` block, and nowhere else.
Type checkers and IDEs read that block (so ``te.Estimator`` has its real type);
``lazy_exports`` reads the same block from the package's source (it never runs)
and derives ``__all__``, the name-to-module table and ``__dir__``. A public name
is thus written in its own module's ``__all__`` and in its package's block;
tests/test_public_surface.py pins the result, so that an API change is made on
purpose. The block holds only ``from MODULE import NAME as NAME`` lines (the
``as`` spelling marks a re-export for type checkers); ``from PACKAGE import SUB
as SUB`` declares a public submodule.

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

import ast
import copy
import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from torchestimator.errors import MissingExtraError

__all__ = ["Exports", "declared_exports", "lazy_exports"]


class Exports(NamedTuple):
    """What a package's ``TYPE_CHECKING`` block declares."""

    origins: dict[str, tuple[str, str]]  # public name -> (module, the name in that module)
    submodules: list[str]  # public subpackages and modules, reachable as attributes


def declared_exports(package: str, source_path: str) -> Exports:
    """The exports declared by the ``if TYPE_CHECKING:`` block of ``package``'s ``__init__`` at ``source_path``.

    Anything but ``from X import Y as Y`` lines in the block is refused: the block is the package's
    table of public names, and a line this reader skipped would be a name type checkers see and the
    running package lacks.
    """
    with open(source_path, encoding="utf-8") as file:
        tree = ast.parse(file.read(), source_path)
    blocks = [node for node in tree.body if isinstance(node, ast.If) and _is_type_checking(node.test)]
    if len(blocks) != 1:
        raise AssertionError(
            f"{source_path}: expected one `if TYPE_CHECKING:` block of public names, found {len(blocks)}"
        )
    origins: dict[str, tuple[str, str]] = {}
    submodules: list[str] = []
    for statement in blocks[0].body:
        if not isinstance(statement, ast.ImportFrom) or statement.level or statement.module is None:
            raise AssertionError(
                f"{source_path}:{statement.lineno}: the TYPE_CHECKING block holds only absolute "
                "`from MODULE import NAME as NAME` lines"
            )
        for alias in statement.names:
            public = alias.asname or alias.name
            if public in origins or public in submodules:
                raise AssertionError(f"{source_path}:{statement.lineno}: {public!r} is declared twice")
            if statement.module == package:
                submodules.append(public)
            else:
                origins[public] = (statement.module, alias.name)
    return Exports(origins, submodules)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def lazy_exports(package: str) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__all__``, ``__getattr__`` and ``__dir__`` of ``package``, from its ``TYPE_CHECKING`` block.

    ``__all__`` lists the public names and the public submodules; ``__dir__`` lists both and the
    package's dunder names (``__version__``).
    """
    source_path = sys.modules[package].__file__
    assert source_path is not None, f"{package} has no source file to read its exports from"
    origins, submodules = declared_exports(package, source_path)
    submodule_names = frozenset(submodules)

    def __getattr__(name: str) -> Any:
        if name in submodule_names or (name not in origins and _has_submodule(package, name)):
            value = importlib.import_module(f"{package}.{name}")
        elif name in origins:
            module_name, name_there = origins[name]
            try:
                module = importlib.import_module(module_name)
            except MissingExtraError as missing:
                return _needs_extra(package, name, missing)
            value = getattr(module, name_there)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # later reads skip __getattr__
        return value

    def __dir__() -> list[str]:
        dunders = {name for name in vars(sys.modules[package]) if name.startswith("__")}
        return sorted(origins.keys() | submodule_names | dunders)

    return sorted(origins.keys() | submodule_names), __getattr__, __dir__


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
