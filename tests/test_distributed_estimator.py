"""The Estimator under MirroredStrategy: 2 gloo processes on CPU, as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import class_model_fn, sum_sign_data

import torchestimator as te
from torchestimator.testing import run_in_processes

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _estimator(model_dir, strategy=None, warm_start_from=None):
    torch.manual_seed(0)
    config = te.RunConfig(
        train_distribute=strategy,
        save_checkpoints_steps=4,
        save_summary_steps=4,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
    )
    return te.Estimator(
        model_fn=class_model_fn,
        model=lambda: nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9),
        model_dir=model_dir,
        config=config,
        warm_start_from=warm_start_from,
    )


def _train_input_fn(input_context=None):
    x, y = sum_sign_data()
    return te.numpy_input_fn({"x": x}, y, batch_size=32, num_epochs=None, shuffle=True, seed=5)(
        input_context=input_context
    )


def _eval_input_fn(input_context=None):
    x, y = sum_sign_data()
    # 193 = 3 x 64 + 1: the last global batch leaves the second replica an empty share.
    return te.numpy_input_fn({"x": x[:193]}, y[:193], batch_size=64, shuffle=False)(input_context=input_context)


def _predict_input_fn(input_context=None):
    x, _ = sum_sign_data()
    return te.numpy_input_fn({"x": x[:10]}, batch_size=4, shuffle=False)(input_context=input_context)


def _train_two_replicas(model_dir, max_steps):
    estimator = _estimator(model_dir, te.MirroredStrategy(num_replicas=2))
    estimator.train(_train_input_fn, max_steps=max_steps)
    results = estimator.evaluate(_eval_input_fn)
    weights = {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}
    files = sorted(os.listdir(model_dir))
    predictions = [row["class"] for row in estimator.predict(_predict_input_fn)]
    assert len(predictions) == 10  # predict runs whole in every process
    return results, weights, files


def _single_replica(model_dir, max_steps):
    estimator = _estimator(model_dir)
    estimator.train(_train_input_fn, max_steps=max_steps)
    return estimator.evaluate(_eval_input_fn), {
        n: estimator.get_variable_value(n) for n in estimator.get_variable_names()
    }


def test_two_replicas_match_one_replica_with_twice_the_batch(tmp_path):
    per_rank = run_in_processes(_train_two_replicas, nprocs=2, args=(str(tmp_path / "two"), 12), timeout=180)
    single_results, single_weights = _single_replica(str(tmp_path / "one"), 12)
    (results_0, weights_0, files), (results_1, weights_1, _) = per_rank
    for name in single_weights:
        np.testing.assert_allclose(weights_0[name], single_weights[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(weights_0[name], weights_1[name])
    # Evaluation is sharded across the replicas and reduced: both see the full-data metrics.
    assert results_0 == results_1
    assert results_0["accuracy"] == pytest.approx(single_results["accuracy"], abs=1e-6)
    assert results_0["loss"] == pytest.approx(single_results["loss"], rel=1e-4)
    assert results_0["global_step"] == 12
    assert len([f for f in files if f.startswith("events.out.tfevents")]) == 1  # only the chief writes
    # TensorBoard's loss is the mean over both replicas' shards, which is the loss of the whole global batch.
    from torchestimator._io.summary import read_scalars

    two_losses, one_losses = read_scalars(str(tmp_path / "two"))["loss"], read_scalars(str(tmp_path / "one"))["loss"]
    assert [step for step, _ in two_losses] == [step for step, _ in one_losses] == [4, 8, 12]
    np.testing.assert_allclose([value for _, value in two_losses], [value for _, value in one_losses], rtol=1e-5)


def test_resume_under_two_replicas(tmp_path):
    straight = run_in_processes(_train_two_replicas, nprocs=2, args=(str(tmp_path / "straight"), 12), timeout=180)
    run_in_processes(_train_two_replicas, nprocs=2, args=(str(tmp_path / "resumed"), 8), timeout=180)
    resumed = run_in_processes(_train_two_replicas, nprocs=2, args=(str(tmp_path / "resumed"), 12), timeout=180)
    for name, value in straight[0][1].items():
        np.testing.assert_array_equal(resumed[0][1][name], value)
    assert "ckpt-12" in resumed[0][2] and "ckpt-8" in resumed[0][2]


SCRIPT = textwrap.dedent("""
    import sys, numpy as np, torch, torch.nn as nn, torch.nn.functional as F
    import torchestimator as te

    def model_fn(model, features, labels, mode):
        logits = model(features["x"])
        return te.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)}, loss=F.cross_entropy(logits, labels))

    def input_fn(input_context):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(64, 4)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        return te.numpy_input_fn({"x": x}, y, batch_size=16, num_epochs=None, shuffle=True)(input_context=input_context)

    config = te.RunConfig(train_distribute=te.MirroredStrategy(num_replicas=2), save_checkpoints_steps=5,
                          log_step_count_steps=None, progress_bar=False)
    estimator = te.Estimator(model_fn=model_fn, model=lambda: nn.Linear(4, 2),
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1), model_dir=sys.argv[1], config=config)
    estimator.train(input_fn, max_steps=10)
    strategy = config.train_distribute
    print(f"replica {strategy.replica_id} of {strategy.num_replicas} done at {estimator.latest_checkpoint()}", flush=True)
""")


def test_plain_script_with_mirrored_strategy_launches_its_replicas(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    model_dir = tmp_path / "run"
    # TORCHESTIMATOR_REPLICA_STDOUT=all: replica 1's prints show too (by default only the chief's do).
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHESTIMATOR_REPLICA_STDOUT": "all"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(script), str(model_dir)], capture_output=True, text=True, timeout=180, env=environment
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "replica 0 of 2 done" in done.stdout and "replica 1 of 2 done" in done.stdout
    assert (model_dir / "ckpt-10").is_dir()


def _write_tfrecords(folder):
    from torchestimator.data import TFRecordWriter, encode_example

    x, y = sum_sign_data()
    os.makedirs(folder, exist_ok=True)
    for shard in range(3):  # 3 files for 2 replicas: sharded by record, each replica its own position
        with TFRecordWriter(os.path.join(folder, f"train-{shard:05d}-of-00003.tfrecord")) as writer:
            for row in range(shard, len(y), 3):
                writer.write(encode_example({"x": x[row], "y": [int(y[row])]}))


def _tfrecord_input_fn(input_context=None, params=None):
    from torchestimator.data import FixedLenFeature, TFRecordDataset, parse_example, to_torch

    spec = {"x": FixedLenFeature([6], "float32"), "y": FixedLenFeature([], "int64")}

    def collate(records):
        parsed = to_torch(parse_example(records, spec))
        return {"x": parsed["x"]}, parsed["y"]

    return TFRecordDataset(
        os.path.join(params["folder"], "train-*.tfrecord"),
        input_context=input_context,
        batch_size=16,
        collate_fn=collate,
        num_epochs=None,
        shuffle_buffer_size=32,
        seed=3,
    )


def _train_tfrecord_two_replicas(model_dir, folder, max_steps):
    estimator = _estimator(model_dir, te.MirroredStrategy(num_replicas=2))
    estimator._params = {"folder": folder}
    estimator.train(_tfrecord_input_fn, max_steps=max_steps)
    return {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def test_tfrecord_input_resumes_exactly_under_two_replicas(tmp_path):
    folder = str(tmp_path / "records")
    _write_tfrecords(folder)
    straight = run_in_processes(
        _train_tfrecord_two_replicas, nprocs=2, args=(str(tmp_path / "straight"), folder, 10), timeout=180
    )
    run_in_processes(_train_tfrecord_two_replicas, nprocs=2, args=(str(tmp_path / "resumed"), folder, 6), timeout=180)
    resumed = run_in_processes(
        _train_tfrecord_two_replicas, nprocs=2, args=(str(tmp_path / "resumed"), folder, 10), timeout=180
    )
    for name, value in straight[0].items():
        np.testing.assert_array_equal(resumed[0][name], value)


def _warm_start_two_replicas(model_dir, source_dir):
    from torchestimator.warm_start import WarmStartSettings

    estimator = _estimator(
        model_dir,
        te.MirroredStrategy(num_replicas=2),
        warm_start_from=WarmStartSettings(source_dir, vars_to_warm_start=[".*"]),
    )
    results = estimator.evaluate(_eval_input_fn)  # no checkpoint yet: the warm-start source is evaluated
    estimator.train(_train_input_fn, max_steps=2)
    return results, {name: estimator.get_variable_value(name) for name in estimator.get_variable_names()}


def test_warm_start_under_two_replicas(tmp_path):
    source = _estimator(str(tmp_path / "source"))
    source.train(_train_input_fn, max_steps=6)
    expected = source.evaluate(_eval_input_fn)
    (results_0, weights_0), (results_1, weights_1) = run_in_processes(
        _warm_start_two_replicas, nprocs=2, args=(str(tmp_path / "warm"), str(tmp_path / "source")), timeout=180
    )
    assert results_0["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6) == results_1["accuracy"]
    assert results_0["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    for name in weights_0:
        np.testing.assert_array_equal(weights_0[name], weights_1[name])


def _bn_estimator(model_dir, strategy=None):
    torch.manual_seed(0)
    config = te.RunConfig(
        train_distribute=strategy,
        save_checkpoints_steps=4,
        log_step_count_steps=None,
        progress_bar=False,
        random_seed=0,
    )
    return te.Estimator(
        model_fn=class_model_fn,
        model=lambda: nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 2)),
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9),
        model_dir=model_dir,
        config=config,
    )


def _train_and_evaluate_two_replicas_with_batch_norm(model_dir):
    from torchestimator.export import FinalExporter, LatestExporter, TensorSpec, serving_input_receiver

    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, 6), dtype=torch.float32)})
    estimator = _bn_estimator(model_dir, te.MirroredStrategy(num_replicas=2))
    results, exports = te.train_and_evaluate(
        estimator,
        te.TrainSpec(_train_input_fn, max_steps=12),
        te.EvalSpec(
            _eval_input_fn,
            steps=None,
            every_n_steps=8,
            exporters=[LatestExporter("latest", receiver), FinalExporter("final", receiver)],
        ),
    )
    return results, exports


def test_train_and_evaluate_under_two_replicas_evaluates_the_checkpoint_and_exports_once(tmp_path):
    model_dir = str(tmp_path / "two")
    (results_0, exports_0), (results_1, exports_1) = run_in_processes(
        _train_and_evaluate_two_replicas_with_batch_norm, nprocs=2, args=(model_dir,), timeout=300
    )
    assert results_0 == results_1 and exports_0 == exports_1
    # The evaluation inside the loop saw the chief's BatchNorm statistics: those of the checkpoint.
    alone = _bn_estimator(model_dir).evaluate(_eval_input_fn, checkpoint_path=os.path.join(model_dir, "ckpt-12"))
    assert results_0["accuracy"] == pytest.approx(alone["accuracy"], abs=1e-6)
    assert results_0["loss"] == pytest.approx(alone["loss"], rel=1e-5)
    # Only the chief exports: one version per evaluation (steps 8 and 12) and one final one.
    latest = te.export.list_versions(os.path.join(model_dir, "export", "latest"))
    assert len(latest) == 2 and len(te.export.list_versions(os.path.join(model_dir, "export", "final"))) == 1
    x = sum_sign_data()[0][:16]
    expected = next(
        _bn_estimator(model_dir).predict(lambda: [({"x": torch.from_numpy(x)}, None)], yield_single_examples=False)
    )
    exported = te.export.load(os.path.join(model_dir, "export", "final"))
    np.testing.assert_array_equal(exported({"x": x})["class"], expected["class"])
