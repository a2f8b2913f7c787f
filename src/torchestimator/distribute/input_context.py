"""InputContext: what an input_fn needs to know to feed one replica.

tf.estimator silently multiplied the batch by the number of GPUs; here the
global batch is what the user states, and each replica asks for its share.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputContext:
    """Where this input pipeline sits among the replicas training together."""

    num_replicas_in_sync: int = 1
    """Replicas that average their gradients each step (the world size)."""
    input_pipeline_id: int = 0
    """This process's replica id (its rank), in [0, num_input_pipelines)."""
    num_input_pipelines: int = 1
    """Input pipelines feeding the replicas; one per process here."""

    def __post_init__(self) -> None:
        if self.num_replicas_in_sync < 1 or self.num_input_pipelines < 1:
            raise ValueError(
                f"InputContext needs at least one replica and one pipeline; received "
                f"num_replicas_in_sync={self.num_replicas_in_sync}, "
                f"num_input_pipelines={self.num_input_pipelines}."
            )
        if not 0 <= self.input_pipeline_id < self.num_input_pipelines:
            raise ValueError(
                f"input_pipeline_id must be in [0, {self.num_input_pipelines}); received {self.input_pipeline_id}."
            )

    @property
    def replica_id(self) -> int:
        return self.input_pipeline_id

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """The batch one replica sees; refuses a global batch it cannot split evenly."""
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(
                f"The global batch size {global_batch_size} cannot be split evenly across "
                f"{self.num_replicas_in_sync} replicas. Choose a global batch size that is a "
                f"multiple of {self.num_replicas_in_sync}."
            )
        return global_batch_size // self.num_replicas_in_sync
