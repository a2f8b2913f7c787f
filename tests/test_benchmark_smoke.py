"""Smoke tests for benchmarks/loop_overhead.py: it runs in its quick mode, prints parseable ratios,
and its weight check and argument checks work. The timings themselves are not asserted."""

from __future__ import annotations

import importlib.util
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import assert_arguments_refused, final_line, imported_script
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "loop_overhead.py"
RATIO = r"\d+\.\d{3}"
FINAL_LINE = re.compile(rf"^loop_overhead mlp=({RATIO}) cnn=({RATIO}) lightning_mlp=({RATIO}|n/a)$")


@pytest.fixture(scope="module")
def benchmark():
    with imported_script("loop_overhead") as module:
        yield module


def _final_line(output: str) -> re.Match:
    return final_line(output, FINAL_LINE)


def test_quick_run_prints_ratios_and_identical_weights(benchmark, capsys):
    logger = logging.getLogger("torchestimator")
    level_before = logger.level
    status = benchmark.main(["--quick", "--no-lightning", "--rounds", "2", "--steps", "12", "--cnn-steps", "6"])
    output = capsys.readouterr().out
    assert status == 0
    mlp, cnn, lightning = _final_line(output).groups()
    assert float(mlp) > 0 and float(cnn) > 0
    assert lightning == "n/a"
    assert "weights identical: yes" in output and "weights identical: no" not in output
    assert re.search(rf"^mlp: hand {RATIO} ms/step, estimator {RATIO} ms/step, ratio {RATIO}", output, re.M)
    assert "checkpoints, summaries, step logging and progress bar disabled" in output
    assert logger.level == level_before  # the benchmark quiets the library's logs only while it runs


def test_weight_check_sees_a_single_changed_value(benchmark):
    first = benchmark.tiny_mlp(4, 8)
    second = benchmark.tiny_mlp(4, 8)
    second.load_state_dict(first.state_dict())
    assert benchmark.same_weights(first, second)
    with torch.no_grad():
        second[0].weight[0, 0] = torch.nextafter(second[0].weight[0, 0], torch.tensor(1.0))
    assert not benchmark.same_weights(first, second)


def test_differing_weights_fail_the_run(benchmark, capsys, monkeypatch):
    monkeypatch.setattr(benchmark, "same_weights", lambda first, second: False)
    status = benchmark.main(["--quick", "--no-lightning", "--rounds", "2", "--steps", "5", "--cnn-steps", "3"])
    output = capsys.readouterr().out
    assert status == 1
    assert "weights identical: no" in output
    _final_line(output)  # the ratios are still printed


def test_step_times_skip_warm_up_and_pair_clocks(benchmark):
    stamps = [(0.0, 10.0), (1.0, 10.5), (3.0, 11.5), (6.0, 13.0)]
    assert benchmark.step_times(stamps, skip=1) == {"wall": [2.0, 3.0], "cpu": [1.0, 1.5]}


def test_ratio_pairs_rounds(benchmark):
    measurement = benchmark.Measurement(
        round_medians={"hand": {"cpu": [1.0, 2.0, 4.0]}, "estimator": {"cpu": [1.1, 2.2, 4.4]}}, identical={})
    assert measurement.ratio("estimator", "hand", "cpu") == pytest.approx(1.1)
    assert measurement.median_ms("hand", "cpu") == pytest.approx(2000.0)


@pytest.mark.parametrize("arguments, message", [
    (["--rounds", "2", "--warmup-rounds", "2"], "--warmup-rounds"),
    (["--steps", "2"], "at least 3"),
    (["--threads", "0"], "at least 1"),
])
def test_bad_arguments_are_refused(benchmark, capsys, arguments, message):
    assert_arguments_refused(benchmark, arguments, message, capsys)


@pytest.mark.slow
def test_script_runs_as_a_program_with_lightning_when_installed():
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    lightning = _final_line(result.stdout).group(3)
    installed = importlib.util.find_spec("lightning") is not None or importlib.util.find_spec("pytorch_lightning") is not None
    assert (lightning != "n/a") == installed
    assert "weights identical: yes" in result.stdout
