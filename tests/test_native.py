"""The switch between the compiled cores and the pure-Python paths (torchestimator._native).

The compiled modules themselves are tested against the pure-Python paths in
test_native_records.py and test_native_examples.py; here: that a normal install
has them (so CI proves the package's build compiles them from a fresh clone),
that TORCHESTIMATOR_PURE_PYTHON=1 turns them all off, and that the CLI says
which path is active.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torchestimator import _native

SWITCHED_OFF = os.environ.get(_native.DISABLE_VARIABLE, "") not in ("", "0")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != _native.DISABLE_VARIABLE}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.skipif(SWITCHED_OFF, reason="this run checks the pure-Python fallback")
@pytest.mark.parametrize("name", _native.MODULES)
def test_a_normal_install_has_every_compiled_core(name):
    module = _native.load(name)
    assert module is not None, f"{name} did not build or import: {_native.describe()}"
    assert module.__name__ == f"torchestimator._native.{name}"


def test_the_switch_turns_every_core_off_in_a_new_process():
    result = _run(
        "from torchestimator import _native; print([_native.load(n) for n in _native.MODULES]);"
        "print(_native.describe())",
        **{_native.DISABLE_VARIABLE: "1"},
    )
    assert result.returncode == 0, result.stderr
    loaded, described = result.stdout.splitlines()
    assert loaded == "[None, None]"
    assert described == (
        "records: pure Python (TORCHESTIMATOR_PURE_PYTHON=1), examples: pure Python (TORCHESTIMATOR_PURE_PYTHON=1)"
    )


@pytest.mark.skipif(SWITCHED_OFF, reason="this run checks the pure-Python fallback")
def test_without_the_switch_the_cores_are_compiled_in_a_new_process():
    result = _run("from torchestimator import _native; print(_native.describe())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in (
        "records: compiled (CRC32C by SSE4.2), examples: compiled",
        "records: compiled (CRC32C by table (slicing-by-8)), examples: compiled",
    )


def test_an_unknown_core_is_our_own_mistake():
    with pytest.raises(AssertionError, match="_record"):
        _native.load("_record")


def test_version_names_the_active_path_without_importing_torch():
    code = (
        "import sys; from torchestimator.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as stop:\n    code = stop.code\n"
        "print('torch imported:', 'torch' in sys.modules, 'exit', code)"
    )
    result = _run(code, **{_native.DISABLE_VARIABLE: "1"})
    assert result.returncode == 0, result.stderr
    line, verdict = result.stdout.splitlines()
    assert line.startswith("torchestimator ") and "(torch " in line
    assert line.endswith(
        "records: pure Python (TORCHESTIMATOR_PURE_PYTHON=1), examples: pure Python (TORCHESTIMATOR_PURE_PYTHON=1))"
    )
    assert verdict == "torch imported: False exit 0"
