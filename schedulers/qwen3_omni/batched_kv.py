"""Per-request KV caches, stepped together as one left-padded ``DynamicCache``.

Each request's cache is its own until it steps with others: :meth:`BatchedKV.batch` left-pads the
caches of the requests named (in that order) into one ``DynamicCache`` and returns the attention
mask ``[B, longest + 1]`` for a one-token step (0 on padding).  While the same requests step again
in the same order, that batch is reused as it is (the forward grows it in place); any other
membership splits it back into per-request caches first (padding dropped) and builds the next one.
:meth:`BatchedKV.drop` frees a request's cache wherever it lives.  One thread uses it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

Layers = list[tuple[torch.Tensor, torch.Tensor]]


def cache_layers(cache: Any) -> Layers:
    """The ``(keys, values)`` of each layer of a one-row ``DynamicCache``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


class BatchedKV:
    """Per-request caches plus the batch currently built from them (module docstring)."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self._own: dict[str, Layers] = {}
        self._members: list[str] = []
        self._pads: list[int] = []
        self._batch: Any = None

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._own or request_id in self._members

    def __len__(self) -> int:
        return len(self._own) + len(self._members)

    def new_cache(self) -> Any:
        """An empty one-row cache for a request's prefill; hand it back with :meth:`add`."""
        return DynamicCache(config=self._config)

    def add(self, request_id: str, cache: Any) -> None:
        """Own the prefilled one-row ``cache`` of ``request_id``."""
        self._own[request_id] = cache_layers(cache)

    def drop(self, request_id: str) -> None:
        """Free ``request_id``'s cache (no-op when it has none)."""
        if request_id in self._members:
            self._split()
        self._own.pop(request_id, None)

    def batch(self, request_ids: list[str]) -> tuple[Any, torch.Tensor]:
        """The cache holding ``request_ids``' rows in that order, and the mask for one more token each."""
        if request_ids != self._members:
            self._split()
            self._build(request_ids)
        longest = self._batch.get_seq_length()
        positions = torch.arange(longest + 1)
        mask = (positions.unsqueeze(0) >= torch.tensor(self._pads).unsqueeze(1)).long()
        return self._batch, mask

    def _build(self, request_ids: list[str]) -> None:
        rows = [self._own.pop(rid) for rid in request_ids]
        lengths = [row[0][0].shape[-2] for row in rows]
        longest = max(lengths)
        self._pads = [longest - length for length in lengths]
        data = []
        for index in range(len(rows[0])):
            keys = torch.cat([_left_pad(row[index][0], pad) for row, pad in zip(rows, self._pads, strict=True)])
            values = torch.cat([_left_pad(row[index][1], pad) for row, pad in zip(rows, self._pads, strict=True)])
            data.append((keys, values))
        self._batch = DynamicCache(ddp_cache_data=data, config=self._config)
        self._members = list(request_ids)

    def _split(self) -> None:
        if self._batch is None:
            return
        layers = cache_layers(self._batch)
        for row, (rid, pad) in enumerate(zip(self._members, self._pads, strict=True)):
            self._own[rid] = [
                (keys[row : row + 1, :, pad:].clone(), values[row : row + 1, :, pad:].clone())
                for keys, values in layers
            ]
        self._batch, self._members, self._pads = None, [], []


def _left_pad(tensor: torch.Tensor, pad: int) -> torch.Tensor:
    if pad == 0:
        return tensor
    shape = list(tensor.shape)
    shape[-2] = pad
    return torch.cat((tensor.new_zeros(shape), tensor), dim=-2)
