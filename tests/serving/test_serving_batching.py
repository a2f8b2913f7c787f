"""torchestimator.serving.batching: TF Serving's server-side batching over ExportedModel signatures."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import numpy as np
import pytest
import torch
from helpers import exporting_model_fn, trained_classifier

from torchestimator.export import PredictOutput, TensorSpec, export_saved_model, load, serving_input_receiver
from torchestimator.serving.batching import QUEUE_FULL_CODE, BatchingParameters, BatchScheduler
from torchestimator.serving.errors import ServingError

WAIT = 10  # seconds a test waits for a future that should come at once; never reached when things work
FOREVER = 60_000_000  # a batch timeout (micros) no test waits for: batches go when full or when a thread frees


model_fn = exporting_model_fn(
    lambda logits, predictions: {
        "probabilities": PredictOutput({"probabilities": predictions["probabilities"]}),
        # One output without a batch dimension: the scheduler must find out and run such requests alone.
        "with_total": PredictOutput({"probabilities": predictions["probabilities"], "total": logits.sum()}),
    }
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One small trained classifier, exported with a dynamic batch dimension and with a fixed one."""
    root = tmp_path_factory.mktemp("batching")
    estimator, x = trained_classifier(root / "model", model_fn, steps=5)
    dynamic = export_saved_model(
        estimator, root / "dynamic", serving_input_receiver({"x": TensorSpec(shape=(None, 8))})
    )
    fixed = export_saved_model(estimator, root / "fixed", serving_input_receiver({"x": TensorSpec(shape=(2, 8))}))
    return {"model": load(dynamic), "fixed": load(fixed), "x": torch.from_numpy(np.ascontiguousarray(x[:32]))}


class Gated:
    """An ExportedModel whose forward passes wait for ``gate`` (after setting ``entered``), and can refuse rows.

    Blocking the only batch thread this way makes queue states deterministic
    without sleeping. Rows whose first feature is ``poison`` raise ValueError.
    """

    def __init__(self, model, *, gate: threading.Event | None = None, poison: float | None = None):
        self.model, self.gate, self.poison = model, gate, poison
        self.entered = threading.Event()
        self.rows: list[int] = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, inputs, signature_name="serving_default"):
        self.rows.append(int(inputs["x"].shape[0]))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT)
        if self.poison is not None and bool((inputs["x"][:, 0] == self.poison).any()):
            raise ValueError(f"row with x[0] == {self.poison} refused")
        return self.model(inputs, signature_name=signature_name)


def assert_same_outputs(actual, expected, *, exact=False):
    """Integer outputs must be equal; floats too when the request ran alone (exact=True).

    A row's floats may differ in the last bit between batch sizes: CPU matmul
    kernels block and vectorise differently with the number of rows, so rows
    of a batch are compared with a 1e-6 relative tolerance.
    """
    assert sorted(actual) == sorted(expected)
    for name in expected:
        assert actual[name].dtype == expected[name].dtype and actual[name].shape == expected[name].shape
        if exact or not np.issubdtype(expected[name].dtype, np.floating):
            np.testing.assert_array_equal(actual[name], expected[name])
        else:
            np.testing.assert_allclose(actual[name], expected[name], rtol=1e-6, atol=1e-7)


def parameters(**changes):
    return BatchingParameters(**{"num_batch_threads": 1, "batch_timeout_micros": FOREVER, **changes})


def occupy(scheduler, model, x):
    """Submits one request and waits until the only batch thread is inside the model with it."""
    future = scheduler.submit(model, "serving_default", {"x": x[:1]})
    assert model.entered.wait(WAIT)
    return future


# -- batching ------------------------------------------------------------------------------


def test_concurrent_submits_are_gathered_into_one_forward_pass_with_per_request_results(exported):
    model, x = exported["model"], exported["x"]
    sizes = [1, 3, 2, 1, 4, 1]
    starts = np.cumsum([0] + sizes)
    requests = [{"x": x[start : start + size]} for start, size in zip(starts, sizes)]
    batches = []
    barrier = threading.Barrier(len(requests))
    with BatchScheduler(
        parameters(max_batch_size=sum(sizes), num_batch_threads=2),
        on_batch=lambda real, padded: batches.append((real, padded)),
    ) as scheduler:

        def client(inputs):
            barrier.wait(WAIT)
            return scheduler.submit(model, "serving_default", inputs).result(WAIT)

        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            results = list(pool.map(client, requests))
    assert batches == [(sum(sizes), sum(sizes))]  # one forward pass for six requests: full batch, no timeout
    for inputs, result in zip(requests, results):
        assert_same_outputs(result, model(inputs, signature_name="serving_default"))


def test_with_timeout_zero_requests_gather_while_the_threads_are_busy(exported):
    x = exported["x"]
    model = Gated(exported["model"], gate=threading.Event())
    batches = []
    with BatchScheduler(
        parameters(batch_timeout_micros=0), on_batch=lambda real, padded: batches.append(real)
    ) as scheduler:
        first = occupy(scheduler, model, x)
        futures = [scheduler.submit(model, "serving_default", {"x": x[index : index + 1]}) for index in range(1, 6)]
        assert scheduler.num_enqueued_tasks == 5 and not any(future.done() for future in futures)
        model.gate.set()
        results = [future.result(WAIT) for future in futures]
        first.result(WAIT)
    assert batches == [1, 5]  # TF's timeout 0: run when a thread is free, gathering meanwhile
    for index, result in enumerate(results, start=1):
        assert_same_outputs(result, exported["model"]({"x": x[index : index + 1]}))


def test_different_signatures_and_shapes_go_to_separate_batches(exported):
    x = exported["x"]
    model = Gated(exported["model"], gate=threading.Event())
    with BatchScheduler(parameters(batch_timeout_micros=0)) as scheduler:
        occupy(scheduler, model, x)
        default = [scheduler.submit(model, "serving_default", {"x": x[i : i + 1]}) for i in range(2)]
        probabilities = [scheduler.submit(model, "probabilities", {"x": x[i : i + 2]}) for i in range(3)]
        model.gate.set()
        default_results = [future.result(WAIT) for future in default]
        probability_results = [future.result(WAIT) for future in probabilities]
    assert sorted(model.rows[1:]) == [2, 6]  # one pass per signature after the first request
    assert sorted(default_results[0]) == ["class", "probabilities"]
    for i, result in enumerate(probability_results):
        assert_same_outputs(result, exported["model"]({"x": x[i : i + 2]}, signature_name="probabilities"))


def test_allowed_batch_sizes_pad_the_batch_and_the_padding_is_dropped(exported):
    x = exported["x"]
    model = Gated(exported["model"], gate=threading.Event())
    batches = []
    with BatchScheduler(
        parameters(batch_timeout_micros=0, max_batch_size=8, allowed_batch_sizes=(4, 8)),
        on_batch=lambda real, padded: batches.append((real, padded)),
    ) as scheduler:
        occupy(scheduler, model, x)
        futures = [
            scheduler.submit(model, "serving_default", {"x": x[2:4]}),
            scheduler.submit(model, "serving_default", {"x": x[4:7]}),
        ]
        model.gate.set()
        two, three = (future.result(WAIT) for future in futures)
    assert batches == [(1, 4), (5, 8)]  # padded up to the next allowed size, even a lone request
    assert model.rows == [4, 8]
    assert len(two["class"]) == 2 and len(three["probabilities"]) == 3
    assert_same_outputs(two, exported["model"]({"x": x[2:4]}))
    assert_same_outputs(three, exported["model"]({"x": x[4:7]}))


def test_a_lone_request_waits_for_the_timeout_and_a_full_batch_goes_at_once(exported):
    model, x = exported["model"], exported["x"]
    with BatchScheduler(parameters(batch_timeout_micros=300_000, max_batch_size=4)) as scheduler:
        started = time.monotonic()
        lone = scheduler.submit(model, "serving_default", {"x": x[:1]})
        lone.result(WAIT)
        assert time.monotonic() - started >= 0.29  # a lower bound only: the scheduler may not run it earlier
    with BatchScheduler(parameters(max_batch_size=4)) as scheduler:  # timeout: a minute
        full = scheduler.submit(model, "serving_default", {"x": x[:4]})
        assert_same_outputs(full.result(WAIT), model({"x": x[:4]}), exact=True)  # one request, unpadded


# -- errors --------------------------------------------------------------------------------


def test_a_request_larger_than_max_batch_size_is_refused_at_submit(exported):
    with BatchScheduler(parameters(max_batch_size=4)) as scheduler:
        with pytest.raises(ServingError) as caught:
            scheduler.submit(exported["model"], "serving_default", {"x": exported["x"][:5]})
    assert caught.value.code == "INVALID_ARGUMENT" and caught.value.http_status == 400
    assert caught.value.message == "Task size 5 is larger than maximum input batch size 4"


def test_inputs_the_signature_refuses_raise_at_submit_like_the_model(exported):
    with BatchScheduler(parameters()) as scheduler:
        with pytest.raises(ValueError, match="shape"):
            scheduler.submit(exported["model"], "serving_default", {"x": torch.zeros(2, 5)})
        with pytest.raises(ValueError, match="no signature 'nope'"):
            scheduler.submit(exported["model"], "nope", {"x": torch.zeros(2, 8)})
        assert scheduler.num_enqueued_tasks == 0


def test_a_full_queue_refuses_requests_that_do_not_fit_at_once(exported):
    x = exported["x"]
    model = Gated(exported["model"], gate=threading.Event())
    with BatchScheduler(parameters(batch_timeout_micros=0, max_batch_size=3, max_enqueued_batches=2)) as scheduler:
        occupy(scheduler, model, x)  # the only thread is busy: everything below waits in the queue
        accepted = [
            scheduler.submit(model, "serving_default", {"x": x[:2]}),  # opens batch 1
            scheduler.submit(model, "serving_default", {"x": x[:2]}),  # does not fit: opens batch 2
            scheduler.submit(model, "serving_default", {"x": x[:1]}),
        ]  # fits in batch 2
        with pytest.raises(ServingError) as caught:
            scheduler.submit(model, "serving_default", {"x": x[:1]})  # needs a third batch
        other_signature = scheduler.submit(model, "probabilities", {"x": x[:1]})  # its own queue: accepted
        model.gate.set()
        for future in accepted + [other_signature]:
            future.result(WAIT)
        after = scheduler.submit(model, "serving_default", {"x": x[:1]})  # drained: accepted again
        after.result(WAIT)
    assert caught.value.code == QUEUE_FULL_CODE == "RESOURCE_EXHAUSTED" and caught.value.http_status == 429
    assert caught.value.message.startswith("The batch scheduling queue to which this task was submitted is full")
    assert "2 batches enqueued and max_enqueued_batches is 2" in caught.value.message


def test_a_failing_request_does_not_fail_its_batch_mates_and_the_scheduler_survives(exported):
    x = exported["x"].clone()
    x[1, 0] = -123.0
    model = Gated(exported["model"], poison=-123.0)
    with BatchScheduler(parameters(max_batch_size=3)) as scheduler:
        futures = [scheduler.submit(model, "serving_default", {"x": x[i : i + 1]}) for i in range(3)]
        with pytest.raises(ValueError, match="refused"):
            futures[1].result(WAIT)
        good = [futures[0].result(WAIT), futures[2].result(WAIT)]
        later = scheduler.submit(model, "serving_default", {"x": x[5:8]}).result(WAIT)  # a full batch
    assert model.rows == [3, 1, 1, 1, 3]  # the batch, its three reruns alone, the later request
    assert_same_outputs(good[0], exported["model"]({"x": x[0:1]}), exact=True)
    assert_same_outputs(good[1], exported["model"]({"x": x[2:3]}), exact=True)
    assert_same_outputs(later, exported["model"]({"x": x[5:8]}), exact=True)


def test_outputs_without_a_batch_dimension_make_the_signature_run_per_request(exported, caplog):
    model, x = Gated(exported["model"]), exported["x"]
    with BatchScheduler(parameters(max_batch_size=3)) as scheduler, caplog.at_level(logging.WARNING):
        first = [scheduler.submit(model, "with_total", {"x": x[i : i + 1]}) for i in (0, 1, 2)]
        first_results = [future.result(WAIT) for future in first]
        later = [scheduler.submit(model, "with_total", {"x": x[i : i + 1]}) for i in (3, 4)]
        later_results = [future.result(WAIT) for future in later]  # alone: no waiting for a full batch
    assert model.rows == [3, 1, 1, 1, 1, 1]
    assert "without the batch size" in caplog.text
    for i, result in zip((0, 1, 2, 3, 4), first_results + later_results):
        expected = exported["model"]({"x": x[i : i + 1]}, signature_name="with_total")
        assert result["total"].shape == ()
        assert_same_outputs(result, expected, exact=True)  # each ran alone


def test_inputs_without_a_dynamic_batch_dimension_run_per_request(exported):
    fixed, x = Gated(exported["fixed"]), exported["x"]
    with BatchScheduler(parameters(max_batch_size=2)) as scheduler:
        futures = [scheduler.submit(fixed, "serving_default", {"x": x[i : i + 2]}) for i in (0, 2, 4)]
        results = [future.result(WAIT) for future in futures]
    assert fixed.rows == [2, 2, 2]
    for i, result in zip((0, 2, 4), results):
        assert_same_outputs(result, exported["fixed"]({"x": x[i : i + 2]}), exact=True)


def test_close_answers_waiting_requests_and_stops_the_threads(exported):
    model, x = exported["model"], exported["x"]
    scheduler = BatchScheduler(parameters(num_batch_threads=2))
    threads = [thread for thread in threading.enumerate() if thread.name.startswith("torchestimator-batch-")]
    assert {thread.name for thread in threads} >= {"torchestimator-batch-0", "torchestimator-batch-1"}
    assert all(thread.daemon for thread in threads)
    waiting = scheduler.submit(model, "serving_default", {"x": x[:1]})  # waits a minute for company
    scheduler.close()
    with pytest.raises(ServingError) as caught:
        waiting.result(WAIT)
    assert caught.value.code == "UNAVAILABLE" and "closed" in caught.value.message
    with pytest.raises(ServingError, match="closed") as refused:
        scheduler.submit(model, "serving_default", {"x": x[:1]})
    assert refused.value.code == "UNAVAILABLE"
    assert not any(thread.is_alive() for thread in scheduler._threads)
    scheduler.close()  # twice is fine


def test_a_cancelled_request_is_not_run(exported):
    x = exported["x"]
    model = Gated(exported["model"], gate=threading.Event())
    with BatchScheduler(parameters(batch_timeout_micros=0)) as scheduler:
        occupy(scheduler, model, x)
        cancelled = scheduler.submit(model, "serving_default", {"x": x[:3]})
        kept = scheduler.submit(model, "serving_default", {"x": x[3:4]})
        assert cancelled.cancel()
        model.gate.set()
        assert_same_outputs(kept.result(WAIT), exported["model"]({"x": x[3:4]}), exact=True)
    assert model.rows == [1, 1]  # the cancelled three rows never reached the model


# -- parameters ----------------------------------------------------------------------------


def test_parameters_have_tf_defaults():
    defaults = BatchingParameters()
    assert (defaults.max_batch_size, defaults.batch_timeout_micros, defaults.max_enqueued_batches) == (1000, 0, 10)
    assert defaults.num_batch_threads >= 1 and defaults.allowed_batch_sizes == ()
    assert BatchingParameters(max_batch_size=8, allowed_batch_sizes=[2, 8]).allowed_batch_sizes == (2, 8)
    assert BatchingParameters(max_batch_size=8, allowed_batch_sizes=(2, 8)).padded_size(3) == 8


@pytest.mark.parametrize(
    "changes, error, words",
    [
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be positive; received 0"),
        ({"max_enqueued_batches": -1}, ValueError, "max_enqueued_batches must be positive"),
        ({"num_batch_threads": 0}, ValueError, "num_batch_threads must be positive"),
        ({"batch_timeout_micros": -5}, ValueError, "batch_timeout_micros must be non-negative"),
        ({"max_batch_size": 2.5}, TypeError, "max_batch_size must be an int"),
        ({"max_batch_size": True}, TypeError, "max_batch_size must be an int"),
        ({"max_batch_size": 8, "allowed_batch_sizes": (4, 2, 8)}, ValueError, "monotonically increasing"),
        ({"max_batch_size": 8, "allowed_batch_sizes": (2, 4)}, ValueError, "must equal max_batch_size (8)"),
        ({"max_batch_size": 8, "allowed_batch_sizes": (0, 8)}, ValueError, "allowed_batch_sizes[0] must be positive"),
        ({"allowed_batch_sizes": 8}, TypeError, "allowed_batch_sizes must be a tuple"),
        ({"pad_variable_length_inputs": True}, ValueError, "pad_variable_length_inputs=True is not supported"),
    ],
)
def test_bad_parameters_are_refused_with_the_reason(changes, error, words):
    with pytest.raises(error) as caught:
        BatchingParameters(**changes)
    assert words in str(caught.value)


def test_parameters_from_parsed_fields(caplog):
    with caplog.at_level(logging.WARNING):
        parsed = BatchingParameters.from_fields(
            {
                "max_batch_size": {"value": 128},
                "batch_timeout_micros": {"value": 0},
                "max_enqueued_batches": 1000000,
                "num_batch_threads": {"value": 8},
                "allowed_batch_sizes": 128,
                "thread_pool_name": {"value": "pool"},
                "enable_large_batch_splitting": {"value": False},
            },
            source="batching.config",
        )
    assert parsed == BatchingParameters(
        max_batch_size=128,
        batch_timeout_micros=0,
        max_enqueued_batches=1000000,
        num_batch_threads=8,
        allowed_batch_sizes=(128,),
    )
    assert "batching.config" in caplog.text and "thread_pool_name" in caplog.text
    with pytest.raises(ValueError, match=r"batching.config: unknown batching fields \['max_batchsize'\]"):
        BatchingParameters.from_fields({"max_batchsize": 4}, source="batching.config")
    with pytest.raises(ValueError, match="batching.config: max_batch_size must be positive"):
        BatchingParameters.from_fields({"max_batch_size": {"value": 0}}, source="batching.config")
    with pytest.raises(TypeError, match="mapping"):
        BatchingParameters.from_fields([("max_batch_size", 4)])


def test_scheduler_refuses_what_is_not_parameters():
    with pytest.raises(TypeError, match="BatchingParameters"):
        BatchScheduler({"max_batch_size": 4})
    with pytest.raises(TypeError, match="on_batch"):
        BatchScheduler(BatchingParameters(num_batch_threads=1), on_batch=3)


# -- results back to the event loop ----------------------------------------------------------


def test_a_batch_of_results_wakes_the_event_loop_once_and_settles_every_request():
    """The batching p99 fault: one loop wake-up per request made the batch thread wait for the GIL each time."""
    import asyncio

    from torchestimator.serving.completions import LoopCompletions

    loop = asyncio.new_event_loop()
    try:
        wakeups = []
        real_call_soon_threadsafe = loop.call_soon_threadsafe

        def counting(callback, *arguments, **keywords):
            wakeups.append(callback)
            return real_call_soon_threadsafe(callback, *arguments, **keywords)

        loop.call_soon_threadsafe = counting
        completions = LoopCompletions(loop)
        sources = [concurrent.futures.Future() for _ in range(32)]
        targets = [
            completions.wrap(source, translate=lambda error: ServingError("INVALID_ARGUMENT", str(error)))
            for source in sources
        ]

        def batch_thread():  # finishes the whole batch while the loop is busy elsewhere (not running here)
            for index, source in enumerate(sources):
                if index == 5:
                    source.set_exception(ValueError("row 5 refused"))
                elif source.set_running_or_notify_cancel():
                    source.set_result({"row": index})

        targets[7].cancel()  # a request that timed out: its source is cancelled, the batch thread skips it
        for _ in range(3):  # the loop runs the cancellation's callbacks (one wake-up for it, counted apart)
            loop.run_until_complete(asyncio.sleep(0))
        wakeups.clear()
        before = completions.wakeups
        thread = threading.Thread(target=batch_thread)
        thread.start()
        thread.join(WAIT)
        assert sources[7].cancelled()
        results = loop.run_until_complete(asyncio.wait_for(asyncio.gather(*targets, return_exceptions=True), WAIT))
    finally:
        loop.close()
    assert len(wakeups) == 1 and completions.wakeups == before + 1  # asyncio.wrap_future: 31 wake-ups
    assert isinstance(results[5], ServingError) and results[5].message == "row 5 refused"
    assert isinstance(results[7], asyncio.CancelledError)
    assert [result["row"] for index, result in enumerate(results) if index not in (5, 7)] == [
        index for index in range(32) if index not in (5, 7)
    ]


def test_completions_after_the_loop_closed_are_dropped_quietly():
    import asyncio

    from torchestimator.serving.completions import LoopCompletions

    loop = asyncio.new_event_loop()
    completions = LoopCompletions(loop)
    source = concurrent.futures.Future()
    completions.wrap(source)
    loop.close()
    source.set_result({"late": 1})  # the server stopped: no error in the batch thread
    assert source.done()
