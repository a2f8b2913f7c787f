"""Smoke tests for benchmarks/serving.py: its quick mode serves one model from our server (batching off and on), the
FastAPI anchors (async def and def) and Flask on gunicorn, and prints a parseable final line; its load loop is bounded in count and time, its server
handling reports and stops what fails, and its checks and argument checks work. Timings are not asserted."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from benchmark_scripts import assert_arguments_refused, final_line, imported_script

FIGURE = r"\d+\.\d{3}|n/a"
MILLISECONDS = r"\d+\.\d\d|n/a"
FINAL_LINE = re.compile(
    rf"^serving rps_vs_fastapi=({FIGURE}) rps_vs_flask=({FIGURE}) "
    rf"batching_gain_c8=({FIGURE}) p99_ms_c8=({MILLISECONDS}) batching_gain_c32=({FIGURE}) "
    rf"big_batching_gain_c8=({FIGURE}) big_batching_gain_c32=({FIGURE}) "
    rf"p99_ms_c32_batching=({MILLISECONDS}) p99_ms_c32_plain=({MILLISECONDS}) cpu_vs_fastapi=({FIGURE})$"
)
NAMES = (
    "rps_vs_fastapi",
    "rps_vs_flask",
    "batching_gain_c8",
    "p99_ms_c8",
    "batching_gain_c32",
    "big_batching_gain_c8",
    "big_batching_gain_c32",
    "p99_ms_c32_batching",
    "p99_ms_c32_plain",
    "cpu_vs_fastapi",
)


@pytest.fixture(scope="module")
def benchmark():
    with imported_script("serving") as module:
        yield module


def _installed(*names: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in names)


@contextlib.contextmanager
def fake_server(status: int = 200, delay: float = 0.0):
    """A loopback HTTP server answering every POST with `status` after `delay` seconds; yields its port."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the load threads expect

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(delay)
            body = b'{"predictions": [[1.0]]}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *arguments):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _settings(benchmark, **changes):
    return dataclasses.replace(benchmark.parse_settings(["--quick"]), **changes)


# -- the whole script -------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_serves_every_server_and_prints_the_final_line(benchmark, capsys):
    status = benchmark.main(["--quick"])
    output = capsys.readouterr().out
    assert status == 0, output
    figures = _final_line_figures(output)
    assert "mlp: predictions identical: yes" in output
    for concurrency in (1, 8, 32):
        assert re.search(rf"^mlp\s+{concurrency}\s+ours\s+\d+ ", output, re.M)
        assert re.search(rf"^mlp\s+{concurrency}\s+ours_batching\s+\d+ ", output, re.M)
    assert (figures["rps_vs_fastapi"] is not None) == _installed("fastapi", "uvicorn")
    if _installed("fastapi", "uvicorn"):
        assert re.search(r"^mlp\s+8\s+fastapi_async\s+\d+ ", output, re.M)
        assert re.search(r"^mlp\s+8\s+fastapi_def\s+\d+ ", output, re.M)
    assert (figures["rps_vs_flask"] is not None) == _installed("flask", "gunicorn")
    assert (figures["cpu_vs_fastapi"] is not None) == _installed("fastapi", "uvicorn")
    assert re.search(r"^mlp: server CPU per request, the leaner FastAPI's over ours at c=1/8/32: ", output, re.M)
    assert re.search(r"^mlp\s+8\s+ours\s+\d+ .* 0 +[2-9]\d*$", output, re.M)  # errors 0, then its threads (>= 2)
    for name in ("batching_gain_c8", "p99_ms_c8", "batching_gain_c32", "p99_ms_c32_batching", "p99_ms_c32_plain"):
        assert figures[name] is not None, name
    assert figures["big_batching_gain_c32"] is None  # quick serves the mlp only
    assert re.search(
        r"^mlp: forward through the exported model, one torch thread: \d+\.\d\d ms at batch 1", output, re.M
    )
    assert "failed to start" not in output


def _final_line_figures(output: str) -> dict[str, float | None]:
    values = final_line(output, FINAL_LINE).groups()
    figures = {name: None if value == "n/a" else float(value) for name, value in zip(NAMES, values)}
    assert all(value is None or (value > 0 and math.isfinite(value)) for value in figures.values())
    return figures


def test_format_figures_writes_the_issue_line(benchmark):
    figures = dict.fromkeys(NAMES)
    figures.update(
        {
            "rps_vs_fastapi": 1.23456,
            "batching_gain_c8": math.nan,
            "p99_ms_c8": 12.345,
            "big_batching_gain_c32": 2.5,
            "p99_ms_c32_plain": 30.0,
            "cpu_vs_fastapi": 1.5,
        }
    )
    line = benchmark.format_figures(figures)
    assert line == (
        "serving rps_vs_fastapi=1.235 rps_vs_flask=n/a batching_gain_c8=n/a p99_ms_c8=12.35 "
        "batching_gain_c32=n/a big_batching_gain_c8=n/a big_batching_gain_c32=2.500 "
        "p99_ms_c32_batching=n/a p99_ms_c32_plain=30.00 cpu_vs_fastapi=1.500"
    )
    assert FINAL_LINE.match(line)
    assert tuple(benchmark.FIGURES) == NAMES


# -- load --------------------------------------------------------------------------------


def test_load_sends_the_fixed_count_per_connection_and_measures_cpu(benchmark):
    settings = _settings(benchmark, requests=7, warmup_requests=2, seconds=30.0)
    with fake_server() as port:
        run = benchmark.run_load(port, b"{}", 3, settings, path="/v1/models/m:predict", cpu_seconds=lambda: 4.0)
    assert len(run.latencies) == 21 and run.errors == 0
    assert run.rate > 0 and all(latency > 0 for latency in run.latencies)
    assert run.server_cpu == 0.0 and run.client_cpu >= 0.0


def test_load_stops_at_the_time_cap(benchmark):
    settings = _settings(benchmark, requests=10_000, warmup_requests=0, seconds=0.3)
    with fake_server(delay=0.02) as port:
        started = time.perf_counter()
        run = benchmark.run_load(port, b"{}", 2, settings, path="/v1/models/m:predict")
    assert time.perf_counter() - started < 3
    assert 0 < len(run.latencies) < 100  # at 20 ms per request, two threads finish ~30 in 0.3 s


def test_failed_requests_are_counted_not_timed(benchmark):
    settings = _settings(benchmark, requests=4, warmup_requests=0, seconds=30.0)
    with fake_server(status=500) as port:
        run = benchmark.run_load(port, b"{}", 2, settings, path="/v1/models/m:predict")
    assert run.latencies == [] and run.errors == 8


def test_ratio_pairs_rounds_and_latencies_pool_them(benchmark):
    Run = benchmark.Run
    measurement = benchmark.Measurement(
        runs={
            ("ours", 8): [
                Run(latencies=[0.001] * 10, wall=1.0, errors=0),
                Run(latencies=[0.002] * 30, wall=1.0, errors=0),
            ],
            ("fastapi", 8): [
                Run(latencies=[0.001] * 5, wall=1.0, errors=0),
                Run(latencies=[0.004] * 20, wall=1.0, errors=1),
            ],
        }
    )
    assert measurement.ratio("ours", "fastapi", 8) == pytest.approx((10 / 5 + 30 / 20) / 2)
    assert measurement.rate("ours", 8) == pytest.approx(20.0)
    assert measurement.latency_ms("ours", 8, 0.5) == pytest.approx(2.0)
    assert measurement.latency_ms("fastapi", 8, 0.1) == pytest.approx(1.0)
    assert measurement.errors("fastapi", 8) == 1


def test_geometric_mean_refuses_missing_or_bad_values(benchmark):
    assert benchmark.geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert benchmark.geometric_mean([]) is None
    assert benchmark.geometric_mean([2.0, math.nan]) is None
    assert benchmark.geometric_mean([2.0, 0.0]) is None


# -- servers and checks ------------------------------------------------------------------


def test_a_server_that_exits_is_reported_with_its_log(benchmark, tmp_path):
    commands = {
        "broken": ([sys.executable, "-c", "print('no model here'); raise SystemExit(3)"], benchmark.free_port())
    }
    with benchmark.running_servers(commands, "/p", b"{}", str(tmp_path), startup_seconds=30) as (
        servers,
        answers,
        failures,
    ):
        assert servers == {} and answers == {}
    assert "broken exited with status 3" in failures["broken"]
    assert "no model here" in failures["broken"]


def test_a_server_that_never_answers_times_out_and_is_stopped(benchmark, tmp_path):
    commands = {"silent": ([sys.executable, "-c", "import time; time.sleep(60)"], benchmark.free_port())}
    started = time.monotonic()
    with benchmark.running_servers(commands, "/p", b"{}", str(tmp_path), startup_seconds=0.5) as (
        _servers,
        _,
        failures,
    ):
        assert "silent did not answer" in failures["silent"]
    assert time.monotonic() - started < 10


def test_running_servers_stops_its_servers_on_the_way_out(benchmark, tmp_path):
    launched = []
    real_server = benchmark.Server

    def recording(*arguments):
        launched.append(real_server(*arguments))
        return launched[-1]

    script = tmp_path / "answer.py"
    script.write_text(
        "import sys\nfrom http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "class H(BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        self.rfile.read(int(self.headers['Content-Length'])); self.send_response(200)\n"
        "        self.send_header('Content-Length', '2'); self.end_headers(); self.wfile.write(b'{}')\n"
        "HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
    )
    port = benchmark.free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(benchmark, "Server", recording)
        with pytest.raises(KeyboardInterrupt):
            with benchmark.running_servers(
                {"toy": ([sys.executable, str(script), str(port)], port)},
                "/p",
                b"{}",
                str(tmp_path),
                startup_seconds=30,
            ) as (_servers, answers, _):
                assert answers == {"toy": b"{}"}
                raise KeyboardInterrupt  # Ctrl-C while measuring
    assert launched[0].process.poll() is not None


def test_server_commands_serve_every_model_on_distinct_ports(benchmark, tmp_path):
    scripts = {"batching": "b.txt", "fastapi_async": "fa.py", "fastapi_def": "fd.py", "flask": "/apps/k.py"}
    bases = {"mlp": str(tmp_path / "mlp"), "wide": str(tmp_path / "wide")}
    commands = benchmark.server_commands(bases, scripts, "models.config")
    assert sorted(commands) == ["fastapi_async", "fastapi_def", "flask", "ours", "ours_batching"]
    assert len({port for _, port in commands.values()}) == 5
    ours, port = commands["ours"]
    assert ours[ours.index("--rest_api_port") + 1] == str(port)
    assert ours[ours.index("--model_config_file") + 1] == "models.config"
    assert ours[3] == "serve" and "--enable_batching" not in ours
    assert commands["ours_batching"][0][-3:] == ["--enable_batching", "--batching_parameters_file", "b.txt"]
    assert commands["fastapi_async"][0][1:] == [
        "fa.py",
        str(commands["fastapi_async"][1]),
        f"mlp={bases['mlp']}",
        f"wide={bases['wide']}",
    ]
    flask = commands["flask"][0]
    assert flask[1:3] == ["-m", "gunicorn"] and flask[flask.index("--workers") + 1] == "1"
    assert flask[flask.index("--worker-class") + 1] == "gthread"
    assert flask[flask.index("--bind") + 1] == f"127.0.0.1:{commands['flask'][1]}"
    assert flask[flask.index("--chdir") + 1] == "/apps" and flask[-1] == f"k:create_app({bases!r})"
    assert "--rest_api_num_threads" not in ours  # the server's own default unless asked
    for name in ("ours", "ours_batching"):
        command = benchmark.server_commands(bases, scripts, "models.config", request_threads=4)[name][0]
        assert command[command.index("--rest_api_num_threads") + 1] == "4"


def test_the_model_config_file_lists_every_model_for_our_server(benchmark, tmp_path):
    from torchestimator.serving.config import read_model_config_file

    bases = {"mlp": str(tmp_path / "mlp"), "cnn": str(tmp_path / "c n n")}
    configs = read_model_config_file(benchmark.write_model_config(str(tmp_path), bases))
    assert [(config.name, config.base_path) for config in configs] == list(bases.items())
    assert benchmark.predict_path("cnn") == "/v1/models/cnn:predict"


def test_batching_parameters_file_is_tf_text_format(benchmark, tmp_path):
    settings = _settings(benchmark, max_batch_size=8, batch_timeout_micros=0, fastapi=False, flask=False)
    scripts = benchmark.write_scripts(str(tmp_path), settings)
    assert sorted(scripts) == ["batching"]  # the skipped anchors get no script
    text = open(scripts["batching"]).read()
    assert "max_batch_size { value: 8 }" in text and "batch_timeout_micros { value: 0 }" in text
    assert "num_batch_threads { value: 1 }" in text


def test_check_predictions_names_the_disagreeing_server(benchmark):
    expected = np.array([[0.25, 0.75]], dtype=np.float32)
    answers = {
        "ours": json.dumps({"predictions": [[0.25, 0.75]]}).encode(),
        "fastapi": json.dumps({"predictions": [[0.25, 0.7]]}).encode(),
        "flask": b"<html>error</html>",
    }
    problems = benchmark.check_predictions(answers, expected)
    assert len(problems) == 2
    assert problems[0].startswith("fastapi predicted [0.25, 0.7]")
    assert problems[1].startswith("flask answered b'<html>error</html>'")
    assert benchmark.check_predictions({"ours": answers["ours"]}, expected) == []


def test_servers_that_did_not_start_fail_the_run(benchmark, capsys):
    assert benchmark.explain_failures("mlp", {}) is False
    assert benchmark.explain_failures("mlp", {"ours_batching": "ours_batching exited with status 2: usage"}) is True
    assert "mlp: ours_batching failed to start: ours_batching exited with status 2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--models", "mlp,resnet"], "subset of mlp,cnn,wide"),
        (["--requests", "0"], "at least 1"),
        (["--warmup-requests", "-1"], "--warmup-requests must be >= 0"),
        (["--seconds", "1000"], "--seconds must be in (0, 600]"),
        (["--max-batch-size", "0"], "--max-batch-size must be at least 1"),
        (["--request-threads", "0"], "--request-threads must be at least 1"),
    ],
)
def test_bad_arguments_are_refused(benchmark, capsys, arguments, message):
    assert_arguments_refused(benchmark, arguments, message, capsys)


def test_the_fastapi_ratio_takes_the_faster_anchor_of_each_round(benchmark):
    Run = benchmark.Run
    measurement = benchmark.Measurement(
        runs={
            ("ours", 8): [
                Run(latencies=[0.001] * 30, wall=1.0, errors=0, server_cpu=0.03),
                Run(latencies=[0.001] * 40, wall=1.0, errors=0, server_cpu=0.05),
            ],
            ("fastapi_async", 8): [
                Run(latencies=[0.001] * 20, wall=1.0, errors=0),
                Run(latencies=[0.001] * 10, wall=1.0, errors=0),
            ],
            ("fastapi_def", 8): [
                Run(latencies=[0.001] * 10, wall=1.0, errors=0),
                Run(latencies=[0.001] * 20, wall=1.0, errors=0),
            ],
        }
    )
    assert measurement.fastest_ratio("ours", ("fastapi_async", "fastapi_def"), 8) == pytest.approx((1.5 + 2.0) / 2)
    assert measurement.cpu_us_per_request("ours", 8) == pytest.approx(0.08 / 70 * 1e6)


def test_cpu_efficiency_takes_the_leanest_anchor_pooled_over_rounds(benchmark):
    Run = benchmark.Run
    measurement = benchmark.Measurement(
        runs={
            ("ours", 8): [
                Run(latencies=[0.001] * 10, wall=1.0, errors=0, server_cpu=0.02, server_threads=4),
                Run(latencies=[0.001] * 30, wall=1.0, errors=0, server_cpu=0.02, server_threads=3),
            ],
            ("fastapi_async", 8): [Run(latencies=[0.001] * 10, wall=1.0, errors=0, server_cpu=0.03)],
            ("fastapi_def", 8): [Run(latencies=[0.001] * 10, wall=1.0, errors=0, server_cpu=0.05)],
        }
    )
    # ours: 0.04 s over 40 requests = 1000 us; the leaner anchor (async): 3000 us
    assert measurement.cpu_efficiency_ratio("ours", ("fastapi_async", "fastapi_def"), 8) == pytest.approx(3.0)
    assert measurement.threads("ours", 8) == 4


def test_process_tree_threads_counts_a_childs_threads(benchmark):
    import subprocess

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, sys\n"
            "stop = threading.Event()\n"
            "for _ in range(3): threading.Thread(target=stop.wait, daemon=True).start()\n"
            "print('up', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.readline() == b"up\n"
        assert benchmark.process_tree_threads(child.pid) == 4  # the main thread and three waiting
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert benchmark.process_tree_threads(2**22 + 12345) == 0


def test_process_tree_cpu_counts_children(benchmark):
    import subprocess

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass'])",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        total = 0.0
        while time.monotonic() < deadline and child.poll() is None:
            total = max(total, benchmark.process_tree_cpu_seconds(child.pid))
            time.sleep(0.02)
    finally:
        child.wait(timeout=30)
    assert total >= 0.2  # the grandchild's busy loop is counted under the child
    assert math.isnan(benchmark.process_tree_cpu_seconds(2**22 + 12345))
