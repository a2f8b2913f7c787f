"""Make the whole-model fixtures in tests/fixtures/keras_models/ with real Keras 3 (issue 31).

Not part of the package and never run by CI: TensorFlow and Keras live in a throwaway virtual environment, and
what this script writes is committed.

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu==2.21.0 keras==3.15.1 h5py
    /tmp/tfvenv/bin/python tools/make_keras_model_fixtures.py

Each model gets deterministic weights (every variable drawn from one seeded generator, BatchNorm variances
positive and far from 1), is saved as ``<name>.keras`` and ``<name>.h5`` (Keras 3's legacy HDF5 with
``model_config``), and Keras's own inference outputs go to ``<name>.npz``: ``input_<i>`` in the model's input
order and ``output_<i>`` in its output order, from ``model(inputs, training=False)`` of the model loaded back from
its ``.keras`` file.
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # keras_skeleton
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


def text() -> keras.Model:
    """Embedding -> Bidirectional LSTM -> GRU -> Dense: a text classifier."""
    tokens = keras.Input((10,), dtype="int32", name="tokens")
    x = layers.Embedding(50, 8, name="embed")(tokens)
    x = layers.Bidirectional(layers.LSTM(6, return_sequences=True), name="bilstm")(x)
    x = layers.GRU(5, name="gru")(x)
    return keras.Model(tokens, layers.Dense(2, activation="softmax", name="out")(x), name="text")


def nested() -> keras.Model:
    """Normalization (adapted statistics), a nested Sequential and a nested two-input Functional model."""
    x = keras.Input((4,), name="x")
    normalized = layers.Normalization(name="norm")
    normalized.adapt(np.random.default_rng(7).normal(3.0, 2.0, size=(64, 4)).astype(np.float32))
    block = keras.Sequential(
        [keras.Input((4,)), layers.Dense(5, activation="relu", name="fc"), layers.BatchNormalization(name="bn")],
        name="block",
    )
    a, b = keras.Input((5,)), keras.Input((4,))
    pair = keras.Model([a, b], layers.Concatenate(name="cat")([layers.Dense(3, name="left_fc")(a), b]), name="pair")
    z = normalized(x)
    y = pair([block(z), z])
    return keras.Model(x, layers.Dense(2, name="head")(y), name="nested")


def masked_text() -> keras.Model:
    """A Sequential text model on padded ids (MASK_IDS): Embedding(mask_zero=True)'s mask flows with no trace in
    the config (a Sequential records no nodes), kept by Dense, taken by LSTM and GlobalAveragePooling1D."""
    return keras.Sequential(
        [
            keras.Input((8,), dtype="int32"),
            layers.Embedding(12, 6, mask_zero=True, name="embed"),
            layers.LSTM(5, return_sequences=True, name="lstm"),
            layers.Dense(4, activation="tanh", name="dense"),
            layers.GlobalAveragePooling1D(name="average"),
            layers.Dense(2, name="logits"),
        ],
        name="masked_text",
    )


def seq2seq() -> keras.Model:
    """Keras's encoder-decoder: the encoder LSTM's states (return_state) start the decoder LSTM (initial_state);
    a GRU's state comes out as a second output."""
    source, target = keras.Input((7, 5), name="source"), keras.Input((6, 4), name="target")
    _, state_h, state_c = layers.LSTM(8, return_state=True, name="encoder")(source)
    decoded = layers.LSTM(8, return_sequences=True, name="decoder")(target, initial_state=[state_h, state_c])
    words = layers.Dense(4, activation="softmax", name="words")(decoded)
    summary, gru_state = layers.GRU(3, return_state=True, go_backwards=True, name="summary")(decoded)
    return keras.Model([source, target], [words, layers.Add(name="both")([summary, gru_state])], name="seq2seq")


MODELS = {
    "mlp": mlp,
    "cnn": cnn,
    "two_towers": two_towers,
    "text": text,
    "nested": nested,
    "masked_text": masked_text,
    "seq2seq": seq2seq,
}


def deterministic_weights(model: keras.Model, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape = tuple(variable.shape)
        if variable.path.endswith("variance"):
            value = rng.uniform(0.5, 2.0, size=shape)
        elif variable.path.endswith("count"):
            value = np.full(shape, 64.0)
        else:
            value = rng.normal(0.0, 0.5, size=shape)
        variable.assign(value.astype(np.float32))


def layer_cases() -> dict[str, tuple]:
    """One layer alone per case, in each configuration that changes the math: name -> (input shapes, layer[, how
    to call it on the inputs])."""
    L = layers
    image, sequence, vector = (7, 6, 4), (9, 4), (5,)
    cases: dict[str, tuple] = {
        "dense_relu": ([vector], L.Dense(3, activation="relu")),
        "dense_no_bias_rank3": ([sequence], L.Dense(3, use_bias=False)),
        "conv1d_causal_dilated": ([sequence], L.Conv1D(3, 3, padding="causal", dilation_rate=2)),
        "conv1d_same_stride2": ([sequence], L.Conv1D(3, 4, strides=2, padding="same")),
        "conv2d_valid_stride2": ([image], L.Conv2D(5, 3, strides=2)),
        "conv2d_same_dilated": ([image], L.Conv2D(5, 3, padding="same", dilation_rate=2, activation="sigmoid")),
        "conv2d_same_even_kernel": ([image], L.Conv2D(3, (2, 4), strides=(1, 3), padding="same")),
        "conv2d_groups": ([image], L.Conv2D(6, 3, groups=2, padding="same")),
        "conv3d_same": ([(4, 5, 3, 2)], L.Conv3D(3, 2, strides=2, padding="same")),
        "depthwise_same_stride2": ([image], L.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2)),
        "separable_same": ([image], L.SeparableConv2D(5, 3, padding="same", depth_multiplier=2, activation="relu")),
        "conv2d_transpose_valid": ([image], L.Conv2DTranspose(3, 3, strides=2)),
        "conv2d_transpose_same": ([image], L.Conv2DTranspose(3, 4, strides=2, padding="same")),
        "conv2d_transpose_small_kernel": ([image], L.Conv2DTranspose(3, 1, strides=2)),
        "conv1d_transpose_same": ([sequence], L.Conv1DTranspose(2, 3, strides=2, padding="same")),
        "batchnorm_no_scale_center": ([image], L.BatchNormalization(scale=False, center=False, epsilon=0.01)),
        "batchnorm_axis1": ([sequence], L.BatchNormalization(axis=1)),
        "layernorm": ([sequence], L.LayerNormalization()),
        "layernorm_two_axes": ([image], L.LayerNormalization(axis=[1, 2], center=False)),
        "maxpool2d_same": ([image], L.MaxPooling2D(3, strides=2, padding="same")),
        "avgpool2d_same": ([image], L.AveragePooling2D(3, strides=2, padding="same")),
        "avgpool1d_valid": ([sequence], L.AveragePooling1D(2)),
        "maxpool1d_same": ([sequence], L.MaxPooling1D(2, padding="same")),
        "global_avg_keepdims": ([image], L.GlobalAveragePooling2D(keepdims=True)),
        "global_max_1d": ([sequence], L.GlobalMaxPooling1D()),
        "zeropadding2d": ([image], L.ZeroPadding2D(((1, 2), (0, 3)))),
        "zeropadding1d": ([sequence], L.ZeroPadding1D((2, 1))),
        "cropping2d": ([image], L.Cropping2D(((1, 2), (2, 1)))),
        "cropping1d": ([sequence], L.Cropping1D((1, 3))),
        "flatten": ([image], L.Flatten()),
        "reshape": ([image], L.Reshape((21, 8))),
        "permute": ([image], L.Permute((3, 1, 2))),
        "upsampling2d_nearest": ([image], L.UpSampling2D((2, 3))),
        "upsampling2d_bilinear": ([image], L.UpSampling2D(2, interpolation="bilinear")),
        "upsampling1d": ([sequence], L.UpSampling1D(3)),
        "relu_max_slope_threshold": ([vector], L.ReLU(max_value=0.5, negative_slope=0.1, threshold=0.2)),
        "leaky_relu": ([vector], L.LeakyReLU(negative_slope=0.25)),
        "prelu": ([sequence], L.PReLU()),
        "elu": ([vector], L.ELU(alpha=0.7)),
        "softmax_axis1": ([sequence], L.Softmax(axis=1)),
        "rescaling": ([image], L.Rescaling(1 / 127.5, offset=-1.0)),
        "embedding": ([(6,)], L.Embedding(11, 4)),
        "dot_normalized": ([vector, vector], L.Dot(axes=1, normalize=True)),
        "dot_sequences": ([sequence, sequence], L.Dot(axes=(2, 2))),
        "subtract": ([vector, vector], L.Subtract()),
        "average": ([vector, vector], L.Average()),
        "maximum": ([vector, vector], L.Maximum()),
        "minimum": ([vector, vector], L.Minimum()),
        "concatenate_axis1": ([sequence, sequence], L.Concatenate(axis=1)),
        "normalization_given": ([vector], L.Normalization(mean=[1, 2, 3, 4, 5], variance=[1, 4, 0.25, 2, 0])),
        "normalization_invert": (
            [vector],
            L.Normalization(mean=[1, 0, 0, 2, 0], variance=[4, 1, 1, 9, 1], invert=True),
        ),
        "resizing_bilinear_up": ([image], L.Resizing(11, 9)),
        "resizing_bilinear_down": ([(13, 12, 2)], L.Resizing(5, 7)),
        "resizing_nearest": ([image], L.Resizing(10, 4, interpolation="nearest")),
        "mha_self": ([sequence], L.MultiHeadAttention(2, 3), lambda layer, x: layer(x[0], x[0])),
        "mha_cross_key": (
            [sequence, (6, 3), (6, 5)],
            L.MultiHeadAttention(3, 2, value_dim=4, use_bias=False),
            lambda layer, x: layer(x[0], x[1], key=x[2]),
        ),
        "mha_causal": (
            [sequence],
            L.MultiHeadAttention(2, 4),
            lambda layer, x: layer(x[0], x[0], use_causal_mask=True),
        ),
        "lstm_sequences": ([sequence], L.LSTM(5, return_sequences=True)),
        "lstm_backwards_last": ([sequence], L.LSTM(3, go_backwards=True)),
        "gru_reset_after": ([sequence], L.GRU(4, return_sequences=True)),
        "gru_reset_before": ([sequence], L.GRU(4, reset_after=False)),
        "gru_backwards_sequences": ([sequence], L.GRU(3, go_backwards=True, return_sequences=True)),
        "simple_rnn_relu": ([sequence], L.SimpleRNN(3, activation="relu", return_sequences=True)),
        "bidirectional_lstm_concat": ([sequence], L.Bidirectional(L.LSTM(3, return_sequences=True))),
        "bidirectional_gru_sum_last": ([sequence], L.Bidirectional(L.GRU(3), merge_mode="sum")),
        "time_distributed_dense": ([sequence], L.TimeDistributed(L.Dense(2, activation="tanh"))),
        "time_distributed_conv": ([(3, 6, 5, 2)], L.TimeDistributed(L.Conv2D(2, 3, padding="same"))),
    }
    for name in ACTIVATION_NAMES:
        cases[f"activation_{name}"] = ([vector], L.Activation(name))
    # data_format="channels_first": the same layers on [batch, channels, *spatial] data (added after the cases
    # above so that their seeds, from their positions, stay as they were).
    cf, planes, steps = "channels_first", (4, 7, 6), (4, 9)
    cases.update(
        {
            "cf_conv2d_same_stride2": ([planes], L.Conv2D(5, 3, strides=2, padding="same", data_format=cf)),
            "cf_conv1d_same": ([steps], L.Conv1D(3, 4, strides=2, padding="same", data_format=cf)),
            "cf_conv3d_valid": ([(2, 4, 5, 3)], L.Conv3D(3, 2, data_format=cf)),
            "cf_depthwise_same": ([planes], L.DepthwiseConv2D(3, strides=2, padding="same", data_format=cf)),
            "cf_separable_same": ([planes], L.SeparableConv2D(5, 3, padding="same", data_format=cf)),
            "cf_conv2d_transpose_same": ([planes], L.Conv2DTranspose(3, 3, strides=2, padding="same", data_format=cf)),
            "cf_maxpool2d_same": ([planes], L.MaxPooling2D(3, strides=2, padding="same", data_format=cf)),
            "cf_avgpool2d_same": ([planes], L.AveragePooling2D(3, strides=2, padding="same", data_format=cf)),
            "cf_avgpool1d_valid": ([steps], L.AveragePooling1D(2, data_format=cf)),
            "cf_global_avg": ([planes], L.GlobalAveragePooling2D(data_format=cf)),
            "cf_global_max_keepdims": ([planes], L.GlobalMaxPooling2D(data_format=cf, keepdims=True)),
            "cf_flatten": ([planes], L.Flatten(data_format=cf)),
            "cf_zeropadding2d": ([planes], L.ZeroPadding2D(((1, 2), (0, 3)), data_format=cf)),
            "cf_cropping2d": ([planes], L.Cropping2D(((1, 2), (2, 1)), data_format=cf)),
            "cf_upsampling2d_nearest": ([planes], L.UpSampling2D((2, 3), data_format=cf)),
            "cf_upsampling2d_bilinear": ([planes], L.UpSampling2D(2, interpolation="bilinear", data_format=cf)),
            "cf_resizing": ([planes], L.Resizing(11, 9, data_format=cf)),
            "cf_batchnorm_axis1": ([planes], L.BatchNormalization(axis=1)),
        }
    )
    # Masks: Embedding(mask_zero=True) on ids padded before, after and inside (MASK_IDS), or Masking on floats;
    # the layer called is the mask's maker, `how` adds the layers that carry, take or drop the mask.
    ids = [(8,)]
    cases.update(
        {
            "mask_lstm_last": (ids, L.Embedding(12, 4, mask_zero=True), lambda e, x: L.LSTM(5)(e(x[0]))),
            "mask_lstm_sequences": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.LSTM(5, return_sequences=True)(e(x[0])),
            ),
            "mask_lstm_zero_output": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.LSTM(3, return_sequences=True, zero_output_for_mask=True)(e(x[0])),
            ),
            "mask_gru_backwards_sequences": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.GRU(4, return_sequences=True, go_backwards=True)(e(x[0])),
            ),
            "mask_gru_reset_before": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.GRU(3, reset_after=False, return_sequences=True)(e(x[0])),
            ),
            "mask_simple_rnn": (ids, L.Embedding(12, 4, mask_zero=True), lambda e, x: L.SimpleRNN(3)(e(x[0]))),
            "mask_bidirectional_average": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.GlobalAveragePooling1D()(L.Bidirectional(L.LSTM(3, return_sequences=True))(e(x[0]))),
            ),
            "mask_bidirectional_gru_sum": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.Bidirectional(L.GRU(3), merge_mode="sum")(e(x[0])),
            ),
            "mask_kept_by_dense": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.LSTM(3)(L.Dropout(0.2)(L.Dense(4, activation="relu")(e(x[0])))),
            ),
            "mask_dropped_by_conv": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.LSTM(3)(L.Conv1D(4, 3, padding="same")(e(x[0]))),
            ),
            "mask_stacked_lstms": (
                ids,
                L.Embedding(12, 4, mask_zero=True),
                lambda e, x: L.LSTM(3)(L.LSTM(4, return_sequences=True)(e(x[0]))),
            ),
            "mask_masking_layer": (
                [(6, 3)],
                L.Masking(0.0),
                lambda m, x: L.LSTM(4, return_sequences=True)(m(x[0])),
            ),
        }
    )
    # keras.ops on tensors and numbers, which a Keras 3 functional model records as nodes of their own.
    ops = keras.ops

    def arithmetic(dense, x):
        y = dense(x[0])
        return ops.minimum(ops.maximum((2.0 - y) / 3.0, -0.2), ops.divide(y, 4.0) + 0.3) * 1.5

    cases["ops_arithmetic"] = ([vector], L.Dense(4), arithmetic)
    return cases


MASK_IDS = np.array([[0, 0, 0, 3, 5, 1, 7, 2], [4, 2, 9, 0, 0, 0, 0, 0], [3, 0, 5, 0, 0, 8, 1, 0]], dtype=np.int32)
"""The ids of the mask cases: padded before (pad_sequences' default), after, and inside."""


ACTIVATION_NAMES = [
    "linear", "relu", "relu6", "sigmoid", "tanh", "softmax", "log_softmax", "elu", "selu", "softplus", "softsign",
    "swish", "silu", "gelu", "exponential", "hard_sigmoid", "hard_silu", "leaky_relu", "mish",
]  # fmt: skip


def make_layer_cases() -> None:
    folder = OUT / "layers"
    folder.mkdir(parents=True, exist_ok=True)
    # Cases made before are kept as they are (a .keras file records when it was saved: remaking every case would
    # rewrite every file); delete a case's file to make it again.
    previous = dict(np.load(OUT / "layers.npz")) if (OUT / "layers.npz").exists() else {}
    arrays = {}
    for index, (name, (shapes, layer, *how)) in enumerate(layer_cases().items()):
        if (folder / f"{name}.keras").exists() and f"{name}/output_0" in previous:
            arrays.update({key: value for key, value in previous.items() if key.startswith(name + "/")})
            continue
        integers = name == "embedding" or (name.startswith("mask_") and name != "mask_masking_layer")
        inputs = [keras.Input(shape, dtype="int32" if integers else "float32") for shape in shapes]
        output = how[0](layer, inputs) if how else layer(inputs if len(inputs) > 1 else inputs[0])
        model = keras.Model(inputs, output, name=name)
        deterministic_weights(model, 1000 + index)
        rng = np.random.default_rng(2000 + index)
        values = [
            MASK_IDS
            if integers and name.startswith("mask_")
            else rng.integers(0, 11, size=(2, *shape)).astype(np.int32)
            if name == "embedding"
            else (
                rng.uniform(0, 255, size=(2, *shape)) if name == "rescaling" else rng.normal(size=(2, *shape))
            ).astype(np.float32)
            for shape in shapes
        ]
        if name == "mask_masking_layer":  # whole steps of zeros: the ones Masking masks
            values[0][0, :2], values[0][1, 3], values[0][1, 5] = 0.0, 0.0, 0.0
        model.save(folder / f"{name}.keras")
        model = keras.models.load_model(folder / f"{name}.keras")
        result = model(values if len(values) > 1 else values[0], training=False)
        for position, value in enumerate(values):
            arrays[f"{name}/input_{position}"] = value
        arrays[f"{name}/output_0"] = np.asarray(result)
    np.savez(OUT / "layers.npz", **arrays)
    print(f"{len(layer_cases())} layer cases")


APPLICATIONS = {  # name -> (builder, input size): small inputs, random weights (keras_skeleton.py), 10 logits
    "MobileNetV2": (lambda shape: keras.applications.MobileNetV2(input_shape=shape, alpha=0.35, weights=None, classes=10, classifier_activation=None), 32),
    "ResNet50": (lambda shape: keras.applications.ResNet50(input_shape=shape, weights=None, classes=10, classifier_activation=None), 32),
    "EfficientNetB0": (lambda shape: keras.applications.EfficientNetB0(input_shape=shape, weights=None, classes=10, classifier_activation=None), 32),
    "DenseNet121": (lambda shape: keras.applications.DenseNet121(input_shape=shape, weights=None, classes=10, classifier_activation=None), 32),
    "InceptionV3": (lambda shape: keras.applications.InceptionV3(input_shape=shape, weights=None, classes=10, classifier_activation=None), 75),
    "NASNetMobile": (lambda shape: keras.applications.NASNetMobile(input_shape=shape, weights=None, classes=10, classifier_activation=None), 32),
    "MobileNetV3Small": (lambda shape: keras.applications.MobileNetV3Small(input_shape=shape, weights=None, classes=10, classifier_activation=None), 32),
    "ConvNeXtTiny": (lambda shape: keras.applications.ConvNeXtTiny(input_shape=shape, weights=None, classes=10, classifier_activation=None), 32),
    "InceptionResNetV2": (lambda shape: keras.applications.InceptionResNetV2(input_shape=shape, weights=None, classes=10, classifier_activation=None), 75),
    "Xception": (lambda shape: keras.applications.Xception(input_shape=shape, weights=None, classes=10, classifier_activation=None), 71),
    "EfficientNetV2B0": (lambda shape: keras.applications.EfficientNetV2B0(input_shape=shape, weights=None, classes=10, classifier_activation=None), 32),
}  # fmt: skip
APPLICATION_SEED = 31
APPLICATION_SKELETONS = {"keras": "{name}.keras", "h5": "{name}.h5.gz"}  # format -> skeleton in applications/


def application_output_key(name: str, suffix: str) -> str:
    """Key of Keras's output in applications.npz: ``<name>/output_0`` (the ``.keras``), ``<name>.h5/output_0``."""
    return f"{name}/output_0" if suffix == "keras" else f"{name}.{suffix}/output_0"


def make_application_fixtures() -> None:
    """Each keras.applications model as skeletons (tools/keras_skeleton.py) of its ``.keras`` and legacy ``.h5``
    files, and Keras's outputs for the weights ``rebuild`` gives each, on the same input (``<name>/input_0``).

    The two formats keep their datasets at different paths, so the generated weights, and the outputs, differ.
    Skeletons made before are kept with their outputs (a ``.keras`` records when it was saved: remaking it would
    rewrite the file); delete a skeleton to make it again."""
    import tempfile

    import keras_skeleton

    folder = OUT / "applications"
    folder.mkdir(parents=True, exist_ok=True)
    previous = dict(np.load(OUT / "applications.npz")) if (OUT / "applications.npz").exists() else {}
    arrays = {}
    for index, (name, (build, size)) in enumerate(APPLICATIONS.items()):
        low, high = INPUT_RANGES.get(name, (0, 255))
        images = np.random.default_rng(100 + index).uniform(low, high, size=(2, size, size, 3)).astype(np.float32)
        assert f"{name}/input_0" not in previous or np.array_equal(previous[f"{name}/input_0"], images), name
        arrays[f"{name}/input_0"] = images
        missing = []
        for suffix, skeleton in APPLICATION_SKELETONS.items():
            if suffix in KERAS_CANNOT_RELOAD.get(name, ()):
                continue
            key = application_output_key(name, suffix)
            if (folder / skeleton.format(name=name)).exists() and key in previous:
                arrays[key] = previous[key]
            else:
                missing.append(suffix)
        if not missing:
            continue
        model = build((size, size, 3))
        rng = np.random.default_rng(index)
        for variable in model.weights:  # unique values, to tell which dataset of the file is which variable
            variable.assign(rng.normal(size=tuple(variable.shape)).astype(variable.dtype))
        kind_of_values = {np.asarray(v).tobytes(): v.path.rsplit("/", 1)[-1] for v in model.weights}
        with tempfile.TemporaryDirectory() as work:
            for suffix in missing:
                saved, full = Path(work) / f"saved.{suffix}", Path(work) / f"full.{suffix}"
                skeleton = folder / APPLICATION_SKELETONS[suffix].format(name=name)
                model.save(saved)
                keras_skeleton.make_skeleton(saved, _dataset_kinds(saved, kind_of_values), skeleton)
                keras_skeleton.rebuild(skeleton, full, APPLICATION_SEED)
                loaded = keras.models.load_model(full, compile=False)
                outputs = np.asarray(loaded(images, training=False))
                assert np.isfinite(outputs).all(), (name, suffix)
                arrays[application_output_key(name, suffix)] = outputs
                print(
                    f"{name}.{suffix}: {loaded.count_params()} parameters, outputs {outputs.shape}, "
                    f"max |output| {abs(outputs).max():.3g}, skeleton {skeleton.stat().st_size} bytes"
                )
    np.savez(OUT / "applications.npz", **arrays)


INPUT_RANGES = {"InceptionResNetV2": (-1.0, 1.0)}
"""Inputs in the range the model's preprocess_input gives, where 0-255 images drive its logits to tens (where
float32 rounding alone passes 1e-5); the others take 0-255 images."""

KERAS_CANNOT_RELOAD = {"MobileNetV3Small": ("h5",), "ConvNeXtTiny": ("h5",), "InceptionResNetV2": ("h5",)}
"""Applications whose file of a format Keras 3.15 itself cannot load back (so has no outputs to compare with):
MobileNetV3's legacy .h5 records ``x + 3.0`` as an op node whose number Keras's legacy loader passes as a
positional argument ("Only input tensors may be passed as positional arguments"); ConvNeXt's LayerScale and
InceptionResNetV2's CustomScaleLayer are "Unknown layer"s to the legacy loader."""


def _dataset_kinds(saved: Path, kind_of_values: dict[bytes, str]) -> dict[str, str]:
    """Each weight dataset's path in the saved file's weights (``model.weights.h5`` of a ``.keras``, the legacy
    ``.h5`` itself) -> the kind of the variable it holds, found by its (unique) values: the last part of the
    variable's path (kernel, bias, gamma, moving_variance, ...)."""
    import h5py

    kinds: dict[str, str] = {}

    def visit(path: str, item: object) -> None:
        if not isinstance(item, h5py.Dataset):
            return
        kind = kinds["/" + path] = kind_of_values[np.asarray(item).tobytes()]
        if saved.suffix == ".h5":  # legacy weights are named after their variables: model_weights/conv/conv/kernel
            assert path.rsplit("/", 1)[-1].removesuffix(":0") == kind, (path, kind)

    if zipfile.is_zipfile(saved):
        with zipfile.ZipFile(saved) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5"))) as handle:
            handle.visititems(visit)
    else:
        with h5py.File(saved, "r") as handle:
            handle.visititems(visit)
    return kinds


def make_batchnorm_training() -> None:
    """A BatchNormalization's moving statistics after one training call, as Keras's fit updates them."""
    layer = layers.BatchNormalization(momentum=0.9, epsilon=1e-3, name="bn")
    model = keras.Sequential([keras.Input((5, 3)), layer], name="bn_training")
    deterministic_weights(model, 77)
    model.save(OUT / "bn_training.keras")
    batch = np.random.default_rng(78).normal(1.0, 2.0, size=(4, 5, 3)).astype(np.float32)
    output = np.asarray(model(batch, training=True))
    np.savez(
        OUT / "bn_training.npz",
        input_0=batch,
        output_training=output,
        moving_mean=np.asarray(layer.moving_mean),
        moving_variance=np.asarray(layer.moving_variance),
    )


def make_keras2_models() -> None:
    """Models saved by Keras 2 (tf_keras 2.21, ``pip install --no-deps tf_keras==2.21.0`` beside TensorFlow), whose
    graphs record neither masks nor initial states as keywords: ``keras2_<name>.h5`` and ``keras2_<name>.npz``."""
    import tf_keras

    L = tf_keras.layers

    def masked() -> tf_keras.Model:
        ids = tf_keras.Input((8,), dtype="int32", name="ids")
        x = L.Embedding(12, 6, mask_zero=True, name="embed")(ids)
        x = L.Bidirectional(L.GRU(4, return_sequences=True), name="bigru")(x)
        x = L.Dense(5, activation="relu", name="dense")(x)
        x = L.GlobalAveragePooling1D(name="average")(x)
        return tf_keras.Model(ids, L.Dense(2, name="logits")(x), name="keras2_masked")

    def seq2seq() -> tf_keras.Model:
        source, target = tf_keras.Input((7, 5), name="source"), tf_keras.Input((6, 4), name="target")
        _, state_h, state_c = L.LSTM(8, return_state=True, name="encoder")(source)
        decoded = L.LSTM(8, return_sequences=True, name="decoder")(target, initial_state=[state_h, state_c])
        return tf_keras.Model([source, target], L.Dense(4, name="words")(decoded), name="keras2_seq2seq")

    for seed, build in enumerate((masked, seq2seq)):
        model = build()
        name = model.name
        if (OUT / f"{name}.h5").exists() and (OUT / f"{name}.npz").exists():
            continue
        rng = np.random.default_rng(500 + seed)
        for variable in model.weights:
            variable.assign(rng.normal(0, 0.3, size=tuple(variable.shape)).astype(variable.dtype.as_numpy_dtype))
        inputs = [
            MASK_IDS if tensor.dtype.is_integer else rng.normal(size=(3, *tensor.shape[1:])).astype(np.float32)
            for tensor in model.inputs
        ]
        model.save(OUT / f"{name}.h5")
        model = tf_keras.models.load_model(OUT / f"{name}.h5")
        output = model(inputs if len(inputs) > 1 else inputs[0], training=False)
        np.savez(
            OUT / f"{name}.npz",
            **{f"input_{index}": value for index, value in enumerate(inputs)},
            output_0=np.asarray(output),
        )
        print(f"{name}: Keras 2 {tf_keras.__version__}, outputs {np.asarray(output).shape}")


def main() -> int:
    """Every fixture, or those named: make_keras_model_fixtures.py [applications] [layers] [models] [bn_training]
    [keras2]."""
    OUT.mkdir(parents=True, exist_ok=True)
    chosen = sys.argv[1:] or ["applications", "layers", "models", "bn_training", "keras2"]
    if "bn_training" in chosen:
        make_batchnorm_training()
    if "keras2" in chosen:
        make_keras2_models()
    if "applications" in chosen:
        make_application_fixtures()
    if "layers" in chosen:
        make_layer_cases()
    if "models" not in chosen:
        return 0
    for seed, (name, build) in enumerate(MODELS.items()):
        if all((OUT / f"{name}.{suffix}").exists() for suffix in ("keras", "h5", "npz")):
            continue  # made before: kept as they are (delete a model's files to make it again)
        model = build()
        deterministic_weights(model, seed)
        rng = np.random.default_rng(100 + seed)
        inputs = [
            MASK_IDS
            if name == "masked_text"
            else rng.integers(0, 50, size=(3, *tensor.shape[1:])).astype(np.int32)
            if "int" in str(tensor.dtype)
            else rng.normal(size=(3, *tensor.shape[1:])).astype(np.float32)
            for tensor in model.inputs
        ]
        model.save(OUT / f"{name}.keras")
        model.save(OUT / f"{name}.h5")
        # Keras's outputs for the file as saved (a Normalization computes its statistics from its variables on load).
        model = keras.models.load_model(OUT / f"{name}.keras")
        outputs = model(inputs if len(inputs) > 1 else inputs[0], training=False)
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        np.savez(
            OUT / f"{name}.npz",
            **{f"input_{index}": value for index, value in enumerate(inputs)},
            **{f"output_{index}": np.asarray(value) for index, value in enumerate(outputs)},
        )
        print(f"{name}: {[tuple(i.shape) for i in inputs]} -> {[tuple(np.asarray(o).shape) for o in outputs]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
