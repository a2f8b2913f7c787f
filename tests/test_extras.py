"""Missing optional dependencies (pyproject's extras): one line naming the extra, from the API and the CLI.

In-process cases block a module with ``sys.modules[name] = None`` (what Python does for a module that
is not installed, as far as importing goes) and drop our modules that imported it, so they import
again; monkeypatch puts everything back. The CLI cases run in a fresh interpreter with the same blocker.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest

import torchestimator as te
from torchestimator._extras import EXTRAS, import_extra
from torchestimator.errors import MissingExtraError, TorchEstimatorError

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _block(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Makes every import of `modules` (and of their submodules already loaded) fail as if not installed."""
    for name in [loaded for loaded in sys.modules if loaded.split(".")[0] in modules] + list(modules):
        monkeypatch.setitem(sys.modules, name, None)


def _forget(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Our modules that must import again (they import the blocked module when they load)."""
    for name in modules:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_the_extras_are_those_of_pyproject():
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    installs = {extra: tuple(requirement.split(">")[0].split("=")[0].split("<")[0] for requirement in requirements)
                for extra, requirements in declared.items() if extra not in ("test", "bench")}
    assert installs == EXTRAS


@pytest.mark.parametrize("blocked, call, message", [
    (("aiohttp",), "serving.start",
     "the model server needs aiohttp: pip install 'torchestimator[serving]'"),
    (("prometheus_client",), "serving.start",
     "the model server needs prometheus-client: pip install 'torchestimator[serving]'"),
    (("sklearn",), "demo", "the digits demo needs scikit-learn: pip install 'torchestimator[demo]'"),
    (("matplotlib",), "plot", "plotting needs matplotlib: pip install 'torchestimator[plot]'"),
    (("pandas",), "pandas_input_fn", "pandas_input_fn needs pandas: pip install 'torchestimator[pandas]'"),
], ids=["aiohttp", "prometheus_client", "sklearn", "matplotlib", "pandas"])
def test_the_api_raises_one_line_naming_the_extra(blocked, call, message, monkeypatch, tmp_path):
    _block(monkeypatch, *blocked)
    with pytest.raises(MissingExtraError) as raised:
        if call == "serving.start":  # the public path: the lazy attribute imports server.py again
            import torchestimator.serving as serving

            _forget(monkeypatch, "torchestimator.serving.server", "torchestimator.serving.app",
                    "torchestimator.serving.protocol", "torchestimator.serving.metrics")
            monkeypatch.delattr(serving, "start", raising=False)
            from torchestimator.serving import start  # noqa: F401
        elif call == "demo":
            _forget(monkeypatch, "torchestimator.cli.demo")
            importlib.import_module("torchestimator.cli.demo")
        elif call == "plot":
            from torchestimator.cli.plot import plot_model_dir

            plot_model_dir(str(tmp_path))
        else:
            te.pandas_input_fn(None)
    error = raised.value
    assert str(error) == message
    assert error.extra == message.split("[")[1].split("]")[0] and error.name == error.module
    assert isinstance(error, ImportError) and isinstance(error, TorchEstimatorError)
    assert error.__suppress_context__  # no "During handling of the above exception" chain under it


def test_keras_files_without_h5py_name_the_file_and_the_extra(monkeypatch, tmp_path):
    from torchestimator.interop import keras_h5, open_weights

    path = tmp_path / "weights.h5"
    path.write_bytes(keras_h5.HDF5_SIGNATURE + bytes(64))
    _block(monkeypatch, "h5py")
    monkeypatch.setattr(keras_h5, "h5py", None)  # as loaded without h5py
    with pytest.raises(MissingExtraError, match=r"^reading the Keras file .*weights\.h5 needs h5py: "
                                                r"pip install 'torchestimator\[keras\]'$"):
        open_weights(path)


def test_an_installed_but_broken_extra_says_why_and_to_upgrade(monkeypatch, tmp_path):
    package = tmp_path / "brokenextra"
    package.mkdir()
    (package / "__init__.py").write_text("import a_dependency_that_is_not_there  # noqa\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtraError) as raised:
        import_extra("brokenextra", extra="demo", feature="the digits demo")
    assert str(raised.value) == (
        "the digits demo needs brokenextra, which could not be imported (No module named "
        "'a_dependency_that_is_not_there'): pip install --upgrade 'torchestimator[demo]'")


def test_an_extra_that_pyproject_does_not_declare_is_our_bug():
    with pytest.raises(AssertionError, match="'servng' is not an extra"):
        import_extra("json", extra="servng", feature="x")


def test_import_extra_returns_the_module():
    assert import_extra("numpy", extra="demo", feature="x") is np


# --------------------------------------------------------------------------- the CLI

BLOCKED_CLI = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None
from torchestimator.cli import main
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize("blocked, argv, line", [
    (["aiohttp", "aiohttp.web"], ["serve", "--model_name", "m", "--model_base_path", "{tmp}"],
     "torchestimator serve: error: the model server needs aiohttp: pip install 'torchestimator[serving]'"),
    (["sklearn", "sklearn.datasets"], ["demo", "--model_dir", "{tmp}/digits"],
     "torchestimator demo: error: the digits demo needs scikit-learn: pip install 'torchestimator[demo]'"),
    (["matplotlib"], ["plot", "{tmp}"],
     "torchestimator plot: error: plotting needs matplotlib: pip install 'torchestimator[plot]'"),
], ids=["serve", "demo", "plot"])
def test_the_cli_prints_one_line_and_exits_2(blocked, argv, line, tmp_path):
    argv = [word.replace("{tmp}", str(tmp_path)) for word in argv]
    script = textwrap.dedent(BLOCKED_CLI.format(blocked=blocked, argv=argv))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [line], "")
    assert not (tmp_path / "digits").exists()  # the demo stopped before it wrote anything
