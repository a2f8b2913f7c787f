"""Smoke test for benchmarks/serving_grpc.py: a short run serves the mlp over gRPC and REST, checks both answer the
same and prints a parseable final line; its arguments are checked. Timings are not asserted."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, final_line

FIGURE = r"\d+\.\d{3}"
FINAL_LINE = re.compile(rf"^serving_grpc rps_vs_rest=({FIGURE}) rps_vs_rest_c1=({FIGURE}) cpu_vs_rest=({FIGURE})$")


@pytest.mark.slow
def test_a_short_run_prints_the_ratios_of_grpc_over_rest():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "serving_grpc.py"), "--seconds", "0.2", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=BENCHMARKS,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ratios = [float(value) for value in final_line(done.stdout, FINAL_LINE).groups()]
    assert all(ratio > 0 for ratio in ratios)
    assert re.search(r"^grpc +8 +\d+ +\d+ +\d+ +0$", done.stdout, re.MULTILINE)  # no failed calls


@pytest.mark.slow
def test_bad_arguments_are_refused():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "serving_grpc.py"), "--seconds", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BENCHMARKS,
    )
    assert done.returncode == 2 and "--seconds must be positive" in done.stderr
