"""The exported graph called directly (export/loader.py LiftedCall): same outputs as torch's unlifted module,
the shape ranges torch.export recorded still enforced, and the module path kept for programs that need it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import exporting_model_fn, trained_classifier

from torchestimator.export import PredictOutput, TensorSpec, export_saved_model, load, serving_input_receiver
from torchestimator.export.loader import LiftedCall

model_fn = exporting_model_fn(
    lambda logits, predictions: {
        "probabilities": PredictOutput({"probabilities": predictions["probabilities"]}),
    }
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast-path")
    estimator, x = trained_classifier(root / "model", model_fn, steps=3)
    base = export_saved_model(estimator, root / "export", serving_input_receiver({"x": TensorSpec(shape=(None, 8))}))
    return load(base), torch.from_numpy(np.ascontiguousarray(x[:16]))


def test_a_plain_program_is_called_through_its_graph_with_the_module_outputs(exported):
    model, x = exported
    lifted = LiftedCall.build(model._program, ["x"])
    assert lifted is not None and model._lifted is not None  # the served model takes the direct call
    module = model._program.module()
    for rows in (1, 3, 16):
        with torch.no_grad():
            direct, through_module = lifted({"x": x[:rows]}), module({"x": x[:rows]})
        assert sorted(direct) == sorted(through_module)
        assert len(direct) >= 2  # class and probabilities (and their program keys)
        for key in direct:
            torch.testing.assert_close(direct[key], through_module[key], rtol=0, atol=0)


def test_the_public_call_matches_the_module_path_for_every_output(exported):
    model, x = exported
    fast = model({"x": x[:5]})
    saved, model._lifted = model._lifted, None  # force the module path for comparison
    try:
        slow = model({"x": x[:5]})
    finally:
        model._lifted = saved
    assert sorted(fast) == sorted(slow)
    for name in fast:
        assert fast[name].dtype == slow[name].dtype
        np.testing.assert_array_equal(fast[name], slow[name])


class _Doubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, inputs):
        return {"y": self.linear(inputs["x"]) * 2}


def test_recorded_size_ranges_are_enforced_with_a_message_naming_the_input():
    batch = torch.export.Dim("batch", min=2, max=8)
    program = torch.export.export(_Doubler().eval(), ({"x": torch.randn(3, 4)},), dynamic_shapes=({"x": {0: batch}},))
    lifted = LiftedCall.build(program, ["x"])
    assert lifted is not None
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(lifted({"x": x})["y"], program.module()({"x": x})["y"], rtol=0, atol=0)
        with pytest.raises(ValueError, match=r"Input 'x' has size 1 in dimension 0; .* accepts 2 to 8"):
            lifted({"x": torch.randn(1, 4)})
        with pytest.raises(ValueError, match="size 9 in dimension 0"):
            lifted({"x": torch.randn(9, 4)})


class _Counting(nn.Module):
    """Mutates a buffer on every call; functionalized, the graph returns the new value for the module to write back."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, inputs):
        self.calls.add_(1)
        return {"y": self.linear(inputs["x"])}


def test_programs_with_mutations_or_another_input_structure_keep_the_module_path():
    x = torch.randn(2, 4)
    mutating = torch.export.export(_Counting().eval(), ({"x": x},)).run_decompositions({})
    assert LiftedCall.build(mutating, ["x"]) is None
    plain = torch.export.export(_Doubler().eval(), ({"x": x},))
    assert LiftedCall.build(plain, ["x"]) is not None
    assert LiftedCall.build(plain, ["x", "extra"]) is None  # names that do not match the program's dict
