"""Prometheus metrics under TF Serving's names, served at TF's monitoring path.

    metrics = ServingMetrics()                       # one private registry per app
    metrics.observe_request("mlp", "Predict", "OK", 0.0042)
    metrics.observe_examples("mlp", 16)              # :classify / :regress only, as TF
    metrics.observe_batch("mlp", real_size=5, padded_size=8)
    body, content_type = metrics.render()            # GET /monitoring/prometheus/metrics

What belongs here: the metric families, their labels and buckets, and the
exposition. What does not: HTTP (app.py) and deciding what to observe.

Names, labels and buckets are TF Serving's (SRV ``servables/tensorflow/util.cc``;
TF ``core/kernels/batching_util/batch_resource_base.cc``), and the exposition
name is TF's too: ``util/prometheus_exporter.cc`` replaces every character
outside ``[a-zA-Z0-9_]`` with ``:``, so ``/tensorflow/serving/request_count`` is
scraped as ``:tensorflow:serving:request_count``:

    :tensorflow:serving:request_count{model_name, status}              counter
    :tensorflow:serving:request_latency{model_name, API, entrypoint}   histogram, microseconds
    :tensorflow:serving:request_example_counts{model}                  histogram
    :tensorflow:serving:request_example_count_total{model}             counter
    :tensorflow:serving:batching:batch_size{model_name, op_name}       histogram (real size)
    :tensorflow:serving:batching:processed_batch_size_v2{model_name, op_name, batch_size}   counter
    :tensorflow:serving:batching:padding_size_v2{model_name, execution_batch_size, op_name} histogram

Where the exposition differs from TF's, and why:

* prometheus_client would name a counter's samples ``<name>_total``; TF does
  not, and dashboards query TF's names. The families are collected as untyped
  (same sample names as TF) and the ``# TYPE`` line is then set back to
  ``counter``, exactly as TF writes it; prometheus_client's parser reads that
  as a counter.
* ``# HELP`` lines are added (TF writes none) and values print as ``5.0``
  rather than ``5``; labels are sorted by name. None of this changes a series.
* TF records request latency from its gRPC handlers with entrypoint ``GRPC``;
  ours come from REST, so ``entrypoint`` defaults to ``REST``. ``API`` takes
  TF's values: ``Predict``, ``Classify``, ``Regress`` (see API_BY_VERB).
* Buckets count values strictly below their limit (TF's Histogram uses
  upper_bound), and ``le`` prints the limit as TF does (``%g``, six digits).
  padding_size_v2 lacks TF's always-empty ``le="-0.666667"`` bucket (see
  _padding_buckets).

The hot path (observe_*) is a dict lookup, a bisect and two additions under
one lock; the exposition is built only when scraped.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Sequence

from torchestimator._extras import import_extra

import_extra("prometheus_client", extra="serving", feature="the model server")  # one line if it is missing
from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest  # noqa: E402
from prometheus_client.metrics_core import HistogramMetricFamily, Metric, UnknownMetricFamily  # noqa: E402

from torchestimator.serving.settings import DEFAULT_METRICS_PATH  # noqa: E402  (TF Serving's default metrics path)

__all__ = [
    "API_BY_VERB",
    "DEFAULT_METRICS_PATH",
    "DEFAULT_OP_NAME",
    "ServingMetrics",
    "exponential_buckets",
    "prometheus_name",
]


API_BY_VERB = {
    "predict": "Predict",
    "classify": "Classify",
    "regress": "Regress",
    "status": "GetModelStatus",
    "metadata": "GetModelMetadata",
}
"""REST verb -> the ``API`` label value TF Serving uses for it."""

DEFAULT_OP_NAME = "torchestimator_batcher"
"""``op_name`` label of the batching metrics: TF puts its BatchFunction op's name there."""

MODEL_NAME_UNSET = "model_name_unset"
"""TF's batching label when a batch has no model name (batch_resource_base.cc GetModelName)."""


def prometheus_name(tf_name: str) -> str:
    """A TF metric name as TF's Prometheus exporter writes it: ``/a/b`` -> ``:a:b``."""
    name = "".join(
        character if character.isascii() and (character.isalnum() or character == "_") else ":" for character in tf_name
    )
    return "_" + name if name[:1].isdigit() else name


def exponential_buckets(scale: float, growth_factor: float, bucket_count: int) -> tuple[float, ...]:
    """TF's monitoring::Buckets::Exponential limits, multiplied in TF's order so the doubles are equal."""
    limits, bound = [], scale
    for _ in range(bucket_count):
        limits.append(bound)
        bound *= growth_factor
    return tuple(limits)


def _padding_buckets() -> tuple[float, ...]:
    # RecordPaddingSizeV2: buckets centred on 0 and the powers of 2. TF's first limit, -2/3, is left
    # out: padding is never negative, so that bucket is always empty, and prometheus_client drops
    # _sum and _count from any histogram with a negative bucket (an OpenMetrics rule).
    return exponential_buckets(2.0 / 3.0, 2, 16)


# Scale 10 us, power 1.8, 33 buckets (~20 minutes): request_latency in util.cc.
LATENCY_BUCKETS_MICROSECONDS = exponential_buckets(10, 1.8, 33)
EXAMPLE_COUNT_BUCKETS = exponential_buckets(1, 2, 15)  # 1 .. 16384
BATCH_SIZE_BUCKETS = exponential_buckets(1, 1.5, 20)
PADDING_SIZE_BUCKETS = _padding_buckets()


class _Histogram:
    """TF-style histogram cells: per label tuple, counts per bucket (last = overflow) and a sum."""

    __slots__ = ("_le", "cells", "documentation", "labelnames", "limits", "name")

    def __init__(self, tf_name: str, documentation: str, labelnames: Sequence[str], limits: Sequence[float]) -> None:
        self.name = prometheus_name(tf_name)
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.limits = tuple(limits)
        self._le = [f"{limit:.6g}" for limit in self.limits] + ["+Inf"]
        self.cells: dict[tuple[str, ...], list[float]] = {}

    def add(self, labels: tuple[str, ...], value: float) -> None:
        """Caller holds the lock. cell = [count per bucket..., sum]."""
        cell = self.cells.get(labels)
        if cell is None:
            cell = self.cells[labels] = [0.0] * (len(self.limits) + 2)
        cell[bisect.bisect_right(self.limits, value)] += 1
        cell[-1] += value

    def family(self, cells: dict[tuple[str, ...], list[float]]) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, cell in cells.items():
            cumulative, buckets = 0.0, []
            for le, count in zip(self._le, cell[:-1]):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(list(labels), buckets, cell[-1])
        return family


class _Counter:
    __slots__ = ("cells", "documentation", "labelnames", "name")

    def __init__(self, tf_name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = prometheus_name(tf_name)
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.cells: dict[tuple[str, ...], float] = {}

    def add(self, labels: tuple[str, ...], amount: float) -> None:
        self.cells[labels] = self.cells.get(labels, 0.0) + amount

    def family(self, cells: dict[tuple[str, ...], float]) -> Metric:
        # Untyped keeps TF's sample name (no "_total"); render() restores the counter TYPE line.
        family = UnknownMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in cells.items():
            family.add_metric(list(labels), value)
        return family


class ServingMetrics:
    """TF Serving's request, example and batching metrics for one server, in a registry of its own.

    Thread-safe: observe_* may be called from the event loop and worker
    threads alike. Several instances in one process never share a series.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.request_count = _Counter(
            "/tensorflow/serving/request_count", "The total number of requests.", ("model_name", "status")
        )
        self.request_latency = _Histogram(
            "/tensorflow/serving/request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ("model_name", "API", "entrypoint"),
            LATENCY_BUCKETS_MICROSECONDS,
        )
        self.example_counts = _Histogram(
            "/tensorflow/serving/request_example_counts",
            "The number of tensorflow.Examples per request.",
            ("model",),
            EXAMPLE_COUNT_BUCKETS,
        )
        self.example_count_total = _Counter(
            "/tensorflow/serving/request_example_count_total", "The total number of tensorflow.Examples.", ("model",)
        )
        self.batch_size = _Histogram(
            "/tensorflow/serving/batching/batch_size",
            "Tracks the batch size distribution on the batch result by model_name (if available).",
            ("model_name", "op_name"),
            BATCH_SIZE_BUCKETS,
        )
        self.processed_batch_size = _Counter(
            "/tensorflow/serving/batching/processed_batch_size_v2",
            "Tracks the batch size on processing by model_name and op name (if available).",
            ("model_name", "op_name", "batch_size"),
        )
        self.padding_size = _Histogram(
            "/tensorflow/serving/batching/padding_size_v2",
            "Tracks the padding size distribution on batches by model_name (if available).",
            ("model_name", "execution_batch_size", "op_name"),
            PADDING_SIZE_BUCKETS,
        )
        self._histograms = (self.request_latency, self.example_counts, self.batch_size, self.padding_size)
        self._counters = (self.request_count, self.example_count_total, self.processed_batch_size)
        self._counter_type_lines = [
            (f"# TYPE {counter.name} untyped\n".encode(), f"# TYPE {counter.name} counter\n".encode())
            for counter in self._counters
        ]
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def observe_request(
        self, model_name: str, api: str, status_code: str, seconds: float, entrypoint: str = "REST"
    ) -> None:
        """One finished request: counted under its status; its latency only when OK (as TF records it).

        ``api`` is TF's label value (API_BY_VERB), ``status_code`` the
        canonical code name (``OK``, ``INVALID_ARGUMENT``, ... as ServingError.code).
        """
        with self._lock:
            self.request_count.add((model_name, status_code), 1)
            if status_code == "OK":
                self.request_latency.add((model_name, api, entrypoint), seconds * 1e6)

    def observe_examples(self, model_name: str, count: int) -> None:
        """Examples in one :classify or :regress request (TF's RecordRequestExampleCount; not for predict)."""
        with self._lock:
            self.example_counts.add((model_name,), count)
            self.example_count_total.add((model_name,), count)

    def observe_batch(
        self, model_name: str | None, real_size: int, padded_size: int, op_name: str = DEFAULT_OP_NAME
    ) -> None:
        """One batch run by the batcher: ``real_size`` rows of requests, padded to ``padded_size``."""
        if padded_size < real_size or real_size < 0:
            raise ValueError(
                f"observe_batch needs 0 <= real_size <= padded_size; received real_size={real_size}, "
                f"padded_size={padded_size}."
            )
        model = model_name or MODEL_NAME_UNSET
        padded = str(padded_size)
        with self._lock:
            self.batch_size.add((model, op_name), real_size)
            self.processed_batch_size.add((model, op_name, padded), 1)
            self.padding_size.add((model, padded, op_name), padded_size - real_size)

    def collect(self) -> Iterable[Metric]:
        """The registry's view (prometheus_client's Collector protocol); copies cells under the lock."""
        with self._lock:
            histograms = [
                (histogram, {key: list(cell) for key, cell in histogram.cells.items()})
                for histogram in self._histograms
            ]
            counters = [(counter, dict(counter.cells)) for counter in self._counters]
        for counter, counts in counters:
            yield counter.family(counts)
        for histogram, buckets in histograms:
            yield histogram.family(buckets)

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its Content-Type, for the monitoring endpoint."""
        body = generate_latest(self.registry)
        for untyped, counter in self._counter_type_lines:
            body = body.replace(untyped, counter, 1)
        return body, CONTENT_TYPE_PLAIN_0_0_4

    def value(self, name: str, labels: dict[str, str]) -> float | None:
        """One sample's current value by exposition sample name (e.g. ``..._count``), for tests and health checks."""
        for family in self.collect():
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return sample.value
        return None
