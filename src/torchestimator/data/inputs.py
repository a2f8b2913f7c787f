"""Resumable input functions for in-memory data: numpy arrays, pandas frames, map-style Datasets.

What belongs here: the `input_fn` factories users know from
`tf.compat.v1.estimator.inputs` (`numpy_input_fn`, `pandas_input_fn`), the
framework's DataLoader input (`dataset_input_fn`), the `ResumableIterable`
protocol the training loop uses for exact resume, and the batch-size wording
used in logs. What does not: TFRecord reading and parsing (other `data`
modules), and the loop that consumes the batches.

Semantics shared by every input function here:

- `batch_size` is the *global* batch size (`split_global_batch`, the one
  rule of every input helper, TFRecordDataset's too). Under an
  `InputContext` with P input pipelines (one per process here), pipeline r
  receives the r-th contiguous slice of every global batch, so the union over
  replicas of step k is exactly the single-replica batch k: two processes with
  batch B each see what one process sees with batch 2B.
- Epochs are repeated, then batched, as TF's `repeat(num_epochs).batch(B)`
  (and its queue-based `numpy_input_fn`): batches run across epoch
  boundaries (10 rows, batch 4: `[0-3] [4-7] [8 9 0 1] [2-5] ...`), so with
  `num_epochs=None` every batch is full, and with a finite `num_epochs` only
  the very last batch may be short (`drop_remainder=True` drops it).
- That last short batch is split as evenly as possible (sizes differ by at
  most one, earlier replicas get the extra rows). Every replica therefore
  yields the same number of batches and DDP never waits on a replica that ran
  out; when it has fewer rows than there are replicas, some replicas get a
  batch with zero rows (a warning is logged). For training on several
  replicas prefer `drop_remainder=True` or `num_epochs=None`.
- Shuffling draws a fresh permutation for every epoch from
  `numpy.random.default_rng([seed, epoch])`, never from global RNG state, so
  the order is deterministic and a resumed run sees the same order. When
  `seed` is None, `config.random_seed` is used if the config has it and it is
  not None, else 0.
- Each batch is `(features, labels)`; `labels` is None when there are none.
- The position (`state_dict()`) is `{"epoch", "row"}`: the next row of the
  stream after the global batches handed to the consumer, so it depends
  neither on the number of replicas nor on the batch size: a checkpoint
  written with one process resumes exactly with two, and the reverse. (The
  `{"epoch", "batch"}` positions of earlier versions, whose epochs each ended
  with a short batch, resume at the same row.)
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, default_collate

from torchestimator._extras import import_extra
from torchestimator.distribute.input_context import InputContext

logger = logging.getLogger(__name__)

__all__ = [
    "ResumableIterable",
    "dataset_input_fn",
    "describe_batch_sizes",
    "describe_position",
    "numpy_input_fn",
    "pandas_input_fn",
]

_SHUFFLE_REASON = (
    "shuffle must be provided and explicitly set as boolean (it is recommended to set it "
    "as True for training, False for evaluation and prediction)"
)


@runtime_checkable
class ResumableIterable(Protocol):
    """An iterable of batches that can report and restore its position.

    The training loop calls `state_dict()` when it saves a checkpoint and
    `load_state_dict()` before the first `iter()` after a restore. An
    iterable may also define `describe_position(state) -> str`, one short line
    for the log at resume (see `describe_position`); it is optional.
    """

    def __iter__(self) -> Iterator[Any]: ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable position: just after the last batch handed to the consumer."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration continue right after the batch `state` points to."""
        ...


_POSITION_LINE_LIMIT = 200  # characters of a position's line in the log at resume


def describe_position(source: Any, position: Any) -> str:
    """A saved input position in one short line, for the "Input resumes at ..." log.

    Sources that know their positions say where they stand
    (`source.describe_position(position)`: the epoch, the file and byte offset
    read next, the records consumed); any other position is its repr, cut at
    200 characters. The whole position is for the DEBUG log.
    """
    describe = getattr(source, "describe_position", None)
    text = describe(position) if callable(describe) else repr(position)
    if len(text) > _POSITION_LINE_LIMIT:
        text = f"{text[: _POSITION_LINE_LIMIT - 60]}... ({len(text)} characters; the whole position is at DEBUG)"
    return text


def describe_batch_sizes(global_batch_size: int, input_context: InputContext | None = None) -> str:
    """Both batch sizes in words, e.g. "global batch 128 = 2 replicas x 64 per replica"."""
    context = input_context or InputContext()
    replicas = context.num_replicas_in_sync
    per_replica = context.get_per_replica_batch_size(global_batch_size)
    noun = "replica" if replicas == 1 else "replicas"
    return f"global batch {global_batch_size} = {replicas} {noun} x {per_replica} per replica"


def split_global_batch(caller: str, global_batch_size: int, num_replicas: int, details: str = "") -> int:
    """The batch each replica gets from a global `batch_size`: THE batch rule of every input helper.

    `batch_size` is always the global batch, split evenly across the
    `num_replicas` input pipelines (processes) by
    `InputContext.get_per_replica_batch_size`; a batch that does not divide is
    refused naming both numbers. Logs the start-up line, e.g.
    "numpy_input_fn: global batch 128 = 2 replicas x 64 per replica, <details>".
    """
    context = InputContext(num_replicas_in_sync=num_replicas, num_input_pipelines=num_replicas)
    try:
        words = describe_batch_sizes(global_batch_size, context)
    except ValueError as error:
        raise ValueError(f"{caller}: {error} (batch_size is the global batch, shared by the replicas.)") from None
    logger.info("%s: %s%s", caller, words, f", {details}" if details else "")
    return context.get_per_replica_batch_size(global_batch_size)


# --------------------------------------------------------------------------- the batch plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class _BatchPlan:
    """Which rows each global batch holds, for one input pipeline: TF's `repeat(num_epochs).batch(B)`.

    The epochs' orders are laid end to end in one stream of rows (a fresh
    permutation per epoch when shuffling) and global batch k is rows
    [k B, (k + 1) B) of that stream, so a batch may run across an epoch
    boundary; only the very last batch of a finite stream may be short (and
    `drop_remainder` drops it). A place in the stream is an `offset`: the
    count of rows handed out since the start.
    """

    num_examples: int
    global_batch_size: int
    num_epochs: int | None
    shuffle: bool
    seed: int
    drop_remainder: bool
    num_pipelines: int = 1
    pipeline_id: int = 0

    @property
    def total_rows(self) -> int | None:
        return None if self.num_epochs is None else self.num_epochs * self.num_examples

    @property
    def total_batches(self) -> int | None:
        total = self.total_rows
        if total is None:
            return None
        if self.drop_remainder:
            return total // self.global_batch_size
        return math.ceil(total / self.global_batch_size)

    @property
    def last_batch_rows(self) -> int:
        """Rows of the short last batch of a finite stream; 0 when there is none (or it is dropped)."""
        total = self.total_rows
        return 0 if total is None or self.drop_remainder else total % self.global_batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_examples, dtype=np.int64)
        generator = np.random.default_rng([self.seed, epoch])
        return generator.permutation(self.num_examples).astype(np.int64, copy=False)

    def pipeline_rows(self, rows: np.ndarray) -> np.ndarray:
        """This pipeline's contiguous share of one global batch's rows (uneven only if it is short)."""
        base, extra = divmod(len(rows), self.num_pipelines)
        start = self.pipeline_id * base + min(self.pipeline_id, extra)
        size = base + (1 if self.pipeline_id < extra else 0)
        return rows[start : start + size]

    def iterate(self, start: int) -> Iterator[tuple[int, np.ndarray]]:
        """(offset after the batch, this pipeline's rows) for each batch from offset `start` on."""
        size, total, count = self.global_batch_size, self.total_rows, self.num_examples
        orders: dict[int, np.ndarray] = {}  # the epochs the current batch touches (two, unless B > N)
        offset = start
        while total is None or offset < total:
            stop = offset + size if total is None else min(offset + size, total)
            if stop - offset < size and self.drop_remainder:
                return
            pieces = []
            while offset < stop:
                epoch, row = divmod(offset, count)
                if epoch not in orders:
                    orders = {key: order for key, order in orders.items() if key >= epoch}
                    orders[epoch] = self.epoch_order(epoch)
                take = min(stop - offset, count - row)
                pieces.append(orders[epoch][row : row + take])
                offset += take
            rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            yield stop, self.pipeline_rows(rows)

    def position(self, offset: int) -> dict[str, int]:
        """The JSON position of a stream offset: the next row is row `row` of epoch `epoch`'s order."""
        epoch, row = divmod(offset, self.num_examples)
        return {"epoch": int(epoch), "row": int(row)}

    def check_position(self, state: Mapping[str, Any]) -> int:
        """Validate a saved position against this plan and return its stream offset.

        `{"epoch", "row"}` names the next row; `{"epoch", "batch"}` is the
        position of earlier versions, whose epochs each ended with their own
        short batch: it resumes at the same next row.
        """
        keys = set(state) if isinstance(state, Mapping) else set()
        if keys not in ({"epoch", "row"}, {"epoch", "batch"}):
            raise ValueError(f"Expected an input position {{'epoch': int, 'row': int}}; received {state!r}.")
        epoch, index = state["epoch"], state["row" if "row" in keys else "batch"]
        valid = all(isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in (epoch, index))
        count, size = self.num_examples, self.global_batch_size
        if valid and "batch" in keys:  # the earlier per-epoch batches
            per_epoch = count // size if self.drop_remainder else math.ceil(count / size)
            valid = index <= per_epoch
            epoch, index = (epoch + 1, 0) if index >= per_epoch else (epoch, index * size)
        offset = epoch * count + index if valid else -1
        total = self.total_rows
        if not valid or index >= count or (total is not None and offset > total):
            epochs = "unlimited" if self.num_epochs is None else self.num_epochs
            raise ValueError(
                f"The input position {dict(state)!r} lies outside this input ({count} examples, "
                f"{epochs} epochs). Was the checkpoint written with different num_epochs or data? "
                f"Resume with the same input settings, or start from a fresh model_dir."
            )
        return offset


class _ResumableBatches(abc.ABC):
    """Position bookkeeping shared by every iterable here.

    Like torchdata's StatefulDataLoader: each `iter()` starts from the
    beginning, unless `load_state_dict` was called since the previous `iter()`,
    in which case it starts at the loaded position. Use one iterator at a time.
    """

    def __init__(self, plan: _BatchPlan) -> None:
        self._plan = plan
        self._position = 0  # stream offset after the last batch handed out
        self._next_start = 0

    def state_dict(self) -> dict[str, int]:
        return self._plan.position(self._position)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._position = self._next_start = self._plan.check_position(state)

    def describe_position(self, state: Mapping[str, Any]) -> str:
        """`state` in words, e.g. "epoch 3, row 40 of 100 (340 rows consumed)"."""
        offset = self._plan.check_position(state)
        epoch, row = divmod(offset, self._plan.num_examples)
        return f"epoch {epoch}, row {row} of {self._plan.num_examples} ({offset} rows consumed)"

    def __iter__(self) -> Iterator[Any]:
        start, self._next_start = self._next_start, 0
        self._position = start
        return self._generate(start)

    @abc.abstractmethod
    def _generate(self, start: int) -> Iterator[Any]:
        """Batches from stream offset `start` on, advancing `self._position` as they are handed out."""


class _Sized:
    """Adds `len()`: batches per replica over all epochs (finite inputs only)."""

    _plan: _BatchPlan

    def __len__(self) -> int:  # with a resumed position too: the whole input's batches, as TF's cardinality
        total = self._plan.total_batches
        assert total is not None, "_Sized is only mixed into finite inputs"
        return total


# --------------------------------------------------------------------------- options and checks


@dataclasses.dataclass(frozen=True, kw_only=True)
class _BatchOptions:
    caller: str
    batch_size: int
    num_epochs: int | None
    shuffle: bool
    seed: int | None
    drop_remainder: bool

    def __post_init__(self) -> None:
        if not _is_positive_int(self.batch_size):
            raise ValueError(
                f"{self.caller}: batch_size must be a positive integer (the global batch "
                f"size); received {self.batch_size!r}."
            )
        if self.num_epochs is not None and not _is_positive_int(self.num_epochs):
            raise ValueError(
                f"{self.caller}: num_epochs must be a positive integer, or None to repeat "
                f"forever; received {self.num_epochs!r}."
            )
        if self.seed is not None:
            _check_seed(self.seed, f"{self.caller}: seed")

    def plan(self, num_examples: int, input_context: InputContext | None, config: Any) -> _BatchPlan:
        """The batch plan for one pipeline; refuses a global batch the replicas cannot share."""
        context = input_context or InputContext()
        plan = _BatchPlan(
            num_examples=num_examples,
            global_batch_size=self.batch_size,
            num_epochs=self.num_epochs,
            shuffle=self.shuffle,
            seed=_resolve_seed(self.seed, config),
            drop_remainder=self.drop_remainder,
            num_pipelines=context.num_input_pipelines,
            pipeline_id=context.input_pipeline_id,
        )
        epochs = (
            "repeated forever"
            if plan.num_epochs is None
            else f"x {plan.num_epochs} epochs = {plan.total_batches} batches"
        )
        split_global_batch(
            self.caller,
            self.batch_size,
            plan.num_pipelines,
            f"{num_examples} examples {epochs}, shuffle={plan.shuffle}, seed={plan.seed}",
        )
        if plan.total_batches == 0:
            raise ValueError(
                f"{self.caller}: drop_remainder=True with {num_examples} examples x {plan.num_epochs} "
                f"epochs and a global batch of {self.batch_size} leaves no batch at all. Use a batch "
                f"size of at most {num_examples * (plan.num_epochs or 1)} or drop_remainder=False."
            )
        if 0 < plan.last_batch_rows < plan.num_pipelines:
            logger.warning(
                "%s: the last batch has %d rows for %d replicas, so some replicas get an empty "
                "batch; use drop_remainder=True for training.",
                self.caller,
                plan.last_batch_rows,
                plan.num_pipelines,
            )
        return plan


def _required_shuffle(caller: str, shuffle: bool | None) -> bool:
    """`shuffle` once checked: the input functions default it to None only to demand an explicit choice."""
    if not isinstance(shuffle, bool):
        raise ValueError(f"{caller}: {_SHUFFLE_REASON}; got {shuffle!r}.")
    return shuffle


def _is_positive_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value > 0)


def _check_seed(seed: Any, where: str) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"{where} must be a non-negative integer; received {seed!r}.")
    return int(seed)


def _resolve_seed(seed: int | None, config: Any) -> int:
    """The explicit seed, else `config.random_seed` when set, else 0."""
    if seed is not None:
        return int(seed)
    config_seed = getattr(config, "random_seed", None)
    if config_seed is None:
        return 0
    return _check_seed(config_seed, "config.random_seed")


# --------------------------------------------------------------------------- arrays


def _check_array(value: Any, where: str, caller: str) -> np.ndarray:
    """`value` as a numpy array a tensor can be made from, with rows on axis 0."""
    array = np.asarray(value)
    if array.ndim == 0:
        raise ValueError(f"{caller}: {where} must be an array with one row per example; received a scalar.")
    if array.dtype.kind not in "biufc":
        raise TypeError(
            f"{caller}: {where} has dtype {array.dtype}, which cannot become a tensor. Only "
            f"bool, integer, floating and complex data can; encode strings as numbers "
            f"(e.g. a vocabulary lookup) before building the input_fn."
        )
    if not array.dtype.isnative:
        # Same values and logical dtype, native byte order: torch refuses the other.
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        torch.from_numpy(array[:1].copy())
    except TypeError as error:
        raise TypeError(f"{caller}: {where} has dtype {array.dtype}: {error}") from None
    return array


def _columns(value: Any, name: str, caller: str) -> np.ndarray | dict[Any, np.ndarray] | None:
    """Validate x or y: an array, a non-empty dict of arrays, or (for y) None."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if not value:
            raise ValueError(f"{caller}: {name} cannot be an empty dict; use None instead.")
        return {key: _check_array(array, f"{name}[{key!r}]", caller) for key, array in value.items()}
    return _check_array(value, name, caller)


def _lengths(value: np.ndarray | dict[Any, np.ndarray] | None) -> Any:
    if value is None:
        return None
    if isinstance(value, dict):
        return {key: len(array) for key, array in value.items()}
    return len(value)


def _common_length(features: Any, labels: Any, caller: str) -> int:
    arrays = [features] if isinstance(features, np.ndarray) else list(features.values())
    if labels is not None:
        arrays += [labels] if isinstance(labels, np.ndarray) else list(labels.values())
    lengths = {len(array) for array in arrays}
    if len(lengths) != 1:
        raise ValueError(
            f"{caller}: every array in x and y must have the same length (one row per "
            f"example). Received lengths in x: {_lengths(features)}; in y: {_lengths(labels)}."
        )
    (length,) = lengths
    if length == 0:
        raise ValueError(f"{caller}: x and y hold no examples (length 0); nothing to iterate.")
    return length


def _take(value: Any, rows: np.ndarray) -> Any:
    # Fancy indexing copies, so the tensors never alias the caller's arrays.
    if value is None:
        return None
    if isinstance(value, dict):
        return {key: torch.from_numpy(array[rows]) for key, array in value.items()}
    return torch.from_numpy(value[rows])


class _ArrayBatches(_ResumableBatches):
    """Batches of rows of in-memory arrays, as `(features, labels)` tensors."""

    def __init__(self, plan: _BatchPlan, features: Any, labels: Any) -> None:
        super().__init__(plan)
        self._features = features
        self._labels = labels

    def _generate(self, start: int) -> Iterator[tuple[Any, Any]]:
        for position, rows in self._plan.iterate(start):
            batch = (_take(self._features, rows), _take(self._labels, rows))
            self._position = position
            yield batch


class _SizedArrayBatches(_Sized, _ArrayBatches):
    pass


def _array_input_fn(features: Any, labels: Any, options: _BatchOptions) -> Callable[..., _ArrayBatches]:
    num_examples = _common_length(features, labels, options.caller)

    def input_fn(input_context: InputContext | None = None, config: Any = None) -> _ArrayBatches:
        plan = options.plan(num_examples, input_context, config)
        batches_type = _ArrayBatches if plan.num_epochs is None else _SizedArrayBatches
        return batches_type(plan, features, labels)

    return input_fn


def numpy_input_fn(
    x: np.ndarray | Mapping[Any, np.ndarray],
    y: np.ndarray | Mapping[Any, np.ndarray] | None = None,
    batch_size: int = 128,
    num_epochs: int | None = 1,
    shuffle: bool | None = None,
    seed: int | None = None,
    drop_remainder: bool = False,
) -> Callable[..., ResumableIterable]:
    """An input_fn feeding numpy arrays, as `tf.compat.v1.estimator.inputs.numpy_input_fn`.

    Args:
        x: a dict of arrays (features become a dict of tensors with the same
            keys) or one array (features become that tensor).
        y: an array, a dict of arrays, or None; rows must match x.
        batch_size: the global batch size, shared by the replicas.
        num_epochs: passes over the data; None repeats forever.
        shuffle: required, as in TF: True for training, False otherwise.
        seed: seeds the per-epoch permutations; None takes `config.random_seed`
            when set, else 0.
        drop_remainder: drop the last batch when it is short (batches run
            across epoch boundaries, so only the very last one can be).

    Tensors are made with `torch.from_numpy` on the selected rows, so dtypes
    are kept as they are (float64 stays float64: cast the arrays beforehand if
    the model wants float32). The returned `input_fn(input_context=None,
    config=None)` builds a `ResumableIterable` whose `len()` is the number of
    batches per replica over all epochs (finite inputs only).
    """
    caller = "numpy_input_fn"
    options = _BatchOptions(
        caller=caller,
        batch_size=batch_size,
        num_epochs=num_epochs,
        shuffle=_required_shuffle(caller, shuffle),
        seed=seed,
        drop_remainder=drop_remainder,
    )
    if not isinstance(x, (np.ndarray, Mapping)):
        raise TypeError(f"{caller}: x must be a dict of arrays or an array; got {type(x).__name__}.")
    return _array_input_fn(_columns(x, "x", caller), _columns(y, "y", caller), options)


# --------------------------------------------------------------------------- pandas


def _frame_column(series: Any, where: str, caller: str) -> np.ndarray:
    """One pandas column as a numpy array, refusing what cannot become a tensor."""
    from pandas.api import types

    if not (types.is_numeric_dtype(series.dtype) or types.is_bool_dtype(series.dtype)):
        raise TypeError(
            f"{caller}: {where} has dtype {series.dtype}, which cannot become a tensor. Only "
            f"bool, integer, floating and complex columns can; encode strings and categories "
            f"as numbers (e.g. x[{series.name!r}].astype('category').cat.codes) or drop the column."
        )
    if not isinstance(series.dtype, np.dtype) and series.hasnans:
        # Nullable extension columns (Int64, boolean) would silently turn into float arrays.
        raise ValueError(
            f"{caller}: {where} (dtype {series.dtype}) has missing values, which its dtype "
            f"cannot hold as a tensor. Fill them (fillna) or cast the column to float first."
        )
    return _check_array(series.to_numpy(), where, caller)


def _frame_columns(frame: Any, name: str, caller: str) -> dict[Any, np.ndarray]:
    if frame.columns.has_duplicates:
        duplicated = sorted({str(column) for column in frame.columns[frame.columns.duplicated()]})
        raise ValueError(f"{caller}: {name} has duplicate column names {duplicated}; rename them.")
    return {column: _frame_column(frame[column], f"{name} column {column!r}", caller) for column in frame.columns}


def pandas_input_fn(
    x: Any,
    y: Any = None,
    batch_size: int = 128,
    num_epochs: int | None = 1,
    shuffle: bool | None = None,
    seed: int | None = None,
    drop_remainder: bool = False,
    target_column: str = "target",
) -> Callable[..., ResumableIterable]:
    """An input_fn feeding a pandas DataFrame, as `tf.compat.v1.estimator.inputs.pandas_input_fn`.

    Features are a dict column name -> tensor. `y` is a Series (labels become
    one tensor), a DataFrame (a dict of tensors) or None; its index must equal
    `x.index`, as in TF. Only numeric and bool columns can become tensors: any
    other column is refused, naming it. `target_column` is accepted for
    compatibility with TF, which used it to pack `y` into `x`; the labels are
    kept apart here, so it cannot collide with a feature column. Everything
    else is as `numpy_input_fn`.
    """
    caller = "pandas_input_fn"
    pd = import_extra("pandas", extra="pandas", feature=caller)  # the only user of pandas

    options = _BatchOptions(
        caller=caller,
        batch_size=batch_size,
        num_epochs=num_epochs,
        shuffle=_required_shuffle(caller, shuffle),
        seed=seed,
        drop_remainder=drop_remainder,
    )
    if not isinstance(target_column, str):
        raise TypeError(f"{caller}: target_column must be a string; got {target_column!r}.")
    if not isinstance(x, pd.DataFrame):
        raise TypeError(f"{caller}: x must be a pandas DataFrame; got {type(x).__name__}.")
    labels: np.ndarray | dict[Any, np.ndarray] | None = None
    if y is not None:
        if not isinstance(y, (pd.Series, pd.DataFrame)):
            raise TypeError(f"{caller}: y must be a pandas Series, DataFrame or None; got {type(y).__name__}.")
        if not np.array_equal(x.index, y.index):
            raise ValueError(
                f"{caller}: the indexes of x and y are mismatched; they must be equal row for "
                f"row (use y.reindex(x.index) or reset both).\nIndex for x: {x.index}\n"
                f"Index for y: {y.index}"
            )
        if isinstance(y, pd.DataFrame):
            labels = _frame_columns(y, "y", caller)
        else:
            labels = _frame_column(y, "y", caller)
    return _array_input_fn(_frame_columns(x, "x", caller), labels, options)


# --------------------------------------------------------------------------- map-style Datasets


def _collate_pairs(items: list[Any]) -> tuple[Any, Any]:
    """Default collate for `(features, label)` items; labels stay None when every label is."""
    try:
        features = [item[0] for item in items]
        labels = [item[1] for item in items]
        if any(len(item) != 2 for item in items):
            raise TypeError("wrong length")
    except (TypeError, IndexError, KeyError):
        received = type(items[0]).__name__ if items else "nothing"
        raise TypeError(
            f"dataset_input_fn expects every dataset item to be a (features, label) pair; "
            f"received a {received}. Return `features, label` from __getitem__ (label may be "
            f"None) or pass a collate_fn."
        ) from None
    if all(label is None for label in labels):
        return default_collate(features), None
    return default_collate(features), default_collate(labels)


def _empty_like(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value[:0]
    if isinstance(value, Mapping):
        return {key: _empty_like(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_empty_like(item) for item in value)
    return value


class _EmptySafeCollate:
    """Collate that turns a replica's empty share of the last batch into zero-row tensors.

    `default_collate([])` fails, so the structure and dtypes are taken from one
    collated item and cut to zero rows.
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any], dataset: Dataset) -> None:
        self.collate_fn = collate_fn
        self.dataset = dataset

    def __call__(self, items: list[Any]) -> Any:
        if items:
            return self.collate_fn(items)
        return _empty_like(self.collate_fn([self.dataset[0]]))


class _PlanBatchSampler(Sampler[list[int]]):
    """Yields this replica's dataset indices per batch, starting at a position (skips by index)."""

    def __init__(self, plan: _BatchPlan, start: int) -> None:
        super().__init__()
        self._plan = plan
        self._start = start

    def __iter__(self) -> Iterator[list[int]]:
        for _, rows in self._plan.iterate(self._start):
            yield rows.tolist()


class _DatasetBatches(_ResumableBatches):
    """A DataLoader over one map-style Dataset, positioned in batches handed to the consumer."""

    def __init__(
        self,
        plan: _BatchPlan,
        dataset: Dataset,
        collate_fn: Callable[[list[Any]], Any],
        num_workers: int,
    ) -> None:
        super().__init__(plan)
        self._dataset = dataset
        self._collate_fn = _EmptySafeCollate(collate_fn, dataset)
        self._num_workers = num_workers

    def _generate(self, start: int) -> Iterator[Any]:
        # An own generator keeps DataLoader from drawing worker seeds from torch's
        # global RNG, which would shift the training run's random stream.
        generator = torch.Generator()
        generator.manual_seed(self._plan.seed)
        loader = DataLoader(
            self._dataset,
            batch_sampler=_PlanBatchSampler(self._plan, start),
            collate_fn=self._collate_fn,
            num_workers=self._num_workers,
            generator=generator,
        )
        # The loader delivers in sampler order, so the plan's positions follow it in
        # step; prefetched batches are not counted until they are handed out.
        positions = (position for position, _ in self._plan.iterate(start))
        for position, batch in zip(positions, loader):
            self._position = position
            yield batch


class _SizedDatasetBatches(_Sized, _DatasetBatches):
    pass


def dataset_input_fn(
    dataset: Dataset,
    batch_size: int,
    shuffle: bool | None,
    num_epochs: int | None = 1,
    seed: int | None = None,
    drop_remainder: bool = False,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    num_workers: int = 0,
) -> Callable[..., ResumableIterable]:
    """An input_fn feeding a map-style Dataset of `(features, label)` items through a DataLoader.

    Sharding, shuffling, epochs and the resumable position are those of
    `numpy_input_fn`; a batch sampler picks the indices, so resuming skips at
    the index level without loading the skipped items, and with
    `num_workers > 0` the position counts batches handed to the consumer, not
    the ones prefetched. The default `collate_fn` stacks features and labels
    separately with `default_collate` and yields `(features, labels)`.
    Randomness inside `dataset[i]` (augmentation) is not replayed on resume.
    """
    caller = "dataset_input_fn"
    options = _BatchOptions(
        caller=caller,
        batch_size=batch_size,
        num_epochs=num_epochs,
        shuffle=_required_shuffle(caller, shuffle),
        seed=seed,
        drop_remainder=drop_remainder,
    )
    if isinstance(dataset, IterableDataset) or not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(
            f"{caller}: dataset must be a map-style Dataset (with __getitem__ and __len__); got "
            f"{type(dataset).__name__}. Return an iterable of batches from your own input_fn "
            f"for streaming data."
        )
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
        raise ValueError(f"{caller}: num_workers must be an integer >= 0; received {num_workers!r}.")
    num_examples = len(dataset)
    if num_examples == 0:
        raise ValueError(f"{caller}: the dataset is empty (len 0); nothing to iterate.")
    collate = collate_fn if collate_fn is not None else _collate_pairs

    def input_fn(input_context: InputContext | None = None, config: Any = None) -> _DatasetBatches:
        plan = options.plan(num_examples, input_context, config)
        batches_type = _DatasetBatches if plan.num_epochs is None else _SizedDatasetBatches
        return batches_type(plan, dataset, collate, num_workers)

    return input_fn
