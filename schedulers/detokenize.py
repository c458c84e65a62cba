"""StreamingDetokenizeScheduler: token ids in, UTF-8-safe text deltas out.

A decode stage behind an AR stage.  What a caller may rely on:

* Token ids arrive as ``stream_chunk`` data: an int, a list of ints, ``{"token_ids": [...]}`` (what
  :mod:`schedulers.ar.scheduler` streams), or a tensor/array of them.  Each chunk may yield one
  ``stream`` output whose data is a ``str`` delta, ``metadata={"modality": "text"}``.
* A delta never splits a character: ids whose decoding still ends in U+FFFD (an incomplete UTF-8
  sequence) are held back until the next chunk completes them, and flushed as they are at the end.
  Deltas are computed against the previous chunk's ids as context (the incremental detokenization of
  vLLM), so tokenizers that drop a word's leading space when it starts the text keep it mid-stream.
  The deltas concatenate to the result's text.
* ``eos_token_id`` ends the text: it is not emitted, and ids after it are ignored.
* A payload is streaming when ``request.params["stream"]`` is true or chunks came before it; it
  completes once both it and ``stream_done`` arrived (either order), first flushing the held-back
  ids.  A streaming request that received no chunk at all decodes the payload's
  ``output_token_ids`` and emits them as one delta.  A non-streaming payload is decoded from
  ``payload.data["output_token_ids"]`` with no deltas.
* The ``result`` is the payload with ``data = build_result(payload, text)`` (default ``{"text": text}``).
* Bad chunk data or a tokenizer error fails only that request; its later chunks are dropped.  Chunks
  after a request completed are dropped unless ``chunk_id == 0`` (the first chunk of a new request
  reusing the id), as in :mod:`schedulers.vocoder`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs

from omnitrio.contract import OutgoingMessage, StagePayload, StreamItem
from schedulers._idsets import RecentIds
from schedulers.streaming import StreamingSimpleScheduler

REPLACEMENT = "\ufffd"

BuildResultFn = Callable[[StagePayload, str], Any]


class Detokenizer(Protocol):
    """What the scheduler needs from a tokenizer."""

    def decode(self, ids: list[int]) -> str: ...


def token_ids_of(data: Any) -> list[int]:
    """The token ids a chunk (or ``output_token_ids``) carries; ``TypeError`` naming what is wrong otherwise."""
    match data:
        case int() if not isinstance(data, bool):
            return [data]
        case {"token_ids": ids}:
            return token_ids_of(ids)
        case list() | tuple():
            if all(isinstance(i, int) and not isinstance(i, bool) for i in data):
                return list(data)
            return [i for item in data for i in token_ids_of(item)]
        case _ if callable(tolist := getattr(data, "tolist", None)):  # torch / numpy scalars and arrays
            return token_ids_of(tolist())
    raise TypeError(
        f"token ids must be an int, a list of ints or {{'token_ids': [...]}}, got {type(data).__name__}: {data!r:.80}"
    )


@attrs.define(eq=False)
class TextStream:
    """One request's detokenization: ``context`` ids already emitted, ``pending`` ids not yet emitted."""

    context: list[int] = attrs.field(factory=list)
    pending: list[int] = attrs.field(factory=list)
    parts: list[str] = attrs.field(factory=list)
    got_tokens: bool = False
    ended: bool = False  # eos seen

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def push(self, ids: list[int], eos_token_id: int | None) -> None:
        self.got_tokens = True
        for token in ids:
            if self.ended:
                return
            if token == eos_token_id:
                self.ended = True
                return
            self.pending.append(token)

    def delta(self, tokenizer: Detokenizer, *, final: bool) -> str:
        """The text the pending ids add, or "" while it would end mid-character (unless ``final``)."""
        if not self.pending:
            return ""
        prefix = tokenizer.decode(self.context) if self.context else ""
        text = tokenizer.decode(self.context + self.pending)
        if not final and (len(text) <= len(prefix) or text.endswith(REPLACEMENT)):
            return ""
        delta = text[len(prefix) :]
        self.context, self.pending = self.pending, []
        if delta:
            self.parts.append(delta)
        return delta


class StreamingDetokenizeScheduler(StreamingSimpleScheduler):
    """Detokenizer stage; see the module docstring.

    ``tokenizer`` is anything with ``decode(list[int]) -> str`` (decode special tokens away there if
    they must not show).  ``stage_name`` names the stage in error messages.
    """

    def __init__(
        self,
        tokenizer: Detokenizer,
        eos_token_id: int | None,
        *,
        build_result: BuildResultFn | None = None,
        stage_name: str = "decode",
    ) -> None:
        if not callable(getattr(tokenizer, "decode", None)):
            raise TypeError(
                f"{stage_name}: tokenizer must have decode(list[int]) -> str, got {type(tokenizer).__name__}"
            )
        super().__init__(self._decode_whole)
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.build_result = build_result
        self.stage_name = stage_name
        self._texts: dict[str, TextStream] = {}
        self._finished: RecentIds[None] = RecentIds()

    # -- StreamingSimpleScheduler hooks -------------------------------------------------

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        params = payload.request.params
        if not isinstance(params, dict):
            raise TypeError(
                f"{self.stage_name}: request params must be a dict, got {type(params).__name__} "
                f"(request {payload.request_id!r})"
            )
        return bool(params.get("stream", False)) or payload.request_id in self._texts

    def on_streaming_new_request(self, request_id: str, payload: StagePayload) -> None:
        self._finished.pop(request_id)
        self._texts.setdefault(request_id, TextStream())

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        if request_id not in self._texts and request_id in self._finished and item.chunk_id > 0:
            self.complete_stream_request(request_id, [])  # a late chunk: end the life it opened, silently
            return []
        self._finished.pop(request_id)
        stream = self._texts.setdefault(request_id, TextStream())
        try:
            ids = token_ids_of(item.data)
        except TypeError as exc:
            raise TypeError(f"{self.stage_name}: stream chunk {item.chunk_id} for {request_id!r}: {exc}") from None
        stream.push(ids, self.eos_token_id)
        return self._delta_messages(request_id, stream.delta(self.tokenizer, final=False))

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        payload = self.stream_payloads[request_id]
        stream = self._texts.setdefault(request_id, TextStream())
        if not stream.got_tokens and _output_ids(payload) is not None:
            stream.push(self._payload_ids(payload), self.eos_token_id)
        messages = self._delta_messages(request_id, stream.delta(self.tokenizer, final=True))
        messages.append(OutgoingMessage(request_id, "result", data=self._finish(payload, stream.text)))
        return messages

    def clear_stream_state(self, request_id: str) -> None:
        self._texts.pop(request_id, None)
        self._finished.put(request_id, None)

    # -- internals ------------------------------------------------------------------------

    @property
    def active_streams(self) -> int:
        """How many requests hold detokenization state now."""
        return len(self._texts)

    def _decode_whole(self, payload: StagePayload) -> StagePayload:
        stream = TextStream()
        stream.push(self._payload_ids(payload), self.eos_token_id)
        stream.delta(self.tokenizer, final=True)
        return self._finish(payload, stream.text)

    def _payload_ids(self, payload: StagePayload) -> list[int]:
        ids = _output_ids(payload)
        if ids is None:
            raise ValueError(
                f"{self.stage_name}: a non-streaming payload needs data['output_token_ids'] "
                f"(request {payload.request_id!r}), got data of type {type(payload.data).__name__}"
            )
        try:
            return token_ids_of(ids)
        except TypeError as exc:
            raise TypeError(f"{self.stage_name}: output_token_ids of {payload.request_id!r}: {exc}") from None

    def _finish(self, payload: StagePayload, text: str) -> StagePayload:
        payload.data = {"text": text} if self.build_result is None else self.build_result(payload, text)
        return payload

    def _delta_messages(self, request_id: str, delta: str) -> list[OutgoingMessage]:
        if not delta:
            return []
        return [OutgoingMessage(request_id, "stream", data=delta, metadata={"modality": "text"})]


def _output_ids(payload: StagePayload) -> Any:
    data = payload.data
    return data.get("output_token_ids") if isinstance(data, dict) else None


__all__ = ["BuildResultFn", "Detokenizer", "StreamingDetokenizeScheduler", "TextStream", "token_ids_of"]
