"""The keys/values of many requests in one batch that grows in place and steps any subset of its rows.

Every model layer keeps one tensor ``[2, R, H, C, D]`` (keys, then values).  Row ``r`` belongs to one
request and holds its ``length`` cached positions in columns ``[0, length)``, left-aligned; the
columns past a row's length are never attended (:meth:`KVStep.attention_mask` marks them 0).  ``R``
and ``C`` have spare room and grow geometrically when a row or a column more is needed (that copies
the batch once, amortised over the steps that follow); a step writes only its new columns.

* :meth:`KVBatch.add` gives a request a row: empty (its prefill then steps into it in place), or a
  copy of a prefilled cache (that request's rows only).
* :meth:`KVBatch.remove` frees a request's row.  Rows stay dense: the last row moves into the gap
  (one request's cached columns are copied), so requests that step together are usually a
  contiguous range.  The vacated row is zeroed.  With ``release_when_empty`` (the default) the
  storage itself is released when the last row leaves.
* :meth:`KVBatch.step` prepares one forward for any subset of rows, in the caller's order: it returns
  a :class:`KVStep` whose ``cache`` is a transformers :class:`~transformers.cache_utils.Cache` to pass
  as ``past_key_values``.  Each layer's ``update`` writes the new keys/values at each row's own
  length and returns what the model attends over, ``[B, H, width + tokens, D]`` (``width``: the
  longest stepping row): a view of the storage when the stepping rows are a contiguous ascending
  range of rows (:meth:`KVBatch.order` sorts ids that way), else a gather of the stepping rows alone.
  Rows that sit a step out are neither read nor copied.  A step of ``tokens > 1`` (a prefill, the
  first step of a fresh batch) needs every stepping row at the same length.  A model of our own that
  makes a layer's keys and values in one tensor writes them in one copy with
  :meth:`KVStep.update_stacked`.
* :meth:`KVBatch.truncate`, :meth:`KVBatch.rename` and :meth:`KVBatch.copy_out` keep a row past its
  request (a conversation's next turn reuses it) and share a prefix's keys/values with later rows.
* :func:`cached_forward` runs a transformers text model over such a cache (or any ``Cache``).

Lengths advance by ``tokens`` when :meth:`KVBatch.step` returns: a forward that raises leaves its rows
with columns it never wrote, so the caller removes them (the engines fail those requests).  A
:class:`KVStep` is valid until the next ``step``, ``add``, ``remove`` or ``truncate``.

The storage is made of inference tensors: run the forwards under ``torch.inference_mode()``.  Every
layer attends over the whole sequence (no sliding window).  Not thread-safe: one thread (the
scheduler's) owns a batch.

Use, with a transformers decoder (``position_ids`` are the model's own; a plain text model's are the
rows' lengths)::

    kv = KVBatch(config.num_hidden_layers, device=model.device, rows=max_running)
    kv.add(rid)                                          # a request joins: its prefill writes its row
    step = kv.step([rid], tokens=prompt_len)
    model(inputs_embeds=prompt[None], past_key_values=step.cache, attention_mask=step.attention_mask())
    ready = kv.order(ids_whose_next_input_is_here)       # any subset; the others sit this step out
    step = kv.step(ready)                                # one token each
    model(inputs_embeds=x[:, None], past_key_values=step.cache, attention_mask=step.attention_mask(),
          position_ids=torch.tensor(step.lengths)[:, None])
    kv.remove(rid)                                       # finished, failed or aborted
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Generic, TypeVar

import attrs
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

RowId = TypeVar("RowId", bound=Hashable)
Ids = TypeVar("Ids", bound=Hashable)
Prefilled = Cache | Sequence[tuple[torch.Tensor, torch.Tensor]]
"""A request's keys/values to copy into a row: a batch-1 transformers cache, or ``(keys, values)`` per
layer, each ``[1, H, n, D]``."""

_SPARE_COLUMNS = 16


@attrs.frozen
class _Plan:
    """One step's rows and columns, shared by every layer."""

    width: int  # the longest stepping row before the step
    tokens: int
    columns: int  # width + tokens: the columns the step attends over
    rows_needed: int  # rows the storage must have
    span: tuple[int, int] | None  # (first row, rows) when the stepping rows are a contiguous range
    start: int | None  # the column every stepping row writes at, when they have one length
    index: torch.Tensor | None  # the stepping rows [B], unless they are a span written at one start
    starts: torch.Tensor | None  # each row's write column [B], when they differ (one token each)


@attrs.frozen
class KVStep:
    """One forward's view of the batch: pass ``cache`` as ``past_key_values``."""

    cache: Cache
    lengths: list[int]  # each stepping row's cached positions before the step (its first new token's position)
    tokens: int
    device: torch.device
    layers: Sequence[_Layer] = attrs.field(repr=False)

    @property
    def width(self) -> int:
        """The longest stepping row before the step; the model attends over ``width + tokens`` columns."""
        return max(self.lengths)

    def attention_mask(self) -> torch.Tensor:
        """``[B, width + tokens]`` long: 1 on each row's cached columns and its new tokens, 0 past them."""
        columns = torch.arange(self.width + self.tokens, device=self.device)
        ends = torch.tensor(self.lengths, device=self.device).unsqueeze(1) + self.tokens
        return (columns < ends).long()

    def padding_mask(self) -> torch.Tensor | None:
        """:meth:`attention_mask` when the stepping rows differ in length; None when no column is padding,
        which takes transformers' mask-free attention (the same result, without building a mask)."""
        return self.attention_mask() if len(set(self.lengths)) > 1 else None

    def update_stacked(self, layer: int, keys_values: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s new keys and values stacked, ``[2, B, H, tokens, D]``, written in one copy;
        returns what the layer attends over, ``[2, B, H, width + tokens, D]`` (as ``update`` does)."""
        return self.layers[layer].update_stacked(keys_values)


class _Layer(CacheLayerMixin):
    """One model layer's storage, seen by transformers as a cache layer for the current step."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, batch: KVBatch[Any]) -> None:
        super().__init__()
        self._batch = batch
        self.data: torch.Tensor | None = None  # [2, R, H, C, D]
        self.is_initialized = True
        self._span: tuple[int, int] | None = None  # the rows the views below were made for, of _span_data
        self._span_data: torch.Tensor | None = None
        self._span_rows = self._span_keys = self._span_values = torch.empty(0)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def reserve(self, like: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
        """The storage, grown to at least ``rows`` x ``columns`` (shaped, typed and placed like ``like``)."""
        data = self.data
        if data is not None and data.shape[1] >= rows and data.shape[3] >= columns:
            return data
        old_rows, old_columns = (0, 0) if data is None else (data.shape[1], data.shape[3])
        new_rows = old_rows
        if rows > old_rows:
            new_rows = max(rows, self._batch.row_hint) if data is None else rows * 3 // 2 + 1
        new_columns = columns * 3 // 2 + _SPARE_COLUMNS if columns > old_columns else old_columns
        heads, dim = like.shape[1], like.shape[-1]
        grown = like.new_zeros((2, new_rows, heads, new_columns, dim))
        if data is not None:
            grown[:, :old_rows, :, :old_columns] = data
        self.data = grown
        return grown

    def _rows(self, data: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
        """``data``'s rows ``span`` (a view, made again only when the span or the storage changes)."""
        if self._span_data is not data or self._span != span:
            self._span_data, self._span = data, span
            self._span_rows = data.narrow(1, span[0], span[1])
            self._span_keys, self._span_values = self._span_rows.unbind(0)
        return self._span_rows

    def _storage(self, like: torch.Tensor, plan: _Plan) -> torch.Tensor:
        data = self.data
        if data is None or data.shape[1] < plan.rows_needed or data.shape[3] < plan.columns:
            data = self.reserve(like, plan.rows_needed, plan.columns)
        return data

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self._batch.plan()
        data = self._storage(key_states, plan)
        if plan.span is not None and plan.start is not None:  # the usual step: neighbours of one length
            self._rows(data, plan.span)
            self._span_keys.narrow(2, plan.start, plan.tokens).copy_(key_states)
            self._span_values.narrow(2, plan.start, plan.tokens).copy_(value_states)
        elif plan.starts is None:
            assert plan.start is not None
            columns = slice(plan.start, plan.start + plan.tokens)
            data[0, plan.index, :, columns] = key_states
            data[1, plan.index, :, columns] = value_states
        else:
            data[0, plan.index, :, plan.starts] = key_states[:, :, 0]
            data[1, plan.index, :, plan.starts] = value_states[:, :, 0]
        if plan.span is None:
            keys, values = self._gather(data, plan).unbind(0)
            return keys, values
        self._rows(data, plan.span)
        return self._span_keys.narrow(2, 0, plan.columns), self._span_values.narrow(2, 0, plan.columns)

    def update_stacked(self, keys_values: torch.Tensor) -> torch.Tensor:
        plan = self._batch.plan()
        data = self._storage(keys_values[0], plan)
        if plan.span is not None and plan.start is not None:
            self._rows(data, plan.span).narrow(3, plan.start, plan.tokens).copy_(keys_values)
        elif plan.starts is None:
            assert plan.start is not None
            data[:, plan.index, :, plan.start : plan.start + plan.tokens] = keys_values
        else:
            data[:, plan.index, :, plan.starts] = keys_values[:, :, :, 0].transpose(0, 1)
        if plan.span is None:
            return self._gather(data, plan)
        return self._rows(data, plan.span).narrow(3, 0, plan.columns)

    @staticmethod
    def _gather(data: torch.Tensor, plan: _Plan) -> torch.Tensor:
        """The stepping rows' columns ``[2, B, H, width + tokens, D]``, copied: those rows alone are read."""
        assert plan.index is not None
        return data.narrow(3, 0, plan.columns).index_select(1, plan.index)

    def get_seq_length(self) -> int:
        return self._batch.plan().width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def nbytes(self) -> int:
        return 0 if self.data is None else self.data.numel() * self.data.element_size()


class KVBatch(Generic[RowId]):
    """Rows of keys/values, one per request (module docstring).

    ``device`` is where masks and row indices are made (the model's device); ``rows`` is how many rows
    to make room for at the first allocation."""

    def __init__(
        self, num_layers: int, *, device: str | torch.device = "cpu", rows: int = 0, release_when_empty: bool = True
    ) -> None:
        if num_layers < 1:
            raise ValueError(f"KVBatch: num_layers={num_layers} must be >= 1")
        self.device = torch.device(device)
        self.row_hint = rows
        self.release_when_empty = release_when_empty
        self._ids: list[RowId] = []
        self._row: dict[RowId, int] = {}
        self._lengths: list[int] = []
        self._layers = [_Layer(self) for _ in range(num_layers)]
        self._cache = Cache(layers=list(self._layers))
        self._plan: _Plan | None = None

    # -- what it holds --------------------------------------------------------------------

    @property
    def rows(self) -> list[RowId]:
        """The ids, in row order."""
        return list(self._ids)

    @property
    def lengths(self) -> list[int]:
        """Each row's cached positions, in row order."""
        return list(self._lengths)

    def __contains__(self, row_id: object) -> bool:
        return row_id in self._row

    def __len__(self) -> int:
        return len(self._ids)

    def length(self, row_id: RowId) -> int:
        return self._lengths[self._row[row_id]]

    def order(self, row_ids: Iterable[Ids]) -> list[Ids]:
        """``row_ids`` in row order (a step over them in that order reads a view when they are contiguous)."""
        rows: dict[Any, int] = self._row
        return sorted(row_ids, key=rows.__getitem__)

    def nbytes(self) -> int:
        """Bytes the storage holds now, spare room included."""
        return sum(layer.nbytes() for layer in self._layers)

    @property
    def capacity(self) -> tuple[int, int]:
        """``(rows, columns)`` the storage has room for now (``(0, 0)`` before any is allocated)."""
        data = next((layer.data for layer in self._layers if layer.data is not None), None)
        return (0, 0) if data is None else (data.shape[1], data.shape[3])

    # -- joining and leaving ---------------------------------------------------------------

    def add(self, row_id: RowId, prefilled: Prefilled | None = None) -> None:
        """Give ``row_id`` the next row: empty, or holding a copy of ``prefilled`` (module docstring)."""
        if row_id in self._row:
            raise ValueError(f"KVBatch: {row_id!r} already has a row")
        pairs = _pairs(prefilled, len(self._layers)) if prefilled is not None else []
        row = len(self._ids)
        length = pairs[0][0].shape[-2] if pairs else 0
        with torch.inference_mode():
            for layer, (keys, values) in zip(self._layers, pairs, strict=False):
                data = layer.reserve(keys, row + 1, length)
                data[0, row, :, :length] = keys[0]
                data[1, row, :, :length] = values[0]
        self._plan = None
        self._ids.append(row_id)
        self._row[row_id] = row
        self._lengths.append(length)

    def remove(self, row_id: RowId) -> bool:
        """Free ``row_id``'s row; False when it has none (module docstring)."""
        row = self._row.pop(row_id, None)
        if row is None:
            return False
        self._plan = None
        last = len(self._ids) - 1
        gone, moved = self._lengths[row], self._lengths[last]
        with torch.inference_mode():
            for layer in self._layers:
                data = layer.data
                if data is None:
                    continue
                if row != last:
                    data[:, row, :, :moved] = data[:, last, :, :moved]
                    data[:, row, :, moved:gone] = 0
                data[:, last, :, : moved if row != last else gone] = 0
        if row != last:
            self._ids[row] = self._ids[last]
            self._lengths[row] = moved
            self._row[self._ids[row]] = row
        self._ids.pop()
        self._lengths.pop()
        if not self._ids and self.release_when_empty:
            for layer in self._layers:
                layer.data = None
        return True

    def clear(self) -> None:
        """Free every row at once; nothing is copied or zeroed (the storage is released, or kept for the next
        rows when ``release_when_empty`` is False: a batch reused for rows of one length, as the code
        predictor's, never reads a column it did not write)."""
        self._plan = None
        self._ids.clear()
        self._row.clear()
        self._lengths.clear()
        if self.release_when_empty:
            for layer in self._layers:
                layer.data = None

    def rename(self, row_id: RowId, new_id: RowId) -> None:
        """The row of ``row_id`` now belongs to ``new_id`` (nothing is copied)."""
        if new_id in self._row:
            raise ValueError(f"KVBatch: {new_id!r} already has a row")
        row = self._row.pop(row_id)
        self._ids[row] = new_id
        self._row[new_id] = row

    def truncate(self, row_id: RowId, length: int) -> None:
        """Keep the first ``length`` cached positions of ``row_id`` (the rest are never attended again)."""
        row = self._row[row_id]
        if not 0 <= length <= self._lengths[row]:
            raise ValueError(f"KVBatch: cannot truncate {row_id!r} from {self._lengths[row]} to {length} positions")
        self._plan = None
        self._lengths[row] = length

    def copy_out(self, row_id: RowId, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of the first ``length`` positions of ``row_id``, as :meth:`add` takes them back."""
        row = self._row[row_id]
        if not 0 < length <= self._lengths[row]:
            raise ValueError(f"KVBatch: {row_id!r} holds {self._lengths[row]} positions, not {length}")
        pairs = []
        with torch.inference_mode():
            for layer in self._layers:
                assert layer.data is not None
                part = layer.data[:, row : row + 1, :, :length].clone()
                pairs.append((part[0], part[1]))
        return pairs

    # -- stepping ---------------------------------------------------------------------------

    def step(self, row_ids: Sequence[RowId], tokens: int = 1) -> KVStep:
        """Prepare one forward of ``tokens`` new positions for each of ``row_ids`` (module docstring)."""
        if not row_ids or tokens < 1:
            raise ValueError(f"KVBatch.step: needs at least one row and one token, got {len(row_ids)}, {tokens}")
        try:
            rows = [self._row[row_id] for row_id in row_ids]
        except KeyError as missing:
            raise ValueError(f"KVBatch.step: {missing.args[0]!r} has no row") from None
        lengths = [self._lengths[row] for row in rows]
        same = all(n == lengths[0] for n in lengths)
        if tokens > 1 and not same:
            raise ValueError(f"KVBatch.step: {tokens} tokens at once need rows of one length, got {lengths}")
        first, width = rows[0], max(lengths)
        span = (first, len(rows)) if rows == list(range(first, first + len(rows))) else None
        index = None if span is not None and same else torch.tensor(rows, device=self.device)
        self._plan = _Plan(
            width=width,
            tokens=tokens,
            columns=width + tokens,
            rows_needed=len(self._ids),
            span=span,
            start=lengths[0] if same else None,
            index=index,
            starts=None if same else torch.tensor(lengths, device=self.device),
        )
        for row in rows:
            self._lengths[row] += tokens
        return KVStep(self._cache, lengths, tokens, self.device, self._layers)

    def plan(self) -> _Plan:
        if self._plan is None:
            raise RuntimeError("KVBatch: the cache was used outside the step it was prepared for")
        return self._plan


def _pairs(prefilled: Prefilled, layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(prefilled, Cache):
        pairs = [(getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in prefilled.layers]
    else:
        pairs = list(prefilled)
    if len(pairs) != layers:
        raise ValueError(f"KVBatch: the prefilled cache has {len(pairs)} layers, the batch {layers}")
    checked = []
    for i, (keys, values) in enumerate(pairs):
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor) or keys.shape[0] != 1:
            raise ValueError(f"KVBatch: layer {i} of the prefilled cache holds no batch-1 keys/values")
        checked.append((keys, values))
    return checked


def cached_forward(
    model: Any,
    embeds: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: Cache,
    **extra: Any,
) -> Any:
    """A transformers text model's forward of ``embeds [B, S, H]`` at ``position_ids`` over ``cache`` (a
    :class:`KVStep`'s or a ``DynamicCache``: it grows by ``S`` columns per row), ``attention_mask``
    ``[B, past + S]`` (0 on padding; None: no padding) and ``extra`` keyword arguments; the model's
    output.  The caller holds ``torch.inference_mode``."""
    return model(
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        **extra,
    )
