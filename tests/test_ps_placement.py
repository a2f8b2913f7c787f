"""ps_placement: TF's partitioner counts and row cuts, greedy and round-robin placement, the plan's JSON record,
and cutting/gluing tensors and optimizer states by the plan (checked by really stepping torch.optim).

The TF numbers come from TensorFlow's own source, quoted where each test uses them:
python/ops/partitioned_variables.py (fixed_size_partitioner, min_max_variable_partitioner,
variable_axis_size_partitioner), python/distribute/sharded_variable.py (the TF2 partitioners' docstrings),
python/distribute/parameter_server_strategy_v2.py (_create_variable), python/ops/variable_scope.py
(_iter_slices), python/training/device_setter.py (_RoundRobinStrategy) and
contrib/training/python/training/device_setter.py (GreedyLoadBalancingStrategy, byte_size_load_fn).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from torchestimator.distribute.ps_placement import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    PlacementPlan,
    join_rows,
    join_state,
    module_variables,
    plan_placement,
    split_rows,
    split_state,
)
from torchestimator.errors import ConfigError, ConfigTypeError

F32 = torch.float32


def rows_of(plan: PlacementPlan, name: str) -> list[int]:
    return [shard.rows for shard in plan.variable(name).shards]


# ----------------------------------------------------------------------------- TF's shard counts


def test_min_size_counts_are_tfs():
    # min_max_variable_partitioner: max(1, min(shape[axis].value, max_partitions, int(math.ceil(partitions))))
    # with partitions = total_size_bytes / min_slice_size.
    # [1000, 64] float32 is 256,000 bytes, under one 256 KiB (262,144-byte) slice: never cut, even with 4 allowed.
    assert MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=4).shards_for((1000, 64), F32) == 1
    # With 64 KiB slices: ceil(256000 / 65536) = 4.
    assert MinSizePartitioner(min_shard_bytes=64 << 10, max_shards=8).shards_for((1000, 64), F32) == 4
    # Its docstring: float32 [1024, 1024] gives (1024 * 1024 * 4) / (256 * 1024) = 16 shards if
    # max_partitions >= 16, else max_partitions.
    assert MinSizePartitioner(max_shards=16).shards_for((1024, 1024), F32) == 16
    assert MinSizePartitioner(max_shards=100).shards_for((1024, 1024), F32) == 16
    assert MinSizePartitioner(max_shards=4).shards_for((1024, 1024), F32) == 4
    # MinSizePartitioner's docstring: min_shard_bytes=4, max_shards=2, [6, 1] float32 -> [2, 1];
    # max_shards=10 -> [6, 1] (capped by the 6 rows, not by the 6 possible 4-byte shards).
    assert MinSizePartitioner(min_shard_bytes=4, max_shards=2).shards_for((6, 1), F32) == 2
    assert MinSizePartitioner(min_shard_bytes=4, max_shards=10).shards_for((6, 1), F32) == 6
    assert MinSizePartitioner(min_shard_bytes=1, max_shards=10).shards_for((3, 8), F32) == 3  # capped by shape[axis]


def test_max_size_counts_are_tfs():
    # variable_axis_size_partitioner: slices_per_shard = max(1, floor(max_shard_bytes / bytes_per_slice)),
    # axis_shards = ceil(shape[axis] / slices_per_shard), then min(max_shards, axis_shards) if max_shards.
    # MaxSizePartitioner's docstring, [6, 1] float32: max_shard_bytes=4 -> 6, with max_shards=2 -> 2, 1024 -> 1.
    assert MaxSizePartitioner(max_shard_bytes=4).shards_for((6, 1), F32) == 6
    assert MaxSizePartitioner(max_shard_bytes=4, max_shards=2).shards_for((6, 1), F32) == 2
    assert MaxSizePartitioner(max_shard_bytes=1024).shards_for((6, 1), F32) == 1
    # A row (4,000 bytes) above the limit still makes one shard: "every dimension becomes a separate shard".
    assert MaxSizePartitioner(max_shard_bytes=100).shards_for((3, 1000), F32) == 3
    # [1000, 64] float32 rows are 256 bytes: 64 KiB holds 256 rows, ceil(1000 / 256) = 4 shards.
    assert MaxSizePartitioner(max_shard_bytes=64 << 10).shards_for((1000, 64), F32) == 4


def test_fixed_shards_and_tfs_div_rows():
    # fixed_size_partitioner / FixedShardsPartitioner: min(num_shards, shape[axis]).
    assert FixedShardsPartitioner(num_shards=5).shards_for((2, 3), F32) == 2
    # TF1 variable_scope._iter_slices: shape[slice_dim] = min_slice_len + bool(i < num_slices_with_excess).
    plan = plan_placement([("table", (10, 3), F32)], num_ps=3, partitioner=FixedShardsPartitioner(num_shards=3))
    assert rows_of(plan, "table") == [4, 3, 3]
    assert [(shard.start, shard.stop) for shard in plan.variable("table").shards] == [(0, 4), (4, 7), (7, 10)]
    # parameter_server_strategy_v2._create_variable: "num_partitions=4, shape[0]=10, partitions: [3, 3, 2, 2]".
    plan = plan_placement([("table", (10, 3), F32)], num_ps=2, partitioner=FixedShardsPartitioner(num_shards=4))
    assert rows_of(plan, "table") == [3, 3, 2, 2]
    assert [shard.key for shard in plan.variable("table").shards] == [
        "table[0:3]",
        "table[3:6]",
        "table[6:8]",
        "table[8:10]",
    ]


def test_scalars_and_empty_variables_are_never_cut():
    # _create_variable: "if shape.rank == 0: # Skip partitioning rank-0 variable."
    variables = [("step", (), torch.int64), ("empty", (0, 4), F32), ("thin", (5, 0), F32), ("row", (1, 9), F32)]
    plan = plan_placement(variables, num_ps=2, partitioner=FixedShardsPartitioner(num_shards=4))
    # FixedShardsPartitioner looks at rows only, as TF's does: a [5, 0] variable is cut like any 5-row one.
    assert [variable.partitioned for variable in plan.variables] == [False, False, True, False]
    assert (plan.variable("step").shards[0].start, plan.variable("step").shards[0].stop) == (0, 1)
    assert plan.variable("step").nbytes == 8
    assert MaxSizePartitioner(max_shard_bytes=1).shards_for((5, 0), F32) == 1  # TF divides by zero here
    assert MinSizePartitioner(max_shards=3).shards_for((0, 4), F32) == 1


# ----------------------------------------------------------------------------- placement


def test_greedy_places_on_the_least_loaded_ps_lowest_index_on_ties():
    # GreedyLoadBalancingStrategy: task = np.argmin(self._ps_loads); self._ps_loads[task] += load_fn(op),
    # byte_size_load_fn = num_elements * dtype.size. 100 -> ps 0 (0, 0 tie: lowest); 50 -> ps 1 (100, 0);
    # 60 -> ps 1 (100, 50); 10 -> ps 0 (100, 110).
    variables = [(name, (size,), torch.uint8) for name, size in [("a", 100), ("b", 50), ("c", 60), ("d", 10)]]
    plan = plan_placement(variables, num_ps=2)
    assert [shard.ps for shard in plan.shards] == [0, 1, 1, 0]
    assert plan.loads() == [110, 110]
    # _RoundRobinStrategy (TF's default, tf.estimator's too): task i % num_tasks, whatever the sizes.
    round_robin = plan_placement(variables, num_ps=2, load_balancing="round_robin")
    assert [shard.ps for shard in round_robin.shards] == [0, 1, 0, 1]
    assert round_robin.loads() == [160, 60]
    assert [shard.name for shard in plan.shards_on(1)] == ["b", "c"]


def test_shards_of_a_cut_variable_spread_over_the_ps_tasks():
    variables = [("bias", (10,), F32), ("embedding.weight", (1000, 16), F32), ("head.weight", (10, 16), F32)]
    plan = plan_placement(
        variables, num_ps=4, partitioner=FixedShardsPartitioner(num_shards=4), shard_names=["embedding"]
    )
    assert not plan.variable("bias").partitioned and not plan.variable("head.weight").partitioned
    # bias (40 bytes) -> ps 0; the four 16,000-byte shards -> ps 1, 2, 3, then 0 (40 < 16,000); head -> ps 1.
    assert [shard.ps for shard in plan.variable("embedding.weight").shards] == [1, 2, 3, 0]
    assert plan.variable("head.weight").shards[0].ps == 1
    assert sum(plan.loads()) == sum(variable.nbytes for variable in plan.variables) == 40 + 64_000 + 640


def test_a_selection_the_partitioner_leaves_whole_is_logged(caplog):
    variables = [("embedding.weight", (1000, 64), F32), ("small_embedding.weight", (10, 4), F32)]
    with caplog.at_level(logging.INFO, logger="torchestimator"):
        plan = plan_placement(variables, 2, MinSizePartitioner(max_shards=2), shard_names=["embedding", "small_"])
    assert not any(variable.partitioned for variable in plan.variables)  # 256,000 bytes < 256 KiB
    assert "shard_names 'embedding' selects ['embedding.weight']; the partitioner leaves all" in caplog.text
    assert "'small_' selects ['small_embedding.weight']" in caplog.text


def test_plan_is_the_same_in_another_process_with_another_hash_seed():
    """Every task computes the plan on its own: nothing may depend on hashing, sets or dict order across runs."""
    script = textwrap.dedent(
        """
        import sys, torch
        from torchestimator.distribute.ps_placement import MinSizePartitioner, plan_placement
        variables = [(f"layer{i}.weight", (100 * (i % 7) + 3, 33), torch.float32) for i in range(40)]
        print(plan_placement(variables, 3, MinSizePartitioner(min_shard_bytes=4096, max_shards=3), [r"layer1\\d"]).to_json())
        print(sys.flags.hash_randomization, hash("layer1"))
        """
    )
    environment = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=120, check=True
    )
    there, hashed = result.stdout.splitlines()
    assert hashed != f"1 {hash('layer1')}"  # the other process hashes strings otherwise than this one
    variables = [(f"layer{i}.weight", (100 * (i % 7) + 3, 33), F32) for i in range(40)]
    here = plan_placement(variables, 3, MinSizePartitioner(min_shard_bytes=4096, max_shards=3), [r"layer1\d"])
    assert there == here.to_json()
    assert any(variable.partitioned for variable in here.variables)


def test_json_round_trip_and_describe():
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 4), nn.BatchNorm1d(4))
    plan = plan_placement(module_variables(model), num_ps=3, partitioner=MaxSizePartitioner(max_shard_bytes=416))
    record = json.loads(plan.to_json())
    assert record["variables"][0] == {"name": "0.weight", "shape": [50, 8], "dtype": "float32", "shards": [
        [0, 13, 0], [13, 26, 1], [26, 38, 2], [38, 50, 2]]}  # fmt: skip
    again = PlacementPlan.from_json(plan.to_json())
    assert again == plan
    assert again.to_json() == plan.to_json()
    text = plan.describe()
    assert "0.weight" in text and "[13, 26)" in text and "2.num_batches_tracked" in text and "int64" in text
    assert text.splitlines()[-1] == "bytes per ps: " + ", ".join(
        f"ps {i}: {load:,}" for i, load in enumerate(plan.loads())
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: r.update(format="other"), "not a placement plan record"),
        (lambda r: r.update(num_ps=0), "num_ps"),
        (lambda r: r["variables"][0].update(dtype="tensor"), "not a torch dtype"),
        (lambda r: r["variables"][0]["shards"].pop(), "do not cover"),
        (lambda r: r["variables"][0]["shards"][1].__setitem__(0, 12), "do not cover"),
        (lambda r: r["variables"][0]["shards"][0].__setitem__(2, 3), "not in [0, 3)"),
        (lambda r: r["variables"][0]["shards"][0].append(1), "lists of ints"),
        (lambda r: r["variables"].append(dict(r["variables"][1])), "repeat"),
    ],
)
def test_a_damaged_record_is_refused(change, words):
    plan = plan_placement([("table", (20, 2), F32), ("bias", (2,), F32)], 3, FixedShardsPartitioner(num_shards=3))
    record = plan.to_dict()
    change(record)
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace(")", r"\)")):
        PlacementPlan.from_dict(record)


# ----------------------------------------------------------------------------- mistakes


def test_argument_mistakes_name_the_argument():
    variables = [("embedding.weight", (10, 2), F32)]
    with pytest.raises(ValueError, match=r"num_ps=\.\.\.\) must be >= 1"):
        plan_placement(variables, 0)
    with pytest.raises(TypeError, match="num_ps"):
        plan_placement(variables, True)
    with pytest.raises(ValueError, match=r"'embed\$' matches none of the 1 variables"):
        plan_placement(variables, 2, FixedShardsPartitioner(num_shards=2), shard_names=["embedding", "embed$"])
    with pytest.raises(ValueError, match="partitioner is None"):
        plan_placement(variables, 2, shard_names="embedding")
    with pytest.raises(ValueError, match="not a regex"):
        plan_placement(variables, 2, FixedShardsPartitioner(num_shards=2), shard_names="(")
    with pytest.raises(ValueError, match="load_balancing"):
        plan_placement(variables, 2, load_balancing="random")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="partitioner"):
        plan_placement(variables, 2, partitioner=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeated: \\['a'\\]"):
        plan_placement([("a", (1,), F32), ("a", (2,), F32)], 2)


def test_partitioner_settings_are_checked_where_built():
    with pytest.raises(ConfigError, match="num_shards") as caught:
        FixedShardsPartitioner(num_shards=0)
    assert caught.value.field == "num_shards"
    with pytest.raises(ConfigTypeError, match="num_shards"):
        FixedShardsPartitioner(num_shards=2.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="min_shard_bytes"):
        MinSizePartitioner(min_shard_bytes=0, max_shards=2)
    with pytest.raises(TypeError, match="max_shards"):  # no default: TF's max_shards=1 never cuts
        MinSizePartitioner()  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="max_shards"):
        MaxSizePartitioner(max_shard_bytes=10, max_shards=0)
    with pytest.raises(ConfigTypeError, match="max_shard_bytes"):
        MaxSizePartitioner(max_shard_bytes=True)


def test_a_partitioner_of_ones_own_must_return_a_count():
    class Halves:
        def shards_for(self, shape, dtype):
            return shape[0] // 2

    plan = plan_placement([("table", (7, 2), F32)], 2, Halves())
    assert rows_of(plan, "table") == [3, 2, 2]
    with pytest.raises(ValueError, match=r"for 'one' returned 0"):
        plan_placement([("one", (1, 2), F32)], 2, Halves())


# ----------------------------------------------------------------------------- tensors


def test_split_rows_gives_views_and_join_rows_checks_shapes():
    plan = plan_placement([("table", (7, 3), F32)], 2, FixedShardsPartitioner(num_shards=3))
    variable = plan.variable("table")
    table = torch.arange(21, dtype=F32).reshape(7, 3)
    parts = split_rows(table, variable)
    assert [tuple(part.shape) for part in parts] == [(3, 3), (2, 3), (2, 3)]
    assert all(part.untyped_storage().data_ptr() == table.untyped_storage().data_ptr() for part in parts)
    assert torch.equal(join_rows(parts, variable), table)
    with pytest.raises(ValueError, match=r"shard table\[3:5\] of 'table' must have shape \[2, 3\]"):
        join_rows([parts[0], parts[1][:1], parts[2]], variable)
    with pytest.raises(ValueError, match="planned with shape"):
        split_rows(table.T, variable)


def test_replanning_for_another_number_of_ps_round_trips():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(101, 6), nn.Linear(6, 5), nn.BatchNorm1d(5))
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    variables = module_variables(model)
    values = dict(original)
    for num_ps in (2, 3, 1, 4):
        plan = plan_placement(variables, num_ps, FixedShardsPartitioner(num_shards=num_ps))
        on_ps = {variable.name: split_rows(values[variable.name], variable) for variable in plan.variables}
        assert len(on_ps["0.weight"]) == num_ps
        values = {variable.name: join_rows(on_ps[variable.name], variable) for variable in plan.variables}
    assert values.keys() == original.keys()
    assert all(torch.equal(values[name], original[name]) for name in original)


def test_module_variables_lists_buffers_and_tied_weights_once():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(10, 4)
            self.norm = nn.BatchNorm1d(4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embedding.weight

    names = [name for name, _, _ in module_variables(Tied())]
    assert names == [
        "embedding.weight",
        "norm.weight",
        "norm.bias",
        "norm.running_mean",
        "norm.running_var",
        "norm.num_batches_tracked",
    ]


# ----------------------------------------------------------------------------- optimizer state


def _trained(make_optimizer, steps: int = 3):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 4), nn.Linear(4, 3))
    optimizer = make_optimizer(model.parameters())
    ids = torch.tensor([0, 3, 5, 10, 7])
    for _ in range(steps):
        optimizer.zero_grad()
        model(ids).square().sum().backward()
        optimizer.step()
    optimizer.zero_grad()
    model(ids).square().sum().backward()  # the gradients of the next step, not yet applied
    return model, optimizer


OPTIMIZERS = {
    "adam": lambda parameters: torch.optim.Adam(parameters, lr=0.1),
    "adamw-amsgrad": lambda parameters: torch.optim.AdamW(parameters, lr=0.1, amsgrad=True),
    "sgd-momentum": lambda parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_sharded_optimizer_steps_like_the_whole_one(kind):
    """Each shard stepped by its own optimizer, from split_state, lands where the whole optimizer lands."""
    model, optimizer = _trained(OPTIMIZERS[kind])
    plan = plan_placement(module_variables(model), 3, FixedShardsPartitioner(num_shards=3), shard_names=["0.weight"])
    variable = plan.variable("0.weight")
    weight = model[0].weight
    state = optimizer.state[weight]
    parts = split_state(state, variable)
    assert set(parts[0]) == set(state)
    joined = join_state(parts, variable)
    assert all(
        torch.equal(joined[key], state[key]) if isinstance(state[key], torch.Tensor) else joined[key] == state[key]
        for key in state
    )

    shard_weights, shard_optimizers = [], []
    for value, gradient, part in zip(split_rows(weight.detach(), variable), split_rows(weight.grad, variable), parts):
        shard = nn.Parameter(value.clone())
        shard.grad = gradient.clone()
        shard_optimizer = OPTIMIZERS[kind]([shard])
        shard_optimizer.state[shard] = {key: v.clone() if isinstance(v, torch.Tensor) else v for key, v in part.items()}
        shard_optimizer.step()
        shard_weights.append(shard.detach())
        shard_optimizers.append(shard_optimizer)
    optimizer.step()
    assert torch.equal(join_rows(shard_weights, variable), weight.detach())
    stepped = join_state(
        [opt.state[p] for opt, p in zip(shard_optimizers, [next(iter(o.state)) for o in shard_optimizers])], variable
    )
    for key, value in optimizer.state[weight].items():
        assert torch.equal(stepped[key], value) if isinstance(value, torch.Tensor) else stepped[key] == value


def test_scalar_state_is_copied_per_shard_and_must_agree_to_join():
    model, optimizer = _trained(OPTIMIZERS["adam"])
    variable = plan_placement(module_variables(model), 2, FixedShardsPartitioner(num_shards=2)).variable("0.weight")
    state = optimizer.state[model[0].weight]
    parts = split_state(state, variable)
    # Adam's step is a 0-dim tensor an optimizer adds to in place: one tensor shared by shards would count twice.
    assert parts[0]["step"] is not parts[1]["step"] and parts[0]["step"] is not state["step"]
    parts[1]["step"] += 1
    with pytest.raises(ValueError, match=r"'step' of variable '0.weight' is tensor\(3.0.*but tensor\(4.0"):
        join_state(parts, variable)
    parts[1]["step"] -= 1
    assert torch.equal(join_state(parts, variable)["step"], state["step"])
    # The row-cut entries are views of the whole state, as split_rows gives.
    assert parts[1]["exp_avg"].untyped_storage().data_ptr() == state["exp_avg"].untyped_storage().data_ptr()


def test_non_elementwise_state_is_refused_naming_variable_and_key():
    torch.manual_seed(0)
    table = nn.Parameter(torch.randn(10, 4))
    optimizer = torch.optim.Adafactor([table])
    table.grad = torch.randn(10, 4)
    optimizer.step()
    variable = plan_placement([("table", (10, 4), F32)], 2, FixedShardsPartitioner(num_shards=2)).variable("table")
    # Adafactor keeps row_var [10, 1] and col_var [1, 4]: a row's update reads every row's column statistics.
    with pytest.raises(ValueError, match=r"'row_var' of variable 'table' has shape \[10, 1\].*Leave it whole"):
        split_state(optimizer.state[table], variable)
    # A whole variable keeps any state as it is.
    whole = plan_placement([("table", (10, 4), F32)], 2).variable("table")
    assert join_state(split_state(optimizer.state[table], whole), whole).keys() == optimizer.state[table].keys()
    with pytest.raises(ValueError, match=r"'factor' of variable 'table' is \[3\] on shard table\[0:5\]"):
        join_state([{"factor": torch.zeros(3)}, {"factor": torch.zeros(5, 4)}], variable)
    with pytest.raises(ValueError, match="has keys"):
        join_state([{"a": 1}, {"b": 1}], variable)


def test_optimizer_state_round_trips_through_another_number_of_ps():
    model, optimizer = _trained(OPTIMIZERS["adam"])
    variables = module_variables(model)
    index_of = {id(parameter): index for index, parameter in enumerate(model.parameters())}
    names = {id(tensor): name for name, tensor in model.state_dict(keep_vars=True).items()}
    original = {names[id(p)]: dict(optimizer.state[p]) for p in model.parameters()}
    states = original
    for num_ps in (2, 3):
        plan = plan_placement(variables, num_ps, MinSizePartitioner(min_shard_bytes=16, max_shards=num_ps))
        assert plan.variable("0.weight").partitioned
        split = {name: split_state(states[name], plan.variable(name)) for name in states}
        states = {name: join_state(parts, plan.variable(name)) for name, parts in split.items()}
    assert len(index_of) == len(original) == len(states)
    for name, state in original.items():
        assert all(torch.equal(states[name][key], value) for key, value in state.items())


# ----------------------------------------------------------------------------- properties

shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)


@settings(max_examples=150, deadline=None)
@given(shape=shapes, num_shards=st.integers(1, 12), num_ps=st.integers(1, 5))
def test_join_of_split_is_the_tensor(shape, num_shards, num_ps):
    plan = plan_placement([("x", shape, F32)], num_ps, FixedShardsPartitioner(num_shards=num_shards))
    variable = plan.variable("x")
    tensor = torch.randn(shape)
    assert torch.equal(join_rows(split_rows(tensor, variable), variable), tensor)
    rows = [shard.rows for shard in variable.shards]
    assert sum(rows) == (shape[0] if shape else 1)
    assert rows == sorted(rows, reverse=True) and max(rows) - min(rows) <= 1  # TF's div: the extra rows first
    assert len(rows) == (max(1, min(num_shards, shape[0])) if shape else 1)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 10_000), min_size=1, max_size=30), num_ps=st.integers(1, 6))
def test_greedy_loads_differ_by_at_most_the_largest_variable(sizes, num_ps):
    plan = plan_placement([(f"v{i}", (size,), torch.uint8) for i, size in enumerate(sizes)], num_ps)
    loads = plan.loads()
    assert sum(loads) == sum(sizes)
    assert max(loads) - min(loads) <= max(sizes)  # list scheduling's bound: each goes to the least loaded
    assert plan == plan_placement([(f"v{i}", (size,), torch.uint8) for i, size in enumerate(sizes)], num_ps)
