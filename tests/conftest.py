"""Fixtures and pytest hooks for every folder of tests/; what tests import (models, data, tools) is in helpers.py.

Being the rootdir conftest, this file puts tests/ on sys.path (prepend import mode) before any test module
is imported, which is what lets tests/serving, tests/cli and tests/faults say ``from helpers import ...``.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

import pytest
import torch

# The fault tools (tools/faults_*.py) are scripts and the fault tests' toolkits: importable by name,
# as they are when run as scripts, so a forkserver child can find its target and they share faults_common.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))


@pytest.fixture(autouse=True)
def _quiet_torch_threads():
    torch.set_num_threads(1)
    yield


@pytest.fixture
def te_logs(caplog):
    caplog.set_level(logging.INFO, logger="torchestimator")
    return caplog


# The modules whose tests reach the compiled cores (TFRecord framing, Example parsing) whatever their speed:
# the pure-Python pass of the test command (TORCHESTIMATOR_PURE_PYTHON=1 ... -m "not slow or compiled_path")
# runs them all, slow ones included, with every fast test of the rest of the suite.
# Matched by file name, in any folder of tests/ (tests/serving, tests/cli, tests/faults).
_COMPILED_PATH_MODULES = frozenset(
    {
        "test_tfrecord.py",
        "test_tfrecord_dataset.py",
        "test_tfrecord_benchmark_smoke.py",
        "test_dataset_batched_parse.py",
        "test_dataset_shuffle_resume.py",
        "test_records_cli.py",
        "test_native.py",
        "test_native_records.py",
        "test_native_examples.py",
        "test_parsing.py",
        "test_example.py",
        "test_inputs.py",
        "test_tf_interop.py",
        "test_serving_classify_regress.py",
        "test_crafted_tfrecord.py",
        "test_serving_bytes.py",
        # Found by the check below: event files are TFRecords, and these read or write them in the test's process.
        "test_crafted_events.py",
        "test_distributed_estimator.py",
        "test_evaluator_task.py",
        "test_readme.py",
        "test_training_and_evaluate.py",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in _COMPILED_PATH_MODULES:
            item.add_marker(pytest.mark.compiled_path)


# The list above is checked, not trusted: in the compiled pass every call into a compiled core is counted, and a
# slow test outside those modules that makes one fails, naming its module (the pure pass would have skipped it).
# Calls made in a child process are not seen here; the modules that start them are listed above.
_compiled_calls = [0]


def _counted(function):
    @functools.wraps(function)
    def counting(*args, **kwargs):
        _compiled_calls[0] += 1
        return function(*args, **kwargs)

    return counting


def _watch_compiled_cores() -> None:
    from torchestimator import _native
    from torchestimator.data import tfrecord

    for name, functions in (
        ("_records", ("scan", "frame", "crc32c", "masked_crc32c")),
        ("_examples", ("parse_examples",)),
    ):
        module = _native.load(name)
        if module is not None:  # None in the pure pass: nothing to count
            for function in functions:
                setattr(module, function, _counted(getattr(module, function)))
    if tfrecord._frame_record is not tfrecord._frame_record_python:  # bound to the compiled frame at import
        tfrecord._frame_record = _counted(tfrecord._frame_record)


_watch_compiled_cores()


@pytest.fixture(autouse=True)
def _compiled_path_declared(request):
    if "slow" not in request.keywords or "compiled_path" in request.keywords:
        yield  # a fast test runs in both passes; a listed one too
        return
    before = _compiled_calls[0]
    yield
    if _compiled_calls[0] != before:
        pytest.fail(
            f"{request.node.nodeid} is slow and reaches a compiled core ({_compiled_calls[0] - before} calls), "
            f"but {request.node.path.name} is not in tests/conftest.py's _COMPILED_PATH_MODULES: the "
            "pure-Python pass would skip it.",
            pytrace=False,
        )


# ---------------------------------------------------------------------------- object stores (tests/object_stores.py)


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1, for the whole session."""
    from object_stores import moto_s3_server

    with moto_s3_server() as endpoint:
        yield endpoint


def _fresh_bucket(protocol: str, environment: dict[str, str], monkeypatch):
    """A new bucket on the server ``environment`` points every client (and child process) at, as a user's would."""
    from object_stores import forget_filesystems, new_bucket

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    forget_filesystems()
    yield new_bucket(protocol)
    forget_filesystems()


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch):
    """``s3://<fresh bucket>`` on the session's S3 server, reached through the AWS_* variables."""
    from object_stores import s3_environment

    yield from _fresh_bucket("s3", s3_environment(s3_endpoint), monkeypatch)


@pytest.fixture(scope="session")
def gcs_endpoint():
    """gcp-storage-emulator's GCS server on 127.0.0.1, for the whole session."""
    from object_stores import gcs_emulator_server

    with gcs_emulator_server() as endpoint:
        yield endpoint


@pytest.fixture
def gcs_bucket(gcs_endpoint, monkeypatch):
    """``gs://<fresh bucket>`` on the session's GCS emulator, reached through STORAGE_EMULATOR_HOST."""
    from object_stores import gcs_environment

    yield from _fresh_bucket("gs", gcs_environment(gcs_endpoint), monkeypatch)


@pytest.fixture(scope="session")
def azure_connection_string(tmp_path_factory):
    """Azurite's blob server on 127.0.0.1 for the whole session; skips (saying why) where it cannot run."""
    from object_stores import azurite_missing, azurite_server

    reason = azurite_missing()
    if reason is not None:
        pytest.skip(reason)
    with azurite_server(str(tmp_path_factory.mktemp("azurite"))) as connection_string:
        yield connection_string


@pytest.fixture
def az_bucket(azure_connection_string, monkeypatch):
    """``az://<fresh container>`` on Azurite, reached through AZURE_STORAGE_CONNECTION_STRING."""
    from object_stores import azure_environment

    yield from _fresh_bucket("az", azure_environment(azure_connection_string), monkeypatch)


@pytest.fixture(params=["memory", "s3", "gs", "az"])
def store_url(request, tmp_path):
    """A fresh model_dir URL on each kind of store: memory://, the S3 server, the GCS emulator, Azurite."""
    if request.param == "memory":
        import uuid

        yield f"memory://te-{uuid.uuid4().hex[:12]}"
        return
    bucket = request.getfixturevalue({"s3": "s3_bucket", "gs": "gcs_bucket", "az": "az_bucket"}[request.param])
    yield f"{bucket}/run"
