"""TFRecords read from object stores (data/_remote_files.py through tfrecord.py and TFRecordDataset) against
real protocol servers: moto's S3 server, the GCS emulator (tests/object_stores.py) and memory://. Each test
writes its files locally, uploads the same bytes, and expects what the local files give."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchestimator import cli
from torchestimator._io import filesystems
from torchestimator.data import _remote_files
from torchestimator.data.example import encode_example
from torchestimator.data.parsing import FixedLenFeature
from torchestimator.data.tfrecord import TFRecordWriter, iter_record_blocks, iter_records, list_files, read_records
from torchestimator.data.tfrecord_dataset import TFRecordDataset
from torchestimator.errors import DataLossError

FEATURES = {"label": FixedLenFeature([], "int64"), "text": FixedLenFeature([], "string")}


def _write_files(
    folder: Path, count: int = 3, records: int = 40, compression: str | None = None, name: str = "train"
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for file_index in range(count):
        path = folder / f"{name}-{file_index:02d}.tfrecord"
        with TFRecordWriter(path, compression=compression) as writer:
            for index in range(records + file_index):  # files of different lengths
                label = file_index * 1000 + index
                writer.write(encode_example({"label": [label], "text": [b"x" * (index % 7) + str(label).encode()]}))
        paths.append(path)
    return paths


def _upload(paths: list[Path], url: str) -> list[str]:
    urls = []
    for path in paths:
        urls.append(f"{url}/{path.name}")
        filesystems.write_bytes(urls[-1], path.read_bytes())
    return urls


def _batches(dataset, limit: int | None = None) -> list[list]:
    out = []
    for features, label in dataset:
        out.append((label.tolist(), features["text"].tolist()))
        if limit is not None and len(out) == limit:
            break
    return out


# --------------------------------------------------------------------------- reading


def test_a_url_glob_reads_what_the_local_files_give(store_url, tmp_path):
    urls = _upload(_write_files(tmp_path / "local"), store_url)
    options = {
        "features": FEATURES,
        "label_key": "label",
        "batch_size": 7,
        "shuffle_files": True,
        "interleave_cycle_length": 2,
        "num_epochs": 2,
        "seed": 3,
    }
    remote = TFRecordDataset(f"{store_url}/train-*.tfrecord", **options)
    assert list(remote.files) == urls  # sorted full URLs of the pattern's scheme
    assert _batches(remote) == _batches(TFRecordDataset(str(tmp_path / "local" / "train-*.tfrecord"), **options))
    assert list(read_records(urls)) == list(read_records(sorted(str(p) for p in (tmp_path / "local").iterdir())))


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_objects_read_as_the_local_files(s3_bucket, tmp_path, compression):
    local = _write_files(tmp_path / "local", count=2, compression=compression)
    urls = _upload(local, f"{s3_bucket}/data")
    for given in (compression, "auto"):
        assert list(read_records(urls, given)) == list(read_records([str(p) for p in local], given))
    options = {
        "features": FEATURES,
        "label_key": "label",
        "batch_size": 5,
        "compression": compression,
        "interleave_cycle_length": 2,
    }
    assert _batches(TFRecordDataset(urls, **options)) == _batches(TFRecordDataset([str(p) for p in local], **options))


def test_the_remote_reader_fetches_large_ranges_ahead_and_reads_any_size(tmp_path, monkeypatch):
    data = bytes(range(256)) * 1200  # 307200 bytes
    url = "memory://te-remote-file/blob"
    filesystems.write_bytes(url, data)
    fetched: list[tuple[int, int]] = []
    original = _remote_files.RemoteFile._fetch

    def spy(self, start, end):
        fetched.append((start, end))
        return original(self, start, end)

    monkeypatch.setattr(_remote_files.RemoteFile, "_fetch", spy)
    with _remote_files.RemoteFile(url, chunk_size=65536, read_ahead=2) as remote:
        assert remote.size == len(data)
        assert remote.read(100) == data[:100]
        assert fetched == [(0, 100)]  # a small first read fetches what it asks: a resume's re-read pulls no more
        got = bytearray(data[:100])
        for size in (1, 5000, 70000, 3, 131072, 1 << 20):
            got += remote.read(size)
        assert bytes(got) == data
        assert remote.read(10) == b""
        assert max(end - start for start, end in fetched[1:]) == 65536  # then whole ranges, read ahead
        remote.seek(12345)
        assert remote.read(10) == data[12345:12355]
        buffer = bytearray(40000)
        assert remote.readinto(buffer) == 40000 and bytes(buffer) == data[12355:52355]
        remote.seek(-5, 2)
        assert remote.read() == data[-5:]


def test_interleaved_objects_are_fetched_at_the_same_time(tmp_path, monkeypatch):
    urls = []
    for file_index in range(4):  # 1.5 MB each: more than the scanner's first 1 MiB read
        urls.append(f"memory://te-interleave/{file_index}.tfrecord")
        with TFRecordWriter(urls[-1]) as writer:
            for index in range(300):
                writer.write(bytes([file_index, index % 256]) * 2500)
    active, most = 0, 0
    lock = threading.Lock()
    original = _remote_files.RemoteFile._fetch

    def slow(self, start, end):
        nonlocal active, most
        with lock:
            active += 1
            most = max(most, active)
        time.sleep(0.02)  # a store's latency
        try:
            return original(self, start, end)
        finally:
            with lock:
                active -= 1

    monkeypatch.setattr(_remote_files, "CHUNK_SIZE", 128 << 10)
    monkeypatch.setattr(_remote_files.RemoteFile, "_fetch", slow)
    dataset = TFRecordDataset(urls, interleave_cycle_length=4, batch_size=50, collate_fn=list)
    records = [record for batch in dataset for record in batch]
    assert records == [bytes([index % 4, index // 4 % 256]) * 2500 for index in range(1200)]
    assert most >= 4  # several files' ranges (and several ranges of one file) in flight together


@pytest.mark.parametrize("cycle", [1, 3])
def test_the_files_after_the_first_are_opened_ahead_on_a_thread(tmp_path, monkeypatch, cycle):
    from torchestimator.data import _dataset_records

    urls = _upload(_write_files(tmp_path / "local", count=5), f"memory://te-ahead-{cycle}")
    opened: list[tuple[str, str]] = []
    original = _dataset_records._open_ahead

    def spy(path, identity):
        opened.append((path.rsplit("/", 1)[1], threading.current_thread().name))
        return original(path, identity)

    monkeypatch.setattr(_dataset_records, "_open_ahead", spy)
    options = {"batch_size": 4, "collate_fn": list, "interleave_cycle_length": cycle}
    assert list(TFRecordDataset(urls, **options)) == list(TFRecordDataset(str(tmp_path / "local" / "*"), **options))
    ahead = sorted(name for name, _ in opened)
    assert ahead == [f"train-{index:02d}.tfrecord" for index in range(1 if cycle == 1 else 0, 5)]
    assert all(thread.startswith("torchestimator-open-ahead") for _, thread in opened)


def test_a_position_resumes_bit_exactly_from_s3_with_a_shuffle_buffer(s3_bucket, tmp_path):
    local = _write_files(tmp_path / "local", count=3, records=60)
    urls = _upload(local, f"{s3_bucket}/data")
    options = {
        "features": FEATURES,
        "label_key": "label",
        "batch_size": 8,
        "shuffle_buffer_size": 50,
        "interleave_cycle_length": 2,
        "num_epochs": 2,
        "seed": 11,
        "shuffle_files": True,
    }
    expected = _batches(TFRecordDataset(urls, **options))
    for stop in (3, len(expected) // 2 + 1):
        first = TFRecordDataset(urls, **options)
        head = _batches(first, limit=stop)
        state = json.loads(json.dumps(first.state_dict()))
        assert "buffer_files" in state["shards"]["0"]  # resumed by offsets, not by replaying the epoch
        resumed = TFRecordDataset(urls, **options)
        resumed.load_state_dict(state)
        assert head + _batches(resumed) == expected
    # A position saved over the local files resumes over the same files in the bucket (same names and bytes).
    local_dataset = TFRecordDataset([str(path) for path in local], **options)
    head = _batches(local_dataset, limit=5)
    resumed = TFRecordDataset(urls, **options)
    resumed.load_state_dict(local_dataset.state_dict())
    assert head + _batches(resumed) == expected


def test_a_buffer_of_records_longer_than_a_read_resumes_from_many_reads(monkeypatch):
    from torchestimator.data import _dataset_shuffle

    urls = []
    for file_index in range(2):
        urls.append(f"memory://te-reread/{file_index}.tfrecord")
        with TFRecordWriter(urls[-1]) as writer:
            for index in range(120):
                writer.write(bytes([file_index, index]) * (50 + 40 * (index % 5)))  # 100-500 bytes
    monkeypatch.setattr(_dataset_shuffle, "_REMOTE_REREAD_BLOCK_SIZE", 256)  # records span reads
    monkeypatch.setattr(_dataset_shuffle, "_REMOTE_REREAD_SPAN", 700)
    options = {"shuffle_buffer_size": 30, "batch_size": 4, "collate_fn": list, "interleave_cycle_length": 2}
    expected = list(TFRecordDataset(urls, **options))
    first = TFRecordDataset(urls, **options)
    iterator = iter(first)
    head = [next(iterator) for _ in range(11)]
    resumed = TFRecordDataset(urls, **options)
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == expected


def test_a_position_without_a_buffer_seeks_into_the_object(s3_bucket, tmp_path):
    urls = _upload(_write_files(tmp_path / "local", count=3), f"{s3_bucket}/data")
    options = {"batch_size": 6, "collate_fn": list, "interleave_cycle_length": 2}
    expected = list(TFRecordDataset(urls, **options))
    first = TFRecordDataset(urls, **options)
    iterator = iter(first)
    head = [next(iterator) for _ in range(7)]
    resumed = TFRecordDataset(urls, **options)
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == expected


def test_loader_workers_read_and_resume_from_s3(s3_bucket, tmp_path):
    urls = _upload(_write_files(tmp_path / "local", count=4, records=30), f"{s3_bucket}/data")
    options = {"batch_size": 5, "collate_fn": list, "shuffle_buffer_size": 10, "seed": 2}
    expected = list(TFRecordDataset(urls, **options).loader(num_workers=2))
    loader = TFRecordDataset(urls, **options).loader(num_workers=2)
    head = []
    for batch in loader:  # DataLoader workers are forked: each makes its own connection to the store
        head.append(batch)
        if len(head) == 5:
            break
    resumed = TFRecordDataset(urls, **options).loader(num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    assert head + list(resumed) == expected


# --------------------------------------------------------------------------- errors


def test_a_missing_object_or_bucket_is_one_error_naming_the_url(s3_bucket):
    for url in (f"{s3_bucket}/nothing.tfrecord", "s3://te-no-such-bucket-9f3a/x.tfrecord"):
        with pytest.raises(FileNotFoundError, match="does not exist") as caught:
            TFRecordDataset(url)
        assert url in str(caught.value)
    for pattern, message in (
        (f"{s3_bucket}/train-*.tfrecord", "No objects matched"),
        ("s3://te-no-such-bucket-9f3a/train-*.tfrecord", "The specified bucket does not exist"),
    ):
        with pytest.raises(FileNotFoundError, match=message) as caught:
            list_files(pattern)
        assert pattern in str(caught.value)
    filesystems.write_bytes(f"{s3_bucket}/folder/a.tfrecord", b"")
    with pytest.raises(ValueError, match="is a folder"):
        list_files(f"{s3_bucket}/folder")
    with pytest.raises(FileNotFoundError) as caught:  # listed, then gone before it was opened
        list(iter_records(f"{s3_bucket}/gone.tfrecord"))
    assert f"{s3_bucket}/gone.tfrecord" in str(caught.value)


@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_an_object_deleted_or_replaced_under_a_reader_is_named(s3_bucket, tmp_path, monkeypatch, change):
    (local,) = _write_files(tmp_path / "local", count=1, records=3000)
    (url,) = _upload([local], f"{s3_bucket}/data")
    monkeypatch.setattr(_remote_files, "CHUNK_SIZE", 4096)
    blocks = iter_record_blocks(url, block_size=4096)
    next(blocks)
    next(blocks)  # the second read makes the reading sequential: ranges now read ahead
    if change == "deleted":
        filesystems.remove(url)
    else:
        filesystems.write_bytes(url, local.read_bytes()[::-1])
    kind = FileNotFoundError if change == "deleted" else OSError
    with pytest.raises(kind, match=f"was {change} while it was being read") as caught:
        for _ in blocks:
            pass
    assert url in str(caught.value) and caught.value.errno == (errno.ENOENT if change == "deleted" else errno.ESTALE)
    assert not isinstance(caught.value, DataLossError)  # not damage in the file: skip_corrupt does not skip it


def test_a_damaged_record_in_an_object_names_the_url_and_the_offset(s3_bucket, tmp_path):
    (local,) = _write_files(tmp_path / "local", count=1, records=50)
    offsets = [offset for offset, _ in iter_records(local)]
    data = bytearray(local.read_bytes())
    data[offsets[20] + 14] ^= 0xFF  # inside record 20's data
    url = f"{s3_bucket}/damaged.tfrecord"
    filesystems.write_bytes(url, bytes(data))
    with pytest.raises(DataLossError) as caught:
        list(iter_records(url))
    error = caught.value
    assert error.path == url and error.offset == offsets[20]
    assert str(error).startswith(f"corrupted record at {offsets[20] + 12} in {url}:")
    dataset = TFRecordDataset(url, skip_corrupt=True)
    assert len(list(dataset)) == 49  # all but the damaged record, as with a local file


def test_resuming_over_an_object_rewritten_since_is_refused(s3_bucket, tmp_path):
    urls = _upload(_write_files(tmp_path / "local", count=2), f"{s3_bucket}/data")
    first = TFRecordDataset(urls, batch_size=4, collate_fn=list)
    next(iter(first))
    state = first.state_dict()
    filesystems.write_bytes(urls[0], Path(tmp_path / "local" / "train-01.tfrecord").read_bytes())
    resumed = TFRecordDataset(urls, batch_size=4, collate_fn=list)
    resumed.load_state_dict(state)
    with pytest.raises(DataLossError, match="changed since the position was saved") as caught:
        next(iter(resumed))
    assert urls[0] in str(caught.value)


def test_a_failed_write_to_a_url_publishes_nothing(s3_bucket):
    url = f"{s3_bucket}/out.tfrecord"
    with pytest.raises(RuntimeError), TFRecordWriter(url) as writer:
        writer.write(b"a record")
        raise RuntimeError("the job was stopped")
    assert not filesystems.exists(url)
    with TFRecordWriter(url, compression="GZIP") as writer:
        writer.write(b"a record")
    assert list(read_records(url, "auto")) == [b"a record"]


# --------------------------------------------------------------------------- the records commands


def test_records_verify_and_inspect_take_urls(s3_bucket, tmp_path, capsys):
    local = _write_files(tmp_path / "local", count=2, records=10)
    _upload(local, f"{s3_bucket}/data")
    damaged = bytearray(local[0].read_bytes())
    damaged[30] ^= 0x01
    filesystems.write_bytes(f"{s3_bucket}/bad/x.tfrecord", bytes(damaged))
    assert cli.main(["records", "verify", f"{s3_bucket}/data/train-*.tfrecord"]) == 0
    output = capsys.readouterr().out
    assert f"OK      {s3_bucket}/data/train-00.tfrecord: 10 records" in output
    assert "verified 2 file(s): 2 ok, 0 damaged, 21 good records" in output
    assert cli.main(["records", "verify", f"{s3_bucket}/data/train-01.tfrecord", f"{s3_bucket}/bad/x.tfrecord"]) == 1
    assert (
        f"DAMAGED {s3_bucket}/bad/x.tfrecord: 0 good records, first bad record at offset 0" in capsys.readouterr().out
    )
    assert cli.main(["records", "inspect", f"{s3_bucket}/data/train-01.tfrecord", "--limit", "1"]) == 0
    output = capsys.readouterr().out
    assert output.startswith(f"{s3_bucket}/data/train-01.tfrecord: 11 records (tf.train.Example)")
    assert '"label": [1000]' in output
    assert cli.main(["records", "inspect", f"{s3_bucket}/data/missing.tfrecord"]) == 2
    assert f"{s3_bucket}/data/missing.tfrecord" in capsys.readouterr().err


# --------------------------------------------------------------------------- local paths stay as they were


def test_local_paths_never_load_fsspec(tmp_path):
    _write_files(tmp_path, count=2)
    script = (
        "import sys\n"
        "from torchestimator.data.tfrecord import read_records\n"
        "from torchestimator.data.tfrecord_dataset import TFRecordDataset\n"
        f"assert len(list(read_records({str(tmp_path / '*.tfrecord')!r}))) == 81\n"
        f"dataset = TFRecordDataset({str(tmp_path / '*.tfrecord')!r}, shuffle_buffer_size=5, batch_size=4,"
        " collate_fn=list)\n"
        "assert sum(map(len, dataset)) == 81\n"
        f"assert len(list(read_records('file://' + {str(tmp_path / 'train-00.tfrecord')!r}))) == 40\n"
        "assert 'fsspec' not in sys.modules, 'fsspec was imported for local files'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def test_convert_reads_its_csv_and_images_from_a_store_and_writes_shards_there(s3_bucket):
    images = {f"{s3_bucket}/data/images/{index}.png": bytes([index]) * (10 + index) for index in range(5)}
    for url, content in images.items():
        filesystems.write_bytes(url, content)
    rows = [
        "label,path,weight",
        *(f"{index % 2},images/{index}.png,{index / 4}" for index in range(4)),
        f"1,{s3_bucket}/data/images/4.png,2.5",
    ]  # a relative path, or a URL as it is
    filesystems.write_bytes(f"{s3_bucket}/data/index.csv", "\n".join(rows).encode())
    out = f"{s3_bucket}/out/train"
    assert (
        cli.main(
            ["convert", "csv-to-tfrecord", f"{s3_bucket}/data/index.csv", out, "--num_shards", "2", "--no_progress"]
        )
        == 0
    )
    shards = list_files(f"{out}-*")
    assert shards == [f"{out}-00000-of-00002.tfrecord", f"{out}-00001-of-00002.tfrecord"]
    dataset = TFRecordDataset(
        shards, features={"image": FixedLenFeature([], "string"), "weight": FixedLenFeature([], "float")}, batch_size=5
    )
    (batch,) = list(dataset)
    assert batch["image"].tolist() == list(images.values())
    assert batch["weight"].tolist() == [0.0, 0.25, 0.5, 0.75, 2.5]
    filesystems.write_bytes(f"{s3_bucket}/data/index.csv", b"label,path\n0,images/0.png\n1,images/missing.png\n")
    assert (
        cli.main(["convert", "csv-to-tfrecord", f"{s3_bucket}/data/index.csv", f"{s3_bucket}/out2/x", "--no_progress"])
        == 2
    )
    assert not filesystems.exists(f"{s3_bucket}/out2/x-00000-of-00001.tfrecord")


def test_a_conversion_failing_in_its_second_shard_leaves_no_shard_in_the_store(s3_bucket, tmp_path):
    Image = pytest.importorskip("PIL.Image")  # --image_mode raw decodes
    png = tmp_path / "ok.png"
    Image.new("L", (2, 3)).save(png)
    filesystems.write_bytes(f"{s3_bucket}/data/ok.png", png.read_bytes())
    filesystems.write_bytes(f"{s3_bucket}/data/bad.png", b"not a png")
    filesystems.write_bytes(f"{s3_bucket}/data/index.csv", b"label,path\n0,ok.png\n1,bad.png\n")
    assert (
        cli.main(
            [
                "convert",
                "csv-to-tfrecord",
                f"{s3_bucket}/data/index.csv",
                f"{s3_bucket}/out/x",
                "--num_shards",
                "2",
                "--image_mode",
                "raw",
                "--no_progress",
            ]
        )
        == 2
    )
    assert not filesystems.exists(f"{s3_bucket}/out")  # the finished first shard removed, the second never published
