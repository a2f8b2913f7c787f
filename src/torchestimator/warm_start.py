"""Warm start: which target tensors load from which source tensors, the report, and the copy.

What belongs here: ``WarmStartSettings`` (TensorFlow's selection rules, translated
to PyTorch names), ``init_from_checkpoint``'s scope maps, the ``WarmStartPlan``
(computed without touching the module, shown by ``format()`` as the dry run) and
``apply`` (all-or-nothing copy into the plain module). What does not: reading
files (``torchestimator.interop`` readers), layout conversions
(``interop.layouts``), proposing a mapping (``interop.matching``), and when warm
start happens (the Estimator: a checkpoint in ``model_dir`` always wins).

Names: the *target* is a ``module.state_dict()`` key (``encoder.0.weight``), the
*source* is a name in the weight file as the report shows it:

* TF1 checkpoints, torch files, safetensors, our checkpoints: the stored name;
* TF2 object-based checkpoints: the object path of each model variable
  (``model/_functional/_operations/1/kernel``; Keras 3's private ``_kernel`` is
  shown as ``kernel``), from the checkpoint's object graph, so weights Keras 3
  saved under ``optimizer/_trainable_variables/N`` are found; the raw key is
  accepted too;
* Keras 3 ``.weights.h5``: Keras's own variable path (``conv/kernel``) where the
  reader can rebuild it, else the HDF5 path (``layers/conv2d/vars/0``); both are
  accepted.

Optimizer slots and bookkeeping (``dense/kernel/Adam``, ``beta1_power``,
``global_step``, ``optimizer/...``) are never loaded into a model: the report
lists them as unused, which is not an error (the Adam -> SGD switch works).

Exceptions: ``ValueError`` for every user mistake (a bad pattern, a plan with
errors when applied, a bad assignment map), ``TypeError`` for wrong argument
types; ``interop.WeightSourceError`` (a ValueError) for unreadable files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Union

import numpy
import torch

from torchestimator.interop import WeightSource, open_weights
from torchestimator.interop.layouts import Converter, check_batchnorm_conventions, get_converter
from torchestimator.interop.matching import AMBIGUOUS, CONFIDENT, Proposal, nearest_names, propose_mapping
from torchestimator.interop.source import TensorInfo

__all__ = [
    "PlanEntry",
    "WarmStartPlan",
    "WarmStartSettings",
    "as_warm_start_settings",
    "init_from_checkpoint",
    "plan_init_from_checkpoint",
    "plan_warm_start",
    "warm_start",
]

logger = logging.getLogger(__name__)

ConverterSpec = Union[str, Converter, Callable[[numpy.ndarray], numpy.ndarray]]
PathOrSource = Union[str, "os.PathLike[str]", WeightSource]

_COUNTER = "num_batches_tracked"
_TF_FORMATS = ("tensorflow", "keras_h5", "keras3_weights_h5")


# ----------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
    """What to warm-start from, and which tensors: ``tf.estimator.WarmStartSettings`` for PyTorch.

    Selection (``vars_to_warm_start``), as in TensorFlow, with ``re.match``
    (anchored at the start only: ``"encoder"`` also picks ``encoder2.weight``;
    end a pattern with ``\\.`` or ``$`` to be strict):

    * a **string**: one regex over the *trainable parameters* only
      (``named_parameters()`` with ``requires_grad``), like TF's
      ``TRAINABLE_VARIABLES`` collection. The default ``".*"`` therefore leaves
      BatchNorm running statistics (buffers) and frozen parameters fresh.
    * a **list of strings**: regexes over *all* ``state_dict`` entries,
      parameters and persistent buffers (BatchNorm ``running_mean`` /
      ``running_var``), like TF's ``GLOBAL_VARIABLES``; ``[".*"]`` warm-starts
      everything. BatchNorm's ``num_batches_tracked`` counter is selected like
      any buffer and loads when the source holds it (our own checkpoints,
      torch files); TF/Keras have no counterpart, so when the source lacks it
      it keeps its fresh value and the report says so, never an error (it only
      matters with ``momentum=None``).
    * ``None``: nothing is warm-started (a warning is logged).

    A selection that matches nothing is an error: a pattern that warm-starts
    nothing is almost always a mistake.

    ``var_name_to_prev_var_name`` maps a target name to its source name; it
    only renames, it does not select, and a key that names no selected target
    is an error ("were not used. Perhaps you misspelled them?"), as in TF.

    Source name of a selected target, first that applies: the rename; then
    ``mapping_fn(target)`` unless it returns None; then the same name; then,
    only when ``accept_proposed_mapping`` is true, ``interop.matching``'s
    proposal (by layer kind, order and shape; ``confident`` proposals only, an
    ``ambiguous`` one when its target also appears in ``converters``, which
    confirms it). Proposals are always computed for targets left without a
    source and shown in the report.

    Layout converter of an entry: ``converters[target]`` (a name in
    ``interop.layouts.CONVERTERS``, a ``Converter``, or any function of a numpy
    array); else the proposal's converter when the proposal pairs the same two
    names; else none (identity).
    """

    ckpt_to_initialize_from: PathOrSource
    """Any path ``interop.open_weights`` reads (file, model_dir, TF checkpoint), or an open ``WeightSource``."""
    vars_to_warm_start: str | Sequence[str] | None = ".*"
    """One regex (trainable parameters), a list of regexes (parameters and buffers), or None (nothing)."""
    var_name_to_prev_var_name: Mapping[str, str] | None = None
    """Target name -> source name; renames only."""
    _: dataclasses.KW_ONLY
    allow_missing: bool = False
    """Selected targets absent from the source keep their fresh values instead of raising."""
    mapping_fn: Callable[[str], str | None] | None = None
    """target name -> source name, or None to fall through to the other rules."""
    converters: Mapping[str, ConverterSpec] | None = None
    """Target name -> layout converter (name, ``Converter`` or function of a numpy array)."""
    accept_proposed_mapping: bool = False
    """Use the matcher's proposals for targets no other rule resolves (see the class docstring)."""
    warm_start_optimizer: bool = False
    """Also take the optimizer (and LR scheduler) state, from a torchestimator checkpoint only; it loads
    when the optimizer's class and parameter groups match, else it starts fresh with a warning."""

    def __post_init__(self) -> None:
        source = self.ckpt_to_initialize_from
        if not isinstance(source, (str, os.PathLike, WeightSource)):
            raise TypeError(
                "ckpt_to_initialize_from must be a path or a WeightSource; received "
                f"{type(source).__name__}."
            )
        if isinstance(source, (str, os.PathLike)) and not os.fspath(source):
            raise ValueError("ckpt_to_initialize_from must not be empty: name the checkpoint or weight file.")
        patterns = self.vars_to_warm_start
        if isinstance(patterns, (list, tuple)):
            object.__setattr__(self, "vars_to_warm_start", tuple(patterns))
        elif patterns is not None and not isinstance(patterns, str):
            raise TypeError(
                "vars_to_warm_start must be a regex string, a list of regex strings, or None; received "
                f"{type(patterns).__name__}."
            )
        for pattern in _pattern_list(self.vars_to_warm_start):
            _compile(pattern)
        _check_str_mapping(self.var_name_to_prev_var_name, "var_name_to_prev_var_name")
        if self.mapping_fn is not None and not callable(self.mapping_fn):
            raise TypeError(f"mapping_fn must be callable; received {type(self.mapping_fn).__name__}.")
        for target, spec in (self.converters or {}).items():
            _resolve_converter(spec, target)
        for flag in ("allow_missing", "accept_proposed_mapping", "warm_start_optimizer"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False; received {getattr(self, flag)!r}.")


def as_warm_start_settings(value: PathOrSource | WarmStartSettings) -> WarmStartSettings:
    """``warm_start_from`` as settings: a path becomes ``WarmStartSettings(path)``, as in TensorFlow."""
    if isinstance(value, WarmStartSettings):
        return value
    if isinstance(value, (str, os.PathLike, WeightSource)):
        return WarmStartSettings(value)
    raise TypeError(
        f"warm_start_from must be a path, a WeightSource or a WarmStartSettings; received {type(value).__name__}."
    )


def _pattern_list(patterns: str | Sequence[str] | None) -> list[str]:
    if patterns is None:
        return []
    if isinstance(patterns, str):
        return [patterns]
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(
                "vars_to_warm_start as a list must hold regex strings only; received an item of type "
                f"{type(pattern).__name__} ({pattern!r})."
            )
    return list(patterns)


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ValueError(f"vars_to_warm_start: {pattern!r} is not a valid regex: {error}.") from None


def _check_str_mapping(mapping: Any, label: str) -> None:
    if mapping is None:
        return
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{label} must be a dict of str -> str; received {type(mapping).__name__}.")
    for key, value in mapping.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"{label} must map str -> str; received {key!r}: {value!r}.")


def _resolve_converter(spec: ConverterSpec | None, target: str) -> Converter | None:
    if spec is None:
        return None
    if isinstance(spec, Converter):
        return spec
    if isinstance(spec, str):
        return get_converter(spec)
    if callable(spec):
        name = getattr(spec, "__name__", type(spec).__name__)
        return Converter(name=name, description="user function", function=spec, output_shape=lambda shape: None)
    raise TypeError(
        f"converters[{target!r}] must be a converter name, a Converter or a function of a numpy array; "
        f"received {type(spec).__name__}."
    )


# ----------------------------------------------------------------------------- source view


@dataclasses.dataclass
class _SourceView:
    """The source's model variables under the names the report shows; optimizer state set aside."""

    source: WeightSource
    infos: dict[str, TensorInfo]  # view name -> info (info.name is the raw key)
    aliases: dict[str, str]  # raw key or other accepted name -> view name
    optimizer: dict[str, str]  # raw key -> why it is not a model variable
    order: list[str] | None

    def resolve(self, name: str) -> str | None:
        if name in self.infos:
            return name
        return self.aliases.get(name)

    def read(self, name: str) -> numpy.ndarray:
        return self.source.read(self.infos[name].name)


def _source_view(source: WeightSource) -> _SourceView:
    infos = {info.name: info for info in source.tensors()}
    if source.format == "tensorflow":
        return _tensorflow_view(source, infos)
    if source.format in ("keras_h5", "keras3_weights_h5"):
        return _keras_view(source, infos)
    return _SourceView(source, infos, {}, {}, None)


def _tensorflow_view(source: Any, infos: dict[str, TensorInfo]) -> _SourceView:
    from torchestimator.interop.tf_checkpoint import is_optimizer_variable

    variables = source.model_variables()  # friendly name -> raw key; identity for TF1
    view: dict[str, TensorInfo] = {}
    aliases: dict[str, str] = {}
    for path, key in variables.items():
        head, _, last = path.rpartition("/")
        # Keras 3 keeps Dense/Conv kernels in a private `_kernel` attribute; the layer's weight is `kernel`.
        public = f"{head}/{last.lstrip('_')}" if head and last.startswith("_") and last.lstrip("_") else path
        name = public if public not in variables and public not in view else path
        view[name] = infos[key]
        aliases.setdefault(key, name)
        aliases.setdefault(path, name)
    used = {info.name for info in view.values()}
    optimizer = {
        key: "optimizer slot or bookkeeping" if is_optimizer_variable(key) else "not a model variable"
        for key in infos if key not in used
    }
    return _SourceView(source, view, aliases, optimizer, None)


def _keras_view(source: Any, infos: dict[str, TensorInfo]) -> _SourceView:
    by_raw = {raw: alias for alias, raw in source.aliases().items()}
    view: dict[str, TensorInfo] = {}
    aliases: dict[str, str] = {}
    optimizer: dict[str, str] = {}
    for raw, info in infos.items():
        if raw.startswith(("optimizer/", "optimizer_weights/")):
            optimizer[raw] = "optimizer state"
            continue
        name = by_raw.get(raw, raw)
        view[name] = info
        aliases[raw] = name
    order = [layer for layer, _ in source.layers()]
    return _SourceView(source, view, aliases, optimizer, order)


# ----------------------------------------------------------------------------- the plan


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
    """(target, explanation with the nearest source names): selected, no source tensor; an error."""
    unused_sources: tuple[str, ...]
    """Source model variables nothing loads from."""
    optimizer_sources: tuple[tuple[str, str], ...]
    """(raw source name, why): optimizer slots and bookkeeping, never loaded, not an error."""
    proposals: tuple[Proposal, ...]
    """The matcher's proposals for targets no name rule resolved."""
    warnings: tuple[str, ...]
    errors: tuple[str, ...]
    _source: WeightSource = dataclasses.field(repr=False, compare=False)
    _converters: Mapping[str, Converter | None] = dataclasses.field(repr=False, compare=False)
    _owns_source: bool = dataclasses.field(default=False, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.errors

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
            for target, value in staged:
                target.copy_(value)
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

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (for tools and the CLI's --json)."""
        return {
            "source": self.source_path,
            "format": self.source_format,
            "ok": self.ok,
            "load": [dataclasses.asdict(entry) for entry in self.entries],
            "skipped": list(self.skipped),
            "kept_fresh": [{"target": target, "why": why} for target, why in self.kept_fresh],
            "missing": [{"target": target, "why": why} for target, why in self.missing],
            "unused_sources": list(self.unused_sources),
            "optimizer_sources": [{"source": name, "why": why} for name, why in self.optimizer_sources],
            "proposals": [dataclasses.asdict(proposal) for proposal in self.proposals],
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def format(self) -> str:
        """The dry run: a text report of what loads, from where, with which conversion, and what stays fresh."""
        return _format_plan(self)


def plan_warm_start(
    module: torch.nn.Module, settings: WarmStartSettings | PathOrSource
) -> WarmStartPlan:
    """The plan for warm-starting ``module`` with ``settings``; reads names and shapes only, changes nothing."""
    settings = as_warm_start_settings(settings)
    state = module.state_dict(keep_vars=True)
    selected, notes, errors = _select(module, settings.vars_to_warm_start)
    renames = dict(settings.var_name_to_prev_var_name or {})
    unused_keys = sorted(set(renames) - set(selected))
    if unused_keys:
        errors.append(
            f"var_name_to_prev_var_name keys {unused_keys} were not used. Perhaps you misspelled them? "
            "Keys are target (module) names among the selected tensors."
        )
    unused_converters = sorted(set(settings.converters or {}) - set(selected))
    if unused_converters:
        errors.append(
            f"converters keys {unused_converters} were not used: they name no selected target. "
            "Perhaps you misspelled them?"
        )
    explicit: dict[str, tuple[str, str]] = {}
    for target in selected:
        if target in renames:
            explicit[target] = (renames[target], "renamed")
        elif settings.mapping_fn is not None and (mapped := settings.mapping_fn(target)) is not None:
            if not isinstance(mapped, str):
                raise TypeError(f"mapping_fn({target!r}) must return a source name or None; received {mapped!r}.")
            explicit[target] = (mapped, "mapping_fn")
    return _build_plan(
        module, settings.ckpt_to_initialize_from, selected, explicit,
        skipped=[name for name in state if name not in set(selected)],
        converters=settings.converters or {}, allow_missing=settings.allow_missing,
        accept_proposals=settings.accept_proposed_mapping, notes=notes, errors=errors,
    )  # fmt: skip


def _select(module: torch.nn.Module, patterns: str | Sequence[str] | None) -> tuple[list[str], list[str], list[str]]:
    """TF's selection: (selected target names, notes, errors)."""
    if isinstance(patterns, str):
        candidates = [name for name, parameter in module.named_parameters() if parameter.requires_grad]
    else:
        candidates = list(module.state_dict(keep_vars=True))
    regexes = [_compile(pattern) for pattern in _pattern_list(patterns)]
    selected = [name for name in candidates if any(regex.match(name) for regex in regexes)]
    notes: list[str] = []
    errors: list[str] = []
    if patterns is None:
        message = "vars_to_warm_start=None: nothing is warm-started."
        logger.warning(message)
        notes.append(message)
    elif not selected:
        kind = "trainable parameters" if isinstance(patterns, str) else "parameters and buffers"
        errors.append(
            f"vars_to_warm_start={patterns!r} selects none of the module's {len(candidates)} {kind} "
            f"(re.match, anchored at the start; e.g. {candidates[:3]}). A pattern that warm-starts nothing "
            "is almost always a mistake."
        )
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


# ----------------------------------------------------------------------------- init_from_checkpoint


def init_from_checkpoint(module: torch.nn.Module, source: PathOrSource, assignment_map: Any,
                         **options: Any) -> WarmStartPlan:
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
    state = module.state_dict(keep_vars=True)
    explicit: dict[str, tuple[str, str]] = {}
    errors: list[str] = []
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(part, str) for part in pair)):
            raise TypeError(f"assignment_map must map source names to target names (str -> str); received {pair!r}.")
        if _is_scope(pair[1]) and not (_is_scope(pair[0]) or pair[0] == "/"):
            raise ValueError(
                f"assignment_map: {pair[1]!r} is a scope, so its key must be a scope too (ending in '/' or '.', "
                f"or '/' for the source root); received {pair[0]!r}."
            )
    weights = source if isinstance(source, WeightSource) else open_weights(source)
    with _closed_on_error(weights, not isinstance(source, WeightSource)):
        peek = _source_view(weights)
    view_names = set(peek.infos) | set(peek.aliases)
    for pair in pairs:
        source_name, target_name = pair
        if _is_scope(target_name):
            prefix = _normalize(target_name)
            targets = [name for name in state if _normalize(name).startswith(prefix)]
            if not targets:
                errors.append(f"assignment_map scope {target_name!r} holds no tensor of the module.")
            for target in targets:
                remainder = target[len(target_name):]
                root = "" if source_name == "/" else source_name
                explicit[target] = (_scoped_name(root, remainder, view_names), "assignment_map")
        elif target_name in state:
            explicit[target_name] = (source_name, "assignment_map")
        else:
            errors.append(
                f"assignment_map target {target_name!r} is not a tensor of the module; nearest names: "
                f"{nearest_names(target_name, state)}."
            )
    selected = [name for name in state if name in explicit]
    return _build_plan(
        module, weights, selected, explicit, skipped=[name for name in state if name not in explicit],
        converters=converters or {}, allow_missing=allow_missing, accept_proposals=False, notes=[], errors=errors,
        owns_source=not isinstance(source, WeightSource),
    )  # fmt: skip


def _is_scope(name: str) -> bool:
    return name.endswith(("/", "."))


def _normalize(name: str) -> str:
    return name.replace(".", "/")


def _scoped_name(root: str, remainder: str, known: set[str]) -> str:
    """The source name for ``root`` + ``remainder``, trying both separators; the first form when none exists."""
    candidates = [root + remainder, root + remainder.replace(".", "/"), root + remainder.replace("/", ".")]
    return next((candidate for candidate in candidates if candidate in known), candidates[1 if "/" in root else 0])


# ----------------------------------------------------------------------------- building the plan


@contextlib.contextmanager
def _closed_on_error(weights: WeightSource, owned: bool) -> Iterator[None]:
    """Closes a source we opened when what uses it raises, instead of leaving it to the garbage collector."""
    try:
        yield
    except BaseException:
        if owned:
            weights.close()
        raise


def _build_plan(
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
    errors: list[str],
    owns_source: bool | None = None,
) -> WarmStartPlan:
    weights = source if isinstance(source, WeightSource) else open_weights(source)
    if owns_source is None:
        owns_source = not isinstance(source, WeightSource)
    with _closed_on_error(weights, owns_source):
        view = _source_view(weights)
        state = module.state_dict(keep_vars=True)
        resolved: dict[str, tuple[str, str]] = {}
        unresolved: list[str] = []
        for target in selected:
            source_name, origin = explicit.get(target, (target, "same name"))
            if view.resolve(source_name) is not None:
                resolved[target] = (view.resolve(source_name), origin)
            elif target in explicit:
                resolved[target] = (source_name, origin)  # reported missing below, under the name the user gave
            else:
                unresolved.append(target)
        # Proposals also supply converters for renamed TF/Keras tensors (dense/kernel needs a transpose).
        wanted = selected if weights.format in _TF_FORMATS else unresolved
        proposals = _proposals(module, view, wanted) if unresolved or weights.format in _TF_FORMATS else {}
        for target in unresolved:
            proposal = proposals.get(target)
            usable = proposal is not None and proposal.source is not None and (
                proposal.status == CONFIDENT or (proposal.status == AMBIGUOUS and target in converters))
            if accept_proposals and usable:
                resolved[target] = (view.resolve(proposal.source) or proposal.source, "proposal")
        entries, kept_fresh, missing, resolved_converters = [], [], [], {}
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
            entries.append(entry)
            resolved_converters[target] = converter
            if problem:
                errors.append(problem)
        errors += [why for _, why in missing]
        used = {entry.source for entry in entries}
        warnings = notes + _batchnorm_warnings(module, view, entries)
        for warning in warnings:
            logger.debug("%s", warning)
        return WarmStartPlan(
            source_path=os.fspath(weights.path), source_format=weights.format, entries=tuple(entries),
            skipped=tuple(skipped), kept_fresh=tuple(kept_fresh), missing=tuple(missing),
            unused_sources=tuple(name for name in view.infos if name not in used),
            optimizer_sources=tuple(sorted(view.optimizer.items())),
            proposals=tuple(proposals[name] for name in unresolved
                            if name in proposals and name.rpartition(".")[2] != _COUNTER),
            warnings=tuple(warnings), errors=tuple(errors), _source=weights, _converters=resolved_converters,
            _owns_source=owns_source,
        )  # fmt: skip


def _proposals(module: torch.nn.Module, view: _SourceView, targets: list[str]) -> dict[str, Proposal]:
    infos = [dataclasses.replace(info, name=name) for name, info in view.infos.items()]
    result = propose_mapping(module, infos, source_order=view.order)
    wanted = set(targets)
    return {proposal.target: proposal for proposal in result.proposals if proposal.target in wanted}


def _unresolved(
    target: str,
    view: _SourceView,
    proposal: Proposal | None,
    allow_missing: bool,
    accept_proposals: bool,
    kept_fresh: list[tuple[str, str]],
    missing: list[tuple[str, str]],
) -> None:
    if target.rpartition(".")[2] == _COUNTER:
        kept_fresh.append((target, "torch-only BatchNorm counter; the source has none, it keeps its value"))
        return
    if allow_missing:
        kept_fresh.append((target, "not in the source (allow_missing=True)"))
        return
    nearest = nearest_names(target, view.infos)
    why = f"{target}: selected, but the source has no tensor of that name; nearest source names: {_names(nearest)}."
    if proposal is not None and proposal.source is not None:
        if proposal.status == CONFIDENT:
            how = "pass accept_proposed_mapping=True to use the proposals" if not accept_proposals else ""
        elif proposal.status == AMBIGUOUS:
            how = (f"confirm with converters={{{target!r}: ...}} (with accept_proposed_mapping=True) or "
                   f"var_name_to_prev_var_name={{{target!r}: {proposal.source!r}}}")  # fmt: skip
        else:
            how = "the proposal's shapes disagree"
        why += f" Proposed: {proposal.source} ({proposal.status}, {proposal.converter}: {proposal.reason})"
        why += f"; {how}." if how else "."
    else:
        why += " Map it with var_name_to_prev_var_name or mapping_fn, or pass allow_missing=True."
    missing.append((target, why))


def _missing_source(
    target: str,
    source_name: str,
    view: _SourceView,
    allow_missing: bool,
    kept_fresh: list[tuple[str, str]],
    missing: list[tuple[str, str]],
) -> None:
    if allow_missing:
        kept_fresh.append((target, f"{source_name} not in the source (allow_missing=True)"))
        return
    nearest = nearest_names(source_name, view.infos)
    missing.append((target, f"Tensor {source_name} (for {target}) is not found in {view.source.path}; nearest "
                            f"source names: {_names(nearest)}."))  # fmt: skip


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "(none close; see the unused source tensors)"


def _entry_converter(
    target: str, source_name: str, converters: Mapping[str, ConverterSpec], proposal: Proposal | None,
    view: _SourceView,
) -> Converter | None:
    if target in converters:
        return _resolve_converter(converters[target], target)
    if proposal is not None and proposal.converter and view.resolve(proposal.source or "") == source_name:
        return None if proposal.converter == "identity" else get_converter(proposal.converter)
    return None


def _entry(
    target: str, source_name: str, origin: str, converter: Converter | None, view: _SourceView,
    tensor: torch.Tensor,
) -> tuple[PlanEntry, str | None]:
    info = view.infos[source_name]
    target_shape = tuple(tensor.shape)
    shape: tuple[int, ...] | None = tuple(info.shape)
    problem = None
    if info.dtype == "string":
        problem = f"{source_name} holds strings; it cannot load into {target}."
    elif converter is not None:
        shape = converter.output_shape(tuple(info.shape))
        if shape is None:
            # A user function (or a converter refusing this shape): run it to know.
            try:
                shape = tuple(converter(view.read(source_name)).shape)
            except (ValueError, TypeError) as error:
                problem = f"{converter.name} cannot convert {source_name} {tuple(info.shape)} for {target}: {error}"
    if problem is None and shape != target_shape:
        after = f" ({tuple(info.shape)} before {converter.name})" if converter is not None else ""
        problem = (f"Shape of {target} {target_shape} doesn't match {source_name} {shape}{after}. Pick another "
                   "source name or converter, or leave it out of vars_to_warm_start.")  # fmt: skip
    entry = PlanEntry(
        target=target, source=source_name, source_key=info.name, origin=origin,
        converter=converter.name if converter is not None else "identity", source_shape=tuple(info.shape),
        converted_shape=shape, target_shape=target_shape, source_dtype=info.dtype,
        target_dtype=str(tensor.dtype).removeprefix("torch."),
    )  # fmt: skip
    return entry, problem


def _batchnorm_warnings(module: torch.nn.Module, view: _SourceView, entries: list[PlanEntry]) -> list[str]:
    if view.source.format not in _TF_FORMATS:
        return []
    loaded = {entry.target for entry in entries}
    warnings = []
    for path, layer in module.named_modules():
        if not isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            continue
        prefix = f"{path}." if path else ""
        if not any(f"{prefix}{member}" in loaded for member in ("weight", "bias", "running_mean", "running_var")):
            continue
        warnings += [f"{path or '(root)'}: {warning}" for warning in check_batchnorm_conventions(torch_module=layer)]
    return warnings


# ----------------------------------------------------------------------------- report


def _format_plan(plan: WarmStartPlan) -> str:
    lines = [f"Warm start from {plan.source_path} ({plan.source_format})"]
    lines.append(f"  {len(plan.entries)} to load, {len(plan.skipped)} not selected, {len(plan.kept_fresh)} kept "
                 f"fresh, {len(plan.missing)} missing, {len(plan.unused_sources)} source tensors unused, "
                 f"{len(plan.optimizer_sources)} optimizer/bookkeeping tensors ignored.")  # fmt: skip
    if plan.entries:
        rows = [("target", "<-", "source", "conversion", "shape", "origin")]
        rows += [(e.target, "<-", e.source, e.converter, _shape_text(e), e.origin) for e in plan.entries]
        lines += ["", "Load:"] + _table(rows)
    sections = [
        ("Not selected (fresh):", list(plan.skipped)),
        ("Kept fresh:", [f"{target}: {why}" for target, why in plan.kept_fresh]),
        ("Unused source tensors:", list(plan.unused_sources)),
        ("Optimizer slots and bookkeeping (not loaded, not an error):",
         [f"{name} ({why})" for name, why in plan.optimizer_sources]),
        ("Proposed mapping (by layer kind, order and shape):",
         [f"{p.target} <- {p.source or '-'} [{p.status}, {p.converter or '-'}] {p.reason}" for p in plan.proposals]),
        ("Warnings:", list(plan.warnings)),
        ("ERRORS (nothing will be loaded):", list(plan.errors)),
    ]  # fmt: skip
    for title, items in sections:
        if items:
            lines += ["", title] + [f"  {item}" for item in items]
    return "\n".join(lines)


def _shape_text(entry: PlanEntry) -> str:
    if entry.converter == "identity":
        return str(list(entry.target_shape))
    converted = list(entry.converted_shape) if entry.converted_shape is not None else "?"
    return f"{list(entry.source_shape)} -> {converted}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
