"""TrainSpec and EvalSpec (tf.estimator's), checked when built, and what follows an evaluation of one spec.

What belongs here: the two specs, the checks of a list of EvalSpecs (unique names, unique exporter names),
running a spec's exporters after an evaluation, and the shape train_and_evaluate and the evaluator return.
What does not: when to evaluate (train_and_evaluate.py in the training loop, evaluator.py in the evaluator
task) and the exporters themselves (export/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from torchestimator._io import filesystems
from torchestimator.hooks.base import CheckpointSaverListener, Hook, check_hook

if TYPE_CHECKING:
    from torchestimator._core.estimator import Estimator

__all__ = ["EvalSpec", "TrainSpec", "as_spec_list", "by_spec", "check_seconds", "run_exporters"]


def _check_positive_int(owner: str, name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{owner}: {name} must be a positive int or None; received {value!r}.")


def check_seconds(owner: str, name: str, value: Any) -> None:
    """ValueError naming ``owner`` and ``name`` unless ``value`` is a number of seconds >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{owner}: {name} must be a number of seconds >= 0; received {value!r}.")


class ExporterLike(Protocol):
    """What an EvalSpec's exporter provides: te.LatestExporter and the other export.Exporter classes, or any
    object with a ``name`` and this ``export``."""

    @property
    def name(self) -> str: ...

    def export(
        self,
        estimator: Estimator,
        export_path: str,
        checkpoint_path: str | None,
        eval_result: Mapping[str, Any] | None,
        is_the_final_export: bool,
    ) -> Any: ...


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """What to train on and for how long (tf.estimator.TrainSpec)."""

    input_fn: Callable[..., Any]
    """Returns the training batches; called once when training starts, resumed from the checkpoint's position."""
    _: dataclasses.KW_ONLY
    max_steps: int | None = None
    """Absolute global step to stop at; None trains until the input ends (or a stop rule fires)."""
    hooks: Sequence[Hook] = ()
    """Training hooks, passed to each Estimator.train call."""
    saving_listeners: Sequence[CheckpointSaverListener] = ()
    """Checkpoint listeners, passed to each Estimator.train call."""

    def __post_init__(self) -> None:
        if not callable(self.input_fn):
            raise TypeError(f"TrainSpec: input_fn must be callable; received {self.input_fn!r}.")
        _check_positive_int("TrainSpec", "max_steps", self.max_steps)
        object.__setattr__(self, "hooks", tuple(self.hooks or ()))
        object.__setattr__(self, "saving_listeners", tuple(self.saving_listeners or ()))
        for hook in self.hooks:
            check_hook(hook, "TrainSpec: hooks")
        for listener in self.saving_listeners:
            if not isinstance(listener, CheckpointSaverListener):
                raise TypeError(
                    f"TrainSpec: saving_listeners must be te.CheckpointSaverListener instances; received {listener!r}."
                )


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """What to evaluate on, how often, and what to export afterwards (tf.estimator.EvalSpec)."""

    input_fn: Callable[..., Any]
    """Returns the evaluation batches; called for each evaluation."""
    _: dataclasses.KW_ONLY
    steps: int | None = 100
    """Batches per evaluation (TensorFlow's default 100); None evaluates until the input ends."""
    name: str | None = None
    """Names the evaluation: summaries go to model_dir/eval_<name> (model_dir/eval when None)."""
    hooks: Sequence[Hook] = ()
    """Evaluation hooks."""
    exporters: Any = ()
    """An exporter or a sequence of them, each with a unique, non-empty ``name`` and an ``export`` method."""
    start_delay_secs: float = 120
    """Evaluator process only: seconds to wait before the first evaluation."""
    throttle_secs: float = 600
    """At most one evaluation per this many seconds (checkpoint-driven evaluation and the evaluator process)."""
    every_n_steps: int | None = None
    """Evaluate every this many global steps instead of at checkpoints (throttle_secs then does not apply)."""

    def __post_init__(self) -> None:
        if not callable(self.input_fn):
            raise TypeError(f"EvalSpec: input_fn must be callable; received {self.input_fn!r}.")
        _check_positive_int("EvalSpec", "steps", self.steps)
        _check_positive_int("EvalSpec", "every_n_steps", self.every_n_steps)
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise TypeError(f"EvalSpec: name must be a non-empty string or None; received {self.name!r}.")
        check_seconds("EvalSpec", "start_delay_secs", self.start_delay_secs)
        check_seconds("EvalSpec", "throttle_secs", self.throttle_secs)
        object.__setattr__(self, "hooks", tuple(self.hooks or ()))
        for hook in self.hooks:
            check_hook(hook, "EvalSpec: hooks")
        object.__setattr__(self, "exporters", _check_exporters(self.exporters))


def _check_exporters(exporters: Any) -> tuple[ExporterLike, ...]:
    if exporters is None:
        return ()
    if hasattr(exporters, "export") and hasattr(exporters, "name"):
        exporters = (exporters,)
    checked: tuple[ExporterLike, ...] = tuple(exporters)
    names: set[str] = set()
    for exporter in checked:
        if not callable(getattr(exporter, "export", None)):
            raise TypeError(f"EvalSpec: exporters must have an export(...) method; received {exporter!r}.")
        name = getattr(exporter, "name", None)
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"EvalSpec: an exporter's name must be a non-empty string; {exporter!r} has {name!r}.")
        if name in names:
            raise ValueError(f"EvalSpec: exporter names must be unique; {name!r} appears more than once.")
        names.add(name)
    return checked


def as_spec_list(eval_spec: Any) -> list[EvalSpec]:
    """One EvalSpec or a list of them, as a checked list; the first is primary (best and early stopping read it)."""
    specs = [eval_spec] if isinstance(eval_spec, EvalSpec) else list(eval_spec or ())
    if not specs:
        raise ValueError("eval_spec must be an EvalSpec or a non-empty list of them.")
    for spec in specs:
        if not isinstance(spec, EvalSpec):
            raise TypeError(f"eval_spec must contain te.EvalSpec instances; received {spec!r}.")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"Each EvalSpec needs its own name (it names the eval dir); received names {names}.")
    exporter_names = [exporter.name for spec in specs for exporter in spec.exporters]
    if len(set(exporter_names)) != len(exporter_names):
        raise ValueError(
            f"Exporter names must be unique across EvalSpecs (each exports to model_dir/export/<name>); "
            f"received {exporter_names}."
        )
    return specs


def run_exporters(
    estimator: Estimator,
    spec: EvalSpec,
    checkpoint_path: str | None,
    results: Mapping[str, Any] | None,
    final: bool,
) -> list[Any]:
    """The spec's exporters after an evaluation, each writing under model_dir/export/<name>; their return values."""
    exports = []
    for exporter in spec.exporters:
        export_path = filesystems.join(estimator.model_dir, "export", exporter.name)
        exports.append(exporter.export(estimator, export_path, checkpoint_path, results, final))
    return exports


def by_spec(eval_spec: Any, specs: list[EvalSpec], results: list[Any], exports: list[Any]) -> tuple[Any, Any]:
    """``(results, exports)`` as train_and_evaluate returns them: the single spec's values for one EvalSpec,
    dicts keyed by EvalSpec name for a list."""
    if isinstance(eval_spec, EvalSpec):
        return results[0], exports[0]
    return (
        {spec.name: results[i] for i, spec in enumerate(specs)},
        {spec.name: exports[i] for i, spec in enumerate(specs)},
    )
