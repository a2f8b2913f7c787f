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
