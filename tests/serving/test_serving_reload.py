"""Hot reload under load: no request fails while versions are swapped, and multi-version paths answer."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from aiohttp.test_utils import TestClient, TestServer
from helpers import input_fns, make_estimator, wait_until

import torchestimator as te
from torchestimator.export import PredictOutput, TensorSpec, export_saved_model, load, serving_input_receiver
from torchestimator.serving import ModelManager, make_app
from torchestimator.serving.config import ModelConfig, VersionPolicy

RECEIVER = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})
VERSIONS = (1, 2, 3, 4)
CLIENTS = 8
TIME_LIMIT_SECONDS = 60


def model_fn(model, features, labels, mode):
    logits = model(features["x"])
    probabilities = logits.softmax(-1)
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(
            mode,
            predictions={"probabilities": probabilities},
            export_outputs={"serving_default": PredictOutput({"probabilities": probabilities})},
        )
    return te.EstimatorSpec(mode, predictions={"probabilities": probabilities}, loss=F.cross_entropy(logits, labels))


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Four exports of one classifier at different training steps, and what each answers for the same input."""
    root = tmp_path_factory.mktemp("reload")
    train, _, _, (x, _) = input_fns(n=64)
    estimator = make_estimator(root / "model", model_fn=model_fn)
    exports, expected = {}, {}
    for version in VERSIONS:
        estimator.train(train, max_steps=3 * version)
        exports[version] = export_saved_model(estimator, root / f"stage{version}", RECEIVER)
        expected[version] = load(exports[version])({"x": x[:2]})["probabilities"]
    for first in VERSIONS:  # distinct answers, so a response tells which version made it
        for second in VERSIONS[first:]:
            assert not np.allclose(expected[first], expected[second], rtol=1e-4, atol=1e-6)
    return {"exports": exports, "expected": expected, "x": x[:2]}


def publish(exports, base, version):
    """Copies an export in under a non-integer name first, so a poll never sees half a version."""
    staging = base / f"temp-{version}"
    shutil.copytree(exports[version], staging)
    os.rename(staging, base / str(version))


def version_answering(predictions, expected) -> int:
    matches = [
        version for version, outputs in expected.items() if np.allclose(predictions, outputs, rtol=1e-5, atol=1e-6)
    ]
    assert len(matches) == 1, (predictions, matches)
    return matches[0]


def test_no_request_fails_while_versions_are_swapped_under_load(versions, tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    publish(versions["exports"], base, VERSIONS[0])
    manager = ModelManager("m", base)
    assert manager.poll() and manager.served_versions == [VERSIONS[0]]
    body = json.dumps({"instances": versions["x"].tolist()})
    answers: list[tuple[int, str, bool]] = []  # status, body, sent after the last swap

    def swap_all() -> list[int]:
        """Publishes each new version, polls, and deletes the old folder once it is unloaded."""
        unloaded = []
        for previous, version in itertools.pairwise(VERSIONS):
            # Each client has at most one request in flight, so CLIENTS + 1 more answers include one that
            # was sent after `previous` became the served version: every version answers some traffic.
            enough = len(answers) + CLIENTS + 1
            wait_until(lambda: len(answers) >= enough, interval=0.005, what=f"requests reaching version {previous}")
            publish(versions["exports"], base, version)
            assert manager.poll() and manager.served_versions == [version]
            shutil.rmtree(base / str(previous))
            unloaded.append(previous)
        return unloaded

    async def main():
        done = asyncio.Event()
        async with TestClient(TestServer(make_app(manager))) as client:

            async def hammer():
                while len(answers) < 5000:
                    after_swaps = done.is_set()
                    async with client.post("/v1/models/m:predict", data=body) as response:
                        answers.append((response.status, await response.text(), after_swaps))
                    if after_swaps:  # one request each once every swap is over
                        break

            clients = [asyncio.create_task(hammer()) for _ in range(CLIENTS)]
            loop = asyncio.get_running_loop()
            try:
                unloaded = await asyncio.wait_for(loop.run_in_executor(None, swap_all), TIME_LIMIT_SECONDS)
            finally:
                done.set()
                await asyncio.wait_for(asyncio.gather(*clients), TIME_LIMIT_SECONDS)
        return unloaded

    unloaded = asyncio.run(main())
    failed = [(status, text) for status, text, _ in answers if status != 200]
    assert failed == []
    answered = [
        (version_answering(json.loads(text)["predictions"], versions["expected"]), after_swaps)
        for _, text, after_swaps in answers
    ]
    assert {version for version, _ in answered} == set(VERSIONS)  # the swaps happened under traffic
    final = [version for version, after_swaps in answered if after_swaps]
    assert final == [VERSIONS[-1]] * CLIENTS and manager.served_version == VERSIONS[-1]
    assert unloaded == list(VERSIONS[:-1]) and os.listdir(base) == [str(VERSIONS[-1])]
    assert {status.version: status.state for status in manager.statuses()} == {
        **dict.fromkeys(VERSIONS[:-1], "END"),
        VERSIONS[-1]: "AVAILABLE",
    }


def call(app, *paths):
    """Sends requests (path, body or None for GET) to a fresh app (one per event loop); returns [(status, json)]."""

    async def main():
        async with TestClient(TestServer(app)) as client:
            answers = []
            for path, body in paths:
                method = "GET" if body is None else "POST"
                async with client.request(method, path, data=None if body is None else json.dumps(body)) as response:
                    answers.append((response.status, json.loads(await response.text())))
            return answers

    return asyncio.run(main())


def test_all_and_specific_policies_serve_each_version_at_its_own_path(versions, tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    for version in VERSIONS[:3]:
        publish(versions["exports"], base, version)
    manager = ModelManager("m", base, version_policy=VersionPolicy(kind="all"))
    assert manager.poll() and manager.served_versions == [1, 2, 3]
    request = {"instances": versions["x"].tolist()}
    answers = call(
        make_app(manager),
        ("/v1/models/m/versions/1:predict", request),
        ("/v1/models/m/versions/3:predict", request),
        ("/v1/models/m:predict", request),
        ("/v1/models/m", None),
    )
    assert [status for status, _ in answers] == [200] * 4
    assert [version_answering(body["predictions"], versions["expected"]) for _, body in answers[:3]] == [1, 3, 3]
    assert [(entry["version"], entry["state"]) for entry in answers[3][1]["model_version_status"]] == [
        ("1", "AVAILABLE"),
        ("2", "AVAILABLE"),
        ("3", "AVAILABLE"),
    ]

    # Roll back to version 1 only (a config reload): 2 and 3 go once 1 is known to serve.
    assert manager.apply_config(
        ModelConfig(name="m", base_path=str(base), version_policy=VersionPolicy(kind="specific", versions=(1,)))
    )
    (one, one_body), (three, three_body), (latest, latest_body) = call(
        make_app(manager),
        ("/v1/models/m/versions/1:predict", request),
        ("/v1/models/m/versions/3:predict", request),
        ("/v1/models/m:predict", request),
    )
    assert one == 200 and version_answering(one_body["predictions"], versions["expected"]) == 1
    assert three == 404 and "Specific(m, 3)" in three_body["error"]
    assert latest == 200 and version_answering(latest_body["predictions"], versions["expected"]) == 1
