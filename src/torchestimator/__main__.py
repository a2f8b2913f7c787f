"""`python -m torchestimator ...`: the same as the `torchestimator` command."""

import sys

from torchestimator.cli import main

sys.exit(main())
