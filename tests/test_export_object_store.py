"""Exports in an object store (export/_store_versions.py): uploaded with metadata.json last, listed only when
complete, copied to a local cache and verified before loading; exporters and their retention on a store.
Against moto's S3 server, the GCS emulator and memory:// (tests/object_stores.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from helpers import trained_classifier
from object_stores import upload_version

from torchestimator._io import filesystems
from torchestimator.cli import main
from torchestimator.errors import ExportFormatError
from torchestimator.export import (
    BestExporter,
    LatestExporter,
    TensorSpec,
    _store_versions,
    export_saved_model,
    latest_version,
    list_versions,
    load,
    read_best_eval,
    serving_input_receiver,
)
from torchestimator.export.exporters import garbage_collect_exports

RECEIVER = serving_input_receiver({"x": TensorSpec(shape=(None, 8), dtype=torch.float32)})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A trained classifier (local model_dir), one local export of it, and inputs."""
    root = tmp_path_factory.mktemp("store_export")
    estimator, x = trained_classifier(root / "model")
    local = export_saved_model(estimator, root / "local", RECEIVER)
    return {"estimator": estimator, "local": local, "x": x[:5]}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHESTIMATOR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


upload = upload_version  # tests/object_stores.py


def test_an_export_to_s3_loads_and_predicts_as_the_local_export(exported, s3_bucket, _cache, capsys, tmp_path):
    base = f"{s3_bucket}/models/m"
    url = export_saved_model(exported["estimator"], base, RECEIVER)
    version = int(url.rsplit("/", 1)[1])
    assert url == f"{base}/{version}" and list_versions(base) == [version] and latest_version(base) == url
    metadata = json.loads(filesystems.read_bytes(f"{url}/metadata.json"))
    local_metadata = json.loads(open(os.path.join(exported["local"], "metadata.json")).read())
    assert set(metadata["files"]) == {"program.json", "tensors.safetensors", "signature.json"}
    assert metadata["files"] == local_metadata["files"]  # the same bytes, wherever they were written
    from_store, from_disk = load(url), load(exported["local"])
    assert from_store.version == version and from_store.path.startswith(str(_cache))
    for key, value in from_disk(exported["x"]).items():
        np.testing.assert_array_equal(from_store(exported["x"])[key], value)
    assert load(base).path == from_store.path  # a base: its newest complete version

    # A cached, verified copy is reused: nothing is downloaded again.
    def no_download(*args, **kwargs):
        raise AssertionError("downloaded again")

    original = _store_versions._download_verified
    _store_versions._download_verified = no_download
    try:
        assert load(url).path == from_store.path
    finally:
        _store_versions._download_verified = original

    # predict --exported URL: the same answers as the local export.
    (tmp_path / "request.json").write_text(json.dumps({"instances": exported["x"].tolist()}))
    assert main(["predict", "--exported", base, "--input", str(tmp_path / "request.json")]) == 0
    answered = json.loads(capsys.readouterr().out)["predictions"]
    expected = from_disk(exported["x"])
    np.testing.assert_allclose([row["probabilities"] for row in answered], expected["probabilities"], rtol=1e-6)


def test_a_version_without_metadata_is_not_a_version(exported, store_url):
    base = f"{store_url}/export"
    upload(exported["local"], f"{base}/100")
    upload(exported["local"], f"{base}/200", metadata=False)  # an upload in progress, or one cut short
    assert list_versions(base) == [100]
    assert _store_versions.list_store_versions(base, complete=False) == {200: "200"}
    assert load(base).version == 100
    with pytest.raises(ExportFormatError, match=f"{base}/200 is not a complete export version"):
        load(f"{base}/200")
    with pytest.raises(ExportFormatError, match="neither a complete export version nor a base"):
        load(f"{store_url}/nothing-here")


def test_a_damaged_file_is_refused_naming_the_url_and_the_file(exported, store_url, _cache):
    url = upload(exported["local"], f"{store_url}/export/300", damage="tensors.safetensors")
    with pytest.raises(
        ExportFormatError, match=f"{url}/tensors.safetensors does not match the version's metadata.json .sha256"
    ):
        load(url)
    assert not os.path.exists(_store_versions.cache_folder(url))  # nothing half-checked is left to reuse
    assert list(os.listdir(os.path.dirname(_store_versions.cache_folder(url)))) == []
    filesystems.write_bytes(f"{url}/signature.json", b"{}")  # a size that does not match either
    with pytest.raises(ExportFormatError, match="signature.json does not match .* bytes where metadata.json says"):
        load(url)


def test_a_cached_copy_is_replaced_when_the_store_holds_another_version_under_its_name(exported, store_url):
    url = upload(exported["local"], f"{store_url}/export/7")
    first = load(url).path
    metadata = json.loads(filesystems.read_bytes(f"{url}/metadata.json"))
    metadata["note"] = "re-exported under the same number"
    filesystems.write_bytes(f"{url}/metadata.json", json.dumps(metadata).encode())
    again = load(url)
    assert again.path == first and again.metadata["note"] == "re-exported under the same number"


def test_metadata_without_checksums_or_with_paths_outside_the_version_is_refused(exported, s3_bucket):
    url = upload(exported["local"], f"{s3_bucket}/export/1")
    metadata = json.loads(filesystems.read_bytes(f"{url}/metadata.json"))
    for files, words in ((None, "lists no 'files'"), ({"../escape": {"size": 1, "sha256": "0"}}, "not a relative")):
        filesystems.write_bytes(f"{url}/metadata.json", json.dumps({**metadata, "files": files}).encode())
        with pytest.raises(ExportFormatError, match=words):
            load(url)


def test_exporters_on_a_store_keep_the_newest_and_delete_metadata_first(exported, s3_bucket, monkeypatch):
    export_path = f"{s3_bucket}/run/export/latest"
    estimator = exported["estimator"]
    checkpoint = estimator.latest_checkpoint()
    exporter = LatestExporter("latest", RECEIVER, exports_to_keep=2)
    first = exporter.export(estimator, export_path, checkpoint, {"loss": 1.0}, False)
    assert exporter.export(estimator, export_path, checkpoint, {"loss": 1.0}, False) == first  # already exported
    for version in (5, 6):  # older versions, as earlier runs left them
        upload(exported["local"], f"{export_path}/{version}")
    upload(exported["local"], f"{export_path}/4", metadata=False)  # an upload killed long ago
    removed: list[str] = []
    remove = filesystems.remove
    monkeypatch.setattr(filesystems, "remove", lambda path: (removed.append(path), remove(path)))
    deleted = garbage_collect_exports(export_path, 1)
    assert sorted(deleted) == [f"{export_path}/4", f"{export_path}/5", f"{export_path}/6"]
    assert list_versions(export_path) == [int(first.rsplit("/", 1)[1])]
    assert _store_versions.list_store_versions(export_path, complete=False) == {}
    assert f"{export_path}/5/metadata.json" in removed  # each version's metadata.json went before its files

    best = BestExporter("best", RECEIVER, exports_to_keep=1)
    best_path = f"{s3_bucket}/run/export/best"
    written = best.export(estimator, best_path, checkpoint, {"loss": 0.5}, False)
    assert written is not None and read_best_eval(best_path)["eval_result"] == {"loss": 0.5}
    assert read_best_eval(best_path)["export_dir"] == written
    assert best.export(estimator, best_path, checkpoint, {"loss": 0.7}, False) is None  # not better


def test_a_failed_upload_leaves_no_version(exported, s3_bucket, monkeypatch):
    base = f"{s3_bucket}/models/m"
    calls = []
    upload_one = _store_versions._upload

    def failing(local, url):
        calls.append(url)
        if len(calls) == 2:
            raise OSError(f"writing {url} failed: connection reset")
        upload_one(local, url)

    monkeypatch.setattr(_store_versions, "_upload", failing)
    with pytest.raises(OSError, match="connection reset"):
        export_saved_model(exported["estimator"], base, RECEIVER)
    assert list_versions(base) == [] and _store_versions.list_store_versions(base, complete=False) == {}
