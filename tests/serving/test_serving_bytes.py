"""End to end: bytes receivers behind a real `torchestimator serve --enable_batching` process.

A tiny CNN trained on digit images (PNG and JPEG, decoded by the input_fn with ImageDecoding) and a
parsing-receiver classifier on the digits' pixels: Estimator.predict, ExportedModel and TF Serving's REST
requests ({"b64"} images, serialized Examples, :classify and :regress examples) give the same answers.
"""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchestimator as te
from torchestimator.data import FixedLenFeature, encode_example
from torchestimator.export import (
    ClassificationOutput,
    PredictOutput,
    RegressionOutput,
    build_image_serving_input_receiver,
    build_parsing_serving_input_receiver,
    load,
)
from torchestimator.serving import Client

pytestmark = pytest.mark.slow

CONFIG = {"save_checkpoints_steps": 50, "log_step_count_steps": None, "progress_bar": False, "random_seed": 0}


def _digits():
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = (digits.images[:96] * (255 / 16)).astype(np.uint8)  # 8x8, 0..16 -> 0..255
    return pixels, digits.target[:96].astype(np.int64), digits.data[:96].astype(np.float32)


def _encode(pixels: np.ndarray, index: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    image = Image.fromarray(np.kron(pixels, np.ones((2, 2), np.uint8)))  # 16x16, so the receiver resizes
    if index % 2:
        image.save(buffer, format="JPEG", quality=95)
    else:
        image.save(buffer, format="PNG")
    return buffer.getvalue()


def _image_model_fn(model, features, labels, mode):
    logits = model(features["image"])
    predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(mode, predictions=predictions)
    return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))


def _pixels_model_fn(model, features, labels, mode):
    logits = model(features["x"])
    predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
    if mode == te.ModeKeys.PREDICT:
        return te.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={
                "serving_default": PredictOutput(predictions),
                "tensorflow/serving/classify": ClassificationOutput(scores=predictions["probabilities"]),
                "tensorflow/serving/regress": RegressionOutput(logits.max(-1).values),
            },
        )
    return te.EstimatorSpec(mode, predictions=predictions, loss=F.cross_entropy(logits, labels))


def _optimizer(parameters):
    return torch.optim.Adam(parameters, lr=0.01)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Both models exported and served by one `torchestimator serve --enable_batching` process."""
    root = tmp_path_factory.mktemp("bytes")
    pixels, labels, flat = _digits()
    encoded = [_encode(image, index) for index, image in enumerate(pixels)]
    decoding = te.data.ImageDecoding(size=(12, 12), channels=1, layout="CHW", scale=1 / 255)

    def image_input_fn(mode_labels):
        # The input_fn decodes as the receiver will: the one ImageDecoding both share.
        return te.numpy_input_fn(
            {"image": decoding.decode_batch(encoded)},
            mode_labels,
            batch_size=32,
            num_epochs=None if mode_labels is not None else 1,
            shuffle=mode_labels is not None,
        )

    images = te.Estimator(
        model_fn=_image_model_fn,
        optimizer=_optimizer,
        model_dir=str(root / "images_run"),
        model=lambda: nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 10 * 10, 10)),
        config=te.RunConfig(**CONFIG),
    )
    images.train(image_input_fn(labels), max_steps=40)
    images.export_saved_model(root / "models" / "images", build_image_serving_input_receiver(decoding))
    pixels_estimator = te.Estimator(
        model_fn=_pixels_model_fn,
        optimizer=_optimizer,
        model_dir=str(root / "pixels_run"),
        model=lambda: nn.Linear(64, 10),
        config=te.RunConfig(**CONFIG),
    )
    pixels_estimator.train(
        te.numpy_input_fn({"x": flat}, labels, batch_size=32, num_epochs=None, shuffle=True), max_steps=40
    )
    pixels_estimator.export_saved_model(
        root / "models" / "pixels", build_parsing_serving_input_receiver({"x": FixedLenFeature([64], "float32")})
    )
    config = root / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f'  config {{ name: "{name}" base_path: "{root / "models" / name}" model_platform: "tensorflow" }}\n'
            for name in ("images", "pixels")
        )
        + "}\n"
    )
    command = [
        sys.executable,
        "-m",
        "torchestimator.cli",
        "serve",
        "--model_config_file",
        str(config),
        "--rest_api_port",
        "0",
        "--enable_batching",
    ]
    server = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = None
        for _ in range(20):  # the announce line; readline returns "" if the server dies first
            line = server.stdout.readline()
            found = re.search(r"(http://127\.0\.0\.1:\d+)/v1/models/", line)
            if found or not line:
                url = found and found.group(1)
                break
        assert url, f"the server did not announce its port (last line {line!r})"
        yield {
            "url": url,
            "encoded": encoded,
            "flat": flat,
            "decoding": decoding,
            "images": images,
            "pixels": pixels_estimator,
            "root": root,
        }
    finally:
        server.terminate()
        server.wait(timeout=60)


def _b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode()}


def test_image_classes_agree_between_estimator_exported_model_and_rest_b64(served):
    encoded, decoding = served["encoded"], served["decoding"]
    expected = [
        row["class"]
        for row in served["images"].predict(
            te.numpy_input_fn({"image": decoding.decode_batch(encoded)}, batch_size=32, shuffle=False)
        )
    ]
    exported = load(served["root"] / "models" / "images")
    assert exported(encoded)["class"].tolist() == expected
    client = Client(served["url"], "images")
    # TF Serving's documented image-classification request: {"instances": [{"b64": ...}]}.
    rows = client.predict([_b64(item) for item in encoded[:48]]) + client.predict(
        [{"image_bytes": _b64(item)} for item in encoded[48:]]
    )
    assert [row["class"] for row in rows] == expected
    columnar = client.predict({"image_bytes": encoded[:5]}, columnar=True)  # the client sends bytes as {"b64"}
    assert columnar["class"] == expected[:5]
    assert (
        client.metadata()["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]["image_bytes"][
            "dtype"
        ]
        == "DT_STRING"
    )


def test_serialized_examples_predict_classify_and_regress_through_the_server(served):
    flat = served["flat"]
    expected = list(served["pixels"].predict(te.numpy_input_fn({"x": flat}, batch_size=32, shuffle=False)))
    serialized = [encode_example({"x": row}) for row in flat]
    client = Client(served["url"], "pixels")
    rows = client.predict([_b64(item) for item in serialized])
    assert [row["class"] for row in rows] == [row["class"] for row in expected]
    classified = client.classify(
        [{"x": row.tolist()} for row in flat[:20]], signature_name="tensorflow/serving/classify"
    )
    np.testing.assert_allclose(
        [[score for _, score in row] for row in classified], [row["probabilities"] for row in expected[:20]], rtol=1e-5
    )
    regressed = client.regress([{"x": row.tolist()} for row in flat[:20]], signature_name="tensorflow/serving/regress")
    exported = load(served["root"] / "models" / "pixels")
    np.testing.assert_allclose(
        regressed,
        exported({"examples": serialized[:20]}, signature_name="tensorflow/serving/regress")["outputs"],
        rtol=1e-6,
    )
    # Integers make an int64_list, which the float feature refuses with TF's parse error.
    with pytest.raises(te.serving.ServingClientError) as raised:
        client.regress([{"x": [1] * 64}], signature_name="tensorflow/serving/regress")
    assert raised.value.status == 400 and "Data types don't match" in raised.value.message
