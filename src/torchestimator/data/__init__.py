"""Data: input functions for in-memory data, TFRecord files and tf.train.Example records, without TensorFlow.

Names are imported on first use (``torchestimator._lazy``): reading TFRecords needs neither the
in-memory input functions nor the Example parser.
"""

from torchestimator._lazy import lazy_exports

__all__ = [
    "DataLossError",
    "ExampleDecodeError",
    "FixedLenFeature",
    "FixedLenSequenceFeature",
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
    "to_torch",
    "unmask_crc32c",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "torchestimator.data.example": [
            "ExampleDecodeError",
            "decode_example",
            "decode_sequence_example",
            "encode_example",
            "encode_sequence_example",
            "example_kinds",
            "example_protos",
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
