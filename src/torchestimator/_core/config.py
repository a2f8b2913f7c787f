"""RunConfig: how a run is carried out (where, how often, how many to keep).

Every field is checked when the config is built (and by ``replace``): a bad
value raises ``ConfigError`` (a ValueError), a bad type ``ConfigTypeError``
(also a TypeError), each naming the field and what it received, so a run
never starts with a setting that would fail at its first checkpoint.

What the model computes belongs to model_fn and params; how the cluster is
discovered belongs to distribute/ (parsing TF_CONFIG is an explicit step
there, never done here).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Mapping
from typing import Any

import torch

from torchestimator._tf_names import accepts_tf_arguments, our_arguments
from torchestimator.distribute.strategy import Strategy
from torchestimator.errors import ConfigError, ConfigTypeError

_UNSET: Any = "__unset__"
DEFAULT_SAVE_CHECKPOINTS_SECS = 600
MIXED_PRECISION_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}

_INTEGER, _NUMBER, _FLAG = "an int", "a finite number", "a bool"
_PLAIN_NUMBERS: tuple[type, ...] = (int, float)  # kept as they are; other numbers (numpy's) become floats
_CHECKPOINTS_OFF = " To turn checkpoints off, pass save_checkpoints_steps=None, save_checkpoints_secs=None."


@dataclasses.dataclass(frozen=True)
class _Rule:
    """What one RunConfig field must hold; ``__post_init__`` applies it (None passes where optional: it disables)."""

    kind: str
    optional: bool
    bound: float | None  # the lowest value allowed, or (strict) the highest refused
    strict: bool
    advice: str

    def allowed(self, *, with_kind: bool = True) -> str:
        """E.g. "an int > 0 or None"; without the kind ("> 0 or None") once the type is known to be right."""
        parts = [self.kind] if with_kind or self.bound is None else []
        if self.bound is not None:
            parts.append(f"{'>' if self.strict else '>='} {self.bound}")
        return " ".join(parts) + (" or None" if self.optional else "")


def _checked(
    default: Any,
    kind: str,
    *,
    optional: bool = True,
    above: float | None = None,
    at_least: float | None = None,
    advice: str = "",
) -> Any:
    """A field whose value __post_init__ checks against ``kind`` and its bound (``above`` or ``at_least``)."""
    bound = above if above is not None else at_least
    rule = _Rule(kind, optional, bound, above is not None, advice)
    return dataclasses.field(default=default, metadata={"rule": rule})


_SEED_RANGE = (0, 2**64)  # torch.manual_seed takes up to 2**64; the input functions need a non-negative seed


@accepts_tf_arguments("RunConfig")  # tf_random_seed=; TF's session_config= and the like refused with the reason
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """tf.estimator's RunConfig with its defaults, plus what PyTorch needs.

    TF's argument names are accepted where they mean the same (``tf_random_seed``); those that mean
    something else here (``session_config``, ``protocol``...) are refused saying what to use (_tf_names.py).
    """

    model_dir: str | None = None
    """Where checkpoints, summaries and exports live; must agree with Estimator(model_dir=...)."""
    random_seed: int | None = _checked(None, _INTEGER)
    """Seeds python, numpy and torch at the start of train (tf_random_seed in TensorFlow)."""
    save_summary_steps: int | None = _checked(100, _INTEGER, at_least=0)
    """Write the loss and learning rate to TensorBoard every this many steps; None or 0 disables."""
    save_checkpoints_steps: int | None = _checked(_UNSET, _INTEGER, above=0, advice=_CHECKPOINTS_OFF)
    """Checkpoint every this many steps (> 0). Mutually exclusive with save_checkpoints_secs."""
    save_checkpoints_secs: float | None = _checked(_UNSET, _NUMBER, above=0, advice=_CHECKPOINTS_OFF)
    """Checkpoint every this many seconds (> 0); 600 when neither is given; both None disables."""
    keep_checkpoint_max: int | None = _checked(5, _INTEGER, at_least=0)
    """Newest checkpoints kept; None or 0 keeps all. Best checkpoints are never deleted."""
    keep_checkpoint_every_n_hours: float = _checked(10000, _NUMBER, optional=False, above=0)
    """Additionally keep one checkpoint per this many hours (10000 effectively disables)."""
    log_step_count_steps: int | None = _checked(100, _INTEGER, above=0, advice=" To turn step logging off, pass None.")
    """Log loss and steps/s, and write global_step/sec, every this many steps; None disables."""
    train_distribute: Strategy | None = None
    """A distribute strategy for training (OneDeviceStrategy, MirroredStrategy); None is one device."""
    eval_distribute: Strategy | None = None
    """A strategy for evaluate and predict; None uses train_distribute's process group if one is up."""
    device: str | None = None
    """torch device for OneDevice runs ("cpu", "cuda", "cuda:1"); None picks CUDA when present."""
    mixed_precision: str | None = None
    """None, "bf16" or "fp16" (fp16 adds a gradient scaler, saved in checkpoints)."""
    gradient_accumulation_steps: int = _checked(1, _INTEGER, optional=False, at_least=1)
    """Micro-batches per optimizer step; one global step consumes this many batches."""
    clip_grad_norm: float | None = _checked(None, _NUMBER, above=0)
    """Clip the global gradient norm to this value before each optimizer step."""
    deterministic: bool = _checked(False, _FLAG, optional=False)
    """Deterministic algorithms (torch.use_deterministic_algorithms) for bit-exact resume."""
    progress_bar: bool | None = _checked(None, _FLAG)
    """Show a progress bar; None shows it only when stderr is a terminal."""
    checkpoint_on_interrupt: bool = _checked(True, _FLAG, optional=False)
    """On Ctrl-C, finish the current step and write a checkpoint before stopping."""
    sync_batch_norm: bool = _checked(False, _FLAG, optional=False)
    """With several replicas, BatchNorm layers use the statistics of the global batch (SyncBatchNorm)."""
    async_checkpoint: bool = _checked(False, _FLAG, optional=False)
    """Write checkpoints in the background: the loop waits only for the copy of the state to CPU memory (one
    process: a writer thread through the checkpoint store; several: DCP's async_save). Saves stay synchronous
    under train_and_evaluate (an evaluation reads its step's checkpoint from disk); the final checkpoint is
    complete before train returns."""
    storage_options: Mapping[str, Any] | None = dataclasses.field(default=None, hash=False)
    """Arguments of the filesystem behind URL paths (model_dir, input files, exports): one dict for every store
    (``{"endpoint_url": ...}``) or one per scheme (``{"s3": {...}, "gs": {...}}``). Without it, each backend's
    own conventions apply (``AWS_*``, ``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_CONNECTION_STRING``). Never
    written to run_config.json with its values: they may hold secrets."""

    def __post_init__(self) -> None:
        steps, secs = self.save_checkpoints_steps, self.save_checkpoints_secs
        if steps is _UNSET and secs is _UNSET:
            steps, secs = None, DEFAULT_SAVE_CHECKPOINTS_SECS
        elif steps is _UNSET:
            steps = None
        elif secs is _UNSET:
            secs = None
        if steps is not None and secs is not None:
            raise ConfigError(
                "RunConfig: save_checkpoints_steps and save_checkpoints_secs are mutually exclusive; "
                f"received {steps!r} and {secs!r}. Set one of them (or both None to disable checkpoints).",
                field="save_checkpoints_steps",
                value=steps,
            )
        object.__setattr__(self, "save_checkpoints_steps", steps)
        object.__setattr__(self, "save_checkpoints_secs", secs)
        object.__setattr__(self, "model_dir", _checked_model_dir(self.model_dir))
        if self.storage_options is not None:
            from torchestimator._io.filesystems import checked_storage_options

            checked_storage_options(self.storage_options)
        self._check_fields()

    def _check_fields(self) -> None:
        for field in dataclasses.fields(self):
            rule = field.metadata.get("rule")
            if rule is not None:
                object.__setattr__(self, field.name, _checked_value(field.name, getattr(self, field.name), rule))
        seed = self.random_seed
        if seed is not None and not _SEED_RANGE[0] <= seed < _SEED_RANGE[1]:
            raise ConfigError(
                f"RunConfig.random_seed must be in [0, 2**64) (non-negative for the input functions, "
                f"below 2**64 for torch.manual_seed); received {seed}.",
                field="random_seed",
                value=seed,
            )
        if self.mixed_precision not in (None, *MIXED_PRECISION_DTYPES):
            raise ConfigError(
                f"RunConfig.mixed_precision must be None, 'bf16' or 'fp16'; received {self.mixed_precision!r}.",
                field="mixed_precision",
                value=self.mixed_precision,
            )
        _check_device(self.device)
        for name in ("train_distribute", "eval_distribute"):
            _check_strategy(name, getattr(self, name))

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed; setting one checkpoint interval clears the other, as in TensorFlow."""
        changes = our_arguments("RunConfig", changes)
        unknown = set(changes) - {field.name for field in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(
                f"RunConfig.replace got unknown fields {sorted(unknown)}; RunConfig's fields are "
                f"{[field.name for field in dataclasses.fields(self)]}.",
                field=sorted(unknown)[0],
                value=changes[sorted(unknown)[0]],
            )
        if "save_checkpoints_steps" in changes and "save_checkpoints_secs" not in changes:
            changes["save_checkpoints_secs"] = None
        if "save_checkpoints_secs" in changes and "save_checkpoints_steps" not in changes:
            changes["save_checkpoints_steps"] = None
        return dataclasses.replace(self, **changes)

    def to_json_dict(self) -> dict[str, Any]:
        """The fields as JSON-friendly values, for model_dir/run_config.json."""
        result: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "storage_options" and value is not None:
                value = _without_values(value)
            elif value is not None and not isinstance(value, (bool, int, float, str)):
                value = repr(value)
            result[field.name] = value
        return result


def _without_values(options: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of storage_options, each value hidden (keys, tokens and connection strings stay out of files)."""
    return {key: _without_values(value) if isinstance(value, Mapping) else "<hidden>" for key, value in options.items()}


def _checked_value(name: str, value: Any, rule: _Rule) -> Any:
    """``value`` as a plain int/float/bool (numpy scalars are accepted), or the error naming the field."""
    if value is None and rule.optional:
        return None
    checked = _of_kind(value, rule.kind)
    if checked is None:
        raise ConfigTypeError(
            f"RunConfig.{name} must be {rule.allowed()}; received {value!r} ({type(value).__name__}).",
            field=name,
            value=value,
        )
    if rule.bound is not None and (checked <= rule.bound if rule.strict else checked < rule.bound):
        raise ConfigError(
            f"RunConfig.{name} must be {rule.allowed(with_kind=False)}; received {value!r}.{rule.advice}",
            field=name,
            value=value,
        )
    return checked


def _of_kind(value: Any, kind: str) -> Any:
    """The value as that kind, or None when it is not one (True is an int to Python, never a count here)."""
    if isinstance(value, bool):
        return value if kind == _FLAG else None
    if kind == _INTEGER and isinstance(value, numbers.Integral):
        return int(value)
    if kind == _NUMBER and isinstance(value, numbers.Real) and math.isfinite(value):
        return value if type(value) in _PLAIN_NUMBERS else float(value)
    return None


def _checked_model_dir(model_dir: Any) -> str | None:
    if model_dir is None:
        return None
    path = os.fspath(model_dir) if isinstance(model_dir, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise ConfigTypeError(
            f"RunConfig.model_dir must be a str or os.PathLike path or None; received "
            f"{model_dir!r} ({type(model_dir).__name__}).",
            field="model_dir",
            value=model_dir,
        )
    if path == "":
        raise ConfigError(
            "RunConfig.model_dir must be a non-empty path or None; received ''.", field="model_dir", value=model_dir
        )
    return path


def _check_device(device: Any) -> None:
    """Parsed, not looked for: a config may be built on a machine without the device it names."""
    if device is None or isinstance(device, torch.device):
        return
    if not isinstance(device, str):
        raise ConfigTypeError(
            f"RunConfig.device must be a str, a torch.device or None; received {device!r} ({type(device).__name__}).",
            field="device",
            value=device,
        )
    try:
        torch.device(device)
    except (RuntimeError, ValueError) as error:
        raise ConfigError(
            f"RunConfig.device {device!r} is not a torch device string ({error}); expected e.g. "
            "'cpu', 'cuda' or 'cuda:1'.",
            field="device",
            value=device,
        ) from error


def _check_strategy(name: str, strategy: object) -> None:
    if strategy is not None and not isinstance(strategy, Strategy):
        raise ConfigTypeError(
            f"RunConfig.{name} must be a strategy (te.OneDeviceStrategy(), te.MirroredStrategy()) "
            f"or None; received {strategy!r} ({type(strategy).__name__}).",
            field=name,
            value=strategy,
        )
