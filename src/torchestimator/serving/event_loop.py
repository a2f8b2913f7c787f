"""Which asyncio event loop the server runs on: uvloop when it is importable, else asyncio's own.

uvloop is the loop of the field's fast Python serving stack (uvicorn uses it
when installed): its transports and its call scheduling are C, so each
request's socket reads, writes and callbacks cost less than on asyncio's
selector loop. Nothing in the server depends on which loop it runs on;
``TORCHESTIMATOR_SERVING_LOOP=asyncio`` forces asyncio's loop (to compare, or
to rule uvloop out when something misbehaves).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable

__all__ = ["LOOP_ENVIRONMENT_VARIABLE", "loop_factory", "loop_name"]

LOOP_ENVIRONMENT_VARIABLE = "TORCHESTIMATOR_SERVING_LOOP"
_CHOICES = ("auto", "uvloop", "asyncio")


def loop_name() -> str:
    """ "uvloop" or "asyncio": the loop ``loop_factory`` makes under the current environment."""
    choice = os.environ.get(LOOP_ENVIRONMENT_VARIABLE, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        from torchestimator.errors import ConfigError

        raise ConfigError(
            f"{LOOP_ENVIRONMENT_VARIABLE}={choice!r} is not one of {', '.join(_CHOICES)} "
            "(auto: uvloop when installed).",
            field=LOOP_ENVIRONMENT_VARIABLE,
            value=choice,
        )
    if choice == "asyncio":
        return "asyncio"
    try:
        importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            from torchestimator.errors import ConfigError

            raise ConfigError(
                f"{LOOP_ENVIRONMENT_VARIABLE}=uvloop but uvloop is not installed: pip install uvloop "
                "(or leave the variable unset to use asyncio's loop).",
                field=LOOP_ENVIRONMENT_VARIABLE,
                value=choice,
            ) from None
        return "asyncio"
    return "uvloop"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """A function making a new event loop of the kind ``loop_name`` says."""
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop
