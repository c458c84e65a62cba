"""The keys/values of every decoding request, kept as one left-padded batch.

Row ``b`` of every layer holds request ``b``'s ``lengths[b]`` cached positions right-aligned in
``width`` columns; the columns to their left are padding, masked out by :meth:`BatchKV.attention_mask`.
A decode step appends one column for every row (transformers' ``Cache.update`` through
:attr:`BatchKV.cache`), written into spare capacity, so a step copies nothing already cached.

* :meth:`BatchKV.add` puts a prefilled request (a batch-1 cache) in as the last row; the batch widens to
  the longer of the two, the shorter side is padded on the left.
* :meth:`BatchKV.remove` drops a request's row at once (its memory is released when no step holds it)
  and trims the columns no remaining row uses.

Row order is the order of :attr:`BatchKV.rows`.  Not thread-safe.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

_MIN_SPARE = 16


class _GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends into spare capacity instead of concatenating."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._k, self._v = _with_room(keys), _with_room(values)
        self._width = keys.shape[-2]
        self._views()

    def _views(self) -> None:
        self.keys = self._k[..., : self._width, :]
        self.values = self._v[..., : self._width, :]

    def valid(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values, ``[B, h, width, d]`` each (views)."""
        return self._k[..., : self._width, :], self._v[..., : self._width, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        new = self._width + key_states.shape[-2]
        if new > self._k.shape[-2]:
            keys, values = self.valid()
            self._k, self._v = _with_room(keys, new), _with_room(values, new)
        self._k[..., self._width : new, :] = key_states
        self._v[..., self._width : new, :] = value_states
        self._width = new
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._width

    def storage_bytes(self) -> int:
        return (self._k.numel() + self._v.numel()) * self._k.element_size()


def _with_room(tensor: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """A copy of ``tensor`` (``[B, h, n, d]``) in a buffer with spare columns after ``width`` (default ``n``)."""
    n = tensor.shape[-2]
    capacity = max(width or n, n) * 3 // 2 + _MIN_SPARE
    buffer = tensor.new_zeros((*tensor.shape[:-2], capacity, tensor.shape[-1]))
    buffer[..., :n, :] = tensor
    return buffer


class BatchKV:
    """The running requests' keys/values in one left-padded batch (module docstring)."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.rows: list[str] = []
        self.lengths: list[int] = []
        self._layers: list[_GrowingLayer] = []

    @property
    def width(self) -> int:
        return self._layers[0].get_seq_length() if self._layers else 0

    @property
    def cache(self) -> Cache:
        """The batch as a transformers ``Cache`` for one forward; it appends the step's column to every row."""
        return Cache(layers=list(self._layers))

    def nbytes(self) -> int:
        """Bytes the keys/values hold now, spare capacity included."""
        return sum(layer.storage_bytes() for layer in self._layers)

    def attention_mask(self) -> torch.Tensor:
        """``[B, width + 1]``: 1 where a row has a cached position, and for the token being decoded."""
        width = self.width
        columns = torch.arange(width + 1)
        starts = torch.tensor([width - n for n in self.lengths]).view(-1, 1)
        return (columns >= starts).long()

    def stepped(self) -> None:
        """Count the column a decode step just appended to every row."""
        self.lengths = [n + 1 for n in self.lengths]

    def add(self, request_id: str, cache: Cache) -> None:
        """Append ``request_id``'s prefilled keys/values (a batch-1 cache) as the last row."""
        if request_id in self.rows:
            raise ValueError(f"BatchKV: request {request_id!r} already has a row")
        if len(cache.layers) != self.num_layers:
            raise ValueError(f"BatchKV: cache has {len(cache.layers)} layers, the model {self.num_layers}")
        length = cache.get_seq_length()
        width = max(self.width, length)
        layers = []
        for i, new in enumerate(cache.layers):
            new_keys, new_values = getattr(new, "keys", None), getattr(new, "values", None)
            if new_keys is None or new_values is None:
                raise ValueError(f"BatchKV: layer {i} of the prefilled cache holds no keys/values")
            keys = [_left_pad(new_keys, width)]
            values = [_left_pad(new_values, width)]
            if self._layers:
                old_keys, old_values = self._layers[i].valid()
                keys.insert(0, _left_pad(old_keys, width))
                values.insert(0, _left_pad(old_values, width))
            layers.append(_GrowingLayer(torch.cat(keys), torch.cat(values)))
        self._layers = layers
        self.rows.append(request_id)
        self.lengths.append(length)

    def remove(self, request_id: str) -> bool:
        """Drop ``request_id``'s row; False when it has none."""
        if request_id not in self.rows:
            return False
        row = self.rows.index(request_id)
        del self.rows[row], self.lengths[row]
        if not self.rows:
            self._layers = []
            return True
        keep = torch.tensor([i for i in range(len(self.rows) + 1) if i != row])
        start = self.width - max(self.lengths)
        trimmed = []
        for layer in self._layers:
            keys, values = layer.valid()
            rows = keep.to(keys.device)
            trimmed.append(_GrowingLayer(keys[rows, :, start:], values[rows, :, start:]))
        self._layers = trimmed
        return True


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    pad = width - tensor.shape[-2]
    if pad == 0:
        return tensor
    return torch.cat([tensor.new_zeros((*tensor.shape[:-2], pad, tensor.shape[-1])), tensor], dim=-2)
