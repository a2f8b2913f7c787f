"""Make the whole-model fixtures in tests/fixtures/keras_models/ with real Keras 3 (issue 31).

Not part of the package and never run by CI: TensorFlow and Keras live in a throwaway virtual environment, and
what this script writes is committed.

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu==2.21.0 keras==3.15.1 h5py
    /tmp/tfvenv/bin/python tools/make_keras_model_fixtures.py

Each model gets deterministic weights (every variable drawn from one seeded generator, BatchNorm variances
positive and far from 1), is saved as ``<name>.keras`` and ``<name>.h5`` (Keras 3's legacy HDF5 with
``model_config``), and Keras's own inference outputs go to ``<name>.npz``: ``input_<i>`` in the model's input
order and ``output_<i>`` in its output order, from ``model(inputs, training=False)``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
from keras import layers

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "keras_models"


def mlp() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((8,)),
            layers.Dense(16, activation="relu", name="hidden"),
            layers.Dropout(0.3, name="dropout"),
            layers.Dense(3, activation="softmax", name="probabilities"),
        ],
        name="mlp",
    )


def cnn() -> keras.Model:
    """'same' at stride 2 (TF pads more at the end), BatchNormalization, pooling, NHWC flatten order."""
    image = keras.Input((12, 11, 3), name="image")
    x = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu", name="conv1")(image)
    x = layers.BatchNormalization(epsilon=1e-3, name="bn1")(x)
    x = layers.MaxPooling2D(2, padding="same", name="pool1")(x)
    x = layers.Conv2D(6, 2, padding="valid", use_bias=False, name="conv2")(x)
    x = layers.Activation("tanh", name="tanh")(x)
    x = layers.Flatten(name="flatten")(x)
    logits = layers.Dense(5, name="logits")(x)
    return keras.Model(image, logits, name="cnn")


def two_towers() -> keras.Model:
    """Two inputs, a shared layer, a residual Add, a Concatenate and two outputs."""
    left, right = keras.Input((6,), name="left"), keras.Input((6,), name="right")
    shared = layers.Dense(6, activation="elu", name="shared")
    a, b = shared(left), shared(right)
    residual = layers.Add(name="residual")([a, left])
    joined = layers.Concatenate(name="joined")([residual, b])
    score = layers.Dense(1, activation="sigmoid", name="score")(joined)
    classes = layers.Dense(4, name="classes")(layers.Multiply(name="gate")([a, b]))
    return keras.Model([left, right], [score, classes], name="two_towers")


MODELS = {"mlp": mlp, "cnn": cnn, "two_towers": two_towers}


def deterministic_weights(model: keras.Model, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape = tuple(variable.shape)
        if variable.path.endswith("moving_variance"):
            value = rng.uniform(0.5, 2.0, size=shape)
        else:
            value = rng.normal(0.0, 0.5, size=shape)
        variable.assign(value.astype(np.float32))


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for seed, (name, build) in enumerate(MODELS.items()):
        model = build()
        deterministic_weights(model, seed)
        rng = np.random.default_rng(100 + seed)
        inputs = [rng.normal(size=(3, *tensor.shape[1:])).astype(np.float32) for tensor in model.inputs]
        outputs = model(inputs if len(inputs) > 1 else inputs[0], training=False)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        model.save(OUT / f"{name}.keras")
        model.save(OUT / f"{name}.h5")
        np.savez(
            OUT / f"{name}.npz",
            **{f"input_{index}": value for index, value in enumerate(inputs)},
            **{f"output_{index}": np.asarray(value) for index, value in enumerate(outputs)},
        )
        print(f"{name}: {[tuple(i.shape) for i in inputs]} -> {[tuple(np.asarray(o).shape) for o in outputs]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
