"""Smoke tests for benchmarks/tfrecord_read.py: it runs in its quick mode without TensorFlow, prints
torchestimator's absolute figures and a parseable final line with n/a ratios, and its correctness
checks and argument checks work. The timings themselves are not asserted."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from benchmark_scripts import assert_arguments_refused, final_line, imported_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tfrecord_read.py"
RATIO = r"\d+\.\d{3}|n/a"
FINAL_LINE = re.compile(rf"^tfrecord_read raw_vs_tfdata=({RATIO}) parsed_vs_tfdata=({RATIO}) "
                        rf"raw_vs_tfrecord_pkg=({RATIO})$")
OURS_ONLY = ["--quick", "--no-tensorflow", "--no-tfrecord-package", "--records", "300", "--files", "3",
             "--batch-size", "64", "--rounds", "2"]


@pytest.fixture(scope="module")
def benchmark():
    with imported_script("tfrecord_read") as module:
        yield module


def _final_line(output: str) -> re.Match:
    return final_line(output, FINAL_LINE)


def _figure(output: str, figure: str, unit: str) -> float:
    match = re.search(rf"^{figure}: torchestimator (\d+) {unit}/s \(cpu/wall \d+\.\d\d\)", output, re.M)
    assert match, f"no {figure} line in:\n{output}"
    return float(match.group(1))


def test_quick_run_prints_our_figures_and_na_ratios(benchmark, capsys):
    status = benchmark.main(OURS_ONLY)
    output = capsys.readouterr().out
    assert status == 0
    assert _final_line(output).groups() == ("n/a", "n/a", "n/a")
    assert _figure(output, "raw", "records") > 0
    assert _figure(output, "parsed", "examples") > 0
    assert "records identical: yes" in output
    assert "tf.data n/a (skipped (--no-tensorflow))" in output
    assert "300 records in 3 files" in output


def test_missing_competitors_are_named_and_ours_still_measured(benchmark, capsys, monkeypatch):
    monkeypatch.setattr(benchmark, "import_tensorflow", lambda threads: None)
    monkeypatch.setattr(benchmark, "import_tfrecord_iterator", lambda: None)
    status = benchmark.main(["--quick", "--records", "200", "--rounds", "2"])
    output = capsys.readouterr().out
    assert status == 0
    assert "tensorflow not installed" in output and "tfrecord package not installed" in output
    assert "pip install tensorflow-cpu tfrecord" in output
    assert _figure(output, "raw", "records") > 0 and _figure(output, "parsed", "examples") > 0
    assert _final_line(output).groups() == ("n/a", "n/a", "n/a")
    assert "targets: raw_vs_tfdata>=1 n/a" in output


def test_a_wrong_parse_fails_the_run(benchmark, capsys, monkeypatch):
    real_parse = benchmark.parse_example

    def off_by_one(serialized, features):
        parsed = real_parse(serialized, features)
        parsed["label"] = parsed["label"] + 1
        return parsed

    monkeypatch.setattr(benchmark, "parse_example", off_by_one)
    status = benchmark.main(OURS_ONLY)
    output = capsys.readouterr().out
    assert status == 1
    assert "records identical: no: torchestimator parsed label unlike the generated values" in output
    _final_line(output)  # the figures are still printed


def test_records_digest_sees_order_and_boundaries(benchmark):
    reference = benchmark.records_digest([b"ab", b"c"])
    assert reference[0] == 2
    assert benchmark.records_digest([b"ab", b"c"]) == reference
    assert benchmark.records_digest([b"c", b"ab"]) != reference
    assert benchmark.records_digest([b"a", b"bc"]) != reference  # same bytes, different records


def test_batch_mismatches_names_the_differing_features(benchmark):
    expected = {"dense": np.zeros((2, 3), np.float32),
                "tokens": (np.array([[0, 0]]), np.array([5]), np.array([2, 1]))}
    same = {"dense": np.zeros((2, 3), np.float32),
            "tokens": (np.array([[0, 0]]), np.array([5]), np.array([2, 1]))}
    assert benchmark.batch_mismatches(same, expected) == []
    wrong = {"dense": np.zeros((2, 3), np.float64), "tokens": (np.array([[0, 0]]), np.array([6]), np.array([2, 1]))}
    assert benchmark.batch_mismatches(wrong, expected) == ["dense", "tokens"]
    assert benchmark.batch_mismatches({}, expected) == ["dense (missing)", "tokens (missing)"]


@pytest.mark.parametrize("arguments, message", [
    (["--rounds", "2", "--warmup-rounds", "2"], "--warmup-rounds"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--records", "3", "--files", "4"], "--records must be at least --files"),
    (["--image-bytes", "-1"], "must be >= 0"),
])
def test_bad_arguments_are_refused(benchmark, capsys, arguments, message):
    assert_arguments_refused(benchmark, arguments, message, capsys)


@pytest.mark.slow
def test_script_runs_as_a_program():
    """Compares against TensorFlow and the tfrecord package exactly when they are installed."""
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    raw_vs_tfdata, parsed_vs_tfdata, raw_vs_package = _final_line(result.stdout).groups()
    has_tensorflow = importlib.util.find_spec("tensorflow") is not None
    has_package = importlib.util.find_spec("tfrecord") is not None
    assert (raw_vs_tfdata != "n/a") == has_tensorflow and (parsed_vs_tfdata != "n/a") == has_tensorflow
    assert (raw_vs_package != "n/a") == has_package
    assert "records identical: yes" in result.stdout
