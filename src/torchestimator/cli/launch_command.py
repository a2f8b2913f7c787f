"""`torchestimator launch`: torchrun, plus --from_tf_config and TF 1.x's task flags.

torchrun's own parser defines the options, so every torchrun option (--nnodes MIN:MAX, --node_rank,
--rdzv_backend/--rdzv_endpoint/--rdzv_id, --max_restarts, ...) is accepted in both spellings. Building
it imports torch (seconds), so it is built only when `launch` is the command: `torchestimator --help`
and the other commands never wait for it. With --ps_hosts/--worker_hosts/--job_name/--task_index (TF 1.x's
between-graph replication flags) `launch` runs the program once, as that task, with its TF_CONFIG
(`launcher.run_tf1_task`), instead of starting torchrun.
"""

from __future__ import annotations

import argparse
from typing import Any

_NO_OPTION_PREFIX = "\0"
"""`launch`'s own prefix character: no argument can contain NUL, so the whole rest of the command line,
options included, reaches torchrun's parser untouched."""


class _TorchrunArguments(argparse.Action):
    """Parses the words after `launch` with torchrun's parser (the usage, the errors and --help are torchrun's)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        from torchestimator.distribute.launcher import parse_launch_arguments

        parsed = parse_launch_arguments(list(values), parser.prog)
        for name, value in vars(parsed).items():
            setattr(namespace, name, value)


def add_command(commands: Any) -> None:
    launch = commands.add_parser(
        "launch",
        add_help=False,
        prefix_chars=_NO_OPTION_PREFIX,
        help="run a script in N processes per node, on one or several machines (torchrun), or as one task of "
        "a TF 1.x cluster (--ps_hosts --worker_hosts --job_name --task_index); "
        "torchestimator launch --help lists the options",
    )
    launch.add_argument(
        "torchrun_arguments",
        nargs=argparse.REMAINDER,
        action=_TorchrunArguments,
        default=argparse.SUPPRESS,
        help="torchrun's options, then the script and its arguments",
    )
    launch.set_defaults(handler=_launch)


def _launch(args: argparse.Namespace) -> int:
    from torchestimator.distribute.launcher import run_launch

    return run_launch(args)
