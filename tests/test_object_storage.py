"""Checkpoints in an object store (checkpoint/object_storage.py and the store's commit without rename), against
real protocol servers: moto's S3 server and the GCS emulator (tests/object_stores.py), and memory://."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

import pytest
import torch

from torchestimator._io import filesystems
from torchestimator._io.atomic import writer_tag
from torchestimator.checkpoint import CheckpointStore
from torchestimator.checkpoint.object_storage import ObjectStorage
from torchestimator.errors import CheckpointError


def _weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4, 3), value), "b": torch.arange(3, dtype=torch.float64) * value}


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def test_saves_restore_bit_exact_and_retention_keeps_the_newest(store_url):
    store = CheckpointStore(store_url, keep_checkpoint_max=2)
    for step in (10, 20, 30):
        path = store.save(step, _weights(step / 7), {"m": torch.ones(2) * step}, {"position": step})
        assert path.startswith(store_url + f"/ckpt-{step}.")
    assert [int(p.rsplit("ckpt-", 1)[1].split(".")[0]) for p in store.all_checkpoints()] == [20, 30]
    assert len(store.storage.list_folders()) == 2  # the oldest is gone, objects and all
    restored = CheckpointStore(store_url).restore()
    assert restored.step == 30 and restored.extra["position"] == 30
    for name, tensor in _weights(30 / 7).items():
        assert torch.equal(restored.model_state[name], tensor) and restored.model_state[name].dtype == tensor.dtype
    assert torch.equal(restored.optimizer_state["m"], torch.ones(2) * 30)
    by_path = CheckpointStore(store_url).restore(store.all_checkpoints()[0])
    assert by_path.step == 20 and torch.equal(by_path.model_state["w"], _weights(20 / 7)["w"])


def test_saving_a_step_again_replaces_it_under_a_new_prefix(store_url):
    store = CheckpointStore(store_url)
    first = store.save(5, _weights(1.0))
    second = store.save(5, _weights(2.0))
    assert first != second and store.latest_checkpoint() == second
    assert store.storage.list_folders() == [second.rsplit("/", 1)[1]]
    assert torch.equal(CheckpointStore(store_url).restore().model_state["w"], _weights(2.0)["w"])


def _saved_once_and_a_dead_writers_prefix(store_url: str, files: dict[str, bytes]) -> tuple[CheckpointStore, str]:
    """A store that saved step 1, and a save prefix of step 2 holding ``files``, from a process that is gone."""
    store = CheckpointStore(store_url)
    store.save(1, _weights(1.0))
    host = writer_tag().split("-h", 1)[1]
    dead = f"ckpt-2.{_dead_pid()}-h{host}-abcdef"
    for name, data in files.items():
        store.storage.write_file(dead, name, data)
    return store, dead


def test_a_prefix_without_state_json_is_never_listed_and_goes_when_its_writer_is_gone(store_url):
    store, dead = _saved_once_and_a_dead_writers_prefix(store_url, {"model.safetensors": b"half of a checkpoint"})
    storage = ObjectStorage(store_url)
    alive = f"ckpt-3.{writer_tag()}-fedcba"  # this very process: a save in progress on this machine
    other_machine = "ckpt-4.77-h00000000-123456"  # another host, just written: maybe still uploading
    storage.write_file(alive, "model.safetensors", b"being written")
    storage.write_file(other_machine, "model.safetensors", b"being written elsewhere")
    reader = CheckpointStore(store_url)
    assert reader.latest_checkpoint().rsplit("/", 1)[1].startswith("ckpt-1.")
    assert reader.restore().step == 1
    store.save(6, _weights(6.0))  # a save clears the leftovers it sees
    folders = storage.list_folders()
    assert dead not in folders and other_machine in folders
    assert [f for f in folders if f.startswith("ckpt-6.")]


def test_a_dead_writers_prefix_with_a_damaged_state_json_goes_at_the_next_save(store_url, caplog):
    # A killed client's last PUT cut short: a state.json that is not JSON, under a prefix the manifest never listed,
    # appearing after this store's start-up clean-up. It is never listed, and the next save clears it.
    store, dead = _saved_once_and_a_dead_writers_prefix(
        store_url, {"model.safetensors": b"a whole file", "state.json": b'{"format": 2, "st'}
    )
    storage = ObjectStorage(store_url)
    assert CheckpointStore(store_url).restore().step == 1
    store.save(3, _weights(3.0))
    assert dead not in storage.list_folders()
    assert [path.rsplit("/", 1)[1].split(".")[0] for path in store.all_checkpoints()] == ["ckpt-1", "ckpt-3"]


def test_a_checkpoint_sealed_before_the_manifest_was_written_is_found(store_url):
    store = CheckpointStore(store_url)
    store.save(1, _weights(1.0))
    manifest = store.storage.read_manifest()
    store.save(2, _weights(2.0))
    store.storage.replace_manifest(manifest)  # as if killed between state.json and the manifest
    assert CheckpointStore(store_url).restore().step == 2


def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(store_url, caplog):
    store = CheckpointStore(store_url)
    store.save(1, _weights(1.0))
    newest = store.save(2, _weights(2.0)).rsplit("/", 1)[1]
    store.storage.write_file(newest, "model.safetensors", b"\0" * 64)
    restored = CheckpointStore(store_url).restore()
    assert restored.step == 1 and torch.equal(restored.model_state["w"], _weights(1.0)["w"])
    assert newest in caplog.text


def test_a_missing_bucket_is_one_error_naming_the_url(s3_bucket):
    url = s3_bucket + "-missing/run"
    with pytest.raises(OSError, match=r"s3://te-[0-9a-f]+-missing/run.*no such object or bucket"):
        CheckpointStore(url).save(1, _weights(1.0))
    assert CheckpointStore(url).latest_checkpoint() is None  # reading: nothing there


def test_a_sharded_save_to_a_store_stages_on_local_disk_under_a_fresh_prefix_name(store_url):
    store = CheckpointStore(store_url)
    first, second = store.begin_sharded_save(1), store.begin_sharded_save(1)
    assert os.path.isdir(first) and os.listdir(first) == [] and first != second
    assert os.path.basename(first).startswith("ckpt-1.") and not filesystems.is_url(first)
    store.discard_staging(first)
    store.discard_staging(second)
    assert not os.path.exists(first) and store.latest_checkpoint() is None


def test_urls_paths_and_unknown_schemes():
    assert filesystems.protocol_of("/a/b") is None and filesystems.protocol_of("file:///a/b") is None
    assert filesystems.local_path("file:///a/b") == "/a/b"
    assert filesystems.protocol_of("S3://b/k") == "s3" and filesystems.is_url("abfs://c/p")
    assert filesystems.join("gs://b/run", "eval", "x") == "gs://b/run/eval/x"
    with pytest.raises(ValueError, match=r"hdfs://.*not hdfs://|not hdfs://"):
        filesystems.protocol_of("hdfs://namenode/x")


def test_storage_options_per_scheme_or_for_all_and_never_mixed():
    try:
        filesystems.configure_storage_options({"s3": {"key": "k"}, "gcs": {"token": "anon"}})
        assert filesystems.storage_options_for("s3a") == {"key": "k"}
        assert filesystems.storage_options_for("gs") == {"token": "anon"}
        with pytest.raises(ValueError, match="mixes URL schemes"):
            filesystems.configure_storage_options({"s3": {}, "endpoint_url": "x"})
    finally:
        filesystems.configure_storage_options(None)


def test_a_first_save_cut_short_is_no_checkpoint_and_training_starts_over(store_url):
    storage = ObjectStorage(store_url)
    host = writer_tag().split("-h", 1)[1]
    storage.write_file(f"ckpt-1.{_dead_pid()}-h{host}-0a0b0c", "model.safetensors", b"the first save, cut short")
    store = CheckpointStore(store_url)
    assert not store.has_checkpoints() and store.latest_checkpoint() is None
    store.save(1, _weights(1.0))
    assert store.has_checkpoints() and len(storage.list_folders()) == 1


def _save_from_another_process(url: str, step: int) -> subprocess.Popen:
    """A second run: saves ``step`` into ``url`` and stays alive until its stdin closes."""
    code = (
        "import sys, torch; from torchestimator.checkpoint import CheckpointStore; "
        f"CheckpointStore({url!r}).save({step}, {{'w': torch.zeros(2)}}); print('saved', flush=True); "
        "sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "saved"
    return child


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_second_live_run_writing_the_model_dir_is_refused_at_the_next_save(where, tmp_path, request):
    url = str(tmp_path / "run") if where == "local" else request.getfixturevalue("s3_bucket") + "/run"
    store = CheckpointStore(url)
    store.save(1, _weights(1.0))
    other = _save_from_another_process(url, 2)
    try:
        with pytest.raises(CheckpointError, match=rf"Two runs are writing .*process {other.pid}-h"):
            store.save(3, _weights(3.0))
    finally:
        other.stdin.close()
        other.wait(timeout=60)
    store.save(4, _weights(4.0))  # the other run is gone: this one takes over again
    assert CheckpointStore(url).restore().step == 4


def _read_in_forked_child(url: str, queue) -> None:
    queue.put(filesystems.read_bytes(url))


def test_a_forked_child_reads_the_store_with_its_own_client(s3_bucket):
    import multiprocessing

    filesystems.write_bytes(f"{s3_bucket}/a", b"before the fork")
    assert filesystems.read_bytes(f"{s3_bucket}/a") == b"before the fork"  # the parent's client exists now
    context = multiprocessing.get_context("fork")  # as DataLoader workers start
    queue = context.Queue()
    child = context.Process(target=_read_in_forked_child, args=(f"{s3_bucket}/a", queue))
    child.start()
    try:
        assert queue.get(timeout=60) == b"before the fork"
    finally:
        child.join(60)
    assert child.exitcode == 0


def test_globs_give_urls_as_written(store_url):
    for name in ("a-1.tfrecord", "a-2.tfrecord", "b-1.tfrecord"):
        filesystems.write_bytes(f"{store_url}/data/{name}", b"x")
    assert filesystems.glob(f"{store_url}/data/a-*.tfrecord") == [
        f"{store_url}/data/a-1.tfrecord",
        f"{store_url}/data/a-2.tfrecord",
    ]


class _UploadsSideBySide(ObjectStorage):
    """An ObjectStorage whose uploads of checkpoint files wait for one another: a save that sends them one after
    the other never gets past the first (the barrier breaks). ``fail`` names a file whose upload then fails."""

    def __init__(self, url: str, uploads: int, fail: str | None = None) -> None:
        super().__init__(url)
        self._together = threading.Barrier(uploads, timeout=60)
        self._fail = fail

    def write_file(self, folder, filename, data):
        if filename != "state.json":
            self._together.wait()  # every big file's upload has started before any goes on
            if filename == self._fail:
                raise OSError(errno.ECONNRESET, "Connection reset by peer", f"{self.location(folder)}/{filename}")
        super().write_file(folder, filename, data)


def test_the_files_of_one_save_upload_side_by_side(store_url):
    storage = _UploadsSideBySide(store_url, uploads=3)  # model, optimizer tensors, optimizer tree
    store = CheckpointStore(storage)
    store.save(3, _weights(3.0), {"m": torch.ones(2) * 3})
    restored = CheckpointStore(store_url).restore()
    assert restored.step == 3 and torch.equal(restored.model_state["w"], _weights(3.0)["w"])
    assert torch.equal(restored.optimizer_state["m"], torch.ones(2) * 3)


def test_one_failed_upload_of_a_save_names_its_file_commits_nothing_and_leaves_no_object(store_url):
    CheckpointStore(store_url).save(1, _weights(1.0))
    storage = _UploadsSideBySide(store_url, uploads=3, fail="optimizer.safetensors")
    with pytest.raises(OSError, match="optimizer.safetensors"):
        CheckpointStore(storage).save(2, _weights(2.0), {"m": torch.ones(2)})
    after = CheckpointStore(store_url)
    assert [path.rsplit("/", 1)[1].split(".")[0] for path in after.all_checkpoints()] == ["ckpt-1"]
    assert after.restore().step == 1
    # The others' uploads ended before the prefix was cleared: nothing of the failed save is left.
    assert len(ObjectStorage(store_url).list_folders()) == 1
