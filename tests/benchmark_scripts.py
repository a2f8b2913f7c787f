"""Loading a benchmark script as a module and reading its final line: shared by the benchmark smoke tests."""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextlib.contextmanager
def imported_script(name: str) -> Iterator[ModuleType]:
    """benchmarks/<name>.py as a module, registered while in use (dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def final_line(output: str, pattern: re.Pattern[str]) -> re.Match[str]:
    last = output.strip().splitlines()[-1]
    match = pattern.match(last)
    assert match, f"unexpected last line: {last!r}"
    return match


def assert_arguments_refused(module: ModuleType, arguments: list[str], message: str, capsys) -> None:
    """The script's parse_settings exits 2 for these arguments, saying ``message`` on stderr."""
    import pytest

    with pytest.raises(SystemExit) as raised:
        module.parse_settings(arguments)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err
