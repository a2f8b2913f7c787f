"""Missing optional dependencies (pyproject's extras): one line naming the extra, from the API and the CLI.

In-process cases block a module with ``sys.modules[name] = None`` (what Python does for a module that
is not installed, as far as importing goes) and drop our modules that imported it, so they import
again; monkeypatch puts everything back. The CLI cases run in a fresh interpreter with the same blocker.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tomllib

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
    installs = {
        extra: tuple(requirement.split(">")[0].split("=")[0].split("<")[0] for requirement in requirements)
        for extra, requirements in declared.items()
        if extra not in ("test", "bench")
    }
    assert installs == EXTRAS


@pytest.mark.parametrize(
    "blocked, call, message",
    [
        (("aiohttp",), "serving.start", "the model server needs aiohttp: pip install 'torchestimator[serving]'"),
        (
            ("prometheus_client",),
            "serving.start",
            "the model server needs prometheus-client: pip install 'torchestimator[serving]'",
        ),
        (("sklearn",), "demo", "the digits demo needs scikit-learn: pip install 'torchestimator[demo]'"),
        (("matplotlib",), "plot", "plotting needs matplotlib: pip install 'torchestimator[plot]'"),
        (("pandas",), "pandas_input_fn", "pandas_input_fn needs pandas: pip install 'torchestimator[pandas]'"),
    ],
    ids=["aiohttp", "prometheus_client", "sklearn", "matplotlib", "pandas"],
)
def test_the_api_raises_one_line_naming_the_extra(blocked, call, message, monkeypatch, tmp_path):
    _block(monkeypatch, *blocked)
    with pytest.raises(MissingExtraError) as raised:
        if call == "serving.start":  # the public path: the lazy attribute imports server.py again
            import torchestimator.serving as serving

            _forget(
                monkeypatch,
                "torchestimator.serving.server",
                "torchestimator.serving.app",
                "torchestimator.serving.protocol",
                "torchestimator.serving.metrics",
            )
            if "start" in vars(serving):  # stored by an earlier read: read it through the lazy __getattr__ again
                monkeypatch.delattr(serving, "start")
            from torchestimator.serving import start  # importable: a stand-in that raises when called

            start("digits", str(tmp_path))
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


# A fresh interpreter: the serving modules this process imported with aiohttp must not answer.
SERVING_WITHOUT = """
import contextlib, inspect, io, json, pydoc, sys
for name in {blocked!r}:
    sys.modules[name] = None
import torchestimator.serving as serving
namespace = {{}}
exec("from torchestimator.serving import *", namespace)
report = {{"star": sorted(name for name in namespace if not name.startswith("__")),
          "hasattr": {{name: hasattr(serving, name) for name in ("serve", "start", "ServerSettings")}},
          "members": len(inspect.getmembers(serving)), "help": "serve" in pydoc.render_doc(serving),
          "defaults": [serving.DEFAULT_MAX_BODY_BYTES, serving.DEFAULT_METRICS_PATH],
          "settings": serving.ServerSettings(model_name="m", model_base_path="/b").max_body_bytes,
          "called": {{}}}}
for name in ("serve", "start", "build_app", "make_app", "RunningServer", "ServingMetrics"):
    try:
        getattr(serving, name)("m", "/nowhere")
    except Exception as error:
        report["called"][name] = [type(error).__name__, str(error), getattr(error, "extra", None)]
print(json.dumps(report))
"""


@pytest.mark.parametrize(
    "blocked, needing_it",
    [
        (["aiohttp"], ["RunningServer", "build_app", "make_app", "serve", "start"]),
        (["prometheus_client"], ["RunningServer", "ServingMetrics", "build_app", "make_app", "serve", "start"]),
    ],
    ids=["aiohttp", "prometheus_client"],
)
def test_the_serving_package_without_the_extra_lists_everything_and_raises_only_when_called(blocked, needing_it):
    script = SERVING_WITHOUT.format(blocked=blocked)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["star"] == sorted(te.serving.__all__)  # from torchestimator.serving import * works
    assert report["hasattr"] == {"serve": True, "start": True, "ServerSettings": True}
    assert report["members"] > len(te.serving.__all__) and report["help"]  # getmembers and help() do not raise
    assert report["defaults"] == [64 * 1024 * 1024, "/monitoring/prometheus/metrics"]
    assert report["settings"] == 64 * 1024 * 1024  # ServerSettings builds (and checks) without the extra
    missing = {"aiohttp": "aiohttp", "prometheus_client": "prometheus-client"}[blocked[0]]
    line = f"the model server needs {missing}: pip install 'torchestimator[serving]'"
    called = {name: outcome for name, outcome in report["called"].items() if outcome[0] == "MissingExtraError"}
    assert called == {name: ["MissingExtraError", line, "serving"] for name in needing_it}


def test_the_serving_defaults_have_one_value():
    """settings.py holds them without the extra; metrics.py keeps its own name for the metrics path."""
    from torchestimator.serving import app, metrics, server, settings

    assert metrics.DEFAULT_METRICS_PATH == settings.DEFAULT_METRICS_PATH == app.DEFAULT_METRICS_PATH
    assert app.DEFAULT_MAX_BODY_BYTES is settings.DEFAULT_MAX_BODY_BYTES
    assert server.ServerSettings is settings.ServerSettings is te.serving.ServerSettings


PILLOW_LINE = (
    "decoding images (--image_mode raw) needs Pillow: pip install 'torchestimator[images]'; "
    "or pass --image_mode encoded to store the file bytes as they are"
)


def test_raw_images_without_pillow_raise_missing_extra_even_with_pil_image_loaded(monkeypatch, tmp_path):
    pytest.importorskip("PIL.Image")  # loaded: blocking only the package must still be seen (as `import` sees it)
    from torchestimator.cli.records import decode_image

    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(MissingExtraError) as raised:
        decode_image(str(tmp_path / "a.png"), "row 1")
    assert (str(raised.value), raised.value.extra, raised.value.module) == (PILLOW_LINE, "images", "PIL.Image")


def test_a_broken_pillow_is_reported_as_broken_not_as_missing(monkeypatch, tmp_path):
    fake = tmp_path / "PIL"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "Image.py").write_text("from PIL import _imaging  # noqa  (the compiled part, missing)\n")
    _forget(monkeypatch, *[name for name in sys.modules if name.split(".")[0] == "PIL"])
    monkeypatch.syspath_prepend(str(tmp_path))
    from torchestimator.cli.records import decode_image

    with pytest.raises(MissingExtraError) as raised:
        decode_image(str(tmp_path / "a.png"), "row 1")
    assert str(raised.value) == (
        "decoding images (--image_mode raw) needs Pillow, which could not be imported (cannot import name "
        "'_imaging' from 'PIL' (" + str(fake / "__init__.py") + ")): pip install --upgrade 'torchestimator[images]'; "
        "or pass --image_mode encoded to store the file bytes as they are"
    )


def test_keras_files_without_h5py_name_the_file_and_the_extra(monkeypatch, tmp_path):
    from torchestimator.interop import keras_h5, open_weights

    path = tmp_path / "weights.h5"
    path.write_bytes(keras_h5.HDF5_SIGNATURE + bytes(64))
    _block(monkeypatch, "h5py")
    monkeypatch.setattr(keras_h5, "h5py", None)  # as loaded without h5py
    with pytest.raises(
        MissingExtraError,
        match=r"^reading the Keras file .*weights\.h5 needs h5py: "
        r"pip install 'torchestimator\[keras\]'$",
    ):
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
        "'a_dependency_that_is_not_there'): pip install --upgrade 'torchestimator[demo]'"
    )


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


@pytest.mark.parametrize(
    "blocked, argv, line",
    [
        (
            ["aiohttp", "aiohttp.web"],
            ["serve", "--model_name", "m", "--model_base_path", "{tmp}"],
            "torchestimator serve: error: the model server needs aiohttp: pip install 'torchestimator[serving]'",
        ),
        (
            ["sklearn", "sklearn.datasets"],
            ["demo", "--model_dir", "{tmp}/digits"],
            "torchestimator demo: error: the digits demo needs scikit-learn: pip install 'torchestimator[demo]'",
        ),
        (
            ["matplotlib"],
            ["plot", "{tmp}"],
            "torchestimator plot: error: plotting needs matplotlib: pip install 'torchestimator[plot]'",
        ),
        (
            ["PIL"],
            ["convert", "csv-to-tfrecord", "{tmp}/index.csv", "{tmp}/digits/train", "--image_mode", "raw"],
            f"torchestimator convert: error: {PILLOW_LINE}",
        ),
    ],
    ids=["serve", "demo", "plot", "pillow"],
)
def test_the_cli_prints_one_line_and_exits_2(blocked, argv, line, tmp_path):
    argv = [word.replace("{tmp}", str(tmp_path)) for word in argv]
    script = textwrap.dedent(BLOCKED_CLI.format(blocked=blocked, argv=argv))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [line], "")
    assert not (tmp_path / "digits").exists()  # the demo stopped before it wrote anything
