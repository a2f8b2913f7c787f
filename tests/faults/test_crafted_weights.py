"""Crafted weight files for every container the readers open: nothing runs, memory stays bounded, errors are ours.

Each file is read in a worker process limited to its own size after start-up
plus 300 MB of address space (tools/faults_readers.py), so a reader that
allocates what a file declares fails with MemoryError or dies instead of
passing. The cases and the worker are the tool's; the tool runs the same
cases plus random damage for longer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "faults_readers.py"


@pytest.fixture(scope="module")
def tool():
    import faults_readers  # tools/ is on sys.path (tests/conftest.py)

    return faults_readers


def test_crafted_files_end_in_the_readers_own_error_under_a_memory_limit(tool, tmp_path):
    marker = str(tmp_path / "MARKER")
    (tmp_path / "files").mkdir()
    cases = tool.crafted_cases(str(tmp_path / "files"), marker)
    kinds = {case.name.split("_")[0] for case in cases}
    assert kinds >= {"torch", "safetensors", "checkpoint", "keras", "keras2", "keras3", "tf"}
    worker = tool.Worker(tool.HEADROOM_MB, timeout=120)
    failures = []
    try:
        for case in cases:
            result = worker.run(case.path)
            if case.data:
                good = result["kind"] == "read_ok"
            else:
                good = (
                    result["kind"] == "clean_errors"
                    and result["type"] == "WeightSourceError"
                    and case.names in result["message"]
                    and str(tmp_path) in result["message"]
                )
            if not good:
                failures.append(f"{case.name}: {result}")
            assert not os.path.exists(marker), f"{case.name} ran the pickle in {case.path}"
    finally:
        worker.close()
    assert not failures, "\n".join(failures)


def test_random_damage_smoke(tool, capsys):
    status = tool.main(["--no-crafted", "--trials", "40", "--seconds", "60", "--seed", "3"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(
        r"faults_readers trials=(\d+) read_ok=(\d+) clean_errors=(\d+) other_errors=(\d+) crashes=(\d+) "
        r"markers=(\d+) max_rss_mb=(\d+)",
        last,
    )
    assert match, last
    trials, read_ok, clean, other, crashes, markers, _ = map(int, match.groups())
    assert trials > 0 and read_ok + clean == trials and (other, crashes, markers) == (0, 0, 0), last
    assert status == 0
