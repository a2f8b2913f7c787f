"""``init_from_checkpoint``: TensorFlow's assignment maps (scopes and single tensors) as a warm-start plan.

What belongs here: the map's forms (``{"old_scope/": "new_scope/"}``,
``{"/": "new_scope/"}``, one tensor), scopes with either separator, and the
errors for targets the module lacks. What does not: resolving names against the
source and checking shapes (``_build``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from torchestimator.interop import WeightSource, open_weights
from torchestimator.interop.matching import nearest_names
from torchestimator.warm_start import _view
from torchestimator.warm_start._build import build_plan, closed_on_error
from torchestimator.warm_start._plan import WarmStartPlan
from torchestimator.warm_start._settings import ConverterSpec, PathOrSource
from torchestimator.warm_start._spelling import Problem

__all__ = ["init_from_checkpoint", "plan_init_from_checkpoint"]


def init_from_checkpoint(
    module: torch.nn.Module, source: PathOrSource, assignment_map: Any, **options: Any
) -> WarmStartPlan:
    """TensorFlow's init_from_checkpoint on a module: plan the assignment map, then apply it all or nothing.

    Unlike TensorFlow it acts at once (there is no initializer to defer to); call it on the plain
    module, before training or wrapping, for a fresh model_dir.
    """
    plan = plan_init_from_checkpoint(module, source, assignment_map, **options)
    try:
        plan.apply(module)
    finally:
        plan.close()
    return plan


def plan_init_from_checkpoint(
    module: torch.nn.Module,
    source: PathOrSource,
    assignment_map: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    converters: Mapping[str, ConverterSpec] | None = None,
    allow_missing: bool = False,
) -> WarmStartPlan:
    """``tf.compat.v1.train.init_from_checkpoint`` as a plan: keys are source names, values target names.

    Forms (a dict, or a list of pairs so one source tensor can feed several targets):

    * ``{"old_scope/": "new_scope/"}``: every target under ``new_scope`` loads the
      source tensor with the same remainder under ``old_scope``;
    * ``{"/": "new_scope/"}``: the remainder is looked up at the source's root;
    * ``{"old_scope/var": "new_scope/var"}``: one tensor.

    A scope ends with a separator; both ``/`` and ``.`` separate scopes, on
    either side, so ``{"encoder/": "backbone."}`` maps ``backbone.0.weight`` to
    ``encoder/0/weight`` or ``encoder/0.weight``, whichever the source holds.
    Targets under a scope are all ``state_dict`` entries (parameters and
    buffers), as TF takes every variable in the scope. A scope value with a
    non-scope key is a ValueError, as in TF. Apply with ``plan.apply(module)``.
    """
    pairs = list(assignment_map.items()) if isinstance(assignment_map, Mapping) else list(assignment_map)
    _check_pairs(pairs)
    state = module.state_dict(keep_vars=True)
    weights = source if isinstance(source, WeightSource) else open_weights(source)
    with closed_on_error(weights, not isinstance(source, WeightSource)):
        peek = _view.source_view(weights)  # through the module: tests replace it there
    explicit, errors = _explicit_sources(pairs, state, set(peek.infos) | set(peek.aliases))
    selected = [name for name in state if name in explicit]
    return build_plan(
        module,
        weights,
        selected,
        explicit,
        skipped=[name for name in state if name not in explicit],
        converters=converters or {},
        allow_missing=allow_missing,
        accept_proposals=False,
        notes=[],
        errors=[Problem.plain(error) for error in errors],
        owns_source=not isinstance(source, WeightSource),
    )


def _check_pairs(pairs: list[Any]) -> None:
    """Refuse what is not a (source name, target name) pair, and a scope fed from a single tensor, as TF does."""
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(part, str) for part in pair)):
            raise TypeError(f"assignment_map must map source names to target names (str -> str); received {pair!r}.")
        if _is_scope(pair[1]) and not (_is_scope(pair[0]) or pair[0] == "/"):
            raise ValueError(
                f"assignment_map: {pair[1]!r} is a scope, so its key must be a scope too (ending in '/' or '.', "
                f"or '/' for the source root); received {pair[0]!r}."
            )


def _explicit_sources(
    pairs: list[tuple[str, str]], state: Mapping[str, Any], view_names: set[str]
) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """({target: (source name, "assignment_map")}, errors for scopes and targets the module lacks)."""
    explicit: dict[str, tuple[str, str]] = {}
    errors: list[str] = []
    for source_name, target_name in pairs:
        if _is_scope(target_name):
            prefix = _normalize(target_name)
            targets = [name for name in state if _normalize(name).startswith(prefix)]
            if not targets:
                errors.append(f"assignment_map scope {target_name!r} holds no tensor of the module.")
            for target in targets:
                remainder = target[len(target_name) :]
                root = "" if source_name == "/" else source_name
                explicit[target] = (_scoped_name(root, remainder, view_names), "assignment_map")
        elif target_name in state:
            explicit[target_name] = (source_name, "assignment_map")
        else:
            errors.append(
                f"assignment_map target {target_name!r} is not a tensor of the module; nearest names: "
                f"{nearest_names(target_name, state)}."
            )
    return explicit, errors


def _is_scope(name: str) -> bool:
    return name.endswith(("/", "."))


def _normalize(name: str) -> str:
    return name.replace(".", "/")


def _scoped_name(root: str, remainder: str, known: set[str]) -> str:
    """The source name for ``root`` + ``remainder``, trying both separators; the first form when none exists."""
    candidates = [root + remainder, root + remainder.replace(".", "/"), root + remainder.replace("/", ".")]
    return next((candidate for candidate in candidates if candidate in known), candidates[1 if "/" in root else 0])
