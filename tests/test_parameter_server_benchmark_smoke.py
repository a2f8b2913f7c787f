"""Smoke test of benchmarks/parameter_server.py: its phase and rate arithmetic, its argument checks, and (slow) a
quick run of every torch configuration ending with a parseable final line. The timings themselves are not
asserted."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from benchmark_scripts import BENCHMARKS, assert_arguments_refused, final_line, imported_script

NUMBER = r"\d+\.\d+"
FINAL_LINE = re.compile(
    rf"^parameter_server async_vs_ddp=({NUMBER}) async_vs_ddp_straggler=({NUMBER}) sync_vs_ddp=({NUMBER}) "
    rf"embedding_rows_per_s=(\d+|n/a) async_vs_tf=({NUMBER}|n/a)$"
)


@pytest.fixture(scope="module")
def bench():
    with imported_script("parameter_server") as module:
        yield module


def test_asynchronous_phases_hold_twice_the_global_steps_of_half_the_examples(bench):
    settings, _ = bench.parse_settings(["--warmup", "4", "--equal", "10", "--straggler", "6", "--settle", "1"])
    ddp, asynchronous = bench.phases("ddp", settings), bench.phases("async", settings)
    assert (ddp.warm_end, ddp.straggle_from, ddp.straggle_window_from, ddp.last) == (4, 14, 15, 20)
    assert ddp.examples_per_step == 256 and bench.phases("sync", settings) == ddp
    assert (asynchronous.warm_end, asynchronous.straggle_from, asynchronous.last) == (8, 28, 40)
    assert asynchronous.examples_per_step == 128
    assert bench.phases("tf_async", settings) == asynchronous
    embedding = bench.phases("embedding", settings)  # one window after the warm-up, no straggler
    assert embedding.warm_end == 8 and embedding.straggle_from == embedding.last == 8 + 2 * settings.embedding_window


def test_a_window_rate_counts_the_global_steps_the_chief_saw_pass(bench):
    # Asynchronous: the chief sees the global step jump by the other trainer's pushes.
    records = [(10.0, 1), (10.5, 3), (11.0, 5), (11.5, 6), (12.0, 8), (12.5, 10)]
    assert bench.window(records, 3, 8) == (10.5, 3, 12.0, 8)
    assert bench.examples_per_second(records, 3, 8, 128) == pytest.approx((8 - 3) * 128 / 1.5)
    assert bench.steps_between(records, 10.5, 12.0) == 3  # the chief's own steps that ended inside
    with pytest.raises(ValueError, match="fewer than 2 records"):
        bench.window(records, 11, 20)


def test_cpu_share_is_cpu_seconds_over_wall_seconds_inside_the_window(bench):
    samples = [(0.0, 1.0), (1.0, 1.5), (2.0, 2.5), (3.0, 2.5)]
    assert bench.cpu_share(samples, 1.0, 3.0) == pytest.approx(0.5)
    assert bench.cpu_share(samples, 0.5, 1.5) != bench.cpu_share(samples, 0.5, 1.5)  # one sample: nan


def test_the_model_is_the_stated_size(bench):
    settings, _ = bench.parse_settings([])
    assert bench.parameter_count(settings) == 563_722
    model = bench.build_model(settings)
    assert sum(parameter.numel() for parameter in model.parameters()) == 563_722


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--global-batch", "7"], "--global-batch even"),
        (["--rounds", "0"], "must be at least 1"),
        (["--settle", "9", "--straggler", "10"], "--settle must be"),
        (["--kinds", "ddp,horovod"], "--kinds takes some of"),
        (["--embedding-rows", "0"], "--embedding-rows"),
    ],
)
def test_bad_arguments_are_refused(bench, arguments, message, capsys):
    assert_arguments_refused(bench, arguments, message, capsys)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_quick_run_prints_every_configuration_and_its_final_line():
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "parameter_server.py"), "--quick", "--no-tensorflow"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    output = completed.stdout
    match = final_line(output, FINAL_LINE)
    assert all(float(match.group(index)) > 0 for index in (1, 2, 3))
    assert match.group(5) == "n/a"  # no TensorFlow asked for
    for kind in ("ddp", "async", "sync"):
        assert re.search(rf"round 0 +{kind}: equal +\d+ examples/s, straggler +\d+ examples/s", output), output
    assert re.search(r"push round trip ms chief:0 [\d.]+ worker:0 [\d.]+", output)
    assert output.count("conditions:") >= 5
    if match.group(4) == "n/a":  # the table is not built (or failed): said so, with no figure
        assert "conditions: embedding_rows_per_s n/a:" in output
    else:
        assert re.search(r"round 0 embedding: equal +\d+ examples/s, table rows/s +\d+", output), output
