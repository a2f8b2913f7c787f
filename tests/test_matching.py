"""The automatic matcher: proposals by layer kind, order and shape; flags; nearest names."""

from __future__ import annotations

import pytest
import torch

from torchestimator.interop.matching import nearest_names, propose_mapping
from torchestimator.interop.source import TensorInfo


def keras_source(units: tuple[int, int, int] = (8, 6, 3), extra: tuple[TensorInfo, ...] = ()) -> list[TensorInfo]:
    hidden, second, classes = units
    infos = [
        TensorInfo("dense/kernel", (4, hidden), "float32"),
        TensorInfo("dense/bias", (hidden,), "float32"),
        TensorInfo("batch_normalization/gamma", (hidden,), "float32"),
        TensorInfo("batch_normalization/beta", (hidden,), "float32"),
        TensorInfo("batch_normalization/moving_mean", (hidden,), "float32"),
        TensorInfo("batch_normalization/moving_variance", (hidden,), "float32"),
        TensorInfo("dense_1/kernel", (hidden, second), "float32"),
        TensorInfo("dense_1/bias", (second,), "float32"),
        TensorInfo("dense_2/kernel", (second, classes), "float32"),
        TensorInfo("dense_2/bias", (classes,), "float32"),
        TensorInfo("dense/kernel/Adam", (4, hidden), "float32"),
        TensorInfo("dense/kernel/Adam_1", (4, hidden), "float32"),
        TensorInfo("global_step", (), "int64"),
        *extra,
    ]
    return sorted(infos, key=lambda info: info.name)  # sources list tensors by name, not layer order


def mlp() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 6), torch.nn.Linear(6, 3)
    )


def test_sequential_against_keras_names_gets_the_right_proposals() -> None:
    result = propose_mapping(mlp(), keras_source())
    assert result.mapping() == {
        "0.weight": "dense/kernel",
        "0.bias": "dense/bias",
        "1.weight": "batch_normalization/gamma",
        "1.bias": "batch_normalization/beta",
        "1.running_mean": "batch_normalization/moving_mean",
        "1.running_var": "batch_normalization/moving_variance",
        "3.weight": "dense_1/kernel",
        "3.bias": "dense_1/bias",
        "4.weight": "dense_2/kernel",
        "4.bias": "dense_2/bias",
    }
    converters = result.converters()
    assert converters["0.weight"] == "dense_to_linear" and converters["1.running_var"] == "identity"
    assert result.flagged == []
    assert [p.target for p in result.unmatched] == ["1.num_batches_tracked"]
    assert dict(result.ignored_sources) == {
        "dense/kernel/Adam": "optimizer slot",
        "dense/kernel/Adam_1": "optimizer slot",
        "global_step": "training bookkeeping",
    }
    assert result.unused_sources == ()
    assert [p.target for p in result.proposals][:2] == ["0.weight", "0.bias"]  # model order
    assert all(p.confidence >= 0.9 for p in result.proposals if p.status == "confident")


def test_numbers_order_naturally_and_source_order_overrides() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(11)])
    infos = [TensorInfo(f"dense{'_' + str(i) if i else ''}/kernel", (2, 2), "float32") for i in range(11)]
    result = propose_mapping(model, sorted(infos, key=lambda info: info.name))
    assert result.mapping()["2.weight"] == "dense_2/kernel" and result.mapping()["10.weight"] == "dense_10/kernel"
    reverse = [f"dense{'_' + str(i) if i else ''}" for i in reversed(range(11))]
    assert propose_mapping(model, infos, source_order=reverse).mapping()["0.weight"] == "dense_10/kernel"


def test_shape_mismatch_is_flagged_not_mapped() -> None:
    result = propose_mapping(mlp(), keras_source(units=(8, 5, 3)))
    flagged = {p.target: p for p in result.flagged}
    assert flagged["3.weight"].status == "mismatch" and flagged["3.weight"].source == "dense_1/kernel"
    assert "(8, 5) becomes (5, 8) after dense_to_linear, target needs (6, 8)" in flagged["3.weight"].reason
    assert "3.weight" not in result.mapping() and "3.weight" not in result.mapping(include_ambiguous=True)


def test_extra_source_layer_gives_an_ambiguous_alignment() -> None:
    extra = (TensorInfo("dense_3/kernel", (3, 3), "float32"), TensorInfo("dense_3/bias", (3,), "float32"))
    result = propose_mapping(mlp(), keras_source(extra=extra))
    by_target = {p.target: p for p in result.proposals}
    assert by_target["4.weight"].source == "dense_2/kernel" and by_target["4.weight"].status == "ambiguous"
    assert "3 target vs 4 source dense layers" in by_target["4.weight"].reason
    assert by_target["4.weight"].confidence < 0.9
    assert result.mapping().get("4.weight") is None  # ambiguous needs confirming
    assert result.mapping(include_ambiguous=True)["4.weight"] == "dense_2/kernel"
    assert set(result.unused_sources) == {"dense_3/kernel", "dense_3/bias"}


def test_missing_layer_kind_is_unmatched() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 8))
    result = propose_mapping(model, [TensorInfo("dense/kernel", (4, 8), "float32")])
    by_target = {p.target: p for p in result.proposals}
    assert by_target["0.weight"].status == "unmatched" and "no embedding layer" in by_target["0.weight"].reason
    assert by_target["1.weight"].status == "confident"
    assert by_target["1.bias"].status == "unmatched" and "no counterpart of 'bias'" in by_target["1.bias"].reason


def test_conv_flatten_dense_is_flagged_with_the_helper_named() -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5)
    )
    source = [
        TensorInfo("layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE", (3, 3, 3, 8), "float32"),
        TensorInfo("layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE", (8,), "float32"),
        *(
            TensorInfo(f"layer_with_weights-1/{m}/.ATTRIBUTES/VARIABLE_VALUE", (8,), "float32")
            for m in ("gamma", "beta", "moving_mean", "moving_variance")
        ),
        TensorInfo("layer_with_weights-2/kernel/.ATTRIBUTES/VARIABLE_VALUE", (128, 5), "float32"),
        TensorInfo("layer_with_weights-2/bias/.ATTRIBUTES/VARIABLE_VALUE", (5,), "float32"),
        TensorInfo(
            "layer_with_weights-2/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE", (128, 5), "float32"
        ),
        TensorInfo("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE", (), "int64"),
        TensorInfo("save_counter/.ATTRIBUTES/VARIABLE_VALUE", (), "int64"),
    ]
    result = propose_mapping(model, source)
    by_target = {p.target: p for p in result.proposals}
    assert by_target["0.weight"].converter == "conv_to_torch" and by_target["0.weight"].status == "confident"
    assert by_target["1.running_var"].source.startswith("layer_with_weights-1/moving_variance")
    dense = by_target["3.weight"]
    assert dense.status == "ambiguous" and dense.flatten == (8, 16)  # code reads the field, not the words
    assert "flatten_dense_converter(8, height, width) where height*width = 16" in dense.described()
    assert "permutes to NHWC before flatten" in dense.described()
    assert by_target["0.weight"].flatten is None and by_target["0.weight"].described() == by_target["0.weight"].reason
    assert len(result.ignored_sources) == 3


def test_torch_named_source_and_keras3_numbered_variables() -> None:
    other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 6))
    infos = [TensorInfo(f"backbone.{name}", tuple(t.shape), "float32") for name, t in other.state_dict().items()]
    model = mlp()[:4]
    result = propose_mapping(model, infos)
    assert result.mapping()["3.weight"] == "backbone.2.weight"
    assert result.mapping()["1.num_batches_tracked"] == "backbone.1.num_batches_tracked"
    assert set(result.converters().values()) == {"identity"}

    numbered = [
        TensorInfo("layers/dense/vars/0", (4, 8), "float32"),
        TensorInfo("layers/dense/vars/1", (8,), "float32"),
        *(TensorInfo(f"layers/batch_normalization/vars/{i}", (8,), "float32") for i in range(4)),
        TensorInfo("layers/dense_1/vars/0", (8, 6), "float32"),
        TensorInfo("layers/dense_1/vars/1", (6,), "float32"),
    ]
    result = propose_mapping(model, numbered)
    assert result.mapping()["0.weight"] == "layers/dense/vars/0"
    assert result.mapping()["1.running_var"] == "layers/batch_normalization/vars/3"
    assert result.converters()["3.weight"] == "dense_to_linear"


def test_target_as_shapes_and_bad_target() -> None:
    shapes = {"encoder.weight": (8, 4), "encoder.bias": (8,), "head.weight": (3, 8), "head.bias": (3,)}
    source = [
        TensorInfo("dense/kernel", (4, 8), "float32"),
        TensorInfo("dense/bias", (8,), "float32"),
        TensorInfo("dense_1/kernel", (8, 3), "float32"),
        TensorInfo("dense_1/bias", (3,), "float32"),
    ]
    assert propose_mapping(shapes, source).mapping()["head.weight"] == "dense_1/kernel"
    with pytest.raises(TypeError, match="must be a torch.nn.Module or a mapping"):
        propose_mapping([1, 2], source)  # type: ignore[arg-type]


def test_nearest_names() -> None:
    candidates = ["dense/kernel", "dense/bias", "dense_1/kernel", "batch_normalization/gamma", "model/head/kernel"]
    assert nearest_names("dense/kernal", candidates)[0] == "dense/kernel"
    assert "model/head/kernel" in nearest_names("classifier/kernel", candidates, n=5)
    assert len(nearest_names("dense/kernel", candidates, n=2)) == 2
    assert nearest_names("zzz", candidates) == []
