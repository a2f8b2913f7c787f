"""`torchestimator launch`: torchrun, plus --from_tf_config."""

from __future__ import annotations

import argparse
from typing import Any


def add_command(commands: Any) -> None:
    from torchestimator.distribute.launcher import launch_parser

    # torchrun's own parser is the parent, so every torchrun option (--nnodes MIN:MAX, --node_rank,
    # --rdzv_backend/--rdzv_endpoint/--rdzv_id, --max_restarts, ...) is accepted in both spellings.
    torchrun = launch_parser()
    launch = commands.add_parser("launch", parents=[torchrun], add_help=False, description=torchrun.description,
                                 help="run a script in N processes per node, on one or several machines (torchrun)")
    launch.set_defaults(handler=_launch)


def _launch(args: argparse.Namespace) -> int:
    from torchestimator.distribute.launcher import prepare_torchrun_arguments, run_torchrun

    return run_torchrun(prepare_torchrun_arguments(args))
