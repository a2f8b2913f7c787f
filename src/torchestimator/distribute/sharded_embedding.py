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


class _RowsOnParameterServers:
    """What ShardedEmbedding and ShardedEmbeddingBag share: a table whose rows may live on the ps tasks.

    Mixed into an ``nn.Embedding``/``nn.EmbeddingBag`` (first in the bases): the table is its ``weight``.
    """

    weight: torch.Tensor
    num_embeddings: int
    embedding_dim: int
    padding_idx: int | None

    def _start(self, dtype: torch.dtype | None) -> torch.Tensor | None:
        """Before the base's __init__: the stand-in weight when the rows live on the ps (else None: a real one)."""
        self.rows_on_ps = _TABLES_ON_PS
        if not self.rows_on_ps:
            return None
        return torch.zeros((), dtype=dtype or torch.get_default_dtype()).expand(self.num_embeddings, self.embedding_dim)

    def _finish(self) -> None:
        self.client: TableClient | None = None
        self.variable = ""  # its weight's state_dict name, set with the client
        self.restored: torch.Tensor | None = None  # a whole table loaded from a checkpoint (the chief sends it)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, rows) looked up for the next push

    def _rows_for(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rows of the unique ids in ``input``, ``input`` as indices into them): all a forward fetches."""
        if self.client is None:
            if self.restored is None:
                raise RuntimeError(
                    f"{type(self).__name__} {self.variable}: its rows live on the parameter servers, and this "
                    "process is not training with them now; evaluate or export from a checkpoint (it loads the "
                    "whole table)."
                )
            return self.restored, input
        ids, inverse = torch.unique(input.reshape(-1), return_inverse=True)
        if len(ids) and (int(ids[0]) < 0 or int(ids[-1]) >= self.num_embeddings):  # sorted: the ends tell
            bad = int(ids[0]) if int(ids[0]) < 0 else int(ids[-1])
            raise IndexError(
                f"{type(self).__name__} {self.variable}: id {bad} is outside the table's {self.num_embeddings} rows."
            )
        rows = self.client.lookup(self.variable, ids)
        if torch.is_grad_enabled() and self.weight.requires_grad:
            rows.requires_grad_(True)
            self.pending.append((ids, rows))
        return rows, inverse.reshape(input.shape)

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
        if self.padding_idx is not None:  # the padding row is never updated, as in nn.Embedding(Bag)
            keep = unique != self.padding_idx
            unique, summed = unique[keep], summed[keep]
        return unique, summed

    # A state_dict holds the whole table, as nn.Embedding's: gathered from the ps (the chief, for a checkpoint),
    # or the one restored; loading keeps it for the chief to send (the stand-in cannot be written into).

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        if not self.rows_on_ps:
            super()._save_to_state_dict(destination, prefix, keep_vars)  # type: ignore[misc]
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
            super()._load_from_state_dict(  # type: ignore[misc]
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


class ShardedEmbedding(_RowsOnParameterServers, nn.Embedding):
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
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        weight = self._start(dtype)
        nn.Embedding.__init__(self, num_embeddings, embedding_dim, padding_idx, _weight=weight, dtype=dtype)
        self._finish()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.rows_on_ps:
            return super().forward(input)
        rows, indices = self._rows_for(input)
        return functional.embedding(indices, rows, self.padding_idx if self.client is None else None)


class ShardedEmbeddingBag(_RowsOnParameterServers, nn.EmbeddingBag):
    """``nn.EmbeddingBag`` (sum, mean or max of each bag's rows: wide-and-deep's sparse columns) whose table lives
    on the ps tasks under ``ParameterServerStrategy``, as ShardedEmbedding's; everywhere else an
    ``nn.EmbeddingBag``. Takes ``mode``, ``include_last_offset`` and ``padding_idx``; ``forward(input, offsets,
    per_sample_weights)`` as nn.EmbeddingBag's.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        mode: str = "mean",
        *,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        weight = self._start(dtype)
        nn.EmbeddingBag.__init__(
            self,
            num_embeddings,
            embedding_dim,
            mode=mode,
            _weight=weight,
            include_last_offset=include_last_offset,
            padding_idx=padding_idx,
            dtype=dtype,
        )
        self._finish()

    def forward(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self.rows_on_ps:
            return super().forward(input, offsets, per_sample_weights)
        rows, indices = self._rows_for(input)
        # The padding row is left out of its bags by its index into the fetched rows.
        padding = self.padding_idx
        if padding is not None and self.client is not None:
            ids = torch.unique(input.reshape(-1))
            found = (ids == padding).nonzero()
            padding = int(found[0, 0]) if len(found) else None
        return functional.embedding_bag(
            indices,
            rows,
            offsets,
            mode=self.mode,
            per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset,
            padding_idx=padding,
        )


def sharded_tables(module: nn.Module) -> dict[str, _RowsOnParameterServers]:
    """The tables of ``module`` whose rows live on the ps tasks, by their weight's state_dict name."""
    return {
        f"{name}.weight" if name else "weight": child
        for name, child in module.named_modules()
        if isinstance(child, _RowsOnParameterServers) and child.rows_on_ps
    }
