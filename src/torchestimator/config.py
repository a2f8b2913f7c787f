"""RunConfig: how a run is carried out (where, how often, how many to keep).

What the model computes belongs to model_fn and params; how the cluster is
discovered belongs to distribute/ (parsing TF_CONFIG is an explicit step
there, never done here).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

_UNSET: Any = "__unset__"
DEFAULT_SAVE_CHECKPOINTS_SECS = 600
MIXED_PRECISION_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """tf.estimator's RunConfig with its defaults, plus what PyTorch needs."""

    model_dir: str | None = None
    """Where checkpoints, summaries and exports live; must agree with Estimator(model_dir=...)."""
    random_seed: int | None = None
    """Seeds python, numpy and torch at the start of train (tf_random_seed in TensorFlow)."""
    save_summary_steps: int | None = 100
    """Write the loss and learning rate to TensorBoard every this many steps; None or 0 disables."""
    save_checkpoints_steps: int | None = _UNSET
    """Checkpoint every this many steps. Mutually exclusive with save_checkpoints_secs."""
    save_checkpoints_secs: int | None = _UNSET
    """Checkpoint every this many seconds; 600 when neither is given; both None disables."""
    keep_checkpoint_max: int | None = 5
    """Newest checkpoints kept; None or 0 keeps all. Best checkpoints are never deleted."""
    keep_checkpoint_every_n_hours: float = 10000
    """Additionally keep one checkpoint per this many hours (10000 effectively disables)."""
    log_step_count_steps: int | None = 100
    """Log loss and steps/s, and write global_step/sec, every this many steps; None disables."""
    train_distribute: Any = None
    """A distribute strategy for training (OneDeviceStrategy, MirroredStrategy); None is one device."""
    eval_distribute: Any = None
    """A strategy for evaluate and predict; None uses train_distribute's process group if one is up."""
    device: str | None = None
    """torch device for OneDevice runs ("cpu", "cuda", "cuda:1"); None picks CUDA when present."""
    mixed_precision: str | None = None
    """None, "bf16" or "fp16" (fp16 adds a gradient scaler, saved in checkpoints)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step; one global step consumes this many batches."""
    clip_grad_norm: float | None = None
    """Clip the global gradient norm to this value before each optimizer step."""
    deterministic: bool = False
    """Deterministic algorithms (torch.use_deterministic_algorithms) for bit-exact resume."""
    progress_bar: bool | None = None
    """Show a progress bar; None shows it only when stderr is a terminal."""
    checkpoint_on_interrupt: bool = True
    """On Ctrl-C, finish the current step and write a checkpoint before stopping."""

    def __post_init__(self) -> None:
        steps, secs = self.save_checkpoints_steps, self.save_checkpoints_secs
        if steps is _UNSET and secs is _UNSET:
            steps, secs = None, DEFAULT_SAVE_CHECKPOINTS_SECS
        elif steps is _UNSET:
            steps = None
        elif secs is _UNSET:
            secs = None
        if steps is not None and secs is not None:
            raise ValueError(
                "save_checkpoints_steps and save_checkpoints_secs are mutually exclusive; "
                f"received {steps} and {secs}. Set one of them (or both None to disable checkpoints)."
            )
        object.__setattr__(self, "save_checkpoints_steps", steps)
        object.__setattr__(self, "save_checkpoints_secs", secs)
        if self.model_dir is not None:
            if os.fspath(self.model_dir) == "":
                raise ValueError("model_dir must be a non-empty path or None.")
            object.__setattr__(self, "model_dir", os.fspath(self.model_dir))
        self._check_ranges()

    def _check_ranges(self) -> None:
        non_negative = ("save_summary_steps", "save_checkpoints_steps", "save_checkpoints_secs", "keep_checkpoint_max")
        for name in non_negative:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"RunConfig.{name} must be >= 0 or None; received {value}.")
        if self.log_step_count_steps is not None and self.log_step_count_steps <= 0:
            raise ValueError(f"RunConfig.log_step_count_steps must be > 0 or None; received {self.log_step_count_steps}.")
        if self.keep_checkpoint_every_n_hours <= 0:
            raise ValueError(f"RunConfig.keep_checkpoint_every_n_hours must be > 0; received {self.keep_checkpoint_every_n_hours}.")
        if self.random_seed is not None and not isinstance(self.random_seed, int):
            raise TypeError(f"RunConfig.random_seed must be an int; received {self.random_seed!r}.")
        if self.mixed_precision not in (None, *MIXED_PRECISION_DTYPES):
            raise ValueError(
                f"RunConfig.mixed_precision must be None, 'bf16' or 'fp16'; received {self.mixed_precision!r}."
            )
        if self.gradient_accumulation_steps < 1:
            raise ValueError(
                f"RunConfig.gradient_accumulation_steps must be >= 1; received {self.gradient_accumulation_steps}."
            )
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise ValueError(f"RunConfig.clip_grad_norm must be > 0 or None; received {self.clip_grad_norm}.")

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed; setting one checkpoint interval clears the other, as in TensorFlow."""
        unknown = set(changes) - {field.name for field in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"RunConfig.replace got unknown fields {sorted(unknown)}.")
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
            if value is not None and not isinstance(value, (bool, int, float, str)):
                value = repr(value)
            result[field.name] = value
        return result
