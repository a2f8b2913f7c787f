"""Generate the TensorFlow checkpoint fixtures under tests/fixtures/tf_checkpoint/.

Run with a throwaway TensorFlow environment (never a project dependency):

    /tmp/tfenv/bin/python tools/make_tf_checkpoint_fixtures.py                  # every fixture
    /tmp/tfenv/bin/python tools/make_tf_checkpoint_fixtures.py --tf1-inference  # only tf1/inference.npz

It writes, next to each checkpoint, TensorFlow's own view of it
(`tf.train.list_variables` names/shapes/dtypes as JSON and
`tf.train.load_variable` values as `.npz`), so the tests check our pure-Python
reader against TensorFlow without importing it.

Fixtures:
  tf1/       TF1 graph-mode model (dense -> batch_normalization -> dense_1),
             AdamOptimizer, 2 steps, Saver -> model.ckpt-2 + checkpoint file; inference.npz
             holds the output of the same model restored from it with batch norm in inference
             mode (moving statistics) on a fixed input.
  tf2/       tf.train.Checkpoint(model=Keras 3 model (Dense, BatchNormalization,
             Dense), optimizer=Adam) after one train step -> ckpt-1.
  tf2_slots/ tf.train.Checkpoint(model=tf.Module, optimizer=tf.compat.v1.train.AdamOptimizer)
             after one step: slot variables recorded in the object graph (.OPTIMIZER_SLOT keys).
  raw/       tf.raw_ops.SaveV2 with a string tensor, an int64 scalar, every plain numeric
             dtype, and a variable saved as 3 slices (partitioned).
  sharded/   tf.train.Checkpoint saved with a max-shard-size policy -> 3 data shards.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import tensorflow as tf

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tf_checkpoint")


def record_view(prefix: str, out_stem: str) -> None:
    """Write TF's own list_variables/load_variable view of one checkpoint."""
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    listing = []
    values = {}
    for name, shape in tf.train.list_variables(prefix):
        value = tf.train.load_variable(prefix, name)
        dtype = dtypes[name]
        listing.append({"name": name, "shape": list(shape), "dtype": dtype.name})
        if dtype == tf.string:
            value = np.asarray(value, dtype=object)
            listing[-1]["string_values"] = [v.hex() for v in np.ravel(value)] if value.ndim else [value.item().hex()]
            continue
        if dtype == tf.bfloat16:
            value = np.asarray(tf.cast(value, tf.float32))
        values[name] = np.asarray(value)
    with open(out_stem + ".json", "w") as handle:
        json.dump(listing, handle, indent=1, sort_keys=True)
    np.savez(out_stem + ".npz", **values)


TF1_EPSILON = 1e-3


def tf1_dense(x, units: int, scope: str):
    # Same variable names as tf.compat.v1.layers.dense (unavailable under Keras 3).
    with tf.compat.v1.variable_scope(scope):
        kernel = tf.compat.v1.get_variable("kernel", [x.shape[-1], units])
        bias = tf.compat.v1.get_variable("bias", [units], initializer=tf.compat.v1.zeros_initializer())
    return tf.matmul(x, kernel) + bias


def tf1_batch_norm_variables(units: int):
    """gamma, beta, moving_mean, moving_variance under tf.compat.v1.layers.batch_normalization's names."""
    with tf.compat.v1.variable_scope("batch_normalization"):
        gamma = tf.compat.v1.get_variable("gamma", [units], initializer=tf.compat.v1.ones_initializer())
        beta = tf.compat.v1.get_variable("beta", [units], initializer=tf.compat.v1.zeros_initializer())
        moving_mean = tf.compat.v1.get_variable(
            "moving_mean", [units], initializer=tf.compat.v1.zeros_initializer(), trainable=False
        )
        moving_variance = tf.compat.v1.get_variable(
            "moving_variance", [units], initializer=tf.compat.v1.ones_initializer(), trainable=False
        )
    return gamma, beta, moving_mean, moving_variance


def make_tf1(directory: str) -> None:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        inputs = tf.compat.v1.placeholder(tf.float32, [None, 4], name="inputs")
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1], name="labels")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        hidden = tf1_dense(inputs, 8, "dense")
        gamma, beta, moving_mean, moving_variance = tf1_batch_norm_variables(8)
        mean, variance = tf.nn.moments(hidden, [0])
        updates = [
            tf.compat.v1.assign_sub(moving_mean, (moving_mean - mean) * 0.01),
            tf.compat.v1.assign_sub(moving_variance, (moving_variance - variance) * 0.01),
        ]
        normalized = tf.nn.batch_normalization(hidden, mean, variance, beta, gamma, TF1_EPSILON)
        outputs = tf1_dense(tf.nn.relu(normalized), 1, "dense_1")
        loss = tf.reduce_mean(tf.square(outputs - labels))
        with tf.control_dependencies(updates):
            train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=global_step)
        saver = tf.compat.v1.train.Saver()
        rng = np.random.default_rng(0)
        feed = {
            inputs: rng.normal(size=(16, 4)).astype(np.float32),
            labels: rng.normal(size=(16, 1)).astype(np.float32),
        }
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                session.run(train, feed)
            prefix = saver.save(
                session, os.path.join(directory, "model.ckpt"), global_step=global_step, write_meta_graph=False
            )
    # Saver writes an absolute path; a relative one keeps the fixture relocatable (TF accepts both).
    with open(os.path.join(directory, "checkpoint"), "w") as handle:
        handle.write('model_checkpoint_path: "model.ckpt-2"\nall_model_checkpoint_paths: "model.ckpt-2"\n')
    record_view(prefix, os.path.join(directory, "expected"))


def make_tf1_inference(directory: str) -> None:
    """Restore tf1/'s checkpoint into the same model in inference mode and record its output.

    Batch norm uses the moving statistics (training=False), as tf.compat.v1.layers.batch_normalization
    does at inference. Only reads the checkpoint, so the existing files stay byte-identical.
    """
    graph = tf.Graph()
    with graph.as_default():
        inputs = tf.compat.v1.placeholder(tf.float32, [None, 4], name="inputs")
        hidden = tf1_dense(inputs, 8, "dense")
        gamma, beta, moving_mean, moving_variance = tf1_batch_norm_variables(8)
        normalized = tf.nn.batch_normalization(hidden, moving_mean, moving_variance, beta, gamma, TF1_EPSILON)
        outputs = tf1_dense(tf.nn.relu(normalized), 1, "dense_1")
        # This graph holds only the model's variables: the Adam slots, beta powers and global_step stay unread.
        saver = tf.compat.v1.train.Saver()
        probe = np.random.default_rng(3).normal(size=(6, 4)).astype(np.float32)
        with tf.compat.v1.Session() as session:
            saver.restore(session, tf.train.latest_checkpoint(directory))
            result = session.run(outputs, {inputs: probe})
    np.savez(os.path.join(directory, "inference.npz"), inputs=probe, outputs=np.asarray(result))


def make_tf2(directory: str) -> None:
    import keras

    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8), keras.layers.BatchNormalization(), keras.layers.Dense(1)]
    )
    optimizer = keras.optimizers.Adam(0.01)
    rng = np.random.default_rng(1)
    features = rng.normal(size=(16, 4)).astype(np.float32)
    labels = rng.normal(size=(16, 1)).astype(np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(features, training=True) - labels))
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    prefix = checkpoint.save(os.path.join(directory, "ckpt"))
    record_view(prefix, os.path.join(directory, "expected"))
    # The Keras view: each layer's weights by layer index, and the inference output.
    weights = {}
    for index, layer in enumerate(model.layers):
        for weight in layer.weights:
            weights[f"{index}/{weight.name}"] = np.asarray(weight.numpy())
    np.savez(os.path.join(directory, "keras_weights.npz"), **weights)
    probe = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
    np.savez(os.path.join(directory, "inference.npz"), inputs=probe, outputs=np.asarray(model(probe, training=False)))


def make_tf2_slots(directory: str) -> None:
    module = tf.Module()
    module.dense = tf.Module()
    module.dense.kernel = tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2) / 10, name="kernel")
    module.dense.bias = tf.Variable(np.zeros(2, np.float32), name="bias")
    optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(tf.ones([1, 3]) @ module.dense.kernel + module.dense.bias))
    variables = [module.dense.kernel, module.dense.bias]
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    prefix = tf.train.Checkpoint(model=module, optimizer=optimizer).save(os.path.join(directory, "ckpt"))
    record_view(prefix, os.path.join(directory, "expected"))


def make_raw(directory: str) -> None:
    prefix = os.path.join(directory, "raw")
    tensors = {
        "strings": tf.constant([b"alpha", b"", b"\xff\x00binary"]),
        "string_matrix": tf.constant([[b"a", b"bc"], [b"def", b""]]),
        "string_scalar": tf.constant(b"hello"),
        "global_step": tf.constant(123456789012, tf.int64),
        "float16": tf.constant([1.5, -2.25, 65504.0], tf.float16),
        "bfloat16": tf.constant([1.0, -3.5, 0.15625], tf.bfloat16),
        "float64": tf.constant([[1e300, -0.1]], tf.float64),
        "int8": tf.constant([-128, 127], tf.int8),
        "int16": tf.constant([-32768, 7], tf.int16),
        "int32": tf.constant([[1, -2], [3, 2147483647]], tf.int32),
        "uint8": tf.constant([0, 255], tf.uint8),
        "uint16": tf.constant([65535], tf.uint16),
        "uint32": tf.constant([4294967295], tf.uint32),
        "uint64": tf.constant([18446744073709551615], tf.uint64),
        "bool": tf.constant([True, False, True]),
        "complex64": tf.constant([1 + 2j], tf.complex64),
        "empty": tf.zeros([0, 3], tf.float32),
    }
    names = sorted(tensors)
    full = np.arange(12, dtype=np.float32).reshape(6, 2)
    slice_names = ["emb"] * 3
    slice_specs = ["6 2 0,2:-", "6 2 2,2:-", "6 2 4,2:-"]
    slice_values = [full[0:2], full[2:4], full[4:6]]
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names + slice_names,
        shape_and_slices=[""] * len(names) + slice_specs,
        tensors=[tensors[name] for name in names] + [tf.constant(v) for v in slice_values],
    )
    record_view(prefix, os.path.join(directory, "expected"))


def make_sharded(directory: str) -> None:
    module = tf.Module()
    module.first = tf.Variable(np.arange(64, dtype=np.float32))
    module.second = tf.Variable(np.arange(64, dtype=np.float64) * -1)
    module.third = tf.Variable(np.arange(32, dtype=np.int32))
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=300)
    options = tf.train.CheckpointOptions(experimental_sharding_callback=policy)
    prefix = tf.train.Checkpoint(module=module).write(os.path.join(directory, "ckpt"), options=options)
    record_view(prefix, os.path.join(directory, "expected"))


def main() -> None:
    if sys.argv[1:] == ["--tf1-inference"]:
        # Adds tf1/inference.npz from the existing checkpoint without rewriting any other fixture.
        make_tf1_inference(os.path.join(ROOT, "tf1"))
        return
    if sys.argv[1:]:
        raise SystemExit(f"usage: {sys.argv[0]} [--tf1-inference]; received {sys.argv[1:]}")
    for name, maker in [
        ("tf1", make_tf1),
        ("tf2", make_tf2),
        ("tf2_slots", make_tf2_slots),
        ("raw", make_raw),
        ("sharded", make_sharded),
    ]:
        directory = os.path.join(ROOT, name)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        maker(directory)
        if name == "tf1":
            make_tf1_inference(directory)
        print(name, sorted(os.listdir(directory)), file=sys.stderr)


if __name__ == "__main__":
    main()
