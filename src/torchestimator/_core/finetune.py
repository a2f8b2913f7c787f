"""Fine-tuning helpers: freeze parts of a model (BatchNorm included) and give parts their own learning rate.

`requires_grad=False` alone leaves a frozen backbone's BatchNorm layers in
train mode, so their running statistics drift while the weights stay put.
`freeze` marks those layers, and the training loop keeps marked layers in
eval mode (see `apply_frozen_modes`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch

_FROZEN = "_torchestimator_frozen"


def _patterns(patterns: str | Iterable[str]) -> list[re.Pattern[str]]:
    items = [patterns] if isinstance(patterns, str) else list(patterns)
    if not items:
        raise ValueError("freeze/unfreeze need at least one name pattern (a regex matched with re.match).")
    return [re.compile(item) for item in items]


def _set_frozen(model: torch.nn.Module, patterns: str | Iterable[str], frozen: bool) -> list[str]:
    compiled = _patterns(patterns)
    touched = []
    for name, parameter in model.named_parameters():
        if any(pattern.match(name) for pattern in compiled):
            parameter.requires_grad_(not frozen)
            touched.append(name)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and name and any(p.match(name) for p in compiled):
            setattr(module, _FROZEN, frozen)
            touched.append(name)
    if not touched:
        raise ValueError(
            f"No parameter or BatchNorm layer of the model matches {[p.pattern for p in compiled]}; "
            f"names look like {[n for n, _ in list(model.named_parameters())[:5]]}."
        )
    return touched


def freeze(model: torch.nn.Module, patterns: str | Iterable[str]) -> list[str]:
    """Stops training the matching parameters and keeps the matching BatchNorm layers in eval mode.

    Patterns are regexes matched with re.match against parameter names
    (`backbone\\.`) and module names (`backbone.1`). Returns what was frozen.
    """
    return _set_frozen(model, patterns, True)


def unfreeze(model: torch.nn.Module, patterns: str | Iterable[str]) -> list[str]:
    """Undoes `freeze` for the matching parameters and BatchNorm layers."""
    return _set_frozen(model, patterns, False)


def apply_frozen_modes(model: torch.nn.Module) -> None:
    """Puts frozen BatchNorm layers back in eval mode; the loop calls it after model.train()."""
    for module in model.modules():
        if getattr(module, _FROZEN, False):
            module.eval()


def param_groups(model: torch.nn.Module, groups: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Optimizer parameter groups by name: each trainable parameter joins the first group whose regex matches.

    Example: `param_groups(model, [(r"backbone\\.", {"lr": 1e-4}), (r".*", {"lr": 1e-3})])`.
    Frozen parameters are left out; a trainable parameter no group matches is an error.
    """
    compiled = [(re.compile(pattern), options) for pattern, options in groups]
    buckets: list[list[torch.nn.Parameter]] = [[] for _ in compiled]
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        for index, (pattern, _) in enumerate(compiled):
            if pattern.match(name):
                buckets[index].append(parameter)
                break
        else:
            raise ValueError(
                f"Parameter {name!r} matches none of the groups {[p.pattern for p, _ in compiled]}; "
                "end the list with ('.*', {...}) to catch the rest."
            )
    return [{"params": bucket, **options} for bucket, (_, options) in zip(buckets, compiled) if bucket]
