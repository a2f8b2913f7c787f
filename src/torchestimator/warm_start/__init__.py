"""Warm start: which target tensors load from which source tensors, the report, and the copy.

What belongs here: ``WarmStartSettings`` (TensorFlow's selection rules, translated
to PyTorch names), ``init_from_checkpoint``'s scope maps, the ``WarmStartPlan``
(computed without touching the module, shown by ``format()`` as the dry run) and
``apply`` (all-or-nothing copy into the plain module). What does not: reading
files (``torchestimator.interop`` readers), layout conversions
(``interop.layouts``), proposing a mapping (``interop.matching``), and when warm
start happens (the Estimator: a checkpoint in ``model_dir`` always wins).

Names: the *target* is a ``module.state_dict()`` key (``encoder.0.weight``), the
*source* is a name in the weight file as the report shows it:

* TF1 checkpoints, torch files, safetensors, our checkpoints: the stored name;
* TF2 object-based checkpoints: the object path of each model variable
  (``model/_functional/_operations/1/kernel``; Keras 3's private ``_kernel`` is
  shown as ``kernel``), from the checkpoint's object graph, so weights Keras 3
  saved under ``optimizer/_trainable_variables/N`` are found; the raw key is
  accepted too;
* Keras 3 ``.weights.h5``: Keras's own variable path (``conv/kernel``) where the
  reader can rebuild it, else the HDF5 path (``layers/conv2d/vars/0``); both are
  accepted.

Optimizer slots and bookkeeping (``dense/kernel/Adam``, ``beta1_power``,
``global_step``, ``optimizer/...``) are never loaded into a model: the report
lists them as unused, which is not an error (the Adam -> SGD switch works).

Layout of this package: ``_settings`` (the settings and their checks),
``_selection`` (``plan_warm_start``, ``warm_start``), ``_assignment_map``
(``init_from_checkpoint``), ``_view`` (the source under the report's names),
``_build`` (resolving names, converters and shapes into a plan), ``_plan``
(the plan, its report and its apply), ``_spelling`` (advice worded as Python
arguments or as the CLI's flags: ``plan.format(for_cli=True)``), ``_write``
(the warm-started weights as a fresh model_dir's step-0 checkpoint or a
safetensors file: ``torchestimator warm-start --write``). Import from the
package, not the modules (the CLI imports ``_write`` itself).

Exceptions: ``ValueError`` for every user mistake (a bad pattern, a plan with
errors when applied, a bad assignment map), ``TypeError`` for wrong argument
types; ``interop.WeightSourceError`` (a ValueError) for unreadable files.
"""

from torchestimator.warm_start._assignment_map import init_from_checkpoint, plan_init_from_checkpoint
from torchestimator.warm_start._plan import PlanEntry, WarmStartPlan
from torchestimator.warm_start._selection import plan_warm_start, warm_start
from torchestimator.warm_start._settings import WarmStartSettings, as_warm_start_settings

__all__ = [
    "PlanEntry",
    "WarmStartPlan",
    "WarmStartSettings",
    "as_warm_start_settings",
    "init_from_checkpoint",
    "plan_init_from_checkpoint",
    "plan_warm_start",
    "warm_start",
]
