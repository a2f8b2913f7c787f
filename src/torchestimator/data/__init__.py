"""Data: input functions for in-memory data (and, later, TFRecord and tf.train.Example)."""

from torchestimator.data.inputs import (
    ResumableIterable,
    dataset_input_fn,
    describe_batch_sizes,
    numpy_input_fn,
    pandas_input_fn,
)

__all__ = ["ResumableIterable", "dataset_input_fn", "describe_batch_sizes", "numpy_input_fn", "pandas_input_fn"]
