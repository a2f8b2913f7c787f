"""torchestimator.serving.metrics: TF Serving's metric names, labels and buckets, in a registry per instance."""

from __future__ import annotations

import math
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from torchestimator.serving.metrics import (
    ServingMetrics,
    exponential_buckets,
    prometheus_name,
)

REQUEST_COUNT = ":tensorflow:serving:request_count"
LATENCY = ":tensorflow:serving:request_latency"


def families(metrics: ServingMetrics) -> dict:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def samples(family, name: str) -> dict:
    return {tuple(sorted(sample.labels.items())): sample.value for sample in family.samples if sample.name == name}


def test_names_follow_tf_prometheus_exporter():
    # The default path, /monitoring/prometheus/metrics, is fetched from a running server in test_serving_server.
    assert prometheus_name("/tensorflow/serving/request_count") == REQUEST_COUNT
    assert (
        prometheus_name("/tensorflow/serving/batching/padding_size_v2")
        == ":tensorflow:serving:batching:padding_size_v2"
    )
    assert prometheus_name("9lives/x") == "_9lives:x"  # a leading digit gets an underscore, as TF does


def test_request_count_moves_per_model_and_status_and_is_exposed_as_tf_writes_it():
    metrics = ServingMetrics()
    metrics.observe_request("mlp", "Predict", "OK", 0.002)
    metrics.observe_request("mlp", "Predict", "OK", 0.003)
    metrics.observe_request("mlp", "Classify", "INVALID_ARGUMENT", 0.001)
    metrics.observe_request("other", "Regress", "NOT_FOUND", 0.001)
    body, _ = metrics.render()
    text = body.decode()
    # TF's exposition: a counter TYPE line and samples without prometheus_client's "_total" suffix.
    assert f"# TYPE {REQUEST_COUNT} counter\n" in text
    assert f'{REQUEST_COUNT}{{model_name="mlp",status="OK"}} 2.0\n' in text
    assert f"{REQUEST_COUNT}_total" not in text
    parsed = families(metrics)[REQUEST_COUNT]
    assert parsed.type == "counter"
    assert samples(parsed, REQUEST_COUNT + "_total") == {
        (("model_name", "mlp"), ("status", "OK")): 2.0,
        (("model_name", "mlp"), ("status", "INVALID_ARGUMENT")): 1.0,
        (("model_name", "other"), ("status", "NOT_FOUND")): 1.0,
    }


def test_latency_is_a_microsecond_histogram_of_successful_requests_only():
    metrics = ServingMetrics()
    metrics.observe_request("mlp", "Predict", "OK", 0.0001)  # 100 us
    metrics.observe_request("mlp", "Predict", "OK", 0.004)  # 4000 us
    metrics.observe_request("mlp", "Predict", "INVALID_ARGUMENT", 9.0)  # TF records latency only when OK
    latency = families(metrics)[LATENCY]
    assert latency.type == "histogram"
    labels = (("API", "Predict"), ("entrypoint", "REST"), ("model_name", "mlp"))
    assert samples(latency, LATENCY + "_count") == {labels: 2.0}
    assert samples(latency, LATENCY + "_sum")[labels] == pytest.approx(4100.0)
    buckets = {sample.labels["le"]: sample.value for sample in latency.samples if sample.name == LATENCY + "_bucket"}
    assert len(buckets) == 34 and buckets["+Inf"] == 2.0  # TF's 33 limits, then +Inf
    assert buckets["58.32"] == 0.0 and buckets["104.976"] == 1.0 and buckets["3570.47"] == 1.0
    assert buckets["6426.84"] == 2.0


def test_the_latency_page_has_tfs_exponential_buckets():
    """TF's request_latency buckets: 33 limits of 10 * 1.8**i microseconds (ExponentialBuckets(10, 1.8, 33)), +Inf."""
    metrics = ServingMetrics()
    metrics.observe_request("mlp", "Predict", "OK", 0.001)
    limits = [
        float(sample.labels["le"])
        for sample in families(metrics)[LATENCY].samples
        if sample.name == LATENCY + "_bucket"
    ]
    assert limits[-1] == math.inf
    assert limits[:-1] == pytest.approx([10 * 1.8**index for index in range(33)], rel=1e-5)  # the page rounds
    assert exponential_buckets(1, 2, 15) == pytest.approx([2.0**index for index in range(15)])


def test_example_counts_and_total_use_tf_label_model():
    metrics = ServingMetrics()
    metrics.observe_examples("mlp", 3)
    metrics.observe_examples("mlp", 5)
    parsed = families(metrics)
    total = parsed[":tensorflow:serving:request_example_count"]  # the parser strips a counter's "_total"
    assert total.type == "counter"
    assert samples(total, ":tensorflow:serving:request_example_count_total") == {(("model", "mlp"),): 8.0}
    counts = parsed[":tensorflow:serving:request_example_counts"]
    name = ":tensorflow:serving:request_example_counts"
    assert samples(counts, name + "_count") == {(("model", "mlp"),): 2.0}
    buckets = {sample.labels["le"]: sample.value for sample in counts.samples if sample.name == name + "_bucket"}
    assert (buckets["2"], buckets["4"], buckets["8"]) == (0.0, 1.0, 2.0)  # TF buckets count values below the limit


def test_batches_record_real_size_processed_size_and_padding():
    metrics = ServingMetrics()
    metrics.observe_batch("mlp", real_size=5, padded_size=8)
    metrics.observe_batch("mlp", real_size=8, padded_size=8)
    metrics.observe_batch(None, real_size=1, padded_size=1)
    parsed = families(metrics)
    processed = parsed[":tensorflow:serving:batching:processed_batch_size_v2"]
    assert processed.type == "counter"
    assert samples(processed, ":tensorflow:serving:batching:processed_batch_size_v2_total") == {
        (("batch_size", "8"), ("model_name", "mlp"), ("op_name", "torchestimator_batcher")): 2.0,
        (("batch_size", "1"), ("model_name", "model_name_unset"), ("op_name", "torchestimator_batcher")): 1.0,
    }
    padding_name = ":tensorflow:serving:batching:padding_size_v2"
    padding = samples(parsed[padding_name], padding_name + "_sum")
    assert padding[(("execution_batch_size", "8"), ("model_name", "mlp"), ("op_name", "torchestimator_batcher"))] == 3
    padding_buckets = {
        sample.labels["le"]: sample.value
        for sample in parsed[padding_name].samples
        if sample.name == padding_name + "_bucket" and sample.labels["execution_batch_size"] == "8"
    }
    assert (padding_buckets["0.666667"], padding_buckets["2.66667"], padding_buckets["+Inf"]) == (1.0, 1.0, 2.0)
    size_name = ":tensorflow:serving:batching:batch_size"
    assert (
        samples(parsed[size_name], size_name + "_sum")[(("model_name", "mlp"), ("op_name", "torchestimator_batcher"))]
        == 13
    )
    with pytest.raises(ValueError, match="real_size <= padded_size"):
        metrics.observe_batch("mlp", real_size=9, padded_size=8)


def test_two_instances_are_independent():
    first, second = ServingMetrics(), ServingMetrics()
    first.observe_request("mlp", "Predict", "OK", 0.001)
    assert first.value(REQUEST_COUNT, {"model_name": "mlp", "status": "OK"}) == 1.0
    assert second.value(REQUEST_COUNT, {"model_name": "mlp", "status": "OK"}) is None
    assert first.registry is not second.registry
    assert f'{REQUEST_COUNT}{{model_name="mlp"' not in second.render()[0].decode()


def test_concurrent_observations_are_all_counted():
    metrics = ServingMetrics()

    def work():
        for _ in range(2000):
            metrics.observe_request("mlp", "Predict", "OK", 0.001)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert metrics.value(REQUEST_COUNT, {"model_name": "mlp", "status": "OK"}) == 8000.0
    assert metrics.value(LATENCY + "_count", {"model_name": "mlp", "API": "Predict", "entrypoint": "REST"}) == 8000.0
