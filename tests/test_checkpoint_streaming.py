"""Checkpoints streamed to disk (issue 14): files written from the tensors' memory and hashed on the way, read
back tensor by tensor and verified while reading, the manifest as the index; and a model_dir written by the
previous version (torchestimator 4ffab83, before streaming) still lists, restores and is written to."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
import threading
import time
import zlib

import google_crc32c
import pytest
import safetensors.torch
import torch

from torchestimator.checkpoint import CheckpointError, CheckpointStore, InMemoryStorage, format as checkpoint_format
from torchestimator.checkpoint.hashing import OverlappedChecksums
from torchestimator.checkpoint.tensor_files import encode_tensors

# A model_dir saved by the previous version's CheckpointStore (git show 4ffab83:src/torchestimator/checkpoint/*):
# keep_checkpoint_max=2, steps 1, 2, 3 saved at clock 1000, 2000, 3000 (ckpt-2 and ckpt-3 kept), each with
# fixture_state(step), a tar.gz. Its manifest is indented JSON, as that version wrote it.
PREVIOUS_VERSION_MODEL_DIR = (
    "H4sIAE0gD2sC/+1a227bRhBV2pfAT/0Egs+qs/dLnuIWDVCgQD7AEtS9WmpkUSBpN2kgoI/9hH5OPq27JHW13CSuLantHliidsid"
    "2QtnZufA14V105GdlC96TwYQwCltrgG71z2/OQe4l9HeAXBT1aoMJnv/T1yv9t+MnXk7Lyaz+in2nxFy7/5Tyrf3H0LOSC8Daf+f"
    "HB/OstwX5bWqR7eurCbFLH+ZwX6QTlXtqjq08vBa1N/iPArXL0kV7lyeZVlQkGV5Vbt5EKB+0/LF1Lpy1RXlrbhSt25UT65dfDJs"
    "9Dlo5fPSVa68dTbIvZpWLkgX/V3deK9uvEc3/pTus2wYJ6Pb+V02jXFxU1YjNTPjImqHSx15NVaIsmiQMqA5cZ57CbAAWmpNLSCI"
    "Q+Wo9pA6ygzimGLrtbWGe80dxRQghTiiID9bnLL/N1v14hTiPwyrn+L/cfbfvatLdV4p72o3q4qyevr4jxDa2X9CwiXF/wPgj2Ue"
    "yEeja1crq2o1GuUvP3RZIX+Zz+u8nxdlE3Xzy0HevCGXg8Egv1bV23gdhr980V/eaeVBFLTY+v08xOT8uzdvfgpqQjCNzUs07OeN"
    "qcL7ysVkcgn6aLhYPOslHNX/G8Fh/Z9htuv/mLHk/4fAz8++2P+n6r0rz391k6txPcj72VKiJ6pq26a4mXW3xmrqu+iwfmozMLxm"
    "5FNxAbJh6N4o3ez541bPux0h6yMyXBluB7xlGqNN0318VwcifSKijjiPrXj2GrKNznu6EtGnwfwia9At96vu+vGr7W0I8t/D52O8"
    "f9HrZRdB8mr19CH9v5iHU/Tkt7Bgv1TF7CD1H+O7/o85hsn/j1b/xTIur0sXi6lYg+Wrl6ITxKIslIfLVhaCh52YOgaOpigM6C5Z"
    "W4dlXTGXbRR0K0Hs3iabRsHa2qixEkLOShJCSWg24vgTtC03jyFmqW7RX1ly7+YjdXv1iMY6jVv2zrauw7PV96KrQVWprkdXZXEz"
    "r1YL1A0on8Y1BeewG3T78PqxsICbahsbw7aGXTxGOfk3/v9oZ4BP+z/Z8X+KIUr+fwj8+eX5/47HDDZ9ZtB4zWDpN4Ol5ww6R23L"
    "hXg0eLCepQ9uVB4PDBn3Hgb2HUOas8TDw8WXHTxIH4l4eOjODPd9Ht//m/E/Xu7/DP+HFO3yvxggnPz/uPn/alpoNR1tMLttfb88"
    "E5RuPp0YtUpV3UngbrcoLWcbSTivi9KMY/K9uPjh+zaPdkk7n8zmN/VoXlSTuh3Lso9WddMHrfNg/IrcbdYQDqujyXZ+3+UkutwZ"
    "p+MnU1ctp3On7l0fdVYEsHUEOaiBRhhqxAzDThLrOFAQU0ed81I4gRizECqmIdWWeM084FQLDdiSqw7RIqgjkCyJ7nxv1t0zAkcF"
    "RhwzLzAxmCgtMEWKaokw1cZYQxQGmiJCDQQWCs48JFQYYZ014dbOCMi+EUTf32NaKq2Jt4YBYaC1AEiMFHcUQWcF1QxxyokWxAOi"
    "kdSGeAEgCquktA8LxHdNs5XpO5TjvokbFabCMOEeurCyGGvBw9orp6XHxjDmgLZhLERYDqh2QkqLGRHYCmSw2LYOW+vde9CEvNHa"
    "lpYKcGm9p9wY7wWzWIUYhYTyNkzUeysJll5axQDW0mnssdVEOKwcAlqcIs//mfEfnwz/TxL/f5T9PxX+P9X/if9POLz/nwr/z5P/"
    "J/7/v8b/P+9q9ucfv96m/zvu/5uL8Dt85hevGhzB/0+F/0/8X+L/E/9/aP4fnwz/n/i/xP8n/j9rzwb3fZ7A/0+F/0///31S/D9+"
    "GP+PH53/x0fk/xF0wKLwLZQW1GKjoAdGCSm8lZpJKqRS1nKjAKCYS+6oMsgzQYR3BNF/zv8Dzqw2jCsEiICGhmEQ6bhFlntCpdWc"
    "aQG91po7x5H1lElAFVFYOqSFTPz/Z/D/HAhARfzXfYI10QwCJJUNEwI6LDuQJqwshpoYCkKhwqWigIR3QXqCCRT4X8X/JyQkJCQk"
    "JCQkJCQkJCQkJCQkJCQkJCQkJPy38BdCNtSaAFAAAA=="
)


def fixture_state(step: int) -> tuple[dict, dict, dict]:
    """(model, optimizer tree, extra) as the fixture was saved, for a step."""
    model = {
        "layer.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) * step,
        "layer.bias": torch.tensor([step, -step], dtype=torch.float64),
        "count": torch.tensor(step, dtype=torch.int64),
        "half": torch.full((3,), step, dtype=torch.bfloat16),
    }
    optimizer = {
        "optimizer": {
            "state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.ones(2, 3) * step}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        }
    }
    extra = {
        "replicas": [{"global_step": step, "rng": {"torch": "AAEC"}, "input_position": {"batch": step}}],
        "mask": torch.tensor([True, False]),
    }
    return model, optimizer, extra


@pytest.fixture
def previous_model_dir(tmp_path):
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode("".join(PREVIOUS_VERSION_MODEL_DIR))), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "model_dir"


def assert_state_equal(checkpoint, step: int) -> None:
    model, optimizer, extra = fixture_state(step)
    assert list(checkpoint.model_state) == list(model)  # the saved order
    for name, tensor in model.items():
        assert checkpoint.model_state[name].dtype == tensor.dtype and torch.equal(checkpoint.model_state[name], tensor)
    restored = checkpoint.optimizer_state["optimizer"]
    assert restored["param_groups"] == optimizer["optimizer"]["param_groups"]
    assert torch.equal(restored["state"][0]["exp_avg"], optimizer["optimizer"]["state"][0]["exp_avg"])
    assert checkpoint.extra["replicas"] == extra["replicas"] and torch.equal(checkpoint.extra["mask"], extra["mask"])


# ------------------------------------------------------------- the previous version's model_dir


def test_a_model_dir_of_the_previous_version_lists_and_restores(previous_model_dir):
    store = CheckpointStore(previous_model_dir, keep_checkpoint_max=2)
    assert [entry["step"] for entry in store.history()] == [2, 3]
    assert [entry["save_time"] for entry in store.history()] == [2000.0, 3000.0]
    assert store.latest_checkpoint() == str(previous_model_dir / "ckpt-3")
    assert_state_equal(store.restore(), 3)
    assert_state_equal(store.restore(str(previous_model_dir / "ckpt-2")), 2)
    assert [name for name, _, _ in store.list_variables()] == ["count", "half", "layer.bias", "layer.weight"]


def test_the_new_writer_continues_a_model_dir_of_the_previous_version(previous_model_dir):
    store = CheckpointStore(previous_model_dir, keep_checkpoint_max=2, clock=lambda: 4000.0)
    store.save(4, *fixture_state(4))
    assert [entry["step"] for entry in store.history()] == [3, 4]  # retention went on from the old manifest
    assert not (previous_model_dir / "ckpt-2").exists()
    assert [entry["save_time"] for entry in CheckpointStore(previous_model_dir).history()] == [3000.0, 4000.0]
    assert_state_equal(CheckpointStore(previous_model_dir).restore(), 4)


def test_new_checkpoint_files_are_those_of_the_previous_version_plus_a_crc32c(previous_model_dir, tmp_path):
    """The previous reader reads what the new writer writes: every file but state.json has the same bytes, and
    state.json differs only by each file's added crc32c (the previous reader checks sha256 and size, which stay)."""
    store = CheckpointStore(tmp_path / "new")
    store.save(3, *fixture_state(3))
    old, new = previous_model_dir / "ckpt-3", tmp_path / "new" / "ckpt-3"
    assert sorted(os.listdir(new)) == sorted(os.listdir(old))
    for name in os.listdir(old):
        if name != checkpoint_format.STATE_FILE:
            assert (new / name).read_bytes() == (old / name).read_bytes(), name
    old_state, new_state = (json.loads((folder / checkpoint_format.STATE_FILE).read_bytes()) for folder in (old, new))
    for name, entry in new_state["files"].items():
        assert entry.pop("crc32c") == google_crc32c.value((new / name).read_bytes())
    assert {key: value for key, value in new_state.items() if key != "state_sha256"} == {
        key: value for key, value in old_state.items() if key != "state_sha256"
    }


def test_the_compact_manifest_keeps_the_previous_versions_shape_and_seal(tmp_path):
    store = CheckpointStore(tmp_path, clock=lambda: 5.0)
    store.save(1, *fixture_state(1))
    data = (tmp_path / "checkpoint").read_bytes()
    manifest = json.loads(data)
    assert b"\n" not in data and manifest["checkpoints"] == [
        {"step": 1, "folder": "ckpt-1", "save_time": 5.0, "preserved": False}
    ]
    assert checkpoint_format.seal_fault(data, manifest, "sha256") is None  # what the previous reader checks


def test_a_manifest_built_from_kept_entry_texts_is_the_one_json_would_write(tmp_path):
    """The store re-encodes only the newest entry; the bytes must be those of encoding the whole document, through
    saves that append, replace a step, delete by retention and mark best ones."""
    clock = iter(float(second) for second in range(1000, 2000))
    store = CheckpointStore(tmp_path, keep_checkpoint_max=3, clock=lambda: next(clock))
    for step in (1, 2, 3, 4, 5, 3, 6):  # 3 again: an older step saved anew lands in its place
        store.save(step, {"weight": torch.full((2,), float(step))})
        if step == 2:
            store.mark_best([2])
        data = (tmp_path / "checkpoint").read_bytes()
        manifest = json.loads(data)
        manifest.pop("sha256")
        assert data == checkpoint_format.sealed_json(manifest, "sha256", compact=True), step
    assert [item["step"] for item in json.loads(data)["checkpoints"]] == [2, 4, 5, 6]  # 2 is best: kept
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-2", "ckpt-4", "ckpt-5", "ckpt-6"]


def test_sealed_json_with_encoded_values_gives_the_same_bytes():
    document = {"format_version": 1, "checkpoints": [{"step": 1, "folder": "ckpt-1", "save_time": 1.5}], "best": []}
    encoded = {"checkpoints": json.dumps(document["checkpoints"])}
    assert checkpoint_format.sealed_json(
        document, "sha256", compact=True, encoded=encoded
    ) == checkpoint_format.sealed_json(document, "sha256", compact=True)


# ------------------------------------------------------------- streamed writing and reading

BIG = 3 * (1 << 20) + 17  # float32 elements: 12 MB, more than one 8 MB piece, not a multiple of it


def big_state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "embedding": torch.randn(BIG, generator=generator),
        "small": torch.arange(5, dtype=torch.int16),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }


def test_large_tensors_round_trip_and_the_safetensors_library_reads_the_file(tmp_path):
    state = big_state(0)
    store = CheckpointStore(tmp_path)
    path = store.save(1, state)
    restored = store.restore().model_state
    assert list(restored) == list(state)
    assert all(torch.equal(restored[name], state[name]) for name in state)
    other_tool = safetensors.torch.load_file(os.path.join(path, checkpoint_format.MODEL_FILE))
    assert all(torch.equal(other_tool[name], state[name]) for name in state)


@pytest.mark.parametrize("offset", [5, -3, 8 << 20, (8 << 20) + 1000], ids=["header", "end", "piece-edge", "2nd-piece"])
def test_a_flipped_byte_anywhere_is_found_while_reading(tmp_path, offset, caplog):
    store = CheckpointStore(tmp_path)
    store.save(1, big_state(1))
    path = store.save(2, big_state(2))
    model_file = os.path.join(path, checkpoint_format.MODEL_FILE)
    with open(model_file, "r+b") as stream:
        stream.seek(offset, 0 if offset >= 0 else 2)
        byte = stream.read(1)
        stream.seek(-1, 1)
        stream.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CheckpointError, match=rf"{model_file} fails its checksum"):
        store.restore(path)
    assert store.restore().step == 1  # falls back past it
    if offset == 5:  # the header's length: unreadable even unchecked
        with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
            store.restore(path, verify=False)
    else:  # verify=False reads the damaged values as they are
        unverified = store.restore(path, verify=False).model_state
        assert not all(torch.equal(unverified[name], tensor) for name, tensor in big_state(2).items())


def _record_only(path: str, kind: str) -> None:
    """Rewrite state.json as an earlier writer left it: only sha256 (before streaming), or crc32 instead of
    crc32c (the first streaming version), resealed."""
    state_file = os.path.join(path, checkpoint_format.STATE_FILE)
    with open(state_file, "rb") as stream:
        state = json.load(stream)
    for name, entry in state["files"].items():
        del entry["crc32c"]
        if kind == "crc32":
            with open(os.path.join(path, name), "rb") as stream:
                entry["crc32"] = zlib.crc32(stream.read())
    with open(state_file, "wb") as stream:
        stream.write(checkpoint_format.sealed_json(state, checkpoint_format.STATE_CHECKSUM_KEY))


@pytest.mark.parametrize("kind", ["crc32c", "crc32", "sha256"])
def test_each_recorded_checksum_kind_verifies_and_finds_a_flipped_byte(tmp_path, kind):
    store = CheckpointStore(tmp_path)
    path = store.save(1, big_state(1))
    if kind != "crc32c":
        _record_only(path, kind)
    assert all(torch.equal(store.restore(path).model_state[name], big_state(1)[name]) for name in big_state(1))
    model_file = os.path.join(path, checkpoint_format.MODEL_FILE)
    with open(model_file, "r+b") as stream:
        stream.seek(-100, 2)
        byte = stream.read(1)
        stream.seek(-1, 1)
        stream.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointError, match=rf"{model_file} fails its checksum: {kind} is "):
        store.restore(path)


def test_a_file_of_the_wrong_size_is_refused_before_reading(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(1, big_state(1))
    model_file = os.path.join(path, checkpoint_format.MODEL_FILE)
    os.truncate(model_file, os.path.getsize(model_file) - 1)
    with pytest.raises(CheckpointError, match=r"bytes; state.json expects .* \(truncated or overwritten\)"):
        store.restore(path, verify=False)


def _peak_resident_growth(action) -> float:
    """Peak RSS above the start while ``action`` runs, in MB (sampled every millisecond)."""

    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    stop, peak, baseline = threading.Event(), [0], resident()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], resident())
            stop.wait(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        action()
    finally:
        stop.set()
        sampler.join(timeout=30)
    return (max(peak[0], resident()) - baseline) / 1e6


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc")
def test_a_save_makes_no_copy_of_the_state_and_a_restore_only_the_tensors(tmp_path):
    state = {f"layer{index}": torch.randn(4 << 20) for index in range(4)}  # 64 MB
    store = CheckpointStore(tmp_path)
    store.save(1, state)  # warms the allocator and the imports
    assert _peak_resident_growth(lambda: store.save(2, state)) < 16  # the old writer held two copies: +128 MB
    result = {}
    growth = _peak_resident_growth(lambda: result.update(checkpoint=store.restore()))
    assert (
        growth < 64 + 16
    )  # at most the restored tensors themselves: no file-sized buffer beside them (+128 MB before)
    assert all(torch.equal(result["checkpoint"].model_state[name], state[name]) for name in state)


def test_the_storage_receives_views_of_the_tensors_not_copies():
    state = {"weight": torch.randn(1 << 20)}

    class Recording(InMemoryStorage):
        chunks: list = []

        def write_file(self, folder, filename, data):
            if filename == checkpoint_format.MODEL_FILE:
                data = list(data)
                Recording.chunks = data
            super().write_file(folder, filename, data)

    store = CheckpointStore(Recording())
    store.save(1, state)
    views = [chunk for chunk in Recording.chunks if isinstance(chunk, memoryview)]
    address = state["weight"].data_ptr()
    assert views and torch.frombuffer(views[0], dtype=torch.uint8).data_ptr() == address


def test_a_storage_that_stops_consuming_is_an_error_and_publishes_nothing():
    class Lazy(InMemoryStorage):
        def write_file(self, folder, filename, data):
            if not isinstance(data, bytes):
                data = next(iter(data))  # the header only
            super().write_file(folder, filename, data)

    store = CheckpointStore(Lazy())
    with pytest.raises(CheckpointError, match=r"returned before writing all of model\.safetensors"):
        store.save(1, {"weight": torch.ones(3)})
    assert store.all_checkpoints() == []


def test_overlapped_checksums_are_those_of_the_buffers_in_order():
    tensor_bytes = memoryview(torch.arange(700_000, dtype=torch.int32).view(torch.uint8).numpy()).cast("B")
    buffers = [b"x" * 10, memoryview(bytes(range(256)) * 9000), b"", b"tail" * 3, bytearray(3 << 20), tensor_bytes]
    joined = b"".join(bytes(buffer) for buffer in buffers)
    with OverlappedChecksums() as checksums:
        assert list(checksums.passing(buffers)) == buffers
        assert checksums.result() == {
            "sha256": hashlib.sha256(joined).hexdigest(),
            "crc32c": google_crc32c.value(joined),
            "size": len(joined),
        }
    with OverlappedChecksums(["crc32", "crc32c"]) as checksums:
        checksums.update(joined)
        assert checksums.result() == {
            "crc32": zlib.crc32(joined),
            "crc32c": google_crc32c.value(joined),
            "size": len(joined),
        }


def test_encoded_files_join_to_what_the_store_writes():
    tensors = big_state(3)
    encoded = encode_tensors(tensors, "model_state")
    joined = encoded.to_bytes()
    assert len(joined) == encoded.size
    assert all(torch.equal(safetensors.torch.load(joined)[name], tensors[name]) for name in tensors)


# ------------------------------------------------------------- the manifest is the index


class CountingStorage(InMemoryStorage):
    """Counts the state.json files read."""

    def __init__(self) -> None:
        super().__init__()
        self.state_reads: list[str] = []

    def read_file(self, folder, filename, start=0, length=None):
        if filename == checkpoint_format.STATE_FILE:
            self.state_reads.append(folder)
        return super().read_file(folder, filename, start, length)


def test_listing_and_saving_read_no_checkpoints_state_json(caplog):
    storage = CountingStorage()
    store = CheckpointStore(storage, keep_checkpoint_max=None)
    for step in range(1, 41):
        store.save(step, {"weight": torch.full((2,), float(step))}, extra={"rng": "x" * 1000})
    storage.state_reads.clear()
    store.save(41, {"weight": torch.ones(2)})
    assert storage.state_reads == []  # a save reads none
    assert [entry["step"] for entry in store.history()][-3:] == [39, 40, 41]
    assert len(store.all_checkpoints()) == 41
    assert store.latest_checkpoint().endswith("ckpt-41")
    assert storage.state_reads == ["ckpt-41"] * 3  # each listing checks the newest only


def test_latest_checkpoint_skips_a_damaged_newest_and_a_lost_manifest_is_rebuilt_by_reading_each(caplog):
    storage = CountingStorage()
    store = CheckpointStore(storage, keep_checkpoint_max=None)
    for step in (1, 2, 3):
        store.save(step, {"weight": torch.full((2,), float(step))})
    storage.folders["ckpt-3"][checkpoint_format.STATE_FILE] = b"{damaged"
    storage.state_reads.clear()
    assert store.latest_checkpoint().endswith("ckpt-2") and storage.state_reads == ["ckpt-3", "ckpt-2"]
    assert "ckpt-3" in caplog.text and "not valid JSON" in caplog.text
    storage.manifest = None
    storage.state_reads.clear()
    assert [entry["step"] for entry in store.history()] == [1, 2]  # scanned: ckpt-3 is refused
    assert sorted(set(storage.state_reads)) == ["ckpt-1", "ckpt-2", "ckpt-3"]


@pytest.mark.slow
def test_one_save_costs_the_same_at_10_and_at_200_checkpoints(tmp_path):
    """The time of a save does not grow with the checkpoints kept (it read every state.json: 17x at 1000)."""

    def save_times(model_dir, count: int) -> list[float]:
        store = CheckpointStore(model_dir, keep_checkpoint_max=count)
        state = {"weight": torch.ones(16)}
        extra = {"rng": ["x" * 64] * 300}  # ~20 KB of state.json, as the generator states make it
        for step in range(1, count + 1):
            store.save(step, state, extra=extra)
        times = []
        for step in range(count + 1, count + 8):
            start = time.process_time()  # CPU time: the machine is shared, the fsyncs wait on the disk alike
            store.save(step, state, extra=extra)
            times.append(time.process_time() - start)
        return sorted(times)[len(times) // 2]

    few, many = save_times(tmp_path / "few", 10), save_times(tmp_path / "many", 200)
    assert many < 2.5 * few + 0.002, (few, many)


# ------------------------------------------------------------- single-file saves in the background


class _GatedStore(CheckpointStore):
    """A store whose saves wait for ``gate`` (the background write is still pending while it is closed)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def save(self, *args, **kwargs):
        assert self.gate.wait(60), "the test never opened the gate"
        return super().save(*args, **kwargs)


def _training_parts():
    from torch import nn

    from torchestimator._train_state import TrainState
    from torchestimator.checkpoint.parts import TrainingParts

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    return TrainingParts(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01), train_state=TrainState())


def _train_step(parts) -> None:
    parts.model(torch.randn(5, 4)).pow(2).mean().backward()
    parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    parts.train_state.global_step += 1


def test_one_process_saves_in_the_background_from_a_copy_taken_at_the_save(tmp_path):
    from torchestimator.checkpoint.checkpointer import Checkpointer
    from torchestimator.distribute import OneDeviceStrategy
    from torchestimator.hooks.base import CheckpointSaverListener

    class Heard(CheckpointSaverListener):
        saved: list = []

        def after_save(self, state, global_step):
            Heard.saved.append(global_step)

    strategy = OneDeviceStrategy("cpu")
    strategy.setup()
    store = _GatedStore(tmp_path, keep_checkpoint_max=None)
    checkpointer = Checkpointer(store, strategy, listeners=[Heard()], asynchronous=True)
    assert checkpointer.asynchronous
    parts = _training_parts()
    _train_step(parts)
    at_save = {name: tensor.clone() for name, tensor in parts.model.state_dict().items()}
    exp_avg_at_save = parts.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    checkpointer.save(parts)  # returns while the write waits at the closed gate: the loop goes on
    assert checkpointer.published_step is None and not (tmp_path / "ckpt-1").exists() and Heard.saved == []
    _train_step(parts)  # the live tensors change in place; the save holds its copy
    store.gate.set()
    checkpointer.save(parts)  # publishes step 1 first: one save in flight
    assert Heard.saved == [1] and (tmp_path / "ckpt-1").is_dir()
    checkpointer.close()
    assert Heard.saved == [1, 2] and checkpointer.published_step == 2
    first = store.restore(str(tmp_path / "ckpt-1"))
    assert all(torch.equal(first.model_state[name], at_save[name]) for name in at_save)
    assert torch.equal(first.optimizer_state["optimizer"]["state"][0]["exp_avg"], exp_avg_at_save)
    assert not torch.equal(first.model_state["0.weight"], parts.model.state_dict()["0.weight"])
    assert torch.equal(store.restore().model_state["0.weight"], parts.model.state_dict()["0.weight"])


def test_a_failed_background_save_is_raised_at_the_next_save_and_leaves_no_folder(tmp_path):
    import errno

    from torchestimator.checkpoint import DiskFullError
    from torchestimator.checkpoint.background import BackgroundSaves
    from torchestimator.checkpoint.storage import LocalStorage

    class Full(LocalStorage):
        def write_file(self, folder, filename, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    saves = BackgroundSaves(CheckpointStore(Full(str(tmp_path))))
    saves.save(1, {"weight": torch.ones(3)})
    with pytest.raises(DiskFullError, match="checkpoint of step 1"):
        saves.wait()
    saves.save(2, {"weight": torch.ones(3)})
    with pytest.raises(DiskFullError, match="checkpoint of step 2"):
        saves.close()
    assert not [name for name in os.listdir(tmp_path) if "ckpt-" in name]
    with pytest.raises(RuntimeError, match="closed"):
        saves.save(3, {"weight": torch.ones(3)})


def test_background_saves_of_several_processes_need_dcp():
    from torchestimator.checkpoint.checkpointer import Checkpointer

    class TwoReplicas:
        num_replicas = 2

    with pytest.raises(ValueError, match="need sharded=True \\(2 replicas here\\)"):
        Checkpointer(CheckpointStore(InMemoryStorage()), TwoReplicas(), asynchronous=True)


# ------------------------------------------------------------- fixed costs of a save


def test_plain_lists_and_tuples_are_taken_whole_and_the_rest_item_by_item(tmp_path):
    import enum
    import random

    class Level(enum.IntEnum):
        HIGH = 7

    extra = {
        "python": random.getstate(),
        "ints": list(range(700)),
        "mixed": [1, "a", None, True, (2, 3)],
        "floats": [0.5, float("nan"), -0.0],
        "enum": [Level.HIGH],
        "tensor": [1, torch.ones(2)],
    }
    store = CheckpointStore(tmp_path)
    store.save(1, {"weight": torch.ones(2)}, extra=extra)
    restored = store.restore().extra
    assert restored["python"] == random.getstate() and type(restored["python"][1]) is tuple
    assert restored["ints"] == list(range(700)) and restored["mixed"] == [1, "a", None, True, (2, 3)]
    assert restored["floats"][0] == 0.5 and restored["floats"][1] != restored["floats"][1]
    assert str(restored["floats"][2]) == "-0.0"
    assert restored["enum"] == [7] and type(restored["enum"][0]) is int
    assert restored["tensor"][0] == 1 and torch.equal(restored["tensor"][1], torch.ones(2))


def test_state_json_has_one_top_level_key_per_line_and_its_seal(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(1, {"weight": torch.ones(2)}, extra={"rng": list(range(50))})
    data = open(os.path.join(path, checkpoint_format.STATE_FILE), "rb").read()
    state = json.loads(data)
    assert data.count(b"\n") == len(state) + 1  # "{", a line per key, "}"
    assert checkpoint_format.seal_fault(data, state, checkpoint_format.STATE_CHECKSUM_KEY) is None


def test_saves_reuse_the_checksum_threads(tmp_path):
    store = CheckpointStore(tmp_path)
    for step in range(1, 4):
        store.save(step, big_state(step))
    kinds = [thread.name.split("_")[0] for thread in threading.enumerate() if thread.name.startswith("checkpoint-")]
    assert {"checkpoint-crc32c", "checkpoint-sha256"} <= set(kinds)
    assert len(kinds) == len(set(kinds))  # one thread per kind, however many files and saves


def test_a_local_save_lists_the_folders_beside_its_writes_and_still_sees_changes_made_by_hand(tmp_path, caplog):
    store = CheckpointStore(tmp_path, keep_checkpoint_max=None)
    listed_on = []
    list_folders = store.storage.list_folders

    def recording_list_folders():
        listed_on.append(threading.current_thread().name)
        return list_folders()

    store.save(1, {"weight": torch.ones(2)})  # the first also clears leftovers and finds no manifest yet
    store.storage.list_folders = recording_list_folders
    for step in (2, 3):
        store.save(step, {"weight": torch.full((2,), float(step))})
    assert [name.split("_")[0] for name in listed_on] == ["checkpoint-listing"] * 2  # one listing a save, behind
    import shutil

    shutil.rmtree(tmp_path / "ckpt-2")  # by hand, between saves
    store.save(4, {"weight": torch.zeros(2)})
    assert [item["step"] for item in json.loads((tmp_path / "checkpoint").read_bytes())["checkpoints"]] == [1, 3, 4]
    assert "ckpt-2, but the folder is missing" in caplog.text
