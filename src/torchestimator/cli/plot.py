"""`torchestimator plot MODEL_DIR`: training loss and every evaluation metric against step, as one PNG.

Reads the event files with TensorBoard's own reader (summary.read_scalars);
draws with matplotlib (the `plot` extra) on the Agg backend, so it works
without a screen.
"""

from __future__ import annotations

import math
import os
from typing import Any

from torchestimator._extras import import_extra
from torchestimator._io import filesystems
from torchestimator._io.summary import read_scalars


def _evaluation_dirs(model_dir: str) -> dict[str, str]:
    """eval -> model_dir/eval, and holdout -> model_dir/eval_holdout, for every folder with events."""
    found = {}
    for entry in sorted(filesystems.listdir(model_dir)):
        path = filesystems.join(model_dir, entry)
        if (entry == "eval" or entry.startswith("eval_")) and filesystems.is_dir(path):
            found[entry] = path
    return found


def plot_model_dir(model_dir: str, output: str | None = None) -> str:
    """Writes the PNG (default MODEL_DIR/metrics.png) and returns its path."""
    if not filesystems.is_dir(model_dir):
        raise FileNotFoundError(f"plot: {model_dir} is not a directory.")
    matplotlib = import_extra("matplotlib", extra="plot", feature="plotting")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = _figure(model_dir, plt)
    output = output or filesystems.join(model_dir, "metrics.png")
    if filesystems.is_url(output):  # matplotlib writes files: the PNG goes up whole
        import io

        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        filesystems.write_bytes(output, buffer.getvalue())
    else:
        figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


def _figure(model_dir: str, plt: Any) -> Any:
    """One panel per tag (the loss first); each series (train, eval, eval_holdout...) has one colour in every panel."""
    panels: dict[str, list[tuple[str, list[tuple[int, float]]]]] = {}
    training = read_scalars(model_dir)
    if "loss" in training:
        panels.setdefault("loss", []).append(("train", training["loss"]))
    for label, path in _evaluation_dirs(model_dir).items():
        for tag, points in read_scalars(path).items():
            panels.setdefault(tag, []).append((label, points))
    if not panels:
        raise ValueError(
            f"{model_dir} has no training loss or evaluation metrics to plot (no event files with scalars)."
        )
    # Each panel would start matplotlib's colour cycle afresh, giving a series the colour of its place in that
    # panel: the colours are given per series instead, in the order the series first appear.
    labels = list(dict.fromkeys(label for series in panels.values() for label, _ in series))
    colours = {label: f"C{index}" for index, label in enumerate(labels)}
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.5 * rows), squeeze=False)
    for axis, (tag, series) in zip(axes.flat, sorted(panels.items(), key=lambda item: (item[0] != "loss", item[0]))):
        for label, points in series:
            steps, values = zip(*points)
            marker = "o" if len(points) < 30 else None
            axis.plot(steps, values, marker=marker, markersize=3, label=label, color=colours[label])
        axis.set_title(tag)
        axis.set_xlabel("global step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.suptitle(model_dir if filesystems.is_url(model_dir) else os.path.abspath(model_dir), fontsize="small")
    figure.tight_layout()
    return figure
