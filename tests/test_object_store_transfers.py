"""Transfers to an object store that cannot hang or half-succeed (issue 27, point 3), proven through a fault
proxy of our own (tests/fault_proxy.py) between s3fs and moto's S3 server: throttling, 500s and resets are
retried and the checkpoint restores bit-exact; a stall ends within the deadline the options set, naming the
object, and commits nothing; a big file goes up as a multipart upload, and one that fails midway leaves no
upload open and no checkpoint; a missing bucket, bad credentials and an object deleted under a reader are
each one error naming the URL."""

from __future__ import annotations

import errno
import time

import pytest
import torch

from conftest import input_fns, make_estimator
from fault_proxy import (ACCESS_DENIED_KEY, CUT_BODY, INTERNAL_ERROR, RESET, RESET_MID_BODY, SLOW_DOWN, STALL,
                         STALL_MID_BODY, FaultProxy)
from torchestimator._io import filesystems
from torchestimator.checkpoint import CheckpointStore, object_storage
from torchestimator.checkpoint.object_storage import ObjectStorage

READ_TIMEOUT = 2
FAST_OPTIONS = {"config_kwargs": {"connect_timeout": 2, "read_timeout": READ_TIMEOUT,
                                  "retries": {"total_max_attempts": 3, "mode": "standard"}}, "retries": 2}
"""Tight enough for tests: a stall costs at most 2 * 3 * 2 s, plus botocore's backoff (under 1 + 2 + 4 s)."""
ONE_TRY_EACH = {"config_kwargs": {"connect_timeout": 2, "read_timeout": READ_TIMEOUT,
                                  "retries": {"total_max_attempts": 2, "mode": "standard"}}, "retries": 1}
STALL_DEADLINE = 1 * 2 * READ_TIMEOUT + 3 + 5
"""ONE_TRY_EACH's bound: 2 attempts of the read timeout, botocore's backoff between them, slack for a busy CPU."""


def _weights(value: float, size: int = 1000) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(int(value * 1000))
    return {"w": torch.randn(size, generator=generator), "b": torch.arange(7, dtype=torch.float64) * value}


def _assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.fixture
def proxied(s3_bucket, s3_endpoint):
    """(model_dir URL, proxy): s3fs reaches moto's S3 server only through the fault proxy."""
    with FaultProxy(s3_endpoint) as proxy:
        _use(proxy, FAST_OPTIONS)
        try:
            yield f"{s3_bucket}/run", proxy
        finally:
            proxy.clear()
            proxy.release_stalls()
            filesystems.configure_storage_options(None)


def _use(proxy: FaultProxy, options: dict) -> None:
    filesystems.configure_storage_options({"s3": {**options, "endpoint_url": proxy.url}})


def _is_get(request) -> bool:
    return request.method == "GET" and "list-type" not in request.target and "uploads" not in request.target


def _open_uploads(url: str) -> list:
    fs, _ = filesystems.filesystem(url)
    return fs.list_multipart_uploads(url.split("://", 1)[1].split("/", 1)[0])


# ---------------------------------------------------------------------------- retries


@pytest.mark.parametrize("fault", [SLOW_DOWN, INTERNAL_ERROR, RESET, RESET_MID_BODY])
def test_a_save_and_a_restore_go_through_throttling_errors_and_resets(proxied, fault):
    url, proxy = proxied
    weights = _weights(1.5)
    proxy.inject(fault, times=2, when=lambda request: request.method == "PUT")
    CheckpointStore(url).save(1, weights, {"m": torch.ones(3)}, {"position": 4})
    assert proxy.faults_applied(fault) == 2
    proxy.inject(fault, times=2, when=_is_get)
    restored = CheckpointStore(url).restore()
    assert proxy.faults_applied(fault) == 4
    assert restored.step == 1 and restored.extra["position"] == 4
    _assert_same(restored.model_state, weights)
    assert torch.equal(restored.optimizer_state["m"], torch.ones(3))


def test_a_body_cut_short_is_read_again_and_never_loads_wrong_data(proxied):
    url, proxy = proxied
    weights = _weights(2.5, size=50_000)
    CheckpointStore(url).save(3, weights)
    proxy.inject(CUT_BODY, times=1, when=_is_get)
    _assert_same(CheckpointStore(url).restore().model_state, weights)
    assert proxy.faults_applied(CUT_BODY) == 1
    proxy.inject(CUT_BODY, times=1000, when=_is_get)  # every read cut short: retries run out
    with pytest.raises(OSError, match=rf"reading {url}/(checkpoint|ckpt-3\.[^ ]*/[a-z._]+)"):
        CheckpointStore(url).restore()
    proxy.clear()
    _assert_same(CheckpointStore(url).restore().model_state, weights)


# ---------------------------------------------------------------------------- deadlines


@pytest.mark.parametrize("fault", [STALL, STALL_MID_BODY])
def test_a_stalled_save_fails_within_the_deadline_naming_the_object_and_commits_nothing(proxied, fault):
    url, proxy = proxied
    store = CheckpointStore(url)
    store.save(1, _weights(1.0))
    _use(proxy, ONE_TRY_EACH)
    proxy.inject(fault, times=1000, when=lambda request: request.method == "PUT" and "ckpt-2." in request.target)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"writing {url}/ckpt-2\.[^ ]+/[a-z._]+ timed out: the store stalled"):
        CheckpointStore(url).save(2, _weights(2.0, size=2**22))  # 16 MiB: more than the socket buffers hold
    elapsed = time.monotonic() - started
    assert elapsed < STALL_DEADLINE, f"the stalled save took {elapsed:.1f} s"
    assert proxy.faults_applied(fault) == 2  # botocore's two attempts, s3fs's one round
    proxy.clear()
    proxy.release_stalls()
    reader = CheckpointStore(url)
    assert [path.rsplit("/", 1)[1].split(".")[0] for path in reader.all_checkpoints()] == ["ckpt-1"]
    assert reader.restore().step == 1
    assert [name for name in ObjectStorage(url).list_folders() if name.startswith("ckpt-2.")] == []


def test_a_stalled_read_fails_within_the_deadline_naming_the_object(proxied):
    url, proxy = proxied
    path = CheckpointStore(url).save(1, _weights(1.0))
    _use(proxy, ONE_TRY_EACH)
    proxy.inject(STALL, times=1000, when=_is_get)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"reading {url}/(checkpoint|ckpt-1\.[^ ]*/[a-z._]+) timed out"):
        CheckpointStore(url).restore(path)
    assert time.monotonic() - started < STALL_DEADLINE


# ---------------------------------------------------------------------------- big files: multipart


def test_a_big_file_goes_up_in_parallel_parts_and_restores_bit_exact(proxied, monkeypatch):
    url, proxy = proxied
    monkeypatch.setattr(object_storage, "PART_BYTES", 5 * 2**20)
    weights = _weights(3.0, size=4 * 2**20)  # 16 MiB of float32: 4 parts
    CheckpointStore(url).save(1, weights)
    parts = [request for request, _ in proxy.log if request.is_part_upload]
    assert len(parts) == 4 and all(request.body_bytes == 5 * 2**20 for request in parts[:3])
    assert all("chunked" not in request.headers.get("transfer-encoding", "") for request in parts)
    assert _open_uploads(url) == []
    _assert_same(CheckpointStore(url).restore().model_state, weights)


def test_a_multipart_upload_failing_midway_is_aborted_and_lists_no_checkpoint(proxied, monkeypatch):
    url, proxy = proxied
    monkeypatch.setattr(object_storage, "PART_BYTES", 5 * 2**20)
    store = CheckpointStore(url)
    store.save(1, _weights(1.0))
    _use(proxy, ONE_TRY_EACH)
    proxy.inject(RESET_MID_BODY, times=1000, after=1, when=lambda request: request.is_part_upload)
    with pytest.raises(OSError, match=rf"writing {url}/ckpt-2\.[^ ]+/model\.safetensors"):
        CheckpointStore(url).save(2, _weights(2.0, size=4 * 2**20))
    assert proxy.faults_applied(RESET_MID_BODY) >= 2  # every attempt of the second part
    proxy.clear()
    assert _open_uploads(url) == []  # aborted: no part stays behind, billed and invisible
    assert [path.rsplit("/", 1)[1].split(".")[0] for path in CheckpointStore(url).all_checkpoints()] == ["ckpt-1"]
    assert CheckpointStore(url).restore().step == 1


def test_part_size_and_count_limits_fit_a_5_gib_checkpoint_and_a_10001st_part_is_refused(s3_bucket, monkeypatch):
    five_gib = 5 * 2**30
    assert object_storage.MAX_PARTS == 10_000
    assert object_storage.MAX_PARTS * object_storage.PART_BYTES >= 100 * five_gib  # 625 GiB at 64 MiB
    assert object_storage.MAX_PARTS * 5 * 2**20 >= 9 * five_gib  # 48.8 GiB at the smallest part S3 takes
    assert 5 * 2**20 <= object_storage.PART_BYTES <= five_gib
    monkeypatch.setattr(object_storage, "PART_BYTES", 5 * 2**20)
    monkeypatch.setattr(object_storage, "MAX_PARTS", 2)
    storage = ObjectStorage(f"{s3_bucket}/run")
    with pytest.raises(OSError, match=r"writing s3://.*/big/file failed: more than 2 parts") as raised:
        storage.write_file("big", "file", iter([bytes(5 * 2**20)] * 3))
    assert raised.value.errno == errno.EFBIG
    assert _open_uploads(f"{s3_bucket}/run") == []
    assert not filesystems.exists(f"{s3_bucket}/run/big/file")


# ---------------------------------------------------------------------------- one clear error naming the URL


def test_bad_credentials_are_one_error_naming_the_url_and_what_to_check(proxied):
    url, proxy = proxied
    proxy.inject(ACCESS_DENIED_KEY, times=1000)
    with pytest.raises(PermissionError, match=rf"{url}.*permission denied.*check the credentials"):
        CheckpointStore(url).save(1, _weights(1.0))
    with pytest.raises(PermissionError, match=rf"{url}.*permission denied.*check the credentials"):
        CheckpointStore(url).restore()


def test_an_estimator_with_bad_credentials_stops_before_step_one_saying_what_to_check(proxied):
    url, proxy = proxied
    proxy.inject(ACCESS_DENIED_KEY, times=1000)
    train_fn, _, _, _ = input_fns()
    with pytest.raises(PermissionError, match=rf"{url}.*permission denied.*check the credentials"):
        make_estimator(url).train(train_fn, max_steps=2)
    assert not [request for request, _ in proxy.log if request.method == "PUT"]  # nothing written, no step run


def test_a_missing_bucket_is_one_error_naming_the_url(proxied):
    url, _ = proxied
    missing = url.replace("://", "://absent-", 1)
    with pytest.raises(FileNotFoundError, match=rf"{missing}.*no such object or bucket"):
        CheckpointStore(missing).save(1, _weights(1.0))
    with pytest.raises(FileNotFoundError, match=rf"reading {missing}/x.*no such object or bucket"):
        filesystems.read_bytes(missing + "/x")


def test_an_object_deleted_under_a_reader_is_one_error_naming_it(proxied, monkeypatch):
    url, _ = proxied
    monkeypatch.setattr(object_storage, "PART_BYTES", 5 * 2**20)  # the reader's block: the file holds 4
    path = CheckpointStore(url).save(1, _weights(1.0, size=4 * 2**20))
    storage, folder = ObjectStorage(url), path.rsplit("/", 1)[1]
    with storage.open_file(folder, "model.safetensors") as stream:
        assert len(stream.read(8)) == 8
        storage.delete_folder(folder)
        stream.seek(12 * 2**20)
        with pytest.raises(OSError, match=rf"reading {path}/model\.safetensors.*(no such object|no longer exists)"):
            stream.read(1 << 20)


# ---------------------------------------------------------------------------- the defaults


def test_timeouts_and_retries_are_set_unless_the_options_set_them():
    arguments, attributes = filesystems.transfer_defaults("s3", {"config_kwargs": {"read_timeout": 5}, "retries": 1})
    config = arguments["config_kwargs"]
    assert config["read_timeout"] == 5 and config["connect_timeout"] == filesystems.CONNECT_TIMEOUT_SECONDS
    assert config["retries"] == {"total_max_attempts": filesystems.S3_MAX_ATTEMPTS, "mode": "standard"}
    assert "retries" not in arguments and attributes == {"retries": 1}
    arguments, attributes = filesystems.transfer_defaults("s3", {})
    assert attributes == {"retries": filesystems.S3FS_RETRIES} and arguments["config_kwargs"]["read_timeout"] == 60
    with pytest.raises(ValueError, match="retries.*at least 1"):
        filesystems.transfer_defaults("s3", {"retries": 0})
    gcs, _ = filesystems.transfer_defaults("gs", {})
    assert gcs["requests_timeout"].sock_read == 60 and gcs["requests_timeout"].total is None
    assert filesystems.transfer_defaults("gs", {"requests_timeout": 9})[0] == {"requests_timeout": 9}
    assert filesystems.transfer_defaults("az", {"read_timeout": 9})[0] == {"read_timeout": 9, "connection_timeout": 10}
    assert filesystems.transfer_defaults("memory", {}) == ({}, {})
