"""Where a parameter-server run keeps each variable: TF's partitioners and placement, computed in plain torch.

Belongs here: how many shards a variable is cut into (the partitioners), which rows each shard holds, which
ps task holds it (``plan_placement`` -> ``PlacementPlan``), and cutting and gluing tensors and per-parameter
optimizer states by that plan. Every task (chief, workers, ps) computes the same plan from the same variables:
nothing here reads the environment, the clock or random numbers, and the arithmetic is on integers. Does not
belong here: RPC, processes, applying updates (``_ps_server.py``, ``_ps_optimizer.py``).

What TensorFlow does, read in its source, and what this module does
-------------------------------------------------------------------

Number of shards. TF's partitioners return one count per axis; TF2's ParameterServerStrategy accepts only the
first axis (``_create_variable`` refuses any other entry but 1), and so does this module.

* ``FixedShardsPartitioner(num_shards=n)``: TF1 ``fixed_size_partitioner(num_shards, axis=0)``
  (python/ops/partitioned_variables.py: ``min(num_shards, shape[axis].value)``) and TF2
  ``tf.distribute.experimental.partitioners.FixedShardsPartitioner`` (python/distribute/sharded_variable.py,
  the same expression). ``n = min(num_shards, rows)``.
* ``MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=m)``: TF1 ``min_max_variable_partitioner(max_partitions,
  axis=0, min_slice_size=256 << 10)``, which TF2's ``MinSizePartitioner`` calls:
  ``max(1, min(shape[axis], max_partitions, ceil(numel * itemsize / min_slice_size)))``. TF's default
  ``max_shards=1`` never splits anything, so here ``max_shards`` has no default (say how many you want).
* ``MaxSizePartitioner(max_shard_bytes, max_shards=None)``: TF1 ``variable_axis_size_partitioner(max_shard_bytes, axis=0,
  max_shards=None)``, which TF2's ``MaxSizePartitioner`` calls: with ``row_bytes = numel / rows * itemsize``,
  ``rows_per_shard = max(1, floor(max_shard_bytes / row_bytes))``, ``n = ceil(rows / rows_per_shard)``, then
  ``min(max_shards, n)`` when ``max_shards`` is set. A row larger than ``max_shard_bytes`` gets a shard of
  its own: the limit is not always reachable by cutting rows.

Where this differs from TF, and why: the sizes are computed in integers (TF divides floats; the counts agree
below 2**53 bytes); a variable with no rows or no bytes is one shard (TF divides by zero, or its strategy
refuses a count of 0); ``max_shards=0`` is refused (TF's ``if max_shards:`` reads it as "no limit"); torch has
no string tensors, so TF's ``bytes_per_string`` has no counterpart; there is no ``axis`` (see above).

Which variables are cut (TF2 ``ParameterServerStrategyV2Extended._create_variable``,
python/distribute/parameter_server_strategy_v2.py): rank-0 variables never; a count of 1 leaves the variable
whole; otherwise ``min(count, shape[0])`` shards. TF1 cut only variables created under a
``variable_scope(partitioner=...)``; ``shard_names`` (regexes, ``re.match`` as ``vars_to_warm_start``) plays
that part here, typically for embedding tables.

Rows of each shard (TF's "div" strategy, in both ``_create_variable`` above and TF1
``variable_scope._iter_slices``: ``min_slice_len + bool(i < num_slices_with_excess)``): each shard gets
``rows // n`` rows and the first ``rows % n`` shards one more; 10 rows in 4 shards are 3, 3, 2, 2 and in 3
shards 4, 3, 3. TF names the parts ``name/part_i``; here a shard's ``key`` is ``name[start:stop]``, which
also says which rows it holds and stays unambiguous when a run resumes with another number of ps tasks.

Which ps holds each shard, in the variables' order (their ``state_dict`` order, TF's creation order), each
shard of a cut variable counting as one variable:

* TF's default is round robin: tf.estimator gives ``replica_device_setter`` no ``ps_strategy``
  (estimator.py ``_get_replica_device_setter``), so ``_RoundRobinStrategy`` (python/training/device_setter.py)
  places variable ``i`` on task ``i % num_ps``; TF2's ParameterServerStrategy does the same
  (``_create_variable_round_robin``: ``self._variable_count % self._num_ps``).
  ``load_balancing="round_robin"`` reproduces it.
* ``load_balancing="greedy"`` (the default here) is TF1 contrib's ``GreedyLoadBalancingStrategy(num_ps,
  byte_size_load_fn)`` (tensorflow/contrib/training/python/training/device_setter.py): ``task =
  np.argmin(self._ps_loads)`` (the least loaded so far, the lowest index on ties), then ``self._ps_loads[task]
  += load_fn(op)`` with ``byte_size_load_fn`` = ``num_elements * dtype.size``. Round robin ignores sizes and
  can put the two largest tables on one ps; greedy balances bytes, which is what a ps spends (memory, and
  network per pull).

Optimizer state follows its variable: a state entry of the variable's shape is cut by the same rows; a 0-dim
tensor or a plain value (Adam's ``step``) is kept whole on every shard. Any other shape (Adafactor's row and
column factors) means the update of one row reads other rows, so a cut variable would train differently:
``split_state`` refuses it, naming the variable and the key; leave that variable whole.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from torchestimator.errors import ConfigError, ConfigTypeError

__all__ = [
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "Partitioner",
    "PlacementPlan",
    "Shard",
    "VariablePlacement",
    "join_rows",
    "join_state",
    "module_variables",
    "plan_placement",
    "split_rows",
    "split_state",
]

logger = logging.getLogger(__name__)

LoadBalancing = Literal["greedy", "round_robin"]
_LOAD_BALANCINGS: tuple[LoadBalancing, ...] = ("greedy", "round_robin")
_FORMAT = "torchestimator.ps_placement"
_VERSION = 1


# --------------------------------------------------------------------------- partitioners


@runtime_checkable
class Partitioner(Protocol):
    """How many shards (along axis 0) a variable of ``shape`` and ``dtype`` is cut into; 1 leaves it whole."""

    def shards_for(self, shape: Sequence[int], dtype: torch.dtype) -> int: ...


def _check_count(owner: str, field: str, value: object, *, optional: bool = False) -> None:
    """ConfigTypeError/ConfigError unless ``value`` is an int >= 1 (or None where ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = "a whole number >= 1" + (" or None" if optional else "")
        raise ConfigTypeError(f"{owner}({field}=...) must be {expected}; received {value!r}.", field=field, value=value)
    if value < 1:
        raise ConfigError(f"{owner}({field}=...) must be >= 1; received {value}.", field=field, value=value)


def _rows_and_row_bytes(shape: Sequence[int], dtype: torch.dtype) -> tuple[int, int]:
    rows = shape[0] if shape else 1
    return rows, math.prod(shape[1:]) * dtype.itemsize


@dataclasses.dataclass(frozen=True, kw_only=True)
class FixedShardsPartitioner:
    """A fixed number of shards: TF1 ``fixed_size_partitioner``, TF2 ``FixedShardsPartitioner``."""

    num_shards: int
    """Shards per variable, fewer when the variable has fewer rows."""

    def __post_init__(self) -> None:
        _check_count("FixedShardsPartitioner", "num_shards", self.num_shards)

    def shards_for(self, shape: Sequence[int], dtype: torch.dtype) -> int:
        return max(1, min(self.num_shards, shape[0])) if shape else 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class MinSizePartitioner:
    """As many shards as keep each at least ``min_shard_bytes``, at most ``max_shards``.

    TF1 ``min_max_variable_partitioner`` (``min_slice_size``, ``max_partitions``), TF2 ``MinSizePartitioner``.
    """

    min_shard_bytes: int = 256 << 10
    """The smallest shard worth a ps round trip; TF's default, 256 KiB."""
    max_shards: int
    """At most this many shards (typically the number of ps tasks). No default: TF's 1 never cuts anything."""

    def __post_init__(self) -> None:
        _check_count("MinSizePartitioner", "min_shard_bytes", self.min_shard_bytes)
        _check_count("MinSizePartitioner", "max_shards", self.max_shards)

    def shards_for(self, shape: Sequence[int], dtype: torch.dtype) -> int:
        if not shape:
            return 1
        total_bytes = math.prod(shape) * dtype.itemsize
        return max(1, min(shape[0], self.max_shards, -(-total_bytes // self.min_shard_bytes)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaxSizePartitioner:
    """As few shards as keep each at most ``max_shard_bytes`` (a row is never cut), at most ``max_shards``.

    TF1 ``variable_axis_size_partitioner``, TF2 ``MaxSizePartitioner``.
    """

    max_shard_bytes: int
    """The largest shard wanted; a row larger than this still makes one shard."""
    max_shards: int | None = None
    """At most this many shards, even if they then exceed ``max_shard_bytes``; None: no limit (TF's default)."""

    def __post_init__(self) -> None:
        _check_count("MaxSizePartitioner", "max_shard_bytes", self.max_shard_bytes)
        _check_count("MaxSizePartitioner", "max_shards", self.max_shards, optional=True)

    def shards_for(self, shape: Sequence[int], dtype: torch.dtype) -> int:
        rows, row_bytes = _rows_and_row_bytes(shape, dtype)
        if not shape or rows == 0 or row_bytes == 0:
            return 1
        rows_per_shard = max(1, self.max_shard_bytes // row_bytes)
        shards = -(-rows // rows_per_shard)
        return shards if self.max_shards is None else min(self.max_shards, shards)


# --------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class Shard:
    """Rows [start, stop) of variable ``name``, part ``index`` of ``num_shards``, held by ps task ``ps``.

    A whole variable is one shard of all its rows; a 0-dim variable counts as one row, [0, 1).
    """

    name: str
    index: int
    num_shards: int
    start: int
    stop: int
    ps: int
    nbytes: int

    @property
    def whole(self) -> bool:
        """The variable is not cut: this shard is all of it."""
        return self.num_shards == 1

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def key(self) -> str:
        """The shard's name on its ps: ``"embedding.weight[0:500]"``."""
        return f"{self.name}[{self.start}:{self.stop}]"


@dataclasses.dataclass(frozen=True)
class VariablePlacement:
    """One variable (a parameter or buffer, by its state_dict name) and its shards, in row order."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    shards: tuple[Shard, ...]

    @property
    def partitioned(self) -> bool:
        return len(self.shards) > 1

    @property
    def nbytes(self) -> int:
        return sum(shard.nbytes for shard in self.shards)


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    """Every variable's shards and the ps task holding each; the same on every task of a run.

    ``partitioner`` and ``shard_names`` record what made the plan (for logs and checkpoint records); the
    shards themselves are the plan.
    """

    num_ps: int
    variables: tuple[VariablePlacement, ...]
    load_balancing: LoadBalancing = "greedy"
    partitioner: str = "None"
    shard_names: tuple[str, ...] = ()

    @property
    def shards(self) -> tuple[Shard, ...]:
        """All shards, variable by variable, in the order they were placed."""
        return tuple(shard for variable in self.variables for shard in variable.shards)

    def variable(self, name: str) -> VariablePlacement:
        for variable in self.variables:
            if variable.name == name:
                return variable
        known = [variable.name for variable in self.variables]
        nearest = difflib.get_close_matches(name, known, n=3)
        raise KeyError(f"the placement plan has no variable {name!r}; nearest: {nearest or known[:3]}.")

    def shards_on(self, ps: int) -> tuple[Shard, ...]:
        """The shards ps task ``ps`` holds, in placement order."""
        return tuple(shard for shard in self.shards if shard.ps == ps)

    def loads(self) -> list[int]:
        """Bytes held by each ps task, by index."""
        loads = [0] * self.num_ps
        for shard in self.shards:
            loads[shard.ps] += shard.nbytes
        return loads

    def describe(self) -> str:
        """A table of every shard and a line of ps loads, for logs."""
        header = ("variable", "shape", "dtype", "shard", "rows", "ps", "bytes")
        lines = [header] + [
            (
                shard.name,
                str(list(variable.shape)),
                _dtype_name(variable.dtype),
                "whole" if shard.whole else f"{shard.index + 1}/{shard.num_shards}",
                f"[{shard.start}, {shard.stop})",
                str(shard.ps),
                f"{shard.nbytes:,}",
            )
            for variable in self.variables
            for shard in variable.shards
        ]
        widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
        table = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
        loads = ", ".join(f"ps {ps}: {load:,}" for ps, load in enumerate(self.loads()))
        title = (
            f"{len(self.shards)} shards of {len(self.variables)} variables on {self.num_ps} ps tasks "
            f"({self.load_balancing}; partitioner {self.partitioner})"
        )
        return "\n".join([title, *table, f"bytes per ps: {loads}"])

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON values (what a checkpoint's record keeps)."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "num_ps": self.num_ps,
            "load_balancing": self.load_balancing,
            "partitioner": self.partitioner,
            "shard_names": list(self.shard_names),
            "variables": [
                {
                    "name": variable.name,
                    "shape": list(variable.shape),
                    "dtype": _dtype_name(variable.dtype),
                    "shards": [[shard.start, shard.stop, shard.ps] for shard in variable.shards],
                }
                for variable in self.variables
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> PlacementPlan:
        """The plan ``to_dict`` wrote; ValueError naming the field when the record is not one."""
        if record.get("format") != _FORMAT or record.get("version") != _VERSION:
            raise ValueError(
                f"not a placement plan record: format {record.get('format')!r} version {record.get('version')!r}, "
                f"expected {_FORMAT!r} version {_VERSION}."
            )
        num_ps = record["num_ps"]
        if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 1:
            raise ValueError(f"placement plan record: num_ps must be an int >= 1; received {num_ps!r}.")
        load_balancing = record["load_balancing"]
        if load_balancing not in _LOAD_BALANCINGS:
            raise ValueError(f"placement plan record: unknown load_balancing {load_balancing!r}.")
        variables = tuple(_variable_from_record(entry, num_ps) for entry in record["variables"])
        names = [variable.name for variable in variables]
        if len(set(names)) != len(names):
            raise ValueError(f"placement plan record: variable names repeat: {sorted(names)}.")
        return cls(num_ps, variables, load_balancing, str(record["partitioner"]), tuple(record["shard_names"]))

    @classmethod
    def from_json(cls, text: str) -> PlacementPlan:
        return cls.from_dict(json.loads(text))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"placement plan record: {name!r} is not a torch dtype.")
    return dtype


def _variable_from_record(entry: Mapping[str, Any], num_ps: int) -> VariablePlacement:
    name, shape, dtype = entry["name"], tuple(entry["shape"]), _dtype_from_name(entry["dtype"])
    _check_variable(name, shape, dtype)
    rows, row_bytes = _rows_and_row_bytes(shape, dtype)
    triples = entry["shards"]
    if not triples or not all(_is_index_triple(triple) for triple in triples):
        raise ValueError(f"placement plan record: the shards of {name!r} must be [start, stop, ps] lists of ints.")
    starts, stops = [start for start, _, _ in triples], [stop for _, stop, _ in triples]
    if starts != [0, *stops[:-1]] or stops[-1] != rows or any(stop < start for start, stop in zip(starts, stops)):
        raise ValueError(f"placement plan record: the shards of {name!r} ({triples}) do not cover its {rows} rows.")
    shards = []
    for index, (start, stop, ps) in enumerate(triples):
        if not 0 <= ps < num_ps:
            raise ValueError(f"placement plan record: shard {index} of {name!r} is on ps {ps}, not in [0, {num_ps}).")
        shards.append(Shard(name, index, len(triples), start, stop, ps, (stop - start) * row_bytes))
    return VariablePlacement(name, shape, dtype, tuple(shards))


def _is_index_triple(value: object) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) == 3
        and all(isinstance(item, int) and not isinstance(item, bool) for item in value)
    )


def _check_variable(name: object, shape: tuple[object, ...], dtype: object) -> None:
    if not isinstance(name, str):
        raise TypeError(f"a variable's name must be a str; received {name!r}.")
    if any(isinstance(size, bool) or not isinstance(size, int) or size < 0 for size in shape):
        raise ValueError(f"variable {name!r}: shape {shape} must be sizes >= 0.")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"variable {name!r}: dtype must be a torch.dtype; received {dtype!r}.")


# --------------------------------------------------------------------------- planning


def module_variables(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """``(name, shape, dtype)`` of every parameter and persistent buffer, in ``state_dict`` order.

    A tensor reachable under two names (tied weights) is listed once, under its first name, as
    ``named_parameters`` does: it must live on one ps, or its two copies would drift apart.
    """
    seen: set[int] = set()
    variables = []
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        variables.append((name, tuple(tensor.shape), tensor.dtype))
    return variables


def plan_placement(
    variables: Sequence[tuple[str, Sequence[int], torch.dtype]],
    num_ps: int,
    partitioner: Partitioner | None = None,
    shard_names: str | Sequence[str] | None = None,
    *,
    load_balancing: LoadBalancing = "greedy",
) -> PlacementPlan:
    """Cuts the variables the partitioner splits (those ``shard_names`` selects, when given) and places every shard.

    Args:
      variables: ``(name, shape, dtype)`` in the model's order (``module_variables``): the order decides
        placement, as TF's creation order did.
      partitioner: ``FixedShardsPartitioner``, ``MinSizePartitioner``, ``MaxSizePartitioner`` or any object with ``shards_for(shape, dtype)``;
        None leaves every variable whole.
      shard_names: regexes (``re.match``) choosing the variables the partitioner may cut; None: all of them.
        A regex that matches no variable is an error.
      load_balancing: ``"greedy"`` (least bytes so far) or ``"round_robin"`` (TF's default); module docstring.
    """
    _check_plan_arguments(num_ps, partitioner, shard_names, load_balancing)
    patterns = _shard_patterns(shard_names)
    names = [name for name, _, _ in variables]
    _check_patterns(patterns, names)
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"plan_placement: variable names must be unique; repeated: {duplicates}.")
    loads, placed = [0] * num_ps, 0
    placements = []
    for name, shape_given, dtype in variables:
        shape = tuple(shape_given)
        _check_variable(name, shape, dtype)
        count = _shard_count(name, shape, dtype, partitioner, patterns)
        row_bytes = _rows_and_row_bytes(shape, dtype)[1]  # a 0-dim variable is one row of one element
        shards = []
        for index, (start, stop) in enumerate(_row_ranges(shape, count)):
            nbytes = (stop - start) * row_bytes
            ps = _least_loaded(loads) if load_balancing == "greedy" else placed % num_ps
            loads[ps] += nbytes
            placed += 1
            shards.append(Shard(name, index, count, start, stop, ps, nbytes))
        placements.append(VariablePlacement(name, shape, dtype, tuple(shards)))
    _note_uncut_patterns(patterns, placements)
    return PlacementPlan(
        num_ps, tuple(placements), load_balancing, repr(partitioner), tuple(pattern.pattern for pattern in patterns)
    )


def _check_plan_arguments(num_ps: object, partitioner: object, shard_names: object, load_balancing: object) -> None:
    if isinstance(num_ps, bool) or not isinstance(num_ps, numbers.Integral):
        raise TypeError(f"plan_placement(num_ps=...) must be a whole number of ps tasks; received {num_ps!r}.")
    if num_ps < 1:
        raise ValueError(
            f"plan_placement(num_ps=...) must be >= 1 (a ps task to hold the variables); received {num_ps}."
        )
    if partitioner is not None and not isinstance(partitioner, Partitioner):
        raise TypeError(
            "plan_placement(partitioner=...) must be FixedShardsPartitioner, MinSizePartitioner, MaxSizePartitioner, an object with "
            f"shards_for(shape, dtype), or None; received {partitioner!r}."
        )
    if shard_names is not None and partitioner is None:
        raise ValueError(
            f"plan_placement(shard_names={shard_names!r}) chooses variables for the partitioner to cut, but "
            "partitioner is None: pass a partitioner (FixedShardsPartitioner, MinSizePartitioner, MaxSizePartitioner) or drop shard_names."
        )
    if load_balancing not in _LOAD_BALANCINGS:
        raise ValueError(
            f"plan_placement(load_balancing=...) must be one of {list(_LOAD_BALANCINGS)}; received {load_balancing!r}."
        )


def _shard_patterns(shard_names: str | Sequence[str] | None) -> list[re.Pattern[str]]:
    if shard_names is None:
        return []
    texts = [shard_names] if isinstance(shard_names, str) else list(shard_names)
    patterns = []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"plan_placement(shard_names=...) takes regexes (str); received {text!r}.")
        try:
            patterns.append(re.compile(text))
        except re.error as error:
            raise ValueError(f"plan_placement(shard_names=...): {text!r} is not a regex: {error}.") from None
    if not patterns:
        raise ValueError(
            "plan_placement(shard_names=[]) selects no variable; pass None to let the partitioner cut any."
        )
    return patterns


def _check_patterns(patterns: list[re.Pattern[str]], names: list[str]) -> None:
    for pattern in patterns:
        if not any(pattern.match(name) for name in names):
            raise ValueError(
                f"plan_placement(shard_names=...): {pattern.pattern!r} matches none of the {len(names)} variables "
                f"(re.match, anchored at the start; e.g. {names[:3]}). Nearest names: "
                f"{difflib.get_close_matches(pattern.pattern, names, n=3)}."
            )


def _note_uncut_patterns(patterns: list[re.Pattern[str]], placements: list[VariablePlacement]) -> None:
    """A shard_names regex whose variables all stayed whole is no mistake (they are small), but says why."""
    for pattern in patterns:
        matched = [variable.name for variable in placements if pattern.match(variable.name)]
        if not any(variable.partitioned for variable in placements if variable.name in matched):
            logger.info(
                "shard_names %r selects %s; the partitioner leaves all of them whole (too few rows or bytes).",
                pattern.pattern,
                matched[:5] + (["..."] if len(matched) > 5 else []),
            )


def _shard_count(
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    partitioner: Partitioner | None,
    patterns: list[re.Pattern[str]],
) -> int:
    """TF2's rule: rank 0 and unselected variables stay whole; otherwise the partitioner's count, capped by rows."""
    if partitioner is None or not shape or (patterns and not any(pattern.match(name) for pattern in patterns)):
        return 1
    count = partitioner.shards_for(shape, dtype)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(
            f"{partitioner!r}.shards_for({list(shape)}, {dtype}) for {name!r} returned {count!r}, not an int >= 1."
        )
    return max(1, min(count, shape[0]))


def _row_ranges(shape: tuple[int, ...], count: int) -> list[tuple[int, int]]:
    """TF's "div" cut: ``rows // count`` rows each, one more for the first ``rows % count`` shards."""
    rows = shape[0] if shape else 1
    base, extra = divmod(rows, count)
    ranges, start = [], 0
    for index in range(count):
        stop = start + base + (1 if index < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def _least_loaded(loads: list[int]) -> int:
    """np.argmin: the least loaded ps task, the lowest index on ties."""
    return min(range(len(loads)), key=loads.__getitem__)


# --------------------------------------------------------------------------- tensors and optimizer state


def split_rows(tensor: torch.Tensor, variable: VariablePlacement) -> list[torch.Tensor]:
    """``tensor`` (the variable's value, or its gradient) cut into its shards' rows: views, sharing storage."""
    if tuple(tensor.shape) != variable.shape:
        raise ValueError(
            f"split_rows: {variable.name!r} is planned with shape {list(variable.shape)}; "
            f"received a tensor of shape {list(tensor.shape)}."
        )
    if not variable.partitioned:
        return [tensor]
    return [tensor[shard.start : shard.stop] for shard in variable.shards]


def join_rows(parts: Sequence[torch.Tensor], variable: VariablePlacement) -> torch.Tensor:
    """The whole tensor from its shards' parts (in shard order); checks each part's shape against the plan."""
    if len(parts) != len(variable.shards):
        raise ValueError(
            f"join_rows: {variable.name!r} has {len(variable.shards)} shards; received {len(parts)} parts."
        )
    for shard, part in zip(variable.shards, parts):
        expected = variable.shape if shard.whole else (shard.rows, *variable.shape[1:])
        if tuple(part.shape) != expected:
            raise ValueError(
                f"join_rows: shard {shard.key} of {variable.name!r} must have shape {list(expected)}; "
                f"received {list(part.shape)}."
            )
    return parts[0] if len(parts) == 1 else torch.cat(list(parts))


def _not_elementwise(variable: VariablePlacement, key: str, what: str) -> ValueError:
    return ValueError(
        f"optimizer state {key!r} of variable {variable.name!r} {what}: it is neither of the variable's shape "
        f"{list(variable.shape)} nor a scalar, so this optimizer's update of a row reads other rows and the "
        "variable cannot be partitioned. Leave it whole: a shard_names that does not match it, or no partitioner."
    )


def split_state(state: Mapping[str, Any], variable: VariablePlacement) -> list[dict[str, Any]]:
    """One parameter's optimizer state (``optimizer.state[p]``), cut for its shards.

    Entries of the variable's shape are cut by rows (views, as ``split_rows``); 0-dim tensors are copied for
    each shard (optimizers step them in place: Adam's ``step += 1`` on one shared tensor would count once per
    shard); plain values (None, numbers) are given to each shard as they are. Any other shape is a ValueError
    naming the variable and the key. A whole variable's state is returned as it is, whatever its shapes.
    """
    if not variable.partitioned:
        return [dict(state)]
    parts: list[dict[str, Any]] = [{} for _ in variable.shards]
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            if tuple(value.shape) != variable.shape:
                raise _not_elementwise(variable, key, f"has shape {list(value.shape)}")
            pieces: list[Any] = [value[shard.start : shard.stop] for shard in variable.shards]
        elif isinstance(value, torch.Tensor):
            pieces = [value.clone() for _ in variable.shards]
        else:
            pieces = [value for _ in variable.shards]
        for part, piece in zip(parts, pieces):
            part[key] = piece
    return parts


def join_state(parts: Sequence[Mapping[str, Any]], variable: VariablePlacement) -> dict[str, Any]:
    """One parameter's optimizer state from its shards' states (in shard order): ``split_state`` undone.

    Row-cut entries are concatenated. Scalar entries must be equal on every shard and are taken once: they
    are, when every push steps every shard (a gradient is cut into all of a variable's shards); if they are
    not (Adam's ``step`` on a shard that missed updates), no one value gives every row the update it had, so
    joining would change training: a ValueError names the variable, the key and the values.
    """
    if len(parts) != len(variable.shards):
        raise ValueError(
            f"join_state: {variable.name!r} has {len(variable.shards)} shards; received {len(parts)} states."
        )
    if not variable.partitioned:
        return dict(parts[0])
    keys = list(parts[0])
    for shard, part in zip(variable.shards, parts):
        if set(part) != set(keys):
            raise ValueError(
                f"join_state: the optimizer state of shard {shard.key} has keys {sorted(part)}, "
                f"shard {variable.shards[0].key} has {sorted(keys)}."
            )
    return {key: _join_entry(variable, key, [part[key] for part in parts]) for key in keys}


def _join_entry(variable: VariablePlacement, key: str, values: list[Any]) -> Any:
    if any(isinstance(value, torch.Tensor) and value.dim() > 0 for value in values):
        for shard, value in zip(variable.shards, values):
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (shard.rows, *variable.shape[1:]):
                raise _not_elementwise(variable, key, f"is {shape} on shard {shard.key}")
        return torch.cat(values)
    first = values[0]
    for shard, value in zip(variable.shards[1:], values[1:]):
        if not _same_scalar(first, value):
            raise ValueError(
                f"join_state: optimizer state {key!r} of variable {variable.name!r} is {_show(first)} on shard "
                f"{variable.shards[0].key} but {_show(value)} on shard {shard.key}; a joined state would "
                "change how its rows train; reset this state (start the optimizer afresh) rather than join it."
            )
    return first


def _same_scalar(first: Any, other: Any) -> bool:
    if isinstance(first, torch.Tensor) or isinstance(other, torch.Tensor):
        return (
            isinstance(first, torch.Tensor)
            and isinstance(other, torch.Tensor)
            and first.dim() == 0
            and other.dim() == 0
            and first.dtype == other.dtype
            and torch.equal(first, other)
        )
    return type(first) is type(other) and bool(first == other)


def _show(value: Any) -> str:
    return (
        f"tensor({value.item()!r}, dtype={value.dtype})"
        if isinstance(value, torch.Tensor) and value.dim() == 0
        else repr(value)
    )
