"""Writing a warm-started module's weights: a ``.safetensors`` file, or a fresh model_dir's step-0 checkpoint.

What belongs here: where the result goes, the refusals that keep TensorFlow's rule (warm start
applies only to a fresh model_dir: one with checkpoints resumes from them), and writes that are all
or nothing (an output appears whole or not at all). What does not: the plan and its apply (``_plan``),
the checkpoint format and its manifest (``torchestimator.checkpoint``, which writes the checkpoint).

The checkpoint holds the module's ``state_dict`` at step 0 and nothing else: no optimizer state and
no generator states, so a run that resumes from it starts its optimizer fresh and its random streams
from ``RunConfig.random_seed``, as a warm start into a fresh model_dir does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import torch

from torchestimator._io.atomic import write_bytes_atomically
from torchestimator.checkpoint import CheckpointStore
from torchestimator.checkpoint.format import tensors_to_bytes
from torchestimator.errors import ConfigError

__all__ = ["SAFETENSORS_SUFFIX", "check_output", "is_safetensors_path", "write_weights"]

SAFETENSORS_SUFFIX = ".safetensors"
# Outputs named like weight files this module does not write: almost always a slip, never a model_dir.
_OTHER_WEIGHT_FILES = (".pt", ".pth", ".bin", ".h5", ".keras", ".ckpt", ".npz", ".index", ".pb")


def is_safetensors_path(out: str) -> bool:
    """Whether ``out`` names a safetensors file (the suffix in any case: ``OUT.SAFETENSORS`` too)."""
    return out.lower().endswith(SAFETENSORS_SUFFIX)


def check_output(out: str, *, label: str = "out") -> None:
    """Refuses, before any work, an output warm start must not write; ``label`` names it in errors (``--write``)."""
    if not isinstance(out, str) or not out.strip():
        raise ConfigError(
            f"{label} must name a model_dir or a {SAFETENSORS_SUFFIX} file; received {out!r}.", field=label, value=out
        )
    _check_folders_above(out, label)
    if is_safetensors_path(out):
        if os.path.isdir(out):
            raise ConfigError(
                f"{label} {out}: it is a folder, and a name ending in {SAFETENSORS_SUFFIX} names the "
                "weights file to write. Choose another name.",
                field=label,
                value=out,
            )
        if os.path.lexists(out):
            raise ConfigError(
                f"{label} {out}: the file exists; warm start never overwrites weights. Remove it or "
                "choose another name.",
                field=label,
                value=out,
            )
        return
    suffix = os.path.splitext(out.rstrip(os.sep))[1].lower()
    if suffix in _OTHER_WEIGHT_FILES:
        raise ConfigError(
            f"{label} {out}: writes a model_dir (a folder) or a {SAFETENSORS_SUFFIX} file, not a "
            f"{suffix} file. Name a folder, or end the name with {SAFETENSORS_SUFFIX}.",
            field=label,
            value=out,
        )
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ConfigError(
            f"{label} {out}: exists and is not a folder, so it cannot be a model_dir. Choose another name.",
            field=label,
            value=out,
        )
    store = CheckpointStore(out)
    if store.has_checkpoints():
        folders = sorted(name for name in os.listdir(out) if name.startswith("ckpt-"))
        raise ConfigError(
            f"{label} {out}: this model_dir already has checkpoints ({', '.join(folders)}); warm start only applies "
            "to a fresh model_dir (training there resumes from its newest checkpoint, as in tf.estimator). Choose "
            "a new model_dir, or move the ckpt-* folders away.",
            field=label,
            value=out,
        )


def _check_folders_above(out: str, label: str) -> None:
    """Refuses an output below something that is not a folder (``afile/sub``: afile is a regular file)."""
    above = os.path.dirname(os.path.normpath(out))  # as given, so the message names it as the user did
    while above and not os.path.isdir(above):
        if os.path.lexists(above):
            kind = "a file" if os.path.isfile(above) else "not a folder"
            raise ConfigError(
                f"{label} {out}: {above} is {kind}, so nothing can be written inside it. Choose another name.",
                field=label,
                value=out,
            )
        above = os.path.dirname(above)


def write_weights(module: torch.nn.Module, out: str, *, label: str = "out") -> str:
    """Writes ``module.state_dict()`` to ``out``: a safetensors file, else a model_dir's ``ckpt-0``; returns its path.

    Checked again with ``check_output`` first. The file is replaced atomically and the checkpoint
    published by the store's rename, so neither is ever seen half written; folders this call
    created are removed again when writing fails.
    """
    check_output(out, label=label)
    state = {name: tensor.detach() for name, tensor in module.state_dict().items()}
    is_file = is_safetensors_path(out)
    with _created_folders_removed_on_error(os.path.dirname(os.path.abspath(out)) if is_file else out):
        if is_file:
            write_bytes_atomically(out, tensors_to_bytes(state, "the warm-started state_dict"))
            return out
        return CheckpointStore(out).save(0, state)


@contextlib.contextmanager
def _created_folders_removed_on_error(folder: str) -> Iterator[None]:
    """Creates ``folder`` and the folders above it that are missing; removes what it created if the body fails."""
    top_created = None
    path = os.path.abspath(folder)
    while not os.path.isdir(path):
        top_created = path
        path = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    try:
        yield
    except BaseException:
        if top_created is not None:  # only what this call made: nothing else can be inside
            shutil.rmtree(top_created, ignore_errors=True)
        raise
