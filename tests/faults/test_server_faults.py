"""Hostile clients on raw sockets against a real server, and version hot swaps under load.

The server is ``torchestimator.serving.start`` on 127.0.0.1 (its own thread
and event loop) over a small exported classifier. Requests are bytes written
to sockets, so nothing is normalised on the way: malformed request lines,
unknown methods, huge and odd headers, bad Content-Length, chunked garbage,
gzip lies, deep JSON, huge integers, NaN, invalid UTF-8, pipelining, a client
leaving mid-body, slowloris. The rules: never a 5xx, every error answer is
JSON ``{"error": <string>}``, a well-framed bad request leaves its keep-alive
connection usable, the server logs no traceback, and it still predicts at the
end. The cases, the raw client and the checks are tools/faults_serving.py's;
that script also runs random hostile requests and hot swaps for longer (its
smoke test is at the end).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import faults_serving as tool  # tools/ is on sys.path (tests/conftest.py)
import pytest
import torch
from helpers import exporting_model_fn, trained_classifier, wait_until

from torchestimator.export import TensorSpec, export_saved_model, serving_input_receiver
from torchestimator.serving import start

TOOL = Path(__file__).resolve().parents[2] / "tools" / "faults_serving.py"
NAME = "m"
GOOD_BODY = json.dumps({"instances": [[0.5] * 8, [-1.0] * 8]}).encode()

CASES = tool.hostile_cases(NAME, GOOD_BODY)
# Beyond "a JSON 4xx": what the fixes promise for these cases.
EXPECTED = {
    "gzip body": 200,
    "deflate body": 200,
    "chunked body": 200,
    "Expect: 100-continue": 200,
    "odd but legal headers": 200,
    "100 headers": 200,
    "gzip header on a plain body": 400,
    "deflate header on a plain body": 400,
    "truncated gzip body": 400,
    "gzip bomb beyond the body limit": 413,
    "unsupported encoding": 400,
    "JSON arrays 1000 deep": 400,
    "JSON objects 1000 deep in instances": 400,
    "JSON objects 1000 deep in inputs": 400,
    "JSON arrays 100000 deep": 400,
    "5000-digit integer": 400,
    "5000-digit negative integer in inputs": 400,
    "invalid UTF-8": 400,
    "unknown Expect": 417,
    "GET on :predict": 405,
    "unknown method": 400,
    "garbage request line": 400,
    "chunk size garbage": 400,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server polling its base every 0.1 s; yields (server, base folder, the export to copy as new versions)."""
    root = tmp_path_factory.mktemp("server_faults")
    estimator, _ = trained_classifier(root / "model", exporting_model_fn(lambda logits, predictions: {}), steps=3)
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
    export = export_saved_model(estimator, root / "export", receiver)
    base = root / "base"
    shutil.copytree(export, base / "1")
    with start(NAME, base, file_system_poll_wait_seconds=0.1) as server:
        yield server, base, export


@pytest.fixture
def tally(served):
    """The tool's tally, with every traceback the server logs counted; the server must predict afterwards."""
    tally = tool.Tally()
    with tool.counting_tracebacks(tally):
        yield tally
    server = served[0]
    tool.check_next_request(tool.RawConnection(server.port), good(), "the test", tally)
    assert tally.failures == 0, "\n".join(tally.problems)


def good():
    return tool.good_request(tool.predict_path(NAME), GOOD_BODY)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_hostile_request_gets_a_json_answer_below_500_and_keeps_a_framed_connection(served, tally, case):
    answer = tool.run_case(served[0].port, case, good(), tally)
    assert answer is not None, f"{case.name}: no answer"
    if case.name in EXPECTED:
        assert answer.status == EXPECTED[case.name], (answer.status, answer.body[:300])
    assert tally.failures == 0, "\n".join(tally.problems)


def test_the_error_texts_say_what_was_wrong(served):
    by_name = {case.name: case for case in CASES}
    texts = {}
    for name in (
        "gzip header on a plain body",
        "5000-digit integer",
        "JSON objects 1000 deep in instances",
        "garbage request line",
        "unknown Expect",
    ):
        connection = tool.RawConnection(served[0].port)
        connection.send(by_name[name].data)
        texts[name] = json.loads(connection.read_answer().body)["error"]
        connection.close()
    assert "not valid gzip data" in texts["gzip header on a plain body"]
    assert "5000 digits" in texts["5000-digit integer"]
    assert "nested too deeply" in texts["JSON objects 1000 deep in instances"]
    assert texts["garbage request line"].startswith("Malformed HTTP request:")
    assert "only 100-continue" in texts["unknown Expect"]


def test_pipelined_requests_are_answered_in_order_on_one_connection(served, tally):
    tool.pipelined(served[0].port, good(), tool.bad_request(tool.predict_path(NAME)), tally, count=7)


def test_a_client_leaving_mid_body_is_one_log_line_and_no_traceback(served, tally, caplog):
    caplog.set_level(logging.INFO, logger="torchestimator")
    tool.leave_mid_body(served[0].port, tool.predict_path(NAME), tally)
    lines = wait_until(lambda: _disconnect_lines(caplog), timeout=30, what="the server's disconnect log line")
    assert len(lines) == 1 and lines[0].exc_info is None, [record.getMessage() for record in lines]


def _disconnect_lines(caplog):
    return [record for record in caplog.records if "disconnected before sending the whole body" in record.getMessage()]


def test_slowloris_connections_do_not_keep_a_normal_client_waiting(served, tally):
    tool.slowloris(served[0].port, tool.predict_path(NAME), good(), tally, connections=100)


def test_random_hostile_requests_get_json_answers_below_500(served, tally):
    tool.random_requests(served[0].port, NAME, GOOD_BODY, tally, seconds=8, seed=7)
    assert tally.requests > 50


def test_hot_swaps_under_load_fail_no_request(served, tally):
    server, base, export = served
    swaps, requests = tool.hot_swap(
        server.port,
        str(base),
        str(export),
        server.managers[NAME],
        tool.predict_path(NAME),
        GOOD_BODY,
        tally,
        seconds=10,
    )
    assert swaps >= 2 and requests > 100, (swaps, requests)


def test_the_faults_script_ends_with_its_summary_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(TOOL), "--seconds", "1", "--swap-seconds", "2", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    last = result.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        r"faults_serving requests=(\d+) status_5xx=0 non_json_errors=0 reset_keepalive=0 "
        r"hot_swap_failures=0 tracebacks=0",
        last,
    )
    assert result.returncode == 0 and match, result.stdout[-3000:] + result.stderr[-3000:]
    assert int(match.group(1)) > 50
