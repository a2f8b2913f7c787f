"""Every: "how often" as data, shared by checkpoints, summaries, logging and hooks."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable


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
            raise ValueError(f"Every needs exactly one of steps or secs; received steps={self.steps}, secs={self.secs}.")
        if self.steps is not None and self.steps <= 0:
            raise ValueError(f"Every(steps=...) must be > 0; received {self.steps}.")
        if self.secs is not None and self.secs <= 0:
            raise ValueError(f"Every(secs=...) must be > 0; received {self.secs}.")

    def start(self, step: int) -> None:
        """Marks the start of a run at `step`: the first firing comes one interval later."""
        self._last_step = step
        self._last_time = self.clock()

    def should_fire(self, step: int) -> bool:
        if step == self._last_step:
            return False
        if self.steps is not None:
            return step % self.steps == 0
        if self._last_time is None:
            self._last_time = self.clock()
        return self.clock() - self._last_time >= self.secs

    def mark(self, step: int) -> None:
        """Records that the action ran at `step`."""
        self._last_step = step
        self._last_time = self.clock()

    def elapsed_since_mark(self) -> tuple[int | None, float | None]:
        return self._last_step, self._last_time
