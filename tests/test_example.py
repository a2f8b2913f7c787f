"""tf.train.Example / SequenceExample encoding and decoding against the proto definitions (formats.md 2.1)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import descriptor_pool

from torchestimator.data.example import (
    ExampleDecodeError,
    decode_example,
    decode_sequence_example,
    encode_example,
    encode_sequence_example,
    example_kinds,
    example_protos,
)

# formats.md 2.1, checked against TensorFlow's SerializeToString(deterministic=True).
WORKED_EXAMPLE = bytes.fromhex("0a290a0b0a016112061a040a0201020a0d0a0162120812060a040000c03f0a0b0a016312060a040a026869")
WORKED_SEQUENCE = bytes.fromhex("0a0e0a0c0a036c656e12051a030a010212180a160a03746f6b120f0a051a030a01070a061a040a020809")
UNPACKED_FLOATS = bytes.fromhex("0a130a110a0166120c120a0d0000c03f0d00002040")


def test_worked_example_bytes_both_ways():
    encoded = encode_example({"c": [b"hi"], "a": [1, 2], "b": [1.5]})  # dict order does not matter
    assert encoded == WORKED_EXAMPLE
    decoded = decode_example(WORKED_EXAMPLE)
    assert decoded["a"].dtype == np.int64 and decoded["a"].tolist() == [1, 2]
    assert decoded["b"].dtype == np.float32 and decoded["b"].tolist() == [1.5]
    assert decoded["c"] == [b"hi"]
    assert example_kinds(WORKED_EXAMPLE) == {"a": "int64", "b": "float", "c": "bytes"}


def test_one_int64_feature_hand_computed():
    # Int64List{1} = 0a 01 01; Feature.int64_list (field 3) = 1a 03 ..; entry key=1 "a", value=2;
    # Features.feature (field 1); Example.features (field 1). A wrong field number changes a byte.
    assert encode_example({"a": [1]}) == bytes.fromhex("0a0c0a0a0a016112051a030a0101")
    assert encode_example({"s": "x"}) == bytes.fromhex("0a0c0a0a0a017312050a030a0178")


def test_float_feature_exact_bytes():
    # FloatList packed: 0a 04 + 2.0f little-endian (00 00 00 40); Feature.float_list is field 2 (tag 12).
    assert encode_example({"f": [2.0]}) == bytes.fromhex("0a0f0a0d0a0166120812060a0400000040")


def test_worked_sequence_example_bytes_both_ways():
    assert encode_sequence_example({"len": [2]}, {"tok": [[7], [8, 9]]}) == WORKED_SEQUENCE
    context, feature_lists = decode_sequence_example(WORKED_SEQUENCE)
    assert context["len"].tolist() == [2]
    assert [frame.tolist() for frame in feature_lists["tok"]] == [[7], [8, 9]]


def test_unpacked_encodings_decode():
    assert decode_example(UNPACKED_FLOATS)["f"].tolist() == [1.5, 2.5]
    # Int64List with unpacked varints (tag 08 per value), -1 as a 10-byte varint.
    int64_list = bytes.fromhex("0805") + bytes.fromhex("08ffffffffffffffffff01")
    feature = b"\x1a" + bytes([len(int64_list)]) + int64_list
    entry = b"\x0a\x01i\x12" + bytes([len(feature)]) + feature
    example = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    assert decode_example(example)["i"].tolist() == [5, -1]


def test_int64_extremes_round_trip_and_minus_one_is_ten_bytes():
    values = [-(2**63), 2**63 - 1, -1, 0, 1, 127, 128, 300]
    encoded = encode_example({"x": values})
    assert decode_example(encoded)["x"].tolist() == values
    assert bytes.fromhex("ffffffffffffffffff01") in encode_example({"x": [-1]})
    with pytest.raises(ValueError, match="outside int64"):
        encode_example({"x": [2**63]})
    with pytest.raises(ValueError, match="outside int64"):
        encode_example({"x": np.array([2**64 - 1], np.uint64)})


def test_unicode_str_is_utf8_and_names_too():
    encoded = encode_example({"名前": ["héllo", b"\xff\x00raw"]})
    assert decode_example(encoded) == {"名前": ["héllo".encode(), b"\xff\x00raw"]}


def test_empty_lists_keep_their_kind():
    encoded = encode_example({"e": [], "f": np.zeros(0, np.float32), "s": []}, kinds={"e": "int64", "s": "bytes"})
    assert example_kinds(encoded) == {"e": "int64", "f": "float", "s": "bytes"}
    decoded = decode_example(encoded)
    assert decoded["e"].dtype == np.int64 and decoded["e"].size == 0
    assert decoded["f"].dtype == np.float32 and decoded["f"].size == 0
    assert decoded["s"] == []
    assert b"\x1a\x00" in encode_example({"e": []}, kinds={"e": "int64"})  # an empty Int64List is still set
    with pytest.raises(ValueError, match="cannot be inferred.*kinds="):
        encode_example({"e": []})


def test_floats_are_stored_as_float32():
    decoded = decode_example(encode_example({"f": [0.1, 1e40, -1e40, 3]}))["f"]
    assert decoded.dtype == np.float32
    assert decoded[0] == np.float32(0.1) and float(decoded[0]) != 0.1
    assert np.isposinf(decoded[1]) and np.isneginf(decoded[2]) and decoded[3] == 3.0


def test_kind_inference_and_declared_kinds():
    assert example_kinds(encode_example({"i": [1, True], "f": [1, 2.5], "b": [b"a", "b"]})) == {
        "i": "int64",
        "f": "float",
        "b": "bytes",
    }
    assert example_kinds(encode_example({"f": [1, 2]}, kinds={"f": "float"})) == {"f": "float"}
    assert example_kinds(encode_example({"x": np.arange(3, dtype=np.uint8)})) == {"x": "int64"}


def test_arrays_flatten_row_major_and_scalars_are_lists():
    decoded = decode_example(encode_example({"m": np.arange(6).reshape(2, 3), "s": 7, "t": np.float32(2.5)}))
    assert decoded["m"].tolist() == [0, 1, 2, 3, 4, 5]
    assert decoded["s"].tolist() == [7] and decoded["t"].tolist() == [2.5]


def test_large_arrays_round_trip_exactly():
    rng = np.random.default_rng(0)
    floats = rng.normal(size=5000).astype(np.float32)
    ints = rng.integers(-(2**63), 2**63 - 1, size=5000, dtype=np.int64)
    decoded = decode_example(encode_example({"f": floats, "i": ints}))
    np.testing.assert_array_equal(decoded["f"], floats)
    np.testing.assert_array_equal(decoded["i"], ints)
    decoded["f"][0] = 1.0  # decoded arrays are writable copies


def test_encoder_matches_protobuf_message_api():
    protos = example_protos()
    rng = np.random.default_rng(1)
    example = protos.Example()
    features = {}
    for index in range(6):
        name = f"feature_{index}"
        if index % 3 == 0:
            values = rng.integers(-(10**12), 10**12, size=index + 1).tolist()
            example.features.feature[name].int64_list.value.extend(values)
        elif index % 3 == 1:
            values = rng.normal(size=index + 1).astype(np.float32).tolist()
            example.features.feature[name].float_list.value.extend(values)
        else:
            values = [rng.bytes(index) for _ in range(index)]
            example.features.feature[name].bytes_list.value.extend(values)
        features[name] = values
    assert encode_example(features) == example.SerializeToString(deterministic=True)


def test_last_map_entry_wins_and_unknown_fields_are_skipped():
    first = encode_example({"k": [1]})[2:]  # the Features payload of each
    second = encode_example({"k": [2]})[2:]
    unknown = bytes.fromhex("1805")  # field 3 varint: not in Example, must be skipped
    example = b"\x0a" + bytes([len(first)]) + first + unknown + b"\x0a" + bytes([len(second)]) + second
    assert decode_example(example)["k"].tolist() == [2]


def test_feature_without_kind_decodes_empty():
    protos = example_protos()
    example = protos.Example()
    example.features.feature["none"].SetInParent()
    serialized = example.SerializeToString()
    assert decode_example(serialized) == {"none": []}
    assert example_kinds(serialized) == {"none": None}


def test_empty_example_and_sequence_parts():
    assert decode_example(b"") == {}
    assert encode_example({}) == b"\x0a\x00"
    assert encode_sequence_example(None, None) == b""
    assert encode_sequence_example({}, {}) == b"\x0a\x00\x12\x00"
    context, lists = decode_sequence_example(encode_sequence_example({}, {"empty": []}))
    assert context == {} and lists == {"empty": []}


def test_sequence_example_kinds_and_errors():
    encoded = encode_sequence_example(
        {"id": ["abc"]}, {"x": [[1.0, 2.0], [], [3]], "e": [[], []]}, kinds={"e": "bytes"}
    )
    context, lists = decode_sequence_example(encoded)
    assert context["id"] == [b"abc"]
    assert [frame.tolist() for frame in lists["x"]] == [[1.0, 2.0], [], [3.0]]
    assert lists["e"] == [[], []]
    with pytest.raises(TypeError, match="frames mix kinds"):
        encode_sequence_example(None, {"x": [[1], [b"a"]]})
    with pytest.raises(ValueError, match="only empty frames"):
        encode_sequence_example(None, {"x": [[], []]})
    with pytest.raises(TypeError, match="sequence of frames"):
        encode_sequence_example(None, {"x": 5})


def test_encode_errors_name_the_feature():
    with pytest.raises(TypeError, match="'mixed'.*mix of"):
        encode_example({"mixed": [1, b"a"]})
    with pytest.raises(TypeError, match="'x' is declared int64 but holds 1.5"):
        encode_example({"x": [1.5]}, kinds={"x": "int64"})
    with pytest.raises(TypeError, match="'x' is declared int64 but holds float64"):
        encode_example({"x": np.array([1.5])}, kinds={"x": "int64"})
    with pytest.raises(TypeError, match="'x' is declared float but holds non-numeric"):
        encode_example({"x": ["a"]}, kinds={"x": "float"})
    with pytest.raises(TypeError, match="'x' is declared bytes"):
        encode_example({"x": [1]}, kinds={"x": "bytes"})
    with pytest.raises(ValueError, match="kind 'double'"):
        encode_example({"x": [1]}, kinds={"x": "double"})
    with pytest.raises(TypeError, match="names must be str"):
        encode_example({1: [1]})
    with pytest.raises(TypeError, match="mapping"):
        encode_example([("a", [1])])
    with pytest.raises(TypeError, match="complex128"):
        encode_example({"c": np.array([1j])})


@pytest.mark.parametrize("bad", [b"\x0a\x05\x01", b"\x0b", b"\x0a\x02\x0a\x09", b"\x0a\x80"])
def test_malformed_bytes_raise_decode_error(bad):
    with pytest.raises(ExampleDecodeError, match="not a valid serialized Example"):
        decode_example(bad)


def test_decode_rejects_non_bytes():
    with pytest.raises(TypeError, match="as bytes; received str"):
        decode_example("text")
    assert decode_example(bytearray(WORKED_EXAMPLE))["c"] == [b"hi"]


def test_proto_classes_mirror_tensorflow_and_live_in_a_private_pool():
    protos = example_protos()
    assert protos is example_protos()  # built once
    descriptor = protos.Example.DESCRIPTOR
    assert descriptor.full_name == "tensorflow.Example"
    assert descriptor.file.name == "tensorflow/core/example/example.proto"
    feature = protos.Feature.DESCRIPTOR
    assert {field.name: field.number for field in feature.fields} == {"bytes_list": 1, "float_list": 2, "int64_list": 3}
    assert [field.name for field in feature.oneofs_by_name["kind"].fields] == ["bytes_list", "float_list", "int64_list"]
    assert protos.FloatList.DESCRIPTOR.fields_by_name["value"].is_packed
    assert protos.Int64List.DESCRIPTOR.fields_by_name["value"].is_packed
    assert protos.Features.DESCRIPTOR.fields_by_name["feature"].message_type.GetOptions().map_entry
    sequence = protos.SequenceExample.DESCRIPTOR
    assert {field.name: field.number for field in sequence.fields} == {"context": 1, "feature_lists": 2}
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("tensorflow.Example")
    assert protos.Example.FromString(WORKED_EXAMPLE).features.feature["a"].int64_list.value[:] == [1, 2]
