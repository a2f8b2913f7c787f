"""Data: input functions for in-memory data, TFRecord files and tf.train.Example records, without TensorFlow.

Names are imported on first use (``torchestimator._lazy``): reading TFRecords needs neither the
in-memory input functions nor the Example parser.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.data._decode_raw import decode_raw as decode_raw
    from torchestimator.data.example import (
        decode_example as decode_example,
        decode_sequence_example as decode_sequence_example,
        encode_example as encode_example,
        encode_sequence_example as encode_sequence_example,
        example_kinds as example_kinds,
        example_protos as example_protos,
    )
    from torchestimator.data.images import (
        ImageDecoding as ImageDecoding,
        decode_image as decode_image,
        decode_jpeg as decode_jpeg,
        decode_png as decode_png,
        resize_image as resize_image,
    )
    from torchestimator.data.inputs import (
        ResumableIterable as ResumableIterable,
        dataset_input_fn as dataset_input_fn,
        describe_batch_sizes as describe_batch_sizes,
        numpy_input_fn as numpy_input_fn,
        pandas_input_fn as pandas_input_fn,
    )
    from torchestimator.data.parsing import (
        FixedLenFeature as FixedLenFeature,
        FixedLenSequenceFeature as FixedLenSequenceFeature,
        RaggedFeature as RaggedFeature,
        RaggedValue as RaggedValue,
        SparseValue as SparseValue,
        VarLenFeature as VarLenFeature,
        parse_example as parse_example,
        parse_single_example as parse_single_example,
        parse_single_sequence_example as parse_single_sequence_example,
        to_torch as to_torch,
    )
    from torchestimator.data.tfrecord import (
        DamagedRegion as DamagedRegion,
        ReadStats as ReadStats,
        TFRecordWriter as TFRecordWriter,
        iter_record_blocks as iter_record_blocks,
        iter_records as iter_records,
        list_files as list_files,
        masked_crc32c as masked_crc32c,
        read_records as read_records,
        unmask_crc32c as unmask_crc32c,
    )
    from torchestimator.data.tfrecord_dataset import (
        TFRecordDataset as TFRecordDataset,
        TFRecordLoader as TFRecordLoader,
    )
    from torchestimator.errors import (
        DataLossError as DataLossError,
        ExampleDecodeError as ExampleDecodeError,
        ExampleParseError as ExampleParseError,
        ImageDecodeError as ImageDecodeError,
    )

__all__, __getattr__, __dir__ = lazy_exports(__name__)
