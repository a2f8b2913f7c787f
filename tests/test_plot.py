"""`torchestimator plot` draws training loss and evaluation metrics from real event files."""

from __future__ import annotations

import pytest
from helpers import input_fns, make_estimator

from torchestimator.cli import main

pytest.importorskip("matplotlib")


def test_plot_writes_a_png_with_train_and_eval_panels(tmp_path, capsys):
    train, evaluate, _, _ = input_fns()
    estimator = make_estimator(tmp_path / "run", save_summary_steps=2)
    for max_steps in (4, 8):
        estimator.train(train, max_steps=max_steps)
        estimator.evaluate(evaluate)
        estimator.evaluate(evaluate, name="holdout")
    assert main(["plot", str(tmp_path / "run")]) == 0
    path = capsys.readouterr().out.strip().split()[-1]
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    from torchestimator.cli.plot import _evaluation_dirs

    assert set(_evaluation_dirs(str(tmp_path / "run"))) == {"eval", "eval_holdout"}


def test_plot_errors(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty")]) == 2
    assert "no training loss or evaluation metrics" in capsys.readouterr().err


def test_each_series_has_one_colour_in_every_panel(tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from torchestimator.cli.plot import _figure

    train, evaluate, _, _ = input_fns()
    estimator = make_estimator(tmp_path, save_summary_steps=2)
    estimator.train(train, max_steps=4)
    estimator.evaluate(evaluate)
    estimator.evaluate(evaluate, name="holdout")
    figure = _figure(str(tmp_path), plt)
    colours: dict[str, set[str]] = {}
    for axis in figure.axes:
        for line in axis.get_lines():
            colours.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
    plt.close(figure)
    # The loss panel has train, eval and eval_holdout; the metric panels only the two evaluations.
    assert set(colours) == {"train", "eval", "eval_holdout"}
    assert all(len(found) == 1 for found in colours.values()), colours
    assert len(set.union(*colours.values())) == 3, colours  # and the series stay told apart
