"""Smoke tests for benchmarks/tfrecord_read.py: it runs in its quick mode without TensorFlow, prints
torchestimator's absolute figures (every batch size, the dataset figure) with wall and CPU time, and a
parseable final line naming every ratio (n/a without the competitors), and its correctness checks and
argument checks work. The timings themselves are not asserted."""

from __future__ import annotations

import gc
import importlib.util
import platform
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_scripts import assert_arguments_refused, final_line, imported_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tfrecord_read.py"
RATIO = r"\d+\.\d{3}|n/a"
RATIO_NAMES = (
    "raw_vs_tfdata",
    "parsed_vs_tfdata",
    "raw_vs_tfrecord_pkg",
    "dataset_vs_tfdata",
    "parsed_vs_tfdata_worst",
    "parsed_vs_tfdata_b16",
    "parsed_vs_tfdata_b64",
    "parsed_vs_tfdata_b256",
    "parsed_vs_tfdata_b1024",
)
FINAL_LINE = re.compile("^tfrecord_read " + " ".join(rf"{name}=({RATIO})" for name in RATIO_NAMES) + "$")
ALL_NA = ("n/a",) * len(RATIO_NAMES)
OURS_ONLY = [
    "--quick",
    "--no-tensorflow",
    "--no-tfrecord-package",
    "--records",
    "300",
    "--files",
    "3",
    "--dataset-records",
    "500",
    "--dataset-batch-size",
    "32",
    "--rounds",
    "2",
]
FIGURES = [
    ("raw", "records"),
    ("parsed_b16", "examples"),
    ("parsed_b64", "examples"),
    ("parsed_b256", "examples"),
    ("parsed_b1024", "examples"),
    ("dataset", "examples"),
]


@pytest.fixture(scope="module")
def benchmark():
    with imported_script("tfrecord_read") as module:
        yield module


def _final_line(output: str) -> re.Match:
    return final_line(output, FINAL_LINE)


def _figure(output: str, figure: str, unit: str) -> float:
    match = re.search(
        rf"^{figure}: torchestimator (\d+) {unit}/s \((\d+\.\d\d) ms wall, cpu/wall (\d+\.\d\d)\)", output, re.M
    )
    assert match, f"no {figure} line in:\n{output}"
    assert float(match.group(2)) > 0 and float(match.group(3)) > 0, match.group(0)
    return float(match.group(1))


def _every_figure_printed(output: str) -> None:
    for figure, unit in FIGURES:
        assert _figure(output, figure, unit) > 0, figure


def test_quick_run_prints_our_figures_and_na_ratios(benchmark, capsys):
    status = benchmark.main(OURS_ONLY)
    output = capsys.readouterr().out
    assert status == 0
    assert _final_line(output).groups() == ALL_NA
    _every_figure_printed(output)
    assert "records identical: yes" in output
    assert "tf.data n/a (skipped (--no-tensorflow))" in output
    assert "300 records in 3 files" in output
    assert "one 500-record file at batch 32" in output
    assert "torchestimator cores: records: " in output
    assert "note: --quick reads too few records" in output


def test_quick_run_prints_three_conditions_lines_before_the_last(benchmark, capsys):
    """What the figures depend on, before the final line: what read_records verifies and which scanner ran;
    the records, files and file system; the versions, the CPU and the load."""
    from torchestimator.data.tfrecord import describe_reader

    assert benchmark.main(OURS_ONLY) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    conditions = [line for line in lines if line.startswith("conditions: ")]
    assert len(conditions) == 3 and lines[-4:-1] == conditions, lines[-5:]
    verifies, data, environment = conditions
    assert (
        f"read_records checks both CRCs (a damaged length CRC or data CRC is refused), its scanner {describe_reader()}"
        in verifies
    )
    assert "tf.data n/a; tfrecord package n/a. raw_vs_tfrecord_pkg compares them as they are" in verifies
    assert re.match(r"conditions: 300 records of \d+-\d+ bytes \(mean \d+\) in 3 files of ", data), data
    assert re.search(r", on \S+ \(", data), data  # the file system
    assert f"Python {platform.python_version()} " in environment and f"torch {torch.__version__}" in environment
    assert re.search(r"load average \(1 min\) \S+ at the start, \S+ at the end$", environment), environment


def _framing_only(path: str) -> list[bytes]:
    """A reader of the framing alone that checks neither CRC (as the tfrecord package's tfrecord_iterator)."""
    data, records, position = open(path, "rb").read(), [], 0
    while position < len(data):
        (length,) = struct.unpack_from("<Q", data, position)
        records.append(data[position + 12 : position + 12 + length])
        position += 12 + length + 4
    return records


def _data_crc_only(path: str) -> list[bytes]:
    """A reader checking the data CRC and not the length CRC."""
    from torchestimator.data.tfrecord import masked_crc32c

    data = open(path, "rb").read()
    records = _framing_only(path)
    if struct.unpack_from("<I", data, len(data) - 4)[0] != masked_crc32c(records[-1]):
        raise ValueError("data CRC")
    return records


def test_crc_checks_tells_what_a_raw_reader_verifies(benchmark, tmp_path):
    """The probe of the conditions line: a damaged length CRC, then a damaged data CRC, each read in turn."""
    from torchestimator.data import read_records

    assert benchmark.crc_checks(lambda path: list(read_records(path)), str(tmp_path)) == (
        "checks both CRCs (a damaged length CRC or data CRC is refused)"
    )
    assert benchmark.crc_checks(_framing_only, str(tmp_path)) == (
        "checks no CRC (a record with a damaged length CRC or data CRC is read without error)"
    )
    assert benchmark.crc_checks(lambda path: list(read_records(path, verify=False)), str(tmp_path)).startswith(
        "checks no CRC"
    )
    assert benchmark.crc_checks(_data_crc_only, str(tmp_path)) == (
        "checks the data CRC only (a damaged data CRC is refused, the other read without error)"
    )
    assert list(tmp_path.iterdir()) == []  # the probe files are removed


def test_the_benchmarks_page_says_what_the_script_prints():
    """docs/benchmarks.md's TFRecord section names the final line's figures, its targets as the script has
    them, the conditions lines and the like-for-like line, and dates its figures with their commit."""
    page = (SCRIPT.parents[1] / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = page[page.index("## TFRecord reading\n") :]
    section = " ".join(section[: section.index("\n## ")].split())
    assert "`tfrecord_read " + " ".join(f"{name}=" for name in RATIO_NAMES[:6]) + " ... _b1024=`" in section
    with imported_script("tfrecord_read") as module:
        targets = re.search(r"\(targets: ([^)]*)\)", section).group(1)
        assert [float(value) for value in re.findall(r">= ([\d.]+)", targets)] == list(module.TARGETS.values())
    assert "Three `conditions:` lines before it" in section and "`raw_tfrecord_pkg_unverified` line" in section
    assert re.search(r"Figures of \d{4}-\d\d-\d\d \(commit [0-9a-f]{7};", section), "the figures' date and commit"


def test_missing_competitors_are_named_and_ours_still_measured(benchmark, capsys, monkeypatch):
    monkeypatch.setattr(benchmark, "import_tensorflow", lambda threads: None)
    monkeypatch.setattr(benchmark, "import_tfrecord_iterator", lambda: None)
    status = benchmark.main(["--quick", "--records", "200", "--dataset-records", "300", "--rounds", "2"])
    output = capsys.readouterr().out
    assert status == 0
    assert "tensorflow not installed" in output and "tfrecord package not installed" in output
    assert "pip install -r benchmarks/requirements-bench.txt" in output
    _every_figure_printed(output)
    assert _final_line(output).groups() == ALL_NA
    assert "targets: raw_vs_tfdata>=1.3 n/a" in output


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


def test_a_wrong_dataset_batch_is_caught(benchmark, monkeypatch, tmp_path):
    real_dataset = benchmark.TFRecordDataset

    class ShiftedLabels(real_dataset):
        def __iter__(self):
            for batch in super().__iter__():
                yield {**batch, "label": batch["label"] + 1}

    monkeypatch.setattr(benchmark, "TFRecordDataset", ShiftedLabels)
    settings = benchmark.parse_settings(
        ["--quick", "--records", "40", "--files", "2", "--dataset-records", "50", "--dataset-batch-size", "8"]
    )
    columns = benchmark.make_columns(settings)
    shards = benchmark.write_files(str(tmp_path), benchmark.serialize(columns), settings)
    path = benchmark.write_dataset_file(str(tmp_path), shards, settings)
    assert benchmark.check_dataset(path, columns, settings) == [
        "TFRecordDataset parsed label unlike the generated values"
    ]


def _measurement(benchmark, rates):
    """A Measurement whose every kept round gives each reader the rates listed for it."""
    return benchmark.Measurement(
        rates={name: list(values) for name, values in rates.items()},
        walls={name: [0.5] * len(values) for name, values in rates.items()},
        cores={name: [2.0 if name == "ours_dataset" else 1.0] * len(values) for name, values in rates.items()},
    )


def test_report_gives_every_ratio_the_geometric_mean_and_the_worst_batch_size(benchmark, capsys):
    settings = benchmark.parse_settings(["--quick", "--batch-sizes", "16,256", "--rounds", "3"])
    rates = {
        "ours_raw": [300, 300],
        "tfdata_raw": [100, 200],
        "tfrecord_pkg_raw": [100, 100],
        "ours_parsed_b16": [200, 200],
        "tfdata_parsed_b16": [100, 100],
        "ours_parsed_b256": [100, 100],
        "tfdata_parsed_b256": [200, 200],
        "ours_dataset": [90, 90],
        "tfdata_dataset": [100, 100],
    }
    ratios = benchmark.report(_measurement(benchmark, rates), object(), object(), settings)
    assert list(ratios) == [
        "raw_vs_tfdata",
        "parsed_vs_tfdata",
        "raw_vs_tfrecord_pkg",
        "dataset_vs_tfdata",
        "parsed_vs_tfdata_worst",
        "parsed_vs_tfdata_b16",
        "parsed_vs_tfdata_b256",
    ]
    assert ratios["raw_vs_tfdata"] == pytest.approx(2.25)  # median of 3 and 1.5 in the same rounds
    assert ratios["parsed_vs_tfdata_b16"] == pytest.approx(2.0)
    assert ratios["parsed_vs_tfdata_b256"] == pytest.approx(0.5)
    assert ratios["parsed_vs_tfdata"] == pytest.approx(1.0)  # sqrt(2 * 0.5)
    assert ratios["parsed_vs_tfdata_worst"] == pytest.approx(0.5)
    assert ratios["dataset_vs_tfdata"] == pytest.approx(0.9)
    assert ratios["raw_vs_tfrecord_pkg"] == pytest.approx(3.0)
    output = capsys.readouterr().out
    assert "parsed over batch sizes 16,256: geometric mean 1.000, worst 0.500 (batch 256)" in output
    assert re.search(
        r"^dataset: torchestimator 90 examples/s \(500\.00 ms wall, cpu/wall 2\.00\), tf\.data 100 "
        r"examples/s \(500\.00 ms wall, cpu/wall 1\.00\), ratio 0\.900 \(per CPU second 0\.450; "
        r"2 rounds\)$",
        output,
        re.M,
    )
    benchmark.print_verdict(ratios)
    assert (
        "targets: raw_vs_tfdata>=1.3 met, parsed_vs_tfdata_worst>=1 MISSED, raw_vs_tfrecord_pkg>=3 met, "
        "dataset_vs_tfdata>=1 MISSED"
    ) in capsys.readouterr().out


def test_dataset_file_repeats_the_shards_records_in_order(benchmark, tmp_path):
    settings = benchmark.parse_settings(["--quick", "--records", "30", "--files", "3", "--dataset-records", "70"])
    columns = benchmark.make_columns(settings)
    shards = benchmark.write_files(str(tmp_path), benchmark.serialize(columns), settings)
    path = benchmark.write_dataset_file(str(tmp_path), shards, settings)
    records = list(benchmark.read_records(shards))
    assert list(benchmark.read_records([path])) == (records * 3)[:70]
    assert benchmark.check_dataset(path, columns, settings) == []


def test_numpy_batch_turns_sparse_tensors_into_tensorflow_parts(benchmark):
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[1, 0], [0, 2]]), torch.tensor([7, 5]), (2, 3), check_invariants=True
    )
    converted = benchmark.numpy_batch({"tokens": sparse, "label": torch.tensor([1, 2]), "image": np.array([b"x"])})
    indices, values, shape = converted["tokens"]
    assert indices.tolist() == [[0, 2], [1, 0]] and values.tolist() == [5, 7] and shape.tolist() == [2, 3]
    assert converted["label"].tolist() == [1, 2] and converted["image"].tolist() == [b"x"]


def test_measure_times_every_reader_with_the_heap_frozen_and_unfreezes_it(benchmark):
    settings = benchmark.parse_settings(["--quick", "--rounds", "3"])
    frozen_during = []

    def read() -> int:
        frozen_during.append(gc.get_freeze_count())
        return 5

    measurement = benchmark.measure({"a": benchmark.Contender(read, 5), "b": benchmark.Contender(read, 5)}, settings)
    assert len(frozen_during) == 6 and min(frozen_during) > 0
    assert gc.get_freeze_count() == 0
    assert len(measurement.rates["a"]) == len(measurement.walls["b"]) == 2  # the warm-up round left out
    with pytest.raises(RuntimeError, match="a read 4 records in round 0; expected 5"):
        benchmark.measure({"a": benchmark.Contender(lambda: 4, 5)}, settings)


def test_records_digest_sees_order_and_boundaries(benchmark):
    reference = benchmark.records_digest([b"ab", b"c"])
    assert reference[0] == 2
    assert benchmark.records_digest([b"ab", b"c"]) == reference
    assert benchmark.records_digest([b"c", b"ab"]) != reference
    assert benchmark.records_digest([b"a", b"bc"]) != reference  # same bytes, different records


def test_batch_mismatches_names_the_differing_features(benchmark):
    expected = {"dense": np.zeros((2, 3), np.float32), "tokens": (np.array([[0, 0]]), np.array([5]), np.array([2, 1]))}
    same = {"dense": np.zeros((2, 3), np.float32), "tokens": (np.array([[0, 0]]), np.array([5]), np.array([2, 1]))}
    assert benchmark.batch_mismatches(same, expected) == []
    wrong = {"dense": np.zeros((2, 3), np.float64), "tokens": (np.array([[0, 0]]), np.array([6]), np.array([2, 1]))}
    assert benchmark.batch_mismatches(wrong, expected) == ["dense", "tokens"]
    assert benchmark.batch_mismatches({}, expected) == ["dense (missing)", "tokens (missing)"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--rounds", "2", "--warmup-rounds", "2"], "--warmup-rounds"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--records", "3", "--files", "4"], "--records must be at least --files"),
        (["--image-bytes", "-1"], "must be >= 0"),
        (["--batch-sizes", "16,x"], "comma-separated list of integers"),
        (["--batch-sizes", "16,0"], "every batch size must be at least 1 and appear once"),
        (["--batch-sizes", "64,64"], "every batch size must be at least 1 and appear once"),
        (["--dataset-batch-size", "0"], "--dataset-batch-size must be at least 1"),
    ],
)
def test_bad_arguments_are_refused(benchmark, capsys, arguments, message):
    assert_arguments_refused(benchmark, arguments, message, capsys)


@pytest.mark.slow
def test_script_runs_as_a_program():
    """Compares against TensorFlow and the tfrecord package exactly when they are installed."""
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    ratios = dict(zip(RATIO_NAMES, _final_line(result.stdout).groups()))
    has_tensorflow = importlib.util.find_spec("tensorflow") is not None
    has_package = importlib.util.find_spec("tfrecord") is not None
    for name, value in ratios.items():
        assert (value != "n/a") == (has_package if name == "raw_vs_tfrecord_pkg" else has_tensorflow), name
    assert "records identical: yes" in result.stdout
