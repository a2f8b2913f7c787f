"""Writes tests/fixtures/receivers/tf_examples.json with real TensorFlow: serialized tf.Examples for the
parsing receiver's tests, TF's parse of them (alone and each after a context Example's bytes, as TF Serving
merges a request's context), and TF's error for a record whose feature has the wrong type.

Run in a throwaway environment with TensorFlow (never a project dependency):

    /tmp/benchenv/bin/python tools/make_receiver_fixtures.py

The tests (tests/test_export_bytes_receivers.py) read the JSON; CI never imports TensorFlow.
"""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import tensorflow as tf

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "receivers", "tf_examples.json")
SPEC = {"x": tf.io.FixedLenFeature([8], tf.float32)}


def example(**features) -> tf.train.Example:
    feature = {}
    for name, values in features.items():
        values = np.asarray(values)
        if values.dtype.kind == "f":
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values.tolist()))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values.tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def main() -> None:
    rng = np.random.default_rng(7)
    rows = rng.normal(0, 3, size=(4, 8)).astype(np.float32)
    examples = [example(x=row).SerializeToString() for row in rows]
    parsed = tf.io.parse_example(examples, SPEC)["x"].numpy()
    # TF Serving's ExampleListWithContext: each example's bytes after the context's (util.cc); an example without
    # "x" takes the context's, one with "x" its own.
    context = example(x=np.full(8, 0.5, np.float32)).SerializeToString()
    with_context = [tf.train.Example().SerializeToString(), examples[1]]
    merged = tf.io.parse_example([context + item for item in with_context], SPEC)["x"].numpy()
    wrong = example(x=np.arange(8, dtype=np.int64)).SerializeToString()
    try:
        tf.io.parse_example([examples[0], wrong], SPEC)
    except tf.errors.InvalidArgumentError as error:
        wrong_message = error.message
    else:
        raise AssertionError("TF parsed an int64 feature as float")
    document = {
        "tensorflow_version": tf.__version__,
        "spec": {"x": {"shape": [8], "dtype": "float32"}},
        "examples": [b64(item) for item in examples],
        "parsed_x": parsed.tolist(),
        "context": b64(context),
        "with_context": [b64(item) for item in with_context],
        "with_context_parsed_x": merged.tolist(),
        "wrong_type": b64(wrong),
        "wrong_type_error": wrong_message,
    }
    with open(OUT, "w") as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")
    print(f"wrote {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
