"""``plan_warm_start`` and ``warm_start``: TensorFlow's ``WarmStartSettings`` selection applied to a module.

What belongs here: turning settings into selected targets and their explicit
source names (renames, ``mapping_fn``), and refusing keys that name nothing.
What does not: resolving names against the source and checking shapes (``_build``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from torchestimator._shapeless import refuse_uninitialized
from torchestimator.warm_start._build import build_plan
from torchestimator.warm_start._plan import WarmStartPlan
from torchestimator.warm_start._settings import (
    PathOrSource,
    WarmStartSettings,
    as_warm_start_settings,
    compile_pattern,
    pattern_list,
)
from torchestimator.warm_start._spelling import Problem, Spelling

__all__ = ["plan_warm_start", "warm_start"]

logger = logging.getLogger("torchestimator.warm_start")


def plan_warm_start(module: torch.nn.Module, settings: WarmStartSettings | PathOrSource) -> WarmStartPlan:
    """The plan for warm-starting ``module`` with ``settings``; reads names and shapes only, changes nothing."""
    settings = as_warm_start_settings(settings)
    refuse_uninitialized(module, f"Warm start from {settings.ckpt_to_initialize_from}")
    state = module.state_dict(keep_vars=True)
    selected, notes, errors = _select(module, settings.vars_to_warm_start)
    renames = dict(settings.var_name_to_prev_var_name or {})
    unused_keys = sorted(set(renames) - set(selected))
    if unused_keys:
        errors.append(
            Problem(
                lambda s: (
                    f"{s.renames} keys {unused_keys} were not used. Perhaps you misspelled them? "
                    "Keys are target (module) names among the selected tensors."
                )
            )
        )
    unused_converters = sorted(set(settings.converters or {}) - set(selected))
    if unused_converters:
        errors.append(
            Problem(
                lambda s: (
                    f"{s.converters} keys {unused_converters} were not used: they name no "
                    "selected target. Perhaps you misspelled them?"
                )
            )
        )
    explicit: dict[str, tuple[str, str]] = {}
    for target in selected:
        if target in renames:
            explicit[target] = (renames[target], "renamed")
        elif settings.mapping_fn is not None and (mapped := settings.mapping_fn(target)) is not None:
            if not isinstance(mapped, str):
                raise TypeError(f"mapping_fn({target!r}) must return a source name or None; received {mapped!r}.")
            explicit[target] = (mapped, "mapping_fn")
    return build_plan(
        module,
        settings.ckpt_to_initialize_from,
        selected,
        explicit,
        skipped=[name for name in state if name not in set(selected)],
        converters=settings.converters or {},
        allow_missing=settings.allow_missing,
        accept_proposals=settings.accept_proposed_mapping,
        notes=notes,
        errors=errors,
    )


def _select(
    module: torch.nn.Module, patterns: str | Sequence[str] | None
) -> tuple[list[str], list[str], list[Problem]]:
    """TF's selection: (selected target names, notes, errors)."""
    if isinstance(patterns, str):
        candidates = [name for name, parameter in module.named_parameters() if parameter.requires_grad]
    else:
        candidates = list(module.state_dict(keep_vars=True))
    regexes = [compile_pattern(pattern) for pattern in pattern_list(patterns)]
    selected = [name for name in candidates if any(regex.match(name) for regex in regexes)]
    notes: list[str] = []
    errors: list[Problem] = []
    if patterns is None:
        message = "vars_to_warm_start=None: nothing is warm-started."
        logger.warning(message)
        notes.append(message)
    elif not selected:
        kind = "trainable parameters" if isinstance(patterns, str) else "parameters and buffers"
        facts = (
            f"selects none of the module's {len(candidates)} {kind} (re.match, anchored at the start; e.g. "
            f"{candidates[:3]}). A pattern that warm-starts nothing is almost always a mistake."
        )

        def words(spelling: Spelling) -> str:
            return f"{spelling.selected_by(patterns)} {facts}"

        errors.append(Problem(words))
    elif not isinstance(patterns, str):
        for pattern, regex in zip(patterns, regexes):
            if not any(regex.match(name) for name in candidates):
                notes.append(f"vars_to_warm_start pattern {pattern!r} matches nothing.")
    return selected, notes, errors


def warm_start(module: torch.nn.Module, settings: WarmStartSettings | PathOrSource) -> WarmStartPlan:
    """Plan and apply; ValueError (the module unchanged) when the plan has errors. Returns the plan."""
    plan = plan_warm_start(module, settings)
    try:
        plan.apply(module)
    finally:
        plan.close()
    return plan
