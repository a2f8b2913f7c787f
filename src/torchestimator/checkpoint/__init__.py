"""The checkpoint store: atomic, self-validating checkpoints in ``model_dir``.

Modules: ``store`` (CheckpointStore: save, list, restore with fallback,
retention, manifest), ``format`` (the files of one ``ckpt-<step>`` folder),
``serialization`` (pickle-free state trees), ``storage`` (the Storage
protocol, LocalStorage, InMemoryStorage), ``errors`` (CheckpointError,
DiskFullError); ``parts`` (a run's stateful parts), ``checkpointer`` (a run's
saves); for several processes ``dcp_format`` (the files
torch.distributed.checkpoint writes, read safely and resharded) and
``sharded`` (every rank writes its share, sync or async, the chief seals).
"""

from __future__ import annotations

from .errors import CheckpointError, DiskFullError
from .serialization import flatten_state, unflatten_state
from .storage import InMemoryStorage, LocalStorage, Storage
from .store import Checkpoint, CheckpointStore

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "DiskFullError",
    "InMemoryStorage",
    "LocalStorage",
    "Storage",
    "flatten_state",
    "unflatten_state",
]
