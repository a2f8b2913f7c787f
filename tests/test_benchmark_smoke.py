"""Smoke tests for benchmarks/loop_overhead.py: it runs in its quick mode, prints parseable ratios,
and its weight check and argument checks work. The timings themselves are not asserted."""

from __future__ import annotations

import collections
import importlib.util
import itertools
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmark_scripts import assert_arguments_refused, final_line, imported_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "loop_overhead.py"
RATIO = r"\d+\.\d{3}"
FINAL_LINE = re.compile(
    rf"^loop_overhead mlp=({RATIO}) cnn=({RATIO}) mlp_defaults=({RATIO}) "
    rf"input_fn_mlp=({RATIO}) lightning_mlp=({RATIO}|n/a) mlp_paired=({RATIO}) "
    rf"mlp_paired_floor=({RATIO})$"
)


@pytest.fixture(scope="module")
def benchmark():
    with imported_script("loop_overhead") as module:
        yield module


def _final_line(output: str) -> re.Match:
    return final_line(output, FINAL_LINE)


def test_quick_run_prints_ratios_and_identical_weights(benchmark, capsys):
    logger = logging.getLogger("torchestimator")
    level_before = logger.level
    # --allocator default: the pinned allocator (tested in a child process below) would stay pinned in this one.
    status = benchmark.main(
        ["--quick", "--no-lightning", "--allocator", "default", "--rounds", "2", "--steps", "12", "--cnn-steps", "6"]
    )
    output = capsys.readouterr().out
    assert status == 0
    mlp, cnn, defaults, input_fn, lightning, paired, floor = _final_line(output).groups()
    assert min(float(mlp), float(cnn), float(defaults), float(input_fn), float(paired), float(floor)) > 0
    assert lightning == "n/a"
    assert "weights identical: yes" in output and "weights identical: no" not in output
    for name in ("mlp", "cnn", "mlp_defaults", "input_fn_mlp"):
        assert re.search(
            rf"^{name}: hand {RATIO} ms/step, estimator {RATIO} ms/step, ratio {RATIO} \(cpu time; "
            rf"on the wall clock {RATIO} vs {RATIO}",
            output,
            re.M,
        ), name
    for name in ("mlp", "cnn"):
        assert re.search(
            rf"^{name}: minor page faults per step \(median of rounds\): hand \d+, hand_again \d+, "
            rf"estimator \d+$",
            output,
            re.M,
        ), name
    assert "allocator: glibc's default (moving thresholds)" in output
    assert re.search(r"^benchmark time: [0-9.]+ s wall, [0-9.]+ s CPU$", output, re.M)
    assert "checkpoints, summaries, step logging and progress bar disabled" in output
    assert re.search(
        rf"^mlp_paired: each Estimator step beside a hand step taken right after it, 30 steps, 3 runs: "
        rf"ratio {RATIO} \(runs: {RATIO}, {RATIO}, {RATIO}; cpu clock\); weights identical: yes$",
        output,
        re.M,
    )
    assert re.search(
        rf"^mlp_paired_floor: .* ratio {RATIO} \(runs: {RATIO}, {RATIO}, {RATIO}\); the Estimator above "
        rf"it: {RATIO}$",
        output,
        re.M,
    )
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
    status = benchmark.main(
        ["--quick", "--no-lightning", "--allocator", "default", "--rounds", "2", "--steps", "5", "--cnn-steps", "3"]
    )
    output = capsys.readouterr().out
    assert status == 1
    assert "weights identical: no" in output
    _final_line(output)  # the ratios are still printed


def _counting_items(monkeypatch):
    calls = []
    item = torch.Tensor.item
    # Reads of the loss only (it requires grad); the optimizer reads its own step counters.
    monkeypatch.setattr(torch.Tensor, "item", lambda self: (self.requires_grad and calls.append(1)) or item(self))
    return calls


def test_the_hand_loop_reads_the_loss_once_not_every_step(benchmark, monkeypatch):
    settings = benchmark.parse_settings(["--quick", "--steps", "12"])
    workload = benchmark.workloads(settings)[0]
    calls = _counting_items(monkeypatch)
    result = benchmark.run_hand(workload, benchmark.make_batches(workload, settings), seed=0)
    assert len(result.stamps) == 12 and len(calls) == 1  # the NaN check after the loop only


def test_the_hand_loop_with_chores_saves_and_summarises_at_the_chore_steps(benchmark, monkeypatch, tmp_path):
    settings = benchmark.parse_settings(["--quick", "--steps", "25"])
    workload = benchmark.workloads(settings)[0]
    calls = _counting_items(monkeypatch)
    benchmark.run_hand_with_chores(workload, benchmark.make_batches(workload, settings), 0, str(tmp_path / "h"), 10)
    saved = sorted(path.name for path in (tmp_path / "h").glob("*.pt"))
    assert saved == ["checkpoint-10.pt", "checkpoint-20.pt", "final.pt"]
    assert torch.load(tmp_path / "h" / "checkpoint-20.pt")["step"] == 20
    assert len(list((tmp_path / "h").glob("events.out.tfevents.*"))) == 1
    assert len(calls) == 3  # the loss read at steps 10 and 20 for the summary and log line, and once at the end


def test_the_paired_hand_steps_take_the_estimators_batches_and_time_every_step(benchmark, tmp_path):
    settings = benchmark.parse_settings(["--quick", "--paired-steps", "9"])
    workload = benchmark.dataclasses.replace(benchmark.workloads(settings)[0], steps=9)
    ratios, identical = benchmark.measure_paired(workload, settings, str(tmp_path), runs=2)
    assert identical  # the same batches in the same order: same weights, for the Estimator and the floor
    assert set(ratios) == {"estimator", "model_fn_floor"}
    assert all(len(runs) == 2 and min(runs) > 0 for runs in ratios.values())
    batches = benchmark.make_batches(workload, settings)
    clock_values = iter(range(100))
    paired = benchmark._PairedHandSteps(workload, batches, 0, clock=lambda: float(next(clock_values)))
    for _ in range(3):
        paired.after_step(None)
    # clock reads 0,1 | 2,3 | 4,5: hand steps 0->1, 2->3, 4->5; Estimator steps between them: 1->2, 3->4.
    assert paired.hand_steps == [1.0, 1.0, 1.0] and paired.estimator_steps == [1.0, 1.0]
    assert benchmark.same_weights(
        paired.model, benchmark.run_hand(benchmark.dataclasses.replace(workload, steps=3), batches[:3], seed=0).model
    )


def test_the_array_hand_loop_sees_the_batches_in_order(benchmark):
    settings = benchmark.parse_settings(["--quick", "--steps", "9"])
    workload = benchmark.workloads(settings)[0]
    batches = benchmark.make_batches(workload, settings)
    from_arrays = benchmark.run_hand_from_arrays(workload, batches, seed=0)
    assert benchmark.same_weights(from_arrays.model, benchmark.run_hand(workload, batches, seed=0).model)


def test_step_times_skip_warm_up_and_pair_clocks(benchmark):
    stamps = [(0.0, 10.0), (1.0, 10.5), (3.0, 11.5), (6.0, 13.0)]
    assert benchmark.step_times(stamps, skip=1) == {"wall": [2.0, 3.0], "cpu": [1.0, 1.5]}


def test_faults_per_step_counts_the_kept_steps(benchmark):
    stamps = [(0.0, 0.0, 100), (1.0, 1.0, 500), (2.0, 2.0, 520), (3.0, 3.0, 560)]
    assert benchmark.faults_per_step(stamps, skip=1) == 30.0  # (560 - 500) over the two steps after the skipped one


@pytest.mark.parametrize(
    "names, cycle_length",
    [(["hand", "hand_again", "estimator"], 6), (["hand", "hand_again", "estimator", "lightning"], 4), (["a", "b"], 2)],
)
def test_round_orders_give_every_loop_each_predecessor_equally_often(benchmark, names, cycle_length):
    orders = benchmark.round_orders(names)
    cycle = [next(orders) for _ in range(cycle_length)]
    assert all(sorted(order) == sorted(names) for order in cycle) and len(set(cycle)) == cycle_length
    follows = collections.Counter(pair for order in cycle for pair in itertools.pairwise(order))
    assert len(follows) == len(names) * (len(names) - 1) and len(set(follows.values())) == 1  # every pair, as often
    assert next(orders) == cycle[0]


PINNED_CHURN = """
import resource, statistics, sys, torch
sys.path.insert(0, sys.argv[1])
import loop_overhead
print(loop_overhead.pin_allocator())
def churn():
    return [torch.ones(1 << 20) for _ in range(4)]  # 4 x 4 MiB, every page written
faults = []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(statistics.median(faults))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_pinned_allocator_reuses_freed_activations_without_page_faults():
    """In a child process: pinning is for the whole process. 16 MiB freed and allocated again comes back from the
    heap, not as fresh pages (4096 faults per round if it did); the median round leaves out the heap's growth."""
    result = subprocess.run(
        [sys.executable, "-c", PINNED_CHURN, str(SCRIPT.parent)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    described, faults = result.stdout.strip().splitlines()[-2:]
    assert described.startswith("glibc malloc pinned (mmap threshold 32 MiB, trim threshold 256 MiB)")
    assert float(faults) < 16


def test_ratio_pairs_rounds(benchmark):
    measurement = benchmark.Measurement(
        round_medians={"hand": {"cpu": [1.0, 2.0, 4.0]}, "estimator": {"cpu": [1.1, 2.2, 4.4]}}, identical={}
    )
    assert measurement.ratio("estimator", "hand", "cpu") == pytest.approx(1.1)
    assert measurement.median_ms("hand", "cpu") == pytest.approx(2000.0)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--rounds", "2", "--warmup-rounds", "2"], "--warmup-rounds"),
        (["--steps", "2"], "at least 3"),
        (["--threads", "0"], "at least 1"),
    ],
)
def test_bad_arguments_are_refused(benchmark, capsys, arguments, message):
    assert_arguments_refused(benchmark, arguments, message, capsys)


@pytest.mark.slow
def test_script_runs_as_a_program_with_lightning_when_installed():
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    lightning = _final_line(result.stdout).group(3)
    installed = (
        importlib.util.find_spec("lightning") is not None or importlib.util.find_spec("pytorch_lightning") is not None
    )
    assert (lightning != "n/a") == installed
    assert "weights identical: yes" in result.stdout


# -- benchmarks/scaling.py -------------------------------------------------------------------------------------

SCALING_LINE = re.compile(
    rf"^scaling ddp_efficiency_2p=({RATIO}) fsdp_vs_ddp=({RATIO}) "
    rf"async_ckpt_stall_ratio=({RATIO})$"
)


@pytest.fixture(scope="module")
def scaling():
    with imported_script("scaling") as module:
        yield module


def test_scaling_times_steps_past_the_warm_up(scaling):
    after = {step: 10.0 + 0.5 * step for step in range(1, 9)}
    assert scaling.steps_per_second(after, skip=3) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="timed steps"):
        scaling.steps_per_second({1: 0.0, 2: 1.0}, skip=3)


def test_scaling_stall_is_the_save_steps_extra_gap(scaling):
    gaps = {3: 0.01, 4: 0.5, 5: 0.02, 6: 0.01, 8: 0.7, 9: 0.01}
    assert scaling.stall_seconds(gaps, [4, 8]) == pytest.approx(0.6 - 0.01)
    assert scaling.stall_seconds({3: 0.02, 4: 0.01}, [4]) == 0.0  # never negative


def test_scaling_model_has_the_parameters_it_says(scaling):
    settings = scaling.parse_settings([])
    assert scaling.parameter_count(settings) == sum(p.numel() for p in scaling.build_model(settings).parameters())
    assert 24_000_000 < scaling.parameter_count(settings) < 26_000_000


@pytest.mark.parametrize("arguments, message", [(["--steps", "1"], "at least 2"), (["--saves", "0"], "at least 1")])
def test_scaling_bad_arguments_are_refused(scaling, capsys, arguments, message):
    assert_arguments_refused(scaling, arguments, message, capsys)


@pytest.mark.slow
@pytest.mark.distributed
def test_scaling_quick_run_prints_its_ratios():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling.py"
    result = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stderr[-2000:]
    efficiency, fsdp_vs_ddp, stall_ratio = (float(value) for value in final_line(result.stdout, SCALING_LINE).groups())
    assert efficiency > 0 and fsdp_vs_ddp > 0 and stall_ratio >= 0
    assert re.search(r"^2 processes, FSDP2: +\d+\.\d{3} steps/s", result.stdout, re.M)
    assert re.search(r"sync \d+\.\d{3} s, async \d+\.\d{3} s", result.stdout)


# -- benchmarks/first_result.py --------------------------------------------------------------------------------

FIRST_RESULT_LINE = re.compile(
    r"^first_result demo_s=([0-9.]+) import_s=([0-9.]+) train_s=([0-9.]+) "
    r"eval_s=([0-9.]+) export_s=([0-9.]+) serve_available_s=(n/a|[0-9.]+) "
    r"accuracy=([0-9.]+)$"
)


@pytest.mark.slow
def test_first_result_short_run_prints_where_the_demo_time_goes():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "first_result.py"
    result = subprocess.run(
        [sys.executable, str(script), "--max_steps", "20", "--no_rerun", "--no_serve"],
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    demo_s, _import_s, train_s, eval_s, export_s, serve_s, accuracy = final_line(
        result.stdout, FIRST_RESULT_LINE
    ).groups()
    assert float(demo_s) > float(train_s) > 0 and float(eval_s) > 0 and float(export_s) > 0
    assert serve_s == "n/a" and 0.0 < float(accuracy) <= 1.0
    assert "training steps (to step 20, 1 torch threads)" in result.stdout  # the demo's own thread setting


# -- benchmarks/object_storage.py ------------------------------------------------------------------------------

OBJECT_STORAGE_KEYS = (
    "tfrecord_vs_local",
    "tfrecord_vs_{client}_get",
    "tfrecord_vs_{client}_ranged",
    "tfrecord_vs_tfdata",
    "interleaved_vs_local",
    "parsed_vs_local",
    "{client}_get_vs_local",
    "ckpt_save_vs_local",
    "ckpt_load_vs_local",
    "ckpt_save_vs_{client}_put",
    "ckpt_load_vs_{client}_get",
    "upload_gbps",
    "list_calls_per_save",
)
"""The keys of each store's last line, in order; {client} is s3fs or gcsfs."""


@pytest.fixture(scope="module")
def object_storage():
    with imported_script("object_storage") as module:
        yield module


@pytest.mark.slow
def test_object_storage_quick_run_prints_one_last_line_per_store():
    """Both servers (moto's and the GCS emulator) in processes of their own; tf.data measured only where this
    Python imports tensorflow (the project's lock has none: n/a, and a line saying why)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "object_storage.py"
    result = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stderr[-3000:]
    has_tensorflow = importlib.util.find_spec("tensorflow") is not None
    last_lines = result.stdout.strip().splitlines()[-2:]
    for line, (store, client) in zip(last_lines, (("s3", "s3fs"), ("gs", "gcsfs"))):
        values = {}
        for key in OBJECT_STORAGE_KEYS:
            key = key.format(client=client)
            values[key] = rf"(?P<{key}>\d+\.\d{{3}}|n/a)" if key == "tfrecord_vs_tfdata" else rf"(?P<{key}>\d+(\.\d+)?)"
        pattern = f"object_storage store={store} " + " ".join(f"{key}={value}" for key, value in values.items())
        match = re.fullmatch(pattern, line)
        assert match, line
        assert float(match["list_calls_per_save"]) <= 3  # a save lists model_dir a bounded number of times
        assert float(match["tfrecord_vs_local"]) > 0 and float(match[f"ckpt_load_vs_{client}_get"]) > 0
        if store == "s3" or not has_tensorflow:
            assert match["tfrecord_vs_tfdata"] == "n/a"
            assert re.search(rf"^  tf\.data: not measured on {store}: ", result.stdout, re.M)
    assert re.search(r"^tfrecord \(gs\): .* from http://127\.0\.0\.1:\d+", result.stdout, re.M)


def test_object_storage_refuses_an_s3_endpoint_for_the_gcs_store_alone(object_storage, capsys):
    assert_arguments_refused(
        object_storage, ["--store", "gs", "--endpoint", "http://x", "--bucket", "b"], "need --store s3 or both", capsys
    )
    assert_arguments_refused(object_storage, ["--tensorflow-python", "/no/such/python"], "no such program", capsys)
    assert object_storage.parse_settings(["--quick"]).stores == ("s3", "gs")
    assert object_storage.parse_settings(["--store", "gs"]).stores == ("gs",)


def test_object_storage_says_why_without_tensorflow(object_storage, monkeypatch, tmp_path):
    settings = object_storage.parse_settings(["--quick"])
    monkeypatch.setattr(object_storage.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(object_storage.TensorFlowUnavailable, match="--tensorflow-python"):
        object_storage.tensorflow_python(settings)
    if importlib.util.find_spec("tensorflow") is None:  # this Python, named as the TensorFlow one: its import fails
        with pytest.raises(object_storage.TensorFlowUnavailable, match="import tensorflow failed"):
            object_storage.TensorFlowProcess(sys.executable, {}, str(tmp_path / "tf.log"))


def test_object_storage_tls_proxy_hands_the_gcs_hosts_to_the_emulator(object_storage, tmp_path):
    """The path TensorFlow's GCS client takes to the emulator: CONNECT to the proxy, TLS for storage.googleapis.com
    with the run's own CA, the request passed on as plain HTTP (here to a stand-in that serves one object)."""
    import http.server
    import threading

    body = bytes(range(256)) * 4096
    seen = []

    class Object(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Object)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = object_storage.parse_settings(["--quick"])
        store = object_storage.Store(
            settings=settings,
            local_dir=str(tmp_path),
            bucket_url="gs://bucket",
            endpoint=f"http://127.0.0.1:{server.server_port}",
            protocol="gs",
        )
        with object_storage.tls_proxy(store) as (port, ca):
            assert object_storage._proxied_get(["gs://bucket/a b/x.tfrecord"] * 2, port, ca)() == 2 * len(body)
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/bucket/a%20b/x.tfrecord"] * 2
