"""Transfers to an object store that cannot hang or half-succeed (issue 27, point 3), proven through a fault
proxy of our own (tests/fault_proxy.py) between the client and the server: s3fs and moto's S3 server, gcsfs and
the GCS emulator, adlfs and Azurite. Throttling, 500s and resets are retried and the checkpoint restores
bit-exact; a body cut short is read again or is an error, never wrong data; a stall ends within the deadline the
options set, naming the object, and commits nothing. On S3 also: a big file goes up as a multipart upload, and
one that fails midway leaves no upload open and no checkpoint; a missing bucket, bad credentials and an object
deleted under a reader are each one error naming the URL."""

from __future__ import annotations

import dataclasses
import errno
import logging
import time

import aiohttp
import pytest
import torch
from fault_proxy import (
    ACCESS_DENIED_KEY,
    CUT_BODY,
    INTERNAL_ERROR,
    RESET,
    RESET_MID_BODY,
    SLOW_DOWN,
    STALL,
    STALL_MID_BODY,
    FaultProxy,
)
from helpers import input_fns, make_estimator

from torchestimator._io import filesystems
from torchestimator.checkpoint import CheckpointStore, object_storage
from torchestimator.checkpoint.object_storage import ObjectStorage

pytestmark = pytest.mark.timeout(180)  # no test here may hang: each fault ends in a retry or an error well before

READ_TIMEOUT = 2
FAST_OPTIONS = {
    "config_kwargs": {
        "connect_timeout": 2,
        "read_timeout": READ_TIMEOUT,
        "retries": {"total_max_attempts": 3, "mode": "standard"},
    },
    "retries": 2,
}
"""Tight enough for tests: a stall costs at most 2 * 3 * 2 s, plus botocore's backoff (under 1 + 2 + 4 s)."""
ONE_TRY_EACH = {
    "config_kwargs": {
        "connect_timeout": 2,
        "read_timeout": READ_TIMEOUT,
        "retries": {"total_max_attempts": 2, "mode": "standard"},
    },
    "retries": 1,
}
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
    assert 100 * five_gib <= object_storage.MAX_PARTS * object_storage.PART_BYTES  # 625 GiB at 64 MiB
    assert 9 * five_gib <= object_storage.MAX_PARTS * 5 * 2**20  # 48.8 GiB at the smallest part S3 takes
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
    arguments, settings = filesystems.transfer_defaults("s3", {"config_kwargs": {"read_timeout": 5}, "retries": 1})
    config = arguments["config_kwargs"]
    assert config["read_timeout"] == 5 and config["connect_timeout"] == filesystems.CONNECT_TIMEOUT_SECONDS
    assert config["retries"] == {"total_max_attempts": filesystems.S3_MAX_ATTEMPTS, "mode": "standard"}
    assert "retries" not in arguments and settings == {"retries": 1}
    arguments, settings = filesystems.transfer_defaults("s3", {})
    assert settings == {"retries": filesystems.S3FS_RETRIES} and arguments["config_kwargs"]["read_timeout"] == 60
    with pytest.raises(ValueError, match="retries.*at least 1"):
        filesystems.transfer_defaults("s3", {"retries": 0})

    gcs, settings = filesystems.transfer_defaults("gs", {})
    assert gcs["requests_timeout"].sock_read == 60 and gcs["requests_timeout"].total is None
    assert gcs["session_kwargs"]["request_class"].__name__ == "RequestWithSendDeadline" and settings == {}
    gcs, settings = filesystems.transfer_defaults(
        "gs", {"requests_timeout": 9, "retries": 3, "session_kwargs": {"trust_env": True}}
    )
    assert gcs["requests_timeout"] == 9 and "retries" not in gcs and settings == {"retries": 3}
    assert gcs["session_kwargs"]["trust_env"] is True and "request_class" in gcs["session_kwargs"]
    with pytest.raises(ValueError, match="retries.*at least 1"):
        filesystems.transfer_defaults("gs", {"retries": 0})

    azure, settings = filesystems.transfer_defaults("az", {"read_timeout": 9, "retry_total": 2, "account_name": "a"})
    assert azure == {"read_timeout": 9, "connection_timeout": 10, "account_name": "a"}
    assert settings == {"read_timeout": 9, "connection_timeout": 10, "retry_total": 2}
    with pytest.raises(ValueError, match="retry_total.*at least 0"):
        filesystems.transfer_defaults("az", {"retry_total": -1})
    assert filesystems.transfer_defaults("memory", {}) == ({}, {})


def test_an_azure_filesystem_gets_a_client_with_its_account_our_timeouts_and_the_retries_asked_for():
    """adlfs takes neither the SDK's retry arguments nor timeouts for every request: its client is made again with
    the same account, credential and secondary endpoint (no request is sent here)."""
    import base64

    key = base64.b64encode(b"not a real key, 32 bytes long...").decode()
    filesystems.configure_storage_options(
        {
            "az": {
                "account_name": "acct",
                "account_key": key,
                "read_timeout": 7,
                "retry_total": 1,
                "initial_backoff": 0.5,
            }
        }
    )
    try:
        fs, inner = filesystems.filesystem("az://container/run/file")
        client = fs.service_client
        assert inner == "container/run/file" and client.url.startswith("https://acct.blob.core.windows.net")
        assert client.credential.account_name == "acct"
        assert client.secondary_hostname == "acct-secondary.blob.core.windows.net"
        transport = client._pipeline._transport
        assert transport.connection_config.read_timeout == 7 and transport.connection_config.timeout == 10
        assert client._config.retry_policy.total_retries == 1 and client._config.retry_policy.initial_backoff == 0.5
        assert filesystems.filesystem("az://container/other")[0] is fs  # made once per options
    finally:
        filesystems.configure_storage_options(None)


# ---------------------------------------------------------------------------- gs:// and az:// through the proxy


@dataclasses.dataclass
class _Store:
    """One store behind the fault proxy: the model_dir URL, the proxy, and what its requests look like."""

    kind: str  # "gs" or "az"
    url: str
    proxy: FaultProxy
    secret: str | None  # a storage option's value that no error or log line may show

    def use(self, *, read_timeout: float, tries: int) -> None:
        """Reach the server through the proxy, with this read (and send) timeout and this many tries per request."""
        if self.kind == "gs":
            options = {
                "endpoint_url": self.proxy.url,
                "retries": tries,
                "requests_timeout": aiohttp.ClientTimeout(sock_connect=read_timeout, sock_read=read_timeout),
            }
        else:
            options = {
                "connection_string": self.secret,
                "connection_timeout": read_timeout,
                "read_timeout": read_timeout,
                "retry_total": tries - 1,
                "initial_backoff": 0.2,
                "increment_base": 2,
                "random_jitter_range": 0.2,
            }
        filesystems.configure_storage_options({self.kind: options})

    def is_upload(self, request) -> bool:
        """A request carrying an object's bytes (gcsfs: a POST to the upload API; Azure: a blob or block PUT)."""
        if self.kind == "gs":
            return request.method == "POST" and request.target.startswith("/upload/")
        return request.method == "PUT" and "restype=container" not in request.target

    def is_object_read(self, request) -> bool:
        """A GET of an object's bytes (not a listing)."""
        if self.kind == "gs":
            return request.method == "GET" and "alt=media" in request.target
        return request.method == "GET" and "comp=list" not in request.target and "restype=" not in request.target


GENEROUS_READ_TIMEOUT = 30
"""The success paths' timeout: far above any pause of a busy machine, so only the faults injected are retried."""
GCS_STALL_DEADLINE = 2 * (READ_TIMEOUT + READ_TIMEOUT / 4) + 2 + 8
"""Two tries of the read (or send) timeout, each seen up to a quarter late, gcsfs's backoff between them (1 to 2 s),
and slack for a busy CPU."""
AZURE_STALL_DEADLINE = 2 * (READ_TIMEOUT + READ_TIMEOUT / 4) + 0.4 + 8
"""Two tries, the retry policy's first backoff (0.2 s, give or take 0.2 s), slack for a busy CPU."""


@pytest.fixture(params=["gs", "az"])
def proxied_store(request):
    """gs:// (the GCS emulator) or az:// (Azurite) reached only through the fault proxy; success-path options."""
    from object_stores import AZURITE_ACCOUNT

    if request.param == "gs":
        bucket = request.getfixturevalue("gcs_bucket")
        upstream, dialect = request.getfixturevalue("gcs_endpoint"), "gcs"
    else:
        bucket = request.getfixturevalue("az_bucket")
        connection_string = request.getfixturevalue("azure_connection_string")
        endpoint = connection_string.split("BlobEndpoint=", 1)[1].split(";", 1)[0]
        upstream, dialect = endpoint.rsplit(f"/{AZURITE_ACCOUNT}", 1)[0], "azure"
    with FaultProxy(upstream, dialect=dialect) as proxy:
        secret = None if request.param == "gs" else connection_string.replace(upstream, proxy.url)
        store = _Store(request.param, f"{bucket}/run", proxy, secret)
        store.use(read_timeout=GENEROUS_READ_TIMEOUT, tries=4)
        try:
            yield store
        finally:
            proxy.clear()
            proxy.release_stalls()
            filesystems.configure_storage_options(None)


def _assert_no_secret(store: _Store, error: BaseException, caplog) -> None:
    from object_stores import AZURITE_KEY

    if store.secret is not None:
        for text in (str(error), repr(error.args), caplog.text):
            assert store.secret not in text and AZURITE_KEY not in text


@pytest.mark.parametrize("fault", [SLOW_DOWN, INTERNAL_ERROR, RESET, RESET_MID_BODY])
def test_gs_and_az_saves_and_restores_go_through_throttling_errors_and_resets(proxied_store, fault):
    store, proxy = proxied_store, proxied_store.proxy
    weights = _weights(1.5)
    proxy.inject(fault, times=2, when=store.is_upload)
    CheckpointStore(store.url).save(1, weights, {"m": torch.ones(3)}, {"position": 4})
    assert proxy.faults_applied(fault) == 2
    proxy.inject(fault, times=2, when=store.is_object_read)
    restored = CheckpointStore(store.url).restore()
    assert proxy.faults_applied(fault) == 4
    assert restored.step == 1 and restored.extra["position"] == 4
    _assert_same(restored.model_state, weights)
    assert torch.equal(restored.optimizer_state["m"], torch.ones(3))


def test_gs_and_az_bodies_cut_short_are_read_again_and_never_load_wrong_data(proxied_store, caplog):
    store, proxy = proxied_store, proxied_store.proxy
    weights = _weights(2.5, size=50_000)
    CheckpointStore(store.url).save(3, weights)
    proxy.inject(CUT_BODY, times=1, when=store.is_object_read)
    _assert_same(CheckpointStore(store.url).restore().model_state, weights)
    assert proxy.faults_applied(CUT_BODY) == 1
    store.use(read_timeout=GENEROUS_READ_TIMEOUT, tries=2)
    proxy.inject(CUT_BODY, times=1000, when=store.is_object_read)  # every read cut short: retries run out
    with pytest.raises(OSError, match=rf"reading {store.url}/(checkpoint|ckpt-3\.[^ ]*/[a-z._]+)") as raised:
        CheckpointStore(store.url).restore()
    _assert_no_secret(store, raised.value, caplog)
    proxy.clear()
    _assert_same(CheckpointStore(store.url).restore().model_state, weights)


@pytest.mark.parametrize("fault", [STALL, STALL_MID_BODY])
def test_gs_and_az_stalled_saves_fail_within_the_deadline_naming_the_object_and_commit_nothing(
    proxied_store, fault, caplog
):
    store, proxy = proxied_store, proxied_store.proxy
    CheckpointStore(store.url).save(1, _weights(1.0))
    store.use(read_timeout=READ_TIMEOUT, tries=2)
    proxy.inject(fault, times=1000, when=store.is_upload)
    started = time.monotonic()
    with (
        caplog.at_level(logging.DEBUG),
        pytest.raises(
            TimeoutError, match=rf"writing {store.url}/ckpt-2\.[^ ]+/[a-z._]+ timed out: the store stalled"
        ) as raised,
    ):
        CheckpointStore(store.url).save(2, _weights(2.0, size=2**22))  # 16 MiB: more than the socket buffers hold
    elapsed = time.monotonic() - started
    deadline = GCS_STALL_DEADLINE if store.kind == "gs" else AZURE_STALL_DEADLINE
    assert elapsed < deadline, f"the stalled save took {elapsed:.1f} s"
    assert proxy.faults_applied(fault) >= 2  # each file stalled is tried twice
    _assert_no_secret(store, raised.value, caplog)
    proxy.clear()
    proxy.release_stalls()
    store.use(read_timeout=GENEROUS_READ_TIMEOUT, tries=4)
    reader = CheckpointStore(store.url)
    assert [path.rsplit("/", 1)[1].split(".")[0] for path in reader.all_checkpoints()] == ["ckpt-1"]
    assert reader.restore().step == 1
    assert [name for name in ObjectStorage(store.url).list_folders() if name.startswith("ckpt-2.")] == []


def test_gs_and_az_stalled_reads_fail_within_the_deadline_naming_the_object(proxied_store, caplog):
    store, proxy = proxied_store, proxied_store.proxy
    path = CheckpointStore(store.url).save(1, _weights(1.0))
    store.use(read_timeout=READ_TIMEOUT, tries=2)
    proxy.inject(STALL, times=1000, when=store.is_object_read)
    started = time.monotonic()
    with (
        caplog.at_level(logging.DEBUG),
        pytest.raises(
            TimeoutError, match=rf"reading {store.url}/(checkpoint|ckpt-1\.[^ ]*/[a-z._]+) timed out"
        ) as raised,
    ):
        CheckpointStore(store.url).restore(path)
    elapsed = time.monotonic() - started
    assert elapsed < (GCS_STALL_DEADLINE if store.kind == "gs" else AZURE_STALL_DEADLINE), f"took {elapsed:.1f} s"
    _assert_no_secret(store, raised.value, caplog)


@pytest.mark.parametrize("size", [1000, 2**24])
def test_a_gs_or_az_send_the_server_stops_reading_is_a_timeout_not_a_hang(proxied_store, size):
    """The send deadline alone (filesystems.write_bytes, one PUT or POST): a small body fits the socket buffers and
    waits on the read timeout; a 16 MiB one stops mid-way, where only the send deadline ends it."""
    store, proxy = proxied_store, proxied_store.proxy
    store.use(read_timeout=READ_TIMEOUT, tries=1)
    proxy.inject(STALL_MID_BODY, times=1000, when=store.is_upload)
    url = f"{store.url}/one/object.bin"
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"writing {url} timed out: the store stalled"):
        filesystems.write_bytes(url, bytes(size))
    assert time.monotonic() - started < READ_TIMEOUT + READ_TIMEOUT / 4 + 6
    assert proxy.faults_applied(STALL_MID_BODY) == 1
    proxy.clear()
    proxy.release_stalls()
    assert not filesystems.exists(url)  # half a body is never an object
