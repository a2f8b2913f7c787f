"""Parsing specs with TensorFlow's semantics (formats.md 2.2, 2.3), decode_raw, to_torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchestimator.data.example import encode_example, encode_sequence_example, example_protos
from torchestimator.data.parsing import (
    FixedLenFeature,
    FixedLenSequenceFeature,
    RaggedFeature,
    RaggedValue,
    SparseValue,
    VarLenFeature,
    decode_raw,
    parse_example,
    parse_single_example,
    parse_single_sequence_example,
    to_torch,
)


def example(**features):
    return encode_example(features)


# ---------------------------------------------------------------------------------------- FixedLenFeature


def test_fixed_len_scalar_vector_and_row_major_reshape():
    record = example(label=[3], f=[1.0, 2.0, 3.0], s=[b"a\x00"])
    for shape in ([3], [3, 1], [1, 3]):
        parsed = parse_single_example(record, {"f": FixedLenFeature(shape, "float32")})
        assert parsed["f"].shape == tuple(shape) and parsed["f"].dtype == np.float32
        assert parsed["f"].reshape(-1).tolist() == [1.0, 2.0, 3.0]
    parsed = parse_single_example(record, {"label": FixedLenFeature([], "int64"), "s": FixedLenFeature([], "string")})
    assert parsed["label"].shape == () and parsed["label"] == 3 and parsed["label"].dtype == np.int64
    assert parsed["s"].dtype == object and parsed["s"].item() == b"a\x00"  # NUL bytes survive


def test_fixed_len_batch_fills_one_array():
    records = [example(x=[i, i + 1], s=[f"r{i}".encode()]) for i in range(4)]
    parsed = parse_example(records, {"x": FixedLenFeature([2], np.int64), "s": FixedLenFeature([1], bytes)})
    assert parsed["x"].shape == (4, 2) and parsed["x"][:, 0].tolist() == [0, 1, 2, 3]
    assert parsed["s"].shape == (4, 1) and parsed["s"][3, 0] == b"r3"
    binary = parse_example([example(b=[b"a\x00", b"\x00"])] * 2, {"b": FixedLenFeature([2], "string")})["b"]
    assert binary.tolist() == [[b"a\x00", b"\x00"]] * 2  # no numpy "S" conversion dropping NULs


def test_missing_feature_uses_default_value():
    records = [example(x=[1.0, 2.0]), example(other=[1])]
    features = {
        "x": FixedLenFeature([2], "float32", default_value=[-1, -2]),
        "s": FixedLenFeature([], "string", default_value="none"),
    }
    parsed = parse_example(records, features)
    assert parsed["x"].tolist() == [[1.0, 2.0], [-1.0, -2.0]]
    assert parsed["s"].tolist() == [b"none", b"none"]


def test_missing_required_feature_names_feature_and_record():
    records = [example(z=[1]), example(z=[2]), example(a=[1])]
    with pytest.raises(
        ValueError,
        match=r"Feature: z \(data type: int64\) is required but could not be found "
        r"\(record 2\).*default_value",
    ):
        parse_example(records, {"z": FixedLenFeature([], "int64")})


def test_feature_without_kind_counts_as_missing():
    message = example_protos().Example()
    message.features.feature["z"].SetInParent()
    record = message.SerializeToString()
    assert parse_single_example(record, {"z": FixedLenFeature([], "int64", default_value=7)})["z"] == 7
    assert parse_single_example(record, {"z": VarLenFeature("int64")})["z"].values.size == 0
    with pytest.raises(ValueError, match="is required"):
        parse_single_example(record, {"z": FixedLenFeature([], "int64")})


@pytest.mark.parametrize(
    "values, dtype, message",
    [
        ([1, 2], "int64", "Some int64_list slice was not parsed"),
        ([1.0, 2.0], "float32", "Some float_list slice was not parsed"),
        ([b"a", b"b"], "string", "Parsing bytes_list failed"),
    ],
)
def test_wrong_count_is_an_error_with_tf_wording(values, dtype, message):
    records = [example(a=values * 2), example(a=values)]
    with pytest.raises(
        ValueError,
        match=rf"Key: a, record 1\.  Can't parse serialized Example: {message}.*"
        r"shape \[4\] needs 4 values, the record has 2",
    ):
        parse_example(records, {"a": FixedLenFeature([4], dtype)})
    with pytest.raises(ValueError, match="shape \\[\\] needs 1 values, the record has 2"):
        parse_single_example(records[1], {"a": FixedLenFeature([], dtype)})


def test_kind_mismatch_is_an_error_with_tf_wording():
    records = [example(a=[1.0]), example(a=[1])]
    with pytest.raises(
        ValueError,
        match=r"Key: a, record 1\.  Data types don't match\. Data type: int64 but "
        r"expected type: float",
    ):
        parse_example(records, {"a": FixedLenFeature([], "float32")})
    with pytest.raises(ValueError, match="Data type: bytes but expected type: int64"):
        parse_single_example(example(a=[b"x"]), {"a": VarLenFeature("int64")})
    with pytest.raises(ValueError, match="Data type: float but expected type: string"):
        parse_single_example(example(a=[1.0]), {"a": RaggedFeature("string")})


@pytest.mark.parametrize("dtype", ["int32", np.float64, torch.int32, "double", np.uint8])
def test_unsupported_dtype_in_spec(dtype):
    with pytest.raises(
        ValueError,
        match=r"Value for attr 'Tdense' of .* is not in the list of allowed values: "
        r"float, int64, string.*cast afterwards",
    ):
        FixedLenFeature([], dtype)
    with pytest.raises(ValueError, match="VarLenFeature: unsupported dtype"):
        VarLenFeature(dtype)


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (np.int64, "int64"),
        (torch.int64, "int64"),
        ("float", "float32"),
        (torch.float32, "float32"),
        (np.float32, "float32"),
        (bytes, "string"),
        (str, "string"),
        (object, "string"),
        ("bytes", "string"),
    ],
)
def test_accepted_dtype_spellings(dtype, expected):
    assert FixedLenFeature([], dtype).dtype == expected


def test_bad_shapes_and_defaults_in_specs():
    with pytest.raises(ValueError, match="non-negative ints"):
        FixedLenFeature([None, 3], "float32")
    with pytest.raises(TypeError, match="shape must be a list"):
        FixedLenFeature(object(), "float32")
    with pytest.raises(ValueError, match="default_value has 2 values but shape \\[3\\] needs 3"):
        FixedLenFeature([3], "float32", default_value=[1, 2])
    with pytest.raises(ValueError, match="not a valid int64"):
        FixedLenFeature([], "int64", default_value=1.5)
    with pytest.raises(ValueError, match="string default_value must hold bytes or str"):
        FixedLenFeature([], "string", default_value=3)
    with pytest.raises(ValueError, match="must be a scalar"):
        FixedLenSequenceFeature([], "int64", allow_missing=True, default_value=[1, 2])
    with pytest.raises(ValueError, match="partitions are not supported"):
        RaggedFeature("int64", partitions=("row_lengths",))
    with pytest.raises(ValueError, match="row_splits_dtype"):
        RaggedFeature("int64", row_splits_dtype="int16")
    with pytest.raises(TypeError, match=r"features\['x'\] must be a FixedLenFeature"):
        parse_single_example(example(x=[1]), {"x": "int64"})


def test_invalid_record_names_its_index():
    with pytest.raises(ValueError, match=r"Could not parse example input, value: b'\\n\\x05\\x01' \(record 1"):
        parse_example([example(a=[1]), b"\x0a\x05\x01"], {"a": VarLenFeature("int64")})
    with pytest.raises(TypeError, match="record 0: Expected a serialized record as bytes"):
        parse_example(["text"], {"a": VarLenFeature("int64")})
    with pytest.raises(TypeError, match="takes a batch"):
        parse_example(example(a=[1]), {"a": VarLenFeature("int64")})


# ---------------------------------------------------------------------------------------- VarLen / Ragged


def test_var_len_single_and_batch_indices_like_tf():
    single = parse_single_example(example(v=[5, 6, 7]), {"v": VarLenFeature("int64")})["v"]
    assert isinstance(single, SparseValue)
    assert single.indices.tolist() == [[0], [1], [2]] and single.dense_shape.tolist() == [3]
    assert single.values.tolist() == [5, 6, 7]

    records = [example(v=[b"a", b"b"]), example(other=[1]), example(v=[b"c", b"d", b"e"])]
    batch = parse_example(records, {"v": VarLenFeature("string")})["v"]
    assert batch.indices.tolist() == [[0, 0], [0, 1], [2, 0], [2, 1], [2, 2]]
    assert batch.values.tolist() == [b"a", b"b", b"c", b"d", b"e"] and batch.values.dtype == object
    assert batch.dense_shape.tolist() == [3, 3]
    assert batch.to_dense().tolist() == [[b"a", b"b", b""], [b"", b"", b""], [b"c", b"d", b"e"]]


def test_var_len_missing_everywhere_is_empty():
    parsed = parse_example([example(a=[1])] * 2, {"v": VarLenFeature("float32")})["v"]
    assert parsed.indices.shape == (0, 2) and parsed.values.dtype == np.float32
    assert parsed.dense_shape.tolist() == [2, 0]


def test_ragged_single_and_batch():
    records = [example(v=[1, 2]), example(a=[0]), example(v=[3])]
    assert parse_single_example(records[0], {"v": RaggedFeature("int64")})["v"].tolist() == [1, 2]
    parsed = parse_example(records, {"r": RaggedFeature("int64", value_key="v")})["r"]
    assert isinstance(parsed, RaggedValue)
    assert parsed.values.tolist() == [1, 2, 3]
    assert parsed.row_splits.tolist() == [0, 2, 2, 3] and parsed.row_splits.dtype == np.int32
    assert [row.tolist() for row in parsed.to_list()] == [[1, 2], [], [3]]
    wide = parse_example(records, {"v": RaggedFeature("int64", row_splits_dtype="int64")})["v"]
    assert wide.row_splits.dtype == np.int64


# ---------------------------------------------------------------------------------------- FixedLenSequenceFeature


def test_fixed_len_sequence_batch_padding_like_tf():
    records = [example(s=[1, 2]), example(s=[5])]
    with_default = parse_example(records, {"s": FixedLenSequenceFeature([], "int64", True, default_value=-1)})
    assert with_default["s"].tolist() == [[1, 2], [5, -1]]
    without = parse_example(records, {"s": FixedLenSequenceFeature([], "int64", allow_missing=True)})
    assert without["s"].tolist() == [[1, 2], [5, 0]]


def test_fixed_len_sequence_rows_and_missing():
    spec = {"s": FixedLenSequenceFeature([2], "float32", allow_missing=True)}
    assert parse_single_example(example(s=[1.0, 2, 3, 4]), spec)["s"].tolist() == [[1, 2], [3, 4]]
    missing = parse_single_example(example(a=[1]), spec)["s"]
    assert missing.shape == (0, 2)
    batch = parse_example([example(a=[1]), example(s=[1.0, 2])], spec)["s"]
    assert batch.shape == (2, 1, 2) and batch.tolist() == [[[0, 0]], [[1, 2]]]
    strings = parse_example(
        [example(t=["a"]), example(a=[1])], {"t": FixedLenSequenceFeature([], "string", allow_missing=True)}
    )["t"]
    assert strings.tolist() == [[b"a"], [b""]]


def test_fixed_len_sequence_errors():
    with pytest.raises(ValueError, match="Unsupported: FixedLenSequenceFeature requires allow_missing to be True"):
        parse_single_example(example(s=[1]), {"s": FixedLenSequenceFeature([], "int64")})
    with pytest.raises(
        ValueError,
        match=r"Key: s, record 1\.  Number of int64 values is not a multiple of stride "
        r"length\. Saw 3 values but output shape is: \[\?,2\]",
    ):
        parse_example(
            [example(s=[1, 2]), example(s=[1, 2, 3])], {"s": FixedLenSequenceFeature([2], "int64", allow_missing=True)}
        )


# ---------------------------------------------------------------------------------------- SequenceExample

SEQUENCE = encode_sequence_example({"len": [2], "name": ["n"]}, {"tok": [[7], [8, 9]], "one": [[1.0], [2.0]]})


def test_sequence_example_context_and_feature_lists():
    context, sequences = parse_single_sequence_example(
        SEQUENCE,
        context_features={
            "len": FixedLenFeature([], "int64"),
            "name": VarLenFeature("string"),
            "absent": FixedLenFeature([], "int64", default_value=0),
        },
        sequence_features={
            "one": FixedLenSequenceFeature([], "float32"),
            "tok": RaggedFeature("int64"),
            "tok_sparse": RaggedFeature("int64", value_key="tok"),
        },
    )
    assert context["len"] == 2 and context["absent"] == 0
    assert context["name"].values.tolist() == [b"n"]
    assert sequences["one"].tolist() == [1.0, 2.0] and sequences["one"].shape == (2,)
    assert sequences["tok"].values.tolist() == [7, 8, 9] and sequences["tok"].row_splits.tolist() == [0, 1, 3]
    assert sequences["tok_sparse"].row_splits.tolist() == [0, 1, 3]


def test_sequence_var_len_is_two_dimensional():
    _, sequences = parse_single_sequence_example(SEQUENCE, sequence_features={"tok": VarLenFeature("int64")})
    sparse = sequences["tok"]
    assert sparse.indices.tolist() == [[0, 0], [1, 0], [1, 1]]
    assert sparse.dense_shape.tolist() == [2, 2] and sparse.values.tolist() == [7, 8, 9]


def test_sequence_frame_of_wrong_size_tf_wording():
    with pytest.raises(
        ValueError,
        match=r"Key: tok, Index: 1 \(record 0\)\.  Number of values != expected\.  "
        r"values size: 2 but output shape: \[\]",
    ):
        parse_single_sequence_example(SEQUENCE, sequence_features={"tok": FixedLenSequenceFeature([], "int64")})


def test_sequence_missing_feature_list_and_kind_mismatch():
    with pytest.raises(ValueError, match="Feature list 'missing' is required but could not be found.*allow_missing"):
        parse_single_sequence_example(SEQUENCE, sequence_features={"missing": FixedLenSequenceFeature([], "int64")})
    _, sequences = parse_single_sequence_example(
        SEQUENCE,
        sequence_features={
            "missing": FixedLenSequenceFeature([3], "int64", allow_missing=True),
            "gone": RaggedFeature("float32"),
            "none": VarLenFeature("string"),
        },
    )
    assert sequences["missing"].shape == (0, 3)
    assert sequences["gone"].row_splits.tolist() == [0]
    assert sequences["none"].dense_shape.tolist() == [0, 0]
    with pytest.raises(
        ValueError,
        match=r"Feature list: one, Index: 0 \(record 0\)\.  Data types don't match\. "
        r"Data type: float but expected type: int64",
    ):
        parse_single_sequence_example(SEQUENCE, sequence_features={"one": FixedLenSequenceFeature([], "int64")})
    with pytest.raises(ValueError, match="Key: tok, record 0, frame 0.  Data types don't match"):
        parse_single_sequence_example(SEQUENCE, sequence_features={"tok": VarLenFeature("float32")})


def test_sequence_spec_kinds_are_checked():
    with pytest.raises(TypeError, match=r"sequence_features\['tok'\] must be a FixedLenSequenceFeature"):
        parse_single_sequence_example(SEQUENCE, sequence_features={"tok": FixedLenFeature([], "int64")})
    with pytest.raises(TypeError, match=r"context_features\['len'\] must be a FixedLenFeature, VarLenFeature"):
        parse_single_sequence_example(SEQUENCE, context_features={"len": FixedLenSequenceFeature([], "int64")})
    with pytest.raises(ValueError, match="Could not parse sequence example input"):
        parse_single_sequence_example(b"\x12\x09", sequence_features={})


# ---------------------------------------------------------------------------------------- decode_raw


def test_decode_raw_round_trip_and_byte_order():
    values = np.arange(6, dtype=np.float32)
    assert decode_raw(values.tobytes(), "float32").tolist() == values.tolist()
    assert decode_raw(values.tobytes(), np.float32, shape=(2, 3)).shape == (2, 3)
    assert decode_raw(values.tobytes(), torch.float32, shape=[-1, 2]).shape == (3, 2)
    big = np.array([1, 258], ">u2").tobytes()
    decoded = decode_raw(big, "uint16", little_endian=False)
    assert decoded.tolist() == [1, 258] and decoded.dtype.isnative
    decoded[0] = 5  # writable


def test_decode_raw_size_errors_name_both_numbers():
    with pytest.raises(
        ValueError,
        match=r"10 bytes is not a multiple of 4 \(the size of one float32\).*"
        r"10 uint8, 5 int16/float16",
    ):
        decode_raw(b"\x00" * 10, "float32")
    with pytest.raises(
        ValueError,
        match=r"shape \[28, 28\] of float32 needs 3136 bytes, received 784 bytes.*"
        r"784 uint8",
    ):
        decode_raw(b"\x00" * 784, "float32", shape=(28, 28))
    with pytest.raises(ValueError, match="needs a multiple of 12 bytes, received 16"):
        decode_raw(b"\x00" * 16, "float32", shape=(-1, 3))
    with pytest.raises(ValueError, match="numeric dtype"):
        decode_raw(b"\x00", "not-a-dtype")
    with pytest.raises(ValueError, match="dtype must be numeric"):
        decode_raw(b"\x00", "S1")


def test_decode_raw_batch():
    images = [np.full(4, index, np.uint8).tobytes() for index in range(3)]
    parsed = parse_example([example(image=[image]) for image in images], {"image": FixedLenFeature([], "string")})
    batch = decode_raw(parsed["image"], "uint8", shape=(2, 2))
    assert batch.shape == (3, 2, 2) and batch[2].tolist() == [[2, 2], [2, 2]]
    with pytest.raises(ValueError, match=r"different lengths \[3, 4\].*same size"):
        decode_raw([b"\x00" * 4, b"\x00" * 3], "uint8")
    assert decode_raw([], "float32", shape=(2,)).shape == (0, 2)


# ---------------------------------------------------------------------------------------- to_torch


def test_to_torch_converts_numeric_values():
    records = [example(x=[1.0, 2.0], v=[1, 2], s=["a"]), example(x=[3.0, 4.0], v=[3], s=["b"])]
    parsed = parse_example(
        records,
        {
            "x": FixedLenFeature([2], "float32"),
            "v": VarLenFeature("int64"),
            "r": RaggedFeature("int64", value_key="v"),
            "s": FixedLenFeature([], "string"),
            "sv": VarLenFeature("string"),
        },
    )
    tensors = to_torch(parsed)
    assert isinstance(tensors["x"], torch.Tensor) and tensors["x"].dtype == torch.float32
    assert tensors["x"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert tensors["v"].is_sparse and tensors["v"].to_dense().tolist() == [[1, 2], [3, 0]]
    assert tensors["v"].to_dense().tolist() == parsed["v"].to_dense().tolist()
    assert isinstance(tensors["r"], RaggedValue) and tensors["r"].row_splits.tolist() == [0, 2, 3]
    assert isinstance(tensors["s"], np.ndarray) and tensors["s"].tolist() == [b"a", b"b"]
    assert isinstance(tensors["sv"], SparseValue)
    context, sequences = to_torch(
        parse_single_sequence_example(
            SEQUENCE, {"len": FixedLenFeature([], "int64")}, {"one": FixedLenSequenceFeature([], "float32")}
        )
    )
    assert context["len"].item() == 2 and sequences["one"].tolist() == [1.0, 2.0]


def test_to_torch_trusts_parsed_indices_and_shares_them():
    records = [example(v=[1, 2]), example(), example(v=[3, 4, 5])]
    parsed = parse_example(records, {"v": VarLenFeature("int64")})["v"]
    assert parsed.indices.T.flags.c_contiguous and parsed.indices.shape == (5, 2)  # [rank, nnz] underneath
    tensor = to_torch(parsed)
    assert tensor.is_coalesced() and tensor.to_dense().tolist() == [[1, 2, 0], [0, 0, 0], [3, 4, 5]]
    assert tensor._indices().data_ptr() == parsed.indices.ctypes.data  # no transpose copy
    assert torch.equal(tensor._indices(), tensor.coalesce()._indices())
    single = to_torch(parse_single_example(records[2], {"v": VarLenFeature("int64")})["v"])
    assert single.is_coalesced() and single.to_dense().tolist() == [3, 4, 5]
    ragged = parse_example(records, {"v": RaggedFeature("int64")})["v"]
    assert to_torch(ragged).values.data_ptr() == ragged.values.ctypes.data  # shared, not copied
    reversed_rows = to_torch(RaggedValue(np.arange(4)[::-1], [0, 1, 4]))  # a user's strided arrays still work
    assert reversed_rows.values.tolist() == [3, 2, 1, 0] and reversed_rows.row_splits.tolist() == [0, 1, 4]
    empty = to_torch(parse_example([example()], {"v": VarLenFeature("int64")})["v"])
    assert empty.is_coalesced() and empty.shape == (1, 0) and empty._nnz() == 0


def test_to_torch_checks_sparse_values_it_did_not_parse():
    parsed = parse_example([example(v=[1, 2])], {"v": VarLenFeature("int64")})["v"]
    unsorted = SparseValue(np.array([[0, 1], [0, 0]]), np.array([2, 1]), np.array([1, 2]))
    tensor = to_torch(unsorted)
    assert not tensor.is_coalesced() and tensor.to_dense().tolist() == [[1, 2]]
    with pytest.raises(RuntimeError, match="inconsistent with indices"):  # torch's own check, kept for these
        to_torch(parsed._replace(indices=np.array([[0, 0], [0, 5]])))
    with pytest.raises(RuntimeError, match="inconsistent with indices"):
        to_torch(SparseValue(np.array([[3, 0]]), np.array([1]), np.array([1, 2])))


def test_parse_empty_batch():
    parsed = parse_example(
        [],
        {
            "x": FixedLenFeature([3], "float32"),
            "v": VarLenFeature("int64"),
            "s": FixedLenSequenceFeature([], "int64", allow_missing=True),
        },
    )
    assert parsed["x"].shape == (0, 3)
    assert parsed["v"].dense_shape.tolist() == [0, 0]
    assert parsed["s"].shape == (0, 0)


# ---------------------------------------------------------------------------------------- batch accumulation


def test_batch_mixes_fast_and_default_rows_for_every_dtype():
    # 150 floats need a two-byte length in the packed FloatList; missing rows take the default.
    dense = np.linspace(-1, 1, 150, dtype=np.float32)
    records = [
        example(f=dense, i=[7, 8], s=[b"x"], v=dense[:40]),
        example(other=[1]),
        example(f=dense * 2, i=[9, 10], s=[b"y"], v=dense[:20]),
    ]
    features = {
        "f": FixedLenFeature([150], "float32", default_value=np.full(150, 0.5)),
        "i": FixedLenFeature([2], "int64", default_value=[-1, -2]),
        "s": FixedLenFeature([], "string", default_value=b"none"),
        "v": VarLenFeature("float32"),
    }
    parsed = parse_example(records, features)
    assert parsed["f"].dtype == np.float32 and parsed["f"].shape == (3, 150)
    assert parsed["f"].tolist() == [dense.tolist(), [0.5] * 150, (dense * 2).tolist()]
    assert parsed["i"].tolist() == [[7, 8], [-1, -2], [9, 10]]
    assert parsed["s"].tolist() == [b"x", b"none", b"y"]
    assert parsed["v"].values.tolist() == dense[:40].tolist() + dense[:20].tolist()
    assert parsed["v"].dense_shape.tolist() == [3, 40]
    assert parsed["f"].flags.writeable and parsed["v"].values.flags.writeable  # arrays of their own
    single = parse_single_example(records[1], features)
    assert single["f"].shape == (150,) and single["i"].tolist() == [-1, -2] and len(single["v"].values) == 0


def test_fixed_len_of_zero_values_still_tells_missing_from_empty():
    empty = encode_example({"z": []}, kinds={"z": "float"})
    parsed = parse_example([empty, empty], {"z": FixedLenFeature([0], "float32")})
    assert parsed["z"].shape == (2, 0) and parsed["z"].dtype == np.float32
    with pytest.raises(
        ValueError,
        match=r"Feature: z \(data type: float\) is required but could not be found "
        r"\(record 1\)",
    ):
        parse_example([empty, example(other=[1])], {"z": FixedLenFeature([0], "float32")})


def test_wrong_kind_with_matching_count_is_still_refused():
    # The fast path reads the expected list without WhichOneof; an unset list reads empty there.
    with pytest.raises(
        ValueError,
        match=r"Key: a, record 0\.  Data types don't match\. Data type: float but "
        r"expected type: int64",
    ):
        parse_example([example(a=[1.0])], {"a": FixedLenFeature([], "int64")})
    with pytest.raises(
        ValueError,
        match=r"Key: a, record 1\.  Data types don't match\. Data type: int64 but "
        r"expected type: float",
    ):
        parse_example([example(a=[1.0]), example(a=[1])], {"a": VarLenFeature("float32")})


def test_unknown_fields_inside_a_float_list_are_skipped_not_read_as_floats():
    # FloatList{value: [1.5] (unpacked), field 4 = 0x4000 (a 3-byte varint)}: protobuf keeps the
    # unknown field and writes it back; it must not come out as a second float.
    float_list = b"\x0d" + np.float32(1.5).tobytes() + b"\x20\x80\x80\x01"
    feature = b"\x12" + bytes([len(float_list)]) + float_list
    entry = b"\x0a\x01x\x12" + bytes([len(feature)]) + feature
    record = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    assert parse_single_example(record, {"x": VarLenFeature("float32")})["x"].values.tolist() == [1.5]
    assert parse_single_example(record, {"x": RaggedFeature("float32")})["x"].tolist() == [1.5]
    assert parse_single_example(record, {"x": FixedLenFeature([1], "float32")})["x"].tolist() == [1.5]
    # Two floats' worth of bytes (a 10-byte packed list), but one value: still a wrong count.
    with pytest.raises(ValueError, match="needs 2 values, the record has 1"):
        parse_single_example(record, {"x": FixedLenFeature([2], "float32")})
