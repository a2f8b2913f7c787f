"""Building a warm-start plan: each selected target resolved to a source tensor, converter and shapes checked.

What belongs here: name resolution (explicit names, the same name, the
matcher's proposals), the converter of each entry, shape and dtype checks, what
stays fresh and what is missing (with the nearest names), BatchNorm convention
warnings. What does not: which targets are selected and why (``_selection``,
``_assignment_map``), the plan object and its report (``_plan``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping

import torch

from torchestimator.interop import WeightSource, open_weights
from torchestimator.interop.layouts import Converter, batchnorm_settings, check_batchnorm_conventions, get_converter
from torchestimator.interop.matching import AMBIGUOUS, CONFIDENT, Proposal, nearest_names, propose_mapping
from torchestimator.warm_start import _view
from torchestimator.warm_start._plan import PlanEntry, WarmStartPlan
from torchestimator.warm_start._settings import ConverterSpec, PathOrSource, resolve_converter
from torchestimator.warm_start._spelling import PYTHON, Problem, Spelling, reason_in
from torchestimator.warm_start._view import TF_FORMATS, SourceView

__all__ = ["COUNTER", "build_plan", "closed_on_error"]

logger = logging.getLogger("torchestimator.warm_start")

COUNTER = "num_batches_tracked"


@contextlib.contextmanager
def closed_on_error(weights: WeightSource, owned: bool) -> Iterator[None]:
    """Closes a source we opened when what uses it raises, instead of leaving it to the garbage collector."""
    try:
        yield
    except BaseException:
        if owned:
            weights.close()
        raise


def build_plan(
    module: torch.nn.Module,
    source: PathOrSource,
    selected: list[str],
    explicit: Mapping[str, tuple[str, str]],
    *,
    skipped: list[str],
    converters: Mapping[str, ConverterSpec],
    allow_missing: bool,
    accept_proposals: bool,
    notes: list[str],
    errors: list[Problem],
    owns_source: bool | None = None,
) -> WarmStartPlan:
    weights = source if isinstance(source, WeightSource) else open_weights(source)
    if owns_source is None:
        owns_source = not isinstance(source, WeightSource)
    with closed_on_error(weights, owns_source):
        view = _view.source_view(weights)
        state = module.state_dict(keep_vars=True)
        resolved, unresolved = _resolve_names(selected, explicit, view)
        # Proposals also supply converters for renamed TF/Keras tensors (dense/kernel needs a transpose).
        wanted = selected if weights.format in TF_FORMATS else unresolved
        proposals = _proposals(module, view, wanted) if unresolved or weights.format in TF_FORMATS else {}
        if accept_proposals:
            resolved.update(_usable_proposals(unresolved, proposals, converters, view))
        entries: list[PlanEntry] = []
        kept_fresh: list[tuple[str, str]] = []
        resolved_converters: dict[str, Converter | None] = {}
        missing: list[tuple[str, Problem]] = []
        for target in selected:
            if target not in resolved:
                _unresolved(target, view, proposals.get(target), allow_missing, accept_proposals, kept_fresh, missing)
                continue
            source_name, origin = resolved[target]
            if source_name not in view.infos:
                _missing_source(target, source_name, view, allow_missing, kept_fresh, missing)
                continue
            converter = _entry_converter(target, source_name, converters, proposals.get(target), view)
            entry, problem = _entry(target, source_name, origin, converter, view, state[target])
            if target not in converters:  # a name says which tensor, never which row order
                problem = _unconfirmed_flatten(target, source_name, proposals.get(target)) or problem
            entries.append(entry)
            resolved_converters[target] = converter
            if problem:
                errors.append(problem)
        errors += [problem for _, problem in missing]
        used = {entry.source for entry in entries}
        warnings = notes + _batchnorm_warnings(module, view, entries)
        for warning in warnings:
            logger.debug("%s", warning)
        return WarmStartPlan(
            source_path=os.fspath(weights.path),
            source_format=weights.format,
            entries=tuple(entries),
            skipped=tuple(skipped),
            kept_fresh=tuple(kept_fresh),
            missing=tuple((target, problem.text(PYTHON)) for target, problem in missing),
            unused_sources=tuple(name for name in view.infos if name not in used),
            optimizer_sources=tuple(sorted(view.optimizer.items())),
            proposals=tuple(
                proposals[name] for name in unresolved if name in proposals and name.rpartition(".")[2] != COUNTER
            ),
            warnings=tuple(warnings),
            _problems=tuple(errors),
            _missing_problems=tuple(p for _, p in missing),
            _source=weights,
            _converters=resolved_converters,
            _owns_source=owns_source,
        )


def _resolve_names(
    selected: list[str], explicit: Mapping[str, tuple[str, str]], view: SourceView
) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """({target: (source name, origin)} for targets a name rule resolves, [targets left to the matcher])."""
    resolved: dict[str, tuple[str, str]] = {}
    unresolved: list[str] = []
    for target in selected:
        source_name, origin = explicit.get(target, (target, "same name"))
        found = view.resolve(source_name)
        if found is not None:
            resolved[target] = (found, origin)
        elif target in explicit:
            resolved[target] = (source_name, origin)  # reported missing later, under the name the user gave
        else:
            unresolved.append(target)
    return resolved, unresolved


def _usable_proposals(
    unresolved: list[str],
    proposals: Mapping[str, Proposal],
    converters: Mapping[str, ConverterSpec],
    view: SourceView,
) -> dict[str, tuple[str, str]]:
    """The proposals accept_proposed_mapping takes: confident ones, and ambiguous ones a converter confirms."""
    usable = {}
    for target in unresolved:
        proposal = proposals.get(target)
        if (
            proposal is not None
            and proposal.source is not None
            and (proposal.status == CONFIDENT or (proposal.status == AMBIGUOUS and target in converters))
        ):
            usable[target] = (view.resolve(proposal.source) or proposal.source, "proposal")
    return usable


def _proposals(module: torch.nn.Module, view: SourceView, targets: list[str]) -> dict[str, Proposal]:
    infos = [dataclasses.replace(info, name=name) for name, info in view.infos.items()]
    result = propose_mapping(module, infos, source_order=view.order)
    wanted = set(targets)
    return {proposal.target: proposal for proposal in result.proposals if proposal.target in wanted}


def _unresolved(
    target: str,
    view: SourceView,
    proposal: Proposal | None,
    allow_missing: bool,
    accept_proposals: bool,
    kept_fresh: list[tuple[str, str]],
    missing: list[tuple[str, Problem]],
) -> None:
    if target.rpartition(".")[2] == COUNTER:
        kept_fresh.append((target, "torch-only BatchNorm counter; the source has none, it keeps its value"))
        return
    if allow_missing:
        kept_fresh.append((target, "not in the source (allow_missing=True)"))
        return
    nearest = nearest_names(target, view.infos)
    fact = f"{target}: selected, but the source has no tensor of that name; nearest source names: {_names(nearest)}."

    def words(spelling: Spelling) -> str:
        if proposal is None or proposal.source is None:
            return f"{fact} Map it with {spelling.name_rules}, or pass {spelling.allow_missing}."
        how = _how_to_take(target, proposal, accept_proposals, spelling)
        proposed = (
            f" Proposed: {proposal.source} ({proposal.status}, {proposal.converter}: {reason_in(proposal, spelling)})"
        )
        return f"{fact}{proposed}; {how}." if how else f"{fact}{proposed}."

    missing.append((target, Problem(words)))


def _how_to_take(target: str, proposal: Proposal, accept_proposals: bool, spelling: Spelling) -> str:
    """What turns this proposal into a mapping, in ``spelling``'s words ("" when nothing is left to do)."""
    if proposal.status == CONFIDENT:
        return f"pass {spelling.accept_proposed} to use the proposals" if not accept_proposals else ""
    if proposal.status != AMBIGUOUS:
        return "the proposal's shapes disagree"
    with_accept = f" (with {spelling.accept_proposed})"
    feature_map = proposal.flatten
    if feature_map is not None:
        # A rename alone would load the kernel with the proposal's plain transpose: rows in the wrong order.
        return f"confirm with {spelling.converter(target, spelling.flatten_value(*feature_map))}{with_accept}"
    return (
        f"confirm with {spelling.converter(target, spelling.converter_placeholder)}{with_accept} or "
        f"{spelling.rename(target, proposal.source or '')}"
    )


def _missing_source(
    target: str,
    source_name: str,
    view: SourceView,
    allow_missing: bool,
    kept_fresh: list[tuple[str, str]],
    missing: list[tuple[str, Problem]],
) -> None:
    if allow_missing:
        kept_fresh.append((target, f"{source_name} not in the source (allow_missing=True)"))
        return
    nearest = nearest_names(source_name, view.infos)
    missing.append(
        (
            target,
            Problem.plain(
                f"Tensor {source_name} (for {target}) is not found in {view.source.path}; "
                f"nearest source names: {_names(nearest)}."
            ),
        )
    )


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "(none close; see the unused source tensors)"


def _entry_converter(
    target: str,
    source_name: str,
    converters: Mapping[str, ConverterSpec],
    proposal: Proposal | None,
    view: SourceView,
) -> Converter | None:
    if target in converters:
        return resolve_converter(converters[target], target)
    if proposal is not None and proposal.converter and view.resolve(proposal.source or "") == source_name:
        return None if proposal.converter == "identity" else get_converter(proposal.converter)
    return None


def _unconfirmed_flatten(target: str, source_name: str, proposal: Proposal | None) -> Problem | None:
    """The problem of a Linear after a Flatten of a feature map loaded from a TF/Keras Dense kernel, when no
    converter was named for it; None for any other target.

    Whatever named the source (a rename, mapping_fn, an assignment map, the same name), the kernel's rows are in
    the order the source flattened its feature map: NHWC for Keras's default, NCHW for torch. The plain
    transpose a rename would get loads NHWC rows into an NCHW model without an error, so only a converter named
    for the target decides, as with accept_proposed_mapping.
    """
    feature_map = proposal.flatten if proposal is not None else None
    if feature_map is None:
        return None
    channels, positions = feature_map
    fact = (
        f"{target} <- {source_name}: this Linear follows a Flatten of a {channels}-channel feature map, so the "
        "source's Dense kernel rows are in the order the source flattened it (NHWC for Keras's default), "
        "which a name cannot tell; the plain transpose would load them in the wrong order, silently."
    )

    def words(spelling: Spelling) -> str:
        plain = spelling.converter(target, spelling.converter_name("dense_to_linear"))
        return (
            f"{fact} Name its converter: confirm with {spelling.flatten_setting(target, channels, positions)}, "
            f"or {plain} if the source flattened channels first or this module flattens in the source's order "
            "(e.g. permutes to NHWC before flatten)."
        )

    return Problem(words)


def _entry(
    target: str,
    source_name: str,
    origin: str,
    converter: Converter | None,
    view: SourceView,
    tensor: torch.Tensor,
) -> tuple[PlanEntry, Problem | None]:
    info = view.infos[source_name]
    target_shape = tuple(tensor.shape)
    shape: tuple[int, ...] | None = tuple(info.shape)
    problem: Problem | None = None
    if info.dtype == "string":
        problem = Problem.plain(f"{source_name} holds strings; it cannot load into {target}.")
    elif converter is not None:
        shape = converter.output_shape(tuple(info.shape))
        if shape is None:
            # A user function (or a converter refusing this shape): run it to know.
            try:
                shape = tuple(converter(view.read(source_name)).shape)
            except (ValueError, TypeError) as error:
                problem = Problem.plain(
                    f"{converter.name} cannot convert {source_name} {tuple(info.shape)} for {target}: {error}"
                )
    if problem is None and shape != target_shape:
        after = f" ({tuple(info.shape)} before {converter.name})" if converter is not None else ""
        fact = f"Shape of {target} {target_shape} doesn't match {source_name} {shape}{after}."
        problem = Problem(
            lambda s: (
                f"{fact} Pick another source name ({s.renames}) or converter ({s.converters}), "
                f"or leave it out of {s.selection}."
            )
        )
    entry = PlanEntry(
        target=target,
        source=source_name,
        source_key=info.name,
        origin=origin,
        converter=converter.name if converter is not None else "identity",
        source_shape=tuple(info.shape),
        converted_shape=shape,
        target_shape=target_shape,
        source_dtype=info.dtype,
        target_dtype=str(tensor.dtype).removeprefix("torch."),
    )
    return entry, problem


def _batchnorm_warnings(module: torch.nn.Module, view: SourceView, entries: list[PlanEntry]) -> list[str]:
    if view.source.format not in TF_FORMATS:
        return []
    loaded = {entry.target: entry.source_key for entry in entries}
    warnings = []
    for path, layer in module.named_modules():
        if not isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            continue
        prefix = f"{path}." if path else ""
        sources = [
            loaded[name]
            for member in ("weight", "bias", "running_mean", "running_var")
            if (name := f"{prefix}{member}") in loaded
        ]
        if not sources:
            continue
        # The epsilon/momentum the file records for that layer (ResNet50: 1.001e-5), else Keras's defaults.
        settings = batchnorm_settings(view.source.layer_config(sources[0]))
        found = check_batchnorm_conventions(settings.epsilon, settings.momentum, layer, origin=settings.origin)
        warnings += [f"{path or '(root)'}: {warning}" for warning in found]
    return warnings
