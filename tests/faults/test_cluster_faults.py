"""Cluster faults (issue 26, points 3 and 6): a replica killed during a save, replica 0 killed before the group
forms, and a SIGSTOPped rank under ``torchestimator launch --max_restarts 1``; every lost peer is named and
the restart comes within its bound.

The trials come from tools/faults_cluster.py (the longer version runs each kind several times).
"""

from __future__ import annotations

import re

import faults_cluster as tool  # tools/ is on sys.path (tests/conftest.py)
import pytest


@pytest.mark.parametrize("kind, number", [("save_kill", 0), ("save_kill", 1), ("early_chief_kill", 0)])
def test_a_lost_peer_is_named_and_no_save_is_half_published(tmp_path, kind, number):
    tally = tool.Tally()
    tool.run_trial(tmp_path, kind, number, tally, bound=30.0, restart_bound=45.0)
    assert tally.problems == []
    assert tally.named == 1 and tally.half_published == 0 and tally.lingering == 0


def test_the_tool_ends_with_its_summary_line(capsys):
    # One trial: rank 1 of a launched run is stopped; the restart comes within the bound (15 s collective
    # timeout + launch's 5 s shutdown grace + start-up; 53 s with torchrun's fixed 30 s grace).
    assert tool.main(["--trials", "1", "--kinds", "stopped"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"faults_cluster trials=1 named=0 half_published=0 lingering=0 restarted=1 "
        r"restart_s=\d+ seconds=\d+",
        last,
    ), last


def test_the_tool_refuses_an_unknown_kind():
    with pytest.raises(SystemExit):
        tool.main(["--kinds", "save_kill,meteor"])
