"""serve's start-up check of its base paths (issue 29.2).

`torchestimator serve` with a base path that does not exist, or with a model_dir instead of its export folder,
logged "no version could be loaded ... yet" and waited for good, so a README `until curl ...` loop spun forever.
Now a missing base path is one line and exit 2 from serve (start(), embedded, still waits for it to appear),
and a model_dir (or its export/ folder) holding no version folder of its own is refused naming the export
folders in it. An existing folder without versions is still waited for, as TF Serving polls an empty base
path, and the start-up log says so.

The version folders here are empty: the check refuses before any version loads, so none needs a model.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from torchestimator.errors import ConfigError
from torchestimator.serving import ServerSettings, start
from torchestimator.serving.config import ModelConfig
from torchestimator.serving.server import _apply_model_configs, build_app

VERSION = "1796137644"


def _serve(cwd, *flags: str) -> subprocess.CompletedProcess:
    """The installed command in a real process; without the check it would serve for good, so it is bounded."""
    command = [sys.executable, "-m", "torchestimator.cli", "serve", "--model_name", "m", "--rest_api_port", "0"]
    return subprocess.run([*command, *flags], capture_output=True, text=True, timeout=90, cwd=cwd)


def _last_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.fixture
def model_dir(tmp_path):
    """A model_dir as training and an exporter leave it: checkpoints, their manifest, export/best/<version>."""
    root = tmp_path / "runs" / "demo"
    (root / "ckpt-10").mkdir(parents=True)
    (root / "checkpoint").write_text("{}")
    (root / "export" / "best" / VERSION).mkdir(parents=True)
    return root


def test_serve_refuses_a_missing_base_path_at_once_and_creates_nothing(tmp_path):
    done = _serve(tmp_path, "--model_base_path", "runs/typo")
    assert done.returncode == 2, done.stderr
    error = _last_line(done)
    assert error.startswith("torchestimator serve: error: model 'm': base path runs/typo does not exist"), error
    assert f"(relative to {tmp_path})" in error and "create the folder" in error
    assert "serving" not in done.stdout  # it never listened
    assert os.listdir(tmp_path) == []


def test_serve_refuses_a_model_dir_naming_its_export_folders(tmp_path, model_dir):
    done = _serve(tmp_path, "--model_base_path", "runs/demo")
    assert done.returncode == 2, done.stderr
    error = _last_line(done)
    assert "base path runs/demo is a model_dir (checkpoints), not an export base" in error
    assert f"Serve one of the export folders in it: runs/demo/export/best (version {VERSION})." in error


def test_a_model_dir_or_its_export_folder_is_refused_by_start_too(model_dir):
    with pytest.raises(ConfigError, match="export folders in it: .*export/best") as refused:
        start("m", model_dir, file_system_poll_wait_seconds=0)
    assert refused.value.field == "model_base_path"
    with pytest.raises(ConfigError, match=r"export is a folder of export bases: .*export/best \(version"):
        start("m", model_dir / "export", file_system_poll_wait_seconds=0)


def test_a_model_dir_without_exports_says_how_to_make_one(tmp_path):
    bare = tmp_path / "bare"
    (bare / "ckpt-5").mkdir(parents=True)
    with pytest.raises(ConfigError, match="It has no export yet: export it") as refused:
        start("m", bare, file_system_poll_wait_seconds=0)
    assert f"--export_dir {bare / 'export' / '<name>'}" in str(refused.value)


def test_a_missing_base_path_in_a_model_config_file_is_refused_before_any_model_loads(tmp_path, model_dir):
    config = tmp_path / "models.config"
    config.write_text(
        "model_config_list {\n"
        f'  config {{ name: "good" base_path: "{model_dir / "export" / "best"}" }}\n'
        f'  config {{ name: "typo" base_path: "{tmp_path / "nowhere"}" }}\n'
        "}\n"
    )
    with pytest.raises(ConfigError, match="model 'typo': base path .*nowhere does not exist"):
        build_app(ServerSettings(model_config_file=str(config)), refuse_missing_base_paths=True)


def test_a_model_dir_added_by_a_config_edit_is_logged_not_served(model_dir, caplog):
    managers: dict = {}
    settings = ServerSettings(model_name="m", model_base_path=str(model_dir / "export" / "best"))
    with caplog.at_level(logging.ERROR, logger="torchestimator.serving"):
        _apply_model_configs(managers, [ModelConfig(name="b", base_path=str(model_dir))], settings)
    assert managers == {}
    assert "b: the new configuration was not applied" in caplog.text and "is a model_dir" in caplog.text


@pytest.mark.parametrize("exists", [True, False])
def test_an_empty_base_path_is_waited_for_and_the_start_up_log_says_why(tmp_path, caplog, exists):
    base = tmp_path / "empty"
    if exists:
        base.mkdir()
    with caplog.at_level(logging.WARNING, logger="torchestimator.serving"), start("m", base) as server:
        assert server.managers["m"].served_versions == []
    why = "holds no integer version folders yet" if exists else "does not exist yet"
    assert f"m: {'' if exists else 'base path '}{base} {why}" in caplog.text
    assert "waiting for a version, looking every 1 s" in caplog.text


def test_without_polling_the_start_up_log_says_nothing_will_be_served(tmp_path, caplog):
    (tmp_path / "empty").mkdir()
    with caplog.at_level(logging.WARNING, logger="torchestimator.serving"):
        with start("m", tmp_path / "empty", file_system_poll_wait_seconds=0):
            pass
    assert "file_system_poll_wait_seconds is 0 (look only at start): it serves nothing" in caplog.text
