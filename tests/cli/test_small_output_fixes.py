"""Small output fixes of issue 29.11: `inspect`'s columns and the :classify/:regress method error's wording."""

from __future__ import annotations

import re

import pytest
import torch

from torchestimator.cli import main


def _column_starts(line: str, fields: list[str]) -> list[int]:
    starts, position = [], 0
    for field in fields:
        position = line.index(field, position)
        starts.append(position)
        position += len(field)
    return starts


@pytest.mark.parametrize(
    "weights",
    [
        {"w": torch.zeros(2), "b": torch.zeros(3)},  # every name shorter than the "name" header
        {"w": torch.zeros(2), "a_much_longer_variable_name": torch.zeros([1] * 9)},  # and a shape wider than 20
    ],
    ids=["short_names", "short_and_long"],
)
def test_inspect_columns_line_up_whatever_the_name_and_shape_lengths(tmp_path, capsys, weights):
    path = tmp_path / "weights.pt"
    torch.save(weights, path)
    assert main(["inspect", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(index for index, line in enumerate(lines) if line.startswith("name"))
    table = lines[header : header + 1 + len(weights)]
    starts = [_column_starts(line, re.split(r"\s{2,}", line)) for line in table]
    assert all(len(found) == 3 for found in starts), table
    assert len(set(map(tuple, starts))) == 1, "\n".join(table)  # each row's columns start where the header's do


class _PredictOnlyModel:
    """An ExportedModel's signature lookup, with one predict signature and nothing for :classify or :regress."""

    signature_names = ["serving_default"]

    def signature(self, name):
        from torchestimator.export.loader import Signature

        return Signature(
            name=name,
            method="predict",
            method_name="tensorflow/serving/predict",
            inputs={},
            outputs={},
            program_outputs={},
        )


@pytest.mark.parametrize("method, kind", [("classify", "classification"), ("regress", "regression")])
def test_a_model_without_a_fitting_signature_is_told_so_not_shown_an_empty_list(method, kind):
    from torchestimator.serving.errors import ServingError
    from torchestimator.serving.examples_json import parse_examples_request

    with pytest.raises(ServingError) as raised:
        parse_examples_request({"examples": [{"x": 1.0}]}, _PredictOnlyModel(), method)
    message = raised.value.message
    assert message.startswith(f"Expected {kind} signature method_name to be tensorflow/serving/{method}. Was: ")
    assert message.endswith(f"send it to :predict; the model has no {kind} signature."), message
    assert "[]" not in message
