"""How a plan's messages name warm start's settings: as Python arguments, or as the CLI's flags.

What belongs here: ``Spelling`` (one per audience: ``PYTHON`` for ``WarmStartSettings``,
``CLI`` for ``torchestimator warm-start``), ``Problem`` (a plan error written once, against a
spelling, so the same error tells a Python user ``converters={'4.weight': ...}`` and a CLI user
``--converter 4.weight=...``), and the rewording of the matcher's Flatten advice. What does not:
deciding what is a problem (``_build``, ``_selection``) or the report's layout (``_plan``).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence

from torchestimator.interop.matching import Proposal, flatten_advice

__all__ = ["CLI", "PYTHON", "Problem", "Spelling", "spelling_for"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spelling:
    """The words a message uses for each setting it advises."""

    selection: str
    """The selection setting (vars_to_warm_start / --vars)."""
    selected_by: Callable[[str | Sequence[str]], str]
    """patterns -> the selection setting with these patterns."""
    renames: str
    """The rename setting, as a whole (var_name_to_prev_var_name / --map)."""
    converters: str
    """The converter setting, as a whole (converters / --converter)."""
    accept_proposed: str
    """Turning proposals on (accept_proposed_mapping=True / --accept_proposed)."""
    allow_missing: str
    """Letting missing targets stay fresh (allow_missing=True / --allow_missing)."""
    name_rules: str
    """Every way to name a source explicitly."""
    rename: Callable[[str, str], str]
    """(target, source) -> the setting that maps this target to this source."""
    converter: Callable[[str, str], str]
    """(target, converter) -> the setting that gives this target this converter."""
    converter_placeholder: str
    """Stands for "a converter" in advice that cannot name one."""
    converter_name: Callable[[str], str]
    """A registered converter's name as the converter setting's value ('dense_to_linear' / dense_to_linear)."""
    flatten_converter: Callable[[int, int], str]
    """(channels, height*width) -> the converter of a Dense after an NHWC Flatten, explained."""
    flatten_value: Callable[[int, int], str]
    """(channels, height*width) -> that converter as the converter setting's value in advice."""
    flatten_setting: Callable[[str, int, int], str]
    """(target, channels, height*width) -> the converter setting giving the target that converter, explained."""


def _python_flatten(channels: int, positions: int) -> str:
    return f"layouts.flatten_dense_converter({channels}, height, width) where height*width = {positions}"


def _cli_flatten(channels: int, positions: int) -> str:
    side = round(positions**0.5)
    square = f" ({channels},{side},{side} if the feature map is square)" if side * side == positions else ""
    return f"flatten_dense:{channels},H,W where H*W = {positions}{square}"


def _python_flatten_setting(target: str, channels: int, positions: int) -> str:
    return (
        f"converters={{{target!r}: layouts.flatten_dense_converter({channels}, height, width)}} "
        f"where height*width = {positions}"
    )


def _cli_selection(patterns: str | Sequence[str]) -> str:
    return "--vars " + shlex.join([patterns] if isinstance(patterns, str) else list(patterns))


PYTHON = Spelling(
    selection="vars_to_warm_start",
    selected_by=lambda patterns: f"vars_to_warm_start={patterns!r}",
    renames="var_name_to_prev_var_name",
    converters="converters",
    accept_proposed="accept_proposed_mapping=True",
    allow_missing="allow_missing=True",
    name_rules="var_name_to_prev_var_name or mapping_fn",
    rename=lambda target, source: f"var_name_to_prev_var_name={{{target!r}: {source!r}}}",
    converter=lambda target, converter: f"converters={{{target!r}: {converter}}}",
    converter_placeholder="...",
    converter_name=repr,
    flatten_converter=_python_flatten,
    flatten_value=lambda channels, positions: "...",  # the reason next to it names the function
    flatten_setting=_python_flatten_setting,
)

CLI = Spelling(
    selection="--vars",
    selected_by=_cli_selection,
    renames="--map",
    converters="--converter",
    accept_proposed="--accept_proposed",
    allow_missing="--allow_missing",
    name_rules="--map TARGET=SOURCE",
    rename=lambda target, source: f"--map {target}={source}",
    converter=lambda target, converter: f"--converter {target}={converter}",
    converter_placeholder="NAME[:ARGS]",
    converter_name=str,
    flatten_converter=_cli_flatten,
    flatten_value=lambda channels, positions: f"flatten_dense:{channels},H,W",
    flatten_setting=lambda target, channels, positions: f"--converter {target}={_cli_flatten(channels, positions)}",
)


def spelling_for(for_cli: bool) -> Spelling:
    return CLI if for_cli else PYTHON


@dataclasses.dataclass(frozen=True)
class Problem:
    """One reason a plan cannot be applied, worded when shown: ``text(PYTHON)`` or ``text(CLI)``."""

    words: Callable[[Spelling], str]

    def text(self, spelling: Spelling = PYTHON) -> str:
        return self.words(spelling)

    @classmethod
    def plain(cls, message: str) -> Problem:
        """A problem whose message names no setting (the same for every audience)."""
        return cls(lambda spelling: message)


def reason_in(proposal: Proposal, spelling: Spelling) -> str:
    """A proposal's reason, with the advice for a Linear after a Flatten (``Proposal.flatten``) in ``spelling``'s
    words."""
    if proposal.flatten is None:
        return proposal.reason
    return proposal.reason + flatten_advice(spelling.flatten_converter(*proposal.flatten))
