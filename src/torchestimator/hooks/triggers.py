"""Every: "how often" as data, shared by checkpoints, summaries, logging and hooks."""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from collections.abc import Callable

from torchestimator.errors import ConfigError, ConfigTypeError


@dataclasses.dataclass
class Every:
    """Fires every `steps` global steps or every `secs` seconds (exactly one of them).

    Like TensorFlow's SecondOrStepTimer it never fires twice for one step.
    Step triggers fire on multiples of `steps`, so a resumed run saves and
    logs at the same steps as an uninterrupted one.
    """

    steps: int | None = None
    secs: float | None = None
    clock: Callable[[], float] = time.monotonic
    _last_step: int | None = dataclasses.field(default=None, init=False, repr=False)
    _last_time: float | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.secs is None):
            raise ConfigError(
                f"Every needs exactly one of steps or secs; received steps={self.steps}, secs={self.secs}.",
                field="steps",
                value=(self.steps, self.secs),
            )
        if self.steps is not None:
            self.steps = check_step_count("Every", "steps", self.steps)
        if self.secs is not None:
            if isinstance(self.secs, bool) or not isinstance(self.secs, numbers.Real):
                raise ConfigTypeError(
                    f"Every(secs=...) must be a number of seconds; received {self.secs!r}.",
                    field="secs",
                    value=self.secs,
                )
            if not (math.isfinite(self.secs) and self.secs > 0):
                raise ConfigError(
                    f"Every(secs=...) must be a finite number of seconds > 0; received {self.secs!r}.",
                    field="secs",
                    value=self.secs,
                )

    def start(self, step: int) -> None:
        """Marks the start of a run at `step`: the first firing comes one interval later."""
        self._last_step = step
        self._last_time = self.clock()

    def should_fire(self, step: int) -> bool:
        if step == self._last_step:
            return False
        if self.steps is not None:
            return step % self.steps == 0
        assert self.secs is not None  # __post_init__ allows exactly one of steps and secs
        if self._last_time is None:
            self._last_time = self.clock()
        return self.clock() - self._last_time >= self.secs

    def mark(self, step: int) -> None:
        """Records that the action ran at `step`."""
        self._last_step = step
        self._last_time = self.clock()

    def elapsed_since_mark(self) -> tuple[int | None, float | None]:
        return self._last_step, self._last_time


def check_step_count(owner: str, name: str, value: object) -> int:
    """``value`` as a step count (an int > 0, not a bool); ConfigError/ConfigTypeError naming ``owner.name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigTypeError(
            f"{owner}({name}=...) must be a whole number of steps; received {value!r}.", field=name, value=value
        )
    if value <= 0:
        raise ConfigError(f"{owner}({name}=...) must be > 0; received {value}.", field=name, value=value)
    return int(value)
