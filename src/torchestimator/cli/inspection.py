"""`torchestimator inspect`: what a checkpoint or model_dir holds, as text.

Reads headers and manifests only; it never loads a model or runs code. The
readers are imported when a path is described, so the parser can take
PATH_HELP from here without them.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

PATH_HELP = (
    "a model_dir (its checkpoint history too), a ckpt-<step> folder, a TensorFlow checkpoint (prefix, "
    ".index file, or a folder with its 'checkpoint' file), a Keras .h5/.weights.h5/.keras file, "
    "a .safetensors file, or a PyTorch .pt/.pth/.bin state_dict"
)
"""What `inspect PATH` reads: every format interop.open_weights opens."""


def _variables_table(rows: Sequence[tuple[str, tuple[int, ...], object]]) -> list[str]:
    # Each column is as wide as its longest entry or its header, so the columns line up whatever the lengths.
    shapes = [str(list(shape)) for _, shape, _ in rows]
    width = max([len("name"), *(len(name) for name, _, _ in rows)])
    shape_width = max([len("shape"), *(len(shape) for shape in shapes)])
    lines = [f"{'name':<{width}}  {'shape':<{shape_width}}  dtype"]
    for (name, _, dtype), shape_text in zip(rows, shapes, strict=True):
        lines.append(f"{name:<{width}}  {shape_text:<{shape_width}}  {dtype}")
    total = 0
    for _, shape, _ in rows:
        count = 1
        for size in shape:
            count *= size
        total += count
    lines.append(f"{len(rows)} variables, {total:,} values")
    return lines


def describe(path: str) -> str:
    """Variables with shapes and dtypes of any weights file; plus the checkpoint history of a model_dir."""
    from torchestimator._io import filesystems
    from torchestimator.checkpoint import CheckpointStore
    from torchestimator.interop import open_weights
    from torchestimator.interop.torch_sources import is_torchestimator

    if filesystems.is_url(path):
        from torchestimator.interop._remote import _is_our_model_dir

        if _is_our_model_dir(path.rstrip("/")) and CheckpointStore(path).history():
            return _describe_model_dir(path.rstrip("/"))
        with open_weights(path) as source:
            rows = [(info.name, info.shape, info.dtype) for info in source.tensors()]
            return "\n".join([f"{path} ({source.format}):", *_variables_table(rows)])
    if not os.path.exists(path) and not os.path.exists(path + ".index"):
        raise FileNotFoundError(f"inspect: {path} does not exist.")
    is_model_dir = os.path.isdir(path) and not os.path.basename(os.path.normpath(path)).startswith("ckpt-")
    # Only a folder that is ours is read as a model_dir: a TensorFlow checkpoint folder's 'checkpoint' text
    # file has our manifest's name, and the store would warn that it is a damaged manifest.
    if is_model_dir and is_torchestimator(path):
        store = CheckpointStore(path)
        if store.history():
            return _describe_model_dir(path)
        if store.has_checkpoints():
            store.restore()  # none is intact: the CheckpointError names each and why
    with open_weights(path) as source:
        rows = [(info.name, info.shape, info.dtype) for info in source.tensors()]
        return "\n".join([f"{path} ({source.format}):", *_variables_table(rows)])


def _describe_model_dir(path: str) -> str:
    from torchestimator.checkpoint import CheckpointStore

    store = CheckpointStore(path)
    history = store.history()
    lines = [f"model_dir {path}: {len(history)} checkpoint(s)"]
    for entry in history:
        when = datetime.datetime.fromtimestamp(entry["save_time"]).isoformat(timespec="seconds")
        flags = "".join([" best" if entry["best"] else "", " kept-hourly" if entry["preserved"] else ""])
        lines.append(f"  step {entry['step']:>8}  {when}  {entry['path']}{flags}")
    latest = history[-1]["path"]
    lines.append(f"variables of the latest checkpoint ({latest}):")
    lines.extend(_variables_table(store.list_variables(latest)))
    return "\n".join(lines)
