"""The checkpoint store: atomic, self-validating checkpoints in ``model_dir``.

Modules: ``store`` (CheckpointStore: save, list, restore with fallback,
retention, manifest), ``format`` (the files of one ``ckpt-<step>`` folder),
``serialization`` (pickle-free state trees), ``storage`` (the Storage
protocol, LocalStorage, InMemoryStorage), ``errors`` (CheckpointError,
DiskFullError); ``parts`` (a run's stateful parts), ``checkpointer`` (a run's
saves); for several processes ``dcp_format`` (the files
torch.distributed.checkpoint writes, read safely and resharded) and
``sharded`` (every rank writes its share, sync or async, the chief seals).

Names are imported on first use (``torchestimator._lazy``), like the rest of the package.
"""

from typing import TYPE_CHECKING

from torchestimator._lazy import lazy_exports

if TYPE_CHECKING:  # the names' own modules, for type checkers and IDEs; imported on first use at run time
    from torchestimator.checkpoint.serialization import (
        flatten_state as flatten_state,
        unflatten_state as unflatten_state,
    )
    from torchestimator.checkpoint.storage import (
        InMemoryStorage as InMemoryStorage,
        LocalStorage as LocalStorage,
        Storage as Storage,
    )
    from torchestimator.checkpoint.store import Checkpoint as Checkpoint, CheckpointStore as CheckpointStore
    from torchestimator.errors import CheckpointError as CheckpointError, DiskFullError as DiskFullError

__all__, __getattr__, __dir__ = lazy_exports(__name__)
