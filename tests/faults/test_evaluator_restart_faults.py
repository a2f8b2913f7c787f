"""Whole-job restarts with an evaluator task (issue 26): a rerun with a higher max_steps, a rerun after early
stopping, and a job killed with SIGKILL then restarted, the evaluator started before, with or after the trainers.

The trials come from tools/faults_evaluator_restart.py (the longer version runs every kind in every order);
each starts three plain processes twice, so this module runs three of them.
"""

from __future__ import annotations

import random
import re

import faults_evaluator_restart as tool  # tools/ is on sys.path (tests/conftest.py)
import pytest


@pytest.mark.parametrize("kind, order", [("early_stop", "with"), ("kill", "after")])
def test_a_restarted_job_is_evaluated_to_its_new_end_and_every_task_exits(tmp_path, kind, order):
    tally = tool.Tally()
    tool.run_trial(tmp_path, kind, order, random.Random(0), tally)
    assert tally.problems == []
    assert tally.followed == 1 and tally.lost_runs == 0 and tally.failed_tasks == 0
    assert tally.stepless_reruns == (kind == "early_stop")


def test_the_tool_ends_with_its_summary_line(capsys):
    # Its first trial: the rerun with a higher max_steps, the evaluator started before the trainers.
    assert tool.main(["--trials", "1", "--kinds", "rerun"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"faults_evaluator_restart trials=1 followed=1 lost_runs=0 failed_tasks=0 "
        r"stepless_reruns=0 seconds=\d+",
        last,
    ), last


def test_the_tool_refuses_an_unknown_kind():
    with pytest.raises(SystemExit):
        tool.main(["--kinds", "rerun,meteor"])
