"""Variables that lazy layers (``nn.LazyLinear``, ``nn.LazyConv2d``, ...) have not given a shape yet.

Restore, warm start, distribution wrappers and export all need shapes; they ask here, and refuse by naming the
variables rather than let torch's "Can't access the shape of an uninitialized parameter" escape. How lazy layers
get their shapes in an Estimator is _core/lazy_layers.py's.
"""

from __future__ import annotations

import torch
from torch.nn.parameter import is_lazy

from torchestimator.errors import ConfigError


def uninitialized_variables(module: torch.nn.Module) -> list[str]:
    """The names of the parameters and buffers of ``module`` that lazy layers have not given a shape yet."""
    return [
        name
        for name, tensor in (*module.named_parameters(remove_duplicate=False), *module.named_buffers())
        if is_lazy(tensor)
    ]


def refuse_uninitialized(module: torch.nn.Module, what: str) -> None:
    """Raises, naming the variables, when lazy layers of ``module`` have no shape for ``what`` to work on."""
    pending = uninitialized_variables(module)
    if pending:
        raise ConfigError(
            f"{what} needs the shapes of the model's variables, but lazy layers have not given these one yet: "
            f"{some_names(pending)}. They get shapes from a checkpoint of model_dir (train first) or from a first "
            "batch; or give the layers their input sizes (nn.Linear instead of nn.LazyLinear)."
        )


def some_names(names: list[str]) -> str:
    """The first five names, and how many more."""
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
