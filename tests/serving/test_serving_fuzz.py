"""Fuzzing the REST API on a real socket: schemathesis from serving/openapi.py, and hypothesis on :predict bodies.

Whatever a client sends, the server answers JSON with a documented status and
never a 5xx; errors are {"error": <string>}; and after all of it a valid
request is still answered correctly. The schemathesis driver and the models
live in benchmarks/fuzz_serving.py (its long run); CI runs a bounded,
seeded share of it here.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import requests
from benchmark_scripts import imported_script
from hypothesis import HealthCheck, event, given, settings, strategies as st

from torchestimator.serving import make_app
from torchestimator.serving.openapi import ERROR_STATUSES, openapi_document

FUZZ_CASES = 400  # spread over 16 operations x 2 generation modes; about 10 s on 2 cores
FUZZ_SEED = 20260
TARGETED = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def fuzz_script():
    with imported_script("fuzz_serving") as module:
        yield module


@pytest.fixture(scope="module")
def server(fuzz_script, tmp_path_factory):
    """The app over the fuzz models, live on 127.0.0.1; yields (base URL, keep-alive session)."""
    managers = fuzz_script.managers_for(fuzz_script.export_models(str(tmp_path_factory.mktemp("fuzz"))))
    with fuzz_script.live_server(make_app(managers)) as base_url, requests.Session() as session:
        yield base_url, session


def post(server, path: str, data: bytes) -> requests.Response:
    base_url, session = server
    return session.post(base_url + path, data=data, headers={"Content-Type": "application/json"}, timeout=30)


def assert_json_answer(response: requests.Response) -> object:
    """Every answer: not 5xx, application/json, JSON; 4xx answers are {"error": <string>}."""
    assert response.status_code < 500, (response.status_code, response.text[:300])
    assert response.headers["Content-Type"].split(";")[0] == "application/json", response.headers
    document = json.loads(response.content)
    if response.status_code >= 400:
        assert isinstance(document, dict) and list(document) == ["error"] and isinstance(document["error"], str)
    return document


# -- the OpenAPI document ---------------------------------------------------------------


def test_openapi_document_describes_every_tf_serving_path_and_the_error_document():
    document = openapi_document(["half", "pair"])
    json.dumps(document)  # plain JSON data
    assert document["openapi"].startswith("3.0")
    selectors = ("", "/versions/{version}", "/labels/{label}")
    expected = {"/v1/models"}
    for selector in selectors:
        expected |= {f"/v1/models/{{model_name}}{selector}", f"/v1/models/{{model_name}}{selector}/metadata"}
        expected |= {f"/v1/models/{{model_name}}{selector}:{verb}" for verb in ("predict", "classify", "regress")}
    assert set(document["paths"]) == expected
    predict = document["paths"]["/v1/models/{model_name}/versions/{version}:predict"]["post"]
    assert [parameter["name"] for parameter in predict["parameters"]] == ["model_name", "version"]
    assert predict["parameters"][0]["schema"] == {"type": "string", "enum": ["half", "pair"]}
    assert set(predict["responses"]) == {"200", *ERROR_STATUSES}
    schemas = document["components"]["schemas"]
    assert schemas["Error"]["required"] == ["error"] and schemas["Error"]["additionalProperties"] is False
    assert schemas["PredictRequest"]["properties"]["instances"]["minItems"] == 1
    assert schemas["RegressResponse"]["required"] == ["results"]


def test_openapi_document_without_names_takes_any_segment_and_refuses_bad_names():
    parameter = openapi_document()["paths"]["/v1/models/{model_name}"]["get"]["parameters"][0]
    assert parameter["schema"] == {"type": "string", "pattern": "^[^/:]+$"}
    first = openapi_document(["a"])
    first["components"]["schemas"]["Error"]["required"].append("mutated")
    assert openapi_document(["a"])["components"]["schemas"]["Error"]["required"] == ["error"]  # no shared state
    with pytest.raises(ValueError, match="cannot contain '/' or ':'"):
        openapi_document(["a:b"])
    with pytest.raises(TypeError, match="sequence of non-empty model names"):
        openapi_document("half")


def test_openapi_document_loads_in_schemathesis_with_one_operation_per_path():
    import schemathesis

    schema = schemathesis.openapi.from_dict(openapi_document(["half"]))
    labels = {f"{result.ok().method.upper()} {result.ok().path}" for result in schema.get_all_operations()}
    assert len(labels) == 16 and "POST /v1/models/{model_name}:regress" in labels


def test_the_answer_checker_flags_what_it_must(fuzz_script):
    class Answer:  # schemathesis's Response: lowercase header names, list values
        def __init__(self, status, content_type, content):
            self.status_code, self.headers, self.content = status, {"content-type": [content_type]}, content

    assert fuzz_script.answer_problems(Answer(404, "application/json", b'{"error": "x"}')) == []
    assert fuzz_script.answer_problems(Answer(500, "application/json", b'{"error": "x"}')) == ["server error 500"]
    assert "not application/json" in fuzz_script.answer_problems(Answer(404, "text/plain", b'{"error": "x"}'))[0]
    assert "not JSON" in fuzz_script.answer_problems(Answer(404, "application/json", b"404: Not Found"))[0]
    assert "without a string 'error'" in fuzz_script.answer_problems(Answer(400, "application/json", b'{"e": 1}'))[0]


def test_the_fuzz_script_reports_in_one_line_and_refuses_bad_arguments(fuzz_script):
    report = fuzz_script.FuzzReport(cases=3)
    report.statuses.update({404: 2, 200: 1})
    assert report.summary() == "fuzz_serving cases=3 failures=0 statuses=200:1,404:2"
    for arguments in (["--examples", "0"], ["--max-seconds", "-1"]):
        with pytest.raises(SystemExit) as stopped:
            fuzz_script.main(arguments)
        assert stopped.value.code == 2


# -- schemathesis ------------------------------------------------------------------------


@pytest.mark.slow
def test_schemathesis_fuzz_gets_only_documented_json_answers_and_no_server_error(fuzz_script, server):
    base_url, _ = server
    report = fuzz_script.fuzz(base_url, fuzz_script.MODEL_NAMES, examples=FUZZ_CASES, seed=FUZZ_SEED, max_seconds=120)
    assert not report.failures, "\n".join(report.failures[:10])
    assert not report.stopped_early
    assert report.cases >= FUZZ_CASES // 2, report.summary()
    # Both served models (200 from status and metadata) and unknown ones (404) were reached, and bad input (400).
    assert {200, 400, 404} <= set(report.statuses), report.summary()
    assert fuzz_script.check_still_serving(base_url) is None


# -- hypothesis on :predict bodies -------------------------------------------------------

FLOATS = st.floats(allow_nan=True, allow_infinity=True)
HUGE_INTEGERS = st.integers(min_value=2**62, max_value=2**80)  # past int64 and uint64
SCALARS = st.none() | st.booleans() | st.integers() | HUGE_INTEGERS | FLOATS | st.text(max_size=8)
B64 = st.fixed_dictionaries({"b64": st.text(max_size=12) | st.binary(max_size=8).map(lambda raw: raw.hex())})
JSON_VALUES = st.recursive(
    SCALARS | B64,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["x", "a", "b", "b64", "inputs", ""]) | st.text(max_size=4), children, max_size=3
        )
    ),
    max_leaves=12,
)
# Number tensors of the right rank and wrong ones, and pair's rows and columns: these reach the models, not just
# the parser (about one answer in eight is a 200).
NUMBER_TENSORS = (
    st.lists(FLOATS, min_size=1, max_size=4)
    | st.lists(FLOATS | st.integers(-(2**70), 2**70), min_size=1, max_size=4)
    | st.lists(st.lists(FLOATS, min_size=0, max_size=3), min_size=1, max_size=3)
)
INDICES = st.integers(-6, 6) | st.integers() | FLOATS
PAIR_A = st.lists(FLOATS, min_size=2, max_size=2) | st.lists(FLOATS, max_size=3)
PAIR_ROWS = st.lists(st.fixed_dictionaries({"a": PAIR_A, "b": INDICES}), min_size=1, max_size=3)
PAIR_COLUMNS = st.fixed_dictionaries(
    {"a": st.lists(st.lists(FLOATS, min_size=2, max_size=2), max_size=3), "b": st.lists(INDICES, max_size=3)}
)
SIGNATURES = st.sampled_from(["serving_default", "regress_x_to_y", "classify_x_to_y", "nope"]) | JSON_VALUES
BODIES = st.one_of(
    st.fixed_dictionaries({"instances": NUMBER_TENSORS | PAIR_ROWS}, optional={"signature_name": SIGNATURES}),
    st.fixed_dictionaries({"inputs": NUMBER_TENSORS | PAIR_COLUMNS}, optional={"signature_name": SIGNATURES}),
    st.fixed_dictionaries({}, optional={"instances": JSON_VALUES, "inputs": JSON_VALUES, "signature_name": SIGNATURES}),
)


def dumps(document: object) -> bytes:
    return json.dumps(document, allow_nan=True).encode()  # NaN and Infinity tokens, as TF Serving accepts


@TARGETED
@given(model=st.sampled_from(["half", "pair"]), body=BODIES)
def test_random_predict_bodies_get_200_or_a_4xx_json_error(server, model, body):
    response = post(server, f"/v1/models/{model}:predict", dumps(body))
    event(f"status {response.status_code}")  # --hypothesis-show-statistics: how often the models were reached
    document = assert_json_answer(response)
    if response.status_code == 200:
        assert ("predictions" in document) == ("instances" in body) and ("outputs" in document) == ("inputs" in body)


@TARGETED
@given(
    x=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=6),
    row_format=st.booleans(),
)
def test_any_float32_list_is_predicted_exactly_as_half_x_plus_two(server, x, row_format):
    response = post(server, "/v1/models/half:predict", dumps({"instances" if row_format else "inputs": x}))
    document = assert_json_answer(response)
    assert response.status_code == 200, document
    expected = (np.float32(0.5) * np.asarray(x, dtype=np.float32) + np.float32(2)).tolist()
    answer = document["predictions" if row_format else "outputs"]
    assert len(answer) == len(expected)
    assert all(a == e or (math.isnan(a) and math.isnan(e)) for a, e in zip(answer, expected)), (answer, expected)


@TARGETED
@given(raw=st.binary(max_size=64))
def test_random_bytes_bodies_are_400(server, raw):
    response = post(server, "/v1/models/half:predict", raw)
    assert_json_answer(response)
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        parsed = None
    if not isinstance(parsed, dict):  # anything but a JSON object is malformed
        assert response.status_code == 400, response.text


def test_after_the_random_requests_a_valid_predict_is_still_correct(fuzz_script, server):
    base_url, _ = server
    assert fuzz_script.check_still_serving(base_url) is None
    response = post(server, "/v1/models/pair:predict", dumps({"instances": [{"a": [1.0, 2.0], "b": 3}]}))
    assert response.status_code == 200
    assert response.json() == {"predictions": [{"total": 6.0, "doubled": [2.0, 4.0]}]}
