"""Export faults: crafted version folders run nothing, full disks are OSErrors, kills leave complete versions only.

The crafting, the workers and the checks live in tools/faults_export.py (the
longer runs); these tests drive them with small bounds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchestimator.export import export_saved_model, load
from torchestimator.serving.config import VersionPolicy
from torchestimator.serving.manager import ModelManager

TOOL = Path(__file__).resolve().parents[2] / "tools" / "faults_export.py"
SUMMARY = re.compile(
    r"faults_export crafted_refused=(\d+)/(\d+) crafted_inert=(\d+)/(\d+) markers=(\d+) "
    r"kill_trials=(\d+) complete_only=(\d+) disk_full_oserror=(\d+)/(\d+) files_hit=(\d+) "
    r"temp_left=(\d+) torch_ran_payloads=(\d+)/(\d+)$"
)


@pytest.fixture(scope="module")
def tool():
    import faults_export  # tools/ is on sys.path (tests/conftest.py)

    return faults_export


@pytest.fixture(scope="module")
def good(tool, tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    estimator = tool.train_small(str(root / "model"))
    version = export_saved_model(estimator, root / "export", tool.receiver())
    return {"root": root, "estimator": estimator, "version": version}


def test_crafted_versions_are_refused_naming_the_file_and_no_payload_runs(tool, good, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    variants = tool.craft_variants(good["version"], str(tmp_path / "crafted"), str(markers))
    refused, inert, created, problems = tool.check_crafted(variants, str(markers))
    assert problems == [] and created == 0 and os.listdir(markers) == []
    assert refused == len(variants) - 1 and inert == 1  # guards_code is never read from the file
    with pytest.raises(ValueError, match=r"model\.pt2.*would unpickle.*Re-export"):
        load(next(variant.folder for variant in variants if variant.name == "pickled_weight"))
    with pytest.raises(ValueError, match=r"program\.json: \$\.graph_module.*expr_str is the expression"):
        load(next(variant.folder for variant in variants if variant.name == "eval_in_expression"))


def test_a_malicious_model_pt2_next_to_a_good_program_is_never_opened(tool, good, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    crafted = tool.craft_variants(good["version"], str(tmp_path / "crafted"), str(markers))
    folder = tmp_path / "both"
    shutil.copytree(good["version"], folder)
    shutil.copyfile(Path(crafted[0].folder) / "model.pt2", folder / "model.pt2")
    assert load(folder).signature_names == ["serving_default"] and os.listdir(markers) == []


def test_the_server_keeps_serving_version_1_and_the_status_says_why_2_and_3_were_refused(tool, good, tmp_path):
    base, markers = tmp_path / "base", tmp_path / "markers"
    markers.mkdir()
    shutil.copytree(good["version"], base / "1")
    manager = ModelManager("m", base, version_policy=VersionPolicy(kind="all"))
    assert manager.poll() and manager.served_version == 1
    crafted = {
        variant.name: variant
        for variant in tool.craft_variants(good["version"], str(tmp_path / "crafted"), str(markers))
    }
    shutil.copytree(crafted["pickled_sample_inputs"].folder, base / "2")
    (base / "3").mkdir()  # not an export: its file names must not reach the status page
    (base / "3" / "secret-notes.txt").write_text("x")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "id_rsa").write_text("x")
    (base / "4").symlink_to(tmp_path / "private")
    assert not manager.poll()  # nothing new could be loaded
    assert manager.served_versions == [1] and os.listdir(markers) == []
    statuses = {status.version: status for status in manager.statuses()}
    assert statuses[1].state == "AVAILABLE"
    assert "model.pt2" in statuses[2].error_message and "Re-export" in statuses[2].error_message
    for version in (3, 4):
        assert "a version folder holds program.json" in statuses[version].error_message
    assert "secret-notes" not in statuses[3].error_message and "id_rsa" not in statuses[4].error_message
    assert manager.get(1)({"x": [[0.0] * 8]})["class"].shape == (1,)


def test_training_with_an_exporter_on_a_full_disk_stops_with_the_oserror(tool, tmp_path):
    # Deep and narrow: program.json (~110 kB) outgrows every checkpoint file (< 30 kB), so only the export fails.
    model_dir = tmp_path / "model"
    result = tool.run_worker(
        "train-export",
        "--model_dir",
        str(model_dir),
        "--base",
        str(tmp_path / "unused"),
        "--depth",
        "30",
        "--limits",
        "60000",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["type"] == "OSError" and str(model_dir / "export" / "latest") in outcome["error"]
    assert not any(entry.startswith("temp-") for entry in os.listdir(model_dir / "export" / "latest"))


def test_the_faults_script_kills_fills_and_crafts_with_tiny_bounds(tmp_path):
    """The loops themselves, small: kill -9 inside export writes, full disks, crafted folders (see the tool)."""
    result = subprocess.run(
        [sys.executable, str(TOOL), "--trials", "2", "--seconds", "90", "--prove", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]  # 1 when any check found a problem (listed on stderr)
    match = SUMMARY.match(result.stdout.strip().splitlines()[-1])
    assert match, result.stdout[-500:]
    (
        refused,
        crafted,
        inert,
        inert_total,
        markers,
        kills,
        complete,
        full_ok,
        full_points,
        files_hit,
        temp_left,
        ran,
        archives,
    ) = map(int, match.groups())
    assert refused == crafted == 14 and inert == inert_total == 1 and markers == 0
    assert ran == archives == 5  # the archives are real attacks: torch.export.load runs every payload
    assert kills == complete == 2 and temp_left == 0  # after the kills, only complete versions; the next export cleans
    # RLIMIT_FSIZE at 0 and one byte short of each file (5 points), and as root 4 on a small tmpfs: all OSErrors
    # naming the base, with no signal death, no temp- folder, and the old version still loading.
    assert full_ok == full_points >= 5 and files_hit == 3
