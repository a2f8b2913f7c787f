"""``ShardedEmbedding``: an embedding table that lives on the parameter servers, as TF trained them there.

Outside parameter-server training it is an ``nn.Embedding`` like any other (its checkpoints, exports and warm
starts are an ``nn.Embedding``'s). Built while a ``ParameterServerStrategy`` trainer is set up, it holds no table:
its ``weight`` is a stand-in of the table's shape backed by one element, the rows live on the ps tasks, cut by
rows across them, and a forward looks up only the rows its batch needs (``_ps_optimizer.RemoteOptimizer``
sends them). Their gradients go back as rows too, so a table larger than a trainer's memory trains. The chief
gathers the whole table only to write a checkpoint, which holds it as an ordinary ``weight``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional

_TABLES_ON_PS = False
"""Whether this process is a parameter-server trainer: tables built now keep their rows on the ps tasks."""


def keep_tables_on_parameter_servers(enabled: bool) -> None:
    """Set by ParameterServerStrategy for a trainer's set-up (and cleared when it ends)."""
    global _TABLES_ON_PS
    _TABLES_ON_PS = enabled


class TableClient(Protocol):
    """What a ShardedEmbedding asks the parameter servers (RemoteOptimizer provides it)."""

    def lookup(self, variable: str, ids: torch.Tensor) -> torch.Tensor: ...

    def table_weight(self, variable: str) -> torch.Tensor | None: ...


class ShardedEmbedding(nn.Embedding):
    """``nn.Embedding(num_embeddings, embedding_dim, padding_idx)`` whose table lives on the ps tasks under
    ``ParameterServerStrategy`` (TF's partitioned embedding variables); everywhere else an ``nn.Embedding``.

    Its table is cut by rows across the ps tasks (``FixedShardsPartitioner(num_ps)`` unless the strategy is given
    a partitioner). ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` are not taken: the ps apply the update.
    Any ``torch.optim`` optimizer trains it as it trains a local ``nn.Embedding``; SGD, Adagrad and SparseAdam
    update only the rows a batch touched (cheaper for big tables), the others see zeros elsewhere.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.rows_on_ps = _TABLES_ON_PS
        weight = None
        if self.rows_on_ps:  # the table's shape, one element of memory
            weight = torch.zeros((), dtype=dtype or torch.get_default_dtype()).expand(num_embeddings, embedding_dim)
        super().__init__(num_embeddings, embedding_dim, padding_idx, _weight=weight, dtype=dtype)
        self.client: TableClient | None = None
        self.variable = ""  # its weight's state_dict name, set with the client
        self.restored: torch.Tensor | None = None  # a whole table loaded from a checkpoint (the chief sends it)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, rows) looked up for the next push

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.rows_on_ps:
            return super().forward(input)
        if self.client is None:
            if self.restored is None:
                raise RuntimeError(
                    f"ShardedEmbedding {self.variable or ''}: its rows live on the parameter servers, and this process "
                    "is not training with them now; evaluate or export from a checkpoint (it loads the whole table)."
                )
            return functional.embedding(input, self.restored, self.padding_idx)
        ids, inverse = torch.unique(input.reshape(-1), return_inverse=True)
        if len(ids) and (int(ids[0]) < 0 or int(ids[-1]) >= self.num_embeddings):  # sorted: the ends tell
            bad = int(ids[0]) if int(ids[0]) < 0 else int(ids[-1])
            raise IndexError(
                f"ShardedEmbedding {self.variable}: id {bad} is outside the table's {self.num_embeddings} rows."
            )
        rows = self.client.lookup(self.variable, ids)
        if torch.is_grad_enabled() and self.weight.requires_grad:
            rows.requires_grad_(True)
            self.pending.append((ids, rows))
        return rows.index_select(0, inverse).reshape(*input.shape, self.embedding_dim)

    def take_row_gradients(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rows looked up since the last push and their gradients (duplicates summed, the padding row dropped)."""
        looked_up = [(ids, rows.grad) for ids, rows in self.pending if rows.grad is not None]
        self.pending = []
        if not looked_up:
            return None
        ids = torch.cat([ids for ids, _ in looked_up])
        gradients = torch.cat([gradient for _, gradient in looked_up])
        unique, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros((len(unique), self.embedding_dim), dtype=gradients.dtype).index_add_(0, inverse, gradients)
        if self.padding_idx is not None:  # nn.Embedding never updates the padding row
            keep = unique != self.padding_idx
            unique, summed = unique[keep], summed[keep]
        return unique, summed

    # A state_dict holds the whole table, as nn.Embedding's: gathered from the ps (the chief, for a checkpoint),
    # or the one restored; loading keeps it for the chief to send (the stand-in cannot be written into).

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        if not self.rows_on_ps:
            super()._save_to_state_dict(destination, prefix, keep_vars)
            return
        whole = self.client.table_weight(self.variable) if self.client is not None else None
        if whole is None:
            whole = self.restored
        destination[prefix + "weight"] = whole if whole is not None else self.weight

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        if not self.rows_on_ps:
            super()._load_from_state_dict(
                state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
            )
            return
        key = prefix + "weight"
        if key not in state_dict:
            missing_keys.append(key)
            return
        value = state_dict[key]
        if tuple(value.shape) != tuple(self.weight.shape):
            error_msgs.append(
                f"size mismatch for {key}: copying a param with shape {tuple(value.shape)}, "
                f"the table has {tuple(self.weight.shape)}."
            )
            return
        self.restored = value.detach()

    def detach_from_servers(self, final: Callable[[], torch.Tensor | None] | None = None) -> None:
        """Training with the ps tasks is over: keep the final table if there is one (the chief's), drop the client."""
        if final is not None and (whole := final()) is not None:
            self.restored = whole
        self.client, self.pending = None, []


def sharded_tables(module: nn.Module) -> dict[str, ShardedEmbedding]:
    """The tables of ``module`` whose rows live on the ps tasks, by their weight's state_dict name."""
    return {
        f"{name}.weight" if name else "weight": child
        for name, child in module.named_modules()
        if isinstance(child, ShardedEmbedding) and child.rows_on_ps
    }
