"""The collective timeout: how long a replica waits for the others before it fails.

One setting for every wait between replicas (a collective, the start-up join, replica 0 waiting for the replicas
it started), read here so that the strategies and the start-up helpers agree on it. A short default matters: a dead
replica must fail the others in time for torchrun's elastic restart.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from torchestimator.errors import ConfigError

DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 300.0
"""How long a collective waits for the other replicas by default: 5 minutes, so a dead replica fails the
others in time for torchrun's elastic restart (torch's own default is 30 minutes). Also how long the
first process waits for the others to join at start-up."""

COLLECTIVE_TIMEOUT_VARIABLE = "TORCHESTIMATOR_COLLECTIVE_TIMEOUT"
"""Environment variable (seconds) that sets the collective timeout when the constructor does not."""


def collective_timeout_seconds(requested: float | None, environ: Mapping[str, str] | None = None) -> float:
    """The collective timeout: ``requested`` if given, else TORCHESTIMATOR_COLLECTIVE_TIMEOUT, else 300 s."""
    if requested is not None:
        return requested
    environ = os.environ if environ is None else environ
    text = environ.get(COLLECTIVE_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_COLLECTIVE_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"{COLLECTIVE_TIMEOUT_VARIABLE} must be a positive number of seconds; received {text!r}. "
            f"Unset it for the default ({DEFAULT_COLLECTIVE_TIMEOUT_SECONDS:g} s).",
            field=COLLECTIVE_TIMEOUT_VARIABLE,
            value=text,
        )
    return seconds
