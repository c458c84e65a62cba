"""Vocoder templates: :class:`StreamingVocoderBase` (codes stream in, audio streams out) and
:class:`BatchVocoderBase` (whole utterances, batched).

A streaming vocoder owns one *state* per request; the base owns its life, the model owns what is in
it (buffers, cursors, codec sessions) through the hooks.  Hook names and signatures are SGLang-Omni's,
so a ported vocoder only changes imports.  What a subclass may rely on:

* Every hook runs on the scheduler thread, one at a time (no locks needed).
* The state is created once, by ``create_stream_state(request_id)``, on whichever comes first: a
  chunk or the payload.  It is never recreated while the request lives, so frames held back for
  look-ahead survive chunks and ``stream_done`` that precede the payload (SGLang-Omni #674).
* Per chunk: ``latch_stream_contract(..., item.metadata, origin="stream metadata")``, then
  ``validate_chunk`` (returns what to buffer), ``ingest``, and, when ``should_decode`` agrees,
  ``decode_delta(is_final=False)``; audio it returns goes out at once as a ``stream`` output with
  ``metadata={"modality": "audio"}`` and data ``stream_payload(request_id, audio)``
  (default ``{"pcm": audio, "sample_rate": sample_rate}``; a mapping is sent as it is).
* Once both the payload and ``stream_done`` have arrived, in this order: ``decode_delta(is_final=True)``
  (or ``fallback_full_decode`` when the request never emitted audio), that last ``stream`` output,
  the ``result`` (a new :class:`StagePayload` whose data is ``final_result_data``), then the state is
  released through ``release_stream_resources``.
* ``release_stream_resources`` runs exactly once per state: on completion, failure, abort, and when
  the serving loop stops.  A hook that raises fails only its own request (an ``error`` output).
* Chunks of an aborted or failed request are dropped and never recreate state (the ledger of
  :mod:`schedulers._idsets`).  Chunks arriving after a request *completed* are dropped too, unless
  they are ``chunk_id == 0``: chunk ids count from 0 per request and edge, so that is the first chunk
  of a new request reusing the id, which must not lose its audio.
* A payload is streaming when ``request.params["stream"]`` is true; other payloads are computed by
  ``compute_fn`` / ``batch_compute_fn`` as in :class:`~schedulers.streaming.StreamingSimpleScheduler`.

Not ported: SGLang-Omni's cross-request chunk coalescing (``select_step_participants`` …), which needs
a step-driven loop the streaming scheduler here does not have.
"""

from __future__ import annotations

import inspect
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from omnitrio.contract import OutgoingMessage, StagePayload, StreamItem
from schedulers._idsets import RecentIds
from schedulers.simple import BatchComputeFn, ComputeFn, SimpleScheduler
from schedulers.streaming import StreamingSimpleScheduler

logger = logging.getLogger(__name__)

StateT = TypeVar("StateT")
ItemT = TypeVar("ItemT")

INITIAL_CODEC_CHUNK_FRAMES_PARAM = "initial_codec_chunk_frames"


def resolve_initial_codec_chunk_frames(
    params: Mapping[str, Any] | None, *, steady_chunk_frames: int, default_frames: int = 0
) -> int:
    """The request's ``initial_codec_chunk_frames`` (or ``default_frames``), clamped to the steady chunk size.

    A small first chunk lowers time-to-first-audio; it never exceeds the steady size.
    """
    if steady_chunk_frames <= 0:
        raise ValueError(f"steady_chunk_frames must be positive, got {steady_chunk_frames}")
    value = params.get(INITIAL_CODEC_CHUNK_FRAMES_PARAM) if params is not None else None
    if value is None:
        value = default_frames
    if isinstance(value, bool):
        raise TypeError(f"{INITIAL_CODEC_CHUNK_FRAMES_PARAM} must be an integer, got {value!r}")
    try:
        frames = int(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{INITIAL_CODEC_CHUNK_FRAMES_PARAM} must be an integer, got {value!r}") from exc
    if frames < 0:
        raise ValueError(f"{INITIAL_CODEC_CHUNK_FRAMES_PARAM} must be >= 0, got {frames}")
    return min(frames, int(steady_chunk_frames))


class StreamingVocoderBase(StreamingSimpleScheduler, ABC, Generic[StateT]):
    """Template for streaming vocoders; see the module docstring for the lifecycle.

    ``sample_rate`` and ``stream_source_hint`` (the model's name in error text; default the class
    name) are class attributes a subclass sets, or constructor arguments.  ``stream_input_modality``
    is the chunk ``metadata["modality"]`` accepted besides none at all; a subclass sets the class
    attribute to None to accept any.
    """

    sample_rate: int = 0
    stream_source_hint: str = ""
    stream_input_modality: str | None = "audio_codes"

    def __init__(
        self,
        compute_fn: ComputeFn | None = None,
        *,
        sample_rate: int | None = None,
        stream_source_hint: str | None = None,
        stream_input_modality: str | None = None,
        batch_compute_fn: BatchComputeFn | None = None,
        max_batch_size: int = 1,
        max_batch_wait_ms: float = 0,
        batch_wait_when_idle: bool = True,
        request_cost_fn: Callable[[StagePayload], int] | None = None,
        max_batch_cost: int | None = None,
        abort_callback: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            compute_fn,
            batch_compute_fn=batch_compute_fn,
            max_batch_size=max_batch_size,
            max_batch_wait_ms=max_batch_wait_ms,
            batch_wait_when_idle=batch_wait_when_idle,
            request_cost_fn=request_cost_fn,
            max_batch_cost=max_batch_cost,
            abort_callback=abort_callback,
        )
        rate = self.sample_rate if sample_rate is None else sample_rate
        if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
            raise ValueError(
                f"{type(self).__name__} needs a positive integer sample_rate (class attribute or argument), "
                f"got {rate!r}"
            )
        self.sample_rate = rate
        self.stream_source_hint = stream_source_hint or self.stream_source_hint or type(self).__name__
        if stream_input_modality is not None:
            self.stream_input_modality = stream_input_modality
        self._stream_states: dict[str, StateT] = {}
        self._emitted: set[str] = set()
        self._finished: RecentIds[None] = RecentIds()

    # -- hooks a model implements ---------------------------------------------------

    @abstractmethod
    def create_stream_state(self, request_id: str) -> StateT:
        """A fresh state; called once per request, on its first chunk or its payload."""

    def latch_stream_contract(
        self, request_id: str, state: StateT, source: StagePayload | Mapping[str, Any], *, origin: str
    ) -> None:
        """Record per-request settings: ``source`` is the payload (``origin="payload"``) or a chunk's
        metadata (``origin="stream metadata"``, an empty mapping when the chunk has none)."""

    @abstractmethod
    def validate_chunk(self, request_id: str, state: StateT, codes: Any) -> Any:
        """Check one chunk's data (shape, dtype); return what ``ingest`` should buffer."""

    @abstractmethod
    def ingest(self, request_id: str, state: StateT, codes: Any) -> None:
        """Append validated codes to the state's buffer."""

    def should_decode(self, state: StateT, *, is_final: bool) -> bool:
        """Whether to call ``decode_delta`` after this chunk (the final flush always calls it)."""
        return True

    @abstractmethod
    def decode_delta(self, request_id: str, state: StateT, *, is_final: bool) -> Any | None:
        """Audio that is final now (all of the rest when ``is_final``), or None to emit nothing."""

    @abstractmethod
    def final_result_data(self, request_id: str, payload: StagePayload, state: StateT) -> Any:
        """The ``data`` of the result payload."""

    def fallback_full_decode(self, request_id: str, payload: StagePayload, state: StateT) -> Any | None:
        """Whole-utterance audio for a stream that ended without emitting any; None emits nothing."""
        return None

    def release_stream_resources(self, request_id: str, state: StateT) -> None:
        """Free per-request resources (codec sessions…); once per state, whatever ended the request."""

    def stream_payload(self, request_id: str, audio: Any) -> Any:
        """The data of one ``stream`` output."""
        if isinstance(audio, Mapping):
            return audio
        return {"pcm": audio, "sample_rate": self.sample_rate}

    def on_serving_start(self) -> None:
        """Runs on the scheduler thread before the serving loop."""

    def on_serving_stop(self) -> None:
        """Runs on the scheduler thread after the loop, once every state has been released."""

    # -- the StreamingSimpleScheduler hooks -------------------------------------------

    def start(self) -> None:
        try:
            self.on_serving_start()
            super().start()
        finally:
            for request_id in list(self._stream_states):
                try:
                    self.clear_stream_state(request_id)
                except Exception:
                    logger.exception(
                        "%s: releasing the state of %r at shutdown failed", self.stream_source_hint, request_id
                    )
            self.on_serving_stop()

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        params = payload.request.params
        if not isinstance(params, dict):
            raise TypeError(
                f"{self.stream_source_hint}: request params must be a dict, got {type(params).__name__} "
                f"(request {payload.request_id!r})"
            )
        return bool(params.get("stream", False))

    def on_streaming_new_request(self, request_id: str, payload: StagePayload) -> None:
        self._finished.pop(request_id)
        state = self._state(request_id)
        self.latch_stream_contract(request_id, state, payload, origin="payload")

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        if request_id not in self._stream_states and request_id in self._finished and item.chunk_id > 0:
            self.complete_stream_request(request_id, [])  # a late chunk: end the life it opened, silently
            return []
        self._finished.pop(request_id)
        state = self._state(request_id)
        metadata = item.metadata or {}
        modality = metadata.get("modality")
        if modality is not None and self.stream_input_modality is not None and modality != self.stream_input_modality:
            raise ValueError(
                f"{self.stream_source_hint}: stream chunk {item.chunk_id} for {request_id!r} from "
                f"{item.from_stage!r} has modality {modality!r}, expected {self.stream_input_modality!r}"
            )
        self.latch_stream_contract(request_id, state, metadata, origin="stream metadata")
        self.ingest(request_id, state, self.validate_chunk(request_id, state, item.data))
        if not self.should_decode(state, is_final=False):
            return []
        audio = self.decode_delta(request_id, state, is_final=False)
        return [] if audio is None else [self._audio_message(request_id, audio)]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        payload = self.stream_payloads[request_id]
        state = self._state(request_id)
        audio = self.decode_delta(request_id, state, is_final=True)
        if audio is None and request_id not in self._emitted:
            audio = self.fallback_full_decode(request_id, payload, state)
        messages = [] if audio is None else [self._audio_message(request_id, audio)]
        data = self.final_result_data(request_id, payload, state)
        messages.append(OutgoingMessage(request_id, "result", data=StagePayload(request_id, payload.request, data)))
        return messages

    def clear_stream_state(self, request_id: str) -> None:
        self._emitted.discard(request_id)
        self._finished.put(request_id, None)
        if request_id in self._stream_states:
            self.release_stream_resources(request_id, self._stream_states.pop(request_id))

    # -- internals --------------------------------------------------------------------

    @property
    def active_streams(self) -> int:
        """How many requests hold a stream state now."""
        return len(self._stream_states)

    def _state(self, request_id: str) -> StateT:
        state = self._stream_states.get(request_id)
        if state is None:
            state = self.create_stream_state(request_id)
            if state is None:
                raise RuntimeError(f"{type(self).__name__}.create_stream_state returned None for {request_id!r}")
            self._stream_states[request_id] = state
        return state

    def _audio_message(self, request_id: str, audio: Any) -> OutgoingMessage:
        self._emitted.add(request_id)
        return OutgoingMessage(
            request_id, "stream", data=self.stream_payload(request_id, audio), metadata={"modality": "audio"}
        )


class BatchVocoderBase(ABC, Generic[StateT, ItemT]):
    """Template for non-streaming vocoders that decode whole utterances in batches.

    Per payload ``prepare_item`` returns ``(state, codes)``; ``decode_batch`` (sync or async) turns the
    list of them into one ``(waveform, sample_rate)`` per item, in order; ``store_result`` puts it in
    the payload.  A ``prepare_item`` or ``store_result`` that raises, or an exception object in place of
    a ``decode_batch`` result, fails only that request; ``decode_batch`` raising fails the batch.
    """

    @abstractmethod
    def prepare_item(self, payload: StagePayload) -> tuple[StateT, ItemT]:
        """``(state, codes)`` for one payload."""

    @abstractmethod
    def decode_batch(
        self, items: list[tuple[StateT, ItemT]]
    ) -> Sequence[tuple[Any, int] | BaseException] | Awaitable[Sequence[tuple[Any, int] | BaseException]]:
        """One ``(waveform, sample_rate)`` per item, in order."""

    @abstractmethod
    def store_result(self, payload: StagePayload, state: StateT, wav: Any, sample_rate: int) -> StagePayload:
        """The finished payload."""

    def decode_payloads(self, payloads: list[StagePayload]) -> list[Any] | Awaitable[list[Any]]:
        """Results for ``payloads`` in order (a payload or an exception each); async when ``decode_batch`` is."""
        prepared: list[tuple[StateT, ItemT] | BaseException] = []
        for payload in payloads:
            try:
                prepared.append(self.prepare_item(payload))
            except Exception as exc:
                prepared.append(exc)
        items = [item for item in prepared if not isinstance(item, BaseException)]
        decoded = self.decode_batch(items) if items else []
        if inspect.isawaitable(decoded):
            return self._store_later(payloads, prepared, decoded)
        return self._store(payloads, prepared, decoded)

    def build_scheduler(
        self, *, max_batch_size: int = 8, max_batch_wait_ms: float = 2, batch_wait_when_idle: bool = True
    ) -> SimpleScheduler:
        """A SimpleScheduler that batches payloads through :meth:`decode_payloads`."""
        return SimpleScheduler(
            None,
            batch_compute_fn=self.decode_payloads,
            max_batch_size=max_batch_size,
            max_batch_wait_ms=max_batch_wait_ms,
            batch_wait_when_idle=batch_wait_when_idle,
        )

    async def _store_later(
        self,
        payloads: list[StagePayload],
        prepared: list[tuple[StateT, ItemT] | BaseException],
        decoded: Awaitable[Sequence[tuple[Any, int] | BaseException]],
    ) -> list[Any]:
        return self._store(payloads, prepared, await decoded)

    def _store(
        self,
        payloads: list[StagePayload],
        prepared: list[tuple[StateT, ItemT] | BaseException],
        decoded: Sequence[tuple[Any, int] | BaseException],
    ) -> list[Any]:
        decoded = list(decoded)
        expected = sum(not isinstance(item, BaseException) for item in prepared)
        if len(decoded) != expected:
            raise ValueError(
                f"{type(self).__name__}.decode_batch returned {len(decoded)} results for {expected} items; "
                "it must return one (waveform, sample_rate) per item, in order"
            )
        results: list[Any] = []
        outputs = iter(decoded)
        for payload, item in zip(payloads, prepared, strict=True):
            if isinstance(item, BaseException):
                results.append(item)
                continue
            out = next(outputs)
            if isinstance(out, BaseException):
                results.append(out)
                continue
            try:
                wav, sample_rate = out
                results.append(self.store_result(payload, item[0], wav, sample_rate))
            except Exception as exc:
                results.append(exc)
        return results


__all__ = [
    "INITIAL_CODEC_CHUNK_FRAMES_PARAM",
    "BatchVocoderBase",
    "StreamingVocoderBase",
    "resolve_initial_codec_chunk_frames",
]
