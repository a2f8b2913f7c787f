"""`torchestimator inspect`: what a checkpoint or model_dir holds, as text.

Reads headers and manifests only; it never loads a model or runs code.
"""

from __future__ import annotations

import datetime
import os

from safetensors import safe_open

from torchestimator.checkpoint import CheckpointStore


def _variables_table(rows: list[tuple[str, tuple[int, ...], object]]) -> list[str]:
    width = max((len(name) for name, _, _ in rows), default=4)
    lines = [f"{'name':<{width}}  {'shape':<20}  dtype"]
    for name, shape, dtype in rows:
        lines.append(f"{name:<{width}}  {str(list(shape)):<20}  {dtype}")
    total = 0
    for _, shape, _ in rows:
        count = 1
        for size in shape:
            count *= size
        total += count
    lines.append(f"{len(rows)} variables, {total:,} values")
    return lines


def _safetensors_variables(path: str) -> list[tuple[str, tuple[int, ...], object]]:
    with safe_open(path, framework="pt") as handle:
        rows = []
        for name in sorted(handle.keys()):
            view = handle.get_slice(name)
            rows.append((name, tuple(view.get_shape()), view.get_dtype()))
    return rows


def describe(path: str) -> str:
    """Variables with shapes and dtypes, plus the checkpoint history when `path` is a model_dir."""
    if os.path.isfile(path):
        if not path.endswith(".safetensors"):
            raise ValueError(f"inspect reads model_dirs, ckpt-<step> folders and .safetensors files; {path} is none of them.")
        return "\n".join([f"{path}:", *_variables_table(_safetensors_variables(path))])
    if not os.path.isdir(path):
        raise FileNotFoundError(f"inspect: {path} does not exist.")
    folder = os.path.basename(os.path.normpath(path))
    if folder.startswith("ckpt-"):
        store = CheckpointStore(os.path.dirname(os.path.normpath(path)) or ".")
        return "\n".join([f"checkpoint {path}:", *_variables_table(store.list_variables(path))])
    store = CheckpointStore(path)
    history = store.history()
    if not history:
        raise ValueError(f"{path} holds no checkpoint (no ckpt-<step> folder with a valid state.json).")
    lines = [f"model_dir {path}: {len(history)} checkpoint(s)"]
    for entry in history:
        when = datetime.datetime.fromtimestamp(entry["save_time"]).isoformat(timespec="seconds")
        flags = "".join([" best" if entry["best"] else "", " kept-hourly" if entry["preserved"] else ""])
        lines.append(f"  step {entry['step']:>8}  {when}  {entry['path']}{flags}")
    latest = history[-1]["path"]
    lines.append(f"variables of the latest checkpoint ({latest}):")
    lines.extend(_variables_table(store.list_variables(latest)))
    return "\n".join(lines)
