"""Weight sources for our checkpoints, torch state_dict files and safetensors."""

from __future__ import annotations

import os

import numpy
import pytest
import safetensors.torch
import torch

from torchestimator.checkpoint import CheckpointStore
from torchestimator.interop import torch_sources
from torchestimator.interop.source import TensorInfo, TensorNotFoundError, WeightSourceError
from torchestimator.interop.torch_sources import (
    is_safetensors,
    is_torch,
    is_torchestimator,
    open_safetensors,
    open_torch,
    open_torchestimator,
)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))


class Opaque:
    """Anything torch would have to unpickle as an object."""


# ------------------------------------------------------------ our checkpoints


def save_two_checkpoints(model_dir: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    store = CheckpointStore(model_dir)
    first = {k: v.clone() for k, v in model.state_dict().items()}
    store.save(10, first, {"optimizer": optimizer.state_dict()})
    with torch.no_grad():
        model[0].weight.add_(1.0)
    second = {k: v.clone() for k, v in model.state_dict().items()}
    store.save(20, second, {"optimizer": optimizer.state_dict()})
    return first, second


def test_model_dir_reads_latest_checkpoint_without_optimizer_state(tmp_path) -> None:
    _, latest = save_two_checkpoints(str(tmp_path))
    assert is_torchestimator(tmp_path)
    with open_torchestimator(tmp_path) as source:
        assert source.format == "torchestimator" and source.step == 20
        infos = source.tensors()
        assert [info.name for info in infos] == sorted(latest)
        assert TensorInfo("0.weight", (4, 3), "float32") in infos
        assert TensorInfo("1.num_batches_tracked", (), "int64") in infos
        assert not any("exp_avg" in info.name or "optimizer" in info.name for info in infos)
        numpy.testing.assert_array_equal(source.read("0.weight"), latest["0.weight"].numpy())
        assert set(source.read_all()) == set(latest)


def test_explicit_checkpoint_folder(tmp_path) -> None:
    first, _ = save_two_checkpoints(str(tmp_path))
    folder = tmp_path / "ckpt-10"
    assert is_torchestimator(folder)
    source = open_torchestimator(folder)
    assert source.step == 10
    numpy.testing.assert_array_equal(source.read("0.weight"), first["0.weight"].numpy())
    with pytest.raises(TensorNotFoundError, match=r"no tensor named '0\.wieght'.*Nearest names: 0\.weight"):
        source.read("0.wieght")


def test_our_checkpoint_errors(tmp_path) -> None:
    with pytest.raises(WeightSourceError, match="no such file or directory"):
        open_torchestimator(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    assert not is_torchestimator(tmp_path / "empty")
    with pytest.raises(WeightSourceError, match="holds no checkpoint"):
        open_torchestimator(tmp_path / "empty")
    save_two_checkpoints(str(tmp_path / "run"))
    model_file = tmp_path / "run" / "ckpt-20" / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[-1] ^= 0xFF
    model_file.write_bytes(bytes(data))
    source = open_torchestimator(tmp_path / "run")
    with pytest.raises(WeightSourceError, match=r"ckpt-20.*checksum"):
        source.read("0.weight")


# ---------------------------------------------------------- torch state dicts


def test_plain_state_dict(tmp_path) -> None:
    state = make_model().state_dict()
    path = tmp_path / "weights.pth"
    torch.save(state, path)
    assert is_torch(path)
    source = open_torch(path)
    assert source.format == "torch" and source.key is None and source.notes == []
    assert [info.name for info in source.tensors()] == sorted(state)
    numpy.testing.assert_array_equal(source.read("2.bias"), state["2.bias"].numpy())


def test_lightning_and_training_script_layouts_are_reduced_and_reported(tmp_path) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    lightning = {"state_dict": model.state_dict(), "epoch": 3, "optimizer_states": [optimizer.state_dict()]}
    torch.save(lightning, tmp_path / "lightning.ckpt")
    source = open_torch(tmp_path / "lightning.ckpt")
    assert source.key == "state_dict"
    assert [info.name for info in source.tensors()] == sorted(model.state_dict())
    assert "under 'state_dict'" in source.notes[0] and "optimizer_states" in source.notes[0]

    script = {"model": model.state_dict(), "ema": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7}
    torch.save(script, tmp_path / "script.pt")
    source = open_torch(tmp_path / "script.pt")
    assert source.key == "model"
    assert "0.weight" in {info.name for info in source.tensors()}
    chosen = open_torch(tmp_path / "script.pt", key="ema")
    assert chosen.key == "ema" and "as requested" in chosen.notes[0]


def test_several_state_dicts_without_a_preferred_key_are_flattened(tmp_path) -> None:
    torch.save({"student": {"w": torch.ones(2)}, "teacher": {"w": torch.zeros(2)}, "tag": "x"}, tmp_path / "two.pt")
    source = open_torch(tmp_path / "two.pt")
    assert source.key is None
    assert [info.name for info in source.tensors()] == ["student.w", "teacher.w"]
    assert "No single state dict" in source.notes[0] and "key=" in source.notes[0]
    assert any("non-tensor" in note and "tag" in note for note in source.notes)
    with pytest.raises(WeightSourceError, match=r"key='model' is not a dict in the file; .*'student', 'teacher'"):
        open_torch(tmp_path / "two.pt", key="model")


def test_legacy_torch_format_loads_without_mmap(tmp_path) -> None:
    path = tmp_path / "legacy.bin"
    torch.save({"w": torch.arange(3.0)}, path, _use_new_zipfile_serialization=False)
    assert is_torch(path)
    numpy.testing.assert_array_equal(open_torch(path).read("w"), [0.0, 1.0, 2.0])
    unnamed = tmp_path / "legacy"
    unnamed.write_bytes(path.read_bytes())
    assert is_torch(unnamed)  # recognised by torch's magic number, not the name


def test_file_with_arbitrary_objects_is_refused(tmp_path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"w": torch.ones(1), "config": Opaque()}, path)
    with pytest.raises(WeightSourceError) as caught:
        open_torch(path)
    message = str(caught.value)
    assert str(path) in message and "pickled objects beyond tensors" in message
    assert "Opaque" in message and "torch.save(model.state_dict(), path)" in message and "safetensors" in message


def test_torch_file_errors(tmp_path) -> None:
    with pytest.raises(WeightSourceError, match="no such file"):
        open_torch(tmp_path / "absent.pt")
    path = tmp_path / "weights.pt"
    torch.save(make_model().state_dict(), path)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[:300])
    with pytest.raises(WeightSourceError, match=r"truncated\.pt is not a readable PyTorch file"):
        open_torch(truncated)
    torch.save(torch.ones(3), tmp_path / "tensor.pt")
    with pytest.raises(WeightSourceError, match="holds a Tensor, not a dict of tensors"):
        open_torch(tmp_path / "tensor.pt")
    torch.save({}, tmp_path / "empty.pt")
    with pytest.raises(WeightSourceError, match="holds no tensors"):
        open_torch(tmp_path / "empty.pt")


def test_is_torch_detection(tmp_path) -> None:
    unnamed = tmp_path / "weights"
    torch.save({"w": torch.ones(1)}, unnamed)
    assert is_torch(unnamed)  # zip archive with data.pkl, no suffix needed
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert not is_torch(text)
    assert not is_torch(tmp_path / "absent.pt")
    assert not is_torch(tmp_path)


def test_bfloat16_is_widened_to_float32(tmp_path) -> None:
    torch.save({"w": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}, tmp_path / "half.pt")
    source = open_torch(tmp_path / "half.pt")
    assert source.tensors() == [TensorInfo("w", (2,), "bfloat16")]
    values = source.read("w")
    assert values.dtype == numpy.float32 and values.tolist() == [1.5, -2.0]


# ------------------------------------------------------------------ safetensors


def test_safetensors_header_and_values(tmp_path) -> None:
    tensors = {
        "dense.weight": torch.randn(2, 3),
        "dense.bias": torch.zeros(2),
        "emb": torch.ones(4, dtype=torch.bfloat16),
    }
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})
    assert is_safetensors(path)
    source = open_safetensors(path)
    assert source.format == "safetensors" and source.metadata == {"format": "pt"}
    assert source.tensors() == [
        TensorInfo("dense.bias", (2,), "float32"),
        TensorInfo("dense.weight", (2, 3), "float32"),
        TensorInfo("emb", (4,), "bfloat16"),
    ]
    numpy.testing.assert_array_equal(source.read("dense.weight"), tensors["dense.weight"].numpy())
    assert source.read("emb").dtype == numpy.float32
    with pytest.raises(TensorNotFoundError, match="Nearest names: dense.weight"):
        source.read("dense.weights")


def test_safetensors_detection_by_magic_and_errors(tmp_path) -> None:
    unnamed = tmp_path / "weights.data"
    safetensors.torch.save_file({"w": torch.ones(3)}, str(unnamed))
    assert is_safetensors(unnamed) and not is_torch(unnamed)
    text = tmp_path / "notes.txt"
    text.write_text("not a tensor file at all")
    assert not is_safetensors(text)
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(unnamed.read_bytes()[:-4])
    with pytest.raises(WeightSourceError, match=r"cut\.safetensors is not a readable safetensors file"):
        open_safetensors(truncated)
    with pytest.raises(WeightSourceError, match="no such file"):
        open_safetensors(tmp_path / "absent.safetensors")
    assert os.path.exists(unnamed)


def test_safetensors_file_is_opened_once_per_source(tmp_path, monkeypatch) -> None:
    # Re-opening per read re-parses the header each time: quadratic in the tensor count.
    path = tmp_path / "many.safetensors"
    safetensors.torch.save_file({f"t{index}": torch.full((2,), float(index)) for index in range(50)}, str(path))
    opened = []
    real_safe_open = torch_sources.safe_open
    monkeypatch.setattr(
        torch_sources, "safe_open", lambda *args, **kwargs: opened.append(args) or real_safe_open(*args, **kwargs)
    )
    with open_safetensors(path) as source:
        values = source.read_all()
    assert len(values) == 50 and float(values["t49"][0]) == 49.0
    assert len(opened) == 1
    with pytest.raises(WeightSourceError, match="the source is closed"):
        source.read("t0")


def test_warm_start_closes_the_safetensors_source_it_opened(tmp_path, monkeypatch) -> None:
    from torchestimator.warm_start import warm_start

    model = make_model()
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(model.state_dict(), str(path))
    closed = []
    real_close = torch_sources.SafetensorsSource.close
    monkeypatch.setattr(torch_sources.SafetensorsSource, "close", lambda self: closed.append(self) or real_close(self))
    warm_start(make_model(), str(path))
    assert len(closed) == 1
    with pytest.raises(ValueError):
        warm_start(torch.nn.Linear(7, 7), str(path))  # nothing matches: the plan fails, the file is closed anyway
    assert len(closed) == 2


def test_zero_stride_tensor_declaring_more_than_the_file_is_refused(tmp_path) -> None:
    # Four stored floats viewed as 2**20 (stride 0): reading would copy what the file only declares.
    path = tmp_path / "expanded.pt"
    torch.save({"w": torch.zeros(4)[:1].expand(1 << 20)}, path)
    with open_torch(path) as source:
        assert source.tensors()[0].shape == (1 << 20,)
        with pytest.raises(
            WeightSourceError,
            match=r"expanded\.pt: tensor 'w' of shape \[1048576\] would take "
            r"4194304 bytes, more than the whole file",
        ):
            source.read("w")


def test_a_plan_that_raises_while_being_built_still_closes_the_source(tmp_path, monkeypatch) -> None:
    from torchestimator import warm_start as warm_start_module
    from torchestimator.warm_start import _view

    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(make_model().state_dict(), str(path))
    closed = []
    real_close = torch_sources.SafetensorsSource.close
    monkeypatch.setattr(torch_sources.SafetensorsSource, "close", lambda self: closed.append(self) or real_close(self))

    def broken_view(weights):
        raise RuntimeError("view failed")

    monkeypatch.setattr(_view, "source_view", broken_view)  # both plan builders look it up there
    for build in (
        lambda: warm_start_module.warm_start(make_model(), str(path)),
        lambda: warm_start_module.init_from_checkpoint(make_model(), str(path), {"/": "/"}),
    ):
        with pytest.raises(RuntimeError, match="view failed"):
            build()
    assert len(closed) == 2
