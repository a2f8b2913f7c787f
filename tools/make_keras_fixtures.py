"""Make the Keras HDF5 interop fixtures in tests/fixtures/keras/ with real Keras.

Not part of the package and never run by CI: TensorFlow, Keras 3 and tf_keras
(Keras 2) live in a throwaway virtual environment, and what this script writes
is committed.

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu==2.21.0 numpy
    /tmp/tfenv/bin/pip install --no-deps tf_keras==2.21.0   # Keras 2; --no-deps keeps tensorflow-cpu
    /tmp/tfenv/bin/python tools/make_keras_fixtures.py

One small model, Input(8x8x3) -> Conv2D(4, 3) "conv" -> BatchNormalization
"bn" -> ReLU "relu" -> Flatten "flatten" -> Dense(5) "fc", gets the same
deterministic weights in both Keras versions (BatchNorm statistics far from 0
and 1, so a reader that mixes up gamma/beta/mean/variance gives wrong outputs),
then is saved as:

* keras3_model.h5           Keras 3 ``model.save('x.h5')`` (legacy layout, names without ``:0``)
* keras3_model.weights.h5   Keras 3 ``model.save_weights('x.weights.h5')``
* keras3_model.keras        Keras 3 ``model.save('x.keras')`` (zip: config.json, metadata.json, model.weights.h5)
* keras2_weights.h5         tf_keras ``model.save_weights('x.h5')`` (names with ``:0``)
* keras2_model.h5           tf_keras ``model.save('x.h5')`` (weights under /model_weights)

and Keras's own view of it:

* reference.npz   ``input`` (2, 8, 8, 3) float32; ``keras3_output`` and
  ``keras2_output`` (2, 5), each version's ``model(input)`` in inference mode;
  ``<layer>/<i>`` = ``layer.get_weights()[i]`` from Keras 3 (Keras 2 is checked
  equal before writing).
* reference.json  layer order and the Keras 3 variable names (``w.path``) and
  Keras 2 names (``w.name``) of each layer's weights, in get_weights() order.

A second Keras 3 model exercises the harder parts of the ``.weights.h5``
layout: an LSTM (its variables live under ``layers/lstm/cell/vars``), a Dense
without bias, a nested Sequential holding a BatchNormalization(scale=False),
layer names that do not match their class, and Adam state after one step:

* keras3_nested.weights.h5, keras3_nested.keras
* reference_nested.npz   ``w.path`` -> value for every model variable
* reference_nested.json  ``[w.path, shape]`` in ``model.weights`` order, and the model's layer names
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "keras")
SEED = 20240604


def build_model(keras_module):
    layers = keras_module.layers
    inputs = keras_module.Input(shape=(8, 8, 3), name="image")
    hidden = layers.Conv2D(4, 3, name="conv")(inputs)
    hidden = layers.BatchNormalization(name="bn")(hidden)
    hidden = layers.ReLU(name="relu")(hidden)
    hidden = layers.Flatten(name="flatten")(hidden)
    outputs = layers.Dense(5, name="fc")(hidden)
    return keras_module.Model(inputs, outputs, name="net")


def make_weights() -> dict[str, list[numpy.ndarray]]:
    random = numpy.random.default_rng(SEED)

    def normal(*shape: int, scale: float = 1.0, offset: float = 0.0) -> numpy.ndarray:
        return (random.standard_normal(shape) * scale + offset).astype(numpy.float32)

    return {
        "conv": [normal(3, 3, 3, 4, scale=0.3), normal(4, scale=0.1)],
        "bn": [
            normal(4, scale=0.2, offset=1.0),  # gamma
            normal(4, scale=0.2),  # beta
            normal(4, scale=0.5),  # moving_mean
            random.uniform(0.5, 2.0, 4).astype(numpy.float32),  # moving_variance
        ],
        "fc": [normal(144, 5, scale=0.1), normal(5, scale=0.1)],
    }


def set_and_describe(model, weights) -> tuple[list[str], dict[str, list[str]]]:
    order = []
    names = {}
    for layer in model.layers:
        order.append(layer.name)
        if layer.name in weights:
            layer.set_weights(weights[layer.name])
        names[layer.name] = [getattr(w, "path", w.name) for w in layer.weights]
    return order, names


def make_nested(keras_module, directory: str) -> None:
    layers = keras_module.layers
    inner = keras_module.Sequential(
        [layers.Dense(3, name="inner_fc"), layers.BatchNormalization(scale=False, name="inner_bn")], name="inner"
    )
    inputs = keras_module.Input((4, 2), name="sequence")
    hidden = layers.LSTM(3, name="lstm")(inputs)
    hidden = layers.Dense(4, use_bias=False, name="nobias")(hidden)
    hidden = inner(hidden)
    hidden = layers.Dense(2, name="dense_9")(hidden)
    outputs = layers.Conv1D(2, 1, name="zz")(layers.Reshape((1, 2), name="reshape")(hidden))
    model = keras_module.Model(inputs, outputs, name="outer")
    model.compile("adam", "mse")
    random = numpy.random.default_rng(SEED + 2)
    features = random.standard_normal((8, 4, 2)).astype(numpy.float32)
    model.fit(features, random.standard_normal((8, 1, 2)).astype(numpy.float32), epochs=1, verbose=0)
    model.save_weights(os.path.join(directory, "keras3_nested.weights.h5"))
    model.save(os.path.join(directory, "keras3_nested.keras"))
    numpy.savez(os.path.join(directory, "reference_nested.npz"), **{w.path: numpy.asarray(w) for w in model.weights})
    description = {
        "weights": [[w.path, list(w.shape)] for w in model.weights],
        "layers": [layer.name for layer in model.layers],
    }
    with open(os.path.join(directory, "reference_nested.json"), "w", encoding="utf-8") as handle:
        json.dump(description, handle, indent=1)
        handle.write("\n")


def main(directory: str = DEFAULT_DIR) -> None:
    import keras
    import tf_keras

    os.makedirs(directory, exist_ok=True)
    weights = make_weights()
    batch = numpy.random.default_rng(SEED + 1).standard_normal((2, 8, 8, 3)).astype(numpy.float32)

    model3 = build_model(keras)
    order3, names3 = set_and_describe(model3, weights)
    output3 = numpy.asarray(model3(batch, training=False))
    model3.save(os.path.join(directory, "keras3_model.h5"))
    model3.save_weights(os.path.join(directory, "keras3_model.weights.h5"))
    model3.save(os.path.join(directory, "keras3_model.keras"))

    model2 = build_model(tf_keras)
    order2, names2 = set_and_describe(model2, weights)
    output2 = numpy.asarray(model2(batch, training=False))
    model2.save_weights(os.path.join(directory, "keras2_weights.h5"))
    model2.save(os.path.join(directory, "keras2_model.h5"))

    reference = {"input": batch, "keras3_output": output3, "keras2_output": output2}
    for layer in model3.layers:
        values3 = layer.get_weights()
        values2 = model2.get_layer(layer.name).get_weights()
        assert len(values3) == len(values2), layer.name
        for index, (value3, value2) in enumerate(zip(values3, values2)):
            assert numpy.array_equal(value3, value2), (layer.name, index)
            reference[f"{layer.name}/{index}"] = value3
    numpy.savez(os.path.join(directory, "reference.npz"), **reference)

    with zipfile.ZipFile(os.path.join(directory, "keras3_model.keras")) as archive:
        members = sorted(archive.namelist())
    description = {
        "keras3_version": keras.__version__,
        "keras2_version": tf_keras.__version__,
        "keras3_layer_order": order3,
        "keras2_layer_order": order2,
        "keras3_weight_names": names3,
        "keras2_weight_names": names2,
        "keras_archive_members": members,
    }
    with open(os.path.join(directory, "reference.json"), "w", encoding="utf-8") as handle:
        json.dump(description, handle, indent=1, sort_keys=True)
        handle.write("\n")
    make_nested(keras, directory)
    print("max |keras3 - keras2| output:", float(numpy.abs(output3 - output2).max()))


if __name__ == "__main__":
    main()
