"""Progress bars for train, evaluate and predict (tqdm), off when stderr is not a terminal."""

from __future__ import annotations

import sys
from typing import Any

from tqdm.auto import tqdm


class Progress:
    """A tqdm bar that shows steps, loss and steps/s; a no-op when disabled."""

    def __init__(self, description: str, *, total: int | None, initial: int = 0, enabled: bool | None = None) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar: Any = None
        self._position = initial
        if enabled:
            self._bar = tqdm(
                total=total, initial=initial, desc=description, unit="step", dynamic_ncols=True, leave=False
            )

    @property
    def enabled(self) -> bool:
        """Whether a bar is shown (update does nothing otherwise)."""
        return self._bar is not None

    def update(self, position: int, loss: float | None = None) -> None:
        if self._bar is None:
            return
        self._bar.update(position - self._position)
        self._position = position
        if loss is not None and self._bar.n % 10 == 0:
            self._bar.set_postfix(loss=f"{loss:.4g}", refresh=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()
