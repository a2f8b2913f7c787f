"""The warm-start plan: what loads from where, computed without touching the module; its report and its apply.

What belongs here: ``PlanEntry``, ``WarmStartPlan`` (``apply``: the
all-or-nothing copy into the plain module; ``format``: the dry run;
``to_dict``/``to_json``; each with its advice worded for Python or, with
``for_cli=True``, for the ``torchestimator warm-start`` flags). What does not: making a plan
(``_build``), the selection rules (``_selection``, ``_assignment_map``), the words
(``_spelling``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy
import torch

from torchestimator.interop import WeightSource
from torchestimator.interop.layouts import Converter
from torchestimator.interop.matching import Proposal
from torchestimator.warm_start._spelling import Problem, Spelling, reason_in, spelling_for

__all__ = ["PlanEntry", "WarmStartPlan"]

logger = logging.getLogger("torchestimator.warm_start")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanEntry:
    """One tensor to load: target <- source, with the layout conversion and both shapes."""

    target: str
    source: str
    """The source name as the report shows it."""
    source_key: str
    """The name stored in the file (differs for TF2 object paths and Keras 3 aliases)."""
    origin: str
    """Why this source: "same name", "renamed", "mapping_fn", "assignment_map" or "proposal"."""
    converter: str
    source_shape: tuple[int, ...]
    converted_shape: tuple[int, ...] | None
    """After the converter; None when only running it can tell (a user function)."""
    target_shape: tuple[int, ...]
    source_dtype: str
    target_dtype: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmStartPlan:
    """What a warm start will do, computed without touching the module; ``apply`` does it."""

    source_path: str
    source_format: str
    entries: tuple[PlanEntry, ...]
    skipped: tuple[str, ...]
    """Targets not selected: they keep their fresh values."""
    kept_fresh: tuple[tuple[str, str], ...]
    """(target, why): selected but not loaded, and not an error (allow_missing, num_batches_tracked)."""
    missing: tuple[tuple[str, str], ...]
    """(target, explanation with the nearest source names): selected, no source tensor; an error.
    The explanation's advice names the Python settings (``to_dict(for_cli=True)`` names the flags)."""
    unused_sources: tuple[str, ...]
    """Source model variables nothing loads from."""
    optimizer_sources: tuple[tuple[str, str], ...]
    """(raw source name, why): optimizer slots and bookkeeping, never loaded, not an error."""
    proposals: tuple[Proposal, ...]
    """The matcher's proposals for targets no name rule resolved."""
    warnings: tuple[str, ...]
    _problems: tuple[Problem, ...] = dataclasses.field(repr=False, compare=False)
    _missing_problems: tuple[Problem, ...] = dataclasses.field(repr=False, compare=False)
    """The problems of ``missing``, in its order."""
    _source: WeightSource = dataclasses.field(repr=False, compare=False)
    _converters: Mapping[str, Converter | None] = dataclasses.field(repr=False, compare=False)
    _owns_source: bool = dataclasses.field(default=False, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self._problems

    @property
    def errors(self) -> tuple[str, ...]:
        """Every problem, its advice naming the Python settings (``WarmStartSettings``' arguments)."""
        return self.error_messages()

    def error_messages(self, *, for_cli: bool = False) -> tuple[str, ...]:
        """Every problem; with ``for_cli`` its advice names ``torchestimator warm-start``'s flags instead."""
        spelling = spelling_for(for_cli)
        return tuple(problem.text(spelling) for problem in self._problems)

    def raise_for_errors(self) -> None:
        """ValueError listing every problem of the plan; nothing when the plan is sound."""
        if self.errors:
            problems = "\n  - ".join(self.errors)
            raise ValueError(
                f"Cannot warm-start from {self.source_path} ({self.source_format}); nothing was loaded:\n"
                f"  - {problems}\nRun the dry run (plan.format()) to see the whole plan."
            )

    def apply(self, module: torch.nn.Module) -> int:
        """Copy every entry into ``module`` (the plain module, before DDP/FSDP); all or nothing.

        Every tensor is read, converted, checked and cast to the target's dtype
        and device before the first copy, so a failure leaves the module unchanged.
        Returns the number of tensors loaded.
        """
        self.raise_for_errors()
        state = module.state_dict(keep_vars=True)
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        for entry in self.entries:
            target = state.get(entry.target)
            if target is None:
                raise ValueError(
                    f"Warm start: the module has no tensor {entry.target!r}; the plan was made for another "
                    "module. Make the plan with the module you apply it to."
                )
            value = self._converted(entry)
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(
                    f"Warm start: shape of {entry.target} {tuple(target.shape)} doesn't match {entry.source} "
                    f"{tuple(value.shape)} after {entry.converter}. Nothing was loaded."
                )
            staged.append((target, torch.from_numpy(value).to(device=target.device, dtype=target.dtype)))
        with torch.no_grad():
            for target, tensor in staged:
                target.copy_(tensor)
        logger.info("Warm-started %d variables.", len(staged))
        return len(staged)

    def _converted(self, entry: PlanEntry) -> numpy.ndarray:
        value = self._source.read(entry.source_key)
        if value.dtype == object:
            raise ValueError(
                f"Warm start: {entry.source} in {self.source_path} holds strings, which cannot load into "
                f"{entry.target}."
            )
        converter = self._converters.get(entry.target)
        value = numpy.asarray(converter(value) if converter is not None else value)
        # Not numpy.ascontiguousarray: it turns 0-d arrays (num_batches_tracked) into shape (1,).
        if not value.flags.c_contiguous or not value.flags.writeable:
            value = value.copy(order="C")
        return value

    def close(self) -> None:
        """Close the weight source if this plan opened it (a WeightSource passed in stays open)."""
        if self._owns_source:
            self._source.close()

    def to_dict(self, *, for_cli: bool = False) -> dict[str, Any]:
        """The plan as JSON-ready data (for tools and the CLI's --json: ``for_cli`` words the advice as flags)."""
        spelling = spelling_for(for_cli)
        return {
            "source": self.source_path,
            "format": self.source_format,
            "ok": self.ok,
            "load": [dataclasses.asdict(entry) for entry in self.entries],
            "skipped": list(self.skipped),
            "kept_fresh": [{"target": target, "why": why} for target, why in self.kept_fresh],
            "missing": [
                {"target": target, "why": problem.text(spelling)}
                for (target, _), problem in zip(self.missing, self._missing_problems)
            ],
            "unused_sources": list(self.unused_sources),
            "optimizer_sources": [{"source": name, "why": why} for name, why in self.optimizer_sources],
            "proposals": [
                {**dataclasses.asdict(proposal), "reason": reason_in(proposal, spelling)} for proposal in self.proposals
            ],
            "warnings": list(self.warnings),
            "errors": list(self.error_messages(for_cli=for_cli)),
        }

    def to_json(self, *, for_cli: bool = False) -> str:
        return json.dumps(self.to_dict(for_cli=for_cli), indent=1)

    def format(self, *, for_cli: bool = False) -> str:
        """The dry run: a text report of what loads, from where, with which conversion, and what stays fresh.

        ``for_cli``: the advice names ``torchestimator warm-start``'s flags (``--converter``) rather than
        ``WarmStartSettings``' arguments (``converters=``).
        """
        return format_plan(self, spelling_for(for_cli))


# ----------------------------------------------------------------------------- report


def format_plan(plan: WarmStartPlan, spelling: Spelling) -> str:
    lines = [f"Warm start from {plan.source_path} ({plan.source_format})"]
    lines.append(
        f"  {len(plan.entries)} to load, {len(plan.skipped)} not selected, {len(plan.kept_fresh)} kept "
        f"fresh, {len(plan.missing)} missing, {len(plan.unused_sources)} source tensors unused, "
        f"{len(plan.optimizer_sources)} optimizer/bookkeeping tensors ignored."
    )
    if plan.entries:
        rows = [("target", "<-", "source", "conversion", "shape", "origin")]
        rows += [(e.target, "<-", e.source, e.converter, _shape_text(e), e.origin) for e in plan.entries]
        lines += ["", "Load:"] + _table(rows)
    sections = [
        ("Not selected (fresh):", list(plan.skipped)),
        ("Kept fresh:", [f"{target}: {why}" for target, why in plan.kept_fresh]),
        ("Unused source tensors:", list(plan.unused_sources)),
        (
            "Optimizer slots and bookkeeping (not loaded, not an error):",
            [f"{name} ({why})" for name, why in plan.optimizer_sources],
        ),
        (
            "Proposed mapping (by layer kind, order and shape):",
            [
                f"{p.target} <- {p.source or '-'} [{p.status}, {p.converter or '-'}] {reason_in(p, spelling)}"
                for p in plan.proposals
            ],
        ),
        ("Warnings:", list(plan.warnings)),
        ("ERRORS (nothing will be loaded):", [problem.text(spelling) for problem in plan._problems]),
    ]
    for title, items in sections:
        if items:
            lines += ["", title] + [f"  {item}" for item in items]
    return "\n".join(lines)


def _shape_text(entry: PlanEntry) -> str:
    if entry.converter == "identity":
        return str(list(entry.target_shape))
    converted = list(entry.converted_shape) if entry.converted_shape is not None else "?"
    return f"{list(entry.source_shape)} -> {converted}"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
