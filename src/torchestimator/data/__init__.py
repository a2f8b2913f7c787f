"""Data: input functions for in-memory data, TFRecord files and tf.train.Example records, without TensorFlow.

Names are imported on first use (``torchestimator._lazy``): reading TFRecords needs neither the
in-memory input functions nor the Example parser.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.data._decode_raw import decode_raw
    from torchestimator.data.example import (
        decode_example,
        decode_sequence_example,
        encode_example,
        encode_sequence_example,
        example_kinds,
        example_protos,
    )
    from torchestimator.data.images import ImageDecoding, decode_image, decode_jpeg, decode_png, resize_image
    from torchestimator.data.inputs import (
        ResumableIterable,
        dataset_input_fn,
        describe_batch_sizes,
        numpy_input_fn,
        pandas_input_fn,
    )
    from torchestimator.data.parsing import (
        FixedLenFeature,
        FixedLenSequenceFeature,
        RaggedFeature,
        RaggedValue,
        SparseValue,
        VarLenFeature,
        parse_example,
        parse_single_example,
        parse_single_sequence_example,
        to_torch,
    )
    from torchestimator.data.tfrecord import (
        ReadStats,
        TFRecordWriter,
        iter_record_blocks,
        iter_records,
        list_files,
        masked_crc32c,
        read_records,
        unmask_crc32c,
    )
    from torchestimator.data.tfrecord_dataset import TFRecordDataset, TFRecordLoader
    from torchestimator.errors import DataLossError, ExampleDecodeError, ExampleParseError, ImageDecodeError

__all__ = [
    "DataLossError",
    "ExampleDecodeError",
    "ExampleParseError",
    "FixedLenFeature",
    "FixedLenSequenceFeature",
    "ImageDecodeError",
    "ImageDecoding",
    "RaggedFeature",
    "RaggedValue",
    "ReadStats",
    "ResumableIterable",
    "SparseValue",
    "TFRecordDataset",
    "TFRecordLoader",
    "TFRecordWriter",
    "VarLenFeature",
    "dataset_input_fn",
    "decode_example",
    "decode_image",
    "decode_jpeg",
    "decode_png",
    "decode_raw",
    "decode_sequence_example",
    "describe_batch_sizes",
    "encode_example",
    "encode_sequence_example",
    "example_kinds",
    "example_protos",
    "iter_record_blocks",
    "iter_records",
    "list_files",
    "masked_crc32c",
    "numpy_input_fn",
    "pandas_input_fn",
    "parse_example",
    "parse_single_example",
    "parse_single_sequence_example",
    "read_records",
    "resize_image",
    "to_torch",
    "unmask_crc32c",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "torchestimator.data.example": [
            "ExampleDecodeError",
            "ExampleParseError",
            "decode_example",
            "decode_sequence_example",
            "encode_example",
            "encode_sequence_example",
            "example_kinds",
            "example_protos",
        ],
        "torchestimator.data.images": [
            "ImageDecodeError",
            "ImageDecoding",
            "decode_image",
            "decode_jpeg",
            "decode_png",
            "resize_image",
        ],
        "torchestimator.data.inputs": [
            "ResumableIterable",
            "dataset_input_fn",
            "describe_batch_sizes",
            "numpy_input_fn",
            "pandas_input_fn",
        ],
        "torchestimator.data.parsing": [
            "FixedLenFeature",
            "FixedLenSequenceFeature",
            "RaggedFeature",
            "RaggedValue",
            "SparseValue",
            "VarLenFeature",
            "decode_raw",
            "parse_example",
            "parse_single_example",
            "parse_single_sequence_example",
            "to_torch",
        ],
        "torchestimator.data.tfrecord": [
            "DataLossError",
            "ReadStats",
            "TFRecordWriter",
            "iter_record_blocks",
            "iter_records",
            "list_files",
            "masked_crc32c",
            "read_records",
            "unmask_crc32c",
        ],
        "torchestimator.data.tfrecord_dataset": ["TFRecordDataset", "TFRecordLoader"],
    },
)
