"""Tests for torchestimator.metrics: streaming over batches, across processes, and input checks."""

from __future__ import annotations

import functools
import json
import math
import multiprocessing
import socket
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn import metrics as sklearn_metrics
from torchmetrics.classification import BinaryF1Score, MulticlassAccuracy

from torchestimator import metrics
from torchestimator.metrics import MetricAccumulators, MetricOp

BATCH_SIZES = (7, 1, 30, 12)  # uneven on purpose: a mean of batch means would differ


def _data(seed: int = 0, size: int = sum(BATCH_SIZES)) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    labels = generator.integers(0, 2, size)
    scores = np.clip(0.35 * labels + 0.65 * generator.random(size), 0.0, 1.0)
    return {
        "labels": labels,
        "scores": scores,
        "predictions": (scores > 0.5).astype(np.int64),
        "classes": generator.integers(0, 4, size),
        "class_predictions": generator.integers(0, 4, size),
        "targets": generator.normal(size=size),
        "outputs": generator.normal(size=size),
        "weights": generator.random(size),
    }


def _batches(data: dict[str, np.ndarray], sizes=BATCH_SIZES):
    start = 0
    for size in sizes:
        yield {key: torch.as_tensor(value[start : start + size]) for key, value in data.items()}
        start += size


def _eval_metric_ops(batch: dict[str, torch.Tensor]) -> dict[str, MetricOp]:
    return {
        "mean": metrics.mean(batch["targets"]),
        "weighted_mean": metrics.mean(batch["targets"], weights=batch["weights"]),
        "accuracy": metrics.accuracy(batch["classes"], batch["class_predictions"]),
        "weighted_accuracy": metrics.accuracy(batch["classes"], batch["class_predictions"], weights=batch["weights"]),
        "precision": metrics.precision(batch["labels"], batch["predictions"]),
        "weighted_precision": metrics.precision(batch["labels"], batch["predictions"], weights=batch["weights"]),
        "recall": metrics.recall(batch["labels"], batch["predictions"]),
        "weighted_recall": metrics.recall(batch["labels"], batch["predictions"], weights=batch["weights"]),
        "mse": metrics.mean_squared_error(batch["targets"], batch["outputs"]),
        "rmse": metrics.root_mean_squared_error(batch["targets"], batch["outputs"]),
        "mae": metrics.mean_absolute_error(batch["targets"], batch["outputs"], weights=batch["weights"]),
        "auc_exact": metrics.auc(batch["labels"], batch["scores"], num_thresholds=None),
        "auc_binned": metrics.auc(batch["labels"], batch["scores"]),
        "pr_exact": metrics.auc(batch["labels"], batch["scores"], curve="PR", num_thresholds=None),
    }


def _expected(data: dict[str, np.ndarray]) -> dict[str, float]:
    weights = data["weights"]
    errors = data["outputs"] - data["targets"]
    return {
        "mean": float(np.mean(data["targets"])),
        "weighted_mean": float(np.average(data["targets"], weights=weights)),
        "accuracy": sklearn_metrics.accuracy_score(data["classes"], data["class_predictions"]),
        "weighted_accuracy": sklearn_metrics.accuracy_score(
            data["classes"], data["class_predictions"], sample_weight=weights
        ),
        "precision": sklearn_metrics.precision_score(data["labels"], data["predictions"]),
        "weighted_precision": sklearn_metrics.precision_score(
            data["labels"], data["predictions"], sample_weight=weights
        ),
        "recall": sklearn_metrics.recall_score(data["labels"], data["predictions"]),
        "weighted_recall": sklearn_metrics.recall_score(data["labels"], data["predictions"], sample_weight=weights),
        "mse": float(np.mean(errors**2)),
        "rmse": math.sqrt(np.mean(errors**2)),
        "mae": float(np.average(np.abs(errors), weights=weights)),
        "auc_exact": sklearn_metrics.roc_auc_score(data["labels"], data["scores"]),
        "auc_binned": sklearn_metrics.roc_auc_score(data["labels"], data["scores"]),
        "pr_exact": sklearn_metrics.average_precision_score(data["labels"], data["scores"]),
    }


def _evaluate(data: dict[str, np.ndarray], sizes=BATCH_SIZES) -> dict[str, float]:
    accumulators = MetricAccumulators("cpu")
    for batch in _batches(data, sizes):
        accumulators.update(_eval_metric_ops(batch))
    return accumulators.compute()


def _assert_matches(results: dict[str, float], expected: dict[str, float]) -> None:
    assert set(results) == set(expected)
    for name, value in expected.items():
        # Binning at 200 thresholds approximates the exact AUC, like tf.metrics.auc;
        # torchmetrics computes the curves in float32, the means accumulate in float64.
        tolerance = {"auc_binned": 0.02, "auc_exact": 1e-6, "pr_exact": 1e-6}.get(name, 1e-12)
        assert results[name] == pytest.approx(value, abs=tolerance), name


def test_uneven_batches_give_the_full_data_values():
    data = _data()
    results = _evaluate(data)
    _assert_matches(results, _expected(data))
    assert all(type(value) is float for value in results.values())


def test_result_is_not_a_mean_of_batch_means():
    values = [torch.tensor([0.0]), torch.tensor([1.0, 1.0, 1.0])]
    accumulators = MetricAccumulators()
    for batch in values:
        accumulators.update({"mean": metrics.mean(batch), "rmse": metrics.root_mean_squared_error(batch * 0, batch)})
    results = accumulators.compute()
    assert results["mean"] == pytest.approx(0.75)  # per-batch means would give 0.5
    assert results["rmse"] == pytest.approx(math.sqrt(0.75))  # mean of batch RMSEs would give 0.5


def test_two_evaluations_are_independent():
    first, second = _data(seed=1), _data(seed=2)
    results_first = _evaluate(first)
    results_second = _evaluate(second, sizes=(20, 30))
    _assert_matches(results_first, _expected(first))
    _assert_matches(results_second, _expected(second))
    assert results_first["mean"] != results_second["mean"]


def test_weights_are_used_and_broadcast():
    accumulators = MetricAccumulators()
    accumulators.update({"weighted": metrics.mean([1.0, 3.0], weights=[3.0, 1.0])})
    accumulators.update({"weighted": metrics.mean(torch.tensor([[5.0, 5.0]]), weights=0.0)})
    # Without the weights the mean would be 3.5; the zero-weight batch must not count.
    assert accumulators.compute()["weighted"] == pytest.approx(1.5)


def test_weights_that_do_not_broadcast_are_refused():
    with pytest.raises(ValueError, match=r"accuracy: `weights` of shape \(3,\).*\(2,\)"):
        metrics.accuracy([1, 0], [1, 1], weights=[1.0, 2.0, 3.0])


def test_nan_propagates_instead_of_being_dropped():
    accumulators = MetricAccumulators()
    accumulators.update({"loss": metrics.mean(torch.tensor([1.0, float("nan")]))})
    accumulators.update({"loss": metrics.mean(torch.tensor([2.0]))})
    assert math.isnan(accumulators.compute()["loss"])


def test_empty_denominator_gives_zero_like_tensorflow():
    accumulators = MetricAccumulators()
    accumulators.update({"precision": metrics.precision([1, 1], [0, 0]), "recall": metrics.recall([0, 0], [1, 0])})
    assert accumulators.compute() == {"precision": 0.0, "recall": 0.0}


def test_boolean_predictions_and_column_labels_are_accepted():
    accumulators = MetricAccumulators()
    labels = torch.tensor([[1], [0], [1], [1]])  # (N, 1) labels against (N,) predictions
    accumulators.update({"accuracy": metrics.accuracy(labels, torch.tensor([True, False, False, True]))})
    assert accumulators.compute()["accuracy"] == pytest.approx(0.75)


def test_changing_the_kind_of_a_metric_name_is_refused():
    accumulators = MetricAccumulators()
    accumulators.update({"quality": metrics.accuracy([1], [1])})
    with pytest.raises(ValueError, match=r"eval_metric_ops\['quality'\] changed kind.*accuracy.*precision"):
        accumulators.update({"quality": metrics.precision([1], [1])})


def test_changing_auc_settings_is_refused():
    accumulators = MetricAccumulators()
    accumulators.update({"auc": metrics.auc([1, 0], [0.8, 0.1])})
    with pytest.raises(ValueError, match=r"eval_metric_ops\['auc'\].*num_thresholds=200.*num_thresholds=None"):
        accumulators.update({"auc": metrics.auc([1, 0], [0.8, 0.1], num_thresholds=None)})


@pytest.mark.parametrize("bad", ["abc", None, {"a": 1}, [[1, 2], [3]], [object()]])
def test_inputs_that_are_not_array_likes_are_refused(bad):
    with pytest.raises(ValueError, match=r"accuracy: `predictions` must be a tensor or an array-like"):
        metrics.accuracy([1, 0], bad)


def test_different_numbers_of_elements_name_the_metric_and_both_shapes():
    with pytest.raises(ValueError, match=r"precision: .*labels of shape \(4,\) and predictions of shape \(2, 3\)"):
        metrics.precision(torch.zeros(4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"mean_squared_error: .*\(3,\).*\(2,\)"):
        metrics.mean_squared_error([1.0, 2.0, 3.0], [1.0, 2.0])


def test_auc_refuses_weights_logits_and_bad_settings():
    with pytest.raises(ValueError, match="auc: `weights` are not supported"):
        metrics.auc([1, 0], [0.9, 0.1], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"auc\(.*`predictions` must be scores in \[0, 1\].*sigmoid"):
        metrics.auc([1, 0], [2.5, -1.0])
    with pytest.raises(ValueError, match="`curve` must be one of"):
        metrics.auc([1, 0], [0.9, 0.1], curve="roc")
    with pytest.raises(ValueError, match="`num_thresholds` must be an integer >= 2"):
        metrics.auc([1, 0], [0.9, 0.1], num_thresholds=1)


def test_auc_binned_is_constant_size_and_close_to_exact():
    data = _data(seed=3, size=2000)
    accumulators = MetricAccumulators()
    for batch in _batches(data, sizes=(999, 1001)):
        accumulators.update({"auc": metrics.auc(batch["labels"], batch["scores"], num_thresholds=50)})
    results = accumulators.compute()
    assert results["auc"] == pytest.approx(sklearn_metrics.roc_auc_score(data["labels"], data["scores"]), abs=0.02)


def test_from_torchmetrics_streams_any_metric():
    data = _data(seed=4)
    accumulators = MetricAccumulators()
    for batch in _batches(data):
        accumulators.update(
            {
                "f1": metrics.from_torchmetrics(BinaryF1Score, batch["predictions"], batch["labels"]),
                "per_class": metrics.from_torchmetrics(
                    lambda: MulticlassAccuracy(num_classes=4, average=None),
                    preds=batch["class_predictions"].numpy(),  # NumPy arrays become tensors
                    target=batch["classes"],
                ),
            }
        )
    results = accumulators.compute()
    assert results["f1"] == pytest.approx(sklearn_metrics.f1_score(data["labels"], data["predictions"]))
    per_class = sklearn_metrics.recall_score(data["classes"], data["class_predictions"], average=None)
    assert results["per_class"] == pytest.approx(list(per_class))  # non-scalar results become lists


def test_from_torchmetrics_refuses_a_metric_object_and_a_bad_factory():
    with pytest.raises(TypeError, match="zero-argument callable"):
        metrics.from_torchmetrics(BinaryF1Score(), torch.ones(2), torch.ones(2))
    accumulators = MetricAccumulators()
    with pytest.raises(TypeError, match=r"eval_metric_ops\['odd'\].*must return a torchmetrics.Metric.*int"):
        accumulators.update({"odd": metrics.from_torchmetrics(lambda: 3, torch.ones(2))})


def test_update_errors_from_torchmetrics_name_the_metric():
    accumulators = MetricAccumulators()
    op = metrics.from_torchmetrics(lambda: MulticlassAccuracy(num_classes=2), torch.tensor([5]), torch.tensor([0]))
    with pytest.raises(RuntimeError, match=r"eval_metric_ops\['bad'\].*could not be updated"):
        accumulators.update({"bad": op})
    shapes = metrics.from_torchmetrics(BinaryF1Score, torch.rand(3), torch.ones(4, dtype=torch.long))
    named = r"eval_metric_ops\['f1'\] \(from_torchmetrics\(.*BinaryF1Score\)\).*same shape"
    with pytest.raises(RuntimeError, match=named):
        accumulators.update({"f1": shapes})


def test_from_torchmetrics_partials_with_other_arguments_are_other_kinds():
    accumulators = MetricAccumulators()
    four = functools.partial(MulticlassAccuracy, num_classes=4)
    accumulators.update({"accuracy": metrics.from_torchmetrics(four, torch.tensor([1]), torch.tensor([1]))})
    three = functools.partial(MulticlassAccuracy, num_classes=3)
    with pytest.raises(ValueError, match=r"changed kind.*num_classes=4.*num_classes=3"):
        accumulators.update({"accuracy": metrics.from_torchmetrics(three, torch.tensor([1]), torch.tensor([1]))})


def test_values_that_are_not_metric_ops_are_refused():
    accumulators = MetricAccumulators()
    with pytest.raises(TypeError, match=r"eval_metric_ops\['accuracy'\] must be a MetricOp.*tuple"):
        accumulators.update({"accuracy": (torch.tensor(1.0), None)})
    with pytest.raises(TypeError, match="must be a dict of name -> MetricOp"):
        accumulators.update([metrics.mean([1.0])])
    accumulators.update(None)
    assert accumulators.compute() == {}


def test_inputs_are_detached_and_metrics_live_on_the_accumulator_device():
    predictions = torch.tensor([0.5, 1.5], requires_grad=True)
    op = metrics.mean_absolute_error(torch.tensor([1.0, 1.0]), predictions)
    assert not any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in op.args)
    accumulators = MetricAccumulators(torch.device("cpu"))
    accumulators.update({"mae": op})
    assert "mae" in accumulators and len(accumulators) == 1
    assert accumulators.compute()["mae"] == pytest.approx(0.5)
    assert accumulators._metrics["mae"].device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_inputs_reach_a_cuda_accumulator():
    accumulators = MetricAccumulators("cuda")
    accumulators.update({"accuracy": metrics.accuracy(torch.tensor([1, 0]), torch.tensor([1, 1], device="cuda"))})
    accumulators.update({"auc": metrics.auc(torch.tensor([1, 0], device="cuda"), torch.tensor([0.9, 0.2]))})
    assert accumulators.compute() == {"accuracy": 0.5, "auc": 1.0}
    assert accumulators._metrics["accuracy"].device.type == "cuda"


# --- two processes, gloo ---------------------------------------------------

SHARD_SIZES = ((5, 17), (11,))  # rank 0 sees 22 examples in two batches, rank 1 sees 11 in one


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _distributed_worker(rank: int, world_size: int, port: int, output: str) -> None:
    result: dict = {}
    try:
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
        data = _data(seed=5, size=sum(sum(sizes) for sizes in SHARD_SIZES))
        start = sum(sum(sizes) for sizes in SHARD_SIZES[:rank])
        shard = {key: value[start : start + sum(SHARD_SIZES[rank])] for key, value in data.items()}
        accumulators = MetricAccumulators("cpu")
        for batch in _batches(shard, SHARD_SIZES[rank]):
            accumulators.update(_eval_metric_ops(batch))
        result["values"] = accumulators.compute()

        # One process seeing a metric the other never saw must fail on both, not hang.
        mismatched = MetricAccumulators("cpu")
        if rank == 0:
            mismatched.update({"extra": metrics.mean([1.0])})
        try:
            mismatched.compute()
            result["mismatch_error"] = None
        except ValueError as error:
            result["mismatch_error"] = str(error)
        torch.distributed.destroy_process_group()
    except BaseException:  # reported to the parent test, which asserts on it
        result["error"] = traceback.format_exc()
    Path(output, f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_two_processes_with_uneven_shards_get_the_full_data_values(tmp_path):
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    processes = [context.Process(target=_distributed_worker, args=(rank, 2, port, str(tmp_path))) for rank in (0, 1)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=45)
        if process.is_alive():
            process.kill()
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for result in results:
        assert "error" not in result, result.get("error")
    expected = _expected(_data(seed=5, size=sum(sum(sizes) for sizes in SHARD_SIZES)))
    for result in results:
        _assert_matches(result["values"], expected)
    assert results[0]["values"] == results[1]["values"]
    for result in results:
        assert result["mismatch_error"] is not None and "saw different eval_metric_ops" in result["mismatch_error"]
