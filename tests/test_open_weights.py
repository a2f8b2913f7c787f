"""open_weights recognises every source format from real files, and inspect lists them."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from torchestimator.checkpoint import CheckpointStore
from torchestimator.cli import main
from torchestimator.interop import WeightSourceError, open_weights

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _module_state():
    return torch.nn.Linear(3, 2).state_dict()


def test_each_format_is_recognised(tmp_path):
    CheckpointStore(str(tmp_path / "run")).save(7, _module_state())
    torch.save(_module_state(), tmp_path / "weights.pt")
    save_file(_module_state(), str(tmp_path / "weights.safetensors"))
    cases = {
        str(tmp_path / "run"): "torchestimator",
        str(tmp_path / "run" / "ckpt-7"): "torchestimator",
        str(tmp_path / "weights.pt"): "torch",
        str(tmp_path / "weights.safetensors"): "safetensors",
        os.path.join(FIXTURES, "tf_checkpoint", "tf1"): "tensorflow",
        os.path.join(FIXTURES, "keras", "keras3_model.weights.h5"): "keras3_weights_h5",
        os.path.join(FIXTURES, "keras", "keras2_model.h5"): "keras_h5",
    }
    for path, expected in cases.items():
        with open_weights(path) as source:
            assert source.format == expected, path
            assert source.tensors(), path
            first = source.tensors()[0]
            assert tuple(source.read(first.name).shape) == tuple(first.shape)


def test_unknown_and_missing_sources_are_clear_errors(tmp_path):
    with pytest.raises(WeightSourceError, match="no such file"):
        open_weights(tmp_path / "absent.pt")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(WeightSourceError, match="not a format torchestimator reads"):
        open_weights(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightSourceError, match="holds no checkpoint"):
        open_weights(tmp_path / "empty")


def test_inspect_reads_foreign_formats(capsys):
    assert main(["inspect", os.path.join(FIXTURES, "tf_checkpoint", "tf1")]) == 0
    listing = capsys.readouterr().out
    assert "(tensorflow)" in listing and "dense/kernel" in listing
    assert main(["inspect", os.path.join(FIXTURES, "keras", "keras3_model.weights.h5")]) == 0
    assert "layers/" in capsys.readouterr().out
