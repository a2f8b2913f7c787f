"""Tests for the resumable input functions in torchestimator.data.inputs."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import operator

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_estimator
from torch.utils.data import Dataset

from torchestimator import EstimatorSpec
from torchestimator.data.inputs import (
    dataset_input_fn,
    describe_batch_sizes,
    numpy_input_fn,
    pandas_input_fn,
)
from torchestimator.distribute.input_context import InputContext


def _context(replicas: int, replica: int) -> InputContext:
    return InputContext(num_replicas_in_sync=replicas, num_input_pipelines=replicas, input_pipeline_id=replica)


def _arrays(count: int = 10) -> tuple[dict[str, np.ndarray], np.ndarray]:
    x = {
        "age": np.arange(count, dtype=np.float64),
        "pixels": np.arange(count * 3).reshape(count, 3),
    }
    y = np.arange(count, dtype=np.int64) + 100
    return x, y


def _ids(batches) -> list[list[int]]:
    """The example ids (the labels) of each batch, in order."""
    return [(labels - 100).tolist() for _, labels in batches]


def _assert_same_batches(actual, expected) -> None:
    assert len(actual) == len(expected)
    for (features, labels), (expected_features, expected_labels) in zip(actual, expected):
        assert features.keys() == expected_features.keys()
        for key in features:
            assert torch.equal(features[key], expected_features[key])
        assert torch.equal(labels, expected_labels)


@dataclasses.dataclass
class _Config:
    random_seed: int | None = None


class _PairDataset(Dataset):
    """Item i is ({"value": [i, -i]}, 100 + i); records the indices it was asked for."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        self.fetched.append(index)
        return {"value": torch.tensor([index, -index], dtype=torch.float32)}, 100 + index


# --------------------------------------------------------------------------- batches and epochs


def test_batches_run_across_epochs_and_only_the_last_is_short():
    x, y = _arrays(10)
    batches = numpy_input_fn(x, y, batch_size=4, num_epochs=3, shuffle=False)()
    result = list(batches)
    # TF's repeat(3).batch(4): 30 rows in 7 full batches and one of 2.
    assert _ids(result) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]] + [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
    ]
    assert len(batches) == 8
    features, _ = result[1]
    assert torch.equal(features["pixels"], torch.arange(12, 24).reshape(4, 3))
    assert batches.state_dict() == {"epoch": 3, "row": 0}


def test_drop_remainder_drops_only_the_very_last_short_batch():
    x, y = _arrays(10)
    batches = numpy_input_fn(x, y, batch_size=4, num_epochs=3, shuffle=False, drop_remainder=True)()
    assert _ids(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]] + [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    assert len(batches) == 7
    assert batches.state_dict() == {"epoch": 2, "row": 8}


def test_num_epochs_none_keeps_going_and_has_no_length():
    x, y = _arrays(10)
    batches = numpy_input_fn(x, y, batch_size=4, num_epochs=None, shuffle=True, seed=1)()
    taken = list(itertools.islice(batches, 25))
    assert len(taken) == 25 and all(len(batch) == 4 for batch in _ids(taken))  # never a short batch
    assert batches.state_dict() == {"epoch": 10, "row": 0}
    with pytest.raises(TypeError):
        len(batches)
    # Each epoch holds every example once, in a fresh order.
    rows = functools.reduce(operator.iadd, _ids(taken), [])
    epochs = [rows[i : i + 10] for i in range(0, 100, 10)]
    assert all(sorted(epoch) == list(range(10)) for epoch in epochs)
    assert epochs[0] != epochs[1]


def test_dtypes_are_kept_and_tensors_do_not_alias_the_arrays():
    x, y = _arrays(6)
    features, _labels = next(iter(numpy_input_fn(x, y, batch_size=6, shuffle=False)()))
    assert features["age"].dtype == torch.float64
    assert features["pixels"].dtype == torch.int64
    features["age"][0] = 42.0
    assert x["age"][0] == 0.0


def test_array_x_becomes_a_tensor_and_missing_y_gives_none_labels():
    batches = list(numpy_input_fn(np.arange(5, dtype=np.float32), batch_size=2, shuffle=False)())
    assert [features.tolist() for features, _ in batches] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    assert all(labels is None for _, labels in batches)


def test_dict_y_gives_dict_labels():
    x, _ = _arrays(4)
    y = {"price": np.arange(4.0), "count": np.arange(4)}
    _, labels = next(iter(numpy_input_fn(x, y, batch_size=4, shuffle=False)()))
    assert set(labels) == {"price", "count"}
    assert labels["count"].tolist() == [0, 1, 2, 3]


def test_the_estimator_hands_the_input_fn_the_runs_seed(tmp_path):
    """numpy_input_fn without a seed of its own shuffles by RunConfig.random_seed, which the Estimator passes in."""
    x, y = _arrays(8)
    input_fn = numpy_input_fn(x, y, batch_size=4, num_epochs=1, shuffle=True)
    seen = []

    def model_fn(model, features, labels, mode):
        seen.append((labels - 100).tolist())
        return EstimatorSpec(mode, loss=model(features["age"].float()[:, None]).mean())

    make_estimator(tmp_path, model=lambda: torch.nn.Linear(1, 1), model_fn=model_fn, random_seed=7).train(input_fn)
    assert seen == _ids(input_fn(config=_Config(random_seed=7)))
    assert seen != _ids(input_fn(config=_Config(random_seed=8)))  # so the seed, not luck, made the order


def test_iterating_again_restarts_from_the_first_batch():
    x, y = _arrays(6)
    batches = numpy_input_fn(x, y, batch_size=4, shuffle=False)()
    assert _ids(batches) == _ids(batches) == [[0, 1, 2, 3], [4, 5]]
    pairs = dataset_input_fn(_PairDataset(3), 2, shuffle=False)()
    assert _ids(pairs) == _ids(pairs) == [[0, 1], [2]]


class _NumberedBatches:
    """A user's own ResumableIterable: batch i holds two rows of value i; its position is the next i."""

    def __init__(self) -> None:
        self.next, self.loaded, self.yielded = 0, [], []

    def __iter__(self):
        while True:
            index = self.next
            self.next += 1
            self.yielded.append(index)
            yield {"x": torch.full((2, 8), float(index))}, torch.tensor([index % 3, (index + 1) % 3])

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state) -> None:
        self.loaded.append(dict(state))
        self.next = state["next"]


def test_an_iterable_of_ones_own_with_the_protocol_is_resumed_by_the_estimator(tmp_path):
    """What ResumableIterable promises: the position goes into the checkpoint and comes back before iter()."""
    sources: list[_NumberedBatches] = []

    def input_fn():
        sources.append(_NumberedBatches())
        return sources[-1]

    make_estimator(tmp_path).train(input_fn, max_steps=4)
    make_estimator(tmp_path).train(input_fn, max_steps=7)
    first, second = sources
    assert first.loaded == [] and first.yielded == [0, 1, 2, 3]
    assert second.loaded == [{"next": 4}] and second.yielded == [4, 5, 6]


# --------------------------------------------------------------------------- errors


def test_shuffle_must_be_given_explicitly():
    x, y = _arrays(4)
    with pytest.raises(ValueError, match="explicitly set as boolean"):
        numpy_input_fn(x, y)
    with pytest.raises(ValueError, match="explicitly set as boolean"):
        pandas_input_fn(pd.DataFrame({"age": [1.0, 2.0]}))
    with pytest.raises(ValueError, match="explicitly set as boolean"):
        dataset_input_fn(_PairDataset(4), batch_size=2, shuffle=None)


def test_mismatched_lengths_name_the_keys_and_lengths():
    x = {"age": np.arange(4), "height": np.arange(3)}
    with pytest.raises(ValueError, match=r"'age': 4, 'height': 3.*in y: 4"):
        numpy_input_fn(x, np.arange(4), shuffle=False)


def test_bad_arguments_are_refused():
    x, y = _arrays(4)
    with pytest.raises(TypeError, match="x must be a dict of arrays or an array"):
        numpy_input_fn([1, 2, 3], shuffle=False)
    with pytest.raises(ValueError, match="empty dict"):
        numpy_input_fn({}, shuffle=False)
    with pytest.raises(ValueError, match="batch_size"):
        numpy_input_fn(x, y, batch_size=0, shuffle=False)
    with pytest.raises(ValueError, match="num_epochs"):
        numpy_input_fn(x, y, num_epochs=0, shuffle=False)
    with pytest.raises(TypeError, match=r"x\['name'\] has dtype <U"):
        numpy_input_fn({"name": np.array(["a", "b"])}, shuffle=False)
    with pytest.raises(ValueError, match="leaves no batch"):
        numpy_input_fn(x, y, batch_size=8, shuffle=False, drop_remainder=True)()


def test_global_batch_not_divisible_by_replicas_raises():
    x, y = _arrays(12)
    input_fn = numpy_input_fn(x, y, batch_size=5, shuffle=False)
    with pytest.raises(ValueError, match="global batch size 5 cannot be split evenly across 2"):
        input_fn(input_context=_context(2, 0))
    with pytest.raises(ValueError, match="cannot be split evenly"):
        dataset_input_fn(_PairDataset(12), batch_size=5, shuffle=False)(input_context=_context(2, 1))


def test_a_position_from_other_settings_is_refused():
    x, y = _arrays(10)
    batches = numpy_input_fn(x, y, batch_size=4, num_epochs=2, shuffle=False)()
    bad_states = [
        {"epoch": 0, "batch": 4},  # past the 3 batches of an epoch
        {"epoch": 3, "batch": 0},  # past the 2 epochs
        {"epoch": 0},
        {"epoch": -1, "batch": 0},
        {"epoch": 0, "row": 10},  # past the 10 rows of an epoch
        {"epoch": 2, "row": 1},  # past the 2 epochs
        {"epoch": 0, "row": 1, "batch": 0},
    ]
    for state in bad_states:
        with pytest.raises(ValueError, match="input position"):
            batches.load_state_dict(state)


# --------------------------------------------------------------------------- replicas


@pytest.mark.parametrize("count", [16, 11, 9])
def test_replica_batches_concatenate_to_the_single_replica_batch(count):
    x, y = _arrays(count)
    input_fn = numpy_input_fn(x, y, batch_size=4, num_epochs=2, shuffle=True, seed=3)
    single = list(input_fn())
    shards = [list(input_fn(input_context=_context(2, replica))) for replica in range(2)]
    assert len(shards[0]) == len(shards[1]) == len(single)
    for step, (features, labels) in enumerate(single):
        assert torch.equal(torch.cat([shard[step][1] for shard in shards]), labels)
        for key in features:
            assert torch.equal(torch.cat([shard[step][0][key] for shard in shards]), features[key])


def test_an_empty_share_of_the_last_batch_keeps_dtype_and_shape(caplog):
    x, y = _arrays(9)
    with caplog.at_level(logging.WARNING, logger="torchestimator.data.inputs"):
        input_fn = numpy_input_fn(x, y, batch_size=4, shuffle=False)
        last = list(input_fn(input_context=_context(2, 1)))[-1]
    assert "empty batch" in caplog.text
    features, labels = last
    assert features["pixels"].shape == (0, 3) and features["pixels"].dtype == torch.int64
    assert labels.shape == (0,)


def test_shuffle_uses_its_own_seed_and_config_seed():
    x, y = _arrays(20)

    def order(seed=None, config=None):
        np.random.seed(123)
        torch.manual_seed(123)
        input_fn = numpy_input_fn(x, y, batch_size=20, num_epochs=2, shuffle=True, seed=seed)
        return _ids(input_fn(config=config))

    assert order(seed=7) == order(seed=7, config=_Config(random_seed=1))
    assert order(config=_Config(random_seed=7)) == order(seed=7)
    assert order(config=_Config(random_seed=None)) == order(seed=0) == order()
    assert order(seed=7) != order(seed=8)
    first, second = order(seed=7)
    assert first != second and sorted(first) == sorted(second)


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 4, 5, 8, 9])
def test_resume_yields_exactly_the_remaining_batches(consumed):
    x, y = _arrays(10)
    input_fn = numpy_input_fn(x, y, batch_size=4, num_epochs=3, shuffle=True, seed=5)
    reference = list(input_fn())
    interrupted = input_fn()
    list(itertools.islice(interrupted, consumed))
    state = json.loads(json.dumps(interrupted.state_dict()))
    resumed = input_fn()
    resumed.load_state_dict(state)
    _assert_same_batches(list(resumed), reference[consumed:])


def test_resume_across_replica_counts_continues_the_same_global_batches():
    x, y = _arrays(16)
    input_fn = numpy_input_fn(x, y, batch_size=4, num_epochs=2, shuffle=True, seed=2)
    reference = list(input_fn())
    interrupted = input_fn()
    list(itertools.islice(interrupted, 5))
    shards = []
    for replica in range(2):
        resumed = input_fn(input_context=_context(2, replica))
        resumed.load_state_dict(interrupted.state_dict())
        shards.append(list(resumed))
    assert len(shards[0]) == len(shards[1]) == len(reference) - 5
    for (_, first), (_, second), (_, labels) in zip(*shards, reference[5:]):
        assert torch.equal(torch.cat([first, second]), labels)


def test_state_dict_is_json_serializable_plain_integers():
    x, y = _arrays(10)
    batches = numpy_input_fn(x, y, batch_size=4, num_epochs=None, shuffle=True)()
    list(itertools.islice(batches, 4))
    state = batches.state_dict()
    assert json.loads(json.dumps(state)) == state == {"epoch": 1, "row": 6}
    assert all(type(value) is int for value in state.values())


# --------------------------------------------------------------------------- pandas


def test_pandas_features_are_columns_and_labels_follow_y():
    frame = pd.DataFrame({"age": [1.0, 2.0, 3.0], "rooms": [1, 2, 3]}, index=[10, 11, 12])
    target = pd.Series([5, 6, 7], index=[10, 11, 12])
    features, labels = next(iter(pandas_input_fn(frame, target, batch_size=3, shuffle=False)()))
    assert set(features) == {"age", "rooms"}
    assert features["age"].dtype == torch.float64
    assert labels.tolist() == [5, 6, 7]
    targets = pd.DataFrame({"price": [1.0, 2.0, 3.0], "target": [0, 1, 0]}, index=frame.index)
    _, labels = next(iter(pandas_input_fn(frame, targets, batch_size=3, shuffle=False)()))
    assert labels["target"].tolist() == [0, 1, 0]


def test_pandas_index_mismatch_raises():
    frame = pd.DataFrame({"age": [1.0, 2.0, 3.0]}, index=[0, 1, 2])
    with pytest.raises(ValueError, match="indexes of x and y are mismatched"):
        pandas_input_fn(frame, pd.Series([1, 2, 3], index=[1, 2, 3]), shuffle=False)


def test_pandas_non_numeric_column_raises_naming_it():
    frame = pd.DataFrame({"age": [1.0, 2.0], "city": ["Oslo", "Lima"]})
    with pytest.raises(TypeError, match=r"x column 'city' has dtype (object|str)"):
        pandas_input_fn(frame, shuffle=False)
    with_gaps = pd.DataFrame({"rooms": pd.array([1, None], dtype="Int64")})
    with pytest.raises(ValueError, match="'rooms'.*missing values"):
        pandas_input_fn(with_gaps, shuffle=False)


def test_pandas_resume_matches_uninterrupted():
    frame = pd.DataFrame({"a": np.arange(7.0), "b": np.arange(7)})
    input_fn = pandas_input_fn(frame, pd.Series(np.arange(7)), batch_size=2, num_epochs=2, shuffle=True)
    reference = list(input_fn())
    interrupted = input_fn()
    list(itertools.islice(interrupted, 3))
    resumed = input_fn()
    resumed.load_state_dict(interrupted.state_dict())
    _assert_same_batches(list(resumed), reference[3:])


# --------------------------------------------------------------------------- dataset_input_fn


def test_dataset_batches_and_replicas_match_numpy_order():
    dataset = _PairDataset(9)
    input_fn = dataset_input_fn(dataset, batch_size=2, shuffle=True, num_epochs=3, seed=4)
    single = list(input_fn())
    assert len(single) == 14  # 27 rows
    expected = numpy_input_fn(np.arange(9), np.arange(9) + 100, batch_size=2, num_epochs=3, shuffle=True, seed=4)()
    assert _ids(single) == _ids(expected)
    shards = [list(input_fn(input_context=_context(2, replica))) for replica in range(2)]
    for step, (features, labels) in enumerate(single):
        assert torch.equal(torch.cat([shard[step][1] for shard in shards]), labels)
        values = torch.cat([shard[step][0]["value"] for shard in shards])
        assert torch.equal(values, features["value"])
    empty_features, empty_labels = shards[1][-1]  # last batch has 1 row for 2 replicas
    assert empty_features["value"].shape == (0, 2) and empty_labels.shape == (0,)


def test_dataset_resume_skips_at_the_index_level():
    dataset = _PairDataset(10)
    input_fn = dataset_input_fn(dataset, batch_size=4, shuffle=True, num_epochs=2, seed=9)
    reference = list(input_fn())
    dataset.fetched.clear()
    resumed = input_fn()
    resumed.load_state_dict({"epoch": 1, "row": 2})  # after 3 batches: 12 rows
    remaining = list(resumed)
    _assert_same_batches(remaining, reference[3:])
    assert len(dataset.fetched) == 8  # only the rows of the two remaining batches were loaded


def test_dataset_input_fn_leaves_the_global_torch_rng_alone():
    before = torch.get_rng_state()
    list(dataset_input_fn(_PairDataset(6), batch_size=2, shuffle=True)())
    assert torch.equal(before, torch.get_rng_state())


def test_dataset_items_must_be_pairs():
    class Features(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return {"value": torch.zeros(1)}

    with pytest.raises(TypeError, match=r"\(features, label\) pair"):
        list(dataset_input_fn(Features(), batch_size=2, shuffle=False)())


@pytest.mark.parametrize("consumed", [3, 5])
def test_dataset_resume_with_workers_counts_consumed_batches(consumed):
    dataset = _PairDataset(10)
    input_fn = dataset_input_fn(dataset, batch_size=4, shuffle=True, num_epochs=2, seed=9, num_workers=2)
    reference = list(dataset_input_fn(dataset, batch_size=4, shuffle=True, num_epochs=2, seed=9)())
    interrupted = input_fn()
    iterator = iter(interrupted)
    list(itertools.islice(iterator, consumed))  # workers have prefetched further by now
    state = json.loads(json.dumps(interrupted.state_dict()))
    assert state == {"epoch": consumed * 4 // 10, "row": consumed * 4 % 10}
    del iterator
    resumed = input_fn()
    resumed.load_state_dict(state)
    _assert_same_batches(list(resumed), reference[consumed:])


def test_describe_batch_sizes():
    expected = "global batch 128 = 2 replicas x 64 per replica"
    assert describe_batch_sizes(128, _context(2, 0)) == expected
    assert describe_batch_sizes(32) == "global batch 32 = 1 replica x 32 per replica"
    with pytest.raises(ValueError, match="cannot be split evenly"):
        describe_batch_sizes(10, _context(4, 0))
