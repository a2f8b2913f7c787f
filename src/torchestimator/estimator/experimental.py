"""``tf.estimator.experimental``'s early-stopping functions: the same objects as ``te.stop_if_*_hook``.

Each makes a rule for ``train_and_evaluate(early_stopping=...)`` (TF put the hook in TrainSpec's hooks);
TF's call form, estimator first, is accepted.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator._policy.early_stopping import (
        stop_if_higher_hook as stop_if_higher_hook,
        stop_if_lower_hook as stop_if_lower_hook,
        stop_if_no_decrease_hook as stop_if_no_decrease_hook,
        stop_if_no_increase_hook as stop_if_no_increase_hook,
    )

__all__, __getattr__, __dir__ = lazy_exports(__name__)
