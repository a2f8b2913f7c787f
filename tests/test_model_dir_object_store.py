"""An Estimator whose model_dir is a URL (s3:// on moto's S3 server, gs:// on the GCS emulator, memory://):
training, resume, evaluation, summaries, the run's settings and the write probe, as on a local disk."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from helpers import input_fns, make_estimator

import torchestimator as te
from torchestimator._io import filesystems
from torchestimator._io.summary import SummaryWriter, read_scalars


def _final_weights(estimator: te.Estimator) -> dict[str, torch.Tensor]:
    return estimator.checkpoint_store.restore(load_optimizer=False).model_state


def test_training_resumed_from_a_store_ends_bit_exact_as_an_uninterrupted_local_run(store_url, tmp_path):
    train_fn, eval_fn, _, _ = input_fns()
    reference = make_estimator(tmp_path / "local", save_checkpoints_steps=5)
    reference.train(train_fn, max_steps=15)
    make_estimator(store_url, save_checkpoints_steps=5, save_summary_steps=5).train(train_fn, max_steps=10)
    resumed = make_estimator(
        store_url, save_checkpoints_steps=5, save_summary_steps=5
    )  # a new process would build it the same way
    resumed.train(train_fn, max_steps=15)
    assert resumed.latest_checkpoint().startswith(store_url + "/ckpt-15.")
    expected, got = _final_weights(reference), _final_weights(resumed)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)
    names = filesystems.listdir(store_url)
    assert {"checkpoint", "params.json", "run_config.json"} <= set(names)
    assert not [name for name in names if "probe" in name or name.startswith(".")]
    results = resumed.evaluate(eval_fn, steps=2)
    assert results["global_step"] == 15
    assert read_scalars(resumed.eval_dir())["accuracy"] == [(15, pytest.approx(results["accuracy"]))]
    assert [step for step, _ in read_scalars(store_url)["loss"]] == [5, 10, 15]  # both runs' event files


@pytest.mark.parametrize("ending", [b"\r", b"\n", b"\r\n", b"\x00"])
def test_an_object_ending_in_line_end_bytes_comes_back_byte_for_byte(store_url, ending):
    # Every store keeps every byte. The GCS emulator's own multipart parser dropped a last \r (1 random upload in
    # 256: an event file's CRC, a checkpoint's last byte); tests/object_stores.py parses those bodies exactly.
    data = bytes(range(256)) + ending
    filesystems.write_bytes(f"{store_url}/blob", data)
    assert filesystems.read_bytes(f"{store_url}/blob") == data


def test_summaries_upload_whole_files_at_flush_and_close(store_url):
    writer = SummaryWriter(store_url + "/logs")
    writer.scalar("loss", 0.5, step=1)
    writer.flush()
    assert read_scalars(store_url + "/logs") == {"loss": [(1, 0.5)]}
    writer.scalar("loss", 0.25, step=2)
    writer.close()
    assert read_scalars(store_url + "/logs") == {"loss": [(1, 0.5), (2, 0.25)]}
    assert writer._mirror is None  # the local copy is gone


def test_storage_options_reach_the_filesystem_and_stay_out_of_run_config(s3_bucket, s3_endpoint, monkeypatch):
    # The endpoint and keys only through RunConfig: the environment has none.
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    options = {"s3": {"endpoint_url": s3_endpoint, "key": "testing", "secret": "a-secret-value"}}
    try:
        train_fn, _, _, _ = input_fns()
        estimator = make_estimator(f"{s3_bucket}/run", storage_options=options, save_checkpoints_steps=3)
        estimator.train(train_fn, max_steps=3)
        saved = filesystems.read_bytes(f"{s3_bucket}/run/run_config.json").decode()
        assert "a-secret-value" not in saved and "testing" not in saved
        assert json.loads(saved)["storage_options"] == {
            "s3": {"endpoint_url": "<hidden>", "key": "<hidden>", "secret": "<hidden>"}
        }
        assert estimator.latest_checkpoint().startswith(f"{s3_bucket}/run/ckpt-3.")
    finally:
        filesystems.configure_storage_options(None)


def test_a_missing_bucket_stops_training_before_step_one_naming_the_url(s3_bucket):
    train_fn, _, _, _ = input_fns()
    url = s3_bucket + "-absent/run"
    with pytest.raises(OSError, match=rf"model_dir {url} cannot be written.*Check that the bucket exists"):
        make_estimator(url).train(train_fn, max_steps=2)


def test_a_url_with_an_unknown_scheme_is_refused_not_made_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train_fn, _, _, _ = input_fns()
    with pytest.raises(ValueError, match="not hdfs://"):
        make_estimator("hdfs://namenode/run").train(train_fn, max_steps=1)
    assert os.listdir(tmp_path) == []


def test_file_urls_are_local_paths(tmp_path):
    train_fn, _, _, _ = input_fns()
    estimator = make_estimator(f"file://{tmp_path}/run", save_checkpoints_steps=2)
    estimator.train(train_fn, max_steps=2)
    assert estimator.latest_checkpoint() == str(tmp_path / "run" / "ckpt-2")


def _replicas_train_in_a_store(url: str, local: str) -> dict:
    """In each of 2 replicas: an uninterrupted local run to step 9, and a run in the store stopped at 6 and resumed."""
    from helpers import SmallNet, adam, classifier_model_fn

    strategy = te.MirroredStrategy()

    def estimator(model_dir):
        config = te.RunConfig(
            train_distribute=strategy,
            save_checkpoints_steps=3,
            log_step_count_steps=None,
            save_summary_steps=None,
            progress_bar=False,
            random_seed=0,
        )
        return te.Estimator(
            model_fn=classifier_model_fn, model=SmallNet, optimizer=adam, model_dir=model_dir, config=config
        )

    train_fn, _, _, _ = input_fns()
    reference = estimator(local)
    reference.train(train_fn, max_steps=9)
    estimator(url).train(train_fn, max_steps=6)
    resumed = estimator(url)
    resumed.train(train_fn, max_steps=9)
    return {
        "reference": {k: v.clone() for k, v in reference.checkpoint_store.restore().model_state.items()},
        "resumed": {k: v.clone() for k, v in resumed.checkpoint_store.restore().model_state.items()},
        "latest": resumed.latest_checkpoint(),
    }


@pytest.mark.slow
@pytest.mark.distributed
def test_replicas_share_an_s3_model_dir_and_resume_bit_exact(s3_bucket, tmp_path):
    from torchestimator.testing import run_in_processes

    url = f"{s3_bucket}/run"
    per_rank = run_in_processes(_replicas_train_in_a_store, nprocs=2, args=(url, str(tmp_path / "local")), timeout=240)
    for result in per_rank:
        assert result["latest"].startswith(url + "/ckpt-9.")
        assert all(torch.equal(result["reference"][name], result["resumed"][name]) for name in result["reference"])
    # One process reads the 2-replica checkpoint back from the store (DCP resharded 2 -> 1, every file checked).
    single = te.checkpoint.CheckpointStore(url).restore()
    assert single.sharded and single.step == 9
    assert all(torch.equal(single.model_state[name], per_rank[0]["resumed"][name]) for name in single.model_state)
    names = filesystems.listdir(url)
    assert not [name for name in names if "probe" in name]
    assert len([name for name in names if name.startswith("ckpt-")]) == 3  # keep_checkpoint_max's... of 5: 3, 6, 9


def test_train_and_evaluate_keeps_and_exports_the_best_in_a_store(store_url):
    from torchestimator.export import BestExporter, TensorSpec, serving_input_receiver

    train_fn, eval_fn, _, (x, _) = input_fns()
    receiver = serving_input_receiver({"x": TensorSpec(shape=(None, x.shape[1]), dtype=torch.float32)})
    estimator = make_estimator(store_url, save_checkpoints_steps=4, keep_checkpoint_max=1)
    stop = te.stop_if_no_decrease_hook(estimator, "loss", max_steps_without_decrease=1000)
    results, exports = te.train_and_evaluate(
        estimator,
        te.TrainSpec(train_fn, max_steps=12),
        te.EvalSpec(eval_fn, steps=2, every_n_steps=4, exporters=[BestExporter("best", receiver)]),
        early_stopping=[stop],
        best=te.BestCheckpointPolicy("loss"),
    )
    assert results["global_step"] == 12
    history = read_scalars(estimator.eval_dir())["loss"]
    assert [step for step, _ in history] == [4, 8, 12]
    best_step = min(history, key=lambda item: item[1])[0]
    # keep_checkpoint_max=1, but the best checkpoint is protected: it is still listed and restores.
    listed = {
        int(path.rsplit("ckpt-", 1)[1].split(".")[0]): path for path in estimator.checkpoint_store.all_checkpoints()
    }
    assert best_step in listed and 12 in listed
    assert estimator.checkpoint_store.restore(listed[best_step]).step == best_step
    from torchestimator._policy.best import read_best

    best = read_best(store_url)
    assert best[0].step == best_step and best[0].path == listed[best_step]
    versions = te.export.list_versions(filesystems.join(store_url, "export", "best"))
    assert versions, exports
    exported = te.export.load(filesystems.join(store_url, "export", "best"))  # the newest complete version
    assert exported({"x": x[:4]})["class"].shape == (4,)


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _upload_folder(local: str, url: str) -> None:
    for name in os.listdir(local):
        with open(os.path.join(local, name), "rb") as handle:
            filesystems.write_bytes(f"{url}/{name}", handle.read())


def test_open_weights_reads_our_checkpoints_in_place_and_other_formats_from_a_copy(store_url, tmp_path):
    from torchestimator.interop import open_weights

    train_fn, _, _, _ = input_fns()
    estimator = make_estimator(store_url, save_checkpoints_steps=3)
    estimator.train(train_fn, max_steps=3)
    trained = _final_weights(estimator)
    for url in (store_url, estimator.latest_checkpoint()):
        with open_weights(url) as source:
            assert source.format == "torchestimator" and source.step == 3
            assert all(np.array_equal(source.read(name), trained[name].numpy()) for name in trained)
    # A TensorFlow model_dir (its `checkpoint` file names the prefix), a prefix, and a Keras file in the store.
    _upload_folder(os.path.join(FIXTURES, "tf_checkpoint", "tf1"), f"{store_url}/tf1")
    local = open_weights(os.path.join(FIXTURES, "tf_checkpoint", "tf1"))
    expected = {info.name: local.read(info.name) for info in local.tensors()}
    for url in (f"{store_url}/tf1", f"{store_url}/tf1/model.ckpt-2"):
        with open_weights(url) as source:
            assert source.format == "tensorflow"
            assert {info.name for info in source.tensors()} == set(expected)
            assert all(np.array_equal(source.read(name), value) for name, value in expected.items())
    keras_file = os.path.join(FIXTURES, "keras", "keras3_model.weights.h5")
    with open(keras_file, "rb") as handle:
        filesystems.write_bytes(f"{store_url}/keras/model.weights.h5", handle.read())
    with open_weights(f"{store_url}/keras/model.weights.h5") as source, open_weights(keras_file) as reference:
        assert source.format.startswith("keras")
        assert [info.name for info in source.tensors()] == [info.name for info in reference.tensors()]
    with pytest.raises(te.interop.WeightSourceError, match=r"no such object"):
        open_weights(f"{store_url}/absent.safetensors")


def test_warm_start_from_a_model_dir_in_a_store(store_url, tmp_path):
    from helpers import SmallNet, classifier_model_fn

    train_fn, _, _, _ = input_fns()
    source = make_estimator(store_url, save_checkpoints_steps=3)
    source.train(train_fn, max_steps=3)
    config = te.RunConfig(save_checkpoints_steps=1, log_step_count_steps=None, progress_bar=False, random_seed=1)
    warm = te.Estimator(
        model_fn=classifier_model_fn,
        model=SmallNet,
        model_dir=str(tmp_path / "warm"),
        config=config,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.0),
        warm_start_from=store_url,
    )
    warm.train(train_fn, max_steps=1)  # lr 0: the weights stay those warm-started from the store
    expected, got = _final_weights(source), _final_weights(warm)
    parameters = [name for name, _ in SmallNet().named_parameters()]  # BatchNorm's running statistics move on
    assert parameters and all(torch.equal(expected[name], got[name]) for name in parameters)


def test_inspect_and_evaluate_take_urls(store_url):
    from torchestimator.cli.inspection import describe

    train_fn, eval_fn, _, _ = input_fns()
    estimator = make_estimator(store_url, save_checkpoints_steps=2)
    estimator.train(train_fn, max_steps=4)
    text = describe(store_url)
    assert text.startswith(f"model_dir {store_url}: 2 checkpoint(s)") and "net.0.weight" in text
    first = estimator.checkpoint_store.all_checkpoints()[0]
    assert describe(first).startswith(f"{first} (torchestimator):")
    assert estimator.evaluate(eval_fn, steps=1, checkpoint_path=first)["global_step"] == 2


def test_async_checkpoints_into_a_store_equal_synchronous_ones(store_url, tmp_path):
    train_fn, _, _, _ = input_fns()
    synchronous = make_estimator(tmp_path / "sync", save_checkpoints_steps=2)
    synchronous.train(train_fn, max_steps=6)
    background = make_estimator(store_url, save_checkpoints_steps=2, async_checkpoint=True)
    background.train(train_fn, max_steps=6)
    assert [path.rsplit("ckpt-", 1)[1].split(".")[0] for path in background.checkpoint_store.all_checkpoints()] == [
        "2",
        "4",
        "6",
    ]
    expected, got = _final_weights(synchronous), _final_weights(background)
    assert all(torch.equal(expected[name], got[name]) for name in expected)


def test_an_evaluator_file_in_a_store_protects_its_step_until_it_is_stale(store_url):
    """A killed evaluator on another machine cannot be checked by pid: its evaluator.json stops protecting its
    step once the object is older than the bound, by the store's own time of writing."""
    import time

    from torchestimator._policy import evaluator_channel as channel

    channel.write_evaluating_step(store_url, 30)
    written = json.loads(filesystems.read_bytes(f"{store_url}/{channel.EVALUATOR_FILE}"))
    elsewhere = {**written, "writer": "4242-hanother-machine"}
    filesystems.write_bytes(f"{store_url}/{channel.EVALUATOR_FILE}", json.dumps(elsewhere).encode())
    assert channel.read_evaluating_step(store_url) == 30
    later = time.time() + channel.EVALUATING_STEP_MAX_AGE_SECS + 60
    assert channel.read_evaluating_step(store_url, now=lambda: later) is None
    earlier = time.time() + channel.EVALUATING_STEP_MAX_AGE_SECS - 600
    assert channel.read_evaluating_step(store_url, now=lambda: earlier) == 30
